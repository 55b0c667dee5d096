/*
 * test_tcp_algos.c - the collectives of the tcp backend
 * (client/backend/host/algos.c and, for the allreduce, broadcast, allgather
 * and reduce_scatter of one host, shm.c): every collective x dtype x op x
 * in and out of place on 1 to 8 ranks in every mode of tcp_fixture.h,
 * several MiB per rank, two groups at once, ranks that disagree on a
 * collective (also in the fused all-reduce), and groups larger than
 * COHORT_TCP_MESH_MAX (connections on first use, only to the peers the
 * algorithms use; the agreement by recursive doubling).
 */
#include <poll.h>
#include <stdio.h>
#include <string.h>

#include "tcp_fixture.h"
#include "unit_suite.h"

/* ------------------------------------------------------------------------ */
/* Correctness: every collective x dtype x op x in/out of place             */
/* ------------------------------------------------------------------------ */

static const enum cohort__op_kind tt_reducing[]
    = { COHORT__OP_ALLREDUCE, COHORT__OP_REDUCE, COHORT__OP_REDUCE_SCATTER };
static const enum cohort__op_kind tt_moving[] = { COHORT__OP_BROADCAST,
	COHORT__OP_ALLGATHER, COHORT__OP_ALLGATHERV, COHORT__OP_ALLTOALL,
	COHORT__OP_GATHER, COHORT__OP_SCATTER, COHORT__OP_BARRIER };

static void
tt_body_matrix(struct tt_group *g, int r, void *state)
{
	uint64_t seq = 0;
	int n = g->n;

	for (size_t k = 0; k < 3; k++) {
		for (int dt = 0; dt < COHORT_DTYPE_COUNT; dt++) {
			for (int o = 0; o < COHORT_REDOP_COUNT; o++) {
				size_t counts[4];
				uint64_t h;

				if (o == COHORT_MEAN
				    && !cohort__dtype_is_float(
				        (cohort_dtype)dt))
					continue;
				h = tw_mix(g->seed + seq);
				/* 0, 1, an odd count, and one past the
				 * small-message threshold (ring) */
				counts[0] = 0;
				counts[1] = 1;
				counts[2] = 2 * (h % 600) + 3;
				counts[3] = (k == 0 ? 20001 : 3001)
				    + 2 * (h % 20000);
				for (int c = 0; c < 4; c++) {
					for (int ip = 0; ip < 2; ip++) {
						struct tt_spec sp = {
							.kind = tt_reducing[k],
							.dt = (cohort_dtype)dt,
							.op = (cohort_redop)o,
							.inplace = ip == 1,
							.count = counts[c],
							.root = (int)(h
							    % (uint64_t)n),
							.seed = g->seed + seq,
						};

						seq++;
						tt_one(g, r, state, &sp, seq);
					}
				}
			}
		}
	}
	for (size_t k = 0; k < sizeof(tt_moving) / sizeof(tt_moving[0]); k++) {
		static const cohort_dtype dts[]
		    = { COHORT_U8, COHORT_F32, COHORT_F64 };

		for (int d = 0; d < 3; d++) {
			for (int c = 0; c < 5; c++) {
				uint64_t h = tw_mix(g->seed + seq);
				size_t cnt = c == 0 ? 0
				    : c == 1        ? 1
				    : c == 2        ? 2 * (h % 500) + 1
				    : c == 3        ? 40001 + 2 * (h % 9000)
				                    : 300001;

				if (c == 4 && d != 0)
					continue;
				for (int ip = 0; ip < 2; ip++) {
					struct tt_spec sp = {
						.kind = tt_moving[k],
						.dt = dts[d],
						.op = COHORT_SUM,
						.inplace = ip == 1,
						.count = cnt,
						.root = (int)(h % (uint64_t)n),
						.seed = g->seed + seq,
					};

					if (tt_moving[k] == COHORT__OP_ALLTOALL
					    && ip == 1)
						continue;
					seq++;
					tt_one(g, r, state, &sp, seq);
				}
			}
		}
	}
}

