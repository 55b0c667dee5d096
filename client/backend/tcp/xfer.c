/*
 * xfer.c - the tcp backend's two transfer engines.
 *
 * Both run in the calling thread on non-blocking sockets: they try every
 * pending send() and recv() (MSG_DONTWAIT), and only when nothing moved do
 * they sleep in poll() on exactly the sockets that can make progress, for at
 * most TCP_POLL_MS so that the abort flag is seen promptly even if nobody
 * shuts the sockets down. Every loop ends by completion, a peer error, the
 * abort flag or the deadline.
 */
#include <errno.h>
#include <inttypes.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <time.h>

#include "tcp_impl.h"

#define TCP_POLL_MS 100

cohort_status
cohort__tcp_check_abort(struct cohort__tcp *t, char *err, size_t errlen)
{
	if (atomic_load_explicit(&t->aborted, memory_order_acquire)
	    || (t->abort_flag != NULL
	        && atomic_load_explicit(
	            t->abort_flag, memory_order_acquire))) {
		snprintf(
		    err, errlen, "%s #%" PRIu64 " aborted", t->opname, t->seq);
		return (COHORT_EABORTED);
	}
	return (COHORT_OK);
}

/* A send() or recv() to peer p failed with errno e (0: orderly close). */
static cohort_status
xfer_peer_error(struct cohort__tcp *t, int p, int e, bool sending, size_t done,
    size_t total, char *err, size_t errlen)
{
	cohort_status rv;

	if ((rv = cohort__tcp_check_abort(t, err, errlen)) != COHORT_OK)
		return (rv);
	if (e == 0)
		snprintf(err, errlen,
		    "rank %d closed the connection during %s #%" PRIu64
		    " (%s %zu of %zu bytes)",
		    (int)t->peers[p].job_rank, t->opname, t->seq,
		    sending ? "sent" : "received", done, total);
	else
		snprintf(err, errlen,
		    "connection to rank %d failed during %s #%" PRIu64
		    ": %s (%s %zu of %zu bytes)",
		    (int)t->peers[p].job_rank, t->opname, t->seq, strerror(e),
		    sending ? "sent" : "received", done, total);
	return (COHORT_EPEERLOST);
}

static cohort_status
xfer_timeout(struct cohort__tcp *t, int p, bool sending, size_t done,
    size_t total, char *err, size_t errlen)
{
	snprintf(err, errlen,
	    "timed out during %s #%" PRIu64 " waiting for rank %d (%s %zu of "
	    "%zu bytes)",
	    t->opname, t->seq, (int)t->peers[p].job_rank,
	    sending ? "sent" : "received", done, total);
	return (COHORT_ETIMEDOUT);
}

static inline bool
xfer_again(int e)
{
	return (e == EAGAIN || e == EWOULDBLOCK || e == EINTR);
}

int
cohort__tcp_watch_add(struct cohort__tcp *t, struct pollfd *fds, int n)
{
	const struct cohort__tcp *w = t->watch;
	int k = 0;

	if (w == NULL)
		return (0);
	for (int p = 0; p < w->size; p++) {
		if (p == w->rank || p == t->watch_lost || w->peers[p].fd < 0)
			continue;
		fds[n + k].fd = w->peers[p].fd;
		fds[n + k].events = POLLRDHUP;
		fds[n + k].revents = 0;
		k++;
	}
	return (k);
}

