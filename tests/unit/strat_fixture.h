/*
 * strat_fixture.h - what the strategy suites share (test_ddp.c,
 * test_hvd.c, test_dp.c): runs of build/bin/cohort-strategy-worker on N ranks
 * or in one process, and the distance between two of the parameter files it
 * writes.
 */
#ifndef COHORT_STRAT_FIXTURE_H
#define COHORT_STRAT_FIXTURE_H

#include "check_cohort.h"

/* Runs `cohort-strategy-worker MODE OUT ARGS...` (ARGS split at spaces;
 * OUT is <tmpdir>/<job>.bin) on n ranks of job at th_fx_coord (the
 * harness's th_fx_setup fixture), or n == 0: one process without a job. Waits
 * up to 90 s; every rank must exit want (rank 0: want_r0 when >= 0). Rank r's
 * output is w->out[r]. Returns OUT (malloc'd). */
char *strat_run_ex(const char *job, int n, const char *mode, const char *args,
    int want, int want_r0, struct th_workers *w);
/* strat_run_ex expecting exit 0 everywhere. */
char *strat_run(const char *job, int n, const char *mode, const char *args,
    struct th_workers *w);
/* max |a - b| / max |a| over the floats of two parameter files of the
 * same size (every value of b finite). */
double strat_rel_diff(const char *pa, const char *pb);
/* Fails unless the parameter files a and b are equal within float rounding
 * (strat_rel_diff <= 1e-5). */
#define strat_assert_same(a, b)                                               \
	do {                                                                  \
		double rel_ = strat_rel_diff((a), (b));                       \
		ck_assert_msg(rel_ <= 1e-5,                                   \
		    "%s vs %s: relative difference %g", #a, #b, rel_);        \
	} while (0)

#endif /* COHORT_STRAT_FIXTURE_H */
