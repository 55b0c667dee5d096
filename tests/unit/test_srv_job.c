/*
 * test_srv_job.c - cohortd's jobs without sockets: rendezvous, rank
 * assignment, duplicate ranks, join timeout, generations, failure
 * fan-out, heartbeats, leave, token isolation.
 */
#include <string.h>

#include "srv_fixture.h"
#include "unit_suite.h"
#include "token.h"

Suite *suite_srv_job(void);

START_TEST(test_rendezvous_assigns_ranks)
{
	struct srq_cli c[3];
	uintptr_t t[3];
	Cohort__Reply *r;

	srq_cli_init(&c[0], "j", 1, 1);
	srq_cli_init(&c[1], "j", 2, 2);
	srq_cli_init(&c[2], "j", 3, 3);
	c[1].host = "nodeB";
	t[0] = fx_join(f, &c[0], -1, 3, 60000);
	t[1] = fx_join(f, &c[1], 0, 3, 60000);
	ck_assert_ptr_null(fx_get(f, t[0]));
	ck_assert_ptr_null(fx_get(f, t[1]));
	t[2] = fx_join(f, &c[2], -1, 3, 60000);
	r = fx_want(f, t[1], COHORT_OK);
	ck_assert_int_eq(r->join->rank, 0);
	ck_assert_uint_eq(r->join->generation, 1);
	ck_assert_uint_eq(r->join->world_size, 3);
	ck_assert_uint_eq(r->join->n_hosts, 3);
	ck_assert_str_eq(r->join->hosts[0], "nodeB");
	/* rank -1 joins get the lowest free ranks in arrival order */
	ck_assert_int_eq(fx_want(f, t[0], COHORT_OK)->join->rank, 1);
	ck_assert_int_eq(fx_want(f, t[2], COHORT_OK)->join->rank, 2);
	ck_assert_uint_ne(r->join->job_id, 0);
}
END_TEST

/* Join.no_member_list: that member's reply leaves out every member's host
 * and local rank (O(1) instead of O(world)); the others still get them. */
START_TEST(test_join_no_member_list)
{
	struct srq_cli c[3];
	struct srq q;
	uintptr_t t[3];
	Cohort__Reply *r;

	for (int i = 0; i < 3; i++)
		srq_cli_init(&c[i], "j", 1 + (uint64_t)i, 1 + (uint32_t)i);
	c[2].host = "nodeC";
	for (int i = 0; i < 3; i++) {
		Cohort__Request *rq = srq_join(&q, &c[i], i, 3, -1, 60000);
		q.b.join.no_member_list = i != 1;
		t[i] = fx_send(f, &c[i], rq, NULL, 0);
	}
	for (int i = 0; i < 3; i++) {
		r = fx_want(f, t[i], COHORT_OK);
		ck_assert_int_eq(r->join->rank, i);
		ck_assert_uint_eq(r->join->world_size, 3);
		ck_assert_uint_eq(r->join->generation, 1);
		ck_assert_uint_ne(r->join->job_id, 0);
		ck_assert_uint_eq(r->join->n_hosts, i == 1 ? 3 : 0);
		ck_assert_uint_eq(r->join->n_local_ranks, i == 1 ? 3 : 0);
	}
	r = fx_want(f, t[1], COHORT_OK);
	ck_assert_str_eq(r->join->hosts[2], "nodeC");
}
END_TEST

START_TEST(test_duplicate_rank_names_holder)
{
	struct srq_cli a, b, c[2];
	uintptr_t t;
	Cohort__Reply *r;

	srq_cli_init(&a, "j", 1, 1);
	srq_cli_init(&b, "j", 2, 2);
	a.host = "alpha";
	a.pid = 4242;
	fx_join(f, &a, 1, 2, 60000);
	t = fx_join(f, &b, 1, 2, 60000);
	r = fx_want(f, t, COHORT_EEXIST);
	ck_assert_ptr_nonnull(strstr(r->error, "alpha:4242"));
	/* world size disagreement */
	t = fx_join(f, &b, 0, 3, 60000);
	fx_want(f, t, COHORT_EINVAL);
	fx_free(f);

	/* rank held by a running member */
	f = fx_new();
	fx_form(f, c, 2, "k");
	srq_cli_init(&b, "k", 77, 77);
	t = fx_join(f, &b, 1, 2, 60000);
	r = fx_want(f, t, COHORT_EEXIST);
	ck_assert_ptr_nonnull(strstr(r->error, "held by host:101"));
}
END_TEST

