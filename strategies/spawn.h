/*
 * spawn.h - run a function in N local worker processes (PyTorch
 * Lightning's DDPSpawnPlugin.spawn, torch.multiprocessing.spawn).
 *
 *   static int
 *   train(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
 *   {
 *       ... train on c's world group ...
 *       if (cohort_spawn_rank(ctx) == 0) {
 *           cohort_spawn_add_to_queue(ctx, metrics, metrics_len);
 *           cohort_spawn_return(ctx, model, model_len);
 *       }
 *       return (0);          // non-zero: failure (text: cohort_spawn_fail)
 *   }
 *   cohort_spawn_result r;
 *   st = cohort_spawn(4, train, &cfg, &opts, &r);   // rank 0's bytes in r
 *
 * cohort_spawn forks N children. Each child gets the COHORT_* environment
 * (coordinator, job, rank, world size, local rank; also LOCAL_RANK and
 * LOCAL_WORLD_SIZE), opens its cohort client and calls fn. Rank 0's
 * result (cohort_spawn_return) and its queued metrics
 * (cohort_spawn_add_to_queue, like add_to_queue / get_from_queue) come
 * back to the caller over pipes, as does every child's error text: the
 * parent never touches nng. If a child fails (fn returns non-zero, it
 * exits or is killed), it first reports the failure to cohortd (so the
 * other ranks' pending calls fail with COHORT_EPEERLOST naming it), the
 * others get a grace period to stop, the rest are killed, every child is
 * reaped, and cohort_spawn returns COHORT_EPEERLOST with the failed rank,
 * its exit status and its error text in the result. No process is left
 * behind (the children also die with the parent: PR_SET_PDEATHSIG).
 *
 * nng 1.5 cannot be used in a forked child whose parent used it: call
 * cohort_spawn before any cohort_* call that opens sockets in the calling
 * process (cohort_client_open & co.). The coordinator is opts->coordinator
 * if set; otherwise cohort_spawn starts a private cohortd (fork + exec of
 * opts->cohortd_path, else $COHORT_COHORTD, else "cohortd" next to the
 * running program, else cohortd in PATH) on a free loopback port and
 * stops it at the end.
 */
#ifndef COHORT_STRATEGIES_SPAWN_H
#define COHORT_STRATEGIES_SPAWN_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cohort_spawn_ctx cohort_spawn_ctx;

/* The function run in every child. c is the open client (NULL with
 * opts->no_client). Returns 0 on success. */
typedef int (*cohort_spawn_fn)(
    cohort_spawn_ctx *ctx, cohort_client *c, void *arg);

typedef struct cohort_spawn_options {
	/* nng URL of a running cohortd; NULL = start a private one. */
	const char *coordinator;
	/* cohortd binary for the private coordinator (see above). */
	const char *cohortd_path;
	const char *job; /* NULL = "spawn-<pid>" */
	const char *token; /* NULL = "" */
	/* Limit for the whole run, ms; <= 0 = none. On expiry every child is
	 * killed and COHORT_ETIMEDOUT returned. */
	int64_t timeout_ms;
	/* After the first failure, how long the other children get to stop
	 * on their own before SIGKILL (default 3000 ms). */
	int64_t grace_ms;
	/* Join timeout of each child's cohort_client_open (default
	 * COHORT_WAIT_DEFAULT: COHORT_JOIN_TIMEOUT_MS, 30 min unless set;
	 * a child that dies before it joins ends the spawn anyway). */
	cohort_duration join_timeout;
	/* Children do not open a client (fn gets NULL). */
	bool no_client;
	/* Extra "K=V" environment entries for every child, NULL-terminated;
	 * may be NULL. */
	const char *const *env;
	/* Directory for the private cohortd's log (NULL: /dev/null). */
	const char *log_dir;
} cohort_spawn_options;

COHORT_API void cohort_spawn_options_init(cohort_spawn_options *o);

typedef struct cohort_spawn_item {
	void *data;
	size_t len;
} cohort_spawn_item;

typedef struct cohort_spawn_result {
	/* Rank 0's return value (NULL/0 if it returned none). */
	void *data;
	size_t len;
	/* Rank 0's queue (add_to_queue), in order. */
	cohort_spawn_item *queue;
	size_t queue_len;
	/* On failure: the rank that failed first (-1: none / not a rank),
	 * its wait status decoded (exit code, or 128 + signal), whether it
	 * was a signal, and its error text (or a description). */
	int failed_rank;
	int exit_code;
	int term_signal;
	char error[1024];
	/* Exit codes of all children (128 + signal; -1 never reaped). */
	int nranks;
	int exit_codes[256];
} cohort_spawn_result;

/* Runs fn(ctx, client, arg) in n (1..256) children; see above. Returns
 * COHORT_OK when every child returned 0 (result filled), COHORT_EPEERLOST
 * when one failed (result names it), COHORT_ETIMEDOUT, COHORT_ESYSTEM
 * (fork, pipe, the coordinator could not start: result->error says),
 * COHORT_EINVAL, COHORT_ESTATE (this process already uses nng: see
 * above; nothing was started). The result must be freed with
 * cohort_spawn_result_free whatever the status. */
COHORT_API cohort_status cohort_spawn(int n, cohort_spawn_fn fn, void *arg,
    const cohort_spawn_options *opts, cohort_spawn_result *result);

COHORT_API void cohort_spawn_result_free(cohort_spawn_result *r);

/* get_from_queue: item i of rank 0's queue, false past the end. */
COHORT_API bool cohort_spawn_get_from_queue(
    const cohort_spawn_result *r, size_t i, const void **data, size_t *len);

/* --- In the child ----------------------------------------------------- */

COHORT_API int cohort_spawn_rank(const cohort_spawn_ctx *ctx);
COHORT_API int cohort_spawn_world_size(const cohort_spawn_ctx *ctx);
/* return_result: the value returned to the caller (rank 0's; the last call
 * wins; other ranks' values are dropped). */
COHORT_API cohort_status cohort_spawn_return(
    cohort_spawn_ctx *ctx, const void *data, size_t len);
/* add_to_queue: appends an item (rank 0's reach the caller). */
COHORT_API cohort_status cohort_spawn_add_to_queue(
    cohort_spawn_ctx *ctx, const void *data, size_t len);
/* The error text of this child's failure (printf-style); also sent to
 * cohortd when fn returns non-zero. */
COHORT_API void cohort_spawn_fail(cohort_spawn_ctx *ctx, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

#ifdef __cplusplus
}
#endif

#endif /* COHORT_STRATEGIES_SPAWN_H */
