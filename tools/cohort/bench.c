/*
 * bench.c - `cohort bench`: the collective benchmark (bench/README.md).
 *
 *   cohort bench [-n N] [--backend tcp|service|auto] [--op OP]
 *                [--sizes MIN:MAX|S1,S2,..] [--iters I[,I2,..]]
 *                [--warmup W[,W2,..]] [--dtype DT]
 *                [--redop OP] [--check] [--json] [--procs P]
 *                [--coordinator URL] [--timeout MS]
 *
 * Data-plane ops (allreduce, broadcast, allgather, reduce_scatter,
 * alltoall, reduce) print an nccl-tests-style table: size, count, dtype,
 * time (median per-iteration time across iterations of the slowest rank),
 * the first (cold) iteration, p99, algbw and busbw (GB/s = 1e9 B/s;
 * busbw = algbw x 2(n-1)/n for allreduce, (n-1)/n for allgather,
 * reduce_scatter and alltoall, 1 for broadcast and reduce). Control-plane
 * ops (barrier, broadcast_obj, kv: a set and a get of the rank's own key)
 * report the same latency columns. `--op join` measures how long N
 * clients take to open (join) one job and pass one barrier, the N clients
 * spread over P processes (--procs) as threads.
 *
 * Alone, it starts an embedded coordinator and runs its N ranks as child
 * processes (fork + execve of this binary with COHORT_* set and the
 * hidden flag --bench-rank, by the launcher core of cohort_spawn,
 * strategies/launch.h: only async-signal-safe calls before exec, nng
 * never used in a forked child, every rank tied to this process by
 * PR_SET_PDEATHSIG). Started with
 * rank and world size in the environment (under `cohort run`, or by hand),
 * it runs as one rank of that job. Rank 0 prints.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <math.h>
#include <net/if.h>
#include <poll.h>
#include <pthread.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/ioctl.h>
#include <sys/resource.h>
#include <sys/socket.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "dtype.h"
#include "cohort_impl.h"
#include "client.h" /* cohort__hb_start */
#include "coord.h" /* cohort__random_u64 */
#include "launch.h"
#include "server.h"

int cohort__cmd_bench(int argc, char **argv);

enum bench_op {
	BENCH_ALLREDUCE,
	BENCH_BROADCAST,
	BENCH_ALLGATHER,
	BENCH_REDUCE_SCATTER,
	BENCH_ALLTOALL,
	BENCH_REDUCE,
	BENCH_BARRIER,
	BENCH_BCAST_OBJ,
	BENCH_KV,
	BENCH_JOIN,
	BENCH_NOPS
};

static const char *const bench_op_names[BENCH_NOPS]
    = { "allreduce", "broadcast", "allgather", "reduce_scatter", "alltoall",
	      "reduce", "barrier", "broadcast_obj", "kv", "join" };

#define BENCH_MAX_ITERS 1000000
#define BENCH_MAX_SIZES 32

struct bench_cfg {
	int n;
	int procs;
	const char *backend;
	enum bench_op op;
	size_t min, max;
	bool sizes_given;
	/* --sizes S1,S2,..: these sizes in this order (nlist > 0), each with
	 * its own iterations and warm-up when --iters/--warmup list them */
	size_t list[BENCH_MAX_SIZES];
	int nlist;
	int iters, warmup;
	int iters_of[BENCH_MAX_SIZES], warmup_of[BENCH_MAX_SIZES];
	int niters, nwarmup;
	cohort_dtype dtype;
	cohort_redop redop;
	bool check;
	bool json;
	const char *coordinator;
	cohort_duration timeout;
	bool worker; /* --bench-rank: a rank started by the launcher */
	int join_proc; /* --bench-join-proc K: a join worker, -1 if not */
	int join_first; /* --bench-join-first R: its first rank */
	int join_count; /* --bench-join-count M: its clients */
	int join_go; /* --bench-join-go FD: the start signal's pipe, -1 */
	const char *bind; /* --bind (COHORT_BIND): the ranks' CPUs */
};

static double
bench_now_us(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((double)ts.tv_sec * 1e6 + (double)ts.tv_nsec / 1e3);
}

/* ------------------------------------------------------------------------ */
/* Options                                                                  */
/* ------------------------------------------------------------------------ */

static void
bench_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort bench [-n N] [--backend tcp|service|auto] "
	    "[--op OP]\n"
	    "                    [--sizes MIN:MAX|S1,S2,..] [--iters I[,..]] "
	    "[--warmup W[,..]]\n"
	    "                    [--dtype DT]\n"
	    "                    [--redop sum|prod|min|max|mean] [--check] "
	    "[--json]\n"
	    "                    [--procs P] [--coordinator URL] "
	    "[--timeout MS]\n"
	    "                    [--bind none|cores]\n\n"
	    "OP: allreduce (default), broadcast, allgather, reduce_scatter, "
	    "alltoall,\n"
	    "    reduce, barrier, broadcast_obj, kv, join\n"
	    "DT: f32 (default), f64, f16, bf16, i32, i64, u8\n"
	    "Sizes are bytes with K/M/G suffixes, doubling from MIN to MAX "
	    "(default\n1K:16M; broadcast_obj and kv 1K:1K), or a list; "
	    "--iters and --warmup may list\none count per size of a list.\n"
	    "Alone it runs N local ranks on an embedded coordinator; with "
	    "rank and\nworld size in the environment it is one rank of that "
	    "job.\n--op join: N clients (N may be 1024) in P processes "
	    "open one job and pass\none barrier.\n"
	    "--bind cores: each rank on its own slice of this process's "
	    "CPUs, as\ncohort run --bind (default: COHORT_BIND, none).\n");
}

static bool
bench_parse_size(const char *s, size_t *out)
{
	char *end;
	unsigned long long v;
	size_t mult = 1;

	errno = 0;
	v = strtoull(s, &end, 10);
	if (errno != 0 || end == s)
		return (false);
	switch (*end) {
	case 'k':
	case 'K':
		mult = 1024;
		end++;
		break;
	case 'm':
	case 'M':
		mult = 1024 * 1024;
		end++;
		break;
	case 'g':
	case 'G':
		mult = 1024ull * 1024 * 1024;
		end++;
		break;
	default:
		break;
	}
	if (*end == 'B' || *end == 'b')
		end++;
	if (*end != '\0' || v > SIZE_MAX / mult)
		return (false);
	*out = (size_t)v * mult;
	return (true);
}

static int
bench_lookup(const char *s, const char *const *names, int n)
{
	for (int i = 0; i < n; i++)
		if (strcmp(s, names[i]) == 0)
			return (i);
	return (-1);
}

enum {
	BENCH_O_BACKEND = COHORT__CLI_LONG,
	BENCH_O_OP,
	BENCH_O_SIZES,
	BENCH_O_ITERS,
	BENCH_O_WARMUP,
	BENCH_O_DTYPE,
	BENCH_O_REDOP,
};

#define BENCH_INT(name, key, lo, hi, field)                                   \
	COHORT__CLI_NUM(                                                      \
	    name, key, COHORT__CLI_INT, lo, hi, struct bench_cfg, field)
#define BENCH_SET(name, kind, field)                                          \
	COHORT__CLI_SET(name, 0, kind, struct bench_cfg, field)

static const struct cohort__cli_opt bench_opts[] = {
	BENCH_INT(NULL, 'n', 1, 16384, n), /* above 4096: --op join only */
	BENCH_INT("procs", 0, 1, 256, procs),
	COHORT__CLI_DO("backend", BENCH_O_BACKEND, COHORT__CLI_ACT_ARG),
	COHORT__CLI_DO("op", BENCH_O_OP, COHORT__CLI_ACT_ARG),
	COHORT__CLI_DO("sizes", BENCH_O_SIZES, COHORT__CLI_ACT_ARG),
	COHORT__CLI_DO("iters", BENCH_O_ITERS, COHORT__CLI_ACT_ARG),
	COHORT__CLI_DO("warmup", BENCH_O_WARMUP, COHORT__CLI_ACT_ARG),
	COHORT__CLI_DO("dtype", BENCH_O_DTYPE, COHORT__CLI_ACT_ARG),
	COHORT__CLI_DO("redop", BENCH_O_REDOP, COHORT__CLI_ACT_ARG),
	BENCH_SET("check", COHORT__CLI_FLAG, check),
	BENCH_SET("json", COHORT__CLI_FLAG, json),
	BENCH_SET("coordinator", COHORT__CLI_STR, coordinator),
	BENCH_INT("timeout", 0, 1, INT32_MAX, timeout),
	BENCH_SET("bind", COHORT__CLI_STR, bind),
	/* hidden: the ranks and join workers bench_launch starts */
	BENCH_SET("bench-rank", COHORT__CLI_FLAG, worker),
	BENCH_INT("bench-join-proc", 0, 0, 4096, join_proc),
	BENCH_INT("bench-join-first", 0, 0, 1 << 20, join_first),
	BENCH_INT("bench-join-count", 0, 1, 1 << 20, join_count),
	BENCH_INT("bench-join-go", 0, 0, 1 << 20, join_go),
	COHORT__CLI_END,
};

