/*
 * srv_fixture.h - drives cohortd's coordinator (front/dispatch.h,
 * front/events.h) without sockets: a fake clock, a capturing reply sink,
 * and requests sent with the builders of srv_req.h. Every request gets a
 * unique tag (its transport handle), so a test asks for "the reply to request
 * #n".
 */
#ifndef COHORT_SRV_FIXTURE_H
#define COHORT_SRV_FIXTURE_H

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"
#include "srv_req.h"

#define FX_MAX 8192

struct fx_reply {
	uintptr_t tag;
	nng_msg *msg;
	Cohort__Reply *rep;
	const uint8_t *pl;
	size_t plen;
};

struct fx {
	struct srv_core *core;
	char dir[256]; /* journal directory, "" = none */
	uint64_t compact_min;
	cohort__time now;
	uintptr_t next_tag;
	struct fx_reply r[FX_MAX];
	size_t n;
	size_t ndrop;
};

struct fx;
static inline struct fx *fx_new(void);
static inline void fx_free(struct fx *f);

/* The core of the running test, in suites whose test case has the checked
 * fixture fx_setup / fx_teardown: made before each test (in its process)
 * and freed after it. A test that makes its own declares its own f. */
static struct fx *f;

static inline void
fx_setup(void)
{
	f = fx_new();
}

static inline void
fx_teardown(void)
{
	fx_free(f);
	f = NULL;
}

static inline void
fx_sink(void *arg, void *tp, nng_msg *m)
{
	struct fx *f = arg;
	struct fx_reply *r;

	if (m == NULL) {
		f->ndrop++;
		return;
	}
	ck_assert_uint_lt(f->n, FX_MAX);
	r = &f->r[f->n++];
	r->tag = (uintptr_t)tp;
	r->msg = m;
	ck_assert_cohort_ok(
	    cohort__wire_unpack_reply(m, &r->rep, &r->pl, &r->plen));
}

static inline struct fx *
fx_new_limits(uint64_t max_value, uint64_t max_job, uint64_t max_keys)
{
	struct fx *f = calloc(1, sizeof(*f));
	struct srv_limits lim
	    = { max_value, max_job, max_keys, 0, 0, 0, 0, 0, 0, 0 };

	ck_assert_ptr_nonnull(f);
	f->now = 1000000;
	f->next_tag = 1;
	ck_assert_cohort_ok(
	    srv_core_new(&lim, NULL, fx_sink, f, f->now, &f->core));
	return (f);
}

static inline struct fx *
fx_new(void)
{
	return (fx_new_limits(1u << 20, 1u << 24, 1000));
}

/* Lets go of the replies collected so far (a long loop of requests). */
static inline void
fx_forget_replies(struct fx *f)
{
	for (size_t i = 0; i < f->n; i++) {
		cohort__reply__free_unpacked(f->r[i].rep, NULL);
		nng_msg_free(f->r[i].msg);
	}
	f->n = 0;
}

static inline void
fx_free(struct fx *f)
{
	srv_core_free(f->core);
	fx_forget_replies(f);
	free(f);
}

/* The reply to request tag, or NULL if none yet. */
static inline struct fx_reply *
fx_get(struct fx *f, uintptr_t tag)
{
	for (size_t i = f->n; i-- > 0;)
		if (f->r[i].tag == tag)
			return (&f->r[i]);
	return (NULL);
}

/* The reply to tag, which must exist, with status st. */
static inline Cohort__Reply *
fx_want(struct fx *f, uintptr_t tag, cohort_status st)
{
	struct fx_reply *r = fx_get(f, tag);

	ck_assert_msg(
	    r != NULL, "no reply to request #%lu", (unsigned long)tag);
	ck_assert_msg(r->rep->status == (int32_t)st,
	    "request #%lu: expected %s, got %s: %s", (unsigned long)tag,
	    cohort_status_name(st), cohort_status_name(r->rep->status),
	    r->rep->error);
	return (r->rep);
}

static inline void
fx_tick(struct fx *f, cohort__time ms)
{
	f->now += ms;
	srv_core_sweep(f->core, f->now);
}

static inline uintptr_t
fx_raw(struct fx *f, nng_msg *m, uint32_t pipe)
{
	uintptr_t tag = f->next_tag++;

	srv_core_dispatch(f->core, m, pipe, (void *)tag, f->now);
	return (tag);
}

