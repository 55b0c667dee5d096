/*
 * train_digits.c - data-parallel training of a small MLP on the digits data
 * set with libcohort and its strategies (strategies/): the main job of
 * `make demo`.
 *
 * --strategy picks how the ranks cooperate (docs/strategies.md):
 *
 *   ddp    (default) every rank is a process of a cohort job (rank and
 *          world size from the environment: cohort run, torchrun, Open
 *          MPI, SLURM, ...); cohort_ddp broadcasts rank 0's initial
 *          parameters, reduces the gradients in buckets as backward
 *          produces them (--bucket-cap, --hook none|fp16|bf16) and skips
 *          communication on the first K-1 micro-steps of --accum K
 *          (no_sync).
 *   hvd    the same processes; Horovod-style negotiated, fused named
 *          all-reduces of the gradients (backward_passes_per_step = K).
 *   spawn  this program starts --ranks N worker processes itself
 *          (cohort_spawn, with a private coordinator); they train with
 *          ddp and rank 0's results come back to the parent, which
 *          prints the final lines.
 *   dp     one process, --ranks N model replicas on N threads
 *          (cohort_dp): each global batch is split over the replicas,
 *          gradients are summed on replica 0, which steps and copies its
 *          parameters back. No coordinator.
 *
 * Each optimizer step covers one global batch (--batch, split evenly over
 * the ranks, see examples/lib/digits.h) times --accum; every rank applies
 * the same update and the parameters stay identical: the final checksums
 * prove it. Metrics are summed over all ranks' shards.
 *
 * --local runs one process without any cohort call: the baseline that a
 * data-parallel run with the same --batch must match.
 */
#include <errno.h>
#include <getopt.h>
#include <inttypes.h>
#include <math.h>
#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort/cohort.h"
#include "ddp.h"
#include "digits.h"
#include "dp.h"
#include "freeall.h"
#include "hvd.h"
#include "mlp.h"
#include "mlp_strategies.h"
#include "spawn.h"

#define PROG "train_digits"
#define HIDDEN 128
#define DATA_SEED 1797 /* fixed train/test split */
#define REPORT_TIMEOUT_MS 5000
#define MAX_RANKS 256 /* --ranks: cohort_spawn's and cohort_dp's limit */

enum strategy { STRAT_DDP, STRAT_SPAWN, STRAT_DP, STRAT_HVD };

static const char *const strategy_names[] = { "ddp", "spawn", "dp", "hvd" };

struct opts {
	int epochs;
	long batch; /* global batch of one micro-step, all ranks together */
	float lr;
	float momentum;
	uint64_t seed;
	int accum; /* micro-steps per optimizer step (no sync between) */
	const char *data;
	const char *svg;
	const char *save; /* final parameters, raw float32 (rank 0) */
	bool quiet;
	bool local;
	enum strategy strategy;
	const char *hook; /* ddp comm hook: none, fp16, bf16 */
	size_t bucket_cap; /* ddp bucket cap, bytes; 0 = the default */
	int ranks; /* spawn: workers; dp: replicas */
	bool elastic; /* --elastic (also when COHORT_MIN_WORLD is set) */
	long pace_ms; /* --pace: each step takes at least this long */
	bool log_steps; /* --log-steps: rank 0 prints every commit */
};

struct epoch_stats {
	double train_loss, train_acc, test_loss, test_acc;
	double samples; /* trained on, all ranks */
	double seconds, samples_per_s;
};

struct trainer {
	struct opts o;
	cohort_client *c; /* NULL with --local */
	cohort_group *g;
	int rank, world;
	struct mlp m;
	struct digits train, test;
	size_t *perm, *idx;
	float *bx;
	uint8_t *by;
	struct epoch_stats *hist;
	bool tty;
	/* The strategy's state (at most one is set). */
	cohort_ddp *ddp; /* ddp, and spawn's workers */
	cohort_hvd *hvd;
	cohort_dp *dp;
	struct mlp *reps; /* dp: the replicas; reps[0] is m */
	cohort_dp_replica *rd;
	double *rep_loss; /* dp: per-replica metrics of an epoch */
	size_t *rep_correct;
	cohort_spawn_ctx *spawn; /* in a spawn worker */
	int nrep; /* dp: replicas */
};

/* What a spawn worker of rank 0 returns to the parent: this header, then
 * hist[epochs], checksums[world] (uint64_t), params[n_params] (float). */
struct spawn_report {
	int32_t world;
	int32_t equal;
	uint64_t n_params;
	double seconds;
	double samples_per_s;
	char backend[32];
};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
}

/* A rank that stops because another rank was lost exits
 * COHORT_EXIT_PEER_LOST (cohort.h), told apart from its own failure. */
#define EXIT_PEER_LOST COHORT_EXIT_PEER_LOST

/* A fatal error: tell the other ranks (through cohortd, with ddp by
 * cohort_ddp_on_exception) why this one stops, then exit with code. */
static void
vdie(struct trainer *t, int code, const char *fmt, va_list ap)
{
	char text[768];

	vsnprintf(text, sizeof(text), fmt, ap);
	if (t->tty)
		fputc('\n', stdout);
	fflush(stdout);
	fprintf(stderr, PROG ": rank %d: %s\n", t->rank, text);
	if (t->ddp != NULL) {
		cohort_status st = cohort_ddp_on_exception(t->ddp, text);

		if (st != COHORT_OK)
			fprintf(stderr,
			    PROG ": rank %d: cohort_ddp_on_exception: %s\n",
			    t->rank, cohort_status_name(st));
	} else if (t->c != NULL) {
		cohort_status st;

		st = cohort_report_failure(t->c, text, REPORT_TIMEOUT_MS);
		if (st != COHORT_OK)
			fprintf(stderr,
			    PROG ": rank %d: cohort_report_failure: %s\n",
			    t->rank, cohort_status_name(st));
	}
	/* The process ends here: the OS closes the sockets (freeing the
	 * strategies' state would wait for peers that may be gone). */
	exit(code);
}

/* vdie with exit status 1: this rank's own failure. */
static void
die(struct trainer *t, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vdie(t, 1, fmt, ap);
	va_end(ap);
}

static void
die_code(struct trainer *t, int code, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vdie(t, code, fmt, ap);
	va_end(ap);
}

/* Dies on a cohort error, naming the call, the status and its detail. */
static void
check(struct trainer *t, cohort_status st, const char *what)
{
	const char *detail = "";

	if (st == COHORT_OK)
		return;
	if (t->ddp != NULL)
		detail = cohort_ddp_last_error(t->ddp);
	else if (t->hvd != NULL)
		detail = cohort_hvd_last_error(t->hvd);
	else if (t->dp != NULL)
		detail = cohort_dp_last_error(t->dp);
	if ((detail == NULL || detail[0] == '\0') && t->g != NULL)
		detail = cohort_group_last_error(t->g);
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_last_error();
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_strerror(st);
	die_code(t, st == COHORT_EPEERLOST ? EXIT_PEER_LOST : 1, "%s: %s: %s",
	    what, cohort_status_name(st), detail);
}

/* Sums metrics over the ranks (no-op alone). */
static void
reduce_metrics(struct trainer *t, double *v, size_t n)
{
	if (t->g == NULL)
		return;
	check(t,
	    cohort_reduce_scalars(
	        t->g, COHORT_F64, COHORT_SUM, v, n, COHORT_WAIT_DEFAULT),
	    "cohort_reduce_scalars(metrics)");
}

/* ------------------------------------------------------------------ */
/* Training                                                             */
/* ------------------------------------------------------------------ */

/* dp: forward and backward of replica k's chunk [begin, end) of the
 * gathered global batch (on replica k's thread). */
static int
dp_forward_backward(
    void *model, int k, size_t begin, size_t end, float scale, void *arg)
{
	struct trainer *t = arg;
	struct mlp *m = model;
	const float *x = t->bx + begin * DIGITS_FEATURES;
	const uint8_t *y = t->by + begin;
	size_t n = end - begin;

	if (mlp_forward(m, x, y, n, &t->rep_loss[k], &t->rep_correct[k]) != 0)
		return (-1);
	/* scale = 1 / global batch; accumulation divides again by K. */
	mlp_backward(m, x, y, n, scale / (float)t->o.accum);
	return (0);
}

