/*
 * srv_req.h - what the server's unit tests (srv_fixture.h) and the fuzz
 * targets and seed generators (fuzz/fuzz_common.h) share to drive cohortd's
 * core without sockets: a client's envelope fields, request builders on the
 * project's own encoder, a reply sink that drops replies, and reading a file
 * of a state directory (tmpdir.h removes one). Header-only; nothing here fails
 * a test, so the fuzz programs (no Check) use it as is.
 */
#ifndef COHORT_SRV_REQ_H
#define COHORT_SRV_REQ_H

#include <stdbool.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* What the tests see of cohortd (docs/coordinator.md, Structure): the
 * entry points, and the state they look into. */
#include "core/call.h"
#include "core/clients.h"
#include "core/pipes.h"
#include "front/dispatch.h"
#include "front/events.h"
#include "journal/journal.h"
#include "journal/snapshot.h"
#include "observe/metrics.h"
#include "state/coll.h"
#include "state/job.h"
#include "state/kv.h"
#include "state/lifecycle.h"
#include "tmpdir.h"

/* A client of a job: the envelope fields of its requests. */
struct srq_cli {
	const char *job;
	const char *token;
	uint64_t id;
	uint64_t seq;
	uint64_t gen;
	int32_t rank;
	uint32_t pipe; /* the connection it sends on */
	const char *host; /* what it joins with */
	uint32_t pid;
};

/* Token "tok", no rank yet, host "host", pid = id. */
static inline void
srq_cli_init(struct srq_cli *c, const char *job, uint64_t id, uint32_t pipe)
{
	memset(c, 0, sizeof(*c));
	c->job = job;
	c->token = "tok";
	c->id = id;
	c->rank = -1;
	c->pipe = pipe;
	c->host = "host";
	c->pid = (uint32_t)id;
}

/* After the joins of a world-n job complete: ranks by index, generation
 * 1 (what the core gives the first rendezvous). */
static inline void
srq_cli_joined(struct srq_cli *c, int n)
{
	for (int i = 0; i < n; i++) {
		c[i].rank = i;
		c[i].gen = 1;
	}
}

/* A request and the body it carries: build with one of srq_*, then set
 * more fields of the body (q->b) or the request (q->rq) if needed. */
struct srq {
	Cohort__Request rq;
	union {
		Cohort__Join join;
		Cohort__KvSet kv_set;
		Cohort__KvGet kv_get;
		Cohort__KvAdd kv_add;
		Cohort__Heartbeat hb;
		Cohort__GroupCreate gc;
	} b;
};

/* A request whose body is msg (any member of the union; body names it). */
static inline Cohort__Request *
srq_simple(struct srq *q, int body, void *msg, uint32_t timeout_ms)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;

	q->rq = rq;
	q->rq.body_case = body;
	q->rq.leave = msg;
	q->rq.timeout_ms = timeout_ms;
	return (&q->rq);
}

/* Heartbeat 1000 ms, dead after 5000 ms. */
static inline Cohort__Request *
srq_join(struct srq *q, const struct srq_cli *c, int32_t rank, uint32_t world,
    int32_t local_rank, uint32_t timeout_ms)
{
	Cohort__Join j = COHORT__JOIN__INIT;

	j.rank = rank;
	j.world_size = world;
	j.host = (char *)c->host;
	j.pid = c->pid;
	j.local_rank = local_rank;
	j.heartbeat_ms = 1000;
	j.dead_after_ms = 5000;
	q->b.join = j;
	return (
	    srq_simple(q, COHORT__REQUEST__BODY_JOIN, &q->b.join, timeout_ms));
}

/* The value travels as the payload. */
static inline Cohort__Request *
srq_kv_set(struct srq *q, const char *key)
{
	Cohort__KvSet s = COHORT__KV_SET__INIT;

	s.key = (char *)key;
	q->b.kv_set = s;
	return (srq_simple(q, COHORT__REQUEST__BODY_KV_SET, &q->b.kv_set, 0));
}

static inline Cohort__Request *
srq_kv_get(struct srq *q, const char *key, bool wait, uint32_t timeout_ms)
{
	Cohort__KvGet g = COHORT__KV_GET__INIT;

	g.key = (char *)key;
	g.wait = wait;
	q->b.kv_get = g;
	return (srq_simple(
	    q, COHORT__REQUEST__BODY_KV_GET, &q->b.kv_get, timeout_ms));
}

