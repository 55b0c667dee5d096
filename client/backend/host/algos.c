/*
 * algos.c - the host backend's collectives over TCP, as plans for the
 * engines of xfer.c (which connect to the peers a plan names on first
 * use).
 *
 *  allreduce       <= small_max bytes: recursive doubling (non-powers of
 *                  two fold the extra ranks in first and out last); in
 *                  a fully connected group of 2, 4, 8.. ranks its first
 *                  round travels with the agreement (host_algos_fused);
 *                  larger: ring reduce-scatter + all-gather as one
 *                  pipelined stream of 2(n-1) steps (2 ranks: optionally
 *                  a pipelined pairwise exchange, see pair_min/max).
 *  reduce          small: binomial tree; large: pipelined chain to root.
 *  broadcast       small: root sends to all (a large group: binomial
 *                  tree); large: pipelined chain.
 *  allgather(v)    small total: direct exchange (not in a large group);
 *                  large: pipelined ring.
 *  reduce_scatter  small total: direct exchange (not in a large group);
 *                  large: pipelined ring with partial sums in the acc
 *                  ring.
 *  alltoall, gather, scatter: direct exchange, everything in flight (the
 *                  only ones that connect a large group's rank - the
 *                  root's - to every peer).
 * A large group (more than COHORT_TCP_MESH_MAX ranks) so connects each
 * rank to O(log n) peers: ring neighbours, recursive-doubling and
 * binomial-tree partners.
 *
 * All reductions combine values with a commutative operator in an order
 * that gives every rank bit-identical results.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_impl.h"

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

/* ------------------------------------------------------------------------ */
/* allreduce                                                                */
/* ------------------------------------------------------------------------ */

/* The all-reduce's combine for host_rd: mine op= theirs, then (theirs
 * NULL) MEAN's division. */
struct algo_rd_ctx {
	const struct cohort__op *op;
	int n;
};

static void
algo_rd_combine(void *ctx, uint8_t *mine, const uint8_t *theirs)
{
	const struct algo_rd_ctx *k = ctx;

	if (theirs != NULL)
		cohort__reduce(
		    mine, theirs, k->op->count, k->op->dtype, k->op->op);
	else if (k->op->op == COHORT_MEAN)
		cohort__scale_div(
		    mine, k->op->count, k->op->dtype, (double)k->n);
}

static cohort_status
algo_allreduce_rd(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	struct algo_rd_ctx k = { op, x->mesh->size };

	if (op->send != op->recv)
		memcpy(op->recv, op->send, bytes);
	return (host_rd(x, c, op->recv, bytes, algo_rd_combine, &k, err,
	    errlen, deadline));
}

/* The agreement carries the first round's operands (host_agree_first),
 * then recursive doubling goes on from the second round: log2(n) rounds
 * of waiting instead of 1 + log2(n). */
cohort_status
host_algos_fused(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, size_t bytes,
    char *err, size_t errlen, cohort__time deadline)
{
	struct algo_rd_ctx k = { op, x->mesh->size };
	cohort_status rv;

	host_op_algo(c, "recursive_doubling_fused");
	if ((rv = host_grow_small(x, bytes, err, errlen)) != COHORT_OK
	    || (rv = host_agree_first(a, x, op, c, op->send, x->small, bytes,
	            err, errlen, deadline))
	        != COHORT_OK)
		return (rv);
	if (op->send != op->recv)
		memcpy(op->recv, op->send, bytes);
	algo_rd_combine(&k, op->recv, x->small);
	return (host_rd_from(x, c, op->recv, bytes, 2, algo_rd_combine, &k,
	    err, errlen, deadline));
}

cohort_status
host_algos_fused_fold(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, size_t bytes,
    char *err, size_t errlen, cohort__time deadline)
{
	struct algo_rd_ctx k = { op, x->mesh->size };
	cohort_status rv;

	host_op_algo(c, "recursive_doubling_fused");
	/* the partial sums in scratch: op->recv only gets an agreed result */
	if ((rv = host_grow_small(x, 2 * bytes, err, errlen)) != COHORT_OK)
		return (rv);
	memcpy(x->small, op->send, bytes);
	if ((rv = host_agree_fold_allreduce(a, x, op, c, x->small,
	         x->small + bytes, bytes, algo_rd_combine, &k, err, errlen,
	         deadline))
	    != COHORT_OK)
		return (rv);
	memcpy(op->recv, x->small, bytes);
	return (COHORT_OK);
}

