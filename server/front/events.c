/*
 * events.c - the coordinator's entry points besides requests: start and
 * stop, the sweep (deadlines, silence, stalls, expiry), cohortd's own
 * stalls, connections that open, go idle and close.
 *
 * Like srv_core_dispatch, each takes `now` from the caller and runs under
 * the server mutex; an event's replies leave at its end, once its journal
 * records are written.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "core/call.h"
#include "core/clients.h"
#include "core/pipes.h"
#include "journal/journal.h"
#include "observe/ranks.h"
#include "state/job.h"
#include "state/lifecycle.h"
#include "state/member.h"
#include "state/rdzv.h"
#include "state/stall.h"
#include "events.h"

cohort_status
srv_core_new(const struct srv_limits *lim, const char *admin_token,
    srv_sink_fn sink, void *arg, cohort__time now, struct srv_core **out)
{
	struct srv_core *core = calloc(1, sizeof(*core));

	if (core == NULL)
		return (COHORT_ENOMEM);
	if (srv_core_init(core, lim, admin_token, sink, arg, now)
	    != COHORT_OK) {
		free(core);
		return (COHORT_ENOMEM);
	}
	core->stall_ms = COHORT__SRV_DEFAULT_STALL_MS;
	core->first_request_ms = COHORT__SRV_DEFAULT_FIRST_REQUEST_MS;
	core->idle_ms = COHORT__SRV_DEFAULT_IDLE_MS;
	core->rdzv_last_call_ms = COHORT__SRV_DEFAULT_RDZV_LAST_CALL_MS;
	/* 0 (never) for the core; cohortd sets its default */
	core->job_expiry_ms = 0;
	*out = core;
	return (COHORT_OK);
}

void
srv_core_close_all(struct srv_core *core)
{
	/* With a journal, a stop is a restart to come: nothing more is
	 * journalled, and parked requests are dropped so that clients
	 * re-send them to the next cohortd instead of failing. */
	if (core->jrn != NULL) {
		srv_journal_close(core);
		core->quiet = true;
	}
	srv_jobs_free_all(core, "cohortd is shutting down");
}

void
srv_core_free(struct srv_core *core)
{
	if (core == NULL)
		return;
	srv_core_close_all(core);
	srv_pipes_fini(core);
	srv_obs_free(core);
	srv_core_fini(core);
	free(core);
}

void
srv_core_expire_due(struct srv_core *core, cohort__time now)
{
	/* Each expiry removes its call from the heap: bounded by heap_n. */
	size_t budget = core->heap_n;
	struct srv_call *c;

	while (budget-- > 0 && (c = srv_core_next_due(core, now)) != NULL) {
		struct srv_job *job = c->job;
		srv_call_expire(c, now);
		if (job != NULL)
			srv_job_maybe_remove(job);
	}
}

void
srv_core_sweep(struct srv_core *core, cohort__time now)
{
	struct srv_hnode *n, *next;
	size_t i;
	bool stalls = now >= core->stall_next;

	srv_core_event_begin(core);
	srv_core_expire_due(core, now);
	/* 250 ms: a stall is logged within a quarter second of passing
	 * --stall-threshold (plus the heartbeat that reports it). */
	if (stalls)
		core->stall_next = now + 250;
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL; n = next) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		next = srv_map_next(&core->jobs, &i, n);
		srv_member_sweep(job, now);
		srv_rdzv_sweep(job, now);
		if (stalls && srv_job_maybe_expire(job, now))
			continue;
		if (stalls)
			srv_stall_check(job, now);
	}
	if (stalls)
		srv_pipes_prune_closed(core, now);
	srv_core_event_end(core, now);
	srv_journal_tick(core, now);
}

void
srv_core_loop_lag(struct srv_core *core, cohort__time lag_ms, cohort__time now)
{
	struct srv_hnode *n;
	size_t i, nmem = 0;

	if (lag_ms < 0)
		lag_ms = 0;
	core->m.loop_lag_ms = lag_ms;
	if (lag_ms > core->m.loop_lag_max_ms)
		core->m.loop_lag_max_ms = lag_ms;
	if (lag_ms < SRV_LOOP_STALL_MS)
		return;
	core->m.loop_stalls++;
	/* Whatever members sent during the stall is still queued: the time
	 * cohortd did not run is not counted as anyone's silence (a member
	 * that stays silent is still declared dead, one dead-after later:
	 * after repeated stalls too, since only the lag is credited), nor
	 * as connections' idle time or lateness of their first request. */
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n))
		nmem += srv_member_credit_lag(
		    SRV_CONTAINER(n, struct srv_job, hn), lag_ms, now);
	srv_pipes_credit_lag(core, lag_ms, now);
	cohort__warn("event loop stalled for %.1f s (cohortd was stopped, "
	             "paused or starved): not counted as silence of its %zu "
	             "running member%s",
	    (double)lag_ms / 1000.0, nmem, nmem == 1 ? "" : "s");
}

