/*
 * test_mismatch.c - collectives that agree or fail (issue 12, finding 6),
 * through the public API with real processes: two ranks call different
 * collectives; both get COHORT_EMISMATCH naming both sides, on the tcp
 * backend (shared memory and pure TCP) and the service backend. Before,
 * tcp returned OK with wrong data (counts 64 vs 256).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"

static const struct {
	const char *arg, *want0, *want1;
} mm_cases[] = {
	{ "count", "count 64", "count 256" },
	{ "root", "root 0", "root 1" },
	{ "op", "sum", "max" },
	{ "dtype", "f64", "f32" },
	{ "order", "allreduce", "broadcast" },
	{ "agcount", "count 64", "count 128" },
	{ "rscount", "count 64", "count 128" },
	{ "a2acount", "count 64", "count 128" },
};

static const char *const mm_env[][3] = {
	{ "COHORT_BACKEND=tcp", NULL, NULL },
	{ "COHORT_BACKEND=tcp", "COHORT_TCP_SHM=0", NULL },
	{ "COHORT_BACKEND=service", NULL, NULL },
};

#define MM_CASES ((int)(sizeof(mm_cases) / sizeof(mm_cases[0])))

/* Loop i: case i % MM_CASES on the tcp backend with shared memory, pure
 * TCP, and the service backend (the allgather, reduce_scatter and alltoall
 * counts: before, the shared-memory path ran them unchecked). */
START_TEST(test_tcp_mismatch_fails_every_rank)
{
	struct th_workers w;
	char job[32];
	int k = _i % MM_CASES;

	snprintf(job, sizeof(job), "mm%d", _i);
	th_workers_run(&w, &th_fx_coord, job, "t", 2, "mismatch",
	    mm_cases[k].arg, mm_env[_i / MM_CASES], 60000);
	for (int r = 0; r < 2; r++) {
		char *o = th_worker_output(&w, r);

		fprintf(stderr, "%s/%s rank %d: %s", mm_cases[k].arg,
		    mm_env[_i / MM_CASES][0] + 15, r, o);
		ck_assert_msg(th_worker_output_has(&w, r,
		                  "RESULT mismatch status=COHORT_EMISMATCH")
		        && th_worker_output_has(&w, r, mm_cases[k].want0)
		        && th_worker_output_has(&w, r, mm_cases[k].want1)
		        && th_worker_output_has(&w, r, "rank 0")
		        && th_worker_output_has(&w, r, "rank 1")
		        && th_worker_output_has(&w, r, "RESULT done"),
		    "rank %d:\n%s", r, o);
		free(o);
	}
}
END_TEST

Suite *suite_integration_mismatch(void); /* for tools/gen_suites.sh */

Suite *
suite_integration_mismatch(void)
{
	Suite *s = suite_create("integration_mismatch");
	TCase *tc
	    = th_suite_case(s, "tcp", 120, th_fx_setup, th_fx_teardown, NULL);

	tcase_add_loop_test(
	    tc, test_tcp_mismatch_fails_every_rank, 0, 3 * MM_CASES);
	return (s);
}
