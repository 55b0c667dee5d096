/*
 * test_srv_journal.c - cohortd's --state-dir without sockets: keys,
 * members, groups and cached replies survive a restart; a torn last
 * record is ignored; compaction; a retried add after a restart is applied
 * once; members have their dead-after from the restart to come back.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>

#include "srv_fixture.h"

Suite *suite_srv_journal(void);

static uintptr_t
jt_add(struct fx *f, struct fx_cli *c, const char *key, int64_t delta,
    uint64_t seq)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvAdd a = COHORT__KV_ADD__INIT;

	a.key = (char *)key;
	a.delta = delta;
	rq.body_case = COHORT__REQUEST__BODY_KV_ADD;
	rq.kv_add = &a;
	rq.seq = seq;
	return (fx_send(f, c, &rq, NULL, 0));
}

static void
jt_want_value(struct fx *f, struct fx_cli *c, const char *key, const char *v)
{
	uintptr_t t = fx_kv_get(f, c, key, false, 0);
	Cohort__Reply *r = fx_want(f, t, COHORT_OK);

	if (v == NULL) {
		ck_assert_msg(!r->kv_get->found, "key '%s' is present", key);
		return;
	}
	ck_assert_msg(r->kv_get->found, "key '%s' is absent", key);
	ck_assert_msg(
	    fx_payload_is(f, t, v), "key '%s' has the wrong value", key);
}

static off_t
jt_size(const char *dir, const char *name)
{
	char p[512];
	struct stat sb;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	if (stat(p, &sb) != 0)
		return (-1);
	return (sb.st_size);
}

START_TEST(test_crc32c)
{
	/* The standard check value of CRC-32C. */
	ck_assert_uint_eq(srv_crc32c("123456789", 9), 0xe3069283u);
	ck_assert_uint_eq(srv_crc32c("", 0), 0);
}
END_TEST

START_TEST(test_kv_survives_restart)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c;
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvDelete d = COHORT__KV_DELETE__INIT;
	Cohort__KvAppend ap = COHORT__KV_APPEND__INIT;
	Cohort__KvCompareSet cs = COHORT__KV_COMPARE_SET__INIT;
	Cohort__KvMultiSet ms = COHORT__KV_MULTI_SET__INIT;
	char *mkeys[2] = { "m1", "m2" };
	uint64_t mlens[2] = { 2, 3 };
	uintptr_t t;

	/* A job exists once its first member joined. */
	fx_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	fx_want(f, fx_kv_set(f, &c, "a", "alpha"), COHORT_OK);
	fx_want(f, fx_kv_set(f, &c, "gone", "x"), COHORT_OK);
	fx_want(f, fx_kv_set(f, &c, "a", "alpha2"), COHORT_OK);
	fx_want(f, jt_add(f, &c, "n", 5, 0), COHORT_OK);
	fx_want(f, jt_add(f, &c, "n", -2, 0), COHORT_OK);
	d.key = "gone";
	rq.body_case = COHORT__REQUEST__BODY_KV_DELETE;
	rq.kv_delete = &d;
	fx_want(f, fx_send(f, &c, &rq, NULL, 0), COHORT_OK);
	ap.key = "log";
	rq = (Cohort__Request)COHORT__REQUEST__INIT;
	rq.body_case = COHORT__REQUEST__BODY_KV_APPEND;
	rq.kv_append = &ap;
	fx_want(f, fx_send(f, &c, &rq, "ab", 2), COHORT_OK);
	rq.seq = 0;
	fx_want(f, fx_send(f, &c, &rq, "cd", 2), COHORT_OK);
	cs.key = "cas";
	cs.expected_present = false;
	rq = (Cohort__Request)COHORT__REQUEST__INIT;
	rq.body_case = COHORT__REQUEST__BODY_KV_COMPARE_SET;
	rq.kv_compare_set = &cs;
	fx_want(f, fx_send(f, &c, &rq, "new", 3), COHORT_OK);
	ms.n_keys = 2;
	ms.keys = mkeys;
	ms.n_value_lens = 2;
	ms.value_lens = mlens;
	rq = (Cohort__Request)COHORT__REQUEST__INIT;
	rq.body_case = COHORT__REQUEST__BODY_KV_MULTI_SET;
	rq.kv_multi_set = &ms;
	fx_want(f, fx_send(f, &c, &rq, "xxyyy", 5), COHORT_OK);

	fx_restart(f);
	jt_want_value(f, &c, "a", "alpha2");
	jt_want_value(f, &c, "n", "3");
	jt_want_value(f, &c, "gone", NULL);
	jt_want_value(f, &c, "log", "abcd");
	jt_want_value(f, &c, "cas", "new");
	jt_want_value(f, &c, "m1", "xx");
	jt_want_value(f, &c, "m2", "yyy");
	/* And keeps journalling after the restart. */
	fx_want(f, jt_add(f, &c, "n", 10, 0), COHORT_OK);
	fx_restart(f);
	jt_want_value(f, &c, "n", "13");
	t = fx_kv_get(f, &c, "a", false, 0);
	ck_assert_uint_eq(fx_want(f, t, COHORT_OK)->generation, 1);
	fx_free_journal(f);
}
END_TEST

