/*
 * test_tcp_xfer.c - the tcp backend's transfer engines
 * (client/backend/host/xfer.c) when a peer disappears mid-collective, when
 * the run is aborted (abort() or the group's flag) and at its deadline,
 * in every mode of tcp_fixture.h; and that the time a rank waits for a
 * late peer is counted as waiting (op stats), on every path.
 */
#include <inttypes.h>
#include <poll.h>
#include <string.h>

#include "tcp_fixture.h"
#include "unit_suite.h"

/* Ranks 0 and 1 allreduce 32 MiB; rank 2 closes its connections once
 * they are in the call. Loops 0-2: every mode of tcp_fixture.h with the
 * agreement of every rank with every other, in which each rank sees the
 * vanished one itself; loop 3: pure TCP with the agreement
 * by the recursive-doubling fold (the default with more ranks than CPUs,
 * and for large groups), in which rank 0 hears only from rank 1: rank 1
 * names rank 102 at once, and rank 0 ends at its deadline (3 s here)
 * naming the rank it waited for. In a job, the coordinator's failure
 * notice aborts rank 0's wait before that, naming rank 102 (fault_data). */
static int tt_vanish_ms = 20000;

static void
tt_body_vanish(struct tt_group *g, int r, void *state)
{
	size_t count = 8u << 20;
	float *buf;
	struct cohort__op op;
	int64_t t0;

	if (r == 2) {
		th_wait_until(tt_in_run_ge, g, 500, 10);
		/* abort() shuts the sockets down: a hard disappearance. */
		cohort__host_backend.abort(state);
		return;
	}
	buf = calloc(count, sizeof(float));
	op = tt_sum_op(buf, count, 12);
	atomic_fetch_add(&g->in_run, 1);
	t0 = cohort__now_ms();
	g->run_rv[r] = cohort__host_backend.run(state, &op, g->run_err[r],
	    TT_ERRLEN, cohort__now_ms() + tt_vanish_ms);
	g->run_ms[r] = cohort__now_ms() - t0;
	free(buf);
}

START_TEST(test_tcp_peer_vanishes_mid_allreduce)
{
	static struct tt_group g;
	struct tt_store s;
	bool fold = _i == TT_NMODES;
	int mode = fold ? TT_PURE : _i;

	setenv("COHORT_TCP_AGREE_FOLD", fold ? "1" : "0", 1);
	tt_vanish_ms = fold ? 3000 : 20000;
	tt_set_mode(mode);
	tt_store_init(&s);
	tt_group_setup(&g, &s, 3, "vanish", tt_body_vanish);
	g.iters = 2;
	tt_group_start(&g, 0);
	tt_group_join(&g);
	unsetenv("COHORT_TCP_AGREE_FOLD");
	tt_assert_mode(&g, mode);
	if (fold) {
		ck_assert_msg(g.run_rv[1] == COHORT_EPEERLOST
		        && strstr(g.run_err[1], "rank 102") != NULL,
		    "rank 1: %s: %s", cohort_status_name(g.run_rv[1]),
		    g.run_err[1]);
		ck_assert_int_lt(g.run_ms[1], 5000);
		ck_assert_msg(g.run_rv[0] != COHORT_OK
		        && strstr(g.run_err[0], "allreduce #12") != NULL,
		    "rank 0: %s: %s", cohort_status_name(g.run_rv[0]),
		    g.run_err[0]);
		ck_assert_int_lt(g.run_ms[0], 5000);
		tt_store_fini(&s);
		return;
	}
	for (int r = 0; r < 2; r++) {
		ck_assert_msg(g.run_rv[r] == COHORT_EPEERLOST,
		    "rank %d: %s: %s", r, cohort_status_name(g.run_rv[r]),
		    g.run_err[r]);
		ck_assert_msg(strstr(g.run_err[r], "rank 102") != NULL
		        && strstr(g.run_err[r], "allreduce #12") != NULL,
		    "rank %d: %s", r, g.run_err[r]);
		ck_assert_int_lt(g.run_ms[r], 5000);
	}
	tt_store_fini(&s);
}
END_TEST

