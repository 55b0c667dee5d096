/*
 * cuda_bench.c - benchmark of the CUDA kernels (tests/cuda/kernels/)
 * against the device's own copy bandwidth, with each kernel's error
 * against its CPU reference.
 *
 *   cuda_bench [-m MIB] [-i ITERS] [-o FILE]
 *
 * For a bucket of MIB MiB (default 25, PyTorch DDP's bucket_cap_mb) it
 * times cudaMemcpyAsync device to device as the baseline, then pack and
 * unpack (64 and 400 tensors, aligned and misaligned), scale, cast and
 * reduce2. Bandwidth counts bytes read plus bytes written, for the
 * baseline too, so "% copy" compares like with like. Each row also runs
 * the kernel once on the same inputs on the host (kernels/ref.c) and
 * reports the largest relative error and the number of mismatches.
 *
 * Prints a Markdown table (also written to FILE with -o). Exit status: 0
 * when every row passes (no mismatch; pack/unpack of the aligned
 * 64-tensor bucket at >= 70% of the copy bandwidth), 1 otherwise, 2 on
 * usage or setup errors. Without a GPU it prints one SKIP line, exits 0.
 *
 * Timing: ITERS back-to-back launches on the default stream between two
 * device synchronisations, median of 5 repetitions, after a warm-up.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cohort_impl.h"
#include "kernels.h"
#include "th_elem.h"

#ifndef COHORT_HAVE_CUDA

int
main(void)
{
	printf("SKIP cuda_bench: no GPU (%s)\n",
	    cohort__gpu_unavailable_reason());
	return (0);
}

#else

#define BENCH_REPS 5

struct bench {
	size_t bytes; /* bucket size */
	int iters;
	double copy_gbs;
	int failed;
	FILE *out;
	char line[512];
};

/* One benchmarked operation: enqueue it once. */
struct bench_op {
	cohort_status (*run)(struct bench_op *op);
	void *a;
	void *b;
	size_t n;
	cohort_dtype dt;
	cohort_dtype dt2;
	struct cohort__pack_item *items;
	size_t nitems;
};

static uint64_t bench_state = 88172645463325252ull;

static uint64_t
bench_rand(void)
{
	bench_state ^= bench_state << 13;
	bench_state ^= bench_state >> 7;
	bench_state ^= bench_state << 17;
	return (bench_state);
}

/* Random f32 values in [-8, 8), stored as dt (a float type). */
static void
bench_fill_float(void *p, cohort_dtype dt, size_t n)
{
	size_t i;

	for (i = 0; i < n; i++) {
		float v
		    = (float)((double)(bench_rand() >> 11) * 0x1p-49 - 8.0);

		cohort__elem_store(p, i, dt, v, 0);
	}
}
static void *
bench_host(size_t bytes)
{
	void *p = malloc(bytes > 0 ? bytes : 1);

	if (p == NULL) {
		fprintf(stderr, "cuda_bench: out of host memory\n");
		exit(2);
	}
	return (p);
}

static void *
bench_dev(size_t bytes)
{
	void *p = NULL;

	if (cohort__gpu_alloc(&p, bytes) != COHORT_OK) {
		fprintf(stderr, "cuda_bench: %s\n", cohort__cuda_last_error());
		exit(2);
	}
	return (p);
}

static void
bench_ok(cohort_status rv, const char *what)
{
	if (rv != COHORT_OK) {
		fprintf(stderr, "cuda_bench: %s: %s: %s\n", what,
		    cohort_status_name(rv), cohort_last_error());
		exit(2);
	}
}

static cohort_status
op_memcpy(struct bench_op *op)
{
	return (cohort__gpu_memcpy_d2d(op->a, op->b, op->n, NULL));
}

static cohort_status
op_pack(struct bench_op *op)
{
	return (cohort__cuda_pack(op->a, op->items, op->nitems, NULL));
}

static cohort_status
op_unpack(struct bench_op *op)
{
	return (cohort__cuda_unpack(op->a, op->items, op->nitems, NULL));
}

