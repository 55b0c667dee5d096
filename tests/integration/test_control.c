/*
 * test_control.c - the control plane end to end: a real cohortd on a free
 * loopback port and real worker processes (build/bin/cohort-test-worker)
 * exercising every operation of issue 2.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

static void
setup(void)
{
	static const char *const args[]
	    = { "--job", "secure:right-token", NULL };

	th_coord_start(&th_fx_coord, args);
}

static void
expect_all_ok(struct th_workers *w, int timeout_ms)
{
	int ok = th_workers_wait(w, timeout_ms);

	for (int r = 0; r < w->n; r++) {
		if (w->status[r] != 0) {
			char *o = th_worker_output(w, r);
			ck_abort_msg(
			    "rank %d exited %d:\n%s", r, w->status[r], o);
		}
	}
	ck_assert_int_eq(ok, w->n);
}

START_TEST(test_open_assigns_ranks)
{
	struct th_workers w;

	th_workers_start(
	    &w, &th_fx_coord, "open8", "t", 8, "open", NULL, NULL);
	expect_all_ok(&w, 30000);
	for (int r = 0; r < 8; r++) {
		char want[64];
		snprintf(want, sizeof(want), "rank=%d world=8", r);
		ck_assert_msg(th_worker_output_has(&w, r, want), "rank %d: %s",
		    r, th_worker_output(&w, r));
	}
}
END_TEST

/* The data plane is set up at join, in the background, on every rank: a
 * rank that waits for it (cohort_group_connect) gets it although its peers
 * issue no collective; COHORT_EAGER_CONNECT=0 defers it to their first
 * collective, so the same wait times out. */
START_TEST(test_data_plane_set_up_at_join)
{
	static const char *const env_off[]
	    = { "COHORT_EAGER_CONNECT=0", NULL };
	struct th_workers w;

	th_workers_start(
	    &w, &th_fx_coord, "early1", "t", 3, "early_setup", "2000", NULL);
	expect_all_ok(&w, 30000);
	ck_assert_msg(th_worker_output_has(&w, 0, "rank=0 status=COHORT_OK"),
	    "%s", th_worker_output(&w, 0));
	for (int r = 0; r < 3; r++)
		ck_assert_msg(th_worker_output_has(&w, r, "RESULT sum=3"),
		    "rank %d: %s", r, th_worker_output(&w, r));

	th_workers_run(&w, &th_fx_coord, "early0", "t", 3, "early_setup",
	    "1000", env_off, 30000);
	ck_assert_msg(
	    th_worker_output_has(&w, 0, "rank=0 status=COHORT_ETIMEDOUT"),
	    "%s", th_worker_output(&w, 0));
}
END_TEST

/* Regression: every clean close logged "reconnected to the coordinator
 * ... after <machine uptime> s" (nng redialled after cohortd closed the
 * Leave's connection). With info logs, a clean run logs no reconnection;
 * a misspelt COHORT_LOG_LEVEL says so instead of being ignored. */
START_TEST(test_clean_close_logs_no_reconnection)
{
	static const char *const env_info[]
	    = { "COHORT_LOG_LEVEL=info", NULL };
	static const char *const env_bad[]
	    = { "COHORT_LOG_LEVEL=verbose", NULL };
	struct th_workers w;

	th_workers_start(
	    &w, &th_fx_coord, "quietclose", "t", 2, "open", NULL, env_info);
	expect_all_ok(&w, 30000);
	for (int r = 0; r < 2; r++) {
		ck_assert_msg(th_worker_output_has(&w, r, "joined job"),
		    "rank %d logged nothing at info: %s", r,
		    th_worker_output(&w, r));
		ck_assert_msg(!th_worker_output_has(&w, r, "reconnected"),
		    "rank %d: %s", r, th_worker_output(&w, r));
	}
	th_workers_start(
	    &w, &th_fx_coord, "badlevel", "t", 1, "open", NULL, env_bad);
	expect_all_ok(&w, 30000);
	ck_assert_msg(th_worker_output_has(
	                  &w, 0, "COHORT_LOG_LEVEL=verbose is not a level"),
	    "%s", th_worker_output(&w, 0));
}
END_TEST

START_TEST(test_open_rank_assigned_by_coordinator)
{
	static const char *const env[] = { "COHORT_RANK=-1", NULL };
	struct th_workers w;
	int seen[4] = { 0 };

	th_workers_start(
	    &w, &th_fx_coord, "assign", "t", 4, "open", NULL, env);
	expect_all_ok(&w, 30000);
	for (int r = 0; r < 4; r++)
		for (int k = 0; k < 4; k++) {
			char want[64];
			snprintf(want, sizeof(want), "rank=%d world=4", k);
			if (th_worker_output_has(&w, r, want))
				seen[k]++;
		}
	for (int k = 0; k < 4; k++)
		ck_assert_msg(
		    seen[k] == 1, "rank %d assigned %d times", k, seen[k]);
}
END_TEST

/* Scenarios that run n ranks of one job to a clean exit; then ranks
 * [from, to) must have printed want. */
static const struct {
	const char *job, *token, *scenario, *arg;
	int n, timeout_ms;
	int from, to;
	const char *want;
} ctl_clean[] = {
	{ "bar", "t", "barrier", "1000", 8, 120000, 0, 0, NULL },
	{ "bcast", "t", "bcast", "33554432", 8, 120000, 1, 8,
	    "len=33554432 ok=1" },
	/* a kv wait released by another rank */
	{ "kvwait", "t", "kvwait", NULL, 8, 60000, 0, 1, "ok=1" },
	{ "kvops", "t", "kvops", NULL, 8, 60000, 0, 0, NULL },
	/* boolean decisions, mixed */
	{ "decide", "t", "decide", NULL, 8, 60000, 0, 8,
	    "all=0 any=1 all_true=1" },
	{ "reduce", "t", "reduce", NULL, 8, 60000, 5, 6,
	    "sum=28 max=3.5 ok=1" },
	/* the right token of a job created with --job */
	{ "secure", "right-token", "barrier", "10", 2, 30000, 0, 0, NULL },
};

