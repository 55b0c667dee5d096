/*
 * net.c - cohortd's own TCP listeners on one epoll thread, and the bounds
 * every connection is under (net.h).
 *
 * The loop: epoll_wait (at most 100 ms, less when a resting listener is
 * due), then accepts, reads and writes as the events say, then the
 * replies other threads posted (an eventfd wakes it), then the deadlines,
 * then frees the closed connections nothing refers to any more.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
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
#include <sys/resource.h>
#include <sys/uio.h>
#include <unistd.h>

#include "net.h"

enum { NET_CONN = 1, NET_LISTENER, NET_WAKE };

/* A listener rests this long after it could not take a connection,
 * doubling up to NET_REST_MAX_MS. */
#define NET_REST_MIN_MS 10
#define NET_REST_MAX_MS 1000
/* Connections taken per listener and wake-up (fairness). */
#define NET_ACCEPT_BATCH 64
/* A summary of refusals is logged at most this often. */
#define NET_NOTE_MS 10000
/* Input every connection may hold outside max_pending_bytes. */
#define NET_SMALL (64u << 10)
/* Pipe ids of our connections: nng's ids are 31-bit. */
#define NET_PIPE_BASE 0x80000000u

struct srv_nsrc {
	struct srv_hnode hn;
	uint8_t key[16];
	size_t klen;
	struct srv_link pending; /* srv_nconn.slink, oldest first */
	uint64_t npending;
	uint64_t nconns;
};

struct srv_nlistener {
	int kind;
	struct srv_link link;
	struct srv_net *net;
	const struct srv_proto *proto;
	void *arg;
	int fd;
	bool in_poll;
	cohort__time resume_at; /* resting until; 0: not */
	cohort__time rest_ms;
	char addr[96];
	char what[300]; /* for the log: "torch store of job 'x'" */
};

struct srv_net {
	struct srv_net_limits lim;
	uint64_t max_conns;
	uint64_t fd_limit;
	int epfd, efd, reserve_fd;
	int wake_kind;
	pthread_t thread;
	bool started, stopped;
	atomic_bool stop;
	struct srv_link listeners;
	struct srv_link conns; /* open ones */
	struct srv_link dead; /* closed, waiting for refs == 0 */
	struct srv_link pending; /* untrusted, oldest first */
	struct srv_map srcs;
	struct srv_map pipes;
	uint64_t nconns;
	uint64_t held;
	/* held beyond each connection's first NET_SMALL bytes: what
	 * max_pending_bytes bounds (a small request always gets in; those
	 * are bounded by the connections) */
	uint64_t big;
	pthread_mutex_t mtx; /* the inbox */
	struct srv_npost *inbox, **inbox_tail;
	/* counters (read by any thread) */
	atomic_uint_fast64_t a_conns, a_held, a_refused, a_evicted, a_emfile,
	    a_limit_refusals, a_freed;
	/* what was refused since the last summary in the log */
	uint64_t note_evicted, note_refused;
	cohort__time note_at;
};

/* ------------------------------------------------------------------------ */
/* Pipe ids                                                                 */
/* ------------------------------------------------------------------------ */

uint32_t
srv_net_next_pipe(void)
{
	static atomic_uint next = 1;
	uint32_t v;

	do
		v = atomic_fetch_add(&next, 1) & 0x7fffffffu;
	while (v == 0);
	return (NET_PIPE_BASE | v);
}

bool
srv_net_pipe_is_ours(uint32_t pipe)
{
	return ((pipe & NET_PIPE_BASE) != 0);
}

/* ------------------------------------------------------------------------ */
/* Sources                                                                  */
/* ------------------------------------------------------------------------ */

size_t
srv_net_addr(
    const struct sockaddr_storage *sa, uint8_t out[16], uint16_t *port)
{
	if (sa->ss_family == AF_INET) {
		const struct sockaddr_in *s4 = (const void *)sa;
		memcpy(out, &s4->sin_addr, 4);
		if (port != NULL)
			*port = ntohs(s4->sin_port);
		return (4);
	}
	if (sa->ss_family == AF_INET6) {
		const struct sockaddr_in6 *s6 = (const void *)sa;
		if (port != NULL)
			*port = ntohs(s6->sin6_port);
		if (IN6_IS_ADDR_V4MAPPED(&s6->sin6_addr)) {
			memcpy(out, s6->sin6_addr.s6_addr + 12, 4);
			return (4);
		}
		memcpy(out, &s6->sin6_addr, 16);
		return (16);
	}
	return (0);
}

/* The address bytes that identify a source (srv_net_addr) and whether it
 * is this host's loopback (127/8, ::1). */
static size_t
net_src_key(const struct sockaddr_storage *sa, uint8_t key[16], bool *lo)
{
	static const uint8_t loop6[16] = { [15] = 1 };
	size_t len = srv_net_addr(sa, key, NULL);

	*lo = (len == 4 && key[0] == 127)
	    || (len == 16 && memcmp(key, loop6, 16) == 0);
	return (len);
}

