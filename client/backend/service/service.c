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
 */
#include <inttypes.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/backend.h"

#define SVC_DEFAULT_CHUNK (16u << 20)

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

static cohort_status
svc_run(void *arg, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	struct svc *s = arg;
	struct svc_shape sh;
	size_t chunk, per;
	cohort_status st;

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
	const char *env = cohort__knob_str(COHORT__KNOB_SERVICE_CHUNK);
	int64_t v;
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
	s->max_reply = SVC_DEFAULT_CHUNK;
	if (env != NULL && cohort__parse_i64(env, &v) && v >= 1
	    && v <= (int64_t)SVC_DEFAULT_CHUNK * 3)
		s->max_reply = (size_t)v;
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

const struct cohort__backend_ops cohort__service_backend = {
	.version = COHORT__BACKEND_VERSION,
	.name = "service",
	.init = svc_init,
	.run = svc_run,
	.abort = svc_abort,
	.fini = svc_fini,
};
