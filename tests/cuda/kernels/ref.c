/*
 * ref.c - CPU references of the kernels in fusion.cu, and the host half of
 * the batched copy (its planner and an emulation of its partitioning).
 *
 * These define the results: the kernels are tested against them element by
 * element (tests/cuda/test_kernels.c, like llm.c dev/cuda). Pure C, built
 * everywhere; keep each loop the plainest statement of the semantics.
 *
 * The scalar f16/bf16 conversions come from client/reduce.c (IEEE 754
 * binary16; bfloat16 as PyTorch c10/util/BFloat16.h, round to nearest even
 * through the 0x7fff + lsb bias): one definition for the CPU reductions,
 * these references and, through the tests, the kernels.
 */
#include <float.h>
#include <math.h>
#include <stdio.h>
#include <string.h>

#include "cohort_common.h"
#include "half.h"
#include "kernels.h"
#include "dtype.h"

/* ------------------------------------------------------------------------ */
/* Argument rules (shared with the launchers)                               */
/* ------------------------------------------------------------------------ */

static bool
ref_dtype_valid(cohort_dtype dt)
{
	return ((unsigned)dt < COHORT_DTYPE_COUNT);
}

cohort_status
cohort__kernel_check_pack(
    const void *bucket, const struct cohort__pack_item *items, size_t n)
{
	size_t i;

	if (bucket == NULL)
		return (cohort__err(COHORT_EINVAL, "pack: NULL bucket"));
	if (items == NULL && n > 0)
		return (cohort__err(COHORT_EINVAL, "pack: NULL items"));
	for (i = 0; i < n; i++) {
		if (items[i].bytes == 0)
			continue;
		if (items[i].ptr == NULL)
			return (cohort__err(COHORT_EINVAL,
			    "pack: item %zu has a NULL pointer", i));
		if (items[i].offset > SIZE_MAX - items[i].bytes)
			return (cohort__err(COHORT_EINVAL,
			    "pack: item %zu overflows the bucket", i));
	}
	return (COHORT_OK);
}

cohort_status
cohort__kernel_check_scale(const void *x, size_t count, cohort_dtype dt)
{
	if (dt != COHORT_F32 && dt != COHORT_F64 && dt != COHORT_F16
	    && dt != COHORT_BF16)
		return (cohort__err(COHORT_EINVAL,
		    "scale: dtype %d is not a floating-point type", (int)dt));
	if (x == NULL && count > 0)
		return (cohort__err(COHORT_EINVAL, "scale: NULL buffer"));
	return (COHORT_OK);
}

cohort_status
cohort__kernel_check_cast(const void *dst, cohort_dtype ddt, const void *src,
    cohort_dtype sdt, size_t count)
{
	if (!ref_dtype_valid(ddt) || !ref_dtype_valid(sdt))
		return (cohort__err(COHORT_EINVAL, "cast: invalid dtype"));
	if ((dst == NULL || src == NULL) && count > 0)
		return (cohort__err(COHORT_EINVAL, "cast: NULL buffer"));
	if ((sdt == COHORT_F32 && (ddt == COHORT_F16 || ddt == COHORT_BF16))
	    || (ddt == COHORT_F32
	        && (sdt == COHORT_F16 || sdt == COHORT_BF16)))
		return (COHORT_OK);
	return (cohort__err(COHORT_ENOTSUP, "cast: %s to %s is not supported",
	    cohort_dtype_name(sdt), cohort_dtype_name(ddt)));
}

