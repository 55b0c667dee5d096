/*
 * ddp.c - bucketed, overlapped gradient all-reduce (see ddp.h).
 *
 * Only libcohort's public API is used. A bucket is a run of parameters in
 * gradient-ready order; its reduction starts (through the comm hook) as
 * soon as all its parameters are ready and every earlier bucket started,
 * so all ranks issue the buckets' collectives in the same order whatever
 * the order inside a bucket. When the bucket's gradients are contiguous
 * in memory the hook reduces them in place (gradient_as_bucket_view);
 * otherwise they are packed into a bucket buffer at ready time and
 * unpacked after the reduction.
 */
#include <errno.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "ddp.h"

struct ddp_bucket {
	cohort_ddp_bucket pub;
	int *params; /* buffer order */
	size_t *offs; /* offset of params[j] in the buffer */
	size_t nready;
	bool view; /* pub.buffer points into the gradients */
	float *own; /* the packed buffer when !view */
	void *scratch; /* count * 4 bytes */
	cohort_work *work;
	bool started;
	bool early; /* started before cohort_ddp_sync */
	uint64_t fill_ns; /* timeline: its first gradient became ready */
};

struct cohort_ddp {
	cohort_client *c;
	cohort_group *g; /* NULL: single process */
	int32_t rank, world;
	cohort_ddp_options o;
	cohort_ddp_hook hook;
	cohort_ddp_param *params;
	size_t nparams;
	int *pbucket; /* bucket of parameter i */
	int *pslot; /* index of i in its bucket's params */
	bool *pready;
	struct ddp_bucket *b;
	int nb;
	int next; /* next bucket to start */
	bool no_sync;
	bool in_sync;
	cohort_status err; /* of the current round */
	char errtext[640];
	uint64_t steps;
	cohort_ddp_stats st;
	bool timeline; /* cohort_timeline_enabled: record fills and hooks */
};

static double
ddp_now(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((double)ts.tv_sec + (double)ts.tv_nsec * 1e-9);
}

/* Records the first error of a round with a detail text. */
static cohort_status
ddp_fail(cohort_ddp *d, cohort_status st, const char *fmt, ...)
{
	char what[256];
	const char *detail = "";
	va_list ap;

	if (d->err != COHORT_OK)
		return (st);
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	if (d->g != NULL)
		detail = cohort_group_last_error(d->g);
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_last_error();
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_strerror(st);
	snprintf(d->errtext, sizeof(d->errtext), "ddp: %s: %s: %s", what,
	    cohort_status_name(st), detail);
	d->err = st;
	return (st);
}

/* ------------------------------------------------------------------------ */
/* 16-bit conversions                                                       */
/* ------------------------------------------------------------------------ */

uint16_t
cohort_ddp_f32_to_f16(float f)
{
	uint32_t x, ax, sign, h, rem;

	memcpy(&x, &f, sizeof(x));
	sign = (x >> 16) & 0x8000u;
	ax = x & 0x7fffffffu;
	if (ax >= 0x7f800000u) /* inf, nan (kept quiet) */
		return ((uint16_t)(sign | 0x7c00u
		    | (ax > 0x7f800000u ? 0x200u | ((ax >> 13) & 0x3ffu)
		                        : 0)));
	if (ax >= 0x477ff000u) /* >= 65520 rounds to infinity */
		return ((uint16_t)(sign | 0x7c00u));
	if (ax < 0x38800000u) { /* below 2^-14: subnormal or zero */
		uint32_t e = ax >> 23, m, shift, half;

		if (ax <= 0x33000000u) /* <= 2^-25: ties to even zero */
			return ((uint16_t)sign);
		m = (ax & 0x7fffffu) | 0x800000u;
		shift = 126u - e;
		h = m >> shift;
		rem = m & ((1u << shift) - 1u);
		half = 1u << (shift - 1u);
		if (rem > half || (rem == half && (h & 1u)))
			h++;
		return ((uint16_t)(sign | h));
	}
	h = (ax >> 13) - (112u << 10);
	rem = ax & 0x1fffu;
	if (rem > 0x1000u || (rem == 0x1000u && (h & 1u)))
		h++;
	return ((uint16_t)(sign | h));
}

