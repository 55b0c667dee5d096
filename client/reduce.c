/*
 * reduce.c - element-wise reduction kernels shared by the data-plane
 * backends, and the half-precision converters.
 *
 * Every kernel is a plain loop that gcc vectorises. The same source is
 * compiled three times: for the baseline (SSE2), for AVX2 (+F16C, whose
 * f16 path uses the conversion intrinsics) and for AVX-512 (F, BW, VL).
 * The best variant the running CPU supports is picked once, at first use
 * (COHORT_REDUCE_ISA=generic|avx2|avx512 forces one, for tests and
 * benchmarks). The file asks for -O3 itself: the Makefile builds with -O2,
 * whose very-cheap vectoriser cost model leaves some of these loops scalar.
 *
 * Semantics: integers wrap (computed in unsigned arithmetic, no UB), MIN
 * and MAX compare i32/i64 as signed and u8 as unsigned; f16 and bf16 are
 * widened to f32, reduced, and rounded back to nearest even. MEAN reduces
 * as SUM (the division is cohort__scale_div's job).
 */
#pragma GCC optimize("O3")

#include <cpuid.h>
#include <immintrin.h>
#include <stdatomic.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

/* ------------------------------------------------------------------------ */
/* Kernel families                                                          */
/* ------------------------------------------------------------------------ */

typedef void (*reduce_fn)(void *, const void *, size_t);

/* [dtype][op] with op SUM, PROD, MIN, MAX (MEAN uses SUM). */
struct reduce_table {
	const char *name;
	reduce_fn fn[COHORT_DTYPE_COUNT][4];
};

#define REDUCE_LOOP(T, EXPR)                                                  \
	T *restrict d = dst;                                                  \
	const T *restrict s = src;                                            \
	for (size_t i = 0; i < n; i++) {                                      \
		T a = d[i];                                                   \
		T b = s[i];                                                   \
		d[i] = (EXPR);                                                \
	}

/* 16-bit floats: widened to f32 (TO32), reduced, narrowed (TO16). */
#define REDUCE_HALF_LOOP(TO32, TO16, EXPR)                                    \
	uint16_t *restrict d = dst;                                           \
	const uint16_t *restrict s = src;                                     \
	for (size_t i = 0; i < n; i++) {                                      \
		float a = TO32(d[i]);                                         \
		float b = TO32(s[i]);                                         \
		d[i] = TO16(EXPR);                                            \
	}
#define REDUCE_BF16_LOOP(EXPR)                                                \
	REDUCE_HALF_LOOP(cohort__bf16_to_f32, cohort__f32_to_bf16, EXPR)
#define REDUCE_F16_SOFT_LOOP(EXPR)                                            \
	REDUCE_HALF_LOOP(cohort__f16_to_f32, cohort__f32_to_f16, EXPR)

#define REDUCE_SUM(a, b) ((a) + (b))
#define REDUCE_PROD(a, b) ((a) * (b))
#define REDUCE_MIN(a, b) ((b) < (a) ? (b) : (a))
#define REDUCE_MAX(a, b) ((b) > (a) ? (b) : (a))

/* One family of kernels for target attribute ATTR with suffix SFX. The f16
 * kernels come from F16FAM (soft or F16C). */
