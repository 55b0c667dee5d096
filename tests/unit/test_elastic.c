/*
 * test_elastic.c - libcohort's side of elastic membership (client/
 * elastic.c, docs/elastic.md) against the real cohortd core embedded in
 * the test (tests/harness/cl_fixture.h), ranks in threads, the data plane
 * over real loopback TCP (the host backend): a lost member makes every
 * survivor's call return EMEMBERSHIP (a control-plane call, and a
 * data-plane one blocked on the lost rank), cohort_client_reform moves
 * the world and the subgroups to the survivors' dense ranks and their new
 * data plane works; a process joining a running job is admitted at a step
 * boundary and receives the state; below the minimum the job stops with
 * EPEERLOST; a job that is not elastic refuses a reform.
 *
 * A member is lost by dropping its connection to cohortd (the way a
 * killed process's closes): cohortd names it a process failure.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cl_fixture.h"
#include "client.h"
#include "unit_suite.h"

Suite *suite_elastic(void);

/* Options of an elastic member: min_world..n (n = the maximum). */
struct et_open {
	int n;
	int min;
	const char *backend;
};

static cohort_status
et_open_one(struct clx *x, int rank, void *arg)
{
	const struct et_open *a = arg;
	cohort_options o;

	clx_options(x, rank, a->n, &o);
	o.min_world = a->min;
	if (a->backend != NULL)
		o.backend = a->backend;
	return (cohort_client_open(&o, &x->c[rank], COHORT_WAIT_DEFAULT));
}

/* Opens ranks 0..n-1 of an elastic job (min..n, every one joins). */
static void
et_join(struct clx *x, int n, int min, const char *backend)
{
	struct et_open a = { n, min, backend };
	cohort_status st[CLX_MAX];

	clx_run(x, n, et_open_one, &a, 20000, st);
	for (int r = 0; r < n; r++)
		ck_assert_msg(st[r] == COHORT_OK, "rank %d: open: %s: %s", r,
		    cohort_status_name(st[r]), cohort_last_error());
	x->n = n;
}

static cohort_status
et_barrier(struct clx *x, int rank, void *arg)
{
	(void)arg;
	return (
	    cohort_barrier(cohort_client_world(x->c[rank]), "step", 10000));
}

/* A sum all-reduce of one float per rank on the world. */
static cohort_status
et_allreduce(struct clx *x, int rank, void *arg)
{
	float v;
	cohort_status st;

	(void)arg;
	v = (float)cohort_client_rank(x->c[rank]) + 1.0f;
	st = cohort_allreduce(cohort_client_world(x->c[rank]), &v, &v, 1,
	    COHORT_F32, COHORT_SUM, NULL, 10000);
	if (st == COHORT_OK) {
		int n = cohort_client_world_size(x->c[rank]);

		ck_assert_msg(v == (float)(n * (n + 1) / 2),
		    "rank %d: sum %g of a world of %d", rank, (double)v, n);
	}
	return (st);
}

static cohort_status
et_reform(struct clx *x, int rank, void *arg)
{
	cohort_reform_info *info = arg;

	return (cohort_client_reform(x->c[rank], &info[rank], 10000));
}

/* What et_all runs on each rank: fn(arg) if its client is open (a lost
 * rank's is closed, its groups gone with it). */
struct et_each {
	clx_fn fn;
	void *arg;
};

static cohort_status
et_if_open(struct clx *x, int rank, void *arg)
{
	const struct et_each *e = arg;

	if (x->c[rank] == NULL)
		return (COHORT_OK);
	return (e->fn(x, rank, e->arg));
}

/* Runs fn on every open client; each must return want. */
static void
et_all(struct clx *x, int n, clx_fn fn, void *arg, cohort_status want,
    const char *what)
{
	struct et_each e = { fn, arg };
	cohort_status st[CLX_MAX];

	clx_run(x, n, et_if_open, &e, 30000, st);
	for (int r = 0; r < n; r++)
		ck_assert_msg(x->c[r] == NULL || st[r] == want,
		    "%s: rank %d: %s, expected %s (%s)", what, r,
		    cohort_status_name(st[r]), cohort_status_name(want),
		    x->c[r] != NULL
		        ? cohort_group_last_error(cohort_client_world(x->c[r]))
		        : "");
}