float
cohort_ddp_f16_to_f32(uint16_t h)
{
	uint32_t sign = ((uint32_t)h & 0x8000u) << 16;
	uint32_t e = ((uint32_t)h >> 10) & 0x1fu, m = h & 0x3ffu, x;
	float f;

	if (e == 0) {
		f = (float)m * 0x1p-24f;
		return (sign ? -f : f);
	}
	if (e == 31)
		x = sign | 0x7f800000u | (m << 13);
	else
		x = sign | ((e + 112u) << 23) | (m << 13);
	memcpy(&f, &x, sizeof(f));
	return (f);
}

uint16_t
cohort_ddp_f32_to_bf16(float f)
{
	uint32_t x;

	memcpy(&x, &f, sizeof(x));
	if ((x & 0x7fffffffu) > 0x7f800000u) /* nan: keep it quiet */
		return ((uint16_t)((x >> 16) | 0x40u));
	x += 0x7fffu + ((x >> 16) & 1u);
	return ((uint16_t)(x >> 16));
}

float
cohort_ddp_bf16_to_f32(uint16_t h)
{
	uint32_t x = (uint32_t)h << 16;
	float f;

	memcpy(&f, &x, sizeof(f));
	return (f);
}

/* ------------------------------------------------------------------------ */
/* Built-in hooks                                                           */
/* ------------------------------------------------------------------------ */

static cohort_status
ddp_hook_allreduce_start(void *state, cohort_ddp_bucket *b, cohort_work **work)
{
	(void)state;
	*work = NULL;
	if (b->group == NULL || b->world_size <= 1)
		return (COHORT_OK);
	return (cohort_iallreduce(b->group, b->buffer, b->buffer, b->count,
	    COHORT_F32, COHORT_MEAN, NULL, work));
}

/* fp16/bf16 compression like torch's fp16_compress_hook: divide by the
 * group size first (so the 16-bit sum does not overflow), cast, sum in 16
 * bits, cast back. */
static cohort_status
ddp_hook_half_start(cohort_ddp_bucket *b, cohort_work **work, bool bf16)
{
	uint16_t *h = b->scratch;
	float inv = 1.0f / (float)(b->world_size > 0 ? b->world_size : 1);

	*work = NULL;
	for (size_t i = 0; i < b->count; i++)
		h[i] = bf16 ? cohort_ddp_f32_to_bf16(b->buffer[i] * inv)
		            : cohort_ddp_f32_to_f16(b->buffer[i] * inv);
	if (b->group == NULL || b->world_size <= 1)
		return (COHORT_OK);
	return (cohort_iallreduce(b->group, h, h, b->count,
	    bf16 ? COHORT_BF16 : COHORT_F16, COHORT_SUM, NULL, work));
}

static cohort_status
ddp_hook_fp16_start(void *state, cohort_ddp_bucket *b, cohort_work **work)
{
	(void)state;
	return (ddp_hook_half_start(b, work, false));
}

static cohort_status
ddp_hook_bf16_start(void *state, cohort_ddp_bucket *b, cohort_work **work)
{
	(void)state;
	return (ddp_hook_half_start(b, work, true));
}

static cohort_status
ddp_hook_half_finish(cohort_ddp_bucket *b, bool bf16)
{
	const uint16_t *h = b->scratch;

	for (size_t i = 0; i < b->count; i++)
		b->buffer[i] = bf16 ? cohort_ddp_bf16_to_f32(h[i])
		                    : cohort_ddp_f16_to_f32(h[i]);
	return (COHORT_OK);
}

static cohort_status
ddp_hook_fp16_finish(void *state, cohort_ddp_bucket *b)
{
	(void)state;
	return (ddp_hook_half_finish(b, false));
}

static cohort_status
ddp_hook_bf16_finish(void *state, cohort_ddp_bucket *b)
{
	(void)state;
	return (ddp_hook_half_finish(b, true));
}

static const cohort_ddp_hook ddp_hook_allreduce
    = { "allreduce", ddp_hook_allreduce_start, NULL, NULL };
static const cohort_ddp_hook ddp_hook_fp16
    = { "fp16", ddp_hook_fp16_start, ddp_hook_fp16_finish, NULL };
static const cohort_ddp_hook ddp_hook_bf16
    = { "bf16", ddp_hook_bf16_start, ddp_hook_bf16_finish, NULL };

const cohort_ddp_hook *
cohort_ddp_hook_by_name(const char *name)
{
	if (name == NULL || strcmp(name, "allreduce") == 0
	    || strcmp(name, "none") == 0 || strcmp(name, "") == 0)
		return (&ddp_hook_allreduce);
	if (strcmp(name, "fp16") == 0)
		return (&ddp_hook_fp16);
	if (strcmp(name, "bf16") == 0)
		return (&ddp_hook_bf16);
	return (NULL);
}

