/*
 * torchstore.c - cohortd speaks torch's TCPStore protocol (--torch-store).
 *
 * An unmodified PyTorch job can use cohortd as its store: a TCPStore
 * client (is_master=False), env:// with TORCHELASTIC_USE_AGENT_STORE,
 * torchrun's c10d rendezvous. Each listener serves one job, so two torch
 * jobs on one cohortd (two listeners) never see each other's keys.
 *
 * The wire protocol (torch 2.x; docs/pytorch.md, proto/README.md 6.1):
 * a query byte, then arguments; integers raw little-endian; strings and
 * byte strings a u64 length and the bytes; no request ids, one request at
 * a time per connection, the reply (if the query has one) in order. The
 * first query must be VALIDATE with the magic number.
 *
 * How it maps onto the core (one KV, one journal, one set of limits):
 *  - every TCPStore connection is a client of the job (a random client
 *    id, its own seq and a pipe id above nng's range);
 *  - changes (SET, COMPARE_SET, ADD, DELETE_KEY, APPEND, MULTI_SET) and
 *    WAIT become protobuf requests dispatched to the core under the
 *    server mutex, so they are journalled, limited and wake parked
 *    waiters exactly as cohort's own KV calls do; their replies come back
 *    through the core's sink (ts_deliver) to this thread;
 *  - reads (GET, MULTI_GET, CHECK, GETNUMKEYS, LIST) are answered from
 *    the KV directly under the mutex: nothing to journal;
 *  - a WAIT parks in the core with no deadline (the client times out and
 *    sends CANCEL_WAIT, which withdraws it: WAIT_CANCELED, preceded by
 *    STOP_WAITING if the wait had already ended);
 *  - queues (QUEUE_PUSH/POP/LEN) live here, per listener, in memory: a
 *    coordinator restart loses them (documented). A push releases one
 *    client waiting on that name, as torch's server does.
 *
 * One thread per listener: epoll over non-blocking sockets, an eventfd
 * for replies. It never blocks on a client. A client that closes its
 * connection loses nothing it sent: every complete request before its
 * EOF is applied in order, then the connection closes (a WAIT or BARRIER
 * it left parked is withdrawn). Bad input (an unknown query, a wrong
 * magic, lengths over the limits) closes that connection only, with the
 * reason in cohortd's log at warn level (TCPStore has no error replies;
 * torch's libuv server does the same); so does a request left incomplete
 * for partial_ms, or output a client does not read. A client idle
 * between requests, or parked in a WAIT, is left alone.
 *
 * The queries are one table (ts_cmds): for each, the function that
 * parses it and answers it here or makes the request for the core, and
 * the one that answers it from the core's reply.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netdb.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/epoll.h>
#include <sys/eventfd.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <unistd.h>

#include "core/pipes.h"
#include "core/util.h"
#include "state/job.h"
#include "state/kv.h"
#include "state/lifecycle.h"
#include "dispatch.h"
#include "door.h"
#include "events.h"
#include "net.h"
#include "nng_rep.h"
#include "torchstore.h"

#define TS_MAGIC 0x3C85F7CEu
#define TS_PARTIAL_MS 30000u
/* A parked WAIT is ended after this. */
#define TS_WAIT_MAX_MS 3600000u
/* Keys per CHECK/WAIT/MULTI_GET/MULTI_SET (torch's own bound). */
#define TS_MAX_COUNT (128u * 1024u)
/* A queue item's own cost besides its bytes (counted: an empty item is
 * not free). */
#define TS_ITEM_COST 64u

enum ts_query {
	TS_VALIDATE = 0,
	TS_SET = 1,
	TS_COMPARE_SET = 2,
	TS_GET = 3,
	TS_ADD = 4,
	TS_CHECK = 5,
	TS_WAIT = 6,
	TS_GETNUMKEYS = 7,
	TS_DELETE_KEY = 8,
	TS_APPEND = 9,
	TS_MULTI_GET = 10,
	TS_MULTI_SET = 11,
	TS_CANCEL_WAIT = 12,
	TS_PING = 13,
	TS_QUEUE_PUSH = 14,
	TS_QUEUE_POP = 15,
	TS_QUEUE_LEN = 16,
	TS_LIST = 17,
	TS_BARRIER = 18,
};

enum { TS_STOP_WAITING = 0, TS_WAIT_CANCELED = 1 };
enum { TS_READY = 0, TS_NOT_READY = 1 };

struct ts_item {
	struct ts_item *next;
	size_t len;
	uint8_t data[];
};

struct ts_queue {
	struct ts_queue *next;
	char *name;
	struct ts_item *head, *tail;
	size_t n;
};

struct ts_conn {
	struct srv_nconn nc; /* first: net's part (socket, output, timers) */
	struct srv_tstore *ts;
	struct srv_link tlink; /* ts->conns while open */
	uint64_t client_id;
	uint64_t seq;
	bool validated;
	/* The request in flight (dispatched to the core), -1 if none. */
	int busy;
	uint64_t busy_seq;
	/* WAIT in flight: the keys it waits for, and what ended it. */
	char **wkeys;
	size_t nwkeys;
	size_t wbytes; /* what they hold (counted against the listener) */
	bool *wqueued; /* per key: satisfied by a queue push */
	bool cancel_asked; /* CANCEL_WAIT arrived while parked */
	bool by_queue; /* released by a queue push */
	/* BARRIER: the counter key and the count that releases it; while
	 * waiting, busy == TS_BARRIER and busy_seq == 0 (parked here). */
	char *bkey;
	int64_t bworld;
	uint8_t *in;
	size_t inlen, incap; /* incap is held (srv_nconn_hold) */
	cohort__time partial_since; /* 0: no incomplete request */
};

struct ts_req {
	struct srv_tp tp; /* first: its deliver is ts_deliver */
	struct srv_npost post;
	struct ts_conn *conn;
	int query;
	uint64_t seq;
	nng_msg *reply;
};

struct srv_tstore {
	struct srv_nng *nng;
	struct srv_net *net;
	struct srv_nlistener *l;
	const struct srv_door *door;
	char job[SRV_MAX_NAME + 1];
	char token[SRV_MAX_NAME + 1];
	char addr[96];
	char what[SRV_MAX_NAME + 40];
	uint32_t partial_ms;
	cohort__time first_ms;
	uint64_t max_value;
	struct srv_link conns; /* ts_conn.tlink, open ones */
	struct ts_queue *queues;
	uint64_t queue_bytes; /* items' bytes and their own cost */
	uint64_t wait_bytes; /* keys of parked WAITs */
	uint64_t max_queue_bytes, max_wait_bytes;
};

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */
/* ------------------------------------------------------------------------ */

static bool
ts_put(struct ts_conn *c, const void *p, size_t n)
{
	return (srv_nconn_put(&c->nc, p, n));
}

static bool
ts_put_u8(struct ts_conn *c, uint8_t v)
{
	return (ts_put(c, &v, 1));
}

static bool
ts_put_u64(struct ts_conn *c, uint64_t v)
{
	uint8_t b[8];

	for (int i = 0; i < 8; i++)
		b[i] = (uint8_t)(v >> (8 * i));
	return (ts_put(c, b, 8));
}

static bool
ts_put_bytes(struct ts_conn *c, const void *p, size_t n)
{
	return (ts_put_u64(c, (uint64_t)n) && ts_put(c, p, n));
}

/* A query's parse: incomplete (wait for more input), done, or bad (the
 * connection ends). */
