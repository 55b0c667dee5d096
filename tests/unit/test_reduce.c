/*
 * test_reduce.c - the reduction kernels (client/reduce.c) against a
 * reference computed in double, for every dtype x op, on every vector
 * variant this CPU supports; and the half-precision converters, against
 * the F16C instructions where present and against hand-checked values.
 */
#include <check.h>
#include <cpuid.h>
#include <immintrin.h>
#include <math.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "dtype_elem.h"
#include "th_elem.h"
#include "unit_suite.h"

/* client/reduce.c's testing hook (not in backend.h). */
bool cohort__reduce_select(const char *isa, const char **active);

static const char *const reduce_isas[] = { "generic", "avx2", "avx512" };

static uint64_t reduce_rng = 0x9e3779b97f4a7c15u;

static uint64_t
reduce_rand(void)
{
	return (th_xorshift(&reduce_rng));
}

/* A value in [-4, 4) with few significant bits for products, or small
 * integers. */
static double
reduce_rand_val(cohort_dtype dt, cohort_redop op)
{
	int64_t k = (int64_t)(reduce_rand() % 2001) - 1000;

	switch (dt) {
	case COHORT_U8:
		return ((double)(reduce_rand() % 256));
	case COHORT_I32:
	case COHORT_I64:
		if (op == COHORT_PROD)
			return ((double)(k % 7));
		return ((double)k * 1000003.0);
	default:
		if (op == COHORT_PROD)
			return ((double)(k % 9) / 4.0);
		return ((double)k / 250.0);
	}
}

/* A random value of dt (reduce_rand_val) into buf[i]. */
static void
reduce_put(void *buf, size_t i, cohort_dtype dt, cohort_redop op)
{
	double v = reduce_rand_val(dt, op);

	cohort__elem_store(buf, i, dt, v, (uint64_t)(int64_t)v);
}

/* Reference of a op b in the integer domains, exactly (wrapping). */
static bool
reduce_ref_int(const void *d, const void *s, size_t i, cohort_dtype dt,
    cohort_redop op, const void *got)
{
	return (elem_op_i(elem_bits(d, i, dt), elem_bits(s, i, dt), dt, op)
	    == elem_bits(got, i, dt));
}

static void
reduce_check_one(cohort_dtype dt, cohort_redop op, size_t n, int divisor)
{
	size_t es = cohort_dtype_size(dt);
	uint8_t *d = malloc(n * es + 1), *s = malloc(n * es + 1);
	uint8_t *d0 = malloc(n * es + 1);
	bool isfloat = cohort__dtype_is_float(dt);
	int bad = 0;

	ck_assert(d != NULL && s != NULL && d0 != NULL);
	for (size_t i = 0; i < n; i++) {
		reduce_put(d, i, dt, op);
		reduce_put(s, i, dt, op);
	}
	memcpy(d0, d, n * es);
	cohort__reduce(d, s, n, dt, op);
	if (divisor > 1)
		cohort__scale_div(d, n, dt, divisor);
	for (size_t i = 0; i < n && bad < 10; i++) {
		if (!isfloat) {
			if (!reduce_ref_int(d0, s, i, dt, op, d)) {
				bad++;
				ck_abort_msg(
				    "%s %s n=%zu i=%zu: %g op %g gave %g",
				    cohort_dtype_name(dt),
				    cohort_redop_name(op), n, i,
				    cohort__elem_loadf(d0, i, dt),
				    cohort__elem_loadf(s, i, dt),
				    cohort__elem_loadf(d, i, dt));
			}
			continue;
		}
		double a = cohort__elem_loadf(d0, i, dt),
		       b = cohort__elem_loadf(s, i, dt);
		double want, got = cohort__elem_loadf(d, i, dt), tol;

		want = elem_op_f(a, b, op);
		if (divisor > 1)
			want /= divisor;
		/* f32/f64: one correctly rounded op (exact in double for these
		 * inputs), at most one more rounding for the division. */
		switch (dt) {
		case COHORT_F16:
			tol = fabs(want) * 1.0 / 1024 + 1e-7;
			break;
		case COHORT_BF16:
			tol = fabs(want) * 1.0 / 128 + 1e-30;
			break;
		case COHORT_F32:
			tol = fabs(want) * 2.5e-7;
			break;
		default:
			tol = fabs(want) * 4.5e-16;
			break;
		}
		if (fabs(got - want) > tol) {
			bad++;
			ck_abort_msg("%s %s n=%zu i=%zu: %.9g op %.9g = %.9g, "
			             "want %.9g",
			    cohort_dtype_name(dt), cohort_redop_name(op), n, i,
			    a, b, got, want);
		}
	}
	free(d);
	free(s);
	free(d0);
}

