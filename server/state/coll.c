/*
 * coll.c - control-plane collectives
 * (proto/README.md section 5).
 *
 * Arrivals are gathered per (group, op_seq) in a srv_coll; each arrival
 * is O(1) (an array slot by group rank), completion is O(group size).
 * Every arrival must agree with the first one on kind, name, root, op,
 * scalar type and count; a disagreement turns the collective into a
 * tombstone that answers COHORT_EMISMATCH to every rank, including the
 * ones still to come, and is freed when the whole group has been told.
 */
#include <inttypes.h>
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "coll.h"
#include "groups.h"

const char *
srv_coll_kind_name(int kind)
{
	static const char *const names[] = {
		[COHORT__COLLECTIVE_KIND__COLL_BARRIER] = "barrier",
		[COHORT__COLLECTIVE_KIND__COLL_BROADCAST] = "broadcast",
		[COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS]
		= "reduce_scalars",
		[COHORT__COLLECTIVE_KIND__COLL_DECIDE] = "decide",
		[COHORT__COLLECTIVE_KIND__COLL_SERVICE] = "service",
		[COHORT__COLLECTIVE_KIND__COLL_BOUNDARY] = "boundary",
	};

	if (kind < 0 || (size_t)kind >= sizeof(names) / sizeof(names[0])
	    || names[kind] == NULL)
		return ("collective");
	return (names[kind]);
}

/* The service backend's operations (Collective.service_op: the client's
 * enum cohort__op_kind, a wire contract of the service backend). */
static const char *
coll_service_name(uint32_t op)
{
	static const char *const names[] = { "?", "allreduce", "reduce",
		"broadcast", "allgather", "allgatherv", "reduce_scatter",
		"alltoall", "gather", "scatter", "barrier" };

	return (op < sizeof(names) / sizeof(names[0]) ? names[op] : "?");
}

/* Which fields of a service operation every rank must agree on. */
static bool
coll_service_rooted(uint32_t op)
{
	return (op == 2 || op == 3 || op == 8 || op == 9);
}

static bool
coll_service_counted(uint32_t op)
{
	return (op != 5 && op != 10); /* allgatherv: per rank; barrier */
}

void
srv_coll_desc_text(const struct srv_cdesc *cd, char *buf, size_t len)
{
	if (cd->kind == COHORT__COLLECTIVE_KIND__COLL_SERVICE) {
		size_t off = 0;

		cohort__appendf(
		    buf, len, &off, "%s (", coll_service_name(cd->service_op));
		if (coll_service_counted(cd->service_op))
			cohort__appendf(
			    buf, len, &off, "count %" PRIu64 ", ", cd->count);
		cohort__appendf(buf, len, &off, "%s",
		    cohort_dtype_name((cohort_dtype)cd->dtype));
		if (cd->service_op == 1 || cd->service_op == 2
		    || cd->service_op == 6) /* the reducing ones */
			cohort__appendf(buf, len, &off, ", %s",
			    cohort_redop_name((cohort_redop)cd->op));
		if (coll_service_rooted(cd->service_op))
			cohort__appendf(buf, len, &off, ", root %d", cd->root);
		cohort__appendf(buf, len, &off, ")");
		return;
	}
	size_t off = 0;

	if (cd->kind == COHORT__COLLECTIVE_KIND__COLL_BOUNDARY) {
		cohort__appendf(buf, len, &off, "step boundary");
		return;
	}
	cohort__appendf(buf, len, &off, "%s '%s'",
	    srv_coll_kind_name(cd->kind), cd->name ? cd->name : "");
	switch (cd->kind) {
	case COHORT__COLLECTIVE_KIND__COLL_BROADCAST:
		cohort__appendf(buf, len, &off, " (root %d)", cd->root);
		break;
	case COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS:
		cohort__appendf(buf, len, &off, " (%s of %zu %s)",
		    cohort_redop_name((cohort_redop)cd->op), cd->nvals,
		    cd->stype == COHORT__SCALAR_TYPE__SCALAR_I64 ? "i64"
		                                                 : "f64");
		break;
	case COHORT__COLLECTIVE_KIND__COLL_DECIDE:
		cohort__appendf(
		    buf, len, &off, " (%s)", cd->decide_all ? "all" : "any");
		break;
	case COHORT__COLLECTIVE_KIND__COLL_SERVICE:
		cohort__appendf(buf, len, &off, " (op %u, %s, %s)",
		    cd->service_op, cohort_dtype_name((cohort_dtype)cd->dtype),
		    cohort_redop_name((cohort_redop)cd->op));
		break;
	default:
		break;
	}
}

