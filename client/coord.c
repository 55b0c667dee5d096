/*
 * coord.c - request/reply to cohortd over one nng req0 socket; one context
 * and one aio per call; a deadline on every step (see coord.h).
 *
 * Every call in flight is on the engine's pending list with the aio of its
 * current step. The engine follows the connection through nng's pipe
 * notifications:
 *
 *  - pipe removed: the engine is *down* since now; every pending call is
 *    told to re-send (resend flag) and its step is aborted, so it waits
 *    for the next connection, bounded by the reconnect window and its own
 *    deadline. nng's dialer re-dials by itself (RECONNMINT/RECONNMAXT).
 *  - pipe added: the epoch grows; calls sent on an older connection are
 *    told to re-send, and the ones waiting are woken. A re-sent request
 *    has the same client_id and seq (cohortd's reply cache answers one
 *    that was applied already; a parked one is parked again), and a fresh
 *    timeout_ms.
 *  - down longer than the reconnect window: the engine is *lost* (sticky
 *    COHORT_ENOCOORD); every pending and later call fails with it.
 *
 * Steps are started under the engine's lock after checking the flags; the
 * notifications and cohort__coord_call_abort take the same lock, so no
 * event can slip between two steps of a call.
 *
 * The notifications never wait for that lock (coord_pipe_cb): nng 1.5.2
 * runs "pipe removed" on its one reaper thread, which every nng_close of
 * the process waits for, and "pipe added" inside the dialer's connect
 * task, which nng_close also waits for. An event that finds the lock taken
 * is queued and applied by the next holder (coord_lock) or by a short
 * retry on nng's timer (coord_ev_cb), in order.
 */
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <poll.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "coord.h"
#include "knobs.h"
#include "tls.h"

/* Re-dial back-off of nng's dialer after a lost connection. */
#define COORD_RECONN_MIN_MS 50
#define COORD_RECONN_MAX_MS 1000
/* How often an asynchronous call waiting for a connection looks again. */
#define COORD_POLL_MS 20
/* How long an asynchronous call's callback waits to look again when a
 * client thread holds the engine's lock (coord_async_cb): doubling from
 * 1 ms up to 32 ms while the lock stays taken, so that a holder preempted
 * for seconds costs each waiting call some 30 wake-ups a second, not
 * 1,000, on a machine already short of CPU. */
#define COORD_DEFER_MS 1
#define COORD_DEFER_MAX_SHIFT 5
/* Pipe events kept while a client thread holds the engine's lock
 * (coord_pipe_cb). One connection adds two; nng's dialer waits between
 * re-dials, so a full queue needs a lock held through dozens of
 * reconnections: the notification then waits for the lock, as before. */
#define COORD_EVQ 64

struct coord_pipe_ev {
	nng_pipe_ev ev;
	uint32_t id;
	cohort__time at;
};

struct cohort__coord {
	nng_socket sock;
	nng_dialer dialer;
	char url[256];
	char *job;
	char *token;
	uint64_t client_id;
	_Atomic uint64_t next_seq;

	pthread_mutex_t mtx;
	pthread_cond_t cv;
	bool connected; /* a pipe was up at least once */
	bool up; /* a pipe is up now */
	uint32_t pipe_id; /* the pipe that is up */
	uint64_t epoch; /* pipes added so far */
	cohort__time down_since;
	cohort_duration reconnect_ms;
	uint64_t reconnects;
	bool lost; /* gave up: sticky ENOCOORD */
	bool leaving; /* Leave sent: cohortd closes the connection */
	char lost_why[320];
	bool closing;
	int32_t rank;
	uint64_t generation;
	/* cohortd's limits (cohort__coord_set_limits). */
	_Atomic uint64_t max_value;
	_Atomic uint64_t max_frame;
	struct cohort__coord_call *pending;
	/* Idle contexts and aios of finished synchronous calls, reused by
	 * the next ones (saves an open/close and an alloc/free per call). */
	struct coord_slot *idle;
	unsigned nidle;

	/* Pipe events not applied yet (coord_pipe_cb), oldest first, under
	 * ev_mtx, which is only ever held to add or take them. */
	pthread_mutex_t ev_mtx;
	struct coord_pipe_ev evq[COORD_EVQ];
	unsigned ev_first, ev_n;
	/* Retries applying them while the engine's lock is taken: armed
	 * while a retry is due or running; deferrals back it off. */
	nng_aio *ev_aio;
	atomic_bool ev_armed;
	atomic_uint ev_deferrals;
};

#define COORD_MAX_IDLE 8

struct coord_slot {
	nng_ctx ctx;
	nng_aio *aio;
	struct coord_slot *next;
};

enum coord_state {
	COORD_IDLE = 0,
	COORD_WAIT, /* for a connection (sleep aio) */
	COORD_SEND,
	COORD_RECV,
};

struct cohort__coord_async {
	struct cohort__coord *co;
	cohort__coord_done cb;
	void *arg;
	nng_ctx ctx;
	nng_aio *aio;
	enum coord_state state; /* under co->mtx */
	bool stopped; /* under co->mtx */
	/* A starter owns the call from its first look at state to the send
	 * (coord_async_start, which lets go of co->mtx in between). */
	atomic_bool starting;
	/* A completion whose callback found the engine's lock taken: its
	 * result and message, kept while the aio sleeps COORD_DEFER_MS and
	 * taken up when the sleep ends (coord_async_cb; only the callback,
	 * which nng runs one at a time per aio, and the free touch them). */
	bool deferred;
	unsigned deferrals; /* in a row, for the back-off */
	int deferred_rv;
	nng_msg *deferred_msg;
	/* cohort__coord_async_stop has begun: nng runs no more operations on
	 * the aio, so the callback must not defer (its sleep would never
	 * end) but wait for the lock, which the stopper does not hold. */
	atomic_bool stopping;
	nng_msg *tmpl; /* the packed request, for re-sends */
	struct cohort__coord_call call;
};

static void coord_ev_apply_locked(struct cohort__coord *co);

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

int
cohort__cond_init(pthread_cond_t *cv)
{
	pthread_condattr_t attr;
	int rv;

	if ((rv = pthread_condattr_init(&attr)) != 0)
		return (rv);
	pthread_condattr_setclock(&attr, CLOCK_MONOTONIC);
	rv = pthread_cond_init(cv, &attr);
	pthread_condattr_destroy(&attr);
	return (rv);
}

int
cohort__cond_wait_until(
    pthread_cond_t *cv, pthread_mutex_t *mtx, cohort__time deadline)
{
	struct timespec ts;

	if (deadline == COHORT__TIME_NEVER)
		return (pthread_cond_wait(cv, mtx));
	ts.tv_sec = (time_t)(deadline / 1000);
	ts.tv_nsec = (long)(deadline % 1000) * 1000000L;
	return (pthread_cond_timedwait(cv, mtx, &ts));
}

/* Request.timeout_ms: how long cohortd may park the request. */
static uint32_t
coord_park_ms(cohort__time deadline)
{
	if (deadline == COHORT__TIME_NEVER)
		return (UINT32_MAX);
	return ((uint32_t)cohort__remaining(deadline));
}

/* How long a step waits: the parking time plus the reply's flight. */
static nng_duration
coord_wait_ms(cohort__time deadline)
{
	int64_t ms;

	if (deadline == COHORT__TIME_NEVER)
		return (NNG_DURATION_INFINITE);
	ms = (int64_t)cohort__remaining(deadline) + COHORT__REPLY_GRACE_MS;
	return (ms > INT32_MAX ? INT32_MAX : (nng_duration)ms);
}

/* The last moment a call waits for anything: deadline plus grace. */
static cohort__time
coord_call_end(const struct cohort__coord_call *call)
{
	if (call->deadline == COHORT__TIME_NEVER)
		return (COHORT__TIME_NEVER);
	return (call->deadline + COHORT__REPLY_GRACE_MS);
}

/* An nng error that means "the connection went away": re-send. */
static bool
coord_conn_error(int rv)
{
	return (rv == NNG_ECONNRESET || rv == NNG_ECONNSHUT
	    || rv == NNG_ECONNREFUSED || rv == NNG_ECONNABORTED
	    || rv == NNG_EUNREACHABLE || rv == NNG_ECANCELED);
}

static void
coord_link(struct cohort__coord *co, struct cohort__coord_call *call)
{
	call->prev = NULL;
	call->next = co->pending;
	if (co->pending != NULL)
		co->pending->prev = call;
	co->pending = call;
}

static void
coord_unlink(struct cohort__coord *co, struct cohort__coord_call *call)
{
	if (call->prev != NULL)
		call->prev->next = call->next;
	else if (co->pending == call)
		co->pending = call->next;
	if (call->next != NULL)
		call->next->prev = call->prev;
	call->prev = call->next = NULL;
	call->aio = NULL;
}

/* Whether a call may start its next step; under co->mtx. */
static cohort_status
coord_check_locked(struct cohort__coord *co, struct cohort__coord_call *call)
{
	if (call->aborted)
		return (cohort__err(call->abort_st, "call aborted"));
	if (co->closing)
		return (cohort__err(COHORT_ECLOSED, "client is closing"));
	if (co->lost)
		return (cohort__err(COHORT_ENOCOORD, "%s", co->lost_why));
	return (COHORT_OK);
}

