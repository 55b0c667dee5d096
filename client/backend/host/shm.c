/*
 * shm.c - the host backend's same-host shared-memory path: every
 * collective (allreduce; broadcast, reduce, allgather(v), gather, scatter,
 * alltoall and reduce_scatter as staged rounds, below).
 *
 * Setup (at init, over the authenticated TCP connections, which carry
 * nothing else yet): rank 0 creates a POSIX shared-memory segment with a
 * random 128-bit name, mode 0600, allocates its pages (posix_fallocate:
 * a full /dev/shm fails here, not with SIGBUS later), maps it, writes a
 * random token into its header and sends name, size, token and its
 * allreduce size range for the segment to every peer (96 bytes, "CSM1").
 * The mappings are not pre-faulted: the pages exist, and mapping them on
 * first touch costs less than MAP_POPULATE (1.6 ms for 3 MiB at init).
 * Each peer opens and maps the segment, checks the token, and answers one
 * byte, 'Y' or 'N' (another host, another /dev/shm, or COHORT_TCP_SHM=0
 * there). Rank 0 unlinks the name as soon as every answer is in and sends
 * its verdict byte: the whole group uses the segment, or nobody does (pure
 * TCP). So the segment only lives in /dev/shm for the duration of init
 * (a rank 0 killed in that window leaves it behind), and only processes
 * that proved the job secret learn its name.
 *
 * Layout: a header page; per rank a control block (its three progress
 * counters on one cache line, written by the owner only, and a count of
 * sleeping waiters on another); then per rank two staging slots S[2] of
 * n * blk bytes and two result slots R[2] of blk bytes.
 *
 * Allreduce is cut into rounds of at most n * blk bytes, numbered
 * globally over the group's lifetime (every rank runs the same sequence
 * of operations), each round split into n blocks. Round g uses slots of
 * parity g & 1:
 *   post    rank r copies the blocks p != r of its input into S_r;
 *           posted_r = g + 1
 *   reduce  once every posted_p > g (and every done_p > g - 2, R_r's
 *           previous readers): output block r = input block r op
 *           S_p[block r] over p in ascending order, copied to R_r;
 *           reduced_r = g + 1
 *   gather  once every reduced_p > g: copy every other R_p into the
 *           output; done_r = g + 1
 * A rank posts round g + 1 right after reducing round g, before waiting
 * for the other ranks' results of g: S's previous readers (round g - 1)
 * have finished, since this rank saw every reduced_p > g - 1. Each block is
 * reduced by exactly one rank, so every rank gets bit-identical results;
 * input blocks are consumed before the round's output is written, so it
 * works in place. Per rank and byte of the tensor: (n-1)/n copied in,
 * 1/n reduced and copied to R, (n-1)/n copied out - with 32-byte AVX2
 * loads and stores (see shm_copy).
 *
 * Cross-memory attach (from COHORT_TCP_SHM_CMA_MIN: 1 MiB, 4 MiB with
 * more ranks than CPUs; host.c has the measurements): staging
 * costs every byte a copy in and a copy out. Where the kernel lets ranks
 * read each other's memory (process_vm_readv: same user, no seccomp or
 * Yama rule against it), a large allreduce leaves its buffers where they
 * are. One global round: every rank publishes its send and receive
 * addresses in its control block and posts; each reduces its block from
 * its own input and the others' (read in L2-sized pieces into a scratch
 * and added in ascending rank order; out of place, the first other rank's
 * piece is read into the output and ours added to it, which saves copying
 * our own input: 16 MiB on 2 ranks 2.3 -> 1.9 ms); once every rank reduced,
 * each reads the others' reduced blocks straight into its output, and none
 * returns before every rank has (its buffers are read until then). Per
 * rank and byte: (n-1)/n read in and 1/n reduced and written, then
 * (n-1)/n read out - against 2 (n-1)/n + 2/n copies staged. At setup
 * every rank proves it can read every other (a random word at an address
 * each published), and the group uses it only if all can; another PID
 * namespace or a forbidden read leaves it staging.
 *
 * Waiting: spin on the counters (a few pauses, none when the group has
 * more ranks than CPUs: a spinning rank would hold the core its peer needs;
 * measured 4 ranks on 2 cores, 4 KiB: 55 us with 256 pauses, 15 us with
 * none), then spin with sched_yield() for spin_us, then sleep on the
 * counter with a futex (at most SHM_SLEEP_MS); an owner wakes the futex
 * only when someone sleeps on it. Between sleeps
 * the waiter checks the abort flags, the deadline, and - the liveness
 * channel - the TCP connections of the ranks it waits for: a peer that
 * dies closes them (POLLRDHUP), so it is reported EPEERLOST by name.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <limits.h>
#include <linux/futex.h>
#include <poll.h>
#include <sched.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/random.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/syscall.h>
#include <sys/uio.h>
#include <time.h>
#include <unistd.h>

#include <immintrin.h>

#include "host_impl.h"

#define SHM_MAGIC "COHORT-SHM-3"
#define SHM_MSG_LEN 96
#define SHM_HDR 4096
#define SHM_LINE 64
#define SHM_SLEEP_MS 5
/* Staging per rank and parity is capped at this many bytes (n * blk). */
#define SHM_ROUND_MAX (1u << 20)
/* Reduction piece: the L1 data cache. */
#define SHM_PIECE 32768u
/* Cross-memory reduction piece: read from a peer, then added (L2). */
#define SHM_CMA_PIECE (128u << 10)
/* How long a failed cross-memory read waits for the failure behind it. */
#define SHM_CMA_SETTLE_MS 3000
/* No segment larger than this (very large groups use TCP). */
#define SHM_MAX_LEN ((size_t)256 << 20)

struct shm_ctrl {
	atomic_uint posted;
	atomic_uint reduced;
	atomic_uint done;
	/* The owner's header of the operation it posts (agree.c), written
	 * before posted (release), read by the others after seeing it. */
	uint8_t op_hdr[HOST_OP_HDR];
	uint8_t pad1[SHM_LINE - 3 * sizeof(atomic_uint) - HOST_OP_HDR];
	atomic_uint sleepers;
	uint8_t pad2[SHM_LINE - sizeof(atomic_uint)];
	/* Cross-memory attach: the owner's process and probe word (set up
	 * once), and the buffers of the allreduce it posts (before posted). */
	int32_t pid;
	uint32_t pad3;
	uint64_t probe_addr;
	uint64_t probe_val;
	uint64_t src;
	uint64_t dst;
	uint8_t pad4[SHM_LINE - 40];
};

_Static_assert(sizeof(struct shm_ctrl) == 3 * SHM_LINE, "shm_ctrl lines");

struct shm_hdr {
	char magic[16];
	uint8_t token[16];
	uint32_t size;
	uint32_t blk;
};

struct host_shm {
	struct host_mesh *mesh; /* the liveness channel */
	struct host_agree *agree; /* headers, broken */
	const struct host_tune *tune;
	int rank, size;
	uint8_t *base;
	size_t len;
	size_t blk; /* bytes per block (multiple of 64) */
	size_t rank_len; /* data bytes per rank */
	uint32_t round; /* next global round */
	/* The last operation was not an allreduce: the next one waits for
	 * every rank to finish its last round before it rewrites op_hdr
	 * (shm_begin_op). */
	bool sync_next;
	struct shm_ctrl *ctrl;
	uint8_t *data;
	/* Cross-memory attach: whether the group uses it, from which size
	 * (rank 0's), the word the others read to prove they can, and the
	 * reduction scratch (SHM_CMA_PIECE). */
	bool cma;
	size_t cma_min;
	uint64_t probe;
	uint8_t *scratch;
};

