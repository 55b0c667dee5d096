/*
 * call.h - a request being handled (struct srv_call), its deadline, and
 * every way it ends.
 *
 * A call is answered at once or *parked*: it then sits in its owner (a
 * rendezvous, a collective, a group creation, KV waiters, watchers), in
 * its client's parked list and, if it has a deadline, in the core's
 * deadline heap. Leaving the parked state goes through exactly one of:
 * answered by its owner (completion, failure fan-out), srv_call_expire
 * (deadline), srv_call_withdraw + srv_call_drop (connection lost, a
 * retry took over the slot). The owner is reached only through the hooks
 * it names when it parks the call (srv_park_ops, as Redis' blocked-client
 * types and nng's aio cancel functions), so the core knows no owner.
 *
 * Replies leave through the core's sink, or at the end of their event
 * once the event's journal records are written (srv_core_event_end).
 */
#ifndef COHORT_SRV_CALL_H
#define COHORT_SRV_CALL_H

#include "core.h"

struct srv_client;
struct srv_job;

enum srv_park {
	SRV_PARK_NONE = 0,
	SRV_PARK_JOIN,
	SRV_PARK_COLL,
	SRV_PARK_GROUP,
	SRV_PARK_WATCH,
	SRV_PARK_KV,
};

/* What becomes of a parked call, given by the module that parks it. */
struct srv_park_ops {
	enum srv_park kind;
	/* Unlinks c from its owner (connection lost, a retry took over). */
	void (*withdraw)(struct srv_call *c);
	/* c's deadline passed: answer it (srv_call_withdraw first). */
	void (*expire)(struct srv_call *c, cohort__time now);
	/* What c waits in, for texts ("barrier 'x' (#5) on group 'g'");
	 * NULL: nothing worth naming. */
	void (*describe)(const struct srv_call *c, char *buf, size_t len);
	/* The same as the fields of a failure record (proto Failure): what
	 * without its number, its op_seq and group ("" = the world); NULL:
	 * nothing worth naming. */
	void (*what)(const struct srv_call *c, char *buf, size_t len,
	    uint64_t *seq, const char **group);
};

/* What a collective arrival asked for; all arrivals must agree. */
struct srv_cdesc {
	int kind;
	char *name;
	int32_t root;
	uint32_t op;
	int stype;
	size_t nvals;
	bool decide_all;
	uint32_t service_op;
	uint32_t dtype;
	uint64_t count; /* SERVICE: elements */
};

/* A KV wait's link in the waiter list of one absent key. */
struct srv_kvlink {
	struct srv_link link;
	struct srv_call *call;
	bool present;
};

struct srv_call {
	struct srv_core *core;
	struct srv_job *job; /* NULL before authentication */
	/* The job's generation, stamped on every reply but an EAUTH (NULL
	 * before authentication). */
	const uint64_t *generation;
	struct srv_client *client; /* NULL before authentication */
	void *tp; /* transport handle, opaque */
	uint64_t seq;
	/* The generation and rank the request says its client is in. */
	uint64_t req_gen;
	int32_t req_rank;
	int body; /* Cohort__Request__BodyCase */
	/* A mutating request: its reply is journalled with its change. */
	bool mutating;
	/* What the request asks (body kind, packed body, payload length
	 * and head), never 0: a cached reply or a parked slot is handed
	 * only to a retry of the same request. */
	uint32_t rhash;
	enum srv_park park;
	const struct srv_park_ops *park_ops; /* NULL when not parked */
	cohort__time start;
	cohort__time deadline;
	size_t heap_idx; /* SIZE_MAX when not in the heap */
	struct srv_link clink; /* client's parked calls */
	struct srv_link olink; /* owner list: rdzv auto joins, watchers */
	void *owner; /* srv_coll / srv_group / NULL */
	nng_msg *msg; /* the request, owned, until taken */
	const uint8_t *payload; /* into msg */
	size_t plen;
	uint64_t object_len; /* broadcast root: its announced object size */