static const struct cohort__cli bench_cli
    = { "cohort bench", '+', bench_opts, bench_usage };

/* "A,B,C": up to BENCH_MAX_SIZES items, each parsed by one(s, out,
 * arg); false for a bad or missing item. */
static bool
bench_parse_list(
    const char *v, int *n, bool (*one)(const char *, void *, int), void *out)
{
	char item[64];

	*n = 0;
	for (;;) {
		size_t len = strcspn(v, ",");

		if (len == 0 || len >= sizeof(item) || *n == BENCH_MAX_SIZES)
			return (false);
		memcpy(item, v, len);
		item[len] = '\0';
		if (!one(item, out, (*n)++))
			return (false);
		if (v[len] == '\0')
			return (true);
		v += len + 1;
	}
}

static bool
bench_list_size(const char *s, void *out, int i)
{
	return (bench_parse_size(s, &((size_t *)out)[i]));
}

/* --iters and --warmup: a count, or one per size of a --sizes list. */
static bool
bench_list_count(const char *s, void *out, int i)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < 0
	    || v > BENCH_MAX_ITERS)
		return (false);
	((int *)out)[i] = (int)v;
	return (true);
}

/* --sizes MIN:MAX, SIZE or S1,S2,.. */
static bool
bench_parse_sizes(const char *v, struct bench_cfg *cfg)
{
	char lo[64];
	const char *colon = strchr(v, ':');

	cfg->nlist = 0;
	if (strchr(v, ',') != NULL) {
		if (!bench_parse_list(
		        v, &cfg->nlist, bench_list_size, cfg->list))
			return (false);
		cfg->min = cfg->max = cfg->list[0];
		for (int i = 1; i < cfg->nlist; i++) {
			if (cfg->list[i] < cfg->min)
				cfg->min = cfg->list[i];
			if (cfg->list[i] > cfg->max)
				cfg->max = cfg->list[i];
		}
	} else if (colon == NULL) {
		if (!bench_parse_size(v, &cfg->min))
			return (false);
		cfg->max = cfg->min;
	} else {
		if ((size_t)(colon - v) >= sizeof(lo))
			return (false);
		memcpy(lo, v, (size_t)(colon - v));
		lo[colon - v] = '\0';
		if (!bench_parse_size(lo, &cfg->min)
		    || !bench_parse_size(colon + 1, &cfg->max))
			return (false);
	}
	cfg->sizes_given = true;
	return (cfg->max >= cfg->min);
}

/* An option bench_parse acts on: false for a bad value. */
static bool
bench_option(struct bench_cfg *cfg, int opt, const char *v)
{
	static const char *const dtypes[]
	    = { "f32", "f64", "f16", "bf16", "i32", "i64", "u8" };
	static const char *const redops[]
	    = { "sum", "prod", "min", "max", "mean" };
	static const char *const backends[]
	    = { "tcp", "service", "auto", "nccl", "host" };
	int k;

	switch (opt) {
	case BENCH_O_BACKEND:
		cfg->backend = v;
		return (bench_lookup(v, backends, 5) >= 0);
	case BENCH_O_OP:
		if ((k = bench_lookup(v, bench_op_names, BENCH_NOPS)) < 0)
			return (false);
		cfg->op = (enum bench_op)k;
		return (true);
	case BENCH_O_SIZES:
		return (bench_parse_sizes(v, cfg));
	case BENCH_O_ITERS:
		if (!bench_parse_list(
		        v, &cfg->niters, bench_list_count, cfg->iters_of))
			return (false);
		cfg->iters = cfg->iters_of[0];
		return (cfg->iters >= 1);
	case BENCH_O_WARMUP:
		if (!bench_parse_list(
		        v, &cfg->nwarmup, bench_list_count, cfg->warmup_of))
			return (false);
		cfg->warmup = cfg->warmup_of[0];
		return (true);
	case BENCH_O_DTYPE:
		if ((k = bench_lookup(v, dtypes, 7)) < 0)
			return (false);
		cfg->dtype = (cohort_dtype)k;
		return (true);
	default: /* BENCH_O_REDOP */
		if ((k = bench_lookup(v, redops, 5)) < 0)
			return (false);
		cfg->redop = (cohort_redop)k;
		return (true);
	}
}

/* 0 ok, 1 help printed, 2 usage error. */
static int
bench_parse(int argc, char **argv, struct bench_cfg *cfg)
{
	int opt;

	*cfg = (struct bench_cfg) { .n = 2,
		.procs = 4,
		.backend = "auto",
		.op = BENCH_ALLREDUCE,
		.min = 1024,
		.max = 16u << 20,
		.iters = 20,
		.warmup = 5,
		.dtype = COHORT_F32,
		.redop = COHORT_SUM,
		.timeout = 600000,
		.join_proc = -1,
		.join_go = -1,
		.bind = cohort__knob_str(COHORT__KNOB_BIND) };
	while ((opt = cohort__cli_next(&bench_cli, cfg, argc, argv)) != -1) {
		if (opt == 'h' || opt == '?')
			return (opt == 'h' ? 1 : 2);
		if (!bench_option(cfg, opt, optarg)) {
			cohort__cli_bad(&bench_cli, opt, optarg, NULL);
			return (2);
		}
	}
	if (cohort__cli_no_operands(&bench_cli, argc, argv) != -1)
		return (2);
	if (!cfg->sizes_given
	    && (cfg->op == BENCH_BCAST_OBJ || cfg->op == BENCH_KV))
		cfg->min = cfg->max = 1024;
	if (cfg->redop == COHORT_MEAN && !cohort__dtype_is_float(cfg->dtype)) {
		fprintf(stderr,
		    "cohort bench: --redop mean needs a float "
		    "dtype\n");
		return (2);
	}
	if ((cfg->niters > 1 && cfg->niters != cfg->nlist)
	    || (cfg->nwarmup > 1 && cfg->nwarmup != cfg->nlist)) {
		fprintf(stderr,
		    "cohort bench: --iters and --warmup take one count, or "
		    "one per size of a --sizes list (%d sizes)\n",
		    cfg->nlist);
		return (2);
	}
	for (int i = 0; i < cfg->niters; i++) {
		if (cfg->iters_of[i] < 1) {
			fprintf(stderr, "cohort bench: --iters: at least 1\n");
			return (2);
		}
	}
	if (cfg->procs > cfg->n)
		cfg->procs = cfg->n;
	{
		cpu_set_t cpus;
		char why[256];
		int e = cohort__launch_cpus(
		    cfg->bind, 0, cfg->n, &cpus, why, sizeof(why));

		if (e != 0 && e != ENOENT) {
			fprintf(stderr, "cohort bench: --bind: %s\n", why);
			return (2);
		}
	}
	return (0);
}

/* ------------------------------------------------------------------------ */
/* Check values                                                             */
/* ------------------------------------------------------------------------ */

/* Input element i of rank q at iteration it: small integers, exact in
 * every dtype; +-1 for PROD so that products never overflow. */
static int64_t
bench_val(int q, int it, size_t i, cohort_redop op)
{
	uint64_t h = (uint64_t)(q + 1) * 7 + (uint64_t)it * 3 + i;

	if (op == COHORT_PROD)
		return ((h % 5) == 0 ? -1 : 1);
	return ((int64_t)(h % 11) - 5);
}

/* The small integer v as element i: exact in every dtype. */
static void
bench_store(void *buf, size_t i, cohort_dtype dt, int64_t v)
{
	cohort__elem_store(buf, i, dt, (double)v, (uint64_t)v);
}

static int64_t
bench_loadi(const void *buf, size_t i, cohort_dtype dt)
{
	return ((int64_t)cohort__elem_loadu(buf, i, dt));
}

static void
bench_fill(void *buf, size_t n, cohort_dtype dt, cohort_redop op, int q,
    int it, size_t i0)
{
	for (size_t i = 0; i < n; i++)
		bench_store(buf, i, dt, bench_val(q, it, i0 + i, op));
}

/* Number of elements of got[0..n) that differ from the reduction over
 * ranks 0..size-1 of element i0 + i. */
