/*
 * test_mlp.c - the examples' model and data code (examples/lib): backward
 * against finite differences, deterministic init and checksums, SGD, the
 * data-parallel sharding invariant, and the digits CSV parser. Needs
 * neither the network nor the data set.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "digits.h"
#include "mlp.h"

#define NI 64
#define NH 128
#define NO 10

/* Deterministic pseudo-random inputs in [0, 1) and labels. */
static void
fill_batch(float *x, uint8_t *y, size_t n, uint64_t seed)
{
	uint64_t s = seed * 2654435761u + 1;

	for (size_t i = 0; i < n * NI; i++) {
		s = s * 6364136223846793005ULL + 1442695040888963407ULL;
		x[i] = (float)(s >> 40) / 16777216.0f;
	}
	for (size_t i = 0; i < n; i++) {
		s = s * 6364136223846793005ULL + 1442695040888963407ULL;
		y[i] = (uint8_t)((s >> 33) % NO);
	}
}

/* The mean cross-entropy of the model on a batch, in double precision,
 * written independently of mlp.c (the finite-difference reference). */
static double
ref_loss(const struct mlp *m, const float *x, const uint8_t *y, size_t n)
{
	const float *w1 = m->param[0].data, *b1 = m->param[1].data;
	const float *w2 = m->param[2].data, *b2 = m->param[3].data;
	double total = 0.0;

	for (size_t s = 0; s < n; s++) {
		double h[NH], z[NO], max, sum = 0.0;

		for (int j = 0; j < NH; j++) {
			double a = b1[j];

			for (int k = 0; k < NI; k++)
				a += (double)w1[j * NI + k] * x[s * NI + k];
			h[j] = a > 0 ? a : 0;
		}
		for (int o = 0; o < NO; o++) {
			double a = b2[o];

			for (int j = 0; j < NH; j++)
				a += (double)w2[o * NH + j] * h[j];
			z[o] = a;
		}
		max = z[0];
		for (int o = 1; o < NO; o++)
			max = z[o] > max ? z[o] : max;
		for (int o = 0; o < NO; o++)
			sum += exp(z[o] - max);
		total += log(sum) + max - z[y[s]];
	}
	return (total / (double)n);
}

START_TEST(test_init_deterministic)
{
	struct mlp a, b, c;

	ck_assert_int_eq(mlp_init(&a, NI, NH, NO, 42), 0);
	ck_assert_int_eq(mlp_init(&b, NI, NH, NO, 42), 0);
	ck_assert_int_eq(mlp_init(&c, NI, NH, NO, 43), 0);
	ck_assert_uint_eq(a.n_params, NH * NI + NH + NO * NH + NO);
	ck_assert_int_eq(
	    memcmp(a.params, b.params, a.n_params * sizeof(float)), 0);
	ck_assert(mlp_checksum(&a) == mlp_checksum(&b));
	ck_assert(mlp_checksum(&a) != mlp_checksum(&c));
	/* Layout: four tensors back to back, in registration order. */
	ck_assert_str_eq(a.param[0].name, "fc1.weight");
	ck_assert_str_eq(a.param[3].name, "fc2.bias");
	ck_assert_uint_eq(a.param[3].offset + a.param[3].count, a.n_params);
	ck_assert_ptr_eq(a.param[2].grad, a.grads + a.param[2].offset);
	/* Biases start at zero, weights within the He bound and not all
	 * equal. */
	for (int j = 0; j < NH; j++)
		ck_assert(a.param[1].data[j] == 0.0f);
	for (size_t i = 0; i < a.param[0].count; i++)
		ck_assert(fabsf(a.param[0].data[i]) <= sqrtf(6.0f / NI));
	ck_assert(a.param[0].data[0] != a.param[0].data[1]);
	/* reset = init with the same seed. */
	mlp_reset(&c, 42);
	ck_assert(mlp_checksum(&a) == mlp_checksum(&c));
	mlp_fini(&a);
	mlp_fini(&b);
	mlp_fini(&c);
}
END_TEST

