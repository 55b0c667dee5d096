/*
 * member.c - members of a running generation (proto/README.md section
 * 4): leave, heartbeats (what a rank reports doing), watches, failure
 * reports, silence; and the failure fan-out: a failure marks the job
 * failed at its generation and answers every parked collective, group
 * creation and watch with COHORT_EPEERLOST, naming the rank, its host and
 * pid, and the operation it was in. KV keeps working.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pipes.h"
#include "core/util.h"
#include "journal/log.h"
#include "coll.h"
#include "elastic.h"
#include "member.h"
#include "rdzv.h"

void
srv_member_leave(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	struct srv_job *job = c->job;
	struct srv_member *m = c->client->member;
	struct srv_link *l, *next;

	/* A join still parked for this client is withdrawn. */
	for (l = c->client->parked.next; l != &c->client->parked; l = next) {
		struct srv_call *p = SRV_CONTAINER(l, struct srv_call, clink);
		next = l->next;
		if (p->park != SRV_PARK_JOIN)
			continue;
		srv_call_withdraw(p, now);
		srv_call_fail(p, COHORT_ECLOSED,
		    "the client left before the rendezvous completed");
	}
	if (m != NULL && m->state == SRV_MEMBER_RUNNING) {
		m->state = SRV_MEMBER_LEFT;
		m->in_op = false; /* gone: in no operation any more */
		srv_jrn_leave(job->core->jrn, &job->jr, m->rank);
		cohort__info("job '%s': rank %d (%s:%u) left", job->name,
		    m->rank, m->host, m->pid);
		srv_coll_rank_left(job, m->rank);
	}
	srv_pipe_close_later(job->core, c->client->pipe, now + 50);
	srv_call_fail(c, COHORT_OK, "%s", "");
}

/* Notes what a member reports doing (a heartbeat, or a failure report). */
static void
job_note_doing(
    struct srv_member *m, const Cohort__Heartbeat *hb, cohort__time now)
{
	bool same = m->in_op && hb->in_op && m->last_op_seq == hb->last_op_seq
	    && strcmp(m->last_group, hb->last_group) == 0;

	cohort__strlcpy(m->last_op, hb->last_op, sizeof(m->last_op));
	cohort__strlcpy(m->last_group, hb->last_group, sizeof(m->last_group));
	m->last_op_seq = hb->last_op_seq;
	/* Keep the first estimate of the entry time of one op, so that
	 * heartbeat delays do not move it. */
	if (!same) {
		cohort__time in = (cohort__time)hb->in_op_ms;
		m->op_since = in < now ? now - in : 0;
	}
	m->in_op = hb->in_op;
	m->op_at = now;
}

void
srv_member_heartbeat(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const Cohort__Heartbeat *hb = req->heartbeat;
	struct srv_job *job = c->job;
	struct srv_member *m = c->client->member;
	Cohort__Reply rep;
	Cohort__HeartbeatReply hr;

	if (m != NULL)
		job_note_doing(m, hb, now);
	srv_reply_init(&rep, c, COHORT_OK);
	cohort__heartbeat_reply__init(&hr);
	hr.healthy = job->state != SRV_JOB_FAILED;
	hr.server_time_ms = (uint64_t)now;
	hr.generation = job->generation;
	hr.joiners_waiting = job->njoiners;
	if (!hr.healthy)
		srv_reply_failure(&rep, c);
	rep.body_case = COHORT__REPLY__BODY_HEARTBEAT;
	rep.heartbeat = &hr;
	srv_call_answer(c, &rep, NULL, 0);
}

static void
job_withdraw_watch(struct srv_call *c)
{
	srv_list_remove(&c->olink);
}

static void
job_expire_watch(struct srv_call *c, cohort__time now)
{
	Cohort__Reply rep;

	srv_call_withdraw(c, now);
	srv_reply_init(&rep, c, COHORT_OK);
	srv_call_answer(c, &rep, NULL, 0);
}