START_TEST(test_tcp_matrix)
{
	static struct tt_group g;
	/* shm and tcp at every size, the mix at 3 and 4 ranks */
	int n = 2 + _i % (TT_MAX_RANKS - 1);
	int mode = _i / (TT_MAX_RANKS - 1);

	if (mode == TT_MIXED)
		n = 3 + _i % 2;
	/* The agreement of every rank with every other at 3, 4 and 8 ranks
	 * (with more ranks than CPUs, the default folds), and the fused
	 * all-reduce at 4 and 8 (2 by default). */
	if (_i >= 2 * (TT_MAX_RANKS - 1) + 2) {
		static const int ns[] = { 3, 4, 8 };

		mode = TT_PURE;
		n = ns[_i - (2 * (TT_MAX_RANKS - 1) + 2)];
		setenv("COHORT_TCP_FUSED_RANKS", "8", 1);
		setenv("COHORT_TCP_AGREE_FOLD", "0", 1);
	}

	tt_set_mode(mode);
	tt_run_group(n, "matrix", tt_body_matrix, &g);
	unsetenv("COHORT_TCP_FUSED_RANKS");
	unsetenv("COHORT_TCP_AGREE_FOLD");
	tt_assert_mode(&g, mode);
	tt_assert_no_failures(&g);
	for (int r = 1; r < n; r++)
		ck_assert_msg(g.hash[r] == g.hash[0],
		    "allreduce results differ between rank 0 and rank %d", r);
}
END_TEST

/* Several MiB per rank, the ring and chain paths at full length. */
static void
tt_body_big(struct tt_group *g, int r, void *state)
{
	int n = g->n;
	const struct tt_spec specs[] = {
		{ COHORT__OP_ALLREDUCE, COHORT_F32, COHORT_SUM, false,
		    (6u << 20) / 4 + 3, 0, 11 },
		{ COHORT__OP_ALLREDUCE, COHORT_F32, COHORT_SUM, true,
		    (6u << 20) / 4 + 1, 0, 12 },
		{ COHORT__OP_ALLREDUCE, COHORT_BF16, COHORT_MEAN, true,
		    (3u << 20) + 5, 0, 13 },
		{ COHORT__OP_ALLREDUCE, COHORT_I64, COHORT_MAX, false,
		    (1u << 19) + 7, 0, 14 },
		{ COHORT__OP_REDUCE, COHORT_F64, COHORT_SUM, false,
		    (1u << 19) + 3, n - 1, 15 },
		{ COHORT__OP_REDUCE, COHORT_F32, COHORT_MIN, true,
		    (1u << 20) + 3, 0, 16 },
		{ COHORT__OP_REDUCE_SCATTER, COHORT_F32, COHORT_MEAN, false,
		    (1u << 20) / (size_t)n + 1, 0, 17 },
		{ COHORT__OP_REDUCE_SCATTER, COHORT_I32, COHORT_SUM, true,
		    (1u << 20) / (size_t)n + 3, 0, 18 },
		{ COHORT__OP_ALLGATHER, COHORT_U8, COHORT_SUM, false,
		    (2u << 20) + 1, 0, 19 },
		{ COHORT__OP_BROADCAST, COHORT_U8, COHORT_SUM, false,
		    (8u << 20) + 3, n / 2, 20 },
		{ COHORT__OP_ALLTOALL, COHORT_F32, COHORT_SUM, false,
		    (1u << 18) + 1, 0, 21 },
	};

	for (size_t k = 0; k < sizeof(specs) / sizeof(specs[0]); k++)
		tt_one(g, r, state, &specs[k], k + 1);
}