enum { SHM_POSTED, SHM_REDUCED, SHM_DONE };

/*
 * Copies with 32-byte AVX2 loads and stores. glibc's memmove uses `rep
 * movsb` for blocks below the L2 size on this CPU, which runs at a fraction
 * of the speed when the lines move between cores (measured: 16 MiB 2 ranks
 * 2.2 GB/s busbw with memcpy, 9 GB/s with this loop).
 */
__attribute__((target("avx2"))) static void
shm_copy_avx2(uint8_t *d, const uint8_t *s, size_t n)
{
	size_t i = 0;

	for (; i + 128 <= n; i += 128) {
		__m256i a = _mm256_loadu_si256((const void *)(s + i));
		__m256i b = _mm256_loadu_si256((const void *)(s + i + 32));
		__m256i c = _mm256_loadu_si256((const void *)(s + i + 64));
		__m256i e = _mm256_loadu_si256((const void *)(s + i + 96));

		_mm256_storeu_si256((void *)(d + i), a);
		_mm256_storeu_si256((void *)(d + i + 32), b);
		_mm256_storeu_si256((void *)(d + i + 64), c);
		_mm256_storeu_si256((void *)(d + i + 96), e);
	}
	if (i < n)
		memcpy(d + i, s + i, n - i);
}

static void
shm_copy(void *d, const void *s, size_t n)
{
	static int avx2 = -1;

	if (avx2 < 0)
		avx2 = __builtin_cpu_supports("avx2") ? 1 : 0;
	if (avx2)
		shm_copy_avx2(d, s, n);
	else
		memcpy(d, s, n);
}

static size_t
shm_blk(int n, size_t want)
{
	size_t b = want;

	if (b * (size_t)n > SHM_ROUND_MAX)
		b = SHM_ROUND_MAX / (size_t)n;
	b &= ~(size_t)63;
	if (b < 4096)
		b = 4096;
	return (b);
}

static void
shm_layout(struct host_shm *s, int n, size_t blk)
{
	size_t ctrl = (size_t)n * sizeof(struct shm_ctrl);
	size_t data_off = SHM_HDR + ((ctrl + 4095) & ~(size_t)4095);

	s->blk = blk;
	s->rank_len = 2 * (size_t)n * blk + 2 * blk;
	s->len = data_off + (size_t)n * s->rank_len;
	if (s->base != NULL) {
		s->ctrl = (struct shm_ctrl *)(void *)(s->base + SHM_HDR);
		s->data = s->base + data_off;
	}
}

static inline uint8_t *
shm_S(struct host_shm *s, int n, int p, uint32_t g)
{
	return (s->data + (size_t)p * s->rank_len
	    + (size_t)(g & 1) * (size_t)n * s->blk);
}

static inline uint8_t *
shm_R(struct host_shm *s, int n, int p, uint32_t g)
{
	return (s->data + (size_t)p * s->rank_len + 2 * (size_t)n * s->blk
	    + (size_t)(g & 1) * s->blk);
}

static inline atomic_uint *
shm_flag(struct host_shm *s, int p, int which)
{
	struct shm_ctrl *c = &s->ctrl[p];

	return (which == SHM_POSTED    ? &c->posted
	        : which == SHM_REDUCED ? &c->reduced
	                               : &c->done);
}

static inline bool
shm_reached(uint32_t have, uint32_t want)
{
	return ((int32_t)(have - want) >= 0);
}

static void
shm_signal(struct host_shm *s, const struct host_op *c, int which, uint32_t v)
{
	atomic_uint *f = shm_flag(s, s->rank, which);

	atomic_store_explicit(f, v, memory_order_seq_cst);
	if (atomic_load_explicit(
	        &s->ctrl[s->rank].sleepers, memory_order_seq_cst)
	    != 0)
		(void)syscall(SYS_futex, (uint32_t *)f, FUTEX_WAKE, INT_MAX,
		    NULL, NULL, 0);
}

static cohort_status shm_stray(struct host_shm *s, const struct host_op *c,
    int p, char *err, size_t errlen);

/* Checks the connections of the ranks not yet at want: one that hung up
 * is lost (it cannot have finished the round). */
static cohort_status
shm_liveness(struct host_shm *s, const struct host_op *c, int which,
    uint32_t want, char *err, size_t errlen)
{
	struct pollfd *fds = s->mesh->pfds; /* room for size + the watch */
	int nfds = 0, k;
	cohort_status rv;

	for (int p = 0; p < s->size; p++) {
		if (p == s->rank
		    || shm_reached(atomic_load_explicit(shm_flag(s, p, which),
		                       memory_order_acquire),
		        want))
			continue;
		fds[nfds].fd = s->mesh->links[p].fd;
		fds[nfds].events = POLLRDHUP | POLLIN;
		fds[nfds].revents = 0;
		s->mesh->pfd_peer[nfds++] = p;
	}
	k = host_mesh_watch_add(s->mesh, fds, nfds);
	if (nfds + k == 0 || poll(fds, (nfds_t)(nfds + k), 0) <= 0)
		return (COHORT_OK);
	if ((rv = host_mesh_watch_check(
	         s->mesh, c, fds + nfds, k, err, errlen))
	    != COHORT_OK)
		return (rv);
	for (int i = 0; i < nfds; i++) {
		int p = s->mesh->pfd_peer[i];

		if ((fds[i].revents & (POLLRDHUP | POLLHUP | POLLERR)) == 0) {
			/* Bytes from a rank that has not reached this
			 * step: it runs an operation over TCP. */
			if ((fds[i].revents & POLLIN) != 0)
				return (shm_stray(s, c, p, err, errlen));
			continue;
		}
		if ((rv = host_mesh_check_abort(s->mesh, c, err, errlen))
		    != COHORT_OK)
			return (rv);
		snprintf(err, errlen,
		    "rank %d closed the connection during "
		    "%s #%" PRIu64 " (shared memory, round %" PRIu32 ")",
		    (int)s->mesh->links[p].job_rank, c->name, c->seq,
		    want - 1);
		return (COHORT_EPEERLOST);
	}
	return (COHORT_OK);
}

/* Waits until every other rank's counter `which` reached want. *since:
 * when it started waiting past the hot spins (0: it did not), *until:
 * when the wait ended (0: unknown, now), both from the clock reads the
 * spinning makes anyway. */
