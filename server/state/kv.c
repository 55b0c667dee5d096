/*
 * kv.c - the per-job key-value store (TCPStore semantics,
 * proto/README.md section 6).
 *
 * A value set with KvSet stays in the request's nng message (no copy);
 * values computed here (add, append, multi_set) get a message of their
 * own. A waiting request (get/multi_get with wait, wait) registers one
 * link per absent key in `waits`; creating a key releases exactly the
 * links of that key, so n ranks waiting on n keys cost O(n) per set.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "journal/log.h"
#include "job.h"
#include "kv.h"

struct srv_kv {
	struct srv_map keys; /* srv_kvent */
	struct srv_map waits; /* srv_kvwait: absent keys someone waits on */
	uint64_t bytes;
	/* The core's totals over all jobs, kept in step. */
	uint64_t *tot_bytes;
	uint64_t *tot_keys;
};

struct srv_kvent {
	struct srv_hnode hn;
	char *key;
	size_t klen;
	nng_msg *msg;
	const uint8_t *val;
	size_t vlen;
};

struct srv_kvwait {
	struct srv_hnode hn;
	char *key;
	struct srv_link waiters; /* srv_kvlink.link */
};

enum kv_waitop { KV_OP_GET, KV_OP_MULTI_GET, KV_OP_WAIT };

struct srv_kv *
srv_kv_new(struct srv_core *core)
{
	struct srv_kv *kv = calloc(1, sizeof(*kv));

	if (kv == NULL)
		return (NULL);
	srv_map_init(&kv->keys);
	srv_map_init(&kv->waits);
	kv->tot_bytes = &core->kv_bytes;
	kv->tot_keys = &core->kv_keys;
	return (kv);
}

/* Every change of kv->bytes and of the number of keys goes through here,
 * so that the core's totals (global limits, RSS trimming) stay exact. */
static void
kv_acct(struct srv_kv *kv, int64_t dbytes, int64_t dkeys)
{
	kv->bytes = (uint64_t)((int64_t)kv->bytes + dbytes);
	if (kv->tot_bytes != NULL)
		*kv->tot_bytes = (uint64_t)((int64_t)*kv->tot_bytes + dbytes);
	if (kv->tot_keys != NULL)
		*kv->tot_keys = (uint64_t)((int64_t)*kv->tot_keys + dkeys);
}

void
srv_kv_free(struct srv_kv *kv)
{
	struct srv_hnode *n, *next;
	size_t i;

	if (kv == NULL)
		return;
	for (n = srv_map_next(&kv->keys, &i, NULL); n != NULL; n = next) {
		struct srv_kvent *e = SRV_CONTAINER(n, struct srv_kvent, hn);
		next = srv_map_next(&kv->keys, &i, n);
		nng_msg_free(e->msg);
		free(e->key);
		free(e);
	}
	/* Waiters were answered with their clients; lists are empty. */
	for (n = srv_map_next(&kv->waits, &i, NULL); n != NULL; n = next) {
		struct srv_kvwait *w = SRV_CONTAINER(n, struct srv_kvwait, hn);
		next = srv_map_next(&kv->waits, &i, n);
		free(w->key);
		free(w);
	}
	kv_acct(kv, -(int64_t)kv->bytes, -(int64_t)kv->keys.n);
	srv_map_fini(&kv->keys);
	srv_map_fini(&kv->waits);
	free(kv);
}

uint64_t
srv_kv_count(const struct srv_kv *kv)
{
	return (kv->keys.n);
}

uint64_t
srv_kv_bytes(const struct srv_kv *kv)
{
	return (kv->bytes);
}

static struct srv_kvent *
kv_find(struct srv_kv *kv, const char *key)
{
	struct srv_hnode *n = srv_map_get(&kv->keys, key, strlen(key));

	return (n ? SRV_CONTAINER(n, struct srv_kvent, hn) : NULL);
}

