/*
 * member.h - members of a running generation: their calls, liveness and
 * failures (member.c).
 */
#ifndef COHORT_SRV_MEMBER_H
#define COHORT_SRV_MEMBER_H

#include "job.h"

/* The dispatch table's handlers. A Leave withdraws the client's pending
 * join, marks its member left (failing only the operations waiting for
 * it) and has its connection closed shortly after the reply. */
void srv_member_leave(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_member_heartbeat(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_member_watch(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_member_report(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* The running member a collective or group creation comes from: NULL
 * after answering c with the reason (not a member, the job failed, the
 * rank left). */
struct srv_member *srv_member_running(struct srv_call *c);
/* Fails a running member (why: kind, its words: text): the job fails and
 * parked non-KV calls hear. */
void srv_job_fail_member(struct srv_job *job, struct srv_member *m,
    Cohort__FailureKind kind, const char *text, cohort__time now);
/* Fails the running members silent for longer than their dead-after
 * (after a restart: their grace). */
void srv_member_sweep(struct srv_job *job, cohort__time now);
/* cohortd itself stalled for lag ms: the running members' silence gets
 * the time back (capped at now); returns how many there are. */
size_t srv_member_credit_lag(
    struct srv_job *job, cohort__time lag, cohort__time now);
/* Journal replay of a failure (text, and the job's detail if first) and
 * of a departure (EPROTO: no such rank). */
void srv_member_restore_fail(
    struct srv_job *job, int32_t rank, const char *text, const char *detail);
cohort_status srv_member_restore_leave(struct srv_job *job, int32_t rank);

#endif /* COHORT_SRV_MEMBER_H */
