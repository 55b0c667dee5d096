/*
 * torchstore.h - the TCPStore front end (`cohortd --torch-store`,
 * torchstore.c): torch's own TCPStore clients use a job's KV.
 */
#ifndef COHORT_SRV_TORCHSTORE_H
#define COHORT_SRV_TORCHSTORE_H

#include "core/core.h"

struct srv_nng;
struct srv_tstore;

/* Starts a listener for spec "[JOB@]ADDR:PORT" (port 0: a free one),
 * calling into the coordinator under n's mutex; token: the job's token
 * ("" if none). partial_ms: how long a request may stay incomplete
 * before its connection is closed (0 = 30 s). */
cohort_status srv_tstore_start(struct srv_nng *n, const char *spec,
    const char *token, uint32_t partial_ms, struct srv_tstore **out);
/* "ADDR:PORT" as bound. */
const char *srv_tstore_addr(const struct srv_tstore *ts);
const char *srv_tstore_job(const struct srv_tstore *ts);
/* Stops the thread, closes every connection (their parked requests are
 * withdrawn), frees. Call before the coordinator stops. */
void srv_tstore_stop(struct srv_tstore *ts);

#endif /* COHORT_SRV_TORCHSTORE_H */
