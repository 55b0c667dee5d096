/*
 * seed_journal.c - seed corpus of fuzz_journal: real state directories
 * written by cohortd's own core (joins, keys, groups, failures, leaves,
 * cached replies, an elastic job's changes, a compaction), in
 * fuzz_journal's input format.
 *
 * Usage: seed_journal DIR
 */
#include <sys/stat.h>
#include <unistd.h>

#include "fuzz_common.h"

static uintptr_t tag = 1;
static cohort__time now = 1000000;

/* Runs an op stream against core (as fuzz_dispatch does). */
static void
drive(struct srv_core *core, const struct fz_buf *b)
{
	size_t off = 0;

	while (off < b->len) {
		uint8_t op = b->p[off++];
		if (op == FZ_OP_SWEEP) {
			now += 50 * (cohort__time)b->p[off++];
			srv_core_sweep(core, now);
		} else if (op == FZ_OP_CLOSE) {
			srv_core_pipe_closed(core, 1 + b->p[off++], now);
		} else {
			size_t len
			    = (size_t)b->p[off] | (size_t)b->p[off + 1] << 8;
			uint32_t pipe = 1 + b->p[off + 2];
			nng_msg *m;
			off += 3;
			if (nng_msg_alloc(&m, len) != 0)
				abort();
			memcpy(nng_msg_body(m), b->p + off, len);
			off += len;
			srv_core_dispatch(core, m, pipe, (void *)tag++, now);
		}
	}
}

/* dir/name's bytes, or NULL. */
static uint8_t *
slurp(const char *dir, const char *name, size_t *n)
{
	return ((uint8_t *)srq_read_file(dir, name, n));
}

/* Writes a seed: flags, [u32 n, snapshot], log. */
static void
seed(const char *out, int i, uint8_t flags, const uint8_t *snap, size_t sn,
    const uint8_t *log, size_t ln)
{
	struct fz_buf b;
	char name[32];

	memset(&b, 0, sizeof(b));
	fz_u8(&b, flags);
	if (flags & 2) {
		fz_u8(&b, (uint8_t)sn);
		fz_u8(&b, (uint8_t)(sn >> 8));
		fz_u8(&b, (uint8_t)(sn >> 16));
		fz_u8(&b, (uint8_t)(sn >> 24));
		fz_put(&b, snap, sn);
	}
	fz_put(&b, log, ln);
	snprintf(name, sizeof(name), "seed-%02d", i);
	fz_write(out, name, b.p, b.len);
	free(b.p);
}

int
main(int argc, char **argv)
{
	const char *out = argc > 1 ? argv[1] : ".";
	char dir[] = "/tmp/cohort-seed-journal-XXXXXX";
	struct srv_limits lim = { 1u << 20, 1u << 24, 1000 };
	struct srv_core *core;
	cohort_status rv;
	struct srq_cli c[3];
	struct fz_buf b;
	uint8_t *log, *snap;
	size_t ln, sn;
	int n = 0;

	cohort__log_set_default_level(COHORT__LOG_ERROR);
	if (mkdtemp(dir) == NULL)
		abort();
	core = srq_core_journal(&lim, dir, false, 0, now, &rv);
	if (core == NULL || rv != COHORT_OK)
		abort();
	memset(&b, 0, sizeof(b));
	memset(c, 0, sizeof(c));
	fz_world(&b, c, 3, "job", 100);
	fz_kv_set(&b, &c[0], "addr", "10.0.0.1:4000");
	fz_kv_add(&b, &c[1], "ctr", 3);
	{
		Cohort__KvAppend ap = COHORT__KV_APPEND__INIT;
		Cohort__KvDelete d = COHORT__KV_DELETE__INIT;
		int32_t ranks[2] = { 0, 1 };
		fz_group(&b, &c[0], "pair", ranks, 2);
		fz_group(&b, &c[1], "pair", ranks, 2);
		ap.key = "log";
		fz_simple(
		    &b, &c[2], COHORT__REQUEST__BODY_KV_APPEND, &ap, "abc", 3);
		fz_kv_set(&b, &c[2], "gone", "x");
		d.key = "gone";
		fz_simple(
		    &b, &c[2], COHORT__REQUEST__BODY_KV_DELETE, &d, NULL, 0);
	}
	for (int i = 0; i < 3; i++)
		fz_coll(&b, &c[i], COHORT__COLLECTIVE_KIND__COLL_BARRIER, "",
		    1, NULL, 0);
	{
		/* An elastic job (README section 8): its first generation
		 * (RESHAPE), a member lost (FAIL, RESHAPE), a joiner
		 * admitted at a boundary (RESHAPE), a boundary after the
		 * transfer (HOLD). */
		struct srq_cli e[5];
		int32_t pair[2] = { 1, 2 };
		fz_world_el(&b, e, 4, "el", 200, 5, 2);
		fz_group(&b, &e[1], "pair", pair, 2);
		fz_group(&b, &e[2], "pair", pair, 2);
		fz_close(&b, 6); /* e[1]: generation 2 */
		for (int i = 0; i < 4; i++) {
			if (i == 1)
				continue;
			fz_reform(&b, &e[i]);
			e[i].gen = 2;
			e[i].rank = i == 0 ? 0 : i - 1;
		}
		srq_cli_init(&e[4], "el", 204, 9);
		fz_join_el(&b, &e[4], -1, 2, 4);
		fz_boundary(&b, &e[0], 1, true);
		fz_boundary(&b, &e[2], 1, true);
		fz_boundary(&b, &e[3], 1, true); /* generation 3 */
		e[4].rank = 3;
		e[4].gen = 3;
		for (int i = 0; i < 4; i++) {
			if (i == 1)
				continue;
			fz_reform(&b, &e[i]);
			e[i].gen = 3;
		}
		for (int i = 0; i < 5; i++)
			if (i != 1)
				fz_boundary(&b, &e[i], 1, true);
	}
	drive(core, &b);
	free(b.p);
	memset(&b, 0, sizeof(b));
	/* A log alone (epoch 0), plain and with --recover. */
	log = slurp(dir, "log.0", &ln);
	seed(out, n++, 0, NULL, 0, log, ln);
	seed(out, n++, 1, NULL, 0, log, ln);
	seed(out, n++, 4, NULL, 0, log, ln);
	free(log);
	/* A compaction, then a failure (closed connection) and a leave. */
	if (srv_snapshot_compact(core) != COHORT_OK)
		abort();
	fz_kv_add(&b, &c[1], "ctr", 1);
	{
		Cohort__Leave lv = COHORT__LEAVE__INIT;
		fz_simple(
		    &b, &c[0], COHORT__REQUEST__BODY_LEAVE, &lv, NULL, 0);
	}
	fz_close(&b, 3);
	drive(core, &b);
	free(b.p);
	snap = slurp(dir, "snapshot", &sn);
	log = slurp(dir, "log.1", &ln);
	seed(out, n++, 2 | 4, snap, sn, log, ln);
	seed(out, n++, 1 | 2 | 4, snap, sn, log, ln);
	seed(out, n++, 2, snap, sn, NULL, 0);
	free(snap);
	free(log);
	srv_core_free(core);
	if (!tmpdir_remove(dir))
		return (1);
	printf("seed_journal: %d seeds in %s\n", n, out);
	return (0);
}
