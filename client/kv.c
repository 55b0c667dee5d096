/*
 * kv.c - the job's key-value store at cohortd (TCPStore semantics,
 * proto/README.md section 6). Values travel as the trailing payload: one
 * copy into the request, one copy out of the reply.
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

static cohort_status
kv_check_keys(const char *const *keys, size_t nkeys)
{
	cohort_status st;

	if (nkeys > 0 && keys == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL key list"));
	for (size_t i = 0; i < nkeys; i++)
		if ((st = kv_check_key(keys[i])) != COHORT_OK)
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

/* Runs one KV request on c. */
static cohort_status
kv_call(cohort_client *c, struct cohort__coord_call *call)
{
	cohort_status st;

	st = cohort__coord_call(c->coord, call);
	if (st == COHORT_OK && call->rep == NULL)
		st = cohort__err(COHORT_EPROTO, "no reply");
	return (st);
}

/* set and append: a key and the value as trailing payload. */
static cohort_status
kv_put(cohort_client *c, const char *key, const void *value, size_t len,
    bool append, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvSet set = COHORT__KV_SET__INIT;
	Cohort__KvAppend app = COHORT__KV_APPEND__INIT;
	struct cohort__coord_call call;
	struct cohort__iov iov = { value, len };
	cohort_status st;

	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if ((st = kv_check_key(key)) != COHORT_OK)
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
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	call.parts = &iov;
	call.nparts = 1;
	st = kv_call(c, &call);
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_set(cohort_client *c, const char *key, const void *value, size_t len,
    cohort_duration timeout)
{
	return (kv_put(c, key, value, len, false, timeout));
}

cohort_status
cohort_kv_get(cohort_client *c, const char *key, void **value, size_t *len,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvGet body = COHORT__KV_GET__INIT;
	struct cohort__coord_call call;
	cohort_status st;
	uint64_t t0;

	if (c == NULL || value == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client or output"));
	if ((st = kv_check_key(key)) != COHORT_OK)
		return (st);
	body.key = (char *)key;
	body.wait = true;
	req.body_case = COHORT__REQUEST__BODY_KV_GET;
	req.kv_get = &body;
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	t0 = cohort__now_ns();
	st = kv_call(c, &call);
	/* a get waits for its key: a KV wait on the timeline */
	cohort__obs_event(&c->obs, COHORT__TRACK_KV, "kv", "kv get", t0,
	    cohort__now_ns(), key);
	if (st != COHORT_OK)
		goto out;
	if (call.rep->body_case == COHORT__REPLY__BODY_KV_GET
	    && call.rep->kv_get != NULL && !call.rep->kv_get->found) {
		st = cohort__err(
		    COHORT_ETIMEDOUT, "key '%s' did not appear in time", key);
		goto out;
	}
	st = kv_copy_out(&call, value, len);
out:
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_add(cohort_client *c, const char *key, int64_t delta, int64_t *out,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvAdd body = COHORT__KV_ADD__INIT;
	struct cohort__coord_call call;
	cohort_status st;

	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if ((st = kv_check_key(key)) != COHORT_OK)
		return (st);
	body.key = (char *)key;
	body.delta = delta;
	req.body_case = COHORT__REQUEST__BODY_KV_ADD;
	req.kv_add = &body;
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	if ((st = kv_call(c, &call)) != COHORT_OK)
		goto out;
	if (call.rep->body_case != COHORT__REPLY__BODY_KV_ADD
	    || call.rep->kv_add == NULL) {
		st = cohort__err(COHORT_EPROTO, "kv add: reply without value");
		goto out;
	}
	if (out != NULL)
		*out = call.rep->kv_add->value;
out:
	cohort__coord_call_fini(&call);
	return (st);
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
	cohort_status st;

	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if ((st = kv_check_key(key)) != COHORT_OK)
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
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	call.parts = iov;
	call.nparts = 2;
	if ((st = kv_call(c, &call)) != COHORT_OK)
		goto out;
	if (call.rep->body_case != COHORT__REPLY__BODY_KV_COMPARE_SET
	    || call.rep->kv_compare_set == NULL) {
		st = cohort__err(
		    COHORT_EPROTO, "kv compare_set: reply without result");
		goto out;
	}
	if (current != NULL
	    && (st = kv_copy_out(&call, current, current_len)) != COHORT_OK)
		goto out;
	if (swapped != NULL)
		*swapped = call.rep->kv_compare_set->swapped;
out:
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_delete(
    cohort_client *c, const char *key, bool *deleted, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvDelete body = COHORT__KV_DELETE__INIT;
	struct cohort__coord_call call;
	cohort_status st;

	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if ((st = kv_check_key(key)) != COHORT_OK)
		return (st);
	body.key = (char *)key;
	req.body_case = COHORT__REQUEST__BODY_KV_DELETE;
	req.kv_delete = &body;
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	if ((st = kv_call(c, &call)) == COHORT_OK && deleted != NULL)
		*deleted = call.rep->body_case == COHORT__REPLY__BODY_KV_DELETE
		    && call.rep->kv_delete != NULL
		    && call.rep->kv_delete->deleted;
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_num_keys(cohort_client *c, int64_t *out, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvNumKeys body = COHORT__KV_NUM_KEYS__INIT;
	struct cohort__coord_call call;
	cohort_status st;

	if (c == NULL || out == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client or output"));
	req.body_case = COHORT__REQUEST__BODY_KV_NUM_KEYS;
	req.kv_num_keys = &body;
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	if ((st = kv_call(c, &call)) != COHORT_OK)
		goto out;
	if (call.rep->body_case != COHORT__REPLY__BODY_KV_NUM_KEYS
	    || call.rep->kv_num_keys == NULL) {
		st = cohort__err(COHORT_EPROTO,
		    "kv num_keys: reply without "
		    "count");
		goto out;
	}
	*out = (int64_t)call.rep->kv_num_keys->count;
out:
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_wait(cohort_client *c, const char *const *keys, size_t nkeys,
    cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvWait body = COHORT__KV_WAIT__INIT;
	struct cohort__coord_call call;
	cohort_status st;
	uint64_t t0;

	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if ((st = kv_check_keys(keys, nkeys)) != COHORT_OK)
		return (st);
	if (nkeys == 0)
		return (COHORT_OK);
	body.keys = (char **)keys;
	body.n_keys = nkeys;
	req.body_case = COHORT__REQUEST__BODY_KV_WAIT;
	req.kv_wait = &body;
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	t0 = cohort__now_ns();
	st = kv_call(c, &call);
	cohort__obs_event(&c->obs, COHORT__TRACK_KV, "kv", "kv wait", t0,
	    cohort__now_ns(), keys[0]);
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_check(cohort_client *c, const char *const *keys, size_t nkeys,
    bool *all_present, cohort_duration timeout)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvCheck body = COHORT__KV_CHECK__INIT;
	struct cohort__coord_call call;
	cohort_status st;

	if (c == NULL || all_present == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client or output"));
	if ((st = kv_check_keys(keys, nkeys)) != COHORT_OK)
		return (st);
	if (nkeys == 0) {
		*all_present = true;
		return (COHORT_OK);
	}
	body.keys = (char **)keys;
	body.n_keys = nkeys;
	req.body_case = COHORT__REQUEST__BODY_KV_CHECK;
	req.kv_check = &body;
	cohort__coord_call_init(
	    &call, &req, cohort__client_deadline(c, timeout));
	if ((st = kv_call(c, &call)) != COHORT_OK)
		goto out;
	if (call.rep->body_case != COHORT__REPLY__BODY_KV_CHECK
	    || call.rep->kv_check == NULL) {
		st = cohort__err(COHORT_EPROTO,
		    "kv check: reply without "
		    "result");
		goto out;
	}
	*all_present = call.rep->kv_check->all_present;
out:
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_kv_append(cohort_client *c, const char *key, const void *value,
    size_t len, cohort_duration timeout)
{
	return (kv_put(c, key, value, len, true, timeout));
}
