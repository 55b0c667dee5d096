/*
 * control.c - control-plane collectives through cohortd: barrier, object
 * broadcast, scalar reduction, boolean decision (proto/README.md
 * section 5).
 *
 * The n-th control-plane collective a member issues on a group carries
 * op_seq = n; cohortd matches arrivals by (group, op_seq). op_seq advances
 * when a collective completes or fails for good (EPEERLOST, ESTALE,
 * EMISMATCH), never on ETIMEDOUT: cohortd withdrew that arrival, so the
 * call may be retried under the same number.
 */
#include <errno.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "client.h"

/* Takes a mutex before deadline (pthread's timed lock is on the real-time
 * clock). */
static cohort_status
control_lock(pthread_mutex_t *m, cohort__time deadline)
{
	struct timespec ts;
	int rv;

	if (deadline == COHORT__TIME_NEVER)
		rv = pthread_mutex_lock(m);
	else {
		cohort__realtime_after(&ts, cohort__remaining(deadline));
		rv = pthread_mutex_timedlock(m, &ts);
	}
	if (rv == ETIMEDOUT)
		return (cohort__err(COHORT_ETIMEDOUT,
		    "timed out waiting for another thread's collective on "
		    "the group"));
	if (rv != 0)
		return (
		    cohort__err(COHORT_ESYSTEM, "pthread_mutex_lock: %d", rv));
	return (COHORT_OK);
}

/* One control-plane collective: its request, and the call that carries
 * it and its reply. */
struct control_op {
	Cohort__Request req;
	Cohort__Collective coll;
	struct cohort__coord_call call;
};

static void
control_op_init(struct control_op *o, Cohort__CollectiveKind kind)
{
	cohort__request__init(&o->req);
	cohort__collective__init(&o->coll);
	o->coll.kind = kind;
	o->coll.name = "";
	cohort__coord_call_init(&o->call, &o->req, COHORT__TIME_NEVER);
}

/* Runs one control-plane collective of g, o->coll filled in. On return
 * the reply (if any) is in o->call, which the caller finalises in all
 * cases. */
static cohort_status
control_run(cohort_group *g, struct control_op *o,
    const struct cohort__iov *parts, size_t nparts, cohort_duration timeout,
    const char *what)
{
	Cohort__Collective *coll = &o->coll;
	struct cohort__coord_call *call = &o->call;
	Cohort__Request *req = &o->req;
	struct cohort_client *c = g->client;
	struct cohort__log_ctx lctx;
	const struct cohort__log_ctx *lsaved = NULL;
	uint64_t t0 = 0, t1 = 0, bytes = 0;
	bool began = false;
	cohort__time deadline;
	uint64_t op_seq;
	cohort_status st;

	if ((st = cohort__group_check(g)) != COHORT_OK)
		return (st);
	deadline = cohort__client_deadline(c, timeout);
	if ((st = control_lock(&g->ctl_lock, deadline)) != COHORT_OK)
		return (st);
	op_seq = g->ctl_seq + 1;
	coll->group = g->id;
	coll->op_seq = op_seq;
	req->body_case = COHORT__REQUEST__BODY_COLLECTIVE;
	req->collective = coll;
	cohort__coord_call_init(call, req, deadline);
	call->parts = parts;
	call->nparts = nparts;

	pthread_mutex_lock(&g->mtx);
	if (atomic_load_explicit(&g->abort_flag, memory_order_acquire)) {
		pthread_mutex_unlock(&g->mtx);
		st = cohort__group_check(g);
		goto out_unlock;
	}
	g->ctl_call = call;
	pthread_mutex_unlock(&g->mtx);

	if ((st = cohort__group_op_begin(g, what, op_seq)) != COHORT_OK) {
		/* injected: nothing was sent, op_seq stays for a retry */
		pthread_mutex_lock(&g->mtx);
		g->ctl_call = NULL;
		pthread_mutex_unlock(&g->mtx);
		goto out_unlock;
	}
	began = true;
	lctx.job = c->job;
	lctx.rank = c->rank;
	lctx.op = what;
	lctx.seq = op_seq;
	lsaved = cohort__log_ctx_push(&lctx);
	for (size_t i = 0; i < nparts; i++)
		bytes += parts[i].len;
	st = cohort__coord_call(c->coord, call);
	cohort__group_op_end(g);
	t0 = g->op_start_ns;
	t1 = g->op_end_ns;

	pthread_mutex_lock(&g->mtx);
	g->ctl_call = NULL;
	pthread_mutex_unlock(&g->mtx);

	switch (st) {
	case COHORT_OK:
	case COHORT_EMISMATCH:
		g->ctl_seq = op_seq;
		break;
	case COHORT_EPEERLOST:
	case COHORT_ESTALE:
		g->ctl_seq = op_seq;
		cohort__client_job_failed(c, st, call->rep);
		st = cohort__group_check(g);
		break;
	case COHORT_EMEMBERSHIP:
		/* elastic: the job moved on; this collective did not take
		 * effect on any member (README section 8.2) */
		g->ctl_seq = op_seq;
		cohort__client_job_failed(c, st, call->rep);
		if (cohort_group_error(g) != COHORT_OK)
			st = cohort__group_check(g);
		break;
	case COHORT_ETIMEDOUT:
		if (call->rep != NULL
		    && (call->rep->error == NULL
		        || call->rep->error[0] == '\0')) {
			char ranks[256];
			size_t off = 0;

			ranks[0] = '\0';
			for (size_t i = 0; i < call->rep->n_missing_ranks; i++)
				cohort__appendf(ranks, sizeof(ranks), &off,
				    "%s%d", i > 0 ? ", " : "",
				    call->rep->missing_ranks[i]);
			cohort__err(st,
			    "%s (#%llu) on group '%s' timed out; "
			    "ranks never arrived: %s",
			    what, (unsigned long long)op_seq, g->id,
			    off > 0 ? ranks : "unknown");
		}
		break;
	default:
		if (call->aborted || atomic_load(&g->abort_flag)) {
			st = cohort__group_check(g);
			if (st == COHORT_OK)
				st = cohort__err(
				    COHORT_EABORTED, "%s aborted", what);
		}
		break;
	}
	if (began) {
		/* A control-plane collective is parked at cohortd until the
		 * last rank arrives: all of it is waiting for peers, but an
		 * object broadcast's transfer. */
		struct cohort__obs_op oo = {
			.kind = cohort__obs_control_kind(what),
			.name = what,
			.group = g->id,
			.track = COHORT__TRACK_CONTROL,
			.control = true,
			.seq = op_seq,
			.backend = "cohortd",
			.bytes = bytes,
			.t0_ns = t0,
			.t1_ns = t1,
			.wait_ns
			= strcmp(what, "broadcast_obj") == 0 ? 0 : t1 - t0,
			.st = st,
			.detail = st != COHORT_OK ? cohort_last_error() : NULL
		};

		cohort__log_ctx_pop(lsaved);
		cohort__obs_op(&c->obs, &oo);
	}
out_unlock:
	pthread_mutex_unlock(&g->ctl_lock);
	return (st);
}

