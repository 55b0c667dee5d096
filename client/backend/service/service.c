/*
 * service.c - the `service` data-plane backend: every collective through
 * cohortd (proto/README.md section 5.3).
 *
 * Each operation is one or more COLL_SERVICE collectives, a gather at
 * cohortd: every member sends what it contributes as payload, and every
 * member receives the concatenation of all contributions in group-rank
 * order (per-rank lengths in CollectiveReply.i64s). The result is computed
 * locally: reductions in group-rank order with cohort__reduce, so that
 * every rank gets bit-identical values; MEAN divides at the end.
 *
 * What a rank sends, per operation:
 *   allreduce, reduce        its whole input
 *   broadcast, scatter       the root only: its buffer / all blocks
 *   allgather(v), gather     its block
 *   reduce_scatter, alltoall all its blocks
 *
 * Large operations are cut into chunks along the element index within a
 * block, so that no reply exceeds COHORT_SERVICE_CHUNK bytes (default
 * 16 MiB; cohortd's message limit is 64 MiB). Every member computes the
 * same chunking from the operation's arguments.
 *
 * The gathers go through the group's coordinator channel (backend.h),
 * which numbers them and hands a failed peer on to the client: this file
 * sees nothing of the client.
 *
 * Alltoallv: a first gather of every rank's counts (so every rank checks
 * every pair, and all fail alike with EMISMATCH when a pair disagrees),
 * then gathers of every rank's send blocks laid end to end, chunked as
 * above; each rank copies out the pieces addressed to it.
 *
 * Point-to-point (backend.h v3; also the fallback of backends without
 * their own): a mailbox per rank in the job's KV at cohortd, under the
 * group's prefix. A send takes the next slot of the receiver's box
 * (store add on "p2p/box/<dst>/n") and writes the message there: its
 * chunks beyond the first under "p2p/box/<dst>/<slot>/<i>", then the
 * header with the first chunk under "p2p/box/<dst>/<slot>", so a message
 * is seen only whole. It completes when cohortd holds it (sends are
 * buffered here, unlike on tcp and nccl). The receiver's thread reads
 * its box slot after slot while a receive is pending (a KV wait, so it
 * costs nothing while nothing comes), deletes what it read, and hands
 * each message to the first pending receive it matches in post order
 * (same sender or any, same tag), keeping the others for the receives
 * to come. A size or dtype that differs from the receive's fails the
 * receive with EMISMATCH (the send has completed). Correct, slow: every
 * byte crosses cohortd twice.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"
#include "backend/worker.h"

#define SVC_DEFAULT_CHUNK (16u << 20)

/* The bytes a reply (a collective's part, a point-to-point chunk) carries
 * at most: COHORT_SERVICE_CHUNK within 1 .. 3 x the default, else the
 * default. */
static size_t
svc_chunk(void)
{
	const char *env = cohort__knob_str(COHORT__KNOB_SERVICE_CHUNK);
	int64_t v;

	if (env != NULL && cohort__parse_i64(env, &v) && v >= 1
	    && v <= (int64_t)SVC_DEFAULT_CHUNK * 3)
		return ((size_t)v);
	return (SVC_DEFAULT_CHUNK);
}

static uint64_t
host_get_be_svc(const uint8_t *p, int bytes)
{
	uint64_t v = 0;

	for (int i = 0; i < bytes; i++)
		v = v << 8 | p[i];
	return (v);
}

struct svc {
	struct cohort__group_desc d; /* a copy; what it points to lives on */
	size_t max_reply; /* bytes of one reply */
	struct cohort__iov *parts; /* size entries */
	/* Aligned copy of a contribution: the pieces of a reply sit at any
	 * byte offset, and the reduction kernels load whole elements. */
	uint8_t *scratch;
	size_t scratch_len;
};

/* The shape of an operation: along which length it is chunked and how the
 * contributions are laid out. */
struct svc_shape {
	size_t blk; /* elements along the chunked dimension */
	size_t mult; /* sub-blocks per contribution (n or 1) */
	int senders; /* ranks that contribute (n, or 1: the root) */
	size_t es;
};

static void
svc_shape(
    const struct svc *s, const struct cohort__op *op, struct svc_shape *sh)
{
	size_t n = (size_t)s->d.size;

	sh->es = cohort_dtype_size(op->dtype);
	sh->blk = op->count;
	sh->mult = 1;
	sh->senders = s->d.size;
	switch (op->kind) {
	case COHORT__OP_BROADCAST:
		sh->senders = 1;
		break;
	case COHORT__OP_SCATTER:
		sh->senders = 1;
		sh->mult = n;
		break;
	case COHORT__OP_REDUCE_SCATTER:
	case COHORT__OP_ALLTOALL:
		sh->mult = n;
		break;
	case COHORT__OP_ALLGATHERV:
		sh->blk = 0;
		for (int q = 0; q < s->d.size; q++)
			if (op->counts[q] > sh->blk)
				sh->blk = op->counts[q];
		break;
	case COHORT__OP_BARRIER:
		sh->blk = 0;
		sh->es = 1;
		break;
	default:
		break;
	}
}

/* Elements [a, b) of chunk bounds clipped to c. */
static size_t
svc_clip(size_t a, size_t b, size_t c, size_t *start)
{
	size_t lo = a < c ? a : c, hi = b < c ? b : c;

	*start = lo;
	return (hi - lo);
}