/* ------------------------------------------------------------------------ */
/* Setup                                                                    */
/* ------------------------------------------------------------------------ */

void
cohort_ddp_options_init(cohort_ddp_options *o)
{
	*o = (cohort_ddp_options) {
		.bucket_cap_bytes = COHORT_DDP_DEFAULT_BUCKET_CAP,
		.first_bucket_cap_bytes = COHORT_DDP_DEFAULT_FIRST_BUCKET_CAP,
		.hook = NULL,
		.overlap = true,
		.broadcast_params = true,
		.gradient_as_bucket_view = true,
		.model_averaging_period = 0,
		.model_averaging_warmup = 0,
		.ready_order = NULL,
		.timeout = COHORT_WAIT_DEFAULT,
	};
}

static int
ddp_cmp_grad(const void *a, const void *b, void *arg)
{
	const cohort_ddp_param *p = arg;
	const float *x = p[*(const int *)a].grad;
	const float *y = p[*(const int *)b].grad;

	return (x < y ? -1 : x > y);
}

/* Lays a bucket out: in place when its gradients are one contiguous
 * range (in any order), else in its own buffer in ready order. */
static cohort_status
ddp_bucket_layout(cohort_ddp *d, struct ddp_bucket *bk)
{
	size_t n = bk->pub.nparams, off = 0;
	bool contiguous = d->o.gradient_as_bucket_view;

	if (contiguous) {
		int *sorted = malloc(n * sizeof(int));

		if (sorted == NULL)
			return (COHORT_ENOMEM);
		memcpy(sorted, bk->params, n * sizeof(int));
		qsort_r(sorted, n, sizeof(int), ddp_cmp_grad, d->params);
		for (size_t j = 0; j + 1 < n; j++) {
			const cohort_ddp_param *p = &d->params[sorted[j]];

			const float *nx = d->params[sorted[j + 1]].grad;

			if (p->grad + p->count != nx)
				contiguous = false;
		}
		if (contiguous)
			memcpy(bk->params, sorted, n * sizeof(int));
		free(sorted);
	}
	for (size_t j = 0; j < n; j++) {
		bk->offs[j] = off;
		d->pslot[bk->params[j]] = (int)j;
		off += d->params[bk->params[j]].count;
	}
	bk->pub.count = off;
	bk->view = contiguous;
	if (contiguous) {
		bk->pub.buffer = d->params[bk->params[0]].grad;
	} else {
		if ((bk->own = calloc(off ? off : 1, sizeof(float))) == NULL)
			return (COHORT_ENOMEM);
		bk->pub.buffer = bk->own;
	}
	if ((bk->scratch = calloc(off ? off : 1, sizeof(float))) == NULL)
		return (COHORT_ENOMEM);
	bk->pub.scratch = bk->scratch;
	bk->pub.params = bk->params;
	return (COHORT_OK);
}

static cohort_status
ddp_build_buckets(cohort_ddp *d)
{
	const size_t n = d->nparams;
	int *order;
	size_t used = 0;
	cohort_status st = COHORT_OK;

	if ((order = malloc(n * sizeof(int))) == NULL)
		return (COHORT_ENOMEM);
	if (d->o.ready_order != NULL) {
		bool *seen = calloc(n, sizeof(bool));

		if (seen == NULL) {
			free(order);
			return (COHORT_ENOMEM);
		}
		for (size_t i = 0; i < n; i++) {
			int p = d->o.ready_order[i];

			if (p < 0 || (size_t)p >= n || seen[p]) {
				free(seen);
				free(order);
				return (COHORT_EINVAL);
			}
			seen[p] = true;
			order[i] = p;
		}
		free(seen);
	} else {
		for (size_t i = 0; i < n; i++)
			order[i] = (int)(n - 1 - i);
	}

	/* At most n buckets. */
	d->b = calloc(n, sizeof(*d->b));
	if (d->b == NULL) {
		free(order);
		return (COHORT_ENOMEM);
	}
	d->nb = 0;
	for (size_t i = 0; i < n;) {
		struct ddp_bucket *bk = &d->b[d->nb];
		size_t cap = d->nb == 0 ? d->o.first_bucket_cap_bytes
		                        : d->o.bucket_cap_bytes;
		size_t bytes = 0, j = i;

		while (j < n) {
			size_t pb = d->params[order[j]].count * sizeof(float);

			if (j > i && bytes + pb > cap)
				break;
			bytes += pb;
			j++;
		}
		bk->pub.index = d->nb;
		bk->pub.nparams = j - i;
		bk->params = malloc((j - i) * sizeof(int));
		bk->offs = malloc((j - i) * sizeof(size_t));
		if (bk->params == NULL || bk->offs == NULL) {
			st = COHORT_ENOMEM;
			break;
		}
		memcpy(bk->params, order + i, (j - i) * sizeof(int));
		for (size_t k = i; k < j; k++)
			d->pbucket[order[k]] = d->nb;
		d->nb++;
		if ((st = ddp_bucket_layout(d, bk)) != COHORT_OK)
			break;
		used += j - i;
		i = j;
	}
	free(order);
	for (int k = 0; k < d->nb; k++) {
		d->b[k].pub.nbuckets = d->nb;
		d->b[k].pub.is_last = k == d->nb - 1;
		d->b[k].pub.group = d->g;
		d->b[k].pub.world_size = d->world;
		if (k < 64) {
			d->st.bucket_count[k] = d->b[k].pub.count;
			d->st.bucket_view[k] = d->b[k].view;
		}
	}
	d->st.nbuckets = d->nb;
	(void)used;
	return (st);
}

