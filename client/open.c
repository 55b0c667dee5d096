/*
 * open.c - cohort_client_open and _close: connect, join, liveness, leave.
 *
 * Liveness: the process's one heartbeat thread (heartbeat.c; a process
 * may hold hundreds of clients) calls client_hb_tick every
 * heartbeat_ms at a fixed rate, whenever replies come: it ends the async
 * calls that ran past their deadlines (cohort__coord_async_tick) and
 * sends a Heartbeat through an async call, whose completion runs on
 * nng's threads; a Watch long poll is parked at cohortd and re-issued
 * when it returns.
 * Whichever hears first that a peer failed (EPEERLOST, healthy = false,
 * a newer generation) fails the client, whose every group then aborts the
 * operations blocked on it (client.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"
#include "collectives.h"
#include "fault.h"

/* How long cohortd may park one Watch before answering "no event". */
#define CLIENT_WATCH_MS 60000
/* A Watch that returns sooner than this without news is re-issued only
 * after CLIENT_WATCH_BACKOFF_MS (no busy loop against a confused server). */
#define CLIENT_WATCH_QUICK_MS 50
#define CLIENT_WATCH_BACKOFF_MS 1000
/* A Watch that could not start because a client thread held the engine's
 * lock starts again through the timer this much later. */
#define CLIENT_WATCH_BUSY_MS 2

/* A negative duration (forever) is longer than any other. */
static int64_t
client_dur(cohort_duration d)
{
	return (d < 0 ? INT64_MAX : (int64_t)d);
}

cohort_status
cohort__timeouts_check(const cohort_options *opts, char *why, size_t len)
{
	int64_t op = client_dur(opts->op_timeout);
	int64_t join = opts->join_timeout == COHORT_WAIT_DEFAULT
	    ? op
	    : client_dur(opts->join_timeout);

	if (opts->heartbeat_interval <= 0
	    || opts->dead_after <= opts->heartbeat_interval) {
		snprintf(why, len,
		    "need 0 < heartbeat interval (%d ms) < dead-after (%d ms)",
		    opts->heartbeat_interval, opts->dead_after);
		return (COHORT_EINVAL);
	}
	if (op <= opts->dead_after) {
		snprintf(why, len,
		    "the operation timeout (%d ms) must be longer than "
		    "dead-after (%d ms), or real failures would look like "
		    "timeouts",
		    opts->op_timeout, opts->dead_after);
		return (COHORT_EINVAL);
	}
	if (opts->reconnect_window >= 0 && opts->reconnect_window > op) {
		snprintf(why, len,
		    "the reconnect window (%d ms) must not be longer than the "
		    "operation timeout (%d ms)",
		    opts->reconnect_window, opts->op_timeout);
		return (COHORT_EINVAL);
	}
	if (join < op) {
		snprintf(why, len,
		    "the rendezvous timeout (%d ms) must not be shorter than "
		    "the operation timeout (%d ms)",
		    opts->join_timeout, opts->op_timeout);
		return (COHORT_EINVAL);
	}
	snprintf(why, len, "ok");
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Liveness: heartbeat timer and Watch                                      */
/* ------------------------------------------------------------------------ */

/* One heartbeat of c (the process's heartbeat thread, heartbeat.c);
 * false when a lock it needs was busy. */
static bool
client_hb_tick(struct cohort_client *c)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;
	char last_group[COHORT__GROUP_ID_MAX];
	struct cohort__obs_msg om;
	cohort_status st;

	bool busy;

	if (atomic_load(&c->closing))
		return (true);
	/* Never waits for a lock a client thread holds: on a starved
	 * machine a preempted holder may not run again for seconds, and
	 * this thread beats for every client of the process. Busy: the
	 * heartbeat thread tries again a round later. */
	/* the asynchronous calls' deadlines (cohort__coord_async_tick) */
	cohort__coord_async_tick(c->hb, cohort__now_ms());
	cohort__coord_async_tick(c->watch, cohort__now_ms());
	if (!cohort__client_doing_try(c, &hb, last_group, sizeof(last_group)))
		return (false);
	if (cohort__obs_fill(&c->obs, &om))
		hb.metrics = &om.m;
	req.body_case = COHORT__REQUEST__BODY_HEARTBEAT;
	req.heartbeat = &hb;
	c->obs.hb_sent_ns = cohort__now_ns();
	st = cohort__coord_async_try_start(
	    c->hb, &req, cohort__now_ms() + c->heartbeat_ms, &busy);
	if (busy)
		return (false);
	cohort__fault_tick(c->fault);
	/* At a fixed rate, whenever the replies come: one late reply (a
	 * busy cohortd, starved threads) does not push the next beat back.
	 * ESTATE: the previous one is still out, this period's is skipped. */
	if (st != COHORT_OK && st != COHORT_ESTATE)
		cohort__debug("heartbeat not sent: %s: %s",
		    cohort_status_name(st), cohort_last_error());
	return (true);
}

