/*
 * test_srv_harden.c - cohortd's core under a hostile or unlucky world
 * (issue 12): its own stalls, connections that speak for another client,
 * limits, expiry of abandoned jobs, idle connections. Driven through the
 * core's entry points with a fake clock (tests/unit/srv_fixture.h); the
 * transport passes nng's pipe id as `pipe`, as here.
 */
#include <string.h>

#include "srv_fixture.h"
#include "unit_suite.h"

Suite *suite_srv_harden(void);

/* n clients of job joined at world n, on connections pipe0.. */
static void
hd_form(struct fx *f, struct srq_cli *c, int n, const char *job,
    uint32_t pipe0, uint64_t id0)
{
	uintptr_t t[16];

	for (int i = 0; i < n; i++) {
		srq_cli_init(
		    &c[i], job, id0 + (uint64_t)i, pipe0 + (uint32_t)i);
		t[i] = fx_join(f, &c[i], i, (uint32_t)n, 60000);
	}
	for (int i = 0; i < n; i++)
		fx_joined(f, &c[i], t[i]);
}

static struct srv_job *
hd_job(struct fx *f, const char *name)
{
	struct srv_hnode *n = srv_map_get(&f->core->jobs, name, strlen(name));

	return (n != NULL ? SRV_CONTAINER(n, struct srv_job, hn) : NULL);
}

/* ------------------------------------------------------------------------ */
/* Finding 3: a stall of cohortd is not a member's silence                 */
/* ------------------------------------------------------------------------ */