/* A watch waits in job->watchers. */
static const struct srv_park_ops job_park_watch
    = { SRV_PARK_WATCH, job_withdraw_watch, job_expire_watch, NULL, NULL };

void
srv_member_watch(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	struct srv_job *job = c->job;

	(void)now;
	if (job->state == SRV_JOB_FAILED) {
		srv_call_peerlost(c);
		return;
	}
	srv_list_append(&job->watchers, &c->olink);
	srv_call_park(c, &job_park_watch);
}

void
srv_member_report(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const Cohort__ReportFailure *rf = req->report_failure;
	struct srv_member *m = c->client->member;

	if (m == NULL) {
		srv_call_fail(c, COHORT_ESTATE,
		    "only a member of job '%s' can report a failure",
		    c->job->name);
		return;
	}
	if (rf->doing != NULL && rf->doing->last_op != NULL
	    && rf->doing->last_op[0] != '\0')
		job_note_doing(m, rf->doing, now);
	srv_job_fail_member(c->job, m, COHORT__FAILURE_KIND__FAILURE_REPORTED,
	    rf->text[0] != '\0' ? rf->text : "failure reported without text",
	    now);
	srv_call_fail(c, COHORT_OK, "%s", "");
}

struct srv_member *
srv_member_running(struct srv_call *c)
{
	struct srv_job *job = c->job;
	struct srv_member *m = c->client->member;

	if (m == NULL) {
		/* a process an elastic change removed is told so */
		srv_elastic_no_member(c);
		return (NULL);
	}
	if (job->state == SRV_JOB_FAILED) {
		srv_call_peerlost(c);
		return (NULL);
	}
	if (m->state == SRV_MEMBER_LEFT) {
		srv_call_fail(c, COHORT_ESTATE,
		    "rank %d already left job '%s'", m->rank, job->name);
		return (NULL);
	}
	return (m);
}

/* ------------------------------------------------------------------------ */
/* Failure                                                                  */
/* ------------------------------------------------------------------------ */

/* "TEXT's first line; why" and the rest of TEXT (a traceback's further
 * lines stay last), malloc'd (NULL: out of memory). */
static char *
member_text_with(const char *text, const char *why)
{
	const char *nl = strchr(text, '\n');
	size_t first = nl != NULL ? (size_t)(nl - text) : strlen(text);
	size_t n = strlen(text) + strlen(why) + 3;
	char *s = malloc(n);

	if (s != NULL)
		snprintf(s, n, "%.*s; %s%s", (int)first, text, why,
		    nl != NULL ? nl : "");
	return (s);
}

/* An elastic job stopped: its joins wait in its next rendezvous (the one
 * its restarted members join), in arrival order. */
static void
member_joiners_to_rdzv(struct srv_job *job, cohort__time now)
{
	size_t n;
	struct srv_call **calls = srv_elastic_take_joiners(job, &n);

	for (size_t i = 0; i < n; i++)
		srv_rdzv_enter(calls[i], now);
	free(calls);
}