START_TEST(test_init_rejects_bad_sizes)
{
	struct mlp m;

	ck_assert_int_eq(mlp_init(&m, 0, NH, NO, 1), -1);
	ck_assert_int_eq(mlp_init(&m, NI, -3, NO, 1), -1);
	mlp_fini(&m);
	mlp_fini(NULL);
}
END_TEST

START_TEST(test_fnv1a64_vectors)
{
	/* Reference values of the FNV-1a 64-bit hash. */
	ck_assert(mlp_fnv1a64("", 0) == 0xcbf29ce484222325ULL);
	ck_assert(mlp_fnv1a64("a", 1) == 0xaf63dc4c8601ec8cULL);
	ck_assert(mlp_fnv1a64("foobar", 6) == 0x85944171f73967e8ULL);
}
END_TEST

START_TEST(test_forward_loss_matches_reference)
{
	enum { N = 6 };
	float x[N * NI];
	uint8_t y[N];
	struct mlp m;
	double loss = 0.0;
	size_t correct = 0;

	fill_batch(x, y, N, 7);
	ck_assert_int_eq(mlp_init(&m, NI, NH, NO, 3), 0);
	ck_assert_int_eq(mlp_forward(&m, x, y, N, &loss, &correct), 0);
	ck_assert_double_eq_tol(loss / N, ref_loss(&m, x, y, N), 1e-5);
	ck_assert_uint_le(correct, N);
	/* The probabilities of every sample sum to 1. */
	for (int s = 0; s < N; s++) {
		double sum = 0.0;

		for (int o = 0; o < NO; o++)
			sum += m.probs[s * NO + o];
		ck_assert_double_eq_tol(sum, 1.0, 1e-5);
	}
	mlp_fini(&m);
}
END_TEST

START_TEST(test_gradient_check)
{
	enum { N = 5, PER_TENSOR = 12 };
	float x[N * NI];
	uint8_t y[N];
	struct mlp m;
	uint64_t pick = 12345;
	int checked = 0;

	fill_batch(x, y, N, 11);
	ck_assert_int_eq(mlp_init(&m, NI, NH, NO, 5), 0);
	/* Non-zero biases so their gradients are exercised off zero. */
	for (int j = 0; j < NH; j++)
		m.param[1].data[j] = 0.01f * (float)((j % 7) - 3);
	for (int o = 0; o < NO; o++)
		m.param[3].data[o] = 0.02f * (float)(o - 5);
	mlp_zero_grad(&m);
	ck_assert_int_eq(mlp_forward(&m, x, y, N, NULL, NULL), 0);
	mlp_backward(&m, x, y, N, 1.0f / N);

	for (int t = 0; t < MLP_NPARAMS; t++) {
		for (int k = 0; k < PER_TENSOR; k++) {
			size_t i;
			float *p, saved, hi, lo;
			double fd, an;

			pick = pick * 6364136223846793005ULL + 1;
			i = (size_t)((pick >> 33) % m.param[t].count);
			/* Always include element 0 of each tensor. */
			if (k == 0)
				i = 0;
			p = &m.param[t].data[i];
			saved = *p;
			hi = saved + 1e-3f;
			lo = saved - 1e-3f;
			*p = hi;
			fd = ref_loss(&m, x, y, N);
			*p = lo;
			fd -= ref_loss(&m, x, y, N);
			fd /= (double)hi - (double)lo;
			*p = saved;
			an = m.param[t].grad[i];
			ck_assert_msg(fabs(an - fd) <= 2e-5 + 1e-3 * fabs(fd),
			    "%s[%zu]: backward %.8g, finite difference %.8g",
			    m.param[t].name, i, an, fd);
			checked++;
		}
	}
	ck_assert_int_eq(checked, MLP_NPARAMS * PER_TENSOR);
	mlp_fini(&m);
}
END_TEST

struct ready_log {
	struct mlp *m;
	int order[8];
	int n;
	float *snap[MLP_NPARAMS]; /* gradient copies taken in the callback */
};

static void
on_ready(void *ctx, int i)
{
	struct ready_log *log = ctx;

	log->order[log->n++] = i;
	memcpy(log->snap[i], log->m->param[i].grad,
	    log->m->param[i].count * sizeof(float));
}

