/*
 * sp.h - the cohort protocol on tcp:// listeners (sp.c): nng's SP wire,
 * served by cohortd's own connection layer (net.h) with its bounds.
 * ipc:// and tls+tcp:// stay with nng (nng_rep.c).
 */
#ifndef COHORT_SRV_SP_H
#define COHORT_SRV_SP_H

#include <stdbool.h>

#include "cohort_common.h"

struct srv_net;
struct srv_nng;
struct srv_sp;

/* Whether url is one sp.c serves (tcp://). */
bool srv_sp_url(const char *url);
/* Listens on url (tcp://ADDR:PORT) on net for the coordinator of nng.
 * COHORT_EINVAL / COHORT_ESYSTEM naming the address. */
cohort_status srv_sp_listen(struct srv_net *net, struct srv_nng *nng,
    const char *url, struct srv_sp **out);
/* "tcp://ADDR:PORT" as bound. */
const char *srv_sp_addr(const struct srv_sp *sp);
/* Frees the listener's state (after srv_net_stop). */
void srv_sp_free(struct srv_sp *sp);

#endif /* COHORT_SRV_SP_H */
