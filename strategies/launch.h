/*
 * launch.h - the launcher core: start child processes (a program with its
 * environment, or a function after fork), tie them to their parent, stop
 * a group of them after a failure (grace period, SIGTERM, SIGKILL), and
 * reap them. One implementation for every launcher of the tree:
 * cohort_spawn (spawn.c), `cohort run` and `cohort bench`
 * (tools/cohort/run.c, bench.c).
 *
 * It lives in strategies/ because cohort_spawn, a strategy, is one of its
 * users and strategies/ sees only the public header and itself; tools/
 * may look inside the parts below it, so the CLI includes this header and
 * links libcohort_strategies.a. It is internal (cohort__ names, not
 * installed, hidden in libcohort_strategies.so) and uses no cohort call:
 * only POSIX and Linux's prctl and sched_setaffinity.
 *
 *   struct cohort__proc p[N];
 *   struct cohort__launch l;
 *   cohort__launch_init(&l, p, N, grace_ms, term_ms);
 *   for (i...) cohort__proc_start(&p[i], &spec, err, sizeof(err));
 *   while (cohort__launch_alive(&l) > 0) {
 *       while ((i = cohort__launch_reap(&l, now)) >= 0) ... p[i].status
 *       cohort__launch_tick(&l, now);   // the stop sequence, when due
 *       ... wait a little (poll on pipes, usleep) ...
 *   }
 *
 * The stop sequence. The first child that fails (ends with a non-zero
 * status or a signal the launcher did not send) starts it: the others get
 * grace_ms to stop by themselves (they learn of the failure from cohortd
 * and stop within milliseconds), then every child still running is sent
 * SIGTERM and SIGCONT (a stopped child acts on SIGTERM only once
 * continued), then after term_ms SIGKILL; with term_ms < 0 SIGKILL comes
 * right at the end of the grace period. A caller starts it itself for
 * other reasons (a forwarded signal, a deadline) with
 * cohort__launch_stop_after. Every child the sequence signals is marked
 * (cohort__proc.stopped), so that a report can say "stopped by the
 * launcher" instead of "killed by signal 15".
 *
 * Tie to the parent. Every child is started with PR_SET_PDEATHSIG
 * (spec.death_sig, SIGKILL by default), checked against the race with a
 * parent that died before the prctl: a launcher that is killed leaves no
 * process behind. Linux sends it when the *thread* that forked exits, so
 * start children from a thread that outlives them (cohort run's and
 * cohort bench's main thread, the thread in cohort_spawn).
 *
 * Between fork and exec the child makes only async-signal-safe calls
 * (prctl, getppid, dup2, execve, write, _exit; and sched_setaffinity, not
 * on POSIX's list but a bare system call in glibc), so a launcher may fork
 * while other threads (an embedded cohortd, nng) run. A function child
 * (spec.fn) runs arbitrary code after fork: only a process that runs no
 * other thread may use it (cohort_spawn checks that nng is not running).
 */
#ifndef COHORT_STRATEGIES_LAUNCH_H
#define COHORT_STRATEGIES_LAUNCH_H

#include <stdbool.h>
#include <stddef.h>
#include <sched.h>
#include <stdint.h>
#include <sys/types.h>

/* One child. Zeroed (or set by cohort__launch_init) before it starts. */
struct cohort__proc {
	pid_t pid; /* > 0 once started */
	bool running; /* started and not reaped yet */
	int status; /* raw wait status, once reaped */
	int64_t end_ms; /* when it was reaped (the `now` of the reap) */
	int sent_sig; /* the last signal the launcher sent it (0: none) */
	bool stopped; /* signalled by the stop sequence */
};

/* How to start one child. */
struct cohort__proc_spec {
	/* The program: a path, or a name looked up in PATH (as execvp);
	 * NULL to run fn instead. */
	const char *path;
	char *const *argv; /* NULL-terminated */
	/* Its whole environment (NULL: this process's). cohort__launch_env
	 * builds one from a few variables over the inherited ones. */
	char *const *envp;
	/* Without path: run in the forked child, which then _exit()s with
	 * its return value (masked to 0..255, non-zero kept non-zero). */
	int (*fn)(void *arg);
	void *arg;
	/* >= 0: made the child's stdout / stderr (dup2); -1: inherited. */
	int stdout_fd, stderr_fd;
	/* PR_SET_PDEATHSIG of the child; 0 = SIGKILL. */
	int death_sig;
	/* The CPUs the child may run on (sched_setaffinity before exec or
	 * fn; its threads inherit them); NULL: the launcher's. */
	const cpu_set_t *cpus;
};

