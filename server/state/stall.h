/*
 * stall.h - live hang attribution (stall.c): which collective waits past
 * --stall-threshold, for which ranks, and what those ranks do instead.
 */
#ifndef COHORT_SRV_STALL_H
#define COHORT_SRV_STALL_H

#include "job.h"

struct srv_coll;
struct srv_group;

/* Whether the parked collective co is stalled now. */
bool srv_stall_coll(const struct srv_coll *co, cohort__time now);
/* Text of a stalled parked collective: "barrier 'x' (#17) on group ''
 * waiting 61.0 s: ranks 5, 7 have not entered; rank 5 is in ...". */
void srv_stall_text(
    const struct srv_coll *co, cohort__time now, char *buf, size_t len);
/* Data-plane stalls seen through heartbeats: calls fn once per stalled
 * (group, op_seq) with the lowest in-op member, the group, which group
 * ranks entered it, and a text. */
void srv_stall_data(struct srv_job *job, cohort__time now,
    void (*fn)(void *arg, const struct srv_member *m,
        const struct srv_group *g, const uint8_t *entered, const char *text),
    void *arg);
/* Logs every new stall of the job (the sweep, at most four times a
 * second). */
void srv_stall_check(struct srv_job *job, cohort__time now);
/* Stalled operations of all jobs now (for /metrics). */
uint64_t srv_stall_count(struct srv_core *core, cohort__time now);

#endif /* COHORT_SRV_STALL_H */
