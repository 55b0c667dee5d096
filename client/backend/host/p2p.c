/*
 * p2p.c - the host backend's point-to-point transfers (backend.h v3):
 * sends and receives between two ranks of a group, over TCP connections
 * of their own, beside the collectives and never ordered with them.
 *
 * Why connections of their own: the collectives' connections carry raw
 * tensor bytes that both ends read in an order they agreed on (agree.c);
 * nothing on them is framed, and a transfer posted while a collective
 * runs (a pipeline stage's send beside a data-parallel all-reduce) could
 * only wait behind it or break it. Here every message is framed, read
 * by one thread that always reads what arrives, so no pending transfer
 * and no collective ever waits for the other.
 *
 * Set-up (p2p_open, at the group's first transfer on this rank; waits
 * for nobody): a listener, its address published under
 * "p2p/<group_id>/<generation>/addr/<rank>" (one KV set), and the
 * engine thread. Connections are made on first use, one per pair of
 * ranks that exchange messages: the lower rank dials (a thread per dial,
 * which waits in the KV for the peer's address, so that no peer that has
 * not opened yet holds up the others), the engine accepts. The handshake
 * is the mesh's (handshake.c: the job's secret, HMAC, refusals), with an
 * identity of its own ("<group_id>#p2p"), so a point-to-point connection
 * can never be taken for a collective one. A receive from any rank
 * connects to every peer.
 *
 * Protocol. Frames of a 24-byte header (big-endian: "CP", type, flags,
 * tag, dtype, 7 zero bytes, byte count), a DATA frame followed by its
 * bytes:
 *   CTS   receive posted: "send me your next message with this tag"
 *         (carries the receive's size and dtype)
 *   RTS   send posted without a CTS in hand: "I have a message with this
 *         tag" (what a receive from any rank chooses a sender by)
 *   DATA  the message, sent only against a CTS (so nothing is ever
 *         buffered ahead of its receive: bytes land in the receive's
 *         buffer straight from the socket); flag ANNOUNCED when an RTS
 *         went before it
 *   NACK  in place of DATA when the CTS's size or dtype differs from the
 *         send's: both sides fail with EMISMATCH naming the two
 * Matching is per (peer, tag) in post order on both sides: the sender
 * pairs the n-th CTS of a tag with its n-th send of that tag, the
 * receiver the n-th DATA with its n-th committed receive. A receive from
 * a named rank commits at once (its CTS goes out); a receive from any
 * rank commits to a rank that announced an unclaimed message with its
 * tag (RTS count minus CTS count per peer and tag), and the receives
 * posted after it with the same tag wait behind it, so that no later
 * receive takes its message.
 *
 * Threads: posts queue frames under the state's lock and write what the
 * socket takes at once; the engine thread polls the listener, the
 * handshakes, the connections and an eventfd, reads every frame as it
 * arrives, writes the rest, and fails transfers at their deadline.
 * done() callbacks run after the lock is released.
 *
 * Failures: a peer's connection that closes, resets or cannot be made
 * fails that peer's transfers (and every later one) with EPEERLOST
 * naming it; a transfer past its deadline fails with ETIMEDOUT saying
 * what it waited for, and then the state is broken (its connections may
 * hold half a frame): every other transfer fails, every later post too.
 * abort() fails everything held with EABORTED at once.
 */
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <poll.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/eventfd.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include "host_impl.h"

#define P2P_HDR 24
#define P2P_MAX_PENDING 16 /* handshakes at the listener */
#define P2P_PER_SOURCE 8
#define P2P_POLL_MS 100 /* longest sleep of the engine */
#define P2P_SLICE_MS 500 /* a dial's wait for an address, per try */
#define P2P_ANY_DIALS 16 /* dials at once for receives from any rank */
#define P2P_HS_TIMEOUT_MS 2000
#define P2P_CONNECT_MS 10000
#define P2P_RETRY_MS 20

enum p2p_type {
	P2P_CTS = 1,
	P2P_RTS = 2,
	P2P_DATA = 3,
	P2P_NACK = 4,
};
#define P2P_F_ANNOUNCED 0x01

/* A frame waiting to be written. */
struct p2p_frame {
	uint8_t hdr[P2P_HDR];
	const uint8_t *payload;
	size_t plen;
	size_t sent; /* of P2P_HDR + plen */
	struct cohort__p2p *req; /* DATA of this send: done once written */
	struct p2p_frame *next;
};

/* A CTS in hand with no send for it yet. */
struct p2p_cts {
	uint32_t tag;
	uint8_t dtype;
	uint64_t bytes;
	struct p2p_cts *next;
};

/* Per tag: messages the peer announced minus receives committed to it. */
struct p2p_avail {
	uint32_t tag;
	int64_t n;
	struct p2p_avail *next;
};

enum { P2P_WANT_NONE = 0, P2P_WANT_ANY = 1, P2P_WANT_NAMED = 2 };

struct p2p_peer {
	int fd; /* -1: not connected */
	int32_t job_rank;
	int want; /* a transfer needs the connection (P2P_WANT_*) */
	bool dialing; /* a dial thread runs */
	bool dial_joinable; /* a dial thread ran: join before the next */
	bool dial_any; /* that dial counts in any_dials */
	pthread_t dial_th;
	cohort_status lost; /* OK while usable */
	char lost_err[256];
	struct p2p_frame *oq, *oq_tail; /* to write, in order */
	struct cohort__p2p *sends; /* waiting for a CTS, in post order */
	struct p2p_cts *cts; /* in hand, no send yet, in arrival order */
	struct cohort__p2p *recvs; /* committed, waiting for DATA */
	struct p2p_avail *avail;
	uint8_t ih[P2P_HDR]; /* the frame header being read */
	size_t ih_have;
	struct cohort__p2p *rd; /* the receive DATA is read into */
	size_t rd_done;
	/* host_send_len of connection seg_fd (seg 0: not asked yet) */
	int seg_fd;
	size_t seg;
};

struct host_p2p {
	int rank;
	int size;
	char job[128];
	char group_id[336]; /* "<group_id>#p2p" */
	char key_group[320]; /* the group's id, for the address key */
	uint64_t generation;
	char bind_addr[64];
	char addr[96];
	uint8_t secret[64];
	struct cohort__tcp_hs_keys keys;
	struct cohort__store store;
	size_t io_max; /* largest single recv() */
	size_t send_max; /* largest payload of one sendmsg() (0: auto) */
	int hs_ms;
	int connect_ms;
	int lfd;
	int evfd;
	struct cohort__tcp_pend pend[P2P_MAX_PENDING];
	struct p2p_peer *peers;
	struct pollfd *pfds;
	int *pfd_peer;

	pthread_mutex_t mu;
	pthread_t thread;
	bool thread_started;
	atomic_int stop; /* abort or close: threads end, posts fail */
	bool closing;
	int any_dials;
	cohort_status broken; /* a transfer timed out: everything fails */
	char broken_err[512];
	/* Receives not yet committed, in post order: from any rank, and
	 * named ones behind one of their tag. */
	struct cohort__p2p *rq;
};

/* The list of transfers completed under the lock, their done() called
 * after it is released. */
struct p2p_done {
	struct cohort__p2p *head, *tail;
};

static void
p2p_finish(struct p2p_done *d)
{
	struct cohort__p2p *r = d->head, *next;

	for (; r != NULL; r = next) {
		next = r->next;
		r->next = NULL;
		r->done(r);
	}
	d->head = d->tail = NULL;
}