static struct srv_nsrc *
net_src_get(struct srv_net *n, const uint8_t *key, size_t klen)
{
	struct srv_hnode *h = srv_map_get(&n->srcs, key, klen);
	struct srv_nsrc *s;

	if (h != NULL)
		return (SRV_CONTAINER(h, struct srv_nsrc, hn));
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return (NULL);
	memcpy(s->key, key, klen);
	s->klen = klen;
	srv_list_init(&s->pending);
	if (srv_map_put(&n->srcs, &s->hn, s->key, s->klen) != COHORT_OK) {
		free(s);
		return (NULL);
	}
	return (s);
}

static void
net_src_release(struct srv_net *n, struct srv_nsrc *s)
{
	if (s == NULL || s->nconns > 0)
		return;
	srv_map_del(&n->srcs, &s->hn);
	free(s);
}

/* ------------------------------------------------------------------------ */
/* Polling                                                                  */
/* ------------------------------------------------------------------------ */

/* Makes epoll watch what c needs now: input unless paused or at EOF,
 * output while some is queued; nothing: out of the set (so that a hung
 * up socket does not report itself for ever). */
static void
net_watch(struct srv_nconn *c)
{
	struct srv_net *n = c->net;
	struct epoll_event ev;
	uint32_t want = 0;

	if (c->dead)
		return;
	if (!c->rd_paused && !c->rd_eof)
		want |= EPOLLIN | EPOLLRDHUP;
	if (c->want_out)
		want |= EPOLLOUT;
	if (want == 0) {
		if (c->in_poll)
			epoll_ctl(n->epfd, EPOLL_CTL_DEL, c->fd, NULL);
		c->in_poll = false;
		c->events = 0;
		return;
	}
	if (c->in_poll && want == c->events)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.events = want;
	ev.data.ptr = &c->kind;
	if (epoll_ctl(n->epfd, c->in_poll ? EPOLL_CTL_MOD : EPOLL_CTL_ADD,
	        c->fd, &ev)
	    == 0) {
		c->in_poll = true;
		c->events = want;
	}
}

static void
net_listener_watch(struct srv_nlistener *l, bool on)
{
	struct epoll_event ev;

	if (on == l->in_poll)
		return;
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.ptr = &l->kind;
	if (epoll_ctl(
	        l->net->epfd, on ? EPOLL_CTL_ADD : EPOLL_CTL_DEL, l->fd, &ev)
	    == 0)
		l->in_poll = on;
}

/* ------------------------------------------------------------------------ */
/* Closing                                                                  */
/* ------------------------------------------------------------------------ */

/* What of a connection's held input counts against max_pending_bytes. */
static uint64_t
net_big(uint64_t held)
{
	return (held > NET_SMALL ? held - NET_SMALL : 0);
}

static void
net_untrack_pending(struct srv_nconn *c)
{
	if (c->trusted)
		return;
	if (c->plink.next != &c->plink)
		srv_list_remove(&c->plink);
	if (c->slink.next != &c->slink) {
		srv_list_remove(&c->slink);
		if (c->src != NULL)
			c->src->npending--;
	}
}

static void
net_oq_free(struct srv_nconn *c)
{
	while (c->oq != NULL) {
		struct srv_ochunk *ch = c->oq;
		c->oq = ch->next;
		if (ch->msg != NULL)
			nng_msg_free(ch->msg);
		free(ch);
	}
	c->otail = NULL;
	c->out = 0;
	c->want_out = false;
}

void
srv_nconn_close(struct srv_nconn *c, const char *why)
{
	struct srv_net *n = c->net;

	if (c->dead)
		return;
	if (why != NULL)
		cohort__debug("%s on %s: closing %s: %s", c->l->what,
		    c->l->addr, c->peer, why);
	c->dead = true;
	net_untrack_pending(c);
	if (c->in_poll)
		epoll_ctl(n->epfd, EPOLL_CTL_DEL, c->fd, NULL);
	c->in_poll = false;
	close(c->fd);
	c->fd = -1;
	if (c->pipe != 0)
		srv_map_del(&n->pipes, &c->pn);
	net_oq_free(c);
	n->held -= c->held;
	n->big -= net_big(c->held);
	atomic_fetch_sub(&n->a_held, c->held);
	atomic_fetch_add(&n->a_freed, c->held);
	c->held = 0;
	srv_list_remove(&c->link);
	srv_list_append(&n->dead, &c->link);
	n->nconns--;
	atomic_fetch_sub(&n->a_conns, 1);
	if (c->src != NULL) {
		c->src->nconns--;
		net_src_release(n, c->src);
		c->src = NULL;
	}
	/* Last: it may call into the core, whose answers come back
	 * through the inbox. */
	if (c->proto->closing != NULL)
		c->proto->closing(c);
}

void
srv_nconn_refuse(struct srv_nconn *c, const char *fmt, ...)
{
	char why[512];
	va_list ap;

	if (c->dead)
		return;
	va_start(ap, fmt);
	vsnprintf(why, sizeof(why), fmt, ap);
	va_end(ap);
	cohort__warn(
	    "%s on %s: closing %s: %s", c->l->what, c->l->addr, c->peer, why);
	srv_nconn_close(c, NULL);
}

