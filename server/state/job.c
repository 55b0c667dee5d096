/*
 * job.c - the job and member model: lookups, names of states, what a
 * rank is doing, a job's failure on a reply, the recent failures.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "job.h"

struct srv_job *
srv_job_find(const struct srv_core *core, const char *name)
{
	struct srv_hnode *n = srv_map_get(&core->jobs, name, strlen(name));

	return (n != NULL ? SRV_CONTAINER(n, struct srv_job, hn) : NULL);
}

const char *
srv_member_state_name(enum srv_member_state st)
{
	static const char *const names[] = {
		[SRV_MEMBER_RUNNING] = "running",
		[SRV_MEMBER_FAILED] = "failed",
		[SRV_MEMBER_LEFT] = "left",
	};

	return ((unsigned)st < sizeof(names) / sizeof(names[0]) ? names[st]
	                                                        : "left");
}

const char *
srv_job_state_name(const struct srv_job *job)
{
	if (job->rdzv_world != 0 || job->state == SRV_JOB_NEW)
		return ("rendezvous");
	if (job->state == SRV_JOB_FAILED)
		return ("failed");
	/* Every member left cleanly: the job is over (until a new
	 * rendezvous), not running. */
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++)
		if (job->members[r].state != SRV_MEMBER_LEFT)
			return ("running");
	return (job->members != NULL ? "finished" : "running");
}

bool
srv_job_has_live(const struct srv_job *job)
{
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++)
		if (job->members[r].state == SRV_MEMBER_RUNNING)
			return (true);
	return (false);
}

uint64_t
srv_core_members_total(struct srv_core *core)
{
	struct srv_hnode *n;
	uint64_t t = 0;
	size_t i;

	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		uint32_t w = job->members != NULL ? job->world : 0;
		/* an elastic job holds room for its maximum */
		if (job->members != NULL && job->max_world > w)
			w = job->max_world;
		t += job->rdzv_world > w ? job->rdzv_world : w;
	}
	return (t);
}

void
srv_job_clear_members(struct srv_job *job)
{
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		struct srv_member *m = &job->members[r];
		if (m->client != NULL)
			m->client->member = NULL;
		free(m->failure);
	}
	free(job->members);
	job->members = NULL;
}

void
srv_job_clear_failure(struct srv_job *job)
{
	free(job->failed_text);
	free(job->failed_detail);
	job->failed_text = NULL;
	job->failed_detail = NULL;
	job->failed_rank = -1;
	srv_failure_free(&job->failure);
	job->failed_at = 0;
}

void
srv_job_failure_init(Cohort__Failure *f)
{
	cohort__failure__init(f);
	/* NULL packs as "" and frees as nothing */
	f->host = f->operation = f->group = f->text = NULL;
}

void
srv_failure_free(Cohort__Failure *f)
{
	COHORT__FREE_ALL(f->host, f->operation, f->group, f->text);
	srv_job_failure_init(f);
}

void
srv_failure_fill(Cohort__Failure *f, const struct srv_member *m,
    Cohort__FailureKind kind, const char *operation, uint64_t seq,
    const char *group, Cohort__FailureOpState state, uint64_t op_age,
    const char *text, cohort__time now)
{
	f->kind = kind;
	f->rank = m->rank;
	f->host = srv_strdup(m->host);
	f->pid = m->pid;
	f->operation = srv_strdup(operation != NULL ? operation : "");
	f->seq = seq;
	f->group = srv_strdup(group != NULL ? group : "");
	f->op_state = state;
	f->op_age_ms = op_age;
	f->unix_ms = now != 0 ? cohort__wall_ms() : 0;
	f->text = srv_strdup(text != NULL ? text : "");
	/* out of memory leaves a string NULL, which packs as empty */
}

void
srv_job_set_failure(struct srv_job *job, const struct srv_member *m,
    Cohort__FailureKind kind, const char *operation, uint64_t seq,
    const char *group, Cohort__FailureOpState state, uint64_t op_age,
    cohort__time now)
{
	srv_failure_fill(&job->failure, m, kind, operation, seq, group, state,
	    op_age, job->failed_text, now);
	job->failed_at = now;
}

void
srv_job_clear_change(struct srv_job *job)
{
	struct srv_change *ch = &job->change;

	free(ch->text);
	free(ch->detail);
	srv_failure_free(&ch->failure);
	ch->text = ch->detail = NULL;
	ch->generation = 0;
	ch->rank = -1;
	ch->at = 0;
}

