/*
 * replay.c - the state rebuilt from the snapshot and the log, above the
 * state modules: every record is applied through the function of the
 * module that owns what it describes (a job, a generation, a failure, a
 * group, a key, a remembered reply), never by writing their fields.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <unistd.h>

#include "core/clients.h"
#include "state/elastic.h"
#include "state/groups.h"
#include "state/job.h"
#include "state/kv.h"
#include "state/lifecycle.h"
#include "state/member.h"
#include "state/rdzv.h"
#include "log.h"
#include "replay.h"

/* ------------------------------------------------------------------------ */
/* Applying records                                                         */
/* ------------------------------------------------------------------------ */

/* A count (1..SRV_MAX_WORLD) and that many ranks (record.c's jb_ranks),
 * malloc'd into *ranks; EPROTO: a bad count or a short record. */
static cohort_status
replay_ranks(struct srv_jrd *r, uint32_t *n, int32_t **ranks)
{
	int32_t *v;

	*n = srv_rd_u32(r);
	if (r->bad || *n == 0 || *n > SRV_MAX_WORLD)
		return (COHORT_EPROTO);
	if ((v = malloc(sizeof(int32_t) * *n)) == NULL)
		return (COHORT_ENOMEM);
	for (uint32_t i = 0; i < *n; i++)
		v[i] = (int32_t)srv_rd_u32(r);
	if (r->bad) {
		free(v);
		return (COHORT_EPROTO);
	}
	*ranks = v;
	return (COHORT_OK);
}

/* w member records (w checked: 1..SRV_MAX_WORLD) into *recs, their host
 * names into *hosts, both calloc'd for the caller to free; elastic: each
 * with its previous rank and whether it holds the state. A short record
 * leaves r->bad set. */
static cohort_status
replay_members(struct srv_jrd *r, uint32_t w, bool elastic,
    struct srv_jrn_member **recs_out, void **hosts_out)
{
	struct srv_jrn_member *recs;
	char(*hosts)[SRV_MAX_NAME + 1];

	if (r->bad || w == 0 || w > SRV_MAX_WORLD)
		return (COHORT_EPROTO);
	recs = calloc(w, sizeof(*recs));
	hosts = calloc(w, sizeof(*hosts));
	if (recs == NULL || hosts == NULL) {
		free(recs);
		free(hosts);
		return (COHORT_ENOMEM);
	}
	for (uint32_t i = 0; i < w; i++) {
		recs[i].client_id = srv_rd_u64(r);
		recs[i].host = srv_rd_str(r, hosts[i], sizeof(hosts[i]));
		recs[i].pid = srv_rd_u32(r);
		recs[i].local_rank = (int32_t)srv_rd_u32(r);
		recs[i].hb_ms = srv_rd_u32(r);
		recs[i].dead_ms = srv_rd_u32(r);
		if (elastic) {
			recs[i].prev_rank = (int32_t)srv_rd_u32(r);
			recs[i].has_state = srv_rd_u8(r) != 0;
		}
	}
	*recs_out = recs;
	*hosts_out = hosts;
	return (COHORT_OK);
}

static cohort_status
replay_gen(struct srv_job *job, struct srv_jrd *r, cohort__time now)
{
	uint64_t gen = srv_rd_u64(r);
	uint32_t w = srv_rd_u32(r);
	struct srv_jrn_member *recs;
	void *hosts;
	cohort_status rv;

	if ((rv = replay_members(r, w, false, &recs, &hosts)) != COHORT_OK)
		return (rv);
	rv = r->bad ? COHORT_EPROTO
	            : srv_rdzv_restore_gen(job, gen, w, recs, now);
	free(recs);
	free(hosts);
	return (rv);
}