static void
p2p_complete(struct p2p_done *d, struct cohort__p2p *r, cohort_status st)
{
	r->st = st;
	r->next = NULL;
	if (d->tail != NULL)
		d->tail->next = r;
	else
		d->head = r;
	d->tail = r;
}

/* "recv #7 from rank 3 (tag 0, 4096 bytes)" */
static void
p2p_what(const struct host_p2p *s, const struct cohort__p2p *r, char *buf,
    size_t len)
{
	bool send = r->kind == COHORT__OP_SEND;

	if (!send && r->peer == COHORT__P2P_ANY)
		snprintf(buf, len,
		    "recv #%" PRIu64 " from any rank (tag %" PRIu32
		    ", %zu bytes)",
		    r->seq, r->tag, r->bytes);
	else
		snprintf(buf, len,
		    "%s #%" PRIu64 " %s rank %d (tag %" PRIu32 ", %zu bytes)",
		    send ? "send" : "recv", r->seq, send ? "to" : "from",
		    (int)s->peers[r->peer].job_rank, r->tag, r->bytes);
}

static void p2p_fail(struct p2p_done *d, struct cohort__p2p *r,
    cohort_status st, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
p2p_fail(struct p2p_done *d, struct cohort__p2p *r, cohort_status st,
    const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(r->err, sizeof(r->err), fmt, ap);
	va_end(ap);
	p2p_complete(d, r, st);
}

static void
p2p_wake(struct host_p2p *s)
{
	uint64_t one = 1;

	(void)!write(s->evfd, &one, sizeof(one));
}

static bool
p2p_stopped(const struct host_p2p *s)
{
	return (
	    atomic_load_explicit((atomic_int *)&s->stop, memory_order_acquire)
	    != 0);
}

/* ------------------------------------------------------------------------ */
/* Frames and the matching                                                  */
/* ------------------------------------------------------------------------ */

static void
p2p_hdr(uint8_t *h, int type, int flags, uint32_t tag, cohort_dtype dt,
    uint64_t bytes)
{
	memset(h, 0, P2P_HDR);
	h[0] = 'C';
	h[1] = 'P';
	h[2] = (uint8_t)type;
	h[3] = (uint8_t)flags;
	host_put_be(h + 4, tag, 4);
	h[8] = (uint8_t)dt;
	host_put_be(h + 16, bytes, 8);
}

/* Queues a frame for peer p; false when out of memory. */
static bool
p2p_queue(struct p2p_peer *p, int type, int flags, uint32_t tag,
    cohort_dtype dt, uint64_t bytes, struct cohort__p2p *req)
{
	struct p2p_frame *f = calloc(1, sizeof(*f));

	if (f == NULL)
		return (false);
	p2p_hdr(f->hdr, type, flags, tag, dt, bytes);
	if (type == P2P_DATA && req != NULL) {
		f->payload = req->buf;
		f->plen = req->bytes;
		f->req = req;
	}
	if (p->oq_tail != NULL)
		p->oq_tail->next = f;
	else
		p->oq = f;
	p->oq_tail = f;
	return (true);
}

static void
p2p_append(struct cohort__p2p **head, struct cohort__p2p *r)
{
	r->next = NULL;
	while (*head != NULL)
		head = &(*head)->next;
	*head = r;
}

/* Takes the first transfer of the list with tag (NULL: none). */
static struct cohort__p2p *
p2p_take(struct cohort__p2p **head, uint32_t tag)
{
	for (; *head != NULL; head = &(*head)->next) {
		struct cohort__p2p *r = *head;

		if (r->tag == tag) {
			*head = r->next;
			r->next = NULL;
			return (r);
		}
	}
	return (NULL);
}

static int64_t *
p2p_avail(struct p2p_peer *p, uint32_t tag, bool make)
{
	struct p2p_avail *a;

	for (a = p->avail; a != NULL; a = a->next)
		if (a->tag == tag)
			return (&a->n);
	if (!make || (a = calloc(1, sizeof(*a))) == NULL)
		return (NULL);
	a->tag = tag;
	a->next = p->avail;
	p->avail = a;
	return (&a->n);
}

/* Adds d to peer p's unclaimed messages with tag; false when out of
 * memory. */
static bool
p2p_avail_add(struct p2p_peer *p, uint32_t tag, int64_t d)
{
	int64_t *n = p2p_avail(p, tag, true);

	if (n == NULL)
		return (false);
	*n += d;
	return (true);
}

/* A send meets the receive's CTS (size and dtype of the receive): DATA,
 * or NACK and both fail. */
static void
p2p_send_go(struct host_p2p *s, struct p2p_peer *p, struct cohort__p2p *r,
    uint64_t cbytes, int cdtype, bool announced, struct p2p_done *d)
{
	char what[160];
	int fl = announced ? P2P_F_ANNOUNCED : 0;

	if (cbytes != r->bytes || cdtype != (int)r->dtype) {
		p2p_what(s, r, what, sizeof(what));
		if (!p2p_queue(
		        p, P2P_NACK, fl, r->tag, r->dtype, r->bytes, NULL)) {
			p2p_fail(
			    d, r, COHORT_ENOMEM, "%s: out of memory", what);
			return;
		}
		p2p_fail(d, r, COHORT_EMISMATCH,
		    "%s: rank %d's matching recv takes %" PRIu64
		    " bytes of %s, this send has %zu bytes of %s",
		    what, (int)p->job_rank, cbytes,
		    cohort_dtype_name((cohort_dtype)cdtype), r->bytes,
		    cohort_dtype_name(r->dtype));
		return;
	}
	if (!p2p_queue(p, P2P_DATA, fl, r->tag, r->dtype, r->bytes, r)) {
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, COHORT_ENOMEM, "%s: out of memory", what);
	}
}

static void
p2p_post_send(struct host_p2p *s, struct cohort__p2p *r, struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[r->peer];
	struct p2p_cts **cp, *c = NULL;
	char what[160];

	for (cp = &p->cts; *cp != NULL; cp = &(*cp)->next)
		if ((*cp)->tag == r->tag) {
			c = *cp;
			*cp = c->next;
			break;
		}
	if (c != NULL) {
		p2p_send_go(s, p, r, c->bytes, c->dtype, false, d);
		free(c);
		return;
	}
	if (!p2p_queue(p, P2P_RTS, 0, r->tag, r->dtype, r->bytes, NULL)) {
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, COHORT_ENOMEM, "%s: out of memory", what);
		return;
	}
	p2p_append(&p->sends, r);
}

/* Commits receive r to peer q: its CTS goes out. */
static void
p2p_commit(
    struct host_p2p *s, struct cohort__p2p *r, int q, struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[q];
	char what[160];

	r->source = q;
	if (p->lost != COHORT_OK) {
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, p->lost, "%s: %s", what, p->lost_err);
		return;
	}
	if (!p2p_avail_add(p, r->tag, -1)
	    || !p2p_queue(p, P2P_CTS, 0, r->tag, r->dtype, r->bytes, NULL)) {
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, COHORT_ENOMEM, "%s: out of memory", what);
		return;
	}
	if (p->want < P2P_WANT_NAMED)
		p->want = P2P_WANT_NAMED;
	p2p_append(&p->recvs, r);
}

/* The rank with an unclaimed message with tag (lowest first), -1: none. */
static int
p2p_any_source(struct host_p2p *s, uint32_t tag)
{
	for (int q = 0; q < s->size; q++) {
		int64_t *n;

		if (q == s->rank || s->peers[q].lost != COHORT_OK)
			continue;
		if ((n = p2p_avail(&s->peers[q], tag, false)) != NULL
		    && *n > 0)
			return (q);
	}
	return (-1);
}