cohort_status
cohort__tcp_watch_check(struct cohort__tcp *t, const struct pollfd *fds, int k,
    char *err, size_t errlen)
{
	const struct cohort__tcp *w = t->watch;
	int i = 0;
	cohort_status rv;

	for (int p = 0; w != NULL && p < w->size && i < k; p++) {
		if (p == w->rank || p == t->watch_lost || w->peers[p].fd < 0)
			continue;
		if ((fds[i++].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0
		    && t->watch_lost < 0) {
			t->watch_lost = p;
			t->watch_lost_ns = cohort__now_ns();
		}
	}
	if (w == NULL || t->watch_lost < 0
	    || cohort__now_ns() - t->watch_lost_ns
	        < (uint64_t)COHORT__TCP_WATCH_GRACE_MS * 1000000u)
		return (COHORT_OK);
	if ((rv = cohort__tcp_check_abort(t, err, errlen)) != COHORT_OK)
		return (rv);
	if (atomic_load_explicit(
	        (atomic_int *)&w->aborted, memory_order_acquire)) {
		snprintf(
		    err, errlen, "%s #%" PRIu64 " aborted", t->opname, t->seq);
		return (COHORT_EABORTED);
	}
	snprintf(err, errlen,
	    "rank %d closed the connection during %s #%" PRIu64
	    " (hierarchical all-reduce; this rank still waited %d ms later)",
	    (int)w->peers[t->watch_lost].job_rank, t->opname, t->seq,
	    COHORT__TCP_WATCH_GRACE_MS);
	return (COHORT_EPEERLOST);
}

/* Sleeps in poll() on fds[0..n) (and a child's watched connections, for
 * which fds has room) for at most TCP_POLL_MS or until the deadline; the
 * caller re-checks everything afterwards. */
static cohort_status
xfer_poll(struct cohort__tcp *t, struct pollfd *fds, int n, char *err,
    size_t errlen, cohort__time deadline)
{
	int ms = TCP_POLL_MS;
	cohort_duration left = cohort__remaining(deadline);
	int k = cohort__tcp_watch_add(t, fds, n);

	if (left != COHORT_WAIT_FOREVER && left < ms)
		ms = left;
	if (ms < 1)
		ms = 1;
	(void)poll(fds, (nfds_t)(n + k), ms);
	return (cohort__tcp_watch_check(t, fds + n, k, err, errlen));
}

/* After poll(): a peer we still have bytes for that hung up (FIN, RST) is
 * lost, even if its socket buffer still has room for our bytes. A peer that
 * finished the operation cannot have hung up before taking all of them. */
static cohort_status
xfer_hangup(struct cohort__tcp *t, const struct pollfd *pfd, int p,
    size_t done, size_t total, char *err, size_t errlen)
{
	int e = 0;
	socklen_t sl = sizeof(e);

	if ((pfd->events & POLLOUT) == 0
	    || (pfd->revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0)
		return (COHORT_OK);
	if ((pfd->revents & POLLERR) != 0)
		(void)getsockopt(pfd->fd, SOL_SOCKET, SO_ERROR, &e, &sl);
	return (xfer_peer_error(t, p, e, true, done, total, err, errlen));
}

/* Busy-polls for a little while before sleeping: a poll() sleep and its
 * wake-up cost more than a short spin when the peer answers quickly. */
static inline bool
xfer_spinning(struct cohort__tcp *t, uint64_t *idle_since)
{
	uint64_t now = cohort__now_ns();

	if (*idle_since == 0)
		*idle_since = now;
	if (t->spin_us <= 0)
		return (false);
	if (now - *idle_since >= (uint64_t)t->spin_us * 1000u)
		return (false);
	/* Let a peer sharing this core run (more ranks than cores). */
	if (t->spin_yield)
		sched_yield();
	return (true);
}

/* Progress after an idle period: the idle time was spent waiting for a
 * peer (op stats, backend.h). */
static inline void
xfer_progress(struct cohort__tcp *t, uint64_t *idle_since)
{
	if (*idle_since != 0) {
		if (t->stats != NULL)
			t->stats->wait_ns += cohort__now_ns() - *idle_since;
		*idle_since = 0;
	}
}

void
cohort__tcp_plan_reset(struct cohort__tcp *t)
{
	for (int p = 0; p < t->size; p++) {
		struct cohort__tcp_peer *P = &t->peers[p];

		P->sbuf = NULL;
		P->slen = P->sent = 0;
		P->rbuf = NULL;
		P->rlen = P->recvd = 0;
	}
}

cohort_status
cohort__tcp_exchange(
    struct cohort__tcp *t, char *err, size_t errlen, cohort__time deadline)
{
	struct pollfd *fds = t->pfds;
	uint64_t idle_since = 0;
	cohort_status rv;

	for (;;) {
		bool pending = false;
		bool progress = false;
		int nfds = 0;
		int first = -1;
		bool first_send = false;

		if ((rv = cohort__tcp_check_abort(t, err, errlen))
		    != COHORT_OK)
			return (rv);
		for (int p = 0; p < t->size; p++) {
			struct cohort__tcp_peer *P = &t->peers[p];
			short ev = 0;
			ssize_t n;

			if (P->sent < P->slen) {
				size_t len = P->slen - P->sent;

				if (len > t->io_max)
					len = t->io_max;
				n = send(P->fd, P->sbuf + P->sent, len,
				    MSG_DONTWAIT | MSG_NOSIGNAL);
				if (n > 0) {
					P->sent += (size_t)n;
					progress = true;
				} else if (n < 0 && !xfer_again(errno)) {
					return (xfer_peer_error(t, p, errno,
					    true, P->sent, P->slen, err,
					    errlen));
				}
				if (P->sent < P->slen)
					ev |= POLLOUT | POLLRDHUP;
			}
			if (P->recvd < P->rlen) {
				n = recv(P->fd, P->rbuf + P->recvd,
				    P->rlen - P->recvd, MSG_DONTWAIT);
				if (n > 0) {
					P->recvd += (size_t)n;
					progress = true;
				} else if (n == 0
				    || (n < 0 && !xfer_again(errno))) {
					return (xfer_peer_error(t, p,
					    n == 0 ? 0 : errno, false,
					    P->recvd, P->rlen, err, errlen));
				}
				if (P->recvd < P->rlen)
					ev |= POLLIN;
			}
			if (ev != 0) {
				pending = true;
				fds[nfds].fd = P->fd;
				fds[nfds].events = ev;
				fds[nfds].revents = 0;
				t->pfd_peer[nfds] = p;
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
			xfer_progress(t, &idle_since);
			continue;
		}
		if (xfer_spinning(t, &idle_since))
			continue;
		if (cohort__expired(deadline)) {
			struct cohort__tcp_peer *P = &t->peers[first];

			return (first_send
			        ? xfer_timeout(t, first, true, P->sent,
			            P->slen, err, errlen)
			        : xfer_timeout(t, first, false, P->recvd,
			            P->rlen, err, errlen));
		}
		if ((rv = xfer_poll(t, fds, nfds, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		for (int i = 0; i < nfds; i++) {
			struct cohort__tcp_peer *P = &t->peers[t->pfd_peer[i]];

			if ((rv = xfer_hangup(t, &fds[i], t->pfd_peer[i],
			         P->sent, P->slen, err, errlen))
			    != COHORT_OK)
				return (rv);
		}
	}
}

cohort_status
cohort__tcp_exchange_all(struct cohort__tcp *t, uint8_t *all, size_t len,
    char *err, size_t errlen, cohort__time deadline)
{
	cohort__tcp_plan_reset(t);
	for (int p = 0; p < t->size; p++) {
		if (p == t->rank)
			continue;
		t->peers[p].sbuf = all + (size_t)t->rank * len;
		t->peers[p].slen = len;
		t->peers[p].rbuf = all + (size_t)p * len;
		t->peers[p].rlen = len;
	}
	return (cohort__tcp_exchange(t, err, errlen, deadline));
}

/* Processes (reduces, divides) the received bytes [S->processed, upto) of
 * step S, in pieces that do not wrap around a scratch ring's end (the
 * rings' sizes are multiples of 8, so no element straddles it). */
static void
stream_process(struct cohort__tcp *t, struct cohort__tcp_step *S, size_t upto)
{
	while (S->processed < upto) {
		size_t off = S->processed;
		size_t len = upto - off;
		uint8_t *dst = S->rbuf + off;
		size_t n;

		switch (S->rmode) {
		case COHORT__TCP_RECV_DIRECT:
			n = len / t->esize;
			cohort__reduce(
			    dst, S->other + off, n, t->dtype, t->redop);
			break;
		case COHORT__TCP_RECV_SCRATCH: {
			size_t roff = off % t->ring_len;

			if (len > t->ring_len - roff)
				len = t->ring_len - roff;
			n = len / t->esize;
			cohort__reduce(
			    dst, t->ring + roff, n, t->dtype, t->redop);
			break;
		}
		case COHORT__TCP_RECV_ACC: {
			size_t aoff
			    = (size_t)((S->acc_base + off) % t->acc_len);

			if (len > t->acc_len - aoff)
				len = t->acc_len - aoff;
			n = len / t->esize;
			dst = t->acc + aoff;
			cohort__reduce(
			    dst, S->other + off, n, t->dtype, t->redop);
			break;
		}
		default:
			n = len / t->esize;
			break;
		}
		if (S->divide)
			cohort__scale_div(dst, n, t->dtype, (double)t->size);
		S->processed = off + len;
	}
}

/* State of one tcp_stream run. */
struct stream {
	struct cohort__tcp *t;
	struct cohort__tcp_step *steps;
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
    struct stream *x, bool *progress, bool *want, char *err, size_t errlen)
{
	struct cohort__tcp *t = x->t;
	struct cohort__tcp_step *S = &x->steps[x->ks];
	size_t limit = S->slen, len;
	const uint8_t *src;
	ssize_t n;

	if (S->gate >= 0 && x->steps[S->gate].processed < limit)
		limit = x->steps[S->gate].processed;
	if (limit <= S->sent)
		return (COHORT_OK);
	len = limit - S->sent;
	if (S->sbuf != NULL) {
		src = S->sbuf + S->sent;
	} else {
		uint64_t pos = x->steps[S->gate].acc_base + S->sent;
		size_t off = (size_t)(pos % t->acc_len);

		src = t->acc + off;
		if (len > t->acc_len - off)
			len = t->acc_len - off;
	}
	if (len > t->io_max)
		len = t->io_max;
	n = send(x->tofd, src, len, MSG_DONTWAIT | MSG_NOSIGNAL);
	if (n > 0) {
		S->sent += (size_t)n;
		if (S->sbuf == NULL)
			x->acc_free += (uint64_t)n;
		*progress = true;
	} else if (n < 0 && !xfer_again(errno)) {
		return (xfer_peer_error(
		    t, x->to, errno, true, S->sent, S->slen, err, errlen));
	}
	*want = S->sent < limit;
	return (COHORT_OK);
}

/* Where step R's next incoming bytes go, and how many fit there. */
static uint8_t *
stream_recv_dst(struct stream *x, struct cohort__tcp_step *R, size_t *lenp)
{
	struct cohort__tcp *t = x->t;
	size_t len = R->rlen - R->recvd;
	uint8_t *dst;

	switch (R->rmode) {
	case COHORT__TCP_RECV_SCRATCH: {
		size_t off = R->recvd % t->ring_len;
		size_t room = R->processed + t->ring_len - R->recvd;

		dst = t->ring + off;
		if (len > t->ring_len - off)
			len = t->ring_len - off;
		if (len > room)
			len = room;
		break;
	}
	case COHORT__TCP_RECV_ACC: {
		uint64_t pos = R->acc_base + R->recvd;
		size_t off = (size_t)(pos % t->acc_len);
		uint64_t room = x->acc_free + t->acc_len - pos;

		dst = t->acc + off;
		if (len > t->acc_len - off)
			len = t->acc_len - off;
		if (len > room)
			len = (size_t)room;
		break;
	}
	default:
		dst = R->rbuf + R->recvd;
		break;
	}
	if (len > t->io_max)
		len = t->io_max;
	*lenp = len;
	return (dst);
}

/* Receives into step kr and processes what arrived. *want: there is room
 * for more but nothing has arrived. */
static cohort_status
stream_recv(
    struct stream *x, bool *progress, bool *want, char *err, size_t errlen)
{
	struct cohort__tcp *t = x->t;
	struct cohort__tcp_step *R = &x->steps[x->kr];
	size_t len, upto;
	uint8_t *dst;
	ssize_t n;

	if (R->recvd < R->rlen) {
		dst = stream_recv_dst(x, R, &len);
		if (len > 0) {
			*want = true;
			n = recv(x->fromfd, dst, len, MSG_DONTWAIT);
			if (n > 0) {
				R->recvd += (size_t)n;
				*progress = true;
			} else if (n == 0 || !xfer_again(errno)) {
				return (xfer_peer_error(t, x->from,
				    n == 0 ? 0 : errno, false, R->recvd,
				    R->rlen, err, errlen));
			}
		}
	}
	if (R->rmode == COHORT__TCP_RECV_COPY) {
		R->processed = R->recvd;
		return (COHORT_OK);
	}
	upto = R->recvd - R->recvd % t->esize;
	/* In place: reduce into bytes only once they are sent. */
	if (R->pgate && upto > R->sent)
		upto = R->sent - R->sent % t->esize;
	if (upto > R->processed)
		stream_process(t, R, upto);
	return (COHORT_OK);
}

/* Sleeps until one of the sockets can move the bytes we want to move. */
static cohort_status
stream_wait(struct stream *x, bool want_send, bool want_recv, char *err,
    size_t errlen, cohort__time deadline)
{
	struct pollfd *fds = x->t->pfds; /* room for 2 + the watch */
	int nfds = 0;
	cohort_status rv;

	if (cohort__expired(deadline)) {
		if (want_recv)
			return (xfer_timeout(x->t, x->from, false,
			    x->steps[x->kr].recvd, x->steps[x->kr].rlen, err,
			    errlen));
		return (xfer_timeout(x->t, x->to, true, x->steps[x->ks].sent,
		    x->steps[x->ks].slen, err, errlen));
	}
	if (want_send) {
		fds[nfds].fd = x->tofd;
		fds[nfds].events = POLLOUT | POLLRDHUP;
		fds[nfds++].revents = 0;
	}
	if (want_recv && want_send && x->tofd == x->fromfd) {
		fds[0].events |= POLLIN;
	} else if (want_recv) {
		fds[nfds].fd = x->fromfd;
		fds[nfds].events = POLLIN;
		fds[nfds++].revents = 0;
	}
	if ((rv = xfer_poll(x->t, fds, nfds, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	if (want_send)
		return (xfer_hangup(x->t, &fds[0], x->to, x->steps[x->ks].sent,
		    x->steps[x->ks].slen, err, errlen));
	return (COHORT_OK);
}

cohort_status
cohort__tcp_stream(struct cohort__tcp *t, int to, int from,
    struct cohort__tcp_step *steps, int nsteps, char *err, size_t errlen,
    cohort__time deadline)
{
	struct stream x = { .t = t,
		.steps = steps,
		.nsteps = nsteps,
		.to = to,
		.from = from,
		.tofd = to >= 0 ? t->peers[to].fd : -1,
		.fromfd = from >= 0 ? t->peers[from].fd : -1 };
	uint64_t acc_w = 0;
	uint64_t idle_since = 0;
	cohort_status rv;

	for (int k = 0; k < nsteps; k++) {
		struct cohort__tcp_step *S = &steps[k];

		S->sent = S->recvd = S->processed = 0;
		S->acc_base = acc_w;
		if (S->rmode == COHORT__TCP_RECV_ACC)
			acc_w += S->rlen;
		COHORT__ASSERT(S->slen == 0 || x.tofd >= 0);
		COHORT__ASSERT(S->rlen == 0 || x.fromfd >= 0);
	}
	for (;;) {
		bool progress = false;
		bool want_send = false, want_recv = false;

		if ((rv = cohort__tcp_check_abort(t, err, errlen))
		    != COHORT_OK)
			return (rv);
		while (x.ks < nsteps && steps[x.ks].sent == steps[x.ks].slen)
			x.ks++;
		while (
		    x.kr < nsteps && steps[x.kr].processed == steps[x.kr].rlen)
			x.kr++;
		if (x.ks == nsteps && x.kr == nsteps)
			return (COHORT_OK);
		if (x.ks < nsteps
		    && (rv = stream_send(
		            &x, &progress, &want_send, err, errlen))
		        != COHORT_OK)
			return (rv);
		if (x.kr < nsteps
		    && (rv = stream_recv(
		            &x, &progress, &want_recv, err, errlen))
		        != COHORT_OK)
			return (rv);
		if (progress) {
			xfer_progress(t, &idle_since);
			continue;
		}
		if (!want_send && !want_recv) {
			/* Cannot happen with a valid plan; never spin. */
			snprintf(err, errlen,
			    "internal error: %s #%" PRIu64 " stalled "
			    "(step %d/%d)",
			    t->opname, t->seq, x.ks, x.kr);
			return (COHORT_ESTATE);
		}
		if (xfer_spinning(t, &idle_since))
			continue;
		if ((rv = stream_wait(
		         &x, want_send, want_recv, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
	}
}

cohort_status
cohort__tcp_need_acc(struct cohort__tcp *t, char *err, size_t errlen)
{
	if (t->acc != NULL)
		return (COHORT_OK);
	if ((t->acc = malloc(t->acc_len)) == NULL) {
		snprintf(err, errlen, "out of memory (%zu bytes of scratch)",
		    t->acc_len);
		return (COHORT_ENOMEM);
	}
	memset(t->acc, 0, t->acc_len); /* fault it in now, once */
	return (COHORT_OK);
}

cohort_status
cohort__tcp_grow_small(
    struct cohort__tcp *t, size_t len, char *err, size_t errlen)
{
	uint8_t *p;

	if (len <= t->small_len)
		return (COHORT_OK);
	if ((p = malloc(len)) == NULL) {
		snprintf(
		    err, errlen, "out of memory (%zu bytes of scratch)", len);
		return (COHORT_ENOMEM);
	}
	memset(p, 0, len); /* fault it in now, once */
	free(t->small);
	t->small = p;
	t->small_len = len;
	return (COHORT_OK);
}
