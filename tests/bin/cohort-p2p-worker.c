/*
 * cohort-p2p-worker - a real worker process for the point-to-point suite
 * (tests/integration/test_p2p.c): the public API's send, recv, isend,
 * irecv, p2p_batch, work_source and alltoallv between real processes.
 *
 *   cohort-p2p-worker SCENARIO [ARG]
 *
 * It joins the job of its environment (COHORT_*; COHORT_TEST_BACKEND picks
 * the world's data-plane backend), runs one scenario, prints "RESULT ..."
 * lines (one "FAIL ..." line per check that did not hold) and exits 0 when
 * its checks held. Message bytes are a function of (seed, sender,
 * receiver, message number), so every receiver checks what it got
 * without being told.
 *
 * Scenarios:
 *   basic    SEED  rings of isend/irecv (0 B to 3 MiB), blocking ping-pong,
 *                  a gather from any rank, batches, alltoallv with uneven
 *                  counts, transfers in one thread beside all-reduces in
 *                  another, argument errors
 *   killed         rank 0 exchanges once, prints READY, then waits to be
 *                  killed; the others wait in a receive from it and print
 *                  what it returned and how long after READY
 *   mismatch       ranks 0 and 1 disagree on a size: both get EMISMATCH,
 *                  then a good transfer works
 *   timeout        rank 1 receives from rank 0 with a 500 ms deadline that
 *                  rank 0 never meets: ETIMEDOUT, sticky on rank 1
 *   bench    ITERS ranks 0 and 1: ping-pong round trips and a stream of 8
 *                  isends per size, printed as MEASURE lines
 */
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort/cohort.h"
#include "th_worker.h"

static int pw_failed;

#define PW_CHECK(cond, ...)                                                   \
	do {                                                                  \
		if (!(cond)) {                                                \
			printf("FAIL %s:%d: ", __FILE__, __LINE__);           \
			printf(__VA_ARGS__);                                  \
			printf("\n");                                         \
			__atomic_add_fetch(&pw_failed, 1, __ATOMIC_SEQ_CST);  \
		}                                                             \
	} while (0)

#define PW_OK(expr)                                                           \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		PW_CHECK(st_ == COHORT_OK, "%s: %s: %s", #expr,               \
		    cohort_status_name(st_), cohort_last_error());            \
	} while (0)

/* Prints "RESULT <what> failed=<n>" and returns the scenario's exit
 * status. */
static int
pw_result(const char *what)
{
	printf("RESULT %s failed=%d\n", what, pw_failed);
	return (pw_failed == 0 ? 0 : 1);
}

static uint8_t
pw_byte(uint64_t seed, int from, int to, int n, size_t i)
{
	return ((uint8_t)(tw_mix(seed ^ ((uint64_t)from << 40)
	                      ^ ((uint64_t)to << 32) ^ ((uint64_t)n << 20))
	    ^ (i * 0x9e3779b97f4a7c15ull >> 13)));
}

static uint8_t *
pw_msg(size_t len, uint64_t seed, int from, int to, int n)
{
	uint8_t *b = malloc(len + 1);

	for (size_t i = 0; i < len; i++)
		b[i] = pw_byte(seed, from, to, n, i);
	return (b);
}

static void
pw_check(const uint8_t *b, size_t len, uint64_t seed, int from, int to, int n,
    const char *what)
{
	for (size_t i = 0; i < len; i++)
		if (b[i] != pw_byte(seed, from, to, n, i)) {
			PW_CHECK(false,
			    "%s: message %d from %d to %d: byte %zu of %zu "
			    "differs",
			    what, n, from, to, i, len);
			return;
		}
}

/* ------------------------------------------------------------------------ */
/* basic                                                                    */
/* ------------------------------------------------------------------------ */

/* Every rank: isend to the right, irecv from the left, at each size; the
 * receives posted first on even ranks, the sends on odd ones. */
