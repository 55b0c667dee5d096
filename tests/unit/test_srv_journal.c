/*
 * test_srv_journal.c - cohortd's --state-dir without sockets: keys,
 * members, groups and cached replies survive a restart; a torn last
 * record is ignored; compaction; a retried add after a restart is applied
 * once; members have their dead-after from the restart to come back.
 * Integrity: damage (a flipped byte at the start, middle or end, a bad
 * magic, a damaged snapshot) refuses to start and --recover keeps every
 * whole record; a truncated, empty or missing log is an error where the
 * manifest says it holds state; a read-only directory is an error. A
 * full disk (a small tmpfs) acknowledges nothing it could not journal.
 */
#include <fcntl.h>
#include <inttypes.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "srv_fixture.h"
#include "unit_suite.h"

Suite *suite_srv_journal(void);

static void
jt_want_value(struct fx *f, struct srq_cli *c, const char *key, const char *v)
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
	struct srq_cli c;
	char *mkeys[2] = { "m1", "m2" };
	uint64_t mlens[2] = { 2, 3 };
	uintptr_t t;

	/* A job exists once its first member joined. */
	srq_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	fx_want(f, fx_kv_set(f, &c, "a", "alpha"), COHORT_OK);
	fx_want(f, fx_kv_set(f, &c, "gone", "x"), COHORT_OK);
	fx_want(f, fx_kv_set(f, &c, "a", "alpha2"), COHORT_OK);
	fx_want(f, fx_kv_add(f, &c, "n", 5, 0), COHORT_OK);
	fx_want(f, fx_kv_add(f, &c, "n", -2, 0), COHORT_OK);
	fx_want(f, fx_kv_delete(f, &c, "gone"), COHORT_OK);
	fx_want(f, fx_kv_append(f, &c, "log", "ab"), COHORT_OK);
	fx_want(f, fx_kv_append(f, &c, "log", "cd"), COHORT_OK);
	fx_want(f, fx_kv_cas(f, &c, "cas", NULL, false, "new"), COHORT_OK);
	fx_want(
	    f, fx_kv_multi_set(f, &c, mkeys, mlens, 2, "xxyyy"), COHORT_OK);

	fx_restart(f);
	jt_want_value(f, &c, "a", "alpha2");
	jt_want_value(f, &c, "n", "3");
	jt_want_value(f, &c, "gone", NULL);
	jt_want_value(f, &c, "log", "abcd");
	jt_want_value(f, &c, "cas", "new");
	jt_want_value(f, &c, "m1", "xx");
	jt_want_value(f, &c, "m2", "yyy");
	/* And keeps journalling after the restart. */
	fx_want(f, fx_kv_add(f, &c, "n", 10, 0), COHORT_OK);
	fx_restart(f);
	jt_want_value(f, &c, "n", "13");
	t = fx_kv_get(f, &c, "a", false, 0);
	ck_assert_uint_eq(fx_want(f, t, COHORT_OK)->generation, 1);
}
END_TEST

START_TEST(test_retried_add_after_restart)
{
	struct srq_cli c, k;
	uintptr_t t;

	srq_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	/* A client that is not a member (a KV user) counts too. */
	srq_cli_init(&k, "j", 99, 2);
	t = fx_kv_add(f, &k, "ctr", 1, 40);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 1);
	t = fx_kv_add(f, &c, "ctr", 1, 0);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 2);
	/* cohortd dies before client k heard its reply; k reconnects
	 * (another pipe) and re-sends seq 40. */
	fx_restart(f);
	k.pipe = 3;
	t = fx_kv_add(f, &k, "ctr", 1, 40);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 1);
	jt_want_value(f, &k, "ctr", "2");
	/* A new seq is a new add. */
	t = fx_kv_add(f, &k, "ctr", 1, 41);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 3);
	/* Twice, across a second restart. */
	fx_restart(f);
	t = fx_kv_add(f, &k, "ctr", 1, 41);
	ck_assert_int_eq(fx_want(f, t, COHORT_OK)->kv_add->value, 3);
	jt_want_value(f, &c, "ctr", "3");
}
END_TEST

START_TEST(test_torn_last_record)
{
	struct srq_cli c;
	char p[512];
	off_t before, after;
	int fd;

	srq_cli_init(&c, "j", 7, 1);
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
}
END_TEST