static long
bench_wrong_reduced(const void *got, size_t n, cohort_dtype dt,
    cohort_redop op, int size, int it, size_t i0)
{
	uint8_t one[8];
	long wrong = 0;

	for (size_t i = 0; i < n; i++) {
		if (cohort__dtype_is_float(dt)) {
			double acc = 0, v;

			for (int q = 0; q < size; q++) {
				bench_store(
				    one, 0, dt, bench_val(q, it, i0 + i, op));
				v = cohort__elem_loadf(one, 0, dt);
				if (q == 0)
					acc = v;
				else if (op == COHORT_PROD)
					acc *= v;
				else if (op == COHORT_MIN)
					acc = fmin(acc, v);
				else if (op == COHORT_MAX)
					acc = fmax(acc, v);
				else
					acc += v;
			}
			if (op == COHORT_MEAN)
				acc /= size;
			if (fabs(cohort__elem_loadf(got, i, dt) - acc)
			    > 1e-2 * (fabs(acc) > 1 ? fabs(acc) : 1))
				wrong++;
		} else {
			uint64_t acc = 0, v;

			for (int q = 0; q < size; q++) {
				bench_store(
				    one, 0, dt, bench_val(q, it, i0 + i, op));
				v = (uint64_t)bench_loadi(one, 0, dt);
				if (q == 0)
					acc = v;
				else if (op == COHORT_PROD)
					acc *= v;
				else if (op == COHORT_MIN)
					acc = (int64_t)v < (int64_t)acc ? v
					                                : acc;
				else if (op == COHORT_MAX)
					acc = (int64_t)v > (int64_t)acc ? v
					                                : acc;
				else
					acc += v;
			}
			bench_store(one, 0, dt, (int64_t)acc);
			if (bench_loadi(one, 0, dt) != bench_loadi(got, i, dt))
				wrong++;
		}
	}
	return (wrong);
}

static long
bench_wrong_copy(
    const void *got, size_t n, cohort_dtype dt, int q, int it, size_t i0)
{
	size_t es = cohort_dtype_size(dt);
	uint8_t one[8];
	long wrong = 0;

	for (size_t i = 0; i < n; i++) {
		bench_store(one, 0, dt, bench_val(q, it, i0 + i, COHORT_SUM));
		if (memcmp(one, (const uint8_t *)got + i * es, es) != 0)
			wrong++;
	}
	return (wrong);
}

/* ------------------------------------------------------------------------ */
/* One rank                                                                 */
/* ------------------------------------------------------------------------ */

struct bench_rank {
	const struct bench_cfg *cfg;
	cohort_client *c;
	cohort_group *g;
	int rank, n;
	uint8_t *send, *recv;
	size_t es;
	char *kvval;
	double setup_us; /* data-plane set-up after join, slowest rank */
};

/* Geometry of a data op for a reported size: per-rank count and the
 * total bytes/count the table reports. */
static bool
bench_geometry(
    const struct bench_rank *b, size_t size, size_t *count, size_t *tcount)
{
	size_t per = size / b->es;

	switch (b->cfg->op) {
	case BENCH_ALLGATHER:
	case BENCH_REDUCE_SCATTER:
	case BENCH_ALLTOALL:
		*count = per / (size_t)b->n;
		*tcount = *count * (size_t)b->n;
		break;
	case BENCH_BARRIER:
		*count = *tcount = 0;
		return (true);
	case BENCH_BCAST_OBJ:
	case BENCH_KV:
		*count = *tcount = size;
		return (true);
	default:
		*count = *tcount = per;
		break;
	}
	return (*count > 0);
}

static void
bench_prepare(struct bench_rank *b, size_t count, int it)
{
	const struct bench_cfg *cfg = b->cfg;
	size_t nb = count * (size_t)b->n;

	switch (cfg->op) {
	case BENCH_ALLREDUCE:
	case BENCH_REDUCE:
		bench_fill(
		    b->send, count, cfg->dtype, cfg->redop, b->rank, it, 0);
		break;
	case BENCH_BROADCAST:
		if (b->rank == 0)
			bench_fill(
			    b->recv, count, cfg->dtype, COHORT_SUM, 0, it, 0);
		break;
	case BENCH_ALLGATHER:
		bench_fill(
		    b->send, count, cfg->dtype, COHORT_SUM, b->rank, it, 0);
		break;
	case BENCH_REDUCE_SCATTER:
		bench_fill(
		    b->send, nb, cfg->dtype, cfg->redop, b->rank, it, 0);
		break;
	case BENCH_ALLTOALL:
		bench_fill(
		    b->send, nb, cfg->dtype, COHORT_SUM, b->rank, it, 0);
		break;
	default:
		break;
	}
}

static long
bench_verify(struct bench_rank *b, size_t count, int it)
{
	const struct bench_cfg *cfg = b->cfg;
	cohort_dtype dt = cfg->dtype;
	long wrong = 0;

	switch (cfg->op) {
	case BENCH_ALLREDUCE:
		return (bench_wrong_reduced(
		    b->recv, count, dt, cfg->redop, b->n, it, 0));
	case BENCH_REDUCE:
		if (b->rank != 0)
			return (0);
		return (bench_wrong_reduced(
		    b->recv, count, dt, cfg->redop, b->n, it, 0));
	case BENCH_BROADCAST:
		return (bench_wrong_copy(b->recv, count, dt, 0, it, 0));
	case BENCH_ALLGATHER:
		for (int q = 0; q < b->n; q++)
			wrong += bench_wrong_copy(
			    b->recv + (size_t)q * count * b->es, count, dt, q,
			    it, 0);
		return (wrong);
	case BENCH_REDUCE_SCATTER:
		return (bench_wrong_reduced(b->recv, count, dt, cfg->redop,
		    b->n, it, (size_t)b->rank * count));
	case BENCH_ALLTOALL:
		for (int q = 0; q < b->n; q++)
			wrong += bench_wrong_copy(
			    b->recv + (size_t)q * count * b->es, count, dt, q,
			    it, (size_t)b->rank * count);
		return (wrong);
	default:
		return (0);
	}
}

static cohort_status
bench_once(struct bench_rank *b, size_t count, int it)
{
	const struct bench_cfg *cfg = b->cfg;
	cohort_dtype dt = cfg->dtype;
	cohort_duration to = cfg->timeout;
	cohort_status st;
	void *out = NULL;
	size_t olen = 0;
	char key[64];

	switch (cfg->op) {
	case BENCH_ALLREDUCE:
		return (cohort_allreduce(
		    b->g, b->send, b->recv, count, dt, cfg->redop, NULL, to));
	case BENCH_REDUCE:
		return (cohort_reduce(b->g, b->send, b->recv, count, dt,
		    cfg->redop, 0, NULL, to));
	case BENCH_BROADCAST:
		return (
		    cohort_broadcast(b->g, b->recv, count, dt, 0, NULL, to));
	case BENCH_ALLGATHER:
		return (cohort_allgather(
		    b->g, b->send, b->recv, count, dt, NULL, to));
	case BENCH_REDUCE_SCATTER:
		return (cohort_reduce_scatter(
		    b->g, b->send, b->recv, count, dt, cfg->redop, NULL, to));
	case BENCH_ALLTOALL:
		return (cohort_alltoall(
		    b->g, b->send, b->recv, count, dt, NULL, to));
	case BENCH_BARRIER:
		return (cohort_barrier(b->g, "bench", to));
	case BENCH_BCAST_OBJ:
		st = cohort_broadcast_obj(b->g, 0, b->send, count,
		    b->rank == 0 ? NULL : &out, b->rank == 0 ? NULL : &olen,
		    to);
		if (st == COHORT_OK && b->rank != 0 && olen != count)
			st = cohort__err(COHORT_EPROTO,
			    "object of %zu bytes, "
			    "expected %zu",
			    olen, count);
		cohort_free(out);
		return (st);
	case BENCH_KV:
		snprintf(key, sizeof(key), "bench/kv/%d", b->rank);
		if ((st = cohort_kv_set(b->c, key, b->send, count, to))
		    != COHORT_OK)
			return (st);
		st = cohort_kv_get(b->c, key, &out, &olen, to);
		cohort_free(out);
		return (st);
	default:
		return (cohort__err(COHORT_EINVAL, "not a rank operation"));
	}
}

static int
bench_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x < y ? -1 : x > y);
}

static double
bench_busbw_factor(const struct bench_cfg *cfg, int n)
{
	switch (cfg->op) {
	case BENCH_ALLREDUCE:
		return (2.0 * (n - 1) / n);
	case BENCH_ALLGATHER:
	case BENCH_REDUCE_SCATTER:
	case BENCH_ALLTOALL:
		return ((double)(n - 1) / n);
	default:
		return (1.0);
	}
}

