/*
 * harness.c - process, port and polling helpers for the test suites.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <netinet/in.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mount.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "check_cohort.h"
#include "cohort_common.h" /* cohort__now_ms */
#include "launch.h" /* cohort__launch_code */

extern char **environ;

int64_t
th_now_ms(void)
{
	return (cohort__now_ms());
}

const char *
th_bindir(void)
{
	const char *b = getenv("COHORT_BIN");

	return (b != NULL && *b != '\0' ? b : "build/bin");
}

const char *
th_bin(const char *name)
{
	static char paths[16][512];
	static int next;
	char *p = paths[next++ % 16];

	snprintf(p, 512, "%s/%s", th_bindir(), name);
	return (p);
}

int
th_free_port(void)
{
	static int counter;

	for (int attempt = 0; attempt < 200; attempt++) {
		struct sockaddr_in sa;
		socklen_t len = sizeof(sa);
		int fd = socket(AF_INET, SOCK_STREAM, 0);
		int port;

		ck_assert_int_ge(fd, 0);
		memset(&sa, 0, sizeof(sa));
		sa.sin_family = AF_INET;
		sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
		/* Spread tests over a range by pid so parallel runs rarely
		 * collide; fall back to the kernel's choice. */
		port = attempt < 100
		    ? 20000 + (int)((getpid() * 7 + counter++ * 13) % 20000)
		    : 0;
		sa.sin_port = htons((uint16_t)port);
		if (bind(fd, (struct sockaddr *)&sa, sizeof(sa)) == 0
		    && getsockname(fd, (struct sockaddr *)&sa, &len) == 0) {
			port = ntohs(sa.sin_port);
			close(fd);
			return (port);
		}
		close(fd);
	}
	ck_abort_msg("no free loopback port");
	return (-1);
}

pid_t
th_spawn(char *const argv[], char *const env[], const char *out_path)
{
	pid_t pid;
	size_t n = 0, m = 0;
	char **envp;

	while (environ[n] != NULL)
		n++;
	while (env != NULL && env[m] != NULL)
		m++;
	envp = calloc(n + m + 1, sizeof(char *));
	ck_assert_ptr_nonnull(envp);
	/* Extra entries first: getenv() returns the first match. */
	for (size_t i = 0; i < m; i++)
		envp[i] = env[i];
	for (size_t i = 0; i < n; i++)
		envp[m + i] = environ[i];
	pid = fork();
	ck_assert_int_ge(pid, 0);
	if (pid == 0) {
		if (out_path != NULL) {
			int fd = open(
			    out_path, O_WRONLY | O_CREAT | O_TRUNC, 0644);
			if (fd >= 0) {
				dup2(fd, 1);
				dup2(fd, 2);
				close(fd);
			}
		}
		execve(argv[0], argv, envp);
		fprintf(stderr, "exec %s: %s\n", argv[0], strerror(errno));
		_exit(127);
	}
	free(envp);
	return (pid);
}

bool
th_wait(pid_t pid, int timeout_ms, int *status)
{
	int64_t end = th_now_ms() + timeout_ms;
	int st;

	for (;;) {
		pid_t r = waitpid(pid, &st, WNOHANG);
		if (r == pid) {
			if (status != NULL)
				*status = st;
			return (true);
		}
		if (r < 0 && errno != EINTR)
			return (false);
		if (th_now_ms() >= end)
			return (false);
		usleep(2000);
	}
}

void
th_kill(pid_t pid)
{
	if (pid <= 0)
		return;
	if (kill(pid, SIGKILL) == 0)
		(void)th_wait(pid, 5000, NULL);
}

int
th_exit_code(int status)
{
	return (cohort__launch_code(status));
}

int
th_tcp_connect(int port)
{
	struct sockaddr_in sa;
	int fd = socket(AF_INET, SOCK_STREAM, 0);

	if (fd < 0)
		return (-1);
	memset(&sa, 0, sizeof(sa));
	sa.sin_family = AF_INET;
	sa.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	sa.sin_port = htons((uint16_t)port);
	if (connect(fd, (struct sockaddr *)&sa, sizeof(sa)) != 0) {
		int e = errno;

		close(fd);
		errno = e;
		return (-1);
	}
	return (fd);
}

int
th_tcp_connect_ok(int port)
{
	int fd = th_tcp_connect(port);

	ck_assert_msg(
	    fd >= 0, "connect to 127.0.0.1:%d: %s", port, strerror(errno));
	return (fd);
}

bool
th_port_open(int port)
{
	int fd = th_tcp_connect(port);

	if (fd < 0)
		return (false);
	close(fd);
	return (true);
}

