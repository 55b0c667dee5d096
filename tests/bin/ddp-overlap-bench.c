/*
 * ddp-overlap-bench - how much of DDP's gradient communication hides
 * behind backward.
 *
 *   ddp-overlap-bench [-n RANKS] [--layers L] [--floats F] [--work W]
 *                     [--iters I] [--cap BYTES] [--device-us US]
 *
 * --device-us US models a GPU: each layer's backward also waits US
 * microseconds with the CPU idle (the kernel running on the device), which
 * is the time DDP overlaps communication with. Without it the backward is
 * CPU arithmetic only, and on a machine with no more cores than ranks the
 * communication competes with it for the same cores.
 *
 * A synthetic model of L layers with F float32 gradients each (default 8
 * x 512Ki = 16 MiB) whose backward computes layer L-1 .. 0 with real
 * arithmetic (W passes over the layer's gradient) and reports each layer's
 * gradient ready to cohort_ddp. With a bucket cap of one layer, there are
 * L buckets. The program launches its ranks itself with cohort_spawn (a
 * private cohortd next to this binary, or $COHORT_COHORTD) and times, per
 * step (median of I):
 *
 *   compute   backward alone (no_sync: no communication)
 *   serial    overlap off: every bucket reduced after backward
 *   overlap   overlap on: a bucket's all-reduce starts when it is full
 *
 * comm = serial - compute is the communication a step pays when nothing
 * overlaps; hidden = (serial - overlap) / comm is the share of it that
 * overlap hid behind backward.
 */
#include <errno.h>
#include <getopt.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort/cohort.h"
#include "ddp.h"
#include "spawn.h"
#include "th_worker.h"

struct ob_cfg {
	int n, layers, work, iters;
	size_t floats, cap;
	int device_us; /* --device-us: backward "on a device" */
};

struct ob_res {
	double compute, serial, overlap; /* seconds per step, medians */
	double sync_wait_overlap, sync_wait_serial;
	int nbuckets;
};

static int
ob_cmp(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return (x < y ? -1 : x > y);
}

/* The backward of layer l: W passes of arithmetic over its gradient. */
static void
ob_layer_backward(float *g, const float *p, size_t n, int work, int step)
{
	for (int w = 0; w < work; w++) {
		float a = 0.5f + 0.001f * (float)(w + step);

		for (size_t i = 0; i < n; i++)
			g[i] = g[i] * 0.5f + a * p[i];
	}
}

/* Median seconds per step of `iters` steps (2 warmup). mode 0: compute
 * only, 1: ddp. */
static double
ob_time(cohort_ddp *d, float **par, float **grad, const struct ob_cfg *c,
    bool no_sync, double *wait)
{
	double *t = calloc((size_t)c->iters, sizeof(double));
	cohort_ddp_stats s;
	double med;

	if (t == NULL)
		return (-1.0);
	cohort_ddp_reset_stats(d);
	for (int it = -2; it < c->iters; it++) {
		double t0;

		if (it == 0)
			cohort_ddp_reset_stats(d);
		/* Line the ranks up so every step starts together. */
		if (cohort_ddp_barrier(d, "step") != COHORT_OK)
			return (-1.0);
		t0 = tw_now_s();
		if (no_sync)
			cohort_ddp_no_sync_begin(d);
		for (int l = c->layers - 1; l >= 0; l--) {
			ob_layer_backward(
			    grad[l], par[l], c->floats, c->work, it);
			/* A GPU's backward: the kernel runs on the device
			 * while this CPU thread waits, free for the
			 * communication to progress. */
			if (c->device_us > 0)
				usleep((useconds_t)c->device_us);
			cohort_ddp_grad_ready(d, l);
		}
		if (cohort_ddp_sync(d) != COHORT_OK)
			return (-1.0);
		if (no_sync)
			cohort_ddp_no_sync_end(d);
		if (it >= 0)
			t[it] = tw_now_s() - t0;
	}
	cohort_ddp_get_stats(d, &s);
	if (wait != NULL)
		*wait = s.wait_seconds / c->iters;
	qsort(t, (size_t)c->iters, sizeof(double), ob_cmp);
	med = t[c->iters / 2];
	free(t);
	return (med);
}