START_TEST(test_join_validation)
{
	struct srq_cli a;

	srq_cli_init(&a, "j", 1, 1);
	fx_want(f, fx_join(f, &a, -1, 0, 1000), COHORT_EINVAL);
	fx_want(f, fx_join(f, &a, -1, 65537, 1000), COHORT_EINVAL);
	fx_want(f, fx_join(f, &a, 4, 4, 1000), COHORT_EINVAL);
	fx_want(f, fx_join(f, &a, -2, 4, 1000), COHORT_EINVAL);
	/* the job created by those joins is gone again */
	ck_assert_uint_eq(f->core->jobs.n, 0);
}
END_TEST

START_TEST(test_join_timeout_names_missing)
{
	struct srq_cli a, b;
	uintptr_t ta, tb;
	Cohort__Reply *r;

	srq_cli_init(&a, "j", 1, 1);
	srq_cli_init(&b, "j", 2, 2);
	ta = fx_join(f, &a, 0, 4, 30000);
	tb = fx_join(f, &b, -1, 4, 60000);
	fx_tick(f, 29000);
	ck_assert_ptr_null(fx_get(f, ta));
	fx_tick(f, 1100);
	r = fx_want(f, ta, COHORT_ETIMEDOUT);
	/* rank 1 goes to the rank -1 join; 2 and 3 never came */
	ck_assert_uint_eq(r->n_missing_ranks, 2);
	ck_assert_int_eq(r->missing_ranks[0], 2);
	ck_assert_int_eq(r->missing_ranks[1], 3);
	ck_assert_ptr_nonnull(strstr(r->error, "timed out after 30.1 s"));
	ck_assert_ptr_nonnull(strstr(r->error, "missing ranks 2, 3"));
	ck_assert_ptr_null(fx_get(f, tb));
	/* timeout 0: answered at once */
	srq_cli_init(&a, "z", 5, 5);
	fx_want(f, fx_join(f, &a, 0, 2, 0), COHORT_ETIMEDOUT);
}
END_TEST

START_TEST(test_failure_fanout_connection_lost)
{
	struct srq_cli c[3];
	uintptr_t t0, t2, tw, tl;
	Cohort__Reply *r;

	fx_form(f, c, 3, "j");
	tw = fx_watch(f, &c[2], 60000);
	fx_barrier(f, &c[1], "epoch-2", 1, 60000);
	t0 = fx_barrier(f, &c[0], "epoch-2", 1, 60000);
	ck_assert_ptr_null(fx_get(f, t0));
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	r = fx_want(f, t0, COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 1);
	ck_assert_str_eq(r->failed_text, "connection lost");
	ck_assert_has(r->error,
	    "rank 1 (host:101) failed during barrier 'epoch-2' (#1)");
	fx_want(f, tw, COHORT_EPEERLOST);
	/* later collectives of that generation: the same answer */
	t2 = fx_barrier(f, &c[2], "epoch-2", 1, 60000);
	r = fx_want(f, t2, COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 1);
	/* heartbeat: unhealthy with the failure */
	tl = fx_heartbeat(f, &c[2], "", 0, "", false, 0);
	r = fx_want(f, tl, COHORT_OK);
	ck_assert(!r->heartbeat->healthy);
	ck_assert_int_eq(r->failed_rank, 1);
	/* KV keeps working */
	fx_want(f, fx_kv_set(f, &c[0], "k", "v"), COHORT_OK);
}
END_TEST

START_TEST(test_report_failure_text)
{
	struct srq_cli c[2];
	const char *text = "Traceback: ValueError: boom\n  at line 3";
	uintptr_t t0;
	Cohort__Reply *r;

	fx_form(f, c, 2, "j");
	t0 = fx_barrier(f, &c[0], "x", 1, 60000);
	fx_want(f, fx_report(f, &c[1], text, NULL), COHORT_OK);
	r = fx_want(f, t0, COHORT_EPEERLOST);
	ck_assert_str_eq(r->failed_text, text);
	ck_assert_ptr_nonnull(strstr(r->error, "ValueError: boom"));
}
END_TEST

/* Regression: the operation a failure report named came from the last
 * heartbeat ("allreduce (#99)" for a rank that died after #151). A
 * report carries what the rank does now; a lost connection only has the
 * last heartbeat, and the text says how old that is. */