static cohort_status
replay_reshape(struct srv_job *job, struct srv_jrd *r, cohort__time now)
{
	struct srv_jrn_egen rs;
	struct srv_jrn_member *recs;
	void *hosts;
	cohort_status rv;

	rs.gen = srv_rd_u64(r);
	rs.prev_gen = srv_rd_u64(r);
	rs.min_world = srv_rd_u32(r);
	rs.max_world = srv_rd_u32(r);
	rs.world = srv_rd_u32(r);
	if ((rv = replay_members(r, rs.world, true, &recs, &hosts))
	    != COHORT_OK)
		return (rv);
	rs.m = recs;
	rv = r->bad ? COHORT_EPROTO : srv_elastic_restore(job, &rs, now);
	free(recs);
	free(hosts);
	return (rv);
}

static cohort_status
replay_hold(struct srv_job *job, struct srv_jrd *r)
{
	uint64_t gen = srv_rd_u64(r);
	uint32_t w = srv_rd_u32(r);
	bool *has;
	cohort_status rv;

	if (r->bad || w == 0 || w > SRV_MAX_WORLD)
		return (COHORT_EPROTO);
	if ((has = malloc(sizeof(bool) * w)) == NULL)
		return (COHORT_ENOMEM);
	for (uint32_t i = 0; i < w; i++)
		has[i] = srv_rd_u8(r) != 0;
	rv = r->bad ? COHORT_EPROTO
	            : srv_elastic_restore_hold(job, gen, w, has);
	free(has);
	return (rv);
}

static cohort_status
replay_genmap(struct srv_job *job, struct srv_jrd *r)
{
	uint64_t gen = srv_rd_u64(r), prev_gen = srv_rd_u64(r);
	uint32_t n;
	int32_t *prev;
	cohort_status rv;

	if ((rv = replay_ranks(r, &n, &prev)) != COHORT_OK)
		return (rv);
	rv = srv_elastic_restore_step(job, gen, prev_gen, n, prev);
	free(prev);
	return (rv);
}

static cohort_status
replay_removed(struct srv_job *job, struct srv_jrd *r)
{
	char host[SRV_MAX_NAME + 1];
	uint64_t id = srv_rd_u64(r), gen = srv_rd_u64(r);
	int32_t rank = (int32_t)srv_rd_u32(r);
	uint32_t pid;
	char *text, *detail;
	cohort_status rv = COHORT_EPROTO;

	srv_rd_str(r, host, sizeof(host));
	pid = srv_rd_u32(r);
	text = srv_rd_strdup(r);
	detail = srv_rd_strdup(r);
	if (!r->bad)
		rv = srv_elastic_restore_removed(
		    job, id, gen, rank, host, pid, text, detail);
	free(text);
	free(detail);
	return (rv);
}

static cohort_status
replay_group(struct srv_job *job, struct srv_jrd *r)
{
	char gname[SRV_MAX_NAME + 1];
	uint32_t n;
	int32_t *ranks;
	cohort_status rv;

	srv_rd_str(r, gname, sizeof(gname));
	if ((rv = replay_ranks(r, &n, &ranks)) != COHORT_OK)
		return (rv);
	rv = srv_group_restore(job, gname, ranks, n);
	free(ranks);
	return (rv);
}

static cohort_status
replay_reply(struct srv_core *core, struct srv_job *job, struct srv_jrd *r,
    cohort__time now)
{
	uint64_t id = srv_rd_u64(r), seq = srv_rd_u64(r);
	const uint8_t *b;
	size_t blen;
	struct srv_client *cl;
	nng_msg *m;

	b = srv_rd_bytes(r, &blen);
	if (r->bad)
		return (COHORT_EPROTO);
	if ((cl = srv_client_get(core, &job->clients, id, now)) == NULL
	    || nng_msg_alloc(&m, blen) != 0)
		return (COHORT_ENOMEM);
	if (blen > 0)
		memcpy(nng_msg_body(m), b, blen);
	srv_client_cache_put(cl, seq, 0, m, true, true);
	return (COHORT_OK);
}

static cohort_status
replay_apply(
    struct srv_core *core, int type, struct srv_jrd *r, cohort__time now)
{
	char name[SRV_MAX_NAME + 1], tok[SRV_MAX_NAME + 1];
	char key[COHORT__MAX_KEY + 1];
	struct srv_job *job;

