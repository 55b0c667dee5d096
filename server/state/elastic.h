/*
 * elastic.h - elastic membership (proto/README.md section 8,
 * docs/elastic.md): a job started with a range of members lives through
 * the loss of some and admits new ones at step boundaries, in the
 * running processes (elastic.c).
 *
 * A generation of an elastic job is a member table with dense ranks. It
 * changes in one step, a *reshape*, journalled (JRN_RESHAPE) before
 * anything is answered:
 *
 *  - shrink (member.c, on every kind of failure, when at least min_world
 *    members and one holding the state remain): the survivors, in their
 *    old order; the lost member is remembered (its removal record) for
 *    its own process, should it come back;
 *  - grow (at a step boundary, when joins wait and the job is below its
 *    maximum): the old members keep their ranks, the joiners take the
 *    next ones in the order of the ranks they asked for, then of arrival.
 *
 * Either way the generation increases by one, every parked collective,
 * group creation and watch of the old one is answered COHORT_EMEMBERSHIP
 * with the change's record, subgroups are carried over (groups.h), and
 * the step from the old ranks to the new is kept, so that a Reform from
 * any of the last SRV_EL_HISTORY generations is answered with the ranks
 * its client's generation had (prev_ranks).
 *
 * Cost, n members: a reshape is O(n + sum of subgroup sizes + groups x
 * n + parked calls) at cohortd, one journal record of O(n); a step
 * boundary O(1) per arrival and O(n) at its completion (one reply per
 * member, each O(1) but for the receivers of a state transfer); a Reform
 * O(n) (its reply lists every member's host) and the prev_ranks map
 * O(n x generations behind) once per (generation, generation behind);
 * a heartbeat O(1). Nothing per step is worse than O(n) at cohortd and
 * O(1) messages per member.
 */
#ifndef COHORT_SRV_ELASTIC_H
#define COHORT_SRV_ELASTIC_H

#include "job.h"

/* Changes a Reform can come from: a member more generations behind is
 * told it cannot follow (EPEERLOST) and rejoins. */
#define SRV_EL_HISTORY 16
/* Members removed by a change that are remembered, for their own
 * processes (a Reform or a call gets EPEERLOST with their record). */
#define SRV_EL_REMOVED 64

/* One change: the rank each of gen's n members had in prev_gen (-1:
 * admitted by it). prev_gen 0: gen was formed by a rendezvous. */
struct srv_el_step {
	uint64_t gen;
	uint64_t prev_gen;
	uint32_t n;
	int32_t *prev;
};

/* A member a change removed. */
struct srv_el_removed {
	uint64_t client_id;
	uint64_t gen; /* the generation made by its removal */
	int32_t rank; /* in the generation before */
	char host[SRV_MAX_NAME + 1];
	uint32_t pid;
	char *text;
	char *detail;
	Cohort__Failure failure; /* strings owned */
	cohort__time at; /* 0: restored */
};

/* What elastic.c keeps per job (job->el, made on first use). */
struct srv_elastic {
	struct srv_el_step hist[SRV_EL_HISTORY]; /* a ring, oldest first */
	unsigned nhist, hhead;
	struct srv_el_removed rem[SRV_EL_REMOVED]; /* a ring */
	unsigned nrem, rhead;
	/* The last prev_ranks map computed (a Reform of every member from
	 * the same generation computes it once): from memo_from to
	 * memo_gen, memo_n entries. */
	uint64_t memo_from, memo_gen;
	uint32_t memo_n;
	int32_t *memo;
};

/* A rendezvous formed the job's generation (rdzv.c): elastic when min is
 * above 0 (its range min..max; every member holds the state; journalled
 * as JRN_RESHAPE), else not (the caller journals JRN_GEN). */
void srv_elastic_formed(struct srv_job *job, uint32_t min, uint32_t max);
/* A Join of a running elastic job (rdzv.c): parked until a step boundary
 * admits it, or answered (a range that disagrees, a client that is a
 * member). The call carries the join's fields (srv_call rank, world,
 * min_world, host, ...). */
