/*
 * xfer.c - the host backend's transfer engines, over the mesh's TCP
 * connections (host_impl.h): exchange, recursive doubling and stream.
 *
 * Every engine first connects to the peers its plan names (mesh.c: a
 * no-op once they are; a large group's first use of a pattern makes the
 * connections). They run in the calling thread on non-blocking sockets: they
 * try every pending send() and recv() (MSG_DONTWAIT), and only when nothing
 * moved do they sleep in poll() on exactly the sockets that can make progress,
 * for at most XFER_POLL_MS so that the abort flag is seen promptly even if
 * nobody shuts the sockets down. Every loop ends by completion, a peer error,
 * the abort flag or the deadline.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/uio.h>
#include <time.h>

#include "host_impl.h"

#define XFER_POLL_MS 100

/* A send() or recv() to peer p failed with errno e (0: orderly close). */
static cohort_status
xfer_peer_error(struct host_xfer *x, const struct host_op *c, int p, int e,
    bool sending, size_t done, size_t total, char *err, size_t errlen)
{
	cohort_status rv;

	if ((rv = host_mesh_check_abort(x->mesh, c, err, errlen)) != COHORT_OK)
		return (rv);
	if (e == 0)
		snprintf(err, errlen,
		    "rank %d closed the connection during %s #%" PRIu64
		    " (%s %zu of %zu bytes)",
		    (int)x->mesh->links[p].job_rank, c->name, c->seq,
		    sending ? "sent" : "received", done, total);
	else
		snprintf(err, errlen,
		    "connection to rank %d failed during %s #%" PRIu64
		    ": %s (%s %zu of %zu bytes)",
		    (int)x->mesh->links[p].job_rank, c->name, c->seq,
		    strerror(e), sending ? "sent" : "received", done, total);
	return (COHORT_EPEERLOST);
}

static cohort_status
xfer_timeout(struct host_xfer *x, const struct host_op *c, int p, bool sending,
    size_t done, size_t total, char *err, size_t errlen)
{
	snprintf(err, errlen,
	    "timed out during %s #%" PRIu64 " waiting for rank %d (%s %zu of "
	    "%zu bytes)",
	    c->name, c->seq, (int)x->mesh->links[p].job_rank,
	    sending ? "sent" : "received", done, total);
	return (COHORT_ETIMEDOUT);
}

static inline bool
xfer_again(int e)
{
	return (e == EAGAIN || e == EWOULDBLOCK || e == EINTR);
}

/* The most one send() of len bytes to fd carries (host_send_len, kept
 * for the last connection asked about: a ring sends to one peer). */
static size_t
xfer_send_cap(struct host_xfer *x, int fd, size_t len)
{
	if (x->tune->send_max > 0)
		return (len < x->tune->send_max ? len : x->tune->send_max);
	if (len <= HOST_SEND_SMALL)
		return (len);
	if (fd != x->seg_fd) {
		x->seg_len
		    = host_send_len(fd, x->tune->send_max, x->tune->io_max);
		x->seg_fd = fd;
	}
	return (len < x->seg_len ? len : x->seg_len);
}

/* Sleeps in poll() on fds[0..n) (and a child's watched connections, for
 * which fds has room) for at most XFER_POLL_MS or until the deadline; the
 * caller re-checks everything afterwards. */
static cohort_status
xfer_poll(struct host_xfer *x, const struct host_op *c, struct pollfd *fds,
    int n, char *err, size_t errlen, cohort__time deadline)
{
	int ms = XFER_POLL_MS;
	cohort_duration left = cohort__remaining(deadline);
	int k = host_mesh_watch_add(x->mesh, fds, n);

	if (left != COHORT_WAIT_FOREVER && left < ms)
		ms = left;
	if (ms < 1)
		ms = 1;
	(void)poll(fds, (nfds_t)(n + k), ms);
	return (host_mesh_watch_check(x->mesh, c, fds + n, k, err, errlen));
}

/* After poll(): a peer we still have bytes for that hung up (FIN, RST) is
 * lost, even if its socket buffer still has room for our bytes. A peer that
 * finished the operation cannot have hung up before taking all of them. */
