/*
 * cohort-coll-worker - a real worker process for the data-plane suites
 * (tests/integration/test_collectives.c, tests/fault/test_fault_data.c).
 *
 *   cohort-coll-worker SCENARIO [ARG]
 *
 * It joins the job of its environment (COHORT_*; COHORT_TEST_BACKEND picks
 * the world's data-plane backend, COHORT_TEST_MAXBYTES the largest
 * buffer), runs one scenario, prints "RESULT ..." lines and exits 0 when
 * its checks held, 1 otherwise.
 *
 * Inputs are a deterministic function of (seed, case, group rank, index),
 * so every rank computes every other rank's contribution and the expected
 * result itself: in double (floats) or wrapping 64-bit (integers)
 * arithmetic, independently of libcohort. Float inputs are small integers
 * and halves, exact in every float type, so only MEAN's division rounds:
 * results are compared with a relative tolerance per dtype.
 */
#include <inttypes.h>
#include <math.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort/cohort.h"
#include "th_elem.h" /* element load/store by dtype (tests/harness) */
#include "th_worker.h"

/* ------------------------------------------------------------------------ */
/* Values                                                                   */
/* ------------------------------------------------------------------------ */

/* The input element i of group rank q in case k. */
static uint64_t
cw_hash(uint64_t seed, uint64_t k, int q, size_t i)
{
	return (tw_mix(seed ^ tw_mix(k * 0x100000001b3ull + (uint64_t)q)
	    ^ (uint64_t)i * 0xff51afd7ed558ccdull));
}

static double
cw_fval(uint64_t h, cohort_redop op)
{
	static const double prod[4] = { 1.0, -1.0, 2.0, 0.5 };

	if (op == COHORT_PROD)
		return (prod[h & 3]);
	return ((double)((int)(h % 9) - 4) + ((h >> 8) & 1 ? 0.5 : 0.0));
}

static uint64_t
cw_ival(uint64_t h, cohort_dtype dt, cohort_redop op)
{
	if (op == COHORT_PROD)
		return (h % 3 + 1);
	if (dt == COHORT_U8)
		return (h & 0xff);
	return ((uint64_t)((int64_t)(h % 2001) - 1000));
}

/* Fills n elements of rank q's input of case k, starting at index i0. */
static void
cw_fill(void *buf, size_t n, cohort_dtype dt, cohort_redop op, uint64_t seed,
    uint64_t k, int q, size_t i0)
{
	bool fl = cohort__dtype_is_float(dt);

	for (size_t i = 0; i < n; i++) {
		uint64_t h = cw_hash(seed, k, q, i0 + i);

		if (fl)
			cohort__elem_store(buf, i, dt, cw_fval(h, op), 0);
		else
			cohort__elem_store(buf, i, dt, 0, cw_ival(h, dt, op));
	}
}

static double
cw_tol(cohort_dtype dt)
{
	switch (dt) {
	case COHORT_F32:
		return (1e-5);
	case COHORT_F64:
		return (1e-12);
	default:
		return (1e-2);
	}
}

/* Compares n elements of got with the reduction over ranks 0..size-1 of
 * element i0 + i. Returns the first bad index or -1. */
static long
cw_check_reduced(const void *got, size_t n, cohort_dtype dt, cohort_redop op,
    uint64_t seed, uint64_t k, int size, size_t i0, char *why, size_t wl)
{
	bool fl = cohort__dtype_is_float(dt);

	for (size_t i = 0; i < n; i++) {
		if (fl) {
			double acc = 0, v, g;

			for (int q = 0; q < size; q++) {
				v = cw_fval(cw_hash(seed, k, q, i0 + i), op);
				if (q == 0)
					acc = v;
				else if (op == COHORT_SUM || op == COHORT_MEAN)
					acc += v;
				else if (op == COHORT_PROD)
					acc *= v;
				else if (op == COHORT_MIN)
					acc = v < acc ? v : acc;
				else
					acc = v > acc ? v : acc;
			}
			if (op == COHORT_MEAN)
				acc /= size;
			g = cohort__elem_loadf(got, i, dt);
			if (!(fabs(g - acc) <= cw_tol(dt)
			            * (fabs(acc) > 1 ? fabs(acc) : 1))) {
				snprintf(why, wl,
				    "element %zu: got %g want %g", i, g, acc);
				return ((long)i);
			}
		} else {
			uint64_t acc = 0, v, g, mask;

			for (int q = 0; q < size; q++) {
				v = cw_ival(
				    cw_hash(seed, k, q, i0 + i), dt, op);
				if (q == 0)
					acc = v;
				else if (op == COHORT_SUM)
					acc += v;
				else if (op == COHORT_PROD)
					acc *= v;
				else if (dt == COHORT_U8)
					acc = (op == COHORT_MIN)
					        == ((v & 0xff) < (acc & 0xff))
					    ? v
					    : acc;
				else if (dt == COHORT_I32)
					acc = (op == COHORT_MIN)
					        == ((int32_t)v < (int32_t)acc)
					    ? v
					    : acc;
				else
					acc = (op == COHORT_MIN)
					        == ((int64_t)v < (int64_t)acc)
					    ? v
					    : acc;
			}
			mask = dt == COHORT_U8 ? 0xff
			    : dt == COHORT_I32 ? 0xffffffffull
			                       : ~0ull;
			g = cohort__elem_loadu(got, i, dt);
			if ((g & mask) != (acc & mask)) {
				snprintf(why, wl,
				    "element %zu: got %" PRIu64
				    " want %" PRIu64,
				    i, g & mask, acc & mask);
				return ((long)i);
			}
		}
	}
	return (-1);
}

