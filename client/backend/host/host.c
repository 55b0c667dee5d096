/*
 * host.c - the host data-plane backend ("host"; "tcp" is its old name and
 * an alias): collectives on host memory, peer to peer over TCP, through
 * shared memory between the ranks of one host. This file is its ops table:
 * init, run's dispatch, abort, fini. The parts are listed in host_impl.h.
 *
 * Init (collective: every member calls it):
 *  1. mesh.c opens: a listener, its address published (one KV set);
 *  2. a group of at most COHORT_TCP_MESH_MAX (64) ranks connects every
 *     pair (as it always did), then rank 0 offers a shared-memory segment
 *     over those connections (shm.c) and, where the group spans hosts
 *     with several ranks each, the hierarchy sets up its two child groups
 *     (hier.c); the listener closes;
 *  3. a larger group connects to nobody yet: each operation connects to
 *     the peers its algorithm uses, on first use (O(log n) per rank but
 *     for all-to-all, gather and scatter), and keeps the listener open
 *     for its peers' first uses. No shared memory or hierarchy for it
 *     (both need every rank's answer at every rank: O(n^2) at n ranks).
 *
 * Run: the agreement (agree.c; in the segment's control block on the
 * shared-memory path), then the collective over shared memory (shm.c),
 * the hierarchy (hier.c) or TCP (algos.c).
 *
 * Same-host shared memory: COHORT_TCP_SHM=0 forces pure TCP;
 * COHORT_TCP_SHM_MIN/MAX (0, unlimited) bound the sizes that use the
 * segment; COHORT_TCP_SHM_BLK (128 KiB) is its block, one rank's share of
 * a pipelined round; COHORT_TCP_SHM_SPINS (16, 0 with more ranks than
 * CPUs) the busy-wait pauses before a waiting rank yields;
 * COHORT_TCP_SHM_CMA_MIN (1 MiB, 4 MiB with more ranks than CPUs) the
 * smallest all-reduce that reads the other ranks' buffers directly
 * (shm.c; 2 ranks: 1 MiB 119 us against 175 staged, 16 MiB 1.9 ms
 * against 3.0-3.1).
 * Measured (tcp_microbench, 2 cores, f32 sum, medians): 2 ranks 4 KiB
 * 0.7 us, 1/16/64 MiB 10.4/7.5/7.2 GB/s busbw; 4 ranks 7 us, 6.8/4.5/4.2;
 * pure TCP 13 us, 1.3-1.6/1.3-1.5/1.3-1.4 and 56 us, 0.6/0.7/0.8.
 *
 * Tunables (environment, read at init; defaults measured on a 2-core VM,
 * loopback): COHORT_TCP_SMALL_MAX (64 KiB: allreduce by recursive doubling
 * up to here, ring above; also the direct allgather / reduce_scatter
 * limit), COHORT_TCP_FUSED_RANKS (2: a group of 2, 4, 8.. ranks up to here
 * sends a small all-reduce's first round with the agreement),
 * COHORT_TCP_BCAST_SMALL (64 KiB: root sends to all up to here, pipelined
 * chain above), COHORT_TCP_PAIR_MIN/MAX (2 ranks: pairwise exchange instead of
 * the ring for sizes in range; off by default), COHORT_TCP_IO_MAX (256 KiB per
 * recv), COHORT_TCP_SEND_MAX (per send; 0: a GSO packet's worth of whole
 * segments, host_send_len) and COHORT_TCP_NOTSENT_LOWAT
 * (32 KiB of unsent bytes a socket may queue; 0: the kernel's): with 256 KiB
 * sends and no bound, the part of a send that the window did not admit left
 * later from ACK processing on the other CPU, the flow's segments went out of
 * two CPUs' queues reordered, and the sender ran spurious fast retransmits
 * (all D-SACKed) that cut its window: 1 MiB all-reduces on 2 veth hosts took
 * 850 us instead of about 400. COHORT_TCP_RING (256 KiB, cache-sized reduce
 * scratch), COHORT_TCP_ACC (4 MiB, partial-sum ring of reduce_scatter and
 * reduce), COHORT_TCP_SOCKBUF (0 = kernel autotuning), COHORT_TCP_SPIN_US (50:
 * busy-poll before sleeping in poll(), yielding the core meanwhile unless
 * COHORT_TCP_SPIN_YIELD=0), COHORT_TCP_MESH_MAX (64: the largest group
 * connected in full at init).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "host_impl.h"

/* Defaults of the tunables (COHORT_TCP_*; measured on loopback). */
#define HOST_DEFAULT_SMALL_MAX (64u << 10)
#define HOST_DEFAULT_BCAST_SMALL (64u << 10)
#define HOST_DEFAULT_IO_MAX (256u << 10)
#define HOST_DEFAULT_RING (256u << 10)
#define HOST_DEFAULT_ACC (4u << 20)
#define HOST_DEFAULT_SPIN_US 50
#define HOST_DEFAULT_SHM_BLK (128u << 10)
#define HOST_DEFAULT_SHM_CMA_MIN (1u << 20)
#define HOST_DEFAULT_MESH_MAX 64
#define HOST_DEFAULT_FUSED_RANKS 2

