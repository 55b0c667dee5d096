/*
 * test_launch.c - the launcher core (strategies/launch.h) that cohort run,
 * cohort bench and cohort_spawn share, with real processes: the
 * environment a child gets, a program that cannot start, the exit status
 * and signal, the stop sequence after a failure (grace, SIGTERM with
 * SIGCONT, SIGKILL for a child that ignores SIGTERM), what counts as a
 * failure, the tie to the parent (a launcher killed with SIGKILL
 * leaves no child behind), and CPU binding (the slices of --bind cores,
 * and a child that runs on the CPUs its spec names).
 */
#include <errno.h>
#include <fcntl.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "check_cohort.h"
#include "launch.h"

/* Starts `sh -c script` with the given variables over ours, stdout into
 * out (if not NULL); returns the start's result. */
static int
lt_sh(struct cohort__proc *p, const char *script, const char *const *vars,
    size_t nv, const char *out, char *err, size_t errlen)
{
	struct cohort__proc_spec spec;
	char *argv[] = { "sh", "-c", (char *)script, NULL };
	char **envp = cohort__launch_env(vars, nv);
	int fd = -1, rv;

	ck_assert_ptr_nonnull(envp);
	if (out != NULL) {
		fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
		ck_assert_int_ge(fd, 0);
	}
	cohort__proc_spec_init(&spec);
	spec.path = "sh";
	spec.argv = argv;
	spec.envp = envp;
	spec.stdout_fd = fd;
	rv = cohort__proc_start(p, &spec, err, errlen);
	free(envp);
	if (fd >= 0)
		close(fd);
	return (rv);
}

/* Waits (bounded) until the group has no running child. */
static void
lt_run(struct cohort__launch *l, int timeout_ms)
{
	int64_t end = cohort__launch_now_ms() + timeout_ms;

	while (cohort__launch_alive(l) > 0) {
		int64_t now = cohort__launch_now_ms();

		ck_assert_msg(now < end, "children still running");
		while (cohort__launch_reap(l, now) >= 0)
			;
		cohort__launch_tick(l, now);
		usleep(2000);
	}
}

START_TEST(test_launch_env_ours_first_inherited_kept)
{
	static const char *const vars[] = { "LT_A=ours", "HOME=/lt-home" };
	struct cohort__proc p[1];
	struct cohort__launch l;
	char out[300], err[256], *o;

	setenv("LT_A", "inherited", 1);
	setenv("LT_B", "kept", 1);
	snprintf(out, sizeof(out), "%s/env.out", th_tmpdir());
	cohort__launch_init(&l, p, 1, 1000, 1000);
	ck_assert_int_eq(lt_sh(&p[0],
	                     "echo A=$LT_A B=$LT_B H=$HOME; "
	                     "env | grep -c '^LT_A='",
	                     vars, 2, out, err, sizeof(err)),
	    0);
	lt_run(&l, 10000);
	ck_assert_int_eq(cohort__launch_code(p[0].status), 0);
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	/* ours win, inherited ones stay, and a name is set once */
	ck_assert_str_eq(o, "A=ours B=kept H=/lt-home\n1\n");
	free(o);
	ck_assert_int_eq(l.first_failed, -1);
}
END_TEST

START_TEST(test_launch_missing_program_said_at_start)
{
	struct cohort__proc p;
	struct cohort__proc_spec spec;
	char *argv[] = { "cohort-no-such-program", NULL };
	char err[256], path[300];
	int fd;

	cohort__proc_spec_init(&spec);
	spec.path = argv[0];
	spec.argv = argv;
	ck_assert_int_eq(
	    cohort__proc_start(&p, &spec, err, sizeof(err)), ENOENT);
	ck_assert_str_eq(err,
	    "cannot start cohort-no-such-program: No such file or directory");
	/* with a path: the exec itself fails, in the child, and is said */
	argv[0] = "/nonexistent/dir/prog";
	spec.path = argv[0];
	ck_assert_int_eq(
	    cohort__proc_start(&p, &spec, err, sizeof(err)), ENOENT);
	ck_assert_str_eq(err,
	    "cannot start /nonexistent/dir/prog: No such file or directory");
	ck_assert(!p.running);
	ck_assert_int_eq(cohort__launch_code(p.status), 127);
	/* a file that is not executable (root too needs an x bit) */
	snprintf(path, sizeof(path), "%s/not-a-program", th_tmpdir());
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
	ck_assert_int_ge(fd, 0);
	close(fd);
	argv[0] = path;
	spec.path = argv[0];
	ck_assert_int_eq(
	    cohort__proc_start(&p, &spec, err, sizeof(err)), EACCES);
	ck_assert_has(err, "Permission denied");
}
END_TEST