static bool
kv_key_ok(struct srv_call *c, const char *key)
{
	size_t n = strlen(key);

	if (n == 0 || n > COHORT__MAX_KEY) {
		srv_call_fail(c, COHORT_EINVAL,
		    "key length %zu is out of range 1..%d", n,
		    COHORT__MAX_KEY);
		return (false);
	}
	return (true);
}

/* Checks the limits for storing vlen bytes under key (dvalue: the size
 * change of the job, dkeys: new keys). */
static bool
kv_limits_ok(struct srv_call *c, uint64_t vlen, int64_t dbytes, uint64_t dkeys)
{
	struct srv_kv *kv = c->job->kv;
	const struct srv_limits *lim = &c->core->lim;

	if (vlen > lim->max_value) {
		srv_call_fail(c, COHORT_ETOOBIG,
		    "value of %" PRIu64 " bytes exceeds --max-value-bytes "
		    "%" PRIu64,
		    vlen, lim->max_value);
		return (false);
	}
	if (dbytes > 0 && kv->bytes + (uint64_t)dbytes > lim->max_job_bytes) {
		srv_call_fail(c, COHORT_ETOOBIG,
		    "job '%s' would hold %" PRIu64 " bytes of keys and "
		    "values, over --max-job-bytes %" PRIu64,
		    c->job->name, kv->bytes + (uint64_t)dbytes,
		    lim->max_job_bytes);
		return (false);
	}
	if (dkeys > 0 && kv->keys.n + dkeys > lim->max_keys) {
		srv_call_fail(c, COHORT_ETOOBIG,
		    "job '%s' would hold %" PRIu64 " keys, over --max-keys "
		    "%" PRIu64,
		    c->job->name, (uint64_t)kv->keys.n + dkeys, lim->max_keys);
		return (false);
	}
	if (dbytes > 0 && lim->max_total_bytes != 0
	    && c->core->kv_bytes + (uint64_t)dbytes > lim->max_total_bytes) {
		c->core->m.limit_refusals++;
		srv_call_fail(c, COHORT_ETOOBIG,
		    "cohortd would hold %" PRIu64 " bytes of keys and values "
		    "over all jobs, over --max-total-bytes %" PRIu64,
		    c->core->kv_bytes + (uint64_t)dbytes,
		    lim->max_total_bytes);
		return (false);
	}
	if (dkeys > 0 && lim->max_total_keys != 0
	    && c->core->kv_keys + dkeys > lim->max_total_keys) {
		c->core->m.limit_refusals++;
		srv_call_fail(c, COHORT_ETOOBIG,
		    "cohortd would hold %" PRIu64 " keys over all jobs, over "
		    "--max-total-keys %" PRIu64,
		    c->core->kv_keys + dkeys, lim->max_total_keys);
		return (false);
	}
	return (true);
}

static void kv_notify(struct srv_job *job, const char *key);

/* Stores (msg, val, vlen) under key, taking msg. Limits checked before. */
static cohort_status
kv_put(struct srv_job *job, const char *key, nng_msg *msg, const uint8_t *val,
    size_t vlen)
{
	struct srv_kv *kv = job->kv;
	struct srv_kvent *e = kv_find(kv, key);

	if (e != NULL) {
		kv_acct(kv, (int64_t)vlen - (int64_t)e->vlen, 0);
		nng_msg_free(e->msg);
		e->msg = msg;
		e->val = val;
		e->vlen = vlen;
		return (COHORT_OK);
	}
	if ((e = calloc(1, sizeof(*e))) == NULL)
		return (COHORT_ENOMEM);
	e->klen = strlen(key);
	if ((e->key = srv_strdup(key)) == NULL
	    || srv_map_put(&kv->keys, &e->hn, e->key, e->klen) != COHORT_OK) {
		free(e->key);
		free(e);
		return (COHORT_ENOMEM);
	}
	e->msg = msg;
	e->val = val;
	e->vlen = vlen;
	kv_acct(kv, (int64_t)(e->klen + vlen), 1);
	kv_notify(job, key);
	return (COHORT_OK);
}

