/*
 * test_srv_stall.c - live hang attribution and the timeout hierarchy,
 * without sockets: a parked barrier past the stall threshold names the
 * missing rank and what it does instead (status, metrics, the timeout's
 * text); a data-plane op seen through heartbeats likewise; a join whose
 * heartbeat is not shorter than its dead-after is refused; a request of a
 * connection whose close was already seen is dropped; the verdict from
 * the job's own rhythm.
 */
#include <inttypes.h>
#include <string.h>

#include "srv_fixture.h"
#include "state/stall.h"
#include "unit_suite.h"

Suite *suite_srv_stall(void);

static Cohort__JobStatus *
st_status(struct fx *f, struct srq_cli *c)
{
	Cohort__Reply *r = fx_status(f, c, "", COHORT_OK);

	ck_assert_uint_eq(r->status_query->n_jobs, 1);
	return (r->status_query->jobs[0]);
}

static Cohort__PendingOp *
st_stalled(Cohort__JobStatus *js)
{
	for (size_t i = 0; i < js->n_pending; i++)
		if (js->pending[i]->stalled)
			return (js->pending[i]);
	return (NULL);
}

/* What a rank's heartbeats say: in op #seq (since the start of the run)
 * when in_op, else past it. */
struct st_hb {
	const char *op;
	uint64_t seq;
	bool in_op;
};

/* Ticks ms in steps of a second; every rank of c[0..n) heartbeats each
 * step with hb[i]. With done, its metrics ride on the heartbeat: a rank
 * not in_op does ops_per_s more operations every second, done[i] in all;
 * without, it sends none. */
static void
st_run(struct fx *f, struct srq_cli *c, int n, const struct st_hb *hb,
    uint64_t *done, uint64_t ops_per_s, cohort__time ms)
{
	for (cohort__time t = 0; t < ms; t += 1000) {
		for (int i = 0; i < n; i++) {
			Cohort__RankMetrics rm = COHORT__RANK_METRICS__INIT;
			Cohort__OpMetrics om = COHORT__OP_METRICS__INIT;
			Cohort__OpMetrics *omp = &om;
			struct srq q;

			srq_heartbeat(&q, hb[i].op, hb[i].seq, "", hb[i].in_op,
			    hb[i].in_op ? (uint64_t)t : 0);
			if (done != NULL) {
				if (!hb[i].in_op)
					done[i] += ops_per_s;
				om.op = "allreduce";
				om.count = done[i];
				rm.ops = &omp;
				rm.n_ops = 1;
				q.b.hb.metrics = &rm;
			}
			fx_want(
			    f, fx_send(f, &c[i], &q.rq, NULL, 0), COHORT_OK);
		}
		fx_tick(f, 1000);
	}
}

/* op is the stalled operation (of a data-plane op when data_plane) #seq,
 * waiting for rank missing alone, and its detail says want. */
static void
st_expect_stalled(const Cohort__PendingOp *op, bool data_plane, uint64_t seq,
    int32_t missing, const char *want)
{
	ck_assert_ptr_nonnull(op);
	ck_assert_int_eq(op->data_plane, data_plane);
	ck_assert_uint_eq(op->op_seq, seq);
	ck_assert_uint_eq(op->n_missing, 1);
	ck_assert_int_eq(op->missing[0], missing);
	ck_assert_has(op->detail, want);
}

