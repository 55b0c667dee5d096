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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cohort/cohort.h"

/* Nanoseconds and milliseconds on clk. */
static inline int64_t
tw_clock_ns(clockid_t clk)
{
	struct timespec ts;

	clock_gettime(clk, &ts);
	return ((int64_t)ts.tv_sec * 1000000000 + ts.tv_nsec);
}

static inline int64_t
tw_clock_ms(clockid_t clk)
{
	return (tw_clock_ns(clk) / 1000000);
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

/* Seconds on CLOCK_MONOTONIC, for timing loops. */
static inline double
tw_now_s(void)
{
	return ((double)tw_clock_ns(CLOCK_MONOTONIC) * 1e-9);
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

/* Elements rank q sends rank j in case k of an uneven all-to-all seeded
 * with seed: about a quarter zero, the others below max. */
static inline size_t
tw_a2a_count(uint64_t seed, int k, int q, int j, size_t max)
{
	uint64_t h = tw_mix(seed ^ (uint64_t)(k * 1009 + q * 31 + j));

	return (h % 4 == 0 ? 0 : (size_t)(h % max));
}

/* Rank r's layout of case k of that all-to-all among n ranks: sc[j]
 * elements for rank j at sd[j] of the send buffer, its blocks back to
 * front, each with gap_before unused elements before it and gap_after
 * after; rc[j] from rank j at rd[j] of the receive buffer, in rank order
 * with no gaps. *stot and *rtot: the buffers' lengths in elements. */
static inline void
tw_a2a_layout(uint64_t seed, int k, int r, int n, size_t max,
    size_t gap_before, size_t gap_after, size_t *sc, size_t *sd, size_t *rc,
    size_t *rd, size_t *stot, size_t *rtot)
{
	*stot = 0;
	*rtot = 0;
	for (int j = n - 1; j >= 0; j--) {
		sc[j] = tw_a2a_count(seed, k, r, j, max);
		sd[j] = *stot + gap_before;
		*stot += gap_before + sc[j] + gap_after;
	}
	for (int j = 0; j < n; j++) {
		rc[j] = tw_a2a_count(seed, k, j, r, max);
		rd[j] = *rtot;
		*rtot += rc[j];
	}
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

#define TW_NELEM(a) (sizeof(a) / sizeof((a)[0]))

/* Runs the scenario argv[1] of tab[0..n) on c with argv[2] (or NULL) and
 * returns its exit status; 2, saying so on stderr, if there is none. */
static inline int
tw_scenario_run(cohort_client *c, const struct tw_scenario *tab, size_t n,
    int argc, char **argv)
{
	const struct tw_scenario *sc = tw_scenario_find(tab, n, argv[1]);

	if (sc == NULL) {
		fprintf(stderr, "unknown scenario %s\n", argv[1]);
		return (2);
	}
	return (sc->fn(c, argc > 2 ? argv[2] : NULL));
}

/* Opens the client of a worker from its environment (COHORT_TEST_BACKEND
 * names the backend, when set), with a 500 ms heartbeat and peers dead
 * after 3 s, waiting up to 60 s. On failure prints "RESULT env|open
 * status=... detail=..." and returns 1; 0 with *out set. */
static inline int
tw_client_open(cohort_client **out)
{
	cohort_env env;
	cohort_options opts;
	cohort_status st;
	const char *backend = getenv("COHORT_TEST_BACKEND");

	if ((st = cohort_env_resolve(&env)) != COHORT_OK
	    || (st = cohort_options_from_env(&opts, &env)) != COHORT_OK) {
		printf("RESULT env status=%s detail=%s\n",
		    cohort_status_name(st), cohort_last_error());
		return (1);
	}
	if (backend != NULL && backend[0] != '\0')
		opts.backend = backend;
	opts.heartbeat_interval = 500;
	opts.dead_after = 3000;
	if ((st = cohort_client_open(&opts, out, 60000)) != COHORT_OK) {
		printf("RESULT open status=%s detail=%s\n",
		    cohort_status_name(st), cohort_last_error());
		return (1);
	}
	return (0);
}

/* A scenario worker's start (prog: its name for the usage line): argv[1]
 * names the scenario, stdout is line-buffered (the test reads it while
 * the worker runs) and *out is its open client (tw_client_open). Returns
 * 0, else the exit status: 2 without a scenario, 1 with no client. */
static inline int
tw_worker_start(int argc, char **argv, const char *prog, cohort_client **out)
{
	if (argc < 2) {
		fprintf(stderr, "usage: %s SCENARIO [ARG]\n", prog);
		return (2);
	}
	setvbuf(stdout, NULL, _IOLBF, 0);
	return (tw_client_open(out));
}

#endif /* COHORT_TH_WORKER_H */
