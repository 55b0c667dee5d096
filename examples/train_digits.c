/*
 * train_digits.c - data-parallel training of a small MLP on the digits data
 * set with libcohort: the main job of `make demo`.
 *
 * Every rank reads its rank and the world size from the environment
 * (cohort_client_open_env: COHORT_*, torchrun, Open MPI, SLURM, ...), loads
 * the data itself, and takes rank 0's initial parameters by a broadcast.
 * Each optimizer step covers one global batch (--batch, split evenly over
 * the ranks, see examples/lib/digits.h); gradients are averaged across
 * ranks by sync_gradients() before the SGD step, so every rank applies the
 * same update and the parameters stay identical: the final checksums
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
#include "digits.h"
#include "mlp.h"

#define PROG "train_digits"
#define HIDDEN 128
#define DATA_SEED 1797             /* fixed train/test split */
#define JOIN_TIMEOUT_MS (120 * 1000) /* waiting for every rank to start */
#define REPORT_TIMEOUT_MS 5000

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
};

static double
now_s(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((double) ts.tv_sec + (double) ts.tv_nsec * 1e-9);
}

/* A fatal error: tell the other ranks (through cohortd) why this one
 * stops, then exit 1. */
static void
die(struct trainer *t, const char *fmt, ...)
{
	char text[768];
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(text, sizeof(text), fmt, ap);
	va_end(ap);
	if (t->tty)
		fputc('\n', stdout);
	fflush(stdout);
	fprintf(stderr, PROG ": rank %d: %s\n", t->rank, text);
	if (t->c != NULL) {
		cohort_status st;

		st = cohort_report_failure(t->c, text, REPORT_TIMEOUT_MS);
		if (st != COHORT_OK)
			fprintf(stderr,
			    PROG ": rank %d: cohort_report_failure: %s\n",
			    t->rank, cohort_status_name(st));
		cohort_client_close(t->c);
	}
	exit(1);
}

/* Dies on a cohort error, naming the call, the status and its detail. */
static void
check(struct trainer *t, cohort_status st, const char *what)
{
	const char *detail = "";

	if (st == COHORT_OK)
		return;
	if (t->g != NULL)
		detail = cohort_group_last_error(t->g);
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_last_error();
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_strerror(st);
	die(t, "%s: %s: %s", what, cohort_status_name(st), detail);
}

/*
 * The gradient synchronisation of one optimizer step: every rank's
 * accumulated gradient is replaced by the mean over all ranks, one flat
 * all-reduce over the whole model. This is the part a DDP strategy
 * (bucketed, overlapped with backward) replaces.
 */
static cohort_status
sync_gradients(struct trainer *t)
{
	if (t->g == NULL || t->world == 1)
		return (COHORT_OK);
	return (cohort_allreduce(t->g, t->m.grads, t->m.grads, t->m.n_params,
	    COHORT_F32, COHORT_MEAN, NULL, COHORT_WAIT_DEFAULT));
}

/* Sums metrics over the ranks (no-op alone). */
static void
reduce_metrics(struct trainer *t, double *v, size_t n)
{
	if (t->g == NULL)
		return;
	check(t, cohort_reduce_scalars(t->g, COHORT_F64, COHORT_SUM, v, n,
	             COHORT_WAIT_DEFAULT),
	    "cohort_reduce_scalars(metrics)");
}

/* ------------------------------------------------------------------ */
/* Training                                                             */
/* ------------------------------------------------------------------ */

