/*
 * replay.h - reading the state directory back into the state: the
 * snapshot, then the log of its epoch (replay.c). A torn last log record
 * (a crash in the middle of a write: short, or zeros) is cut off; any
 * other bad record is damage: an error, unless recover (keep every whole
 * record; the caller moves the damaged file aside).
 */
#ifndef COHORT_SRV_REPLAY_H
#define COHORT_SRV_REPLAY_H

#include "core/core.h"
#include "log.h"

/* Replays DIR/snapshot (absent: *have false) and sets j's epoch from it;
 * *damaged: --recover dropped something. COHORT_EJOURNAL (detail set)
 * on damage without recover, or a file that cannot be read. */
cohort_status srv_replay_snapshot(struct srv_core *core, struct srv_jrn *j,
    bool recover, bool *have, bool *damaged, cohort__time now);
/* Replays DIR/log.<epoch> and keeps it open for appending (j->fd),
 * creating it if absent; must: the manifest says this log was started
 * (it must be there). */
cohort_status srv_replay_log(struct srv_core *core, struct srv_jrn *j,
    bool must, bool recover, bool *damaged, cohort__time now);

#endif /* COHORT_SRV_REPLAY_H */
