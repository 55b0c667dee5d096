/*
 * spawn.c - N local worker processes, rank 0's result to the caller (see
 * spawn.h).
 *
 * The parent never uses nng: it forks the children (and, if needed, a
 * private cohortd by fork + exec) and talks to them over one pipe each.
 * A child writes frames: a type byte, a 4-byte little-endian length, the
 * payload. 'R' = rank 0's return value, 'Q' = a queue item, 'E' = the
 * error text of a failure (first payload byte: 1 if the failure was
 * caused by another rank's, i.e. the child saw COHORT_EPEERLOST).
 *
 * Starting, tying to the parent, the grace period and reaping are the
 * launcher core's (launch.h), shared with cohort run and cohort bench.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <limits.h>
#include <netinet/in.h>
#include <poll.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/stat.h>
#include <sys/types.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "launch.h"
#include "spawn.h"

#define SPAWN_MAX 256
#define SPAWN_MAX_FRAME (1u << 30)

struct cohort_spawn_ctx {
	int rank, world;
	int fd;
	char error[1024];
};

/* Parent-side state of one child (its process: the core's cohort__proc
 * of the same index). */
struct spawn_child {
	int fd; /* read end, -1 once at EOF */
	int code; /* 128 + signal for a signal */
	int sig;
	unsigned char *buf;
	size_t len, cap;
	char error[1024];
	bool has_error, secondary;
	int64_t failed_at; /* order of detection */
};

/* snprintf without -Wformat-truncation noise: truncation is fine here. */
static void __attribute__((format(printf, 3, 4)))
spawn_msg(char *buf, size_t len, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(buf, len, fmt, ap);
	va_end(ap);
}

void
cohort_spawn_options_init(cohort_spawn_options *o)
{
	memset(o, 0, sizeof(*o));
	o->grace_ms = 3000;
	o->join_timeout = COHORT_WAIT_DEFAULT;
}

/* ------------------------------------------------------------------------ */
/* Child side                                                               */
/* ------------------------------------------------------------------------ */

static int
spawn_write_all(int fd, const void *p, size_t len)
{
	const unsigned char *b = p;

	while (len > 0) {
		ssize_t w = write(fd, b, len);

		if (w < 0) {
			if (errno == EINTR)
				continue;
			return (-1);
		}
		b += w;
		len -= (size_t)w;
	}
	return (0);
}

static cohort_status
spawn_frame(
    int fd, char type, const void *a, size_t alen, const void *b, size_t blen)
{
	unsigned char hdr[5];
	uint64_t len = (uint64_t)alen + blen;

	if (len > SPAWN_MAX_FRAME)
		return (COHORT_ETOOBIG);
	hdr[0] = (unsigned char)type;
	for (int i = 0; i < 4; i++)
		hdr[1 + i] = (unsigned char)(len >> (8 * i));
	if (spawn_write_all(fd, hdr, sizeof(hdr)) != 0
	    || (alen > 0 && spawn_write_all(fd, a, alen) != 0)
	    || (blen > 0 && spawn_write_all(fd, b, blen) != 0))
		return (COHORT_ESYSTEM);
	return (COHORT_OK);
}

int
cohort_spawn_rank(const cohort_spawn_ctx *ctx)
{
	return (ctx != NULL ? ctx->rank : -1);
}

int
cohort_spawn_world_size(const cohort_spawn_ctx *ctx)
{
	return (ctx != NULL ? ctx->world : 0);
}

/* A frame of kind to the launcher, from rank 0 only (others: no-op). */
static cohort_status
spawn_send(cohort_spawn_ctx *ctx, char kind, const void *data, size_t len)
{
	if (ctx == NULL || (data == NULL && len > 0))
		return (COHORT_EINVAL);
	if (ctx->rank != 0)
		return (COHORT_OK);
	return (spawn_frame(ctx->fd, kind, data, len, NULL, 0));
}

cohort_status
cohort_spawn_return(cohort_spawn_ctx *ctx, const void *data, size_t len)
{
	return (spawn_send(ctx, 'R', data, len));
}

cohort_status
cohort_spawn_add_to_queue(cohort_spawn_ctx *ctx, const void *data, size_t len)
{
	return (spawn_send(ctx, 'Q', data, len));
}

void
cohort_spawn_fail(cohort_spawn_ctx *ctx, const char *fmt, ...)
{
	va_list ap;

	if (ctx == NULL)
		return;
	va_start(ap, fmt);
	vsnprintf(ctx->error, sizeof(ctx->error), fmt, ap);
	va_end(ap);
}