#define REDUCE_FAMILY(SFX, ATTR)                                              \
	REDUCE_K(SFX, ATTR, f32_sum, float, REDUCE_SUM(a, b))                 \
	REDUCE_K(SFX, ATTR, f32_prod, float, REDUCE_PROD(a, b))               \
	REDUCE_K(SFX, ATTR, f32_min, float, REDUCE_MIN(a, b))                 \
	REDUCE_K(SFX, ATTR, f32_max, float, REDUCE_MAX(a, b))                 \
	REDUCE_K(SFX, ATTR, f64_sum, double, REDUCE_SUM(a, b))                \
	REDUCE_K(SFX, ATTR, f64_prod, double, REDUCE_PROD(a, b))              \
	REDUCE_K(SFX, ATTR, f64_min, double, REDUCE_MIN(a, b))                \
	REDUCE_K(SFX, ATTR, f64_max, double, REDUCE_MAX(a, b))                \
	REDUCE_K(SFX, ATTR, i32_sum, uint32_t, REDUCE_SUM(a, b))              \
	REDUCE_K(SFX, ATTR, i32_prod, uint32_t, REDUCE_PROD(a, b))            \
	REDUCE_K(SFX, ATTR, i32_min, int32_t, REDUCE_MIN(a, b))               \
	REDUCE_K(SFX, ATTR, i32_max, int32_t, REDUCE_MAX(a, b))               \
	REDUCE_K(SFX, ATTR, i64_sum, uint64_t, REDUCE_SUM(a, b))              \
	REDUCE_K(SFX, ATTR, i64_prod, uint64_t, REDUCE_PROD(a, b))            \
	REDUCE_K(SFX, ATTR, i64_min, int64_t, REDUCE_MIN(a, b))               \
	REDUCE_K(SFX, ATTR, i64_max, int64_t, REDUCE_MAX(a, b))               \
	REDUCE_K(SFX, ATTR, u8_sum, uint8_t, (uint8_t)REDUCE_SUM(a, b))       \
	REDUCE_K(SFX, ATTR, u8_prod, uint8_t, (uint8_t)REDUCE_PROD(a, b))     \
	REDUCE_K(SFX, ATTR, u8_min, uint8_t, REDUCE_MIN(a, b))                \
	REDUCE_K(SFX, ATTR, u8_max, uint8_t, REDUCE_MAX(a, b))

#define REDUCE_K(SFX, ATTR, NAME, T, EXPR)                                    \
	ATTR static void reduce_##NAME##_##SFX(                               \
	    void *dst, const void *src, size_t n)                             \
	{                                                                     \
		REDUCE_LOOP(T, EXPR)                                          \
	}
/* The four generic kernels of a 16-bit type whose loop is LOOP(EXPR). */
#define REDUCE_KL(NAME, LOOP, EXPR)                                           \
	static void reduce_##NAME##_generic(                                  \
	    void *dst, const void *src, size_t n)                             \
	{                                                                     \
		LOOP(EXPR)                                                    \
	}