void
srv_job_fail_member(struct srv_job *job, struct srv_member *m,
    Cohort__FailureKind kind, const char *text, cohort__time now)
{
	char op[800], detail[1800], what[700] = "", why[256];
	const struct srv_call *p;
	const char *nl, *group = "";
	char *stop_text = NULL;
	uint64_t seq = 0, op_age = 0;
	Cohort__FailureOpState state
	    = COHORT__FAILURE_OP_STATE__FAILURE_OP_UNKNOWN;
	int tl;

	if (m->state != SRV_MEMBER_RUNNING)
		return;
	m->state = SRV_MEMBER_FAILED;
	job->core->m.failures++;
	srv_failures_note(job->core, job->name, m->rank, text, now);
	op[0] = '\0';
	if ((p = srv_member_parked_op(m)) != NULL) {
		(void)srv_call_describe(p, op, sizeof(op));
		if (srv_call_what(p, what, sizeof(what), &seq, &group))
			state = COHORT__FAILURE_OP_STATE__FAILURE_OP_DURING;
	}
	if (op[0] == '\0' && m->last_op[0] != '\0') {
		/* Known now (reported with the failure), or only from the
		 * last heartbeat: then say how old it is, never that the
		 * rank failed "during" an operation it may have finished. */
		cohort__strlcpy(what, m->last_op, sizeof(what));
		seq = m->last_op_seq;
		group = m->last_group;
		state = m->in_op ? COHORT__FAILURE_OP_STATE__FAILURE_OP_DURING
		                 : COHORT__FAILURE_OP_STATE__FAILURE_OP_AFTER;
		op_age = m->op_at == now ? 0 : (uint64_t)(now - m->op_at);
		if (m->op_at == now)
			snprintf(op, sizeof(op), "%s %s (#%" PRIu64 ")",
			    m->in_op ? "during" : "after", m->last_op,
			    m->last_op_seq);
		else
			snprintf(op, sizeof(op),
			    "(its last heartbeat, %.1f s before: %s %s "
			    "#%" PRIu64 ")",
			    (double)(now - m->op_at) / 1000.0,
			    m->in_op ? "in" : "after", m->last_op,
			    m->last_op_seq);
	} else if (op[0] != '\0') {
		char parked[sizeof(op)];
		cohort__strlcpy(parked, op, sizeof(parked));
		snprintf(op, sizeof(op), "during %.780s", parked);
	}
	nl = strchr(text, '\n');
	tl = nl != NULL ? (int)(nl - text) : (int)strlen(text);
	if (tl > 300)
		tl = 300;
	snprintf(detail, sizeof(detail), "rank %d (%s:%u) failed%s%s: %.*s",
	    m->rank, m->host, m->pid, op[0] ? " " : "", op, tl, text);
	{
		/* job, rank, op and seq as fields of a JSON log line */
		struct cohort__log_ctx lc = { job->name, m->rank,
			m->last_op[0] != '\0' ? m->last_op : NULL,
			m->last_op_seq };
		const struct cohort__log_ctx *saved
		    = cohort__log_ctx_push(&lc);

		cohort__warn("job '%s' generation %" PRIu64 ": %s", job->name,
		    job->generation, detail);
		cohort__log_ctx_pop(saved);
	}
	if (job->state == SRV_JOB_RUNNING && srv_job_elastic(job)) {
		/* Elastic (README 8.2): the survivors go on in a new
		 * generation, or the job stops saying why. The FAIL record
		 * comes first: the replay of the reshape finds the lost
		 * member failed. */
		struct srv_el_loss loss
		    = { kind, what, seq, group, state, op_age, text, detail };
		size_t off = strlen(detail);
		if (srv_elastic_survivable(job, why, sizeof(why))) {
			free(m->failure);
			m->failure = srv_strdup(text);
			srv_jrn_fail(job->core->jrn, &job->jr, m->rank,
			    m->failure, detail);
			if (srv_elastic_shrink(job, m, &loss, now))
				return;
			snprintf(why, sizeof(why),
			    "cohortd ran out of memory re-forming it");
		}
		stop_text = member_text_with(text, why);
		if (stop_text != NULL)
			text = stop_text;
		cohort__appendf(detail, sizeof(detail), &off,
		    "; job '%s' stops: %s", job->name, why);
		cohort__warn("job '%s' stops at generation %" PRIu64 ": %s",
		    job->name, job->generation, why);
	}
	free(m->failure);
	m->failure = srv_strdup(text);
	srv_jrn_fail(job->core->jrn, &job->jr, m->rank, m->failure, detail);
	if (job->state != SRV_JOB_RUNNING) {
		free(stop_text);
		return;
	}
	job->state = SRV_JOB_FAILED;
	srv_job_clear_failure(job);
	job->failed_rank = m->rank;
	job->failed_text = srv_strdup(text);
	job->failed_detail = srv_strdup(detail);
	srv_job_set_failure(
	    job, m, kind, what, seq, group, state, op_age, now);
	free(stop_text);
	srv_coll_reset(job, COHORT_EPEERLOST, detail, false);
	while (!srv_list_empty(&job->watchers)) {
		struct srv_call *c = SRV_CONTAINER(
		    job->watchers.next, struct srv_call, olink);
		srv_list_remove(&c->olink);
		srv_call_peerlost(c);
	}
	if (job->njoiners > 0)
		member_joiners_to_rdzv(job, now);
}

