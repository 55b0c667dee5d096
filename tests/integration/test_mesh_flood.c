/*
 * test_mesh_flood.c - a mesh strangers cannot block (issue 12, finding 4)
 * with real processes: while ranks 0 and 1 form a tcp group, a third
 * process opens 64 silent connections to rank 1's data-plane listener
 * (cohort-test-worker flood). Before, they filled every handshake slot
 * and rank 0 failed with EAUTH ("wrong secret?"); now the job completes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"

START_TEST(test_silent_flood_does_not_block_the_job)
{
	struct th_workers w;
	int ok;

	/* The pair's mesh must form after the flood started, at its first
	 * all-reduce: with the set-up at group creation it could be done
	 * (and its listener closed) before the stranger connects. */
	static const char *const env[] = { "COHORT_EAGER_CONNECT=0", NULL };

	th_workers_start(
	    &w, &th_fx_coord, "flood", "t", 3, "flood", "64", env);
	ok = th_workers_wait(&w, 120000);
	for (int r = 0; r < 3; r++) {
		char *o = th_worker_output(&w, r);

		fprintf(stderr, "flood rank %d (exit %d): %s", r, w.status[r],
		    o != NULL ? o : "");
		free(o);
	}
	ck_assert(th_worker_output_has(&w, 2, "RESULT flood connections=64"));
	ck_assert(th_worker_output_has(&w, 0, "RESULT flood allreduce ok=1"));
	ck_assert(th_worker_output_has(&w, 1, "RESULT flood allreduce ok=1"));
	ck_assert_int_eq(ok, 3);
}
END_TEST

Suite *suite_integration_mesh_flood(void); /* for tools/gen_suites.sh */

Suite *
suite_integration_mesh_flood(void)
{
	return (th_suite("integration_mesh_flood", "flood", 180, th_fx_setup,
	    th_fx_teardown, test_silent_flood_does_not_block_the_job, NULL));
}
