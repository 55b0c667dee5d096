/*
 * test_srv_coll.c - cohortd's control-plane collectives without sockets:
 * barrier, broadcast, reduce_scalars, decide, service gather, mismatch,
 * timeout with retry, group creation, the time each member was parked.
 */
#include <string.h>

#include "srv_fixture.h"
#include "unit_suite.h"

Suite *suite_srv_coll(void);

START_TEST(test_barrier_parks_until_all)
{
	struct srq_cli c[3];
	uintptr_t t[3];

	fx_form(f, c, 3, "j");
	t[0] = fx_barrier(f, &c[0], "b", 1, 60000);
	t[1] = fx_barrier(f, &c[1], "b", 1, 60000);
	ck_assert_ptr_null(fx_get(f, t[0]));
	ck_assert_ptr_null(fx_get(f, t[1]));
	t[2] = fx_barrier(f, &c[2], "b", 1, 60000);
	for (int i = 0; i < 3; i++)
		fx_want(f, t[i], COHORT_OK);
	ck_assert_uint_eq(f->core->nparked, 0);
	/* the same op_seq twice from one rank is refused */
	fx_barrier(f, &c[0], "b", 2, 60000);
	fx_want(f, fx_barrier(f, &c[0], "b", 2, 60000), COHORT_EINVAL);
}
END_TEST

START_TEST(test_broadcast)
{
	struct srq_cli c[3];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t1, t0, t2;

	fx_form(f, c, 3, "j");
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BROADCAST;
	co.name = "model";
	co.root = 0;
	co.op_seq = 1;
	t1 = fx_coll(f, &c[1], &co, 60000, NULL, 0);
	ck_assert_ptr_null(fx_get(f, t1));
	t0 = fx_coll(f, &c[0], &co, 60000, "weights", 7);
	fx_want(f, t0, COHORT_OK);
	fx_want(f, t1, COHORT_OK);
	ck_assert(fx_payload_is(f, t1, "weights"));
	t2 = fx_coll(f, &c[2], &co, 60000, NULL, 0);
	ck_assert(fx_payload_is(f, t2, "weights"));
	ck_assert_uint_eq(f->core->jobs.n, 1);
	/* released after everyone had it */
	{
		struct srv_job *job = SRV_CONTAINER(
		    srv_map_get(&f->core->jobs, "j", 1), struct srv_job, hn);
		ck_assert_uint_eq(job->colls.n, 0);
	}
	/* a non-root payload or a bad root */
	co.op_seq = 2;
	fx_want(f, fx_coll(f, &c[1], &co, 0, "x", 1), COHORT_EINVAL);
	co.root = 3;
	fx_want(f, fx_coll(f, &c[1], &co, 0, NULL, 0), COHORT_EINVAL);
}
END_TEST

START_TEST(test_reduce_scalars)
{
	struct srq_cli c[3];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t[3];
	int64_t iv[3][2] = { { 1, 7 }, { 2, -3 }, { 3, 5 } };
	double dv[3] = { 1.0, 2.0, 6.0 };
	Cohort__Reply *r;

	fx_form(f, c, 3, "j");
	co.kind = COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS;
	co.scalar_type = COHORT__SCALAR_TYPE__SCALAR_I64;
	co.op = COHORT_SUM;
	co.op_seq = 1;
	co.n_i64s = 2;
	for (int i = 0; i < 3; i++) {
		co.i64s = iv[i];
		t[i] = fx_coll(f, &c[i], &co, 60000, NULL, 0);
	}
	r = fx_want(f, t[1], COHORT_OK);
	ck_assert_uint_eq(r->collective->n_i64s, 2);
	ck_assert_int_eq(r->collective->i64s[0], 6);
	ck_assert_int_eq(r->collective->i64s[1], 9);
	co.op = COHORT_MAX;
	co.op_seq = 2;
	for (int i = 0; i < 3; i++) {
		co.i64s = iv[i];
		t[i] = fx_coll(f, &c[i], &co, 60000, NULL, 0);
	}
	ck_assert_int_eq(fx_want(f, t[0], COHORT_OK)->collective->i64s[1], 7);
	co.scalar_type = COHORT__SCALAR_TYPE__SCALAR_F64;
	co.op = COHORT_MEAN;
	co.op_seq = 3;
	co.n_i64s = 0;
	co.n_f64s = 1;
	for (int i = 0; i < 3; i++) {
		co.f64s = &dv[i];
		t[i] = fx_coll(f, &c[i], &co, 60000, NULL, 0);
	}
	r = fx_want(f, t[2], COHORT_OK);
	ck_assert_double_eq_tol(r->collective->f64s[0], 3.0, 1e-12);
	/* validation */
	co.op_seq = 4;
	co.scalar_type = 7;
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_EINVAL);
	co.scalar_type = COHORT__SCALAR_TYPE__SCALAR_I64;
	co.n_f64s = 0;
	co.n_i64s = 1;
	co.i64s = iv[0];
	co.op = COHORT_MEAN;
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_EINVAL);
	co.op = 99;
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_EINVAL);
	co.op = COHORT_SUM;
	co.op_seq = 0;
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_EINVAL);
	co.op_seq = 5;
	co.kind = 99;
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_ENOTSUP);
}
END_TEST

