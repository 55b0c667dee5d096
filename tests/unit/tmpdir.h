/*
 * tmpdir.h - a fresh directory or file under $TMPDIR (else /tmp), and a
 * directory emptied or removed with the files in it, for the tests' stores,
 * state directories and secret files and the fuzz targets (tests/unit,
 * tests/chaos and fuzz/). Header-only.
 */
#ifndef COHORT_TMPDIR_H
#define COHORT_TMPDIR_H

#include <dirent.h>
#include <fcntl.h>
#include <stdbool.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

/* Creates <$TMPDIR or /tmp>/<prefix>-XXXXXX into buf; false on failure. */
static inline bool
tmpdir_make(char *buf, size_t len, const char *prefix)
{
	const char *t = getenv("TMPDIR");

	snprintf(buf, len, "%s/%s-XXXXXX",
	    t != NULL && t[0] != '\0' ? t : "/tmp", prefix);
	return (mkdtemp(buf) != NULL);
}

/* Writes text to the open file fd and closes it; false on failure (also
 * for fd < 0, the failed open or mkstemp of the callers below). */
static inline bool
tmpfd_write(int fd, const char *text)
{
	size_t n = strlen(text);
	bool ok;

	if (fd < 0)
		return (false);
	ok = write(fd, text, n) == (ssize_t)n;
	return (close(fd) == 0 && ok);
}

/* Writes text to path, replacing what was there; false on failure. */
static inline bool
tmpfile_write(const char *path, const char *text)
{
	return (tmpfd_write(
	    open(path, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0666), text));
}

/* Creates a fresh file <$TMPDIR or /tmp>/<prefix>-XXXXXX (its path into
 * buf) holding text; false on failure. */
static inline bool
tmpfile_make(char *buf, size_t len, const char *prefix, const char *text)
{
	const char *t = getenv("TMPDIR");

	snprintf(buf, len, "%s/%s-XXXXXX",
	    t != NULL && t[0] != '\0' ? t : "/tmp", prefix);
	return (tmpfd_write(mkstemp(buf), text));
}

/* Removes the files in dir (no subdirectories), keeping dir; false if
 * dir cannot be read. */
static inline bool
tmpdir_empty(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[1024];

	if (d == NULL)
		return (false);
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0
		    || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		(void)unlink(p);
	}
	closedir(d);
	return (true);
}

/* Removes dir and the files in it (no subdirectories); false if dir is
 * still there. */
static inline bool
tmpdir_remove(const char *dir)
{
	return (tmpdir_empty(dir) && rmdir(dir) == 0);
}

#endif /* COHORT_TMPDIR_H */