static void
bench_header(const struct bench_rank *b)
{
	const struct bench_cfg *cfg = b->cfg;

	if (cfg->json)
		return;
	printf("# cohort bench: %s, %d ranks, backend %s, dtype %s, redop %s,"
	       " iters %d, warmup %d%s\n",
	    bench_op_names[cfg->op], b->n, cohort_group_backend(b->g),
	    cohort_dtype_name(cfg->dtype), cohort_redop_name(cfg->redop),
	    cfg->iters, cfg->warmup, cfg->check ? ", check" : "");
	printf("# time: median per-iteration time of the slowest rank; first:"
	       " cold iteration\n");
	if (cfg->op < BENCH_BARRIER)
		printf("# data-plane set-up: waited %.1f us for it after join "
		       "(slowest rank; COHORT_EAGER_CONNECT=1 starts it at "
		       "join)\n",
		    b->setup_us);
	printf("#%11s %12s %6s %6s %11s %11s %11s %10s %10s %7s\n", "size",
	    "count", "type", "redop", "time(us)", "first(us)", "p99(us)",
	    "algbw", "busbw", "#wrong");
	printf("#%11s %12s %6s %6s %11s %11s %11s %10s %10s %7s\n", "(B)",
	    "(elements)", "", "", "", "", "", "(GB/s)", "(GB/s)", "");
	fflush(stdout);
}

/* Size number idx (of a --sizes list; 0 otherwise). */
static int
bench_size(struct bench_rank *b, size_t size, int idx)
{
	const struct bench_cfg *cfg = b->cfg;
	size_t count, tcount, rbytes;
	double *t = NULL, first = 0, med, p99, algbw, busbw;
	int64_t wrong = 0;
	int iters = cfg->niters > 1 ? cfg->iters_of[idx] : cfg->iters;
	int warmup = cfg->nwarmup > 1 ? cfg->warmup_of[idx] : cfg->warmup;
	int k = iters + 1, rc = 1;
	cohort_status st = COHORT_OK;

	if (!bench_geometry(b, size, &count, &tcount))
		return (0);
	rbytes = cfg->op == BENCH_BARRIER ? 0
	    : cfg->op == BENCH_BCAST_OBJ || cfg->op == BENCH_KV
	    ? size
	    : tcount * b->es;
	if ((t = calloc((size_t)k, sizeof(double))) == NULL)
		return (1);
	if ((st = cohort_barrier(b->g, "bench-size", cfg->timeout))
	    != COHORT_OK)
		goto out;
	/* The coordinator's barrier releases the ranks one reply after
	 * another; the peers' benchmarks synchronise peer to peer before a
	 * first call (Open MPI's MPI_Barrier, Gloo's barrier on its own
	 * pairs). So does this one: a 1-element all-reduce over the data
	 * plane, then the first call starts with the ranks in step. */
	if (cfg->op < BENCH_BARRIER) {
		float one = 1.0f;

		if ((st = cohort_allreduce(b->g, &one, &one, 1, COHORT_F32,
		         COHORT_SUM, NULL, cfg->timeout))
		    != COHORT_OK) {
			fprintf(stderr,
			    "cohort bench: rank %d: the data-plane sync "
			    "before %s %zu bytes: %s: %s\n",
			    b->rank, bench_op_names[cfg->op], size,
			    cohort_status_name(st), cohort_last_error());
			free(t);
			return (1);
		}
	}
	for (int it = -warmup; it < iters && st == COHORT_OK; it++) {
		int vit = it + warmup;
		double t0, dt;

		if (cfg->check) {
			bench_prepare(b, count, vit);
			/* verification skews the ranks: not timed */
			st = cohort_barrier(b->g, "bench-check", cfg->timeout);
			if (st != COHORT_OK)
				break;
		}
		t0 = bench_now_us();
		st = bench_once(b, count, vit);
		dt = bench_now_us() - t0;
		if (it == -warmup)
			first = dt;
		if (it >= 0) {
			t[it + 1] = dt;
			if (cfg->check && st == COHORT_OK)
				wrong += bench_verify(b, count, vit);
		}
	}
	if (st != COHORT_OK)
		goto out;
	t[0] = first;
	/* max across ranks, per iteration (in pieces: the coordinator's
	 * scalar reduction takes at most 4096 values) */
	for (size_t off = 0; off < (size_t)k; off += 4096) {
		size_t n = (size_t)k - off < 4096 ? (size_t)k - off : 4096;
		if ((st = cohort_reduce_scalars(b->g, COHORT_F64, COHORT_MAX,
		         t + off, n, cfg->timeout))
		    != COHORT_OK)
			goto out;
	}
	if ((st = cohort_reduce_scalars(
	         b->g, COHORT_I64, COHORT_SUM, &wrong, 1, cfg->timeout))
	    != COHORT_OK)
		goto out;
	first = t[0];
	qsort(t + 1, (size_t)iters, sizeof(double), bench_cmp_double);
	med = iters % 2 ? t[1 + iters / 2]
	                : (t[iters / 2] + t[1 + iters / 2]) / 2;
	p99 = t[1 + (int)ceil(0.99 * iters) - 1];
	algbw = med > 0 ? (double)rbytes / (med * 1e3) : 0;
	busbw = algbw * bench_busbw_factor(cfg, b->n);
	if (b->rank == 0 && cfg->json) {
		printf("{\"impl\":\"cohort\",\"algo\":\"%s\",\"ranks\":%d,"
		       "\"size\":%zu,\"count\":%zu,\"dtype\":\"%s\","
		       "\"op\":\"%s\",\"redop\":\"%s\",\"time_us\":%.3f,"
		       "\"first_us\":%.3f,\"p99_us\":%.3f,\"algbw\":%.6f,"
		       "\"busbw\":%.6f,\"iters\":%d,\"wrong\":%" PRId64
		       ",\"setup_us\":%.3f}\n",
		    cohort_group_backend(b->g), b->n, rbytes, tcount,
		    cohort_dtype_name(cfg->dtype), bench_op_names[cfg->op],
		    cohort_redop_name(cfg->redop), med, first, p99, algbw,
		    busbw, iters, wrong, b->setup_us);
	} else if (b->rank == 0) {
		printf(" %11zu %12zu %6s %6s %11.1f %11.1f %11.1f %10.3f "
		       "%10.3f %7" PRId64 "\n",
		    rbytes, tcount, cohort_dtype_name(cfg->dtype),
		    cohort_redop_name(cfg->redop), med, first, p99, algbw,
		    busbw, wrong);
	}
	fflush(stdout);
	rc = wrong != 0;
out:
	if (st != COHORT_OK)
		fprintf(stderr,
		    "cohort bench: rank %d: %s %zu bytes: %s: %s\n", b->rank,
		    bench_op_names[cfg->op], size, cohort_status_name(st),
		    cohort_last_error());
	free(t);
	return (st != COHORT_OK ? 1 : rc);
}

static int
bench_rank_main(const struct bench_cfg *cfg)
{
	struct bench_rank b;
	cohort_env env;
	cohort_options opts;
	cohort_status st;
	size_t maxb, sz;
	int rc = 0;

	memset(&b, 0, sizeof(b));
	b.cfg = cfg;
	if ((st = cohort_env_resolve(&env)) != COHORT_OK
	    || (st = cohort_options_from_env(&opts, &env)) != COHORT_OK) {
		fprintf(stderr, "cohort bench: environment: %s\n",
		    cohort_last_error());
		return (1);
	}
	opts.backend = cfg->backend;
	opts.op_timeout = cfg->timeout;
	if ((st = cohort_client_open(&opts, &b.c, cfg->timeout))
	    != COHORT_OK) {
		fprintf(stderr, "cohort bench: join: %s: %s\n",
		    cohort_status_name(st), cohort_last_error());
		return (1);
	}
	b.g = cohort_client_world(b.c);
	b.rank = cohort_group_rank(b.g);
	b.n = cohort_group_size(b.g);
	b.es = cohort_dtype_size(cfg->dtype);
	maxb = cfg->max + 64;
	if (cfg->op == BENCH_ALLGATHER || cfg->op == BENCH_REDUCE_SCATTER
	    || cfg->op == BENCH_ALLTOALL)
		maxb = cfg->max + (size_t)b.n * 64;
	b.send = malloc(maxb);
	b.recv = malloc(maxb);
	if (b.send == NULL || b.recv == NULL) {
		fprintf(stderr, "cohort bench: out of memory\n");
		rc = 1;
		goto out;
	}
	/* Touch the pages once: the first iteration is cold on the wire,
	 * not in the page tables. Not with zeros: gcc turns malloc and a
	 * zero memset into calloc, which leaves a fresh mapping untouched,
	 * and the first call then took the receive buffer's page faults in
	 * the kernel's socket copy (16 MiB over loopback TCP: 20 ms first
	 * against 6 ms steady). */
	memset(b.send, 1, maxb);
	memset(b.recv, 2, maxb);
	/* The data plane's set-up (mesh, shared memory), which libcohort
	 * starts in the background at join, is reported on its own: the
	 * first call then measures the operation, as Gloo's and Open MPI's
	 * first calls do after their connection set-up. */
	if (cfg->op < BENCH_BARRIER) {
		double t0 = bench_now_us();

		if ((st = cohort_group_connect(b.g, cfg->timeout))
		    != COHORT_OK) {
			fprintf(stderr,
			    "cohort bench: rank %d: set-up: %s: %s\n", b.rank,
			    cohort_status_name(st), cohort_last_error());
			rc = 1;
			goto out;
		}
		b.setup_us = bench_now_us() - t0;
		if ((st = cohort_reduce_scalars(b.g, COHORT_F64, COHORT_MAX,
		         &b.setup_us, 1, cfg->timeout))
		    != COHORT_OK) {
			rc = 1;
			goto out;
		}
	}
	if (b.rank == 0)
		bench_header(&b);
	for (int i = 0; i < cfg->nlist && rc == 0; i++)
		rc = bench_size(&b, cfg->list[i], i);
	for (sz = cfg->min; rc == 0 && cfg->nlist == 0;) {
		rc = bench_size(&b, sz, 0);
		if (cfg->op == BENCH_BARRIER || sz >= cfg->max)
			break;
		sz = sz == 0 ? 1 : sz > cfg->max / 2 ? cfg->max : sz * 2;
	}
out:
	free(b.send);
	free(b.recv);
	cohort_client_close(b.c);
	return (rc);
}