static bool
coll_desc_equal(const struct srv_cdesc *a, const struct srv_cdesc *b)
{
	if (a->kind != b->kind || strcmp(a->name, b->name) != 0)
		return (false);
	switch (a->kind) {
	case COHORT__COLLECTIVE_KIND__COLL_BROADCAST:
		return (a->root == b->root);
	case COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS:
		return (a->op == b->op && a->stype == b->stype
		    && a->nvals == b->nvals);
	case COHORT__COLLECTIVE_KIND__COLL_DECIDE:
		return (a->decide_all == b->decide_all);
	case COHORT__COLLECTIVE_KIND__COLL_SERVICE:
		return (a->service_op == b->service_op && a->dtype == b->dtype
		    && a->op == b->op
		    && (!coll_service_counted(a->service_op)
		        || a->count == b->count)
		    && (!coll_service_rooted(a->service_op)
		        || a->root == b->root));
	default:
		return (true);
	}
}

static void
coll_describe(const struct srv_call *c, char *buf, size_t len)
{
	const struct srv_coll *co = c->owner;
	size_t off;

	srv_coll_desc_text(&co->cd, buf, len);
	off = strlen(buf);
	cohort__appendf(buf, len, &off, " (#%" PRIu64 ")", co->op_seq);
	if (co->g->name[0] != '\0')
		cohort__appendf(buf, len, &off, " on group '%s'", co->g->name);
}

static void
coll_what(const struct srv_call *c, char *buf, size_t len, uint64_t *seq,
    const char **group)
{
	const struct srv_coll *co = c->owner;

	srv_coll_desc_text(&co->cd, buf, len);
	*seq = co->op_seq;
	*group = co->g->name;
}

static void coll_withdraw(struct srv_call *c);
static void coll_expire(struct srv_call *c, cohort__time now);

/* An arrival waits in co->calls by group rank. */
static const struct srv_park_ops coll_park
    = { SRV_PARK_COLL, coll_withdraw, coll_expire, coll_describe, coll_what };

/* ------------------------------------------------------------------------ */
/* Collectives                                                              */
/* ------------------------------------------------------------------------ */

static void
coll_free(struct srv_coll *co)
{
	srv_map_del(&co->job->colls, &co->hn);
	if (co->bmsg != NULL)
		nng_msg_free(co->bmsg);
	free(co->key);
	free(co->cd.name);
	free(co->calls);
	free(co->arrived);
	free(co->left);
	free(co->mismatch);
	free(co);
}

static struct srv_coll *
coll_new(struct srv_job *job, struct srv_group *g, uint8_t *key, size_t klen,
    uint64_t op_seq, const struct srv_cdesc *cd, cohort__time now)
{
	struct srv_coll *co = calloc(1, sizeof(*co));

	if (co == NULL)
		return (NULL);
	co->job = job;
	co->g = g;
	co->op_seq = op_seq;
	co->cd = *cd;
	co->cd.name = srv_strdup(cd->name);
	co->calls = calloc(g->n, sizeof(*co->calls));
	co->arrived = calloc(g->n, 1);
	co->first = now;
	if (co->cd.name == NULL || co->calls == NULL || co->arrived == NULL
	    || srv_map_put(&job->colls, &co->hn, key, klen) != COHORT_OK) {
		free(co->cd.name);
		free(co->calls);
		free(co->arrived);
		free(co);
		return (NULL);
	}
	co->key = key;
	co->klen = klen;
	return (co);
}