/* A copy of bytes in a message of its own. */
static nng_msg *
kv_copy(const void *a, size_t alen, const void *b, size_t blen)
{
	nng_msg *m;

	if (nng_msg_alloc(&m, alen + blen) != 0)
		return (NULL);
	if (alen > 0)
		memcpy(nng_msg_body(m), a, alen);
	if (blen > 0)
		memcpy((uint8_t *)nng_msg_body(m) + alen, b, blen);
	return (m);
}

static int64_t
kv_delta(struct srv_kv *kv, const char *key, size_t vlen, uint64_t *newkeys)
{
	struct srv_kvent *e = kv_find(kv, key);

	if (e != NULL)
		return ((int64_t)vlen - (int64_t)e->vlen);
	(*newkeys)++;
	return ((int64_t)(strlen(key) + vlen));
}

static void
kv_reply(struct srv_call *c, Cohort__Reply *rep, const void *p, size_t len)
{
	struct cohort__iov part = { p, len };

	srv_call_answer(c, rep, &part, len ? 1 : 0);
}

/* ------------------------------------------------------------------------ */
/* Waiting                                                                  */
/* ------------------------------------------------------------------------ */

static void
kv_unlink(struct srv_job *job, struct srv_call *c, size_t i)
{
	struct srv_kvlink *l = &c->kvl[i];
	struct srv_hnode *n;

	if (l->link.next == &l->link)
		return;
	srv_list_remove(&l->link);
	n = srv_map_get(&job->kv->waits, c->keys[i], strlen(c->keys[i]));
	if (n != NULL) {
		struct srv_kvwait *w = SRV_CONTAINER(n, struct srv_kvwait, hn);
		if (srv_list_empty(&w->waiters)) {
			srv_map_del(&job->kv->waits, &w->hn);
			free(w->key);
			free(w);
		}
	}
}

static void
kv_withdraw(struct srv_call *c)
{
	for (size_t i = 0; i < c->nkeys; i++)
		kv_unlink(c->job, c, i);
}

/* Links c to every absent key; returns how many are absent (-1: ENOMEM). */
static long
kv_register(struct srv_call *c)
{
	struct srv_kv *kv = c->job->kv;
	long missing = 0;

	for (size_t i = 0; i < c->nkeys; i++) {
		struct srv_kvlink *l = &c->kvl[i];
		struct srv_hnode *n;
		struct srv_kvwait *w;
		if (kv_find(kv, c->keys[i]) != NULL
		    || l->link.next != &l->link)
			continue;
		n = srv_map_get(&kv->waits, c->keys[i], strlen(c->keys[i]));
		if (n != NULL) {
			w = SRV_CONTAINER(n, struct srv_kvwait, hn);
		} else {
			if ((w = calloc(1, sizeof(*w))) == NULL)
				return (-1);
			srv_list_init(&w->waiters);
			if ((w->key = srv_strdup(c->keys[i])) == NULL
			    || srv_map_put(
			           &kv->waits, &w->hn, w->key, strlen(w->key))
			        != COHORT_OK) {
				free(w->key);
				free(w);
				return (-1);
			}
		}
		srv_list_append(&w->waiters, &l->link);
		missing++;
	}
	c->nmissing = (size_t)missing;
	return (missing);
}

static void kv_answer_values(struct srv_call *c, int op);

