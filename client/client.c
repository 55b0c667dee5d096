/*
 * client.c - cohort_client: open (connect + join), liveness, close.
 *
 * Liveness runs on nng's threads, not one of ours (a process may hold
 * hundreds of clients): a sleep aio fires every heartbeat_ms and sends a
 * Heartbeat through an async call whose completion re-arms the timer; a
 * Watch long poll is parked at cohortd and re-issued when it returns.
 * Whichever hears first that a peer failed (EPEERLOST, healthy = false,
 * a newer generation) fails every group of the client, which aborts the
 * operations blocked on them.
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
/* Internal API (client.h)                                                  */
/* ------------------------------------------------------------------------ */

cohort__time
cohort__client_deadline(const struct cohort_client *c, cohort_duration timeout)
{
	return (cohort__deadline(timeout, c->op_timeout));
}

void
cohort__client_add_group(struct cohort_client *c, struct cohort_group *g)
{
	pthread_mutex_lock(&c->mtx);
	g->next = c->groups;
	c->groups = g;
	pthread_mutex_unlock(&c->mtx);
}

void
cohort__client_remove_group(struct cohort_client *c, struct cohort_group *g)
{
	struct cohort_group **pp;

	pthread_mutex_lock(&c->mtx);
	for (pp = &c->groups; *pp != NULL; pp = &(*pp)->next) {
		if (*pp == g) {
			*pp = g->next;
			g->next = NULL;
			break;
		}
	}
	pthread_mutex_unlock(&c->mtx);
}

void
cohort__client_fail(
    struct cohort_client *c, cohort_status st, const char *detail)
{
	struct cohort_group *g;
	int ok = COHORT_OK;

	pthread_mutex_lock(&c->mtx);
	if (atomic_compare_exchange_strong(&c->error, &ok, (int)st)) {
		cohort__strlcpy(
		    c->error_detail, detail, sizeof(c->error_detail));
		cohort__warn("job '%s' failed (%s): %s", c->job,
		    cohort_status_name(st), detail);
	}
	for (g = c->groups; g != NULL; g = g->next)
		cohort__group_fail(g, st, "%s", detail);
	pthread_mutex_unlock(&c->mtx);
}

cohort_status
cohort__client_check_reply(
    struct cohort_client *c, cohort_status st, const Cohort__Reply *rep)
{
	char detail[COHORT__DETAIL_MAX];
	size_t off = 0;

	if (st != COHORT_EPEERLOST && st != COHORT_ESTALE)
		return (st);
	if (rep != NULL && rep->error != NULL && rep->error[0] != '\0')
		cohort__appendf(
		    detail, sizeof(detail), &off, "%s", rep->error);
	else if (rep != NULL && rep->failed_rank >= 0)
		cohort__appendf(detail, sizeof(detail), &off, "rank %d failed",
		    rep->failed_rank);
	else
		cohort__appendf(
		    detail, sizeof(detail), &off, "%s", cohort_strerror(st));
	/* cohortd's error quotes the first line of the failed rank's text;
	 * add what it left out (a traceback's frames), or all of it. */
	if (rep != NULL && rep->failed_text != NULL
	    && rep->failed_text[0] != '\0'
	    && strstr(detail, rep->failed_text) == NULL) {
		const char *t = rep->failed_text;
		const char *nl = strchr(t, '\n');
		size_t first = nl != NULL ? (size_t)(nl - t) : strlen(t);
		char line[512];

		cohort__strlcpy(line, t,
		    first + 1 < sizeof(line) ? first + 1 : sizeof(line));
		if (first > 0 && first < sizeof(line)
		    && strstr(detail, line) != NULL) {
			if (nl != NULL)
				cohort__appendf(detail, sizeof(detail), &off,
				    "\n%s", nl + 1);
		} else {
			cohort__appendf(
			    detail, sizeof(detail), &off, ": %s", t);
		}
	}
	cohort__client_fail(c, st, detail);
	return (st);
}

