/*
 * test_tcp.c - the tcp backend's mesh setup and connections
 * (client/backend/host/mesh.c): an init that times out names the ranks
 * missing, and a rank SIGKILLed in another process is reported EPEERLOST
 * by name, promptly, in every mode of tcp_fixture.h.
 */
#include <inttypes.h>
#include <signal.h>
#include <string.h>
#include <sys/wait.h>

#include "tcp_fixture.h"
#include "unit_suite.h"

START_TEST(test_tcp_init_timeout_names_missing)
{
	struct tt_store s;
	struct tt_group g;
	struct cohort__group_desc d;
	char err[TT_ERRLEN] = "";
	void *state = NULL;
	int64_t t0;
	cohort_status rv;

	tt_store_init(&s);
	tt_group_setup(&g, &s, 3, "lonely", NULL);
	/* Rank 2 alone: it accepts, and ranks 0 and 1 never come. */
	tt_desc(&g, 2, &d);
	t0 = cohort__now_ms();
	rv = cohort__host_backend.init(
	    &d, &state, err, sizeof(err), cohort__now_ms() + 300);
	ck_assert_int_eq(rv, COHORT_ETIMEDOUT);
	ck_assert_msg(strstr(err, "100") && strstr(err, "101"), "%s", err);
	ck_assert_int_lt(cohort__now_ms() - t0, 2000);
	/* Rank 0 alone: waits for rank 1's address, then is aborted. */
	tt_desc(&g, 0, &d);
	atomic_store(&g.abort_flag[0], 1);
	rv = cohort__host_backend.init(
	    &d, &state, err, sizeof(err), cohort__now_ms() + 300);
	ck_assert(rv == COHORT_EABORTED || rv == COHORT_ETIMEDOUT);
	tt_store_fini(&s);
}
END_TEST

struct tt_killer {
	pid_t pid;
	atomic_int *iter;
	int64_t killed_at;
};

static bool
tt_iter_ge3(void *arg)
{
	return (atomic_load((atomic_int *)arg) >= 3);
}

static void *
tt_kill_thread(void *arg)
{
	struct tt_killer *k = arg;

	th_wait_until(tt_iter_ge3, k->iter, 1000, 5);
	k->killed_at = cohort__now_ms();
	kill(k->pid, SIGKILL);
	return (NULL);
}

/* Rank 1 of test_tcp_sigkilled_rank: allreduces until killed (bounded). */
static int
tt_rank1_until_killed(struct tt_fork *f)
{
	size_t count = 4u << 20;
	float *buf = calloc(count, sizeof(float));
	struct cohort__op op = tt_sum_op(buf, count, 0);

	if (tt_fork_init(f, 1) != COHORT_OK)
		return (2);
	for (int i = 0; i < 100000; i++)
		if (tt_fork_run(f, &op, (uint64_t)i + 1) != COHORT_OK)
			return (3);
	return (0);
}

START_TEST(test_tcp_sigkilled_rank)
{
	size_t count = 4u << 20;
	struct cohort__op op;
	struct tt_fork f;
	struct tt_killer k;
	atomic_int iter;
	pthread_t th;
	cohort_status rv = COHORT_OK;
	float *buf;
	int status;

	tt_set_mode(_i);
	buf = calloc(count, sizeof(float));
	op = tt_sum_op(buf, count, 0);
	tt_fork_start(&f, 40, tt_rank1_until_killed);
	tt_fork_init0(&f);
	ck_assert_msg(
	    (((struct cohort__host *)f.state)->shm != NULL) == (_i != TT_PURE),
	    "%s: wrong data path", tt_mode_name[_i]);
	unsetenv("COHORT_TCP_SHM");
	unsetenv("COHORT_TCP_SHM_MIN");
	unsetenv("COHORT_TCP_SHM_CMA_MIN");
	atomic_init(&iter, 0);
	k.pid = f.pid;
	k.iter = &iter;
	k.killed_at = 0;
	ck_assert_int_eq(pthread_create(&th, NULL, tt_kill_thread, &k), 0);
	for (int i = 0; i < 100000; i++) {
		if ((rv = tt_fork_run(&f, &op, (uint64_t)i + 1)) != COHORT_OK)
			break;
		atomic_store(&iter, i + 1);
	}
	pthread_join(th, NULL);
	status = tt_fork_end(&f);
	free(buf);
	ck_assert_msg(
	    rv == COHORT_EPEERLOST, "%s: %s", cohort_status_name(rv), f.err);
	ck_assert_has(f.err, "rank 41");
	ck_assert_msg(cohort__now_ms() - k.killed_at < 3000,
	    "noticed %" PRId64 " ms after the kill",
	    cohort__now_ms() - k.killed_at);
	ck_assert(WIFSIGNALED(status) && WTERMSIG(status) == SIGKILL);
}
END_TEST

Suite *suite_tcp(void);

Suite *
suite_tcp(void)
{
	const TTest *tests[] = { test_tcp_init_timeout_names_missing, NULL };
	const struct unit_loop loops[]
	    = { { test_tcp_sigkilled_rank, TT_NMODES }, { NULL, 0 } };

	return (unit_suite_loops("tcp", "mesh", 60, tests, loops));
}
