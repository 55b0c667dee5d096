/*
 * core.c - the coordinator's state without sockets: calls and their
 * replies, the per-client reply cache, the deadline heap, pipes, the sweep.
 *
 * Every entry point takes `now` from the caller (one clock read per event
 * in srv.c, a fake clock in the unit tests) and is called with the server
 * mutex held; nothing here blocks.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_impl.h"

/* A connection: its clients, and (once its open event was seen) what
 * the idle and first-request timeouts need. A pipe known only through
 * its clients (unit tests, TCPStore's synthetic ids) goes with its last
 * client; a connection goes with its close event. */
struct srv_pipe {
	struct srv_hnode hn;
	uint32_t id;
	struct srv_link clients;
	bool conn; /* srv_core_pipe_opened seen */
	bool closing; /* handed to the transport to close */
	cohort__time opened;
	cohort__time last_msg; /* last complete request */
	uint64_t nmsg;
};

/* A pipe whose close event was seen. nng allocates pipe ids sequentially
 * from a random start, so an id is not reused for a long time; entries
 * are kept for SRV_CLOSED_KEEP_MS. */
struct srv_closed {
	struct srv_hnode hn;
	uint32_t id;
	cohort__time when;
};

#define SRV_CLOSED_KEEP_MS 60000

char *
srv_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);

	if (d != NULL)
		memcpy(d, s, n);
	return (d);
}

bool
srv_token_eq(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned d = la != lb;

	/* Time independent of where the first difference is. */
	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)(i < lb ? b[i] : 0);
	return (d == 0);
}

void
srv_fmt_secs(char *buf, size_t len, cohort__time ms)
{
	snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
}

void
srv_fmt_ranks(char *buf, size_t len, const int32_t *r, size_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	if (r == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		if (i == 32 && n > 40) {
			cohort__appendf(
			    buf, len, &off, " and %zu more", n - i);
			break;
		}
		cohort__appendf(buf, len, &off, "%s%d", i ? ", " : "", r[i]);
	}
}

void
srv_fmt_never_arrived(char *buf, size_t len, size_t *off, const char *what,
    cohort__time waited, const int32_t *miss, size_t nm)
{
	char rb[512], secs[32];

	srv_fmt_ranks(rb, sizeof(rb), miss, nm);
	srv_fmt_secs(secs, sizeof(secs), waited);
	cohort__appendf(buf, len, off,
	    "%s timed out after %s; rank%s %s never arrived", what, secs,
	    nm == 1 ? "" : "s", rb);
}