static cohort_status
op_scale(struct bench_op *op)
{
	return (cohort__cuda_scale(op->a, op->n, op->dt, 1.0, NULL));
}

static cohort_status
op_cast(struct bench_op *op)
{
	return (cohort__cuda_cast(op->a, op->dt, op->b, op->dt2, op->n, NULL));
}

static cohort_status
op_reduce2(struct bench_op *op)
{
	return (cohort__cuda_reduce2(
	    op->a, op->b, op->n, op->dt, COHORT_MAX, NULL));
}

static int
bench_cmp_double(const void *x, const void *y)
{
	double a = *(const double *)x;
	double b = *(const double *)y;

	return ((a > b) - (a < b));
}

/* Seconds per operation: median over BENCH_REPS timed batches. */
static double
bench_time(struct bench *bn, struct bench_op *op)
{
	double t[BENCH_REPS];
	int r;
	int i;

	for (i = 0; i < 3; i++)
		bench_ok(op->run(op), "warm-up");
	bench_ok(cohort__gpu_sync(), "sync");
	for (r = 0; r < BENCH_REPS; r++) {
		uint64_t t0 = cohort__now_ns();
		for (i = 0; i < bn->iters; i++)
			bench_ok(op->run(op), "launch");
		bench_ok(cohort__gpu_sync(), "sync");
		t[r] = (double)(cohort__now_ns() - t0) * 1e-9 / bn->iters;
	}
	qsort(t, BENCH_REPS, sizeof(t[0]), bench_cmp_double);
	return (t[BENCH_REPS / 2]);
}

static void
bench_row(struct bench *bn, const char *kernel, const char *detail,
    size_t mismatches, double max_rel, double moved, double secs,
    double need_pct)
{
	double gbs = moved / secs * 1e-9;
	double pct = 100.0 * gbs / bn->copy_gbs;
	bool pass = mismatches == 0 && (need_pct == 0 || pct >= need_pct);

	if (!pass)
		bn->failed++;
	snprintf(bn->line, sizeof(bn->line),
	    "| %-8s | %-30s | %9.2e | %10zu | %8.1f | %6.1f%% | %-4s |",
	    kernel, detail, max_rel, mismatches, gbs, pct,
	    pass ? "PASS" : "FAIL");
	printf("%s\n", bn->line);
	if (bn->out != NULL)
		fprintf(bn->out, "%s\n", bn->line);
}

/* Splits bytes into n f32 tensors of uneven sizes (0.5x .. 1.5x the mean),
 * placed in an arena at 256-byte boundaries, plus skew bytes each. */
static size_t
bench_tensors(
    struct cohort__pack_item *it, size_t n, size_t bytes, size_t skew)
{
	size_t left = bytes / 4;
	size_t pos = 0;
	size_t i;

	for (i = 0; i < n; i++) {
		size_t mean = left / (n - i);
		size_t elems = i + 1 == n
		    ? left
		    : mean / 2 + (size_t)(bench_rand() % (mean + 1));
		if (elems > left)
			elems = left;
		left -= elems;
		it[i].bytes = elems * 4;
		pos = (pos + 255) & ~(size_t)255;
		it[i].ptr = (void *)(pos + skew); /* an offset for now */
		pos += skew + it[i].bytes;
	}
	return (pos + 256);
}

static void
bench_pack(
    struct bench *bn, size_t n, size_t skew, size_t align, double need_pct)
{
	struct cohort__pack_item *hi = calloc(n, sizeof(*hi));
	struct cohort__pack_item *di = calloc(n, sizeof(*di));
	size_t arena;
	size_t total;
	size_t i;
	size_t bad;
	char *h_arena;
	char *h_bucket;
	char *g;
	char *d_arena;
	char *d_bucket;
	char detail[64];
	struct bench_op op;
	double secs;