START_TEST(test_control_plane_stall)
{
	struct srq_cli c[3];
	uintptr_t t0, t1;
	Cohort__Reply *r;
	const struct st_hb hb[3] = { { "barrier", 17, true },
		{ "barrier", 17, true }, { "allreduce", 812, true } };
	char *text;

	fx_form(f, c, 3, "j");
	f->core->stall_ms = 10000;
	t0 = fx_barrier(f, &c[0], "epoch-3", 17, 30000);
	t1 = fx_barrier(f, &c[1], "epoch-3", 17, 30000);
	/* Below the threshold: pending, not stalled. */
	st_run(f, c, 3, hb, NULL, 0, 5000);
	ck_assert_ptr_null(st_stalled(st_status(f, &c[2])));
	ck_assert_uint_eq(f->core->m.stalls, 0);
	st_run(f, c, 3, hb, NULL, 0, 7000);
	/* Logged once, shown in status and metrics. Rank 2's allreduce
	 * is stalled too (ranks 0 and 1 are in the barrier): the two lines
	 * together show the cross-wait. */
	ck_assert_uint_eq(f->core->m.stalls, 2);
	st_run(f, c, 3, hb, NULL, 0, 3000);
	ck_assert_uint_eq(f->core->m.stalls, 2);
	st_expect_stalled(st_stalled(st_status(f, &c[2])), false, 17, 2,
	    "barrier 'epoch-3' (#17) on group '' waiting 15.0 s: rank 2 has "
	    "not entered; rank 2 is in allreduce #812 since ");
	text = srv_metrics_text(f->core, f->now);
	ck_assert_has(text, "cohort_stalled_ops 2\n");
	ck_assert_has(text, "cohort_stalls_total 2\n");
	free(text);
	/* The timeout names the missing rank, what it does and the
	 * liveness bound that did not fire. */
	st_run(f, c, 3, hb, NULL, 0, 16000);
	r = fx_want(f, t0, COHORT_ETIMEDOUT);
	ck_assert_has(r->error,
	    "barrier 'epoch-3' (#17) timed out after 30.0 s; rank 2 never "
	    "arrived (rank 2 in allreduce #812); heartbeat dead-after is 5.0 "
	    "s");
	ck_assert_uint_eq(r->n_missing_ranks, 1);
	fx_want(f, t1, COHORT_ETIMEDOUT);
}
END_TEST

START_TEST(test_missing_rank_last_seen)
{
	struct srq_cli c[2];
	uintptr_t t0;
	Cohort__Reply *r;
	const struct st_hb hb[2]
	    = { { "barrier", 17, true }, { "barrier", 16, false } };

	fx_form(f, c, 2, "j");
	t0 = fx_barrier(f, &c[0], "x", 17, 3000);
	st_run(f, c, 2, hb, NULL, 0, 3000);
	r = fx_want(f, t0, COHORT_ETIMEDOUT);
	ck_assert_has(r->error,
	    "rank 1 never arrived (rank 1 last seen 1.0 s ago after barrier "
	    "#16)");
}
END_TEST

START_TEST(test_data_plane_stall)
{
	struct srq_cli c[3];
	Cohort__JobStatus *js;
	Cohort__PendingOp *op;
	struct st_hb hb[3] = { { "allreduce", 812, true },
		{ "allreduce", 812, true }, { "allreduce", 811, false } };
	char *text;

	fx_form(f, c, 3, "j");
	f->core->stall_ms = 10000;
	st_run(f, c, 3, hb, NULL, 0, 9000);
	ck_assert_ptr_null(st_stalled(st_status(f, &c[0])));
	st_run(f, c, 3, hb, NULL, 0, 4000);
	ck_assert_uint_eq(f->core->m.stalls, 1);
	js = st_status(f, &c[0]);
	op = st_stalled(js);
	st_expect_stalled(op, true, 812, 2,
	    "allreduce #812 on group '' waiting 13.0 s: rank 2 has not "
	    "entered; rank 2 last seen 1.0 s ago doing allreduce #811");
	ck_assert_str_eq(op->kind, "allreduce");
	ck_assert_uint_eq(op->n_arrived, 2);
	ck_assert(js->members[0]->in_op);
	ck_assert_uint_ge(js->members[0]->in_op_ms, 13000);
	text = srv_metrics_text(f->core, f->now);
	ck_assert_has(text, "cohort_stalled_ops 1\n");
	free(text);
	/* Rank 2 catches up: the stall is over. */
	for (int i = 0; i < 3; i++)
		hb[i] = (struct st_hb) { "allreduce", 813, false };
	st_run(f, c, 3, hb, NULL, 0, 2000);
	ck_assert_ptr_null(st_stalled(st_status(f, &c[0])));
}
END_TEST

