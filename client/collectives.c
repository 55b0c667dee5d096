/*
 * collectives.c - the data-plane layer between the public API and the
 * backends (tcp, service, nccl).
 *
 * Per group (struct coll_dp, in g->dp):
 *  - the backend: chosen at the first operation ("auto": nccl for
 *    device memory, tcp-staged where NCCL is missing, tcp for host
 *    memory), set up lazily by the
 *    first operation that moves data (every member reaches it at the same
 *    operation), with a descriptor whose rendezvous store is the job's KV
 *    at cohortd;
 *  - ordering: every operation takes a ticket; tickets are served one at
 *    a time, in order. A blocking call runs in the caller's thread as soon
 *    as its ticket is served (at once on an idle group: no hand-off, which
 *    costs a scheduler tick); asynchronous operations go to a FIFO that a
 *    progress thread, created at the first i-call, executes in the same
 *    ticket order;
 *  - errors: the sticky error is checked before every operation; a
 *    backend failure that leaves the connections unusable (EPEERLOST,
 *    ETIMEDOUT, EABORTED) fails the group with the backend's detail. A peer
 *    lost on the data plane is usually also seen by cohortd, whose verdict
 *    names the rank that really failed (a neighbour that merely aborted
 *    closes its sockets too); we wait briefly for it before using ours.
 *
 * Point-to-point transfers (send, recv and their i-forms, batches) take
 * no ticket: they are not ordered with the collectives or with each
 * other, so that a send to rank 1 and a receive from rank 2 may be in
 * flight at once, beside a collective in another thread. The group's
 * backend carries them through its own point-to-point state (backend.h
 * v3: p2p_open at the first transfer, not collective; host: connections
 * of their own per pair, client/backend/host/p2p.c), or, where it has
 * none, the service backend's through cohortd's KV. The backend completes
 * each transfer from its own thread; the thread that waits for one turns
 * a failure that broke the connections into the group's sticky error, as
 * for a collective.
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "sha256.h"
#include "client.h"
#include "collectives.h"
#include "group.h"

/* Slice of a rendezvous-store wait, so that an abort interrupts it. */
#define COLL_STORE_SLICE_MS 2000
/* How long a backend EPEERLOST waits for cohortd's verdict on the group. */
#define COLL_ATTRIB_MS 2000
/* The coordinator channel's gathers are keyed at cohortd by (group,
 * op_seq), like the group's control-plane collectives (control.c), which
 * number theirs 1, 2, ...: the channel numbers its own from 2^62, so that
 * a data-plane operation on a progress thread and a barrier in the
 * caller's thread never take each other's numbers. */
#define COLL_CHAN_SEQ_BASE (UINT64_C(1) << 62)

enum coll_fix {
	COLL_FIX_NONE = 0,
	COLL_FIX_MOVE_IN, /* input at recv[0]: move it to its slot first */
	COLL_FIX_TMP_OUT, /* output overlaps input: run into a temporary */
};

struct coll_dp {
	struct cohort_group *g;
	char want[16]; /* auto, tcp, service, nccl */

	pthread_mutex_t mtx;
	pthread_cond_t cv; /* ticket served, work done */
	/* Work queued or stop: what the idle progress thread waits for. Not
	 * cv, which every blocking operation broadcasts when it ends: an idle
	 * thread woken per operation costs a context switch that takes the
	 * core a spinning rank on the same host needs (measured: 4 KiB
	 * all-reduce, 2 ranks, 1 us median became 8-20 us in half the runs).
	 */
	pthread_cond_t work_cv;
	const struct cohort__backend_ops *ops; /* resolved, under mtx */
	uint64_t next_ticket;
	uint64_t serving;
	struct cohort_work *head, *tail; /* async work not started yet */
	bool thread_started; /* joinable (it may have exited) */
	bool thread_exited; /* an eager set-up's thread that found no work */
	bool thread_eager; /* counted in coll_eager_threads */
	bool stop;
	pthread_t thread;
	bool
	    early_setup; /* a set-up queued at creation, ticket early_ticket */
	uint64_t early_ticket;

	/* Elastic: the previous generation's backend state kept for a
	 * shrink (backend.h, ops.shrink) at the next set-up instead of a new
	 * rendezvous, with the group ranks that were lost. */
	const struct cohort__backend_ops *shrink_ops;
	void *shrink_state;
	int *shrink_exclude;
	int shrink_n;

	/* Backend set-up, under g->op_lock. */
	bool inited;
	char group_id[COHORT__GROUP_ID_MAX + 8];
	char key_prefix[COHORT__GROUP_ID_MAX + 64];
	uint8_t secret[32];
	struct cohort__group_desc desc;

	/* The coordinator channel (backend.h): one gather at a time (the
	 * backend runs under g->op_lock). The request and the call live
	 * here from gather to release: a reconnect re-sends the request. */
	pthread_mutex_t chan_mtx; /* chan_busy, chan_aborted */
	uint64_t chan_seq;
	bool chan_busy;
	bool chan_aborted;
	Cohort__Request chan_req;
	Cohort__Collective chan_body;
	struct cohort__coord_call chan_call;

	/* Point-to-point: the state opened at the first transfer (under
	 * p2p_mtx; read without it through the atomics), the backend whose
	 * it is (the group's, or the service backend's as a fallback) and
	 * the transfers' numbers. */
	pthread_mutex_t p2p_mtx;
	_Atomic(const struct cohort__backend_ops *) p2p_ops;
	_Atomic(void *) p2p;
	atomic_uint_fast64_t p2p_seq;
	bool desc_filled;
};

struct cohort_work {
	struct coll_dp *dp;
	struct cohort__op op;
	cohort__time deadline;
	uint64_t ticket;
	enum coll_fix fix;
	size_t fix_off; /* MOVE_IN: the slot's offset in recv */
	size_t fix_len; /* bytes moved / of the temporary */
	void *tmp; /* TMP_OUT: allocated at issue */
	bool heap; /* allocated by an i-call */
	bool setup_only; /* sets up the backend, moves no data */
	bool detached; /* nobody waits: the progress thread frees it */
	/* A point-to-point transfer (no ticket): the backend's view of it,
	 * and whether its failure was already turned into the group's. */
	bool is_p2p;
	bool p2p_handled;
	struct cohort__p2p p2p;
	size_t *vcounts; /* ALLTOALLV: a copy of the 4 count arrays */
	atomic_bool done;
	cohort_status st;
	char err[COHORT__DETAIL_MAX];
	struct cohort_work *next;
};

/* ------------------------------------------------------------------------ */
/* Backend choice                                                           */
/* ------------------------------------------------------------------------ */

/* Resolves the group's backend at its first operation (stream and ptr,
 * one of its buffers: that operation's). Later operations keep it.
 * "auto": device memory (or a stream) goes to nccl, or to tcp-staged
 * where NCCL cannot be loaded; host memory to tcp. */
