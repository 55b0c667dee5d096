/*
 * log.c - the journal's writer: the log of the current epoch, its
 * batches, fdatasync, write errors, and the records the state modules
 * write (in plain values: names, numbers, bytes).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "log.h"

int
srv_jrn_write_all(int fd, const uint8_t *p, size_t n)
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

void
srv_jrn_hdr_fill(uint8_t *h, const char *magic, uint64_t epoch)
{
	memcpy(h, magic, 8);
	srv_st32(h + 8, (uint32_t)epoch);
	srv_st32(h + 12, (uint32_t)(epoch >> 32));
}

void
srv_jrn_log_name(char *buf, size_t len, uint64_t epoch)
{
	snprintf(buf, len, "log.%" PRIu64, epoch);
}

/* Creates log.<epoch> with its header (replacing one that exists). */
int
srv_jrn_log_create(struct srv_jrn *j, uint64_t epoch)
{
	char name[64];
	uint8_t h[JRN_HDR];
	int fd, e;

	srv_jrn_log_name(name, sizeof(name), epoch);
	fd = openat(j->dfd, name,
	    O_WRONLY | O_CREAT | O_TRUNC | O_APPEND | O_CLOEXEC, 0600);
	if (fd < 0)
		return (-1);
	srv_jrn_hdr_fill(h, JRN_MAGIC_LOG, epoch);
	if (srv_jrn_write_all(fd, h, sizeof(h)) == 0 && fdatasync(fd) == 0
	    && fsync(j->dfd) == 0)
		return (fd);
	e = errno;
	close(fd);
	errno = e;
	return (-1);
}