struct tt_aborter {
	struct tt_group *g;
	void *state;
	bool use_flag;
};

static void *
tt_abort_thread(void *arg)
{
	struct tt_aborter *a = arg;

	th_wait_until(tt_in_run_ge, a->g, 500, 10);
	/* Let the run reach poll(). */
	(void)poll(NULL, 0, 50);
	if (a->use_flag)
		atomic_store(&a->g->abort_flag[0], 1);
	else
		cohort__host_backend.abort(a->state);
	return (NULL);
}

/* Rank 0 allreduces alone (rank 1 never joins the call) and is aborted
 * from another thread; then a deadline case. */
static void
tt_body_abort(struct tt_group *g, int r, void *state)
{
	float buf[1000] = { 0 };
	struct cohort__op op = tt_sum_op(buf, 1000, 3);
	struct tt_aborter ab = { g, state, g->seed == 1 };
	pthread_t th;
	int64_t t0;

	if (r != 0)
		return;
	/* Deadline first: names the rank we wait for. */
	t0 = cohort__now_ms();
	g->run_rv[1] = cohort__host_backend.run(
	    state, &op, g->run_err[1], TT_ERRLEN, cohort__now_ms() + 300);
	g->run_ms[1] = cohort__now_ms() - t0;

	op.seq = 4;
	ck_assert_int_eq(pthread_create(&th, NULL, tt_abort_thread, &ab), 0);
	atomic_fetch_add(&g->in_run, 1);
	t0 = cohort__now_ms();
	g->run_rv[0] = cohort__host_backend.run(
	    state, &op, g->run_err[0], TT_ERRLEN, cohort__now_ms() + 20000);
	g->run_ms[0] = cohort__now_ms() - t0;
	pthread_join(th, NULL);
}

START_TEST(test_tcp_abort_unblocks_run)
{
	static struct tt_group g;
	struct tt_store s;

	tt_set_mode(_i / 2);
	tt_store_init(&s);
	tt_group_setup(&g, &s, 2, "abort", tt_body_abort);
	g.iters = 1;
	g.seed = (uint64_t)(_i % 2); /* 0: abort(), 1: the group's flag */
	tt_group_start(&g, 0);
	tt_group_join(&g);
	tt_assert_mode(&g, _i / 2);
	ck_assert_msg(g.run_rv[1] == COHORT_ETIMEDOUT, "%s: %s",
	    cohort_status_name(g.run_rv[1]), g.run_err[1]);
	ck_assert_has(g.run_err[1], "waiting for rank 101");
	ck_assert_int_lt(g.run_ms[1], 1500);
	ck_assert_msg(g.run_rv[0] == COHORT_EABORTED, "%s: %s",
	    cohort_status_name(g.run_rv[0]), g.run_err[0]);
	/* 50 ms head start + at most one poll period. */
	ck_assert_int_lt(g.run_ms[0], 2000);
	tt_store_fini(&s);
}
END_TEST

/* Waiting for a late peer (op stats, backend.h): rank 2 enters every
 * operation 300 ms after the others. */
#define TW_LATE_MS 300
#define TW_OPS 5
static const char *const tw_names[TW_OPS] = { "allreduce 4 KB",
	"allreduce 4 MB", "barrier", "broadcast 64 KB", "allgather 1 MB" };
static uint64_t tw_wait[TT_MAX_RANKS][TW_OPS + 1];
static int64_t tw_ms[TT_MAX_RANKS][TW_OPS + 1];