	if (type == JRN_END)
		return (COHORT_OK);
	srv_rd_str(r, name, sizeof(name));
	if (r->bad)
		return (COHORT_EPROTO);
	if (type == JRN_JOB) {
		uint64_t id;
		srv_rd_str(r, tok, sizeof(tok));
		id = srv_rd_u64(r);
		if (r->bad)
			return (COHORT_EPROTO);
		return (srv_job_restore(core, name, tok, id) != NULL
		        ? COHORT_OK
		        : COHORT_ENOMEM);
	}
	if ((job = srv_job_find(core, name)) == NULL) {
		/* A record of an unknown job: its first records were lost.
		 * --recover rebuilds it around what follows. */
		if (!core->recovering)
			return (COHORT_EPROTO);
		if (type == JRN_JOB_DEL || type == JRN_CLIENT_DEL)
			return (COHORT_OK); /* nothing to remove */
		if ((job = srv_job_restore_lost(core, name)) == NULL)
			return (COHORT_ENOMEM);
	}
	switch (type) {
	case JRN_JOB_DEL:
		srv_job_free(job, "removed");
		return (COHORT_OK);
	case JRN_GEN:
		return (replay_gen(job, r, now));
	case JRN_FAIL: {
		int32_t rank = (int32_t)srv_rd_u32(r);
		char *text = srv_rd_strdup(r);
		char *detail = srv_rd_strdup(r);
		if (!r->bad)
			srv_member_restore_fail(job, rank, text, detail);
		free(text);
		free(detail);
		return (COHORT_OK);
	}
	case JRN_LEAVE: {
		int32_t rank = (int32_t)srv_rd_u32(r);
		if (r->bad)
			return (COHORT_EPROTO);
		return (srv_member_restore_leave(job, rank));
	}
	case JRN_GROUP:
		return (replay_group(job, r));
	case JRN_KV_PUT:
	case JRN_KV_APPEND: {
		const uint8_t *v;
		size_t vlen;
		srv_rd_str(r, key, sizeof(key));
		v = srv_rd_bytes(r, &vlen);
		if (r->bad || key[0] == '\0')
			return (COHORT_EPROTO);
		return (
		    srv_kv_restore(job, key, v, vlen, type == JRN_KV_APPEND));
	}
	case JRN_KV_DEL:
		srv_rd_str(r, key, sizeof(key));
		if (r->bad)
			return (COHORT_EPROTO);
		srv_kv_restore_del(job, key);
		return (COHORT_OK);
	case JRN_REPLY:
		return (replay_reply(core, job, r, now));
	case JRN_RESHAPE:
		return (replay_reshape(job, r, now));
	case JRN_HOLD:
		return (replay_hold(job, r));
	case JRN_GENMAP:
		return (replay_genmap(job, r));
	case JRN_REMOVED:
		return (replay_removed(job, r));
	case JRN_CLIENT_DEL: {
		uint64_t id = srv_rd_u64(r);
		struct srv_client *cl;
		if (r->bad)
			return (COHORT_EPROTO);
		cl = srv_client_find(&job->clients, id);
		if (cl != NULL && cl->member == NULL)
			srv_client_free(cl);
		return (COHORT_OK);
	}
	default:
		return (COHORT_EPROTO);
	}
}