/* Gives up on the coordinator (sticky); under co->mtx. */
static void
coord_set_lost_locked(struct cohort__coord *co, const char *why)
{
	struct cohort__coord_call *call;

	if (co->lost)
		return;
	co->lost = true;
	cohort__strlcpy(co->lost_why, why, sizeof(co->lost_why));
	cohort__warn("%s", why);
	for (call = co->pending; call != NULL; call = call->next)
		if (call->aio != NULL)
			nng_aio_abort(call->aio, NNG_ECONNSHUT);
	pthread_cond_broadcast(&co->cv);
}

/* Down past the reconnect window? Marks the engine lost; under co->mtx. */
static bool
coord_window_over_locked(struct cohort__coord *co, cohort__time now)
{
	char why[320];
	size_t off = 0;

	if (co->lost)
		return (true);
	if (co->up || !co->connected
	    || now - co->down_since < (cohort__time)co->reconnect_ms)
		return (false);
	cohort__appendf(why, sizeof(why), &off,
	    "lost the connection to the coordinator at %s and could not "
	    "reconnect within %.1f s",
	    co->url, (double)co->reconnect_ms / 1000.0);
	coord_set_lost_locked(co, why);
	return (true);
}

/* Blocks until a connection is up (COHORT_OK), or fails: the window
 * passed, the call's deadline passed, an abort, a close. Under co->mtx. */
static cohort_status
coord_wait_up_locked(struct cohort__coord *co, struct cohort__coord_call *call)
{
	cohort_status st;
	cohort__time now, until, end = coord_call_end(call);

	for (;;) {
		if ((st = coord_check_locked(co, call)) != COHORT_OK)
			return (st);
		if (co->up)
			return (COHORT_OK);
		now = cohort__now_ms();
		if (coord_window_over_locked(co, now))
			continue; /* check_locked says why */
		if (now >= end)
			return (cohort__err(COHORT_ENOCOORD,
			    co->connected
			        ? "the connection to the coordinator at %s is "
			          "down; not back before the call's deadline"
			        : "cannot reach the coordinator at %s before "
			          "the call's deadline",
			    co->url));
		until = end;
		if (co->connected && co->down_since + co->reconnect_ms < until)
			until = co->down_since + co->reconnect_ms;
		(void)cohort__cond_wait_until(&co->cv, &co->mtx, until);
		coord_ev_apply_locked(co);
	}
}

/* Turns a failed step into a status; under co->mtx. */
static cohort_status
coord_step_error(struct cohort__coord *co, struct cohort__coord_call *call,
    int rv, const char *step)
{
	cohort_status st;

	if ((st = coord_check_locked(co, call)) != COHORT_OK)
		return (st);
	if (rv == NNG_ETIMEDOUT)
		return (cohort__err(COHORT_ENOCOORD,
		    "no answer from the coordinator at %s within %d ms after "
		    "the request's deadline (%s)",
		    co->url, COHORT__REPLY_GRACE_MS, step));
	st = cohort__from_nng(rv);
	if (st == COHORT_ENOCOORD)
		return (cohort__err(st,
		    "lost the connection to the coordinator at %s while %s: "
		    "%s",
		    co->url, step, nng_strerror(rv)));
	return (cohort__err(st, "%s to the coordinator at %s: %s", step,
	    co->url, nng_strerror(rv)));
}

/* Takes co->mtx; with try, only if it is free now (false: busy). Applies
 * the pipe events queued while it was taken, so every holder sees the
 * connection as nng last reported it. */
static bool
coord_lock(struct cohort__coord *co, bool try)
{
	if (try) {
		if (pthread_mutex_trylock(&co->mtx) != 0)
			return (false);
	} else {
		pthread_mutex_lock(&co->mtx);
	}
	coord_ev_apply_locked(co);
	return (true);
}

static bool coord_fill_try(
    struct cohort__coord *co, struct cohort__coord_call *call, bool try);

static void
coord_fill(struct cohort__coord *co, struct cohort__coord_call *call)
{
	(void)coord_fill_try(co, call, false);
}

/* Fills the envelope; with try, false (nothing filled) when co->mtx is
 * busy. */
static bool
coord_fill_try(
    struct cohort__coord *co, struct cohort__coord_call *call, bool try)
{
	Cohort__Request *req = call->req;

	req->proto_version = COHORT_PROTO_VERSION;
	req->job = co->job;
	req->token = co->token;
	req->client_id = co->client_id;
	if (!coord_lock(co, try))
		return (false);
	req->generation = co->generation;
	req->rank = co->rank;
	pthread_mutex_unlock(&co->mtx);
	if (call->seq == 0)
		call->seq = atomic_fetch_add(&co->next_seq, 1);
	req->seq = call->seq;
	req->timeout_ms = coord_park_ms(call->deadline);
	return (true);
}

/* Takes msg (the reply); fills call's outputs. */
static cohort_status
coord_unpack(struct cohort__coord_call *call, nng_msg *msg)
{
	Cohort__Reply *rep;
	const uint8_t *payload;
	size_t plen;
	cohort_status st;

	if ((st = cohort__wire_unpack_reply(msg, &rep, &payload, &plen))
	    != COHORT_OK) {
		nng_msg_free(msg);
		return (st);
	}
	if (rep->seq != call->seq) {
		st = cohort__err(COHORT_EPROTO,
		    "reply for seq %" PRIu64 " to request seq %" PRIu64,
		    rep->seq, call->seq);
		cohort__reply__free_unpacked(rep, NULL);
		nng_msg_free(msg);
		return (st);
	}
	call->rep = rep;
	call->reply_msg = msg;
	call->payload = payload;
	call->plen = plen;
	if (rep->status != 0) {
		st = (cohort_status)rep->status;
		return (cohort__err(st, "%s",
		    rep->error != NULL && rep->error[0] != '\0'
		        ? rep->error
		        : cohort_strerror(st)));
	}
	return (COHORT_OK);
}

/* An aio (callback cb) and a context on co's socket: both or neither. */
static cohort_status
coord_ctx_open(struct cohort__coord *co, nng_aio **aio, nng_ctx *ctx,
    void (*cb)(void *), void *arg)
{
	int rv;

	if ((rv = nng_aio_alloc(aio, cb, arg)) != 0)
		return (cohort__err(cohort__from_nng(rv), "nng_aio_alloc: %s",
		    nng_strerror(rv)));
	if ((rv = nng_ctx_open(ctx, co->sock)) != 0) {
		nng_aio_free(*aio);
		return (cohort__err(cohort__from_nng(rv), "nng_ctx_open: %s",
		    nng_strerror(rv)));
	}
	return (COHORT_OK);
}