static void
net_reap(struct srv_net *n)
{
	struct srv_link *l, *next;

	for (l = n->dead.next; l != &n->dead; l = next) {
		struct srv_nconn *c = SRV_CONTAINER(l, struct srv_nconn, link);
		next = l->next;
		if (c->refs > 0)
			continue;
		srv_list_remove(&c->link);
		if (c->proto->fini != NULL)
			c->proto->fini(c);
		free(c);
	}
}

/* What was refused, summed up in the log at most every NET_NOTE_MS. */
static void
net_note(struct srv_net *n, cohort__time now)
{
	if (n->note_evicted + n->note_refused == 0
	    || now - n->note_at < NET_NOTE_MS)
		return;
	cohort__warn("connections: %" PRIu64 " closed to make room for new "
	             "ones (descriptors, --max-conns or "
	             "--max-pending-per-source), %" PRIu64
	             " refused at once (no room); only connections that had "
	             "not authenticated are closed so",
	    n->note_evicted, n->note_refused);
	n->note_evicted = n->note_refused = 0;
	n->note_at = now;
}

/* Closes the oldest connection that has not authenticated (of src, or
 * of all): false if there is none. */
static bool
net_evict(struct srv_net *n, struct srv_nsrc *src)
{
	struct srv_nconn *c;

	if (src != NULL) {
		if (srv_list_empty(&src->pending))
			return (false);
		c = SRV_CONTAINER(src->pending.next, struct srv_nconn, slink);
	} else {
		if (srv_list_empty(&n->pending))
			return (false);
		c = SRV_CONTAINER(n->pending.next, struct srv_nconn, plink);
	}
	n->note_evicted++;
	atomic_fetch_add(&n->a_evicted, 1);
	srv_nconn_close(c,
	    src != NULL ? "its source has --max-pending-per-source "
	                  "connections that have not authenticated"
	                : "no descriptor or --max-conns slot left: the oldest "
	                  "connection that has not authenticated makes room");
	return (true);
}

/* No room: takes the connection on the spare descriptor and closes it,
 * so that its client is told at once. */
static void
net_refuse_one(struct srv_net *n, struct srv_nlistener *l)
{
	int fd;

	if (n->reserve_fd >= 0) {
		close(n->reserve_fd);
		n->reserve_fd = -1;
	}
	fd = accept4(l->fd, NULL, NULL, SOCK_CLOEXEC);
	if (fd >= 0) {
		close(fd);
		n->note_refused++;
		atomic_fetch_add(&n->a_refused, 1);
	}
	n->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
}

static void
net_rest(struct srv_nlistener *l, cohort__time now)
{
	l->rest_ms = l->rest_ms == 0
	    ? NET_REST_MIN_MS
	    : (l->rest_ms * 2 > NET_REST_MAX_MS ? NET_REST_MAX_MS
	                                        : l->rest_ms * 2);
	l->resume_at = now + l->rest_ms;
	net_listener_watch(l, false);
}

/* ------------------------------------------------------------------------ */
/* Accepting                                                                */
/* ------------------------------------------------------------------------ */

