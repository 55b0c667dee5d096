/*
 * nng_rep.c - cohortd's nng front end: a rep0 socket, a pool of nng
 * contexts, pipe events and the sweep timer around the socket-free
 * coordinator (dispatch.h, events.h), and the one server mutex.
 *
 * Threads: none of our own. Requests are handled directly in nng's aio
 * callbacks under one mutex (a hand-off to another thread would cost a
 * scheduler wake-up per request). Replies produced under the mutex are
 * queued in an outbox and sent after it is released.
 *
 * Contexts: `pool` contexts always wait in nng_ctx_recv. A request that
 * parks keeps its context (the reply must leave through it), and an idle
 * or new context takes its place in the receiving pool; after a reply is
 * sent, the context receives again if the pool is short, or goes idle.
 * Contexts are freed only at stop (freeing an aio from its own callback
 * would deadlock).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <malloc.h>
#include <pthread.h>
#include <sys/socket.h>
#include <unistd.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/rep.h>

#include "tls.h"
#include "core/pipes.h"
#include "core/util.h"
#include "journal/log.h"
#include "dispatch.h"
#include "events.h"
#include "net.h"
#include "nng_rep.h"

enum srvctx_state {
	SRVCTX_RECV, /* nng_ctx_recv pending */
	SRVCTX_BUSY, /* request being handled, or parked in the core */
	SRVCTX_REPLY, /* the core answered; queued in the outbox */
	SRVCTX_SEND, /* nng_ctx_send pending */
	SRVCTX_IDLE, /* spare */
};

struct srvctx {
	struct srv_tp tp; /* first; deliver NULL: replies go to the outbox */
	struct srv_nng *srv;
	nng_ctx ctx;
	nng_aio *aio;
	enum srvctx_state state;
	struct srvctx *all_next;
	struct srvctx *idle_next;
	struct srvctx *out_next;
	nng_msg *out_msg; /* reply to send; NULL = recycle */
};

struct srv_nng {
	nng_socket sock;
	bool sock_open;
	pthread_mutex_t mtx;
	pthread_cond_t cv;
	struct srv_core *core;
	bool stopping;
	uint32_t pool;
	uint32_t nrecv;
	uint32_t nsend;
	struct srvctx *all;
	struct srvctx *idle;
	struct srvctx *out_head;
	struct srvctx **out_tail;
	nng_aio *sweep;
	char **urls;
	size_t nurls;
	/* cohortd's own listeners (tcp://, TCPStore, HTTP): their
	 * connections are closed through it */
	struct srv_net *net;
	cohort__time idle_since; /* last time a client was connected */
	/* The clock of the previous sweep: the loop lag is the time since,
	 * less the interval. Measured from the previous sweep's own clock
	 * read (not from when its timer was re-armed), a stop that hits a
	 * sweep between its clock read and its end is seen by the next. */
	cohort__time last_sweep;
	/* malloc_trim: the KV bytes high-water mark since the last trim */
	uint64_t trim_hw;
};

static void srvctx_cb(void *arg);

/* Sink of the core, called under mtx: queue for sending after unlock. */
static void
rep_sink(void *arg, void *tp, nng_msg *reply)
{
	struct srv_nng *s = arg;
	struct srvctx *x = tp;

	if (((struct srv_tp *)tp)->deliver != NULL) {
		/* another front end's request (TCPStore) */
		((struct srv_tp *)tp)->deliver(tp, reply);
		return;
	}
	if (x->state == SRVCTX_REPLY) {
		/* Already queued in this turn: a second answer for one
		 * exchange is a bug; keep the first, never corrupt the
		 * outbox or leak. */
		cohort__warn("second reply for one request context dropped");
		if (reply != NULL)
			nng_msg_free(reply);
		return;
	}
	x->state = SRVCTX_REPLY;
	x->out_msg = reply;
	x->out_next = NULL;
	*s->out_tail = x;
	s->out_tail = &x->out_next;
}

