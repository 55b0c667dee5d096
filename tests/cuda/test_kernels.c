/*
 * test_kernels.c - the kernels of kernels/fusion.cu against kernels/ref.c.
 *
 * suite_cuda_ref runs everywhere: the references against hand-computed
 * values and properties (every f16/bf16 bit pattern round-trips, every
 * random f32 rounds to its nearest neighbour, ties to even), and the
 * batched copy's host planner and partitioning (cohort__copy_emulate runs
 * the kernel's own index code) against the plain reference pack.
 *
 * suite_cuda_kernels runs the kernels on random inputs and checks every
 * element against the reference (llm.c validate_result). Each test first
 * asks cohort__gpu_available(); without a GPU it prints one SKIP line and
 * passes. The CUDA driver is initialised inside each forked test, never in
 * the runner, so CK_FORK children can use the device.
 */
#include <check.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"
#include "cohort/cohort.h"
#include "kernels.h"
#include "th_elem.h"

#define KT_OK(expr)                                                           \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		ck_assert_msg(st_ == COHORT_OK,                               \
		    "%s: expected COHORT_OK, got %s (%s)", #expr,             \
		    cohort_status_name(st_), cohort_last_error());            \
	} while (0)

#define KT_ERR(expr, want)                                                    \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		ck_assert_msg(st_ == (want), "%s: expected %s, got %s",       \
		    #expr, cohort_status_name(want),                          \
		    cohort_status_name(st_));                                 \
	} while (0)

/* xorshift64*: deterministic, seeded per test. */
static uint64_t kt_state;

static void
kt_seed(uint64_t s)
{
	kt_state = s * 0x9e3779b97f4a7c15ull + 1;
}

static uint64_t
kt_rand(void)
{
	return (th_xorshift(&kt_state));
}

static size_t
kt_below(size_t n)
{
	return (n == 0 ? 0 : (size_t)(kt_rand() % n));
}

static uint32_t
kt_bits(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	return (x);
}

static float
kt_float(uint32_t x)
{
	float f;

	memcpy(&f, &x, sizeof(f));
	return (f);
}

/* ------------------------------------------------------------------------ */
/* suite_cuda_ref: f16 / bf16 conversions                                   */
/* ------------------------------------------------------------------------ */

START_TEST(test_f16_known)
{
	static const struct {
		float f;
		uint16_t h;
	} cases[] = {
		{ 0.0f, 0x0000 },
		{ -0.0f, 0x8000 },
		{ 1.0f, 0x3c00 },
		{ -2.0f, 0xc000 },
		{ 0.5f, 0x3800 },
		{ 65504.0f, 0x7bff }, /* largest finite */
		{ 65519.99f, 0x7bff }, /* below the halfway to 2^16 */
		{ 65520.0f, 0x7c00 }, /* halfway: ties to even = inf */
		{ 1e10f, 0x7c00 }, /* overflow */
		{ -1e10f, 0xfc00 },
		{ 0x1p-14f, 0x0400 }, /* smallest normal */
		{ 0x1p-24f, 0x0001 }, /* smallest subnormal */
		{ 0x1p-25f, 0x0000 }, /* halfway to it: ties to even */
		{ 0x1.8p-25f, 0x0001 }, /* above halfway */
		{ 0x1.8p-24f, 0x0002 }, /* 1.5 units: ties to even = 2 */
		{ 0x1.4p-24f, 0x0001 }, /* 1.25 units */
		{ 0x1p-30f, 0x0000 },
		{ 0x1.ffcp-15f, 0x0400 }, /* rounds up into the normals */
		{ 1.0f + 0x1p-11f, 0x3c00 }, /* tie, even below */
		{ 1.0f + 0x1.8p-10f, 0x3c02 }, /* tie, even above */
		{ 1.0f + 0x1p-11f + 0x1p-20f, 0x3c01 },
		{ 3.140625f, 0x4248 },
	};
	size_t i;

	for (i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		uint16_t h = cohort__f32_to_f16(cases[i].f);
		ck_assert_msg(h == cases[i].h, "f16(%a) = 0x%04x, want 0x%04x",
		    (double)cases[i].f, h, cases[i].h);
	}
	ck_assert_uint_eq(cohort__f32_to_f16(INFINITY), 0x7c00);
	ck_assert_uint_eq(cohort__f32_to_f16(-INFINITY), 0xfc00);
	ck_assert(isnan(cohort__f16_to_f32(cohort__f32_to_f16(NAN))));
	/* A NaN whose payload sits below the f16 mantissa stays NaN. */
	ck_assert(isnan(
	    cohort__f16_to_f32(cohort__f32_to_f16(kt_float(0x7f800001u)))));

	ck_assert(cohort__f16_to_f32(0x3c00) == 1.0f);
	ck_assert(cohort__f16_to_f32(0x7bff) == 65504.0f);
	ck_assert(cohort__f16_to_f32(0x0001) == 0x1p-24f);
	ck_assert(cohort__f16_to_f32(0x03ff) == 0x1.ff8p-15f);
	ck_assert(cohort__f16_to_f32(0x7c00) == INFINITY);
	ck_assert(cohort__f16_to_f32(0xfc00) == -INFINITY);
	ck_assert(isnan(cohort__f16_to_f32(0x7e00)));
	ck_assert(isnan(cohort__f16_to_f32(0xfc01)));
	ck_assert_uint_eq(kt_bits(cohort__f16_to_f32(0x8000)), 0x80000000u);
}
END_TEST

