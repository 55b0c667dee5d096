/*
 * tcp_fixture.c - the tcp backend suites' rank threads, stores, inputs
 * and references (tcp_fixture.h).
 */
#include <inttypes.h>
#include <math.h>
#include <signal.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "tcp_fixture.h"

/* ------------------------------------------------------------------------ */
/* In-memory store (gloo HashStore)                                         */
/* ------------------------------------------------------------------------ */

void
tt_store_init(struct tt_store *s)
{
	pthread_condattr_t ca;

	pthread_mutex_init(&s->mu, NULL);
	pthread_condattr_init(&ca);
	pthread_condattr_setclock(&ca, CLOCK_MONOTONIC);
	pthread_cond_init(&s->cv, &ca);
	pthread_condattr_destroy(&ca);
	s->head = NULL;
}

void
tt_store_fini(struct tt_store *s)
{
	while (s->head != NULL) {
		struct tt_kv *kv = s->head;

		s->head = kv->next;
		free(kv->key);
		free(kv->val);
		free(kv);
	}
	pthread_cond_destroy(&s->cv);
	pthread_mutex_destroy(&s->mu);
}

cohort_status
tt_store_set(void *ctx, const char *key, const void *val, size_t len,
    cohort__time deadline)
{
	struct tt_store *s = ctx;
	struct tt_kv *kv;

	pthread_mutex_lock(&s->mu);
	for (kv = s->head; kv != NULL; kv = kv->next)
		if (strcmp(kv->key, key) == 0)
			break;
	if (kv == NULL) {
		kv = calloc(1, sizeof(*kv));
		ck_assert(kv != NULL);
		kv->key = strdup(key);
		kv->next = s->head;
		s->head = kv;
	}
	free(kv->val);
	kv->val = malloc(len + 1);
	ck_assert(kv->val != NULL);
	memcpy(kv->val, val, len);
	kv->len = len;
	pthread_cond_broadcast(&s->cv);
	pthread_mutex_unlock(&s->mu);
	return (COHORT_OK);
}

cohort_status
tt_store_get(
    void *ctx, const char *key, void **val, size_t *len, cohort__time deadline)
{
	struct tt_store *s = ctx;
	cohort_status rv = COHORT_ETIMEDOUT;

	pthread_mutex_lock(&s->mu);
	for (;;) {
		struct tt_kv *kv;
		struct timespec ts;
		cohort__time until;

		for (kv = s->head; kv != NULL; kv = kv->next)
			if (strcmp(kv->key, key) == 0)
				break;
		if (kv != NULL) {
			*val = malloc(kv->len + 1);
			memcpy(*val, kv->val, kv->len);
			*len = kv->len;
			rv = COHORT_OK;
			break;
		}
		if (cohort__expired(deadline))
			break;
		until = cohort__now_ms() + 100;
		if (until > deadline)
			until = deadline;
		ts.tv_sec = until / 1000;
		ts.tv_nsec = (until % 1000) * 1000000;
		pthread_cond_timedwait(&s->cv, &s->mu, &ts);
	}
	pthread_mutex_unlock(&s->mu);
	return (rv);
}

bool
tt_store_addr(struct tt_store *s, const char *key, char *out, size_t len)
{
	void *val = NULL;
	size_t n = 0;

	if (tt_store_get(s, key, &val, &n, cohort__now_ms() + 10000)
	    != COHORT_OK)
		return (false);
	snprintf(out, len, "%.*s", (int)n, (char *)val);
	free(val);
	return (true);
}

/* ------------------------------------------------------------------------ */
/* A group of rank threads                                                  */
/* ------------------------------------------------------------------------ */

const char *const tt_mode_name[TT_NMODES] = { "shm", "tcp", "mixed" };

void
tt_set_mode(int mode)
{
	setenv("COHORT_TCP_SHM", mode == TT_PURE ? "0" : "1", 1);
	/* Shared memory stages every size; mixed reads the others' buffers
	 * (cross-memory attach) wherever it uses shared memory. */
	setenv("COHORT_TCP_SHM_CMA_MIN", mode == TT_MIXED ? "65536" : "0", 1);
	if (mode == TT_MIXED)
		setenv("COHORT_TCP_SHM_MIN", "65536", 1);
	else
		unsetenv("COHORT_TCP_SHM_MIN");
}

struct tt_arg {
	struct tt_group *g;
	int rank;
};