static void
pw_ring(cohort_group *g, uint64_t seed, int base, int rounds)
{
	static const size_t sizes[] = { 0, 4000, (3u << 20) + 4 };
	int r = cohort_group_rank(g), n = cohort_group_size(g);
	int right = (r + 1) % n, left = (r + n - 1) % n;

	for (int k = 0; k < rounds; k++)
		for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
			int m = base + k * 10 + (int)z;
			size_t len = sizes[z];
			uint8_t *sb = pw_msg(len, seed, r, right, m);
			uint8_t *rb = malloc(len + 1);
			cohort_work *ws = NULL, *wr = NULL;
			int32_t src = -1;

			if (r % 2 == 0)
				PW_OK(cohort_irecv(g, rb, len, COHORT_U8, left,
				    (uint32_t)z, NULL, &wr));
			PW_OK(cohort_isend(g, sb, len, COHORT_U8, right,
			    (uint32_t)z, NULL, &ws));
			if (r % 2 != 0)
				PW_OK(cohort_irecv(g, rb, len, COHORT_U8, left,
				    (uint32_t)z, NULL, &wr));
			if (ws != NULL)
				PW_OK(cohort_work_wait(ws, 60000));
			if (wr != NULL) {
				PW_OK(cohort_work_wait(wr, 60000));
				PW_OK(cohort_work_source(wr, &src));
				PW_CHECK(src == left, "ring source %d, not %d",
				    src, left);
				pw_check(rb, len, seed, left, r, m, "ring");
			}
			cohort_work_free(ws);
			cohort_work_free(wr);
			free(sb);
			free(rb);
		}
}

/* Ranks 0 and 1 bounce a message 20 times with the blocking calls. */
static void
pw_pingpong(cohort_group *g, uint64_t seed)
{
	int r = cohort_group_rank(g);
	size_t len = 1000;
	uint8_t *b = malloc(len);

	if (r > 1) {
		free(b);
		return;
	}
	for (int k = 0; k < 20; k++) {
		if ((k % 2) == r) {
			uint8_t *m = pw_msg(len, seed, r, 1 - r, 100 + k);

			PW_OK(cohort_send(
			    g, m, len, COHORT_U8, 1 - r, 77, NULL, 60000));
			free(m);
		} else {
			PW_OK(cohort_recv(
			    g, b, len, COHORT_U8, 1 - r, 77, NULL, 60000));
			pw_check(b, len, seed, 1 - r, r, 100 + k, "pingpong");
		}
	}
	free(b);
}

/* Every other rank sends rank 0 one message (tag 3); rank 0 receives
 * them from any rank and learns who sent each. */
static void
pw_gather_any(cohort_group *g, uint64_t seed)
{
	int r = cohort_group_rank(g), n = cohort_group_size(g);
	size_t len = 5000;

	if (r != 0) {
		uint8_t *m = pw_msg(len, seed, r, 0, 200);

		PW_OK(cohort_send(g, m, len, COHORT_U8, 0, 3, NULL, 60000));
		free(m);
		return;
	}
	{
		cohort_work *w[64];
		uint8_t *b[64];
		bool seen[64] = { false };

		for (int k = 0; k < n - 1; k++) {
			b[k] = malloc(len);
			PW_OK(cohort_irecv(g, b[k], len, COHORT_U8,
			    COHORT_ANY_SOURCE, 3, NULL, &w[k]));
		}
		for (int k = 0; k < n - 1; k++) {
			int32_t src = -1;

			PW_OK(cohort_work_wait(w[k], 60000));
			PW_OK(cohort_work_source(w[k], &src));
			PW_CHECK(src > 0 && src < n && !seen[src],
			    "any-source receive %d from %d", k, src);
			if (src > 0 && src < n) {
				seen[src] = true;
				pw_check(b[k], len, seed, src, 0, 200,
				    "gather from any rank");
			}
			cohort_work_free(w[k]);
			free(b[k]);
		}
	}
}