void
th_coord_start(struct th_coord *c, const char *const *extra_args)
{
	th_coord_start_under(c, NULL, extra_args);
}

void
th_coord_start_under(struct th_coord *c, const char *const *prefix,
    const char *const *extra_args)
{
	char *argv[48];
	int n = 0;
	int64_t end;

	for (int attempt = 0; attempt < 5; attempt++) {
		c->port = th_free_port();
		snprintf(
		    c->url, sizeof(c->url), "tcp://127.0.0.1:%d", c->port);
		snprintf(c->log, sizeof(c->log), "%s/cohortd-%d.log",
		    th_tmpdir(), c->port);
		n = 0;
		for (int i = 0; prefix != NULL && prefix[i] != NULL && n < 8;
		     i++)
			argv[n++] = (char *)prefix[i];
		/* COHORT_TEST_VALGRIND=1: run cohortd under memcheck; a leak
		 * or memory error makes th_coord_stop return 99. */
		if (getenv("COHORT_TEST_VALGRIND") != NULL) {
			static char vlog[300];
			snprintf(
			    vlog, sizeof(vlog), "--log-file=%s.vg", c->log);
			argv[n++] = "/usr/bin/valgrind";
			argv[n++] = "--leak-check=full";
			argv[n++]
			    = "--errors-for-leak-kinds=definite,indirect";
			argv[n++] = "--error-exitcode=99";
			argv[n++] = vlog;
		}
		argv[n++] = (char *)th_bin("cohortd");
		argv[n++] = "--listen";
		argv[n++] = c->url;
		for (int i = 0;
		     extra_args != NULL && extra_args[i] != NULL && n < 46;
		     i++)
			argv[n++] = (char *)extra_args[i];
		argv[n] = NULL;
		c->pid = th_spawn(argv, NULL, c->log);
		end = th_now_ms()
		    + (getenv("COHORT_TEST_VALGRIND") ? 30000 : 10000);
		while (th_now_ms() < end) {
			int st;
			if (th_port_open(c->port))
				return;
			if (th_wait(c->pid, 0, &st)) {
				c->pid = -1;
				break; /* died: port taken? try another */
			}
			usleep(5000);
		}
		if (c->pid > 0)
			th_kill(c->pid);
	}
	ck_abort_msg("cohortd did not start (log: %s)", c->log);
}

int
th_coord_stop(struct th_coord *c)
{
	int st;

	if (c->pid <= 0)
		return (-1);
	kill(c->pid, SIGTERM);
	if (!th_wait(
	        c->pid, getenv("COHORT_TEST_VALGRIND") ? 60000 : 10000, &st)) {
		th_kill(c->pid);
		c->pid = -1;
		return (-1);
	}
	c->pid = -1;
	return (th_exit_code(st));
}

void
th_member_options(
    cohort_options *o, const char *url, const char *job, int rank, int world)
{
	cohort_options_init(o);
	o->coordinator = url;
	o->job = job;
	o->token = "tok";
	o->rank = rank;
	o->world_size = world;
}

bool
th_wait_until(bool (*cond)(void *), void *arg, int tries, int delay_ms)
{
	for (int i = 0; i < tries; i++) {
		if (cond(arg))
			return (true);
		usleep((useconds_t)delay_ms * 1000);
	}
	return (cond(arg));
}

bool
th_pid_gone(void *pid)
{
	char path[64], *s, *rp;
	bool gone;

	snprintf(path, sizeof(path), "/proc/%d/stat", (int)*(pid_t *)pid);
	if ((s = th_read_file(path)) == NULL)
		return (true);
	/* pid (comm) state ...: a zombie has ended, its reaper is late */
	rp = strrchr(s, ')');
	gone = rp != NULL && rp[1] == ' ' && rp[2] == 'Z';
	free(s);
	return (gone);
}

char *
th_read_file(const char *path)
{
	FILE *f = fopen(path, "rb");
	char *buf;
	long len;

	if (f == NULL)
		return (NULL);
	fseek(f, 0, SEEK_END);
	len = ftell(f);
	fseek(f, 0, SEEK_SET);
	buf = malloc((size_t)len + 1);
	if (buf != NULL) {
		size_t got = fread(buf, 1, (size_t)len, f);
		buf[got] = '\0';
	}
	fclose(f);
	return (buf);
}

static char th_dir[256];

/* tmpfs mounts of this process, undone at exit (a failed assertion
 * exits the test's process): never left behind. */
#define TH_MAX_MOUNTS 8
static char th_mounts[TH_MAX_MOUNTS][256];
static int th_nmounts;
static pid_t th_mount_owner;
static pid_t th_runner;

