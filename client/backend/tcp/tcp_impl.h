/*
 * tcp_impl.h - private interfaces of the tcp data-plane backend.
 *
 * Layout of the backend:
 *   tcp.c     the ops table; init (mesh setup and the authenticated
 *             handshake), abort, fini, and run's dispatch
 *   xfer.c    the two transfer engines every collective is built on:
 *             tcp_exchange (independent messages to and from any peers,
 *             all in flight at once) and tcp_stream (a pipelined chain of
 *             steps with one outgoing and one incoming peer, where a step's
 *             outgoing bytes may wait for an earlier step's incoming bytes
 *             to be received and reduced: rings, chains)
 *   algos.c   the collectives, as plans for those two engines
 *   shm.c     the same-host shared-memory path of every collective
 *             (setup at init over the TCP connections, which stay the
 *             liveness channel)
 *   hier.c    the hierarchical all-reduce of a group with several ranks on
 *             each of several hosts: two child states of this backend (the
 *             ranks of one host, over shared memory; the ranks with the
 *             same place on every host, over TCP) run its stages
 *
 * Wire: after the handshake, every collective starts with the agreement
 * (algos.c): each rank sends every other a 32-byte header naming the
 * operation it entered (kind, dtype, count, op, root, number) and checks
 * the ones it receives, so ranks that disagree all fail with EMISMATCH
 * naming both sides instead of exchanging bytes of different meaning (the
 * shared-memory allreduce puts the header in its control block instead).
 * The exchange doubles as the barrier. Then the connection carries raw
 * tensor bytes only: both ends know how many to expect and in which
 * order; nothing else is framed. A fast peer may already be sending the
 * next operation's bytes; they wait in the socket until read.
 */
#ifndef COHORT_TCP_IMPL_H
#define COHORT_TCP_IMPL_H

#include <poll.h>
#include <stdatomic.h>
#include <stddef.h>
#include <stdint.h>

#include "backend/backend.h"
#include "sha256.h"

struct cohort__tcp_peer {
	int fd; /* -1 for self */
	int32_t job_rank; /* for error texts */
	/* Per-call plan of tcp_exchange: at most one message each way. */
	const uint8_t *sbuf;
	size_t slen, sent;
	uint8_t *rbuf;
	size_t rlen, recvd;
};

/* One step of a stream (see tcp_stream). */
enum cohort__tcp_recv_mode {
	COHORT__TCP_RECV_COPY = 0, /* into rbuf */
	COHORT__TCP_RECV_DIRECT, /* into rbuf, then rbuf op= other */
	COHORT__TCP_RECV_SCRATCH, /* into scratch, then rbuf op= scratch */
	COHORT__TCP_RECV_ACC, /* into the acc ring, then acc op= other */
};

struct cohort__tcp_step {
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
	/* Progress (set by tcp_stream). */
	size_t sent, recvd, processed;
	uint64_t acc_base;
};

struct cohort__tcp_shm;
struct cohort__tcp_hier;

struct cohort__tcp {
	int rank;
	int size;
	struct cohort__tcp_peer *peers;
	atomic_int *abort_flag; /* the group's; may be NULL in tests */
	atomic_int aborted; /* our abort() was called */

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

	struct cohort__tcp_step *steps; /* 2 * size entries */
	struct pollfd *pfds; /* size entries */
	int *pfd_peer; /* peer of each pfds entry */

	/* Tunables (COHORT_TCP_* environment, read at init). */
	size_t small_max; /* allreduce: recursive doubling up to here */
	size_t bcast_small; /* broadcast/gather family: direct up to here */
	size_t pair_min; /* allreduce, 2 ranks: pairwise exchange in */
	size_t pair_max; /*   [pair_min, pair_max], else the ring */
	size_t io_max; /* largest single send()/recv() */
	int spin_us; /* busy-poll before sleeping in poll() */
	bool spin_yield; /* sched_yield() while busy-polling */
	size_t shm_min; /* allreduce over shared memory in */
	size_t shm_max; /*   [shm_min, shm_max] bytes */
	int shm_hot_spins; /* pause-spins before yielding (0: more ranks
	                    * than CPUs) */

