/*
 * tcp.c - the tcp data-plane backend: host memory, peer to peer, one TCP
 * connection per pair of ranks.
 *
 * Mesh setup (init), in order:
 *  1. Listen on bind_addr (default 127.0.0.1), ephemeral port.
 *  2. Publish "host:port" under tcp/<group_id>/<generation>/addr/<rank>.
 *  3. For every higher rank j, ascending: fetch its address (waits), connect
 *     (non-blocking, polled, retried while refused) and handshake as the
 *     connector.
 *  4. Accept until every lower rank has connected, handshaking with all
 *     pending connections at once, so a silent or bogus connection delays
 *     nobody. Then close the listener.
 *  This order cannot deadlock: the highest rank only accepts, and each
 *  rank reaches step 4 once the ranks above it did.
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
 * TCP_MAX_PENDING connections in the handshake, at most TCP_PER_SOURCE of
 * them from one IP address, and a connection that has not sent its hello
 * within COHORT_TCP_HS_TIMEOUT_MS (2 s) is dropped. A newcomer is never
 * turned away: it evicts the oldest pending connection of its own source
 * when that source is at its share, or of the source holding the most
 * when the table is full. A connector that is evicted (told BUSY) or
 * closed on before its hello was judged connects again while its connect
 * window lasts, so a real peer gets in even through a flood from its own
 * address; it only reports EAUTH when the acceptor judged its proof.

 * Same-host shared memory (shm.c): right after the mesh is up, rank 0
 * offers the group a POSIX shared-memory segment over these connections;
 * if every rank can map it (same host, same /dev/shm), allreduce runs
 * through it - one copy in, the reduction, one copy out per byte, like
 * Open MPI's vader - while the connections stay open as the liveness
 * channel (a dead peer's FIN ends the wait with EPEERLOST naming it). All
 * other collectives, and every group that spans hosts, use TCP.
 * COHORT_TCP_SHM=0 forces pure TCP; COHORT_TCP_SHM_MIN/MAX (0, unlimited)
 * bound the allreduce sizes that use the segment; COHORT_TCP_SHM_BLK
 * (128 KiB) is its block, one rank's share of a pipelined round;
 * COHORT_TCP_SHM_SPINS (16, 0 with more ranks than CPUs) the busy-wait
 * pauses before a waiting rank yields.
 * Measured (tcp_microbench, 2 cores, f32 sum, medians): 2 ranks 4 KiB
 * 0.7 us, 1/16/64 MiB 10.4/7.5/7.2 GB/s busbw; 4 ranks 7 us, 6.8/4.5/4.2;
 * pure TCP 13 us, 1.3-1.6/1.3-1.5/1.3-1.4 and 56 us, 0.6/0.7/0.8.
 *
 * Tunables (environment, read at init; defaults measured on a 2-core VM,
 * loopback): COHORT_TCP_SMALL_MAX (64 KiB: allreduce by recursive doubling
 * up to here, ring above; also the direct allgather / reduce_scatter
 * limit), COHORT_TCP_BCAST_SMALL (64 KiB: root sends to all up to here,
 * pipelined chain above), COHORT_TCP_PAIR_MIN/MAX (2 ranks: pairwise
 * exchange instead of the ring for sizes in range; off by default),
 * COHORT_TCP_IO_MAX (256 KiB per send/recv), COHORT_TCP_RING (256 KiB,
 * cache-sized reduce scratch), COHORT_TCP_ACC (4 MiB, partial-sum ring of
 * reduce_scatter and reduce), COHORT_TCP_SOCKBUF (0 = kernel autotuning),
 * COHORT_TCP_SPIN_US (50: busy-poll before sleeping in poll(), yielding
 * the core meanwhile unless COHORT_TCP_SPIN_YIELD=0).
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
#include <sys/socket.h>
#include <unistd.h>

#include "handshake.h"
#include "tcp_impl.h"

/* A connection must send its hello within this time after the greeting
 * (COHORT_TCP_HS_TIMEOUT_MS). */
#define TCP_HS_TIMEOUT_MS 2000
/* Connections handshaking at once at an acceptor, and from one source
 * address; a newcomer evicts an older one (handshake.h). */
#define TCP_MAX_PENDING 64
#define TCP_PER_SOURCE 16
/* How long a rank tries to connect to a peer (COHORT_CONNECT_TIMEOUT_MS). */
#define TCP_CONNECT_TIMEOUT_MS 10000
/* Wait between connection attempts to a listener that refused. */
#define TCP_RETRY_MS 20