/* Whether every peer is lost (a receive from any rank cannot complete). */
static bool
p2p_all_lost(const struct host_p2p *s)
{
	for (int q = 0; q < s->size; q++)
		if (q != s->rank && s->peers[q].lost == COHORT_OK)
			return (false);
	return (true);
}

/* Commits what it can of the uncommitted receives, in post order. */
static void
p2p_scan(struct host_p2p *s, struct p2p_done *d)
{
	struct cohort__p2p **rp = &s->rq;

	while (*rp != NULL) {
		struct cohort__p2p *r = *rp, *e;
		bool blocked = false;
		int q = r->peer;

		for (e = s->rq; e != r; e = e->next)
			if (e->peer == COHORT__P2P_ANY && e->tag == r->tag) {
				blocked = true;
				break;
			}
		if (!blocked && q == COHORT__P2P_ANY) {
			if ((q = p2p_any_source(s, r->tag)) < 0
			    && p2p_all_lost(s)) {
				*rp = r->next;
				p2p_fail(d, r, COHORT_EPEERLOST,
				    "recv #%" PRIu64
				    " from any rank (tag %" PRIu32
				    "): every other rank's connection is lost",
				    r->seq, r->tag);
				continue;
			}
		}
		if (blocked || q < 0) {
			rp = &r->next;
			continue;
		}
		*rp = r->next;
		r->next = NULL;
		p2p_commit(s, r, q, d);
	}
}

/* ------------------------------------------------------------------------ */
/* Failing transfers                                                        */
/* ------------------------------------------------------------------------ */

static void
p2p_free_frames(struct p2p_peer *p)
{
	struct p2p_frame *f, *nf;
	struct p2p_cts *c, *nc;
	struct p2p_avail *a, *na;

	for (f = p->oq; f != NULL; f = nf) {
		nf = f->next;
		free(f);
	}
	p->oq = p->oq_tail = NULL;
	for (c = p->cts; c != NULL; c = nc) {
		nc = c->next;
		free(c);
	}
	p->cts = NULL;
	for (a = p->avail; a != NULL; a = na) {
		na = a->next;
		free(a);
	}
	p->avail = NULL;
	p->ih_have = 0;
}

/* Every transfer held for peer q fails: st with "<what>: <why>". */
static void
p2p_fail_peer(struct host_p2p *s, int q, cohort_status st, const char *why,
    struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[q];
	struct cohort__p2p *r, *next;
	struct p2p_frame *f;
	char what[160];

	for (f = p->oq; f != NULL; f = f->next)
		if ((r = f->req) != NULL) {
			f->req = NULL;
			p2p_what(s, r, what, sizeof(what));
			p2p_fail(d, r, st, "%s: %s", what, why);
		}
	if ((r = p->rd) != NULL) {
		p->rd = NULL;
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, st, "%s: %s (%zu of %zu bytes received)", what,
		    why, p->rd_done, r->bytes);
	}
	for (struct cohort__p2p **l = &p->sends; l != NULL;
	     l = l == &p->sends ? &p->recvs : NULL) {
		for (r = *l; r != NULL; r = next) {
			next = r->next;
			p2p_what(s, r, what, sizeof(what));
			p2p_fail(d, r, st, "%s: %s", what, why);
		}
		*l = NULL;
	}
	p2p_free_frames(p);
}

static void
p2p_close_fd(struct p2p_peer *p)
{
	if (p->fd >= 0) {
		(void)shutdown(p->fd, SHUT_RDWR);
		close(p->fd);
		p->fd = -1;
	}
}

/* Peer q's connection is lost (or could not be made): its transfers and
 * the receives from it not yet committed fail, and every later one. */
static void
p2p_lost(struct host_p2p *s, int q, cohort_status st, const char *why,
    struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[q];
	struct cohort__p2p **rp = &s->rq;

	if (p->lost == COHORT_OK) {
		p->lost = st;
		cohort__strlcpy(p->lost_err, why, sizeof(p->lost_err));
		cohort__debug("p2p group %s rank %d: rank %d: %s",
		    s->key_group, s->rank, (int)p->job_rank, why);
	}
	p2p_close_fd(p);
	p2p_fail_peer(s, q, st, why, d);
	while (*rp != NULL) {
		struct cohort__p2p *r = *rp;
		char what[160];

		if (r->peer != q) {
			rp = &r->next;
			continue;
		}
		*rp = r->next;
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, st, "%s: %s", what, why);
	}
	p2p_scan(s, d); /* receives from any rank, if all are lost */
}

/* Everything held fails: st for all (the abort, close) with text. */
static void
p2p_fail_all(
    struct host_p2p *s, cohort_status st, const char *why, struct p2p_done *d)
{
	struct cohort__p2p *r, *next;
	char what[160];

	for (int q = 0; q < s->size; q++) {
		if (q == s->rank)
			continue;
		p2p_fail_peer(s, q, st, why, d);
		p2p_close_fd(&s->peers[q]);
	}
	for (r = s->rq; r != NULL; r = next) {
		next = r->next;
		p2p_what(s, r, what, sizeof(what));
		p2p_fail(d, r, st, "%s: %s", what, why);
	}
	s->rq = NULL;
}

/* ------------------------------------------------------------------------ */
/* I/O on a connection                                                      */
/* ------------------------------------------------------------------------ */

/* Writes what the socket takes of q's queue. */
static void
p2p_flush(struct host_p2p *s, int q, struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[q];
	char why[200];

	while (p->fd >= 0 && p->oq != NULL) {
		struct p2p_frame *f = p->oq;
		struct iovec iov[2];
		struct msghdr mh;
		int n = 0;
		ssize_t k;

		if (f->sent < P2P_HDR) {
			iov[n].iov_base = f->hdr + f->sent;
			iov[n++].iov_len = P2P_HDR - f->sent;
		}
		if (f->plen > 0) {
			size_t off = f->sent > P2P_HDR ? f->sent - P2P_HDR : 0;
			size_t len = f->plen - off;

			if (s->send_max > 0 && len > s->send_max) {
				len = s->send_max;
			} else if (s->send_max == 0 && len > HOST_SEND_SMALL) {
				if (p->seg == 0 || p->seg_fd != p->fd) {
					p->seg = host_send_len(
					    p->fd, s->send_max, s->io_max);
					p->seg_fd = p->fd;
				}
				if (len > p->seg)
					len = p->seg;
			}
			iov[n].iov_base = (uint8_t *)f->payload + off;
			iov[n++].iov_len = len;
		}
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)n;
		k = sendmsg(p->fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL);
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (k < 0 && errno == EINTR)
			continue;
		if (k < 0) {
			snprintf(why, sizeof(why),
			    "rank %d closed the connection: %s",
			    (int)p->job_rank, strerror(errno));
			p2p_lost(s, q, COHORT_EPEERLOST, why, d);
			return;
		}
		f->sent += (size_t)k;
		if (f->sent < P2P_HDR + f->plen)
			continue;
		p->oq = f->next;
		if (p->oq == NULL)
			p->oq_tail = NULL;
		if (f->req != NULL)
			p2p_complete(d, f->req, COHORT_OK);
		free(f);
	}
}