START_TEST(test_decide)
{
	struct srq_cli c[2];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t[2];

	fx_form(f, c, 2, "j");
	co.kind = COHORT__COLLECTIVE_KIND__COLL_DECIDE;
	co.op_seq = 1;
	co.decide_all = true;
	co.decision = true;
	t[0] = fx_coll(f, &c[0], &co, 60000, NULL, 0);
	co.decision = false;
	t[1] = fx_coll(f, &c[1], &co, 60000, NULL, 0);
	ck_assert(!fx_want(f, t[0], COHORT_OK)->collective->decision);
	ck_assert(!fx_want(f, t[1], COHORT_OK)->collective->decision);
	co.op_seq = 2;
	co.decide_all = false;
	t[0] = fx_coll(f, &c[0], &co, 60000, NULL, 0);
	co.decision = true;
	t[1] = fx_coll(f, &c[1], &co, 60000, NULL, 0);
	ck_assert(fx_want(f, t[0], COHORT_OK)->collective->decision);
}
END_TEST

START_TEST(test_service_gather)
{
	struct srq_cli c[3];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	const char *blk[3] = { "aa", "b", "cccc" };
	uintptr_t t[3];
	Cohort__Reply *r;

	fx_form(f, c, 3, "j");
	co.kind = COHORT__COLLECTIVE_KIND__COLL_SERVICE;
	co.op_seq = 1;
	co.service_op = 3;
	co.dtype = COHORT_U8;
	for (int i = 2; i >= 0; i--)
		t[i] = fx_coll(f, &c[i], &co, 60000, blk[i], strlen(blk[i]));
	r = fx_want(f, t[1], COHORT_OK);
	ck_assert_uint_eq(r->collective->n_i64s, 3);
	ck_assert_int_eq(r->collective->i64s[2], 4);
	ck_assert(fx_payload_is(f, t[1], "aabcccc"));
	ck_assert(fx_payload_is(f, t[0], "aabcccc"));
}
END_TEST

START_TEST(test_mismatch)
{
	struct srq_cli c[3];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t0, t1, t2;
	Cohort__Reply *r;

	fx_form(f, c, 3, "j");
	t0 = fx_barrier(f, &c[0], "alpha", 1, 60000);
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BROADCAST;
	co.name = "beta";
	co.op_seq = 1;
	co.root = 0;
	t1 = fx_coll(f, &c[1], &co, 60000, NULL, 0);
	r = fx_want(f, t0, COHORT_EMISMATCH);
	ck_assert_msg(strstr(r->error, "rank 0 called barrier 'alpha'")
	        && strstr(r->error, "rank 1 called broadcast 'beta'"),
	    "%s", r->error);
	fx_want(f, t1, COHORT_EMISMATCH);
	/* the late rank hears it too */
	t2 = fx_barrier(f, &c[2], "alpha", 1, 60000);
	fx_want(f, t2, COHORT_EMISMATCH);
	/* and the next collective works */
	t0 = fx_barrier(f, &c[0], "n", 2, 60000);
	fx_barrier(f, &c[1], "n", 2, 60000);
	fx_barrier(f, &c[2], "n", 2, 60000);
	fx_want(f, t0, COHORT_OK);
}
END_TEST