START_TEST(test_bf16_known)
{
	ck_assert_uint_eq(cohort__f32_to_bf16(1.0f), 0x3f80);
	ck_assert_uint_eq(cohort__f32_to_bf16(-2.0f), 0xc000);
	ck_assert_uint_eq(cohort__f32_to_bf16(0.0f), 0x0000);
	ck_assert_uint_eq(cohort__f32_to_bf16(-0.0f), 0x8000);
	/* Ties to even, below and above; just past the tie. */
	ck_assert_uint_eq(cohort__f32_to_bf16(kt_float(0x3f808000u)), 0x3f80);
	ck_assert_uint_eq(cohort__f32_to_bf16(kt_float(0x3f818000u)), 0x3f82);
	ck_assert_uint_eq(cohort__f32_to_bf16(kt_float(0x3f808001u)), 0x3f81);
	ck_assert_uint_eq(cohort__f32_to_bf16(kt_float(0x3f807fffu)), 0x3f80);
	/* FLT_MAX rounds to infinity; infinity stays. */
	ck_assert_uint_eq(cohort__f32_to_bf16(kt_float(0x7f7fffffu)), 0x7f80);
	ck_assert_uint_eq(cohort__f32_to_bf16(INFINITY), 0x7f80);
	ck_assert_uint_eq(cohort__f32_to_bf16(-INFINITY), 0xff80);
	/* NaN whose payload is all below bit 16: truncation would give inf. */
	ck_assert(isnan(
	    cohort__bf16_to_f32(cohort__f32_to_bf16(kt_float(0x7f800001u)))));
	ck_assert(isnan(cohort__bf16_to_f32(cohort__f32_to_bf16(NAN))));
	/* Subnormal f32 rounds like any other value. */
	ck_assert_uint_eq(cohort__f32_to_bf16(kt_float(0x00018000u)), 0x0002);
	ck_assert(cohort__bf16_to_f32(0x3f80) == 1.0f);
	ck_assert(cohort__bf16_to_f32(0x4049) == 3.140625f);
}
END_TEST

/* Every bit pattern goes to f32 and back unchanged (NaN stays NaN). */
START_TEST(test_half_roundtrip_all)
{
	uint32_t h;

	for (h = 0; h < 0x10000u; h++) {
		float f = cohort__f16_to_f32((uint16_t)h);
		float g = cohort__bf16_to_f32((uint16_t)h);
		bool nan16 = (h & 0x7c00u) == 0x7c00u && (h & 0x3ffu) != 0;
		bool nanbf = (h & 0x7f80u) == 0x7f80u && (h & 0x7fu) != 0;

		ck_assert_msg(nan16 == (bool)isnan(f), "f16 0x%04x", h);
		ck_assert_msg(nanbf == (bool)isnan(g), "bf16 0x%04x", h);
		if (nan16)
			ck_assert(
			    isnan(cohort__f16_to_f32(cohort__f32_to_f16(f))));
		else
			ck_assert_msg(cohort__f32_to_f16(f) == h,
			    "f16 0x%04x -> %a -> 0x%04x", h, (double)f,
			    cohort__f32_to_f16(f));
		if (nanbf)
			ck_assert(isnan(
			    cohort__bf16_to_f32(cohort__f32_to_bf16(g))));
		else
			ck_assert_uint_eq(cohort__f32_to_bf16(g), h);
	}
}
END_TEST

/* Checks that h is the nearest representable value to f (ties to an even
 * pattern); dec converts a pattern to f32, max is the largest finite one. */
static void
kt_check_nearest(float f, uint16_t h, float (*dec)(uint16_t), uint16_t max,
    const char *name)
{
	uint16_t mag = h & 0x7fffu;
	uint16_t sign = h & 0x8000u;
	double x = fabs((double)f);
	double v = fabs((double)dec(h));
	double up;
	double down;

	if (mag > max) { /* infinity: f must be at least max + half ulp */
		double top = dec(max);
		double ulp = top - (double)dec((uint16_t)(max - 1));
		ck_assert_msg(
		    x >= top + ulp / 2, "%s(%a) overflowed", name, (double)f);
		return;
	}
	ck_assert_msg((sign != 0) == (bool)signbit(f), "%s sign", name);
	if (mag == max) { /* and not infinity: below max + half ulp */
		double ulp = v - (double)dec((uint16_t)(max - 1));
		ck_assert_msg(x < v + ulp / 2, "%s(%a) should overflow", name,
		    (double)f);
	}
	up = mag < max ? (double)dec((uint16_t)(mag + 1)) : INFINITY;
	down = mag > 0 ? (double)dec((uint16_t)(mag - 1)) : -INFINITY;
	ck_assert_msg(
	    fabs(x - v) <= fabs(up - x) && fabs(x - v) <= fabs(x - down),
	    "%s(%a) = 0x%04x is not nearest", name, (double)f, h);
	if (fabs(x - v) == fabs(up - x) || fabs(x - v) == fabs(x - down))
		ck_assert_msg(
		    (mag & 1) == 0, "%s(%a) tie not even", name, (double)f);
}

START_TEST(test_half_nearest_random)
{
	int i;

	kt_seed(7);
	for (i = 0; i < 200000; i++) {
		/* Random finite f32 around the f16 / bf16 ranges. */
		uint32_t bits = (uint32_t)kt_rand();
		float f;

		if (i % 2 == 0) /* exponents 2^-26 .. 2^17 */
			bits = (bits & 0x807fffffu)
			    | ((uint32_t)(101 + kt_below(44)) << 23);
		f = kt_float(bits);
		if (isnan(f) || isinf(f))
			continue;
		if (i % 2 == 0)
			kt_check_nearest(f, cohort__f32_to_f16(f),
			    cohort__f16_to_f32, 0x7bff, "f16");
		kt_check_nearest(f, cohort__f32_to_bf16(f),
		    cohort__bf16_to_f32, 0x7f7f, "bf16");
	}
}
END_TEST

