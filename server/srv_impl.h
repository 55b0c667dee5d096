/*
 * srv_impl.h - internals of cohortd shared by the server modules.
 *
 * The coordinator is split in two layers:
 *
 *  - the *core* (core.c, dispatch.c, job.c, kv.c, coll.c, status.c): every
 *    job, member, key and parked request, driven only through
 *    srv_core_dispatch / srv_core_sweep / srv_core_pipe_closed with an
 *    explicit `now`. It never touches a socket: replies leave through a
 *    sink callback as packed nng messages, tagged with the opaque transport
 *    handle (`tp`) the request came with. Unit tests drive it with a fake
 *    clock and a capturing sink.
 *  - the *transport* (srv.c): the rep0 socket, its pool of contexts, pipe
 *    events, the 100 ms sweep timer and the one mutex that serialises all
 *    calls into the core.
 *
 * A request is a `struct srv_call`. It is answered at once or *parked*:
 * it then sits in its owner (rendezvous, collective, group creation, KV
 * waiters or watchers), in its client's parked list and, if it has a
 * deadline, in the core's deadline heap. Leaving the parked state goes
 * through exactly one of: answered by its owner (completion, failure
 * fan-out), srv_call_expire (deadline), srv_call_withdraw + srv_call_drop
 * (connection lost, retry took over the slot).
 */
#ifndef COHORT_SRV_IMPL_H
#define COHORT_SRV_IMPL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort_common.h"
#include "wire.h"
#include "server.h"

#define SRV_CONTAINER(p, T, f) ((T *)(void *)((char *)(p)-offsetof(T, f)))

/* Largest job name, token, host, group name, last_op. */
#define SRV_MAX_NAME 255
/* Replies remembered per client for retries (proto/README.md 2.3). */
#define SRV_CACHE 16
/* Replies larger than this are not cached (a retry re-executes; every op
 * with a big reply is a read). */
#define SRV_CACHE_MAX_BYTES (64u << 10)
/* Largest world. */
#define SRV_MAX_WORLD 65536
/* Clients remembered per job. */
#define SRV_MAX_CLIENTS (1u << 20)

/* ------------------------------------------------------------------------ */
/* Intrusive lists and a hash map                                           */
/* ------------------------------------------------------------------------ */

struct srv_link {
	struct srv_link *next;
	struct srv_link *prev;
};

static inline void
srv_list_init(struct srv_link *h)
{
	h->next = h->prev = h;
}

static inline bool
srv_list_empty(const struct srv_link *h)
{
	return (h->next == h);
}

static inline void
srv_list_append(struct srv_link *h, struct srv_link *l)
{
	l->prev = h->prev;
	l->next = h;
	h->prev->next = l;
	h->prev = l;
}

static inline void
srv_list_remove(struct srv_link *l)
{
	l->prev->next = l->next;
	l->next->prev = l->prev;
	l->next = l->prev = l;
}

struct srv_hnode {
	struct srv_hnode *next;
	uint64_t hash;
	const void *key;
	size_t klen;
};

struct srv_map {
	struct srv_hnode **b;
	size_t nb;
	size_t n;
};

void srv_map_init(struct srv_map *m);
/* Frees the table only; the nodes belong to their owners. */
void srv_map_fini(struct srv_map *m);
struct srv_hnode *srv_map_get(
    const struct srv_map *m, const void *key, size_t klen);
/* Inserts n (whose key memory must outlive it). ENOMEM only. */
cohort_status srv_map_put(
    struct srv_map *m, struct srv_hnode *n, const void *key, size_t klen);
void srv_map_del(struct srv_map *m, struct srv_hnode *n);
/* Iteration: n = srv_map_next(m, &i, NULL) first, then with the previous
 * node. Fetch the next node before deleting the current one. */
struct srv_hnode *srv_map_next(
    const struct srv_map *m, size_t *i, struct srv_hnode *cur);

/* ------------------------------------------------------------------------ */
/* Core objects                                                             */
/* ------------------------------------------------------------------------ */

struct srv_core;
struct srv_job;
struct srv_client;
struct srv_call;

enum srv_park {
	SRV_PARK_NONE = 0,
	SRV_PARK_JOIN,
	SRV_PARK_COLL,
	SRV_PARK_GROUP,
	SRV_PARK_WATCH,
	SRV_PARK_KV,
};

/* What becomes of a parked call, given by the module that parks it (as
 * Redis' blocked-client types and nng's aio cancel functions do): the
 * core reaches each module's waiters only through these hooks. */
