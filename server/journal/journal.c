/*
 * journal.c - what cohortd must not lose, on disk (`--state-dir DIR`).
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
 * write() before its replies leave (srv_jrn_flush at the end of every core
 * entry point), so a `kill -9` loses nothing. fdatasync: SRV_FSYNC_BATCH
 * (default) at most every 100 ms from the sweep, outside the server mutex;
 * SRV_FSYNC_ALWAYS before the replies leave; SRV_FSYNC_NONE never.
 *
 * Compaction: when the log exceeds max(64 MiB, 2 x snapshot), a snapshot
 * is written and a new log (epoch + 1) started, so the bytes written stay
 * within a small multiple of the bytes changed. A write error (a full
 * disk) is never acknowledged: the event's OK replies become
 * COHORT_EJOURNAL (srv_core_event_end), and later changes are refused
 * before they are applied until a snapshot succeeds, retried every
 * second (srv_jrn_writable).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "srv_impl.h"

#define JRN_MAGIC_LOG "COHORTJ1"
#define JRN_MAGIC_SNAP "COHORTS1"
#define JRN_MAGIC_MAN "COHORTM1"
#define JRN_MAN 20
#define JRN_HDR 16
#define JRN_RHDR 8
#define JRN_COMPACT_MIN (64ull << 20)
#define JRN_RETRY_MS 1000
#define JRN_FLUSH_CHUNK (1u << 20)
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
};

struct jbuf {
	uint8_t *p;
	size_t len;
	size_t cap;
	bool oom;
	bool nocrc; /* records inside a batch: the batch has the CRC */
};

struct srv_jrn {
	char *dir;
	int dfd;
	int fd; /* log.<epoch>, O_APPEND */
	int lockfd;
	uint64_t epoch;
	enum srv_fsync fsync;
	uint64_t compact_min;
	struct jbuf buf;
	bool dirty; /* written since the last fdatasync */
	bool broken; /* a write failed: nothing is journalled until a
	                snapshot succeeds */
	bool lost; /* this event had records while broken */
	char problem[384]; /* why it is broken */
	cohort__time retry_at;
	struct srv_jrn_stats st;
};

/* ------------------------------------------------------------------------ */
/* CRC32C (Castagnoli), slice-by-8                                          */
/* ------------------------------------------------------------------------ */

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void
crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
		crc_tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_tab[t][i] = (crc_tab[t - 1][i] >> 8)
			    ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

static uint32_t
ld32(const uint8_t *b)
{
	return ((uint32_t)b[0] | (uint32_t)b[1] << 8 | (uint32_t)b[2] << 16
	    | (uint32_t)b[3] << 24);
}

static uint64_t
ld64(const uint8_t *b)
{
	return ((uint64_t)ld32(b) | (uint64_t)ld32(b + 4) << 32);
}

uint32_t
srv_crc32c(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint32_t c = 0xffffffffu;

	pthread_once(&crc_once, crc_init);
	while (n >= 8) {
		uint32_t lo = c ^ ld32(b), hi = ld32(b + 4);
		c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff]
		    ^ crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24]
		    ^ crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff]
		    ^ crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
		b += 8;
		n -= 8;
	}
	while (n-- > 0)
		c = (c >> 8) ^ crc_tab[0][(c ^ *b++) & 0xff];
	return (~c);
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static uint8_t *
jb_room(struct jbuf *b, size_t n)
{
	if (b->oom)
		return (NULL);
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *p;
		while (cap < b->len + n)
			cap *= 2;
		if ((p = realloc(b->p, cap)) == NULL) {
			b->oom = true;
			return (NULL);
		}
		b->p = p;
		b->cap = cap;
	}
	b->len += n;
	return (b->p + b->len - n);
}

static void
jb_u8(struct jbuf *b, uint8_t v)
{
	uint8_t *p = jb_room(b, 1);

	if (p != NULL)
		*p = v;
}

static void
st32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)v;
	p[1] = (uint8_t)(v >> 8);
	p[2] = (uint8_t)(v >> 16);
	p[3] = (uint8_t)(v >> 24);
}

static void
jb_u32(struct jbuf *b, uint32_t v)
{
	uint8_t *p = jb_room(b, 4);

	if (p != NULL)
		st32(p, v);
}

static void
jb_u64(struct jbuf *b, uint64_t v)
{
	uint8_t *p = jb_room(b, 8);

	if (p != NULL) {
		st32(p, (uint32_t)v);
		st32(p + 4, (uint32_t)(v >> 32));
	}
}

static void
jb_bytes(struct jbuf *b, const void *d, size_t n)
{
	uint8_t *p;

	jb_u32(b, (uint32_t)n);
	if ((p = jb_room(b, n)) != NULL && n > 0)
		memcpy(p, d, n);
}

static void
jb_str(struct jbuf *b, const char *s)
{
	jb_bytes(b, s, s != NULL ? strlen(s) : 0);
}

/* Starts a record; returns its offset for rec_end. */
static size_t
rec_begin(struct jbuf *b, enum jrn_type t)
{
	size_t off = b->len;

	(void)jb_room(b, JRN_RHDR);
	jb_u8(b, (uint8_t)t);
	return (off);
}

static void
rec_finish(struct jbuf *b, size_t off, bool crc)
{
	size_t n;

	if (b->oom)
		return;
	n = b->len - off - JRN_RHDR;
	st32(b->p + off, (uint32_t)n);
	st32(b->p + off + 4, crc ? srv_crc32c(b->p + off + JRN_RHDR, n) : 0);
}

static void
rec_end(struct jbuf *b, size_t off)
{
	rec_finish(b, off, !b->nocrc);
}

/* A whole record of type t, its fields as fmt says, one letter each:
 * 's' a string (const char *, NULL: empty), 'w' a uint32_t, 'q' a
 * uint64_t, 'b' bytes (const void *, size_t). */
