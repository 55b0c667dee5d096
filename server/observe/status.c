/*
 * status.c - StatusQuery (`cohort status`): jobs, members with the time
 * since they were last heard of, and pending operations with the ranks
 * that arrived and the ones still missing; and the same as the status
 * page's JSON (/status.json), with the recent failures.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "state/coll.h"
#include "state/groups.h"
#include "state/job.h"
#include "state/kv.h"
#include "state/stall.h"
#include "ranks.h"
#include "status.h"

/* Everything allocated for one reply, freed after packing. */
struct status_build {
	void **ptrs;
	size_t n, cap;
	bool oom;
};

static void *
sb_alloc(struct status_build *sb, size_t size)
{
	void *p;

	if (sb->n == sb->cap) {
		size_t cap = sb->cap ? sb->cap * 2 : 64;
		void **np = realloc(sb->ptrs, cap * sizeof(void *));
		if (np == NULL) {
			sb->oom = true;
			return (NULL);
		}
		sb->ptrs = np;
		sb->cap = cap;
	}
	if ((p = calloc(1, size ? size : 1)) == NULL) {
		sb->oom = true;
		return (NULL);
	}
	sb->ptrs[sb->n++] = p;
	return (p);
}

static Cohort__PendingOp *
status_pending(struct status_build *sb, const char *group, uint64_t op_seq,
    const char *kind, const char *name, cohort__time waiting,
    const int32_t *ranks, uint32_t n, const uint8_t *arrived)
{
	Cohort__PendingOp *op = sb_alloc(sb, sizeof(*op));
	int32_t *a = sb_alloc(sb, sizeof(int32_t) * (n ? n : 1));
	int32_t *m = sb_alloc(sb, sizeof(int32_t) * (n ? n : 1));

	if (op == NULL || a == NULL || m == NULL)
		return (NULL);
	cohort__pending_op__init(op);
	op->group = (char *)group;
	op->op_seq = op_seq;
	op->kind = (char *)kind;
	op->name = (char *)name;
	op->waiting_ms = (uint64_t)(waiting > 0 ? waiting : 0);
	op->arrived = a;
	op->missing = m;
	for (uint32_t i = 0; i < n; i++) {
		if (arrived[i])
			a[op->n_arrived++] = ranks[i];
		else
			m[op->n_missing++] = ranks[i];
	}
	return (op);
}

static char *
sb_strdup(struct status_build *sb, const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = sb_alloc(sb, n);

	if (d != NULL)
		memcpy(d, s, n);
	return (d);
}

struct status_data {
	struct status_build *sb;
	Cohort__PendingOp **pend;
	size_t *k;
	size_t cap;
	cohort__time now;
};

/* A data-plane stall seen through heartbeats, as a pending op. */
static void
status_data_stall(void *arg, const struct srv_member *m,
    const struct srv_group *g, const uint8_t *entered, const char *text)
{
	struct status_data *d = arg;
	Cohort__PendingOp *op;

	if (*d->k >= d->cap)
		return;
	op = status_pending(d->sb, g->name, m->last_op_seq, m->last_op, "",
	    d->now - m->op_since, g->ranks, g->n, entered);
	if (op == NULL)
		return;
	op->stalled = true;
	op->data_plane = true;
	op->detail = sb_strdup(d->sb, text);
	d->pend[(*d->k)++] = op;
}

/* The pending rendezvous: who joined (rank -1 joins fill the lowest
 * free ranks). */
static Cohort__PendingOp *
status_rdzv(struct status_build *sb, struct srv_job *job, cohort__time now)
{
	uint8_t *arr = sb_alloc(sb, job->rdzv_world);
	int32_t *ranks = sb_alloc(sb, sizeof(int32_t) * job->rdzv_world);
	uint32_t nauto = job->rdzv_n;

	if (arr == NULL || ranks == NULL)
		return (NULL);
	for (uint32_t r = 0; r < job->rdzv_world; r++) {
		ranks[r] = (int32_t)r;
		if (job->rdzv_by_rank[r] != NULL) {
			arr[r] = 1;
			nauto--;
		}
	}
	for (uint32_t r = 0; r < job->rdzv_world && nauto > 0; r++) {
		if (!arr[r]) {
			arr[r] = 1;
			nauto--;
		}
	}
	return (status_pending(sb, "", 0, "join", "", now - job->rdzv_start,
	    ranks, job->rdzv_world, arr));
}