cohort_status
cohort_ddp_new(cohort_client *c, cohort_group *g,
    const cohort_ddp_param *params, size_t nparams,
    const cohort_ddp_options *opts, cohort_ddp **out)
{
	cohort_ddp *d;
	cohort_status st;

	if (out == NULL || params == NULL || nparams == 0
	    || nparams > (size_t)1 << 30)
		return (COHORT_EINVAL);
	for (size_t i = 0; i < nparams; i++)
		if (params[i].data == NULL || params[i].grad == NULL)
			return (COHORT_EINVAL);
	if ((d = calloc(1, sizeof(*d))) == NULL)
		return (COHORT_ENOMEM);
	if (opts != NULL)
		d->o = *opts;
	else
		cohort_ddp_options_init(&d->o);
	if (d->o.bucket_cap_bytes == 0)
		d->o.bucket_cap_bytes = COHORT_DDP_DEFAULT_BUCKET_CAP;
	if (d->o.first_bucket_cap_bytes == 0)
		d->o.first_bucket_cap_bytes = d->o.bucket_cap_bytes;
	if (d->o.model_averaging_period < 0
	    || d->o.model_averaging_warmup < 0) {
		free(d);
		return (COHORT_EINVAL);
	}
	d->hook = d->o.hook != NULL ? *d->o.hook : ddp_hook_allreduce;
	d->timeline = cohort_timeline_enabled(c);
	if (d->hook.start == NULL) {
		free(d);
		return (COHORT_EINVAL);
	}
	d->c = c;
	d->g = g != NULL ? g : (c != NULL ? cohort_client_world(c) : NULL);
	d->rank = d->g != NULL ? cohort_group_rank(d->g) : 0;
	d->world = d->g != NULL ? cohort_group_size(d->g) : 1;
	d->nparams = nparams;
	d->params = malloc(nparams * sizeof(*d->params));
	d->pbucket = calloc(nparams, sizeof(int));
	d->pslot = calloc(nparams, sizeof(int));
	d->pready = calloc(nparams, sizeof(bool));
	if (d->params == NULL || d->pbucket == NULL || d->pslot == NULL
	    || d->pready == NULL) {
		cohort_ddp_free(d);
		return (COHORT_ENOMEM);
	}
	memcpy(d->params, params, nparams * sizeof(*params));
	if ((st = ddp_build_buckets(d)) != COHORT_OK) {
		cohort_ddp_free(d);
		return (st);
	}
	if (d->o.broadcast_params
	    && (st = cohort_ddp_broadcast_params(d, 0)) != COHORT_OK) {
		cohort_ddp_free(d);
		return (st);
	}
	*out = d;
	return (COHORT_OK);
}

void
cohort_ddp_free(cohort_ddp *d)
{
	if (d == NULL)
		return;
	for (int k = 0; d->b != NULL && k < d->nb; k++) {
		cohort_work_free(d->b[k].work);
		free(d->b[k].params);
		free(d->b[k].offs);
		free(d->b[k].own);
		free(d->b[k].scratch);
	}
	free(d->b);
	free(d->params);
	free(d->pbucket);
	free(d->pslot);
	free(d->pready);
	free(d);
}

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation                                                 */
/* ------------------------------------------------------------------------ */

