/*
 * test_spawn.c - strategies/spawn with real processes: rank 0's value and
 * metrics reach the caller; a failing, crashing or hanging child makes
 * cohort_spawn return an error naming the rank, its exit status and its
 * text; no process is left behind, even when the caller is killed; DDP
 * training inside spawned workers equals one process on the whole batch.
 *
 * The test process itself never touches nng (the children do), as
 * cohort_spawn requires.
 */
#include <dirent.h>
#include <errno.h>
#include <math.h>
#include <sched.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "ddp.h"
#include "launch.h"
#include "mlp.h"
#include "spawn.h"

/* Processes whose parent is this one (0 = none left behind). */
static int
tsp_children(void)
{
	DIR *d = opendir("/proc");
	struct dirent *e;
	int n = 0;

	ck_assert_ptr_nonnull(d);
	while ((e = readdir(d)) != NULL) {
		char path[300], *buf, *rp;
		long ppid;

		if (e->d_name[0] < '0' || e->d_name[0] > '9')
			continue;
		snprintf(path, sizeof(path), "/proc/%s/stat", e->d_name);
		if ((buf = th_read_file(path)) == NULL)
			continue;
		/* pid (comm) state ppid ... */
		if ((rp = strrchr(buf, ')')) != NULL
		    && sscanf(rp + 1, " %*c %ld", &ppid) == 1
		    && ppid == (long)getpid())
			n++;
		free(buf);
	}
	closedir(d);
	return (n);
}

static void
tsp_assert_nothing_left(void)
{
	int st;

	ck_assert_int_eq(tsp_children(), 0);
	errno = 0;
	ck_assert_int_eq(waitpid(-1, &st, WNOHANG), -1);
	ck_assert_int_eq(errno, ECHILD);
}

static void
tsp_opts(cohort_spawn_options *o)
{
	static const char *const env[] = { "COHORT_LOG_LEVEL=warn", NULL };

	cohort_spawn_options_init(o);
	o->cohortd_path = th_bin("cohortd");
	o->log_dir = th_tmpdir();
	o->env = env;
	o->timeout_ms = 60000;
	/* After the first failure the others have this long to exit. A
	 * survivor's exit closes its connection to cohortd, which nng 1.5's
	 * close race may hold for up to its own 2 s bound on a starved
	 * machine: a grace of exactly 2 s SIGKILLed survivors that had
	 * learned the failure (2 of 6 runs beside 6 busy loops). */
	o->grace_ms = 5000;
}

/* A spawn of 3 ranks of fn that fails (EPEERLOST) because of rank
 * `failed`; r gets the result; returns how long it took (ms). */
static int64_t
tsp_spawn_lost(cohort_spawn_options *o, cohort_spawn_fn fn, int failed,
    cohort_spawn_result *r)
{
	int64_t t0 = th_now_ms();

	ck_assert_cohort_err(
	    cohort_spawn(3, fn, NULL, o, r), COHORT_EPEERLOST);
	fprintf(stderr, "spawn: rank %d failed: %s (%lld ms)\n", failed,
	    r->error, (long long)(th_now_ms() - t0));
	ck_assert_int_eq(r->failed_rank, failed);
	return (th_now_ms() - t0);
}

/* ------------------------------------------------------------------------ */

static int
tsp_fn_ok(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	cohort_group *g = cohort_client_world(c);
	int64_t v = cohort_client_rank(c) + 1;
	char buf[128];
	cohort_status st;

	(void)arg;
	if ((st = cohort_allreduce(
	         g, &v, &v, 1, COHORT_I64, COHORT_SUM, NULL, 30000))
	        != COHORT_OK
	    || (st = cohort_barrier(g, "done", 30000)) != COHORT_OK) {
		cohort_spawn_fail(
		    ctx, "collective: %s", cohort_status_name(st));
		return (1);
	}
	if (cohort_spawn_rank(ctx) == 0) {
		cohort_spawn_add_to_queue(ctx, "loss=0.25", 9);
		cohort_spawn_add_to_queue(ctx, "acc=0.975", 9);
		snprintf(buf, sizeof(buf), "rank %d of %d: sum=%lld",
		    cohort_client_rank(c), cohort_spawn_world_size(ctx),
		    (long long)v);
		cohort_spawn_return(ctx, buf, strlen(buf) + 1);
	} else {
		/* Only rank 0's value reaches the caller. */
		cohort_spawn_return(ctx, "not me", 7);
		cohort_spawn_add_to_queue(ctx, "nor me", 7);
	}
	return (0);
}