	/* Same-host shared-memory segment (shm.c), NULL = pure TCP. */
	struct cohort__tcp_shm *shm;

	/* Hierarchical all-reduce (hier.c), NULL = flat. */
	struct cohort__tcp_hier *hier;
	/* In a child of a hierarchical group: the parent, whose connections
	 * every wait also watches, so that a rank that dies on another host
	 * is named at once by ranks waiting on a stage it is not part of. */
	const struct cohort__tcp *watch;
	/* The parent's peer whose connection hung up (-1: none) and when: a
	 * rank that finished the job's last operation exits too, so it is
	 * lost only if this child is still waiting COHORT__TCP_WATCH_GRACE_MS
	 * later (xfer.c). */
	int watch_lost;
	uint64_t watch_lost_ns;
	/* The parent already agreed on every operation a child runs. */
	bool agreed;

	/* Every rank's header of the running operation (size * 32 bytes;
	 * algos.c). */
	uint8_t *hdrs;
	/* A disagreement that left the ranks out of step (on the shared
	 * memory path): every later operation fails with it. */
	cohort_status broken;
	char broken_err[512];

	/* The operation running, for error texts. */
	const char *opname;
	uint64_t seq;
	/* Its statistics (backend.h): the engines add their idle time. */
	struct cohort__op_stats *stats;
	/* Dtype/op of the running reduction (stream processing). */
	cohort_dtype dtype;
	cohort_redop redop;
	size_t esize;
};

/* tcp.c */
/* A tuning knob (common/knobs.h) in bytes or a count: dflt when unset or
 * malformed, SIZE_MAX for -1 ("no limit"). */
size_t cohort__tcp_knob(enum cohort__knob k, size_t dflt);
/* Sets up a state for desc (mesh, handshake, shared memory); parent: the
 * hierarchical group of which this is a child, NULL for a group's own. */
cohort_status cohort__tcp_open(const struct cohort__group_desc *desc,
    const struct cohort__tcp *parent, struct cohort__tcp **out, char *err,
    size_t errlen, cohort__time deadline);
void cohort__tcp_abort_state(struct cohort__tcp *t);
/* Moves bytes over a non-blocking socket until *done reaches len, before
 * deadline, polling abort_flag; during names the phase in error texts
 * ("handshake"). A connection closed or reset by the peer is
 * COHORT_EPEERLOST (*done says how far it got). */
cohort_status cohort__tcp_io(atomic_int *abort_flag, int fd, void *buf,
    size_t len, size_t *done, bool sending, const char *during, int32_t peer,
    char *err, size_t errlen, cohort__time deadline);

/* Big-endian integers of the set-up messages and operation headers. */
static inline void
cohort__tcp_put_be(uint8_t *p, uint64_t v, int bytes)
{
	for (int i = 0; i < bytes; i++)
		p[i] = (uint8_t)(v >> (8 * (bytes - 1 - i)));
}

static inline uint64_t
cohort__tcp_get_be(const uint8_t *p, int bytes)
{
	uint64_t v = 0;

	for (int i = 0; i < bytes; i++)
		v = v << 8 | p[i];
	return (v);
}
void cohort__tcp_close(struct cohort__tcp *t);

/* hier.c */
/* After the flat set-up of a group that spans hosts: learns which ranks
 * share a host and, where every host has the same number (>= 2) of them,
 * sets up the two child states. Collective over the group. */
cohort_status cohort__tcp_hier_setup(struct cohort__tcp *t,
    const struct cohort__group_desc *desc, char *err, size_t errlen,
    cohort__time deadline);
/* The operation goes the hierarchical way (the caller agreed on it). */
bool cohort__tcp_hier_usable(
    struct cohort__tcp *t, const struct cohort__op *op, size_t bytes);
