/*
 * test_srv_elastic.c - cohortd's elastic membership without sockets
 * (proto/README.md section 8), step by step: the range at rendezvous, the
 * shrink on every kind of failure, older generations, Reform, joiners and
 * the step boundary, races (two kills at once, a kill while others
 * reform, a joiner lost after its admission), the stop below the
 * minimum, and the journal: a restart in the middle of a change, a
 * snapshot.
 */
#include <stdlib.h>
#include <string.h>

#include "srv_fixture.h"
#include "unit_suite.h"
#include "observe/status.h"
#include "state/elastic.h"
#include "state/groups.h"

Suite *suite_srv_elastic(void);

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

static void
hb(struct srq_cli *c)
{
	fx_want(f, fx_heartbeat(f, c, "", 0, "", false, 0), COHORT_OK);
}

/* Time passes by step ms, n times; the clients in live heartbeat before
 * each step (nlive of them). */
static void
pass(struct srq_cli *live, int nlive, cohort__time step, int n)
{
	for (int k = 0; k < n; k++) {
		for (int i = 0; i < nlive; i++)
			hb(&live[i]);
		fx_tick(f, step);
	}
}

static Cohort__Reply *
status_of(struct srq_cli *c)
{
	Cohort__Reply *r = fx_status(f, c, c->job, COHORT_OK);

	ck_assert_uint_eq(r->status_query->n_jobs, 1);
	return (r);
}

static struct srv_job *
job_of(const char *name)
{
	struct srv_job *job = srv_job_find(f->core, name);

	ck_assert_ptr_nonnull(job);
	return (job);
}

static int
cmp_str(const void *a, const void *b)
{
	return (strcmp(*(const char *const *)a, *(const char *const *)b));
}

/* The job as a text to compare: generation, range, state, members
 * (client, rank, host, rank before, holds the state, member state) and
 * groups (sorted by name). */
static void
el_state(const char *name, char *buf, size_t len)
{
	struct srv_job *job = job_of(name);
	const char *names[64];
	size_t nn = 0, off = 0, i;
	struct srv_hnode *n;

	cohort__appendf(buf, len, &off, "gen %llu world %u range %u..%u %s;",
	    (unsigned long long)job->generation, job->world, job->min_world,
	    job->max_world, srv_job_state_name(job));
	for (uint32_t r = 0; r < job->world; r++) {
		const struct srv_member *m = &job->members[r];
		cohort__appendf(buf, len, &off, " %llu@%d %s prev %d %s %s;",
		    (unsigned long long)(m->client ? m->client->id : 0),
		    m->rank, m->host, m->prev_rank,
		    m->has_state ? "holds" : "empty",
		    srv_member_state_name(m->state));
	}
	for (n = srv_map_next(&job->groups, &i, NULL); n != NULL && nn < 64;
	     n = srv_map_next(&job->groups, &i, n))
		names[nn++] = SRV_CONTAINER(n, struct srv_group, hn)->name;
	qsort(names, nn, sizeof(names[0]), cmp_str);
	for (size_t k = 0; k < nn; k++) {
		struct srv_group *g = srv_group_find(job, names[k]);
		cohort__appendf(buf, len, &off, " group '%s' [", g->name);
		for (uint32_t x = 0; x < g->n; x++)
			cohort__appendf(
			    buf, len, &off, "%s%d", x ? "," : "", g->ranks[x]);
		cohort__appendf(buf, len, &off, "];");
	}
}

static void
want_ranks(const int32_t *got, size_t n, const int32_t *want, size_t nw)
{
	ck_assert_uint_eq(n, nw);
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(got[i] == want[i], "index %zu: %d, expected %d",
		    i, got[i], want[i]);
}

#define WANT_RANKS(got, n, ...)                                               \
	do {                                                                  \
		const int32_t w_[] = { __VA_ARGS__ };                         \
		want_ranks(got, n, w_, sizeof(w_) / sizeof(w_[0]));           \
	} while (0)

static uintptr_t
group_of(struct srq_cli *c, const char *name, int32_t *ranks, size_t n)
{
	return (fx_group(f, c, name, ranks, n, 60000));
}

/* ------------------------------------------------------------------------ */
/* 1. The range at rendezvous                                               */
/* ------------------------------------------------------------------------ */

START_TEST(test_el_rendezvous_full)
{
	struct srq_cli c[4];
	uintptr_t t[4];
	Cohort__Reply *r;

	for (int i = 0; i < 4; i++) {
		srq_cli_init(&c[i], "e", 100 + (uint64_t)i, 10 + (uint32_t)i);
		t[i] = fx_join_el(f, &c[i], i, 3, 4, 60000);
	}
	r = fx_want(f, t[2], COHORT_OK);
	ck_assert_int_eq(r->join->rank, 2);
	ck_assert_uint_eq(r->join->world_size, 4);
	ck_assert_uint_eq(r->join->generation, 1);
	ck_assert_uint_eq(r->join->min_world, 3);
	ck_assert_uint_eq(r->join->max_world, 4);
	ck_assert(!r->join->joined_running);
	r = status_of(&c[0]);
	ck_assert_uint_eq(r->status_query->jobs[0]->min_world, 3);
	ck_assert_uint_eq(r->status_query->jobs[0]->max_world, 4);
	ck_assert_uint_eq(r->status_query->jobs[0]->world_size, 4);
}
END_TEST

/* The first rendezvous completes with at least min_world once none came
 * for --rdzv-last-call; ranks are dense in the order asked for, then of
 * arrival. */
START_TEST(test_el_rendezvous_last_call)
{
	struct srq_cli a, b, c, d;
	uintptr_t ta, tb, tc, td;

	f->core->rdzv_last_call_ms = 2000;
	srq_cli_init(&a, "e", 1, 1);
	srq_cli_init(&b, "e", 2, 2);
	srq_cli_init(&c, "e", 3, 3);
	srq_cli_init(&d, "e", 4, 4);
	ta = fx_join_el(f, &a, 3, 3, 5, 60000);
	tb = fx_join_el(f, &b, 0, 3, 5, 60000);
	tc = fx_join_el(f, &c, -1, 3, 5, 60000);
	fx_tick(f, 1500);
	ck_assert_ptr_null(fx_get(f, ta));
	td = fx_join_el(f, &d, 2, 3, 5, 60000);
	fx_tick(f, 1500); /* 1.5 s since d: not yet */
	ck_assert_ptr_null(fx_get(f, ta));
	fx_tick(f, 600);
	ck_assert_int_eq(fx_want(f, tb, COHORT_OK)->join->rank, 0);
	ck_assert_int_eq(fx_want(f, td, COHORT_OK)->join->rank, 1);
	ck_assert_int_eq(fx_want(f, ta, COHORT_OK)->join->rank, 2);
	ck_assert_int_eq(fx_want(f, tc, COHORT_OK)->join->rank, 3);
	ck_assert_uint_eq(fx_get(f, tc)->rep->join->world_size, 4);
	ck_assert_uint_eq(fx_get(f, tc)->rep->join->max_world, 5);
	ck_assert_uint_eq(job_of("e")->generation, 1);
}
END_TEST

