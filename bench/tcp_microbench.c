/*
 * tcp_microbench.c - the tcp backend alone, without cohortd: forks N rank
 * processes that rendezvous through a directory (a file per key) and time
 * one collective per size, nccl-tests style.
 *
 *   tcp_microbench [-n RANKS] [-s SIZES] [-i ITERS] [-w WARMUP]
 *                  [-o allreduce|broadcast|allgather|reduce_scatter|reduce]
 *                  [-t f32|f64|f16|bf16|i32|i64|u8] [-r sum|prod|min|max|mean]
 *                  [-R REPS] [--inplace|--outofplace] [--json]
 *
 * SIZES is a comma list of byte sizes with K/M suffixes (default
 * 4K,64K,1M,16M,64M). Time is the slowest rank's loop / ITERS (rank 0
 * gathers every rank's time with a gather after the loop). busbw follows
 * nccl-tests: allreduce 2(n-1)/n, allgather and reduce_scatter (n-1)/n,
 * broadcast and reduce 1. Buffers are allocated at the largest size and
 * touched first. -R REPS repeats each timed loop and keeps each rank's
 * fastest (noisy shared machines). The COHORT_TCP_* tunables apply.
 */
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <poll.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/host/host_impl.h"
#include "fs_store.h" /* tests/unit: the store the tcp tests use too */

#define MB_MAX_SIZES 32

static struct fs_store mb_store;

struct mb_opts {
	int n;
	size_t sizes[MB_MAX_SIZES];
	int nsizes;
	int iters;
	int warmup;
	int reps;
	enum cohort__op_kind kind;
	cohort_dtype dt;
	cohort_redop op;
	bool inplace;
	bool json;
};

static size_t
mb_parse_size(const char *s)
{
	char *end;
	unsigned long long v = strtoull(s, &end, 10);

	if (*end == 'K' || *end == 'k')
		v <<= 10;
	else if (*end == 'M' || *end == 'm')
		v <<= 20;
	else if (*end == 'G' || *end == 'g')
		v <<= 30;
	return ((size_t)v);
}

/* The collectives it times; -o takes their names (cohort__op_name). */
static const enum cohort__op_kind mb_kinds[]
    = { COHORT__OP_ALLREDUCE, COHORT__OP_REDUCE, COHORT__OP_BROADCAST,
	      COHORT__OP_ALLGATHER, COHORT__OP_REDUCE_SCATTER };

/* The dtype (dtype) or reduction (!dtype) named v, else cur. */
static int
mb_named(const char *v, bool dtype, int cur)
{
	int n = dtype ? COHORT_DTYPE_COUNT : COHORT_REDOP_COUNT;

	for (int d = 0; d < n; d++)
		if (strcmp(v,
		        dtype ? cohort_dtype_name((cohort_dtype)d)
		              : cohort_redop_name((cohort_redop)d))
		    == 0)
			return (d);
	return (cur);
}

static double
mb_busfactor(enum cohort__op_kind k, int n)
{
	switch (k) {
	case COHORT__OP_ALLREDUCE:
		return (2.0 * (n - 1) / n);
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_REDUCE_SCATTER:
		return ((double)(n - 1) / n);
	default:
		return (1.0);
	}
}

