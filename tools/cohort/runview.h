/*
 * runview.h - what `cohort run` learns about its job from cohortd, and
 * what the launchers of a job's nodes tell each other through it
 * (runview.c).
 *
 * A launcher sees its own workers end; the rest it asks cohortd:
 *
 *  - the job's state at one moment (a StatusQuery): its generation, the
 *    rank that failed first and its text, that rank's host and last
 *    operation, and a rendezvous in progress (who has joined, since
 *    when). The launcher polls it while its workers rendezvous, so that
 *    a rendezvous that never completes is reported as such, with the
 *    missing ranks, and not as the previous generation's failure.
 *  - exit records: how a worker ended (exit status, signal, whether its
 *    launcher stopped it), published by the launcher of its node in the
 *    job's key-value store (key cohort.run/exit/ATTEMPT/RANK) and read by
 *    the others, so that every node's report names the real status and
 *    signal of a rank it does not host.
 *
 * One connection (a cohort__coord engine, not a member of the job) serves
 * every call; each call is bounded by its timeout.
 */
#ifndef COHORT_TOOLS_RUNVIEW_H
#define COHORT_TOOLS_RUNVIEW_H

#include <stdbool.h>
#include <stdint.h>

#include "cohort/cohort.h"

struct cohort__run_link;

/* The job at one moment. */
struct cohort__run_view {
	bool have; /* cohortd answered and holds the job */
	uint64_t generation;
	char state[32]; /* rendezvous, running, failed, finished */
	int world;
	int failed_rank; /* first member that failed this generation, -1 */
	char failed_text[4096]; /* COHORT__DETAIL_MAX: a whole traceback */
	/* the failed rank's member record */
	char host[128];
	uint32_t pid;
	char last_op[128];
	uint64_t last_op_seq;
	char member_state[32];
	/* cohortd's failure record (proto Failure): its kind, "" if none */
	char failure_kind[32];
	/* a rendezvous in progress */
	bool rdzv;
	uint64_t rdzv_waiting_ms;
	int rdzv_world, rdzv_joined;
	char rdzv_missing[256]; /* "2, 3" */
	/* an elastic job's range (0, 0: not elastic) and the processes
	 * waiting to be admitted at its next step boundary */
	int min_world, max_world, joiners_waiting;
	/* cohortd did not answer: why (have is false) */
	char unreachable[512];
};

/* How one worker ended, for the launchers of the other nodes. */
struct cohort__run_exit {
	int rank;
	int exit_code; /* the shell's: status, or 128 + signal */
	int signal; /* 0: it exited */
	int stop_sig; /* the signal its launcher stopped it with, 0: none */
	int node; /* node rank */
	char host[64];
};

/* Starts dialing url for job (with token); never blocks. NULL when out
 * of memory or url is not a URL (said on stderr). */
struct cohort__run_link *cohort__run_link_open(
    const char *url, const char *job, const char *token);
void cohort__run_link_close(struct cohort__run_link *l);

/* Fills *v from a StatusQuery, waiting at most timeout_ms. */
void cohort__run_view_get(
    struct cohort__run_link *l, int timeout_ms, struct cohort__run_view *v);

/* Publishes e for attempt (COHORT_RESTART_COUNT of the workers). The job
 * must exist at cohortd (a worker joined it). Best effort: the status is
 * returned for the log. */
cohort_status cohort__run_exit_publish(struct cohort__run_link *l, int attempt,
    const struct cohort__run_exit *e, int timeout_ms);

/* Waits up to timeout_ms for the record of rank in attempt: COHORT_OK and
 * *e, or COHORT_ETIMEDOUT (no launcher published it), or the error. */
cohort_status cohort__run_exit_fetch(struct cohort__run_link *l, int attempt,
    int rank, int timeout_ms, struct cohort__run_exit *e);

/* "killed by signal 9 (Killed) on node 1 (h2)", or "stopped by cohort
 * run (SIGTERM) on node 1 (h2)", into buf. */
const char *cohort__run_exit_describe(
    const struct cohort__run_exit *e, char *buf, size_t len);

#endif /* COHORT_TOOLS_RUNVIEW_H */