START_TEST(test_el_rendezvous_below_min_times_out)
{
	struct srq_cli a, b;
	uintptr_t ta;
	Cohort__Reply *r;

	f->core->rdzv_last_call_ms = 1000;
	srq_cli_init(&a, "e", 1, 1);
	srq_cli_init(&b, "e", 2, 2);
	ta = fx_join_el(f, &a, 0, 3, 4, 8000);
	fx_join_el(f, &b, 1, 3, 4, 60000);
	fx_tick(f, 5000);
	ck_assert_ptr_null(fx_get(f, ta));
	fx_tick(f, 3100);
	r = fx_want(f, ta, COHORT_ETIMEDOUT);
	ck_assert_has(r->error, "2 of 3..4 (at least 3 needed) ranks");
}
END_TEST

START_TEST(test_el_range_must_agree)
{
	struct srq_cli a, b, c[4], x;
	Cohort__Reply *r;

	srq_cli_init(&a, "e", 1, 1);
	srq_cli_init(&b, "e", 2, 2);
	fx_join_el(f, &a, 0, 3, 4, 60000);
	r = fx_want(f, fx_join_el(f, &b, 1, 2, 4, 1000), COHORT_EINVAL);
	ck_assert_msg(strstr(r->error, "has 3..4 ranks") != NULL
	        && strstr(r->error, "says 2..4") != NULL,
	    "%s", r->error);
	/* a plain join into an elastic rendezvous */
	r = fx_want(f, fx_join(f, &b, 1, 4, 1000), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(r->error, "says 4"));
	r = fx_want(f, fx_join_el(f, &b, 1, 5, 4, 1000), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(r->error, "min_world 5 is more than"));
	/* a joiner of a running elastic job says the same range */
	fx_form_el(f, c, 4, "r", 3, 4);
	srq_cli_init(&x, "r", 77, 77);
	r = fx_want(f, fx_join_el(f, &x, -1, 2, 4, 1000), COHORT_EINVAL);
	ck_assert_has(r->error, "is elastic with 3..4 ranks");
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 2-4. Shrink, older generations, Reform                                   */
/* ------------------------------------------------------------------------ */

START_TEST(test_el_shrink_connection_lost)
{
	struct srq_cli c[4];
	uintptr_t tw, t[3];
	Cohort__Reply *r;
	Cohort__JoinReply *jr;

	fx_form_el(f, c, 4, "e", 3, 4);
	tw = fx_watch(f, &c[0], 60000);
	for (int i = 0; i < 3; i++)
		t[i] = fx_barrier(f, &c[i], "step", 1, 60000);
	srv_core_pipe_closed(f->core, c[3].pipe, f->now);
	for (int i = 0; i < 3; i++) {
		r = fx_want(f, t[i], COHORT_EMEMBERSHIP);
		ck_assert_uint_eq(r->generation, 2);
		ck_assert_int_eq(r->failed_rank, 3);
		ck_assert_str_eq(r->failed_text, "connection lost");
		ck_assert_ptr_nonnull(r->failure);
		ck_assert_int_eq(
		    r->failure->kind, COHORT__FAILURE_KIND__FAILURE_PROCESS);
		ck_assert_int_eq(r->failure->rank, 3);
		ck_assert_msg(
		    strstr(r->error, "rank 3 (host:103) failed") != NULL
		        && strstr(r->error,
		               "goes on without it at generation 2 with 3 "
		               "ranks")
		            != NULL,
		    "%s", r->error);
	}
	r = fx_want(f, tw, COHORT_EMEMBERSHIP);
	ck_assert_uint_eq(r->generation, 2);
	ck_assert_int_eq(r->failed_rank, 3);
	/* heartbeats and KV of the old generation are served */
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert(r->heartbeat->healthy);
	ck_assert_uint_eq(r->heartbeat->generation, 2);
	ck_assert_uint_eq(r->heartbeat->joiners_waiting, 0);
	fx_want(f, fx_kv_set(f, &c[1], "k", "v"), COHORT_OK);
	fx_want(f, fx_kv_get(f, &c[2], "k", false, 0), COHORT_OK);
	/* a collective of the old one: EMEMBERSHIP, not ESTALE */
	r = fx_want(
	    f, fx_barrier(f, &c[2], "step", 2, 60000), COHORT_EMEMBERSHIP);
	ck_assert_uint_eq(r->generation, 2);
	ck_assert_int_eq(r->failed_rank, 3);
	/* Reform */
	jr = fx_reformed(f, &c[1], fx_reform(f, &c[1]));
	ck_assert_int_eq(jr->rank, 1);
	ck_assert_uint_eq(jr->world_size, 3);
	ck_assert_uint_eq(jr->generation, 2);
	ck_assert_uint_eq(jr->prev_generation, 1);
	ck_assert_uint_eq(jr->min_world, 3);
	ck_assert_uint_eq(jr->max_world, 4);
	ck_assert_uint_eq(jr->n_hosts, 3);
	ck_assert(!jr->joined_running);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 1, 2);
	fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	fx_reformed(f, &c[2], fx_reform(f, &c[2]));
	/* the new generation's op numbering starts at 1 */
	for (int i = 0; i < 3; i++)
		t[i] = fx_barrier(f, &c[i], "step", 1, 60000);
	for (int i = 0; i < 3; i++)
		fx_want(f, t[i], COHORT_OK);
	r = status_of(&c[0]);
	ck_assert_uint_eq(r->status_query->jobs[0]->generation, 2);
	ck_assert_uint_eq(r->status_query->jobs[0]->world_size, 3);
	ck_assert_str_eq(r->status_query->jobs[0]->state, "running");
	ck_assert_uint_eq(f->core->m.shrinks, 1);
}
END_TEST

START_TEST(test_el_shrink_renumbers_densely)
{
	struct srq_cli c[4];
	const char *hosts[4] = { "h0", "h1", "h2", "h3" };
	uintptr_t t[4];
	Cohort__JoinReply *jr;

	for (int i = 0; i < 4; i++) {
		srq_cli_init(&c[i], "e", 100 + (uint64_t)i, 10 + (uint32_t)i);
		c[i].host = hosts[i];
		t[i] = fx_join_el(f, &c[i], i, 2, 4, 60000);
	}
	for (int i = 0; i < 4; i++)
		fx_joined(f, &c[i], t[i]);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	jr = fx_reformed(f, &c[3], fx_reform(f, &c[3]));
	ck_assert_int_eq(jr->rank, 2);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 2, 3);
	ck_assert_str_eq(jr->hosts[0], "h0");
	ck_assert_str_eq(jr->hosts[1], "h2");
	ck_assert_str_eq(jr->hosts[2], "h3");
	ck_assert_int_eq(fx_reformed(f, &c[2], fx_reform(f, &c[2]))->rank, 1);
	ck_assert_int_eq(fx_reformed(f, &c[0], fx_reform(f, &c[0]))->rank, 0);
}
END_TEST

