/*
 * algos.c - the collectives of the tcp backend, as plans for the two
 * engines of xfer.c.
 *
 *  allreduce       <= small_max bytes: recursive doubling (non-powers of
 *                  two fold the extra ranks in first and out last);
 *                  larger: ring reduce-scatter + all-gather as one
 *                  pipelined stream of 2(n-1) steps (2 ranks: optionally
 *                  a pipelined pairwise exchange, see pair_min/max).
 *  reduce          small: binomial tree; large: pipelined chain to root.
 *  broadcast       small: root sends to all; large: pipelined chain.
 *  allgather(v)    small total: direct exchange; large: pipelined ring.
 *  reduce_scatter  small total: direct exchange; large: pipelined ring
 *                  with partial sums in the acc ring.
 *  alltoall, gather, scatter: direct exchange, everything in flight.
 *  barrier         the agreement's all-to-all header exchange alone.
 *
 * All reductions combine values with a commutative operator in an order
 * that gives every rank bit-identical results.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "tcp_impl.h"

static inline int
algo_mod(int a, int n)
{
	return (((a % n) + n) % n);
}

static inline bool
algo_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
	const uint8_t *pa = a, *pb = b;

	if (alen == 0 || blen == 0)
		return (false);
	return (pa < pb + blen && pb < pa + alen);
}

/* Segment i of n over count elements: the first count % n get one more. */
static void
algo_segment(
    size_t count, int n, int i, size_t esize, size_t *off, size_t *len)
{
	size_t base = count / (size_t)n;
	size_t rem = count % (size_t)n;
	size_t ui = (size_t)i;

	*off = (ui * base + (ui < rem ? ui : rem)) * esize;
	*len = (base + (ui < rem ? 1 : 0)) * esize;
}

