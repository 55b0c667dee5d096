/*
 * snapshot.h - compaction: the whole state written as a snapshot of the
 * next epoch, whose log starts empty (snapshot.c).
 */
#ifndef COHORT_SRV_SNAPSHOT_H
#define COHORT_SRV_SNAPSHOT_H

#include "core/core.h"

/* Writes a snapshot of every job now and starts a new log. COHORT_OK, or
 * COHORT_EJOURNAL: the journal is broken (changes are refused) until a
 * snapshot succeeds. Nothing without a journal. */
cohort_status srv_snapshot_compact(struct srv_core *core);

#endif /* COHORT_SRV_SNAPSHOT_H */
