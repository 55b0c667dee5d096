/*
 * test_collectives.c - the collectives path of libcohort (client/
 * collectives.c: argument checks, ordering, sticky errors) and the
 * service backend over the group's coordinator channel (backend.h v2),
 * against a real cohortd core embedded in the test
 * (tests/harness/cl_fixture.h). Ranks are threads of the test.
 *
 * The tcp and nccl backends have their own suites (tcp*, nccl) and the
 * same collectives run across real processes in integration_collectives.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cl_fixture.h"
#include "unit_suite.h"

Suite *suite_collectives(void);

#define CO_N 3

static cohort_group *
co_world(struct clx *x, int rank)
{
	return (cohort_client_world(x->c[rank]));
}

/* ------------------------------------------------------------------------ */
/* Results                                                                  */
/* ------------------------------------------------------------------------ */

/* What each rank got, checked by the test's main thread. */
struct co_out {
	float f32[CO_N][128];
	double f64[CO_N][8];
	int32_t i32[CO_N][64];
	int64_t i64[CO_N][16];
	uint8_t u8[CO_N][16];
};

static cohort_status
co_reductions(struct clx *x, int rank, void *arg)
{
	struct co_out *o = arg;
	cohort_group *g = co_world(x, rank);
	float f[5];
	double d[3];
	int32_t i[4];
	int64_t p = rank + 2, *root_out = rank == 1 ? &o->i64[rank][0] : NULL;
	cohort_status st;

	for (int k = 0; k < 5; k++)
		f[k] = (float)(rank * 10 + k);
	for (int k = 0; k < 3; k++)
		d[k] = rank + k * 0.5;
	for (int k = 0; k < 4; k++)
		i[k] = (rank == k % CO_N) ? 100 + k : -k;
	if ((st = cohort_allreduce(
	         g, f, o->f32[rank], 5, COHORT_F32, COHORT_SUM, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_allreduce(g, d, o->f64[rank], 3, COHORT_F64,
	            COHORT_MEAN, NULL, 5000))
	        != COHORT_OK
	    /* in place */
	    || (st = cohort_allreduce(
	            g, i, i, 4, COHORT_I32, COHORT_MAX, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_reduce(g, &p, root_out, 1, COHORT_I64, COHORT_PROD,
	            1, NULL, 5000))
	        != COHORT_OK)
		return (st);
	memcpy(o->i32[rank], i, sizeof(i));
	return (COHORT_OK);
}

START_TEST(test_service_reductions)
{
	struct clx x;
	struct co_out *o = calloc(1, sizeof(*o));
	cohort_status st[CO_N];

	clx_start(&x, "red");
	clx_join(&x, CO_N);
	ck_assert_str_eq(cohort_group_backend(co_world(&x, 0)), "service");
	clx_run(&x, CO_N, co_reductions, o, 20000, st);
	for (int r = 0; r < CO_N; r++) {
		ck_assert_msg(st[r] == COHORT_OK, "rank %d: %s", r,
		    cohort_status_name(st[r]));
		for (int k = 0; k < 5; k++)
			ck_assert_float_eq(o->f32[r][k], (float)(30 + 3 * k));
		for (int k = 0; k < 3; k++)
			ck_assert_double_eq(o->f64[r][k], 1.0 + k * 0.5);
		for (int k = 0; k < 4; k++)
			ck_assert_int_eq(o->i32[r][k], 100 + k);
	}
	ck_assert_int_eq(o->i64[1][0], 2 * 3 * 4);
	free(o);
	clx_stop(&x);
}
END_TEST

/* Every shape, with replies cut into chunks of 40 bytes
 * (COHORT_SERVICE_CHUNK): a result is put together from many gathers. */
static cohort_status
co_shapes(struct clx *x, int rank, void *arg)
{
	struct co_out *o = arg;
	cohort_group *g = co_world(x, rank);
	float f[100], rs[CO_N * 4];
	int32_t ag[7], agv[5];
	int64_t a2a[CO_N * 2];
	static const size_t counts[CO_N] = { 3, 0, 5 };
	float sc[CO_N * 2];
	cohort_status st;

	for (int k = 0; k < 100; k++)
		f[k] = (float)(k * (rank + 1));
	for (int k = 0; k < 7; k++)
		ag[k] = rank * 100 + k;
	for (size_t k = 0; k < counts[rank]; k++)
		agv[k] = rank * 10 + (int32_t)k;
	for (int k = 0; k < CO_N * 4; k++)
		rs[k] = (float)(k + rank);
	for (int k = 0; k < CO_N * 2; k++)
		a2a[k] = rank * 1000 + k;
	for (int k = 0; k < CO_N * 2; k++)
		sc[k] = (float)(k * 3);
	if (rank == 2)
		for (int k = 0; k < 9; k++)
			o->u8[rank][k] = (uint8_t)(200 + k);
	if ((st = cohort_allreduce(
	         g, f, o->f32[rank], 100, COHORT_F32, COHORT_SUM, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_allgather(
	            g, ag, o->i32[rank], 7, COHORT_I32, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_allgatherv(
	            g, agv, o->i32[rank] + 32, counts, COHORT_I32, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_reduce_scatter(g, rs, o->f32[rank] + 100, 4,
	            COHORT_F32, COHORT_SUM, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_alltoall(
	            g, a2a, o->i64[rank], 2, COHORT_I64, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_broadcast(
	            g, o->u8[rank], 9, COHORT_U8, 2, NULL, 5000))
	        != COHORT_OK
	    || (st = cohort_scatter(g, rank == 1 ? sc : NULL,
	            o->f64[rank] /* 2 floats */, 2, COHORT_F32, 1, NULL, 5000))
	        != COHORT_OK)
		return (st);
	return (COHORT_OK);
}

START_TEST(test_service_chunks_every_shape)
{
	struct clx x;
	struct co_out *o = calloc(1, sizeof(*o));
	cohort_status st[CO_N];

	setenv("COHORT_SERVICE_CHUNK", "40", 1);
	clx_start(&x, "shapes");
	clx_join(&x, CO_N);
	clx_run(&x, CO_N, co_shapes, o, 30000, st);
	for (int r = 0; r < CO_N; r++) {
		const float *scat = (const float *)o->f64[r];

		ck_assert_msg(st[r] == COHORT_OK, "rank %d: %s", r,
		    cohort_status_name(st[r]));
		for (int k = 0; k < 100; k++)
			ck_assert_float_eq(o->f32[r][k], (float)(k * 6));
		for (int q = 0; q < CO_N; q++)
			for (int k = 0; k < 7; k++)
				ck_assert_int_eq(
				    o->i32[r][q * 7 + k], q * 100 + k);
		/* allgatherv: 3 from rank 0, none from 1, 5 from 2 */
		for (int k = 0; k < 3; k++)
			ck_assert_int_eq(o->i32[r][32 + k], k);
		for (int k = 0; k < 5; k++)
			ck_assert_int_eq(o->i32[r][35 + k], 20 + k);
		/* reduce_scatter: block r of sum over q of (k + q) */
		for (int k = 0; k < 4; k++)
			ck_assert_float_eq(
			    o->f32[r][100 + k], (float)(3 * (r * 4 + k) + 3));
		/* alltoall: from each q its block r */
		for (int q = 0; q < CO_N; q++)
			for (int k = 0; k < 2; k++)
				ck_assert_int_eq(o->i64[r][q * 2 + k],
				    q * 1000 + r * 2 + k);
		for (int k = 0; k < 9; k++)
			ck_assert_int_eq(o->u8[r][k], 200 + k);
		for (int k = 0; k < 2; k++)
			ck_assert_float_eq(scat[k], (float)((r * 2 + k) * 3));
	}
	free(o);
	clx_stop(&x);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Argument checks                                                          */
/* ------------------------------------------------------------------------ */

static void
co_refused(cohort_status st, const char *want)
{
	ck_assert_msg(st == COHORT_EINVAL, "expected COHORT_EINVAL, got %s",
	    cohort_status_name(st));
	ck_assert_msg(strstr(cohort_last_error(), want) != NULL,
	    "'%s' does not say '%s'", cohort_last_error(), want);
}

/* Refused before anything moves; the group stays healthy. */
START_TEST(test_arguments_refused_before_any_io)
{
	struct clx x;
	cohort_group *g;
	float a[8], b[8];
	int32_t i[4];
	int stream;
	cohort_work *w = NULL;

	clx_start(&x, "args");
	clx_join(&x, 1);
	g = co_world(&x, 0);
	co_refused(cohort_allreduce(
	               NULL, a, b, 4, COHORT_F32, COHORT_SUM, NULL, 1000),
	    "group is NULL");
	co_refused(cohort_allreduce(
	               g, NULL, b, 4, COHORT_F32, COHORT_SUM, NULL, 1000),
	    "send is NULL");
	co_refused(cohort_allreduce(
	               g, a, b, 4, (cohort_dtype)42, COHORT_SUM, NULL, 1000),
	    "invalid dtype 42");
	co_refused(cohort_allreduce(
	               g, a, b, 4, COHORT_F32, (cohort_redop)42, NULL, 1000),
	    "invalid op 42");
	co_refused(
	    cohort_allreduce(g, i, i, 4, COHORT_I32, COHORT_MEAN, NULL, 1000),
	    "MEAN is defined for floating-point types only");
	co_refused(cohort_allreduce(
	               g, a, a + 1, 4, COHORT_F32, COHORT_SUM, NULL, 1000),
	    "overlap partially");
	co_refused(cohort_broadcast(g, a, 4, COHORT_F32, 1, NULL, 1000),
	    "root 1 out of range");
	co_refused(cohort_allreduce(
	               g, a, b, 4, COHORT_F32, COHORT_SUM, &stream, 1000),
	    "stream must be NULL with the service backend");
	co_refused(
	    cohort_iallreduce(g, a, b, 4, COHORT_F32, COHORT_SUM, NULL, NULL),
	    "out is NULL");
	co_refused(cohort_allgatherv(g, a, b, NULL, COHORT_F32, NULL, 1000),
	    "counts is NULL");
	co_refused(cohort_alltoall(g, a, a, 4, COHORT_F32, NULL, 1000),
	    "cannot run in place");
	ck_assert_ptr_null(w);
	ck_assert(cohort_group_is_healthy(g));
	/* one rank: the result is the input */
	for (int k = 0; k < 4; k++)
		a[k] = (float)k;
	ck_assert_cohort_ok(
	    cohort_allreduce(g, a, b, 4, COHORT_F32, COHORT_SUM, NULL, 1000));
	ck_assert_int_eq(memcmp(a, b, 4 * sizeof(float)), 0);
	/* nothing to move: done at once, through the handle too */
	ck_assert_cohort_ok(
	    cohort_iallreduce(g, a, b, 0, COHORT_F32, COHORT_SUM, NULL, &w));
	ck_assert_cohort_ok(cohort_work_wait(w, 1000));
	cohort_work_free(w);
	clx_stop(&x);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Failures                                                                 */
/* ------------------------------------------------------------------------ */

static cohort_status
co_allreduce_long(struct clx *x, int rank, void *arg)
{
	float a[16] = { 0 }, b[16];

	(void)arg;
	return (cohort_allreduce(
	    co_world(x, rank), a, b, 16, COHORT_F32, COHORT_SUM, NULL, 15000));
}

/* A peer reports its failure while the others are blocked in a service
 * allreduce: they return at once with cohortd's record, and the group
 * stays failed. */
START_TEST(test_peer_failure_ends_a_blocked_allreduce)
{
	struct clx x;
	struct clx_bg *bg[2];
	cohort_failure f = COHORT_FAILURE_INIT;
	int64_t t0;

	clx_start(&x, "peer");
	clx_join(&x, CO_N);
	for (int r = 0; r < 2; r++) {
		bg[r] = clx_bg_start(&x, r, co_allreduce_long, NULL);
		clx_wait_parked(&x, 2, r);
	}
	t0 = th_now_ms();
	ck_assert_cohort_ok(
	    cohort_report_failure(x.c[2], "OOM in the data loader", 5000));
	for (int r = 0; r < 2; r++) {
		ck_assert_int_eq(
		    clx_bg_join(bg[r], 10000, NULL), COHORT_EPEERLOST);
		/* at once, not at the allreduce's 15 s timeout */
		ck_assert_int_lt(th_now_ms() - t0, 3000);
		ck_assert_cohort_ok(cohort_group_failure(co_world(&x, r), &f));
		ck_assert_int_eq(f.kind, COHORT_FAILURE_REPORTED);
		ck_assert_int_eq(f.rank, 2);
		ck_assert_str_eq(f.text, "OOM in the data loader");
		/* sticky, at once */
		ck_assert_int_eq(
		    co_allreduce_long(&x, r, NULL), COHORT_EPEERLOST);
		ck_assert_ptr_nonnull(
		    strstr(cohort_last_error(), "OOM in the data loader"));
	}
	clx_stop(&x);
}
END_TEST

START_TEST(test_abort_ends_a_blocked_allreduce)
{
	struct clx x;
	struct clx_bg *bg;
	cohort_failure f = COHORT_FAILURE_INIT;
	int64_t ms;

	clx_start(&x, "abort");
	clx_join(&x, 2);
	bg = clx_bg_start(&x, 0, co_allreduce_long, NULL);
	clx_wait_parked(&x, 1, 0);
	cohort_group_abort(co_world(&x, 0));
	ck_assert_int_eq(clx_bg_join(bg, 5000, &ms), COHORT_EABORTED);
	ck_assert_int_lt(ms, 5000);
	ck_assert_cohort_ok(cohort_group_failure(co_world(&x, 0), &f));
	ck_assert_int_eq(f.kind, COHORT_FAILURE_ABORTED);
	/* the other rank is not aborted by it */
	ck_assert(cohort_group_is_healthy(co_world(&x, 1)));
	clx_stop(&x);
}
END_TEST

/* An allreduce of count + rank * step elements, timeout ms; rank 0's
 * detail into why. */
struct co_ar {
	size_t count, step;
	cohort_duration timeout;
	char why[1024];
};

static cohort_status
co_allreduce_args(struct clx *x, int rank, void *arg)
{
	struct co_ar *a = arg;
	float in[16] = { 0 }, out[16];
	cohort_status st;

	st = cohort_allreduce(co_world(x, rank), in, out,
	    a->count + (size_t)rank * a->step, COHORT_F32, COHORT_SUM, NULL,
	    a->timeout);
	if (rank == 0)
		snprintf(a->why, sizeof(a->why), "%s", cohort_last_error());
	return (st);
}

/* cohortd compares what the members of a channel gather call: ranks that
 * disagree all hear it, with both sides named. */
START_TEST(test_disagreeing_ranks_are_told)
{
	struct clx x;
	cohort_status st[2];
	struct co_ar a = { 4, 1, 5000, "" };

	clx_start(&x, "mm");
	clx_join(&x, 2);
	clx_run(&x, 2, co_allreduce_args, &a, 15000, st);
	ck_assert_int_eq(st[0], COHORT_EMISMATCH);
	ck_assert_int_eq(st[1], COHORT_EMISMATCH);
	ck_assert_msg(strstr(a.why, "count 4") != NULL
	        && strstr(a.why, "count 5") != NULL,
	    "%s", a.why);
	clx_stop(&x);
}
END_TEST

/* Rank 2 never enters: the others time out naming it, and the group is
 * failed (the data plane's state is unknown) with a TIMEOUT record. */
START_TEST(test_timeout_names_the_missing_rank)
{
	struct clx x;
	cohort_status st[2];
	cohort_failure f = COHORT_FAILURE_INIT;
	struct co_ar a = { 4, 0, 800, "" };

	clx_start(&x, "late");
	clx_join(&x, CO_N);
	clx_run(&x, 2, co_allreduce_args, &a, 15000, st);
	ck_assert_int_eq(st[0], COHORT_ETIMEDOUT);
	ck_assert_int_eq(st[1], COHORT_ETIMEDOUT);
	ck_assert_has(a.why, "2");
	ck_assert_cohort_ok(cohort_group_failure(co_world(&x, 0), &f));
	ck_assert_int_eq(f.status, COHORT_ETIMEDOUT);
	ck_assert_int_eq(f.kind, COHORT_FAILURE_TIMEOUT);
	ck_assert_str_eq(f.operation, "allreduce");
	ck_assert_uint_eq(f.seq, 1);
	ck_assert_str_eq(f.group, "");
	ck_assert_int_eq(f.rank, -1);
	ck_assert(cohort_group_is_healthy(co_world(&x, 2)));
	clx_stop(&x);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A subgroup                                                               */
/* ------------------------------------------------------------------------ */

static cohort_status
co_pair(struct clx *x, int rank, void *arg)
{
	static const int32_t ranks[] = { 0, 2 };
	int64_t *out = arg;
	cohort_group *g = NULL;
	int64_t v = rank + 1;
	cohort_status st;

	if (rank == 1)
		return (COHORT_OK);
	if ((st = cohort_group_new(
	         x->c[rank], "pair", ranks, 2, "service", &g, 5000))
	    != COHORT_OK)
		return (st);
	if (cohort_group_size(g) != 2 || cohort_group_global_rank(g, 1) != 2
	    || strcmp(cohort_group_backend(g), "service") != 0)
		st = COHORT_EPROTO;
	else
		st = cohort_allreduce(
		    g, &v, &out[rank], 1, COHORT_I64, COHORT_SUM, NULL, 5000);
	cohort_group_destroy(g);
	return (st);
}

START_TEST(test_subgroup_through_the_service)
{
	struct clx x;
	int64_t out[CO_N] = { 0 };
	cohort_status st[CO_N];

	clx_start(&x, "pair");
	clx_join(&x, CO_N);
	clx_run(&x, CO_N, co_pair, out, 15000, st);
	for (int r = 0; r < CO_N; r++)
		ck_assert_msg(st[r] == COHORT_OK, "rank %d: %s", r,
		    cohort_status_name(st[r]));
	ck_assert_int_eq(out[0], 4);
	ck_assert_int_eq(out[2], 4);
	ck_assert_int_eq(out[1], 0);
	clx_stop(&x);
}
END_TEST

UNIT_SUITE(collectives, "collectives", 60, test_service_reductions,
    test_service_chunks_every_shape, test_arguments_refused_before_any_io,
    test_peer_failure_ends_a_blocked_allreduce,
    test_abort_ends_a_blocked_allreduce, test_disagreeing_ranks_are_told,
    test_timeout_names_the_missing_rank, test_subgroup_through_the_service)