START_TEST(test_cast_array)
{
	float f[4] = { 1.0f, -2.0f, 65504.0f, 1e10f };
	uint16_t h[4];
	float back[4];

	KT_OK(cohort__ref_cast(h, COHORT_F16, f, COHORT_F32, 4));
	ck_assert_uint_eq(h[0], 0x3c00);
	ck_assert_uint_eq(h[1], 0xc000);
	ck_assert_uint_eq(h[2], 0x7bff);
	ck_assert_uint_eq(h[3], 0x7c00);
	KT_OK(cohort__ref_cast(back, COHORT_F32, h, COHORT_F16, 4));
	ck_assert(back[0] == 1.0f && back[2] == 65504.0f && isinf(back[3]));
	KT_OK(cohort__ref_cast(h, COHORT_BF16, f, COHORT_F32, 4));
	ck_assert_uint_eq(h[0], 0x3f80);
	KT_OK(cohort__ref_cast(back, COHORT_F32, h, COHORT_BF16, 4));
	ck_assert(back[0] == 1.0f && back[1] == -2.0f);
	KT_OK(cohort__ref_cast(NULL, COHORT_F32, NULL, COHORT_BF16, 0));
	KT_ERR(cohort__ref_cast(NULL, COHORT_F16, f, COHORT_F32, 4),
	    COHORT_EINVAL);
	KT_ERR(cohort__ref_cast(h, COHORT_F16, f, COHORT_DTYPE_COUNT, 4),
	    COHORT_EINVAL);
	KT_ERR(cohort__ref_cast(h, COHORT_F16, h, COHORT_BF16, 4),
	    COHORT_ENOTSUP);
	KT_ERR(
	    cohort__ref_cast(h, COHORT_F32, f, COHORT_F32, 4), COHORT_ENOTSUP);
	KT_ERR(
	    cohort__ref_cast(h, COHORT_F64, f, COHORT_F32, 4), COHORT_ENOTSUP);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* suite_cuda_ref: scale and reduce2                                        */
/* ------------------------------------------------------------------------ */

START_TEST(test_scale)
{
	float f[3] = { 1.0f, 2.0f, -3.0f };
	double d[2] = { 1.0, 3.0 };
	uint16_t h[2] = { 0x3c00, 0x4000 }; /* f16 1, 2 */
	uint16_t b[2] = { 0x3f80, 0x4040 }; /* bf16 1, 3 */
	uint16_t sub = 0x0001; /* smallest f16 subnormal */
	int32_t i32[1] = { 4 };

	KT_OK(cohort__ref_scale(f, 3, COHORT_F32, 0.5));
	ck_assert(f[0] == 0.5f && f[1] == 1.0f && f[2] == -1.5f);
	KT_OK(cohort__ref_scale(d, 2, COHORT_F64, 1.0 / 3.0));
	ck_assert(d[0] == 1.0 / 3.0 && d[1] == 3.0 * (1.0 / 3.0));
	KT_OK(cohort__ref_scale(h, 2, COHORT_F16, 0.25));
	ck_assert_uint_eq(h[0], 0x3400); /* 0.25 */
	ck_assert_uint_eq(h[1], 0x3800); /* 0.5 */
	KT_OK(cohort__ref_scale(b, 2, COHORT_BF16, 1.0 / 3.0));
	ck_assert_uint_eq(b[0], cohort__f32_to_bf16(1.0f / 3.0f));
	ck_assert_uint_eq(b[1], 0x3f80);
	KT_OK(cohort__ref_scale(&sub, 1, COHORT_F16, 0.5)); /* tie -> 0 */
	ck_assert_uint_eq(sub, 0x0000);
	KT_OK(cohort__ref_scale(NULL, 0, COHORT_F32, 2.0));
	KT_ERR(cohort__ref_scale(i32, 1, COHORT_I32, 2.0), COHORT_EINVAL);
	KT_ERR(cohort__ref_scale(NULL, 1, COHORT_F32, 2.0), COHORT_EINVAL);
	KT_ERR(
	    cohort__ref_scale(f, 1, COHORT_DTYPE_COUNT, 2.0), COHORT_EINVAL);
}
END_TEST

START_TEST(test_reduce2_int)
{
	int32_t a[4] = { INT32_MAX, -5, 7, 65536 };
	int32_t b[4] = { 1, 3, -9, 65536 };
	int64_t c[2] = { INT64_MIN, 6 };
	int64_t e[2] = { -1, -7 };
	uint8_t u[3] = { 200, 3, 16 };
	uint8_t v[3] = { 100, 250, 16 };

	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_I32, COHORT_SUM));
	ck_assert_int_eq(a[0], INT32_MIN); /* wraps */
	ck_assert_int_eq(a[1], -2);
	ck_assert_int_eq(a[2], -2);
	ck_assert_int_eq(a[3], 131072);
	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_I32, COHORT_PROD));
	ck_assert_int_eq(a[0], INT32_MIN);
	ck_assert_int_eq(a[1], -6);
	ck_assert_int_eq(a[2], 18);
	ck_assert_int_eq(a[3], 0); /* 2^17 * 2^16 wraps to 0 */
	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_I32, COHORT_MIN));
	ck_assert_int_eq(a[0], INT32_MIN);
	ck_assert_int_eq(a[1], -6);
	ck_assert_int_eq(a[2], -9);
	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_I32, COHORT_MAX));
	ck_assert_int_eq(a[0], 1);
	ck_assert_int_eq(a[1], 3);
	ck_assert_int_eq(a[3], 65536);

	KT_OK(cohort__ref_reduce2(c, e, 2, COHORT_I64, COHORT_SUM));
	ck_assert(c[0] == INT64_MAX && c[1] == -1);
	KT_OK(cohort__ref_reduce2(c, e, 2, COHORT_I64, COHORT_PROD));
	ck_assert(c[0] == -INT64_MAX && c[1] == 7);
	KT_OK(cohort__ref_reduce2(c, e, 2, COHORT_I64, COHORT_MAX));
	ck_assert(c[0] == -1 && c[1] == 7);

	KT_OK(cohort__ref_reduce2(u, v, 3, COHORT_U8, COHORT_SUM));
	ck_assert(u[0] == 44 && u[1] == 253 && u[2] == 32);
	KT_OK(cohort__ref_reduce2(u, v, 3, COHORT_U8, COHORT_PROD));
	ck_assert(u[0] == (uint8_t)(44 * 100) && u[2] == 0);
	KT_OK(cohort__ref_reduce2(u, v, 3, COHORT_U8, COHORT_MIN));
	ck_assert(u[0] == 48 && u[1] == 18 && u[2] == 0);
}
END_TEST