START_TEST(test_grad_ready_order_and_final)
{
	enum { N = 4 };
	float x[N * NI];
	uint8_t y[N];
	struct mlp m;
	struct ready_log log;

	fill_batch(x, y, N, 3);
	ck_assert_int_eq(mlp_init(&m, NI, NH, NO, 9), 0);
	memset(&log, 0, sizeof(log));
	log.m = &m;
	for (int i = 0; i < MLP_NPARAMS; i++)
		ck_assert_ptr_nonnull(
		    log.snap[i] = calloc(m.param[i].count, sizeof(float)));
	mlp_set_grad_ready(&m, on_ready, &log);
	ck_assert_int_eq(mlp_forward(&m, x, y, N, NULL, NULL), 0);
	mlp_backward(&m, x, y, N, 1.0f / N);

	/* Reverse registration order, like autograd; each exactly once. */
	ck_assert_int_eq(log.n, 4);
	ck_assert_int_eq(log.order[0], 3);
	ck_assert_int_eq(log.order[1], 2);
	ck_assert_int_eq(log.order[2], 1);
	ck_assert_int_eq(log.order[3], 0);
	/* What the callback saw is the final gradient. */
	for (int i = 0; i < MLP_NPARAMS; i++) {
		ck_assert_int_eq(memcmp(log.snap[i], m.param[i].grad,
		                     m.param[i].count * sizeof(float)),
		    0);
		free(log.snap[i]);
	}
	mlp_set_grad_ready(&m, NULL, NULL);
	mlp_backward(&m, x, y, N, 1.0f / N);
	ck_assert_int_eq(log.n, 4);
	mlp_fini(&m);
}
END_TEST

START_TEST(test_sgd_decreases_loss)
{
	enum { N = 8 };
	float x[N * NI];
	uint8_t y[N];
	struct mlp m;
	double before = 0.0, after = 0.0;

	fill_batch(x, y, N, 21);
	ck_assert_int_eq(mlp_init(&m, NI, NH, NO, 1), 0);
	ck_assert_int_eq(mlp_forward(&m, x, y, N, &before, NULL), 0);
	for (int step = 0; step < 30; step++) {
		mlp_zero_grad(&m);
		ck_assert_int_eq(mlp_forward(&m, x, y, N, NULL, NULL), 0);
		mlp_backward(&m, x, y, N, 1.0f / N);
		ck_assert_int_eq(
		    mlp_sgd_step(&m, 0.1f, step < 15 ? 0.0f : 0.9f), 0);
	}
	ck_assert_int_eq(mlp_forward(&m, x, y, N, &after, NULL), 0);
	ck_assert_msg(after < 0.25 * before, "loss %g -> %g", before, after);
	mlp_fini(&m);
}
END_TEST

/* Compares two gradient buffers within float tolerance. */
static void
assert_grads_close(const float *a, const float *b, size_t n, const char *what)
{
	for (size_t i = 0; i < n; i++)
		ck_assert_msg(
		    fabsf(a[i] - b[i]) <= 1e-6f + 1e-4f * fabsf(b[i]),
		    "%s: element %zu: %.9g vs %.9g", what, i, a[i], b[i]);
}

/* N ranks, each taking every N-th sample of a global batch and averaging
 * its own mean gradient with the others' (what allreduce MEAN does), get
 * the gradient of one process on the whole batch. */