START_TEST(test_failure_names_current_or_dated_operation)
{
	struct srq_cli c[2];
	Cohort__Heartbeat doing = COHORT__HEARTBEAT__INIT;
	uintptr_t tw;
	Cohort__Reply *r;

	fx_form(f, c, 2, "rep");
	fx_want(f, fx_heartbeat(f, &c[1], "allreduce", 99, "", false, 0),
	    COHORT_OK);
	tw = fx_watch(f, &c[0], 60000);
	fx_tick(f, 1200);
	doing.last_op = "allreduce";
	doing.last_op_seq = 151;
	doing.last_group = "";
	doing.in_op = true;
	fx_want(f, fx_report(f, &c[1], "ValueError: boom", &doing), COHORT_OK);
	r = fx_want(f, tw, COHORT_EPEERLOST);
	ck_assert_has(
	    r->error, "failed during allreduce (#151): ValueError: boom");
	ck_assert_msg(strstr(r->error, "#99") == NULL, "%s", r->error);

	fx_free(f);
	/* the rank's connection drops 2.5 s after its last heartbeat */
	f = fx_new();
	fx_form(f, c, 2, "lost");
	fx_want(f, fx_heartbeat(f, &c[1], "allreduce", 99, "", true, 10),
	    COHORT_OK);
	tw = fx_watch(f, &c[0], 60000);
	fx_tick(f, 2500);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	r = fx_want(f, tw, COHORT_EPEERLOST);
	ck_assert_has(r->error,
	    "(its last heartbeat, 2.5 s before: in allreduce #99): connection "
	    "lost");
}
END_TEST

START_TEST(test_heartbeat_silence)
{
	struct srq_cli c[2];
	uintptr_t t0;
	Cohort__Reply *r;

	fx_form(f, c, 2, "j");
	t0 = fx_barrier(f, &c[0], "x", 1, 600000);
	for (int i = 0; i < 8; i++) {
		fx_tick(f, 1000);
		fx_want(f, fx_heartbeat(f, &c[0], "train", 0, "", false, 0),
		    COHORT_OK);
	}
	r = fx_want(f, t0, COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 1);
	ck_assert_ptr_nonnull(strstr(r->failed_text, "no heartbeat for "));
}
END_TEST

START_TEST(test_generation_and_stale)
{
	struct srq_cli c[2], n[2];
	uintptr_t t[2], ts;

	fx_form(f, c, 2, "j");
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	/* new processes restart the group */
	srq_cli_init(&n[0], "j", 500, 50);
	srq_cli_init(&n[1], "j", 501, 51);
	t[0] = fx_join(f, &n[0], 0, 2, 60000);
	t[1] = fx_join(f, &n[1], 1, 2, 60000);
	fx_joined(f, &n[0], t[0]);
	fx_joined(f, &n[1], t[1]);
	ck_assert_uint_eq(n[0].gen, 2);
	ts = fx_barrier(f, &c[0], "x", 1, 1000);
	fx_want(f, ts, COHORT_ESTALE);
	ts = fx_kv_set(f, &c[0], "k", "v");
	fx_want(f, ts, COHORT_ESTALE);
	t[0] = fx_barrier(f, &n[0], "x", 1, 1000);
	ck_assert_ptr_null(fx_get(f, t[0]));
	fx_barrier(f, &n[1], "x", 1, 1000);
	fx_want(f, t[0], COHORT_OK);
}
END_TEST

START_TEST(test_leave_fails_waiters_and_removes_job)
{
	struct srq_cli c[3];
	uintptr_t t0;
	Cohort__Reply *r;

	fx_form(f, c, 3, "j");
	t0 = fx_barrier(f, &c[0], "x", 1, 60000);
	fx_want(f, fx_leave(f, &c[2]), COHORT_OK);
	r = fx_want(f, t0, COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 2);
	ck_assert_ptr_nonnull(strstr(r->error, "rank 2 (host:102) left"));
	/* a later collective that waits for rank 2 fails at once */
	fx_want(f, fx_barrier(f, &c[1], "y", 2, 60000), COHORT_EPEERLOST);
	fx_want(f, fx_leave(f, &c[0]), COHORT_OK);
	fx_want(f, fx_leave(f, &c[1]), COHORT_OK);
	ck_assert_uint_eq(f->core->jobs.n, 0);
	fx_want(f, fx_kv_set(f, &c[0], "k", "v"), COHORT_EAUTH);
}
END_TEST

