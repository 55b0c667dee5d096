/*
 * observe.c - per-rank metrics and the timeline (observe.h,
 * docs/observability.md).
 *
 * The timeline is a ring of fixed-size events under a mutex (taken once
 * per operation, only when COHORT_TIMELINE is set); when it is full the
 * oldest events are overwritten and counted. At close the events are
 * sorted by track and start time and written as one Chrome trace JSON
 * object, one event per line, so that `cohort run` can merge the files of
 * all ranks line by line. Timestamps are CLOCK_MONOTONIC taken during the
 * run, shifted by one (realtime - monotonic) offset read at start, so
 * that ranks of one host line up to the microsecond and ranks of several
 * hosts as well as their clocks agree.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cohort_impl.h"
#include "observe.h"

#define TL_DEFAULT_EVENTS 16384

struct tl_event {
	uint64_t t0, t1; /* monotonic ns; t1 == 0: instant */
	uint64_t wait, bytes, seq;
	const char *cat; /* static */
	const char *backend, *algo; /* static or NULL */
	int32_t track;
	int32_t st;
	char name[40];
	char group[32];
	char detail[96];
};

struct cohort__tl {
	pthread_mutex_t mtx;
	struct tl_event *ev;
	size_t cap, head, n; /* ring: n events ending before head */
	uint64_t dropped;
	char path[1024];
	char host[64];
	int32_t rank, world;
	int64_t off_ns; /* realtime - monotonic at start */
	bool started;
};

static const char *const obs_names[COHORT__OBS_NOPS] = {
	[0] = "other",
	[1] = "allreduce",
	[2] = "reduce",
	[3] = "broadcast",
	[4] = "allgather",
	[5] = "allgatherv",
	[6] = "reduce_scatter",
	[7] = "alltoall",
	[8] = "gather",
	[9] = "scatter",
	[10] = "barrier",
	[COHORT__OBS_BROADCAST_OBJ] = "broadcast_obj",
	[COHORT__OBS_REDUCE_SCALARS] = "reduce_scalars",
	[COHORT__OBS_DECIDE] = "decide",
};

int
cohort__obs_control_kind(const char *name)
{
	for (int i = 10; i < COHORT__OBS_NOPS; i++)
		if (strcmp(name, obs_names[i]) == 0)
			return (i);
	return (0);
}

cohort_status
cohort__obs_init(struct cohort__obs *o)
{
	const char *path = cohort__knob_str(COHORT__KNOB_TIMELINE);
	int64_t cap;

	memset(o, 0, sizeof(*o));
	o->metrics = cohort__knob_int_or(COHORT__KNOB_METRICS, 1) != 0;
	atomic_init(&o->next_track, COHORT__TRACK_GROUPS);
	if (path == NULL || path[0] == '\0')
		return (COHORT_OK);
	cap = cohort__knob_int_or(
	    COHORT__KNOB_TIMELINE_EVENTS, TL_DEFAULT_EVENTS);
	if ((o->tl = calloc(1, sizeof(*o->tl))) == NULL
	    || (o->tl->ev = calloc((size_t)cap, sizeof(struct tl_event)))
	        == NULL) {
		free(o->tl);
		o->tl = NULL;
		return (cohort__err(COHORT_ENOMEM,
		    "COHORT_TIMELINE: no memory for %" PRId64 " events", cap));
	}
	pthread_mutex_init(&o->tl->mtx, NULL);
	o->tl->cap = (size_t)cap;
	cohort__strlcpy(o->tl->path, path, sizeof(o->tl->path));
	return (COHORT_OK);
}

/* COHORT_TIMELINE with %r -> rank, %g -> generation; without %r, ranks of
 * a job of several write PATH.rankN. */
static void
tl_path(struct cohort__tl *tl, uint64_t gen)
{
	char out[1024];
	size_t off = 0;
	bool has_r = false;

	for (const char *p = tl->path; *p != '\0' && off + 24 < sizeof(out);
	     p++) {
		if (p[0] == '%' && p[1] == 'r') {
			off += (size_t)snprintf(
			    out + off, sizeof(out) - off, "%d", (int)tl->rank);
			has_r = true;
			p++;
		} else if (p[0] == '%' && p[1] == 'g') {
			off += (size_t)snprintf(
			    out + off, sizeof(out) - off, "%" PRIu64, gen);
			p++;
		} else {
			out[off++] = *p;
		}
	}
	out[off] = '\0';
	if (!has_r && tl->world > 1)
		cohort__appendf(
		    out, sizeof(out), &off, ".rank%d", (int)tl->rank);
	cohort__strlcpy(tl->path, out, sizeof(tl->path));
}