cohort_status
cohort__kernel_check_reduce2(const void *dst, const void *src, size_t count,
    cohort_dtype dt, cohort_redop op)
{
	if (!ref_dtype_valid(dt))
		return (cohort__err(COHORT_EINVAL, "reduce2: invalid dtype"));
	if (op != COHORT_SUM && op != COHORT_PROD && op != COHORT_MIN
	    && op != COHORT_MAX)
		return (cohort__err(COHORT_EINVAL,
		    "reduce2: op %d is not sum, prod, min or max", (int)op));
	if ((dst == NULL || src == NULL) && count > 0)
		return (cohort__err(COHORT_EINVAL, "reduce2: NULL buffer"));
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Pack / unpack                                                            */
/* ------------------------------------------------------------------------ */

size_t
cohort__pack_layout(struct cohort__pack_item *items, size_t n, size_t align)
{
	size_t off = 0;
	size_t i;

	if ((items == NULL && n > 0) || align == 0
	    || (align & (align - 1)) != 0)
		return (0);
	for (i = 0; i < n; i++) {
		if (off > SIZE_MAX - (align - 1))
			return (0);
		off = (off + align - 1) & ~(align - 1);
		items[i].offset = off;
		if (items[i].bytes > SIZE_MAX - off)
			return (0);
		off += items[i].bytes;
	}
	if (off > SIZE_MAX - (align - 1))
		return (0);
	return ((off + align - 1) & ~(align - 1));
}

/* pack: each item's bytes into the bucket at its offset; else back out. */
static cohort_status
ref_copy_items(const void *bucket, const struct cohort__pack_item *items,
    size_t n, bool pack)
{
	cohort_status rv;
	size_t i;

	if ((rv = cohort__kernel_check_pack(bucket, items, n)) != COHORT_OK)
		return (rv);
	for (i = 0; i < n; i++) {
		char *slot = (char *)(uintptr_t)bucket + items[i].offset;

		if (items[i].bytes == 0)
			continue;
		if (pack)
			memcpy(slot, items[i].ptr, items[i].bytes);
		else
			memcpy(items[i].ptr, slot, items[i].bytes);
	}
	return (COHORT_OK);
}

cohort_status
cohort__ref_pack(void *bucket, const struct cohort__pack_item *items, size_t n)
{
	return (ref_copy_items(bucket, items, n, true));
}

cohort_status
cohort__ref_unpack(
    const void *bucket, const struct cohort__pack_item *items, size_t n)
{
	return (ref_copy_items(bucket, items, n, false));
}

size_t
cohort__copy_plan(struct cohort__copy_batch *b,
    const struct cohort__pack_item *items, size_t n, uintptr_t bucket,
    bool pack)
{
	size_t i;

	b->n = 0;
	b->pad = 0;
	b->nchunks = 0;
	for (i = 0; i < n && b->n < COHORT__COPY_BATCH; i++) {
		struct cohort__copy_desc *d = &b->d[b->n];
		uint64_t tensor = (uint64_t)(uintptr_t)items[i].ptr;
		uint64_t slot = (uint64_t)(bucket + items[i].offset);

		if (items[i].bytes == 0)
			continue;
		d->src = pack ? tensor : slot;
		d->dst = pack ? slot : tensor;
		d->bytes = items[i].bytes;
		d->chunk0 = b->nchunks;
		b->nchunks += (d->bytes + COHORT__COPY_CHUNK - 1)
		    / COHORT__COPY_CHUNK;
		b->n++;
	}
	return (i);
}

void
cohort__copy_emulate(const struct cohort__copy_batch *b)
{
	uint64_t c;

	for (c = 0; c < b->nchunks; c++) {
		uint32_t i = cohort__copy_find(b, c);
		const struct cohort__copy_desc *d = &b->d[i];
		uint64_t off;
		uint64_t len;
		uint32_t w;
		uint64_t head;
		uint64_t nvec;
		char *dst;
		const char *src;

		cohort__copy_range(b, i, c, &off, &len);
		cohort__copy_split(
		    d->src + off, d->dst + off, len, &w, &head, &nvec);
		COHORT__ASSERT(head + nvec * w <= len);
		src = (const char *)(uintptr_t)(d->src + off);
		dst = (char *)(uintptr_t)(d->dst + off);
		memcpy(dst, src, head);
		COHORT__ASSERT(nvec == 0
		    || (((uintptr_t)(src + head) | (uintptr_t)(dst + head))
		           & (w - 1))
		        == 0);
		memcpy(dst + head, src + head, nvec * w);
		memcpy(dst + head + nvec * w, src + head + nvec * w,
		    len - head - nvec * w);
	}
}

/* A 16-bit float of type dt (COHORT_F16 or COHORT_BF16) to f32 and back,
 * rounded to nearest even. */
static float
ref_half_f32(cohort_dtype dt, uint16_t h)
{
	return (
	    dt == COHORT_F16 ? cohort__f16_to_f32(h) : cohort__bf16_to_f32(h));
}

static uint16_t
ref_f32_half(cohort_dtype dt, float f)
{
	return (
	    dt == COHORT_F16 ? cohort__f32_to_f16(f) : cohort__f32_to_bf16(f));
}

/* ------------------------------------------------------------------------ */
/* scale                                                                    */
/* ------------------------------------------------------------------------ */

cohort_status
cohort__ref_scale(void *x, size_t count, cohort_dtype dt, double alpha)
{
	cohort_status rv;
	float a = (float)alpha;
	size_t i;

	if ((rv = cohort__kernel_check_scale(x, count, dt)) != COHORT_OK)
		return (rv);
	for (i = 0; i < count; i++) {
		switch (dt) {
		case COHORT_F32:
			((float *)x)[i] *= a;
			break;
		case COHORT_F64:
			((double *)x)[i] *= alpha;
			break;
		default: { /* COHORT_F16, COHORT_BF16 */
			uint16_t *h = (uint16_t *)x + i;
			*h = ref_f32_half(dt, ref_half_f32(dt, *h) * a);
			break;
		}
		}
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* cast                                                                     */
/* ------------------------------------------------------------------------ */

cohort_status
cohort__ref_cast(void *dst, cohort_dtype ddt, const void *src,
    cohort_dtype sdt, size_t count)
{
	cohort_status rv;
	size_t i;

	rv = cohort__kernel_check_cast(dst, ddt, src, sdt, count);
	if (rv != COHORT_OK)
		return (rv);
	for (i = 0; i < count; i++) {
		if (sdt == COHORT_F32)
			((uint16_t *)dst)[i]
			    = ref_f32_half(ddt, ((const float *)src)[i]);
		else
			((float *)dst)[i]
			    = ref_half_f32(sdt, ((const uint16_t *)src)[i]);
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* reduce2                                                                  */
/* ------------------------------------------------------------------------ */

/* NaN-propagating min (max: max), on ties (-0 vs +0) the first
 * operand. */
static double
ref_pick(double a, double b, bool max)
{
	if (isnan(a))
		return (a);
	if (isnan(b))
		return (b);
	return ((max ? b > a : b < a) ? b : a);
}

/* Floating-point ops in f64: for f32 operands a sum or product rounded
 * once more to f32 is the f32 result (53 >= 2 * 24 + 2 bits). */
static double
ref_op(double a, double b, cohort_redop op)
{
	switch (op) {
	case COHORT_SUM:
		return (a + b);
	case COHORT_PROD:
		return (a * b);
	case COHORT_MIN:
		return (ref_pick(a, b, false));
	default:
		return (ref_pick(a, b, true));
	}
}

/* Integer ops: sum and product in the unsigned type W, so they wrap. */
#define REF_INT_LOOP(T, W)                                                    \
	do {                                                                  \
		T *d_ = dst;                                                  \
		const T *s_ = src;                                            \
		for (i = 0; i < count; i++) {                                 \
			T a_ = d_[i];                                         \
			T b_ = s_[i];                                         \
			switch (op) {                                         \
			case COHORT_SUM:                                      \
				d_[i] = (T)(W)((W)a_ + (W)b_);                \
				break;                                        \
			case COHORT_PROD:                                     \
				d_[i] = (T)(W)((W)a_ * (W)b_);                \
				break;                                        \
			case COHORT_MIN:                                      \
				d_[i] = b_ < a_ ? b_ : a_;                    \
				break;                                        \
			default:                                              \
				d_[i] = b_ > a_ ? b_ : a_;                    \
				break;                                        \
			}                                                     \
		}                                                             \
	} while (0)

cohort_status
cohort__ref_reduce2(
    void *dst, const void *src, size_t count, cohort_dtype dt, cohort_redop op)
{
	cohort_status rv;
	size_t i;

	rv = cohort__kernel_check_reduce2(dst, src, count, dt, op);
	if (rv != COHORT_OK)
		return (rv);
	switch (dt) {
	case COHORT_F32:
		for (i = 0; i < count; i++)
			((float *)dst)[i] = (float)ref_op(
			    ((float *)dst)[i], ((const float *)src)[i], op);
		break;
	case COHORT_F64:
		for (i = 0; i < count; i++)
			((double *)dst)[i] = ref_op(
			    ((double *)dst)[i], ((const double *)src)[i], op);
		break;
	case COHORT_F16:
	case COHORT_BF16:
		for (i = 0; i < count; i++) {
			uint16_t *d = (uint16_t *)dst + i;
			float a = ref_half_f32(dt, *d);
			float b = ref_half_f32(dt, ((const uint16_t *)src)[i]);

			*d = ref_f32_half(dt, (float)ref_op(a, b, op));
		}
		break;
	case COHORT_I32:
		REF_INT_LOOP(int32_t, uint32_t);
		break;
	case COHORT_I64:
		REF_INT_LOOP(int64_t, uint64_t);
		break;
	default: /* COHORT_U8 */
		REF_INT_LOOP(uint8_t, uint32_t);
		break;
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Validation                                                               */
/* ------------------------------------------------------------------------ */

static double
ref_tiny(cohort_dtype dt)
{
	switch (dt) {
	case COHORT_F32:
		return (FLT_MIN);
	case COHORT_F64:
		return (DBL_MIN);
	case COHORT_F16:
		return (6.103515625e-05); /* 2^-14 */
	case COHORT_BF16:
		return (FLT_MIN);
	default:
		return (0);
	}
}

size_t
cohort__ref_compare(const char *what, cohort_dtype dt, const void *got,
    const void *want, size_t n, double eps, size_t report, double *max_rel)
{
	size_t size = cohort_dtype_size(dt);
	double tiny = ref_tiny(dt);
	bool exact = tiny == 0;
	double worst = 0;
	size_t bad = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		double g = cohort__elem_loadf(got, i, dt);
		double w = cohort__elem_loadf(want, i, dt);
		bool ok;

		if (exact) {
			ok = memcmp((const char *)got + i * size,
			         (const char *)want + i * size, size)
			    == 0;
		} else if (isnan(g) || isnan(w)) {
			ok = isnan(g) && isnan(w);
		} else if (isinf(g) || isinf(w)) {
			ok = g == w;
		} else {
			double err = fabs(g - w);
			double rel = err / fmax(fabs(w), tiny);
			ok = eps == 0 ? g == w && signbit(g) == signbit(w)
			              : err <= eps * fabs(w) + tiny;
			if (rel > worst)
				worst = rel;
		}
		if (!ok && bad++ < report)
			fprintf(stderr, "%s[%zu]: got %.9g, want %.9g\n",
			    what != NULL ? what : "?", i, g, w);
	}
	if (report > 0 && bad > report)
		fprintf(stderr, "%s: %zu mismatches in %zu elements\n",
		    what != NULL ? what : "?", bad, n);
	if (max_rel != NULL)
		*max_rel = worst;
	return (bad);
}