static void
kv_notify(struct srv_job *job, const char *key)
{
	struct srv_hnode *n = srv_map_get(&job->kv->waits, key, strlen(key));
	struct srv_kvwait *w;
	size_t budget;

	if (n == NULL)
		return;
	w = SRV_CONTAINER(n, struct srv_kvwait, hn);
	srv_map_del(&job->kv->waits, &w->hn);
	budget = job->core->nparked + 1;
	while (!srv_list_empty(&w->waiters) && budget-- > 0) {
		struct srv_kvlink *l
		    = SRV_CONTAINER(w->waiters.next, struct srv_kvlink, link);
		struct srv_call *c = l->call;
		srv_list_remove(&l->link);
		if (--c->nmissing > 0)
			continue;
		/* All there now; answer (a key deleted meanwhile re-parks
		 * through kv_answer_values). */
		kv_answer_values(c, (int)c->world);
	}
	free(w->key);
	free(w);
}

/* Answers a waiting (or immediate) get / multi_get / wait whose keys are
 * all present. c->world carries the op. */
static void
kv_answer_values(struct srv_call *c, int op)
{
	struct srv_kv *kv = c->job->kv;
	Cohort__Reply rep;
	long miss;

	for (size_t i = 0; i < c->nkeys; i++) {
		if (kv_find(kv, c->keys[i]) != NULL)
			continue;
		/* Deleted again before we could answer: wait on. */
		if ((miss = kv_register(c)) < 0) {
			srv_call_withdraw(c, 0);
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		}
		return;
	}
	srv_call_withdraw(c, 0);
	srv_reply_init(&rep, c, COHORT_OK);
	if (op == KV_OP_GET) {
		Cohort__KvGetReply gr;
		struct srv_kvent *e = kv_find(kv, c->keys[0]);
		cohort__kv_get_reply__init(&gr);
		gr.found = true;
		rep.body_case = COHORT__REPLY__BODY_KV_GET;
		rep.kv_get = &gr;
		kv_reply(c, &rep, e->val, e->vlen);
	} else if (op == KV_OP_MULTI_GET) {
		Cohort__KvMultiGetReply mr;
		struct cohort__iov *parts = malloc(sizeof(*parts) * c->nkeys);
		uint64_t *lens = malloc(sizeof(uint64_t) * c->nkeys);
		if (parts == NULL || lens == NULL) {
			free(parts);
			free(lens);
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return;
		}
		for (size_t i = 0; i < c->nkeys; i++) {
			struct srv_kvent *e = kv_find(kv, c->keys[i]);
			parts[i].base = e->val;
			parts[i].len = e->vlen;
			lens[i] = e->vlen;
		}
		cohort__kv_multi_get_reply__init(&mr);
		mr.n_value_lens = c->nkeys;
		mr.value_lens = lens;
		rep.body_case = COHORT__REPLY__BODY_KV_MULTI_GET;
		rep.kv_multi_get = &mr;
		srv_call_answer(c, &rep, parts, c->nkeys);
		free(parts);
		free(lens);
	} else {
		srv_call_answer(c, &rep, NULL, 0);
	}
}

static void
kv_expire(struct srv_call *c, cohort__time now)
{
	struct srv_kv *kv = c->job->kv;
	char buf[1400], secs[32];
	size_t off = 0;

	srv_fmt_secs(secs, sizeof(secs), now - c->start);
	cohort__appendf(buf, sizeof(buf), &off, "wait for key%s ",
	    c->nkeys == 1 ? "" : "s");
	for (size_t i = 0; i < c->nkeys && i < 8; i++)
		cohort__appendf(buf, sizeof(buf), &off, "%s'%.100s'",
		    i ? ", " : "", c->keys[i]);
	if (c->nkeys > 8)
		cohort__appendf(
		    buf, sizeof(buf), &off, " and %zu more", c->nkeys - 8);
	cohort__appendf(
	    buf, sizeof(buf), &off, " timed out after %s; absent:", secs);
	for (size_t i = 0, k = 0; i < c->nkeys; i++) {
		if (kv_find(kv, c->keys[i]) != NULL)
			continue;
		if (k++ == 8) {
			cohort__appendf(buf, sizeof(buf), &off, " ...");
			break;
		}
		cohort__appendf(
		    buf, sizeof(buf), &off, " '%.100s'", c->keys[i]);
	}
	srv_call_withdraw(c, now);
	srv_call_fail(c, COHORT_ETIMEDOUT, "%s", buf);
}

