/*
 * coord.h - the request/reply engine between libcohort and cohortd.
 *
 * One engine (struct cohort__coord) per cohort_client: one req0 socket
 * dialed to cohortd (proto/README.md section 1), and one nng context plus
 * one aio per call, so that calls from several threads, the heartbeat and
 * the parked Watch run concurrently on the one connection. nng's automatic
 * resend is disabled: a retry is explicit and reuses the call's seq.
 *
 * Using it (every module that talks to cohortd: client.c, control.c,
 * kv.c, and client/collectives.c for GroupCreate):
 *
 *	Cohort__Request req = COHORT__REQUEST__INIT;
 *	Cohort__KvSet body = COHORT__KV_SET__INIT;
 *	struct cohort__coord_call call;
 *
 *	body.key = (char *) key;
 *	req.body_case = COHORT__REQUEST__BODY_KV_SET;
 *	req.kv_set = &body;
 *	cohort__coord_call_init(&call, &req, deadline);
 *	call.parts = iov;             (optional trailing payload)
 *	call.nparts = 1;
 *	rv = cohort__coord_call(co, &call);
 *	... use call.rep / call.payload (also when rv is a reply status) ...
 *	cohort__coord_call_fini(&call);
 *
 * The engine fills the envelope (proto_version, job, token, client_id,
 * seq, generation, rank, timeout_ms, payload_len) on every request.
 * timeout_ms is the time left until the call's deadline, so cohortd parks
 * the request no longer than the caller waits; the client waits
 * COHORT__REPLY_GRACE_MS more for the answer before it decides that the
 * coordinator is gone.
 *
 * Retries (issue 4): call.seq is 0 for a new request, and the engine writes
 * the seq it used back into it. Calling cohort__coord_call again on the
 * same call (after cohort__coord_call_fini) re-sends with that seq, which
 * cohortd applies once.
 *
 * Coordinator loss and restart (issue 4): when the connection to cohortd
 * drops, pending calls stay pending. nng's dialer re-dials (50 ms back-off
 * growing to 1 s); on the new connection every request in flight is
 * re-sent with the same client_id and seq, so cohortd's (journalled) reply
 * cache answers those it applied already and parked ones are parked again
 * (collectives keep their (group, op_seq)). A call fails with
 * COHORT_ENOCOORD only if the connection stays down past the reconnect
 * window (default COHORT_RECONNECT_MS, else the scaled default dead-after;
 * the client sets its own dead_after) or past its own deadline; once the
 * window passed the engine is lost for good (sticky ENOCOORD).
 */
#ifndef COHORT_COORD_H
#define COHORT_COORD_H

#include <pthread.h>
#include <stdbool.h>
#include <stdint.h>

#include "cohort_impl.h"

struct cohort__coord;

/* One request and its reply. Initialise with cohort__coord_call_init, set
 * the inputs, run it with cohort__coord_call, release the reply with
 * cohort__coord_call_fini. */
struct cohort__coord_call {
	/* Inputs. */
	Cohort__Request *req; /* body set by the caller */
	const struct cohort__iov *parts; /* trailing payload, may be NULL */
	size_t nparts;
	cohort__time deadline; /* COHORT__TIME_NEVER: no limit */
	uint64_t seq; /* 0: next; else a retry */

	/* Outputs: the reply, if one arrived (also when it carries an error
	 * status), valid until cohort__coord_call_fini. payload points into
	 * the reply message. */
	Cohort__Reply *rep;
	const uint8_t *payload;
	size_t plen;

	/* Private to coord.c. */
	nng_msg *reply_msg;
	nng_aio *aio; /* current step's aio, NULL when none */
	bool aborted; /* cohort__coord_call_abort was called */
	cohort_status abort_st;
	bool resend; /* the connection changed: send again */
	uint64_t sent_epoch; /* connection epoch of the last send */
	unsigned sends; /* times sent */
	struct cohort__coord_call *prev, *next; /* pending list */
};

/* Creates the engine and starts dialing url without waiting (cohortd may
 * start a little later). job and token are copied. */
cohort_status cohort__coord_open(const char *url, const char *job,
    const char *token, uint64_t client_id, struct cohort__coord **out);

/* Waits until the connection is up, or deadline: COHORT_ENOCOORD. */
cohort_status cohort__coord_wait_connected(
    struct cohort__coord *co, cohort__time deadline);

/* Closes the socket (pending calls fail with COHORT_ECLOSED) and frees the
 * engine. Async operations must have been freed before. NULL-safe. */
void cohort__coord_close(struct cohort__coord *co);

/* Announces a clean departure: the Leave about to be sent makes cohortd
 * close this connection (proto/README.md 4.4), which is then expected,
 * not reconnected, and cohort__coord_close waits for it (at most 400 ms)
 * before closing the socket. That order avoids an nng 1.5.2 deadlock in
 * closing a socket whose connection is still alive (nng #1543). */
void cohort__coord_prepare_close(struct cohort__coord *co);

/* Identity carried by later requests (after the join completed). */
void cohort__coord_set_member(
    struct cohort__coord *co, int32_t rank, uint64_t generation);
/* cohortd's size limits from the join reply (0: an older cohortd, keep
 * the defaults): every later request is checked against max_frame before
 * it is sent (ETOOBIG naming the sizes), never dropped by cohortd. */
void cohort__coord_set_limits(
    struct cohort__coord *co, uint64_t max_value, uint64_t max_frame);