void
cohort__obs_start(struct cohort__obs *o, const char *job, int32_t rank,
    int32_t world, uint64_t generation)
{
	struct cohort__tl *tl = o->tl;
	struct timespec rt;

	(void)job;
	if (o->start_ns == 0)
		o->start_ns = cohort__now_ns();
	if (tl == NULL)
		return;
	tl->rank = rank;
	tl->world = world;
	if (gethostname(tl->host, sizeof(tl->host)) != 0)
		cohort__strlcpy(tl->host, "?", sizeof(tl->host));
	tl->host[sizeof(tl->host) - 1] = '\0';
	clock_gettime(CLOCK_REALTIME, &rt);
	tl->off_ns = (int64_t)rt.tv_sec * 1000000000 + rt.tv_nsec
	    - (int64_t)cohort__now_ns();
	tl_path(tl, generation);
	tl->started = true;
}

static struct tl_event *
tl_slot(struct cohort__tl *tl)
{
	struct tl_event *e = &tl->ev[tl->head];
	const char *next;

	if (++tl->head == tl->cap)
		tl->head = 0;
	if (tl->n < tl->cap)
		tl->n++;
	else
		tl->dropped++;
	/* The next operation writes the next slot: bring its lines in now,
	 * off that operation's path (a cold 240-byte slot was most of the
	 * timeline's cost per operation). */
	next = (const char *)&tl->ev[tl->head];
	for (size_t off = 0; off < sizeof(*e); off += 64)
		__builtin_prefetch(next + off, 1, 3);
	return (e);
}

static inline void
obs_hist(struct cohort__obs_hist *h, uint64_t ns)
{
	atomic_fetch_add_explicit(
	    &h->b[cohort__obs_bucket(ns)], 1, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->sum_ns, ns, memory_order_relaxed);
	atomic_fetch_add_explicit(&h->count, 1, memory_order_relaxed);
}

void
cohort__obs_op(struct cohort__obs *o, const struct cohort__obs_op *op)
{
	uint64_t dur = op->t1_ns > op->t0_ns ? op->t1_ns - op->t0_ns : 0;
	int k = op->kind > 0 && op->kind < COHORT__OBS_NOPS ? op->kind : 0;

	if (o->metrics) {
		atomic_fetch_add_explicit(
		    &o->count[k], 1, memory_order_relaxed);
		if (op->st != COHORT_OK)
			atomic_fetch_add_explicit(
			    &o->errors[k], 1, memory_order_relaxed);
		atomic_fetch_add_explicit(
		    &o->bytes[k], op->bytes, memory_order_relaxed);
		atomic_fetch_add_explicit(
		    &o->time_ns[k], dur, memory_order_relaxed);
		atomic_fetch_add_explicit(
		    &o->wait_ns[k], op->wait_ns, memory_order_relaxed);
		obs_hist(&o->coll, dur);
		obs_hist(&o->wait, op->wait_ns);
	}
	if (o->tl != NULL) {
		struct cohort__tl *tl = o->tl;
		struct tl_event *e;

		pthread_mutex_lock(&tl->mtx);
		e = tl_slot(tl);
		e->t0 = op->t0_ns;
		e->t1 = op->t1_ns > op->t0_ns ? op->t1_ns : op->t0_ns + 1;
		e->wait = op->wait_ns;
		e->bytes = op->bytes;
		e->seq = op->seq;
		e->cat = op->control ? "control" : "collective";
		e->backend = op->backend;
		e->algo = op->algo;
		e->track = op->track;
		e->st = (int32_t)op->st;
		cohort__strlcpy(e->name, op->name, sizeof(e->name));
		cohort__strlcpy(e->group, op->group, sizeof(e->group));
		e->detail[0] = '\0';
		if (op->st != COHORT_OK && op->detail != NULL)
			cohort__strlcpy(
			    e->detail, op->detail, sizeof(e->detail));
		pthread_mutex_unlock(&tl->mtx);
	}
}

