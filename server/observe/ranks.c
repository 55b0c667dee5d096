/*
 * ranks.c - per-rank metrics reported by the workers (RankMetrics on
 * their heartbeats and Leave, proto/cohort.proto) and their /metrics text
 * with `job` and `rank` labels (docs/observability.md).
 *
 * One entry per (job, rank), kept after the job ends so that a scrape
 * after a short job still sees it. Cardinality is bounded by
 * --metrics-max-ranks (srv_obs_set_max): when full, a new (job, rank)
 * evicts the entry updated least recently (counted in
 * cohort_rank_metrics_evicted_total); 0 keeps none. Each entry exposes at
 * most COHORT__OBS_MAX_OPS operation kinds and three histograms.
 *
 * Every label set is written by obs_labels, the one place that decides
 * which labels a per-rank series carries.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "obs.h"
#include "sha256.h"
#include "core/util.h"
#include "state/job.h"
#include "ranks.h"

#define OBS_MAX_OPS 16
#define OBS_OPNAME 32
#define OBS_DEFAULT_MAX 512

struct obs_op {
	char name[OBS_OPNAME];
	uint64_t count, errors, bytes, time_ns, wait_ns;
};

struct obs_hist {
	bool set;
	uint64_t b[COHORT__OBS_NBUCKETS];
	uint64_t sum_ns, count;
};

struct obs_rank {
	struct srv_hnode hn;
	char *key; /* job '\0' rank (4 bytes) */
	size_t klen;
	const char *job; /* in key */
	int32_t rank;
	cohort__time updated;
	struct obs_op ops[OBS_MAX_OPS];
	unsigned nops;
	struct obs_hist h[3];
};

struct srv_obs {
	struct srv_map ranks;
	size_t max;
	uint64_t evicted;
};

static struct srv_obs *
obs_get(struct srv_core *core)
{
	if (core->obs == NULL) {
		if ((core->obs = calloc(1, sizeof(*core->obs))) == NULL)
			return (NULL);
		srv_map_init(&core->obs->ranks);
		core->obs->max = OBS_DEFAULT_MAX;
	}
	return (core->obs);
}

static void
obs_free_rank(struct obs_rank *r)
{
	free(r->key);
	free(r);
}

void
srv_obs_set_max(struct srv_core *core, size_t max)
{
	struct srv_obs *o = obs_get(core);

	if (o != NULL)
		o->max = max;
}

void
srv_obs_free(struct srv_core *core)
{
	struct srv_obs *o = core->obs;
	struct srv_hnode *n, *next;
	size_t i;

	if (o == NULL)
		return;
	for (n = srv_map_next(&o->ranks, &i, NULL); n != NULL; n = next) {
		next = srv_map_next(&o->ranks, &i, n);
		srv_map_del(&o->ranks, n);
		obs_free_rank(SRV_CONTAINER(n, struct obs_rank, hn));
	}
	srv_map_fini(&o->ranks);
	free(o);
	core->obs = NULL;
}

/* Evicts the entry updated least recently. */
static void
obs_evict(struct srv_obs *o)
{
	struct srv_hnode *n, *old = NULL;
	cohort__time t = 0;
	size_t i;

	for (n = srv_map_next(&o->ranks, &i, NULL); n != NULL;
	     n = srv_map_next(&o->ranks, &i, n)) {
		struct obs_rank *r = SRV_CONTAINER(n, struct obs_rank, hn);
		if (old == NULL || r->updated < t) {
			old = n;
			t = r->updated;
		}
	}
	if (old != NULL) {
		srv_map_del(&o->ranks, old);
		obs_free_rank(SRV_CONTAINER(old, struct obs_rank, hn));
		o->evicted++;
	}
}

static bool
obs_opname_ok(const char *s)
{
	size_t n = strlen(s);

	if (n == 0 || n >= OBS_OPNAME)
		return (false);
	for (; *s != '\0'; s++)
		if (!((*s >= 'a' && *s <= 'z') || *s == '_'))
			return (false);
	return (true);
}

static void
obs_hist_copy(struct obs_hist *h, const Cohort__Histogram *m)
{
	if (m == NULL || m->n_buckets != COHORT__OBS_NBUCKETS)
		return;
	memcpy(h->b, m->buckets, sizeof(h->b));
	h->sum_ns = m->sum_ns;
	h->count = m->count;
	h->set = true;
}