/* A join that disagrees with the job names both sides: what the job is
 * (world size, since which generation) and what this worker says. */
START_TEST(test_join_mismatch_names_both_sides)
{
	struct srq_cli c[4], x, p[2];
	uintptr_t t;
	Cohort__Reply *r;

	fx_form(f, c, 4, "x");
	/* a running job of 4, a worker of a launch of 2 */
	srq_cli_init(&x, "x", 77, 77);
	x.host = "other";
	r = fx_want(f, fx_join(f, &x, 1, 2, 1000), COHORT_EINVAL);
	ck_assert_has(r->error,
	    "job 'x' has world size 4 (since generation 1); this worker "
	    "(other:77) says 2");
	/* the same world size: the rank is held, by whom */
	r = fx_want(f, fx_join(f, &x, 1, 4, 1000), COHORT_EEXIST);
	ck_assert_has(r->error, "rank 1 of job 'x' is held by host:101");
	ck_assert_ptr_nonnull(strstr(r->error, "other:77"));
	/* rank -1: not one of the running generation's members */
	r = fx_want(f, fx_join(f, &x, -1, 4, 1000), COHORT_ESTATE);
	ck_assert_has(r->error,
	    "job 'x' is running generation 1 with 4 ranks; this worker "
	    "(other:77) is not one of its members");
	/* a pending rendezvous of 2 and a worker of 3 */
	srq_cli_init(&p[0], "y", 200, 200);
	srq_cli_init(&p[1], "y", 201, 201);
	t = fx_join(f, &p[0], 0, 2, 60000);
	r = fx_want(f, fx_join(f, &p[1], 1, 3, 1000), COHORT_EINVAL);
	ck_assert_has(r->error,
	    "job 'y' has world size 2 (rendezvous of generation 1, 1 of 2 "
	    "joined); this worker (host:201) says 3");
	ck_assert_ptr_null(fx_get(f, t));
	fx_joined(f, &p[1], fx_join(f, &p[1], 1, 2, 1000));
	fx_joined(f, &p[0], t);
	/* the wrong token: the job and its token are named, not shown */
	x.job = "x";
	x.token = "not-tok";
	r = fx_want(f, fx_join(f, &x, 0, 4, 1000), COHORT_EAUTH);
	ck_assert_has(r->error, "wrong token for job 'x'");
	ck_assert_ptr_null(strstr(r->error, "not-tok"));
	ck_assert_ptr_null(strstr(r->error, "'tok'"));
}
END_TEST

/* --require-token: a join creates a job only with the token minted from
 * the admin secret for its name; a preset job keeps its own token; the
 * refusal reads the same whether the job exists or not. */
START_TEST(test_require_token)
{
	struct srq_cli a, b, c;
	char tok[COHORT__MINTED_LEN + 1], other[COHORT__MINTED_LEN + 1];
	Cohort__Reply *r, *r2;

	f->core->admin_token = strdup("adm1n-secret");
	f->core->require_token = true;
	ck_assert_cohort_ok(srv_job_add_preset(f->core, "preset", "p-tok"));
	cohort__token_mint("adm1n-secret", "train-7", tok);
	cohort__token_mint("adm1n-secret", "train-8", other);
	/* no token, a made-up one, another job's minted one: refused,
	 * and no job is created */
	srq_cli_init(&a, "train-7", 1, 1);
	a.token = "";
	r = fx_want(f, fx_join(f, &a, 0, 1, 1000), COHORT_EAUTH);
	ck_assert_ptr_nonnull(
	    strstr(r->error, "wrong token for job 'train-7'"));
	ck_assert_ptr_nonnull(strstr(r->error, "cohort token train-7"));
	a.token = "tok";
	fx_want(f, fx_join(f, &a, 0, 1, 1000), COHORT_EAUTH);
	a.token = other;
	fx_want(f, fx_join(f, &a, 0, 1, 1000), COHORT_EAUTH);
	ck_assert_uint_eq(f->core->jobs.n, 1);
	/* the minted token creates it */
	a.token = tok;
	fx_joined(f, &a, fx_join(f, &a, -1, 1, 60000));
	srq_cli_init(&b, "train-7", 2, 2);
	b.token = tok;
	fx_want(f, fx_kv_set(f, &b, "k", "v"), COHORT_OK);
	ck_assert_uint_eq(f->core->jobs.n, 2);
	/* the preset job is joined with its own token, not a minted one */
	srq_cli_init(&c, "preset", 3, 3);
	c.token = "p-tok";
	fx_want(f, fx_kv_set(f, &c, "k", "v"), COHORT_OK);
	cohort__token_mint("adm1n-secret", "preset", other);
	c.token = other;
	r = fx_want(f, fx_join(f, &c, 0, 1, 1000), COHORT_EAUTH);
	/* an existing job and a missing one read alike */
	c.job = "missing";
	r2 = fx_want(f, fx_join(f, &c, 0, 1, 1000), COHORT_EAUTH);
	{
		char want[512];
		snprintf(want, sizeof(want), "%s", r->error);
		ck_assert_ptr_nonnull(strstr(want, "'preset'"));
		ck_assert_ptr_nonnull(strstr(r2->error, "'missing'"));
		ck_assert_uint_eq(strlen(want) - 2 * strlen("preset"),
		    strlen(r2->error) - 2 * strlen("missing"));
	}
}
END_TEST