START_TEST(test_compaction)
{
	struct fx *f = fx_new_journal(4096);
	struct srq_cli c;
	struct srv_jrn_stats st;
	char key[32], val[64];

	srq_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	for (int i = 0; i < 500; i++) {
		snprintf(key, sizeof(key), "k%d", i % 20);
		snprintf(val, sizeof(val), "value-%d", i);
		fx_want(f, fx_kv_set(f, &c, key, val), COHORT_OK);
	}
	fx_want(f, fx_kv_add(f, &c, "ctr", 1, 1000), COHORT_OK);
	srv_jrn_stats(f->core->jrn, &st);
	ck_assert_uint_gt(st.compactions, 2);
	/* The log stays bounded: at most max(4 KiB, 2 x snapshot) + one
	 * request's records. */
	ck_assert_uint_lt(st.log_bytes, 2 * st.snap_bytes + 4096 + 1024);
	ck_assert_int_lt(jt_size(f->dir, "log.0"), 0);
	ck_assert_int_gt(jt_size(f->dir, "snapshot"), 0);
	ck_assert_cohort_ok(srv_snapshot_compact(f->core));
	fx_restart(f);
	/* The cached reply went into the snapshot too. */
	ck_assert_int_eq(
	    fx_want(f, fx_kv_add(f, &c, "ctr", 1, 1000), COHORT_OK)
	        ->kv_add->value,
	    1);
	for (int i = 480; i < 500; i++) {
		snprintf(key, sizeof(key), "k%d", i % 20);
		snprintf(val, sizeof(val), "value-%d", i);
		jt_want_value(f, &c, key, val);
	}
	/* A snapshot of its own and a restart from it alone. */
	ck_assert_cohort_ok(srv_snapshot_compact(f->core));
	fx_restart(f);
	jt_want_value(f, &c, "ctr", "1");
	fx_free_journal(f);
}
END_TEST

/* Keeps both members alive for ms, heartbeating every second. */
static void
jt_alive(struct fx *f, struct srq_cli *c, int n, cohort__time ms)
{
	for (cohort__time t = 0; t < ms; t += 1000) {
		for (int i = 0; i < n; i++)
			fx_want(f, fx_heartbeat(f, &c[i], "", 0, "", false, 0),
			    COHORT_OK);
		fx_tick(f, 1000);
	}
}

static uintptr_t
jt_barrier(struct fx *f, struct srq_cli *c, const char *group, uint64_t op_seq,
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
	struct srq_cli c[2];
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
}
END_TEST

START_TEST(test_groups_and_leave_across_restart)
{
	struct srq_cli c[3];
	int32_t ranks[2] = { 0, 2 };
	uintptr_t t0, t2;

	fx_form(f, c, 3, "j");
	t0 = fx_group(f, &c[0], "pair", ranks, 2, 1000);
	t2 = fx_group(f, &c[2], "pair", ranks, 2, 1000);
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
		fx_want(f, fx_leave(f, &c[i]), COHORT_OK);
	fx_restart(f);
	fx_want(f, fx_kv_get(f, &c[0], "k", false, 0), COHORT_EAUTH);
	ck_assert_uint_eq(f->core->jobs.n, 0);
}
END_TEST

START_TEST(test_one_left_across_restart)
{
	struct srq_cli c[2];
	Cohort__Reply *r;

	fx_form(f, c, 2, "j");
	fx_want(f, fx_leave(f, &c[1]), COHORT_OK);
	fx_restart(f);
	/* Rank 1 left before the restart: a barrier cannot complete. */
	r = fx_want(f, jt_barrier(f, &c[0], "", 1, 0), COHORT_EPEERLOST);
	ck_assert_ptr_nonnull(strstr(r->error, "left"));
}
END_TEST

START_TEST(test_keys_before_first_generation)
{
	struct srq_cli c[2];
	uintptr_t t0, t1;

	/* A store used during the rendezvous (rank 0 waits for rank 1). */
	srq_cli_init(&c[0], "j", 1, 1);
	srq_cli_init(&c[1], "j", 2, 2);
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
}
END_TEST