uint64_t
srv_random(struct srv_core *core)
{
	uint64_t z = (core->rnd += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (z ^ (z >> 31));
}

/* ------------------------------------------------------------------------ */
/* Deadline heap (binary, by deadline; heap_idx for O(log n) removal)       */
/* ------------------------------------------------------------------------ */

static void
heap_set(struct srv_core *core, size_t i, struct srv_call *c)
{
	core->heap[i] = c;
	c->heap_idx = i;
}

static void
heap_up(struct srv_core *core, size_t i)
{
	struct srv_call *c = core->heap[i];

	while (i > 0) {
		size_t p = (i - 1) / 2;
		if (core->heap[p]->deadline <= c->deadline)
			break;
		heap_set(core, i, core->heap[p]);
		i = p;
	}
	heap_set(core, i, c);
}

static void
heap_down(struct srv_core *core, size_t i)
{
	struct srv_call *c = core->heap[i];
	size_t n = core->heap_n;

	for (;;) {
		size_t l = 2 * i + 1, m = i;
		cohort__time md = c->deadline;
		if (l < n && core->heap[l]->deadline < md) {
			m = l;
			md = core->heap[l]->deadline;
		}
		if (l + 1 < n && core->heap[l + 1]->deadline < md)
			m = l + 1;
		if (m == i)
			break;
		heap_set(core, i, core->heap[m]);
		i = m;
	}
	heap_set(core, i, c);
}

static cohort_status
heap_push(struct srv_core *core, struct srv_call *c)
{
	if (core->heap_n == core->heap_cap) {
		size_t cap = core->heap_cap ? core->heap_cap * 2 : 64;
		struct srv_call **h = realloc(core->heap, cap * sizeof(*h));
		if (h == NULL)
			return (COHORT_ENOMEM);
		core->heap = h;
		core->heap_cap = cap;
	}
	core->heap[core->heap_n] = c;
	c->heap_idx = core->heap_n++;
	heap_up(core, c->heap_idx);
	return (COHORT_OK);
}

static void
heap_remove(struct srv_core *core, struct srv_call *c)
{
	size_t i = c->heap_idx;
	struct srv_call *last;

	if (i == SIZE_MAX)
		return;
	c->heap_idx = SIZE_MAX;
	last = core->heap[--core->heap_n];
	if (last == c)
		return;
	heap_set(core, i, last);
	heap_up(core, i);
	heap_down(core, last->heap_idx);
}

/* ------------------------------------------------------------------------ */
/* Calls                                                                    */
/* ------------------------------------------------------------------------ */

struct srv_call *
srv_call_new(struct srv_core *core, void *tp, cohort__time now)
{
	struct srv_call *c = calloc(1, sizeof(*c));

	if (c == NULL)
		return (NULL);
	c->core = core;
	c->tp = tp;
	c->start = now;
	c->deadline = COHORT__TIME_NEVER;
	c->heap_idx = SIZE_MAX;
	c->rank = -1;
	c->grank = -1;
	srv_list_init(&c->clink);
	srv_list_init(&c->olink);
	return (c);
}

void
srv_call_free(struct srv_call *c)
{
	if (c == NULL)
		return;
	COHORT__ASSERT(c->park == SRV_PARK_NONE);
	if (c->msg != NULL)
		nng_msg_free(c->msg);
	free(c->host);
	free(c->cd.name);
	free(c->i64s);
	free(c->f64s);
	for (size_t i = 0; i < c->nkeys; i++)
		free(c->keys[i]);
	free(c->keys);
	free(c->kvl);
	free(c);
}

void
srv_reply_init(Cohort__Reply *rep, const struct srv_call *c, cohort_status st)
{
	cohort__reply__init(rep);
	rep->proto_version = COHORT_PROTO_VERSION;
	rep->seq = c->seq;
	rep->status = (int32_t)st;
	rep->failed_rank = -1;
	if (c->job != NULL && st != COHORT_EAUTH)
		rep->generation = c->job->generation;
}

void
srv_reply_failure(Cohort__Reply *rep, const struct srv_job *job)
{
	rep->failed_rank = job->failed_rank;
	if (job->failed_text != NULL)
		rep->failed_text = job->failed_text;
	if (job->failed_detail != NULL)
		rep->error = job->failed_detail;
}

static void
call_unpark(struct srv_call *c)
{
	if (c->park == SRV_PARK_NONE)
		return;
	heap_remove(c->core, c);
	srv_list_remove(&c->clink);
	c->park = SRV_PARK_NONE;
	c->park_ops = NULL;
	c->core->nparked--;
}

bool
srv_body_mutating(int body)
{
	switch (body) {
	case COHORT__REQUEST__BODY_JOIN:
	case COHORT__REQUEST__BODY_LEAVE:
	case COHORT__REQUEST__BODY_REPORT_FAILURE:
	case COHORT__REQUEST__BODY_COLLECTIVE:
	case COHORT__REQUEST__BODY_GROUP_CREATE:
	case COHORT__REQUEST__BODY_KV_SET:
	case COHORT__REQUEST__BODY_KV_ADD:
	case COHORT__REQUEST__BODY_KV_COMPARE_SET:
	case COHORT__REQUEST__BODY_KV_DELETE:
	case COHORT__REQUEST__BODY_KV_APPEND:
	case COHORT__REQUEST__BODY_KV_MULTI_SET:
		return (true);
	default:
		return (false);
	}
}

void
srv_client_cache_put(struct srv_client *cl, uint64_t seq, uint32_t rhash,
    nng_msg *m, bool durable)
{
	unsigned i = cl->cache_next++ % SRV_CACHE;

	if (cl->cache[i].msg != NULL)
		nng_msg_free(cl->cache[i].msg);
	cl->cache[i].seq = seq;
	cl->cache[i].rhash = rhash;
	cl->cache[i].msg = m;
	cl->cache[i].durable = durable;
	cl->cache[i].ok = true;
	cl->cache[i].ev = cl->job->core->ev;
}

static void
call_cache(struct srv_call *c, nng_msg *m, bool ok)
{
	struct srv_client *cl = c->client;
	bool durable;
	nng_msg *dup;

	if (cl == NULL || c->seq == 0 || nng_msg_len(m) > SRV_CACHE_MAX_BYTES)
		return;
	if (nng_msg_dup(&dup, m) != 0)
		return;
	/* A mutating op's reply is journalled with it, so that a retry
	 * after a coordinator restart is answered from the cache too. */
	durable = srv_body_mutating(c->body);
	srv_client_cache_put(cl, c->seq, c->rhash, dup, durable);
	cl->cache[(cl->cache_next - 1) % SRV_CACHE].ok = ok;
	if (durable)
		srv_jrn_reply(cl, c->seq, dup);
}

/* A reply leaves now, or at the end of its event once the event's
 * journal records are written. */
static void
core_reply(struct srv_core *core, void *tp, nng_msg *m, uint64_t seq, bool ok)
{
	if (core->in_event && core->jrn != NULL && m != NULL) {
		if (core->npend == core->pend_cap) {
			size_t cap = core->pend_cap ? core->pend_cap * 2 : 16;
			struct srv_pend *p
			    = realloc(core->pend, cap * sizeof(*p));
			if (p == NULL)
				goto out_now; /* cannot hold it: as before */
			core->pend = p;
			core->pend_cap = cap;
		}
		core->pend[core->npend].tp = tp;
		core->pend[core->npend].msg = m;
		core->pend[core->npend].seq = seq;
		core->pend[core->npend].ok = ok;
		core->npend++;
		return;
	}
out_now:
	core->sink(core->sink_arg, tp, m);
}

/* The reply to seq when its change could not be journalled. */
static nng_msg *
core_not_journalled(struct srv_core *core, uint64_t seq)
{
	Cohort__Reply rep;
	char buf[512];
	nng_msg *m;

	cohort__reply__init(&rep);
	rep.proto_version = COHORT_PROTO_VERSION;
	rep.seq = seq;
	rep.status = COHORT_EJOURNAL;
	rep.failed_rank = -1;
	snprintf(buf, sizeof(buf),
	    "not acknowledged: %s; the change was applied in cohortd's "
	    "memory but is lost if cohortd restarts before its journal "
	    "works again",
	    srv_jrn_problem(core) != NULL ? srv_jrn_problem(core)
	                                  : "cohortd cannot journal");
	rep.error = buf;
	if (cohort__wire_pack_reply(&rep, NULL, 0, &m) != COHORT_OK)
		return (NULL);
	core->m.replies_error++;
	return (m);
}

void
srv_core_event_begin(struct srv_core *core)
{
	core->in_event = true;
	core->ev++;
}

/* The event's records could not be written: its cached OK replies
 * become the error too, so that a retry is answered the same. */
static void
core_uncache_event(struct srv_core *core)
{
	struct srv_hnode *jn, *cn;
	size_t i, k;

	for (jn = srv_map_next(&core->jobs, &i, NULL); jn != NULL;
	     jn = srv_map_next(&core->jobs, &i, jn)) {
		struct srv_job *job = SRV_CONTAINER(jn, struct srv_job, hn);
		for (cn = srv_map_next(&job->clients, &k, NULL); cn != NULL;
		     cn = srv_map_next(&job->clients, &k, cn)) {
			struct srv_client *cl
			    = SRV_CONTAINER(cn, struct srv_client, hn);
			for (unsigned x = 0; x < SRV_CACHE; x++) {
				nng_msg *m;
				if (cl->cache[x].msg == NULL
				    || cl->cache[x].ev != core->ev
				    || !cl->cache[x].ok)
					continue;
				m = core_not_journalled(
				    core, cl->cache[x].seq);
				nng_msg_free(cl->cache[x].msg);
				cl->cache[x].msg = m;
				cl->cache[x].ok = false;
				cl->cache[x].durable = false;
			}
		}
	}
}

void
srv_core_event_end(struct srv_core *core, cohort__time now)
{
	bool ok = srv_jrn_flush(core, now);
	size_t n = core->npend;

	core->in_event = false;
	if (!ok)
		core_uncache_event(core);
	core->npend = 0;
	for (size_t i = 0; i < n; i++) {
		struct srv_pend *p = &core->pend[i];
		if (!ok && p->ok) {
			nng_msg_free(p->msg);
			p->msg = core_not_journalled(core, p->seq);
		}
		core->sink(core->sink_arg, p->tp, p->msg);
	}
	if (core->pend_cap > 1024) {
		free(core->pend);
		core->pend = NULL;
		core->pend_cap = 0;
	}
}

/* The largest reply: what every client accepts (COHORT__MAX_MESSAGE,
 * older ones included), or more when --max-value-bytes is raised (clients
 * that learn the limit at join accept up to 4 GiB). */
static size_t
srv_reply_max(const struct srv_core *core)
{
	size_t lim = (size_t)core->lim.max_value + COHORT__ENVELOPE_ALLOWANCE;

	return (lim > COHORT__MAX_MESSAGE ? lim : COHORT__MAX_MESSAGE);
}

void
srv_call_answer(struct srv_call *c, Cohort__Reply *rep,
    const struct cohort__iov *parts, size_t nparts)
{
	struct srv_core *core = c->core;
	nng_msg *m;

	if (core->quiet) {
		/* Shutting down with a journal: the client re-sends this
		 * request to the next cohortd. */
		srv_call_drop(c);
		return;
	}
	call_unpark(c);
	if (rep->status != COHORT_OK)
		core->m.replies_error++;
	if (cohort__wire_pack_reply_max(
	        rep, parts, nparts, srv_reply_max(core), &m)
	    != COHORT_OK) {
		Cohort__Reply r2;
		srv_reply_init(&r2, c, COHORT_ENOMEM);
		r2.error = "cohortd could not build the reply";
		if (cohort__wire_pack_reply(&r2, NULL, 0, &m) != COHORT_OK)
			m = NULL;
	}
	if (m != NULL)
		call_cache(c, m, rep->status == COHORT_OK);
	core_reply(core, c->tp, m, c->seq, rep->status == COHORT_OK);
	srv_call_free(c);
}

void
srv_call_fail(struct srv_call *c, cohort_status st, const char *fmt, ...)
{
	Cohort__Reply rep;
	char buf[1024];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, sizeof(buf), fmt, ap);
	va_end(ap);
	srv_reply_init(&rep, c, st);
	rep.error = buf;
	srv_call_answer(c, &rep, NULL, 0);
}

