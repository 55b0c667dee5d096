/*
 * staged.c - the "tcp-staged" data-plane backend: collectives on device
 * memory, carried by the host backend (client/backend/host/) through pinned
 * host buffers.
 *
 * For when NCCL cannot be used: several ranks on one GPU (NCCL refuses
 * two ranks of a communicator on the same device), no NCCL library, or a
 * network NCCL cannot use. Per operation:
 *
 *   1. the inputs this rank contributes are copied device -> pinned host
 *      (cudaMemcpyAsync on op->stream, so they follow the work already
 *      queued there, e.g. the backward pass that produced a gradient);
 *   2. the copies are waited for by polling an event, bounded by the
 *      deadline and the abort flags;
 *   3. the host backend runs the operation on the host buffers (send and
 *      recv staged separately, so the host operation never sees aliasing
 *      and every in-place form of cohort.h works);
 *   4. the results are copied host -> device on op->stream and waited
 *      for the same way.
 *
 * The pinned buffers (cudaMallocHost) are kept in the state and grown
 * when an operation needs more. cudaMemcpyDefault lets any pointer kind
 * through (device, managed, even host memory). The CUDA runtime is the
 * one nccl_loader.c loads: without a usable GPU init returns
 * COHORT_ENOTSUP and nothing else happens. Statuses are the host backend's,
 * plus COHORT_ECUDA for a failed copy (the connections stay usable) and
 * ETIMEDOUT / EABORTED when the stream does not reach the copies in time.
 */
#include <inttypes.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/backend.h"
#include "backend/cudart.h"

#define STAGED_SPIN_US 20
#define STAGED_NAP_US 50
#define STAGED_NAP_UNTIL_US 5000
#define STAGED_SLEEP_US 1000

struct staged_buf {
	void *p; /* pinned host memory */
	size_t len;
};

struct staged_state {
	const struct cohort__dl_cudart *cu;
	void *tcp; /* the wrapped host backend's state */
	void *event;
	int rank;
	int size;
	atomic_int *group_abort;
	atomic_int aborted;
	struct staged_buf hsend;
	struct staged_buf hrecv;
};

static bool
staged_aborted(const struct staged_state *s)
{
	if (s->group_abort != NULL
	    && atomic_load_explicit(s->group_abort, memory_order_acquire) != 0)
		return (true);
	return (atomic_load_explicit(&s->aborted, memory_order_acquire) != 0);
}

static cohort_status
staged_cuda_failed(const struct staged_state *s, const char *call, int e,
    const struct cohort__op *op, char *err, size_t errlen)
{
	char text[200];

	snprintf(err, errlen,
	    "%s failed during operation #%" PRIu64 " (tcp-staged): %s", call,
	    op->seq, cohort__dl_cuda_errtext(s->cu, e, text, sizeof(text)));
	(void)s->cu->GetLastError();
	return (COHORT_ECUDA);
}

static cohort_status
staged_grow(struct staged_state *s, struct staged_buf *b, size_t len,
    const struct cohort__op *op, char *err, size_t errlen)
{
	int e;

	if (len <= b->len)
		return (COHORT_OK);
	if ((e = cohort__dl_cuda_grow(s->cu->MallocHost, s->cu->FreeHost,
	         &b->p, &b->len, len < 4096 ? 4096 : len))
	    != COHORT__CUDA_SUCCESS)
		return (staged_cuda_failed(
		    s, "cudaMallocHost", e, op, err, errlen));
	return (COHORT_OK);
}

static cohort_status
staged_copy(struct staged_state *s, void *dst, const void *src, size_t len,
    const struct cohort__op *op, char *err, size_t errlen)
{
	int e;

	if (len == 0)
		return (COHORT_OK);
	if ((e = s->cu->MemcpyAsync(
	         dst, src, len, COHORT__CUDA_MEMCPY_DEFAULT, op->stream))
	    != COHORT__CUDA_SUCCESS)
		return (staged_cuda_failed(
		    s, "cudaMemcpyAsync", e, op, err, errlen));
	return (COHORT_OK);
}

/* Waits for the copies queued on op->stream: spin briefly, then sleep,
 * watching the deadline and the abort flags. */
