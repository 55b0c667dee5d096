/*
 * fuzz_common.h - shared by the fuzz targets and their seed generators:
 * a core driven without sockets, the op stream of fuzz_dispatch, and
 * request builders on the project's own encoder (proto/wire.h).
 *
 * Convention (Makefile `fuzz`): every fuzz/fuzz_<name>.c defining
 * LLVMFuzzerTestOneInput is a target; an optional fuzz/seed_<name>.c is a
 * program that writes its seed corpus into the directory given as its
 * argument (`make fuzz` runs it first).
 *
 * The op stream (fuzz_dispatch), read until the input ends:
 *
 *     u8 op % 4 = 0, 1  a request: u16 len (little endian), u8 pipe, then
 *                       len bytes: the nng message body as the transport
 *                       would hand it to srv_core_dispatch (framing and
 *                       all: [u32 BE L][envelope][payload])
 *                 2     a sweep after u8 t x 50 ms of fake time
 *                 3     the connection u8 pipe closes
 *
 * Pipes are 1..FZ_PIPES (the byte modulo FZ_PIPES, plus one).
 */
#ifndef COHORT_FUZZ_COMMON_H
#define COHORT_FUZZ_COMMON_H

#include <dirent.h>
#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srv_impl.h"

#define FZ_PIPES 4
#define FZ_OP_REQUEST 0
#define FZ_OP_SWEEP 2
#define FZ_OP_CLOSE 3

/* A growing byte buffer (seed generators). */
struct fz_buf {
	uint8_t *p;
	size_t len;
	size_t cap;
};

static inline void
fz_put(struct fz_buf *b, const void *d, size_t n)
{
	if (n == 0)
		return;
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 1024;
		while (cap < b->len + n)
			cap *= 2;
		b->p = realloc(b->p, cap);
		if (b->p == NULL)
			abort();
		b->cap = cap;
	}
	memcpy(b->p + b->len, d, n);
	b->len += n;
}

static inline void
fz_u8(struct fz_buf *b, uint8_t v)
{
	fz_put(b, &v, 1);
}

/* Appends a request op: rq packed by the project's encoder. */
static inline void
fz_request(struct fz_buf *b, Cohort__Request *rq, const void *pl, size_t plen,
    uint8_t pipe)
{
	struct cohort__iov iov = { pl, plen };
	nng_msg *m;
	size_t n;

	rq->proto_version = COHORT_PROTO_VERSION;
	if (cohort__wire_pack_request(rq, &iov, plen ? 1 : 0, &m) != COHORT_OK)
		abort();
	n = nng_msg_len(m);
	if (n > 0xffff)
		abort();
	fz_u8(b, FZ_OP_REQUEST);
	fz_u8(b, (uint8_t)n);
	fz_u8(b, (uint8_t)(n >> 8));
	fz_u8(b, (uint8_t)(pipe - 1));
	fz_put(b, nng_msg_body(m), n);
	nng_msg_free(m);
}

static inline void
fz_sweep(struct fz_buf *b, uint8_t t50)
{
	fz_u8(b, FZ_OP_SWEEP);
	fz_u8(b, t50);
}

static inline void
fz_close(struct fz_buf *b, uint8_t pipe)
{
	fz_u8(b, FZ_OP_CLOSE);
	fz_u8(b, (uint8_t)(pipe - 1));
}

/* A client of a job: envelope fields for its requests. */
struct fz_cli {
	const char *job;
	const char *token;
	uint64_t id;
	uint64_t seq;
	uint64_t gen;
	int32_t rank;
	uint8_t pipe;
};

static inline void
fz_env(struct fz_cli *c, Cohort__Request *rq, uint32_t timeout_ms)
{
	rq->job = (char *)c->job;
	rq->token = (char *)c->token;
	rq->client_id = c->id;
	rq->seq = ++c->seq;
	rq->generation = c->gen;
	rq->rank = c->rank;
	rq->timeout_ms = timeout_ms;
}

