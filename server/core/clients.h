/*
 * clients.h - a job's clients and their reply cache.
 *
 * A client is one (job, client_id): a worker's membership, a tool, a
 * TCPStore connection. It is bound to one connection (pipe) at a time
 * and remembers the replies to its last SRV_CACHE requests, so that a
 * request re-sent after a broken connection or a coordinator restart is
 * answered from memory instead of being applied twice (proto/README.md
 * 2.3). The replies of mutating requests are journalled with their
 * change (durable), under the job's journal identity.
 */
#ifndef COHORT_SRV_CLIENTS_H
#define COHORT_SRV_CLIENTS_H

#include "core.h"

/* Replies remembered per client for retries (proto/README.md 2.3). */
#define SRV_CACHE 16
/* Replies larger than this are not cached (a retry re-executes; every op
 * with a big reply is a read). */
#define SRV_CACHE_MAX_BYTES (64u << 10)

struct srv_job;
struct srv_member;
struct srv_jrn_job;

/* The clients of one job (embedded in it). */
struct srv_clients {
	struct srv_map map; /* srv_client by id */
	struct srv_job *job; /* their job (not looked into here) */
	struct srv_jrn_job *jr; /* whose records their replies are */
};

/* A remembered reply. */
struct srv_cached {
	uint64_t seq;
	uint32_t rhash; /* the request's srv_call.rhash; 0: unknown */
	nng_msg *msg;
	bool durable; /* journalled (the reply of a mutating op) */
	bool ok; /* its status is COHORT_OK */
	uint64_t ev; /* the core event that cached it */
};

struct srv_client {
	struct srv_hnode hn; /* in set->map by id */
	struct srv_link alink; /* in core->clients */
	uint64_t id;
	struct srv_core *core;
	struct srv_clients *set;
	struct srv_job *job; /* set->job */
	/* Its member of the current generation, or NULL (state/ sets it). */
	struct srv_member *member;
	uint32_t pipe; /* 0: none */
	struct srv_link plink; /* in the pipe's client list */
	struct srv_link parked; /* srv_call.clink */
	cohort__time last_seen;
	struct srv_cached cache[SRV_CACHE];
	unsigned cache_next;
};

void srv_clients_init(
    struct srv_clients *cs, struct srv_job *job, struct srv_jrn_job *jr);
/* Frees the table (every client must have been freed). */
void srv_clients_fini(struct srv_clients *cs);
/* The client, or NULL. */
struct srv_client *srv_client_find(const struct srv_clients *cs, uint64_t id);
/* The client, created if absent (NULL: out of memory). */
struct srv_client *srv_client_get(struct srv_core *core,
    struct srv_clients *cs, uint64_t id, cohort__time now);
/* Frees cl, which has no parked call (answer or drop them first,
 * call.h) and no member (state/ unbinds it first). */
void srv_client_free(struct srv_client *cl);
/* Records which connection the client uses now (proto/README.md 2.4);
 * pipe 0 changes nothing. */
void srv_client_set_pipe(struct srv_client *cl, uint32_t pipe);
/* Unbinds cl from its connection (the pipe goes with its last client
 * unless its connection is open). */
void srv_client_unlink_pipe(struct srv_client *cl);
/* Puts a reply into the cache ring, taking m; rhash: the request's (0:
 * unknown, as for replies restored from the journal). */
void srv_client_cache_put(struct srv_client *cl, uint64_t seq, uint32_t rhash,
    nng_msg *m, bool durable, bool ok);
/* The remembered reply to seq, or NULL. */
struct srv_cached *srv_client_cache_find(struct srv_client *cl, uint64_t seq);
/* Whether a reply of cl is in the journal (its removal must be too). */
bool srv_client_has_durable(const struct srv_client *cl);

#endif /* COHORT_SRV_CLIENTS_H */