static struct srvctx *
srvctx_new(struct srv_nng *s)
{
	struct srvctx *x = calloc(1, sizeof(*x));

	if (x == NULL)
		return (NULL);
	x->tp.deliver = NULL;
	x->srv = s;
	if (nng_aio_alloc(&x->aio, srvctx_cb, x) != 0) {
		free(x);
		return (NULL);
	}
	if (nng_ctx_open(&x->ctx, s->sock) != 0) {
		nng_aio_free(x->aio);
		free(x);
		return (NULL);
	}
	x->all_next = s->all;
	s->all = x;
	return (x);
}

/* Under mtx: pick a context to receive (idle or new), mark it. */
static struct srvctx *
rep_take_receiver(struct srv_nng *s)
{
	struct srvctx *x = s->idle;

	if (x != NULL)
		s->idle = x->idle_next;
	else if ((x = srvctx_new(s)) == NULL)
		return (NULL);
	x->state = SRVCTX_RECV;
	s->nrecv++;
	return (x);
}

/* Under mtx: a context whose exchange is over. Returns true if the
 * caller must start nng_ctx_recv on it (after unlocking). */
static bool
rep_recycle(struct srv_nng *s, struct srvctx *x)
{
	if (!s->stopping && s->nrecv < s->pool) {
		x->state = SRVCTX_RECV;
		s->nrecv++;
		return (true);
	}
	x->state = SRVCTX_IDLE;
	x->idle_next = s->idle;
	s->idle = x;
	return (false);
}

/* Sends everything queued, after mtx was released. */
static void
rep_flush(struct srv_nng *s, struct srvctx *head)
{
	while (head != NULL) {
		struct srvctx *x = head;
		head = x->out_next;
		if (x->out_msg != NULL) {
			nng_aio_set_msg(x->aio, x->out_msg);
			x->out_msg = NULL;
			nng_ctx_send(x->ctx, x->aio);
		} else {
			nng_ctx_recv(x->ctx, x->aio);
		}
	}
}

/* Under mtx: takes the outbox, marking each entry for rep_flush. */
static struct srvctx *
rep_take_outbox(struct srv_nng *s)
{
	struct srvctx *head = s->out_head, *x, **pp;

	s->out_head = NULL;
	s->out_tail = &s->out_head;
	/* Replies go out as SEND; dropped ones are recycled (and leave the
	 * list if they must not receive). */
	for (pp = &head; (x = *pp) != NULL;) {
		if (x->out_msg != NULL) {
			x->state = SRVCTX_SEND;
			s->nsend++;
			pp = &x->out_next;
		} else if (rep_recycle(s, x)) {
			pp = &x->out_next;
		} else {
			*pp = x->out_next;
		}
	}
	return (head);
}

static void
srvctx_cb(void *arg)
{
	struct srvctx *x = arg;
	struct srv_nng *s = x->srv;
	int rv = nng_aio_result(x->aio);
	struct srvctx *out, *extra = NULL;
	bool again = false;
	nng_msg *msg;

	pthread_mutex_lock(&s->mtx);
	if (x->state == SRVCTX_SEND) {
		s->nsend--;
		if (rv != 0 && (msg = nng_aio_get_msg(x->aio)) != NULL)
			nng_msg_free(msg);
		if (s->stopping) {
			x->state = SRVCTX_IDLE;
			pthread_cond_broadcast(&s->cv);
		} else {
			again = rep_recycle(s, x);
		}
		pthread_mutex_unlock(&s->mtx);
		if (again)
			nng_ctx_recv(x->ctx, x->aio);
		return;
	}
	/* SRVCTX_RECV */
	s->nrecv--;
	if (rv != 0 || s->stopping) {
		if (rv == 0 && (msg = nng_aio_get_msg(x->aio)) != NULL)
			nng_msg_free(msg);
		if (s->stopping || rv == NNG_ECLOSED) {
			x->state = SRVCTX_IDLE;
			pthread_mutex_unlock(&s->mtx);
			return;
		}
		again = rep_recycle(s, x);
		pthread_mutex_unlock(&s->mtx);
		if (again)
			nng_ctx_recv(x->ctx, x->aio);
		return;
	}
	msg = nng_aio_get_msg(x->aio);
	nng_aio_set_msg(x->aio, NULL);
	x->state = SRVCTX_BUSY;
	srv_core_dispatch(
	    s->core, msg, nng_msg_get_pipe(msg).id, x, cohort__now_ms());
	if (x->state == SRVCTX_BUSY)
		extra = rep_take_receiver(s); /* parked: keep the pool full */
	out = rep_take_outbox(s);
	pthread_mutex_unlock(&s->mtx);
	rep_flush(s, out);
	if (extra != NULL)
		nng_ctx_recv(extra->ctx, extra->aio);
}