START_TEST(test_launch_status_and_signal_described)
{
	struct cohort__proc p[2];
	struct cohort__launch l;
	char err[256], d[128];

	/* no failure handling here: a long grace */
	cohort__launch_init(&l, p, 2, 60000, 1000);
	ck_assert_int_eq(lt_sh(&p[0], "exit 7", NULL, 0, NULL, err, 256), 0);
	ck_assert_int_eq(
	    lt_sh(&p[1], "kill -9 $$", NULL, 0, NULL, err, 256), 0);
	lt_run(&l, 10000);
	ck_assert_int_eq(cohort__launch_code(p[0].status), 7);
	ck_assert_str_eq(cohort__launch_describe(p[0].status, d, sizeof(d)),
	    "exited with status 7");
	ck_assert_int_eq(cohort__launch_code(p[1].status), 137);
	ck_assert_str_eq(cohort__launch_describe(p[1].status, d, sizeof(d)),
	    "killed by signal 9 (Killed)");
	ck_assert(cohort__proc_failed(&p[0]) && cohort__proc_failed(&p[1]));
	ck_assert(l.first_failed == 0 || l.first_failed == 1);
}
END_TEST

/* One child fails; one stops on SIGTERM, one ignores it (SIGKILL after
 * term_ms), one is SIGSTOPped (SIGCONT lets the SIGTERM act). Neither of
 * the stopped ones counts as a failure. */
