/*
 * test_srv_kv.c - cohortd's key-value store without sockets: every op,
 * waits released by set and timing out, limits, idempotent retries.
 */
#include <stdio.h>
#include <string.h>

#include "srv_fixture.h"
#include "unit_suite.h"

Suite *suite_srv_kv(void);

static struct srq_cli kv_c[2];

static struct fx *
kv_setup(void)
{
	struct fx *f = fx_new_limits(64, 4096, 20);

	fx_form(f, kv_c, 2, "j");
	return (f);
}

static uintptr_t
kv_keys(struct fx *f, struct srq_cli *c, int body, char **keys, size_t n,
    bool wait, uint32_t timeout_ms)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvWait w = COHORT__KV_WAIT__INIT;
	Cohort__KvCheck ck = COHORT__KV_CHECK__INIT;
	Cohort__KvMultiGet mg = COHORT__KV_MULTI_GET__INIT;

	rq.body_case = body;
	rq.timeout_ms = timeout_ms;
	if (body == COHORT__REQUEST__BODY_KV_WAIT) {
		w.n_keys = n;
		w.keys = keys;
		rq.kv_wait = &w;
	} else if (body == COHORT__REQUEST__BODY_KV_CHECK) {
		ck.n_keys = n;
		ck.keys = keys;
		rq.kv_check = &ck;
	} else {
		mg.n_keys = n;
		mg.keys = keys;
		mg.wait = wait;
		rq.kv_multi_get = &mg;
	}
	return (fx_send(f, c, &rq, NULL, 0));
}

START_TEST(test_set_get)
{
	struct fx *f = kv_setup();
	uintptr_t t;

	fx_want(f, fx_kv_set(f, &kv_c[0], "a", "hello"), COHORT_OK);
	t = fx_kv_get(f, &kv_c[1], "a", false, 0);
	ck_assert(fx_want(f, t, COHORT_OK)->kv_get->found);
	ck_assert(fx_payload_is(f, t, "hello"));
	t = fx_kv_get(f, &kv_c[1], "b", false, 0);
	ck_assert(!fx_want(f, t, COHORT_OK)->kv_get->found);
	/* overwrite, empty value */
	fx_want(f, fx_kv_set(f, &kv_c[0], "a", ""), COHORT_OK);
	t = fx_kv_get(f, &kv_c[1], "a", false, 0);
	ck_assert(fx_want(f, t, COHORT_OK)->kv_get->found);
	ck_assert(fx_payload_is(f, t, ""));
	fx_free(f);
}
END_TEST

START_TEST(test_get_wait_released_by_set)
{
	struct fx *f = kv_setup();
	uintptr_t t1, t2;

	t1 = fx_kv_get(f, &kv_c[1], "addr", true, 60000);
	t2 = fx_kv_get(f, &kv_c[0], "addr", true, 60000);
	ck_assert_ptr_null(fx_get(f, t1));
	fx_want(f, fx_kv_set(f, &kv_c[0], "addr", "10.0.0.1:5"), COHORT_OK);
	ck_assert(fx_payload_is(f, t1, "10.0.0.1:5"));
	ck_assert(fx_payload_is(f, t2, "10.0.0.1:5"));
	ck_assert_uint_eq(f->core->nparked, 0);
	fx_free(f);
}
END_TEST

START_TEST(test_wait_and_timeout)
{
	struct fx *f = kv_setup();
	char *keys[3] = { "x", "y", "z" };
	uintptr_t t;
	Cohort__Reply *r;

	t = kv_keys(
	    f, &kv_c[0], COHORT__REQUEST__BODY_KV_WAIT, keys, 3, true, 60000);
	fx_kv_set(f, &kv_c[1], "x", "1");
	fx_kv_set(f, &kv_c[1], "z", "1");
	ck_assert_ptr_null(fx_get(f, t));
	fx_kv_set(f, &kv_c[1], "y", "1");
	fx_want(f, t, COHORT_OK);
	/* timeout names the absent keys */
	keys[1] = "q";
	t = kv_keys(
	    f, &kv_c[0], COHORT__REQUEST__BODY_KV_WAIT, keys, 3, true, 2000);
	fx_tick(f, 2500);
	r = fx_want(f, t, COHORT_ETIMEDOUT);
	ck_assert_has(r->error, "absent: 'q'");
	/* check */
	t = kv_keys(
	    f, &kv_c[0], COHORT__REQUEST__BODY_KV_CHECK, keys, 3, false, 0);
	ck_assert(!fx_want(f, t, COHORT_OK)->kv_check->all_present);
	keys[1] = "y";
	t = kv_keys(
	    f, &kv_c[0], COHORT__REQUEST__BODY_KV_CHECK, keys, 3, false, 0);
	ck_assert(fx_want(f, t, COHORT_OK)->kv_check->all_present);
	/* get with wait and timeout 0 answers at once */
	fx_want(f, fx_kv_get(f, &kv_c[0], "never", true, 0), COHORT_ETIMEDOUT);
	fx_free(f);
}
END_TEST

