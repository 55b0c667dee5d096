/*
 * launch.c - the launcher core (launch.h): start, tie to the parent, stop
 * after a failure, reap.
 *
 * A program child is fork + execve with a close-on-exec pipe back to the
 * parent: if execve fails the child writes its errno there and exits, so
 * the parent reports "cannot start PROG: ..." at once, as posix_spawn
 * does; a successful exec closes the pipe and the parent reads nothing.
 * The program is looked up in PATH by the parent before fork (execvp's
 * lookup is not async-signal-safe).
 *
 * References: torch.multiprocessing (prctl PR_SET_PDEATHSIG in spawned
 * workers), torchrun's PContext (SIGTERM, then SIGKILL after a timeout),
 * glibc's posix_spawn (the exec-error pipe).
 */
#include <dirent.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/prctl.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"

extern char **environ;

int64_t
cohort__launch_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

int
cohort__threads_named(const char *name, bool prefix)
{
	DIR *d = opendir("/proc/self/task");
	struct dirent *e;
	size_t len = strlen(name);
	int n = 0;

	if (d == NULL)
		return (-1);
	while ((e = readdir(d)) != NULL) {
		char path[300], comm[64] = "";
		FILE *f;

		if (e->d_name[0] == '.')
			continue;
		snprintf(
		    path, sizeof(path), "/proc/self/task/%s/comm", e->d_name);
		if ((f = fopen(path, "r")) == NULL)
			continue;
		if (fgets(comm, sizeof(comm), f) != NULL)
			comm[strcspn(comm, "\n")] = '\0';
		fclose(f);
		n += prefix ? strncmp(comm, name, len) == 0
		            : strcmp(comm, name) == 0;
	}
	closedir(d);
	return (n);
}

void
cohort__proc_spec_init(struct cohort__proc_spec *s)
{
	memset(s, 0, sizeof(*s));
	s->stdout_fd = -1;
	s->stderr_fd = -1;
}

int
cohort__launch_cpus(const char *mode, int slot, int nslots, cpu_set_t *out,
    char *err, size_t errlen)
{
	cpu_set_t have;
	int cpus[CPU_SETSIZE], ncpu = 0, nslices, slice, first, len;

	if (mode == NULL || mode[0] == '\0' || strcmp(mode, "none") == 0)
		return (ENOENT);
	if (strcmp(mode, "cores") != 0) {
		snprintf(err, errlen,
		    "unknown CPU binding \"%s\" (none or cores)", mode);
		return (EINVAL);
	}
	if (nslots < 1 || slot < 0 || slot >= nslots) {
		snprintf(
		    err, errlen, "CPU binding: slot %d of %d", slot, nslots);
		return (EINVAL);
	}
	CPU_ZERO(&have);
	if (sched_getaffinity(0, sizeof(have), &have) != 0) {
		int e = errno;

		snprintf(err, errlen, "CPU binding: sched_getaffinity: %s",
		    strerror(e));
		return (e);
	}
	for (int c = 0; c < CPU_SETSIZE; c++)
		if (CPU_ISSET(c, &have))
			cpus[ncpu++] = c;
	if (ncpu == 0) {
		snprintf(err, errlen, "CPU binding: no CPU to bind to");
		return (EINVAL);
	}
	nslices = nslots < ncpu ? nslots : ncpu;
	slice = slot % nslices;
	/* slice s: ncpu / nslices CPUs, one more for the first ncpu %
	 * nslices */
	len = ncpu / nslices + (slice < ncpu % nslices ? 1 : 0);
	first = slice * (ncpu / nslices)
	    + (slice < ncpu % nslices ? slice : ncpu % nslices);
	CPU_ZERO(out);
	for (int i = first; i < first + len; i++)
		CPU_SET(cpus[i], out);
	return (0);
}

/* execvp's lookup, in the parent: 0 and the path in out, or ENOENT /
 * EACCES (found, not executable) / ENAMETOOLONG. */
static int
launch_which(const char *name, char *out, size_t len)
{
	const char *path = getenv("PATH");
	int err = ENOENT;

	if (name[0] == '\0')
		return (ENOENT);
	if (strchr(name, '/') != NULL) {
		if ((size_t)snprintf(out, len, "%s", name) >= len)
			return (ENAMETOOLONG);
		return (0);
	}
	if (path == NULL || path[0] == '\0')
		path = "/usr/local/bin:/usr/bin:/bin";
	while (*path != '\0') {
		const char *colon = strchr(path, ':');
		size_t dl
		    = colon != NULL ? (size_t)(colon - path) : strlen(path);
		struct stat sb;

		/* an empty element is the current directory */
		if ((size_t)snprintf(out, len, "%.*s%s%s", (int)dl, path,
		        dl > 0 ? "/" : "", name)
		    < len) {
			if (stat(out, &sb) == 0 && S_ISREG(sb.st_mode)) {
				if (access(out, X_OK) == 0)
					return (0);
				err = EACCES;
			}
		}
		path += dl;
		if (*path == ':')
			path++;
	}
	return (err);
}