static int
dp_sgd_step(void *model, void *arg)
{
	const struct trainer *t = arg;

	return (mlp_sgd_step(model, t->o.lr, t->o.momentum));
}

/* One micro-step (a global batch of G samples, this rank's shard) of
 * forward and backward; the strategy's hooks run during backward. */
static void
micro_step(struct trainer *t, size_t first, size_t G, size_t *count,
    double *loss, size_t *correct)
{
	size_t n;

	if (t->dp != NULL) {
		/* Every replica's chunk of the whole global batch. */
		n = digits_shard(t->perm, first, G, 0, 1, t->idx);
		digits_gather(&t->train, t->idx, n, t->bx, t->by);
		check(t,
		    cohort_dp_forward_backward(
		        t->dp, n, dp_forward_backward, t),
		    "cohort_dp_forward_backward");
		*count += n;
		return;
	}
	n = digits_shard(t->perm, first, G, t->rank, t->world, t->idx);
	digits_gather(&t->train, t->idx, n, t->bx, t->by);
	if (mlp_forward(&t->m, t->bx, t->by, n, loss, correct) != 0)
		die(t, "forward: %s", strerror(errno));
	/* The gradient of this rank's mean loss; DDP averages those over
	 * the ranks. An elastic job's global batch need not divide by every
	 * world size it passes through: then each sample counts world / G,
	 * so the average over the ranks is still the global batch's mean. */
	if (G % (size_t)t->world == 0)
		mlp_backward(&t->m, t->bx, t->by, n,
		    1.0f / (float)(n * (size_t)t->o.accum));
	else
		mlp_backward(&t->m, t->bx, t->by, n,
		    (float)t->world / (float)(G * (size_t)t->o.accum));
	*count += n;
}

static void
sgd_step(struct trainer *t)
{
	if (mlp_sgd_step(&t->m, t->o.lr, t->o.momentum) != 0)
		die(t, "sgd step: %s", strerror(errno));
	mlp_zero_grad(&t->m);
}

/* One optimizer step of K micro-steps through the strategy. */
static void
train_step(
    struct trainer *t, size_t s, double *loss, size_t *correct, size_t *count)
{
	const size_t G = (size_t)t->o.batch;
	const size_t K = (size_t)t->o.accum;

	if (t->ddp != NULL) {
		for (size_t k = 0; k < K; k++) {
			/* block_backward_sync: only the last micro-step's
			 * backward communicates. */
			if (k + 1 < K)
				cohort_ddp_no_sync_begin(t->ddp);
			else
				cohort_ddp_no_sync_end(t->ddp);
			micro_step(
			    t, (s * K + k) * G, G, count, loss, correct);
		}
		check(t, cohort_ddp_sync(t->ddp), "cohort_ddp_sync");
		sgd_step(t);
		check(
		    t, cohort_ddp_after_step(t->ddp), "cohort_ddp_after_step");
	} else if (t->hvd != NULL) {
		for (size_t k = 0; k < K; k++) {
			bool do_step;

			micro_step(
			    t, (s * K + k) * G, G, count, loss, correct);
			check(t, cohort_hvd_step_sync(t->hvd, &do_step),
			    "cohort_hvd_step_sync");
			if (do_step)
				sgd_step(t);
		}
	} else if (t->dp != NULL) {
		for (size_t k = 0; k < K; k++)
			micro_step(
			    t, (s * K + k) * G, G, count, loss, correct);
		check(t, cohort_dp_step(t->dp, dp_sgd_step, t),
		    "cohort_dp_step");
	} else {
		/* --local */
		for (size_t k = 0; k < K; k++)
			micro_step(
			    t, (s * K + k) * G, G, count, loss, correct);
		sgd_step(t);
	}
}

static void
train_epoch(struct trainer *t, int epoch, struct epoch_stats *es)
{
	const size_t G = (size_t)t->o.batch;
	const size_t K = (size_t)t->o.accum;
	const size_t steps = digits_num_batches(t->train.n, G * K, 1);
	/* metrics: train loss sum, correct, count; test the same */
	double v[6] = { 0 };
	size_t correct = 0, count = 0;
	double t0, t1;

	for (int k = 0; k < t->nrep; k++) {
		t->rep_loss[k] = 0.0;
		t->rep_correct[k] = 0;
	}
	digits_epoch_order(t->perm, t->train.n, t->o.seed, (uint64_t)epoch);
	t0 = now_s();
	for (size_t s = 0; s < steps; s++)
		train_step(t, s, &v[0], &correct, &count);
	t1 = now_s();
	for (int k = 0; k < t->nrep; k++) {
		v[0] += t->rep_loss[k];
		correct += t->rep_correct[k];
	}

	/* Test set: rank r evaluates samples r, r + world, ... (dp: replica
	 * 0 all of them) */
	{
		size_t n = digits_shard(
		    NULL, 0, t->test.n, t->rank, t->world, t->idx);
		size_t tc = 0;

		digits_gather(&t->test, t->idx, n, t->bx, t->by);
		if (mlp_evaluate(&t->m, t->bx, t->by, n, &v[3], &tc) != 0)
			die(t, "evaluate: %s", strerror(errno));
		v[4] = (double)tc;
		v[5] = (double)n;
	}
	v[1] = (double)correct;
	v[2] = (double)count;
	reduce_metrics(t, v, 6);

	es->train_loss = v[2] > 0 ? v[0] / v[2] : 0.0;
	es->train_acc = v[2] > 0 ? v[1] / v[2] : 0.0;
	es->test_loss = v[5] > 0 ? v[3] / v[5] : 0.0;
	es->test_acc = v[5] > 0 ? v[4] / v[5] : 0.0;
	es->samples = v[2];
	es->seconds = t1 - t0;
	es->samples_per_s = t1 > t0 ? v[2] / (t1 - t0) : 0.0;
}

static void
print_epoch(const struct trainer *t, int epoch, const struct epoch_stats *es)
{
	char line[160];

	snprintf(line, sizeof(line),
	    "epoch %3d/%d  loss %.4f  train acc %.4f  test acc %.4f  "
	    "%8.0f samples/s",
	    epoch + 1, t->o.epochs, es->train_loss, es->train_acc,
	    es->test_acc, es->samples_per_s);
	if (t->tty)
		printf("\r%s", line);
	else
		printf("%s\n", line);
	fflush(stdout);
}

/* ------------------------------------------------------------------ */
/* SVG curves                                                           */
/* ------------------------------------------------------------------ */

/* The smallest of 1, 2, 2.5, 5 x 10^k that is >= v. */
static double
nice_ceil(double v)
{
	double e, f;

	if (!(v > 0.0))
		return (1.0);
	e = pow(10.0, floor(log10(v)));
	f = v / e;
	if (f <= 1.0)
		return (e);
	if (f <= 2.0)
		return (2.0 * e);
	if (f <= 2.5)
		return (2.5 * e);
	if (f <= 5.0)
		return (5.0 * e);
	return (10.0 * e);
}

static void
svg_polyline(FILE *f, const struct epoch_stats *h, int n, size_t field,
    double ymax, double x0, double y0, double w, double ht, const char *color,
    const char *dash)
{
	fprintf(f,
	    "<polyline fill=\"none\" stroke=\"%s\" "
	    "stroke-width=\"2\"%s%s%s points=\"",
	    color, dash[0] ? " stroke-dasharray=\"" : "", dash,
	    dash[0] ? "\"" : "");
	for (int i = 0; i < n; i++) {
		double val = *(const double *)((const char *)&h[i] + field);
		double x = n > 1 ? x0 + w * i / (n - 1) : x0 + w / 2;
		double y = y0 + ht - ht * (val > ymax ? 1.0 : val / ymax);

		fprintf(f, "%s%.1f,%.1f", i ? " " : "", x, y);
	}
	fprintf(f, "\"/>\n");
}