START_TEST(test_state_dir_locked)
{
	struct srv_core *other;

	ck_assert_cohort_ok(
	    srv_core_new(&f->core->lim, NULL, fx_sink, f, f->now, &other));
	ck_assert_int_eq(
	    srq_journal_open(other, f->dir, false, 0, f->now), COHORT_EEXIST);
	srv_core_free(other);
}
END_TEST

/* Cost of journalling (reported, not asserted): kv_set and add with the
 * journal on, against the same without one. */
START_TEST(test_journal_cost)
{
	struct fx *f[2];
	struct srq_cli c[2];
	double us[2][2];
	const int n = 3000;
	uint64_t t;

	f[0] = fx_new();
	f[1] = fx_new_journal(0);
	for (int k = 0; k < 2; k++) {
		char key[32];
		srq_cli_init(&c[k], "j", 7, 1);
		fx_joined(f[k], &c[k], fx_join(f[k], &c[k], 0, 1, 1000));
		t = cohort__now_ns();
		for (int i = 0; i < n; i++) {
			snprintf(key, sizeof(key), "key-%d", i);
			fx_kv_set(f[k], &c[k], key, "0123456789abcdef");
			if (f[k]->n > FX_MAX - 16)
				fx_forget_replies(f[k]);
		}
		us[k][0] = (double)(cohort__now_ns() - t) / 1e3 / n;
		t = cohort__now_ns();
		for (int i = 0; i < n; i++) {
			fx_kv_add(f[k], &c[k], "ctr", 1, 0);
			if (f[k]->n > FX_MAX - 16)
				fx_forget_replies(f[k]);
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
		struct srv_core *core = f[1]->core;
		struct srv_job *job = srv_job_find(core, "j");
		struct srv_client *cl
		    = srv_client_get(core, &job->clients, 7, f[1]->now);
		nng_msg *m;
		const int k = 20000;
		ck_assert_int_eq(nng_msg_alloc(&m, 24), 0);
		memset(nng_msg_body(m), 1, 24);
		t = cohort__now_ns();
		for (int i = 0; i < k; i++) {
			srv_jrn_kv_put(core->jrn, &job->jr, "some-key-0001",
			    "0123456789abcdef", 16);
			srv_jrn_reply(core->jrn, &job->jr, cl->id,
			    100000 + (uint64_t)i, m);
			srv_jrn_flush(core->jrn, f[1]->now);
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

/* ------------------------------------------------------------------------ */
/* Integrity: a torn tail is cut, damage refuses to start (--recover keeps  */
/* every whole record), lost files are errors                               */
/* ------------------------------------------------------------------------ */

static char *
jt_read(const char *dir, const char *name, size_t *len)
{
	char *b = srq_read_file(dir, name, len);

	ck_assert_msg(b != NULL, "cannot read %s/%s", dir, name);
	return (b);
}

static void
jt_flip(const char *dir, const char *name, off_t off)
{
	char p[512];
	unsigned char c;
	int fd;

	snprintf(p, sizeof(p), "%s/%s", dir, name);
	ck_assert_int_ge(fd = open(p, O_RDWR), 0);
	ck_assert_int_eq(pread(fd, &c, 1, off), 1);
	c ^= 0x5a;
	ck_assert_int_eq(pwrite(fd, &c, 1, off), 1);
	close(fd);
}

/* How many files in dir start with prefix. */
static int
jt_count(const char *dir, const char *prefix)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL)
		if (strncmp(e->d_name, prefix, strlen(prefix)) == 0)
			n++;
	closedir(d);
	return (n);
}

#define JT_KEYS 200

/* Job "a" (first batch), then job "b" with JT_KEYS keys, one batch
 * each; returns b's client. offs[i] = log offset where key i's batch
 * starts (offs[JT_KEYS] = the end). */
static void
jt_fill(struct fx *f, struct srq_cli *a, struct srq_cli *b, off_t *offs)
{
	char key[32], val[32];

	srq_cli_init(a, "a", 1, 1);
	fx_joined(f, a, fx_join(f, a, 0, 1, 1000));
	srq_cli_init(b, "b", 2, 2);
	fx_joined(f, b, fx_join(f, b, 0, 1, 1000));
	for (int i = 0; i < JT_KEYS; i++) {
		offs[i] = jt_size(f->dir, "log.0");
		snprintf(key, sizeof(key), "k%d", i);
		snprintf(val, sizeof(val), "v%d", i);
		fx_want(f, fx_kv_set(f, b, key, val), COHORT_OK);
	}
	offs[JT_KEYS] = jt_size(f->dir, "log.0");
}

/* What a test of a filled journal keeps: the clients and offsets of
 * jt_fill and the missing key jt_keys_present reports. jt_filled returns a
 * fresh journalled core filled so. */
struct jt_log {
	struct srq_cli a, b;
	off_t offs[JT_KEYS + 1];
	int missing;
	char log0[512]; /* the path of log.0 */
};

static struct fx *
jt_filled(struct jt_log *l)
{
	struct fx *f = fx_new_journal(0);

	jt_fill(f, &l->a, &l->b, l->offs);
	snprintf(l->log0, sizeof(l->log0), "%s/log.0", f->dir);
	return (f);
}

/* Keys of job b present after a restart (and which one is missing). */
static int
jt_keys_present(struct fx *f, struct srq_cli *b, int *missing)
{
	char key[32];
	int n = 0;

	*missing = -1;
	for (int i = 0; i < JT_KEYS; i++) {
		uintptr_t t;
		Cohort__Reply *r;
		snprintf(key, sizeof(key), "k%d", i);
		t = fx_kv_get(f, b, key, false, 0);
		r = fx_get(f, t)->rep;
		if (r->status == COHORT_OK && r->kv_get->found)
			n++;
		else
			*missing = i;
	}
	return (n);
}

/* Damage at off of log.0: the start is refused naming the file and the
 * offset, the file is left byte for byte; --recover keeps every other
 * key, moves the log aside and the next plain start works. */
static void
jt_damage_case(off_t (*where)(const off_t *offs), int want_missing)
{
	struct jt_log l;
	struct fx *f = jt_filled(&l);
	off_t at;
	char *before, *after, want[64];
	size_t blen, alen;

	at = where(l.offs);
	jt_flip(f->dir, "log.0", at);
	before = jt_read(f->dir, "log.0", &blen);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_msg(strstr(cohort_last_error(), "log.0") != NULL
	        && strstr(cohort_last_error(), "damaged at offset") != NULL
	        && strstr(cohort_last_error(), "--recover") != NULL,
	    "error: %s", cohort_last_error());
	after = jt_read(f->dir, "log.0", &alen);
	ck_assert_uint_eq(alen, blen);
	ck_assert(memcmp(before, after, blen) == 0);
	free(before);
	free(after);

	ck_assert_cohort_ok(fx_reopen(f, true));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS - 1);
	ck_assert_int_eq(l.missing, want_missing);
	ck_assert_int_eq(jt_count(f->dir, "log.0.damaged-"), 1);
	ck_assert_int_lt(jt_size(f->dir, "log.0"), 0);
	/* The recovered state stands on its own from now on. */
	fx_want(f, fx_kv_set(f, &l.b, "after", "x"), COHORT_OK);
	ck_assert_cohort_ok(fx_reopen(f, false));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS - 1);
	jt_want_value(f, &l.b, "after", "x");
	snprintf(want, sizeof(want), "k%d", want_missing);
	jt_want_value(f, &l.b, want, NULL);
	fx_free_journal(f);
}