static void
client_hb_done(void *arg, cohort_status st, struct cohort__coord_call *call)
{
	struct cohort_client *c = arg;
	const Cohort__Reply *rep = call->rep;

	if (atomic_load(&c->closing))
		return;
	if (st == COHORT_OK && rep == NULL)
		st = COHORT_EPROTO; /* never happens: the engine says so */
	if (st == COHORT_OK && c->obs.hb_sent_ns != 0)
		cohort__obs_rtt(&c->obs, cohort__now_ns() - c->obs.hb_sent_ns);
	switch (st) {
	case COHORT_OK:
		/* a failed job: fan out, and keep beating (this member is
		 * alive; cohortd should not declare it dead as well) */
		if (rep->body_case == COHORT__REPLY__BODY_HEARTBEAT
		    && rep->heartbeat != NULL && !rep->heartbeat->healthy
		    && atomic_load(&c->error) == COHORT_OK)
			cohort__client_job_failed(c, COHORT_EPEERLOST, rep);
		/* elastic: a newer generation (a member lost, members
		 * admitted) reaches even a rank that is in no call */
		else if (rep->body_case == COHORT__REPLY__BODY_HEARTBEAT
		    && rep->heartbeat != NULL)
			(void)cohort__client_generation_moved(
			    c, rep->heartbeat->generation);
		break;
	case COHORT_EPEERLOST:
	case COHORT_ESTALE:
		if (atomic_load(&c->error) == COHORT_OK)
			cohort__client_job_failed(c, st, rep);
		break;
	case COHORT_EMEMBERSHIP:
		cohort__client_job_failed(c, st, rep);
		break;
	case COHORT_ECLOSED:
		return;
	case COHORT_ENOCOORD: {
		bool lost, up;

		/* on nng's thread: never wait for the engine's lock (busy:
		 * the next beat's answer says it) */
		if (!cohort__coord_try_state(c->coord, &lost, &up) || lost)
			return;
		/* reconnecting: the engine says so once */
		if (up)
			cohort__warn("heartbeat: %s", cohort_last_error());
		break;
	}
	default:
		cohort__warn("heartbeat refused: %s: %s",
		    cohort_status_name(st), cohort_last_error());
		break;
	}
	/* the next beat is the process's timer's (heartbeat.c) */
}

static void
client_watch_start(struct cohort_client *c)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Watch w = COHORT__WATCH__INIT;
	cohort_status st;
	bool busy;

	if (atomic_load(&c->closing))
		return;
	req.body_case = COHORT__REQUEST__BODY_WATCH;
	req.watch = &w;
	c->watch_started = cohort__now_ms();
	/* Mostly on nng's thread (the timer, the last Watch's callback),
	 * which must never wait for the engine's lock: busy, the timer
	 * tries again in a moment. */
	st = cohort__coord_async_try_start(
	    c->watch, &req, c->watch_started + CLIENT_WATCH_MS, &busy);
	if (busy) {
		nng_sleep_aio(CLIENT_WATCH_BUSY_MS, c->watch_timer);
		return;
	}
	if (st != COHORT_OK)
		cohort__debug("watch stopped: %s: %s", cohort_status_name(st),
		    cohort_last_error());
}

