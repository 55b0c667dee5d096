/*
 * test_limits.c - global limits and the expiry of abandoned jobs, end to
 * end (issue 12, finding 5).
 *
 * Suite integration_limits, real cohortd (--max-jobs 1 --job-expiry 1500)
 * and real workers: a job whose only member exits without a Leave (its
 * connection drops: the job fails and is abandoned) holds the one job
 * slot, so another job's join is refused with ETOOBIG naming --max-jobs;
 * once the abandoned job expired, the other job runs.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

Suite *suite_integration_limits(void);

static void
setup(void)
{
	static const char *const args[]
	    = { "--max-jobs", "1", "--job-expiry", "1500", NULL };

	th_coord_start(&th_fx_coord, args);
}

START_TEST(test_abandoned_job_holds_then_frees_the_slot)
{
	struct th_workers a, b;
	int64_t t0, end;
	char *o;
	bool ran = false;

	ck_assert_int_eq(th_workers_run(&a, &th_fx_coord, "abandoned", "t", 1,
	                     "soak", "2:1048576:abandon", NULL, 60000),
	    1);
	t0 = th_now_ms();
	th_workers_run(
	    &b, &th_fx_coord, "second", "t", 1, "open", NULL, NULL, 60000);
	o = th_worker_output(&b, 0);
	ck_assert_msg(b.status[0] == 1 && strstr(o, "COHORT_ETOOBIG") != NULL
	        && strstr(o, "--max-jobs 1") != NULL,
	    "second job: exit %d: %s", b.status[0], o);
	free(o);
	/* the abandoned job expires 1.5 s after its connection dropped */
	end = th_now_ms() + 15000;
	while (!ran && th_now_ms() < end) {
		usleep(300 * 1000);
		th_workers_start(
		    &b, &th_fx_coord, "second", "t", 1, "open", NULL, NULL);
		ran = th_workers_wait(&b, 60000) == 1;
	}
	ck_assert_msg(ran, "the abandoned job never expired");
	printf("MEASURE integration_limits: abandoned job's slot free "
	       "%lld ms after (--job-expiry 1500)\n",
	    (long long)(th_now_ms() - t0));
	o = th_read_file(th_fx_coord.log);
	ck_assert_msg(
	    o != NULL && strstr(o, "job 'abandoned' expired") != NULL, "%s",
	    o);
	free(o);
}
END_TEST

Suite *
suite_integration_limits(void)
{
	return (th_suite("integration_limits", "limits", 120, setup,
	    th_fx_teardown, test_abandoned_job_holds_then_frees_the_slot,
	    NULL));
}
