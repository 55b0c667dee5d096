/*
 * dtype.h - one element of a cohort_dtype buffer, read or written as a
 * number: the per-dtype switch that benchmarks (cohort bench), tests and
 * CPU references fill and check their buffers with. Inline, like half.h,
 * so that programs which link nothing of cohort's can use it (the test
 * programs through tests/harness/th_elem.h).
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

/* Element i of buf (of dt) := f for a float type (rounded to it), else
 * the low bits of u (two's complement for the signed types). */
static inline void
cohort__elem_store(void *buf, size_t i, cohort_dtype dt, double f, uint64_t u)
{
	switch (dt) {
	case COHORT_F32:
		((float *)buf)[i] = (float)f;
		break;
	case COHORT_F64:
		((double *)buf)[i] = f;
		break;
	case COHORT_F16:
		((uint16_t *)buf)[i] = cohort__f32_to_f16((float)f);
		break;
	case COHORT_BF16:
		((uint16_t *)buf)[i] = cohort__f32_to_bf16((float)f);
		break;
	case COHORT_I32:
		((int32_t *)buf)[i] = (int32_t)(uint32_t)u;
		break;
	case COHORT_I64:
		((int64_t *)buf)[i] = (int64_t)u;
		break;
	default:
		((uint8_t *)buf)[i] = (uint8_t)u;
		break;
	}
}

/* Element i of an integer buffer, sign-extended for I32 and I64. */
static inline uint64_t
cohort__elem_loadu(const void *buf, size_t i, cohort_dtype dt)
{
	switch (dt) {
	case COHORT_I32:
		return ((uint64_t)(int64_t)((const int32_t *)buf)[i]);
	case COHORT_I64:
		return ((uint64_t)((const int64_t *)buf)[i]);
	default:
		return (((const uint8_t *)buf)[i]);
	}
}

/* Element i as a double (an integer type: its signed value). */
static inline double
cohort__elem_loadf(const void *buf, size_t i, cohort_dtype dt)
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
	case COHORT_U8:
		return ((double)cohort__elem_loadu(buf, i, dt));
	default:
		return ((double)(int64_t)cohort__elem_loadu(buf, i, dt));
	}
}

#endif /* COHORT_COMMON_DTYPE_H */