/* A pending collective, marked stalled past --stall-threshold. */
static Cohort__PendingOp *
status_coll(struct status_build *sb, struct srv_job *job,
    const struct srv_coll *co, cohort__time now)
{
	Cohort__PendingOp *op = status_pending(sb, co->g->name, co->op_seq,
	    srv_coll_kind_name(co->cd.kind), co->cd.name, now - co->first,
	    co->g->ranks, co->g->n, co->arrived);

	if (op != NULL && job->state == SRV_JOB_RUNNING
	    && srv_stall_coll(co, now)) {
		char buf[2400];
		srv_stall_text(co, now, buf, sizeof(buf));
		op->stalled = true;
		op->detail = sb_strdup(sb, buf);
	}
	return (op);
}

/* A pending group creation. */
static Cohort__PendingOp *
status_group(
    struct status_build *sb, const struct srv_group *g, cohort__time now)
{
	uint8_t *arr = sb_alloc(sb, g->n);

	if (arr == NULL)
		return (NULL);
	for (uint32_t r = 0; r < g->n; r++)
		arr[r] = g->arr[r] != NULL;
	return (status_pending(sb, g->name, 0, "group_create", g->name,
	    now - g->first, g->ranks, g->n, arr));
}

static Cohort__JobStatus *
status_job(struct status_build *sb, struct srv_job *job, cohort__time now)
{
	Cohort__JobStatus *js = sb_alloc(sb, sizeof(*js));
	size_t npend = job->colls.n + job->groups.n + 1 + job->world, k = 0, i;
	struct status_data dd;
	struct srv_hnode *n;
	Cohort__PendingOp **pend = sb_alloc(sb, sizeof(void *) * npend);

	if (js == NULL || pend == NULL)
		return (NULL);
	cohort__job_status__init(js);
	js->job = job->name;
	js->generation = job->generation;
	js->world_size = job->world;
	js->state = (char *)srv_job_state_name(job);
	js->kv_keys = srv_kv_count(job->kv);
	js->kv_bytes = srv_kv_bytes(job->kv);
	js->failed_rank = job->failed_rank;
	js->failed_text = job->failed_text != NULL ? job->failed_text : "";
	js->min_world = job->min_world;
	js->max_world = srv_job_elastic(job) ? job->max_world : 0;
	js->joiners_waiting = job->njoiners;
	if (job->failed_rank >= 0) {
		job->failure.age_ms
		    = job->failed_at != 0 && now > job->failed_at
		    ? (uint64_t)(now - job->failed_at)
		    : 0;
		js->failure = &job->failure;
	}
	if (job->failed_rank >= 0) {
		job->failure.age_ms
		    = job->failed_at != 0 && now > job->failed_at
		    ? (uint64_t)(now - job->failed_at)
		    : 0;
		js->failure = &job->failure;
	}
	if (job->members != NULL) {
		js->members = sb_alloc(sb, sizeof(void *) * job->world);
		if (js->members == NULL)
			return (NULL);
		for (uint32_t r = 0; r < job->world; r++) {
			struct srv_member *m = &job->members[r];
			Cohort__MemberStatus *ms = sb_alloc(sb, sizeof(*ms));
			if (ms == NULL)
				return (NULL);
			cohort__member_status__init(ms);
			ms->rank = m->rank;
			ms->host = m->host;
			ms->pid = m->pid;
			ms->last_seen_ms_ago = (uint64_t)(now - m->last_seen);
			ms->state = (char *)srv_member_state_name(m->state);
			ms->last_op = m->last_op;
			ms->last_op_seq = m->last_op_seq;
			ms->last_group = m->last_group;
			ms->in_op = m->in_op && m->state == SRV_MEMBER_RUNNING;
			if (ms->in_op && now > m->op_since)
				ms->in_op_ms = (uint64_t)(now - m->op_since);
			if (m->failure != NULL)
				ms->failure = m->failure;
			(void)srv_obs_totals(job->core, job->name, m->rank,
			    &ms->collectives, &ms->collective_bytes,
			    &ms->collective_ns, &ms->wait_ns);
			js->members[js->n_members++] = ms;
		}
	}
	if (job->rdzv_world != 0
	    && (pend[k++] = status_rdzv(sb, job, now)) == NULL)
		return (NULL);
	for (n = srv_map_next(&job->colls, &i, NULL); n != NULL;
	     n = srv_map_next(&job->colls, &i, n))
		if ((pend[k++] = status_coll(
		         sb, job, SRV_CONTAINER(n, struct srv_coll, hn), now))
		    == NULL)
			return (NULL);
	for (n = srv_map_next(&job->groups, &i, NULL); n != NULL;
	     n = srv_map_next(&job->groups, &i, n)) {
		struct srv_group *g = SRV_CONTAINER(n, struct srv_group, hn);
		if (!g->complete
		    && (pend[k++] = status_group(sb, g, now)) == NULL)
			return (NULL);
	}
	if (job->state == SRV_JOB_RUNNING) {
		dd.sb = sb;
		dd.pend = pend;
		dd.k = &k;
		dd.cap = npend;
		dd.now = now;
		srv_stall_data(job, now, status_data_stall, &dd);
	}
	if (sb->oom)
		return (NULL);
	js->pending = pend;
	js->n_pending = k;
	return (js);
}

