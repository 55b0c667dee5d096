/*
 * host_impl.h - private interfaces of the host data-plane backend
 * (host memory, peer to peer: TCP between any ranks, shared memory
 * between the ranks of one host). Its registry name is "host"; "tcp" is
 * kept as an alias.
 *
 * The parts, each calling only the ones listed after it (no circle):
 *   host.c    the ops table: init, run's dispatch, abort, fini
 *   p2p.c     point-to-point transfers: connections of their own per
 *             pair, made on first use, framed messages matched by
 *             (peer, tag), a thread of their own (beside the others: it
 *             uses only mesh.c's socket helpers and handshake.c)
 *   hier.c    the hierarchical all-reduce: two child groups of this
 *             backend, composed through its ops table (as staged.c
 *             composes it), each running one stage
 *   shm.c     the same-host shared-memory segment, its set-up, its
 *             synchronisation (counters, futexes, liveness) and the
 *             collectives over it
 *   algos.c   the collectives over TCP, as plans for the engines
 *   agree.c   the 32-byte operation agreement (and the barrier)
 *   xfer.c    the transfer engines over the mesh's connections:
 *             exchange (independent messages to and from any peers, all
 *             in flight at once), recursive doubling (an exchange per
 *             round, the caller combining) and stream (a pipelined chain
 *             of steps with one outgoing and one incoming peer, where a
 *             step's outgoing bytes may wait for an earlier step's
 *             incoming bytes to be received and reduced: rings, chains)
 *   mesh.c    the connections: a listener kept for the group's life, its
 *             address published once in the job's KV, connections made
 *             on first use to the peers an operation needs (lower rank
 *             dials, higher accepts, all handshakes progressing at once),
 *             authenticated by handshake.c
 *   handshake.c  the handshake's messages and the pending table (no I/O)
 *
 * Set-up cost (n ranks): every rank publishes one address (one KV set)
 * and keeps one listener. A group of at most COHORT_TCP_MESH_MAX (64)
 * ranks connects every pair at init, as it always did (n - 1 connections
 * and address reads per rank: cheap at that size, and the shared-memory
 * and hierarchy set-ups need them). A larger group connects at init to
 * nothing: each operation connects to the peers its algorithm uses, on
 * first use - ring neighbours, recursive-doubling and binomial-tree
 * partners, O(log n) per rank (one KV read and one handshake each); only
 * all-to-all, gather and scatter reach every peer (the root's, for the
 * last two). Its agreement (agree.c) runs by recursive doubling over the
 * same partners as the small all-reduce, so a barrier costs O(log n)
 * messages per rank.
 *
 * Wire: after the handshake, every collective starts with the agreement
 * (agree.c). Then the connection carries raw tensor bytes only: both ends
 * know how many to expect and in which order; nothing else is framed. A
 * fast peer may already be sending the next operation's bytes; they wait
 * in the socket until read.
 */
#ifndef COHORT_HOST_IMPL_H
#define COHORT_HOST_IMPL_H

#include <poll.h>
#include <stdatomic.h>
#include <sys/socket.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "handshake.h"

/* ------------------------------------------------------------------------ */
/* The running operation (passed down, never stored in a part's state)     */
/* ------------------------------------------------------------------------ */

struct host_op {
	const char *name; /* for error texts: "allreduce" */
	uint64_t seq; /* its number */
	cohort_dtype dtype; /* of a reduction's stream processing */
	cohort_redop redop;
	size_t esize; /* bytes per element (1 when not a data op) */
	int divisor; /* MEAN: the group size the stream divides by */
	struct cohort__op_stats *stats; /* NULL: none (backend.h) */
};

/* More operations run in this process now than it has CPUs (many
 * ranks in one process, as the scale benchmarks simulate hosts): a
 * waiting rank then sleeps at once instead of busy-polling, which would
 * only keep thousands of threads runnable and starve the process's
 * heartbeat. One relaxed load (mesh.c); host_run counts its operation
 * in with host_crowd_enter and out with host_crowd_leave. */
bool host_crowded(void);
void host_crowd_enter(void);
void host_crowd_leave(void);

/* Names the algorithm chosen in the op's stats. */
static inline void
host_op_algo(const struct host_op *c, const char *algo)
{
	if (c->stats != NULL)
		c->stats->algo = algo;
}