void
srv_obs_note(struct srv_core *core, const char *job, int32_t rank,
    const Cohort__RankMetrics *m, cohort__time now)
{
	struct srv_obs *o = obs_get(core);
	struct obs_rank *r;
	struct srv_hnode *n;
	char key[SRV_MAX_NAME + 8];
	size_t jl = strlen(job), klen = jl + 1 + sizeof(int32_t);

	if (o == NULL || m == NULL || o->max == 0 || jl > SRV_MAX_NAME)
		return;
	memcpy(key, job, jl + 1);
	memcpy(key + jl + 1, &rank, sizeof(rank));
	if ((n = srv_map_get(&o->ranks, key, klen)) != NULL) {
		r = SRV_CONTAINER(n, struct obs_rank, hn);
	} else {
		while (o->ranks.n >= o->max)
			obs_evict(o);
		if ((r = calloc(1, sizeof(*r))) == NULL
		    || (r->key = malloc(klen)) == NULL) {
			free(r);
			return;
		}
		memcpy(r->key, key, klen);
		r->klen = klen;
		r->job = r->key;
		r->rank = rank;
		if (srv_map_put(&o->ranks, &r->hn, r->key, klen)
		    != COHORT_OK) {
			obs_free_rank(r);
			return;
		}
	}
	r->updated = now;
	/* Cumulative values: the latest report replaces the previous. */
	for (size_t i = 0; i < m->n_ops; i++) {
		const Cohort__OpMetrics *om = m->ops[i];
		struct obs_op *op = NULL;

		if (om == NULL || !obs_opname_ok(om->op))
			continue;
		for (unsigned k = 0; k < r->nops; k++)
			if (strcmp(r->ops[k].name, om->op) == 0)
				op = &r->ops[k];
		if (op == NULL) {
			if (r->nops == OBS_MAX_OPS)
				continue;
			op = &r->ops[r->nops++];
			cohort__strlcpy(op->name, om->op, sizeof(op->name));
		}
		op->count = om->count;
		op->errors = om->errors;
		op->bytes = om->bytes;
		op->time_ns = om->time_ns;
		op->wait_ns = om->wait_ns;
	}
	obs_hist_copy(&r->h[0], m->collective_seconds);
	obs_hist_copy(&r->h[1], m->wait_seconds);
	obs_hist_copy(&r->h[2], m->heartbeat_rtt_seconds);
}

bool
srv_obs_totals(struct srv_core *core, const char *job, int32_t rank,
    uint64_t *count, uint64_t *bytes, uint64_t *time_ns, uint64_t *wait_ns)
{
	struct srv_obs *o = core->obs;
	char key[SRV_MAX_NAME + 8];
	size_t jl = strlen(job);
	struct srv_hnode *n;
	struct obs_rank *r;

	*count = *bytes = *time_ns = *wait_ns = 0;
	if (o == NULL || jl > SRV_MAX_NAME)
		return (false);
	memcpy(key, job, jl + 1);
	memcpy(key + jl + 1, &rank, sizeof(rank));
	if ((n = srv_map_get(&o->ranks, key, jl + 1 + sizeof(rank))) == NULL)
		return (false);
	r = SRV_CONTAINER(n, struct obs_rank, hn);
	for (unsigned k = 0; k < r->nops; k++) {
		*count += r->ops[k].count;
		*bytes += r->ops[k].bytes;
		*time_ns += r->ops[k].time_ns;
		*wait_ns += r->ops[k].wait_ns;
	}
	return (true);
}

/* ------------------------------------------------------------------------ */
/* Text                                                                     */
/* ------------------------------------------------------------------------ */

struct obs_buf {
	char *p;
	size_t cap, off;
	bool oom;
	bool job_names; /* --metrics-per-job: job="NAME", else a digest */
};