/* A wait sits in the waiter list of every absent key. */
static const struct srv_park_ops kv_park
    = { SRV_PARK_KV, kv_withdraw, kv_expire, NULL, NULL };

/* get(wait) / multi_get / wait: answer now or park. */
static void
kv_wait_keys(
    struct srv_call *c, char *const *keys, size_t nkeys, int op, bool wait)
{
	long miss;

	if (nkeys == 0 || nkeys > c->core->lim.max_keys) {
		srv_call_fail(c, COHORT_EINVAL, "%zu keys given", nkeys);
		return;
	}
	for (size_t i = 0; i < nkeys; i++)
		if (!kv_key_ok(c, keys[i]))
			return;
	c->keys = calloc(nkeys, sizeof(char *));
	c->kvl = calloc(nkeys, sizeof(*c->kvl));
	if (c->keys == NULL || c->kvl == NULL)
		goto out_nomem;
	c->nkeys = nkeys;
	c->world = (uint32_t)op;
	for (size_t i = 0; i < nkeys; i++) {
		if ((c->keys[i] = srv_strdup(keys[i])) == NULL)
			goto out_nomem;
		srv_list_init(&c->kvl[i].link);
		c->kvl[i].call = c;
	}
	if (!wait) {
		struct srv_kv *kv = c->job->kv;
		for (size_t i = 0; i < nkeys; i++) {
			if (kv_find(kv, keys[i]) != NULL)
				continue;
			if (op == KV_OP_GET) {
				Cohort__Reply rep;
				Cohort__KvGetReply gr;
				srv_reply_init(&rep, c, COHORT_OK);
				cohort__kv_get_reply__init(&gr);
				rep.body_case = COHORT__REPLY__BODY_KV_GET;
				rep.kv_get = &gr;
				srv_call_answer(c, &rep, NULL, 0);
				return;
			}
			srv_call_fail(c, COHORT_ENOENT,
			    "key '%s' does not exist", keys[i]);
			return;
		}
		kv_answer_values(c, op);
		return;
	}
	if ((miss = kv_register(c)) < 0) {
		kv_withdraw(c);
		goto out_nomem;
	}
	if (miss == 0) {
		kv_answer_values(c, op);
		return;
	}
	srv_call_park(c, &kv_park);
	return;

out_nomem:
	srv_call_fail(c, COHORT_ENOMEM, "out of memory");
}

/* ------------------------------------------------------------------------ */
/* Operations                                                               */
/* ------------------------------------------------------------------------ */

void
srv_kv_set(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const char *key = req->kv_set->key;
	uint64_t nk = 0;
	int64_t d;

	(void)now;
	if (!kv_key_ok(c, key))
		return;
	d = kv_delta(c->job->kv, key, c->plen, &nk);
	if (!kv_limits_ok(c, c->plen, d, nk))
		return;
	if (kv_put(c->job, key, c->msg, c->payload, c->plen) != COHORT_OK) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	c->msg = NULL;
	srv_jrn_kv_put(c->core->jrn, &c->job->jr, key, c->payload, c->plen);
	srv_call_fail(c, COHORT_OK, "%s", "");
}

/* Answers c OK with the reply of an add (value), a check (flag: all
 * present) or a delete (flag: deleted). */
static void
kv_answer(
    struct srv_call *c, Cohort__Reply__BodyCase bc, int64_t value, bool flag)
{
	Cohort__Reply rep;
	Cohort__KvAddReply ar = COHORT__KV_ADD_REPLY__INIT;
	Cohort__KvCheckReply cr = COHORT__KV_CHECK_REPLY__INIT;
	Cohort__KvDeleteReply dr = COHORT__KV_DELETE_REPLY__INIT;