/*
 * CPU binding of a node's ranks (`cohort run --bind`, `cohort bench
 * --bind`, COHORT_BIND), for CPU training where each rank's intra-op
 * threads and its data plane's polling compete for the node's cores:
 *   "none"   no binding: the ranks inherit the launcher's CPUs (the
 *            default, as torchrun's; two jobs sharing a node are not
 *            pinned onto the same cores);
 *   "cores"  the launcher's CPUs (sched_getaffinity: a cpuset or a
 *            taskset are honoured) in ascending order, split into
 *            min(nslots, CPUs) contiguous slices as even as possible
 *            (the first CPUs % slices get one more); slot i runs on
 *            slice i % slices: its own cores when the node has at
 *            least one per rank, else one core shared round-robin.
 * Returns 0 with *out set (bind), ENOENT for "none" (do not bind), or
 * EINVAL / an errno value with a message in err.
 */
int cohort__launch_cpus(const char *mode, int slot, int nslots, cpu_set_t *out,
    char *err, size_t errlen);

/* A spec with no program, fds inherited, SIGKILL on parent death. */
void cohort__proc_spec_init(struct cohort__proc_spec *s);

/* Starts one child. 0 and p->pid, p->running; or an errno value and a
 * message in err (errlen bytes: "cannot start PROG: No such file or
 * directory"), with nothing left running: a program that cannot be
 * executed is reported here, not as an exit status 127 later. */
int cohort__proc_start(struct cohort__proc *p,
    const struct cohort__proc_spec *s, char *err, size_t errlen);

/* Stops one child: SIGTERM, up to grace_ms for it to exit, then SIGKILL;
 * reaps it. p->status and p->end_ms are set. No-op when not running. */
void cohort__proc_stop(struct cohort__proc *p, int64_t grace_ms);

/* The environment of a child: vars[0..n) ("NAME=VALUE") first, then
 * every inherited variable whose name is not among them. The returned
 * array (NULL-terminated; NULL when out of memory) points into vars and
 * environ: free() the array only, after the child started. */
char **cohort__launch_env(const char *const *vars, size_t n);

/* "exited with status N", "killed by signal N (Name)", into buf. */
const char *cohort__launch_describe(int status, char *buf, size_t len);
/* The shell's number for a wait status: the exit status, or 128 + the
 * signal. */
int cohort__launch_code(int status);
/* Whether a reaped child failed: a non-zero status, or a signal other
 * than the last one the launcher sent it. */
bool cohort__proc_failed(const struct cohort__proc *p);

/* Milliseconds of CLOCK_MONOTONIC: the `now` of the calls below. */
int64_t cohort__launch_now_ms(void);

/* How many threads of this process are named `name` (their
 * /proc/self/task/<tid>/comm), or have a name starting with it when
 * prefix is true; -1 if /proc/self/task cannot be read. cohort_spawn
 * asks it whether nng runs here ("nng:" threads) before it forks. */
int cohort__threads_named(const char *name, bool prefix);

/* A group of children and its stop sequence (above). */
struct cohort__launch {
	struct cohort__proc *procs;
	int n;
	int64_t grace_ms; /* after a failure, before SIGTERM */
	int64_t term_ms; /* after SIGTERM, before SIGKILL; < 0: no SIGTERM */
	int first_failed; /* index of the first failed child, -1 */
	int64_t term_at, kill_at; /* due times; INT64_MAX: not scheduled */
	/* A child's failure does not start the stop sequence (the workers
	 * of an elastic job live on without a lost one); false by
	 * default. */
	bool independent;
};

/* procs[0..n) are zeroed; the group starts with no stop scheduled. */
void cohort__launch_init(struct cohort__launch *l, struct cohort__proc *procs,
    int n, int64_t grace_ms, int64_t term_ms);

/* Children started and not yet reaped. */
int cohort__launch_alive(const struct cohort__launch *l);

/* Reaps one child that has exited (never blocks): its index, or -1 when
 * none has. The first failed child (cohort__proc_failed) is recorded in
 * l->first_failed and schedules the stop sequence at now + grace. Call
 * until it returns -1. */
int cohort__launch_reap(struct cohort__launch *l, int64_t now);

/* Schedules the stop sequence at now + grace_ms, unless one is already
 * due sooner. */
void cohort__launch_stop_after(
    struct cohort__launch *l, int64_t now, int64_t grace_ms);

/* Sends what the stop sequence has due at now. */
void cohort__launch_tick(struct cohort__launch *l, int64_t now);

/* Sends sig to every running child (a forwarded SIGINT, SIGTERM). */
void cohort__launch_signal(struct cohort__launch *l, int sig);

/* SIGKILL to every running child, then reaps them all (blocking; a
 * SIGKILLed child always ends). For errors on the way up. */
void cohort__launch_kill_all(struct cohort__launch *l);

#endif /* COHORT_STRATEGIES_LAUNCH_H */