/* Loss (left axis) and accuracies (right axis) per epoch, self-contained:
 * no scripts, fonts or external references. */
static int
write_svg(const struct trainer *t, const char *path)
{
	const double W = 720, H = 440, L = 70, R = 70, T = 50, B = 60;
	const double pw = W - L - R, ph = H - T - B;
	const int n = t->o.epochs;
	double lmax = 0.0, ltick;
	int xstep;
	FILE *f;

	for (int i = 0; i < n; i++) {
		if (t->hist[i].train_loss > lmax)
			lmax = t->hist[i].train_loss;
		if (t->hist[i].test_loss > lmax)
			lmax = t->hist[i].test_loss;
	}
	lmax = nice_ceil(lmax);
	ltick = lmax / 5.0;
	xstep = n <= 10 ? 1 : (int)nice_ceil((double)n / 10.0);
	if (xstep < 1)
		xstep = 1;

	if ((f = fopen(path, "w")) == NULL)
		return (-1);
	fprintf(f,
	    "<?xml version=\"1.0\" encoding=\"UTF-8\"?>\n"
	    "<svg xmlns=\"http://www.w3.org/2000/svg\" width=\"%.0f\" "
	    "height=\"%.0f\" viewBox=\"0 0 %.0f %.0f\" "
	    "font-family=\"sans-serif\" font-size=\"12\">\n"
	    "<rect width=\"100%%\" height=\"100%%\" fill=\"white\"/>\n",
	    W, H, W, H);
	fprintf(f,
	    "<text x=\"%.0f\" y=\"24\" text-anchor=\"middle\" "
	    "font-size=\"15\">train_digits: %s, %d %s%s, batch %ld, lr %g, "
	    "final test accuracy %.4f</text>\n",
	    W / 2, t->o.local ? "local" : strategy_names[t->o.strategy],
	    t->dp != NULL ? t->nrep : t->world,
	    t->dp != NULL ? "replica" : "rank",
	    (t->dp != NULL ? t->nrep : t->world) == 1 ? "" : "s",
	    t->o.batch * t->o.accum, (double)t->o.lr,
	    n > 0 ? t->hist[n - 1].test_acc : 0.0);

	/* Grid and ticks. */
	for (int i = 0; i <= 5; i++) {
		double y = T + ph - ph * i / 5.0;

		fprintf(f,
		    "<line x1=\"%.0f\" y1=\"%.1f\" x2=\"%.0f\" y2=\"%.1f\" "
		    "stroke=\"#e0e0e0\"/>\n"
		    "<text x=\"%.0f\" y=\"%.1f\" text-anchor=\"end\">%g"
		    "</text>\n"
		    "<text x=\"%.0f\" y=\"%.1f\">%.1f</text>\n",
		    L, y, L + pw, y, L - 6, y + 4, ltick * i, L + pw + 6,
		    y + 4, i / 5.0);
	}
	for (int e = 1; e <= n; e++) {
		double x = n > 1 ? L + pw * (e - 1) / (n - 1) : L + pw / 2;

		if (e != 1 && e % xstep != 0)
			continue;
		fprintf(f,
		    "<line x1=\"%.1f\" y1=\"%.0f\" x2=\"%.1f\" y2=\"%.0f\" "
		    "stroke=\"black\"/>\n"
		    "<text x=\"%.1f\" y=\"%.0f\" text-anchor=\"middle\">%d"
		    "</text>\n",
		    x, T + ph, x, T + ph + 5, x, T + ph + 20, e);
	}
	/* Axes and labels. */
	fprintf(f,
	    "<path d=\"M%.0f %.0f V%.0f H%.0f V%.0f\" fill=\"none\" "
	    "stroke=\"black\"/>\n"
	    "<text x=\"%.0f\" y=\"%.0f\" text-anchor=\"middle\">epoch</text>\n"
	    "<text transform=\"translate(18 %.0f) rotate(-90)\" "
	    "text-anchor=\"middle\">loss (cross-entropy)</text>\n"
	    "<text transform=\"translate(%.0f %.0f) rotate(90)\" "
	    "text-anchor=\"middle\">accuracy</text>\n",
	    L, T, T + ph, L + pw, T, L + pw / 2, H - 18, T + ph / 2, W - 18,
	    T + ph / 2);

	svg_polyline(f, t->hist, n, offsetof(struct epoch_stats, train_loss),
	    lmax, L, T, pw, ph, "#1f77b4", "");
	svg_polyline(f, t->hist, n, offsetof(struct epoch_stats, test_loss),
	    lmax, L, T, pw, ph, "#1f77b4", "2 3");
	svg_polyline(f, t->hist, n, offsetof(struct epoch_stats, train_acc),
	    1.0, L, T, pw, ph, "#ff7f0e", "6 4");
	svg_polyline(f, t->hist, n, offsetof(struct epoch_stats, test_acc),
	    1.0, L, T, pw, ph, "#2ca02c", "");

	/* Legend (middle right, where the curves have flattened). */
	{
		static const struct {
			const char *label, *color, *dash;
		} items[] = {
			{ "train loss (left)", "#1f77b4", "" },
			{ "test loss (left)", "#1f77b4", "2 3" },
			{ "train accuracy (right)", "#ff7f0e", "6 4" },
			{ "test accuracy (right)", "#2ca02c", "" },
		};
		double lx = L + pw - 190, ly = T + ph / 2 - 40;

		fprintf(f,
		    "<rect x=\"%.0f\" y=\"%.0f\" width=\"180\" height=\"84\" "
		    "fill=\"white\" stroke=\"#999\"/>\n",
		    lx, ly);
		for (size_t i = 0; i < sizeof(items) / sizeof(items[0]); i++) {
			double y = ly + 18 + 19.0 * (double)i;

			fprintf(f,
			    "<line x1=\"%.0f\" y1=\"%.0f\" x2=\"%.0f\" "
			    "y2=\"%.0f\" stroke=\"%s\" stroke-width=\"2\""
			    "%s%s%s/>\n"
			    "<text x=\"%.0f\" y=\"%.0f\">%s</text>\n",
			    lx + 8, y - 4, lx + 36, y - 4, items[i].color,
			    items[i].dash[0] ? " stroke-dasharray=\"" : "",
			    items[i].dash, items[i].dash[0] ? "\"" : "",
			    lx + 44, y, items[i].label);
		}
	}
	fprintf(f, "</svg>\n");
	if (fclose(f) != 0)
		return (-1);
	return (0);
}

/* ------------------------------------------------------------------ */
/* Setup and options                                                    */
/* ------------------------------------------------------------------ */

static void
usage(FILE *f)
{
	fprintf(f,
	    "usage: " PROG " [options]\n"
	    "Trains a 64-128-10 MLP on the digits data set, data-parallel\n"
	    "over the ranks of a cohort job (rank and world size from the\n"
	    "environment: COHORT_*, torchrun, Open MPI, SLURM).\n"
	    "  --epochs N     epochs (default 30)\n"
	    "  --batch N      global batch per step, all ranks together;\n"
	    "                 divisible by the world size (default 64)\n"
	    "  --lr X         learning rate (default 0.05)\n"
	    "  --momentum X   SGD momentum (default 0.9)\n"
	    "  --seed N       parameter init and data order (default 1)\n"
	    "  --accum K      gradient accumulation: K micro-batches per\n"
	    "                 optimizer step, gradients synced once\n"
	    "                 (default 1)\n"
	    "  --data PATH    digits CSV (default build/data/digits.csv)\n"
	    "  --svg PATH     write loss/accuracy curves as SVG (rank 0)\n"
	    "  --save PATH    write the final parameters as raw float32\n"
	    "                 (native byte order; rank 0)\n"
	    "  --quiet        only the final lines\n"
	    "  --local        one process, no cohort calls (the baseline)\n"
	    "  --strategy S   ddp (default), hvd: the ranks of a cohort\n"
	    "                 job; spawn: start --ranks workers (ddp)\n"
	    "                 here; dp: --ranks replicas in this process\n"
	    "  --ranks N      workers (spawn) or replicas (dp), default 4\n"
	    "  --hook H       ddp comm hook: none (default), fp16, bf16\n"
	    "  --bucket-cap B ddp gradient bucket cap in bytes (default\n"
	    "                 25 MiB, the first bucket 1 MiB)\n"
	    "  --elastic      the elastic loop (docs/elastic.md; also when\n"
	    "                 the job is elastic: cohort run --nnodes\n"
	    "                 MIN:MAX): a commit boundary per step, a lost\n"
	    "                 rank's step repeated by the survivors, new\n"
	    "                 ranks given the state by a healthy one\n"
	    "  --pace MS      each step takes at least MS ms (fault drills)\n"
	    "  --log-steps    rank 0 prints every committed step\n");
}