START_TEST(test_token_mint)
{
	char t[COHORT__MINTED_LEN + 1];

	/* printf %s train-7 | openssl dgst -sha256 -hmac adm1n-secret */
	cohort__token_mint("adm1n-secret", "train-7", t);
	ck_assert_str_eq(t,
	    "acab3dd40e3fd3859ad28622bcdc6440bddc12cb22c888748a66ee74852cbb6"
	    "d");
	ck_assert(cohort__token_is_minted("adm1n-secret", "train-7", t));
	ck_assert(!cohort__token_is_minted("adm1n-secret", "train-8", t));
	ck_assert(!cohort__token_is_minted("other", "train-7", t));
	ck_assert(!cohort__token_is_minted("", "train-7", t));
	ck_assert(!cohort__token_is_minted(NULL, "train-7", t));
	t[63] = t[63] == '0' ? '1' : '0';
	ck_assert(!cohort__token_is_minted("adm1n-secret", "train-7", t));
	ck_assert(!cohort__token_is_minted("adm1n-secret", "train-7", "ab"));
}
END_TEST

START_TEST(test_secret_read)
{
	char path[256], out[16];

	ck_assert(tmpfile_make(
	    path, sizeof(path), "cohort-test-secret", "abc \r\n\n"));
	ck_assert_cohort_ok(cohort__secret_read("t", path, out, sizeof(out)));
	ck_assert_str_eq(out, "abc");
	/* 17 bytes: too long */
	ck_assert(tmpfile_write(path, "0123456789abcdef0\n"));
	ck_assert_cohort_err(
	    cohort__secret_read("t", path, out, sizeof(out)), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "longer than 15"));
	/* 15 bytes and newlines: fits */
	ck_assert(tmpfile_write(path, "0123456789abcde\n\n"));
	ck_assert_cohort_ok(cohort__secret_read("t", path, out, sizeof(out)));
	ck_assert_str_eq(out, "0123456789abcde");
	ck_assert(tmpfile_write(path, "\n"));
	ck_assert_cohort_err(
	    cohort__secret_read("t", path, out, sizeof(out)), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "empty"));
	unlink(path);
	ck_assert_cohort_err(
	    cohort__secret_read("--x", path, out, sizeof(out)), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "--x"));
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), path));
}
END_TEST