static int
mb_rank(const struct mb_opts *o, int rank)
{
	int32_t granks[64];
	struct cohort__group_desc d;
	char err[512] = "";
	void *state = NULL;
	size_t es = cohort_dtype_size(o->dt), maxb = 0;
	uint8_t *send, *recv;
	uint64_t seq = 0, init_ns;
	cohort_status rv;

	for (int i = 0; i < o->n; i++)
		granks[i] = i;
	for (int i = 0; i < o->nsizes; i++)
		if (o->sizes[i] > maxb)
			maxb = o->sizes[i];
	memset(&d, 0, sizeof(d));
	d.job = "bench";
	d.generation = 1;
	d.group_id = "world";
	d.rank = rank;
	d.size = o->n;
	d.global_ranks = granks;
	fs_store_bind(&mb_store, &d.store);
	init_ns = cohort__now_ns();
	if ((rv = cohort__host_backend.init(
	         &d, &state, err, sizeof(err), cohort__now_ms() + 30000))
	    != COHORT_OK) {
		fprintf(stderr, "rank %d: init: %s: %s\n", rank,
		    cohort_status_name(rv), err);
		return (1);
	}
	init_ns = cohort__now_ns() - init_ns;
	/* Allgather/reduce_scatter sizes are the total buffer. */
	send = malloc(maxb + 64);
	recv = malloc(maxb + 64);
	if (send == NULL || recv == NULL)
		return (1);
	/* A non-zero byte: gcc turns malloc and a zero memset into calloc,
	 * which leaves a fresh mapping untouched, and the first timed call
	 * then takes the page faults (bench/README, "The bench's own first
	 * calls"). */
	memset(send, 1, maxb + 64);
	memset(recv, 1, maxb + 64);
	for (size_t i = 0; i + 4 <= maxb && o->dt == COHORT_F32; i += 4) {
		float f = (float)(rank + 1);

		memcpy(send + i, &f, 4);
		memcpy(recv + i, &f, 4);
	}
	if (rank == 0 && !o->json)
		printf("# tcp backend, %d ranks, %s %s %s, %s; rank 0 init "
		       "%.1f ms (%s)\n",
		    o->n, cohort__op_name(o->kind), cohort_dtype_name(o->dt),
		    cohort_redop_name(o->op),
		    o->inplace ? "in place" : "out of place",
		    (double)init_ns / 1e6,
		    ((struct cohort__host *)state)->shm != NULL
		        ? "shared memory"
		        : "pure TCP");
	if (rank == 0 && !o->json)
		printf("%12s %12s %10s %10s %10s %10s\n", "size", "count",
		    "time_us", "first_us", "algbw", "busbw");
	for (int si = 0; si < o->nsizes; si++) {
		size_t bytes = o->sizes[si];
		size_t count = bytes / es;
		struct cohort__op op;
		uint64_t t0 = 0, first = 0, loop;
		int iters = o->iters > 0   ? o->iters
		    : bytes <= (64u << 10) ? 2000
		    : bytes <= (1u << 20)  ? 200
		    : bytes <= (16u << 20) ? 30
		                           : 10;
		uint64_t times[64];

		memset(&op, 0, sizeof(op));
		op.kind = o->kind;
		op.dtype = o->dt;
		op.op = o->op;
		op.send = send;
		op.recv = o->inplace ? send : recv;
		if (o->kind == COHORT__OP_ALLGATHER) {
			count /= (size_t)o->n;
			op.send = o->inplace ? recv + (size_t)rank * count * es
			                     : send;
			op.recv = recv;
		} else if (o->kind == COHORT__OP_REDUCE_SCATTER) {
			count /= (size_t)o->n;
			op.recv = o->inplace ? send + (size_t)rank * count * es
			                     : recv;
		}
		op.count = count;
		loop = UINT64_MAX;
		for (int rep = 0; rep < (o->reps > 0 ? o->reps : 1); rep++) {
			int w = rep == 0 ? o->warmup : 0;

			for (int it = rep == 0 ? -1 : 0; it < w + iters;
			     it++) {
				struct cohort__op b
				    = { .kind = COHORT__OP_BARRIER };

				if (it == -1 || it == w) {
					b.seq = ++seq;
					if ((rv = cohort__host_backend.run(
					         state, &b, err, sizeof(err),
					         cohort__now_ms() + 60000))
					    != COHORT_OK)
						goto out_fail;
					if (it == -1)
						first = cohort__now_ns();
					else
						t0 = cohort__now_ns();
				}
				op.seq = ++seq;
				if ((rv = cohort__host_backend.run(state, &op,
				         err, sizeof(err),
				         cohort__now_ms() + 60000))
				    != COHORT_OK)
					goto out_fail;
				if (it == -1)
					first = cohort__now_ns() - first;
			}
			if (cohort__now_ns() - t0 < loop)
				loop = cohort__now_ns() - t0;
		}
		{
			/* Gather the loop and first-call times at rank 0. */
			uint64_t mine[2] = { loop, first };
			uint64_t all[128];
			struct cohort__op g = { .kind = COHORT__OP_GATHER,
				.send = mine,
				.recv = all,
				.count = 2,
				.dtype = COHORT_I64,
				.root = 0,
				.seq = ++seq };

			if ((rv = cohort__host_backend.run(state, &g, err,
			         sizeof(err), cohort__now_ms() + 60000))
			    != COHORT_OK)
				goto out_fail;
			if (rank == 0) {
				uint64_t worst = 0, wfirst = 0;
				double us, algbw, busbw;

				for (int p = 0; p < o->n; p++) {
					times[p] = all[2 * p];
					if (times[p] > worst)
						worst = times[p];
					if (all[2 * p + 1] > wfirst)
						wfirst = all[2 * p + 1];
				}
				us = (double)worst / 1e3 / iters;
				algbw = (double)bytes / (us * 1e3);
				busbw = algbw * mb_busfactor(o->kind, o->n);
				if (o->json)
					printf(
					    "{\"impl\":\"cohort-tcp\","
					    "\"algo\":\"%s\",\"ranks\":%d,"
					    "\"size\":%zu,\"count\":%zu,"
					    "\"dtype\":\"%s\",\"op\":\"%s\","
					    "\"time_us\":%.2f,\"first_us\":"
					    "%.2f,\"algbw\":%.3f,\"busbw\":"
					    "%.3f,\"iters\":%d,\"warmup\":%d}"
					    "\n",
					    cohort__op_name(o->kind), o->n,
					    bytes, count,
					    cohort_dtype_name(o->dt),
					    cohort_redop_name(o->op), us,
					    (double)wfirst / 1e3, algbw, busbw,
					    iters, o->warmup);
				else
					printf("%12zu %12zu %10.1f %10.1f "
					       "%10.3f %10.3f\n",
					    bytes, count, us,
					    (double)wfirst / 1e3, algbw,
					    busbw);
				fflush(stdout);
			}
		}
	}
	cohort__host_backend.fini(state);
	free(send);
	free(recv);
	return (0);

out_fail:
	fprintf(
	    stderr, "rank %d: %s: %s\n", rank, cohort_status_name(rv), err);
	cohort__host_backend.fini(state);
	return (1);
}

