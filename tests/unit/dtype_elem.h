/*
 * dtype_elem.h - the reference of one reduction step, in double or on the
 * bits of an integer dtype, for the unit suites that check reductions
 * (test_reduce.c, tcp_fixture.c); elements are read and written with the
 * harness's th_elem.h. Header-only.
 */
#ifndef COHORT_DTYPE_ELEM_H
#define COHORT_DTYPE_ELEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "th_elem.h"

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

/* buf[i]'s bits, zero-extended (integer dtypes). */
static inline uint64_t
elem_bits(const void *buf, size_t i, cohort_dtype dt)
{
	return (cohort__elem_loadu(buf, i, dt) & elem_mask(dt));
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