static void
host_tune_read(struct host_tune *tu, int size)
{
	tu->small_max
	    = host_knob(COHORT__KNOB_TCP_SMALL_MAX, HOST_DEFAULT_SMALL_MAX);
	tu->bcast_small = host_knob(
	    COHORT__KNOB_TCP_BCAST_SMALL, HOST_DEFAULT_BCAST_SMALL);
	tu->pair_min = host_knob(COHORT__KNOB_TCP_PAIR_MIN, 0);
	tu->pair_max = host_knob(COHORT__KNOB_TCP_PAIR_MAX, 0);
	tu->io_max = host_knob(COHORT__KNOB_TCP_IO_MAX, HOST_DEFAULT_IO_MAX);
	tu->send_max
	    = host_knob(COHORT__KNOB_TCP_SEND_MAX, HOST_DEFAULT_SEND_MAX);
	if (tu->send_max > tu->io_max)
		tu->send_max = tu->io_max;
	tu->spin_us
	    = (int)host_knob(COHORT__KNOB_TCP_SPIN_US, HOST_DEFAULT_SPIN_US);
	tu->spin_yield = host_knob(COHORT__KNOB_TCP_SPIN_YIELD, 1) != 0;
	tu->ring_len
	    = host_knob(COHORT__KNOB_TCP_RING, HOST_DEFAULT_RING) & ~(size_t)7;
	tu->acc_len
	    = host_knob(COHORT__KNOB_TCP_ACC, HOST_DEFAULT_ACC) & ~(size_t)7;
	tu->shm_min = host_knob(COHORT__KNOB_TCP_SHM_MIN, 0);
	tu->shm_max = host_knob(COHORT__KNOB_TCP_SHM_MAX, SIZE_MAX);
	tu->shm_hot_spins = (int)host_knob(COHORT__KNOB_TCP_SHM_SPINS,
	    size > sysconf(_SC_NPROCESSORS_ONLN) ? 0 : 16);
	/* With more ranks than CPUs, the cross-memory path's three waits
	 * per operation cost about what it saves at 1 MiB (4 ranks on
	 * 2 cores: 556-575 us against 457-676 staged); from 4 MiB it wins
	 * (1.50-1.55 ms against 1.72-1.73, 16 MiB 8.0-8.5 against 9.2-9.5). */
	tu->shm_cma_min = host_knob(COHORT__KNOB_TCP_SHM_CMA_MIN,
	    size > sysconf(_SC_NPROCESSORS_ONLN) ? 4 * HOST_DEFAULT_SHM_CMA_MIN
	                                         : HOST_DEFAULT_SHM_CMA_MIN);
	tu->mesh_max
	    = (int)host_knob(COHORT__KNOB_TCP_MESH_MAX, HOST_DEFAULT_MESH_MAX);
	tu->agree_fold
	    = (int)cohort__knob_int_or(COHORT__KNOB_TCP_AGREE_FOLD, -1);
	tu->fused_fold_max = host_knob(
	    COHORT__KNOB_TCP_FUSED_FOLD_MAX, HOST_DEFAULT_FUSED_FOLD_MAX);
	tu->fused_ranks = (int)host_knob(
	    COHORT__KNOB_TCP_FUSED_RANKS, HOST_DEFAULT_FUSED_RANKS);
}

/* Whether a group of size agrees by the recursive-doubling fold. With
 * more ranks than CPUs (ranks of one host on loopback, the benchmarks'
 * case), one round of n - 1 messages per rank wakes every rank n - 1
 * times and costs more than log2(n) rounds of one: 4 ranks on 2 cores,
 * 4 KiB all-reduce 36 us against 43-49, 1 KiB 32-35 against 55. Between
 * hosts with a core per rank, one round is the shorter wait. */
static bool
host_agree_folds(const struct host_tune *tu, int size)
{
	if (tu->agree_fold >= 0)
		return (tu->agree_fold != 0);
	return (size > 2 && size > sysconf(_SC_NPROCESSORS_ONLN));
}

static void
host_fini(void *state)
{
	struct cohort__host *h = state;

	if (h == NULL)
		return;
	host_hier_free(h->hier);
	host_shm_free(h->shm);
	host_agree_fini(&h->agree);
	host_xfer_fini(&h->xfer);
	host_mesh_close(&h->mesh);
	free(h);
}