/* A context and an aio for one synchronous call: an idle one, or new. */
static cohort_status
coord_slot_get(struct cohort__coord *co, struct coord_slot **out)
{
	struct coord_slot *sl = NULL;
	cohort_status st;

	(void)coord_lock(co, false);
	if ((sl = co->idle) != NULL) {
		co->idle = sl->next;
		co->nidle--;
	}
	pthread_mutex_unlock(&co->mtx);
	if (sl != NULL) {
		*out = sl;
		return (COHORT_OK);
	}
	if ((sl = calloc(1, sizeof(*sl))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if ((st = coord_ctx_open(co, &sl->aio, &sl->ctx, NULL, NULL))
	    != COHORT_OK) {
		free(sl);
		return (st);
	}
	*out = sl;
	return (COHORT_OK);
}

static void
coord_slot_free(struct coord_slot *sl)
{
	nng_ctx_close(sl->ctx);
	nng_aio_free(sl->aio);
	free(sl);
}

/* Keeps a slot whose call completed normally; frees one in doubt. */
static void
coord_slot_put(struct cohort__coord *co, struct coord_slot *sl, bool reuse)
{
	(void)coord_lock(co, false);
	if (reuse && !co->closing && co->nidle < COORD_MAX_IDLE) {
		sl->next = co->idle;
		co->idle = sl;
		co->nidle++;
		sl = NULL;
	}
	pthread_mutex_unlock(&co->mtx);
	if (sl != NULL)
		coord_slot_free(sl);
}

/* ------------------------------------------------------------------------ */
/* Engine                                                                   */
/* ------------------------------------------------------------------------ */

/* Every pending call sent before the current epoch must re-send; under
 * co->mtx. */
static void
coord_resend_all_locked(struct cohort__coord *co, int why)
{
	struct cohort__coord_call *call;

	for (call = co->pending; call != NULL; call = call->next) {
		if (call->sent_epoch >= co->epoch && co->up)
			continue;
		call->resend = true;
		if (call->aio != NULL)
			nng_aio_abort(call->aio, why);
	}
	pthread_cond_broadcast(&co->cv);
}

/* One pipe event (at: when nng reported it); under co->mtx. */
static void
coord_pipe_apply_locked(
    struct cohort__coord *co, nng_pipe_ev ev, uint32_t id, cohort__time at)
{
	if (co->closing || co->lost) {
		pthread_cond_broadcast(&co->cv);
		return;
	}
	if (ev == NNG_PIPE_EV_ADD_POST) {
		if (co->connected && co->leaving) {
			/* nng redialled after cohortd closed the connection
			 * of our Leave: not a reconnection anyone waited for
			 */
			cohort__debug("redialled the coordinator at %s after "
			              "leaving",
			    co->url);
		} else if (co->connected) {
			co->reconnects++;
			cohort__info("reconnected to the coordinator at %s "
			             "after %.2f s; re-sending the requests "
			             "in flight",
			    co->url, (double)(at - co->down_since) / 1000.0);
		} else {
			cohort__debug(
			    "connected to the coordinator at %s", co->url);
		}
		co->connected = true;
		co->up = true;
		co->pipe_id = id;
		co->epoch++;
		coord_resend_all_locked(co, NNG_ECANCELED);
	} else if (ev == NNG_PIPE_EV_REM_POST && co->up && id == co->pipe_id
	    && co->leaving) {
		/* the close cohortd does after a Leave: expected */
		co->up = false;
		co->pipe_id = 0;
		co->down_since = at;
	} else if (ev == NNG_PIPE_EV_REM_POST && co->up && id == co->pipe_id) {
		co->up = false;
		co->pipe_id = 0;
		co->down_since = at;
		cohort__warn("lost the connection to the coordinator at %s; "
		             "reconnecting (for up to %.1f s)",
		    co->url, (double)co->reconnect_ms / 1000.0);
		coord_resend_all_locked(co, NNG_ECONNSHUT);
	}
}

/* Applies the queued pipe events in order; under co->mtx. */
static void
coord_ev_apply_locked(struct cohort__coord *co)
{
	struct coord_pipe_ev evs[COORD_EVQ];
	unsigned n;

	pthread_mutex_lock(&co->ev_mtx);
	n = co->ev_n;
	for (unsigned i = 0; i < n; i++)
		evs[i] = co->evq[(co->ev_first + i) % COORD_EVQ];
	co->ev_first = (co->ev_first + n) % COORD_EVQ;
	co->ev_n = 0;
	pthread_mutex_unlock(&co->ev_mtx);
	for (unsigned i = 0; i < n; i++)
		coord_pipe_apply_locked(co, evs[i].ev, evs[i].id, evs[i].at);
}

static bool
coord_ev_pending(struct cohort__coord *co)
{
	bool pending;

	pthread_mutex_lock(&co->ev_mtx);
	pending = co->ev_n > 0;
	pthread_mutex_unlock(&co->ev_mtx);
	return (pending);
}

/* Applies the queued events if the engine's lock is free now; false:
 * busy, they wait. */
static bool
coord_ev_try(struct cohort__coord *co)
{
	if (!coord_lock(co, true)) /* applies them */
		return (false);
	pthread_mutex_unlock(&co->mtx);
	return (true);
}

/* Arms the retry unless one is due or running already (which then takes
 * the events queued meanwhile: coord_ev_cb looks again after disarming). */
static void
coord_ev_arm(struct cohort__coord *co, nng_duration ms)
{
	if (!atomic_exchange(&co->ev_armed, true))
		nng_sleep_aio(ms, co->ev_aio);
}

/* The retry: on nng's timer thread, which must not wait for the lock
 * either. Busy again: sleeps again, backing off like coord_async_cb. */
static void
coord_ev_cb(void *arg)
{
	struct cohort__coord *co = arg;
	unsigned shift;

	if (nng_aio_result(co->ev_aio) != 0) { /* stopped: the close */
		atomic_store(&co->ev_armed, false);
		return;
	}
	if (coord_ev_try(co)) {
		atomic_store(&co->ev_deferrals, 0);
		atomic_store(&co->ev_armed, false);
		if (coord_ev_pending(co) && !coord_ev_try(co))
			coord_ev_arm(co, COORD_DEFER_MS);
		return;
	}
	shift = atomic_fetch_add(&co->ev_deferrals, 1);
	if (shift > COORD_DEFER_MAX_SHIFT)
		shift = COORD_DEFER_MAX_SHIFT;
	nng_sleep_aio((nng_duration)(COORD_DEFER_MS << shift), co->ev_aio);
}

/*
 * nng's pipe notification. It must not wait for the engine's lock, which
 * a client thread holds across its own nng calls (and a starved machine
 * may not run that thread again for seconds): "removed" runs on nng's
 * one reaper thread, and while it waits no nng_close of the process
 * finishes; "added" runs in the dialer's connect task, and the pipe it
 * adds stays referenced meanwhile, which the reaper waits for when that
 * pipe goes (pipe_destroy). So the event is queued, and applied at once
 * if the lock is free, else by its next holder or the retry.
 */
static void
coord_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct cohort__coord *co = arg;
	struct coord_pipe_ev e = { ev, nng_pipe_id(p), cohort__now_ms() };
	bool queued = false;

	pthread_mutex_lock(&co->ev_mtx);
	if (co->ev_n < COORD_EVQ) {
		co->evq[(co->ev_first + co->ev_n) % COORD_EVQ] = e;
		co->ev_n++;
		queued = true;
	}
	pthread_mutex_unlock(&co->ev_mtx);
	if (!queued) {
		/* full (see COORD_EVQ): the older events first, then this
		 * one, waiting for the lock */
		(void)coord_lock(co, false);
		coord_pipe_apply_locked(co, e.ev, e.id, e.at);
		pthread_mutex_unlock(&co->mtx);
		return;
	}
	if (!coord_ev_try(co))
		coord_ev_arm(co, COORD_DEFER_MS);
}

static cohort_duration
coord_default_window(void)
{
	return ((cohort_duration)cohort__knob_int_or(COHORT__KNOB_RECONNECT_MS,
	    cohort__scaled(COHORT__DEFAULT_RECONNECT_MS)));
}

/* A knob's text, NULL when unset or empty. */
static const char *
coord_knob(enum cohort__knob k)
{
	const char *v = cohort__knob_str(k);

	return (v != NULL && v[0] != '\0' ? v : NULL);
}

/* A dialer of url with the client's TLS configuration (COHORT_TLS_*),
 * started with flags. */
static cohort_status
coord_tls_dialer(struct cohort__coord *co, const char *url, nng_tls_config *tc,
    int flags, int *nrv)
{
	nng_dialer d;

	if ((*nrv = nng_dialer_create(&d, co->sock, url)) != 0)
		return (
		    cohort__err(*nrv == NNG_EADDRINVAL || *nrv == NNG_EINVAL
		            ? COHORT_EINVAL
		            : cohort__from_nng(*nrv),
		        "cannot dial the coordinator at %s: %s", url,
		        nng_strerror(*nrv)));
	if ((*nrv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tc)) != 0
	    || (*nrv = nng_dialer_start(d, flags)) != 0) {
		nng_dialer_close(d);
		return (cohort__from_nng(*nrv));
	}
	co->dialer = d;
	return (COHORT_OK);
}

/*
 * Dials a tls+tcp:// coordinator. The first attempt is synchronous, so
 * that a certificate the client refuses, or a client certificate cohortd
 * refuses, fails cohort__coord_open at once with what to check instead of
 * a join that times out; when nobody listens for COORD_TLS_SYNC_MS the
 * dialer goes on in the background like the plain one.
 */
#define COORD_TLS_SYNC_MS 3000

/* The client's TLS configuration for url (COHORT_TLS_*); *name is the
 * server name checked (host holds it when it comes from the URL). */
static cohort_status
coord_tls_setup(const char *url, char *host, size_t hostlen,
    nng_tls_config **tc, const char **name)
{
	*name = coord_knob(COHORT__KNOB_TLS_SERVER_NAME);
	if (*name == NULL) {
		/* the URL's host: tls+tcp://HOST:PORT or [V6]:PORT */
		const char *h = strstr(url, "://");
		size_t n;

		h = h != NULL ? h + 3 : url;
		if (*h == '[') {
			h++;
			n = strcspn(h, "]");
		} else {
			n = strcspn(h, ":/");
		}
		snprintf(host, hostlen, "%.*s", (int)n, h);
		*name = host;
	}
	return (
	    cohort__tls_config(tc, false, coord_knob(COHORT__KNOB_TLS_CERT),
	        coord_knob(COHORT__KNOB_TLS_KEY),
	        coord_knob(COHORT__KNOB_TLS_CA), *name, true));
}

/* Whether an nng error of a TLS dial is the handshake's verdict (not
 * "nobody listens yet"). */
static bool
coord_tls_refused(int nrv)
{
	return (nrv == NNG_ECRYPTO || nrv == NNG_EPEERAUTH
	    || nrv == NNG_ECLOSED || nrv == NNG_ECONNRESET
	    || nrv == NNG_ECONNSHUT);
}

