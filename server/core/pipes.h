/*
 * pipes.h - connections as the core sees them: nng pipe ids (TCPStore's
 * connections take ids above nng's range), the clients bound to each,
 * and what the first-request and idle timeouts need.
 *
 * A pipe known only through its clients (unit tests, pipes whose open
 * event was not seen) goes with its last client; a connection (its open
 * event seen) goes with its close event. Closed ids are remembered for a
 * minute, so that a request handled after its connection's close event
 * is dropped instead of binding its client to a dead connection.
 */
#ifndef COHORT_SRV_PIPES_H
#define COHORT_SRV_PIPES_H

#include "core.h"

struct srv_pipe {
	struct srv_hnode hn; /* in core->pipes by id */
	uint32_t id;
	struct srv_link clients; /* srv_client.plink */
	bool conn; /* srv_pipe_opened seen */
	bool closing; /* handed to the transport to close */
	cohort__time opened;
	cohort__time last_msg; /* last complete request */
	uint64_t nmsg;
};

/* The pipe, or NULL. */
struct srv_pipe *srv_pipe_find(const struct srv_core *core, uint32_t id);
/* The pipe, created if absent; NULL for id 0 or when out of memory. */
struct srv_pipe *srv_pipe_get(struct srv_core *core, uint32_t id);
/* Frees p if nothing keeps it: no client, no connection. */
void srv_pipe_release(struct srv_core *core, struct srv_pipe *p);
/* Removes and frees p (its connection closed; no client left on it). */
void srv_pipe_remove(struct srv_core *core, struct srv_pipe *p);

/* A connection was established (nng's ADD_POST pipe event): from now on
 * it is tracked for the first-request and idle timeouts until its close
 * event. The event may come after the pipe's first requests (nng runs
 * pipe callbacks outside the server mutex). */
void srv_pipe_opened(struct srv_core *core, uint32_t id, cohort__time now);
/* A complete request arrived over the pipe. */
void srv_pipe_request(struct srv_core *core, uint32_t id, cohort__time now);
/* Whether the pipe's close event was seen (within the last minute). */
bool srv_pipe_is_closed(const struct srv_core *core, uint32_t id);
void srv_pipe_note_closed(
    struct srv_core *core, uint32_t id, cohort__time now);
/* Forgets closed ids older than a minute (the sweep). */
void srv_pipes_prune_closed(struct srv_core *core, cohort__time now);

/* Asks the transport to close the pipe at `at` (after a Leave: see
 * srv_pipes_take_to_close); dropped when SRV_CLOSE_PIPES are queued. */
void srv_pipe_close_later(struct srv_core *core, uint32_t id, cohort__time at);
/* Pipes due to be closed by now (at most max, removed from the queue).
 *
 * Why cohortd closes a departing client's connection: with nng 1.5.2, a
 * req0 socket closed by its owner while its pipe is alive can leave nng's
 * reaper waiting forever on the pipe's receive aio (nng #1543/#1813), and
 * every later close in that process then hangs. A connection closed by
 * the peer takes nng's error path, which is clean; so after a Leave
 * cohortd closes the client's connection itself (50-150 ms later, after
 * the reply has been flushed) and the client waits for that before it
 * closes its socket. */
size_t srv_pipes_take_to_close(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max);

/* cohortd itself stalled for lag ms: the connections' timeouts get the
 * time back (capped at now). */
void srv_pipes_credit_lag(
    struct srv_core *core, cohort__time lag, cohort__time now);
/* Frees every pipe and closed id (clients must be gone). */
void srv_pipes_fini(struct srv_core *core);

#endif /* COHORT_SRV_PIPES_H */
