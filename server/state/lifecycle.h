/*
 * lifecycle.h - jobs created, removed, expired and freed (lifecycle.c).
 */
#ifndef COHORT_SRV_LIFECYCLE_H
#define COHORT_SRV_LIFECYCLE_H

#include "job.h"

/* A new empty job (NULL: out of memory). */
struct srv_job *srv_job_new(
    struct srv_core *core, const char *name, const char *token);
/* Answers every parked call of the job (ECLOSED, why), frees it. */
void srv_job_free(struct srv_job *job, const char *why);
/* Removes the job (journalled) if every member left and it is not
 * preset, nor in a rendezvous, nor restored waiting for its members. */
void srv_job_maybe_remove(struct srv_job *job);
/* Removes the job (journalled) if it is abandoned: not preset, no running
 * member, no connected client, nothing parked, quiet for the core's
 * job_expiry_ms. Returns true if it was removed. */
bool srv_job_maybe_expire(struct srv_job *job, cohort__time now);
/* Creates a job in advance ("--job NAME:TOKEN", a TCPStore listener's),
 * kept while empty; a job restored from the journal takes the token.
 * COHORT_EEXIST (given twice), EINVAL (name or token too long), ENOMEM. */
cohort_status srv_job_add_preset(
    struct srv_core *core, const char *name, const char *token);
/* Frees every job (the stop), answering their parked calls ECLOSED. */
void srv_jobs_free_all(struct srv_core *core, const char *why);

/* Journal replay: the job's JOB record (created, or its token and id
 * set); NULL when out of memory. */
struct srv_job *srv_job_restore(
    struct srv_core *core, const char *name, const char *token, uint64_t id);
/* After the replay: every job is journalled, and one without a
 * generation is kept until its members come back. */
void srv_jobs_restored(struct srv_core *core);

#endif /* COHORT_SRV_LIFECYCLE_H */