/* Sends rq with c's envelope (srq_pack). */
static inline uintptr_t
fx_send(struct fx *f, struct srq_cli *c, Cohort__Request *rq, const void *pl,
    size_t plen)
{
	nng_msg *m;

	ck_assert_cohort_ok(srq_pack(c, rq, pl, plen, &m));
	return (fx_raw(f, m, c->pipe));
}

static inline uintptr_t
fx_join(struct fx *f, struct srq_cli *c, int32_t rank, uint32_t world,
    uint32_t timeout_ms)
{
	struct srq q;

	return (fx_send(
	    f, c, srq_join(&q, c, rank, world, -1, timeout_ms), NULL, 0));
}

/* After the rendezvous: take rank and generation from the join reply. */
static inline void
fx_joined(struct fx *f, struct srq_cli *c, uintptr_t tag)
{
	Cohort__Reply *r = fx_want(f, tag, COHORT_OK);

	ck_assert_int_eq(r->body_case, COHORT__REPLY__BODY_JOIN);
	c->rank = r->join->rank;
	c->gen = r->join->generation;
}

/* n clients of job joined at world n (ranks by index). */
static inline void
fx_form(struct fx *f, struct srq_cli *c, int n, const char *job)
{
	uintptr_t t[64];

	ck_assert_int_le(n, 64);
	for (int i = 0; i < n; i++) {
		srq_cli_init(&c[i], job, 100 + (uint64_t)i, 10 + (uint32_t)i);
		t[i] = fx_join(f, &c[i], i, (uint32_t)n, 60000);
	}
	for (int i = 0; i < n; i++)
		fx_joined(f, &c[i], t[i]);
}

static inline uintptr_t fx_coll(struct fx *f, struct srq_cli *c,
    Cohort__Collective *co, uint32_t timeout_ms, const void *pl, size_t plen);

/* Elastic (proto/README.md section 8): a join of a job of min..max
 * ranks. */
static inline uintptr_t
fx_join_el(struct fx *f, struct srq_cli *c, int32_t rank, uint32_t min,
    uint32_t max, uint32_t timeout_ms)
{
	struct srq q;
	Cohort__Request *rq = srq_join(&q, c, rank, max, -1, timeout_ms);

	q.b.join.min_world = min;
	return (fx_send(f, c, rq, NULL, 0));
}

/* n clients of job (ids 100 + i, connections 10 + i, asking for rank i)
 * form an elastic job of min..max ranks: at once when n is max, else
 * after the rendezvous' last call. */
static inline void
fx_form_el(struct fx *f, struct srq_cli *c, int n, const char *job,
    uint32_t min, uint32_t max)
{
	uintptr_t t[64];

	ck_assert_int_le(n, 64);
	for (int i = 0; i < n; i++) {
		srq_cli_init(&c[i], job, 100 + (uint64_t)i, 10 + (uint32_t)i);
		t[i] = fx_join_el(f, &c[i], i, min, max, 60000);
	}
	if ((uint32_t)n < max)
		fx_tick(f, f->core->rdzv_last_call_ms + 100);
	for (int i = 0; i < n; i++)
		fx_joined(f, &c[i], t[i]);
}

/* A step boundary of c (its world group's op_seq). */
static inline uintptr_t
fx_boundary(struct fx *f, struct srq_cli *c, uint64_t op_seq, bool has_state,
    uint32_t timeout_ms)
{
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	co.kind = COHORT__COLLECTIVE_KIND__COLL_BOUNDARY;
	co.op_seq = op_seq;
	co.has_state = has_state;
	return (fx_coll(f, c, &co, timeout_ms, NULL, 0));
}

/* A Reform of c (from its generation). */
static inline uintptr_t
fx_reform(struct fx *f, struct srq_cli *c)
{
	Cohort__Reform rf = COHORT__REFORM__INIT;
	struct srq q;

	return (fx_send(f, c,
	    srq_simple(&q, COHORT__REQUEST__BODY_REFORM, &rf, 0), NULL, 0));
}

/* c's Reform (tag) succeeded: c takes its rank and generation. */
static inline Cohort__JoinReply *
fx_reformed(struct fx *f, struct srq_cli *c, uintptr_t tag)
{
	Cohort__Reply *r = fx_want(f, tag, COHORT_OK);

	ck_assert_int_eq(r->body_case, COHORT__REPLY__BODY_JOIN);
	c->rank = r->join->rank;
	c->gen = r->join->generation;
	return (r->join);
}

static inline uintptr_t
fx_coll(struct fx *f, struct srq_cli *c, Cohort__Collective *co,
    uint32_t timeout_ms, const void *pl, size_t plen)
{
	struct srq q;

	return (fx_send(f, c,
	    srq_simple(&q, COHORT__REQUEST__BODY_COLLECTIVE, co, timeout_ms),
	    pl, plen));
}

