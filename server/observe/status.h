/*
 * status.h - what cohortd says about its jobs (status.c): the StatusQuery
 * of `cohort status`, and the status page's JSON.
 */
#ifndef COHORT_SRV_STATUS_H
#define COHORT_SRV_STATUS_H

#include "core/call.h"

/* A StatusQuery (the dispatch table's handler, with its own
 * authentication: one job with its token or the admin secret; all jobs
 * with the admin secret, or anyone with --open-status and no secret). */
void srv_status_handle(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
/* The status page's JSON (/status.json, docs/observability.md) for job
 * ("" = all), given the bearer token: *code gets the HTTP status (200,
 * 401 like a refused StatusQuery, 500). malloc'd or NULL. */
char *srv_status_json(struct srv_core *core, const char *job,
    const char *token, cohort__time now, int *code);

#endif /* COHORT_SRV_STATUS_H */