/* A ring exchange posted as one batch (both directions). */
static void
pw_batch(cohort_group *g, uint64_t seed)
{
	int r = cohort_group_rank(g), n = cohort_group_size(g);
	int right = (r + 1) % n, left = (r + n - 1) % n;
	size_t len = 1u << 20;
	uint8_t *s1 = pw_msg(len, seed, r, right, 300);
	uint8_t *s2 = pw_msg(len, seed, r, left, 301);
	uint8_t *r1 = malloc(len), *r2 = malloc(len);
	cohort_p2p_op ops[4] = {
		{ true, r1, len / 4, COHORT_F32, left, 0 },
		{ false, s1, len / 4, COHORT_F32, right, 0 },
		{ false, s2, len / 4, COHORT_F32, left, 1 },
		{ true, r2, len / 4, COHORT_F32, right, 1 },
	};
	cohort_work *w[4] = { NULL };

	PW_OK(cohort_p2p_batch(g, ops, 4, NULL, w));
	for (int k = 0; k < 4; k++) {
		if (w[k] != NULL)
			PW_OK(cohort_work_wait(w[k], 60000));
		cohort_work_free(w[k]);
	}
	pw_check(r1, len, seed, left, r, 300, "batch");
	pw_check(r2, len, seed, right, r, 301, "batch");
	free(s1);
	free(s2);
	free(r1);
	free(r2);
}

static void
pw_alltoallv(cohort_group *g, uint64_t seed, bool async)
{
	int r = cohort_group_rank(g), n = cohort_group_size(g);

	for (int k = 0; k < 3; k++) {
		size_t *sc = calloc((size_t)n, sizeof(size_t) * 4);
		size_t *sd = sc + n, *rc = sc + 2 * n, *rd = sc + 3 * n;
		size_t stot, rtot;
		int64_t *sb, *rb;

		/* Uneven, about a quarter zero; send blocks back to front
		 * with a gap after each. */
		tw_a2a_layout(
		    seed, k, r, n, 20000, 0, 1, sc, sd, rc, rd, &stot, &rtot);
		sb = malloc((stot + 1) * sizeof(*sb));
		rb = malloc((rtot + 1) * sizeof(*rb));
		for (int j = 0; j < n; j++)
			for (size_t i = 0; i < sc[j]; i++)
				sb[sd[j] + i] = (int64_t)r << 40
				    | (int64_t)j << 24 | (int64_t)i;
		if (async) {
			cohort_work *w = NULL;

			PW_OK(cohort_ialltoallv(
			    g, sb, sc, sd, rb, rc, rd, COHORT_I64, NULL, &w));
			/* The arrays are the library's copy now. */
			memset(sc, 0xff, 4 * (size_t)n * sizeof(size_t));
			if (w != NULL)
				PW_OK(cohort_work_wait(w, 60000));
			cohort_work_free(w);
			for (int j = 0; j < n; j++) {
				rc[j] = tw_a2a_count(seed, k, j, r, 20000);
				rd[j] = j == 0 ? 0 : rd[j - 1] + rc[j - 1];
			}
		} else {
			PW_OK(cohort_alltoallv(g, sb, sc, sd, rb, rc, rd,
			    COHORT_I64, NULL, 60000));
		}
		for (int j = 0; j < n; j++)
			for (size_t i = 0; i < rc[j]; i++)
				if (rb[rd[j] + i]
				    != ((int64_t)j << 40 | (int64_t)r << 24
				        | (int64_t)i)) {
					PW_CHECK(false,
					    "alltoallv case %d: element %zu "
					    "from rank %d wrong",
					    k, i, j);
					break;
				}
		free(sc);
		free(sb);
		free(rb);
	}
}

struct pw_beside {
	cohort_group *g;
	uint64_t seed;
};

/* All-reduces in their own thread while the main thread's transfers
 * run on the same group. */