/* In the child, before exec or fn: async-signal-safe calls only. Returns
 * false when the parent is already gone. */
static bool
launch_child_setup(const struct cohort__proc_spec *s, pid_t parent)
{
	(void)prctl(
	    PR_SET_PDEATHSIG, s->death_sig != 0 ? s->death_sig : SIGKILL);
	/* the parent died between fork and prctl: nobody would signal us */
	if (getppid() != parent)
		return (false);
	/* a raw system call (no lock, no allocation); a failure leaves the
	 * launcher's CPUs, which cohort__launch_cpus already checked */
	if (s->cpus != NULL)
		(void)sched_setaffinity(0, sizeof(*s->cpus), s->cpus);
	if (s->stdout_fd >= 0 && s->stdout_fd != STDOUT_FILENO)
		(void)dup2(s->stdout_fd, STDOUT_FILENO);
	if (s->stderr_fd >= 0 && s->stderr_fd != STDERR_FILENO)
		(void)dup2(s->stderr_fd, STDERR_FILENO);
	return (true);
}

int
cohort__proc_start(struct cohort__proc *p, const struct cohort__proc_spec *s,
    char *err, size_t errlen)
{
	char path[PATH_MAX];
	const char *prog = s->path != NULL ? s->path : "(function)";
	pid_t parent = getpid(), pid;
	int fds[2] = { -1, -1 }, e = 0;
	ssize_t got;

	if (s->path == NULL && s->fn == NULL) {
		snprintf(err, errlen, "nothing to start");
		return (EINVAL);
	}
	if (s->path != NULL) {
		if (s->argv == NULL || s->argv[0] == NULL) {
			snprintf(
			    err, errlen, "cannot start %s: no argv", prog);
			return (EINVAL);
		}
		if ((e = launch_which(s->path, path, sizeof(path))) != 0)
			goto out_err;
		if (pipe2(fds, O_CLOEXEC) != 0) {
			e = errno;
			goto out_err;
		}
	}
	fflush(NULL); /* no buffered output written twice */
	if ((pid = fork()) < 0) {
		e = errno;
		goto out_close;
	}
	if (pid == 0) {
		if (!launch_child_setup(s, parent))
			_exit(1);
		if (s->path == NULL) {
			int rc = s->fn(s->arg);

			fflush(NULL);
			_exit(rc == 0 ? 0 : (rc & 0xff) != 0 ? rc & 0xff : 1);
		}
		(void)close(fds[0]);
		(void)execve(
		    path, s->argv, s->envp != NULL ? s->envp : environ);
		e = errno;
		(void)write(fds[1], &e, sizeof(e));
		_exit(127);
	}
	memset(p, 0, sizeof(*p));
	p->pid = pid;
	p->running = true;
	if (s->path == NULL)
		return (0);
	(void)close(fds[1]);
	do
		got = read(fds[0], &e, sizeof(e));
	while (got < 0 && errno == EINTR);
	(void)close(fds[0]);
	if (got != (ssize_t)sizeof(e))
		return (0); /* closed by the exec: it runs */
	while (waitpid(pid, &p->status, 0) < 0 && errno == EINTR)
		;
	p->running = false;
	snprintf(err, errlen, "cannot start %s: %s", prog, strerror(e));
	return (e);

out_close:
	if (fds[0] >= 0) {
		(void)close(fds[0]);
		(void)close(fds[1]);
	}
out_err:
	snprintf(err, errlen, "cannot start %s: %s", prog, strerror(e));
	return (e);
}

/* Records a reaped child. */
static void
launch_reaped(struct cohort__proc *p, int status, int64_t now)
{
	p->running = false;
	p->status = status;
	p->end_ms = now;
}

void
cohort__proc_stop(struct cohort__proc *p, int64_t grace_ms)
{
	int64_t end = cohort__launch_now_ms() + grace_ms;
	int st;

	if (p->pid <= 0 || !p->running)
		return;
	kill(p->pid, SIGTERM);
	p->sent_sig = SIGTERM;
	while (cohort__launch_now_ms() < end) {
		if (waitpid(p->pid, &st, WNOHANG) == p->pid) {
			launch_reaped(p, st, cohort__launch_now_ms());
			return;
		}
		usleep(5000);
	}
	kill(p->pid, SIGKILL);
	p->sent_sig = SIGKILL;
	while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR)
		;
	launch_reaped(p, st, cohort__launch_now_ms());
}