static void
rep_pipe_cb(nng_pipe p, nng_pipe_ev ev, void *arg)
{
	struct srv_nng *s = arg;
	struct srvctx *out;

	pthread_mutex_lock(&s->mtx);
	if (s->stopping) {
		pthread_mutex_unlock(&s->mtx);
		return;
	}
	if (ev == NNG_PIPE_EV_ADD_POST) {
		nng_sockaddr sa;
		srv_pipe_opened(s->core, p.id, cohort__now_ms());
		/* the peer's address, for the TCPStore door */
		if (nng_pipe_get_addr(p, NNG_OPT_REMADDR, &sa) == 0) {
			if (sa.s_family == NNG_AF_INET)
				srv_pipe_set_addr(
				    s->core, p.id, &sa.s_in.sa_addr, 4);
			else if (sa.s_family == NNG_AF_INET6)
				srv_pipe_set_addr(
				    s->core, p.id, sa.s_in6.sa_addr, 16);
		}
	} else
		srv_core_pipe_closed(s->core, p.id, cohort__now_ms());
	out = rep_take_outbox(s);
	pthread_mutex_unlock(&s->mtx);
	rep_flush(s, out);
}

#define SRV_SWEEP_MS 100
/* Give freed memory back to the system once this much of keys and values
 * was freed since the last time (docs/coordinator.md, Memory). */
#define SRV_TRIM_BYTES (64u << 20)

/* Under mtx: whether the sweep should call malloc_trim (after unlock).
 * glibc keeps freed chunks of its heaps (and, with its dynamic mmap
 * threshold, even large values end up there), so RSS would stay at the
 * peak after big jobs went away: trimmed once 64 MiB of keys and
 * values, parked requests (their keys, their messages) or requests that
 * were arriving on cohortd's own connections were freed. */
static bool
rep_trim_due(struct srv_nng *s)
{
	uint64_t b = s->core->kv_bytes;
	uint64_t freed = s->core->freed_bytes + srv_net_freed(s->net, false);

	if (b > s->trim_hw)
		s->trim_hw = b;
	if (s->trim_hw - b < SRV_TRIM_BYTES && freed < SRV_TRIM_BYTES)
		return (false);
	s->trim_hw = b;
	s->core->freed_bytes = 0;
	(void)srv_net_freed(s->net, true);
	return (true);
}