START_TEST(test_add_idempotent)
{
	struct fx *f = kv_setup();
	uintptr_t t;

	t = fx_kv_add(f, &kv_c[0], "n", 5, 0);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 5);
	t = fx_kv_add(f, &kv_c[1], "n", -2, 0);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 3);
	/* a retry of the same seq is applied once */
	t = fx_kv_add(f, &kv_c[1], "n", -2, kv_c[1].seq);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 3);
	t = fx_kv_get(f, &kv_c[0], "n", false, 0);
	ck_assert(fx_payload_is(f, t, "3"));
	fx_kv_set(f, &kv_c[0], "s", "abc");
	fx_want(f, fx_kv_add(f, &kv_c[0], "s", 1, 0), COHORT_EINVAL);
	fx_kv_set(f, &kv_c[0], "big", "9223372036854775807");
	fx_want(f, fx_kv_add(f, &kv_c[0], "big", 1, 0), COHORT_EINVAL);
	fx_free(f);
}
END_TEST

START_TEST(test_compare_set_delete_num_keys)
{
	struct fx *f = kv_setup();
	uintptr_t t;
	Cohort__Reply *r;

	t = fx_kv_cas(f, &kv_c[0], "k", NULL, false, "first");
	ck_assert(fx_want(f, t, COHORT_OK)->kv_compare_set->swapped);
	t = fx_kv_cas(f, &kv_c[0], "k", NULL, false, "second");
	ck_assert(!fx_want(f, t, COHORT_OK)->kv_compare_set->swapped);
	ck_assert(fx_payload_is(f, t, "first"));
	t = fx_kv_cas(f, &kv_c[0], "k", "first", true, "third");
	ck_assert(fx_want(f, t, COHORT_OK)->kv_compare_set->swapped);
	ck_assert(fx_payload_is(f, t, "third"));
	t = fx_kv_cas(f, &kv_c[0], "k", "nope", true, "x");
	ck_assert(!fx_want(f, t, COHORT_OK)->kv_compare_set->swapped);
	{
		Cohort__KvNumKeys nk = COHORT__KV_NUM_KEYS__INIT;
		r = fx_want(f,
		    fx_simple(f, &kv_c[0], COHORT__REQUEST__BODY_KV_NUM_KEYS,
		        &nk, 0),
		    COHORT_OK);
		ck_assert_uint_eq(r->kv_num_keys->count, 1);
		r = fx_want(f, fx_kv_delete(f, &kv_c[0], "k"), COHORT_OK);
		ck_assert(r->kv_delete->deleted);
		r = fx_want(f, fx_kv_delete(f, &kv_c[0], "k"), COHORT_OK);
		ck_assert(!r->kv_delete->deleted);
		r = fx_want(f,
		    fx_simple(f, &kv_c[0], COHORT__REQUEST__BODY_KV_NUM_KEYS,
		        &nk, 0),
		    COHORT_OK);
		ck_assert_uint_eq(r->kv_num_keys->count, 0);
	}
	fx_free(f);
}
END_TEST

