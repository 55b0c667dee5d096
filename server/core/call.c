/*
 * call.c - calls and their ends: the deadline heap, parking, replies (the
 * reply cache and the journalled event bracket).
 *
 * Every entry point takes `now` from the caller (one clock read per event
 * in the front ends, a fake clock in the unit tests) and is called with
 * the server mutex held; nothing here blocks.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/log.h"
#include "call.h"
#include "clients.h"

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
	if (c->generation != NULL && st != COHORT_EAUTH)
		rep->generation = *c->generation;
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

static void
call_cache(struct srv_call *c, nng_msg *m, bool ok)
{
	struct srv_client *cl = c->client;
	nng_msg *dup;

	if (cl == NULL || c->seq == 0 || nng_msg_len(m) > SRV_CACHE_MAX_BYTES)
		return;
	if (nng_msg_dup(&dup, m) != 0)
		return;
	/* A mutating op's reply is journalled with it, so that a retry
	 * after a coordinator restart is answered from the cache too. */
	srv_client_cache_put(cl, c->seq, c->rhash, dup, c->mutating, ok);
	if (c->mutating)
		srv_jrn_reply(c->core->jrn, cl->set->jr, cl->id, c->seq, dup);
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
	    srv_jrn_problem(core->jrn) != NULL ? srv_jrn_problem(core->jrn)
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
	struct srv_link *l;

	for (l = core->clients.next; l != &core->clients; l = l->next) {
		struct srv_client *cl
		    = SRV_CONTAINER(l, struct srv_client, alink);
		for (unsigned x = 0; x < SRV_CACHE; x++) {
			struct srv_cached *e = &cl->cache[x];
			if (e->msg == NULL || e->ev != core->ev || !e->ok)
				continue;
			nng_msg_free(e->msg);
			e->msg = core_not_journalled(core, e->seq);
			e->ok = false;
			e->durable = false;
		}
	}
}

void
srv_core_event_end(struct srv_core *core, cohort__time now)
{
	bool ok = srv_jrn_flush(core->jrn, now);
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
call_reply_max(const struct srv_core *core)
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
	        rep, parts, nparts, call_reply_max(core), &m)
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

bool
srv_call_describe(const struct srv_call *c, char *buf, size_t len)
{
	if (c->park_ops == NULL || c->park_ops->describe == NULL)
		return (false);
	c->park_ops->describe(c, buf, len);
	return (true);
}

bool
srv_call_what(const struct srv_call *c, char *buf, size_t len, uint64_t *seq,
    const char **group)
{
	if (c->park_ops == NULL || c->park_ops->what == NULL)
		return (false);
	c->park_ops->what(c, buf, len, seq, group);
	return (true);
}

struct srv_call *
srv_core_next_due(const struct srv_core *core, cohort__time now)
{
	if (core->heap_n == 0 || core->heap[0]->deadline > now)
		return (NULL);
	return (core->heap[0]);
}

void
srv_calls_fail_parked(struct srv_client *cl, cohort_status st, const char *why)
{
	while (!srv_list_empty(&cl->parked)) {
		struct srv_call *c
		    = SRV_CONTAINER(cl->parked.next, struct srv_call, clink);
		srv_call_withdraw(c, 0);
		srv_call_fail(c, st, "%s", why);
	}
}

void
srv_calls_drop_parked(struct srv_client *cl, cohort__time now)
{
	while (!srv_list_empty(&cl->parked)) {
		struct srv_call *c
		    = SRV_CONTAINER(cl->parked.next, struct srv_call, clink);
		srv_call_withdraw(c, now);
		srv_call_drop(c);
	}
}

bool
srv_call_cancel(struct srv_client *cl, uint64_t seq, cohort_status st,
    const char *why, cohort__time now)
{
	struct srv_link *l;

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