/* Defaults of COHORT_TCP_SEND_MAX and COHORT_TCP_NOTSENT_LOWAT, shared by
 * the collectives (host.c), the point-to-point path (p2p.c) and the
 * sockets (mesh.c); why they are small: host.c. */
#define HOST_DEFAULT_SEND_MAX 0 /* host_send_len */
#define HOST_DEFAULT_NOTSENT_LOWAT (32u << 10)
/* Default of COHORT_TCP_FUSED_FOLD_MAX (host.c host_fused_fold). */
#define HOST_DEFAULT_FUSED_FOLD_MAX (8u << 10)

/* Tunables (COHORT_TCP_* environment, read at init; host.c). */
struct host_tune {
	size_t small_max; /* allreduce: recursive doubling up to here */
	size_t bcast_small; /* broadcast/gather family: direct up to here */
	size_t pair_min; /* allreduce, 2 ranks: pairwise exchange in */
	size_t pair_max; /*   [pair_min, pair_max], else the ring */
	size_t io_max; /* largest single recv() */
	size_t send_max; /* largest single send() (0: host_send_len) */
	int spin_us; /* busy-poll before sleeping in poll() */
	bool spin_yield; /* sched_yield() while busy-polling */
	size_t ring_len; /* scratch of RECV_SCRATCH */
	size_t acc_len; /* ring of RECV_ACC */
	size_t shm_min; /* allreduce over shared memory in */
	size_t shm_max; /*   [shm_min, shm_max] bytes */
	int shm_hot_spins; /* pause-spins before yielding */
	size_t shm_cma_min; /* allreduce by cross-memory reads from here */
	int mesh_max; /* full mesh at init up to this group size */
	int fused_ranks; /* fuse a small all-reduce's agreement up to here */
	size_t fused_fold_max; /* the fold carries all-reduces up to this */
	int agree_fold; /* 1: agree by the fold, 0: all-to-all, -1: auto */
};