static off_t
jt_at_first_key(const off_t *offs)
{
	return (offs[0] + 12); /* inside its batch's body */
}

static off_t
jt_at_middle(const off_t *offs)
{
	return ((offs[JT_KEYS / 2] + offs[JT_KEYS / 2 + 1]) / 2);
}

static off_t
jt_at_last(const off_t *offs)
{
	return (offs[JT_KEYS] - 3);
}

START_TEST(test_flip_start_refuses_and_recovers)
{
	jt_damage_case(jt_at_first_key, 0);
}
END_TEST

START_TEST(test_flip_middle_refuses_and_recovers)
{
	jt_damage_case(jt_at_middle, JT_KEYS / 2);
}
END_TEST

START_TEST(test_flip_end_refuses_and_recovers)
{
	/* The last record is whole but fails its CRC: damage, not a torn
	 * write (a crash leaves it short, or zeros). */
	jt_damage_case(jt_at_last, JT_KEYS - 1);
}
END_TEST

START_TEST(test_flip_first_job_recovers_the_other)
{
	/* The first batch holds job a's JOB record (its token) and its
	 * generation: b's records stay, and a is rebuilt from its records
	 * that follow (issue 22: before, all of a's records went). A
	 * stranger cannot claim a; its known client does, and learns that
	 * its generation is gone; then a's key is there for its token. */
	struct jt_log l;
	struct fx *f = jt_filled(&l);
	struct srq_cli stranger, kvonly;

	fx_want(f, fx_kv_set(f, &l.a, "ka", "va"), COHORT_OK);
	jt_flip(f->dir, "log.0", 16 + 20);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "offset 16,"));
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "after 0 whole"));
	ck_assert_cohort_ok(fx_reopen(f, true));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS);
	srq_cli_init(&stranger, "a", 66, 7);
	stranger.token = "mine now";
	fx_want(f, fx_kv_get(f, &stranger, "ka", false, 0), COHORT_EAUTH);
	fx_want(f, fx_kv_get(f, &l.a, "ka", false, 0), COHORT_ESTALE);
	srq_cli_init(&kvonly, "a", 67, 8);
	jt_want_value(f, &kvonly, "ka", "va");
	/* The claim is journalled: a plain restart keeps it. */
	ck_assert_cohort_ok(fx_reopen(f, false));
	jt_want_value(f, &kvonly, "ka", "va");
	fx_want(f, fx_kv_get(f, &stranger, "ka", false, 0), COHORT_EAUTH);
	fx_free_journal(f);
}
END_TEST

