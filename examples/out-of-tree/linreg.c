/*
 * linreg.c - a C program outside the cohort tree that trains with DDP from
 * an installed cohort (make install), built with pkg-config:
 *
 *   cc linreg.c $(pkg-config --cflags --libs cohort-strategies) -o linreg
 *   cohort run -n 2 -- ./linreg
 *
 * Linear regression y = X w on synthetic data: every rank draws its own
 * shard; cohort_ddp averages the gradients, so every rank ends with the
 * same weights, close to the true ones. Prints one line per rank.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>

#include <cohort/cohort.h>
#include <cohort/ddp.h>

#define DIM 16
#define ROWS 256 /* per rank */
#define STEPS 200

static float
lcg(unsigned *s)
{
	*s = *s * 1664525u + 1013904223u;
	return ((float)(*s >> 8) / 16777216.0f - 0.5f);
}

int
main(void)
{
	static float x[ROWS][DIM], y[ROWS];
	float w[DIM] = { 0 }, g[DIM], truth[DIM], b = 0, gb, loss = 0;
	cohort_ddp_param params[2]
	    = { { "w", w, g, DIM }, { "b", &b, &gb, 1 } };
	cohort_client *c;
	cohort_ddp *d;
	cohort_status st;
	unsigned seed;
	double sum = 0;

	if ((st = cohort_client_open_env(&c, 60000)) != COHORT_OK) {
		fprintf(stderr, "join: %s: %s\n", cohort_status_name(st),
		    cohort_last_error());
		return (1);
	}
	seed = 12345;
	for (int j = 0; j < DIM; j++)
		truth[j] = lcg(&seed) * 4;
	seed = 1000u + (unsigned)cohort_client_rank(c); /* this rank's shard */
	for (int i = 0; i < ROWS; i++) {
		y[i] = 0.5f;
		for (int j = 0; j < DIM; j++) {
			x[i][j] = lcg(&seed);
			y[i] += x[i][j] * truth[j];
		}
	}
	if ((st = cohort_ddp_new(c, NULL, params, 2, NULL, &d)) != COHORT_OK) {
		fprintf(stderr, "ddp: %s\n", cohort_status_name(st));
		return (1);
	}
	for (int step = 0; step < STEPS; step++) {
		loss = 0;
		gb = 0;
		for (int j = 0; j < DIM; j++)
			g[j] = 0;
		for (int i = 0; i < ROWS; i++) {
			float e = b - y[i];
			for (int j = 0; j < DIM; j++)
				e += w[j] * x[i][j];
			loss += e * e / ROWS;
			gb += 2 * e / ROWS;
			for (int j = 0; j < DIM; j++)
				g[j] += 2 * e * x[i][j] / ROWS;
		}
		/* backward done: hand the gradients over, then wait */
		cohort_ddp_grad_ready(d, 1);
		cohort_ddp_grad_ready(d, 0);
		if ((st = cohort_ddp_sync(d)) != COHORT_OK) {
			fprintf(stderr, "sync: %s: %s\n",
			    cohort_status_name(st), cohort_ddp_last_error(d));
			return (1);
		}
		for (int j = 0; j < DIM; j++)
			w[j] -= 0.5f * g[j];
		b -= 0.5f * gb;
		cohort_ddp_after_step(d);
	}
	for (int j = 0; j < DIM; j++)
		sum += w[j];
	printf("rank %d/%d loss=%.6f checksum=%.6f err_b=%.4f\n",
	    cohort_client_rank(c), cohort_client_world_size(c), loss, sum,
	    fabs(b - 0.5));
	cohort_ddp_free(d);
	cohort_client_close(c);
	return (loss < 1e-3 ? 0 : 2);
}
