/*
 * net.h - cohortd's own TCP listeners: the cohort protocol on tcp://
 * (sp.c), torch's TCPStore (torchstore.c) and HTTP (http.c), served by one
 * thread over epoll, with one set of bounds for all of them.
 *
 * A protocol is a table of functions (struct srv_proto), as nng's
 * transports are; this module owns what every connection has: the socket,
 * the peer's address, the output queue, a deadline, and the bounds a peer
 * cannot get around (docs/coordinator.md, Connections and limits):
 *
 *  - descriptors: the soft RLIMIT_NOFILE is raised to the hard one at
 *    start; connections are at most `max_conns` (what the descriptors
 *    leave after a reserve); when none is left, or accept() says EMFILE,
 *    the oldest connection that has not authenticated is closed to make
 *    room, and when there is none, the new connection is accepted on a
 *    spare descriptor and closed at once (it is told, not left in the
 *    backlog) and the listener rests 10 ms to 1 s before it accepts
 *    again: never a busy loop;
 *  - per source address: at most `max_pending_per_source` connections
 *    that have not authenticated; over it, that source's oldest one is
 *    closed;
 *  - memory: bytes of requests still arriving are taken as they arrive
 *    (srv_nconn_hold), bounded per connection by the protocol and in all
 *    by `max_pending_bytes`; a reply a client does not read is bounded
 *    per connection (`max_out`);
 *  - time: a connection's deadline (srv_nconn_deadline), set by its
 *    protocol (its first request, a request left incomplete, an idle
 *    HTTP connection), closes it with the reason in the log.
 *
 * "Authenticated" (srv_nconn_trust) is the protocol's word: a cohort
 * connection once a request of it was accepted with a job's token, a
 * TCPStore connection once its door let it in; HTTP never.
 *
 * Threads: everything on a connection happens on the net thread, but
 * srv_net_post (hand a reply over), srv_net_close_pipe and the counters,
 * which any thread may call.
 */
#ifndef COHORT_SRV_NET_H
#define COHORT_SRV_NET_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include <nng/nng.h>

#include "server.h"
#include "cohort_common.h"
#include "core/list.h"
#include "core/map.h"

/* listen()'s backlog for every cohortd listener (its own and nng's): as
 * deep as the kernel allows (it caps it at net.core.somaxconn, 4096 by
 * default since Linux 5.4), so that a burst of thousands of connects waits
 * in the accept queue instead of having its SYNs dropped and retried 1, 3,
 * 7 s later. A coordinator for more clients than somaxconn raises it
 * (docs/coordinator.md, Scale). */
#define SRV_LISTEN_BACKLOG 65535

/* Bounds (cohortd's options; 0 takes the default). */
struct srv_net_limits {
	/* Connections of all listeners (after the descriptors' reserve). */
	uint64_t max_conns;
	/* Connections that have not authenticated, per source address. */
	uint64_t max_pending_per_source;
	/* Bytes of requests still arriving, all connections. */
	uint64_t max_pending_bytes;
};

#define SRV_NET_DEFAULT_PENDING_PER_SOURCE                                    \
	COHORT__SRV_DEFAULT_PENDING_PER_SOURCE
#define SRV_NET_DEFAULT_PENDING_BYTES COHORT__SRV_DEFAULT_PENDING_BYTES
/* Descriptors kept for everything but connections (the journal, nng's
 * ipc:// and tls+tcp:// listeners, the status files). */
#define SRV_NET_FD_RESERVE 64u

struct srv_net;
struct srv_nconn;
struct srv_nlistener;
struct srv_npost;
struct srv_nsrc;

/* A protocol. Every function runs on the net thread. */
struct srv_proto {
	const char *name; /* "cohort", "torch store", "http" (logs) */
	size_t conn_size; /* its connection, starting with srv_nconn */
	/* A connection was accepted. False refuses it (closed at once). */
	bool (*opened)(struct srv_nconn *c, cohort__time now);
	/* There is input (or EOF): the protocol reads it (srv_nconn_recv)
	 * and handles what is complete. */
	void (*readable)(struct srv_nconn *c, cohort__time now);
	/* A reply posted with srv_net_post for c (also when c is closed:
	 * the protocol frees it then). */
	void (*delivered)(
	    struct srv_nconn *c, struct srv_npost *p, cohort__time now);
	/* c is closing (by either side, once): let go of what the core
	 * holds for it. May be NULL. */
	void (*closing)(struct srv_nconn *c);
	/* Frees what the protocol allocated in c (not c itself), once no
	 * posted reply refers to it. May be NULL. */
	void (*fini)(struct srv_nconn *c);
	/* Its output queue became empty (a protocol that stopped reading
	 * while it waited may read on). May be NULL. */
	void (*drained)(struct srv_nconn *c, cohort__time now);
};