START_TEST(test_el_shrink_heartbeat_silence)
{
	struct srq_cli c[3];
	uintptr_t t;
	Cohort__Reply *r;

	fx_form_el(f, c, 3, "e", 2, 3);
	t = fx_boundary(f, &c[0], 1, true, 60000);
	pass(c, 2, 1000, 6);
	r = fx_want(f, t, COHORT_EMEMBERSHIP);
	ck_assert_int_eq(r->failed_rank, 2);
	ck_assert_int_eq(
	    r->failure->kind, COHORT__FAILURE_KIND__FAILURE_HEARTBEAT);
	ck_assert_ptr_nonnull(strstr(r->failed_text, "no heartbeat for"));
	ck_assert_uint_eq(job_of("e")->world, 2);
}
END_TEST

START_TEST(test_el_shrink_report_failure)
{
	struct srq_cli c[4];
	const char *text = "Traceback: ValueError: boom\n  at line 3";
	uintptr_t t;
	Cohort__Reply *r;

	fx_form_el(f, c, 4, "e", 2, 4);
	t = fx_barrier(f, &c[0], "x", 1, 60000);
	fx_want(f, fx_report(f, &c[2], text, NULL), COHORT_OK);
	r = fx_want(f, t, COHORT_EMEMBERSHIP);
	ck_assert_int_eq(r->failed_rank, 2);
	ck_assert_str_eq(r->failed_text, text);
	ck_assert_int_eq(
	    r->failure->kind, COHORT__FAILURE_KIND__FAILURE_REPORTED);
	/* a member still in generation 1 reports its own failure: served */
	fx_want(f, fx_report(f, &c[1], "second", NULL), COHORT_OK);
	ck_assert_uint_eq(job_of("e")->generation, 3);
	ck_assert_uint_eq(job_of("e")->world, 2);
}
END_TEST

/* Below MIN the job stops, and the failure's text says so. */
START_TEST(test_el_below_min_stops)
{
	struct srq_cli c[3];
	uintptr_t t;
	Cohort__Reply *r;

	fx_form_el(f, c, 3, "e", 3, 4);
	t = fx_barrier(f, &c[0], "x", 1, 60000);
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	r = fx_want(f, t, COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 2);
	ck_assert_str_eq(r->failed_text,
	    "connection lost; 2 ranks remain, below the minimum of 3");
	ck_assert_has(
	    r->error, "job 'e' stops: 2 ranks remain, below the minimum of 3");
	ck_assert_str_eq(r->failure->text, r->failed_text);
	r = fx_want(f, fx_reform(f, &c[1]), COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 2);
	ck_assert_str_eq(
	    status_of(&c[0])->status_query->jobs[0]->state, "failed");
	ck_assert_uint_eq(f->core->m.shrinks, 0);
}
END_TEST

START_TEST(test_el_subgroups_carried_over)
{
	struct srq_cli c[4];
	int32_t ra[] = { 1, 2, 3 }, rb[] = { 1 }, rc[] = { 3, 0 };
	int32_t rs[] = { 0, 1 }, na[] = { 1, 2 };
	uintptr_t t[4];
	struct srv_group *g;
	Cohort__Reply *r;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	fx_form_el(f, c, 4, "e", 2, 4);
	for (int i = 1; i < 4; i++)
		t[i] = group_of(&c[i], "a", ra, 3);
	for (int i = 1; i < 4; i++)
		fx_want(f, t[i], COHORT_OK);
	fx_want(f, group_of(&c[1], "b", rb, 1), COHORT_OK);
	t[0] = group_of(&c[3], "c", rc, 2);
	fx_want(f, group_of(&c[0], "c", rc, 2), COHORT_OK);
	fx_want(f, t[0], COHORT_OK);
	t[0] = group_of(&c[0], "cohort.state.1.1", rs, 2);
	fx_want(f, group_of(&c[1], "cohort.state.1.1", rs, 2), COHORT_OK);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	g = srv_group_find(job_of("e"), "a");
	ck_assert_ptr_nonnull(g);
	WANT_RANKS(g->ranks, g->n, 1, 2);
	g = srv_group_find(job_of("e"), "c");
	WANT_RANKS(g->ranks, g->n, 2, 0);
	ck_assert_ptr_null(srv_group_find(job_of("e"), "b"));
	ck_assert_ptr_null(srv_group_find(job_of("e"), "cohort.state.1.1"));
	g = srv_group_find(job_of("e"), "");
	WANT_RANKS(g->ranks, g->n, 0, 1, 2);
	for (int i = 0; i < 4; i++)
		if (i != 1)
			fx_reformed(f, &c[i], fx_reform(f, &c[i]));
	/* the same group id, its survivors: asking for it again is OK */
	r = fx_want(f, group_of(&c[3], "a", na, 2), COHORT_OK);
	ck_assert_int_eq(r->group_create->group_rank, 1);
	ck_assert_uint_eq(r->group_create->group_size, 2);
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BARRIER;
	co.name = "";
	co.group = "a";
	co.op_seq = 1;
	t[2] = fx_coll(f, &c[2], &co, 60000, NULL, 0);
	fx_want(f, fx_coll(f, &c[3], &co, 60000, NULL, 0), COHORT_OK);
	fx_want(f, t[2], COHORT_OK);
	co.group = "b";
	fx_want(f, fx_coll(f, &c[0], &co, 60000, NULL, 0), COHORT_ENOENT);
}
END_TEST

/* Every parked collective, group creation, gather and broadcast of the
 * old generation hears EMEMBERSHIP; a KV wait goes on. */
START_TEST(test_el_parked_ops_answered)
{
	struct srq_cli c[3];
	int32_t ranks[] = { 0, 1, 2 };
	uintptr_t tg, ts, tb, tk;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	fx_form_el(f, c, 3, "e", 2, 3);
	tg = group_of(&c[0], "g", ranks, 3);
	co.kind = COHORT__COLLECTIVE_KIND__COLL_SERVICE;
	co.name = "";
	co.op_seq = 1;
	co.service_op = 1;
	co.dtype = COHORT_F32;
	co.count = 1;
	ts = fx_coll(f, &c[1], &co, 60000, "abcd", 4);
	co = (Cohort__Collective)COHORT__COLLECTIVE__INIT;
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BROADCAST;
	co.name = "obj";
	co.op_seq = 2;
	co.root = 2;
	tb = fx_coll(f, &c[0], &co, 60000, NULL, 0);
	tk = fx_kv_get(f, &c[0], "later", true, 60000);
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	fx_want(f, tg, COHORT_EMEMBERSHIP);
	fx_want(f, ts, COHORT_EMEMBERSHIP);
	fx_want(f, tb, COHORT_EMEMBERSHIP);
	ck_assert_ptr_null(fx_get(f, tk));
	fx_want(f, fx_kv_set(f, &c[1], "later", "x"), COHORT_OK);
	ck_assert(fx_payload_is(f, tk, "x"));
}
END_TEST

/* A process declared dead that comes back is told it was removed, with
 * the record of its own removal. */