/* Big-endian integers of the set-up messages and operation headers. */
static inline void
host_put_be(uint8_t *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

static inline uint64_t
host_get_be(const uint8_t *p, int bytes)
{
	uint64_t v = 0;

	for (int i = 0; i < bytes; i++)
		v = v << 8 | p[i];
	return (v);
}

/* ------------------------------------------------------------------------ */
/* mesh.c: connections                                                      */
/* ------------------------------------------------------------------------ */

struct mesh_dial; /* a connection being made (mesh.c) */

struct host_link {
	int fd; /* -1: not connected (yet), or self */
	int32_t job_rank; /* for error texts */
	struct mesh_dial *dial; /* connector's progress, NULL: none */
};

struct host_mesh {
	int rank;
	int size;
	struct host_link *links; /* size entries */
	atomic_int *abort_flag; /* the group's; may be NULL in tests */
	atomic_int aborted; /* our abort() was called */

	/* What connecting needs, copied at open (the description does not
	 * outlive a hierarchy child's init). */
	char job[128];
	char group_id[320];
	uint64_t generation;
	char bind_addr[64]; /* "" = 127.0.0.1 */
	struct cohort__store store;
	uint8_t secret[64];
	struct cohort__tcp_hs_keys keys;
	int lfd; /* the listener, -1 when closed */
	char addr[96]; /* as published */
	struct cohort__tcp_pend *pend; /* handshakes in progress */
	int refused[COHORT__TCP_HS_REASON_MAX + 1];
	struct pollfd *cfds; /* room for the connecting loop */
	/* The wait loops' poll set (xfer.c, shm.c; one runs at a time):
	 * size + 2 entries, and room for the watch below. */
	struct pollfd *pfds; /* npfds entries (host_zalloc) */
	size_t npfds;
	int *pfd_peer; /* peer of each pfds entry */

	/* In a child of a hierarchical group: the parent, whose connections
	 * every wait also watches, so that a rank that dies on another host
	 * is named at once by ranks waiting on a stage it is not part of. */
	const struct host_mesh *watch;
	/* The parent's peer whose connection hung up (-1: none) and when: a
	 * rank that finished the job's last operation exits too, so it is
	 * lost only if this child is still waiting HOST_WATCH_GRACE_MS
	 * later. */
	int watch_lost;
	uint64_t watch_lost_ns;
};

#define HOST_WATCH_GRACE_MS 500

/* A tuning knob (common/knobs.h) in bytes or a count: dflt when unset or
 * malformed, SIZE_MAX for -1 ("no limit"). */
size_t host_knob(enum cohort__knob k, size_t dflt);
/* n zeroed entries of size bytes (NULL: out of memory), for a group's
 * per-peer tables: O(n) per rank, of which a rank of a large group
 * touches O(log n) entries. From HOST_ZALLOC_MAP bytes they are mapped
 * (mmap), so that only the pages touched are ever cleared: calloc clears
 * all of it, which for 4,096 ranks on one machine was gigabytes of
 * memset per job. host_zfree takes the same n and size. */
#define HOST_ZALLOC_MAP (64u << 10)
void *host_zalloc(size_t n, size_t size);
void host_zfree(void *p, size_t n, size_t size);
/* The most one send() to connection fd carries: send_max when the user set
 * COHORT_TCP_SEND_MAX, else one packet as the kernel builds them (its
 * size goal: the most whole segments of the connection that fit in a
 * 64 KiB GSO packet, at least one), at most io_max. A send that ends
 * short of a packet leaves a short packet, and the receiver wakes for
 * each: on loopback (one 65,483-byte segment a packet) 1 MiB on 2 ranks
 * took 270-290 us with 32 KiB sends, 660 us with 64 KiB (a full packet
 * and a 53-byte one), 240-250 with 65,483; on 2 veth hosts (1,448-byte
 * segments, 45 a packet) 356 us with 32 KiB, 953 with 64 KiB, 297 with
 * 65,160 (16 MiB: 6.3 ms against 4.8). One getsockopt(); callers keep
 * the result per connection. */
size_t host_send_len(int fd, size_t send_max, size_t io_max);
/* Sends of at most this many bytes need no host_send_len (every packet
 * size it returns is larger). */
#define HOST_SEND_SMALL (32u << 10)
/* Listens on desc's address and publishes it (one KV set). Collective in
 * name only: it waits for nobody. */
cohort_status host_mesh_open(struct host_mesh *m,
    const struct cohort__group_desc *desc, char *err, size_t errlen,
    cohort__time deadline);
void host_mesh_close(struct host_mesh *m);
/* Every pair of a small group is connected at init: nobody will connect
 * to this rank any more, the listener closes. */
void host_mesh_listen_done(struct host_mesh *m);
/* Shuts every connection down (abort; any thread). */
void host_mesh_abort(struct host_mesh *m);
/* Connects this rank to peers[0..k) (group ranks, self and connected
 * ones allowed) before deadline: dials the higher ones, accepts the lower
 * ones, every handshake progressing at once. Every peer listed must list
 * this rank in the same step of the same operation. during names the
 * step in errors. */
cohort_status host_mesh_connect(struct host_mesh *m, const int *peers, int k,
    const char *during, char *err, size_t errlen, cohort__time deadline);
/* EABORTED (naming c's operation, NULL: the set-up) when the group or
 * this state was aborted. */
cohort_status host_mesh_check_abort(
    struct host_mesh *m, const struct host_op *c, char *err, size_t errlen);
/* Moves bytes over a non-blocking socket until *done reaches len, before
 * deadline, polling abort_flag; during names the phase in error texts. A
 * connection closed or reset by the peer is COHORT_EPEERLOST. */
cohort_status host_io(atomic_int *abort_flag, int fd, void *buf, size_t len,
    size_t *done, bool sending, const char *during, int32_t peer, char *err,
    size_t errlen, cohort__time deadline);
/* Makes m a hierarchy child that watches parent's connections too. */
cohort_status host_mesh_watch(struct host_mesh *m,
    const struct host_mesh *parent, char *err, size_t errlen);
/* A child's watch: appends the parent's connections to fds[n..] (room for
 * watch->size entries) and returns how many it added. */
int host_mesh_watch_add(struct host_mesh *m, struct pollfd *fds, int n);
/* After poll(): EPEERLOST naming the parent's peer whose connection (one of
 * the k added at fds[n..]) hung up. */
cohort_status host_mesh_watch_check(struct host_mesh *m,
    const struct host_op *c, const struct pollfd *fds, int k, char *err,
    size_t errlen);

/* The helpers p2p.c's connections share with the mesh's: a listener on
 * bind_addr (NULL or "": 127.0.0.1) and its "host:port" in addr; a
 * published address parsed; the sockets' options; random bytes. */
cohort_status host_net_listen(const char *bind_addr, int *lfd, char *addr,
    size_t addrlen, char *err, size_t errlen);
cohort_status host_net_parse_addr(
    const char *s, size_t len, struct sockaddr_storage *ss, socklen_t *sl);
void host_net_sockopts(int fd, bool nodelay);
cohort_status host_net_random(
    uint8_t *buf, size_t len, char *err, size_t errlen);
/* One step of the accepting side of pending connection pc's handshake
 * (the mesh's listener and the point-to-point one): reads what arrived;
 * once the hello is complete, checks it (keys, to rank_a; taken(ctx, r):
 * rank r is connected already) and sends the accept. Returns 1: the
 * connection is now rank *rank_c's, its options set (pc->fd is the
 * caller's to take); 0: more to come; -1: the peer closed or took no
 * accept (pc->fd closed); -2: to be refused with *reason (the caller's
 * refusal: its logs and counters). */
int host_net_pend_step(struct cohort__tcp_pend *pc,
    const struct cohort__tcp_hs_keys *k, uint32_t rank_a,
    bool (*taken)(void *ctx, uint32_t rank), void *ctx, uint32_t *rank_c,
    uint32_t *reason);

/* ------------------------------------------------------------------------ */
/* xfer.c: the engines                                                      */
/* ------------------------------------------------------------------------ */

/* A framed receive's header arrived (hdr): how many payload bytes
 * follow it; false when hdr is not one (the stream is out of step). */
typedef bool (*host_frame_fn)(const uint8_t *hdr, size_t *len);

/* An exchange's plan with one peer: at most one message each way. A
 * message may go out as a header (shdr) and a body (sbuf) in one send. A
 * framed receive (host_plan_framed) reads a header first and then the
 * payload that header declares: into pbuf when it fits rcap, else read
 * and dropped (`drain`), so that the streams stay in step when the ranks
 * disagree. */
struct host_plan {
	const uint8_t *shdr; /* the first shlen of the slen bytes to send */
	size_t shlen;
	const uint8_t *sbuf; /* the other slen - shlen */
	size_t slen, sent;
	uint8_t *rbuf; /* the first hlen of the rlen bytes to receive */
	size_t hlen;
	uint8_t *pbuf; /* the other rlen - hlen */
	size_t rlen, recvd;
	host_frame_fn frame; /* framed: the header not sized yet */
	size_t rcap; /* framed: room in pbuf */
	size_t drain; /* framed: payload bytes still to read and drop */
};

/* One step of a stream (see host_stream). */
enum host_recv_mode {
	HOST_RECV_COPY = 0, /* into rbuf */
	HOST_RECV_DIRECT, /* into rbuf, then rbuf op= other */
	HOST_RECV_SCRATCH, /* into scratch, then rbuf op= scratch */
	HOST_RECV_ACC, /* into the acc ring, then acc op= other */
};

struct host_step {
	/* Outgoing: slen bytes from sbuf, or from the acc ring holding the
	 * incoming bytes of step `gate` when sbuf is NULL. With gate >= 0,
	 * byte i may be sent only once step gate's byte i is processed. */
	const uint8_t *sbuf;
	size_t slen;
	int gate;
	/* Incoming: rlen bytes, handled per rmode. */
	int rmode;
	uint8_t *rbuf;
	const uint8_t *other;
	size_t rlen;
	bool divide; /* MEAN: divide processed bytes by the group size */
	/* Process incoming byte i only once this step's outgoing byte i is
	 * sent (in-place exchange: rbuf is also sbuf). */
	bool pgate;
	/* Progress (set by host_stream). */
	size_t sent, recvd, processed;
	uint64_t acc_base;
};

struct host_xfer {
	struct host_mesh *mesh;
	const struct host_tune *tune;
	struct host_plan *plan; /* size entries */
	/* The peers with a plan (host_plan_set), so that an exchange costs
	 * what its plan holds, not the group's size. */
	int *active;
	int nactive;
	/* Persistent, pre-faulted scratch. `small` holds whole messages of
	 * the latency-optimised algorithms; `ring` is the scratch of
	 * RECV_SCRATCH (consumed at once) and `acc` the ring of RECV_ACC
	 * (kept until sent on). */
	uint8_t *small;
	size_t small_len;
	uint8_t *ring;
	size_t ring_len;
	uint8_t *acc;
	size_t acc_len;
	struct host_step *steps; /* nsteps entries, grown by host_steps */
	size_t nsteps;
	int *want; /* size entries: peers to connect */
	size_t n; /* entries of plan, active and want */
	/* The last connection asked for a send size (host_send_len), and
	 * its answer: a ring sends to the same peer every operation. */
	int seg_fd;
	size_t seg_len;
};

cohort_status host_xfer_init(struct host_xfer *x, struct host_mesh *m,
    const struct host_tune *tune, char *err, size_t errlen);
void host_xfer_fini(struct host_xfer *x);
/* x->steps with room for k steps (a ring's 2 (n - 1) only when a ring
 * runs); NULL and err when out of memory. */
struct host_step *host_steps(
    struct host_xfer *x, size_t k, char *err, size_t errlen);
void host_plan_reset(struct host_xfer *x);
/* Plans at most one message each way with peer p (a length 0: none). */
void host_plan_set(struct host_xfer *x, int p, const void *sbuf, size_t slen,
    void *rbuf, size_t rlen);
/* Plans a message of shlen bytes from shdr and then slen from sbuf to
 * peer p, and a framed receive from it: hlen header bytes into rbuf,
 * then the payload that frame() finds declared there into pbuf when it
 * is at most rcap bytes, or read and dropped when larger. A header
 * frame() refuses fails the exchange with COHORT_EMISMATCH (the stream is
 * out of step). */
void host_plan_framed(struct host_xfer *x, int p, const void *shdr,
    size_t shlen, const void *sbuf, size_t slen, void *rbuf, size_t hlen,
    host_frame_fn frame, void *pbuf, size_t rcap);
/* Runs the plan (x->plan), connecting to its peers first. */
cohort_status host_exchange(struct host_xfer *x, const struct host_op *c,
    char *err, size_t errlen, cohort__time deadline);
/* One message each way with peer (either length may be 0). */
cohort_status host_pair(struct host_xfer *x, const struct host_op *c, int peer,
    const void *sbuf, size_t slen, void *rbuf, size_t rlen, char *err,
    size_t errlen, cohort__time deadline);
/* With every other rank p at once: len bytes from src + p * sstride to
 * it, len bytes from it into dst + p * dstride. */
cohort_status host_exchange_blocks(struct host_xfer *x,
    const struct host_op *c, const uint8_t *src, size_t sstride, uint8_t *dst,
    size_t dstride, size_t len, char *err, size_t errlen,
    cohort__time deadline);
/* Every rank's len bytes at all + rank * len to every other: all ends up
 * holding every rank's, in rank order. */
cohort_status host_exchange_all(struct host_xfer *x, const struct host_op *c,
    uint8_t *all, size_t len, char *err, size_t errlen, cohort__time deadline);
/* Recursive doubling over buf (len bytes): every round swaps buf with a
 * partner and calls combine(ctx, buf, theirs) (ranks beyond the largest
 * power of two fold into a partner first and get the result last), then
 * combine(ctx, buf, NULL) once to finish (MEAN: divide); every rank ends
 * with the combination of all. theirs is scratch of len bytes. log2(n)
 * rounds of one message each way: the partners are the same for every
 * caller, so a large group connects to them once. */
cohort_status host_rd(struct host_xfer *x, const struct host_op *c,
    uint8_t *buf, size_t len,
    void (*combine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline);
/* host_rd from the round of partner rank ^ first on (first a power of
 * two; above 1 only in a group whose size is one): the caller did the
 * rounds before. */
cohort_status host_rd_from(struct host_xfer *x, const struct host_op *c,
    uint8_t *buf, size_t len, int first,
    void (*combine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline);
/* host_rd's schedule over messages of a header and a payload: every
 * round sends hdr (hlen bytes) and pay (plen, may be 0) to the partner and
 * reads the partner's header into rhdr, then the payload that frame()
 * finds declared there into rpay (room for plen). hcombine(ctx, hdr,
 * rhdr) runs every round; pcombine(ctx, pay, rpay) only when the
 * partner's payload was plen bytes as well (a rank in another operation
 * sends another length: it is read and dropped, and *odd set, for the
 * header fold to explain), and pcombine(ctx, pay, NULL) once to finish.
 * The folded-out ranks of a non-power of two get header and payload
 * last. One message per round carries both, where an agreement followed
 * by recursive doubling waits for twice the rounds. */
cohort_status host_rd_framed(struct host_xfer *x, const struct host_op *c,
    uint8_t *hdr, uint8_t *rhdr, size_t hlen, host_frame_fn frame,
    void (*hcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    uint8_t *pay, uint8_t *rpay, size_t plen,
    void (*pcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, bool *odd, char *err, size_t errlen, cohort__time deadline);
cohort_status host_stream(struct host_xfer *x, const struct host_op *c, int to,
    int from, struct host_step *steps, int nsteps, char *err, size_t errlen,
    cohort__time deadline);
/* The acc ring is allocated (and faulted in) on first use. */
cohort_status host_need_acc(struct host_xfer *x, char *err, size_t errlen);
cohort_status host_grow_small(
    struct host_xfer *x, size_t len, char *err, size_t errlen);

/* ------------------------------------------------------------------------ */
/* agree.c: the operation agreement                                         */
/* ------------------------------------------------------------------------ */

#define HOST_OP_HDR 32

/* A header's path byte: which way the operation runs on this rank. */
enum host_path {
	HOST_PATH_TCP = 0, /* TCP; the header travels alone */
	HOST_PATH_SHM = 1, /* shared memory (the segment's control block) */
	HOST_PATH_FUSED = 2, /* TCP; the operand travels with the header
	                      * (the first partner's, or every fold's) */
};

struct host_agree {
	struct host_mesh *mesh;
	/* Every rank's header of the running operation (size * 32 bytes),
	 * this rank's at rank * 32. */
	uint8_t *hdrs;
	size_t nhdrs; /* entries of hdrs (host_zalloc) */
	/* Agree by the recursive-doubling fold (a large group, or more
	 * ranks than CPUs: COHORT_TCP_AGREE_FOLD), not every rank with
	 * every other. */
	bool fold;
	/* A disagreement that left the ranks out of step (on the shared
	 * memory path): every later operation fails with it. */
	cohort_status broken;
	char broken_err[512];
};

cohort_status host_agree_init(
    struct host_agree *a, struct host_mesh *m, char *err, size_t errlen);
void host_agree_fini(struct host_agree *a);
/* Fills this rank's header of op, run on path. */
void host_agree_hdr(
    struct host_agree *a, const struct cohort__op *op, enum host_path path);

/* Compares the headers in a->hdrs: COHORT_EMISMATCH with both sides named
 * in err when any rank's differs from rank 0's. */
cohort_status host_agree_check(
    struct host_agree *a, const struct host_op *c, char *err, size_t errlen);
/* The TCP path's agreement on op (the barrier when op is one): every rank
 * sends every other its header and checks them all (one round), or, with
 * a->fold, the smallest and largest header are folded by recursive
 * doubling, so every rank learns whether all agree in log2(n) rounds of
 * one message each. */
cohort_status host_agree_run(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, char *err,
    size_t errlen, cohort__time deadline);
/* host_agree_run for an all-reduce whose first exchange travels with the
 * agreement (a group of at most mesh_max ranks, a power of two in size):
 * bytes of send go to this rank's first recursive-doubling partner (rank
 * ^ 1) after the header, and the partner's arrive in rbuf. Where the
 * agreement and then recursive doubling wait for 1 + log2(n) rounds,
 * this and the rounds after it wait for log2(n). */
bool host_agree_fusable(const struct host_agree *a);
cohort_status host_agree_first(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, const void *send,
    void *rbuf, size_t bytes, char *err, size_t errlen, cohort__time deadline);

/* A small all-reduce of a group that agrees by the fold (a->fold): its
 * recursive doubling over pay (plen bytes, pcombine; rpay: scratch) runs
 * in the fold's own messages, log2(n) rounds for both. pay holds the
 * result only when all ranks agreed (COHORT_OK). */
cohort_status host_agree_fold_allreduce(struct host_agree *a,
    struct host_xfer *x, const struct cohort__op *op, const struct host_op *c,
    uint8_t *pay, uint8_t *rpay, size_t plen,
    void (*pcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline);

/* ------------------------------------------------------------------------ */
/* algos.c: the collectives over TCP                                        */
/* ------------------------------------------------------------------------ */

/* Runs op (agreed, size >= 2, bytes > 0 where it matters) over x; sparse:
 * the group connects on first use (algorithms that need O(log n) peers
 * per rank where the small-group choice would need all). */
cohort_status host_algos_run(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, bool sparse, char *err,
    size_t errlen, cohort__time deadline);
/* A small all-reduce with its agreement fused into its first round (a
 * group where host_agree_fusable; not agreed before). */
cohort_status host_algos_fused(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, size_t bytes,
    char *err, size_t errlen, cohort__time deadline);
/* A small all-reduce of a group that agrees by the fold, in the fold's
 * rounds (host_agree_fold_allreduce; not agreed before). */
cohort_status host_algos_fused_fold(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, size_t bytes,
    char *err, size_t errlen, cohort__time deadline);
/* A group of one: copies send to recv where the op needs it. */
void host_algos_local(const struct cohort__op *op, size_t esize);

/* ------------------------------------------------------------------------ */
/* shm.c: the shared-memory path                                            */
/* ------------------------------------------------------------------------ */

struct host_shm;

/* Offers (rank 0) or takes the segment over the mesh's connections (all
 * made); *out NULL: pure TCP. Adopts rank 0's size range into tune, and,
 * also on the pure TCP path, its agree_fold and fused_ranks. */
cohort_status host_shm_setup(struct host_mesh *m, struct host_agree *a,
    struct host_tune *tune, bool enable, size_t want_blk,
    struct host_shm **out, char *err, size_t errlen, cohort__time deadline);
void host_shm_free(struct host_shm *s);
/* Whether the group's large all-reduces read the other ranks' buffers
 * directly (cross-memory attach; every rank could, and agreed). */
bool host_shm_cma(const struct host_shm *s);
bool host_shm_usable(const struct host_shm *s, const struct host_tune *tune,
    const struct cohort__op *op, size_t esize, size_t bytes);
/* Any collective but barrier over the segment (host_shm_usable said yes);
 * this rank's header is already in a->hdrs; bytes: the per-rank block
 * (allgatherv: unused). */
cohort_status host_shm_run(struct host_shm *s, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline);

/* ------------------------------------------------------------------------ */
/* hier.c: the hierarchical all-reduce                                      */
/* ------------------------------------------------------------------------ */

struct host_hier;
struct cohort__host;

/* After the flat set-up of a group that spans hosts: learns which ranks
 * share a host and, where every host has the same number (>= 2) of them,
 * sets up the two child groups through ops (this backend's table), each
 * told to watch the parent's connections. Collective over the group. */
cohort_status host_hier_setup(struct cohort__host *h,
    const struct cohort__backend_ops *ops,
    const struct cohort__group_desc *desc, struct host_hier **out, char *err,
    size_t errlen, cohort__time deadline);
bool host_hier_usable(
    const struct host_hier *hh, const struct cohort__op *op, size_t bytes);
cohort_status host_hier_allreduce(struct host_hier *hh,
    const struct cohort__op *op, const struct host_op *c, size_t esize,
    char *err, size_t errlen, cohort__time deadline);
void host_hier_abort(struct host_hier *hh);
void host_hier_free(struct host_hier *hh);

/* ------------------------------------------------------------------------ */
/* p2p.c: point-to-point transfers                                          */
/* ------------------------------------------------------------------------ */

/* backend.h's p2p_open, p2p_post, p2p_abort and p2p_close of this
 * backend: connections of their own, framed, driven by a thread of the
 * state's (p2p.c's head comment has the protocol). */
cohort_status host_p2p_open(const struct cohort__group_desc *desc, void *state,
    void **p2p, char *err, size_t errlen, cohort__time deadline);
cohort_status host_p2p_post(void *p2p, struct cohort__p2p *const *reqs,
    size_t n, char *err, size_t errlen);
void host_p2p_abort(void *p2p);
void host_p2p_close(void *p2p);

/* ------------------------------------------------------------------------ */
/* host.c: one group's state                                                */
/* ------------------------------------------------------------------------ */

struct cohort__host {
	struct host_mesh mesh;
	struct host_xfer xfer;
	struct host_agree agree;
	struct host_tune tune;
	struct host_shm *shm; /* NULL = pure TCP */
	struct host_hier *hier; /* NULL = flat */
	/* More than mesh_max ranks: connections on first use. */
	bool sparse;
	/* In a hierarchy's child: the parent agreed on every operation it
	 * runs, and its errors name the parent's operation (as_kind). */
	bool agreed;
	enum cohort__op_kind as_kind;
};

#endif /* COHORT_HOST_IMPL_H */