START_TEST(test_retried_add_after_restart)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c, k;
	uintptr_t t;

	fx_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	/* A client that is not a member (a KV user) counts too. */
	fx_cli_init(&k, "j", 99, 2);
	t = jt_add(f, &k, "ctr", 1, 40);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 1);
	t = jt_add(f, &c, "ctr", 1, 0);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 2);
	/* cohortd dies before client k heard its reply; k reconnects
	 * (another pipe) and re-sends seq 40. */
	fx_restart(f);
	k.pipe = 3;
	t = jt_add(f, &k, "ctr", 1, 40);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 1);
	jt_want_value(f, &k, "ctr", "2");
	/* A new seq is a new add. */
	t = jt_add(f, &k, "ctr", 1, 41);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 3);
	/* Twice, across a second restart. */
	fx_restart(f);
	t = jt_add(f, &k, "ctr", 1, 41);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 3);
	jt_want_value(f, &c, "ctr", "3");
	fx_free_journal(f);
}
END_TEST

START_TEST(test_torn_last_record)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c;
	char p[512];
	off_t before, after;
	int fd;

	fx_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	fx_want(f, fx_kv_set(f, &c, "k1", "one"), COHORT_OK);
	before = jt_size(f->dir, "log.0");
	fx_want(f, fx_kv_set(f, &c, "k2", "two"), COHORT_OK);
	after = jt_size(f->dir, "log.0");
	ck_assert_int_gt(after, before);
	/* A crash in the middle of the last write: cut it short. The
	 * set and its cached reply were one batch: both are gone (the
	 * client's retry applies the set once). */
	snprintf(p, sizeof(p), "%s/log.0", f->dir);
	ck_assert_int_eq(truncate(p, after - 3), 0);
	fx_restart(f);
	jt_want_value(f, &c, "k1", "one");
	jt_want_value(f, &c, "k2", NULL);
	ck_assert_int_eq(jt_size(f->dir, "log.0"), before);
	/* Garbage after the last record is cut off as well. */
	fx_want(f, fx_kv_set(f, &c, "k3", "three"), COHORT_OK);
	before = jt_size(f->dir, "log.0");
	fd = open(p, O_WRONLY | O_APPEND);
	ck_assert_int_ge(fd, 0);
	ck_assert_int_eq(write(fd, "\x10\0\0\0garbagegarbage!", 20), 20);
	close(fd);
	fx_restart(f);
	jt_want_value(f, &c, "k3", "three");
	ck_assert_int_eq(jt_size(f->dir, "log.0"), before);
	/* What comes after the cut is readable again. */
	fx_want(f, fx_kv_set(f, &c, "k4", "four"), COHORT_OK);
	fx_restart(f);
	jt_want_value(f, &c, "k4", "four");
	jt_want_value(f, &c, "k1", "one");
	fx_free_journal(f);
}
END_TEST