/* Mounts are named after the test runner: a test's process that ends
 * with a failed assertion (_exit) cannot unmount its own, the runner
 * does (th_tmpfs_cleanup). */
static void
th_mount_source(char *buf, size_t len)
{
	snprintf(buf, len, "cohort-test-%d",
	    (int)(th_runner != 0 ? th_runner : getpid()));
}

void
th_set_runner(void)
{
	th_runner = getpid();
}

void
th_tmpfs_cleanup(void)
{
	char src[64], line[1024], dev[256], mp[512];
	FILE *fp = fopen("/proc/self/mounts", "r");

	if (fp == NULL)
		return;
	th_mount_source(src, sizeof(src));
	while (fgets(line, sizeof(line), fp) != NULL)
		if (sscanf(line, "%255s %511s", dev, mp) == 2
		    && strcmp(dev, src) == 0 && umount2(mp, MNT_DETACH) == 0) {
			fprintf(stderr,
			    "cohort-tests: unmounted %s, left by a failed "
			    "test\n",
			    mp);
			(void)rmdir(mp);
		}
	fclose(fp);
}

static void
th_umount_all(void)
{
	if (th_mount_owner != getpid())
		return;
	while (th_nmounts > 0)
		(void)umount2(th_mounts[--th_nmounts], MNT_DETACH);
}

bool
th_tmpfs_mount(const char *dir, const char *opts)
{
	char src[64];

	if (geteuid() != 0)
		return (false);
	if (th_mount_owner != getpid()) {
		th_nmounts = 0;
		th_mount_owner = getpid();
		atexit(th_umount_all);
	}
	th_mount_source(src, sizeof(src));
	if (th_nmounts == TH_MAX_MOUNTS || strlen(dir) >= sizeof(th_mounts[0])
	    || mount(src, dir, "tmpfs", 0, opts) != 0)
		return (false);
	snprintf(th_mounts[th_nmounts++], sizeof(th_mounts[0]), "%s", dir);
	return (true);
}

void
th_tmpfs_remount(const char *dir, bool ro, const char *opts)
{
	ck_assert_msg(mount("cohort-test", dir, "tmpfs",
	                  MS_REMOUNT | (ro ? MS_RDONLY : 0), opts)
	        == 0,
	    "remount %s: %s", dir, strerror(errno));
}

void
th_tmpfs_umount(const char *dir)
{
	for (int i = 0; i < th_nmounts; i++) {
		if (strcmp(th_mounts[i], dir) != 0)
			continue;
		ck_assert_msg(umount2(dir, 0) == 0, "umount %s: %s", dir,
		    strerror(errno));
		memmove(&th_mounts[i], &th_mounts[i + 1],
		    (size_t)(th_nmounts - i - 1) * sizeof(th_mounts[0]));
		th_nmounts--;
		return;
	}
	ck_abort_msg("%s is not mounted by this test", dir);
}

static void
th_cleanup(void)
{
	char cmd[300];

	th_umount_all();

	if (th_dir[0] != '\0' && getenv("COHORT_TEST_KEEP") == NULL) {
		snprintf(cmd, sizeof(cmd), "rm -rf '%s'", th_dir);
		if (system(cmd) != 0) {
			/* best effort */
		}
	}
}

const char *
th_tmpdir(void)
{
	static pid_t owner;

	if (th_dir[0] == '\0' || owner != getpid()) {
		snprintf(th_dir, sizeof(th_dir), "/tmp/cohort-test-XXXXXX");
		ck_assert_ptr_nonnull(mkdtemp(th_dir));
		owner = getpid();
		atexit(th_cleanup);
	}
	return (th_dir);
}

struct th_coord th_fx_coord;

void
th_fx_setup(void)
{
	th_coord_start(&th_fx_coord, NULL);
}

void
th_fx_teardown(void)
{
	ck_assert_int_eq(th_coord_stop(&th_fx_coord), 0);
}

bool
th_file_has(const char *path, const char *text)
{
	char *s = th_read_file(path);
	bool has = s != NULL && strstr(s, text) != NULL;

	free(s);
	return (has);
}

bool
th_coord_log_has(const struct th_coord *c, const char *text)
{
	return (th_file_has(c->log, text));
}

static TCase *
th_case_add(Suite *s, const char *name, int timeout_s, SFun setup,
    SFun teardown, va_list ap)
{
	TCase *tc = tcase_create(name);
	const TTest *t;

	if (setup != NULL || teardown != NULL)
		tcase_add_checked_fixture(tc, setup, teardown);
	if (timeout_s > 0)
		tcase_set_timeout(tc, timeout_s);
	while ((t = va_arg(ap, const TTest *)) != NULL)
		tcase_add_test(tc, t);
	suite_add_tcase(s, tc);
	return (tc);
}

