/*
 * snapshot.c - the whole state as records: compaction.
 *
 * A snapshot is written to `snapshot.tmp`, fsynced and renamed, so it is
 * whole or absent; it ends with an END record and starts a new epoch,
 * whose log starts empty. It reads every job, member, group, key and
 * remembered reply through the state's headers (above the state, like
 * the replay); the records are the same the state writes as it changes.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "core/clients.h"
#include "state/elastic.h"
#include "state/groups.h"
#include "state/job.h"
#include "state/kv.h"
#include "log.h"
#include "snapshot.h"

struct snapshot {
	struct srv_jrn *j;
	int fd;
	struct srv_jbuf b;
	uint64_t bytes;
	int err;
	struct srv_job *job;
};

static void
snapshot_flush(struct snapshot *s, bool all)
{
	if (s->b.oom && s->err == 0)
		s->err = ENOMEM;
	if (s->err != 0 || (!all && s->b.len < JRN_FLUSH_CHUNK))
		return;
	if (srv_jrn_write_all(s->fd, s->b.p, s->b.len) != 0)
		s->err = errno;
	s->bytes += s->b.len;
	s->b.len = 0;
}

static void
snapshot_kv(void *arg, const char *key, const void *val, size_t vlen)
{
	struct snapshot *s = arg;

	srv_rec_put(&s->b, JRN_KV_PUT, "ssb", s->job->name, key, val, vlen);
	snapshot_flush(s, false);
}

/* An elastic job's generation: the older changes a Reform may come from
 * (JRN_GENMAP), then the generation itself (JRN_RESHAPE, with the step
 * that made it). */
static void
snapshot_elastic(
    struct srv_jbuf *b, struct srv_job *job, const struct srv_jrn_member *recs)
{
	const struct srv_el_step *st, *cur = NULL;
	struct srv_jrn_egen rs;

	for (unsigned i = 0; (st = srv_elastic_step(job, i)) != NULL; i++) {
		if (st->gen == job->generation && st->n == job->world) {
			cur = st;
			continue;
		}
		srv_rec_genmap(
		    b, job->name, st->gen, st->prev_gen, st->n, st->prev);
	}
	rs.gen = job->generation;
	rs.prev_gen = cur != NULL ? cur->prev_gen : 0;
	rs.min_world = job->min_world;
	rs.max_world = job->max_world;
	rs.world = job->world;
	rs.m = recs;
	srv_rec_reshape(b, job->name, &rs);
}

/* The members older changes removed, oldest first (JRN_REMOVED). */
static void
snapshot_removed(struct srv_jbuf *b, struct srv_job *job)
{
	const struct srv_el_removed *r;

	for (unsigned i = 0; (r = srv_elastic_removal(job, i)) != NULL; i++)
		srv_rec_put(b, JRN_REMOVED, "sqqwswss", job->name,
		    r->client_id, r->gen, (uint32_t)r->rank, r->host, r->pid,
		    r->text, r->detail);
}

static void
snapshot_job(struct snapshot *s, struct srv_job *job)
{
	struct srv_jbuf *b = &s->b;
	struct srv_hnode *n;
	size_t i;

	s->job = job;
	srv_rec_job(b, &job->jr);
	if (job->members != NULL) {
		struct srv_jrn_member *recs = srv_job_member_recs(job);
		if (recs == NULL)
			b->oom = true;
		else if (srv_job_elastic(job))
			snapshot_elastic(b, job, recs);
		else
			srv_rec_gen(
			    b, job->name, job->generation, job->world, recs);
		free(recs);
		/* The job's failure first: its detail is the job's. */
		if (job->state == SRV_JOB_FAILED && job->failed_rank >= 0
		    && (uint32_t)job->failed_rank < job->world)
			srv_rec_fail(b, job->name, job->failed_rank,
			    job->failed_text, job->failed_detail);
		for (uint32_t r = 0; r < job->world; r++) {
			const struct srv_member *m = &job->members[r];
			if (m->state == SRV_MEMBER_LEFT)
				srv_rec_rank(b, JRN_LEAVE, job->name, m->rank);
			else if (m->state == SRV_MEMBER_FAILED
			    && m->rank != job->failed_rank)
				srv_rec_fail(
				    b, job->name, m->rank, m->failure, "");
		}
		for (n = srv_map_next(&job->groups, &i, NULL); n != NULL;
		     n = srv_map_next(&job->groups, &i, n)) {
			struct srv_group *g
			    = SRV_CONTAINER(n, struct srv_group, hn);
			if (g->complete && g->name[0] != '\0')
				srv_rec_group(
				    b, job->name, g->name, g->n, g->ranks);
		}
		snapshot_removed(b, job);
	}
	snapshot_flush(s, false);
	srv_kv_foreach(job->kv, snapshot_kv, s);
	for (n = srv_map_next(&job->clients.map, &i, NULL); n != NULL;
	     n = srv_map_next(&job->clients.map, &i, n)) {
		struct srv_client *cl
		    = SRV_CONTAINER(n, struct srv_client, hn);
		/* Oldest first, so that the ring comes back in order. */
		for (unsigned k = 0; k < SRV_CACHE; k++) {
			unsigned x = (cl->cache_next + k) % SRV_CACHE;
			if (cl->cache[x].msg != NULL && cl->cache[x].durable)
				srv_rec_reply(b, job->name, cl->id,
				    cl->cache[x].seq, cl->cache[x].msg);
		}
		snapshot_flush(s, false);
	}
	job->jr.written = true;
}

cohort_status
srv_snapshot_compact(struct srv_core *core)
{
	struct srv_jrn *j = core->jrn;
	struct snapshot s;
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
	srv_jrn_hdr_fill(h, JRN_MAGIC_SNAP, j->epoch + 1);
	if (srv_jrn_write_all(s.fd, h, sizeof(h)) != 0)
		s.err = errno;
	s.bytes = JRN_HDR;
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL && s.err == 0;
	     n = srv_map_next(&core->jobs, &i, n))
		snapshot_job(&s, SRV_CONTAINER(n, struct srv_job, hn));
	off = srv_rec_begin(&s.b, JRN_END);
	srv_rec_end(&s.b, off);
	snapshot_flush(&s, true);
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
	srv_jrn_log_name(old, sizeof(old), j->epoch);
	j->epoch++;
	nfd = srv_jrn_log_create(j, j->epoch);
	if (j->fd >= 0)
		close(j->fd);
	j->fd = nfd;
	if (nfd >= 0 && srv_jrn_man_write(j, j->epoch) != 0)
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
