/*
 * th_elem.h - random bytes, and (common/dtype.h) one element of a buffer
 * of any cohort_dtype, for the test programs: the Check suites
 * (tests/cuda) and the helper binaries of tests/bin, which do not link the
 * harness, so all of it is static inline.
 */
#ifndef COHORT_TH_ELEM_H
#define COHORT_TH_ELEM_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "dtype.h" /* one element of any dtype: cohort__elem_* */

/* n random bytes: the top byte of each rnd() draw. */
static inline void
th_fill_bytes(void *p, size_t n, uint64_t (*rnd)(void))
{
	unsigned char *c = p;

	for (size_t i = 0; i < n; i++)
		c[i] = (unsigned char)(rnd() >> 56);
}

#endif /* COHORT_TH_ELEM_H */
