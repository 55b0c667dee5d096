/*
 * test_launcher.c - `cohort run` end to end: supervision, the failure
 * report, restarts with checkpoints, a SIGKILLed rank at a random point
 * (seeded) with every survivor stopping and no process left behind, and
 * no worker left behind when cohort run itself is SIGKILLed, and --bind
 * (each worker on the CPUs of its slot).
 */
#include <signal.h>
#include <sys/stat.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"
#include "launch.h"

/* Runs `cohort run ARGS -- cohort-fault-worker STEPS STEP_MS` with extra
 * environment; returns the launcher's pid, its output in *out. */
static pid_t
launch(const char *const *run_args, const char *steps, const char *step_ms,
    char *const *env, char *out, size_t outlen)
{
	char *argv[32];
	int n = 0;

	argv[n++] = (char *)th_bin("cohort");
	argv[n++] = "run";
	for (int i = 0; run_args[i] != NULL; i++)
		argv[n++] = (char *)run_args[i];
	argv[n++] = "--";
	argv[n++] = (char *)th_bin("cohort-fault-worker");
	argv[n++] = (char *)steps;
	argv[n++] = (char *)step_ms;
	argv[n] = NULL;
	snprintf(out, outlen, "%s/launcher-%d.out", th_tmpdir(),
	    (int)th_now_ms() % 100000);
	return (th_spawn(argv, env, out));
}

static int
finish(pid_t pid, int timeout_ms)
{
	int st;

	if (!th_wait(pid, timeout_ms, &st)) {
		th_kill(pid);
		ck_abort_msg("cohort run hung");
	}
	return (th_exit_code(st));
}

START_TEST(test_run_all_succeed)
{
	static const char *const args[] = { "-n", "4", NULL };
	char out[256];
	pid_t p = launch(args, "50", "0", NULL, out, sizeof(out));
	char *o;

	ck_assert_int_eq(finish(p, 60000), 0);
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	ck_assert_has(o, "DONE steps=50 restart=0");
	free(o);
}
END_TEST

START_TEST(test_run_failure_report_names_root_cause)
{
	char report[256], out[256];
	const char *args[] = { "-n", "4", "--report", report, NULL };
	char *env[] = { "COHORT_FW_FAIL_AT=2:5", NULL };
	char *o, *j;

	snprintf(report, sizeof(report), "%s/report.json", th_tmpdir());
	ck_assert_int_eq(
	    finish(launch(args, "50", "0", env, out, sizeof(out)), 60000), 7);
	o = th_read_file(out);
	j = th_read_file(report);
	ck_assert_ptr_nonnull(o);
	ck_assert_ptr_nonnull(j);
	ck_assert_has(o, "root cause : rank 2 exited with status 7");
	ck_assert_has(j, "\"root_cause\":{\"rank\":2,\"exit_code\":7");
	free(o);
	free(j);
}
END_TEST

START_TEST(test_run_restart_resumes_from_checkpoint)
{
	static const char *const args[]
	    = { "-n", "4", "--max-restarts", "2", NULL };
	char ck[300], e_ck[320], out[256];
	char *env[] = { e_ck, "COHORT_FW_FAIL_AT=1:7", NULL };
	char *o;

	snprintf(ck, sizeof(ck), "%s/ckpt", th_tmpdir());
	ck_assert_int_eq(mkdir(ck, 0755), 0);
	snprintf(e_ck, sizeof(e_ck), "COHORT_FW_CKPT=%s", ck);
	ck_assert_int_eq(
	    finish(launch(args, "20", "0", env, out, sizeof(out)), 60000), 0);
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	/* the restarted program sees COHORT_RESTART_COUNT=1 and resumes
	 * at step 7: no step lost, none repeated */
	ck_assert_has(o, "DONE steps=20 restart=1 resumed_from=7");
	ck_assert_has(o, "restarting the group (1 of 2)");
	free(o);
}
END_TEST

struct pid_dir {
	const char *dir;
	int n;
	pid_t *pids;
};