struct srv_park_ops {
	enum srv_park kind;
	/* Unlinks c from its owner (connection lost, a retry took over). */
	void (*withdraw)(struct srv_call *c);
	/* c's deadline passed: answer it (srv_call_withdraw first). */
	void (*expire)(struct srv_call *c, cohort__time now);
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

struct srv_kvlink {
	struct srv_link link; /* in the key's waiter list */
	struct srv_call *call;
	bool present;
};

struct srv_call {
	struct srv_core *core;
	struct srv_job *job; /* NULL before authentication */
	struct srv_client *client; /* NULL before authentication */
	void *tp; /* transport handle, opaque */
	uint64_t seq;
	int body; /* Cohort__Request__BodyCase */
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

	/* Copied request fields of parked kinds. */
	int32_t rank; /* join: requested; coll/group: job rank */
	int32_t grank; /* coll/group: group rank */
	uint32_t world;
	char *host;
	uint32_t pid;
	int32_t local_rank;
	uint32_t hb_ms;
	uint32_t dead_ms;
	struct srv_cdesc cd;
	int64_t *i64s;
	double *f64s;
	bool decision;
	char **keys; /* KV waits */
	size_t nkeys;
	size_t nmissing;
	struct srv_kvlink *kvl;
};

enum srv_member_state {
	SRV_MEMBER_RUNNING,
	SRV_MEMBER_FAILED,
	SRV_MEMBER_LEFT,
};

struct srv_member {
	int32_t rank;
	enum srv_member_state state;
	char host[SRV_MAX_NAME + 1];
	uint32_t pid;
	int32_t local_rank;
	uint32_t hb_ms;
	uint32_t dead_ms;
	cohort__time last_seen;
	/* Restored from the journal at restored_at: not declared dead
	 * before grace_until (cohortd's restart is not the member's fault).
	 */
	cohort__time restored_at;
	cohort__time grace_until;
	char last_op[SRV_MAX_NAME + 1];
	uint64_t last_op_seq;
	/* Heartbeat's data-plane view (hang attribution). */
	char last_group[SRV_MAX_NAME + 1];
	bool in_op;
	cohort__time op_since; /* in_op: when it entered last_op */
	cohort__time op_at; /* when last_op was reported (0: never) */
	uint64_t stall_logged; /* last_op_seq + 1 of the logged stall */
	char *failure;
	struct srv_client *client;
};

struct srv_client {
	struct srv_hnode hn; /* in job->clients by id */
	uint64_t id;
	struct srv_job *job;
	struct srv_member *member; /* current generation, or NULL */
	uint32_t pipe;
	struct srv_link plink; /* in the pipe's client list */
	struct srv_link parked; /* srv_call.clink */
	cohort__time last_seen;
	struct {
		uint64_t seq;
		uint32_t rhash; /* the request's srv_call.rhash; 0: unknown */
		nng_msg *msg;
		bool durable; /* journalled (the reply of a mutating op) */
		bool ok; /* its status is COHORT_OK */
		uint64_t ev; /* the core event that cached it */
	} cache[SRV_CACHE];
	unsigned cache_next;
};

struct srv_kv {
	struct srv_map keys; /* srv_kvent */
	struct srv_map waits; /* srv_kvwait: absent keys someone waits on */
	uint64_t bytes;
	/* The core's totals over all jobs (NULL: none), kept in step. */
	uint64_t *tot_bytes;
	uint64_t *tot_keys;
};

struct srv_group {
	struct srv_hnode hn; /* in job->groups by name */
	char *name;
	int32_t *ranks; /* job ranks by group rank */
	uint32_t n;
	int32_t *grank_of; /* by job rank, -1 = not in group */
	bool complete;
	struct srv_call **arr; /* pending creation: arrivals by group rank */
	uint32_t narr;
	cohort__time first;
};

/* One control-plane collective in flight, keyed by (group, op_seq). */
struct srv_coll {
	struct srv_hnode hn; /* in job->colls */
	struct srv_job *job;
	uint8_t *key;
	size_t klen;
	struct srv_group *g;
	uint64_t op_seq;
	struct srv_cdesc cd; /* of the first arrival */
	struct srv_call **calls; /* parked arrivals by group rank */
	uint8_t *arrived; /* by group rank */
	uint32_t narrived;
	uint32_t nparked;
	cohort__time first;
	char *mismatch; /* set: a tombstone answering fail_st */
	cohort_status fail_st; /* EMISMATCH, or ETOOBIG (broadcast) */
	/* BROADCAST: the root's request message holds the object. */
	nng_msg *bmsg;
	const uint8_t *bdata;
	size_t blen;
	bool root_in;
	uint32_t ndelivered;
	bool stall_logged;
};

enum srv_job_state {
	SRV_JOB_NEW, /* no generation yet */
	SRV_JOB_RUNNING, /* generation complete */
	SRV_JOB_FAILED, /* a member failed in this generation */
};

struct srv_job {
	struct srv_hnode hn; /* in core->jobs by name */
	struct srv_core *core;
	char *name;
	char *token;
	bool preset; /* --job: kept when empty */
	bool journaled; /* its JOB record is in the journal */
	/* Restored without a generation (its rendezvous was pending): kept
	 * until a join comes back, although it has no members. */
	bool restored;
	/* Last request of one of its clients or close of one of their
	 * connections (0: not yet known; the next sweep sets it). */
	cohort__time last_active;
	uint64_t job_id;
	uint64_t generation;
	enum srv_job_state state;
	uint32_t world;
	struct srv_member *members; /* world entries */
	int32_t failed_rank;
	char *failed_text;
	char *failed_detail;
	/* The same as data (Reply.failure, JobStatus.failure; strings owned)
	 * and when it happened (0: restored, unknown). */
	Cohort__Failure failure;
	cohort__time failed_at;
	/* Pending rendezvous (rdzv_world == 0: none). */
	uint32_t rdzv_world;
	uint32_t rdzv_n;
	struct srv_call **rdzv_by_rank;
	struct srv_link rdzv_auto;
	cohort__time rdzv_start;
	struct srv_link watchers;
	struct srv_map clients;
	struct srv_map groups;
	struct srv_map colls;
	struct srv_kv kv;
};

/* Limits; the ones after max_keys are 0 for "none" (cohortd sets its
 * defaults in cohort__srv_config_init). */
struct srv_limits {
	uint64_t max_value;
	uint64_t max_job_bytes;
	uint64_t max_keys;
	uint64_t max_total_bytes; /* keys + values of all jobs */
	uint64_t max_total_keys; /* keys of all jobs */
	uint64_t max_jobs; /* jobs held (abandoned ones until they expire) */
	uint64_t max_members; /* world size of one job */
	uint64_t max_total_members; /* world sizes of all jobs */
};

/* Transport handles (`tp`) start with this, so that the one sink can
 * tell an nng context (srv.c) from a TCPStore request (torchstore.c). */
enum srv_tp_kind {
	SRV_TP_NNG = 1,
	SRV_TP_TORCH,
};
struct srv_tp {
	enum srv_tp_kind kind;
};

/* The sink takes ownership of reply; reply == NULL means "no reply: the
 * transport handle is free again" (request dropped or taken over). */
typedef void (*srv_sink_fn)(void *arg, void *tp, nng_msg *reply);

struct srv_metrics {
	uint64_t requests;
	uint64_t replies_error;
	uint64_t failures;
	uint64_t timeouts;
	uint64_t rendezvous;
	uint64_t collectives;
	uint64_t stalls; /* stall warnings logged */
	uint64_t dropped_closed; /* requests of closed connections */
	uint64_t loop_stalls; /* event-loop stalls (srv_core_loop_stall) */
	uint64_t conns_opened; /* connections (srv_core_pipe_opened) */
	uint64_t conns_closed_first; /* no first request in time */
	uint64_t conns_closed_idle; /* idle past --idle-timeout */
	uint64_t jobs_expired; /* --job-expiry */
	uint64_t limit_refusals; /* requests refused by a global limit */
	cohort__time loop_lag_ms; /* lag of the last sweep */
	cohort__time loop_lag_max_ms; /* largest lag seen */
};

struct srv_jrn;

/* Connections of clients that left, closed by cohortd shortly after the
 * Leave reply went out (see srv_core_take_pipes_to_close). */
#define SRV_CLOSE_PIPES 256
struct srv_pipe_close {
	uint32_t pipe;
	cohort__time at;
};

struct srv_core {
	struct srv_pipe_close close_pipes[SRV_CLOSE_PIPES];
	unsigned nclose_pipes;
	struct srv_limits lim;
	char *admin_token;
	/* --require-token: a join creates a job only with the token minted
	 * from admin_token for it (docs/security.md). */
	bool require_token;
	/* --open-status: a StatusQuery for all jobs needs no admin secret
	 * when none is configured (a private coordinator). */
	bool open_status;
	/* --metrics-per-job: /metrics has series labelled with job names. */
	bool metrics_jobs;
	srv_sink_fn sink;
	void *sink_arg;
	struct srv_map jobs;
	struct srv_map pipes;
	struct srv_call **heap;
	size_t heap_n;
	size_t heap_cap;
	size_t nparked;
	uint64_t nclients;
	cohort__time started;
	uint64_t rnd;
	struct srv_metrics m;
	/* Pipes whose close event was seen (id -> time), so that a request
	 * processed after the event does not re-register its connection. */
	struct srv_map closed;
	cohort__time stall_ms; /* --stall-threshold */
	cohort__time first_request_ms; /* --first-request-timeout */
	/* --job-expiry: a job with no running member and no connected
	 * client is removed after this long (0: never). */
	cohort__time job_expiry_ms;
	uint64_t kv_bytes; /* keys + values of all jobs */
	uint64_t kv_keys; /* keys of all jobs */
	cohort__time idle_ms; /* --idle-timeout */
	cohort__time restore_grace_ms; /* --restore-grace */
	bool draining; /* SIGTERM: /readyz answers 503, then the stop */
	cohort__time stall_next; /* next stall check */
	struct srv_jrn *jrn; /* NULL: no --state-dir */
	/* Shutting down with a journal: parked calls are dropped, not
	 * answered, so that clients re-send them to the next cohortd. */
	bool quiet;
	struct srv_obs *obs; /* per-rank metrics (observe.c), lazily */
	/* Inside an event (a request, a sweep, a closed connection) with a
	 * journal, replies wait in pend until the event's records are
	 * written: a change that could not be journalled is not
	 * acknowledged (srv_core_event_end). */
	bool in_event;
	uint64_t ev; /* events begun */
	struct srv_pend *pend;
	size_t npend;
	size_t pend_cap;
};

/* A reply held until its event's records are written. */
struct srv_pend {
	void *tp;
	nng_msg *msg;
	uint64_t seq;
	bool ok; /* status COHORT_OK: rewritten if the write fails */
};

#define SRV_DEFAULT_STALL_MS 60000

/* ------------------------------------------------------------------------ */
/* core.c                                                                   */
/* ------------------------------------------------------------------------ */

cohort_status srv_core_new(const struct srv_limits *lim,
    const char *admin_token, srv_sink_fn sink, void *arg, cohort__time now,
    struct srv_core **out);
/* Brackets of every event (dispatch, sweep, pipe_closed): end writes the
 * event's journal records, then lets its replies leave, each OK reply
 * replaced by COHORT_EJOURNAL if the records could not be written. */
void srv_core_event_begin(struct srv_core *core);
void srv_core_event_end(struct srv_core *core, cohort__time now);
/* Answers every parked request with COHORT_ECLOSED. */
void srv_core_close_all(struct srv_core *core);
void srv_core_free(struct srv_core *core);
/* Pre-creates a job ("--job NAME:TOKEN"). */
cohort_status srv_core_add_job(
    struct srv_core *core, const char *name, const char *token);
/* Takes ownership of msg; the reply (or none) goes to the sink with tp. */
void srv_core_dispatch(struct srv_core *core, nng_msg *msg, uint32_t pipe,
    void *tp, cohort__time now);
/* Deadlines and heartbeat silence. */
void srv_core_sweep(struct srv_core *core, cohort__time now);
/* The transport's sweep ran lag_ms later than due (measured by the
 * transport, which knows the interval). Records the lag; a lag of at
 * least SRV_LOOP_STALL_MS is a stall of cohortd itself (SIGSTOP, a VM
 * pause, a long page-in): the heartbeats queued meanwhile have not been
 * read yet, so the stall is credited to every running member's last
 * sign of life (and to every connection's timeouts), capped at now: a
 * member is never declared dead for cohortd's own silence, and one that
 * stays silent is one dead-after later. Call it before srv_core_sweep. */
void srv_core_loop_lag(
    struct srv_core *core, cohort__time lag_ms, cohort__time now);
/* A sweep this late is a stall (docs/coordinator.md, Liveness). */
#define SRV_LOOP_STALL_MS 1000
/* Pipes due to be closed by now (at most max, removed from the queue).
 *
 * Why cohortd closes a departing client's connection: with nng 1.5.2, a
 * req0 socket closed by its owner while its pipe is alive can leave nng's
 * reaper waiting forever on the pipe's receive aio (nng #1543/#1813), and
 * every later close in that process then hangs. A connection closed by
 * the peer takes nng's error path, which is clean; so after a Leave
 * cohortd closes the client's connection itself (50-150 ms later, after
 * the reply has been flushed) and the client waits for that before it
 * closes its socket. */
size_t srv_core_take_pipes_to_close(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max);
void srv_core_pipe_closed(
    struct srv_core *core, uint32_t pipe, cohort__time now);
/* A connection was established (nng's ADD_POST pipe event): from now on
 * it is tracked for the timeouts below until its close event. */
void srv_core_pipe_opened(
    struct srv_core *core, uint32_t pipe, cohort__time now);
/* A complete request arrived over pipe (srv_core_dispatch calls it). */
void srv_core_pipe_request(
    struct srv_core *core, uint32_t pipe, cohort__time now);
/* Connections to close now (at most max, each handed out once):
 *  - no complete request within first_request_ms of being established
 *    (a connection held open silently, or a frame that never completes:
 *    nng reads a frame's declared length, then waits for the rest);
 *  - no complete request for idle_ms, and neither a running member nor
 *    a parked request on it (a partial frame after earlier requests
 *    looks the same from here).
 * A member's connection is judged by its heartbeats (dead-after). */
size_t srv_core_take_idle_pipes(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max);
/* Answers the parked request seq of client id in job with st and why
 * (a client gave up waiting, e.g. TCPStore's CANCEL_WAIT). Returns false
 * if no such request is parked (it was answered already). */
bool srv_core_cancel(struct srv_job *job, uint64_t client_id, uint64_t seq,
    cohort_status st, const char *why, cohort__time now);
bool srv_core_pipe_is_closed(const struct srv_core *core, uint32_t pipe);

struct srv_call *srv_call_new(
    struct srv_core *core, void *tp, cohort__time now);
void srv_call_free(struct srv_call *c);
void srv_reply_init(
    Cohort__Reply *rep, const struct srv_call *c, cohort_status st);
/* Sets the EPEERLOST fields of c's job's failure on rep (its Failure
 * with the age as of c's arrival). */
void srv_reply_failure(Cohort__Reply *rep, struct srv_call *c);
/* Packs, caches, sends rep and frees c (which must be unparked from its
 * owner already; srv_call_answer removes it from heap and client list). */
void srv_call_answer(struct srv_call *c, Cohort__Reply *rep,
    const struct cohort__iov *parts, size_t nparts);
void srv_call_fail(struct srv_call *c, cohort_status st, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));
/* Answers c with the job's EPEERLOST failure. */
void srv_call_peerlost(struct srv_call *c);
/* Frees c without a reply (its tp goes back to the transport). */
void srv_call_drop(struct srv_call *c);
/* Parks c (deadline heap + client list); the owner links it itself and
 * names its hooks (ops, static). */
