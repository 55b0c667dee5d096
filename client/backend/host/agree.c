/*
 * agree.c - the host backend's operation agreement: before any tensor
 * byte moves, the ranks check that they all entered the same operation,
 * so ranks that disagree all fail with EMISMATCH naming both sides
 * instead of exchanging bytes of different meaning. The exchange doubles
 * as the barrier.
 *
 * The header (32 bytes, big-endian): "COP1", kind, dtype, op, path (0 tcp,
 * 1 shared memory), root, a hash of ALLGATHERV's counts, count, operation
 * number. Fields an operation does not use are zero, so only what matters
 * is compared.
 *
 * Two ways to compare, by group size:
 *  - up to mesh_max ranks (connected in full at init): every rank sends
 *    every other its header and checks all of them (one round, n - 1
 *    messages per rank; the shared-memory path puts the header in its
 *    control block instead, shm.c);
 *  - larger groups: the smallest and the largest header (memcmp order)
 *    with the ranks that sent them are folded by recursive doubling
 *    (xfer.c host_rd_framed: log2(n) rounds of one 76-byte message each
 *    way, over the partners of the small all-reduce), so every rank
 *    learns whether all agree, and which two ranks differ, without a
 *    connection to every peer. A small all-reduce carries its operand in
 *    the same messages (host_agree_fold_allreduce): log2(n) rounds in
 *    all instead of the fold's and then recursive doubling's. Its
 *    partial sums are only kept once the fold says that all agreed. The
 *    messages are framed (the fold ends with the length of what follows
 *    it), so a rank that only agrees and one that all-reduces, which
 *    disagree, stay in step: each reads and drops what the other sent
 *    beyond the fold, and both learn of the disagreement.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "host_impl.h"

/* The fold of the large-group agreement: min header, its rank, max
 * header, its rank, then the length of the payload the message carries
 * (a fused all-reduce's operand; 0: none). */
#define AGREE_FOLD_MINMAX (2 * (HOST_OP_HDR + 4))
#define AGREE_FOLD (AGREE_FOLD_MINMAX + 4)

cohort_status
host_agree_init(
    struct host_agree *a, struct host_mesh *m, char *err, size_t errlen)
{
	a->mesh = m;
	a->broken = COHORT_OK;
	a->nhdrs = (size_t)m->size;
	if ((a->hdrs = host_zalloc(a->nhdrs, HOST_OP_HDR)) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	return (COHORT_OK);
}

void
host_agree_fini(struct host_agree *a)
{
	host_zfree(a->hdrs, a->nhdrs, HOST_OP_HDR);
	a->hdrs = NULL;
}

static bool
agree_rooted(enum cohort__op_kind k)
{
	return (k == COHORT__OP_REDUCE || k == COHORT__OP_BROADCAST
	    || k == COHORT__OP_GATHER || k == COHORT__OP_SCATTER);
}

static bool
agree_reducing(enum cohort__op_kind k)
{
	return (k == COHORT__OP_ALLREDUCE || k == COHORT__OP_REDUCE
	    || k == COHORT__OP_REDUCE_SCATTER);
}

void
host_agree_hdr(
    struct host_agree *a, const struct cohort__op *op, enum host_path path)
{
	uint8_t *h = a->hdrs + (size_t)a->mesh->rank * HOST_OP_HDR;
	bool data = op->kind != COHORT__OP_BARRIER;
	uint32_t chash = 0;

