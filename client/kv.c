/*
 * kv.c - the job's key-value store at cohortd (TCPStore semantics,
 * proto/README.md section 6). Values travel as the trailing payload: one
 * copy into the request, one copy out of the reply.
 *
 * Keys under COHORT__KV_RESERVED ("__cohort/") are libcohort's own (the
 * data plane's rendezvous, `cohort fault` schedules): the public calls
 * refuse them, so that a program cannot read or overwrite them by
 * accident; libcohort uses them through cohort__kv_set / _get / _add /
 * _delete.
 */
#include <stdlib.h>
#include <string.h>

#include "client.h"

static cohort_status
kv_check_key(const char *key)
{
	size_t n;

	if (key == NULL || (n = strlen(key)) == 0)
		return (cohort__err(COHORT_EINVAL, "empty key"));
	if (n > COHORT__MAX_KEY)
		return (cohort__err(COHORT_EINVAL,
		    "key of %zu bytes exceeds %d", n, COHORT__MAX_KEY));
	return (COHORT_OK);
}

/* A key of the program's (the public calls): not in the reserved space. */
static cohort_status
kv_check_user_key(const char *key)
{
	cohort_status st;

	if ((st = kv_check_key(key)) != COHORT_OK)
		return (st);
	if (strncmp(key, COHORT__KV_RESERVED, strlen(COHORT__KV_RESERVED))
	    == 0)
		return (cohort__err(COHORT_EINVAL,
		    "key '%s': keys beginning with \"" COHORT__KV_RESERVED
		    "\" are reserved for libcohort",
		    key));
	return (COHORT_OK);
}

