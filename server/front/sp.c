/*
 * sp.c - the cohort protocol on tcp:// listeners, served by cohortd's own
 * connection layer (net.c) instead of nng's tcp transport, so that what a
 * peer makes cohortd hold is bounded (docs/coordinator.md, Connections):
 * nng reads a frame's declared length and allocates it whole, and keeps
 * no account across connections.
 *
 * The wire is nng's (SP over TCP, RFC-style scalability protocols), which
 * libcohort's req0 sockets speak unchanged:
 *
 *   each side first sends 8 bytes: 0x00 'S' 'P' 0x00, its protocol (u16
 *   big endian: req0 0x0030, rep0 0x0031), 0x00 0x00;
 *   then frames: u64 big-endian length, then that many bytes. A request's
 *   bytes start with its backtrace: 32-bit big-endian words up to and
 *   including the first with the high bit set (req0's request id; a
 *   device in between adds hops), then the body. The reply echoes the
 *   backtrace before its body.
 *
 * Bounds: a frame is at most --max-value-bytes + 1 MiB (nng's receive
 * limit before), and 64 KiB until the connection authenticated (a
 * request of it was accepted with a job's token: a join always comes
 * first); its memory is taken as its bytes arrive, in steps of at most
 * twice what arrived, against the connection and --max-pending-bytes;
 * a frame must complete within --first-request-timeout plus a second per
 * MiB declared. Every complete request goes to the core like an nng one
 * (srv_core_dispatch); its reply comes back through the core's sink
 * (sp_deliver) to this thread.
 */
#include <inttypes.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/pipes.h"
#include "dispatch.h"
#include "events.h"
#include "net.h"
#include "nng_rep.h"
#include "sp.h"

/* A frame before the connection authenticated. */
#define SP_UNTRUSTED_FRAME (64u << 10)
/* Hops of a backtrace (nng's default maximum TTL). */
#define SP_MAX_HOPS 8
/* A frame's memory grows in steps from this. */
#define SP_STEP (64u << 10)
/* Bytes read from one connection per wake-up (fairness). */
#define SP_READ_BUDGET (4u << 20)

static const uint8_t sp_hello[8] = { 0, 'S', 'P', 0, 0x00, 0x31, 0, 0 };

struct srv_sp {
	struct srv_nng *nng;
	uint64_t max_frame;
	cohort__time first_ms;
	char addr[96];
};

struct sp_conn {
	struct srv_nconn nc;
	struct srv_sp *sp;
	uint8_t hs[8];
	size_t hsgot;
	bool hs_ok;
	/* the frame being read */
	uint8_t lenb[8];
	size_t lgot;
	uint64_t flen; /* declared */
	uint8_t bt[4 * SP_MAX_HOPS];
	size_t btlen;
	bool bt_done;
	nng_msg *msg; /* body so far (its allocation held) */
	size_t mlen, mcap;
	uint64_t left; /* bytes of the frame still to come */
	uint64_t nreq; /* complete requests */
};

struct sp_req {
	struct srv_tp tp; /* first: its deliver is sp_deliver */
	struct srv_npost post;
	struct srv_sp *sp;
	nng_msg *reply;
	uint8_t bt[4 * SP_MAX_HOPS];
	size_t btlen;
};

static void
sp_be64(uint8_t *b, uint64_t v)
{
	for (int i = 7; i >= 0; i--, v >>= 8)
		b[i] = (uint8_t)v;
}

static uint64_t
sp_ld_be64(const uint8_t *b)
{
	uint64_t v = 0;

	for (int i = 0; i < 8; i++)
		v = v << 8 | b[i];
	return (v);
}

/* ------------------------------------------------------------------------ */
/* Into and out of the core                                                 */
/* ------------------------------------------------------------------------ */

/* The core's sink hands the reply of one of ours (or NULL: none) here,
 * under the server mutex, on any thread: to the net thread. */
static void
sp_deliver(struct srv_tp *tp, nng_msg *reply)
{
	struct sp_req *r = (struct sp_req *)(void *)tp;
	struct srv_nconn *c = r->post.c;

	r->reply = reply;
	srv_net_post(c->net, c, &r->post);
}

static void
sp_delivered(struct srv_nconn *c, struct srv_npost *p, cohort__time now)
{
	struct sp_req *r = SRV_CONTAINER(p, struct sp_req, post);
	uint8_t hdr[8 + sizeof(r->bt)];

	(void)now;
	if (r->reply != NULL && !c->dead) {
		sp_be64(hdr, r->btlen + nng_msg_len(r->reply));
		memcpy(hdr + 8, r->bt, r->btlen);
		if (srv_nconn_put_msg(c, hdr, 8 + r->btlen, r->reply))
			srv_nconn_flush(c);
	} else if (r->reply != NULL) {
		nng_msg_free(r->reply);
	}
	free(r);
}

