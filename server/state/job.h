/*
 * job.h - the state of cohortd: a job and its members (the model every
 * state module shares), and what is said about them (names of states,
 * what a rank is doing, a failure on a reply, the recent failures).
 *
 * A job is a namespace with its own token: a generation of members
 * formed by a rendezvous (rdzv.c), their liveness and failures
 * (member.c), groups (groups.c) and control-plane collectives (coll.c)
 * keyed by (group, op_seq), a key-value store (kv.c); created, removed
 * and expired by lifecycle.c. The modules above (observe/, front/,
 * journal/snapshot.c) read these structures; journal/replay.c rebuilds
 * them through the modules' restore functions.
 */
#ifndef COHORT_SRV_JOB_H
#define COHORT_SRV_JOB_H

#include "core/call.h"
#include "core/clients.h"
#include "core/core.h"
#include "journal/record.h"

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
	/* Operations it had done at its last rhythm sample, and when
	 * (stall.c; 0: none yet). */
	uint64_t rh_ops;
	cohort__time rh_at;
	char *failure;
	struct srv_client *client;
	/* Elastic (elastic.c): it holds the job's state (false: admitted
	 * into the running job, no transfer reached it yet), and its rank
	 * in the generation before (-1: admitted by the change that made
	 * this one, or formed by a rendezvous). */
	bool has_state;
	int32_t prev_rank;
};

/* Elastic: the last change of the job's membership (elastic.c), told to
 * every request of an older generation (COHORT_EMEMBERSHIP). */
struct srv_change {
	uint64_t generation; /* the generation it made; 0: none yet */
	/* The member lost (its rank in the generation before), or -1 when
	 * members were admitted. */
	int32_t rank;
	char *text; /* its failure's text (Reply.failed_text) */
	char *detail; /* what happened (Reply.error) */
	Cohort__Failure failure; /* rank >= 0: the loss as data (owned) */
	cohort__time at; /* 0: restored, unknown */
};

/* The job's rhythm (stall.c): the time per operation of its members
 * over their recent heartbeat intervals (the last SRV_RHYTHM samples of
 * all members), and the median of those. */
#define SRV_RHYTHM 32
struct srv_rhythm {
	uint32_t us[SRV_RHYTHM];
	uint32_t n, next;
	uint32_t median_us;
};

enum srv_job_state {
	SRV_JOB_NEW, /* no generation yet */
	SRV_JOB_RUNNING, /* generation complete */
	SRV_JOB_FAILED, /* a member failed in this generation */
};

struct srv_kv;
struct srv_elastic;

struct srv_job {
	struct srv_hnode hn; /* in core->jobs by name */
	struct srv_core *core;
	char *name;
	char *token;
	/* The job as its journal records name it (name, token, job_id:
	 * the same strings and number as above). */
	struct srv_jrn_job jr;
	bool preset; /* --job: kept when empty */
	/* Restored without a generation (its rendezvous was pending): kept
	 * until a join comes back, although it has no members. */
	bool restored;
	/* Rebuilt by --recover from records after its lost JOB record: its
	 * token is unknown (a random "lost:..." one stands in) until one of
	 * its known clients, or a minted token, claims it (lifecycle.h). */
	bool token_lost;
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
	/* Elastic membership (elastic.h; min_world 0: not elastic): the
	 * range, the pending rendezvous' lower end and its last arrival
	 * (--rdzv-last-call), the joins waiting for a step boundary (in
	 * arrival order), the last change, and what elastic.c keeps (the
	 * generations a Reform maps from, removed members). */
	uint32_t min_world;
	uint32_t max_world;
	uint32_t rdzv_min;
	cohort__time rdzv_last;
	struct srv_link joiners;
	uint32_t njoiners;
	struct srv_change change;
	struct srv_elastic *el;
	struct srv_clients clients;
	struct srv_map groups; /* srv_group by name (groups.h) */
	struct srv_map colls; /* srv_coll by (op_seq, group) (coll.h) */
	struct srv_rhythm rhythm; /* stall.c */
	struct srv_kv *kv;
};