START_TEST(test_sharding_invariant)
{
	enum { NS = 96, G = 32 };
	static const int worlds[] = { 1, 2, 4 };
	struct digits d;
	size_t perm[NS], idx[G], seen[NS];
	float bx[G * NI], mean[NH * NI + NH + NO * NH + NO];
	uint8_t by[G];
	struct mlp whole, shard;

	d.n = NS;
	ck_assert_ptr_nonnull(d.x = malloc(NS * NI * sizeof(float)));
	ck_assert_ptr_nonnull(d.y = malloc(NS));
	fill_batch(d.x, d.y, NS, 99);
	digits_epoch_order(perm, NS, 1, 0);
	ck_assert_int_eq(mlp_init(&whole, NI, NH, NO, 8), 0);
	ck_assert_int_eq(mlp_init(&shard, NI, NH, NO, 8), 0);
	ck_assert_uint_eq(whole.n_params, sizeof(mean) / sizeof(float));

	for (size_t b = 0; b < digits_num_batches(NS, G, 1); b++) {
		size_t n = digits_shard(perm, b * G, G, 0, 1, idx);

		ck_assert_uint_eq(n, G);
		digits_gather(&d, idx, n, bx, by);
		mlp_zero_grad(&whole);
		ck_assert_int_eq(
		    mlp_forward(&whole, bx, by, n, NULL, NULL), 0);
		mlp_backward(&whole, bx, by, n, 1.0f / (float)n);

		for (size_t w = 0; w < sizeof(worlds) / sizeof(worlds[0]);
		     w++) {
			int world = worlds[w];

			memset(mean, 0, sizeof(mean));
			memset(seen, 0, sizeof(seen));
			for (int r = 0; r < world; r++) {
				n = digits_shard(
				    perm, b * G, G, r, world, idx);
				ck_assert_uint_eq(n, G / world);
				for (size_t i = 0; i < n; i++)
					seen[idx[i]]++;
				digits_gather(&d, idx, n, bx, by);
				mlp_zero_grad(&shard);
				ck_assert_int_eq(
				    mlp_forward(&shard, bx, by, n, NULL, NULL),
				    0);
				mlp_backward(
				    &shard, bx, by, n, 1.0f / (float)n);
				for (size_t i = 0; i < shard.n_params; i++)
					mean[i] += shard.grads[i];
			}
			for (size_t i = 0; i < shard.n_params; i++)
				mean[i] /= (float)world;
			/* The shards partition the global batch. */
			for (size_t i = 0; i < G; i++)
				ck_assert_uint_eq(seen[perm[b * G + i]], 1);
			assert_grads_close(mean, whole.grads, whole.n_params,
			    world == 1       ? "1 rank"
			        : world == 2 ? "2 ranks"
			                     : "4 ranks");
		}
	}
	mlp_fini(&whole);
	mlp_fini(&shard);
	digits_free(&d);
}
END_TEST

/* K accumulated micro-batches of B (scale 1/(B*K)) = one batch of K*B. */
START_TEST(test_accumulation_equivalence)
{
	enum { B = 8, K = 4 };
	float x[B * K * NI];
	uint8_t y[B * K];
	struct mlp big, acc;

	fill_batch(x, y, B * K, 5);
	ck_assert_int_eq(mlp_init(&big, NI, NH, NO, 2), 0);
	ck_assert_int_eq(mlp_init(&acc, NI, NH, NO, 2), 0);
	ck_assert_int_eq(mlp_forward(&big, x, y, B * K, NULL, NULL), 0);
	mlp_backward(&big, x, y, B * K, 1.0f / (B * K));
	for (int k = 0; k < K; k++) {
		ck_assert_int_eq(mlp_forward(&acc, x + k * B * NI, y + k * B,
		                     B, NULL, NULL),
		    0);
		mlp_backward(
		    &acc, x + k * B * NI, y + k * B, B, 1.0f / (B * K));
	}
	assert_grads_close(acc.grads, big.grads, big.n_params, "accum");
	mlp_fini(&big);
	mlp_fini(&acc);
}
END_TEST

START_TEST(test_evaluate_chunks)
{
	enum { N = 600 };
	float *x = malloc(N * NI * sizeof(float));
	uint8_t y[N];
	struct mlp m;
	double loss = 0.0;
	size_t correct = 0;

	ck_assert_ptr_nonnull(x);
	fill_batch(x, y, N, 17);
	ck_assert_int_eq(mlp_init(&m, NI, NH, NO, 4), 0);
	ck_assert_int_eq(mlp_evaluate(&m, x, y, N, &loss, &correct), 0);
	ck_assert_double_eq_tol(loss / N, ref_loss(&m, x, y, N), 1e-5);
	mlp_fini(&m);
	free(x);
}
END_TEST