START_TEST(test_compaction)
{
	struct fx *f = fx_new_journal(4096);
	struct fx_cli c;
	struct srv_jrn_stats st;
	char key[32], val[64];

	fx_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	for (int i = 0; i < 500; i++) {
		snprintf(key, sizeof(key), "k%d", i % 20);
		snprintf(val, sizeof(val), "value-%d", i);
		fx_want(f, fx_kv_set(f, &c, key, val), COHORT_OK);
	}
	fx_want(f, jt_add(f, &c, "ctr", 1, 1000), COHORT_OK);
	srv_jrn_stats(f->core, &st);
	ck_assert_uint_gt(st.compactions, 2);
	/* The log stays bounded: at most max(4 KiB, 2 x snapshot) + one
	 * request's records. */
	ck_assert_uint_lt(st.log_bytes, 2 * st.snap_bytes + 4096 + 1024);
	ck_assert_int_lt(jt_size(f->dir, "log.0"), 0);
	ck_assert_int_gt(jt_size(f->dir, "snapshot"), 0);
	ck_assert_cohort_ok(srv_jrn_compact(f->core));
	fx_restart(f);
	/* The cached reply went into the snapshot too. */
	ck_assert_int_eq(fx_want(f, jt_add(f, &c, "ctr", 1, 1000), COHORT_OK)
	                     ->kv_add->value,
	    1);
	for (int i = 480; i < 500; i++) {
		snprintf(key, sizeof(key), "k%d", i % 20);
		snprintf(val, sizeof(val), "value-%d", i);
		jt_want_value(f, &c, key, val);
	}
	/* A snapshot of its own and a restart from it alone. */
	ck_assert_cohort_ok(srv_jrn_compact(f->core));
	fx_restart(f);
	jt_want_value(f, &c, "ctr", "1");
	fx_free_journal(f);
}
END_TEST

/* Keeps both members alive for ms, heartbeating every second. */
static void
jt_alive(struct fx *f, struct fx_cli *c, int n, cohort__time ms)
{
	for (cohort__time t = 0; t < ms; t += 1000) {
		for (int i = 0; i < n; i++)
			fx_want(f, fx_heartbeat(f, &c[i], "", 0, "", false, 0),
			    COHORT_OK);
		fx_tick(f, 1000);
	}
}

static uintptr_t
jt_barrier(struct fx *f, struct fx_cli *c, const char *group, uint64_t op_seq,
    uint64_t seq)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	co.kind = COHORT__COLLECTIVE_KIND__COLL_BARRIER;
	co.name = "b";
	co.group = (char *)group;
	co.op_seq = op_seq;
	rq.body_case = COHORT__REQUEST__BODY_COLLECTIVE;
	rq.collective = &co;
	rq.timeout_ms = 60000;
	rq.seq = seq;
	return (fx_send(f, c, &rq, NULL, 0));
}

START_TEST(test_members_and_barrier_across_restart)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c[2];
	uintptr_t t0, t1;
	uint64_t s1, s2;
	Cohort__Reply *r;

	fx_form(f, c, 2, "j");
	t0 = jt_barrier(f, &c[0], "", 1, 0);
	ck_assert_ptr_null(fx_get(f, t0));
	t1 = jt_barrier(f, &c[1], "", 1, 0);
	s1 = c[1].seq;
	fx_want(f, t1, COHORT_OK);
	/* Rank 0 waits in barrier #2 when cohortd dies. */
	t0 = jt_barrier(f, &c[0], "", 2, 0);
	s2 = c[0].seq;
	ck_assert_ptr_null(fx_get(f, t0));
	fx_restart(f);

	/* Rank 1 never heard of barrier #1's reply: its retry is answered
	 * from the journalled cache, without waiting. */
	c[0].pipe = 20;
	c[1].pipe = 21;
	r = fx_want(f, jt_barrier(f, &c[1], "", 1, s1), COHORT_OK);
	ck_assert_uint_eq(r->generation, 1);
	/* Rank 0 re-sends its parked barrier (same seq); rank 1 comes. */
	t0 = jt_barrier(f, &c[0], "", 2, s2);
	ck_assert_ptr_null(fx_get(f, t0));
	t1 = jt_barrier(f, &c[1], "", 2, 0);
	fx_want(f, t0, COHORT_OK);
	fx_want(f, t1, COHORT_OK);
	/* Rank 1 does not come back after the next restart: it is failed
	 * dead-after (5 s) later; rank 0, which does, is not. */
	fx_restart(f);
	jt_alive(f, c, 1, 5000);
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert(r->heartbeat->healthy);
	fx_tick(f, 1000);
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert(!r->heartbeat->healthy);
	ck_assert_int_eq(r->failed_rank, 1);
	/* named as a member that did not come back, not as a crash */
	ck_assert_ptr_nonnull(strstr(r->failed_text,
	    "did not reconnect within 6.0 s of cohortd's restart"));
	/* The failure itself survives a restart. */
	fx_restart(f);
	r = fx_want(f, fx_heartbeat(f, &c[0], "", 0, "", false, 0), COHORT_OK);
	ck_assert(!r->heartbeat->healthy);
	ck_assert_int_eq(r->failed_rank, 1);
	r = fx_want(f, jt_barrier(f, &c[0], "", 3, 0), COHORT_EPEERLOST);
	ck_assert_ptr_nonnull(strstr(r->error, "rank 1"));
	fx_free_journal(f);
}
END_TEST