void
srv_call_membership(struct srv_call *c)
{
	struct srv_change *ch = &c->job->change;
	Cohort__Reply rep;
	char buf[256];

	srv_reply_init(&rep, c, COHORT_EMEMBERSHIP);
	if (ch->detail != NULL) {
		rep.error = ch->detail;
	} else {
		snprintf(buf, sizeof(buf),
		    "the membership of job '%s' changed: it is at generation "
		    "%" PRIu64 " (cohort_client_reform moves a member along)",
		    c->job->name, c->job->generation);
		rep.error = buf;
	}
	rep.failed_rank = ch->rank;
	if (ch->text != NULL)
		rep.failed_text = ch->text;
	if (ch->rank >= 0) {
		/* packed before the next call: the age is this reply's */
		ch->failure.age_ms = ch->at != 0 && c->start > ch->at
		    ? (uint64_t)(c->start - ch->at)
		    : 0;
		rep.failure = &ch->failure;
	}
	srv_call_answer(c, &rep, NULL, 0);
}

bool
srv_join_reply_fill(
    Cohort__JoinReply *jr, const struct srv_job *job, int32_t rank)
{
	uint32_t w = job->world;

	cohort__join_reply__init(jr);
	jr->hosts = calloc(w ? w : 1, sizeof(char *));
	jr->local_ranks = calloc(w ? w : 1, sizeof(int32_t));
	if (jr->hosts == NULL || jr->local_ranks == NULL) {
		srv_join_reply_free(jr);
		return (false);
	}
	for (uint32_t r = 0; r < w; r++) {
		jr->hosts[r] = (char *)job->members[r].host;
		jr->local_ranks[r] = job->members[r].local_rank;
	}
	jr->n_hosts = jr->n_local_ranks = w;
	jr->rank = rank;
	jr->world_size = w;
	jr->generation = job->generation;
	jr->job_id = job->job_id;
	jr->max_value_bytes = job->core->lim.max_value;
	jr->max_message_bytes
	    = job->core->lim.max_value + COHORT__ENVELOPE_ALLOWANCE;
	jr->min_world = job->min_world;
	jr->max_world = srv_job_elastic(job) ? job->max_world : 0;
	return (true);
}

void
srv_join_reply_free(Cohort__JoinReply *jr)
{
	free(jr->hosts);
	free(jr->local_ranks);
	jr->hosts = NULL;
	jr->local_ranks = NULL;
	jr->n_hosts = jr->n_local_ranks = 0;
}

void
srv_member_admit(struct srv_member *m, int32_t rank, const struct srv_call *c,
    bool has_state, cohort__time now)
{
	m->rank = rank;
	m->state = SRV_MEMBER_RUNNING;
	cohort__strlcpy(m->host, c->host ? c->host : "", sizeof(m->host));
	m->pid = c->pid;
	m->local_rank = c->local_rank;
	m->hb_ms = c->hb_ms ? c->hb_ms : COHORT__DEFAULT_HEARTBEAT_MS;
	m->dead_ms = c->dead_ms ? c->dead_ms : COHORT__DEFAULT_DEAD_AFTER_MS;
	m->last_seen = now;
	m->client = c->client;
	m->has_state = has_state;
	m->prev_rank = -1;
}

struct srv_jrn_member *
srv_member_recs(const struct srv_member *tab, uint32_t n)
{
	struct srv_jrn_member *recs = calloc(n ? n : 1, sizeof(*recs));

	for (uint32_t r = 0; recs != NULL && r < n; r++) {
		const struct srv_member *m = &tab[r];
		recs[r].client_id = m->client != NULL ? m->client->id : 0;
		recs[r].host = m->host;
		recs[r].pid = m->pid;
		recs[r].local_rank = m->local_rank;
		recs[r].hb_ms = m->hb_ms;
		recs[r].dead_ms = m->dead_ms;
		recs[r].prev_rank = m->prev_rank;
		recs[r].has_state = m->has_state;
	}
	return (recs);
}

struct srv_jrn_member *
srv_job_member_recs(const struct srv_job *job)
{
	return (srv_member_recs(job->members, job->world));
}

/* ------------------------------------------------------------------------ */
/* What a member is doing                                                   */
/* ------------------------------------------------------------------------ */