static void
net_conn_new(struct srv_net *n, struct srv_nlistener *l, int fd,
    const struct sockaddr_storage *sa, socklen_t sl, cohort__time now)
{
	struct srv_nconn *c;
	char host[INET6_ADDRSTRLEN] = "?", serv[16] = "?";
	uint8_t key[16];
	size_t klen;
	bool lo;
	int one = 1;

	klen = net_src_key(sa, key, &lo);
	if ((c = calloc(1, l->proto->conn_size)) == NULL) {
		close(fd);
		return;
	}
	c->kind = NET_CONN;
	c->net = n;
	c->l = l;
	c->proto = l->proto;
	c->arg = l->arg;
	c->fd = fd;
	c->opened = now;
	c->sa = *sa;
	c->salen = sl;
	c->loopback = lo;
	srv_list_init(&c->plink);
	srv_list_init(&c->slink);
	(void)setsockopt(fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	(void)getnameinfo((const struct sockaddr *)sa, sl, host, sizeof(host),
	    serv, sizeof(serv), NI_NUMERICHOST | NI_NUMERICSERV);
	snprintf(c->peer, sizeof(c->peer),
	    strchr(host, ':') != NULL ? "[%s]:%s" : "%s:%s", host, serv);
	if (klen > 0 && (c->src = net_src_get(n, key, klen)) != NULL) {
		/* A source over its share of unauthenticated connections
		 * loses its oldest one (counted first: the source stays). */
		c->src->nconns++;
		if (n->lim.max_pending_per_source > 0
		    && c->src->npending >= n->lim.max_pending_per_source)
			(void)net_evict(n, c->src);
		c->src->npending++;
		srv_list_append(&c->src->pending, &c->slink);
	}
	srv_list_append(&n->pending, &c->plink);
	srv_list_append(&n->conns, &c->link);
	n->nconns++;
	atomic_fetch_add(&n->a_conns, 1);
	net_watch(c);
	if (!c->in_poll) {
		srv_nconn_close(c, "epoll");
		return;
	}
	if (c->proto->opened != NULL && !c->proto->opened(c, now))
		srv_nconn_close(c, NULL);
}

static void
net_accept(struct srv_net *n, struct srv_nlistener *l, cohort__time now)
{
	for (int k = 0; k < NET_ACCEPT_BATCH; k++) {
		struct sockaddr_storage sa;
		socklen_t sl = sizeof(sa);
		int fd;

		if (n->nconns >= n->max_conns && !net_evict(n, NULL)) {
			net_refuse_one(n, l);
			net_rest(l, now);
			return;
		}
		fd = accept4(l->fd, (struct sockaddr *)&sa, &sl,
		    SOCK_NONBLOCK | SOCK_CLOEXEC);
		if (fd < 0) {
			switch (errno) {
			case EAGAIN:
#if EWOULDBLOCK != EAGAIN
			case EWOULDBLOCK:
#endif
				l->rest_ms = 0;
				return;
			case EINTR:
			case ECONNABORTED:
			case EPROTO:
				continue;
			case EMFILE:
			case ENFILE:
				atomic_fetch_add(&n->a_emfile, 1);
				if (net_evict(n, NULL))
					continue;
				net_refuse_one(n, l);
				net_rest(l, now);
				return;
			default:
				/* ENOBUFS, ENOMEM: rest, never spin */
				net_rest(l, now);
				return;
			}
		}
		l->rest_ms = 0;
		net_conn_new(n, l, fd, &sa, sl, now);
	}
}

/* ------------------------------------------------------------------------ */
/* Input and output                                                         */
/* ------------------------------------------------------------------------ */

ssize_t
srv_nconn_recv(struct srv_nconn *c, void *buf, size_t len)
{
	for (;;) {
		ssize_t r;
		if (c->dead || c->rd_eof)
			return (-1);
		r = recv(c->fd, buf, len, 0);
		if (r > 0)
			return (r);
		if (r == 0) {
			c->rd_eof = true;
			net_watch(c);
			return (-1);
		}
		if (errno == EINTR)
			continue;
		if (errno == EAGAIN || errno == EWOULDBLOCK)
			return (0);
		srv_nconn_close(c, strerror(errno));
		return (-1);
	}
}

bool
srv_nconn_hold(struct srv_nconn *c, uint64_t n, const char **why)
{
	struct srv_net *net = c->net;
	uint64_t more = net_big(c->held + n) - net_big(c->held);

	if (c->max_held > 0 && c->held + n > c->max_held) {
		*why = "connection";
		return (false);
	}
	if (more > 0 && net->big + more > net->lim.max_pending_bytes) {
		*why = "--max-pending-bytes";
		atomic_fetch_add(&net->a_limit_refusals, 1);
		return (false);
	}
	c->held += n;
	net->held += n;
	net->big += more;
	atomic_fetch_add(&net->a_held, n);
	return (true);
}

void
srv_nconn_unhold(struct srv_nconn *c, uint64_t n)
{
	uint64_t less;

	if (n > c->held)
		n = c->held;
	less = net_big(c->held) - net_big(c->held - n);
	c->held -= n;
	c->net->held -= n;
	c->net->big -= less;
	atomic_fetch_sub(&c->net->a_held, n);
	atomic_fetch_add(&c->net->a_freed, n);
}

/* Puts ch at the end of c's output queue. */
static void
net_oq_append(struct srv_nconn *c, struct srv_ochunk *ch)
{
	if (c->otail != NULL)
		c->otail->next = ch;
	else
		c->oq = ch;
	c->otail = ch;
}

static struct srv_ochunk *
net_chunk_new(struct srv_nconn *c, size_t cap)
{
	struct srv_ochunk *ch = malloc(sizeof(*ch) + cap);

	if (ch == NULL)
		return (NULL);
	memset(ch, 0, sizeof(*ch));
	ch->p = (const uint8_t *)(ch + 1);
	ch->cap = cap;
	net_oq_append(c, ch);
	return (ch);
}

bool
srv_nconn_put(struct srv_nconn *c, const void *p, size_t len)
{
	struct srv_ochunk *t = c->otail;

	if (c->dead)
		return (false);
	if (len == 0)
		return (true);
	if (t == NULL || t->cap == 0 || t->cap - t->len < len) {
		if ((t = net_chunk_new(c, len > 4096 ? len : 4096)) == NULL) {
			srv_nconn_close(c, "out of memory");
			return (false);
		}
	}
	memcpy((uint8_t *)(t + 1) + t->len, p, len);
	t->len += len;
	c->out += len;
	c->want_out = true;
	return (true);
}

bool
srv_nconn_put_msg(
    struct srv_nconn *c, const void *hdr, size_t hlen, nng_msg *msg)
{
	struct srv_ochunk *ch;

	if (!srv_nconn_put(c, hdr, hlen)) {
		if (msg != NULL)
			nng_msg_free(msg);
		return (false);
	}
	if (msg == NULL)
		return (true);
	if (nng_msg_len(msg) == 0) {
		nng_msg_free(msg);
		return (true);
	}
	if ((ch = calloc(1, sizeof(*ch))) == NULL) {
		nng_msg_free(msg);
		srv_nconn_close(c, "out of memory");
		return (false);
	}
	ch->p = nng_msg_body(msg);
	ch->len = nng_msg_len(msg);
	ch->msg = msg;
	net_oq_append(c, ch);
	c->out += ch->len;
	c->want_out = true;
	return (true);
}

bool
srv_nconn_busy_out(const struct srv_nconn *c)
{
	return (c->out > 0);
}

void
srv_nconn_flush(struct srv_nconn *c)
{
	while (!c->dead && c->oq != NULL) {
		struct iovec iov[32];
		struct msghdr mh;
		struct srv_ochunk *ch = c->oq;
		int k = 0;
		ssize_t w;

		for (; ch != NULL && k < 32; ch = ch->next, k++) {
			iov[k].iov_base = (void *)(ch->p + ch->off);
			iov[k].iov_len = ch->len - ch->off;
		}
		memset(&mh, 0, sizeof(mh));
		mh.msg_iov = iov;
		mh.msg_iovlen = (size_t)k;
		w = sendmsg(c->fd, &mh, MSG_NOSIGNAL);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN || errno == EWOULDBLOCK)
				break;
			if (c->rd_eof) {
				/* gone for good: its answers go nowhere */
				net_oq_free(c);
				break;
			}
			srv_nconn_close(c, "send failed");
			return;
		}
		c->out -= (uint64_t)w;
		while (w > 0 && c->oq != NULL) {
			ch = c->oq;
			if ((size_t)w < ch->len - ch->off) {
				ch->off += (size_t)w;
				break;
			}
			w -= (ssize_t)(ch->len - ch->off);
			c->oq = ch->next;
			if (c->oq == NULL)
				c->otail = NULL;
			if (ch->msg != NULL)
				nng_msg_free(ch->msg);
			free(ch);
		}
	}
	if (c->dead)
		return;
	c->want_out = c->oq != NULL;
	if (c->want_out && !c->rd_eof && c->max_out > 0
	    && c->out > c->max_out) {
		srv_nconn_refuse(c,
		    "it does not read its replies (%" PRIu64 " bytes queued)",
		    c->out);
		return;
	}
	net_watch(c);
}