enum ts_parse { TS_MORE, TS_DONE, TS_BAD };

/* A parse cursor over the input buffer. */
struct ts_cur {
	const uint8_t *p;
	size_t left;
	bool bad; /* malformed or over a limit: close */
	const char *why;
	char whybuf[256];
};

/* Marks the cursor bad: the connection ends, with why in cohortd's log
 * (TCPStore has no error replies; torch's libuv server does the same). */
static void ts_badf(struct ts_cur *k, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
ts_badf(struct ts_cur *k, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(k->whybuf, sizeof(k->whybuf), fmt, ap);
	va_end(ap);
	k->bad = true;
	k->why = k->whybuf;
}

static bool
ts_get(struct ts_cur *k, void *out, size_t n)
{
	if (k->left < n)
		return (false);
	memcpy(out, k->p, n);
	k->p += n;
	k->left -= n;
	return (true);
}

static bool
ts_get_u64(struct ts_cur *k, uint64_t *v)
{
	uint8_t b[8];

	if (!ts_get(k, b, 8))
		return (false);
	*v = 0;
	for (int i = 0; i < 8; i++)
		*v |= (uint64_t)b[i] << (8 * i);
	return (true);
}

/* A length-prefixed string up to max bytes (what: "key" or "value",
 * for the refusal): points into the buffer. */
static bool
ts_get_str(struct ts_cur *k, size_t max, const char *what, const uint8_t **s,
    size_t *n)
{
	uint64_t len;

	if (!ts_get_u64(k, &len))
		return (false);
	if (len > max) {
		ts_badf(k, "a %s of %" PRIu64 " bytes, over %s %zu", what, len,
		    strcmp(what, "key") == 0 ? "cohortd's key limit of"
		                             : "--max-value-bytes",
		    max);
		return (false);
	}
	if (k->left < len)
		return (false);
	*s = k->p;
	*n = (size_t)len;
	k->p += len;
	k->left -= len;
	return (true);
}

/* A key as a C string (malloc'd); keys may not contain NUL. */
static char *
ts_key(struct ts_cur *k)
{
	const uint8_t *s;
	size_t n;
	char *out;

	if (!ts_get_str(k, COHORT__MAX_KEY, "key", &s, &n))
		return (NULL);
	if (n == 0 || memchr(s, '\0', n) != NULL) {
		ts_badf(k, "%s",
		    n == 0 ? "an empty key" : "a key with a NUL byte");
		return (NULL);
	}
	if ((out = malloc(n + 1)) == NULL) {
		k->bad = true;
		k->why = "out of memory";
		return (NULL);
	}
	memcpy(out, s, n);
	out[n] = '\0';
	return (out);
}

static void
ts_free_keys(char **keys, size_t n)
{
	for (size_t i = 0; keys != NULL && i < n; i++)
		free(keys[i]);
	free(keys);
}

/* Whether cnt length-prefixed strings follow in the buffer, without
 * copying them: a query parsed again as its bytes arrive costs one scan
 * until it is whole, not a copy of every key each time. True as well at
 * a length the copy will refuse (it says why). */
static bool
ts_have_strs(const struct ts_cur *k, uint64_t cnt)
{
	const uint8_t *p = k->p;
	size_t left = k->left;

	for (uint64_t i = 0; i < cnt; i++) {
		uint64_t len = 0;
		if (left < 8)
			return (false);
		for (int b = 0; b < 8; b++)
			len |= (uint64_t)p[b] << (8 * b);
		if (len > COHORT__MAX_KEY)
			return (true);
		if (left - 8 < len)
			return (false);
		p += 8 + len;
		left -= 8 + (size_t)len;
	}
	return (true);
}

/* u64 count then count keys. NULL with k->bad, or NULL for "need more". */
static char **
ts_keys(struct ts_cur *k, size_t *n)
{
	uint64_t cnt;
	size_t kbytes = 0;
	char **keys;

	if (!ts_get_u64(k, &cnt))
		return (NULL);
	if (cnt > TS_MAX_COUNT) {
		ts_badf(k,
		    "%" PRIu64 " keys in one query, over torch's limit of %u",
		    cnt, TS_MAX_COUNT);
		return (NULL);
	}
	if (!ts_have_strs(k, cnt))
		return (NULL); /* not all here yet: nothing copied */
	if ((keys = calloc(cnt ? cnt : 1, sizeof(char *))) == NULL) {
		k->bad = true;
		k->why = "out of memory";
		return (NULL);
	}
	for (uint64_t i = 0; i < cnt; i++) {
		if ((keys[i] = ts_key(k)) == NULL) {
			ts_free_keys(keys, (size_t)i);
			return (NULL);
		}
		/* what one query may make cohortd copy and hold (issue 22) */
		if ((kbytes += strlen(keys[i])) > SRV_WAIT_MAX_KEY_BYTES) {
			ts_free_keys(keys, (size_t)i + 1);
			ts_badf(k,
			    "keys of over %u bytes in one query (a WAIT, "
			    "CHECK "
			    "or MULTI_GET holds them)",
			    SRV_WAIT_MAX_KEY_BYTES);
			return (NULL);
		}
	}
	*n = (size_t)cnt;
	return (keys);
}

/* Marks the cursor bad (the connection ends, why logged). */
static enum ts_parse
ts_bad(struct ts_cur *k, const char *why)
{
	k->bad = true;
	k->why = why;
	return (TS_BAD);
}

/* ------------------------------------------------------------------------ */
/* Queues (in memory, per listener)                                         */
/* ------------------------------------------------------------------------ */

static struct ts_queue *
ts_queue_find(struct srv_tstore *ts, const char *name, bool create)
{
	struct ts_queue *q;

	for (q = ts->queues; q != NULL; q = q->next)
		if (strcmp(q->name, name) == 0)
			return (q);
	if (!create || (q = calloc(1, sizeof(*q))) == NULL)
		return (NULL);
	if ((q->name = srv_strdup(name)) == NULL) {
		free(q);
		return (NULL);
	}
	q->next = ts->queues;
	ts->queues = q;
	return (q);
}

/* Frees an empty queue (and what its name cost). */
static void
ts_queue_drop(struct srv_tstore *ts, struct ts_queue *qu)
{
	for (struct ts_queue **pp = &ts->queues; *pp != NULL;
	     pp = &(*pp)->next) {
		if (*pp != qu)
			continue;
		*pp = qu->next;
		ts->queue_bytes -= strlen(qu->name) + TS_ITEM_COST;
		free(qu->name);
		free(qu);
		return;
	}
}

static bool
ts_queue_nonempty(struct srv_tstore *ts, const char *name)
{
	struct ts_queue *q = ts_queue_find(ts, name, false);

	return (q != NULL && q->n > 0);
}

static void
ts_queues_free(struct srv_tstore *ts)
{
	while (ts->queues != NULL) {
		struct ts_queue *q = ts->queues;
		ts->queues = q->next;
		while (q->head != NULL) {
			struct ts_item *it = q->head;
			q->head = it->next;
			free(it);
		}
		free(q->name);
		free(q);
	}
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

static void
ts_conn_close(struct ts_conn *c, const char *why)
{
	srv_nconn_close(&c->nc, why);
}

/* Ends a connection for what its client did (bad input, not reading):
 * the reason goes to cohortd's log at warn level, as torch's libuv server
 * logs it (TCPStore has no error replies: the client sees the closed
 * connection). */
static void
ts_conn_refuse(struct ts_conn *c, const char *why)
{
	srv_nconn_refuse(&c->nc, "%s", why);
}

/* A request parked until someone else acts (a WAIT, a BARRIER): nobody
 * hears its answer once the client is gone. */
static bool
ts_conn_parked(const struct ts_conn *c)
{
	return (
	    c->busy == TS_WAIT || (c->busy == TS_BARRIER && c->busy_seq == 0));
}

/* After the client's EOF: closes once every complete request it sent has
 * been applied (a reply of the core it waits for comes first), or when
 * what is left waits for others. Nothing it sent before it closed is
 * lost, as with torch's server. */
static void
ts_conn_settle(struct ts_conn *c)
{
	if (c->nc.dead || !c->nc.rd_eof)
		return;
	if (c->busy >= 0 && !ts_conn_parked(c))
		return; /* its reply is on the way, then the rest */
	ts_conn_close(c, "closed by the client");
}

static void
ts_conn_flush(struct ts_conn *c)
{
	srv_nconn_flush(&c->nc);
}

/* The keys of a parked WAIT, counted against the listener. */
static void
ts_wait_forget(struct ts_conn *c)
{
	c->ts->wait_bytes -= c->wbytes;
	c->wbytes = 0;
	ts_free_keys(c->wkeys, c->nwkeys);
	free(c->wqueued);
	c->wkeys = NULL;
	c->wqueued = NULL;
	c->nwkeys = 0;
}

/* ------------------------------------------------------------------------ */
/* Requests to the core                                                     */
/* ------------------------------------------------------------------------ */

static void ts_deliver(struct srv_tp *tp, nng_msg *reply);

struct ts_disp {
	struct ts_conn *c;
	int query;
	Cohort__Request *req;
	const struct cohort__iov *parts;
	size_t nparts;
	bool ok;
};

static void
ts_dispatch_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_disp *d = arg;
	struct ts_conn *c = d->c;
	struct ts_req *r;
	nng_msg *msg;

	d->ok = false;
	if ((r = calloc(1, sizeof(*r))) == NULL)
		return;
	r->tp.deliver = ts_deliver;
	r->conn = c;
	r->query = d->query;
	d->req->job = c->ts->job;
	d->req->token = c->ts->token;
	d->req->proto_version = COHORT_PROTO_VERSION;
	d->req->client_id = c->client_id;
	d->req->seq = r->seq = ++c->seq;
	d->req->rank = -1;
	if (cohort__wire_pack_request(d->req, d->parts, d->nparts, &msg)
	    != COHORT_OK) {
		free(r);
		return;
	}
	srv_nconn_ref(&c->nc);
	c->busy = d->query;
	c->busy_seq = r->seq;
	d->ok = true;
	/* The reply (or NULL) reaches ts_deliver, possibly within this
	 * call. */
	srv_core_dispatch(core, msg, c->nc.pipe, r, now);
}

static bool
ts_dispatch(struct ts_conn *c, int query, Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts)
{
	struct ts_disp d = { c, query, req, parts, nparts, false };

	/* WAIT: until the client cancels (torch's clients do at their
	 * timeout), an hour at most (one no client waits for) */
	req->timeout_ms = query == TS_WAIT ? TS_WAIT_MAX_MS : UINT32_MAX;
	srv_with_core(c->ts->nng, ts_dispatch_locked, &d);
	return (d.ok);
}

/* The core's sink hands the reply of one of ours (or NULL) here, under
 * the server mutex, on any thread: to the net thread (ts_delivered). */
static void
ts_deliver(struct srv_tp *tp, nng_msg *reply)
{
	struct ts_req *r = (struct ts_req *)(void *)tp;

	r->reply = reply;
	srv_net_post(r->conn->ts->net, &r->conn->nc, &r->post);
}

/* ------------------------------------------------------------------------ */
/* Reading the job's KV (under the server mutex)                            */
/* ------------------------------------------------------------------------ */

/* A read of the job's KV: fn runs under the server mutex with the job
 * (reads need no journal: answered here, not by the core). */
struct ts_read {
	struct ts_conn *c;
	void (*fn)(struct ts_read *rd, struct srv_job *job);
	char **keys;
	size_t nkeys;
	bool ok; /* the answer is in the output buffer */
	bool yes; /* CHECK, WAIT: all there; COMPARE_SET: exists */
};

static void
ts_read_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_read *rd = arg;
	struct srv_job *job = srv_job_find(core, rd->c->ts->job);

	(void)now;
	rd->ok = job != NULL;
	if (job != NULL)
		rd->fn(rd, job);
}