static cohort_status
staged_sync(struct staged_state *s, const struct cohort__op *op,
    const char *what, char *err, size_t errlen, cohort__time deadline)
{
	uint64_t t0 = cohort__now_ns() / 1000;
	int e;

	if ((e = s->cu->EventRecord(s->event, op->stream))
	    != COHORT__CUDA_SUCCESS)
		return (staged_cuda_failed(
		    s, "cudaEventRecord", e, op, err, errlen));
	for (;;) {
		uint64_t el;
		struct timespec ts = { 0, 0 };

		e = s->cu->EventQuery(s->event);
		if (e == COHORT__CUDA_SUCCESS)
			return (COHORT_OK);
		if (e != COHORT__CUDA_ERR_NOT_READY)
			return (
			    staged_cuda_failed(s, what, e, op, err, errlen));
		if (staged_aborted(s)) {
			snprintf(err, errlen,
			    "operation #%" PRIu64 " aborted "
			    "while waiting for the %s (tcp-staged)",
			    op->seq, what);
			return (COHORT_EABORTED);
		}
		if (cohort__expired(deadline)) {
			snprintf(err, errlen,
			    "operation #%" PRIu64 ": the "
			    "stream did not reach the %s before the deadline "
			    "(tcp-staged)",
			    op->seq, what);
			return (COHORT_ETIMEDOUT);
		}
		el = cohort__now_ns() / 1000 - t0;
		if (el < STAGED_SPIN_US) {
			sched_yield();
			continue;
		}
		ts.tv_nsec = 1000L
		    * (el < STAGED_NAP_UNTIL_US ? STAGED_NAP_US
		                                : STAGED_SLEEP_US);
		(void)nanosleep(&ts, NULL);
	}
}

static void
staged_free(struct staged_state *s)
{
	if (s == NULL)
		return;
	if (s->tcp != NULL)
		cohort__host_backend.fini(s->tcp);
	if (s->event != NULL)
		(void)s->cu->EventDestroy(s->event);
	if (s->hsend.p != NULL)
		(void)s->cu->FreeHost(s->hsend.p);
	if (s->hrecv.p != NULL)
		(void)s->cu->FreeHost(s->hrecv.p);
	free(s);
}

