/*
 * test_fault_data.c - a rank SIGKILLed in the middle of a large looped
 * allreduce (64 MiB, tcp backend; 8 MiB over the service backend): every
 * survivor's call returns COHORT_EPEERLOST naming the killed rank within a
 * generous bound, later calls return the same sticky error, and no process
 * hangs. A SIGSTOPped rank (a silent host) is found by cohortd's
 * heartbeat detector and surfaces the same way. The workers print when
 * they saw the failure; the test prints the detection time measured from
 * the signal.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

#define FAULT_BOUND_MS 15000

/* Signals the victim (SIGKILL: its connections break at once; SIGSTOP:
 * it goes silent and cohortd's heartbeat detector must notice) in the
 * middle of the looped allreduce. */
static void
fault_kill_during_allreduce(const char *job, int n, int victim,
    const char *bytes, const char *backend, int sig)
{
	struct th_workers w;
	int64_t t_kill, worst = 0;
	char name[64], e_back[64];
	const char *const env[] = { e_back, NULL };

	snprintf(e_back, sizeof(e_back), "COHORT_TEST_BACKEND=%s", backend);
	th_workers_start_bin(&w, &th_fx_coord, "cohort-coll-worker", job,
	    "tok", n, "killloop", bytes, env);
	ck_assert_msg(th_wait_until(th_workers_ready, &w, 6000, 10),
	    "workers never completed a first allreduce");
	usleep(150 * 1000); /* well inside the next one */
	t_kill = th_now_ms();
	kill(w.pid[victim], sig);
	for (int r = 0; r < n; r++) {
		int st;
		int64_t left = t_kill + FAULT_BOUND_MS + 10000 - th_now_ms();

		if (r == victim)
			continue;
		if (th_wait(w.pid[r], left > 0 ? (int)left : 0, &st)) {
			w.status[r] = th_exit_code(st);
		} else {
			for (int k = 0; k < n; k++)
				th_kill(w.pid[k]);
			ck_abort_msg("rank %d hung after rank %d got "
			             "signal %d",
			    r, victim, sig);
		}
	}
	th_kill(w.pid[victim]);
	w.status[victim] = 128 + SIGKILL;
	snprintf(name, sizeof(name), "rank %d ", victim);
	for (int r = 0; r < n; r++) {
		char *o, *p;
		int64_t at = 0;

		if (r == victim)
			continue;
		o = th_worker_output(&w, r);
		ck_assert_msg(w.status[r] == 0, "rank %d exited %d:\n%s", r,
		    w.status[r], o);
		ck_assert_msg(
		    strstr(o, "killloop status=COHORT_EPEERLOST") != NULL,
		    "rank %d: %s", r, o);
		ck_assert_msg(strstr(o, name) != NULL,
		    "rank %d does not name rank %d: %s", r, victim, o);
		ck_assert_msg(
		    strstr(o, "sticky status=COHORT_EPEERLOST") != NULL,
		    "rank %d: error not sticky: %s", r, o);
		if ((p = strstr(o, "err_at_ms=")) != NULL)
			at = strtoll(p + 10, NULL, 10);
		ck_assert_msg(at > 0 && at - t_kill < FAULT_BOUND_MS,
		    "rank %d saw the failure %" PRId64 " ms after the kill", r,
		    at - t_kill);
		if (at - t_kill > worst)
			worst = at - t_kill;
		free(o);
	}
	printf("fault_data %s: %d ranks, %s-byte allreduce, rank %d got "
	       "%s: every survivor returned EPEERLOST within %" PRId64 " ms\n",
	    backend, n, bytes, victim, sig == SIGKILL ? "SIGKILL" : "SIGSTOP",
	    worst);
	fflush(stdout);
}

/* The victim's signal (SIGSTOP: heartbeat 500 ms, dead after 3 s in
 * cohort-coll-worker) in the middle of an allreduce of `bytes`. */
static const struct {
	const char *job;
	int n, victim;
	const char *bytes, *backend;
	int sig;
} fd_cases[] = {
	{ "fd-tcp", 4, 2, "67108864", "tcp", SIGKILL },
	{ "fd-tcp0", 3, 0, "33554432", "tcp", SIGKILL },
	{ "fd-svc", 3, 1, "8388608", "service", SIGKILL },
	{ "fd-stop", 3, 1, "33554432", "tcp", SIGSTOP },
};

START_TEST(test_signal_during_allreduce)
{
	fault_kill_during_allreduce(fd_cases[_i].job, fd_cases[_i].n,
	    fd_cases[_i].victim, fd_cases[_i].bytes, fd_cases[_i].backend,
	    fd_cases[_i].sig);
}
END_TEST

Suite *suite_fault_data(void); /* for tools/gen_suites.sh */

Suite *
suite_fault_data(void)
{
	Suite *s = suite_create("fault_data");
	TCase *tc = th_suite_case(
	    s, "sigkill", 120, th_fx_setup, th_fx_teardown, NULL);

	tcase_add_loop_test(tc, test_signal_during_allreduce, 0,
	    (int)(sizeof(fd_cases) / sizeof(fd_cases[0])));
	return (s);
}
