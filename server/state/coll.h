/*
 * coll.h - control-plane collectives of a job (job->colls): barriers,
 * object broadcasts, scalar reductions, boolean decisions and the service
 * backend's operations, gathered per (group, op_seq).
 */
#ifndef COHORT_SRV_COLL_H
#define COHORT_SRV_COLL_H

#include "job.h"

struct srv_group;

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
	/* by group rank: arrived, then withdrew (its own deadline passed);
	 * a later timeout names it apart from the ranks that never came.
	 * NULL until the first withdrawal. */
	uint8_t *left;
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

/* A Collective of a running member (the dispatch table's handler). */
void srv_coll_handle(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* The arrivals of a collective completed by its owner. */
struct srv_coll_done {
	struct srv_call **calls; /* by group rank, malloc'd: the owner's */
	uint32_t n;
};
/* A step boundary's arrival (COLL_BOUNDARY, elastic.c), gathered like a
 * collective on the world group (mismatch, timeouts, stalls): true when
 * it was the last, with every arrival (still parked, in no collective)
 * in done for the caller to answer; false when c was parked or
 * answered. */
bool srv_coll_boundary(struct srv_call *c, const Cohort__Request *req,
    cohort__time now, struct srv_coll_done *done);
/* Answers every parked collective / group creation with st (EPEERLOST
 * with the job's failure, EMEMBERSHIP with its last change, ESTALE,
 * ECLOSED) and frees them. With
 * free_groups, complete groups go too (new generation, job removal). */
void srv_coll_reset(
    struct srv_job *job, cohort_status st, const char *why, bool free_groups);
/* A rank left: fail every pending op that waits for it. */
void srv_coll_rank_left(struct srv_job *job, int32_t rank);
/* "barrier 'x'", "broadcast 'o' (root 2)", "allreduce (count 8, f32,
 * sum)": what a collective asked for. */
void srv_coll_desc_text(const struct srv_cdesc *cd, char *buf, size_t len);
const char *srv_coll_kind_name(int kind);

#endif /* COHORT_SRV_COLL_H */