static void
rep_sweep_cb(void *arg)
{
	struct srv_nng *s = arg;
	struct srvctx *out;
	uint32_t closes[SRV_CLOSE_PIPES];
	cohort__time now;
	size_t nclose;
	bool trim;
	int sfd;
	struct srv_jrn_mark mark;

	if (nng_aio_result(s->sweep) != 0)
		return;
	pthread_mutex_lock(&s->mtx);
	if (s->stopping) {
		pthread_mutex_unlock(&s->mtx);
		return;
	}
	now = cohort__now_ms();
	/* Loop lag: how late this sweep runs (the mutex included). A
	 * stall (SIGSTOP, VM pause) delays it by the whole pause. */
	srv_core_loop_lag(s->core, now - s->last_sweep - SRV_SWEEP_MS, now);
	s->last_sweep = now;
	srv_core_sweep(s->core, now);
	nclose = srv_pipes_take_to_close(s->core, cohort__now_ms(), closes,
	    sizeof(closes) / sizeof(closes[0]));
	nclose += srv_core_take_idle_pipes(s->core, now, closes + nclose,
	    sizeof(closes) / sizeof(closes[0]) - nclose);
	trim = rep_trim_due(s);
	sfd = srv_jrn_sync_fd(s->core->jrn, &mark);
	out = rep_take_outbox(s);
	pthread_mutex_unlock(&s->mtx);
	rep_flush(s, out);
	for (size_t i = 0; i < nclose; i++) {
		nng_pipe p;
		if (srv_net_pipe_is_ours(closes[i])) {
			srv_net_close_pipe(s->net, closes[i]);
			continue;
		}
		p.id = closes[i];
		(void)nng_pipe_close(p); /* gone already: fine */
	}
	/* The batched fdatasync, off the mutex (on a duplicate, so that a
	 * compaction may replace the log meanwhile). */
	if (sfd >= 0) {
		if (fdatasync(sfd) != 0) {
			int e = errno;
			pthread_mutex_lock(&s->mtx);
			srv_jrn_sync_failed(s->core->jrn, e);
			pthread_mutex_unlock(&s->mtx);
		} else {
			/* what is on the disk now, for telling a cut log
			 * from a torn one at the next start */
			srv_jrn_mark_synced(&mark);
		}
		close(sfd);
	} else {
		srv_jrn_mark_synced(&mark); /* --fsync always */
	}
#ifdef __GLIBC__
	if (trim)
		(void)malloc_trim(0);
#endif
	nng_sleep_aio(SRV_SWEEP_MS, s->sweep);
}

/*
 * nng 1.5.2 listens with a fixed backlog of 128. When hundreds of workers
 * start at once (a 1024-rank job), the accept queue overflows, the kernel
 * drops or cookies their SYNs, and each retries after the 1 s SYN timeout:
 * the rendezvous takes seconds instead of milliseconds. nng has no option
 * for it, so cohortd finds its own listening socket for the bound port and
 * calls listen() again with SRV_LISTEN_BACKLOG (Linux updates it in
 * place; the kernel caps it at net.core.somaxconn).
 */

static void
rep_widen_backlog(nng_listener l)
{
	nng_sockaddr sa;
	int port;

	if (nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) != 0)
		return;
	if (sa.s_family == NNG_AF_INET)
		port = ntohs(sa.s_in.sa_port);
	else if (sa.s_family == NNG_AF_INET6)
		port = ntohs(sa.s_in6.sa_port);
	else
		return;
	for (int fd = 0; fd < 4096; fd++) {
		struct sockaddr_storage ss;
		socklen_t len = sizeof(ss);
		int acc = 0;
		socklen_t alen = sizeof(acc);
		int p;

		if (getsockopt(fd, SOL_SOCKET, SO_ACCEPTCONN, &acc, &alen) != 0
		    || !acc)
			continue;
		if (getsockname(fd, (struct sockaddr *)&ss, &len) != 0)
			continue;
		if (ss.ss_family == AF_INET)
			p = ntohs(((struct sockaddr_in *)&ss)->sin_port);
		else if (ss.ss_family == AF_INET6)
			p = ntohs(((struct sockaddr_in6 *)&ss)->sin6_port);
		else
			continue;
		if (p == port && listen(fd, SRV_LISTEN_BACKLOG) == 0)
			cohort__debug("listen backlog of port %d raised to %d",
			    port, SRV_LISTEN_BACKLOG);
	}
}

/* A tls+tcp:// listener with cohortd's certificate (cfg->tls_*). */
static cohort_status
rep_listen_tls(struct srv_nng *s, const struct cohort__srv_config *cfg,
    const char *url, nng_listener *out)
{
	nng_tls_config *tc = NULL;
	nng_listener l;
	cohort_status rv;
	int nrv;

	if ((rv = cohort__tls_config(&tc, true, cfg->tls_cert, cfg->tls_key,
	         cfg->tls_ca, NULL, cfg->tls_verify_clients))
	    != COHORT_OK)
		return (rv);
	if ((nrv = nng_listener_create(&l, s->sock, url)) != 0
	    || (nrv = nng_listener_set_ptr(l, NNG_OPT_TLS_CONFIG, tc)) != 0
	    || (nrv = nng_listener_start(l, 0)) != 0) {
		nng_tls_config_free(tc);
		return (cohort__err(cohort__from_nng(nrv),
		    "cannot listen on %s: %s", url, nng_strerror(nrv)));
	}
	nng_tls_config_free(tc); /* the listener holds its own reference */
	cohort__info("TLS on %s: certificate %s%s%s", url, cfg->tls_cert,
	    cfg->tls_verify_clients ? ", client certificates required from "
	                              "CA "
	                            : "",
	    cfg->tls_verify_clients ? cfg->tls_ca : "");
	*out = l;
	return (COHORT_OK);
}

