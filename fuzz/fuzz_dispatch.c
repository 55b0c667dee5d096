/*
 * fuzz_dispatch.c - libFuzzer target: cohortd's request decoder and
 * dispatch (server/front/dispatch.c, server/core/call.c and every
 * handler), driven by the op stream of fuzz_common.h: requests on a few
 * connections, sweeps after fake time, closed connections.
 *
 * The server state is kept across inputs, so a join from one input may
 * be completed, used and failed by the next ones, as on a long-running
 * coordinator. The core journals to a directory on /dev/shm; every
 * FZ_RESTART inputs it is dropped (as by kill -9) and a new one restarts
 * from that journal, which must replay: what the core wrote, it must be
 * able to read. Every reply must decode.
 *
 * Oracles: ASan/UBSan, an abort if a reply does not decode or the
 * journal the core wrote cannot be replayed.
 */
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "fuzz_common.h"

#define FZ_RESTART 2000

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

static struct srv_core *fz_core;
static cohort__time fz_now = 1000000;
static uintptr_t fz_tag = 1;
static unsigned fz_runs;
static char fz_dir[128];

static void
fz_rmdir(void)
{
	(void)tmpdir_remove(fz_dir);
}

static void
fz_start(void)
{
	struct srv_limits lim = { 1u << 16, 1u << 20, 256 };
	cohort_status rv;

	fz_core = srq_core_journal(&lim, fz_dir, false, 1u << 20, fz_now, &rv);
	if (fz_core == NULL)
		abort();
	if (rv != COHORT_OK) {
		fprintf(stderr,
		    "fuzz_dispatch: the journal the core wrote does not "
		    "replay: %s: %s\n",
		    cohort_status_name(rv), cohort_last_error());
		abort();
	}
}

static void
fz_init(void)
{
	const char *shm = access("/dev/shm", W_OK) == 0 ? "/dev/shm" : "/tmp";

	cohort__log_set_default_level(-1);
	snprintf(fz_dir, sizeof(fz_dir), "%s/cohort-fuzz-dispatch-%d", shm,
	    (int)getpid());
	fz_rmdir();
	atexit(fz_rmdir);
	fz_start();
}

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	size_t off = 0;

	if (fz_core == NULL)
		fz_init();
	if (++fz_runs % FZ_RESTART == 0) {
		/* kill -9 and a restart from the journal; now and then a
		 * fresh directory so that the state stays small. */
		srv_core_free(fz_core);
		if (fz_runs % (FZ_RESTART * 16) == 0)
			fz_rmdir();
		fz_start();
	}
	while (off < size) {
		uint8_t op = data[off++] % 4;
		if (op == FZ_OP_SWEEP) {
			if (off < size)
				fz_now += 50 * (cohort__time)data[off++];
			srv_core_sweep(fz_core, fz_now);
		} else if (op == FZ_OP_CLOSE) {
			uint32_t pipe = off < size ? data[off++] : 0;
			srv_core_pipe_closed(
			    fz_core, 1 + pipe % FZ_PIPES, fz_now);
		} else {
			size_t len;
			uint32_t pipe;
			nng_msg *m;
			if (size - off < 3)
				break;
			len = (size_t)data[off] | (size_t)data[off + 1] << 8;
			pipe = 1 + data[off + 2] % FZ_PIPES;
			off += 3;
			if (len > size - off)
				len = size - off;
			if (nng_msg_alloc(&m, len) != 0)
				abort();
			if (len > 0)
				memcpy(nng_msg_body(m), data + off, len);
			off += len;
			srv_core_dispatch(
			    fz_core, m, pipe, (void *)fz_tag++, fz_now);
		}
	}
	return (0);
}
