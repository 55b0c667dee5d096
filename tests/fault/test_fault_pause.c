/*
 * test_fault_pause.c - pauses are not failures (issue 12, finding 3).
 *
 * Suite fault_pause, real cohortd and real workers:
 *  - cohortd SIGSTOPped for 10 s (twice its members' dead-after) during a
 *    2-rank barrier loop, then SIGCONT: the job goes on and finishes (the
 *    stall gives every member a fresh dead-after window instead of
 *    declaring them dead before their queued heartbeats are read), and
 *    cohortd logs the stall.
 *  - a worker SIGSTOPped longer than its dead-after is still declared dead
 *    and named: the coordinator's own stall handling must not hide a
 *    member's.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

Suite *suite_fault_pause(void);

START_TEST(test_coordinator_pause_is_not_a_failure)
{
	struct th_workers w;
	int64_t t0;

	/* default liveness: heartbeat 1 s, dead-after 5 s; the loop runs
	 * 25 s, cohortd is stopped for 10 s of it */
	th_workers_start(
	    &w, &th_fx_coord, "pause", "t", 2, "barrier_for", "25000", NULL);
	t0 = th_signal_when_ready(&w, th_fx_coord.pid, SIGSTOP, 1000);
	usleep(10 * 1000 * 1000);
	ck_assert_int_eq(kill(th_fx_coord.pid, SIGCONT), 0);
	printf("MEASURE fault_pause: cohortd stopped for %lld ms\n",
	    (long long)(th_now_ms() - t0));
	th_workers_wait(&w, 90000);
	for (int r = 0; r < 2; r++) {
		char *o = th_worker_output(&w, r);
		ck_assert_msg(w.status[r] == 0, "rank %d exit %d: %s", r,
		    w.status[r], o);
		ck_assert_msg(strstr(o, "RESULT barrier_for count=") != NULL,
		    "rank %d: %s", r, o);
		printf("MEASURE fault_pause rank %d: %s", r,
		    strstr(o, "RESULT barrier_for"));
		free(o);
	}
	ck_assert_msg(th_coord_log_has(&th_fx_coord, "event loop stalled"),
	    "cohortd did not log the stall (log %s)", th_fx_coord.log);
	ck_assert_msg(!th_coord_log_has(&th_fx_coord, "no heartbeat for"),
	    "cohortd declared a member dead (log %s)", th_fx_coord.log);
}
END_TEST

START_TEST(test_worker_pause_is_still_a_failure)
{
	/* dead-after 5 s scaled to 2 s */
	static const char *const env[] = { "COHORT_TIMEOUT_SCALE=0.4", NULL };
	struct th_workers w;
	int64_t t0, took;
	char *o;
	int st;

	th_workers_start(
	    &w, &th_fx_coord, "wpause", "t", 2, "barrier_for", "60000", env);
	t0 = th_signal_when_ready(&w, w.pid[1], SIGSTOP, 200);
	ck_assert_msg(th_wait(w.pid[0], 30000, &st),
	    "rank 0 still running 30 s after rank 1 was stopped");
	took = th_now_ms() - t0;
	w.status[0] = th_exit_code(st);
	kill(w.pid[1], SIGKILL);
	kill(w.pid[1], SIGCONT);
	th_wait(w.pid[1], 5000, NULL);
	o = th_worker_output(&w, 0);
	ck_assert_msg(w.status[0] == 1, "rank 0 exit %d: %s", w.status[0], o);
	ck_assert_msg(strstr(o, "status=COHORT_EPEERLOST") != NULL
	        && strstr(o, "rank 1") != NULL
	        && strstr(o, "no heartbeat for") != NULL,
	    "rank 0: expected EPEERLOST naming rank 1 and its silence: %s", o);
	free(o);
	printf("MEASURE fault_pause: stopped worker declared dead after "
	       "%lld ms (dead-after 2000 ms)\n",
	    (long long)took);
	/* dead-after (2 s) + sweep; generous for a loaded machine */
	ck_assert_msg(took >= 1900 && took < 15000, "detection took %lld ms",
	    (long long)took);
}
END_TEST

Suite *
suite_fault_pause(void)
{
	return (th_suite("fault_pause", "pause", 150, th_fx_setup,
	    th_fx_teardown, test_coordinator_pause_is_not_a_failure,
	    test_worker_pause_is_still_a_failure, NULL));
}
