/*
 * http.h - cohortd's HTTP front end (http.c): /metrics, /healthz,
 * /readyz, the status page / and /status.json, served by nng's HTTP
 * server on its own threads, each answer computed under the server
 * mutex.
 */
#ifndef COHORT_SRV_HTTP_H
#define COHORT_SRV_HTTP_H

#include "core/core.h"

struct srv_nng;
struct srv_http;

/* Serves "ADDR:PORT" (port 0: a free one); *url gets "http://ADDR:PORT"
 * as bound (malloc'd). COHORT_EINVAL or ETRANSPORT (detail set). */
cohort_status srv_http_start(
    struct srv_nng *n, const char *addr, struct srv_http **out, char **url);
/* Stops serving (waits for handlers in progress) and frees. */
void srv_http_stop(struct srv_http *sh);

#endif /* COHORT_SRV_HTTP_H */
