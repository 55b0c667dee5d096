/*
 * nng_rep.h - cohortd's nng front end (nng_rep.c): the rep0 socket and
 * its contexts, the 100 ms sweep, and the one server mutex every front
 * end takes to call into the coordinator.
 *
 * Threads: none of its own. Requests are handled directly in nng's aio
 * callbacks under the mutex (a hand-off to another thread would cost a
 * scheduler wake-up per request); replies produced under the mutex are
 * queued in an outbox and sent after it is released.
 */
#ifndef COHORT_SRV_NNG_REP_H
#define COHORT_SRV_NNG_REP_H

#include "server.h"
#include "core/core.h"

struct srv_nng;

/* The front end and its coordinator (srv_nng_core), not listening yet.
 * pool: receiving contexts. COHORT_ENOMEM only. */
cohort_status srv_nng_new(const struct srv_limits *lim,
    const char *admin_token, uint32_t pool, struct srv_nng **out);
/* Its coordinator (configure it before srv_nng_listen). */
struct srv_core *srv_nng_core(struct srv_nng *s);
/* Where the connections of cohortd's own listeners are (net.h): the
 * sweep closes those of them the core asks it to. */
struct srv_net;
void srv_nng_set_net(struct srv_nng *s, struct srv_net *net);
/* Opens the socket and listens on every URL (ipc://, tls+tcp://; tcp://
 * is sp.c's; cfg: TLS settings); the contexts start receiving. On error
 * (detail set) free with srv_nng_free. */
cohort_status srv_nng_listen(struct srv_nng *s,
    const struct cohort__srv_config *cfg, const char *const *urls,
    size_t nurls);
/* Starts the 100 ms sweep. */
void srv_nng_start_sweep(struct srv_nng *s);
/* The i-th listening URL as bound, or NULL past the end. */
const char *srv_nng_url(const struct srv_nng *s, size_t i);
/* Runs fn(arg, core, now) under the server mutex, then sends the replies
 * it produced for nng clients. Nothing once stopping. */
void srv_with_core(struct srv_nng *s,
    void (*fn)(void *arg, struct srv_core *core, cohort__time now), void *arg);
/* A byte-stream front end's connection with this pipe went away:
 * srv_core_pipe_closed under the server mutex (srv_with_core). */
void srv_with_core_pipe_closed(struct srv_nng *s, uint32_t pipe);
/* Milliseconds since the last client connection went away (0 while any
 * is connected): cohort__srv_idle_ms. */
uint64_t srv_nng_idle_ms(struct srv_nng *s);
/* Stops: parked requests answered (or dropped, with a journal), up to a
 * second for the final replies to leave, the socket closed, everything
 * freed (the coordinator too). The other front ends stop first. */
void srv_nng_stop(struct srv_nng *s);
/* Frees s after a failed start (NULL-safe). */
void srv_nng_free(struct srv_nng *s);

#endif /* COHORT_SRV_NNG_REP_H */