void srv_elastic_join(struct srv_call *c, cohort__time now);
/* Hands the parked joins over (the job stopped: rdzv.c starts its next
 * rendezvous with them): each unparked from here, in arrival order; n
 * of them (malloc'd array; NULL when none or out of memory, then they
 * stay). */
struct srv_call **srv_elastic_take_joiners(struct srv_job *job, size_t *n);

/* How a member's loss is told (member.c has it from srv_job_fail_member).
 */
struct srv_el_loss {
	Cohort__FailureKind kind;
	const char *what; /* its operation without number, "" */
	uint64_t seq;
	const char *group;
	Cohort__FailureOpState state;
	uint64_t op_age;
	const char *text; /* its words */
	const char *detail; /* "rank 3 (h:p) failed during ...: text" */
};
/* Whether an elastic running job whose member was just marked failed can
 * go on: at least min_world members and one holding the state remain.
 * False with why in buf ("2 ranks remain, below the minimum of 3"). */
bool srv_elastic_survivable(const struct srv_job *job, char *buf, size_t len);
/* Member m (failed already; its FAIL record journalled) is lost and the
 * job goes on without it (srv_elastic_survivable said so): the reshape,
 * journalled; parked calls of the old generation answered EMEMBERSHIP;
 * m remembered as removed. False (nothing changed) when out of memory. */
bool srv_elastic_shrink(struct srv_job *job, struct srv_member *m,
    const struct srv_el_loss *loss, cohort__time now);

/* The handlers of the dispatch table: a step boundary (a Collective of
 * kind COLL_BOUNDARY of a running member) and a Reform. */
void srv_elastic_boundary(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_elastic_reform(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* A request of an older generation to an elastic job (dispatch step 7)
 * that is not served whatever its generation: EMEMBERSHIP for a member of
 * the current one, EPEERLOST with its removal record for a process a
 * change removed, else ESTALE. */
void srv_elastic_stale(struct srv_call *c);
/* c comes from a client that is no member: true after answering it
 * EPEERLOST when a change removed it (its record, or the generation and
 * rank its request says it had); false (c untouched) otherwise. */
bool srv_elastic_removed(struct srv_call *c);
/* Answers c, from a client that is no member of its job: EPEERLOST as
 * srv_elastic_removed when a change removed it, else ESTATE (join first). */
void srv_elastic_no_member(struct srv_call *c);

/* Forgets everything elastic of the job (a generation that is not
 * elastic, the job freed): history, removals, the change, the range. */
void srv_elastic_clear(struct srv_job *job);

/* Journal replay (journal/replay.c; the snapshot writes the same):
 * a JRN_RESHAPE (a generation carried over from the job's current one
 * when rs->prev_gen is it, else formed afresh), a JRN_HOLD, a JRN_GENMAP,
 * a JRN_REMOVED. EPROTO for one that does not fit the job. */
cohort_status srv_elastic_restore(
    struct srv_job *job, const struct srv_jrn_egen *rs, cohort__time now);
cohort_status srv_elastic_restore_hold(
    struct srv_job *job, uint64_t gen, uint32_t world, const bool *has);
cohort_status srv_elastic_restore_step(struct srv_job *job, uint64_t gen,
    uint64_t prev_gen, uint32_t n, const int32_t *prev);
cohort_status srv_elastic_restore_removed(struct srv_job *job,
    uint64_t client_id, uint64_t gen, int32_t rank, const char *host,
    uint32_t pid, const char *text, const char *detail);

/* For the snapshot: the i-th step of the history (0: oldest), the i-th
 * removal record (0: oldest); NULL past the end. */
const struct srv_el_step *srv_elastic_step(
    const struct srv_job *job, unsigned i);
const struct srv_el_removed *srv_elastic_removal(
    const struct srv_job *job, unsigned i);

#endif /* COHORT_SRV_ELASTIC_H */