static cohort_status
coll_resolve(struct coll_dp *dp, void *stream, const void *ptr,
    const struct cohort__backend_ops **out)
{
	const struct cohort__backend_ops *ops;
	char why[256] = "";

	pthread_mutex_lock(&dp->mtx);
	if ((ops = dp->ops) == NULL) {
		const struct cohort__backend_entry *e;
		if (strcmp(dp->want, "auto") != 0) {
			e = cohort__backend_find(dp->want);
			if (e != NULL
			    && !cohort__backend_usable(e, why, sizeof(why)))
				e = NULL;
		} else {
			e = cohort__backend_pick(
			    stream != NULL || cohort__is_device_ptr(ptr)
			        ? COHORT__MEM_DEVICE
			        : COHORT__MEM_HOST,
			    why, sizeof(why));
		}
		ops = e != NULL ? e->ops : NULL;
		dp->ops = ops;
	}
	pthread_mutex_unlock(&dp->mtx);
	if (ops == NULL && strcmp(dp->want, "auto") != 0) {
		/* The backend this group was configured with cannot run in
		 * this process: no data-plane operation of the group can
		 * succeed, so the group fails, with the reason as its text
		 * (cohort_group_last_error). */
		(void)cohort__group_fail_local(dp->g, COHORT_ENOTSUP,
		    COHORT_FAILURE_UNAVAILABLE,
		    "the %s backend configured for group '%s' is not "
		    "available here: %s",
		    dp->want, dp->g->id[0] ? dp->g->id : "world", why);
		return (cohort__group_check(dp->g));
	}
	if (ops == NULL)
		return (cohort__err(COHORT_ENOTSUP,
		    "group '%s': the nccl backend is not available for "
		    "device memory: %s",
		    dp->g->id[0] ? dp->g->id : "world", why));
	*out = ops;
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Per-group state                                                          */
/* ------------------------------------------------------------------------ */

/* Progress threads started for an eager set-up, in this process: they
 * end once the set-up is done and no i-call is queued, and no more than
 * COLL_EAGER_THREADS run at once (more groups set up at their first
 * operation instead), so a process holding thousands of clients does not
 * hold a thread per client and group. */
#define COLL_EAGER_THREADS 32
static atomic_int coll_eager_threads;

static void coll_dp_fini(struct cohort_group *g);
static void coll_dp_abort(struct cohort_group *g);
static void coll_setup_work(struct cohort_work *w);

static cohort_status
coll_dp_alloc(struct cohort_group *g, const char *want, struct coll_dp **out)
{
	struct coll_dp *dp;

	if ((dp = calloc(1, sizeof(*dp))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if (pthread_mutex_init(&dp->mtx, NULL) != 0) {
		free(dp);
		return (cohort__err(COHORT_ESYSTEM, "pthread_mutex_init"));
	}
	if (cohort__cond_init(&dp->cv) != 0) {
		pthread_mutex_destroy(&dp->mtx);
		free(dp);
		return (cohort__err(COHORT_ESYSTEM, "pthread_cond_init"));
	}
	if (cohort__cond_init(&dp->work_cv) != 0) {
		pthread_cond_destroy(&dp->cv);
		pthread_mutex_destroy(&dp->mtx);
		free(dp);
		return (cohort__err(COHORT_ESYSTEM, "pthread_cond_init"));
	}
	if (pthread_mutex_init(&dp->chan_mtx, NULL) != 0) {
		pthread_cond_destroy(&dp->work_cv);
		pthread_cond_destroy(&dp->cv);
		pthread_mutex_destroy(&dp->mtx);
		free(dp);
		return (cohort__err(COHORT_ESYSTEM, "pthread_mutex_init"));
	}
	if (pthread_mutex_init(&dp->p2p_mtx, NULL) != 0) {
		pthread_mutex_destroy(&dp->chan_mtx);
		pthread_cond_destroy(&dp->work_cv);
		pthread_cond_destroy(&dp->cv);
		pthread_mutex_destroy(&dp->mtx);
		free(dp);
		return (cohort__err(COHORT_ESYSTEM, "pthread_mutex_init"));
	}
	atomic_init(&dp->p2p_ops, NULL);
	atomic_init(&dp->p2p, NULL);
	atomic_init(&dp->p2p_seq, 0);
	dp->g = g;
	cohort__strlcpy(dp->want,
	    want != NULL && want[0] != '\0' ? want : "auto", sizeof(dp->want));
	*out = dp;
	return (COHORT_OK);
}

/* The group's data-plane state, created at first use (the world group's
 * with the client's configured backend). */
static cohort_status
coll_dp_get(struct cohort_group *g, struct coll_dp **out)
{
	struct coll_dp *dp;
	cohort_status st = COHORT_OK;

	pthread_mutex_lock(&g->mtx);
	if ((dp = g->dp) == NULL) {
		st = coll_dp_alloc(g, g->client->backend, &dp);
		if (st == COHORT_OK) {
			g->dp = dp;
			g->dp_fini = coll_dp_fini;
			g->dp_abort = coll_dp_abort;
		}
	}
	pthread_mutex_unlock(&g->mtx);
	if (st == COHORT_OK)
		*out = dp;
	return (st);
}

/* Drains the queue, stops the progress thread, finis the backend. Called
 * by cohort__group_free. */
static void
coll_dp_fini(struct cohort_group *g)
{
	struct coll_dp *dp = g->dp;
	void *state, *p2p;

	if (dp == NULL)
		return;
	pthread_mutex_lock(&dp->mtx);
	dp->stop = true;
	pthread_cond_broadcast(&dp->cv);
	pthread_cond_broadcast(&dp->work_cv);
	pthread_mutex_unlock(&dp->mtx);
	if (dp->thread_started)
		pthread_join(dp->thread, NULL);
	if (dp->thread_eager) /* stopped before it found the queue empty */
		atomic_fetch_sub(&coll_eager_threads, 1);
	pthread_mutex_lock(&g->mtx);
	state = g->backend_state;
	g->backend_state = NULL;
	g->dp_abort = NULL;
	pthread_mutex_unlock(&g->mtx);
	/* Transfers still held fail (EABORTED); their works are done. */
	if ((p2p = atomic_load(&dp->p2p)) != NULL)
		atomic_load(&dp->p2p_ops)->p2p_close(p2p);
	if (state != NULL && g->backend != NULL)
		g->backend->fini(state);
	if (dp->shrink_state != NULL)
		dp->shrink_ops->fini(dp->shrink_state);
	free(dp->shrink_exclude);
	g->dp = NULL;
	g->dp_fini = NULL;
	pthread_cond_destroy(&dp->cv);
	pthread_cond_destroy(&dp->work_cv);
	pthread_mutex_destroy(&dp->p2p_mtx);
	pthread_mutex_destroy(&dp->chan_mtx);
	pthread_mutex_destroy(&dp->mtx);
	free(dp);
}

/* cohort__group_fail's hook (g->mtx held): point-to-point transfers are
 * outside the ordered operations the backend's abort reaches. */
static void
coll_dp_abort(struct cohort_group *g)
{
	struct coll_dp *dp = g->dp;
	void *p2p;

	if (dp != NULL && (p2p = atomic_load(&dp->p2p)) != NULL)
		atomic_load(&dp->p2p_ops)->p2p_abort(p2p);
}

void
cohort__coll_teardown(struct cohort_group *g, const int *exclude, int nexclude)
{
	const struct cohort__backend_ops *ops = NULL;
	struct coll_dp *dp, *fresh = NULL;
	char want[sizeof(dp->want)];
	void *keep = NULL;
	int *ex = NULL;

	if ((dp = g->dp) == NULL)
		return;
	cohort__strlcpy(want, dp->want, sizeof(want));
	/* A backend that can shrink keeps its state for the next set-up
	 * (stopping the progress thread first: nothing runs on it). */
	pthread_mutex_lock(&dp->mtx);
	dp->stop = true;
	pthread_cond_broadcast(&dp->cv);
	pthread_cond_broadcast(&dp->work_cv);
	pthread_mutex_unlock(&dp->mtx);
	if (dp->thread_started) {
		pthread_join(dp->thread, NULL);
		dp->thread_started = false;
	}
	pthread_mutex_lock(&g->mtx);
	if (nexclude > 0 && g->backend != NULL && g->backend->version >= 3
	    && g->backend->shrink != NULL && g->backend_state != NULL
	    && (ex = malloc((size_t)nexclude * sizeof(int))) != NULL) {
		memcpy(ex, exclude, (size_t)nexclude * sizeof(int));
		ops = g->backend;
		keep = g->backend_state;
		g->backend_state = NULL;
	}
	pthread_mutex_unlock(&g->mtx);
	coll_dp_fini(g);
	pthread_mutex_lock(&g->mtx);
	g->backend = NULL;
	pthread_mutex_unlock(&g->mtx);
	/* A new one with the backend the group was made with; without
	 * memory for it, the next operation makes one with the client's. */
	if (coll_dp_alloc(g, want, &fresh) == COHORT_OK) {
		fresh->shrink_ops = ops;
		fresh->shrink_state = keep;
		fresh->shrink_exclude = ex;
		fresh->shrink_n = nexclude;
		g->dp = fresh;
		g->dp_fini = coll_dp_fini;
		g->dp_abort = coll_dp_abort;
	} else if (keep != NULL) {
		ops->fini(keep);
		free(ex);
	}
}

/* ------------------------------------------------------------------------ */
/* The rendezvous store: the job's KV, under a per-group prefix             */
/* ------------------------------------------------------------------------ */

static cohort_status
coll_store_key(struct coll_dp *dp, const char *key, char *buf, size_t len)
{
	int n = snprintf(buf, len, "%s%s", dp->key_prefix, key);

	if (n < 0 || (size_t)n >= len)
		return (
		    cohort__err(COHORT_EINVAL, "store key too long: %s", key));
	return (COHORT_OK);
}

static cohort_status
coll_store_set(void *ctx, const char *key, const void *val, size_t len,
    cohort__time deadline)
{
	struct coll_dp *dp = ctx;
	char full[COHORT__MAX_KEY + 1];
	cohort_status st;

	if ((st = coll_store_key(dp, key, full, sizeof(full))) != COHORT_OK)
		return (st);
	return (cohort__kv_set(
	    dp->g->client, full, val, len, cohort__remaining(deadline)));
}

/* One attempt at reading what a store wait wants, for at most `left`. */
typedef cohort_status (*coll_store_try)(
    struct coll_dp *dp, void *arg, cohort_duration left);

/* Waits in slices until `once` finds its keys, the deadline passes or the
 * group fails (`key` names what it waits for in that error). */
static cohort_status
coll_store_wait(struct coll_dp *dp, const char *key, coll_store_try once,
    void *arg, cohort__time deadline)
{
	cohort_status st;

	for (;;) {
		cohort_duration left = cohort__remaining(deadline);

		if (atomic_load_explicit(
		        &dp->g->abort_flag, memory_order_acquire)
		    != 0)
			return (cohort__err(COHORT_EABORTED,
			    "group '%s' failed while waiting for store key %s",
			    dp->g->id, key));
		/* An elastic job's reform waits for a set-up that waits here
		 * for a lost member's address: shorter slices. */
		cohort_duration slice = dp->g->client->min_world > 0
		    ? COLL_STORE_SLICE_MS / 4
		    : COLL_STORE_SLICE_MS;

		if (left < 0 || left > slice)
			left = slice;
		st = once(dp, arg, left);
		if (st == COHORT_ENOCOORD && !cohort__expired(deadline)
		    && cohort_group_error(dp->g) == COHORT_OK) {
			/* A slice whose answer came late (a starved cohortd
			 * answers a parked wait after the reply grace): ask
			 * again; a coordinator really lost fails the group,
			 * or the deadline ends this. */
			struct timespec ts = { 0, 50 * 1000 * 1000 };

			nanosleep(&ts, NULL);
			continue;
		}
		if (st != COHORT_ETIMEDOUT || cohort__expired(deadline))
			return (st);
	}
}

struct coll_get_args {
	const char *key;
	void **val;
	size_t *len;
};

static cohort_status
coll_store_get_once(struct coll_dp *dp, void *arg, cohort_duration left)
{
	struct coll_get_args *a = arg;

	return (cohort__kv_get(dp->g->client, a->key, a->val, a->len, left));
}

static cohort_status
coll_store_get(
    void *ctx, const char *key, void **val, size_t *len, cohort__time deadline)
{
	struct coll_dp *dp = ctx;
	char full[COHORT__MAX_KEY + 1];
	struct coll_get_args a = { full, val, len };
	cohort_status st;

	if ((st = coll_store_key(dp, key, full, sizeof(full))) != COHORT_OK)
		return (st);
	return (coll_store_wait(dp, key, coll_store_get_once, &a, deadline));
}

struct coll_mget_args {
	const char *const *keys;
	size_t n;
	void **vals;
	size_t *lens;
};

static cohort_status
coll_store_mget_once(struct coll_dp *dp, void *arg, cohort_duration left)
{
	struct coll_mget_args *a = arg;

	return (cohort__kv_multi_get(
	    dp->g->client, a->keys, a->n, a->vals, a->lens, left));
}

/* Several keys in one request (the host mesh's partner addresses: one
 * round trip instead of one per partner); waits as coll_store_get does. */
static cohort_status
coll_store_mget(void *ctx, const char *const *keys, size_t n, void **vals,
    size_t *lens, cohort__time deadline)
{
	struct coll_dp *dp = ctx;
	char(*full)[COHORT__MAX_KEY + 1];
	const char **kp;
	struct coll_mget_args a;
	cohort_status st = COHORT_OK;

	if (n == 0)
		return (COHORT_OK);
	full = calloc(n, sizeof(*full));
	kp = calloc(n, sizeof(*kp));
	if (full == NULL || kp == NULL) {
		free(full);
		free(kp);
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	}
	for (size_t i = 0; i < n && st == COHORT_OK; i++) {
		st = coll_store_key(dp, keys[i], full[i], sizeof(full[i]));
		kp[i] = full[i];
	}
	a = (struct coll_mget_args) { kp, n, vals, lens };
	if (st == COHORT_OK)
		st = coll_store_wait(
		    dp, keys[0], coll_store_mget_once, &a, deadline);
	free(full);
	free(kp);
	return (st);
}

static cohort_status
coll_store_add(void *ctx, const char *key, int64_t delta, int64_t *out,
    cohort__time deadline)
{
	struct coll_dp *dp = ctx;
	char full[COHORT__MAX_KEY + 1];
	cohort_status st;

	if ((st = coll_store_key(dp, key, full, sizeof(full))) != COHORT_OK)
		return (st);
	return (cohort__kv_add(
	    dp->g->client, full, delta, out, cohort__remaining(deadline)));
}

static cohort_status
coll_store_del(void *ctx, const char *key, cohort__time deadline)
{
	struct coll_dp *dp = ctx;
	char full[COHORT__MAX_KEY + 1];
	cohort_status st;

	if ((st = coll_store_key(dp, key, full, sizeof(full))) != COHORT_OK)
		return (st);
	return (cohort__kv_delete(
	    dp->g->client, full, cohort__remaining(deadline)));
}

/* ------------------------------------------------------------------------ */
/* The coordinator channel: gathers at cohortd (COLL_SERVICE)               */
/* ------------------------------------------------------------------------ */

static cohort_status
coll_chan_gather(void *ctx, struct cohort__chan_gather *cg, char *err,
    size_t errlen, cohort__time deadline)
{
	struct coll_dp *dp = ctx;
	struct cohort_group *g = dp->g;
	struct cohort__coord_call *call = &dp->chan_call;
	const Cohort__CollectiveReply *cr;
	cohort_status st;

	cohort__request__init(&dp->chan_req);
	cohort__collective__init(&dp->chan_body);
	dp->chan_body.kind = COHORT__COLLECTIVE_KIND__COLL_SERVICE;
	dp->chan_body.group = g->id;
	dp->chan_body.op_seq = COLL_CHAN_SEQ_BASE | ++dp->chan_seq;
	dp->chan_body.name = (char *)"";
	dp->chan_body.root = cg->shape.root;
	dp->chan_body.op = cg->shape.op;
	dp->chan_body.service_op = cg->shape.kind;
	dp->chan_body.dtype = cg->shape.dtype;
	dp->chan_body.count = cg->shape.count;
	dp->chan_req.body_case = COHORT__REQUEST__BODY_COLLECTIVE;
	dp->chan_req.collective = &dp->chan_body;
	cohort__coord_call_init(call, &dp->chan_req, deadline);
	call->parts = cg->parts;
	call->nparts = cg->nparts;
	cg->priv = NULL;

	pthread_mutex_lock(&dp->chan_mtx);
	if (dp->chan_aborted
	    || atomic_load_explicit(&g->abort_flag, memory_order_acquire)) {
		pthread_mutex_unlock(&dp->chan_mtx);
		cohort__coord_call_fini(call);
		snprintf(err, errlen, "aborted");
		return (COHORT_EABORTED);
	}
	dp->chan_busy = true;
	pthread_mutex_unlock(&dp->chan_mtx);
	st = cohort__coord_call(g->client->coord, call);
	pthread_mutex_lock(&dp->chan_mtx);
	dp->chan_busy = false;
	pthread_mutex_unlock(&dp->chan_mtx);

	if (st != COHORT_OK) {
		snprintf(err, errlen, "%s", cohort_last_error());
		/* A failed peer concerns every group of the client. */
		cohort__client_job_failed(g->client, st, call->rep);
		cohort__coord_call_fini(call);
		return (st);
	}
	if ((cr = cohort__coord_reply_body(
	         call, COHORT__REPLY__BODY_COLLECTIVE))
	    == NULL) {
		snprintf(err, errlen, "a gather reply without its result");
		cohort__coord_call_fini(call);
		return (COHORT_EPROTO);
	}
	cg->data = call->payload;
	cg->len = call->plen;
	cg->lens = cr->i64s;
	cg->nlens = cr->n_i64s;
	cg->wait_ns = cr->parked ? cr->parked_us * 1000u : 0;
	cg->priv = call;
	return (COHORT_OK);
}

static void
coll_chan_release(void *ctx, struct cohort__chan_gather *cg)
{
	(void)ctx;
	if (cg->priv != NULL)
		cohort__coord_call_fini(cg->priv);
	cg->priv = NULL;
}

static void
coll_chan_abort(void *ctx)
{
	struct coll_dp *dp = ctx;

	pthread_mutex_lock(&dp->chan_mtx);
	dp->chan_aborted = true;
	if (dp->chan_busy)
		cohort__coord_call_abort(
		    dp->g->client->coord, &dp->chan_call, COHORT_EABORTED);
	pthread_mutex_unlock(&dp->chan_mtx);
}

/* ------------------------------------------------------------------------ */
/* Execution                                                                */
/* ------------------------------------------------------------------------ */

static const char *
coll_what(const struct cohort_work *w)
{
	return (
	    w->setup_only ? "data-plane set-up" : cohort__op_name(w->op.kind));
}

/* A backend failure: make the connection-breaking ones sticky. Returns the
 * status to report, with its detail in w->err. */
static cohort_status
coll_failed(struct coll_dp *dp, struct cohort_work *w, cohort_status st,
    const char *err)
{
	struct cohort_group *g = dp->g;
	const char *what = coll_what(w);

	if (err[0] == '\0')
		err = cohort_strerror(st);
	if (st != COHORT_EPEERLOST && st != COHORT_ETIMEDOUT
	    && st != COHORT_EABORTED) {
		snprintf(w->err, sizeof(w->err), "%s #%" PRIu64 ": %s", what,
		    w->op.seq, err);
		return (st);
	}
	if (st == COHORT_ETIMEDOUT && !w->setup_only && !w->is_p2p) {
		/* Name the ranks that never entered it (asks cohortd). */
		char who[512];
		size_t off;

		if (cohort__client_who_missing(
		        g->client, g, what, w->op.seq, who, sizeof(who))) {
			if (err != w->err)
				cohort__strlcpy(w->err, err, sizeof(w->err));
			off = strlen(w->err);
			cohort__appendf(
			    w->err, sizeof(w->err), &off, "; %s", who);
			err = w->err;
		}
	}
	if (st == COHORT_EPEERLOST) {
		struct cohort_client *c = g->client;
		cohort_duration wait = cohort__scaled(COLL_ATTRIB_MS);
		cohort__time until;

		/* Elastic: cohortd's verdict (EMEMBERSHIP, or EPEERLOST
		 * below the minimum) must be what every survivor returns; a
		 * member cut off without a closed connection is named only
		 * after dead-after, so wait as long as that when needed. */
		if (c->min_world > 0
		    && wait < c->dead_after_ms + 2 * c->heartbeat_ms)
			wait = c->dead_after_ms + 2 * c->heartbeat_ms;
		until = cohort__now_ms() + wait;
		struct timespec ts = { 0, 2 * 1000 * 1000 };

		while (cohort_group_error(g) == COHORT_OK
		    && cohort__now_ms() < until)
			nanosleep(&ts, NULL);
	}
	/* An abort that the group's own failure caused tells nothing new;
	 * anything else is what this process saw (the cause, or beside
	 * cohortd's verdict). */
	if (st != COHORT_EABORTED || cohort_group_error(g) == COHORT_OK) {
		cohort_failure f;

		cohort__failure_local(&f, st,
		    st == COHORT_ETIMEDOUT      ? COHORT_FAILURE_TIMEOUT
		        : st == COHORT_EABORTED ? COHORT_FAILURE_ABORTED
		                                : COHORT_FAILURE_DATA_PLANE,
		    "%s", err);
		cohort__strlcpy(f.operation, what, sizeof(f.operation));
		f.seq = w->setup_only ? 0 : w->op.seq;
		cohort__strlcpy(f.group, g->id, sizeof(f.group));
		cohort__group_fail(g, &f);
	}
	st = cohort__group_check(g);
	cohort__strlcpy(w->err, cohort_last_error(), sizeof(w->err));
	return (st);
}

/* The descriptor handed to the backend (init, p2p_open), filled once. */
static void
coll_desc_fill(struct coll_dp *dp)
{
	struct cohort_group *g = dp->g;
	struct cohort_client *c = g->client;
	struct cohort__group_desc *d = &dp->desc;
	struct cohort__sha256 sh;
	static const char label[] = "cohort data plane v1";

	pthread_mutex_lock(&dp->mtx);
	if (dp->desc_filled) {
		pthread_mutex_unlock(&dp->mtx);
		return;
	}
	if (g->id[0] == '\0')
		cohort__strlcpy(dp->group_id, "world", sizeof(dp->group_id));
	else
		snprintf(dp->group_id, sizeof(dp->group_id), "sub.%s", g->id);
	snprintf(dp->key_prefix, sizeof(dp->key_prefix),
	    COHORT__KV_RESERVED "dp/%" PRIu64 "/%s/", g->generation,
	    dp->group_id);
	cohort__sha256_init(&sh);
	cohort__sha256_update(&sh, label, sizeof(label));
	cohort__sha256_update(&sh, c->token, strlen(c->token));
	cohort__sha256_final(&sh, dp->secret);

	*d = (struct cohort__group_desc) {
		.job = c->job,
		.generation = g->generation,
		.group_id = dp->group_id,
		.rank = g->rank,
		.size = g->size,
		.global_ranks = g->global_ranks,
		.secret = dp->secret,
		.secret_len = sizeof(dp->secret),
		.bind_addr = c->data_addr[0] != '\0' ? c->data_addr : NULL,
		.store = { .ctx = dp,
		    .set = coll_store_set,
		    .get = coll_store_get,
		    .add = coll_store_add,
		    .del = coll_store_del,
		    .mget = coll_store_mget },
		.abort_flag = &g->abort_flag,
		.chan = { .ctx = dp,
		    .gather = coll_chan_gather,
		    .release = coll_chan_release,
		    .abort = coll_chan_abort },
	};
	dp->desc_filled = true;
	pthread_mutex_unlock(&dp->mtx);
}

/* A backend table this library can drive (backend.h's versions). */
static bool
coll_version_ok(const struct cohort__backend_ops *ops)
{
	return (ops->version >= COHORT__BACKEND_VERSION_MIN
	    && ops->version <= COHORT__BACKEND_VERSION);
}

static cohort_status
coll_backend_init(struct coll_dp *dp, struct cohort_work *w)
{
	struct cohort_group *g = dp->g;
	const struct cohort__backend_ops *ops;
	struct cohort__group_desc *d = &dp->desc;
	char err[512] = "";
	void *state = NULL;
	cohort_status st;

	pthread_mutex_lock(&dp->mtx);
	ops = dp->ops;
	pthread_mutex_unlock(&dp->mtx);
	if (!coll_version_ok(ops)) {
		snprintf(w->err, sizeof(w->err),
		    "backend %s has version %u, this library knows %u to %u",
		    ops->name, ops->version, COHORT__BACKEND_VERSION_MIN,
		    COHORT__BACKEND_VERSION);
		return (COHORT_ENOTSUP);
	}
	coll_desc_fill(dp);
	cohort__debug("group '%s': %s backend set-up (rank %d of %d)", g->id,
	    ops->name, g->rank, g->size);
	st = COHORT_ENOTSUP;
	if (dp->shrink_state != NULL) {
		/* elastic: the survivors shrink the previous generation's
		 * (they all do, or all get ENOTSUP and init anew) */
		void *old = dp->shrink_state;

		dp->shrink_state = NULL;
		if (dp->shrink_ops == ops)
			st = ops->shrink(old, d, dp->shrink_exclude,
			    dp->shrink_n, &state, err, sizeof(err),
			    w->deadline);
		if (st == COHORT_ENOTSUP) {
			cohort__debug("group '%s': no shrink (%s): a new %s "
			              "set-up",
			    g->id, err[0] ? err : "another backend",
			    ops->name);
			dp->shrink_ops->fini(old);
			err[0] = '\0';
		}
	}
	if (st == COHORT_ENOTSUP)
		st = ops->init(d, &state, err, sizeof(err), w->deadline);
	if (st != COHORT_OK) {
		if (st == COHORT_ENOTSUP || st == COHORT_EINVAL
		    || st == COHORT_ENOMEM) {
			snprintf(w->err, sizeof(w->err),
			    "%s backend set-up: %s", ops->name,
			    err[0] != '\0' ? err : cohort_strerror(st));
			return (st);
		}
		/* Peers may be half connected: the group is unusable. */
		if (st != COHORT_EPEERLOST && st != COHORT_ETIMEDOUT
		    && st != COHORT_EABORTED)
			cohort__group_fail_local(g, st,
			    COHORT_FAILURE_DATA_PLANE, "%s backend set-up: %s",
			    ops->name,
			    err[0] != '\0' ? err : cohort_strerror(st));
		return (coll_failed(dp, w, st, err));
	}
	pthread_mutex_lock(&g->mtx);
	g->backend = ops;
	g->backend_state = state;
	pthread_mutex_unlock(&g->mtx);
	dp->inited = true;
	/* A failure recorded while init ran did not see the state. */
	if (cohort_group_error(g) != COHORT_OK && ops->abort != NULL)
		ops->abort(state);
	return (COHORT_OK);
}

/* Payload bytes of this rank in op (metrics, timeline): what it
 * contributes (the send buffer), for the gathers the whole result. */
static uint64_t
coll_op_bytes(const struct cohort_group *g, const struct cohort__op *op)
{
	uint64_t es = cohort_dtype_size(op->dtype), n = op->count;

	switch (op->kind) {
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_GATHER:
	case COHORT__OP_ALLTOALL:
	case COHORT__OP_SCATTER:
	case COHORT__OP_REDUCE_SCATTER:
		n *= (uint64_t)g->size;
		break;
	case COHORT__OP_ALLGATHERV:
		n = 0;
		for (int32_t r = 0; op->counts != NULL && r < g->size; r++)
			n += op->counts[r];
		break;
	case COHORT__OP_ALLTOALLV:
		n = 0;
		for (int32_t r = 0; op->counts != NULL && r < g->size; r++)
			n += op->counts[r];
		break;
	case COHORT__OP_BARRIER:
		n = 0;
		break;
	default:
		break;
	}
	return (n * es);
}

/* Runs w in the calling thread; its ticket is being served. */
static void
coll_execute(struct coll_dp *dp, struct cohort_work *w)
{
	struct cohort_group *g = dp->g;
	char err[COHORT__DETAIL_MAX] = "";
	cohort_status st;
	void *user_recv = w->op.recv;
	bool began = false;
	struct cohort__op_stats stats = { NULL, 0 };
	struct cohort__log_ctx lctx;
	const struct cohort__log_ctx *lsaved = NULL;
	bool pushed = false;

	pthread_mutex_lock(&g->op_lock);
	if ((st = cohort__group_check(g)) != COHORT_OK) {
		cohort__strlcpy(w->err, cohort_last_error(), sizeof(w->err));
		goto out;
	}
	if (w->setup_only) {
		/* Not an operation: no number, no fault schedule; its log
		 * lines say what they belong to. */
		lctx.job = g->client->job;
		lctx.rank = g->client->rank;
		lctx.op = "data-plane set-up";
		lctx.seq = 0;
		lsaved = cohort__log_ctx_push(&lctx);
		pushed = true;
		if (!dp->inited)
			st = coll_backend_init(dp, w);
		goto out;
	}
	/* Hang attribution and fault schedule (group.h): the operation's
	 * number is data_seq + 1 (assigned below, under op_lock). */
	if ((st = cohort__group_op_begin(
	         g, cohort__op_name(w->op.kind), g->data_seq + 1))
	    != COHORT_OK) {
		cohort__strlcpy(w->err, cohort_last_error(), sizeof(w->err));
		goto out;
	}
	began = true;
	lctx.job = g->client->job;
	lctx.rank = g->client->rank;
	lctx.op = cohort__op_name(w->op.kind);
	lctx.seq = g->data_seq + 1;
	lsaved = cohort__log_ctx_push(&lctx);
	if (!dp->inited && (st = coll_backend_init(dp, w)) != COHORT_OK)
		goto out;
	if (w->fix == COLL_FIX_MOVE_IN) {
		uint8_t *r = w->op.recv;

		memmove(r + w->fix_off, r, w->fix_len);
		w->op.send = r + w->fix_off;
	} else if (w->fix == COLL_FIX_TMP_OUT) {
		w->op.recv = w->tmp;
	}
	w->op.seq = ++g->data_seq;
	w->op.stats = &stats;
	st = g->backend->run(
	    g->backend_state, &w->op, err, sizeof(err), w->deadline);
	if (w->fix == COLL_FIX_TMP_OUT) {
		if (st == COHORT_OK)
			memcpy(user_recv, w->tmp, w->fix_len);
		w->op.recv = user_recv;
	}
	if (st != COHORT_OK)
		st = coll_failed(dp, w, st, err);
out:
	if (began) {
		/* alltoallv is counted with alltoall (observe.h counts the
		 * kinds of backend.h version 2). */
		struct cohort__obs_op oo
		    = { .kind = w->op.kind == COHORT__OP_ALLTOALLV
			          ? (int)COHORT__OP_ALLTOALL
			          : (int)w->op.kind,
			      .name = cohort__op_name(w->op.kind),
			      .group = g->id,
			      .track = g->track,
			      .seq = g->data_seq,
			      .backend
			      = g->backend != NULL ? g->backend->name : "none",
			      .algo = stats.algo,
			      .bytes = coll_op_bytes(g, &w->op),
			      .wait_ns = stats.wait_ns,
			      .st = st,
			      .detail = st != COHORT_OK ? w->err : NULL };

		/* the clock reads of the hang-attribution hooks, which come
		 * after the fault point (an injected delay is not the
		 * operation's) */
		cohort__group_op_end(g);
		oo.t0_ns = g->op_start_ns;
		oo.t1_ns = g->op_end_ns;
		cohort__log_ctx_pop(lsaved);
		cohort__obs_op(&g->client->obs, &oo);
	} else if (pushed) {
		cohort__log_ctx_pop(lsaved);
	}
	pthread_mutex_unlock(&g->op_lock);
	free(w->tmp);
	w->tmp = NULL;
	w->st = st;
}

static void *
coll_thread(void *arg)
{
	struct coll_dp *dp = arg;
	struct cohort_work *w;

	pthread_mutex_lock(&dp->mtx);
	for (;;) {
		while (dp->head == NULL && !dp->stop) {
			/* An eager set-up's thread with nothing queued
			 * ends; an i-call starts another. */
			if (dp->thread_eager) {
				dp->thread_eager = false;
				dp->thread_exited = true;
				atomic_fetch_sub(&coll_eager_threads, 1);
				pthread_mutex_unlock(&dp->mtx);
				return (NULL);
			}
			pthread_cond_wait(&dp->work_cv, &dp->mtx);
		}
		if ((w = dp->head) == NULL)
			break;
		if ((dp->head = w->next) == NULL)
			dp->tail = NULL;
		while (dp->serving != w->ticket)
			pthread_cond_wait(&dp->cv, &dp->mtx);
		pthread_mutex_unlock(&dp->mtx);
		coll_execute(dp, w);
		pthread_mutex_lock(&dp->mtx);
		if (w->detached)
			free(w);
		else
			atomic_store(&w->done, true);
		dp->serving++;
		pthread_cond_broadcast(&dp->cv);
	}
	pthread_mutex_unlock(&dp->mtx);
	return (NULL);
}

/* A blocking operation: waits for its turn, runs in this thread. */
static cohort_status
coll_run_blocking(struct cohort_group *g, struct coll_dp *dp,
    struct cohort_work *w, cohort_duration timeout)
{
	cohort__time deadline = cohort__client_deadline(g->client, timeout);
	cohort__time wait_until = deadline;

	w->dp = dp;
	w->deadline = deadline;
	pthread_mutex_lock(&dp->mtx);
	w->ticket = dp->next_ticket++;
	while (dp->serving != w->ticket) {
		if (cohort__cond_wait_until(&dp->cv, &dp->mtx, wait_until) == 0
		    || !cohort__expired(wait_until))
			continue;
		/* The earlier operations outlived this one's deadline: its
		 * turn can no longer come in time, and the peers are already
		 * in it or past it. A data-plane timeout poisons the group;
		 * the abort then drains the earlier work promptly. */
		pthread_mutex_unlock(&dp->mtx);
		cohort__group_fail_local(g, COHORT_ETIMEDOUT,
		    COHORT_FAILURE_TIMEOUT,
		    "%s reached its deadline waiting for the earlier "
		    "operations of group '%s'",
		    coll_what(w), g->id);
		pthread_mutex_lock(&dp->mtx);
		wait_until = COHORT__TIME_NEVER;
	}
	pthread_mutex_unlock(&dp->mtx);
	coll_execute(dp, w);
	pthread_mutex_lock(&dp->mtx);
	dp->serving++;
	pthread_cond_broadcast(&dp->cv);
	pthread_mutex_unlock(&dp->mtx);
	if (w->st != COHORT_OK)
		return (cohort__err(w->st, "%s", w->err));
	return (COHORT_OK);
}

/* An asynchronous operation: queued for the progress thread. */
static cohort_status
coll_run_async(struct cohort_group *g, struct coll_dp *dp,
    struct cohort_work *tmpl, cohort_work **out)
{
	struct cohort_work *w;

	if ((w = malloc(sizeof(*w))) == NULL) {
		free(tmpl->tmp);
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	}
	*w = *tmpl;
	w->heap = true;
	w->dp = dp;
	w->next = NULL;
	w->deadline = cohort__client_deadline(g->client, COHORT_WAIT_DEFAULT);
	atomic_init(&w->done, false);
	pthread_mutex_lock(&dp->mtx);
	if (dp->thread_started && dp->thread_exited) {
		/* It released mtx for good before it said so. */
		pthread_join(dp->thread, NULL);
		dp->thread_started = dp->thread_exited = false;
	}
	if (!dp->thread_started) {
		if (tmpl->setup_only) {
			if (atomic_fetch_add(&coll_eager_threads, 1)
			    >= COLL_EAGER_THREADS) {
				atomic_fetch_sub(&coll_eager_threads, 1);
				pthread_mutex_unlock(&dp->mtx);
				free(w);
				return (cohort__err(COHORT_ESYSTEM,
				    "%d eager set-ups already run in this "
				    "process",
				    COLL_EAGER_THREADS));
			}
			dp->thread_eager = true;
		}
		if (pthread_create(&dp->thread, NULL, coll_thread, dp) != 0) {
			if (dp->thread_eager) {
				dp->thread_eager = false;
				atomic_fetch_sub(&coll_eager_threads, 1);
			}
			pthread_mutex_unlock(&dp->mtx);
			free(w->tmp);
			free(w);
			return (cohort__err(COHORT_ESYSTEM,
			    "cannot start the progress thread of group '%s'",
			    g->id));
		}
		dp->thread_started = true;
	}
	w->ticket = dp->next_ticket++;
	if (dp->tail != NULL)
		dp->tail->next = w;
	else
		dp->head = w;
	dp->tail = w;
	pthread_cond_signal(&dp->work_cv);
	pthread_mutex_unlock(&dp->mtx);
	*out = w;
	return (COHORT_OK);
}

/* An operation that moves no data: only the sticky error matters. */
static cohort_status
coll_empty(struct cohort_group *g, struct coll_dp *dp, cohort_work **out)
{
	cohort_status st = cohort__group_check(g);
	struct cohort_work *w;

	if (out == NULL)
		return (st);
	if ((w = calloc(1, sizeof(*w))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	w->dp = dp;
	w->heap = true;
	w->st = st;
	if (st != COHORT_OK)
		cohort__strlcpy(w->err, cohort_last_error(), sizeof(w->err));
	atomic_init(&w->done, true);
	*out = w;
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Argument checks                                                          */
/* ------------------------------------------------------------------------ */

static bool
coll_overlap(const void *a, size_t alen, const void *b, size_t blen)
{
	uintptr_t x = (uintptr_t)a, y = (uintptr_t)b;

	if (a == NULL || b == NULL || alen == 0 || blen == 0)
		return (false);
	return (x < y + blen && y < x + alen);
}

/* Common checks; *dpp and *es on success. */
static cohort_status
coll_begin(struct cohort_group *g, const char *what, cohort_dtype dt,
    void *stream, const void *ptr, struct coll_dp **dpp, size_t *es)
{
	const struct cohort__backend_ops *ops = NULL;
	struct coll_dp *dp;
	cohort_status st;

	if (g == NULL)
		return (cohort__err(COHORT_EINVAL, "%s: group is NULL", what));
	if ((int)dt < 0 || dt >= COHORT_DTYPE_COUNT)
		return (cohort__err(
		    COHORT_EINVAL, "%s: invalid dtype %d", what, (int)dt));
	if ((st = coll_dp_get(g, &dp)) != COHORT_OK)
		return (st);
	if ((st = coll_resolve(dp, stream, ptr, &ops)) != COHORT_OK)
		return (st);
	if (stream != NULL
	    && (cohort__backend_of(ops)->mem & COHORT__MEM_DEVICE) == 0)
		return (cohort__err(COHORT_EINVAL,
		    "%s: stream must be NULL with the %s backend", what,
		    ops->name));
	*dpp = dp;
	*es = cohort_dtype_size(dt);
	return (COHORT_OK);
}

static cohort_status
coll_check_redop(const char *what, cohort_dtype dt, cohort_redop op)
{
	if ((int)op < 0 || op >= COHORT_REDOP_COUNT)
		return (cohort__err(
		    COHORT_EINVAL, "%s: invalid op %d", what, (int)op));
	if (op == COHORT_MEAN && dt != COHORT_F32 && dt != COHORT_F64
	    && dt != COHORT_F16 && dt != COHORT_BF16)
		return (cohort__err(COHORT_EINVAL,
		    "%s: MEAN is defined for "
		    "floating-point types only, not %s",
		    what, cohort_dtype_name(dt)));
	return (COHORT_OK);
}

static cohort_status
coll_check_root(struct cohort_group *g, const char *what, int32_t root)
{
	if (root < 0 || root >= g->size)
		return (cohort__err(COHORT_EINVAL,
		    "%s: root %d out of range (group size %d)", what, root,
		    g->size));
	return (COHORT_OK);
}

/* count * mult elements of es bytes, or EINVAL on overflow. */
static cohort_status
coll_bytes(const char *what, size_t count, size_t mult, size_t es, size_t *out)
{
	if (mult != 0 && count > SIZE_MAX / mult / es)
		return (cohort__err(
		    COHORT_EINVAL, "%s: count %zu too large", what, count));
	*out = count * mult * es;
	return (COHORT_OK);
}

static cohort_status
coll_null(const char *what, const char *name)
{
	return (cohort__err(COHORT_EINVAL, "%s: %s is NULL", what, name));
}

/* In place. Gather-like (gather): the input is at its slot of recv (pass
 * as is), or at recv itself (move it at execution). Scatter-like: the
 * output is the own block of send (pass), or send itself (run into a
 * temporary). Otherwise the two must not overlap. */
static cohort_status
coll_inplace(const char *what, struct cohort_work *w, bool gather, size_t slot,
    size_t mine, size_t total)
{
	const uint8_t *whole = gather ? w->op.recv : w->op.send;
	const void *part = gather ? w->op.send : w->op.recv;

	if (mine == 0 || part == whole + slot)
		return (COHORT_OK);
	if (part == whole) {
		if (!gather && (w->tmp = malloc(mine)) == NULL)
			return (cohort__err(COHORT_ENOMEM, "out of memory"));
		w->fix = gather ? COLL_FIX_MOVE_IN : COLL_FIX_TMP_OUT;
		w->fix_off = gather ? slot : 0;
		w->fix_len = mine;
		return (COHORT_OK);
	}
	if (coll_overlap(part, mine, whole, total))
		return (cohort__err(COHORT_EINVAL,
		    "%s: %s overlaps %s other than in place", what,
		    gather ? "send" : "recv", gather ? "recv" : "send"));
	return (COHORT_OK);
}

static cohort_status
coll_submit(struct cohort_group *g, struct coll_dp *dp, struct cohort_work *w,
    size_t bytes, cohort_duration timeout, cohort_work **out)
{
	if (bytes == 0) {
		free(w->tmp);
		return (coll_empty(g, dp, out));
	}
	if (out != NULL)
		return (coll_run_async(g, dp, w, out));
	return (coll_run_blocking(g, dp, w, timeout));
}

static void
coll_work_init(struct cohort_work *w, enum cohort__op_kind kind,
    const void *send, void *recv, size_t count, cohort_dtype dt,
    cohort_redop op, int32_t root, void *stream)
{
	memset(w, 0, sizeof(*w));
	w->op.kind = kind;
	w->op.send = send;
	w->op.recv = recv;
	w->op.count = count;
	w->op.dtype = dt;
	w->op.op = op;
	w->op.root = root;
	w->op.stream = stream;
	atomic_init(&w->done, false);
}

/* ------------------------------------------------------------------------ */
/* The collectives                                                          */
/* ------------------------------------------------------------------------ */

/* Where recv may lie relative to send. */
enum coll_place {
	COLL_PLACE_ANY = 0, /* one buffer (broadcast) */
	COLL_PLACE_SAME, /* the same buffer, or apart */
	COLL_PLACE_APART, /* never overlapping */
	COLL_PLACE_GATHER, /* coll_inplace, gather-like */
	COLL_PLACE_SCATTER, /* coll_inplace, scatter-like */
};

/* Which buffer only the root's call uses (NULL elsewhere). */
enum coll_rootbuf {
	COLL_ROOTBUF_NONE = 0,
	COLL_ROOTBUF_RECV,
	COLL_ROOTBUF_SEND,
};

/* What tells one collective's checks from another's: coll_start runs
 * them all from this table, in the same order for every operation. */
struct coll_desc {
	const char *what;
	const char *send_name; /* must not be NULL when data moves */
	const char *recv_name; /* same; NULL: not checked */
	bool by_recv; /* the backend follows recv's memory, else send's */
	bool redop; /* takes a reduction */
	bool root; /* takes a root */
	bool per_rank; /* one buffer holds count elements per rank */
	enum coll_rootbuf rootbuf;
	enum coll_place place;
};

static const struct coll_desc coll_descs[] = {
	[COHORT__OP_ALLREDUCE] = { "allreduce", "send", "recv",
	    .by_recv = true, .redop = true, .place = COLL_PLACE_SAME },
	[COHORT__OP_REDUCE]
	= { "reduce", "send", "recv on the root", .redop = true, .root = true,
	    .rootbuf = COLL_ROOTBUF_RECV, .place = COLL_PLACE_SAME },
	[COHORT__OP_BROADCAST] = { "broadcast", "buf", NULL, .root = true },
	[COHORT__OP_ALLGATHER] = { "allgather", "send", "recv",
	    .per_rank = true, .place = COLL_PLACE_GATHER },
	[COHORT__OP_REDUCE_SCATTER]
	= { "reduce_scatter", "send", "recv", .by_recv = true, .redop = true,
	    .per_rank = true, .place = COLL_PLACE_SCATTER },
	[COHORT__OP_ALLTOALL] = { "alltoall", "send", "recv", .per_rank = true,
	    .place = COLL_PLACE_APART },
	[COHORT__OP_GATHER] = { "gather", "send", "recv on the root",
	    .root = true, .per_rank = true, .rootbuf = COLL_ROOTBUF_RECV,
	    .place = COLL_PLACE_GATHER },
	[COHORT__OP_SCATTER] = { "scatter", "send on the root", "recv",
	    .by_recv = true, .root = true, .per_rank = true,
	    .rootbuf = COLL_ROOTBUF_SEND, .place = COLL_PLACE_SCATTER },
};

/* Where send and recv lie: EINVAL where the operation cannot run there;
 * the in-place cases set w's fix-up. blk: this rank's block, total: the
 * per-rank buffer (blk where there is none). */
static cohort_status
coll_check_place(const struct coll_desc *d, struct cohort_group *g,
    struct cohort_work *w, size_t blk, size_t total)
{
	const void *send = w->op.send, *recv = w->op.recv;
	size_t slot = (size_t)g->rank * blk;

	switch (d->place) {
	case COLL_PLACE_SAME:
		if (send != recv && coll_overlap(send, blk, recv, blk))
			return (cohort__err(COHORT_EINVAL,
			    "%s: send and recv overlap partially", d->what));
		break;
	case COLL_PLACE_APART:
		if (coll_overlap(send, total, recv, total))
			return (cohort__err(COHORT_EINVAL,
			    "%s cannot run in place (send and recv overlap)",
			    d->what));
		break;
	case COLL_PLACE_GATHER:
		return (coll_inplace(d->what, w, true, slot, blk, total));
	case COLL_PLACE_SCATTER:
		return (coll_inplace(d->what, w, false, slot, blk, total));
	default:
		break;
	}
	return (COHORT_OK);
}

/* Every collective but allgatherv: checks the arguments as its entry in
 * coll_descs says, then runs it (out NULL: blocking). */
static cohort_status
coll_start(cohort_group *g, enum cohort__op_kind kind, const void *send,
    void *recv, size_t count, cohort_dtype dt, cohort_redop op, int32_t root,
    void *stream, cohort_duration timeout, cohort_work **out)
{
	const struct coll_desc *d = &coll_descs[kind];
	const char *what = d->what;
	size_t es = 0, blk = 0, total = 0;
	struct cohort_work w;
	struct coll_dp *dp;
	cohort_status st;
	bool off_root; /* a root-only buffer, on another rank */

	if ((st = coll_begin(
	         g, what, dt, stream, d->by_recv ? recv : send, &dp, &es))
	        != COHORT_OK
	    || (d->redop && (st = coll_check_redop(what, dt, op)) != COHORT_OK)
	    || (d->root && (st = coll_check_root(g, what, root)) != COHORT_OK)
	    || (st = coll_bytes(what, count, 1, es, &blk)) != COHORT_OK
	    || (st = coll_bytes(what, count, d->per_rank ? (size_t)g->size : 1,
	            es, &total))
	        != COHORT_OK)
		return (st);
	off_root = d->rootbuf != COLL_ROOTBUF_NONE && g->rank != root;
	if (off_root && d->rootbuf == COLL_ROOTBUF_RECV)
		recv = NULL;
	if (off_root && d->rootbuf == COLL_ROOTBUF_SEND)
		send = NULL;
	if (blk > 0 && send == NULL && d->send_name != NULL
	    && !(off_root && d->rootbuf == COLL_ROOTBUF_SEND))
		return (coll_null(what, d->send_name));
	if (blk > 0 && recv == NULL && d->recv_name != NULL
	    && !(off_root && d->rootbuf == COLL_ROOTBUF_RECV))
		return (coll_null(what, d->recv_name));
	coll_work_init(&w, kind, send, recv, count, dt, op, root, stream);
	if (!off_root
	    && (st = coll_check_place(d, g, &w, blk, total)) != COHORT_OK)
		return (st);
	return (coll_submit(g, dp, &w, blk, timeout, out));
}

/* The i-form of coll_start: out is required. */
static cohort_status
coll_istart(cohort_group *g, enum cohort__op_kind kind, const void *send,
    void *recv, size_t count, cohort_dtype dt, cohort_redop op, int32_t root,
    void *stream, cohort_work **out)
{
	if (out == NULL)
		return (cohort__err(
		    COHORT_EINVAL, "i%s: out is NULL", coll_descs[kind].what));
	return (coll_start(g, kind, send, recv, count, dt, op, root, stream,
	    COHORT_WAIT_DEFAULT, out));
}

cohort_status
cohort_allreduce(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, cohort_redop op, void *stream, cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_ALLREDUCE, send, recv, count, dtype,
	    op, 0, stream, timeout, NULL));
}

cohort_status
cohort_iallreduce(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, cohort_redop op, void *stream, cohort_work **out)
{
	return (coll_istart(g, COHORT__OP_ALLREDUCE, send, recv, count, dtype,
	    op, 0, stream, out));
}

cohort_status
cohort_reduce(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, cohort_redop op, int32_t root, void *stream,
    cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_REDUCE, send, recv, count, dtype, op,
	    root, stream, timeout, NULL));
}

cohort_status
cohort_broadcast(cohort_group *g, void *buf, size_t count, cohort_dtype dtype,
    int32_t root, void *stream, cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_BROADCAST, buf, buf, count, dtype,
	    COHORT_SUM, root, stream, timeout, NULL));
}