static void obs_printf(struct obs_buf *b, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
obs_printf(struct obs_buf *b, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (b->oom)
		return;
	for (;;) {
		va_start(ap, fmt);
		n = vsnprintf(b->p + b->off, b->cap - b->off, fmt, ap);
		va_end(ap);
		if (n < 0) {
			b->oom = true;
			return;
		}
		if ((size_t)n < b->cap - b->off) {
			b->off += (size_t)n;
			return;
		}
		{
			size_t cap = (b->cap + (size_t)n) * 2;
			char *np = realloc(b->p, cap);
			if (np == NULL) {
				b->oom = true;
				return;
			}
			b->p = np;
			b->cap = cap;
		}
	}
}

/* The labels of a per-rank series: job="...",rank="N". The one place
 * that decides them. Job names are shown only with --metrics-per-job
 * (docs/security.md: /metrics is often scraped without credentials);
 * otherwise the job is "#" and 16 hex digits of SHA-256 of its name,
 * which tells jobs apart and which whoever knows a name can compute. */
static void
obs_labels(struct obs_buf *b, const struct obs_rank *r)
{
	if (!b->job_names) {
		struct cohort__sha256 h;
		uint8_t d[32];

		cohort__sha256_init(&h);
		cohort__sha256_update(&h, r->job, strlen(r->job));
		cohort__sha256_final(&h, d);
		obs_printf(b, "job=\"#");
		for (int i = 0; i < 8; i++)
			obs_printf(b, "%02x", d[i]);
		obs_printf(b, "\",rank=\"%d\"", (int)r->rank);
		return;
	}
	obs_printf(b, "job=\"");
	for (const char *s = r->job; *s != '\0'; s++) {
		if (*s == '\\' || *s == '"')
			obs_printf(b, "\\%c", *s);
		else if (*s == '\n')
			obs_printf(b, "\\n");
		else
			obs_printf(b, "%c", *s);
	}
	obs_printf(b, "\",rank=\"%d\"", (int)r->rank);
}

static void
obs_secs(struct obs_buf *b, uint64_t ns)
{
	obs_printf(
	    b, "%" PRIu64 ".%09" PRIu64, ns / 1000000000u, ns % 1000000000u);
}

enum obs_field { F_COUNT, F_ERRORS, F_BYTES, F_TIME, F_WAIT };

static void
obs_op_family(struct obs_buf *b, struct srv_obs *o, const char *name,
    const char *help, enum obs_field f)
{
	struct srv_hnode *n;
	size_t i;

	obs_printf(b, "# HELP cohort_%s %s\n# TYPE cohort_%s counter\n", name,
	    help, name);
	for (n = srv_map_next(&o->ranks, &i, NULL); n != NULL;
	     n = srv_map_next(&o->ranks, &i, n)) {
		struct obs_rank *r = SRV_CONTAINER(n, struct obs_rank, hn);
		for (unsigned k = 0; k < r->nops; k++) {
			const struct obs_op *op = &r->ops[k];
			obs_printf(b, "cohort_%s{", name);
			obs_labels(b, r);
			obs_printf(b, ",op=\"%s\"} ", op->name);
			switch (f) {
			case F_COUNT:
				obs_printf(b, "%" PRIu64, op->count);
				break;
			case F_ERRORS:
				obs_printf(b, "%" PRIu64, op->errors);
				break;
			case F_BYTES:
				obs_printf(b, "%" PRIu64, op->bytes);
				break;
			case F_TIME:
				obs_secs(b, op->time_ns);
				break;
			case F_WAIT:
				obs_secs(b, op->wait_ns);
				break;
			}
			obs_printf(b, "\n");
		}
	}
}

static void
obs_hist_family(struct obs_buf *b, struct srv_obs *o, unsigned which,
    const char *name, const char *help)
{
	struct srv_hnode *n;
	size_t i;

	obs_printf(b, "# HELP cohort_%s %s\n# TYPE cohort_%s histogram\n",
	    name, help, name);
	for (n = srv_map_next(&o->ranks, &i, NULL); n != NULL;
	     n = srv_map_next(&o->ranks, &i, n)) {
		struct obs_rank *r = SRV_CONTAINER(n, struct obs_rank, hn);
		const struct obs_hist *h = &r->h[which];
		uint64_t cum = 0;

		if (!h->set)
			continue;
		for (unsigned k = 0; k < COHORT__OBS_NBUCKETS; k++) {
			uint64_t bound = cohort__obs_bound(k);
			cum += h->b[k];
			obs_printf(b, "cohort_%s_bucket{", name);
			obs_labels(b, r);
			if (bound == UINT64_MAX) {
				obs_printf(b, ",le=\"+Inf\"} %" PRIu64 "\n",
				    h->count > cum ? h->count : cum);
				continue;
			}
			obs_printf(b, ",le=\"%g\"} %" PRIu64 "\n",
			    (double)bound / 1e9, cum);
		}
		obs_printf(b, "cohort_%s_sum{", name);
		obs_labels(b, r);
		obs_printf(b, "} ");
		obs_secs(b, h->sum_ns);
		obs_printf(b, "\ncohort_%s_count{", name);
		obs_labels(b, r);
		obs_printf(
		    b, "} %" PRIu64 "\n", h->count > cum ? h->count : cum);
	}
}

/* How long each running member has been in its current collective (from
 * its heartbeats; 0 when in none): the ranks the others wait for show 0
 * while the others grow. At most o->max series. */
static void
obs_in_op_family(struct obs_buf *b, struct srv_core *core,
    const struct srv_obs *o, cohort__time now)
{
	struct srv_hnode *n;
	size_t i, k = 0;

	obs_printf(b,
	    "# HELP cohort_rank_in_collective_seconds How long a running "
	    "rank has been in its current collective (0: in none).\n"
	    "# TYPE cohort_rank_in_collective_seconds gauge\n");
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL && k < o->max;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		for (uint32_t r = 0;
		     job->members != NULL && r < job->world && k < o->max;
		     r++) {
			const struct srv_member *m = &job->members[r];
			struct obs_rank lr;
			if (m->state != SRV_MEMBER_RUNNING)
				continue;
			lr.job = job->name;
			lr.rank = m->rank;
			obs_printf(b, "cohort_rank_in_collective_seconds{");
			obs_labels(b, &lr);
			obs_printf(b, "} ");
			obs_secs(b,
			    m->in_op && now > m->op_since
			        ? (uint64_t)(now - m->op_since) * 1000000u
			        : 0);
			obs_printf(b, "\n");
			k++;
		}
	}
}

