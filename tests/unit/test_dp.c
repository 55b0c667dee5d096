/*
 * test_dp.c - strategies/dp: K CPU replicas in one process give the same
 * parameters as one replica on the whole batch (and as ddp on N ranks with
 * the same data, checked through cohort-strategy-worker's files); batch
 * split, state get/load, all_reduce of per-replica values, errors.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strat_fixture.h"
#include "unit_suite.h"
#include "dp.h"
#include "mlp.h"

/* One process of the strategy worker (no job). */
static char *
tdp_run(const char *name, const char *mode, const char *args)
{
	struct th_workers w;

	return (strat_run(name, 0, mode, args, &w));
}

START_TEST(test_dp_equals_local)
{
	char *local = tdp_run("l4", "local", "world=4 steps=10");
	char *dp4 = tdp_run("d4", "dp", "world=4 steps=10");
	/* 3 replicas of a 64-sample batch: chunks 22, 22, 20. */
	char *dp3 = tdp_run("d3", "dp", "world=4 replicas=3 steps=10");
	char *acc = tdp_run("la", "local", "world=2 batch=48 steps=5");
	char *dpacc = tdp_run("da", "dp", "world=2 accum=3 steps=5");

	strat_assert_same(local, dp4);
	strat_assert_same(local, dp3);
	strat_assert_same(acc, dpacc);
	free(local);
	free(dp4);
	free(dp3);
	free(acc);
	free(dpacc);
}
END_TEST

static int
tdp_fb_fail(
    void *model, int replica, size_t begin, size_t end, float scale, void *arg)
{
	(void)model;
	(void)begin;
	(void)end;
	(void)scale;
	(void)arg;
	return (replica == 2 ? 7 : 0);
}

static int
tdp_fb_mark(
    void *model, int replica, size_t begin, size_t end, float scale, void *arg)
{
	struct mlp *m = model;

	(void)arg;
	/* grads[0] += scale * number of samples, params[1] = replica. */
	m->grads[0] += scale * (float)(end - begin);
	m->grads[1] += (float)replica;
	return (0);
}

static int
tdp_step(void *root, void *arg)
{
	(void)arg;
	return (mlp_sgd_step(root, 1.0f, 0.0f));
}

START_TEST(test_dp_api)
{
	struct mlp m[3];
	cohort_dp_replica r[3];
	cohort_dp *dp;
	float *state;
	size_t b, e;
	double v[6] = { 1, 2, 3, 4, 5, 6 };

	for (int k = 0; k < 3; k++) {
		ck_assert_int_eq(
		    mlp_init(&m[k], 4, 3, 2, 10 + (uint64_t)k), 0);
		r[k].model = &m[k];
		r[k].params = m[k].params;
		r[k].grads = m[k].grads;
	}
	ck_assert_cohort_ok(cohort_dp_new(r, 3, m[0].n_params, &dp));
	ck_assert_int_eq(cohort_dp_num_replicas(dp), 3);
	ck_assert_ptr_eq(cohort_dp_root_model(dp), &m[0]);
	/* Replicated from the root. */
	ck_assert(
	    memcmp(m[1].params, m[0].params, m[0].n_params * sizeof(float))
	    == 0);
	/* Splits like torch's scatter: ceil(10 / 3) = 4, 4, 2. */
	cohort_dp_batch_to_device(dp, 10, 2, &b, &e);
	ck_assert_uint_eq(b, 8);
	ck_assert_uint_eq(e, 10);
	cohort_dp_batch_to_device(dp, 2, 2, &b, &e);
	ck_assert_uint_eq(b, e);

	ck_assert_cohort_ok(
	    cohort_dp_forward_backward(dp, 10, tdp_fb_mark, NULL));
	ck_assert_cohort_ok(
	    cohort_dp_forward_backward(dp, 10, tdp_fb_mark, NULL));
	cohort_dp_reduce_gradients(dp);
	/* Two passes, each summing to 1; replicas 0 + 1 + 2 twice. */
	ck_assert(fabsf(m[0].grads[0] - 2.0f) < 1e-6f);
	ck_assert(m[0].grads[1] == 6.0f);
	ck_assert(m[1].grads[0] == 0.0f && m[2].grads[1] == 0.0f);
	{
		float before = m[0].params[0];

		ck_assert_cohort_ok(cohort_dp_step(dp, tdp_step, NULL));
		ck_assert(fabsf(m[0].params[0] - (before - 2.0f)) < 1e-6f);
		ck_assert(m[2].params[0] == m[0].params[0]);
		ck_assert(m[0].grads[0] == 0.0f);
	}
	/* state get / load (strict sizes). */
	state = calloc(m[0].n_params, sizeof(float));
	ck_assert_cohort_ok(cohort_dp_state_get(dp, state, m[0].n_params));
	ck_assert(state[0] == m[0].params[0]);
	state[0] = 42.0f;
	ck_assert_cohort_ok(cohort_dp_state_load(dp, state, m[0].n_params));
	ck_assert(m[1].params[0] == 42.0f && m[2].params[0] == 42.0f);
	ck_assert_cohort_err(
	    cohort_dp_state_load(dp, state, 3), COHORT_EINVAL);
	free(state);
	/* Per-replica values: v[r * 2 + i]. */
	ck_assert_cohort_ok(cohort_dp_all_reduce(dp, v, 2, COHORT_MEAN));
	ck_assert(v[0] == 3.0 && v[1] == 4.0);
	/* A failing replica is reported. */
	ck_assert_cohort_err(
	    cohort_dp_forward_backward(dp, 9, tdp_fb_fail, NULL),
	    COHORT_EABORTED);
	ck_assert(strstr(cohort_dp_last_error(dp), "replica 2") != NULL);
	cohort_dp_free(dp);
	for (int k = 0; k < 3; k++)
		mlp_fini(&m[k]);
}
END_TEST

Suite *suite_dp(void);

UNIT_SUITE(dp, "dp", 120, test_dp_api, test_dp_equals_local)