/* Reads every rank's pid file (COHORT_FW_PIDDIR) into pids: true when
 * all are present and complete (a worker may be between creating its
 * file and writing its pid, and a pid of 0 would make kill() target our
 * own process group). */
static bool
pids_read(void *arg)
{
	struct pid_dir *d = arg;
	char path[400];

	for (int r = 0; r < d->n; r++) {
		char *s;
		snprintf(path, sizeof(path), "%s/rank%d.pid", d->dir, r);
		if ((s = th_read_file(path)) == NULL)
			return (false);
		d->pids[r] = (pid_t)strtol(s, NULL, 10);
		free(s);
		if (d->pids[r] <= 0)
			return (false);
	}
	return (true);
}

/* Waits (20 s at most) for the pids of n workers writing into dir. */
static void
await_pids(const char *dir, int n, pid_t *pids)
{
	struct pid_dir d = { dir, n, pids };

	ck_assert_msg(
	    th_wait_until(pids_read, &d, 2000, 10), "workers did not start");
}

/* Twenty seeded trials (bench/faults reports the timings). */
START_TEST(test_run_sigkill_random_rank)
{
	unsigned seed = 20261122u + (unsigned)_i;
	int victim = (int)(rand_r(&seed) % 4);
	int delay_ms = 50 + (int)(rand_r(&seed) % 300);
	char dir[300], e_dir[320], report[300], out[256];
	const char *args[] = { "-n", "4", "--report", report, NULL };
	char *env[] = { e_dir, "COHORT_FW_BYTES=65536", NULL };
	pid_t pids[4], launcher;
	char *j;
	int64_t t0;

	snprintf(dir, sizeof(dir), "%s/pids-%d", th_tmpdir(), _i);
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	snprintf(e_dir, sizeof(e_dir), "COHORT_FW_PIDDIR=%s", dir);
	snprintf(report, sizeof(report), "%s/report-%d.json", th_tmpdir(), _i);
	launcher = launch(args, "1000000", "1", env, out, sizeof(out));
	await_pids(dir, 4, pids);
	usleep((useconds_t)delay_ms * 1000);
	t0 = th_now_ms();
	kill(pids[victim], SIGKILL);
	ck_assert_int_eq(finish(launcher, 30000), 137);
	ck_assert_msg(th_now_ms() - t0 < 15000, "took %lld ms",
	    (long long)(th_now_ms() - t0));
	for (int r = 0; r < 4; r++)
		ck_assert_msg(kill(pids[r], 0) != 0,
		    "rank %d (pid %d) remains", r, (int)pids[r]);
	{
		/* every survivor stopped with EPEERLOST naming the victim */
		char *o = th_read_file(out), *line;
		char name[32];
		int named = 0;
		ck_assert_ptr_nonnull(o);
		snprintf(name, sizeof(name), "rank %d ", victim);
		for (line = o;
		     (line = strstr(line, "status=COHORT_EPEERLOST")) != NULL;
		     line++) {
			char *eol = strchr(line, '\n');
			char *hit = strstr(line, name);
			if (hit != NULL && (eol == NULL || hit < eol))
				named++;
		}
		ck_assert_msg(named == 3,
		    "%d of 3 survivors named rank %d:\n%s", named, victim, o);
		free(o);
	}
	j = th_read_file(report);
	ck_assert_ptr_nonnull(j);
	{
		char want[64];
		snprintf(want, sizeof(want), "\"root_cause\":{\"rank\":%d,",
		    victim);
		ck_assert_msg(strstr(j, want) != NULL
		        && strstr(j, "\"signal\":9") != NULL,
		    "victim %d: %s", victim, j);
	}
	free(j);
}
END_TEST

/* Two launchers, one per "node", against one cohortd: ranks node_rank * N
 * + local form one job of 4. */
/* Regression: a rank that stops answering (SIGSTOP) is the root cause;
 * cohort run ends it with its own SIGTERM after the grace period, and
 * the report said "killed by signal 15", as if something else had. */