static void *
pw_allreduce_loop(void *arg)
{
	struct pw_beside *b = arg;
	int n = cohort_group_size(b->g);
	float v[4096];

	for (int k = 0; k < 20; k++) {
		for (int i = 0; i < 4096; i++)
			v[i] = (float)(cohort_group_rank(b->g) + k);
		PW_OK(cohort_allreduce(
		    b->g, v, v, 4096, COHORT_F32, COHORT_SUM, NULL, 60000));
		PW_CHECK(v[17] == (float)(n * (n - 1) / 2 + n * k),
		    "allreduce %d beside transfers: %f", k, (double)v[17]);
	}
	return (NULL);
}

static void
pw_beside(cohort_group *g, uint64_t seed)
{
	struct pw_beside b = { g, seed };
	pthread_t th;

	pthread_create(&th, NULL, pw_allreduce_loop, &b);
	pw_ring(g, seed, 1000, 3);
	pthread_join(th, NULL);
}

static void
pw_errors(cohort_group *g)
{
	int r = cohort_group_rank(g), n = cohort_group_size(g);
	uint8_t b[4];
	cohort_work *w = NULL;

	PW_CHECK(
	    cohort_send(g, b, 4, COHORT_U8, r, 0, NULL, 1000) == COHORT_EINVAL,
	    "send to self");
	PW_CHECK(strstr(cohort_last_error(), "is this rank") != NULL, "%s",
	    cohort_last_error());
	PW_CHECK(
	    cohort_recv(g, b, 4, COHORT_U8, n, 0, NULL, 1000) == COHORT_EINVAL,
	    "recv from rank n");
	PW_CHECK(
	    cohort_isend(g, b, 4, COHORT_U8, COHORT_ANY_SOURCE, 0, NULL, &w)
	        == COHORT_EINVAL,
	    "send to any rank");
	PW_CHECK(cohort_isend(g, NULL, 4, COHORT_U8, (r + 1) % n, 0, NULL, &w)
	        == COHORT_EINVAL,
	    "NULL buffer");
	PW_CHECK(
	    cohort_irecv(g, b, 4, (cohort_dtype)99, (r + 1) % n, 0, NULL, &w)
	        == COHORT_EINVAL,
	    "bad dtype");
	PW_CHECK(cohort_group_error(g) == COHORT_OK,
	    "argument errors poisoned the group");
}

static int
scen_basic(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	uint64_t seed = (uint64_t)tw_arg(arg, 1);
	char what[96];

	pw_errors(g);
	pw_ring(g, seed, 0, 2);
	pw_pingpong(g, seed);
	pw_gather_any(g, seed);
	pw_batch(g, seed);
	pw_alltoallv(g, seed, false);
	pw_alltoallv(g, seed + 1, true);
	pw_beside(g, seed);
	PW_OK(cohort_barrier(g, "basic-end", 60000));
	snprintf(
	    what, sizeof(what), "basic backend=%s", cohort_group_backend(g));
	return (pw_result(what));
}

/* ------------------------------------------------------------------------ */
/* killed, mismatch, timeout                                                */
/* ------------------------------------------------------------------------ */

static int
scen_killed(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int r = cohort_group_rank(g);
	uint8_t b[64];
	cohort_work *w = NULL;
	cohort_status st;
	int64_t t0;

	(void)arg;
	memset(b, 0, sizeof(b));
	/* One exchange with rank 0 first: the connection is made. */
	if (r == 0) {
		for (int p = 1; p < cohort_group_size(g); p++)
			PW_OK(cohort_send(
			    g, b, 64, COHORT_U8, p, 1, NULL, 60000));
		printf("READY rank=%d pid=%d\n", r, (int)getpid());
		fflush(stdout);
		sleep(120);
		return (1);
	}
	PW_OK(cohort_recv(g, b, 64, COHORT_U8, 0, 1, NULL, 60000));
	PW_OK(cohort_irecv(g, b, 64, COHORT_U8, 0, 2, NULL, &w));
	printf("READY rank=%d pid=%d\n", r, (int)getpid());
	fflush(stdout);
	t0 = tw_now_ms();
	st = cohort_work_wait(w, 60000);
	printf("RESULT recv status=%s ms=%" PRId64 " detail=%s\n",
	    cohort_status_name(st), tw_now_ms() - t0, cohort_last_error());
	cohort_work_free(w);
	st = cohort_send(g, b, 4, COHORT_U8, 0, 3, NULL, 1000);
	printf("RESULT sticky status=%s detail=%s\n", cohort_status_name(st),
	    cohort_last_error());
	fflush(stdout);
	return (3);
}