/* A protocol violation by peer q: its connection is dropped. */
static void
p2p_bad(struct host_p2p *s, int q, const char *what, struct p2p_done *d)
{
	char why[200];

	snprintf(why, sizeof(why),
	    "rank %d broke the point-to-point protocol (%s)",
	    (int)s->peers[q].job_rank, what);
	cohort__warn("p2p group %s rank %d: %s", s->key_group, s->rank, why);
	p2p_lost(s, q, COHORT_EPROTO, why, d);
}

/* A complete frame header from peer q. */
static void
p2p_frame_in(struct host_p2p *s, int q, struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[q];
	const uint8_t *h = p->ih;
	int type = h[2], flags = h[3], dt = h[8];
	uint32_t tag = (uint32_t)host_get_be(h + 4, 4);
	uint64_t bytes = host_get_be(h + 16, 8);
	struct cohort__p2p *r;
	char what[160];

	p->ih_have = 0;
	if (h[0] != 'C' || h[1] != 'P' || dt >= COHORT_DTYPE_COUNT) {
		p2p_bad(s, q, "a malformed frame", d);
		return;
	}
	switch (type) {
	case P2P_RTS:
		if (!p2p_avail_add(p, tag, 1)) {
			p2p_lost(s, q, COHORT_ENOMEM, "out of memory", d);
			return;
		}
		p2p_scan(s, d);
		return;
	case P2P_CTS:
		if ((r = p2p_take(&p->sends, tag)) != NULL) {
			p2p_send_go(s, p, r, bytes, dt, true, d);
			return;
		}
		{
			struct p2p_cts *c = calloc(1, sizeof(*c)), **cp;

			if (c == NULL) {
				p2p_lost(
				    s, q, COHORT_ENOMEM, "out of memory", d);
				return;
			}
			c->tag = tag;
			c->dtype = (uint8_t)dt;
			c->bytes = bytes;
			for (cp = &p->cts; *cp != NULL; cp = &(*cp)->next)
				;
			*cp = c;
		}
		return;
	case P2P_DATA:
	case P2P_NACK:
		if ((flags & P2P_F_ANNOUNCED) == 0
		    && !p2p_avail_add(p, tag, 1)) {
			p2p_lost(s, q, COHORT_ENOMEM, "out of memory", d);
			return;
		}
		if ((r = p2p_take(&p->recvs, tag)) == NULL) {
			p2p_bad(s, q, "a message no receive asked for", d);
			return;
		}
		p2p_what(s, r, what, sizeof(what));
		if (type == P2P_NACK) {
			p2p_fail(d, r, COHORT_EMISMATCH,
			    "%s: rank %d sends %" PRIu64 " bytes of %s, this "
			    "recv takes %zu bytes of %s",
			    what, (int)p->job_rank, bytes,
			    cohort_dtype_name((cohort_dtype)dt), r->bytes,
			    cohort_dtype_name(r->dtype));
			return;
		}
		if (bytes != r->bytes || dt != (int)r->dtype) {
			p2p_fail(d, r, COHORT_EPROTO,
			    "%s: rank %d sent %" PRIu64 " bytes against a "
			    "receive of %zu",
			    what, (int)p->job_rank, bytes, r->bytes);
			p2p_bad(s, q, "a message of the wrong size", d);
			return;
		}
		if (bytes == 0) {
			p2p_complete(d, r, COHORT_OK);
			return;
		}
		p->rd = r;
		p->rd_done = 0;
		return;
	default:
		p2p_bad(s, q, "an unknown frame type", d);
		return;
	}
}

/* Reads what peer q sent: frame headers, and DATA straight into the
 * receive's buffer. */