void srv_call_park(struct srv_call *c, const struct srv_park_ops *ops);
/* Removes a parked c from its owner (ops->withdraw), heap and client. */
void srv_call_withdraw(struct srv_call *c, cohort__time now);
void srv_call_expire(struct srv_call *c, cohort__time now);
/* Answers a parked c (withdrawn here) with ETIMEDOUT, the text why and
 * the nm ranks in miss that never came; frees miss (NULL: none known). */
void srv_call_timed_out(struct srv_call *c, cohort__time now, const char *why,
    int32_t *miss, size_t nm);
/* Answers every due deadline. */
void srv_core_expire_due(struct srv_core *core, cohort__time now);
char *srv_strdup(const char *s);
/* Token comparison in time independent of the contents. */
bool srv_token_eq(const char *a, const char *b);
/* Text of a duration: "30.0 s". */
void srv_fmt_secs(char *buf, size_t len, cohort__time ms);
/* "2, 3" */
void srv_fmt_ranks(char *buf, size_t len, const int32_t *r, size_t n);
/* Appends "WHAT timed out after 30.0 s; ranks 2, 3 never arrived" (the
 * nm ranks of miss) at *off of buf. */
void srv_fmt_never_arrived(char *buf, size_t len, size_t *off,
    const char *what, cohort__time waited, const int32_t *miss, size_t nm);