void
srv_call_peerlost(struct srv_call *c)
{
	Cohort__Reply rep;

	srv_reply_init(&rep, c, COHORT_EPEERLOST);
	srv_reply_failure(&rep, c->job);
	srv_call_answer(c, &rep, NULL, 0);
}

void
srv_call_drop(struct srv_call *c)
{
	struct srv_core *core = c->core;

	call_unpark(c);
	core->sink(core->sink_arg, c->tp, NULL);
	srv_call_free(c);
}

void
srv_call_park(struct srv_call *c, const struct srv_park_ops *ops)
{
	COHORT__ASSERT(c->park == SRV_PARK_NONE);
	c->park = ops->kind;
	c->park_ops = ops;
	c->core->nparked++;
	if (c->client != NULL)
		srv_list_append(&c->client->parked, &c->clink);
	if (c->deadline != COHORT__TIME_NEVER
	    && heap_push(c->core, c) != COHORT_OK) {
		/* Without a heap slot the deadline cannot be kept: answer
		 * at the next sweep by forcing a linear check is overkill;
		 * treat it as an immediate expiry instead. */
		c->deadline = c->start;
	}
}

void
srv_call_withdraw(struct srv_call *c, cohort__time now)
{
	(void)now;
	if (c->park == SRV_PARK_NONE)
		return;
	c->park_ops->withdraw(c);
	call_unpark(c);
}

