/*
 * group.h - struct cohort_group: a process group of one client, its sticky
 * failure and abort flag, and the state of its control-plane (control.c)
 * and data-plane (collectives.c) operations.
 *
 * Failure model (docs/failures.md): the first EPEERLOST / ESTALE /
 * EABORTED (or a data-plane error that leaves the connections unusable) is
 * stored as a record (cohort_failure, failure.h) with the time it
 * happened; every later call on the group returns its status and text
 * (cohort__group_check). cohort__group_fail also raises abort_flag, which
 * every wait polls, aborts the control-plane call in progress, and calls
 * the backend's abort() so a blocked data-plane operation returns at once.
 * Elastic jobs (docs/elastic.md): EMEMBERSHIP is sticky until
 * cohort_client_reform resets the group (cohort__group_reset); it
 * replaces a failure the data plane saw itself (the same change seen
 * first from a broken connection), and leaves the control-plane call in
 * progress to cohortd, which answers it.
 *
 * group.c knows nothing of the client above it: what it uses of it (the
 * coordinator engine, the metrics, the fault schedule) is handed over in
 * struct cohort__group_ctx when the group is made.
 *
 * Locks, in the order they may be taken:
 *   ctl_lock  one control-plane collective at a time (control.c)
 *   op_lock   one data-plane operation at a time (collectives.c)
 *   mtx       the failure, ctl_call, backend_state (short holds)
 * c->mtx (client.h) may be taken before g->mtx, never after.
 */
#ifndef COHORT_GROUP_H
#define COHORT_GROUP_H

#include <pthread.h>
#include <stdatomic.h>

#include "backend/backend.h"
#include "coord.h"
#include "failure.h"
#include "observe.h"

struct cohort__fault;

#define COHORT__GROUP_ID_MAX 256

/* What a group uses of its client. */
struct cohort__group_ctx {
	/* Back-pointer for the layers above (control.c, collectives.c);
	 * outlives the group. Opaque to group.c. */
	struct cohort_client *client;
	struct cohort__coord *coord; /* aborts the control call in progress */
	struct cohort__obs *obs; /* timeline track, failure events */
	struct cohort__fault *fault; /* operations' fault point; NULL: none */
};

struct cohort_group {
	struct cohort_client *client; /* as in cohort__group_ctx */
	struct cohort__coord *coord;
	struct cohort__obs *obs;
	struct cohort__fault *fault;
	char id[COHORT__GROUP_ID_MAX]; /* "" = the world */
	int32_t rank; /* this member's group rank */
	int32_t size;
	int32_t *global_ranks; /* group rank -> job rank (size) */
	uint64_t generation; /* job generation it was created in */

	/* Raised (release) by cohort__group_fail; every wait polls it
	 * (acquire). The backend gets a pointer to it. */
	atomic_int abort_flag;

	pthread_mutex_t mtx;
	atomic_int error; /* cohort_status; COHORT_OK while healthy */
	/* The first failure, under mtx (status OK while healthy). Its age
	 * is kept as failed_at, the monotonic ms it happened (a verdict
	 * arrives some ms after cohortd recorded it). */
	cohort_failure failure;
	cohort__time failed_at;

	/* Control plane (control.c). ctl_seq is the op_seq of the last
	 * control-plane collective that completed or failed stickily; the
	 * next one uses ctl_seq + 1 (a timed-out one is retried with the same
	 * op_seq). ctl_call is the call in progress, under mtx, so that
	 * cohort__group_fail can abort it. */
	pthread_mutex_t ctl_lock;
	uint64_t ctl_seq;
	struct cohort__coord_call *ctl_call;

	/* Data plane: owned by client/collectives.c. backend/backend_state
	 * are written under mtx (cohort__group_fail reads them there to call
	 * abort). op_lock serialises data-plane operations; data_seq numbers
	 * them. dp is the group's data-plane state (struct coll_dp: backend
	 * choice and set-up, the ordering of operations, the progress
	 * thread), owned and freed by collectives.c. dp_fini, if set, is
	 * called by cohort__group_free before anything is freed, to drain
	 * the queue and fini the backend; if it is NULL and backend_state is
	 * set, cohort__group_free calls backend->fini itself. */
	const struct cohort__backend_ops *backend;
	void *backend_state;
	pthread_mutex_t op_lock;
	uint64_t data_seq;
	void *dp;
	void (*dp_fini)(struct cohort_group *g);

	/* Hang attribution (issue 4): the operation last entered on the
	 * group, under mtx; the heartbeat reports it (client.c). Data-plane
	 * operations are numbered by data_seq, control-plane ones by their
	 * op_seq. kind is a static string, NULL before the first. */
	const char *op_kind;
	uint64_t op_seq;
	cohort__time op_start; /* monotonic ms when entered */
	cohort__time op_end; /* ... when left (valid when !op_in) */
	uint64_t op_start_ns, op_end_ns; /* the same in ns (observe.h) */
	bool op_in;

	int track; /* timeline track (observe.h) */

	struct cohort_group *next; /* the client's list, under c->mtx */
};

/* Allocates a group (not yet on the client's list). global_ranks (size
 * entries) is copied; NULL means the identity (the world). */
cohort_status cohort__group_alloc(const struct cohort__group_ctx *ctx,
    const char *id, int32_t rank, int32_t size, const int32_t *global_ranks,
    uint64_t generation, struct cohort_group **out);

/* Frees a group: dp_fini / backend fini, then everything. The caller has
 * removed it from the client's list. NULL-safe. */
void cohort__group_free(struct cohort_group *g);

/* Elastic (cohort_client_reform): the group in its new generation, with
 * its data plane already torn down (cohort__coll_teardown): the new
 * membership (global_ranks copied; NULL: the identity), control-plane and
 * data-plane numbering from 1 again, the sticky failure and the abort flag
 * cleared. Not while an operation runs on g. */
cohort_status cohort__group_reset(struct cohort_group *g, int32_t rank,
    int32_t size, const int32_t *global_ranks, uint64_t generation);

/* Records the failure f (sticky: the first one wins and is never merged
 * with a later one; a later failure this process saw itself is kept as
 * the first's `observed` detail), raises abort_flag, aborts the
 * control-plane call in progress and the backend. Never blocks (short
 * locks only); any thread, including nng callbacks. Returns the group's
 * sticky status (f->status unless another failure came first). */
cohort_status cohort__group_fail(
    struct cohort_group *g, const cohort_failure *f);

/* cohort__group_fail with a failure seen here (cohort__failure_local):
 * kind, and the text from fmt. */
cohort_status cohort__group_fail_local(struct cohort_group *g,
    cohort_status st, cohort_failure_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

/* COHORT_OK while healthy; else the sticky status, with the failure's text
 * as the thread's cohort_last_error(). */
cohort_status cohort__group_check(const struct cohort_group *g);

/* Operation hooks, called by control.c and collectives.c around every
 * collective and barrier (seq: the number the operation will carry).
 * op_begin first runs the client's fault schedule (fault.h), which may
 * delay, stop or end the process, or fail the operation: then it returns
 * COHORT_EINJECTED with the detail and the operation must not run (nor
 * call op_end). Otherwise it records the operation as entered (no round
 * trip: the next heartbeat carries it) and returns COHORT_OK. */
cohort_status cohort__group_op_begin(
    struct cohort_group *g, const char *kind, uint64_t seq);
void cohort__group_op_end(struct cohort_group *g);

/* Control-plane operation names (their seq is the control op_seq). */
bool cohort__op_is_control(const char *kind);

#endif /* COHORT_GROUP_H */