START_TEST(test_spawn_returns_rank0_result_and_metrics)
{
	cohort_spawn_options o;
	cohort_spawn_result r;
	const void *q;
	size_t qlen;

	tsp_opts(&o);
	ck_assert_cohort_ok(cohort_spawn(3, tsp_fn_ok, NULL, &o, &r));
	ck_assert_ptr_nonnull(r.data);
	ck_assert_str_eq(r.data, "rank 0 of 3: sum=6");
	ck_assert_uint_eq(r.queue_len, 2);
	ck_assert(cohort_spawn_get_from_queue(&r, 0, &q, &qlen));
	ck_assert_uint_eq(qlen, 9);
	ck_assert(memcmp(q, "loss=0.25", 9) == 0);
	ck_assert(cohort_spawn_get_from_queue(&r, 1, &q, &qlen));
	ck_assert(memcmp(q, "acc=0.975", 9) == 0);
	ck_assert(!cohort_spawn_get_from_queue(&r, 2, &q, &qlen));
	ck_assert_int_eq(r.failed_rank, -1);
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(r.exit_codes[k], 0);
	cohort_spawn_result_free(&r);
	tsp_assert_nothing_left();
}
END_TEST

/* Rank 1 fails with a text; the others wait in a barrier and learn it. */
static int
tsp_fn_fail(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	cohort_status st;

	(void)arg;
	if (cohort_spawn_rank(ctx) == 1) {
		cohort_spawn_fail(ctx, "boom: loss is NaN at step 7");
		return (5);
	}
	st = cohort_barrier(cohort_client_world(c), "never", 30000);
	cohort_spawn_fail(ctx, "rank %d: barrier: %s: %s",
	    cohort_spawn_rank(ctx), cohort_status_name(st),
	    cohort_group_last_error(cohort_client_world(c)));
	/* What the survivors saw names rank 1 and its text. */
	if (st == COHORT_EPEERLOST
	    && strstr(cohort_group_last_error(cohort_client_world(c)),
	           "loss is NaN")
	        != NULL)
		return (9);
	return (8);
}

START_TEST(test_spawn_child_failure_named)
{
	cohort_spawn_options o;
	cohort_spawn_result r;
	int64_t took;

	tsp_opts(&o);
	took = tsp_spawn_lost(&o, tsp_fn_fail, 1, &r);
	ck_assert_int_eq(r.exit_code, 5);
	ck_assert_int_eq(r.term_signal, 0);
	ck_assert_msg(strstr(r.error, "rank 1") != NULL
	        && strstr(r.error, "status 5") != NULL
	        && strstr(r.error, "boom: loss is NaN at step 7") != NULL,
	    "error: %s", r.error);
	/* The survivors learned who failed and why (exit 9), in time. */
	ck_assert_int_eq(r.exit_codes[0], 9);
	ck_assert_int_eq(r.exit_codes[2], 9);
	ck_assert_int_lt(took, 20000);
	cohort_spawn_result_free(&r);
	tsp_assert_nothing_left();
}
END_TEST

/* Rank 2 crashes; rank 1 ignores everything and sleeps. */
static int
tsp_fn_crash(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	(void)c;
	(void)arg;
	if (cohort_spawn_rank(ctx) == 2)
		abort();
	if (cohort_spawn_rank(ctx) == 1)
		sleep(1000);
	return (0);
}