void
srv_call_expire(struct srv_call *c, cohort__time now)
{
	c->core->m.timeouts++;
	if (c->park != SRV_PARK_NONE)
		c->park_ops->expire(c, now);
}

void
srv_call_timed_out(struct srv_call *c, cohort__time now, const char *why,
    int32_t *miss, size_t nm)
{
	Cohort__Reply rep;

	srv_call_withdraw(c, now);
	srv_reply_init(&rep, c, COHORT_ETIMEDOUT);
	rep.error = (char *)why;
	rep.n_missing_ranks = nm;
	rep.missing_ranks = miss;
	srv_call_answer(c, &rep, NULL, 0);
	free(miss);
}

void
srv_core_expire_due(struct srv_core *core, cohort__time now)
{
	/* Each expiry removes its call from the heap: bounded by heap_n. */
	size_t budget = core->heap_n;

	while (core->heap_n > 0 && core->heap[0]->deadline <= now
	    && budget-- > 0) {
		struct srv_call *c = core->heap[0];
		struct srv_job *job = c->job;
		srv_call_expire(c, now);
		if (job != NULL)
			srv_job_maybe_remove(job);
	}
}

/* ------------------------------------------------------------------------ */
/* Clients and pipes                                                        */
/* ------------------------------------------------------------------------ */