struct sp_disp {
	struct sp_conn *c;
	nng_msg *msg;
	struct sp_req *r;
	bool trusted;
};

static void
sp_dispatch_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct sp_disp *d = arg;
	uint32_t pipe = d->c->nc.pipe;
	struct srv_pipe *p;

	srv_core_dispatch(core, d->msg, pipe, d->r, now);
	d->msg = NULL;
	/* A request accepted with a job's token binds a client to the
	 * connection: it is authenticated from now on. */
	p = srv_pipe_find(core, pipe);
	d->trusted = p != NULL && !srv_list_empty(&p->clients);
}

static void
sp_dispatch(struct sp_conn *c, nng_msg *msg)
{
	struct sp_disp d = { c, msg, NULL, false };

	if ((d.r = calloc(1, sizeof(*d.r))) == NULL) {
		nng_msg_free(msg);
		srv_nconn_close(&c->nc, "out of memory");
		return;
	}
	d.r->tp.deliver = sp_deliver;
	d.r->sp = c->sp;
	d.r->post.c = &c->nc;
	memcpy(d.r->bt, c->bt, c->btlen);
	d.r->btlen = c->btlen;
	/* the reply (or its absence) comes back through the inbox */
	srv_nconn_ref(&c->nc);
	srv_with_core(c->sp->nng, sp_dispatch_locked, &d);
	if (d.msg != NULL) {
		/* stopping: nothing was dispatched */
		nng_msg_free(d.msg);
		c->nc.refs--;
		free(d.r);
		return;
	}
	if (d.trusted && !c->nc.trusted) {
		srv_nconn_trust(&c->nc);
		c->nc.max_held = c->sp->max_frame;
	}
}

/* ------------------------------------------------------------------------ */
/* Reading frames                                                           */
/* ------------------------------------------------------------------------ */

static void
sp_frame_reset(struct sp_conn *c)
{
	if (c->msg != NULL)
		nng_msg_free(c->msg);
	srv_nconn_unhold(&c->nc, c->mcap);
	c->msg = NULL;
	c->mlen = c->mcap = 0;
	c->lgot = 0;
	c->flen = c->left = 0;
	c->btlen = 0;
	c->bt_done = false;
}

/* Room for `more` body bytes: the body's buffer grows as its bytes
 * arrive, each step at most doubling it, so what is held is at most
 * twice what arrived (nng_msg_alloc may touch what it allocates). */
static bool
sp_room(struct sp_conn *c, size_t more)
{
	size_t body = (size_t)(c->flen - c->btlen);
	size_t need = c->mlen + more, cap;
	const char *why;
	nng_msg *m;

	if (need <= c->mcap)
		return (true);
	cap = c->mcap > 0 ? c->mcap * 2 : SP_STEP;
	while (cap < need)
		cap *= 2;
	if (cap > body || body - cap < SP_STEP)
		cap = body;
	if (!srv_nconn_hold(&c->nc, cap - c->mcap, &why)) {
		if (strcmp(why, "connection") == 0)
			srv_nconn_refuse(&c->nc,
			    "a frame of %" PRIu64 " bytes is over what this "
			    "connection may hold",
			    c->flen);
		else
			srv_nconn_refuse(&c->nc,
			    "cohortd holds its --max-pending-bytes of "
			    "requests "
			    "still arriving; a frame of %" PRIu64
			    " bytes is refused",
			    c->flen);
		return (false);
	}
	if (nng_msg_alloc(&m, cap) != 0) {
		srv_nconn_unhold(&c->nc, cap - c->mcap);
		srv_nconn_refuse(&c->nc, "out of memory");
		return (false);
	}
	if (c->mlen > 0)
		memcpy(nng_msg_body(m), nng_msg_body(c->msg), c->mlen);
	if (c->msg != NULL)
		nng_msg_free(c->msg);
	c->msg = m;
	c->mcap = cap;
	return (true);
}

/* The frame is complete: to the core. */
static void
sp_frame_done(struct sp_conn *c)
{
	nng_msg *m = c->msg;

	if (m == NULL && nng_msg_alloc(&m, 0) != 0) {
		srv_nconn_refuse(&c->nc, "out of memory");
		return;
	}
	nng_msg_chop(m, c->mcap - c->mlen);
	c->msg = NULL;
	srv_nconn_unhold(&c->nc, c->mcap);
	c->mcap = c->mlen = 0;
	c->nreq++;
	srv_nconn_deadline(&c->nc, 0, false, NULL);
	sp_dispatch(c, m);
	c->lgot = 0;
	c->flen = c->left = 0;
	c->btlen = 0;
	c->bt_done = false;
}