START_TEST(test_token_isolation)
{
	struct srq_cli a[1], b[1], evil;
	uintptr_t t;
	Cohort__Reply *r;

	fx_form(f, a, 1, "A");
	fx_form(f, b, 1, "B");
	fx_want(f, fx_kv_set(f, &a[0], "secret", "a-data"), COHORT_OK);
	/* same key name in B is B's own */
	t = fx_kv_get(f, &b[0], "secret", false, 0);
	ck_assert(!fx_want(f, t, COHORT_OK)->kv_get->found);
	/* wrong token: EAUTH, nothing else */
	srq_cli_init(&evil, "A", 100, 99);
	evil.token = "wrong";
	t = fx_kv_get(f, &evil, "secret", false, 0);
	r = fx_want(f, t, COHORT_EAUTH);
	ck_assert_uint_eq(r->generation, 0);
	ck_assert_uint_eq(r->payload_len, 0);
	ck_assert_int_eq(r->body_case, COHORT__REPLY__BODY__NOT_SET);
	/* unknown job: the same answer */
	evil.job = "nope";
	r = fx_want(f, fx_kv_get(f, &evil, "secret", false, 0), COHORT_EAUTH);
	ck_assert_str_eq(
	    r->error, "wrong token for job 'nope', or no such job");
	/* the text for a job that exists is the same: it tells nothing */
	evil.job = "A";
	r = fx_want(f, fx_kv_get(f, &evil, "secret", false, 0), COHORT_EAUTH);
	ck_assert_str_eq(r->error, "wrong token for job 'A', or no such job");
	/* a join with the wrong token cannot take over job A */
	evil.job = "A";
	fx_want(f, fx_join(f, &evil, 0, 1, 0), COHORT_EAUTH);
	ck_assert(fx_payload_is(
	    f, fx_kv_get(f, &a[0], "secret", false, 0), "a-data"));
}
END_TEST

START_TEST(test_status_query)
{
	struct srq_cli c[3];
	Cohort__Reply *r;
	Cohort__JobStatus *js;
	bool found = false;

	fx_form(f, c, 3, "j");
	fx_barrier(f, &c[0], "b", 1, 60000);
	fx_tick(f, 2000);
	r = fx_status(f, &c[0], "", COHORT_OK);
	ck_assert_uint_eq(r->status_query->n_jobs, 1);
	js = r->status_query->jobs[0];
	ck_assert_str_eq(js->state, "running");
	ck_assert_uint_eq(js->n_members, 3);
	for (size_t i = 0; i < js->n_pending; i++) {
		if (strcmp(js->pending[i]->kind, "barrier") != 0)
			continue;
		found = true;
		ck_assert_uint_eq(js->pending[i]->n_arrived, 1);
		ck_assert_uint_eq(js->pending[i]->n_missing, 2);
		ck_assert_uint_ge(js->pending[i]->waiting_ms, 2000);
	}
	ck_assert(found);
}
END_TEST

/* Regression: a job whose members had all left was shown as running,
 * its members "in allreduce ... for N s" from their last heartbeat. */
START_TEST(test_status_finished_job)
{
	struct srq_cli c[2];
	Cohort__JobStatus *js;
	Cohort__Reply *r;

	ck_assert_cohort_ok(
	    srv_job_add_preset(f->core, "kept", "tok")); /* kept */
	fx_form(f, c, 2, "kept");
	for (int i = 0; i < 2; i++)
		fx_want(f, fx_heartbeat(f, &c[i], "allreduce", 7, "", true, 5),
		    COHORT_OK);
	for (int i = 0; i < 2; i++)
		fx_want(f, fx_leave(f, &c[i]), COHORT_OK);
	fx_tick(f, 3000);
	r = fx_status(f, &c[0], "kept", COHORT_OK);
	ck_assert_uint_eq(r->status_query->n_jobs, 1);
	js = r->status_query->jobs[0];
	ck_assert_str_eq(js->state, "finished");
	for (size_t i = 0; i < js->n_members; i++) {
		ck_assert_str_eq(js->members[i]->state, "left");
		ck_assert(!js->members[i]->in_op);
	}
}
END_TEST

START_TEST(test_watch_timeout_ok)
{
	struct srq_cli c[1];
	uintptr_t t;
	Cohort__Reply *r;

	fx_form(f, c, 1, "j");
	t = fx_watch(f, &c[0], 500);
	ck_assert_ptr_null(fx_get(f, t));
	fx_tick(f, 600);
	r = fx_want(f, t, COHORT_OK);
	ck_assert_int_eq(r->failed_rank, -1);
}
END_TEST

UNIT_FIXTURE_SUITE(srv_job, "job", 30, fx_setup, fx_teardown,
    test_rendezvous_assigns_ranks, test_join_no_member_list,
    test_duplicate_rank_names_holder, test_join_validation,
    test_join_timeout_names_missing, test_failure_fanout_connection_lost,
    test_report_failure_text, test_failure_names_current_or_dated_operation,
    test_heartbeat_silence, test_generation_and_stale,
    test_leave_fails_waiters_and_removes_job, test_token_isolation,
    test_join_mismatch_names_both_sides, test_require_token, test_token_mint,
    test_secret_read, test_status_query, test_status_finished_job,
    test_watch_timeout_ok)