START_TEST(test_el_removed_member_told)
{
	struct srq_cli c[4];
	Cohort__Reply *r;

	fx_form_el(f, c, 4, "e", 3, 4);
	pass(c, 3, 1000, 6);
	ck_assert_uint_eq(job_of("e")->generation, 2);
	/* it wakes up: its heartbeat is served and names the generation */
	r = fx_want(f, fx_heartbeat(f, &c[3], "", 0, "", false, 0), COHORT_OK);
	ck_assert_uint_eq(r->heartbeat->generation, 2);
	r = fx_want(f, fx_reform(f, &c[3]), COHORT_EPEERLOST);
	ck_assert_msg(strstr(r->error,
	                  "rank 3 (host:103) was removed from job 'e' at "
	                  "generation 2")
	            != NULL
	        && strstr(r->error, "no heartbeat for") != NULL,
	    "%s", r->error);
	ck_assert_int_eq(r->failed_rank, 3);
	ck_assert_int_eq(
	    r->failure->kind, COHORT__FAILURE_KIND__FAILURE_HEARTBEAT);
	ck_assert_ptr_nonnull(strstr(r->failed_text, "no heartbeat"));
	/* any later call of it: the same */
	r = fx_want(f, fx_barrier(f, &c[3], "x", 1, 60000), COHORT_EPEERLOST);
	ck_assert_int_eq(r->failed_rank, 3);
	c[3].gen = 2; /* even claiming the new generation */
	r = fx_want(f, fx_barrier(f, &c[3], "x", 1, 60000), COHORT_EPEERLOST);
	ck_assert_ptr_nonnull(strstr(r->error, "was removed"));
}
END_TEST

START_TEST(test_el_reform_checks)
{
	struct srq_cli c[2], e[2], x;
	Cohort__JoinReply *jr;
	Cohort__Reply *r;

	fx_form(f, c, 2, "plain");
	r = fx_want(f, fx_reform(f, &c[0]), COHORT_ENOTSUP);
	ck_assert_ptr_nonnull(strstr(r->error, "not elastic"));
	fx_form_el(f, e, 2, "e", 1, 2);
	srq_cli_init(&x, "e", 99, 99);
	fx_want(f, fx_reform(f, &x), COHORT_ESTATE);
	/* nothing to do: the same generation, identity */
	jr = fx_reformed(f, &e[1], fx_reform(f, &e[1]));
	ck_assert_uint_eq(jr->generation, 1);
	ck_assert_uint_eq(jr->prev_generation, 1);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 1);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 5-6. Joiners and the step boundary                                       */
/* ------------------------------------------------------------------------ */

START_TEST(test_el_joiner_admitted_at_boundary)
{
	struct srq_cli c[4];
	uintptr_t tj, tb[4];
	Cohort__Reply *r;
	Cohort__JoinReply *jr;
	char *json;
	int code;

	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 3, "e", 2, 4);
	srq_cli_init(&c[3], "e", 200, 50);
	c[3].host = "new";
	tj = fx_join_el(f, &c[3], -1, 2, 4, 60000);
	ck_assert_ptr_null(fx_get(f, tj));
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert_uint_eq(r->heartbeat->joiners_waiting, 1);
	ck_assert_uint_eq(
	    status_of(&c[0])->status_query->jobs[0]->joiners_waiting, 1);
	json = srv_status_json(f->core, "e", "tok", f->now, &code);
	ck_assert_int_eq(code, 200);
	ck_assert_has(json,
	    "\"world_size\":3,\"min_world\":2,\"max_world\":4,\"joiners_"
	    "waiting\":1");
	free(json);
	for (int i = 0; i < 3; i++)
		tb[i] = fx_boundary(f, &c[i], 1, true, 60000);
	/* every arrival, the same answer */
	for (int i = 0; i < 3; i++) {
		r = fx_want(f, tb[i], COHORT_OK);
		ck_assert_int_eq(r->body_case, COHORT__REPLY__BODY_COLLECTIVE);
		ck_assert(r->collective->changed);
		ck_assert_uint_eq(r->collective->generation, 2);
		ck_assert_uint_eq(r->generation, 2);
		ck_assert_int_eq(r->collective->state_sender, 0);
		WANT_RANKS(r->collective->state_receivers,
		    r->collective->n_state_receivers, 3);
	}
	jr = fx_want(f, tj, COHORT_OK)->join;
	ck_assert_int_eq(jr->rank, 3);
	ck_assert_uint_eq(jr->world_size, 4);
	ck_assert_uint_eq(jr->generation, 2);
	ck_assert(jr->joined_running);
	ck_assert_uint_eq(jr->prev_generation, 1);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 1, 2, -1);
	ck_assert_str_eq(jr->hosts[3], "new");
	ck_assert_uint_eq(jr->min_world, 2);
	ck_assert_uint_eq(jr->max_world, 4);
	fx_joined(f, &c[3], tj);
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert_uint_eq(r->heartbeat->joiners_waiting, 0);
	ck_assert_uint_eq(r->heartbeat->generation, 2);
	/* the old members reform: their ranks stay */
	for (int i = 0; i < 3; i++) {
		jr = fx_reformed(f, &c[i], fx_reform(f, &c[i]));
		ck_assert_int_eq(jr->rank, i);
		ck_assert(!jr->joined_running);
		WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 1, 2, -1);
	}
	/* the transfer happened: the joiner holds the state now */
	for (int i = 0; i < 4; i++)
		tb[i] = fx_boundary(f, &c[i], 1, true, 60000);
	for (int i = 0; i < 4; i++) {
		r = fx_want(f, tb[i], COHORT_OK);
		ck_assert(!r->collective->changed);
		ck_assert_int_eq(r->collective->state_sender, -1);
		ck_assert_uint_eq(r->collective->n_state_receivers, 0);
	}
	ck_assert(job_of("e")->members[3].has_state);
	ck_assert_uint_eq(f->core->m.grows, 1);
}
END_TEST

/* Joiners are admitted in the order of the ranks they asked for, then of
 * arrival, as many as fit; the others keep waiting. */
START_TEST(test_el_joiner_order_and_room)
{
	struct srq_cli c[2], x, y, z;
	uintptr_t tx, ty, tz, tb[2];
	Cohort__Reply *r;

	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 2, "e", 2, 4);
	srq_cli_init(&x, "e", 300, 60);
	srq_cli_init(&y, "e", 301, 61);
	srq_cli_init(&z, "e", 302, 62);
	tx = fx_join_el(f, &x, 3, 2, 4, 60000);
	ty = fx_join_el(f, &y, -1, 2, 4, 60000);
	tz = fx_join_el(f, &z, 1, 2, 4, 60000);
	tb[0] = fx_boundary(f, &c[0], 1, true, 60000);
	tb[1] = fx_boundary(f, &c[1], 1, true, 60000);
	r = fx_want(f, tb[1], COHORT_OK);
	WANT_RANKS(r->collective->state_receivers,
	    r->collective->n_state_receivers, 2, 3);
	ck_assert_int_eq(fx_want(f, tz, COHORT_OK)->join->rank, 2);
	ck_assert_int_eq(fx_want(f, tx, COHORT_OK)->join->rank, 3);
	ck_assert_ptr_null(fx_get(f, ty));
	ck_assert_uint_eq(job_of("e")->njoiners, 1);
}
END_TEST

