/*
 * test_hvd.c - strategies/hvd end to end: a real cohortd and N real ranks
 * (build/bin/cohort-strategy-worker):
 *
 *  - gradient synchronisation through named, negotiated, fused
 *    all-reduces gives the same parameters as ddp and as one process on
 *    the N-times batch, with and without fusion;
 *  - backward_passes_per_step handles accumulation itself;
 *  - named collectives from two threads in rank-dependent orders, an
 *    all-gather of unequal counts, a broadcast, a duplicate in-flight name
 *    (COHORT_EEXIST), mismatched counts (COHORT_EMISMATCH), and the stall
 *    check naming the rank that has not submitted a tensor.
 */
#include <math.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"

static struct th_coord thvd_coord;

static void
thvd_setup(void)
{
	th_coord_start(&thvd_coord, NULL);
}

static void
thvd_teardown(void)
{
	ck_assert_int_eq(th_coord_stop(&thvd_coord), 0);
}

/* Runs the worker (MODE OUT args) on n ranks (n == 0: one process
 * without a job) and expects exit 0 everywhere; returns the path of rank
 * 0's parameter file (malloc'd). */
static char *
thvd_run(const char *job, int n, const char *mode, const char *args,
    struct th_workers *w)
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
	w->n = nproc;
	for (int r = 0; r < nproc; r++) {
		char e_coord[128], e_job[160], e_rank[32], e_world[32];
		char *env[8] = { NULL };

		if (n > 0) {
			snprintf(e_coord, sizeof(e_coord),
			    "COHORT_COORDINATOR=%s", thvd_coord.url);
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
		char *o = th_worker_output(w, r);

		ck_assert_msg(w->status[r] == 0,
		    "%s %s: rank %d exited %d:\n%.3000s", mode, args, r,
		    w->status[r], o);
		free(o);
	}
	return (strdup(path));
}

static float *
thvd_load(const char *path, size_t *n)
{
	char *text = NULL;
	FILE *f = fopen(path, "rb");
	float *v;
	long len;

	ck_assert_msg(f != NULL, "cannot open %s", path);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	v = malloc((size_t)len);
	ck_assert_ptr_nonnull(v);
	ck_assert_int_eq(fread(v, 1, (size_t)len, f), (size_t)len);
	fclose(f);
	(void)text;
	*n = (size_t)len / sizeof(float);
	return (v);
}

static double
thvd_rel_diff(const char *pa, const char *pb)
{
	size_t na, nb;
	float *a = thvd_load(pa, &na), *b = thvd_load(pb, &nb);
	double dmax = 0.0, amax = 0.0;

	ck_assert_uint_eq(na, nb);
	for (size_t i = 0; i < na; i++) {
		double d = fabs((double)a[i] - (double)b[i]);

		dmax = d > dmax ? d : dmax;
		amax = fabs((double)a[i]) > amax ? fabs((double)a[i]) : amax;
	}
	free(a);
	free(b);
	return (amax > 0.0 ? dmax / amax : dmax);
}

START_TEST(test_hvd_equals_ddp_and_local)
{
	struct th_workers w;
	char *local = thvd_run("hl", 0, "local", "world=3 steps=10", &w);
	char *ddp = thvd_run("hd", 3, "ddp", "steps=10", &w);
	/* No fusion (threshold 4 KB < fc1.weight), then fused. */
	char *hvd = thvd_run("hh", 3, "hvd", "steps=10 cap=4096", &w);
	char *fused = thvd_run("hf", 3, "hvd", "steps=10 cap=67108864", &w);

	ck_assert(th_worker_output_has(&w, 0, "steps=10"));
	ck_assert_msg(
	    !th_worker_output_has(&w, 0, "fused=0"), "nothing was fused");
	ck_assert_double_le(thvd_rel_diff(local, hvd), 1e-5);
	ck_assert_double_le(thvd_rel_diff(ddp, hvd), 1e-5);
	ck_assert_double_le(thvd_rel_diff(ddp, fused), 1e-5);
	free(local);
	free(ddp);
	free(hvd);
	free(fused);
}
END_TEST

START_TEST(test_hvd_backward_passes_per_step)
{
	struct th_workers w;
	/* 4 passes of B per optimizer step == one step on 4 * N * B. */
	char *local
	    = thvd_run("hal", 0, "local", "world=2 batch=32 steps=5", &w);
	char *hvd = thvd_run("hah", 2, "hvd", "batch=8 accum=4 steps=5", &w);

	ck_assert(th_worker_output_has(&w, 0, "steps=5"));
	ck_assert(th_worker_output_has(&w, 1, "steps=5"));
	ck_assert_double_le(thvd_rel_diff(local, hvd), 1e-5);
	free(local);
	free(hvd);
}
END_TEST

START_TEST(test_hvd_named_collectives_and_stall)
{
	struct th_workers w;
	char *p = thvd_run("api", 3, "hvdapi", "", &w);
	char *o0;

	for (int r = 0; r < 3; r++) {
		ck_assert(th_worker_output_has(&w, r, "THREADS ok"));
		ck_assert(th_worker_output_has(&w, r, "ALLGATHER ok"));
		ck_assert(th_worker_output_has(&w, r, "BROADCAST ok"));
		ck_assert(th_worker_output_has(&w, r, "DUPLICATE ok"));
		ck_assert(th_worker_output_has(&w, r, "MISMATCH ok"));
	}
	o0 = th_worker_output(&w, 0);
	ck_assert_msg(strstr(o0, "STALL tensor 'late'") != NULL
	        && strstr(o0, "missing ranks [2]") != NULL
	        && strstr(o0, "submitted by ranks [0,1]") != NULL,
	    "no stall report naming rank 2:\n%s", o0);
	ck_assert_msg(strstr(o0, "cohort hvd: stall") != NULL,
	    "rank 0 did not log the stall:\n%s", o0);
	free(o0);
	free(p);
}
END_TEST

/* Regression: a peer that dies used to leave the others' synchronize
 * waiting for its whole timeout (the negotiated batch was in neither the
 * table nor the pending list when the cycle failed). */
START_TEST(test_hvd_peer_death_fails_pending_promptly)
{
	struct th_workers w;
	char *p = thvd_run("die", 3, "hvddie", "", &w);

	for (int r = 0; r < 2; r++) {
		char *o = th_worker_output(&w, r);
		const char *at = strstr(o, "PEERLOST after ");
		double ms;

		ck_assert_msg(at != NULL, "rank %d:\n%s", r, o);
		ms = strtod(at + strlen("PEERLOST after "), NULL);
		/* far below the 60 s timeout; detection takes milliseconds */
		ck_assert_msg(ms < 10000.0, "rank %d took %.0f ms", r, ms);
		free(o);
	}
	free(p);
}
END_TEST

Suite *
suite_hvd(void)
{
	const TTest *tests[] = { test_hvd_equals_ddp_and_local,
		test_hvd_backward_passes_per_step,
		test_hvd_named_collectives_and_stall,
		test_hvd_peer_death_fails_pending_promptly, NULL };
	Suite *s = suite_create("hvd");

	tcase_add_checked_fixture(unit_tcase(s, "end_to_end", 180, tests),
	    thvd_setup, thvd_teardown);
	return (s);
}