	if (hi == NULL || di == NULL)
		exit(2);
	arena = bench_tensors(hi, n, bn->bytes, skew);
	total = cohort__pack_layout(hi, n, align);
	h_arena = bench_host(arena);
	g = bench_host(arena > total ? arena : total);
	h_bucket = bench_host(total);
	d_arena = bench_dev(arena);
	d_bucket = bench_dev(total);
	for (i = 0; i < n; i++) {
		size_t off = (size_t)(uintptr_t)hi[i].ptr;
		di[i] = hi[i];
		di[i].ptr = d_arena + off;
		hi[i].ptr = h_arena + off;
	}
	th_fill_bytes(h_arena, arena, bench_rand);
	bench_ok(cohort__gpu_memcpy_h2d(d_arena, h_arena, arena), "h2d");

	/* pack: check once, then time */
	memset(h_bucket, 0, total);
	bench_ok(cohort__gpu_memset(d_bucket, 0, total), "memset");
	bench_ok(cohort__ref_pack(h_bucket, hi, n), "ref pack");
	bench_ok(cohort__cuda_pack(d_bucket, di, n, NULL), "pack");
	bench_ok(cohort__gpu_sync(), "sync");
	bench_ok(cohort__gpu_memcpy_d2h(g, d_bucket, total), "d2h");
	bad = cohort__ref_compare(
	    "pack", COHORT_U8, g, h_bucket, total, 0, 5, NULL);
	op = (struct bench_op) {
		.run = op_pack, .a = d_bucket, .items = di, .nitems = n
	};
	secs = bench_time(bn, &op);
	snprintf(detail, sizeof(detail), "%zu tensors%s, %zu MiB", n,
	    skew % 16 != 0 ? " (4B-aligned)" : "", bn->bytes >> 20);
	bench_row(bn, "pack", detail, bad, 0, 2.0 * (double)bn->bytes, secs,
	    need_pct);

	/* unpack back over a poisoned arena */
	memset(h_arena, 0x77, arena);
	bench_ok(cohort__gpu_memset(d_arena, 0x77, arena), "memset");
	bench_ok(cohort__ref_unpack(h_bucket, hi, n), "ref unpack");
	bench_ok(cohort__cuda_unpack(d_bucket, di, n, NULL), "unpack");
	bench_ok(cohort__gpu_sync(), "sync");
	bench_ok(cohort__gpu_memcpy_d2h(g, d_arena, arena), "d2h");
	bad = cohort__ref_compare(
	    "unpack", COHORT_U8, g, h_arena, arena, 0, 5, NULL);
	op.run = op_unpack;
	secs = bench_time(bn, &op);
	bench_row(bn, "unpack", detail, bad, 0, 2.0 * (double)bn->bytes, secs,
	    need_pct);

	cohort__gpu_free(d_arena);
	cohort__gpu_free(d_bucket);
	free(h_arena);
	free(h_bucket);
	free(g);
	free(hi);
	free(di);
}