/* Drops rank r's connection (its process "ends") while the others wait
 * in a barrier; the barrier returns want on every survivor. */
static void
et_lose(struct clx *x, int n, int r, cohort_status want)
{
	struct clx_bg *bg[CLX_MAX];

	for (int i = 0; i < n; i++)
		bg[i] = i != r && x->c[i] != NULL
		    ? clx_bg_start(x, i, et_barrier, NULL)
		    : NULL;
	for (int i = 0; i < n; i++)
		if (bg[i] != NULL) {
			clx_wait_parked(x, i, i);
			break;
		}
	cohort__coord_drop(x->c[r]->coord, "dropped by the test");
	for (int i = 0; i < n; i++) {
		cohort_status st;

		if (bg[i] == NULL)
			continue;
		st = clx_bg_join(bg[i], 10000, NULL);
		ck_assert_msg(st == want, "rank %d: %s, expected %s: %s", i,
		    cohort_status_name(st), cohort_status_name(want),
		    cohort_group_last_error(cohort_client_world(x->c[i])));
	}
	cohort_client_close(x->c[r]);
	x->c[r] = NULL;
}

START_TEST(test_not_elastic_refuses_a_reform)
{
	struct clx x;
	cohort_boundary b;
	int32_t lo = -1, hi = -1;
	void *got = NULL;
	size_t len = 0;

	clx_start(&x, "plain");
	clx_join(&x, 2);
	ck_assert_cohort_err(
	    cohort_client_reform(x.c[0], NULL, 1000), COHORT_ENOTSUP);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "not elastic"));
	cohort_client_elastic_range(x.c[0], &lo, &hi);
	ck_assert_int_eq(lo, 0);
	ck_assert_int_eq(hi, 0);
	/* the boundary is a barrier; nothing to transfer */
	ck_assert_cohort_err(
	    cohort_state_transfer(x.c[1], NULL, 0, &got, &len, 1000),
	    COHORT_ESTATE);
	ck_assert_cohort_err(
	    cohort_client_reform(NULL, NULL, 1000), COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_step_boundary(x.c[0], NULL, 1000), COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_step_boundary(NULL, &b, 1000), COHORT_EINVAL);
	clx_stop(&x);
}
END_TEST

static cohort_status
et_boundary(struct clx *x, int rank, void *arg)
{
	cohort_boundary *b = arg;

	return (cohort_step_boundary(x->c[rank], &b[rank], 10000));
}

START_TEST(test_boundary_of_a_job_that_is_not_elastic_is_a_barrier)
{
	struct clx x;
	cohort_boundary b[2];

	clx_start(&x, "plainb");
	clx_join(&x, 2);
	et_all(&x, 2, et_boundary, b, COHORT_OK, "boundary");
	for (int r = 0; r < 2; r++) {
		ck_assert(!b[r].changed);
		ck_assert_int_eq(b[r].role, COHORT_STATE_NONE);
		ck_assert_int_eq(b[r].sender, -1);
	}
	clx_stop(&x);
}
END_TEST

/* Subgroups of the test: "odd" = job ranks 1, 3; "tail" = 1, 2, 3. */
struct et_groups {
	cohort_group *odd[CLX_MAX], *tail[CLX_MAX];
};

static cohort_status
et_make_groups(struct clx *x, int rank, void *arg)
{
	struct et_groups *g = arg;
	static const int32_t odd[] = { 1, 3 }, tail[] = { 1, 2, 3 };
	cohort_status st = COHORT_OK;

	if (rank == 1 || rank == 3)
		st = cohort_group_new(
		    x->c[rank], "odd", odd, 2, NULL, &g->odd[rank], 10000);
	if (st == COHORT_OK && rank >= 1)
		st = cohort_group_new(
		    x->c[rank], "tail", tail, 3, NULL, &g->tail[rank], 10000);
	return (st);
}