	srv_reply_init(&rep, c, COHORT_OK);
	rep.body_case = bc;
	ar.value = value;
	cr.all_present = flag;
	dr.deleted = flag;
	if (bc == COHORT__REPLY__BODY_KV_ADD)
		rep.kv_add = &ar;
	else if (bc == COHORT__REPLY__BODY_KV_CHECK)
		rep.kv_check = &cr;
	else
		rep.kv_delete = &dr;
	srv_call_answer(c, &rep, NULL, 0);
}

/* Stores a copy of a (alen bytes) followed by b (blen) as key's value,
 * within the limits: false after answering c. */
static bool
kv_put_copy(struct srv_call *c, const char *key, const void *a, size_t alen,
    const void *b, size_t blen)
{
	size_t n = alen + blen;
	uint64_t nk = 0;
	nng_msg *m;

	if (!kv_limits_ok(c, n, kv_delta(c->job->kv, key, n, &nk), nk))
		return (false);
	if ((m = kv_copy(a, alen, b, blen)) == NULL
	    || kv_put(c->job, key, m, nng_msg_body(m), n) != COHORT_OK) {
		if (m != NULL)
			nng_msg_free(m);
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return (false);
	}
	return (true);
}

void
srv_kv_add(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const Cohort__KvAdd *a = req->kv_add;
	struct srv_kvent *e;
	int64_t cur = 0, val;
	char num[32];
	int n;

	if (!kv_key_ok(c, a->key))
		return;
	if ((e = kv_find(c->job->kv, a->key)) != NULL) {
		if (e->vlen == 0 || e->vlen >= sizeof(num)) {
			srv_call_fail(c, COHORT_EINVAL,
			    "value of key '%s' is not a decimal integer",
			    a->key);
			return;
		}
		memcpy(num, e->val, e->vlen);
		num[e->vlen] = '\0';
		if (!cohort__parse_i64(num, &cur)) {
			srv_call_fail(c, COHORT_EINVAL,
			    "value of key '%s' is not a decimal integer",
			    a->key);
			return;
		}
	}
	if (__builtin_add_overflow(cur, a->delta, &val)) {
		srv_call_fail(c, COHORT_EINVAL,
		    "adding %" PRId64 " to key '%s' (%" PRId64 ") overflows",
		    a->delta, a->key, cur);
		return;
	}
	n = snprintf(num, sizeof(num), "%" PRId64, val);
	if (!kv_put_copy(c, a->key, num, (size_t)n, NULL, 0))
		return;
	srv_jrn_kv_put(c->core->jrn, &c->job->jr, a->key, num, (size_t)n);
	kv_answer(c, COHORT__REPLY__BODY_KV_ADD, val, false);
}

void
srv_kv_compare_set(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const Cohort__KvCompareSet *cs = req->kv_compare_set;
	struct srv_kv *kv = c->job->kv;
	struct srv_kvent *e;
	size_t elen = (size_t)cs->expected_len, dlen;
	bool swap;
	uint64_t nk = 0;
	Cohort__Reply rep;
	Cohort__KvCompareSetReply cr;

	if (!kv_key_ok(c, cs->key))
		return;
	if (cs->expected_len > c->plen) {
		srv_call_fail(c, COHORT_EINVAL,
		    "expected_len %" PRIu64 " exceeds the %zu payload bytes",
		    cs->expected_len, c->plen);
		return;
	}
	dlen = c->plen - elen;
	e = kv_find(kv, cs->key);
	if (!cs->expected_present)
		swap = (e == NULL);
	else
		swap = e != NULL && e->vlen == elen
		    && (elen == 0 || memcmp(e->val, c->payload, elen) == 0);
	if (swap) {
		if (!kv_limits_ok(
		        c, dlen, kv_delta(kv, cs->key, dlen, &nk), nk))
			return;
		if (kv_put(c->job, cs->key, c->msg, c->payload + elen, dlen)
		    != COHORT_OK) {
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return;
		}
		c->msg = NULL;
		srv_jrn_kv_put(c->core->jrn, &c->job->jr, cs->key,
		    c->payload + elen, dlen);
		e = kv_find(kv, cs->key);
	}
	srv_reply_init(&rep, c, COHORT_OK);
	cohort__kv_compare_set_reply__init(&cr);
	cr.swapped = swap;
	rep.body_case = COHORT__REPLY__BODY_KV_COMPARE_SET;
	rep.kv_compare_set = &cr;
	if (e != NULL)
		kv_reply(c, &rep, e->val, e->vlen);
	else
		kv_reply(c, &rep, NULL, 0);
}