START_TEST(test_run_report_says_who_stopped_a_hung_rank)
{
	char dir[300], e_dir[320], out[256];
	const char *args[] = { "-n", "3", "--grace", "500", NULL };
	char *env[] = { e_dir, "COHORT_HEARTBEAT_MS=300",
		"COHORT_DEAD_AFTER_MS=1500", NULL };
	pid_t launcher, pids[3], hung;
	char *o;

	snprintf(dir, sizeof(dir), "%s/pids-hung", th_tmpdir());
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	snprintf(e_dir, sizeof(e_dir), "COHORT_FW_PIDDIR=%s", dir);
	launcher = launch(args, "1000000", "1", env, out, sizeof(out));
	await_pids(dir, 3, pids);
	hung = pids[1];
	usleep(200000);
	kill(hung, SIGSTOP);
	ck_assert_int_ne(finish(launcher, 30000), 0);
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	ck_assert_has(
	    o, "root cause : rank 1 stopped by cohort run (SIGTERM)");
	ck_assert_has(o, "no heartbeat");
	ck_assert_msg(strstr(o, "killed by signal 15") == NULL, "%s", o);
	ck_assert_msg(kill(hung, 0) != 0, "rank 1 remains");
	free(o);
}
END_TEST

/* cohort run itself is killed with SIGKILL (an OOM kill, a node agent):
 * no worker outlives it (PR_SET_PDEATHSIG), though each would otherwise
 * run on. */
START_TEST(test_run_workers_die_with_the_launcher)
{
	static const char *const args[] = { "-n", "3", NULL };
	char dir[300], e_dir[320], out[256];
	char *env[] = { e_dir, NULL };
	pid_t launcher, pids[3];

	snprintf(dir, sizeof(dir), "%s/pids-orphans", th_tmpdir());
	ck_assert_int_eq(mkdir(dir, 0755), 0);
	snprintf(e_dir, sizeof(e_dir), "COHORT_FW_PIDDIR=%s", dir);
	launcher = launch(args, "1000000", "1", env, out, sizeof(out));
	await_pids(dir, 3, pids);
	kill(launcher, SIGKILL);
	ck_assert(th_wait(launcher, 5000, NULL));
	for (int r = 0; r < 3; r++)
		ck_assert_msg(th_wait_until(th_pid_gone, &pids[r], 500, 10),
		    "rank %d (pid %d) outlived cohort run", r, (int)pids[r]);
}
END_TEST

/* The demo trainer waits for its peers as long as COHORT_JOIN_TIMEOUT_MS
 * says (it had 120 s of its own: a pod pending longer failed everyone),
 * and says who is missing when that runs out. */
START_TEST(test_train_digits_honours_the_join_timeout)
{
	struct th_coord c;
	char e_url[100], out[300], *o;
	char *argv[]
	    = { (char *)th_bin("train_digits"), "--epochs", "1", NULL };
	char *env[] = { e_url, "COHORT_JOB=digits-jt", "COHORT_RANK=0",
		"COHORT_WORLD_SIZE=2", "COHORT_JOIN_TIMEOUT_MS=1500",
		/* heartbeat < dead-after < operation < rendezvous timeout */
		"COHORT_HEARTBEAT_MS=200", "COHORT_DEAD_AFTER_MS=800",
		"COHORT_TIMEOUT_MS=1000", NULL };
	int64_t t0;
	int st;

	th_coord_start(&c, NULL);
	snprintf(e_url, sizeof(e_url), "COHORT_COORDINATOR=%s", c.url);
	snprintf(out, sizeof(out), "%s/digits.out", th_tmpdir());
	t0 = th_now_ms();
	ck_assert_msg(th_wait(th_spawn(argv, env, out), 30000, &st),
	    "train_digits still waits for its peer after 30 s");
	ck_assert_int_eq(th_coord_stop(&c), 0);
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	ck_assert_msg(strstr(o, "timed out after 1.5") != NULL
	        && strstr(o, "missing rank 1") != NULL,
	    "%s", o);
	free(o);
	ck_assert_int_ne(th_exit_code(st), 0);
	ck_assert_msg(th_now_ms() - t0 < 15000, "took %lld ms",
	    (long long)(th_now_ms() - t0));
}
END_TEST

