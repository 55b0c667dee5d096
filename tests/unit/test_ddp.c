/*
 * test_ddp.c - strategies/ddp: bucket layout, comm hooks and the 16-bit
 * converters in process; and end to end with a real cohortd and N real
 * ranks (build/bin/cohort-strategy-worker) training the examples' MLP on a
 * synthetic data set, compared with one process on the N-times batch
 * (build/bin/cohort-strategy-worker local):
 *
 *  - plain SGD on N = 1, 2, 4 ranks with several buckets (in place and
 *    packed, overlapped and not) equals one process (float tolerance);
 *  - no_sync accumulation over k micro-batches equals one step on the
 *    k-times batch;
 *  - fp16 / bf16 compression stays within its precision's tolerance;
 *  - model averaging with period 1 equals synchronous training;
 *  - on_exception: the others learn which rank failed and why.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strat_fixture.h"
#include "unit_suite.h"
#include "ddp.h"

#include "half.h" /* the library's own converters, to cross-check ours */

#define TDDP_F32_TOL 1e-5

/* Rank 0's parameters after `ddp args` on n ranks, relative to one
 * process on `world=n largs`: the distance; w holds the ddp ranks. */
static double
tddp_vs_local(const char *job, int n, const char *largs, const char *args,
    struct th_workers *w)
{
	struct th_workers lw;
	char ljob[64], full[256];
	char *local, *dist;
	double rel;

	snprintf(ljob, sizeof(ljob), "%s-local", job);
	snprintf(full, sizeof(full), "world=%d %s", n, largs);
	local = strat_run(ljob, 0, "local", full, &lw);
	dist = strat_run(job, n, "ddp", args, w);
	rel = strat_rel_diff(local, dist);
	free(local);
	free(dist);
	return (rel);
}

/* ddp on n ranks equals one process on the n-times batch within tol. */
static void
tddp_equiv(const char *job, int n, const char *extra, double tol)
{
	struct th_workers w;
	double rel = tddp_vs_local(job, n, extra, extra, &w);

	fprintf(stderr, "ddp %s on %d ranks: relative difference %.3g\n",
	    extra, n, rel);
	ck_assert_msg(rel <= tol,
	    "%s on %d ranks: relative difference %g > %g", extra, n, rel, tol);
}

/* ------------------------------------------------------------------------ */
/* End to end                                                               */
/* ------------------------------------------------------------------------ */