static void
rec_put(struct jbuf *b, enum jrn_type t, const char *fmt, ...)
{
	size_t off = rec_begin(b, t);
	const void *p;
	va_list ap;

	va_start(ap, fmt);
	for (; *fmt != '\0'; fmt++) {
		switch (*fmt) {
		case 's':
			jb_str(b, va_arg(ap, const char *));
			break;
		case 'w':
			jb_u32(b, va_arg(ap, uint32_t));
			break;
		case 'q':
			jb_u64(b, va_arg(ap, uint64_t));
			break;
		default: /* 'b' */
			p = va_arg(ap, const void *);
			jb_bytes(b, p, va_arg(ap, size_t));
			break;
		}
	}
	va_end(ap);
	rec_end(b, off);
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

struct jrd {
	const uint8_t *p;
	size_t n;
	bool bad;
};

static const uint8_t *
rd_take(struct jrd *r, size_t n)
{
	const uint8_t *p = r->p;

	if (r->bad || r->n < n) {
		r->bad = true;
		return (NULL);
	}
	r->p += n;
	r->n -= n;
	return (p);
}

static uint32_t
rd_u32(struct jrd *r)
{
	const uint8_t *p = rd_take(r, 4);

	return (p != NULL ? ld32(p) : 0);
}

static uint64_t
rd_u64(struct jrd *r)
{
	const uint8_t *p = rd_take(r, 8);

	return (p != NULL ? ld64(p) : 0);
}

static const uint8_t *
rd_bytes(struct jrd *r, size_t *n)
{
	*n = rd_u32(r);
	return (rd_take(r, *n));
}

/* A string into buf (cap bytes with the NUL); no NUL inside. */
static const char *
rd_str(struct jrd *r, char *buf, size_t cap)
{
	size_t n;
	const uint8_t *p = rd_bytes(r, &n);

	if (p == NULL || n >= cap || memchr(p, '\0', n) != NULL) {
		r->bad = true;
		buf[0] = '\0';
		return (buf);
	}
	memcpy(buf, p, n);
	buf[n] = '\0';
	return (buf);
}

/* A string of any length, malloc'd (NULL: bad or ENOMEM). */
static char *
rd_strdup(struct jrd *r)
{
	size_t n;
	const uint8_t *p = rd_bytes(r, &n);
	char *s;

	if (p == NULL || memchr(p, '\0', n) != NULL
	    || (s = malloc(n + 1)) == NULL) {
		r->bad = true;
		return (NULL);
	}
	memcpy(s, p, n);
	s[n] = '\0';
	return (s);
}

/* ------------------------------------------------------------------------ */
/* Applying records (replay)                                                */
/* ------------------------------------------------------------------------ */

static struct srv_job *
job_find(struct srv_core *core, const char *name)
{
	struct srv_hnode *n = srv_map_get(&core->jobs, name, strlen(name));

	return (n ? SRV_CONTAINER(n, struct srv_job, hn) : NULL);
}

static cohort_status
apply_gen(struct srv_job *job, struct jrd *r, cohort__time now)
{
	uint64_t gen = rd_u64(r);
	uint32_t w = rd_u32(r);
	struct srv_member *mem;
	uint64_t *ids;
	cohort_status rv;

	if (r->bad || w == 0 || w > SRV_MAX_WORLD)
		return (COHORT_EPROTO);
	mem = calloc(w, sizeof(*mem));
	ids = calloc(w, sizeof(*ids));
	if (mem == NULL || ids == NULL) {
		free(mem);
		free(ids);
		return (COHORT_ENOMEM);
	}
	for (uint32_t i = 0; i < w; i++) {
		struct srv_member *m = &mem[i];
		ids[i] = rd_u64(r);
		rd_str(r, m->host, sizeof(m->host));
		m->pid = rd_u32(r);
		m->local_rank = (int32_t)rd_u32(r);
		m->hb_ms = rd_u32(r);
		m->dead_ms = rd_u32(r);
		m->state = SRV_MEMBER_RUNNING;
	}
	if (r->bad) {
		free(mem);
		free(ids);
		return (COHORT_EPROTO);
	}
	rv = srv_job_restore_gen(job, gen, w, mem, ids, now);
	free(ids);
	return (rv);
}

static cohort_status
apply(struct srv_core *core, int type, struct jrd *r, cohort__time now)
{
	char name[SRV_MAX_NAME + 1], tok[SRV_MAX_NAME + 1];
	char key[COHORT__MAX_KEY + 1];
	struct srv_job *job;
	cohort_status rv = COHORT_OK;

	if (type == JRN_END)
		return (COHORT_OK);
	rd_str(r, name, sizeof(name));
	if (r->bad)
		return (COHORT_EPROTO);
	job = job_find(core, name);
	if (type == JRN_JOB) {
		uint64_t id;
		rd_str(r, tok, sizeof(tok));
		id = rd_u64(r);
		if (r->bad)
			return (COHORT_EPROTO);
		if (job == NULL
		    && (job = srv_job_new(core, name, tok)) == NULL)
			return (COHORT_ENOMEM);
		if (strcmp(job->token, tok) != 0) {
			char *t = srv_strdup(tok);
			if (t == NULL)
				return (COHORT_ENOMEM);
			free(job->token);
			job->token = t;
		}
		job->job_id = id;
		job->journaled = true;
		return (COHORT_OK);
	}
	if (job == NULL)
		return (COHORT_EPROTO); /* a record of an unknown job */
	switch (type) {
	case JRN_JOB_DEL:
		srv_job_free(job, "removed");
		break;
	case JRN_GEN:
		rv = apply_gen(job, r, now);
		break;
	case JRN_FAIL: {
		int32_t rank = (int32_t)rd_u32(r);
		char *text = rd_strdup(r);
		char *detail = rd_strdup(r);
		if (!r->bad)
			srv_job_restore_fail(job, rank, text, detail);
		free(text);
		free(detail);
		break;
	}
	case JRN_LEAVE: {
		int32_t rank = (int32_t)rd_u32(r);
		if (r->bad || job->members == NULL || rank < 0
		    || (uint32_t)rank >= job->world)
			return (COHORT_EPROTO);
		if (job->members[rank].state == SRV_MEMBER_RUNNING)
			job->members[rank].state = SRV_MEMBER_LEFT;
		break;
	}
	case JRN_GROUP: {
		char gname[SRV_MAX_NAME + 1];
		uint32_t n;
		int32_t *ranks;
		rd_str(r, gname, sizeof(gname));
		n = rd_u32(r);
		if (r->bad || n == 0 || n > job->world || job->members == NULL)
			return (COHORT_EPROTO);
		if ((ranks = malloc(sizeof(int32_t) * n)) == NULL)
			return (COHORT_ENOMEM);
		for (uint32_t i = 0; i < n; i++)
			ranks[i] = (int32_t)rd_u32(r);
		rv = r->bad ? COHORT_EPROTO
		            : srv_group_restore(job, gname, ranks, n);
		free(ranks);
		break;
	}
	case JRN_KV_PUT:
	case JRN_KV_APPEND: {
		const uint8_t *v;
		size_t vlen;
		rd_str(r, key, sizeof(key));
		v = rd_bytes(r, &vlen);
		if (r->bad || key[0] == '\0')
			return (COHORT_EPROTO);
		rv = srv_kv_restore(job, key, v, vlen, type == JRN_KV_APPEND);
		break;
	}
	case JRN_KV_DEL:
		rd_str(r, key, sizeof(key));
		if (r->bad)
			return (COHORT_EPROTO);
		srv_kv_restore_del(job, key);
		break;
	case JRN_REPLY: {
		uint64_t id = rd_u64(r), seq = rd_u64(r);
		const uint8_t *b;
		size_t blen;
		struct srv_client *cl;
		nng_msg *m;
		b = rd_bytes(r, &blen);
		if (r->bad)
			return (COHORT_EPROTO);
		if ((cl = srv_client_get(job, id, now)) == NULL
		    || nng_msg_alloc(&m, blen) != 0)
			return (COHORT_ENOMEM);
		if (blen > 0)
			memcpy(nng_msg_body(m), b, blen);
		srv_client_cache_put(cl, seq, 0, m, true);
		break;
	}
	case JRN_CLIENT_DEL: {
		uint64_t id = rd_u64(r);
		struct srv_hnode *n;
		if (r->bad)
			return (COHORT_EPROTO);
		n = srv_map_get(&job->clients, &id, sizeof(id));
		if (n != NULL) {
			struct srv_client *cl
			    = SRV_CONTAINER(n, struct srv_client, hn);
			if (cl->member == NULL)
				srv_client_free(cl, "removed");
		}
		break;
	}
	default:
		return (COHORT_EPROTO);
	}
	return (rv);
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

static int
write_all(int fd, const uint8_t *p, size_t n)
{
	while (n > 0) {
		ssize_t w = write(fd, p, n);
		if (w < 0) {
			if (errno == EINTR)
				continue;
			return (-1);
		}
		p += w;
		n -= (size_t)w;
	}
	return (0);
}

static void
hdr_fill(uint8_t *h, const char *magic, uint64_t epoch)
{
	memcpy(h, magic, 8);
	st32(h + 8, (uint32_t)epoch);
	st32(h + 12, (uint32_t)(epoch >> 32));
}

/* Maps a whole file read-only (len 0: nothing mapped). */
static int
map_file(int fd, const uint8_t **p, size_t *len)
{
	struct stat sb;
	void *m;

	*p = NULL;
	*len = 0;
	if (fstat(fd, &sb) != 0)
		return (-1);
	if (sb.st_size == 0)
		return (0);
	m = mmap(NULL, (size_t)sb.st_size, PROT_READ, MAP_PRIVATE, fd, 0);
	if (m == MAP_FAILED)
		return (-1);
	*p = m;
	*len = (size_t)sb.st_size;
	return (0);
}

/* The records inside a batch (its CRC was checked): all must be whole. */
static cohort_status
replay_batch(struct srv_core *core, const uint8_t *p, size_t len,
    cohort__time now, uint64_t *nrec)
{
	size_t off = 0;

	while (off < len) {
		uint32_t n;
		struct jrd r;
		cohort_status rv;
		if (len - off < JRN_RHDR + 1 || (n = ld32(p + off)) == 0
		    || n > len - off - JRN_RHDR
		    || p[off + JRN_RHDR] == JRN_BATCH)
			return (COHORT_EPROTO);
		r.p = p + off + JRN_RHDR + 1;
		r.n = n - 1;
		r.bad = false;
		rv = apply(core, p[off + JRN_RHDR], &r, now);
		if (rv != COHORT_OK)
			return (rv);
		(*nrec)++;
		off += JRN_RHDR + n;
	}
	return (COHORT_OK);
}

/*
 * Reading a file: torn tail or damage.
 *
 * A write is one record (a batch in the log) and a crash can only tear
 * the last one: its length runs past the end of the file, or the file
 * ends in zeros (a size extended before its data reached the disk).
 * Anything else that fails its length or CRC check is damage: a bad
 * record with whole records after it, or a whole-length last record with
 * a wrong CRC. A torn tail is cut off (it was never acknowledged: its
 * write did not complete); damage stops the start, the file untouched,
 * unless --recover, which skips to the next whole record (resync) and
 * keeps every record it can read.
 */

struct jscan {
	const char *file; /* "snapshot", "log.3" */
	const uint8_t *p;
	size_t len;
	bool log;
	size_t off; /* the next record */
	uint64_t whole; /* whole records applied (a batch counts once) */
	bool sawend; /* an END record (snapshot) */
	bool torn; /* a torn last record at off (log) */
	bool damaged; /* something was dropped (--recover) */
	uint64_t dropped_recs; /* whole records that could not be applied */
	size_t dropped_bytes;
};

/* The records inside a batch chain exactly to its end. */
static bool
batch_chains(const uint8_t *p, size_t len)
{
	size_t off = 0;

	while (off < len) {
		uint32_t n;
		uint8_t t;
		if (len - off < JRN_RHDR + 1 || (n = ld32(p + off)) == 0
		    || n > len - off - JRN_RHDR)
			return (false);
		t = p[off + JRN_RHDR];
		if (t < JRN_JOB || t >= JRN_BATCH)
			return (false);
		off += JRN_RHDR + n;
	}
	return (true);
}

/* Whether a whole record starts at p[off]: its length fits, its type is
 * one the file holds at the top (a log: batches; a snapshot: any other),
 * a batch's records chain to its end, and the CRC matches. */
static bool
rec_whole(const uint8_t *p, size_t len, size_t off, bool log)
{
	uint32_t n;
	uint8_t t;

	if (off > len || len - off < JRN_RHDR + 1)
		return (false);
	n = ld32(p + off);
	if (n == 0 || n > len - off - JRN_RHDR)
		return (false);
	t = p[off + JRN_RHDR];
	if (log ? t != JRN_BATCH : (t < JRN_JOB || t >= JRN_BATCH))
		return (false);
	if (t == JRN_BATCH && !batch_chains(p + off + JRN_RHDR + 1, n - 1))
		return (false);
	return (srv_crc32c(p + off + JRN_RHDR, n) == ld32(p + off + 4));
}

/* The offset of the next whole record at or after from; len if none. */
static size_t
resync(const uint8_t *p, size_t len, size_t from, bool log)
{
	for (size_t o = from; o < len && len - o > JRN_RHDR; o++)
		if (rec_whole(p, len, o, log))
			return (o);
	return (len);
}

/* What a crash in the middle of the last write leaves at p[off..len):
 * an incomplete record, or zeros. */
static bool
tail_torn(const uint8_t *p, size_t len, size_t off)
{
	if (len - off < JRN_RHDR || ld32(p + off) > len - off - JRN_RHDR)
		return (true);
	for (size_t i = off; i < len; i++)
		if (p[i] != 0)
			return (false);
	return (true);
}

/* Applies whole records from sc->off on; stops at the first that is not
 * whole (sc->off there), after an END, or with an error for a whole
 * record that cannot be applied (sc->off at it). */
static cohort_status
replay(
    struct srv_core *core, struct jscan *sc, cohort__time now, uint64_t *nrec)
{
	const uint8_t *p = sc->p;
	size_t len = sc->len;

	while (len - sc->off >= JRN_RHDR) {
		size_t off = sc->off;
		uint32_t n = ld32(p + off), crc = ld32(p + off + 4);
		struct jrd r;
		cohort_status rv;
		if (n == 0 || n > len - off - JRN_RHDR
		    || srv_crc32c(p + off + JRN_RHDR, n) != crc)
			break;
		r.p = p + off + JRN_RHDR + 1;
		r.n = n - 1;
		r.bad = false;
		if (p[off + JRN_RHDR] == JRN_BATCH)
			rv = replay_batch(core, r.p, r.n, now, nrec);
		else
			rv = apply(core, p[off + JRN_RHDR], &r, now);
		if (rv != COHORT_OK)
			return (rv);
		(*nrec)++;
		sc->whole++;
		sc->off = off + JRN_RHDR + n;
		if (p[off + JRN_RHDR] == JRN_END) {
			sc->sawend = true;
			break;
		}
	}
	return (COHORT_OK);
}

/* Replays a whole file: stops at a torn tail (sc->torn), refuses damage
 * (EJOURNAL naming file, offset and records) or, with recover, skips it
 * and goes on from the next whole record. */
static cohort_status
load_records(struct srv_core *core, struct srv_jrn *j, struct jscan *sc,
    bool recover, cohort__time now)
{
	for (;;) {
		size_t next, at;
		cohort_status rv = replay(core, sc, now, &j->st.replayed);
		if (rv != COHORT_OK) {
			uint32_t n = ld32(sc->p + sc->off);
			if (!recover)
				return (cohort__err(COHORT_EJOURNAL,
				    "%s/%s: the whole record at offset %zu "
				    "(type %u, after %" PRIu64 " records) "
				    "cannot be applied (%s); cohortd refuses "
				    "to start and leaves the file as it is "
				    "(`cohortd --recover` skips it)",
				    j->dir, sc->file, sc->off,
				    sc->p[sc->off + JRN_RHDR], sc->whole,
				    cohort_strerror(rv)));
			cohort__warn(
			    "%s/%s --recover: dropping the record at "
			    "offset %zu (%u bytes, type %u): it cannot "
			    "be applied (%s; its job's first records "
			    "were lost?)",
			    j->dir, sc->file, sc->off, JRN_RHDR + n,
			    sc->p[sc->off + JRN_RHDR], cohort_strerror(rv));
			sc->damaged = true;
			sc->dropped_recs++;
			sc->dropped_bytes += JRN_RHDR + n;
			sc->off += JRN_RHDR + n;
			continue;
		}
		if (sc->sawend || sc->off >= sc->len)
			return (COHORT_OK);
		at = sc->off;
		next = resync(sc->p, sc->len, at + 1, sc->log);
		if (next == sc->len && sc->log
		    && tail_torn(sc->p, sc->len, at)) {
			sc->torn = true;
			return (COHORT_OK);
		}
		if (!recover) {
			if (next < sc->len)
				return (cohort__err(COHORT_EJOURNAL,
				    "%s/%s is damaged at offset %zu, after "
				    "%" PRIu64 " whole records; whole records "
				    "follow at offset %zu (of %zu bytes): "
				    "cohortd refuses to start and leaves the "
				    "file as it is (`cohortd --recover` keeps "
				    "every whole record and moves the file "
				    "aside)",
				    j->dir, sc->file, at, sc->whole, next,
				    sc->len));
			return (cohort__err(COHORT_EJOURNAL,
			    "%s/%s is damaged at offset %zu, after %" PRIu64
			    " whole records: its last %zu bytes are not a "
			    "whole record nor a write torn by a crash; "
			    "cohortd refuses to start and leaves the file as "
			    "it is (`cohortd --recover` keeps every whole "
			    "record and moves the file aside)",
			    j->dir, sc->file, at, sc->whole, sc->len - at));
		}
		cohort__warn("%s/%s --recover: dropping %zu damaged bytes at "
		             "offset %zu (after %" PRIu64 " whole records)%s",
		    j->dir, sc->file, next - at, at, sc->whole,
		    next < sc->len ? "; resuming at the next whole record"
		                   : " up to the end");
		sc->damaged = true;
		sc->dropped_bytes += next - at;
		sc->off = next;
		if (next >= sc->len)
			return (COHORT_OK);
	}
}

static cohort_status
load_snapshot(struct srv_core *core, struct srv_jrn *j, bool recover,
    bool *have, bool *damaged, cohort__time now)
{
	int fd = openat(j->dfd, "snapshot", O_RDONLY | O_CLOEXEC);
	struct jscan sc;
	cohort_status rv;

	*have = *damaged = false;
	if (fd < 0) {
		if (errno == ENOENT)
			return (COHORT_OK);
		return (cohort__err(COHORT_EJOURNAL, "%s/snapshot: %s", j->dir,
		    strerror(errno)));
	}
	memset(&sc, 0, sizeof(sc));
	sc.file = "snapshot";
	if (map_file(fd, &sc.p, &sc.len) != 0) {
		rv = cohort__err(COHORT_EJOURNAL, "%s/snapshot: %s", j->dir,
		    strerror(errno));
		close(fd);
		return (rv);
	}
	close(fd);
	*have = true;
	if (sc.len < JRN_HDR || memcmp(sc.p, JRN_MAGIC_SNAP, 8) != 0) {
		if (sc.p != NULL)
			munmap((void *)sc.p, sc.len);
		return (cohort__err(COHORT_EJOURNAL,
		    "%s/snapshot is not a cohortd snapshot (%s); cohortd "
		    "refuses to start and leaves it as it is",
		    j->dir,
		    sc.len < JRN_HDR ? "shorter than its header"
		                     : "bad magic"));
	}
	j->epoch = ld64(sc.p + 8);
	sc.off = JRN_HDR;
	rv = load_records(core, j, &sc, recover, now);
	munmap((void *)sc.p, sc.len);
	if (rv != COHORT_OK)
		return (rv);
	if (!sc.sawend) {
		/* Written whole and renamed: a missing END is damage. */
		if (!recover)
			return (cohort__err(COHORT_EJOURNAL,
			    "%s/snapshot is damaged: no end record (%zu "
			    "bytes, "
			    "%" PRIu64 " whole records); cohortd refuses to "
			    "start and leaves it as it is (`cohortd "
			    "--recover` "
			    "keeps every whole record)",
			    j->dir, sc.len, sc.whole));
		sc.damaged = true;
	}
	*damaged = sc.damaged;
	j->st.snap_bytes = sc.len;
	return (COHORT_OK);
}

static void
log_name(char *buf, size_t len, uint64_t epoch)
{
	snprintf(buf, len, "log.%" PRIu64, epoch);
}

/* Creates log.<epoch> with its header (replacing one that exists). */
static int
log_create(struct srv_jrn *j, uint64_t epoch)
{
	char name[64];
	uint8_t h[JRN_HDR];
	int fd;

	log_name(name, sizeof(name), epoch);
	fd = openat(j->dfd, name,
	    O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return (-1);
	hdr_fill(h, JRN_MAGIC_LOG, epoch);
	if (write_all(fd, h, sizeof(h)) != 0 || fdatasync(fd) != 0
	    || fsync(j->dfd) != 0) {
		int e = errno;
		close(fd);
		errno = e;
		return (-1);
	}
	return (fd);
}

/* must: the manifest says this log was started (it must be there). */
static cohort_status
load_log(struct srv_core *core, struct srv_jrn *j, bool must, bool recover,
    bool *damaged, cohort__time now)
{
	char name[64];
	struct jscan sc;
	cohort_status rv;
	int fd;

	*damaged = false;
	memset(&sc, 0, sizeof(sc));
	log_name(name, sizeof(name), j->epoch);
	sc.file = name;
	sc.log = true;
	fd = openat(j->dfd, name, O_RDWR | O_APPEND | O_CLOEXEC);
	if (fd < 0 && errno != ENOENT)
		return (cohort__err(COHORT_EJOURNAL, "%s/%s: %s", j->dir, name,
		    strerror(errno)));
	if (fd >= 0 && map_file(fd, &sc.p, &sc.len) != 0) {
		rv = cohort__err(COHORT_EJOURNAL, "%s/%s: %s", j->dir, name,
		    strerror(errno));
		close(fd);
		return (rv);
	}
	if (fd < 0 || sc.len < JRN_HDR) {
		/* None yet, or its header was torn: start it, unless the
		 * manifest says it was started (then records are lost). */
		if (fd >= 0) {
			if (sc.p != NULL)
				munmap((void *)sc.p, sc.len);
			close(fd);
		}
		if (must && !recover)
			return (cohort__err(COHORT_EJOURNAL,
			    "%s/%s is %s, but %s/manifest says the state is "
			    "at epoch %" PRIu64 " (its log was started): "
			    "state would be lost; cohortd refuses to start "
			    "(`cohortd --recover` starts from %s)",
			    j->dir, name,
			    fd < 0 ? "missing"
			           : (sc.len == 0 ? "empty"
			                          : "shorter than its header"),
			    j->dir, j->epoch,
			    j->st.snap_bytes > 0 ? "the snapshot alone"
			                         : "an empty state"));
		if (must)
			cohort__warn("%s/%s is %s --recover: starting from %s",
			    j->dir, name,
			    fd < 0 ? "missing," : "empty or short,",
			    j->st.snap_bytes > 0 ? "the snapshot alone"
			                         : "an empty state");
		if ((j->fd = log_create(j, j->epoch)) < 0)
			return (cohort__err(COHORT_EJOURNAL, "%s/%s: %s",
			    j->dir, name, strerror(errno)));
		j->st.log_bytes = JRN_HDR;
		return (COHORT_OK);
	}
	sc.off = JRN_HDR;
	if (memcmp(sc.p, JRN_MAGIC_LOG, 8) != 0
	    || ld64(sc.p + 8) != j->epoch) {
		if (!recover) {
			rv = cohort__err(COHORT_EJOURNAL,
			    "%s/%s is not the cohortd log of epoch %" PRIu64
			    " (%s); cohortd refuses to start and leaves it as "
			    "it is (`cohortd --recover` keeps every whole "
			    "record in it)",
			    j->dir, name, j->epoch,
			    memcmp(sc.p, JRN_MAGIC_LOG, 8) != 0
			        ? "bad magic"
			        : "wrong epoch");
			munmap((void *)sc.p, sc.len);
			close(fd);
			return (rv);
		}
		cohort__warn("%s/%s --recover: bad header; keeping the whole "
		             "records after it",
		    j->dir, name);
		sc.damaged = true;
	}
	rv = load_records(core, j, &sc, recover, now);
	munmap((void *)sc.p, sc.len);
	if (rv == COHORT_OK && sc.torn) {
		cohort__warn("%s/%s: cutting off %zu bytes at offset %zu, "
		             "after %" PRIu64
		             " whole records (the last write, "
		             "torn by a crash: it was never acknowledged)",
		    j->dir, name, sc.len - sc.off, sc.off, sc.whole);
		if (ftruncate(fd, (off_t)sc.off) != 0 || fdatasync(fd) != 0)
			rv = cohort__err(COHORT_EJOURNAL,
			    "%s/%s: cannot truncate the torn record: %s",
			    j->dir, name, strerror(errno));
	}
	if (rv != COHORT_OK) {
		close(fd);
		return (rv);
	}
	*damaged = sc.damaged;
	j->fd = fd;
	j->st.log_bytes = sc.len;
	if (sc.torn)
		j->st.log_bytes = sc.off;
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Manifest: the epoch whose snapshot and log hold the state              */
/* ------------------------------------------------------------------------ */

/*
 * `manifest` is 20 bytes: magic, u64 epoch, u32 CRC of the 16 before. It
 * is written (tmp, fsync, rename) once the log of an epoch is started, so
 * a missing or empty log of that epoch, or a missing snapshot, is lost
 * state, not a fresh start. A crash inside a compaction leaves a snapshot
 * one epoch ahead of the manifest: its log may be missing (empty).
 * Returns 1 and *epoch, 0 if absent, or -1 (damaged: error set).
 */
static int
man_read(struct srv_jrn *j, uint64_t *epoch)
{
	uint8_t b[JRN_MAN + 1];
	ssize_t n;
	int fd = openat(j->dfd, "manifest", O_RDONLY | O_CLOEXEC);

	if (fd < 0) {
		if (errno == ENOENT)
			return (0);
		(void)cohort__err(COHORT_EJOURNAL, "%s/manifest: %s", j->dir,
		    strerror(errno));
		return (-1);
	}
	n = read(fd, b, sizeof(b));
	close(fd);
	if (n != JRN_MAN || memcmp(b, JRN_MAGIC_MAN, 8) != 0
	    || srv_crc32c(b, 16) != ld32(b + 16)) {
		(void)cohort__err(COHORT_EJOURNAL,
		    "%s/manifest is damaged; cohortd refuses to start "
		    "(`cohortd --recover` rewrites it)",
		    j->dir);
		return (-1);
	}
	*epoch = ld64(b + 8);
	return (1);
}

static int
man_write(struct srv_jrn *j, uint64_t epoch)
{
	uint8_t b[JRN_MAN];
	int fd, e;

	hdr_fill(b, JRN_MAGIC_MAN, epoch);
	st32(b + 16, srv_crc32c(b, 16));
	fd = openat(j->dfd, "manifest.tmp",
	    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return (-1);
	if (write_all(fd, b, sizeof(b)) != 0 || fdatasync(fd) != 0) {
		e = errno;
		close(fd);
		(void)unlinkat(j->dfd, "manifest.tmp", 0);
		errno = e;
		return (-1);
	}
	close(fd);
	if (renameat(j->dfd, "manifest.tmp", j->dfd, "manifest") != 0
	    || fsync(j->dfd) != 0)
		return (-1);
	return (0);
}

/* --recover: keep the damaged file under another name (a hard link, so
 * that the original stays until the new snapshot replaces it). */
static cohort_status
keep_aside(struct srv_jrn *j, const char *name, char *aside, size_t len)
{
	char ts[32];
	time_t t = time(NULL);
	struct tm tm;

	gmtime_r(&t, &tm);
	strftime(ts, sizeof(ts), "%Y%m%dT%H%M%SZ", &tm);
	snprintf(aside, len, "%s.damaged-%s", name, ts);
	if (linkat(j->dfd, name, j->dfd, aside, 0) != 0 && errno != ENOENT
	    && errno != EEXIST)
		return (cohort__err(COHORT_EJOURNAL,
		    "%s: cannot keep %s aside as %s: %s", j->dir, name, aside,
		    strerror(errno)));
	return (COHORT_OK);
}

/* Removes snapshot.tmp and logs of other epochs. */
static void
remove_stale(struct srv_jrn *j)
{
	char name[64];

	(void)unlinkat(j->dfd, "snapshot.tmp", 0);
	(void)unlinkat(j->dfd, "manifest.tmp", 0);
	for (uint64_t e = j->epoch > 4 ? j->epoch - 4 : 0; e < j->epoch + 4;
	     e++) {
		if (e == j->epoch)
			continue;
		log_name(name, sizeof(name), e);
		(void)unlinkat(j->dfd, name, 0);
	}
}

static void
jrn_free(struct srv_jrn *j)
{
	if (j == NULL)
		return;
	if (j->fd >= 0)
		close(j->fd);
	if (j->dfd >= 0)
		close(j->dfd);
	if (j->lockfd >= 0)
		close(j->lockfd);
	free(j->buf.p);
	free(j->dir);
	free(j);
}

cohort_status
srv_core_journal_open(
    struct srv_core *core, const struct srv_jrn_opts *o, cohort__time now)
{
	struct srv_jrn *j = calloc(1, sizeof(*j));
	cohort_status rv;
	uint64_t t0 = cohort__now_ns();
	struct srv_hnode *n;
	size_t i;
	uint64_t mepoch = 0;
	int have_man;
	bool have_snap, snap_bad, log_bad;

	if (j == NULL)
		return (COHORT_ENOMEM);
	j->fd = j->dfd = j->lockfd = -1;
	j->fsync = o->fsync;
	j->compact_min = o->compact_min ? o->compact_min : JRN_COMPACT_MIN;
	if (core->lim.max_value > (1ull << 30)) {
		jrn_free(j);
		return (cohort__err(COHORT_EINVAL,
		    "--state-dir allows --max-value-bytes up to 1 GiB"));
	}
	if ((j->dir = srv_strdup(o->dir)) == NULL) {
		jrn_free(j);
		return (COHORT_ENOMEM);
	}
	if (mkdir(o->dir, 0700) != 0 && errno != EEXIST) {
		rv = cohort__err(COHORT_EINVAL, "--state-dir %s: %s", o->dir,
		    strerror(errno));
		jrn_free(j);
		return (rv);
	}
	if ((j->dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		rv = cohort__err(COHORT_EINVAL, "--state-dir %s: %s", o->dir,
		    strerror(errno));
		jrn_free(j);
		return (rv);
	}
	if (faccessat(j->dfd, ".", W_OK, AT_EACCESS) != 0
	    || (j->lockfd = openat(
	            j->dfd, "lock", O_RDWR | O_CREAT | O_CLOEXEC, 0600))
	        < 0) {
		rv = cohort__err(COHORT_EJOURNAL,
		    "--state-dir %s is not writable (%s): cohortd journals "
		    "every change there and does not start without it",
		    o->dir, strerror(errno));
		jrn_free(j);
		return (rv);
	}
	if (flock(j->lockfd, LOCK_EX | LOCK_NB) != 0) {
		rv = cohort__err(COHORT_EEXIST,
		    "--state-dir %s is in use by another cohortd", o->dir);
		jrn_free(j);
		return (rv);
	}
	if ((have_man = man_read(j, &mepoch)) < 0) {
		if (!o->recover) {
			jrn_free(j);
			return (COHORT_EJOURNAL);
		}
		cohort__warn("%s --recover: %s", o->dir, cohort_last_error());
		have_man = 0;
	}
	if ((rv = load_snapshot(
	         core, j, o->recover, &have_snap, &snap_bad, now))
	    != COHORT_OK) {
		jrn_free(j);
		return (rv);
	}
	if (have_man && !o->recover
	    && ((!have_snap && mepoch > 0) || j->epoch < mepoch)) {
		rv = cohort__err(COHORT_EJOURNAL,
		    "%s/snapshot is %s, but %s/manifest says the state is at "
		    "epoch %" PRIu64 ": state would be lost; cohortd refuses "
		    "to start (`cohortd --recover` starts from what is there)",
		    o->dir, have_snap ? "of an older epoch" : "missing",
		    o->dir, mepoch);
		jrn_free(j);
		return (rv);
	}
	if ((rv = load_log(core, j, have_man && j->epoch == mepoch, o->recover,
	         &log_bad, now))
	    != COHORT_OK) {
		jrn_free(j);
		return (rv);
	}
	if (o->recover && have_man && j->epoch < mepoch) {
		/* The snapshot of the manifest's epoch is gone (or older):
		 * its log cannot be replayed without it; keep it aside
		 * rather than let it be removed as stale. */
		char lname[64], aside[96];
		log_name(lname, sizeof(lname), mepoch);
		if ((rv = keep_aside(j, lname, aside, sizeof(aside)))
		    != COHORT_OK) {
			jrn_free(j);
			return (rv);
		}
		cohort__warn("%s --recover: the snapshot of epoch %" PRIu64
		             " is missing; its log is kept as %s (if it "
		             "existed), the state starts from epoch %" PRIu64,
		    o->dir, mepoch, aside, j->epoch);
	}
	if (o->recover && (snap_bad || log_bad)) {
		char lname[64], aside[2][96] = { "", "" };
		log_name(lname, sizeof(lname), j->epoch);
		if ((snap_bad
		        && (rv = keep_aside(
		                j, "snapshot", aside[0], sizeof(aside[0])))
		            != COHORT_OK)
		    || (log_bad
		        && (rv = keep_aside(
		                j, lname, aside[1], sizeof(aside[1])))
		            != COHORT_OK)) {
			jrn_free(j);
			return (rv);
		}
		/* The state as recovered becomes a snapshot of the next
		 * epoch, with an empty log. */
		core->jrn = j;
		rv = srv_jrn_compact(core);
		core->jrn = NULL;
		if (rv != COHORT_OK) {
			jrn_free(j);
			return (cohort__err(COHORT_EJOURNAL,
			    "%s --recover: cannot write the recovered state",
			    o->dir));
		}
		cohort__warn("%s --recover: %" PRIu64 " records kept, now "
		             "snapshot of epoch %" PRIu64 "; damaged files "
		             "kept as %s%s%s",
		    o->dir, j->st.replayed, j->epoch, aside[0],
		    aside[0][0] && aside[1][0] ? ", " : "", aside[1]);
	} else if (o->recover) {
		cohort__info("%s --recover: nothing is damaged", o->dir);
	}
	if ((!have_man || mepoch != j->epoch) && man_write(j, j->epoch) != 0) {
		rv = cohort__err(COHORT_EJOURNAL, "%s/manifest: %s", o->dir,
		    strerror(errno));
		jrn_free(j);
		return (rv);
	}
	remove_stale(j);
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		job->journaled = true;
		job->restored = job->members == NULL;
	}
	j->st.replay_ms = (cohort__now_ns() - t0) / 1000000;
	core->jrn = j;
	if (j->st.replayed > 0)
		cohort__info("state restored from %s: %zu jobs, %" PRIu64
		             " records in %" PRIu64 " ms; members have their "
		             "dead-after to reconnect",
		    o->dir, core->jobs.n, j->st.replayed, j->st.replay_ms);
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Snapshot                                                                 */
/* ------------------------------------------------------------------------ */

struct snap {
	struct srv_jrn *j;
	int fd;
	struct jbuf b;
	uint64_t bytes;
	int err;
	struct srv_job *job;
};

static void
snap_flush(struct snap *s, bool all)
{
	if (s->b.oom && s->err == 0)
		s->err = ENOMEM;
	if (s->err != 0 || (!all && s->b.len < JRN_FLUSH_CHUNK))
		return;
	if (write_all(s->fd, s->b.p, s->b.len) != 0)
		s->err = errno;
	s->bytes += s->b.len;
	s->b.len = 0;
}

static void
snap_kv(void *arg, const char *key, const void *val, size_t vlen)
{
	struct snap *s = arg;

	rec_put(&s->b, JRN_KV_PUT, "ssb", s->job->name, key, val, vlen);
	snap_flush(s, false);
}

static void
rec_job(struct jbuf *b, const struct srv_job *job)
{
	rec_put(b, JRN_JOB, "ssq", job->name, job->token, job->job_id);
}

static void
rec_gen(struct jbuf *b, const struct srv_job *job)
{
	size_t off = rec_begin(b, JRN_GEN);

	jb_str(b, job->name);
	jb_u64(b, job->generation);
	jb_u32(b, job->world);
	for (uint32_t r = 0; r < job->world; r++) {
		const struct srv_member *m = &job->members[r];
		jb_u64(b, m->client != NULL ? m->client->id : 0);
		jb_str(b, m->host);
		jb_u32(b, m->pid);
		jb_u32(b, (uint32_t)m->local_rank);
		jb_u32(b, m->hb_ms);
		jb_u32(b, m->dead_ms);
	}
	rec_end(b, off);
}

static void
rec_fail(struct jbuf *b, const struct srv_job *job, int32_t rank,
    const char *text, const char *detail)
{
	rec_put(b, JRN_FAIL, "swss", job->name, (uint32_t)rank, text, detail);
}

static void
rec_rank(
    struct jbuf *b, enum jrn_type t, const struct srv_job *job, int32_t rank)
{
	rec_put(b, t, "sw", job->name, (uint32_t)rank);
}

static void
rec_group(struct jbuf *b, const struct srv_job *job, const struct srv_group *g)
{
	size_t off = rec_begin(b, JRN_GROUP);

	jb_str(b, job->name);
	jb_str(b, g->name);
	jb_u32(b, g->n);
	for (uint32_t i = 0; i < g->n; i++)
		jb_u32(b, (uint32_t)g->ranks[i]);
	rec_end(b, off);
}

static void
rec_reply(struct jbuf *b, const struct srv_job *job, uint64_t id, uint64_t seq,
    nng_msg *m)
{
	rec_put(b, JRN_REPLY, "sqqb", job->name, id, seq,
	    (const void *)nng_msg_body(m), nng_msg_len(m));
}

static void
snap_job(struct snap *s, struct srv_job *job)
{
	struct jbuf *b = &s->b;
	struct srv_hnode *n;
	size_t i;

	s->job = job;
	rec_job(b, job);
	if (job->members != NULL) {
		rec_gen(b, job);
		/* The job's failure first: its detail is the job's. */
		if (job->state == SRV_JOB_FAILED && job->failed_rank >= 0
		    && (uint32_t)job->failed_rank < job->world)
			rec_fail(b, job, job->failed_rank, job->failed_text,
			    job->failed_detail);
		for (uint32_t r = 0; r < job->world; r++) {
			const struct srv_member *m = &job->members[r];
			if (m->state == SRV_MEMBER_LEFT)
				rec_rank(b, JRN_LEAVE, job, m->rank);
			else if (m->state == SRV_MEMBER_FAILED
			    && m->rank != job->failed_rank)
				rec_fail(b, job, m->rank, m->failure, "");
		}
		for (n = srv_map_next(&job->groups, &i, NULL); n != NULL;
		     n = srv_map_next(&job->groups, &i, n)) {
			struct srv_group *g
			    = SRV_CONTAINER(n, struct srv_group, hn);
			if (g->complete && g->name[0] != '\0')
				rec_group(b, job, g);
		}
	}
	snap_flush(s, false);
	srv_kv_foreach(&job->kv, snap_kv, s);
	for (n = srv_map_next(&job->clients, &i, NULL); n != NULL;
	     n = srv_map_next(&job->clients, &i, n)) {
		struct srv_client *cl
		    = SRV_CONTAINER(n, struct srv_client, hn);
		/* Oldest first, so that the ring comes back in order. */
		for (unsigned k = 0; k < SRV_CACHE; k++) {
			unsigned x = (cl->cache_next + k) % SRV_CACHE;
			if (cl->cache[x].msg != NULL && cl->cache[x].durable)
				rec_reply(b, job, cl->id, cl->cache[x].seq,
				    cl->cache[x].msg);
		}
		snap_flush(s, false);
	}
	job->journaled = true;
}

cohort_status
srv_jrn_compact(struct srv_core *core)
{
	struct srv_jrn *j = core->jrn;
	struct snap s;
	uint8_t h[JRN_HDR];
	struct srv_hnode *n;
	size_t i, off;
	int nfd;
	char old[64];

	if (j == NULL)
		return (COHORT_OK);
	/* What is buffered is in memory already: the snapshot has it. */
	j->buf.len = 0;
	j->buf.oom = false;
	memset(&s, 0, sizeof(s));
	s.j = j;
	s.fd = openat(j->dfd, "snapshot.tmp",
	    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (s.fd < 0) {
		s.err = errno;
		goto out_err;
	}
	hdr_fill(h, JRN_MAGIC_SNAP, j->epoch + 1);
	if (write_all(s.fd, h, sizeof(h)) != 0)
		s.err = errno;
	s.bytes = JRN_HDR;
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL && s.err == 0;
	     n = srv_map_next(&core->jobs, &i, n))
		snap_job(&s, SRV_CONTAINER(n, struct srv_job, hn));
	off = rec_begin(&s.b, JRN_END);
	rec_end(&s.b, off);
	snap_flush(&s, true);
	if (s.err == 0 && fdatasync(s.fd) != 0)
		s.err = errno;
	if (close(s.fd) != 0 && s.err == 0)
		s.err = errno;
	s.fd = -1;
	if (s.err != 0)
		goto out_err;
	if (renameat(j->dfd, "snapshot.tmp", j->dfd, "snapshot") != 0
	    || fsync(j->dfd) != 0) {
		s.err = errno;
		goto out_err;
	}
	/* From here the snapshot of epoch + 1 is the state; its log
	 * starts empty (log_create, or load_log after a crash here). */
	log_name(old, sizeof(old), j->epoch);
	j->epoch++;
	nfd = log_create(j, j->epoch);
	if (j->fd >= 0)
		close(j->fd);
	j->fd = nfd;
	if (nfd >= 0 && man_write(j, j->epoch) != 0)
		cohort__warn("journal: cannot update %s/manifest: %s", j->dir,
		    strerror(errno));
	(void)unlinkat(j->dfd, old, 0);
	free(s.b.p);
	j->st.snap_bytes = s.bytes;
	j->st.log_bytes = JRN_HDR;
	j->st.compactions++;
	j->dirty = false;
	if (nfd < 0) {
		int e = errno;
		j->broken = true;
		j->st.errors++;
		cohort__error("journal: cannot start %s/log.%" PRIu64 ": %s",
		    j->dir, j->epoch, strerror(e));
		snprintf(j->problem, sizeof(j->problem),
		    "cohortd cannot write to its --state-dir %s (%s)", j->dir,
		    strerror(e));
		return (COHORT_EJOURNAL);
	}
	if (j->broken)
		cohort__info("journal: %s is writable again (a snapshot of "
		             "%" PRIu64 " bytes holds the state): changes are "
		             "accepted and acknowledged again",
		    j->dir, s.bytes);
	j->broken = false;
	j->problem[0] = '\0';
	cohort__debug("journal: snapshot of %" PRIu64 " bytes, epoch %" PRIu64,
	    s.bytes, j->epoch);
	return (COHORT_OK);

out_err:
	if (s.fd >= 0)
		close(s.fd);
	free(s.b.p);
	(void)unlinkat(j->dfd, "snapshot.tmp", 0);
	j->st.errors++;
	if (!j->broken) {
		cohort__error("journal: cannot write a snapshot in %s: %s; "
		              "state changes are refused (COHORT_EJOURNAL) "
		              "until one succeeds (retried every %d s)",
		    j->dir, strerror(s.err), JRN_RETRY_MS / 1000);
		snprintf(j->problem, sizeof(j->problem),
		    "cohortd cannot write to its --state-dir %s (%s)", j->dir,
		    strerror(s.err));
	}
	j->broken = true;
	return (COHORT_EJOURNAL);
}

/* ------------------------------------------------------------------------ */
/* Writing                                                                  */
/* ------------------------------------------------------------------------ */

/* The log cannot be written: cut a partial record off (best effort) and
 * refuse changes until a snapshot succeeds. */
static void
jrn_break(struct srv_jrn *j, int err, cohort__time now, const char *what)
{
	if (j->broken)
		return;
	j->st.errors++;
	snprintf(j->problem, sizeof(j->problem),
	    "cohortd cannot %s its --state-dir %s (%s)", what, j->dir,
	    strerror(err));
	cohort__error("journal: %s; the changes of this event are not "
	              "acknowledged (COHORT_EJOURNAL) and later ones are "
	              "refused until a snapshot succeeds (retried every "
	              "%d s); /readyz answers 503",
	    j->problem, JRN_RETRY_MS / 1000);
	if (ftruncate(j->fd, (off_t)j->st.log_bytes) != 0)
		cohort__debug("ftruncate: %s", strerror(errno));
	j->broken = true;
	j->retry_at = now + JRN_RETRY_MS;
}

bool
srv_jrn_flush(struct srv_core *core, cohort__time now)
{
	struct srv_jrn *j = core->jrn;
	uint64_t lim;
	bool lost;

	if (j == NULL)
		return (true);
	lost = j->lost;
	j->lost = false;
	if (j->buf.len == 0)
		return (!lost);
	if (j->buf.len - JRN_RHDR > JRN_MAX_REC)
		j->buf.oom = true; /* cannot happen with values <= 1 GiB */
	rec_finish(&j->buf, 0, true); /* the batch */
	if (j->broken || j->buf.oom
	    || write_all(j->fd, j->buf.p, j->buf.len) != 0) {
		jrn_break(j, j->buf.oom ? ENOMEM : errno, now, "append to");
		j->buf.len = 0;
		j->buf.oom = false;
		return (false);
	}
	j->st.bytes += j->buf.len;
	j->st.log_bytes += j->buf.len;
	j->dirty = true;
	if (j->buf.cap > 4 * JRN_FLUSH_CHUNK) {
		free(j->buf.p);
		j->buf.p = NULL;
		j->buf.cap = 0;
	}
	j->buf.len = 0;
	if (j->fsync == SRV_FSYNC_ALWAYS) {
		if (fdatasync(j->fd) != 0) {
			/* Written but maybe not on the disk: not
			 * acknowledged. */
			jrn_break(j, errno, now, "fdatasync in");
			return (false);
		}
		j->st.fsyncs++;
		j->dirty = false;
	}
	lim = j->st.snap_bytes * 2;
	if (lim < j->compact_min)
		lim = j->compact_min;
	if (j->st.log_bytes > lim)
		(void)srv_jrn_compact(core);
	return (!lost);
}

void
srv_jrn_tick(struct srv_core *core, cohort__time now)
{
	struct srv_jrn *j = core->jrn;

	if (j == NULL || !j->broken || now < j->retry_at)
		return;
	j->retry_at = now + JRN_RETRY_MS;
	(void)srv_jrn_compact(core);
}

bool
srv_jrn_writable(struct srv_core *core, cohort__time now)
{
	srv_jrn_tick(core, now);
	return (core->jrn == NULL || !core->jrn->broken);
}

const char *
srv_jrn_problem(const struct srv_core *core)
{
	if (core->jrn == NULL || !core->jrn->broken)
		return (NULL);
	return (core->jrn->problem[0] != '\0'
	        ? core->jrn->problem
	        : "cohortd cannot write to its --state-dir");
}

void
srv_jrn_sync_failed(struct srv_core *core, int err)
{
	struct srv_jrn *j = core->jrn;

	if (j == NULL)
		return;
	jrn_break(j, err, cohort__now_ms(), "fdatasync in");
}

int
srv_jrn_sync_fd(struct srv_core *core)
{
	struct srv_jrn *j = core->jrn;

	if (j == NULL || !j->dirty || j->fsync != SRV_FSYNC_BATCH || j->fd < 0)
		return (-1);
	j->dirty = false;
	j->st.fsyncs++;
	return (fcntl(j->fd, F_DUPFD_CLOEXEC, 0));
}

void
srv_jrn_close(struct srv_core *core)
{
	struct srv_jrn *j = core->jrn;

	if (j == NULL)
		return;
	srv_jrn_flush(core, 0);
	if (j->fd >= 0 && j->fsync != SRV_FSYNC_NONE)
		(void)fdatasync(j->fd);
	core->jrn = NULL;
	jrn_free(j);
}

void
srv_jrn_stats(const struct srv_core *core, struct srv_jrn_stats *st)
{
	if (core->jrn != NULL)
		*st = core->jrn->st;
	else
		memset(st, 0, sizeof(*st));
}

/* ------------------------------------------------------------------------ */
/* Records                                                                  */
/* ------------------------------------------------------------------------ */

/* The log buffer, in a batch: every record of one event (request,
 * sweep, closed connection) is written with one write() and replayed all
 * or none, so that a kv_add and its cached reply cannot be torn apart. */
static struct jbuf *
jrn_log(struct srv_jrn *j)
{
	if (j->buf.len == 0) {
		j->buf.nocrc = true;
		(void)rec_begin(&j->buf, JRN_BATCH);
	}
	return (&j->buf);
}

/* The log buffer if journalling, after the job's JOB record. */
static struct jbuf *
jrn_buf(struct srv_job *job)
{
	struct srv_jrn *j = job->core->jrn;

	if (j == NULL)
		return (NULL);
	if (j->broken) {
		j->lost = true;
		return (NULL);
	}
	(void)jrn_log(j);
	if (!job->journaled) {
		rec_job(&j->buf, job);
		j->st.records++;
		job->journaled = true;
	}
	j->st.records++;
	return (&j->buf);
}

void
srv_jrn_gen(struct srv_job *job)
{
	struct jbuf *b = jrn_buf(job);

	if (b != NULL)
		rec_gen(b, job);
}

void
srv_jrn_fail(
    struct srv_job *job, const struct srv_member *m, const char *detail)
{
	struct jbuf *b = jrn_buf(job);

	if (b != NULL)
		rec_fail(b, job, m->rank, m->failure, detail);
}

void
srv_jrn_leave(struct srv_job *job, const struct srv_member *m)
{
	struct jbuf *b = jrn_buf(job);

	if (b != NULL)
		rec_rank(b, JRN_LEAVE, job, m->rank);
}

void
srv_jrn_group(struct srv_job *job, const struct srv_group *g)
{
	struct jbuf *b = jrn_buf(job);

	if (b != NULL)
		rec_group(b, job, g);
}

static void
jrn_kv(struct srv_job *job, enum jrn_type t, const char *key, const void *v,
    size_t len)
{
	struct jbuf *b = jrn_buf(job);

	if (b != NULL)
		rec_put(b, t, t != JRN_KV_DEL ? "ssb" : "ss", job->name, key,
		    v, len);
}

void
srv_jrn_kv_put(
    struct srv_job *job, const char *key, const void *val, size_t len)
{
	jrn_kv(job, JRN_KV_PUT, key, val, len);
}

void
srv_jrn_kv_append(
    struct srv_job *job, const char *key, const void *val, size_t len)
{
	jrn_kv(job, JRN_KV_APPEND, key, val, len);
}

void
srv_jrn_kv_del(struct srv_job *job, const char *key)
{
	jrn_kv(job, JRN_KV_DEL, key, NULL, 0);
}

void
srv_jrn_reply(struct srv_client *cl, uint64_t seq, nng_msg *m)
{
	struct jbuf *b = jrn_buf(cl->job);

	if (b != NULL)
		rec_reply(b, cl->job, cl->id, seq, m);
}

void
srv_jrn_client_del(struct srv_client *cl)
{
	struct srv_jrn *j = cl->job->core->jrn;
	struct jbuf *b;
	bool any = false;

	if (j == NULL || !cl->job->journaled)
		return;
	for (unsigned i = 0; i < SRV_CACHE; i++)
		if (cl->cache[i].msg != NULL && cl->cache[i].durable)
			any = true;
	if (!any || (b = jrn_buf(cl->job)) == NULL)
		return;
	rec_put(b, JRN_CLIENT_DEL, "sq", cl->job->name, cl->id);
}

void
srv_jrn_job_del(struct srv_job *job)
{
	struct srv_jrn *j = job->core->jrn;

	if (j == NULL || j->broken || !job->journaled)
		return;
	rec_put(jrn_log(j), JRN_JOB_DEL, "s", job->name);
	j->st.records++;
}
