/*
 * hvd.c - Horovod-style negotiated, fused named collectives (see hvd.h).
 *
 * Announcement wire format (one per rank per cycle, all-gathered): a flags
 * byte (bit 0: this rank is shutting down), then per new submission: kind
 * (1), dtype (1), op (1), root (4, LE), count (8, LE), name length (2,
 * LE), name bytes.
 */
#include <errno.h>
#include <pthread.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "hvd.h"
#include "strat.h"

enum { HVD_ALLREDUCE = 1, HVD_ALLGATHER = 2, HVD_BROADCAST = 3 };

#define HVD_NAME_MAX 255

struct cohort_hvd_handle {
	cohort_hvd *h;
	char name[HVD_NAME_MAX + 1];
	int kind;
	cohort_dtype dtype;
	cohort_redop op;
	int32_t root;
	const void *send;
	void *recv;
	size_t count;
	void *out; /* allgather result */
	size_t out_count;
	bool done, released, announced;
	cohort_status st;
	struct cohort_hvd_handle *next; /* pending (not yet announced) */
	struct cohort_hvd_handle *lnext, *lprev; /* submitted, not done */
};

/* One announced name; the table is identical on every rank. */
struct hvd_entry {
	char name[HVD_NAME_MAX + 1];
	int kind;
	cohort_dtype dtype;
	cohort_redop op;
	int32_t root;
	size_t *counts; /* per rank */
	bool *have; /* per rank */
	int nhave;
	bool mismatch;
	struct cohort_hvd_handle *mine;
	int64_t first_ms;
	int64_t warned_ms;
};

struct cohort_hvd {
	cohort_client *c;
	cohort_group *g;
	int32_t rank, size;
	cohort_hvd_options o;
	pthread_t thread;
	bool thread_started;
	pthread_mutex_t mtx;
	pthread_cond_t cv; /* wakes the cycle thread */
	pthread_cond_t done_cv; /* wakes waiters */
	struct cohort_hvd_handle *pending, **pending_tail;
	struct cohort_hvd_handle *live; /* names in flight on this rank */
	bool stop; /* local shutdown requested */
	bool exited; /* the thread left its loop */
	cohort_status err; /* sticky */
	char errtext[512];
	char stall[2048];
	cohort_hvd_stats st;
	/* Cycle-thread state. */
	struct hvd_entry *tab;
	size_t ntab, captab;
	unsigned char *fusion;
	size_t fusion_cap;
	/* Gradient synchronisation. */
	cohort_ddp_param *params;
	size_t nparams;
	int *delay;
	cohort_hvd_handle **ghandle;
};