START_TEST(test_reduce2_float)
{
	float a[4] = { 1.5f, NAN, -0.0f, 3.0f };
	float b[4] = { 2.25f, 1.0f, 0.0f, NAN };
	double d[2] = { 0.1, 1e308 };
	double e[2] = { 0.2, 1e308 };
	uint16_t h[3] = { 0x3c00, 0x7bff, 0x0001 }; /* 1, 65504, 2^-24 */
	uint16_t k[3] = { 0x3c00, 0x3c00, 0x0001 };
	uint16_t bf[2] = { 0x3f80, 0x4000 };
	uint16_t bg[2] = { 0x3b80, 0x4040 }; /* 2^-8, 3 */

	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_F32, COHORT_MIN));
	ck_assert(a[0] == 1.5f);
	ck_assert(isnan(a[1]) && isnan(a[3])); /* NaN propagates */
	ck_assert(signbit(a[2])); /* first operand on ties */
	a[1] = 2.0f;
	a[3] = 3.0f;
	b[3] = 4.0f;
	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_F32, COHORT_SUM));
	ck_assert(a[0] == 3.75f && a[1] == 3.0f && a[3] == 7.0f);
	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_F32, COHORT_MAX));
	ck_assert(a[0] == 3.75f && a[3] == 7.0f);
	KT_OK(cohort__ref_reduce2(a, b, 4, COHORT_F32, COHORT_PROD));
	ck_assert(a[0] == 3.75f * 2.25f);

	KT_OK(cohort__ref_reduce2(d, e, 2, COHORT_F64, COHORT_SUM));
	ck_assert(d[0] == 0.1 + 0.2 && isinf(d[1]));

	KT_OK(cohort__ref_reduce2(h, k, 3, COHORT_F16, COHORT_SUM));
	ck_assert_uint_eq(h[0], 0x4000); /* 2 */
	ck_assert_uint_eq(h[1], 0x7bff); /* 65505 rounds back to 65504 */
	ck_assert_uint_eq(h[2], 0x0002); /* subnormals add exactly */
	KT_OK(cohort__ref_reduce2(h, k, 3, COHORT_F16, COHORT_MIN));
	ck_assert_uint_eq(h[0], 0x3c00);

	/* bf16: 1 + 2^-8 is a tie between 1 and 1 + 2^-7: even = 1. */
	KT_OK(cohort__ref_reduce2(bf, bg, 2, COHORT_BF16, COHORT_SUM));
	ck_assert_uint_eq(bf[0], 0x3f80);
	ck_assert_uint_eq(bf[1], 0x40a0); /* 5 */
	KT_OK(cohort__ref_reduce2(bf, bg, 2, COHORT_BF16, COHORT_PROD));
	ck_assert_uint_eq(bf[1], 0x4170); /* 15 */
}
END_TEST

START_TEST(test_reduce2_args)
{
	float a[1] = { 1.0f };

	KT_ERR(cohort__ref_reduce2(a, a, 1, COHORT_F32, COHORT_MEAN),
	    COHORT_EINVAL);
	KT_ERR(cohort__ref_reduce2(a, a, 1, COHORT_F32, COHORT_REDOP_COUNT),
	    COHORT_EINVAL);
	KT_ERR(cohort__ref_reduce2(a, a, 1, COHORT_DTYPE_COUNT, COHORT_SUM),
	    COHORT_EINVAL);
	KT_ERR(cohort__ref_reduce2(a, NULL, 1, COHORT_F32, COHORT_SUM),
	    COHORT_EINVAL);
	KT_OK(cohort__ref_reduce2(NULL, NULL, 0, COHORT_U8, COHORT_MAX));
}
END_TEST

/* ------------------------------------------------------------------------ */
/* suite_cuda_ref: pack / unpack and the batched copy's index code          */
/* ------------------------------------------------------------------------ */

START_TEST(test_pack_layout)
{
	struct cohort__pack_item it[4] = {
		{ NULL, 0, 10 },
		{ NULL, 0, 0 },
		{ NULL, 0, 16 },
		{ NULL, 0, 1 },
	};

	ck_assert_uint_eq(cohort__pack_layout(it, 4, 16), 48);
	ck_assert_uint_eq(it[0].offset, 0);
	ck_assert_uint_eq(it[1].offset, 16);
	ck_assert_uint_eq(it[2].offset, 16);
	ck_assert_uint_eq(it[3].offset, 32);
	ck_assert_uint_eq(cohort__pack_layout(it, 4, 1), 27);
	ck_assert_uint_eq(it[3].offset, 26);
	ck_assert_uint_eq(cohort__pack_layout(it, 4, 3), 0);
	ck_assert_uint_eq(cohort__pack_layout(it, 4, 0), 0);
	ck_assert_uint_eq(cohort__pack_layout(NULL, 0, 8), 0);
	it[0].bytes = SIZE_MAX - 4;
	ck_assert_uint_eq(cohort__pack_layout(it, 4, 16), 0);
}
END_TEST

START_TEST(test_pack_known)
{
	char a[3] = { 'a', 'b', 'c' };
	char b[2] = { 'x', 'y' };
	char bucket[8];
	struct cohort__pack_item it[3]
	    = { { b, 5, 2 }, { NULL, 4, 0 }, { a, 1, 3 } };

	memset(bucket, '.', sizeof(bucket));
	KT_OK(cohort__ref_pack(bucket, it, 3));
	ck_assert(memcmp(bucket, ".abc.xy.", 8) == 0);
	memcpy(bucket, "-ABC-XY-", 8);
	KT_OK(cohort__ref_unpack(bucket, it, 3));
	ck_assert(memcmp(a, "ABC", 3) == 0 && memcmp(b, "XY", 2) == 0);
	KT_OK(cohort__ref_pack(bucket, NULL, 0));
	KT_ERR(cohort__ref_pack(NULL, it, 3), COHORT_EINVAL);
	KT_ERR(cohort__ref_pack(bucket, NULL, 1), COHORT_EINVAL);
	it[1].bytes = 1; /* now non-empty with a NULL pointer */
	KT_ERR(cohort__ref_unpack(bucket, it, 3), COHORT_EINVAL);
	it[1].ptr = a;
	it[1].offset = SIZE_MAX;
	KT_ERR(cohort__ref_pack(bucket, it, 3), COHORT_EINVAL);
}
END_TEST

/* Every (src mod 16, dst mod 16, len) splits into parts that add up, with
 * the vector part aligned on both sides and the widest width allowed. */