/* The largest KV value / broadcast object cohortd takes. */
uint64_t cohort__coord_max_value(struct cohort__coord *co);
/* True once the connection to cohortd was lost for good (down longer
 * than the reconnect window, or dropped). */
bool cohort__coord_lost(struct cohort__coord *co);
/* True while a connection is up. */
bool cohort__coord_up(struct cohort__coord *co);
/* Both of the above for a caller on nng's thread (an asynchronous call's
 * callback), which must never wait for the engine's lock: false, and
 * nothing read, when another thread holds it. */
bool cohort__coord_try_state(struct cohort__coord *co, bool *lost, bool *up);
/* How long the connection may stay down before calls fail. */
void cohort__coord_set_reconnect_window(
    struct cohort__coord *co, cohort_duration ms);
/* Drops the connection on purpose (fault injection): the engine is lost
 * at once with `why` (pending calls fail with ENOCOORD), the dialer stops
 * re-dialing, cohortd sees the connection close. Never blocks long. */
void cohort__coord_drop(struct cohort__coord *co, const char *why);

void cohort__coord_call_init(struct cohort__coord_call *call,
    Cohort__Request *req, cohort__time deadline);

/* Sends call->req with its payload and waits for the reply, at most until
 * the deadline plus COHORT__REPLY_GRACE_MS. Returns COHORT_OK when cohortd
 * answered OK; the reply's status when it answered an error (call->rep is
 * set, the reply's error text is the thread's cohort_last_error());
 * COHORT_ENOCOORD when the coordinator is unreachable or did not answer in
 * time; COHORT_EPROTO for a malformed reply; the abort status after
 * cohort__coord_call_abort; ENOMEM/ETOOBIG from packing. Blocks. */
cohort_status cohort__coord_call(
    struct cohort__coord *co, struct cohort__coord_call *call);

/* Makes a cohort__coord_call in progress in another thread (or about to
 * start) return `why` promptly. Never blocks; the call must be initialised
 * and not yet finalised. */
void cohort__coord_call_abort(struct cohort__coord *co,
    struct cohort__coord_call *call, cohort_status why);

/* cohort__coord_call_init, the trailing payload (parts, may be NULL) and
 * cohort__coord_call: one request in one call. The caller finalises call
 * whatever it returns. */
cohort_status cohort__coord_request(struct cohort__coord *co,
    struct cohort__coord_call *call, Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, cohort__time deadline);

/* The body of call's reply when it has one of kind want, else NULL. */
const void *cohort__coord_reply_body(
    const struct cohort__coord_call *call, Cohort__Reply__BodyCase want);

/* Frees the reply; the call may then be run again (a retry, same seq). */
void cohort__coord_call_fini(struct cohort__coord_call *call);

/* Asynchronous calls, for the heartbeat and the Watch long poll: no thread
 * per client. One object runs one call at a time. The callback runs on an
 * nng thread when the call finished (st as cohort__coord_call returns it);
 * call->rep is valid only during the callback. The callback may start the
 * next call on the same object; it must not block, nor stop or free it. */
struct cohort__coord_async;
typedef void (*cohort__coord_done)(
    void *arg, cohort_status st, struct cohort__coord_call *call);

cohort_status cohort__coord_async_alloc(struct cohort__coord *co,
    cohort__coord_done cb, void *arg, struct cohort__coord_async **out);
/* Starts a call (req is packed before it returns, so it may live on the
 * caller's stack). Returns an error, without calling cb, if it could not
 * start. */
cohort_status cohort__coord_async_start(struct cohort__coord_async *a,
    Cohort__Request *req, cohort__time deadline);
/* cohort__coord_async_start for a periodic caller that must never wait
 * for the engine's lock (the process's one heartbeat thread: a client
 * thread preempted while it holds the lock would hold up every client of
 * the process): *busy and nothing started, COHORT_OK, when another
 * thread holds it; the caller tries again shortly. */
cohort_status cohort__coord_async_try_start(struct cohort__coord_async *a,
    Cohort__Request *req, cohort__time deadline, bool *busy);
/* Ends the call in progress on a with "no answer" (ENOCOORD, as the
 * synchronous calls' timeout) when now is past its deadline plus
 * COHORT__REPLY_GRACE_MS. An asynchronous call has no timer of its own
 * (coord.c says why): its owner calls this periodically (the heartbeat
 * timer, every heartbeat interval). Never blocks; NULL-safe. */
void cohort__coord_async_tick(struct cohort__coord_async *a, cohort__time now);
/* (It only takes the engine's lock when free: busy, it does nothing and
 * the next tick looks again.) */
/* Cancels the call in progress, waits for its callback and prevents new
 * starts. Not from the callback. */
void cohort__coord_async_stop(struct cohort__coord_async *a);
/* Stops and frees. NULL-safe. */
void cohort__coord_async_free(struct cohort__coord_async *a);
/* Takes (hold) or gives back the engine's lock, as a client thread
 * preempted inside a call holds it: for tests of the callbacks, which
 * must never wait for it. */
void cohort__coord_hold(struct cohort__coord *co, bool hold);

/* Converts a deadline to a pthread_cond_timedwait absolute time on
 * CLOCK_MONOTONIC (conds created with cohort__cond_init). */
int cohort__cond_init(pthread_cond_t *cv);
int cohort__cond_wait_until(
    pthread_cond_t *cv, pthread_mutex_t *mtx, cohort__time deadline);

#endif /* COHORT_COORD_H */