START_TEST(test_timeout_names_missing_and_retry)
{
	struct srq_cli c[4];
	uintptr_t t0, t1;
	Cohort__Reply *r;

	fx_form(f, c, 4, "j");
	fx_barrier(f, &c[1], "x", 5, 60000);
	t0 = fx_barrier(f, &c[0], "x", 5, 3000);
	fx_tick(f, 3000);
	r = fx_want(f, t0, COHORT_ETIMEDOUT);
	ck_assert_uint_eq(r->n_missing_ranks, 2);
	ck_assert_int_eq(r->missing_ranks[0], 2);
	ck_assert_int_eq(r->missing_ranks[1], 3);
	ck_assert_has(r->error,
	    "barrier 'x' (#5) timed out after 3.0 s; ranks 2, 3 never "
	    "arrived");
	/* retry with the same op_seq (new request seq) */
	t1 = fx_barrier(f, &c[0], "x", 5, 30000);
	fx_barrier(f, &c[2], "x", 5, 30000);
	fx_barrier(f, &c[3], "x", 5, 30000);
	fx_want(f, t1, COHORT_OK);
}
END_TEST

/* Two ranks whose deadlines fall close together: the later one names the
 * rank that never came, not the one that came and timed out first. */
START_TEST(test_timeout_apart_from_left)
{
	struct srq_cli c[3];
	uintptr_t t0, t1, t2;
	Cohort__Reply *r;

	fx_form(f, c, 3, "j");
	t0 = fx_barrier(f, &c[0], "x", 1, 1000);
	t1 = fx_barrier(f, &c[1], "x", 1, 1500);
	fx_tick(f, 1000);
	r = fx_want(f, t0, COHORT_ETIMEDOUT);
	ck_assert_uint_eq(r->n_missing_ranks, 1);
	ck_assert_int_eq(r->missing_ranks[0], 2);
	fx_tick(f, 500);
	r = fx_want(f, t1, COHORT_ETIMEDOUT);
	ck_assert_uint_eq(r->n_missing_ranks, 1);
	ck_assert_int_eq(r->missing_ranks[0], 2);
	ck_assert_has(r->error, "rank 2 never arrived");
	ck_assert_has(r->error, "; rank 0 arrived but timed out first");
	/* every absent rank came and left: those are named */
	t0 = fx_barrier(f, &c[0], "y", 2, 1000);
	t1 = fx_barrier(f, &c[1], "y", 2, 3000);
	fx_tick(f, 1000);
	fx_want(f, t0, COHORT_ETIMEDOUT);
	t2 = fx_barrier(f, &c[2], "y", 2, 3000);
	fx_tick(f, 2000);
	r = fx_want(f, t1, COHORT_ETIMEDOUT);
	ck_assert_uint_eq(r->n_missing_ranks, 1);
	ck_assert_int_eq(r->missing_ranks[0], 0);
	ck_assert_has(r->error,
	    "barrier 'y' (#2) timed out after 3.0 s; rank 0 arrived but timed "
	    "out and left before the others came");
	/* a retry under the same number still completes it */
	t0 = fx_barrier(f, &c[0], "y", 2, 3000);
	t1 = fx_barrier(f, &c[1], "y", 2, 3000);
	fx_want(f, t2, COHORT_OK);
	fx_want(f, t0, COHORT_OK);
	fx_want(f, t1, COHORT_OK);
}
END_TEST

START_TEST(test_groups)
{
	struct srq_cli c[4];
	int32_t ranks[2] = { 3, 1 }, other[2] = { 1, 2 };
	uintptr_t t3, t1, tb;
	Cohort__Reply *r;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	fx_form(f, c, 4, "j");
	t3 = fx_group(f, &c[3], "pair", ranks, 2, 60000);
	ck_assert_ptr_null(fx_get(f, t3));
	t1 = fx_group(f, &c[1], "pair", ranks, 2, 60000);
	r = fx_want(f, t3, COHORT_OK);
	ck_assert_str_eq(r->group_create->group, "pair");
	ck_assert_int_eq(r->group_create->group_rank, 0);
	ck_assert_uint_eq(r->group_create->group_size, 2);
	ck_assert_int_eq(
	    fx_want(f, t1, COHORT_OK)->group_create->group_rank, 1);
	/* a collective on it */
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BARRIER;
	co.group = "pair";
	co.op_seq = 1;
	tb = fx_coll(f, &c[1], &co, 60000, NULL, 0);
	fx_coll(f, &c[3], &co, 60000, NULL, 0);
	fx_want(f, tb, COHORT_OK);
	/* not a member / unknown group */
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_EINVAL);
	co.group = "nope";
	fx_want(f, fx_coll(f, &c[0], &co, 0, NULL, 0), COHORT_ENOENT);
	/* mismatching lists */
	t3 = fx_group(f, &c[1], "g2", ranks, 2, 60000);
	t1 = fx_group(f, &c[2], "g2", other, 2, 60000);
	fx_want(f, t3, COHORT_EMISMATCH);
	fx_want(f, t1, COHORT_EMISMATCH);
	/* bad lists */
	other[1] = 1;
	fx_want(f, fx_group(f, &c[1], "g3", other, 2, 0), COHORT_EINVAL);
	fx_want(f, fx_group(f, &c[1], "", other, 2, 0), COHORT_EINVAL);
	/* timeout names the missing ranks */
	other[1] = 2;
	t3 = fx_group(f, &c[3], "g4", ranks, 2, 1000);
	fx_tick(f, 1000);
	r = fx_want(f, t3, COHORT_ETIMEDOUT);
	ck_assert_uint_eq(r->n_missing_ranks, 1);
	ck_assert_int_eq(r->missing_ranks[0], 1);
}
END_TEST