static cohort_status
coord_dial_tls(struct cohort__coord *co, const char *url)
{
	const char *ca = coord_knob(COHORT__KNOB_TLS_CA);
	const char *name = NULL;
	char host[256], hint[512];
	nng_tls_config *tc = NULL;
	cohort_status st;
	int nrv = 0;

	if ((st = coord_tls_setup(url, host, sizeof(host), &tc, &name))
	    != COHORT_OK)
		return (st);
	/* cohortd may be starting: refused for a little while is no
	 * verdict yet */
	for (cohort__time until = cohort__now_ms() + COORD_TLS_SYNC_MS;;) {
		st = coord_tls_dialer(co, url, tc, 0, &nrv);
		if (st == COHORT_OK || nrv != NNG_ECONNREFUSED
		    || cohort__now_ms() > until)
			break;
		(void)poll(NULL, 0, 50);
	}
	if (st != COHORT_OK
	    && (nrv == NNG_ECONNREFUSED || nrv == NNG_ETIMEDOUT
	        || nrv == NNG_EUNREACHABLE || nrv == NNG_EADDRINVAL))
		st = coord_tls_dialer(co, url, tc, NNG_FLAG_NONBLOCK, &nrv);
	nng_tls_config_free(tc);
	if (st == COHORT_OK)
		return (COHORT_OK);
	if (nrv == NNG_EINVAL || nrv == NNG_EADDRINVAL || nrv == NNG_ENOTSUP)
		return (st);
	return (cohort__err(COHORT_EAUTH,
	    "TLS connection to the coordinator at %s failed: %s: %s "
	    "(server name '%s', CA %s)",
	    url, nng_strerror(nrv),
	    cohort__tls_explain(nrv, url, coord_knob(COHORT__KNOB_TLS_CERT),
	        hint, sizeof(hint)),
	    name, ca));
}

cohort_status
cohort__coord_open(const char *url, const char *job, const char *token,
    uint64_t client_id, struct cohort__coord **out)
{
	struct cohort__coord *co;
	cohort_status st;
	int rv;

	if (strlen(url) >= sizeof(co->url))
		return (cohort__err(COHORT_EINVAL,
		    "coordinator URL is longer than %zu bytes",
		    sizeof(co->url) - 1));
	if ((co = calloc(1, sizeof(*co))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	cohort__strlcpy(co->url, url, sizeof(co->url));
	co->client_id = client_id;
	co->rank = -1;
	co->reconnect_ms = coord_default_window();
	atomic_init(&co->next_seq, 1);
	atomic_init(&co->max_value, COHORT__DEFAULT_MAX_VALUE);
	atomic_init(&co->max_frame, COHORT__MAX_MESSAGE);
	if ((co->job = strdup(job)) == NULL
	    || (co->token = strdup(token)) == NULL) {
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out_free;
	}
	if (pthread_mutex_init(&co->mtx, NULL) != 0) {
		st = cohort__err(COHORT_ESYSTEM, "pthread_mutex_init failed");
		goto out_free;
	}
	if (cohort__cond_init(&co->cv) != 0) {
		st = cohort__err(COHORT_ESYSTEM, "pthread_cond_init failed");
		goto out_destroy_mtx;
	}
	if (pthread_mutex_init(&co->ev_mtx, NULL) != 0) {
		st = cohort__err(COHORT_ESYSTEM, "pthread_mutex_init failed");
		goto out_destroy_cv;
	}
	atomic_init(&co->ev_armed, false);
	atomic_init(&co->ev_deferrals, 0);
	if ((rv = nng_aio_alloc(&co->ev_aio, coord_ev_cb, co)) != 0) {
		st = cohort__err(cohort__from_nng(rv), "nng_aio_alloc: %s",
		    nng_strerror(rv));
		goto out_destroy_ev;
	}
	if ((rv = nng_req0_open(&co->sock)) != 0) {
		st = cohort__err(cohort__from_nng(rv), "nng_req0_open: %s",
		    nng_strerror(rv));
		goto out_free_ev;
	}
	if ((rv = nng_socket_set_ms(
	         co->sock, NNG_OPT_REQ_RESENDTIME, NNG_DURATION_INFINITE))
	        != 0
	    || (rv = nng_socket_set_size(
	            co->sock, NNG_OPT_RECVMAXSZ, COHORT__CLIENT_RECV_MAX))
	        != 0
	    || (rv = nng_socket_set_ms(
	            co->sock, NNG_OPT_RECONNMINT, COORD_RECONN_MIN_MS))
	        != 0
	    || (rv = nng_socket_set_ms(
	            co->sock, NNG_OPT_RECONNMAXT, COORD_RECONN_MAX_MS))
	        != 0
	    || (rv = nng_pipe_notify(
	            co->sock, NNG_PIPE_EV_ADD_POST, coord_pipe_cb, co))
	        != 0
	    || (rv = nng_pipe_notify(
	            co->sock, NNG_PIPE_EV_REM_POST, coord_pipe_cb, co))
	        != 0) {
		st = cohort__err(cohort__from_nng(rv),
		    "setting up the coordinator socket: %s", nng_strerror(rv));
		goto out_close_socket;
	}
	if (cohort__tls_url(url)) {
		if ((st = coord_dial_tls(co, url)) != COHORT_OK)
			goto out_close_socket;
	} else if ((rv = nng_dial(
	                co->sock, url, &co->dialer, NNG_FLAG_NONBLOCK))
	    != 0) {
		st = cohort__err(rv == NNG_EADDRINVAL || rv == NNG_EINVAL
		            || rv == NNG_ENOTSUP
		        ? COHORT_EINVAL
		        : cohort__from_nng(rv),
		    "cannot dial the coordinator at %s: %s", url,
		    nng_strerror(rv));
		goto out_close_socket;
	}
	*out = co;
	return (COHORT_OK);

out_close_socket:
	nng_close(co->sock);
out_free_ev:
	nng_aio_stop(co->ev_aio);
	nng_aio_free(co->ev_aio);
out_destroy_ev:
	pthread_mutex_destroy(&co->ev_mtx);
out_destroy_cv:
	pthread_cond_destroy(&co->cv);
out_destroy_mtx:
	pthread_mutex_destroy(&co->mtx);
out_free:
	free(co->job);
	free(co->token);
	free(co);
	return (st);
}

/*
 * Why the coordinator cannot be reached: nng's dialer retries silently, so
 * while a worker waits for its first connection it probes the address
 * itself every COORD_PROBE_MS. A TCP connect tells refused / unreachable /
 * silent apart; when something accepts, the SP header exchange that opens
 * every nng connection tells a cohortd (a rep0 socket) from anything else
 * on that port (torch's own TCPStore, a web server) at once, instead of
 * after the whole join timeout.
 *
 * Only an answer is a verdict. Bytes that are not a rep0's header, or the
 * connection closed or reset before any byte (torch's TCPStore closes on
 * a query it does not know), say "not a cohortd": a fatal error at once.
 * Silence says nothing: a cohortd with thousands of connections in its
 * accept queue (a 10,000-rank rendezvous) completes the TCP handshake in
 * the kernel and answers only once it accepts, seconds later; so a silent
 * peer is a warning and the wait goes on to the caller's deadline, whose
 * error then says what the probe saw.
 */
#define COORD_PROBE_FIRST_MS 1000
#define COORD_PROBE_MS 3000
#define COORD_PROBE_IO_MS 1500

enum coord_probe_result {
	COORD_PROBE_SKIPPED, /* not tcp, or no time */
	COORD_PROBE_UNREACHABLE, /* connect failed: why */
	COORD_PROBE_COHORTD, /* speaks SP as a rep0 socket */
	COORD_PROBE_FOREIGN, /* accepts, but is not a cohortd: why */
	COORD_PROBE_SILENT, /* accepts, says nothing (yet): why */
	COORD_PROBE_TLS_REFUSED, /* the TLS handshake failed: why */
};

static void coord_close_socket(nng_socket sock, cohort_duration bound_ms,
    void (*after)(void *), void *arg);

/*
 * A tls+tcp:// coordinator that came up after cohort__coord_open gave up
 * its synchronous dial: nng's background dialer retries a failed
 * handshake silently, so a throw-away socket dials once, synchronously,
 * to learn the verdict (a certificate refused either way) in seconds
 * rather than at the join's timeout.
 */
static enum coord_probe_result
coord_probe_tls(const char *url, char *why, size_t len)
{
	const char *name = NULL;
	char host[256];
	nng_tls_config *tc = NULL;
	nng_socket s;
	nng_dialer d;
	int nrv;

	if (coord_tls_setup(url, host, sizeof(host), &tc, &name) != COHORT_OK)
		return (COORD_PROBE_SKIPPED);
	if (nng_req0_open(&s) != 0) {
		nng_tls_config_free(tc);
		return (COORD_PROBE_SKIPPED);
	}
	if ((nrv = nng_dialer_create(&d, s, url)) == 0
	    && (nrv = nng_dialer_set_ptr(d, NNG_OPT_TLS_CONFIG, tc)) == 0)
		nrv = nng_dialer_start(d, 0);
	nng_tls_config_free(tc);
	coord_close_socket(s, 400, NULL, NULL);
	if (nrv == 0) {
		why[0] = '\0';
		return (COORD_PROBE_COHORTD);
	}
	if (coord_tls_refused(nrv)) {
		char hint[512];
		snprintf(why, len, "%s: %s (server name '%s', CA %s)",
		    nng_strerror(nrv),
		    cohort__tls_explain(nrv, url,
		        coord_knob(COHORT__KNOB_TLS_CERT), hint, sizeof(hint)),
		    name, coord_knob(COHORT__KNOB_TLS_CA));
		return (COORD_PROBE_TLS_REFUSED);
	}
	snprintf(why, len, "%s", nng_strerror(nrv));
	return (COORD_PROBE_UNREACHABLE);
}

static bool
coord_probe_io(int fd, short ev, cohort__time end)
{
	struct pollfd pfd = { .fd = fd, .events = ev };
	int ms = cohort__remaining(end);

	return (ms > 0 && poll(&pfd, 1, ms) == 1);
}

static enum coord_probe_result
coord_probe(const char *url, cohort__time deadline, char *why, size_t len)
{
	/* nng's TCP connection header: "\0SP\0", the protocol (req0 is
	 * 0x30; its peer rep0 0x31), two reserved bytes */
	static const uint8_t req_hdr[8] = { 0, 'S', 'P', 0, 0, 0x30, 0, 0 };
	static const uint8_t rep_hdr[8] = { 0, 'S', 'P', 0, 0, 0x31, 0, 0 };
	char host[256], port[16];
	const char *p = strstr(url, "://"), *colon;
	struct addrinfo hints, *res = NULL;
	cohort__time end = cohort__now_ms() + COORD_PROBE_IO_MS;
	enum coord_probe_result r = COORD_PROBE_UNREACHABLE;
	uint8_t got[8];
	size_t have = 0;
	bool closed = false;
	cohort__time t0;
	int fd = -1, err = 0, rv;
	socklen_t sl = sizeof(err);

	if (end > deadline)
		end = deadline;
	if (cohort__tls_url(url) && !cohort__expired(end))
		return (coord_probe_tls(url, why, len));
	if (p == NULL || strncmp(url, "tcp", 3) != 0 || cohort__expired(end))
		return (COORD_PROBE_SKIPPED);
	p += 3;
	if (*p == '[') {
		const char *rb = strchr(p, ']');
		if (rb == NULL || rb[1] != ':')
			return (COORD_PROBE_SKIPPED);
		snprintf(host, sizeof(host), "%.*s", (int)(rb - p - 1), p + 1);
		colon = rb + 1;
	} else {
		if ((colon = strrchr(p, ':')) == NULL)
			return (COORD_PROBE_SKIPPED);
		snprintf(host, sizeof(host), "%.*s", (int)(colon - p), p);
	}
	snprintf(port, sizeof(port), "%s", colon + 1);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	if ((rv = getaddrinfo(host, port, &hints, &res)) != 0) {
		snprintf(why, len, "cannot resolve '%s': %s", host,
		    gai_strerror(rv));
		return (COORD_PROBE_UNREACHABLE);
	}
	fd = socket(
	    res->ai_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(why, len, "socket: %s", strerror(errno));
		goto out;
	}
	if (connect(fd, res->ai_addr, res->ai_addrlen) != 0) {
		if (errno != EINPROGRESS) {
			snprintf(why, len, "%s", strerror(errno));
			goto out;
		}
		if (!coord_probe_io(fd, POLLOUT, end)) {
			snprintf(why, len,
			    "no answer to a connection within "
			    "%.1f s (a firewall? a wrong address?)",
			    (double)COORD_PROBE_IO_MS / 1000.0);
			goto out;
		}
		if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &err, &sl) != 0
		    || err != 0) {
			snprintf(why, len, "%s", strerror(err ? err : errno));
			goto out;
		}
	}
	r = COORD_PROBE_FOREIGN;
	t0 = cohort__now_ms();
	if (send(fd, req_hdr, sizeof(req_hdr), MSG_NOSIGNAL)
	    != (ssize_t)sizeof(req_hdr)) {
		snprintf(why, len,
		    "accepts connections but closed this one at once");
		goto out;
	}
	while (have < sizeof(got) && coord_probe_io(fd, POLLIN, end)) {
		ssize_t n = recv(fd, got + have, sizeof(got) - have, 0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n <= 0) {
			closed = true;
			break;
		}
		have += (size_t)n;
	}
	if (have == sizeof(got) && memcmp(got, rep_hdr, sizeof(got)) == 0) {
		r = COORD_PROBE_COHORTD;
	} else if (have == 0 && !closed) {
		r = COORD_PROBE_SILENT;
		snprintf(why, len,
		    "it accepts connections but said nothing to nng's "
		    "greeting within %.1f s (a cohortd busy accepting "
		    "thousands of connections, or not a cohortd)",
		    (double)(cohort__now_ms() - t0) / 1000.0);
	} else if (have >= 4 && memcmp(got, rep_hdr, 4) == 0) {
		snprintf(why, len,
		    "answers as an nng socket of another protocol (0x%02x%02x)"
		    ", not as cohortd",
		    got[4], got[5]);
	} else {
		snprintf(why, len,
		    "accepts connections but is not a cohortd (%s); is this "
		    "the port of torch's TCPStore or another service? "
		    "cohortd's is the one of --listen (default 29400)",
		    have == 0 ? "it closed the connection at nng's greeting"
		              : "it answered nng's greeting with other bytes");
	}
out:
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return (r);
}

