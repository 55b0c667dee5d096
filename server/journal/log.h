/*
 * log.h - the journal's writer (`--state-dir DIR`): what cohortd must
 * not lose, appended to DIR/log.<epoch> below the state modules.
 *
 * Records are buffered while an event (a request, a sweep, a closed
 * connection) is handled and written with one write(), as one BATCH
 * record, before the event's replies leave (srv_jrn_flush from
 * srv_core_event_end), so a `kill -9` loses nothing acknowledged.
 * fdatasync: SRV_FSYNC_BATCH (default) at most every 100 ms from the
 * sweep, outside the server mutex (srv_jrn_sync_fd); SRV_FSYNC_ALWAYS
 * before the replies leave; SRV_FSYNC_NONE never.
 *
 * A write error (a full disk) is never acknowledged: the event's OK
 * replies become COHORT_EJOURNAL, and the journal is *broken*: later
 * changes are refused before they are applied until a snapshot succeeds
 * (journal.c retries every second). When the log grows past max(64 MiB,
 * 2 x snapshot) a snapshot is due (srv_jrn_compact_due; snapshot.c).
 *
 * Every function takes the writer, and is a no-op (flush: true) for
 * NULL: cohortd without --state-dir.
 */
#ifndef COHORT_SRV_LOG_H
#define COHORT_SRV_LOG_H

#include "cohort_common.h"
#include "record.h"

enum srv_fsync {
	SRV_FSYNC_BATCH = 0, /* fdatasync at most every 100 ms (sweep) */
	SRV_FSYNC_ALWAYS, /* fdatasync before the replies leave */
	SRV_FSYNC_NONE, /* left to the kernel */
};

struct srv_jrn_stats {
	uint64_t records;
	uint64_t bytes; /* appended to the log since start */
	uint64_t log_bytes; /* current log size */
	uint64_t snap_bytes; /* current snapshot size */
	uint64_t fsyncs;
	uint64_t compactions;
	uint64_t errors;
	uint64_t replayed; /* records applied at start */
	uint64_t replay_ms;
};

/* The writer; its fields are the journal modules' own. */
struct srv_jrn {
	char *dir;
	int dfd;
	int fd; /* log.<epoch>, O_APPEND */
	int lockfd;
	uint64_t epoch;
	enum srv_fsync fsync;
	uint64_t compact_min;
	struct srv_jbuf buf;
	bool dirty; /* written since the last fdatasync */
	bool broken; /* a write failed: nothing is journalled until a
	                snapshot succeeds */
	bool lost; /* this event had records while broken */
	char problem[384]; /* why it is broken */
	cohort__time retry_at;
	struct srv_jrn_stats st;
};

/* A snapshot is retried this often while the journal is broken. */
#define JRN_RETRY_MS 1000
/* Snapshots are written in chunks of this. */
#define JRN_FLUSH_CHUNK (1u << 20)

/* Writes the buffered records (srv_core_event_end calls it before the
 * event's replies leave). False if the event's records could not be
 * written (the journal is then broken). */
bool srv_jrn_flush(struct srv_jrn *j, cohort__time now);
/* Whether a snapshot is due now: the log outgrew its bound, or the
 * journal is broken and a retry is due (at most every JRN_RETRY_MS). */
bool srv_jrn_compact_due(struct srv_jrn *j, cohort__time now);
/* Whether a change can be journalled (not broken). */
bool srv_jrn_writable(const struct srv_jrn *j);
/* Why the journal cannot be written ("cohortd cannot append to its
 * --state-dir DIR (No space left on device)"), or NULL. */
const char *srv_jrn_problem(const struct srv_jrn *j);
/* The transport's batched fdatasync failed: replies already left, so the
 * journal is broken until a snapshot succeeds. */
void srv_jrn_sync_failed(struct srv_jrn *j, int err);
/* For the transport: a descriptor to fdatasync and close outside the
 * mutex, or -1 if nothing is due (SRV_FSYNC_BATCH only). */
int srv_jrn_sync_fd(struct srv_jrn *j);
/* Writes what is buffered, syncs, closes and frees j. */
void srv_jrn_close(struct srv_jrn *j);
/* j's counters (zeros for NULL). */
void srv_jrn_stats(const struct srv_jrn *j, struct srv_jrn_stats *st);

/* Records of the current event, each after its job's JOB record when
 * that is not written yet. Nothing is buffered while the journal is
 * broken (the event is then not acknowledged). */
void srv_jrn_gen(struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t gen,
    uint32_t world, const struct srv_jrn_member *m);
void srv_jrn_fail(struct srv_jrn *j, struct srv_jrn_job *jj, int32_t rank,
    const char *text, const char *detail);
/* Elastic: a generation (rs->m NULL: its table could not be made, the
 * event is not acknowledged), and the members holding the state. */
void srv_jrn_reshape(
    struct srv_jrn *j, struct srv_jrn_job *jj, const struct srv_jrn_egen *rs);
void srv_jrn_hold(struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t gen,
    uint32_t world, const bool *has_state);
void srv_jrn_leave(struct srv_jrn *j, struct srv_jrn_job *jj, int32_t rank);
void srv_jrn_group(struct srv_jrn *j, struct srv_jrn_job *jj,
    const char *group, uint32_t n, const int32_t *ranks);
void srv_jrn_kv_put(struct srv_jrn *j, struct srv_jrn_job *jj, const char *key,
    const void *val, size_t len);
void srv_jrn_kv_append(struct srv_jrn *j, struct srv_jrn_job *jj,
    const char *key, const void *val, size_t len);
void srv_jrn_kv_del(
    struct srv_jrn *j, struct srv_jrn_job *jj, const char *key);
void srv_jrn_reply(struct srv_jrn *j, struct srv_jrn_job *jj,
    uint64_t client_id, uint64_t seq, nng_msg *reply);
/* A client whose replies are in the journal is gone. */
void srv_jrn_client_del(
    struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t client_id);
/* The job is removed (nothing if its JOB record was never written). */
void srv_jrn_job_del(struct srv_jrn *j, struct srv_jrn_job *jj);

/* For the journal's own modules: files of the state directory. */
int srv_jrn_write_all(int fd, const uint8_t *p, size_t n);
void srv_jrn_hdr_fill(uint8_t *h, const char *magic, uint64_t epoch);
void srv_jrn_log_name(char *buf, size_t len, uint64_t epoch);
/* Creates log.<epoch> with its header (replacing one that exists);
 * returns its descriptor, or -1 with errno. */
int srv_jrn_log_create(struct srv_jrn *j, uint64_t epoch);
/* Writes the manifest naming epoch (tmp, fsync, rename); -1 with errno. */
int srv_jrn_man_write(struct srv_jrn *j, uint64_t epoch);
/* Frees a writer (and closes its files) that never became the core's. */
void srv_jrn_free(struct srv_jrn *j);

#endif /* COHORT_SRV_LOG_H */