/* The element-wise kernels on a bucket's worth of dt elements. */
static void
bench_elementwise(struct bench *bn)
{
	static const cohort_dtype sdt[]
	    = { COHORT_F32, COHORT_BF16, COHORT_F16 };
	size_t maxn = bn->bytes / 2;
	void *h1 = bench_host(maxn * 4);
	void *h2 = bench_host(maxn * 4);
	void *g = bench_host(maxn * 4);
	void *d1 = bench_dev(maxn * 4);
	void *d2 = bench_dev(maxn * 4);
	struct bench_op op;
	char detail[64];
	double rel;
	size_t bad;
	size_t k;

	/* scale: alpha 1/3 for the error, 1.0 in the timed loop */
	for (k = 0; k < 2; k++) {
		cohort_dtype dt = sdt[k];
		size_t n = bn->bytes / cohort_dtype_size(dt);
		size_t bytes = n * cohort_dtype_size(dt);

		bench_fill_float(h1, dt, n);
		bench_ok(cohort__gpu_memcpy_h2d(d1, h1, bytes), "h2d");
		bench_ok(cohort__ref_scale(h1, n, dt, 1.0 / 3.0), "ref");
		bench_ok(
		    cohort__cuda_scale(d1, n, dt, 1.0 / 3.0, NULL), "scale");
		bench_ok(cohort__gpu_sync(), "sync");
		bench_ok(cohort__gpu_memcpy_d2h(g, d1, bytes), "d2h");
		bad = cohort__ref_compare("scale", dt, g, h1, n,
		    dt == COHORT_F32 ? 1e-6 : 8e-3, 5, &rel);
		op = (struct bench_op) {
			.run = op_scale, .a = d1, .n = n, .dt = dt
		};
		snprintf(detail, sizeof(detail), "%s x %zu",
		    cohort_dtype_name(dt), n);
		bench_row(bn, "scale", detail, bad, rel, 2.0 * (double)bytes,
		    bench_time(bn, &op), 0);
	}

	/* casts: f32 <-> f16 and bf16, n = bucket / 4 elements */
	for (k = 1; k < 3; k++) {
		cohort_dtype half = sdt[k];
		size_t n = bn->bytes / 4;

		bench_fill_float(h1, COHORT_F32, n);
		bench_ok(cohort__gpu_memcpy_h2d(d1, h1, n * 4), "h2d");
		bench_ok(cohort__ref_cast(h2, half, h1, COHORT_F32, n), "ref");
		bench_ok(cohort__cuda_cast(d2, half, d1, COHORT_F32, n, NULL),
		    "cast");
		bench_ok(cohort__gpu_sync(), "sync");
		bench_ok(cohort__gpu_memcpy_d2h(g, d2, n * 2), "d2h");
		bad = cohort__ref_compare("cast", half, g, h2, n, 0, 5, &rel);
		op = (struct bench_op) { .run = op_cast,
			.a = d2,
			.b = d1,
			.n = n,
			.dt = half,
			.dt2 = COHORT_F32 };
		snprintf(detail, sizeof(detail), "f32 -> %s x %zu",
		    cohort_dtype_name(half), n);
		bench_row(bn, "cast", detail, bad, rel, 6.0 * (double)n,
		    bench_time(bn, &op), 0);

		/* back: d2 holds the halves */
		bench_ok(cohort__ref_cast(h1, COHORT_F32, h2, half, n), "ref");
		bench_ok(cohort__cuda_cast(d1, COHORT_F32, d2, half, n, NULL),
		    "cast");
		bench_ok(cohort__gpu_sync(), "sync");
		bench_ok(cohort__gpu_memcpy_d2h(g, d1, n * 4), "d2h");
		bad = cohort__ref_compare(
		    "cast", COHORT_F32, g, h1, n, 0, 5, &rel);
		op = (struct bench_op) { .run = op_cast,
			.a = d1,
			.b = d2,
			.n = n,
			.dt = COHORT_F32,
			.dt2 = half };
		snprintf(detail, sizeof(detail), "%s -> f32 x %zu",
		    cohort_dtype_name(half), n);
		bench_row(bn, "cast", detail, bad, rel, 6.0 * (double)n,
		    bench_time(bn, &op), 0);
	}

	/* reduce2: sum for the error, max (idempotent) in the timed loop */
	for (k = 0; k < 2; k++) {
		cohort_dtype dt = sdt[k];
		size_t n = bn->bytes / cohort_dtype_size(dt);
		size_t bytes = n * cohort_dtype_size(dt);

		bench_fill_float(h1, dt, n);
		bench_fill_float(h2, dt, n);
		bench_ok(cohort__gpu_memcpy_h2d(d1, h1, bytes), "h2d");
		bench_ok(cohort__gpu_memcpy_h2d(d2, h2, bytes), "h2d");
		bench_ok(
		    cohort__ref_reduce2(h1, h2, n, dt, COHORT_SUM), "ref");
		bench_ok(cohort__cuda_reduce2(d1, d2, n, dt, COHORT_SUM, NULL),
		    "reduce2");
		bench_ok(cohort__gpu_sync(), "sync");
		bench_ok(cohort__gpu_memcpy_d2h(g, d1, bytes), "d2h");
		bad = cohort__ref_compare("reduce2", dt, g, h1, n,
		    dt == COHORT_F32 ? 1e-6 : 8e-3, 5, &rel);
		op = (struct bench_op) {
			.run = op_reduce2, .a = d1, .b = d2, .n = n, .dt = dt
		};
		snprintf(detail, sizeof(detail), "%s sum x %zu",
		    cohort_dtype_name(dt), n);
		bench_row(bn, "reduce2", detail, bad, rel, 3.0 * (double)bytes,
		    bench_time(bn, &op), 0);
	}

	cohort__gpu_free(d1);
	cohort__gpu_free(d2);
	free(h1);
	free(h2);
	free(g);
}