static struct tt_arg tt_args[2][TT_MAX_RANKS];

void
tt_desc(struct tt_group *g, int r, struct cohort__group_desc *d)
{
	memset(d, 0, sizeof(*d));
	d->job = "tjob";
	d->generation = g->gen;
	d->group_id = g->group_id;
	d->rank = r;
	d->size = g->n;
	d->global_ranks = g->granks;
	d->secret = g->secret;
	d->secret_len = sizeof(g->secret);
	d->bind_addr = NULL;
	d->store = g->st;
	d->abort_flag = &g->abort_flag[r];
}

static void *
tt_thread(void *arg)
{
	struct tt_arg *a = arg;
	struct tt_group *g = a->g;
	int r = a->rank;
	struct cohort__group_desc d;
	void *state = NULL;

	tt_desc(g, r, &d);
	g->init_rv[r] = cohort__host_backend.init(&d, &state, g->init_err[r],
	    TT_ERRLEN, cohort__now_ms() + g->init_ms);
	g->state[r] = state;
	if (g->init_rv[r] == COHORT_OK
	    && ((struct cohort__host *)state)->shm != NULL)
		atomic_fetch_add(&g->shm_ranks, 1);
	if (g->init_rv[r] == COHORT_OK
	    && host_shm_cma(((struct cohort__host *)state)->shm))
		atomic_fetch_add(&g->cma_ranks, 1);
	if (g->init_rv[r] == COHORT_OK && g->body != NULL)
		g->body(g, r, state);
	pthread_barrier_wait(&g->done);
	if (state != NULL)
		cohort__host_backend.fini(state);
	return (NULL);
}

void
tt_group_setup(struct tt_group *g, struct tt_store *s, int n, const char *id,
    tt_body body)
{
	memset(g, 0, sizeof(*g));
	g->n = n;
	snprintf(g->group_id, sizeof(g->group_id), "%s", id);
	g->gen = 7;
	g->store = s;
	g->st.ctx = s;
	g->st.set = tt_store_set;
	g->st.get = tt_store_get;
	g->init_ms = 20000;
	for (int r = 0; r < n; r++) {
		g->granks[r] = 100 + r;
		atomic_init(&g->abort_flag[r], 0);
	}
	memcpy(g->secret, "0123456789abcdef", 16);
	g->body = body;
	g->seed = 12345;
	atomic_init(&g->in_run, 0);
	atomic_init(&g->failures, 0);
	atomic_init(&g->shm_ranks, 0);
	atomic_init(&g->cma_ranks, 0);
}

void
tt_rank_start(struct tt_group *g, int slot, int r)
{
	tt_args[slot][r].g = g;
	tt_args[slot][r].rank = r;
	ck_assert_int_eq(
	    pthread_create(&g->th[r], NULL, tt_thread, &tt_args[slot][r]), 0);
}

void
tt_group_start(struct tt_group *g, int slot)
{
	pthread_barrier_init(&g->done, NULL, (unsigned)g->n);
	for (int r = 0; r < g->n; r++)
		tt_rank_start(g, slot, r);
}

void
tt_group_join(struct tt_group *g)
{
	for (int r = 0; r < g->n; r++)
		pthread_join(g->th[r], NULL);
	pthread_barrier_destroy(&g->done);
	for (int r = 0; r < g->n; r++)
		ck_assert_msg(g->init_rv[r] == COHORT_OK,
		    "rank %d init: %s: %s", r,
		    cohort_status_name(g->init_rv[r]), g->init_err[r]);
}

void
tt_run_group_iters(
    int n, const char *id, tt_body body, int iters, struct tt_group *g)
{
	struct tt_store s;

	tt_store_init(&s);
	tt_group_setup(g, &s, n, id, body);
	g->iters = iters;
	tt_group_start(g, 0);
	tt_group_join(g);
	tt_store_fini(&s);
}

void
tt_run_group(int n, const char *id, tt_body body, struct tt_group *g)
{
	tt_run_group_iters(n, id, body, 0, g);
}

/* ------------------------------------------------------------------------ */
/* Inputs and references                                                    */
/* ------------------------------------------------------------------------ */

static uint64_t
tt_raw(uint64_t seed, int r, size_t i)
{
	return (tw_mix(seed ^ ((uint64_t)r << 48) ^ (uint64_t)i));
}