static int
scen_mismatch(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int r = cohort_group_rank(g);
	float b[100];
	cohort_status st;

	(void)arg;
	memset(b, 0, sizeof(b));
	/* Through cohortd a send completes once cohortd holds it: only the
	 * receive can tell. */
	bool buffered = strcmp(cohort_group_backend(g), "service") == 0;

	if (r <= 1) {
		st = r == 0
		    ? cohort_send(g, b, 100, COHORT_F32, 1, 0, NULL, 60000)
		    : cohort_recv(g, b, 64, COHORT_F32, 0, 0, NULL, 60000);
		printf("RESULT mismatch status=%s detail=%s\n",
		    cohort_status_name(st), cohort_last_error());
		if (r == 0 && buffered) {
			PW_CHECK(st == COHORT_OK, "expected OK (buffered)");
		} else {
			PW_CHECK(st == COHORT_EMISMATCH, "expected EMISMATCH");
			PW_CHECK(
			    strstr(cohort_last_error(), "400 bytes") != NULL
			        && strstr(cohort_last_error(), "256 bytes")
			            != NULL,
			    "sizes not named");
		}
		st = r == 0
		    ? cohort_send(g, b, 8, COHORT_F32, 1, 0, NULL, 60000)
		    : cohort_recv(g, b, 8, COHORT_F32, 0, 0, NULL, 60000);
		PW_CHECK(st == COHORT_OK, "the next transfer: %s: %s",
		    cohort_status_name(st), cohort_last_error());
	}
	PW_OK(cohort_barrier(g, "mismatch-end", 60000));
	return (pw_result("mismatch-scenario"));
}

static int
scen_timeout(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int r = cohort_group_rank(g);
	uint8_t b[8];
	void *v = NULL;
	cohort_status st;
	int64_t t0;

	(void)arg;
	memset(b, 0, sizeof(b));
	if (r == 0) {
		/* Alive and connected, but never sends tag 5. */
		PW_OK(cohort_send(g, b, 8, COHORT_U8, 1, 1, NULL, 60000));
		PW_OK(cohort_kv_get(c, "p2p-timeout-done", &v, NULL, 60000));
		cohort_free(v);
		return (pw_result("timeout-scenario"));
	}
	if (r == 1) {
		PW_OK(cohort_recv(g, b, 8, COHORT_U8, 0, 1, NULL, 60000));
		t0 = tw_now_ms();
		st = cohort_recv(g, b, 8, COHORT_U8, 0, 5, NULL, 500);
		printf("RESULT timeout status=%s ms=%" PRId64 " detail=%s\n",
		    cohort_status_name(st), tw_now_ms() - t0,
		    cohort_last_error());
		PW_CHECK(st == COHORT_ETIMEDOUT, "expected ETIMEDOUT");
		PW_CHECK(strstr(cohort_last_error(), "never sent the message")
		        != NULL,
		    "detail does not say what it waited for");
		PW_CHECK(cohort_group_error(g) == COHORT_ETIMEDOUT,
		    "the timeout is not the group's sticky error: %s",
		    cohort_status_name(cohort_group_error(g)));
		PW_OK(cohort_kv_set(c, "p2p-timeout-done", "1", 1, 10000));
	}
	return (pw_result("timeout-scenario"));
}

/* Ranks 0 and 1: ping-pong times (median of ARG round trips, default
 * 200) and one-way bandwidth of a stream of 8 back-to-back isends, per
 * size, as MEASURE lines; an allreduce of the same size for scale. */
