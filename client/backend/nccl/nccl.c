/*
 * nccl.c - the nccl data-plane backend: collectives on device memory
 * through NCCL, loaded at run time (nccl_impl.h).
 *
 * Init: rank 0 creates an ncclUniqueId and publishes it in the group's
 * rendezvous store under "nccl/<group_id>/<generation>/uid"; the others
 * wait for it there. Every rank then creates a *non-blocking*
 * communicator (config.blocking = 0) and polls ncclCommGetAsyncError
 * until it is ready, failed, aborted or past the deadline; on abort or
 * timeout it calls ncclCommAbort, so init never hangs on a missing peer.
 * Each group, subgroups included, gets a fresh unique id: the descriptor
 * does not reach the parent's communicator, so ncclCommSplit is not used.
 *
 * The communicator uses the device current in the thread calling init
 * (the application's cudaSetDevice(local rank)); run() makes it current
 * again in whatever thread it runs.
 *
 * Run: the collective is enqueued on op->stream (the caller's
 * cudaStream_t; NULL is the legacy default stream), an event is recorded
 * after it, and run() polls the event and ncclCommGetAsyncError - spinning
 * for a few microseconds, then sleeping 50 us, then 1 ms - until the work
 * completed, NCCL reported an error, the group was aborted or the
 * deadline passed. On abort or timeout the communicator is destroyed with
 * ncclCommAbort, which also stops kernels spinning on a dead peer, so no
 * rank waits forever. The buffers are therefore borrowed only until run()
 * returns, like the other backends.
 *
 * Statuses of run(): COHORT_OK; COHORT_EINVAL (host memory, a buffer on
 * another device, a type NCCL lacks; the communicator stays usable);
 * COHORT_EABORTED (abort() or the group's abort flag: the group layer
 * replaces it with EPEERLOST when cohortd declared a peer dead);
 * COHORT_ETIMEDOUT; COHORT_EPEERLOST (NCCL reported ncclRemoteError or
 * ncclSystemError: a peer or the network went away); COHORT_ENCCL or
 * COHORT_ECUDA for other failures. After any of the last four the
 * communicator has been aborted and every later run() returns the same
 * status and detail.
 *
 * The gather-like and scatter-like collectives accept the in-place forms
 * of cohort.h on device memory themselves (input at recv[0], output at
 * send[0], exact NCCL in-place slots), moving data with device copies and
 * a device scratch buffer; the group layer must not apply its host-memory
 * fix-ups to device pointers.
 *
 * Alltoallv: one NCCL group of ncclSend/ncclRecv with every peer (the
 * counts of each pair are not checked against each other: NCCL would
 * hang or fail on a disagreement, as with its own calls).
 *
 * Point-to-point (backend.h v3): ncclSend/ncclRecv on the group's
 * communicator (p2p_needs_state: the group layer sets it up first, which
 * every member must reach), a batch in one NCCL group, enqueued on the
 * caller's stream under the lock that run() takes around its own enqueue
 * (a communicator takes one thread's calls at a time), with an event
 * recorded after it; a waiter thread polls the events and the
 * communicator's asynchronous error and completes the transfers. A
 * failure or a deadline completes them with the status (the group layer
 * then fails the group, whose abort breaks the communicator in run()).
 * Receives from any rank are not supported (NCCL has none):
 * COHORT_ENOTSUP.
 *
 * References: NCCL docs "Fault tolerance" / non-blocking communicators
 * (ncclCommGetAsyncError polling loop), llm.c zero.cuh (stream ordering),
 * PyTorch ProcessGroupNCCL (watchdog -> ncclCommAbort).
 */
#include <inttypes.h>
#include <pthread.h>
#include <sched.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "backend/worker.h"
#include "nccl_impl.h"

/* Polling: spin this long after enqueueing, then sleep NCCL_NAP_US up to
 * NCCL_NAP_UNTIL_US after the start, then 1 ms per turn. */
#define NCCL_SPIN_US 20
#define NCCL_NAP_US 50
#define NCCL_NAP_UNTIL_US 5000
#define NCCL_SLEEP_US 1000
/* Bound of ncclCommFinalize's flush in fini before falling back to
 * ncclCommAbort. */
#define NCCL_FINI_MS 10000

struct nccl_state {
	const struct cohort__dl_cudart *cu;
	const struct cohort__dl_nccl *nc;
	cohort__nccl_comm_t comm;
	void *event; /* cudaEvent_t recorded after each operation */
	int rank;
	int size;
	int device;
	const int32_t *global_ranks;
	atomic_int *group_abort; /* desc->abort_flag, may be NULL */
	atomic_int aborted; /* abort() */
	void *scratch; /* device memory, grown on demand */
	size_t scratch_len;
	char group_id[128];
	const char *opname;
	uint64_t seq;
	/* Sticky failure: set when the communicator was aborted. */
	cohort_status broken;
	char broken_detail[384];
	/* One thread's calls on the communicator at a time: run()'s enqueue
	 * and the point-to-point posts. */
	pthread_mutex_t enq_mtx;
};

static uint64_t
nccl_now_us(void)
{
	return (cohort__now_ns() / 1000);
}

static void
nccl_nap(uint64_t us)
{
	struct timespec ts = { .tv_sec = 0, .tv_nsec = (long)us * 1000 };

	(void)nanosleep(&ts, NULL);
}

static bool
nccl_abort_requested(const struct nccl_state *s, atomic_int *group_abort)
{
	if (group_abort != NULL
	    && atomic_load_explicit(group_abort, memory_order_acquire) != 0)
		return (true);
	return (s != NULL
	    && atomic_load_explicit(&s->aborted, memory_order_acquire) != 0);
}

/* NCCL's own text for the communicator's last error, if it has one. */
static const char *
nccl_last_text(const struct cohort__dl_nccl *nc, cohort__nccl_comm_t comm)
{
	const char *t = NULL;

	if (nc->GetLastError != NULL)
		t = nc->GetLastError(comm);
	return (t != NULL ? t : "");
}

/* ------------------------------------------------------------------------ */
/* Unique-id exchange                                                       */
/* ------------------------------------------------------------------------ */