static inline uintptr_t
fx_barrier(struct fx *f, struct srq_cli *c, const char *name, uint64_t op_seq,
    uint32_t timeout_ms)
{
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	co.kind = COHORT__COLLECTIVE_KIND__COLL_BARRIER;
	co.name = (char *)name;
	co.op_seq = op_seq;
	return (fx_coll(f, c, &co, timeout_ms, NULL, 0));
}

static inline uintptr_t
fx_kv_set(struct fx *f, struct srq_cli *c, const char *key, const char *val)
{
	struct srq q;

	return (fx_send(f, c, srq_kv_set(&q, key), val, strlen(val)));
}

static inline uintptr_t
fx_kv_get(struct fx *f, struct srq_cli *c, const char *key, bool wait,
    uint32_t timeout_ms)
{
	struct srq q;

	return (fx_send(f, c, srq_kv_get(&q, key, wait, timeout_ms), NULL, 0));
}

/* A request whose body is msg (body names it), with the string pl (NULL:
 * none) as its payload. */
static inline uintptr_t
fx_simple_pl(
    struct fx *f, struct srq_cli *c, int body, void *msg, const char *pl)
{
	struct srq q;

	return (fx_send(f, c, srq_simple(&q, body, msg, 0), pl,
	    pl != NULL ? strlen(pl) : 0));
}

/* seq 0: the client's next. */
static inline uintptr_t
fx_kv_add(struct fx *f, struct srq_cli *c, const char *key, int64_t delta,
    uint64_t seq)
{
	struct srq q;
	Cohort__Request *rq = srq_kv_add(&q, key, delta);

	rq->seq = seq;
	return (fx_send(f, c, rq, NULL, 0));
}

/* An append of val to key. */
static inline uintptr_t
fx_kv_append(struct fx *f, struct srq_cli *c, const char *key, const char *val)
{
	Cohort__KvAppend ap = COHORT__KV_APPEND__INIT;

	ap.key = (char *)key;
	return (fx_simple_pl(f, c, COHORT__REQUEST__BODY_KV_APPEND, &ap, val));
}

static inline uintptr_t
fx_kv_delete(struct fx *f, struct srq_cli *c, const char *key)
{
	Cohort__KvDelete d = COHORT__KV_DELETE__INIT;

	d.key = (char *)key;
	return (fx_simple_pl(f, c, COHORT__REQUEST__BODY_KV_DELETE, &d, NULL));
}

/* A compare-and-set of key: expected exp (NULL: none) if present, else
 * absent; want the new value. */
static inline uintptr_t
fx_kv_cas(struct fx *f, struct srq_cli *c, const char *key, const char *exp,
    bool present, const char *want)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvCompareSet cs = COHORT__KV_COMPARE_SET__INIT;
	char buf[128];
	size_t el = exp ? strlen(exp) : 0, dl = strlen(want);

	ck_assert_uint_le(el + dl, sizeof(buf));
	memcpy(buf, exp ? exp : "", el);
	memcpy(buf + el, want, dl);
	cs.key = (char *)key;
	cs.expected_len = el;
	cs.expected_present = present;
	rq.body_case = COHORT__REQUEST__BODY_KV_COMPARE_SET;
	rq.kv_compare_set = &cs;
	return (fx_send(f, c, &rq, buf, el + dl));
}

/* A multi-set of keys[0..n), their values one after the other in vals
 * (lens: each one's length). */
static inline uintptr_t
fx_kv_multi_set(struct fx *f, struct srq_cli *c, char **keys, uint64_t *lens,
    size_t n, const char *vals)
{
	Cohort__KvMultiSet ms = COHORT__KV_MULTI_SET__INIT;

	ms.n_keys = n;
	ms.keys = keys;
	ms.n_value_lens = n;
	ms.value_lens = lens;
	return (
	    fx_simple_pl(f, c, COHORT__REQUEST__BODY_KV_MULTI_SET, &ms, vals));
}

static inline uintptr_t
fx_simple(
    struct fx *f, struct srq_cli *c, int body, void *msg, uint32_t timeout_ms)
{
	struct srq q;

	return (fx_send(f, c, srq_simple(&q, body, msg, timeout_ms), NULL, 0));
}