START_TEST(test_copy_split)
{
	uint64_t s;
	uint64_t d;
	uint64_t len;

	for (s = 0; s < 32; s++)
		for (d = 0; d < 32; d++)
			for (len = 0; len < 80; len++) {
				uint32_t w;
				uint64_t head;
				uint64_t nvec;
				uint64_t diff = s ^ d;

				cohort__copy_split(0x1000 + s, 0x9000 + d, len,
				    &w, &head, &nvec);
				ck_assert_uint_eq(w,
				    (diff & 15) == 0      ? 16
				        : (diff & 3) == 0 ? 4
				                          : 1);
				ck_assert(head < w || (w == 1 && head == 0));
				ck_assert(head + nvec * w <= len);
				ck_assert(
				    len - head - nvec * w < w || nvec == 0);
				if (nvec > 0) {
					ck_assert_uint_eq(
					    (0x1000 + s + head) % w, 0);
					ck_assert_uint_eq(
					    (0x9000 + d + head) % w, 0);
				}
				if (len - head >= w)
					ck_assert_uint_gt(nvec, 0);
			}
}
END_TEST

START_TEST(test_copy_plan)
{
	static char bucket[1 << 16];
	static char t[5][1 << 15];
	struct cohort__pack_item it[5] = {
		{ t[0], 0, 8192 }, /* exactly one chunk */
		{ t[1], 9000, 0 }, /* skipped */
		{ t[2], 8192, 8193 }, /* two chunks, a 1-byte tail */
		{ t[3], 20000, 1 }, { t[4], 30000, 24576 }, /* three */
	};
	struct cohort__copy_batch b;
	uint64_t c;

	ck_assert_uint_le(sizeof(struct cohort__copy_batch), 4000);
	ck_assert_uint_eq(
	    cohort__copy_plan(&b, it, 5, (uintptr_t)bucket, true), 5);
	ck_assert_uint_eq(b.n, 4);
	ck_assert_uint_eq(b.nchunks, 1 + 2 + 1 + 3);
	ck_assert_uint_eq(b.d[0].chunk0, 0);
	ck_assert_uint_eq(b.d[1].chunk0, 1);
	ck_assert_uint_eq(b.d[2].chunk0, 3);
	ck_assert_uint_eq(b.d[3].chunk0, 4);
	ck_assert_uint_eq(b.d[1].src, (uintptr_t)t[2]);
	ck_assert_uint_eq(b.d[1].dst, (uintptr_t)bucket + 8192);
	for (c = 0; c < b.nchunks; c++) {
		static const uint32_t owner[] = { 0, 1, 1, 2, 3, 3, 3 };
		uint64_t off;
		uint64_t len;

		ck_assert_uint_eq(cohort__copy_find(&b, c), owner[c]);
		cohort__copy_range(&b, owner[c], c, &off, &len);
		if (c == 2) /* the second chunk of item 2 */
			ck_assert(off == 8192 && len == 1);
		if (c == 6)
			ck_assert(off == 16384 && len == 8192);
	}
	/* Unpack swaps the direction. */
	cohort__copy_plan(&b, it, 5, (uintptr_t)bucket, false);
	ck_assert_uint_eq(b.d[1].dst, (uintptr_t)t[2]);
	/* Only empty items: an empty batch that consumed them all. */
	ck_assert_uint_eq(cohort__copy_plan(&b, &it[1], 1, 0, true), 1);
	ck_assert_uint_eq(b.n, 0);
}
END_TEST

/* Random buckets, with misaligned tensors and more items than one batch:
 * the kernel's partitioning (emulated on the host) must produce exactly
 * what the plain reference produces, gaps untouched. */
static void
kt_emulate_pack(
    struct cohort__pack_item *it, size_t n, char *bucket, bool pack)
{
	struct cohort__copy_batch *b = malloc(sizeof(*b));
	size_t done = 0;

	ck_assert_ptr_nonnull(b);
	while (done < n) {
		done += cohort__copy_plan(
		    b, it + done, n - done, (uintptr_t)bucket, pack);
		if (b->n > 0)
			cohort__copy_emulate(b);
	}
	free(b);
}

/* Random sizes for n pack items: item i gets 0 bytes where max[k] is 0,
 * else 1 to max[k], for k drawn from 0..9. Returns the arena they need,
 * with slack bytes of room around each. */
static size_t
kt_item_sizes(
    struct cohort__pack_item *it, size_t n, const size_t max[10], size_t slack)
{
	size_t len = 0;

	for (size_t i = 0; i < n; i++) {
		size_t m = max[kt_below(10)];

		it[i].bytes = m == 0 ? 0 : 1 + kt_below(m);
		len += it[i].bytes + slack;
	}
	return (len);
}

START_TEST(test_copy_emulate_random)
{
	/* 1 in 10 empty, 3 up to 40 bytes, 5 up to 30000, 1 up to 100000 */
	static const size_t sizes[10]
	    = { 0, 40, 40, 40, 30000, 30000, 30000, 30000, 30000, 100000 };
	int round;

	kt_seed(11);
	for (round = 0; round < 40; round++) {
		size_t n = 1 + kt_below(round < 20 ? 20 : 400);
		size_t align = (size_t)1 << kt_below(6); /* 1 .. 32 */
		struct cohort__pack_item *it = calloc(n, sizeof(*it));
		struct cohort__pack_item *jt = calloc(n, sizeof(*jt));
		size_t arena_len = 0, pos = 0, total, i;
		char *arena, *arena2, *b1, *b2;

		ck_assert(it != NULL && jt != NULL);
		arena_len = kt_item_sizes(it, n, sizes, 32);
		total = cohort__pack_layout(it, n, align);
		arena = malloc(arena_len);
		arena2 = malloc(arena_len);
		b1 = malloc(total + 1);
		b2 = malloc(total + 1);
		ck_assert(arena && arena2 && b1 && b2);
		th_fill_bytes(arena, arena_len, kt_rand);
		for (i = 0; i < n; i++) {
			/* Half the tensors start misaligned. */
			pos = (pos + 15) & ~(size_t)15;
			if (kt_below(2) != 0)
				pos += kt_below(16);
			it[i].ptr = arena + pos;
			jt[i] = it[i];
			jt[i].ptr = arena2 + pos;
			pos += it[i].bytes;
		}
		ck_assert_uint_le(pos, arena_len);
		memset(b1, 0x5a, total + 1);
		memset(b2, 0x5a, total + 1);
		KT_OK(cohort__ref_pack(b1, it, n));
		kt_emulate_pack(it, n, b2, true);
		ck_assert_msg(memcmp(b1, b2, total + 1) == 0,
		    "round %d: emulated pack differs (n %zu align %zu)", round,
		    n, align);

		th_fill_bytes(b1, total, kt_rand);
		memcpy(arena2, arena, arena_len);
		KT_OK(cohort__ref_unpack(b1, it, n));
		kt_emulate_pack(jt, n, b1, false);
		ck_assert_msg(memcmp(arena, arena2, arena_len) == 0,
		    "round %d: emulated unpack differs", round);
		free(arena);
		free(arena2);
		free(b1);
		free(b2);
		free(it);
		free(jt);
	}
}
END_TEST