/* Answers c; its reply says how long c was parked here (as of now):
 * the time that member waited for the others (docs/observability.md). */
static void
coll_answer_ok(struct srv_call *c, Cohort__CollectiveReply *cr,
    const struct cohort__iov *parts, size_t nparts, cohort__time now)
{
	Cohort__Reply rep;
	Cohort__CollectiveReply empty;

	if (cr == NULL) {
		cohort__collective_reply__init(&empty);
		cr = &empty;
	}
	cr->parked = true;
	cr->parked_us
	    = now > c->start ? (uint64_t)(now - c->start) * 1000u : 0;
	srv_reply_init(&rep, c, COHORT_OK);
	rep.body_case = COHORT__REPLY__BODY_COLLECTIVE;
	rep.collective = cr;
	srv_call_answer(c, &rep, parts, nparts);
}

static void
coll_deliver(struct srv_coll *co, struct srv_call *c, cohort__time now)
{
	struct cohort__iov part = { co->bdata, co->blen };

	co->ndelivered++;
	coll_answer_ok(c, NULL, &part, 1, now);
}

static bool
coll_done(struct srv_coll *co)
{
	if (co->mismatch != NULL)
		return (co->narrived == co->g->n && co->nparked == 0);
	if (co->cd.kind == COHORT__COLLECTIVE_KIND__COLL_BROADCAST)
		return (co->root_in && co->ndelivered + 1 >= co->g->n);
	return (false);
}

static void
coll_reduce(struct srv_coll *co, struct srv_call **calls,
    Cohort__CollectiveReply *cr, int64_t *ri, double *rf)
{
	uint32_t n = co->g->n;
	size_t nv = co->cd.nvals;

	if (co->cd.stype == COHORT__SCALAR_TYPE__SCALAR_I64) {
		for (size_t k = 0; k < nv; k++) {
			uint64_t acc = (uint64_t)calls[0]->i64s[k];
			for (uint32_t i = 1; i < n; i++) {
				int64_t v = calls[i]->i64s[k];
				switch (co->cd.op) {
				case COHORT_SUM:
					acc += (uint64_t)v;
					break;
				case COHORT_PROD:
					acc *= (uint64_t)v;
					break;
				case COHORT_MIN:
					if (v < (int64_t)acc)
						acc = (uint64_t)v;
					break;
				default:
					if (v > (int64_t)acc)
						acc = (uint64_t)v;
					break;
				}
			}
			ri[k] = (int64_t)acc;
		}
		cr->n_i64s = nv;
		cr->i64s = ri;
		return;
	}
	for (size_t k = 0; k < nv; k++) {
		double acc = calls[0]->f64s[k];
		for (uint32_t i = 1; i < n; i++) {
			double v = calls[i]->f64s[k];
			switch (co->cd.op) {
			case COHORT_SUM:
			case COHORT_MEAN:
				acc += v;
				break;
			case COHORT_PROD:
				acc *= v;
				break;
			case COHORT_MIN:
				acc = fmin(acc, v);
				break;
			default:
				acc = fmax(acc, v);
				break;
			}
		}
		if (co->cd.op == COHORT_MEAN)
			acc /= (double)n;
		rf[k] = acc;
	}
	cr->n_f64s = nv;
	cr->f64s = rf;
}