/* At its maximum a job keeps a joiner waiting (a spare); it is admitted
 * at the first boundary after a member is lost. */
START_TEST(test_el_spare_admitted_after_loss)
{
	struct srq_cli c[3], s;
	uintptr_t ts, tb[2];
	Cohort__Reply *r;

	fx_form_el(f, c, 3, "e", 2, 3);
	srq_cli_init(&s, "e", 400, 70);
	ts = fx_join_el(f, &s, -1, 2, 3, 60000);
	for (int i = 0; i < 3; i++)
		tb[i % 2] = fx_boundary(f, &c[i], 1, true, 60000);
	r = fx_want(f, tb[0], COHORT_OK);
	ck_assert(!r->collective->changed);
	ck_assert_ptr_null(fx_get(f, ts));
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	fx_reformed(f, &c[1], fx_reform(f, &c[1]));
	tb[0] = fx_boundary(f, &c[0], 1, true, 60000);
	r = fx_want(f, fx_boundary(f, &c[1], 1, true, 60000), COHORT_OK);
	ck_assert(r->collective->changed);
	ck_assert_uint_eq(r->collective->generation, 3);
	WANT_RANKS(r->collective->state_receivers,
	    r->collective->n_state_receivers, 2);
	ck_assert_int_eq(fx_want(f, ts, COHORT_OK)->join->rank, 2);
}
END_TEST

START_TEST(test_el_joiner_timeout_and_disconnect)
{
	struct srq_cli c[2], a, b;
	uintptr_t ta, tb;
	Cohort__Reply *r;
	size_t drops;

	fx_form_el(f, c, 2, "e", 1, 3);
	srq_cli_init(&a, "e", 500, 80);
	srq_cli_init(&b, "e", 501, 81);
	ta = fx_join_el(f, &a, -1, 1, 3, 3000);
	tb = fx_join_el(f, &b, -1, 1, 3, 60000);
	pass(c, 2, 1000, 3);
	r = fx_want(f, ta, COHORT_ETIMEDOUT);
	ck_assert_has(r->error,
	    "joining the running job 'e' timed out after 3.0 s: it has 2 of "
	    "at most 3 ranks");
	drops = f->ndrop;
	srv_core_pipe_closed(f->core, b.pipe, f->now);
	ck_assert_ptr_null(fx_get(f, tb));
	ck_assert_uint_eq(f->ndrop, drops + 1);
	ck_assert_uint_eq(job_of("e")->njoiners, 0);
	/* the next boundary admits nobody */
	tb = fx_boundary(f, &c[0], 1, true, 60000);
	r = fx_want(f, fx_boundary(f, &c[1], 1, true, 60000), COHORT_OK);
	ck_assert(!r->collective->changed);
	fx_want(f, tb, COHORT_OK);
}
END_TEST

/* A boundary with a member lost first fails on every member; the
 * joiners wait for the next one. */
START_TEST(test_el_boundary_member_lost_first)
{
	struct srq_cli c[3], j;
	uintptr_t tj, tb[2];
	Cohort__Reply *r;

	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 3, "e", 2, 4);
	srq_cli_init(&j, "e", 600, 90);
	tj = fx_join_el(f, &j, -1, 2, 4, 60000);
	tb[0] = fx_boundary(f, &c[0], 1, true, 60000);
	tb[1] = fx_boundary(f, &c[1], 1, true, 60000);
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	for (int i = 0; i < 2; i++) {
		r = fx_want(f, tb[i], COHORT_EMEMBERSHIP);
		ck_assert_int_eq(r->failed_rank, 2);
		ck_assert_uint_eq(r->generation, 2);
	}
	ck_assert_ptr_null(fx_get(f, tj));
	fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	fx_reformed(f, &c[1], fx_reform(f, &c[1]));
	tb[0] = fx_boundary(f, &c[0], 1, true, 60000);
	r = fx_want(f, fx_boundary(f, &c[1], 1, true, 60000), COHORT_OK);
	ck_assert(r->collective->changed);
	ck_assert_uint_eq(r->collective->generation, 3);
	ck_assert_int_eq(fx_want(f, tj, COHORT_OK)->join->rank, 2);
}
END_TEST

START_TEST(test_el_boundary_checks)
{
	struct srq_cli c[2], p[2];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t;
	Cohort__Reply *r;

	fx_form_el(f, c, 2, "e", 1, 2);
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BOUNDARY;
	co.op_seq = 1;
	co.group = "g";
	r = fx_want(f, fx_coll(f, &c[0], &co, 1000, NULL, 0), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(r->error, "world group"));
	co.group = "";
	fx_want(f, fx_coll(f, &c[0], &co, 1000, "x", 1), COHORT_EINVAL);
	/* a boundary and a barrier at the same op_seq: a mismatch */
	t = fx_boundary(f, &c[0], 1, true, 60000);
	r = fx_want(f, fx_barrier(f, &c[1], "b", 1, 60000), COHORT_EMISMATCH);
	ck_assert_ptr_nonnull(strstr(r->error, "step boundary"));
	fx_want(f, t, COHORT_EMISMATCH);
	/* a job that is not elastic: a barrier */
	fx_form(f, p, 2, "plain");
	t = fx_boundary(f, &p[0], 1, true, 60000);
	r = fx_want(f, fx_boundary(f, &p[1], 1, false, 60000), COHORT_OK);
	ck_assert(!r->collective->changed);
	ck_assert_int_eq(r->collective->state_sender, -1);
	ck_assert_uint_eq(r->collective->generation, 1);
	fx_want(f, t, COHORT_OK);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Races                                                                    */
/* ------------------------------------------------------------------------ */

START_TEST(test_el_two_kills_at_once)
{
	struct srq_cli c[5];
	Cohort__JoinReply *jr;

	fx_form_el(f, c, 5, "e", 2, 5);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	srv_core_pipe_closed(f->core, c[3].pipe, f->now);
	ck_assert_uint_eq(job_of("e")->generation, 3);
	jr = fx_reformed(f, &c[4], fx_reform(f, &c[4]));
	ck_assert_uint_eq(jr->generation, 3);
	ck_assert_uint_eq(jr->prev_generation, 1);
	ck_assert_int_eq(jr->rank, 2);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 2, 4);
	ck_assert_int_eq(fx_reformed(f, &c[2], fx_reform(f, &c[2]))->rank, 1);
}
END_TEST

/* Two members silent in the same sweep: two changes in one event. */
START_TEST(test_el_two_silent_in_one_sweep)
{
	struct srq_cli c[4], live[2];
	Cohort__JoinReply *jr;

	fx_form_el(f, c, 4, "e", 2, 4);
	live[0] = c[0];
	live[1] = c[3];
	pass(live, 2, 1000, 6);
	c[0].seq = live[0].seq;
	c[3].seq = live[1].seq;
	ck_assert_uint_eq(job_of("e")->generation, 3);
	ck_assert_uint_eq(job_of("e")->world, 2);
	jr = fx_reformed(f, &c[3], fx_reform(f, &c[3]));
	ck_assert_int_eq(jr->rank, 1);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 3);
}
END_TEST