/* Elastic: the Watch returned in an old generation (gen is the job's):
 * it is re-issued after cohort_client_reform, not now. Returns true when
 * it waits for that; false when the client reformed meanwhile (re-issue
 * it now, in the new generation). */
static bool
client_watch_park(struct cohort_client *c, uint64_t gen)
{
	bool park;

	pthread_mutex_lock(&c->mtx);
	park = gen == 0 || gen > c->generation;
	if (park)
		c->watch_idle = true;
	pthread_mutex_unlock(&c->mtx);
	return (park);
}

void
cohort__client_watch_restart(struct cohort_client *c)
{
	bool idle;

	pthread_mutex_lock(&c->mtx);
	idle = c->watch_idle;
	c->watch_idle = false;
	pthread_mutex_unlock(&c->mtx);
	/* through the timer: on nng's thread, as every re-issue */
	if (idle && c->watch_timer != NULL && !atomic_load(&c->closing))
		nng_sleep_aio(0, c->watch_timer);
}

static void
client_watch_timer_cb(void *arg)
{
	struct cohort_client *c = arg;

	if (nng_aio_result(c->watch_timer) == 0)
		client_watch_start(c);
}

static void
client_watch_done(void *arg, cohort_status st, struct cohort__coord_call *call)
{
	struct cohort_client *c = arg;
	const Cohort__Reply *rep = call->rep;
	char detail[256];

	if (atomic_load(&c->closing))
		return;
	if (st == COHORT_OK && rep == NULL)
		st = COHORT_ETIMEDOUT; /* no reply: watch again */
	switch (st) {
	case COHORT_OK:
		if (rep->failure != NULL
		    || (rep->failed_rank >= 0
		        && ((rep->error != NULL && rep->error[0] != '\0')
		            || (rep->failed_text != NULL
		                && rep->failed_text[0] != '\0')))) {
			cohort__client_job_failed(c, COHORT_EPEERLOST, rep);
			return;
		}
		if (c->min_world > 0 && rep->generation > c->generation) {
			if (cohort__client_generation_moved(c, rep->generation)
			    && client_watch_park(c, rep->generation))
				return;
			break;
		}
		if (rep->generation > c->generation) {
			snprintf(detail, sizeof(detail),
			    "job '%s' moved from generation %" PRIu64
			    " to %" PRIu64 "; rejoin required",
			    c->job, c->generation, rep->generation);
			cohort__client_fail_local(c, COHORT_ESTALE,
			    COHORT_FAILURE_GENERATION, detail);
			return;
		}
		break;
	case COHORT_ETIMEDOUT:
		break;
	case COHORT_EPROTO:
		/* a reply lost or garbled in a coordinator's death: watch
		 * again (after the backoff below) */
		cohort__debug("watch: %s", cohort_last_error());
		break;
	case COHORT_EPEERLOST:
	case COHORT_ESTALE:
		cohort__client_job_failed(c, st, rep);
		return;
	case COHORT_EMEMBERSHIP:
		cohort__client_job_failed(c, st, rep);
		if (client_watch_park(c,
		        rep != NULL && rep->generation != 0
		            ? rep->generation
		            : c->generation + 1))
			return;
		break;
	case COHORT_ENOCOORD: {
		bool lost = false, up;

		/* on nng's thread: never wait for the engine's lock (busy:
		 * the next Watch's answer decides) */
		if (cohort__coord_try_state(c->coord, &lost, &up) && lost) {
			/* Past the reconnect window: without cohortd no
			 * failure is detected, no group restarts, so the
			 * data plane stops too, naming the coordinator. */
			snprintf(
			    detail, sizeof(detail), "%s", cohort_last_error());
			cohort__client_fail_local(c, COHORT_ENOCOORD,
			    COHORT_FAILURE_COORDINATOR, detail);
			return;
		}
		break;
	}
	case COHORT_ECLOSED:
		return;
	default:
		cohort__warn("watch refused: %s: %s", cohort_status_name(st),
		    cohort_last_error());
		return;
	}
	if (cohort__now_ms() - c->watch_started < CLIENT_WATCH_QUICK_MS)
		nng_sleep_aio(CLIENT_WATCH_BACKOFF_MS, c->watch_timer);
	else
		client_watch_start(c);
}