cohort_status
cohort__coord_wait_connected(struct cohort__coord *co, cohort__time deadline)
{
	cohort_status st = COHORT_OK;
	cohort__time start = cohort__now_ms();
	cohort__time next_probe = start + COORD_PROBE_FIRST_MS;
	int silent = 0; /* probes in a row that found the port silent */
	char why[512] = "";

	(void)coord_lock(co, false);
	while (!co->connected && !co->closing) {
		cohort__time until
		    = next_probe < deadline ? next_probe : deadline;
		enum coord_probe_result r;

		int wrv = cohort__cond_wait_until(&co->cv, &co->mtx, until);

		coord_ev_apply_locked(co);
		if (wrv == ETIMEDOUT && until == deadline) {
			if (!co->connected)
				st = cohort__err(COHORT_ENOCOORD,
				    "cannot reach the coordinator at %s%s%s",
				    co->url, why[0] ? ": " : "", why);
			break;
		}
		if (co->connected || co->closing
		    || cohort__now_ms() < next_probe)
			continue;
		/* probe without the lock: the pipe callback needs it */
		pthread_mutex_unlock(&co->mtx);
		r = coord_probe(co->url, deadline, why, sizeof(why));
		(void)coord_lock(co, false);
		/* a silent port took the connection: a probe now and then
		 * can still catch it answering with other bytes, but every
		 * one is another connection in a busy cohortd's queue */
		silent = r == COORD_PROBE_SILENT ? silent + 1 : 0;
		next_probe = cohort__now_ms()
		    + ((cohort_duration)COORD_PROBE_MS
		        << (silent < 4 ? silent : 4));
		if (co->connected)
			break;
		if (r == COORD_PROBE_TLS_REFUSED) {
			st = cohort__err(COHORT_EAUTH,
			    "TLS connection to the coordinator at %s failed: "
			    "%s",
			    co->url, why);
			break;
		}
		if (r == COORD_PROBE_FOREIGN) {
			st = cohort__err(
			    COHORT_ENOCOORD, "%s %s", co->url, why);
			break;
		}
		if (r == COORD_PROBE_UNREACHABLE)
			cohort__warn("cannot reach the coordinator at %s yet: "
			             "%s (%.0f s so far; retrying)",
			    co->url, why,
			    (double)(cohort__now_ms() - start) / 1000.0);
		else if (r == COORD_PROBE_SILENT)
			cohort__warn("the coordinator at %s has not answered "
			             "yet: %s (%.0f s so far; waiting until "
			             "the deadline)",
			    co->url, why,
			    (double)(cohort__now_ms() - start) / 1000.0);
		else if (r == COORD_PROBE_COHORTD)
			why[0] = '\0';
	}
	if (st == COHORT_OK && co->closing)
		st = cohort__err(COHORT_ECLOSED, "client is closing");
	pthread_mutex_unlock(&co->mtx);
	return (st);
}

/*
 * nng_close is bounded here: the socket is closed in a helper thread and
 * waited for up to bound_ms; past that the close is left to finish in the
 * background and the caller goes on (closing a client must never hang the
 * training program). A close finishes only once nng's one reaper thread
 * has destroyed the socket's pipes, and on a starved machine (the bench's
 * simulated hosts) the reaper and the threads it waits for may not run
 * for seconds. after(arg), if given, runs once nng_close has returned:
 * here, or in the helper when the close was left behind. Whatever nng may
 * still call back into (the engine, for a pipe notification already on
 * its way) must live until then; freeing it at the bound instead let a
 * late notification lock freed memory, stall in nng's connect task, and
 * the reaper wait forever for that pipe: every later close of the process
 * hung (157 threads in nng_close in one simulated host).
 */
struct coord_closer {
	nng_socket sock;
	void (*after)(void *);
	void *arg;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	bool done;
	bool abandoned;
};