/* Everyone arrived: compute, answer each member, free. */
static void
coll_complete(struct srv_coll *co, cohort__time now)
{
	uint32_t n = co->g->n;
	struct srv_call **calls = co->calls;
	Cohort__CollectiveReply cr;
	struct cohort__iov *parts = NULL;
	nng_msg **msgs = NULL;
	int64_t *ri = NULL, *lens = NULL;
	double *rf = NULL;
	size_t nparts = 0;

	cohort__collective_reply__init(&cr);
	co->job->core->m.collectives++;
	switch (co->cd.kind) {
	case COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS:
		ri = malloc(sizeof(int64_t) * co->cd.nvals);
		rf = malloc(sizeof(double) * co->cd.nvals);
		if (ri != NULL && rf != NULL)
			coll_reduce(co, calls, &cr, ri, rf);
		break;
	case COHORT__COLLECTIVE_KIND__COLL_DECIDE:
		cr.decision = co->cd.decide_all;
		for (uint32_t i = 0; i < n; i++) {
			if (co->cd.decide_all)
				cr.decision
				    = cr.decision && calls[i]->decision;
			else
				cr.decision
				    = cr.decision || calls[i]->decision;
		}
		break;
	case COHORT__COLLECTIVE_KIND__COLL_SERVICE:
		parts = malloc(sizeof(*parts) * n);
		msgs = malloc(sizeof(*msgs) * n);
		lens = malloc(sizeof(int64_t) * n);
		if (parts == NULL || msgs == NULL || lens == NULL)
			break;
		/* The replies borrow every request's payload: keep the
		 * messages alive until the last reply is packed. */
		for (uint32_t i = 0; i < n; i++) {
			parts[i].base = calls[i]->payload;
			parts[i].len = calls[i]->plen;
			lens[i] = (int64_t)calls[i]->plen;
			msgs[i] = calls[i]->msg;
			calls[i]->msg = NULL;
		}
		nparts = n;
		cr.n_i64s = n;
		cr.i64s = lens;
		break;
	default:
		break;
	}
	for (uint32_t i = 0; i < n; i++) {
		struct srv_call *c = calls[i];
		calls[i] = NULL;
		c->owner = NULL;
		coll_answer_ok(c, &cr, parts, nparts, now);
	}
	co->nparked = 0;
	if (msgs != NULL && nparts == n)
		for (uint32_t i = 0; i < n; i++)
			nng_msg_free(msgs[i]);
	free(parts);
	free(msgs);
	free(lens);
	free(ri);
	free(rf);
	coll_free(co);
}

/* Turns co into a tombstone answering st with detail to every rank that
 * is parked in it or still comes (c included). */
static void
coll_tombstone(struct srv_coll *co, struct srv_call *c, cohort_status st,
    const char *detail)
{
	struct srv_group *g = co->g;

	for (uint32_t i = 0; i < g->n; i++) {
		struct srv_call *p = co->calls[i];
		if (p == NULL)
			continue;
		co->calls[i] = NULL;
		p->owner = NULL;
		srv_call_fail(p, st, "%s", detail);
	}
	co->nparked = 0;
	if (co->bmsg != NULL) {
		nng_msg_free(co->bmsg);
		co->bmsg = NULL;
	}
	co->mismatch = srv_strdup(detail);
	co->fail_st = st;
	co->arrived[c->grank] = 1;
	co->narrived++;
	srv_call_fail(c, st, "%s", detail);
	if (co->mismatch == NULL || coll_done(co))
		coll_free(co);
}

static void
coll_mismatch(struct srv_coll *co, struct srv_call *c)
{
	struct srv_group *g = co->g;
	int32_t *r = malloc(sizeof(int32_t) * g->n);
	size_t nr = 0;
	char rb[256], da[512], db[512], detail[1400];

	for (uint32_t i = 0; r != NULL && i < g->n; i++)
		if (co->arrived[i])
			r[nr++] = g->ranks[i];
	srv_fmt_ranks(rb, sizeof(rb), r, nr);
	free(r);
	srv_coll_desc_text(&co->cd, da, sizeof(da));
	srv_coll_desc_text(&c->cd, db, sizeof(db));
	if (co->cd.kind == COHORT__COLLECTIVE_KIND__COLL_SERVICE)
		snprintf(detail, sizeof(detail),
		    "ranks disagree: rank%s %s called %s, rank %d called %s",
		    nr == 1 ? "" : "s", rb, da, c->rank, db);
	else
		snprintf(detail, sizeof(detail),
		    "collective #%" PRIu64 " on group '%s' mismatch: rank%s "
		    "%s called %s, rank %d called %s",
		    co->op_seq, g->name, nr == 1 ? "" : "s", rb, da, c->rank,
		    db);
	coll_tombstone(co, c, COHORT_EMISMATCH, detail);
}