static cohort_status
shm_wait_for(struct host_shm *s, const struct host_op *c, int which,
    uint32_t want, uint64_t *since, uint64_t *until, char *err, size_t errlen,
    cohort__time deadline)
{
	uint64_t idle_since = 0, waited_since = 0, last_now = 0;
	bool slept = false;
	int spins = 0;
	cohort_status rv;

	for (;;) {
		int missing = -1;
		atomic_uint *f;
		unsigned v;

		for (int p = 0; p < s->size; p++) {
			if (p != s->rank
			    && !shm_reached(
			        atomic_load_explicit(shm_flag(s, p, which),
			            memory_order_acquire),
			        want)) {
				missing = p;
				break;
			}
		}
		if (missing < 0) {
			/* One more clock read after a futex sleep. */
			if (waited_since != 0)
				*until = slept ? cohort__now_ns() : last_now;
			return (COHORT_OK);
		}
		if (spins < s->tune->shm_hot_spins && !host_crowded()) {
			spins++;
			cohort__cpu_relax();
			continue;
		}
		if ((rv = host_mesh_check_abort(s->mesh, c, err, errlen))
		    != COHORT_OK)
			return (rv);
		if (s->tune->spin_us > 0 && !host_crowded()) {
			uint64_t now = cohort__now_ns();

			last_now = now;
			slept = false;
			if (waited_since == 0)
				*since = waited_since = now;
			if (idle_since == 0)
				idle_since = now;
			if (now - idle_since
			    < (uint64_t)s->tune->spin_us * 1000u) {
				if (s->tune->spin_yield)
					sched_yield();
				else
					cohort__cpu_relax();
				continue;
			}
		}
		if ((rv = shm_liveness(s, c, which, want, err, errlen))
		    != COHORT_OK)
			return (rv);
		if (cohort__expired(deadline)) {
			snprintf(err, errlen,
			    "timed out during %s #%" PRIu64
			    " waiting for rank %d (shared memory, round "
			    "%" PRIu32 ")",
			    c->name, c->seq,
			    (int)s->mesh->links[missing].job_rank, want - 1);
			return (COHORT_ETIMEDOUT);
		}
		if (waited_since == 0)
			*since = waited_since = cohort__now_ns();
		f = shm_flag(s, missing, which);
		atomic_fetch_add_explicit(
		    &s->ctrl[missing].sleepers, 1, memory_order_seq_cst);
		v = atomic_load_explicit(f, memory_order_seq_cst);
		if (!shm_reached(v, want)) {
			struct timespec ts = { 0, SHM_SLEEP_MS * 1000000L };
			cohort_duration left = cohort__remaining(deadline);

			if (left != COHORT_WAIT_FOREVER && left < SHM_SLEEP_MS)
				ts.tv_nsec = (left < 1 ? 1 : left) * 1000000L;
			(void)syscall(SYS_futex, (uint32_t *)f, FUTEX_WAIT, v,
			    &ts, NULL, 0);
		}
		atomic_fetch_sub_explicit(
		    &s->ctrl[missing].sleepers, 1, memory_order_seq_cst);
		slept = true;
		idle_since = 0;
		spins = 0;
	}
}

/* shm_wait_for, adding the time spent waiting for a peer past the hot
 * spins to the op stats (backend.h), also when the wait failed. */
static cohort_status
shm_wait(struct host_shm *s, const struct host_op *c, int which, uint32_t want,
    char *err, size_t errlen, cohort__time deadline)
{
	uint64_t since = 0, until = 0;
	cohort_status rv = shm_wait_for(
	    s, c, which, want, &since, &until, err, errlen, deadline);

	if (since != 0 && c->stats != NULL) {
		if (until == 0)
			until = cohort__now_ns();
		if (until > since)
			c->stats->wait_ns += until - since;
	}
	return (rv);
}

bool
host_shm_usable(const struct host_shm *s, const struct host_tune *tune,
    const struct cohort__op *op, size_t esize, size_t bytes)
{
	if (s == NULL || op->kind == COHORT__OP_BARRIER)
		return (false);
	if (op->kind == COHORT__OP_ALLGATHERV) {
		bytes = 0;
		for (int p = 0; p < s->size; p++)
			bytes += op->counts[p] * esize;
	}
	return (bytes > 0 && bytes >= tune->shm_min && bytes <= tune->shm_max);
}

/* Block p of a round of elems elements: the first elems % n get one more
 * element. */
static void
shm_block(size_t elems, int n, int p, size_t esize, size_t *off, size_t *len)
{
	size_t base = elems / (size_t)n, rem = elems % (size_t)n;
	size_t up = (size_t)p;

	*off = (up * base + (up < rem ? up : rem)) * esize;
	*len = (base + (up < rem ? 1 : 0)) * esize;
}

static void
shm_post(struct host_shm *s, const struct host_op *c, const uint8_t *src,
    size_t roff, size_t elems, uint32_t g)
{
	int n = s->size;
	uint8_t *S = shm_S(s, n, s->rank, g);

	for (int p = 0; p < n; p++) {
		size_t off, len;

		if (p == s->rank)
			continue;
		shm_block(elems, n, p, c->esize, &off, &len);
		shm_copy(S + off, src + roff + off, len);
	}
	shm_signal(s, c, SHM_POSTED, g + 1);
}

/* Reduces our block [off, off + len) of round g into out (own input in,
 * the other ranks' staged blocks added in ascending rank order) and
 * publishes it in R, in L1-sized pieces so that the copy to R reads what
 * the reduction just wrote. */
static void
shm_reduce_block(struct host_shm *s, const struct host_op *c,
    const struct cohort__op *op, uint8_t *out, const uint8_t *in, size_t off,
    size_t len, uint8_t *R, uint32_t g)
{
	size_t piece = SHM_PIECE - SHM_PIECE % c->esize;

	for (size_t o = 0; o < len; o += piece) {
		size_t l = len - o < piece ? len - o : piece;

		if (in != out)
			shm_copy(out + o, in + o, l);
		for (int p = 0; p < s->size; p++)
			if (p != s->rank)
				cohort__reduce(out + o,
				    shm_S(s, s->size, p, g) + off + o,
				    l / c->esize, op->dtype, op->op);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    out + o, l / c->esize, op->dtype, (double)s->size);
		if (out != R)
			shm_copy(R + o, out + o, l);
	}
}

/* Starts an operation at round g0: its slots (last read in round g0 - 2)
 * are free, and this rank's header of the previous operation has been
 * compared by every rank, so op_hdr may take the new one. An allreduce
 * ends only once every rank reduced its first round (and so compared the
 * headers); the other operations do not wait for their readers, so after
 * one of them every rank must have finished its last round (done > g0-1).
 */
static cohort_status
shm_begin_op(struct host_shm *s, const struct host_op *c, uint32_t g0,
    char *err, size_t errlen, cohort__time deadline)
{
	cohort_status rv;

	rv = shm_wait(
	    s, c, SHM_DONE, s->sync_next ? g0 : g0 - 1, err, errlen, deadline);
	if (rv != COHORT_OK)
		return (rv);
	memcpy(s->ctrl[s->rank].op_hdr,
	    s->agree->hdrs + (size_t)s->rank * HOST_OP_HDR, HOST_OP_HDR);
	return (COHORT_OK);
}

/* Reserves rounds global rounds for an operation and starts it
 * (shm_begin_op); *g0 gets its first round. sync_after: the operation
 * does not wait for its readers (every kind but allreduce). */
static cohort_status
shm_start(struct host_shm *s, const struct host_op *c, size_t rounds,
    bool sync_after, uint32_t *g0, char *err, size_t errlen,
    cohort__time deadline)
{
	cohort_status rv;

	*g0 = s->round;
	s->round += (uint32_t)rounds;
	if ((rv = shm_begin_op(s, c, *g0, err, errlen, deadline)) != COHORT_OK)
		return (rv);
	s->sync_next = sync_after;
	return (COHORT_OK);
}

/* Every rank posted round g0 of this operation: compare their headers. */
static cohort_status
shm_agree(
    struct host_shm *s, const struct host_op *c, char *err, size_t errlen)
{