/* ------------------------------------------------------------------------ */
/* join: N clients from threads of P processes                              */
/* ------------------------------------------------------------------------ */

/* Elements (f64) of the all-reduce timed after the join: 1 KiB. */
#define BENCH_JOIN_AR_COUNT 128
/* Join iterations that also time that all-reduce, after the others (so
 * that no process's all-reduce overlaps another's next join). */
#define BENCH_JOIN_AR_ITERS 3

struct bench_joiner {
	const struct bench_cfg *cfg;
	const char *url, *job, *token;
	int rank;
	pthread_barrier_t *start;
	double t_start, t_open, t_end;
	/* the first all-reduce after the barrier (BENCH_JOIN_AR_COUNT f64):
	 * its start and end, and whether every element was right */
	double t_ar0, t_ar1;
	bool do_ar; /* this iteration times the all-reduce */
	bool ar_wrong;
	cohort_status st;
	char err[256];
	pthread_t th;
};

static void *
bench_joiner_main(void *arg)
{
	struct bench_joiner *j = arg;
	cohort_options opts;
	cohort_client *c = NULL;

	cohort_options_init(&opts);
	opts.coordinator = j->url;
	opts.job = j->job;
	opts.token = j->token;
	opts.rank = j->rank;
	opts.world_size = j->cfg->n;
	opts.op_timeout = j->cfg->timeout;
	pthread_barrier_wait(j->start);
	j->t_start = bench_now_us();
	j->st = cohort_client_open(&opts, &c, j->cfg->timeout);
	j->t_open = bench_now_us();
	if (j->st == COHORT_OK)
		j->st = cohort_barrier(
		    cohort_client_world(c), "joined", j->cfg->timeout);
	j->t_end = bench_now_us();
	if (j->st == COHORT_OK && j->do_ar) {
		/* The first data-plane operation: sets up the group's data
		 * plane (connections) and all-reduces rank + 1. */
		double v[BENCH_JOIN_AR_COUNT];
		double want = (double)j->cfg->n * (j->cfg->n + 1) / 2;

		for (int i = 0; i < BENCH_JOIN_AR_COUNT; i++)
			v[i] = j->rank + 1;
		j->t_ar0 = bench_now_us();
		j->st = cohort_allreduce(cohort_client_world(c), v, v,
		    BENCH_JOIN_AR_COUNT, COHORT_F64, COHORT_SUM, NULL,
		    j->cfg->timeout);
		j->t_ar1 = bench_now_us();
		for (int i = 0; j->st == COHORT_OK && i < BENCH_JOIN_AR_COUNT;
		     i++)
			if (v[i] != want)
				j->ar_wrong = true;
	}
	if (j->st != COHORT_OK)
		cohort__strlcpy(j->err, cohort_last_error(), sizeof(j->err));
	cohort_client_close(c);
	return (NULL);
}

/*
 * The simulated clients' scheduling priority, below the bench's (whose
 * process runs the embedded coordinator): in a cluster the coordinator
 * has a host of its own; here the clients' threads share 2 cores with
 * it. CFS weighs threads, so with thousands of runnable client threads
 * this only softens the starvation of cohortd's loop. Tried and left out:
 * each join process in a session (scheduling autogroup) of its own at
 * the lowest weight, which gives the coordinator about half the CPU but
 * made the 10,000-client join slower (5.2 s against 3.7 s): the clients'
 * own work is most of a join's CPU.
 */
#define BENCH_JOIN_NICE 10

/* Says it is ready for join it (a READY line on stdout) and waits for
 * the launcher's go (a byte on the go pipe), up to the bench's timeout.
 * Without a go pipe (started by hand), starts at once. */
static bool
bench_join_go(const struct bench_cfg *cfg, int it)
{
	struct pollfd pfd = { .fd = cfg->join_go, .events = POLLIN };
	cohort__time end = cohort__now_ms() + cfg->timeout;
	char b;

	if (cfg->join_go < 0)
		return (true);
	printf("READY it=%d\n", it);
	fflush(stdout);
	for (;;) {
		int ms = cohort__remaining(end), rv;

		if (ms <= 0)
			return (false);
		rv = poll(&pfd, 1, ms);
		if (rv < 0 && errno == EINTR)
			continue;
		if (rv <= 0)
			return (false);
		if (read(cfg->join_go, &b, 1) == 1)
			return (true);
		if (errno != EINTR && errno != EAGAIN)
			return (false);
	}
}

/* A join worker process: join_count clients from join_first on, every
 * iteration; prints one line per iteration. */
static int
bench_join_proc(const struct bench_cfg *cfg)
{
	const char *url = getenv("COHORT_COORDINATOR");
	const char *job = getenv("COHORT_JOB");
	const char *token = getenv("COHORT_TOKEN");
	int m = cfg->join_count;
	struct bench_joiner *j = calloc((size_t)m, sizeof(*j));
	pthread_barrier_t start;
	pthread_attr_t attr;
	struct cohort__coord *keep;
	int rc = 0, cur;

	if (j == NULL || url == NULL || job == NULL)
		return (1);
	/*
	 * Three levels, each BENCH_JOIN_NICE apart (Linux's nice is per
	 * thread and inherited by the threads a thread starts): the
	 * coordinator (the launcher, which as root raised its own; this
	 * process inherited that), then each simulated host's control plane
	 * (its heartbeat thread and nng's threads, started here: nng's with
	 * the process's first socket, and they outlive it), then the ranks'
	 * threads. In a cluster the coordinator has a host of its own and a
	 * rank's control plane competes with that one rank only; here, at
	 * the ranks' level, it competed with thousands of other ranks'
	 * data-plane set-up, and a client thread preempted inside a lock
	 * held up the process's heartbeats for seconds (issue 24).
	 */
	errno = 0;
	cur = getpriority(PRIO_PROCESS, 0);
	if (errno != 0)
		cur = 0;
	(void)setpriority(PRIO_PROCESS, 0, cur + BENCH_JOIN_NICE);
	if (cohort__hb_start() == COHORT_OK
	    && cohort__coord_open(url, job, token != NULL ? token : "",
	           cohort__random_u64(), &keep)
	        == COHORT_OK)
		cohort__coord_close(keep);
	else
		fprintf(stderr,
		    "cohort bench: join process %d: control-plane threads "
		    "not started ahead (%s); they run at the ranks' "
		    "priority\n",
		    cfg->join_proc, cohort_last_error());
	/* the ranks: before any of their threads */
	(void)setpriority(PRIO_PROCESS, 0, cur + 2 * BENCH_JOIN_NICE);
	pthread_attr_init(&attr);
	pthread_attr_setstacksize(&attr, 256 * 1024);
	for (int it = 0;
	     it < cfg->warmup + cfg->iters + BENCH_JOIN_AR_ITERS && rc == 0;
	     it++) {
		char name[192];
		double s = 1e300, e = 0, omax = 0, a0 = 1e300, a1 = 0;
		int bad = 0;

		snprintf(name, sizeof(name), "%s-%d", job, it);
		pthread_barrier_init(&start, NULL, (unsigned)m + 1);
		for (int i = 0; i < m; i++) {
			j[i].cfg = cfg;
			j[i].url = url;
			j[i].job = name;
			j[i].token = token != NULL ? token : "";
			j[i].rank = cfg->join_first + i;
			j[i].start = &start;
			j[i].do_ar = it >= cfg->warmup + cfg->iters;
			if (pthread_create(
			        &j[i].th, &attr, bench_joiner_main, &j[i])
			    != 0) {
				fprintf(stderr,
				    "cohort bench: cannot start "
				    "thread %d\n",
				    i);
				return (1);
			}
		}
		/* every process's clients start together: ready, then the
		 * launcher's go once all are (not each process when its
		 * previous join's clients have closed) */
		if (!bench_join_go(cfg, it)) {
			fprintf(stderr,
			    "cohort bench: join process %d: no start "
			    "signal for join %d within %d ms\n",
			    cfg->join_proc, it, cfg->timeout);
			/* the threads wait in the barrier: exit */
			exit(1);
		}
		pthread_barrier_wait(&start);
		for (int i = 0; i < m; i++) {
			pthread_join(j[i].th, NULL);
			if (j[i].st != COHORT_OK) {
				fprintf(stderr,
				    "cohort bench: join rank %d: "
				    "%s: %s\n",
				    j[i].rank, cohort_status_name(j[i].st),
				    j[i].err);
				rc = 1;
				bad++;
			}
			if (j[i].st == COHORT_OK && j[i].ar_wrong) {
				fprintf(stderr,
				    "cohort bench: join rank %d: the "
				    "all-reduce after the join is wrong\n",
				    j[i].rank);
				rc = 1;
				bad++;
			}
			s = fmin(s, j[i].t_start);
			e = fmax(e, j[i].t_end);
			omax = fmax(omax, j[i].t_open - j[i].t_start);
			a0 = fmin(a0, j[i].t_ar0);
			a1 = fmax(a1, j[i].t_ar1);
		}
		pthread_barrier_destroy(&start);
		printf("JOIN it=%d start=%.1f end=%.1f open_max=%.1f "
		       "ar0=%.1f ar1=%.1f bad=%d\n",
		    it, s, e, omax, a0, a1, bad);
		fflush(stdout);
	}
	pthread_attr_destroy(&attr);
	free(j);
	return (rc);
}