cohort_status cohort__tcp_hier_allreduce(struct cohort__tcp *t,
    const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline);
void cohort__tcp_hier_abort(struct cohort__tcp *t);
void cohort__tcp_hier_free(struct cohort__tcp *t);

/* xfer.c */
#define COHORT__TCP_WATCH_GRACE_MS 500
/* A child's watch: appends the parent's connections to fds[n..] (room for
 * watch->size entries) and returns how many it added. */
int cohort__tcp_watch_add(struct cohort__tcp *t, struct pollfd *fds, int n);
/* After poll(): EPEERLOST naming the parent's peer whose connection (one of
 * the k added at fds[n..]) hung up. */
cohort_status cohort__tcp_watch_check(struct cohort__tcp *t,
    const struct pollfd *fds, int k, char *err, size_t errlen);
void cohort__tcp_plan_reset(struct cohort__tcp *t);
cohort_status cohort__tcp_exchange(
    struct cohort__tcp *t, char *err, size_t errlen, cohort__time deadline);
/* Every rank's len bytes at all + rank * len to every other: all ends up
 * holding every rank's, in rank order (the agreement, the set-up). */
cohort_status cohort__tcp_exchange_all(struct cohort__tcp *t, uint8_t *all,
    size_t len, char *err, size_t errlen, cohort__time deadline);
cohort_status cohort__tcp_stream(struct cohort__tcp *t, int to, int from,
    struct cohort__tcp_step *steps, int nsteps, char *err, size_t errlen,
    cohort__time deadline);
cohort_status cohort__tcp_check_abort(
    struct cohort__tcp *t, char *err, size_t errlen);
/* The acc ring is allocated (and faulted in) on first use. */
cohort_status cohort__tcp_need_acc(
    struct cohort__tcp *t, char *err, size_t errlen);
cohort_status cohort__tcp_grow_small(
    struct cohort__tcp *t, size_t len, char *err, size_t errlen);

/* algos.c */
#define COHORT__TCP_OP_HDR 32
/* Fills this rank's header of op in t->hdrs; shm: it runs on the shared
 * memory path. */
void cohort__tcp_op_hdr(
    struct cohort__tcp *t, const struct cohort__op *op, bool shm);
/* Compares the headers in t->hdrs: COHORT_EMISMATCH with both sides named
 * in err when any rank's differs from rank 0's. */
cohort_status cohort__tcp_op_agree(
    struct cohort__tcp *t, char *err, size_t errlen);
cohort_status cohort__tcp_run_op(struct cohort__tcp *t,
    const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline);

/* shm.c */
/* The liveness check of the shared-memory path found peer p's header on
 * its TCP connection: p runs an operation on TCP while this rank waits in
 * shared memory. Reads it, answers with this rank's header and reports
 * the disagreement. */
cohort_status cohort__tcp_shm_stray(
    struct cohort__tcp *t, int p, char *err, size_t errlen);
cohort_status cohort__tcp_shm_setup(struct cohort__tcp *t, bool enable,
    size_t want_blk, char *err, size_t errlen, cohort__time deadline);
void cohort__tcp_shm_free(struct cohort__tcp *t);
bool cohort__tcp_shm_usable(
    struct cohort__tcp *t, const struct cohort__op *op, size_t bytes);
cohort_status cohort__tcp_shm_allreduce(struct cohort__tcp *t,
    const struct cohort__op *op, size_t bytes, char *err, size_t errlen,
    cohort__time deadline);
/* Any collective but barrier over the segment (cohort__tcp_shm_usable
 * said yes); bytes: the per-rank block (allgatherv: unused). */
cohort_status cohort__tcp_shm_run(struct cohort__tcp *t,
    const struct cohort__op *op, size_t bytes, char *err, size_t errlen,
    cohort__time deadline);

/* SHA-256 and HMAC-SHA-256: common/sha256.h (mbed TLS). */

#endif /* COHORT_TCP_IMPL_H */