START_TEST(test_spawn_child_crash_and_straggler_killed)
{
	cohort_spawn_options o;
	cohort_spawn_result r;
	int64_t took;

	tsp_opts(&o);
	o.grace_ms = 500;
	took = tsp_spawn_lost(&o, tsp_fn_crash, 2, &r);
	ck_assert_int_eq(r.term_signal, SIGABRT);
	ck_assert_int_eq(r.exit_code, 128 + SIGABRT);
	ck_assert_msg(strstr(r.error, "rank 2 killed by signal") != NULL,
	    "error: %s", r.error);
	/* The sleeper was killed after the grace period. */
	ck_assert_int_eq(r.exit_codes[1], 128 + SIGKILL);
	ck_assert_int_lt(took, 15000);
	cohort_spawn_result_free(&r);
	tsp_assert_nothing_left();
}
END_TEST

static int
tsp_fn_hang(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	(void)ctx;
	(void)c;
	(void)arg;
	sleep(1000);
	return (0);
}

START_TEST(test_spawn_timeout_kills_all)
{
	cohort_spawn_options o;
	cohort_spawn_result r;

	tsp_opts(&o);
	o.no_client = true;
	o.timeout_ms = 700;
	ck_assert_cohort_err(
	    cohort_spawn(2, tsp_fn_hang, NULL, &o, &r), COHORT_ETIMEDOUT);
	ck_assert(strstr(r.error, "timed out") != NULL);
	ck_assert_int_eq(r.exit_codes[0], 128 + SIGKILL);
	cohort_spawn_result_free(&r);
	tsp_assert_nothing_left();
}
END_TEST

START_TEST(test_spawn_bad_cohortd)
{
	cohort_spawn_options o;
	cohort_spawn_result r;

	tsp_opts(&o);
	o.cohortd_path = "/nonexistent/cohortd";
	ck_assert_cohort_err(
	    cohort_spawn(2, tsp_fn_ok, NULL, &o, &r), COHORT_ESYSTEM);
	ck_assert(strstr(r.error, "/nonexistent/cohortd") != NULL);
	cohort_spawn_result_free(&r);
	ck_assert_cohort_err(
	    cohort_spawn(0, tsp_fn_ok, NULL, &o, &r), COHORT_EINVAL);
	cohort_spawn_result_free(&r);
	tsp_assert_nothing_left();
}
END_TEST

/* A rank of cohort_spawn under COHORT_BIND=cores: 0 when it runs on
 * exactly its slot's CPUs. */
static int
tsp_fn_bound(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	cpu_set_t have, want;
	char err[256];

	(void)c;
	(void)arg;
	if (sched_getaffinity(0, sizeof(have), &have) != 0
	    || cohort__launch_cpus("cores", cohort_spawn_rank(ctx),
	           cohort_spawn_world_size(ctx), &want, err, sizeof(err))
	        != 0)
		return (2);
	if (!CPU_EQUAL(&have, &want)) {
		cohort_spawn_fail(ctx,
		    "rank %d runs on %d CPUs, not its slot's",
		    cohort_spawn_rank(ctx), CPU_COUNT(&have));
		return (1);
	}
	return (0);
}

/* COHORT_BIND=cores binds each spawned rank to its slice; a mode that
 * is not one is refused before anything starts. */
START_TEST(test_spawn_bind)
{
	cohort_spawn_options o;
	cohort_spawn_result r;

	tsp_opts(&o);
	o.no_client = true;
	setenv("COHORT_BIND", "cores", 1);
	ck_assert_cohort_ok(cohort_spawn(3, tsp_fn_bound, NULL, &o, &r));
	for (int k = 0; k < 3; k++)
		ck_assert_int_eq(r.exit_codes[k], 0);
	cohort_spawn_result_free(&r);
	setenv("COHORT_BIND", "numa", 1);
	ck_assert_cohort_err(
	    cohort_spawn(2, tsp_fn_bound, NULL, &o, &r), COHORT_EINVAL);
	ck_assert_msg(
	    strstr(r.error, "COHORT_BIND: unknown CPU binding") != NULL, "%s",
	    r.error);
	cohort_spawn_result_free(&r);
	unsetenv("COHORT_BIND");
	tsp_assert_nothing_left();
}
END_TEST