/* ------------------------------------------------------------------------ */
/* The local launcher                                                       */
/* ------------------------------------------------------------------------ */

/* A rank (or join process); its process is the launcher core's
 * cohort__proc of the same index. */
struct bench_child {
	int out; /* read end of its stdout pipe (join), -1 */
	char *buf; /* what it printed (join) */
	size_t len, cap;
	int status; /* exit code, -1 running */
	int go; /* write end of its go pipe (join), -1 */
};

/* Join mode: once every running join process has said READY for join
 * *next, a byte down each go pipe starts them together. SIGPIPE (a
 * process that just died) is held and discarded, not fatal. */
static void
bench_join_start(struct bench_child *ch, int n, int *next)
{
	char pat[32];
	sigset_t pipe_set, old;
	struct timespec zero = { 0, 0 };
	int waiting = 0;

	snprintf(pat, sizeof(pat), "READY it=%d\n", *next);
	for (int i = 0; i < n; i++) {
		if (ch[i].go < 0)
			continue;
		if (ch[i].status != -1) { /* exited */
			close(ch[i].go);
			ch[i].go = -1;
			continue;
		}
		waiting++;
		if (ch[i].buf == NULL || strstr(ch[i].buf, pat) == NULL)
			return;
	}
	if (waiting == 0)
		return;
	sigemptyset(&pipe_set);
	sigaddset(&pipe_set, SIGPIPE);
	pthread_sigmask(SIG_BLOCK, &pipe_set, &old);
	for (int i = 0; i < n; i++)
		if (ch[i].go >= 0 && write(ch[i].go, "g", 1) != 1) {
			close(ch[i].go);
			ch[i].go = -1;
		}
	while (sigtimedwait(&pipe_set, NULL, &zero) == SIGPIPE)
		;
	pthread_sigmask(SIG_SETMASK, &old, NULL);
	(*next)++;
}

/* Spawns this binary with argv + extra args and extra environment into
 * *p; its stdout goes to out_fd (>= 0), else to /dev/null when quiet. */
static cohort_status
bench_spawn(char **args, int argc, char *const *extra_args, int nextra,
    char *const *extra_env, int nenv, int out_fd, bool quiet,
    const cpu_set_t *cpus, struct cohort__proc *p)
{
	struct cohort__proc_spec spec;
	char **av, **ev, err[512];
	int null = -1, rv;

	av = calloc((size_t)(argc + nextra + 2), sizeof(char *));
	/* ours first: getenv takes the first match */
	ev = cohort__launch_env((const char *const *)extra_env, (size_t)nenv);
	if (av == NULL || ev == NULL) {
		free(av);
		free(ev);
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	}
	av[0] = (char *)"cohort";
	for (int i = 0; i < argc; i++)
		av[i + 1] = args[i];
	for (int i = 0; i < nextra; i++)
		av[argc + 1 + i] = extra_args[i];
	if (out_fd < 0 && quiet)
		null = open("/dev/null", O_WRONLY | O_CLOEXEC);
	cohort__proc_spec_init(&spec);
	spec.path = "/proc/self/exe";
	spec.argv = av;
	spec.envp = ev;
	spec.stdout_fd = out_fd >= 0 ? out_fd : null;
	spec.cpus = cpus;
	rv = cohort__proc_start(p, &spec, err, sizeof(err));
	if (null >= 0)
		close(null);
	free(av);
	free(ev);
	if (rv != 0)
		return (cohort__err(COHORT_ESYSTEM, "%s", err));
	return (COHORT_OK);
}

/* One read of a child's pipe into its buffer: what read() returned (-1
 * with errno ENOMEM when the buffer cannot grow). */
static ssize_t
bench_read(struct bench_child *c)
{
	ssize_t got;

	if (c->cap - c->len < 4096) {
		char *nb = realloc(c->buf, c->cap + 65536);

		if (nb == NULL) {
			errno = ENOMEM;
			return (-1);
		}
		c->buf = nb;
		c->cap += 65536;
	}
	got = read(c->out, c->buf + c->len, c->cap - c->len - 1);
	if (got > 0) {
		c->len += (size_t)got;
		c->buf[c->len] = '\0';
	}
	return (got);
}

/* Reads what is left in an exited child's pipe (it cannot write more;
 * non-blocking, in case something it started holds the pipe open). */
static void
bench_drain(struct bench_child *c)
{
	if (c->out < 0)
		return;
	(void)fcntl(c->out, F_SETFL, fcntl(c->out, F_GETFL) | O_NONBLOCK);
	while (bench_read(c) > 0)
		;
}

/* Waits for every child of l (reading the pipes of those that have one);
 * once one fails, the others get 15 s before SIGKILL (l's stop
 * sequence); at deadline_ms all are killed. */
static int
bench_wait_all(
    struct bench_child *ch, struct cohort__launch *l, int64_t deadline_ms)
{
	int n = l->n, rc = 0, next_go = 0;

	while (cohort__launch_alive(l) > 0) {
		struct pollfd pfd[256];
		int np = 0, map[256], k;
		int64_t now = cohort__launch_now_ms();

		for (int i = 0; i < n && np < 256; i++) {
			if (ch[i].out >= 0) {
				pfd[np].fd = ch[i].out;
				pfd[np].events = POLLIN;
				map[np++] = i;
			}
		}
		if (np > 0)
			(void)poll(pfd, (nfds_t)np, 10);
		else
			usleep(10000);
		for (int j = 0; j < np; j++) {
			struct bench_child *c = &ch[map[j]];
			ssize_t got;

			if (!(pfd[j].revents & (POLLIN | POLLHUP | POLLERR)))
				continue;
			got = bench_read(c);
			if (got < 0 && errno == ENOMEM)
				continue;
			if (got <= 0) {
				close(c->out);
				c->out = -1;
			}
		}
		while ((k = cohort__launch_reap(l, now)) >= 0) {
			ch[k].status = cohort__launch_code(l->procs[k].status);
			if (ch[k].status != 0)
				rc = 1;
		}
		bench_join_start(ch, n, &next_go);
		if (now >= deadline_ms) {
			fprintf(stderr,
			    "cohort bench: ranks still running at "
			    "the deadline; killing them\n");
			cohort__launch_stop_after(l, now, 0);
			deadline_ms = INT64_MAX;
			rc = 1;
		}
		cohort__launch_tick(l, now);
	}
	/* What the children wrote before they exited and were reaped is
	 * still in their pipes: the last join's line often is. */
	for (int i = 0; i < n; i++)
		bench_drain(&ch[i]);
	for (int i = 0; i < n; i++) {
		if (ch[i].out >= 0) {
			close(ch[i].out);
			ch[i].out = -1;
		}
		if (ch[i].go >= 0) {
			close(ch[i].go);
			ch[i].go = -1;
		}
	}
	return (rc);
}