/* The SP header of the peer: a req0 socket's. */
static bool
sp_hello_ok(struct sp_conn *c)
{
	const uint8_t *h = c->hs;

	if (h[0] != 0 || h[1] != 'S' || h[2] != 'P' || h[3] != 0 || h[6] != 0
	    || h[7] != 0) {
		srv_nconn_refuse(&c->nc,
		    "not an SP peer (not a cohort client? its first bytes are "
		    "not nng's header)");
		return (false);
	}
	if (h[4] != 0x00 || h[5] != 0x30) {
		srv_nconn_refuse(&c->nc,
		    "an SP peer of protocol 0x%02x%02x, not req0 (0x0030)",
		    h[4], h[5]);
		return (false);
	}
	c->hs_ok = true;
	return (true);
}

/* A frame's length is known: is it one this connection may send? */
static bool
sp_len_ok(struct sp_conn *c, cohort__time now)
{
	uint64_t max = c->nc.trusted ? c->sp->max_frame : SP_UNTRUSTED_FRAME;

	c->flen = sp_ld_be64(c->lenb);
	if (c->flen < 4) {
		srv_nconn_refuse(&c->nc,
		    "a frame of %" PRIu64 " bytes (no request id)", c->flen);
		return (false);
	}
	if (c->flen > max) {
		srv_nconn_refuse(&c->nc,
		    "a frame of %" PRIu64 " bytes, over %s (%" PRIu64 ")",
		    c->flen,
		    c->nc.trusted
		        ? "--max-value-bytes + 1 MiB"
		        : "what a connection may send before it authenticated",
		    max);
		return (false);
	}
	c->left = c->flen;
	/* A second per MiB on top of the first-request timeout: a slow
	 * link still delivers a 64 MiB value, a slowloris does not hold
	 * its memory for long. */
	srv_nconn_deadline(&c->nc,
	    now + c->sp->first_ms + (cohort__time)(c->flen >> 20) * 1000, true,
	    "a request frame incomplete past --first-request-timeout (plus "
	    "a second per MiB)");
	return (true);
}

/* Consumes n bytes at p through the frame state machine. */
static void
sp_consume(struct sp_conn *c, const uint8_t *p, size_t n, cohort__time now)
{
	while (n > 0 && !c->nc.dead) {
		size_t k;
		if (!c->hs_ok) {
			k = sizeof(c->hs) - c->hsgot < n
			    ? sizeof(c->hs) - c->hsgot
			    : n;
			memcpy(c->hs + c->hsgot, p, k);
			c->hsgot += k;
			p += k;
			n -= k;
			if (c->hsgot == sizeof(c->hs) && !sp_hello_ok(c))
				return;
			continue;
		}
		if (c->lgot < 8) {
			k = 8 - c->lgot < n ? 8 - c->lgot : n;
			memcpy(c->lenb + c->lgot, p, k);
			c->lgot += k;
			p += k;
			n -= k;
			if (c->lgot == 8 && !sp_len_ok(c, now))
				return;
			continue;
		}
		if (!c->bt_done) {
			/* one 4-byte word at a time */
			size_t want = 4 - (c->btlen % 4);
			k = want < n ? want : n;
			if ((uint64_t)k > c->left) {
				srv_nconn_refuse(&c->nc,
				    "a frame shorter than its backtrace");
				return;
			}
			memcpy(c->bt + c->btlen, p, k);
			c->btlen += k;
			c->left -= k;
			p += k;
			n -= k;
			if (c->btlen % 4 == 0) {
				if (c->bt[c->btlen - 4] & 0x80)
					c->bt_done = true;
				else if (c->btlen == sizeof(c->bt)) {
					srv_nconn_refuse(&c->nc,
					    "a backtrace of more than %d hops",
					    SP_MAX_HOPS);
					return;
				}
			}
			if (c->bt_done && c->left == 0)
				sp_frame_done(c);
			continue;
		}
		k = c->left < n ? (size_t)c->left : n;
		if (!sp_room(c, k))
			return;
		memcpy((uint8_t *)nng_msg_body(c->msg) + c->mlen, p, k);
		c->mlen += k;
		c->left -= k;
		p += k;
		n -= k;
		if (c->left == 0)
			sp_frame_done(c);
	}
}