static int
ob_rank(cohort_spawn_ctx *ctx, cohort_client *cl, void *arg)
{
	const struct ob_cfg *c = arg;
	cohort_ddp_param *p = calloc((size_t)c->layers, sizeof(*p));
	float **par = calloc((size_t)c->layers, sizeof(float *));
	float **grad = calloc((size_t)c->layers, sizeof(float *));
	cohort_ddp_options o;
	cohort_ddp *on, *off;
	cohort_ddp_stats s;
	struct ob_res r;
	cohort_status st;

	if (p == NULL || par == NULL || grad == NULL)
		return (1);
	for (int l = 0; l < c->layers; l++) {
		par[l] = malloc(c->floats * sizeof(float));
		grad[l] = calloc(c->floats, sizeof(float));
		if (par[l] == NULL || grad[l] == NULL)
			return (1);
		for (size_t i = 0; i < c->floats; i++)
			par[l][i] = (float)((i * 7 + (size_t)l) % 13) / 13.0f;
		p[l].name = "layer";
		p[l].data = par[l];
		p[l].grad = grad[l];
		p[l].count = c->floats;
	}
	cohort_ddp_options_init(&o);
	o.bucket_cap_bytes = c->cap;
	o.first_bucket_cap_bytes = c->cap;
	o.timeout = 120000;
	if ((st = cohort_ddp_new(cl, NULL, p, (size_t)c->layers, &o, &on))
	    != COHORT_OK) {
		cohort_spawn_fail(ctx, "ddp_new: %s", cohort_status_name(st));
		return (1);
	}
	o.overlap = false;
	o.broadcast_params = false;
	if ((st = cohort_ddp_new(cl, NULL, p, (size_t)c->layers, &o, &off))
	    != COHORT_OK) {
		cohort_spawn_fail(ctx, "ddp_new: %s", cohort_status_name(st));
		return (1);
	}
	cohort_ddp_get_stats(on, &s);
	memset(&r, 0, sizeof(r));
	r.nbuckets = s.nbuckets;
	/* Interleave the three modes twice to even out drift. */
	for (int round = 0; round < 2; round++) {
		double a, b, d, wo, ws;

		a = ob_time(on, par, grad, c, true, NULL);
		b = ob_time(off, par, grad, c, false, &ws);
		d = ob_time(on, par, grad, c, false, &wo);
		if (a < 0 || b < 0 || d < 0) {
			cohort_spawn_fail(ctx, "rank %d: step failed: %s",
			    cohort_ddp_rank(on), cohort_ddp_last_error(on));
			return (1);
		}
		if (round == 0 || a < r.compute)
			r.compute = a;
		if (round == 0 || b < r.serial) {
			r.serial = b;
			r.sync_wait_serial = ws;
		}
		if (round == 0 || d < r.overlap) {
			r.overlap = d;
			r.sync_wait_overlap = wo;
		}
	}
	if (cohort_ddp_is_global_zero(on))
		cohort_spawn_return(ctx, &r, sizeof(r));
	cohort_ddp_free(on);
	cohort_ddp_free(off);
	for (int l = 0; l < c->layers; l++) {
		free(par[l]);
		free(grad[l]);
	}
	free(par);
	free(grad);
	free(p);
	return (0);
}

static long
ob_num(const char *s, long min, long max)
{
	char *end;
	long v;

	errno = 0;
	v = strtol(s, &end, 10);
	if (errno != 0 || end == s || *end != '\0' || v < min || v > max) {
		fprintf(stderr, "ddp-overlap-bench: bad number '%s'\n", s);
		exit(2);
	}
	return (v);
}

int
main(int argc, char **argv)
{
	static const struct option lo[] = {
		{ "layers", required_argument, NULL, 'l' },
		{ "floats", required_argument, NULL, 'f' },
		{ "work", required_argument, NULL, 'w' },
		{ "iters", required_argument, NULL, 'i' },
		{ "cap", required_argument, NULL, 'c' },
		{ "device-us", required_argument, NULL, 'd' },
		{ NULL, 0, NULL, 0 },
	};
	struct ob_cfg c = { 2, 8, 6, 10, 512 * 1024, 0, 0 };
	cohort_spawn_options so;
	cohort_spawn_result res;
	struct ob_res r;
	cohort_status st;
	double comm, hidden;
	int ch;

	while ((ch = getopt_long(argc, argv, "n:", lo, NULL)) != -1) {
		switch (ch) {
		case 'n':
			c.n = (int)ob_num(optarg, 1, 64);
			break;
		case 'l':
			c.layers = (int)ob_num(optarg, 1, 1024);
			break;
		case 'f':
			c.floats = (size_t)ob_num(optarg, 1, 1L << 28);
			break;
		case 'w':
			c.work = (int)ob_num(optarg, 0, 100000);
			break;
		case 'i':
			c.iters = (int)ob_num(optarg, 1, 100000);
			break;
		case 'c':
			c.cap = (size_t)ob_num(optarg, 4, 1L << 32);
			break;
		case 'd':
			c.device_us = (int)ob_num(optarg, 0, 10000000);
			break;
		default:
			fprintf(stderr,
			    "usage: ddp-overlap-bench [-n RANKS] [--layers L] "
			    "[--floats F] [--work W] [--iters I] "
			    "[--cap BYTES] [--device-us US]\n");
			return (2);
		}
	}
	if (c.cap == 0)
		c.cap = c.floats * sizeof(float);

	/* Before any nng use in this process. */
	cohort_spawn_options_init(&so);
	so.timeout_ms = 600000;
	st = cohort_spawn(c.n, ob_rank, &c, &so, &res);
	if (st != COHORT_OK || res.len != sizeof(r)) {
		fprintf(stderr, "ddp-overlap-bench: %s: %s\n",
		    cohort_status_name(st), res.error);
		cohort_spawn_result_free(&res);
		return (1);
	}
	memcpy(&r, res.data, sizeof(r));
	cohort_spawn_result_free(&res);
	comm = r.serial - r.compute;
	hidden = comm > 0 ? (r.serial - r.overlap) / comm : 0.0;
	printf("ddp-overlap-bench: %d ranks, %d layers x %zu floats "
	       "(%.1f MiB of gradients), %d buckets, work %d, device %d us "
	       "per layer\n",
	    c.n, c.layers, c.floats,
	    (double)c.layers * (double)c.floats * 4.0 / 1048576.0, r.nbuckets,
	    c.work, c.device_us);
	printf("  backward alone (no communication) %8.2f ms/step\n",
	    r.compute * 1e3);
	printf("  overlap off (reduce after backward) %6.2f ms/step  "
	       "(sync wait %.2f ms)\n",
	    r.serial * 1e3, r.sync_wait_serial * 1e3);
	printf("  overlap on  (reduce during backward) %5.2f ms/step  "
	       "(sync wait %.2f ms)\n",
	    r.overlap * 1e3, r.sync_wait_overlap * 1e3);
	printf("  communication when serial %.2f ms; hidden by overlap "
	       "%.2f ms = %.0f%%; step speed-up %.2fx\n",
	    comm * 1e3, (r.serial - r.overlap) * 1e3, hidden * 100.0,
	    r.overlap > 0 ? r.serial / r.overlap : 0.0);
	return (0);
}