/* A kill while the others reform: every one maps from the generation it
 * is in. */
START_TEST(test_el_kill_while_reforming)
{
	struct srq_cli c[4];
	uintptr_t t;
	Cohort__JoinReply *jr;
	Cohort__Reply *r;

	fx_form_el(f, c, 4, "e", 2, 4);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	/* generation 2: c0 = 0, c2 = 1, c3 = 2 */
	fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	fx_reformed(f, &c[2], fx_reform(f, &c[2]));
	t = fx_barrier(f, &c[0], "x", 1, 60000);
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	r = fx_want(f, t, COHORT_EMEMBERSHIP);
	ck_assert_uint_eq(r->generation, 3);
	ck_assert_int_eq(r->failed_rank, 1); /* its rank in generation 2 */
	jr = fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	ck_assert_uint_eq(jr->prev_generation, 2);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 2);
	jr = fx_reformed(f, &c[3], fx_reform(f, &c[3]));
	ck_assert_uint_eq(jr->prev_generation, 1);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 3);
	ck_assert_int_eq(jr->rank, 1);
}
END_TEST

/* A joiner lost between its admission and its first boundary. */
START_TEST(test_el_joiner_lost_after_admission)
{
	struct srq_cli c[2], j;
	uintptr_t tj, tb;
	Cohort__Reply *r;

	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 2, "e", 2, 4);
	srq_cli_init(&j, "e", 700, 95);
	tj = fx_join_el(f, &j, -1, 2, 4, 60000);
	tb = fx_boundary(f, &c[0], 1, true, 60000);
	fx_want(f, fx_boundary(f, &c[1], 1, true, 60000), COHORT_OK);
	fx_want(f, tb, COHORT_OK);
	fx_joined(f, &j, tj);
	ck_assert_uint_eq(j.gen, 2);
	srv_core_pipe_closed(f->core, j.pipe, f->now);
	ck_assert_uint_eq(job_of("e")->generation, 3);
	ck_assert_uint_eq(job_of("e")->world, 2);
	fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	fx_reformed(f, &c[1], fx_reform(f, &c[1]));
	tb = fx_boundary(f, &c[0], 1, true, 60000);
	r = fx_want(f, fx_boundary(f, &c[1], 1, true, 60000), COHORT_OK);
	ck_assert(!r->collective->changed);
	ck_assert_int_eq(r->collective->state_sender, -1);
	ck_assert_ptr_nonnull(srv_elastic_removal(job_of("e"), 0));
	ck_assert_uint_eq(srv_elastic_removal(job_of("e"), 0)->client_id, 700);
}
END_TEST

/* No member holding the state remains: the job stops. */
START_TEST(test_el_no_holder_left_stops)
{
	struct srq_cli c[1], j;
	uintptr_t tj;
	Cohort__Reply *r;

	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 1, "e", 1, 3);
	srq_cli_init(&j, "e", 800, 96);
	tj = fx_join_el(f, &j, -1, 1, 3, 60000);
	r = fx_want(f, fx_boundary(f, &c[0], 1, true, 60000), COHORT_OK);
	WANT_RANKS(r->collective->state_receivers,
	    r->collective->n_state_receivers, 1);
	fx_joined(f, &j, tj);
	srv_core_pipe_closed(f->core, c[0].pipe, f->now);
	r = fx_want(f, fx_reform(f, &j), COHORT_EPEERLOST);
	ck_assert_has(r->failed_text,
	    "none of the 1 remaining ranks holds the job's state");
}
END_TEST

/* A job that stops keeps its joiners: they wait in its next rendezvous,
 * which its restarted members join. */
START_TEST(test_el_stop_moves_joiners_to_rendezvous)
{
	struct srq_cli c[4], j, n[2];
	uintptr_t tj, tn[2];
	Cohort__Reply *r;

	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 3, "e", 3, 4);
	srq_cli_init(&j, "e", 900, 97);
	tj = fx_join_el(f, &j, -1, 3, 4, 60000);
	srv_core_pipe_closed(f->core, c[0].pipe, f->now);
	ck_assert_ptr_null(fx_get(f, tj));
	ck_assert_str_eq(
	    status_of(&c[1])->status_query->jobs[0]->state, "rendezvous");
	for (int i = 0; i < 2; i++) {
		srq_cli_init(&n[i], "e", 950 + (uint64_t)i, 98 + (uint32_t)i);
		tn[i] = fx_join_el(f, &n[i], i, 3, 4, 60000);
	}
	fx_tick(f, 1100);
	r = fx_want(f, tj, COHORT_OK);
	ck_assert_uint_eq(r->join->generation, 2);
	ck_assert_uint_eq(r->join->world_size, 3);
	ck_assert_int_eq(r->join->rank, 2);
	ck_assert(!r->join->joined_running);
	fx_want(f, tn[0], COHORT_OK);
	fx_want(f, tn[1], COHORT_OK);
}
END_TEST

/* A member more than SRV_EL_HISTORY changes behind cannot follow. */
START_TEST(test_el_reform_too_far_behind)
{
	struct srq_cli c[20];
	Cohort__Reply *r;

	fx_form_el(f, c, 20, "e", 2, 20);
	srv_core_pipe_closed(f->core, c[19].pipe, f->now);
	fx_reformed(f, &c[1], fx_reform(f, &c[1])); /* at generation 2 */
	for (int i = 18; i >= 3; i--)
		srv_core_pipe_closed(f->core, c[i].pipe, f->now);
	ck_assert_uint_eq(job_of("e")->generation, 18);
	r = fx_want(f, fx_reform(f, &c[0]), COHORT_EPEERLOST);
	ck_assert_has(r->error, "cannot follow job 'e'");
	ck_assert_int_eq(fx_reformed(f, &c[1], fx_reform(f, &c[1]))->rank, 1);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* 8. The journal                                                           */
/* ------------------------------------------------------------------------ */

/* cohortd restarted just after a change: the same generation, members,
 * ranks, subgroups and state holders; the same answers. */
START_TEST(test_el_journal_restart_mid_change)
{
	struct fx *jf = fx_new_journal(0);
	struct srq_cli c[4];
	int32_t ra[] = { 1, 2, 3 };
	uintptr_t t[4];
	char before[4096], after[4096];
	Cohort__JoinReply *jr;
	Cohort__Reply *r;
	uint64_t seq;
	int32_t prev0[3];

	fx_free(f);
	f = jf;
	fx_form_el(f, c, 4, "e", 2, 4);
	for (int i = 1; i < 4; i++)
		t[i] = group_of(&c[i], "a", ra, 3);
	for (int i = 1; i < 4; i++)
		fx_want(f, t[i], COHORT_OK);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now);
	el_state("e", before, sizeof(before));
	seq = c[0].seq + 1;
	jr = fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	memcpy(prev0, jr->prev_ranks, sizeof(prev0));
	fx_restart(f);
	el_state("e", after, sizeof(after));
	ck_assert_str_eq(before, after);
	/* c0 re-sends its Reform (same seq): the same answer */
	{
		struct srq q;
		Cohort__Reform rf = COHORT__REFORM__INIT;
		Cohort__Request *rq
		    = srq_simple(&q, COHORT__REQUEST__BODY_REFORM, &rf, 0);
		rq->seq = seq;
		c[0].gen = 1;
		jr = fx_reformed(f, &c[0], fx_send(f, &c[0], rq, NULL, 0));
		WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, prev0[0],
		    prev0[1], prev0[2]);
		ck_assert_int_eq(jr->rank, 0);
	}
	jr = fx_reformed(f, &c[3], fx_reform(f, &c[3]));
	ck_assert_int_eq(jr->rank, 2);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 2, 3);
	/* the removed member is told why, after the restart too */
	r = fx_want(f, fx_reform(f, &c[1]), COHORT_EPEERLOST);
	ck_assert_msg(strstr(r->error, "was removed from job 'e'") != NULL
	        && strstr(r->error, "connection lost") != NULL,
	    "%s", r->error);
	/* the generation goes on: another loss after the restart */
	fx_reformed(f, &c[2], fx_reform(f, &c[2]));
	srv_core_pipe_closed(f->core, c[3].pipe, f->now);
	ck_assert_uint_eq(job_of("e")->generation, 3);
	WANT_RANKS(srv_group_find(job_of("e"), "a")->ranks,
	    srv_group_find(job_of("e"), "a")->n, 1);
	fx_free_journal(f);
	f = NULL;
	f = fx_new();
}
END_TEST

