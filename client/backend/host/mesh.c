/*
 * mesh.c - the host backend's connections: one authenticated TCP
 * connection per pair of ranks that an operation needs, made on first
 * use.
 *
 * Open (init; waits for nobody):
 *  1. Listen on bind_addr (default 127.0.0.1), ephemeral port; the
 *     listener stays open while connections may still be made.
 *  2. Publish "host:port" under tcp/<group_id>/<generation>/addr/<rank>
 *     (one KV set; the key is the one earlier releases used).
 *
 * Connect (host_mesh_connect, for the peers one step needs; both ends of
 * every pair ask for each other in the same step):
 *  - for every higher peer not connected: read its address (one KV get,
 *    which waits until it is published), start a non-blocking connect;
 *  - then one poll loop progresses everything at once: connects (retried
 *    while refused, within COHORT_CONNECT_TIMEOUT_MS), the connector's
 *    handshakes, the listener and the pending handshakes of the lower
 *    peers (and of any other lower peer already in a later operation).
 *  Nothing waits on another rank's progress in anything but that rank's
 *  own connect step, so there is no order to deadlock on. Cost per
 *  connection: one KV read, three handshake messages.
 *
 * Handshake (mutual, HMAC-SHA-256 keyed with the job's secret; messages
 * and parsers in handshake.c):
 *   acceptor -> connector  "CHS1" version rank_a nonce_a[16]         (28 B)
 *   connector -> acceptor  "CHC1" ident[32] rank_c rank_a nonce_c[16]
 *                          mac_c[32]                                 (92 B)
 *   acceptor -> connector  "CHA1" mac_a[32]                          (36 B)
 *                       or "CHR1" reason                              (8 B)
 *  ident = SHA-256("cohort-tcp-v1" 0 job 0 group_id 0 generation(be64)),
 *  mac_x = HMAC(secret, "C" or "A", ident, nonce_a, nonce_c, rank_c,
 *  rank_a). The acceptor refuses a connection whose ident, ranks or proof
 *  are wrong (another job, group or generation, a stale process, a stray
 *  client), saying why in a CHR1 before it closes. The connector checks
 *  mac_a, so it only sends tensors to a peer that knows the secret. Fresh
 *  nonces on both sides defeat replay.
 *
 * Strangers cannot block the mesh: the acceptor holds at most
 * MESH_MAX_PENDING connections in the handshake, at most MESH_PER_SOURCE
 * of them from one IP address, and a connection that has not sent its
 * hello within COHORT_TCP_HS_TIMEOUT_MS (2 s) is dropped. A newcomer is
 * never turned away: it evicts the oldest pending connection of its own
 * source when that source is at its share, or of the source holding the
 * most when the table is full. A connector that is evicted (told BUSY) or
 * closed on before its hello was judged connects again while its connect
 * window lasts, so a real peer gets in even through a flood from its own
 * address; it only reports EAUTH when the acceptor judged its proof.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <netinet/in.h>
#include <netinet/tcp.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <sys/mman.h>
#include <sys/socket.h>
#include <unistd.h>

#include "host_impl.h"

/* A connection must send its hello within this time after the greeting
 * (COHORT_TCP_HS_TIMEOUT_MS). */
#define MESH_HS_TIMEOUT_MS 2000
/* Connections handshaking at once at an acceptor, and from one source
 * address; a newcomer evicts an older one (handshake.h). */
#define MESH_MAX_PENDING 64
#define MESH_PER_SOURCE 16
/* How long a rank tries to connect to a peer (COHORT_CONNECT_TIMEOUT_MS). */
#define MESH_CONNECT_TIMEOUT_MS 10000
/* Wait between connection attempts to a listener that refused. */
#define MESH_RETRY_MS 20
/* Longest sleep in poll() (the abort flag is checked between sleeps). */
#define MESH_POLL_MS 100

struct mesh_addr {
	struct sockaddr_storage ss;
	socklen_t len;
};

/* The connector's progress with one higher peer. */
enum mesh_phase {
	DIAL_CONNECTING = 1, /* connect() in progress */
	DIAL_RETRY, /* refused or dropped: connect again at retry_at */
	DIAL_GREETING, /* waiting for the acceptor's greeting */
	DIAL_HELLO, /* sending our hello */
	DIAL_ANSWER, /* waiting for the accept (or a refusal) */
};

