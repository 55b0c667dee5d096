/*
 * torchstore.h - the TCPStore front end (`cohortd --torch-store`,
 * torchstore.c): torch's own TCPStore clients use a job's KV.
 */
#ifndef COHORT_SRV_TORCHSTORE_H
#define COHORT_SRV_TORCHSTORE_H

#include "core/core.h"

struct srv_door;
struct srv_net;
struct srv_nng;
struct srv_tstore;

/* Listens for spec "[JOB@]ADDR:PORT" (port 0: a free one) on net, calling
 * into the coordinator under n's mutex; door: who may come in (door.h);
 * token: the job's token ("" if none). partial_ms: how long a request
 * may stay incomplete before its connection is closed (0 = 30 s). */
cohort_status srv_tstore_start(struct srv_net *net, struct srv_nng *n,
    const struct srv_door *door, const char *spec, const char *token,
    uint32_t partial_ms, struct srv_tstore **out);
/* "ADDR:PORT" as bound. */
const char *srv_tstore_addr(const struct srv_tstore *ts);
const char *srv_tstore_job(const struct srv_tstore *ts);
/* Frees the listener's state (its queues) after srv_net_stop closed its
 * connections. */
void srv_tstore_free(struct srv_tstore *ts);

#endif /* COHORT_SRV_TORCHSTORE_H */