START_TEST(test_compare)
{
	float want[4] = { 1.0f, NAN, INFINITY, 100.0f };
	float got[4] = { 1.0f + 1e-7f, NAN, INFINITY, 100.001f };
	int32_t x[2] = { 1, 2 };
	int32_t y[2] = { 1, 3 };
	double rel;

	ck_assert_uint_eq(
	    cohort__ref_compare("f", COHORT_F32, got, want, 4, 1e-6, 0, &rel),
	    1);
	ck_assert(rel > 9e-6 && rel < 2e-5);
	ck_assert_uint_eq(
	    cohort__ref_compare("f", COHORT_F32, got, want, 4, 1e-4, 0, NULL),
	    0);
	got[1] = 0.0f;
	ck_assert_uint_eq(
	    cohort__ref_compare("f", COHORT_F32, got, want, 2, 1, 0, NULL), 1);
	ck_assert_uint_eq(
	    cohort__ref_compare("i", COHORT_I32, x, y, 2, 0.5, 0, NULL), 1);
}
END_TEST

/* Built with CUDA but no device: the launchers still validate first, and
 * the runtime helpers say "no GPU" rather than crash. */
START_TEST(test_no_gpu_paths)
{
	void *p = NULL;

	if (cohort__gpu_available()) {
		ck_assert_str_eq(cohort__gpu_unavailable_reason(), "");
		return;
	}
	ck_assert_str_ne(cohort__gpu_unavailable_reason(), "");
	KT_ERR(cohort__gpu_alloc(&p, 16), COHORT_ENOTSUP);
	ck_assert_ptr_null(p);
	cohort__gpu_free(NULL);
#ifdef COHORT_HAVE_CUDA
	KT_ERR(cohort__cuda_pack(NULL, NULL, 0, NULL), COHORT_EINVAL);
	KT_ERR(
	    cohort__cuda_scale(NULL, 4, COHORT_F32, 1.0, NULL), COHORT_EINVAL);
	KT_ERR(
	    cohort__cuda_scale(NULL, 4, COHORT_U8, 1.0, NULL), COHORT_EINVAL);
	KT_ERR(cohort__cuda_cast(&p, COHORT_I32, &p, COHORT_F32, 1, NULL),
	    COHORT_ENOTSUP);
	KT_ERR(cohort__cuda_reduce2(&p, &p, 1, COHORT_F32, COHORT_MEAN, NULL),
	    COHORT_EINVAL);
	KT_OK(
	    cohort__cuda_reduce2(NULL, NULL, 0, COHORT_F32, COHORT_SUM, NULL));
#endif
}
END_TEST

Suite *
suite_cuda_ref(void)
{
	return (th_suite("cuda_ref", "ref", 60, NULL, NULL, test_f16_known,
	    test_bf16_known, test_half_roundtrip_all, test_half_nearest_random,
	    test_cast_array, test_scale, test_reduce2_int, test_reduce2_float,
	    test_reduce2_args, test_pack_layout, test_pack_known,
	    test_copy_split, test_copy_plan, test_copy_emulate_random,
	    test_compare, test_no_gpu_paths, NULL));
}

/* ------------------------------------------------------------------------ */
/* suite_cuda_kernels: the kernels on a GPU                                 */
/* ------------------------------------------------------------------------ */

/* Returns false (after the one SKIP line) when there is no GPU. */
static bool
kt_need_gpu(void)
{
	if (cohort__gpu_available())
		return (true);
	printf("SKIP cuda kernels: no GPU (%s)\n",
	    cohort__gpu_unavailable_reason());
	fflush(stdout);
	return (false);
}

#ifdef COHORT_HAVE_CUDA

/* Uniform in [lo, hi). */
static double
kt_uniform(double lo, double hi)
{
	return (lo + (hi - lo) * (double)(kt_rand() >> 11) * 0x1p-53);
}

/* Random values of dt: floats uniform in [-r, r], integers full range. */
static void
kt_fill_dtype(void *p, cohort_dtype dt, size_t n, double r)
{
	size_t i;

	for (i = 0; i < n; i++) {
		double v = kt_uniform(-r, r);

		if (cohort__dtype_is_float(dt))
			cohort__elem_store(p, i, dt, v, 0);
		else
			th_fill_bytes((char *)p + i * cohort_dtype_size(dt),
			    cohort_dtype_size(dt), kt_rand);
	}
}

/* Per-precision tolerance: about one unit in the last place. */
static double
kt_eps(cohort_dtype dt)
{
	switch (dt) {
	case COHORT_F64:
		return (1e-12);
	case COHORT_F32:
		return (1e-6);
	case COHORT_F16:
		return (1e-3);
	case COHORT_BF16:
		return (8e-3);
	default:
		return (0);
	}
}

static void *
kt_dev(size_t bytes)
{
	void *p = NULL;

	KT_OK(cohort__gpu_alloc(&p, bytes > 0 ? bytes : 1));
	return (p);
}

static void *
kt_host(size_t bytes)
{
	void *p = malloc(bytes > 0 ? bytes : 1);

	ck_assert_ptr_nonnull(p);
	return (p);
}

/* A buffer on the host (h), its device twin (d) and the copy of d read
 * back (g). */
struct kt_buf {
	char *h, *g, *d;
	size_t len;
};

/* One direction of kt_gpu_pack_case: src gets random bytes, dst the
 * poison byte on both sides; the reference on the host and the kernel on
 * the device (pack: arena -> bucket, unpack: bucket -> arena) must leave
 * dst the same, byte for byte. */