int
main(int argc, char **argv)
{
	struct mb_opts o = { .n = 2,
		.iters = 0,
		.warmup = 3,
		.kind = COHORT__OP_ALLREDUCE,
		.dt = COHORT_F32,
		.op = COHORT_SUM,
		.inplace = true };
	const char *sizes = "4K,64K,1M,16M,64M";
	pid_t pids[64];
	int status, failed = 0;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--json") == 0) {
			o.json = true;
		} else if (strcmp(a, "--inplace") == 0) {
			o.inplace = true;
		} else if (strcmp(a, "--outofplace") == 0) {
			o.inplace = false;
		} else if (v == NULL) {
			fprintf(stderr, "missing value for %s\n", a);
			return (2);
		} else if (strcmp(a, "-n") == 0) {
			o.n = (int)strtol(v, NULL, 10);
			i++;
		} else if (strcmp(a, "-s") == 0) {
			sizes = v;
			i++;
		} else if (strcmp(a, "-i") == 0) {
			o.iters = (int)strtol(v, NULL, 10);
			i++;
		} else if (strcmp(a, "-R") == 0) {
			o.reps = (int)strtol(v, NULL, 10);
			i++;
		} else if (strcmp(a, "-w") == 0) {
			o.warmup = (int)strtol(v, NULL, 10);
			i++;
		} else if (strcmp(a, "-o") == 0) {
			o.kind = COHORT__OP_ALLREDUCE;
			for (size_t k = 0;
			     k < sizeof(mb_kinds) / sizeof(mb_kinds[0]); k++)
				if (strcmp(v, cohort__op_name(mb_kinds[k]))
				    == 0)
					o.kind = mb_kinds[k];
			i++;
		} else if (strcmp(a, "-t") == 0) {
			o.dt = (cohort_dtype)mb_named(v, true, (int)o.dt);
			i++;
		} else if (strcmp(a, "-r") == 0) {
			o.op = (cohort_redop)mb_named(v, false, (int)o.op);
			i++;
		} else {
			fprintf(stderr, "unknown option %s\n", a);
			return (2);
		}
	}
	if (o.n < 1 || o.n > 64) {
		fprintf(stderr, "-n must be 1..64\n");
		return (2);
	}
	{
		char *copy = strdup(sizes), *save = NULL;

		for (char *tok = strtok_r(copy, ",", &save);
		     tok != NULL && o.nsizes < MB_MAX_SIZES;
		     tok = strtok_r(NULL, ",", &save))
			o.sizes[o.nsizes++] = mb_parse_size(tok);
		free(copy);
	}
	if (!fs_store_open(&mb_store, "cohort-mb")) {
		perror("mkdtemp");
		return (1);
	}
	fflush(stdout);
	for (int r = 0; r < o.n; r++) {
		pids[r] = fork();
		if (pids[r] == 0)
			_exit(mb_rank(&o, r));
	}
	for (int r = 0; r < o.n; r++) {
		waitpid(pids[r], &status, 0);
		if (!WIFEXITED(status) || WEXITSTATUS(status) != 0)
			failed = 1;
	}
	if (!fs_store_close(&mb_store))
		failed = 1;
	return (failed);
}