static cohort_status
control_check_name(const char *name)
{
	if (name != NULL && strlen(name) > COHORT__MAX_KEY)
		return (cohort__err(COHORT_EINVAL,
		    "collective name longer than %d bytes", COHORT__MAX_KEY));
	return (COHORT_OK);
}

cohort_status
cohort_barrier(cohort_group *g, const char *name, cohort_duration timeout)
{
	struct control_op o;
	cohort_status st;

	if (g == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL group"));
	if ((st = control_check_name(name)) != COHORT_OK)
		return (st);
	control_op_init(&o, COHORT__COLLECTIVE_KIND__COLL_BARRIER);
	o.coll.name = (char *)(name != NULL ? name : "");
	st = control_run(g, &o, NULL, 0, timeout, "barrier");
	cohort__coord_call_fini(&o.call);
	return (st);
}

cohort_status
cohort_broadcast_obj(cohort_group *g, int32_t root, const void *data,
    size_t len, void **out, size_t *out_len, cohort_duration timeout)
{
	struct control_op o;
	struct cohort__iov iov = { data, len };
	const void *src;
	size_t n;
	void *p;
	bool is_root, oversize;
	cohort_status st;

	if (g == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL group"));
	if (root < 0 || root >= g->size)
		return (cohort__err(COHORT_EINVAL,
		    "broadcast root %d out of range for group size %d", root,
		    g->size));
	is_root = g->rank == root;
	if (is_root && data == NULL && len > 0)
		return (cohort__err(COHORT_EINVAL, "NULL data on the root"));
	if (!is_root && out == NULL)
		return (cohort__err(
		    COHORT_EINVAL, "NULL output on a receiving rank"));
	control_op_init(&o, COHORT__COLLECTIVE_KIND__COLL_BROADCAST);
	o.coll.root = root;
	/* An object cohortd cannot take is announced, not sent: cohortd
	 * then fails the broadcast on every rank with ETOOBIG. */
	oversize = is_root
	    && (uint64_t)len > cohort__coord_max_value(g->client->coord);
	if (is_root)
		o.coll.object_len = len;
	st = control_run(g, &o, is_root && !oversize ? &iov : NULL,
	    is_root && !oversize ? 1 : 0, timeout, "broadcast_obj");
	if (st != COHORT_OK || out == NULL)
		goto out;
	src = is_root ? data : o.call.payload;
	n = is_root ? len : o.call.plen;
	if ((p = malloc(n > 0 ? n : 1)) == NULL) {
		st = cohort__err(COHORT_ENOMEM,
		    "cannot allocate %zu bytes for the object", n);
		goto out;
	}
	if (n > 0)
		memcpy(p, src, n);
	*out = p;
	if (out_len != NULL)
		*out_len = n;
out:
	cohort__coord_call_fini(&o.call);
	return (st);
}

cohort_status
cohort_reduce_scalars(cohort_group *g, cohort_dtype dtype, cohort_redop op,
    void *values, size_t count, cohort_duration timeout)
{
	struct control_op o;
	const Cohort__CollectiveReply *cr;
	cohort_status st;

	if (g == NULL || (values == NULL && count > 0))
		return (cohort__err(COHORT_EINVAL, "NULL group or values"));
	if (dtype != COHORT_I64 && dtype != COHORT_F64)
		return (cohort__err(COHORT_EINVAL,
		    "reduce_scalars takes i64 or f64, not %s",
		    cohort_dtype_name(dtype)));
	if ((unsigned)op >= COHORT_REDOP_COUNT)
		return (cohort__err(
		    COHORT_EINVAL, "unknown reduction %d", (int)op));
	if (op == COHORT_MEAN && dtype != COHORT_F64)
		return (cohort__err(
		    COHORT_EINVAL, "mean is defined for f64 only"));
	if (count > COHORT__MAX_SCALARS)
		return (cohort__err(COHORT_EINVAL,
		    "%zu scalars exceed the limit of %d", count,
		    COHORT__MAX_SCALARS));
	control_op_init(&o, COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS);
	o.coll.op = (uint32_t)op;
	if (dtype == COHORT_I64) {
		o.coll.scalar_type = COHORT__SCALAR_TYPE__SCALAR_I64;
		o.coll.i64s = values;
		o.coll.n_i64s = count;
	} else {
		o.coll.scalar_type = COHORT__SCALAR_TYPE__SCALAR_F64;
		o.coll.f64s = values;
		o.coll.n_f64s = count;
	}
	st = control_run(g, &o, NULL, 0, timeout, "reduce_scalars");
	if (st != COHORT_OK || count == 0)
		goto out;
	cr = cohort__coord_reply_body(&o.call, COHORT__REPLY__BODY_COLLECTIVE);
	if (cr != NULL && dtype == COHORT_I64 && cr->n_i64s == count)
		memcpy(values, cr->i64s, count * sizeof(int64_t));
	else if (cr != NULL && dtype == COHORT_F64 && cr->n_f64s == count)
		memcpy(values, cr->f64s, count * sizeof(double));
	else
		st = cohort__err(COHORT_EPROTO,
		    "reduce_scalars reply does not hold %zu values", count);
out:
	cohort__coord_call_fini(&o.call);
	return (st);
}

cohort_status
cohort_decide(cohort_group *g, bool decision, bool all, bool *out,
    cohort_duration timeout)
{
	struct control_op o;
	const Cohort__CollectiveReply *cr;
	cohort_status st;

	if (g == NULL || out == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL group or output"));
	control_op_init(&o, COHORT__COLLECTIVE_KIND__COLL_DECIDE);
	o.coll.decision = decision;
	o.coll.decide_all = all;
	st = control_run(g, &o, NULL, 0, timeout, "decide");
	if (st != COHORT_OK)
		goto out;
	cr = cohort__coord_reply_body(&o.call, COHORT__REPLY__BODY_COLLECTIVE);
	if (cr == NULL)
		st = cohort__err(COHORT_EPROTO, "decide reply without result");
	else
		*out = cr->decision;
out:
	cohort__coord_call_fini(&o.call);
	return (st);
}

cohort_status
cohort__control_boundary(struct cohort_group *world, bool has_state,
    cohort_duration timeout, struct cohort__boundary_reply *out)
{
	struct control_op o;
	const Cohort__CollectiveReply *cr;
	cohort_status st;

	memset(out, 0, sizeof(*out));
	out->sender = -1;
	control_op_init(&o, COHORT__COLLECTIVE_KIND__COLL_BOUNDARY);
	o.coll.has_state = has_state;
	st = control_run(world, &o, NULL, 0, timeout, "boundary");
	if (st != COHORT_OK)
		goto out;
	cr = cohort__coord_reply_body(&o.call, COHORT__REPLY__BODY_COLLECTIVE);
	if (cr == NULL) {
		st = cohort__err(
		    COHORT_EPROTO, "step boundary reply without its result");
		goto out;
	}
	out->changed = cr->changed;
	out->generation
	    = cr->generation != 0 ? cr->generation : o.call.rep->generation;
	out->seq = o.coll.op_seq;
	out->sender = cr->state_sender;
	if (cr->state_sender >= 0 && cr->n_state_receivers > 0) {
		out->receivers
		    = malloc(cr->n_state_receivers * sizeof(int32_t));
		if (out->receivers == NULL) {
			st = cohort__err(COHORT_ENOMEM, "out of memory");
			goto out;
		}
		memcpy(out->receivers, cr->state_receivers,
		    cr->n_state_receivers * sizeof(int32_t));
		out->nreceivers = (int32_t)cr->n_state_receivers;
	} else {
		out->sender = -1;
	}
out:
	cohort__coord_call_fini(&o.call);
	return (st);
}
