/*
 * test_p2p.c - the host backend's point-to-point transfers
 * (client/backend/host/p2p.c) and its alltoallv (algos.c), with rank
 * threads of one process rendezvousing through an in-memory store
 * (tcp_fixture.h): matching per (peer, tag) in post order, receives from
 * any rank, batches that would deadlock if they were ordered, sizes that
 * exceed the socket buffers, a size mismatch, a peer that vanishes, a
 * deadline, abort and close with transfers pending, transfers beside a
 * collective, and uneven all-to-all with a pair that disagrees.
 */
#include <inttypes.h>
#include <stdio.h>
#include <string.h>
#include <time.h>

#include "tcp_fixture.h"
#include "th_op.h"
#include "unit_suite.h"

#define TP_MAX 64

/* One transfer a test posts and waits for. */
struct tp_req {
	struct cohort__p2p r;
	atomic_bool done;
};

static void
tp_done(struct cohort__p2p *p)
{
	struct tp_req *q = p->ctx;

	atomic_store(&q->done, true);
}

static void
tp_init(struct tp_req *q, bool send, int peer, uint32_t tag, void *buf,
    size_t count, cohort_dtype dt, int deadline_ms)
{
	memset(q, 0, sizeof(*q));
	q->r.kind = send ? COHORT__OP_SEND : COHORT__OP_RECV;
	q->r.peer = peer;
	q->r.tag = tag;
	q->r.buf = buf;
	q->r.count = count;
	q->r.dtype = dt;
	q->r.bytes = count * cohort_dtype_size(dt);
	q->r.deadline = cohort__now_ms() + deadline_ms;
	q->r.done = tp_done;
	q->r.ctx = q;
	q->r.source = -1;
	atomic_init(&q->done, false);
}

/* Waits (bounded) for q; its status. */
static cohort_status
tp_wait(struct tp_req *q, int ms)
{
	cohort__time until = cohort__now_ms() + ms;
	struct timespec ts = { 0, 500 * 1000 };

	while (!atomic_load(&q->done)) {
		if (cohort__now_ms() > until)
			return ((cohort_status)-1);
		nanosleep(&ts, NULL);
	}
	return (q->r.st);
}

static cohort_status
tp_post(void *p2p, struct tp_req *q)
{
	struct cohort__p2p *one = &q->r;
	char err[256];
	cohort_status st
	    = cohort__host_backend.p2p_post(p2p, &one, 1, err, sizeof(err));

	if (st != COHORT_OK)
		snprintf(q->r.err, sizeof(q->r.err), "post: %s", err);
	return (st);
}

/* Rank r's point-to-point state of g. */
static void *
tp_open(struct tt_group *g, int r, void *state)
{
	struct cohort__group_desc d;
	char err[256];
	void *p2p = NULL;
	cohort_status st;

	tt_desc(g, r, &d);
	st = cohort__host_backend.p2p_open(
	    &d, state, &p2p, err, sizeof(err), cohort__now_ms() + 10000);
	ck_assert_msg(st == COHORT_OK, "rank %d p2p_open: %s: %s", r,
	    cohort_status_name(st), err);
	return (p2p);
}

/* Byte i of the message (seed, from, to, n). */
static uint8_t
tp_byte(uint64_t seed, int from, int to, int n, size_t i)
{
	return ((uint8_t)(tw_mix(seed ^ ((uint64_t)from << 40)
	                      ^ ((uint64_t)to << 32) ^ ((uint64_t)n << 20))
	    ^ (i * 0x9e3779b97f4a7c15ull >> 13)));
}

static void
tp_fill(uint8_t *b, size_t len, uint64_t seed, int from, int to, int n)
{
	for (size_t i = 0; i < len; i++)
		b[i] = tp_byte(seed, from, to, n, i);
}

/* Checks b against the message; counts a failure in g when it differs. */
static bool
tp_check(struct tt_group *g, const uint8_t *b, size_t len, uint64_t seed,
    int from, int to, int n)
{
	for (size_t i = 0; i < len; i++)
		if (b[i] != tp_byte(seed, from, to, n, i)) {
			fprintf(stderr,
			    "message %d from %d to %d: byte %zu of %zu "
			    "differs\n",
			    n, from, to, i, len);
			atomic_fetch_add(&g->failures, 1);
			return (false);
		}
	return (true);
}

