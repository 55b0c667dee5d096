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

#include "core/util.h"
#include "state/job.h"
#include "state/kv.h"
#include "state/lifecycle.h"
#include "dispatch.h"
#include "events.h"
#include "nng_rep.h"
#include "torchstore.h"

#define TS_MAGIC 0x3C85F7CEu
#define TS_PARTIAL_MS 30000u
/* Keys per CHECK/WAIT/MULTI_GET/MULTI_SET (torch's own bound). */
#define TS_MAX_COUNT (128u * 1024u)
/* Connections per listener. */
#define TS_MAX_CONNS 4096
/* Pipe ids of TCPStore connections: nng's ids are 31-bit. */
#define TS_PIPE_BASE 0x80000000u

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
	struct srv_tstore *ts;
	struct ts_conn *next, *prev;
	int fd;
	uint32_t pipe;
	uint64_t client_id;
	uint64_t seq;
	bool validated;
	/* The client closed its side: what it sent is still applied and
	 * answered in order, then the connection closes (ts_conn_settle). */
	bool eof;
	bool dead; /* closed; freed when refs == 0 */
	int refs; /* requests whose reply has not come back */
	/* The request in flight (dispatched to the core), -1 if none. */
	int busy;
	uint64_t busy_seq;
	/* WAIT in flight: the keys it waits for, and what ended it. */
	char **wkeys;
	size_t nwkeys;
	bool *wqueued; /* per key: satisfied by a queue push */
	bool cancel_asked; /* CANCEL_WAIT arrived while parked */
	bool by_queue; /* released by a queue push */
	/* BARRIER: the counter key and the count that releases it; while
	 * waiting, busy == TS_BARRIER and busy_seq == 0 (parked here). */
	char *bkey;
	int64_t bworld;
	uint8_t *in;
	size_t inlen, incap;
	cohort__time partial_since; /* 0: no incomplete request */
	uint8_t *out;
	size_t outlen, outoff, outcap;
	bool want_out;
	char peer[64];
};

struct ts_req {
	struct srv_tp tp; /* first: its deliver is ts_deliver */
	struct ts_conn *conn;
	int query;
	uint64_t seq;
	nng_msg *reply;
	struct ts_req *next;
};

struct srv_tstore {
	struct srv_nng *nng;
	char job[SRV_MAX_NAME + 1];
	char token[SRV_MAX_NAME + 1];
	char addr[96];
	uint32_t partial_ms;
	uint64_t max_value;
	int lfd, efd, epfd;
	pthread_t thread;
	bool started;
	atomic_bool stop;
	pthread_mutex_t inbox_mtx;
	struct ts_req *inbox, **inbox_tail;
	struct ts_conn *conns;
	size_t nconns;
	struct ts_queue *queues;
	uint64_t queue_bytes;
};

/* ------------------------------------------------------------------------ */
/* Buffers                                                                  */
/* ------------------------------------------------------------------------ */

static bool
ts_out_reserve(struct ts_conn *c, size_t more)
{
	size_t need = c->outlen + more, cap = c->outcap ? c->outcap : 256;
	uint8_t *p;

	if (c->outoff > 0 && c->outoff == c->outlen)
		c->outoff = c->outlen = 0, need = more;
	if (need <= c->outcap)
		return (true);
	while (cap < need)
		cap *= 2;
	if ((p = realloc(c->out, cap)) == NULL)
		return (false);
	c->out = p;
	c->outcap = cap;
	return (true);
}