/* Bytes rank q contributes to chunk [a, b). */
static size_t
svc_len(const struct svc *s, const struct cohort__op *op,
    const struct svc_shape *sh, int q, size_t a, size_t b)
{
	size_t start;

	switch (op->kind) {
	case COHORT__OP_BROADCAST:
	case COHORT__OP_SCATTER:
		if (q != op->root)
			return (0);
		break;
	case COHORT__OP_ALLGATHERV:
		return (svc_clip(a, b, op->counts[q], &start) * sh->es);
	case COHORT__OP_BARRIER:
		return (0);
	default:
		break;
	}
	return ((b - a) * sh->mult * sh->es);
}

/* This rank's payload for chunk [a, b) into s->parts. */
static size_t
svc_parts(struct svc *s, const struct cohort__op *op,
    const struct svc_shape *sh, size_t a, size_t b)
{
	const uint8_t *src = op->send;
	size_t len = (b - a) * sh->es, start, n;

	if (svc_len(s, op, sh, s->d.rank, a, b) == 0)
		return (0);
	switch (op->kind) {
	case COHORT__OP_BROADCAST:
		s->parts[0].base = (const uint8_t *)op->recv + a * sh->es;
		s->parts[0].len = len;
		return (1);
	case COHORT__OP_ALLGATHERV:
		n = svc_clip(a, b, op->counts[s->d.rank], &start);
		s->parts[0].base = src + start * sh->es;
		s->parts[0].len = n * sh->es;
		return (1);
	case COHORT__OP_SCATTER:
	case COHORT__OP_REDUCE_SCATTER:
	case COHORT__OP_ALLTOALL:
		for (int j = 0; j < s->d.size; j++) {
			s->parts[j].base
			    = src + ((size_t)j * op->count + a) * sh->es;
			s->parts[j].len = len;
		}
		return ((size_t)s->d.size);
	default:
		s->parts[0].base = src + a * sh->es;
		s->parts[0].len = len;
		return (1);
	}
}

/* src itself when aligned for es-byte elements, else a copy in the
 * scratch buffer (NULL when it cannot grow). */
static const uint8_t *
svc_aligned(struct svc *s, const uint8_t *src, size_t bytes, size_t es)
{
	if ((uintptr_t)src % es == 0)
		return (src);
	if (s->scratch_len < bytes) {
		uint8_t *nb = realloc(s->scratch, bytes);

		if (nb == NULL)
			return (NULL);
		s->scratch = nb;
		s->scratch_len = bytes;
	}
	memcpy(s->scratch, src, bytes);
	return (s->scratch);
}

/* Computes this rank's share of the result of chunk [a, b) from the
 * contributions p[q]. Returns false when out of memory. */
static bool
svc_consume(struct svc *s, const struct cohort__op *op,
    const struct svc_shape *sh, size_t a, size_t b, const uint8_t *const *p)
{
	uint8_t *dst = op->recv;
	size_t len = b - a, bytes = len * sh->es, off, start, n;
	int r = s->d.rank;

	switch (op->kind) {
	case COHORT__OP_REDUCE:
		if (r != op->root)
			return (true);
		/* FALLTHROUGH */
	case COHORT__OP_ALLREDUCE:
	case COHORT__OP_REDUCE_SCATTER:
		/* reduce_scatter: our block is sub-block r of each. */
		off = op->kind == COHORT__OP_REDUCE_SCATTER ? (size_t)r * bytes
		                                            : 0;
		dst += a * sh->es;
		memcpy(dst, p[0] + off, bytes);
		for (int q = 1; q < s->d.size; q++) {
			const uint8_t *src
			    = svc_aligned(s, p[q] + off, bytes, sh->es);

			if (src == NULL)
				return (false);
			cohort__reduce(dst, src, len, op->dtype, op->op);
		}
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    dst, len, op->dtype, (double)s->d.size);
		return (true);
	case COHORT__OP_BROADCAST:
		if (r != op->root)
			memcpy(dst + a * sh->es, p[op->root], bytes);
		return (true);
	case COHORT__OP_GATHER:
		if (r != op->root)
			return (true);
		/* FALLTHROUGH */
	case COHORT__OP_ALLGATHER:
		for (int q = 0; q < s->d.size; q++)
			memcpy(dst + ((size_t)q * op->count + a) * sh->es,
			    p[q], bytes);
		return (true);
	case COHORT__OP_ALLGATHERV:
		off = 0;
		for (int q = 0; q < s->d.size; q++) {
			n = svc_clip(a, b, op->counts[q], &start);
			if (n > 0)
				memcpy(dst + (off + start) * sh->es, p[q],
				    n * sh->es);
			off += op->counts[q];
		}
		return (true);
	case COHORT__OP_ALLTOALL:
		for (int q = 0; q < s->d.size; q++)
			memcpy(dst + ((size_t)q * op->count + a) * sh->es,
			    p[q] + (size_t)r * bytes, bytes);
		return (true);
	case COHORT__OP_SCATTER:
		memcpy(
		    dst + a * sh->es, p[op->root] + (size_t)r * bytes, bytes);
		return (true);
	case COHORT__OP_BARRIER:
	case COHORT__OP_ALLTOALLV: /* svc_alltoallv */
	case COHORT__OP_SEND:
	case COHORT__OP_RECV:
		return (true);
	}
	return (true);
}