START_TEST(test_tcp_big)
{
	static struct tt_group g;
	static const int ns[] = { 2, 3, 4 };
	int mode = _i / 3;
	int n = ns[_i % 3];

	/* The last loop: 2 ranks over TCP by the pairwise exchange (off by
	 * default, the ring is faster on loopback and veth). */
	if (_i == 2 * 3 + 1) {
		mode = TT_PURE;
		n = 2;
		setenv("COHORT_TCP_PAIR_MAX", "-1", 1);
	}
	tt_set_mode(mode);
	tt_run_group(n, "big", tt_body_big, &g);
	unsetenv("COHORT_TCP_PAIR_MAX");
	tt_assert_mode(&g, mode);
	tt_assert_no_failures(&g);
}
END_TEST

/* Two groups at once, each with its own threads and group id. */
static void
tt_body_some(struct tt_group *g, int r, void *state)
{
	for (int k = 0; k < 40; k++) {
		struct tt_spec sp = {
			.kind = k % 3 == 2 ? COHORT__OP_BROADCAST
			                   : COHORT__OP_ALLREDUCE,
			.dt = COHORT_F32,
			.op = COHORT_SUM,
			.inplace = k % 2,
			.count = k % 5 == 0 ? 200001 : 1000 + (size_t)k,
			.root = k % g->n,
			.seed = g->seed + (uint64_t)k,
		};

		tt_one(g, r, state, &sp, (uint64_t)k + 1);
	}
}

START_TEST(test_tcp_two_groups)
{
	static struct tt_group a, b;
	struct tt_store s;

	tt_store_init(&s);
	tt_group_setup(&a, &s, 3, "groupA", tt_body_some);
	tt_group_setup(&b, &s, 2, "groupB", tt_body_some);
	b.seed = 999;
	tt_group_start(&a, 0);
	tt_group_start(&b, 1);
	tt_group_join(&a);
	tt_group_join(&b);
	tt_assert_no_failures(&a);
	tt_assert_no_failures(&b);
	tt_store_fini(&s);
}
END_TEST

/*
 * Finding 6 of issue 12: ranks that disagree on a collective. Before, the
 * tcp backend returned OK with wrong data (counts 64 vs 256: rank 1's
 * elements 63..254 were 0). Now every rank gets EMISMATCH naming both
 * sides. Loop i: scenario i / 2 on the shared-memory (even) or pure TCP
 * (odd) path.
 */
/* One step of one rank: kind 0 is the same matching broadcast on both
 * ranks; op and dtype 0 are sum and f32. */
struct tt_mm_op {
	enum cohort__op_kind kind;
	size_t count;
	int root;
	cohort_redop op;
	cohort_dtype dtype;
};

struct tt_mm_case {
	const char *name;
	struct tt_mm_op op[2][2]; /* [rank][step]: two operations */
	const char *want[2]; /* both must be in the detail */
};

#define TT_AR COHORT__OP_ALLREDUCE
#define TT_BC COHORT__OP_BROADCAST

static const struct tt_mm_case tt_mm_cases[] = {
	{ "count", { { { TT_AR, 64, 0, 0, 0 } }, { { TT_AR, 256, 0, 0, 0 } } },
	    { "rank 100 count 64", "rank 101 count 256" } },
	{ "root", { { { TT_BC, 64, 0, 0, 0 } }, { { TT_BC, 64, 1, 0, 0 } } },
	    { "rank 100 root 0", "rank 101 root 1" } },
	{ "op",
	    { { { TT_AR, 64, 0, COHORT_SUM, 0 } },
	        { { TT_AR, 64, 0, COHORT_MAX, 0 } } },
	    { "rank 100 op sum", "rank 101 op max" } },
	{ "dtype",
	    { { { TT_AR, 64, 0, COHORT_SUM, COHORT_F32 } },
	        { { TT_AR, 64, 0, COHORT_SUM, COHORT_F64 } } },
	    { "rank 100 dtype f32", "rank 101 dtype f64" } },
	{ "order",
	    { { { TT_AR, 64, 0, 0, 0 }, { TT_BC, 64, 0, 0, 0 } },
	        { { TT_BC, 64, 0, 0, 0 }, { TT_AR, 64, 0, 0, 0 } } },
	    { "rank 100 allreduce", "rank 101 broadcast" } },
};