uint64_t srv_random(struct srv_core *core);
void srv_client_free(struct srv_client *cl, const char *why);
void srv_client_set_pipe(struct srv_client *cl, uint32_t pipe);
/* The job's client id, created if absent (NULL: ENOMEM). */
struct srv_client *srv_client_get(
    struct srv_job *job, uint64_t id, cohort__time now);
/* Puts a reply into the client's cache ring, taking m; rhash: the
 * request's (0: unknown, as for replies restored from the journal). */
void srv_client_cache_put(struct srv_client *cl, uint64_t seq, uint32_t rhash,
    nng_msg *m, bool durable);
/* Whether a request body changes state (its reply is journalled). */
bool srv_body_mutating(int body);

/* ------------------------------------------------------------------------ */
/* job.c                                                                    */
/* ------------------------------------------------------------------------ */

struct srv_job *srv_job_new(
    struct srv_core *core, const char *name, const char *token);
/* Answers every parked call of the job (ECLOSED, why), frees it. */
void srv_job_free(struct srv_job *job, const char *why);
/* Removes the job if every member left (and it is not preset). */
void srv_job_maybe_remove(struct srv_job *job);
/* Removes the job (journalled) if it is abandoned: not preset, no running
 * member, no connected client, nothing parked, quiet for the core's
 * job_expiry_ms. Returns true if it was removed. */
