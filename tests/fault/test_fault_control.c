/*
 * test_fault_control.c - process faults against the control plane: a
 * SIGKILLed rank and a rank reporting its own failure must surface on
 * every other rank as COHORT_EPEERLOST naming it, promptly (the bounds
 * here only catch hangs; the measured detection time is in
 * bench/faults and docs/failures.md).
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

START_TEST(test_sigkill_fails_pending_barrier_everywhere)
{
	struct th_workers w;
	const int victim = 3;
	int64_t t0;

	static const char *const env[] = { "COHORT_TEST_VICTIM=3", NULL };

	th_workers_start(
	    &w, &th_fx_coord, "kill", "t", 8, "hold", "120000", env);
	/* give them a moment to park in barrier "final" (not required:
	 * a later arrival is answered from the sticky failure) */
	t0 = th_signal_when_ready(&w, w.pid[victim], SIGKILL, 100);
	th_workers_wait(&w, 20000);
	ck_assert_int_eq(w.status[victim], 128 + SIGKILL);
	for (int r = 0; r < 8; r++) {
		char *o;
		if (r == victim)
			continue;
		o = th_worker_output(&w, r);
		th_expect_peer_lost(
		    &w, r, o, "status=COHORT_EPEERLOST", victim);
		free(o);
	}
	/* generous hang bound; the real figure is measured by the bench */
	ck_assert_int_lt(th_now_ms() - t0, 15000);
}
END_TEST

START_TEST(test_sigstop_detected_by_missed_heartbeats)
{
	/* dead-after 5 s scaled to 2 s */
	static const char *const env[]
	    = { "COHORT_TEST_VICTIM=2", "COHORT_TIMEOUT_SCALE=0.4", NULL };
	struct th_workers w;
	int64_t t0;

	th_workers_start(
	    &w, &th_fx_coord, "stop", "t", 4, "hold", "120000", env);
	t0 = th_signal_when_ready(&w, w.pid[2], SIGSTOP, 100);
	for (int r = 0; r < 4; r++) {
		int st;
		if (r == 2)
			continue;
		ck_assert_msg(th_wait(w.pid[r], 20000, &st),
		    "rank %d still blocked 20 s after SIGSTOP", r);
		w.status[r] = th_exit_code(st);
	}
	{
		int64_t took = th_now_ms() - t0;
		/* dead-after (2 s) + sweep; generous for loaded machines */
		ck_assert_msg(
		    took < 12000, "detection took %lld ms", (long long)took);
	}
	kill(w.pid[2], SIGKILL);
	kill(w.pid[2], SIGCONT);
	th_wait(w.pid[2], 5000, NULL);
	for (int r = 0; r < 4; r++) {
		char *o;
		if (r == 2)
			continue;
		o = th_worker_output(&w, r);
		ck_assert_msg(strstr(o, "status=COHORT_EPEERLOST") != NULL
		        && strstr(o, "rank 2") != NULL
		        && strstr(o, "heartbeat") != NULL,
		    "rank %d: expected EPEERLOST naming rank 2 and missed "
		    "heartbeats: %s",
		    r, o);
		free(o);
	}
}
END_TEST

START_TEST(test_reported_failure_text_reaches_others)
{
	struct th_workers w;

	th_workers_run(
	    &w, &th_fx_coord, "report", "t", 4, "report", NULL, NULL, 60000);
	ck_assert_int_eq(w.status[1], 1);
	for (int r = 0; r < 4; r++) {
		char *o;
		if (r == 1)
			continue;
		o = th_worker_output(&w, r);
		ck_assert_msg(w.status[r] == 0, "rank %d: %s", r, o);
		ck_assert_msg(strstr(o, "loss is NaN at step 7") != NULL
		        && strstr(o, "rank 1") != NULL,
		    "rank %d: %s", r, o);
		free(o);
	}
}
END_TEST

Suite *
suite_fault_control(void)
{
	return (th_suite("fault_control", "process", 120, th_fx_setup,
	    th_fx_teardown, test_sigkill_fails_pending_barrier_everywhere,
	    test_sigstop_detected_by_missed_heartbeats,
	    test_reported_failure_text_reaches_others, NULL));
}
