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

static unsigned long
coll_seed(void)
{
	const char *s = getenv("COHORT_TEST_SEED");

	if (s != NULL && s[0] != '\0')
		return (strtoul(s, NULL, 10));
	return ((unsigned long)time(NULL) % 100000);
}

/* Waits for every rank; on a hang, kills them all and fails with the tail
 * of each rank's output (the worker prints a STUCK line naming the case
 * it is blocked in). */
static void
coll_wait(struct th_workers *w, int timeout_ms, const char *scenario,
    unsigned long seed)
{
	int64_t end = th_now_ms() + timeout_ms;
	char msg[6000];
	size_t off = 0;
	bool hung = false;

	for (int r = 0; r < w->n; r++) {
		int st;
		int64_t left = end - th_now_ms();

		if (th_wait(w->pid[r], left > 0 ? (int)left : 0, &st))
			w->status[r] = th_exit_code(st);
		else
			hung = true;
	}
	if (!hung)
		return;
	msg[0] = '\0';
	for (int r = 0; r < w->n; r++) {
		char *o;
		size_t len;
		int k;

		if (w->status[r] < 0) {
			th_kill(w->pid[r]);
			w->status[r] = 137;
		}
		o = th_worker_output(w, r);
		len = strlen(o);
		k = snprintf(msg + off, sizeof(msg) - off,
		    "--- rank %d (exit %d):\n%s\n", r, w->status[r],
		    len > 600 ? o + len - 600 : o);
		free(o);
		if (k < 0 || (size_t)k >= sizeof(msg) - off)
			break;
		off += (size_t)k;
	}
	ck_abort_msg("%s (seed %lu) hung past %d ms:\n%s", scenario, seed,
	    timeout_ms, msg);
}

/* Runs scenario on n ranks and expects every rank to exit 0 with
 * "failed=0" in its output. */
static void
coll_expect(const char *job, int n, const char *scenario,
    const char *const *env, int timeout_ms)
{
	struct th_workers w;
	char arg[32];
	unsigned long seed = coll_seed();

	snprintf(arg, sizeof(arg), "%lu", seed);
	th_workers_start_bin(&w, &th_fx_coord, "cohort-coll-worker", job,
	    "tok", n, scenario, arg, env);
	coll_wait(&w, timeout_ms, scenario, seed);
	for (int r = 0; r < n; r++) {
		char *o = th_worker_output(&w, r);

		ck_assert_msg(w.status[r] == 0 && strstr(o, "failed=0")
		        && strstr(o, "FAIL") == NULL,
		    "%s on %d ranks (seed %lu): rank %d exited %d:\n%.4000s",
		    scenario, n, seed, r, w.status[r], o);
		free(o);
	}
}

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
	coll_expect("m1", 1, "matrix", env_tcp, 60000);
}
END_TEST

START_TEST(test_tcp_matrix_2_ranks_large)
{
	coll_expect("m2", 2, "matrix", env_tcp_big, 90000);
}
END_TEST

START_TEST(test_tcp_matrix_3_ranks)
{
	coll_expect("m3", 3, "matrix", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_matrix_5_ranks)
{
	coll_expect("m5", 5, "matrix", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_matrix_8_ranks)
{
	coll_expect("m8", 8, "matrix", env_tcp_small, 120000);
}
END_TEST

START_TEST(test_tcp_subgroups_even_odd)
{
	coll_expect("sub", 5, "subgroup", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_two_groups_two_threads)
{
	coll_expect("conc", 4, "concurrent", env_tcp, 90000);
}
END_TEST

START_TEST(test_tcp_async_in_order_with_overlap)
{
	coll_expect("async", 3, "async", env_tcp, 60000);
}
END_TEST

START_TEST(test_argument_validation)
{
	coll_expect("errors", 2, "errors", env_tcp, 30000);
}
END_TEST

/* Regression: COHORT_BACKEND=nccl where NCCL cannot be loaded (this
 * machine has no GPU) gave ENOTSUP with an empty group detail. Where
 * NCCL loads, the worker prints a SKIP line: the collective just works. */
START_TEST(test_configured_backend_unavailable_names_why)
{
	static const char *const env_nccl[]
	    = { "COHORT_TEST_BACKEND=nccl", NULL };

	coll_expect("nonccl", 1, "nonccl", env_nccl, 30000);
}
END_TEST

START_TEST(test_service_matrix_1_rank)
{
	coll_expect("s1", 1, "matrix", env_svc, 60000);
}
END_TEST

START_TEST(test_service_matrix_3_ranks)
{
	coll_expect("s3", 3, "matrix", env_svc, 90000);
}
END_TEST

START_TEST(test_service_matrix_4_ranks)
{
	coll_expect("s4", 4, "matrix", env_svc, 90000);
}
END_TEST

START_TEST(test_service_subgroups)
{
	coll_expect("ssub", 4, "subgroup", env_svc, 90000);
}
END_TEST

START_TEST(test_service_async)
{
	coll_expect("sasync", 3, "async", env_svc, 60000);
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