/* Runs fn; false if the job is gone or fn's answer did not fit. */
static bool
ts_read(struct ts_conn *c, void (*fn)(struct ts_read *rd, struct srv_job *job),
    char **keys, size_t nkeys, bool *yes)
{
	struct ts_read rd = { c, fn, keys, nkeys, false, false };

	srv_with_core(c->ts->nng, ts_read_locked, &rd);
	if (yes != NULL)
		*yes = rd.yes;
	return (rd.ok);
}

/* A missing key reads as empty, as in torch's server. */
static bool
ts_put_value(struct ts_conn *c, struct srv_job *job, const char *key)
{
	const void *v = NULL;
	size_t vl = 0;

	if (!srv_kv_peek(job->kv, key, &v, &vl))
		v = NULL, vl = 0;
	return (ts_put_bytes(c, v, vl));
}

static void
ts_read_values(struct ts_read *rd, struct srv_job *job)
{
	for (size_t i = 0; i < rd->nkeys && rd->ok; i++)
		rd->ok = ts_put_value(rd->c, job, rd->keys[i]);
}

/* Every key exists (a non-empty queue of that name counts too, as in
 * torch's server). */
static void
ts_read_ready(struct ts_read *rd, struct srv_job *job)
{
	rd->yes = true;
	for (size_t i = 0; i < rd->nkeys && rd->yes; i++)
		rd->yes = srv_kv_peek(job->kv, rd->keys[i], NULL, NULL)
		    || ts_queue_nonempty(rd->c->ts, rd->keys[i]);
}

static void
ts_read_exists(struct ts_read *rd, struct srv_job *job)
{
	rd->yes = srv_kv_peek(job->kv, rd->keys[0], NULL, NULL);
}

static void
ts_read_count(struct ts_read *rd, struct srv_job *job)
{
	rd->ok = ts_put_u64(rd->c, srv_kv_count(job->kv));
}

static void
ts_list_one(void *arg, const char *key, const void *val, size_t vlen)
{
	struct ts_conn *c = arg;

	(void)val;
	(void)vlen;
	(void)ts_put_bytes(c, key, strlen(key));
}

static void
ts_read_list(struct ts_read *rd, struct srv_job *job)
{
	rd->ok = ts_put_u64(rd->c, srv_kv_count(job->kv));
	if (rd->ok)
		srv_kv_foreach(job->kv, ts_list_one, rd->c);
}

/* ------------------------------------------------------------------------ */
/* Queries                                                                  */
/* ------------------------------------------------------------------------ */

/* What one query becomes: answered here, or a request for the core
 * (req.body_case set), sent with its payload parts once parsed. What it
 * allocates is freed after. */