#define REDUCE_KL_ALL(DT, LOOP)                                               \
	REDUCE_KL(DT##_sum, LOOP, REDUCE_SUM(a, b))                           \
	REDUCE_KL(DT##_prod, LOOP, REDUCE_PROD(a, b))                         \
	REDUCE_KL(DT##_min, LOOP, REDUCE_MIN(a, b))                           \
	REDUCE_KL(DT##_max, LOOP, REDUCE_MAX(a, b))

#define REDUCE_ATTR_GENERIC
#define REDUCE_ATTR_AVX2 __attribute__((target("avx2,f16c,fma")))
#define REDUCE_ATTR_AVX512                                                    \
	__attribute__((target("avx512f,avx512bw,avx512vl,avx2,f16c,fma")))

REDUCE_FAMILY(generic, REDUCE_ATTR_GENERIC)
REDUCE_FAMILY(avx2, REDUCE_ATTR_AVX2)
REDUCE_FAMILY(avx512, REDUCE_ATTR_AVX512)

/* bf16 without AVX2: the plain loop (gcc vectorises it with SSE2); f16
 * without F16C: exact software conversion, slow but correct. */
REDUCE_KL_ALL(bf16, REDUCE_BF16_LOOP)
REDUCE_KL_ALL(f16, REDUCE_F16_SOFT_LOOP)

/* bf16 with AVX2: widen 8 lanes by a shift, reduce in f32, round to
 * nearest even with the same integer trick as the scalar code (NaN kept
 * quiet), narrow with a pack. The tail goes through a padded copy. */
#define REDUCE_BF16_V8(VEXPR, dp, sp)                                         \
	do {                                                                  \
		__m256i a_ = _mm256_slli_epi32(                               \
		    _mm256_cvtepu16_epi32(                                    \
		        _mm_loadu_si128((const __m128i *)(dp))),              \
		    16);                                                      \
		__m256i b_ = _mm256_slli_epi32(                               \
		    _mm256_cvtepu16_epi32(                                    \
		        _mm_loadu_si128((const __m128i *)(sp))),              \
		    16);                                                      \
		__m256 a = _mm256_castsi256_ps(a_);                           \
		__m256 b = _mm256_castsi256_ps(b_);                           \
		__m256i u = _mm256_castps_si256(VEXPR);                       \
		__m256i lsb = _mm256_and_si256(                               \
		    _mm256_srli_epi32(u, 16), _mm256_set1_epi32(1));          \
		__m256i rn = _mm256_srli_epi32(                               \
		    _mm256_add_epi32(                                         \
		        u, _mm256_add_epi32(lsb, _mm256_set1_epi32(0x7fff))), \
		    16);                                                      \
		__m256i qn = _mm256_or_si256(                                 \
		    _mm256_srli_epi32(u, 16), _mm256_set1_epi32(0x40));       \
		__m256i isnan = _mm256_cmpgt_epi32(                           \
		    _mm256_and_si256(u, _mm256_set1_epi32(0x7fffffff)),       \
		    _mm256_set1_epi32(0x7f800000));                           \
		__m256i r = _mm256_blendv_epi8(rn, qn, isnan);                \
		r = _mm256_permute4x64_epi64(                                 \
		    _mm256_packus_epi32(r, r), 0xd8);                         \
		_mm_storeu_si128((__m128i *)(dp), _mm256_castsi256_si128(r)); \
	} while (0)

/* An 8-lane kernel for 16-bit floats: V8(VEXPR, d, s) reduces eight
 * elements in place; the tail goes through the same step on a padded
 * copy, so that rounding is identical. */
#define REDUCE_K8(SFX, ATTR, NAME, V8, VEXPR)                                 \
	ATTR static void reduce_##NAME##_##SFX(                               \
	    void *dst, const void *src, size_t n)                             \
	{                                                                     \
		uint16_t *d = dst;                                            \
		const uint16_t *s = src;                                      \
		size_t i = 0;                                                 \
                                                                              \
		for (; i + 8 <= n; i += 8)                                    \
			V8(VEXPR, d + i, s + i);                              \
		if (i < n) {                                                  \
			uint16_t ta[8] = { 0 }, tb[8] = { 0 };                \
			size_t k = n - i;                                     \
                                                                              \
			memcpy(ta, d + i, k * 2);                             \
			memcpy(tb, s + i, k * 2);                             \
			V8(VEXPR, ta, tb);                                    \
			memcpy(d + i, ta, k * 2);                             \
		}                                                             \
	}
/* The four 8-lane kernels of a 16-bit type. _mm256_min_ps(b, a) returns
 * a when either is NaN or both equal, which is REDUCE_MIN(a, b) =
 * (b < a ? b : a). */
#define REDUCE_K8_ALL(SFX, ATTR, DT, V8)                                      \
	REDUCE_K8(SFX, ATTR, DT##_sum, V8, _mm256_add_ps(a, b))               \
	REDUCE_K8(SFX, ATTR, DT##_prod, V8, _mm256_mul_ps(a, b))              \
	REDUCE_K8(SFX, ATTR, DT##_min, V8, _mm256_min_ps(b, a))               \
	REDUCE_K8(SFX, ATTR, DT##_max, V8, _mm256_max_ps(b, a))
REDUCE_K8_ALL(avx2, REDUCE_ATTR_AVX2, bf16, REDUCE_BF16_V8)
REDUCE_K8_ALL(avx512, REDUCE_ATTR_AVX512, bf16, REDUCE_BF16_V8)

/* f16 with F16C: eight lanes per step through the conversion
 * instructions. */
#define REDUCE_F16_V8(VEXPR, dp, sp)                                          \
	do {                                                                  \
		__m256 a = _mm256_cvtph_ps(                                   \
		    _mm_loadu_si128((const __m128i *)(dp)));                  \
		__m256 b = _mm256_cvtph_ps(                                   \
		    _mm_loadu_si128((const __m128i *)(sp)));                  \
		_mm_storeu_si128((__m128i *)(dp),                             \
		    _mm256_cvtps_ph((VEXPR), _MM_FROUND_TO_NEAREST_INT));     \
	} while (0)
REDUCE_K8_ALL(avx2, REDUCE_ATTR_AVX2, f16, REDUCE_F16_V8)
REDUCE_K8_ALL(avx512, REDUCE_ATTR_AVX512, f16, REDUCE_F16_V8)

#define REDUCE_ROW(SFX, DT)                                                   \
	{                                                                     \
		reduce_##DT##_sum_##SFX, reduce_##DT##_prod_##SFX,            \
		    reduce_##DT##_min_##SFX, reduce_##DT##_max_##SFX          \
	}
#define REDUCE_TABLE(SFX)                                                     \
	{                                                                     \
		.name = #SFX,                                                 \
		.fn = {                                                       \
			[COHORT_F32] = REDUCE_ROW(SFX, f32),                  \
			[COHORT_F64] = REDUCE_ROW(SFX, f64),                  \
			[COHORT_F16] = REDUCE_ROW(SFX, f16),                  \
			[COHORT_BF16] = REDUCE_ROW(SFX, bf16),                \
			[COHORT_I32] = REDUCE_ROW(SFX, i32),                  \
			[COHORT_I64] = REDUCE_ROW(SFX, i64),                  \
			[COHORT_U8] = REDUCE_ROW(SFX, u8),                    \
		},                                                            \
	}

static const struct reduce_table reduce_tables[] = {
	REDUCE_TABLE(generic),
	REDUCE_TABLE(avx2),
	REDUCE_TABLE(avx512),
};

static _Atomic(const struct reduce_table *) reduce_active;

static bool
reduce_cpu_has_f16c(void)
{
	unsigned a, b, c, d;

	if (!__get_cpuid(1, &a, &b, &c, &d))
		return (false);
	return ((c & bit_F16C) != 0);
}

static const struct reduce_table *
reduce_pick(void)
{
	const char *force = cohort__knob_str(COHORT__KNOB_REDUCE_ISA);
	bool avx2, avx512;

	__builtin_cpu_init();
	avx2 = __builtin_cpu_supports("avx2") && __builtin_cpu_supports("fma")
	    && reduce_cpu_has_f16c();
	avx512 = avx2 && __builtin_cpu_supports("avx512f")
	    && __builtin_cpu_supports("avx512bw")
	    && __builtin_cpu_supports("avx512vl");
	if (force != NULL) {
		if (strcmp(force, "generic") == 0)
			return (&reduce_tables[0]);
		if (strcmp(force, "avx2") == 0 && avx2)
			return (&reduce_tables[1]);
	}
	if (avx512)
		return (&reduce_tables[2]);
	if (avx2)
		return (&reduce_tables[1]);
	return (&reduce_tables[0]);
}

static const struct reduce_table *
reduce_get(void)
{
	const struct reduce_table *t;

	t = atomic_load_explicit(&reduce_active, memory_order_acquire);
	if (t == NULL) {
		/* Racing first calls compute the same answer. */
		t = reduce_pick();
		atomic_store_explicit(&reduce_active, t, memory_order_release);
	}
	return (t);
}

/* Testing and benchmarking hook: selects "generic", "avx2" or "avx512"
 * (false if unknown or unsupported here), NULL = automatic. Returns the
 * name of the variant now active through *active (may be NULL). */
bool
cohort__reduce_select(const char *isa, const char **active)
{
	const struct reduce_table *t = reduce_pick();
	bool ok = true;

	if (isa != NULL) {
		if (strcmp(isa, "generic") == 0)
			t = &reduce_tables[0];
		else if (strcmp(isa, "avx2") == 0
		    && reduce_pick() != &reduce_tables[0])
			t = &reduce_tables[1];
		else if (strcmp(isa, "avx512") == 0
		    && reduce_pick() == &reduce_tables[2])
			t = &reduce_tables[2];
		else
			ok = false;
	}
	if (ok)
		atomic_store_explicit(&reduce_active, t, memory_order_release);
	if (active != NULL)
		*active = reduce_get()->name;
	return (ok);
}

void
cohort__reduce(
    void *dst, const void *src, size_t n, cohort_dtype dt, cohort_redop op)
{
	const struct reduce_table *t;

	if (n == 0 || (unsigned)dt >= COHORT_DTYPE_COUNT
	    || (unsigned)op >= COHORT_REDOP_COUNT)
		return;
	if (op == COHORT_MEAN)
		op = COHORT_SUM;
	t = reduce_get();
	t->fn[dt][op](dst, src, n);
}

/* ------------------------------------------------------------------------ */
/* MEAN's final division                                                    */
/* ------------------------------------------------------------------------ */

static void
reduce_div_f32(float *restrict d, size_t n, float v)
{
	for (size_t i = 0; i < n; i++)
		d[i] = d[i] / v;
}

static void
reduce_div_f64(double *restrict d, size_t n, double v)
{
	for (size_t i = 0; i < n; i++)
		d[i] = d[i] / v;
}

static void
reduce_div_bf16(uint16_t *restrict d, size_t n, float v)
{
	for (size_t i = 0; i < n; i++)
		d[i] = cohort__f32_to_bf16(cohort__bf16_to_f32(d[i]) / v);
}

REDUCE_ATTR_AVX2 static void
reduce_div_f16_f16c(uint16_t *d, size_t n, float v)
{
	__m256 vv = _mm256_set1_ps(v);
	size_t i = 0;

	for (; i + 8 <= n; i += 8) {
		__m256 a = _mm256_cvtph_ps(
		    _mm_loadu_si128((const __m128i *)(d + i)));

		_mm_storeu_si128((__m128i *)(d + i),
		    _mm256_cvtps_ph(
		        _mm256_div_ps(a, vv), _MM_FROUND_TO_NEAREST_INT));
	}
	for (; i < n; i++)
		d[i] = cohort__f32_to_f16(cohort__f16_to_f32(d[i]) / v);
}

static void
reduce_div_f16_soft(uint16_t *d, size_t n, float v)
{
	for (size_t i = 0; i < n; i++)
		d[i] = cohort__f32_to_f16(cohort__f16_to_f32(d[i]) / v);
}

/* Integers: divided in double, truncated toward zero. */
#define REDUCE_DIV_INT(T, dst, n, divisor)                                    \
	do {                                                                  \
		T *d_ = (dst);                                                \
		for (size_t i_ = 0; i_ < (n); i_++)                           \
			d_[i_] = (T)((double)d_[i_] / (divisor));             \
	} while (0)

void
cohort__scale_div(void *dst, size_t n, cohort_dtype dt, double divisor)
{
	if (n == 0 || divisor == 1.0)
		return;
	switch (dt) {
	case COHORT_F32:
		reduce_div_f32(dst, n, (float)divisor);
		break;
	case COHORT_F64:
		reduce_div_f64(dst, n, divisor);
		break;
	case COHORT_BF16:
		reduce_div_bf16(dst, n, (float)divisor);
		break;
	case COHORT_F16:
		if (reduce_get() != &reduce_tables[0])
			reduce_div_f16_f16c(dst, n, (float)divisor);
		else
			reduce_div_f16_soft(dst, n, (float)divisor);
		break;
	case COHORT_I32:
		REDUCE_DIV_INT(int32_t, dst, n, divisor);
		break;
	case COHORT_I64:
		REDUCE_DIV_INT(int64_t, dst, n, divisor);
		break;
	case COHORT_U8:
		REDUCE_DIV_INT(uint8_t, dst, n, divisor);
		break;
	default:
		break;
	}
}