/* A node's file as cohort run writes it: one event a line. */
static void
write_trace(const char *path, int world, int pid)
{
	FILE *f = fopen(path, "w");

	ck_assert_ptr_nonnull(f);
	fprintf(f,
	    "{\"traceEvents\":[\n"
	    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,"
	    "\"tid\":0,\"args\":{\"name\":\"rank %d\"}},\n"
	    "{\"name\":\"allreduce\",\"ph\":\"X\",\"pid\":%d,\"tid\":1,"
	    "\"ts\":1,\"dur\":2}\n"
	    "],\"displayTimeUnit\":\"ms\",\"otherData\":{\"world_size\":%d,"
	    "\"nodes\":2}}\n",
	    pid, pid, pid, world);
	fclose(f);
}

/* `cohort timeline merge OUT IN...` joins the files of nodes that could
 * not hand theirs to node 0: every event of each, the largest world. */
START_TEST(test_timeline_merge)
{
	char a[300], b[300], out[300], log[300], *o;
	char *argv[] = { (char *)th_bin("cohort"), "timeline", "merge", out, a,
		b, NULL };
	int st;

	snprintf(a, sizeof(a), "%s/a.json", th_tmpdir());
	snprintf(b, sizeof(b), "%s/b.json", th_tmpdir());
	snprintf(out, sizeof(out), "%s/all.json", th_tmpdir());
	snprintf(log, sizeof(log), "%s/merge.out", th_tmpdir());
	write_trace(a, 2, 0);
	write_trace(b, 2, 1);
	ck_assert(th_wait(th_spawn(argv, NULL, log), 10000, &st));
	ck_assert_int_eq(th_exit_code(st), 0);
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	ck_assert_msg(strstr(o, "\"name\":\"rank 0\"") != NULL
	        && strstr(o, "\"name\":\"rank 1\"") != NULL
	        && strstr(o,
	               "\"world_size\":2,\"nodes\":2,\"files\":2,"
	               "\"events\":4")
	            != NULL,
	    "%s", o);
	free(o);
	/* an input that cannot be read fails, naming it; no OUT: usage */
	argv[5] = "/nonexistent/b.json";
	ck_assert(th_wait(th_spawn(argv, NULL, log), 10000, &st));
	ck_assert_int_eq(th_exit_code(st), 1);
	ck_assert(th_file_has(log, "cannot read /nonexistent/b.json"));
	argv[3] = NULL;
	ck_assert(th_wait(th_spawn(argv, NULL, log), 10000, &st));
	ck_assert_int_eq(th_exit_code(st), 2);
	ck_assert(th_file_has(log, "usage: cohort timeline merge OUT IN..."));
}
END_TEST