/* ------------------------------------------------------------------ */
/* digits                                                               */
/* ------------------------------------------------------------------ */

/* One CSV line: pixel i = (i + k) % 17, then label. */
static size_t
csv_line(char *buf, size_t len, int k, int label, const char *eol)
{
	size_t off = 0;

	for (int i = 0; i < DIGITS_FEATURES; i++)
		off += (size_t)snprintf(
		    buf + off, len - off, "%d,", (i + k) % 17);
	off += (size_t)snprintf(buf + off, len - off, "%d%s", label, eol);
	return (off);
}

START_TEST(test_digits_parse_ok)
{
	char text[2048];
	size_t off = 0;
	struct digits d;
	char err[256] = "";

	off += (size_t)snprintf(text, sizeof(text), "# a comment\n");
	off += csv_line(text + off, sizeof(text) - off, 0, 3, "\r\n");
	off += (size_t)snprintf(text + off, sizeof(text) - off, "\n  \n");
	off += csv_line(text + off, sizeof(text) - off, 5, 9, "\n");
	off += csv_line(text + off, sizeof(text) - off, 16, 0, "");
	ck_assert_msg(
	    digits_parse(text, off, &d, err, sizeof(err)) == 0, "%s", err);
	ck_assert_uint_eq(d.n, 3);
	ck_assert_int_eq(d.y[0], 3);
	ck_assert_int_eq(d.y[1], 9);
	ck_assert_int_eq(d.y[2], 0);
	ck_assert(d.x[0] == 0.0f);
	ck_assert(d.x[16] == 1.0f);
	ck_assert(d.x[DIGITS_FEATURES + 0] == 5.0f / 16.0f);
	ck_assert(d.x[2 * DIGITS_FEATURES + 1] == 0.0f);
	digits_free(&d);
	digits_free(NULL);
}
END_TEST

static void
expect_parse_error(const char *text, const char *want)
{
	struct digits d = { 7, NULL, NULL };
	char err[256] = "";

	ck_assert_int_eq(
	    digits_parse(text, strlen(text), &d, err, sizeof(err)), -1);
	ck_assert_msg(
	    strstr(err, want) != NULL, "error '%s' lacks '%s'", err, want);
	ck_assert_uint_eq(d.n, 7); /* untouched */
}

START_TEST(test_digits_parse_errors)
{
	char good[1024], bad[1200];
	size_t n = csv_line(good, sizeof(good), 0, 1, "\n");

	expect_parse_error("", "no samples");
	expect_parse_error("\n\n# only comments\n", "no samples");
	expect_parse_error("1,2,3\n", "line 1: expected 65 fields");
	snprintf(bad, sizeof(bad), "%s1,2,x3,4\n", good);
	expect_parse_error(bad, "line 2, field 3: not a number: 'x3'");
	snprintf(bad, sizeof(bad), "%s%.*s,5\n", good, (int)n - 1, good);
	expect_parse_error(bad, "line 2: more than 65 fields");
	snprintf(bad, sizeof(bad), "%.*s,,1\n", (int)n - 3, good);
	expect_parse_error(bad, "field 65: not a number: ''");
	snprintf(bad, sizeof(bad), "%.*s12\n", (int)n - 2, good);
	expect_parse_error(bad, "label 12 is not an integer in 0..9");
	snprintf(bad, sizeof(bad), "%.*s2.5\n", (int)n - 2, good);
	expect_parse_error(bad, "label 2.5");
	snprintf(bad, sizeof(bad), "17,%s", good + 2);
	expect_parse_error(bad, "line 1, field 1: pixel 17 out of range");
}
END_TEST

START_TEST(test_digits_load_errors)
{
	struct digits d;
	char err[256] = "", path[512];
	FILE *f;

	ck_assert_int_eq(
	    digits_load("/nonexistent/digits.csv", &d, err, sizeof(err)), -1);
	ck_assert_has(err, "/nonexistent/digits.csv: No such file");
	snprintf(path, sizeof(path), "%s/bad.csv", th_tmpdir());
	ck_assert_ptr_nonnull(f = fopen(path, "w"));
	fputs("0,1\n", f);
	fclose(f);
	ck_assert_int_eq(digits_load(path, &d, err, sizeof(err)), -1);
	ck_assert_has(err, "bad.csv: line 1: expected 65");
}
END_TEST