START_TEST(test_join_heartbeat_order)
{
	struct srq_cli c;
	struct srq q;
	Cohort__Request *rq;
	Cohort__Reply *r;

	srq_cli_init(&c, "j", 1, 1);
	/* a heartbeat interval as long as dead-after (5000 ms) */
	rq = srq_join(&q, &c, 0, 1, -1, 0);
	q.b.join.heartbeat_ms = 5000;
	r = fx_want(f, fx_send(f, &c, rq, NULL, 0), COHORT_EINVAL);
	ck_assert_has(r->error, "heartbeat interval 5000 ms");
	ck_assert_has(r->error, "dead-after 5000 ms");
	/* Defaults fill in a zero: 1000 < 3000 is fine. */
	q.b.join.heartbeat_ms = 0;
	q.b.join.dead_after_ms = 3000;
	rq->seq = 0;
	fx_want(f, fx_send(f, &c, rq, NULL, 0), COHORT_OK);
}
END_TEST

START_TEST(test_request_after_close_is_dropped)
{
	struct srq_cli c[2];
	uintptr_t t;
	size_t drops;

	srq_cli_init(&c[0], "j", 1, 7);
	srq_cli_init(&c[1], "j", 2, 8);
	/* The join left over connection 7 before its close event was
	 * handled; handled after it, it must not make a member bound to a
	 * dead connection. */
	srv_core_pipe_closed(f->core, 7, f->now);
	drops = f->ndrop;
	t = fx_join(f, &c[0], 0, 2, 60000);
	ck_assert_ptr_null(fx_get(f, t));
	ck_assert_uint_eq(f->ndrop, drops + 1);
	ck_assert_uint_eq(f->core->m.dropped_closed, 1);
	/* Re-sent over a new connection, it works. */
	c[0].pipe = 9;
	c[0].seq = 0;
	t = fx_join(f, &c[0], 0, 2, 60000);
	fx_joined(f, &c[1], fx_join(f, &c[1], 1, 2, 60000));
	fx_joined(f, &c[0], t);
	/* The closed-pipe memory is pruned after a minute. */
	fx_tick(f, 61000);
	ck_assert_uint_eq(f->core->closed.n, 0);
}
END_TEST

/* The job's own rhythm: at 100 operations a second per rank (10 ms each),
 * an operation waiting past 20 x 10 ms, but at least the 5 s floor, is
 * stalled, long before --stall-threshold (60 s); --stall-factor 0 turns
 * that off; without metrics the threshold alone decides (the tests
 * above). */