START_TEST(test_launch_stop_sequence)
{
	struct cohort__proc p[4];
	struct cohort__launch l;
	char err[256];
	int64_t t0, took;

	cohort__launch_init(&l, p, 4, 300, 400);
	ck_assert_int_eq(
	    lt_sh(&p[0], "sleep 0.2; exit 3", NULL, 0, NULL, err, sizeof(err)),
	    0);
	ck_assert_int_eq(
	    lt_sh(&p[1], "exec sleep 60", NULL, 0, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(
	    lt_sh(&p[2], "trap '' TERM; while :; do sleep 0.05; done", NULL, 0,
	        NULL, err, sizeof(err)),
	    0);
	ck_assert_int_eq(
	    lt_sh(&p[3], "exec sleep 60", NULL, 0, NULL, err, sizeof(err)), 0);
	usleep(50000);
	kill(p[3].pid, SIGSTOP);
	t0 = cohort__launch_now_ms();
	lt_run(&l, 10000);
	took = cohort__launch_now_ms() - t0;
	ck_assert_int_eq(l.first_failed, 0);
	ck_assert_int_eq(cohort__launch_code(p[0].status), 3);
	ck_assert(!p[0].stopped);
	/* SIGTERM 300 ms after the failure */
	ck_assert(
	    WIFSIGNALED(p[1].status) && WTERMSIG(p[1].status) == SIGTERM);
	ck_assert(p[1].stopped && !cohort__proc_failed(&p[1]));
	ck_assert(
	    WIFSIGNALED(p[3].status) && WTERMSIG(p[3].status) == SIGTERM);
	/* SIGKILL 400 ms later */
	ck_assert(
	    WIFSIGNALED(p[2].status) && WTERMSIG(p[2].status) == SIGKILL);
	ck_assert(p[2].stopped && p[2].sent_sig == SIGKILL);
	ck_assert(!cohort__proc_failed(&p[2]));
	ck_assert_msg(p[2].end_ms - p[1].end_ms >= 350, "%lld ms",
	    (long long)(p[2].end_ms - p[1].end_ms));
	ck_assert_msg(
	    took >= 800 && took < 5000, "took %lld ms", (long long)took);
}
END_TEST

/* With term_ms < 0 (cohort_spawn, cohort bench) SIGKILL ends the grace;
 * a caller's own stop (a deadline) works without a failure. */
START_TEST(test_launch_kill_after_grace_and_stop_after)
{
	struct cohort__proc p[2];
	struct cohort__launch l;
	char err[256];

	cohort__launch_init(&l, p, 2, 200, -1);
	ck_assert_int_eq(
	    lt_sh(&p[0], "exit 1", NULL, 0, NULL, err, sizeof(err)), 0);
	ck_assert_int_eq(
	    lt_sh(&p[1], "exec sleep 60", NULL, 0, NULL, err, sizeof(err)), 0);
	lt_run(&l, 10000);
	ck_assert(
	    WIFSIGNALED(p[1].status) && WTERMSIG(p[1].status) == SIGKILL);

	cohort__launch_init(&l, p, 1, 60000, -1);
	ck_assert_int_eq(
	    lt_sh(&p[0], "exec sleep 60", NULL, 0, NULL, err, sizeof(err)), 0);
	cohort__launch_stop_after(&l, cohort__launch_now_ms(), 0);
	lt_run(&l, 10000);
	ck_assert(
	    WIFSIGNALED(p[0].status) && WTERMSIG(p[0].status) == SIGKILL);
	ck_assert_int_eq(l.first_failed, -1);
}
END_TEST

static int
lt_fn(void *arg)
{
	return (*(int *)arg);
}

START_TEST(test_launch_function_child)
{
	static int vals[] = { 0, 5, 256 };
	static const int want[] = { 0, 5, 1 };

	for (int i = 0; i < 3; i++) {
		struct cohort__proc p[1];
		struct cohort__launch l;
		struct cohort__proc_spec spec;
		char err[128];

		cohort__launch_init(&l, p, 1, 1000, 1000);
		cohort__proc_spec_init(&spec);
		spec.fn = lt_fn;
		spec.arg = &vals[i];
		ck_assert_int_eq(
		    cohort__proc_start(&p[0], &spec, err, sizeof(err)), 0);
		lt_run(&l, 10000);
		/* 256 is not 0 modulo the exit status: still a failure */
		ck_assert_int_eq(cohort__launch_code(p[0].status), want[i]);
	}
}
END_TEST

/* A launcher (here a forked process of the test) starts a child with the
 * core and is killed with SIGKILL: the child gets its parent-death signal
 * and ends, whatever it was doing. */
START_TEST(test_launch_child_dies_with_its_launcher)
{
	int fds[2];
	pid_t child = 0;
	pid_t launcher;

	ck_assert_int_eq(pipe(fds), 0);
	if ((launcher = fork()) == 0) {
		struct cohort__proc p;
		char err[256];

		close(fds[0]);
		/* ignores SIGTERM: only the death signal (SIGKILL) ends it */
		if (lt_sh(&p, "trap '' TERM; exec sleep 60", NULL, 0, NULL,
		        err, sizeof(err))
		    != 0)
			_exit(2);
		if (write(fds[1], &p.pid, sizeof(p.pid)) != sizeof(p.pid))
			_exit(3);
		pause();
		_exit(0);
	}
	close(fds[1]);
	ck_assert_int_eq(read(fds[0], &child, sizeof(child)), sizeof(child));
	close(fds[0]);
	ck_assert_int_gt(child, 0);
	ck_assert(!th_pid_gone(&child));
	kill(launcher, SIGKILL);
	ck_assert(th_wait(launcher, 5000, NULL));
	ck_assert_msg(th_wait_until(th_pid_gone, &child, 500, 10),
	    "child %d outlived its launcher", child);
}
END_TEST

/* This process's CPUs in ascending order; their count. */
static int
lt_cpus(int *cpus)
{
	cpu_set_t have;
	int n = 0;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(have), &have), 0);
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &have))
			cpus[n++] = c;
	return (n);
}

/* --bind cores: with as many slots as CPUs or fewer, the slices are
 * disjoint, contiguous in the CPU order, cover every CPU and differ in
 * size by at most one (the larger first); with more slots than CPUs each
 * slot has one CPU, slot i the same as slot i % CPUs. "none" does not
 * bind; anything else is refused with a message. */
