/*
 * seed_dispatch.c - seed corpus of fuzz_dispatch, encoded by the
 * project's own encoder: rendezvous, KV, collectives, groups, watches,
 * failures, leaves, status queries, sweeps and closed connections.
 *
 * Usage: seed_dispatch DIR
 */
#include "fuzz_common.h"

int
main(int argc, char **argv)
{
	struct fz_buf b;
	struct srq_cli c[3];
	const char *dir = argc > 1 ? argv[1] : ".";
	int nseeds = 0;
	char name[64];

#define SEED()                                                                \
	do {                                                                  \
		snprintf(name, sizeof(name), "seed-%02d", nseeds++);          \
		fz_write(dir, name, b.p, b.len);                              \
		free(b.p);                                                    \
		memset(&b, 0, sizeof(b));                                     \
	} while (0)

	memset(&b, 0, sizeof(b));
	/* 1: a world of one and its keys. */
	fz_world(&b, c, 1, "solo", 11);
	fz_kv_set(&b, &c[0], "addr", "10.0.0.1:4000");
	fz_kv_add(&b, &c[0], "ctr", 5);
	fz_kv_get(&b, &c[0], "addr", false);
	fz_kv_get(&b, &c[0], "absent", true);
	fz_sweep(&b, 50);
	SEED();

	/* 2: two ranks, a barrier, a broadcast, reductions, a decision. */
	fz_world(&b, c, 2, "pair", 21);
	for (int i = 0; i < 2; i++)
		fz_coll(&b, &c[i], COHORT__COLLECTIVE_KIND__COLL_BARRIER, "",
		    1, NULL, 0);
	fz_coll(&b, &c[0], COHORT__COLLECTIVE_KIND__COLL_BROADCAST, "", 2,
	    "object", 6);
	fz_coll(&b, &c[1], COHORT__COLLECTIVE_KIND__COLL_BROADCAST, "", 2,
	    NULL, 0);
	for (int i = 0; i < 2; i++)
		fz_coll(&b, &c[i],
		    COHORT__COLLECTIVE_KIND__COLL_REDUCE_SCALARS, "", 3, NULL,
		    0);
	for (int i = 0; i < 2; i++)
		fz_coll(&b, &c[i], COHORT__COLLECTIVE_KIND__COLL_DECIDE, "", 4,
		    NULL, 0);
	SEED();

	/* 3: a group, a heartbeat, a watch, a failure report. */
	fz_world(&b, c, 3, "grp", 31);
	{
		struct srq q;
		Cohort__Watch w = COHORT__WATCH__INIT;
		Cohort__ReportFailure rf = COHORT__REPORT_FAILURE__INIT;
		int32_t ranks[2] = { 0, 2 };
		fz_group(&b, &c[0], "pair", ranks, 2);
		fz_group(&b, &c[2], "pair", ranks, 2);
		fz_coll(&b, &c[0], COHORT__COLLECTIVE_KIND__COLL_BARRIER,
		    "pair", 1, NULL, 0);
		fz_send(&b, &c[1],
		    srq_heartbeat(&q, "allreduce", 3, "", true, 70000), NULL,
		    0);
		fz_simple(&b, &c[1], COHORT__REQUEST__BODY_WATCH, &w, NULL, 0);
		fz_sweep(&b, 255);
		rf.text = "Traceback: boom";
		fz_simple(&b, &c[2], COHORT__REQUEST__BODY_REPORT_FAILURE, &rf,
		    NULL, 0);
	}
	SEED();

	/* 4: the rest of the KV store. */
	fz_world(&b, c, 1, "kv", 41);
	{
		Cohort__KvCompareSet cs = COHORT__KV_COMPARE_SET__INIT;
		Cohort__KvDelete d = COHORT__KV_DELETE__INIT;
		Cohort__KvNumKeys nk = COHORT__KV_NUM_KEYS__INIT;
		Cohort__KvWait kw = COHORT__KV_WAIT__INIT;
		Cohort__KvCheck kc = COHORT__KV_CHECK__INIT;
		Cohort__KvAppend ap = COHORT__KV_APPEND__INIT;
		Cohort__KvMultiGet mg = COHORT__KV_MULTI_GET__INIT;
		Cohort__KvMultiSet ms = COHORT__KV_MULTI_SET__INIT;
		char *keys[2] = { "a", "b" };
		uint64_t lens[2] = { 1, 2 };
		cs.key = "cas";
		cs.expected_present = false;
		fz_simple(&b, &c[0], COHORT__REQUEST__BODY_KV_COMPARE_SET, &cs,
		    "new", 3);
		ms.n_keys = 2;
		ms.keys = keys;
		ms.n_value_lens = 2;
		ms.value_lens = lens;
		fz_simple(&b, &c[0], COHORT__REQUEST__BODY_KV_MULTI_SET, &ms,
		    "xyy", 3);
		mg.n_keys = 2;
		mg.keys = keys;
		fz_simple(&b, &c[0], COHORT__REQUEST__BODY_KV_MULTI_GET, &mg,
		    NULL, 0);
		ap.key = "log";
		fz_simple(
		    &b, &c[0], COHORT__REQUEST__BODY_KV_APPEND, &ap, "ab", 2);
		kw.n_keys = 2;
		kw.keys = keys;
		fz_simple(
		    &b, &c[0], COHORT__REQUEST__BODY_KV_WAIT, &kw, NULL, 0);
		kc.n_keys = 2;
		kc.keys = keys;
		fz_simple(
		    &b, &c[0], COHORT__REQUEST__BODY_KV_CHECK, &kc, NULL, 0);
		d.key = "a";
		fz_simple(
		    &b, &c[0], COHORT__REQUEST__BODY_KV_DELETE, &d, NULL, 0);
		fz_simple(&b, &c[0], COHORT__REQUEST__BODY_KV_NUM_KEYS, &nk,
		    NULL, 0);
	}
	SEED();

	/* 5: a rank's connection closes mid-barrier; a leave; status. */
	fz_world(&b, c, 2, "drop", 51);
	fz_coll(
	    &b, &c[0], COHORT__COLLECTIVE_KIND__COLL_BARRIER, "", 1, NULL, 0);
	fz_close(&b, 2);
	{
		Cohort__Leave lv = COHORT__LEAVE__INIT;
		Cohort__StatusQuery sq = COHORT__STATUS_QUERY__INIT;
		fz_simple(
		    &b, &c[0], COHORT__REQUEST__BODY_LEAVE, &lv, NULL, 0);
		fz_simple(&b, &c[0], COHORT__REQUEST__BODY_STATUS_QUERY, &sq,
		    NULL, 0);
		sq.job = "drop";
		fz_simple(&b, &c[0], COHORT__REQUEST__BODY_STATUS_QUERY, &sq,
		    NULL, 0);
	}
	fz_sweep(&b, 200);
	SEED();

	/* 6: a retried request (same seq) and a stale generation. */
	fz_world(&b, c, 1, "retry", 61);
	fz_kv_add(&b, &c[0], "n", 1);
	c[0].seq--;
	fz_kv_add(&b, &c[0], "n", 1);
	c[0].gen = 9;
	fz_kv_add(&b, &c[0], "n", 1);
	SEED();

	/* 7: elastic (README section 8): a world of 4 (2..4); a member's
	 * connection closes (a shrink); the old generation's barrier; the
	 * others reform, the one removed too; a joiner; a boundary admits
	 * it; a boundary after the transfer names no roles. */
	{
		struct srq_cli e[4], j;
		fz_world_el(&b, e, 4, "el", 71, 1, 2);
		fz_close(&b, 2);
		fz_coll(&b, &e[0], COHORT__COLLECTIVE_KIND__COLL_BARRIER, "",
		    1, NULL, 0);
		for (int i = 0; i < 4; i++) {
			fz_reform(&b, &e[i]);
			e[i].gen = 2;
			e[i].rank = i == 0 ? 0 : i - 1;
		}
		srq_cli_init(&j, "el", 75, 1);
		fz_join_el(&b, &j, -1, 2, 4);
		fz_boundary(&b, &e[0], 1, true);
		fz_boundary(&b, &e[2], 1, true);
		fz_boundary(&b, &e[3], 1, true);
		j.rank = 3;
		j.gen = 3;
		fz_boundary(&b, &j, 1, false);
		fz_sweep(&b, 255);
	}
	SEED();

	printf("seed_dispatch: %d seeds in %s\n", nseeds, dir);
	return (0);
}
