/*
 * journal.c - opening the state directory (--state-dir DIR): lock,
 * manifest, replay, --recover, the first snapshot; and the snapshots
 * that are due later (a grown log, a retry after a write error).
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/file.h>
#include <sys/stat.h>
#include <time.h>
#include <unistd.h>

#include "core/util.h"
#include "state/lifecycle.h"
#include "journal.h"
#include "log.h"
#include "replay.h"
#include "snapshot.h"

/* The smallest log that triggers a snapshot (--state-dir's default). */
#define JRN_COMPACT_MIN (64ull << 20)

/*
 * `manifest` is 20 bytes: magic, u64 epoch, u32 CRC of the 16 before. It
 * is written (tmp, fsync, rename) once the log of an epoch is started, so
 * a missing or empty log of that epoch, or a missing snapshot, is lost
 * state, not a fresh start. A crash inside a compaction leaves a snapshot
 * one epoch ahead of the manifest: its log may be missing (empty).
 * Returns 1 and *epoch, 0 if absent, or -1 (damaged: error set).
 */
static int
journal_man_read(struct srv_jrn *j, uint64_t *epoch)
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
	    || srv_crc32c(b, 16) != srv_ld32(b + 16)) {
		(void)cohort__err(COHORT_EJOURNAL,
		    "%s/manifest is damaged; cohortd refuses to start "
		    "(`cohortd --recover` rewrites it)",
		    j->dir);
		return (-1);
	}
	*epoch = srv_ld64(b + 8);
	return (1);
}

/* --recover: keep the damaged file under another name (a hard link, so
 * that the original stays until the new snapshot replaces it). */
static cohort_status
journal_keep_aside(
    struct srv_jrn *j, const char *name, char *aside, size_t len)
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
journal_remove_stale(struct srv_jrn *j)
{
	char name[64];

	(void)unlinkat(j->dfd, "snapshot.tmp", 0);
	(void)unlinkat(j->dfd, "manifest.tmp", 0);
	for (uint64_t e = j->epoch > 4 ? j->epoch - 4 : 0; e < j->epoch + 4;
	     e++) {
		if (e == j->epoch)
			continue;
		srv_jrn_log_name(name, sizeof(name), e);
		(void)unlinkat(j->dfd, name, 0);
	}
}

cohort_status
srv_journal_open(
    struct srv_core *core, const struct srv_jrn_opts *o, cohort__time now)
{
	struct srv_jrn *j = calloc(1, sizeof(*j));
	cohort_status rv;
	uint64_t t0 = cohort__now_ns();
	uint64_t mepoch = 0;
	int have_man;
	bool have_snap, snap_bad, log_bad;