/* Post-local SGD after the warmup: gradients stay local. */
static bool
ddp_local_phase(const cohort_ddp *d)
{
	return (d->o.model_averaging_period > 0
	    && d->steps >= (uint64_t)d->o.model_averaging_warmup);
}

static void
ddp_pack(cohort_ddp *d, struct ddp_bucket *bk, int slot)
{
	const cohort_ddp_param *p = &d->params[bk->params[slot]];

	if (!bk->view)
		memcpy(bk->own + bk->offs[slot], p->grad,
		    p->count * sizeof(float));
}

static void
ddp_start(cohort_ddp *d, struct ddp_bucket *bk)
{
	cohort_status st;
	uint64_t t0 = 0;

	bk->started = true;
	bk->early = !d->in_sync;
	if (d->err != COHORT_OK)
		return; /* never issue a collective after a failed one */
	if (d->timeline)
		t0 = cohort_now_ns();
	st = d->hook.start(d->hook.state, &bk->pub, &bk->work);
	if (d->timeline) {
		char name[40];

		snprintf(name, sizeof(name), "fill bucket %d", bk->pub.index);
		cohort_timeline_span(d->c, name,
		    bk->fill_ns ? bk->fill_ns : t0, t0,
		    bk->pub.count * sizeof(float));
		snprintf(name, sizeof(name), "%s hook bucket %d",
		    d->hook.name ? d->hook.name : "custom", bk->pub.index);
		cohort_timeline_span(d->c, name, t0, cohort_now_ns(),
		    bk->pub.count * sizeof(float));
		bk->fill_ns = 0;
	}
	if (st != COHORT_OK) {
		bk->work = NULL;
		ddp_fail(d, st, "bucket %d (%zu elements): %s hook",
		    bk->pub.index, bk->pub.count,
		    d->hook.name ? d->hook.name : "custom");
	}
}

void
cohort_ddp_grad_ready(cohort_ddp *d, int i)
{
	struct ddp_bucket *bk;

	if (d == NULL || i < 0 || (size_t)i >= d->nparams)
		return;
	if (d->no_sync || ddp_local_phase(d) || d->pready[i])
		return;
	d->pready[i] = true;
	bk = &d->b[d->pbucket[i]];
	if (d->timeline && bk->nready == 0)
		bk->fill_ns = cohort_now_ns();
	ddp_pack(d, bk, d->pslot[i]);
	bk->nready++;
	if (!d->o.overlap)
		return;
	while (d->next < d->nb
	    && d->b[d->next].nready == d->b[d->next].pub.nparams)
		ddp_start(d, &d->b[d->next++]);
}

static void
ddp_round_reset(cohort_ddp *d)
{
	memset(d->pready, 0, d->nparams * sizeof(bool));
	for (int k = 0; k < d->nb; k++) {
		d->b[k].nready = 0;
		d->b[k].started = false;
		d->b[k].early = false;
		d->b[k].work = NULL;
	}
	d->next = 0;
}

cohort_status
cohort_ddp_sync(cohort_ddp *d)
{
	cohort_status st = COHORT_OK;
	double t0;
	uint64_t tsync;

	if (d == NULL)
		return (COHORT_EINVAL);
	if (d->no_sync || ddp_local_phase(d)) {
		ddp_round_reset(d);
		return (COHORT_OK);
	}
	t0 = ddp_now();
	tsync = d->timeline ? cohort_now_ns() : 0;
	d->in_sync = true;
	/* Buckets whose parameters never became ready (unused parameters,
	 * or overlap off): pack what their gradients hold and start. */
	while (d->next < d->nb) {
		struct ddp_bucket *bk = &d->b[d->next++];

		for (size_t j = 0; j < bk->pub.nparams; j++) {
			if (!d->pready[bk->params[j]]) {
				d->pready[bk->params[j]] = true;
				ddp_pack(d, bk, (int)j);
			}
		}
		ddp_start(d, bk);
	}
	d->in_sync = false;
	for (int k = 0; k < d->nb; k++) {
		struct ddp_bucket *bk = &d->b[k];
		cohort_status ws = COHORT_OK;

		if (bk->work != NULL) {
			ws = cohort_work_wait(bk->work, d->o.timeout);
			if (ws != COHORT_OK)
				ddp_fail(d, ws, "bucket %d: all-reduce", k);
			cohort_work_free(bk->work);
			bk->work = NULL;
		}
		if (d->err != COHORT_OK)
			continue;
		if (d->hook.finish != NULL
		    && (ws = d->hook.finish(d->hook.state, &bk->pub))
		        != COHORT_OK) {
			ddp_fail(d, ws, "bucket %d: %s hook finish", k,
			    d->hook.name ? d->hook.name : "custom");
			continue;
		}
		if (!bk->view) {
			for (size_t j = 0; j < bk->pub.nparams; j++) {
				const cohort_ddp_param *p
				    = &d->params[bk->params[j]];

				memcpy(p->grad, bk->own + bk->offs[j],
				    p->count * sizeof(float));
			}
		}
		d->st.buckets_started++;
		d->st.buckets_overlapped += bk->early;
		d->st.bytes += bk->pub.count * sizeof(float);
	}
	st = d->err;
	d->err = COHORT_OK; /* the group's own error stays sticky */
	ddp_round_reset(d);
	d->st.synced++;
	d->st.wait_seconds += ddp_now() - t0;
	if (d->timeline)
		cohort_timeline_span(
		    d->c, "ddp sync", tsync, cohort_now_ns(), 0);
	return (st);
}

