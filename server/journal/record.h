/*
 * record.h - the journal's record format (docs/coordinator.md, State):
 *
 *     [u32 len][u32 crc32c][len bytes: u8 type, body]     (little endian)
 *
 * Bodies are packed by hand: u8/u32/u64 little endian, strings and bytes
 * as u32 length + bytes. A file starts with a 16-byte header (8-byte
 * magic, u64 epoch). Records are logical: a job's token, a formed
 * generation with its member table, failures and departures, complete
 * groups, KV puts/appends/deletes, the cached reply of every mutating
 * request, removals. The log holds BATCH records: the records of one
 * event inside one record, replayed all or none.
 *
 * The encoders take plain values (names, numbers, bytes): the journal's
 * writer knows no state object, so the state modules can write records
 * while the replay, above them, rebuilds them through their functions.
 */
#ifndef COHORT_SRV_RECORD_H
#define COHORT_SRV_RECORD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "wire.h"

#define JRN_MAGIC_LOG "COHORTJ1"
#define JRN_MAGIC_SNAP "COHORTS1"
#define JRN_MAGIC_MAN "COHORTM1"
#define JRN_HDR 16 /* file header */
#define JRN_MAN 20 /* manifest: magic, u64 epoch, u32 crc */
#define JRN_RHDR 8 /* record header: len, crc */
/* Largest record (a batch holds at most one request's payload, which
 * --state-dir limits to 1 GiB, plus names, keys and replies). */
#define JRN_MAX_REC 0xffffffffull

enum jrn_type {
	JRN_JOB = 1, /* name, token, job_id */
	JRN_JOB_DEL, /* name */
	JRN_GEN, /* job, generation, world, per rank: client_id, host, pid,
	            local_rank, hb_ms, dead_ms */
	JRN_FAIL, /* job, rank, text, detail */
	JRN_LEAVE, /* job, rank */
	JRN_GROUP, /* job, name, n, ranks */
	JRN_KV_PUT, /* job, key, value */
	JRN_KV_APPEND, /* job, key, bytes */
	JRN_KV_DEL, /* job, key */
	JRN_REPLY, /* job, client_id, seq, reply */
	JRN_CLIENT_DEL, /* job, client_id */
	JRN_END, /* end of a snapshot */
	JRN_BATCH, /* the records of one event (log only): all or none */
	/* Elastic membership (proto/README.md section 8). */
	JRN_RESHAPE, /* job, generation, prev_generation (0: formed by a
	                rendezvous), min_world, max_world, world, per rank:
	                client_id, host, pid, local_rank, hb_ms, dead_ms,
	                prev_rank, has_state */
	JRN_HOLD, /* job, generation, world, per rank has_state: the members
	             holding the state changed at a step boundary */
	JRN_GENMAP, /* job, generation, prev_generation, n, per rank
	               prev_rank: an older change (snapshots only) */
	JRN_REMOVED, /* job, client_id, generation, rank, host, pid, text,
	                detail: a member an older change removed (snapshots
	                only) */
	JRN_TYPE_END, /* one past the last type */
};

/* Whether t is a record type that a batch (or a snapshot) holds. */
static inline bool
srv_jrn_type_plain(unsigned t)
{
	return (t >= JRN_JOB && t < JRN_TYPE_END && t != JRN_BATCH);
}

/* A job as its records name it. Its JOB record is written before its
 * first other record of a log (`written` then set) and again after its
 * token changed (`written` cleared by its owner). */
struct srv_jrn_job {
	const char *name;
	const char *token;
	uint64_t id;
	bool written;
};

/* One rank of a formed generation. */
struct srv_jrn_member {
	uint64_t client_id;
	const char *host;
	uint32_t pid;
	int32_t local_rank;
	uint32_t hb_ms;
	uint32_t dead_ms;
	/* JRN_RESHAPE only: its rank in the generation before (-1: none),
	 * whether it holds the job's state. */
	int32_t prev_rank;
	bool has_state;
};

