/*
 * events.h - the coordinator's entry points besides requests (events.c;
 * requests: dispatch.h). Together they are the socket-free coordinator:
 * the front ends (nng_rep.c, torchstore.c) call them under the server
 * mutex with one clock read, and the unit tests drive them with a fake
 * clock and a capturing sink (tests/unit/srv_fixture.h).
 */
#ifndef COHORT_SRV_EVENTS_H
#define COHORT_SRV_EVENTS_H

#include "core/core.h"

struct srv_job;

/* A coordinator with limits lim, the admin secret (NULL: none), replies
 * going to sink(arg, ...), and cohortd's default timeouts. COHORT_ENOMEM
 * only. */
cohort_status srv_core_new(const struct srv_limits *lim,
    const char *admin_token, srv_sink_fn sink, void *arg, cohort__time now,
    struct srv_core **out);
/* Answers every parked request with COHORT_ECLOSED (with a journal:
 * drops them, for the next cohortd) and frees every job. */
void srv_core_close_all(struct srv_core *core);
/* srv_core_close_all, then frees everything. NULL-safe. */
void srv_core_free(struct srv_core *core);
/* Answers every due deadline. */
void srv_core_expire_due(struct srv_core *core, cohort__time now);
/* Deadlines, heartbeat silence, stalls, expiry (every 100 ms). */
void srv_core_sweep(struct srv_core *core, cohort__time now);
/* A sweep this late is a stall of cohortd itself (docs/coordinator.md,
 * Liveness). */
#define SRV_LOOP_STALL_MS 1000
/* The transport's sweep ran lag_ms later than due (measured by the
 * transport, which knows the interval). Records the lag; a lag of at
 * least SRV_LOOP_STALL_MS is a stall of cohortd itself (SIGSTOP, a VM
 * pause, a long page-in): the heartbeats queued meanwhile have not been
 * read yet, so the stall is credited to every running member's last
 * sign of life (and to every connection's timeouts), capped at now: a
 * member is never declared dead for cohortd's own silence, and one that
 * stays silent is one dead-after later. Call it before srv_core_sweep. */
void srv_core_loop_lag(
    struct srv_core *core, cohort__time lag_ms, cohort__time now);
/* A connection closed: every running member on it fails at once
 * ("connection lost"), its clients' parked requests are dropped, and
 * clients without a member are forgotten. */
void srv_core_pipe_closed(
    struct srv_core *core, uint32_t pipe, cohort__time now);
/* Connections to close now (at most max, each handed out once):
 *  - no complete request within first_request_ms of being established
 *    (a connection held open silently, or a frame that never completes:
 *    nng reads a frame's declared length, then waits for the rest);
 *  - no complete request for idle_ms, and neither a running member nor
 *    a parked request on it (a partial frame after earlier requests
 *    looks the same from here).
 * A member's connection is judged by its heartbeats (dead-after). */
size_t srv_core_take_idle_pipes(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max);
/* Answers the parked request seq of client id in job with st and why
 * (a client gave up waiting, e.g. TCPStore's CANCEL_WAIT). Returns false
 * if no such request is parked (it was answered already). */
bool srv_core_cancel(struct srv_job *job, uint64_t client_id, uint64_t seq,
    cohort_status st, const char *why, cohort__time now);
/* Whether /readyz is 200: not draining, and the journal (if any) can be
 * written; else false with the reason in why. */
bool srv_core_ready(struct srv_core *core, char *why, size_t len);

#endif /* COHORT_SRV_EVENTS_H */