	if (op->kind == COHORT__OP_ALLGATHERV && op->counts != NULL) {
		uint64_t x = 1469598103934665603ull; /* FNV-1a */

		for (int p = 0; p < a->mesh->size; p++) {
			x ^= op->counts[p];
			x *= 1099511628211ull;
		}
		chash = (uint32_t)(x ^ (x >> 32));
	}
	memcpy(h, "COP1", 4);
	h[4] = (uint8_t)op->kind;
	h[5] = data ? (uint8_t)op->dtype : 0;
	h[6] = agree_reducing(op->kind) ? (uint8_t)op->op : 0;
	h[7] = (uint8_t)path;
	host_put_be(h + 8, agree_rooted(op->kind) ? (uint32_t)op->root : 0, 4);
	host_put_be(h + 12, chash, 4);
	host_put_be(h + 16,
	    data && op->kind != COHORT__OP_ALLGATHERV ? op->count : 0, 8);
	host_put_be(h + 24, op->seq, 8);
}

/* The payload bytes after header h from this rank's first partner
 * (host_frame_fn): a fused all-reduce's operand, else none. */
static bool
agree_payload(const uint8_t *h, size_t *len)
{
	uint64_t count = host_get_be(h + 16, 8);
	size_t esize;

	*len = 0;
	if (memcmp(h, "COP1", 4) != 0 || h[7] > HOST_PATH_FUSED)
		return (false);
	if (h[7] != HOST_PATH_FUSED)
		return (true);
	/* Only a small all-reduce travels with its agreement (the
	 * sender's COHORT_TCP_SMALL_MAX, at most 1 GiB). */
	esize = cohort_dtype_size((cohort_dtype)h[5]);
	if (h[4] != COHORT__OP_ALLREDUCE || esize == 0
	    || count > ((uint64_t)1 << 30) / esize)
		return (false);
	*len = (size_t)count * esize;
	return (true);
}

/* A header from a rank other than the first partner: never a payload. */
static bool
agree_bare(const uint8_t *h, size_t *len)
{
	*len = 0;
	return (memcmp(h, "COP1", 4) == 0 && h[7] <= HOST_PATH_FUSED);
}

bool
host_agree_fusable(const struct host_agree *a)
{
	int n = a->mesh->size;

	return (!a->fold && n >= 2 && (n & (n - 1)) == 0);
}

/* Plans the exchange of headers with every rank (framed: the first
 * partner's may carry an operand, which lands in rbuf when it is at most
 * rcap bytes); this rank sends its header, and to its first partner
 * `bytes` of send after it. */
static void
agree_plan(struct host_agree *a, struct host_xfer *x, const void *send,
    size_t bytes, void *rbuf, size_t rcap)
{
	struct host_mesh *m = a->mesh;
	const uint8_t *mine = a->hdrs + (size_t)m->rank * HOST_OP_HDR;
	int first = host_agree_fusable(a) ? (m->rank ^ 1) : -1;

	host_plan_reset(x);
	for (int p = 0; p < m->size; p++) {
		uint8_t *h = a->hdrs + (size_t)p * HOST_OP_HDR;

		if (p == m->rank)
			continue;
		if (p == first)
			host_plan_framed(x, p, mine, HOST_OP_HDR, send, bytes,
			    h, HOST_OP_HDR, agree_payload, rbuf, rcap);
		else
			host_plan_framed(x, p, mine, HOST_OP_HDR, NULL, 0, h,
			    HOST_OP_HDR, agree_bare, NULL, 0);
	}
}

static const char *
agree_path(uint8_t p)
{
	switch (p) {
	case HOST_PATH_TCP:
		return ("tcp");
	case HOST_PATH_SHM:
		return ("shared memory");
	case HOST_PATH_FUSED:
		return ("tcp, fused with its first round");
	default:
		return ("?");
	}
}

static const char *
agree_kind(uint8_t k)
{
	return (k >= COHORT__OP_ALLREDUCE && k <= COHORT__OP_ALLTOALLV
	        ? cohort__op_name((enum cohort__op_kind)k)
	        : "?");
}

/* Says how header b (of job rank rb) differs from a (job rank ra). */
static void
agree_describe(const uint8_t *a, int32_t ra, const uint8_t *b, int32_t rb,
    char *err, size_t errlen)
{
	if (memcmp(b, "COP1", 4) != 0)
		snprintf(err, errlen,
		    "ranks are out of step: rank %d sent something other than "
		    "an operation header (an earlier operation that "
		    "disagreed?)",
		    (int)rb);
	else if (a[4] != b[4] || a[24] != b[24]
	    || host_get_be(a + 24, 8) != host_get_be(b + 24, 8))
		snprintf(err, errlen,
		    "ranks disagree on the operation: rank %d %s #%" PRIu64
		    ", rank %d %s #%" PRIu64,
		    (int)ra, agree_kind(a[4]), host_get_be(a + 24, 8), (int)rb,
		    agree_kind(b[4]), host_get_be(b + 24, 8));
	else if (a[5] != b[5])
		snprintf(err, errlen,
		    "ranks disagree: rank %d dtype %s, rank %d dtype %s",
		    (int)ra, cohort_dtype_name((cohort_dtype)a[5]), (int)rb,
		    cohort_dtype_name((cohort_dtype)b[5]));
	else if (host_get_be(a + 16, 8) != host_get_be(b + 16, 8))
		snprintf(err, errlen,
		    "ranks disagree: rank %d count %" PRIu64
		    ", rank %d count %" PRIu64,
		    (int)ra, host_get_be(a + 16, 8), (int)rb,
		    host_get_be(b + 16, 8));
	else if (a[6] != b[6])
		snprintf(err, errlen,
		    "ranks disagree: rank %d op %s, rank %d op %s", (int)ra,
		    cohort_redop_name((cohort_redop)a[6]), (int)rb,
		    cohort_redop_name((cohort_redop)b[6]));
	else if (host_get_be(a + 8, 4) != host_get_be(b + 8, 4))
		snprintf(err, errlen,
		    "ranks disagree: rank %d root %u, rank %d root %u",
		    (int)ra, (unsigned)host_get_be(a + 8, 4), (int)rb,
		    (unsigned)host_get_be(b + 8, 4));
	else if (host_get_be(a + 12, 4) != host_get_be(b + 12, 4))
		snprintf(err, errlen,
		    "ranks disagree on the per-rank counts (rank %d and "
		    "rank %d)",
		    (int)ra, (int)rb);
	else
		snprintf(err, errlen,
		    "ranks disagree on the path: rank %d %s, rank %d %s "
		    "(COHORT_TCP_* size limits differ?)",
		    (int)ra, agree_path(a[7]), (int)rb, agree_path(b[7]));
}

/* A disagreement between h0 (group rank p0) and h (rank p): EMISMATCH;
 * shm: some rank was on the shared-memory path. */
static cohort_status
agree_failed(struct host_agree *a, const struct host_op *c, bool shm,
    const uint8_t *h0, int p0, const uint8_t *h, int p, char *err,
    size_t errlen)
{
	const struct host_link *l = a->mesh->links;

	agree_describe(h0, l[p0].job_rank, h, l[p].job_rank, err, errlen);
	if (shm || memcmp(h, "COP1", 4) != 0) {
		/* The shared-memory rounds (or the streams) are out of step
		 * now: so is every later operation. */
		a->broken = COHORT_EMISMATCH;
		snprintf(a->broken_err, sizeof(a->broken_err),
		    "%s (in %s #%" PRIu64 "; the group cannot be used any "
		    "more)",
		    err, c->name, c->seq);
	}
	return (COHORT_EMISMATCH);
}

cohort_status
host_agree_check(
    struct host_agree *a, const struct host_op *c, char *err, size_t errlen)
{
	const uint8_t *h0 = a->hdrs;
	bool shm = false;
	int bad = -1;