/* One generation of an elastic job, as JRN_RESHAPE records it. */
struct srv_jrn_egen {
	uint64_t gen;
	uint64_t prev_gen; /* 0: formed by a rendezvous */
	uint32_t min_world;
	uint32_t max_world;
	uint32_t world;
	const struct srv_jrn_member *m; /* world entries */
};

/* A growing buffer of records. */
struct srv_jbuf {
	uint8_t *p;
	size_t len;
	size_t cap;
	bool oom; /* an append failed: the buffer is unusable */
	bool nocrc; /* records inside a batch: the batch has the CRC */
};

static inline uint32_t
srv_ld32(const uint8_t *b)
{
	return ((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16
	    | (uint32_t)b[3] << 24);
}

static inline uint64_t
srv_ld64(const uint8_t *b)
{
	return ((uint64_t)srv_ld32(b) | (uint64_t)srv_ld32(b + 4) << 32);
}

static inline void
srv_st32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

/* CRC32C (Castagnoli). */
uint32_t srv_crc32c(const void *p, size_t n);

/* Starts a record of type t; returns its offset for srv_rec_end. */
size_t srv_rec_begin(struct srv_jbuf *b, enum jrn_type t);
/* Ends the record begun at off: its length, and its CRC unless the
 * buffer's records are inside a batch. */
void srv_rec_end(struct srv_jbuf *b, size_t off);
/* srv_rec_end with the CRC as crc says (the batch record itself). */
void srv_rec_finish(struct srv_jbuf *b, size_t off, bool crc);
/* A whole record of type t, its fields as fmt says, one letter each:
 * 's' a string (const char *, NULL: empty), 'w' a uint32_t, 'q' a
 * uint64_t, 'b' bytes (const void *, size_t). */
void srv_rec_put(struct srv_jbuf *b, enum jrn_type t, const char *fmt, ...);

void srv_rec_job(struct srv_jbuf *b, const struct srv_jrn_job *jj);
void srv_rec_gen(struct srv_jbuf *b, const char *job, uint64_t gen,
    uint32_t world, const struct srv_jrn_member *m);
void srv_rec_fail(struct srv_jbuf *b, const char *job, int32_t rank,
    const char *text, const char *detail);
/* JRN_LEAVE (and other records of a job and a rank). */
void srv_rec_rank(
    struct srv_jbuf *b, enum jrn_type t, const char *job, int32_t rank);
void srv_rec_group(struct srv_jbuf *b, const char *job, const char *group,
    uint32_t n, const int32_t *ranks);
void srv_rec_reply(struct srv_jbuf *b, const char *job, uint64_t client_id,
    uint64_t seq, nng_msg *reply);
void srv_rec_reshape(
    struct srv_jbuf *b, const char *job, const struct srv_jrn_egen *rs);
/* JRN_HOLD: which of the world ranks hold the state. */
void srv_rec_hold(struct srv_jbuf *b, const char *job, uint64_t gen,
    uint32_t world, const bool *has_state);
/* JRN_GENMAP: the ranks in prev_gen of gen's n ranks. */
void srv_rec_genmap(struct srv_jbuf *b, const char *job, uint64_t gen,
    uint64_t prev_gen, uint32_t n, const int32_t *prev);

/* A record's body being read; bad once anything did not fit. */
struct srv_jrd {
	const uint8_t *p;
	size_t n;
	bool bad;
};

uint8_t srv_rd_u8(struct srv_jrd *r);
uint32_t srv_rd_u32(struct srv_jrd *r);
uint64_t srv_rd_u64(struct srv_jrd *r);
/* Length-prefixed bytes (pointing into the record); NULL if bad. */
const uint8_t *srv_rd_bytes(struct srv_jrd *r, size_t *n);
/* A string into buf (cap bytes with the NUL); no NUL inside. */
const char *srv_rd_str(struct srv_jrd *r, char *buf, size_t cap);
/* A string of any length, malloc'd (NULL: bad or out of memory). */
char *srv_rd_strdup(struct srv_jrd *r);

#endif /* COHORT_SRV_RECORD_H */
