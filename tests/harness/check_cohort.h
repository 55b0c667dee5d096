/*
 * check_cohort.h - test harness shared by all suites (Check framework).
 *
 * Assertions that print status names (nng NUTS_PASS/NUTS_FAIL), real
 * process helpers (spawn, signal, bounded wait: gloo MultiProcTest), a
 * free loopback port (nng nuts_next_port) and bounded polling waits
 * (Redis wait_for_condition). Nothing here touches nng: the runner forks
 * each test (CK_FORK), and nng must not be used in a forked child whose
 * parent used it, so tests create nng objects inside the test or in exec'd
 * helper processes only.
 */
#ifndef COHORT_CHECK_COHORT_H
#define COHORT_CHECK_COHORT_H

#include <check.h>
#include <stdbool.h>
#include <stdint.h>
#include <string.h>
#include <sys/types.h>

#include "cohort/cohort.h"

#define ck_assert_cohort_ok(expr)                                             \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		ck_assert_msg(st_ == COHORT_OK,                               \
		    "%s: expected COHORT_OK, got %s (%s): %s", #expr,         \
		    cohort_status_name(st_), cohort_strerror(st_),            \
		    cohort_last_error());                                     \
	} while (0)

#define ck_assert_cohort_err(expr, want)                                      \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		ck_assert_msg(st_ == (want), "%s: expected %s, got %s: %s",   \
		    #expr, cohort_status_name(want), cohort_status_name(st_), \
		    cohort_last_error());                                     \
	} while (0)

/* Fails unless the string hay (NULL: none) contains needle; the message
 * quotes both. */
#define ck_assert_has(hay, needle)                                            \
	ck_assert_msg((hay) != NULL && strstr((hay), (needle)) != NULL,       \
	    "no \"%s\" in: %s", (needle), (hay) != NULL ? (hay) : "(null)")

/* Directory holding the built binaries (COHORT_BIN, else build/bin). */
const char *th_bindir(void);
/* Path of a built binary, e.g. th_bin("cohortd"); static buffer per call
 * site is not needed: returns a malloc'd string the harness frees at exit. */
const char *th_bin(const char *name);

/* A loopback TCP port that was free a moment ago. */
int th_free_port(void);
/* A TCP connection to 127.0.0.1:port: the socket, or -1 with errno;
 * th_tcp_connect_ok fails the test instead. th_port_open: does anything
 * accept connections there now? */
int th_tcp_connect(int port);
int th_tcp_connect_ok(int port);
bool th_port_open(int port);

/* Starts argv[0] (a path) with extra environment entries ("K=V", NULL
 * terminated, may be NULL). stdout/stderr go to the given file (NULL =
 * inherit). Returns the pid (> 0); fails the test on error. */
pid_t th_spawn(char *const argv[], char *const env[], const char *out_path);
/* Waits for pid up to timeout_ms; returns true and the raw wait status if
 * it exited, false on timeout (the process is left running). */
bool th_wait(pid_t pid, int timeout_ms, int *status);
/* SIGKILL + reap; safe on an already reaped pid. */
void th_kill(pid_t pid);
/* Exit code of a normal exit, 128+signal for a signal. */
int th_exit_code(int status);

/* A running cohortd on a free loopback port. */
struct th_coord {
	pid_t pid;
	int port;
	char url[64];
	char log[256];
};
/* Starts build/bin/cohortd with extra args (NULL terminated, may be
 * NULL), waits until it accepts connections (bounded), fails the test
 * otherwise. */
void th_coord_start(struct th_coord *c, const char *const *extra_args);
/* The same with cohortd run under the command prefix (NULL terminated,
 * at most 8 words, may be NULL): "/usr/bin/prlimit", "--nofile=64". */
void th_coord_start_under(struct th_coord *c, const char *const *prefix,
    const char *const *extra_args);
/* SIGTERM, waits (bounded) for a clean exit; returns its exit code. */
int th_coord_stop(struct th_coord *c);
/* Does the coordinator's log contain text? */
bool th_coord_log_has(const struct th_coord *c, const char *text);

/* The coordinator of a suite whose tests each want a fresh plain one:
 * th_fx_setup (a checked fixture, so it runs in the test's process)
 * starts th_fx_coord without extra args, th_fx_teardown stops it and
 * fails the test unless it exited 0. A suite that needs args starts
 * th_fx_coord itself and still stops it with th_fx_teardown. */
extern struct th_coord th_fx_coord;
void th_fx_setup(void);
void th_fx_teardown(void);

/* Builds a suite: th_suite_case adds a test case with a timeout in
 * seconds (0: Check's default), a checked fixture (NULL, NULL for none)
 * and the tests, NULL terminated; it returns the case for what else it
 * needs (a loop test, an unchecked fixture). th_suite is a suite of one
 * such case. */
TCase *th_suite_case(Suite *s, const char *name, int timeout_s, SFun setup,
    SFun teardown, ...) __attribute__((sentinel));
Suite *th_suite(const char *name, const char *case_name, int timeout_s,
    SFun setup, SFun teardown, ...) __attribute__((sentinel));

/* cohort_options of rank `rank` of a world-rank job at url, token "tok";
 * the rest at their defaults, for the caller to change. */
