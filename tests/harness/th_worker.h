/*
 * th_worker.h - small helpers shared by the worker programs of tests/bin
 * (cohort-test-worker, cohort-coll-worker, cohort-fault-worker,
 * cohort-strategy-worker): clocks, a hash to derive test data from a seed,
 * integer arguments. Static inline: those programs do not link the
 * harness.
 */
#ifndef COHORT_TH_WORKER_H
#define COHORT_TH_WORKER_H

#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cohort/cohort.h"

static inline int64_t
tw_clock_ms(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

/* Milliseconds on CLOCK_MONOTONIC (tw_now_ms) and since the epoch. */
static inline int64_t
tw_now_ms(void)
{
	return (tw_clock_ms(CLOCK_MONOTONIC));
}

static inline int64_t
tw_wall_ms(void)
{
	return (tw_clock_ms(CLOCK_REALTIME));
}

/* splitmix64's finaliser: a well mixed 64-bit value of z. */
static inline uint64_t
tw_mix(uint64_t z)
{
	z += 0x9e3779b97f4a7c15ull;
	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (z ^ (z >> 31));
}

/* s as a whole decimal number; dflt where s is NULL, empty or not one. */
static inline long
tw_arg(const char *s, long dflt)
{
	char *end;
	long v;

	if (s == NULL)
		return (dflt);
	v = strtol(s, &end, 10);
	return (*end == '\0' && end != s ? v : dflt);
}

/* The environment variable name as tw_arg reads it. */
static inline long
tw_env_long(const char *name, long dflt)
{
	return (tw_arg(getenv(name), dflt));
}

/* A worker's scenario (argv[1]): runs on an open client with the
 * optional argv[2]; returns the exit status. */
struct tw_scenario {
	const char *name;
	int (*fn)(cohort_client *c, const char *arg);
};

/* The scenario called name among tab[0..n), or NULL. */
static inline const struct tw_scenario *
tw_scenario_find(const struct tw_scenario *tab, size_t n, const char *name)
{
	for (size_t i = 0; i < n; i++)
		if (strcmp(tab[i].name, name) == 0)
			return (&tab[i]);
	return (NULL);
}

#endif /* COHORT_TH_WORKER_H */