START_TEST(test_loop_stall_gives_fresh_window)
{
	struct srq_cli c[2];
	struct srv_job *job;

	fx_form(f, c, 2, "j");
	job = hd_job(f, "j");
	/* cohortd stops for 10 s (dead-after is 5 s): the transport sees
	 * the sweep 10 s late and says so before sweeping */
	f->now += 10000;
	srv_core_loop_lag(f->core, 9900, f->now);
	srv_core_sweep(f->core, f->now);
	ck_assert_int_eq(job->members[0].state, SRV_MEMBER_RUNNING);
	ck_assert_int_eq(job->members[1].state, SRV_MEMBER_RUNNING);
	ck_assert_uint_eq(f->core->m.loop_stalls, 1);
	ck_assert_int_eq(f->core->m.loop_lag_max_ms, 9900);
	/* the queued heartbeat of rank 0 arrives; rank 1 stays silent and
	 * is declared dead one dead-after after the stall, not before */
	fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	fx_tick(f, 4900);
	ck_assert_int_eq(job->members[1].state, SRV_MEMBER_RUNNING);
	fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	fx_tick(f, 200);
	ck_assert_int_eq(job->members[0].state, SRV_MEMBER_RUNNING);
	ck_assert_int_eq(job->members[1].state, SRV_MEMBER_FAILED);
	ck_assert_ptr_nonnull(strstr(job->failed_text, "no heartbeat"));
	/* a small lag is only measured */
	srv_core_loop_lag(f->core, 300, f->now);
	ck_assert_uint_eq(f->core->m.loop_stalls, 1);
	ck_assert_int_eq(f->core->m.loop_lag_ms, 300);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Finding 9: the reply cache is bound to the connection and the request   */
/* ------------------------------------------------------------------------ */

/* q's request from c with seq (a retry, or another request reusing the
 * seq), val (if any) its payload. */
static uintptr_t
hd_send_seq(struct fx *f, struct srq_cli *c, Cohort__Request *rq, uint64_t seq,
    const char *val)
{
	rq->seq = seq;
	return (fx_send(f, c, rq, val, val != NULL ? strlen(val) : 0));
}

START_TEST(test_other_connection_gets_nothing_of_a_client)
{
	struct srq_cli c[2], imp;
	struct srq q;
	struct srv_job *job;
	uint64_t seq;
	uintptr_t t;

	fx_form(f, c, 2, "j");
	job = hd_job(f, "j");
	fx_want(f, fx_kv_set(f, &c[0], "secret", "member-0-value"), COHORT_OK);
	seq = c[0].seq;
	/* a second connection with rank 0's client id and seq, asking for
	 * something else */
	imp = c[0];
	imp.pipe = 99;
	t = hd_send_seq(f, &imp, srq_kv_get(&q, "other", false, 0), seq, NULL);
	ck_assert_ptr_nonnull(
	    strstr(fx_want(f, t, COHORT_EEXIST)->error, "another connection"));
	/* even the very same request gets nothing from there */
	t = hd_send_seq(
	    f, &imp, srq_kv_set(&q, "secret"), seq, "member-0-value");
	fx_want(f, t, COHORT_EEXIST);
	/* closing that connection does not fail the real member */
	srv_core_pipe_closed(f->core, 99, f->now);
	ck_assert_int_eq(job->members[0].state, SRV_MEMBER_RUNNING);
	ck_assert_int_eq(job->state, SRV_JOB_RUNNING);
	{
		uintptr_t b0 = fx_barrier(f, &c[0], "after", 1, 30000);
		uintptr_t b1 = fx_barrier(f, &c[1], "after", 1, 30000);
		fx_want(f, b0, COHORT_OK);
		fx_want(f, b1, COHORT_OK);
	}
	/* and its requests were no sign of life for the member */
	fx_tick(f, 3000);
	imp.pipe = 98;
	fx_want(f, fx_heartbeat(f, &imp, "", 0, "", false, 0), COHORT_EEXIST);
	fx_tick(f, 2200);
	ck_assert_int_eq(job->members[0].state, SRV_MEMBER_FAILED);
}
END_TEST

START_TEST(test_cached_reply_only_for_the_same_request)
{
	struct srq_cli c[2];
	struct srq q;
	uint64_t seq;
	uintptr_t t;

	fx_form(f, c, 2, "j");
	fx_want(f, fx_kv_set(f, &c[0], "k", "v1"), COHORT_OK);
	seq = c[0].seq;
	/* the same seq for another request, over the client's own
	 * connection: refused, not answered with the set's reply */
	t = hd_send_seq(f, &c[0], srq_kv_get(&q, "k", false, 0), seq, NULL);
	ck_assert_ptr_nonnull(
	    strstr(fx_want(f, t, COHORT_EINVAL)->error, "was used for"));
	/* a real retry (same request) is answered from the cache, once */
	t = hd_send_seq(f, &c[0], srq_kv_set(&q, "k"), seq, "v1");
	fx_want(f, t, COHORT_OK);
	/* same key and length, other value head: another request */
	t = hd_send_seq(f, &c[0], srq_kv_set(&q, "k"), seq, "v2");
	fx_want(f, t, COHORT_EINVAL);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Finding 8: idle connections and ones that never complete a request      */
/* ------------------------------------------------------------------------ */

static size_t
hd_idle(struct fx *f, uint32_t *out)
{
	return (srv_core_take_idle_pipes(f->core, f->now, out, 16));
}

START_TEST(test_idle_connections_closed_busy_ones_kept)
{
	struct srq_cli c[2], k;
	uint32_t out[16];
	struct srv_job *job;

	f->core->first_request_ms = 10000;
	f->core->idle_ms = 60000;
	/* members on 10 and 11, a KV waiter on 12, silent 13, one request
	 * then silence on 14 */
	for (uint32_t p = 10; p <= 14; p++)
		srv_pipe_opened(f->core, p, f->now);
	fx_form(f, c, 2, "j");
	job = hd_job(f, "j");
	srq_cli_init(&k, "j", 500, 12);
	(void)fx_kv_get(f, &k, "never", true, UINT32_MAX);
	{
		struct srq_cli s;
		srq_cli_init(&s, "j", 501, 14);
		fx_want(f, fx_kv_set(f, &s, "x", "1"), COHORT_OK);
	}
	f->now += 9999;
	ck_assert_uint_eq(hd_idle(f, out), 0);
	f->now += 1;
	ck_assert_uint_eq(hd_idle(f, out), 1);
	ck_assert_uint_eq(out[0], 13);
	ck_assert_uint_eq(f->core->m.conns_closed_first, 1);
	/* handed out once, until its close event */
	ck_assert_uint_eq(hd_idle(f, out), 0);
	srv_core_pipe_closed(f->core, 13, f->now);
	/* the members heartbeat; 60 s later only the silent client's
	 * connection goes, not the members' nor the waiter's */
	for (int i = 0; i < 60; i++) {
		fx_want(
		    f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
		fx_want(
		    f, fx_heartbeat(f, &c[1], "", 0, "", false, 0), COHORT_OK);
		fx_tick(f, 1000);
	}
	ck_assert_uint_eq(hd_idle(f, out), 1);
	ck_assert_uint_eq(out[0], 14);
	ck_assert_uint_eq(f->core->m.conns_closed_idle, 1);
	ck_assert_int_eq(job->state, SRV_JOB_RUNNING);
	/* a member's connection is judged by dead-after, then by idleness */
	fx_tick(f, 5100);
	ck_assert_int_eq(job->state, SRV_JOB_FAILED);
	ck_assert_uint_eq(hd_idle(f, out), 0);
	f->now += 60000;
	ck_assert_uint_eq(hd_idle(f, out), 2);
	/* nng may run the open event after the pipe's first request was
	 * handled: that request still counts */
	{
		struct srq_cli e;
		srq_cli_init(&e, "nope", 600, 60);
		fx_status(f, &e, "nope", COHORT_EAUTH);
		srv_pipe_opened(f->core, 60, f->now);
		f->now += 10000;
		ck_assert_uint_eq(hd_idle(f, out), 0);
		f->now += 50000;
		ck_assert_uint_eq(hd_idle(f, out), 1);
		ck_assert_uint_eq(out[0], 60);
		/* an open event after the close event tracks nothing */
		srv_core_pipe_closed(f->core, 61, f->now);
		srv_pipe_opened(f->core, 61, f->now);
		f->now += 20000;
		ck_assert_uint_eq(hd_idle(f, out), 0);
	}
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Least exposure: status needs a credential; /metrics names no job       */
/* ------------------------------------------------------------------------ */

/* A StatusQuery of job ("": every job) from cl with token, answered
 * want; the reply. */
static Cohort__Reply *
hd_status(struct fx *f, struct srq_cli *cl, const char *job, const char *token,
    cohort_status want)
{
	cl->token = token;
	return (fx_status(f, cl, job, want));
}

START_TEST(test_anonymous_status_refused)
{
	struct srq_cli c[2], anon;
	Cohort__Reply *r;

	fx_form(f, c, 2, "secret-project");
	/* no job, no token, no admin secret configured */
	srq_cli_init(&anon, "", 7, 77);
	r = hd_status(f, &anon, "", "", COHORT_EAUTH);
	ck_assert_ptr_nonnull(strstr(r->error, "admin secret"));
	ck_assert_ptr_null(strstr(r->error, "secret-project"));
	ck_assert_int_eq(r->body_case, COHORT__REPLY__BODY__NOT_SET);
	/* one job, with its token: fine */
	r = hd_status(f, &anon, "secret-project", "tok", COHORT_OK);
	ck_assert_uint_eq(r->status_query->n_jobs, 1);
	/* a wrong token for it: nothing */
	hd_status(f, &anon, "secret-project", "guess", COHORT_EAUTH);
	/* --open-status: the old behaviour, for a private coordinator */
	f->core->open_status = true;
	r = hd_status(f, &anon, "", "", COHORT_OK);
	ck_assert_uint_eq(r->status_query->n_jobs, 1);
}
END_TEST

START_TEST(test_metrics_name_no_job_unless_asked)
{
	struct srq_cli c[2];
	char *m;

	fx_form(f, c, 2, "secret\"project");
	fx_want(f, fx_kv_set(f, &c[0], "k", "v"), COHORT_OK);
	m = srv_metrics_text(f->core, f->now);
	ck_assert_ptr_nonnull(m);
	ck_assert_ptr_null(strstr(m, "secret"));
	ck_assert_ptr_nonnull(strstr(m, "\ncohort_jobs 1\n"));
	free(m);
	f->core->metrics_jobs = true;
	m = srv_metrics_text(f->core, f->now);
	ck_assert_ptr_nonnull(strstr(
	    m, "\ncohort_job_members_running{job=\"secret\\\"project\"} 2\n"));
	ck_assert_ptr_nonnull(
	    strstr(m, "\ncohort_job_kv_keys{job=\"secret\\\"project\"} 1\n"));
	free(m);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Finding 5: global limits, and abandoned jobs expire                    */
/* ------------------------------------------------------------------------ */

START_TEST(test_global_limits_named)
{
	struct srq_cli a[2], b[2], x;
	Cohort__Reply *r;

	f->core->lim.max_jobs = 2;
	f->core->lim.max_members = 4;
	f->core->lim.max_total_members = 5;
	f->core->lim.max_total_bytes = 90;
	f->core->lim.max_total_keys = 3;
	fx_form(f, a, 2, "a");
	/* a world over --max-members */
	srq_cli_init(&x, "big", 900, 90);
	r = fx_want(f, fx_join(f, &x, -1, 5, 1000), COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-members 4"));
	/* the rest of --max-total-members: 3 more, not 4 */
	srq_cli_init(&x, "big", 901, 91);
	r = fx_want(f, fx_join(f, &x, -1, 4, 1000), COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-total-members 5"));
	fx_form(f, b, 2, "b");
	/* a third job: --max-jobs */
	srq_cli_init(&x, "c", 902, 92);
	r = fx_want(f, fx_join(f, &x, -1, 1, 1000), COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-jobs 2"));
	ck_assert_ptr_nonnull(strstr(r->error, "job 'c'"));
	ck_assert_uint_eq(f->core->jobs.n, 2);
	/* bytes and keys over all jobs */
	fx_want(f,
	    fx_kv_set(f, &a[0], "k1", "0123456789012345678901234567890"),
	    COHORT_OK);
	fx_want(f,
	    fx_kv_set(f, &b[0], "k1", "0123456789012345678901234567890"),
	    COHORT_OK);
	r = fx_want(f,
	    fx_kv_set(f, &b[0], "k2", "0123456789012345678901234567890"),
	    COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-total-bytes 90"));
	fx_want(f, fx_kv_set(f, &b[0], "k2", "x"), COHORT_OK);
	r = fx_want(f, fx_kv_set(f, &a[0], "k3", "y"), COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-total-keys 3"));
	ck_assert_uint_eq(f->core->kv_keys, 3);
	ck_assert_uint_eq(f->core->kv_bytes, 2 * (2 + 31) + 3);
	ck_assert_uint_eq(f->core->m.limit_refusals, 5);
}
END_TEST

START_TEST(test_abandoned_job_expires_with_its_records)
{
	struct fx *f = fx_new_journal(0);
	struct srq_cli a[2], b[2], p[1];

	f->core->job_expiry_ms = 30000;
	ck_assert_cohort_ok(srv_job_add_preset(f->core, "preset", "tok"));
	hd_form(f, a, 2, "abandoned", 20, 100);
	hd_form(f, b, 2, "alive", 30, 200);
	hd_form(f, p, 1, "preset", 40, 300);
	fx_want(f, fx_kv_set(f, &a[0], "big", "a large value"), COHORT_OK);
	/* abandoned: its members' connections drop, no Leave */
	srv_core_pipe_closed(f->core, 20, f->now);
	srv_core_pipe_closed(f->core, 21, f->now);
	srv_core_pipe_closed(f->core, 40, f->now);
	ck_assert_ptr_nonnull(hd_job(f, "abandoned"));
	/* not before --job-expiry */
	fx_tick(f, 29000);
	ck_assert_ptr_nonnull(hd_job(f, "abandoned"));
	/* "alive" failed too (silent for 29 s) but its clients are
	 * connected and heartbeat: kept */
	for (int t = 0; t < 2; t++) {
		fx_heartbeat(f, &b[0], "", 0, "", false, 0);
		fx_heartbeat(f, &b[1], "", 0, "", false, 0);
		fx_tick(f, 1000);
	}
	ck_assert_ptr_null(hd_job(f, "abandoned"));
	ck_assert_ptr_nonnull(hd_job(f, "alive"));
	ck_assert_ptr_nonnull(hd_job(f, "preset"));
	ck_assert_uint_eq(f->core->m.jobs_expired, 1);
	ck_assert_uint_eq(f->core->kv_bytes, 0);
	/* its journal records went too */
	fx_restart(f);
	ck_assert_ptr_null(hd_job(f, "abandoned"));
	ck_assert_ptr_nonnull(hd_job(f, "alive"));
	fx_free_journal(f);
}
END_TEST

UNIT_FIXTURE_SUITE(srv_harden, "harden", 60, fx_setup, fx_teardown,
    test_loop_stall_gives_fresh_window,
    test_other_connection_gets_nothing_of_a_client,
    test_cached_reply_only_for_the_same_request,
    test_idle_connections_closed_busy_ones_kept, test_anonymous_status_refused,
    test_metrics_name_no_job_unless_asked, test_global_limits_named,
    test_abandoned_job_expires_with_its_records)
