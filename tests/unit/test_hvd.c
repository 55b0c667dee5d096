/*
 * test_hvd.c - strategies/hvd end to end: a real cohortd and N real ranks
 * (build/bin/cohort-strategy-worker):
 *
 *  - gradient synchronisation through named, negotiated, fused
 *    all-reduces gives the same parameters as ddp and as one process on
 *    the N-times batch, with and without fusion;
 *  - backward_passes_per_step handles accumulation itself;
 *  - named collectives from two threads in rank-dependent orders, an
 *    all-gather of unequal counts, a broadcast, a duplicate in-flight name
 *    (COHORT_EEXIST), mismatched counts (COHORT_EMISMATCH), and the stall
 *    check naming the rank that has not submitted a tensor.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strat_fixture.h"
#include "unit_suite.h"

START_TEST(test_hvd_equals_ddp_and_local)
{
	struct th_workers w;
	char *local = strat_run("hl", 0, "local", "world=3 steps=10", &w);
	char *ddp = strat_run("hd", 3, "ddp", "steps=10", &w);
	/* No fusion (threshold 4 KB < fc1.weight), then fused. */
	char *hvd = strat_run("hh", 3, "hvd", "steps=10 cap=4096", &w);
	char *fused = strat_run("hf", 3, "hvd", "steps=10 cap=67108864", &w);

	ck_assert(th_worker_output_has(&w, 0, "steps=10"));
	ck_assert_msg(
	    !th_worker_output_has(&w, 0, "fused=0"), "nothing was fused");
	strat_assert_same(local, hvd);
	strat_assert_same(ddp, hvd);
	strat_assert_same(ddp, fused);
	free(local);
	free(ddp);
	free(hvd);
	free(fused);
}
END_TEST

START_TEST(test_hvd_backward_passes_per_step)
{
	struct th_workers w;
	/* 4 passes of B per optimizer step == one step on 4 * N * B. */
	char *local
	    = strat_run("hal", 0, "local", "world=2 batch=32 steps=5", &w);
	char *hvd = strat_run("hah", 2, "hvd", "batch=8 accum=4 steps=5", &w);

	ck_assert(th_worker_output_has(&w, 0, "steps=5"));
	ck_assert(th_worker_output_has(&w, 1, "steps=5"));
	strat_assert_same(local, hvd);
	free(local);
	free(hvd);
}
END_TEST

START_TEST(test_hvd_named_collectives_and_stall)
{
	struct th_workers w;
	char *p = strat_run("api", 3, "hvdapi", "", &w);
	char *o0;

	for (int r = 0; r < 3; r++) {
		ck_assert(th_worker_output_has(&w, r, "THREADS ok"));
		ck_assert(th_worker_output_has(&w, r, "ALLGATHER ok"));
		ck_assert(th_worker_output_has(&w, r, "BROADCAST ok"));
		ck_assert(th_worker_output_has(&w, r, "DUPLICATE ok"));
		ck_assert(th_worker_output_has(&w, r, "MISMATCH ok"));
	}
	o0 = th_worker_output(&w, 0);
	ck_assert_msg(strstr(o0, "STALL tensor 'late'") != NULL
	        && strstr(o0, "missing ranks [2]") != NULL
	        && strstr(o0, "submitted by ranks [0,1]") != NULL,
	    "no stall report naming rank 2:\n%s", o0);
	ck_assert_msg(strstr(o0, "cohort hvd: stall") != NULL,
	    "rank 0 did not log the stall:\n%s", o0);
	free(o0);
	free(p);
}
END_TEST

/* Regression: a peer that dies used to leave the others' synchronize
 * waiting for its whole timeout (the negotiated batch was in neither the
 * table nor the pending list when the cycle failed). */
START_TEST(test_hvd_peer_death_fails_pending_promptly)
{
	struct th_workers w;
	char *p = strat_run("die", 3, "hvddie", "", &w);

	for (int r = 0; r < 2; r++) {
		char *o = th_worker_output(&w, r);
		const char *at = strstr(o, "PEERLOST after ");
		double ms;

		ck_assert_msg(at != NULL, "rank %d:\n%s", r, o);
		ms = strtod(at + strlen("PEERLOST after "), NULL);
		/* far below the 60 s timeout; detection takes milliseconds */
		ck_assert_msg(ms < 10000.0, "rank %d took %.0f ms", r, ms);
		free(o);
	}
	free(p);
}
END_TEST

Suite *
suite_hvd(void)
{
	const TTest *tests[] = { test_hvd_equals_ddp_and_local,
		test_hvd_backward_passes_per_step,
		test_hvd_named_collectives_and_stall,
		test_hvd_peer_death_fails_pending_promptly, NULL };
	const struct unit_case cases[] = {
		{ "end_to_end", 180, tests, NULL, th_fx_setup,
		    th_fx_teardown },
		{ NULL, 0, NULL, NULL, NULL, NULL },
	};

	return (unit_suite_cases("hvd", cases));
}