void
cohort__obs_event(struct cohort__obs *o, int track, const char *cat,
    const char *name, uint64_t t0_ns, uint64_t t1_ns, const char *detail)
{
	struct cohort__tl *tl = o->tl;
	struct tl_event *e;

	if (tl == NULL)
		return;
	pthread_mutex_lock(&tl->mtx);
	e = tl_slot(tl);
	memset(e, 0, sizeof(*e));
	e->t0 = t0_ns;
	e->t1 = t1_ns;
	e->cat = cat;
	e->track = track;
	cohort__strlcpy(e->name, name, sizeof(e->name));
	if (detail != NULL)
		cohort__strlcpy(e->detail, detail, sizeof(e->detail));
	pthread_mutex_unlock(&tl->mtx);
}

bool
cohort__obs_timeline_on(const struct cohort__obs *o)
{
	return (o->tl != NULL);
}

void
cohort__obs_rtt(struct cohort__obs *o, uint64_t ns)
{
	if (o->metrics)
		obs_hist(&o->hb_rtt, ns);
}

/* ------------------------------------------------------------------------ */
/* RankMetrics for the heartbeat                                            */
/* ------------------------------------------------------------------------ */

static void
obs_fill_hist(
    struct cohort__obs_hist *h, Cohort__Histogram *m, uint64_t *buckets)
{
	cohort__histogram__init(m);
	for (unsigned i = 0; i < COHORT__OBS_NBUCKETS; i++)
		buckets[i]
		    = atomic_load_explicit(&h->b[i], memory_order_relaxed);
	m->buckets = buckets;
	m->n_buckets = COHORT__OBS_NBUCKETS;
	m->sum_ns = atomic_load_explicit(&h->sum_ns, memory_order_relaxed);
	m->count = atomic_load_explicit(&h->count, memory_order_relaxed);
}

bool
cohort__obs_fill(struct cohort__obs *o, struct cohort__obs_msg *msg)
{
	if (!o->metrics)
		return (false);
	cohort__rank_metrics__init(&msg->m);
	msg->m.ops = msg->opp;
	for (int k = 0; k < COHORT__OBS_NOPS; k++) {
		uint64_t n
		    = atomic_load_explicit(&o->count[k], memory_order_relaxed);
		Cohort__OpMetrics *om = &msg->ops[msg->m.n_ops];

		if (n == 0)
			continue;
		cohort__op_metrics__init(om);
		om->op = (char *)obs_names[k];
		om->count = n;
		om->errors = atomic_load_explicit(
		    &o->errors[k], memory_order_relaxed);
		om->bytes
		    = atomic_load_explicit(&o->bytes[k], memory_order_relaxed);
		om->time_ns = atomic_load_explicit(
		    &o->time_ns[k], memory_order_relaxed);
		om->wait_ns = atomic_load_explicit(
		    &o->wait_ns[k], memory_order_relaxed);
		msg->opp[msg->m.n_ops++] = om;
	}
	obs_fill_hist(&o->coll, &msg->h[0], msg->hb[0]);
	obs_fill_hist(&o->wait, &msg->h[1], msg->hb[1]);
	obs_fill_hist(&o->hb_rtt, &msg->h[2], msg->hb[2]);
	if (o->start_ns != 0)
		msg->m.elapsed_ns = cohort__now_ns() - o->start_ns;
	msg->m.collective_seconds = &msg->h[0];
	msg->m.wait_seconds = &msg->h[1];
	msg->m.heartbeat_rtt_seconds = &msg->h[2];
	return (true);
}

/* ------------------------------------------------------------------------ */
/* Writing the timeline                                                     */
/* ------------------------------------------------------------------------ */

static int
tl_cmp(const void *a, const void *b)
{
	const struct tl_event *x = a, *y = b;
	uint64_t dx = x->t1 > x->t0 ? x->t1 - x->t0 : 0;
	uint64_t dy = y->t1 > y->t0 ? y->t1 - y->t0 : 0;

	if (x->track != y->track)
		return (x->track < y->track ? -1 : 1);
	if (x->t0 != y->t0)
		return (x->t0 < y->t0 ? -1 : 1);
	/* same start: the enclosing (longer) one first */
	return (dx > dy ? -1 : dx < dy ? 1 : 0);
}