static cohort_status
kv_check_keys(const char *const *keys, size_t nkeys)
{
	cohort_status st;

	if (nkeys > 0 && keys == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL key list"));
	for (size_t i = 0; i < nkeys; i++)
		if ((st = kv_check_user_key(keys[i])) != COHORT_OK)
			return (st);
	return (COHORT_OK);
}

/* Copies the reply's payload into a malloc'd buffer (never NULL). */
static cohort_status
kv_copy_out(const struct cohort__coord_call *call, void **value, size_t *len)
{
	void *p;

	if ((p = malloc(call->plen > 0 ? call->plen : 1)) == NULL)
		return (cohort__err(COHORT_ENOMEM,
		    "cannot allocate %zu bytes for the value", call->plen));
	if (call->plen > 0)
		memcpy(p, call->payload, call->plen);
	*value = p;
	if (len != NULL)
		*len = call->plen;
	return (COHORT_OK);
}

/* The checks a request on one key starts with (reserved: a key of
 * libcohort's own is allowed). */
static cohort_status
kv_begin(cohort_client *c, const char *key, bool reserved)
{
	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	return (reserved ? kv_check_key(key) : kv_check_user_key(key));
}

/* Runs one KV request on c: req's body set by the caller, the value (if
 * any) as parts. The caller finalises *call whatever it returns. */
static cohort_status
kv_request(cohort_client *c, Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, cohort_duration timeout,
    struct cohort__coord_call *call)
{
	cohort_status st;

	st = cohort__coord_request(c->coord, call, req, parts, nparts,
	    cohort__client_deadline(c, timeout));
	if (st == COHORT_OK && call->rep == NULL)
		st = cohort__err(COHORT_EPROTO, "no reply");
	return (st);
}

/* The reply's body of kind want, after a request that succeeded (*st
 * COHORT_OK); NULL otherwise, and *st EPROTO with missing where the
 * reply lacks it. */
static const void *
kv_body(const struct cohort__coord_call *call, Cohort__Reply__BodyCase want,
    const char *missing, cohort_status *st)
{
	const void *body;

	if (*st != COHORT_OK)
		return (NULL);
	if ((body = cohort__coord_reply_body(call, want)) == NULL)
		*st = cohort__err(COHORT_EPROTO, "%s", missing);
	return (body);
}

/* set and append: a key and the value as trailing payload. */
static cohort_status
kv_put(cohort_client *c, const char *key, const void *value, size_t len,
    bool append, bool reserved, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvSet set = COHORT__KV_SET__INIT;
	Cohort__KvAppend app = COHORT__KV_APPEND__INIT;
	struct cohort__coord_call call;
	struct cohort__iov iov = { value, len };
	cohort_status st;

	if ((st = kv_begin(c, key, reserved)) != COHORT_OK)
		return (st);
	if (len > 0 && value == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL value"));
	if (append) {
		app.key = (char *)key;
		req.body_case = COHORT__REQUEST__BODY_KV_APPEND;
		req.kv_append = &app;
	} else {
		set.key = (char *)key;
		req.body_case = COHORT__REQUEST__BODY_KV_SET;
		req.kv_set = &set;
	}
	st = kv_request(c, &req, &iov, 1, timeout, &call);
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_set(cohort_client *c, const char *key, const void *value, size_t len,
    cohort_duration timeout)
{
	return (kv_put(c, key, value, len, false, false, timeout));
}

cohort_status
cohort__kv_set(struct cohort_client *c, const char *key, const void *value,
    size_t len, cohort_duration timeout)
{
	return (kv_put(c, key, value, len, false, true, timeout));
}

static cohort_status
kv_get(cohort_client *c, const char *key, void **value, size_t *len,
    bool reserved, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvGet body = COHORT__KV_GET__INIT;
	struct cohort__coord_call call;
	const Cohort__KvGetReply *r;
	cohort_status st;
	uint64_t t0;

	if (value == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL output"));
	if ((st = kv_begin(c, key, reserved)) != COHORT_OK)
		return (st);
	body.key = (char *)key;
	body.wait = true;
	req.body_case = COHORT__REQUEST__BODY_KV_GET;
	req.kv_get = &body;
	t0 = cohort__now_ns();
	st = kv_request(c, &req, NULL, 0, timeout, &call);
	/* a get waits for its key: a KV wait on the timeline */
	cohort__obs_event(&c->obs, COHORT__TRACK_KV, "kv", "kv get", t0,
	    cohort__now_ns(), key);
	if (st != COHORT_OK)
		goto out;
	r = cohort__coord_reply_body(&call, COHORT__REPLY__BODY_KV_GET);
	if (r != NULL && !r->found)
		st = cohort__err(
		    COHORT_ETIMEDOUT, "key '%s' did not appear in time", key);
	else
		st = kv_copy_out(&call, value, len);
out:
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_get(cohort_client *c, const char *key, void **value, size_t *len,
    cohort_duration timeout)
{
	return (kv_get(c, key, value, len, false, timeout));
}

cohort_status
cohort__kv_get(struct cohort_client *c, const char *key, void **value,
    size_t *len, cohort_duration timeout)
{
	return (kv_get(c, key, value, len, true, timeout));
}

/* Several keys of libcohort's own in one request that waits until all
 * exist (KvMultiGet with wait): one round trip where one get per key
 * costs one each. vals[i] is malloc'd (free()), lens[i] its length. */
cohort_status
cohort__kv_multi_get(struct cohort_client *c, const char *const *keys,
    size_t nkeys, void **vals, size_t *lens, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvMultiGet body = COHORT__KV_MULTI_GET__INIT;
	struct cohort__coord_call call;
	const Cohort__KvMultiGetReply *r;
	cohort_status st;
	size_t off = 0, i;
	uint64_t t0;

	if (c == NULL || keys == NULL || vals == NULL || lens == NULL
	    || nkeys == 0)
		return (
		    cohort__err(COHORT_EINVAL, "no client, keys or output"));
	for (i = 0; i < nkeys; i++) {
		vals[i] = NULL;
		lens[i] = 0;
		if ((st = kv_check_key(keys[i])) != COHORT_OK)
			return (st);
	}
	body.keys = (char **)keys;
	body.n_keys = nkeys;
	body.wait = true;
	req.body_case = COHORT__REQUEST__BODY_KV_MULTI_GET;
	req.kv_multi_get = &body;
	t0 = cohort__now_ns();
	st = kv_request(c, &req, NULL, 0, timeout, &call);
	cohort__obs_event(&c->obs, COHORT__TRACK_KV, "kv", "kv multi_get", t0,
	    cohort__now_ns(), keys[0]);
	r = kv_body(&call, COHORT__REPLY__BODY_KV_MULTI_GET,
	    "kv multi_get: reply without values", &st);
	if (r != NULL && r->n_value_lens != nkeys)
		st = cohort__err(COHORT_EPROTO,
		    "kv multi_get: %zu values for %zu keys", r->n_value_lens,
		    nkeys);
	for (i = 0; r != NULL && st == COHORT_OK && i < nkeys; i++) {
		if (r->value_lens[i] > call.plen - off) {
			st = cohort__err(COHORT_EPROTO,
			    "kv multi_get: values longer than the payload");
			break;
		}
		lens[i] = (size_t)r->value_lens[i];
		if ((vals[i] = malloc(lens[i] > 0 ? lens[i] : 1)) == NULL) {
			st = cohort__err(COHORT_ENOMEM, "out of memory");
			break;
		}
		if (lens[i] > 0)
			memcpy(vals[i], call.payload + off, lens[i]);
		off += lens[i];
	}
	if (st != COHORT_OK)
		for (i = 0; i < nkeys; i++) {
			free(vals[i]);
			vals[i] = NULL;
		}
	cohort__coord_call_fini(&call);
	return (st);
}

static cohort_status
kv_add(cohort_client *c, const char *key, int64_t delta, int64_t *out,
    bool reserved, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvAdd body = COHORT__KV_ADD__INIT;
	struct cohort__coord_call call;
	const Cohort__KvAddReply *r;
	cohort_status st;

	if ((st = kv_begin(c, key, reserved)) != COHORT_OK)
		return (st);
	body.key = (char *)key;
	body.delta = delta;
	req.body_case = COHORT__REQUEST__BODY_KV_ADD;
	req.kv_add = &body;
	st = kv_request(c, &req, NULL, 0, timeout, &call);
	r = kv_body(&call, COHORT__REPLY__BODY_KV_ADD,
	    "kv add: reply without value", &st);
	if (r != NULL && out != NULL)
		*out = r->value;
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_add(cohort_client *c, const char *key, int64_t delta, int64_t *out,
    cohort_duration timeout)
{
	return (kv_add(c, key, delta, out, false, timeout));
}

cohort_status
cohort__kv_add(struct cohort_client *c, const char *key, int64_t delta,
    int64_t *out, cohort_duration timeout)
{
	return (kv_add(c, key, delta, out, true, timeout));
}

cohort_status
cohort_kv_compare_set(cohort_client *c, const char *key, const void *expected,
    size_t expected_len, const void *desired, size_t desired_len,
    bool *swapped, void **current, size_t *current_len,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvCompareSet body = COHORT__KV_COMPARE_SET__INIT;
	struct cohort__coord_call call;
	struct cohort__iov iov[2];
	const Cohort__KvCompareSetReply *r;
	cohort_status st;

	if ((st = kv_begin(c, key, false)) != COHORT_OK)
		return (st);
	if ((desired == NULL && desired_len > 0)
	    || (expected == NULL && expected_len > 0))
		return (
		    cohort__err(COHORT_EINVAL, "NULL value with a length"));
	body.key = (char *)key;
	body.expected_present = expected != NULL;
	body.expected_len = expected != NULL ? expected_len : 0;
	iov[0].base = expected;
	iov[0].len = body.expected_len;
	iov[1].base = desired;
	iov[1].len = desired_len;
	req.body_case = COHORT__REQUEST__BODY_KV_COMPARE_SET;
	req.kv_compare_set = &body;
	st = kv_request(c, &req, iov, 2, timeout, &call);
	r = kv_body(&call, COHORT__REPLY__BODY_KV_COMPARE_SET,
	    "kv compare_set: reply without result", &st);
	if (r != NULL && current != NULL)
		st = kv_copy_out(&call, current, current_len);
	if (st == COHORT_OK && swapped != NULL)
		*swapped = r->swapped;
	cohort__coord_call_fini(&call);
	return (st);
}

static cohort_status
kv_delete(cohort_client *c, const char *key, bool *deleted, bool reserved,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvDelete body = COHORT__KV_DELETE__INIT;
	struct cohort__coord_call call;
	const Cohort__KvDeleteReply *r;
	cohort_status st;

	if ((st = kv_begin(c, key, reserved)) != COHORT_OK)
		return (st);
	body.key = (char *)key;
	req.body_case = COHORT__REQUEST__BODY_KV_DELETE;
	req.kv_delete = &body;
	if ((st = kv_request(c, &req, NULL, 0, timeout, &call)) == COHORT_OK
	    && deleted != NULL) {
		r = cohort__coord_reply_body(
		    &call, COHORT__REPLY__BODY_KV_DELETE);
		*deleted = r != NULL && r->deleted;
	}
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_delete(
    cohort_client *c, const char *key, bool *deleted, cohort_duration timeout)
{
	return (kv_delete(c, key, deleted, false, timeout));
}

cohort_status
cohort__kv_delete(
    struct cohort_client *c, const char *key, cohort_duration timeout)
{
	return (kv_delete(c, key, NULL, true, timeout));
}

cohort_status
cohort_kv_num_keys(cohort_client *c, int64_t *out, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvNumKeys body = COHORT__KV_NUM_KEYS__INIT;
	struct cohort__coord_call call;
	const Cohort__KvNumKeysReply *r;
	cohort_status st;

	if (c == NULL || out == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client or output"));
	req.body_case = COHORT__REQUEST__BODY_KV_NUM_KEYS;
	req.kv_num_keys = &body;
	st = kv_request(c, &req, NULL, 0, timeout, &call);
	r = kv_body(&call, COHORT__REPLY__BODY_KV_NUM_KEYS,
	    "kv num_keys: reply without count", &st);
	if (r != NULL)
		*out = (int64_t)r->count;
	cohort__coord_call_fini(&call);
	return (st);
}

/* wait and check: a list of keys; kv wait blocks until all are present,
 * kv check tells whether they are (*present). */
static cohort_status
kv_keys(cohort_client *c, const char *const *keys, size_t nkeys, bool *present,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvWait wait = COHORT__KV_WAIT__INIT;
	Cohort__KvCheck check = COHORT__KV_CHECK__INIT;
	struct cohort__coord_call call;
	const Cohort__KvCheckReply *r;
	cohort_status st;
	uint64_t t0;

	if ((st = kv_check_keys(keys, nkeys)) != COHORT_OK)
		return (st);
	if (nkeys == 0) {
		if (present != NULL)
			*present = true;
		return (COHORT_OK);
	}
	if (present != NULL) {
		check.keys = (char **)keys;
		check.n_keys = nkeys;
		req.body_case = COHORT__REQUEST__BODY_KV_CHECK;
		req.kv_check = &check;
	} else {
		wait.keys = (char **)keys;
		wait.n_keys = nkeys;
		req.body_case = COHORT__REQUEST__BODY_KV_WAIT;
		req.kv_wait = &wait;
	}
	t0 = cohort__now_ns();
	st = kv_request(c, &req, NULL, 0, timeout, &call);
	if (present == NULL)
		cohort__obs_event(&c->obs, COHORT__TRACK_KV, "kv", "kv wait",
		    t0, cohort__now_ns(), keys[0]);
	else if ((r = kv_body(&call, COHORT__REPLY__BODY_KV_CHECK,
	              "kv check: reply without result", &st))
	    != NULL)
		*present = r->all_present;
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_wait(cohort_client *c, const char *const *keys, size_t nkeys,
    cohort_duration timeout)
{
	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	return (kv_keys(c, keys, nkeys, NULL, timeout));
}

cohort_status
cohort_kv_check(cohort_client *c, const char *const *keys, size_t nkeys,
    bool *all_present, cohort_duration timeout)
{
	if (c == NULL || all_present == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client or output"));
	return (kv_keys(c, keys, nkeys, all_present, timeout));
}

cohort_status
cohort_kv_append(cohort_client *c, const char *key, const void *value,
    size_t len, cohort_duration timeout)
{
	return (kv_put(c, key, value, len, true, false, timeout));
}