static void
sp_readable(struct srv_nconn *nc, cohort__time now)
{
	struct sp_conn *c = (struct sp_conn *)nc;
	uint8_t stage[16384];
	size_t budget = SP_READ_BUDGET;

	while (!nc->dead && budget > 0) {
		ssize_t r;
		/* Most of a big body: straight into its buffer. */
		if (c->bt_done && c->left > sizeof(stage)) {
			size_t k = c->left > budget ? budget : (size_t)c->left;
			if (k > (1u << 20))
				k = 1u << 20;
			if (!sp_room(c, k))
				return;
			r = srv_nconn_recv(
			    nc, (uint8_t *)nng_msg_body(c->msg) + c->mlen, k);
			if (r <= 0)
				break;
			c->mlen += (size_t)r;
			c->left -= (uint64_t)r;
			budget -= (size_t)r < budget ? (size_t)r : budget;
			if (c->left == 0)
				sp_frame_done(c);
			continue;
		}
		r = srv_nconn_recv(nc, stage, sizeof(stage));
		if (r <= 0)
			break;
		budget -= (size_t)r < budget ? (size_t)r : budget;
		sp_consume(c, stage, (size_t)r, now);
	}
	/* As nng's tcp transport: the peer's EOF ends the connection (its
	 * members fail at once, "connection lost"). */
	if (!nc->dead && nc->rd_eof)
		srv_nconn_close(nc, "closed by the client");
}

/* ------------------------------------------------------------------------ */
/* Connections                                                              */
/* ------------------------------------------------------------------------ */

struct sp_open {
	uint32_t pipe;
	uint8_t addr[16];
	size_t alen;
};

static void
sp_opened_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct sp_open *o = arg;

	srv_pipe_opened(core, o->pipe, now);
	srv_pipe_set_addr(core, o->pipe, o->addr, o->alen);
}

static bool
sp_opened(struct srv_nconn *nc, cohort__time now)
{
	struct sp_conn *c = (struct sp_conn *)nc;
	struct sp_open o;

	(void)now;
	c->sp = nc->arg;
	nc->max_held = SP_UNTRUSTED_FRAME;
	nc->max_out = 2 * c->sp->max_frame;
	srv_nconn_set_pipe(nc, srv_net_next_pipe());
	if (nc->pipe == 0)
		return (false);
	/* tracked for the first-request and idle timeouts (the core's) */
	o.pipe = nc->pipe;
	o.alen = srv_net_addr(&nc->sa, o.addr, NULL);
	srv_with_core(c->sp->nng, sp_opened_locked, &o);
	if (!srv_nconn_put(nc, sp_hello, sizeof(sp_hello)))
		return (false);
	srv_nconn_flush(nc);
	return (!nc->dead);
}

static void
sp_closing(struct srv_nconn *nc)
{
	struct sp_conn *c = (struct sp_conn *)nc;

	sp_frame_reset(c);
	/* Fails its running members, drops its parked requests (their
	 * NULL replies come back through the inbox). Not when cohortd is
	 * stopping (a drain's end, SIGINT): its members did not lose it,
	 * and its successor on the journal must see them running until
	 * their dead-after, not failed. */
	if (nc->pipe != 0 && !srv_net_stopping(nc->net))
		srv_with_core_pipe_closed(c->sp->nng, nc->pipe);
}

static void
sp_fini(struct srv_nconn *nc)
{
	struct sp_conn *c = (struct sp_conn *)nc;

	if (c->msg != NULL)
		nng_msg_free(c->msg);
	c->msg = NULL;
}

static const struct srv_proto sp_proto = {
	.name = "cohort",
	.conn_size = sizeof(struct sp_conn),
	.opened = sp_opened,
	.readable = sp_readable,
	.delivered = sp_delivered,
	.closing = sp_closing,
	.fini = sp_fini,
};

struct sp_cfg {
	struct srv_sp *sp;
};

static void
sp_cfg_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct sp_cfg *a = arg;

	(void)now;
	a->sp->max_frame = core->lim.max_value + COHORT__ENVELOPE_ALLOWANCE;
	a->sp->first_ms = core->first_request_ms;
}

cohort_status
srv_sp_listen(struct srv_net *net, struct srv_nng *nng, const char *url,
    struct srv_sp **out)
{
	struct srv_sp *sp = calloc(1, sizeof(*sp));
	struct srv_nlistener *l;
	struct sp_cfg a;
	cohort_status rv;

	if (sp == NULL)
		return (COHORT_ENOMEM);
	sp->nng = nng;
	a.sp = sp;
	srv_with_core(nng, sp_cfg_locked, &a);
	if ((rv = srv_net_listen(
	         net, url + strlen("tcp://"), &sp_proto, sp, "--listen", &l))
	    != COHORT_OK) {
		free(sp);
		return (rv);
	}
	/* The host as given (a name stays a name), the port as bound. */
	snprintf(sp->addr, sizeof(sp->addr), "%.*s:%s",
	    (int)(strrchr(url, ':') - url), url,
	    strrchr(srv_nlistener_addr(l), ':') + 1);
	*out = sp;
	return (COHORT_OK);
}

bool
srv_sp_url(const char *url)
{
	return (strncmp(url, "tcp://", 6) == 0);
}

const char *
srv_sp_addr(const struct srv_sp *sp)
{
	return (sp->addr);
}

void
srv_sp_free(struct srv_sp *sp)
{
	free(sp);
}
