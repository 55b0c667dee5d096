/*
 * obs.h - what libcohort and cohortd share about per-rank metrics
 * (docs/observability.md): the operation kinds counted, and the fixed
 * bucket bounds of the latency histograms carried in RankMetrics
 * (proto/cohort.proto). Both sides compile the same table, so a histogram
 * travels as bare counts.
 */
#ifndef COHORT_COMMON_OBS_H
#define COHORT_COMMON_OBS_H

#include <stdint.h>

/* Upper bounds of the histogram buckets in nanoseconds (the last bucket,
 * +Inf, is implicit): 10 us to 60 s, roughly 1-2.5-5 per decade. */
#define COHORT__OBS_NBOUNDS 21
#define COHORT__OBS_NBUCKETS (COHORT__OBS_NBOUNDS + 1) /* with +Inf */

static const uint64_t cohort__obs_bounds_ns[COHORT__OBS_NBOUNDS] = {
	10000ull,
	25000ull,
	50000ull,
	100000ull,
	250000ull,
	500000ull,
	1000000ull,
	2500000ull,
	5000000ull,
	10000000ull,
	25000000ull,
	50000000ull,
	100000000ull,
	250000000ull,
	500000000ull,
	1000000000ull,
	2500000000ull,
	5000000000ull,
	10000000000ull,
	30000000000ull,
	60000000000ull,
};

/* Bucket index of a duration in nanoseconds. */
static inline unsigned
cohort__obs_bucket(uint64_t ns)
{
	unsigned i = 0;

	while (i < COHORT__OBS_NBOUNDS && ns > cohort__obs_bounds_ns[i])
		i++;
	return (i);
}

/* Upper bound of bucket i in nanoseconds; UINT64_MAX for +Inf. */
static inline uint64_t
cohort__obs_bound(unsigned i)
{
	return (
	    i < COHORT__OBS_NBOUNDS ? cohort__obs_bounds_ns[i] : UINT64_MAX);
}

#endif /* COHORT_COMMON_OBS_H */
