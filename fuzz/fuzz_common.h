/*
 * fuzz_common.h - shared by the fuzz targets and their seed generators:
 * a core driven without sockets, the op stream of fuzz_dispatch, and
 * requests appended to it, built by tests/unit/srv_req.h (the project's
 * own encoder, as the server's unit tests use it).
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

#include <stdint.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "srv_req.h" /* tests/unit: shared with the server's unit tests */

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

/* Appends a request op: rq with c's envelope, packed by the project's
 * encoder (srv_req.h), on c's connection. */
static inline void
fz_send(struct fz_buf *b, struct srq_cli *c, Cohort__Request *rq,
    const void *pl, size_t plen)
{
	nng_msg *m;
	size_t n;

	if (srq_pack(c, rq, pl, plen, &m) != COHORT_OK)
		abort();
	n = nng_msg_len(m);
	if (n > 0xffff)
		abort();
	fz_u8(b, FZ_OP_REQUEST);
	fz_u8(b, (uint8_t)n);
	fz_u8(b, (uint8_t)(n >> 8));
	fz_u8(b, (uint8_t)(c->pipe - 1));
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

/* Requests of client c (srv_req.h builders). */
static inline void
fz_join(struct fz_buf *b, struct srq_cli *c, int32_t rank, uint32_t world)
{
	struct srq q;

	fz_send(b, c, srq_join(&q, c, rank, world, rank, 60000), NULL, 0);
}

/* n clients of job (ids id0 + i, connections 1 + i) join a world of n;
 * after the joins their ranks are their indexes, generation 1. */
static inline void
fz_world(
    struct fz_buf *b, struct srq_cli *c, int n, const char *job, uint64_t id0)
{
	for (int i = 0; i < n; i++) {
		srq_cli_init(&c[i], job, id0 + (uint64_t)i, (uint32_t)(1 + i));
		fz_join(b, &c[i], i, (uint32_t)n);
	}
	srq_cli_joined(c, n);
}

/* Elastic (proto/README.md section 8): a join of a job of min..max. */
static inline void
fz_join_el(struct fz_buf *b, struct srq_cli *c, int32_t rank, uint32_t min,
    uint32_t max)
{
	struct srq q;
	Cohort__Request *rq = srq_join(&q, c, rank, max, rank, 60000);

	q.b.join.min_world = min;
	fz_send(b, c, rq, NULL, 0);
}

/* n clients (ids id0 + i, connections pipe0 + i) form an elastic job of
 * min..n ranks; afterwards their ranks are their indexes, generation 1. */
static inline void
fz_world_el(struct fz_buf *b, struct srq_cli *c, int n, const char *job,
    uint64_t id0, uint32_t pipe0, uint32_t min)
{
	for (int i = 0; i < n; i++) {
		srq_cli_init(
		    &c[i], job, id0 + (uint64_t)i, pipe0 + (uint32_t)i);
		fz_join_el(b, &c[i], i, min, (uint32_t)n);
	}
	srq_cli_joined(c, n);
}

/* A step boundary (COLL_BOUNDARY) and a Reform of c. */
static inline void
fz_boundary(
    struct fz_buf *b, struct srq_cli *c, uint64_t op_seq, bool has_state)
{
	struct srq q;
	Cohort__Collective co = COHORT__COLLECTIVE__INIT;

	co.kind = COHORT__COLLECTIVE_KIND__COLL_BOUNDARY;
	co.op_seq = op_seq;
	co.has_state = has_state;
	fz_send(b, c,
	    srq_simple(&q, COHORT__REQUEST__BODY_COLLECTIVE, &co, 5000), NULL,
	    0);
}

static inline void
fz_reform(struct fz_buf *b, struct srq_cli *c)
{
	struct srq q;
	Cohort__Reform rf = COHORT__REFORM__INIT;

	fz_send(b, c, srq_simple(&q, COHORT__REQUEST__BODY_REFORM, &rf, 0),
	    NULL, 0);
}

static inline void
fz_kv_set(struct fz_buf *b, struct srq_cli *c, const char *key, const char *v)
{
	struct srq q;

	fz_send(b, c, srq_kv_set(&q, key), v, strlen(v));
}

static inline void
fz_kv_add(struct fz_buf *b, struct srq_cli *c, const char *key, int64_t d)
{
	struct srq q;

	fz_send(b, c, srq_kv_add(&q, key, d), NULL, 0);
}

static inline void
fz_kv_get(struct fz_buf *b, struct srq_cli *c, const char *key, bool wait)
{
	struct srq q;

	fz_send(b, c, srq_kv_get(&q, key, wait, wait ? 2000 : 0), NULL, 0);
}

static inline void
fz_coll(struct fz_buf *b, struct srq_cli *c, Cohort__CollectiveKind kind,
    const char *group, uint64_t op_seq, const void *pl, size_t plen)
{
	struct srq q;
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
	fz_send(b, c,
	    srq_simple(&q, COHORT__REQUEST__BODY_COLLECTIVE, &co, 5000), pl,
	    plen);
}

static inline void
fz_group(struct fz_buf *b, struct srq_cli *c, const char *name, int32_t *ranks,
    size_t n)
{
	struct srq q;

	fz_send(b, c, srq_group_create(&q, name, ranks, n, 1000), NULL, 0);
}

static inline void
fz_simple(struct fz_buf *b, struct srq_cli *c, int body, void *msg,
    const void *pl, size_t plen)
{
	struct srq q;

	fz_send(b, c, srq_simple(&q, body, msg, 1000), pl, plen);
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
