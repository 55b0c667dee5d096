/*
 * cl_fixture.h - client unit tests against the real coordinator in the
 * test's own process.
 *
 * cohortd's core runs embedded (server/server.h) on a loopback port, the
 * way `cohort run` embeds it; the clients under test are real
 * cohort_clients of this process (several memberships may live in one
 * process), their ranks run in threads (a join, a barrier or a collective
 * blocks until every rank is in it). Nothing is mocked: what a test sees
 * went through coord.c, nng, cohortd's dispatch and back. The runner
 * forks every test, so nng starts inside the test's process (never in
 * the runner).
 *
 * Timeouts are short (heartbeat 100 ms, dead-after 1 s, operations 20 s)
 * so that failure detection fits a unit test; every wait is bounded.
 */
#ifndef COHORT_CL_FIXTURE_H
#define COHORT_CL_FIXTURE_H

#include <stdbool.h>

#include "check_cohort.h"

#define CLX_MAX 8

struct cohort__srv;

struct clx {
	struct cohort__srv *srv;
	const char *url; /* where the embedded cohortd listens */
	char job[64];
	int n; /* clients opened by clx_join */
	cohort_client *c[CLX_MAX];
	/* Options of the clients clx_join opens (clx_start's defaults;
	 * change them before the join). */
	cohort_duration heartbeat_ms;
	cohort_duration dead_after_ms;
	cohort_duration op_timeout_ms;
	const char *backend;
};

/* Starts the embedded cohortd on 127.0.0.1 (a free port) with job `job`
 * (token "tok") and sets the defaults: backend "service" (through this
 * cohortd; no data-plane sockets). Fails the test if it cannot. */
void clx_start(struct clx *x, const char *job);

/* Closes every client still open (NULL ones skipped) and stops cohortd. */
void clx_stop(struct clx *x);

/* The options of rank `rank` of an n-rank job of x. */
void clx_options(const struct clx *x, int rank, int n, cohort_options *o);

/* Opens n clients (ranks 0..n-1, one thread each: a join waits for all)
 * into x->c; fails the test unless every open returns COHORT_OK within
 * 20 s. */
void clx_join(struct clx *x, int n);

/* Closes client `rank` now (a clean Leave), leaving NULL. */
void clx_close(struct clx *x, int rank);

/* Waits (bounded: 5 s, failing the test past it) until cohortd has rank
 * `who` parked in a collective (a barrier, a service-backend gather),
 * asking through client `asker`. */
void clx_wait_parked(struct clx *x, int asker, int who);

/* Asks cohortd, through client asker with a 1 s deadline, for the status
 * of x's job and returns fn(its status, arg); false where the query
 * failed. fn must not keep js. */
typedef struct Cohort__JobStatus Cohort__JobStatus;
bool clx_job_status(struct clx *x, int asker,
    bool (*fn)(const Cohort__JobStatus *js, void *arg), void *arg);

/* Runs fn(x, rank, arg) for ranks 0..n-1, one thread each, and waits for
 * all of them up to timeout_ms (failing the test past it); st[rank] gets
 * what each returned. */
typedef cohort_status (*clx_fn)(struct clx *x, int rank, void *arg);
void clx_run(struct clx *x, int n, clx_fn fn, void *arg, int timeout_ms,
    cohort_status *st);

/* The same for one function in one thread, started now and joined later:
 * a call that blocks until another thread acts. */
struct clx_bg;
struct clx_bg *clx_bg_start(struct clx *x, int rank, clx_fn fn, void *arg);
/* Waits up to timeout_ms (failing the test past it); returns fn's status
 * and frees bg; *ms (may be NULL) gets how long it ran. */
cohort_status clx_bg_join(struct clx_bg *bg, int timeout_ms, int64_t *ms);

#endif /* COHORT_CL_FIXTURE_H */