static inline void
fz_join(struct fz_buf *b, struct fz_cli *c, int32_t rank, uint32_t world)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Join j = COHORT__JOIN__INIT;

	j.rank = rank;
	j.world_size = world;
	j.host = "fuzzhost";
	j.pid = (uint32_t)c->id;
	j.local_rank = rank;
	j.heartbeat_ms = 1000;
	j.dead_after_ms = 5000;
	rq.body_case = COHORT__REQUEST__BODY_JOIN;
	rq.join = &j;
	fz_env(c, &rq, 60000);
	fz_request(b, &rq, NULL, 0, c->pipe);
}

static inline void
fz_kv_set(struct fz_buf *b, struct fz_cli *c, const char *key, const char *v)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvSet s = COHORT__KV_SET__INIT;

	s.key = (char *)key;
	rq.body_case = COHORT__REQUEST__BODY_KV_SET;
	rq.kv_set = &s;
	fz_env(c, &rq, 0);
	fz_request(b, &rq, v, strlen(v), c->pipe);
}

static inline void
fz_kv_add(struct fz_buf *b, struct fz_cli *c, const char *key, int64_t d)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvAdd a = COHORT__KV_ADD__INIT;

	a.key = (char *)key;
	a.delta = d;
	rq.body_case = COHORT__REQUEST__BODY_KV_ADD;
	rq.kv_add = &a;
	fz_env(c, &rq, 0);
	fz_request(b, &rq, NULL, 0, c->pipe);
}

static inline void
fz_kv_get(struct fz_buf *b, struct fz_cli *c, const char *key, bool wait)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvGet g = COHORT__KV_GET__INIT;

	g.key = (char *)key;
	g.wait = wait;
	rq.body_case = COHORT__REQUEST__BODY_KV_GET;
	rq.kv_get = &g;
	fz_env(c, &rq, wait ? 2000 : 0);
	fz_request(b, &rq, NULL, 0, c->pipe);
}

static inline void
fz_coll(struct fz_buf *b, struct fz_cli *c, Cohort__CollectiveKind kind,
    const char *group, uint64_t op_seq, const void *pl, size_t plen)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;
	int64_t v[2] = { (int64_t)c->id, 7 };

	co.kind = kind;
	co.group = (char *)group;
	co.op_seq = op_seq;
	co.name = "step";
	co.root = 0;
	co.op = 0;
	co.scalar_type = COHORT__SCALAR_TYPE__SCALAR_I64;
	co.n_i64s = 2;
	co.i64s = v;
	co.decision = true;
	co.decide_all = true;
	rq.body_case = COHORT__REQUEST__BODY_COLLECTIVE;
	rq.collective = &co;
	fz_env(c, &rq, 5000);
	fz_request(b, &rq, pl, plen, c->pipe);
}

static inline void
fz_simple(struct fz_buf *b, struct fz_cli *c, int body, void *msg,
    const void *pl, size_t plen)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;

	rq.body_case = body;
	rq.leave = msg; /* any member of the union */
	fz_env(c, &rq, 1000);
	fz_request(b, &rq, pl, plen, c->pipe);
}

/* Removes dir and the files in it (no subdirectories): cheaper than a
 * shell per input. */
static inline void
fz_rmdir_files(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char p[1024];

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		if (strcmp(e->d_name, ".") == 0
		    || strcmp(e->d_name, "..") == 0)
			continue;
		snprintf(p, sizeof(p), "%s/%s", dir, e->d_name);
		(void)unlink(p);
	}
	closedir(d);
	(void)rmdir(dir);
}

/* Writes b to dir/name. */
static inline void
fz_write(const char *dir, const char *name, const void *p, size_t n)
{
	char path[1024];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if ((f = fopen(path, "wb")) == NULL || fwrite(p, 1, n, f) != n) {
		perror(path);
		exit(1);
	}
	fclose(f);
}

#endif /* COHORT_FUZZ_COMMON_H */