/* Validates a Collective and copies what a parked arrival needs into c.
 * Returns false after answering c. */
static bool
coll_validate(struct srv_call *c, const Cohort__Collective *co)
{
	if (co->op_seq == 0) {
		srv_call_fail(c, COHORT_EINVAL, "op_seq must start at 1");
		return (false);
	}
	if (strlen(co->name) > SRV_MAX_NAME
	    || strlen(co->group) > SRV_MAX_NAME) {
		srv_call_fail(c, COHORT_EINVAL,
		    "collective or group name longer than %d bytes",
		    SRV_MAX_NAME);
		return (false);
	}
	c->cd.kind = (int)co->kind;
	c->cd.root = co->root;
	c->cd.op = co->op;
	c->cd.stype = (int)co->scalar_type;
	c->cd.decide_all = co->decide_all;
	c->cd.service_op = co->service_op;
	c->cd.dtype = co->dtype;
	c->cd.count = co->count;
	c->decision = co->decision;
	switch (co->kind) {
	case COHORT__COLLECTIVE_KIND__COLL_NONE:
		srv_call_fail(c, COHORT_EINVAL, "collective kind is missing");
		return (false);
	case COHORT__COLLECTIVE_KIND__COLL_BOUNDARY:
		if (co->group[0] != '\0') {
			srv_call_fail(c, COHORT_EINVAL,
			    "a step boundary is on the world group (\"\"), "
			    "not "
			    "on group '%s'",
			    co->group);
			return (false);
		}
		c->has_state = co->has_state;
		/* FALLTHROUGH */
	case COHORT__COLLECTIVE_KIND__COLL_BARRIER:
	case COHORT__COLLECTIVE_KIND__COLL_DECIDE:
		if (c->plen != 0) {
			srv_call_fail(c, COHORT_EINVAL,
			    "a %s carries no payload",
			    srv_coll_kind_name(co->kind));
			return (false);
		}
		break;
	case COHORT__COLLECTIVE_KIND__COLL_BROADCAST:
		/* Too big: failed for every rank at the root's arrival. */
		c->object_len
		    = co->object_len > c->plen ? co->object_len : c->plen;
		break;
	case COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS: {
		size_t n;
		if (co->scalar_type == COHORT__SCALAR_TYPE__SCALAR_I64) {
			n = co->n_i64s;
			if (co->n_f64s != 0)
				n = 0;
		} else if (co->scalar_type
		    == COHORT__SCALAR_TYPE__SCALAR_F64) {
			n = co->n_f64s;
			if (co->n_i64s != 0)
				n = 0;
		} else {
			srv_call_fail(c, COHORT_EINVAL,
			    "unknown scalar type %d", (int)co->scalar_type);
			return (false);
		}
		if (n == 0 || n > COHORT__MAX_SCALARS || c->plen != 0) {
			srv_call_fail(c, COHORT_EINVAL,
			    "reduce_scalars needs 1..%d values of its scalar "
			    "type only and no payload",
			    COHORT__MAX_SCALARS);
			return (false);
		}
		if (co->op >= COHORT_REDOP_COUNT
		    || (co->op == COHORT_MEAN
		        && co->scalar_type
		            == COHORT__SCALAR_TYPE__SCALAR_I64)) {
			srv_call_fail(c, COHORT_EINVAL,
			    "reduction op %u is not valid for %s", co->op,
			    co->scalar_type == COHORT__SCALAR_TYPE__SCALAR_I64
			        ? "i64"
			        : "f64");
			return (false);
		}
		c->cd.nvals = n;
		if (co->scalar_type == COHORT__SCALAR_TYPE__SCALAR_I64) {
			c->i64s = malloc(n * sizeof(int64_t));
			if (c->i64s != NULL)
				memcpy(c->i64s, co->i64s, n * sizeof(int64_t));
		} else {
			c->f64s = malloc(n * sizeof(double));
			if (c->f64s != NULL)
				memcpy(c->f64s, co->f64s, n * sizeof(double));
		}
		if (c->i64s == NULL && c->f64s == NULL) {
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return (false);
		}
		break;
	}
	case COHORT__COLLECTIVE_KIND__COLL_SERVICE:
		break;
	default:
		srv_call_fail(c, COHORT_ENOTSUP,
		    "collective kind %d is not supported by this cohortd",
		    (int)co->kind);
		return (false);
	}
	if ((c->cd.name = srv_strdup(co->name)) == NULL) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return (false);
	}
	return (true);
}