/* Compares n elements of got with rank q's input at i0 (bitwise). */
static long
cw_check_copy(const void *got, size_t n, cohort_dtype dt, uint64_t seed,
    uint64_t k, int q, size_t i0, char *why, size_t wl)
{
	size_t es = cohort_dtype_size(dt);
	uint8_t tmp[256 * 8];

	for (size_t i = 0; i < n; i += 256) {
		size_t m = n - i < 256 ? n - i : 256;

		cw_fill(tmp, m, dt, COHORT_SUM, seed, k, q, i0 + i);
		if (memcmp(tmp, (const uint8_t *)got + i * es, m * es) != 0) {
			for (size_t j = 0; j < m; j++)
				if (memcmp(tmp + j * es,
				        (const uint8_t *)got + (i + j) * es,
				        es)
				    != 0) {
					snprintf(why, wl,
					    "element %zu (rank "
					    "%d) differs",
					    i + j, q);
					return ((long)(i + j));
				}
		}
	}
	return (-1);
}

/* ------------------------------------------------------------------------ */
/* The matrix                                                               */
/* ------------------------------------------------------------------------ */

enum cw_kind {
	CW_ALLREDUCE,
	CW_REDUCE,
	CW_BROADCAST,
	CW_ALLGATHER,
	CW_ALLGATHERV,
	CW_REDUCE_SCATTER,
	CW_ALLTOALL,
	CW_GATHER,
	CW_SCATTER,
	CW_NKINDS
};

static const char *const cw_kind_names[CW_NKINDS]
    = { "allreduce", "reduce", "broadcast", "allgather", "allgatherv",
	      "reduce_scatter", "alltoall", "gather", "scatter" };

struct cw_case {
	uint64_t k;
	enum cw_kind kind;
	cohort_dtype dt;
	cohort_redop op;
	int inplace; /* 0 out of place, 1 NCCL slot, 2 send == recv */
	size_t count;
	int root;
};

struct cw_run {
	cohort_group *g;
	uint64_t seed;
	size_t maxbytes;
	const char *label;
	long cases;
	long failed;
	int64_t ms;
};

static bool
cw_is_reduction(enum cw_kind kind)
{
	return (kind == CW_ALLREDUCE || kind == CW_REDUCE
	    || kind == CW_REDUCE_SCATTER);
}

/* Watchdog: the case in progress and since when; a thread prints it if
 * it takes too long, so that a hang is diagnosable from the output. */
static pthread_mutex_t cw_wd_mtx = PTHREAD_MUTEX_INITIALIZER;
static char cw_wd_what[256];
static int64_t cw_wd_since;

static void
cw_wd_set(const char *what)
{
	pthread_mutex_lock(&cw_wd_mtx);
	snprintf(cw_wd_what, sizeof(cw_wd_what), "%s", what);
	cw_wd_since = tw_now_ms();
	pthread_mutex_unlock(&cw_wd_mtx);
}

static void *
cw_wd_main(void *arg)
{
	int64_t reported = 0;

	(void)arg;
	for (;;) {
		sleep(1);
		pthread_mutex_lock(&cw_wd_mtx);
		if (cw_wd_since != 0 && cw_wd_since != reported
		    && tw_now_ms() - cw_wd_since > 20000) {
			printf("STUCK for %" PRId64 " ms in %s\n",
			    tw_now_ms() - cw_wd_since, cw_wd_what);
			fflush(stdout);
			reported = cw_wd_since;
		}
		pthread_mutex_unlock(&cw_wd_mtx);
	}
	return (NULL);
}

