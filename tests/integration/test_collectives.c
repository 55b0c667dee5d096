/*
 * test_collectives.c - the data plane end to end: a real cohortd and N
 * real processes (build/bin/cohort-coll-worker) running every collective
 * x dtype x op x in/out of place with randomised sizes against a reference
 * each worker computes independently; subgroups, two groups used at once
 * from two threads, the asynchronous forms; once over tcp and once over
 * the service backend (smaller sizes, chunked replies).
 *
 * COHORT_TEST_SEED fixes the seed (printed on failure); otherwise it
 * changes with the time.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "check_cohort.h"

static const char *const env_tcp[]
    = { "COHORT_TEST_BACKEND=tcp", "COHORT_TEST_MAXBYTES=2097152", NULL };
static const char *const env_tcp_big[]
    = { "COHORT_TEST_BACKEND=tcp", "COHORT_TEST_MAXBYTES=6291456", NULL };
static const char *const env_tcp_small[]
    = { "COHORT_TEST_BACKEND=tcp", "COHORT_TEST_MAXBYTES=524288", NULL };
/* Small chunks: multi-chunk replies at moderate sizes. */
static const char *const env_svc[] = { "COHORT_TEST_BACKEND=service",
	"COHORT_TEST_MAXBYTES=262144", "COHORT_SERVICE_CHUNK=65536", NULL };

START_TEST(test_tcp_matrix_1_rank)
{
	th_scenario_expect(
	    "cohort-coll-worker", "m1", 1, "matrix", env_tcp, 60000);
}
END_TEST

START_TEST(test_tcp_matrix_2_ranks_large)
{
	th_scenario_expect(
	    "cohort-coll-worker", "m2", 2, "matrix", env_tcp_big, 90000);
}
END_TEST

START_TEST(test_tcp_matrix_3_ranks)
{
	th_scenario_expect(
	    "cohort-coll-worker", "m3", 3, "matrix", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_matrix_5_ranks)
{
	th_scenario_expect(
	    "cohort-coll-worker", "m5", 5, "matrix", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_matrix_8_ranks)
{
	th_scenario_expect(
	    "cohort-coll-worker", "m8", 8, "matrix", env_tcp_small, 120000);
}
END_TEST

START_TEST(test_tcp_subgroups_even_odd)
{
	th_scenario_expect(
	    "cohort-coll-worker", "sub", 5, "subgroup", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_two_groups_two_threads)
{
	th_scenario_expect(
	    "cohort-coll-worker", "conc", 4, "concurrent", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_async_in_order_with_overlap)
{
	th_scenario_expect(
	    "cohort-coll-worker", "async", 3, "async", env_tcp, 60000);
}
END_TEST

START_TEST(test_argument_validation)
{
	th_scenario_expect(
	    "cohort-coll-worker", "errors", 2, "errors", env_tcp, 30000);
}
END_TEST

/* Regression: COHORT_BACKEND=nccl where NCCL cannot be loaded (this
 * machine has no GPU) gave ENOTSUP with an empty group detail. Where
 * NCCL loads, the worker prints a SKIP line: the collective just works. */
START_TEST(test_configured_backend_unavailable_names_why)
{
	static const char *const env_nccl[]
	    = { "COHORT_TEST_BACKEND=nccl", NULL };

	th_scenario_expect(
	    "cohort-coll-worker", "nonccl", 1, "nonccl", env_nccl, 30000);
}
END_TEST

START_TEST(test_service_matrix_1_rank)
{
	th_scenario_expect(
	    "cohort-coll-worker", "s1", 1, "matrix", env_svc, 60000);
}
END_TEST

START_TEST(test_service_matrix_3_ranks)
{
	th_scenario_expect(
	    "cohort-coll-worker", "s3", 3, "matrix", env_svc, 90000);
}
END_TEST

START_TEST(test_service_matrix_4_ranks)
{
	th_scenario_expect(
	    "cohort-coll-worker", "s4", 4, "matrix", env_svc, 90000);
}
END_TEST

START_TEST(test_service_subgroups)
{
	th_scenario_expect(
	    "cohort-coll-worker", "ssub", 4, "subgroup", env_svc, 90000);
}
END_TEST

START_TEST(test_service_async)
{
	th_scenario_expect(
	    "cohort-coll-worker", "sasync", 3, "async", env_svc, 60000);
}
END_TEST

Suite *suite_integration_collectives(void); /* for tools/gen_suites.sh */

Suite *
suite_integration_collectives(void)
{
	Suite *s = suite_create("integration_collectives");

	th_suite_case(s, "tcp", 180, th_fx_setup, th_fx_teardown,
	    test_tcp_matrix_1_rank, test_tcp_matrix_2_ranks_large,
	    test_tcp_matrix_3_ranks, test_tcp_matrix_5_ranks,
	    test_tcp_matrix_8_ranks, test_tcp_subgroups_even_odd,
	    test_tcp_two_groups_two_threads,
	    test_tcp_async_in_order_with_overlap, test_argument_validation,
	    test_configured_backend_unavailable_names_why, NULL);
	th_suite_case(s, "service", 180, th_fx_setup, th_fx_teardown,
	    test_service_matrix_1_rank, test_service_matrix_3_ranks,
	    test_service_matrix_4_ranks, test_service_subgroups,
	    test_service_async, NULL);
	return (s);
}