/* ------------------------------------------------------------------------ */
/* Open and close                                                           */
/* ------------------------------------------------------------------------ */

static cohort_status
client_check_options(const cohort_options *opts)
{
	const char *b = opts->backend != NULL ? opts->backend : "auto";

	if (opts->coordinator == NULL || opts->coordinator[0] == '\0')
		return (cohort__err(COHORT_EINVAL,
		    "no coordinator URL (set COHORT_COORDINATOR or "
		    "opts.coordinator)"));
	if (strstr(opts->coordinator, "://") == NULL)
		return (cohort__err(COHORT_EINVAL,
		    "coordinator '%s' is not a URL like tcp://host:port",
		    opts->coordinator));
	if (opts->job == NULL || opts->job[0] == '\0'
	    || strlen(opts->job) >= sizeof(((cohort_env *)0)->job))
		return (cohort__err(COHORT_EINVAL,
		    "job name must have 1 to %zu bytes",
		    sizeof(((cohort_env *)0)->job) - 1));
	if (opts->token != NULL
	    && strlen(opts->token) >= sizeof(((cohort_env *)0)->token))
		return (
		    cohort__err(COHORT_EINVAL, "token longer than %zu bytes",
		        sizeof(((cohort_env *)0)->token) - 1));
	if (opts->world_size < 1)
		return (cohort__err(COHORT_EINVAL,
		    "world size %d: must be at least 1 (set "
		    "COHORT_WORLD_SIZE or opts.world_size)",
		    opts->world_size));
	if (opts->min_world < 0 || opts->min_world > opts->world_size)
		return (cohort__err(COHORT_EINVAL,
		    "min_world %d: must be 0 (not elastic) or 1 to the world "
		    "size %d (the maximum)",
		    opts->min_world, opts->world_size));
	if (opts->rank < -1 || opts->rank >= opts->world_size)
		return (cohort__err(COHORT_EINVAL,
		    "rank %d out of range for world size %d", opts->rank,
		    opts->world_size));
	if (opts->op_timeout < 0 && opts->op_timeout != COHORT_WAIT_FOREVER)
		return (cohort__err(COHORT_EINVAL,
		    "op_timeout %d: must be >= 0 or COHORT_WAIT_FOREVER",
		    opts->op_timeout));
	if (opts->join_timeout < 0 && opts->join_timeout != COHORT_WAIT_FOREVER
	    && opts->join_timeout != COHORT_WAIT_DEFAULT)
		return (cohort__err(COHORT_EINVAL,
		    "join_timeout %d is not a valid duration",
		    opts->join_timeout));
	{
		char why[256];
		if (cohort__timeouts_check(opts, why, sizeof(why))
		    != COHORT_OK)
			return (cohort__err(COHORT_EINVAL, "%s", why));
	}
	if (strcmp(b, "auto") != 0 && cohort__backend_find(b) == NULL) {
		char names[128];
		cohort__backend_names(names, sizeof(names));
		return (cohort__err(
		    COHORT_EINVAL, "unknown backend '%s' (%s)", b, names));
	}
	if (opts->data_addr != NULL
	    && strlen(opts->data_addr)
	        >= sizeof(((struct cohort_client *)0)->data_addr))
		return (cohort__err(COHORT_EINVAL, "data_addr too long"));
	return (COHORT_OK);
}