/* ------------------------------------------------------------------------ */
/* The protocols' controls                                                  */
/* ------------------------------------------------------------------------ */

void
srv_nconn_deadline(
    struct srv_nconn *c, cohort__time at, bool warn, const char *why)
{
	c->deadline = at;
	c->deadline_warn = warn;
	cohort__strlcpy(
	    c->deadline_why, why != NULL ? why : "", sizeof(c->deadline_why));
}

void
srv_nconn_trust(struct srv_nconn *c)
{
	if (c->trusted || c->dead)
		return;
	net_untrack_pending(c);
	c->trusted = true;
}

void
srv_nconn_pause(struct srv_nconn *c, bool pause)
{
	if (c->rd_paused == pause)
		return;
	c->rd_paused = pause;
	net_watch(c);
}

void
srv_nconn_set_pipe(struct srv_nconn *c, uint32_t pipe)
{
	if (c->pipe != 0 || pipe == 0)
		return;
	c->pipe = pipe;
	if (srv_map_put(&c->net->pipes, &c->pn, &c->pipe, sizeof(c->pipe))
	    != COHORT_OK)
		c->pipe = 0;
}

void
srv_nconn_ref(struct srv_nconn *c)
{
	c->refs++;
}

/* ------------------------------------------------------------------------ */
/* Posting from other threads                                               */
/* ------------------------------------------------------------------------ */

static void
net_wake(struct srv_net *n)
{
	uint64_t one = 1;

	if (write(n->efd, &one, sizeof(one)) < 0) {
		/* the counter is non-zero already: the thread will look */
	}
}

static void
net_post(struct srv_net *n, struct srv_npost *p)
{
	p->next = NULL;
	pthread_mutex_lock(&n->mtx);
	*n->inbox_tail = p;
	n->inbox_tail = &p->next;
	pthread_mutex_unlock(&n->mtx);
	net_wake(n);
}

void
srv_net_post(struct srv_net *n, struct srv_nconn *c, struct srv_npost *p)
{
	p->c = c;
	p->close_pipe = 0;
	net_post(n, p);
}

void
srv_net_close_pipe(struct srv_net *n, uint32_t pipe)
{
	struct srv_npost *p;

	if (n == NULL || !srv_net_pipe_is_ours(pipe)
	    || (p = malloc(sizeof(*p))) == NULL)
		return;
	p->c = NULL;
	p->close_pipe = pipe;
	net_post(n, p);
}