/* Runs one case on g; returns 0 if it held. */
static int
cw_case_run(struct cw_run *run, const struct cw_case *cs)
{
	cohort_group *g = run->g;
	int r = cohort_group_rank(g), n = cohort_group_size(g);
	size_t es = cohort_dtype_size(cs->dt), c = cs->count;
	size_t nb = (size_t)n * c, *counts = NULL, total = 0, off = 0;
	uint8_t *send = NULL, *recv = NULL, *sp, *rp;
	cohort_status st = COHORT_OK;
	char why[256] = "";
	long bad = -1;
	uint64_t s = run->seed, k = cs->k;

	send = malloc(nb * es + 64);
	recv = malloc(nb * es + 64);
	if (cs->kind == CW_ALLGATHERV) {
		counts = calloc((size_t)n, sizeof(*counts));
		for (int q = 0; q < n; q++) {
			counts[q] = tw_mix(s ^ k ^ (uint64_t)q) % (c + 1);
			if (q == r)
				off = total;
			total += counts[q];
		}
		free(recv);
		recv = malloc(total * es + 64);
	}
	if (send == NULL || recv == NULL) {
		printf("FAIL out of memory\n");
		free(send);
		free(recv);
		free(counts);
		return (1);
	}
	memset(recv, 0xa5, (cs->kind == CW_ALLGATHERV ? total : nb) * es);
	snprintf(why, sizeof(why),
	    "%s case %" PRIu64 " %s %s %s inplace=%d "
	    "count=%zu root=%d",
	    run->label, k, cw_kind_names[cs->kind], cohort_dtype_name(cs->dt),
	    cohort_redop_name(cs->op), cs->inplace, c, cs->root);
	cw_wd_set(why);
	why[0] = '\0';
	sp = send;
	rp = recv;
	switch (cs->kind) {
	case CW_ALLREDUCE:
	case CW_REDUCE:
		cw_fill(send, c, cs->dt, cs->op, s, k, r, 0);
		if (cs->inplace)
			rp = sp;
		st = cs->kind == CW_ALLREDUCE
		    ? cohort_allreduce(
		        g, sp, rp, c, cs->dt, cs->op, NULL, 60000)
		    : cohort_reduce(g, sp,
		        cs->inplace || r == cs->root ? rp : NULL, c, cs->dt,
		        cs->op, cs->root, NULL, 60000);
		if (st == COHORT_OK
		    && (cs->kind == CW_ALLREDUCE || r == cs->root))
			bad = cw_check_reduced(rp, c, cs->dt, cs->op, s, k, n,
			    0, why, sizeof(why));
		break;
	case CW_BROADCAST:
		if (r == cs->root)
			cw_fill(recv, c, cs->dt, COHORT_SUM, s, k, r, 0);
		st = cohort_broadcast(
		    g, recv, c, cs->dt, cs->root, NULL, 60000);
		if (st == COHORT_OK)
			bad = cw_check_copy(recv, c, cs->dt, s, k, cs->root, 0,
			    why, sizeof(why));
		break;
	case CW_ALLGATHER:
	case CW_GATHER:
	case CW_ALLGATHERV: {
		size_t mine = cs->kind == CW_ALLGATHERV ? counts[r] : c;
		size_t slot = cs->kind == CW_ALLGATHERV ? off : (size_t)r * c;
		bool check = cs->kind != CW_GATHER || r == cs->root;
		bool inpl = cs->inplace && check;

		if (inpl && cs->inplace == 1)
			sp = recv + slot * es;
		else if (inpl)
			sp = recv;
		cw_fill(sp, mine, cs->dt, COHORT_SUM, s, k, r, 0);
		if (cs->kind == CW_ALLGATHER)
			st = cohort_allgather(
			    g, sp, rp, c, cs->dt, NULL, 60000);
		else if (cs->kind == CW_GATHER)
			st = cohort_gather(g, sp, check ? rp : NULL, c, cs->dt,
			    cs->root, NULL, 60000);
		else
			st = cohort_allgatherv(
			    g, sp, rp, counts, cs->dt, NULL, 60000);
		off = 0;
		for (int q = 0; st == COHORT_OK && check && q < n && bad < 0;
		     q++) {
			size_t m = cs->kind == CW_ALLGATHERV ? counts[q] : c;

			bad = cw_check_copy(rp + off * es, m, cs->dt, s, k, q,
			    0, why, sizeof(why));
			off += m;
		}
		break;
	}
	case CW_REDUCE_SCATTER:
		cw_fill(send, nb, cs->dt, cs->op, s, k, r, 0);
		if (cs->inplace == 1)
			rp = send + (size_t)r * c * es;
		else if (cs->inplace == 2)
			rp = send;
		st = cohort_reduce_scatter(
		    g, sp, rp, c, cs->dt, cs->op, NULL, 60000);
		if (st == COHORT_OK)
			bad = cw_check_reduced(rp, c, cs->dt, cs->op, s, k, n,
			    (size_t)r * c, why, sizeof(why));
		break;
	case CW_ALLTOALL:
		cw_fill(send, nb, cs->dt, COHORT_SUM, s, k, r, 0);
		st = cohort_alltoall(g, sp, rp, c, cs->dt, NULL, 60000);
		for (int q = 0; st == COHORT_OK && q < n && bad < 0; q++)
			bad = cw_check_copy(rp + (size_t)q * c * es, c, cs->dt,
			    s, k, q, (size_t)r * c, why, sizeof(why));
		break;
	case CW_SCATTER:
		if (r == cs->root) {
			cw_fill(send, nb, cs->dt, COHORT_SUM, s, k, r, 0);
			if (cs->inplace == 1)
				rp = send + (size_t)r * c * es;
			else if (cs->inplace == 2)
				rp = send;
		}
		st = cohort_scatter(g, r == cs->root ? sp : NULL, rp, c,
		    cs->dt, cs->root, NULL, 60000);
		if (st == COHORT_OK)
			bad = cw_check_copy(rp, c, cs->dt, s, k, cs->root,
			    (size_t)r * c, why, sizeof(why));
		break;
	default:
		break;
	}
	if (st != COHORT_OK || bad >= 0)
		printf("FAIL %s case %" PRIu64 " %s %s %s inplace=%d "
		       "count=%zu root=%d size=%d: %s %s\n",
		    run->label, k, cw_kind_names[cs->kind],
		    cohort_dtype_name(cs->dt), cohort_redop_name(cs->op),
		    cs->inplace, c, cs->root, n, cohort_status_name(st),
		    st != COHORT_OK ? cohort_last_error() : why);
	free(send);
	free(recv);
	free(counts);
	return (st != COHORT_OK || bad >= 0);
}