START_TEST(test_ddp_equiv_1_rank)
{
	tddp_equiv("e1", 1, "steps=8", TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_equiv_2_ranks)
{
	tddp_equiv("e2", 2, "steps=10", TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_equiv_4_ranks)
{
	struct th_workers w;
	double rel = tddp_vs_local("e4", 4, "steps=10", "steps=10", &w);

	/* Several buckets, every one started during backward. */
	ck_assert(th_worker_output_has(&w, 0, "buckets=4 overlapped=40/40"));
	ck_assert(th_worker_output_has(&w, 3, "equal=1"));
	ck_assert_double_le(rel, TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_equiv_packed_buckets)
{
	/* view=0: gradients packed into bucket buffers and back; cap 8 KB
	 * puts fc2.bias, fc2.weight and fc1.bias in one bucket. */
	tddp_equiv("ep", 2, "steps=8 view=0 cap=8192", TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_equiv_no_overlap)
{
	struct th_workers w;
	double rel
	    = tddp_vs_local("eo", 2, "steps=8", "steps=8 overlap=0", &w);

	ck_assert(th_worker_output_has(&w, 0, "overlapped=0/32"));
	ck_assert_double_le(rel, TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_no_sync_accumulation)
{
	struct th_workers w;

	/* 3 micro-batches of B per rank with no_sync, one synced step ==
	 * one process stepping on the 3 * N * B batch. */
	ck_assert_double_le(tddp_vs_local("acc", 2, "batch=48 steps=6",
	                        "batch=16 accum=3 steps=6", &w),
	    TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_fp16_hook)
{
	struct th_workers w;
	char *f32 = strat_run("h16-f32", 2, "ddp", "steps=10", &w);
	char *f16 = strat_run("h16-ddp2", 2, "ddp", "steps=10 hook=fp16", &w);
	double rel
	    = tddp_vs_local("h16", 2, "steps=10", "steps=10 hook=fp16", &w);

	fprintf(stderr, "fp16 hook: relative difference %.3g\n", rel);
	/* binary16: 11-bit significand, 2^-11 relative per rounding. */
	ck_assert_double_le(rel, 2e-3);
	/* ... and the compression really happened. */
	ck_assert_double_gt(strat_rel_diff(f32, f16), 1e-7);
	free(f32);
	free(f16);
}
END_TEST

START_TEST(test_ddp_bf16_hook)
{
	struct th_workers w;
	double rel
	    = tddp_vs_local("hbf", 4, "steps=10", "steps=10 hook=bf16", &w);

	fprintf(stderr, "bf16 hook: relative difference %.3g\n", rel);
	/* bfloat16: 8-bit significand, 2^-8 relative per rounding. */
	ck_assert_double_le(rel, 2e-2);
	ck_assert_double_gt(rel, TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_model_averaging_period_1)
{
	/* Post-local SGD: 3 synced warmup steps, then a local step and a
	 * parameter average every step == synchronous SGD. */
	tddp_equiv(
	    "ma1", 2, "steps=10 avg_period=1 avg_warmup=3", TDDP_F32_TOL);
}
END_TEST

START_TEST(test_ddp_model_averaging_period_2)
{
	struct th_workers w;
	double rel = tddp_vs_local(
	    "ma2", 2, "steps=10", "steps=10 avg_period=2 avg_warmup=3", &w);

	/* Averaged after the last step (steps 3, 5, 7, 9): equal replicas,
	 * but not the synchronous trajectory. */
	ck_assert(th_worker_output_has(&w, 0, "equal=1"));
	ck_assert(th_worker_output_has(&w, 1, "equal=1"));
	ck_assert_double_gt(rel, 1e-4);
}
END_TEST

START_TEST(test_ddp_on_exception)
{
	struct th_workers w;

	/* Rank 0 fails at step 2 (exit 3); ranks 1 and 2 learn who and
	 * why (exit 4). */
	free(strat_run_ex(
	    "fail", 3, "fail", "steps=5 fail_rank=0 fail_step=2", 4, 3, &w));
	ck_assert(
	    th_worker_output_has(&w, 0, "FAILED injected failure at step 2"));
	for (int r = 1; r < 3; r++) {
		char *o = th_worker_output(&w, r);

		ck_assert_msg(strstr(o, "PEERLOST COHORT_EPEERLOST") != NULL
		        && strstr(o, "injected failure at step 2") != NULL
		        && strstr(o, "rank 0") != NULL,
		    "rank %d did not learn who failed and why:\n%s", r, o);
		free(o);
	}
}
END_TEST

/* ------------------------------------------------------------------------ */
/* In process                                                               */
/* ------------------------------------------------------------------------ */

START_TEST(test_ddp_half_converters)
{
	/* Every binary16 value round-trips; f32 -> f16 / bf16 agree with
	 * libcohort's converters on random and tie values. */
	for (uint32_t h = 0; h < 65536; h++) {
		float f = cohort_ddp_f16_to_f32((uint16_t)h);
		uint16_t back = cohort_ddp_f32_to_f16(f);

		if (isnan(f))
			ck_assert((back & 0x7c00) == 0x7c00 && (back & 0x3ff));
		else
			ck_assert_uint_eq(back, h);
		f = cohort_ddp_bf16_to_f32((uint16_t)h);
		if (!isnan(f))
			ck_assert_uint_eq(cohort_ddp_f32_to_bf16(f), h);
	}
	{
		uint64_t s = 12345;

		for (int i = 0; i < 200000; i++) {
			uint32_t x;
			float f;

			s = s * 6364136223846793005ull
			    + 1442695040888963407ull;
			x = (uint32_t)(s >> 32);
			memcpy(&f, &x, sizeof(f));
			if (isnan(f))
				continue;
			ck_assert_uint_eq(
			    cohort_ddp_f32_to_f16(f), cohort__f32_to_f16(f));
			ck_assert_uint_eq(
			    cohort_ddp_f32_to_bf16(f), cohort__f32_to_bf16(f));
		}
	}
	/* Ties to even, overflow, subnormals. */
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(1.0f + 3 * 0x1p-11f), 0x3c02);
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(65504.0f), 0x7bff);
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(65520.0f), 0x7c00);
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(-1e9f), 0xfc00);
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(0x1p-24f), 0x0001);
	ck_assert_uint_eq(cohort_ddp_f32_to_f16(0x1p-25f), 0x0000);
	ck_assert_uint_eq(cohort_ddp_f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	ck_assert_uint_eq(cohort_ddp_f32_to_bf16(1.0f + 3 * 0x1p-8f), 0x3f82);
	ck_assert(cohort_ddp_f16_to_f32(0x0001) == 0x1p-24f);
	ck_assert(cohort_ddp_bf16_to_f32(0x3f80) == 1.0f);
}
END_TEST

/* A model of 6 parameters, not contiguous, registration order 0..5. */
struct tddp_model {
	float data[6][300];
	float pad[6][7];
	cohort_ddp_param p[6];
};

static void
tddp_model_init(struct tddp_model *m, const size_t *counts)
{
	memset(m, 0, sizeof(*m));
	for (int i = 0; i < 6; i++) {
		m->p[i].name = "p";
		m->p[i].data = m->data[i];
		m->p[i].grad = m->data[i] + 150;
		m->p[i].count = counts[i];
	}
}

START_TEST(test_ddp_bucket_layout)
{
	static const size_t counts[6] = { 100, 20, 50, 150, 10, 10 };
	struct tddp_model m;
	cohort_ddp_options o;
	cohort_ddp_stats s;
	cohort_ddp *d;

	tddp_model_init(&m, counts);
	cohort_ddp_options_init(&o);
	/* Ready order 5, 4, 3, 2, 1, 0; first bucket 64 bytes (16 floats),
	 * the others 400 bytes (100 floats). */
	o.first_bucket_cap_bytes = 64;
	o.bucket_cap_bytes = 400;
	ck_assert_cohort_ok(cohort_ddp_new(NULL, NULL, m.p, 6, &o, &d));
	cohort_ddp_get_stats(d, &s);
	/* [5] (10; +10 > 16), [4] (10; +150 > 100), [3] (150 alone),
	 * [2, 1] (70; +100 > 100), [0]. */
	ck_assert_int_eq(s.nbuckets, 5);
	ck_assert_uint_eq(s.bucket_count[0], 10);
	ck_assert_uint_eq(s.bucket_count[1], 10);
	ck_assert_uint_eq(s.bucket_count[2], 150);
	ck_assert_uint_eq(s.bucket_count[3], 70);
	ck_assert_uint_eq(s.bucket_count[4], 100);
	/* Separate arrays: bucket [2, 1] cannot be a view. */
	ck_assert(s.bucket_view[0] && !s.bucket_view[3]);
	ck_assert_int_eq(cohort_ddp_world_size(d), 1);
	ck_assert(cohort_ddp_is_global_zero(d));
	cohort_ddp_free(d);

	/* Defaults: 1 MiB first, 25 MiB others: all in one bucket. */
	ck_assert_cohort_ok(cohort_ddp_new(NULL, NULL, m.p, 6, NULL, &d));
	cohort_ddp_get_stats(d, &s);
	ck_assert_int_eq(s.nbuckets, 1);
	cohort_ddp_free(d);
	ck_assert_ptr_null(cohort_ddp_hook_by_name("nope"));
	ck_assert_str_eq(cohort_ddp_hook_by_name("fp16")->name, "fp16");
}
END_TEST

/* A custom hook: records the order of buckets and halves the gradient. */
struct tddp_hook_state {
	int started[16], finished[16];
	int nstarted, nfinished;
};

static cohort_status
tddp_hook_start(void *state, cohort_ddp_bucket *b, cohort_work **work)
{
	struct tddp_hook_state *hs = state;

	hs->started[hs->nstarted++] = b->index;
	*work = NULL;
	for (size_t i = 0; i < b->count; i++)
		b->buffer[i] *= 0.5f;
	return (COHORT_OK);
}

static cohort_status
tddp_hook_finish(void *state, cohort_ddp_bucket *b)
{
	struct tddp_hook_state *hs = state;

	hs->finished[hs->nfinished++] = b->index;
	return (COHORT_OK);
}

START_TEST(test_ddp_custom_hook_order_and_no_sync)
{
	static const size_t counts[6] = { 100, 20, 50, 150, 10, 10 };
	struct tddp_model m;
	struct tddp_hook_state hs;
	cohort_ddp_hook hook
	    = { "half", tddp_hook_start, tddp_hook_finish, &hs };
	cohort_ddp_options o;
	cohort_ddp *d;

	memset(&hs, 0, sizeof(hs));
	tddp_model_init(&m, counts);
	for (int i = 0; i < 6; i++)
		for (size_t k = 0; k < counts[i]; k++)
			m.p[i].grad[k] = 2.0f;
	cohort_ddp_options_init(&o);
	o.first_bucket_cap_bytes = 64;
	o.bucket_cap_bytes = 400;
	o.hook = &hook;
	o.gradient_as_bucket_view = false;
	ck_assert_cohort_ok(cohort_ddp_new(NULL, NULL, m.p, 6, &o, &d));

	/* Out of order: 3 is ready first, but bucket 2 ([3]) must wait for
	 * buckets 0 ([5]) and 1 ([4]). */
	cohort_ddp_grad_ready(d, 3);
	ck_assert_int_eq(hs.nstarted, 0);
	cohort_ddp_grad_ready(d, 5);
	ck_assert_int_eq(hs.nstarted, 1);
	cohort_ddp_grad_ready(d, 4);
	ck_assert_int_eq(hs.nstarted, 3);
	cohort_ddp_grad_ready(d, 1);
	ck_assert_int_eq(hs.nstarted, 3);
	/* 2 and 0 never become ready: sync starts them. */
	ck_assert_cohort_ok(cohort_ddp_sync(d));
	ck_assert_int_eq(hs.nstarted, 5);
	ck_assert_int_eq(hs.nfinished, 5);
	for (int k = 0; k < 5; k++) {
		ck_assert_int_eq(hs.started[k], k);
		ck_assert_int_eq(hs.finished[k], k);
	}
	for (int i = 0; i < 6; i++)
		for (size_t k = 0; k < counts[i]; k++)
			ck_assert(m.p[i].grad[k] == 1.0f);

	/* no_sync: nothing communicated, gradients untouched. */
	cohort_ddp_no_sync_begin(d);
	ck_assert(cohort_ddp_in_no_sync(d));
	for (int i = 5; i >= 0; i--)
		cohort_ddp_grad_ready(d, i);
	ck_assert_cohort_ok(cohort_ddp_sync(d));
	ck_assert_int_eq(hs.nstarted, 5);
	ck_assert(m.p[0].grad[0] == 1.0f);
	cohort_ddp_no_sync_end(d);
	for (int i = 5; i >= 0; i--)
		cohort_ddp_grad_ready(d, i);
	ck_assert_int_eq(hs.nstarted, 10);
	ck_assert_cohort_ok(cohort_ddp_sync(d));
	ck_assert(m.p[0].grad[0] == 0.5f);
	cohort_ddp_free(d);
}
END_TEST

Suite *
suite_ddp(void)
{
	const TTest *in_process[]
	    = { test_ddp_half_converters, test_ddp_bucket_layout,
		      test_ddp_custom_hook_order_and_no_sync, NULL };
	const TTest *end_to_end[] = { test_ddp_equiv_1_rank,
		test_ddp_equiv_2_ranks, test_ddp_equiv_4_ranks,
		test_ddp_equiv_packed_buckets, test_ddp_equiv_no_overlap,
		test_ddp_no_sync_accumulation, test_ddp_fp16_hook,
		test_ddp_bf16_hook, test_ddp_model_averaging_period_1,
		test_ddp_model_averaging_period_2, test_ddp_on_exception,
		NULL };
	const struct unit_case cases[] = {
		{ "in_process", 0, in_process, NULL, NULL, NULL },
		{ "end_to_end", 180, end_to_end, NULL, th_fx_setup,
		    th_fx_teardown },
		{ NULL, 0, NULL, NULL, NULL, NULL },
	};

	return (unit_suite_cases("ddp", cases));
}