static double
tt_fval(uint64_t seed, int r, size_t i, cohort_redop op)
{
	uint64_t h = tt_raw(seed, r, i);

	if (op == COHORT_PROD) {
		static const double v[6] = { -2, -1, -0.5, 0.5, 1, 2 };

		return (v[h % 6]);
	}
	return ((double)((int)(h % 25) - 12) / 4.0);
}

/* Fills buf[0..count) with rank r's input, element indices from base. */
static void
tt_fill(void *buf, size_t count, size_t base, cohort_dtype dt, cohort_redop op,
    uint64_t seed, int r)
{
	for (size_t i = 0; i < count; i++)
		cohort__elem_store(buf, i, dt, tt_fval(seed, r, base + i, op),
		    tt_raw(seed, r, base + i));
}

/* Checks got[0..count) against the reduction over all n ranks of input
 * elements base..base+count. Returns the number of mismatches (reports
 * the first few). */
static int
tt_check_reduced(const void *got, size_t count, size_t base, cohort_dtype dt,
    cohort_redop op, uint64_t seed, int n, const char *what)
{
	int bad = 0;

	for (size_t i = 0; i < count; i++) {
		bool ok;
		double want = 0, g = 0;

		if (cohort__dtype_is_float(dt)) {
			want = tt_fval(seed, 0, base + i, op);
			for (int r = 1; r < n; r++)
				want = elem_op_f(
				    want, tt_fval(seed, r, base + i, op), op);
			g = cohort__elem_loadf(got, i, dt);
			if (op == COHORT_MEAN) {
				double rel = dt == COHORT_F16 ? 1.0 / 1024
				    : dt == COHORT_BF16       ? 1.0 / 128
				    : dt == COHORT_F32        ? 2.4e-7
				                              : 4.5e-16;

				want /= n;
				ok = fabs(g - want) <= fabs(want) * rel;
			} else {
				ok = g == want;
			}
		} else {
			uint64_t w = tt_raw(seed, 0, base + i) & elem_mask(dt);
			uint64_t gv = elem_bits(got, i, dt);

			for (int r = 1; r < n; r++)
				w = elem_op_i(w,
				    tt_raw(seed, r, base + i) & elem_mask(dt),
				    dt, op);
			ok = gv == w;
			g = (double)gv;
			want = (double)w;
		}
		if (!ok) {
			if (bad < 5)
				fprintf(stderr,
				    "%s: %s %s n=%d elem %zu: got "
				    "%.9g want %.9g\n",
				    what, cohort_dtype_name(dt),
				    cohort_redop_name(op), n, i, g, want);
			bad++;
		}
	}
	return (bad);
}

static uint64_t
tt_hash_bytes(uint64_t h, const void *p, size_t len)
{
	const uint8_t *b = p;

	for (size_t i = 0; i < len; i++)
		h = (h ^ b[i]) * 0x100000001b3u;
	return (h);
}

/* ------------------------------------------------------------------------ */
/* Running one collective on one rank                                       */
/* ------------------------------------------------------------------------ */

static void tt_fail(struct tt_group *g, int rank, const char *fmt, ...)
    __attribute__((format(printf, 3, 4)));

static void
tt_fail(struct tt_group *g, int rank, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	fprintf(stderr, "rank %d: ", rank);
	vfprintf(stderr, fmt, ap);
	fprintf(stderr, "\n");
	va_end(ap);
	atomic_fetch_add(&g->failures, 1);
}