static void *
coord_closer_main(void *arg)
{
	struct coord_closer *cl = arg;
	bool abandoned;

	nng_close(cl->sock);
	pthread_mutex_lock(&cl->mtx);
	cl->done = true;
	abandoned = cl->abandoned;
	pthread_cond_broadcast(&cl->cv);
	pthread_mutex_unlock(&cl->mtx);
	if (abandoned) {
		cohort__debug("a connection to cohortd left closing in the "
		              "background is closed now");
		if (cl->after != NULL)
			cl->after(cl->arg);
		pthread_cond_destroy(&cl->cv);
		pthread_mutex_destroy(&cl->mtx);
		free(cl);
	}
	return (NULL);
}

static void
coord_close_socket(nng_socket sock, cohort_duration bound_ms,
    void (*after)(void *), void *arg)
{
	struct coord_closer *cl = calloc(1, sizeof(*cl));
	pthread_attr_t attr;
	pthread_t tid;
	cohort__time deadline = cohort__now_ms() + bound_ms;
	bool done;

	if (cl == NULL) {
		nng_close(sock);
		if (after != NULL)
			after(arg);
		return;
	}
	cl->sock = sock;
	cl->after = after;
	cl->arg = arg;
	pthread_mutex_init(&cl->mtx, NULL);
	cohort__cond_init(&cl->cv);
	pthread_attr_init(&attr);
	pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
	if (pthread_create(&tid, &attr, coord_closer_main, cl) != 0) {
		pthread_attr_destroy(&attr);
		pthread_cond_destroy(&cl->cv);
		pthread_mutex_destroy(&cl->mtx);
		free(cl);
		nng_close(sock);
		if (after != NULL)
			after(arg);
		return;
	}
	pthread_attr_destroy(&attr);
	pthread_mutex_lock(&cl->mtx);
	while (!cl->done
	    && cohort__cond_wait_until(&cl->cv, &cl->mtx, deadline) == 0)
		;
	done = cl->done;
	if (!done)
		cl->abandoned = true;
	pthread_mutex_unlock(&cl->mtx);
	if (done) {
		pthread_cond_destroy(&cl->cv);
		pthread_mutex_destroy(&cl->mtx);
		free(cl);
		if (after != NULL)
			after(arg);
	} else {
		cohort__warn(
		    "closing the connection to cohortd did not finish "
		    "in %d ms (nng 1.5 close race: its reaper thread is "
		    "behind); left to finish in the background",
		    (int)bound_ms);
	}
}

/* Frees the engine once its socket is closed (no nng callback left). */
static void
coord_free(void *arg)
{
	struct cohort__coord *co = arg;

	/* the pipe events' retry: nothing arms it any more */
	nng_aio_stop(co->ev_aio);
	nng_aio_free(co->ev_aio);
	pthread_mutex_destroy(&co->ev_mtx);
	pthread_cond_destroy(&co->cv);
	pthread_mutex_destroy(&co->mtx);
	free(co->job);
	free(co->token);
	free(co);
}

void
cohort__coord_close(struct cohort__coord *co)
{
	struct cohort__coord_call *call;

	if (co == NULL)
		return;
	(void)coord_lock(co, false);
	/* After a Leave, let cohortd close the connection first (see
	 * cohort__coord_prepare_close); bounded. */
	if (co->leaving) {
		cohort__time until = cohort__now_ms() + 400;
		while (co->up
		    && cohort__cond_wait_until(&co->cv, &co->mtx, until) == 0)
			coord_ev_apply_locked(co);
	}
	co->closing = true;
	for (call = co->pending; call != NULL; call = call->next)
		if (call->aio != NULL)
			nng_aio_abort(call->aio, NNG_ECLOSED);
	pthread_cond_broadcast(&co->cv);
	pthread_mutex_unlock(&co->mtx);
	nng_pipe_notify(co->sock, NNG_PIPE_EV_ADD_POST, NULL, NULL);
	nng_pipe_notify(co->sock, NNG_PIPE_EV_REM_POST, NULL, NULL);
	while (co->idle != NULL) {
		struct coord_slot *sl = co->idle;
		co->idle = sl->next;
		coord_slot_free(sl);
	}
	/* a notification already on its way may still come: co lives until
	 * nng_close has returned (coord_free) */
	coord_close_socket(co->sock, COHORT__CLOSE_TIMEOUT_MS, coord_free, co);
}

void
cohort__coord_prepare_close(struct cohort__coord *co)
{
	(void)coord_lock(co, false);
	co->leaving = true;
	pthread_mutex_unlock(&co->mtx);
	/* no reconnection once cohortd closes the connection */
	(void)nng_dialer_set_ms(co->dialer, NNG_OPT_RECONNMINT, 3600000);
	(void)nng_dialer_set_ms(co->dialer, NNG_OPT_RECONNMAXT, 3600000);
}

void
cohort__coord_drop(struct cohort__coord *co, const char *why)
{
	(void)coord_lock(co, false);
	coord_set_lost_locked(co, why);
	pthread_mutex_unlock(&co->mtx);
	/* No re-dial, and the pipe goes: cohortd sees the connection close.
	 * The socket itself stays until cohort__coord_close. */
	nng_dialer_close(co->dialer);
}

void
cohort__coord_set_reconnect_window(
    struct cohort__coord *co, cohort_duration ms)
{
	(void)coord_lock(co, false);
	co->reconnect_ms = ms;
	pthread_mutex_unlock(&co->mtx);
}

void
cohort__coord_set_member(
    struct cohort__coord *co, int32_t rank, uint64_t generation)
{
	(void)coord_lock(co, false);
	co->rank = rank;
	co->generation = generation;
	pthread_mutex_unlock(&co->mtx);
}

/* Lost for good, and up: under co->mtx, which it takes (with try, only
 * when free: false, nothing read). */
static bool
coord_state(struct cohort__coord *co, bool try, bool *lost, bool *up)
{
	if (!coord_lock(co, try))
		return (false);
	*lost = coord_window_over_locked(co, cohort__now_ms());
	*up = co->up && !co->lost;
	pthread_mutex_unlock(&co->mtx);
	return (true);
}

bool
cohort__coord_lost(struct cohort__coord *co)
{
	bool lost, up;

	(void)coord_state(co, false, &lost, &up);
	return (lost);
}

bool
cohort__coord_try_state(struct cohort__coord *co, bool *lost, bool *up)
{
	return (coord_state(co, true, lost, up));
}

bool
cohort__coord_up(struct cohort__coord *co)
{
	bool up;

	(void)coord_lock(co, false);
	up = co->up && !co->lost;
	pthread_mutex_unlock(&co->mtx);
	return (up);
}

/* ------------------------------------------------------------------------ */
/* Synchronous calls                                                        */
/* ------------------------------------------------------------------------ */

void
cohort__coord_call_init(struct cohort__coord_call *call, Cohort__Request *req,
    cohort__time deadline)
{
	memset(call, 0, sizeof(*call));
	call->req = req;
	call->deadline = deadline;
}

cohort_status
cohort__coord_request(struct cohort__coord *co,
    struct cohort__coord_call *call, Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, cohort__time deadline)
{
	cohort__coord_call_init(call, req, deadline);
	call->parts = parts;
	call->nparts = nparts;
	return (cohort__coord_call(co, call));
}

const void *
cohort__coord_reply_body(
    const struct cohort__coord_call *call, Cohort__Reply__BodyCase want)
{
	/* Every member of the body union is a pointer to a message, and
	 * pointers to structures share one representation: reading one
	 * member tells whether the body is present. */
	if (call->rep == NULL || call->rep->body_case != want)
		return (NULL);
	return (call->rep->join);
}

void
cohort__coord_call_fini(struct cohort__coord_call *call)
{
	if (call->rep != NULL)
		cohort__reply__free_unpacked(call->rep, NULL);
	if (call->reply_msg != NULL)
		nng_msg_free(call->reply_msg);
	call->rep = NULL;
	call->reply_msg = NULL;
	call->payload = NULL;
	call->plen = 0;
}

void
cohort__coord_call_abort(struct cohort__coord *co,
    struct cohort__coord_call *call, cohort_status why)
{
	(void)coord_lock(co, false);
	if (!call->aborted) {
		call->aborted = true;
		call->abort_st = why;
		if (call->aio != NULL)
			nng_aio_abort(call->aio, NNG_ECANCELED);
		pthread_cond_broadcast(&co->cv);
	}
	pthread_mutex_unlock(&co->mtx);
}

/* One step (send or receive) on the call's context; under co->mtx, which
 * is released while the step runs. Returns nng's result. */
static int
coord_step(struct cohort__coord *co, struct cohort__coord_call *call,
    struct coord_slot *sl, nng_msg *msg)
{
	nng_aio *aio = sl->aio;