/* One gather at cohortd for chunk [a, b). */
static cohort_status
svc_gather(struct svc *s, const struct cohort__op *op,
    const struct svc_shape *sh, size_t a, size_t b, char *err, size_t errlen,
    cohort__time deadline)
{
	struct cohort__chan_gather cg;
	const uint8_t *p[64];
	const uint8_t **pp = p;
	char why[COHORT__DETAIL_MAX];
	cohort_status st;
	size_t off = 0;
	const char *what = cohort__op_name(op->kind);

	if (atomic_load_explicit(s->d.abort_flag, memory_order_acquire) != 0) {
		snprintf(
		    err, errlen, "%s #%" PRIu64 " aborted", what, op->seq);
		return (COHORT_EABORTED);
	}
	memset(&cg, 0, sizeof(cg));
	cg.shape.kind = (uint32_t)op->kind;
	cg.shape.op = (uint32_t)op->op;
	cg.shape.dtype = (uint32_t)op->dtype;
	cg.shape.root = op->root;
	cg.shape.count = op->count;
	cg.parts = s->parts;
	cg.nparts = svc_parts(s, op, sh, a, b);
	why[0] = '\0';
	if ((st = s->d.chan.gather(
	         s->d.chan.ctx, &cg, why, sizeof(why), deadline))
	    != COHORT_OK) {
		snprintf(err, errlen, "%s #%" PRIu64 " through cohortd: %s",
		    what, op->seq, why);
		return (st);
	}
	/* Waiting for peers: the time parked at cohortd for the others. */
	if (op->stats != NULL)
		op->stats->wait_ns += cg.wait_ns;
	st = COHORT_EPROTO;
	if (cg.nlens != (size_t)s->d.size) {
		snprintf(err, errlen,
		    "%s #%" PRIu64 ": malformed reply "
		    "from cohortd",
		    what, op->seq);
		goto out;
	}
	if (s->d.size > 64
	    && (pp = malloc(sizeof(*pp) * (size_t)s->d.size)) == NULL) {
		st = COHORT_ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	for (int q = 0; q < s->d.size; q++) {
		size_t want = svc_len(s, op, sh, q, a, b);

		if (cg.lens[q] < 0 || (size_t)cg.lens[q] != want
		    || want > cg.len - off) {
			snprintf(err, errlen,
			    "%s #%" PRIu64 ": rank %d sent "
			    "%" PRId64 " bytes, expected %zu (do the ranks "
			    "agree on the arguments?)",
			    what, op->seq, s->d.global_ranks[q], cg.lens[q],
			    want);
			goto out;
		}
		pp[q] = cg.data + off;
		off += want;
	}
	if (off != cg.len) {
		snprintf(err, errlen,
		    "%s #%" PRIu64 ": reply carries %zu "
		    "bytes, expected %zu",
		    what, op->seq, cg.len, off);
		goto out;
	}
	if (!svc_consume(s, op, sh, a, b, pp)) {
		st = COHORT_ENOMEM;
		snprintf(err, errlen, "out of memory");
		goto out;
	}
	st = COHORT_OK;
out:
	if (pp != p)
		free(pp);
	s->d.chan.release(s->d.chan.ctx, &cg);
	return (st);
}

/* ------------------------------------------------------------------------ */
/* alltoallv                                                                */
/* ------------------------------------------------------------------------ */

/* One gather of this rank's parts; on COHORT_OK the caller releases cg. */
static cohort_status
svc_gather_raw(struct svc *s, const struct cohort__op *op,
    struct cohort__chan_gather *cg, const struct cohort__iov *parts,
    size_t nparts, char *err, size_t errlen, cohort__time deadline)
{
	char why[COHORT__DETAIL_MAX];
	cohort_status st;

	if (atomic_load_explicit(s->d.abort_flag, memory_order_acquire) != 0) {
		snprintf(
		    err, errlen, "alltoallv #%" PRIu64 " aborted", op->seq);
		return (COHORT_EABORTED);
	}
	memset(cg, 0, sizeof(*cg));
	cg->shape.kind = (uint32_t)op->kind;
	cg->shape.dtype = (uint32_t)op->dtype;
	cg->parts = parts;
	cg->nparts = nparts;
	why[0] = '\0';
	if ((st = s->d.chan.gather(
	         s->d.chan.ctx, cg, why, sizeof(why), deadline))
	    != COHORT_OK) {
		snprintf(err, errlen,
		    "alltoallv #%" PRIu64 " through cohortd: %s", op->seq,
		    why);
		return (st);
	}
	if (cg->nlens != (size_t)s->d.size) {
		s->d.chan.release(s->d.chan.ctx, cg);
		snprintf(err, errlen,
		    "alltoallv #%" PRIu64 ": malformed reply from cohortd",
		    op->seq);
		return (COHORT_EPROTO);
	}
	return (COHORT_OK);
}

/* Every rank's counts (S[q][j]: q sends to j; R[q][j]: q receives from
 * j), checked pair by pair, the same verdict on every rank. */
static cohort_status
svc_a2av_counts(struct svc *s, const struct cohort__op *op, uint64_t *S,
    char *err, size_t errlen, cohort__time deadline)
{
	size_t n = (size_t)s->d.size, off = 0;
	struct cohort__chan_gather cg;
	struct cohort__iov part;
	uint8_t *mine;
	cohort_status st;

	if ((mine = malloc(16 * n)) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	for (size_t j = 0; j < n; j++) {
		for (int b = 0; b < 8; b++) {
			mine[8 * j + (size_t)b]
			    = (uint8_t)(op->counts[j] >> (56 - 8 * b));
			mine[8 * (n + j) + (size_t)b]
			    = (uint8_t)(op->rcounts[j] >> (56 - 8 * b));
		}
	}
	part.base = mine;
	part.len = 16 * n;
	st = svc_gather_raw(s, op, &cg, &part, 1, err, errlen, deadline);
	free(mine);
	if (st != COHORT_OK)
		return (st);
	for (size_t q = 0; q < n; q++)
		if (cg.lens[q] != (int64_t)(16 * n) || cg.len < off + 16 * n) {
			s->d.chan.release(s->d.chan.ctx, &cg);
			snprintf(err, errlen,
			    "alltoallv #%" PRIu64 ": rank %d sent counts of "
			    "%" PRId64 " bytes, expected %zu",
			    op->seq, s->d.global_ranks[q], cg.lens[q], 16 * n);
			return (COHORT_EPROTO);
		}
	st = COHORT_OK;
	for (size_t q = 0; q < n; q++)
		for (size_t j = 0; j < n; j++) {
			const uint8_t *row = cg.data + q * 16 * n;
			uint64_t sv = 0;

			for (int b = 0; b < 8; b++)
				sv = sv << 8 | row[8 * j + (size_t)b];
			S[q * n + j] = sv;
		}
	for (size_t q = 0; q < n && st == COHORT_OK; q++)
		for (size_t j = 0; j < n; j++) {
			const uint8_t *row = cg.data + j * 16 * n;
			uint64_t rv = 0;

			for (int b = 0; b < 8; b++)
				rv = rv << 8 | row[8 * (n + q) + (size_t)b];
			if (S[q * n + j] != rv) {
				snprintf(err, errlen,
				    "alltoallv #%" PRIu64 ": ranks disagree: "
				    "rank %d sends %" PRIu64 " elements to "
				    "rank %d, which expects %" PRIu64,
				    op->seq, s->d.global_ranks[q],
				    S[q * n + j], s->d.global_ranks[j], rv);
				st = COHORT_EMISMATCH;
				break;
			}
		}
	s->d.chan.release(s->d.chan.ctx, &cg);
	return (st);
}

static cohort_status
svc_alltoallv(struct svc *s, const struct cohort__op *op, char *err,
    size_t errlen, cohort__time deadline)
{
	size_t n = (size_t)s->d.size, es = cohort_dtype_size(op->dtype);
	size_t r = (size_t)s->d.rank, chunk, most = 0, *tot;
	struct cohort__iov *parts = s->parts;
	uint64_t *S;
	cohort_status st;

	if ((S = malloc(n * n * sizeof(*S))) == NULL
	    || (tot = calloc(n, sizeof(*tot))) == NULL) {
		free(S);
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	if ((st = svc_a2av_counts(s, op, S, err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	for (size_t q = 0; q < n; q++) {
		for (size_t j = 0; j < n; j++)
			tot[q] += (size_t)S[q * n + j];
		if (tot[q] > most)
			most = tot[q];
	}
	/* n rows of at most chunk elements fit one reply. */
	if ((chunk = s->max_reply / (es * n)) == 0)
		chunk = 1;
	for (size_t a = 0; a < most; a += chunk) {
		size_t b = most - a < chunk ? most : a + chunk;
		struct cohort__chan_gather cg;
		size_t np = 0, off = 0, pos = 0;

		/* This rank's row [a, b): its send blocks end to end. */
		for (size_t j = 0; j < n; j++) {
			size_t lo = pos, hi = pos + op->counts[j];

			pos = hi;
			if (hi <= a || lo >= b)
				continue;
			lo = lo < a ? a : lo;
			hi = hi > b ? b : hi;
			parts[np].base = (const uint8_t *)op->send
			    + (op->sdispls[j] + (lo - (pos - op->counts[j])))
			        * es;
			parts[np++].len = (hi - lo) * es;
		}
		if ((st = svc_gather_raw(
		         s, op, &cg, parts, np, err, errlen, deadline))
		    != COHORT_OK)
			goto out;
		for (size_t q = 0; q < n && st == COHORT_OK; q++) {
			size_t want
			    = (tot[q] > a ? (tot[q] < b ? tot[q] : b) - a : 0)
			    * es;
			size_t lo = 0;

			if (cg.lens[q] != (int64_t)want
			    || cg.len < off + want) {
				snprintf(err, errlen,
				    "alltoallv #%" PRIu64 ": rank %d sent "
				    "%" PRId64 " bytes, expected %zu",
				    op->seq, s->d.global_ranks[q], cg.lens[q],
				    want);
				st = COHORT_EPROTO;
				break;
			}
			/* Block r of q's row: [lo, lo + S[q][r]). */
			for (size_t j = 0; j < r; j++)
				lo += (size_t)S[q * n + j];
			{
				size_t hi = lo + (size_t)S[q * n + r];
				size_t x = lo > a ? lo : a,
				       y = hi < b ? hi : b;

				if (x < y)
					memcpy((uint8_t *)op->recv
					        + (op->rdispls[q] + (x - lo))
					            * es,
					    cg.data + off + (x - a) * es,
					    (y - x) * es);
			}
			off += want;
		}
		s->d.chan.release(s->d.chan.ctx, &cg);
		if (st != COHORT_OK)
			goto out;
	}
out:
	free(S);
	free(tot);
	return (st);
}

static cohort_status
svc_run(void *arg, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	struct svc *s = arg;
	struct svc_shape sh;
	size_t chunk, per;
	cohort_status st;

	if (op->kind == COHORT__OP_ALLTOALLV)
		return (svc_alltoallv(s, op, err, errlen, deadline));
	if (op->kind == COHORT__OP_SEND || op->kind == COHORT__OP_RECV) {
		snprintf(err, errlen, "%s is not a collective",
		    cohort__op_name(op->kind));
		return (COHORT_EINVAL);
	}
	svc_shape(s, op, &sh);
	if (sh.blk == 0)
		return (svc_gather(s, op, &sh, 0, 0, err, errlen, deadline));
	per = sh.es * sh.mult * (size_t)sh.senders;
	chunk = s->max_reply / per;
	if (chunk == 0)
		chunk = 1;
	for (size_t a = 0; a < sh.blk; a += chunk) {
		size_t b = sh.blk - a < chunk ? sh.blk : a + chunk;

		if ((st = svc_gather(s, op, &sh, a, b, err, errlen, deadline))
		    != COHORT_OK)
			return (st);
	}
	return (COHORT_OK);
}

static cohort_status
svc_init(const struct cohort__group_desc *desc, void **state, char *err,
    size_t errlen, cohort__time deadline)
{
	struct svc *s;

	if (desc->chan.gather == NULL) {
		snprintf(err, errlen,
		    "the service backend needs a group with a channel to "
		    "the coordinator");
		return (COHORT_ENOTSUP);
	}
	if ((s = calloc(1, sizeof(*s))) == NULL
	    || (s->parts = calloc((size_t)desc->size, sizeof(*s->parts)))
	        == NULL) {
		free(s);
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	s->d = *desc;
	s->max_reply = svc_chunk();
	*state = s;
	return (COHORT_OK);
}

static void
svc_abort(void *arg)
{
	struct svc *s = arg;

	s->d.chan.abort(s->d.chan.ctx);
}

static void
svc_fini(void *arg)
{
	struct svc *s = arg;

	if (s == NULL)
		return;
	free(s->scratch);
	free(s->parts);
	free(s);
}

/* ------------------------------------------------------------------------ */
/* Point-to-point: mailboxes in the KV                                      */
/* ------------------------------------------------------------------------ */

/* "SP1" 0, src(4), tag(4), dtype + 3 zero bytes, bytes(8), chunks(4) */
#define SVCP_HDR 28
#define SVCP_SLICE_MS                                                         \
	200 /* the reader's KV wait, per try (an abort waits for it) */

/* A message read from the box that no receive took yet. */
struct svcp_msg {
	int src;
	uint32_t tag;
	cohort_dtype dtype;
	size_t bytes;
	uint8_t *data;
	struct svcp_msg *next;
};

struct svcp {
	struct cohort__group_desc d; /* a copy; what it points to lives on */
	size_t chunk; /* bytes per KV value */
	pthread_mutex_t mtx;
	pthread_cond_t cv; /* a receive posted, or stop */
	struct cohort__p2p *pending; /* receives, in post order */
	struct svcp_msg *kept, *kept_tail; /* unmatched, in arrival order */
	int64_t next; /* the box's next slot to read */
	pthread_t reader;
	atomic_int stop;
	bool closing;
	cohort_status broken;
	char broken_err[512];
};

static void
svcp_key(const struct svcp *ps, char *key, size_t len, int dst, int64_t slot,
    int chunk)
{
	if (slot < 0)
		snprintf(key, len, "p2p/box/%d/n", dst);
	else if (chunk == 0)
		snprintf(key, len, "p2p/box/%d/%" PRId64, dst, slot);
	else
		snprintf(
		    key, len, "p2p/box/%d/%" PRId64 "/%d", dst, slot, chunk);
	(void)ps;
}

static void
svcp_what(
    const struct svcp *ps, const struct cohort__p2p *r, char *buf, size_t len)
{
	if (r->kind == COHORT__OP_RECV && r->peer == COHORT__P2P_ANY)
		snprintf(buf, len,
		    "recv #%" PRIu64 " from any rank (tag %" PRIu32 ")",
		    r->seq, r->tag);
	else
		snprintf(buf, len,
		    "%s #%" PRIu64 " %s rank %d (tag %" PRIu32 ")",
		    r->kind == COHORT__OP_SEND ? "send" : "recv", r->seq,
		    r->kind == COHORT__OP_SEND ? "to" : "from",
		    (int)ps->d.global_ranks[r->peer], r->tag);
}

/* Fills receive r from message m (which the caller frees). */
static void
svcp_deliver(struct svcp *ps, struct cohort__p2p *r, const struct svcp_msg *m)
{
	char what[128];

	r->source = m->src;
	if (m->bytes != r->bytes || m->dtype != r->dtype) {
		svcp_what(ps, r, what, sizeof(what));
		snprintf(r->err, sizeof(r->err),
		    "%s: rank %d sent %zu bytes of %s, this recv takes %zu "
		    "bytes of %s",
		    what, (int)ps->d.global_ranks[m->src], m->bytes,
		    cohort_dtype_name(m->dtype), r->bytes,
		    cohort_dtype_name(r->dtype));
		r->st = COHORT_EMISMATCH;
		return;
	}
	if (m->bytes > 0)
		memcpy(r->buf, m->data, m->bytes);
	r->st = COHORT_OK;
}

static bool
svcp_matches(const struct cohort__p2p *r, const struct svcp_msg *m)
{
	return (r->tag == m->tag
	    && (r->peer == COHORT__P2P_ANY || r->peer == m->src));
}

/* Reads slot ps->next of our box (waiting at most until `until`):
 * COHORT_OK and *out, COHORT_ETIMEDOUT when nothing came, or the
 * store's failure. */
static cohort_status
svcp_read(struct svcp *ps, struct svcp_msg **out, cohort__time until,
    char *err, size_t errlen)
{
	char key[COHORT__MAX_KEY];
	uint8_t *hdr = NULL;
	size_t len = 0, off;
	uint32_t chunks;
	struct svcp_msg *m;
	cohort_status st;
	int me = ps->d.rank;

	svcp_key(ps, key, sizeof(key), me, ps->next, 0);
	if ((st = ps->d.store.get(
	         ps->d.store.ctx, key, (void **)&hdr, &len, until))
	    != COHORT_OK)
		return (st);
	if (len < SVCP_HDR || memcmp(hdr, "SP1", 4) != 0
	    || host_get_be_svc(hdr + 4, 4) >= (uint64_t)ps->d.size
	    || hdr[12] >= COHORT_DTYPE_COUNT) {
		free(hdr);
		snprintf(err, errlen, "a malformed message in slot %" PRId64,
		    ps->next);
		return (COHORT_EPROTO);
	}
	if ((m = calloc(1, sizeof(*m))) == NULL) {
		free(hdr);
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	m->src = (int)host_get_be_svc(hdr + 4, 4);
	m->tag = (uint32_t)host_get_be_svc(hdr + 8, 4);
	m->dtype = (cohort_dtype)hdr[12];
	m->bytes = (size_t)host_get_be_svc(hdr + 16, 8);
	chunks = (uint32_t)host_get_be_svc(hdr + 24, 4);
	if (chunks == 0) {
		free(hdr);
		free(m);
		snprintf(err, errlen, "a malformed message in slot %" PRId64,
		    ps->next);
		return (COHORT_EPROTO);
	}
	/* The value: header, then the bytes (the first chunk); the rest in
	 * the chunk keys. */
	if ((m->data = malloc(m->bytes > 0 ? m->bytes : 1)) == NULL) {
		free(hdr);
		free(m);
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	off = len - SVCP_HDR;
	if (off > m->bytes) {
		free(hdr);
		free(m->data);
		free(m);
		snprintf(err, errlen, "a malformed message in slot %" PRId64,
		    ps->next);
		return (COHORT_EPROTO);
	}
	memcpy(m->data, hdr + SVCP_HDR, off);
	free(hdr);
	for (int c = 1; off < m->bytes; c++) {
		void *v = NULL;
		size_t vl = 0;

		svcp_key(ps, key, sizeof(key), me, ps->next, c);
		st = ps->d.store.get(
		    ps->d.store.ctx, key, &v, &vl, cohort__now_ms() + 30000);
		if (st != COHORT_OK || vl > m->bytes - off || vl == 0) {
			free(v);
			free(m->data);
			free(m);
			snprintf(err, errlen,
			    "chunk %d of the message in slot %" PRId64 ": %s",
			    c, ps->next,
			    st != COHORT_OK ? cohort_status_name(st)
			                    : "malformed");
			return (st != COHORT_OK ? st : COHORT_EPROTO);
		}
		memcpy(m->data + off, v, vl);
		off += vl;
		free(v);
		(void)ps->d.store.del(
		    ps->d.store.ctx, key, cohort__now_ms() + 10000);
	}
	svcp_key(ps, key, sizeof(key), me, ps->next, 0);
	(void)ps->d.store.del(ps->d.store.ctx, key, cohort__now_ms() + 10000);
	ps->next++;
	*out = m;
	return (COHORT_OK);
}

static void
svcp_done_all(struct cohort__p2p *list)
{
	struct cohort__p2p *next;

	for (; list != NULL; list = next) {
		next = list->next;
		list->next = NULL;
		list->done(list);
	}
}

/* Fails every pending receive (under mtx); returns them for done(). */
static struct cohort__p2p *
svcp_fail_pending(struct svcp *ps, cohort_status st, const char *why)
{
	struct cohort__p2p *list = ps->pending;
	char what[128];

	for (struct cohort__p2p *r = list; r != NULL; r = r->next) {
		svcp_what(ps, r, what, sizeof(what));
		snprintf(r->err, sizeof(r->err), "%s: %.360s", what, why);
		r->st = st;
	}
	ps->pending = NULL;
	return (list);
}

/* The reader: while receives are pending, the next slot of the box. */
static void *
svcp_reader(void *arg)
{
	struct svcp *ps = arg;
	char err[256];

	pthread_mutex_lock(&ps->mtx);
	for (;;) {
		struct cohort__p2p *done = NULL, **rp;
		struct svcp_msg *m = NULL;
		cohort__time until = COHORT__TIME_NEVER, now;
		cohort_status st;

		if (atomic_load(&ps->stop) != 0) {
			done = svcp_fail_pending(ps, COHORT_EABORTED,
			    ps->closing ? "the group's point-to-point state "
			                  "closed"
			                : "aborted");
			pthread_mutex_unlock(&ps->mtx);
			svcp_done_all(done);
			pthread_mutex_lock(&ps->mtx);
			if (ps->closing)
				break;
			pthread_cond_wait(&ps->cv, &ps->mtx);
			continue;
		}
		if (ps->pending == NULL || ps->broken != COHORT_OK) {
			pthread_cond_wait(&ps->cv, &ps->mtx);
			continue;
		}
		now = cohort__now_ms();
		for (struct cohort__p2p *r = ps->pending; r != NULL;
		     r = r->next)
			if (r->deadline < until)
				until = r->deadline;
		if (until <= now) {
			char what[128];
			struct cohort__p2p *r = ps->pending;

			for (; r != NULL && r->deadline > now; r = r->next)
				;
			svcp_what(ps, r, what, sizeof(what));
			ps->broken = COHORT_ETIMEDOUT;
			snprintf(ps->broken_err, sizeof(ps->broken_err),
			    "%s timed out: no message with its tag came "
			    "through cohortd",
			    what);
			done = svcp_fail_pending(
			    ps, COHORT_ETIMEDOUT, "timed out");
			for (struct cohort__p2p *x = done; x != NULL;
			     x = x->next)
				cohort__strlcpy(
				    x->err, ps->broken_err, sizeof(x->err));
			pthread_mutex_unlock(&ps->mtx);
			svcp_done_all(done);
			pthread_mutex_lock(&ps->mtx);
			continue;
		}
		if (until - now > SVCP_SLICE_MS)
			until = now + SVCP_SLICE_MS;
		pthread_mutex_unlock(&ps->mtx);
		err[0] = '\0';
		st = svcp_read(ps, &m, until, err, sizeof(err));
		pthread_mutex_lock(&ps->mtx);
		if (st == COHORT_ETIMEDOUT)
			continue;
		if (st != COHORT_OK) {
			ps->broken = st;
			snprintf(ps->broken_err, sizeof(ps->broken_err),
			    "reading this rank's mailbox at cohortd: %s",
			    err[0] ? err : cohort_status_name(st));
			done = svcp_fail_pending(ps, st, ps->broken_err);
			pthread_mutex_unlock(&ps->mtx);
			svcp_done_all(done);
			pthread_mutex_lock(&ps->mtx);
			continue;
		}
		for (rp = &ps->pending; *rp != NULL; rp = &(*rp)->next)
			if (svcp_matches(*rp, m))
				break;
		if (*rp == NULL) {
			if (ps->kept_tail != NULL)
				ps->kept_tail->next = m;
			else
				ps->kept = m;
			ps->kept_tail = m;
			continue;
		}
		done = *rp;
		*rp = done->next;
		done->next = NULL;
		svcp_deliver(ps, done, m);
		free(m->data);
		free(m);
		pthread_mutex_unlock(&ps->mtx);
		svcp_done_all(done);
		pthread_mutex_lock(&ps->mtx);
	}
	pthread_mutex_unlock(&ps->mtx);
	return (NULL);
}

static cohort_status
svcp_open(const struct cohort__group_desc *desc, void *state, void **out,
    char *err, size_t errlen, cohort__time deadline)
{
	struct svcp *ps;
	cohort_status st;

	(void)state;
	(void)deadline;
	if (desc->store.get == NULL || desc->store.set == NULL
	    || desc->store.add == NULL || desc->store.del == NULL) {
		snprintf(err, errlen,
		    "point-to-point through cohortd needs a store with add "
		    "and delete");
		return (COHORT_ENOTSUP);
	}
	if ((ps = calloc(1, sizeof(*ps))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	ps->d = *desc;
	ps->chunk = svc_chunk();
	ps->next = 1;
	atomic_init(&ps->stop, 0);
	if ((st = cohort__worker_start(&ps->mtx, &ps->cv, &ps->reader,
	         svcp_reader, ps, "mailbox reader", err, errlen))
	    != COHORT_OK) {
		free(ps);
		return (st);
	}
	*out = ps;
	return (COHORT_OK);
}

/* A send: the message written into the receiver's box, now. */
static void
svcp_send(struct svcp *ps, struct cohort__p2p *r)
{
	char key[COHORT__MAX_KEY], what[128];
	size_t first, off;
	uint32_t chunks;
	int64_t slot = 0;
	uint8_t *v;
	cohort_status st;

	svcp_what(ps, r, what, sizeof(what));
	chunks = r->bytes <= ps->chunk
	    ? 1
	    : (uint32_t)((r->bytes + ps->chunk - 1) / ps->chunk);
	first = r->bytes < ps->chunk ? r->bytes : ps->chunk;
	svcp_key(ps, key, sizeof(key), r->peer, -1, 0);
	if ((st = ps->d.store.add(ps->d.store.ctx, key, 1, &slot, r->deadline))
	    != COHORT_OK) {
		snprintf(r->err, sizeof(r->err),
		    "%s: taking a slot in its mailbox at cohortd: %s", what,
		    cohort_status_name(st));
		r->st = st;
		return;
	}
	/* Chunks beyond the first, then the header that makes it seen. */
	off = first;
	for (uint32_t c = 1; c < chunks; c++) {
		size_t len
		    = r->bytes - off < ps->chunk ? r->bytes - off : ps->chunk;

		svcp_key(ps, key, sizeof(key), r->peer, slot, (int)c);
		if ((st = ps->d.store.set(ps->d.store.ctx, key,
		         (const uint8_t *)r->buf + off, len, r->deadline))
		    != COHORT_OK) {
			snprintf(r->err, sizeof(r->err),
			    "%s: writing chunk %u at cohortd: %s", what, c,
			    cohort_status_name(st));
			r->st = st;
			return;
		}
		off += len;
	}
	if ((v = malloc(SVCP_HDR + first)) == NULL) {
		snprintf(r->err, sizeof(r->err), "%s: out of memory", what);
		r->st = COHORT_ENOMEM;
		return;
	}
	memset(v, 0, SVCP_HDR);
	memcpy(v, "SP1", 4);
	for (int b = 0; b < 4; b++) {
		v[4 + b] = (uint8_t)((uint32_t)ps->d.rank >> (24 - 8 * b));
		v[8 + b] = (uint8_t)(r->tag >> (24 - 8 * b));
		v[24 + b] = (uint8_t)(chunks >> (24 - 8 * b));
	}
	v[12] = (uint8_t)r->dtype;
	for (int b = 0; b < 8; b++)
		v[16 + b] = (uint8_t)((uint64_t)r->bytes >> (56 - 8 * b));
	if (first > 0)
		memcpy(v + SVCP_HDR, r->buf, first);
	svcp_key(ps, key, sizeof(key), r->peer, slot, 0);
	st = ps->d.store.set(
	    ps->d.store.ctx, key, v, SVCP_HDR + first, r->deadline);
	free(v);
	if (st != COHORT_OK) {
		snprintf(r->err, sizeof(r->err),
		    "%s: writing it at cohortd: %s", what,
		    cohort_status_name(st));
		r->st = st;
		return;
	}
	r->st = COHORT_OK;
}

static cohort_status
svcp_post(void *arg, struct cohort__p2p *const *reqs, size_t n, char *err,
    size_t errlen)
{
	struct svcp *ps = arg;
	struct cohort__p2p *done = NULL, **dtail = &done;

	for (size_t i = 0; i < n; i++) {
		const struct cohort__p2p *r = reqs[i];

		if (r->peer == ps->d.rank
		    || ((r->peer < 0 || r->peer >= ps->d.size)
		        && (r->kind != COHORT__OP_RECV
		            || r->peer != COHORT__P2P_ANY))) {
			snprintf(err, errlen, "transfer %zu: bad peer %d", i,
			    r->peer);
			return (COHORT_EINVAL);
		}
		if (r->bytes > (size_t)UINT32_MAX * ps->chunk) {
			snprintf(err, errlen, "transfer %zu: too large", i);
			return (COHORT_EINVAL);
		}
	}
	pthread_mutex_lock(&ps->mtx);
	if (atomic_load(&ps->stop) != 0 || ps->broken != COHORT_OK) {
		cohort_status st = cohort__p2p_unusable(
		    ps->broken, ps->broken_err, err, errlen);

		pthread_mutex_unlock(&ps->mtx);
		return (st);
	}
	/* Receives first: a message already read may be theirs. */
	for (size_t i = 0; i < n; i++) {
		struct cohort__p2p *r = reqs[i], **rp;
		struct svcp_msg **mp, *m;

		if (r->kind != COHORT__OP_RECV)
			continue;
		r->next = NULL;
		r->source = -1;
		for (mp = &ps->kept; *mp != NULL; mp = &(*mp)->next)
			if (svcp_matches(r, *mp))
				break;
		if ((m = *mp) != NULL) {
			*mp = m->next;
			if (ps->kept_tail == m) {
				ps->kept_tail = NULL;
				for (struct svcp_msg *k = ps->kept; k != NULL;
				     k = k->next)
					ps->kept_tail = k;
			}
			svcp_deliver(ps, r, m);
			free(m->data);
			free(m);
			*dtail = r;
			dtail = &r->next;
			continue;
		}
		for (rp = &ps->pending; *rp != NULL; rp = &(*rp)->next)
			;
		*rp = r;
	}
	pthread_cond_signal(&ps->cv);
	pthread_mutex_unlock(&ps->mtx);
	/* Sends: written at cohortd in this thread (they wait for nobody). */
	for (size_t i = 0; i < n; i++) {
		struct cohort__p2p *r = reqs[i];

		if (r->kind != COHORT__OP_SEND)
			continue;
		r->next = NULL;
		svcp_send(ps, r);
		*dtail = r;
		dtail = &r->next;
	}
	svcp_done_all(done);
	return (COHORT_OK);
}

static void
svcp_abort(void *arg)
{
	struct svcp *ps = arg;

	if (ps == NULL)
		return;
	atomic_store(&ps->stop, 1);
	/* The reader sees it within a slice of its KV wait. */
	if (pthread_mutex_trylock(&ps->mtx) == 0) {
		pthread_cond_signal(&ps->cv);
		pthread_mutex_unlock(&ps->mtx);
	}
}

static void
svcp_close(void *arg)
{
	struct svcp *ps = arg;
	struct svcp_msg *m, *next;

	if (ps == NULL)
		return;
	cohort__worker_stop(
	    &ps->mtx, &ps->cv, ps->reader, &ps->closing, &ps->stop);
	for (m = ps->kept; m != NULL; m = next) {
		next = m->next;
		free(m->data);
		free(m);
	}
	free(ps);
}

const struct cohort__backend_ops cohort__service_backend = {
	.version = COHORT__BACKEND_VERSION,
	.name = "service",
	.init = svc_init,
	.run = svc_run,
	.abort = svc_abort,
	.fini = svc_fini,
	.p2p_open = svcp_open,
	.p2p_post = svcp_post,
	.p2p_abort = svcp_abort,
	.p2p_close = svcp_close,
	.p2p_needs_state = false,
};