bool
cohort__client_who_missing(struct cohort_client *c, struct cohort_group *g,
    const char *kind, uint64_t seq, char *buf, size_t len)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__StatusQuery q = COHORT__STATUS_QUERY__INIT;
	struct cohort__coord_call call;
	const Cohort__JobStatus *js = NULL;
	char doing[768];
	size_t off = 0, doff = 0;
	int nmiss = 0;
	bool ok = false;

	buf[0] = doing[0] = '\0';
	q.job = c->job;
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	/* answered at once; the reply grace bounds the wait */
	if (cohort__coord_request(
	        c->coord, &call, &req, NULL, 0, cohort__now_ms())
	        != COHORT_OK
	    || call.rep->body_case != COHORT__REPLY__BODY_STATUS_QUERY
	    || call.rep->status_query == NULL)
		goto out;
	for (size_t i = 0; i < call.rep->status_query->n_jobs; i++)
		if (strcmp(call.rep->status_query->jobs[i]->job, c->job) == 0)
			js = call.rep->status_query->jobs[i];
	if (js == NULL)
		goto out;
	for (int32_t i = 0; i < g->size; i++) {
		const Cohort__MemberStatus *m = NULL;
		int32_t r = g->global_ranks[i];
		bool same;

		if (r == c->rank)
			continue;
		for (size_t k = 0; k < js->n_members; k++)
			if (js->members[k]->rank == r)
				m = js->members[k];
		if (m == NULL)
			continue;
		same = strcmp(m->last_group, g->id) == 0
		    && !cohort__op_is_control(m->last_op);
		if (same
		    && (m->last_op_seq > seq
		        || (m->last_op_seq == seq
		            && strcmp(m->last_op, kind) == 0)))
			continue; /* in it, or past it */
		cohort__appendf(buf, len, &off, "%s%d", nmiss ? ", " : "", r);
		if (strcmp(m->state, "running") != 0)
			cohort__appendf(doing, sizeof(doing), &doff,
			    "%srank %d %s", nmiss ? "; " : "", r, m->state);
		else if (m->in_op && m->last_op[0] != '\0')
			cohort__appendf(doing, sizeof(doing), &doff,
			    "%srank %d is in %s #%" PRIu64 "%s%s%s for %.1f s",
			    nmiss ? "; " : "", r, m->last_op, m->last_op_seq,
			    m->last_group[0] ? " on group '" : "",
			    m->last_group, m->last_group[0] ? "'" : "",
			    (double)m->in_op_ms / 1000.0);
		else if (m->last_op[0] != '\0')
			cohort__appendf(doing, sizeof(doing), &doff,
			    "%srank %d last seen %.1f s ago after %s "
			    "#%" PRIu64,
			    nmiss ? "; " : "", r,
			    (double)m->last_seen_ms_ago / 1000.0, m->last_op,
			    m->last_op_seq);
		else
			cohort__appendf(doing, sizeof(doing), &doff,
			    "%srank %d last seen %.1f s ago, no collective "
			    "yet",
			    nmiss ? "; " : "", r,
			    (double)m->last_seen_ms_ago / 1000.0);
		nmiss++;
	}
	if (nmiss == 0) {
		off = 0;
		cohort__appendf(buf, len, &off,
		    "every rank of group '%s' entered %s #%" PRIu64
		    " (the transport did not complete it)",
		    g->id, kind, seq);
	} else {
		char ranks[256];

		cohort__strlcpy(ranks, buf, sizeof(ranks));
		off = 0;
		cohort__appendf(buf, len, &off,
		    "rank%s %s never entered %s #%" PRIu64 " (%s)",
		    nmiss > 1 ? "s" : "", ranks, kind, seq, doing);
	}
	ok = true;
out:
	cohort__coord_call_fini(&call);
	return (ok);
}

/* ------------------------------------------------------------------------ */
/* Liveness: heartbeat timer and Watch                                      */
/* ------------------------------------------------------------------------ */

/* What this rank is doing, for the heartbeat: the operation in progress
 * entered first (the one a hang is about), else the one left last. */
static void
client_hb_fill(
    struct cohort_client *c, Cohort__Heartbeat *hb, char *grp, size_t grplen)
{
	struct cohort_group *g, *best = NULL;
	bool best_in = false;
	cohort__time best_t = 0, now = cohort__now_ms();