/* Who may see what (docs/security.md): one job with its token or the
 * admin secret; all jobs with the admin secret, or anyone when cohortd
 * has none. The StatusQuery and the status page (/status.json) share it.
 * False: refused; else *only is the job asked for (NULL: all). */
static bool
status_allowed(struct srv_core *core, const char *want, const char *token,
    struct srv_job **only)
{
	bool admin = core->admin_token != NULL
	    && srv_token_eq(core->admin_token, token);

	*only = NULL;
	if (want[0] != '\0') {
		*only = srv_job_find(core, want);
		return (*only != NULL
		    && (srv_token_eq((*only)->token, token) || admin));
	}
	/* Every job's names, hosts, pids and failure texts: only for the
	 * operator (docs/security.md), or anyone with --open-status. */
	return (admin || (core->admin_token == NULL && core->open_status));
}

/* Fills sr with the status of only (NULL: every job). */
static void
status_collect(struct status_build *sb, struct srv_core *core,
    struct srv_job *only, cohort__time now, Cohort__StatusReply *sr)
{
	cohort__status_reply__init(sr);
	sr->uptime_ms = (uint64_t)(now - core->started);
	sr->clients = core->nclients;
	sr->jobs = sb_alloc(sb, sizeof(void *) * (core->jobs.n + 1));
	if (sr->jobs == NULL)
		return;
	if (only != NULL) {
		if ((sr->jobs[0] = status_job(sb, only, now)) != NULL)
			sr->n_jobs = 1;
	} else {
		size_t i;
		struct srv_hnode *n;
		for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
		     n = srv_map_next(&core->jobs, &i, n)) {
			Cohort__JobStatus *js = status_job(
			    sb, SRV_CONTAINER(n, struct srv_job, hn), now);
			if (js == NULL)
				break;
			sr->jobs[sr->n_jobs++] = js;
		}
	}
}