void
cohort_ddp_no_sync_begin(cohort_ddp *d)
{
	if (d != NULL)
		d->no_sync = true;
}

void
cohort_ddp_no_sync_end(cohort_ddp *d)
{
	if (d != NULL)
		d->no_sync = false;
}

bool
cohort_ddp_in_no_sync(const cohort_ddp *d)
{
	return (d != NULL && d->no_sync);
}

/* ------------------------------------------------------------------------ */
/* Parameters                                                               */
/* ------------------------------------------------------------------------ */

cohort_status
cohort_ddp_broadcast_params(cohort_ddp *d, int32_t root)
{
	if (d == NULL)
		return (COHORT_EINVAL);
	if (d->g == NULL || d->world <= 1)
		return (COHORT_OK);
	for (size_t i = 0; i < d->nparams; i++) {
		cohort_status st = cohort_broadcast(d->g, d->params[i].data,
		    d->params[i].count, COHORT_F32, root, NULL, d->o.timeout);

		if (st != COHORT_OK) {
			d->err = COHORT_OK;
			ddp_fail(d, st, "broadcast of parameter %zu (%s)", i,
			    d->params[i].name ? d->params[i].name : "?");
			d->err = COHORT_OK;
			return (st);
		}
	}
	return (COHORT_OK);
}

cohort_status
cohort_ddp_average_params(cohort_ddp *d)
{
	cohort_status st = COHORT_OK;
	double t0 = ddp_now();

	if (d == NULL)
		return (COHORT_EINVAL);
	if (d->g == NULL || d->world <= 1)
		return (COHORT_OK);
	/* Bucket by bucket through the scratch buffers, all started before
	 * the first wait. */
	for (int k = 0; k < d->nb && st == COHORT_OK; k++) {
		struct ddp_bucket *bk = &d->b[k];
		float *s = bk->scratch;

		for (size_t j = 0; j < bk->pub.nparams; j++) {
			const cohort_ddp_param *p = &d->params[bk->params[j]];

			memcpy(s + bk->offs[j], p->data,
			    p->count * sizeof(float));
		}
		st = cohort_iallreduce(d->g, s, s, bk->pub.count, COHORT_F32,
		    COHORT_MEAN, NULL, &bk->work);
		if (st != COHORT_OK) {
			bk->work = NULL;
			ddp_fail(d, st, "parameter averaging, bucket %d", k);
		}
	}
	for (int k = 0; k < d->nb; k++) {
		struct ddp_bucket *bk = &d->b[k];
		cohort_status ws;

		if (bk->work == NULL)
			continue;
		ws = cohort_work_wait(bk->work, d->o.timeout);
		cohort_work_free(bk->work);
		bk->work = NULL;
		if (ws != COHORT_OK) {
			ddp_fail(d, ws, "parameter averaging, bucket %d", k);
			if (st == COHORT_OK)
				st = ws;
		}
	}
	if (st == COHORT_OK) {
		for (int k = 0; k < d->nb; k++) {
			struct ddp_bucket *bk = &d->b[k];
			const float *s = bk->scratch;

			for (size_t j = 0; j < bk->pub.nparams; j++) {
				const cohort_ddp_param *p
				    = &d->params[bk->params[j]];

				memcpy(p->data, s + bk->offs[j],
				    p->count * sizeof(float));
			}
		}
	}
	d->err = COHORT_OK;
	d->st.averaging_seconds += ddp_now() - t0;
	return (st);
}