static int
pw_cmp_i64(const void *a, const void *b)
{
	int64_t x = *(const int64_t *)a, y = *(const int64_t *)b;

	return (x < y ? -1 : x > y);
}

static int
scen_bench(cohort_client *c, const char *arg)
{
	static const size_t sizes[]
	    = { 8, 4096, 65536, 1u << 20, 16u << 20, 64u << 20 };
	cohort_group *g = cohort_client_world(c);
	int r = cohort_group_rank(g), iters = (int)tw_arg(arg, 200);
	int64_t *t = calloc((size_t)iters, sizeof(*t));

	for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]) && r < 2;
	     z++) {
		size_t len = sizes[z];
		uint8_t *b = calloc(1, len);
		int n = len >= (16u << 20) ? iters / 20 + 2 : iters;
		cohort_work *w[8];
		int64_t t0, bw_ns;

		for (int k = 0; k < n; k++) {
			t0 = tw_clock_ns(CLOCK_MONOTONIC);
			if (r == 0) {
				PW_OK(cohort_send(
				    g, b, len, COHORT_U8, 1, 0, NULL, 60000));
				PW_OK(cohort_recv(
				    g, b, len, COHORT_U8, 1, 0, NULL, 60000));
			} else {
				PW_OK(cohort_recv(
				    g, b, len, COHORT_U8, 0, 0, NULL, 60000));
				PW_OK(cohort_send(
				    g, b, len, COHORT_U8, 0, 0, NULL, 60000));
			}
			t[k] = tw_clock_ns(CLOCK_MONOTONIC) - t0;
		}
		qsort(t, (size_t)n, sizeof(*t), pw_cmp_i64);
		/* Bandwidth: 8 messages in flight, then one ack back. */
		PW_OK(cohort_barrier(g, "bw", 60000));
		t0 = tw_clock_ns(CLOCK_MONOTONIC);
		for (int k = 0; k < 8; k++)
			if (r == 0)
				PW_OK(cohort_isend(
				    g, b, len, COHORT_U8, 1, 1, NULL, &w[k]));
			else
				PW_OK(cohort_irecv(
				    g, b, len, COHORT_U8, 0, 1, NULL, &w[k]));
		for (int k = 0; k < 8; k++) {
			PW_OK(cohort_work_wait(w[k], 60000));
			cohort_work_free(w[k]);
		}
		if (r == 0)
			PW_OK(cohort_recv(
			    g, b, 1, COHORT_U8, 1, 2, NULL, 60000));
		else
			PW_OK(cohort_send(
			    g, b, 1, COHORT_U8, 0, 2, NULL, 60000));
		bw_ns = tw_clock_ns(CLOCK_MONOTONIC) - t0;
		if (r == 0)
			printf("MEASURE p2p backend=%s bytes=%zu "
			       "rtt_median_us=%.1f oneway_us=%.1f "
			       "stream_GBps=%.2f\n",
			    cohort_group_backend(g), len,
			    (double)t[n / 2] / 1e3, (double)t[n / 2] / 2e3,
			    8.0 * (double)len / (double)bw_ns);
		free(b);
	}
	free(t);
	PW_OK(cohort_barrier(g, "bench-end", 120000));
	return (pw_result("bench"));
}

static const struct tw_scenario pw_scenarios[] = {
	{ "bench", scen_bench },
	{ "basic", scen_basic },
	{ "killed", scen_killed },
	{ "mismatch", scen_mismatch },
	{ "timeout", scen_timeout },
};

int
main(int argc, char **argv)
{
	cohort_client *c = NULL;
	int rc;

	if ((rc = tw_worker_start(argc, argv, "cohort-p2p-worker", &c)) != 0)
		return (rc);
	rc = tw_scenario_run(
	    c, pw_scenarios, TW_NELEM(pw_scenarios), argc, argv);
	cohort_client_close(c);
	return (rc);
}