	for (int p = 0; p < s->size; p++)
		if (p != s->rank)
			memcpy(s->agree->hdrs + (size_t)p * HOST_OP_HDR,
			    s->ctrl[p].op_hdr, HOST_OP_HDR);
	return (host_agree_check(s->agree, c, err, errlen));
}

static cohort_status
shm_stray(struct host_shm *s, const struct host_op *c, int p, char *err,
    size_t errlen)
{
	uint8_t *theirs = s->agree->hdrs + (size_t)p * HOST_OP_HDR;
	uint8_t *mine = s->agree->hdrs + (size_t)s->rank * HOST_OP_HDR;
	size_t got = 0, sent = 0;
	cohort__time until = cohort__now_ms() + 1000;

	/* Its header is there (or arriving); ours lets it fail too. */
	while ((got < HOST_OP_HDR || sent < HOST_OP_HDR)
	    && !cohort__expired(until)) {
		struct pollfd pfd = { .fd = s->mesh->links[p].fd,
			.events = (short)((got < HOST_OP_HDR ? POLLIN : 0)
			    | (sent < HOST_OP_HDR ? POLLOUT : 0)) };
		ssize_t n;

		(void)poll(&pfd, 1, 10);
		if (got < HOST_OP_HDR) {
			n = recv(s->mesh->links[p].fd, theirs + got,
			    HOST_OP_HDR - got, MSG_DONTWAIT);
			if (n > 0)
				got += (size_t)n;
			else if (n == 0)
				break;
		}
		if (sent < HOST_OP_HDR) {
			n = send(s->mesh->links[p].fd, mine + sent,
			    HOST_OP_HDR - sent, MSG_DONTWAIT | MSG_NOSIGNAL);
			if (n > 0)
				sent += (size_t)n;
		}
	}
	if (got < HOST_OP_HDR)
		memset(theirs, 0, HOST_OP_HDR);
	/* Compare only the two: the others are unknown. */
	for (int q = 0; q < s->size; q++)
		if (q != p && q != s->rank)
			memcpy(s->agree->hdrs + (size_t)q * HOST_OP_HDR, mine,
			    HOST_OP_HDR);
	if (host_agree_check(s->agree, c, err, errlen) == COHORT_OK) {
		snprintf(err, errlen,
		    "ranks disagree on the path: rank %d runs %s #%" PRIu64
		    " over tcp while rank %d uses shared memory",
		    (int)s->mesh->links[p].job_rank, c->name, c->seq,
		    (int)s->mesh->links[s->rank].job_rank);
	}
	s->agree->broken = COHORT_EMISMATCH;
	snprintf(s->agree->broken_err, sizeof(s->agree->broken_err),
	    "%s (in %s #%" PRIu64 "; the group cannot be used any more)", err,
	    c->name, c->seq);
	return (COHORT_EMISMATCH);
}

/* Reads peer p's probe word into *v (cross-memory): 0, or -1 and errno
 * (ESRCH: no such process, or one without memory, a zombie). */
static int
shm_cma_peek(const struct host_shm *s, int p, uint64_t *v)
{
	struct iovec l = { v, sizeof(*v) };
	struct iovec r
	    = { (void *)(uintptr_t)s->ctrl[p].probe_addr, sizeof(*v) };
	ssize_t got = process_vm_readv((pid_t)s->ctrl[p].pid, &l, 1, &r, 1, 0);

	if (got == (ssize_t)sizeof(*v))
		return (0);
	if (got >= 0)
		errno = EFAULT;
	return (-1);
}

/* Peer p's process is gone during the operation: EPEERLOST naming it. */
static cohort_status
shm_cma_exited(const struct host_shm *s, const struct host_op *c, int p,
    char *err, size_t errlen)
{
	snprintf(err, errlen,
	    "rank %d exited during %s #%" PRIu64
	    " (shared memory: its process is gone)",
	    (int)s->mesh->links[p].job_rank, c->name, c->seq);
	return (COHORT_EPEERLOST);
}

/* Reads len bytes at peer p's address addr into dst (cross-memory). A
 * peer whose process is gone is lost; any other failure is ESYSTEM, which
 * the caller settles (shm_cma_failed). */
static cohort_status
shm_cma_read(struct host_shm *s, const struct host_op *c, int p, void *dst,
    uint64_t addr, size_t len, char *err, size_t errlen)
{
	size_t done = 0;
	int e;

	while (done < len) {
		struct iovec l = { (uint8_t *)dst + done, len - done };
		struct iovec r
		    = { (void *)(uintptr_t)(addr + done), len - done };
		ssize_t got
		    = process_vm_readv((pid_t)s->ctrl[p].pid, &l, 1, &r, 1, 0);

		if (got > 0) {
			done += (size_t)got;
			continue;
		}
		e = got < 0 ? errno : EFAULT;
		if (e == EINTR)
			continue;
		if (e == ESRCH)
			return (shm_cma_exited(s, c, p, err, errlen));
		snprintf(err, errlen,
		    "cannot read rank %d's buffer during %s #%" PRIu64
		    " (cross-memory attach: %s)",
		    (int)s->mesh->links[p].job_rank, c->name, c->seq,
		    strerror(e));
		return (COHORT_ESYSTEM);
	}
	return (COHORT_OK);
}

/* A cross-memory read failed (rv, err). Usually the peer gave the
 * operation up: it saw a failure first (a rank exited, the group was
 * aborted), returned, and its buffer went with it. That failure shows
 * here within moments, as the group's abort or a rank whose process is
 * gone: wait for it and report it instead. Otherwise the read itself is
 * the error, and the group cannot be used any more. */
static cohort_status
shm_cma_failed(struct host_shm *s, const struct host_op *c, cohort_status rv,
    char *err, size_t errlen, cohort__time deadline)
{
	cohort__time until = cohort__now_ms() + SHM_CMA_SETTLE_MS;
	char why[512];

	if (rv != COHORT_ESYSTEM)
		return (rv);
	if (deadline != COHORT__TIME_NEVER && deadline < until)
		until = deadline;
	do {
		cohort_status cause
		    = host_mesh_check_abort(s->mesh, c, why, sizeof(why));

		if (cause != COHORT_OK) {
			snprintf(err, errlen, "%s", why);
			return (cause);
		}
		for (int p = 0; p < s->size; p++) {
			uint64_t v;

			if (p != s->rank && shm_cma_peek(s, p, &v) != 0
			    && errno == ESRCH)
				return (shm_cma_exited(s, c, p, err, errlen));
		}
		(void)poll(NULL, 0, 1);
	} while (!cohort__expired(until));
	s->agree->broken = COHORT_ESYSTEM;
	snprintf(s->agree->broken_err, sizeof(s->agree->broken_err),
	    "%s; the group cannot be used any more", err);
	return (COHORT_ESYSTEM);
}

/* The allreduce by cross-memory reads (see the top of this file): one
 * global round, the buffers published in the control block. */