	if (j == NULL)
		return (COHORT_ENOMEM);
	j->fd = j->dfd = j->lockfd = -1;
	j->fsync = o->fsync;
	j->compact_min = o->compact_min ? o->compact_min : JRN_COMPACT_MIN;
	if (core->lim.max_value > (1ull << 30)) {
		srv_jrn_free(j);
		return (cohort__err(COHORT_EINVAL,
		    "--state-dir allows --max-value-bytes up to 1 GiB"));
	}
	if ((j->dir = srv_strdup(o->dir)) == NULL) {
		srv_jrn_free(j);
		return (COHORT_ENOMEM);
	}
	if (mkdir(o->dir, 0700) != 0 && errno != EEXIST) {
		rv = cohort__err(COHORT_EINVAL, "--state-dir %s: %s", o->dir,
		    strerror(errno));
		srv_jrn_free(j);
		return (rv);
	}
	if ((j->dfd = open(o->dir, O_RDONLY | O_DIRECTORY | O_CLOEXEC)) < 0) {
		rv = cohort__err(COHORT_EINVAL, "--state-dir %s: %s", o->dir,
		    strerror(errno));
		srv_jrn_free(j);
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
		srv_jrn_free(j);
		return (rv);
	}
	if (flock(j->lockfd, LOCK_EX | LOCK_NB) != 0) {
		rv = cohort__err(COHORT_EEXIST,
		    "--state-dir %s is in use by another cohortd", o->dir);
		srv_jrn_free(j);
		return (rv);
	}
	if ((have_man = journal_man_read(j, &mepoch)) < 0) {
		if (!o->recover) {
			srv_jrn_free(j);
			return (COHORT_EJOURNAL);
		}
		cohort__warn("%s --recover: %s", o->dir, cohort_last_error());
		have_man = 0;
	}
	if ((rv = srv_replay_snapshot(
	         core, j, o->recover, &have_snap, &snap_bad, now))
	    != COHORT_OK) {
		srv_jrn_free(j);
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
		srv_jrn_free(j);
		return (rv);
	}
	if ((rv = srv_replay_log(core, j, have_man && j->epoch == mepoch,
	         o->recover, &log_bad, now))
	    != COHORT_OK) {
		srv_jrn_free(j);
		return (rv);
	}
	if (o->recover && have_man && j->epoch < mepoch) {
		/* The snapshot of the manifest's epoch is gone (or older):
		 * its log cannot be replayed without it; keep it aside
		 * rather than let it be removed as stale. */
		char lname[64], aside[96];
		srv_jrn_log_name(lname, sizeof(lname), mepoch);
		if ((rv = journal_keep_aside(j, lname, aside, sizeof(aside)))
		    != COHORT_OK) {
			srv_jrn_free(j);
			return (rv);
		}
		cohort__warn("%s --recover: the snapshot of epoch %" PRIu64
		             " is missing; its log is kept as %s (if it "
		             "existed), the state starts from epoch %" PRIu64,
		    o->dir, mepoch, aside, j->epoch);
	}
	if (o->recover && (snap_bad || log_bad)) {
		char lname[64], aside[2][96] = { "", "" };
		srv_jrn_log_name(lname, sizeof(lname), j->epoch);
		if ((snap_bad
		        && (rv = journal_keep_aside(
		                j, "snapshot", aside[0], sizeof(aside[0])))
		            != COHORT_OK)
		    || (log_bad
		        && (rv = journal_keep_aside(
		                j, lname, aside[1], sizeof(aside[1])))
		            != COHORT_OK)) {
			srv_jrn_free(j);
			return (rv);
		}
		/* The state as recovered becomes a snapshot of the next
		 * epoch, with an empty log. */
		core->jrn = j;
		rv = srv_snapshot_compact(core);
		core->jrn = NULL;
		if (rv != COHORT_OK) {
			srv_jrn_free(j);
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
	if ((!have_man || mepoch != j->epoch)
	    && srv_jrn_man_write(j, j->epoch) != 0) {
		rv = cohort__err(COHORT_EJOURNAL, "%s/manifest: %s", o->dir,
		    strerror(errno));
		srv_jrn_free(j);
		return (rv);
	}
	journal_remove_stale(j);
	srv_jobs_restored(core);
	j->st.replay_ms = (cohort__now_ns() - t0) / 1000000;
	core->jrn = j;
	if (j->st.replayed > 0)
		cohort__info("state restored from %s: %zu jobs, %" PRIu64
		             " records in %" PRIu64 " ms; members have their "
		             "dead-after to reconnect",
		    o->dir, core->jobs.n, j->st.replayed, j->st.replay_ms);
	return (COHORT_OK);
}

void
srv_journal_tick(struct srv_core *core, cohort__time now)
{
	if (srv_jrn_compact_due(core->jrn, now))
		(void)srv_snapshot_compact(core);
}

bool
srv_journal_writable(struct srv_core *core, cohort__time now)
{
	srv_journal_tick(core, now);
	return (srv_jrn_writable(core->jrn));
}

void
srv_journal_close(struct srv_core *core)
{
	srv_jrn_close(core->jrn);
	core->jrn = NULL;
}