START_TEST(test_reduce_all_dtypes_ops)
{
	static const size_t sizes[]
	    = { 0, 1, 3, 7, 8, 9, 15, 16, 17, 31, 33, 64, 100, 1000, 4097 };
	const char *isa = reduce_isas[_i];
	const char *active = NULL;

	if (!cohort__reduce_select(isa, &active)) {
		/* Not supported by this CPU: nothing to test here. */
		return;
	}
	ck_assert_str_eq(active, isa);
	for (int dt = 0; dt < COHORT_DTYPE_COUNT; dt++) {
		for (int op = 0; op < COHORT_REDOP_COUNT; op++) {
			bool isfloat = dt <= COHORT_BF16;

			if (op == COHORT_MEAN && !isfloat)
				continue;
			for (size_t k = 0;
			     k < sizeof(sizes) / sizeof(sizes[0]); k++)
				reduce_check_one((cohort_dtype)dt,
				    (cohort_redop)op, sizes[k],
				    op == COHORT_MEAN ? 3 : 1);
		}
	}
	cohort__reduce_select(NULL, NULL);
}
END_TEST

START_TEST(test_reduce_count_zero_untouched)
{
	float d[2] = { 1, 2 }, s[2] = { 3, 4 };

	cohort__reduce(d, s, 0, COHORT_F32, COHORT_SUM);
	cohort__scale_div(d, 0, COHORT_F32, 2);
	ck_assert(d[0] == 1 && d[1] == 2);
}
END_TEST

START_TEST(test_reduce_variants_agree)
{
	/* Every supported variant gives bit-identical results. */
	enum { N = 1037 };
	static uint8_t base[N * 8], src[N * 8], out[3][N * 8];
	int have = 0;

	for (size_t i = 0; i < sizeof(base); i++) {
		base[i] = (uint8_t)reduce_rand();
		src[i] = (uint8_t)reduce_rand();
	}
	for (int dt = 0; dt < COHORT_DTYPE_COUNT; dt++) {
		for (int op = 0; op < 4; op++) {
			size_t es = cohort_dtype_size((cohort_dtype)dt);

			have = 0;
			for (int v = 0; v < 3; v++) {
				if (!cohort__reduce_select(
				        reduce_isas[v], NULL))
					continue;
				memcpy(out[have], base, N * es);
				cohort__reduce(out[have], src, N,
				    (cohort_dtype)dt, (cohort_redop)op);
				have++;
			}
			for (int v = 1; v < have; v++) {
				/* NaN payloads may differ only in NaN-ness. */
				if (dt == COHORT_F32 || dt == COHORT_F64
				    || dt == COHORT_F16 || dt == COHORT_BF16) {
					for (size_t i = 0; i < N; i++) {
						double a = cohort__elem_loadf(
						    out[0], i,
						    (cohort_dtype)dt);
						double b = cohort__elem_loadf(
						    out[v], i,
						    (cohort_dtype)dt);

						ck_assert_msg(
						    (isnan(a) && isnan(b))
						        || a == b,
						    "%s %s: variants differ "
						    "at "
						    "%zu: %g vs %g",
						    cohort_dtype_name(dt),
						    cohort_redop_name(op), i,
						    a, b);
					}
				} else {
					ck_assert(
					    memcmp(out[0], out[v], N * es)
					    == 0);
				}
			}
		}
	}
	cohort__reduce_select(NULL, NULL);
}
END_TEST

START_TEST(test_reduce_f16_roundtrip_exhaustive)
{
	for (uint32_t h = 0; h < 65536; h++) {
		float f = cohort__f16_to_f32((uint16_t)h);
		uint16_t back = cohort__f32_to_f16(f);

		if (isnan(f)) {
			ck_assert_msg(
			    (back & 0x7c00) == 0x7c00 && (back & 0x3ff) != 0,
			    "NaN %04x -> %04x", h, back);
			continue;
		}
		ck_assert_msg(back == h, "f16 %04x -> %g -> %04x", h, f, back);
	}
}
END_TEST

START_TEST(test_reduce_f16_rounding)
{
	ck_assert_uint_eq(cohort__f32_to_f16(65504.0f), 0x7bff);
	ck_assert_uint_eq(cohort__f32_to_f16(65519.0f), 0x7bff);
	ck_assert_uint_eq(cohort__f32_to_f16(65520.0f), 0x7c00);
	ck_assert_uint_eq(cohort__f32_to_f16(-1e9f), 0xfc00);
	ck_assert_uint_eq(cohort__f32_to_f16(1.0f), 0x3c00);
	/* 1 + 2^-11 is a tie between 1 and 1 + 2^-10: to even (1). */
	ck_assert_uint_eq(cohort__f32_to_f16(1.0f + 0x1p-11f), 0x3c00);
	/* 1 + 3 * 2^-11: tie, to even (1 + 2^-9). */
	ck_assert_uint_eq(cohort__f32_to_f16(1.0f + 0x3p-11f), 0x3c02);
	/* Smallest subnormal 2^-24; 2^-25 ties to even (0). */
	ck_assert_uint_eq(cohort__f32_to_f16(0x1p-24f), 0x0001);
	ck_assert_uint_eq(cohort__f32_to_f16(0x1p-25f), 0x0000);
	ck_assert_uint_eq(cohort__f32_to_f16(0x1.8p-25f), 0x0001);
	ck_assert_uint_eq(cohort__f32_to_f16(0x3p-25f), 0x0002);
	ck_assert(cohort__f16_to_f32(0x0001) == 0x1p-24f);
	ck_assert(isinf(cohort__f16_to_f32(0x7c00)));
}
END_TEST