/* An admission and the transfer that follows it, through restarts: who
 * holds the state, the joiner's Join and the boundary's answer retried. */
START_TEST(test_el_journal_admission_and_holders)
{
	struct fx *jf = fx_new_journal(0);
	struct srq_cli c[2], j;
	uintptr_t tj, tb;
	char before[4096], after[4096];
	Cohort__Reply *r;
	uint64_t jseq, bseq;

	fx_free(f);
	f = jf;
	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 2, "e", 1, 3);
	srq_cli_init(&j, "e", 1000, 99);
	tj = fx_join_el(f, &j, -1, 1, 3, 60000);
	jseq = j.seq;
	tb = fx_boundary(f, &c[0], 1, true, 60000);
	bseq = c[1].seq + 1;
	fx_want(f, fx_boundary(f, &c[1], 1, true, 60000), COHORT_OK);
	fx_want(f, tb, COHORT_OK);
	fx_joined(f, &j, tj);
	el_state("e", before, sizeof(before));
	ck_assert_ptr_nonnull(strstr(before, "1000@2 host prev -1 empty"));
	fx_restart(f);
	el_state("e", after, sizeof(after));
	ck_assert_str_eq(before, after);
	/* the joiner's Join and a boundary arrival, re-sent: cached */
	{
		struct srq q;
		Cohort__Request *rq = srq_join(&q, &j, -1, 3, -1, 60000);
		q.b.join.min_world = 1;
		rq->seq = jseq;
		j.gen = 0;
		r = fx_want(f, fx_send(f, &j, rq, NULL, 0), COHORT_OK);
		ck_assert(r->join->joined_running);
		ck_assert_int_eq(r->join->rank, 2);
		j.gen = 2;
	}
	{
		Cohort__Collective co = COHORT__COLLECTIVE__INIT;
		struct srq q;
		Cohort__Request *rq;
		co.kind = COHORT__COLLECTIVE_KIND__COLL_BOUNDARY;
		co.op_seq = 1;
		co.has_state = true;
		rq = srq_simple(&q, COHORT__REQUEST__BODY_COLLECTIVE, &co, 0);
		rq->seq = bseq;
		c[1].gen = 1;
		r = fx_want(f, fx_send(f, &c[1], rq, NULL, 0), COHORT_OK);
		ck_assert(r->collective->changed);
		WANT_RANKS(r->collective->state_receivers,
		    r->collective->n_state_receivers, 2);
	}
	fx_reformed(f, &c[0], fx_reform(f, &c[0]));
	fx_reformed(f, &c[1], fx_reform(f, &c[1]));
	/* the transfer completed: the next boundary says so */
	tb = fx_boundary(f, &c[0], 1, true, 60000);
	fx_boundary(f, &c[1], 1, true, 60000);
	r = fx_want(f, fx_boundary(f, &j, 1, true, 60000), COHORT_OK);
	ck_assert_int_eq(r->collective->state_sender, -1);
	fx_want(f, tb, COHORT_OK);
	fx_restart(f);
	ck_assert(job_of("e")->members[2].has_state);
	fx_free_journal(f);
	f = fx_new();
}
END_TEST

/* A snapshot holds the generation, the changes a Reform may come from and
 * the removed members. */
START_TEST(test_el_journal_snapshot)
{
	struct fx *jf = fx_new_journal(0);
	struct srq_cli c[4], j;
	uintptr_t tj, tb[3];
	char before[4096], after[4096];
	Cohort__Reply *r;
	Cohort__JoinReply *jr;

	fx_free(f);
	f = jf;
	fx_form_el(f, c, 4, "e", 2, 4);
	srv_core_pipe_closed(f->core, c[1].pipe, f->now); /* gen 2 */
	for (int i = 0; i < 4; i++)
		if (i != 1)
			fx_reformed(f, &c[i], fx_reform(f, &c[i]));
	srq_cli_init(&j, "e", 1100, 100);
	tj = fx_join_el(f, &j, -1, 2, 4, 60000);
	tb[0] = fx_boundary(f, &c[0], 1, true, 60000);
	tb[1] = fx_boundary(f, &c[2], 1, true, 60000);
	fx_want(f, fx_boundary(f, &c[3], 1, true, 60000), COHORT_OK);
	fx_want(f, tb[0], COHORT_OK);
	fx_want(f, tb[1], COHORT_OK);
	fx_joined(f, &j, tj); /* gen 3 */
	srv_core_pipe_closed(f->core, c[3].pipe, f->now); /* gen 4 */
	ck_assert_uint_eq(job_of("e")->generation, 4);
	ck_assert_cohort_ok(srv_snapshot_compact(f->core));
	el_state("e", before, sizeof(before));
	fx_restart(f);
	el_state("e", after, sizeof(after));
	ck_assert_str_eq(before, after);
	/* c2 is at generation 2: mapped through two changes */
	jr = fx_reformed(f, &c[2], fx_reform(f, &c[2]));
	ck_assert_uint_eq(jr->prev_generation, 2);
	ck_assert_int_eq(jr->rank, 1);
	WANT_RANKS(jr->prev_ranks, jr->n_prev_ranks, 0, 1, -1);
	r = fx_want(f, fx_reform(f, &c[1]), COHORT_EPEERLOST);
	ck_assert_has(r->error,
	    "rank 1 (host:101) was removed from job 'e' at generation 2");
	r = fx_want(f, fx_reform(f, &c[3]), COHORT_EPEERLOST);
	ck_assert_ptr_nonnull(strstr(r->error, "at generation 4"));
	fx_free_journal(f);
	f = fx_new();
}
END_TEST