/* A count for case k: mostly small, sometimes up to maxbytes in all. */
static size_t
cw_count(uint64_t h, size_t maxbytes, size_t es, int n, enum cw_kind kind)
{
	size_t per = kind == CW_REDUCE_SCATTER || kind == CW_ALLTOALL
	        || kind == CW_SCATTER || kind == CW_ALLGATHER
	        || kind == CW_ALLGATHERV || kind == CW_GATHER
	    ? (size_t)n
	    : 1;
	size_t max = maxbytes / es / per;

	switch (h % 16) {
	case 0:
		return (0);
	case 1:
		return (1);
	case 2:
	case 3:
		return (max > 0 ? (h >> 8) % max + 1 : 1);
	default:
		return ((h >> 8) % 1024 + 1);
	}
}

/* Every kind x dtype x op x in-place variant (kinds: a bit mask). */
static void
cw_matrix(struct cw_run *run, unsigned kinds)
{
	int n = cohort_group_size(run->g);
	uint64_t k = 0;
	int64_t t0 = tw_now_ms();

	for (int kind = 0; kind < CW_NKINDS; kind++) {
		if (!(kinds & (1u << kind)))
			continue;
		for (int dt = 0; dt < COHORT_DTYPE_COUNT; dt++) {
			int nops
			    = cw_is_reduction(kind) ? COHORT_REDOP_COUNT : 1;
			int nvar = kind == CW_ALLTOALL                  ? 1
			    : kind == CW_BROADCAST                      ? 1
			    : kind == CW_ALLREDUCE || kind == CW_REDUCE ? 2
			                                                : 3;

			for (int op = 0; op < nops; op++) {
				if (op == COHORT_MEAN
				    && !cohort__dtype_is_float(
				        (cohort_dtype)dt))
					continue;
				for (int v = 0; v < nvar; v++) {
					struct cw_case cs;
					uint64_t h = tw_mix(
					    run->seed ^ (k * 7919 + 17));

					cs.k = k++;
					cs.kind = (enum cw_kind)kind;
					cs.dt = (cohort_dtype)dt;
					cs.op = (cohort_redop)op;
					cs.inplace = v;
					cs.count = cw_count(h, run->maxbytes,
					    cohort_dtype_size(cs.dt), n,
					    cs.kind);
					cs.root
					    = (int)((h >> 40) % (uint64_t)n);
					run->cases++;
					run->failed += cw_case_run(run, &cs);
				}
			}
		}
	}
	run->ms += tw_now_ms() - t0;
}

/* ------------------------------------------------------------------------ */
/* Scenarios                                                                */
/* ------------------------------------------------------------------------ */

#define CW_ALL_KINDS ((1u << CW_NKINDS) - 1)