/* A small group: every pair connected, then shared memory and the
 * hierarchy. */
static cohort_status
host_init_full(struct cohort__host *h, const struct cohort__group_desc *desc,
    char *err, size_t errlen, cohort__time deadline)
{
	cohort_status rv;

	for (int p = 0; p < h->mesh.size; p++)
		h->xfer.want[p] = p;
	if ((rv = host_mesh_connect(&h->mesh, h->xfer.want, h->mesh.size,
	         "the set-up", err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	host_mesh_listen_done(&h->mesh);
	if ((rv = host_shm_setup(&h->mesh, &h->agree, &h->tune,
	         host_knob(COHORT__KNOB_TCP_SHM, 1) != 0,
	         host_knob(COHORT__KNOB_TCP_SHM_BLK, HOST_DEFAULT_SHM_BLK),
	         &h->shm, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	return (host_hier_setup(
	    h, &cohort__host_backend, desc, &h->hier, err, errlen, deadline));
}

static cohort_status
host_init(const struct cohort__group_desc *desc, void **state, char *err,
    size_t errlen, cohort__time deadline)
{
	struct cohort__host *h;
	cohort_status rv;

	if (desc->size < 1 || desc->rank < 0 || desc->rank >= desc->size) {
		snprintf(
		    err, errlen, "bad rank %d of %d", desc->rank, desc->size);
		return (COHORT_EINVAL);
	}
	if ((h = calloc(1, sizeof(*h))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	host_tune_read(&h->tune, desc->size);
	h->sparse = desc->size > h->tune.mesh_max;
	if ((rv = host_mesh_open(&h->mesh, desc, err, errlen, deadline))
	        != COHORT_OK
	    || (rv = host_xfer_init(&h->xfer, &h->mesh, &h->tune, err, errlen))
	        != COHORT_OK
	    || (rv = host_agree_init(&h->agree, &h->mesh, err, errlen))
	        != COHORT_OK)
		goto out_fini;
	/* This rank's choice; a fully connected group takes rank 0's
	 * (host_shm_setup's announcement), since a host's CPU count or a
	 * rank's environment may differ, and ranks that agree by different
	 * shapes would wait for each other until their deadlines. */
	h->tune.agree_fold = host_agree_folds(&h->tune, desc->size) ? 1 : 0;
	if (desc->size > 1 && !h->sparse
	    && (rv = host_init_full(h, desc, err, errlen, deadline))
	        != COHORT_OK)
		goto out_fini;
	h->agree.fold = h->sparse || h->tune.agree_fold != 0;
	if (h->sparse)
		cohort__debug("tcp group %s: rank %d of %d listening on %s "
		              "(connections on first use)",
		    desc->group_id, desc->rank, desc->size, h->mesh.addr);
	else
		cohort__debug(
		    "tcp group %s: rank %d of %d connected (listened "
		    "on %s%s)",
		    desc->group_id, desc->rank, desc->size, h->mesh.addr,
		    h->shm != NULL ? ", shared memory" : "");
	*state = h;
	return (COHORT_OK);

out_fini:
	host_fini(h);
	return (rv);
}

/* A small all-reduce of a fully connected group of 2, 4, 8.. ranks, up to
 * fused_ranks, sends its first round with the agreement
 * (host_algos_fused): on 2 ranks over loopback TCP 4 KiB in 5.9 us instead
 * of 8.8 and 16 KiB in 9.3 instead of 12. On 4 ranks of this 2-core
 * machine it made no difference that showed through the noise of 4
 * processes on 2 cores (43-55 us either way), so the default is 2. */
static bool
host_fused(
    const struct cohort__host *h, const struct cohort__op *op, size_t bytes)
{
	const struct host_tune *tu = &h->tune;

	return (op->kind == COHORT__OP_ALLREDUCE && !h->agreed
	    && bytes <= tu->small_max && h->mesh.size <= tu->fused_ranks
	    && host_agree_fusable(&h->agree)
	    && !host_hier_usable(h->hier, op, bytes));
}

/* A small all-reduce of a group that agrees by the fold runs in the
 * fold's rounds (up to COHORT_TCP_FUSED_FOLD_MAX): log2(n) rounds of
 * waiting instead of 2 log2(n). Measured (loopback, TCP only, 2-core VM):
 * 1 KiB on 4 ranks 32-35 us against 37-50, on 32 ranks 0.69-0.90 ms
 * against 0.95-1.04, 8 KiB on 32 ranks 0.84-1.01 ms against 1.04-1.21;
 * but from 16 KiB on 4 ranks (two per core) slower (64 KiB 120 against
 * 86 us): without the fold's barrier before it, a rank's operand waits
 * for a partner that is not running. Hence 8 KiB. */
static bool
host_fused_fold(
    const struct cohort__host *h, const struct cohort__op *op, size_t bytes)
{
	const struct host_tune *tu = &h->tune;

	return (op->kind == COHORT__OP_ALLREDUCE && !h->agreed && h->agree.fold
	    && bytes <= tu->fused_fold_max && bytes <= tu->small_max
	    && !host_hier_usable(h->hier, op, bytes));
}

static cohort_status host_run_op(void *state, const struct cohort__op *op,
    char *err, size_t errlen, cohort__time deadline);

static cohort_status
host_run(void *state, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	cohort_status rv;

	host_crowd_enter();
	rv = host_run_op(state, op, err, errlen, deadline);
	host_crowd_leave();
	return (rv);
}

static cohort_status
host_run_op(void *state, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	struct cohort__host *h = state;
	struct host_op c = { .name
		= cohort__op_name(h->as_kind != 0 ? h->as_kind : op->kind),
		.seq = op->seq,
		.dtype = op->dtype,
		.redop = op->op,
		.esize = 1,
		.divisor = h->mesh.size,
		.stats = op->stats };
	size_t bytes;
	cohort_status rv;

	if ((rv = host_mesh_check_abort(&h->mesh, &c, err, errlen))
	    != COHORT_OK)
		return (rv);
	if (h->agree.broken != COHORT_OK) {
		snprintf(err, errlen, "%s", h->agree.broken_err);
		return (h->agree.broken);
	}
	if (op->kind == COHORT__OP_BARRIER) {
		/* The agreement is an exchange with every rank (or its
		 * recursive-doubling fold): a barrier. */
		if (h->mesh.size == 1)
			return (COHORT_OK);
		host_op_algo(&c, "agree");
		return (host_agree_run(
		    &h->agree, &h->xfer, op, &c, err, errlen, deadline));
	}
	if ((c.esize = cohort_dtype_size(op->dtype)) == 0) {
		snprintf(err, errlen, "bad dtype %d", (int)op->dtype);
		return (COHORT_EINVAL);
	}
	bytes = op->count * c.esize;
	if (h->mesh.size == 1) {
		host_algos_local(op, c.esize);
		return (COHORT_OK);
	}

	/* Same host: the header travels in the segment's control block.
	 * Alltoallv's blocks have no common shape: TCP. */
	if (op->kind != COHORT__OP_ALLTOALLV
	    && host_shm_usable(h->shm, &h->tune, op, c.esize, bytes)) {
		host_agree_hdr(&h->agree, op, HOST_PATH_SHM);
		host_op_algo(&c, "shm");
		return (host_shm_run(
		    h->shm, op, &c, bytes, err, errlen, deadline));
	}
	if (host_fused(h, op, bytes))
		return (host_algos_fused(&h->agree, &h->xfer, op, &c, bytes,
		    err, errlen, deadline));
	if (host_fused_fold(h, op, bytes))
		return (host_algos_fused_fold(&h->agree, &h->xfer, op, &c,
		    bytes, err, errlen, deadline));
	if (!h->agreed
	    && (rv = host_agree_run(
	            &h->agree, &h->xfer, op, &c, err, errlen, deadline))
	        != COHORT_OK)
		return (rv);
	/* Several ranks on each of several hosts: shared memory within a
	 * host, TCP between hosts (hier.c). */
	if (host_hier_usable(h->hier, op, bytes))
		return (host_hier_allreduce(
		    h->hier, op, &c, c.esize, err, errlen, deadline));
	return (host_algos_run(
	    &h->xfer, op, &c, bytes, h->sparse, err, errlen, deadline));
}

static void
host_abort(void *state)
{
	struct cohort__host *h = state;

	if (h == NULL)
		return;
	host_mesh_abort(&h->mesh);
	host_hier_abort(h->hier);
}

const struct cohort__backend_ops cohort__host_backend = {
	.version = COHORT__BACKEND_VERSION,
	.name = "host",
	.init = host_init,
	.run = host_run,
	.abort = host_abort,
	.fini = host_fini,
	.p2p_open = host_p2p_open,
	.p2p_post = host_p2p_post,
	.p2p_abort = host_p2p_abort,
	.p2p_close = host_p2p_close,
	.p2p_needs_state = false,
};

/* The table's name before the backend ran over shared memory too, for
 * code that still names it (backend.h); new code names the one above. */
extern const struct cohort__backend_ops cohort__tcp_backend
    __attribute__((alias("cohort__host_backend")));
