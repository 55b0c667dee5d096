/*
 * strat_fixture.c - runs of the strategy worker for test_ddp.c, test_hvd.c
 * and test_dp.c (strat_fixture.h).
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "strat_fixture.h"

char *
strat_run_ex(const char *job, int n, const char *mode, const char *args,
    int want, int want_r0, struct th_workers *w)
{
	char path[512], *argv[24], buf[512], *save = NULL;
	int argc = 0, nproc = n > 0 ? n : 1;

	snprintf(path, sizeof(path), "%s/%s.bin", th_tmpdir(), job);
	snprintf(buf, sizeof(buf), "%s", args);
	argv[argc++] = (char *)th_bin("cohort-strategy-worker");
	argv[argc++] = (char *)mode;
	argv[argc++] = path;
	for (char *t = strtok_r(buf, " ", &save); t != NULL && argc < 22;
	     t = strtok_r(NULL, " ", &save))
		argv[argc++] = t;
	argv[argc] = NULL;
	ck_assert_int_le(nproc, TH_MAX_WORKERS);
	w->n = nproc;
	for (int r = 0; r < nproc; r++) {
		char e_coord[128], e_job[160], e_rank[32], e_world[32];
		char *env[8] = { NULL };

		if (n > 0) {
			snprintf(e_coord, sizeof(e_coord),
			    "COHORT_COORDINATOR=%s", th_fx_coord.url);
			snprintf(e_job, sizeof(e_job), "COHORT_JOB=%s", job);
			snprintf(e_rank, sizeof(e_rank), "COHORT_RANK=%d", r);
			snprintf(e_world, sizeof(e_world),
			    "COHORT_WORLD_SIZE=%d", n);
			env[0] = e_coord;
			env[1] = e_job;
			env[2] = e_rank;
			env[3] = e_world;
			env[4] = (char *)"COHORT_LOG_LEVEL=warn";
		}
		snprintf(w->out[r], sizeof(w->out[r]), "%s/%s-%d.out",
		    th_tmpdir(), job, r);
		w->status[r] = -1;
		w->pid[r] = th_spawn(argv, env, w->out[r]);
	}
	th_workers_wait(w, 90000);
	for (int r = 0; r < nproc; r++) {
		int expect = r == 0 && want_r0 >= 0 ? want_r0 : want;
		char *o = th_worker_output(w, r);

		ck_assert_msg(w->status[r] == expect,
		    "%s %s on %d ranks: rank %d exited %d (want %d):\n%.3000s",
		    mode, args, n, r, w->status[r], expect, o);
		free(o);
	}
	return (strdup(path));
}

char *
strat_run(const char *job, int n, const char *mode, const char *args,
    struct th_workers *w)
{
	return (strat_run_ex(job, n, mode, args, 0, -1, w));
}

/* The floats of a parameter file (malloc'd); *n gets their number. */
static float *
strat_load(const char *path, size_t *n)
{
	FILE *f = fopen(path, "rb");
	float *v;
	long len;

	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	ck_assert_int_gt(len, 0);
	v = malloc((size_t)len);
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(fread(v, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	*n = (size_t)len / sizeof(float);
	return (v);
}

double
strat_rel_diff(const char *pa, const char *pb)
{
	size_t na, nb;
	float *a = strat_load(pa, &na), *b = strat_load(pb, &nb);
	double dmax = 0.0, amax = 0.0;

	ck_assert_uint_eq(na, nb);
	for (size_t i = 0; i < na; i++) {
		double d = fabs((double)a[i] - (double)b[i]);

		ck_assert_msg(
		    isfinite(b[i]), "parameter %zu is not finite", i);
		dmax = d > dmax ? d : dmax;
		amax = fabs((double)a[i]) > amax ? fabs((double)a[i]) : amax;
	}
	free(a);
	free(b);
	return (amax > 0.0 ? dmax / amax : dmax);
}
