/*
 * client.h - struct cohort_client (one membership in a job) and the
 * internal functions other client/ modules use.
 *
 * A client owns: its coordinator engine (coord.h), its groups (the world
 * and subgroups, a list under mtx), its liveness machinery (an nng sleep
 * aio that fires the heartbeat every heartbeat_ms, and a Watch long poll
 * re-issued in a loop; no thread of its own), and a sticky client-level
 * failure. When cohortd reports a failed peer (an EPEERLOST reply, a
 * heartbeat reply with healthy = false, or a Watch event), every group of
 * the client is failed (cohort__group_fail) so pending data-plane
 * operations abort at once.
 *
 * client.c holds what the layers above (kv.c, control.c, collectives.c)
 * use of a client; open.c, on top of them all, opens and closes it.
 */
#ifndef COHORT_CLIENT_H
#define COHORT_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>

#include "coord.h"
#include "group.h"
#include "observe.h"

struct cohort_client {
	struct cohort__coord *coord;
	char coordinator[256];
	char job[128];
	char token[128];
	char host[256];
	char backend[32]; /* opts->backend, "auto" by default */
	char data_addr[256]; /* opts->data_addr, "" = pick */
	int32_t rank;
	int32_t world_size;
	int32_t local_rank;
	uint64_t generation;
	uint64_t job_id;
	char **hosts; /* by rank, world_size entries (JoinReply) */
	cohort_duration op_timeout;
	cohort_duration join_timeout;
	cohort_duration heartbeat_ms;
	cohort_duration dead_after_ms;

	pthread_mutex_t mtx; /* groups, failure */
	struct cohort_group *groups;
	struct cohort_group *world;
	atomic_int error; /* cohort_status, sticky */
	cohort_failure failure; /* the first, under mtx */

	struct cohort__fault *fault; /* fault schedule (fault.h), or NULL */
	struct cohort__obs obs; /* metrics and timeline (observe.h) */

	atomic_bool closing;
	/* The process's heartbeat list (heartbeat.c): next/prev/due are its
	 * thread's; hb_op a pending add or remove posted on its inbox
	 * (inbox_next), 0 once the thread took it; hb_on the owner's. */
	struct cohort_client *hb_next, *hb_prev, *hb_inbox_next;
	cohort__time hb_due;
	bool (*hb_tick)(struct cohort_client *c);
	_Atomic int hb_op;
	bool hb_on;
	struct cohort__coord_async *hb;
	struct cohort__coord_async *watch;
	nng_aio *watch_timer; /* back-off between quick Watch returns */
	cohort__time watch_started;

	/* Elastic membership (elastic.c; docs/elastic.md). min_world 0: not
	 * elastic. The Watch is not re-issued in an old generation
	 * (cohortd would answer it EMEMBERSHIP at once): watch_idle says it
	 * waits for cohort_client_reform to start it again, under mtx. */
	int32_t min_world, max_world;
	bool watch_idle;
	/* The newest generation cohortd named (heartbeats, Watch,
	 * EMEMBERSHIP replies), under mtx: a change that arrived while the
	 * client reformed to an older one is not lost. */
	uint64_t seen_generation;
	/* This process holds the job's state (false: admitted into a
	 * running job, until a state transfer gave it the state). */
	bool has_state;
	/* The transfer the last boundary (or the admission) named and
	 * cohort_state_transfer has not done yet. `admitted`: this process
	 * was admitted into the running job and has not called a boundary
	 * yet; its first one answers the roles without asking cohortd (the
	 * others got them from the boundary that admitted it). */
	struct cohort__xfer {
		bool pending;
		bool admitted;
		bool known; /* sender and receivers known (a joiner learns
		               them from the job's KV) */
		uint64_t generation;
		uint64_t seq; /* the op_seq of the boundary that named it */
		int32_t sender;
		int32_t *receivers;
		int32_t nreceivers;
	} xfer;
};

/* Deadline of a call on c with a caller's timeout (COHORT_WAIT_DEFAULT =
 * the client's op_timeout). */
cohort__time cohort__client_deadline(
    const struct cohort_client *c, cohort_duration timeout);

/* A new group of c (cohort__group_alloc with c's engine, metrics and
 * fault schedule), not yet on the list. */
cohort_status cohort__client_new_group(struct cohort_client *c, const char *id,
    int32_t rank, int32_t size, const int32_t *global_ranks,
    struct cohort_group **out);

/* Puts g on / takes g off the client's group list. */
void cohort__client_add_group(struct cohort_client *c, struct cohort_group *g);
void cohort__client_remove_group(
    struct cohort_client *c, struct cohort_group *g);

/* Records a client-level failure (sticky, first wins) and fails every
 * group with it. Never blocks; any thread. _local: one seen here, with
 * its kind and text. */
void cohort__client_fail(struct cohort_client *c, const cohort_failure *f);
void cohort__client_fail_local(struct cohort_client *c, cohort_status st,
    cohort_failure_kind kind, const char *text);