	hb->last_op = "";
	hb->last_group = grp;
	grp[0] = '\0';
	pthread_mutex_lock(&c->mtx);
	for (g = c->groups; g != NULL; g = g->next) {
		bool in;
		cohort__time t;

		pthread_mutex_lock(&g->mtx);
		in = g->op_in;
		t = in ? g->op_start : g->op_end;
		if (g->op_kind != NULL
		    && (best == NULL || (in && !best_in)
		        || (in == best_in
		            && (in ? t < best_t : t > best_t)))) {
			best = g;
			best_in = in;
			best_t = t;
			hb->last_op = (char *)g->op_kind; /* static */
			hb->last_op_seq = g->op_seq;
			hb->in_op = in;
			hb->in_op_ms = in && now > t ? (uint64_t)(now - t) : 0;
			cohort__strlcpy(grp, g->id, grplen);
		}
		pthread_mutex_unlock(&g->mtx);
	}
	pthread_mutex_unlock(&c->mtx);
}

void
cohort__client_heartbeat_now(
    struct cohort_client *c, const char *kind, const char *group, uint64_t seq)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;
	struct cohort__coord_call call;

	hb.last_op = (char *)kind;
	hb.last_group = (char *)group;
	hb.last_op_seq = seq;
	hb.in_op = true;
	req.body_case = COHORT__REQUEST__BODY_HEARTBEAT;
	req.heartbeat = &hb;
	(void)cohort__coord_request(
	    c->coord, &call, &req, NULL, 0, cohort__now_ms() + 1000);
	cohort__coord_call_fini(&call);
}

static void
client_hb_timer_cb(void *arg)
{
	struct cohort_client *c = arg;
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;
	char last_group[COHORT__GROUP_ID_MAX];
	struct cohort__obs_msg om;
	cohort_status st;

	if (atomic_load(&c->closing) || nng_aio_result(c->hb_timer) != 0)
		return;
	client_hb_fill(c, &hb, last_group, sizeof(last_group));
	if (cohort__obs_fill(&c->obs, &om))
		hb.metrics = &om.m;
	c->obs.hb_sent_ns = cohort__now_ns();
	cohort__fault_tick(c);
	req.body_case = COHORT__REQUEST__BODY_HEARTBEAT;
	req.heartbeat = &hb;
	st = cohort__coord_async_start(
	    c->hb, &req, cohort__now_ms() + c->heartbeat_ms);
	if (st == COHORT_ESTATE) {
		/* the previous heartbeat is still out: try next period */
		nng_sleep_aio(c->heartbeat_ms, c->hb_timer);
	} else if (st != COHORT_OK) {
		cohort__debug("heartbeat stopped: %s: %s",
		    cohort_status_name(st), cohort_last_error());
	}
}

static void
client_hb_done(void *arg, cohort_status st, struct cohort__coord_call *call)
{
	struct cohort_client *c = arg;
	const Cohort__Reply *rep = call->rep;

	if (atomic_load(&c->closing))
		return;
	if (st == COHORT_OK && c->obs.hb_sent_ns != 0)
		cohort__obs_rtt(&c->obs, cohort__now_ns() - c->obs.hb_sent_ns);
	switch (st) {
	case COHORT_OK:
		/* a failed job: fan out, and keep beating (this member is
		 * alive; cohortd should not declare it dead as well) */
		if (rep->body_case == COHORT__REPLY__BODY_HEARTBEAT
		    && rep->heartbeat != NULL && !rep->heartbeat->healthy
		    && atomic_load(&c->error) == COHORT_OK)
			cohort__client_check_reply(c, COHORT_EPEERLOST, rep);
		break;
	case COHORT_EPEERLOST:
	case COHORT_ESTALE:
		if (atomic_load(&c->error) == COHORT_OK)
			cohort__client_check_reply(c, st, rep);
		break;
	case COHORT_ECLOSED:
		return;
	case COHORT_ENOCOORD:
		if (cohort__coord_lost(c->coord))
			return;
		/* reconnecting: the engine says so once */
		if (cohort__coord_up(c->coord))
			cohort__warn("heartbeat: %s", cohort_last_error());
		break;
	default:
		cohort__warn("heartbeat refused: %s: %s",
		    cohort_status_name(st), cohort_last_error());
		break;
	}
	nng_sleep_aio(c->heartbeat_ms, c->hb_timer);
}