/* Sets one "NAME=VALUE" in this process's environment (a copy). */
static void
spawn_putenv(const char *kv)
{
	const char *eq = strchr(kv, '=');
	char name[256];
	size_t kl;

	if (eq == NULL || (kl = (size_t)(eq - kv)) == 0 || kl >= sizeof(name))
		return;
	memcpy(name, kv, kl);
	name[kl] = '\0';
	setenv(name, eq + 1, 1);
}

/* In the child: the variables cohort_client_open_env reads (written by
 * cohort_env_vars, like cohort run's), then the caller's extra ones. */
static void
spawn_child_env(const cohort_spawn_options *o, const char *coord,
    const char *job, int rank, int n)
{
	const char *vars[24];
	char buf[4096];
	cohort_env e;

	memset(&e, 0, sizeof(e));
	snprintf(e.coordinator, sizeof(e.coordinator), "%.*s",
	    (int)sizeof(e.coordinator) - 1, coord);
	snprintf(e.job, sizeof(e.job), "%.*s", (int)sizeof(e.job) - 1, job);
	snprintf(e.token, sizeof(e.token), "%.*s", (int)sizeof(e.token) - 1,
	    o->token != NULL ? o->token : "");
	e.rank = rank;
	e.world_size = n;
	e.local_rank = rank;
	e.local_world_size = n;
	e.node_rank = -1;
	if (cohort_env_vars(&e, buf, sizeof(buf), vars, 24) > 0)
		for (size_t i = 0; vars[i] != NULL; i++)
			spawn_putenv(vars[i]);
	for (size_t i = 0; o->env != NULL && o->env[i] != NULL; i++)
		spawn_putenv(o->env[i]);
}

static void
spawn_child_error(cohort_spawn_ctx *ctx, bool secondary, const char *text)
{
	unsigned char flag = secondary ? 1 : 0;

	spawn_frame(ctx->fd, 'E', &flag, 1, text, strlen(text));
}

static void __attribute__((noreturn)) spawn_child_main(cohort_spawn_ctx *ctx,
    const cohort_spawn_options *o, cohort_spawn_fn fn, void *arg)
{
	cohort_client *c = NULL;
	cohort_status st;
	int rc;

	if (!o->no_client) {
		st = cohort_client_open_env(&c, o->join_timeout);
		if (st != COHORT_OK) {
			char text[1024];

			snprintf(text, sizeof(text),
			    "rank %d: cohort_client_open_env: %s: %s",
			    ctx->rank, cohort_status_name(st),
			    cohort_last_error());
			spawn_child_error(ctx, false, text);
			fflush(NULL);
			_exit(1);
		}
	}
	rc = fn(ctx, c, arg);
	if (rc != 0) {
		bool secondary = false;
		char text[1200];

		if (c != NULL) {
			cohort_group *g = cohort_client_world(c);

			secondary = cohort_client_error(c) == COHORT_EPEERLOST
			    || (g != NULL
			        && cohort_group_error(g) == COHORT_EPEERLOST);
		}
		if (ctx->error[0] != '\0')
			snprintf(text, sizeof(text), "%s", ctx->error);
		else
			snprintf(text, sizeof(text),
			    "rank %d: function returned %d", ctx->rank, rc);
		/* on_exception: the others learn who failed and why. */
		if (c != NULL && !secondary)
			cohort_report_failure(c, text, 5000);
		spawn_child_error(ctx, secondary, text);
	}
	cohort_client_close(c);
	fflush(NULL);
	_exit(rc == 0 ? 0 : (rc & 0xff) != 0 ? rc & 0xff : 1);
}

/* ------------------------------------------------------------------------ */
/* The private coordinator                                                  */
/* ------------------------------------------------------------------------ */

static int
spawn_free_port(void)
{
	struct sockaddr_in a;
	socklen_t len = sizeof(a);
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0), port = -1;

	if (fd < 0)
		return (-1);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	if (bind(fd, (struct sockaddr *)&a, sizeof(a)) == 0
	    && getsockname(fd, (struct sockaddr *)&a, &len) == 0)
		port = ntohs(a.sin_port);
	close(fd);
	return (port);
}

