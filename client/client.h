/*
 * client.h - struct cohort_client (one membership in a job) and the
 * internal functions other client/ modules use.
 *
 * A client owns: its coordinator engine (coord.h), its groups (the world
 * and subgroups, a list under mtx), its liveness machinery (an nng sleep
 * aio that fires the heartbeat every heartbeat_ms, and a Watch long poll
 * re-issued in a loop; no thread of its own), and a sticky client-level
 * error. When cohortd reports a failed peer (an EPEERLOST reply, a
 * heartbeat reply with healthy = false, or a Watch event), every group of
 * the client is failed (cohort__group_fail) so pending data-plane
 * operations abort at once.
 */
#ifndef COHORT_CLIENT_H
#define COHORT_CLIENT_H

#include <pthread.h>
#include <stdatomic.h>

#include "coord.h"
#include "group.h"

struct cohort_client {
	struct cohort__coord *coord;
	char coordinator[256];
	char job[128];
	char token[128];
	char host[256];
	char backend[32];     /* opts->backend, "auto" by default */
	char data_addr[256];  /* opts->data_addr, "" = pick */
	int32_t rank;
	int32_t world_size;
	int32_t local_rank;
	uint64_t generation;
	uint64_t job_id;
	char **hosts;         /* by rank, world_size entries (JoinReply) */
	cohort_duration op_timeout;
	cohort_duration join_timeout;
	cohort_duration heartbeat_ms;
	cohort_duration dead_after_ms;

	pthread_mutex_t mtx;  /* groups, error_detail, last_op */
	struct cohort_group *groups;
	struct cohort_group *world;
	atomic_int error;     /* cohort_status, sticky */
	char error_detail[1024];
	char last_op[64];
	uint64_t last_op_seq;

	atomic_bool closing;
	nng_aio *hb_timer;
	struct cohort__coord_async *hb;
	struct cohort__coord_async *watch;
	nng_aio *watch_timer;       /* back-off between quick Watch returns */
	cohort__time watch_started;
};

/* Deadline of a call on c with a caller's timeout (COHORT_WAIT_DEFAULT =
 * the client's op_timeout). */
cohort__time cohort__client_deadline(const struct cohort_client *c,
    cohort_duration timeout);

/* Puts g on / takes g off the client's group list. */
void cohort__client_add_group(struct cohort_client *c, struct cohort_group *g);
void cohort__client_remove_group(struct cohort_client *c,
    struct cohort_group *g);

/* Records a client-level failure (sticky, first wins) and fails every
 * group with st and the detail. Never blocks; any thread. */
void cohort__client_fail(struct cohort_client *c, cohort_status st,
    const char *detail);

/* Handles a reply status that concerns the whole job (EPEERLOST, ESTALE)
 * from any call: fails the client's groups with the reply's detail and
 * the failed rank's text. Returns st. */
cohort_status cohort__client_check_reply(struct cohort_client *c,
    cohort_status st, const Cohort__Reply *rep);

/* What this rank is doing, sent with the next heartbeat (cohortd's status
 * shows it to attribute hangs). name is copied. */
void cohort__client_note_op(struct cohort_client *c, const char *name,
    uint64_t seq);

/* The job's KV at cohortd as a backend rendezvous store (backend.h);
 * values from get are malloc'd. */
struct cohort__store cohort__client_store(struct cohort_client *c);

#endif /* COHORT_CLIENT_H */
