/*
 * http.h - cohortd's HTTP front end (http.c): /metrics, /healthz,
 * /readyz, the status page / and /status.json, served on cohortd's own
 * connection layer (net.h), each answer computed under the server mutex.
 */
#ifndef COHORT_SRV_HTTP_H
#define COHORT_SRV_HTTP_H

#include "core/core.h"

struct srv_net;
struct srv_nng;
struct srv_http;

/* Serves "ADDR:PORT" (port 0: a free one) on net; *url gets
 * "http://ADDR:PORT" as bound (malloc'd). COHORT_EINVAL or
 * COHORT_ESYSTEM (detail set). */
cohort_status srv_http_start(struct srv_net *net, struct srv_nng *n,
    const char *addr, struct srv_http **out, char **url);
/* Frees the listener's state (after srv_net_stop). */
void srv_http_free(struct srv_http *sh);

#endif /* COHORT_SRV_HTTP_H */