static cohort_status
staged_init(const struct cohort__group_desc *desc, void **state, char *err,
    size_t errlen, cohort__time deadline)
{
	const struct cohort__dl_cudart *cu;
	struct staged_state *s;
	char why[512];
	cohort_status rv;

	if ((rv = cohort__dl_cudart_get(&cu, why, sizeof(why))) != COHORT_OK) {
		snprintf(
		    err, errlen, "tcp-staged backend unavailable: %s", why);
		return (rv);
	}
	if ((s = calloc(1, sizeof(*s))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	s->cu = cu;
	s->rank = desc->rank;
	s->size = desc->size;
	s->group_abort = desc->abort_flag;
	atomic_init(&s->aborted, 0);
	if ((rv = cohort__dl_cuda_event(cu, &s->event, err, errlen))
	    != COHORT_OK)
		goto out_free;
	if ((rv = cohort__host_backend.init(
	         desc, &s->tcp, err, errlen, deadline))
	    != COHORT_OK) {
		s->tcp = NULL;
		goto out_free;
	}
	*state = s;
	return (COHORT_OK);

out_free:
	staged_free(s);
	return (rv);
}

/* Bytes of send and recv this rank touches for op (0 = not used here),
 * and whether recv is also an input (broadcast root). */
static void
staged_extent(const struct staged_state *s, const struct cohort__op *op,
    size_t *slen, size_t *rlen, bool *recv_in)
{
	size_t es = cohort_dtype_size(op->dtype);
	size_t blk = op->count * es;
	size_t all = blk * (size_t)s->size;
	bool root = s->rank == op->root;

	*recv_in = false;
	*slen = 0;
	*rlen = 0;
	switch (op->kind) {
	case COHORT__OP_ALLREDUCE:
		*slen = blk;
		*rlen = blk;
		break;
	case COHORT__OP_REDUCE:
		*slen = blk;
		*rlen = root ? blk : 0;
		break;
	case COHORT__OP_BROADCAST:
		*rlen = blk;
		*recv_in = root;
		break;
	case COHORT__OP_ALLGATHER:
		*slen = blk;
		*rlen = all;
		break;
	case COHORT__OP_ALLGATHERV:
		*slen = op->counts[s->rank] * es;
		for (int p = 0; p < s->size; p++)
			*rlen += op->counts[p] * es;
		break;
	case COHORT__OP_REDUCE_SCATTER:
		*slen = all;
		*rlen = blk;
		break;
	case COHORT__OP_ALLTOALL:
		*slen = all;
		*rlen = all;
		break;
	case COHORT__OP_GATHER:
		*slen = blk;
		*rlen = root ? all : 0;
		break;
	case COHORT__OP_SCATTER:
		*slen = root ? all : 0;
		*rlen = blk;
		break;
	case COHORT__OP_ALLTOALLV:
		/* The extents of the blocks (the group layer checked they
		 * fit). */
		for (int p = 0; p < s->size; p++) {
			size_t se = (op->sdispls[p] + op->counts[p]) * es;
			size_t re = (op->rdispls[p] + op->rcounts[p]) * es;

			if (op->counts[p] > 0 && se > *slen)
				*slen = se;
			if (op->rcounts[p] > 0 && re > *rlen)
				*rlen = re;
		}
		break;
	case COHORT__OP_BARRIER:
	case COHORT__OP_SEND: /* point-to-point: never run() */
	case COHORT__OP_RECV:
		break;
	}
}

static cohort_status
staged_run(void *state, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	struct staged_state *s = state;
	struct cohort__op hop = *op;
	size_t slen, rlen;
	bool recv_in;
	cohort_status rv;

	if (staged_aborted(s)) {
		snprintf(err, errlen,
		    "operation #%" PRIu64 " aborted "
		    "(tcp-staged)",
		    op->seq);
		return (COHORT_EABORTED);
	}
	if (op->kind == COHORT__OP_ALLGATHERV && op->counts == NULL) {
		snprintf(err, errlen, "allgatherv: counts is NULL");
		return (COHORT_EINVAL);
	}
	if (op->kind == COHORT__OP_BARRIER)
		return (cohort__host_backend.run(
		    s->tcp, op, err, errlen, deadline));
	staged_extent(s, op, &slen, &rlen, &recv_in);
	if ((slen > 0 && op->send == NULL) || (rlen > 0 && op->recv == NULL)) {
		snprintf(err, errlen,
		    "operation #%" PRIu64 ": %s buffer is "
		    "NULL (tcp-staged)",
		    op->seq, slen > 0 && op->send == NULL ? "send" : "recv");
		return (COHORT_EINVAL);
	}
	if ((rv = staged_grow(s, &s->hsend, slen, op, err, errlen))
	        != COHORT_OK
	    || (rv = staged_grow(s, &s->hrecv, rlen, op, err, errlen))
	        != COHORT_OK)
		return (rv);

	/* 1-2: inputs to the host, after the work queued on the stream. */
	if ((rv = staged_copy(s, s->hsend.p, op->send, slen, op, err, errlen))
	    != COHORT_OK)
		return (rv);
	if (recv_in
	    && (rv = staged_copy(
	            s, s->hrecv.p, op->recv, rlen, op, err, errlen))
	        != COHORT_OK)
		return (rv);
	if ((rv = staged_sync(
	         s, op, "device-to-host copy", err, errlen, deadline))
	    != COHORT_OK)
		return (rv);

	/* 3: the collective on host memory. */
	hop.send = slen > 0 ? s->hsend.p : NULL;
	hop.recv = rlen > 0 ? s->hrecv.p : NULL;
	hop.stream = NULL;
	if ((rv = cohort__host_backend.run(
	         s->tcp, &hop, err, errlen, deadline))
	    != COHORT_OK)
		return (rv);

	/* 4: results back to the device. */
	if ((rv = staged_copy(s, op->recv, s->hrecv.p, rlen, op, err, errlen))
	    != COHORT_OK)
		return (rv);
	return (
	    staged_sync(s, op, "host-to-device copy", err, errlen, deadline));
}

static void
staged_abort(void *state)
{
	struct staged_state *s = state;

	if (s == NULL)
		return;
	atomic_store_explicit(&s->aborted, 1, memory_order_release);
	if (s->tcp != NULL)
		cohort__host_backend.abort(s->tcp);
}

static void
staged_fini(void *state)
{
	/* A copy an abort or timeout left on the stream may still use the
	 * host buffers: cudaFreeHost waits for the device first. */
	staged_free(state);
}

const struct cohort__backend_ops cohort__staged_backend = {
	.version = COHORT__BACKEND_VERSION,
	.name = "tcp-staged",
	.init = staged_init,
	.run = staged_run,
	.abort = staged_abort,
	.fini = staged_fini,
};

/* A CUDA device usable for staging (the runtime loads, a device is seen). */
bool
cohort__staged_available(char *why, size_t len)
{
	const struct cohort__dl_cudart *cu;

	return (cohort__dl_cudart_get(&cu, why, len) == COHORT_OK);
}