/* Regression: cohort_spawn after the process used nng forked children
 * that all died of an nng panic. It now refuses before forking. (Check
 * runs each test in a fork of its own, so nng starts fresh here.) */
START_TEST(test_spawn_after_nng_refused)
{
	cohort_spawn_options o;
	cohort_spawn_result r;
	nng_socket sock;

	tsp_opts(&o);
	ck_assert_int_eq(nng_req0_open(&sock), 0);
	ck_assert_cohort_err(
	    cohort_spawn(2, tsp_fn_ok, NULL, &o, &r), COHORT_ESTATE);
	ck_assert_has(r.error, "before this process opens");
	ck_assert_int_eq(r.exit_codes[0], -1); /* nothing was started */
	cohort_spawn_result_free(&r);
	nng_close(sock);
	tsp_assert_nothing_left();
}
END_TEST

/* ------------------------------------------------------------------------ */
/* DDP inside spawn                                                         */
/* ------------------------------------------------------------------------ */

#define TSP_B 8
#define TSP_STEPS 5

static void
tsp_data(size_t first, size_t n, float *x, uint8_t *y)
{
	for (size_t s = 0; s < n; s++) {
		uint64_t h = (first + s) * 0x9e3779b97f4a7c15ull + 17;

		for (int k = 0; k < 16; k++) {
			h ^= h >> 29;
			h *= 0xbf58476d1ce4e5b9ull;
			x[s * 16 + (size_t)k] = (float)(h >> 40) / 16777216.0f;
		}
		y[s] = (uint8_t)((first + s) % 4);
	}
}

static void
tsp_ready(void *ctx, int i)
{
	cohort_ddp_grad_ready(ctx, i);
}

static int
tsp_fn_ddp(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	struct mlp m;
	cohort_ddp_param p[MLP_NPARAMS];
	cohort_ddp_options o;
	cohort_ddp *d;
	float x[TSP_B * 16];
	uint8_t y[TSP_B];
	int rank = cohort_client_rank(c), world = cohort_client_world_size(c);
	cohort_status st;

	(void)arg;
	if (mlp_init(&m, 16, 24, 4, 100 + (uint64_t)rank) != 0)
		return (1);
	for (int i = 0; i < MLP_NPARAMS; i++) {
		p[i].name = m.param[i].name;
		p[i].data = m.param[i].data;
		p[i].grad = m.param[i].grad;
		p[i].count = m.param[i].count;
	}
	cohort_ddp_options_init(&o);
	o.first_bucket_cap_bytes = 64;
	o.bucket_cap_bytes = 256;
	o.timeout = 30000;
	if ((st = cohort_ddp_new(c, NULL, p, MLP_NPARAMS, &o, &d))
	    != COHORT_OK) {
		cohort_spawn_fail(ctx, "ddp_new: %s", cohort_status_name(st));
		return (1);
	}
	mlp_set_grad_ready(&m, tsp_ready, d);
	for (int s = 0; s < TSP_STEPS; s++) {
		tsp_data((size_t)(s * world + rank) * TSP_B, TSP_B, x, y);
		mlp_forward(&m, x, y, TSP_B, NULL, NULL);
		mlp_backward(&m, x, y, TSP_B, 1.0f / TSP_B);
		if ((st = cohort_ddp_sync(d)) != COHORT_OK) {
			cohort_spawn_fail(ctx, "%s", cohort_ddp_last_error(d));
			return (1);
		}
		mlp_sgd_step(&m, 0.5f, 0.0f);
		mlp_zero_grad(&m);
		cohort_ddp_after_step(d);
	}
	if (cohort_ddp_is_global_zero(d)) {
		double metric = 0.5;

		cohort_spawn_add_to_queue(ctx, &metric, sizeof(metric));
		cohort_spawn_return(ctx, m.params, m.n_params * sizeof(float));
	}
	cohort_ddp_free(d);
	mlp_fini(&m);
	return (0);
}