static bool
parse_long(const char *s, long min, long max, long *out)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max)
		return (false);
	*out = v;
	return (true);
}

static bool
parse_float(const char *s, double min, double max, float *out)
{
	char *end;
	double v;

	errno = 0;
	v = strtod(s, &end);
	if (errno != 0 || end == s || *end != '\0' || !(v >= min)
	    || !(v <= max))
		return (false);
	*out = (float)v;
	return (true);
}

static void
parse_args(int argc, char **argv, struct opts *o)
{
	static const struct option longopts[] = {
		{ "epochs", required_argument, NULL, 'e' },
		{ "batch", required_argument, NULL, 'b' },
		{ "lr", required_argument, NULL, 'l' },
		{ "momentum", required_argument, NULL, 'm' },
		{ "seed", required_argument, NULL, 's' },
		{ "accum", required_argument, NULL, 'a' },
		{ "data", required_argument, NULL, 'd' },
		{ "svg", required_argument, NULL, 'g' },
		{ "save", required_argument, NULL, 'S' },
		{ "quiet", no_argument, NULL, 'q' },
		{ "local", no_argument, NULL, 'L' },
		{ "strategy", required_argument, NULL, 'T' },
		{ "ranks", required_argument, NULL, 'n' },
		{ "hook", required_argument, NULL, 'H' },
		{ "bucket-cap", required_argument, NULL, 'B' },
		{ "elastic", no_argument, NULL, 'E' },
		{ "pace", required_argument, NULL, 'P' },
		{ "log-steps", no_argument, NULL, 'G' },
		{ "help", no_argument, NULL, 'h' },
		{ NULL, 0, NULL, 0 },
	};
	long v;
	int ch, li = 0;

	o->epochs = 30;
	o->batch = 64;
	o->lr = 0.05f;
	o->momentum = 0.9f;
	o->seed = 1;
	o->accum = 1;
	o->data = "build/data/digits.csv";
	o->svg = NULL;
	o->save = NULL;
	o->quiet = false;
	o->local = false;
	o->strategy = STRAT_DDP;
	o->hook = "none";
	o->bucket_cap = 0;
	o->ranks = 4;

	while ((ch = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
		bool ok = true;

		switch (ch) {
		case 'e':
			ok = parse_long(optarg, 1, 100000, &v);
			o->epochs = (int)v;
			break;
		case 'b':
			ok = parse_long(optarg, 1, 1 << 20, &v);
			o->batch = v;
			break;
		case 'l':
			ok = parse_float(optarg, 0.0, 100.0, &o->lr);
			break;
		case 'm':
			ok = parse_float(optarg, 0.0, 0.999999, &o->momentum);
			break;
		case 's':
			ok = parse_long(optarg, 0, INT32_MAX, &v);
			o->seed = (uint64_t)v;
			break;
		case 'a':
			ok = parse_long(optarg, 1, 1 << 16, &v);
			o->accum = (int)v;
			break;
		case 'd':
			o->data = optarg;
			break;
		case 'g':
			o->svg = optarg;
			break;
		case 'S':
			o->save = optarg;
			break;
		case 'q':
			o->quiet = true;
			break;
		case 'L':
			o->local = true;
			break;
		case 'T':
			ok = false;
			for (int i = 0; i < 4; i++)
				if (strcmp(optarg, strategy_names[i]) == 0) {
					o->strategy = (enum strategy)i;
					ok = true;
				}
			break;
		case 'n':
			ok = parse_long(optarg, 1, MAX_RANKS, &v);
			o->ranks = (int)v;
			break;
		case 'H':
			o->hook = optarg;
			ok = cohort_ddp_hook_by_name(optarg) != NULL;
			break;
		case 'B':
			ok = parse_long(optarg, 4, 1L << 30, &v);
			o->bucket_cap = (size_t)v;
			break;
		case 'E':
			o->elastic = true;
			break;
		case 'P':
			ok = parse_long(optarg, 0, 600000, &o->pace_ms);
			break;
		case 'G':
			o->log_steps = true;
			break;
		case 'h':
			usage(stdout);
			exit(0);
		default:
			usage(stderr);
			exit(2);
		}
		if (!ok) {
			fprintf(stderr,
			    PROG ": invalid value for --%s: '%s'\n",
			    longopts[li].name, optarg);
			exit(2);
		}
	}
	if (optind < argc) {
		fprintf(
		    stderr, PROG ": unexpected argument '%s'\n", argv[optind]);
		usage(stderr);
		exit(2);
	}
}

/* DDP over t->g with --hook and --bucket-cap; broadcast: rank 0's
 * parameters are broadcast, every rank starts from them whatever it
 * initialised itself. */
static void
setup_ddp(struct trainer *t, bool broadcast)
{
	cohort_ddp_options dopt;
	cohort_ddp_param p[MLP_NPARAMS];

	cohort_ddp_options_init(&dopt);
	dopt.hook = cohort_ddp_hook_by_name(t->o.hook);
	dopt.broadcast_params = broadcast;
	if (t->o.bucket_cap > 0) {
		dopt.bucket_cap_bytes = t->o.bucket_cap;
		if (dopt.first_bucket_cap_bytes > t->o.bucket_cap)
			dopt.first_bucket_cap_bytes = t->o.bucket_cap;
	}
	mlp_ddp_params(&t->m, p);
	check(t, cohort_ddp_new(t->c, t->g, p, MLP_NPARAMS, &dopt, &t->ddp),
	    "cohort_ddp_new");
	mlp_set_grad_ready(&t->m, mlp_ddp_grad_ready, t->ddp);
}

static void
setup_hvd(struct trainer *t)
{
	cohort_hvd_options hopt;
	cohort_ddp_param p[MLP_NPARAMS];

	cohort_hvd_options_init(&hopt);
	hopt.backward_passes_per_step = t->o.accum;
	check(t, cohort_hvd_new(t->c, &hopt, &t->hvd), "cohort_hvd_new");
	mlp_ddp_params(&t->m, p);
	check(t, cohort_hvd_register_params(t->hvd, p, MLP_NPARAMS),
	    "cohort_hvd_register_params");
	check(t, cohort_hvd_broadcast_parameters(t->hvd, 0),
	    "cohort_hvd_broadcast_parameters");
	mlp_set_grad_ready(&t->m, mlp_hvd_grad_ready, t->hvd);
}

static void
setup_dp(struct trainer *t)
{
	const int K = t->o.ranks;

	t->nrep = K;
	t->reps = calloc((size_t)K, sizeof(*t->reps));
	t->rd = calloc((size_t)K, sizeof(*t->rd));
	t->rep_loss = calloc((size_t)K, sizeof(*t->rep_loss));
	t->rep_correct = calloc((size_t)K, sizeof(*t->rep_correct));
	if (t->reps == NULL || t->rd == NULL || t->rep_loss == NULL
	    || t->rep_correct == NULL)
		die(t, "out of memory");
	/* Replica 0 is the trainer's model; the others start anywhere:
	 * cohort_dp_new copies replica 0's parameters to them. */
	for (int k = 0; k < K; k++) {
		struct mlp *m = &t->m;

		if (k > 0) {
			m = &t->reps[k];
			if (mlp_init(m, DIGITS_FEATURES, HIDDEN,
			        DIGITS_CLASSES, t->o.seed + (uint64_t)k)
			    != 0)
				die(t, "mlp_init: %s", strerror(errno));
		}
		t->rd[k].model = m;
		t->rd[k].params = m->params;
		t->rd[k].grads = m->grads;
	}
	check(t, cohort_dp_new(t->rd, K, t->m.n_params, &t->dp),
	    "cohort_dp_new");
}

/* The number of ranks (dp: replicas) the work is spread over. */
static int
nranks(const struct trainer *t)
{
	return (t->dp != NULL ? t->nrep : t->world);
}

static const char *
strategy_label(const struct trainer *t)
{
	return (t->o.local ? "local" : strategy_names[t->o.strategy]);
}

/* c: an open client (a spawn worker's), or NULL to open one from the
 * environment (ddp, hvd) or none (--local, dp). */
static void setup_model(struct trainer *t);
static void print_setup(struct trainer *t);

static void
setup(struct trainer *t, cohort_client *c)
{
	bool job = !t->o.local && t->o.strategy != STRAT_DP;

	if (job) {
		if (c != NULL)
			t->c = c;
		else
			check(t,
			    /* COHORT_JOIN_TIMEOUT_MS (default 30 min): a pod
			     * may stay pending longer than any fixed guess */
			    cohort_client_open_env(&t->c, COHORT_WAIT_DEFAULT),
			    "cohort_client_open_env");
		t->g = cohort_client_world(t->c);
		t->rank = cohort_client_rank(t->c);
		t->world = cohort_client_world_size(t->c);
	}
	if (t->o.batch % t->world != 0)
		die(t, "--batch %ld is not divisible by the world size %d",
		    t->o.batch, t->world);
	setup_model(t);
	if (t->o.local)
		(void)0; /* the baseline: no strategy */
	else if (t->o.strategy == STRAT_HVD)
		setup_hvd(t);
	else if (t->o.strategy == STRAT_DP)
		setup_dp(t);
	else
		setup_ddp(t, true); /* ddp, and the workers of spawn */
	print_setup(t);
}

/* The data (train/test split, batch buffers) and the model. */
static void
setup_model(struct trainer *t)
{
	struct digits all;
	char err[512];
	size_t cap;

	if (digits_load(t->o.data, &all, err, sizeof(err)) != 0)
		die(t,
		    "cannot load the data set: %s (run "
		    "tools/fetch-digits.sh)",
		    err);
	if (all.n <= DIGITS_TEST_SAMPLES + (size_t)t->o.batch)
		die(t, "%s: only %zu samples", t->o.data, all.n);
	digits_shuffle(&all, DATA_SEED);
	if (digits_split(&all, DIGITS_TEST_SAMPLES, &t->train, &t->test) != 0)
		die(t, "out of memory");
	digits_free(&all);
	if (digits_num_batches(t->train.n, (size_t)t->o.batch * t->o.accum, 1)
	    == 0)
		die(t, "--batch x --accum exceeds the %zu training samples",
		    t->train.n);

	cap = t->train.n > t->test.n ? t->train.n : t->test.n;
	t->perm = calloc(t->train.n, sizeof(size_t));
	t->idx = calloc(cap, sizeof(size_t));
	t->bx = calloc(cap * DIGITS_FEATURES, sizeof(float));
	t->by = calloc(cap, 1);
	t->hist = calloc((size_t)t->o.epochs, sizeof(*t->hist));
	if (t->perm == NULL || t->idx == NULL || t->bx == NULL || t->by == NULL
	    || t->hist == NULL)
		die(t, "out of memory");

	if (mlp_init(&t->m, DIGITS_FEATURES, HIDDEN, DIGITS_CLASSES, t->o.seed)
	    != 0)
		die(t, "mlp_init: %s", strerror(errno));
}

/* Rank 0's first lines. */
static void
print_setup(struct trainer *t)
{
	if (t->rank == 0 && !t->o.quiet) {
		printf(PROG ": %s, %d %s%s%s%s, %zu train / %zu test "
		            "samples, %zu parameters (checksum %016" PRIx64
		            ")\n",
		    strategy_label(t), nranks(t),
		    t->dp != NULL ? "replica" : "rank",
		    nranks(t) == 1 ? "" : "s",
		    t->g != NULL ? ", backend " : "",
		    t->g != NULL ? cohort_group_backend(t->g) : "", t->train.n,
		    t->test.n, t->m.n_params, mlp_checksum(&t->m));
		printf(PROG ": batch %ld (%ld per rank) x accum %d, lr %g, "
		            "momentum %g, seed %" PRIu64 ", %d epochs\n",
		    t->o.batch, t->o.batch / nranks(t), t->o.accum,
		    (double)t->o.lr, (double)t->o.momentum, t->o.seed,
		    t->o.epochs);
		if (t->ddp != NULL) {
			cohort_ddp_stats ds;

			cohort_ddp_get_stats(t->ddp, &ds);
			printf(PROG ": ddp: %d bucket%s, hook %s\n",
			    ds.nbuckets, ds.nbuckets == 1 ? "" : "s",
			    t->o.hook);
		}
		fflush(stdout);
	}
}

/* The parameters as raw float32: what an equivalence check compares
 * (a data-parallel run against --local with the same global batch). */
static int
save_params(const struct trainer *t, const char *path)
{
	FILE *f = fopen(path, "wb");
	size_t n;

	if (f == NULL)
		return (-1);
	n = fwrite(t->m.params, sizeof(float), t->m.n_params, f);
	if (fclose(f) != 0 || n != t->m.n_params)
		return (-1);
	return (0);
}

/* Every rank's (dp: replica's) parameter checksum into all[nranks]. */
static void
gather_checksums(struct trainer *t, uint64_t *all)
{
	if (t->dp != NULL) {
		all[0] = mlp_checksum(&t->m);
		for (int k = 1; k < t->nrep; k++)
			all[k] = mlp_checksum(&t->reps[k]);
	} else if (t->g != NULL) {
		uint64_t mine = mlp_checksum(&t->m);

		check(t,
		    cohort_allgather(t->g, &mine, all, 1, COHORT_I64, NULL,
		        COHORT_WAIT_DEFAULT),
		    "cohort_allgather(checksums)");
	} else
		all[0] = mlp_checksum(&t->m);
}

/* Prints the checksums; returns true if all equal. */
static bool
print_checksums(const uint64_t *all, int n)
{
	bool equal = true;

	printf("parameter checksums:");
	for (int r = 0; r < n; r++) {
		printf(" %d:%016" PRIx64, r, all[r]);
		if (all[r] != all[0])
			equal = false;
	}
	printf("\nall equal: %s\n", equal ? "yes" : "no");
	return (equal);
}

/* The final lines of rank 0 (or of spawn's parent): accuracy, speed,
 * the curves and the saved parameters. */
static void
print_final(struct trainer *t, int n, double secs, double sps)
{
	const struct epoch_stats *last = &t->hist[t->o.epochs - 1];

	printf("final: test accuracy %.4f (loss %.4f), train accuracy %.4f, "
	       "%s, %d %s%s, %.2f s, %.0f samples/s\n",
	    last->test_acc, last->test_loss, last->train_acc,
	    strategy_label(t), n, t->dp != NULL ? "replica" : "rank",
	    n == 1 ? "" : "s", secs, sps);
	if (t->o.svg != NULL) {
		if (write_svg(t, t->o.svg) != 0)
			die(t, "cannot write %s: %s", t->o.svg,
			    strerror(errno));
		printf("curves: %s\n", t->o.svg);
	}
	if (t->o.save != NULL && save_params(t, t->o.save) != 0)
		die(t, "cannot write %s: %s", t->o.save, strerror(errno));
}

/* Trains every epoch; *secs: wall time, *sps: samples per second of
 * training (all ranks). */
static void
run_training(struct trainer *t, double *secs, double *sps)
{
	double start, samples = 0.0, train_secs = 0.0;

	t->tty = t->rank == 0 && !t->o.quiet && isatty(STDOUT_FILENO);
	start = now_s();
	for (int e = 0; e < t->o.epochs; e++) {
		train_epoch(t, e, &t->hist[e]);
		samples += t->hist[e].samples;
		train_secs += t->hist[e].seconds;
		if (t->rank == 0 && !t->o.quiet)
			print_epoch(t, e, &t->hist[e]);
	}
	*secs = now_s() - start;
	*sps = train_secs > 0 ? samples / train_secs : 0.0;
	if (t->tty)
		printf("\n");
}

/* Frees the strategy's state, the model and the data (not t->c). */
static void
cleanup(struct trainer *t)
{
	mlp_set_grad_ready(&t->m, NULL, NULL);
	cohort_ddp_free(t->ddp);
	t->ddp = NULL;
	cohort_hvd_free(t->hvd); /* collective: every rank gets here */
	t->hvd = NULL;
	if (t->dp != NULL) {
		cohort_dp_free(t->dp);
		t->dp = NULL;
		for (int k = 1; k < t->nrep; k++)
			mlp_fini(&t->reps[k]);
	}
	EX_FREE_ALL(t->reps, t->rd, t->rep_loss, t->rep_correct, t->perm,
	    t->idx, t->bx, t->by, t->hist);
	mlp_fini(&t->m);
	digits_free(&t->train);
	digits_free(&t->test);
}

/* ------------------------------------------------------------------ */
/* spawn                                                                */
/* ------------------------------------------------------------------ */

/* A worker process of --strategy spawn: trains with ddp on the client
 * cohort_spawn opened; rank 0 prints the progress and returns the report
 * (struct spawn_report) to the parent. */
static int
spawn_worker(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	struct trainer *t = arg; /* this process's copy */
	double secs, sps;
	uint64_t *all;

	t->spawn = ctx;
	setup(t, c);
	run_training(t, &secs, &sps);
	if ((all = calloc((size_t)t->world, sizeof(*all))) == NULL)
		die(t, "out of memory");
	gather_checksums(t, all);
	if (t->rank == 0) {
		struct spawn_report rep;
		size_t hl = (size_t)t->o.epochs * sizeof(*t->hist);
		size_t cl = (size_t)t->world * sizeof(*all);
		size_t pl = t->m.n_params * sizeof(float);
		char *buf = malloc(sizeof(rep) + hl + cl + pl);

		if (buf == NULL)
			die(t, "out of memory");
		memset(&rep, 0, sizeof(rep));
		rep.world = t->world;
		rep.equal = 1;
		for (int r = 1; r < t->world; r++)
			if (all[r] != all[0])
				rep.equal = 0;
		rep.n_params = t->m.n_params;
		rep.seconds = secs;
		rep.samples_per_s = sps;
		snprintf(rep.backend, sizeof(rep.backend), "%s",
		    cohort_group_backend(t->g));
		memcpy(buf, &rep, sizeof(rep));
		memcpy(buf + sizeof(rep), t->hist, hl);
		memcpy(buf + sizeof(rep) + hl, all, cl);
		memcpy(buf + sizeof(rep) + hl + cl, t->m.params, pl);
		check(t,
		    cohort_spawn_return(ctx, buf, sizeof(rep) + hl + cl + pl),
		    "cohort_spawn_return");
		free(buf);
	}
	fflush(stdout);
	free(all);
	t->c = NULL; /* cohort_spawn closes it */
	cleanup(t);
	return (0);
}

/* --strategy spawn: the parent starts the workers (before any cohort
 * call that opens nng in this process) and prints rank 0's results. */
static int
run_spawn(struct trainer *t)
{
	cohort_spawn_options so;
	cohort_spawn_result r;
	struct spawn_report rep;
	cohort_status st;
	size_t hl, cl;
	const char *p;
	int rc = 1;

	/* The workers would each die of it, without a word to us. */
	if (t->o.batch % t->o.ranks != 0) {
		fprintf(stderr,
		    PROG ": --batch %ld is not divisible by --ranks %d\n",
		    t->o.batch, t->o.ranks);
		return (2);
	}
	cohort_spawn_options_init(&so);
	if (!t->o.quiet) {
		printf(PROG ": spawn: starting %d worker%s\n", t->o.ranks,
		    t->o.ranks == 1 ? "" : "s");
		fflush(stdout);
	}
	st = cohort_spawn(t->o.ranks, spawn_worker, t, &so, &r);
	if (st != COHORT_OK) {
		fprintf(stderr, PROG ": cohort_spawn: %s: %s (rank %d)\n",
		    cohort_status_name(st),
		    r.error[0] != '\0' ? r.error : cohort_strerror(st),
		    r.failed_rank);
		cohort_spawn_result_free(&r);
		return (1);
	}
	hl = (size_t)t->o.epochs * sizeof(*t->hist);
	if (r.len < sizeof(rep) + hl) {
		fprintf(stderr, PROG ": spawn: rank 0 returned %zu bytes\n",
		    r.len);
		goto out;
	}
	memcpy(&rep, r.data, sizeof(rep));
	cl = (size_t)rep.world * sizeof(uint64_t);
	if (rep.world < 1
	    || r.len != sizeof(rep) + hl + cl + rep.n_params * sizeof(float)) {
		fprintf(stderr, PROG ": spawn: bad report from rank 0\n");
		goto out;
	}
	p = r.data;
	if ((t->hist = malloc(hl)) == NULL) {
		fprintf(stderr, PROG ": out of memory\n");
		goto out;
	}
	memcpy(t->hist, p + sizeof(rep), hl);
	{
		uint64_t *all = malloc(cl);
		float *params = malloc(rep.n_params * sizeof(float));

		if (all == NULL || params == NULL) {
			free(all);
			free(params);
			fprintf(stderr, PROG ": out of memory\n");
			goto out;
		}
		memcpy(all, p + sizeof(rep) + hl, cl);
		memcpy(params, p + sizeof(rep) + hl + cl,
		    rep.n_params * sizeof(float));
		t->world = rep.world;
		t->m.params = params;
		t->m.n_params = (size_t)rep.n_params;
		print_final(t, rep.world, rep.seconds, rep.samples_per_s);
		rc = print_checksums(all, rep.world) ? 0 : 1;
		t->m.params = NULL;
		free(params);
		free(all);
	}
out:
	free(t->hist);
	t->hist = NULL;
	cohort_spawn_result_free(&r);
	return (rc);
}

/* ------------------------------------------------------------------ */
/* elastic (docs/elastic.md)                                            */
/* ------------------------------------------------------------------ */

/* What a member that holds the state sends to one admitted without it,
 * after the parameters (cohort_ddp_state_transfer): this header, the
 * momentum buffer (n_params floats), the finished epochs' statistics. */
struct elastic_hdr {
	uint32_t magic; /* ELASTIC_MAGIC */
	uint32_t n_params;
	int32_t epoch; /* the epoch in progress */
	int32_t epochs;
	uint64_t step; /* steps of it committed */
	uint64_t global_step; /* steps committed since the start */
};

#define ELASTIC_MAGIC 0x45444754u /* "TGDE" */

struct elastic {
	struct elastic_hdr h;
	size_t steps; /* per epoch */
	size_t perm_epoch; /* the epoch t->perm holds, SIZE_MAX: none */
	double acc[3]; /* committed this epoch: loss sum, correct, count */
	uint8_t *extra; /* the transfer's extra bytes */
	size_t extra_len;
	double start;
};

static long long
wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((long long)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

static void
elastic_pack(struct trainer *t, struct elastic *e)
{
	uint8_t *p = e->extra;

	memcpy(p, &e->h, sizeof(e->h));
	p += sizeof(e->h);
	if (t->m.velocity != NULL)
		memcpy(p, t->m.velocity, t->m.n_params * sizeof(float));
	else
		memset(p, 0, t->m.n_params * sizeof(float));
	p += t->m.n_params * sizeof(float);
	memcpy(p, t->hist, (size_t)t->o.epochs * sizeof(*t->hist));
}

static void
elastic_unpack(struct trainer *t, struct elastic *e)
{
	const uint8_t *p = e->extra;
	struct elastic_hdr h;

	memcpy(&h, p, sizeof(h));
	if (h.magic != ELASTIC_MAGIC || h.n_params != t->m.n_params
	    || h.epochs != t->o.epochs || h.epoch < 0 || h.epoch > h.epochs)
		die(t,
		    "the state received is not this trainer's (another "
		    "model, or other --epochs)");
	e->h = h;
	p += sizeof(h);
	if (t->m.velocity == NULL
	    && (t->m.velocity = calloc(t->m.n_params, sizeof(float))) == NULL)
		die(t, "out of memory");
	memcpy(t->m.velocity, p, t->m.n_params * sizeof(float));
	p += t->m.n_params * sizeof(float);
	memcpy(t->hist, p, (size_t)t->o.epochs * sizeof(*t->hist));
	e->acc[0] = e->acc[1] = e->acc[2] = 0.0;
}

/* The client moved to another generation (a member lost, or admitted at a
 * boundary, which reformed the client already and says how in `done`):
 * DDP re-bound, the rank and world size re-read, one line printed. */
static void
elastic_moved(
    struct trainer *t, struct elastic *e, const cohort_reform_info *done)
{
	cohort_reform_info ri;
	cohort_status st;

	mlp_zero_grad(&t->m); /* the discarded step's, partly reduced */
	st = cohort_ddp_reform(t->ddp, &ri, COHORT_WAIT_DEFAULT);
	check(t, st, "cohort_ddp_reform");
	if (done != NULL && ri.generation == done->generation)
		ri = *done;
	t->rank = cohort_client_rank(t->c);
	t->world = cohort_client_world_size(t->c);
	if (ri.generation == ri.prev_generation)
		return;
	printf(PROG ": generation %llu: rank %d of %d (was %d of %d)",
	    (unsigned long long)ri.generation, ri.rank, ri.world_size,
	    ri.prev_rank, ri.prev_world_size);
	if (ri.lost > 0)
		printf(", lost %d", ri.lost);
	if (ri.joined > 0)
		printf(", joined %d", ri.joined);
	printf(", at step %llu (epoch %d) at_ms=%lld\n",
	    (unsigned long long)e->h.global_step, e->h.epoch + 1, wall_ms());
	fflush(stdout);
}

/* A membership change at a call: true (after moving along) when st says
 * so, false for COHORT_OK; any other status ends the process. */
static bool
elastic_changed(
    struct trainer *t, struct elastic *e, cohort_status st, const char *what)
{
	if (st == COHORT_EMEMBERSHIP) {
		if (t->rank == 0 && !t->o.quiet && t->o.log_steps)
			printf(PROG ": %s: %s\n", what,
			    cohort_group_last_error(t->g));
		elastic_moved(t, e, NULL);
		return (true);
	}
	check(t, st, what);
	return (false);
}

/* The state transfer a boundary named (right after it, before any other
 * boundary): the sender's model, momentum, step and data position, and
 * the finished epochs, to the members admitted without them. False when
 * the membership changed meanwhile. */
static bool
elastic_transfer(
    struct trainer *t, struct elastic *e, const cohort_boundary *bp)
{
	cohort_boundary b = *bp;
	cohort_status st;

	if (b.role == COHORT_STATE_NONE)
		return (true);
	if (b.role == COHORT_STATE_SEND)
		elastic_pack(t, e);
	st = cohort_ddp_state_transfer(
	    t->ddp, e->extra, e->extra_len, COHORT_WAIT_DEFAULT);
	if (elastic_changed(t, e, st, "cohort_ddp_state_transfer"))
		return (false);
	if (b.role == COHORT_STATE_RECV) {
		elastic_unpack(t, e);
		printf(PROG ": rank %d of %d: received the state from rank %d "
		            "(%zu bytes) at step %llu (epoch %d) at_ms=%lld\n",
		    t->rank, t->world, b.sender,
		    t->m.n_params * sizeof(float) + e->extra_len,
		    (unsigned long long)e->h.global_step, e->h.epoch + 1,
		    wall_ms());
		fflush(stdout);
	} else {
		printf(PROG ": rank %d of %d: sent the state to %d rank%s at "
		            "step %llu at_ms=%lld\n",
		    t->rank, t->world, b.receivers,
		    b.receivers == 1 ? "" : "s",
		    (unsigned long long)e->h.global_step, wall_ms());
		fflush(stdout);
	}
	return (true);
}

/* The sync point at the start and after a reform: a boundary (a process
 * admitted into the running job: its first, answered at once), and the
 * transfer it names. */
static bool
elastic_sync(struct trainer *t, struct elastic *e)
{
	cohort_boundary b;
	cohort_status st;

	st = cohort_step_boundary(t->c, &b, COHORT_WAIT_DEFAULT);
	if (elastic_changed(t, e, st, "cohort_step_boundary(sync)"))
		return (false);
	if (b.changed)
		elastic_moved(t, e, &b.reform);
	return (elastic_transfer(t, e, &b));
}

/* One step of the global batch: forward and backward of this rank's
 * shard, DDP's reduction, the commit boundary, then the update. False
 * when the membership changed (the step is discarded on every member). */
static bool
elastic_step(struct trainer *t, struct elastic *e, bool *sync)
{
	const size_t G = (size_t)t->o.batch;
	const size_t K = (size_t)t->o.accum;
	const size_t s = (size_t)e->h.step;
	double loss = 0.0, t0 = now_s();
	size_t correct = 0, count = 0;
	cohort_boundary b;
	cohort_status st;

	for (size_t k = 0; k < K; k++) {
		if (k + 1 < K)
			cohort_ddp_no_sync_begin(t->ddp);
		else
			cohort_ddp_no_sync_end(t->ddp);
		micro_step(t, (s * K + k) * G, G, &count, &loss, &correct);
	}
	st = cohort_ddp_sync(t->ddp);
	if (elastic_changed(t, e, st, "cohort_ddp_sync"))
		return (false);
	st = cohort_step_boundary(t->c, &b, COHORT_WAIT_DEFAULT);
	if (elastic_changed(t, e, st, "cohort_step_boundary"))
		return (false);
	/* committed on every member */
	sgd_step(t);
	check(t, cohort_ddp_after_step(t->ddp), "cohort_ddp_after_step");
	e->h.step++;
	e->h.global_step++;
	e->acc[0] += loss;
	e->acc[1] += (double)correct;
	e->acc[2] += (double)count;
	if (t->rank == 0 && t->o.log_steps) {
		printf(PROG ": step %llu committed at_ms=%lld\n",
		    (unsigned long long)e->h.global_step, wall_ms());
		fflush(stdout);
	}
	if (b.changed)
		elastic_moved(t, e, &b.reform);
	/* members admitted here (or one without the state): give it now */
	if (!elastic_transfer(t, e, &b))
		*sync = true;
	if (t->o.pace_ms > 0) {
		double left = (double)t->o.pace_ms / 1000.0 - (now_s() - t0);

		if (left > 0) {
			struct timespec ts = { (time_t)left,
				(long)((left - (double)(time_t)left) * 1e9) };
			nanosleep(&ts, NULL);
		}
	}
	return (true);
}

/* The end of an epoch: test metrics of this rank's shard, summed with the
 * committed training metrics over the ranks (a control-plane collective:
 * every member gets the sums, or every one the change). */
static bool
elastic_epoch_end(struct trainer *t, struct elastic *e)
{
	struct epoch_stats *es = &t->hist[e->h.epoch];
	double v[6] = { e->acc[0], e->acc[1], e->acc[2], 0, 0, 0 };
	size_t n = digits_shard(NULL, 0, t->test.n, t->rank, t->world, t->idx);
	size_t tc = 0;
	cohort_status st;

	digits_gather(&t->test, t->idx, n, t->bx, t->by);
	if (mlp_evaluate(&t->m, t->bx, t->by, n, &v[3], &tc) != 0)
		die(t, "evaluate: %s", strerror(errno));
	v[4] = (double)tc;
	v[5] = (double)n;
	st = cohort_reduce_scalars(
	    t->g, COHORT_F64, COHORT_SUM, v, 6, COHORT_WAIT_DEFAULT);
	if (elastic_changed(t, e, st, "cohort_reduce_scalars(metrics)"))
		return (false);
	es->train_loss = v[2] > 0 ? v[0] / v[2] : 0.0;
	es->train_acc = v[2] > 0 ? v[1] / v[2] : 0.0;
	es->test_loss = v[5] > 0 ? v[3] / v[5] : 0.0;
	es->test_acc = v[5] > 0 ? v[4] / v[5] : 0.0;
	es->samples = v[2];
	es->seconds = now_s() - e->start;
	es->samples_per_s = es->seconds > 0 ? v[2] / es->seconds : 0.0;
	if (t->rank == 0 && !t->o.quiet)
		print_epoch(t, e->h.epoch, es);
	e->h.epoch++;
	e->h.step = 0;
	e->acc[0] = e->acc[1] = e->acc[2] = 0.0;
	e->start = now_s();
	return (true);
}

/* The end: every member's checksum, then a commit boundary (a member
 * lost in the all-gather is noticed by all; one admitted here gets the
 * state and joins the last all-gather). */
static bool
elastic_finish(
    struct trainer *t, struct elastic *e, uint64_t **all, bool *sync)
{
	uint64_t mine = mlp_checksum(&t->m);
	cohort_boundary b;
	cohort_status st;

	free(*all);
	if ((*all = calloc((size_t)t->world, sizeof(**all))) == NULL)
		die(t, "out of memory");
	st = cohort_allgather(
	    t->g, &mine, *all, 1, COHORT_I64, NULL, COHORT_WAIT_DEFAULT);
	if (elastic_changed(t, e, st, "cohort_allgather(checksums)"))
		return (false);
	st = cohort_step_boundary(t->c, &b, COHORT_WAIT_DEFAULT);
	if (elastic_changed(t, e, st, "cohort_step_boundary(final)"))
		return (false);
	if (b.changed || b.sender >= 0) {
		/* admitted at the very end: it takes the state, then the
		 * checksums are gathered again with it */
		if (b.changed)
			elastic_moved(t, e, &b.reform);
		if (!elastic_transfer(t, e, &b))
			*sync = true;
		return (false);
	}
	return (true);
}

/* --elastic, or an elastic job: the loop of docs/elastic.md. The data and
 * the model are ready before the client opens, so that a process admitted
 * into a running job is ready to take the state as soon as it is in. */
static int
run_elastic(struct trainer *t)
{
	struct elastic e;
	int32_t min_world = 0, max_world = 0;
	uint64_t *all = NULL;
	bool sync = true, equal = true;
	double t_start;

	if (t->o.strategy != STRAT_DDP)
		die(t, "--elastic needs --strategy ddp");
	setup_model(t);
	memset(&e, 0, sizeof(e));
	e.h.magic = ELASTIC_MAGIC;
	e.h.n_params = (uint32_t)t->m.n_params;
	e.h.epochs = t->o.epochs;
	e.steps = digits_num_batches(
	    t->train.n, (size_t)t->o.batch * (size_t)t->o.accum, 1);
	e.perm_epoch = SIZE_MAX;
	e.extra_len = sizeof(e.h) + t->m.n_params * sizeof(float)
	    + (size_t)t->o.epochs * sizeof(*t->hist);
	if ((e.extra = calloc(1, e.extra_len)) == NULL)
		die(t, "out of memory");
	printf(PROG ": ready at_ms=%lld\n", wall_ms());
	fflush(stdout);
	check(t, cohort_client_open_env(&t->c, COHORT_WAIT_DEFAULT),
	    "cohort_client_open_env");
	t->g = cohort_client_world(t->c);
	t->rank = cohort_client_rank(t->c);
	t->world = cohort_client_world_size(t->c);
	cohort_client_elastic_range(t->c, &min_world, &max_world);
	if (t->o.batch < (max_world > 0 ? max_world : t->world))
		die(t, "--batch %ld is smaller than the largest world size %d",
		    t->o.batch, max_world > 0 ? max_world : t->world);
	/* Every member starts from the same seed's parameters; one admitted
	 * later gets the running state at its first boundary, not a
	 * broadcast the others would have to join. */
	setup_ddp(t, false);
	printf(PROG ": rank %d of %d, elastic %d:%d, generation %llu, pid %d "
	            "at_ms=%lld\n",
	    t->rank, t->world, min_world, max_world,
	    (unsigned long long)cohort_client_generation(t->c), (int)getpid(),
	    wall_ms());
	fflush(stdout);
	print_setup(t);
	t->tty = false;
	t_start = e.start = now_s();
	for (;;) {
		if (sync) {
			if (!elastic_sync(t, &e))
				continue;
			sync = false;
		}
		if (e.h.epoch >= t->o.epochs) {
			if (elastic_finish(t, &e, &all, &sync))
				break;
			continue;
		}
		if (e.perm_epoch != (size_t)e.h.epoch) {
			digits_epoch_order(t->perm, t->train.n, t->o.seed,
			    (uint64_t)e.h.epoch);
			e.perm_epoch = (size_t)e.h.epoch;
		}
		if (e.h.step < e.steps) {
			if (!elastic_step(t, &e, &sync))
				sync = true;
		} else if (!elastic_epoch_end(t, &e)) {
			sync = true;
		}
	}
	if (t->rank == 0) {
		double secs = now_s() - t_start, samples = 0, train = 0;

		for (int i = 0; i < t->o.epochs; i++) {
			samples += t->hist[i].samples;
			train += t->hist[i].seconds;
		}
		print_final(
		    t, t->world, secs, train > 0 ? samples / train : 0.0);
		equal = print_checksums(all, t->world);
	} else {
		for (int r = 1; r < t->world; r++)
			if (all[r] != all[0])
				equal = false;
		if (!equal)
			fprintf(stderr, PROG ": rank %d: parameters differ\n",
			    t->rank);
	}
	printf(PROG ": rank %d of %d done at generation %llu, pid %d, "
	            "checksum %016" PRIx64 "\n",
	    t->rank, t->world,
	    (unsigned long long)cohort_client_generation(t->c), (int)getpid(),
	    mlp_checksum(&t->m));
	fflush(stdout);
	free(all);
	free(e.extra);
	cleanup(t);
	cohort_client_close(t->c);
	return (equal ? 0 : 1);
}

int
main(int argc, char **argv)
{
	struct trainer t;
	double secs, sps;
	uint64_t *all;
	bool equal = true;

	memset(&t, 0, sizeof(t));
	t.world = 1;
	parse_args(argc, argv, &t.o);
	if (!t.o.local && t.o.strategy == STRAT_SPAWN)
		return (run_spawn(&t));
	if (!t.o.local
	    && (t.o.elastic
	        || (cohort_env_knob("COHORT_MIN_WORLD") != NULL
	            && strcmp(cohort_env_knob("COHORT_MIN_WORLD"), "0") != 0)))
		return (run_elastic(&t));
	setup(&t, NULL);
	run_training(&t, &secs, &sps);

	if ((all = calloc((size_t)nranks(&t), sizeof(*all))) == NULL)
		die(&t, "out of memory");
	gather_checksums(&t, all);
	if (t.rank == 0) {
		print_final(&t, nranks(&t), secs, sps);
		equal = print_checksums(all, nranks(&t));
	} else {
		for (int r = 1; r < t.world; r++)
			if (all[r] != all[0])
				equal = false;
		if (!equal)
			fprintf(stderr, PROG ": rank %d: parameters differ\n",
			    t.rank);
	}
	fflush(stdout);
	free(all);
	cleanup(&t);
	cohort_client_close(t.c);
	return (equal ? 0 : 1);
}