TCase *
th_suite_case(
    Suite *s, const char *name, int timeout_s, SFun setup, SFun teardown, ...)
{
	TCase *tc;
	va_list ap;

	va_start(ap, teardown);
	tc = th_case_add(s, name, timeout_s, setup, teardown, ap);
	va_end(ap);
	return (tc);
}

Suite *
th_suite(const char *name, const char *case_name, int timeout_s, SFun setup,
    SFun teardown, ...)
{
	Suite *s = suite_create(name);
	va_list ap;

	va_start(ap, teardown);
	th_case_add(s, case_name, timeout_s, setup, teardown, ap);
	va_end(ap);
	return (s);
}

bool
th_workers_ready(void *arg)
{
	struct th_workers *w = arg;

	for (int r = 0; r < w->n; r++)
		if (!th_worker_output_has(w, r, "READY"))
			return (false);
	return (true);
}

void
th_workers_await_ready(struct th_workers *w, int tries, int delay_ms)
{
	ck_assert_msg(th_wait_until(th_workers_ready, w, tries, delay_ms),
	    "workers never got ready");
}

int64_t
th_signal_when_ready(struct th_workers *w, pid_t pid, int sig, int settle_ms)
{
	int64_t t;

	th_workers_await_ready(w, 3000, 10);
	usleep((useconds_t)settle_ms * 1000);
	t = th_now_ms();
	ck_assert_msg(
	    kill(pid, sig) == 0, "kill %d: %s", (int)pid, strerror(errno));
	return (t);
}

void
th_workers_start(struct th_workers *w, const struct th_coord *c,
    const char *job, const char *token, int n, const char *scenario,
    const char *arg, const char *const *extra_env)
{
	th_workers_start_bin(w, c, "cohort-test-worker", job, token, n,
	    scenario, arg, extra_env);
}

void
th_workers_start_bin(struct th_workers *w, const struct th_coord *c,
    const char *bin, const char *job, const char *token, int n,
    const char *scenario, const char *arg, const char *const *extra_env)
{
	ck_assert_int_le(n, TH_MAX_WORKERS);
	w->n = n;
	for (int r = 0; r < n; r++) {
		char e_coord[128], e_job[160], e_tok[160], e_rank[32],
		    e_world[32];
		char *env[24];
		char *argv[4];
		int k = 0;

		snprintf(
		    e_coord, sizeof(e_coord), "COHORT_COORDINATOR=%s", c->url);
		snprintf(e_job, sizeof(e_job), "COHORT_JOB=%s", job);
		snprintf(e_tok, sizeof(e_tok), "COHORT_TOKEN=%s",
		    token ? token : "");
		snprintf(e_rank, sizeof(e_rank), "COHORT_RANK=%d", r);
		snprintf(e_world, sizeof(e_world), "COHORT_WORLD_SIZE=%d", n);
		/* extra entries first: the first match wins */
		for (int i = 0;
		     extra_env != NULL && extra_env[i] != NULL && k < 18; i++)
			env[k++] = (char *)extra_env[i];
		env[k++] = e_coord;
		env[k++] = e_job;
		env[k++] = e_tok;
		env[k++] = e_rank;
		env[k++] = e_world;
		env[k] = NULL;
		argv[0] = (char *)th_bin(bin);
		argv[1] = (char *)scenario;
		argv[2] = (char *)arg;
		argv[3] = NULL;
		snprintf(w->out[r], sizeof(w->out[r]), "%s/%s-%d.out",
		    th_tmpdir(), job, r);
		w->status[r] = -1;
		w->pid[r] = th_spawn(argv, env, w->out[r]);
	}
}

int
th_workers_wait(struct th_workers *w, int timeout_ms)
{
	int64_t end = th_now_ms() + timeout_ms;
	int ok = 0;
	bool hung = false;

	for (int r = 0; r < w->n; r++) {
		int st;
		int64_t left = end - th_now_ms();
		if (w->status[r] >= 0) {
			ok += w->status[r] == 0;
			continue;
		}
		if (th_wait(w->pid[r], left > 0 ? (int)left : 0, &st)) {
			w->status[r] = th_exit_code(st);
			ok += w->status[r] == 0;
		} else {
			hung = true;
		}
	}
	if (hung) {
		char msg[512];
		size_t off = 0;
		for (int r = 0; r < w->n; r++) {
			if (w->status[r] < 0) {
				th_kill(w->pid[r]);
				w->status[r] = 137;
				off += (size_t)snprintf(msg + off,
				    off < sizeof(msg) ? sizeof(msg) - off : 0,
				    " %d", r);
			}
		}
		ck_abort_msg("workers hung past %d ms (killed ranks:%s)",
		    timeout_ms, msg);
	}
	return (ok);
}