static void
kt_gpu_pack_dir(const char *what, bool unpack, const struct kt_buf *src,
    const struct kt_buf *dst, int poison, const struct cohort__pack_item *hi,
    const struct cohort__pack_item *di, size_t n)
{
	th_fill_bytes(src->h, src->len, kt_rand);
	memset(dst->h, poison, dst->len);
	KT_OK(cohort__gpu_memcpy_h2d(src->d, src->h, src->len));
	KT_OK(cohort__gpu_memset(dst->d, poison, dst->len));
	if (unpack) {
		KT_OK(cohort__ref_unpack(src->h, hi, n));
		KT_OK(cohort__cuda_unpack(src->d, di, n, NULL));
	} else {
		KT_OK(cohort__ref_pack(dst->h, hi, n));
		KT_OK(cohort__cuda_pack(dst->d, di, n, NULL));
	}
	KT_OK(cohort__gpu_sync());
	KT_OK(cohort__gpu_memcpy_d2h(dst->g, dst->d, dst->len));
	ck_assert_msg(cohort__ref_compare(what, COHORT_U8, dst->g, dst->h,
	                  dst->len, 0, 10, NULL)
	        == 0,
	    "%s differs from the reference", what);
}

/* Pack then unpack a random bucket of n tensors laid out with align,
 * every byte (gaps included) checked against the reference. */
static void
kt_gpu_pack_case(size_t n, size_t align, bool misalign)
{
	/* 1 in 10 empty, 2 up to 64 bytes, 6 up to 200000, 1 up to 3 MB */
	static const size_t sizes[10] = { 0, 64, 64, 200000, 200000, 200000,
		200000, 200000, 200000, 3000000 };
	struct cohort__pack_item *hi = calloc(n, sizeof(*hi));
	struct cohort__pack_item *di = calloc(n, sizeof(*di));
	size_t arena_len = 0;
	size_t pos = 0;
	size_t total;
	size_t i;
	char *h_arena;
	char *h_bucket;
	char *g_bucket;
	char *g_arena;
	char *d_arena;
	char *d_bucket;
	char what[64];
	struct kt_buf arena, bucket;

	ck_assert(hi != NULL && di != NULL);
	arena_len = kt_item_sizes(hi, n, sizes, 512);
	total = cohort__pack_layout(hi, n, align);
	h_arena = kt_host(arena_len);
	g_arena = kt_host(arena_len);
	h_bucket = kt_host(total);
	g_bucket = kt_host(total);
	d_arena = kt_dev(arena_len);
	d_bucket = kt_dev(total);
	arena = (struct kt_buf) { h_arena, g_arena, d_arena, arena_len };
	bucket = (struct kt_buf) { h_bucket, g_bucket, d_bucket, total };
	for (i = 0; i < n; i++) {
		pos = (pos + 255) & ~(size_t)255;
		if (misalign)
			pos += kt_below(16);
		hi[i].ptr = h_arena + pos;
		di[i] = hi[i];
		di[i].ptr = d_arena + pos;
		pos += hi[i].bytes;
	}

	/* pack, then unpack into a poisoned arena: gaps must stay poisoned */
	snprintf(what, sizeof(what), "pack(n=%zu,align=%zu%s)", n, align,
	    misalign ? ",misaligned" : "");
	kt_gpu_pack_dir(what, false, &arena, &bucket, 0xa5, hi, di, n);
	snprintf(what, sizeof(what), "unpack(n=%zu,align=%zu%s)", n, align,
	    misalign ? ",misaligned" : "");
	kt_gpu_pack_dir(what, true, &bucket, &arena, 0x3c, hi, di, n);

	cohort__gpu_free(d_arena);
	cohort__gpu_free(d_bucket);
	free(h_arena);
	free(g_arena);
	free(h_bucket);
	free(g_bucket);
	free(hi);
	free(di);
}

START_TEST(test_gpu_pack)
{
	if (!kt_need_gpu())
		return;
	kt_seed(21);
	kt_gpu_pack_case(1, 16, false);
	kt_gpu_pack_case(64, 256, false);
	kt_gpu_pack_case(64, 16, true); /* 16-byte path with heads */
	kt_gpu_pack_case(300, 4, false); /* 4-byte path, 3 launches */
	kt_gpu_pack_case(300, 1, true); /* byte path */
}
END_TEST

START_TEST(test_gpu_scale)
{
	static const cohort_dtype dts[]
	    = { COHORT_F32, COHORT_F64, COHORT_F16, COHORT_BF16 };
	size_t n = (1u << 20) + 7;
	size_t k;

	if (!kt_need_gpu())
		return;
	kt_seed(22);
	for (k = 0; k < sizeof(dts) / sizeof(dts[0]); k++) {
		size_t bytes = n * cohort_dtype_size(dts[k]);
		void *want = kt_host(bytes);
		void *got = kt_host(bytes);
		void *d = kt_dev(bytes);
		double alpha = k % 2 == 0 ? 1.0 / 3.0 : 0.125;

		kt_fill_dtype(want, dts[k], n, 1000.0);
		KT_OK(cohort__gpu_memcpy_h2d(d, want, bytes));
		KT_OK(cohort__ref_scale(want, n, dts[k], alpha));
		KT_OK(cohort__cuda_scale(d, n, dts[k], alpha, NULL));
		KT_OK(cohort__gpu_sync());
		KT_OK(cohort__gpu_memcpy_d2h(got, d, bytes));
		ck_assert_msg(
		    cohort__ref_compare(cohort_dtype_name(dts[k]), dts[k], got,
		        want, n, kt_eps(dts[k]), 10, NULL)
		        == 0,
		    "scale %s differs from the reference",
		    cohort_dtype_name(dts[k]));
		cohort__gpu_free(d);
		free(want);
		free(got);
	}
}
END_TEST