static bool
spawn_port_open(int port)
{
	struct sockaddr_in a;
	int fd = socket(AF_INET, SOCK_STREAM | SOCK_CLOEXEC, 0);
	bool ok;

	if (fd < 0)
		return (false);
	memset(&a, 0, sizeof(a));
	a.sin_family = AF_INET;
	a.sin_addr.s_addr = htonl(INADDR_LOOPBACK);
	a.sin_port = htons((uint16_t)port);
	ok = connect(fd, (struct sockaddr *)&a, sizeof(a)) == 0;
	close(fd);
	return (ok);
}

static bool
spawn_executable(const char *p)
{
	struct stat sb;

	return (
	    stat(p, &sb) == 0 && S_ISREG(sb.st_mode) && access(p, X_OK) == 0);
}

/* The cohortd to run: opts, $COHORT_COHORTD, next to this program, or
 * "cohortd" (PATH). */
static void
spawn_cohortd_path(const cohort_spawn_options *o, char *out, size_t len)
{
	const char *e = cohort_env_knob("COHORT_COHORTD");
	char self[PATH_MAX];
	ssize_t n;

	if (o->cohortd_path != NULL && o->cohortd_path[0] != '\0') {
		snprintf(out, len, "%s", o->cohortd_path);
		return;
	}
	if (e != NULL && e[0] != '\0') {
		snprintf(out, len, "%s", e);
		return;
	}
	n = readlink("/proc/self/exe", self, sizeof(self) - 1);
	if (n > 0) {
		char *slash;

		self[n] = '\0';
		if ((slash = strrchr(self, '/')) != NULL) {
			*slash = '\0';
			if ((size_t)snprintf(out, len, "%s/cohortd", self)
			        < len
			    && spawn_executable(out))
				return;
		}
	}
	snprintf(out, len, "cohortd");
}

/* Starts cohortd on a free loopback port; *coord and url on success. */
static cohort_status
spawn_start_cohortd(const cohort_spawn_options *o, struct cohort__proc *coord,
    char *url, size_t urllen, char *err, size_t errlen)
{
	char path[PATH_MAX], log[PATH_MAX];
	int logfd;
	cohort_status st = COHORT_ESYSTEM;

	spawn_cohortd_path(o, path, sizeof(path));
	if (o->log_dir != NULL)
		snprintf(log, sizeof(log), "%s/cohortd-spawn-%ld.log",
		    o->log_dir, (long)getpid());
	else
		snprintf(log, sizeof(log), "/dev/null");
	logfd = open(log, O_WRONLY | O_CREAT | O_APPEND | O_CLOEXEC, 0644);
	spawn_msg(err, errlen, "%s did not start listening on loopback", path);
	for (int attempt = 0; attempt < 5; attempt++) {
		struct cohort__proc_spec spec;
		char *argv[4];
		int port = spawn_free_port();
		int64_t end;

		if (port <= 0) {
			snprintf(err, errlen, "no free loopback port: %s",
			    strerror(errno));
			break;
		}
		snprintf(url, urllen, "tcp://127.0.0.1:%d", port);
		argv[0] = path;
		argv[1] = (char *)"--listen";
		argv[2] = url;
		argv[3] = NULL;
		cohort__proc_spec_init(&spec);
		spec.path = path;
		spec.argv = argv;
		spec.stdout_fd = spec.stderr_fd = logfd;
		spec.death_sig = SIGTERM; /* it may close its journal */
		if (cohort__proc_start(coord, &spec, err, errlen) != 0) {
			spawn_msg(err + strlen(err), errlen - strlen(err),
			    " (set cohortd_path or COHORT_COHORTD)");
			break;
		}
		end = cohort__launch_now_ms() + 10000;
		while (cohort__launch_now_ms() < end && coord->running) {
			int ws;

			if (spawn_port_open(port)) {
				st = COHORT_OK;
				goto out;
			}
			if (waitpid(coord->pid, &ws, WNOHANG) == coord->pid)
				coord->running = false; /* port taken? retry */
			else
				usleep(5000);
		}
		cohort__proc_stop(coord, 1000);
	}
out:
	if (logfd >= 0)
		close(logfd);
	return (st);
}

/* ------------------------------------------------------------------------ */
/* Parent side                                                              */
/* ------------------------------------------------------------------------ */