START_TEST(test_scenario_runs_clean)
{
	struct th_workers w;

	th_workers_start(&w, &th_fx_coord, ctl_clean[_i].job,
	    ctl_clean[_i].token, ctl_clean[_i].n, ctl_clean[_i].scenario,
	    ctl_clean[_i].arg, NULL);
	expect_all_ok(&w, ctl_clean[_i].timeout_ms);
	for (int r = ctl_clean[_i].from; r < ctl_clean[_i].to; r++)
		ck_assert_msg(th_worker_output_has(&w, r, ctl_clean[_i].want),
		    "%s rank %d: no \"%s\" in %s", ctl_clean[_i].job, r,
		    ctl_clean[_i].want, th_worker_output(&w, r));
}
END_TEST

START_TEST(test_wrong_token_refused)
{
	struct th_workers w;

	th_workers_run(&w, &th_fx_coord, "secure", "wrong-token", 1, "open",
	    NULL, NULL, 30000);
	ck_assert_int_eq(w.status[0], 1);
	ck_assert_msg(th_worker_output_has(&w, 0, "status=COHORT_EAUTH"), "%s",
	    th_worker_output(&w, 0));
}
END_TEST

START_TEST(test_two_jobs_isolated)
{
	struct th_workers a, b, c, d;

	/* same rank numbers and barrier names in two jobs at once */
	th_workers_start(
	    &c, &th_fx_coord, "iso-c", "tc", 4, "barrier", "200", NULL);
	th_workers_start(
	    &d, &th_fx_coord, "iso-d", "td", 4, "barrier", "200", NULL);
	th_workers_start(
	    &a, &th_fx_coord, "iso-a", "ta", 1, "kvisolate", "writer", NULL);
	expect_all_ok(&a, 30000);
	th_workers_start(
	    &b, &th_fx_coord, "iso-b", "tb", 1, "kvisolate", "reader", NULL);
	expect_all_ok(&b, 30000);
	expect_all_ok(&c, 60000);
	expect_all_ok(&d, 60000);
}
END_TEST

START_TEST(test_duplicate_rank_refused)
{
	static const char *const r0[] = { "COHORT_RANK=0", NULL };
	struct th_workers a;
	int eexist;

	/* both workers ask for rank 0 of a world of 2 */
	th_workers_start(&a, &th_fx_coord, "dup", "t", 2, "open", NULL, r0);
	/* one of them is refused; wait for it */
	for (int tries = 0; tries < 1000; tries++) {
		if (th_worker_output_has(&a, 0, "COHORT_EEXIST")
		    || th_worker_output_has(&a, 1, "COHORT_EEXIST"))
			break;
		usleep(10000);
	}
	eexist = th_worker_output_has(&a, 0, "COHORT_EEXIST")
	    + th_worker_output_has(&a, 1, "COHORT_EEXIST");
	ck_assert_msg(eexist == 1, "expected one EEXIST:\n%s\n%s",
	    th_worker_output(&a, 0), th_worker_output(&a, 1));
	/* rank 1 arrives; the surviving rank 0 completes */
	{
		char e_coord[128],
		    *env[] = { "COHORT_RANK=1", "COHORT_WORLD_SIZE=2",
			    "COHORT_JOB=dup", "COHORT_TOKEN=t", e_coord,
			    NULL };
		char *argv[]
		    = { (char *)th_bin("cohort-test-worker"), "open", NULL };
		char out[256];
		int st;
		pid_t p;

		snprintf(e_coord, sizeof(e_coord), "COHORT_COORDINATOR=%s",
		    th_fx_coord.url);
		snprintf(out, sizeof(out), "%s/dup-late.out", th_tmpdir());
		p = th_spawn(argv, env, out);
		ck_assert(th_wait(p, 30000, &st));
		ck_assert_int_eq(th_exit_code(st), 0);
	}
	th_workers_wait(&a, 30000);
	ck_assert_int_eq((a.status[0] == 0) + (a.status[1] == 0), 1);
}
END_TEST

START_TEST(test_barrier_timeout_names_missing_rank)
{
	struct th_workers w;

	th_workers_start(
	    &w, &th_fx_coord, "tmo", "t", 4, "timeout", "1500", NULL);
	expect_all_ok(&w, 60000);
	for (int r = 0; r < 3; r++) {
		char *o = th_worker_output(&w, r);
		ck_assert_msg(strstr(o, "status=COHORT_ETIMEDOUT") != NULL
		        && strstr(o, "3") != NULL,
		    "rank %d: %s", r, o);
		ck_assert_msg(strstr(o, "healthy=1") != NULL,
		    "group poisoned by a timeout: %s", o);
		free(o);
	}
}
END_TEST

Suite *
suite_integration_control(void)
{
	Suite *s = suite_create("integration_control");
	TCase *tc = th_suite_case(s, "core", 180, setup, th_fx_teardown,
	    test_open_assigns_ranks, test_data_plane_set_up_at_join,
	    test_open_rank_assigned_by_coordinator,
	    test_clean_close_logs_no_reconnection, test_wrong_token_refused,
	    test_two_jobs_isolated, test_duplicate_rank_refused,
	    test_barrier_timeout_names_missing_rank, NULL);

	tcase_add_loop_test(tc, test_scenario_runs_clean, 0,
	    (int)(sizeof(ctl_clean) / sizeof(ctl_clean[0])));
	return (s);
}