struct ts_op {
	Cohort__Request req;
	union {
		Cohort__KvSet set;
		Cohort__KvAppend append;
		Cohort__KvCompareSet cas;
		Cohort__KvDelete del;
		Cohort__KvAdd add;
		Cohort__KvWait wait;
		Cohort__KvMultiSet mset;
	} b;
	struct cohort__iov iov[2];
	const struct cohort__iov *parts;
	size_t nparts;
	char *key;
	char **keys;
	size_t nkeys;
	uint64_t *lens;
	struct cohort__iov *miov;
};

static enum ts_parse
ts_done(bool ok)
{
	return (ok ? TS_DONE : TS_BAD);
}

static enum ts_parse
ts_ping(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	uint8_t nonce[4];

	(void)op;
	if (!ts_get(k, nonce, 4))
		return (TS_MORE);
	return (ts_done(ts_put(c, nonce, 4)));
}

/* SET and APPEND: a key and its bytes. */
static enum ts_parse
ts_key_value(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	const uint8_t *v;
	size_t vl;

	if ((op->key = ts_key(k)) == NULL
	    || !ts_get_str(k, c->ts->max_value, "value", &v, &vl))
		return (TS_MORE);
	op->iov[0].base = v;
	op->iov[0].len = vl;
	op->parts = op->iov;
	op->nparts = 1;
	return (TS_DONE);
}

static enum ts_parse
ts_set(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	enum ts_parse r = ts_key_value(c, k, op);

	if (r != TS_DONE)
		return (r);
	op->b.set = (Cohort__KvSet)COHORT__KV_SET__INIT;
	op->b.set.key = op->key;
	op->req.body_case = COHORT__REQUEST__BODY_KV_SET;
	op->req.kv_set = &op->b.set;
	return (TS_DONE);
}

static enum ts_parse
ts_append(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	enum ts_parse r = ts_key_value(c, k, op);

	if (r != TS_DONE)
		return (r);
	op->b.append = (Cohort__KvAppend)COHORT__KV_APPEND__INIT;
	op->b.append.key = op->key;
	op->req.body_case = COHORT__REQUEST__BODY_KV_APPEND;
	op->req.kv_append = &op->b.append;
	return (TS_DONE);
}

static enum ts_parse
ts_compare_set(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	const uint8_t *a, *b;
	size_t al, bl;
	bool exists;

	if ((op->key = ts_key(k)) == NULL
	    || !ts_get_str(k, c->ts->max_value, "value", &a, &al)
	    || !ts_get_str(k, c->ts->max_value, "value", &b, &bl))
		return (TS_MORE);
	if (!ts_read(c, ts_read_exists, &op->key, 1, &exists))
		return (TS_BAD);
	/* Absent with a non-empty expected value: torch's server answers
	 * the expected value and changes nothing (torchrun's rendezvous
	 * relies on it). */
	if (!exists && al > 0)
		return (ts_done(ts_put_bytes(c, a, al)));
	/* Absent with empty expected: set if still absent. Present: swap
	 * if equal (even to an empty value). The mutex was released in
	 * between: a concurrent change is handled by the core's own
	 * compare. */
	op->b.cas = (Cohort__KvCompareSet)COHORT__KV_COMPARE_SET__INIT;
	op->b.cas.key = op->key;
	op->b.cas.expected_present = exists;
	op->b.cas.expected_len = al;
	op->iov[0].base = a;
	op->iov[0].len = al;
	op->iov[1].base = b;
	op->iov[1].len = bl;
	op->parts = op->iov;
	op->nparts = 2;
	op->req.body_case = COHORT__REQUEST__BODY_KV_COMPARE_SET;
	op->req.kv_compare_set = &op->b.cas;
	return (TS_DONE);
}

static enum ts_parse
ts_get_value(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	if ((op->key = ts_key(k)) == NULL)
		return (TS_MORE);
	return (ts_done(ts_read(c, ts_read_values, &op->key, 1, NULL)));
}

static enum ts_parse
ts_add(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	uint64_t v;

	(void)c;
	if ((op->key = ts_key(k)) == NULL || !ts_get_u64(k, &v))
		return (TS_MORE);
	op->b.add = (Cohort__KvAdd)COHORT__KV_ADD__INIT;
	op->b.add.key = op->key;
	op->b.add.delta = (int64_t)v;
	op->req.body_case = COHORT__REQUEST__BODY_KV_ADD;
	op->req.kv_add = &op->b.add;
	return (TS_DONE);
}

static enum ts_parse
ts_check(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	bool ready;

	if ((op->keys = ts_keys(k, &op->nkeys)) == NULL)
		return (TS_MORE);
	if (!ts_read(c, ts_read_ready, op->keys, op->nkeys, &ready))
		return (TS_BAD);
	return (ts_done(ts_put_u8(c, ready ? TS_READY : TS_NOT_READY)));
}

static enum ts_parse
ts_wait(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	bool ready;
	size_t wb;

	if ((op->keys = ts_keys(k, &op->nkeys)) == NULL)
		return (TS_MORE);
	if (!ts_read(c, ts_read_ready, op->keys, op->nkeys, &ready))
		return (TS_BAD);
	if (ready || op->nkeys == 0)
		return (ts_done(ts_put_u8(c, TS_STOP_WAITING)));
	/* The connection keeps the keys while its wait is parked: counted
	 * against the listener (the core counts its own copies). */
	wb = op->nkeys * (sizeof(char *) + sizeof(bool) + 32);
	for (size_t i = 0; i < op->nkeys; i++)
		wb += strlen(op->keys[i]);
	if (c->ts->wait_bytes + wb > c->ts->max_wait_bytes) {
		ts_badf(k,
		    "a WAIT on %zu keys (%zu bytes) while the listener's "
		    "parked "
		    "WAITs hold %" PRIu64
		    " bytes, over --max-parked-bytes / 4 "
		    "(%" PRIu64 ")",
		    op->nkeys, wb, c->ts->wait_bytes, c->ts->max_wait_bytes);
		return (TS_BAD);
	}
	if ((c->wqueued = calloc(op->nkeys, sizeof(bool))) == NULL)
		return (TS_BAD);
	c->wkeys = op->keys;
	c->nwkeys = op->nkeys;
	c->wbytes = wb;
	c->ts->wait_bytes += wb;
	op->keys = NULL;
	op->nkeys = 0;
	op->b.wait = (Cohort__KvWait)COHORT__KV_WAIT__INIT;
	op->b.wait.keys = c->wkeys;
	op->b.wait.n_keys = c->nwkeys;
	op->req.body_case = COHORT__REQUEST__BODY_KV_WAIT;
	op->req.kv_wait = &op->b.wait;
	return (TS_DONE);
}

static enum ts_parse
ts_num_keys(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	(void)k;
	(void)op;
	return (ts_done(ts_read(c, ts_read_count, NULL, 0, NULL)));
}

static enum ts_parse
ts_delete(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	(void)c;
	if ((op->key = ts_key(k)) == NULL)
		return (TS_MORE);
	op->b.del = (Cohort__KvDelete)COHORT__KV_DELETE__INIT;
	op->b.del.key = op->key;
	op->req.body_case = COHORT__REQUEST__BODY_KV_DELETE;
	op->req.kv_delete = &op->b.del;
	return (TS_DONE);
}

static enum ts_parse
ts_multi_get(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	if ((op->keys = ts_keys(k, &op->nkeys)) == NULL)
		return (TS_MORE);
	return (
	    ts_done(ts_read(c, ts_read_values, op->keys, op->nkeys, NULL)));
}