START_TEST(test_groups_and_leave_across_restart)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c[3];
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__GroupCreate gc = COHORT__GROUP_CREATE__INIT;
	Cohort__Leave lv = COHORT__LEAVE__INIT;
	int32_t ranks[2] = { 0, 2 };
	uintptr_t t0, t2;

	fx_form(f, c, 3, "j");
	gc.name = "pair";
	gc.n_ranks = 2;
	gc.ranks = ranks;
	rq.body_case = COHORT__REQUEST__BODY_GROUP_CREATE;
	rq.group_create = &gc;
	rq.timeout_ms = 1000;
	t0 = fx_send(f, &c[0], &rq, NULL, 0);
	rq.seq = 0;
	t2 = fx_send(f, &c[2], &rq, NULL, 0);
	fx_want(f, t0, COHORT_OK);
	fx_want(f, t2, COHORT_OK);
	fx_want(f, fx_kv_set(f, &c[1], "k", "v"), COHORT_OK);
	fx_restart(f);
	/* The group is there: a barrier on it completes. */
	t0 = jt_barrier(f, &c[0], "pair", 1, 0);
	t2 = jt_barrier(f, &c[2], "pair", 1, 0);
	fx_want(f, t0, COHORT_OK);
	fx_want(f, t2, COHORT_OK);
	/* Everyone leaves: the job and its keys are gone, for good. */
	for (int i = 0; i < 3; i++)
		fx_want(f,
		    fx_simple(f, &c[i], COHORT__REQUEST__BODY_LEAVE, &lv, 0),
		    COHORT_OK);
	fx_restart(f);
	fx_want(f, fx_kv_get(f, &c[0], "k", false, 0), COHORT_EAUTH);
	ck_assert_uint_eq(f->core->jobs.n, 0);
	fx_free_journal(f);
}
END_TEST

START_TEST(test_one_left_across_restart)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c[2];
	Cohort__Leave lv = COHORT__LEAVE__INIT;
	Cohort__Reply *r;

	fx_form(f, c, 2, "j");
	fx_want(f, fx_simple(f, &c[1], COHORT__REQUEST__BODY_LEAVE, &lv, 0),
	    COHORT_OK);
	fx_restart(f);
	/* Rank 1 left before the restart: a barrier cannot complete. */
	r = fx_want(f, jt_barrier(f, &c[0], "", 1, 0), COHORT_EPEERLOST);
	ck_assert_ptr_nonnull(strstr(r->error, "left"));
	fx_free_journal(f);
}
END_TEST

START_TEST(test_keys_before_first_generation)
{
	struct fx *f = fx_new_journal(0);
	struct fx_cli c[2];
	uintptr_t t0, t1;

	/* A store used during the rendezvous (rank 0 waits for rank 1). */
	fx_cli_init(&c[0], "j", 1, 1);
	fx_cli_init(&c[1], "j", 2, 2);
	t0 = fx_join(f, &c[0], 0, 2, 60000);
	fx_want(f, fx_kv_set(f, &c[0], "addr", "10.0.0.1:4000"), COHORT_OK);
	ck_assert_ptr_null(fx_get(f, t0));
	fx_restart(f);
	/* Rank 1 reads before rank 0 re-sent its join: the job and its
	 * keys were kept. */
	c[1].pipe = 12;
	jt_want_value(f, &c[1], "addr", "10.0.0.1:4000");
	c[0].pipe = 11;
	c[0].seq = 0; /* the join was seq 1 */
	t0 = fx_join(f, &c[0], 0, 2, 60000);
	t1 = fx_join(f, &c[1], 1, 2, 60000);
	fx_joined(f, &c[0], t0);
	fx_joined(f, &c[1], t1);
	ck_assert_uint_eq(c[0].gen, 1);
	fx_free_journal(f);
}
END_TEST