/* Everyone arrived at a collective whose owner completes it (a step
 * boundary): its parked arrivals go to done, co is freed. */
static void
coll_detach(struct srv_coll *co, struct srv_coll_done *done)
{
	done->calls = co->calls;
	done->n = co->g->n;
	for (uint32_t i = 0; i < done->n; i++)
		done->calls[i]->owner = NULL;
	co->calls = NULL;
	co->nparked = 0;
	co->job->core->m.collectives++;
	coll_free(co);
}

/* The arrival of member m at the collective req. With done, the last
 * arrival hands every arrival over (true) instead of completing it. */
static bool
coll_arrive(struct srv_call *c, const struct srv_member *m,
    const Cohort__Collective *req, cohort__time now,
    struct srv_coll_done *done)
{
	struct srv_job *job = c->job;
	struct srv_group *g;
	struct srv_coll *co;
	struct srv_hnode *n;
	uint8_t *key;
	size_t glen, klen;
	int32_t grank;

	if (!coll_validate(c, req))
		return (false);
	g = srv_group_find(job, req->group);
	if (g == NULL || !g->complete) {
		srv_call_fail(c, COHORT_ENOENT,
		    "group '%s' does not exist in generation %" PRIu64
		    " of job '%s'",
		    req->group, job->generation, job->name);
		return (false);
	}
	if ((grank = g->grank_of[m->rank]) < 0) {
		srv_call_fail(c, COHORT_EINVAL,
		    "rank %d is not a member of group '%s'", m->rank, g->name);
		return (false);
	}
	c->rank = m->rank;
	c->grank = grank;
	if (req->kind == COHORT__COLLECTIVE_KIND__COLL_BROADCAST) {
		if (req->root < 0 || (uint32_t)req->root >= g->n) {
			srv_call_fail(c, COHORT_EINVAL,
			    "broadcast root %d is out of range for group '%s' "
			    "of size %u",
			    req->root, g->name, g->n);
			return (false);
		}
		if (grank != req->root && c->plen != 0) {
			srv_call_fail(c, COHORT_EINVAL,
			    "only the broadcast root sends a payload");
			return (false);
		}
	}
	glen = strlen(req->group);
	klen = 8 + glen;
	if ((key = malloc(klen)) == NULL) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return (false);
	}
	memcpy(key, &req->op_seq, 8);
	memcpy(key + 8, req->group, glen);
	n = srv_map_get(&job->colls, key, klen);
	if (n != NULL) {
		free(key);
		co = SRV_CONTAINER(n, struct srv_coll, hn);
	} else {
		char what[600];
		for (uint32_t i = 0; i < g->n; i++) {
			if (job->members[g->ranks[i]].state != SRV_MEMBER_LEFT)
				continue;
			free(key);
			srv_coll_desc_text(&c->cd, what, sizeof(what));
			srv_group_answer_left(c, g->ranks[i], what);
			return (false);
		}
		co = coll_new(job, g, key, klen, req->op_seq, &c->cd, now);
		if (co == NULL) {
			free(key);
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return (false);
		}
	}
	if (co->mismatch != NULL) {
		if (!co->arrived[grank]) {
			co->arrived[grank] = 1;
			co->narrived++;
		}
		srv_call_fail(c, co->fail_st, "%s", co->mismatch);
		if (coll_done(co))
			coll_free(co);
		return (false);
	}
	if (co->arrived[grank]) {
		srv_call_fail(c, COHORT_EINVAL,
		    "rank %d entered collective #%" PRIu64
		    " on group '%s' twice",
		    m->rank, co->op_seq, g->name);
		return (false);
	}
	if (!coll_desc_equal(&co->cd, &c->cd)) {
		coll_mismatch(co, c);
		return (false);
	}
	co->arrived[grank] = 1;
	co->narrived++;
	if (co->cd.kind == COHORT__COLLECTIVE_KIND__COLL_BROADCAST
	    && grank == co->cd.root
	    && c->object_len > c->core->lim.max_value) {
		char detail[400];

		co->arrived[grank] = 0;
		co->narrived--;
		snprintf(detail, sizeof(detail),
		    "broadcast object of %" PRIu64 " bytes from rank %d "
		    "exceeds cohortd's --max-value-bytes %" PRIu64,
		    c->object_len, c->rank, c->core->lim.max_value);
		coll_tombstone(co, c, COHORT_ETOOBIG, detail);
		return (false);
	}
	if (co->cd.kind == COHORT__COLLECTIVE_KIND__COLL_BROADCAST) {
		if (grank == co->cd.root) {
			co->bmsg = c->msg;
			co->bdata = c->payload;
			co->blen = c->plen;
			c->msg = NULL;
			co->root_in = true;
			coll_answer_ok(c, NULL, NULL, 0, now);
			for (uint32_t i = 0; i < g->n; i++) {
				struct srv_call *p = co->calls[i];
				if (p == NULL)
					continue;
				co->calls[i] = NULL;
				co->nparked--;
				p->owner = NULL;
				coll_deliver(co, p, now);
			}
		} else if (co->root_in) {
			coll_deliver(co, c, now);
		} else {
			co->calls[grank] = c;
			co->nparked++;
			c->owner = co;
			srv_call_park(c, &coll_park);
			return (false);
		}
		if (coll_done(co))
			coll_free(co);
		return (false);
	}
	co->calls[grank] = c;
	co->nparked++;
	c->owner = co;
	srv_call_park(c, &coll_park);
	if (co->narrived < g->n)
		return (false);
	if (done == NULL) {
		coll_complete(co, now);
		return (false);
	}
	coll_detach(co, done);
	return (true);
}