char *
srv_obs_metrics(
    struct srv_core *core, char *head, size_t headlen, cohort__time now)
{
	struct srv_obs *o = obs_get(core);
	struct obs_buf b = { NULL, 0, 0, false, core->metrics_jobs };

	obs_printf(&b, "%.*s", (int)headlen, head);
	obs_printf(&b,
	    "# HELP cohort_build_info cohortd's version (value 1).\n"
	    "# TYPE cohort_build_info gauge\n"
	    "cohort_build_info{version=\"%s\",proto_version=\"%d\"} 1\n",
	    COHORT_VERSION_STRING, COHORT_PROTO_VERSION);
	if (o == NULL)
		goto out;
	obs_printf(&b,
	    "# HELP cohort_rank_metrics_ranks (job, rank) pairs with "
	    "per-rank series (at most --metrics-max-ranks).\n"
	    "# TYPE cohort_rank_metrics_ranks gauge\n"
	    "cohort_rank_metrics_ranks %zu\n"
	    "# HELP cohort_rank_metrics_evicted_total (job, rank) pairs "
	    "dropped to stay within --metrics-max-ranks.\n"
	    "# TYPE cohort_rank_metrics_evicted_total counter\n"
	    "cohort_rank_metrics_evicted_total %" PRIu64 "\n",
	    o->ranks.n, o->evicted);
	if (o->max > 0)
		obs_in_op_family(&b, core, o, now);
	if (o->ranks.n == 0)
		goto out;
	obs_op_family(&b, o, "rank_collectives_total",
	    "Collectives a rank issued (data and control plane), by op.",
	    F_COUNT);
	obs_op_family(&b, o, "rank_collective_errors_total",
	    "Collectives of a rank that failed, by op.", F_ERRORS);
	obs_op_family(&b, o, "rank_collective_bytes_total",
	    "Payload bytes of a rank's collectives, by op.", F_BYTES);
	obs_op_family(&b, o, "rank_collective_seconds_total",
	    "Time a rank spent in collectives, by op.", F_TIME);
	obs_op_family(&b, o, "rank_wait_seconds_total",
	    "Time a rank spent in collectives waiting for peers, by op.",
	    F_WAIT);
	obs_hist_family(&b, o, 0, "rank_collective_duration_seconds",
	    "Duration of a rank's collectives.");
	obs_hist_family(&b, o, 1, "rank_wait_duration_seconds",
	    "Time a rank's collectives waited for peers.");
	obs_hist_family(&b, o, 2, "rank_heartbeat_rtt_seconds",
	    "Round trip of a rank's heartbeats to cohortd.");
out:
	if (b.oom) {
		free(b.p);
		return (NULL);
	}
	return (b.p);
}