cohort_status
cohort_ibroadcast(cohort_group *g, void *buf, size_t count, cohort_dtype dtype,
    int32_t root, void *stream, cohort_work **out)
{
	return (coll_istart(g, COHORT__OP_BROADCAST, buf, buf, count, dtype,
	    COHORT_SUM, root, stream, out));
}

cohort_status
cohort_allgather(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, void *stream, cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_ALLGATHER, send, recv, count, dtype,
	    COHORT_SUM, 0, stream, timeout, NULL));
}

cohort_status
cohort_iallgather(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, void *stream, cohort_work **out)
{
	return (coll_istart(g, COHORT__OP_ALLGATHER, send, recv, count, dtype,
	    COHORT_SUM, 0, stream, out));
}

cohort_status
cohort_allgatherv(cohort_group *g, const void *send, void *recv,
    const size_t *counts, cohort_dtype dtype, void *stream,
    cohort_duration timeout)
{
	static const char what[] = "allgatherv";
	struct cohort_work w;
	struct coll_dp *dp;
	cohort_status st;
	size_t es = 0, total = 0, off = 0, mine;

	if ((st = coll_begin(g, what, dtype, stream, send, &dp, &es))
	    != COHORT_OK)
		return (st);
	if (counts == NULL)
		return (coll_null(what, "counts"));
	for (int32_t r = 0; r < g->size; r++) {
		if (counts[r] > (SIZE_MAX - total) / es)
			return (cohort__err(
			    COHORT_EINVAL, "%s: counts too large", what));
		if (r == g->rank)
			off = total;
		total += counts[r] * es;
	}
	mine = counts[g->rank] * es;
	if (mine > 0 && send == NULL)
		return (coll_null(what, "send"));
	if (total > 0 && recv == NULL)
		return (coll_null(what, "recv"));
	coll_work_init(&w, COHORT__OP_ALLGATHERV, send, recv, 0, dtype,
	    COHORT_SUM, 0, stream);
	w.op.counts = counts;
	if ((st = coll_inplace(what, &w, true, off, mine, total)) != COHORT_OK)
		return (st);
	return (coll_submit(g, dp, &w, total, timeout, NULL));
}