static void
pipe_unlink(struct srv_core *core, struct srv_client *cl)
{
	struct srv_hnode *n;
	struct srv_pipe *p;

	if (cl->pipe == 0)
		return;
	srv_list_remove(&cl->plink);
	n = srv_map_get(&core->pipes, &cl->pipe, sizeof(cl->pipe));
	cl->pipe = 0;
	if (n == NULL)
		return;
	p = SRV_CONTAINER(n, struct srv_pipe, hn);
	if (srv_list_empty(&p->clients) && !p->conn) {
		srv_map_del(&core->pipes, &p->hn);
		free(p);
	}
}

static struct srv_pipe *
pipe_find(const struct srv_core *core, uint32_t pipe)
{
	struct srv_hnode *n = srv_map_get(&core->pipes, &pipe, sizeof(pipe));

	return (n != NULL ? SRV_CONTAINER(n, struct srv_pipe, hn) : NULL);
}

static struct srv_pipe *
pipe_get(struct srv_core *core, uint32_t pipe)
{
	struct srv_pipe *p = pipe_find(core, pipe);

	if (p != NULL || pipe == 0)
		return (p);
	if ((p = calloc(1, sizeof(*p))) == NULL)
		return (NULL);
	p->id = pipe;
	srv_list_init(&p->clients);
	if (srv_map_put(&core->pipes, &p->hn, &p->id, sizeof(p->id))
	    != COHORT_OK) {
		free(p);
		return (NULL);
	}
	return (p);
}

/* The open event may be handled after the pipe's first requests (nng
 * runs pipe callbacks outside the server mutex): those were counted on
 * an entry created by srv_core_pipe_request. */
void
srv_core_pipe_opened(struct srv_core *core, uint32_t pipe, cohort__time now)
{
	struct srv_pipe *p;

	if (srv_core_pipe_is_closed(core, pipe))
		return; /* its close event came first */
	if ((p = pipe_get(core, pipe)) == NULL || p->conn)
		return; /* untracked: only its clients keep it */
	p->conn = true;
	p->opened = now;
	if (p->nmsg == 0)
		p->last_msg = now;
	core->m.conns_opened++;
}

void
srv_core_pipe_request(struct srv_core *core, uint32_t pipe, cohort__time now)
{
	struct srv_pipe *p = pipe_get(core, pipe);

	if (p != NULL) {
		p->last_msg = now;
		p->nmsg++;
	}
}

/* Whether a connection has something to wait for: a running member or
 * a parked request (an answer that must leave through it). */
static bool
pipe_busy(const struct srv_pipe *p)
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
			if (now - p->last_msg < core->idle_ms || pipe_busy(p))
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