START_TEST(test_truncated_mid_record_is_a_torn_tail)
{
	/* A cut inside the last record cannot be told from a crash in its
	 * write: cut off with a warning, the rest kept. */
	struct jt_log l;
	struct fx *f = jt_filled(&l);

	ck_assert_int_eq(truncate(l.log0, l.offs[JT_KEYS - 1] + 5), 0);
	ck_assert_cohort_ok(fx_reopen(f, false));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS - 1);
	ck_assert_int_eq(l.missing, JT_KEYS - 1);
	ck_assert_int_eq(jt_size(f->dir, "log.0"), l.offs[JT_KEYS - 1]);
	/* A tail of zeros (a size that reached the disk before the data)
	 * is torn too. */
	fx_want(f, fx_kv_set(f, &l.b, "z", "zz"), COHORT_OK);
	ck_assert_int_eq(truncate(l.log0, jt_size(f->dir, "log.0") + 100), 0);
	ck_assert_cohort_ok(fx_reopen(f, false));
	jt_want_value(f, &l.b, "z", "zz");
	fx_free_journal(f);
}
END_TEST

START_TEST(test_truncated_header_empty_missing_log)
{
	struct jt_log l;
	struct fx *f = jt_filled(&l);

	/* Cut inside the header. */
	ck_assert_int_eq(truncate(l.log0, 10), 0);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "shorter than"));
	ck_assert_int_eq(jt_size(f->dir, "log.0"), 10);
	/* Empty. */
	ck_assert_int_eq(truncate(l.log0, 0), 0);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_msg(strstr(cohort_last_error(), "log.0 is empty") != NULL,
	    "%s", cohort_last_error());
	ck_assert_int_eq(jt_size(f->dir, "log.0"), 0);
	/* Missing. */
	ck_assert_int_eq(unlink(l.log0), 0);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_msg(strstr(cohort_last_error(), "log.0 is missing") != NULL,
	    "%s", cohort_last_error());
	ck_assert_int_lt(jt_size(f->dir, "log.0"), 0);
	/* --recover: the operator accepts the loss. */
	ck_assert_cohort_ok(fx_reopen(f, true));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), 0);
	ck_assert_cohort_ok(fx_reopen(f, false));
	fx_free_journal(f);
}
END_TEST