static cohort_status
et_sub_allreduce(struct clx *x, int rank, void *arg)
{
	struct et_groups *g = arg;
	cohort_group *sg[2] = { g->odd[rank], g->tail[rank] };

	for (int i = 0; i < 2; i++) {
		float v = 1.0f;
		cohort_status st;

		if (sg[i] == NULL)
			continue;
		st = cohort_allreduce(
		    sg[i], &v, &v, 1, COHORT_F32, COHORT_SUM, NULL, 10000);
		if (st != COHORT_OK)
			return (st);
		ck_assert_msg(v == (float)cohort_group_size(sg[i]),
		    "rank %d: group of %d summed %g", rank,
		    cohort_group_size(sg[i]), (double)v);
	}
	return (COHORT_OK);
}

/* The world and two subgroups through a loss, on the data plane of
 * `backend` (host: tcp mesh; service: gathers through cohortd). */
static void
et_shrink(const char *backend)
{
	struct clx x;
	struct et_groups g;
	cohort_reform_info info[CLX_MAX];
	cohort_failure f = COHORT_FAILURE_INIT;
	uint64_t gen;
	int64_t t0;

	memset(&g, 0, sizeof(g));
	memset(info, 0, sizeof(info));
	clx_start(&x, "shrink");
	et_join(&x, 4, 2, backend);
	gen = cohort_client_generation(x.c[0]);
	et_all(&x, 4, et_make_groups, &g, COHORT_OK, "groups");
	et_all(&x, 4, et_allreduce, NULL, COHORT_OK, "allreduce of 4");
	et_all(&x, 4, et_sub_allreduce, &g, COHORT_OK, "subgroups of 4");

	/* rank 2 is lost while the others wait in a barrier */
	t0 = th_now_ms();
	et_lose(&x, 4, 2, COHORT_EMEMBERSHIP);
	for (int r = 0; r < 4; r++) {
		if (x.c[r] == NULL)
			continue;
		ck_assert_cohort_err(
		    cohort_client_error(x.c[r]), COHORT_EMEMBERSHIP);
		ck_assert_cohort_ok(
		    cohort_group_failure(cohort_client_world(x.c[r]), &f));
		ck_assert_int_eq(f.status, COHORT_EMEMBERSHIP);
		ck_assert_int_eq(f.kind, COHORT_FAILURE_PROCESS);
		ck_assert_int_eq(f.rank, 2);
		/* sticky on every group until the reform */
		ck_assert_cohort_err(
		    cohort_barrier(cohort_client_world(x.c[r]), "again", 1000),
		    COHORT_EMEMBERSHIP);
		if (g.tail[r] != NULL)
			ck_assert_int_eq(
			    cohort_group_error(g.tail[r]), COHORT_EMEMBERSHIP);
	}
	et_all(&x, 4, et_reform, info, COHORT_OK, "reform");
	printf("elastic (%s): lost member -> survivors reformed in %lld ms\n",
	    backend, (long long)(th_now_ms() - t0));
	/* dense ranks in the old order: 0 -> 0, 1 -> 1, 3 -> 2 */
	for (int r = 0; r < 4; r++) {
		int want = r < 2 ? r : 2;

		if (x.c[r] == NULL)
			continue;
		ck_assert_uint_eq(info[r].generation, gen + 1);
		ck_assert_uint_eq(info[r].prev_generation, gen);
		ck_assert_int_eq(info[r].rank, want);
		ck_assert_int_eq(info[r].prev_rank, r);
		ck_assert_int_eq(info[r].world_size, 3);
		ck_assert_int_eq(info[r].prev_world_size, 4);
		ck_assert_int_eq(info[r].lost, 1);
		ck_assert_int_eq(info[r].joined, 0);
		ck_assert_int_eq(cohort_client_rank(x.c[r]), want);
		ck_assert_int_eq(cohort_client_world_size(x.c[r]), 3);
		ck_assert_uint_eq(cohort_client_generation(x.c[r]), gen + 1);
		ck_assert_cohort_ok(cohort_client_error(x.c[r]));
		ck_assert(
		    cohort_group_is_healthy(cohort_client_world(x.c[r])));
	}
	/* the subgroups keep their survivors in their old order */
	ck_assert_int_eq(cohort_group_size(g.odd[1]), 2);
	ck_assert_int_eq(cohort_group_rank(g.odd[3]), 1);
	ck_assert_int_eq(cohort_group_global_rank(g.odd[3], 1), 2);
	ck_assert_int_eq(cohort_group_size(g.tail[1]), 2);
	ck_assert_int_eq(cohort_group_global_rank(g.tail[1], 0), 1);
	ck_assert_int_eq(cohort_group_global_rank(g.tail[1], 1), 2);
	/* a fresh data plane and control plane in the new generation */
	et_all(&x, 4, et_allreduce, NULL, COHORT_OK, "allreduce of 3");
	et_all(&x, 4, et_sub_allreduce, &g, COHORT_OK, "subgroups of 3");
	et_all(&x, 4, et_barrier, NULL, COHORT_OK, "barrier of 3");
	/* nothing more to do */
	ck_assert_cohort_ok(cohort_client_reform(x.c[0], &info[0], 5000));
	ck_assert_uint_eq(info[0].generation, info[0].prev_generation);
	clx_stop(&x);
}