/* Runs spec on rank r and checks its output. */
void
tt_one(struct tt_group *g, int r, void *state, const struct tt_spec *sp,
    uint64_t seq)
{
	int n = g->n;
	size_t es = cohort_dtype_size(sp->dt);
	size_t cnt = sp->count, blk = cnt * es;
	size_t counts[TT_MAX_RANKS], total = 0, myoff = 0;
	struct cohort__op op;
	uint8_t *send = NULL, *recv = NULL, *want = NULL;
	char err[TT_ERRLEN] = "";
	char what[160];
	cohort_status rv;
	int bad = 0;

	memset(&op, 0, sizeof(op));
	op.kind = sp->kind;
	op.dtype = sp->dt;
	op.op = sp->op;
	op.count = cnt;
	op.root = sp->root;
	op.seq = seq;
	snprintf(what, sizeof(what), "%s #%" PRIu64 " count %zu%s root %d",
	    cohort__op_name(sp->kind), seq, cnt,
	    sp->inplace ? " in place" : "", sp->root);

	/* One allocation pattern per kind; +64 guard bytes. */
	switch (sp->kind) {
	case COHORT__OP_ALLREDUCE:
	case COHORT__OP_REDUCE:
		send = malloc(blk + 64);
		tt_fill(send, cnt, 0, sp->dt, sp->op, sp->seed, r);
		recv = sp->inplace ? send : malloc(blk + 64);
		break;
	case COHORT__OP_BROADCAST:
		recv = malloc(blk + 64);
		want = malloc(blk + 64);
		tt_fill(want, cnt, 0, sp->dt, sp->op, sp->seed, sp->root);
		if (r == sp->root)
			memcpy(recv, want, blk);
		else
			memset(recv, 0xee, blk);
		break;
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_GATHER:
		recv = malloc((size_t)n * blk + 64);
		want = malloc((size_t)n * blk + 64);
		for (int p = 0; p < n; p++)
			tt_fill(want + (size_t)p * blk, cnt, 0, sp->dt, sp->op,
			    sp->seed, p);
		if (sp->inplace) {
			send = recv + (size_t)r * blk;
		} else {
			send = malloc(blk + 64);
		}
		memcpy(send, want + (size_t)r * blk, blk);
		break;
	case COHORT__OP_ALLGATHERV:
		for (int p = 0; p < n; p++) {
			uint64_t h = tw_mix(sp->seed + (uint64_t)p);

			counts[p] = h % 4 == 0 ? 0 : h % (cnt + 1);
			if (p == r)
				myoff = total;
			total += counts[p];
		}
		op.counts = counts;
		recv = malloc(total * es + 64);
		want = malloc(total * es + 64);
		{
			size_t off = 0;

			for (int p = 0; p < n; p++) {
				tt_fill(want + off * es, counts[p], 0, sp->dt,
				    sp->op, sp->seed, p);
				off += counts[p];
			}
		}
		send = sp->inplace ? recv + myoff * es
		                   : malloc(counts[r] * es + 64);
		memcpy(send, want + myoff * es, counts[r] * es);
		break;
	case COHORT__OP_REDUCE_SCATTER:
		send = malloc((size_t)n * blk + 64);
		tt_fill(send, (size_t)n * cnt, 0, sp->dt, sp->op, sp->seed, r);
		recv = sp->inplace ? send + (size_t)r * blk : malloc(blk + 64);
		break;
	case COHORT__OP_ALLTOALL:
		send = malloc((size_t)n * blk + 64);
		recv = malloc((size_t)n * blk + 64);
		want = malloc((size_t)n * blk + 64);
		tt_fill(send, (size_t)n * cnt, 0, sp->dt, sp->op, sp->seed, r);
		for (int p = 0; p < n; p++)
			tt_fill(want + (size_t)p * blk, cnt, (size_t)r * cnt,
			    sp->dt, sp->op, sp->seed, p);
		break;
	case COHORT__OP_SCATTER:
		send = malloc((size_t)n * blk + 64);
		want = malloc(blk + 64);
		tt_fill(send, (size_t)n * cnt, 0, sp->dt, sp->op, sp->seed,
		    sp->root);
		tt_fill(want, cnt, (size_t)r * cnt, sp->dt, sp->op, sp->seed,
		    sp->root);
		recv = sp->inplace && r == sp->root ? send + (size_t)r * blk
		                                    : malloc(blk + 64);
		break;
	case COHORT__OP_BARRIER:
	default:
		break;
	}
	op.send = send;
	op.recv = recv;
	if (sp->kind == COHORT__OP_REDUCE && r != sp->root && !sp->inplace) {
		free(recv);
		recv = NULL;
		op.recv = NULL;
	}
	if (sp->kind == COHORT__OP_GATHER && r != sp->root && !sp->inplace) {
		op.recv = NULL;
	}

	rv = cohort__host_backend.run(
	    state, &op, err, sizeof(err), cohort__now_ms() + 30000);
	if (rv != COHORT_OK) {
		tt_fail(g, r, "%s: %s: %s", what, cohort_status_name(rv), err);
		goto out;
	}
	switch (sp->kind) {
	case COHORT__OP_ALLREDUCE:
		bad = tt_check_reduced(
		    recv, cnt, 0, sp->dt, sp->op, sp->seed, n, what);
		g->hash[r] = tt_hash_bytes(g->hash[r] * 31 + seq, recv, blk);
		break;
	case COHORT__OP_REDUCE:
		if (r == sp->root)
			bad = tt_check_reduced(
			    recv, cnt, 0, sp->dt, sp->op, sp->seed, n, what);
		break;
	case COHORT__OP_BROADCAST:
		bad = memcmp(recv, want, blk) != 0;
		break;
	case COHORT__OP_ALLGATHER:
		bad = memcmp(recv, want, (size_t)n * blk) != 0;
		break;
	case COHORT__OP_GATHER:
		if (r == sp->root)
			bad = memcmp(recv, want, (size_t)n * blk) != 0;
		break;
	case COHORT__OP_ALLGATHERV:
		bad = memcmp(recv, want, total * es) != 0;
		break;
	case COHORT__OP_REDUCE_SCATTER:
		bad = tt_check_reduced(recv, cnt, (size_t)r * cnt, sp->dt,
		    sp->op, sp->seed, n, what);
		break;
	case COHORT__OP_ALLTOALL:
		bad = memcmp(recv, want, (size_t)n * blk) != 0;
		break;
	case COHORT__OP_SCATTER:
		bad = memcmp(recv, want, blk) != 0;
		break;
	default:
		break;
	}
	if (bad)
		tt_fail(g, r, "%s %s %s: %d wrong elements", what,
		    cohort_dtype_name(sp->dt), cohort_redop_name(sp->op), bad);
out:
	/* Free what was allocated, minding the in-place aliases. */
	switch (sp->kind) {
	case COHORT__OP_ALLREDUCE:
	case COHORT__OP_REDUCE:
		if (recv != send)
			free(recv);
		free(send);
		break;
	case COHORT__OP_ALLGATHER:
	case COHORT__OP_GATHER:
	case COHORT__OP_ALLGATHERV:
		if (!sp->inplace)
			free(send);
		free(recv);
		break;
	case COHORT__OP_REDUCE_SCATTER:
		if (!sp->inplace)
			free(recv);
		free(send);
		break;
	case COHORT__OP_SCATTER:
		if (!(sp->inplace && r == sp->root))
			free(recv);
		free(send);
		break;
	default:
		free(send);
		free(recv);
		break;
	}
	free(want);
}