START_TEST(test_launch_cpus_slices)
{
	static int cpus[CPU_SETSIZE];
	int ncpu = lt_cpus(cpus);
	char err[256];
	cpu_set_t set, again;

	ck_assert_int_ge(ncpu, 1);
	for (int nslots = 1; nslots <= ncpu + 3; nslots++) {
		int next = 0, prev_len = -1;

		for (int slot = 0; slot < nslots; slot++) {
			int len;

			err[0] = '\0';
			ck_assert_int_eq(cohort__launch_cpus("cores", slot,
			                     nslots, &set, err, sizeof(err)),
			    0);
			len = CPU_COUNT(&set);
			if (nslots > ncpu) {
				ck_assert_int_eq(len, 1);
				ck_assert(CPU_ISSET(cpus[slot % ncpu], &set));
				continue;
			}
			ck_assert_int_ge(len, ncpu / nslots);
			ck_assert_int_le(len, ncpu / nslots + 1);
			if (prev_len >= 0)
				ck_assert_int_le(len, prev_len);
			prev_len = len;
			for (int i = 0; i < len; i++)
				ck_assert_msg(CPU_ISSET(cpus[next + i], &set),
				    "slot %d of %d lacks CPU %d", slot, nslots,
				    cpus[next + i]);
			next += len;
		}
		if (nslots <= ncpu)
			ck_assert_int_eq(next, ncpu);
	}
	/* the same slot, the same CPUs (a restarted worker's) */
	ck_assert_int_eq(
	    cohort__launch_cpus("cores", 0, 2, &set, err, sizeof(err)), 0);
	ck_assert_int_eq(
	    cohort__launch_cpus("cores", 0, 2, &again, err, sizeof(err)), 0);
	ck_assert(CPU_EQUAL(&set, &again));
	ck_assert_int_eq(
	    cohort__launch_cpus("none", 0, 2, &set, err, sizeof(err)), ENOENT);
	ck_assert_int_eq(
	    cohort__launch_cpus(NULL, 0, 2, &set, err, sizeof(err)), ENOENT);
	ck_assert_int_eq(
	    cohort__launch_cpus("numa", 0, 2, &set, err, sizeof(err)), EINVAL);
	ck_assert_has(err, "unknown CPU binding \"numa\" (none or cores)");
	ck_assert_int_eq(
	    cohort__launch_cpus("cores", 2, 2, &set, err, sizeof(err)),
	    EINVAL);
}
END_TEST

/* A child started with spec.cpus runs there (the kernel's own view, in
 * /proc/self/status), one without on the launcher's CPUs. */
START_TEST(test_launch_child_runs_on_its_cpus)
{
	static int cpus[CPU_SETSIZE];
	int ncpu = lt_cpus(cpus);
	struct cohort__proc_spec spec;
	struct cohort__proc p;
	char *argv[]
	    = { "sh", "-c", "grep Cpus_allowed_list /proc/self/status", NULL };
	char out[256], want[64], err[256];
	cpu_set_t one;
	char *o;
	int fd;

	snprintf(out, sizeof(out), "%s/cpus.out", th_tmpdir());
	fd = open(out, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644);
	ck_assert_int_ge(fd, 0);
	CPU_ZERO(&one);
	CPU_SET(cpus[ncpu - 1], &one);
	cohort__proc_spec_init(&spec);
	spec.path = "sh";
	spec.argv = argv;
	spec.stdout_fd = fd;
	spec.cpus = &one;
	ck_assert_int_eq(cohort__proc_start(&p, &spec, err, sizeof(err)), 0);
	close(fd);
	ck_assert(th_wait(p.pid, 10000, NULL));
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	snprintf(
	    want, sizeof(want), "Cpus_allowed_list:\t%d\n", cpus[ncpu - 1]);
	ck_assert_msg(strstr(o, want) != NULL, "got %s, want %s", o, want);
	free(o);
}
END_TEST

Suite *suite_launch(void);

Suite *
suite_launch(void)
{
	return (th_suite("launch", "core", 60, NULL, NULL,
	    test_launch_env_ours_first_inherited_kept,
	    test_launch_missing_program_said_at_start,
	    test_launch_status_and_signal_described, test_launch_stop_sequence,
	    test_launch_kill_after_grace_and_stop_after,
	    test_launch_function_child,
	    test_launch_child_dies_with_its_launcher, test_launch_cpus_slices,
	    test_launch_child_runs_on_its_cpus, NULL));
}