static size_t
cw_maxbytes(void)
{
	return ((size_t)tw_arg(getenv("COHORT_TEST_MAXBYTES"), 2 << 20));
}

static int
cw_report(const struct cw_run *run)
{
	printf("RESULT %s cases=%ld failed=%ld ms=%" PRId64 " backend=%s\n",
	    run->label, run->cases, run->failed, run->ms,
	    cohort_group_backend(run->g));
	fflush(stdout);
	return (run->failed != 0);
}

static int
scen_matrix(cohort_client *c, const char *arg)
{
	struct cw_run run
	    = { cohort_client_world(c), 0, cw_maxbytes(), "matrix", 0, 0, 0 };

	run.seed = (uint64_t)tw_arg(arg, 1);
	cw_matrix(&run, CW_ALL_KINDS);
	return (cw_report(&run));
}

/* Even and odd ranks form two subgroups; each runs part of the matrix. */
static int
scen_subgroup(cohort_client *c, const char *arg)
{
	int w = cohort_client_world_size(c), me = cohort_client_rank(c);
	int32_t ranks[64];
	size_t n = 0;
	cohort_group *sub = NULL;
	cohort_status st;
	struct cw_run run
	    = { NULL, 0, cw_maxbytes() / 4, "subgroup", 0, 0, 0 };
	unsigned kinds = (1u << CW_ALLREDUCE) | (1u << CW_BROADCAST)
	    | (1u << CW_ALLGATHERV) | (1u << CW_REDUCE_SCATTER)
	    | (1u << CW_SCATTER);

	for (int r = me % 2; r < w && n < 64; r += 2)
		ranks[n++] = r;
	st = cohort_group_new(
	    c, me % 2 ? "odd" : "even", ranks, n, NULL, &sub, 30000);
	if (st != COHORT_OK) {
		printf("RESULT subgroup status=%s detail=%s\n",
		    cohort_status_name(st), cohort_last_error());
		return (1);
	}
	run.g = sub;
	run.seed = (uint64_t)tw_arg(arg, 1) + (uint64_t)(me % 2);
	cw_matrix(&run, kinds);
	/* The world still works after the subgroup was used. */
	run.g = cohort_client_world(c);
	run.seed = (uint64_t)tw_arg(arg, 1);
	run.label = "subgroup-world";
	cw_matrix(&run, 1u << CW_ALLREDUCE);
	cohort_group_destroy(sub);
	return (cw_report(&run));
}

struct cw_thread {
	struct cw_run run;
	unsigned kinds;
	pthread_t t;
};

static void *
cw_thread_main(void *arg)
{
	struct cw_thread *t = arg;

	cw_matrix(&t->run, t->kinds);
	return (NULL);
}

/* Two groups over the same ranks, used at the same time by two threads. */
static int
scen_concurrent(cohort_client *c, const char *arg)
{
	int w = cohort_client_world_size(c);
	int32_t ranks[64];
	cohort_group *dup = NULL;
	cohort_status st;
	struct cw_thread a, b;
	unsigned kinds = (1u << CW_ALLREDUCE) | (1u << CW_ALLGATHER)
	    | (1u << CW_REDUCE_SCATTER) | (1u << CW_ALLTOALL);
	int rc;

	for (int r = 0; r < w && r < 64; r++)
		ranks[r] = r;
	st = cohort_group_new(c, "dup", ranks, (size_t)w, NULL, &dup, 30000);
	if (st != COHORT_OK) {
		printf("RESULT concurrent status=%s detail=%s\n",
		    cohort_status_name(st), cohort_last_error());
		return (1);
	}
	memset(&a, 0, sizeof(a));
	memset(&b, 0, sizeof(b));
	a.run.g = cohort_client_world(c);
	a.run.label = "concurrent-world";
	b.run.g = dup;
	b.run.label = "concurrent-dup";
	a.run.maxbytes = b.run.maxbytes = cw_maxbytes() / 2;
	a.run.seed = (uint64_t)tw_arg(arg, 1);
	b.run.seed = a.run.seed + 1000;
	a.kinds = b.kinds = kinds;
	pthread_create(&a.t, NULL, cw_thread_main, &a);
	pthread_create(&b.t, NULL, cw_thread_main, &b);
	pthread_join(a.t, NULL);
	pthread_join(b.t, NULL);
	rc = cw_report(&a.run) | cw_report(&b.run);
	cohort_group_destroy(dup);
	return (rc);
}

/* Asynchronous forms: several in flight with overlapping local work, a
 * blocking call behind them, ordering through a shared buffer. */
