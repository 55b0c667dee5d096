/*
 * client.c - struct cohort_client (client.h): its group list, its failures
 * and their fan-out to every group, what it is doing (for heartbeats and
 * failure reports), deadlines, accessors. Opening, liveness and closing
 * are open.c's, above this file.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

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

cohort_status
cohort__client_new_group(struct cohort_client *c, const char *id, int32_t rank,
    int32_t size, const int32_t *global_ranks, struct cohort_group **out)
{
	const struct cohort__group_ctx ctx
	    = { c, c->coord, &c->obs, c->fault };

	return (cohort__group_alloc(
	    &ctx, id, rank, size, global_ranks, c->generation, out));
}

/* cohort__client_fail under c->mtx. */
static void
client_fail_locked(struct cohort_client *c, const cohort_failure *f)
{
	char text[COHORT__FAILURE_TEXT_MAX];
	struct cohort_group *g;
	int ok = COHORT_OK;

	/* EMEMBERSHIP lasts until a reform; a job that then fails for good
	 * (below its minimum) says so instead. */
	if (f->status == COHORT_EPEERLOST
	    && atomic_load(&c->error) == COHORT_EMEMBERSHIP)
		atomic_store(&c->error, COHORT_OK);
	if (atomic_compare_exchange_strong(&c->error, &ok, (int)f->status)) {
		c->failure = *f;
		cohort__failure_text(f, false, text, sizeof(text));
		if (f->status == COHORT_EMEMBERSHIP)
			cohort__info(
			    "job '%s' changed its membership (%s): %s", c->job,
			    cohort_failure_kind_name(f->kind), text);
		else
			cohort__warn("job '%s' failed (%s, %s): %s", c->job,
			    cohort_status_name(f->status),
			    cohort_failure_kind_name(f->kind), text);
	}
	for (g = c->groups; g != NULL; g = g->next)
		cohort__group_fail(g, f);
}

void
cohort__client_fail(struct cohort_client *c, const cohort_failure *f)
{
	pthread_mutex_lock(&c->mtx);
	client_fail_locked(c, f);
	pthread_mutex_unlock(&c->mtx);
}

void
cohort__client_fail_local(struct cohort_client *c, cohort_status st,
    cohort_failure_kind kind, const char *text)
{
	cohort_failure f;

	cohort__failure_local(&f, st, kind, "%s", text);
	cohort__client_fail(c, &f);
}

cohort_status
cohort__client_job_failed(
    struct cohort_client *c, cohort_status st, const Cohort__Reply *rep)
{
	cohort_failure f;

	if (st != COHORT_EPEERLOST && st != COHORT_ESTALE
	    && st != COHORT_EMEMBERSHIP)
		return (st);
	cohort__failure_from_reply(&f, st, rep);
	pthread_mutex_lock(&c->mtx);
	if (st == COHORT_EMEMBERSHIP && rep != NULL
	    && rep->generation > c->seen_generation)
		c->seen_generation = rep->generation;
	/* A reply to a request of an older generation, arriving after the
	 * client reformed to the one it names: nothing new. */
	if (st != COHORT_EMEMBERSHIP || rep == NULL || rep->generation == 0
	    || rep->generation > c->generation)
		client_fail_locked(c, &f);
	pthread_mutex_unlock(&c->mtx);
	return (st);
}

bool
cohort__client_generation_moved(struct cohort_client *c, uint64_t gen)
{
	cohort_failure f;
	bool moved;

	if (c->min_world <= 0)
		return (false);
	pthread_mutex_lock(&c->mtx);
	if (gen > c->seen_generation)
		c->seen_generation = gen;
	moved = gen > c->generation;
	if (moved) {
		cohort__failure_local(&f, COHORT_EMEMBERSHIP,
		    COHORT_FAILURE_GENERATION,
		    "the membership of job '%s' changed: it moved from "
		    "generation %" PRIu64 " to %" PRIu64
		    " (cohort_client_reform moves this process along)",
		    c->job, c->generation, gen);
		client_fail_locked(c, &f);
	}
	pthread_mutex_unlock(&c->mtx);
	return (moved);
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
/* What this rank is doing                                                  */
/* ------------------------------------------------------------------------ */

/* Takes mtx; with try, only if it is free now. */
static bool
client_lock(pthread_mutex_t *mtx, bool try)
{
	if (try)
		return (pthread_mutex_trylock(mtx) == 0);
	pthread_mutex_lock(mtx);
	return (true);
}

static bool
client_doing(struct cohort_client *c, Cohort__Heartbeat *hb, char *grp,
    size_t grplen, bool try)
{
	struct cohort_group *g, *best = NULL;
	bool best_in = false, all = true;
	cohort__time best_t = 0, now = cohort__now_ms();

	hb->last_op = "";
	hb->last_group = grp;
	grp[0] = '\0';
	if (!client_lock(&c->mtx, try))
		return (false);
	for (g = c->groups; g != NULL; g = g->next) {
		bool in;
		cohort__time t;

		if (!client_lock(&g->mtx, try)) {
			all = false;
			break;
		}
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
	return (all);
}

void
cohort__client_doing(
    struct cohort_client *c, Cohort__Heartbeat *hb, char *grp, size_t grplen)
{
	(void)client_doing(c, hb, grp, grplen, false);
}

bool
cohort__client_doing_try(
    struct cohort_client *c, Cohort__Heartbeat *hb, char *grp, size_t grplen)
{
	return (client_doing(c, hb, grp, grplen, true));
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
	char text[COHORT__FAILURE_TEXT_MAX];
	cohort_failure f;
	cohort_status st;

	if (c == NULL)
		return (COHORT_EINVAL);
	st = (cohort_status)atomic_load(&m->error);
	if (st == COHORT_OK && cohort__coord_lost(m->coord))
		return (cohort__err(COHORT_ENOCOORD,
		    "connection to the coordinator at %s was lost",
		    m->coordinator));
	if (st == COHORT_OK)
		return (COHORT_OK);
	pthread_mutex_lock(&m->mtx);
	f = m->failure;
	pthread_mutex_unlock(&m->mtx);
	cohort__failure_text(&f, false, text, sizeof(text));
	return (cohort__err(st, "%s", text));
}

bool
cohort_timeline_enabled(const cohort_client *c)
{
	return (c != NULL && cohort__obs_timeline_on(&c->obs));
}

void
cohort_timeline_span(cohort_client *c, const char *name, uint64_t start_ns,
    uint64_t end_ns, uint64_t bytes)
{
	if (c != NULL)
		cohort__obs_span(&c->obs, name, start_ns, end_ns, bytes);
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
	cohort__client_doing(c, &doing, grp, sizeof(grp));
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