START_TEST(test_lost_member_moves_the_survivors_in_process)
{
	et_shrink("host");
}
END_TEST

START_TEST(test_lost_member_moves_the_survivors_service_backend)
{
	et_shrink("service");
}
END_TEST

/* Ranks 0 and 1 all-reduce on the world; rank 2 never does. */
static cohort_status
et_allreduce_01(struct clx *x, int rank, void *arg)
{
	float v[1024];

	(void)arg;
	for (int i = 0; i < 1024; i++)
		v[i] = 1.0f;
	return (cohort_allreduce(cohort_client_world(x->c[rank]), v, v, 1024,
	    COHORT_F32, COHORT_SUM, NULL, 20000));
}

START_TEST(test_data_plane_wait_on_a_lost_member_says_emembership)
{
	struct clx x;
	struct clx_bg *bg[2];
	cohort_reform_info info[CLX_MAX];
	int64_t ms;

	clx_start(&x, "dpwait");
	et_join(&x, 3, 2, "host");
	for (int r = 0; r < 2; r++)
		bg[r] = clx_bg_start(&x, r, et_allreduce_01, NULL);
	usleep(200 * 1000); /* they are in it, waiting for rank 2 */
	cohort__coord_drop(x.c[2]->coord, "dropped by the test");
	for (int r = 0; r < 2; r++) {
		cohort_status st = clx_bg_join(bg[r], 15000, &ms);

		ck_assert_msg(st == COHORT_EMEMBERSHIP,
		    "rank %d: %s after %lld ms: %s", r, cohort_status_name(st),
		    (long long)ms,
		    cohort_group_last_error(cohort_client_world(x.c[r])));
		ck_assert_ptr_nonnull(strstr(
		    cohort_group_last_error(cohort_client_world(x.c[r])),
		    "rank 2"));
	}
	cohort_client_close(x.c[2]);
	x.c[2] = NULL;
	et_all(&x, 3, et_reform, info, COHORT_OK, "reform");
	et_all(&x, 3, et_allreduce, NULL, COHORT_OK, "allreduce of 2");
	clx_stop(&x);
}
END_TEST

START_TEST(test_below_the_minimum_the_job_stops)
{
	struct clx x;
	cohort_reform_info info[CLX_MAX];

	clx_start(&x, "belowmin");
	et_join(&x, 3, 3, "service");
	et_lose(&x, 3, 1, COHORT_EPEERLOST);
	for (int r = 0; r < 3; r += 2) {
		ck_assert_cohort_err(
		    cohort_client_error(x.c[r]), COHORT_EPEERLOST);
		ck_assert_msg(strstr(cohort_group_last_error(
		                         cohort_client_world(x.c[r])),
		                  "minimum")
		        != NULL,
		    "%s",
		    cohort_group_last_error(cohort_client_world(x.c[r])));
		ck_assert_cohort_err(
		    cohort_client_reform(x.c[r], &info[r], 5000),
		    COHORT_EPEERLOST);
	}
	clx_stop(&x);
}
END_TEST