static void
bench_join_report(
    const struct bench_cfg *cfg, struct bench_child *ch, int np, bool ok)
{
	int total = cfg->warmup + cfg->iters;
	double *t = calloc((size_t)total, sizeof(double));
	double *o = calloc((size_t)total, sizeof(double));
	double *a
	    = calloc((size_t)total + BENCH_JOIN_AR_ITERS, sizeof(double));
	double med, p99, omed, first, amed, afirst;
	int seen = 0; /* pure join iterations every process reported */
	int nar = 0; /* all-reduce joins that went through */

	if (t == NULL || o == NULL || a == NULL) {
		free(t);
		free(o);
		free(a);
		return;
	}
	for (int it = 0; it < total + BENCH_JOIN_AR_ITERS; it++) {
		double s = 1e300, e = 0, om = 0, a0 = 1e300, a1 = 0;
		int got = 0;

		for (int p = 0; p < np; p++) {
			char pat[32];
			const char *q;
			double ps, pe, po, pa0, pa1;
			int pbad;

			snprintf(pat, sizeof(pat), "JOIN it=%d ", it);
			if (ch[p].buf == NULL
			    || (q = strstr(ch[p].buf, pat)) == NULL
			    || sscanf(q + strlen(pat),
			           "start=%lf end=%lf "
			           "open_max=%lf ar0=%lf ar1=%lf bad=%d",
			           &ps, &pe, &po, &pa0, &pa1, &pbad)
			        != 6
			    || pbad != 0)
				continue;
			got++;
			s = fmin(s, ps);
			e = fmax(e, pe);
			om = fmax(om, po);
			a0 = fmin(a0, pa0);
			a1 = fmax(a1, pa1);
		}
		if (it < total && got == np)
			seen++;
		/* every rank's first all-reduce, first start to last end;
		 * the ones that went through first */
		if (it >= total) {
			if (got == np)
				a[total + nar++] = a1 > a0 ? a1 - a0 : 0;
			continue;
		}
		t[it] = got == np && e > s ? e - s : 0;
		o[it] = om;
	}
	if (seen < total) {
		printf("# cohort bench: join, %d clients in %d processes: "
		       "failed (%d of %d joins complete; see the errors "
		       "above)\n",
		    cfg->n, np, seen, total);
		printf("# join + barrier of each join (s; -: failed):");
		for (int it = 0; it < total; it++)
			if (t[it] > 0)
				printf(" %.3f", t[it] / 1e6);
			else
				printf(" -");
		printf("\n");
		free(t);
		free(o);
		free(a);
		return;
	}
	(void)ok; /* the exit status says it; the table what went through */
	first = t[0];
	afirst = nar > 0 ? a[total] : -1;
	qsort(t + cfg->warmup, (size_t)cfg->iters, sizeof(double),
	    bench_cmp_double);
	qsort(o + cfg->warmup, (size_t)cfg->iters, sizeof(double),
	    bench_cmp_double);
	med = t[cfg->warmup + cfg->iters / 2];
	p99 = t[cfg->warmup + (int)ceil(0.99 * cfg->iters) - 1];
	omed = o[cfg->warmup + cfg->iters / 2];
	qsort(a + total, (size_t)nar, sizeof(double), bench_cmp_double);
	amed = nar > 0 ? a[total + nar / 2] : -1;
	if (cfg->json)
		printf("{\"impl\":\"cohort\",\"algo\":\"coordinator\","
		       "\"ranks\":%d,\"procs\":%d,\"size\":0,\"count\":0,"
		       "\"dtype\":\"none\",\"op\":\"join\",\"time_us\":%.1f,"
		       "\"first_us\":%.1f,\"p99_us\":%.1f,\"open_us\":%.1f,"
		       "\"allreduce_us\":%.1f,\"allreduce_first_us\":%.1f,"
		       "\"allreduce_ok\":%d,"
		       "\"algbw\":0,\"busbw\":0,\"iters\":%d}\n",
		    cfg->n, np, med, first, p99, omed, amed, afirst, nar,
		    cfg->iters);
	else
		printf("# cohort bench: join, %d clients in %d processes, "
		       "iters %d, warmup %d; time: join + barrier, "
		       "allreduce: the first all-reduce after it (1 KiB f64, "
		       "data-plane set-up included; every rank's, first "
		       "start to last end; median of the %d of %d more joins "
		       "that went through, "
		       "ar_first: the first of them; -1: none went "
		       "through)\n"
		       "#%9s %8s %13s %13s %13s %13s %13s %13s\n"
		       " %9d %8d %13.1f %13.1f %13.1f %13.1f %13.1f %13.1f\n",
		    cfg->n, np, cfg->iters, cfg->warmup, nar,
		    BENCH_JOIN_AR_ITERS, "clients", "procs", "time(us)",
		    "first(us)", "p99(us)", "open_max(us)", "allreduce(us)",
		    "ar_first(us)", cfg->n, np, med, first, p99, omed, amed,
		    afirst);
	fflush(stdout);
	free(t);
	free(o);
	free(a);
}

static long
bench_read_long(const char *path)
{
	FILE *f = fopen(path, "r");
	long v = -1;

	if (f == NULL)
		return (-1);
	if (fscanf(f, "%ld", &v) != 1)
		v = -1;
	fclose(f);
	return (v);
}

static bool
bench_write_text(const char *path, const char *text)
{
	FILE *f = fopen(path, "w");
	bool ok;

	if (f == NULL)
		return (false);
	ok = fputs(text, f) >= 0;
	return (fclose(f) == 0 && ok);
}

static bool
bench_write_long(const char *path, long v)
{
	char text[32];

	snprintf(text, sizeof(text), "%ld\n", v);
	return (bench_write_text(path, text));
}

/* The kernel's queues a join of n clients needs: listen backlog and SYN
 * queue (both per network namespace). */
#define BENCH_NET_QUEUE 65535

/*
 * --op join on the embedded coordinator: every client connects at once,
 * and a burst larger than the kernel's accept queue (net.core.somaxconn,
 * 4096 by default) or SYN queue (net.ipv4.tcp_max_syn_backlog) has SYNs
 * dropped and retried after 1, 3, 7 s: the host of a coordinator for
 * that many clients raises both (docs/coordinator.md, Scale). The bench
 * simulates that host: as root, when this namespace's limits are below n,
 * the bench and its children move to a network namespace of their own
 * (unshare; it goes away with the last of them, nothing to clean up) with
 * loopback up and both limits raised; otherwise it says what limits the
 * run. Called before any thread is started (a namespace is per thread,
 * inherited by the threads and processes it starts).
 */
static void
bench_join_net(const struct bench_cfg *cfg)
{
	static const char *const somax = "/proc/sys/net/core/somaxconn";
	static const char *const synq
	    = "/proc/sys/net/ipv4/tcp_max_syn_backlog";
	long a = bench_read_long(somax), b = bench_read_long(synq);
	struct ifreq ifr;
	int fd;

	if (a < 0 || b < 0 || (a >= cfg->n && b >= cfg->n))
		return;
	if (geteuid() != 0) {
		printf("# join: net.core.somaxconn %ld, "
		       "net.ipv4.tcp_max_syn_backlog %ld: fewer than %d "
		       "clients; connects beyond them wait for SYN "
		       "retransmission (1, 3, 7 s). A coordinator's host "
		       "raises them (docs/coordinator.md, Scale); run as "
		       "root and the bench does so in a network namespace "
		       "of its own\n",
		    a, b, cfg->n);
		return;
	}
	if (unshare(CLONE_NEWNET) != 0) {
		printf("# join: cannot make a network namespace (%s); "
		       "somaxconn %ld, tcp_max_syn_backlog %ld\n",
		    strerror(errno), a, b);
		return;
	}
	/* loopback is down in a new namespace */
	memset(&ifr, 0, sizeof(ifr));
	cohort__strlcpy(ifr.ifr_name, "lo", sizeof(ifr.ifr_name));
	if ((fd = socket(AF_INET, SOCK_DGRAM | SOCK_CLOEXEC, 0)) >= 0) {
		if (ioctl(fd, SIOCGIFFLAGS, &ifr) == 0) {
			ifr.ifr_flags |= IFF_UP;
			(void)ioctl(fd, SIOCSIFFLAGS, &ifr);
		}
		close(fd);
	}
	/* the n simulated hosts' connections share one port space here:
	 * the whole range for them (28,232 ports by default, and a join
	 * leaves n in TIME_WAIT for the next) */
	(void)bench_write_long("/proc/sys/net/ipv4/tcp_tw_reuse", 1);
	(void)bench_write_text(
	    "/proc/sys/net/ipv4/ip_local_port_range", "1024 65535\n");
	if (!bench_write_long(somax, BENCH_NET_QUEUE)
	    || !bench_write_long(synq, BENCH_NET_QUEUE))
		printf("# join: cannot raise the listen queues in the "
		       "bench's network namespace: %s\n",
		    strerror(errno));
	printf("# join: in a network namespace of its own: somaxconn %ld, "
	       "tcp_max_syn_backlog %ld (this host's: %ld, %ld)\n",
	    bench_read_long(somax), bench_read_long(synq), a, b);
	fflush(stdout);
}