bool srv_job_maybe_expire(struct srv_job *job, cohort__time now);
/* World sizes of all jobs (formed or in rendezvous). */
uint64_t srv_core_members_total(struct srv_core *core);
void srv_job_join(struct srv_call *c, const Cohort__Join *j, cohort__time now);
void srv_job_leave(struct srv_call *c, cohort__time now);
void srv_job_heartbeat(
    struct srv_call *c, const Cohort__Heartbeat *hb, cohort__time now);
void srv_job_watch(struct srv_call *c, cohort__time now);
void srv_job_report(
    struct srv_call *c, const Cohort__ReportFailure *rf, cohort__time now);
/* Fails a running member (why: kind, its words: text): the job fails and
 * parked non-KV calls hear. */
void srv_job_fail_member(struct srv_job *job, struct srv_member *m,
    Cohort__FailureKind kind, const char *text, cohort__time now);
void srv_job_sweep(struct srv_job *job, cohort__time now);
/* Journal replay: a generation formed with these members (client_ids by
 * rank); members' last_seen is now (the grace period after a restart). */
cohort_status srv_job_restore_gen(struct srv_job *job, uint64_t gen,
    uint32_t world, struct srv_member *mem, const uint64_t *client_ids,
    cohort__time now);
/* Journal replay of a failure (text, and the job's detail if first). */
void srv_job_restore_fail(
    struct srv_job *job, int32_t rank, const char *text, const char *detail);