void
srv_status_handle(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	struct srv_core *core = c->core;
	const char *want = req->status_query->job[0] != '\0'
	    ? req->status_query->job
	    : req->job;
	struct srv_job *only = NULL;
	struct status_build sb = { NULL, 0, 0, false };
	Cohort__StatusReply sr;
	Cohort__Reply rep;

	if (want[0] == '\0' && core->admin_token == NULL
	    && !core->open_status) {
		srv_call_fail(c, COHORT_EAUTH,
		    "a status query for all jobs needs cohortd's admin "
		    "secret, and this cohortd has none (--admin-token-file; "
		    "--open-status for a private coordinator); ask for one "
		    "job with its token (--job JOB --token-file FILE)");
		return;
	}
	if (!status_allowed(core, want, req->token, &only)) {
		srv_call_fail(c, COHORT_EAUTH, "authentication failed");
		return;
	}
	status_collect(&sb, core, only, now, &sr);
	if (sb.oom) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
	} else {
		srv_reply_init(&rep, c, COHORT_OK);
		rep.body_case = COHORT__REPLY__BODY_STATUS_QUERY;
		rep.status_query = &sr;
		srv_call_answer(c, &rep, NULL, 0);
	}
	for (size_t i = 0; i < sb.n; i++)
		free(sb.ptrs[i]);
	free(sb.ptrs);
}

/* ------------------------------------------------------------------------ */
/* The status page's JSON (/status.json)                                    */
/* ------------------------------------------------------------------------ */

struct json_buf {
	char *p;
	size_t cap, off;
	bool oom;
};

static void json_put(void *arg, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
json_put(void *arg, const char *fmt, ...)
{
	struct json_buf *b = arg;
	va_list ap;
	int n;

	while (!b->oom) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->off, b->cap - b->off, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
		} else if ((size_t)n < b->cap - b->off) {
			b->off += (size_t)n;
			return;
		} else {
			size_t cap = (b->cap + (size_t)n) * 2;
			char *np = realloc(b->p, cap);
			if (np == NULL)
				b->oom = true;
			else {
				b->p = np;
				b->cap = cap;
			}
		}
	}
}

/* A JSON string, quoted; bytes >= 0x80 pass through (names and texts are
 * UTF-8 as sent). */
static void
json_str(void *arg, const char *s)
{
	json_put(arg, "\"");
	for (; s != NULL && *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			json_put(arg, "\\%c", c);
		else if (c < 0x20)
			json_put(arg, "\\u%04x", c);
		else if (c == '<')
			json_put(arg, "\\u003c"); /* never closes a tag */
		else
			json_put(arg, "%c", c);
	}
	json_put(arg, "\"");
}

static void
json_ranks(struct json_buf *b, const int32_t *r, size_t n)
{
	json_put(b, "[");
	for (size_t i = 0; i < n; i++)
		json_put(b, "%s%d", i ? "," : "", (int)r[i]);
	json_put(b, "]");
}