static bool
ts_put(struct ts_conn *c, const void *p, size_t n)
{
	if (!ts_out_reserve(c, n))
		return (false);
	if (n > 0)
		memcpy(c->out + c->outlen, p, n);
	c->outlen += n;
	return (true);
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

/* u64 count then count keys. NULL with k->bad, or NULL for "need more". */
static char **
ts_keys(struct ts_cur *k, size_t *n)
{
	uint64_t cnt;
	char **keys;

	if (!ts_get_u64(k, &cnt))
		return (NULL);
	if (cnt > TS_MAX_COUNT) {
		ts_badf(k,
		    "%" PRIu64 " keys in one query, over torch's limit of %u",
		    cnt, TS_MAX_COUNT);
		return (NULL);
	}
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

static void ts_conn_close(struct ts_conn *c, const char *why);

static void
ts_conn_free(struct ts_conn *c)
{
	struct srv_tstore *ts = c->ts;

	if (c->prev != NULL)
		c->prev->next = c->next;
	else
		ts->conns = c->next;
	if (c->next != NULL)
		c->next->prev = c->prev;
	ts->nconns--;
	ts_free_keys(c->wkeys, c->nwkeys);
	free(c->wqueued);
	free(c->bkey);
	free(c->in);
	free(c->out);
	free(c);
}

struct ts_closed_arg {
	uint32_t pipe;
};

static void
ts_closed_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_closed_arg *a = arg;

	/* Withdraws its parked calls (their tp come back with NULL) and
	 * frees its client: a TCPStore client never reconnects. */
	srv_core_pipe_closed(core, a->pipe, now);
}

static void
ts_conn_close(struct ts_conn *c, const char *why)
{
	struct ts_closed_arg a;

	if (c->dead)
		return;
	c->dead = true;
	if (why != NULL)
		cohort__debug("torch store %s: closing %s: %s", c->ts->addr,
		    c->peer, why);
	epoll_ctl(c->ts->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	close(c->fd);
	c->fd = -1;
	a.pipe = c->pipe;
	srv_with_core(c->ts->nng, ts_closed_locked, &a);
	/* Freed by ts_reap once no request of it is in the core. */
}

/* Ends a connection for what its client did (bad input, not reading):
 * the reason goes to cohortd's log at warn level, as torch's libuv server
 * logs it (TCPStore has no error replies: the client sees the closed
 * connection). */
static void
ts_conn_refuse(struct ts_conn *c, const char *why)
{
	if (c->dead)
		return;
	cohort__warn("torch store %s (job '%s'): closing %s: %s", c->ts->addr,
	    c->ts->job, c->peer, why);
	ts_conn_close(c, NULL);
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
	if (c->dead || !c->eof)
		return;
	if (c->busy >= 0 && !ts_conn_parked(c))
		return; /* its reply is on the way, then the rest */
	ts_conn_close(c, "closed by the client");
}

/* Frees the closed connections no request refers to any more. */
static void
ts_reap(struct srv_tstore *ts)
{
	for (struct ts_conn *c = ts->conns, *next; c != NULL; c = next) {
		next = c->next;
		if (c->dead && c->refs == 0)
			ts_conn_free(c);
	}
}

static void
ts_conn_watch(struct ts_conn *c)
{
	struct epoll_event ev;
	bool want = c->outoff < c->outlen;

	if (c->dead || c->eof || want == c->want_out)
		return;
	c->want_out = want;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN | EPOLLRDHUP | (want ? EPOLLOUT : 0);
	ev.data.ptr = c;
	epoll_ctl(c->ts->epfd, EPOLL_CTL_MOD, c->fd, &ev);
}

/* Writes what it can; a client that lets more than twice the largest
 * value pile up is not reading: closed. */
static void
ts_conn_flush(struct ts_conn *c)
{
	while (!c->dead && c->outoff < c->outlen) {
		ssize_t n = send(c->fd, c->out + c->outoff,
		    c->outlen - c->outoff, MSG_NOSIGNAL);
		if (n > 0) {
			c->outoff += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			break;
		if (n < 0 && errno == EINTR)
			continue;
		if (c->eof) {
			/* gone for good: its answers go nowhere, what it
			 * sent is still applied */
			c->outoff = c->outlen;
			break;
		}
		ts_conn_close(c, "send failed");
		return;
	}
	if (c->dead)
		return;
	if (c->outoff == c->outlen)
		c->outoff = c->outlen = 0;
	else if (!c->eof
	    && c->outlen - c->outoff > 2 * c->ts->max_value + (1u << 20))
		ts_conn_refuse(c, "it does not read its replies");
	if (!c->dead)
		ts_conn_watch(c);
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
	c->refs++;
	c->busy = d->query;
	c->busy_seq = r->seq;
	d->ok = true;
	/* The reply (or NULL) reaches ts_deliver, possibly within this
	 * call. */
	srv_core_dispatch(core, msg, c->pipe, r, now);
}

static bool
ts_dispatch(struct ts_conn *c, int query, Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts)
{
	struct ts_disp d = { c, query, req, parts, nparts, false };

	req->timeout_ms = UINT32_MAX; /* WAIT: until the client cancels */
	srv_with_core(c->ts->nng, ts_dispatch_locked, &d);
	return (d.ok);
}

/* The core's sink hands the reply of one of ours (or NULL) here, under
 * the server mutex: to this listener's thread. */
static void
ts_deliver(struct srv_tp *tp, nng_msg *reply)
{
	struct ts_req *r = (struct ts_req *)(void *)tp;
	struct srv_tstore *ts = r->conn->ts;
	uint64_t one = 1;

	r->reply = reply;
	r->next = NULL;
	pthread_mutex_lock(&ts->inbox_mtx);
	*ts->inbox_tail = r;
	ts->inbox_tail = &r->next;
	pthread_mutex_unlock(&ts->inbox_mtx);
	if (write(ts->efd, &one, sizeof(one)) < 0) {
		/* the counter is already non-zero: the thread will look */
	}
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

	if ((op->keys = ts_keys(k, &op->nkeys)) == NULL)
		return (TS_MORE);
	if (!ts_read(c, ts_read_ready, op->keys, op->nkeys, &ready))
		return (TS_BAD);
	if (ready || op->nkeys == 0)
		return (ts_done(ts_put_u8(c, TS_STOP_WAITING)));
	if ((c->wqueued = calloc(op->nkeys, sizeof(bool))) == NULL)
		return (TS_BAD);
	/* The connection keeps the keys while its wait is parked. */
	c->wkeys = op->keys;
	c->nwkeys = op->nkeys;
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

	for (struct ts_conn *c = a->ts->conns; c != NULL && job != NULL;
	     c = c->next) {
		bool hit = false, all = true;

		if (c->dead || c->busy != TS_WAIT || c->by_queue)
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
	size_t vl;

	if ((op->key = ts_key(k)) == NULL
	    || !ts_get_str(k, ts->max_value, "value", &v, &vl))
		return (TS_MORE);
	qu = ts_queue_find(ts, op->key, true);
	if (ts->queue_bytes + vl > 4 * ts->max_value) {
		ts_badf(k,
		    "the listener's queues would hold %" PRIu64 " bytes, over "
		    "4 x --max-value-bytes",
		    ts->queue_bytes + vl);
		return (TS_BAD);
	}
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
	ts->queue_bytes += vl;
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
	c->ts->queue_bytes -= it->len;
	free(it);
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
	ts_free_keys(c->wkeys, c->nwkeys);
	free(c->wqueued);
	c->wkeys = NULL;
	c->wqueued = NULL;
	c->nwkeys = 0;
	c->cancel_asked = c->by_queue = false;
	return (ok);
}

static void ts_input(struct ts_conn *c, cohort__time now);

/* Releases the connections parked in BARRIER on key (but self). */
static void
ts_barrier_release(
    struct srv_tstore *ts, const char *key, struct ts_conn *self)
{
	for (struct ts_conn *o = ts->conns; o != NULL; o = o->next) {
		if (o == self || o->dead || o->busy != TS_BARRIER
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
	if (!cmd->reply(c, st, rep, pl, plen) && !c->dead) {
		/* TCPStore has no error replies: a refused change (a limit,
		 * ADD on a non-integer) or a lost wait ends the connection,
		 * which the client reports as an error. */
		cohort__warn("torch store %s (job '%s'): closing %s: %s%s%s",
		    c->ts->addr, c->ts->job, c->peer, cohort_status_name(st),
		    rep != NULL && rep->error != NULL && rep->error[0] ? ": "
		                                                       : "",
		    rep != NULL && rep->error != NULL ? rep->error : "");
		ts_conn_close(c, NULL);
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

/* Parses and runs whatever complete queries the input holds. */
static void
ts_input(struct ts_conn *c, cohort__time now)
{
	size_t used = 0;

	while (!c->dead && used < c->inlen) {
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
	if (c->dead)
		return;
	if (used > 0) {
		memmove(c->in, c->in + used, c->inlen - used);
		c->inlen -= used;
		c->partial_since = 0;
	}
	/* An incomplete request starts the clock; a complete one waiting
	 * behind a parked WAIT does not (the client is not slow). */
	if (c->inlen > 0 && c->busy < 0 && c->partial_since == 0)
		c->partial_since = now;
	ts_conn_flush(c);
	ts_conn_settle(c);
}

static void
ts_conn_read(struct ts_conn *c)
{
	size_t limit = 2 * c->ts->max_value + (1u << 20);

	for (;;) {
		ssize_t n;
		if (c->incap - c->inlen < 4096) {
			size_t cap = c->incap ? c->incap * 2 : 8192;
			uint8_t *p;
			if (c->inlen >= limit) {
				ts_conn_refuse(c,
				    "its requests waiting to be answered are "
				    "over twice --max-value-bytes");
				return;
			}
			if (cap > limit + 8192)
				cap = limit + 8192;
			if ((p = realloc(c->in, cap)) == NULL) {
				ts_conn_refuse(c, "out of memory");
				return;
			}
			c->in = p;
			c->incap = cap;
		}
		n = recv(c->fd, c->in + c->inlen, c->incap - c->inlen, 0);
		if (n > 0) {
			c->inlen += (size_t)n;
			continue;
		}
		if (n == 0) {
			/* What it sent is still applied (ts_conn_settle);
			 * nothing more to read. */
			c->eof = true;
			epoll_ctl(c->ts->epfd, EPOLL_CTL_DEL, c->fd, NULL);
			return;
		}
		if (errno == EINTR)
			continue;
		if (errno != EAGAIN && errno != EWOULDBLOCK)
			ts_conn_close(c, strerror(errno));
		return;
	}
}

/* ------------------------------------------------------------------------ */
/* The thread                                                               */
/* ------------------------------------------------------------------------ */

/* A pipe id no other connection of this process has had recently: the
 * core remembers closed pipes for a while and drops their requests, so
 * ids are never reused between listeners or connections. */
static uint32_t
ts_next_pipe(void)
{
	static atomic_uint next = 1;
	uint32_t n;

	do
		n = atomic_fetch_add(&next, 1) & 0x7fffffffu;
	while (n == 0);
	return (TS_PIPE_BASE | n);
}

static void
ts_accept(struct srv_tstore *ts)
{
	for (;;) {
		struct sockaddr_storage sa;
		socklen_t sl = sizeof(sa);
		struct epoll_event ev;
		struct ts_conn *c;
		char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?";
		int one = 1;
		int fd = accept4(ts->lfd, (struct sockaddr *)&sa, &sl,
		    SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			return;
		if (ts->nconns >= TS_MAX_CONNS
		    || (c = calloc(1, sizeof(*c))) == NULL) {
			cohort__warn("torch store %s: refusing a connection "
			             "(%zu open)",
			    ts->addr, ts->nconns);
			close(fd);
			continue;
		}
		(void)setsockopt(
		    fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
		(void)getnameinfo((struct sockaddr *)&sa, sl, host,
		    sizeof(host), serv, sizeof(serv),
		    NI_NUMERICHOST | NI_NUMERICSERV);
		snprintf(c->peer, sizeof(c->peer), "%s:%s", host, serv);
		c->ts = ts;
		c->fd = fd;
		c->busy = -1;
		c->pipe = ts_next_pipe();
		if (getrandom(&c->client_id, sizeof(c->client_id), 0)
		    != (ssize_t)sizeof(c->client_id))
			c->client_id = (uint64_t)cohort__now_ns()
			    ^ ((uint64_t)c->pipe << 32);
		c->next = ts->conns;
		if (ts->conns != NULL)
			ts->conns->prev = c;
		ts->conns = c;
		ts->nconns++;
		memset(&ev, 0, sizeof(ev));
		ev.events = EPOLLIN | EPOLLRDHUP;
		ev.data.ptr = c;
		if (epoll_ctl(ts->epfd, EPOLL_CTL_ADD, fd, &ev) != 0) {
			c->dead = true;
			close(fd);
			ts_conn_free(c);
		}
	}
}

static void
ts_drain_inbox(struct srv_tstore *ts)
{
	struct ts_req *r;
	uint64_t v;

	if (read(ts->efd, &v, sizeof(v)) < 0) {
		/* nothing pending (EAGAIN): fine */
	}
	pthread_mutex_lock(&ts->inbox_mtx);
	r = ts->inbox;
	ts->inbox = NULL;
	ts->inbox_tail = &ts->inbox;
	pthread_mutex_unlock(&ts->inbox_mtx);
	while (r != NULL) {
		struct ts_req *next = r->next;
		struct ts_conn *c = r->conn;
		c->refs--;
		if (!c->dead) {
			ts_on_reply(c, r);
			if (!c->dead)
				ts_input(c, cohort__now_ms());
		} else if (r->seq == c->busy_seq) {
			c->busy = -1;
		}
		if (r->reply != NULL)
			nng_msg_free(r->reply);
		free(r);
		r = next;
	}
}

static void *
ts_thread(void *arg)
{
	struct srv_tstore *ts = arg;
	struct epoll_event evs[64];

	while (!atomic_load(&ts->stop)) {
		int n = epoll_wait(ts->epfd, evs, 64, 200);
		cohort__time now = cohort__now_ms();

		for (int i = 0; i < n; i++) {
			void *p = evs[i].data.ptr;
			struct ts_conn *c;
			if (p == &ts->lfd) {
				ts_accept(ts);
				continue;
			}
			if (p == &ts->efd) {
				ts_drain_inbox(ts);
				continue;
			}
			c = p;
			if (c->dead)
				continue;
			if (evs[i].events & EPOLLOUT)
				ts_conn_flush(c);
			if (!c->dead
			    && (evs[i].events
			        & (EPOLLIN | EPOLLRDHUP | EPOLLHUP
			            | EPOLLERR))) {
				ts_conn_read(c);
				if (!c->dead)
					ts_input(c, now);
			}
		}
		/* Requests left incomplete too long (slowloris). */
		for (struct ts_conn *c = ts->conns, *next; c != NULL;
		     c = next) {
			next = c->next;
			if (c->dead || c->partial_since == 0
			    || now - c->partial_since
			        < (cohort__time)ts->partial_ms)
				continue;
			cohort__warn("torch store %s: closing %s: a request "
			             "incomplete for %u ms",
			    ts->addr, c->peer, ts->partial_ms);
			ts_conn_close(c, NULL);
		}
		ts_reap(ts);
	}
	return (NULL);
}

/* ------------------------------------------------------------------------ */
/* Start and stop                                                           */
/* ------------------------------------------------------------------------ */

struct ts_job_arg {
	struct srv_tstore *ts;
	cohort_status rv;
};

/* Creates the job (kept while empty) unless it exists; adopts its token. */
static void
ts_job_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct ts_job_arg *a = arg;
	struct srv_job *job = srv_job_find(core, a->ts->job);

	(void)now;
	a->ts->max_value = core->lim.max_value;
	if (job == NULL) {
		a->rv = srv_job_add_preset(core, a->ts->job, a->ts->token);
		return;
	}
	job->preset = true;
	cohort__strlcpy(a->ts->token, job->token, sizeof(a->ts->token));
	a->rv = COHORT_OK;
}

static cohort_status
ts_listen(struct srv_tstore *ts, const char *hostport)
{
	char host[256];
	const char *colon = strrchr(hostport, ':');
	struct addrinfo hints, *res = NULL;
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);
	char h[INET6_ADDRSTRLEN], p[16];
	int one = 1, rv;
	size_t hl;

	if (colon == NULL || colon[1] == '\0'
	    || (hl = (size_t)(colon - hostport)) >= sizeof(host))
		return (cohort__err(COHORT_EINVAL,
		    "--torch-store '%s': expected [JOB@]ADDR:PORT", hostport));
	memcpy(host, hostport, hl);
	host[hl] = '\0';
	if (host[0] == '[' && hl > 2 && host[hl - 1] == ']') {
		memmove(host, host + 1, hl - 2);
		host[hl - 2] = '\0';
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	if ((rv = getaddrinfo(host[0] ? host : NULL, colon + 1, &hints, &res))
	    != 0)
		return (cohort__err(COHORT_EINVAL, "--torch-store '%s': %s",
		    hostport, gai_strerror(rv)));
	ts->lfd = socket(res->ai_family,
	    res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (ts->lfd < 0) {
		freeaddrinfo(res);
		return (cohort__err(
		    COHORT_ESYSTEM, "socket: %s", strerror(errno)));
	}
	(void)setsockopt(ts->lfd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(ts->lfd, res->ai_addr, res->ai_addrlen) != 0
	    || listen(ts->lfd, 1024) != 0) {
		rv = errno;
		freeaddrinfo(res);
		close(ts->lfd);
		ts->lfd = -1;
		return (cohort__err(COHORT_ESYSTEM,
		    "--torch-store: cannot listen on %s: %s", hostport,
		    strerror(rv)));
	}
	freeaddrinfo(res);
	if (getsockname(ts->lfd, (struct sockaddr *)&sa, &sl) != 0
	    || getnameinfo((struct sockaddr *)&sa, sl, h, sizeof(h), p,
	           sizeof(p), NI_NUMERICHOST | NI_NUMERICSERV)
	        != 0)
		return (cohort__err(
		    COHORT_ESYSTEM, "getsockname: %s", strerror(errno)));
	snprintf(ts->addr, sizeof(ts->addr),
	    strchr(h, ':') ? "[%s]:%s" : "%s:%s", h, p);
	return (COHORT_OK);
}

cohort_status
srv_tstore_start(struct srv_nng *n, const char *spec, const char *token,
    uint32_t partial_ms, struct srv_tstore **out)
{
	struct srv_tstore *ts;
	const char *at = strchr(spec, '@');
	const char *hostport = at != NULL ? at + 1 : spec;
	struct epoll_event ev;
	struct ts_job_arg ja;
	cohort_status rv;

	if ((ts = calloc(1, sizeof(*ts))) == NULL)
		return (COHORT_ENOMEM);
	ts->nng = n;
	ts->lfd = ts->efd = ts->epfd = -1;
	ts->partial_ms = partial_ms ? partial_ms : TS_PARTIAL_MS;
	ts->inbox_tail = &ts->inbox;
	pthread_mutex_init(&ts->inbox_mtx, NULL);
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
	if ((rv = ts_listen(ts, hostport)) != COHORT_OK)
		goto out_free;
	if (at != NULL) {
		memcpy(ts->job, spec, (size_t)(at - spec));
		ts->job[at - spec] = '\0';
	} else {
		snprintf(ts->job, sizeof(ts->job), "torch-%s",
		    strrchr(ts->addr, ':') + 1);
	}
	ja.ts = ts;
	ja.rv = COHORT_ESTATE;
	srv_with_core(n, ts_job_locked, &ja);
	if ((rv = ja.rv) != COHORT_OK)
		goto out_free;
	ts->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	ts->epfd = epoll_create1(EPOLL_CLOEXEC);
	if (ts->efd < 0 || ts->epfd < 0) {
		rv = cohort__err(
		    COHORT_ESYSTEM, "epoll/eventfd: %s", strerror(errno));
		goto out_free;
	}
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.ptr = &ts->lfd;
	epoll_ctl(ts->epfd, EPOLL_CTL_ADD, ts->lfd, &ev);
	ev.data.ptr = &ts->efd;
	epoll_ctl(ts->epfd, EPOLL_CTL_ADD, ts->efd, &ev);
	if (pthread_create(&ts->thread, NULL, ts_thread, ts) != 0) {
		rv = cohort__err(COHORT_ESYSTEM, "pthread_create");
		goto out_free;
	}
	ts->started = true;
	cohort__info("torch store for job '%s' on %s", ts->job, ts->addr);
	*out = ts;
	return (COHORT_OK);

out_free:
	if (ts->lfd >= 0)
		close(ts->lfd);
	if (ts->efd >= 0)
		close(ts->efd);
	if (ts->epfd >= 0)
		close(ts->epfd);
	pthread_mutex_destroy(&ts->inbox_mtx);
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
srv_tstore_stop(struct srv_tstore *ts)
{
	if (ts == NULL)
		return;
	if (ts->started) {
		atomic_store(&ts->stop, true);
		pthread_join(ts->thread, NULL);
	}
	close(ts->lfd);
	/* Closing withdraws the parked calls; their (NULL) replies come
	 * back to the inbox at once, under the mutex. */
	for (struct ts_conn *c = ts->conns; c != NULL; c = c->next)
		ts_conn_close(c, "shutting down");
	ts_drain_inbox(ts);
	/* After pipe_closed the core keeps no request of ours; free all. */
	while (ts->conns != NULL) {
		ts->conns->refs = 0;
		ts_conn_free(ts->conns);
	}
	ts_queues_free(ts);
	close(ts->efd);
	close(ts->epfd);
	pthread_mutex_destroy(&ts->inbox_mtx);
	free(ts);
}