cohort_status
cohort_reduce_scatter(cohort_group *g, const void *send, void *recv,
    size_t count, cohort_dtype dtype, cohort_redop op, void *stream,
    cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_REDUCE_SCATTER, send, recv, count,
	    dtype, op, 0, stream, timeout, NULL));
}

cohort_status
cohort_ireduce_scatter(cohort_group *g, const void *send, void *recv,
    size_t count, cohort_dtype dtype, cohort_redop op, void *stream,
    cohort_work **out)
{
	return (coll_istart(g, COHORT__OP_REDUCE_SCATTER, send, recv, count,
	    dtype, op, 0, stream, out));
}

cohort_status
cohort_alltoall(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, void *stream, cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_ALLTOALL, send, recv, count, dtype,
	    COHORT_SUM, 0, stream, timeout, NULL));
}

/* The extent of a v-buffer (the end of its last block, in bytes) into
 * *ext; EINVAL on overflow. */
static cohort_status
coll_vextent(const char *what, const char *name, const size_t *counts,
    const size_t *displs, int32_t n, size_t es, size_t *ext)
{
	size_t end = 0;

	for (int32_t q = 0; q < n; q++) {
		if (counts[q] == 0)
			continue;
		if (displs[q] > SIZE_MAX / es - counts[q]
		    || counts[q] > SIZE_MAX / es)
			return (cohort__err(COHORT_EINVAL,
			    "%s: %s block %d (offset %zu, count %zu) too "
			    "large",
			    what, name, q, displs[q], counts[q]));
		if ((displs[q] + counts[q]) * es > end)
			end = (displs[q] + counts[q]) * es;
	}
	*ext = end;
	return (COHORT_OK);
}