static cohort_status
shm_cma_allreduce(struct host_shm *s, const struct host_op *c,
    const struct cohort__op *op, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	int n = s->size, r = s->rank;
	size_t elems = bytes / c->esize;
	size_t piece = SHM_CMA_PIECE - SHM_CMA_PIECE % c->esize;
	size_t off, len;
	uint32_t g;
	cohort_status rv;

	if ((rv = shm_start(s, c, 1, false, &g, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	host_op_algo(c, "shm_cma");
	s->ctrl[r].src = (uint64_t)(uintptr_t)src;
	s->ctrl[r].dst = (uint64_t)(uintptr_t)dst;
	shm_signal(s, c, SHM_POSTED, g + 1);
	if ((rv = shm_wait(s, c, SHM_POSTED, g + 1, err, errlen, deadline))
	        != COHORT_OK
	    || (rv = shm_agree(s, c, err, errlen)) != COHORT_OK)
		return (rv);

	/* Our block: in place, own input op every other rank's in rank
	 * order; out of place, the first other rank's input read straight
	 * into the output (no copy of our own), op ours, op the rest. */
	shm_block(elems, n, r, c->esize, &off, &len);
	for (size_t o = 0; o < len && rv == COHORT_OK; o += piece) {
		size_t l = len - o < piece ? len - o : piece;
		int first = -1;

		if (src != dst) {
			first = r == 0 ? 1 : 0;
			rv = shm_cma_read(s, c, first, dst + off + o,
			    s->ctrl[first].src + off + o, l, err, errlen);
			if (rv == COHORT_OK)
				cohort__reduce(dst + off + o, src + off + o,
				    l / c->esize, op->dtype, op->op);
		}
		for (int p = 0; p < n && rv == COHORT_OK; p++) {
			if (p == r || p == first)
				continue;
			rv = shm_cma_read(s, c, p, s->scratch,
			    s->ctrl[p].src + off + o, l, err, errlen);
			if (rv == COHORT_OK)
				cohort__reduce(dst + off + o, s->scratch,
				    l / c->esize, op->dtype, op->op);
		}
		if (rv == COHORT_OK && op->op == COHORT_MEAN)
			cohort__scale_div(
			    dst + off + o, l / c->esize, op->dtype, (double)n);
	}
	if (rv != COHORT_OK)
		return (shm_cma_failed(s, c, rv, err, errlen, deadline));
	shm_signal(s, c, SHM_REDUCED, g + 1);

	/* The others' blocks, from their outputs into ours. */
	if ((rv = shm_wait(s, c, SHM_REDUCED, g + 1, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	for (int p = 0; p < n && rv == COHORT_OK; p++) {
		if (p == r)
			continue;
		shm_block(elems, n, p, c->esize, &off, &len);
		rv = shm_cma_read(s, c, p, dst + off, s->ctrl[p].dst + off,
		    len, err, errlen);
	}
	if (rv != COHORT_OK)
		return (shm_cma_failed(s, c, rv, err, errlen, deadline));
	/* Our output is read until every rank is done. */
	shm_signal(s, c, SHM_DONE, g + 1);
	return (shm_wait(s, c, SHM_DONE, g + 1, err, errlen, deadline));
}

static cohort_status
shm_allreduce(struct host_shm *s, const struct host_op *c,
    const struct cohort__op *op, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	int n = s->size, r = s->rank;
	/* A reduce is an all-reduce whose results only the root gathers. */
	int root = op->kind == COHORT__OP_REDUCE ? op->root : -1;
	/* blk is a multiple of 64, so of every element size */
	size_t per = (size_t)n * s->blk;
	size_t rounds = (bytes + per - 1) / per;
	uint32_t g0;
	cohort_status rv;

	if (s->cma && root < 0 && bytes >= s->cma_min)
		return (
		    shm_cma_allreduce(s, c, op, bytes, err, errlen, deadline));
	if ((rv = shm_start(s, c, rounds, false, &g0, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	shm_post(s, c, src, 0, (bytes < per ? bytes : per) / c->esize, g0);
	for (size_t k = 0; k < rounds; k++) {
		uint32_t g = g0 + (uint32_t)k;
		size_t roff = k * per;
		size_t rlen = bytes - roff < per ? bytes - roff : per;
		size_t elems = rlen / c->esize;
		size_t off, len;
		uint8_t *R = shm_R(s, n, r, g);

		/* Reduce our block of round g. */
		if ((rv = shm_wait(
		         s, c, SHM_POSTED, g + 1, err, errlen, deadline))
		        != COHORT_OK
		    || (rv = shm_wait(
		            s, c, SHM_DONE, g - 1, err, errlen, deadline))
		        != COHORT_OK)
			break;
		if (k == 0 && (rv = shm_agree(s, c, err, errlen)) != COHORT_OK)
			break;
		shm_block(elems, n, r, c->esize, &off, &len);
		/* A reduce's non-roots reduce their block straight into R. */
		shm_reduce_block(s, c, op,
		    root >= 0 && r != root ? R : dst + roff + off,
		    src + roff + off, off, len, R, g);
		shm_signal(s, c, SHM_REDUCED, g + 1);

		/* Post round g + 1 while the others finish round g. */
		if (k + 1 < rounds) {
			size_t noff = roff + per;
			size_t nlen = bytes - noff < per ? bytes - noff : per;

			shm_post(s, c, src, noff, nlen / c->esize, g + 1);
		}

		/* Gather round g's results. */
		if ((rv = shm_wait(
		         s, c, SHM_REDUCED, g + 1, err, errlen, deadline))
		    != COHORT_OK)
			break;
		for (int p = 0; p < n && (root < 0 || r == root); p++) {
			if (p == r)
				continue;
			shm_block(elems, n, p, c->esize, &off, &len);
			shm_copy(dst + roff + off, shm_R(s, n, p, g), len);
		}
		shm_signal(s, c, SHM_DONE, g + 1);
	}
	return (rv);
}

/*
 * The other collectives use the same slots and counters, round by round
 * (rounds stay global, so any sequence of operations keeps every rank's
 * counters in step). A round g writes only its own staging slot S_r of
 * parity g & 1, after every done_p > g - 2 (its readers of round g - 2
 * are finished), publishes posted_r = g + 1, reads the others' slots once
 * every posted_p > g, then publishes done_r = g + 1. The parity lets a
 * writer fill round g + 1 while the others still read round g. Every rank
 * compares the headers once all posted round g0, before any data moved.
 *
 * Two shapes of round (struct shm_xop):
 *   whole   a staging rank stages up to n * blk bytes of one contiguous
 *           block a round (broadcast: the root; allgather(v): every rank
 *           its own block; gather: every rank but the root);
 *   pieces  a staging rank stages a piece of each of the n - 1 blocks not
 *           its own a round, up to n * blk / (n - 1) bytes each, side by
 *           side (scatter: the root; alltoall and reduce_scatter: every
 *           rank).
 * Then the ranks that receive copy (reduce_scatter: reduce, in ascending
 * rank order as allreduce does) the pieces meant for them out of the
 * others' slots. A reduce runs as an allreduce whose results only the root
 * gathers, so that the reduction is spread over every rank.
 * One copy in and one copy out per byte, against two kernel copies plus
 * the protocol over loopback TCP.
 */

/* Starts round g: the slot of parity g & 1 is free to write. */
static cohort_status
shm_round_begin(struct host_shm *s, const struct host_op *c, uint32_t g,
    char *err, size_t errlen, cohort__time deadline)
{
	return (shm_wait(s, c, SHM_DONE, g - 1, err, errlen, deadline));
}

/* After a broadcast's headers disagreed: true when they differ only in
 * the root (bytes 8..11), so every rank planned the same rounds. */
static bool
shm_only_root_differs(const struct host_shm *s)
{
	const uint8_t *h0 = s->agree->hdrs;

	for (int p = 1; p < s->size; p++) {
		const uint8_t *h = s->agree->hdrs + (size_t)p * HOST_OP_HDR;

		if (memcmp(h, h0, 8) != 0
		    || memcmp(h + 12, h0 + 12, HOST_OP_HDR - 12) != 0)
			return (false);
	}
	return (true);
}

/* One operation of the staged kinds. */
struct shm_xop {
	const struct cohort__op *op;
	bool pieces; /* the shape of its rounds (above) */
	bool stages; /* this rank writes its slot */
	bool takes; /* this rank reads the others' slots */
	const uint8_t *src; /* what this rank stages: a block, or n blocks */
	size_t src_len; /* whole: bytes of that block; pieces: of each */
	uint8_t *dst;
	/* whole: block p is [off[p], off[p] + len[p]) of dst (NULL: p *
	 * src_len, src_len bytes each; one_place: every block lands at dst,
	 * a broadcast's or a reduce's); pieces: every block is src_len bytes
	 */
	const size_t *off, *len;
	bool one_place;
	int root;
};

/* Bytes of block p in the whole shape. */
static size_t
shm_xlen(const struct shm_xop *x, int p)
{
	return (x->len != NULL ? x->len[p] : x->src_len);
}

static size_t
shm_xoff(const struct shm_xop *x, int p)
{
	if (x->one_place)
		return (0);
	return (x->off != NULL ? x->off[p] : (size_t)p * x->src_len);
}

/* Rank p stages a block of its own in this operation (whole shape). */
static bool
shm_xstager(const struct host_shm *s, const struct host_op *c,
    const struct shm_xop *x, int p)
{
	switch (x->op->kind) {
	case COHORT__OP_BROADCAST:
		return (p == x->root);
	case COHORT__OP_GATHER:
		return (p != x->root);
	default:
		return (true);
	}
}

/* The pieces shape: bytes of each block's piece a round (the n - 1
 * blocks other than the stager's own share its slot of n * blk bytes), and
 * where stager p keeps block q's piece. */
static inline size_t
shm_xpiece(const struct host_shm *s)
{
	return ((size_t)s->size * s->blk / (size_t)(s->size - 1))
	    & ~(size_t)63;
}

static inline size_t
shm_xat(int p, int q, size_t piece)
{
	return ((size_t)(q < p ? q : q - 1) * piece);
}

/* Round k of this rank's staging into slot S. */
static void
shm_xstage(struct host_shm *s, const struct host_op *c,
    const struct shm_xop *x, size_t k, uint8_t *S)
{
	int n = s->size;

	if (x->pieces) {
		size_t P = shm_xpiece(s), off = k * P;
		size_t len = x->src_len - off < P ? x->src_len - off : P;

		for (int q = 0; q < n; q++)
			if (q != s->rank)
				shm_copy(S + shm_xat(s->rank, q, P),
				    x->src + (size_t)q * x->src_len + off,
				    len);
	} else {
		size_t per = (size_t)n * s->blk, off = k * per;

		if (off < x->src_len)
			shm_copy(S, x->src + off,
			    x->src_len - off < per ? x->src_len - off : per);
	}
}

/* Round k (global round g) of this rank's reading of the others' slots. */
static void
shm_xtake(struct host_shm *s, const struct host_op *c, const struct shm_xop *x,
    size_t k, uint32_t g)
{
	const struct cohort__op *op = x->op;
	int n = s->size, r = s->rank;

	if (x->pieces) {
		size_t P = shm_xpiece(s), off = k * P;
		size_t len = x->src_len - off < P ? x->src_len - off : P;
		size_t piece = SHM_PIECE - SHM_PIECE % c->esize;

		if (op->kind == COHORT__OP_SCATTER) {
			shm_copy(x->dst + off,
			    shm_S(s, n, x->root, g) + shm_xat(x->root, r, P),
			    len);
			return;
		}
		if (op->kind == COHORT__OP_ALLTOALL) {
			for (int p = 0; p < n; p++)
				if (p != r)
					shm_copy(x->dst
					        + (size_t)p * x->src_len + off,
					    shm_S(s, n, p, g)
					        + shm_xat(p, r, P),
					    len);
			return;
		}
		/* reduce_scatter: our block, in L1-sized pieces. */
		for (size_t o = 0; o < len; o += piece) {
			size_t l = len - o < piece ? len - o : piece;
			const uint8_t *in
			    = x->src + (size_t)r * x->src_len + off;
			uint8_t *out = x->dst + off;

			if (in != out)
				memmove(out + o, in + o, l);
			for (int p = 0; p < n; p++)
				if (p != r)
					cohort__reduce(out + o,
					    shm_S(s, n, p, g)
					        + shm_xat(p, r, P) + o,
					    l / c->esize, op->dtype, op->op);
			if (op->op == COHORT_MEAN)
				cohort__scale_div(out + o, l / c->esize,
				    op->dtype, (double)n);
		}
		return;
	}
	for (int p = 0; p < n; p++) {
		size_t per = (size_t)n * s->blk, off = k * per;
		size_t blen = shm_xlen(x, p), len;
		uint8_t *out = x->dst + shm_xoff(x, p) + off;

		if (p == r || !shm_xstager(s, c, x, p) || off >= blen)
			continue;
		len = blen - off < per ? blen - off : per;
		shm_copy(out, shm_S(s, n, p, g), len);
	}
}

/* Runs x's rounds: stage, post, wait for every rank's post, read, done. */
static cohort_status
shm_xrun(struct host_shm *s, const struct host_op *c, const struct shm_xop *x,
    char *err, size_t errlen, cohort__time deadline)
{
	size_t unit = x->pieces ? shm_xpiece(s) : (size_t)s->size * s->blk;
	size_t most = 0, rounds;
	uint32_t g0;
	cohort_status rv;

	for (int p = 0; p < s->size; p++)
		if (x->pieces || shm_xstager(s, c, x, p))
			most = shm_xlen(x, p) > most ? shm_xlen(x, p) : most;
	rounds = most == 0 ? 1 : (most + unit - 1) / unit;
	if ((rv = shm_start(s, c, rounds, true, &g0, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	for (size_t k = 0; k < rounds; k++) {
		uint32_t g = g0 + (uint32_t)k;

		if (x->stages) {
			if ((rv = shm_round_begin(
			         s, c, g, err, errlen, deadline))
			    != COHORT_OK)
				break;
			shm_xstage(s, c, x, k, shm_S(s, s->size, s->rank, g));
		}
		shm_signal(s, c, SHM_POSTED, g + 1);
		/* A rank that only stages waits for the others once: every
		 * rank compares the headers after all posted round g0. */
		if ((x->takes || k == 0)
		    && ((rv = shm_wait(
		             s, c, SHM_POSTED, g + 1, err, errlen, deadline))
		            != COHORT_OK
		        || (k == 0
		            && (rv = shm_agree(s, c, err, errlen))
		                != COHORT_OK)))
			break;
		if (x->takes)
			shm_xtake(s, c, x, k, g);
		shm_signal(s, c, SHM_DONE, g + 1);
	}
	if (rv == COHORT_EMISMATCH && x->op->kind == COHORT__OP_BROADCAST
	    && shm_only_root_differs(s)) {
		/* Every rank saw the same headers in round g0, before any
		 * data moved: all skip this broadcast's rounds, and the group
		 * stays usable (as on the TCP path). */
		shm_signal(s, c, SHM_POSTED, g0 + (uint32_t)rounds);
		shm_signal(s, c, SHM_DONE, g0 + (uint32_t)rounds);
		s->agree->broken = COHORT_OK;
	}
	return (rv);
}

cohort_status
host_shm_run(struct host_shm *s, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	struct shm_xop x = { .op = op,
		.src = op->send,
		.dst = op->recv,
		.src_len = bytes,
		.root = op->root,
		.stages = true,
		.takes = true };
	int n = s->size, r = s->rank;
	size_t *off = NULL;
	cohort_status rv;

	switch (op->kind) {
	case COHORT__OP_ALLREDUCE:
	case COHORT__OP_REDUCE:
		return (shm_allreduce(s, c, op, bytes, err, errlen, deadline));
	case COHORT__OP_BROADCAST:
		x.src = op->recv;
		x.stages = r == op->root;
		x.takes = !x.stages;
		x.one_place = true;
		break;
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_ALLGATHERV:
		if ((off = malloc(2 * (size_t)n * sizeof(size_t))) == NULL) {
			snprintf(err, errlen, "out of memory");
			return (COHORT_ENOMEM);
		}
		for (int p = 0; p < n; p++) {
			off[n + p]
			    = (op->counts != NULL ? op->counts[p] : op->count)
			    * c->esize;
			off[p] = p == 0 ? 0 : off[p - 1] + off[n + p - 1];
		}
		x.off = off;
		x.len = off + n;
		x.src_len = x.len[r];
		x.src = x.dst + off[r];
		if (op->send != x.src && x.src_len > 0)
			memmove(x.dst + off[r], op->send, x.src_len);
		break;
	case COHORT__OP_GATHER:
		x.stages = r != op->root;
		x.takes = !x.stages;
		if (x.takes && x.dst + (size_t)r * bytes != x.src)
			memmove(x.dst + (size_t)r * bytes, x.src, bytes);
		break;
	case COHORT__OP_SCATTER:
		x.pieces = true;
		x.stages = r == op->root;
		x.takes = !x.stages;
		if (x.stages && x.src + (size_t)r * bytes != x.dst)
			memmove(x.dst, x.src + (size_t)r * bytes, bytes);
		break;
	case COHORT__OP_ALLTOALL:
		x.pieces = true;
		if (x.src != x.dst)
			memmove(x.dst + (size_t)r * bytes,
			    x.src + (size_t)r * bytes, bytes);
		break;
	case COHORT__OP_REDUCE_SCATTER:
		x.pieces = true;
		break;
	default:
		snprintf(err, errlen, "%s has no shared-memory path",
		    cohort__op_name(op->kind));
		return (COHORT_ENOTSUP);
	}
	rv = shm_xrun(s, c, &x, err, errlen, deadline);
	free(off);
	return (rv);
}

/* ------------------------------------------------------------------------ */
/* Setup                                                                    */
/* ------------------------------------------------------------------------ */

static void
shm_name(const uint8_t rnd[16], char *name, size_t len)
{
	static const char hex[] = "0123456789abcdef";
	size_t o = 0;

	cohort__strlcpy(name, "/cohort-", len);
	o = strlen(name);
	for (int i = 0; i < 16 && o + 2 < len; i++) {
		name[o++] = hex[rnd[i] >> 4];
		name[o++] = hex[rnd[i] & 15];
	}
	name[o] = '\0';
}

static void
shm_unmap(struct host_shm *s)
{
	if (s == NULL)
		return;
	if (s->base != NULL && s->base != MAP_FAILED)
		(void)munmap(s->base, s->len);
	free(s->scratch);
	free(s);
}

void
host_shm_free(struct host_shm *s)
{
	shm_unmap(s);
}

bool
host_shm_cma(const struct host_shm *s)
{
	return (s != NULL && s->cma);
}

/* Publishes this rank's process and a random probe word in its control
 * block (before it answers the offer: every rank's is there once rank 0
 * sends its verdict). */
static void
shm_cma_publish(struct host_shm *s)
{
	struct shm_ctrl *me = &s->ctrl[s->rank];

	if (getrandom(&s->probe, sizeof(s->probe), 0)
	    != (ssize_t)sizeof(s->probe))
		s->probe = (uint64_t)cohort__now_ns() ^ (uint64_t)getpid();
	me->pid = (int32_t)getpid();
	me->probe_addr = (uint64_t)(uintptr_t)&s->probe;
	me->probe_val = s->probe;
}

/* Whether this rank can read every other rank's memory: each one's probe
 * word, at the address it published, has the value it published (a
 * process of the same number in another PID namespace has not). */
static bool
shm_cma_probe(const struct host_shm *s)
{
	for (int p = 0; p < s->size; p++) {
		uint64_t v;

		if (p != s->rank
		    && (shm_cma_peek(s, p, &v) != 0
		        || v != s->ctrl[p].probe_val))
			return (false);
	}
	return (true);
}

/* A segment's state for the group of m (not mapped yet). */
static struct host_shm *
shm_new(
    struct host_mesh *m, struct host_agree *a, const struct host_tune *tune)
{
	struct host_shm *s;

	if ((s = calloc(1, sizeof(*s))) == NULL)
		return (NULL);
	s->mesh = m;
	s->agree = a;
	s->tune = tune;
	s->rank = m->rank;
	s->size = m->size;
	return (s);
}

/* Rank 0: creates and maps the segment and fills the announcement msg:
 * "CSM1" (else "CSM0": none), len (be64), 4 zero bytes, token[16], the
 * name's 32 hex digits; host_shm_setup adds rank 0's size range
 * (shm_min, shm_max, be64), which every rank adopts: all ranks must pick
 * the same path for every allreduce; and the TCP path's agreement shape
 * (byte 80: 1 the fold) and fused group limit (be32 at 84), adopted even
 * where no segment is used. */
static struct host_shm *
shm_create(struct host_shm *s, size_t want_blk, uint8_t *msg, char *name,
    size_t namelen)
{
	struct shm_hdr *h;
	uint8_t rnd[32];
	int fd;

	if (getrandom(rnd, sizeof(rnd), 0) != (ssize_t)sizeof(rnd))
		goto out_free;
	shm_layout(s, s->size, shm_blk(s->size, want_blk));
	if (s->len > SHM_MAX_LEN)
		goto out_free;
	shm_name(rnd, name, namelen);
	fd = shm_open(name, O_RDWR | O_CREAT | O_EXCL | O_CLOEXEC, 0600);
	if (fd < 0) {
		name[0] = '\0';
		goto out_free;
	}
	/* Reserve the pages now (tmpfs: ENOSPC here, not SIGBUS later). */
	if (ftruncate(fd, (off_t)s->len) != 0
	    || posix_fallocate(fd, 0, (off_t)s->len) != 0
	    || (s->base = mmap(
	            NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0))
	        == MAP_FAILED) {
		close(fd);
		(void)shm_unlink(name);
		name[0] = '\0';
		s->base = NULL;
		goto out_free;
	}
	close(fd);
	shm_layout(s, s->size, s->blk);
	h = (struct shm_hdr *)s->base;
	memcpy(h->magic, SHM_MAGIC, sizeof(SHM_MAGIC));
	memcpy(h->token, rnd + 16, 16);
	h->size = (uint32_t)s->size;
	h->blk = (uint32_t)s->blk;
	memcpy(msg, "CSM1", 4);
	host_put_be(msg + 4, s->len, 8);
	memcpy(msg + 16, rnd + 16, 16);
	memcpy(msg + 32, name + 8, 32);
	return (s);

out_free:
	shm_unmap(s);
	return (NULL);
}

/* A peer: opens and checks the announced segment. */
static struct host_shm *
shm_attach(struct host_shm *s, const uint8_t *msg)
{
	const struct shm_hdr *h;
	char name[48];
	struct stat st;
	uint64_t len = host_get_be(msg + 4, 8);
	int fd;

	if (memcmp(msg, "CSM1", 4) != 0)
		goto out_free;
	cohort__strlcpy(name, "/cohort-", sizeof(name));
	memcpy(name + 8, msg + 32, 32);
	name[40] = '\0';
	for (int i = 8; i < 40; i++)
		if (!((name[i] >= '0' && name[i] <= '9')
		        || (name[i] >= 'a' && name[i] <= 'f')))
			goto out_free;
	fd = shm_open(name, O_RDWR | O_CLOEXEC, 0600);
	if (fd < 0)
		goto out_free;
	if (fstat(fd, &st) != 0 || (uint64_t)st.st_size != len
	    || len < SHM_HDR) {
		close(fd);
		goto out_free;
	}
	s->len = (size_t)len;
	s->base
	    = mmap(NULL, s->len, PROT_READ | PROT_WRITE, MAP_SHARED, fd, 0);
	close(fd);
	if (s->base == MAP_FAILED) {
		s->base = NULL;
		goto out_free;
	}
	h = (const struct shm_hdr *)s->base;
	if (memcmp(h->magic, SHM_MAGIC, sizeof(SHM_MAGIC)) != 0
	    || memcmp(h->token, msg + 16, 16) != 0
	    || h->size != (uint32_t)s->size || h->blk < 4096)
		goto out_free;
	shm_layout(s, s->size, h->blk);
	if (s->len != (size_t)len) {
		s->len = (size_t)len;
		goto out_free;
	}
	return (s);

out_free:
	shm_unmap(s);
	return (NULL);
}

/* Moves exactly len bytes of the setup exchange with peer p. */
static cohort_status
shm_io(struct host_mesh *m, int p, void *buf, size_t len, bool sending,
    char *err, size_t errlen, cohort__time deadline)
{
	size_t done = 0;

	return (host_io(m->abort_flag, m->links[p].fd, buf, len, &done,
	    sending, "shared-memory setup", m->links[p].job_rank, err, errlen,
	    deadline));
}

/* The cross-memory vote (rank 0's cma_min > 0 on every rank): 'C' from
 * a rank whose own setting allows it and that read every other rank's
 * probe, else 'N'; rank 0 sends the verdict, s->cma. */
static cohort_status
shm_cma_vote(struct host_shm *s, struct host_mesh *m,
    const struct host_tune *tune, char *err, size_t errlen,
    cohort__time deadline)
{
	uint8_t vote = tune->shm_cma_min > 0 && shm_cma_probe(s)
	        && (s->scratch = malloc(SHM_CMA_PIECE)) != NULL
	    ? 'C'
	    : 'N';
	cohort_status rv = COHORT_OK;

	if (m->rank == 0) {
		for (int p = 1; p < m->size && rv == COHORT_OK; p++) {
			uint8_t v = 'N';

			rv = shm_io(m, p, &v, 1, false, err, errlen, deadline);
			if (v != 'C')
				vote = 'N';
		}
		for (int p = 1; p < m->size && rv == COHORT_OK; p++)
			rv = shm_io(
			    m, p, &vote, 1, true, err, errlen, deadline);
	} else {
		rv = shm_io(m, 0, &vote, 1, true, err, errlen, deadline);
		if (rv == COHORT_OK)
			rv = shm_io(
			    m, 0, &vote, 1, false, err, errlen, deadline);
	}
	s->cma = rv == COHORT_OK && vote == 'C';
	if (!s->cma) {
		free(s->scratch);
		s->scratch = NULL;
	}
	return (rv);
}

cohort_status
host_shm_setup(struct host_mesh *m, struct host_agree *a,
    struct host_tune *tune, bool enable, size_t want_blk,
    struct host_shm **out, char *err, size_t errlen, cohort__time deadline)
{
	uint8_t msg[SHM_MSG_LEN];
	struct host_shm *s = NULL;
	uint8_t yes = 'Y';
	cohort_status rv = COHORT_OK;

	*out = NULL;
	if (m->size < 2)
		return (COHORT_OK);
	memset(msg, 0, sizeof(msg));
	if (m->rank == 0) {
		char name[48] = "";

		if (enable && (s = shm_new(m, a, tune)) != NULL)
			s = shm_create(s, want_blk, msg, name, sizeof(name));
		if (s == NULL)
			memcpy(msg, "CSM0", 4);
		else
			shm_cma_publish(s);
		host_put_be(msg + 64, tune->shm_min, 8);
		host_put_be(msg + 72, tune->shm_max, 8);
		msg[80] = tune->agree_fold != 0 ? 1 : 0;
		host_put_be(msg + 84, (uint64_t)tune->fused_ranks, 4);
		host_put_be(msg + 88, tune->shm_cma_min, 8);
		for (int p = 1; p < m->size && rv == COHORT_OK; p++)
			rv = shm_io(m, p, msg, sizeof(msg), true, err, errlen,
			    deadline);
		for (int p = 1; p < m->size && rv == COHORT_OK; p++) {
			uint8_t ans = 'N';

			rv = shm_io(
			    m, p, &ans, 1, false, err, errlen, deadline);
			if (ans != 'Y')
				yes = 'N';
		}
		if (name[0] != '\0')
			(void)shm_unlink(name);
		if (s == NULL)
			yes = 'N';
		for (int p = 1; p < m->size && rv == COHORT_OK; p++)
			rv = shm_io(
			    m, p, &yes, 1, true, err, errlen, deadline);
	} else {
		uint8_t ans;

		rv = shm_io(
		    m, 0, msg, sizeof(msg), false, err, errlen, deadline);
		if (rv == COHORT_OK && enable
		    && (s = shm_new(m, a, tune)) != NULL)
			s = shm_attach(s, msg);
		if (s != NULL)
			shm_cma_publish(s);
		ans = s != NULL ? 'Y' : 'N';
		if (rv == COHORT_OK)
			rv = shm_io(
			    m, 0, &ans, 1, true, err, errlen, deadline);
		if (rv == COHORT_OK)
			rv = shm_io(
			    m, 0, &yes, 1, false, err, errlen, deadline);
	}
	if (rv == COHORT_OK && m->rank != 0) {
		/* The TCP path's choices are rank 0's too (host.c). */
		tune->agree_fold = msg[80] != 0 ? 1 : 0;
		tune->fused_ranks = (int)host_get_be(msg + 84, 4);
	}
	if (rv != COHORT_OK || yes != 'Y') {
		shm_unmap(s);
		return (rv);
	}
	tune->shm_min = (size_t)host_get_be(msg + 64, 8);
	tune->shm_max = (size_t)host_get_be(msg + 72, 8);
	/* Cross-memory attach, when rank 0 offers it: every rank probes
	 * every other and votes; rank 0 sends the verdict. */
	s->cma_min = (size_t)host_get_be(msg + 88, 8);
	if (s->cma_min > 0
	    && (rv = shm_cma_vote(s, m, tune, err, errlen, deadline))
	        != COHORT_OK) {
		shm_unmap(s);
		return (rv);
	}
	*out = s;
	return (COHORT_OK);
}
