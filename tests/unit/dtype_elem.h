/*
 * dtype_elem.h - element i of a buffer of any cohort dtype, as a double or
 * as the raw bits of an integer, and the reference of one reduction step:
 * the unit suites that check reductions (test_reduce.c, tcp_fixture.c)
 * share this one copy. Header-only.
 */
#ifndef COHORT_DTYPE_ELEM_H
#define COHORT_DTYPE_ELEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "half.h"

static inline bool
elem_isfloat(cohort_dtype dt)
{
	return (dt == COHORT_F32 || dt == COHORT_F64 || dt == COHORT_F16
	    || dt == COHORT_BF16);
}

/* buf[i] = v converted to dt (f16 and bf16 round to nearest even). */
static inline void
elem_store(void *buf, size_t i, cohort_dtype dt, double v)
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
	case COHORT_I32:
		((int32_t *)buf)[i] = (int32_t)v;
		break;
	case COHORT_I64:
		((int64_t *)buf)[i] = (int64_t)v;
		break;
	case COHORT_U8:
		((uint8_t *)buf)[i] = (uint8_t)v;
		break;
	default:
		break;
	}
}

/* buf[i] as a double (integers signed, except U8). */
static inline double
elem_load(const void *buf, size_t i, cohort_dtype dt)
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
	case COHORT_I32:
		return (((const int32_t *)buf)[i]);
	case COHORT_I64:
		return ((double)((const int64_t *)buf)[i]);
	case COHORT_U8:
		return (((const uint8_t *)buf)[i]);
	default:
		return (0);
	}
}

/* The bits of an integer dtype: all of them for I64, the low 32 for I32,
 * the low 8 otherwise. */
static inline uint64_t
elem_mask(cohort_dtype dt)
{
	if (dt == COHORT_I32)
		return (0xffffffffu);
	if (dt == COHORT_I64)
		return (UINT64_MAX);
	return (0xffu);
}

/* buf[i] = the low bits of raw (integer dtypes). */
static inline void
elem_store_bits(void *buf, size_t i, cohort_dtype dt, uint64_t raw)
{
	if (dt == COHORT_I32)
		((uint32_t *)buf)[i] = (uint32_t)raw;
	else if (dt == COHORT_I64)
		((uint64_t *)buf)[i] = raw;
	else
		((uint8_t *)buf)[i] = (uint8_t)raw;
}

/* buf[i]'s bits, zero-extended (integer dtypes). */
static inline uint64_t
elem_bits(const void *buf, size_t i, cohort_dtype dt)
{
	if (dt == COHORT_I32)
		return (((const uint32_t *)buf)[i]);
	if (dt == COHORT_I64)
		return (((const uint64_t *)buf)[i]);
	return (((const uint8_t *)buf)[i]);
}

/* The value of bits v of dt, for ordering: signed I32 and I64, U8 as is. */
static inline int64_t
elem_sext(uint64_t v, cohort_dtype dt)
{
	if (dt == COHORT_I32)
		return ((int32_t)(uint32_t)v);
	if (dt == COHORT_I64)
		return ((int64_t)v);
	return ((int64_t)(uint8_t)v);
}

/* a op b in double (MEAN and SUM add). */
static inline double
elem_op_f(double a, double b, cohort_redop op)
{
	switch (op) {
	case COHORT_PROD:
		return (a * b);
	case COHORT_MIN:
		return (b < a ? b : a);
	case COHORT_MAX:
		return (b > a ? b : a);
	default:
		return (a + b);
	}
}

/* a op b on the bits of an integer dtype, wrapping like the dtype. */
static inline uint64_t
elem_op_i(uint64_t a, uint64_t b, cohort_dtype dt, cohort_redop op)
{
	uint64_t w;

	switch (op) {
	case COHORT_PROD:
		w = a * b;
		break;
	case COHORT_MIN:
		w = elem_sext(b, dt) < elem_sext(a, dt) ? b : a;
		break;
	case COHORT_MAX:
		w = elem_sext(b, dt) > elem_sext(a, dt) ? b : a;
		break;
	default:
		w = a + b;
		break;
	}
	return (w & elem_mask(dt));
}

#endif /* COHORT_DTYPE_ELEM_H */