static cohort_status
xfer_hangup(struct host_xfer *x, const struct host_op *c,
    const struct pollfd *pfd, int p, size_t done, size_t total, char *err,
    size_t errlen)
{
	int e = 0;
	socklen_t sl = sizeof(e);

	if ((pfd->events & POLLOUT) == 0
	    || (pfd->revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0)
		return (COHORT_OK);
	if ((pfd->revents & POLLERR) != 0)
		(void)getsockopt(pfd->fd, SOL_SOCKET, SO_ERROR, &e, &sl);
	return (xfer_peer_error(x, c, p, e, true, done, total, err, errlen));
}

/* An idle period of an engine: nothing moved since `since` (0: moving). */
struct xfer_idle {
	uint64_t since;
	/* This rank had bytes to send that the socket would not take: the
	 * network (or the peer's reading) was the limit, not a late peer. */
	bool sending;
};

/* Busy-polls for a little while before sleeping: a poll() sleep and its
 * wake-up cost more than a short spin when the peer answers quickly.
 * sending: see struct xfer_idle. */
static inline bool
xfer_spinning(const struct host_xfer *x, struct xfer_idle *idle, bool sending)
{
	uint64_t now = cohort__now_ns();

	if (idle->since == 0) {
		idle->since = now;
		idle->sending = sending;
	}
	if (x->tune->spin_us <= 0 || host_crowded())
		return (false);
	if (now - idle->since >= (uint64_t)x->tune->spin_us * 1000u)
		return (false);
	/* Let a peer sharing this core run (more ranks than cores). */
	if (x->tune->spin_yield)
		sched_yield();
	return (true);
}

/* An idle period ends (progress, completion, failure): if this rank only
 * waited for bytes to arrive, the time was spent waiting for a peer (op
 * stats, backend.h; the time a rank waits for a late peer to enter is
 * the agreement's wait for its header). Time blocked with bytes the
 * socket would not take is transfer time. */
static inline void
xfer_idle_end(const struct host_op *c, struct xfer_idle *idle)
{
	if (idle->since != 0) {
		if (c->stats != NULL && !idle->sending)
			c->stats->wait_ns += cohort__now_ns() - idle->since;
		idle->since = 0;
	}
}

void
host_plan_reset(struct host_xfer *x)
{
	for (int i = 0; i < x->nactive; i++)
		memset(&x->plan[x->active[i]], 0, sizeof(x->plan[0]));
	x->nactive = 0;
}

void
host_plan_set(struct host_xfer *x, int p, const void *sbuf, size_t slen,
    void *rbuf, size_t rlen)
{
	struct host_plan *P = &x->plan[p];

	if (P->sbuf == NULL && P->rbuf == NULL && P->slen == 0 && P->rlen == 0)
		x->active[x->nactive++] = p;
	P->shdr = NULL;
	P->shlen = 0;
	P->sbuf = sbuf;
	P->slen = slen;
	P->sent = 0;
	P->rbuf = rbuf;
	P->hlen = rlen;
	P->pbuf = NULL;
	P->rlen = rlen;
	P->recvd = 0;
	P->frame = NULL;
	P->rcap = 0;
	P->drain = 0;
}

void
host_plan_framed(struct host_xfer *x, int p, const void *shdr, size_t shlen,
    const void *sbuf, size_t slen, void *rbuf, size_t hlen,
    host_frame_fn frame, void *pbuf, size_t rcap)
{
	struct host_plan *P = &x->plan[p];

	host_plan_set(x, p, sbuf, shlen + slen, rbuf, hlen);
	P->shdr = shdr;
	P->shlen = shlen;
	P->frame = frame;
	P->pbuf = pbuf;
	P->rcap = rcap;
}

/* A framed receive's header arrived: size its payload (struct
 * host_plan). */
static cohort_status
xfer_framed(struct host_xfer *x, const struct host_op *c, int p,
    struct host_plan *P, char *err, size_t errlen)
{
	size_t len;
	host_frame_fn frame = P->frame;

	P->frame = NULL;
	if (!frame(P->rbuf, &len)) {
		snprintf(err, errlen,
		    "ranks are out of step in %s #%" PRIu64
		    ": rank %d sent something other than an operation header",
		    c->name, c->seq, (int)x->mesh->links[p].job_rank);
		return (COHORT_EMISMATCH);
	}
	if (len <= P->rcap)
		P->rlen += len;
	else
		P->drain = len;
	return (COHORT_OK);
}

/* Sends up to max more bytes of P's message: its header and body in one
 * call. */
static ssize_t
xfer_send(int fd, const struct host_plan *P, size_t max)
{
	struct iovec iov[2];
	struct msghdr mh;
	size_t off = P->sent;
	int k = 0;

	if (P->shlen == 0)
		return (
		    send(fd, P->sbuf + off, max, MSG_DONTWAIT | MSG_NOSIGNAL));
	if (off < P->shlen) {
		iov[k].iov_base = (void *)(P->shdr + off);
		iov[k].iov_len = P->shlen - off < max ? P->shlen - off : max;
		max -= iov[k].iov_len;
		off = P->shlen;
		k++;
	}
	if (max > 0 && off < P->slen) {
		iov[k].iov_base = (void *)(P->sbuf + (off - P->shlen));
		iov[k].iov_len = max;
		k++;
	}
	memset(&mh, 0, sizeof(mh));
	mh.msg_iov = iov;
	mh.msg_iovlen = (size_t)k;
	return (sendmsg(fd, &mh, MSG_DONTWAIT | MSG_NOSIGNAL));
}

/* Receives more of P's message: the header into rbuf, the payload into
 * pbuf. */
static ssize_t
xfer_recv(int fd, const struct host_plan *P)
{
	if (P->recvd < P->hlen)
		return (recv(
		    fd, P->rbuf + P->recvd, P->hlen - P->recvd, MSG_DONTWAIT));
	return (recv(fd, P->pbuf + (P->recvd - P->hlen), P->rlen - P->recvd,
	    MSG_DONTWAIT));
}

/* Reads and drops up to `drain` bytes of a payload nobody here expected
 * (a disagreeing rank's): n as recv() returns it. */
static ssize_t
xfer_drain(int fd, struct host_plan *P)
{
	uint8_t sink[4096];
	size_t len = P->drain < sizeof(sink) ? P->drain : sizeof(sink);
	ssize_t n = recv(fd, sink, len, MSG_DONTWAIT);

	if (n > 0)
		P->drain -= (size_t)n;
	return (n);
}

/* Connects to every peer the plan names. */
static cohort_status
xfer_connect_plan(struct host_xfer *x, const struct host_op *c, char *err,
    size_t errlen, cohort__time deadline)
{
	int k = 0;

	for (int i = 0; i < x->nactive; i++) {
		int p = x->active[i];

		if (x->mesh->links[p].fd < 0
		    && (x->plan[p].slen > 0 || x->plan[p].rlen > 0))
			x->want[k++] = p;
	}
	if (k == 0)
		return (COHORT_OK);
	return (host_mesh_connect(
	    x->mesh, x->want, k, c->name, err, errlen, deadline));
}

static cohort_status
xfer_exchange(struct host_xfer *x, const struct host_op *c,
    struct xfer_idle *idle, char *err, size_t errlen, cohort__time deadline)
{
	struct host_mesh *m = x->mesh;
	struct pollfd *fds = x->mesh->pfds;
	bool sending;
	cohort_status rv;

	if ((rv = xfer_connect_plan(x, c, err, errlen, deadline)) != COHORT_OK)
		return (rv);
	for (;;) {
		bool pending = false;
		bool progress = false;
		int nfds = 0;
		int first = -1;
		bool first_send = false;

		if ((rv = host_mesh_check_abort(x->mesh, c, err, errlen))
		    != COHORT_OK)
			return (rv);
		for (int i = 0; i < x->nactive; i++) {
			int p = x->active[i];
			struct host_plan *P = &x->plan[p];
			int fd = m->links[p].fd;
			short ev = 0;
			ssize_t n;

			if (P->sent < P->slen) {
				size_t len
				    = xfer_send_cap(x, fd, P->slen - P->sent);

				n = xfer_send(fd, P, len);
				if (n > 0) {
					P->sent += (size_t)n;
					progress = true;
				} else if (n < 0 && !xfer_again(errno)) {
					return (xfer_peer_error(x, c, p, errno,
					    true, P->sent, P->slen, err,
					    errlen));
				}
				if (P->sent < P->slen)
					ev |= POLLOUT | POLLRDHUP;
			}
			if (P->recvd < P->rlen || P->drain > 0) {
				bool dropping = P->drain > 0;

				if (dropping)
					n = xfer_drain(fd, P);
				else
					n = xfer_recv(fd, P);
				if (n > 0) {
					if (!dropping)
						P->recvd += (size_t)n;
					progress = true;
				} else if (n == 0
				    || (n < 0 && !xfer_again(errno))) {
					return (xfer_peer_error(x, c, p,
					    n == 0 ? 0 : errno, false,
					    P->recvd, P->rlen, err, errlen));
				}
				if (P->frame != NULL && P->recvd == P->rlen
				    && (rv = xfer_framed(
				            x, c, p, P, err, errlen))
				        != COHORT_OK)
					return (rv);
				if (P->recvd < P->rlen || P->drain > 0)
					ev |= POLLIN;
			}
			if (ev != 0) {
				pending = true;
				fds[nfds].fd = fd;
				fds[nfds].events = ev;
				fds[nfds].revents = 0;
				x->mesh->pfd_peer[nfds] = p;
				nfds++;
				if (first < 0
				    || ((ev & POLLIN) && first_send)) {
					first = p;
					first_send = !(ev & POLLIN);
				}
			}
		}
		if (!pending)
			return (COHORT_OK);
		if (progress) {
			xfer_idle_end(c, idle);
			continue;
		}
		sending = false;
		for (int i = 0; i < nfds; i++)
			if ((fds[i].events & POLLOUT) != 0)
				sending = true;
		if (xfer_spinning(x, idle, sending))
			continue;
		if (cohort__expired(deadline)) {
			struct host_plan *P = &x->plan[first];

			return (first_send
			        ? xfer_timeout(x, c, first, true, P->sent,
			            P->slen, err, errlen)
			        : xfer_timeout(x, c, first, false, P->recvd,
			            P->rlen, err, errlen));
		}
		if ((rv = xfer_poll(x, c, fds, nfds, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		for (int i = 0; i < nfds; i++) {
			struct host_plan *P = &x->plan[x->mesh->pfd_peer[i]];

			if ((rv = xfer_hangup(x, c, &fds[i],
			         x->mesh->pfd_peer[i], P->sent, P->slen, err,
			         errlen))
			    != COHORT_OK)
				return (rv);
		}
	}
}

cohort_status
host_exchange(struct host_xfer *x, const struct host_op *c, char *err,
    size_t errlen, cohort__time deadline)
{
	struct xfer_idle idle = { 0, false };
	cohort_status rv = xfer_exchange(x, c, &idle, err, errlen, deadline);

	/* Also when the last bytes arrived right after the wait, or the
	 * wait ended in a failure. */
	xfer_idle_end(c, &idle);
	return (rv);
}

cohort_status
host_pair(struct host_xfer *x, const struct host_op *c, int peer,
    const void *sbuf, size_t slen, void *rbuf, size_t rlen, char *err,
    size_t errlen, cohort__time deadline)
{
	host_plan_reset(x);
	host_plan_set(x, peer, sbuf, slen, rbuf, rlen);
	return (host_exchange(x, c, err, errlen, deadline));
}

cohort_status
host_exchange_blocks(struct host_xfer *x, const struct host_op *c,
    const uint8_t *src, size_t sstride, uint8_t *dst, size_t dstride,
    size_t len, char *err, size_t errlen, cohort__time deadline)
{
	host_plan_reset(x);
	for (int p = 0; p < x->mesh->size; p++) {
		if (p == x->mesh->rank)
			continue;
		host_plan_set(x, p, src + (size_t)p * sstride, len,
		    dst + (size_t)p * dstride, len);
	}
	return (host_exchange(x, c, err, errlen, deadline));
}

cohort_status
host_exchange_all(struct host_xfer *x, const struct host_op *c, uint8_t *all,
    size_t len, char *err, size_t errlen, cohort__time deadline)
{
	return (host_exchange_blocks(x, c, all + (size_t)x->mesh->rank * len,
	    0, all, len, len, err, errlen, deadline));
}

/* Connects to every partner of host_rd (p2, extra: its layout). */
static cohort_status
xfer_rd_connect(struct host_xfer *x, const struct host_op *c, int p2,
    int extra, char *err, size_t errlen, cohort__time deadline)
{
	int r = x->mesh->rank, k = 0, vr;

	if (r < 2 * extra) {
		x->want[k++] = r ^ 1; /* the fold partner */
		if ((r & 1) == 0)
			return (host_mesh_connect(x->mesh, x->want, k, c->name,
			    err, errlen, deadline));
		vr = r / 2;
	} else {
		vr = r - extra;
	}
	for (int mask = 1; mask < p2; mask <<= 1) {
		int vp = vr ^ mask;

		x->want[k++] = vp < extra ? vp * 2 + 1 : vp + extra;
	}
	return (host_mesh_connect(
	    x->mesh, x->want, k, c->name, err, errlen, deadline));
}

/*
 * Recursive doubling: with p2 the largest power of two <= n and extra =
 * n - p2, ranks 2i and 2i + 1 (i < extra) fold into the odd one first,
 * which plays virtual rank i; the others play r - extra. Virtual ranks
 * swap and combine with vr ^ mask for every mask < p2; the folded-out
 * ranks get the result last. Both partners of a round combine the same
 * two values, so all end bit-identical (combine is commutative).
 */
cohort_status
host_rd(struct host_xfer *x, const struct host_op *c, uint8_t *buf, size_t len,
    void (*combine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline)
{
	return (host_rd_from(
	    x, c, buf, len, 1, combine, ctx, err, errlen, deadline));
}

cohort_status
host_rd_from(struct host_xfer *x, const struct host_op *c, uint8_t *buf,
    size_t len, int first,
    void (*combine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline)
{
	int n = x->mesh->size, r = x->mesh->rank;
	int p2 = 1, extra, vr;
	cohort_status rv;

	while (p2 * 2 <= n)
		p2 *= 2;
	extra = n - p2;
	if ((rv = host_grow_small(x, len, err, errlen)) != COHORT_OK)
		return (rv);
	/* Every partner at once (each lists this rank too): one connect
	 * step of all its handshakes instead of one per round. */
	if ((rv = xfer_rd_connect(x, c, p2, extra, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	if (r < 2 * extra) {
		if ((r & 1) == 0) {
			/* Folded out: give our data, get the result. */
			if ((rv = host_pair(x, c, r + 1, buf, len, NULL, 0,
			         err, errlen, deadline))
			    != COHORT_OK)
				return (rv);
			return (host_pair(x, c, r + 1, NULL, 0, buf, len, err,
			    errlen, deadline));
		}
		if ((rv = host_pair(x, c, r - 1, NULL, 0, x->small, len, err,
		         errlen, deadline))
		    != COHORT_OK)
			return (rv);
		combine(ctx, buf, x->small);
		vr = r / 2;
	} else {
		vr = r - extra;
	}
	for (int mask = first; mask < p2; mask <<= 1) {
		int vp = vr ^ mask;
		int peer = vp < extra ? vp * 2 + 1 : vp + extra;

		if ((rv = host_pair(x, c, peer, buf, len, x->small, len, err,
		         errlen, deadline))
		    != COHORT_OK)
			return (rv);
		combine(ctx, buf, x->small);
	}
	/* The last combine may finish the value (MEAN: divide). */
	combine(ctx, buf, NULL);
	if (r < 2 * extra)
		return (host_pair(
		    x, c, r - 1, buf, len, NULL, 0, err, errlen, deadline));
	return (COHORT_OK);
}

/* One framed message each way with peer: [hdr | pay] out (NULL hdr:
 * nothing), [rhdr | rpay] in (NULL rhdr: nothing); *got: the payload
 * bytes read into rpay (SIZE_MAX: a payload of another length, dropped
 * or short). */
static cohort_status
xfer_framed_pair(struct host_xfer *x, const struct host_op *c, int peer,
    const uint8_t *hdr, const uint8_t *pay, uint8_t *rhdr, uint8_t *rpay,
    size_t hlen, size_t plen, host_frame_fn frame, size_t *got, char *err,
    size_t errlen, cohort__time deadline)
{
	struct host_plan *P = &x->plan[peer];
	cohort_status rv;

	host_plan_reset(x);
	host_plan_framed(x, peer, hdr, hdr != NULL ? hlen : 0, pay,
	    hdr != NULL ? plen : 0, rhdr, rhdr != NULL ? hlen : 0,
	    rhdr != NULL ? frame : NULL, rpay, plen);
	if ((rv = host_exchange(x, c, err, errlen, deadline)) != COHORT_OK)
		return (rv);
	*got = rhdr == NULL                           ? plen
	    : P->rlen - hlen == plen && P->drain == 0 ? plen
	                                              : SIZE_MAX;
	return (COHORT_OK);
}

cohort_status
host_rd_framed(struct host_xfer *x, const struct host_op *c, uint8_t *hdr,
    uint8_t *rhdr, size_t hlen, host_frame_fn frame,
    void (*hcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    uint8_t *pay, uint8_t *rpay, size_t plen,
    void (*pcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, bool *odd, char *err, size_t errlen, cohort__time deadline)
{
	int n = x->mesh->size, r = x->mesh->rank;
	int p2 = 1, extra, vr;
	size_t got;
	cohort_status rv;

	*odd = false;
	while (p2 * 2 <= n)
		p2 *= 2;
	extra = n - p2;
	if ((rv = xfer_rd_connect(x, c, p2, extra, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	if (r < 2 * extra) {
		if ((r & 1) == 0) {
			/* Folded out: give ours, get the result whole. */
			if ((rv = xfer_framed_pair(x, c, r + 1, hdr, pay, NULL,
			         NULL, hlen, plen, frame, &got, err, errlen,
			         deadline))
			        != COHORT_OK
			    || (rv = xfer_framed_pair(x, c, r + 1, NULL, NULL,
			            hdr, pay, hlen, plen, frame, &got, err,
			            errlen, deadline))
			        != COHORT_OK)
				return (rv);
			*odd = got != plen;
			return (COHORT_OK);
		}
		if ((rv = xfer_framed_pair(x, c, r - 1, NULL, NULL, rhdr, rpay,
		         hlen, plen, frame, &got, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		hcombine(ctx, hdr, rhdr);
		if (got == plen)
			pcombine(ctx, pay, rpay);
		else
			*odd = true;
		vr = r / 2;
	} else {
		vr = r - extra;
	}
	for (int mask = 1; mask < p2; mask <<= 1) {
		int vp = vr ^ mask;
		int peer = vp < extra ? vp * 2 + 1 : vp + extra;

		if ((rv = xfer_framed_pair(x, c, peer, hdr, pay, rhdr, rpay,
		         hlen, plen, frame, &got, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		hcombine(ctx, hdr, rhdr);
		if (got == plen)
			pcombine(ctx, pay, rpay);
		else
			*odd = true;
	}
	pcombine(ctx, pay, NULL);
	if (r < 2 * extra)
		return (xfer_framed_pair(x, c, r - 1, hdr, pay, NULL, NULL,
		    hlen, plen, frame, &got, err, errlen, deadline));
	return (COHORT_OK);
}

/* Processes (reduces, divides) the received bytes [S->processed, upto) of
 * step S, in pieces that do not wrap around a scratch ring's end (the
 * rings' sizes are multiples of 8, so no element straddles it). */
static void
stream_process(struct host_xfer *x, const struct host_op *c,
    struct host_step *S, size_t upto)
{
	while (S->processed < upto) {
		size_t off = S->processed;
		size_t len = upto - off;
		uint8_t *dst = S->rbuf + off;
		size_t n;

		switch (S->rmode) {
		case HOST_RECV_DIRECT:
			n = len / c->esize;
			cohort__reduce(
			    dst, S->other + off, n, c->dtype, c->redop);
			break;
		case HOST_RECV_SCRATCH: {
			size_t roff = off % x->tune->ring_len;

			if (len > x->tune->ring_len - roff)
				len = x->tune->ring_len - roff;
			n = len / c->esize;
			cohort__reduce(
			    dst, x->ring + roff, n, c->dtype, c->redop);
			break;
		}
		case HOST_RECV_ACC: {
			size_t aoff
			    = (size_t)((S->acc_base + off) % x->tune->acc_len);

			if (len > x->tune->acc_len - aoff)
				len = x->tune->acc_len - aoff;
			n = len / c->esize;
			dst = x->acc + aoff;
			cohort__reduce(
			    dst, S->other + off, n, c->dtype, c->redop);
			break;
		}
		default:
			n = len / c->esize;
			break;
		}
		if (S->divide)
			cohort__scale_div(
			    dst, n, c->dtype, (double)c->divisor);
		S->processed = off + len;
	}
}

/* State of one host_stream run. */
struct stream {
	struct host_xfer *x;
	const struct host_op *c;
	struct host_step *steps;
	int nsteps;
	int to, from; /* peers, -1 for none */
	int tofd, fromfd;
	int ks, kr; /* current outgoing and incoming steps */
	uint64_t acc_free; /* acc ring bytes sent on (reusable) */
};

/* Sends what step ks may send now. *want: more is sendable but the
 * socket is full. */
static cohort_status
stream_send(
    struct stream *s, bool *progress, bool *want, char *err, size_t errlen)
{
	struct host_xfer *x = s->x;
	struct host_step *S = &s->steps[s->ks];
	size_t limit = S->slen, len;
	const uint8_t *src;
	ssize_t n;

	if (S->gate >= 0 && s->steps[S->gate].processed < limit)
		limit = s->steps[S->gate].processed;
	if (limit <= S->sent)
		return (COHORT_OK);
	len = limit - S->sent;
	if (S->sbuf != NULL) {
		src = S->sbuf + S->sent;
	} else {
		uint64_t pos = s->steps[S->gate].acc_base + S->sent;
		size_t off = (size_t)(pos % x->tune->acc_len);

		src = x->acc + off;
		if (len > x->tune->acc_len - off)
			len = x->tune->acc_len - off;
	}
	len = xfer_send_cap(x, s->tofd, len);
	n = send(s->tofd, src, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n > 0) {
		S->sent += (size_t)n;
		if (S->sbuf == NULL)
			s->acc_free += (uint64_t)n;
		*progress = true;
	} else if (n < 0 && !xfer_again(errno)) {
		return (xfer_peer_error(x, s->c, s->to, errno, true, S->sent,
		    S->slen, err, errlen));
	}
	*want = S->sent < limit;
	return (COHORT_OK);
}

/* Where step R's next incoming bytes go, and how many fit there. */
static uint8_t *
stream_recv_dst(struct stream *s, struct host_step *R, size_t *lenp)
{
	struct host_xfer *x = s->x;
	size_t len = R->rlen - R->recvd;
	uint8_t *dst;

	switch (R->rmode) {
	case HOST_RECV_SCRATCH: {
		size_t off = R->recvd % x->tune->ring_len;
		size_t room = R->processed + x->tune->ring_len - R->recvd;

		dst = x->ring + off;
		if (len > x->tune->ring_len - off)
			len = x->tune->ring_len - off;
		if (len > room)
			len = room;
		break;
	}
	case HOST_RECV_ACC: {
		uint64_t pos = R->acc_base + R->recvd;
		size_t off = (size_t)(pos % x->tune->acc_len);
		uint64_t room = s->acc_free + x->tune->acc_len - pos;

		dst = x->acc + off;
		if (len > x->tune->acc_len - off)
			len = x->tune->acc_len - off;
		if (len > room)
			len = (size_t)room;
		break;
	}
	default:
		dst = R->rbuf + R->recvd;
		break;
	}
	if (len > x->tune->io_max)
		len = x->tune->io_max;
	*lenp = len;
	return (dst);
}

/* Receives into step kr and processes what arrived. *want: there is room
 * for more but nothing has arrived. */
static cohort_status
stream_recv(
    struct stream *s, bool *progress, bool *want, char *err, size_t errlen)
{
	const struct host_op *c = s->c;
	struct host_step *R = &s->steps[s->kr];
	size_t len, upto;
	uint8_t *dst;
	ssize_t n;

	if (R->recvd < R->rlen) {
		dst = stream_recv_dst(s, R, &len);
		if (len > 0) {
			*want = true;
			n = recv(s->fromfd, dst, len, MSG_DONTWAIT);
			if (n > 0) {
				R->recvd += (size_t)n;
				*progress = true;
			} else if (n == 0 || !xfer_again(errno)) {
				return (xfer_peer_error(s->x, c, s->from,
				    n == 0 ? 0 : errno, false, R->recvd,
				    R->rlen, err, errlen));
			}
		}
	}
	if (R->rmode == HOST_RECV_COPY) {
		R->processed = R->recvd;
		return (COHORT_OK);
	}
	upto = R->recvd - R->recvd % c->esize;
	/* In place: reduce into bytes only once they are sent. */
	if (R->pgate && upto > R->sent)
		upto = R->sent - R->sent % c->esize;
	if (upto > R->processed)
		stream_process(s->x, c, R, upto);
	return (COHORT_OK);
}

/* Sleeps until one of the sockets can move the bytes we want to move. */
static cohort_status
stream_wait(struct stream *s, bool want_send, bool want_recv, char *err,
    size_t errlen, cohort__time deadline)
{
	struct pollfd *fds = s->x->mesh->pfds; /* room for 2 + the watch */
	int nfds = 0;
	cohort_status rv;

	if (cohort__expired(deadline)) {
		if (want_recv)
			return (xfer_timeout(s->x, s->c, s->from, false,
			    s->steps[s->kr].recvd, s->steps[s->kr].rlen, err,
			    errlen));
		return (xfer_timeout(s->x, s->c, s->to, true,
		    s->steps[s->ks].sent, s->steps[s->ks].slen, err, errlen));
	}
	if (want_send) {
		fds[nfds].fd = s->tofd;
		fds[nfds].events = POLLOUT | POLLRDHUP;
		fds[nfds++].revents = 0;
	}
	if (want_recv && want_send && s->tofd == s->fromfd) {
		fds[0].events |= POLLIN;
	} else if (want_recv) {
		fds[nfds].fd = s->fromfd;
		fds[nfds].events = POLLIN;
		fds[nfds++].revents = 0;
	}
	if ((rv = xfer_poll(s->x, s->c, fds, nfds, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	if (want_send)
		return (xfer_hangup(s->x, s->c, &fds[0], s->to,
		    s->steps[s->ks].sent, s->steps[s->ks].slen, err, errlen));
	return (COHORT_OK);
}

static cohort_status
xfer_stream(struct host_xfer *x, const struct host_op *c, int to, int from,
    struct host_step *steps, int nsteps, struct xfer_idle *idle, char *err,
    size_t errlen, cohort__time deadline)
{
	struct stream s = { .x = x,
		.c = c,
		.steps = steps,
		.nsteps = nsteps,
		.to = to,
		.from = from };
	uint64_t acc_w = 0;
	int k = 0;
	cohort_status rv;

	if (to >= 0)
		x->want[k++] = to;
	if (from >= 0 && from != to)
		x->want[k++] = from;
	if ((rv = host_mesh_connect(
	         x->mesh, x->want, k, c->name, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	s.tofd = to >= 0 ? x->mesh->links[to].fd : -1;
	s.fromfd = from >= 0 ? x->mesh->links[from].fd : -1;
	for (k = 0; k < nsteps; k++) {
		struct host_step *S = &steps[k];

		S->sent = S->recvd = S->processed = 0;
		S->acc_base = acc_w;
		if (S->rmode == HOST_RECV_ACC)
			acc_w += S->rlen;
		COHORT__ASSERT(S->slen == 0 || s.tofd >= 0);
		COHORT__ASSERT(S->rlen == 0 || s.fromfd >= 0);
	}
	for (;;) {
		bool progress = false;
		bool want_send = false, want_recv = false;

		if ((rv = host_mesh_check_abort(x->mesh, c, err, errlen))
		    != COHORT_OK)
			return (rv);
		while (s.ks < nsteps && steps[s.ks].sent == steps[s.ks].slen)
			s.ks++;
		while (
		    s.kr < nsteps && steps[s.kr].processed == steps[s.kr].rlen)
			s.kr++;
		if (s.ks == nsteps && s.kr == nsteps)
			return (COHORT_OK);
		if (s.ks < nsteps
		    && (rv = stream_send(
		            &s, &progress, &want_send, err, errlen))
		        != COHORT_OK)
			return (rv);
		if (s.kr < nsteps
		    && (rv = stream_recv(
		            &s, &progress, &want_recv, err, errlen))
		        != COHORT_OK)
			return (rv);
		if (progress) {
			xfer_idle_end(c, idle);
			continue;
		}
		if (!want_send && !want_recv) {
			/* Cannot happen with a valid plan; never spin. */
			snprintf(err, errlen,
			    "internal error: %s #%" PRIu64 " stalled "
			    "(step %d/%d)",
			    c->name, c->seq, s.ks, s.kr);
			return (COHORT_ESTATE);
		}
		if (xfer_spinning(x, idle, want_send))
			continue;
		if ((rv = stream_wait(
		         &s, want_send, want_recv, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
	}
}

cohort_status
host_stream(struct host_xfer *x, const struct host_op *c, int to, int from,
    struct host_step *steps, int nsteps, char *err, size_t errlen,
    cohort__time deadline)
{
	struct xfer_idle idle = { 0, false };
	cohort_status rv = xfer_stream(
	    x, c, to, from, steps, nsteps, &idle, err, errlen, deadline);

	xfer_idle_end(c, &idle);
	return (rv);
}

/* len bytes of scratch; NULL: out of memory. A group connected in full
 * at init (at most COHORT_TCP_MESH_MAX ranks) writes it once, so that its
 * pages are faulted in now rather than in the middle of its first
 * operations. A larger group leaves its pages to be faulted in as its
 * operations touch them: a 1 KiB all-reduce then touches a page, not
 * 1.25 MiB, and a machine that simulates thousands of ranks (cohort bench
 * --op join) does not clear gigabytes of pages at the first all-reduce
 * (17 % of its CPU at 4,096 clients, measured). */
static uint8_t *
xfer_faulted(const struct host_xfer *x, size_t len, char *err, size_t errlen)
{
	/* Mapped from HOST_ZALLOC_MAP bytes: malloc (which the compiler
	 * may turn into calloc with the memset below) hands a thread
	 * recycled arena memory and calloc clears all of it, 3.2 GB for
	 * the 1 MiB scratch of 1,024 ranks over three jobs. */
	uint8_t *p = host_zalloc(1, len);

	if (p == NULL)
		snprintf(
		    err, errlen, "out of memory (%zu bytes of scratch)", len);
	else if (x->mesh->size <= x->tune->mesh_max)
		memset(p, 0, len);
	return (p);
}

cohort_status
host_need_acc(struct host_xfer *x, char *err, size_t errlen)
{
	if (x->acc == NULL
	    && (x->acc = xfer_faulted(x, x->tune->acc_len, err, errlen))
	        == NULL)
		return (COHORT_ENOMEM);
	x->acc_len = x->tune->acc_len;
	return (COHORT_OK);
}

cohort_status
host_grow_small(struct host_xfer *x, size_t len, char *err, size_t errlen)
{
	uint8_t *p;

	if (len <= x->small_len)
		return (COHORT_OK);
	if ((p = xfer_faulted(x, len, err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	host_zfree(x->small, 1, x->small_len);
	x->small = p;
	x->small_len = len;
	return (COHORT_OK);
}

/* Whole messages of the latency-optimised algorithms, faulted in at init. */
#define XFER_SMALL_SCRATCH (1u << 20)

cohort_status
host_xfer_init(struct host_xfer *x, struct host_mesh *m,
    const struct host_tune *tune, char *err, size_t errlen)
{
	size_t n = (size_t)m->size;

	x->mesh = m;
	x->tune = tune;
	x->n = n;
	x->seg_fd = -1;
	if ((x->plan = host_zalloc(n, sizeof(*x->plan))) == NULL
	    || (x->active = host_zalloc(n, sizeof(int))) == NULL
	    || (x->want = host_zalloc(n, sizeof(int))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	if (m->size == 1)
		return (COHORT_OK);
	if ((x->ring = xfer_faulted(x, tune->ring_len, err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	x->ring_len = tune->ring_len;
	return (host_grow_small(x, XFER_SMALL_SCRATCH, err, errlen));
}

void
host_xfer_fini(struct host_xfer *x)
{
	free(x->steps);
	host_zfree(x->small, 1, x->small_len);
	host_zfree(x->ring, 1, x->ring_len);
	host_zfree(x->acc, 1, x->acc_len);
	host_zfree(x->plan, x->n, sizeof(*x->plan));
	host_zfree(x->active, x->n, sizeof(int));
	host_zfree(x->want, x->n, sizeof(int));
	memset(x, 0, sizeof(*x));
}

struct host_step *
host_steps(struct host_xfer *x, size_t k, char *err, size_t errlen)
{
	struct host_step *p;

	if (k == 0)
		k = 1;
	if (k <= x->nsteps)
		return (x->steps);
	if ((p = realloc(x->steps, k * sizeof(*p))) == NULL) {
		snprintf(err, errlen, "out of memory (%zu steps)", k);
		return (NULL);
	}
	x->steps = p;
	x->nsteps = k;
	return (p);
}