START_TEST(test_digits_shuffle_split_order)
{
	enum { NS = 50 };
	struct digits a, b, train, test;
	size_t p1[NS], p2[NS], p3[NS], seen[NS] = { 0 };
	int moved = 0;

	a.n = b.n = NS;
	ck_assert_ptr_nonnull(a.x = malloc(NS * NI * sizeof(float)));
	ck_assert_ptr_nonnull(a.y = malloc(NS));
	ck_assert_ptr_nonnull(b.x = malloc(NS * NI * sizeof(float)));
	ck_assert_ptr_nonnull(b.y = malloc(NS));
	for (int i = 0; i < NS; i++) {
		for (int k = 0; k < NI; k++)
			a.x[i * NI + k] = b.x[i * NI + k] = (float)i;
		a.y[i] = b.y[i] = (uint8_t)(i % 10);
	}
	digits_shuffle(&a, 7);
	digits_shuffle(&b, 7);
	ck_assert_int_eq(memcmp(a.x, b.x, NS * NI * sizeof(float)), 0);
	for (int i = 0; i < NS; i++) {
		int orig = (int)a.x[i * NI];

		ck_assert_int_eq(a.y[i], orig % 10); /* rows stay whole */
		ck_assert(a.x[i * NI + NI - 1] == (float)orig);
		moved += orig != i;
	}
	ck_assert_int_gt(moved, NS / 2);

	ck_assert_int_eq(digits_split(&a, 10, &train, &test), 0);
	ck_assert_uint_eq(train.n, 40);
	ck_assert_uint_eq(test.n, 10);
	ck_assert(test.x[0] == a.x[40 * NI]);
	ck_assert_int_eq(digits_split(&a, NS, &train, &test), -1);

	digits_epoch_order(p1, NS, 3, 0);
	digits_epoch_order(p2, NS, 3, 0);
	digits_epoch_order(p3, NS, 3, 1);
	ck_assert_int_eq(memcmp(p1, p2, sizeof(p1)), 0);
	ck_assert_int_ne(memcmp(p1, p3, sizeof(p1)), 0);
	for (int i = 0; i < NS; i++)
		seen[p1[i]]++;
	for (int i = 0; i < NS; i++)
		ck_assert_uint_eq(seen[i], 1);

	ck_assert_uint_eq(digits_num_batches(50, 16, 1), 3);
	ck_assert_uint_eq(digits_num_batches(50, 16, 0), 4);
	ck_assert_uint_eq(digits_num_batches(50, 0, 0), 0);
	/* A partial batch of 5 over 4 ranks: 2, 1, 1, 1. */
	ck_assert_uint_eq(digits_shard(NULL, 48, 5, 0, 4, p2), 2);
	ck_assert_uint_eq(p2[1], 52);
	ck_assert_uint_eq(digits_shard(NULL, 48, 5, 3, 4, p2), 1);
	ck_assert_uint_eq(digits_shard(NULL, 48, 5, 4, 4, p2), 0);

	digits_free(&a);
	digits_free(&b);
	digits_free(&train);
	digits_free(&test);
}
END_TEST

/* One line: tools/gen_suites.sh collects `Suite *suite_<name>(void)`. */
Suite *suite_mlp(void);

UNIT_SUITE(mlp, "core", 30, test_init_deterministic,
    test_init_rejects_bad_sizes, test_fnv1a64_vectors,
    test_forward_loss_matches_reference, test_gradient_check,
    test_grad_ready_order_and_final, test_sgd_decreases_loss,
    test_sharding_invariant, test_accumulation_equivalence,
    test_evaluate_chunks)

Suite *suite_digits(void);

UNIT_SUITE(digits, "core", 0, test_digits_parse_ok, test_digits_parse_errors,
    test_digits_load_errors, test_digits_shuffle_split_order)