START_TEST(test_stall_from_the_jobs_rhythm)
{
	struct srq_cli c[3];
	struct st_hb hb[3] = { { "allreduce", 500, false },
		{ "allreduce", 500, false }, { "allreduce", 500, false } };
	uint64_t done[3] = { 0, 0, 0 };
	Cohort__JobStatus *js;
	uintptr_t t0, t1;

	fx_form(f, c, 3, "j");
	js = st_status(f, &c[0]);
	ck_assert_uint_eq(js->op_interval_us, 0);
	ck_assert_uint_eq(js->stall_after_ms, 60000);
	st_run(f, c, 3, hb, done, 100, 4000);
	js = st_status(f, &c[0]);
	ck_assert_uint_eq(js->op_interval_us, 10000);
	ck_assert_uint_eq(js->stall_after_ms, 5000);
	/* Ranks 0 and 1 wait in allreduce #501 for rank 2, which is
	 * elsewhere. */
	hb[0].seq = hb[1].seq = 501;
	hb[0].in_op = hb[1].in_op = true;
	st_run(f, c, 3, hb, done, 0, 4000);
	ck_assert_ptr_null(st_stalled(st_status(f, &c[0])));
	ck_assert_uint_eq(f->core->m.stalls, 0);
	st_run(f, c, 3, hb, done, 0, 3000);
	ck_assert_uint_eq(f->core->m.stalls, 1);
	js = st_status(f, &c[0]);
	ck_assert_uint_eq(js->op_interval_us, 10000); /* the median held */
	st_expect_stalled(st_stalled(js), true, 501, 2,
	    "allreduce #501 on group '' waiting 7.0 s, 700x the job's rhythm "
	    "(10.0 ms per operation): rank 2 has not entered");
	/* Off: the threshold alone. */
	f->core->stall_factor = 0;
	js = st_status(f, &c[0]);
	ck_assert_ptr_null(st_stalled(js));
	ck_assert_uint_eq(js->stall_after_ms, 60000);
	f->core->stall_factor = 20;
	/* All move on; then ranks 0 and 1 wait in a barrier parked here. */
	hb[0].seq = hb[1].seq = hb[2].seq = 502;
	hb[0].in_op = hb[1].in_op = false;
	st_run(f, c, 3, hb, done, 100, 2000);
	ck_assert_ptr_null(st_stalled(st_status(f, &c[0])));
	t0 = fx_barrier(f, &c[0], "ckpt", 1, 30000);
	t1 = fx_barrier(f, &c[1], "ckpt", 1, 30000);
	for (int i = 0; i < 2; i++)
		hb[i] = (struct st_hb) { "barrier", 1, true };
	st_run(f, c, 3, hb, done, 0, 4000);
	ck_assert_ptr_null(st_stalled(st_status(f, &c[0])));
	st_run(f, c, 3, hb, done, 0, 3000);
	ck_assert_uint_eq(f->core->m.stalls, 2);
	st_expect_stalled(st_stalled(st_status(f, &c[0])), false, 1, 2,
	    "barrier 'ckpt' (#1) on group '' waiting 7.0 s, 700x the job's "
	    "rhythm (10.0 ms per operation): rank 2 has not entered");
	fx_barrier(f, &c[2], "ckpt", 1, 30000);
	fx_want(f, t0, COHORT_OK);
	fx_want(f, t1, COHORT_OK);
}
END_TEST

/* The verdict's bounds: a slow job (an operation every 5 s) keeps
 * --stall-threshold; a fast one the floor; a job that pauses (no
 * operations between two heartbeats) adds no sample. */
START_TEST(test_stall_rhythm_bounds)
{
	struct srq_cli c[2];
	const struct st_hb hb[2]
	    = { { "allreduce", 1, false }, { "allreduce", 1, false } };
	uint64_t done[2] = { 0, 0 };
	struct srv_job *job;

	fx_form(f, c, 2, "j");
	job = SRV_CONTAINER(
	    srv_map_get(&f->core->jobs, "j", 1), struct srv_job, hn);
	/* 1 operation a second: 20 s. */
	st_run(f, c, 2, hb, done, 1, 5000);
	ck_assert_uint_eq(srv_stall_rhythm_us(job), 1000000);
	ck_assert_int_eq(srv_stall_after(job), 20000);
	/* Paused: no samples, the rhythm stays. */
	st_run(f, c, 2, hb, done, 0, 5000);
	ck_assert_uint_eq(srv_stall_rhythm_us(job), 1000000);
	/* Much slower (every 5 s): bounded by --stall-threshold. */
	for (int k = 0; k < 8; k++)
		st_run(f, c, 2, hb, done, k % 5 == 4, 1000);
	ck_assert_int_eq(srv_stall_after(job), 20000);
	f->core->stall_ms = 15000;
	ck_assert_int_eq(srv_stall_after(job), 15000);
	/* Much faster: the floor. */
	f->core->stall_floor_ms = 2000;
	st_run(f, c, 2, hb, done, 10000, 40000);
	ck_assert_uint_eq(srv_stall_rhythm_us(job), 100);
	ck_assert_int_eq(srv_stall_after(job), 2000);
}
END_TEST

UNIT_FIXTURE_SUITE(srv_stall, "stall", 0, fx_setup, fx_teardown,
    test_control_plane_stall, test_missing_rank_last_seen,
    test_data_plane_stall, test_join_heartbeat_order,
    test_request_after_close_is_dropped, test_stall_from_the_jobs_rhythm,
    test_stall_rhythm_bounds)