START_TEST(test_spawn_ddp_training_equals_local)
{
	const int n = 3;
	cohort_spawn_options o;
	cohort_spawn_result r;
	struct th_coord coord;
	struct mlp m;
	float x[3 * TSP_B * 16];
	uint8_t y[3 * TSP_B];
	double dmax = 0.0;

	/* An external coordinator this time. */
	th_coord_start(&coord, NULL);
	tsp_opts(&o);
	o.coordinator = coord.url;
	ck_assert_cohort_ok(cohort_spawn(n, tsp_fn_ddp, NULL, &o, &r));
	ck_assert_int_eq(th_coord_stop(&coord), 0);

	ck_assert_int_eq(mlp_init(&m, 16, 24, 4, 100), 0);
	ck_assert_uint_eq(r.len, m.n_params * sizeof(float));
	ck_assert_uint_eq(r.queue_len, 1);
	for (int s = 0; s < TSP_STEPS; s++) {
		tsp_data((size_t)(s * n) * TSP_B, (size_t)n * TSP_B, x, y);
		mlp_forward(&m, x, y, (size_t)n * TSP_B, NULL, NULL);
		mlp_backward(
		    &m, x, y, (size_t)n * TSP_B, 1.0f / (float)(n * TSP_B));
		mlp_sgd_step(&m, 0.5f, 0.0f);
		mlp_zero_grad(&m);
	}
	for (size_t i = 0; i < m.n_params; i++) {
		double d = fabs(
		    (double)m.params[i] - (double)((const float *)r.data)[i]);

		if (d > dmax)
			dmax = d;
	}
	ck_assert_msg(dmax < 1e-5, "max difference %g", dmax);
	mlp_fini(&m);
	cohort_spawn_result_free(&r);
	tsp_assert_nothing_left();
}
END_TEST

/* Writes its pid to PIDFD (a pipe the test holds), then waits. */
static int
tsp_fn_report_pid(cohort_spawn_ctx *ctx, cohort_client *c, void *arg)
{
	pid_t me = getpid();

	(void)ctx;
	(void)c;
	if (write(*(int *)arg, &me, sizeof(me)) != sizeof(me))
		return (1);
	sleep(1000);
	return (0);
}

/* The process that called cohort_spawn is killed with SIGKILL (no chance
 * to clean up): its children, tied to it by PR_SET_PDEATHSIG, die too. */
START_TEST(test_spawn_children_die_with_the_caller)
{
	int fds[2];
	pid_t caller, kids[2];

	ck_assert_int_eq(pipe(fds), 0);
	if ((caller = fork()) == 0) {
		cohort_spawn_options o;
		cohort_spawn_result r;

		close(fds[0]);
		tsp_opts(&o);
		o.no_client = true;
		o.coordinator = "tcp://127.0.0.1:1"; /* no client: unused */
		(void)cohort_spawn(2, tsp_fn_report_pid, &fds[1], &o, &r);
		_exit(0);
	}
	close(fds[1]);
	for (int i = 0; i < 2; i++)
		ck_assert_int_eq(
		    read(fds[0], &kids[i], sizeof(pid_t)), sizeof(pid_t));
	close(fds[0]);
	ck_assert(!th_pid_gone(&kids[0]) && !th_pid_gone(&kids[1]));
	kill(caller, SIGKILL);
	ck_assert(th_wait(caller, 5000, NULL));
	for (int i = 0; i < 2; i++)
		ck_assert_msg(th_wait_until(th_pid_gone, &kids[i], 500, 10),
		    "child %d outlived the caller of cohort_spawn",
		    (int)kids[i]);
}
END_TEST

Suite *suite_spawn(void);

UNIT_SUITE(spawn, "spawn", 120, test_spawn_returns_rank0_result_and_metrics,
    test_spawn_child_failure_named,
    test_spawn_child_crash_and_straggler_killed, test_spawn_timeout_kills_all,
    test_spawn_bad_cohortd, test_spawn_bind, test_spawn_after_nng_refused,
    test_spawn_ddp_training_equals_local,
    test_spawn_children_die_with_the_caller)