/* A reply handed to the net thread (srv_net_post): the protocol embeds
 * it in what it hands over. */
struct srv_npost {
	struct srv_npost *next;
	struct srv_nconn *c; /* NULL: close_pipe */
	uint32_t close_pipe;
};

/* One chunk of a connection's output. */
struct srv_ochunk {
	struct srv_ochunk *next;
	const uint8_t *p;
	size_t len, off;
	size_t cap; /* own bytes after the header when > 0 */
	nng_msg *msg; /* referenced body, freed once written */
};

/* What every connection has; a protocol's connection starts with it. */
struct srv_nconn {
	int kind; /* first: what epoll's pointer names */
	struct srv_net *net;
	struct srv_nlistener *l;
	const struct srv_proto *proto;
	void *arg; /* the listener's protocol state */
	struct srv_link link; /* net->conns */
	struct srv_link plink; /* untrusted: net->pending (oldest first) */
	struct srv_link slink; /* untrusted: its source's (oldest first) */
	struct srv_nsrc *src;
	struct srv_hnode pn; /* net->pipes, when pipe != 0 */
	int fd;
	uint32_t pipe; /* the core's id of this connection, 0: none */
	int refs; /* replies posted or due that refer to it */
	bool dead; /* closed; freed once refs == 0 */
	bool trusted;
	bool rd_eof; /* the peer closed its side */
	bool rd_paused; /* not reading (the protocol asked) */
	bool in_poll, want_out;
	uint32_t events; /* what epoll watches now */
	cohort__time opened;
	cohort__time deadline; /* 0: none */
	bool deadline_warn;
	char deadline_why[96];
	uint64_t held; /* input bytes held (srv_nconn_hold) */
	uint64_t max_held; /* per connection; 0: only the global bound */
	struct srv_ochunk *oq, *otail;
	uint64_t out; /* bytes queued */
	uint64_t max_out; /* a client that lets more pile up is closed */
	struct sockaddr_storage sa; /* the peer */
	socklen_t salen;
	bool loopback;
	char peer[64]; /* "addr:port" */
};

/* A new, stopped net for the coordinator whose mutex srv_with_core
 * takes (the protocols call it); the soft descriptor limit is raised
 * here. COHORT_ENOMEM or COHORT_ESYSTEM. */
cohort_status srv_net_new(
    const struct srv_net_limits *lim, struct srv_net **out);
/* Listens on hostport ("ADDR:PORT", "[V6]:PORT", port 0 for a free one)
 * for protocol p with its listener state arg; served once started.
 * COHORT_EINVAL (a bad address) or COHORT_ESYSTEM naming it. */
cohort_status srv_net_listen(struct srv_net *n, const char *hostport,
    const struct srv_proto *p, void *arg, const char *what,
    struct srv_nlistener **out);
/* "ADDR:PORT" as bound ("[V6]:PORT"). */
const char *srv_nlistener_addr(const struct srv_nlistener *l);
/* What the log calls the listener (default: its protocol's name). */
void srv_nlistener_set_what(struct srv_nlistener *l, const char *what);
/* Starts the thread. */
cohort_status srv_net_start(struct srv_net *n);
/* Stops the thread, closes the listeners and every connection (their
 * protocols' closing, while the coordinator still runs) and delivers
 * what was posted meanwhile. NULL-safe; idempotent. */
void srv_net_stop(struct srv_net *n);
/* True from srv_net_stop on: the connections it closes are cohortd's own
 * shutdown, not their peers' loss (a protocol's closing hook tells the
 * core nothing then, as nng's pipe events stop while it stops). */
bool srv_net_stopping(const struct srv_net *n);
/* Frees a stopped net. NULL-safe. */
void srv_net_free(struct srv_net *n);