/* What rank m is doing, for stall and timeout texts: "rank 5 is in
 * allreduce #812 since 63.2 s" (long) or "rank 5 in allreduce #812"
 * (short). */
void srv_member_doing(const struct srv_job *job, const struct srv_member *m,
    cohort__time now, bool longform, char *buf, size_t len);
const char *srv_member_state_name(enum srv_member_state st);
const char *srv_job_state_name(const struct srv_job *job);
/* The member a call comes from, checked for collectives: NULL after
 * answering c with the reason. */
struct srv_member *srv_job_collective_member(struct srv_call *c);

/* ------------------------------------------------------------------------ */
/* kv.c                                                                     */
/* ------------------------------------------------------------------------ */

void srv_kv_init(struct srv_kv *kv);
void srv_kv_fini(struct srv_kv *kv);
/* Handles every KV body; returns after answering or parking c. */
void srv_kv_handle(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
uint64_t srv_kv_count(const struct srv_kv *kv);
/* Journal replay: store / append / delete without limit checks. */
cohort_status srv_kv_restore(struct srv_job *job, const char *key,
    const void *val, size_t vlen, bool append);
void srv_kv_restore_del(struct srv_job *job, const char *key);
/* Whether key exists; its value (valid until the next KV change) if so. */
bool srv_kv_peek(
    struct srv_kv *kv, const char *key, const void **val, size_t *vlen);
/* Calls fn for every key (snapshot). */
void srv_kv_foreach(struct srv_kv *kv,
    void (*fn)(void *arg, const char *key, const void *val, size_t vlen),
    void *arg);

/* ------------------------------------------------------------------------ */
/* coll.c                                                                   */
/* ------------------------------------------------------------------------ */

/* A collective or group creation of member m (srv_job_collective_member
 * of c). */
void srv_coll_handle(struct srv_call *c, const struct srv_member *m,
    const Cohort__Collective *co, cohort__time now);
void srv_group_handle(struct srv_call *c, const struct srv_member *m,
    const Cohort__GroupCreate *gc, cohort__time now);
/* Creates the world group of a new generation. */
cohort_status srv_group_world(struct srv_job *job);
/* Answers every parked collective / group creation with st (EPEERLOST
 * with the job's failure, ESTALE, ECLOSED) and frees them. With
 * free_groups, complete groups go too (new generation, job removal). */
void srv_coll_reset(
    struct srv_job *job, cohort_status st, const char *why, bool free_groups);
/* A rank left: fail every pending op that waits for it. */
void srv_coll_rank_left(struct srv_job *job, int32_t rank);
/* "barrier 'x' (#5)" for the op c is parked in, into buf. */
void srv_coll_describe(const struct srv_call *c, char *buf, size_t len);
bool srv_coll_what(const struct srv_call *c, char *buf, size_t len,
    uint64_t *seq, const char **group);
const char *srv_coll_kind_name(int kind);
/* Journal replay: a complete group. */
cohort_status srv_group_restore(
    struct srv_job *job, const char *name, const int32_t *ranks, uint32_t n);
/* Stall detection (core sweep, at most once a second). */
void srv_coll_stall_check(struct srv_job *job, cohort__time now);
/* Text of a stalled parked collective: "barrier 'x' (#17) on group ''
 * waiting 61.0 s: ranks 5, 7 have not entered; rank 5 is in ...". */
void srv_coll_stall_text(
    const struct srv_coll *co, cohort__time now, char *buf, size_t len);
/* Data-plane stalls seen through heartbeats: calls fn once per stalled
 * (group, op_seq) with the lowest in-op member, the group and a text. */
void srv_coll_data_stalls(struct srv_job *job, cohort__time now,
    void (*fn)(void *arg, const struct srv_member *m,
        const struct srv_group *g, const uint8_t *entered, const char *text),
    void *arg);
/* Stalled operations now (for /metrics). */
uint64_t srv_core_stalled(struct srv_core *core, cohort__time now);

/* ------------------------------------------------------------------------ */
/* status.c                                                                 */
/* ------------------------------------------------------------------------ */

void srv_status_handle(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* Prometheus text (for /metrics) into a malloc'd string. */
char *srv_metrics_text(struct srv_core *core, cohort__time now);

/* ------------------------------------------------------------------------ */
/* observe.c: per-rank metrics from the workers                             */
/* ------------------------------------------------------------------------ */

/* Stores the cumulative metrics rank of job reported (heartbeat, Leave). */
void srv_obs_note(struct srv_core *core, const char *job, int32_t rank,
    const Cohort__RankMetrics *m, cohort__time now);
/* --metrics-max-ranks: (job, rank) pairs kept; 0: none. */
void srv_obs_set_max(struct srv_core *core, size_t max);
/* head (headlen bytes) followed by cohort_build_info and the per-rank
 * series, in a new malloc'd string; NULL when out of memory. */
char *srv_obs_metrics(
    struct srv_core *core, char *head, size_t headlen, cohort__time now);
void srv_obs_free(struct srv_core *core);
/* Remembers a member failure for the status page (the last 32). */
void srv_obs_failure(struct srv_core *core, const char *job, int32_t rank,
    const char *text, cohort__time now);
/* The status page's JSON (/status.json, docs/observability.md) for job
 * ("" = all), given the bearer token: *code gets the HTTP status (200,
 * 401 like a refused StatusQuery, 500). malloc'd or NULL. */
char *srv_status_json(struct srv_core *core, const char *job,
    const char *token, cohort__time now, int *code);
void srv_obs_failures_json(struct srv_core *core, const char *job,
    void (*put)(void *arg, const char *fmt, ...), void *arg,
    void (*str)(void *arg, const char *s), cohort__time now);
/* The status page (statuspage.c). */
extern const char srv_status_page[];
/* Totals over all operation kinds of (job, rank); false if none. */
bool srv_obs_totals(struct srv_core *core, const char *job, int32_t rank,
    uint64_t *count, uint64_t *bytes, uint64_t *time_ns, uint64_t *wait_ns);

/* ------------------------------------------------------------------------ */
/* journal.c                                                                */
/* ------------------------------------------------------------------------ */

enum srv_fsync {
	SRV_FSYNC_BATCH = 0, /* fdatasync at most every 100 ms (sweep) */
	SRV_FSYNC_ALWAYS, /* fdatasync before the replies leave */
	SRV_FSYNC_NONE, /* left to the kernel */
};

struct srv_jrn_opts {
	const char *dir;
	enum srv_fsync fsync;
	uint64_t compact_min; /* 0 = 64 MiB */
	/* Damage in the snapshot or log: keep every whole record, move
	 * the damaged file aside (cohortd --recover) instead of refusing
	 * to start. */
	bool recover;
};

struct srv_jrn_stats {
	uint64_t records;
	uint64_t bytes; /* appended to the log since start */
	uint64_t log_bytes; /* current log size */
	uint64_t snap_bytes; /* current snapshot size */
	uint64_t fsyncs;
	uint64_t compactions;
	uint64_t errors;
	uint64_t replayed; /* records applied at start */
	uint64_t replay_ms;
};

/* Opens (creates) the state directory, replays snapshot + log into the
 * core and keeps the log open for appending. Call right after
 * srv_core_new, before any request. */
cohort_status srv_core_journal_open(
    struct srv_core *core, const struct srv_jrn_opts *o, cohort__time now);
/* Writes the buffered records (dispatch, sweep and pipe_closed call it
 * through srv_core_event_end, before their replies leave). Returns false
 * if records could not be written (the journal is then not writable until
 * a snapshot succeeds). */
bool srv_jrn_flush(struct srv_core *core, cohort__time now);
/* Whether a state change can be journalled now; while it cannot, a
 * snapshot is retried at most every second (the disk may have room
 * again). True without a journal. */
bool srv_jrn_writable(struct srv_core *core, cohort__time now);
/* Why the journal cannot be written ("cannot write to DIR: No space left
 * on device"), or NULL if it can (or there is none). */
const char *srv_jrn_problem(const struct srv_core *core);
/* The transport's batched fdatasync failed: replies already left, so the
 * journal is marked not writable until a snapshot succeeds. */
void srv_jrn_sync_failed(struct srv_core *core, int err);
/* Sweep: batched fdatasync, recovery after a write error. */
void srv_jrn_tick(struct srv_core *core, cohort__time now);
/* Writes a snapshot now and starts a new log. */
cohort_status srv_jrn_compact(struct srv_core *core);
void srv_jrn_close(struct srv_core *core);
/* For the transport: a descriptor to fdatasync and close outside the
 * mutex, or -1 if nothing is due (SRV_FSYNC_BATCH). */
int srv_jrn_sync_fd(struct srv_core *core);
uint32_t srv_crc32c(const void *p, size_t n);
void srv_jrn_stats(const struct srv_core *core, struct srv_jrn_stats *st);

/* Records (no-ops without a journal or during replay). */
void srv_jrn_gen(struct srv_job *job);
void srv_jrn_fail(
    struct srv_job *job, const struct srv_member *m, const char *detail);
void srv_jrn_leave(struct srv_job *job, const struct srv_member *m);
void srv_jrn_group(struct srv_job *job, const struct srv_group *g);
void srv_jrn_kv_put(
    struct srv_job *job, const char *key, const void *val, size_t len);
void srv_jrn_kv_append(
    struct srv_job *job, const char *key, const void *val, size_t len);
void srv_jrn_kv_del(struct srv_job *job, const char *key);
void srv_jrn_reply(struct srv_client *cl, uint64_t seq, nng_msg *m);
void srv_jrn_client_del(struct srv_client *cl);
void srv_jrn_job_del(struct srv_job *job);

/* ------------------------------------------------------------------------ */
/* torchstore.c: the TCPStore listener (--torch-store)                     */
/* ------------------------------------------------------------------------ */

struct cohort__srv;
struct srv_tstore;

/* Runs fn(arg, core, now) under the server mutex and sends the replies it
 * produced for nng clients afterwards (srv.c). */
void srv_with_core(struct cohort__srv *s,
    void (*fn)(void *arg, struct srv_core *core, cohort__time now), void *arg);
/* Starts a listener for spec "[JOB@]ADDR:PORT" (port 0: a free one);
 * token: the job's token ("" if none). partial_ms: how long a request may
 * stay incomplete before its connection is closed (0 = 30 s). */
cohort_status srv_tstore_start(struct cohort__srv *s, struct srv_core *core,
    const char *spec, const char *token, uint32_t partial_ms,
    struct srv_tstore **out);
/* "ADDR:PORT" as bound. */
const char *srv_tstore_addr(const struct srv_tstore *ts);
const char *srv_tstore_job(const struct srv_tstore *ts);
/* Stops the thread, closes every connection (their parked requests are
 * withdrawn), frees. Call before the core goes. */
void srv_tstore_stop(struct srv_tstore *ts);
/* The sink's half for SRV_TP_TORCH handles (called under the mutex). */
void srv_tstore_deliver(void *tp, nng_msg *reply);

#endif /* COHORT_SRV_IMPL_H */