size_t
srv_core_take_pipes_to_close(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max)
{
	size_t n = 0;
	unsigned keep = 0;

	for (unsigned i = 0; i < core->nclose_pipes; i++) {
		struct srv_pipe_close pc = core->close_pipes[i];
		if (pc.at <= now && n < max)
			out[n++] = pc.pipe;
		else
			core->close_pipes[keep++] = pc;
	}
	core->nclose_pipes = keep;
	return (n);
}

/* Records which connection the client uses now (proto/README.md 2.4). */
void
srv_client_set_pipe(struct srv_client *cl, uint32_t pipe)
{
	struct srv_core *core = cl->job->core;
	struct srv_hnode *n;
	struct srv_pipe *p;

	if (cl->pipe == pipe || pipe == 0)
		return;
	pipe_unlink(core, cl);
	n = srv_map_get(&core->pipes, &pipe, sizeof(pipe));
	if (n != NULL) {
		p = SRV_CONTAINER(n, struct srv_pipe, hn);
	} else {
		if ((p = calloc(1, sizeof(*p))) == NULL)
			return;
		p->id = pipe;
		srv_list_init(&p->clients);
		if (srv_map_put(&core->pipes, &p->hn, &p->id, sizeof(p->id))
		    != COHORT_OK) {
			free(p);
			return;
		}
	}
	cl->pipe = pipe;
	srv_list_append(&p->clients, &cl->plink);
}

struct srv_client *
srv_client_get(struct srv_job *job, uint64_t id, cohort__time now)
{
	struct srv_hnode *n = srv_map_get(&job->clients, &id, sizeof(id));
	struct srv_client *cl;

	if (n != NULL)
		return (SRV_CONTAINER(n, struct srv_client, hn));
	if ((cl = calloc(1, sizeof(*cl))) == NULL)
		return (NULL);
	cl->id = id;
	cl->job = job;
	cl->last_seen = now;
	srv_list_init(&cl->plink);
	srv_list_init(&cl->parked);
	if (srv_map_put(&job->clients, &cl->hn, &cl->id, sizeof(cl->id))
	    != COHORT_OK) {
		free(cl);
		return (NULL);
	}
	job->core->nclients++;
	return (cl);
}

void
srv_client_free(struct srv_client *cl, const char *why)
{
	struct srv_core *core = cl->job->core;

	while (!srv_list_empty(&cl->parked)) {
		struct srv_call *c
		    = SRV_CONTAINER(cl->parked.next, struct srv_call, clink);
		srv_call_withdraw(c, 0);
		srv_call_fail(c, COHORT_ECLOSED, "%s", why);
	}
	pipe_unlink(core, cl);
	if (cl->member != NULL)
		cl->member->client = NULL;
	for (unsigned i = 0; i < SRV_CACHE; i++)
		if (cl->cache[i].msg != NULL)
			nng_msg_free(cl->cache[i].msg);
	srv_map_del(&cl->job->clients, &cl->hn);
	core->nclients--;
	free(cl);
}

static void
pipe_note_closed(struct srv_core *core, uint32_t pipe, cohort__time now)
{
	struct srv_closed *x;

	if (pipe == 0
	    || srv_map_get(&core->closed, &pipe, sizeof(pipe)) != NULL
	    || (x = calloc(1, sizeof(*x))) == NULL)
		return;
	x->id = pipe;
	x->when = now;
	if (srv_map_put(&core->closed, &x->hn, &x->id, sizeof(x->id))
	    != COHORT_OK)
		free(x);
}

bool
srv_core_pipe_is_closed(const struct srv_core *core, uint32_t pipe)
{
	return (pipe != 0
	    && srv_map_get(&core->closed, &pipe, sizeof(pipe)) != NULL);
}

static void
pipe_prune_closed(struct srv_core *core, cohort__time now)
{
	struct srv_hnode *n, *next;
	size_t i;

	for (n = srv_map_next(&core->closed, &i, NULL); n != NULL; n = next) {
		struct srv_closed *x = SRV_CONTAINER(n, struct srv_closed, hn);
		next = srv_map_next(&core->closed, &i, n);
		if (now - x->when < SRV_CLOSED_KEEP_MS)
			continue;
		srv_map_del(&core->closed, n);
		free(x);
	}
}