static int
scen_async(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int r = cohort_group_rank(g), n = cohort_group_size(g);
	uint64_t seed = (uint64_t)tw_arg(arg, 1);
	size_t maxb = cw_maxbytes();
	long failed = 0, rounds = 0;
	int64_t t0 = tw_now_ms();
	char why[256];

	for (int round = 0; round < 12; round++) {
		size_t ca
		    = tw_mix(seed + (uint64_t)round) % (maxb / 4 / 4) + 1;
		size_t cb = tw_mix(seed + 100 + (uint64_t)round) % 5000 + 1;
		size_t cc = tw_mix(seed + 200 + (uint64_t)round) % 5000 + 1;
		size_t cd = tw_mix(seed + 300 + (uint64_t)round) % 5000 + 1;
		uint64_t k = (uint64_t)round * 16;
		float *a = malloc(ca * 4), *chain = malloc(cb * 4);
		double *b = malloc(cb * 8);
		int32_t *cs = malloc(cc * 4), *cr = malloc(cc * 4 * (size_t)n);
		float *ds = malloc(cd * 4 * (size_t)n), *dr = malloc(cd * 4);
		float *e = malloc(cb * 4);
		cohort_work *w[6] = { NULL };
		cohort_status st[6];
		volatile double sink = 0;
		bool done = false;
		int k2;

		cw_fill(a, ca, COHORT_F32, COHORT_SUM, seed, k, r, 0);
		if (r == round % n)
			cw_fill(
			    b, cb, COHORT_F64, COHORT_SUM, seed, k + 1, r, 0);
		cw_fill(cs, cc, COHORT_I32, COHORT_SUM, seed, k + 2, r, 0);
		cw_fill(ds, cd * (size_t)n, COHORT_F32, COHORT_MAX, seed,
		    k + 3, r, 0);
		cw_fill(e, cb, COHORT_F32, COHORT_SUM, seed, k + 4, r, 0);
		for (size_t i = 0; i < cb; i++)
			chain[i] = 1.0f;
		st[0] = cohort_iallreduce(
		    g, a, a, ca, COHORT_F32, COHORT_SUM, NULL, &w[0]);
		st[1] = cohort_ibroadcast(
		    g, b, cb, COHORT_F64, round % n, NULL, &w[1]);
		st[2] = cohort_iallgather(
		    g, cs, cr, cc, COHORT_I32, NULL, &w[2]);
		st[3] = cohort_ireduce_scatter(
		    g, ds, dr, cd, COHORT_F32, COHORT_MAX, NULL, &w[3]);
		/* Ordering: the second sums the first's result. */
		st[4] = cohort_iallreduce(
		    g, chain, chain, cb, COHORT_F32, COHORT_SUM, NULL, &w[4]);
		st[5] = cohort_iallreduce(
		    g, chain, chain, cb, COHORT_F32, COHORT_SUM, NULL, &w[5]);
		/* Overlap: local work while the operations progress. */
		for (long i = 0; i < 200000; i++)
			sink += (double)i * 0.5;
		(void)cohort_work_test(w[0], &done);
		/* A blocking call queues behind them. */
		if (cohort_allreduce(
		        g, e, e, cb, COHORT_F32, COHORT_SUM, NULL, 60000)
		    != COHORT_OK) {
			printf(
			    "FAIL async blocking: %s\n", cohort_last_error());
			failed++;
		} else if (cw_check_reduced(e, cb, COHORT_F32, COHORT_SUM,
		               seed, k + 4, n, 0, why, sizeof(why))
		    >= 0) {
			printf("FAIL async blocking: %s\n", why);
			failed++;
		}
		for (k2 = 0; k2 < 6; k2++) {
			if (st[k2] == COHORT_OK)
				st[k2] = cohort_work_wait(w[k2], 60000);
			if (st[k2] == COHORT_OK)
				(void)cohort_work_test(w[k2], &done);
			if (st[k2] != COHORT_OK || !done) {
				printf("FAIL async work %d: %s %s\n", k2,
				    cohort_status_name(st[k2]),
				    cohort_last_error());
				failed++;
			}
			cohort_work_free(w[k2]);
		}
		why[0] = '\0';
		if (cw_check_reduced(a, ca, COHORT_F32, COHORT_SUM, seed, k, n,
		        0, why, sizeof(why))
		        >= 0
		    || cw_check_copy(b, cb, COHORT_F64, seed, k + 1, round % n,
		           0, why, sizeof(why))
		        >= 0
		    || cw_check_reduced(dr, cd, COHORT_F32, COHORT_MAX, seed,
		           k + 3, n, (size_t)r * cd, why, sizeof(why))
		        >= 0) {
			printf("FAIL async round %d: %s\n", round, why);
			failed++;
		}
		for (int q = 0; q < n; q++)
			if (cw_check_copy(cr + (size_t)q * cc, cc, COHORT_I32,
			        seed, k + 2, q, 0, why, sizeof(why))
			    >= 0) {
				printf("FAIL async allgather: %s\n", why);
				failed++;
				break;
			}
		for (size_t i = 0; i < cb; i++)
			if (chain[i] != (float)(n * n)) {
				printf("FAIL async order: chain[%zu] = %g, "
				       "want %d\n",
				    i, chain[i], n * n);
				failed++;
				break;
			}
		free(a);
		free(b);
		free(cs);
		free(cr);
		free(ds);
		free(dr);
		free(e);
		free(chain);
		rounds++;
	}
	printf("RESULT async rounds=%ld failed=%ld ms=%" PRId64 "\n", rounds,
	    failed, tw_now_ms() - t0);
	return (failed != 0);
}