void
tt_body_one_allreduce(struct tt_group *g, int r, void *state)
{
	struct tt_spec sp = { COHORT__OP_ALLREDUCE, COHORT_F32, COHORT_SUM,
		false, 100003, 0, 5 };

	tt_one(g, r, state, &sp, 1);
}

bool
tt_in_run_ge(void *arg)
{
	struct tt_group *g = arg;

	return (atomic_load(&g->in_run) >= g->iters);
}

/* ------------------------------------------------------------------------ */
/* Two ranks in two processes                                               */
/* ------------------------------------------------------------------------ */

void
tt_fork_start(
    struct tt_fork *f, int32_t grank0, int (*rank1)(struct tt_fork *f))
{
	memset(f, 0, sizeof(*f));
	f->granks[0] = grank0;
	f->granks[1] = grank0 + 1;
	ck_assert(fs_store_open(&f->fs, "cohort-tcp"));
	f->pid = fork();
	ck_assert(f->pid >= 0);
	if (f->pid == 0)
		_exit(rank1(f));
}

cohort_status
tt_fork_init(struct tt_fork *f, int r)
{
	struct cohort__group_desc d;

	fs_store_desc(&d, &f->fs, "forkjob", "fork", r, 2, f->granks);
	return (cohort__host_backend.init(
	    &d, &f->state, f->err, sizeof(f->err), cohort__now_ms() + 10000));
}

cohort_status
tt_fork_run(struct tt_fork *f, struct cohort__op *op, uint64_t seq)
{
	op->seq = seq;
	return (cohort__host_backend.run(
	    f->state, op, f->err, sizeof(f->err), cohort__now_ms() + 10000));
}

void
tt_fork_init0(struct tt_fork *f)
{
	cohort_status rv = tt_fork_init(f, 0);

	if (rv != COHORT_OK) {
		int status;

		kill(f->pid, SIGKILL);
		waitpid(f->pid, &status, 0);
		ck_abort_msg("init: %s: %s", cohort_status_name(rv), f->err);
	}
}

int
tt_fork_end(struct tt_fork *f)
{
	int status = 0;

	cohort__host_backend.fini(f->state);
	waitpid(f->pid, &status, 0);
	(void)fs_store_close(&f->fs);
	return (status);
}