static void
client_free(struct cohort_client *c)
{
	struct cohort_group *g, *next;

	pthread_mutex_lock(&c->mtx);
	g = c->groups;
	c->groups = NULL;
	c->world = NULL;
	pthread_mutex_unlock(&c->mtx);
	for (; g != NULL; g = next) {
		next = g->next;
		cohort__group_free(g);
	}
	cohort__fault_close(&c->fault);
	cohort__coord_async_free(c->watch);
	cohort__coord_async_free(c->hb);
	if (c->watch_timer != NULL)
		nng_aio_free(c->watch_timer);
	cohort__coord_close(c->coord);
	if (c->hosts != NULL) {
		for (int32_t i = 0; i < c->world_size; i++)
			free(c->hosts[i]);
		free(c->hosts);
	}
	free(c->xfer.receivers);
	cohort__obs_fini(&c->obs);
	pthread_mutex_destroy(&c->mtx);
	free(c);
}

/* Stops the heartbeat and the Watch; their callbacks check `closing`
 * before re-arming, and a stopped aio refuses new operations, so after
 * this nothing of the client runs on nng's threads. */
static void
client_stop_timers(struct cohort_client *c)
{
	if (c->watch_timer != NULL)
		nng_aio_stop(c->watch_timer);
}

static void
client_stop_liveness(struct cohort_client *c)
{
	atomic_store(&c->closing, true);
	cohort__hb_unregister(c);
	client_stop_timers(c);
	if (c->hb != NULL)
		cohort__coord_async_stop(c->hb);
	if (c->watch != NULL)
		cohort__coord_async_stop(c->watch);
	cohort__fault_stop(c->fault);
	/* an async completion may have re-armed one */
	client_stop_timers(c);
}

static cohort_status
client_start_liveness(struct cohort_client *c)
{
	cohort_status st;
	int rv;

	if ((rv = nng_aio_alloc(&c->watch_timer, client_watch_timer_cb, c))
	    != 0)
		return (cohort__err(cohort__from_nng(rv), "nng_aio_alloc: %s",
		    nng_strerror(rv)));
	if ((st = cohort__coord_async_alloc(
	         c->coord, client_hb_done, c, &c->hb))
	        != COHORT_OK
	    || (st = cohort__coord_async_alloc(
	            c->coord, client_watch_done, c, &c->watch))
	        != COHORT_OK)
		return (st);
	client_watch_start(c);
	/* The first beat after a random half to whole period: the members of
	 * a generation all start here within milliseconds, and in step they
	 * would reach cohortd as one burst of n heartbeats every period;
	 * spread, about n / period per millisecond. The silence cohortd
	 * allows (dead-after) is longer than a period. */
	return (cohort__hb_register(c,
	    c->heartbeat_ms / 2
	        + (cohort_duration)(cohort__random_u64()
	            % (uint64_t)(c->heartbeat_ms / 2 + 1)),
	    client_hb_tick));
}

/* Sends Leave, bounded by COHORT__CLOSE_TIMEOUT_MS in all. */
static void
client_leave(struct cohort_client *c)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Leave leave = COHORT__LEAVE__INIT;
	struct cohort__coord_call call;
	struct cohort__obs_msg om;
	cohort_status st;

	/* best effort: not while the connection is down */
	if (!cohort__coord_up(c->coord))
		return;
	/* the final metrics: a heartbeat may not have carried the last
	 * operations */
	if (cohort__obs_fill(&c->obs, &om))
		leave.metrics = &om.m;
	cohort__coord_prepare_close(c->coord);
	req.body_case = COHORT__REQUEST__BODY_LEAVE;
	req.leave = &leave;
	/* answered at once; the reply grace bounds the wait */
	st = cohort__coord_request(c->coord, &call, &req, NULL, 0,
	    cohort__now_ms() + COHORT__CLOSE_TIMEOUT_MS
	        - COHORT__REPLY_GRACE_MS);
	if (st != COHORT_OK)
		cohort__debug("leave: %s: %s", cohort_status_name(st),
		    cohort_last_error());
	cohort__coord_call_fini(&call);
}