/* Step st receives bytes into op->recv, reduced with op->send as they
 * arrive (in place: through the scratch ring; sending: only once this
 * step sent the bytes they replace), MEAN divided. */
static void
algo_into_recv(struct host_step *st, const struct cohort__op *op, size_t bytes,
    bool sending)
{
	st->rbuf = op->recv;
	st->rlen = bytes;
	st->divide = op->op == COHORT_MEAN;
	if (op->send == op->recv) {
		st->rmode = HOST_RECV_SCRATCH;
		st->pgate = sending;
	} else {
		st->rmode = HOST_RECV_DIRECT;
		st->other = op->send;
	}
}

/* Two ranks: both send everything at once and reduce what arrives, both
 * directions in flight. Same bytes on the wire as the ring, but nothing
 * waits for a reduction before it can be sent. */
static cohort_status
algo_allreduce_pair(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	struct host_step *st;
	int peer = 1 - x->mesh->rank;

	if ((st = host_steps(x, 1, err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	memset(st, 0, sizeof(*st));
	st->sbuf = op->send;
	st->slen = bytes;
	st->gate = -1;
	algo_into_recv(st, op, bytes, true);
	return (host_stream(x, c, peer, peer, st, 1, err, errlen, deadline));
}

static cohort_status
algo_allreduce_ring(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, char *err, size_t errlen, cohort__time deadline)
{
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	int n = x->mesh->size, r = x->mesh->rank;
	bool inplace = op->send == op->recv;
	struct host_step *st;
	int k = 0;

	if ((st = host_steps(x, 2 * (size_t)(n - 1), err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	for (int s = 0; s < n - 1; s++, k++) {
		size_t soff, slen, roff, rlen;

		algo_segment(
		    op->count, n, algo_mod(r - s, n), c->esize, &soff, &slen);
		algo_segment(op->count, n, algo_mod(r - s - 1, n), c->esize,
		    &roff, &rlen);
		memset(&st[k], 0, sizeof(st[k]));
		st[k].sbuf = (s == 0 ? src : dst) + soff;
		st[k].slen = slen;
		st[k].gate = s == 0 ? -1 : k - 1;
		st[k].rbuf = dst + roff;
		st[k].rlen = rlen;
		if (inplace) {
			st[k].rmode = HOST_RECV_SCRATCH;
		} else {
			st[k].rmode = HOST_RECV_DIRECT;
			st[k].other = src + roff;
		}
		st[k].divide = op->op == COHORT_MEAN && s == n - 2;
	}
	for (int s = 0; s < n - 1; s++, k++) {
		size_t soff, slen, roff, rlen;

		algo_segment(op->count, n, algo_mod(r + 1 - s, n), c->esize,
		    &soff, &slen);
		algo_segment(
		    op->count, n, algo_mod(r - s, n), c->esize, &roff, &rlen);
		memset(&st[k], 0, sizeof(st[k]));
		st[k].sbuf = dst + soff;
		st[k].slen = slen;
		st[k].gate = k - 1;
		st[k].rmode = HOST_RECV_COPY;
		st[k].rbuf = dst + roff;
		st[k].rlen = rlen;
	}
	return (host_stream(x, c, algo_mod(r + 1, n), algo_mod(r - 1, n), st,
	    k, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* reduce                                                                   */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_reduce_tree(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	int n = x->mesh->size;
	int v = algo_mod(x->mesh->rank - op->root, n);
	uint8_t *acc, *tmp;
	cohort_status rv;

	if ((rv = host_grow_small(x, 2 * bytes, err, errlen)) != COHORT_OK)
		return (rv);
	acc = v == 0 ? (uint8_t *)op->recv : x->small;
	tmp = x->small + bytes;
	if (acc != op->send)
		memcpy(acc, op->send, bytes);
	for (int mask = 1; mask < n; mask <<= 1) {
		if (v & mask) {
			int to = algo_mod(v - mask + op->root, n);

			return (host_pair(x, c, to, acc, bytes, NULL, 0, err,
			    errlen, deadline));
		}
		if (v + mask < n) {
			int from = algo_mod(v + mask + op->root, n);

			if ((rv = host_pair(x, c, from, NULL, 0, tmp, bytes,
			         err, errlen, deadline))
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
algo_reduce_chain(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	int n = x->mesh->size;
	int v = algo_mod(x->mesh->rank - op->root, n);
	int to = v == 0 ? -1 : algo_mod(x->mesh->rank - 1, n);
	int from = v == n - 1 ? -1 : algo_mod(x->mesh->rank + 1, n);
	struct host_step *st;
	cohort_status rv;

	if ((rv = host_need_acc(x, err, errlen)) != COHORT_OK)
		return (rv);

	if ((st = host_steps(x, 1, err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	memset(st, 0, sizeof(*st));
	st->gate = -1;
	if (v == n - 1) {
		st->sbuf = op->send;
		st->slen = bytes;
	} else if (v > 0) {
		st->sbuf = NULL;
		st->slen = bytes;
		st->gate = 0;
		st->rmode = HOST_RECV_ACC;
		st->other = op->send;
		st->rlen = bytes;
	} else {
		algo_into_recv(st, op, bytes, false);
	}
	return (host_stream(x, c, to, from, st, 1, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* broadcast                                                                */
/* ------------------------------------------------------------------------ */

/* Binomial tree from the root (a large group's small broadcast: log2(n)
 * partners per rank instead of the root's n - 1). */
static cohort_status
algo_broadcast_tree(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, char *err, size_t errlen,
    cohort__time deadline)
{
	int n = x->mesh->size;
	int v = algo_mod(x->mesh->rank - op->root, n);
	int mask = 1;
	cohort_status rv;

	/* Receive from the parent: v without its lowest set bit. */
	while (mask < n && (v & mask) == 0)
		mask <<= 1;
	if (v != 0) {
		int from = algo_mod(v - mask + op->root, n);

		if ((rv = host_pair(x, c, from, NULL, 0, op->recv, bytes, err,
		         errlen, deadline))
		    != COHORT_OK)
			return (rv);
	}
	/* Send to the children: v + m for every m below that bit. */
	for (mask >>= 1; mask > 0; mask >>= 1) {
		if (v + mask >= n)
			continue;
		if ((rv = host_pair(x, c, algo_mod(v + mask + op->root, n),
		         op->recv, bytes, NULL, 0, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
	}
	return (COHORT_OK);
}

static cohort_status
algo_broadcast(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, bool sparse, char *err,
    size_t errlen, cohort__time deadline)
{
	int n = x->mesh->size;
	int v = algo_mod(x->mesh->rank - op->root, n);
	struct host_step *st;

	if (sparse && bytes <= x->tune->bcast_small) {
		host_op_algo(c, "tree");
		return (algo_broadcast_tree(
		    x, op, c, bytes, err, errlen, deadline));
	}
	if (bytes <= x->tune->bcast_small || n == 2) {
		host_plan_reset(x);
		if (v == 0) {
			for (int p = 0; p < n; p++) {
				if (p == x->mesh->rank)
					continue;
				host_plan_set(x, p, op->recv, bytes, NULL, 0);
			}
		} else {
			host_plan_set(x, op->root, NULL, 0, op->recv, bytes);
		}
		return (host_exchange(x, c, err, errlen, deadline));
	}
	if ((st = host_steps(x, 1, err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	memset(st, 0, sizeof(*st));
	st->gate = v == 0 ? -1 : 0;
	st->sbuf = op->recv;
	st->slen = v == n - 1 ? 0 : bytes;
	st->rmode = HOST_RECV_COPY;
	st->rbuf = op->recv;
	st->rlen = v == 0 ? 0 : bytes;
	return (
	    host_stream(x, c, v == n - 1 ? -1 : algo_mod(x->mesh->rank + 1, n),
	        v == 0 ? -1 : algo_mod(x->mesh->rank - 1, n), st, 1, err,
	        errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* allgather, allgatherv                                                    */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_allgather(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, const size_t *boff, const size_t *blen,
    size_t total, bool sparse, char *err, size_t errlen, cohort__time deadline)
{
	int n = x->mesh->size, r = x->mesh->rank;
	uint8_t *dst = op->recv;
	struct host_step *st;

	if (dst + boff[r] != op->send)
		memmove(dst + boff[r], op->send, blen[r]);
	if (total <= x->tune->small_max && !sparse) {
		host_op_algo(c, "direct");
		host_plan_reset(x);
		for (int p = 0; p < n; p++) {
			if (p == r)
				continue;
			host_plan_set(x, p, dst + boff[r], blen[r],
			    dst + boff[p], blen[p]);
		}
		return (host_exchange(x, c, err, errlen, deadline));
	}
	host_op_algo(c, "ring");
	if ((st = host_steps(x, (size_t)(n - 1), err, errlen)) == NULL)
		return (COHORT_ENOMEM);
	for (int s = 0; s < n - 1; s++) {
		int sb = algo_mod(r - s, n), rb = algo_mod(r - s - 1, n);

		memset(&st[s], 0, sizeof(st[s]));
		st[s].sbuf = dst + boff[sb];
		st[s].slen = blen[sb];
		st[s].gate = s == 0 ? -1 : s - 1;
		st[s].rmode = HOST_RECV_COPY;
		st[s].rbuf = dst + boff[rb];
		st[s].rlen = blen[rb];
	}
	return (host_stream(x, c, algo_mod(r + 1, n), algo_mod(r - 1, n), st,
	    n - 1, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* reduce_scatter                                                           */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_reduce_scatter(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t blk, bool sparse, char *err, size_t errlen,
    cohort__time deadline)
{
	int n = x->mesh->size, r = x->mesh->rank;
	const uint8_t *src = op->send;
	uint8_t *dst = op->recv;
	struct host_step *st;
	uint8_t *copy = NULL;
	cohort_status rv;

	if ((size_t)n * blk <= x->tune->small_max && !sparse) {
		host_op_algo(c, "direct");
		if ((rv = host_grow_small(x, (size_t)n * blk, err, errlen))
		    != COHORT_OK)
			return (rv);
		if ((rv = host_exchange_blocks(x, c, src, blk, x->small, blk,
		         blk, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		/* Every send is done: dst may now overlap src freely. */
		memmove(dst, src + (size_t)r * blk, blk);
		for (int p = 0; p < n; p++)
			if (p != r)
				cohort__reduce(dst, x->small + (size_t)p * blk,
				    op->count, op->dtype, op->op);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    dst, op->count, op->dtype, (double)n);
		return (COHORT_OK);
	}

	host_op_algo(c, "ring");
	if ((rv = host_need_acc(x, err, errlen)) != COHORT_OK)
		return (rv);
	if ((st = host_steps(x, (size_t)(n - 1), err, errlen)) == NULL)
		return (COHORT_ENOMEM);
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
			st[s].rmode = HOST_RECV_ACC;
			st[s].other = src + (size_t)rb * blk;
		} else {
			st[s].rbuf = dst;
			st[s].divide = op->op == COHORT_MEAN;
			if (dst == src + (size_t)r * blk) {
				st[s].rmode = HOST_RECV_SCRATCH;
			} else {
				st[s].rmode = HOST_RECV_DIRECT;
				st[s].other = src + (size_t)r * blk;
			}
		}
	}
	rv = host_stream(x, c, algo_mod(r + 1, n), algo_mod(r - 1, n), st,
	    n - 1, err, errlen, deadline);
	free(copy);
	return (rv);
}

/* ------------------------------------------------------------------------ */
/* alltoall, gather, scatter, barrier                                       */
/* ------------------------------------------------------------------------ */

static cohort_status
algo_alltoall(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t blk, char *err, size_t errlen,
    cohort__time deadline)
{
	size_t all = (size_t)x->mesh->size * blk;
	size_t mine = (size_t)x->mesh->rank * blk;

	if (algo_overlap(op->send, all, op->recv, all)) {
		snprintf(err, errlen, "alltoall cannot run in place");
		return (COHORT_EINVAL);
	}
	memcpy(
	    (uint8_t *)op->recv + mine, (const uint8_t *)op->send + mine, blk);
	/* Block p of src to rank p and rank p's block into block p of dst, for
	 * every other rank at once (the personalised all-to-all exchange). */
	return (host_exchange_blocks(
	    x, c, op->send, blk, op->recv, blk, blk, err, errlen, deadline));
}

/* Uneven blocks (alltoallv). First every pair swaps its two counts
 * (what each sends the other, what each expects), so both ends of a pair
 * that disagrees see it and leave that pair's data out: the connections
 * stay in step, the ranks of the pair fail with EMISMATCH, the others
 * complete. Then one message each way with every peer at once. */
static cohort_status
algo_alltoallv(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, char *err, size_t errlen, cohort__time deadline)
{
	int n = x->mesh->size, r = x->mesh->rank, bad = -1;
	size_t es = c->esize;
	uint8_t *mine, *theirs;
	cohort_status rv;

	if ((rv = host_grow_small(x, 32 * (size_t)n, err, errlen))
	    != COHORT_OK)
		return (rv);
	mine = x->small;
	theirs = x->small + 16 * (size_t)n;
	host_plan_reset(x);
	for (int p = 0; p < n; p++) {
		if (p == r)
			continue;
		host_put_be(mine + 16 * (size_t)p, op->counts[p], 8);
		host_put_be(mine + 16 * (size_t)p + 8, op->rcounts[p], 8);
		host_plan_set(x, p, mine + 16 * (size_t)p, 16,
		    theirs + 16 * (size_t)p, 16);
	}
	if ((rv = host_exchange(x, c, err, errlen, deadline)) != COHORT_OK)
		return (rv);
	host_plan_reset(x);
	for (int p = 0; p < n; p++) {
		uint64_t to_me, from_me;

		if (p == r)
			continue;
		to_me = host_get_be(theirs + 16 * (size_t)p, 8);
		from_me = host_get_be(theirs + 16 * (size_t)p + 8, 8);
		if (to_me != op->rcounts[p] || from_me != op->counts[p]) {
			if (bad < 0) {
				bool in = to_me != op->rcounts[p];

				bad = p;
				snprintf(err, errlen,
				    "alltoallv #%" PRIu64 ": ranks disagree: "
				    "rank %d sends %" PRIu64 " elements to "
				    "rank %d, which expects %zu",
				    c->seq,
				    (int)x->mesh->links[in ? p : r].job_rank,
				    in ? to_me : (uint64_t)op->counts[p],
				    (int)x->mesh->links[in ? r : p].job_rank,
				    in ? op->rcounts[p] : (size_t)from_me);
			}
			continue;
		}
		host_plan_set(x, p,
		    (const uint8_t *)op->send + op->sdispls[p] * es,
		    op->counts[p] * es,
		    (uint8_t *)op->recv + op->rdispls[p] * es,
		    op->rcounts[p] * es);
	}
	if (op->counts[r] != op->rcounts[r] && bad < 0) {
		bad = r;
		snprintf(err, errlen,
		    "alltoallv #%" PRIu64 ": rank %d sends %zu elements to "
		    "itself and receives %zu",
		    c->seq, (int)x->mesh->links[r].job_rank, op->counts[r],
		    op->rcounts[r]);
	} else if (op->counts[r] > 0) {
		memcpy((uint8_t *)op->recv + op->rdispls[r] * es,
		    (const uint8_t *)op->send + op->sdispls[r] * es,
		    op->counts[r] * es);
	}
	if (bad >= 0) {
		char keep[512];

		/* The others' data still moves: their connections stay in
		 * step with this rank's. */
		cohort__strlcpy(keep, err, sizeof(keep));
		if ((rv = host_exchange(x, c, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		cohort__strlcpy(err, keep, errlen);
		return (COHORT_EMISMATCH);
	}
	return (host_exchange(x, c, err, errlen, deadline));
}

/* Block p of the root's buf to (scatter) or from (gather) rank p's own
 * buffer mine, one message each, all at once. */
static cohort_status
algo_root_blocks(struct host_xfer *x, const struct host_op *c, int root,
    bool gather, const void *mine, const uint8_t *buf, size_t blk, char *err,
    size_t errlen, cohort__time deadline)
{
	int r = x->mesh->rank;

	host_plan_reset(x);
	for (int p = 0; p < x->mesh->size; p++) {
		int peer = r == root ? p : root;
		uint8_t *theirs = (uint8_t *)buf + (size_t)peer * blk;

		if (p == r || (r != root && p != root))
			continue;
		if (gather == (r != root))
			host_plan_set(
			    x, p, r == root ? theirs : mine, blk, NULL, 0);
		else
			host_plan_set(x, p, NULL, 0,
			    r == root ? theirs : (uint8_t *)mine, blk);
	}
	return (host_exchange(x, c, err, errlen, deadline));
}

static cohort_status
algo_gather(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t blk, char *err, size_t errlen,
    cohort__time deadline)
{
	if (x->mesh->rank == op->root
	    && (uint8_t *)op->recv + (size_t)x->mesh->rank * blk != op->send)
		memmove((uint8_t *)op->recv + (size_t)x->mesh->rank * blk,
		    op->send, blk);
	return (algo_root_blocks(x, c, op->root, true, op->send, op->recv, blk,
	    err, errlen, deadline));
}

static cohort_status
algo_scatter(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t blk, char *err, size_t errlen,
    cohort__time deadline)
{
	cohort_status rv;

	if ((rv = algo_root_blocks(x, c, op->root, false, op->recv, op->send,
	         blk, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);
	/* After the sends: recv may overlap send. */
	if (x->mesh->rank == op->root
	    && op->recv
	        != (const uint8_t *)op->send + (size_t)x->mesh->rank * blk)
		memmove(op->recv,
		    (const uint8_t *)op->send + (size_t)x->mesh->rank * blk,
		    blk);
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Dispatch                                                                 */
/* ------------------------------------------------------------------------ */

void
host_algos_local(const struct cohort__op *op, size_t esize)
{
	size_t bytes = op->count * esize;

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
		bytes = op->counts[0] * esize;
		if (op->recv != op->send && bytes > 0)
			memmove(op->recv, op->send, bytes);
		break;
	default:
		break;
	}
}

static cohort_status
algo_allgather_run(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, bool sparse, char *err, size_t errlen,
    cohort__time deadline)
{
	int n = x->mesh->size;
	size_t *boff, *blen, total = 0;
	cohort_status rv = COHORT_OK;

	if ((boff = malloc(2 * (size_t)n * sizeof(size_t))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	blen = boff + n;
	for (int p = 0; p < n; p++) {
		size_t cnt = op->kind == COHORT__OP_ALLGATHER ? op->count
		                                              : op->counts[p];

		boff[p] = total;
		blen[p] = cnt * c->esize;
		total += blen[p];
	}
	if (total > 0)
		rv = algo_allgather(x, op, c, boff, blen, total, sparse, err,
		    errlen, deadline);
	free(boff);
	return (rv);
}

cohort_status
host_algos_run(struct host_xfer *x, const struct cohort__op *op,
    const struct host_op *c, size_t bytes, bool sparse, char *err,
    size_t errlen, cohort__time deadline)
{
	const struct host_tune *tu = x->tune;
	int n = x->mesh->size;

	if (op->kind == COHORT__OP_ALLGATHER
	    || op->kind == COHORT__OP_ALLGATHERV)
		return (algo_allgather_run(
		    x, op, c, sparse, err, errlen, deadline));
	if (op->kind == COHORT__OP_ALLTOALLV) {
		host_op_algo(c, "direct");
		return (algo_alltoallv(x, op, c, err, errlen, deadline));
	}
	if (bytes == 0)
		return (COHORT_OK);
	switch (op->kind) {
	case COHORT__OP_ALLREDUCE:
		if (bytes <= tu->small_max || op->count < (size_t)n) {
			host_op_algo(c, "recursive_doubling");
			return (algo_allreduce_rd(
			    x, op, c, bytes, err, errlen, deadline));
		}
		if (n == 2 && tu->pair_min <= bytes && bytes <= tu->pair_max) {
			host_op_algo(c, "pair");
			return (algo_allreduce_pair(
			    x, op, c, bytes, err, errlen, deadline));
		}
		host_op_algo(c, "ring");
		return (algo_allreduce_ring(x, op, c, err, errlen, deadline));
	case COHORT__OP_REDUCE:
		if (bytes <= tu->small_max) {
			host_op_algo(c, "tree");
			return (algo_reduce_tree(
			    x, op, c, bytes, err, errlen, deadline));
		}
		host_op_algo(c, "chain");
		return (
		    algo_reduce_chain(x, op, c, bytes, err, errlen, deadline));
	case COHORT__OP_BROADCAST:
		host_op_algo(c,
		    bytes <= tu->bcast_small || n == 2 ? "direct"
		                                       : "pipeline");
		return (algo_broadcast(
		    x, op, c, bytes, sparse, err, errlen, deadline));
	case COHORT__OP_REDUCE_SCATTER:
		return (algo_reduce_scatter(
		    x, op, c, bytes, sparse, err, errlen, deadline));
	case COHORT__OP_ALLTOALL:
		host_op_algo(c, "direct");
		return (algo_alltoall(x, op, c, bytes, err, errlen, deadline));
	case COHORT__OP_GATHER:
		host_op_algo(c, "direct");
		return (algo_gather(x, op, c, bytes, err, errlen, deadline));
	case COHORT__OP_SCATTER:
		host_op_algo(c, "direct");
		return (algo_scatter(x, op, c, bytes, err, errlen, deadline));
	default:
		break;
	}
	snprintf(err, errlen, "operation %d not supported", (int)op->kind);
	return (COHORT_ENOTSUP);
}