static void
net_drain(struct srv_net *n, cohort__time now)
{
	struct srv_npost *p;
	uint64_t v;

	if (read(n->efd, &v, sizeof(v)) < 0) {
		/* nothing pending (EAGAIN): fine */
	}
	for (;;) {
		pthread_mutex_lock(&n->mtx);
		p = n->inbox;
		n->inbox = NULL;
		n->inbox_tail = &n->inbox;
		pthread_mutex_unlock(&n->mtx);
		if (p == NULL)
			return;
		while (p != NULL) {
			struct srv_npost *next = p->next;
			struct srv_nconn *c = p->c;
			if (c == NULL) {
				struct srv_hnode *h = srv_map_get(&n->pipes,
				    &p->close_pipe, sizeof(p->close_pipe));
				if (h != NULL)
					srv_nconn_close(
					    SRV_CONTAINER(
					        h, struct srv_nconn, pn),
					    "closed by the coordinator");
				free(p);
			} else {
				/* p belongs to the protocol from here */
				c->refs--;
				c->proto->delivered(c, p, now);
			}
			p = next;
		}
	}
}

/* ------------------------------------------------------------------------ */
/* The thread                                                               */
/* ------------------------------------------------------------------------ */

static void
net_deadlines(struct srv_net *n, cohort__time now)
{
	struct srv_link *l, *next;

	for (l = n->conns.next; l != &n->conns; l = next) {
		struct srv_nconn *c = SRV_CONTAINER(l, struct srv_nconn, link);
		next = l->next;
		if (c->deadline == 0 || now < c->deadline)
			continue;
		if (c->deadline_warn)
			srv_nconn_refuse(c, "%s", c->deadline_why);
		else
			srv_nconn_close(c, c->deadline_why);
		/* closing may free nothing yet, but may close others
		 * (never): the next pointer stays valid */
	}
}

/* ms until the next resting listener is due (cap: the default wait). */
static int
net_timeout(struct srv_net *n, cohort__time now)
{
	int t = 100;
	struct srv_link *l;

	for (l = n->listeners.next; l != &n->listeners; l = l->next) {
		struct srv_nlistener *x
		    = SRV_CONTAINER(l, struct srv_nlistener, link);
		if (x->resume_at != 0 && x->resume_at - now < t)
			t = x->resume_at <= now ? 0
			                        : (int)(x->resume_at - now);
	}
	return (t);
}

static void
net_resume(struct srv_net *n, cohort__time now)
{
	struct srv_link *l;

	for (l = n->listeners.next; l != &n->listeners; l = l->next) {
		struct srv_nlistener *x
		    = SRV_CONTAINER(l, struct srv_nlistener, link);
		if (x->resume_at != 0 && now >= x->resume_at) {
			x->resume_at = 0;
			net_listener_watch(x, true);
		}
	}
}

static void
net_event(struct srv_net *n, void *p, uint32_t ev, cohort__time now)
{
	int kind = *(int *)p;
	struct srv_nconn *c;

	if (kind == NET_WAKE) {
		net_drain(n, now);
		return;
	}
	if (kind == NET_LISTENER) {
		net_accept(
		    n, SRV_CONTAINER(p, struct srv_nlistener, kind), now);
		return;
	}
	c = SRV_CONTAINER(p, struct srv_nconn, kind);
	if (c->dead)
		return;
	if (ev & EPOLLOUT)
		srv_nconn_flush(c);
	if (c->dead)
		return;
	if (ev & (EPOLLIN | EPOLLRDHUP | EPOLLHUP | EPOLLERR)) {
		if (c->rd_eof || c->rd_paused) {
			/* hung up while we do not read: what it sent is
			 * applied, its answers go nowhere */
			if (ev & (EPOLLHUP | EPOLLERR)) {
				c->rd_eof = true;
				srv_nconn_flush(c);
				net_watch(c);
			}
			return;
		}
		c->proto->readable(c, now);
	}
}

static void *
net_thread(void *arg)
{
	struct srv_net *n = arg;
	struct epoll_event evs[64];
	cohort__time last_sweep = 0;

	while (!atomic_load(&n->stop)) {
		cohort__time now = cohort__now_ms();
		int k = epoll_wait(n->epfd, evs, 64, net_timeout(n, now));

		now = cohort__now_ms();
		for (int i = 0; i < k; i++)
			net_event(n, evs[i].data.ptr, evs[i].events, now);
		net_drain(n, now);
		if (now - last_sweep >= 50) {
			net_resume(n, now);
			net_deadlines(n, now);
			net_note(n, now);
			last_sweep = now;
		}
		net_reap(n);
	}
	return (NULL);
}

/* ------------------------------------------------------------------------ */
/* Setting up                                                               */
/* ------------------------------------------------------------------------ */

/* The soft limit on descriptors raised to the hard one (as nginx's
 * worker_rlimit_nofile and Go's runtime do); the soft limit after. */