const struct srv_call *
srv_member_parked_op(const struct srv_member *m)
{
	const struct srv_link *l;

	if (m->client == NULL)
		return (NULL);
	for (l = m->client->parked.next; l != &m->client->parked;
	     l = l->next) {
		const struct srv_call *p
		    = SRV_CONTAINER(l, struct srv_call, clink);
		if (p->park == SRV_PARK_COLL || p->park == SRV_PARK_GROUP)
			return (p);
	}
	return (NULL);
}

void
srv_member_doing(const struct srv_member *m, cohort__time now, bool longform,
    char *buf, size_t len)
{
	char secs[32], what[700], grp[300];
	const struct srv_call *p;

	what[0] = grp[0] = '\0';
	if (m->state != SRV_MEMBER_RUNNING) {
		snprintf(buf, len, "rank %d %s", m->rank,
		    srv_member_state_name(m->state));
		return;
	}
	/* Parked here: cohortd knows exactly. */
	if ((p = srv_member_parked_op(m)) != NULL) {
		(void)srv_call_describe(p, what, sizeof(what));
		srv_fmt_secs(secs, sizeof(secs), now - p->start);
		if (longform)
			snprintf(buf, len, "rank %d is in %s since %s",
			    m->rank, what, secs);
		else
			snprintf(buf, len, "rank %d in %s", m->rank, what);
		return;
	}
	if (m->last_group[0] != '\0')
		snprintf(grp, sizeof(grp), " on group '%s'", m->last_group);
	if (m->in_op && m->last_op[0] != '\0') {
		srv_fmt_secs(secs, sizeof(secs), now - m->op_since);
		if (longform)
			snprintf(buf, len,
			    "rank %d is in %s #%" PRIu64 "%s "
			    "since %s",
			    m->rank, m->last_op, m->last_op_seq, grp, secs);
		else
			snprintf(buf, len, "rank %d in %s #%" PRIu64 "%s",
			    m->rank, m->last_op, m->last_op_seq, grp);
		return;
	}
	srv_fmt_secs(secs, sizeof(secs), now - m->last_seen);
	if (m->last_op[0] != '\0')
		snprintf(buf, len,
		    "rank %d last seen %s ago %s %s #%" PRIu64 "%s", m->rank,
		    secs, longform ? "doing" : "after", m->last_op,
		    m->last_op_seq, grp);
	else
		snprintf(buf, len, "rank %d last seen %s ago", m->rank, secs);
}

/* ------------------------------------------------------------------------ */
/* Failures                                                                 */
/* ------------------------------------------------------------------------ */

void
srv_reply_failure(Cohort__Reply *rep, struct srv_call *c)
{
	struct srv_job *job = c->job;

	rep->failed_rank = job->failed_rank;
	if (job->failed_text != NULL)
		rep->failed_text = job->failed_text;
	if (job->failed_detail != NULL)
		rep->error = job->failed_detail;
	if (job->failed_rank >= 0) {
		/* packed before the next call: the age is this reply's */
		job->failure.age_ms
		    = job->failed_at != 0 && c->start > job->failed_at
		    ? (uint64_t)(c->start - job->failed_at)
		    : 0;
		rep->failure = &job->failure;
	}
}

void
srv_call_peerlost(struct srv_call *c)
{
	Cohort__Reply rep;

	srv_reply_init(&rep, c, COHORT_EPEERLOST);
	srv_reply_failure(&rep, c);
	srv_call_answer(c, &rep, NULL, 0);
}

void
srv_failures_note(struct srv_core *core, const char *job, int32_t rank,
    const char *text, cohort__time now)
{
	struct srv_failure *f = &core->failures[core->failures_head];
	const struct srv_job *j = srv_job_find(core, job);

	core->failures_head = (core->failures_head + 1) % SRV_FAILURES;
	if (core->nfailures < SRV_FAILURES)
		core->nfailures++;
	cohort__strlcpy(f->job, job, sizeof(f->job));
	f->job_id = j != NULL ? j->job_id : 0;
	f->rank = rank;
	f->at = now;
	cohort__strlcpy(f->text, text != NULL ? text : "", sizeof(f->text));
}

const struct srv_failure *
srv_failures_get(const struct srv_core *core, unsigned i)
{
	if (i >= core->nfailures)
		return (NULL);
	return (&core->failures[(core->failures_head + SRV_FAILURES - 1 - i)
	    % SRV_FAILURES]);
}