static void
client_watch_start(struct cohort_client *c)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Watch w = COHORT__WATCH__INIT;
	cohort_status st;

	if (atomic_load(&c->closing))
		return;
	req.body_case = COHORT__REQUEST__BODY_WATCH;
	req.watch = &w;
	c->watch_started = cohort__now_ms();
	st = cohort__coord_async_start(
	    c->watch, &req, c->watch_started + CLIENT_WATCH_MS);
	if (st != COHORT_OK)
		cohort__debug("watch stopped: %s: %s", cohort_status_name(st),
		    cohort_last_error());
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
	switch (st) {
	case COHORT_OK:
		if (rep->failed_rank >= 0
		    && ((rep->error != NULL && rep->error[0] != '\0')
		        || (rep->failed_text != NULL
		            && rep->failed_text[0] != '\0'))) {
			cohort__client_check_reply(c, COHORT_EPEERLOST, rep);
			return;
		}
		if (rep->generation > c->generation) {
			snprintf(detail, sizeof(detail),
			    "job '%s' moved from generation %" PRIu64
			    " to %" PRIu64 "; rejoin required",
			    c->job, c->generation, rep->generation);
			cohort__client_fail(c, COHORT_ESTALE, detail);
			return;
		}
		break;
	case COHORT_ETIMEDOUT:
		break;
	case COHORT_EPEERLOST:
	case COHORT_ESTALE:
		cohort__client_check_reply(c, st, rep);
		return;
	case COHORT_ENOCOORD:
		if (cohort__coord_lost(c->coord)) {
			/* Past the reconnect window: without cohortd no
			 * failure is detected, no group restarts, so the
			 * data plane stops too, naming the coordinator. */
			snprintf(
			    detail, sizeof(detail), "%s", cohort_last_error());
			cohort__client_fail(c, COHORT_ENOCOORD, detail);
			return;
		}
		break;
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
	cohort__fault_close(c);
	cohort__coord_async_free(c->watch);
	cohort__coord_async_free(c->hb);
	if (c->watch_timer != NULL)
		nng_aio_free(c->watch_timer);
	if (c->hb_timer != NULL)
		nng_aio_free(c->hb_timer);
	cohort__coord_close(c->coord);
	if (c->hosts != NULL) {
		for (int32_t i = 0; i < c->world_size; i++)
			free(c->hosts[i]);
		free(c->hosts);
	}
	cohort__obs_fini(&c->obs);
	pthread_mutex_destroy(&c->mtx);
	free(c);
}

/* Stops the heartbeat and the Watch; their callbacks check `closing`
 * before re-arming, and a stopped aio refuses new operations, so after
 * this nothing of the client runs on nng's threads. */
static void
client_stop_liveness(struct cohort_client *c)
{
	atomic_store(&c->closing, true);
	if (c->hb_timer != NULL)
		nng_aio_stop(c->hb_timer);
	if (c->watch_timer != NULL)
		nng_aio_stop(c->watch_timer);
	if (c->hb != NULL)
		cohort__coord_async_stop(c->hb);
	if (c->watch != NULL)
		cohort__coord_async_stop(c->watch);
	cohort__fault_stop(c);
	if (c->hb_timer != NULL)
		nng_aio_stop(c->hb_timer);
	if (c->watch_timer != NULL)
		nng_aio_stop(c->watch_timer);
}

