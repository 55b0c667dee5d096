/*
 * timeline.h - one job-wide timeline from the workers' traces (`cohort
 * run --timeline`, `cohort timeline merge`; timeline.c).
 */
#ifndef COHORT_TOOLS_TIMELINE_H
#define COHORT_TOOLS_TIMELINE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* An instant of a launcher's own row (a restart, a failure). */
struct cohort__timeline_mark {
	const char *name; /* static */
	uint64_t ts_us; /* cohort__timeline_now_us */
	char detail[512];
};

/* What cohort run's timeline needs to know of its job. */
struct cohort__timeline_job {
	const char *path; /* --timeline PATH */
	int world; /* ranks of the job */
	int nnodes, node_rank;
	/* Several nodes: how node 0's launcher gathers the others' shares
	 * (a job of the launchers, "JOB.timeline", at the same cohortd). */
	const char *url, *job, *token;
	int wait_ms; /* how long the launchers wait for each other */
};

/* Creates PATH.parts and writes the workers' COHORT_TIMELINE=... into
 * env. 0, or -1 with a message on stderr. */
int cohort__timeline_prepare(const char *path, char *env, size_t len);

/* The end of the job, on every node: this node's share is its workers'
 * traces (PATH.parts/rank*.gen*.json, removed) and its launcher's row
 * (pid world + node_rank, so that no two nodes' rows collide), with the
 * marks. One node writes PATH. Several: every launcher joins the
 * launchers' job, nodes 1.. hand their share to node 0 through its
 * key-value store, and node 0 writes PATH, the whole job's (saying which
 * nodes' shares did not come within wait_ms); a node that cannot hand
 * its share over writes it to its own PATH (`cohort timeline merge`
 * joins such files). 0, or -1 said on stderr. */
int cohort__timeline_finish(const struct cohort__timeline_job *tj,
    const struct cohort__timeline_mark *marks, int nmarks);

/* s as a quoted JSON string (the report of cohort run, the marks). */
void cohort__json_str(FILE *f, const char *s);
/* Realtime microseconds, the timelines' clock. */
uint64_t cohort__timeline_now_us(void);

#endif /* COHORT_TOOLS_TIMELINE_H */