void
srv_kv_delete(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const char *key = req->kv_delete->key;
	struct srv_kv *kv = c->job->kv;
	struct srv_kvent *e;

	if (!kv_key_ok(c, key))
		return;
	if ((e = kv_find(kv, key)) != NULL) {
		srv_map_del(&kv->keys, &e->hn);
		kv_acct(kv, -(int64_t)(e->klen + e->vlen), -1);
		nng_msg_free(e->msg);
		free(e->key);
		free(e);
		srv_jrn_kv_del(c->core->jrn, &c->job->jr, key);
	}
	kv_answer(c, COHORT__REPLY__BODY_KV_DELETE, 0, e != NULL);
}

void
srv_kv_append(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const char *key = req->kv_append->key;
	struct srv_kvent *e;

	if (!kv_key_ok(c, key))
		return;
	e = kv_find(c->job->kv, key);
	if (!kv_put_copy(c, key, e ? e->val : NULL, e ? e->vlen : 0,
	        c->payload, c->plen))
		return;
	srv_jrn_kv_append(c->core->jrn, &c->job->jr, key, c->payload, c->plen);
	srv_call_fail(c, COHORT_OK, "%s", "");
}

void
srv_kv_multi_set(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const Cohort__KvMultiSet *ms = req->kv_multi_set;
	struct srv_kv *kv = c->job->kv;
	uint64_t total = 0, nk = 0;
	int64_t d = 0;
	size_t off = 0;

	if (ms->n_keys == 0 || ms->n_keys != ms->n_value_lens) {
		srv_call_fail(c, COHORT_EINVAL,
		    "multi_set has %zu keys and %zu value lengths", ms->n_keys,
		    ms->n_value_lens);
		return;
	}
	for (size_t i = 0; i < ms->n_keys; i++) {
		if (!kv_key_ok(c, ms->keys[i]))
			return;
		if (ms->value_lens[i] > c->plen - total
		    || ms->value_lens[i] > c->plen) {
			srv_call_fail(c, COHORT_EINVAL,
			    "multi_set value lengths exceed the %zu payload "
			    "bytes",
			    c->plen);
			return;
		}
		total += ms->value_lens[i];
		if (ms->value_lens[i] > c->core->lim.max_value) {
			(void)kv_limits_ok(c, ms->value_lens[i], 0, 0);
			return;
		}
		d += kv_delta(kv, ms->keys[i], ms->value_lens[i], &nk);
	}
	if (total != c->plen) {
		srv_call_fail(c, COHORT_EINVAL,
		    "multi_set value lengths sum to %" PRIu64
		    ", the payload has %zu bytes",
		    total, c->plen);
		return;
	}
	if (!kv_limits_ok(c, 0, d, nk))
		return;
	for (size_t i = 0; i < ms->n_keys; i++) {
		size_t l = (size_t)ms->value_lens[i];
		nng_msg *m = kv_copy(c->payload + off, l, NULL, 0);
		off += l;
		if (m == NULL
		    || kv_put(c->job, ms->keys[i], m, nng_msg_body(m), l)
		        != COHORT_OK) {
			if (m != NULL)
				nng_msg_free(m);
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return;
		}
		srv_jrn_kv_put(c->core->jrn, &c->job->jr, ms->keys[i],
		    c->payload + off - l, l);
	}
	srv_call_fail(c, COHORT_OK, "%s", "");
}

