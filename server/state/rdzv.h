/*
 * rdzv.h - rendezvous: joins gather until the world is there, then a new
 * generation of the job forms (rdzv.c).
 */
#ifndef COHORT_SRV_RDZV_H
#define COHORT_SRV_RDZV_H

#include "job.h"

/* A Join (the dispatch table's handler): answered, or parked until the
 * rendezvous completes or times out. */
void srv_rdzv_join(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* Enters a join whose fields are in c (srv_call rank, world, min_world,
 * host, pid, ...) into the job's rendezvous, or the joiners of a running
 * elastic job: parked, answered, or it completes the rendezvous. The
 * joins of an elastic job that stopped come back through it. */
void srv_rdzv_enter(struct srv_call *c, cohort__time now);
/* An elastic job's rendezvous completes with at least its minimum once
 * no join came for --rdzv-last-call (the sweep calls it). */
void srv_rdzv_sweep(struct srv_job *job, cohort__time now);
/* Journal replay: a generation formed with these members (by rank);
 * members' last_seen is now, and they have --restore-grace to come back.
 */
cohort_status srv_rdzv_restore_gen(struct srv_job *job, uint64_t gen,
    uint32_t world, const struct srv_jrn_member *recs, cohort__time now);

#endif /* COHORT_SRV_RDZV_H */