START_TEST(test_retry_takes_over_parked)
{
	struct srq_cli c[2];
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t0, t0b, t1;

	fx_form(f, c, 2, "j");
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BARRIER;
	co.name = "b";
	co.op_seq = 1;
	t0 = fx_coll(f, &c[0], &co, 60000, NULL, 0);
	/* the same seq again: takes over the parked slot */
	rq.seq = c[0].seq;
	rq.body_case = COHORT__REQUEST__BODY_COLLECTIVE;
	rq.collective = &co;
	rq.timeout_ms = 60000;
	t0b = fx_send(f, &c[0], &rq, NULL, 0);
	ck_assert_uint_eq(f->ndrop, 1);
	t1 = fx_barrier(f, &c[1], "b", 1, 60000);
	ck_assert_ptr_null(fx_get(f, t0));
	fx_want(f, t0b, COHORT_OK);
	fx_want(f, t1, COHORT_OK);
}
END_TEST

/* The reply tells each member how long it was parked here waiting for
 * the others: the time it waited for late peers (observability). */
static void
parked_is(struct fx *f, uintptr_t t, uint64_t ms)
{
	Cohort__Reply *r = fx_want(f, t, COHORT_OK);

	ck_assert(r->collective->parked);
	ck_assert_uint_eq(r->collective->parked_us, ms * 1000u);
}

START_TEST(test_parked_time_in_replies)
{
	struct srq_cli c[3];
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	uintptr_t t[3];

	fx_form(f, c, 3, "j");
	t[0] = fx_barrier(f, &c[0], "b", 1, 60000);
	fx_tick(f, 700);
	t[1] = fx_barrier(f, &c[1], "b", 1, 60000);
	fx_tick(f, 300);
	t[2] = fx_barrier(f, &c[2], "b", 1, 60000);
	parked_is(f, t[0], 1000);
	parked_is(f, t[1], 300);
	parked_is(f, t[2], 0);
	/* A broadcast: a receiver waits for the root, not for the others;
	 * the root does not wait. */
	co.kind = COHORT__COLLECTIVE_KIND__COLL_BROADCAST;
	co.name = "model";
	co.op_seq = 2;
	t[1] = fx_coll(f, &c[1], &co, 60000, NULL, 0);
	fx_tick(f, 400);
	t[0] = fx_coll(f, &c[0], &co, 60000, "w", 1);
	fx_tick(f, 200);
	t[2] = fx_coll(f, &c[2], &co, 60000, NULL, 0);
	parked_is(f, t[1], 400);
	parked_is(f, t[0], 0);
	parked_is(f, t[2], 0);
	/* The service backend's gathers. */
	memset(&co, 0, sizeof(co));
	cohort__collective__init(&co);
	co.kind = COHORT__COLLECTIVE_KIND__COLL_SERVICE;
	co.op_seq = 3;
	co.service_op = 3;
	co.dtype = COHORT_U8;
	t[2] = fx_coll(f, &c[2], &co, 60000, "c", 1);
	t[0] = fx_coll(f, &c[0], &co, 60000, "a", 1);
	fx_tick(f, 900);
	t[1] = fx_coll(f, &c[1], &co, 60000, "b", 1);
	parked_is(f, t[2], 900);
	parked_is(f, t[0], 900);
	parked_is(f, t[1], 0);
}
END_TEST

UNIT_FIXTURE_SUITE(srv_coll, "coll", 30, fx_setup, fx_teardown,
    test_barrier_parks_until_all, test_broadcast, test_reduce_scalars,
    test_decide, test_service_gather, test_mismatch,
    test_timeout_names_missing_and_retry, test_timeout_apart_from_left,
    test_groups, test_retry_takes_over_parked, test_parked_time_in_replies)
