/*
 * groups.h - process groups of a job (job->groups): the world group ""
 * of every generation, and the groups its members create.
 */
#ifndef COHORT_SRV_GROUPS_H
#define COHORT_SRV_GROUPS_H

#include "job.h"

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

/* How the calls parked in an operation that cannot complete are
 * answered: rank `left` left the job, so `what` cannot complete; or
 * (left < 0) with st and why (EPEERLOST: the job's failure;
 * EMEMBERSHIP: the job's last change). */
struct srv_end {
	cohort_status st;
	const char *why;
	int32_t left;
	const char *what;
};

/* The group called name (complete or being created), or NULL. */
struct srv_group *srv_group_find(struct srv_job *job, const char *name);
void srv_group_free(struct srv_job *job, struct srv_group *g);
/* Creates the world group of a new generation. */
cohort_status srv_group_world(struct srv_job *job);
/* A GroupCreate of a running member (the dispatch table's handler). */
void srv_group_create(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* Answers c EPEERLOST because rank left the job and `what` waits for
 * it. */
void srv_group_answer_left(struct srv_call *c, int32_t rank, const char *what);
/* Answers every call of calls[0..n) as e says, leaving the array empty. */
void srv_end_calls(
    struct srv_call **calls, uint32_t n, const struct srv_end *e);
/* Ends a group: a pending creation's parked calls answered as e says. */
void srv_group_end(
    struct srv_job *job, struct srv_group *g, const struct srv_end *e);
/* Elastic: carries the job's groups over to its next generation of
 * new_world ranks (proto/README.md 8.2.3). The world group becomes
 * 0..new_world-1; every other complete group keeps the members old2new
 * maps (by rank in the generation before, old_world entries; -1: gone)
 * in their old order, and is dropped when none is left or when it is a
 * state transfer's (SRV_GROUP_STATE_PREFIX: one generation's). Pending
 * creations must have been ended before. ENOMEM drops the group it hit
 * (its members' next call on it gets ENOENT). O(sum of the groups' sizes
 * + groups x new_world). */
cohort_status srv_group_carry(struct srv_job *job, const int32_t *old2new,
    uint32_t old_world, uint32_t new_world);
/* Groups a state transfer creates (client: cohort_state_transfer). */
#define SRV_GROUP_STATE_PREFIX "cohort.state."
/* Journal replay: a complete group (EPROTO: ranks not of the job's
 * generation). */
cohort_status srv_group_restore(
    struct srv_job *job, const char *name, const int32_t *ranks, uint32_t n);

#endif /* COHORT_SRV_GROUPS_H */