static bool
reduce_cpu_f16c(void)
{
	unsigned a, b, c, d;

	return (__get_cpuid(1, &a, &b, &c, &d) && (c & bit_F16C) != 0);
}

__attribute__((target("f16c"))) static uint16_t
reduce_hw_f32_to_f16(float f)
{
	return ((uint16_t)_cvtss_sh(f, _MM_FROUND_TO_NEAREST_INT));
}

START_TEST(test_reduce_f16_matches_hardware)
{
	if (!reduce_cpu_f16c())
		return;
	for (int i = 0; i < 2000000; i++) {
		uint32_t u = (uint32_t)reduce_rand();
		float f;

		/* Every other value in and around the f16 range. */
		if (i & 1)
			u = (u & 0x807fffffu)
			    | ((uint32_t)(95 + reduce_rand() % 55) << 23);
		memcpy(&f, &u, 4);
		if (isnan(f))
			continue;
		ck_assert_msg(cohort__f32_to_f16(f) == reduce_hw_f32_to_f16(f),
		    "f32 %08x: soft %04x hw %04x", u, cohort__f32_to_f16(f),
		    reduce_hw_f32_to_f16(f));
	}
}
END_TEST

START_TEST(test_reduce_bf16_rounding)
{
	uint32_t u;
	float f;

	ck_assert_uint_eq(cohort__f32_to_bf16(1.0f), 0x3f80);
	/* 1 + 2^-8 is a tie: to even (1). 1 + 3 * 2^-8: to 1 + 2^-6. */
	ck_assert_uint_eq(cohort__f32_to_bf16(1.0f + 0x1p-8f), 0x3f80);
	ck_assert_uint_eq(cohort__f32_to_bf16(1.0f + 0x3p-8f), 0x3f82);
	ck_assert_uint_eq(cohort__f32_to_bf16(1.0f + 0x1.2p-8f), 0x3f81);
	ck_assert(cohort__bf16_to_f32(0x3f80) == 1.0f);
	u = 0x7fc00001u;
	memcpy(&f, &u, 4);
	ck_assert(isnan(cohort__bf16_to_f32(cohort__f32_to_bf16(f))));
	u = 0x7f800001u; /* signalling NaN with low payload: stays NaN */
	memcpy(&f, &u, 4);
	ck_assert(isnan(cohort__bf16_to_f32(cohort__f32_to_bf16(f))));
	ck_assert(
	    isinf(cohort__bf16_to_f32(cohort__f32_to_bf16(3.4e38f * 10.0f))));
}
END_TEST

START_TEST(test_reduce_throughput_sane)
{
	/* Not a benchmark: catches a kernel left scalar by accident on the
	 * automatically chosen variant (16 MiB f32 sum must take < 50 ms
	 * even on a slow, shared machine). */
	size_t n = 4u << 20;
	float *d = malloc(n * 4), *s = malloc(n * 4);
	uint64_t t0, best = UINT64_MAX;

	ck_assert(d != NULL && s != NULL);
	for (size_t i = 0; i < n; i++) {
		d[i] = 1.0f;
		s[i] = 2.0f;
	}
	for (int k = 0; k < 5; k++) {
		t0 = cohort__now_ns();
		cohort__reduce(d, s, n, COHORT_F32, COHORT_SUM);
		t0 = cohort__now_ns() - t0;
		if (t0 < best)
			best = t0;
	}
	ck_assert(d[n - 1] == 11.0f);
	ck_assert_msg(
	    best < 50000000u, "16 MiB f32 sum took %.1f ms", best / 1e6);
	free(d);
	free(s);
}
END_TEST

Suite *
suite_reduce(void)
{
	const TTest *kernels[]
	    = { test_reduce_count_zero_untouched, test_reduce_variants_agree,
		      test_reduce_throughput_sane, NULL };
	const struct unit_loop isas[]
	    = { { test_reduce_all_dtypes_ops, 3 }, { NULL, 0 } };
	const TTest *half[] = { test_reduce_f16_roundtrip_exhaustive,
		test_reduce_f16_rounding, test_reduce_f16_matches_hardware,
		test_reduce_bf16_rounding, NULL };
	const struct unit_case cases[] = {
		{ "kernels", 60, kernels, isas, NULL, NULL },
		{ "half", 60, half, NULL, NULL, NULL },
		{ NULL, 0, NULL, NULL, NULL, NULL },
	};

	return (unit_suite_cases("reduce", cases));
}