static enum ts_parse
ts_multi_set(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	uint64_t cnt;
	const uint8_t *v;
	size_t vl;

	if (!ts_get_u64(k, &cnt))
		return (TS_MORE);
	if (cnt > TS_MAX_COUNT) {
		ts_badf(k,
		    "%" PRIu64 " keys in one query, over torch's limit of %u",
		    cnt, TS_MAX_COUNT);
		return (TS_BAD);
	}
	op->keys = calloc(cnt ? cnt : 1, sizeof(char *));
	op->lens = calloc(cnt ? cnt : 1, sizeof(uint64_t));
	op->miov = calloc(cnt ? cnt : 1, sizeof(*op->miov));
	if (op->keys == NULL || op->lens == NULL || op->miov == NULL)
		return (ts_bad(k, "out of memory"));
	for (uint64_t i = 0; i < cnt; i++) {
		char *key = ts_key(k);
		if (key == NULL)
			return (TS_MORE);
		op->keys[op->nkeys++] = key;
		if (!ts_get_str(k, c->ts->max_value, "value", &v, &vl))
			return (TS_MORE);
		op->lens[i] = vl;
		op->miov[i].base = v;
		op->miov[i].len = vl;
	}
	if (cnt == 0)
		return (TS_DONE);
	op->b.mset = (Cohort__KvMultiSet)COHORT__KV_MULTI_SET__INIT;
	op->b.mset.keys = op->keys;
	op->b.mset.n_keys = (size_t)cnt;
	op->b.mset.value_lens = op->lens;
	op->b.mset.n_value_lens = (size_t)cnt;
	op->parts = op->miov;
	op->nparts = (size_t)cnt;
	op->req.body_case = COHORT__REQUEST__BODY_KV_MULTI_SET;
	op->req.kv_multi_set = &op->b.mset;
	return (TS_DONE);
}

static enum ts_parse
ts_cancel_wait(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	(void)k;
	(void)op;
	/* Not parked (a parked WAIT's cancel is taken in ts_input): the
	 * wait ended before; torch's client expects this. */
	return (ts_done(ts_put_u8(c, TS_WAIT_CANCELED)));
}

/* A queue push releases one client parked in WAIT on that name (its
 * core wait is cancelled and answered as satisfied). */
struct ts_release {
	struct srv_tstore *ts;
	const char *name;
};

static void
ts_release_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_release *a = arg;
	struct srv_job *job = srv_job_find(core, a->ts->job);

	for (struct srv_link *l = a->ts->conns.next;
	     l != &a->ts->conns && job != NULL; l = l->next) {
		struct ts_conn *c = SRV_CONTAINER(l, struct ts_conn, tlink);
		bool hit = false, all = true;

		if (c->nc.dead || c->busy != TS_WAIT || c->by_queue)
			continue;
		for (size_t i = 0; i < c->nwkeys; i++) {
			if (!c->wqueued[i] && strcmp(c->wkeys[i], a->name) == 0
			    && !hit) {
				c->wqueued[i] = true;
				hit = true;
			}
			all = all
			    && (c->wqueued[i]
			        || srv_kv_peek(
			            job->kv, c->wkeys[i], NULL, NULL));
		}
		if (!hit)
			continue;
		if (all) {
			c->by_queue = true;
			(void)srv_core_cancel(job, c->client_id, c->busy_seq,
			    COHORT_ECLOSED, "released by a queue push", now);
		}
		return; /* one client per push */
	}
}

static enum ts_parse
ts_queue_push(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	struct srv_tstore *ts = c->ts;
	struct ts_release rel;
	struct ts_queue *qu;
	struct ts_item *it;
	const uint8_t *v;
	size_t vl, cost;

	if ((op->key = ts_key(k)) == NULL
	    || !ts_get_str(k, ts->max_value, "value", &v, &vl))
		return (TS_MORE);
	/* Every item costs its bytes and its own keeping, a new queue its
	 * name (an empty item is not free: issue 22). */
	cost = vl + TS_ITEM_COST;
	if ((qu = ts_queue_find(ts, op->key, false)) == NULL)
		cost += strlen(op->key) + TS_ITEM_COST;
	if (ts->queue_bytes + cost > ts->max_queue_bytes) {
		ts_badf(k,
		    "the listener's queues would hold %" PRIu64 " bytes "
		    "(values and %u bytes per item), over --max-value-bytes "
		    "(%" PRIu64 ")",
		    ts->queue_bytes + cost, TS_ITEM_COST, ts->max_queue_bytes);
		return (TS_BAD);
	}
	if (qu == NULL)
		qu = ts_queue_find(ts, op->key, true);
	if (qu == NULL || (it = malloc(sizeof(*it) + vl)) == NULL)
		return (ts_bad(k, "out of memory"));
	it->next = NULL;
	it->len = vl;
	memcpy(it->data, v, vl);
	if (qu->tail != NULL)
		qu->tail->next = it;
	else
		qu->head = it;
	qu->tail = it;
	qu->n++;
	ts->queue_bytes += cost;
	rel.ts = ts;
	rel.name = op->key;
	srv_with_core(ts->nng, ts_release_locked, &rel);
	return (TS_DONE);
}

/* QUEUE_POP: the length before the pop, then the item if there was one,
 * as torch's server does. */
static enum ts_parse
ts_queue_pop(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	struct ts_queue *qu;
	struct ts_item *it;
	bool ok;

	if ((op->key = ts_key(k)) == NULL)
		return (TS_MORE);
	qu = ts_queue_find(c->ts, op->key, false);
	ok = ts_put_u64(c, qu != NULL ? qu->n : 0);
	if (qu == NULL || qu->n == 0)
		return (ts_done(ok));
	it = qu->head;
	ok = ok && ts_put_bytes(c, it->data, it->len);
	qu->head = it->next;
	if (qu->head == NULL)
		qu->tail = NULL;
	qu->n--;
	c->ts->queue_bytes -= it->len + TS_ITEM_COST;
	free(it);
	if (qu->n == 0)
		ts_queue_drop(c->ts, qu); /* an empty queue reads as absent */
	return (ts_done(ok));
}

static enum ts_parse
ts_queue_len(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	struct ts_queue *qu;

	if ((op->key = ts_key(k)) == NULL)
		return (TS_MORE);
	qu = ts_queue_find(c->ts, op->key, false);
	return (ts_done(ts_put_u64(c, qu != NULL ? qu->n : 0)));
}

static enum ts_parse
ts_list(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	(void)k;
	(void)op;
	return (ts_done(ts_read(c, ts_read_list, NULL, 0, NULL)));
}

/* torch 2.15's store.barrier(key, world_size): the key counts arrivals
 * (as ADD); STOP_WAITING once it reaches world_size. */
static enum ts_parse
ts_barrier(struct ts_conn *c, struct ts_cur *k, struct ts_op *op)
{
	uint64_t world;

	if ((op->key = ts_key(k)) == NULL || !ts_get_u64(k, &world))
		return (TS_MORE);
	/* A count below 1 is reached by this arrival: answered at once,
	 * as torch's server does. */
	c->bworld = (int64_t)world;
	free(c->bkey);
	c->bkey = op->key;
	op->key = NULL; /* the connection's until the barrier ends */
	op->b.add = (Cohort__KvAdd)COHORT__KV_ADD__INIT;
	op->b.add.key = c->bkey;
	op->b.add.delta = 1;
	op->req.body_case = COHORT__REQUEST__BODY_KV_ADD;
	op->req.kv_add = &op->b.add;
	return (TS_DONE);
}