/* A Watch from c: answered when its job fails or timeout_ms pass. */
static inline uintptr_t
fx_watch(struct fx *f, struct srq_cli *c, uint32_t timeout_ms)
{
	Cohort__Watch w = COHORT__WATCH__INIT;

	return (fx_simple(f, c, COHORT__REQUEST__BODY_WATCH, &w, timeout_ms));
}

/* A StatusQuery of job ("": every job c may see) from c, answered want;
 * the reply. */
static inline Cohort__Reply *
fx_status(struct fx *f, struct srq_cli *c, const char *job, cohort_status want)
{
	Cohort__StatusQuery sq = COHORT__STATUS_QUERY__INIT;

	sq.job = (char *)job;
	return (fx_want(f,
	    fx_simple(f, c, COHORT__REQUEST__BODY_STATUS_QUERY, &sq, 0),
	    want));
}

/* A ReportFailure of text from c; doing (NULL: none) is what it does. */
static inline uintptr_t
fx_report(struct fx *f, struct srq_cli *c, const char *text,
    Cohort__Heartbeat *doing)
{
	Cohort__ReportFailure rf = COHORT__REPORT_FAILURE__INIT;

	rf.text = (char *)text;
	rf.doing = doing;
	return (fx_simple(f, c, COHORT__REQUEST__BODY_REPORT_FAILURE, &rf, 0));
}

/* A Leave from c. */
static inline uintptr_t
fx_leave(struct fx *f, struct srq_cli *c)
{
	Cohort__Leave lv = COHORT__LEAVE__INIT;

	return (fx_simple(f, c, COHORT__REQUEST__BODY_LEAVE, &lv, 0));
}

/* Creates group `name` of the n global ranks at ranks (c's part). */
static inline uintptr_t
fx_group(struct fx *f, struct srq_cli *c, const char *name, int32_t *ranks,
    size_t n, uint32_t timeout_ms)
{
	struct srq q;

	return (fx_send(
	    f, c, srq_group_create(&q, name, ranks, n, timeout_ms), NULL, 0));
}

static inline bool
fx_payload_is(struct fx *f, uintptr_t tag, const char *s)
{
	struct fx_reply *r = fx_get(f, tag);

	return (r != NULL && r->plen == strlen(s)
	    && memcmp(r->pl, s, r->plen) == 0);
}

static inline uintptr_t
fx_heartbeat(struct fx *f, struct srq_cli *c, const char *op, uint64_t seq,
    const char *group, bool in_op, uint64_t in_op_ms)
{
	struct srq q;

	return (fx_send(f, c,
	    srq_heartbeat(&q, op, seq, group, in_op, in_op_ms), NULL, 0));
}

/* ------------------------------------------------------------------------ */
/* Journal: a core with --state-dir in a fresh temporary directory, and a */
/* restart (the core freed as by kill -9: every record was written when */
/* the entry point returned) on the same directory.                      */
/* ------------------------------------------------------------------------ */

static inline void
fx_open_journal(struct fx *f)
{
	ck_assert_cohort_ok(
	    srq_journal_open(f->core, f->dir, false, f->compact_min, f->now));
}

static inline struct fx *
fx_new_journal(uint64_t compact_min)
{
	struct fx *f = fx_new();

	ck_assert(tmpdir_make(f->dir, sizeof(f->dir), "cohort-jrn"));
	f->compact_min = compact_min;
	fx_open_journal(f);
	return (f);
}

/* The core dies and a new one starts from the state directory (with
 * --recover if recover); returns the journal's status (the core stays,
 * without a journal, if it failed). */
static inline cohort_status
fx_reopen(struct fx *f, bool recover)
{
	struct srv_limits lim = f->core->lim;

	srv_core_free(f->core);
	ck_assert_cohort_ok(
	    srv_core_new(&lim, NULL, fx_sink, f, f->now, &f->core));
	return (srq_journal_open(
	    f->core, f->dir, recover, f->compact_min, f->now));
}

/* fx_reopen, which must succeed. */
static inline void
fx_restart(struct fx *f)
{
	ck_assert_cohort_ok(fx_reopen(f, false));
}

static inline void
fx_free_journal(struct fx *f)
{
	char dir[256];

	memcpy(dir, f->dir, sizeof(dir));
	fx_free(f);
	(void)tmpdir_remove(dir);
}

/* The checked fixture of a test case whose tests run on a journalled core
 * (fx_new_journal(0)) in f. */
static inline void
fx_setup_journal(void)
{
	f = fx_new_journal(0);
}

static inline void
fx_teardown_journal(void)
{
	fx_free_journal(f);
	f = NULL;
}

#endif /* COHORT_SRV_FIXTURE_H */