/* ------------------------------------------------------------------------ */
/* Files                                                                    */
/* ------------------------------------------------------------------------ */

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
		struct srv_jrd r;
		cohort_status rv;
		if (len - off < JRN_RHDR + 1 || (n = srv_ld32(p + off)) == 0
		    || n > len - off - JRN_RHDR
		    || p[off + JRN_RHDR] == JRN_BATCH)
			return (COHORT_EPROTO);
		r.p = p + off + JRN_RHDR + 1;
		r.n = n - 1;
		r.bad = false;
		rv = replay_apply(core, p[off + JRN_RHDR], &r, now);
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
		if (len - off < JRN_RHDR + 1 || (n = srv_ld32(p + off)) == 0
		    || n > len - off - JRN_RHDR)
			return (false);
		t = p[off + JRN_RHDR];
		if (!srv_jrn_type_plain(t))
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
	n = srv_ld32(p + off);
	if (n == 0 || n > len - off - JRN_RHDR)
		return (false);
	t = p[off + JRN_RHDR];
	if (log ? t != JRN_BATCH : !srv_jrn_type_plain(t))
		return (false);
	if (t == JRN_BATCH && !batch_chains(p + off + JRN_RHDR + 1, n - 1))
		return (false);
	return (srv_crc32c(p + off + JRN_RHDR, n) == srv_ld32(p + off + 4));
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
	if (len - off < JRN_RHDR || srv_ld32(p + off) > len - off - JRN_RHDR)
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
replay_records(
    struct srv_core *core, struct jscan *sc, cohort__time now, uint64_t *nrec)
{
	const uint8_t *p = sc->p;
	size_t len = sc->len;

	while (len - sc->off >= JRN_RHDR) {
		size_t off = sc->off;
		uint32_t n = srv_ld32(p + off), crc = srv_ld32(p + off + 4);
		struct srv_jrd r;
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
			rv = replay_apply(core, p[off + JRN_RHDR], &r, now);
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
		cohort_status rv
		    = replay_records(core, sc, now, &j->st.replayed);
		if (rv != COHORT_OK) {
			uint32_t n = srv_ld32(sc->p + sc->off);
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

cohort_status
srv_replay_snapshot(struct srv_core *core, struct srv_jrn *j, bool recover,
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
	j->epoch = srv_ld64(sc.p + 8);
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

/* must: the manifest says this log was started (it must be there). */
cohort_status
srv_replay_log(struct srv_core *core, struct srv_jrn *j, bool must,
    bool recover, uint64_t synced, bool *damaged, cohort__time now)
{
	char name[64];
	struct jscan sc;
	cohort_status rv;
	int fd;

	*damaged = false;
	memset(&sc, 0, sizeof(sc));
	srv_jrn_log_name(name, sizeof(name), j->epoch);
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
		if ((j->fd = srv_jrn_log_create(j, j->epoch)) < 0)
			return (cohort__err(COHORT_EJOURNAL, "%s/%s: %s",
			    j->dir, name, strerror(errno)));
		j->st.log_bytes = JRN_HDR;
		return (COHORT_OK);
	}
	sc.off = JRN_HDR;
	if (memcmp(sc.p, JRN_MAGIC_LOG, 8) != 0
	    || srv_ld64(sc.p + 8) != j->epoch) {
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
	if (rv == COHORT_OK && (sc.torn ? sc.off : sc.len) < synced) {
		/* A crash tears only what was not yet on the disk: whole
		 * records that end before what was synced were cut off. */
		size_t end = sc.torn ? sc.off : sc.len;
		if (!recover) {
			rv = cohort__err(COHORT_EJOURNAL,
			    "%s/%s ends after %" PRIu64
			    " whole records at byte "
			    "%zu, but %s/synced says it was on the disk up to "
			    "byte %" PRIu64 ": %" PRIu64
			    " bytes of acknowledged "
			    "records are missing (the file was cut or lost "
			    "data; a crash tears only the last, unsynced "
			    "write); cohortd refuses to start and leaves it "
			    "as "
			    "it is (`cohortd --recover` starts with the "
			    "records "
			    "that are there)",
			    j->dir, name, sc.whole, end, j->dir, synced,
			    synced - end);
			close(fd);
			return (rv);
		}
		cohort__warn(
		    "%s/%s --recover: the log ends at byte %zu but was "
		    "on the disk up to byte %" PRIu64 " (%s/synced): "
		    "%" PRIu64 " bytes of acknowledged records are "
		    "lost; keeping the %" PRIu64 " whole records there "
		    "are",
		    j->dir, name, end, synced, j->dir, synced - end, sc.whole);
		sc.damaged = true;
		sc.torn = false; /* the file goes aside as it is */
	}
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