#define tp_expect(g, q, want)                                                 \
	do {                                                                  \
		cohort_status st_ = tp_wait((q), 30000);                      \
		if (st_ != (want)) {                                          \
			fprintf(stderr, "%s:%d: expected %s, got %s: %s\n",   \
			    __FILE__, __LINE__, cohort_status_name(want),     \
			    (int)st_ < 0 ? "(still pending)"                  \
			                 : cohort_status_name(st_),           \
			    (q)->r.err);                                      \
			atomic_fetch_add(&(g)->failures, 1);                  \
		}                                                             \
	} while (0)

/* ------------------------------------------------------------------------ */
/* Two ranks: sizes, dtypes, both orders of posting                         */
/* ------------------------------------------------------------------------ */

static const size_t tp_sizes[]
    = { 0, 1, 7, 4096, 65537, 1048579, (16u << 20) + 5 };

static void
tp_body_sizes(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	int peer = 1 - r;

	for (size_t k = 0; k < sizeof(tp_sizes) / sizeof(tp_sizes[0]); k++) {
		size_t len = tp_sizes[k];
		uint8_t *sb = malloc(len + 1), *rb = malloc(len + 1);
		struct tp_req s, q;

		tp_fill(sb, len, g->seed, r, peer, (int)k);
		memset(rb, 0xee, len + 1);
		/* Odd k: the receive first on rank 0, the send first on
		 * rank 1; even k: the other way round. */
		tp_init(&s, true, peer, 3, sb, len, COHORT_U8, 30000);
		tp_init(&q, false, peer, 3, rb, len, COHORT_U8, 30000);
		if ((k + (size_t)r) % 2 == 0) {
			ck_assert_cohort_ok(tp_post(p2p, &s));
			ck_assert_cohort_ok(tp_post(p2p, &q));
		} else {
			ck_assert_cohort_ok(tp_post(p2p, &q));
			ck_assert_cohort_ok(tp_post(p2p, &s));
		}
		tp_expect(g, &s, COHORT_OK);
		tp_expect(g, &q, COHORT_OK);
		if (q.r.st == COHORT_OK) {
			tp_check(g, rb, len, g->seed, peer, r, (int)k);
			ck_assert_int_eq(q.r.source, peer);
			ck_assert_int_eq(rb[len], 0xee);
		}
		free(sb);
		free(rb);
	}
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_sizes_both_orders)
{
	tt_run_ok(2, "p2psizes", tp_body_sizes);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Matching per (peer, tag) in post order                                   */
/* ------------------------------------------------------------------------ */

/* Rank 0 sends tags 1, 2, 1, 2, 1 (messages 0..4); rank 1 receives tag 2
 * twice, then tag 1 three times: message n of a tag meets receive n of
 * that tag, whatever the other tag does. */
static void
tp_body_tags(struct tt_group *g, int r, void *state)
{
	static const uint32_t stags[5] = { 1, 2, 1, 2, 1 };
	static const int rorder[5] = { 1, 3, 0, 2, 4 }; /* messages, in
	                                                   order received */
	void *p2p = tp_open(g, r, state);
	uint8_t bufs[5][300];
	struct tp_req q[5];

	for (int i = 0; i < 5; i++) {
		int n = r == 0 ? i : rorder[i];

		if (r == 0) {
			tp_fill(bufs[i], 100 + (size_t)n, g->seed, 0, 1, n);
			tp_init(&q[i], true, 1, stags[n], bufs[i],
			    100 + (size_t)n, COHORT_U8, 30000);
		} else {
			tp_init(&q[i], false, 0, stags[n], bufs[i],
			    100 + (size_t)n, COHORT_U8, 30000);
		}
		ck_assert_cohort_ok(tp_post(p2p, &q[i]));
	}
	for (int i = 0; i < 5; i++)
		tp_expect(g, &q[i], COHORT_OK);
	if (r == 1)
		for (int i = 0; i < 5; i++)
			tp_check(g, bufs[i], 100 + (size_t)rorder[i], g->seed,
			    0, 1, rorder[i]);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_per_tag_order) { tt_run_ok(2, "p2ptags", tp_body_tags); }
END_TEST

/* ------------------------------------------------------------------------ */
/* A ring posted at once: what an ordered channel would deadlock on         */
/* ------------------------------------------------------------------------ */

/* Every rank sends 8 MiB to its right and receives 8 MiB from its left,
 * then the other way round; _i picks whether the sends or the receives
 * are posted first. Neither side's kernel buffer holds 8 MiB: a send
 * that waited for its own completion before the receive was posted would
 * hang. */
static void
tp_body_ring(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	int n = g->n, right = (r + 1) % n, left = (r + n - 1) % n;
	size_t len = 8u << 20;
	uint8_t *sb[2], *rb[2];
	struct tp_req s[2], q[2];
	bool sends_first = g->iters == 0;

	for (int k = 0; k < 2; k++) {
		int to = k == 0 ? right : left, from = k == 0 ? left : right;

		sb[k] = malloc(len);
		rb[k] = malloc(len);
		tp_fill(sb[k], len, g->seed, r, to, k);
		tp_init(&s[k], true, to, 0, sb[k], len / 4, COHORT_F32, 30000);
		tp_init(
		    &q[k], false, from, 0, rb[k], len / 4, COHORT_F32, 30000);
	}
	for (int k = 0; k < 2; k++) {
		ck_assert_cohort_ok(tp_post(p2p, sends_first ? &s[k] : &q[k]));
		ck_assert_cohort_ok(tp_post(p2p, sends_first ? &q[k] : &s[k]));
	}
	for (int k = 0; k < 2; k++) {
		int from = k == 0 ? left : right;

		tp_expect(g, &s[k], COHORT_OK);
		tp_expect(g, &q[k], COHORT_OK);
		tp_check(g, rb[k], len, g->seed, from, r, k);
		free(sb[k]);
		free(rb[k]);
	}
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_ring_posted_at_once)
{
	static struct tt_group g;

	tt_run_group_iters(3 + _i / 2, "p2pring", tp_body_ring, _i % 2, &g);
	tt_assert_no_failures(&g);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Receives from any rank                                                   */
/* ------------------------------------------------------------------------ */

/* Ranks 1..n-1 each send two messages with tag 5 to rank 0, which posts
 * 2(n-1) receives from any rank, each told its source; a receive from
 * rank 1 posted after the first receive from any rank does not overtake
 * it. */
static void
tp_body_any(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	int n = g->n, total = 2 * (n - 1);
	uint8_t bufs[TP_MAX][64];
	struct tp_req q[TP_MAX];
	int seen[TT_MAX_RANKS][2];

	if (r != 0) {
		for (int k = 0; k < 2; k++) {
			tp_fill(bufs[k], 64, g->seed, r, 0, k);
			tp_init(
			    &q[k], true, 0, 5, bufs[k], 64, COHORT_U8, 30000);
			ck_assert_cohort_ok(tp_post(p2p, &q[k]));
		}
		for (int k = 0; k < 2; k++)
			tp_expect(g, &q[k], COHORT_OK);
		cohort__host_backend.p2p_close(p2p);
		return;
	}
	memset(seen, 0, sizeof(seen));
	for (int k = 0; k < total; k++) {
		tp_init(&q[k], false, COHORT__P2P_ANY, 5, bufs[k], 64,
		    COHORT_U8, 30000);
		ck_assert_cohort_ok(tp_post(p2p, &q[k]));
	}
	for (int k = 0; k < total; k++) {
		int src;

		tp_expect(g, &q[k], COHORT_OK);
		src = q[k].r.source;
		ck_assert_msg(src >= 1 && src < n, "source %d", src);
		/* The n-th message from src is its n-th send. */
		tp_check(g, bufs[k], 64, g->seed, src, 0,
		    seen[src][0]++ == 0 ? 0 : 1);
	}
	for (int p = 1; p < n; p++)
		ck_assert_int_eq(seen[p][0], 2);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_any_source) { tt_run_ok(4, "p2pany", tp_body_any); }
END_TEST

/* Rank 0 posts a receive from any rank, then one from rank 1, both with
 * tag 9; rank 1 sends messages 0 and 1 (tag 9), only after both are
 * posted. Message 0 goes to the receive from any rank. */
static void
tp_body_any_first(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	uint8_t b[2][32];
	struct tp_req q[2];

	if (r == 1) {
		th_wait_until(tt_in_run_ge, g, 1000, 5);
		for (int k = 0; k < 2; k++) {
			tp_fill(b[k], 32, g->seed, 1, 0, k);
			tp_init(&q[k], true, 0, 9, b[k], 32, COHORT_U8, 30000);
			ck_assert_cohort_ok(tp_post(p2p, &q[k]));
		}
	} else if (r == 0) {
		tp_init(&q[0], false, COHORT__P2P_ANY, 9, b[0], 32, COHORT_U8,
		    30000);
		tp_init(&q[1], false, 1, 9, b[1], 32, COHORT_U8, 30000);
		ck_assert_cohort_ok(tp_post(p2p, &q[0]));
		ck_assert_cohort_ok(tp_post(p2p, &q[1]));
		atomic_fetch_add(&g->in_run, 1);
	} else {
		cohort__host_backend.p2p_close(p2p);
		return;
	}
	tp_expect(g, &q[0], COHORT_OK);
	tp_expect(g, &q[1], COHORT_OK);
	if (r == 0) {
		ck_assert_int_eq(q[0].r.source, 1);
		tp_check(g, b[0], 32, g->seed, 1, 0, 0);
		tp_check(g, b[1], 32, g->seed, 1, 0, 1);
	}
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_any_source_keeps_post_order)
{
	static struct tt_group g;

	tt_run_group_iters(3, "p2panyfirst", tp_body_any_first, 1, &g);
	tt_assert_no_failures(&g);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Many messages between every pair, in a seeded order                      */
/* ------------------------------------------------------------------------ */

/* Each rank sends 40 messages to every other rank with tags 0..3 and
 * sizes up to 200 KiB, posting sends and receives interleaved in a
 * seeded order (the same schedule computed on every rank); receives of a
 * (peer, tag) are posted in the order its sends were. */
static void
tp_body_many(struct tt_group *g, int r, void *state)
{
	enum { M = 40 };
	void *p2p = tp_open(g, r, state);
	int n = g->n, nq = 0;
	struct tp_req *q = calloc((size_t)(2 * M * n), sizeof(*q));
	uint8_t **bufs = calloc((size_t)(2 * M * n), sizeof(*bufs));
	size_t *lens = calloc((size_t)(2 * M * n), sizeof(*lens));
	int *from = calloc((size_t)(2 * M * n), sizeof(int));
	int *msg = calloc((size_t)(2 * M * n), sizeof(int));

	for (int m = 0; m < M; m++) {
		for (int d = 1; d < n; d++) {
			int to = (r + d) % n, fr = (r + n - d) % n;
			/* message m from a to b: size and tag from the
			 * seed */
			uint64_t hs = tw_mix(g->seed ^ (uint64_t)(r * 131 + to)
			    ^ (uint64_t)m << 24);
			uint64_t hr = tw_mix(g->seed ^ (uint64_t)(fr * 131 + r)
			    ^ (uint64_t)m << 24);
			size_t sl = hs % (200u << 10), rl = hr % (200u << 10);

			bufs[nq] = malloc(sl + 1);
			tp_fill(bufs[nq], sl, g->seed, r, to, m);
			tp_init(&q[nq], true, to, (uint32_t)(hs >> 60),
			    bufs[nq], sl, COHORT_U8, 60000);
			ck_assert_cohort_ok(tp_post(p2p, &q[nq]));
			nq++;
			bufs[nq] = malloc(rl + 1);
			lens[nq] = rl;
			from[nq] = fr;
			msg[nq] = m;
			tp_init(&q[nq], false, fr, (uint32_t)(hr >> 60),
			    bufs[nq], rl, COHORT_U8, 60000);
			ck_assert_cohort_ok(tp_post(p2p, &q[nq]));
			nq++;
		}
	}
	for (int i = 0; i < nq; i++) {
		tp_expect(g, &q[i], COHORT_OK);
		if (q[i].r.kind == COHORT__OP_RECV)
			tp_check(
			    g, bufs[i], lens[i], g->seed, from[i], r, msg[i]);
		free(bufs[i]);
	}
	free(q);
	free(bufs);
	free(lens);
	free(from);
	free(msg);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_many_messages_all_pairs)
{
	tt_run_ok(4, "p2pmany", tp_body_many);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Failures                                                                 */
/* ------------------------------------------------------------------------ */

/* Rank 0 sends 100 floats, rank 1 receives 64: both fail with EMISMATCH
 * naming the two sizes; the next transfer of the pair goes through. */
static void
tp_body_mismatch(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	float buf[100];
	struct tp_req q;

	memset(buf, 0, sizeof(buf));
	tp_init(
	    &q, r == 0, 1 - r, 0, buf, r == 0 ? 100 : 64, COHORT_F32, 30000);
	ck_assert_cohort_ok(tp_post(p2p, &q));
	tp_expect(g, &q, COHORT_EMISMATCH);
	ck_assert_msg(strstr(q.r.err, "400 bytes") != NULL
	        && strstr(q.r.err, "256 bytes") != NULL,
	    "rank %d: %s", r, q.r.err);
	tp_init(&q, r == 0, 1 - r, 0, buf, 10, COHORT_F32, 30000);
	ck_assert_cohort_ok(tp_post(p2p, &q));
	tp_expect(g, &q, COHORT_OK);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_size_mismatch_fails_both)
{
	tt_run_ok(2, "p2pmismatch", tp_body_mismatch);
}
END_TEST

/* Rank 1 receives 32 MiB from rank 0 (and waits for more from it); rank
 * 0 sends a little of it, then its state vanishes (abort: its sockets are
 * shut down). Rank 1's receive fails with EPEERLOST naming rank 100 (job
 * rank of group rank 0) and the receive, within a few seconds. */
static void
tp_body_vanish(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	size_t len = 32u << 20;
	uint8_t *b = calloc(1, len);
	struct tp_req q, q2;
	int64_t t0;

	if (r == 0) {
		tp_init(&q, false, 1, 1, b, 1, COHORT_U8, 30000);
		ck_assert_cohort_ok(tp_post(p2p, &q));
		tp_expect(g, &q, COHORT_OK); /* rank 1 is in */
		cohort__host_backend.p2p_abort(p2p);
		tp_wait(&q, 1000);
		cohort__host_backend.p2p_close(p2p);
		free(b);
		return;
	}
	tp_init(&q2, false, 0, 7, b, len, COHORT_U8, 30000);
	ck_assert_cohort_ok(tp_post(p2p, &q2));
	tp_init(&q, true, 0, 1, b, 1, COHORT_U8, 30000);
	ck_assert_cohort_ok(tp_post(p2p, &q));
	tp_expect(g, &q, COHORT_OK);
	t0 = cohort__now_ms();
	tp_expect(g, &q2, COHORT_EPEERLOST);
	ck_assert_int_lt(cohort__now_ms() - t0, 5000);
	ck_assert_msg(strstr(q2.r.err, "rank 100") != NULL
	        && strstr(q2.r.err, "recv #") != NULL,
	    "%s", q2.r.err);
	/* Later transfers with it fail at once, with the same cause. */
	tp_init(&q, true, 0, 1, b, 1, COHORT_U8, 30000);
	ck_assert_cohort_ok(tp_post(p2p, &q));
	tp_expect(g, &q, COHORT_EPEERLOST);
	free(b);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_peer_vanishes_during_recv)
{
	tt_run_ok(2, "p2pvanish", tp_body_vanish);
}
END_TEST

/* Rank 1 receives from rank 0 with a 400 ms deadline; rank 0 is there
 * (connected: it received a message from rank 1) but never sends. The
 * receive fails with ETIMEDOUT saying what it waited for; the state is
 * broken: every later post fails with it. */
static void
tp_body_deadline(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	uint8_t b[16];
	struct tp_req q, q2;
	int64_t t0;
	char err[256];
	struct cohort__p2p *one = &q2.r;

	memset(b, 0, sizeof(b));
	if (r == 0) {
		tp_init(&q, false, 1, 0, b, 16, COHORT_U8, 30000);
		ck_assert_cohort_ok(tp_post(p2p, &q));
		tp_expect(g, &q, COHORT_OK);
		th_wait_until(tt_in_run_ge, g, 1000, 10);
		cohort__host_backend.p2p_close(p2p);
		return;
	}
	tp_init(&q, true, 0, 0, b, 16, COHORT_U8, 30000);
	ck_assert_cohort_ok(tp_post(p2p, &q));
	tp_expect(g, &q, COHORT_OK);
	tp_init(&q2, false, 0, 4, b, 16, COHORT_U8, 400);
	t0 = cohort__now_ms();
	ck_assert_cohort_ok(tp_post(p2p, &q2));
	tp_expect(g, &q2, COHORT_ETIMEDOUT);
	ck_assert_int_ge(cohort__now_ms() - t0, 390);
	ck_assert_int_lt(cohort__now_ms() - t0, 3000);
	ck_assert_msg(strstr(q2.r.err, "never sent the message") != NULL
	        && strstr(q2.r.err, "rank 100") != NULL,
	    "%s", q2.r.err);
	tp_init(&q2, true, 0, 0, b, 16, COHORT_U8, 30000);
	ck_assert_int_eq(
	    cohort__host_backend.p2p_post(p2p, &one, 1, err, sizeof(err)),
	    COHORT_ETIMEDOUT);
	atomic_fetch_add(&g->in_run, 1);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_deadline_breaks_the_state)
{
	static struct tt_group g;

	tt_run_group_iters(2, "p2pdeadline", tp_body_deadline, 1, &g);
	tt_assert_no_failures(&g);
}
END_TEST

/* A receive from a rank that never opens its state (it published no
 * address): ETIMEDOUT at the deadline, saying no connection was made. */
static void
tp_body_absent(struct tt_group *g, int r, void *state)
{
	void *p2p;
	uint8_t b[4];
	struct tp_req q;

	if (r == 1)
		return;
	p2p = tp_open(g, r, state);
	tp_init(&q, false, 1, 0, b, 4, COHORT_U8, 600);
	ck_assert_cohort_ok(tp_post(p2p, &q));
	tp_expect(g, &q, COHORT_ETIMEDOUT);
	ck_assert_has(q.r.err, "no connection with rank 101");
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_peer_never_opens)
{
	tt_run_ok(2, "p2pabsent", tp_body_absent);
}
END_TEST

/* Pending transfers fail with EABORTED at once on abort (rank 0, from
 * another thread than the posts' in effect: the engine's) and on close
 * (rank 1); their peer, rank 2, never opens, so nothing else can end
 * them. */
static void
tp_body_abort(struct tt_group *g, int r, void *state)
{
	void *p2p;
	uint8_t b[4];
	struct tp_req q[3];
	int64_t t0;

	if (r == 2)
		return;
	p2p = tp_open(g, r, state);
	tp_init(&q[0], false, 2, 0, b, 4, COHORT_U8, 30000);
	tp_init(&q[1], false, COHORT__P2P_ANY, 1, b, 4, COHORT_U8, 30000);
	tp_init(&q[2], true, 2, 2, b, 4, COHORT_U8, 30000);
	for (int k = 0; k < 3; k++)
		ck_assert_cohort_ok(tp_post(p2p, &q[k]));
	t0 = cohort__now_ms();
	if (r == 0)
		cohort__host_backend.p2p_abort(p2p);
	else
		cohort__host_backend.p2p_close(p2p);
	for (int k = 0; k < 3; k++)
		tp_expect(g, &q[k], COHORT_EABORTED);
	ck_assert_int_lt(cohort__now_ms() - t0, 2000);
	if (r == 0)
		cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_abort_and_close_fail_pending)
{
	tt_run_ok(3, "p2pabort", tp_body_abort);
}
END_TEST

/* Transfers beside a collective: rank 0 posts a 16 MiB send to rank 1 and
 * then runs an allreduce; rank 1 runs the allreduce first and receives
 * after it. A transfer ordered behind the group's collectives would make
 * rank 0's allreduce wait for rank 1's receive. */
static void
tp_body_beside(struct tt_group *g, int r, void *state)
{
	void *p2p = tp_open(g, r, state);
	size_t len = 16u << 20;
	uint8_t *b = malloc(len);
	float v[1024];
	struct tp_req q;
	struct cohort__op op;
	char err[256];

	for (int i = 0; i < 1024; i++)
		v[i] = (float)(r + 1);
	op = tt_sum_op(v, 1024, 1);
	if (r == 0) {
		tp_fill(b, len, g->seed, 0, 1, 0);
		tp_init(&q, true, 1, 0, b, len, COHORT_U8, 30000);
		ck_assert_cohort_ok(tp_post(p2p, &q));
	}
	ck_assert_cohort_ok(cohort__host_backend.run(
	    state, &op, err, sizeof(err), cohort__now_ms() + 30000));
	ck_assert_msg(v[0] == 3.0f, "allreduce gave %f", (double)v[0]);
	if (r == 1) {
		tp_init(&q, false, 0, 0, b, len, COHORT_U8, 30000);
		ck_assert_cohort_ok(tp_post(p2p, &q));
	}
	tp_expect(g, &q, COHORT_OK);
	if (r == 1)
		tp_check(g, b, len, g->seed, 0, 1, 0);
	free(b);
	cohort__host_backend.p2p_close(p2p);
}

START_TEST(test_p2p_beside_a_collective)
{
	static struct tt_group g;

	tt_set_mode(TT_PURE);
	tt_run_group(2, "p2pbeside", tp_body_beside, &g);
	unsetenv("COHORT_TCP_SHM");
	tt_assert_no_failures(&g);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* alltoallv                                                                */
/* ------------------------------------------------------------------------ */

static void
tp_body_a2av(struct tt_group *g, int r, void *state)
{
	int n = g->n;

	for (int k = 0; k < 4; k++) {
		size_t sc[TT_MAX_RANKS], sd[TT_MAX_RANKS], rc[TT_MAX_RANKS];
		size_t rd[TT_MAX_RANKS], stot, rtot;
		struct cohort__op op;
		int32_t *sb, *rb;
		char err[512];
		cohort_status st;

		/* Uneven, some zero; send blocks back to front with gaps,
		 * receive blocks in rank order. */
		tw_a2a_layout(g->seed, k, r, n, 5000, 3, 0, sc, sd, rc, rd,
		    &stot, &rtot);
		sb = malloc((stot + 1) * sizeof(*sb));
		rb = malloc((rtot + 1) * sizeof(*rb));
		for (int j = 0; j < n; j++)
			for (size_t i = 0; i < sc[j]; i++)
				sb[sd[j] + i] = r * 1000000 + j * 10000
				    + (int32_t)(i % 10000);
		th_op_alltoallv(
		    &op, sb, rb, COHORT_I32, sc, sd, rc, rd, (uint64_t)k + 1);
		st = cohort__host_backend.run(
		    state, &op, err, sizeof(err), cohort__now_ms() + 30000);
		if (st != COHORT_OK) {
			fprintf(stderr, "rank %d alltoallv %d: %s: %s\n", r, k,
			    cohort_status_name(st), err);
			atomic_fetch_add(&g->failures, 1);
		}
		for (int j = 0; j < n && st == COHORT_OK; j++)
			for (size_t i = 0; i < rc[j]; i++)
				if (rb[rd[j] + i]
				    != j * 1000000 + r * 10000
				        + (int32_t)(i % 10000)) {
					fprintf(stderr,
					    "rank %d alltoallv %d: element "
					    "%zu "
					    "from %d wrong\n",
					    r, k, i, j);
					atomic_fetch_add(&g->failures, 1);
					break;
				}
		free(sb);
		free(rb);
	}
}

START_TEST(test_alltoallv_uneven)
{
	static struct tt_group g;

	tt_set_mode(_i);
	tt_run_group(3 + _i, "a2av", tp_body_a2av, &g);
	unsetenv("COHORT_TCP_SHM");
	unsetenv("COHORT_TCP_SHM_MIN");
	unsetenv("COHORT_TCP_SHM_CMA_MIN");
	tt_assert_no_failures(&g);
}
END_TEST

/* Ranks 0 and 1 disagree on what 0 sends 1 (10 vs 12 elements); rank 2
 * agrees with both. 0 and 1 fail with EMISMATCH naming the pair and the
 * counts, rank 2 gets its data; the next operation works everywhere. */
static void
tp_body_a2av_mismatch(struct tt_group *g, int r, void *state)
{
	size_t sc[3] = { 10, 10, 10 }, sd[3] = { 0, 10, 20 };
	size_t rc[3] = { 10, 10, 10 }, rd[3] = { 0, 10, 20 };
	float sb[30], rb[30];
	struct cohort__op op;
	char err[512];
	cohort_status st;

	for (int i = 0; i < 30; i++)
		sb[i] = (float)(r * 100 + i);
	if (r == 1)
		rc[0] = 12, rd[1] = 12, rd[2] = 22;
	th_op_alltoallv(&op, sb, r == 1 ? malloc(34 * sizeof(float)) : rb,
	    COHORT_F32, sc, sd, rc, rd, 1);
	st = cohort__host_backend.run(
	    state, &op, err, sizeof(err), cohort__now_ms() + 30000);
	if (r == 2) {
		ck_assert_msg(st == COHORT_OK, "%s", err);
		ck_assert(rb[0] == 0.0f + 20 && rb[10] == 100.0f + 20);
	} else {
		ck_assert_msg(st == COHORT_EMISMATCH, "rank %d: %s: %s", r,
		    cohort_status_name(st), err);
		ck_assert_msg(strstr(err,
		                  "rank 100 sends 10 elements to rank "
		                  "101, which expects 12")
		        != NULL,
		    "rank %d: %s", r, err);
	}
	if (r == 1)
		free((void *)op.recv);
	rc[0] = 10, rd[1] = 10, rd[2] = 20;
	op.recv = rb;
	op.seq = 2;
	st = cohort__host_backend.run(
	    state, &op, err, sizeof(err), cohort__now_ms() + 30000);
	ck_assert_msg(st == COHORT_OK, "rank %d: %s", r, err);
	ck_assert(rb[10] == 100.0f + (float)(10 * r));
}

START_TEST(test_alltoallv_pair_that_disagrees)
{
	static struct tt_group g;

	tt_set_mode(TT_SHM);
	tt_run_group(3, "a2avbad", tp_body_a2av_mismatch, &g);
	unsetenv("COHORT_TCP_SHM");
}
END_TEST

Suite *suite_p2p(void); /* for tools/gen_suites.sh */

Suite *
suite_p2p(void)
{
	const TTest *const tests[] = { test_p2p_sizes_both_orders,
		test_p2p_per_tag_order, test_p2p_any_source,
		test_p2p_any_source_keeps_post_order,
		test_p2p_many_messages_all_pairs,
		test_p2p_size_mismatch_fails_both,
		test_p2p_peer_vanishes_during_recv,
		test_p2p_deadline_breaks_the_state, test_p2p_peer_never_opens,
		test_p2p_abort_and_close_fail_pending,
		test_p2p_beside_a_collective,
		test_alltoallv_pair_that_disagrees, NULL };
	const struct unit_loop loops[] = { { test_p2p_ring_posted_at_once, 4 },
		{ test_alltoallv_uneven, 2 }, { NULL, 0 } };

	return (unit_suite_loops("p2p", "host", 120, tests, loops));
}