START_TEST(test_el_journal_first_generation_and_stop)
{
	struct fx *jf = fx_new_journal(0);
	struct srq_cli c[3];
	Cohort__Reply *r;

	fx_free(f);
	f = jf;
	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 3, "e", 3, 4);
	fx_restart(f);
	ck_assert_uint_eq(job_of("e")->min_world, 3);
	ck_assert_uint_eq(job_of("e")->max_world, 4);
	ck_assert_uint_eq(job_of("e")->world, 3);
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert_uint_eq(r->heartbeat->generation, 1);
	hb(&c[1]);
	hb(&c[2]);
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	fx_restart(f);
	ck_assert_str_eq(srv_job_state_name(job_of("e")), "failed");
	ck_assert_msg(
	    strstr(job_of("e")->failed_text, "below the minimum of 3") != NULL,
	    "%s", job_of("e")->failed_text);
	fx_free_journal(f);
	f = fx_new();
}
END_TEST

/* A member that does not come back after cohortd's restart is lost like
 * any other: the job goes on without it. */
START_TEST(test_el_journal_member_lost_during_restart)
{
	struct fx *jf = fx_new_journal(0);
	struct srq_cli c[3];
	Cohort__Reply *r;

	fx_free(f);
	f = jf;
	fx_form_el(f, c, 3, "e", 2, 3);
	fx_restart(f);
	pass(c, 2, 1000, 6);
	ck_assert_uint_eq(job_of("e")->generation, 2);
	r = fx_want(f, fx_reform(f, &c[2]), COHORT_EPEERLOST);
	ck_assert_has(r->error, "did not reconnect");
	ck_assert_int_eq(fx_reformed(f, &c[1], fx_reform(f, &c[1]))->rank, 1);
	fx_free_journal(f);
	f = fx_new();
}
END_TEST

/* cohortd restarted while a boundary gathers and a joiner waits: the
 * clients re-send (parked requests are not journalled), the boundary
 * completes and admits the joiner once. */
START_TEST(test_el_journal_restart_during_boundary)
{
	struct fx *jf = fx_new_journal(0);
	struct srq_cli c[3], j;
	uint64_t seq[3], jseq;
	uintptr_t tj, tb[3];
	Cohort__Reply *r;

	fx_free(f);
	f = jf;
	f->core->rdzv_last_call_ms = 1000;
	fx_form_el(f, c, 3, "e", 2, 4);
	srq_cli_init(&j, "e", 1300, 102);
	fx_join_el(f, &j, -1, 2, 4, 60000);
	jseq = j.seq;
	for (int i = 0; i < 2; i++) {
		fx_boundary(f, &c[i], 1, true, 60000);
		seq[i] = c[i].seq;
	}
	fx_restart(f);
	ck_assert_uint_eq(job_of("e")->njoiners, 0);
	{
		struct srq q;
		Cohort__Request *rq = srq_join(&q, &j, -1, 4, -1, 60000);
		q.b.join.min_world = 2;
		rq->seq = jseq;
		tj = fx_send(f, &j, rq, NULL, 0);
	}
	ck_assert_uint_eq(job_of("e")->njoiners, 1);
	for (int i = 0; i < 2; i++) {
		Cohort__Collective co = COHORT__COLLECTIVE__INIT;
		struct srq q;
		Cohort__Request *rq;
		co.kind = COHORT__COLLECTIVE_KIND__COLL_BOUNDARY;
		co.op_seq = 1;
		co.has_state = true;
		rq = srq_simple(
		    &q, COHORT__REQUEST__BODY_COLLECTIVE, &co, 60000);
		rq->seq = seq[i];
		tb[i] = fx_send(f, &c[i], rq, NULL, 0);
		ck_assert_ptr_null(fx_get(f, tb[i]));
	}
	tb[2] = fx_boundary(f, &c[2], 1, true, 60000);
	for (int i = 0; i < 3; i++) {
		r = fx_want(f, tb[i], COHORT_OK);
		ck_assert(r->collective->changed);
		ck_assert_uint_eq(r->collective->generation, 2);
		WANT_RANKS(r->collective->state_receivers,
		    r->collective->n_state_receivers, 3);
	}
	r = fx_want(f, tj, COHORT_OK);
	ck_assert_int_eq(r->join->rank, 3);
	ck_assert(r->join->joined_running);
	fx_restart(f);
	ck_assert_uint_eq(job_of("e")->generation, 2);
	ck_assert_uint_eq(job_of("e")->world, 4);
	ck_assert(!job_of("e")->members[3].has_state);
	fx_free_journal(f);
	f = fx_new();
}
END_TEST

START_TEST(test_el_metrics)
{
	struct srq_cli c[3], j;
	char *m;

	fx_form_el(f, c, 3, "e", 2, 3);
	srv_core_pipe_closed(f->core, c[2].pipe, f->now);
	srq_cli_init(&j, "e", 1200, 101);
	fx_join_el(f, &j, -1, 2, 3, 60000);
	m = srv_metrics_text(f->core, f->now);
	ck_assert_ptr_nonnull(strstr(m, "cohort_elastic_shrinks_total 1\n"));
	ck_assert_ptr_nonnull(strstr(m, "cohort_elastic_grows_total 0\n"));
	ck_assert_ptr_nonnull(strstr(m, "cohort_elastic_joiners_waiting 1\n"));
	free(m);
}
END_TEST

UNIT_FIXTURE_SUITE(srv_elastic, "elastic", 30, fx_setup, fx_teardown,
    test_el_rendezvous_full, test_el_rendezvous_last_call,
    test_el_rendezvous_below_min_times_out, test_el_range_must_agree,
    test_el_shrink_connection_lost, test_el_shrink_renumbers_densely,
    test_el_shrink_heartbeat_silence, test_el_shrink_report_failure,
    test_el_below_min_stops, test_el_subgroups_carried_over,
    test_el_parked_ops_answered, test_el_removed_member_told,
    test_el_reform_checks, test_el_joiner_admitted_at_boundary,
    test_el_joiner_order_and_room, test_el_spare_admitted_after_loss,
    test_el_joiner_timeout_and_disconnect, test_el_boundary_member_lost_first,
    test_el_boundary_checks, test_el_two_kills_at_once,
    test_el_two_silent_in_one_sweep, test_el_kill_while_reforming,
    test_el_joiner_lost_after_admission, test_el_no_holder_left_stops,
    test_el_stop_moves_joiners_to_rendezvous, test_el_reform_too_far_behind,
    test_el_journal_restart_mid_change, test_el_journal_admission_and_holders,
    test_el_journal_snapshot, test_el_journal_first_generation_and_stop,
    test_el_journal_member_lost_during_restart,
    test_el_journal_restart_during_boundary, test_el_metrics)