/* Parses complete frames out of ch->buf. Returns -1 on a corrupt one. */
static int
spawn_parse(struct spawn_child *ch, int rank, cohort_spawn_result *r)
{
	size_t off = 0;

	while (ch->len - off >= 5) {
		const unsigned char *f = ch->buf + off;
		uint32_t len = 0;

		for (int i = 0; i < 4; i++)
			len |= (uint32_t)f[1 + i] << (8 * i);
		if (len > SPAWN_MAX_FRAME)
			return (-1);
		if (ch->len - off - 5 < len)
			break;
		if (f[0] == 'E' && len >= 1) {
			size_t tl = len - 1 < sizeof(ch->error) - 1
			    ? len - 1
			    : sizeof(ch->error) - 1;

			ch->secondary = f[5] != 0;
			memcpy(ch->error, f + 6, tl);
			ch->error[tl] = '\0';
			ch->has_error = true;
		} else if ((f[0] == 'R' || f[0] == 'Q') && rank == 0) {
			void *copy = malloc(len ? len : 1);

			if (copy == NULL)
				return (-1);
			memcpy(copy, f + 5, len);
			if (f[0] == 'R') {
				free(r->data);
				r->data = copy;
				r->len = len;
			} else {
				cohort_spawn_item *q = realloc(
				    r->queue, (r->queue_len + 1) * sizeof(*q));

				if (q == NULL) {
					free(copy);
					return (-1);
				}
				r->queue = q;
				q[r->queue_len].data = copy;
				q[r->queue_len].len = len;
				r->queue_len++;
			}
		}
		off += 5 + len;
	}
	memmove(ch->buf, ch->buf + off, ch->len - off);
	ch->len -= off;
	return (0);
}

static int
spawn_read(struct spawn_child *ch, int rank, cohort_spawn_result *r)
{
	for (;;) {
		ssize_t n;

		if (ch->cap - ch->len < 65536) {
			size_t ncap = ch->cap ? ch->cap * 2 : 131072;
			unsigned char *nb = realloc(ch->buf, ncap);

			if (nb == NULL)
				return (-1);
			ch->buf = nb;
			ch->cap = ncap;
		}
		n = read(ch->fd, ch->buf + ch->len, ch->cap - ch->len);
		if (n < 0) {
			if (errno == EINTR)
				continue;
			if (errno == EAGAIN)
				return (0);
			return (-1);
		}
		if (n == 0)
			return (1); /* EOF */
		ch->len += (size_t)n;
		if (spawn_parse(ch, rank, r) != 0)
			return (-1);
	}
}

/* True if this process already runs nng (its threads are named "nng:...").
 * A forked child of such a process cannot use nng (nng 1.5 panics in the
 * child), so cohort_spawn must refuse before forking. */
static bool
spawn_nng_running(void)
{
	/* -1, no procfs: cannot tell, let it run */
	return (cohort__threads_named("nng:", true) > 0);
}

/* What a forked child needs to become rank k (a copy of the parent's
 * memory: it stays valid in the child). */
struct spawn_start {
	const cohort_spawn_options *o;
	cohort_spawn_fn fn;
	void *arg;
	const char *coord, *job;
	int rank, n, fd;
	const struct spawn_child *ch; /* the pipes of the ranks before it */
};

static int
spawn_child_entry(void *p)
{
	const struct spawn_start *s = p;
	cohort_spawn_ctx ctx;

	for (int j = 0; j < s->rank; j++)
		if (s->ch[j].fd >= 0)
			close(s->ch[j].fd);
	memset(&ctx, 0, sizeof(ctx));
	ctx.rank = s->rank;
	ctx.world = s->n;
	ctx.fd = s->fd;
	spawn_child_env(s->o, s->coord, s->job, s->rank, s->n);
	spawn_child_main(&ctx, s->o, s->fn, s->arg);
}

/* Starts rank k with its pipe; COHORT_OK, else r->error says. */
static cohort_status
spawn_start_rank(struct spawn_start *s, struct cohort__proc *proc,
    struct spawn_child *ch, cohort_spawn_result *r)
{
	struct cohort__proc_spec spec;
	char err[256];
	int fds[2], e;
	cpu_set_t cpus;