#define CW_EXPECT(what, expr, want)                                           \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		if (st_ != (want)) {                                          \
			printf("FAIL %s: got %s want %s: %s\n", what,         \
			    cohort_status_name(st_),                          \
			    cohort_status_name(want), cohort_last_error());   \
			failed++;                                             \
		}                                                             \
	} while (0)

/* Argument validation; none of it poisons the group. */
static int
scen_errors(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int n = cohort_group_size(g);
	float buf[64], out[64 * 8];
	int32_t ibuf[4];
	size_t counts[64];
	cohort_group *ng = NULL;
	int32_t me = cohort_client_rank(c);
	cohort_work *w = NULL;
	long failed = 0;
	int dummy;

	memset(buf, 0, sizeof(buf));
	for (int i = 0; i < 64; i++)
		counts[i] = 1;
	CW_EXPECT("null send",
	    cohort_allreduce(
	        g, NULL, buf, 4, COHORT_F32, COHORT_SUM, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("null recv",
	    cohort_allreduce(
	        g, buf, NULL, 4, COHORT_F32, COHORT_SUM, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("bad dtype",
	    cohort_allreduce(
	        g, buf, buf, 4, (cohort_dtype)99, COHORT_SUM, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("bad op",
	    cohort_allreduce(
	        g, buf, buf, 4, COHORT_F32, (cohort_redop)42, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("mean on i32",
	    cohort_allreduce(
	        g, ibuf, ibuf, 4, COHORT_I32, COHORT_MEAN, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("root range",
	    cohort_broadcast(g, buf, 4, COHORT_F32, n, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("negative root",
	    cohort_reduce(
	        g, buf, buf, 4, COHORT_F32, COHORT_SUM, -1, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("stream",
	    cohort_allreduce(
	        g, buf, buf, 4, COHORT_F32, COHORT_SUM, &dummy, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("partial overlap",
	    cohort_allreduce(
	        g, buf, buf + 1, 4, COHORT_F32, COHORT_SUM, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("alltoall in place",
	    cohort_alltoall(g, out, out, 1, COHORT_F32, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("allgatherv counts",
	    cohort_allgatherv(g, buf, out, NULL, COHORT_F32, NULL, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("iallreduce out",
	    cohort_iallreduce(
	        g, buf, buf, 4, COHORT_F32, COHORT_SUM, NULL, NULL),
	    COHORT_EINVAL);
	CW_EXPECT("count 0 NULL",
	    cohort_allreduce(
	        g, NULL, NULL, 0, COHORT_F32, COHORT_SUM, NULL, 1000),
	    COHORT_OK);
	CW_EXPECT("count 0 async",
	    cohort_iallgather(g, NULL, NULL, 0, COHORT_F32, NULL, &w),
	    COHORT_OK);
	CW_EXPECT("count 0 wait", cohort_work_wait(w, 1000), COHORT_OK);
	cohort_work_free(w);
	CW_EXPECT("group_new empty",
	    cohort_group_new(c, "x", &me, 0, NULL, &ng, 1000), COHORT_EINVAL);
	CW_EXPECT("group_new bad backend",
	    cohort_group_new(c, "x", &me, 1, "carrier-pigeon", &ng, 1000),
	    COHORT_EINVAL);
	CW_EXPECT("group_new nccl",
	    cohort_group_new(c, "x", &me, 1, "nccl", &ng, 1000),
	    COHORT_ENOTSUP);
	/* After all that the group is healthy and works. */
	for (int i = 0; i < 64; i++)
		buf[i] = 1.0f;
	CW_EXPECT("allreduce after",
	    cohort_allreduce(
	        g, buf, buf, 64, COHORT_F32, COHORT_SUM, NULL, 30000),
	    COHORT_OK);
	if (buf[0] != (float)n || buf[63] != (float)n) {
		printf("FAIL allreduce after: %g\n", buf[0]);
		failed++;
	}
	CW_EXPECT("allgatherv ok",
	    cohort_allgatherv(g, buf, out, counts, COHORT_F32, NULL, 30000),
	    COHORT_OK);
	if (!cohort_group_is_healthy(g)) {
		printf(
		    "FAIL group unhealthy: %s\n", cohort_group_last_error(g));
		failed++;
	}
	printf("RESULT errors failed=%ld backend=%s\n", failed,
	    cohort_group_backend(g));
	return (failed != 0);
}

/* Loops a large in-place allreduce until it fails (a rank is killed by
 * the test); prints the failure and when it was seen. */
static int
scen_killloop(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	size_t bytes = (size_t)tw_arg(arg, 64 << 20);
	size_t count = bytes / 4;
	float *buf = malloc(count * 4);
	cohort_status st = COHORT_OK;
	long iters = 0;
	int64_t t_call = 0, t_err;

	if (buf == NULL)
		return (1);
	for (size_t i = 0; i < count; i++)
		buf[i] = 1.0f;
	while (st == COHORT_OK && iters < 100000) {
		t_call = tw_now_ms();
		st = cohort_allreduce(
		    g, buf, buf, count, COHORT_F32, COHORT_MEAN, NULL, 120000);
		if (st == COHORT_OK && ++iters == 1) {
			printf("READY rank=%d\n", cohort_client_rank(c));
			fflush(stdout);
		}
	}
	t_err = tw_now_ms();
	printf("RESULT killloop status=%s iters=%ld err_at_ms=%" PRId64
	       " in_call_ms=%" PRId64 " detail=%s\n",
	    cohort_status_name(st), iters, t_err, t_err - t_call,
	    cohort_last_error());
	/* Sticky: the next call returns the same. */
	st = cohort_allreduce(
	    g, buf, buf, 4, COHORT_F32, COHORT_SUM, NULL, 1000);
	printf("RESULT sticky status=%s last_error=%s\n",
	    cohort_status_name(st), cohort_group_last_error(g));
	fflush(stdout);
	free(buf);
	return (st != COHORT_EPEERLOST);
}

/* The client was opened with COHORT_TEST_BACKEND=nccl on a machine
 * without a usable NCCL: the first collective fails with ENOTSUP and the
 * group's detail says why (it used to be empty). Exits without the final
 * barrier: the world group is failed. */
static int
scen_nonccl(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	float buf[4] = { 1, 1, 1, 1 };
	cohort_status st;
	bool ok;

	st = cohort_allreduce(
	    g, buf, buf, 4, COHORT_F32, COHORT_SUM, NULL, 10000);
	if (st == COHORT_OK) /* NCCL works here: nothing to check */
		printf("SKIP nonccl: the nccl backend is available\n");
	ok = st == COHORT_OK
	    || (st == COHORT_ENOTSUP
	        && strstr(cohort_group_last_error(g), "nccl backend") != NULL);
	printf("RESULT nonccl failed=%d status=%s group_detail=[%s] "
	       "last=[%s]\n",
	    !ok, cohort_status_name(st), cohort_group_last_error(g),
	    cohort_last_error());
	fflush(stdout);
	cohort_client_close(c);
	exit(ok ? 0 : 1);
}

static const struct tw_scenario cw_scenarios[] = {
	{ "nonccl", scen_nonccl },
	{ "matrix", scen_matrix },
	{ "subgroup", scen_subgroup },
	{ "concurrent", scen_concurrent },
	{ "async", scen_async },
	{ "errors", scen_errors },
	{ "killloop", scen_killloop },
};

int
main(int argc, char **argv)
{
	cohort_client *c = NULL;
	cohort_status st;
	int rc;

	if ((rc = tw_worker_start(argc, argv, "cohort-coll-worker", &c)) != 0)
		return (rc);
	{
		pthread_t wd;

		pthread_create(&wd, NULL, cw_wd_main, NULL);
		pthread_detach(wd);
	}
	rc = tw_scenario_run(
	    c, cw_scenarios, TW_NELEM(cw_scenarios), argc, argv);
	if (rc == 0) {
		cw_wd_set("the final barrier");
		st = cohort_barrier(cohort_client_world(c), "end", 60000);
		if (st != COHORT_OK && strcmp(argv[1], "killloop") != 0) {
			printf("RESULT end status=%s detail=%s\n",
			    cohort_status_name(st), cohort_last_error());
			rc = 1;
		}
	}
	cw_wd_set("cohort_client_close");
	cohort_client_close(c);
	cw_wd_set("exit");
	return (rc);
}
