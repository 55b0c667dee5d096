/*
 * test_p2p.c - point-to-point and alltoallv end to end: a real cohortd and
 * N real processes (build/bin/cohort-p2p-worker) using cohort_send,
 * cohort_recv, their i-forms, batches, receives from any rank and
 * cohort_alltoallv, over tcp (the host backend's connections of their
 * own) and through cohortd (the service backend's mailboxes); a peer
 * SIGKILLed while the others wait in a receive from it; a size mismatch;
 * a receive past its deadline.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "check_cohort.h"

static const char *const env_tcp[] = { "COHORT_TEST_BACKEND=tcp", NULL };
/* Small values at cohortd: the 3 MiB messages travel in chunks. */
static const char *const env_svc[]
    = { "COHORT_TEST_BACKEND=service", "COHORT_SERVICE_CHUNK=262144", NULL };

/* The worker's scenarios, each on a job of its own: over tcp first, then
 * (from P2P_SVC on) through cohortd. */
#define P2P_SVC 5
static const struct {
	const char *job;
	int n;
	const char *scenario;
	const char *const *env;
	int timeout_ms;
} p2p_runs[] = {
	{ "p2p2", 2, "basic", env_tcp, 120000 },
	{ "p2p3", 3, "basic", env_tcp, 120000 },
	{ "p2p5", 5, "basic", env_tcp, 150000 },
	/* a size mismatch fails both sides */
	{ "p2pmm", 2, "mismatch", env_tcp, 60000 },
	/* a receive past its deadline names the wait; the error sticks */
	{ "p2pto", 2, "timeout", env_tcp, 60000 },
	{ "p2psvc", 3, "basic", env_svc, 150000 },
	/* through cohortd the send completes when cohortd holds it: only
	 * the receive fails (the worker checks each side) */
	{ "p2psmm", 2, "mismatch", env_svc, 60000 },
};
#define P2P_NRUNS ((int)(sizeof(p2p_runs) / sizeof(p2p_runs[0])))

START_TEST(test_p2p_scenario)
{
	th_scenario_expect("cohort-p2p-worker", p2p_runs[_i].job,
	    p2p_runs[_i].n, p2p_runs[_i].scenario, p2p_runs[_i].env,
	    p2p_runs[_i].timeout_ms);
}
END_TEST

/* Rank 0 is SIGKILLed while ranks 1 and 2 wait in a receive from it: both
 * return COHORT_EPEERLOST naming rank 0 within seconds (its connection
 * closes at once), and every later call on the group returns it. */
static void
p2p_killed(const char *job, const char *const *env, int64_t bound_ms)
{
	struct th_workers w;
	int64_t t0;

	th_workers_start_bin(&w, &th_fx_coord, "cohort-p2p-worker", job, "tok",
	    3, "killed", NULL, env);
	t0 = th_signal_when_ready(&w, w.pid[0], SIGKILL, 100);
	th_workers_wait(&w, 30000);
	ck_assert_int_eq(w.status[0], 128 + SIGKILL);
	for (int r = 1; r < 3; r++) {
		char *o = th_worker_output(&w, r);

		th_expect_peer_lost(
		    &w, r, o, "RESULT recv status=COHORT_EPEERLOST", 0);
		{
			const char *l = strstr(o, "RESULT recv");
			const char *e = l != NULL ? strchr(l, '\n') : NULL;

			printf("MEASURE %s: rank %d: %.*s\n", job, r,
			    e != NULL ? (int)(e - l) : 300, l);
		}
		free(o);
	}
	ck_assert_int_lt(th_now_ms() - t0, bound_ms);
}

START_TEST(test_p2p_peer_killed_during_recv)
{
	p2p_killed("p2pkill", env_tcp, 15000);
}
END_TEST

START_TEST(test_p2p_service_peer_killed_during_recv)
{
	p2p_killed("p2pskill", env_svc, 20000);
}
END_TEST

Suite *suite_integration_p2p(void); /* for tools/gen_suites.sh */

Suite *
suite_integration_p2p(void)
{
	Suite *s = suite_create("integration_p2p");
	TCase *tcp = th_suite_case(s, "tcp", 240, th_fx_setup, th_fx_teardown,
	    test_p2p_peer_killed_during_recv, NULL);
	TCase *svc = th_suite_case(s, "service", 240, th_fx_setup,
	    th_fx_teardown, test_p2p_service_peer_killed_during_recv, NULL);

	tcase_add_loop_test(tcp, test_p2p_scenario, 0, P2P_SVC);
	tcase_add_loop_test(svc, test_p2p_scenario, P2P_SVC, P2P_NRUNS);
	return (s);
}