static void
bench_print(struct bench *bn, const char *s)
{
	printf("%s\n", s);
	if (bn->out != NULL)
		fprintf(bn->out, "%s\n", s);
}

int
main(int argc, char **argv)
{
	struct bench bn = { .bytes = (size_t)25 << 20, .iters = 100 };
	const char *path = NULL;
	struct bench_op op;
	char desc[256];
	void *a;
	void *b;
	int64_t v;
	int c;

	while ((c = getopt(argc, argv, "m:i:o:")) != -1) {
		switch (c) {
		case 'm':
			if (!cohort__parse_i64(optarg, &v) || v < 1
			    || v > 16384)
				goto usage;
			bn.bytes = (size_t)v << 20;
			break;
		case 'i':
			if (!cohort__parse_i64(optarg, &v) || v < 1
			    || v > 100000)
				goto usage;
			bn.iters = (int)v;
			break;
		case 'o':
			path = optarg;
			break;
		default:
			goto usage;
		}
	}
	if (!cohort__gpu_available()) {
		printf("SKIP cuda_bench: no GPU (%s)\n",
		    cohort__gpu_unavailable_reason());
		return (0);
	}
	if (path != NULL && (bn.out = fopen(path, "w")) == NULL) {
		perror(path);
		return (2);
	}
	bench_ok(cohort__gpu_describe(desc, sizeof(desc)), "describe");

	a = bench_dev(bn.bytes);
	b = bench_dev(bn.bytes);
	bench_ok(cohort__gpu_memset(b, 1, bn.bytes), "memset");
	op = (struct bench_op) {
		.run = op_memcpy, .a = a, .b = b, .n = bn.bytes
	};
	bn.copy_gbs = 2.0 * (double)bn.bytes / bench_time(&bn, &op) * 1e-9;
	cohort__gpu_free(a);
	cohort__gpu_free(b);

	snprintf(bn.line, sizeof(bn.line),
	    "Device: %s. Baseline cudaMemcpyAsync D2D of %zu MiB: %.1f GB/s "
	    "(read + write), median of %d x %d.",
	    desc, bn.bytes >> 20, bn.copy_gbs, BENCH_REPS, bn.iters);
	bench_print(&bn, bn.line);
	bench_print(&bn, "");
	bench_print(&bn,
	    "| kernel   | case                           | "
	    "max rel err | mismatches |     GB/s | % copy | "
	    "ok   |");
	bench_print(&bn,
	    "|----------|--------------------------------|"
	    "-----------:|-----------:|---------:|-------:|"
	    "------|");
	bench_pack(&bn, 64, 0, 256, 70.0);
	bench_pack(&bn, 400, 0, 256, 0);
	bench_pack(&bn, 64, 4, 16, 0);
	bench_elementwise(&bn);
	snprintf(bn.line, sizeof(bn.line),
	    "\ncuda_bench: %s (%d failing rows)",
	    bn.failed == 0 ? "PASS" : "FAIL", bn.failed);
	bench_print(&bn, bn.line);
	if (bn.out != NULL)
		fclose(bn.out);
	return (bn.failed == 0 ? 0 : 1);

usage:
	fprintf(stderr, "usage: cuda_bench [-m MIB] [-i ITERS] [-o FILE]\n");
	return (2);
}

#endif /* COHORT_HAVE_CUDA */
