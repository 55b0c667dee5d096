/*
 * observe.h - what a client records about its own operations
 * (docs/observability.md):
 *
 *  - metrics: per operation kind counts, errors, bytes, time and time
 *    waiting for peers, and histograms of collective time, wait time and
 *    heartbeat round trips. Lock-free (relaxed atomics); cumulative, sent
 *    to cohortd on every heartbeat and on Leave (RankMetrics);
 *  - the timeline (COHORT_TIMELINE): a bounded ring of events written as a
 *    Chrome trace / Perfetto JSON file when the client closes.
 *
 * Both are fed by one call at the end of every collective and control
 * operation (cohort__obs_op), so the cost of an operation is two clock
 * reads and a dozen uncontended atomic adds (COHORT_METRICS=0: none).
 */
#ifndef COHORT_OBSERVE_H
#define COHORT_OBSERVE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>

#include "cohort.pb-c.h"
#include "cohort_common.h"
#include "obs.h"

/* Operation kinds counted: the data-plane kinds of backend.h (1..10,
 * barrier merged with the control-plane barrier), then the other
 * control-plane ones. */
enum {
	COHORT__OBS_BROADCAST_OBJ = 11,
	COHORT__OBS_REDUCE_SCALARS,
	COHORT__OBS_DECIDE,
	COHORT__OBS_NOPS
};

struct cohort__obs_hist {
	atomic_uint_fast64_t b[COHORT__OBS_NBUCKETS];
	atomic_uint_fast64_t sum_ns;
	atomic_uint_fast64_t count;
};

struct cohort__tl; /* the timeline ring (observe.c) */

struct cohort__obs {
	bool metrics; /* COHORT_METRICS */
	atomic_uint_fast64_t count[COHORT__OBS_NOPS];
	atomic_uint_fast64_t errors[COHORT__OBS_NOPS];
	atomic_uint_fast64_t bytes[COHORT__OBS_NOPS];
	atomic_uint_fast64_t time_ns[COHORT__OBS_NOPS];
	atomic_uint_fast64_t wait_ns[COHORT__OBS_NOPS];
	struct cohort__obs_hist coll, wait, hb_rtt;
	struct cohort__tl *tl; /* NULL: no timeline */
	uint64_t hb_sent_ns; /* heartbeat in flight: when it left */
	uint64_t start_ns; /* first cohort__obs_start: what metrics cover */
	atomic_int next_track; /* timeline track of the next subgroup */
};

/* One finished operation. */
struct cohort__obs_op {
	int kind; /* 1..COHORT__OBS_NOPS-1 */
	const char *name; /* static: "allreduce", "barrier", ... */
	const char *group; /* group id ("" = the world) */
	int track; /* timeline track of the group */
	bool control; /* control plane (through cohortd) */
	uint64_t seq;
	const char *backend; /* static, NULL for the control plane */
	const char *algo; /* static or NULL */
	uint64_t bytes; /* payload of this rank */
	uint64_t t0_ns, t1_ns; /* cohort__now_ns at entry and exit */
	uint64_t wait_ns; /* of which waiting for peers */
	cohort_status st;
	const char *detail; /* st != OK: the error text, or NULL */
};

/* Reads COHORT_METRICS, COHORT_TIMELINE and COHORT_TIMELINE_EVENTS.
 * The timeline file is opened at cohort__obs_start, once the rank is
 * known. */
cohort_status cohort__obs_init(struct cohort__obs *o);
void cohort__obs_start(struct cohort__obs *o, const char *job, int32_t rank,
    int32_t world, uint64_t generation);
/* Writes the timeline (if any) and frees it. */
void cohort__obs_fini(struct cohort__obs *o);

/* Records one operation (metrics and timeline). */
void cohort__obs_op(struct cohort__obs *o, const struct cohort__obs_op *op);
/* Timeline only: a span [t0, t1] or (t1 == 0) an instant on a track. */
void cohort__obs_event(struct cohort__obs *o, int track, const char *cat,
    const char *name, uint64_t t0_ns, uint64_t t1_ns, const char *detail);
bool cohort__obs_timeline_on(const struct cohort__obs *o);
/* A span of the program's own (cohort_timeline_span) on the strategy
 * track; no-op when the timeline is off. */
void cohort__obs_span(struct cohort__obs *o, const char *name,
    uint64_t start_ns, uint64_t end_ns, uint64_t bytes);
/* A heartbeat round trip. */
void cohort__obs_rtt(struct cohort__obs *o, uint64_t ns);

/* The operation kind of a control-plane operation name. */
int cohort__obs_control_kind(const char *name);

/* Timeline tracks (Chrome trace tids) of a client's process. Data-plane
 * collectives of a group run on its track; subgroups get 10, 12, ... */
enum {
	COHORT__TRACK_WORLD = 1, /* data-plane collectives of the world */
	COHORT__TRACK_CONTROL = 2, /* barriers, object broadcasts, decisions */
	COHORT__TRACK_KV = 3, /* KV waits */
	COHORT__TRACK_STRATEGY = 4, /* DDP buckets, hooks (public API) */
	COHORT__TRACK_EVENTS = 5, /* failures, joins */
	COHORT__TRACK_GROUPS = 10,
};

/* Fills m (and its arrays, from bufs) from o's counters; false when
 * metrics are off. */
#define COHORT__OBS_MSG_OPS COHORT__OBS_NOPS
struct cohort__obs_msg {
	Cohort__RankMetrics m;
	Cohort__OpMetrics ops[COHORT__OBS_MSG_OPS];
	Cohort__OpMetrics *opp[COHORT__OBS_MSG_OPS];
	Cohort__Histogram h[3];
	uint64_t hb[3][COHORT__OBS_NBUCKETS];
};
bool cohort__obs_fill(struct cohort__obs *o, struct cohort__obs_msg *msg);

#endif /* COHORT_OBSERVE_H */
