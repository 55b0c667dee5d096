/*
 * cohort-fault-worker - a small training-like loop for launcher and fault
 * tests and for bench/faults. Each step runs one collective (an allreduce
 * of COHORT_FW_BYTES bytes on the data plane, or a barrier when that is 0)
 * and, with COHORT_FW_CKPT=DIR, checkpoints the step number per rank so a
 * restarted group resumes where it stopped.
 *
 *   cohort-fault-worker STEPS [STEP_MS]
 *
 * Environment (besides what libcohort reads):
 *   COHORT_FW_BYTES     allreduce size per step (default 0: barrier)
 *   COHORT_FW_CKPT      checkpoint directory (optional)
 *   COHORT_FW_FAIL_AT   "RANK:STEP": that rank exits 7 at that step, but
 *                       only in the first run (COHORT_RESTART_COUNT=0)
 *   COHORT_FW_SLEEP_AT  "RANK:STEP:MS": that rank sleeps inside the step
 *   COHORT_FW_PIDDIR    write DIR/rankN.pid (fault tests kill by pid)
 *
 * Output: "STEP n" lines on rank 0, "RESULT ..." lines on failure (with
 * at_ms=, the wall clock in ms, for detection times across processes), and
 * "DONE steps=N restart=R resumed_from=S sum_ok=1 checksum=C" at the end,
 * C a step-dependent sum of every result that ranks must agree on.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort/cohort.h"
#include "th_worker.h"

static long
fw_ckpt_read(const char *dir, int rank)
{
	char path[512];
	FILE *f;
	long step = 0;

	snprintf(path, sizeof(path), "%s/rank%d.step", dir, rank);
	if ((f = fopen(path, "r")) == NULL)
		return (0);
	if (fscanf(f, "%ld", &step) != 1)
		step = 0;
	fclose(f);
	return (step);
}

static void
fw_ckpt_write(const char *dir, int rank, long step)
{
	char path[512], tmp[520];
	FILE *f;

	snprintf(path, sizeof(path), "%s/rank%d.step", dir, rank);
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((f = fopen(tmp, "w")) == NULL)
		return;
	fprintf(f, "%ld\n", step);
	fclose(f);
	rename(tmp, path);
}

static int
fw_fail(cohort_client *c, cohort_group *g, const char *what, cohort_status st,
    long step)
{
	char text[1200];

	printf("RESULT %s step=%ld status=%s at_ms=%lld detail=%s\n", what,
	    step, cohort_status_name(st), (long long)tw_wall_ms(),
	    g != NULL && cohort_group_last_error(g)[0]
	        ? cohort_group_last_error(g)
	        : cohort_last_error());
	fflush(stdout);
	snprintf(text, sizeof(text), "%s failed at step %ld: %s", what, step,
	    cohort_status_name(st));
	if (c != NULL && st != COHORT_EPEERLOST && st != COHORT_ENOCOORD)
		(void)cohort_report_failure(c, text, 2000);
	return (3);
}

int
main(int argc, char **argv)
{
	long steps = argc > 1 ? strtol(argv[1], NULL, 10) : 100;
	long step_ms = argc > 2 ? strtol(argv[2], NULL, 10) : 0;
	size_t bytes = (size_t)tw_env_long("COHORT_FW_BYTES", 0);
	const char *ckpt = getenv("COHORT_FW_CKPT");
	long restart = tw_env_long("COHORT_RESTART_COUNT", 0);
	int fail_rank = -1, sleep_rank = -1;
	long fail_step = -1, sleep_step = -1, sleep_ms = 0;
	cohort_client *c = NULL;
	cohort_group *g;
	float *buf = NULL;
	size_t count = bytes / sizeof(float);
	long start = 0;
	int rank, world, sum_ok = 1;
	double checksum = 0;
	cohort_status st;

	if (getenv("COHORT_FW_FAIL_AT") != NULL)
		sscanf(getenv("COHORT_FW_FAIL_AT"), "%d:%ld", &fail_rank,
		    &fail_step);
	if (getenv("COHORT_FW_SLEEP_AT") != NULL)
		sscanf(getenv("COHORT_FW_SLEEP_AT"), "%d:%ld:%ld", &sleep_rank,
		    &sleep_step, &sleep_ms);
	/* 60 s, or COHORT_JOIN_TIMEOUT_MS when a test sets it */
	st = cohort_client_open_env(&c,
	    getenv("COHORT_JOIN_TIMEOUT_MS") != NULL ? COHORT_WAIT_DEFAULT
	                                             : 60000);
	if (st != COHORT_OK)
		return (fw_fail(NULL, NULL, "open", st, 0));
	g = cohort_client_world(c);
	rank = cohort_client_rank(c);
	world = cohort_client_world_size(c);
	if (ckpt != NULL)
		start = fw_ckpt_read(ckpt, rank);
	if (getenv("COHORT_FW_PIDDIR") != NULL) {
		char path[512], tmp[520];
		FILE *pf;
		snprintf(path, sizeof(path), "%s/rank%d.pid",
		    getenv("COHORT_FW_PIDDIR"), rank);
		snprintf(tmp, sizeof(tmp), "%s.tmp", path);
		/* written whole, then renamed: readers never see it empty */
		if ((pf = fopen(tmp, "w")) != NULL) {
			fprintf(pf, "%d\n", (int)getpid());
			fclose(pf);
			(void)rename(tmp, path);
		}
	}
	if (count > 0 && (buf = malloc(count * sizeof(float))) == NULL)
		return (1);

	for (long s = start; s < steps; s++) {
		int64_t t0 = tw_now_ms();
		if (rank == fail_rank && s == fail_step && restart == 0) {
			printf("RESULT injected-exit rank=%d step=%ld\n", rank,
			    s);
			fflush(stdout);
			_exit(7);
		}
		if (rank == sleep_rank && s == sleep_step)
			usleep((useconds_t)sleep_ms * 1000);
		if (count > 0) {
			/* step-dependent values: a rank that skipped or
			 * repeated a step changes the checksum */
			for (size_t i = 0; i < count; i++)
				buf[i] = (float)(rank + 1 + s % 7);
			st = cohort_allreduce(g, buf, buf, count, COHORT_F32,
			    COHORT_SUM, NULL, COHORT_WAIT_DEFAULT);
			if (st != COHORT_OK)
				return (fw_fail(c, g, "allreduce", st, s));
			if (buf[0]
			        != (float)(world * (world + 1) / 2
			            + world * (int)(s % 7))
			    || buf[count - 1] != buf[0])
				sum_ok = 0;
			checksum += (double)buf[0] * (double)(s + 1);
		} else {
			st = cohort_barrier(g, "step", COHORT_WAIT_DEFAULT);
			if (st != COHORT_OK)
				return (fw_fail(c, g, "barrier", st, s));
		}
		if (ckpt != NULL)
			fw_ckpt_write(ckpt, rank, s + 1);
		if (rank == 0) {
			printf("STEP %ld\n", s);
			fflush(stdout);
		}
		while (step_ms > 0 && tw_now_ms() - t0 < step_ms)
			usleep(1000);
	}
	printf("DONE steps=%ld restart=%ld resumed_from=%ld sum_ok=%d "
	       "checksum=%.17g\n",
	    steps, restart, start, sum_ok, checksum);
	free(buf);
	cohort_client_close(c);
	return (sum_ok ? 0 : 1);
}