static void
coll_withdraw(struct srv_call *c)
{
	struct srv_coll *co = c->owner;

	co->calls[c->grank] = NULL;
	co->arrived[c->grank] = 0;
	/* made on the first withdrawal only: most collectives have none
	 * (without it, a later timeout names this rank as never come) */
	if (co->left == NULL)
		co->left = calloc(co->g->n, 1);
	if (co->left != NULL)
		co->left[c->grank] = 1;
	co->narrived--;
	co->nparked--;
	c->owner = NULL;
	if (co->narrived == 0)
		coll_free(co);
}

static void
coll_expire(struct srv_call *c, cohort__time now)
{
	struct srv_coll *co = c->owner;
	struct srv_group *g = co->g;
	struct srv_job *job = c->job;
	int32_t *miss = calloc(g->n + 1, sizeof(int32_t));
	int32_t *gone = calloc(g->n + 1, sizeof(int32_t));
	size_t nm = 0, ng = 0, off = 0;
	char secs[32], what[700], buf[2400], doing[800], rb[512];
	const struct srv_member *self
	    = c->client != NULL ? c->client->member : NULL;

	/* Never came, apart from came and timed out first: two ranks whose
	 * deadlines fall close together must not name each other. */
	for (uint32_t i = 0; miss != NULL && i < g->n; i++) {
		if (co->arrived[i])
			continue;
		if (co->cd.kind == COHORT__COLLECTIVE_KIND__COLL_BROADCAST
		    && (int32_t)i != co->cd.root)
			continue;
		if (gone != NULL && co->left != NULL && co->left[i])
			gone[ng++] = g->ranks[i];
		else
			miss[nm++] = g->ranks[i];
	}
	coll_describe(c, what, sizeof(what));
	if (nm == 0 && ng > 0) {
		/* Every absent rank came and left: they are what is missing.
		 */
		int32_t *t = miss;

		miss = gone;
		gone = t;
		nm = ng;
		ng = 0;
		srv_fmt_absent(buf, sizeof(buf), &off, what, now - c->start,
		    miss, nm,
		    "arrived but timed out and left before the others came");
	} else
		srv_fmt_never_arrived(
		    buf, sizeof(buf), &off, what, now - c->start, miss, nm);
	/* What the missing ranks do instead, and the liveness bound that
	 * did not fire (they were alive all along). */
	for (size_t i = 0; i < nm && i < 4; i++) {
		srv_member_doing(
		    &job->members[miss[i]], now, false, doing, sizeof(doing));
		cohort__appendf(buf, sizeof(buf), &off, "%s%s",
		    i == 0 ? " (" : ", ", doing);
	}
	if (nm > 4)
		cohort__appendf(buf, sizeof(buf), &off, ", ...");
	if (nm > 0)
		cohort__appendf(buf, sizeof(buf), &off, ")");
	if (ng > 0) {
		srv_fmt_ranks(rb, sizeof(rb), gone, ng);
		cohort__appendf(buf, sizeof(buf), &off,
		    "; rank%s %s arrived but timed out first",
		    ng == 1 ? "" : "s", rb);
	}
	free(gone);
	if (self != NULL) {
		srv_fmt_secs(secs, sizeof(secs), (cohort__time)self->dead_ms);
		cohort__appendf(buf, sizeof(buf), &off,
		    "; heartbeat dead-after is %s", secs);
	}
	srv_call_timed_out(c, now, buf, miss, nm);
}