#define TT_MM_CASES (sizeof(tt_mm_cases) / sizeof(tt_mm_cases[0]))

static int tt_mm_case_i;
static cohort_status tt_mm_rv[2][2];
static char tt_mm_err[2][2][TT_ERRLEN];

static void
tt_body_mismatch(struct tt_group *g, int r, void *state)
{
	const struct tt_mm_case *c = &tt_mm_cases[tt_mm_case_i];
	double *buf = calloc(512, sizeof(double));

	for (int k = 0; k < 2; k++) {
		const struct tt_mm_op *m = &c->op[r][k];
		struct cohort__op op;

		memset(&op, 0, sizeof(op));
		op.kind = m->kind != 0 ? m->kind : COHORT__OP_BROADCAST;
		op.count = m->kind != 0 ? m->count : 16;
		op.root = m->root;
		op.op = m->op != 0 ? m->op : COHORT_SUM;
		op.dtype = m->dtype != 0 ? m->dtype : COHORT_F32;
		op.send = buf;
		op.recv = buf;
		op.seq = (uint64_t)k + 1;
		tt_mm_rv[r][k] = cohort__host_backend.run(state, &op,
		    tt_mm_err[r][k], TT_ERRLEN, cohort__now_ms() + 20000);
	}
	free(buf);
}