static cohort_status
client_start_liveness(struct cohort_client *c)
{
	cohort_status st;
	int rv;

	if ((rv = nng_aio_alloc(&c->hb_timer, client_hb_timer_cb, c)) != 0
	    || (rv = nng_aio_alloc(&c->watch_timer, client_watch_timer_cb, c))
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
	nng_sleep_aio(c->heartbeat_ms, c->hb_timer);
	return (COHORT_OK);
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
	if (jr == NULL || jr->rank < 0
	    || jr->world_size != (uint32_t)opts->world_size
	    || jr->rank >= opts->world_size
	    || (opts->rank >= 0 && jr->rank != opts->rank)) {
		st = cohort__err(COHORT_EPROTO,
		    "malformed join reply from the coordinator");
		goto out;
	}
	c->rank = jr->rank;
	c->world_size = (int32_t)jr->world_size;
	c->generation = jr->generation;
	c->job_id = jr->job_id;
	if (c->local_rank < 0 && jr->n_local_ranks == jr->world_size)
		c->local_rank = jr->local_ranks[c->rank];
	if ((c->hosts = calloc((size_t)c->world_size, sizeof(char *)))
	    == NULL) {
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out;
	}
	for (int32_t i = 0; i < c->world_size; i++) {
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

/* What fault.c may do to a client (fault.h). */
static const struct cohort__fault_hooks client_fault_hooks = {
	.fail = cohort__client_fail,
	.heartbeat_now = cohort__client_heartbeat_now,
	.report = cohort_report_failure,
};

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
	if ((st = cohort__fault_open(c, &client_fault_hooks)) != COHORT_OK)
		goto out_free;
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
	if ((st = cohort__group_alloc(c, "", c->rank, c->world_size, NULL,
	         c->generation, &c->world))
	    != COHORT_OK)
		goto out_free;
	cohort__client_add_group(c, c->world);
	if ((st = client_start_liveness(c)) != COHORT_OK)
		goto out_free;
	if ((st = cohort__fault_start(c)) != COHORT_OK)
		goto out_free;
	cohort__obs_start(
	    &c->obs, c->job, c->rank, c->world_size, c->generation);
	cohort__log_ctx_process(c->job, c->rank);
	cohort__coll_setup_early(c->world);
	cohort__info("rank %d of %d joined job '%s' at %s (generation %" PRIu64
	             ")",
	    c->rank, c->world_size, c->job, c->coordinator, c->generation);
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

/* ------------------------------------------------------------------------ */
/* Accessors and failure report                                             */
/* ------------------------------------------------------------------------ */

int32_t
cohort_client_rank(const cohort_client *c)
{
	return (c != NULL ? c->rank : -1);
}

int32_t
cohort_client_world_size(const cohort_client *c)
{
	return (c != NULL ? c->world_size : 0);
}

int32_t
cohort_client_local_rank(const cohort_client *c)
{
	return (c != NULL ? c->local_rank : -1);
}

uint64_t
cohort_client_generation(const cohort_client *c)
{
	return (c != NULL ? c->generation : 0);
}

bool
cohort_client_is_global_zero(const cohort_client *c)
{
	return (c != NULL && c->rank == 0);
}

cohort_group *
cohort_client_world(cohort_client *c)
{
	return (c != NULL ? c->world : NULL);
}

cohort_status
cohort_client_error(const cohort_client *c)
{
	struct cohort_client *m = (struct cohort_client *)c;
	cohort_status st;

	if (c == NULL)
		return (COHORT_EINVAL);
	st = (cohort_status)atomic_load(&m->error);
	if (st == COHORT_OK && cohort__coord_lost(m->coord))
		return (cohort__err(COHORT_ENOCOORD,
		    "connection to the coordinator at %s was lost",
		    m->coordinator));
	if (st != COHORT_OK) {
		pthread_mutex_lock(&m->mtx);
		cohort__err(st, "%s", m->error_detail);
		pthread_mutex_unlock(&m->mtx);
	}
	return (st);
}

cohort_status
cohort_report_failure(
    cohort_client *c, const char *text, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__ReportFailure rf = COHORT__REPORT_FAILURE__INIT;
	Cohort__Heartbeat doing = COHORT__HEARTBEAT__INIT;
	struct cohort__coord_call call;
	cohort_status st;
	char grp[COHORT__GROUP_ID_MAX];

	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	/* what this rank is doing now: the report names that operation */
	client_hb_fill(c, &doing, grp, sizeof(grp));
	rf.doing = &doing;
	rf.text = (char *)(text != NULL ? text : "");
	if (strlen(rf.text) > 64 * 1024)
		return (cohort__err(
		    COHORT_EINVAL, "failure text longer than 64 KiB"));
	req.body_case = COHORT__REQUEST__BODY_REPORT_FAILURE;
	req.report_failure = &rf;
	st = cohort__coord_request(c->coord, &call, &req, NULL, 0,
	    cohort__client_deadline(c, timeout));
	cohort__coord_call_fini(&call);
	return (st);
}