	nng_aio_set_timeout(aio, coord_wait_ms(call->deadline));
	if (msg != NULL) {
		nng_aio_set_msg(aio, msg);
		nng_ctx_send(sl->ctx, aio);
	} else {
		/* A reply that arrived already completes the receive here,
		 * at once: it wins over an abort that came in the meantime
		 * (the peer's failure right after the barrier completed must
		 * not undo the barrier). Else the abort applies now. */
		nng_ctx_recv(sl->ctx, aio);
		if (coord_check_locked(co, call) != COHORT_OK)
			nng_aio_abort(aio, NNG_ECANCELED);
	}
	pthread_mutex_unlock(&co->mtx);
	nng_aio_wait(aio);
	(void)coord_lock(co, false);
	return (nng_aio_result(aio));
}

void
cohort__coord_set_limits(
    struct cohort__coord *co, uint64_t max_value, uint64_t max_frame)
{
	if (max_value > 0)
		atomic_store(&co->max_value, max_value);
	if (max_frame > 0)
		atomic_store(&co->max_frame, max_frame);
}

uint64_t
cohort__coord_max_value(struct cohort__coord *co)
{
	return (atomic_load(&co->max_value));
}

cohort_status
cohort__coord_call(struct cohort__coord *co, struct cohort__coord_call *call)
{
	struct coord_slot *sl = NULL;
	nng_msg *msg = NULL;
	cohort_status st;
	int rv;

	cohort__coord_call_fini(call);
	if ((st = coord_slot_get(co, &sl)) != COHORT_OK)
		return (st);
	(void)coord_lock(co, false);
	call->aio = sl->aio;
	call->resend = false;
	coord_link(co, call);
	for (;;) {
		if ((st = coord_wait_up_locked(co, call)) != COHORT_OK)
			break;
		/* (Re)pack with the time left: cohortd parks a re-sent
		 * request no longer than the caller still waits. */
		pthread_mutex_unlock(&co->mtx);
		coord_fill(co, call);
		st = cohort__wire_pack_request_max(call->req, call->parts,
		    call->nparts, (size_t)atomic_load(&co->max_frame), &msg);
		if (st == COHORT_ETOOBIG) {
			/* cohort__err writes the buffer it would read */
			char why[COHORT__DETAIL_MAX];

			cohort__strlcpy(why, cohort_last_error(), sizeof(why));
			cohort__err(st,
			    "%s (cohortd's --max-value-bytes is %" PRIu64 ")",
			    why, atomic_load(&co->max_value));
		}
		(void)coord_lock(co, false);
		if (st != COHORT_OK)
			break;
		if ((st = coord_check_locked(co, call)) != COHORT_OK)
			break;
		if (!co->up) {
			nng_msg_free(msg);
			msg = NULL;
			continue;
		}
		call->resend = false;
		call->sent_epoch = co->epoch;
		call->sends++;
		if (call->sends > 1)
			cohort__debug("re-sending request seq %" PRIu64
			              " to the coordinator at %s (try %u)",
			    call->seq, co->url, call->sends);
		rv = coord_step(co, call, sl, msg);
		if (rv != 0) {
			/* nng did not take the message */
			if ((msg = nng_aio_get_msg(sl->aio)) != NULL)
				nng_msg_free(msg);
			nng_aio_set_msg(sl->aio, NULL);
			msg = NULL;
			if (coord_check_locked(co, call) == COHORT_OK
			    && (call->resend || coord_conn_error(rv)))
				continue;
			st = coord_step_error(co, call, rv, "sending");
			break;
		}
		msg = NULL; /* nng took it */
		if (call->resend)
			continue;
		rv = coord_step(co, call, sl, NULL);
		if (rv == 0) {
			msg = nng_aio_get_msg(sl->aio);
			nng_aio_set_msg(sl->aio, NULL);
			coord_unlink(co, call);
			pthread_mutex_unlock(&co->mtx);
			coord_slot_put(co, sl, true);
			return (coord_unpack(call, msg));
		}
		if (coord_check_locked(co, call) == COHORT_OK
		    && (call->resend || coord_conn_error(rv)))
			continue;
		st = coord_step_error(co, call, rv, "waiting for the reply");
		break;
	}
	coord_unlink(co, call);
	pthread_mutex_unlock(&co->mtx);
	if (msg != NULL)
		nng_msg_free(msg);
	/* the context may hold a request in flight: do not reuse it */
	coord_slot_put(co, sl, false);
	return (st);
}

/* ------------------------------------------------------------------------ */
/* Asynchronous calls                                                       */
/* ------------------------------------------------------------------------ */

/* Ends the call in progress on a and hands the reply to the callback.
 * Called without co->mtx; st is the status when rv == 0 does not apply. */
static void
coord_async_finish(
    struct cohort__coord_async *a, cohort_status st, nng_msg *reply)
{
	struct cohort__coord *co = a->co;
	struct cohort__coord_call done;
	char detail[512];

	cohort__strlcpy(detail, cohort_last_error(), sizeof(detail));
	(void)coord_lock(co, false);
	coord_unlink(co, &a->call);
	a->state = COORD_IDLE;
	done = a->call;
	memset(&a->call, 0, sizeof(a->call));
	if (a->tmpl != NULL) {
		nng_msg_free(a->tmpl);
		a->tmpl = NULL;
	}
	pthread_mutex_unlock(&co->mtx);
	if (reply != NULL)
		st = coord_unpack(&done, reply);
	else if (st != COHORT_OK)
		cohort__err(st, "%s", detail);
	else
		/* never OK without a reply: a callback may read it */
		st = cohort__err(COHORT_EPROTO, "no reply");
	a->cb(a->arg, st, &done);
	cohort__coord_call_fini(&done);
}

/* A copy of the request with a fresh timeout_ms. */
static nng_msg *
coord_async_copy(struct cohort__coord_async *a)
{
	Cohort__Request *req;
	const uint8_t *pl;
	size_t plen;
	nng_msg *dup = NULL, *out = NULL;

	if (nng_msg_dup(&dup, a->tmpl) != 0)
		return (NULL);
	if (a->call.sends == 0)
		return (dup);
	if (cohort__wire_unpack_request(dup, &req, &pl, &plen) != COHORT_OK) {
		nng_msg_free(dup);
		return (NULL);
	}
	req->timeout_ms = coord_park_ms(a->call.deadline);
	(void)cohort__wire_pack_request(req, NULL, 0, &out);
	cohort__request__free_unpacked(req, NULL);
	nng_msg_free(dup);
	return (out);
}

/* Starts the next step of a (send when connected, else wait); under
 * co->mtx. Returns an error status when the call must end instead. */
