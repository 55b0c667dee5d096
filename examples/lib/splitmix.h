/*
 * splitmix.h - splitmix64, the examples' randomness: a tiny, well-mixed
 * generator whose output depends only on the seed, on every platform, so
 * every rank draws the same parameters (mlp.c) and the same shuffles
 * (digits.c).
 */
#ifndef COHORT_EXAMPLES_SPLITMIX_H
#define COHORT_EXAMPLES_SPLITMIX_H

#include <stdint.h>

static inline uint64_t
splitmix64_next(uint64_t *state)
{
	uint64_t z = (*state += 0x9e3779b97f4a7c15ULL);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ULL;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebULL;
	return (z ^ (z >> 31));
}

#endif /* COHORT_EXAMPLES_SPLITMIX_H */