static void
json_job(struct json_buf *b, const Cohort__JobStatus *js)
{
	json_put(b, "{\"job\":");
	json_str(b, js->job);
	json_put(b,
	    ",\"generation\":%" PRIu64 ",\"world_size\":%u,\"min_world\":%u"
	    ",\"max_world\":%u,\"joiners_waiting\":%u,\"state\":",
	    js->generation, js->world_size, js->min_world, js->max_world,
	    js->joiners_waiting);
	json_str(b, js->state);
	json_put(b, ",\"failed_rank\":%d,\"failed_text\":", js->failed_rank);
	json_str(b, js->failed_text);
	json_put(b, ",\"members\":[");
	for (size_t i = 0; i < js->n_members; i++) {
		const Cohort__MemberStatus *m = js->members[i];
		json_put(b, "%s{\"rank\":%d,\"host\":", i ? "," : "", m->rank);
		json_str(b, m->host);
		json_put(b, ",\"pid\":%u,\"state\":", m->pid);
		json_str(b, m->state);
		json_put(b, ",\"last_seen_ms\":%" PRIu64 ",\"op\":",
		    m->last_seen_ms_ago);
		json_str(b, m->last_op);
		json_put(
		    b, ",\"op_seq\":%" PRIu64 ",\"group\":", m->last_op_seq);
		json_str(b, m->last_group);
		json_put(b,
		    ",\"in_op\":%s,\"in_op_ms\":%" PRIu64
		    ",\"collectives\":%" PRIu64 ",\"bytes\":%" PRIu64
		    ",\"collective_ns\":%" PRIu64 ",\"wait_ns\":%" PRIu64
		    ",\"failure\":",
		    m->in_op ? "true" : "false", m->in_op_ms, m->collectives,
		    m->collective_bytes, m->collective_ns, m->wait_ns);
		json_str(b, m->failure);
		json_put(b, "}");
	}
	json_put(b, "],\"pending\":[");
	for (size_t i = 0; i < js->n_pending; i++) {
		const Cohort__PendingOp *p = js->pending[i];
		json_put(b, "%s{\"group\":", i ? "," : "");
		json_str(b, p->group);
		json_put(b, ",\"op_seq\":%" PRIu64 ",\"kind\":", p->op_seq);
		json_str(b, p->kind);
		json_put(b, ",\"name\":");
		json_str(b, p->name);
		json_put(b,
		    ",\"waiting_ms\":%" PRIu64 ",\"arrived\":", p->waiting_ms);
		json_ranks(b, p->arrived, p->n_arrived);
		json_put(b, ",\"missing\":");
		json_ranks(b, p->missing, p->n_missing);
		json_put(b, ",\"stalled\":%s,\"data_plane\":%s,\"detail\":",
		    p->stalled ? "true" : "false",
		    p->data_plane ? "true" : "false");
		json_str(b, p->detail);
		json_put(b, "}");
	}
	json_put(b, "]}");
}

/* Recent failures of job ("" = all), newest first, as a JSON array. */
static void
json_failures(struct json_buf *b, const struct srv_core *core, const char *job,
    cohort__time now)
{
	const struct srv_failure *f;
	bool first = true;

	json_put(b, "[");
	for (unsigned i = 0; (f = srv_failures_get(core, i)) != NULL; i++) {
		if (job[0] != '\0' && strcmp(job, f->job) != 0)
			continue;
		json_put(b, "%s{\"job\":", first ? "" : ",");
		json_str(b, f->job);
		json_put(b, ",\"rank\":%d,\"ago_ms\":%" PRId64 ",\"text\":",
		    (int)f->rank, (int64_t)(now - f->at));
		json_str(b, f->text);
		json_put(b, "}");
		first = false;
	}
	json_put(b, "]");
}

char *
srv_status_json(struct srv_core *core, const char *job, const char *token,
    cohort__time now, int *code)
{
	struct status_build sb = { NULL, 0, 0, false };
	struct json_buf b = { NULL, 0, 0, false };
	struct srv_job *only;
	Cohort__StatusReply sr;

	if (!status_allowed(core, job, token, &only)) {
		*code = 401;
		json_put(&b, "{\"error\":\"authentication failed\"}\n");
		return (b.p);
	}
	status_collect(&sb, core, only, now, &sr);
	json_put(&b,
	    "{\"version\":\"%s\",\"uptime_ms\":%" PRIu64
	    ",\"clients\":%" PRIu64 ",\"stall_threshold_ms\":%" PRId64
	    ",\"jobs\":[",
	    COHORT_VERSION_STRING, sr.uptime_ms, sr.clients,
	    (int64_t)core->stall_ms);
	for (size_t i = 0; i < sr.n_jobs; i++) {
		if (i > 0)
			json_put(&b, ",");
		json_job(&b, sr.jobs[i]);
	}
	json_put(&b, "],\"failures\":");
	json_failures(&b, core, only != NULL ? only->name : "", now);
	json_put(&b, "}\n");
	for (size_t i = 0; i < sb.n; i++)
		free(sb.ptrs[i]);
	free(sb.ptrs);
	if (sb.oom || b.oom) {
		free(b.p);
		*code = 500;
		return (NULL);
	}
	*code = 200;
	return (b.p);
}