/* JSON string body. */
static void
tl_str(FILE *f, const char *s)
{
	for (; *s != '\0'; s++) {
		unsigned char c = (unsigned char)*s;

		if (c == '"' || c == '\\')
			fprintf(f, "\\%c", c);
		else if (c < 0x20)
			fprintf(f, "\\u%04x", c);
		else
			fputc(c, f);
	}
}

/* Microseconds with 3 decimals, integer arithmetic (no double rounding
 * at 1.7e15 us). */
static void
tl_us(FILE *f, const char *key, uint64_t ns)
{
	fprintf(f, ",\"%s\":%" PRIu64 ".%03u", key, ns / 1000,
	    (unsigned)(ns % 1000));
}

static void
tl_track_name(FILE *f, int pid, int tid, const char *name, bool *first)
{
	fprintf(f,
	    "%s{\"name\":\"thread_name\",\"ph\":\"M\",\"pid\":%d,"
	    "\"tid\":%d,\"args\":{\"name\":\"",
	    *first ? "" : ",\n", pid, tid);
	tl_str(f, name);
	fprintf(f, "\"}}");
	*first = false;
}

/* The timeline's name of each fixed track (the others: a group's). */
static const char *const tl_track_names[COHORT__TRACK_GROUPS] = {
	[COHORT__TRACK_WORLD] = "collectives",
	[COHORT__TRACK_CONTROL] = "control plane",
	[COHORT__TRACK_KV] = "key-value",
	[COHORT__TRACK_STRATEGY] = "strategy",
	[COHORT__TRACK_EVENTS] = "events",
};

