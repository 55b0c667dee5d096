/*
 * journal.h - what cohortd must not lose, on disk (`--state-dir DIR`).
 *
 * DIR holds `snapshot` (the whole state at one point) and `log.<epoch>`
 * (every state change since), both sequences of records
 *
 *     [u32 len][u32 crc32c][len bytes: u8 type, body]     (little endian)
 *
 * after a 16-byte header (8-byte magic, u64 epoch). Bodies are packed by
 * hand: u8/u32/u64 little endian, strings and bytes as u32 length +
 * bytes. A snapshot ends with an END record and is written to
 * `snapshot.tmp`, fsynced and renamed, so it is whole or absent; the log
 * of its epoch starts empty. `manifest` names the epoch whose snapshot
 * and log hold the state, so a lost log or snapshot is an error, not an
 * empty start. A torn last log record (crash in the middle of a write:
 * short, or zeros) is cut off; any other bad record is damage: cohortd
 * refuses to start, unless --recover (keep every whole record, move the
 * damaged file aside, write the state as a new snapshot).
 *
 * Records are logical: a job's token, a formed generation with its member
 * table (rank -> client_id, host, pid), failures and departures, complete
 * groups, KV puts/appends/deletes, and the cached reply of every mutating
 * request (client_id, seq, reply bytes) so that a request retried after a
 * restart is answered from the cache instead of being applied twice.
 * Parked requests are not journalled: clients re-send them.
 *
 * Records are buffered while a request is handled and written with one
 * write() before its replies leave (srv_jrn_flush from srv_core_event_end,
 * at the end of every entry point), so a `kill -9` loses nothing. fdatasync:
 * SRV_FSYNC_BATCH (default) at most every 100 ms from the sweep, outside the
 * server mutex; SRV_FSYNC_ALWAYS before the replies leave; SRV_FSYNC_NONE
 * never.
 *
 * Compaction: when the log exceeds max(64 MiB, 2 x snapshot), a snapshot
 * is written and a new log (epoch + 1) started, so the bytes written stay
 * within a small multiple of the bytes changed. A write error (a full
 * disk) is never acknowledged: the event's OK replies become
 * COHORT_EJOURNAL (srv_core_event_end), and later changes are refused
 * before they are applied until a snapshot succeeds, retried every
 * second (srv_journal_writable).
 *
 * The modules: record.c (the format), log.c (the writer, below the
 * state: the state modules write their records through it), snapshot.c
 * and replay.c (above the state: they read it, and rebuild it through its
 * functions), and this file's open and compaction triggers.
 */
#ifndef COHORT_SRV_JOURNAL_H
#define COHORT_SRV_JOURNAL_H

#include "core/core.h"
#include "log.h"

struct srv_jrn_opts {
	const char *dir;
	enum srv_fsync fsync;
	uint64_t compact_min; /* 0 = 64 MiB */
	/* Damage in the snapshot or log: keep every whole record, move
	 * the damaged file aside (cohortd --recover) instead of refusing
	 * to start. */
	bool recover;
};

/* Opens (creates) the state directory, replays snapshot + log into the
 * core and keeps the log open for appending (core->jrn). Call right
 * after srv_core_new, before any request. COHORT_EJOURNAL, EEXIST (in
 * use by another cohortd), EINVAL, ENOMEM: detail in cohort_last_error().
 */
cohort_status srv_journal_open(
    struct srv_core *core, const struct srv_jrn_opts *o, cohort__time now);
/* After every event: a snapshot if one is due (the log outgrew its bound,
 * or a retry while the journal cannot be written). */
void srv_journal_tick(struct srv_core *core, cohort__time now);
/* Whether a state change can be journalled now; while it cannot, a
 * snapshot is retried at most every second (the disk may have room
 * again). True without a journal. */
bool srv_journal_writable(struct srv_core *core, cohort__time now);
/* Writes what is buffered, syncs and closes the journal: nothing more is
 * journalled (a stop). */
void srv_journal_close(struct srv_core *core);

#endif /* COHORT_SRV_JOURNAL_H */