/* A reply of any call said the job failed (st EPEERLOST: a member failed;
 * ESTALE: the generation moved) or, in an elastic job, that its membership
 * changed (EMEMBERSHIP): fails the client, so every group, with cohortd's
 * verdict from the reply. An EMEMBERSHIP whose reply names a generation
 * the client already reformed to is old news and changes nothing. Any
 * other st: nothing. Returns st. */
cohort_status cohort__client_job_failed(
    struct cohort_client *c, cohort_status st, const Cohort__Reply *rep);

/* Elastic: cohortd says the job is at generation gen (a heartbeat, a
 * Watch). When that is newer than the client's, every group fails with
 * COHORT_EMEMBERSHIP (kind GENERATION) until cohort_client_reform.
 * Returns true when it did. Never blocks; any thread. */
bool cohort__client_generation_moved(struct cohort_client *c, uint64_t gen);

/* Elastic: the Watch stopped in an old generation; reform restarts it
 * (open.c). Under c->mtx: watch_idle. */
void cohort__client_watch_restart(struct cohort_client *c);

/* The step boundary's round trip (control.c): COLL_BOUNDARY on the world
 * group, numbered like its other control-plane collectives. On COHORT_OK
 * the reply's fields are copied into *out (receivers malloc'd, free()). */
struct cohort__boundary_reply {
	bool changed;
	uint64_t generation;
	uint64_t seq; /* its op_seq */
	int32_t sender;
	int32_t *receivers;
	int32_t nreceivers;
};
cohort_status cohort__control_boundary(struct cohort_group *world,
    bool has_state, cohort_duration timeout,
    struct cohort__boundary_reply *out);

/* The process's heartbeat timer (heartbeat.c): one thread for all the
 * clients of a process calls tick(c) every
 * c->heartbeat_ms, the first time first_ms from now. Once unregister
 * returned, no tick of c runs or will (it waits for the thread, shortly:
 * a tick never blocks). */
/* Starts the process's heartbeat thread now, if it has none (it inherits
 * the calling thread's scheduling priority; the join bench starts it
 * before it lowers its simulated ranks' priority). */
cohort_status cohort__hb_start(void);
cohort_status cohort__hb_register(struct cohort_client *c,
    cohort_duration first_ms, bool (*tick)(struct cohort_client *c));
void cohort__hb_unregister(struct cohort_client *c);
/* tick: one heartbeat of c (open.c's), false when a lock it needs was
 * busy (nothing sent: the timer tries again a round later). */

/* The job's KV space that is libcohort's own (COHORT__KV_RESERVED): the
 * public calls refuse its keys; libcohort uses these (kv.c). */
cohort_status cohort__kv_set(struct cohort_client *c, const char *key,
    const void *value, size_t len, cohort_duration timeout);
cohort_status cohort__kv_get(struct cohort_client *c, const char *key,
    void **value, size_t *len, cohort_duration timeout);
/* Waits until every key exists and reads them all in one round trip;
 * vals[i] malloc'd (free()), lens[i] its length; on an error none is
 * kept. */
cohort_status cohort__kv_multi_get(struct cohort_client *c,
    const char *const *keys, size_t nkeys, void **vals, size_t *lens,
    cohort_duration timeout);
cohort_status cohort__kv_add(struct cohort_client *c, const char *key,
    int64_t delta, int64_t *out, cohort_duration timeout);
cohort_status cohort__kv_delete(
    struct cohort_client *c, const char *key, cohort_duration timeout);

/* For a data-plane operation `kind` #seq of g that timed out: asks cohortd
 * (one StatusQuery, at most a few seconds) which members of g had not
 * entered it according to their heartbeats, and writes "ranks 2, 3 never
 * entered allreduce #5 (rank 2 last seen 0.4 s ago after allreduce #4,
 * ...)" into buf. False if cohortd could not tell. */
bool cohort__client_who_missing(struct cohort_client *c,
    struct cohort_group *g, const char *kind, uint64_t seq, char *buf,
    size_t len);

/* What this rank is doing, as a heartbeat says it: the operation in
 * progress entered first (the one a hang is about), else the one left
 * last; its group's name into grp. */
void cohort__client_doing(
    struct cohort_client *c, Cohort__Heartbeat *hb, char *grp, size_t grplen);
/* The same without waiting for a lock another thread holds: false (hb
 * partly filled, to be dropped) when one was busy (the heartbeat thread;
 * heartbeat.c). */
bool cohort__client_doing_try(
    struct cohort_client *c, Cohort__Heartbeat *hb, char *grp, size_t grplen);

/* Sends one heartbeat now, saying this rank is in `kind` #seq of group
 * (so that cohortd's failure record names it), bounded to about 3 s. */
void cohort__client_heartbeat_now(struct cohort_client *c, const char *kind,
    const char *group, uint64_t seq);

#endif /* COHORT_CLIENT_H */