	/* COHORT_BIND, as cohort run --bind: rank k's slice of our CPUs */
	e = cohort__launch_cpus(cohort_env_knob("COHORT_BIND"), s->rank, s->n,
	    &cpus, err, sizeof(err));
	if (e != 0 && e != ENOENT) {
		snprintf(r->error, sizeof(r->error), "COHORT_BIND: %s", err);
		return (COHORT_EINVAL);
	}
	if (pipe2(fds, O_CLOEXEC) != 0) {
		snprintf(
		    r->error, sizeof(r->error), "pipe: %s", strerror(errno));
		return (COHORT_ESYSTEM);
	}
	cohort__proc_spec_init(&spec);
	spec.fn = spawn_child_entry;
	spec.arg = s;
	spec.cpus = e == 0 ? &cpus : NULL;
	s->fd = fds[1];
	/* Die with the parent; never outlive it. */
	spec.death_sig = SIGKILL;
	if (cohort__proc_start(proc, &spec, err, sizeof(err)) != 0) {
		snprintf(r->error, sizeof(r->error), "%s", err);
		close(fds[0]);
		close(fds[1]);
		return (COHORT_ESYSTEM);
	}
	close(fds[1]);
	fcntl(fds[0], F_SETFL, fcntl(fds[0], F_GETFL) | O_NONBLOCK);
	ch->fd = fds[0];
	return (COHORT_OK);
}

/* Reads whatever the children's pipes hold, waiting up to 50 ms (10 ms
 * when no pipe is open). False when no pipe is open. */
static bool
spawn_read_pipes(struct spawn_child *ch, int n, cohort_spawn_result *r)
{
	struct pollfd pfd[SPAWN_MAX];
	int idx[SPAWN_MAX], np = 0;

	for (int k = 0; k < n; k++) {
		if (ch[k].fd >= 0) {
			pfd[np].fd = ch[k].fd;
			pfd[np].events = POLLIN;
			idx[np++] = k;
		}
	}
	if (np == 0) {
		usleep(10000);
		return (false);
	}
	if (poll(pfd, (nfds_t)np, 50) <= 0)
		return (true);
	for (int i = 0; i < np; i++) {
		struct spawn_child *c = &ch[idx[i]];

		if (pfd[i].revents != 0 && spawn_read(c, idx[i], r) != 0) {
			close(c->fd);
			c->fd = -1;
		}
	}
	return (true);
}

/* The failure to report: the first one not caused by another rank's,
 * else the first; -1 when none. */
static int
spawn_root_cause(const struct spawn_child *ch, int n)
{
	int best = -1;

	for (int pass = 0; pass < 2 && best < 0; pass++) {
		for (int k = 0; k < n; k++) {
			if (ch[k].failed_at == 0
			    || (pass == 0 && ch[k].secondary))
				continue;
			if (best < 0 || ch[k].failed_at < ch[best].failed_at)
				best = k;
		}
	}
	return (best);
}

