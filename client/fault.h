/*
 * fault.h - fault injection as a feature (docs/fault-injection.md,
 * docs/failures.md): a seeded, deterministic schedule that makes
 * rank R at collective N (or at time T) exit, be killed, stop, delay its
 * operations, drop its connections, or fail its next operation.
 *
 * Sources: COHORT_FAULTS in the environment (read at cohort_client_open,
 * inherited from `cohort run`), and `cohort fault`, which stores a
 * schedule in the job's KV under __cohort/faults/N; every client waits for
 * the next N with one KV get parked at cohortd (a long poll of at most
 * 60 s, started again by the next heartbeat), so a schedule arrives as
 * soon as it is stored, and an idle client sends nothing for it.
 *
 * Grammar (whitespace around tokens is ignored):
 *
 *   spec    := item (';' item)*
 *   item    := 'seed=' U64 | rule
 *   rule    := field (',' field)*      (rank, at and action required)
 *   field   := 'rank=' (N | 'random' | 'all')
 *            | 'at=' ('op:' ['+'] N | 'op:random:' N '-' N
 *                    | 'time:' ['+'] DUR | 'time:random:' DUR '-' DUR)
 *            | 'action=' ('exit' [':' CODE] | 'kill' | 'stop'
 *                        | 'delay:' DUR | 'drop' | 'fail')
 *            | 'count=' N               (delay: consecutive operations)
 *            | 'run=' (N | 'any')       (restart count; default 0)
 *   DUR     := N ['ms' | 's' | 'm']     (no unit: milliseconds)
 *
 * Operations are counted per rank from 1 over all its collectives and
 * barriers (control and data plane, all groups) in the order it enters
 * them; time from the client's open ('+': from when the rule arrived).
 * Random ranks and triggers are drawn from the seed (splitmix64 over the
 * seed and the rule's index), so every rank computes the same plan and the
 * same seed gives the same injections. Without a seed, one is derived from
 * the job's id and logged.
 */
#ifndef COHORT_FAULT_H
#define COHORT_FAULT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort_impl.h"

struct cohort__coord;
struct cohort__fault;

#define COHORT__FAULT_MAX_RULES 64
#define COHORT__FAULT_RANK_RANDOM (-1)
#define COHORT__FAULT_RANK_ALL (-2)
#define COHORT__FAULT_RUN_ANY (-1)
/* Default exit code of action=exit. */
#define COHORT__FAULT_EXIT_CODE 42
/* KV keys of `cohort fault` (reserved prefix). */
#define COHORT__FAULT_KEY_COUNT COHORT__KV_RESERVED "faults/count"
#define COHORT__FAULT_KEY_PREFIX COHORT__KV_RESERVED "faults/"

enum cohort__fault_action {
	COHORT__FAULT_EXIT = 0,
	COHORT__FAULT_KILL,
	COHORT__FAULT_STOP,
	COHORT__FAULT_DELAY,
	COHORT__FAULT_DROP,
	COHORT__FAULT_FAIL,
};

enum cohort__fault_trigger {
	COHORT__FAULT_AT_OP = 0,
	COHORT__FAULT_AT_TIME,
};

struct cohort__fault_rule {
	int32_t rank; /* >= 0, RANK_RANDOM (until resolved), RANK_ALL */
	enum cohort__fault_trigger trigger;
	bool relative; /* '+': counted from the rule's arrival */
	bool random_at; /* 'random:LO-HI' (until resolved) */
	uint64_t at; /* operation number, or milliseconds */
	uint64_t at_lo, at_hi;
	enum cohort__fault_action action;
	int64_t arg; /* exit code, delay in ms */
	uint32_t count; /* delay: consecutive operations (>= 1) */
	int32_t run; /* restart count it applies to, RUN_ANY */
};

struct cohort__fault_plan {
	uint64_t seed;
	bool seed_given;
	bool resolved;
	size_t n;
	struct cohort__fault_rule rules[COHORT__FAULT_MAX_RULES];
};

/* Parses a schedule. COHORT_EINVAL with a detail naming the offending
 * item and what was expected. An empty spec is a plan without rules. */
cohort_status cohort__fault_parse(
    const char *spec, struct cohort__fault_plan *plan);

/* Draws the random ranks and triggers from the plan's seed (dflt_seed if
 * the spec gave none) for a job of `world` ranks. Deterministic. Ranks
 * beyond the world are COHORT_EINVAL. */
cohort_status cohort__fault_resolve(
    struct cohort__fault_plan *plan, uint64_t dflt_seed, int32_t world);

/* The plan in canonical form ("seed=42;rank=2,at=op:100,action=kill;..."),
 * like snprintf (returns the length the full text needs). */
size_t cohort__fault_format(
    const struct cohort__fault_plan *plan, char *buf, size_t len);
size_t cohort__fault_format_rule(
    const struct cohort__fault_rule *r, char *buf, size_t len);
const char *cohort__fault_action_name(enum cohort__fault_action a);

/* Client side. What the fault machinery needs of its client, given at
 * cohort__fault_open, so that fault.c knows no client: fail the client
 * (drop), announce the operation it dies in and report the failure
 * (exit). ctx is passed back to each. */
struct cohort__fault_hooks {
	void *ctx;
	void (*fail)(void *ctx, cohort_status st, const char *detail);
	void (*heartbeat_now)(
	    void *ctx, const char *kind, const char *group, uint64_t seq);
	cohort_status (*report)(
	    void *ctx, const char *text, cohort_duration timeout);
};

#define COHORT__FAULT_JOB_MAX 128

/* Who the member is, known after its join (copied by fault_start). */
struct cohort__fault_member {
	const char *job;
	int32_t rank;
	int32_t world;
	uint64_t generation;
	uint64_t job_id;
	struct cohort__coord *coord; /* `cohort fault` lookups, drop */
};

/* open: parses COHORT_FAULTS (EINVAL on a bad spec, before anything
 * connects) into a new *out; start: after the join, resolves it for this
 * rank and starts the time triggers and the `cohort fault` lookup; stop:
 * no trigger fires any more (before the client stops its liveness);
 * close: stop, free *fp and set it NULL (NULL-safe). */
cohort_status cohort__fault_open(
    const struct cohort__fault_hooks *hooks, struct cohort__fault **out);
cohort_status cohort__fault_start(
    struct cohort__fault *f, const struct cohort__fault_member *m);
void cohort__fault_stop(struct cohort__fault *f);
void cohort__fault_close(struct cohort__fault **fp);

/* The fault point of an operation (cohort__group_op_begin) kind #seq on
 * the group named group: counts it and fires what is due. Returns
 * COHORT_OK, or COHORT_EINJECTED with a detail (action=fail, drop);
 * exit/kill do not return, stop returns after SIGCONT, delay after the
 * delay. Cheap when nothing is scheduled; COHORT_OK when f is NULL. */
cohort_status cohort__fault_point(struct cohort__fault *f, const char *group,
    const char *kind, uint64_t seq);

/* Looks for the next `cohort fault` schedule (from the heartbeat timer;
 * never blocks; does nothing while the previous look is out). */
void cohort__fault_tick(struct cohort__fault *f);

/* Adds a schedule at run time (what `cohort fault` delivers). */
cohort_status cohort__fault_add(
    struct cohort__fault *f, const char *spec, uint64_t salt);

#endif /* COHORT_FAULT_H */