static cohort_status
client_join(
    struct cohort_client *c, const cohort_options *opts, cohort__time deadline)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Join join = COHORT__JOIN__INIT;
	struct cohort__coord_call call;
	const Cohort__JoinReply *jr;
	char missing[256];
	size_t off = 0;
	cohort_status st;

	join.rank = opts->rank;
	join.world_size = (uint32_t)opts->world_size;
	join.host = c->host;
	join.pid = (uint32_t)getpid();
	join.local_rank = opts->local_rank;
	join.heartbeat_ms = (uint32_t)c->heartbeat_ms;
	join.dead_after_ms = (uint32_t)c->dead_after_ms;
	join.min_world = (uint32_t)(opts->min_world > 0 ? opts->min_world : 0);
	/* Nothing here reads the other members' hosts or local ranks (the
	 * data plane exchanges addresses itself; this member's local rank is
	 * the one it sent): O(1) reply instead of O(world). */
	join.no_member_list = true;
	req.body_case = COHORT__REQUEST__BODY_JOIN;
	req.join = &join;
	st = cohort__coord_request(c->coord, &call, &req, NULL, 0, deadline);
	if (st != COHORT_OK) {
		if (st == COHORT_ETIMEDOUT && call.rep != NULL
		    && call.rep->n_missing_ranks > 0
		    && strstr(cohort_last_error(), "rank") == NULL) {
			for (size_t i = 0; i < call.rep->n_missing_ranks; i++)
				cohort__appendf(missing, sizeof(missing), &off,
				    "%s%d", i ? ", " : "",
				    call.rep->missing_ranks[i]);
			cohort__err(st,
			    "join of job '%s' timed out; ranks %s never "
			    "joined",
			    c->job, missing);
		}
		goto out;
	}
	jr = call.rep->body_case == COHORT__REPLY__BODY_JOIN ? call.rep->join
	                                                     : NULL;
	/* An elastic job's world is any size in its range, and the rank
	 * asked for only orders the members (README section 8.1). */
	if (jr == NULL || jr->rank < 0
	    || (opts->min_world > 0
	            ? jr->world_size < (uint32_t)opts->min_world
	                || jr->world_size > (uint32_t)opts->world_size
	            : jr->world_size != (uint32_t)opts->world_size
	                || (opts->rank >= 0 && jr->rank != opts->rank))
	    || jr->rank >= (int32_t)jr->world_size) {
		st = cohort__err(COHORT_EPROTO,
		    "malformed join reply from the coordinator");
		goto out;
	}
	if (opts->min_world > 0) {
		c->min_world = jr->min_world > 0 ? (int32_t)jr->min_world
		                                 : opts->min_world;
		c->max_world = jr->max_world > 0 ? (int32_t)jr->max_world
		                                 : opts->world_size;
	}
	/* Admitted into a running job: no state until a transfer gives
	 * it; its first step boundary says so without asking cohortd. */
	c->has_state = !jr->joined_running;
	if (jr->joined_running) {
		c->xfer.pending = true;
		c->xfer.admitted = true;
		c->xfer.known = false;
		c->xfer.generation = jr->generation;
		c->xfer.sender = -1;
	}
	c->rank = jr->rank;
	c->world_size = (int32_t)jr->world_size;
	c->generation = jr->generation;
	c->job_id = jr->job_id;
	if (c->local_rank < 0 && jr->n_local_ranks == jr->world_size)
		c->local_rank = jr->local_ranks[c->rank];
	/* an older cohortd sends the member list anyway */
	if (jr->n_hosts == 0)
		c->hosts = NULL;
	else if ((c->hosts = calloc((size_t)c->world_size, sizeof(char *)))
	    == NULL) {
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out;
	}
	for (int32_t i = 0; c->hosts != NULL && i < c->world_size; i++) {
		const char *h = (size_t)i < jr->n_hosts ? jr->hosts[i] : "";
		if ((c->hosts[i] = strdup(h)) == NULL) {
			st = cohort__err(COHORT_ENOMEM, "out of memory");
			goto out;
		}
	}
	cohort__coord_set_member(c->coord, c->rank, c->generation);
	cohort__coord_set_limits(
	    c->coord, jr->max_value_bytes, jr->max_message_bytes);