	for (int p = 0; p < a->mesh->size; p++) {
		const uint8_t *h = a->hdrs + (size_t)p * HOST_OP_HDR;

		if (h[7] == HOST_PATH_SHM)
			shm = true;
		if (bad < 0 && memcmp(h, h0, HOST_OP_HDR) != 0)
			bad = p;
	}
	if (bad < 0)
		return (COHORT_OK);
	return (agree_failed(a, c, shm, h0, 0,
	    a->hdrs + (size_t)bad * HOST_OP_HDR, bad, err, errlen));
}

/* The fold: keeps the smaller and the larger header (ties: the lower
 * rank), each with its group rank; the payload length stays this rank's
 * own. */
static void
agree_combine(void *ctx, uint8_t *mine, const uint8_t *theirs)
{
	(void)ctx;
	if (theirs == NULL)
		return;
	for (int half = 0; half < 2; half++) {
		uint8_t *m = mine + half * (HOST_OP_HDR + 4);
		const uint8_t *t = theirs + half * (HOST_OP_HDR + 4);
		int d = memcmp(t, m, HOST_OP_HDR);
		bool take = half == 0 ? d < 0 : d > 0;

		if (d == 0
		    && host_get_be(t + HOST_OP_HDR, 4)
		        < host_get_be(m + HOST_OP_HDR, 4))
			take = true;
		if (take)
			memcpy(m, t, HOST_OP_HDR + 4);
	}
}

/* Runs a planned exchange of headers: a stream found out of step
 * (host_plan_framed) breaks the group. */
static cohort_status
agree_exchange(struct host_agree *a, struct host_xfer *x,
    const struct host_op *c, char *err, size_t errlen, cohort__time deadline)
{
	cohort_status rv = host_exchange(x, c, err, errlen, deadline);

	if (rv == COHORT_EMISMATCH) {
		a->broken = rv;
		snprintf(a->broken_err, sizeof(a->broken_err),
		    "%s (the group cannot be used any more)", err);
	}
	return (rv);
}

/* A fold message's size (host_frame_fn): the payload length at its
 * end; false when it is not a fold (the stream is out of step). */
static bool
agree_fold_frame(const uint8_t *h, size_t *len)
{
	uint64_t v = host_get_be(h + AGREE_FOLD_MINMAX, 4);

	*len = 0;
	if (memcmp(h, "COP1", 4) != 0
	    || memcmp(h + HOST_OP_HDR + 4, "COP1", 4) != 0
	    || v > ((uint64_t)1 << 30))
		return (false);
	*len = (size_t)v;
	return (true);
}

static void
agree_no_payload(void *ctx, uint8_t *mine, const uint8_t *theirs)
{
	(void)ctx;
	(void)mine;
	(void)theirs;
}

/* The fold by recursive doubling of this rank's header (in a->hdrs),
 * with plen bytes of payload in pay combined by pcombine in the same
 * rounds (rpay: plen bytes of scratch); EMISMATCH naming two ranks that
 * differ when not all agree. */
static cohort_status
agree_fold(struct host_agree *a, struct host_xfer *x, const struct host_op *c,
    uint8_t *pay, uint8_t *rpay, size_t plen,
    void (*pcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline)
{
	struct host_mesh *m = a->mesh;
	const uint8_t *mine = a->hdrs + (size_t)m->rank * HOST_OP_HDR;
	uint8_t fold[AGREE_FOLD], theirs[AGREE_FOLD];
	bool odd;
	cohort_status rv;

	for (int half = 0; half < 2; half++) {
		memcpy(fold + half * (HOST_OP_HDR + 4), mine, HOST_OP_HDR);
		host_put_be(fold + half * (HOST_OP_HDR + 4) + HOST_OP_HDR,
		    (uint64_t)m->rank, 4);
	}
	host_put_be(fold + AGREE_FOLD_MINMAX, plen, 4);
	rv = host_rd_framed(x, c, fold, theirs, sizeof(fold), agree_fold_frame,
	    agree_combine, pay, rpay, plen,
	    pcombine != NULL ? pcombine : agree_no_payload, ctx, &odd, err,
	    errlen, deadline);
	if (rv == COHORT_EMISMATCH) {
		/* not a fold: out of step for good */
		a->broken = rv;
		snprintf(a->broken_err, sizeof(a->broken_err),
		    "%s (the group cannot be used any more)", err);
	}
	if (rv != COHORT_OK)
		return (rv);
	if (memcmp(fold, fold + HOST_OP_HDR + 4, HOST_OP_HDR) == 0) {
		if (!odd)
			return (COHORT_OK);
		/* all agreed, yet a payload was missing: cannot be */
		snprintf(err, errlen,
		    "ranks are out of step in %s #%" PRIu64
		    " (an operand of another length)",
		    c->name, c->seq);
		a->broken = COHORT_EMISMATCH;
		snprintf(a->broken_err, sizeof(a->broken_err), "%s", err);
		return (COHORT_EMISMATCH);
	}
	{
		int plo = (int)host_get_be(fold + HOST_OP_HDR, 4);
		int phi = (int)host_get_be(fold + 2 * HOST_OP_HDR + 4, 4);

		if (plo < 0 || plo >= m->size || phi < 0 || phi >= m->size) {
			snprintf(err, errlen,
			    "ranks are out of step in %s #%" PRIu64
			    " (a malformed agreement)",
			    c->name, c->seq);
			a->broken = COHORT_EMISMATCH;
			snprintf(
			    a->broken_err, sizeof(a->broken_err), "%s", err);
			return (COHORT_EMISMATCH);
		}
		return (agree_failed(a, c, false, fold, plo,
		    fold + HOST_OP_HDR + 4, phi, err, errlen));
	}
}

cohort_status
host_agree_run(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, char *err,
    size_t errlen, cohort__time deadline)
{
	cohort_status rv;

	host_agree_hdr(a, op, HOST_PATH_TCP);
	if (!a->fold) {
		/* Framed: a partner that runs a fused all-reduce here sends
		 * its operand after its header; it is read and dropped. */
		agree_plan(a, x, NULL, 0, NULL, 0);
		if ((rv = agree_exchange(a, x, c, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
		return (host_agree_check(a, c, err, errlen));
	}
	return (agree_fold(
	    a, x, c, NULL, NULL, 0, NULL, NULL, err, errlen, deadline));
}

cohort_status
host_agree_fold_allreduce(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, uint8_t *pay,
    uint8_t *rpay, size_t plen,
    void (*pcombine)(void *ctx, uint8_t *mine, const uint8_t *theirs),
    void *ctx, char *err, size_t errlen, cohort__time deadline)
{
	host_agree_hdr(a, op, HOST_PATH_FUSED);
	return (agree_fold(
	    a, x, c, pay, rpay, plen, pcombine, ctx, err, errlen, deadline));
}

cohort_status
host_agree_first(struct host_agree *a, struct host_xfer *x,
    const struct cohort__op *op, const struct host_op *c, const void *send,
    void *rbuf, size_t bytes, char *err, size_t errlen, cohort__time deadline)
{
	cohort_status rv;

	host_agree_hdr(a, op, HOST_PATH_FUSED);
	agree_plan(a, x, send, bytes, rbuf, bytes);
	if ((rv = agree_exchange(a, x, c, err, errlen, deadline)) != COHORT_OK)
		return (rv);
	return (host_agree_check(a, c, err, errlen));
}