/* A process opening into the running job (it waits at cohortd until a
 * boundary admits it). */
static cohort_status
et_open_joiner(struct clx *x, int rank, void *arg)
{
	return (et_open_one(x, rank, arg));
}

/* cohortd counts n joiners waiting. */
struct et_wj {
	struct clx *x;
	int asker;
	uint32_t n;
};

static bool
et_enough_joiners(const Cohort__JobStatus *js, void *arg)
{
	const struct et_wj *w = arg;

	return (js->joiners_waiting >= w->n);
}

static bool
et_joiners_waiting(void *arg)
{
	struct et_wj *w = arg;

	return (clx_job_status(w->x, w->asker, et_enough_joiners, w));
}

#define ET_STATE_LEN (3 * 1024 * 1024 + 7)

static cohort_status
et_transfer(struct clx *x, int rank, void *arg)
{
	cohort_boundary *b = arg;
	uint8_t *state = NULL, *got = NULL;
	size_t len = 0;
	cohort_status st;

	if (b[rank].role == COHORT_STATE_SEND) {
		state = malloc(ET_STATE_LEN);
		ck_assert_ptr_nonnull(state);
		for (size_t i = 0; i < ET_STATE_LEN; i++)
			state[i] = (uint8_t)(i * 7 + 3);
	}
	st = cohort_state_transfer(
	    x->c[rank], state, ET_STATE_LEN, (void **)&got, &len, 20000);
	if (st == COHORT_OK && b[rank].role == COHORT_STATE_RECV) {
		ck_assert_uint_eq(len, ET_STATE_LEN);
		for (size_t i = 0; i < ET_STATE_LEN; i++)
			if (got[i] != (uint8_t)(i * 7 + 3))
				ck_abort_msg(
				    "rank %d: byte %zu differs", rank, i);
		cohort_free(got);
	}
	free(state);
	return (st);
}

/* Job (a range of 1..3 on "host"): 3 join, rank 2 is lost and 0 and 1
 * reform into a world of 2, then a new process asks to join and is
 * admitted as rank 2 at the boundary of 0 and 1 (b, zeroed first).
 * Returns the generation of the world of 2. */
static uint64_t
et_lose_then_grow(struct clx *x, const char *job, cohort_boundary *b)
{
	struct et_open a = { 3, 1, "host" };
	struct et_wj w = { x, 0, 1 };
	cohort_reform_info info[CLX_MAX];
	struct clx_bg *joiner;
	uint64_t gen;

	memset(b, 0, sizeof(*b) * CLX_MAX);
	clx_start(x, job);
	et_join(x, 3, 1, "host");
	/* rank 2 is lost: 0 and 1 go on as a world of 2 */
	et_lose(x, 3, 2, COHORT_EMEMBERSHIP);
	et_all(x, 3, et_reform, info, COHORT_OK, "reform");
	gen = cohort_client_generation(x->c[0]);
	/* a new process asks to join; it waits for the next boundary */
	joiner = clx_bg_start(x, 2, et_open_joiner, &a);
	ck_assert_msg(th_wait_until(et_joiners_waiting, &w, 200, 25),
	    "cohortd never counted the joiner");
	et_all(x, 2, et_boundary, b, COHORT_OK, "boundary");
	ck_assert_cohort_ok(clx_bg_join(joiner, 10000, NULL));
	return (gen);
}