out:
	cohort__coord_call_fini(&call);
	return (st);
}

/* What fault.c may do to a client (fault.h): fail it (drop), say what
 * it is in, report its failure (exit). */
static void
client_fault_fail(void *ctx, cohort_status st, const char *detail)
{
	cohort__client_fail_local(ctx, st, COHORT_FAILURE_INJECTED, detail);
}

static void
client_fault_heartbeat(
    void *ctx, const char *kind, const char *group, uint64_t seq)
{
	cohort__client_heartbeat_now(ctx, kind, group, seq);
}

static cohort_status
client_fault_report(void *ctx, const char *text, cohort_duration timeout)
{
	return (cohort_report_failure(ctx, text, timeout));
}

/* Starts the fault schedule of a joined client. */
static cohort_status
client_fault_start(struct cohort_client *c)
{
	const struct cohort__fault_member m = { c->job, c->rank, c->world_size,
		c->generation, c->job_id, c->coord };

	return (cohort__fault_start(c->fault, &m));
}

cohort_status
cohort_client_open(
    const cohort_options *opts, cohort_client **out, cohort_duration timeout)
{
	struct cohort_client *c;
	cohort__time deadline;
	bool joined = false;
	cohort_status st;

	cohort__err_clear();
	if (opts == NULL || out == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL options or output"));
	if ((st = client_check_options(opts)) != COHORT_OK)
		return (st);
	if (timeout == COHORT_WAIT_DEFAULT)
		timeout = opts->join_timeout;
	deadline = cohort__deadline(timeout, opts->op_timeout);

	if ((c = calloc(1, sizeof(*c))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if (pthread_mutex_init(&c->mtx, NULL) != 0) {
		free(c);
		return (cohort__err(COHORT_ESYSTEM, "pthread_mutex_init"));
	}
	atomic_init(&c->error, COHORT_OK);
	atomic_init(&c->closing, false);
	if ((st = cohort__obs_init(&c->obs)) != COHORT_OK) {
		pthread_mutex_destroy(&c->mtx);
		free(c);
		return (st);
	}
	cohort__strlcpy(
	    c->coordinator, opts->coordinator, sizeof(c->coordinator));
	cohort__strlcpy(c->job, opts->job, sizeof(c->job));
	cohort__strlcpy(c->token, opts->token != NULL ? opts->token : "",
	    sizeof(c->token));
	cohort__strlcpy(c->backend,
	    opts->backend != NULL ? opts->backend : "auto",
	    sizeof(c->backend));
	if (opts->data_addr != NULL) {
		cohort__strlcpy(
		    c->data_addr, opts->data_addr, sizeof(c->data_addr));
	} else {
		char from[48];

		if ((st = cohort__data_addr(c->coordinator, c->data_addr,
		         sizeof(c->data_addr), from, sizeof(from)))
		    != COHORT_OK)
			goto out_free;
		cohort__info(
		    "data plane address %s (from %s)", c->data_addr, from);
	}
	if (gethostname(c->host, sizeof(c->host)) != 0)
		cohort__strlcpy(c->host, "unknown", sizeof(c->host));
	c->host[sizeof(c->host) - 1] = '\0';
	c->rank = -1;
	c->local_rank = opts->local_rank;
	c->op_timeout = opts->op_timeout;
	c->join_timeout = opts->join_timeout;
	c->heartbeat_ms = opts->heartbeat_interval;
	c->dead_after_ms = opts->dead_after;

	/* A bad COHORT_FAULTS is refused before anything connects. */
	{
		const struct cohort__fault_hooks hooks
		    = { c, client_fault_fail, client_fault_heartbeat,
			      client_fault_report };

		if ((st = cohort__fault_open(&hooks, &c->fault)) != COHORT_OK)
			goto out_free;
	}
	if ((st = cohort__coord_open(c->coordinator, c->job, c->token,
	         cohort__random_u64(), &c->coord))
	    != COHORT_OK)
		goto out_free;
	/* A coordinator restart must not fail the job: calls wait for the
	 * reconnection through the window, the data plane goes on. */
	cohort__coord_set_reconnect_window(
	    c->coord, cohort__reconnect_window(opts));
	if ((st = cohort__coord_wait_connected(c->coord, deadline))
	    != COHORT_OK)
		goto out_free;
	if ((st = client_join(c, opts, deadline)) != COHORT_OK)
		goto out_free;
	joined = true;
	/* the world group, on the client's list like every group */
	if ((st = cohort__client_new_group(
	         c, "", c->rank, c->world_size, NULL, &c->world))
	    != COHORT_OK)
		goto out_free;
	cohort__client_add_group(c, c->world);
	if ((st = client_start_liveness(c)) != COHORT_OK)
		goto out_free;
	if ((st = client_fault_start(c)) != COHORT_OK)
		goto out_free;
	cohort__obs_start(
	    &c->obs, c->job, c->rank, c->world_size, c->generation);
	cohort__log_ctx_process(c->job, c->rank);
	cohort__coll_setup_early(c->world);
	cohort__info("rank %d of %d joined job '%s' at %s (generation %" PRIu64
	             ")%s",
	    c->rank, c->world_size, c->job, c->coordinator, c->generation,
	    c->has_state ? "" : ", admitted into the running job");
	*out = c;
	return (COHORT_OK);

out_free : {
	/* keep the failing call's detail across the cleanup */
	char detail[COHORT__DETAIL_MAX];

	cohort__strlcpy(detail, cohort_last_error(), sizeof(detail));
	client_stop_liveness(c);
	if (joined)
		client_leave(c);
	client_free(c);
	cohort__err(st, "%s", detail);
}
	return (st);
}

cohort_status
cohort_client_open_env(cohort_client **out, cohort_duration timeout)
{
	cohort_env env;
	cohort_options opts;
	cohort_status st;

	if ((st = cohort_env_resolve(&env)) != COHORT_OK)
		return (st);
	if ((st = cohort_options_from_env(&opts, &env)) != COHORT_OK)
		return (st);
	return (cohort_client_open(&opts, out, timeout));
}

/* A data-plane set-up started at join may still be connecting to peers
 * that wait for this member: let it finish before leaving (bounded by the
 * connect window), or the peers' set-up would fail on a member that left. */
static void
client_settle_groups(struct cohort_client *c)
{
	cohort_duration ms = (cohort_duration)cohort__knob_int_or(
	    COHORT__KNOB_CONNECT_TIMEOUT_MS, 10000);
	struct cohort_group *g;

	/* The list changes only in the user's calls (new, destroy, close):
	 * no lock held while waiting. */
	pthread_mutex_lock(&c->mtx);
	g = c->groups;
	pthread_mutex_unlock(&c->mtx);
	for (; g != NULL; g = g->next)
		cohort__coll_setup_settle(g, ms);
}

void
cohort_client_close(cohort_client *c)
{
	if (c == NULL)
		return;
	client_settle_groups(c);
	client_stop_liveness(c);
	client_leave(c);
	client_free(c);
}
