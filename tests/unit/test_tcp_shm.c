/*
 * test_tcp_shm.c - the tcp backend's same-host shared-memory path
 * (client/backend/host/shm.c): ranks in two processes whose settings
 * disagree still agree on one path and on the results.
 */
#include <sched.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "tcp_fixture.h"
#include "unit_suite.h"

/* Ranks whose settings disagree. Loop 0: rank 1 (another process) has
 * COHORT_TCP_SHM=0, so rank 0's offer is declined and the whole group runs
 * over TCP. Loop 1: the other way round. Loop 2: both use shared memory,
 * rank 1 asks for it only from 64 KiB and adopts rank 0's range instead;
 * both read each other's buffers (cross-memory attach: two processes).
 * Loop 3: rank 1 will not (COHORT_TCP_SHM_CMA_MIN=0), so neither does,
 * and the allreduces stage through the segment. Loop 4: rank 1 runs in
 * another PID namespace (containers of one pod sharing /dev/shm): the
 * numbers they published name other processes, the probes fail, and the
 * group stages. The allreduces agree in every case. */
#define TT_DISAGREE_COUNT ((1u << 20) + 5)

static int tt_disagree_i; /* the loop index, for rank 1 */

/* Three allreduces of 2.0 from rank 1, with its own settings. */
static int
tt_rank1_disagrees(struct tt_fork *f)
{
	size_t count = TT_DISAGREE_COUNT;
	float *buf = malloc(count * sizeof(float));
	struct cohort__op op = tt_sum_op(buf, count, 0);
	struct cohort__host *t;

	setenv("COHORT_TCP_SHM", tt_disagree_i == 0 ? "0" : "1", 1);
	if (tt_disagree_i == 2)
		setenv("COHORT_TCP_SHM_MIN", "65536", 1);
	setenv(
	    "COHORT_TCP_SHM_CMA_MIN", tt_disagree_i == 3 ? "0" : "1048576", 1);
	if (buf == NULL || tt_fork_init(f, 1) != COHORT_OK)
		return (2);
	t = f->state;
	if ((t->shm != NULL) != (tt_disagree_i >= 2) || t->tune.shm_min != 0)
		return (3);
	if (host_shm_cma(t->shm) != (tt_disagree_i == 2))
		return (5);
	for (size_t i = 0; i < count; i++)
		buf[i] = 2.0f;
	for (int k = 0; k < 3; k++)
		if (tt_fork_run(f, &op, (uint64_t)k + 1) != COHORT_OK)
			return (4);
	cohort__host_backend.fini(f->state);
	return (0);
}

/* Loop 4's rank 1: the same, from the first process of a new PID
 * namespace (getpid() is 1 there). */
static int
tt_rank1_other_pidns(struct tt_fork *f)
{
	pid_t k;
	int st;

	if (unshare(CLONE_NEWPID) != 0)
		return (10);
	if ((k = fork()) < 0)
		return (11);
	if (k == 0)
		_exit(tt_rank1_disagrees(f));
	if (waitpid(k, &st, 0) != k || !WIFEXITED(st))
		return (12);
	return (WEXITSTATUS(st));
}

/* Whether this process may make PID namespaces (root, CAP_SYS_ADMIN). */
static bool
tt_can_unshare_pid(void)
{
	pid_t k = fork();
	int st;

	if (k == 0)
		_exit(unshare(CLONE_NEWPID) == 0 ? 0 : 1);
	return (k > 0 && waitpid(k, &st, 0) == k && WIFEXITED(st)
	    && WEXITSTATUS(st) == 0);
}

START_TEST(test_tcp_shm_settings_disagree)
{
	size_t count = TT_DISAGREE_COUNT;
	struct cohort__op op;
	struct tt_fork f;
	cohort_status rv = COHORT_OK;
	float *buf;
	int status;
	int bad = 0;

	if (_i == 4 && !tt_can_unshare_pid()) {
		printf(
		    "SKIP tcp_shm: no PID namespace for loop 4 (not root)\n");
		return;
	}
	buf = malloc(count * sizeof(float));
	ck_assert(buf != NULL);
	op = tt_sum_op(buf, count, 0);
	tt_disagree_i = _i;
	tt_fork_start(
	    &f, 50, _i == 4 ? tt_rank1_other_pidns : tt_rank1_disagrees);
	setenv("COHORT_TCP_SHM", _i == 1 ? "0" : "1", 1);
	unsetenv("COHORT_TCP_SHM_MIN");
	setenv("COHORT_TCP_SHM_CMA_MIN", "1048576", 1);
	tt_fork_init0(&f);
	unsetenv("COHORT_TCP_SHM");
	unsetenv("COHORT_TCP_SHM_CMA_MIN");
	ck_assert_msg(
	    (((struct cohort__host *)f.state)->shm != NULL) == (_i >= 2),
	    "rank 0: wrong data path");
	ck_assert_msg(
	    host_shm_cma(((struct cohort__host *)f.state)->shm) == (_i == 2),
	    "rank 0: cross-memory attach %s",
	    _i == 2 ? "not used" : "used though rank 1 declined");
	for (size_t i = 0; i < count; i++)
		buf[i] = 1.0f;
	for (int k = 0; k < 3 && rv == COHORT_OK; k++)
		rv = tt_fork_run(&f, &op, (uint64_t)k + 1);
	/* 1 + 2 = 3, then 6, then 12 on both ranks */
	for (size_t i = 0; i < count; i++)
		bad += buf[i] != 12.0f;
	status = tt_fork_end(&f);
	free(buf);
	ck_assert_msg(
	    rv == COHORT_OK, "%s: %s", cohort_status_name(rv), f.err);
	ck_assert_msg(WIFEXITED(status) && WEXITSTATUS(status) == 0,
	    "rank 1 exited with status %d", status);
	ck_assert_int_eq(bad, 0);
}
END_TEST

Suite *suite_tcp_shm(void);

Suite *
suite_tcp_shm(void)
{
	const struct unit_loop loops[]
	    = { { test_tcp_shm_settings_disagree, 5 }, { NULL, 0 } };

	return (unit_suite_loops("tcp_shm", "setup", 60, NULL, loops));
}