/* ------------------------------------------------------------------------ */
/* Replies of the core                                                      */
/* ------------------------------------------------------------------------ */

/* SET, APPEND, MULTI_SET: nothing on the wire. */
static bool
ts_reply_none(struct ts_conn *c, cohort_status st, const Cohort__Reply *rep,
    const uint8_t *pl, size_t plen)
{
	(void)c;
	(void)rep;
	(void)pl;
	(void)plen;
	return (st == COHORT_OK);
}

/* COMPARE_SET: the value after. */
static bool
ts_reply_value(struct ts_conn *c, cohort_status st, const Cohort__Reply *rep,
    const uint8_t *pl, size_t plen)
{
	(void)rep;
	return (st == COHORT_OK && ts_put_bytes(c, pl, plen));
}

static bool
ts_reply_add(struct ts_conn *c, cohort_status st, const Cohort__Reply *rep,
    const uint8_t *pl, size_t plen)
{
	(void)pl;
	(void)plen;
	return (st == COHORT_OK && rep->body_case == COHORT__REPLY__BODY_KV_ADD
	    && ts_put_u64(c, (uint64_t)rep->kv_add->value));
}

static bool
ts_reply_deleted(struct ts_conn *c, cohort_status st, const Cohort__Reply *rep,
    const uint8_t *pl, size_t plen)
{
	(void)pl;
	(void)plen;
	return (st == COHORT_OK
	    && rep->body_case == COHORT__REPLY__BODY_KV_DELETE
	    && ts_put_u64(c, rep->kv_delete->deleted ? 1 : 0));
}

/* WAIT: STOP_WAITING once every key is there (or a queue push released
 * it); WAIT_CANCELED after the client's CANCEL_WAIT (preceded by
 * STOP_WAITING if the wait had ended first). */
static bool
ts_reply_wait(struct ts_conn *c, cohort_status st, const Cohort__Reply *rep,
    const uint8_t *pl, size_t plen)
{
	bool ok;

	(void)rep;
	(void)pl;
	(void)plen;
	if (st == COHORT_OK || c->by_queue) {
		ok = ts_put_u8(c, TS_STOP_WAITING);
		if (c->cancel_asked)
			ok = ok && ts_put_u8(c, TS_WAIT_CANCELED);
	} else {
		ok = c->cancel_asked && ts_put_u8(c, TS_WAIT_CANCELED);
	}
	ts_wait_forget(c);
	c->cancel_asked = c->by_queue = false;
	return (ok);
}

static void ts_input(struct ts_conn *c, cohort__time now);

/* Releases the connections parked in BARRIER on key (but self). */
static void
ts_barrier_release(
    struct srv_tstore *ts, const char *key, struct ts_conn *self)
{
	for (struct srv_link *l = ts->conns.next, *next; l != &ts->conns;
	     l = next) {
		struct ts_conn *o = SRV_CONTAINER(l, struct ts_conn, tlink);
		next = l->next;
		if (o == self || o->nc.dead || o->busy != TS_BARRIER
		    || o->busy_seq != 0 || o->bkey == NULL
		    || strcmp(o->bkey, key) != 0)
			continue;
		o->busy = -1;
		free(o->bkey);
		o->bkey = NULL;
		if (!ts_put_u8(o, TS_STOP_WAITING)) {
			ts_conn_close(o, "out of memory");
			continue;
		}
		ts_input(o, cohort__now_ms()); /* flushes, reads on */
	}
}

/* BARRIER: the counter was incremented (an ADD); the last arrival
 * releases everyone parked on the key, the others park here. */
static bool
ts_reply_barrier(struct ts_conn *c, cohort_status st, const Cohort__Reply *rep,
    const uint8_t *pl, size_t plen)
{
	(void)pl;
	(void)plen;
	if (st != COHORT_OK || rep->body_case != COHORT__REPLY__BODY_KV_ADD)
		return (false);
	if (rep->kv_add->value < c->bworld) {
		c->busy = TS_BARRIER;
		c->busy_seq = 0;
		return (true);
	}
	ts_barrier_release(c->ts, c->bkey, c);
	free(c->bkey);
	c->bkey = NULL;
	return (ts_put_u8(c, TS_STOP_WAITING));
}

/* ------------------------------------------------------------------------ */
/* The queries' table                                                       */
/* ------------------------------------------------------------------------ */

/* A query: run parses its arguments (TS_MORE: not all here yet) and
 * answers it, or fills op->req for the core; reply answers it from the
 * core's reply (false: the query failed, the connection ends). */
struct ts_cmd {
	enum ts_parse (*run)(
	    struct ts_conn *c, struct ts_cur *k, struct ts_op *op);
	bool (*reply)(struct ts_conn *c, cohort_status st,
	    const Cohort__Reply *rep, const uint8_t *pl, size_t plen);
};

static const struct ts_cmd ts_cmds[] = {
	[TS_SET] = { ts_set, ts_reply_none },
	[TS_COMPARE_SET] = { ts_compare_set, ts_reply_value },
	[TS_GET] = { ts_get_value, NULL },
	[TS_ADD] = { ts_add, ts_reply_add },
	[TS_CHECK] = { ts_check, NULL },
	[TS_WAIT] = { ts_wait, ts_reply_wait },
	[TS_GETNUMKEYS] = { ts_num_keys, NULL },
	[TS_DELETE_KEY] = { ts_delete, ts_reply_deleted },
	[TS_APPEND] = { ts_append, ts_reply_none },
	[TS_MULTI_GET] = { ts_multi_get, NULL },
	[TS_MULTI_SET] = { ts_multi_set, ts_reply_none },
	[TS_CANCEL_WAIT] = { ts_cancel_wait, NULL },
	[TS_PING] = { ts_ping, NULL },
	[TS_QUEUE_PUSH] = { ts_queue_push, NULL },
	[TS_QUEUE_POP] = { ts_queue_pop, NULL },
	[TS_QUEUE_LEN] = { ts_queue_len, NULL },
	[TS_LIST] = { ts_list, NULL },
	[TS_BARRIER] = { ts_barrier, ts_reply_barrier },
};

static const struct ts_cmd *
ts_cmd(int q)
{
	if (q < 0 || (size_t)q >= sizeof(ts_cmds) / sizeof(ts_cmds[0])
	    || ts_cmds[q].run == NULL)
		return (NULL);
	return (&ts_cmds[q]);
}

/* A reply from the core, back in this thread: its TCPStore answer. */
static void
ts_on_reply(struct ts_conn *c, struct ts_req *r)
{
	const struct ts_cmd *cmd = ts_cmd(r->query);
	Cohort__Reply *rep = NULL;
	const uint8_t *pl = NULL;
	size_t plen = 0;
	cohort_status st = COHORT_ECLOSED;

	if (r->reply != NULL
	    && cohort__wire_unpack_reply(r->reply, &rep, &pl, &plen)
	        == COHORT_OK)
		st = (cohort_status)rep->status;
	if (r->seq == c->busy_seq)
		c->busy = -1;
	if (!cmd->reply(c, st, rep, pl, plen) && !c->nc.dead) {
		/* TCPStore has no error replies: a refused change (a limit,
		 * ADD on a non-integer) or a lost wait ends the connection,
		 * which the client reports as an error. */
		srv_nconn_refuse(&c->nc, "%s%s%s", cohort_status_name(st),
		    rep != NULL && rep->error != NULL && rep->error[0] ? ": "
		                                                       : "",
		    rep != NULL && rep->error != NULL ? rep->error : "");
	}
	if (rep != NULL)
		cohort__reply__free_unpacked(rep, NULL);
}