/* The embedded coordinator, cohortd's defaults but one: every simulated
 * client connects from 127.0.0.1, where a cluster's come from one
 * address per host, so --op join lets one source hold n connections that
 * have not authenticated yet (cohortd's --max-pending-per-source, 1024 by
 * default, would close the oldest of a 4,096-client burst). */
static struct cohort__srv *
bench_serve(const struct bench_cfg *cfg)
{
	struct cohort__srv_config sc;
	struct cohort__srv *srv = NULL;
	const char *listens[1] = { "tcp://127.0.0.1:0" };

	cohort__srv_config_init(&sc);
	sc.listen = listens;
	sc.nlisten = 1;
	if (cfg->op == BENCH_JOIN && cfg->n > 1024)
		/* each client's connection, and its probe of the port
		 * while that one is not answered (client/coord.c) */
		sc.max_pending_per_source = 2 * (uint64_t)cfg->n;
	if (cohort__srv_start(&sc, &srv) != COHORT_OK) {
		fprintf(stderr,
		    "cohort bench: cannot start the embedded coordinator: "
		    "%s\n",
		    cohort_last_error());
		return (NULL);
	}
	return (srv);
}

static int
bench_launch(int argc, char **argv, const struct bench_cfg *cfg)
{
	struct cohort__srv *srv = NULL;
	const char *url = cfg->coordinator;
	bool join = cfg->op == BENCH_JOIN;
	int nch = join ? cfg->procs : cfg->n;
	struct bench_child *ch;
	struct cohort__proc *procs;
	struct cohort__launch l;
	char job[64], token[64];
	int rc = 1;

	ch = calloc((size_t)nch, sizeof(*ch));
	procs = calloc((size_t)nch, sizeof(*procs));
	if (ch == NULL || procs == NULL) {
		free(ch);
		free(procs);
		return (1);
	}
	/* once a rank fails, the others get 15 s before SIGKILL */
	cohort__launch_init(&l, procs, nch, 15000, -1);
	for (int i = 0; i < nch; i++)
		ch[i].out = ch[i].go = -1;
	if (url == NULL) {
		if (join) {
			/* The coordinator's host: above the simulated hosts'
			 * control planes (bench_join_proc), as root; without
			 * privilege the levels below keep their spacing. */
			int cur;

			errno = 0;
			cur = getpriority(PRIO_PROCESS, 0);
			if (errno == 0)
				(void)setpriority(
				    PRIO_PROCESS, 0, cur - BENCH_JOIN_NICE);
			bench_join_net(cfg);
		}
		if ((srv = bench_serve(cfg)) == NULL) {
			free(ch);
			free(procs);
			return (1);
		}
		url = cohort__srv_url(srv, 0);
	}
	snprintf(job, sizeof(job), "bench-%d", (int)getpid());
	snprintf(token, sizeof(token), "%016" PRIx64, cohort__random_u64());
	for (int i = 0; i < nch; i++) {
		char a_proc[16], a_first[16], a_count[16], a_go[16];
		char *extra[10];
		const char *env[24];
		char envbuf[4096];
		cohort_env e;
		int ne, nx = 0, fds[2] = { -1, -1 }, gfd[2] = { -1, -1 };
		int first = (int)((int64_t)cfg->n * i / nch);
		int next = (int)((int64_t)cfg->n * (i + 1) / nch);
		cohort_status st;
		cpu_set_t cpus;
		char why[256];
		/* ranks only: the join processes simulate hosts */
		bool bind = !join
		    && cohort__launch_cpus(
		           cfg->bind, i, nch, &cpus, why, sizeof(why))
		        == 0;

		ch[i].out = -1;
		ch[i].status = -1;
		/* the one writer of a worker's variables (cohort_env_vars);
		 * join mode: each process opens many clients, ranks by cohortd
		 */
		memset(&e, 0, sizeof(e));
		cohort__strlcpy(e.coordinator, url, sizeof(e.coordinator));
		cohort__strlcpy(e.job, job, sizeof(e.job));
		cohort__strlcpy(e.token, token, sizeof(e.token));
		e.rank = join ? -1 : i;
		e.world_size = join ? 0 : cfg->n;
		e.local_rank = e.node_rank = -1;
		if ((ne = cohort_env_vars(&e, envbuf, sizeof(envbuf), env, 24))
		    < 0)
			goto out_kill;
		if (join) {
			snprintf(a_proc, sizeof(a_proc), "%d", i);
			snprintf(a_first, sizeof(a_first), "%d", first);
			snprintf(a_count, sizeof(a_count), "%d", next - first);
			extra[nx++] = (char *)"--bench-join-proc";
			extra[nx++] = a_proc;
			extra[nx++] = (char *)"--bench-join-first";
			extra[nx++] = a_first;
			extra[nx++] = (char *)"--bench-join-count";
			extra[nx++] = a_count;
			/* the go pipe: its read end the child's, inherited */
			if (pipe(fds) != 0 || pipe(gfd) != 0) {
				fprintf(stderr, "cohort bench: pipe: %s\n",
				    strerror(errno));
				if (fds[0] >= 0) {
					close(fds[0]);
					close(fds[1]);
				}
				goto out_kill;
			}
			(void)fcntl(fds[0], F_SETFD, FD_CLOEXEC);
			(void)fcntl(gfd[1], F_SETFD, FD_CLOEXEC);
			snprintf(a_go, sizeof(a_go), "%d", gfd[0]);
			extra[nx++] = (char *)"--bench-join-go";
			extra[nx++] = a_go;
		} else {
			extra[nx++] = (char *)"--bench-rank";
		}
		st = bench_spawn(argv, argc, extra, nx, (char *const *)env, ne,
		    fds[1], !join && i != 0, bind ? &cpus : NULL, &procs[i]);
		if (fds[1] >= 0)
			close(fds[1]);
		if (gfd[0] >= 0)
			close(gfd[0]);
		ch[i].out = fds[0];
		ch[i].go = gfd[1];
		if (st != COHORT_OK) {
			if (fds[0] >= 0)
				close(fds[0]);
			ch[i].out = -1;
			fprintf(
			    stderr, "cohort bench: %s\n", cohort_last_error());
			goto out_kill;
		}
	}
	rc = bench_wait_all(ch, &l,
	    cohort__launch_now_ms()
	        + (int64_t)cfg->timeout
	            * (cfg->warmup + cfg->iters + 2
	                + (join ? BENCH_JOIN_AR_ITERS : 0)));
	if (join) /* the join times even if the all-reduce after failed */
		bench_join_report(cfg, ch, nch, rc == 0);
	goto out;

out_kill:
	cohort__launch_kill_all(&l);
	for (int i = 0; i < nch; i++) {
		if (ch[i].out >= 0)
			close(ch[i].out);
		if (ch[i].go >= 0)
			close(ch[i].go);
	}
	rc = 1;
out:
	for (int i = 0; i < nch; i++)
		free(ch[i].buf);
	free(ch);
	free(procs);
	cohort__srv_stop(srv);
	return (rc);
}

int
cohort__cmd_bench(int argc, char **argv)
{
	struct bench_cfg cfg;
	cohort_env env;
	int rc;

	if ((rc = bench_parse(argc, argv, &cfg)) != 0)
		return (rc == 1 ? 0 : rc);
	cohort__log_set_component("cohort-bench");
	cohort__log_set_default_level(COHORT__LOG_WARN);
	if (cfg.op != BENCH_JOIN && cfg.n > 4096) {
		fprintf(stderr,
		    "cohort bench: -n %d: more than 4096 ranks only with "
		    "--op join\n",
		    cfg.n);
		return (2);
	}
	if (cfg.join_proc >= 0)
		return (bench_join_proc(&cfg));
	if (cfg.worker)
		return (bench_rank_main(&cfg));
	if (cfg.op != BENCH_JOIN && cohort_env_resolve(&env) == COHORT_OK
	    && strcmp(env.source, "none") != 0 && env.world_size > 0)
		return (bench_rank_main(&cfg)); /* one rank of a job */
	return (bench_launch(argc, argv, &cfg));
}