/* "tcp://host:0" with the port bound. */
static char *
rep_bound_url(const char *url, nng_listener l)
{
	nng_sockaddr sa;
	const char *colon;
	char buf[512];
	unsigned port;

	if (nng_listener_get_addr(l, NNG_OPT_LOCADDR, &sa) != 0
	    || (sa.s_family != NNG_AF_INET && sa.s_family != NNG_AF_INET6)
	    || (colon = strrchr(url, ':')) == NULL)
		return (srv_strdup(url));
	port = sa.s_family == NNG_AF_INET ? sa.s_in.sa_port : sa.s_in6.sa_port;
	port = ((port & 0xff) << 8) | ((port >> 8) & 0xff);
	snprintf(buf, sizeof(buf), "%.*s:%u", (int)(colon - url), url, port);
	return (srv_strdup(buf));
}

void
srv_with_core(struct srv_nng *s,
    void (*fn)(void *arg, struct srv_core *core, cohort__time now), void *arg)
{
	struct srvctx *out;

	pthread_mutex_lock(&s->mtx);
	if (s->stopping) {
		pthread_mutex_unlock(&s->mtx);
		return;
	}
	fn(arg, s->core, cohort__now_ms());
	out = rep_take_outbox(s);
	pthread_mutex_unlock(&s->mtx);
	rep_flush(s, out);
}

static void
rep_pipe_closed_locked(void *arg, struct srv_core *core, cohort__time now)
{
	const uint32_t *pipe = arg;

	srv_core_pipe_closed(core, *pipe, now);
}

void
srv_with_core_pipe_closed(struct srv_nng *s, uint32_t pipe)
{
	srv_with_core(s, rep_pipe_closed_locked, &pipe);
}

cohort_status
srv_nng_new(const struct srv_limits *lim, const char *admin_token,
    uint32_t pool, struct srv_nng **out)
{
	struct srv_nng *s = calloc(1, sizeof(*s));
	cohort_status rv;

	if (s == NULL)
		return (COHORT_ENOMEM);
	pthread_mutex_init(&s->mtx, NULL);
	pthread_cond_init(&s->cv, NULL);
	s->pool = pool;
	s->out_tail = &s->out_head;
	if ((rv = srv_core_new(
	         lim, admin_token, rep_sink, s, cohort__now_ms(), &s->core))
	    != COHORT_OK) {
		srv_nng_free(s);
		return (rv);
	}
	*out = s;
	return (COHORT_OK);
}

struct srv_core *
srv_nng_core(struct srv_nng *s)
{
	return (s->core);
}

void
srv_nng_set_net(struct srv_nng *s, struct srv_net *net)
{
	s->net = net;
}