static cohort_status
algo_pair(struct cohort__tcp *t, int peer, const void *sbuf, size_t slen,
    void *rbuf, size_t rlen, char *err, size_t errlen, cohort__time deadline)
{
	cohort__tcp_plan_reset(t);
	t->peers[peer].sbuf = sbuf;
	t->peers[peer].slen = slen;
	t->peers[peer].rbuf = rbuf;
	t->peers[peer].rlen = rlen;
	return (cohort__tcp_exchange(t, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* allreduce                                                                */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_allreduce_rd(struct cohort__tcp *t, const struct cohort__op *op,
    size_t bytes, char *err, size_t errlen, cohort__time deadline)
{
	uint8_t *dst = op->recv;
	int n = t->size, r = t->rank;
	int p2 = 1, extra, vr;
	cohort_status rv;

	while (p2 * 2 <= n)
		p2 *= 2;
	extra = n - p2;
	if ((rv = cohort__tcp_grow_small(t, bytes, err, errlen)) != COHORT_OK)
		return (rv);
	if (op->send != op->recv)
		memcpy(dst, op->send, bytes);

	if (r < 2 * extra) {
		if ((r & 1) == 0) {
			/* Folded out: give our data, get the result. */
			if ((rv = algo_pair(t, r + 1, dst, bytes, NULL, 0, err,
			         errlen, deadline))
			    != COHORT_OK)
				return (rv);
			return (algo_pair(t, r + 1, NULL, 0, dst, bytes, err,
			    errlen, deadline));
		}
		if ((rv = algo_pair(t, r - 1, NULL, 0, t->small, bytes, err,
		         errlen, deadline))
		    != COHORT_OK)
			return (rv);
		cohort__reduce(dst, t->small, op->count, op->dtype, op->op);
		vr = r / 2;
	} else {
		vr = r - extra;
	}
	for (int mask = 1; mask < p2; mask <<= 1) {
		int vp = vr ^ mask;
		int peer = vp < extra ? vp * 2 + 1 : vp + extra;

		if ((rv = algo_pair(t, peer, dst, bytes, t->small, bytes, err,
		         errlen, deadline))
		    != COHORT_OK)
			return (rv);
		cohort__reduce(dst, t->small, op->count, op->dtype, op->op);
	}
	if (op->op == COHORT_MEAN)
		cohort__scale_div(dst, op->count, op->dtype, (double)n);
	if (r < 2 * extra)
		return (algo_pair(
		    t, r - 1, dst, bytes, NULL, 0, err, errlen, deadline));
	return (COHORT_OK);
}

/* Two ranks: both send everything at once and reduce what arrives, both
 * directions in flight. Same bytes on the wire as the ring, but nothing
 * waits for a reduction before it can be sent. */
static cohort_status
algo_allreduce_pair(struct cohort__tcp *t, const struct cohort__op *op,
    size_t bytes, char *err, size_t errlen, cohort__time deadline)
{
	struct cohort__tcp_step *st = t->steps;
	int peer = 1 - t->rank;

	memset(st, 0, sizeof(*st));
	st->sbuf = op->send;
	st->slen = bytes;
	st->gate = -1;
	st->rbuf = op->recv;
	st->rlen = bytes;
	st->divide = op->op == COHORT_MEAN;
	if (op->send == op->recv) {
		st->rmode = COHORT__TCP_RECV_SCRATCH;
		st->pgate = true;
	} else {
		st->rmode = COHORT__TCP_RECV_DIRECT;
		st->other = op->send;
	}
	return (
	    cohort__tcp_stream(t, peer, peer, st, 1, err, errlen, deadline));
}

static cohort_status
algo_allreduce_ring(struct cohort__tcp *t, const struct cohort__op *op,
    char *err, size_t errlen, cohort__time deadline)
{
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	int n = t->size, r = t->rank;
	bool inplace = op->send == op->recv;
	struct cohort__tcp_step *st = t->steps;
	int k = 0;

	for (int s = 0; s < n - 1; s++, k++) {
		size_t soff, slen, roff, rlen;

		algo_segment(
		    op->count, n, algo_mod(r - s, n), t->esize, &soff, &slen);
		algo_segment(op->count, n, algo_mod(r - s - 1, n), t->esize,
		    &roff, &rlen);
		memset(&st[k], 0, sizeof(st[k]));
		st[k].sbuf = (s == 0 ? src : dst) + soff;
		st[k].slen = slen;
		st[k].gate = s == 0 ? -1 : k - 1;
		st[k].rbuf = dst + roff;
		st[k].rlen = rlen;
		if (inplace) {
			st[k].rmode = COHORT__TCP_RECV_SCRATCH;
		} else {
			st[k].rmode = COHORT__TCP_RECV_DIRECT;
			st[k].other = src + roff;
		}
		st[k].divide = op->op == COHORT_MEAN && s == n - 2;
	}
	for (int s = 0; s < n - 1; s++, k++) {
		size_t soff, slen, roff, rlen;

		algo_segment(op->count, n, algo_mod(r + 1 - s, n), t->esize,
		    &soff, &slen);
		algo_segment(
		    op->count, n, algo_mod(r - s, n), t->esize, &roff, &rlen);
		memset(&st[k], 0, sizeof(st[k]));
		st[k].sbuf = dst + soff;
		st[k].slen = slen;
		st[k].gate = k - 1;
		st[k].rmode = COHORT__TCP_RECV_COPY;
		st[k].rbuf = dst + roff;
		st[k].rlen = rlen;
	}
	return (cohort__tcp_stream(t, algo_mod(r + 1, n), algo_mod(r - 1, n),
	    st, k, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* reduce                                                                   */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_reduce_tree(struct cohort__tcp *t, const struct cohort__op *op,
    size_t bytes, char *err, size_t errlen, cohort__time deadline)
{
	int n = t->size;
	int v = algo_mod(t->rank - op->root, n);
	uint8_t *acc, *tmp;
	cohort_status rv;

	if ((rv = cohort__tcp_grow_small(t, 2 * bytes, err, errlen))
	    != COHORT_OK)
		return (rv);
	acc = v == 0 ? (uint8_t *)op->recv : t->small;
	tmp = t->small + bytes;
	if (acc != op->send)
		memcpy(acc, op->send, bytes);
	for (int mask = 1; mask < n; mask <<= 1) {
		if (v & mask) {
			int to = algo_mod(v - mask + op->root, n);

			return (algo_pair(t, to, acc, bytes, NULL, 0, err,
			    errlen, deadline));
		}
		if (v + mask < n) {
			int from = algo_mod(v + mask + op->root, n);

			if ((rv = algo_pair(t, from, NULL, 0, tmp, bytes, err,
			         errlen, deadline))
			    != COHORT_OK)
				return (rv);
			cohort__reduce(acc, tmp, op->count, op->dtype, op->op);
		}
	}
	if (op->op == COHORT_MEAN)
		cohort__scale_div(acc, op->count, op->dtype, (double)n);
	return (COHORT_OK);
}

static cohort_status
algo_reduce_chain(struct cohort__tcp *t, const struct cohort__op *op,
    size_t bytes, char *err, size_t errlen, cohort__time deadline)
{
	int n = t->size;
	int v = algo_mod(t->rank - op->root, n);
	int to = v == 0 ? -1 : algo_mod(t->rank - 1, n);
	int from = v == n - 1 ? -1 : algo_mod(t->rank + 1, n);
	struct cohort__tcp_step *st = t->steps;
	cohort_status rv;

	if ((rv = cohort__tcp_need_acc(t, err, errlen)) != COHORT_OK)
		return (rv);

	memset(st, 0, sizeof(*st));
	st->gate = -1;
	if (v == n - 1) {
		st->sbuf = op->send;
		st->slen = bytes;
	} else if (v > 0) {
		st->sbuf = NULL;
		st->slen = bytes;
		st->gate = 0;
		st->rmode = COHORT__TCP_RECV_ACC;
		st->other = op->send;
		st->rlen = bytes;
	} else {
		st->rbuf = op->recv;
		st->rlen = bytes;
		st->divide = op->op == COHORT_MEAN;
		if (op->recv == op->send) {
			st->rmode = COHORT__TCP_RECV_SCRATCH;
		} else {
			st->rmode = COHORT__TCP_RECV_DIRECT;
			st->other = op->send;
		}
	}
	return (cohort__tcp_stream(t, to, from, st, 1, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* broadcast                                                                */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_broadcast(struct cohort__tcp *t, const struct cohort__op *op,
    size_t bytes, char *err, size_t errlen, cohort__time deadline)
{
	int n = t->size;
	int v = algo_mod(t->rank - op->root, n);
	struct cohort__tcp_step *st = t->steps;

	if (bytes <= t->bcast_small || n == 2) {
		cohort__tcp_plan_reset(t);
		if (v == 0) {
			for (int p = 0; p < n; p++) {
				if (p == t->rank)
					continue;
				t->peers[p].sbuf = op->recv;
				t->peers[p].slen = bytes;
			}
		} else {
			t->peers[op->root].rbuf = op->recv;
			t->peers[op->root].rlen = bytes;
		}
		return (cohort__tcp_exchange(t, err, errlen, deadline));
	}
	memset(st, 0, sizeof(*st));
	st->gate = v == 0 ? -1 : 0;
	st->sbuf = op->recv;
	st->slen = v == n - 1 ? 0 : bytes;
	st->rmode = COHORT__TCP_RECV_COPY;
	st->rbuf = op->recv;
	st->rlen = v == 0 ? 0 : bytes;
	return (
	    cohort__tcp_stream(t, v == n - 1 ? -1 : algo_mod(t->rank + 1, n),
	        v == 0 ? -1 : algo_mod(t->rank - 1, n), st, 1, err, errlen,
	        deadline));
}

/* ------------------------------------------------------------------------ */
/* allgather, allgatherv                                                    */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_allgather(struct cohort__tcp *t, const struct cohort__op *op,
    const size_t *boff, const size_t *blen, size_t total, char *err,
    size_t errlen, cohort__time deadline)
{
	int n = t->size, r = t->rank;
	uint8_t *dst = op->recv;
	struct cohort__tcp_step *st = t->steps;

	if (dst + boff[r] != op->send)
		memmove(dst + boff[r], op->send, blen[r]);
	if (total <= t->small_max) {
		cohort__tcp_plan_reset(t);
		for (int p = 0; p < n; p++) {
			if (p == r)
				continue;
			t->peers[p].sbuf = dst + boff[r];
			t->peers[p].slen = blen[r];
			t->peers[p].rbuf = dst + boff[p];
			t->peers[p].rlen = blen[p];
		}
		return (cohort__tcp_exchange(t, err, errlen, deadline));
	}
	for (int s = 0; s < n - 1; s++) {
		int sb = algo_mod(r - s, n), rb = algo_mod(r - s - 1, n);

		memset(&st[s], 0, sizeof(st[s]));
		st[s].sbuf = dst + boff[sb];
		st[s].slen = blen[sb];
		st[s].gate = s == 0 ? -1 : s - 1;
		st[s].rmode = COHORT__TCP_RECV_COPY;
		st[s].rbuf = dst + boff[rb];
		st[s].rlen = blen[rb];
	}
	return (cohort__tcp_stream(t, algo_mod(r + 1, n), algo_mod(r - 1, n),
	    st, n - 1, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* reduce_scatter                                                           */
/* ------------------------------------------------------------------------ */

/* Block p of src to rank p and rank p's block into block p of dst, for
 * every other rank at once (the personalised all-to-all exchange). */
static cohort_status
algo_blocks(struct cohort__tcp *t, const uint8_t *src, uint8_t *dst,
    size_t blk, char *err, size_t errlen, cohort__time deadline)
{
	cohort__tcp_plan_reset(t);
	for (int p = 0; p < t->size; p++) {
		if (p == t->rank)
			continue;
		t->peers[p].sbuf = src + (size_t)p * blk;
		t->peers[p].slen = blk;
		t->peers[p].rbuf = dst + (size_t)p * blk;
		t->peers[p].rlen = blk;
	}
	return (cohort__tcp_exchange(t, err, errlen, deadline));
}

static cohort_status
algo_reduce_scatter(struct cohort__tcp *t, const struct cohort__op *op,
    size_t blk, char *err, size_t errlen, cohort__time deadline)
{
	int n = t->size, r = t->rank;
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	struct cohort__tcp_step *st = t->steps;
	uint8_t *copy = NULL;
	cohort_status rv;

	if ((size_t)n * blk <= t->small_max) {
		if ((rv = cohort__tcp_grow_small(
		         t, (size_t)n * blk, err, errlen))
		    != COHORT_OK)
			return (rv);
		if ((rv = algo_blocks(
		         t, src, t->small, blk, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		/* Every send is done: dst may now overlap src freely. */
		memmove(dst, src + (size_t)r * blk, blk);
		for (int p = 0; p < n; p++)
			if (p != r)
				cohort__reduce(dst, t->small + (size_t)p * blk,
				    op->count, op->dtype, op->op);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    dst, op->count, op->dtype, (double)n);
		return (COHORT_OK);
	}

	if ((rv = cohort__tcp_need_acc(t, err, errlen)) != COHORT_OK)
		return (rv);
	if (algo_overlap(dst, blk, src, (size_t)n * blk)
	    && dst != src + (size_t)r * blk) {
		/* Odd aliasing: work from a private copy of send. */
		if ((copy = malloc((size_t)n * blk)) == NULL) {
			snprintf(err, errlen, "out of memory");
			return (COHORT_ENOMEM);
		}
		memcpy(copy, src, (size_t)n * blk);
		src = copy;
	}
	for (int s = 0; s < n - 1; s++) {
		int sb = algo_mod(r - s - 1, n), rb = algo_mod(r - s - 2, n);

		memset(&st[s], 0, sizeof(st[s]));
		st[s].slen = blk;
		if (s == 0) {
			st[s].sbuf = src + (size_t)sb * blk;
			st[s].gate = -1;
		} else {
			st[s].sbuf = NULL;
			st[s].gate = s - 1;
		}
		st[s].rlen = blk;
		if (s < n - 2) {
			st[s].rmode = COHORT__TCP_RECV_ACC;
			st[s].other = src + (size_t)rb * blk;
		} else {
			st[s].rbuf = dst;
			st[s].divide = op->op == COHORT_MEAN;
			if (dst == src + (size_t)r * blk) {
				st[s].rmode = COHORT__TCP_RECV_SCRATCH;
			} else {
				st[s].rmode = COHORT__TCP_RECV_DIRECT;
				st[s].other = src + (size_t)r * blk;
			}
		}
	}
	rv = cohort__tcp_stream(t, algo_mod(r + 1, n), algo_mod(r - 1, n), st,
	    n - 1, err, errlen, deadline);
	free(copy);
	return (rv);
}

/* ------------------------------------------------------------------------ */
/* alltoall, gather, scatter, barrier                                       */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_alltoall(struct cohort__tcp *t, const struct cohort__op *op, size_t blk,
    char *err, size_t errlen, cohort__time deadline)
{
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	int n = t->size, r = t->rank;

	if (algo_overlap(src, (size_t)n * blk, dst, (size_t)n * blk)) {
		snprintf(err, errlen, "alltoall cannot run in place");
		return (COHORT_EINVAL);
	}
	memcpy(dst + (size_t)r * blk, src + (size_t)r * blk, blk);
	return (algo_blocks(t, src, dst, blk, err, errlen, deadline));
}

/* Block p of the root's buf to (scatter) or from (gather) rank p's own
 * buffer mine, one message each, all at once. */
static cohort_status
algo_root_blocks(struct cohort__tcp *t, int root, bool gather,
    const void *mine, const uint8_t *buf, size_t blk, char *err, size_t errlen,
    cohort__time deadline)
{
	cohort__tcp_plan_reset(t);
	for (int p = 0; p < t->size; p++) {
		struct cohort__tcp_peer *P = &t->peers[p];
		int peer = t->rank == root ? p : root;

		if (p == t->rank || (t->rank != root && p != root))
			continue;
		if (gather == (t->rank != root)) {
			P->sbuf = t->rank == root ? buf + (size_t)peer * blk
			                          : mine;
			P->slen = blk;
		} else {
			P->rbuf = t->rank == root
			    ? (uint8_t *)buf + (size_t)peer * blk
			    : (uint8_t *)mine;
			P->rlen = blk;
		}
	}
	return (cohort__tcp_exchange(t, err, errlen, deadline));
}

static cohort_status
algo_gather(struct cohort__tcp *t, const struct cohort__op *op, size_t blk,
    char *err, size_t errlen, cohort__time deadline)
{
	if (t->rank == op->root
	    && (uint8_t *)op->recv + (size_t)t->rank * blk != op->send)
		memmove((uint8_t *)op->recv + (size_t)t->rank * blk, op->send,
		    blk);
	return (algo_root_blocks(t, op->root, true, op->send, op->recv, blk,
	    err, errlen, deadline));
}

static cohort_status
algo_scatter(struct cohort__tcp *t, const struct cohort__op *op, size_t blk,
    char *err, size_t errlen, cohort__time deadline)
{
	cohort_status rv;

	if ((rv = algo_root_blocks(t, op->root, false, op->recv, op->send, blk,
	         err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	/* After the sends: recv may overlap send. */
	if (t->rank == op->root
	    && op->recv != (const uint8_t *)op->send + (size_t)t->rank * blk)
		memmove(op->recv,
		    (const uint8_t *)op->send + (size_t)t->rank * blk, blk);
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Agreement                                                                */
/* ------------------------------------------------------------------------ */

/*
 * The header (big-endian): "COP1", kind, dtype, op, path (0 tcp, 1 shared
 * memory), root, a hash of ALLGATHERV's counts, count, operation number.
 * Fields an operation does not use are zero, so only what matters is
 * compared.
 */
static bool
algo_rooted(enum cohort__op_kind k)
{
	return (k == COHORT__OP_REDUCE || k == COHORT__OP_BROADCAST
	    || k == COHORT__OP_GATHER || k == COHORT__OP_SCATTER);
}

static bool
algo_reducing(enum cohort__op_kind k)
{
	return (k == COHORT__OP_ALLREDUCE || k == COHORT__OP_REDUCE
	    || k == COHORT__OP_REDUCE_SCATTER);
}

void
cohort__tcp_op_hdr(
    struct cohort__tcp *t, const struct cohort__op *op, bool shm)
{
	uint8_t *h = t->hdrs + (size_t)t->rank * COHORT__TCP_OP_HDR;
	bool data = op->kind != COHORT__OP_BARRIER;
	uint32_t chash = 0;

	if (op->kind == COHORT__OP_ALLGATHERV && op->counts != NULL) {
		uint64_t x = 1469598103934665603ull; /* FNV-1a */

		for (int p = 0; p < t->size; p++) {
			x ^= op->counts[p];
			x *= 1099511628211ull;
		}
		chash = (uint32_t)(x ^ (x >> 32));
	}
	memcpy(h, "COP1", 4);
	h[4] = (uint8_t)op->kind;
	h[5] = data ? (uint8_t)op->dtype : 0;
	h[6] = algo_reducing(op->kind) ? (uint8_t)op->op : 0;
	h[7] = shm ? 1 : 0;
	cohort__tcp_put_be(
	    h + 8, algo_rooted(op->kind) ? (uint32_t)op->root : 0, 4);
	cohort__tcp_put_be(h + 12, chash, 4);
	cohort__tcp_put_be(h + 16,
	    data && op->kind != COHORT__OP_ALLGATHERV ? op->count : 0, 8);
	cohort__tcp_put_be(h + 24, op->seq, 8);
}

static const char *
hdr_kind(uint8_t k)
{
	return (k >= COHORT__OP_ALLREDUCE && k <= COHORT__OP_BARRIER
	        ? cohort__op_name((enum cohort__op_kind)k)
	        : "?");
}

/* Says how header b (of job rank rb) differs from a (job rank ra). */
static void
hdr_describe(const uint8_t *a, int32_t ra, const uint8_t *b, int32_t rb,
    char *err, size_t errlen)
{
	if (memcmp(b, "COP1", 4) != 0)
		snprintf(err, errlen,
		    "ranks are out of step: rank %d sent something other than "
		    "an operation header (an earlier operation that "
		    "disagreed?)",
		    (int)rb);
	else if (a[4] != b[4] || a[24] != b[24]
	    || cohort__tcp_get_be(a + 24, 8) != cohort__tcp_get_be(b + 24, 8))
		snprintf(err, errlen,
		    "ranks disagree on the operation: rank %d %s #%" PRIu64
		    ", rank %d %s #%" PRIu64,
		    (int)ra, hdr_kind(a[4]), cohort__tcp_get_be(a + 24, 8),
		    (int)rb, hdr_kind(b[4]), cohort__tcp_get_be(b + 24, 8));
	else if (a[5] != b[5])
		snprintf(err, errlen,
		    "ranks disagree: rank %d dtype %s, rank %d dtype %s",
		    (int)ra, cohort_dtype_name((cohort_dtype)a[5]), (int)rb,
		    cohort_dtype_name((cohort_dtype)b[5]));
	else if (cohort__tcp_get_be(a + 16, 8)
	    != cohort__tcp_get_be(b + 16, 8))
		snprintf(err, errlen,
		    "ranks disagree: rank %d count %" PRIu64
		    ", rank %d count %" PRIu64,
		    (int)ra, cohort__tcp_get_be(a + 16, 8), (int)rb,
		    cohort__tcp_get_be(b + 16, 8));
	else if (a[6] != b[6])
		snprintf(err, errlen,
		    "ranks disagree: rank %d op %s, rank %d op %s", (int)ra,
		    cohort_redop_name((cohort_redop)a[6]), (int)rb,
		    cohort_redop_name((cohort_redop)b[6]));
	else if (cohort__tcp_get_be(a + 8, 4) != cohort__tcp_get_be(b + 8, 4))
		snprintf(err, errlen,
		    "ranks disagree: rank %d root %u, rank %d root %u",
		    (int)ra, (unsigned)cohort__tcp_get_be(a + 8, 4), (int)rb,
		    (unsigned)cohort__tcp_get_be(b + 8, 4));
	else if (cohort__tcp_get_be(a + 12, 4)
	    != cohort__tcp_get_be(b + 12, 4))
		snprintf(err, errlen,
		    "ranks disagree on the per-rank counts (rank %d and "
		    "rank %d)",
		    (int)ra, (int)rb);
	else
		snprintf(err, errlen,
		    "ranks disagree on the path: rank %d %s, rank %d %s "
		    "(shared-memory size limits differ?)",
		    (int)ra, a[7] ? "shared memory" : "tcp", (int)rb,
		    b[7] ? "shared memory" : "tcp");
}

cohort_status
cohort__tcp_op_agree(struct cohort__tcp *t, char *err, size_t errlen)
{
	const uint8_t *h0 = t->hdrs;
	bool shm = false;
	int bad = -1;

	for (int p = 0; p < t->size; p++) {
		const uint8_t *h = t->hdrs + (size_t)p * COHORT__TCP_OP_HDR;

		if (h[7] != 0)
			shm = true;
		if (bad < 0 && memcmp(h, h0, COHORT__TCP_OP_HDR) != 0)
			bad = p;
	}
	if (bad < 0)
		return (COHORT_OK);
	hdr_describe(h0, t->peers[0].job_rank,
	    t->hdrs + (size_t)bad * COHORT__TCP_OP_HDR, t->peers[bad].job_rank,
	    err, errlen);
	if (shm
	    || memcmp(t->hdrs + (size_t)bad * COHORT__TCP_OP_HDR, "COP1", 4)
	        != 0) {
		/* The shared-memory rounds (or the streams) are out of step
		 * now: so is every later operation. */
		t->broken = COHORT_EMISMATCH;
		snprintf(t->broken_err, sizeof(t->broken_err),
		    "%s (in %s #%" PRIu64 "; the group cannot be used any "
		    "more)",
		    err, t->opname, t->seq);
	}
	return (COHORT_EMISMATCH);
}

/* The TCP path's agreement: every rank sends its header to every other
 * and checks all of them. */
static cohort_status
algo_agree(struct cohort__tcp *t, const struct cohort__op *op, char *err,
    size_t errlen, cohort__time deadline)
{
	cohort_status rv;

	cohort__tcp_op_hdr(t, op, false);
	if ((rv = cohort__tcp_exchange_all(
	         t, t->hdrs, COHORT__TCP_OP_HDR, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	return (cohort__tcp_op_agree(t, err, errlen));
}

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                 */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_local(struct cohort__tcp *t, const struct cohort__op *op, size_t bytes)
{
	switch (op->kind) {
	case COHORT__OP_ALLREDUCE:
	case COHORT__OP_REDUCE:
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_REDUCE_SCATTER:
	case COHORT__OP_ALLTOALL:
	case COHORT__OP_GATHER:
	case COHORT__OP_SCATTER:
		if (op->recv != NULL && op->recv != op->send && bytes > 0)
			memmove(op->recv, op->send, bytes);
		break;
	case COHORT__OP_ALLGATHERV:
		bytes = op->counts[0] * t->esize;
		if (op->recv != op->send && bytes > 0)
			memmove(op->recv, op->send, bytes);
		break;
	default:
		break;
	}
	return (COHORT_OK);
}

/* Names the algorithm chosen in the op's stats (backend.h). */
static inline void
tcp_algo(struct cohort__tcp *t, const char *name)
{
	if (t->stats != NULL)
		t->stats->algo = name;
}

cohort_status
cohort__tcp_run_op(struct cohort__tcp *t, const struct cohort__op *op,
    char *err, size_t errlen, cohort__time deadline)
{
	size_t esize = cohort_dtype_size(op->dtype);
	size_t bytes;
	cohort_status rv;

	if (t->broken != COHORT_OK) {
		snprintf(err, errlen, "%s", t->broken_err);
		return (t->broken);
	}
	if (op->kind == COHORT__OP_BARRIER) {
		/* The agreement is an all-to-all exchange: a barrier. */
		if (t->size == 1)
			return (COHORT_OK);
		return (tcp_algo(t, "agree"),
		    algo_agree(t, op, err, errlen, deadline));
	}
	if (esize == 0) {
		snprintf(err, errlen, "bad dtype %d", (int)op->dtype);
		return (COHORT_EINVAL);
	}
	t->esize = esize;
	t->dtype = op->dtype;
	t->redop = op->op;
	bytes = op->count * esize;
	if (t->size == 1)
		return (algo_local(t, op, bytes));

	/* Same host: the header travels in the segment's control block. */
	if (cohort__tcp_shm_usable(t, op, bytes)) {
		cohort__tcp_op_hdr(t, op, true);
		tcp_algo(t, "shm");
		return (
		    cohort__tcp_shm_run(t, op, bytes, err, errlen, deadline));
	}
	if (!t->agreed
	    && (rv = algo_agree(t, op, err, errlen, deadline)) != COHORT_OK)
		return (rv);
	switch (op->kind) {
	case COHORT__OP_ALLREDUCE:
		if (bytes == 0)
			return (COHORT_OK);
		/* Several ranks on each of several hosts: shared memory within
		 * a host, TCP between hosts (hier.c). */
		if (cohort__tcp_hier_usable(t, op, bytes))
			return (tcp_algo(t, "hier"),
			    cohort__tcp_hier_allreduce(
			        t, op, err, errlen, deadline));
		if (bytes <= t->small_max || op->count < (size_t)t->size)
			return (tcp_algo(t, "recursive_doubling"),
			    algo_allreduce_rd(
			        t, op, bytes, err, errlen, deadline));
		if (t->size == 2 && t->pair_min <= bytes
		    && bytes <= t->pair_max)
			return (tcp_algo(t, "pair"),
			    algo_allreduce_pair(
			        t, op, bytes, err, errlen, deadline));
		return (tcp_algo(t, "ring"),
		    algo_allreduce_ring(t, op, err, errlen, deadline));
	case COHORT__OP_REDUCE:
		if (bytes == 0)
			return (COHORT_OK);
		if (bytes <= t->small_max)
			return (tcp_algo(t, "tree"),
			    algo_reduce_tree(
			        t, op, bytes, err, errlen, deadline));
		return (tcp_algo(t, "chain"),
		    algo_reduce_chain(t, op, bytes, err, errlen, deadline));
	case COHORT__OP_BROADCAST:
		if (bytes == 0)
			return (COHORT_OK);
		return (
		    tcp_algo(t,
		        bytes <= t->bcast_small || t->size == 2 ? "direct"
		                                                : "pipeline"),
		    algo_broadcast(t, op, bytes, err, errlen, deadline));
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_ALLGATHERV: {
		size_t *boff, *blen, total = 0;

		if ((boff = malloc(2 * (size_t)t->size * sizeof(size_t)))
		    == NULL) {
			snprintf(err, errlen, "out of memory");
			return (COHORT_ENOMEM);
		}
		blen = boff + t->size;
		for (int p = 0; p < t->size; p++) {
			size_t c = op->kind == COHORT__OP_ALLGATHER
			    ? op->count
			    : op->counts[p];

			boff[p] = total;
			blen[p] = c * esize;
			total += blen[p];
		}
		rv = COHORT_OK;
		if (total > 0)
			rv = algo_allgather(
			    t, op, boff, blen, total, err, errlen, deadline);
		free(boff);
		return (rv);
	}
	case COHORT__OP_REDUCE_SCATTER:
		if (bytes == 0)
			return (COHORT_OK);
		return (
		    algo_reduce_scatter(t, op, bytes, err, errlen, deadline));
	case COHORT__OP_ALLTOALL:
		if (bytes == 0)
			return (COHORT_OK);
		return (algo_alltoall(t, op, bytes, err, errlen, deadline));
	case COHORT__OP_GATHER:
		if (bytes == 0)
			return (COHORT_OK);
		return (algo_gather(t, op, bytes, err, errlen, deadline));
	case COHORT__OP_SCATTER:
		if (bytes == 0)
			return (COHORT_OK);
		return (algo_scatter(t, op, bytes, err, errlen, deadline));
	default:
		break;
	}
	snprintf(err, errlen, "operation %d not supported", (int)op->kind);
	return (COHORT_ENOTSUP);
}