void th_member_options(
    cohort_options *o, const char *url, const char *job, int rank, int world);

/* Polls cond(arg) every delay_ms up to tries times. */
bool th_wait_until(bool (*cond)(void *), void *arg, int tries, int delay_ms);
/* Whether the process *(pid_t *)pid has ended (gone, or a zombie): a
 * th_wait_until condition for a process this one is not the parent of. */
bool th_pid_gone(void *pid);

/* Milliseconds on CLOCK_MONOTONIC. */
int64_t th_now_ms(void);

/* Reads a whole file (malloc'd, NUL-terminated) or NULL. */
char *th_read_file(const char *path);
/* Does the file at path contain text? (false if it cannot be read) */
bool th_file_has(const char *path, const char *text);

/* A scratch directory for this test (removed by th_cleanup at exit). */
const char *th_tmpdir(void);

/* A tmpfs at dir (opts: "size=300k"), unmounted at the latest when the
 * test's process exits, even after a failed assertion. False where it
 * cannot be mounted (not root): skip with a SKIP line. Root ignores
 * permission bits, so a read-only or full file system is how a test
 * makes writes really fail. */
bool th_tmpfs_mount(const char *dir, const char *opts);
/* Remount (read-only, or with new opts such as a larger size). */
void th_tmpfs_remount(const char *dir, bool ro, const char *opts);
void th_tmpfs_umount(const char *dir);
/* The runner: remember its pid (before any test), and unmount what
 * failed tests left mounted (after them). */
void th_set_runner(void);
void th_tmpfs_cleanup(void);

/* N real worker processes (build/bin/cohort-test-worker SCENARIO ARG) in
 * one job of a running cohortd; rank r's stdout+stderr go to out[r]. */
#define TH_MAX_WORKERS 64
struct th_workers {
	int n;
	pid_t pid[TH_MAX_WORKERS];
	int status[TH_MAX_WORKERS]; /* exit code, -1 while running */
	char out[TH_MAX_WORKERS][256];
};
/* rank < 0 in ranks (or ranks NULL) lets cohortd assign. extra_env: more
 * "K=V" entries for every worker (NULL terminated, may be NULL). */
void th_workers_start(struct th_workers *w, const struct th_coord *c,
    const char *job, const char *token, int n, const char *scenario,
    const char *arg, const char *const *extra_env);
/* The same with another worker binary of build/bin (cohort-coll-worker). */
void th_workers_start_bin(struct th_workers *w, const struct th_coord *c,
    const char *bin, const char *job, const char *token, int n,
    const char *scenario, const char *arg, const char *const *extra_env);
/* Have all of w's workers printed READY? (a th_wait_until condition) */
bool th_workers_ready(void *w);
/* Waits (tries x delay_ms) until all print READY; fails the test if not. */
void th_workers_await_ready(struct th_workers *w, int tries, int delay_ms);
/* The fault tests' start: waits (30 s) until all of w print READY, lets
 * them settle for settle_ms, sends sig to pid (a worker or cohortd) and
 * returns when it did (th_now_ms). */
int64_t th_signal_when_ready(
    struct th_workers *w, pid_t pid, int sig, int settle_ms);
/* Waits for all, bounded; kills stragglers (and fails the test) after
 * timeout_ms. Returns the number of workers that exited 0. */
int th_workers_wait(struct th_workers *w, int timeout_ms);
/* th_workers_start, then th_workers_wait(w, timeout_ms): runs them to
 * their end; the number that exited 0. */
int th_workers_run(struct th_workers *w, const struct th_coord *c,
    const char *job, const char *token, int n, const char *scenario,
    const char *arg, const char *const *extra_env, int timeout_ms);
/* COHORT_TEST_SEED, or one from the clock (failures print it: rerun with
 * COHORT_TEST_SEED=that). */
unsigned long th_test_seed(void);
/* Runs scenario of worker bin (build/bin) on n ranks of job at th_fx_coord
 * with token "tok", argv[2] a seed (th_test_seed) and extra env; fails the
 * test unless every rank exits 0 with "failed=0" and no "FAIL" in its
 * output. Bounded: on a hang past timeout_ms, kills the ranks and fails
 * with the tail of each one's output (the worker may print a STUCK line
 * naming what it is blocked in). */
void th_scenario_expect(const char *bin, const char *job, int n,
    const char *scenario, const char *const *env, int timeout_ms);
/* Does worker r's output contain text? */
bool th_worker_output_has(const struct th_workers *w, int r, const char *text);
/* Worker r's output (malloc'd) for diagnostics. */
char *th_worker_output(const struct th_workers *w, int r);
/* Fails the test unless ranks [0, nranks) of w all printed want (the
 * message quotes the first rank that did not). */
void th_workers_expect(
    const struct th_workers *w, int nranks, const char *want);
/* Fails the test unless worker r (its output o) was told of rank victim's
 * loss: it exited 3, printed lost (its first failed call's RESULT line),
 * named "rank <victim>" and printed "RESULT sticky
 * status=COHORT_EPEERLOST" (a later call got the same). */
void th_expect_peer_lost(const struct th_workers *w, int r, const char *o,
    const char *lost, int victim);

#endif /* COHORT_CHECK_COHORT_H */