cohort_status
cohort__nccl_exchange_id(const struct cohort__group_desc *desc,
    int (*gen)(cohort__nccl_uid *), cohort__nccl_uid *id, char *err,
    size_t errlen, cohort__time deadline)
{
	char key[COHORT__MAX_KEY];
	void *val = NULL;
	size_t len = 0;
	cohort_status rv;
	int r;

	snprintf(key, sizeof(key), "nccl/%s/%" PRIu64 "/uid", desc->group_id,
	    desc->generation);
	if (desc->rank == 0) {
		cohort__nccl_uid u;

		memset(&u, 0, sizeof(u));
		if ((r = gen(&u)) != COHORT__NCCL_SUCCESS) {
			snprintf(err, errlen, "ncclGetUniqueId failed: %s",
			    cohort__nccl_result_name(r));
			return (COHORT_ENCCL);
		}
		if ((rv = desc->store.set(
		         desc->store.ctx, key, &u, sizeof(u), deadline))
		    != COHORT_OK) {
			snprintf(err, errlen,
			    "publishing the NCCL unique id "
			    "(store key %s): %s",
			    key, cohort_status_name(rv));
			return (rv);
		}
		*id = u;
		return (COHORT_OK);
	}
	if ((rv = desc->store.get(desc->store.ctx, key, &val, &len, deadline))
	    != COHORT_OK) {
		snprintf(err, errlen,
		    "no NCCL unique id from rank 0 "
		    "(store key %s): %s",
		    key, cohort_status_name(rv));
		return (rv);
	}
	if (len != sizeof(*id)) {
		snprintf(err, errlen,
		    "NCCL unique id under %s has %zu bytes, "
		    "not %zu",
		    key, len, sizeof(*id));
		free(val);
		return (COHORT_EPROTO);
	}
	memcpy(id, val, sizeof(*id));
	free(val);
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Waiting                                                                  */
/* ------------------------------------------------------------------------ */

/* Destroys the communicator after a failure, remembering why; later runs
 * return the same. */
static cohort_status
nccl_break(struct nccl_state *s, cohort_status st, const char *detail,
    char *err, size_t errlen)
{
	if (s->comm != NULL) {
		(void)s->nc->CommAbort(s->comm);
		s->comm = NULL;
	}
	if (s->broken == COHORT_OK) {
		s->broken = st;
		cohort__strlcpy(
		    s->broken_detail, detail, sizeof(s->broken_detail));
	}
	cohort__strlcpy(err, detail, errlen);
	return (st);
}

/* An asynchronous NCCL error as a status: a vanished peer or network is
 * EPEERLOST (NCCL cannot say which rank), the rest ENCCL. */
static cohort_status
nccl_async_status(int async)
{
	if (async == COHORT__NCCL_REMOTE_ERROR
	    || async == COHORT__NCCL_SYSTEM_ERROR)
		return (COHORT_EPEERLOST);
	return (COHORT_ENCCL);
}

/*
 * Polls until the communicator is ready (async state ncclSuccess) and,
 * when with_event, s->event completed. On abort, timeout or an error the
 * communicator is aborted. The event is asked first: once it completed,
 * the operation's kernels have finished and the call is done, so the
 * common case costs one cudaEventQuery (the asynchronous error is read
 * only while waiting).
 */
static cohort_status
nccl_wait(struct nccl_state *s, bool with_event, char *err, size_t errlen,
    cohort__time deadline)
{
	uint64_t t0 = nccl_now_us();
	char detail[384];
	char text[200];

	for (;;) {
		int async = COHORT__NCCL_SUCCESS;
		int r;
		uint64_t el;

		if (with_event) {
			int e = s->cu->EventQuery(s->event);

			if (e == COHORT__CUDA_SUCCESS)
				return (COHORT_OK);
			if (e != COHORT__CUDA_ERR_NOT_READY) {
				snprintf(detail, sizeof(detail),
				    "CUDA failed during %s #%" PRIu64 ": %s",
				    s->opname, s->seq,
				    cohort__dl_cuda_errtext(
				        s->cu, e, text, sizeof(text)));
				return (nccl_break(
				    s, COHORT_ECUDA, detail, err, errlen));
			}
			/* The first microseconds: the event alone, asked
			 * again at once (a short operation ends here; the
			 * error, abort and deadline are read after). */
			if (nccl_now_us() - t0 < NCCL_SPIN_US) {
				cohort__cpu_relax();
				continue;
			}
		}
		r = s->nc->CommGetAsyncError(s->comm, &async);
		if (r != COHORT__NCCL_SUCCESS)
			async = r;
		if (async != COHORT__NCCL_SUCCESS
		    && async != COHORT__NCCL_IN_PROGRESS) {
			snprintf(detail, sizeof(detail),
			    "NCCL failed during %s #%" PRIu64 " (group %s, "
			    "rank %d of %d): %s %s",
			    s->opname, s->seq, s->group_id, s->rank, s->size,
			    cohort__nccl_result_name(async),
			    nccl_last_text(s->nc, s->comm));
			return (nccl_break(
			    s, nccl_async_status(async), detail, err, errlen));
		}
		if (async == COHORT__NCCL_SUCCESS && !with_event)
			return (COHORT_OK);
		if (nccl_abort_requested(s, s->group_abort)) {
			snprintf(detail, sizeof(detail),
			    "%s #%" PRIu64 " aborted (group %s); NCCL "
			    "communicator aborted",
			    s->opname, s->seq, s->group_id);
			return (nccl_break(
			    s, COHORT_EABORTED, detail, err, errlen));
		}
		if (cohort__expired(deadline)) {
			snprintf(detail, sizeof(detail),
			    "%s #%" PRIu64 " did not complete before the "
			    "deadline (group %s, rank %d of %d, %.1f s); NCCL "
			    "communicator aborted",
			    s->opname, s->seq, s->group_id, s->rank, s->size,
			    (double)(nccl_now_us() - t0) / 1e6);
			return (nccl_break(
			    s, COHORT_ETIMEDOUT, detail, err, errlen));
		}
		el = nccl_now_us() - t0;
		if (el < NCCL_SPIN_US)
			sched_yield();
		else if (el < NCCL_NAP_UNTIL_US)
			nccl_nap(NCCL_NAP_US);
		else
			nccl_nap(NCCL_SLEEP_US);
	}
}

/* A synchronous NCCL failure of an enqueue call. Argument errors leave
 * the communicator usable unless it reports an asynchronous error too. */
static cohort_status
nccl_call_failed(
    struct nccl_state *s, const char *call, int r, char *err, size_t errlen)
{
	char detail[384];
	int async = COHORT__NCCL_SUCCESS;

	snprintf(detail, sizeof(detail),
	    "%s failed during %s #%" PRIu64 " (group %s): %s %s", call,
	    s->opname, s->seq, s->group_id, cohort__nccl_result_name(r),
	    nccl_last_text(s->nc, s->comm));
	if ((r == COHORT__NCCL_INVALID_ARGUMENT
	        || r == COHORT__NCCL_INVALID_USAGE)
	    && s->nc->CommGetAsyncError(s->comm, &async)
	        == COHORT__NCCL_SUCCESS
	    && (async == COHORT__NCCL_SUCCESS
	        || async == COHORT__NCCL_IN_PROGRESS)) {
		cohort__strlcpy(err, detail, errlen);
		return (COHORT_EINVAL);
	}
	return (nccl_break(s,
	    r == COHORT__NCCL_REMOTE_ERROR || r == COHORT__NCCL_SYSTEM_ERROR
	        ? COHORT_EPEERLOST
	        : COHORT_ENCCL,
	    detail, err, errlen));
}

static cohort_status
nccl_cuda_failed(
    struct nccl_state *s, const char *call, int e, char *err, size_t errlen)
{
	char text[200];

	snprintf(err, errlen, "%s failed during %s #%" PRIu64 ": %s", call,
	    s->opname, s->seq,
	    cohort__dl_cuda_errtext(s->cu, e, text, sizeof(text)));
	(void)s->cu->GetLastError();
	return (COHORT_ECUDA);
}

/* ------------------------------------------------------------------------ */
/* Init / fini                                                              */
/* ------------------------------------------------------------------------ */

static void
nccl_free(struct nccl_state *s)
{
	if (s == NULL)
		return;
	if (s->comm != NULL)
		(void)s->nc->CommAbort(s->comm);
	if (s->event != NULL)
		(void)s->cu->EventDestroy(s->event);
	if (s->scratch != NULL)
		(void)s->cu->Free(s->scratch);
	pthread_mutex_destroy(&s->enq_mtx);
	free(s);
}

static cohort_status
nccl_init(const struct cohort__group_desc *desc, void **state, char *err,
    size_t errlen, cohort__time deadline)
{
	const struct cohort__dl_cudart *cu;
	const struct cohort__dl_nccl *nc;
	struct cohort__nccl_config cfg;
	struct nccl_state *s;
	cohort__nccl_uid uid;
	char why[512];
	char text[200];
	cohort_status rv;
	int r;
	int e;

	if (desc->size < 1 || desc->rank < 0 || desc->rank >= desc->size) {
		snprintf(
		    err, errlen, "bad rank %d of %d", desc->rank, desc->size);
		return (COHORT_EINVAL);
	}
	if ((rv = cohort__dl_nccl_get(&nc, why, sizeof(why))) != COHORT_OK) {
		snprintf(err, errlen, "nccl backend unavailable: %s", why);
		return (rv);
	}
	(void)cohort__dl_cudart_get(&cu, NULL, 0);
	if (cohort__expired(deadline)) {
		snprintf(err, errlen,
		    "nccl init (group %s): the deadline "
		    "passed before the communicator was created",
		    desc->group_id);
		return (COHORT_ETIMEDOUT);
	}
	if ((s = calloc(1, sizeof(*s))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	if (pthread_mutex_init(&s->enq_mtx, NULL) != 0) {
		free(s);
		snprintf(err, errlen, "pthread_mutex_init failed");
		return (COHORT_ESYSTEM);
	}
	s->cu = cu;
	s->nc = nc;
	s->rank = desc->rank;
	s->size = desc->size;
	s->global_ranks = desc->global_ranks;
	s->group_abort = desc->abort_flag;
	atomic_init(&s->aborted, 0);
	s->opname = "init";
	cohort__strlcpy(s->group_id,
	    desc->group_id != NULL ? desc->group_id : "", sizeof(s->group_id));
	if ((e = cu->GetDevice(&s->device)) != COHORT__CUDA_SUCCESS) {
		snprintf(err, errlen, "cudaGetDevice: %s",
		    cohort__dl_cuda_errtext(cu, e, text, sizeof(text)));
		rv = COHORT_ECUDA;
		goto out_free;
	}
	if ((rv = cohort__dl_cuda_event(cu, &s->event, err, errlen))
	    != COHORT_OK)
		goto out_free;
	if ((rv = cohort__nccl_exchange_id(
	         desc, nc->GetUniqueId, &uid, err, errlen, deadline))
	    != COHORT_OK)
		goto out_free;
	if (nccl_abort_requested(NULL, desc->abort_flag)) {
		snprintf(err, errlen, "nccl init (group %s) aborted",
		    desc->group_id);
		rv = COHORT_EABORTED;
		goto out_free;
	}

	cohort__nccl_config_init(&cfg);
	cfg.blocking = 0;
	cfg.commName = s->group_id;
	r = nc->CommInitRankConfig(&s->comm, s->size, uid, s->rank, &cfg);
	if (r != COHORT__NCCL_SUCCESS && r != COHORT__NCCL_IN_PROGRESS) {
		snprintf(err, errlen,
		    "ncclCommInitRankConfig (group %s, rank "
		    "%d of %d, device %d, NCCL %s): %s %s",
		    s->group_id, s->rank, s->size, s->device, nc->version_text,
		    cohort__nccl_result_name(r),
		    s->comm != NULL ? nccl_last_text(nc, s->comm) : "");
		rv = COHORT_ENCCL;
		goto out_free;
	}
	if (s->comm == NULL) {
		snprintf(err, errlen,
		    "ncclCommInitRankConfig returned no "
		    "communicator");
		rv = COHORT_ENCCL;
		goto out_free;
	}
	if ((rv = nccl_wait(s, false, err, errlen, deadline)) != COHORT_OK) {
		size_t off;

		if (rv == COHORT_ETIMEDOUT)
			snprintf(err, errlen,
			    "NCCL communicator init (group "
			    "%s, rank %d of %d, device %d) did not complete "
			    "before the deadline: did every rank join? NCCL "
			    "communicator aborted",
			    s->group_id, s->rank, s->size, s->device);
		off = strnlen(err, errlen);
		if (rv == COHORT_ENCCL && s->size > 1)
			cohort__appendf(err, errlen, &off,
			    " (NCCL refuses "
			    "two ranks on one GPU: use the tcp-staged "
			    "backend there)");
		goto out_free;
	}
	cohort__debug("nccl group %s: rank %d of %d on device %d (NCCL %s)",
	    s->group_id, s->rank, s->size, s->device, nc->version_text);
	s->opname = "";
	*state = s;
	return (COHORT_OK);

out_free:
	nccl_free(s);
	return (rv);
}

static void
nccl_abort(void *state)
{
	struct nccl_state *s = state;

	if (s != NULL)
		atomic_store_explicit(&s->aborted, 1, memory_order_release);
}

static void
nccl_fini(void *state)
{
	struct nccl_state *s = state;
	cohort__time dl = cohort__now_ms() + NCCL_FINI_MS;
	char err[256];
	int r;

	if (s == NULL)
		return;
	if (s->comm != NULL && s->broken == COHORT_OK
	    && !nccl_abort_requested(s, s->group_abort)) {
		/* Flush: finalize is collective and may wait for peers. */
		s->opname = "fini";
		r = s->nc->CommFinalize(s->comm);
		if ((r == COHORT__NCCL_SUCCESS
		        || r == COHORT__NCCL_IN_PROGRESS)
		    && nccl_wait(s, false, err, sizeof(err), dl)
		        == COHORT_OK) {
			(void)s->nc->CommDestroy(s->comm);
			s->comm = NULL;
		}
	}
	nccl_free(s); /* aborts a communicator still there */
}

/* ------------------------------------------------------------------------ */
/* Operations                                                               */
/* ------------------------------------------------------------------------ */

static bool
nccl_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t x = (uintptr_t)a;
	uintptr_t y = (uintptr_t)b;

	return (alen > 0 && blen > 0 && x < y + blen && y < x + alen);
}

/* A buffer NCCL may use: device or managed memory of the communicator's
 * device. */
static cohort_status
nccl_check_buf(struct nccl_state *s, const char *what, const void *p,
    char *err, size_t errlen)
{
	struct cohort__cuda_ptr_attr a;
	int e;

	if (p == NULL) {
		snprintf(err, errlen, "%s #%" PRIu64 ": %s buffer is NULL",
		    s->opname, s->seq, what);
		return (COHORT_EINVAL);
	}
	memset(&a, 0, sizeof(a));
	if ((e = s->cu->PointerGetAttributes(&a, p)) != COHORT__CUDA_SUCCESS) {
		(void)s->cu->GetLastError();
		a.type = COHORT__CUDA_MEM_UNREGISTERED;
	}
	if (a.type != COHORT__CUDA_MEM_DEVICE
	    && a.type != COHORT__CUDA_MEM_MANAGED) {
		snprintf(err, errlen,
		    "%s #%" PRIu64 ": the %s buffer %p is "
		    "host memory; the nccl backend needs device memory (use "
		    "the tcp backend for host buffers)",
		    s->opname, s->seq, what, p);
		return (COHORT_EINVAL);
	}
	if (a.type == COHORT__CUDA_MEM_DEVICE && a.device != s->device) {
		snprintf(err, errlen,
		    "%s #%" PRIu64 ": the %s buffer %p is "
		    "on device %d, the group's communicator on device %d",
		    s->opname, s->seq, what, p, a.device, s->device);
		return (COHORT_EINVAL);
	}
	return (COHORT_OK);
}

static cohort_status
nccl_scratch(struct nccl_state *s, size_t len, char *err, size_t errlen)
{
	int e;

	if (len <= s->scratch_len)
		return (COHORT_OK);
	/* cudaFree waits for the device: no work still uses the old one. */
	if ((e = cohort__dl_cuda_grow(s->cu->Malloc, s->cu->Free, &s->scratch,
	         &s->scratch_len, len))
	    != COHORT__CUDA_SUCCESS)
		return (nccl_cuda_failed(
		    s, "cudaMalloc (scratch)", e, err, errlen));
	return (COHORT_OK);
}

/* Device copy on the stream; overlapping ranges go through the scratch
 * buffer. */
static cohort_status
nccl_move(struct nccl_state *s, void *dst, const void *src, size_t len,
    void *stream, char *err, size_t errlen)
{
	cohort_status rv;
	int e;

	if (len == 0 || dst == src)
		return (COHORT_OK);
	if (nccl_overlap(dst, len, src, len)) {
		if ((rv = nccl_scratch(s, len, err, errlen)) != COHORT_OK)
			return (rv);
		if ((e = s->cu->MemcpyAsync(s->scratch, src, len,
		         COHORT__CUDA_MEMCPY_DEFAULT, stream))
		    != COHORT__CUDA_SUCCESS)
			return (nccl_cuda_failed(
			    s, "cudaMemcpyAsync", e, err, errlen));
		src = s->scratch;
	}
	if ((e = s->cu->MemcpyAsync(
	         dst, src, len, COHORT__CUDA_MEMCPY_DEFAULT, stream))
	    != COHORT__CUDA_SUCCESS)
		return (
		    nccl_cuda_failed(s, "cudaMemcpyAsync", e, err, errlen));
	return (COHORT_OK);
}

/* Sends from a copy of the input (len bytes) in the scratch buffer. */
static cohort_status
nccl_copy_input(struct nccl_state *s, const void **send, size_t len,
    void *stream, char *err, size_t errlen)
{
	cohort_status rv;

	if ((rv = nccl_scratch(s, len, err, errlen)) != COHORT_OK
	    || (rv = nccl_move(s, s->scratch, *send, len, stream, err, errlen))
	        != COHORT_OK)
		return (rv);
	*send = s->scratch;
	return (COHORT_OK);
}

/* Input that overlaps the output other than in place: copy it to the
 * scratch buffer first, and use that. */
static cohort_status
nccl_detach_input(struct nccl_state *s, const void **send, size_t slen,
    const void *recv, size_t rlen, void *stream, char *err, size_t errlen)
{
	if (*send == recv || !nccl_overlap(*send, slen, recv, rlen))
		return (COHORT_OK);
	return (nccl_copy_input(s, send, slen, stream, err, errlen));
}

static bool
nccl_failed(int r)
{
	return (r != COHORT__NCCL_SUCCESS && r != COHORT__NCCL_IN_PROGRESS);
}

/* The status of one enqueue call (ncclInProgress is success for a
 * non-blocking communicator: nccl_wait waits for it). */
static cohort_status
nccl_chk(
    struct nccl_state *s, const char *call, int r, char *err, size_t errlen)
{
	if (!nccl_failed(r))
		return (COHORT_OK);
	return (nccl_call_failed(s, call, r, err, errlen));
}

/* Point-to-point transfers of one grouped operation. */
struct nccl_p2p {
	const char *call; /* the failed call */
	int r;
};

static bool
nccl_p2p_send(struct nccl_state *s, struct nccl_p2p *g, const void *buf,
    size_t n, int dt, int peer, void *stream)
{
	g->r = s->nc->Send(buf, n, dt, peer, s->comm, stream);
	g->call = "ncclSend";
	return (!nccl_failed(g->r));
}

static bool
nccl_p2p_recv(struct nccl_state *s, struct nccl_p2p *g, void *buf, size_t n,
    int dt, int peer, void *stream)
{
	g->r = s->nc->Recv(buf, n, dt, peer, s->comm, stream);
	g->call = "ncclRecv";
	return (!nccl_failed(g->r));
}

/* Closes the group a failed ncclSend/ncclRecv left open, then reports. */
static cohort_status
nccl_p2p_failed(
    struct nccl_state *s, const struct nccl_p2p *g, char *err, size_t errlen)
{
	(void)s->nc->GroupEnd();
	return (nccl_call_failed(s, g->call, g->r, err, errlen));
}

static cohort_status
nccl_group_start(struct nccl_state *s, char *err, size_t errlen)
{
	return (
	    nccl_chk(s, "ncclGroupStart", s->nc->GroupStart(), err, errlen));
}

/* One grouped exchange with every peer p: block p of send (if not NULL)
 * to p, block p of recv (if not NULL) from p; blocks of count elements,
 * blk bytes. */
static cohort_status
nccl_exchange(struct nccl_state *s, const uint8_t *send, uint8_t *recv,
    size_t blk, size_t count, int dt, void *stream, char *err, size_t errlen)
{
	struct nccl_p2p g;
	cohort_status rv;

	if (s->size == 1)
		return (COHORT_OK);
	if ((rv = nccl_group_start(s, err, errlen)) != COHORT_OK)
		return (rv);
	for (int p = 0; p < s->size; p++) {
		if (p == s->rank)
			continue;
		if ((send != NULL
		        && !nccl_p2p_send(s, &g, send + (size_t)p * blk, count,
		            dt, p, stream))
		    || (recv != NULL
		        && !nccl_p2p_recv(s, &g, recv + (size_t)p * blk, count,
		            dt, p, stream)))
			return (nccl_p2p_failed(s, &g, err, errlen));
	}
	return (nccl_chk(s, "ncclGroupEnd", s->nc->GroupEnd(), err, errlen));
}

/* Gather-like: every rank's block lands at its offset in recv; our own
 * input is first moved to its slot (so a send == recv input is not
 * overwritten by a peer's block), then sent from there. */
static cohort_status
nccl_allgatherv(struct nccl_state *s, const struct cohort__op *op, int dt,
    size_t es, void *stream, char *err, size_t errlen)
{
	uint8_t *recv = op->recv;
	size_t off = 0;
	size_t mine_off = 0;
	size_t mine_n = op->counts[s->rank];
	const void *mine;
	struct nccl_p2p g;
	cohort_status rv;

	for (int p = 0; p < s->size; p++) {
		if (p == s->rank)
			mine_off = off;
		off += op->counts[p] * es;
	}
	if ((rv = nccl_move(s, recv + mine_off, op->send, mine_n * es, stream,
	         err, errlen))
	    != COHORT_OK)
		return (rv);
	mine = recv + mine_off;
	if (s->size == 1)
		return (COHORT_OK);
	if ((rv = nccl_group_start(s, err, errlen)) != COHORT_OK)
		return (rv);
	off = 0;
	for (int p = 0; p < s->size; p++) {
		size_t n = op->counts[p];

		if (p != s->rank && mine_n > 0
		    && !nccl_p2p_send(s, &g, mine, mine_n, dt, p, stream))
			return (nccl_p2p_failed(s, &g, err, errlen));
		if (p != s->rank && n > 0
		    && !nccl_p2p_recv(s, &g, recv + off, n, dt, p, stream))
			return (nccl_p2p_failed(s, &g, err, errlen));
		off += n * es;
	}
	return (nccl_chk(s, "ncclGroupEnd", s->nc->GroupEnd(), err, errlen));
}

static cohort_status
nccl_alltoall(struct nccl_state *s, const struct cohort__op *op, int dt,
    size_t es, void *stream, char *err, size_t errlen)
{
	size_t blk = op->count * es;
	size_t total = blk * (size_t)s->size;
	const void *send = op->send;
	uint8_t *recv = op->recv;
	cohort_status rv;

	/* Not in place by contract; an overlapping input is sent from a
	 * copy all the same. */
	if (nccl_overlap(send, total, recv, total)
	    && (rv = nccl_copy_input(s, &send, total, stream, err, errlen))
	        != COHORT_OK)
		return (rv);
	if ((rv = nccl_move(s, recv + (size_t)s->rank * blk,
	         (const uint8_t *)send + (size_t)s->rank * blk, blk, stream,
	         err, errlen))
	    != COHORT_OK)
		return (rv);
	return (nccl_exchange(
	    s, send, recv, blk, op->count, dt, stream, err, errlen));
}

/* Uneven blocks: our own moved locally, the others in one NCCL group. */
static cohort_status
nccl_alltoallv(struct nccl_state *s, const struct cohort__op *op, int dt,
    size_t es, void *stream, char *err, size_t errlen)
{
	const uint8_t *send = op->send;
	uint8_t *recv = op->recv;
	int r = s->rank;
	struct nccl_p2p g;
	cohort_status rv;

	if (op->counts[r] != op->rcounts[r]) {
		snprintf(err, errlen,
		    "alltoallv: rank %d sends %zu elements to itself and "
		    "receives %zu",
		    (int)s->global_ranks[r], op->counts[r], op->rcounts[r]);
		return (COHORT_EMISMATCH);
	}
	if ((rv = nccl_move(s, recv + op->rdispls[r] * es,
	         send + op->sdispls[r] * es, op->counts[r] * es, stream, err,
	         errlen))
	    != COHORT_OK)
		return (rv);
	if (s->size == 1)
		return (COHORT_OK);
	if ((rv = nccl_group_start(s, err, errlen)) != COHORT_OK)
		return (rv);
	for (int p = 0; p < s->size; p++) {
		if (p == r)
			continue;
		if ((op->counts[p] > 0
		        && !nccl_p2p_send(s, &g, send + op->sdispls[p] * es,
		            op->counts[p], dt, p, stream))
		    || (op->rcounts[p] > 0
		        && !nccl_p2p_recv(s, &g, recv + op->rdispls[p] * es,
		            op->rcounts[p], dt, p, stream)))
			return (nccl_p2p_failed(s, &g, err, errlen));
	}
	return (nccl_chk(s, "ncclGroupEnd", s->nc->GroupEnd(), err, errlen));
}

static cohort_status
nccl_gather(struct nccl_state *s, const struct cohort__op *op, int dt,
    size_t es, void *stream, char *err, size_t errlen)
{
	size_t blk = op->count * es;
	uint8_t *recv = op->recv;
	cohort_status rv;

	if (s->rank != op->root)
		return (nccl_chk(s, "ncclSend",
		    s->nc->Send(
		        op->send, op->count, dt, op->root, s->comm, stream),
		    err, errlen));
	if ((rv = nccl_move(s, recv + (size_t)s->rank * blk, op->send, blk,
	         stream, err, errlen))
	    != COHORT_OK)
		return (rv);
	return (nccl_exchange(
	    s, NULL, recv, blk, op->count, dt, stream, err, errlen));
}

static cohort_status
nccl_scatter(struct nccl_state *s, const struct cohort__op *op, int dt,
    size_t es, void *stream, char *err, size_t errlen)
{
	size_t blk = op->count * es;
	size_t total = blk * (size_t)s->size;
	const void *send = op->send;
	cohort_status rv;

	if (s->rank != op->root)
		return (nccl_chk(s, "ncclRecv",
		    s->nc->Recv(
		        op->recv, op->count, dt, op->root, s->comm, stream),
		    err, errlen));
	/* Output overlapping the input other than at our own block (recv
	 * == send): send the input from a copy. */
	if ((const uint8_t *)op->recv
	        != (const uint8_t *)send + (size_t)s->rank * blk
	    && nccl_overlap(op->recv, blk, send, total)
	    && (rv = nccl_copy_input(s, &send, total, stream, err, errlen))
	        != COHORT_OK)
		return (rv);
	if ((rv = nccl_exchange(
	         s, send, NULL, blk, op->count, dt, stream, err, errlen))
	    != COHORT_OK)
		return (rv);
	return (nccl_move(s, op->recv,
	    (const uint8_t *)send + (size_t)s->rank * blk, blk, stream, err,
	    errlen));
}

/* Checks the buffers an operation uses on this rank. */
static cohort_status
nccl_check_args(struct nccl_state *s, const struct cohort__op *op, char *err,
    size_t errlen)
{
	bool root = s->rank == op->root;
	bool need_send = true;
	bool need_recv = true;
	cohort_status rv;

	switch (op->kind) {
	case COHORT__OP_BARRIER:
		return (COHORT_OK);
	case COHORT__OP_BROADCAST:
		need_send = false;
		break;
	case COHORT__OP_REDUCE:
	case COHORT__OP_GATHER:
		need_recv = root;
		break;
	case COHORT__OP_SCATTER:
		need_send = root;
		break;
	case COHORT__OP_ALLGATHERV:
		if (op->counts == NULL) {
			snprintf(err, errlen, "allgatherv: counts is NULL");
			return (COHORT_EINVAL);
		}
		need_send = op->counts[s->rank] > 0;
		break;
	case COHORT__OP_ALLTOALLV:
		need_send = need_recv = false;
		for (int p = 0; p < s->size; p++) {
			need_send = need_send || op->counts[p] > 0;
			need_recv = need_recv || op->rcounts[p] > 0;
		}
		break;
	default:
		break;
	}
	if (op->kind == COHORT__OP_REDUCE || op->kind == COHORT__OP_BROADCAST
	    || op->kind == COHORT__OP_GATHER
	    || op->kind == COHORT__OP_SCATTER) {
		if (op->root < 0 || op->root >= s->size) {
			snprintf(err, errlen,
			    "%s: root %d out of range [0, %d)", s->opname,
			    op->root, s->size);
			return (COHORT_EINVAL);
		}
	}
	if (need_send
	    && (rv = nccl_check_buf(s, "send", op->send, err, errlen))
	        != COHORT_OK)
		return (rv);
	/* In place (recv == send, as DDP's buckets are): asked once. */
	if (need_recv && !(need_send && op->recv == op->send)
	    && (rv = nccl_check_buf(s, "recv", op->recv, err, errlen))
	        != COHORT_OK)
		return (rv);
	return (COHORT_OK);
}

/* Enqueues op on stream; nothing waits here. */
static cohort_status
nccl_enqueue(struct nccl_state *s, const struct cohort__op *op, int dt,
    int rop, size_t es, void *stream, char *err, size_t errlen)
{
	const void *send = op->send;
	size_t n = op->count;
	size_t blk = n * es;
	size_t all = blk * (size_t)s->size;
	uint8_t *recv = op->recv;
	cohort_status rv;

	switch (op->kind) {
	case COHORT__OP_ALLREDUCE:
		if ((rv = nccl_detach_input(
		         s, &send, blk, recv, blk, stream, err, errlen))
		    != COHORT_OK)
			return (rv);
		return (nccl_chk(s, "ncclAllReduce",
		    s->nc->AllReduce(send, recv, n, dt, rop, s->comm, stream),
		    err, errlen));
	case COHORT__OP_REDUCE:
		if (s->rank == op->root
		    && (rv = nccl_detach_input(
		            s, &send, blk, recv, blk, stream, err, errlen))
		        != COHORT_OK)
			return (rv);
		return (nccl_chk(s, "ncclReduce",
		    s->nc->Reduce(send, s->rank == op->root ? op->recv : NULL,
		        n, dt, rop, op->root, s->comm, stream),
		    err, errlen));
	case COHORT__OP_BROADCAST:
		return (nccl_chk(s, "ncclBroadcast",
		    s->nc->Broadcast(
		        recv, recv, n, dt, op->root, s->comm, stream),
		    err, errlen));
	case COHORT__OP_ALLGATHER:
		/* NCCL's in place is send == recv + rank * blk; any other
		 * overlap (input at recv[0]) is moved there first. */
		if (send != recv + (size_t)s->rank * blk
		    && nccl_overlap(send, blk, recv, all)) {
			if ((rv = nccl_move(s, recv + (size_t)s->rank * blk,
			         send, blk, stream, err, errlen))
			    != COHORT_OK)
				return (rv);
			send = recv + (size_t)s->rank * blk;
		}
		return (nccl_chk(s, "ncclAllGather",
		    s->nc->AllGather(send, recv, n, dt, s->comm, stream), err,
		    errlen));
	case COHORT__OP_REDUCE_SCATTER:
		/* In place is recv == send + rank * blk; other overlaps run
		 * into the scratch buffer. */
		if ((void *)recv
		        != (const uint8_t *)send + (size_t)s->rank * blk
		    && nccl_overlap(recv, blk, send, all)) {
			if ((rv = nccl_scratch(s, blk, err, errlen))
			    != COHORT_OK)
				return (rv);
			if ((rv = nccl_chk(s, "ncclReduceScatter",
			         s->nc->ReduceScatter(send, s->scratch, n, dt,
			             rop, s->comm, stream),
			         err, errlen))
			    != COHORT_OK)
				return (rv);
			return (nccl_move(
			    s, recv, s->scratch, blk, stream, err, errlen));
		}
		return (nccl_chk(s, "ncclReduceScatter",
		    s->nc->ReduceScatter(
		        send, recv, n, dt, rop, s->comm, stream),
		    err, errlen));
	case COHORT__OP_ALLGATHERV:
		return (nccl_allgatherv(s, op, dt, es, stream, err, errlen));
	case COHORT__OP_ALLTOALL:
		return (nccl_alltoall(s, op, dt, es, stream, err, errlen));
	case COHORT__OP_GATHER:
		return (nccl_gather(s, op, dt, es, stream, err, errlen));
	case COHORT__OP_SCATTER:
		return (nccl_scatter(s, op, dt, es, stream, err, errlen));
	case COHORT__OP_ALLTOALLV:
		return (nccl_alltoallv(s, op, dt, es, stream, err, errlen));
	case COHORT__OP_SEND:
	case COHORT__OP_RECV:
		break; /* point-to-point: never run() */
	case COHORT__OP_BARRIER:
		if ((rv = nccl_scratch(s, 16, err, errlen)) != COHORT_OK)
			return (rv);
		return (nccl_chk(s, "ncclAllReduce",
		    s->nc->AllReduce(s->scratch, s->scratch, 1,
		        COHORT__NCCL_FLOAT32, COHORT__NCCL_SUM, s->comm,
		        stream),
		    err, errlen));
	}
	snprintf(err, errlen, "unknown operation %d", (int)op->kind);
	return (COHORT_EINVAL);
}

static bool
nccl_empty(const struct nccl_state *s, const struct cohort__op *op)
{
	if (op->kind == COHORT__OP_BARRIER)
		return (false);
	if (op->kind == COHORT__OP_ALLGATHERV) {
		for (int p = 0; p < s->size; p++)
			if (op->counts[p] > 0)
				return (false);
		return (true);
	}
	if (op->kind == COHORT__OP_ALLTOALLV) {
		for (int p = 0; p < s->size; p++)
			if (op->counts[p] > 0 || op->rcounts[p] > 0)
				return (false);
		return (true);
	}
	return (op->count == 0);
}

static cohort_status
nccl_run(void *state, const struct cohort__op *op, char *err, size_t errlen,
    cohort__time deadline)
{
	struct nccl_state *s = state;
	size_t es = cohort_dtype_size(op->dtype);
	void *stream = op->stream;
	cohort_status rv;
	int dt;
	int rop = COHORT__NCCL_SUM;
	int e;

	s->opname = cohort__op_name(op->kind);
	s->seq = op->seq;
	if (s->broken != COHORT_OK) {
		snprintf(err, errlen,
		    "%s #%" PRIu64 ": the NCCL communicator "
		    "failed earlier: %s",
		    s->opname, s->seq, s->broken_detail);
		return (s->broken);
	}
	if (nccl_abort_requested(s, s->group_abort)) {
		char detail[256];

		snprintf(detail, sizeof(detail),
		    "%s #%" PRIu64 " aborted "
		    "(group %s); NCCL communicator aborted",
		    s->opname, s->seq, s->group_id);
		return (nccl_break(s, COHORT_EABORTED, detail, err, errlen));
	}
	/* The group layer may run us on another thread (asynchronous
	 * operations): scratch memory belongs on the communicator's device. */
	if ((e = s->cu->SetDevice(s->device)) != COHORT__CUDA_SUCCESS)
		return (nccl_cuda_failed(s, "cudaSetDevice", e, err, errlen));
	if ((dt = cohort__nccl_dtype(op->dtype)) < 0 || es == 0) {
		snprintf(err, errlen, "%s: invalid dtype %d", s->opname,
		    (int)op->dtype);
		return (COHORT_EINVAL);
	}
	if (op->kind == COHORT__OP_ALLREDUCE || op->kind == COHORT__OP_REDUCE
	    || op->kind == COHORT__OP_REDUCE_SCATTER) {
		if ((rop = cohort__nccl_redop(op->op, s->nc->version)) < 0) {
			snprintf(err, errlen,
			    "%s: op %s is not supported by "
			    "NCCL %s",
			    s->opname, cohort_redop_name(op->op),
			    s->nc->version_text);
			return ((int)op->op >= 0 && op->op < COHORT_REDOP_COUNT
			        ? COHORT_ENOTSUP
			        : COHORT_EINVAL);
		}
	}
	if ((op->kind == COHORT__OP_ALLGATHERV && op->counts == NULL)
	    || (op->kind == COHORT__OP_ALLTOALLV
	        && (op->counts == NULL || op->sdispls == NULL
	            || op->rcounts == NULL || op->rdispls == NULL))) {
		snprintf(err, errlen, "%s: counts are NULL", s->opname);
		return (COHORT_EINVAL);
	}
	if (op->kind == COHORT__OP_SEND || op->kind == COHORT__OP_RECV) {
		snprintf(err, errlen, "%s is not a collective", s->opname);
		return (COHORT_EINVAL);
	}
	if (nccl_empty(s, op))
		return (COHORT_OK);
	if ((rv = nccl_check_args(s, op, err, errlen)) != COHORT_OK)
		return (rv);

	pthread_mutex_lock(&s->enq_mtx);
	rv = nccl_enqueue(s, op, dt, rop, es, stream, err, errlen);
	/* Non-blocking communicator: the launch may still be in progress
	 * (ncclInProgress); the event must follow the kernels. */
	if (rv == COHORT_OK)
		rv = nccl_wait(s, false, err, errlen, deadline);
	pthread_mutex_unlock(&s->enq_mtx);
	if (rv != COHORT_OK)
		return (rv);
	if ((e = s->cu->EventRecord(s->event, stream))
	    != COHORT__CUDA_SUCCESS) {
		char detail[384];
		char text[200];

		snprintf(detail, sizeof(detail),
		    "cudaEventRecord during %s #%" PRIu64 ": %s", s->opname,
		    s->seq,
		    cohort__dl_cuda_errtext(s->cu, e, text, sizeof(text)));
		(void)s->cu->GetLastError();
		/* Work was enqueued and cannot be waited for. */
		return (nccl_break(s, COHORT_ECUDA, detail, err, errlen));
	}
	return (nccl_wait(s, true, err, errlen, deadline));
}

/* ------------------------------------------------------------------------ */
/* Point-to-point                                                           */
/* ------------------------------------------------------------------------ */

/* One posted batch: its transfers and the event recorded after them. */
struct nccl_batch {
	struct cohort__p2p **reqs;
	size_t n;
	void *event;
	cohort__time deadline; /* the earliest of its transfers' */
	struct nccl_batch *next;
};

struct nccl_p2p_state {
	struct nccl_state *s;
	pthread_mutex_t mtx;
	pthread_cond_t cv; /* a batch posted, or stop */
	struct nccl_batch *head, *tail;
	pthread_t thread;
	atomic_int stop; /* abort or close */
	bool closing;
};

static void
nccl_batch_done(struct nccl_p2p_state *ps, struct nccl_batch *b,
    cohort_status st, const char *why)
{
	for (size_t i = 0; i < b->n; i++) {
		struct cohort__p2p *r = b->reqs[i];

		r->st = st;
		if (st != COHORT_OK)
			snprintf(r->err, sizeof(r->err),
			    "%s #%" PRIu64 " %s rank %d (tag %" PRIu32 "): %s",
			    r->kind == COHORT__OP_SEND ? "send" : "recv",
			    r->seq, r->kind == COHORT__OP_SEND ? "to" : "from",
			    (int)ps->s->global_ranks[r->peer], r->tag, why);
		r->done(r);
	}
	if (b->event != NULL)
		(void)ps->s->cu->EventDestroy(b->event);
	free(b->reqs);
	free(b);
}

/* Polls the posted batches in order: the stream reached a batch's event,
 * NCCL failed, the deadline passed, or stop. */
static void *
nccl_p2p_waiter(void *arg)
{
	struct nccl_p2p_state *ps = arg;
	struct nccl_state *s = ps->s;
	char why[384], text[200];

	pthread_mutex_lock(&ps->mtx);
	for (;;) {
		struct nccl_batch *b = ps->head;
		cohort_status st = COHORT_OK;
		int async = COHORT__NCCL_SUCCESS, e;

		if (b == NULL) {
			if (ps->closing)
				break;
			pthread_cond_wait(&ps->cv, &ps->mtx);
			continue;
		}
		pthread_mutex_unlock(&ps->mtx);
		why[0] = '\0';
		if (atomic_load(&ps->stop) != 0
		    || nccl_abort_requested(s, s->group_abort)) {
			st = COHORT_EABORTED;
			snprintf(why, sizeof(why), "aborted");
		} else if (s->comm == NULL || s->broken != COHORT_OK) {
			st = s->broken != COHORT_OK ? s->broken
			                            : COHORT_EABORTED;
			snprintf(why, sizeof(why),
			    "the NCCL communicator failed: %.300s",
			    s->broken_detail);
		} else if (s->nc->CommGetAsyncError(s->comm, &async)
		        != COHORT__NCCL_SUCCESS
		    || (async != COHORT__NCCL_SUCCESS
		        && async != COHORT__NCCL_IN_PROGRESS)) {
			st = nccl_async_status(async);
			snprintf(why, sizeof(why), "NCCL failed: %s %s",
			    cohort__nccl_result_name(async),
			    nccl_last_text(s->nc, s->comm));
		} else if ((e = s->cu->EventQuery(b->event))
		    == COHORT__CUDA_SUCCESS) {
			st = COHORT_OK;
		} else if (e != COHORT__CUDA_ERR_NOT_READY) {
			st = COHORT_ECUDA;
			snprintf(why, sizeof(why), "CUDA failed: %s",
			    cohort__dl_cuda_errtext(
			        s->cu, e, text, sizeof(text)));
		} else if (cohort__expired(b->deadline)) {
			st = COHORT_ETIMEDOUT;
			snprintf(why, sizeof(why),
			    "not complete at its deadline (the peer never "
			    "posted its side?)");
		} else {
			nccl_nap(NCCL_NAP_US);
			pthread_mutex_lock(&ps->mtx);
			continue;
		}
		pthread_mutex_lock(&ps->mtx);
		ps->head = b->next;
		if (ps->head == NULL)
			ps->tail = NULL;
		pthread_mutex_unlock(&ps->mtx);
		nccl_batch_done(ps, b, st, why);
		pthread_mutex_lock(&ps->mtx);
	}
	pthread_mutex_unlock(&ps->mtx);
	return (NULL);
}

static cohort_status
nccl_p2p_open(const struct cohort__group_desc *desc, void *state, void **out,
    char *err, size_t errlen, cohort__time deadline)
{
	struct nccl_p2p_state *ps;
	cohort_status st;

	(void)desc;
	(void)deadline;
	if (state == NULL) {
		snprintf(err, errlen,
		    "nccl point-to-point needs the group's communicator");
		return (COHORT_ESTATE);
	}
	if ((ps = calloc(1, sizeof(*ps))) == NULL) {
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	ps->s = state;
	atomic_init(&ps->stop, 0);
	if ((st = cohort__worker_start(&ps->mtx, &ps->cv, &ps->thread,
	         nccl_p2p_waiter, ps, "nccl waiter thread", err, errlen))
	    != COHORT_OK) {
		free(ps);
		return (st);
	}
	*out = ps;
	return (COHORT_OK);
}

static cohort_status
nccl_p2p_post(void *arg, struct cohort__p2p *const *reqs, size_t n, char *err,
    size_t errlen)
{
	struct nccl_p2p_state *ps = arg;
	struct nccl_state *s = ps->s;
	struct nccl_batch *b;
	struct nccl_p2p g;
	void *stream = n > 0 ? reqs[0]->stream : NULL;
	cohort_status rv;
	int e;

	for (size_t i = 0; i < n; i++) {
		const struct cohort__p2p *r = reqs[i];

		if (r->peer == COHORT__P2P_ANY) {
			snprintf(err, errlen,
			    "NCCL cannot receive from any rank: name the "
			    "peer");
			return (COHORT_ENOTSUP);
		}
		if (cohort__nccl_dtype(r->dtype) < 0 || r->stream != stream) {
			snprintf(err, errlen,
			    "transfer %zu: a dtype NCCL lacks, or another "
			    "stream than the batch's",
			    i);
			return (COHORT_EINVAL);
		}
		if (r->bytes > 0
		    && (rv = nccl_check_buf(s,
		            r->kind == COHORT__OP_SEND ? "send" : "recv",
		            r->buf, err, errlen))
		        != COHORT_OK)
			return (rv);
	}
	if (atomic_load(&ps->stop) != 0) {
		snprintf(err, errlen, "aborted");
		return (COHORT_EABORTED);
	}
	if ((b = calloc(1, sizeof(*b))) == NULL
	    || (b->reqs = malloc(n * sizeof(*b->reqs))) == NULL) {
		free(b);
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	memcpy(b->reqs, reqs, n * sizeof(*b->reqs));
	b->n = n;
	b->deadline = COHORT__TIME_NEVER;
	for (size_t i = 0; i < n; i++)
		if (reqs[i]->deadline < b->deadline)
			b->deadline = reqs[i]->deadline;
	pthread_mutex_lock(&s->enq_mtx);
	if (s->broken != COHORT_OK || s->comm == NULL) {
		snprintf(err, errlen,
		    "the NCCL communicator failed earlier: %s",
		    s->broken_detail);
		rv = s->broken != COHORT_OK ? s->broken : COHORT_EABORTED;
		goto out_unlock;
	}
	s->opname = "send/recv";
	if ((e = s->cu->SetDevice(s->device)) != COHORT__CUDA_SUCCESS) {
		rv = nccl_cuda_failed(s, "cudaSetDevice", e, err, errlen);
		goto out_unlock;
	}
	if ((rv = cohort__dl_cuda_event(s->cu, &b->event, err, errlen))
	    != COHORT_OK)
		goto out_unlock;
	if ((rv = nccl_group_start(s, err, errlen)) != COHORT_OK)
		goto out_unlock;
	for (size_t i = 0; i < n; i++) {
		struct cohort__p2p *r = reqs[i];
		int dt = cohort__nccl_dtype(r->dtype);

		if (r->kind == COHORT__OP_SEND
		        ? !nccl_p2p_send(
		            s, &g, r->buf, r->count, dt, r->peer, stream)
		        : !nccl_p2p_recv(
		            s, &g, r->buf, r->count, dt, r->peer, stream)) {
			rv = nccl_p2p_failed(s, &g, err, errlen);
			goto out_unlock;
		}
	}
	if ((rv = nccl_chk(s, "ncclGroupEnd", s->nc->GroupEnd(), err, errlen))
	        != COHORT_OK
	    || (rv = nccl_wait(s, false, err, errlen, b->deadline))
	        != COHORT_OK)
		goto out_unlock;
	if ((e = s->cu->EventRecord(b->event, stream))
	    != COHORT__CUDA_SUCCESS) {
		rv = nccl_cuda_failed(s, "cudaEventRecord", e, err, errlen);
		goto out_unlock;
	}
	pthread_mutex_unlock(&s->enq_mtx);
	pthread_mutex_lock(&ps->mtx);
	if (ps->tail != NULL)
		ps->tail->next = b;
	else
		ps->head = b;
	ps->tail = b;
	pthread_cond_signal(&ps->cv);
	pthread_mutex_unlock(&ps->mtx);
	return (COHORT_OK);

out_unlock:
	pthread_mutex_unlock(&s->enq_mtx);
	if (b->event != NULL)
		(void)s->cu->EventDestroy(b->event);
	free(b->reqs);
	free(b);
	return (rv);
}

static void
nccl_p2p_abort(void *arg)
{
	struct nccl_p2p_state *ps = arg;

	if (ps != NULL)
		atomic_store(&ps->stop, 1);
}

static void
nccl_p2p_close(void *arg)
{
	struct nccl_p2p_state *ps = arg;

	if (ps == NULL)
		return;
	/* What is still posted fails (EABORTED) before the waiter ends. */
	cohort__worker_stop(
	    &ps->mtx, &ps->cv, ps->thread, &ps->closing, &ps->stop);
	free(ps);
}

/* ------------------------------------------------------------------------ */
/* Elastic shrink                                                           */
/* ------------------------------------------------------------------------ */

/* ncclCommShrink's flag for a healthy parent (NCCL_SHRINK_DEFAULT). */
#define NCCL_SHRINK_DEFAULT 0

/* Do the survivors all hold an intact communicator? One gather through
 * the coordinator channel (every survivor takes part, whatever its
 * answer), so that all shrink or all re-create. */
static cohort_status
nccl_shrink_agree(struct nccl_state *s, const struct cohort__group_desc *desc,
    bool *all, char *err, size_t errlen, cohort__time deadline)
{
	struct cohort__chan_gather cg;
	uint8_t mine = s->comm != NULL && s->broken == COHORT_OK;
	struct cohort__iov iov = { &mine, 1 };
	cohort_status st;

	memset(&cg, 0, sizeof(cg));
	cg.shape.kind = COHORT__OP_ALLGATHER;
	cg.shape.dtype = COHORT_U8;
	cg.shape.count = 1;
	cg.parts = &iov;
	cg.nparts = 1;
	st = desc->chan.gather(desc->chan.ctx, &cg, err, errlen, deadline);
	if (st != COHORT_OK)
		return (st);
	*all = cg.len == (size_t)desc->size && cg.nlens == (size_t)desc->size;
	for (size_t i = 0; *all && i < cg.len; i++)
		*all = cg.data[i] == 1;
	desc->chan.release(desc->chan.ctx, &cg);
	return (COHORT_OK);
}

/*
 * The survivors' communicator from the previous generation's, less the
 * lost ranks (NCCL 2.27+ ncclCommShrink; NCCL keeps the survivors' order,
 * as the new generation's dense ranks do). Only when every survivor's is
 * intact (no operation failed on it: a change seen between operations,
 * the usual case at a step boundary); otherwise ENOTSUP and every
 * survivor re-creates one (fini + init, a new unique id). Without a GPU
 * this path is compiled, not run (tests/cuda/test_nccl.c skips it).
 */
static cohort_status
nccl_shrink(void *state, const struct cohort__group_desc *desc,
    const int *exclude, int nexclude, void **out, char *err, size_t errlen,
    cohort__time deadline)
{
	struct nccl_state *s = state, *n;
	struct cohort__nccl_config cfg;
	bool all = false;
	cohort_status rv;
	int r;

	if (s == NULL || s->nc->CommShrink == NULL || desc->chan.gather == NULL
	    || nexclude < 1) {
		snprintf(err, errlen, "ncclCommShrink is not available%s",
		    s != NULL && s->nc->CommShrink == NULL
		        ? " (NCCL older than 2.27)"
		        : "");
		return (COHORT_ENOTSUP);
	}
	if ((rv = nccl_shrink_agree(s, desc, &all, err, errlen, deadline))
	    != COHORT_OK) {
		nccl_free(s);
		return (rv);
	}
	if (!all) {
		snprintf(err, errlen,
		    "a survivor's communicator did not survive the change");
		return (COHORT_ENOTSUP);
	}
	if ((n = calloc(1, sizeof(*n))) == NULL) {
		nccl_free(s);
		snprintf(err, errlen, "out of memory");
		return (COHORT_ENOMEM);
	}
	if (pthread_mutex_init(&n->enq_mtx, NULL) != 0) {
		free(n);
		nccl_free(s);
		snprintf(err, errlen, "pthread_mutex_init failed");
		return (COHORT_ESYSTEM);
	}
	n->cu = s->cu;
	n->nc = s->nc;
	n->rank = desc->rank;
	n->size = desc->size;
	n->device = s->device;
	n->global_ranks = desc->global_ranks;
	n->group_abort = desc->abort_flag;
	atomic_init(&n->aborted, 0);
	n->opname = "shrink";
	cohort__strlcpy(n->group_id,
	    desc->group_id != NULL ? desc->group_id : "", sizeof(n->group_id));
	n->event = s->event;
	n->scratch = s->scratch;
	n->scratch_len = s->scratch_len;
	s->event = NULL;
	s->scratch = NULL;
	cohort__nccl_config_init(&cfg);
	cfg.blocking = 0;
	cfg.commName = n->group_id;
	r = s->nc->CommShrink(s->comm, (int *)exclude, nexclude, &n->comm,
	    &cfg, NCCL_SHRINK_DEFAULT);
	if ((r != COHORT__NCCL_SUCCESS && r != COHORT__NCCL_IN_PROGRESS)
	    || n->comm == NULL) {
		snprintf(err, errlen,
		    "ncclCommShrink (group %s, rank %d of %d, %d lost): %s",
		    n->group_id, n->rank, n->size, nexclude,
		    cohort__nccl_result_name(r));
		nccl_free(s);
		nccl_free(n);
		return (COHORT_ENCCL);
	}
	if ((rv = nccl_wait(n, false, err, errlen, deadline)) != COHORT_OK) {
		nccl_free(s);
		nccl_free(n);
		return (rv);
	}
	/* The parent: its lost ranks cannot take part in a finalize. */
	nccl_free(s);
	cohort__debug("nccl group %s: shrunk to rank %d of %d (%d lost)",
	    n->group_id, n->rank, n->size, nexclude);
	n->opname = "";
	*out = n;
	return (COHORT_OK);
}

const struct cohort__backend_ops cohort__nccl_backend = {
	.version = COHORT__BACKEND_VERSION,
	.name = "nccl",
	.init = nccl_init,
	.run = nccl_run,
	.abort = nccl_abort,
	.fini = nccl_fini,
	.p2p_open = nccl_p2p_open,
	.p2p_post = nccl_p2p_post,
	.p2p_abort = nccl_p2p_abort,
	.p2p_close = nccl_p2p_close,
	.p2p_needs_state = true,
	.shrink = nccl_shrink,
};

/* NCCL usable here: the CUDA runtime with a device, and libnccl (probed
 * once by the loader). */
bool
cohort__nccl_available(char *why, size_t len)
{
	const struct cohort__dl_nccl *nc;

	return (cohort__dl_nccl_get(&nc, why, len) == COHORT_OK);
}