static void
train_epoch(struct trainer *t, int epoch, struct epoch_stats *es)
{
	const size_t G = (size_t) t->o.batch;
	const size_t K = (size_t) t->o.accum;
	const size_t steps = digits_num_batches(t->train.n, G * K, 1);
	/* metrics: train loss sum, correct, count; test the same */
	double v[6] = { 0 };
	size_t correct = 0, count = 0;
	double t0, t1;

	digits_epoch_order(t->perm, t->train.n, t->o.seed, (uint64_t) epoch);
	t0 = now_s();
	for (size_t s = 0; s < steps; s++) {
		for (size_t k = 0; k < K; k++) {
			size_t b = s * K + k;
			size_t n = digits_shard(t->perm, b * G, G, t->rank,
			    t->world, t->idx);

			digits_gather(&t->train, t->idx, n, t->bx, t->by);
			if (mlp_forward(&t->m, t->bx, t->by, n, &v[0],
			        &correct) != 0)
				die(t, "forward: %s", strerror(errno));
			mlp_backward(&t->m, t->bx, t->by, n,
			    1.0f / (float) (n * K));
			count += n;
		}
		check(t, sync_gradients(t), "sync_gradients");
		if (mlp_sgd_step(&t->m, t->o.lr, t->o.momentum) != 0)
			die(t, "sgd step: %s", strerror(errno));
		mlp_zero_grad(&t->m);
	}
	t1 = now_s();

	/* Test set: rank r evaluates samples r, r + world, ... */
	{
		size_t n = digits_shard(NULL, 0, t->test.n, t->rank,
		    t->world, t->idx);
		size_t tc = 0;

		digits_gather(&t->test, t->idx, n, t->bx, t->by);
		if (mlp_evaluate(&t->m, t->bx, t->by, n, &v[3], &tc) != 0)
			die(t, "evaluate: %s", strerror(errno));
		v[4] = (double) tc;
		v[5] = (double) n;
	}
	v[1] = (double) correct;
	v[2] = (double) count;
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
    double ymax, double x0, double y0, double w, double ht,
    const char *color, const char *dash)
{
	fprintf(f, "<polyline fill=\"none\" stroke=\"%s\" "
	           "stroke-width=\"2\"%s%s%s points=\"",
	    color, dash[0] ? " stroke-dasharray=\"" : "", dash,
	    dash[0] ? "\"" : "");
	for (int i = 0; i < n; i++) {
		double val = *(const double *) ((const char *) &h[i] + field);
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
	xstep = n <= 10 ? 1 : (int) nice_ceil((double) n / 10.0);
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
	    "font-size=\"15\">train_digits: %d rank%s, batch %ld, lr %g, "
	    "final test accuracy %.4f</text>\n",
	    W / 2, t->world, t->world == 1 ? "" : "s", t->o.batch * t->o.accum,
	    (double) t->o.lr, n > 0 ? t->hist[n - 1].test_acc : 0.0);

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
			double y = ly + 18 + 19.0 * (double) i;

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
	    "  --local        one process, no cohort calls (the baseline)\n");
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
	if (errno != 0 || end == s || *end != '\0' || !(v >= min) ||
	    !(v <= max))
		return (false);
	*out = (float) v;
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

	while ((ch = getopt_long(argc, argv, "h", longopts, &li)) != -1) {
		bool ok = true;

		switch (ch) {
		case 'e':
			ok = parse_long(optarg, 1, 100000, &v);
			o->epochs = (int) v;
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
			o->seed = (uint64_t) v;
			break;
		case 'a':
			ok = parse_long(optarg, 1, 1 << 16, &v);
			o->accum = (int) v;
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
		fprintf(stderr, PROG ": unexpected argument '%s'\n",
		    argv[optind]);
		usage(stderr);
		exit(2);
	}
}