static inline Cohort__Request *
srq_kv_add(struct srq *q, const char *key, int64_t delta)
{
	Cohort__KvAdd a = COHORT__KV_ADD__INIT;

	a.key = (char *)key;
	a.delta = delta;
	q->b.kv_add = a;
	return (srq_simple(q, COHORT__REQUEST__BODY_KV_ADD, &q->b.kv_add, 0));
}

static inline Cohort__Request *
srq_heartbeat(struct srq *q, const char *op, uint64_t seq, const char *group,
    bool in_op, uint64_t in_op_ms)
{
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;

	hb.last_op = (char *)op;
	hb.last_op_seq = seq;
	hb.last_group = (char *)group;
	hb.in_op = in_op;
	hb.in_op_ms = in_op_ms;
	q->b.hb = hb;
	return (srq_simple(q, COHORT__REQUEST__BODY_HEARTBEAT, &q->b.hb, 0));
}

/* A group of n ranks (ranks must outlive the request). */
static inline Cohort__Request *
srq_group_create(struct srq *q, const char *name, int32_t *ranks, size_t n,
    uint32_t timeout_ms)
{
	Cohort__GroupCreate gc = COHORT__GROUP_CREATE__INIT;

	gc.name = (char *)name;
	gc.n_ranks = n;
	gc.ranks = ranks;
	q->b.gc = gc;
	return (srq_simple(
	    q, COHORT__REQUEST__BODY_GROUP_CREATE, &q->b.gc, timeout_ms));
}

/* The envelope of c on rq (its next seq unless rq has one), then rq and
 * the payload packed as the transport hands them to srv_core_dispatch. */
static inline cohort_status
srq_pack(struct srq_cli *c, Cohort__Request *rq, const void *pl, size_t plen,
    nng_msg **m)
{
	struct cohort__iov iov = { pl, plen };

	rq->proto_version = COHORT_PROTO_VERSION;
	rq->job = (char *)c->job;
	rq->token = (char *)c->token;
	rq->client_id = c->id;
	if (rq->seq == 0)
		rq->seq = ++c->seq;
	rq->generation = c->gen;
	rq->rank = c->rank;
	return (cohort__wire_pack_request(rq, &iov, plen ? 1 : 0, m));
}

/* A reply sink that drops every reply. */
static inline void
srq_drop_reply(void *arg, void *tp, nng_msg *m)
{
	(void)arg;
	(void)tp;
	if (m != NULL)
		nng_msg_free(m);
}

/* Opens core's journal in dir, without fsync (compact_min 0: the
 * default threshold). */
static inline cohort_status
srq_journal_open(struct srv_core *core, const char *dir, bool recover,
    uint64_t compact_min, cohort__time now)
{
	struct srv_jrn_opts o;

	memset(&o, 0, sizeof(o));
	o.dir = dir;
	o.fsync = SRV_FSYNC_NONE;
	o.recover = recover;
	o.compact_min = compact_min;
	return (srv_journal_open(core, &o, now));
}

/* A core that drops its replies (srq_drop_reply), its journal opened in
 * dir: *rv is srq_journal_open's status. NULL if no core could be made. */
static inline struct srv_core *
srq_core_journal(const struct srv_limits *lim, const char *dir, bool recover,
    uint64_t compact_min, cohort__time now, cohort_status *rv)
{
	struct srv_core *core;

	if (srv_core_new(lim, NULL, srq_drop_reply, NULL, now, &core)
	    != COHORT_OK)
		return (NULL);
	*rv = srq_journal_open(core, dir, recover, compact_min, now);
	return (core);
}

/* dir/name's bytes (malloc'd, NUL-terminated) and their number, or NULL
 * (*len 0) if it cannot be read. */
static inline char *
srq_read_file(const char *dir, const char *name, size_t *len)
{
	char p[1024];
	FILE *f;
	char *b = NULL;
	long n;

	*len = 0;
	snprintf(p, sizeof(p), "%s/%s", dir, name);
	if ((f = fopen(p, "rb")) == NULL)
		return (NULL);
	if (fseek(f, 0, SEEK_END) == 0 && (n = ftell(f)) >= 0
	    && fseek(f, 0, SEEK_SET) == 0
	    && (b = malloc((size_t)n + 1)) != NULL
	    && fread(b, 1, (size_t)n, f) == (size_t)n) {
		b[n] = '\0';
		*len = (size_t)n;
	} else {
		free(b);
		b = NULL;
	}
	fclose(f);
	return (b);
}

#endif /* COHORT_SRV_REQ_H */