void
srv_kv_get(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	char *k = req->kv_get->key;

	(void)now;
	kv_wait_keys(c, &k, 1, KV_OP_GET, req->kv_get->wait);
}

void
srv_kv_multi_get(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	(void)now;
	kv_wait_keys(c, req->kv_multi_get->keys, req->kv_multi_get->n_keys,
	    KV_OP_MULTI_GET, req->kv_multi_get->wait);
}

void
srv_kv_wait(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	(void)now;
	kv_wait_keys(
	    c, req->kv_wait->keys, req->kv_wait->n_keys, KV_OP_WAIT, true);
}

void
srv_kv_num_keys(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	Cohort__Reply rep;
	Cohort__KvNumKeysReply nr;

	(void)req;
	(void)now;
	srv_reply_init(&rep, c, COHORT_OK);
	cohort__kv_num_keys_reply__init(&nr);
	nr.count = c->job->kv->keys.n;
	rep.body_case = COHORT__REPLY__BODY_KV_NUM_KEYS;
	rep.kv_num_keys = &nr;
	srv_call_answer(c, &rep, NULL, 0);
}

void
srv_kv_check(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	bool all = true;

	(void)now;
	for (size_t i = 0; i < req->kv_check->n_keys; i++) {
		if (!kv_key_ok(c, req->kv_check->keys[i]))
			return;
		if (kv_find(c->job->kv, req->kv_check->keys[i]) == NULL)
			all = false;
	}
	kv_answer(c, COHORT__REPLY__BODY_KV_CHECK, 0, all);
}

/* ------------------------------------------------------------------------ */
/* Journal replay and snapshot                                              */
/* ------------------------------------------------------------------------ */

cohort_status
srv_kv_restore(struct srv_job *job, const char *key, const void *val,
    size_t vlen, bool append)
{
	struct srv_kvent *e = append ? kv_find(job->kv, key) : NULL;
	size_t old = e != NULL ? e->vlen : 0;
	nng_msg *m = kv_copy(e != NULL ? e->val : NULL, old, val, vlen);

	if (m == NULL)
		return (COHORT_ENOMEM);
	if (kv_put(job, key, m, nng_msg_body(m), old + vlen) != COHORT_OK) {
		nng_msg_free(m);
		return (COHORT_ENOMEM);
	}
	return (COHORT_OK);
}

void
srv_kv_restore_del(struct srv_job *job, const char *key)
{
	struct srv_kv *kv = job->kv;
	struct srv_kvent *e = kv_find(kv, key);

	if (e == NULL)
		return;
	srv_map_del(&kv->keys, &e->hn);
	kv_acct(kv, -(int64_t)(e->klen + e->vlen), -1);
	nng_msg_free(e->msg);
	free(e->key);
	free(e);
}

bool
srv_kv_peek(struct srv_kv *kv, const char *key, const void **val, size_t *vlen)
{
	struct srv_kvent *e = kv_find(kv, key);

	if (e == NULL)
		return (false);
	if (val != NULL)
		*val = e->val;
	if (vlen != NULL)
		*vlen = e->vlen;
	return (true);
}

void
srv_kv_foreach(struct srv_kv *kv,
    void (*fn)(void *arg, const char *key, const void *val, size_t vlen),
    void *arg)
{
	struct srv_hnode *n;
	size_t i;

	for (n = srv_map_next(&kv->keys, &i, NULL); n != NULL;
	     n = srv_map_next(&kv->keys, &i, n)) {
		struct srv_kvent *e = SRV_CONTAINER(n, struct srv_kvent, hn);
		fn(arg, e->key, e->val, e->vlen);
	}
}