int
srv_jrn_man_write(struct srv_jrn *j, uint64_t epoch)
{
	uint8_t b[JRN_MAN];
	int fd, e;

	srv_jrn_hdr_fill(b, JRN_MAGIC_MAN, epoch);
	srv_st32(b + 16, srv_crc32c(b, 16));
	fd = openat(j->dfd, "manifest.tmp",
	    O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0600);
	if (fd < 0)
		return (-1);
	if (srv_jrn_write_all(fd, b, sizeof(b)) != 0 || fdatasync(fd) != 0) {
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

void
srv_jrn_free(struct srv_jrn *j)
{
	if (j == NULL)
		return;
	COHORT__CLOSE_ALL(j->fd, j->syncedfd, j->dfd, j->lockfd);
	free(j->buf.p);
	free(j->dir);
	free(j);
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
srv_jrn_flush(struct srv_jrn *j, cohort__time now)
{
	bool lost;

	if (j == NULL)
		return (true);
	lost = j->lost;
	j->lost = false;
	if (j->buf.len == 0)
		return (!lost);
	if (j->buf.len - JRN_RHDR > JRN_MAX_REC)
		j->buf.oom = true; /* cannot happen with values <= 1 GiB */
	srv_rec_finish(&j->buf, 0, true); /* the batch */
	if (j->broken || j->buf.oom
	    || srv_jrn_write_all(j->fd, j->buf.p, j->buf.len) != 0) {
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
	return (!lost);
}

bool
srv_jrn_compact_due(struct srv_jrn *j, cohort__time now)
{
	uint64_t lim;

	if (j == NULL)
		return (false);
	if (j->broken) {
		if (now < j->retry_at)
			return (false);
		j->retry_at = now + JRN_RETRY_MS;
		return (true);
	}
	lim = j->st.snap_bytes * 2;
	if (lim < j->compact_min)
		lim = j->compact_min;
	return (j->st.log_bytes > lim);
}

bool
srv_jrn_writable(const struct srv_jrn *j)
{
	return (j == NULL || !j->broken);
}

const char *
srv_jrn_problem(const struct srv_jrn *j)
{
	if (j == NULL || !j->broken)
		return (NULL);
	return (j->problem[0] != '\0'
	        ? j->problem
	        : "cohortd cannot write to its --state-dir");
}

void
srv_jrn_sync_failed(struct srv_jrn *j, int err)
{
	if (j == NULL)
		return;
	jrn_break(j, err, cohort__now_ms(), "fdatasync in");
}

int
srv_jrn_sync_fd(struct srv_jrn *j, struct srv_jrn_mark *mark)
{
	memset(mark, 0, sizeof(*mark));
	mark->fd = -1;
	if (j == NULL || j->fd < 0 || j->broken)
		return (-1);
	mark->fd = j->syncedfd;
	mark->epoch = j->epoch;
	if (j->fsync == SRV_FSYNC_ALWAYS) {
		/* every write was synced before its replies left */
		if (j->syncedfd >= 0 && j->marked != j->st.log_bytes) {
			mark->len = j->st.log_bytes;
			j->marked = mark->len;
		}
		return (-1);
	}
	if (!j->dirty || j->fsync != SRV_FSYNC_BATCH)
		return (-1);
	j->dirty = false;
	j->st.fsyncs++;
	if (j->syncedfd >= 0) {
		mark->len = j->st.log_bytes;
		j->marked = mark->len;
	}
	return (fcntl(j->fd, F_DUPFD_CLOEXEC, 0));
}

/* DIR/synced's bytes for (epoch, len). */
static void
jrn_synced_fill(uint8_t *b, uint64_t epoch, uint64_t len)
{
	memcpy(b, JRN_MAGIC_SYNCED, 8);
	srv_st32(b + 8, (uint32_t)epoch);
	srv_st32(b + 12, (uint32_t)(epoch >> 32));
	srv_st32(b + 16, (uint32_t)len);
	srv_st32(b + 20, (uint32_t)(len >> 32));
	srv_st32(b + 24, srv_crc32c(b, 24));
}

void
srv_jrn_mark_synced(const struct srv_jrn_mark *mark)
{
	uint8_t b[JRN_SYNCED];

	if (mark->fd < 0 || mark->len == 0)
		return;
	/* One 28-byte write at offset 0: a torn one fails its CRC and
	 * then says nothing (the check is skipped, as before). */
	jrn_synced_fill(b, mark->epoch, mark->len);
	if (pwrite(mark->fd, b, sizeof(b), 0) != (ssize_t)sizeof(b)
	    || fdatasync(mark->fd) != 0)
		cohort__debug(
		    "journal: cannot write synced: %s", strerror(errno));
}

uint64_t
srv_jrn_synced_read(struct srv_jrn *j, uint64_t epoch)
{
	uint8_t b[JRN_SYNCED];
	int fd = openat(j->dfd, "synced", O_RDONLY | O_CLOEXEC);
	ssize_t n;

	if (fd < 0)
		return (0);
	n = pread(fd, b, sizeof(b), 0);
	close(fd);
	if (n != (ssize_t)sizeof(b) || memcmp(b, JRN_MAGIC_SYNCED, 8) != 0
	    || srv_crc32c(b, 24) != srv_ld32(b + 24)
	    || srv_ld64(b + 8) != epoch)
		return (0);
	return (srv_ld64(b + 16));
}

int
srv_jrn_synced_open(struct srv_jrn *j)
{
	return (openat(j->dfd, "synced", O_RDWR | O_CREAT | O_CLOEXEC, 0600));
}

void
srv_jrn_close(struct srv_jrn *j)
{
	if (j == NULL)
		return;
	srv_jrn_flush(j, 0);
	if (j->fd >= 0 && j->fsync != SRV_FSYNC_NONE && fdatasync(j->fd) == 0
	    && !j->broken) {
		struct srv_jrn_mark m
		    = { j->syncedfd, j->epoch, j->st.log_bytes };
		srv_jrn_mark_synced(&m);
	}
	srv_jrn_free(j);
}

void
srv_jrn_stats(const struct srv_jrn *j, struct srv_jrn_stats *st)
{
	if (j != NULL)
		*st = j->st;
	else
		memset(st, 0, sizeof(*st));
}

/* ------------------------------------------------------------------------ */
/* Records                                                                  */
/* ------------------------------------------------------------------------ */

/* The log buffer, in a batch: every record of one event (request,
 * sweep, closed connection) is written with one write() and replayed all
 * or none, so that a kv_add and its cached reply cannot be torn apart. */
static struct srv_jbuf *
jrn_log(struct srv_jrn *j)
{
	if (j->buf.len == 0) {
		j->buf.nocrc = true;
		(void)srv_rec_begin(&j->buf, JRN_BATCH);
	}
	return (&j->buf);
}

/* The log buffer if journalling, after the job's JOB record. */
static struct srv_jbuf *
jrn_buf(struct srv_jrn *j, struct srv_jrn_job *jj)
{
	if (j == NULL)
		return (NULL);
	if (j->broken) {
		j->lost = true;
		return (NULL);
	}
	(void)jrn_log(j);
	if (!jj->written) {
		srv_rec_job(&j->buf, jj);
		j->st.records++;
		jj->written = true;
	}
	j->st.records++;
	return (&j->buf);
}

void
srv_jrn_gen(struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t gen,
    uint32_t world, const struct srv_jrn_member *m)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b == NULL)
		return;
	if (m == NULL)
		b->oom = true; /* its member table could not be made */
	else
		srv_rec_gen(b, jj->name, gen, world, m);
}

void
srv_jrn_reshape(
    struct srv_jrn *j, struct srv_jrn_job *jj, const struct srv_jrn_egen *rs)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b == NULL)
		return;
	if (rs->m == NULL)
		b->oom = true;
	else
		srv_rec_reshape(b, jj->name, rs);
}