char **
cohort__launch_env(const char *const *vars, size_t n)
{
	size_t ne = 0, m = n;
	char **envp;

	while (environ[ne] != NULL)
		ne++;
	if ((envp = calloc(n + ne + 1, sizeof(char *))) == NULL)
		return (NULL);
	for (size_t i = 0; i < n; i++)
		envp[i] = (char *)vars[i];
	/* getenv takes the first match: leave out the names we set */
	for (size_t i = 0; i < ne; i++) {
		const char *eq = strchr(environ[i], '=');
		size_t nl = eq != NULL ? (size_t)(eq - environ[i]) : 0;
		bool dup = false;

		for (size_t j = 0; j < n && eq != NULL && !dup; j++)
			dup = strncmp(vars[j], environ[i], nl + 1) == 0;
		if (!dup)
			envp[m++] = environ[i];
	}
	return (envp);
}

const char *
cohort__launch_describe(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(
		    buf, len, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by signal %d (%s)",
		    WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "ended (wait status 0x%x)", status);
	return (buf);
}

int
cohort__launch_code(int status)
{
	if (WIFEXITED(status))
		return (WEXITSTATUS(status));
	if (WIFSIGNALED(status))
		return (128 + WTERMSIG(status));
	return (255);
}

bool
cohort__proc_failed(const struct cohort__proc *p)
{
	if (WIFEXITED(p->status))
		return (WEXITSTATUS(p->status) != 0);
	return (!(WIFSIGNALED(p->status) && p->sent_sig != 0
	    && WTERMSIG(p->status) == p->sent_sig));
}

void
cohort__launch_init(struct cohort__launch *l, struct cohort__proc *procs,
    int n, int64_t grace_ms, int64_t term_ms)
{
	memset(l, 0, sizeof(*l));
	memset(procs, 0, sizeof(*procs) * (size_t)n);
	l->procs = procs;
	l->n = n;
	l->grace_ms = grace_ms;
	l->term_ms = term_ms;
	l->first_failed = -1;
	l->term_at = INT64_MAX;
	l->kill_at = INT64_MAX;
}

int
cohort__launch_alive(const struct cohort__launch *l)
{
	int alive = 0;

	for (int i = 0; i < l->n; i++)
		alive += l->procs[i].running;
	return (alive);
}

int
cohort__launch_reap(struct cohort__launch *l, int64_t now)
{
	for (int i = 0; i < l->n; i++) {
		struct cohort__proc *p = &l->procs[i];
		int st;

		if (!p->running || waitpid(p->pid, &st, WNOHANG) != p->pid)
			continue;
		launch_reaped(p, st, now);
		if (l->first_failed < 0 && cohort__proc_failed(p)) {
			l->first_failed = i;
			if (!l->independent)
				cohort__launch_stop_after(l, now, l->grace_ms);
		}
		return (i);
	}
	return (-1);
}

void
cohort__launch_stop_after(
    struct cohort__launch *l, int64_t now, int64_t grace_ms)
{
	int64_t at = now + (grace_ms > 0 ? grace_ms : 0);

	if (l->term_ms < 0) {
		if (at < l->kill_at)
			l->kill_at = at;
	} else if (at < l->term_at) {
		l->term_at = at;
		l->kill_at = at + l->term_ms;
	}
}

/* The stop sequence's signal to every running child. */
static void
launch_stop_all(struct cohort__launch *l, int sig)
{
	for (int i = 0; i < l->n; i++)
		if (l->procs[i].running)
			l->procs[i].stopped = true;
	cohort__launch_signal(l, sig);
}

void
cohort__launch_tick(struct cohort__launch *l, int64_t now)
{
	if (now >= l->term_at) {
		launch_stop_all(l, SIGTERM);
		cohort__launch_signal(l, SIGCONT);
		l->term_at = INT64_MAX;
	}
	if (now >= l->kill_at) {
		launch_stop_all(l, SIGKILL);
		l->kill_at = INT64_MAX;
	}
}

void
cohort__launch_signal(struct cohort__launch *l, int sig)
{
	for (int i = 0; i < l->n; i++) {
		struct cohort__proc *p = &l->procs[i];

		if (!p->running)
			continue;
		kill(p->pid, sig);
		if (sig != SIGCONT)
			p->sent_sig = sig;
	}
}

void
cohort__launch_kill_all(struct cohort__launch *l)
{
	cohort__launch_signal(l, SIGKILL);
	for (int i = 0; i < l->n; i++) {
		struct cohort__proc *p = &l->procs[i];
		int st;

		if (!p->running)
			continue;
		while (waitpid(p->pid, &st, 0) < 0 && errno == EINTR)
			;
		launch_reaped(p, st, cohort__launch_now_ms());
	}
}