/* Defaults of the tunables (COHORT_TCP_*; measured on loopback). */
#define TCP_DEFAULT_SMALL_MAX (64u << 10)
#define TCP_DEFAULT_BCAST_SMALL (64u << 10)
#define TCP_DEFAULT_IO_MAX (256u << 10)
#define TCP_DEFAULT_RING (256u << 10)
#define TCP_DEFAULT_ACC (4u << 20)
#define TCP_DEFAULT_SMALL_SCRATCH (1u << 20)
#define TCP_DEFAULT_SPIN_US 50
#define TCP_DEFAULT_SHM_BLK (128u << 10)

struct tcp_addr {
	struct sockaddr_storage ss;
	socklen_t len;
};

/* ------------------------------------------------------------------------ */
/* Small helpers                                                            */
/* ------------------------------------------------------------------------ */

/* A tuning knob (common/knobs.h) in bytes or a count: dflt when unset or
 * malformed (warned once), SIZE_MAX for -1 ("no limit"). */
size_t
cohort__tcp_knob(enum cohort__knob k, size_t dflt)
{
	int64_t v = cohort__knob_int_or(k, -2);

	if (v == -2)
		return (dflt);
	return (v < 0 ? SIZE_MAX : (size_t)v);
}

static bool
tcp_aborted(const struct cohort__group_desc *desc)
{
	return (desc->abort_flag != NULL
	    && atomic_load_explicit(desc->abort_flag, memory_order_acquire));
}

static cohort_status
tcp_random(uint8_t *buf, size_t len, char *err, size_t errlen)
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
tcp_sockopts(int fd, bool nodelay)
{
	size_t sz = cohort__tcp_knob(COHORT__KNOB_TCP_SOCKBUF, 0);
	int one = 1;

	if (sz > 0) {
		int v = (int)sz;

		(void)setsockopt(fd, SOL_SOCKET, SO_SNDBUF, &v, sizeof(v));
		(void)setsockopt(fd, SOL_SOCKET, SO_RCVBUF, &v, sizeof(v));
	}
	if (nodelay)
		(void)setsockopt(
		    fd, IPPROTO_TCP, TCP_NODELAY, &one, sizeof(one));
}

/* The handshake time (COHORT_TCP_HS_TIMEOUT_MS). */
static int
tcp_hs_ms(void)
{
	return ((int)cohort__knob_int_or(
	    COHORT__KNOB_TCP_HS_TIMEOUT_MS, TCP_HS_TIMEOUT_MS));
}

cohort_status
cohort__tcp_io(atomic_int *abort_flag, int fd, void *buf, size_t len,
    size_t *done, bool sending, const char *during, int32_t peer, char *err,
    size_t errlen, cohort__time deadline)
{
	while (*done < len) {
		struct pollfd pfd;
		ssize_t n;
		int ms;

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
		ms = cohort__remaining(deadline);
		if (ms < 0 || ms > 100)
			ms = 100;
		pfd.fd = fd;
		pfd.events = sending ? POLLOUT : POLLIN;
		pfd.revents = 0;
		(void)poll(&pfd, 1, ms < 1 ? 1 : ms);
	}
	return (COHORT_OK);
}