static uint64_t
net_raise_nofile(void)
{
	struct rlimit rl;

	if (getrlimit(RLIMIT_NOFILE, &rl) != 0)
		return (1024);
	if (rl.rlim_cur < rl.rlim_max) {
		struct rlimit want = rl;
		want.rlim_cur
		    = rl.rlim_max == RLIM_INFINITY || rl.rlim_max > (1u << 20)
		    ? (1u << 20)
		    : rl.rlim_max;
		if (want.rlim_cur > rl.rlim_cur
		    && setrlimit(RLIMIT_NOFILE, &want) == 0)
			rl = want;
	}
	return (rl.rlim_cur == RLIM_INFINITY ? (1u << 20) : rl.rlim_cur);
}

cohort_status
srv_net_new(const struct srv_net_limits *lim, struct srv_net **out)
{
	struct srv_net *n = calloc(1, sizeof(*n));
	struct epoll_event ev;
	uint64_t room;

	if (n == NULL)
		return (COHORT_ENOMEM);
	n->lim = *lim;
	if (n->lim.max_pending_per_source == 0)
		n->lim.max_pending_per_source
		    = SRV_NET_DEFAULT_PENDING_PER_SOURCE;
	if (n->lim.max_pending_bytes == 0)
		n->lim.max_pending_bytes = SRV_NET_DEFAULT_PENDING_BYTES;
	n->fd_limit = net_raise_nofile();
	room = n->fd_limit > 2 * SRV_NET_FD_RESERVE
	    ? n->fd_limit - SRV_NET_FD_RESERVE
	    : n->fd_limit / 2;
	n->max_conns = lim->max_conns > 0 && lim->max_conns < room
	    ? lim->max_conns
	    : room;
	n->epfd = n->efd = n->reserve_fd = -1;
	srv_list_init(&n->listeners);
	srv_list_init(&n->conns);
	srv_list_init(&n->dead);
	srv_list_init(&n->pending);
	srv_map_init(&n->srcs);
	srv_map_init(&n->pipes);
	pthread_mutex_init(&n->mtx, NULL);
	n->inbox_tail = &n->inbox;
	n->wake_kind = NET_WAKE;
	n->epfd = epoll_create1(EPOLL_CLOEXEC);
	n->efd = eventfd(0, EFD_NONBLOCK | EFD_CLOEXEC);
	n->reserve_fd = open("/dev/null", O_RDONLY | O_CLOEXEC);
	if (n->epfd < 0 || n->efd < 0) {
		cohort_status rv = cohort__err(
		    COHORT_ESYSTEM, "epoll/eventfd: %s", strerror(errno));
		srv_net_free(n);
		return (rv);
	}
	memset(&ev, 0, sizeof(ev));
	ev.events = EPOLLIN;
	ev.data.ptr = &n->wake_kind;
	epoll_ctl(n->epfd, EPOLL_CTL_ADD, n->efd, &ev);
	*out = n;
	return (COHORT_OK);
}

/* "HOST:PORT", "[V6]:PORT", ":PORT" into host (empty: any) and port. */
static bool
net_split(const char *hostport, char *host, size_t hlen, const char **port)
{
	const char *colon = strrchr(hostport, ':');
	size_t n;

	if (colon == NULL || colon[1] == '\0')
		return (false);
	n = (size_t)(colon - hostport);
	if (n >= hlen)
		return (false);
	memcpy(host, hostport, n);
	host[n] = '\0';
	if (host[0] == '[' && n > 2 && host[n - 1] == ']') {
		memmove(host, host + 1, n - 2);
		host[n - 2] = '\0';
	}
	*port = colon + 1;
	return (true);
}

cohort_status
srv_net_listen(struct srv_net *n, const char *hostport,
    const struct srv_proto *p, void *arg, const char *what,
    struct srv_nlistener **out)
{
	struct srv_nlistener *l;
	char host[256], h[INET6_ADDRSTRLEN], ps[16];
	const char *port;
	struct addrinfo hints, *res = NULL;
	struct sockaddr_storage sa;
	socklen_t sl = sizeof(sa);
	int one = 1, rv, e;