void
srv_core_pipe_closed(struct srv_core *core, uint32_t pipe, cohort__time now)
{
	struct srv_hnode *n;
	struct srv_pipe *p;

	pipe_note_closed(core, pipe, now);
	n = srv_map_get(&core->pipes, &pipe, sizeof(pipe));
	if (n == NULL)
		return;
	srv_core_event_begin(core);
	p = SRV_CONTAINER(n, struct srv_pipe, hn);
	/* Every iteration unlinks one client; the pipe is freed with its
	 * last client, so test emptiness through a fresh lookup. */
	for (;;) {
		struct srv_client *cl;
		struct srv_job *job;
		n = srv_map_get(&core->pipes, &pipe, sizeof(pipe));
		if (n == NULL)
			break;
		p = SRV_CONTAINER(n, struct srv_pipe, hn);
		if (srv_list_empty(&p->clients))
			break;
		cl = SRV_CONTAINER(p->clients.next, struct srv_client, plink);
		job = cl->job;
		job->last_active = now;
		pipe_unlink(core, cl);
		/* First the failure (its text names the op the member was
		 * in), then the requests nobody can hear the answers to. */
		if (cl->member != NULL
		    && cl->member->state == SRV_MEMBER_RUNNING)
			srv_job_fail_member(
			    job, cl->member, "connection lost", now);
		while (!srv_list_empty(&cl->parked)) {
			struct srv_call *c = SRV_CONTAINER(
			    cl->parked.next, struct srv_call, clink);
			srv_call_withdraw(c, now);
			srv_call_drop(c);
		}
		if (cl->member == NULL) {
			srv_jrn_client_del(cl);
			srv_client_free(cl, "connection lost");
		}
		srv_job_maybe_remove(job);
	}
	if ((p = pipe_find(core, pipe)) != NULL) {
		COHORT__ASSERT(srv_list_empty(&p->clients));
		srv_map_del(&core->pipes, &p->hn);
		free(p);
	}
	srv_core_event_end(core, now);
}

bool
srv_core_cancel(struct srv_job *job, uint64_t client_id, uint64_t seq,
    cohort_status st, const char *why, cohort__time now)
{
	struct srv_hnode *n
	    = srv_map_get(&job->clients, &client_id, sizeof(client_id));
	struct srv_client *cl;
	struct srv_link *l;

	if (n == NULL)
		return (false);
	cl = SRV_CONTAINER(n, struct srv_client, hn);
	for (l = cl->parked.next; l != &cl->parked; l = l->next) {
		struct srv_call *c = SRV_CONTAINER(l, struct srv_call, clink);
		if (c->seq != seq)
			continue;
		srv_call_withdraw(c, now);
		srv_call_fail(c, st, "%s", why);
		return (true);
	}
	return (false);
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
	 * after repeated stalls too, since only the lag is credited). */
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		for (uint32_t r = 0; job->members != NULL && r < job->world;
		     r++) {
			struct srv_member *m = &job->members[r];
			if (m->state != SRV_MEMBER_RUNNING)
				continue;
			m->last_seen = m->last_seen + lag_ms < now
			    ? m->last_seen + lag_ms
			    : now;
			nmem++;
		}
	}
	/* and connections their first request or idle time */
	for (n = srv_map_next(&core->pipes, &i, NULL); n != NULL;
	     n = srv_map_next(&core->pipes, &i, n)) {
		struct srv_pipe *p = SRV_CONTAINER(n, struct srv_pipe, hn);
		p->opened
		    = p->opened + lag_ms < now ? p->opened + lag_ms : now;
		p->last_msg
		    = p->last_msg + lag_ms < now ? p->last_msg + lag_ms : now;
	}
	cohort__warn("event loop stalled for %.1f s (cohortd was stopped, "
	             "paused or starved): not counted as silence of its %zu "
	             "running member%s",
	    (double)lag_ms / 1000.0, nmem, nmem == 1 ? "" : "s");
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
		srv_job_sweep(job, now);
		if (stalls && srv_job_maybe_expire(job, now))
			continue;
		if (stalls)
			srv_coll_stall_check(job, now);
	}
	if (stalls)
		pipe_prune_closed(core, now);
	srv_core_event_end(core, now);
	srv_jrn_tick(core, now);
}