static void
p2p_read(struct host_p2p *s, int q, struct p2p_done *d)
{
	struct p2p_peer *p = &s->peers[q];
	char why[200];

	while (p->fd >= 0) {
		struct cohort__p2p *r = p->rd;
		uint8_t *dst;
		size_t want;
		ssize_t k;

		if (r != NULL) {
			dst = (uint8_t *)r->buf + p->rd_done;
			want = r->bytes - p->rd_done;
			if (want > s->io_max)
				want = s->io_max;
		} else {
			dst = p->ih + p->ih_have;
			want = P2P_HDR - p->ih_have;
		}
		k = recv(p->fd, dst, want, MSG_DONTWAIT);
		if (k < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return;
		if (k < 0 && errno == EINTR)
			continue;
		if (k <= 0) {
			snprintf(why, sizeof(why),
			    "rank %d closed the connection%s%s",
			    (int)p->job_rank, k < 0 ? ": " : "",
			    k < 0 ? strerror(errno) : "");
			p2p_lost(s, q, COHORT_EPEERLOST, why, d);
			return;
		}
		if (r != NULL) {
			p->rd_done += (size_t)k;
			if (p->rd_done == r->bytes) {
				p->rd = NULL;
				p2p_complete(d, r, COHORT_OK);
			}
			continue;
		}
		p->ih_have += (size_t)k;
		if (p->ih_have == P2P_HDR)
			p2p_frame_in(s, q, d);
	}
}

/* ------------------------------------------------------------------------ */
/* Connections: the acceptor (in the engine) and the dialers (threads)      */
/* ------------------------------------------------------------------------ */

static void
p2p_refuse(struct cohort__tcp_pend *pc, uint32_t reason)
{
	uint8_t msg[COHORT__TCP_REFUSAL_LEN];

	cohort__tcp_hs_put_refusal(msg, reason);
	(void)send(pc->fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
	close(pc->fd);
	pc->fd = -1;
}

static void
p2p_accept(struct host_p2p *s)
{
	for (int i = 0; i < P2P_MAX_PENDING; i++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		uint8_t src[16], sh[COHORT__TCP_SHELLO_LEN];
		struct cohort__tcp_pend *pc;
		bool evict;
		char err[128];
		int fd = accept4(s->lfd, (struct sockaddr *)&ss, &sl,
		    SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			return;
		memset(src, 0, sizeof(src));
		if (ss.ss_family == AF_INET)
			memcpy(src, &((struct sockaddr_in *)&ss)->sin_addr, 4);
		else if (ss.ss_family == AF_INET6)
			memcpy(
			    src, &((struct sockaddr_in6 *)&ss)->sin6_addr, 16);
		pc = &s->pend[cohort__tcp_pend_admit(
		    s->pend, P2P_MAX_PENDING, src, P2P_PER_SOURCE, &evict)];
		if (evict)
			p2p_refuse(pc, COHORT__TCP_HS_BUSY);
		memset(pc, 0, sizeof(*pc));
		pc->fd = fd;
		memcpy(pc->src, src, 16);
		pc->since = cohort__now_ms();
		pc->deadline = pc->since + s->hs_ms;
		if (host_net_random(pc->nonce, 16, err, sizeof(err))
		    != COHORT_OK) {
			close(fd);
			pc->fd = -1;
			continue;
		}
		cohort__tcp_hs_put_shello(sh, (uint32_t)s->rank, pc->nonce);
		if (send(fd, sh, sizeof(sh), MSG_DONTWAIT | MSG_NOSIGNAL)
		    != (ssize_t)sizeof(sh)) {
			close(fd);
			pc->fd = -1;
		}
	}
}

static bool
p2p_connected(void *ctx, uint32_t rank)
{
	const struct host_p2p *s = ctx;

	return (s->peers[rank].fd >= 0);
}

/* A pending handshake: its hello judged when complete; the connection
 * becomes the proven lower rank's. */
static void
p2p_pend_step(
    struct host_p2p *s, struct cohort__tcp_pend *pc, struct p2p_done *d)
{
	uint32_t reason, rc = 0;
	int v = host_net_pend_step(
	    pc, &s->keys, (uint32_t)s->rank, p2p_connected, s, &rc, &reason);

	if (v == -2) {
		if (reason != COHORT__TCP_HS_TIMEOUT)
			cohort__warn("p2p group %s rank %d: refused a "
			             "connection: %s",
			    s->key_group, s->rank,
			    cohort__tcp_hs_reason_text(reason));
		p2p_refuse(pc, reason);
	}
	if (v != 1)
		return;
	s->peers[rc].fd = pc->fd;
	pc->fd = -1;
	/* A peer that closed its state and opened a new one connects
	 * again: what failed with the old connection stays failed. */
	s->peers[rc].lost = COHORT_OK;
	s->peers[rc].lost_err[0] = '\0';
	p2p_flush(s, (int)rc, d);
}

/* The latest deadline of the transfers that need peer q's connection
 * (COHORT__TIME_NEVER if one has none); 0: none needs it. */
static cohort__time
p2p_need_until(const struct host_p2p *s, int q)
{
	const struct p2p_peer *p = &s->peers[q];
	cohort__time until = 0;
	const struct cohort__p2p *lists[3] = { p->sends, p->recvs, s->rq };

	for (int i = 0; i < 3; i++)
		for (const struct cohort__p2p *r = lists[i]; r != NULL;
		     r = r->next) {
			if (i == 2 && r->peer != COHORT__P2P_ANY
			    && r->peer != q)
				continue;
			if (r->deadline == COHORT__TIME_NEVER
			    || r->deadline > until)
				until = r->deadline;
		}
	for (const struct p2p_frame *f = p->oq; f != NULL; f = f->next)
		if (f->req != NULL && f->req->deadline > until)
			until = f->req->deadline;
	if (p->oq != NULL && until == 0)
		until = cohort__now_ms() + P2P_CONNECT_MS; /* a CTS, RTS */
	return (until);
}

struct p2p_dialer {
	struct host_p2p *s;
	int q;
};

/* Bytes of a handshake message from fd into buf (up to *need as the
 * parser asks), before until. */
static cohort_status
p2p_dial_read(struct host_p2p *s, int fd, uint8_t *buf, size_t cap,
    size_t *have, size_t need, int32_t jr, cohort__time until, char *err,
    size_t errlen)
{
	if (need > cap)
		need = cap;
	return (host_io(&s->stop, fd, buf, need, have, false,
	    "point-to-point handshake", jr, err, errlen, until));
}

/* One attempt: connect to addr and run the handshake. COHORT_OK and
 * *fdp; *retry for a drop worth another attempt (refused, evicted). */
static cohort_status
p2p_dial_once(struct host_p2p *s, int q, const struct sockaddr_storage *ss,
    socklen_t sl, cohort__time until, int *fdp, bool *retry, char *err,
    size_t errlen)
{
	int32_t jr = s->peers[q].job_rank;
	uint8_t in[COHORT__TCP_ACCEPT_LEN], na[16], nc[16];
	uint8_t ch[COHORT__TCP_CHELLO_LEN];
	size_t have = 0, need = 4, sent = 0;
	uint32_t reason = 0;
	cohort_status rv;
	int fd, p, soerr = 0;

	*retry = false;
	fd = socket(
	    ss->ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return (COHORT_ESYSTEM);
	}
	host_net_sockopts(fd, true);
	if (connect(fd, (const struct sockaddr *)ss, sl) != 0
	    && errno != EINPROGRESS) {
		soerr = errno;
	} else {
		for (;;) {
			struct pollfd pfd = { fd, POLLOUT, 0 };
			socklen_t el = sizeof(soerr);

			if (p2p_stopped(s)) {
				close(fd);
				snprintf(err, errlen, "aborted");
				return (COHORT_EABORTED);
			}
			if (cohort__expired(until)) {
				soerr = ETIMEDOUT;
				break;
			}
			if (poll(&pfd, 1, P2P_POLL_MS) <= 0)
				continue;
			if (getsockopt(fd, SOL_SOCKET, SO_ERROR, &soerr, &el)
			    != 0)
				soerr = errno;
			break;
		}
	}
	if (soerr != 0) {
		close(fd);
		snprintf(err, errlen, "cannot connect to rank %d: %s", (int)jr,
		    strerror(soerr));
		*retry = soerr == ECONNREFUSED || soerr == ETIMEDOUT
		    || soerr == EHOSTUNREACH || soerr == ENETUNREACH;
		return (COHORT_EPEERLOST);
	}
	/* greeting */
	for (;;) {
		if ((rv = p2p_dial_read(s, fd, in, sizeof(in), &have, need, jr,
		         until, err, errlen))
		    != COHORT_OK)
			goto out_close;
		p = cohort__tcp_hs_parse_shello(
		    in, have, (uint32_t)q, na, &need, &reason);
		if (p != 0)
			break;
	}
	if (p < 0)
		goto out_refused;
	if ((rv = host_net_random(nc, 16, err, errlen)) != COHORT_OK)
		goto out_close;
	cohort__tcp_hs_put_chello(
	    ch, &s->keys, na, nc, (uint32_t)s->rank, (uint32_t)q);
	if ((rv = host_io(&s->stop, fd, ch, sizeof(ch), &sent, true,
	         "point-to-point handshake", jr, err, errlen, until))
	    != COHORT_OK)
		goto out_close;
	have = 0;
	need = 4;
	for (;;) {
		if ((rv = p2p_dial_read(s, fd, in, sizeof(in), &have, need, jr,
		         until, err, errlen))
		    != COHORT_OK)
			goto out_close;
		p = cohort__tcp_hs_parse_answer(in, have, &s->keys, na, nc,
		    (uint32_t)s->rank, (uint32_t)q, &need, &reason);
		if (p != 0)
			break;
	}
	if (p < 0)
		goto out_refused;
	*fdp = fd;
	return (COHORT_OK);

out_refused:
	close(fd);
	if (p == -1
	    && (reason == COHORT__TCP_HS_BUSY
	        || reason == COHORT__TCP_HS_TIMEOUT)) {
		*retry = true;
		snprintf(err, errlen, "rank %d's listener dropped us: %s",
		    (int)jr, cohort__tcp_hs_reason_text(reason));
		return (COHORT_EPEERLOST);
	}
	snprintf(err, errlen, "rank %d refused the connection: %s", (int)jr,
	    p == -1 ? cohort__tcp_hs_reason_text(reason)
	            : "a wrong answer (not a cohort peer of this group?)");
	return (reason == COHORT__TCP_HS_OTHER_GROUP
	            || reason == COHORT__TCP_HS_BAD_PROOF
	        ? COHORT_EAUTH
	        : COHORT_EPROTO);

out_close:
	close(fd);
	if (rv == COHORT_EPEERLOST)
		*retry = true; /* closed on us mid-handshake: evicted? */
	return (rv);
}

/* A dial thread: peer q's address from the KV (waiting while a transfer
 * needs it), then connect and handshake, retried within the connect
 * window; the connection is handed to the engine. */
/* Peer q's dial is over, whatever its outcome (under mu). */
static void
p2p_dial_ended(struct host_p2p *s, int q)
{
	s->peers[q].dialing = false;
	if (s->peers[q].dial_any)
		s->any_dials--;
	s->peers[q].dial_any = false;
}

static void *
p2p_dial_main(void *arg)
{
	struct p2p_dialer *dl = arg;
	struct host_p2p *s = dl->s;
	int q = dl->q, fd = -1;
	int32_t jr = s->peers[q].job_rank;
	char key[COHORT__MAX_KEY], err[256] = "";
	struct sockaddr_storage ss;
	socklen_t sl = 0;
	struct p2p_done d = { NULL, NULL };
	cohort_status rv = COHORT_OK;
	cohort__time window = 0;
	bool retry;
	void *val = NULL;
	size_t len = 0;

	free(dl);
	snprintf(key, sizeof(key), "p2p/%s/%" PRIu64 "/addr/%d", s->key_group,
	    s->generation, q);
	for (;;) {
		cohort__time until, slice;

		pthread_mutex_lock(&s->mu);
		until = p2p_need_until(s, q);
		pthread_mutex_unlock(&s->mu);
		if (p2p_stopped(s) || until == 0)
			goto out_quiet;
		slice = cohort__now_ms() + P2P_SLICE_MS;
		if (until != COHORT__TIME_NEVER && until < slice)
			slice = until;
		rv = s->store.get(s->store.ctx, key, &val, &len, slice);
		if (rv == COHORT_OK)
			break;
		if (rv == COHORT_ETIMEDOUT && !cohort__expired(until))
			continue;
		if (rv == COHORT_ETIMEDOUT)
			goto out_quiet; /* the transfers time out themselves */
		snprintf(err, sizeof(err),
		    "cannot read rank %d's address (store key %.160s): %s",
		    (int)jr, key, cohort_status_name(rv));
		goto out_failed;
	}
	rv = host_net_parse_addr(val, len, &ss, &sl);
	free(val);
	if (rv != COHORT_OK) {
		snprintf(err, sizeof(err), "rank %d published a bad address",
		    (int)jr);
		goto out_failed;
	}
	window = cohort__now_ms() + s->connect_ms;
	for (;;) {
		cohort__time until;

		pthread_mutex_lock(&s->mu);
		until = p2p_need_until(s, q);
		pthread_mutex_unlock(&s->mu);
		if (p2p_stopped(s) || until == 0)
			goto out_quiet;
		if (until > window || until == COHORT__TIME_NEVER)
			until = window;
		rv = p2p_dial_once(
		    s, q, &ss, sl, until, &fd, &retry, err, sizeof(err));
		if (rv == COHORT_OK)
			break;
		if (rv == COHORT_EABORTED)
			goto out_quiet;
		if (!retry || cohort__expired(window))
			goto out_failed;
		{
			struct timespec ts = { 0, P2P_RETRY_MS * 1000000L };

			nanosleep(&ts, NULL);
		}
	}
	pthread_mutex_lock(&s->mu);
	p2p_dial_ended(s, q);
	if (p2p_stopped(s)) {
		close(fd);
	} else {
		s->peers[q].fd = fd;
		s->peers[q].lost = COHORT_OK;
		p2p_flush(s, q, &d);
	}
	pthread_mutex_unlock(&s->mu);
	p2p_wake(s);
	p2p_finish(&d);
	return (NULL);

out_failed:
	pthread_mutex_lock(&s->mu);
	p2p_dial_ended(s, q);
	s->peers[q].want = P2P_WANT_NONE;
	if (!p2p_stopped(s))
		p2p_lost(s, q,
		    rv == COHORT_EAUTH || rv == COHORT_EPROTO
		        ? rv
		        : COHORT_EPEERLOST,
		    err, &d);
	pthread_mutex_unlock(&s->mu);
	p2p_wake(s); /* what its failure queued for others */
	p2p_finish(&d);
	return (NULL);

out_quiet:
	pthread_mutex_lock(&s->mu);
	p2p_dial_ended(s, q);
	s->peers[q].want = P2P_WANT_NONE;
	pthread_mutex_unlock(&s->mu);
	p2p_wake(s); /* it may need another dial now */
	return (NULL);
}

/* Starts the dials that the held transfers need (engine, under mu). */
static void
p2p_dials(struct host_p2p *s)
{
	for (int q = s->rank + 1; q < s->size; q++) {
		struct p2p_peer *p = &s->peers[q];
		struct p2p_dialer *dl;

		if (p->want == P2P_WANT_NONE || p->fd >= 0 || p->dialing
		    || p->lost != COHORT_OK)
			continue;
		if (p->want == P2P_WANT_ANY && s->any_dials >= P2P_ANY_DIALS)
			continue;
		if (p->dial_joinable) {
			pthread_join(p->dial_th, NULL);
			p->dial_joinable = false;
		}
		if ((dl = malloc(sizeof(*dl))) == NULL)
			return;
		dl->s = s;
		dl->q = q;
		if (pthread_create(&p->dial_th, NULL, p2p_dial_main, dl)
		    != 0) {
			free(dl);
			return;
		}
		p->dialing = true;
		p->dial_joinable = true;
		p->dial_any = p->want == P2P_WANT_ANY;
		if (p->dial_any)
			s->any_dials++;
	}
}

/* ------------------------------------------------------------------------ */
/* The engine                                                               */
/* ------------------------------------------------------------------------ */

/* The first held transfer past its deadline, NULL: none; *next gets the
 * earliest deadline of the others. */
static struct cohort__p2p *
p2p_expired(struct host_p2p *s, cohort__time now, cohort__time *next,
    const char **where)
{
	struct cohort__p2p *hit = NULL;

	*next = COHORT__TIME_NEVER;
#define P2P_CHECK(r, w)                                                       \
	do {                                                                  \
		if ((r)->deadline != COHORT__TIME_NEVER                       \
		    && (r)->deadline <= now && hit == NULL) {                 \
			hit = (r);                                            \
			*where = (w);                                         \
		} else if ((r)->deadline != COHORT__TIME_NEVER                \
		    && (r)->deadline < *next) {                               \
			*next = (r)->deadline;                                \
		}                                                             \
	} while (0)
	for (struct cohort__p2p *r = s->rq; r != NULL; r = r->next)
		P2P_CHECK(r, "rq");
	for (int q = 0; q < s->size; q++) {
		struct p2p_peer *p = &s->peers[q];

		if (q == s->rank)
			continue;
		for (struct cohort__p2p *r = p->sends; r != NULL; r = r->next)
			P2P_CHECK(r, "send");
		for (struct cohort__p2p *r = p->recvs; r != NULL; r = r->next)
			P2P_CHECK(r, "recv");
		if (p->rd != NULL)
			P2P_CHECK(p->rd, "rd");
		for (struct p2p_frame *f = p->oq; f != NULL; f = f->next)
			if (f->req != NULL)
				P2P_CHECK(f->req, "data");
	}
#undef P2P_CHECK
	return (hit);
}

/* A transfer reached its deadline: it fails saying what it waited for,
 * and the state breaks (its connections may hold half a frame). */
static void
p2p_timeout(struct host_p2p *s, struct cohort__p2p *r, const char *where,
    struct p2p_done *d)
{
	char what[160], why[512];
	struct p2p_peer *p = r->peer >= 0 ? &s->peers[r->peer] : NULL;

	p2p_what(s, r, what, sizeof(what));
	if (strcmp(where, "rq") == 0)
		snprintf(why, sizeof(why),
		    "%s timed out: no rank sent a message with tag %" PRIu32,
		    what, r->tag);
	else if (p != NULL && p->fd < 0)
		snprintf(why, sizeof(why),
		    "%s timed out: no connection with rank %d was made (did "
		    "it post the matching %s?)",
		    what, (int)p->job_rank,
		    r->kind == COHORT__OP_SEND ? "recv" : "send");
	else if (strcmp(where, "send") == 0)
		snprintf(why, sizeof(why),
		    "%s timed out: rank %d never posted the matching recv",
		    what, (int)p->job_rank);
	else if (strcmp(where, "recv") == 0)
		snprintf(why, sizeof(why),
		    "%s timed out: rank %d never sent the message", what,
		    (int)p->job_rank);
	else if (strcmp(where, "rd") == 0)
		snprintf(why, sizeof(why),
		    "%s timed out while receiving (%zu bytes arrived)", what,
		    p->rd_done);
	else
		snprintf(why, sizeof(why),
		    "%s timed out while sending (rank %d does not read)", what,
		    (int)p->job_rank);
	/* Take it out of wherever it is, then fail the rest. */
	s->broken = COHORT_ETIMEDOUT;
	cohort__strlcpy(s->broken_err, why, sizeof(s->broken_err));
	cohort__strlcpy(r->err, why, sizeof(r->err));
	r->st = COHORT_ETIMEDOUT;
	if (strcmp(where, "rq") == 0) {
		struct cohort__p2p **rp = &s->rq;

		while (*rp != r)
			rp = &(*rp)->next;
		*rp = r->next;
	} else if (strcmp(where, "send") == 0 || strcmp(where, "recv") == 0) {
		struct cohort__p2p **rp
		    = strcmp(where, "send") == 0 ? &p->sends : &p->recvs;

		while (*rp != r)
			rp = &(*rp)->next;
		*rp = r->next;
	} else if (strcmp(where, "rd") == 0) {
		p->rd = NULL;
	} else {
		for (struct p2p_frame *f = p->oq; f != NULL; f = f->next)
			if (f->req == r)
				f->req = NULL;
	}
	p2p_complete(d, r, COHORT_ETIMEDOUT);
	snprintf(why, sizeof(why), "aborted: %.480s", s->broken_err);
	p2p_fail_all(s, COHORT_EABORTED, why, d);
}

static void *
p2p_engine(void *arg)
{
	struct host_p2p *s = arg;
	struct p2p_done d = { NULL, NULL };

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct pollfd *fds = s->pfds;
		int nfds = 0, npend, ms;
		cohort__time now = cohort__now_ms(), next;
		const char *where = NULL;
		struct cohort__p2p *r;
		uint64_t junk;

		if (p2p_stopped(s)) {
			p2p_fail_all(s, COHORT_EABORTED,
			    s->closing ? "the group's point-to-point state "
			                 "closed"
			               : "aborted",
			    &d);
			if (s->closing)
				break;
		} else if (s->broken == COHORT_OK) {
			while (
			    (r = p2p_expired(s, now, &next, &where)) != NULL)
				p2p_timeout(s, r, where, &d);
			p2p_dials(s);
		}
		if (s->broken != COHORT_OK || p2p_stopped(s))
			next = COHORT__TIME_NEVER;
		else
			(void)p2p_expired(s, now, &next, &where);
		ms = P2P_POLL_MS;
		if (next != COHORT__TIME_NEVER && next - now < ms)
			ms = next - now < 1 ? 1 : (int)(next - now);

		fds[nfds].fd = s->evfd;
		fds[nfds].events = POLLIN;
		fds[nfds++].revents = 0;
		fds[nfds].fd = s->lfd;
		fds[nfds].events = POLLIN;
		fds[nfds++].revents = 0;
		for (int i = 0; i < P2P_MAX_PENDING; i++) {
			s->pfd_peer[nfds] = i;
			fds[nfds].fd = s->pend[i].fd;
			fds[nfds].events = POLLIN;
			fds[nfds++].revents = 0;
		}
		npend = nfds;
		for (int q = 0; q < s->size; q++) {
			struct p2p_peer *p = &s->peers[q];

			if (p->fd < 0)
				continue;
			s->pfd_peer[nfds] = q;
			fds[nfds].fd = p->fd;
			fds[nfds].events
			    = POLLIN | (p->oq != NULL ? POLLOUT : 0);
			fds[nfds++].revents = 0;
		}
		pthread_mutex_unlock(&s->mu);
		p2p_finish(&d);
		(void)poll(fds, (nfds_t)nfds, ms);
		pthread_mutex_lock(&s->mu);

		if (fds[0].revents != 0)
			while (read(s->evfd, &junk, sizeof(junk)) > 0)
				;
		if (p2p_stopped(s))
			continue;
		if (fds[1].revents != 0)
			p2p_accept(s);
		for (int i = 2; i < npend; i++) {
			struct cohort__tcp_pend *pc = &s->pend[s->pfd_peer[i]];

			if (pc->fd >= 0 && pc->fd == fds[i].fd
			    && (fds[i].revents != 0
			        || cohort__now_ms() > pc->deadline))
				p2p_pend_step(s, pc, &d);
		}
		for (int i = npend; i < nfds; i++) {
			int q = s->pfd_peer[i];

			if (s->peers[q].fd != fds[i].fd)
				continue; /* lost and replaced meanwhile */
			if ((fds[i].revents & (POLLIN | POLLHUP | POLLERR))
			    != 0)
				p2p_read(s, q, &d);
			if (s->peers[q].oq != NULL)
				p2p_flush(s, q, &d);
		}
	}
	pthread_mutex_unlock(&s->mu);
	p2p_finish(&d);
	return (NULL);
}

/* ------------------------------------------------------------------------ */
/* The operations                                                           */
/* ------------------------------------------------------------------------ */

static void
p2p_free(struct host_p2p *s)
{
	if (s->peers != NULL)
		for (int q = 0; q < s->size; q++) {
			p2p_free_frames(&s->peers[q]);
			p2p_close_fd(&s->peers[q]);
		}
	for (int i = 0; i < P2P_MAX_PENDING; i++)
		if (s->pend[i].fd >= 0)
			close(s->pend[i].fd);
	if (s->lfd >= 0)
		close(s->lfd);
	if (s->evfd >= 0)
		close(s->evfd);
	pthread_mutex_destroy(&s->mu);
	free(s->peers);
	free(s->pfds);
	free(s->pfd_peer);
	free(s);
}

cohort_status
host_p2p_open(const struct cohort__group_desc *desc, void *state, void **out,
    char *err, size_t errlen, cohort__time deadline)
{
	struct host_p2p *s;
	char key[COHORT__MAX_KEY];
	size_t nfd;
	cohort_status rv;

	(void)state;
	if (desc->size < 1 || desc->rank < 0 || desc->rank >= desc->size) {
		snprintf(
		    err, errlen, "bad rank %d of %d", desc->rank, desc->size);
		return (COHORT_EINVAL);
	}
	if ((s = calloc(1, sizeof(*s))) == NULL)
		goto out_nomem;
	s->lfd = s->evfd = -1;
	for (int i = 0; i < P2P_MAX_PENDING; i++)
		s->pend[i].fd = -1;
	if (pthread_mutex_init(&s->mu, NULL) != 0) {
		free(s);
		goto out_nomem;
	}
	atomic_init(&s->stop, 0);
	s->rank = desc->rank;
	s->size = desc->size;
	s->generation = desc->generation;
	s->store = desc->store;
	s->io_max = host_knob(COHORT__KNOB_TCP_IO_MAX, 256u << 10);
	if (s->io_max < 4096)
		s->io_max = 4096;
	s->send_max
	    = host_knob(COHORT__KNOB_TCP_SEND_MAX, HOST_DEFAULT_SEND_MAX);
	if (s->send_max > s->io_max)
		s->send_max = s->io_max;
	s->hs_ms = (int)cohort__knob_int_or(
	    COHORT__KNOB_TCP_HS_TIMEOUT_MS, P2P_HS_TIMEOUT_MS);
	s->connect_ms = (int)cohort__knob_int_or(
	    COHORT__KNOB_CONNECT_TIMEOUT_MS, P2P_CONNECT_MS);
	nfd = (size_t)s->size + P2P_MAX_PENDING + 2;
	if ((s->peers = calloc((size_t)s->size, sizeof(*s->peers))) == NULL
	    || (s->pfds = calloc(nfd, sizeof(*s->pfds))) == NULL
	    || (s->pfd_peer = calloc(nfd, sizeof(int))) == NULL) {
		p2p_free(s);
		goto out_nomem;
	}
	for (int q = 0; q < s->size; q++) {
		s->peers[q].fd = -1;
		s->peers[q].job_rank
		    = desc->global_ranks != NULL ? desc->global_ranks[q] : q;
	}
	if (cohort__strlcpy(s->job, desc->job, sizeof(s->job))
	        >= sizeof(s->job)
	    || cohort__strlcpy(
	           s->key_group, desc->group_id, sizeof(s->key_group))
	        >= sizeof(s->key_group)
	    || desc->secret_len > sizeof(s->secret)
	    || (desc->bind_addr != NULL
	        && cohort__strlcpy(
	               s->bind_addr, desc->bind_addr, sizeof(s->bind_addr))
	            >= sizeof(s->bind_addr))) {
		snprintf(err, errlen,
		    "job, group id, secret or bind address too long");
		p2p_free(s);
		return (COHORT_EINVAL);
	}
	snprintf(s->group_id, sizeof(s->group_id), "%s#p2p", desc->group_id);
	if (desc->secret_len > 0)
		memcpy(s->secret, desc->secret, desc->secret_len);
	s->keys.secret = s->secret;
	s->keys.secret_len = desc->secret_len;
	cohort__tcp_hs_ident(
	    s->job, s->group_id, s->generation, s->keys.ident);
	if ((s->evfd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC)) < 0) {
		snprintf(err, errlen, "eventfd: %s", strerror(errno));
		p2p_free(s);
		return (COHORT_ESYSTEM);
	}
	if ((rv = host_net_listen(
	         s->bind_addr, &s->lfd, s->addr, sizeof(s->addr), err, errlen))
	    != COHORT_OK) {
		p2p_free(s);
		return (rv);
	}
	snprintf(key, sizeof(key), "p2p/%s/%" PRIu64 "/addr/%d", s->key_group,
	    s->generation, s->rank);
	if ((rv = s->store.set(
	         s->store.ctx, key, s->addr, strlen(s->addr), deadline))
	    != COHORT_OK) {
		snprintf(err, errlen,
		    "publishing the point-to-point address (store key %s): %s",
		    key, cohort_status_name(rv));
		p2p_free(s);
		return (rv);
	}
	if (pthread_create(&s->thread, NULL, p2p_engine, s) != 0) {
		snprintf(
		    err, errlen, "cannot start the point-to-point thread");
		p2p_free(s);
		return (COHORT_ESYSTEM);
	}
	s->thread_started = true;
	cohort__debug("p2p group %s: rank %d of %d listening on %s",
	    s->key_group, s->rank, s->size, s->addr);
	*out = s;
	return (COHORT_OK);

out_nomem:
	snprintf(err, errlen, "out of memory");
	return (COHORT_ENOMEM);
}

cohort_status
host_p2p_post(void *arg, struct cohort__p2p *const *reqs, size_t n, char *err,
    size_t errlen)
{
	struct host_p2p *s = arg;
	struct p2p_done d = { NULL, NULL };
	bool wake = false;

	for (size_t i = 0; i < n; i++) {
		const struct cohort__p2p *r = reqs[i];

		if (r->peer == s->rank
		    || ((r->peer < 0 || r->peer >= s->size)
		        && (r->kind != COHORT__OP_RECV
		            || r->peer != COHORT__P2P_ANY))
		    || (r->kind != COHORT__OP_SEND
		        && r->kind != COHORT__OP_RECV)) {
			snprintf(err, errlen,
			    "transfer %zu: bad peer %d or kind", i, r->peer);
			return (COHORT_EINVAL);
		}
		if (r->bytes > 0 && r->buf == NULL) {
			snprintf(
			    err, errlen, "transfer %zu: buffer is NULL", i);
			return (COHORT_EINVAL);
		}
	}
	pthread_mutex_lock(&s->mu);
	if (p2p_stopped(s) || s->broken != COHORT_OK) {
		cohort_status st = cohort__p2p_unusable(
		    s->broken, s->broken_err, err, errlen);

		pthread_mutex_unlock(&s->mu);
		return (st);
	}
	for (size_t i = 0; i < n; i++) {
		struct cohort__p2p *r = reqs[i];
		struct p2p_peer *p = r->peer >= 0 ? &s->peers[r->peer] : NULL;
		char what[160];

		r->st = COHORT_OK;
		r->err[0] = '\0';
		r->next = NULL;
		if (r->kind == COHORT__OP_RECV)
			r->source = -1;
		if (p != NULL && p->lost != COHORT_OK) {
			p2p_what(s, r, what, sizeof(what));
			p2p_fail(&d, r, p->lost, "%s: %s", what, p->lost_err);
			continue;
		}
		if (r->kind == COHORT__OP_SEND) {
			p2p_post_send(s, r, &d);
			if (p->want < P2P_WANT_NAMED)
				p->want = P2P_WANT_NAMED;
		} else {
			p2p_append(&s->rq, r);
			if (r->peer == COHORT__P2P_ANY)
				for (int q = 0; q < s->size; q++)
					if (q != s->rank
					    && s->peers[q].want
					        == P2P_WANT_NONE)
						s->peers[q].want
						    = P2P_WANT_ANY;
		}
	}
	p2p_scan(s, &d);
	/* Write what the sockets take now; the engine needs waking for a
	 * connection to make or output left over. */
	for (int q = 0; q < s->size; q++) {
		struct p2p_peer *p = &s->peers[q];

		if (q == s->rank || p->want == P2P_WANT_NONE)
			continue;
		if (p->fd >= 0)
			p2p_flush(s, q, &d);
		if (p->oq != NULL || (p->fd < 0 && !p->dialing && q > s->rank))
			wake = true;
	}
	pthread_mutex_unlock(&s->mu);
	if (wake)
		p2p_wake(s);
	p2p_finish(&d);
	return (COHORT_OK);
}

void
host_p2p_abort(void *arg)
{
	struct host_p2p *s = arg;

	if (s == NULL)
		return;
	atomic_store_explicit(&s->stop, 1, memory_order_release);
	p2p_wake(s);
}

void
host_p2p_close(void *arg)
{
	struct host_p2p *s = arg;

	if (s == NULL)
		return;
	pthread_mutex_lock(&s->mu);
	s->closing = true;
	atomic_store_explicit(&s->stop, 1, memory_order_release);
	pthread_mutex_unlock(&s->mu);
	p2p_wake(s);
	if (s->thread_started)
		pthread_join(s->thread, NULL);
	/* The dials see stop within a slice of their KV wait or poll. */
	for (int q = 0; q < s->size; q++)
		if (s->peers[q].dial_joinable)
			pthread_join(s->peers[q].dial_th, NULL);
	p2p_free(s);
}