/* Parses and runs query q (its byte consumed from k). */
static enum ts_parse
ts_exec(struct ts_conn *c, uint8_t q, struct ts_cur *k)
{
	const struct ts_cmd *cmd = ts_cmd(q);
	struct ts_op op;
	enum ts_parse res;

	if (cmd == NULL) {
		ts_badf(k, "unknown query %u", q);
		return (TS_BAD);
	}
	memset(&op, 0, sizeof(op));
	op.req = (Cohort__Request)COHORT__REQUEST__INIT;
	res = cmd->run(c, k, &op);
	if (k->bad)
		res = TS_BAD;
	if (res == TS_DONE
	    && op.req.body_case != COHORT__REQUEST__BODY__NOT_SET)
		res = ts_done(ts_dispatch(c, q, &op.req, op.parts, op.nparts));
	free(op.lens);
	free(op.miov);
	free(op.key);
	ts_free_keys(op.keys, op.nkeys);
	return (res);
}

struct ts_cancel {
	struct ts_conn *c;
};

static void
ts_cancel_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_cancel *a = arg;
	struct srv_job *job = srv_job_find(core, a->c->ts->job);

	if (job != NULL)
		(void)srv_core_cancel(job, a->c->client_id, a->c->busy_seq,
		    COHORT_ECLOSED, "cancelled by the client", now);
}

/* The first query is VALIDATE with torch's magic number; then the door
 * (door.h) decides whether this peer may use the job's store at all. */
struct ts_admit {
	struct ts_conn *c;
	bool ok;
};

static void
ts_admit_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_admit *a = arg;

	(void)now;
	a->ok = srv_door_job_host(core, a->c->ts->job, &a->c->nc.sa);
}

static bool
ts_admit(struct ts_conn *c)
{
	struct srv_tstore *ts = c->ts;
	char how[200];
	struct ts_admit a = { c, false };

	if (c->nc.loopback || srv_door_same_host(c->nc.fd, &c->nc.sa)) {
		if (!srv_door_local(c->nc.fd, &c->nc.sa, how, sizeof(how))) {
			srv_nconn_refuse(&c->nc,
			    "refused: %s; the listener serves only the "
			    "processes "
			    "of job '%s' (docs/security.md)",
			    how, ts->job);
			return (false);
		}
	} else if (srv_door_allowed(ts->door, &c->nc.sa)) {
		snprintf(how, sizeof(how), "in --torch-store-allow");
	} else {
		srv_with_core(ts->nng, ts_admit_locked, &a);
		if (!a.ok) {
			srv_nconn_refuse(&c->nc,
			    "refused: no client of job '%s' is connected to "
			    "cohortd from that address with the job's token, "
			    "and "
			    "it is not in --torch-store-allow "
			    "(docs/security.md)",
			    ts->job);
			return (false);
		}
		snprintf(how, sizeof(how), "a host of the job");
	}
	cohort__debug("%s: %s let in (%s)", ts->what, c->nc.peer, how);
	srv_nconn_trust(&c->nc);
	srv_nconn_deadline(&c->nc, 0, false, NULL);
	return (true);
}

/* Parses and runs whatever complete queries the input holds. */
static void
ts_input(struct ts_conn *c, cohort__time now)
{
	size_t used = 0;

	while (!c->nc.dead && used < c->inlen) {
		struct ts_cur k;
		uint8_t q = c->in[used];
		enum ts_parse r;

		k.p = c->in + used;
		k.left = c->inlen - used;
		k.bad = false;
		k.why = NULL;

		if (c->busy >= 0) {
			/* Only a CANCEL_WAIT may overtake a parked WAIT. */
			if (c->busy == TS_BARRIER && c->busy_seq == 0
			    && q == TS_CANCEL_WAIT) {
				/* parked here: cancel here */
				used++;
				c->busy = -1;
				free(c->bkey);
				c->bkey = NULL;
				if (!ts_put_u8(c, TS_WAIT_CANCELED)) {
					ts_conn_refuse(c, "out of memory");
					return;
				}
				continue;
			}
			if (c->busy == TS_WAIT && q == TS_CANCEL_WAIT
			    && !c->cancel_asked) {
				struct ts_cancel a = { c };
				c->cancel_asked = true;
				used++;
				srv_with_core(
				    c->ts->nng, ts_cancel_locked, &a);
				continue;
			}
			break;
		}
		k.p++;
		k.left--;
		if (!c->validated) {
			uint8_t m[4];
			uint32_t magic;
			if (q != TS_VALIDATE) {
				ts_conn_refuse(c,
				    "its first query is not VALIDATE (not a "
				    "TCPStore client?)");
				return;
			}
			if (!ts_get(&k, m, 4))
				break;
			magic = (uint32_t)m[0] | (uint32_t)m[1] << 8
			    | (uint32_t)m[2] << 16 | (uint32_t)m[3] << 24;
			if (magic != TS_MAGIC) {
				ts_conn_refuse(c, "wrong magic number");
				return;
			}
			if (!ts_admit(c))
				return;
			c->validated = true;
			used = (size_t)(k.p - c->in);
			continue;
		}
		r = ts_exec(c, q, &k);
		if (r == TS_BAD) {
			ts_conn_refuse(c, k.why ? k.why : "bad request");
			return;
		}
		if (r == TS_MORE)
			break;
		used = (size_t)(k.p - c->in);
	}
	if (c->nc.dead)
		return;
	if (used > 0) {
		memmove(c->in, c->in + used, c->inlen - used);
		c->inlen -= used;
		c->partial_since = 0;
		if (c->validated)
			srv_nconn_deadline(&c->nc, 0, false, NULL);
	}
	/* An incomplete request starts the clock; a complete one waiting
	 * behind a parked WAIT does not (the client is not slow). */
	if (c->inlen > 0 && c->busy < 0 && c->partial_since == 0) {
		c->partial_since = now;
		srv_nconn_deadline(&c->nc, now + c->ts->partial_ms, true,
		    "a request incomplete past --torch-store-timeout");
	}
	ts_conn_flush(c);
	ts_conn_settle(c);
}

/* Reads what the socket has; the input buffer grows as bytes arrive,
 * held against the connection (twice --max-value-bytes + 1 MiB) and
 * --max-pending-bytes. */
static void
ts_conn_read(struct ts_conn *c)
{
	size_t limit = 2 * c->ts->max_value + (1u << 20);

	for (;;) {
		ssize_t n;
		/* Before the door let it in, a connection gets its first
		 * 8 KiB read, no more (VALIDATE is 5 bytes). */
		if (!c->validated && c->incap >= 8192 && c->inlen == c->incap)
			return;
		if (c->incap - c->inlen < 4096
		    && (c->validated || c->incap < 8192)) {
			size_t cap = c->incap ? c->incap * 2 : 8192;
			const char *why;
			uint8_t *p;
			if (c->inlen >= limit) {
				ts_conn_refuse(c,
				    "its requests waiting to be answered are "
				    "over twice --max-value-bytes");
				return;
			}
			if (cap > limit + 8192)
				cap = limit + 8192;
			if (!srv_nconn_hold(&c->nc, cap - c->incap, &why)) {
				srv_nconn_refuse(&c->nc,
				    "cohortd holds its --max-pending-bytes of "
				    "requests still arriving");
				return;
			}
			if ((p = realloc(c->in, cap)) == NULL) {
				srv_nconn_unhold(&c->nc, cap - c->incap);
				ts_conn_refuse(c, "out of memory");
				return;
			}
			c->in = p;
			c->incap = cap;
		}
		n = srv_nconn_recv(
		    &c->nc, c->in + c->inlen, c->incap - c->inlen);
		if (n > 0) {
			c->inlen += (size_t)n;
			continue;
		}
		/* 0: nothing more now; -1: EOF (what it sent is still
		 * applied: ts_conn_settle) or closed */
		return;
	}
}