cohort_status
cohort_ddp_after_step(cohort_ddp *d)
{
	uint64_t step, warm;
	cohort_status st = COHORT_OK;

	if (d == NULL)
		return (COHORT_EINVAL);
	step = d->steps;
	warm = (uint64_t)d->o.model_averaging_warmup;
	if (d->o.model_averaging_period > 0 && step >= warm
	    && (step - warm) % (uint64_t)d->o.model_averaging_period == 0)
		st = cohort_ddp_average_params(d);
	d->steps++;
	d->st.steps++;
	return (st);
}

/* ------------------------------------------------------------------------ */
/* Helpers                                                                  */
/* ------------------------------------------------------------------------ */

int32_t
cohort_ddp_rank(const cohort_ddp *d)
{
	return (d != NULL ? d->rank : 0);
}

int32_t
cohort_ddp_world_size(const cohort_ddp *d)
{
	return (d != NULL ? d->world : 1);
}

bool
cohort_ddp_is_global_zero(const cohort_ddp *d)
{
	if (d != NULL && d->c != NULL)
		return (cohort_client_is_global_zero(d->c));
	return (d == NULL || d->rank == 0);
}

cohort_group *
cohort_ddp_group(const cohort_ddp *d)
{
	return (d != NULL ? d->g : NULL);
}

static cohort_status
ddp_helper(cohort_ddp *d, cohort_status st, const char *what)
{
	if (st != COHORT_OK) {
		d->err = COHORT_OK;
		ddp_fail(d, st, "%s", what);
		d->err = COHORT_OK;
	}
	return (st);
}

cohort_status
cohort_ddp_reduce(cohort_ddp *d, void *buf, size_t count, cohort_dtype dtype,
    cohort_redop op)
{
	if (d == NULL || (buf == NULL && count > 0))
		return (COHORT_EINVAL);
	if (d->g == NULL)
		return (COHORT_OK); /* one rank: the value is its reduction */
	return (ddp_helper(d,
	    cohort_allreduce(
	        d->g, buf, buf, count, dtype, op, NULL, d->o.timeout),
	    "reduce"));
}

cohort_status
cohort_ddp_all_gather(cohort_ddp *d, const void *send, void *recv,
    size_t count, cohort_dtype dtype)
{
	if (d == NULL)
		return (COHORT_EINVAL);
	if (d->g == NULL) {
		if (count > 0)
			memmove(recv, send, count * cohort_dtype_size(dtype));
		return (COHORT_OK);
	}
	return (ddp_helper(d,
	    cohort_allgather(
	        d->g, send, recv, count, dtype, NULL, d->o.timeout),
	    "all_gather"));
}

cohort_status
cohort_ddp_broadcast(cohort_ddp *d, const void *obj, size_t len, int32_t src,
    void **out, size_t *out_len)
{
	if (d == NULL || out == NULL || out_len == NULL)
		return (COHORT_EINVAL);
	if (d->g == NULL) {
		void *p = malloc(len ? len : 1);

		if (p == NULL)
			return (COHORT_ENOMEM);
		if (len > 0)
			memcpy(p, obj, len);
		*out = p;
		*out_len = len;
		return (COHORT_OK);
	}
	return (ddp_helper(d,
	    cohort_broadcast_obj(
	        d->g, src, obj, len, out, out_len, d->o.timeout),
	    "broadcast"));
}

cohort_status
cohort_ddp_barrier(cohort_ddp *d, const char *name)
{
	if (d == NULL)
		return (COHORT_EINVAL);
	if (d->g == NULL)
		return (COHORT_OK);
	return (ddp_helper(
	    d, cohort_barrier(d->g, name, d->o.timeout), "barrier"));
}

cohort_status
cohort_ddp_reduce_boolean_decision(
    cohort_ddp *d, bool decision, bool all, bool *out)
{
	if (d == NULL || out == NULL)
		return (COHORT_EINVAL);
	if (d->g == NULL) {
		*out = decision;
		return (COHORT_OK);
	}
	return (ddp_helper(d,
	    cohort_decide(d->g, decision, all, out, d->o.timeout),
	    "reduce_boolean_decision"));
}

cohort_status
cohort_ddp_on_exception(cohort_ddp *d, const char *text)
{
	cohort_status st;

	if (d == NULL)
		return (COHORT_EINVAL);
	fprintf(stderr, "cohort ddp: rank %d failed: %s\n", d->rank,
	    text != NULL ? text : "(no text)");
	if (d->c == NULL)
		return (COHORT_OK);
	st = cohort_report_failure(
	    d->c, text != NULL ? text : "exception", 5000);
	return (ddp_helper(d, st, "on_exception"));
}