START_TEST(test_missing_snapshot_or_log_after_compaction)
{
	struct jt_log l;
	struct fx *f = jt_filled(&l);
	char p[512];

	ck_assert_cohort_ok(srv_snapshot_compact(f->core));
	fx_want(f, fx_kv_set(f, &l.b, "late", "1"), COHORT_OK);
	/* The log of epoch 1 is gone: its keys would be. */
	snprintf(p, sizeof(p), "%s/log.1", f->dir);
	ck_assert_int_eq(unlink(p), 0);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "log.1 is missing"));
	/* The snapshot is gone too. */
	snprintf(p, sizeof(p), "%s/snapshot", f->dir);
	ck_assert_int_eq(unlink(p), 0);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_msg(
	    strstr(cohort_last_error(), "snapshot is missing") != NULL, "%s",
	    cohort_last_error());
	ck_assert_int_eq(fx_reopen(f, true), COHORT_OK);
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), 0);
	fx_free_journal(f);
}
END_TEST

START_TEST(test_bad_magic_and_damaged_snapshot)
{
	struct jt_log l;
	struct fx *f = jt_filled(&l);

	jt_flip(f->dir, "log.0", 0);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "bad magic"));
	ck_assert_cohort_ok(fx_reopen(f, true));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS);
	ck_assert_int_eq(jt_count(f->dir, "log.0.damaged-"), 1);
	/* Now a snapshot (epoch 1): a byte of it flipped is damage (it
	 * was written whole and renamed; no torn tail is possible). */
	jt_flip(f->dir, "snapshot", jt_size(f->dir, "snapshot") / 2);
	ck_assert_int_eq(fx_reopen(f, false), COHORT_EJOURNAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "snapshot"));
	ck_assert_cohort_ok(fx_reopen(f, true));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS - 1);
	ck_assert_int_eq(jt_count(f->dir, "snapshot.damaged-"), 1);
	ck_assert_cohort_ok(fx_reopen(f, false));
	ck_assert_int_eq(jt_keys_present(f, &l.b, &l.missing), JT_KEYS - 1);
	fx_free_journal(f);
}
END_TEST

/* A read-only state directory. Root ignores permission bits, so a
 * read-only tmpfs mount: skipped (with a line) where mount fails. */