START_TEST(test_joiner_is_admitted_at_a_boundary_and_gets_the_state)
{
	struct clx x;
	cohort_boundary b[CLX_MAX];
	uint64_t gen = et_lose_then_grow(&x, "grow", b);

	x.n = 3;
	for (int r = 0; r < 2; r++) {
		ck_assert(b[r].changed);
		ck_assert_uint_eq(b[r].reform.generation, gen + 1);
		ck_assert_int_eq(b[r].reform.rank, r);
		ck_assert_int_eq(b[r].reform.world_size, 3);
		ck_assert_int_eq(b[r].reform.joined, 1);
		ck_assert_int_eq(b[r].sender, 0);
		ck_assert_int_eq(b[r].receivers, 1);
		ck_assert_int_eq(
		    b[r].role, r == 0 ? COHORT_STATE_SEND : COHORT_STATE_NONE);
	}
	ck_assert_int_eq(cohort_client_rank(x.c[2]), 2);
	ck_assert_int_eq(cohort_client_world_size(x.c[2]), 3);
	ck_assert_uint_eq(cohort_client_generation(x.c[2]), gen + 1);
	/* the joiner's first boundary answers at once: receive */
	ck_assert_cohort_ok(cohort_step_boundary(x.c[2], &b[2], 10000));
	ck_assert(!b[2].changed);
	ck_assert_int_eq(b[2].role, COHORT_STATE_RECV);
	ck_assert_int_eq(b[2].sender, 0);
	/* the sender must transfer before its next boundary */
	{
		cohort_boundary again;

		ck_assert_cohort_err(
		    cohort_step_boundary(x.c[0], &again, 1000), COHORT_ESTATE);
		ck_assert_ptr_nonnull(
		    strstr(cohort_last_error(), "cohort_state_transfer"));
	}
	et_all(&x, 3, et_transfer, b, COHORT_OK, "state transfer");
	/* everyone holds the state: the next boundary names no transfer */
	et_all(&x, 3, et_boundary, b, COHORT_OK, "boundary after");
	for (int r = 0; r < 3; r++) {
		ck_assert(!b[r].changed);
		ck_assert_int_eq(b[r].role, COHORT_STATE_NONE);
	}
	et_all(&x, 3, et_allreduce, NULL, COHORT_OK, "allreduce of 3");
	clx_stop(&x);
}
END_TEST

START_TEST(test_joiner_lost_during_the_transfer)
{
	struct clx x;
	cohort_reform_info info[CLX_MAX];
	cohort_boundary b[CLX_MAX];
	struct clx_bg *send;
	cohort_status st;

	(void)et_lose_then_grow(&x, "xferlost", b);
	ck_assert_int_eq(b[0].role, COHORT_STATE_SEND);
	/* the sender starts; the joiner is lost before it takes part */
	send = clx_bg_start(&x, 0, et_transfer, b);
	usleep(300 * 1000);
	cohort__coord_drop(x.c[2]->coord, "dropped by the test");
	st = clx_bg_join(send, 15000, NULL);
	ck_assert_msg(st == COHORT_EMEMBERSHIP, "sender: %s: %s",
	    cohort_status_name(st), cohort_last_error());
	cohort_client_close(x.c[2]);
	x.c[2] = NULL;
	/* rank 1 had no part in it: it learns at its next call */
	ck_assert_cohort_ok(
	    cohort_state_transfer(x.c[1], NULL, 0, NULL, NULL, 1000));
	et_all(&x, 2, et_reform, info, COHORT_OK, "reform after");
	ck_assert_int_eq(info[0].world_size, 2);
	et_all(&x, 2, et_boundary, b, COHORT_OK, "boundary after");
	ck_assert_int_eq(b[0].role, COHORT_STATE_NONE);
	ck_assert_int_eq(b[1].role, COHORT_STATE_NONE);
	et_all(&x, 2, et_allreduce, NULL, COHORT_OK, "allreduce of 2");
	clx_stop(&x);
}
END_TEST

UNIT_SUITE(elastic, "elastic", 90, test_not_elastic_refuses_a_reform,
    test_boundary_of_a_job_that_is_not_elastic_is_a_barrier,
    test_lost_member_moves_the_survivors_in_process,
    test_lost_member_moves_the_survivors_service_backend,
    test_data_plane_wait_on_a_lost_member_says_emembership,
    test_below_the_minimum_the_job_stops,
    test_joiner_is_admitted_at_a_boundary_and_gets_the_state,
    test_joiner_lost_during_the_transfer)