static cohort_status
coord_async_next_locked(struct cohort__coord_async *a)
{
	struct cohort__coord *co = a->co;
	cohort__time now = cohort__now_ms();
	nng_msg *msg;
	cohort_status st;

	if (a->stopped)
		return (cohort__err(COHORT_ECLOSED, "async call stopped"));
	if ((st = coord_check_locked(co, &a->call)) != COHORT_OK)
		return (st);
	if (!co->up) {
		if (coord_window_over_locked(co, now))
			return (coord_check_locked(co, &a->call));
		if (now >= coord_call_end(&a->call))
			return (cohort__err(COHORT_ENOCOORD,
			    "the connection to the coordinator at %s is down",
			    co->url));
		a->state = COORD_WAIT;
		nng_sleep_aio(COORD_POLL_MS, a->aio);
		return (COHORT_OK);
	}
	if ((msg = coord_async_copy(a)) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	a->state = COORD_SEND;
	a->call.resend = false;
	a->call.sent_epoch = co->epoch;
	a->call.sends++;
	/* No nng timeout: cohort__coord_async_tick ends it (see there) */
	nng_aio_set_timeout(a->aio, NNG_DURATION_INFINITE);
	nng_aio_set_msg(a->aio, msg);
	nng_ctx_send(a->ctx, a->aio);
	return (COHORT_OK);
}

static void
coord_async_cb(void *arg)
{
	struct cohort__coord_async *a = arg;
	struct cohort__coord *co = a->co;
	nng_msg *msg;
	cohort_status st = COHORT_OK;
	int rv = nng_aio_result(a->aio);

	if (a->deferred) {
		/* the short sleep below ended (or an abort cut it short): the
		 * completion it kept is the one to take up */
		a->deferred = false;
		rv = a->deferred_rv;
		nng_aio_set_msg(a->aio, a->deferred_msg);
		a->deferred_msg = NULL;
	}
	/*
	 * Never wait for the engine's lock on nng's thread: a client thread
	 * holds it across its own nng calls, and on a starved machine a
	 * preempted holder may not run again for seconds. nng runs every
	 * callback of the process on a few threads (4 on 2 cores): four of
	 * them blocked here stop every heartbeat and reply of every client
	 * in the process, and cohortd declares them all dead (seen with
	 * 10,000 simulated clients). Busy: keep the completion, sleep on
	 * the same aio (COORD_DEFER_MS, backing off), and look again.
	 */
	if (atomic_load_explicit(&a->stopping, memory_order_acquire))
		(void)coord_lock(co, false);
	else if (!coord_lock(co, true)) {
		unsigned shift = a->deferrals < COORD_DEFER_MAX_SHIFT
		    ? a->deferrals++
		    : COORD_DEFER_MAX_SHIFT;

		a->deferred = true;
		a->deferred_rv = rv;
		a->deferred_msg = nng_aio_get_msg(a->aio);
		nng_aio_set_msg(a->aio, NULL);
		nng_sleep_aio((nng_duration)(COORD_DEFER_MS << shift), a->aio);
		return;
	}
	a->deferrals = 0;
	switch (a->state) {
	case COORD_WAIT:
		st = coord_async_next_locked(a);
		break;
	case COORD_SEND:
		if (rv != 0) {
			if ((msg = nng_aio_get_msg(a->aio)) != NULL)
				nng_msg_free(msg);
			nng_aio_set_msg(a->aio, NULL);
			if (!a->stopped
			    && coord_check_locked(co, &a->call) == COHORT_OK
			    && (a->call.resend || coord_conn_error(rv)))
				st = coord_async_next_locked(a);
			else if (a->stopped)
				st = cohort__err(
				    COHORT_ECLOSED, "async call stopped");
			else
				st = coord_step_error(
				    co, &a->call, rv, "sending");
			break;
		}
		if (a->call.resend) {
			st = coord_async_next_locked(a);
			break;
		}
		st = a->stopped
		    ? cohort__err(COHORT_ECLOSED, "async call stopped")
		    : coord_check_locked(co, &a->call);
		if (st == COHORT_OK) {
			a->state = COORD_RECV;
			nng_aio_set_timeout(a->aio, NNG_DURATION_INFINITE);
			nng_ctx_recv(a->ctx, a->aio);
		}
		break;
	case COORD_RECV:
		if (rv == 0 && (msg = nng_aio_get_msg(a->aio)) != NULL) {
			nng_aio_set_msg(a->aio, NULL);
			pthread_mutex_unlock(&co->mtx);
			coord_async_finish(a, COHORT_OK, msg);
			return;
		}
		if (rv == 0) /* no message after all: as a broken step */
			rv = NNG_ECONNSHUT;
		if (!a->stopped
		    && coord_check_locked(co, &a->call) == COHORT_OK
		    && (a->call.resend || coord_conn_error(rv)))
			st = coord_async_next_locked(a);
		else
			st = a->stopped
			    ? cohort__err(COHORT_ECLOSED, "async call stopped")
			    : coord_step_error(
			        co, &a->call, rv, "waiting for the reply");
		break;
	case COORD_IDLE:
		pthread_mutex_unlock(&co->mtx);
		return;
	}
	pthread_mutex_unlock(&co->mtx);
	if (st != COHORT_OK)
		coord_async_finish(a, st, NULL);
}

cohort_status
cohort__coord_async_alloc(struct cohort__coord *co, cohort__coord_done cb,
    void *arg, struct cohort__coord_async **out)
{
	struct cohort__coord_async *a;
	cohort_status st;

	if ((a = calloc(1, sizeof(*a))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	a->co = co;
	atomic_init(&a->starting, false);
	atomic_init(&a->stopping, false);
	a->cb = cb;
	a->arg = arg;
	if ((st = coord_ctx_open(co, &a->aio, &a->ctx, coord_async_cb, a))
	    != COHORT_OK) {
		free(a);
		return (st);
	}
	*out = a;
	return (COHORT_OK);
}

/* cohort__coord_async_start; with try, *busy and nothing started when
 * the engine's lock is held by another thread (whose holder a starved
 * machine may not run for a while: the caller must not wait behind it). */
static cohort_status
coord_async_start_owned(struct cohort__coord_async *a, Cohort__Request *req,
    cohort__time deadline, bool try, bool *busy)
{
	struct cohort__coord *co = a->co;
	nng_msg *msg;
	cohort_status st;

	*busy = false;
	if (!coord_lock(co, try)) {
		*busy = true;
		return (COHORT_OK);
	}
	if (a->state != COORD_IDLE)
		st = cohort__err(COHORT_ESTATE, "async call already running");
	else if (a->stopped)
		st = cohort__err(COHORT_ECLOSED, "async call stopped");
	else
		st = COHORT_OK;
	pthread_mutex_unlock(&co->mtx);
	if (st != COHORT_OK)
		return (st);

	cohort__coord_call_init(&a->call, req, deadline);
	if (!coord_fill_try(co, &a->call, try)) {
		*busy = true;
		return (COHORT_OK);
	}
	st = cohort__wire_pack_request(req, NULL, 0, &msg);
	a->call.req = NULL; /* the caller's; packed now */
	if (st != COHORT_OK)
		return (st);

	if (!coord_lock(co, try)) {
		nng_msg_free(msg);
		*busy = true;
		return (COHORT_OK);
	}
	if (a->stopped)
		st = cohort__err(COHORT_ECLOSED, "async call stopped");
	else
		st = coord_check_locked(co, &a->call);
	if (st != COHORT_OK) {
		pthread_mutex_unlock(&co->mtx);
		nng_msg_free(msg);
		return (st);
	}
	a->tmpl = msg;
	a->call.aio = a->aio;
	coord_link(co, &a->call);
	if ((st = coord_async_next_locked(a)) != COHORT_OK) {
		coord_unlink(co, &a->call);
		a->state = COORD_IDLE;
		nng_msg_free(a->tmpl);
		a->tmpl = NULL;
	}
	pthread_mutex_unlock(&co->mtx);
	return (st);
}

/* Only one thread starts a call at a time. The completion callback may
 * start the next call (the fault poll does) while the heartbeat thread's
 * tick tries to start the same one; both saw COORD_IDLE before either
 * sent, and two sends on one aio abort the process inside nng ("aio->
 * a_cancel_fn == NULL"), seen at 10,000 simulated clients. The one that
 * loses is told the call is running (COHORT_ESTATE). */
static cohort_status
coord_async_start(struct cohort__coord_async *a, Cohort__Request *req,
    cohort__time deadline, bool try, bool *busy)
{
	cohort_status st;

	*busy = false;
	if (atomic_exchange_explicit(&a->starting, true, memory_order_acquire))
		return (
		    cohort__err(COHORT_ESTATE, "async call being started"));
	st = coord_async_start_owned(a, req, deadline, try, busy);
	atomic_store_explicit(&a->starting, false, memory_order_release);
	return (st);
}

cohort_status
cohort__coord_async_start(
    struct cohort__coord_async *a, Cohort__Request *req, cohort__time deadline)
{
	bool busy;

	return (coord_async_start(a, req, deadline, false, &busy));
}

cohort_status
cohort__coord_async_try_start(struct cohort__coord_async *a,
    Cohort__Request *req, cohort__time deadline, bool *busy)
{
	return (coord_async_start(a, req, deadline, true, busy));
}

/*
 * Why asynchronous calls have no nng timeout: nng 1.5 keeps every aio
 * that has one on a list that its expiry thread walks whole each time the
 * earliest of them comes due. A process of many clients (the bench's
 * simulated hosts: 156 clients each) had a heartbeat, a Watch and a fault
 * poll per client on it, each due at least once a second: the walks took
 * a third of two cores at 10,000 idle clients and starved the heartbeats
 * themselves. The owner's periodic timer (the heartbeat's) ends a call
 * that ran past its deadline plus the reply grace instead: at most one
 * period late, and nothing on the list but that timer.
 */
void
cohort__coord_async_tick(struct cohort__coord_async *a, cohort__time now)
{
	struct cohort__coord *co;

	if (a == NULL)
		return;
	co = a->co;
	/* busy: the next tick looks again */
	if (!coord_lock(co, true))
		return;
	if ((a->state == COORD_SEND || a->state == COORD_RECV)
	    && now >= coord_call_end(&a->call))
		nng_aio_abort(a->aio, NNG_ETIMEDOUT);
	pthread_mutex_unlock(&co->mtx);
}

void
cohort__coord_async_stop(struct cohort__coord_async *a)
{
	atomic_store_explicit(&a->stopping, true, memory_order_release);
	(void)coord_lock(a->co, false);
	a->stopped = true;
	pthread_mutex_unlock(&a->co->mtx);
	nng_aio_stop(a->aio);
	/* The stop came between a deferral and its sleep (coord_async_cb):
	 * nng started no sleep on the stopped aio and runs no more
	 * callbacks, so the call ends here, unreported, like a stopped one. */
	if (a->deferred) {
		(void)coord_lock(a->co, false);
		coord_unlink(a->co, &a->call);
		a->state = COORD_IDLE;
		pthread_mutex_unlock(&a->co->mtx);
		a->deferred = false;
		if (a->deferred_msg != NULL)
			nng_msg_free(a->deferred_msg);
		a->deferred_msg = NULL;
	}
}

void
cohort__coord_hold(struct cohort__coord *co, bool hold)
{
	if (hold)
		pthread_mutex_lock(&co->mtx);
	else
		pthread_mutex_unlock(&co->mtx);
}

void
cohort__coord_async_free(struct cohort__coord_async *a)
{
	if (a == NULL)
		return;
	cohort__coord_async_stop(a);
	nng_ctx_close(a->ctx);
	nng_aio_free(a->aio);
	if (a->deferred_msg != NULL)
		nng_msg_free(a->deferred_msg);
	if (a->tmpl != NULL)
		nng_msg_free(a->tmpl);
	free(a);
}