static void
tt_body_late(struct tt_group *g, int r, void *state)
{
	size_t counts[TW_OPS] = { 1024, 1u << 20, 0, 16384, 262144 };
	enum cohort__op_kind kinds[TW_OPS]
	    = { COHORT__OP_ALLREDUCE, COHORT__OP_ALLREDUCE, COHORT__OP_BARRIER,
		      COHORT__OP_BROADCAST, COHORT__OP_ALLGATHER };
	float *buf = calloc((size_t)g->n << 20, sizeof(float));

	for (int k = 0; k < TW_OPS && buf != NULL; k++) {
		struct cohort__op op = tt_sum_op(buf, counts[k], 20 + k);
		struct cohort__op_stats st = { NULL, 0 };
		int64_t t0;

		op.kind = kinds[k];
		if (op.kind == COHORT__OP_ALLGATHER)
			op.send = buf + ((size_t)g->n << 20) - counts[k];
		op.stats = &st;
		if (r == 2)
			(void)poll(NULL, 0, TW_LATE_MS);
		t0 = cohort__now_ms();
		g->run_rv[r] = cohort__host_backend.run(state, &op,
		    g->run_err[r], TT_ERRLEN, cohort__now_ms() + 20000);
		tw_ms[r][k] = cohort__now_ms() - t0;
		tw_wait[r][k] = st.wait_ns;
		if (g->run_rv[r] != COHORT_OK)
			break;
	}
	/* A wait that ends in a failure is waiting too: rank 0 alone. */
	if (r == 0 && g->run_rv[r] == COHORT_OK) {
		struct cohort__op op = tt_sum_op(buf, 1024, 30);
		struct cohort__op_stats st = { NULL, 0 };
		char err[TT_ERRLEN];

		op.stats = &st;
		tw_ms[r][TW_OPS] = cohort__now_ms();
		(void)cohort__host_backend.run(
		    state, &op, err, sizeof(err), cohort__now_ms() + 300);
		tw_ms[r][TW_OPS] = cohort__now_ms() - tw_ms[r][TW_OPS];
		tw_wait[r][TW_OPS] = st.wait_ns;
	}
	free(buf);
}

START_TEST(test_tcp_wait_for_late_peer_is_counted)
{
	static struct tt_group g;
	struct tt_store s;

	tt_set_mode(_i);
	tt_store_init(&s);
	tt_group_setup(&g, &s, 3, "late", tt_body_late);
	tt_group_start(&g, 0);
	tt_group_join(&g);
	tt_assert_mode(&g, _i);
	for (int r = 0; r < 3; r++)
		ck_assert_msg(g.run_rv[r] == COHORT_OK, "rank %d: %s: %s", r,
		    cohort_status_name(g.run_rv[r]), g.run_err[r]);
	for (int k = 0; k < TW_OPS; k++) {
		for (int r = 0; r < 3; r++) {
			uint64_t ms = tw_wait[r][k] / 1000000u;

			ck_assert_msg(ms <= (uint64_t)tw_ms[r][k] + 1,
			    "%s: rank %d waited %" PRIu64 " ms in %" PRId64
			    " ms",
			    tw_names[k], r, ms, tw_ms[r][k]);
			/* The early ranks waited for the late one; it,
			 * hardly (the machine may be loaded). */
			if (r < 2)
				ck_assert_msg(ms >= TW_LATE_MS - 60,
				    "%s: rank %d waited %" PRIu64 " ms for a "
				    "peer %d ms late (op took %" PRId64 " ms)",
				    tw_names[k], r, ms, TW_LATE_MS,
				    tw_ms[r][k]);
			else
				ck_assert_msg(ms < TW_LATE_MS / 2,
				    "%s: the late rank waited %" PRIu64 " ms",
				    tw_names[k], ms);
		}
	}
	ck_assert_msg(tw_wait[0][TW_OPS] / 1000000u >= 250,
	    "a run that timed out after %" PRId64 " ms counted %" PRIu64
	    " ms of waiting",
	    tw_ms[0][TW_OPS], tw_wait[0][TW_OPS] / 1000000u);
	tt_store_fini(&s);
}
END_TEST

Suite *suite_tcp_xfer(void);

Suite *
suite_tcp_xfer(void)
{
	const struct unit_loop loops[]
	    = { { test_tcp_peer_vanishes_mid_allreduce, TT_NMODES + 1 },
		      { test_tcp_abort_unblocks_run, 2 * TT_NMODES },
		      { test_tcp_wait_for_late_peer_is_counted, TT_NMODES },
		      { NULL, 0 } };

	return (unit_suite_loops("tcp_xfer", "failures", 60, NULL, loops));
}