int
th_workers_run(struct th_workers *w, const struct th_coord *c, const char *job,
    const char *token, int n, const char *scenario, const char *arg,
    const char *const *extra_env, int timeout_ms)
{
	th_workers_start(w, c, job, token, n, scenario, arg, extra_env);
	return (th_workers_wait(w, timeout_ms));
}

unsigned long
th_test_seed(void)
{
	const char *s = getenv("COHORT_TEST_SEED");

	if (s != NULL && s[0] != '\0')
		return (strtoul(s, NULL, 10));
	return ((unsigned long)time(NULL) % 100000);
}

/* Waits for every rank; on a hang, kills them all and fails with the tail
 * of each rank's output (the worker prints a STUCK line naming the case
 * it is blocked in). */
static void
th_workers_wait_dump(struct th_workers *w, int timeout_ms,
    const char *scenario, unsigned long seed)
{
	int64_t end = th_now_ms() + timeout_ms;
	char msg[6000];
	size_t off = 0;
	bool hung = false;

	for (int r = 0; r < w->n; r++) {
		int st;
		int64_t left = end - th_now_ms();

		if (th_wait(w->pid[r], left > 0 ? (int)left : 0, &st))
			w->status[r] = th_exit_code(st);
		else
			hung = true;
	}
	if (!hung)
		return;
	msg[0] = '\0';
	for (int r = 0; r < w->n; r++) {
		char *o;
		size_t len;
		int k;

		if (w->status[r] < 0) {
			th_kill(w->pid[r]);
			w->status[r] = 137;
		}
		o = th_worker_output(w, r);
		len = strlen(o);
		k = snprintf(msg + off, sizeof(msg) - off,
		    "--- rank %d (exit %d):\n%s\n", r, w->status[r],
		    len > 600 ? o + len - 600 : o);
		free(o);
		if (k < 0 || (size_t)k >= sizeof(msg) - off)
			break;
		off += (size_t)k;
	}
	ck_abort_msg("%s (seed %lu) hung past %d ms:\n%s", scenario, seed,
	    timeout_ms, msg);
}

void
th_scenario_expect(const char *bin, const char *job, int n,
    const char *scenario, const char *const *env, int timeout_ms)
{
	struct th_workers w;
	char arg[32];
	unsigned long seed = th_test_seed();

	snprintf(arg, sizeof(arg), "%lu", seed);
	th_workers_start_bin(
	    &w, &th_fx_coord, bin, job, "tok", n, scenario, arg, env);
	th_workers_wait_dump(&w, timeout_ms, scenario, seed);
	for (int r = 0; r < n; r++) {
		char *o = th_worker_output(&w, r);

		ck_assert_msg(w.status[r] == 0 && strstr(o, "failed=0")
		        && strstr(o, "FAIL") == NULL,
		    "%s on %d ranks (seed %lu): rank %d exited %d:\n%.4000s",
		    scenario, n, seed, r, w.status[r], o);
		free(o);
	}
}

char *
th_worker_output(const struct th_workers *w, int r)
{
	char *s = th_read_file(w->out[r]);

	return (s != NULL ? s : strdup("(no output)"));
}

bool
th_worker_output_has(const struct th_workers *w, int r, const char *text)
{
	return (th_file_has(w->out[r], text));
}

void
th_workers_expect(const struct th_workers *w, int nranks, const char *want)
{
	for (int r = 0; r < nranks; r++) {
		char *o = th_worker_output(w, r);

		ck_assert_msg(th_worker_output_has(w, r, want),
		    "rank %d (exit %d) lacks '%s':\n%s", r, w->status[r], want,
		    o);
		free(o);
	}
}

void
th_expect_peer_lost(const struct th_workers *w, int r, const char *o,
    const char *lost, int victim)
{
	char name[32];

	snprintf(name, sizeof(name), "rank %d", victim);
	ck_assert_msg(
	    w->status[r] == 3, "rank %d exit %d: %s", r, w->status[r], o);
	ck_assert_msg(strstr(o, lost) != NULL, "rank %d: %s", r, o);
	ck_assert_msg(strstr(o, name) != NULL,
	    "rank %d: the error does not name %s: %s", r, name, o);
	ck_assert_msg(
	    strstr(o, "RESULT sticky status=COHORT_EPEERLOST") != NULL,
	    "rank %d: the error is not sticky: %s", r, o);
}