static int64_t
hvd_now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((int64_t)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

void
cohort_hvd_options_init(cohort_hvd_options *o)
{
	memset(o, 0, sizeof(*o));
	o->fusion_threshold_bytes = COHORT_HVD_DEFAULT_FUSION;
	o->cycle_time_ms = 2;
	o->idle_cycle_ms = 20;
	o->stall_check_ms = 60000;
	o->backward_passes_per_step = 1;
	o->group_name = "cohort-hvd";
	o->timeout = COHORT_WAIT_DEFAULT;
}

/* Completes a handle (mutex held). */
static void
hvd_complete(cohort_hvd *h, struct cohort_hvd_handle *hd, cohort_status st)
{
	hd->done = true;
	hd->st = st;
	h->st.tensors++;
	if (hd->lprev != NULL)
		hd->lprev->lnext = hd->lnext;
	else
		h->live = hd->lnext;
	if (hd->lnext != NULL)
		hd->lnext->lprev = hd->lprev;
	if (hd->released) {
		free(hd->out);
		free(hd);
	}
	pthread_cond_broadcast(&h->done_cv);
}

static void
hvd_set_error(cohort_hvd *h, cohort_status st, const char *fmt, ...)
{
	char what[200];
	const char *detail;
	va_list ap;

	if (h->err != COHORT_OK)
		return;
	va_start(ap, fmt);
	vsnprintf(what, sizeof(what), fmt, ap);
	va_end(ap);
	detail = cohort_group_last_error(h->g);
	if (detail == NULL || detail[0] == '\0')
		detail = cohort_last_error();
	snprintf(h->errtext, sizeof(h->errtext), "hvd: %s: %s: %s", what,
	    cohort_status_name(st), detail != NULL ? detail : "");
	h->err = st;
}

/* ------------------------------------------------------------------------ */
/* Negotiation                                                              */
/* ------------------------------------------------------------------------ */

static void
hvd_put(unsigned char **p, uint64_t v, int n)
{
	for (int i = 0; i < n; i++)
		(*p)[i] = (unsigned char)(v >> (8 * i));
	*p += n;
}

static uint64_t
hvd_get(const unsigned char **p, int n)
{
	uint64_t v = 0;

	for (int i = 0; i < n; i++)
		v |= (uint64_t)(*p)[i] << (8 * i);
	*p += n;
	return (v);
}

/* Serialises the pending submissions (mutex held); marks them announced
 * and moves them to *batch. */
static unsigned char *
hvd_encode(cohort_hvd *h, bool stopping, size_t *len,
    struct cohort_hvd_handle **batch)
{
	size_t need = 1;
	unsigned char *buf, *p;

	for (struct cohort_hvd_handle *hd = h->pending; hd; hd = hd->next)
		need += 17 + strlen(hd->name);
	if ((buf = malloc(need)) == NULL)
		return (NULL);
	p = buf;
	*p++ = stopping ? 1 : 0;
	for (struct cohort_hvd_handle *hd = h->pending; hd; hd = hd->next) {
		size_t nl = strlen(hd->name);

		hvd_put(&p, (uint64_t)hd->kind, 1);
		hvd_put(&p, (uint64_t)hd->dtype, 1);
		hvd_put(&p, (uint64_t)hd->op, 1);
		hvd_put(&p, (uint64_t)(uint32_t)hd->root, 4);
		hvd_put(&p, (uint64_t)hd->count, 8);
		hvd_put(&p, (uint64_t)nl, 2);
		memcpy(p, hd->name, nl);
		p += nl;
		hd->announced = true;
	}
	*batch = h->pending;
	h->pending = NULL;
	h->pending_tail = &h->pending;
	*len = (size_t)(p - buf);
	return (buf);
}

static struct hvd_entry *
hvd_find(cohort_hvd *h, const char *name)
{
	for (size_t i = 0; i < h->ntab; i++)
		if (strcmp(h->tab[i].name, name) == 0)
			return (&h->tab[i]);
	return (NULL);
}

static struct hvd_entry *
hvd_add(cohort_hvd *h, const char *name)
{
	struct hvd_entry *e;

	if (h->ntab == h->captab) {
		size_t nc = h->captab ? h->captab * 2 : 16;
		struct hvd_entry *t = realloc(h->tab, nc * sizeof(*t));

		if (t == NULL)
			return (NULL);
		h->tab = t;
		h->captab = nc;
	}
	e = &h->tab[h->ntab];
	memset(e, 0, sizeof(*e));
	e->counts = calloc((size_t)h->size, sizeof(size_t));
	e->have = calloc((size_t)h->size, sizeof(bool));
	if (e->counts == NULL || e->have == NULL) {
		free(e->counts);
		free(e->have);
		return (NULL);
	}
	snprintf(e->name, sizeof(e->name), "%s", name);
	e->first_ms = hvd_now_ms();
	h->ntab++;
	return (e);
}

/* Applies rank r's announcements. Returns -1 on a malformed message. */
static int
hvd_apply(cohort_hvd *h, int r, const unsigned char *p, size_t len,
    struct cohort_hvd_handle *mine, bool *stopping)
{
	const unsigned char *end = p + len;

	if (len < 1)
		return (-1);
	*stopping = (*p++ & 1) != 0;
	while (p < end) {
		char name[HVD_NAME_MAX + 1];
		int kind, dtype, op;
		int32_t root;
		size_t count, nl;
		struct hvd_entry *e;

		if (end - p < 17)
			return (-1);
		kind = (int)hvd_get(&p, 1);
		dtype = (int)hvd_get(&p, 1);
		op = (int)hvd_get(&p, 1);
		root = (int32_t)(uint32_t)hvd_get(&p, 4);
		count = (size_t)hvd_get(&p, 8);
		nl = (size_t)hvd_get(&p, 2);
		if (nl == 0 || nl > HVD_NAME_MAX || (size_t)(end - p) < nl)
			return (-1);
		memcpy(name, p, nl);
		name[nl] = '\0';
		p += nl;
		if ((e = hvd_find(h, name)) == NULL) {
			if ((e = hvd_add(h, name)) == NULL)
				return (-1);
			e->kind = kind;
			e->dtype = (cohort_dtype)dtype;
			e->op = (cohort_redop)op;
			e->root = root;
		} else if (e->kind != kind || e->dtype != (cohort_dtype)dtype
		    || e->op != (cohort_redop)op || e->root != root) {
			e->mismatch = true;
		}
		if (!e->have[r]) {
			e->have[r] = true;
			e->nhave++;
		}
		e->counts[r] = count;
		if (r == h->rank) {
			for (struct cohort_hvd_handle *hd = mine; hd;
			     hd = hd->next) {
				if (strcmp(hd->name, name) == 0) {
					e->mine = hd;
					break;
				}
			}
		}
	}
	return (0);
}

/* ------------------------------------------------------------------------ */
/* Execution                                                                */
/* ------------------------------------------------------------------------ */

static void
hvd_finish_entry(cohort_hvd *h, struct hvd_entry *e, cohort_status st)
{
	pthread_mutex_lock(&h->mtx);
	if (e->mine != NULL)
		hvd_complete(h, e->mine, st);
	pthread_mutex_unlock(&h->mtx);
	e->mine = NULL;
}

static cohort_status
hvd_exec_single(cohort_hvd *h, struct hvd_entry *e)
{
	struct cohort_hvd_handle *hd = e->mine;
	size_t es = cohort_dtype_size(e->dtype);
	cohort_status st = COHORT_OK;

	if (e->kind == HVD_ALLREDUCE) {
		st = cohort_allreduce(h->g, hd->send, hd->recv, hd->count,
		    e->dtype, e->op, NULL, h->o.timeout);
		h->st.allreduce_calls++;
		h->st.bytes += hd->count * es;
	} else if (e->kind == HVD_BROADCAST) {
		st = cohort_broadcast(h->g, hd->recv, hd->count, e->dtype,
		    e->root, NULL, h->o.timeout);
		h->st.bytes += hd->count * es;
	} else {
		size_t total = 0;
		void *out;

		for (int r = 0; r < h->size; r++)
			total += e->counts[r];
		if ((out = malloc(total * es + 1)) == NULL)
			return (COHORT_ENOMEM);
		st = cohort_allgatherv(h->g, hd->send, out, e->counts,
		    e->dtype, NULL, h->o.timeout);
		if (st == COHORT_OK) {
			hd->out = out;
			hd->out_count = total;
		} else {
			free(out);
		}
		h->st.bytes += total * es;
	}
	return (st);
}

/* Fused all-reduce of entries idx[0..n) (same dtype and op). */
static cohort_status
hvd_exec_fused(cohort_hvd *h, struct hvd_entry **ev, size_t n)
{
	size_t es = cohort_dtype_size(ev[0]->dtype), total = 0, off = 0;
	cohort_status st;

	for (size_t i = 0; i < n; i++)
		total += ev[i]->mine->count * es;
	if (total > h->fusion_cap) {
		unsigned char *f = realloc(h->fusion, total);

		if (f == NULL)
			return (COHORT_ENOMEM);
		h->fusion = f;
		h->fusion_cap = total;
	}
	for (size_t i = 0; i < n; i++) {
		size_t b = ev[i]->mine->count * es;

		memcpy(h->fusion + off, ev[i]->mine->send, b);
		off += b;
	}
	st = cohort_allreduce(h->g, h->fusion, h->fusion, total / es,
	    ev[0]->dtype, ev[0]->op, NULL, h->o.timeout);
	h->st.allreduce_calls++;
	h->st.fused_tensors += n;
	h->st.bytes += total;
	if (st != COHORT_OK)
		return (st);
	off = 0;
	for (size_t i = 0; i < n; i++) {
		size_t b = ev[i]->mine->count * es;

		memcpy(ev[i]->mine->recv, h->fusion + off, b);
		off += b;
	}
	return (COHORT_OK);
}

/* The detail of a name the ranks announced differently, for
 * cohort_hvd_last_error (the engine goes on: only that name fails). */
static void
hvd_mismatch_text(cohort_hvd *h, const struct hvd_entry *e)
{
	char counts[256];
	size_t off = 0;

	counts[0] = '\0';
	for (int r = 0; r < h->size && off < sizeof(counts) - 24; r++)
		off += (size_t)snprintf(counts + off, sizeof(counts) - off,
		    "%s%zu", r ? "," : "", e->counts[r]);
	pthread_mutex_lock(&h->mtx);
	if (h->err == COHORT_OK)
		snprintf(h->errtext, sizeof(h->errtext),
		    "hvd: '%s': ranks disagree on the collective (kind, "
		    "dtype, "
		    "op, root or element count; counts by rank [%s]): %s",
		    e->name, counts, cohort_status_name(COHORT_EMISMATCH));
	pthread_mutex_unlock(&h->mtx);
}

/* Runs every entry all ranks announced, in table order; fuses runs of
 * compatible all-reduces. Returns the first collective error. */
static cohort_status
hvd_execute(cohort_hvd *h)
{
	struct hvd_entry **ready;
	size_t nready = 0, i = 0, keep = 0;
	cohort_status st = COHORT_OK;

	if (h->ntab == 0)
		return (COHORT_OK);
	if ((ready = malloc(h->ntab * sizeof(*ready))) == NULL)
		return (COHORT_ENOMEM);
	for (size_t k = 0; k < h->ntab; k++) {
		struct hvd_entry *e = &h->tab[k];

		if (e->nhave != h->size)
			continue;
		/* All-reduce and broadcast need equal counts everywhere. */
		for (int r = 1; e->kind != HVD_ALLGATHER && r < h->size; r++)
			if (e->counts[r] != e->counts[0])
				e->mismatch = true;
		ready[nready++] = e;
	}
	while (i < nready && st == COHORT_OK) {
		struct hvd_entry *e = ready[i];
		size_t j = i + 1;

		if (e->mismatch) {
			hvd_mismatch_text(h, e);
			hvd_finish_entry(h, e, COHORT_EMISMATCH);
			i++;
			continue;
		}
		if (e->kind == HVD_ALLREDUCE
		    && h->o.fusion_threshold_bytes > 0) {
			size_t es = cohort_dtype_size(e->dtype);
			size_t bytes = e->counts[0] * es;

			while (j < nready && !ready[j]->mismatch
			    && ready[j]->kind == HVD_ALLREDUCE
			    && ready[j]->dtype == e->dtype
			    && ready[j]->op == e->op
			    && bytes + ready[j]->counts[0] * es
			        <= h->o.fusion_threshold_bytes) {
				bytes += ready[j]->counts[0] * es;
				j++;
			}
		}
		if (j - i > 1)
			st = hvd_exec_fused(h, ready + i, j - i);
		else
			st = hvd_exec_single(h, e);
		if (st != COHORT_OK)
			hvd_set_error(h, st, "%s '%s'",
			    e->kind == HVD_ALLREDUCE       ? "allreduce"
			        : e->kind == HVD_ALLGATHER ? "allgather"
			                                   : "broadcast",
			    e->name);
		for (size_t k = i; k < j; k++)
			hvd_finish_entry(h, ready[k], st);
		i = j;
	}
	free(ready);
	if (st != COHORT_OK)
		return (st);
	/* Drop the executed entries, keeping the order of the rest. */
	for (size_t k = 0; k < h->ntab; k++) {
		if (h->tab[k].nhave == h->size) {
			free(h->tab[k].counts);
			free(h->tab[k].have);
		} else {
			h->tab[keep++] = h->tab[k];
		}
	}
	h->ntab = keep;
	return (COHORT_OK);
}

static void
hvd_stall_check(cohort_hvd *h)
{
	char buf[sizeof(h->stall)];
	size_t off = 0;
	int64_t now = hvd_now_ms();

	buf[0] = '\0';
	if (h->o.stall_check_ms <= 0)
		return;
	for (size_t k = 0; k < h->ntab; k++) {
		struct hvd_entry *e = &h->tab[k];
		char have[256] = "", miss[256] = "";
		size_t hl = 0, ml = 0;
		int n;

		if (now - e->first_ms < h->o.stall_check_ms)
			continue;
		for (int r = 0; r < h->size; r++) {
			char *dst = e->have[r] ? have : miss;
			size_t *l = e->have[r] ? &hl : &ml;

			n = snprintf(
			    dst + *l, 256 - *l, "%s%d", *l ? "," : "", r);
			if (n > 0 && (size_t)n < 256 - *l)
				*l += (size_t)n;
		}
		n = snprintf(buf + off, sizeof(buf) - off,
		    "tensor '%s' waited %.1f s: submitted by ranks [%s], "
		    "missing ranks [%s]\n",
		    e->name, (double)(now - e->first_ms) / 1000.0, have, miss);
		if (n > 0 && (size_t)n < sizeof(buf) - off)
			off += (size_t)n;
		if (h->rank == 0
		    && now - e->warned_ms >= h->o.stall_check_ms) {
			e->warned_ms = now;
			fprintf(stderr,
			    "cohort hvd: stall: one or more ranks have not "
			    "submitted tensor '%s' for %.1f s: missing ranks "
			    "[%s] (submitted by [%s])\n",
			    e->name, (double)(now - e->first_ms) / 1000.0,
			    miss, have);
		}
	}
	pthread_mutex_lock(&h->mtx);
	memcpy(h->stall, buf, off + 1);
	pthread_mutex_unlock(&h->mtx);
}

/* ------------------------------------------------------------------------ */
/* The cycle thread                                                         */
/* ------------------------------------------------------------------------ */

/* *ts = now + ms on CLOCK_REALTIME, for pthread_cond_timedwait. */
static void
hvd_abstime(struct timespec *ts, int ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

static void
hvd_wait_cycle(cohort_hvd *h, bool busy)
{
	struct timespec ts;
	int ms = busy ? h->o.cycle_time_ms : h->o.idle_cycle_ms;

	if (h->pending != NULL || h->stop)
		return;
	hvd_abstime(&ts, ms);
	while (h->pending == NULL && !h->stop) {
		if (pthread_cond_timedwait(&h->cv, &h->mtx, &ts) == ETIMEDOUT)
			break;
	}
}

static void *
hvd_thread(void *arg)
{
	cohort_hvd *h = arg;
	const int n = h->size;
	int64_t *lens = calloc(2 * (size_t)n, sizeof(int64_t));
	size_t *counts = calloc((size_t)n, sizeof(size_t));
	bool busy = false;
	cohort_status st = COHORT_OK;

	if (lens == NULL || counts == NULL) {
		st = COHORT_ENOMEM;
		pthread_mutex_lock(&h->mtx);
		hvd_set_error(h, st, "cycle thread");
		pthread_mutex_unlock(&h->mtx);
	}
	while (st == COHORT_OK) {
		struct cohort_hvd_handle *batch = NULL;
		unsigned char *msg, *all = NULL;
		size_t len = 0, total = 0, off = 0;
		int64_t mine2[2];
		bool stopping, all_stop = true;

		pthread_mutex_lock(&h->mtx);
		hvd_wait_cycle(h, busy);
		stopping = h->stop;
		msg = hvd_encode(h, stopping, &len, &batch);
		pthread_mutex_unlock(&h->mtx);
		if (msg == NULL) {
			st = COHORT_ENOMEM;
			break;
		}
		/* Sizes and stop flags of every rank: [len, stopping]. */
		mine2[0] = (int64_t)len;
		mine2[1] = stopping ? 1 : 0;
		st = cohort_allgather(
		    h->g, mine2, lens, 2, COHORT_I64, NULL, h->o.timeout);
		h->st.cycles++;
		if (st == COHORT_OK) {
			for (int r = 0; r < n; r++) {
				counts[r] = (size_t)lens[2 * r];
				total += counts[r];
				all_stop = all_stop && lens[2 * r + 1] != 0;
			}
			if (total > (size_t)n) {
				if ((all = malloc(total)) == NULL)
					st = COHORT_ENOMEM;
				else
					st = cohort_allgatherv(h->g, msg, all,
					    counts, COHORT_U8, NULL,
					    h->o.timeout);
			} else {
				h->st.idle_cycles++;
			}
		}
		for (int r = 0; all != NULL && r < n && st == COHORT_OK; r++) {
			bool rs;

			if (hvd_apply(h, r, all + off, counts[r], batch, &rs)
			    != 0)
				st = COHORT_EPROTO;
			off += counts[r];
		}
		if (st != COHORT_OK) {
			pthread_mutex_lock(&h->mtx);
			hvd_set_error(h, st, "negotiation");
			pthread_mutex_unlock(&h->mtx);
		}
		free(msg);
		free(all);
		if (st == COHORT_OK)
			st = hvd_execute(h);
		/* Short cycles while names are being announced; back off
		 * to idle_cycle_ms when a cycle brought nothing new (e.g.
		 * waiting for a late rank, whose submission wakes its own
		 * thread at once). */
		busy = total > (size_t)n;
		if (st == COHORT_OK)
			hvd_stall_check(h);
		if (st == COHORT_OK && all_stop)
			break;
	}
	/* Fail whatever is left: every submission not done yet, wherever
	 * it is (pending, in the table, or in the batch whose negotiation
	 * failed before it reached the table) is on the live list. */
	pthread_mutex_lock(&h->mtx);
	if (st != COHORT_OK && h->err == COHORT_OK)
		hvd_set_error(h, st, "cycle");
	for (size_t k = 0; k < h->ntab; k++) {
		free(h->tab[k].counts);
		free(h->tab[k].have);
	}
	h->ntab = 0;
	h->pending = NULL;
	h->pending_tail = &h->pending;
	while (h->live != NULL)
		hvd_complete(
		    h, h->live, h->err != COHORT_OK ? h->err : COHORT_ECLOSED);
	h->exited = true;
	pthread_cond_broadcast(&h->done_cv);
	pthread_mutex_unlock(&h->mtx);
	free(lens);
	free(counts);
	return (NULL);
}

/* Everything h holds, once its cycle thread has ended or never started
 * (cohort_hvd_new's failure path, cohort_hvd_free), and h itself. */
static void
hvd_destroy(cohort_hvd *h)
{
	for (size_t i = 0; h->ghandle != NULL && i < h->nparams; i++)
		if (h->ghandle[i] != NULL)
			cohort_hvd_release(h->ghandle[i]);
	cohort_group_destroy(h->g);
	cohort__strat_sync_fini(&h->mtx, &h->cv, &h->done_cv);
	COHORT__STRAT_FREE_ALL(
	    h->tab, h->fusion, h->params, h->delay, h->ghandle, h);
}

/* ------------------------------------------------------------------------ */
/* Public API                                                               */
/* ------------------------------------------------------------------------ */

cohort_status
cohort_hvd_new(
    cohort_client *c, const cohort_hvd_options *opts, cohort_hvd **out)
{
	cohort_hvd *h;
	int32_t *ranks;
	int32_t world;
	cohort_status st;

	if (c == NULL || out == NULL)
		return (COHORT_EINVAL);
	if ((h = calloc(1, sizeof(*h))) == NULL)
		return (COHORT_ENOMEM);
	if (opts != NULL)
		h->o = *opts;
	else
		cohort_hvd_options_init(&h->o);
	if (h->o.cycle_time_ms <= 0)
		h->o.cycle_time_ms = 2;
	if (h->o.idle_cycle_ms < h->o.cycle_time_ms)
		h->o.idle_cycle_ms = h->o.cycle_time_ms;
	if (h->o.backward_passes_per_step <= 0)
		h->o.backward_passes_per_step = 1;
	if (h->o.group_name == NULL)
		h->o.group_name = "cohort-hvd";
	h->c = c;
	world = cohort_client_world_size(c);
	if ((ranks = malloc((size_t)world * sizeof(int32_t))) == NULL) {
		free(h);
		return (COHORT_ENOMEM);
	}
	for (int32_t r = 0; r < world; r++)
		ranks[r] = r;
	st = cohort_group_new(c, h->o.group_name, ranks, (size_t)world, NULL,
	    &h->g, h->o.timeout);
	free(ranks);
	if (st != COHORT_OK) {
		free(h);
		return (st);
	}
	h->rank = cohort_group_rank(h->g);
	h->size = cohort_group_size(h->g);
	h->pending_tail = &h->pending;
	cohort__strat_sync_init(&h->mtx, &h->cv, &h->done_cv);
	if (pthread_create(&h->thread, NULL, hvd_thread, h) != 0) {
		hvd_destroy(h);
		return (COHORT_ESYSTEM);
	}
	h->thread_started = true;
	*out = h;
	return (COHORT_OK);
}

void
cohort_hvd_free(cohort_hvd *h)
{
	if (h == NULL)
		return;
	cohort__strat_stop(&h->mtx, &h->cv, &h->stop);
	if (h->thread_started)
		pthread_join(h->thread, NULL);
	hvd_destroy(h);
}

int32_t
cohort_hvd_rank(const cohort_hvd *h)
{
	return (h != NULL ? h->rank : -1);
}

int32_t
cohort_hvd_size(const cohort_hvd *h)
{
	return (h != NULL ? h->size : 0);
}

static cohort_status
hvd_submit(cohort_hvd *h, const char *name, int kind, const void *send,
    void *recv, size_t count, cohort_dtype dtype, cohort_redop op,
    int32_t root, cohort_hvd_handle **out)
{
	struct cohort_hvd_handle *hd;
	cohort_status st = COHORT_OK;

	if (h == NULL || name == NULL || name[0] == '\0'
	    || strlen(name) > HVD_NAME_MAX || out == NULL
	    || cohort_dtype_size(dtype) == 0
	    || (count > 0 && send == NULL && recv == NULL))
		return (COHORT_EINVAL);
	if ((hd = calloc(1, sizeof(*hd))) == NULL)
		return (COHORT_ENOMEM);
	hd->h = h;
	snprintf(hd->name, sizeof(hd->name), "%s", name);
	hd->kind = kind;
	hd->dtype = dtype;
	hd->op = op;
	hd->root = root;
	hd->send = send;
	hd->recv = recv;
	hd->count = count;
	pthread_mutex_lock(&h->mtx);
	if (h->err != COHORT_OK)
		st = h->err;
	else if (h->stop || h->exited)
		st = COHORT_ECLOSED;
	for (struct cohort_hvd_handle *p = h->live; st == COHORT_OK && p;
	     p = p->lnext)
		if (strcmp(p->name, name) == 0)
			st = COHORT_EEXIST;
	if (st == COHORT_OK) {
		hd->lnext = h->live;
		if (h->live != NULL)
			h->live->lprev = hd;
		h->live = hd;
		*h->pending_tail = hd;
		h->pending_tail = &hd->next;
		pthread_cond_signal(&h->cv);
	}
	pthread_mutex_unlock(&h->mtx);
	if (st != COHORT_OK) {
		free(hd);
		return (st);
	}
	*out = hd;
	return (COHORT_OK);
}

cohort_status
cohort_hvd_allreduce_async(cohort_hvd *h, const char *name, const void *send,
    void *recv, size_t count, cohort_dtype dtype, cohort_redop op,
    cohort_hvd_handle **out)
{
	if (send == NULL || recv == NULL || op >= COHORT_REDOP_COUNT)
		return (COHORT_EINVAL);
	return (hvd_submit(
	    h, name, HVD_ALLREDUCE, send, recv, count, dtype, op, 0, out));
}

cohort_status
cohort_hvd_allgather_async(cohort_hvd *h, const char *name, const void *send,
    size_t count, cohort_dtype dtype, cohort_hvd_handle **out)
{
	if (send == NULL && count > 0)
		return (COHORT_EINVAL);
	return (hvd_submit(h, name, HVD_ALLGATHER, send != NULL ? send : "",
	    NULL, count, dtype, COHORT_SUM, 0, out));
}

cohort_status
cohort_hvd_broadcast_async(cohort_hvd *h, const char *name, void *buf,
    size_t count, cohort_dtype dtype, int32_t root, cohort_hvd_handle **out)
{
	if (buf == NULL || h == NULL || root < 0 || root >= h->size)
		return (COHORT_EINVAL);
	return (hvd_submit(h, name, HVD_BROADCAST, buf, buf, count, dtype,
	    COHORT_SUM, root, out));
}

bool
cohort_hvd_poll(cohort_hvd_handle *hd)
{
	bool done;

	if (hd == NULL)
		return (true);
	pthread_mutex_lock(&hd->h->mtx);
	done = hd->done;
	pthread_mutex_unlock(&hd->h->mtx);
	return (done);
}

cohort_status
cohort_hvd_wait(cohort_hvd_handle *hd, cohort_duration timeout)
{
	cohort_hvd *h;
	struct timespec ts;
	cohort_status st;

	if (hd == NULL)
		return (COHORT_EINVAL);
	h = hd->h;
	if (timeout == COHORT_WAIT_DEFAULT)
		timeout = h->o.timeout;
	if (timeout >= 0) {
		hvd_abstime(&ts, (int)timeout);
	}
	pthread_mutex_lock(&h->mtx);
	while (!hd->done) {
		if (timeout < 0)
			pthread_cond_wait(&h->done_cv, &h->mtx);
		else if (pthread_cond_timedwait(&h->done_cv, &h->mtx, &ts)
		    == ETIMEDOUT)
			break;
	}
	st = hd->done ? hd->st : COHORT_ETIMEDOUT;
	pthread_mutex_unlock(&h->mtx);
	return (st);
}

cohort_status
cohort_hvd_output(cohort_hvd_handle *hd, const void **data, size_t *count)
{
	cohort_status st;

	if (hd == NULL)
		return (COHORT_EINVAL);
	pthread_mutex_lock(&hd->h->mtx);
	if (!hd->done)
		st = COHORT_ESTATE;
	else if ((st = hd->st) == COHORT_OK) {
		if (data != NULL)
			*data = hd->out;
		if (count != NULL)
			*count = hd->out_count;
	}
	pthread_mutex_unlock(&hd->h->mtx);
	return (st);
}

void
cohort_hvd_release(cohort_hvd_handle *hd)
{
	cohort_hvd *h;
	bool now;

	if (hd == NULL)
		return;
	h = hd->h;
	pthread_mutex_lock(&h->mtx);
	now = hd->done;
	hd->released = true;
	pthread_mutex_unlock(&h->mtx);
	if (now) {
		free(hd->out);
		free(hd);
	}
}

cohort_status
cohort_hvd_synchronize(cohort_hvd_handle *hd, cohort_duration timeout)
{
	cohort_status st = cohort_hvd_wait(hd, timeout);

	if (st != COHORT_ETIMEDOUT)
		cohort_hvd_release(hd);
	return (st);
}

size_t
cohort_hvd_stall_report(cohort_hvd *h, char *buf, size_t len)
{
	size_t n;

	if (h == NULL)
		return (0);
	pthread_mutex_lock(&h->mtx);
	n = strlen(h->stall);
	if (buf != NULL && len > 0)
		snprintf(buf, len, "%s", h->stall);
	pthread_mutex_unlock(&h->mtx);
	return (n);
}

const char *
cohort_hvd_last_error(cohort_hvd *h)
{
	return (h != NULL ? h->errtext : "");
}

void
cohort_hvd_get_stats(cohort_hvd *h, cohort_hvd_stats *s)
{
	if (h == NULL || s == NULL)
		return;
	pthread_mutex_lock(&h->mtx);
	*s = h->st;
	pthread_mutex_unlock(&h->mtx);
}

/* ------------------------------------------------------------------------ */
/* Gradient synchronisation                                                 */
/* ------------------------------------------------------------------------ */

cohort_status
cohort_hvd_register_params(
    cohort_hvd *h, const cohort_ddp_param *params, size_t nparams)
{
	if (h == NULL || params == NULL || nparams == 0 || h->params != NULL)
		return (COHORT_EINVAL);
	h->params = malloc(nparams * sizeof(*params));
	h->delay = malloc(nparams * sizeof(int));
	h->ghandle = calloc(nparams, sizeof(*h->ghandle));
	if (h->params == NULL || h->delay == NULL || h->ghandle == NULL) {
		free(h->params);
		free(h->delay);
		free(h->ghandle);
		h->params = NULL;
		return (COHORT_ENOMEM);
	}
	memcpy(h->params, params, nparams * sizeof(*params));
	h->nparams = nparams;
	for (size_t i = 0; i < nparams; i++)
		h->delay[i] = h->o.backward_passes_per_step;
	return (COHORT_OK);
}

static void
hvd_param_name(
    const cohort_hvd *h, size_t i, const char *kind, char *buf, size_t len)
{
	const char *n = h->params[i].name;

	snprintf(buf, len, "%s.%zu.%.200s", kind, i, n != NULL ? n : "");
}

cohort_status
cohort_hvd_broadcast_parameters(cohort_hvd *h, int32_t root)
{
	cohort_hvd_handle **hs;
	cohort_status st = COHORT_OK;

	if (h == NULL || h->params == NULL)
		return (COHORT_EINVAL);
	if ((hs = calloc(h->nparams, sizeof(*hs))) == NULL)
		return (COHORT_ENOMEM);
	for (size_t i = 0; i < h->nparams && st == COHORT_OK; i++) {
		char name[256];

		hvd_param_name(h, i, "param", name, sizeof(name));
		st = cohort_hvd_broadcast_async(h, name, h->params[i].data,
		    h->params[i].count, COHORT_F32, root, &hs[i]);
	}
	for (size_t i = 0; i < h->nparams; i++) {
		cohort_status ws;

		if (hs[i] == NULL)
			continue;
		ws = cohort_hvd_synchronize(hs[i], COHORT_WAIT_DEFAULT);
		if (st == COHORT_OK)
			st = ws;
	}
	free(hs);
	return (st);
}

static cohort_status
hvd_submit_grad(cohort_hvd *h, size_t i)
{
	char name[256];

	hvd_param_name(h, i, "grad", name, sizeof(name));
	return (cohort_hvd_allreduce_async(h, name, h->params[i].grad,
	    h->params[i].grad, h->params[i].count, COHORT_F32, COHORT_MEAN,
	    &h->ghandle[i]));
}

void
cohort_hvd_grad_ready(cohort_hvd *h, int i)
{
	if (h == NULL || h->params == NULL || i < 0 || (size_t)i >= h->nparams
	    || h->ghandle[i] != NULL)
		return;
	if (--h->delay[i] > 0)
		return;
	if (hvd_submit_grad(h, (size_t)i) != COHORT_OK)
		h->ghandle[i] = NULL; /* step_sync reports the error */
}

cohort_status
cohort_hvd_step_sync(cohort_hvd *h, bool *do_step)
{
	cohort_status st = COHORT_OK;
	bool any = false;

	if (h == NULL || do_step == NULL || h->params == NULL)
		return (COHORT_EINVAL);
	for (size_t i = 0; i < h->nparams; i++)
		any = any || h->ghandle[i] != NULL || h->delay[i] <= 0;
	*do_step = any;
	if (!any)
		return (COHORT_OK);
	for (size_t i = 0; i < h->nparams && st == COHORT_OK; i++)
		if (h->ghandle[i] == NULL)
			st = hvd_submit_grad(h, i);
	for (size_t i = 0; i < h->nparams; i++) {
		cohort_status ws;

		h->delay[i] = h->o.backward_passes_per_step;
		if (h->ghandle[i] == NULL)
			continue;
		ws = cohort_hvd_synchronize(
		    h->ghandle[i], COHORT_WAIT_DEFAULT);
		h->ghandle[i] = NULL;
		if (st == COHORT_OK)
			st = ws;
	}
	if (st != COHORT_OK && h->errtext[0] == '\0')
		snprintf(h->errtext, sizeof(h->errtext),
		    "hvd: gradient synchronisation: %s",
		    cohort_status_name(st));
	return (st);
}