/* Any thread: hands p to c's protocol (delivered) on the net thread.
 * c must hold a reference for it (srv_nconn_ref, on the net thread, when
 * the request was sent on), which the delivery drops. */
void srv_net_post(struct srv_net *n, struct srv_nconn *c, struct srv_npost *p);
/* Any thread: closes the connection with the core id pipe, if it is one
 * of ours (the core's idle and first-request timeouts, after a Leave). */
void srv_net_close_pipe(struct srv_net *n, uint32_t pipe);
/* Whether the caller runs on n's thread. */
bool srv_net_on_thread(const struct srv_net *n);

/* Counters for /metrics (any thread). */
struct srv_net_stats {
	uint64_t conns; /* open now */
	uint64_t pending_bytes; /* input held now */
	uint64_t refused; /* connections refused or evicted for a bound */
	uint64_t evicted; /* closed to make room (descriptors, a source) */
	uint64_t emfile; /* accept() ran out of descriptors */
	uint64_t limit_refusals; /* requests refused for max_pending_bytes */
	uint64_t max_conns; /* the bound in force */
	uint64_t fd_limit; /* the soft RLIMIT_NOFILE after the raise */
};
void srv_net_stats(struct srv_net *n, struct srv_net_stats *st);
/* Input bytes let go since the last reset (for malloc_trim); reset: and
 * start counting again. 0 for NULL. */
uint64_t srv_net_freed(struct srv_net *n, bool reset);

/* A core pipe id no other connection of this process had (above nng's
 * 31-bit range). */
uint32_t srv_net_next_pipe(void);
/* Whether a pipe id is one of ours (not nng's). */
bool srv_net_pipe_is_ours(uint32_t pipe);

/* The address bytes of sa into out (an IPv4-mapped IPv6 address as its
 * IPv4 one): 4 or 16, 0 for another family; its port (host order) into
 * *port unless NULL. The key of a source here, the peer address of the
 * protocols and of the TCPStore door. */
size_t srv_net_addr(
    const struct sockaddr_storage *sa, uint8_t out[16], uint16_t *port);

/* On the net thread, for the protocols. */

/* Reads up to len bytes: > 0 read, 0 nothing now, -1 EOF or an error
 * (rd_eof set; an error closes c). */
ssize_t srv_nconn_recv(struct srv_nconn *c, void *buf, size_t len);
/* Takes n more input bytes into c's account: false (nothing taken,
 * *why set) if over c's own bound or the global one. */
bool srv_nconn_hold(struct srv_nconn *c, uint64_t n, const char **why);
void srv_nconn_unhold(struct srv_nconn *c, uint64_t n);
/* Queues bytes (copied) / a header (copied) and a message's body
 * (referenced, freed once written; msg may be NULL) for c; flushed when
 * the socket takes them. False when out of memory (c is closed). */
bool srv_nconn_put(struct srv_nconn *c, const void *p, size_t n);
bool srv_nconn_put_msg(
    struct srv_nconn *c, const void *hdr, size_t hlen, nng_msg *msg);
/* Writes what the socket takes now; closes a client whose queue is over
 * max_out ("it does not read its replies"). */
void srv_nconn_flush(struct srv_nconn *c);
/* Whether output is still queued. */
bool srv_nconn_busy_out(const struct srv_nconn *c);
/* Closes c (why: for the debug log; NULL: none). Idempotent. */
void srv_nconn_close(struct srv_nconn *c, const char *why);
/* Closes c for something its client did, with why at warn level. */
void srv_nconn_refuse(struct srv_nconn *c, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
/* Sets (at != 0) or clears c's deadline; why says what was late, logged
 * at warn level (warn) or debug (an ordinary end, e.g. an idle HTTP
 * connection). */
void srv_nconn_deadline(
    struct srv_nconn *c, cohort__time at, bool warn, const char *why);
/* c authenticated: no longer counted against its source nor evicted. */
void srv_nconn_trust(struct srv_nconn *c);
/* Stops (true) or resumes reading c. */
void srv_nconn_pause(struct srv_nconn *c, bool pause);
/* Registers c under its core pipe id (srv_net_close_pipe finds it). */
void srv_nconn_set_pipe(struct srv_nconn *c, uint32_t pipe);
void srv_nconn_ref(struct srv_nconn *c);

#endif /* COHORT_SRV_NET_H */