	/* Copied request fields of parked kinds (freed with the call). */
	int32_t rank; /* join: requested; coll/group: job rank */
	int32_t grank; /* coll/group: group rank */
	uint32_t world;
	char *host;
	uint32_t pid;
	int32_t local_rank;
	uint32_t hb_ms;
	uint32_t dead_ms;
	uint32_t min_world; /* join: elastic range's lower end (0: none) */
	bool no_list; /* join: reply without hosts and local_ranks */
	bool has_state; /* step boundary: the arrival holds the state */
	struct srv_cdesc cd;
	int64_t *i64s;
	double *f64s;
	bool decision;
	char **keys; /* KV waits */
	size_t nkeys;
	size_t nmissing;
	struct srv_kvlink *kvl;
	/* While parked: what it holds (counted in core->parked_bytes) and
	 * the connection it counts against. */
	uint64_t held;
	uint32_t park_pipe;
};

/* A new call for a request that came with transport handle tp (NULL:
 * out of memory). */
struct srv_call *srv_call_new(
    struct srv_core *core, void *tp, cohort__time now);
/* Frees an unparked call and what it holds. */
void srv_call_free(struct srv_call *c);
/* A reply envelope for c with status st. */
void srv_reply_init(
    Cohort__Reply *rep, const struct srv_call *c, cohort_status st);
/* Packs, caches, sends rep and frees c (which must be unparked from its
 * owner already; the heap and client list are left here). */
void srv_call_answer(struct srv_call *c, Cohort__Reply *rep,
    const struct cohort__iov *parts, size_t nparts);
void srv_call_fail(struct srv_call *c, cohort_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Frees c without a reply (its tp goes back to the transport). */
void srv_call_drop(struct srv_call *c);
/* Whether c (a request that may park) may park one more request over
 * connection pipe: false (c answered with COHORT_ETOOBIG naming the
 * bound) when cohortd holds --max-parked requests or
 * --max-parked-bytes, or the connection SRV_PARKED_PER_CONN. */
bool srv_call_room(struct srv_call *c, uint32_t pipe);
/* Parks c (deadline heap + client list); the owner links it itself and
 * names its hooks (ops, static). */
void srv_call_park(struct srv_call *c, const struct srv_park_ops *ops);
/* Removes a parked c from its owner (ops->withdraw), heap and client. */
void srv_call_withdraw(struct srv_call *c, cohort__time now);
/* c's deadline passed: its owner answers it. */
void srv_call_expire(struct srv_call *c, cohort__time now);
/* Answers a parked c (withdrawn here) with ETIMEDOUT, the text why and
 * the nm ranks in miss that never came; frees miss (NULL: none known). */
void srv_call_timed_out(struct srv_call *c, cohort__time now, const char *why,
    int32_t *miss, size_t nm);
/* What a parked c waits in (its owner's describe hook) into buf; false
 * (buf untouched) if its kind names nothing. */
bool srv_call_describe(const struct srv_call *c, char *buf, size_t len);
/* The same as a failure record's fields (the owner's what hook); false
 * (nothing written) if its kind names nothing. */
bool srv_call_what(const struct srv_call *c, char *buf, size_t len,
    uint64_t *seq, const char **group);
/* The parked call whose deadline is due first, if due by now. */
struct srv_call *srv_core_next_due(
    const struct srv_core *core, cohort__time now);
/* Answers every parked call of cl with st and why. */
void srv_calls_fail_parked(
    struct srv_client *cl, cohort_status st, const char *why);
/* Drops every parked call of cl unanswered (nobody hears them). */
void srv_calls_drop_parked(struct srv_client *cl, cohort__time now);
/* Answers the parked request seq of cl with st and why (a client gave up
 * waiting, e.g. TCPStore's CANCEL_WAIT). False if no such request is
 * parked (it was answered already). */
bool srv_call_cancel(struct srv_client *cl, uint64_t seq, cohort_status st,
    const char *why, cohort__time now);

/* Brackets of every event (dispatch, sweep, pipe_closed): end writes the
 * event's journal records, then lets its replies leave, each OK reply
 * replaced by COHORT_EJOURNAL if the records could not be written. */
void srv_core_event_begin(struct srv_core *core);
void srv_core_event_end(struct srv_core *core, cohort__time now);

#endif /* COHORT_SRV_CALL_H */