struct mesh_dial {
	int fd;
	enum mesh_phase phase;
	struct mesh_addr addr;
	char shown[160];
	uint8_t in[COHORT__TCP_ACCEPT_LEN];
	size_t have, need;
	uint8_t na[16], nc[16];
	uint8_t ch[COHORT__TCP_CHELLO_LEN];
	size_t sent;
	cohort__time start; /* first attempt */
	cohort__time window; /* connect attempts until */
	cohort__time hs_deadline; /* the answer is due by */
	cohort__time retry_at;
	int attempts;
	bool refreshed; /* the window was renewed after a drop */
	int soerr; /* the last connect error */
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

void *
host_zalloc(size_t n, size_t size)
{
	void *p;

	if (n == 0 || size == 0)
		return (calloc(1, 1));
	if (n > SIZE_MAX / size)
		return (NULL);
	if (n * size < HOST_ZALLOC_MAP)
		return (calloc(n, size));
	p = mmap(NULL, n * size, PROT_READ | PROT_WRITE,
	    MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
	return (p == MAP_FAILED ? NULL : p);
}

void
host_zfree(void *p, size_t n, size_t size)
{
	if (p == NULL)
		return;
	if (n == 0 || size == 0 || n * size < HOST_ZALLOC_MAP)
		free(p);
	else
		(void)munmap(p, n * size);
}

size_t
host_knob(enum cohort__knob k, size_t dflt)
{
	int64_t v = cohort__knob_int_or(k, -2);

	if (v == -2)
		return (dflt);
	return (v < 0 ? SIZE_MAX : (size_t)v);
}

static bool
mesh_aborted(const struct host_mesh *m)
{
	return (atomic_load_explicit(
	            (atomic_int *)&m->aborted, memory_order_acquire)
	    || (m->abort_flag != NULL
	        && atomic_load_explicit(m->abort_flag, memory_order_acquire)));
}

cohort_status
host_mesh_check_abort(
    struct host_mesh *m, const struct host_op *c, char *err, size_t errlen)
{
	if (!mesh_aborted(m))
		return (COHORT_OK);
	if (c != NULL)
		snprintf(
		    err, errlen, "%s #%" PRIu64 " aborted", c->name, c->seq);
	else
		snprintf(err, errlen, "aborted during the data-plane set-up");
	return (COHORT_EABORTED);
}

static cohort_status
mesh_random(uint8_t *buf, size_t len, char *err, size_t errlen)
{
	size_t have = 0;

	for (int tries = 0; have < len && tries < 16; tries++) {
		ssize_t n = getrandom(buf + have, len - have, 0);

		if (n > 0)
			have += (size_t)n;
		else if (n < 0 && errno != EINTR)
			break;
	}
	if (have < len) {
		snprintf(err, errlen, "getrandom: %s", strerror(errno));
		return (COHORT_ESYSTEM);
	}
	return (COHORT_OK);
}

static void
mesh_sockopts(int fd, bool nodelay)
{
	size_t sz = host_knob(COHORT__KNOB_TCP_SOCKBUF, 0);
	size_t lowat = host_knob(
	    COHORT__KNOB_TCP_NOTSENT_LOWAT, HOST_DEFAULT_NOTSENT_LOWAT);
	int one = 1;

	if (sz > 0) {
		int v = (int)sz;

		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
	}
	if (nodelay)
		(void)setsockopt(
		    fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
	if (lowat > 0) {
		int v = (int)lowat;

		(void)setsockopt(
		    fd, IPPROTO_TCP, TCP_NOTSENT_LOWAT, &v, sizeof(v));
	}
}

/* The room for headers the kernel leaves in a GSO packet (MAX_TCP_HEADER,
 * 320 bytes on x86-64 and arm64). */
#define MESH_GSO_MAX (65536u - 320u)

size_t
host_send_len(int fd, size_t send_max, size_t io_max)
{
	struct tcp_info ti;
	socklen_t sl = sizeof(ti);
	size_t seg, len;

	if (send_max > 0)
		return (send_max);
	/* The segment of the path's MTU (advmss), not TCP_MAXSEG: that is
	 * the current send MSS, which the kernel bounds by half the peer's
	 * window while it grows (32,741 then 47,616 bytes on loopback,
	 * whose MTU makes 65,483). */
	memset(&ti, 0, sizeof(ti));
	if (fd < 0 || getsockopt(fd, IPPROTO_TCP, TCP_INFO, &ti, &sl) != 0
	    || ti.tcpi_advmss == 0)
		len = HOST_SEND_SMALL;
	else if ((seg = ti.tcpi_advmss) >= MESH_GSO_MAX)
		len = seg;
	else
		len = MESH_GSO_MAX / seg * seg;
	return (len < io_max ? len : io_max);
}

/* The handshake time (COHORT_TCP_HS_TIMEOUT_MS). */
static int
mesh_hs_ms(void)
{
	return ((int)cohort__knob_int_or(
	    COHORT__KNOB_TCP_HS_TIMEOUT_MS, MESH_HS_TIMEOUT_MS));
}

static cohort__time
mesh_connect_window(cohort__time deadline)
{
	cohort__time w = cohort__deadline(
	    (cohort_duration)cohort__knob_int_or(
	        COHORT__KNOB_CONNECT_TIMEOUT_MS, MESH_CONNECT_TIMEOUT_MS),
	    COHORT_WAIT_FOREVER);

	return (w > deadline ? deadline : w);
}

/* Sleep of a wait loop: at most MESH_POLL_MS, never past deadline. */
static int
mesh_poll_ms(cohort__time deadline)
{
	int ms = cohort__remaining(deadline);

	if (ms < 0 || ms > MESH_POLL_MS)
		ms = MESH_POLL_MS;
	return (ms < 1 ? 1 : ms);
}

/* Moves what the socket takes now: 1 when *done reached len, 0 when it
 * would block, -1 when the peer closed (errno 0) or the socket failed. */
static int
mesh_nbio(int fd, void *buf, size_t len, size_t *done, bool sending)
{
	while (*done < len) {
		ssize_t n = sending ? send(fd, (uint8_t *)buf + *done,
		                len - *done, MSG_DONTWAIT | MSG_NOSIGNAL)
		                    : recv(fd, (uint8_t *)buf + *done,
		                        len - *done, MSG_DONTWAIT);

		if (n > 0) {
			*done += (size_t)n;
			continue;
		}
		if (n < 0 && (errno == EAGAIN || errno == EWOULDBLOCK))
			return (0);
		if (n < 0 && errno == EINTR)
			continue;
		if (n == 0)
			errno = 0;
		return (-1);
	}
	return (1);
}

cohort_status
host_io(atomic_int *abort_flag, int fd, void *buf, size_t len, size_t *done,
    bool sending, const char *during, int32_t peer, char *err, size_t errlen,
    cohort__time deadline)
{
	while (*done < len) {
		struct pollfd pfd;
		ssize_t n;

		if (abort_flag != NULL
		    && atomic_load_explicit(
		        abort_flag, memory_order_acquire)) {
			snprintf(err, errlen, "aborted in the %s with rank %d",
			    during, (int)peer);
			return (COHORT_EABORTED);
		}
		if (sending)
			n = send(fd, (uint8_t *)buf + *done, len - *done,
			    MSG_DONTWAIT | MSG_NOSIGNAL);
		else
			n = recv(fd, (uint8_t *)buf + *done, len - *done,
			    MSG_DONTWAIT);
		if (n > 0) {
			*done += (size_t)n;
			continue;
		}
		if (n == 0
		    || (errno != EAGAIN && errno != EWOULDBLOCK
		        && errno != EINTR)) {
			snprintf(err, errlen,
			    "rank %d closed the connection during the %s%s%s",
			    (int)peer, during, n == 0 ? "" : ": ",
			    n == 0 ? "" : strerror(errno));
			return (COHORT_EPEERLOST);
		}
		if (cohort__expired(deadline)) {
			snprintf(err, errlen,
			    "timed out in the %s with rank %d", during,
			    (int)peer);
			return (COHORT_ETIMEDOUT);
		}
		pfd.fd = fd;
		pfd.events = sending ? POLLOUT : POLLIN;
		pfd.revents = 0;
		(void)poll(&pfd, 1, mesh_poll_ms(deadline));
	}
	return (COHORT_OK);
}

static cohort_status
mesh_parse_addr(const char *s, size_t len, struct mesh_addr *out)
{
	char tmp[160], host[128], portbuf[16];
	const char *colon;
	size_t hl;
	int64_t port;
	struct sockaddr_in *sin = (struct sockaddr_in *)&out->ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&out->ss;

	if (len == 0 || len >= sizeof(tmp))
		return (COHORT_EPROTO);
	memcpy(tmp, s, len);
	tmp[len] = '\0';
	if ((colon = strrchr(tmp, ':')) == NULL)
		return (COHORT_EPROTO);
	hl = (size_t)(colon - tmp);
	if (cohort__strlcpy(portbuf, colon + 1, sizeof(portbuf))
	    >= sizeof(portbuf))
		return (COHORT_EPROTO);
	if (hl >= 2 && tmp[0] == '[' && tmp[hl - 1] == ']') {
		memcpy(host, tmp + 1, hl - 2);
		host[hl - 2] = '\0';
	} else {
		if (hl >= sizeof(host))
			return (COHORT_EPROTO);
		memcpy(host, tmp, hl);
		host[hl] = '\0';
	}
	if (!cohort__parse_i64(portbuf, &port) || port <= 0 || port > 65535)
		return (COHORT_EPROTO);
	memset(out, 0, sizeof(*out));
	if (inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
		sin->sin_family = AF_INET;
		sin->sin_port = htons((uint16_t)port);
		out->len = sizeof(*sin);
	} else if (inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
		sin6->sin6_family = AF_INET6;
		sin6->sin6_port = htons((uint16_t)port);
		out->len = sizeof(*sin6);
	} else {
		return (COHORT_EPROTO);
	}
	return (COHORT_OK);
}

static void
mesh_key(const struct host_mesh *m, int rank, char *key, size_t keylen)
{
	snprintf(key, keylen, "tcp/%s/%" PRIu64 "/addr/%d", m->group_id,
	    m->generation, rank);
}

/* ------------------------------------------------------------------------ */
/* Open, close                                                              */
/* ------------------------------------------------------------------------ */

static cohort_status
mesh_listen(struct host_mesh *m, char *err, size_t errlen)
{
	const char *host
	    = m->bind_addr[0] != '\0' ? m->bind_addr : "127.0.0.1";
	struct sockaddr_storage ss;
	struct sockaddr_in *sin = (struct sockaddr_in *)&ss;
	struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&ss;
	socklen_t sl;
	int fd;
	char shown[INET6_ADDRSTRLEN];

	memset(&ss, 0, sizeof(ss));
	if (inet_pton(AF_INET, host, &sin->sin_addr) == 1) {
		sin->sin_family = AF_INET;
		sl = sizeof(*sin);
	} else if (inet_pton(AF_INET6, host, &sin6->sin6_addr) == 1) {
		sin6->sin6_family = AF_INET6;
		sl = sizeof(*sin6);
	} else {
		snprintf(err, errlen, "bad bind address '%s'", host);
		return (COHORT_EINVAL);
	}
	fd = socket(
	    ss.ss_family, SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return (COHORT_ESYSTEM);
	}
	mesh_sockopts(fd, false);
	/* A port whose last connections wait in TIME_WAIT is free to listen
	 * on: without this, a machine that set up many groups in a minute
	 * (thousands of ranks, each with its connections) runs out of
	 * ports to listen on (EADDRINUSE). It never lets two listeners
	 * share a port. */
	(void)setsockopt(
	    fd, SOL_SOCKET, SO_REUSEADDR, &(int) { 1 }, sizeof(int));
	if (bind(fd, (struct sockaddr *)&ss, sl) != 0
	    || listen(fd, SOMAXCONN) != 0
	    || getsockname(
	           fd, (struct sockaddr *)&ss, &(socklen_t) { sizeof(ss) })
	        != 0) {
		snprintf(
		    err, errlen, "listen on %s: %s", host, strerror(errno));
		close(fd);
		return (COHORT_ESYSTEM);
	}
	{
		bool v4 = ss.ss_family == AF_INET;

		inet_ntop(ss.ss_family,
		    v4 ? (const void *)&sin->sin_addr
		       : (const void *)&sin6->sin6_addr,
		    shown, sizeof(shown));
		snprintf(m->addr, sizeof(m->addr), v4 ? "%s:%u" : "[%s]:%u",
		    shown,
		    (unsigned)ntohs(v4 ? sin->sin_port : sin6->sin6_port));
	}
	m->lfd = fd;
	return (COHORT_OK);
}

cohort_status
host_mesh_open(struct host_mesh *m, const struct cohort__group_desc *desc,
    char *err, size_t errlen, cohort__time deadline)
{
	char key[COHORT__MAX_KEY];
	cohort_status rv;

	m->rank = desc->rank;
	m->size = desc->size;
	m->abort_flag = desc->abort_flag;
	m->lfd = -1;
	m->watch_lost = -1;
	atomic_init(&m->aborted, 0);
	if ((m->links = calloc((size_t)m->size, sizeof(*m->links))) == NULL)
		goto out_nomem;
	for (int p = 0; p < m->size; p++) {
		m->links[p].fd = -1;
		m->links[p].job_rank
		    = desc->global_ranks != NULL ? desc->global_ranks[p] : p;
	}
	m->npfds = (size_t)m->size + 2;
	if ((m->pfds = host_zalloc(m->npfds, sizeof(*m->pfds))) == NULL
	    || (m->pfd_peer = host_zalloc((size_t)m->size, sizeof(int)))
	        == NULL)
		goto out_nomem;
	if (m->size == 1)
		return (COHORT_OK);
	if (cohort__strlcpy(m->job, desc->job, sizeof(m->job))
	        >= sizeof(m->job)
	    || cohort__strlcpy(
	           m->group_id, desc->group_id, sizeof(m->group_id))
	        >= sizeof(m->group_id)
	    || desc->secret_len > sizeof(m->secret)
	    || (desc->bind_addr != NULL
	        && cohort__strlcpy(
	               m->bind_addr, desc->bind_addr, sizeof(m->bind_addr))
	            >= sizeof(m->bind_addr))) {
		snprintf(err, errlen,
		    "job, group id, secret or bind address "
		    "too long");
		return (COHORT_EINVAL);
	}
	m->generation = desc->generation;
	m->store = desc->store;
	if (desc->secret_len > 0)
		memcpy(m->secret, desc->secret, desc->secret_len);
	m->keys.secret = m->secret;
	m->keys.secret_len = desc->secret_len;
	cohort__tcp_hs_ident(
	    m->job, m->group_id, m->generation, m->keys.ident);
	if ((m->pend = calloc(MESH_MAX_PENDING, sizeof(*m->pend))) == NULL
	    || (m->cfds = host_zalloc(
	            (size_t)m->size + MESH_MAX_PENDING + 1, sizeof(*m->cfds)))
	        == NULL)
		goto out_nomem;
	for (int i = 0; i < MESH_MAX_PENDING; i++)
		m->pend[i].fd = -1;
	if ((rv = mesh_listen(m, err, errlen)) != COHORT_OK)
		return (rv);
	mesh_key(m, m->rank, key, sizeof(key));
	if ((rv = m->store.set(
	         m->store.ctx, key, m->addr, strlen(m->addr), deadline))
	    != COHORT_OK) {
		snprintf(err, errlen,
		    "publishing the address (store key %s): %s", key,
		    cohort_status_name(rv));
		return (rv);
	}
	return (COHORT_OK);

out_nomem:
	snprintf(err, errlen, "out of memory");
	return (COHORT_ENOMEM);
}

static void
mesh_dial_free(struct host_link *l)
{
	if (l->dial == NULL)
		return;
	if (l->dial->fd >= 0)
		close(l->dial->fd);
	free(l->dial);
	l->dial = NULL;
}

/* One warning for all the connections refused while connecting. */
static void
mesh_refusals_log(struct host_mesh *m)
{
	char text[512];
	size_t off = 0;
	int total = 0;

	for (int r = 1; r <= COHORT__TCP_HS_REASON_MAX; r++) {
		if (m->refused[r] == 0)
			continue;
		cohort__appendf(text, sizeof(text), &off, "%s%d: %s",
		    total > 0 ? "; " : "", m->refused[r],
		    cohort__tcp_hs_reason_text((uint32_t)r));
		total += m->refused[r];
		m->refused[r] = 0;
	}
	if (total > 0)
		cohort__warn("tcp group %s rank %d: refused %d connection%s "
		             "while connecting (%s)",
		    m->group_id, m->rank, total, total == 1 ? "" : "s", text);
}

/* Stops accepting: every connection this group will need is made. */
static void
mesh_stop_listening(struct host_mesh *m)
{
	for (int i = 0; m->pend != NULL && i < MESH_MAX_PENDING; i++)
		if (m->pend[i].fd >= 0) {
			close(m->pend[i].fd);
			m->pend[i].fd = -1;
		}
	if (m->lfd >= 0)
		close(m->lfd);
	m->lfd = -1;
}

void
host_mesh_close(struct host_mesh *m)
{
	mesh_stop_listening(m);
	if (m->links != NULL)
		for (int p = 0; p < m->size; p++) {
			mesh_dial_free(&m->links[p]);
			if (m->links[p].fd >= 0)
				close(m->links[p].fd);
		}
	free(m->links);
	free(m->pend);
	host_zfree(
	    m->cfds, (size_t)m->size + MESH_MAX_PENDING + 1, sizeof(*m->cfds));
	host_zfree(m->pfds, m->npfds, sizeof(*m->pfds));
	host_zfree(m->pfd_peer, (size_t)m->size, sizeof(int));
	m->cfds = m->pfds = NULL;
	m->pfd_peer = NULL;
	m->links = NULL; /* closed: nothing to abort any more */
}

void
host_mesh_abort(struct host_mesh *m)
{
	atomic_store_explicit(&m->aborted, 1, memory_order_release);
	for (int p = 0; m->links != NULL && p < m->size; p++)
		if (m->links[p].fd >= 0)
			(void)shutdown(m->links[p].fd, SHUT_RDWR);
}

/* ------------------------------------------------------------------------ */
/* The connector's side                                                     */
/* ------------------------------------------------------------------------ */

/* Says why rank jr at addr could not be reached, and what to check. */
static void
mesh_connect_error(const struct host_mesh *m, int32_t jr, const char *addr,
    int soerr, int64_t waited_ms, char *err, size_t errlen)
{
	size_t off = 0;
	bool loopback
	    = strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0;

	cohort__appendf(err, errlen, &off,
	    "cannot connect to rank %d at %s: %s (tried for %.1f s)", (int)jr,
	    addr, strerror(soerr), (double)waited_ms / 1000.0);
	if (loopback && m->bind_addr[0] != '\0'
	    && strncmp(m->bind_addr, "127.", 4) != 0)
		cohort__appendf(err, errlen, &off,
		    "; rank %d advertises a loopback address while this rank "
		    "is at %s: set COHORT_DATA_ADDR or COHORT_DATA_IFACE on "
		    "rank %d's host",
		    (int)jr, m->bind_addr, (int)jr);
	else
		cohort__appendf(err, errlen, &off,
		    "; check that this host reaches %s (firewall, network "
		    "policy) or set COHORT_DATA_ADDR / COHORT_DATA_IFACE on "
		    "rank %d",
		    addr, (int)jr);
}

/* Answers a refusal (CHR1) or a malformed answer of rank jr. */
static cohort_status
mesh_refused(
    int32_t jr, int p, uint32_t reason, bool *retry, char *err, size_t errlen)
{
	if (p == -1
	    && (reason == COHORT__TCP_HS_BUSY
	        || reason == COHORT__TCP_HS_TIMEOUT)) {
		snprintf(err, errlen,
		    "rank %d's listener dropped the handshake: %s", (int)jr,
		    cohort__tcp_hs_reason_text(reason));
		*retry = true;
		return (COHORT_EPEERLOST);
	}
	if (p == -2 && reason == COHORT__TCP_HS_BAD_PROOF) {
		snprintf(err, errlen, "rank %d failed to prove the job secret",
		    (int)jr);
		return (COHORT_EAUTH);
	}
	if (p == -2) {
		snprintf(err, errlen,
		    "rank %d's address answers with a wrong greeting (not a "
		    "cohort tcp peer of this group?)",
		    (int)jr);
		return (COHORT_EPROTO);
	}
	snprintf(err, errlen, "rank %d refused the handshake: %s", (int)jr,
	    cohort__tcp_hs_reason_text(reason));
	return (reason == COHORT__TCP_HS_OTHER_GROUP
	            || reason == COHORT__TCP_HS_BAD_PROOF
	        ? COHORT_EAUTH
	        : COHORT_EPROTO);
}

/* Starts a non-blocking connect of d. */
static cohort_status
mesh_dial_start(struct mesh_dial *d, char *err, size_t errlen)
{
	d->attempts++;
	d->have = 0;
	d->need = 4;
	d->sent = 0;
	d->fd = socket(d->addr.ss.ss_family,
	    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
	if (d->fd < 0) {
		snprintf(err, errlen, "socket: %s", strerror(errno));
		return (COHORT_ESYSTEM);
	}
	mesh_sockopts(d->fd, true);
	if (connect(d->fd, (struct sockaddr *)&d->addr.ss, d->addr.len) == 0
	    || errno == EINPROGRESS) {
		d->phase = DIAL_CONNECTING;
		return (COHORT_OK);
	}
	d->soerr = errno;
	close(d->fd);
	d->fd = -1;
	d->phase = DIAL_RETRY;
	d->retry_at = cohort__now_ms()
	    + (d->soerr == ECONNREFUSED ? MESH_RETRY_MS : 200);
	return (COHORT_OK);
}

/* A new dial (not started) of peer j at the address it published (val,
 * vlen bytes). */
static cohort_status
mesh_dial_from(struct host_mesh *m, int j, const void *val, size_t vlen,
    char *err, size_t errlen, cohort__time deadline)
{
	int32_t jr = m->links[j].job_rank;
	struct mesh_dial *d;
	cohort_status rv;

	if ((d = calloc(1, sizeof(*d))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	rv = mesh_parse_addr(val, vlen, &d->addr);
	snprintf(
	    d->shown, sizeof(d->shown), "%.*s", (int)vlen, (const char *)val);
	if (rv != COHORT_OK) {
		free(d);
		snprintf(
		    err, errlen, "bad address published by rank %d", (int)jr);
		return (COHORT_EPROTO);
	}
	d->fd = -1;
	d->start = cohort__now_ms();
	/* The peer listens before it publishes: a refusal or an unreachable
	 * address that lasts the connect window is a configuration error (a
	 * loopback or wrong address advertised, a firewall), reported with
	 * the address rather than waited out to the operation's timeout. */
	d->window = mesh_connect_window(deadline);
	m->links[j].dial = d;
	return (COHORT_OK);
}

/* Reads the addresses of the k peers in js (each waits until published)
 * into new dials (not started): one store round trip for all of them
 * when the store reads several keys at once, else one per peer. */
static cohort_status
mesh_dials_new(struct host_mesh *m, const int *js, int k, char *err,
    size_t errlen, cohort__time deadline)
{
	char(*keys)[COHORT__MAX_KEY] = NULL;
	const char **kp = NULL;
	void **vals = NULL;
	size_t *lens = NULL;
	cohort_status rv = COHORT_OK;
	int i;

	if (k == 0)
		return (COHORT_OK);
	if ((keys = calloc((size_t)k, sizeof(*keys))) == NULL
	    || (kp = calloc((size_t)k, sizeof(*kp))) == NULL
	    || (vals = calloc((size_t)k, sizeof(*vals))) == NULL
	    || (lens = calloc((size_t)k, sizeof(*lens))) == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = COHORT_ENOMEM;
		goto out;
	}
	for (i = 0; i < k; i++) {
		mesh_key(m, js[i], keys[i], sizeof(keys[i]));
		kp[i] = keys[i];
	}
	if (m->store.mget != NULL && k > 1) {
		if ((rv = m->store.mget(
		         m->store.ctx, kp, (size_t)k, vals, lens, deadline))
		    != COHORT_OK) {
			/* which of them is missing: the store's own text
			 * (cohortd names the absent keys, whose last part
			 * is the group rank) */
			char ranks[160];
			size_t off = 0;

			ranks[0] = '\0';
			for (i = 0; i < k && i < 16; i++)
				cohort__appendf(ranks, sizeof(ranks), &off,
				    "%s%d", i ? ", " : "",
				    (int)m->links[js[i]].job_rank);
			snprintf(err, errlen,
			    "no address from one of ranks %s%s (store keys "
			    "like %s): %s: %s",
			    ranks, k > 16 ? ", ..." : "", keys[0],
			    cohort_status_name(rv), cohort_last_error());
			goto out;
		}
	} else {
		for (i = 0; i < k; i++)
			if ((rv = m->store.get(m->store.ctx, keys[i], &vals[i],
			         &lens[i], deadline))
			    != COHORT_OK) {
				snprintf(err, errlen,
				    "no address from rank %d (store key "
				    "%s): %s",
				    (int)m->links[js[i]].job_rank, keys[i],
				    cohort_status_name(rv));
				goto out;
			}
	}
	for (i = 0; i < k && rv == COHORT_OK; i++)
		rv = mesh_dial_from(
		    m, js[i], vals[i], lens[i], err, errlen, deadline);
out:
	for (i = 0; vals != NULL && i < k; i++)
		free(vals[i]);
	free(keys);
	free(kp);
	free(vals);
	free(lens);
	return (rv);
}

/* The attempt of d failed in a way another attempt may fix (dropped by a
 * busy listener, closed before our hello was judged, refused): try again
 * while the connect window lasts. Returns rv when it may not. */
static cohort_status
mesh_dial_retry(struct host_mesh *m, int j, struct mesh_dial *d,
    cohort_status rv, bool dropped, char *err, size_t errlen,
    cohort__time deadline)
{
	if (d->fd >= 0)
		close(d->fd);
	d->fd = -1;
	/* Dropped by a busy listener: another connect window from the first
	 * time (waiting for the greeting may have used up the first). */
	if (dropped && !d->refreshed) {
		d->window = mesh_connect_window(deadline);
		d->refreshed = true;
	}
	if (cohort__expired(d->window) || cohort__expired(deadline)) {
		if (d->attempts > 1)
			cohort__appendf(err, errlen, &(size_t) { strlen(err) },
			    " (%d attempts in %.1f s)", d->attempts,
			    (double)(cohort__now_ms() - d->start) / 1000.0);
		return (rv);
	}
	cohort__debug("tcp group %s rank %d: %s; connecting again",
	    m->group_id, m->rank, err);
	d->phase = DIAL_RETRY;
	d->retry_at = cohort__now_ms() + MESH_RETRY_MS;
	return (COHORT_OK);
}

/* Progresses the dial of higher peer j after poll() (revents: its fd's,
 * 0 when it was not polled). */
static cohort_status
mesh_dial_step(struct host_mesh *m, int j, short revents, char *err,
    size_t errlen, cohort__time deadline)
{
	struct host_link *l = &m->links[j];
	struct mesh_dial *d = l->dial;
	int32_t jr = l->job_rank;
	uint32_t reason = 0;
	cohort_status rv;
	bool retry;
	int p;

	switch (d->phase) {
	case DIAL_RETRY:
		if (cohort__now_ms() < d->retry_at)
			return (COHORT_OK);
		return (mesh_dial_start(d, err, errlen));
	case DIAL_CONNECTING: {
		socklen_t sl = sizeof(d->soerr);

		if (revents == 0) {
			if (!cohort__expired(d->window))
				return (COHORT_OK);
			d->soerr = ETIMEDOUT;
		} else if (getsockopt(
		               d->fd, SOL_SOCKET, SO_ERROR, &d->soerr, &sl)
		    != 0) {
			d->soerr = errno;
		}
		if (d->soerr == 0) {
			d->phase = DIAL_GREETING;
			return (COHORT_OK);
		}
		close(d->fd);
		d->fd = -1;
		if (cohort__expired(d->window)) {
			mesh_connect_error(m, jr, d->shown, d->soerr,
			    cohort__now_ms() - d->start, err, errlen);
			return (cohort__expired(deadline) ? COHORT_ETIMEDOUT
			                                  : COHORT_EPEERLOST);
		}
		/* refused: not listening yet or any more; unreachable: a
		 * route or neighbour still coming up. Both may pass. */
		d->phase = DIAL_RETRY;
		d->retry_at = cohort__now_ms()
		    + (d->soerr == ECONNREFUSED ? MESH_RETRY_MS : 200);
		return (COHORT_OK);
	}
	case DIAL_GREETING:
	case DIAL_ANSWER: {
		/* The greeting comes when the acceptor reaches its connect
		 * step: wait as long as the operation may. The answer comes
		 * as soon as it reads our hello: wait 5x the handshake time,
		 * so a loaded machine does not make us give up on a
		 * connection it already accepted. */
		cohort__time until
		    = d->phase == DIAL_GREETING ? deadline : d->hs_deadline;
		int e = mesh_nbio(d->fd, d->in, d->need, &d->have, false);

		if (e < 0) {
			snprintf(err, errlen,
			    "rank %d closed the connection during the "
			    "handshake%s%s",
			    (int)jr, errno != 0 ? ": " : "",
			    errno != 0 ? strerror(errno) : "");
			return (mesh_dial_retry(m, j, d, COHORT_EPEERLOST,
			    true, err, errlen, deadline));
		}
		if (e == 0) {
			if (!cohort__expired(until))
				return (COHORT_OK);
			snprintf(err, errlen,
			    "timed out in the handshake with rank %d",
			    (int)jr);
			if (d->phase == DIAL_GREETING)
				return (COHORT_ETIMEDOUT);
			return (mesh_dial_retry(m, j, d, COHORT_ETIMEDOUT,
			    true, err, errlen, deadline));
		}
		if (d->phase == DIAL_GREETING)
			p = cohort__tcp_hs_parse_shello(d->in, d->have,
			    (uint32_t)j, d->na, &d->need, &reason);
		else
			p = cohort__tcp_hs_parse_answer(d->in, d->have,
			    &m->keys, d->na, d->nc, (uint32_t)m->rank,
			    (uint32_t)j, &d->need, &reason);
		if (p == 0)
			return (COHORT_OK); /* more bytes to come */
		if (p < 0) {
			retry = false;
			rv = mesh_refused(jr, p, reason, &retry, err, errlen);
			if (!retry)
				return (rv);
			return (mesh_dial_retry(
			    m, j, d, rv, true, err, errlen, deadline));
		}
		if (d->phase == DIAL_ANSWER) {
			/* Accepted: the connection is this pair's. */
			l->fd = d->fd;
			d->fd = -1;
			mesh_dial_free(l);
			return (COHORT_OK);
		}
		if ((rv = mesh_random(d->nc, 16, err, errlen)) != COHORT_OK)
			return (rv);
		cohort__tcp_hs_put_chello(d->ch, &m->keys, d->na, d->nc,
		    (uint32_t)m->rank, (uint32_t)j);
		d->phase = DIAL_HELLO;
		d->hs_deadline = cohort__now_ms() + mesh_hs_ms();
		if (d->hs_deadline > deadline)
			d->hs_deadline = deadline;
	}
		/* FALLTHROUGH */
	case DIAL_HELLO: {
		int e = mesh_nbio(d->fd, d->ch, sizeof(d->ch), &d->sent, true);

		if (e == 0 && !cohort__expired(d->hs_deadline))
			return (COHORT_OK);
		/* Sent, or the send failed: a refusal may be waiting. */
		d->phase = DIAL_ANSWER;
		d->have = 0;
		d->need = 4;
		d->hs_deadline
		    = cohort__now_ms() + 5 * (cohort__time)mesh_hs_ms();
		if (d->hs_deadline > deadline)
			d->hs_deadline = deadline;
		return (COHORT_OK);
	}
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* The acceptor's side                                                      */
/* ------------------------------------------------------------------------ */

/* The source address of an accepted connection, as 16 bytes. */
static void
mesh_src(const struct sockaddr_storage *ss, uint8_t src[16])
{
	memset(src, 0, 16);
	if (ss->ss_family == AF_INET)
		memcpy(src, &((const struct sockaddr_in *)ss)->sin_addr, 4);
	else if (ss->ss_family == AF_INET6)
		memcpy(src, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
}

/* Tells a pending connection why it is turned away, and closes it. */
static void
mesh_refuse(struct host_mesh *m, struct cohort__tcp_pend *pc, uint32_t reason)
{
	uint8_t msg[COHORT__TCP_REFUSAL_LEN];

	cohort__tcp_hs_put_refusal(msg, reason);
	(void)send(pc->fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
	cohort__debug("tcp group %s rank %d: refused a connection: %s",
	    m->group_id, m->rank, cohort__tcp_hs_reason_text(reason));
	m->refused[reason <= COHORT__TCP_HS_REASON_MAX ? reason : 0]++;
	close(pc->fd);
	pc->fd = -1;
}

/* Accepts a new connection into the pending table (evicting an older one
 * if it must, handshake.h) and greets it. */
static cohort_status
mesh_admit(struct host_mesh *m, int fd, const struct sockaddr_storage *ss,
    char *err, size_t errlen)
{
	uint8_t src[16], sh[COHORT__TCP_SHELLO_LEN];
	struct cohort__tcp_pend *pc;
	bool evict;
	cohort_status rv;

	mesh_src(ss, src);
	pc = &m->pend[cohort__tcp_pend_admit(
	    m->pend, MESH_MAX_PENDING, src, MESH_PER_SOURCE, &evict)];
	if (evict)
		mesh_refuse(m, pc, COHORT__TCP_HS_BUSY);
	memset(pc, 0, sizeof(*pc));
	pc->fd = fd;
	memcpy(pc->src, src, 16);
	pc->since = cohort__now_ms();
	pc->deadline = pc->since + mesh_hs_ms();
	if ((rv = mesh_random(pc->nonce, 16, err, errlen)) != COHORT_OK) {
		close(fd);
		pc->fd = -1;
		return (rv);
	}
	cohort__tcp_hs_put_shello(sh, (uint32_t)m->rank, pc->nonce);
	if (send(fd, sh, sizeof(sh), MSG_DONTWAIT | MSG_NOSIGNAL)
	    != (ssize_t)sizeof(sh)) {
		close(fd);
		pc->fd = -1;
	}
	return (COHORT_OK);
}

/* Reads what a pending connection sent; judges its hello when complete
 * (it becomes the connection of the lower rank it proves to be). */
static bool
mesh_linked(void *ctx, uint32_t rank)
{
	const struct host_mesh *m = ctx;

	return (m->links[rank].fd >= 0);
}

static void
mesh_progress(struct host_mesh *m, struct cohort__tcp_pend *pc)
{
	uint32_t reason, rc = 0;
	int v = host_net_pend_step(
	    pc, &m->keys, (uint32_t)m->rank, mesh_linked, m, &rc, &reason);

	if (v == -1)
		cohort__debug("tcp group %s rank %d: a connection closed "
		              "before completing the handshake",
		    m->group_id, m->rank);
	if (v == -2 && reason != COHORT__TCP_HS_TIMEOUT)
		cohort__warn("tcp group %s rank %d: refused a connection: %s",
		    m->group_id, m->rank, cohort__tcp_hs_reason_text(reason));
	if (v == -2)
		mesh_refuse(m, pc, reason);
	if (v == 1) {
		m->links[rc].fd = pc->fd;
		pc->fd = -1;
	}
}

/* New connections on the listener: each gets a slot and a fresh nonce. */
static cohort_status
mesh_accept(struct host_mesh *m, char *err, size_t errlen)
{
	cohort_status rv;

	for (int n = 0; n < MESH_MAX_PENDING; n++) {
		struct sockaddr_storage ss;
		socklen_t sl = sizeof(ss);
		int fd = accept4(m->lfd, (struct sockaddr *)&ss, &sl,
		    SOCK_NONBLOCK | SOCK_CLOEXEC);

		if (fd < 0)
			break;
		if ((rv = mesh_admit(m, fd, &ss, err, errlen)) != COHORT_OK)
			return (rv);
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Connecting                                                               */
/* ------------------------------------------------------------------------ */

/* Which listed peers are still not connected: the first lower and the
 * first higher one (-1: none). */
static int
mesh_missing(const struct host_mesh *m, const int *peers, int k, int *lower,
    int *higher)
{
	int n = 0;

	*lower = *higher = -1;
	for (int i = 0; i < k; i++) {
		int p = peers[i];

		if (p == m->rank || m->links[p].fd >= 0)
			continue;
		n++;
		if (p < m->rank && *lower < 0)
			*lower = p;
		if (p > m->rank && *higher < 0)
			*higher = p;
	}
	return (n);
}

static cohort_status
mesh_timeout(struct host_mesh *m, const int *peers, int k, int lower,
    int higher, const char *during, char *err, size_t errlen)
{
	size_t off = 0;

	if (lower < 0) {
		const struct mesh_dial *d = m->links[higher].dial;

		snprintf(err, errlen,
		    "timed out in the handshake with rank %d "
		    "(%s; %s)",
		    (int)m->links[higher].job_rank,
		    d != NULL && d->phase == DIAL_GREETING
		        ? "no greeting: it has not reached this step"
		        : "connecting",
		    during);
		return (COHORT_ETIMEDOUT);
	}
	cohort__appendf(
	    err, errlen, &off, "timed out waiting for ranks to connect:");
	for (int i = 0; i < k; i++)
		if (peers[i] < m->rank && m->links[peers[i]].fd < 0)
			cohort__appendf(err, errlen, &off, " %d",
			    (int)m->links[peers[i]].job_rank);
	cohort__appendf(err, errlen, &off, " (%s)", during);
	return (COHORT_ETIMEDOUT);
}

cohort_status
host_mesh_connect(struct host_mesh *m, const int *peers, int k,
    const char *during, char *err, size_t errlen, cohort__time deadline)
{
	int lower, higher;
	cohort_status rv = COHORT_OK;

	if (mesh_missing(m, peers, k, &lower, &higher) == 0)
		return (COHORT_OK);
	if (m->lfd < 0 && m->size > 1) {
		/* Every connection was made at init (a small group). */
		snprintf(err, errlen,
		    "internal error: %s needs a connection the set-up did not "
		    "make",
		    during);
		return (COHORT_ESTATE);
	}
	/* Every address first, all in one store round trip: a KV read may
	 * wait (for a peer that has not published yet, or a busy cohortd),
	 * and no handshake of ours may sit unanswered meanwhile (the
	 * acceptor drops a silent one). */
	{
		int nd = 0, *js = malloc(sizeof(int) * (size_t)k);

		if (js == NULL) {
			snprintf(err, errlen, "out of memory");
			rv = COHORT_ENOMEM;
			goto out;
		}
		for (int i = 0; i < k; i++) {
			int p = peers[i];

			if (p <= m->rank || m->links[p].fd >= 0
			    || m->links[p].dial != NULL)
				continue;
			js[nd++] = p;
		}
		rv = mesh_dials_new(m, js, nd, err, errlen, deadline);
		free(js);
		if (rv != COHORT_OK)
			goto out;
	}
	for (int i = 0; i < k; i++)
		if (m->links[peers[i]].dial != NULL
		    && m->links[peers[i]].dial->phase == 0
		    && (rv = mesh_dial_start(
		            m->links[peers[i]].dial, err, errlen))
		        != COHORT_OK)
			goto out;
	while (mesh_missing(m, peers, k, &lower, &higher) > 0) {
		struct pollfd *fds = m->cfds;
		int nfds = 0, npend;
		int ms = mesh_poll_ms(deadline);

		if (mesh_aborted(m)) {
			if (lower >= 0)
				snprintf(err, errlen,
				    "aborted while waiting for rank %d to "
				    "connect",
				    (int)m->links[lower].job_rank);
			else
				snprintf(err, errlen,
				    "aborted while connecting to rank %d",
				    (int)m->links[higher].job_rank);
			rv = COHORT_EABORTED;
			goto out;
		}
		if (cohort__expired(deadline)) {
			rv = mesh_timeout(
			    m, peers, k, lower, higher, during, err, errlen);
			goto out;
		}
		fds[nfds].fd = m->lfd;
		fds[nfds].events = POLLIN;
		fds[nfds++].revents = 0;
		for (int i = 0; i < MESH_MAX_PENDING; i++) {
			if (m->pend[i].fd < 0)
				continue;
			fds[nfds].fd = m->pend[i].fd;
			fds[nfds].events = POLLIN;
			fds[nfds++].revents = 0;
		}
		npend = nfds;
		for (int i = 0; i < k; i++) {
			const struct mesh_dial *d = m->links[peers[i]].dial;

			if (d == NULL)
				continue;
			if (d->phase == DIAL_RETRY) {
				cohort_duration left
				    = cohort__remaining(d->retry_at);

				if (left < ms)
					ms = left < 1 ? 1 : left;
				continue;
			}
			fds[nfds].fd = d->fd;
			fds[nfds].events = d->phase == DIAL_CONNECTING
			        || d->phase == DIAL_HELLO
			    ? POLLOUT
			    : POLLIN;
			fds[nfds++].revents = 0;
		}
		(void)poll(fds, (nfds_t)nfds, ms);

		if ((rv = mesh_accept(m, err, errlen)) != COHORT_OK)
			goto out;
		for (int i = 0; i < MESH_MAX_PENDING; i++)
			if (m->pend[i].fd >= 0)
				mesh_progress(m, &m->pend[i]);
		/* The dials, in the order they were polled in. */
		for (int q = 0, i = npend; q < k; q++) {
			int p = peers[q];
			struct mesh_dial *d = m->links[p].dial;
			short rev = 0;

			if (d == NULL)
				continue;
			if (d->phase != DIAL_RETRY)
				rev = fds[i++].revents;
			if ((rv = mesh_dial_step(
			         m, p, rev, err, errlen, deadline))
			    != COHORT_OK)
				goto out;
		}
	}
out:
	if (rv != COHORT_OK)
		for (int i = 0; i < k; i++)
			mesh_dial_free(&m->links[peers[i]]);
	mesh_refusals_log(m);
	return (rv);
}

void
host_mesh_listen_done(struct host_mesh *m)
{
	mesh_stop_listening(m);
}

/* ------------------------------------------------------------------------ */
/* A hierarchy child's watch of its parent's connections                    */
/* ------------------------------------------------------------------------ */

cohort_status
host_mesh_watch(struct host_mesh *m, const struct host_mesh *parent, char *err,
    size_t errlen)
{
	size_t n = (size_t)(m->size + parent->size + 2);
	struct pollfd *p = host_zalloc(n, sizeof(*p));

	if (p == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	host_zfree(m->pfds, m->npfds, sizeof(*m->pfds));
	m->pfds = p;
	m->npfds = n;
	m->watch = parent;
	return (COHORT_OK);
}

int
host_mesh_watch_add(struct host_mesh *m, struct pollfd *fds, int n)
{
	const struct host_mesh *w = m->watch;
	int k = 0;

	if (w == NULL)
		return (0);
	for (int p = 0; p < w->size; p++) {
		if (p == w->rank || p == m->watch_lost || w->links[p].fd < 0)
			continue;
		fds[n + k].fd = w->links[p].fd;
		fds[n + k].events = POLLRDHUP;
		fds[n + k].revents = 0;
		k++;
	}
	return (k);
}

cohort_status
host_mesh_watch_check(struct host_mesh *m, const struct host_op *c,
    const struct pollfd *fds, int k, char *err, size_t errlen)
{
	const struct host_mesh *w = m->watch;
	int i = 0;
	cohort_status rv;

	for (int p = 0; w != NULL && p < w->size && i < k; p++) {
		if (p == w->rank || p == m->watch_lost || w->links[p].fd < 0)
			continue;
		if ((fds[i++].revents & (POLLRDHUP | POLLHUP | POLLERR)) != 0
		    && m->watch_lost < 0) {
			m->watch_lost = p;
			m->watch_lost_ns = cohort__now_ns();
		}
	}
	if (w == NULL || m->watch_lost < 0
	    || cohort__now_ns() - m->watch_lost_ns
	        < (uint64_t)HOST_WATCH_GRACE_MS * 1000000u)
		return (COHORT_OK);
	if ((rv = host_mesh_check_abort(m, c, err, errlen)) != COHORT_OK)
		return (rv);
	if (atomic_load_explicit(
	        (atomic_int *)&w->aborted, memory_order_acquire)) {
		snprintf(
		    err, errlen, "%s #%" PRIu64 " aborted", c->name, c->seq);
		return (COHORT_EABORTED);
	}
	snprintf(err, errlen,
	    "rank %d closed the connection during %s #%" PRIu64
	    " (hierarchical all-reduce; this rank still waited %d ms later)",
	    (int)w->links[m->watch_lost].job_rank, c->name, c->seq,
	    HOST_WATCH_GRACE_MS);
	return (COHORT_EPEERLOST);
}

/* ------------------------------------------------------------------------ */
/* For the point-to-point connections (p2p.c)                               */
/* ------------------------------------------------------------------------ */

cohort_status
host_net_listen(const char *bind_addr, int *lfd, char *addr, size_t addrlen,
    char *err, size_t errlen)
{
	struct host_mesh tmp;
	cohort_status rv;

	memset(&tmp, 0, sizeof(tmp));
	tmp.lfd = -1;
	if (bind_addr != NULL)
		cohort__strlcpy(
		    tmp.bind_addr, bind_addr, sizeof(tmp.bind_addr));
	if ((rv = mesh_listen(&tmp, err, errlen)) != COHORT_OK)
		return (rv);
	*lfd = tmp.lfd;
	cohort__strlcpy(addr, tmp.addr, addrlen);
	return (COHORT_OK);
}

cohort_status
host_net_parse_addr(
    const char *s, size_t len, struct sockaddr_storage *ss, socklen_t *sl)
{
	struct mesh_addr a;
	cohort_status rv;

	if ((rv = mesh_parse_addr(s, len, &a)) != COHORT_OK)
		return (rv);
	*ss = a.ss;
	*sl = a.len;
	return (COHORT_OK);
}

void
host_net_sockopts(int fd, bool nodelay)
{
	mesh_sockopts(fd, nodelay);
}

cohort_status
host_net_random(uint8_t *buf, size_t len, char *err, size_t errlen)
{
	return (mesh_random(buf, len, err, errlen));
}

int
host_net_pend_step(struct cohort__tcp_pend *pc,
    const struct cohort__tcp_hs_keys *k, uint32_t rank_a,
    bool (*taken)(void *ctx, uint32_t rank), void *ctx, uint32_t *rank_c,
    uint32_t *reason)
{
	uint8_t ac[COHORT__TCP_ACCEPT_LEN];
	ssize_t n = recv(pc->fd, pc->buf + pc->have,
	    sizeof(pc->buf) - pc->have, MSG_DONTWAIT);

	if (n > 0)
		pc->have += (size_t)n;
	if (n == 0
	    || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK
	        && errno != EINTR))
		goto closed;
	if (pc->have < sizeof(pc->buf)) {
		*reason = COHORT__TCP_HS_TIMEOUT;
		return (cohort__now_ms() > pc->deadline ? -2 : 0);
	}
	*reason = cohort__tcp_hs_check_chello(
	    pc->buf, pc->have, k, pc->nonce, rank_a, rank_c);
	if (*reason == COHORT__TCP_HS_OK && taken(ctx, *rank_c))
		*reason = COHORT__TCP_HS_DUPLICATE;
	if (*reason != COHORT__TCP_HS_OK)
		return (-2);
	cohort__tcp_hs_put_accept(
	    ac, k, pc->nonce, pc->buf + 44, *rank_c, rank_a);
	if (send(pc->fd, ac, sizeof(ac), MSG_DONTWAIT | MSG_NOSIGNAL)
	    != (ssize_t)sizeof(ac))
		goto closed;
	mesh_sockopts(pc->fd, true);
	return (1);
closed:
	close(pc->fd);
	pc->fd = -1;
	return (-1);
}

/* ------------------------------------------------------------------------ */
/* The process's running operations (host_crowded)                         */
/* ------------------------------------------------------------------------ */

static atomic_int host_running;
static atomic_int host_cpus;

void
host_crowd_enter(void)
{
	atomic_fetch_add_explicit(&host_running, 1, memory_order_relaxed);
}

void
host_crowd_leave(void)
{
	atomic_fetch_sub_explicit(&host_running, 1, memory_order_relaxed);
}

bool
host_crowded(void)
{
	int cpus = atomic_load_explicit(&host_cpus, memory_order_relaxed);

	if (cpus == 0) {
		long n = sysconf(_SC_NPROCESSORS_ONLN);

		cpus = n > 0 ? (int)n : 1;
		atomic_store_explicit(&host_cpus, cpus, memory_order_relaxed);
	}
	return (
	    atomic_load_explicit(&host_running, memory_order_relaxed) > cpus);
}