START_TEST(test_run_two_nodes)
{
	struct th_coord c;
	pid_t p[2];
	char out[2][256];
	char *env[] = { "COHORT_FW_BYTES=4096", NULL };

	th_coord_start(&c, NULL);
	for (int node = 0; node < 2; node++) {
		char nr[8];
		char *argv[] = { (char *)th_bin("cohort"), "run", "--nnodes",
			"2", "--node-rank", nr, "-n", "2", "--coordinator",
			c.url, "--job", "twonodes", "--",
			(char *)th_bin("cohort-fault-worker"), "30", "0",
			NULL };
		snprintf(nr, sizeof(nr), "%d", node);
		snprintf(out[node], sizeof(out[node]), "%s/node%d.out",
		    th_tmpdir(), node);
		p[node] = th_spawn(argv, env, out[node]);
	}
	for (int node = 0; node < 2; node++) {
		char *o;
		ck_assert_int_eq(finish(p[node], 60000), 0);
		o = th_read_file(out[node]);
		ck_assert_ptr_nonnull(o);
		/* each worker checked the allreduce of a 4-rank job */
		ck_assert_msg(strstr(o, "DONE steps=30") != NULL
		        && strstr(o, "sum_ok=1") != NULL
		        && strstr(o, "sum_ok=0") == NULL,
		    "%s", o);
		free(o);
	}
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

/* "0-3,8,10-11": the kernel's list form of set. */
static void
cpu_list(const cpu_set_t *set, char *buf, size_t len)
{
	size_t k = 0;

	buf[0] = '\0';
	for (int c = 0; c < CPU_SETSIZE; c++) {
		int e = c;

		if (!CPU_ISSET(c, set))
			continue;
		while (e + 1 < CPU_SETSIZE && CPU_ISSET(e + 1, set))
			e++;
		k += (size_t)snprintf(
		    buf + k, len - k, "%s%d", k ? "," : "", c);
		if (e > c)
			k += (size_t)snprintf(buf + k, len - k, "-%d", e);
		c = e;
	}
}

/* cohort run --bind cores: worker k runs on its slot's CPUs, one more
 * worker than CPUs (up to 8) so that a slot is shared; --bind none (the
 * default) leaves the launcher's; a bad mode is a usage error. */
START_TEST(test_run_bind_cores)
{
	cpu_set_t have, want;
	char out[256], n[16], line[160], list[128], err[256];
	int ncpu, nproc;
	char *o;

	ck_assert_int_eq(sched_getaffinity(0, sizeof(have), &have), 0);
	ncpu = CPU_COUNT(&have);
	nproc = ncpu < 8 ? ncpu + 1 : 3;
	snprintf(n, sizeof(n), "%d", nproc);
	for (int mode = 0; mode < 2; mode++) {
		char *argv[] = { (char *)th_bin("cohort"), "run", "-n", n,
			"--bind", mode == 0 ? "cores" : "none", "--", "sh",
			"-c",
			"echo \"BIND $COHORT_LOCAL_RANK $(grep "
			"Cpus_allowed_list /proc/self/status | cut -f2)\"",
			NULL };

		snprintf(out, sizeof(out), "%s/bind%d.out", th_tmpdir(), mode);
		ck_assert_int_eq(finish(th_spawn(argv, NULL, out), 60000), 0);
		o = th_read_file(out);
		ck_assert_ptr_nonnull(o);
		for (int k = 0; k < nproc; k++) {
			if (mode == 0)
				ck_assert_int_eq(
				    cohort__launch_cpus("cores", k, nproc,
				        &want, err, sizeof(err)),
				    0);
			cpu_list(
			    mode == 0 ? &want : &have, list, sizeof(list));
			snprintf(line, sizeof(line), "BIND %d %s\n", k, list);
			ck_assert_msg(strstr(o, line) != NULL,
			    "want \"%s\" in:\n%s", line, o);
		}
		free(o);
	}
	{
		char *argv[] = { (char *)th_bin("cohort"), "run", "-n", "2",
			"--bind", "numa", "--", "true", NULL };

		snprintf(out, sizeof(out), "%s/bind-bad.out", th_tmpdir());
		ck_assert_int_eq(finish(th_spawn(argv, NULL, out), 10000), 2);
		ck_assert(th_file_has(out,
		    "cohort run: --bind: unknown CPU binding \"numa\" (none "
		    "or cores)"));
	}
}
END_TEST

Suite *
suite_integration_launcher(void)
{
	Suite *s = suite_create("integration_launcher");
	TCase *tc;

	tc = th_suite_case(s, "run", 120, NULL, NULL, test_run_all_succeed,
	    test_run_failure_report_names_root_cause,
	    test_run_restart_resumes_from_checkpoint, test_run_two_nodes,
	    test_run_report_says_who_stopped_a_hung_rank,
	    test_run_workers_die_with_the_launcher,
	    test_train_digits_honours_the_join_timeout, test_timeline_merge,
	    test_run_bind_cores, NULL);
	tcase_add_loop_test(tc, test_run_sigkill_random_rank, 0, 20);
	return (s);
}
