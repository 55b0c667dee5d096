/*
 * dtype.h - one element of a cohort_dtype array, read or written as a
 * number: the per-dtype switch that benchmarks, tests and CPU references
 * fill and check their buffers with. Inline, like half.h.
 */
#ifndef COHORT_COMMON_DTYPE_H
#define COHORT_COMMON_DTYPE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "half.h"

/* F32, F64, F16, BF16. */
static inline bool
cohort__dtype_is_float(cohort_dtype dt)
{
	return (dt == COHORT_F32 || dt == COHORT_F64 || dt == COHORT_F16
	    || dt == COHORT_BF16);
}

static inline int64_t cohort__elem_geti(
    const void *buf, size_t i, cohort_dtype dt);
static inline void cohort__elem_seti(
    void *buf, size_t i, cohort_dtype dt, int64_t v);

/* Element i as a double (an integer beyond 2^53 rounds). */
static inline double
cohort__elem_get(const void *buf, size_t i, cohort_dtype dt)
{
	switch (dt) {
	case COHORT_F32:
		return (((const float *)buf)[i]);
	case COHORT_F64:
		return (((const double *)buf)[i]);
	case COHORT_F16:
		return (cohort__f16_to_f32(((const uint16_t *)buf)[i]));
	case COHORT_BF16:
		return (cohort__bf16_to_f32(((const uint16_t *)buf)[i]));
	default:
		return ((double)cohort__elem_geti(buf, i, dt));
	}
}

/* Element i as an integer: I32 and I64 signed, U8 unsigned; a float
 * truncated. */
static inline int64_t
cohort__elem_geti(const void *buf, size_t i, cohort_dtype dt)
{
	switch (dt) {
	case COHORT_I32:
		return (((const int32_t *)buf)[i]);
	case COHORT_I64:
		return (((const int64_t *)buf)[i]);
	case COHORT_U8:
		return (((const uint8_t *)buf)[i]);
	default: /* 0 for what is not a dtype */
		return (cohort__dtype_is_float(dt)
		        ? (int64_t)cohort__elem_get(buf, i, dt)
		        : 0);
	}
}

/* Stores v as element i: rounded to the float formats, truncated (and
 * wrapped) to the integer ones. */
static inline void
cohort__elem_set(void *buf, size_t i, cohort_dtype dt, double v)
{
	switch (dt) {
	case COHORT_F32:
		((float *)buf)[i] = (float)v;
		break;
	case COHORT_F64:
		((double *)buf)[i] = v;
		break;
	case COHORT_F16:
		((uint16_t *)buf)[i] = cohort__f32_to_f16((float)v);
		break;
	case COHORT_BF16:
		((uint16_t *)buf)[i] = cohort__f32_to_bf16((float)v);
		break;
	default:
		cohort__elem_seti(buf, i, dt, (int64_t)v);
		break;
	}
}

/* Stores the integer v as element i (wrapped to the integer dtypes). */
static inline void
cohort__elem_seti(void *buf, size_t i, cohort_dtype dt, int64_t v)
{
	switch (dt) {
	case COHORT_I32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case COHORT_I64:
		((int64_t *)buf)[i] = v;
		break;
	case COHORT_U8:
		((uint8_t *)buf)[i] = (uint8_t)v;
		break;
	default: /* nothing for what is not a dtype */
		if (cohort__dtype_is_float(dt))
			cohort__elem_set(buf, i, dt, (double)v);
		break;
	}
}

#endif /* COHORT_COMMON_DTYPE_H */