/* Whether a connection has something to wait for: a running member or
 * a parked request (an answer that must leave through it). */
static bool
events_pipe_busy(const struct srv_pipe *p)
{
	const struct srv_link *l;

	for (l = p->clients.next; l != &p->clients; l = l->next) {
		const struct srv_client *cl
		    = SRV_CONTAINER(l, struct srv_client, plink);
		if (!srv_list_empty(&cl->parked)
		    || (cl->member != NULL
		        && cl->member->state == SRV_MEMBER_RUNNING))
			return (true);
	}
	return (false);
}

size_t
srv_core_take_idle_pipes(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max)
{
	struct srv_hnode *n;
	size_t i, k = 0;

	for (n = srv_map_next(&core->pipes, &i, NULL); n != NULL && k < max;
	     n = srv_map_next(&core->pipes, &i, n)) {
		struct srv_pipe *p = SRV_CONTAINER(n, struct srv_pipe, hn);
		if (!p->conn || p->closing)
			continue;
		if (p->nmsg == 0) {
			if (now - p->opened < core->first_request_ms)
				continue;
			core->m.conns_closed_first++;
			cohort__debug("closing connection %u: no complete "
			              "request within %.1f s",
			    p->id, (double)core->first_request_ms / 1000.0);
		} else {
			if (now - p->last_msg < core->idle_ms
			    || events_pipe_busy(p))
				continue;
			core->m.conns_closed_idle++;
			cohort__debug("closing connection %u: idle for %.1f s",
			    p->id, (double)(now - p->last_msg) / 1000.0);
		}
		p->closing = true;
		out[k++] = p->id;
	}
	return (k);
}

void
srv_core_pipe_closed(struct srv_core *core, uint32_t pipe, cohort__time now)
{
	struct srv_pipe *p;

	srv_pipe_note_closed(core, pipe, now);
	if (srv_pipe_find(core, pipe) == NULL)
		return;
	srv_core_event_begin(core);
	/* Every iteration unlinks one client; the pipe is freed with its
	 * last client, so test emptiness through a fresh lookup. */
	while ((p = srv_pipe_find(core, pipe)) != NULL
	    && !srv_list_empty(&p->clients)) {
		struct srv_client *cl
		    = SRV_CONTAINER(p->clients.next, struct srv_client, plink);
		struct srv_job *job = cl->job;
		job->last_active = now;
		srv_client_unlink_pipe(cl);
		/* First the failure (its text names the op the member was
		 * in), then the requests nobody can hear the answers to. */
		if (cl->member != NULL
		    && cl->member->state == SRV_MEMBER_RUNNING)
			srv_job_fail_member(job, cl->member,
			    COHORT__FAILURE_KIND__FAILURE_PROCESS,
			    "connection lost", now);
		srv_calls_drop_parked(cl, now);
		if (cl->member == NULL) {
			if (srv_client_has_durable(cl))
				srv_jrn_client_del(
				    core->jrn, &job->jr, cl->id);
			srv_client_free(cl);
		}
		srv_job_maybe_remove(job);
	}
	if ((p = srv_pipe_find(core, pipe)) != NULL)
		srv_pipe_remove(core, p);
	srv_core_event_end(core, now);
	srv_journal_tick(core, now);
}

bool
srv_core_cancel(struct srv_job *job, uint64_t client_id, uint64_t seq,
    cohort_status st, const char *why, cohort__time now)
{
	struct srv_client *cl = srv_client_find(&job->clients, client_id);

	return (cl != NULL && srv_call_cancel(cl, seq, st, why, now));
}

bool
srv_core_ready(struct srv_core *core, char *why, size_t len)
{
	const char *p;

	if (core->draining) {
		snprintf(why, len, "draining");
		return (false);
	}
	if ((p = srv_jrn_problem(core->jrn)) != NULL) {
		snprintf(why, len, "journal not writable: %s", p);
		return (false);
	}
	return (true);
}