const char *
cohort_ddp_last_error(const cohort_ddp *d)
{
	return (d != NULL ? d->errtext : "");
}

void
cohort_ddp_get_stats(const cohort_ddp *d, cohort_ddp_stats *s)
{
	if (d != NULL && s != NULL)
		*s = d->st;
}

void
cohort_ddp_reset_stats(cohort_ddp *d)
{
	int nb;
	size_t counts[64];
	bool views[64];

	if (d == NULL)
		return;
	nb = d->st.nbuckets;
	memcpy(counts, d->st.bucket_count, sizeof(counts));
	memcpy(views, d->st.bucket_view, sizeof(views));
	memset(&d->st, 0, sizeof(d->st));
	d->st.nbuckets = nb;
	memcpy(d->st.bucket_count, counts, sizeof(counts));
	memcpy(d->st.bucket_view, views, sizeof(views));
}

/* ------------------------------------------------------------------------ */
/* Elastic membership                                                       */
/* ------------------------------------------------------------------------ */

/* The registered parameters' bytes. */
static size_t
ddp_param_bytes(const cohort_ddp *d)
{
	size_t n = 0;

	for (size_t i = 0; i < d->nparams; i++)
		n += d->params[i].count * sizeof(float);
	return (n);
}

cohort_status
cohort_ddp_reform(
    cohort_ddp *d, cohort_reform_info *out, cohort_duration timeout)
{
	cohort_status st;

	if (d == NULL || d->c == NULL)
		return (COHORT_EINVAL);
	/* The failed step's reductions: the group is failed, so they end
	 * at once; no work of the old generation may outlive the reform. */
	for (int k = 0; k < d->nb; k++) {
		cohort_work_free(d->b[k].work);
		d->b[k].work = NULL;
	}
	ddp_round_reset(d);
	d->err = COHORT_OK;
	d->errtext[0] = '\0';
	st = cohort_client_reform(d->c, out, timeout);
	if (st != COHORT_OK) {
		ddp_fail(d, st, "reform");
		d->err = COHORT_OK;
		return (st);
	}
	d->rank = cohort_group_rank(d->g);
	d->world = cohort_group_size(d->g);
	for (int k = 0; k < d->nb; k++)
		d->b[k].pub.world_size = d->world;
	return (COHORT_OK);
}

cohort_status
cohort_ddp_state_transfer(
    cohort_ddp *d, void *extra, size_t extra_len, cohort_duration timeout)
{
	size_t pb, len, rlen = 0, off = 0;
	uint8_t *buf = NULL;
	void *got = NULL;
	cohort_status st;

	if (d == NULL || d->c == NULL || (extra == NULL && extra_len > 0))
		return (COHORT_EINVAL);
	pb = ddp_param_bytes(d);
	len = pb + extra_len;
	/* Everyone packs: the roles are the library's to know, and the
	 * copy is what a sender sends. */
	if ((buf = malloc(len > 0 ? len : 1)) == NULL)
		return (COHORT_ENOMEM);
	for (size_t i = 0; i < d->nparams; i++) {
		memcpy(buf + off, d->params[i].data,
		    d->params[i].count * sizeof(float));
		off += d->params[i].count * sizeof(float);
	}
	if (extra_len > 0)
		memcpy(buf + off, extra, extra_len);
	st = cohort_state_transfer(d->c, buf, len, &got, &rlen, timeout);
	free(buf);
	if (st != COHORT_OK) {
		ddp_fail(d, st, "state transfer");
		d->err = COHORT_OK;
		return (st);
	}
	if (got == NULL)
		return (COHORT_OK); /* sent, or no role */
	if (rlen != len) {
		snprintf(d->errtext, sizeof(d->errtext),
		    "ddp: state transfer: the sender's state has %zu bytes, "
		    "this rank's model and extra state %zu (%zu + %zu)",
		    rlen, len, pb, extra_len);
		cohort_free(got);
		return (COHORT_EPROTO);
	}
	off = 0;
	for (size_t i = 0; i < d->nparams; i++) {
		memcpy(d->params[i].data, (uint8_t *)got + off,
		    d->params[i].count * sizeof(float));
		off += d->params[i].count * sizeof(float);
	}
	if (extra_len > 0)
		memcpy(extra, (uint8_t *)got + off, extra_len);
	cohort_free(got);
	return (COHORT_OK);
}