static void
setup(struct trainer *t)
{
	struct digits all;
	char err[512];
	size_t cap;

	if (!t->o.local) {
		check(t, cohort_client_open_env(&t->c, JOIN_TIMEOUT_MS),
		    "cohort_client_open_env");
		t->g = cohort_client_world(t->c);
		t->rank = cohort_client_rank(t->c);
		t->world = cohort_client_world_size(t->c);
	}
	if (t->o.batch % t->world != 0)
		die(t, "--batch %ld is not divisible by the world size %d",
		    t->o.batch, t->world);

	if (digits_load(t->o.data, &all, err, sizeof(err)) != 0)
		die(t, "cannot load the data set: %s (run "
		       "tools/fetch-digits.sh)",
		    err);
	if (all.n <= DIGITS_TEST_SAMPLES + (size_t) t->o.batch)
		die(t, "%s: only %zu samples", t->o.data, all.n);
	digits_shuffle(&all, DATA_SEED);
	if (digits_split(&all, DIGITS_TEST_SAMPLES, &t->train, &t->test) != 0)
		die(t, "out of memory");
	digits_free(&all);
	if (digits_num_batches(t->train.n, (size_t) t->o.batch * t->o.accum,
	        1) == 0)
		die(t, "--batch x --accum exceeds the %zu training samples",
		    t->train.n);

	cap = t->train.n > t->test.n ? t->train.n : t->test.n;
	t->perm = calloc(t->train.n, sizeof(size_t));
	t->idx = calloc(cap, sizeof(size_t));
	t->bx = calloc(cap * DIGITS_FEATURES, sizeof(float));
	t->by = calloc(cap, 1);
	t->hist = calloc((size_t) t->o.epochs, sizeof(*t->hist));
	if (t->perm == NULL || t->idx == NULL || t->bx == NULL ||
	    t->by == NULL || t->hist == NULL)
		die(t, "out of memory");

	if (mlp_init(&t->m, DIGITS_FEATURES, HIDDEN, DIGITS_CLASSES,
	        t->o.seed) != 0)
		die(t, "mlp_init: %s", strerror(errno));
	/* Rank 0's parameters are the truth: every rank starts from them
	 * whatever it initialised itself. */
	if (t->g != NULL)
		check(t, cohort_broadcast(t->g, t->m.params, t->m.n_params,
		             COHORT_F32, 0, NULL, COHORT_WAIT_DEFAULT),
		    "cohort_broadcast(initial parameters)");

	if (t->rank == 0 && !t->o.quiet) {
		printf(PROG ": %d rank%s%s%s, %zu train / %zu test samples, "
		            "%zu parameters (checksum %016" PRIx64 ")\n",
		    t->world, t->world == 1 ? "" : "s",
		    t->g != NULL ? ", backend " : " (local, no cohort)",
		    t->g != NULL ? cohort_group_backend(t->g) : "",
		    t->train.n, t->test.n, t->m.n_params,
		    mlp_checksum(&t->m));
		printf(PROG ": batch %ld (%ld per rank) x accum %d, lr %g, "
		            "momentum %g, seed %" PRIu64 ", %d epochs\n",
		    t->o.batch, t->o.batch / t->world, t->o.accum,
		    (double) t->o.lr, (double) t->o.momentum, t->o.seed,
		    t->o.epochs);
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

/* Gathers every rank's parameter checksum; returns true if all equal. */
static bool
compare_checksums(struct trainer *t, uint64_t mine)
{
	int64_t *all = calloc((size_t) t->world, sizeof(int64_t));
	int64_t me;
	bool equal = true;

	if (all == NULL)
		die(t, "out of memory");
	memcpy(&me, &mine, sizeof(me));
	if (t->g != NULL)
		check(t, cohort_allgather(t->g, &me, all, 1, COHORT_I64, NULL,
		             COHORT_WAIT_DEFAULT),
		    "cohort_allgather(checksums)");
	else
		all[0] = me;
	for (int r = 0; r < t->world; r++)
		if (all[r] != all[0])
			equal = false;
	if (t->rank == 0) {
		printf("parameter checksums:");
		for (int r = 0; r < t->world; r++) {
			uint64_t u;

			memcpy(&u, &all[r], sizeof(u));
			printf(" %d:%016" PRIx64, r, u);
		}
		printf("\nall equal: %s\n", equal ? "yes" : "no");
	}
	free(all);
	return (equal);
}

int
main(int argc, char **argv)
{
	struct trainer t;
	double start, secs, samples = 0.0, train_secs = 0.0;
	uint64_t sum;
	bool equal;

	memset(&t, 0, sizeof(t));
	t.world = 1;
	parse_args(argc, argv, &t.o);
	setup(&t);
	t.tty = t.rank == 0 && !t.o.quiet && isatty(STDOUT_FILENO);

	start = now_s();
	for (int e = 0; e < t.o.epochs; e++) {
		train_epoch(&t, e, &t.hist[e]);
		samples += t.hist[e].samples;
		train_secs += t.hist[e].seconds;
		if (t.rank == 0 && !t.o.quiet)
			print_epoch(&t, e, &t.hist[e]);
	}
	secs = now_s() - start;
	if (t.tty)
		printf("\n");

	sum = mlp_checksum(&t.m);
	if (t.rank == 0) {
		const struct epoch_stats *last = &t.hist[t.o.epochs - 1];

		printf("final: test accuracy %.4f (loss %.4f), train accuracy "
		       "%.4f, %d rank%s, %.2f s, %.0f samples/s\n",
		    last->test_acc, last->test_loss, last->train_acc, t.world,
		    t.world == 1 ? "" : "s", secs,
		    train_secs > 0 ? samples / train_secs : 0.0);
		if (t.o.svg != NULL) {
			if (write_svg(&t, t.o.svg) != 0)
				die(&t, "cannot write %s: %s", t.o.svg,
				    strerror(errno));
			printf("curves: %s\n", t.o.svg);
		}
		if (t.o.save != NULL && save_params(&t, t.o.save) != 0)
			die(&t, "cannot write %s: %s", t.o.save,
			    strerror(errno));
	}
	equal = compare_checksums(&t, sum);
	fflush(stdout);
	if (!equal && t.rank != 0)
		fprintf(stderr, PROG ": rank %d: parameters differ\n", t.rank);

	mlp_fini(&t.m);
	digits_free(&t.train);
	digits_free(&t.test);
	free(t.perm);
	free(t.idx);
	free(t.bx);
	free(t.by);
	free(t.hist);
	cohort_client_close(t.c);
	return (equal ? 0 : 1);
}