void
srv_jrn_hold(struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t gen,
    uint32_t world, const bool *has_state)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b == NULL)
		return;
	if (has_state == NULL)
		b->oom = true;
	else
		srv_rec_hold(b, jj->name, gen, world, has_state);
}

void
srv_jrn_fail(struct srv_jrn *j, struct srv_jrn_job *jj, int32_t rank,
    const char *text, const char *detail)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b != NULL)
		srv_rec_fail(b, jj->name, rank, text, detail);
}

void
srv_jrn_leave(struct srv_jrn *j, struct srv_jrn_job *jj, int32_t rank)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b != NULL)
		srv_rec_rank(b, JRN_LEAVE, jj->name, rank);
}

void
srv_jrn_group(struct srv_jrn *j, struct srv_jrn_job *jj, const char *group,
    uint32_t n, const int32_t *ranks)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b != NULL)
		srv_rec_group(b, jj->name, group, n, ranks);
}

static void
jrn_kv(struct srv_jrn *j, struct srv_jrn_job *jj, enum jrn_type t,
    const char *key, const void *v, size_t len)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b != NULL)
		srv_rec_put(b, t, t != JRN_KV_DEL ? "ssb" : "ss", jj->name,
		    key, v, len);
}

void
srv_jrn_kv_put(struct srv_jrn *j, struct srv_jrn_job *jj, const char *key,
    const void *val, size_t len)
{
	jrn_kv(j, jj, JRN_KV_PUT, key, val, len);
}

void
srv_jrn_kv_append(struct srv_jrn *j, struct srv_jrn_job *jj, const char *key,
    const void *val, size_t len)
{
	jrn_kv(j, jj, JRN_KV_APPEND, key, val, len);
}

void
srv_jrn_kv_del(struct srv_jrn *j, struct srv_jrn_job *jj, const char *key)
{
	jrn_kv(j, jj, JRN_KV_DEL, key, NULL, 0);
}

void
srv_jrn_reply(struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t client_id,
    uint64_t seq, nng_msg *reply)
{
	struct srv_jbuf *b = jrn_buf(j, jj);

	if (b != NULL)
		srv_rec_reply(b, jj->name, client_id, seq, reply);
}

void
srv_jrn_client_del(
    struct srv_jrn *j, struct srv_jrn_job *jj, uint64_t client_id)
{
	struct srv_jbuf *b;

	if (j == NULL || !jj->written || (b = jrn_buf(j, jj)) == NULL)
		return;
	srv_rec_put(b, JRN_CLIENT_DEL, "sq", jj->name, client_id);
}

void
srv_jrn_job_token(struct srv_jrn *j, struct srv_jrn_job *jj)
{
	if (j == NULL || jj->written)
		return;
	if (j->broken) {
		j->lost = true;
		return;
	}
	(void)jrn_log(j);
	srv_rec_job(&j->buf, jj);
	j->st.records++;
	jj->written = true;
}

void
srv_jrn_job_del(struct srv_jrn *j, struct srv_jrn_job *jj)
{
	if (j == NULL || j->broken || !jj->written)
		return;
	srv_rec_put(jrn_log(j), JRN_JOB_DEL, "s", jj->name);
	j->st.records++;
}