START_TEST(test_append_multi)
{
	struct fx *f = kv_setup();
	char *keys[2] = { "m1", "m2" };
	uint64_t lens[2] = { 3, 2 };
	uintptr_t t;
	Cohort__Reply *r;

	fx_want(f, fx_kv_append(f, &kv_c[0], "log", "ab"), COHORT_OK);
	fx_want(f, fx_kv_append(f, &kv_c[0], "log", "cd"), COHORT_OK);
	ck_assert(
	    fx_payload_is(f, fx_kv_get(f, &kv_c[0], "log", false, 0), "abcd"));
	/* multi_get waits for both */
	t = kv_keys(f, &kv_c[1], COHORT__REQUEST__BODY_KV_MULTI_GET, keys, 2,
	    true, 60000);
	ck_assert_ptr_null(fx_get(f, t));
	fx_want(f, fx_kv_multi_set(f, &kv_c[0], keys, lens, 2, "xyzuv"),
	    COHORT_OK);
	r = fx_want(f, t, COHORT_OK);
	ck_assert_uint_eq(r->kv_multi_get->n_value_lens, 2);
	ck_assert_uint_eq(r->kv_multi_get->value_lens[0], 3);
	ck_assert(fx_payload_is(f, t, "xyzuv"));
	/* lengths that lie */
	lens[1] = 9;
	fx_want(f, fx_kv_multi_set(f, &kv_c[0], keys, lens, 2, "xyzuv"),
	    COHORT_EINVAL);
	/* multi_get without wait on an absent key */
	keys[1] = "absent";
	t = kv_keys(f, &kv_c[1], COHORT__REQUEST__BODY_KV_MULTI_GET, keys, 2,
	    false, 0);
	fx_want(f, t, COHORT_ENOENT);
	fx_free(f);
}
END_TEST

START_TEST(test_limits_and_keys)
{
	struct fx *f = kv_setup(); /* value 64, job 4096, keys 20 */
	char big[200], key[1100];
	Cohort__Reply *r;

	memset(big, 'v', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	r = fx_want(f, fx_kv_set(f, &kv_c[0], "k", big), COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-value-bytes 64"));
	for (int i = 0; i < 20; i++) {
		char k[16];
		snprintf(k, sizeof(k), "k%d", i);
		fx_want(f, fx_kv_set(f, &kv_c[0], k, "v"), COHORT_OK);
	}
	r = fx_want(
	    f, fx_kv_set(f, &kv_c[0], "one-more", "v"), COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-keys 20"));
	/* replacing an existing key is fine */
	fx_want(f, fx_kv_set(f, &kv_c[0], "k3", "w"), COHORT_OK);
	fx_want(f, fx_kv_set(f, &kv_c[0], "", "v"), COHORT_EINVAL);
	memset(key, 'a', sizeof(key) - 1);
	key[sizeof(key) - 1] = '\0';
	fx_want(f, fx_kv_set(f, &kv_c[0], key, "v"), COHORT_EINVAL);
	fx_free(f);

	f = fx_new_limits(4000, 100, 1000);
	fx_form(f, kv_c, 1, "j");
	fx_want(f,
	    fx_kv_set(
	        f, &kv_c[0], "a", "0123456789012345678901234567890123456789"),
	    COHORT_OK);
	fx_want(f,
	    fx_kv_set(
	        f, &kv_c[0], "b", "0123456789012345678901234567890123456789"),
	    COHORT_OK);
	r = fx_want(f,
	    fx_kv_set(
	        f, &kv_c[0], "c", "0123456789012345678901234567890123456789"),
	    COHORT_ETOOBIG);
	ck_assert_ptr_nonnull(strstr(r->error, "--max-job-bytes 100"));
	fx_free(f);
}
END_TEST

START_TEST(test_kv_without_membership)
{
	struct fx *f = kv_setup();
	struct srq_cli tool;

	/* a tool that never joined (cohort CLI) uses the job's KV */
	srq_cli_init(&tool, "j", 999, 99);
	fx_want(f, fx_kv_set(f, &tool, "from-tool", "1"), COHORT_OK);
	ck_assert(fx_payload_is(
	    f, fx_kv_get(f, &kv_c[0], "from-tool", false, 0), "1"));
	/* its connection closing frees it, parked calls included */
	fx_kv_get(f, &tool, "never", true, 60000);
	srv_core_pipe_closed(f->core, tool.pipe, f->now);
	ck_assert_uint_eq(f->ndrop, 1);
	ck_assert_uint_eq(f->core->nparked, 0);
	fx_free(f);
}
END_TEST

UNIT_SUITE(srv_kv, "kv", 30, test_set_get, test_get_wait_released_by_set,
    test_wait_and_timeout, test_add_idempotent,
    test_compare_set_delete_num_keys, test_append_multi, test_limits_and_keys,
    test_kv_without_membership)
