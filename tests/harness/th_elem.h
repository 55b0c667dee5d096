/*
 * th_elem.h - a reproducible random generator, random bytes, and
 * (common/dtype.h) one element of a buffer
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

/* The next draw of xorshift64* (Vigna) whose state is *s (never 0):
 * reproducible from its seed, and no libc state shared with the code
 * under test. */
static inline uint64_t
th_xorshift(uint64_t *s)
{
	*s ^= *s >> 12;
	*s ^= *s << 25;
	*s ^= *s >> 27;
	return (*s * 0x2545f4914f6cdd1dull);
}

/* n random bytes: the top byte of each rnd() draw. */
static inline void
th_fill_bytes(void *p, size_t n, uint64_t (*rnd)(void))
{
	unsigned char *c = p;

	for (size_t i = 0; i < n; i++)
		c[i] = (unsigned char)(rnd() >> 56);
}

#endif /* COHORT_TH_ELEM_H */