START_TEST(test_tcp_mismatch_detected)
{
	static struct tt_group g;
	const struct tt_mm_case *c = &tt_mm_cases[_i / 2];
	int mode = _i % 2 == 0 ? TT_SHM : TT_PURE;

	tt_mm_case_i = _i / 2;
	memset(tt_mm_rv, 0, sizeof(tt_mm_rv));
	memset(tt_mm_err, 0, sizeof(tt_mm_err));
	tt_set_mode(mode);
	tt_run_group(2, "mm", tt_body_mismatch, &g);
	tt_assert_mode(&g, mode);
	for (int r = 0; r < 2; r++) {
		fprintf(stderr, "mismatch %s (%s) rank %d: %s: %s\n", c->name,
		    tt_mode_name[mode], r, cohort_status_name(tt_mm_rv[r][0]),
		    tt_mm_err[r][0]);
		ck_assert_msg(tt_mm_rv[r][0] == COHORT_EMISMATCH,
		    "%s: rank %d got %s: %s", c->name, r,
		    cohort_status_name(tt_mm_rv[r][0]), tt_mm_err[r][0]);
		ck_assert_msg(strstr(tt_mm_err[r][0], c->want[0]) != NULL
		        && strstr(tt_mm_err[r][0], c->want[1]) != NULL,
		    "%s: rank %d: '%s' does not name '%s' and '%s'", c->name,
		    r, tt_mm_err[r][0], c->want[0], c->want[1]);
	}
	/* A disagreement found before any data moved leaves the group
	 * usable: the next (matching) broadcast works; over TCP also after
	 * the fused all-reduce's operands (read and dropped where they did
	 * not match). */
	if (strcmp(c->name, "root") == 0
	    || (mode == TT_PURE && strcmp(c->name, "order") != 0))
		for (int r = 0; r < 2; r++)
			ck_assert_msg(tt_mm_rv[r][1] == COHORT_OK,
			    "rank %d after the mismatch: %s: %s", r,
			    cohort_status_name(tt_mm_rv[r][1]),
			    tt_mm_err[r][1]);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Large groups (more than COHORT_TCP_MESH_MAX ranks): connections on first */
/* use, agreement by recursive doubling                                     */
/* ------------------------------------------------------------------------ */

/* Every collective of the matrix with every group "large" (mesh_max 2):
 * the engines connect each step's peers on first use. */
START_TEST(test_tcp_sparse_matrix)
{
	static struct tt_group g;
	static const int ns[] = { 3, 5, 8 };

	setenv("COHORT_TCP_MESH_MAX", "2", 1);
	tt_set_mode(TT_PURE);
	tt_run_group(ns[_i], "sparse", tt_body_matrix, &g);
	unsetenv("COHORT_TCP_MESH_MAX");
	tt_assert_mode(&g, TT_PURE);
	tt_assert_no_failures(&g);
	for (int r = 1; r < g.n; r++)
		ck_assert_msg(g.hash[r] == g.hash[0],
		    "allreduce results differ between rank 0 and rank %d", r);
}
END_TEST

static int tt_sparse_links[TT_MAX_RANKS];
static bool tt_sparse_extra[TT_MAX_RANKS];

/* Barriers and all-reduces (recursive doubling and ring) only: each rank
 * must be connected to its recursive-doubling partners and ring
 * neighbours, and to nobody else. */
static void
tt_body_sparse_links(struct tt_group *g, int r, void *state)
{
	const struct cohort__host *h = state;
	struct cohort__op bar = { .kind = COHORT__OP_BARRIER };
	int n = g->n, p2 = 1;
	uint64_t seq = 0;

	for (int k = 0; k < 3; k++) {
		struct tt_spec sp = { .kind = COHORT__OP_ALLREDUCE,
			.dt = COHORT_F32,
			.op = COHORT_SUM,
			.count = k == 1 ? 100003 : 7,
			.seed = g->seed + (uint64_t)k };
		char err[TT_ERRLEN];

		tt_one(g, r, state, &sp, ++seq);
		bar.seq = ++seq;
		if (cohort__host_backend.run(state, &bar, err, sizeof(err),
		        cohort__now_ms() + 20000)
		    != COHORT_OK) {
			fprintf(stderr, "rank %d: barrier: %s\n", r, err);
			atomic_fetch_add(&g->failures, 1);
		}
	}
	while (p2 * 2 <= n)
		p2 *= 2;
	for (int p = 0; p < n; p++) {
		bool want = p == (r + 1) % n || p == (r + n - 1) % n;
		int extra = n - p2;
		int vr = r < 2 * extra ? (r & 1 ? r / 2 : -1) : r - extra;

		if (p == r || h->mesh.links[p].fd < 0)
			continue;
		tt_sparse_links[r]++;
		if (r < 2 * extra && (r ^ 1) == p)
			want = true; /* the fold partner */
		for (int mask = 1; vr >= 0 && mask < p2; mask <<= 1) {
			int vp = vr ^ mask;

			if (p == (vp < extra ? vp * 2 + 1 : vp + extra))
				want = true;
		}
		if (!want)
			tt_sparse_extra[r] = true;
	}
}

START_TEST(test_tcp_sparse_links)
{
	static struct tt_group g;

	memset(tt_sparse_links, 0, sizeof(tt_sparse_links));
	memset(tt_sparse_extra, 0, sizeof(tt_sparse_extra));
	setenv("COHORT_TCP_MESH_MAX", "4", 1);
	tt_set_mode(TT_PURE);
	tt_run_group(TT_MAX_RANKS, "links", tt_body_sparse_links, &g);
	unsetenv("COHORT_TCP_MESH_MAX");
	tt_assert_mode(&g, TT_PURE);
	tt_assert_no_failures(&g);
	for (int r = 0; r < g.n; r++) {
		fprintf(stderr, "sparse: rank %d of %d has %d connections\n",
		    r, g.n, tt_sparse_links[r]);
		ck_assert_msg(!tt_sparse_extra[r],
		    "rank %d is connected to a peer its algorithms do not "
		    "use",
		    r);
		ck_assert_int_lt(tt_sparse_links[r], g.n - 1);
	}
}
END_TEST

/* The recursive-doubling agreement: one rank of 7 (not a power of two:
 * folded ranks too) enters another count; every rank gets EMISMATCH
 * naming both counts, and the group stays usable. */
static cohort_status tt_sp_rv[TT_MAX_RANKS][2];
static char tt_sp_err[TT_MAX_RANKS][TT_ERRLEN];

static void
tt_body_sparse_mismatch(struct tt_group *g, int r, void *state)
{
	double *buf = calloc(512, sizeof(double));
	struct cohort__op op = { .kind = COHORT__OP_ALLREDUCE,
		.send = buf,
		.recv = buf,
		.count = r == 4 ? 256 : 64,
		.dtype = COHORT_F64,
		.op = COHORT_SUM,
		.seq = 1 };
	char err[TT_ERRLEN];

	tt_sp_rv[r][0] = cohort__host_backend.run(
	    state, &op, tt_sp_err[r], TT_ERRLEN, cohort__now_ms() + 20000);
	op.count = 64;
	op.seq = 2;
	tt_sp_rv[r][1] = cohort__host_backend.run(
	    state, &op, err, sizeof(err), cohort__now_ms() + 20000);
	free(buf);
}

START_TEST(test_tcp_sparse_mismatch)
{
	static struct tt_group g;

	setenv("COHORT_TCP_MESH_MAX", "2", 1);
	tt_set_mode(TT_PURE);
	tt_run_group(7, "spmm", tt_body_sparse_mismatch, &g);
	unsetenv("COHORT_TCP_MESH_MAX");
	tt_assert_mode(&g, TT_PURE);
	for (int r = 0; r < 7; r++) {
		ck_assert_msg(tt_sp_rv[r][0] == COHORT_EMISMATCH,
		    "rank %d: %s: %s", r, cohort_status_name(tt_sp_rv[r][0]),
		    tt_sp_err[r]);
		ck_assert_msg(strstr(tt_sp_err[r], "count 64") != NULL
		        && strstr(tt_sp_err[r], "rank 104 count 256") != NULL,
		    "rank %d: %s", r, tt_sp_err[r]);
		ck_assert_msg(tt_sp_rv[r][1] == COHORT_OK,
		    "rank %d after the mismatch: %s", r,
		    cohort_status_name(tt_sp_rv[r][1]));
	}
}
END_TEST

/* The fused all-reduce (a group of 2, 4, 8.. ranks: the first round's
 * operands travel with the agreement): a rank that disagrees gets and
 * sends a payload nobody expected, which is read and dropped, so every
 * rank gets EMISMATCH naming both sides and the next operation (a
 * matching all-reduce, checked) still works. Loop 0: rank 3 enters
 * another count (its partner, rank 2, drops the larger operand); 1: rank
 * 1 enters a broadcast (its partner's operand arrives at an agreement
 * without one); 2: rank 0 enters f64 (both sizes differ); 3: the same
 * count mismatch agreed by the recursive-doubling fold
 * (COHORT_TCP_AGREE_FOLD=1), whose messages carry the small all-reduce's
 * operands (COHORT_TCP_FUSED_FOLD_MAX): rank 3's longer ones are read and
 * dropped; 4: the fold with rank 1 in a broadcast (its fold messages
 * carry nothing, its partners' operands are dropped); 5: the fold with
 * rank 0 in f64. In every case the disagreeing operation leaves every
 * rank's buffer as it was. */
static cohort_status tt_fu_rv[TT_MAX_RANKS][2];
static char tt_fu_err[TT_MAX_RANKS][TT_ERRLEN];
static double tt_fu_sum[TT_MAX_RANKS];
static bool tt_fu_kept[TT_MAX_RANKS];
static int tt_fu_case;

static void
tt_body_fused_mismatch(struct tt_group *g, int r, void *state)
{
	double *buf = calloc(512, sizeof(double));
	struct cohort__op op = { .kind = COHORT__OP_ALLREDUCE,
		.send = buf,
		.recv = buf,
		.count = 64,
		.dtype = COHORT_F32,
		.op = COHORT_SUM,
		.seq = 1 };
	char err[TT_ERRLEN];
	float *f = (float *)buf;
	uint8_t before[512 * sizeof(double)];

	if ((tt_fu_case == 0 || tt_fu_case == 3) && r == 3)
		op.count = 256;
	if ((tt_fu_case == 1 || tt_fu_case == 4) && r == 1)
		op.kind = COHORT__OP_BROADCAST;
	if ((tt_fu_case == 2 || tt_fu_case == 5) && r == 0)
		op.dtype = COHORT_F64;
	for (int i = 0; i < 512; i++)
		buf[i] = r + 0.25 * i;
	memcpy(before, buf, sizeof(before));
	tt_fu_rv[r][0] = cohort__host_backend.run(
	    state, &op, tt_fu_err[r], TT_ERRLEN, cohort__now_ms() + 20000);
	tt_fu_kept[r] = memcmp(before, buf, sizeof(before)) == 0;
	op.kind = COHORT__OP_ALLREDUCE;
	op.dtype = COHORT_F32;
	op.count = 64;
	op.seq = 2;
	for (int i = 0; i < 64; i++)
		f[i] = (float)(r + 1);
	tt_fu_rv[r][1] = cohort__host_backend.run(
	    state, &op, err, sizeof(err), cohort__now_ms() + 20000);
	tt_fu_sum[r] = 0;
	for (int i = 0; i < 64; i++)
		tt_fu_sum[r] += f[i];
	free(buf);
}

START_TEST(test_tcp_fused_mismatch)
{
	static struct tt_group g;
	static const char *const want[][2] = {
		{ "count 64", "rank 103 count 256" },
		{ "allreduce", "rank 101 broadcast" },
		{ "rank 100 dtype f64", "dtype f32" },
		{ "count 64", "rank 103 count 256" },
		{ "allreduce", "rank 101 broadcast" },
		{ "rank 100 dtype f64", "dtype f32" },
	};

	tt_fu_case = _i;
	setenv("COHORT_TCP_FUSED_RANKS", "4", 1);
	setenv("COHORT_TCP_AGREE_FOLD", _i >= 3 ? "1" : "0", 1);
	tt_set_mode(TT_PURE);
	tt_run_group(4, "fumm", tt_body_fused_mismatch, &g);
	unsetenv("COHORT_TCP_FUSED_RANKS");
	unsetenv("COHORT_TCP_AGREE_FOLD");
	tt_assert_mode(&g, TT_PURE);
	for (int r = 0; r < 4; r++) {
		ck_assert_msg(tt_fu_rv[r][0] == COHORT_EMISMATCH,
		    "case %d rank %d: %s: %s", _i, r,
		    cohort_status_name(tt_fu_rv[r][0]), tt_fu_err[r]);
		ck_assert_msg(strstr(tt_fu_err[r], want[_i][0]) != NULL
		        && strstr(tt_fu_err[r], want[_i][1]) != NULL,
		    "case %d rank %d: '%s'", _i, r, tt_fu_err[r]);
		ck_assert_msg(tt_fu_kept[r],
		    "case %d rank %d: the failed operation changed its buffer",
		    _i, r);
		ck_assert_msg(tt_fu_rv[r][1] == COHORT_OK,
		    "case %d rank %d after the mismatch: %s", _i, r,
		    cohort_status_name(tt_fu_rv[r][1]));
		/* 64 elements of 1 + 2 + 3 + 4 */
		ck_assert_msg(tt_fu_sum[r] == 640.0, "case %d rank %d: %g", _i,
		    r, tt_fu_sum[r]);
	}
}
END_TEST

/* The agreement's shape and the fused all-reduce's limit are rank 0's
 * on every rank (a host's CPU count and a rank's environment may differ;
 * ranks agreeing by different shapes would wait for each other until
 * their deadlines). Rank 0 starts alone with one setting and reads it; the
 * others start with the other. Loop 0: rank 0 folds, the others would
 * not; loop 1: rank 0 agrees every rank with every other and fuses up to 4
 * ranks, the others would fold. 20 all-reduces of 4 KiB, each checked. */
static cohort_status tt_sh_rv[TT_MAX_RANKS];
static int tt_sh_wrong[TT_MAX_RANKS];

static void
tt_body_shape(struct tt_group *g, int r, void *state)
{
	float buf[1024];

	tt_sh_rv[r] = COHORT_OK;
	tt_sh_wrong[r] = 0;
	for (int i = 0; i < 20 && tt_sh_rv[r] == COHORT_OK; i++) {
		struct cohort__op op = tt_sum_op(buf, 1024, (uint64_t)i + 1);
		char err[TT_ERRLEN];

		for (int k = 0; k < 1024; k++)
			buf[k] = (float)(r + 1 + i);
		tt_sh_rv[r] = cohort__host_backend.run(
		    state, &op, err, sizeof(err), cohort__now_ms() + 5000);
		for (int k = 0; k < 1024; k++)
			if (buf[k] != (float)(10 + 4 * i))
				tt_sh_wrong[r]++;
	}
}

START_TEST(test_tcp_agreement_is_rank0s)
{
	static struct tt_group g;
	struct tt_store s;

	tt_set_mode(TT_PURE);
	setenv("COHORT_TCP_AGREE_FOLD", _i == 0 ? "1" : "0", 1);
	setenv("COHORT_TCP_FUSED_RANKS", _i == 0 ? "2" : "4", 1);
	tt_store_init(&s);
	tt_group_setup(&g, &s, 4, "shape", tt_body_shape);
	pthread_barrier_init(&g.done, NULL, 4);
	tt_rank_start(&g, 0, 0);
	(void)poll(NULL, 0, 300); /* rank 0 read its settings */
	setenv("COHORT_TCP_AGREE_FOLD", _i == 0 ? "0" : "1", 1);
	setenv("COHORT_TCP_FUSED_RANKS", "2", 1);
	for (int r = 1; r < 4; r++)
		tt_rank_start(&g, 0, r);
	tt_group_join(&g);
	unsetenv("COHORT_TCP_AGREE_FOLD");
	unsetenv("COHORT_TCP_FUSED_RANKS");
	tt_assert_mode(&g, TT_PURE);
	for (int r = 0; r < 4; r++) {
		ck_assert_msg(tt_sh_rv[r] == COHORT_OK, "loop %d rank %d: %s",
		    _i, r, cohort_status_name(tt_sh_rv[r]));
		ck_assert_int_eq(tt_sh_wrong[r], 0);
	}
	tt_store_fini(&s);
}
END_TEST

START_TEST(test_tcp_size_one) { tt_run_ok(1, "solo", tt_body_matrix); }
END_TEST

Suite *suite_tcp_algos(void);

Suite *
suite_tcp_algos(void)
{
	const TTest *tests[] = { test_tcp_size_one, test_tcp_two_groups,
		test_tcp_sparse_links, test_tcp_sparse_mismatch, NULL };
	const struct unit_loop loops[]
	    = { { test_tcp_matrix, 2 * (TT_MAX_RANKS - 1) + 5 },
		      { test_tcp_big, 2 * 3 + 2 },
		      { test_tcp_sparse_matrix, 3 }, { NULL, 0 } };
	const struct unit_loop mismatch[]
	    = { { test_tcp_mismatch_detected, 2 * (int)TT_MM_CASES },
		      { test_tcp_fused_mismatch, 6 },
		      { test_tcp_agreement_is_rank0s, 2 }, { NULL, 0 } };
	const struct unit_case cases[] = {
		{ "collectives", 120, tests, loops, NULL, NULL },
		{ "mismatch", 60, NULL, mismatch, NULL, NULL },
		{ NULL, 0, NULL, NULL, NULL, NULL },
	};

	return (unit_suite_cases("tcp_algos", cases));
}