/* The job called name, or NULL. */
struct srv_job *srv_job_find(const struct srv_core *core, const char *name);
const char *srv_member_state_name(enum srv_member_state st);
/* "rendezvous", "running", "failed", "finished". */
const char *srv_job_state_name(const struct srv_job *job);
/* Whether a member of the job is running. */
bool srv_job_has_live(const struct srv_job *job);
/* World sizes of all jobs (formed or in rendezvous). */
uint64_t srv_core_members_total(struct srv_core *core);
/* Frees the member table (unbinding its clients). */
void srv_job_clear_members(struct srv_job *job);
/* Forgets the job's failure. */
void srv_job_clear_failure(struct srv_job *job);
/* Fills m as rank, running since now, from the join call c: its host,
 * pid, local rank, heartbeat and dead-after (0: the defaults) and its
 * client; no previous rank; has_state: it holds the job's state. */
void srv_member_admit(struct srv_member *m, int32_t rank,
    const struct srv_call *c, bool has_state, cohort__time now);
/* The member table as the journal records it (malloc'd; NULL: ENOMEM). */
struct srv_jrn_member *srv_job_member_recs(const struct srv_job *job);
/* The same for tab's n members (an elastic generation being formed). */
struct srv_jrn_member *srv_member_recs(
    const struct srv_member *tab, uint32_t n);

/* The collective or group creation m's client is parked in, or NULL. */
const struct srv_call *srv_member_parked_op(const struct srv_member *m);
/* What rank m is doing, for stall and timeout texts: "rank 5 is in
 * allreduce #812 since 63.2 s" (long) or "rank 5 in allreduce #812"
 * (short). */
void srv_member_doing(const struct srv_member *m, cohort__time now,
    bool longform, char *buf, size_t len);

/* Whether the job lives through the loss of members (elastic.h). */
static inline bool
srv_job_elastic(const struct srv_job *job)
{
	return (job->min_world > 0);
}

/* A failure record f (strings copied; f's strings must be free): rank m
 * failed (kind) in (state) operation #seq of group, known op_age ms
 * before, in its words text. now 0: restored, the time unknown. */
void srv_failure_fill(Cohort__Failure *f, const struct srv_member *m,
    Cohort__FailureKind kind, const char *operation, uint64_t seq,
    const char *group, Cohort__FailureOpState state, uint64_t op_age,
    const char *text, cohort__time now);
/* Frees f's strings and empties it (srv_job_failure_init). */
void srv_failure_free(Cohort__Failure *f);
/* Forgets the job's last membership change. */
void srv_job_clear_change(struct srv_job *job);
/* Answers c COHORT_EMEMBERSHIP with the job's last change (its failure
 * record, the lost rank) and its current generation. */
void srv_call_membership(struct srv_call *c);
/* The JoinReply of the job's current generation for its rank `rank`:
 * range, hosts and local ranks (malloc'd: srv_join_reply_free). False
 * when out of memory. */
bool srv_join_reply_fill(
    Cohort__JoinReply *jr, const struct srv_job *job, int32_t rank);
void srv_join_reply_free(Cohort__JoinReply *jr);

/* Sets the EPEERLOST fields of c's job's failure on rep (its Failure with
 * the age as of c's arrival). */
void srv_reply_failure(Cohort__Reply *rep, struct srv_call *c);
/* An empty failure record whose strings are the job's to free. */
void srv_job_failure_init(Cohort__Failure *f);
/* The job's failure record (failed_* already set): rank m failed (kind),
 * in (state) operation #seq of group, known op_age ms before; strings
 * copied. now 0: restored, the time unknown. */
void srv_job_set_failure(struct srv_job *job, const struct srv_member *m,
    Cohort__FailureKind kind, const char *operation, uint64_t seq,
    const char *group, Cohort__FailureOpState state, uint64_t op_age,
    cohort__time now);
/* Answers c with its job's EPEERLOST failure. */
void srv_call_peerlost(struct srv_call *c);

/* Remembers a member failure for the status page (the last
 * SRV_FAILURES of every job, core.h). */
void srv_failures_note(struct srv_core *core, const char *job, int32_t rank,
    const char *text, cohort__time now);
/* The i-th most recent failure (0: newest), or NULL past the end. */
const struct srv_failure *srv_failures_get(
    const struct srv_core *core, unsigned i);

#endif /* COHORT_SRV_JOB_H */
