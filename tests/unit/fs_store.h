/*
 * fs_store.h - a rendezvous store in a directory, a file per key, for
 * backend ranks in different processes without cohortd: the tcp backend's
 * unit tests (forked ranks) and bench/tcp_microbench.c share this copy.
 * Header-only; a set writes a temporary file and renames it into place, a
 * get polls until the key's file exists or the deadline passes.
 */
#ifndef COHORT_FS_STORE_H
#define COHORT_FS_STORE_H

#include <fcntl.h>
#include <poll.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "backend/backend.h"
#include "tmpdir.h"

struct fs_store {
	char dir[256];
};

/* The file of key: '/' in the key becomes '_'. */
static inline void
fs_store_path(
    const struct fs_store *fs, const char *key, char *out, size_t len)
{
	char k[200];
	size_t i;

	for (i = 0; key[i] != '\0' && i + 1 < sizeof(k); i++)
		k[i] = key[i] == '/' ? '_' : key[i];
	k[i] = '\0';
	snprintf(out, len, "%s/%s", fs->dir, k);
}

static inline cohort_status
fs_store_set(void *ctx, const char *key, const void *val, size_t len,
    cohort__time deadline)
{
	char path[512], tmp[520];
	int fd;

	fs_store_path(ctx, key, path, sizeof(path));
	snprintf(tmp, sizeof(tmp), "%s.tmp", path);
	if ((fd = open(tmp, O_WRONLY | O_CREAT | O_TRUNC, 0600)) < 0)
		return (COHORT_ESYSTEM);
	if (write(fd, val, len) != (ssize_t)len) {
		close(fd);
		return (COHORT_ESYSTEM);
	}
	close(fd);
	return (rename(tmp, path) == 0 ? COHORT_OK : COHORT_ESYSTEM);
}

/* Values are at most 256 bytes (the backends' address records). */
static inline cohort_status
fs_store_get(
    void *ctx, const char *key, void **val, size_t *len, cohort__time deadline)
{
	char path[512];

	fs_store_path(ctx, key, path, sizeof(path));
	for (;;) {
		int fd = open(path, O_RDONLY);

		if (fd >= 0) {
			char *buf = malloc(256);
			ssize_t n = read(fd, buf, 256);

			close(fd);
			if (n < 0) {
				free(buf);
				return (COHORT_ESYSTEM);
			}
			*val = buf;
			*len = (size_t)n;
			return (COHORT_OK);
		}
		if (cohort__expired(deadline))
			return (COHORT_ETIMEDOUT);
		(void)poll(NULL, 0, 2); /* bounded by the deadline */
	}
}

/* Creates a fresh directory <$TMPDIR or /tmp>/<prefix>-XXXXXX; false on
 * failure. */
static inline bool
fs_store_open(struct fs_store *fs, const char *prefix)
{
	return (tmpdir_make(fs->dir, sizeof(fs->dir), prefix));
}

/* The store a group descriptor uses: fs is its context. */
static inline void
fs_store_bind(struct fs_store *fs, struct cohort__store *st)
{
	st->ctx = fs;
	st->set = fs_store_set;
	st->get = fs_store_get;
}

/* d describes rank of a group of size ranks (generation 1) whose store
 * is fs; granks is the group's rank -> job rank map. */
static inline void
fs_store_desc(struct cohort__group_desc *d, struct fs_store *fs,
    const char *job, const char *group_id, int rank, int size,
    const int32_t *granks)
{
	memset(d, 0, sizeof(*d));
	d->job = job;
	d->generation = 1;
	d->group_id = group_id;
	d->rank = rank;
	d->size = size;
	d->global_ranks = granks;
	fs_store_bind(fs, &d->store);
}

/* Removes the directory and the keys in it; false if it is still there. */
static inline bool
fs_store_close(struct fs_store *fs)
{
	return (tmpdir_remove(fs->dir));
}

#endif /* COHORT_FS_STORE_H */