static cohort_status
tcp_parse_addr(const char *s, size_t len, struct tcp_addr *out)
{
	char host[128];
	const char *colon;
	size_t hl;
	int64_t port;
	char portbuf[16];

	if (len == 0 || len >= 160)
		return (COHORT_EPROTO);
	{
		char tmp[160];

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
	}
	if (!cohort__parse_i64(portbuf, &port) || port <= 0 || port > 65535)
		return (COHORT_EPROTO);
	memset(out, 0, sizeof(*out));
	{
		struct sockaddr_in *sin = (struct sockaddr_in *)&out->ss;
		struct sockaddr_in6 *sin6 = (struct sockaddr_in6 *)&out->ss;

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
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Mesh setup                                                               */
/* ------------------------------------------------------------------------ */

static cohort_status
tcp_listen(const struct cohort__group_desc *desc, int *lfd, char *addr,
    size_t addrlen, char *err, size_t errlen)
{
	const char *host
	    = desc->bind_addr != NULL ? desc->bind_addr : "127.0.0.1";
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
	tcp_sockopts(fd, false);
	if (bind(fd, (struct sockaddr *)&ss, sl) != 0
	    || listen(fd, SOMAXCONN) != 0) {
		snprintf(
		    err, errlen, "listen on %s: %s", host, strerror(errno));
		goto out_close;
	}
	sl = sizeof(ss);
	if (getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		snprintf(err, errlen, "getsockname: %s", strerror(errno));
		goto out_close;
	}
	if (ss.ss_family == AF_INET) {
		inet_ntop(AF_INET, &sin->sin_addr, shown, sizeof(shown));
		snprintf(addr, addrlen, "%s:%u", shown,
		    (unsigned)ntohs(sin->sin_port));
	} else {
		inet_ntop(AF_INET6, &sin6->sin6_addr, shown, sizeof(shown));
		snprintf(addr, addrlen, "[%s]:%u", shown,
		    (unsigned)ntohs(sin6->sin6_port));
	}
	*lfd = fd;
	return (COHORT_OK);

out_close:
	close(fd);
	return (COHORT_ESYSTEM);
}

static void
tcp_key(
    const struct cohort__group_desc *desc, int rank, char *key, size_t keylen)
{
	snprintf(key, keylen, "tcp/%s/%" PRIu64 "/addr/%d", desc->group_id,
	    desc->generation, rank);
}

/* Says why rank jr at addr could not be reached, and what to check. */
static void
tcp_connect_error(const struct cohort__group_desc *desc, int32_t jr,
    const char *addr, int soerr, int64_t waited_ms, char *err, size_t errlen)
{
	size_t off = 0;
	bool loopback
	    = strncmp(addr, "127.", 4) == 0 || strncmp(addr, "[::1]", 5) == 0;

	cohort__appendf(err, errlen, &off,
	    "cannot connect to rank %d at %s: %s (tried for %.1f s)", (int)jr,
	    addr, strerror(soerr), (double)waited_ms / 1000.0);
	if (loopback && desc->bind_addr != NULL
	    && strncmp(desc->bind_addr, "127.", 4) != 0)
		cohort__appendf(err, errlen, &off,
		    "; rank %d advertises a loopback address while this rank "
		    "is at %s: set COHORT_DATA_ADDR or COHORT_DATA_IFACE on "
		    "rank %d's host",
		    (int)jr, desc->bind_addr, (int)jr);
	else
		cohort__appendf(err, errlen, &off,
		    "; check that this host reaches %s (firewall, network "
		    "policy) or set COHORT_DATA_ADDR / COHORT_DATA_IFACE on "
		    "rank %d",
		    addr, (int)jr);
}

/* Answers a refusal (CHR1) or a malformed answer of rank jr. */
static cohort_status
tcp_hs_refused(
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

/* The connector's half of the handshake with group rank j on a connected
 * fd. *retry: the acceptor dropped us before judging our hello (busy, or
 * closed); another connection may succeed. */
static cohort_status
tcp_hs_connect(const struct cohort__group_desc *desc,
    const struct cohort__tcp_hs_keys *k, int fd, int j, bool *retry, char *err,
    size_t errlen, cohort__time deadline)
{
	int32_t jr = desc->global_ranks[j];
	uint8_t in[COHORT__TCP_ACCEPT_LEN], ch[COHORT__TCP_CHELLO_LEN];
	uint8_t na[16], nc[16];
	size_t have = 0, need = 4, sent = 0;
	uint32_t reason = 0;
	cohort__time hs_deadline;
	cohort_status rv;
	int p;

	*retry = false;
	/* The greeting comes when the acceptor is done connecting to the
	 * ranks above it: wait as long as the operation may. */
	do {
		if ((rv = cohort__tcp_io(desc->abort_flag, fd, in, need, &have,
		         false, "handshake", jr, err, errlen, deadline))
		    != COHORT_OK) {
			*retry = rv == COHORT_EPEERLOST;
			return (rv);
		}
		p = cohort__tcp_hs_parse_shello(
		    in, have, (uint32_t)j, na, &need, &reason);
	} while (p == 0);
	if (p < 0)
		return (tcp_hs_refused(jr, p, reason, retry, err, errlen));

	if ((rv = tcp_random(nc, 16, err, errlen)) != COHORT_OK)
		return (rv);
	cohort__tcp_hs_put_chello(
	    ch, k, na, nc, (uint32_t)desc->rank, (uint32_t)j);
	hs_deadline = cohort__now_ms() + tcp_hs_ms();
	if (hs_deadline > deadline)
		hs_deadline = deadline;
	rv = cohort__tcp_io(desc->abort_flag, fd, ch, sizeof(ch), &sent, true,
	    "handshake", jr, err, errlen, hs_deadline);
	/* Even when the send failed, a refusal may be waiting. The acceptor
	 * answers as soon as it reads the hello: wait longer for that than
	 * the handshake time, so a loaded machine does not make us give up
	 * on a connection it already accepted. */
	hs_deadline = cohort__now_ms() + 5 * (cohort__time)tcp_hs_ms();
	if (hs_deadline > deadline)
		hs_deadline = deadline;
	have = 0;
	need = 4;
	do {
		cohort_status rrv
		    = cohort__tcp_io(desc->abort_flag, fd, in, need, &have,
		        false, "handshake", jr, err, errlen, hs_deadline);

		if (rrv != COHORT_OK) {
			*retry = (rrv == COHORT_EPEERLOST
			             || rrv == COHORT_ETIMEDOUT)
			    && !cohort__expired(deadline);
			return (rv != COHORT_OK ? rv : rrv);
		}
		p = cohort__tcp_hs_parse_answer(in, have, k, na, nc,
		    (uint32_t)desc->rank, (uint32_t)j, &need, &reason);
	} while (p == 0);
	if (p < 0)
		return (tcp_hs_refused(jr, p, reason, retry, err, errlen));
	return (rv);
}

/* Connects to rank jr at addr, retrying until window closes (refused:
 * not listening yet; unreachable: a route still coming up). */
static cohort_status
tcp_dial(const struct cohort__group_desc *desc, const struct tcp_addr *a,
    int32_t jr, const char *shown, cohort__time start, cohort__time window,
    int *out, char *err, size_t errlen, cohort__time deadline)
{
	struct tcp_addr addr = *a;
	int fd = -1, soerr = 0;

	for (;;) {
		struct pollfd pfd;
		socklen_t sl = sizeof(soerr);

		if (tcp_aborted(desc)) {
			snprintf(err, errlen,
			    "aborted while connecting to rank %d", (int)jr);
			return (COHORT_EABORTED);
		}
		fd = socket(addr.ss.ss_family,
		    SOCK_STREAM | SOCK_NONBLOCK | SOCK_CLOEXEC, 0);
		if (fd < 0) {
			snprintf(err, errlen, "socket: %s", strerror(errno));
			return (COHORT_ESYSTEM);
		}
		tcp_sockopts(fd, true);
		if (connect(fd, (struct sockaddr *)&addr.ss, addr.len) == 0)
			goto out_connected;
		soerr = errno;
		if (soerr == EINPROGRESS) {
			soerr = ETIMEDOUT;
			for (;;) {
				int ms = cohort__remaining(window);

				if (ms < 0 || ms > 100)
					ms = 100;
				pfd.fd = fd;
				pfd.events = POLLOUT;
				pfd.revents = 0;
				if (poll(&pfd, 1, ms < 1 ? 1 : ms) > 0) {
					if (getsockopt(fd, SOL_SOCKET,
					        SO_ERROR, &soerr, &sl)
					    != 0)
						soerr = errno;
					break;
				}
				if (cohort__expired(window)
				    || tcp_aborted(desc))
					break;
			}
			if (soerr == 0)
				goto out_connected;
		}
		close(fd);
		fd = -1;
		if (tcp_aborted(desc))
			continue; /* reported at the loop's top */
		if (cohort__expired(window)) {
			tcp_connect_error(desc, jr, shown, soerr,
			    cohort__now_ms() - start, err, errlen);
			return (cohort__expired(deadline) ? COHORT_ETIMEDOUT
			                                  : COHORT_EPEERLOST);
		}
		/* refused: not listening yet or any more; unreachable: a
		 * route or neighbour still coming up. Both may pass. */
		(void)poll(
		    NULL, 0, soerr == ECONNREFUSED ? TCP_RETRY_MS : 200);
	}

out_connected:
	*out = fd;
	return (COHORT_OK);
}

/* Connects to group rank j and runs the connector's half of the handshake.
 * On success *out is the connected socket. */
static cohort_status
tcp_connect_peer(const struct cohort__group_desc *desc,
    const struct cohort__tcp_hs_keys *k, int j, int *out, char *err,
    size_t errlen, cohort__time deadline)
{
	int32_t jr = desc->global_ranks[j];
	char key[COHORT__MAX_KEY];
	struct tcp_addr addr;
	void *val = NULL;
	size_t vlen = 0;
	char shown[160];
	cohort__time start, window;
	cohort_status rv;
	int fd = -1;

	tcp_key(desc, j, key, sizeof(key));
	if ((rv = desc->store.get(desc->store.ctx, key, &val, &vlen, deadline))
	    != COHORT_OK) {
		snprintf(err, errlen,
		    "no address from rank %d (store key %s):"
		    " %s",
		    (int)jr, key, cohort_status_name(rv));
		return (rv);
	}
	rv = tcp_parse_addr(val, vlen, &addr);
	snprintf(shown, sizeof(shown), "%.*s", (int)vlen, (const char *)val);
	free(val);
	if (rv != COHORT_OK) {
		snprintf(
		    err, errlen, "bad address published by rank %d", (int)jr);
		return (COHORT_EPROTO);
	}

	/*
	 * Connect, retrying until the connect window closes: the peer
	 * listens before it publishes, so a refusal or an unreachable
	 * address that lasts longer than COHORT_CONNECT_TIMEOUT_MS is a
	 * configuration error (a loopback or wrong address advertised, a
	 * firewall), reported with the address rather than waited out to
	 * the operation's timeout.
	 */
	start = cohort__now_ms();
	window = cohort__deadline(
	    (cohort_duration)cohort__knob_int_or(
	        COHORT__KNOB_CONNECT_TIMEOUT_MS, TCP_CONNECT_TIMEOUT_MS),
	    COHORT_WAIT_FOREVER);
	if (window > deadline)
		window = deadline;
	for (int attempts = 1;; attempts++) {
		bool retry = false;

		if ((rv = tcp_dial(desc, &addr, jr, shown, start, window, &fd,
		         err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		rv = tcp_hs_connect(
		    desc, k, fd, j, &retry, err, errlen, deadline);
		if (rv == COHORT_OK) {
			*out = fd;
			return (COHORT_OK);
		}
		close(fd);
		fd = -1;
		/* Dropped by a busy listener: another connect window from
		 * the first time (the wait for the greeting may have used
		 * up the first one). */
		if (retry && attempts == 1) {
			window = cohort__deadline(
			    (cohort_duration)cohort__knob_int_or(
			        COHORT__KNOB_CONNECT_TIMEOUT_MS,
			        TCP_CONNECT_TIMEOUT_MS),
			    COHORT_WAIT_FOREVER);
			if (window > deadline)
				window = deadline;
		}
		if (!retry || cohort__expired(window)) {
			if (attempts > 1)
				cohort__appendf(err, errlen,
				    &(size_t) { strlen(err) },
				    " (%d attempts in %.1f s)", attempts,
				    (double)(cohort__now_ms() - start)
				        / 1000.0);
			return (rv);
		}
		cohort__debug("tcp group %s rank %d: %s; connecting again",
		    desc->group_id, desc->rank, err);
		(void)poll(NULL, 0, TCP_RETRY_MS);
	}
}

/* The source address of an accepted connection, as 16 bytes. */
static void
tcp_src(const struct sockaddr_storage *ss, uint8_t src[16])
{
	memset(src, 0, 16);
	if (ss->ss_family == AF_INET)
		memcpy(src, &((const struct sockaddr_in *)ss)->sin_addr, 4);
	else if (ss->ss_family == AF_INET6)
		memcpy(src, &((const struct sockaddr_in6 *)ss)->sin6_addr, 16);
}

/* Tells a pending connection why it is turned away, and closes it. */
static void
tcp_refuse(const struct cohort__group_desc *desc, struct cohort__tcp_pend *pc,
    uint32_t reason, int *refused)
{
	uint8_t msg[COHORT__TCP_REFUSAL_LEN];

	cohort__tcp_hs_put_refusal(msg, reason);
	(void)send(pc->fd, msg, sizeof(msg), MSG_DONTWAIT | MSG_NOSIGNAL);
	cohort__debug("tcp group %s rank %d: refused a connection: %s",
	    desc->group_id, desc->rank, cohort__tcp_hs_reason_text(reason));
	refused[reason <= COHORT__TCP_HS_REASON_MAX ? reason : 0]++;
	close(pc->fd);
	pc->fd = -1;
}

/* One warning for all the connections refused during a mesh setup. */
static void
tcp_refusals_log(const struct cohort__group_desc *desc, const int *refused)
{
	char text[512];
	size_t off = 0;
	int total = 0;

	for (int r = 1; r <= COHORT__TCP_HS_REASON_MAX; r++) {
		if (refused[r] == 0)
			continue;
		cohort__appendf(text, sizeof(text), &off, "%s%d: %s",
		    total > 0 ? "; " : "", refused[r],
		    cohort__tcp_hs_reason_text((uint32_t)r));
		total += refused[r];
	}
	if (total > 0)
		cohort__warn("tcp group %s rank %d: refused %d connection%s "
		             "while the mesh formed (%s)",
		    desc->group_id, desc->rank, total, total == 1 ? "" : "s",
		    text);
}

/* Accepts a new connection into the pending table (evicting an older one
 * if it must, handshake.h) and greets it. */
static cohort_status
tcp_admit(const struct cohort__group_desc *desc, struct cohort__tcp_pend *pend,
    int fd, const struct sockaddr_storage *ss, int *refused, char *err,
    size_t errlen)
{
	uint8_t src[16], sh[COHORT__TCP_SHELLO_LEN];
	struct cohort__tcp_pend *pc;
	bool evict;
	int i;
	cohort_status rv;

	tcp_src(ss, src);
	i = cohort__tcp_pend_admit(
	    pend, TCP_MAX_PENDING, src, TCP_PER_SOURCE, &evict);
	pc = &pend[i];
	if (evict)
		tcp_refuse(desc, pc, COHORT__TCP_HS_BUSY, refused);
	memset(pc, 0, sizeof(*pc));
	pc->fd = fd;
	memcpy(pc->src, src, 16);
	pc->since = cohort__now_ms();
	pc->deadline = pc->since + tcp_hs_ms();
	if ((rv = tcp_random(pc->nonce, 16, err, errlen)) != COHORT_OK) {
		close(fd);
		pc->fd = -1;
		return (rv);
	}
	cohort__tcp_hs_put_shello(sh, (uint32_t)desc->rank, pc->nonce);
	if (send(fd, sh, sizeof(sh), MSG_DONTWAIT | MSG_NOSIGNAL)
	    != (ssize_t)sizeof(sh)) {
		close(fd);
		pc->fd = -1;
	}
	return (COHORT_OK);
}

/* Reads what a pending connection sent; judges its hello when complete.
 * Returns true when it became rank peers' connection. */
static bool
tcp_progress(const struct cohort__group_desc *desc, struct cohort__tcp *t,
    const struct cohort__tcp_hs_keys *k, struct cohort__tcp_pend *pc,
    int *refused)
{
	uint8_t ac[COHORT__TCP_ACCEPT_LEN];
	uint32_t reason, rc = 0;
	ssize_t n;

	n = recv(pc->fd, pc->buf + pc->have, sizeof(pc->buf) - pc->have,
	    MSG_DONTWAIT);
	if (n > 0)
		pc->have += (size_t)n;
	if (n == 0
	    || (n < 0 && errno != EAGAIN && errno != EWOULDBLOCK
	        && errno != EINTR)) {
		cohort__debug("tcp group %s rank %d: a connection closed "
		              "before completing the handshake",
		    desc->group_id, desc->rank);
		close(pc->fd);
		pc->fd = -1;
		return (false);
	}
	if (pc->have < sizeof(pc->buf)) {
		if (cohort__now_ms() > pc->deadline)
			tcp_refuse(desc, pc, COHORT__TCP_HS_TIMEOUT, refused);
		return (false);
	}
	reason = cohort__tcp_hs_check_chello(
	    pc->buf, pc->have, k, pc->nonce, (uint32_t)desc->rank, &rc);
	if (reason == COHORT__TCP_HS_OK && t->peers[rc].fd >= 0)
		reason = COHORT__TCP_HS_DUPLICATE;
	if (reason != COHORT__TCP_HS_OK) {
		cohort__warn("tcp group %s rank %d: refused a connection: %s",
		    desc->group_id, desc->rank,
		    cohort__tcp_hs_reason_text(reason));
		tcp_refuse(desc, pc, reason, refused);
		return (false);
	}
	cohort__tcp_hs_put_accept(
	    ac, k, pc->nonce, pc->buf + 44, rc, (uint32_t)desc->rank);
	if (send(pc->fd, ac, sizeof(ac), MSG_DONTWAIT | MSG_NOSIGNAL)
	    != (ssize_t)sizeof(ac)) {
		close(pc->fd);
		pc->fd = -1;
		return (false);
	}
	tcp_sockopts(pc->fd, true);
	t->peers[rc].fd = pc->fd;
	pc->fd = -1;
	return (true);
}

/* Accepts connections until every lower rank is connected. */
static cohort_status
tcp_accept_all(const struct cohort__group_desc *desc, struct cohort__tcp *t,
    int lfd, const struct cohort__tcp_hs_keys *k, char *err, size_t errlen,
    cohort__time deadline)
{
	struct cohort__tcp_pend pend[TCP_MAX_PENDING];
	struct pollfd pfd[TCP_MAX_PENDING + 1];
	int refused[COHORT__TCP_HS_REASON_MAX + 1] = { 0 };
	int need = desc->rank;
	cohort_status rv = COHORT_OK;

	for (int i = 0; i < TCP_MAX_PENDING; i++)
		pend[i].fd = -1;
	while (need > 0) {
		int nfds = 0;
		int ms;

		if (tcp_aborted(desc)) {
			snprintf(err, errlen,
			    "aborted while waiting for "
			    "lower ranks to connect");
			rv = COHORT_EABORTED;
			goto out_close_pending;
		}
		if (cohort__expired(deadline)) {
			size_t off = 0;

			cohort__appendf(err, errlen, &off,
			    "timed out waiting "
			    "for ranks to connect:");
			for (int r = 0; r < desc->rank; r++)
				if (t->peers[r].fd < 0)
					cohort__appendf(err, errlen, &off,
					    " %d", (int)desc->global_ranks[r]);
			rv = COHORT_ETIMEDOUT;
			goto out_close_pending;
		}
		pfd[nfds].fd = lfd;
		pfd[nfds].events = POLLIN;
		pfd[nfds++].revents = 0;
		for (int i = 0; i < TCP_MAX_PENDING; i++) {
			if (pend[i].fd < 0)
				continue;
			pfd[nfds].fd = pend[i].fd;
			pfd[nfds].events = POLLIN;
			pfd[nfds++].revents = 0;
		}
		ms = cohort__remaining(deadline);
		if (ms < 0 || ms > 100)
			ms = 100;
		(void)poll(pfd, (nfds_t)nfds, ms < 1 ? 1 : ms);

		/* New connections: each gets a slot and a fresh nonce. */
		for (int n = 0; n < TCP_MAX_PENDING; n++) {
			struct sockaddr_storage ss;
			socklen_t sl = sizeof(ss);
			int fd = accept4(lfd, (struct sockaddr *)&ss, &sl,
			    SOCK_NONBLOCK | SOCK_CLOEXEC);

			if (fd < 0)
				break;
			if ((rv = tcp_admit(
			         desc, pend, fd, &ss, refused, err, errlen))
			    != COHORT_OK)
				goto out_close_pending;
		}

		/* Progress the pending handshakes. */
		for (int i = 0; i < TCP_MAX_PENDING; i++)
			if (pend[i].fd >= 0
			    && tcp_progress(desc, t, k, &pend[i], refused))
				need--;
	}
	rv = COHORT_OK;

out_close_pending:
	for (int i = 0; i < TCP_MAX_PENDING; i++)
		if (pend[i].fd >= 0)
			close(pend[i].fd);
	tcp_refusals_log(desc, refused);
	return (rv);
}

/* ------------------------------------------------------------------------ */
/* Ops                                                                      */
/* ------------------------------------------------------------------------ */

void
cohort__tcp_close(struct cohort__tcp *t)
{
	if (t == NULL)
		return;
	cohort__tcp_hier_free(t);
	if (t->peers != NULL)
		for (int p = 0; p < t->size; p++)
			if (t->peers[p].fd >= 0)
				close(t->peers[p].fd);
	cohort__tcp_shm_free(t);
	free(t->peers);
	free(t->steps);
	free(t->pfds);
	free(t->pfd_peer);
	free(t->hdrs);
	free(t->small);
	free(t->ring);
	free(t->acc);
	free(t);
}

static uint8_t *
tcp_prefaulted(size_t len)
{
	uint8_t *p = malloc(len);

	if (p != NULL)
		memset(p, 0, len);
	return (p);
}

cohort_status
cohort__tcp_open(const struct cohort__group_desc *desc,
    const struct cohort__tcp *parent, struct cohort__tcp **out, char *err,
    size_t errlen, cohort__time deadline)
{
	struct cohort__tcp *t;
	int nwatch = parent != NULL ? parent->size : 0;
	struct cohort__tcp_hs_keys keys;
	char addr[96];
	char key[COHORT__MAX_KEY];
	int lfd = -1;
	cohort_status rv;

	if (desc->size < 1 || desc->rank < 0 || desc->rank >= desc->size) {
		snprintf(
		    err, errlen, "bad rank %d of %d", desc->rank, desc->size);
		return (COHORT_EINVAL);
	}
	if ((t = calloc(1, sizeof(*t))) == NULL)
		goto out_nomem;
	t->rank = desc->rank;
	t->size = desc->size;
	t->abort_flag = desc->abort_flag;
	t->watch = parent;
	t->watch_lost = -1;
	t->agreed = parent != NULL;
	atomic_init(&t->aborted, 0);
	t->opname = "init";
	t->small_max = cohort__tcp_knob(
	    COHORT__KNOB_TCP_SMALL_MAX, TCP_DEFAULT_SMALL_MAX);
	t->bcast_small = cohort__tcp_knob(
	    COHORT__KNOB_TCP_BCAST_SMALL, TCP_DEFAULT_BCAST_SMALL);
	t->pair_min = cohort__tcp_knob(COHORT__KNOB_TCP_PAIR_MIN, 0);
	t->pair_max = cohort__tcp_knob(COHORT__KNOB_TCP_PAIR_MAX, SIZE_MAX);
	t->io_max
	    = cohort__tcp_knob(COHORT__KNOB_TCP_IO_MAX, TCP_DEFAULT_IO_MAX);
	t->spin_us = (int)cohort__tcp_knob(
	    COHORT__KNOB_TCP_SPIN_US, TCP_DEFAULT_SPIN_US);
	t->spin_yield = cohort__tcp_knob(COHORT__KNOB_TCP_SPIN_YIELD, 1) != 0;
	t->ring_len = cohort__tcp_knob(COHORT__KNOB_TCP_RING, TCP_DEFAULT_RING)
	    & ~(size_t)7;
	t->acc_len = cohort__tcp_knob(COHORT__KNOB_TCP_ACC, TCP_DEFAULT_ACC)
	    & ~(size_t)7;
	t->shm_min = cohort__tcp_knob(COHORT__KNOB_TCP_SHM_MIN, 0);
	t->shm_max = cohort__tcp_knob(COHORT__KNOB_TCP_SHM_MAX, SIZE_MAX);
	t->shm_hot_spins = (int)cohort__tcp_knob(COHORT__KNOB_TCP_SHM_SPINS,
	    t->size > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 16);
	t->esize = 1;
	if ((t->peers = calloc((size_t)t->size, sizeof(*t->peers))) == NULL
	    || (t->steps = calloc(2 * (size_t)t->size, sizeof(*t->steps)))
	        == NULL
	    || (t->pfds
	           = calloc((size_t)(t->size + nwatch + 2), sizeof(*t->pfds)))
	        == NULL
	    || (t->pfd_peer = calloc((size_t)t->size, sizeof(int))) == NULL
	    || (t->hdrs = calloc((size_t)t->size, COHORT__TCP_OP_HDR)) == NULL)
		goto out_nomem;
	for (int p = 0; p < t->size; p++) {
		t->peers[p].fd = -1;
		t->peers[p].job_rank
		    = desc->global_ranks != NULL ? desc->global_ranks[p] : p;
	}
	if (t->size == 1)
		goto done;
	if ((t->ring = tcp_prefaulted(t->ring_len)) == NULL)
		goto out_nomem;
	if ((rv = cohort__tcp_grow_small(
	         t, TCP_DEFAULT_SMALL_SCRATCH, err, errlen))
	    != COHORT_OK)
		goto out_free;

	if ((rv = tcp_listen(desc, &lfd, addr, sizeof(addr), err, errlen))
	    != COHORT_OK)
		goto out_free;
	tcp_key(desc, desc->rank, key, sizeof(key));
	if ((rv = desc->store.set(
	         desc->store.ctx, key, addr, strlen(addr), deadline))
	    != COHORT_OK) {
		snprintf(err, errlen,
		    "publishing the address (store key %s): "
		    "%s",
		    key, cohort_status_name(rv));
		goto out_close_listener;
	}
	keys.secret = desc->secret;
	keys.secret_len = desc->secret_len;
	cohort__tcp_hs_ident(
	    desc->job, desc->group_id, desc->generation, keys.ident);
	for (int j = desc->rank + 1; j < desc->size; j++) {
		if ((rv = tcp_connect_peer(desc, &keys, j, &t->peers[j].fd,
		         err, errlen, deadline))
		    != COHORT_OK)
			goto out_close_listener;
	}
	if ((rv = tcp_accept_all(desc, t, lfd, &keys, err, errlen, deadline))
	    != COHORT_OK)
		goto out_close_listener;
	close(lfd);
	if ((rv = cohort__tcp_shm_setup(t,
	         cohort__tcp_knob(COHORT__KNOB_TCP_SHM, 1) != 0,
	         cohort__tcp_knob(
	             COHORT__KNOB_TCP_SHM_BLK, TCP_DEFAULT_SHM_BLK),
	         err, errlen, deadline))
	    != COHORT_OK)
		goto out_free;
	cohort__debug("tcp group %s: rank %d of %d connected (listened on %s"
	              "%s)",
	    desc->group_id, desc->rank, desc->size, addr,
	    t->shm != NULL ? ", shared memory" : "");
done:
	*out = t;
	return (COHORT_OK);

out_nomem:
	snprintf(err, errlen, "out of memory");
	rv = COHORT_ENOMEM;
	goto out_free;
out_close_listener:
	close(lfd);
out_free:
	cohort__tcp_close(t);
	return (rv);
}

static cohort_status
tcp_init(const struct cohort__group_desc *desc, void **state, char *err,
    size_t errlen, cohort__time deadline)
{
	struct cohort__tcp *t;
	cohort_status rv;

	if ((rv = cohort__tcp_open(desc, NULL, &t, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	if ((rv = cohort__tcp_hier_setup(t, desc, err, errlen, deadline))
	    != COHORT_OK) {
		cohort__tcp_close(t);
		return (rv);
	}
	*state = t;
	return (COHORT_OK);
}

static cohort_status
tcp_run(void *state, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	struct cohort__tcp *t = state;
	cohort_status rv;

	t->opname = cohort__op_name(op->kind);
	t->seq = op->seq;
	t->stats = op->stats;
	if ((rv = cohort__tcp_check_abort(t, err, errlen)) != COHORT_OK)
		return (rv);
	return (cohort__tcp_run_op(t, op, err, errlen, deadline));
}

void
cohort__tcp_abort_state(struct cohort__tcp *t)
{
	if (t == NULL)
		return;
	atomic_store_explicit(&t->aborted, 1, memory_order_release);
	for (int p = 0; p < t->size; p++)
		if (t->peers[p].fd >= 0)
			(void)shutdown(t->peers[p].fd, SHUT_RDWR);
	cohort__tcp_hier_abort(t);
}

static void
tcp_abort(void *state)
{
	cohort__tcp_abort_state(state);
}

static void
tcp_fini(void *state)
{
	cohort__tcp_close(state);
}

const struct cohort__backend_ops cohort__tcp_backend = {
	.version = COHORT__BACKEND_VERSION,
	.name = "tcp",
	.init = tcp_init,
	.run = tcp_run,
	.abort = tcp_abort,
	.fini = tcp_fini,
};