START_TEST(test_gpu_cast)
{
	size_t n = (1u << 18) * 3 + 5;
	float *f, *fg, *fw;
	uint16_t *h, *hg, *hw;
	void *df;
	void *dh;
	size_t i;
	int k;

	if (!kt_need_gpu())
		return;
	kt_seed(23);
	f = kt_host(n * sizeof(float));
	fg = kt_host(n * sizeof(float));
	fw = kt_host(n * sizeof(float));
	h = kt_host(n * sizeof(uint16_t));
	hg = kt_host(n * sizeof(uint16_t));
	hw = kt_host(n * sizeof(uint16_t));
	df = kt_dev(n * sizeof(float));
	dh = kt_dev(n * sizeof(uint16_t));
	for (i = 0; i < n; i++) {
		/* thirds: any bit pattern, f16-range values, exact ties */
		uint32_t bits = (uint32_t)kt_rand();
		if (i % 3 == 1)
			bits = (bits & 0x807fffffu)
			    | ((uint32_t)(101 + kt_below(44)) << 23);
		else if (i % 3 == 2)
			bits = (bits & 0xffffe000u) | 0x1000u;
		f[i] = kt_float(bits);
		h[i] = (uint16_t)i; /* every pattern, several times */
	}
	for (k = 0; k < 2; k++) {
		cohort_dtype half = k == 0 ? COHORT_F16 : COHORT_BF16;
		const char *name = cohort_dtype_name(half);

		/* f32 -> half, exact (NaN only needs to stay NaN) */
		KT_OK(cohort__gpu_memcpy_h2d(df, f, n * sizeof(float)));
		KT_OK(cohort__ref_cast(hw, half, f, COHORT_F32, n));
		KT_OK(cohort__cuda_cast(dh, half, df, COHORT_F32, n, NULL));
		KT_OK(cohort__gpu_sync());
		KT_OK(cohort__gpu_memcpy_d2h(hg, dh, n * sizeof(uint16_t)));
		ck_assert_msg(
		    cohort__ref_compare(name, half, hg, hw, n, 0, 10, NULL)
		        == 0,
		    "cast f32 -> %s differs from the reference", name);

		/* half -> f32, exact */
		KT_OK(cohort__gpu_memcpy_h2d(dh, h, n * sizeof(uint16_t)));
		KT_OK(cohort__ref_cast(fw, COHORT_F32, h, half, n));
		KT_OK(cohort__cuda_cast(df, COHORT_F32, dh, half, n, NULL));
		KT_OK(cohort__gpu_sync());
		KT_OK(cohort__gpu_memcpy_d2h(fg, df, n * sizeof(float)));
		ck_assert_msg(cohort__ref_compare(
		                  name, COHORT_F32, fg, fw, n, 0, 10, NULL)
		        == 0,
		    "cast %s -> f32 differs from the reference", name);
	}
	cohort__gpu_free(df);
	cohort__gpu_free(dh);
	free(f);
	free(fg);
	free(fw);
	free(h);
	free(hg);
	free(hw);
}
END_TEST

START_TEST(test_gpu_reduce2)
{
	static const cohort_redop ops[]
	    = { COHORT_SUM, COHORT_PROD, COHORT_MIN, COHORT_MAX };
	size_t n = 100003;
	int dt;
	size_t k;

	if (!kt_need_gpu())
		return;
	kt_seed(24);
	for (dt = 0; dt < COHORT_DTYPE_COUNT; dt++) {
		size_t bytes = n * cohort_dtype_size((cohort_dtype)dt);
		void *a = kt_host(bytes);
		void *b = kt_host(bytes);
		void *got = kt_host(bytes);
		void *da = kt_dev(bytes);
		void *db = kt_dev(bytes);

		for (k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
			char what[48];

			kt_fill_dtype(a, (cohort_dtype)dt, n, 10.0);
			kt_fill_dtype(b, (cohort_dtype)dt, n, 10.0);
			KT_OK(cohort__gpu_memcpy_h2d(da, a, bytes));
			KT_OK(cohort__gpu_memcpy_h2d(db, b, bytes));
			KT_OK(cohort__ref_reduce2(
			    a, b, n, (cohort_dtype)dt, ops[k]));
			KT_OK(cohort__cuda_reduce2(
			    da, db, n, (cohort_dtype)dt, ops[k], NULL));
			KT_OK(cohort__gpu_sync());
			KT_OK(cohort__gpu_memcpy_d2h(got, da, bytes));
			snprintf(what, sizeof(what), "reduce2 %s %s",
			    cohort_dtype_name((cohort_dtype)dt),
			    cohort_redop_name(ops[k]));
			ck_assert_msg(
			    cohort__ref_compare(what, (cohort_dtype)dt, got, a,
			        n, kt_eps((cohort_dtype)dt), 10, NULL)
			        == 0,
			    "%s differs from the reference", what);
		}
		cohort__gpu_free(da);
		cohort__gpu_free(db);
		free(a);
		free(b);
		free(got);
	}
}
END_TEST

/* Argument errors come before any launch; a CUDA failure becomes
 * COHORT_ECUDA with the CUDA text kept; the device stays usable. */
START_TEST(test_gpu_errors)
{
	char desc[256];
	void *huge = NULL;
	float *d;

	if (!kt_need_gpu())
		return;
	KT_OK(cohort__gpu_describe(desc, sizeof(desc)));
	printf("cuda kernels: %s\n", desc);
	d = kt_dev(64 * sizeof(float));
	KT_OK(cohort__cuda_scale(d, 0, COHORT_F32, 2.0, NULL));
	KT_ERR(cohort__cuda_scale(d, 4, COHORT_I32, 2.0, NULL), COHORT_EINVAL);
	KT_ERR(cohort__gpu_alloc(&huge, (size_t)1 << 60), COHORT_ECUDA);
	ck_assert_ptr_null(huge);
	ck_assert_msg(strstr(cohort__cuda_last_error(), "cudaMalloc") != NULL,
	    "last error: %s", cohort__cuda_last_error());
	KT_OK(cohort__cuda_scale(d, 64, COHORT_F32, 2.0, NULL));
	KT_OK(cohort__gpu_sync());
	cohort__gpu_free(d);
}
END_TEST

#else /* !COHORT_HAVE_CUDA: the kernels do not exist in this build */

START_TEST(test_gpu_pack) { (void)kt_need_gpu(); }
END_TEST

START_TEST(test_gpu_scale) { (void)kt_need_gpu(); }
END_TEST

START_TEST(test_gpu_cast) { (void)kt_need_gpu(); }
END_TEST

START_TEST(test_gpu_reduce2) { (void)kt_need_gpu(); }
END_TEST

START_TEST(test_gpu_errors) { (void)kt_need_gpu(); }
END_TEST

#endif /* COHORT_HAVE_CUDA */

Suite *
suite_cuda_kernels(void)
{
	return (th_suite("cuda_kernels", "kernels", 120, NULL, NULL,
	    test_gpu_pack, test_gpu_scale, test_gpu_cast, test_gpu_reduce2,
	    test_gpu_errors, NULL));
}