START_TEST(test_state_dir_locked)
{
	struct fx *f = fx_new_journal(0);
	struct srv_core *other;
	struct srv_jrn_opts o;

	ck_assert_cohort_ok(
	    srv_core_new(&f->core->lim, NULL, fx_sink, f, f->now, &other));
	memset(&o, 0, sizeof(o));
	o.dir = f->dir;
	ck_assert_int_eq(
	    srv_core_journal_open(other, &o, f->now), COHORT_EEXIST);
	srv_core_free(other);
	fx_free_journal(f);
}
END_TEST

/* Cost of journalling (reported, not asserted): kv_set and add with the
 * journal on, against the same without one. */
START_TEST(test_journal_cost)
{
	struct fx *f[2];
	struct fx_cli c[2];
	double us[2][2];
	const int n = 3000;
	uint64_t t;

	f[0] = fx_new();
	f[1] = fx_new_journal(0);
	for (int k = 0; k < 2; k++) {
		char key[32];
		fx_cli_init(&c[k], "j", 7, 1);
		fx_joined(f[k], &c[k], fx_join(f[k], &c[k], 0, 1, 1000));
		t = cohort__now_ns();
		for (int i = 0; i < n; i++) {
			snprintf(key, sizeof(key), "key-%d", i);
			fx_kv_set(f[k], &c[k], key, "0123456789abcdef");
			if (f[k]->n > FX_MAX - 16) {
				for (size_t x = 0; x < f[k]->n; x++) {
					cohort__reply__free_unpacked(
					    f[k]->r[x].rep, NULL);
					nng_msg_free(f[k]->r[x].msg);
				}
				f[k]->n = 0;
			}
		}
		us[k][0] = (double)(cohort__now_ns() - t) / 1e3 / n;
		t = cohort__now_ns();
		for (int i = 0; i < n; i++) {
			jt_add(f[k], &c[k], "ctr", 1, 0);
			if (f[k]->n > FX_MAX - 16) {
				for (size_t x = 0; x < f[k]->n; x++) {
					cohort__reply__free_unpacked(
					    f[k]->r[x].rep, NULL);
					nng_msg_free(f[k]->r[x].msg);
				}
				f[k]->n = 0;
			}
		}
		us[k][1] = (double)(cohort__now_ns() - t) / 1e3 / n;
	}
	fprintf(stderr,
	    "journal cost (fsync none, core only): kv_set %.2f us -> %.2f us, "
	    "add %.2f us -> %.2f us\n",
	    us[0][0], us[1][0], us[0][1], us[1][1]);
	{
		/* The journal's own work per kv_set: its KV_PUT and REPLY
		 * records, one batch, one write(). */
		struct srv_hnode *jn = srv_map_get(&f[1]->core->jobs, "j", 1);
		struct srv_job *job = SRV_CONTAINER(jn, struct srv_job, hn);
		struct srv_client *cl = srv_client_get(job, 7, f[1]->now);
		nng_msg *m;
		const int k = 20000;
		ck_assert_int_eq(nng_msg_alloc(&m, 24), 0);
		memset(nng_msg_body(m), 1, 24);
		t = cohort__now_ns();
		for (int i = 0; i < k; i++) {
			srv_jrn_kv_put(
			    job, "some-key-0001", "0123456789abcdef", 16);
			srv_jrn_reply(cl, 100000 + (uint64_t)i, m);
			srv_jrn_flush(f[1]->core, f[1]->now);
		}
		fprintf(stderr,
		    "journal records + write() per kv_set: %.2f us\n",
		    (double)(cohort__now_ns() - t) / 1e3 / k);
		nng_msg_free(m);
	}
	fx_free(f[0]);
	fx_free_journal(f[1]);
}
END_TEST

Suite *
suite_srv_journal(void)
{
	Suite *s = suite_create("srv_journal");
	TCase *tc = tcase_create("journal");

	tcase_set_timeout(tc, 60);
	tcase_add_test(tc, test_crc32c);
	tcase_add_test(tc, test_kv_survives_restart);
	tcase_add_test(tc, test_retried_add_after_restart);
	tcase_add_test(tc, test_torn_last_record);
	tcase_add_test(tc, test_compaction);
	tcase_add_test(tc, test_members_and_barrier_across_restart);
	tcase_add_test(tc, test_groups_and_leave_across_restart);
	tcase_add_test(tc, test_one_left_across_restart);
	tcase_add_test(tc, test_keys_before_first_generation);
	tcase_add_test(tc, test_state_dir_locked);
	tcase_add_test(tc, test_journal_cost);
	suite_add_tcase(s, tc);
	return (s);
}