cohort_status
srv_nng_listen(struct srv_nng *s, const struct cohort__srv_config *cfg,
    const char *const *urls, size_t nurls)
{
	cohort_status rv;
	int nrv;

	if ((s->urls = calloc(nurls ? nurls : 1, sizeof(char *))) == NULL)
		return (COHORT_ENOMEM);
	if ((nrv = nng_rep0_open(&s->sock)) != 0)
		return (cohort__err(cohort__from_nng(nrv), "nng_rep0_open: %s",
		    nng_strerror(nrv)));
	s->sock_open = true;
	nng_socket_set_size(s->sock, NNG_OPT_RECVMAXSZ,
	    (size_t)s->core->lim.max_value + COHORT__ENVELOPE_ALLOWANCE);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, rep_pipe_cb, s);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, rep_pipe_cb, s);
	if (nng_aio_alloc(&s->sweep, rep_sweep_cb, s) != 0)
		return (COHORT_ENOMEM);
	for (size_t i = 0; i < nurls; i++) {
		nng_listener l;
		if (cohort__tls_url(urls[i])) {
			if ((rv = rep_listen_tls(s, cfg, urls[i], &l))
			    != COHORT_OK)
				return (rv);
		} else if ((nrv = nng_listen(s->sock, urls[i], &l, 0)) != 0) {
			return (cohort__err(cohort__from_nng(nrv),
			    "cannot listen on %s: %s", urls[i],
			    nng_strerror(nrv)));
		}
		if ((s->urls[i] = rep_bound_url(urls[i], l)) == NULL)
			return (COHORT_ENOMEM);
		s->nurls++;
		rep_widen_backlog(l);
	}
	pthread_mutex_lock(&s->mtx);
	for (uint32_t i = 0; i < s->pool; i++) {
		struct srvctx *x = rep_take_receiver(s);
		if (x == NULL) {
			pthread_mutex_unlock(&s->mtx);
			return (COHORT_ENOMEM);
		}
		nng_ctx_recv(x->ctx, x->aio);
	}
	pthread_mutex_unlock(&s->mtx);
	return (COHORT_OK);
}

void
srv_nng_start_sweep(struct srv_nng *s)
{
	s->last_sweep = cohort__now_ms();
	nng_sleep_aio(SRV_SWEEP_MS, s->sweep);
}

const char *
srv_nng_url(const struct srv_nng *s, size_t i)
{
	return (i < s->nurls ? s->urls[i] : NULL);
}

uint64_t
srv_nng_idle_ms(struct srv_nng *s)
{
	cohort__time now = cohort__now_ms();
	uint64_t idle = 0;

	pthread_mutex_lock(&s->mtx);
	if (s->core->pipes.n > 0 || s->idle_since == 0)
		s->idle_since = now;
	else
		idle = (uint64_t)(now - s->idle_since);
	pthread_mutex_unlock(&s->mtx);
	return (idle);
}

/* No more pipe events, then the socket closes. */
static void
rep_close_sock(struct srv_nng *s)
{
	if (!s->sock_open)
		return;
	nng_pipe_notify(s->sock, NNG_PIPE_EV_ADD_POST, NULL, NULL);
	nng_pipe_notify(s->sock, NNG_PIPE_EV_REM_POST, NULL, NULL);
	nng_close(s->sock);
	s->sock_open = false;
}

void
srv_nng_free(struct srv_nng *s)
{
	if (s == NULL)
		return;
	s->stopping = true;
	rep_close_sock(s);
	while (s->all != NULL) {
		struct srvctx *x = s->all;
		s->all = x->all_next;
		nng_aio_free(x->aio);
		free(x);
	}
	if (s->sweep != NULL)
		nng_aio_free(s->sweep);
	srv_core_free(s->core);
	for (size_t i = 0; s->urls != NULL && i < s->nurls; i++)
		free(s->urls[i]);
	free(s->urls);
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mtx);
	free(s);
}

void
srv_nng_stop(struct srv_nng *s)
{
	struct srvctx *out;
	cohort__time deadline;

	if (s->sweep != NULL)
		nng_aio_stop(s->sweep);
	pthread_mutex_lock(&s->mtx);
	s->stopping = true;
	srv_core_close_all(s->core);
	out = rep_take_outbox(s);
	pthread_mutex_unlock(&s->mtx);
	rep_flush(s, out);
	/* Let the final replies leave (bounded). */
	deadline = cohort__now_ms() + 1000;
	pthread_mutex_lock(&s->mtx);
	while (s->nsend > 0 && !cohort__expired(deadline)) {
		struct timespec ts;
		clock_gettime(CLOCK_REALTIME, &ts);
		ts.tv_nsec += 20 * 1000000L;
		if (ts.tv_nsec >= 1000000000L) {
			ts.tv_sec++;
			ts.tv_nsec -= 1000000000L;
		}
		pthread_cond_timedwait(&s->cv, &s->mtx, &ts);
	}
	pthread_mutex_unlock(&s->mtx);
	srv_nng_free(s);
}