cohort_status
cohort_spawn(int n, cohort_spawn_fn fn, void *arg,
    const cohort_spawn_options *opts, cohort_spawn_result *r)
{
	static int spawn_counter;
	cohort_spawn_options o;
	struct spawn_child *ch;
	struct cohort__proc *procs, coordp;
	struct cohort__launch l;
	struct spawn_start start;
	char url[128], job[160], err[512] = "";
	const char *coord;
	int64_t t0, seq = 0;
	cohort_status st = COHORT_OK;
	bool timed_out = false, pipes = true;
	int best;

	if (r == NULL)
		return (COHORT_EINVAL);
	memset(r, 0, sizeof(*r));
	memset(&coordp, 0, sizeof(coordp));
	r->failed_rank = -1;
	for (int i = 0; i < SPAWN_MAX; i++)
		r->exit_codes[i] = -1;
	if (n < 1 || n > SPAWN_MAX || fn == NULL) {
		snprintf(r->error, sizeof(r->error), "invalid arguments");
		return (COHORT_EINVAL);
	}
	r->nranks = n;
	if ((opts == NULL || !opts->no_client) && spawn_nng_running()) {
		snprintf(r->error, sizeof(r->error),
		    "cohort_spawn must be called before this process opens a "
		    "cohort client or coordinator: nng is already running "
		    "here and cannot be used in forked children (call "
		    "cohort_spawn first, or start the workers with cohort "
		    "run)");
		return (COHORT_ESTATE);
	}
	if (opts != NULL)
		o = *opts;
	else
		cohort_spawn_options_init(&o);
	if (o.grace_ms <= 0)
		o.grace_ms = 3000;
	if (o.join_timeout == 0)
		o.join_timeout = COHORT_WAIT_DEFAULT;

	if (o.coordinator != NULL && o.coordinator[0] != '\0') {
		coord = o.coordinator;
	} else {
		st = spawn_start_cohortd(
		    &o, &coordp, url, sizeof(url), err, sizeof(err));
		if (st != COHORT_OK) {
			spawn_msg(r->error, sizeof(r->error),
			    "cannot start the coordinator: %s", err);
			return (st);
		}
		coord = url;
	}
	if (o.job != NULL)
		snprintf(job, sizeof(job), "%s", o.job);
	else
		snprintf(job, sizeof(job), "spawn-%ld-%d", (long)getpid(),
		    ++spawn_counter);

	ch = calloc((size_t)n, sizeof(*ch));
	procs = calloc((size_t)n, sizeof(*procs));
	if (ch == NULL || procs == NULL) {
		free(ch);
		free(procs);
		cohort__proc_stop(&coordp, 3000);
		return (COHORT_ENOMEM);
	}
	/* After the first failure the others get grace_ms, then SIGKILL. */
	cohort__launch_init(&l, procs, n, o.grace_ms, -1);
	for (int k = 0; k < n; k++)
		ch[k].fd = -1;
	start = (struct spawn_start) { &o, fn, arg, coord, job, 0, n, -1, ch };
	for (int k = 0; k < n && st == COHORT_OK; k++) {
		start.rank = k;
		st = spawn_start_rank(&start, &procs[k], &ch[k], r);
	}
	t0 = cohort__launch_now_ms();
	if (st
	    != COHORT_OK) /* could not start them all: stop those that run */
		cohort__launch_stop_after(&l, t0, 0);

	while (cohort__launch_alive(&l) > 0 || pipes) {
		int64_t now = cohort__launch_now_ms();
		int k;

		if (o.timeout_ms > 0 && !timed_out
		    && now - t0 > o.timeout_ms) {
			timed_out = true;
			cohort__launch_stop_after(&l, now, 0);
		}
		cohort__launch_tick(&l, now);
		pipes = spawn_read_pipes(ch, n, r);
		while ((k = cohort__launch_reap(&l, now)) >= 0) {
			int ws = procs[k].status;

			ch[k].code = cohort__launch_code(ws);
			ch[k].sig = WIFSIGNALED(ws) ? WTERMSIG(ws) : 0;
			r->exit_codes[k] = ch[k].code;
			if (cohort__proc_failed(&procs[k]))
				ch[k].failed_at = ++seq;
		}
	}

	if ((best = spawn_root_cause(ch, n)) >= 0) {
		struct spawn_child *c = &ch[best];
		char what[96];

		cohort__launch_describe(
		    procs[best].status, what, sizeof(what));
		r->failed_rank = best;
		r->exit_code = c->code;
		r->term_signal = c->sig;
		spawn_msg(r->error, sizeof(r->error), "rank %d %s: %s", best,
		    what, c->has_error ? c->error : "(no error text)");
		if (st == COHORT_OK)
			st = COHORT_EPEERLOST;
	} else if (timed_out) {
		snprintf(r->error, sizeof(r->error), "timed out after %lld ms",
		    (long long)o.timeout_ms);
		if (st == COHORT_OK)
			st = COHORT_ETIMEDOUT;
	} else if (st == COHORT_OK) {
		for (int k = 0; k < n; k++) {
			if (ch[k].code != 0) {
				r->failed_rank = k;
				r->exit_code = ch[k].code;
				r->term_signal = ch[k].sig;
				snprintf(r->error, sizeof(r->error),
				    "rank %d exited with status %d", k,
				    ch[k].code);
				st = COHORT_EPEERLOST;
				break;
			}
		}
	}
	for (int k = 0; k < n; k++) {
		if (ch[k].fd >= 0)
			close(ch[k].fd);
		free(ch[k].buf);
	}
	free(ch);
	free(procs);
	cohort__proc_stop(&coordp, 3000);
	return (st);
}

void
cohort_spawn_result_free(cohort_spawn_result *r)
{
	if (r == NULL)
		return;
	free(r->data);
	for (size_t i = 0; i < r->queue_len; i++)
		free(r->queue[i].data);
	free(r->queue);
	r->data = NULL;
	r->len = 0;
	r->queue = NULL;
	r->queue_len = 0;
}

bool
cohort_spawn_get_from_queue(
    const cohort_spawn_result *r, size_t i, const void **data, size_t *len)
{
	if (r == NULL || i >= r->queue_len)
		return (false);
	if (data != NULL)
		*data = r->queue[i].data;
	if (len != NULL)
		*len = r->queue[i].len;
	return (true);
}
