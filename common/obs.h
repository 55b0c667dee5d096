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
#define COHORT__OBS_BOUNDS(X)                                                \
	X(10000) X(25000) X(50000) X(100000) X(250000) X(500000) X(1000000)  \
	    X(2500000) X(5000000) X(10000000) X(25000000) X(50000000)        \
	        X(100000000) X(250000000) X(500000000) X(1000000000)         \
	            X(2500000000) X(5000000000) X(10000000000)               \
	                X(30000000000) X(60000000000)

#define COHORT__OBS_COUNT_ONE(ns) +1
/* Buckets including +Inf. */
#define COHORT__OBS_NBUCKETS (0 COHORT__OBS_BOUNDS(COHORT__OBS_COUNT_ONE) + 1)

/* Bucket index of a duration in nanoseconds. */
static inline unsigned
cohort__obs_bucket(uint64_t ns)
{
	static const uint64_t b[] = {
#define COHORT__OBS_ROW(ns) ns##ull,
		COHORT__OBS_BOUNDS(COHORT__OBS_ROW)
#undef COHORT__OBS_ROW
	};
	unsigned i = 0;

	while (i < sizeof(b) / sizeof(b[0]) && ns > b[i])
		i++;
	return (i);
}

/* Upper bound of bucket i in nanoseconds; UINT64_MAX for +Inf. */
static inline uint64_t
cohort__obs_bound(unsigned i)
{
	static const uint64_t b[] = {
#define COHORT__OBS_ROW(ns) ns##ull,
		COHORT__OBS_BOUNDS(COHORT__OBS_ROW)
#undef COHORT__OBS_ROW
	};

	return (i < sizeof(b) / sizeof(b[0]) ? b[i] : UINT64_MAX);
}

#endif /* COHORT_COMMON_OBS_H */