static const size_t *coll_sort_displs; /* qsort's context, under lock */
static pthread_mutex_t coll_sort_mtx = PTHREAD_MUTEX_INITIALIZER;

static int
coll_cmp_displ(const void *a, const void *b)
{
	size_t x = coll_sort_displs[*(const int32_t *)a];
	size_t y = coll_sort_displs[*(const int32_t *)b];

	return (x < y ? -1 : x > y);
}

/* The blocks of recv must not overlap: the order they would be written
 * in is the backend's. */
static cohort_status
coll_vdisjoint(
    const char *what, const size_t *counts, const size_t *displs, int32_t n)
{
	int32_t *ix, k = 0;
	cohort_status st = COHORT_OK;

	if ((ix = malloc((size_t)n * sizeof(*ix))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	for (int32_t q = 0; q < n; q++)
		if (counts[q] > 0)
			ix[k++] = q;
	pthread_mutex_lock(&coll_sort_mtx);
	coll_sort_displs = displs;
	qsort(ix, (size_t)k, sizeof(*ix), coll_cmp_displ);
	pthread_mutex_unlock(&coll_sort_mtx);
	for (int32_t i = 1; i < k; i++) {
		int32_t a = ix[i - 1], b = ix[i];

		if (displs[a] + counts[a] > displs[b]) {
			st = cohort__err(COHORT_EINVAL,
			    "%s: recv blocks of ranks %d and %d overlap", what,
			    a, b);
			break;
		}
	}
	free(ix);
	return (st);
}

static cohort_status
coll_alltoallv(cohort_group *g, const void *send, const size_t *scounts,
    const size_t *sdispls, void *recv, const size_t *rcounts,
    const size_t *rdispls, cohort_dtype dt, void *stream,
    cohort_duration timeout, cohort_work **out)
{
	static const char what[] = "alltoallv";
	const struct cohort__backend_ops *ops;
	struct cohort_work w;
	struct coll_dp *dp;
	size_t es = 0, sext, rext, n;
	size_t *vc;
	cohort_status st;

	if ((st = coll_begin(
	         g, what, dt, stream, send != NULL ? send : recv, &dp, &es))
	    != COHORT_OK)
		return (st);
	if (scounts == NULL || sdispls == NULL || rcounts == NULL
	    || rdispls == NULL)
		return (cohort__err(COHORT_EINVAL,
		    "%s: the count and offset arrays are required", what));
	n = (size_t)g->size;
	if ((st = coll_vextent(
	         what, "send", scounts, sdispls, g->size, es, &sext))
	        != COHORT_OK
	    || (st = coll_vextent(
	            what, "recv", rcounts, rdispls, g->size, es, &rext))
	        != COHORT_OK)
		return (st);
	if (sext > 0 && send == NULL)
		return (coll_null(what, "send"));
	if (rext > 0 && recv == NULL)
		return (coll_null(what, "recv"));
	if (coll_overlap(send, sext, recv, rext))
		return (cohort__err(COHORT_EINVAL,
		    "%s cannot run in place (send and recv overlap)", what));
	if ((st = coll_vdisjoint(what, rcounts, rdispls, g->size))
	    != COHORT_OK)
		return (st);
	pthread_mutex_lock(&dp->mtx);
	ops = dp->ops;
	pthread_mutex_unlock(&dp->mtx);
	if (ops->version < 3)
		return (cohort__err(COHORT_ENOTSUP,
		    "%s: the %s backend (version %u) has no alltoallv", what,
		    ops->name, ops->version));
	if (g->size == 1) {
		/* Nothing to agree on with anyone. */
		if (scounts[0] != rcounts[0])
			return (cohort__err(COHORT_EMISMATCH,
			    "%s: rank 0 sends %zu elements to itself and "
			    "receives %zu",
			    what, scounts[0], rcounts[0]));
		if ((st = cohort__group_check(g)) != COHORT_OK)
			return (st);
		if (scounts[0] > 0)
			memmove((uint8_t *)recv + rdispls[0] * es,
			    (const uint8_t *)send + sdispls[0] * es,
			    scounts[0] * es);
		return (coll_empty(g, dp, out));
	}
	if ((vc = malloc(4 * n * sizeof(*vc))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	memcpy(vc, scounts, n * sizeof(*vc));
	memcpy(vc + n, sdispls, n * sizeof(*vc));
	memcpy(vc + 2 * n, rcounts, n * sizeof(*vc));
	memcpy(vc + 3 * n, rdispls, n * sizeof(*vc));
	coll_work_init(&w, COHORT__OP_ALLTOALLV, send, recv, 0, dt, COHORT_SUM,
	    0, stream);
	w.vcounts = vc;
	w.op.counts = vc;
	w.op.sdispls = vc + n;
	w.op.rcounts = vc + 2 * n;
	w.op.rdispls = vc + 3 * n;
	/* Every member takes part, whatever its own counts: the others
	 * wait for its agreement. */
	if (out != NULL) {
		if ((st = coll_run_async(g, dp, &w, out)) != COHORT_OK)
			free(vc);
		return (st);
	}
	st = coll_run_blocking(g, dp, &w, timeout);
	free(vc);
	return (st);
}

cohort_status
cohort_alltoallv(cohort_group *g, const void *send, const size_t *send_counts,
    const size_t *send_displs, void *recv, const size_t *recv_counts,
    const size_t *recv_displs, cohort_dtype dtype, void *stream,
    cohort_duration timeout)
{
	return (coll_alltoallv(g, send, send_counts, send_displs, recv,
	    recv_counts, recv_displs, dtype, stream, timeout, NULL));
}

cohort_status
cohort_ialltoallv(cohort_group *g, const void *send, const size_t *send_counts,
    const size_t *send_displs, void *recv, const size_t *recv_counts,
    const size_t *recv_displs, cohort_dtype dtype, void *stream,
    cohort_work **out)
{
	if (out == NULL)
		return (cohort__err(COHORT_EINVAL, "ialltoallv: out is NULL"));
	return (coll_alltoallv(g, send, send_counts, send_displs, recv,
	    recv_counts, recv_displs, dtype, stream, COHORT_WAIT_DEFAULT,
	    out));
}

cohort_status
cohort_gather(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, int32_t root, void *stream, cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_GATHER, send, recv, count, dtype,
	    COHORT_SUM, root, stream, timeout, NULL));
}

cohort_status
cohort_scatter(cohort_group *g, const void *send, void *recv, size_t count,
    cohort_dtype dtype, int32_t root, void *stream, cohort_duration timeout)
{
	return (coll_start(g, COHORT__OP_SCATTER, send, recv, count, dtype,
	    COHORT_SUM, root, stream, timeout, NULL));
}

/* ------------------------------------------------------------------------ */
/* Point-to-point                                                           */
/* ------------------------------------------------------------------------ */

/* The backend's completion of one transfer (any thread, no lock of the
 * backend's held): the work is done. */
static void
coll_p2p_done(struct cohort__p2p *p)
{
	struct cohort_work *w = p->ctx;
	struct coll_dp *dp = w->dp;

	pthread_mutex_lock(&dp->mtx);
	w->st = p->st;
	if (p->st != COHORT_OK)
		cohort__strlcpy(w->err, p->err, sizeof(w->err));
	atomic_store(&w->done, true);
	pthread_cond_broadcast(&dp->cv);
	pthread_mutex_unlock(&dp->mtx);
}

/* A finished transfer's status for its caller: a failure that broke the
 * connections becomes the group's sticky error (coll_failed: cohortd's
 * verdict first), once per work. */
static cohort_status
coll_p2p_result(struct cohort_work *w)
{
	cohort_status st = w->st;

	if (st == COHORT_OK)
		return (COHORT_OK);
	if (!w->p2p_handled) {
		char err[sizeof(w->err)];

		w->p2p_handled = true;
		cohort__strlcpy(err, w->err, sizeof(err));
		if (st == COHORT_EPEERLOST || st == COHORT_ETIMEDOUT
		    || st == COHORT_EABORTED)
			st = w->st = coll_failed(w->dp, w, st, err);
		else
			snprintf(w->err, sizeof(w->err), "%s", err);
	}
	return (cohort__err(w->st, "%s", w->err));
}

/* The group's point-to-point state, opened at its first transfer: the
 * group's backend's (set up first where it needs init's state), else the
 * service backend's for host memory. Not collective: nobody waits for
 * another rank here (but for nccl's set-up). */
static cohort_status
coll_p2p_get(struct cohort_group *g, struct coll_dp *dp, void *stream,
    const void *buf, const struct cohort__backend_ops **opsp, void **p2pp,
    cohort_duration timeout)
{
	const struct cohort__backend_ops *ops = NULL, *use;
	char err[512] = "";
	void *p2p, *state = NULL;
	cohort_status st;

	if ((p2p = atomic_load(&dp->p2p)) != NULL) {
		*opsp = atomic_load(&dp->p2p_ops);
		*p2pp = p2p;
		return (COHORT_OK);
	}
	if ((st = coll_resolve(dp, stream, buf, &ops)) != COHORT_OK)
		return (st);
	if (ops->version >= 3 && ops->p2p_open != NULL) {
		use = ops;
	} else if ((cohort__backend_of(ops)->mem & COHORT__MEM_HOST) != 0
	    && stream == NULL) {
		use = &cohort__service_backend;
	} else {
		return (cohort__err(COHORT_ENOTSUP,
		    "group '%s': the %s backend has no point-to-point for "
		    "device memory",
		    g->id[0] ? g->id : "world", ops->name));
	}
	if (use == ops && ops->p2p_needs_state && !dp->inited && g->size > 1) {
		/* nccl: the transfers travel on the group's communicator,
		 * whose set-up is collective (every member reaches it). */
		struct cohort_work w;

		coll_setup_work(&w);
		if ((st = coll_run_blocking(g, dp, &w, timeout)) != COHORT_OK)
			return (st);
	}
	pthread_mutex_lock(&dp->p2p_mtx);
	if ((p2p = atomic_load(&dp->p2p)) == NULL) {
		coll_desc_fill(dp);
		pthread_mutex_lock(&g->mtx);
		state = g->backend == use ? g->backend_state : NULL;
		pthread_mutex_unlock(&g->mtx);
		st = use->p2p_open(&dp->desc, state, &p2p, err, sizeof(err),
		    cohort__client_deadline(g->client, timeout));
		if (st != COHORT_OK) {
			pthread_mutex_unlock(&dp->p2p_mtx);
			return (cohort__err(st,
			    "group '%s': point-to-point set-up (%s): %s",
			    g->id[0] ? g->id : "world", use->name,
			    err[0] ? err : cohort_strerror(st)));
		}
		atomic_store(&dp->p2p_ops, use);
		atomic_store(&dp->p2p, p2p);
		cohort__debug("group '%s': point-to-point through the %s "
		              "backend",
		    g->id, use->name);
		/* A failure recorded meanwhile did not see the state. */
		if (cohort_group_error(g) != COHORT_OK)
			use->p2p_abort(p2p);
	}
	pthread_mutex_unlock(&dp->p2p_mtx);
	*opsp = atomic_load(&dp->p2p_ops);
	*p2pp = p2p;
	return (COHORT_OK);
}

/* Checks one transfer's arguments and fills w for it. */
static cohort_status
coll_p2p_prep(struct cohort_group *g, struct coll_dp *dp,
    struct cohort_work *w, bool is_send, const void *buf, size_t count,
    cohort_dtype dt, int32_t peer, uint32_t tag, void *stream,
    cohort__time deadline)
{
	const char *what = is_send ? "send" : "recv";
	size_t es = cohort_dtype_size(dt), bytes = 0;
	cohort_status st;

	if ((int)dt < 0 || dt >= COHORT_DTYPE_COUNT)
		return (cohort__err(
		    COHORT_EINVAL, "%s: invalid dtype %d", what, (int)dt));
	if ((st = coll_bytes(what, count, 1, es, &bytes)) != COHORT_OK)
		return (st);
	if (peer == g->rank)
		return (cohort__err(COHORT_EINVAL,
		    "%s: peer %d is this rank (a transfer needs another "
		    "rank)",
		    what, peer));
	if ((peer < 0 || peer >= g->size)
	    && (is_send || peer != COHORT_ANY_SOURCE))
		return (cohort__err(COHORT_EINVAL,
		    "%s: peer %d out of range (group size %d)", what, peer,
		    g->size));
	if (bytes > 0 && buf == NULL)
		return (coll_null(what, "buf"));
	memset(w, 0, sizeof(*w));
	atomic_init(&w->done, false);
	w->dp = dp;
	w->is_p2p = true;
	w->deadline = deadline;
	w->op.kind = is_send ? COHORT__OP_SEND : COHORT__OP_RECV;
	w->op.dtype = dt;
	w->op.count = count;
	w->p2p.kind = w->op.kind;
	w->p2p.peer = peer;
	w->p2p.tag = tag;
	w->p2p.buf = (void *)buf;
	w->p2p.count = count;
	w->p2p.dtype = dt;
	w->p2p.bytes = bytes;
	w->p2p.stream = stream;
	w->p2p.deadline = deadline;
	w->p2p.source = -1;
	w->p2p.done = coll_p2p_done;
	w->p2p.ctx = w;
	return (COHORT_OK);
}

/* Posts ws[0..n) (prepared, on one group and backend) together. */
static cohort_status
coll_p2p_post(struct cohort_group *g, struct coll_dp *dp,
    struct cohort_work **ws, size_t n, void *stream, const void *buf0,
    cohort_duration timeout)
{
	struct cohort__p2p *one[1], **reqs = one;
	const struct cohort__backend_ops *ops;
	char err[512] = "";
	void *p2p;
	cohort_status st;

	if ((st = cohort__group_check(g)) != COHORT_OK)
		return (st);
	if ((st = coll_p2p_get(g, dp, stream, buf0, &ops, &p2p, timeout))
	    != COHORT_OK)
		return (st);
	if (n > 1 && (reqs = malloc(n * sizeof(*reqs))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	for (size_t i = 0; i < n; i++) {
		ws[i]->p2p.seq = ws[i]->op.seq
		    = atomic_fetch_add(&dp->p2p_seq, 1) + 1;
		reqs[i] = &ws[i]->p2p;
	}
	st = ops->p2p_post(p2p, reqs, n, err, sizeof(err));
	if (reqs != one)
		free(reqs);
	if (st == COHORT_OK)
		return (COHORT_OK);
	/* None was taken. A broken state is the group's failure. */
	snprintf(ws[0]->err, sizeof(ws[0]->err), "%s",
	    err[0] ? err : cohort_strerror(st));
	if (st == COHORT_EPEERLOST || st == COHORT_ETIMEDOUT
	    || st == COHORT_EABORTED)
		st = coll_failed(dp, ws[0], st, ws[0]->err);
	return (cohort__err(st, "%s", ws[0]->err));
}

/* Waits for a posted transfer of this thread: the backend completes it
 * by its deadline; past that and a grace, the group is failed so that
 * the abort completes it. */
static void
coll_p2p_wait(struct coll_dp *dp, struct cohort_work *w)
{
	cohort__time until = w->deadline == COHORT__TIME_NEVER
	    ? COHORT__TIME_NEVER
	    : w->deadline + 10000;

	pthread_mutex_lock(&dp->mtx);
	while (!atomic_load(&w->done)) {
		if (cohort__cond_wait_until(&dp->cv, &dp->mtx, until) != 0
		    && cohort__expired(until)) {
			pthread_mutex_unlock(&dp->mtx);
			cohort__group_fail_local(dp->g, COHORT_ETIMEDOUT,
			    COHORT_FAILURE_TIMEOUT,
			    "%s #%" PRIu64 " not completed by the %s backend "
			    "10 s after its deadline",
			    cohort__op_name(w->op.kind), w->op.seq,
			    atomic_load(&dp->p2p_ops)->name);
			pthread_mutex_lock(&dp->mtx);
			until = COHORT__TIME_NEVER;
		}
	}
	pthread_mutex_unlock(&dp->mtx);
}

static cohort_status
coll_p2p_start(cohort_group *g, bool is_send, const void *buf, size_t count,
    cohort_dtype dt, int32_t peer, uint32_t tag, void *stream,
    cohort_duration timeout, cohort_work **out)
{
	const char *what = is_send ? "send" : "recv";
	struct cohort_work wb, *w = &wb;
	struct coll_dp *dp;
	cohort_status st;

	if (g == NULL)
		return (cohort__err(COHORT_EINVAL, "%s: group is NULL", what));
	if ((st = coll_dp_get(g, &dp)) != COHORT_OK)
		return (st);
	if (out != NULL && (w = malloc(sizeof(*w))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if ((st = coll_p2p_prep(g, dp, w, is_send, buf, count, dt, peer, tag,
	         stream, cohort__client_deadline(g->client, timeout)))
	        != COHORT_OK
	    || (st = coll_p2p_post(g, dp, &w, 1, stream, buf, timeout))
	        != COHORT_OK) {
		if (w != &wb)
			free(w);
		return (st);
	}
	if (out != NULL) {
		w->heap = true;
		*out = w;
		return (COHORT_OK);
	}
	coll_p2p_wait(dp, w);
	return (coll_p2p_result(w));
}

cohort_status
cohort_send(cohort_group *g, const void *buf, size_t count, cohort_dtype dtype,
    int32_t peer, uint32_t tag, void *stream, cohort_duration timeout)
{
	return (coll_p2p_start(
	    g, true, buf, count, dtype, peer, tag, stream, timeout, NULL));
}

cohort_status
cohort_recv(cohort_group *g, void *buf, size_t count, cohort_dtype dtype,
    int32_t peer, uint32_t tag, void *stream, cohort_duration timeout)
{
	return (coll_p2p_start(
	    g, false, buf, count, dtype, peer, tag, stream, timeout, NULL));
}

cohort_status
cohort_isend(cohort_group *g, const void *buf, size_t count,
    cohort_dtype dtype, int32_t peer, uint32_t tag, void *stream,
    cohort_work **out)
{
	if (out == NULL)
		return (cohort__err(COHORT_EINVAL, "isend: out is NULL"));
	return (coll_p2p_start(g, true, buf, count, dtype, peer, tag, stream,
	    COHORT_WAIT_DEFAULT, out));
}

cohort_status
cohort_irecv(cohort_group *g, void *buf, size_t count, cohort_dtype dtype,
    int32_t peer, uint32_t tag, void *stream, cohort_work **out)
{
	if (out == NULL)
		return (cohort__err(COHORT_EINVAL, "irecv: out is NULL"));
	return (coll_p2p_start(g, false, buf, count, dtype, peer, tag, stream,
	    COHORT_WAIT_DEFAULT, out));
}

cohort_status
cohort_p2p_batch(cohort_group *g, const cohort_p2p_op *ops, size_t n,
    void *stream, cohort_work **works)
{
	struct cohort_work **ws;
	struct coll_dp *dp;
	cohort__time deadline;
	cohort_status st = COHORT_OK;
	size_t made = 0;

	if (g == NULL || (n > 0 && (ops == NULL || works == NULL)))
		return (cohort__err(COHORT_EINVAL,
		    "p2p_batch: group, ops and works are required"));
	if (n == 0)
		return (cohort__group_check(g));
	if ((st = coll_dp_get(g, &dp)) != COHORT_OK)
		return (st);
	if ((ws = calloc(n, sizeof(*ws))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	deadline = cohort__client_deadline(g->client, COHORT_WAIT_DEFAULT);
	for (; made < n; made++) {
		const cohort_p2p_op *o = &ops[made];

		if ((ws[made] = malloc(sizeof(*ws[made]))) == NULL) {
			st = cohort__err(COHORT_ENOMEM, "out of memory");
			break;
		}
		if ((st = coll_p2p_prep(g, dp, ws[made], !o->recv, o->buf,
		         o->count, o->dtype, o->peer, o->tag, stream,
		         deadline))
		    != COHORT_OK) {
			char e[COHORT__DETAIL_MAX];

			cohort__strlcpy(e, cohort_last_error(), sizeof(e));
			free(ws[made]);
			st = cohort__err(st, "p2p_batch op %zu: %s", made, e);
			break;
		}
		ws[made]->heap = true;
	}
	if (st == COHORT_OK)
		st = coll_p2p_post(
		    g, dp, ws, n, stream, ops[0].buf, COHORT_WAIT_DEFAULT);
	if (st != COHORT_OK) {
		for (size_t i = 0; i < made; i++)
			free(ws[i]);
		free(ws);
		return (st);
	}
	memcpy(works, ws, n * sizeof(*ws));
	free(ws);
	return (COHORT_OK);
}

cohort_status
cohort_work_source(const cohort_work *w, int32_t *peer)
{
	if (w == NULL || peer == NULL)
		return (cohort__err(COHORT_EINVAL, "work or peer is NULL"));
	if (!w->is_p2p || w->op.kind != COHORT__OP_RECV)
		return (cohort__err(
		    COHORT_EINVAL, "work_source: the work is not a receive"));
	if (!atomic_load(&((cohort_work *)w)->done) || w->st != COHORT_OK)
		return (cohort__err(COHORT_ESTATE,
		    "work_source: the receive has not completed"));
	*peer = w->p2p.source;
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Work handles                                                             */
/* ------------------------------------------------------------------------ */

cohort_status
cohort_work_wait(cohort_work *w, cohort_duration timeout)
{
	struct coll_dp *dp;
	cohort__time deadline;

	if (w == NULL)
		return (cohort__err(COHORT_EINVAL, "work is NULL"));
	if (!atomic_load(&w->done)) {
		dp = w->dp;
		deadline = cohort__client_deadline(dp->g->client, timeout);
		pthread_mutex_lock(&dp->mtx);
		while (!atomic_load(&w->done)) {
			if (cohort__cond_wait_until(
			        &dp->cv, &dp->mtx, deadline)
			        != 0
			    && cohort__expired(deadline)) {
				pthread_mutex_unlock(&dp->mtx);
				return (cohort__err(COHORT_ETIMEDOUT,
				    "%s #%" PRIu64 " not complete after %d ms",
				    cohort__op_name(w->op.kind), w->op.seq,
				    (int)timeout));
			}
		}
		pthread_mutex_unlock(&dp->mtx);
	}
	if (w->is_p2p)
		return (coll_p2p_result(w));
	if (w->st != COHORT_OK)
		return (cohort__err(w->st, "%s", w->err));
	return (COHORT_OK);
}

cohort_status
cohort_work_test(cohort_work *w, bool *done)
{
	if (w == NULL || done == NULL)
		return (cohort__err(COHORT_EINVAL, "work or done is NULL"));
	if (!atomic_load(&w->done)) {
		*done = false;
		return (COHORT_OK);
	}
	*done = true;
	if (w->st != COHORT_OK)
		return (cohort__err(w->st, "%s", w->err));
	return (COHORT_OK);
}

void
cohort_work_free(cohort_work *w)
{
	struct coll_dp *dp;

	if (w == NULL)
		return;
	if (!atomic_load(&w->done)) {
		dp = w->dp;
		pthread_mutex_lock(&dp->mtx);
		while (!atomic_load(&w->done))
			pthread_cond_wait(&dp->cv, &dp->mtx);
		pthread_mutex_unlock(&dp->mtx);
	}
	free(w->vcounts);
	free(w);
}

/* ------------------------------------------------------------------------ */
/* Groups                                                                   */
/* ------------------------------------------------------------------------ */

const char *
cohort_group_backend(const cohort_group *cg)
{
	struct cohort_group *g = (struct cohort_group *)cg;
	const struct cohort__backend_ops *ops;
	struct coll_dp *dp;

	if (g == NULL || coll_dp_get(g, &dp) != COHORT_OK)
		return ("");
	pthread_mutex_lock(&dp->mtx);
	ops = dp->ops;
	pthread_mutex_unlock(&dp->mtx);
	if (ops != NULL)
		return (ops->name);
	/* Not resolved yet: the configured one, or what a host-memory
	 * operation would pick. */
	if (strcmp(dp->want, "auto") != 0
	    && cohort__backend_find(dp->want) != NULL)
		return (cohort__backend_find(dp->want)->name);
	return ("host");
}

/* ------------------------------------------------------------------------ */
/* Data-plane set-up ahead of the first operation                           */
/* ------------------------------------------------------------------------ */

/* The group's backend when it is known before any operation names its
 * memory: a configured host-memory backend, or "auto" on a machine with
 * no NVIDIA device node (host memory: tcp). NULL otherwise: "auto" where
 * a GPU may be used waits for the first operation's buffer (asking the
 * CUDA runtime would load it into every CPU process). */
static const struct cohort__backend_entry *
coll_known_backend(const struct coll_dp *dp)
{
	const struct cohort__backend_entry *e;
	char why[256];

	if (strcmp(dp->want, "auto") != 0)
		e = cohort__backend_find(dp->want);
	else if (access("/dev/nvidiactl", F_OK) != 0)
		e = cohort__backend_pick(COHORT__MEM_HOST, why, sizeof(why));
	else
		e = NULL;
	if (e == NULL || (e->mem & COHORT__MEM_DEVICE) != 0
	    || !cohort__backend_usable(e, why, sizeof(why)))
		return (NULL);
	return (e);
}

static void
coll_setup_work(struct cohort_work *w)
{
	memset(w, 0, sizeof(*w));
	w->setup_only = true;
	w->op.kind = COHORT__OP_BARRIER;
	atomic_init(&w->done, false);
}

void
cohort__coll_setup_early(struct cohort_group *g)
{
	const struct cohort__backend_ops *ops = NULL;
	struct cohort_work tmpl, *w = NULL;
	struct coll_dp *dp;

	/* A host-memory group larger than COHORT_TCP_MESH_MAX connects on
	 * first use, per algorithm (client/backend/host/): set up at join,
	 * it would only publish an address - a request to cohortd per rank
	 * while n clients join, and a thread each - which its first
	 * operation does as well. */
	if (cohort__knob_int_or(COHORT__KNOB_EAGER_CONNECT, 1) == 0
	    || g->size < 2
	    || g->size > cohort__knob_int_or(COHORT__KNOB_TCP_MESH_MAX, 64)
	    || coll_dp_get(g, &dp) != COHORT_OK
	    || coll_known_backend(dp) == NULL
	    || coll_resolve(dp, NULL, NULL, &ops) != COHORT_OK)
		return;
	coll_setup_work(&tmpl);
	if (coll_run_async(g, dp, &tmpl, &w) != COHORT_OK) {
		/* No thread: the first operation sets it up instead. */
		cohort__debug("group '%s': data-plane set-up deferred: %s",
		    g->id, cohort_last_error());
		return;
	}
	/* Its outcome reaches the group as a sticky error, or not at all:
	 * the progress thread frees it. */
	pthread_mutex_lock(&dp->mtx);
	dp->early_setup = true;
	dp->early_ticket = w->ticket;
	if (atomic_load(&w->done))
		free(w);
	else
		w->detached = true;
	pthread_mutex_unlock(&dp->mtx);
}

void
cohort__coll_setup_settle(struct cohort_group *g, cohort_duration ms)
{
	struct coll_dp *dp = g->dp;
	cohort__time deadline = cohort__now_ms() + ms;
	bool settled;

	if (dp == NULL)
		return;
	pthread_mutex_lock(&dp->mtx);
	while (dp->early_setup && dp->serving <= dp->early_ticket
	    && cohort__cond_wait_until(&dp->cv, &dp->mtx, deadline) == 0)
		;
	settled = !dp->early_setup || dp->serving > dp->early_ticket;
	pthread_mutex_unlock(&dp->mtx);
	if (!settled)
		cohort__group_fail_local(g, COHORT_EABORTED,
		    COHORT_FAILURE_ABORTED,
		    "group '%s' closed before its data plane was set up "
		    "(waited %d ms)",
		    g->id[0] ? g->id : "world", (int)ms);
}

cohort_status
cohort_group_connect(cohort_group *g, cohort_duration timeout)
{
	const struct cohort__backend_ops *ops = NULL;
	struct cohort_work w;
	struct coll_dp *dp;
	cohort_status st;

	if (g == NULL)
		return (cohort__err(
		    COHORT_EINVAL, "group_connect: group is NULL"));
	if ((st = coll_dp_get(g, &dp)) != COHORT_OK)
		return (st);
	if ((st = coll_resolve(dp, NULL, NULL, &ops)) != COHORT_OK)
		return (st);
	if (g->size < 2)
		return (cohort__group_check(g));
	coll_setup_work(&w);
	return (coll_run_blocking(g, dp, &w, timeout));
}

cohort_status
cohort_group_new(cohort_client *c, const char *name, const int32_t *ranks,
    size_t nranks, const char *backend, cohort_group **out,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__GroupCreate body = COHORT__GROUP_CREATE__INIT;
	struct cohort__coord_call call;
	struct cohort_group *g = NULL;
	struct coll_dp *dp = NULL;
	const Cohort__GroupCreateReply *gr;
	char why[256] = "";
	cohort_status st;
	int32_t me = -1;

	if (c == NULL || name == NULL || ranks == NULL || out == NULL)
		return (cohort__err(COHORT_EINVAL,
		    "group_new: client, name, ranks and out are required"));
	if (name[0] == '\0' || strlen(name) >= COHORT__GROUP_ID_MAX)
		return (cohort__err(COHORT_EINVAL,
		    "group_new: name must have 1 to %d bytes",
		    COHORT__GROUP_ID_MAX - 1));
	if (nranks < 1 || nranks > (size_t)c->world_size)
		return (cohort__err(COHORT_EINVAL,
		    "group_new '%s': %zu ranks (world size %d)", name, nranks,
		    c->world_size));
	for (size_t i = 0; i < nranks; i++) {
		if (ranks[i] < 0 || ranks[i] >= c->world_size)
			return (cohort__err(COHORT_EINVAL,
			    "group_new '%s': rank %d out of range", name,
			    ranks[i]));
		for (size_t j = 0; j < i; j++)
			if (ranks[j] == ranks[i])
				return (cohort__err(COHORT_EINVAL,
				    "group_new '%s': rank %d listed twice",
				    name, ranks[i]));
		if (ranks[i] == c->rank)
			me = (int32_t)i;
	}
	if (me < 0)
		return (cohort__err(COHORT_EINVAL,
		    "group_new '%s': this rank (%d) is not in the list", name,
		    c->rank));
	if (backend == NULL)
		backend = c->backend;
	if (strcmp(backend, "auto") != 0) {
		const struct cohort__backend_entry *e
		    = cohort__backend_find(backend);
		char names[128];
		if (e == NULL) {
			cohort__backend_names(names, sizeof(names));
			return (cohort__err(COHORT_EINVAL,
			    "group_new '%s': unknown backend '%s' (%s)", name,
			    backend, names));
		}
		if (!cohort__backend_usable(e, why, sizeof(why)))
			return (cohort__err(COHORT_ENOTSUP,
			    "group_new '%s': the %s backend is not available: "
			    "%s",
			    name, backend, why));
	}

	body.name = (char *)name;
	body.n_ranks = nranks;
	body.ranks = (int32_t *)ranks;
	req.body_case = COHORT__REQUEST__BODY_GROUP_CREATE;
	req.group_create = &body;
	st = cohort__coord_request(c->coord, &call, &req, NULL, 0,
	    cohort__client_deadline(c, timeout));
	if (st != COHORT_OK) {
		char detail[COHORT__DETAIL_MAX];

		cohort__strlcpy(detail, cohort_last_error(), sizeof(detail));
		cohort__client_job_failed(c, st, call.rep);
		cohort__coord_call_fini(&call);
		return (cohort__err(st, "group_new '%s': %s", name, detail));
	}
	if (call.rep == NULL
	    || call.rep->body_case != COHORT__REPLY__BODY_GROUP_CREATE
	    || (gr = call.rep->group_create) == NULL) {
		cohort__coord_call_fini(&call);
		return (cohort__err(COHORT_EPROTO,
		    "group_new '%s': reply without a group", name));
	}
	if (gr->group_rank != me || gr->group_size != (uint32_t)nranks) {
		st = cohort__err(COHORT_EPROTO,
		    "group_new '%s': cohortd says rank %d of %u, expected %d "
		    "of %zu",
		    name, gr->group_rank, gr->group_size, me, nranks);
		cohort__coord_call_fini(&call);
		return (st);
	}
	st = cohort__client_new_group(c,
	    gr->group != NULL && gr->group[0] != '\0' ? gr->group : name, me,
	    (int32_t)nranks, ranks, &g);
	cohort__coord_call_fini(&call);
	if (st != COHORT_OK)
		return (st);
	if ((st = coll_dp_alloc(g, backend, &dp)) != COHORT_OK) {
		cohort__group_free(g);
		return (st);
	}
	g->dp = dp;
	g->dp_fini = coll_dp_fini;
	g->dp_abort = coll_dp_abort;
	cohort__client_add_group(c, g);
	cohort__coll_setup_early(g);
	*out = g;
	return (COHORT_OK);
}

void
cohort_group_destroy(cohort_group *g)
{
	if (g == NULL || g == g->client->world)
		return;
	cohort__client_remove_group(g->client, g);
	cohort__group_free(g);
}
