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

static struct th_coord coord;

static void
setup(void)
{
	th_coord_start(&coord, NULL);
}

static void
teardown(void)
{
	ck_assert_int_eq(th_coord_stop(&coord), 0);
}

static void
fault_start(struct th_workers *w, const char *job, int n, const char *arg,
    const char *backend)
{
	w->n = n;
	for (int r = 0; r < n; r++) {
		char e_coord[128], e_job[160], e_rank[32], e_world[32],
		    e_back[64];
		char *env[8];
		char *argv[4];

		snprintf(e_coord, sizeof(e_coord), "COHORT_COORDINATOR=%s",
		    coord.url);
		snprintf(e_job, sizeof(e_job), "COHORT_JOB=%s", job);
		snprintf(e_rank, sizeof(e_rank), "COHORT_RANK=%d", r);
		snprintf(e_world, sizeof(e_world), "COHORT_WORLD_SIZE=%d", n);
		snprintf(
		    e_back, sizeof(e_back), "COHORT_TEST_BACKEND=%s", backend);
		env[0] = e_coord;
		env[1] = e_job;
		env[2] = (char *)"COHORT_TOKEN=tok";
		env[3] = e_rank;
		env[4] = e_world;
		env[5] = e_back;
		env[6] = NULL;
		argv[0] = (char *)th_bin("cohort-coll-worker");
		argv[1] = (char *)"killloop";
		argv[2] = (char *)arg;
		argv[3] = NULL;
		snprintf(w->out[r], sizeof(w->out[r]), "%s/%s-%d.out",
		    th_tmpdir(), job, r);
		w->status[r] = -1;
		w->pid[r] = th_spawn(argv, env, w->out[r]);
	}
}

static bool
fault_all_ready(void *arg)
{
	struct th_workers *w = arg;

	for (int r = 0; r < w->n; r++)
		if (!th_worker_output_has(w, r, "READY"))
			return (false);
	return (true);
}

/* Signals the victim (SIGKILL: its connections break at once; SIGSTOP:
 * it goes silent and cohortd's heartbeat detector must notice) in the
 * middle of the looped allreduce. */
static void
fault_kill_during_allreduce(const char *job, int n, int victim,
    const char *bytes, const char *backend, int sig)
{
	struct th_workers w;
	int64_t t_kill, worst = 0;
	char name[64];

	fault_start(&w, job, n, bytes, backend);
	ck_assert_msg(th_wait_until(fault_all_ready, &w, 6000, 10),
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

START_TEST(test_sigkill_during_64mib_allreduce_tcp)
{
	fault_kill_during_allreduce(
	    "fd-tcp", 4, 2, "67108864", "tcp", SIGKILL);
}
END_TEST

START_TEST(test_sigkill_rank0_during_allreduce_tcp)
{
	fault_kill_during_allreduce(
	    "fd-tcp0", 3, 0, "33554432", "tcp", SIGKILL);
}
END_TEST

START_TEST(test_sigkill_during_allreduce_service)
{
	fault_kill_during_allreduce(
	    "fd-svc", 3, 1, "8388608", "service", SIGKILL);
}
END_TEST

START_TEST(test_sigstop_during_allreduce_tcp)
{
	/* heartbeat 500 ms, dead after 3 s (cohort-coll-worker) */
	fault_kill_during_allreduce(
	    "fd-stop", 3, 1, "33554432", "tcp", SIGSTOP);
}
END_TEST

Suite *suite_fault_data(void); /* for tools/gen_suites.sh */

Suite *
suite_fault_data(void)
{
	Suite *s = suite_create("fault_data");
	TCase *tc = tcase_create("sigkill");

	tcase_add_checked_fixture(tc, setup, teardown);
	tcase_set_timeout(tc, 120);
	tcase_add_test(tc, test_sigkill_during_64mib_allreduce_tcp);
	tcase_add_test(tc, test_sigkill_rank0_during_allreduce_tcp);
	tcase_add_test(tc, test_sigkill_during_allreduce_service);
	tcase_add_test(tc, test_sigstop_during_allreduce_tcp);
	suite_add_tcase(s, tc);
	return (s);
}