static void
tl_write(struct cohort__tl *tl)
{
	struct tl_event *ev = malloc((tl->n ? tl->n : 1) * sizeof(*ev));
	size_t n = tl->n, start = (tl->head + tl->cap - tl->n) % tl->cap;
	char tmp[1100];
	bool first = true;
	int pid = tl->rank;
	int last_track = -1;
	FILE *f;

	if (ev == NULL)
		return;
	for (size_t i = 0; i < n; i++)
		ev[i] = tl->ev[(start + i) % tl->cap];
	qsort(ev, n, sizeof(*ev), tl_cmp);
	snprintf(tmp, sizeof(tmp), "%s.tmp", tl->path);
	if ((f = fopen(tmp, "w")) == NULL) {
		cohort__warn("COHORT_TIMELINE: cannot write %s", tmp);
		free(ev);
		return;
	}
	fprintf(f, "{\"traceEvents\":[\n");
	fprintf(f,
	    "{\"name\":\"process_name\",\"ph\":\"M\",\"pid\":%d,\"tid\":0,"
	    "\"args\":{\"name\":\"rank %d (",
	    pid, pid);
	tl_str(f, tl->host);
	fprintf(f, ":%d)\"}},\n", (int)getpid());
	fprintf(f,
	    "{\"name\":\"process_sort_index\",\"ph\":\"M\",\"pid\":%d,"
	    "\"tid\":0,\"args\":{\"sort_index\":%d}}",
	    pid, pid);
	first = false;
	for (size_t i = 0; i < n; i++) {
		const struct tl_event *e = &ev[i];
		uint64_t ts = e->t0 + (uint64_t)tl->off_ns;

		if (e->track != last_track) {
			char nm[64];
			last_track = e->track;
			if (e->track >= 0 && e->track < COHORT__TRACK_GROUPS
			    && tl_track_names[e->track] != NULL)
				snprintf(nm, sizeof(nm), "%s",
				    tl_track_names[e->track]);
			else
				snprintf(nm, sizeof(nm), "group %s",
				    e->group[0] ? e->group : "?");
			tl_track_name(f, pid, e->track, nm, &first);
		}
		fprintf(f, ",\n{\"name\":\"");
		tl_str(f, e->name);
		fprintf(f,
		    "\",\"cat\":\"%s\",\"ph\":\"%s\",\"pid\":%d,"
		    "\"tid\":%d",
		    e->cat, e->t1 == 0 ? "i" : "X", pid, (int)e->track);
		tl_us(f, "ts", ts);
		if (e->t1 == 0) {
			fprintf(f, ",\"s\":\"p\",\"args\":{\"detail\":\"");
			tl_str(f, e->detail);
			fprintf(f, "\"}}");
			continue;
		}
		tl_us(f, "dur", e->t1 - e->t0);
		fprintf(f, ",\"args\":{");
		if (e->backend != NULL) {
			fprintf(f, "\"seq\":%" PRIu64 ",\"group\":\"", e->seq);
			tl_str(f, e->group);
			fprintf(f, "\",\"bytes\":%" PRIu64, e->bytes);
			if (e->backend != NULL)
				fprintf(f, ",\"backend\":\"%s\"", e->backend);
			if (e->algo != NULL)
				fprintf(f, ",\"algorithm\":\"%s\"", e->algo);
			tl_us(f, "wait_us", e->wait);
			tl_us(f, "transfer_us",
			    (e->t1 - e->t0 > e->wait ? e->t1 - e->t0 - e->wait
			                             : 0));
			fprintf(f, ",\"status\":\"%s\"",
			    cohort_status_name((cohort_status)e->st));
			if (e->detail[0] != '\0') {
				fprintf(f, ",\"error\":\"");
				tl_str(f, e->detail);
				fprintf(f, "\"");
			}
		} else {
			fprintf(f, "\"bytes\":%" PRIu64, e->bytes);
			if (e->detail[0] != '\0') {
				fprintf(f, ",\"detail\":\"");
				tl_str(f, e->detail);
				fprintf(f, "\"");
			}
		}
		fprintf(f, "}}");
		/* Waiting for peers, as a slice inside the operation: its
		 * length is the total idle time, placed at the start (where
		 * a late peer is waited for). */
		if (e->wait >= 1000) {
			fprintf(f,
			    ",\n{\"name\":\"wait for peers\",\"cat\":\"wait\","
			    "\"ph\":\"X\",\"pid\":%d,\"tid\":%d",
			    pid, (int)e->track);
			tl_us(f, "ts", ts);
			tl_us(f, "dur",
			    e->wait < e->t1 - e->t0 ? e->wait : e->t1 - e->t0);
			fprintf(f, ",\"args\":{\"seq\":%" PRIu64 "}}", e->seq);
		}
	}
	fprintf(f,
	    "\n],\"displayTimeUnit\":\"ms\",\"otherData\":{\"rank\":%d,"
	    "\"world_size\":%d,\"events\":%zu,\"dropped_events\":%" PRIu64
	    "}}\n",
	    (int)tl->rank, (int)tl->world, n, tl->dropped);
	if (fclose(f) != 0 || rename(tmp, tl->path) != 0)
		cohort__warn("COHORT_TIMELINE: cannot write %s", tl->path);
	else
		cohort__info(
		    "timeline: %zu events written to %s", n, tl->path);
	free(ev);
}

void
cohort__obs_fini(struct cohort__obs *o)
{
	struct cohort__tl *tl = o->tl;

	if (tl == NULL)
		return;
	if (tl->started)
		tl_write(tl);
	pthread_mutex_destroy(&tl->mtx);
	free(tl->ev);
	free(tl);
	o->tl = NULL;
}

/* ------------------------------------------------------------------------ */
/* Public API (cohort.h)                                                    */
/* ------------------------------------------------------------------------ */

uint64_t
cohort_now_ns(void)
{
	return (cohort__now_ns());
}

void
cohort__obs_span(struct cohort__obs *obs, const char *name, uint64_t start_ns,
    uint64_t end_ns, uint64_t bytes)
{
	struct cohort__tl *tl;
	struct tl_event *e;

	if ((tl = obs->tl) == NULL || name == NULL)
		return;
	pthread_mutex_lock(&tl->mtx);
	e = tl_slot(tl);
	memset(e, 0, sizeof(*e));
	e->t0 = start_ns;
	e->t1 = end_ns != 0 && end_ns <= start_ns ? start_ns + 1 : end_ns;
	e->bytes = bytes;
	e->cat = "strategy";
	e->track = COHORT__TRACK_STRATEGY;
	cohort__strlcpy(e->name, name, sizeof(e->name));
	pthread_mutex_unlock(&tl->mtx);
}