START_TEST(test_read_only_dir)
{
	struct fx *f = fx_new_journal(0);
	struct srq_cli c;
	char orig[256];
	cohort_status rv;

	memcpy(orig, f->dir, sizeof(orig));
	snprintf(f->dir, sizeof(f->dir), "%.240s-ro", orig);
	ck_assert_int_eq(mkdir(f->dir, 0700), 0);
	if (!th_tmpfs_mount(f->dir, "size=1m")) {
		fprintf(stderr,
		    "SKIP srv_journal/read_only_dir: cannot mount a tmpfs "
		    "(needs root)\n");
		rmdir(f->dir);
		memcpy(f->dir, orig, sizeof(orig));
		fx_free_journal(f);
		return;
	}
	ck_assert_cohort_ok(fx_reopen(f, false));
	srq_cli_init(&c, "j", 7, 1);
	fx_joined(f, &c, fx_join(f, &c, 0, 1, 1000));
	fx_want(f, fx_kv_set(f, &c, "k", "v"), COHORT_OK);
	srv_journal_close(f->core);
	th_tmpfs_remount(f->dir, true, NULL);
	rv = fx_reopen(f, false);
	th_tmpfs_umount(f->dir);
	rmdir(f->dir);
	ck_assert_int_eq(rv, COHORT_EJOURNAL);
	ck_assert_msg(strstr(cohort_last_error(), "not writable") != NULL
	        && strstr(cohort_last_error(), "Read-only") != NULL
	        && strstr(cohort_last_error(), f->dir) != NULL,
	    "%s", cohort_last_error());
	memcpy(f->dir, orig, sizeof(orig));
	fx_free_journal(f);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* A full disk: what cannot be journalled is not acknowledged               */
/* ------------------------------------------------------------------------ */

/* Mounts a tmpfs of size at f->dir (saved in orig), reopens the journal
 * there and joins client c to job "j"; false (with a SKIP line, the
 * journal freed) where a tmpfs cannot be mounted. */
static bool
jt_full_open(struct fx *f, char *orig, const char *size, const char *test,
    struct srq_cli *c)
{
	char opts[64];

	memcpy(orig, f->dir, sizeof(f->dir));
	snprintf(f->dir, sizeof(f->dir), "%.240s-fs", orig);
	ck_assert_int_eq(mkdir(f->dir, 0700), 0);
	snprintf(opts, sizeof(opts), "size=%s", size);
	if (!th_tmpfs_mount(f->dir, opts)) {
		fprintf(stderr,
		    "SKIP srv_journal/%s: cannot mount a tmpfs (needs root)\n",
		    test);
		rmdir(f->dir);
		memcpy(f->dir, orig, sizeof(f->dir));
		fx_free_journal(f);
		return (false);
	}
	ck_assert_cohort_ok(fx_reopen(f, false));
	srq_cli_init(c, "j", 7, 1);
	fx_joined(f, c, fx_join(f, c, 0, 1, 1000));
	return (true);
}

static void
jt_umount(struct fx *f, const char *orig)
{
	srv_core_free(f->core);
	ck_assert_cohort_ok(
	    srv_core_new(&(struct srv_limits) { .max_value = 1u << 20,
	                     .max_job_bytes = 1u << 24,
	                     .max_keys = 1000 },
	        NULL, fx_sink, f, f->now, &f->core));
	th_tmpfs_umount(f->dir);
	rmdir(f->dir);
	memcpy(f->dir, orig, sizeof(f->dir));
}

static int64_t
jt_counter(struct fx *f, struct srq_cli *c, const char *key)
{
	uintptr_t t = fx_kv_get(f, c, key, false, 0);
	Cohort__Reply *r = fx_want(f, t, COHORT_OK);
	char buf[32];
	struct fx_reply *x = fx_get(f, t);

	if (!r->kv_get->found)
		return (0);
	ck_assert_uint_lt(x->plen, sizeof(buf));
	memcpy(buf, x->pl, x->plen);
	buf[x->plen] = '\0';
	return (strtoll(buf, NULL, 10));
}

START_TEST(test_full_disk_not_acknowledged)
{
	struct fx *f = fx_new_journal(0);
	struct srq_cli c;
	char orig[256], val[200], key[32];
	int64_t acked = 0, refused = 0, first_refused = -1;
	char *text;

	if (!jt_full_open(f, orig, "64k", "full_disk", &c))
		return;
	memset(val, 'v', sizeof(val) - 1);
	val[sizeof(val) - 1] = '\0';
	/* Adds and sets until the disk is full, and 100 more. */
	for (int i = 0; i < 3000 && refused < 100; i++) {
		uintptr_t t = fx_kv_add(f, &c, "n", 1, 0);
		Cohort__Reply *r = fx_get(f, t)->rep;
		if (r->status == COHORT_OK) {
			ck_assert_int_eq(refused, 0);
			acked++;
		} else {
			ck_assert_msg(r->status == COHORT_EJOURNAL, "%s: %s",
			    cohort_status_name(r->status), r->error);
			ck_assert_msg(strstr(r->error, f->dir) != NULL
			        && strstr(r->error, "No space left") != NULL,
			    "%s", r->error);
			if (first_refused < 0)
				first_refused = i;
			refused++;
		}
		snprintf(key, sizeof(key), "s%d", i % 50);
		t = fx_kv_set(f, &c, key, val);
		ck_assert_int_ne(fx_get(f, t)->rep->status, COHORT_EPROTO);
	}
	ck_assert_int_gt(acked, 10);
	ck_assert_msg(refused == 100,
	    "%" PRId64 " adds acknowledged, %" PRId64 " refused on a 64 KiB "
	    "file system",
	    acked, refused);
	ck_assert_ptr_nonnull(srv_jrn_problem(f->core->jrn));
	text = srv_metrics_text(f->core, f->now);
	ck_assert_ptr_nonnull(strstr(text, "cohort_journal_writable 0"));
	free(text);
	/* Reads still work. */
	fx_want(f, fx_kv_get(f, &c, "n", false, 0), COHORT_OK);
	/* kill -9 and a restart (on the full disk): every acknowledged
	 * add is there, nothing else. */
	ck_assert_cohort_ok(fx_reopen(f, false));
	ck_assert_int_eq(jt_counter(f, &c, "n"), acked);
	/* Room again: changes are accepted once the retry (every second)
	 * wrote a snapshot. */
	th_tmpfs_remount(f->dir, false, "size=4m");
	fx_want(f, fx_kv_add(f, &c, "n", 1, 0), COHORT_OK);
	ck_assert_ptr_null(srv_jrn_problem(f->core->jrn));
	ck_assert_cohort_ok(fx_reopen(f, false));
	ck_assert_int_eq(jt_counter(f, &c, "n"), acked + 1);
	jt_umount(f, orig);
	fx_free_journal(f);
}
END_TEST

START_TEST(test_full_disk_recovers_in_place)
{
	/* The same without a restart: the disk fills, changes are refused
	 * (not applied), room comes back, the retry's snapshot holds the
	 * state and the service resumes. */
	struct fx *f = fx_new_journal(0);
	struct srq_cli c;
	char orig[256], val[400];
	int64_t acked = 0;
	bool full = false;

	if (!jt_full_open(f, orig, "32k", "full_disk_recovers", &c))
		return;
	memset(val, 'v', sizeof(val) - 1);
	val[sizeof(val) - 1] = '\0';
	for (int i = 0; i < 2000 && !full; i++) {
		Cohort__Reply *r = fx_get(f, fx_kv_add(f, &c, "n", 1, 0))->rep;
		if (r->status == COHORT_OK)
			acked++;
		else
			full = true;
		fx_kv_set(f, &c, "big", val);
	}
	ck_assert(full);
	/* Refused now, and again after the retry interval (still full). */
	fx_want(f, fx_kv_add(f, &c, "n", 1, 0), COHORT_EJOURNAL);
	fx_tick(f, 1100);
	fx_want(f, fx_kv_add(f, &c, "n", 1, 0), COHORT_EJOURNAL);
	/* The refused adds were not applied. The one that met the full
	 * disk was (in memory): it was answered EJOURNAL, "may be lost". */
	ck_assert_int_le(jt_counter(f, &c, "n") - acked, 1);
	th_tmpfs_remount(f->dir, false, "size=4m");
	/* Within the retry interval: still refused; after it, accepted. */
	fx_want(f, fx_kv_add(f, &c, "n", 1, 0), COHORT_EJOURNAL);
	fx_tick(f, 1100);
	ck_assert_ptr_null(srv_jrn_problem(f->core->jrn));
	acked = fx_want(f, fx_kv_add(f, &c, "n", 1, 0), COHORT_OK)
	            ->kv_add->value;
	ck_assert_cohort_ok(fx_reopen(f, false));
	ck_assert_int_eq(jt_counter(f, &c, "n"), acked);
	jt_umount(f, orig);
	fx_free_journal(f);
}
END_TEST

Suite *
suite_srv_journal(void)
{
	const TTest *journal[]
	    = { test_crc32c, test_compaction, test_journal_cost, NULL };
	/* on a journalled core of their own: f */
	const TTest *restart[] = { test_kv_survives_restart,
		test_retried_add_after_restart, test_torn_last_record,
		test_members_and_barrier_across_restart,
		test_groups_and_leave_across_restart,
		test_one_left_across_restart,
		test_keys_before_first_generation, test_state_dir_locked,
		NULL };
	const TTest *integrity[] = { test_flip_start_refuses_and_recovers,
		test_flip_middle_refuses_and_recovers,
		test_flip_end_refuses_and_recovers,
		test_flip_first_job_recovers_the_other,
		test_truncated_mid_record_is_a_torn_tail,
		test_truncated_header_empty_missing_log,
		test_missing_snapshot_or_log_after_compaction,
		test_bad_magic_and_damaged_snapshot, test_read_only_dir,
		NULL };
	const TTest *full_disk[] = { test_full_disk_not_acknowledged,
		test_full_disk_recovers_in_place, NULL };
	const struct unit_case cases[] = {
		{ "journal", 60, journal, NULL, NULL, NULL },
		{ "restart", 60, restart, NULL, fx_setup_journal,
		    fx_teardown_journal },
		{ "integrity", 60, integrity, NULL, NULL, NULL },
		{ "full_disk", 60, full_disk, NULL, NULL, NULL },
		{ NULL, 0, NULL, NULL, NULL, NULL },
	};

	return (unit_suite_cases("srv_journal", cases));
}