/* Ends a pending collective, answering its parked calls as e says. */
static void
coll_end(struct srv_coll *co, const struct srv_end *e)
{
	srv_end_calls(co->calls, co->g->n, e);
	co->nparked = 0;
	coll_free(co);
}

void
srv_coll_reset(
    struct srv_job *job, cohort_status st, const char *why, bool free_groups)
{
	const struct srv_end e = { st, why, -1, NULL };
	struct srv_hnode *n, *next;
	size_t i;

	for (i = 0; i < job->colls.nb; i++)
		while ((n = job->colls.b[i]) != NULL)
			coll_end(SRV_CONTAINER(n, struct srv_coll, hn), &e);
	for (n = srv_map_next(&job->groups, &i, NULL); n != NULL; n = next) {
		struct srv_group *g = SRV_CONTAINER(n, struct srv_group, hn);
		next = srv_map_next(&job->groups, &i, n);
		if (!g->complete || free_groups)
			srv_group_end(job, g, &e);
	}
}

void
srv_coll_rank_left(struct srv_job *job, int32_t rank)
{
	char what[700];
	const struct srv_end e = { COHORT_EPEERLOST, NULL, rank, what };
	struct srv_hnode *n, *next;
	size_t i;

	for (n = srv_map_next(&job->colls, &i, NULL); n != NULL; n = next) {
		struct srv_coll *co = SRV_CONTAINER(n, struct srv_coll, hn);
		int32_t gr = co->g->grank_of[rank];
		next = srv_map_next(&job->colls, &i, n);
		if (gr < 0 || co->arrived[gr] || co->mismatch || co->root_in)
			continue;
		srv_coll_desc_text(&co->cd, what, sizeof(what));
		coll_end(co, &e);
	}
	for (n = srv_map_next(&job->groups, &i, NULL); n != NULL; n = next) {
		struct srv_group *g = SRV_CONTAINER(n, struct srv_group, hn);
		int32_t gr = g->grank_of[rank];
		next = srv_map_next(&job->groups, &i, n);
		if (g->complete || gr < 0 || g->arr[gr] != NULL)
			continue;
		snprintf(
		    what, sizeof(what), "creation of group '%s'", g->name);
		srv_group_end(job, g, &e);
	}
}

void
srv_coll_handle(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	(void)coll_arrive(c, c->client->member, req->collective, now, NULL);
}

bool
srv_coll_boundary(struct srv_call *c, const Cohort__Request *req,
    cohort__time now, struct srv_coll_done *done)
{
	return (coll_arrive(c, c->client->member, req->collective, now, done));
}
