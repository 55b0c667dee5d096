/*
 * fuzz_journal.c - libFuzzer target: the journal reader (server/journal/
 * journal.c, replay.c): a state directory with a snapshot, a log and a
 * manifest made of the input, opened as cohortd opens it at start (replay,
 * torn-tail and damage detection, --recover's resync).
 *
 * Input: u8 flags (bit 0: --recover; bit 1: a snapshot; bit 2: a manifest
 * naming the snapshot's epoch; bit 3: no log file when the rest is
 * empty), then with a snapshot u32 n (little endian) and n bytes of it;
 * the rest is log.<epoch> (epoch from the snapshot's header, 0 without
 * one).
 *
 * Oracles: ASan/UBSan, and a directory that opened once must open again
 * without --recover (what the reader keeps or writes, it can read).
 */
#include <fcntl.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static char fz_dir[128];

static void
fz_rmdir(void)
{
	(void)tmpdir_remove(fz_dir);
}

static void
fz_file(const char *name, const uint8_t *p, size_t n)
{
	char path[256];
	int fd;

	snprintf(path, sizeof(path), "%s/%s", fz_dir, name);
	fd = open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
	if (fd < 0 || (n > 0 && write(fd, p, n) != (ssize_t)n))
		abort();
	close(fd);
}

static cohort_status
fz_open(bool recover)
{
	struct srv_limits lim = { 1u << 20, 1u << 24, 1000 };
	struct srv_core *core;
	cohort_status rv;

	core = srq_core_journal(&lim, fz_dir, recover, 0, 1000000, &rv);
	if (core == NULL)
		abort();
	srv_core_free(core);
	return (rv);
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	uint8_t flags;
	uint64_t epoch = 0;
	char name[64];
	cohort_status rv;

	if (fz_dir[0] == '\0') {
		const char *shm
		    = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";
		cohort__log_set_default_level(-1);
		snprintf(fz_dir, sizeof(fz_dir), "%s/cohort-fuzz-journal-%d",
		    shm, (int)getpid());
		atexit(fz_rmdir);
	}
	if (size < 1)
		return (0);
	fz_rmdir();
	if (mkdir(fz_dir, 0700) != 0)
		abort();
	flags = data[0];
	data++;
	size--;
	if (flags & 2) {
		size_t n;
		if (size < 4)
			return (0);
		n = (size_t)data[0] | (size_t)data[1] << 8
		    | (size_t)data[2] << 16 | (size_t)data[3] << 24;
		data += 4;
		size -= 4;
		if (n > size)
			n = size;
		fz_file("snapshot", data, n);
		if (n >= 16)
			for (int i = 7; i >= 0; i--)
				epoch = epoch << 8 | data[8 + i];
		data += n;
		size -= n;
	}
	if (flags & 4) {
		uint8_t m[20];
		memcpy(m, "COHORTM1", 8);
		for (int i = 0; i < 8; i++)
			m[8 + i] = (uint8_t)(epoch >> (8 * i));
		uint32_t crc = srv_crc32c(m, 16);
		for (int i = 0; i < 4; i++)
			m[16 + i] = (uint8_t)(crc >> (8 * i));
		fz_file("manifest", m, sizeof(m));
	}
	snprintf(name, sizeof(name), "log.%llu", (unsigned long long)epoch);
	if (size > 0 || !(flags & 8))
		fz_file(name, data, size);
	rv = fz_open((flags & 1) != 0);
	if (rv == COHORT_OK && (rv = fz_open(false)) != COHORT_OK) {
		fprintf(stderr,
		    "fuzz_journal: opened once, then not again: %s: %s\n",
		    cohort_status_name(rv), cohort_last_error());
		abort();
	}
	return (0);
}