	if (!net_split(hostport, host, sizeof(host), &port))
		return (cohort__err(COHORT_EINVAL,
		    "%s '%s': expected ADDR:PORT", what, hostport));
	memset(&hints, 0, sizeof(hints));
	hints.ai_family = AF_UNSPEC;
	hints.ai_socktype = SOCK_STREAM;
	hints.ai_flags = AI_PASSIVE;
	if ((rv = getaddrinfo(host[0] ? host : NULL, port, &hints, &res)) != 0)
		return (cohort__err(COHORT_EINVAL, "%s '%s': %s", what,
		    hostport, gai_strerror(rv)));
	if ((l = calloc(1, sizeof(*l))) == NULL) {
		freeaddrinfo(res);
		return (COHORT_ENOMEM);
	}
	l->kind = NET_LISTENER;
	l->net = n;
	l->proto = p;
	l->arg = arg;
	cohort__strlcpy(l->what, p->name, sizeof(l->what));
	l->fd = socket(res->ai_family,
	    res->ai_socktype | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (l->fd < 0) {
		e = errno;
		freeaddrinfo(res);
		free(l);
		return (cohort__err(COHORT_ESYSTEM, "%s '%s': socket: %s",
		    what, hostport, strerror(e)));
	}
	(void)setsockopt(l->fd, SOL_SOCKET, SO_REUSEADDR, &one, sizeof(one));
	if (bind(l->fd, res->ai_addr, res->ai_addrlen) != 0
	    || listen(l->fd, SRV_LISTEN_BACKLOG) != 0) {
		e = errno;
		freeaddrinfo(res);
		close(l->fd);
		free(l);
		return (
		    cohort__err(COHORT_ESYSTEM, "%s: cannot listen on %s: %s",
		        what, hostport, strerror(e)));
	}
	freeaddrinfo(res);
	if (getsockname(l->fd, (struct sockaddr *)&sa, &sl) != 0
	    || getnameinfo((struct sockaddr *)&sa, sl, h, sizeof(h), ps,
	           sizeof(ps), NI_NUMERICHOST | NI_NUMERICSERV)
	        != 0) {
		e = errno;
		close(l->fd);
		free(l);
		return (cohort__err(
		    COHORT_ESYSTEM, "getsockname: %s", strerror(e)));
	}
	snprintf(l->addr, sizeof(l->addr),
	    strchr(h, ':') != NULL ? "[%s]:%s" : "%s:%s", h, ps);
	srv_list_append(&n->listeners, &l->link);
	net_listener_watch(l, true);
	*out = l;
	return (COHORT_OK);
}

const char *
srv_nlistener_addr(const struct srv_nlistener *l)
{
	return (l->addr);
}

void
srv_nlistener_set_what(struct srv_nlistener *l, const char *what)
{
	cohort__strlcpy(l->what, what, sizeof(l->what));
}

cohort_status
srv_net_start(struct srv_net *n)
{
	if (n->started)
		return (COHORT_OK);
	if (pthread_create(&n->thread, NULL, net_thread, n) != 0)
		return (cohort__err(COHORT_ESYSTEM, "pthread_create"));
	n->started = true;
	return (COHORT_OK);
}

bool
srv_net_on_thread(const struct srv_net *n)
{
	return (n->started && pthread_equal(pthread_self(), n->thread));
}

bool
srv_net_stopping(const struct srv_net *n)
{
	return (n->stopped);
}

void
srv_net_stop(struct srv_net *n)
{
	cohort__time now = cohort__now_ms();

	if (n == NULL || n->stopped)
		return;
	n->stopped = true;
	if (n->started) {
		atomic_store(&n->stop, true);
		net_wake(n);
		pthread_join(n->thread, NULL);
		n->started = false;
	}
	while (!srv_list_empty(&n->listeners)) {
		struct srv_nlistener *l = SRV_CONTAINER(
		    n->listeners.next, struct srv_nlistener, link);
		srv_list_remove(&l->link);
		close(l->fd);
		free(l);
	}
	net_drain(n, now);
	while (!srv_list_empty(&n->conns))
		srv_nconn_close(
		    SRV_CONTAINER(n->conns.next, struct srv_nconn, link),
		    "shutting down");
	net_drain(n, now);
	net_reap(n);
}

void
srv_net_free(struct srv_net *n)
{
	struct srv_hnode *h;
	size_t i;

	if (n == NULL)
		return;
	srv_net_stop(n);
	/* Whatever still holds a reference is not coming back now. */
	while (!srv_list_empty(&n->dead)) {
		struct srv_nconn *c
		    = SRV_CONTAINER(n->dead.next, struct srv_nconn, link);
		srv_list_remove(&c->link);
		if (c->proto->fini != NULL)
			c->proto->fini(c);
		free(c);
	}
	while ((h = srv_map_next(&n->srcs, &i, NULL)) != NULL) {
		srv_map_del(&n->srcs, h);
		free(SRV_CONTAINER(h, struct srv_nsrc, hn));
	}
	srv_map_fini(&n->srcs);
	srv_map_fini(&n->pipes);
	COHORT__CLOSE_ALL(n->epfd, n->efd, n->reserve_fd);
	pthread_mutex_destroy(&n->mtx);
	free(n);
}

uint64_t
srv_net_freed(struct srv_net *n, bool reset)
{
	if (n == NULL)
		return (0);
	return (reset ? atomic_exchange(&n->a_freed, 0)
	              : atomic_load(&n->a_freed));
}

void
srv_net_stats(struct srv_net *n, struct srv_net_stats *st)
{
	memset(st, 0, sizeof(*st));
	if (n == NULL)
		return;
	st->conns = atomic_load(&n->a_conns);
	st->pending_bytes = atomic_load(&n->a_held);
	st->refused = atomic_load(&n->a_refused);
	st->evicted = atomic_load(&n->a_evicted);
	st->emfile = atomic_load(&n->a_emfile);
	st->limit_refusals = atomic_load(&n->a_limit_refusals);
	st->max_conns = n->max_conns;
	st->fd_limit = n->fd_limit;
}