/* ------------------------------------------------------------------------ */
/* Core lifecycle                                                           */
/* ------------------------------------------------------------------------ */

cohort_status
srv_core_new(const struct srv_limits *lim, const char *admin_token,
    srv_sink_fn sink, void *arg, cohort__time now, struct srv_core **out)
{
	struct srv_core *core = calloc(1, sizeof(*core));

	if (core == NULL)
		return (COHORT_ENOMEM);
	core->lim = *lim;
	if (admin_token != NULL && admin_token[0] != '\0'
	    && (core->admin_token = srv_strdup(admin_token)) == NULL) {
		free(core);
		return (COHORT_ENOMEM);
	}
	core->sink = sink;
	core->sink_arg = arg;
	core->started = now;
	core->rnd = cohort__now_ns() ^ (uint64_t)(uintptr_t)core;
	core->stall_ms = SRV_DEFAULT_STALL_MS;
	core->first_request_ms = COHORT__SRV_DEFAULT_FIRST_REQUEST_MS;
	core->idle_ms = COHORT__SRV_DEFAULT_IDLE_MS;
	/* 0 (never) for the core; cohortd sets its default */
	core->job_expiry_ms = 0;
	srv_map_init(&core->jobs);
	srv_map_init(&core->pipes);
	srv_map_init(&core->closed);
	*out = core;
	return (COHORT_OK);
}

cohort_status
srv_core_add_job(struct srv_core *core, const char *name, const char *token)
{
	struct srv_hnode *n;
	struct srv_job *job;

	if (name[0] == '\0' || strlen(name) > SRV_MAX_NAME
	    || strlen(token) > SRV_MAX_NAME)
		return (cohort__err(COHORT_EINVAL,
		    "job name must be 1..%d bytes and the token at most %d",
		    SRV_MAX_NAME, SRV_MAX_NAME));
	if ((n = srv_map_get(&core->jobs, name, strlen(name))) != NULL) {
		char *t;
		job = SRV_CONTAINER(n, struct srv_job, hn);
		if (job->preset)
			return (cohort__err(
			    COHORT_EEXIST, "job '%s' is given twice", name));
		/* Restored from the journal: the command line's token
		 * wins (journalled with the job's next record). */
		job->preset = true;
		if (strcmp(job->token, token) != 0) {
			if ((t = srv_strdup(token)) == NULL)
				return (COHORT_ENOMEM);
			free(job->token);
			job->token = t;
			job->journaled = false;
		}
		return (COHORT_OK);
	}
	if ((job = srv_job_new(core, name, token)) == NULL)
		return (COHORT_ENOMEM);
	job->preset = true;
	return (COHORT_OK);
}

void
srv_core_close_all(struct srv_core *core)
{
	struct srv_hnode *n;
	size_t i;

	/* With a journal, a stop is a restart to come: nothing more is
	 * journalled, and parked requests are dropped so that clients
	 * re-send them to the next cohortd instead of failing. */
	if (core->jrn != NULL) {
		srv_jrn_close(core);
		core->quiet = true;
	}
	while ((n = srv_map_next(&core->jobs, &i, NULL)) != NULL)
		srv_job_free(SRV_CONTAINER(n, struct srv_job, hn),
		    "cohortd is shutting down");
}

void
srv_core_free(struct srv_core *core)
{
	struct srv_hnode *n;
	size_t i;

	if (core == NULL)
		return;
	srv_core_close_all(core);
	while ((n = srv_map_next(&core->pipes, &i, NULL)) != NULL) {
		srv_map_del(&core->pipes, n);
		free(SRV_CONTAINER(n, struct srv_pipe, hn));
	}
	while ((n = srv_map_next(&core->closed, &i, NULL)) != NULL) {
		srv_map_del(&core->closed, n);
		free(SRV_CONTAINER(n, struct srv_closed, hn));
	}
	srv_map_fini(&core->jobs);
	srv_map_fini(&core->pipes);
	srv_map_fini(&core->closed);
	free(core->heap);
	free(core->pend);
	free(core->admin_token);
	srv_obs_free(core);
	free(core);
}