void
srv_member_sweep(struct srv_job *job, cohort__time now)
{
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		struct srv_member *m = &job->members[r];
		uint64_t gen = job->generation;
		char text[64];
		if (m->state != SRV_MEMBER_RUNNING
		    || now - m->last_seen <= (cohort__time)m->dead_ms
		    || now < m->grace_until)
			continue;
		if (m->restored_at != 0 && m->last_seen == m->restored_at)
			snprintf(text, sizeof(text),
			    "did not reconnect within %.1f s of cohortd's "
			    "restart",
			    (double)(now - m->restored_at) / 1000.0);
		else
			snprintf(text, sizeof(text), "no heartbeat for %.1f s",
			    (double)(now - m->last_seen) / 1000.0);
		srv_job_fail_member(job, m,
		    m->restored_at != 0 && m->last_seen == m->restored_at
		        ? COHORT__FAILURE_KIND__FAILURE_RESTORE
		        : COHORT__FAILURE_KIND__FAILURE_HEARTBEAT,
		    text, now);
		/* an elastic job went on without it (or a rendezvous of its
		 * joiners formed): another member table, from the start */
		if (job->generation != gen)
			r = (uint32_t)-1;
	}
}

/* ------------------------------------------------------------------------ */
/* Journal replay and cohortd's own stalls                                  */
/* ------------------------------------------------------------------------ */

void
srv_member_restore_fail(
    struct srv_job *job, int32_t rank, const char *text, const char *detail)
{
	struct srv_member *m;

	if (job->members == NULL || rank < 0 || (uint32_t)rank >= job->world)
		return;
	m = &job->members[rank];
	if (m->state != SRV_MEMBER_RUNNING)
		return;
	m->state = SRV_MEMBER_FAILED;
	free(m->failure);
	m->failure = srv_strdup(text);
	if (job->state != SRV_JOB_RUNNING)
		return;
	job->state = SRV_JOB_FAILED;
	srv_job_clear_failure(job);
	job->failed_rank = rank;
	job->failed_text = srv_strdup(text);
	job->failed_detail = srv_strdup(detail);
	/* the journal keeps the text, not the fields: the kind and the
	 * time are unknown */
	srv_job_set_failure(job, m, COHORT__FAILURE_KIND__FAILURE_UNKNOWN, "",
	    0, "", COHORT__FAILURE_OP_STATE__FAILURE_OP_UNKNOWN, 0, 0);
}

cohort_status
srv_member_restore_leave(struct srv_job *job, int32_t rank)
{
	if (job->members == NULL || rank < 0 || (uint32_t)rank >= job->world)
		return (COHORT_EPROTO);
	if (job->members[rank].state == SRV_MEMBER_RUNNING)
		job->members[rank].state = SRV_MEMBER_LEFT;
	return (COHORT_OK);
}

size_t
srv_member_credit_lag(struct srv_job *job, cohort__time lag, cohort__time now)
{
	size_t n = 0;

	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		struct srv_member *m = &job->members[r];
		if (m->state != SRV_MEMBER_RUNNING)
			continue;
		m->last_seen
		    = m->last_seen + lag < now ? m->last_seen + lag : now;
		n++;
	}
	return (n);
}