/* ------------------------------------------------------------------------ */
/* The protocol                                                             */
/* ------------------------------------------------------------------------ */

static void
ts_readable(struct srv_nconn *nc, cohort__time now)
{
	struct ts_conn *c = (struct ts_conn *)nc;

	ts_conn_read(c);
	if (!nc->dead)
		ts_input(c, now);
}

static bool
ts_opened(struct srv_nconn *nc, cohort__time now)
{
	struct ts_conn *c = (struct ts_conn *)nc;
	struct srv_tstore *ts = nc->arg;

	c->ts = ts;
	c->busy = -1;
	nc->max_out = 2 * ts->max_value + (1u << 20);
	srv_nconn_set_pipe(nc, srv_net_next_pipe());
	if (getrandom(&c->client_id, sizeof(c->client_id), 0)
	    != (ssize_t)sizeof(c->client_id))
		c->client_id
		    = (uint64_t)cohort__now_ns() ^ ((uint64_t)nc->pipe << 32);
	srv_list_append(&ts->conns, &c->tlink);
	/* VALIDATE within the first-request timeout, or the connection is
	 * closed: silent ones do not hold slots (issue 22). */
	srv_nconn_deadline(nc, now + ts->first_ms, false,
	    "no VALIDATE within --first-request-timeout");
	return (true);
}

static void
ts_closing(struct srv_nconn *nc)
{
	struct ts_conn *c = (struct ts_conn *)nc;

	srv_list_remove(&c->tlink);
	srv_nconn_unhold(nc, c->incap);
	/* Withdraws its parked calls (their tp come back with NULL) and
	 * frees its client: a TCPStore client never reconnects. */
	if (nc->pipe != 0)
		srv_with_core_pipe_closed(c->ts->nng, nc->pipe);
}

static void
ts_fini(struct srv_nconn *nc)
{
	struct ts_conn *c = (struct ts_conn *)nc;

	ts_wait_forget(c);
	free(c->bkey);
	free(c->in);
}

/* A reply of the core, on the net thread. */
static void
ts_delivered(struct srv_nconn *nc, struct srv_npost *p, cohort__time now)
{
	struct ts_req *r = SRV_CONTAINER(p, struct ts_req, post);
	struct ts_conn *c = (struct ts_conn *)nc;

	if (!nc->dead) {
		ts_on_reply(c, r);
		if (!nc->dead)
			ts_input(c, now);
	} else if (r->seq == c->busy_seq) {
		c->busy = -1;
	}
	if (r->reply != NULL)
		nng_msg_free(r->reply);
	free(r);
}

static const struct srv_proto ts_proto = {
	.name = "torch store",
	.conn_size = sizeof(struct ts_conn),
	.opened = ts_opened,
	.readable = ts_readable,
	.delivered = ts_delivered,
	.closing = ts_closing,
	.fini = ts_fini,
};

/* ------------------------------------------------------------------------ */
/* Start and stop                                                           */
/* ------------------------------------------------------------------------ */

struct ts_job_arg {
	struct srv_tstore *ts;
	cohort_status rv;
};

/* Creates the job (kept while empty) unless it exists; adopts its token.
 * The listener's bounds follow the core's. */
static void
ts_job_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_job_arg *a = arg;
	struct srv_job *job = srv_job_find(core, a->ts->job);

	(void)now;
	a->ts->max_value = core->lim.max_value;
	a->ts->first_ms = core->first_request_ms;
	/* Queues: items and their own cost, up to one largest value;
	 * parked WAITs' keys: a quarter of --max-parked-bytes. */
	a->ts->max_queue_bytes = core->lim.max_value;
	a->ts->max_wait_bytes = core->lim.max_parked_bytes != 0
	    ? core->lim.max_parked_bytes / 4
	    : UINT64_MAX;
	if (job == NULL) {
		a->rv = srv_job_add_preset(core, a->ts->job, a->ts->token);
		return;
	}
	job->preset = true;
	cohort__strlcpy(a->ts->token, job->token, sizeof(a->ts->token));
	a->rv = COHORT_OK;
}

cohort_status
srv_tstore_start(struct srv_net *net, struct srv_nng *n,
    const struct srv_door *door, const char *spec, const char *token,
    uint32_t partial_ms, struct srv_tstore **out)
{
	struct srv_tstore *ts;
	const char *at = strchr(spec, '@');
	const char *hostport = at != NULL ? at + 1 : spec;
	struct ts_job_arg ja;
	cohort_status rv;

	if ((ts = calloc(1, sizeof(*ts))) == NULL)
		return (COHORT_ENOMEM);
	ts->nng = n;
	ts->net = net;
	ts->door = door;
	ts->partial_ms = partial_ms ? partial_ms : TS_PARTIAL_MS;
	srv_list_init(&ts->conns);
	if (at != NULL
	    && ((size_t)(at - spec) == 0
	        || (size_t)(at - spec) > SRV_MAX_NAME)) {
		rv = cohort__err(COHORT_EINVAL,
		    "--torch-store '%s': the job name must be 1..%d bytes",
		    spec, SRV_MAX_NAME);
		goto out_free;
	}
	if (strlen(token) > SRV_MAX_NAME) {
		rv = cohort__err(COHORT_EINVAL, "token too long");
		goto out_free;
	}
	cohort__strlcpy(ts->token, token, sizeof(ts->token));
	if ((rv = srv_net_listen(
	         net, hostport, &ts_proto, ts, "--torch-store", &ts->l))
	    != COHORT_OK)
		goto out_free;
	cohort__strlcpy(ts->addr, srv_nlistener_addr(ts->l), sizeof(ts->addr));
	if (at != NULL) {
		memcpy(ts->job, spec, (size_t)(at - spec));
		ts->job[at - spec] = '\0';
	} else {
		snprintf(ts->job, sizeof(ts->job), "torch-%s",
		    strrchr(ts->addr, ':') + 1);
	}
	snprintf(
	    ts->what, sizeof(ts->what), "torch store of job '%s'", ts->job);
	srv_nlistener_set_what(ts->l, ts->what);
	ja.ts = ts;
	ja.rv = COHORT_ESTATE;
	srv_with_core(n, ts_job_locked, &ja);
	if ((rv = ja.rv) != COHORT_OK)
		goto out_free;
	cohort__info("torch store for job '%s' on %s", ts->job, ts->addr);
	*out = ts;
	return (COHORT_OK);

out_free:
	/* a listener already made is closed with the net */
	free(ts);
	return (rv);
}

const char *
srv_tstore_addr(const struct srv_tstore *ts)
{
	return (ts->addr);
}

const char *
srv_tstore_job(const struct srv_tstore *ts)
{
	return (ts->job);
}

void
srv_tstore_free(struct srv_tstore *ts)
{
	if (ts == NULL)
		return;
	ts_queues_free(ts);
	free(ts);
}
