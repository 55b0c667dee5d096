/*
 * ranks.h - per-rank metrics from the workers (ranks.c): what each
 * (job, rank) reported on its heartbeats and Leave, kept for /metrics
 * and the status page after the job ends, bounded by
 * --metrics-max-ranks.
 */
#ifndef COHORT_SRV_RANKS_H
#define COHORT_SRV_RANKS_H

#include "core/core.h"

/* Stores the cumulative metrics rank of job reported. */
void srv_obs_note(struct srv_core *core, const char *job, int32_t rank,
    const Cohort__RankMetrics *m, cohort__time now);
/* --metrics-max-ranks: (job, rank) pairs kept; 0: none. */
void srv_obs_set_max(struct srv_core *core, size_t max);
/* head (headlen bytes) followed by cohort_build_info and the per-rank
 * series, in a new malloc'd string; NULL when out of memory. */
char *srv_obs_metrics(
    struct srv_core *core, char *head, size_t headlen, cohort__time now);
void srv_obs_free(struct srv_core *core);
/* Totals over all operation kinds of (job, rank); false if none. */
bool srv_obs_totals(struct srv_core *core, const char *job, int32_t rank,
    uint64_t *count, uint64_t *bytes, uint64_t *time_ns, uint64_t *wait_ns);

#endif /* COHORT_SRV_RANKS_H */
