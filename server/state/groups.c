/*
 * groups.c - process groups of a job: the world group of a generation,
 * and groups created by their members (proto/README.md section 5). A
 * creation parks every arrival by group rank until the whole group has
 * asked for the same ranks; a disagreement answers COHORT_EMISMATCH.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "journal/log.h"
#include "groups.h"

static void group_withdraw(struct srv_call *c);
static void group_expire(struct srv_call *c, cohort__time now);
static void group_describe(const struct srv_call *c, char *buf, size_t len);
static void group_what(const struct srv_call *c, char *buf, size_t len,
    uint64_t *seq, const char **group);

/* A creation waits in g->arr by group rank. */
static const struct srv_park_ops group_park = { SRV_PARK_GROUP, group_withdraw,
	group_expire, group_describe, group_what };

static struct srv_group *
group_new(
    struct srv_job *job, const char *name, const int32_t *ranks, uint32_t n)
{
	struct srv_group *g = calloc(1, sizeof(*g));

	if (g == NULL)
		return (NULL);
	g->name = srv_strdup(name);
	g->ranks = malloc(sizeof(int32_t) * (n ? n : 1));
	g->grank_of = malloc(sizeof(int32_t) * job->world);
	g->arr = calloc(n ? n : 1, sizeof(*g->arr));
	if (g->name == NULL || g->ranks == NULL || g->grank_of == NULL
	    || g->arr == NULL)
		goto out_free;
	g->n = n;
	for (uint32_t r = 0; r < job->world; r++)
		g->grank_of[r] = -1;
	for (uint32_t i = 0; i < n; i++) {
		g->ranks[i] = ranks[i];
		g->grank_of[ranks[i]] = (int32_t)i;
	}
	if (srv_map_put(&job->groups, &g->hn, g->name, strlen(g->name))
	    != COHORT_OK)
		goto out_free;
	return (g);

out_free:
	COHORT__FREE_ALL(g->name, g->ranks, g->grank_of, g->arr, g);
	return (NULL);
}

void
srv_group_free(struct srv_job *job, struct srv_group *g)
{
	srv_map_del(&job->groups, &g->hn);
	COHORT__FREE_ALL(g->name, g->ranks, g->grank_of, g->arr, g);
}

cohort_status
srv_group_world(struct srv_job *job)
{
	int32_t *r = malloc(sizeof(int32_t) * job->world);
	struct srv_group *g;

	if (r == NULL)
		return (COHORT_ENOMEM);
	for (uint32_t i = 0; i < job->world; i++)
		r[i] = (int32_t)i;
	g = group_new(job, "", r, job->world);
	free(r);
	if (g == NULL)
		return (COHORT_ENOMEM);
	g->complete = true;
	return (COHORT_OK);
}

struct srv_group *
srv_group_find(struct srv_job *job, const char *name)
{
	struct srv_hnode *n = srv_map_get(&job->groups, name, strlen(name));

	return (n ? SRV_CONTAINER(n, struct srv_group, hn) : NULL);
}

/* EPEERLOST because rank left the job and op waits for it. */
void
srv_group_answer_left(struct srv_call *c, int32_t rank, const char *what)
{
	struct srv_job *job = c->job;
	const struct srv_member *m = &job->members[rank];
	Cohort__Reply rep;
	Cohort__Failure f = COHORT__FAILURE__INIT;
	char buf[768];

	snprintf(buf, sizeof(buf),
	    "rank %d (%s:%u) left job '%s'; %s cannot complete", rank, m->host,
	    m->pid, job->name, what);
	srv_reply_init(&rep, c, COHORT_EPEERLOST);
	rep.failed_rank = rank;
	rep.failed_text = "left the job";
	rep.error = buf;
	f.kind = COHORT__FAILURE_KIND__FAILURE_LEFT;
	f.rank = rank;
	f.host = (char *)m->host;
	f.pid = m->pid;
	f.operation = (char *)what;
	f.text = "left the job";
	rep.failure = &f;
	srv_call_answer(c, &rep, NULL, 0);
}

static void
group_answer(struct srv_call *c, struct srv_group *g)
{
	Cohort__Reply rep;
	Cohort__GroupCreateReply gr;

	srv_reply_init(&rep, c, COHORT_OK);
	cohort__group_create_reply__init(&gr);
	gr.group = g->name;
	gr.group_rank = g->grank_of[c->rank];
	gr.group_size = g->n;
	rep.body_case = COHORT__REPLY__BODY_GROUP_CREATE;
	rep.group_create = &gr;
	srv_call_answer(c, &rep, NULL, 0);
}

static bool
group_same(const struct srv_group *g, const int32_t *ranks, size_t n)
{
	return (
	    g->n == n && memcmp(g->ranks, ranks, n * sizeof(int32_t)) == 0);
}

void
srv_group_create(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	struct srv_job *job = c->job;
	const struct srv_member *m = c->client->member;
	const Cohort__GroupCreate *gc = req->group_create;
	struct srv_group *g;
	uint8_t *seen;
	int32_t grank = -1;
	char a[512], b[512];

	if (gc->name[0] == '\0' || strlen(gc->name) > SRV_MAX_NAME) {
		srv_call_fail(c, COHORT_EINVAL,
		    "group name must be 1..%d bytes (\"\" is the world)",
		    SRV_MAX_NAME);
		return;
	}
	if (gc->n_ranks == 0 || gc->n_ranks > job->world) {
		srv_call_fail(c, COHORT_EINVAL,
		    "group '%s' lists %zu ranks; it needs 1..%u", gc->name,
		    gc->n_ranks, job->world);
		return;
	}
	if ((seen = calloc(job->world, 1)) == NULL) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	for (size_t i = 0; i < gc->n_ranks; i++) {
		int32_t r = gc->ranks[i];
		if (r < 0 || (uint32_t)r >= job->world || seen[r]) {
			free(seen);
			srv_call_fail(c, COHORT_EINVAL,
			    "group '%s': rank %d is %s", gc->name, r,
			    (r < 0 || (uint32_t)r >= job->world)
			        ? "out of range"
			        : "listed twice");
			return;
		}
		seen[r] = 1;
		if (r == m->rank)
			grank = (int32_t)i;
	}
	free(seen);
	if (grank < 0) {
		srv_call_fail(c, COHORT_EINVAL,
		    "rank %d asked to create group '%s' without being in it",
		    m->rank, gc->name);
		return;
	}
	c->rank = m->rank;
	c->grank = grank;
	g = srv_group_find(job, gc->name);
	if (g != NULL && g->complete) {
		if (group_same(g, gc->ranks, gc->n_ranks)) {
			group_answer(c, g);
			return;
		}
		srv_fmt_ranks(a, sizeof(a), g->ranks, g->n);
		srv_call_fail(c, COHORT_EEXIST,
		    "group '%s' already exists with ranks %s", gc->name, a);
		return;
	}
	for (size_t i = 0; i < gc->n_ranks; i++) {
		int32_t r = gc->ranks[i];
		if (job->members[r].state == SRV_MEMBER_LEFT) {
			char what[300];
			snprintf(what, sizeof(what), "creation of group '%s'",
			    gc->name);
			srv_group_answer_left(c, r, what);
			return;
		}
	}
	if (g != NULL && !group_same(g, gc->ranks, gc->n_ranks)) {
		srv_fmt_ranks(a, sizeof(a), g->ranks, g->n);
		srv_fmt_ranks(b, sizeof(b), gc->ranks, gc->n_ranks);
		char detail[1200];
		snprintf(detail, sizeof(detail),
		    "group '%s': earlier ranks asked for ranks [%s], rank %d "
		    "asked for [%s]",
		    gc->name, a, m->rank, b);
		for (uint32_t i = 0; i < g->n; i++) {
			struct srv_call *p = g->arr[i];
			if (p == NULL)
				continue;
			g->arr[i] = NULL;
			srv_call_fail(p, COHORT_EMISMATCH, "%s", detail);
		}
		srv_group_free(job, g);
		srv_call_fail(c, COHORT_EMISMATCH, "%s", detail);
		return;
	}
	if (g == NULL) {
		g = group_new(job, gc->name, gc->ranks, (uint32_t)gc->n_ranks);
		if (g == NULL) {
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return;
		}
		g->first = now;
	} else if (g->arr[grank] != NULL) {
		srv_call_fail(c, COHORT_EINVAL,
		    "rank %d asked to create group '%s' twice", m->rank,
		    gc->name);
		return;
	}
	g->arr[grank] = c;
	g->narr++;
	c->owner = g;
	srv_call_park(c, &group_park);
	if (g->narr < g->n)
		return;
	g->complete = true;
	srv_jrn_group(job->core->jrn, &job->jr, g->name, g->n, g->ranks);
	for (uint32_t i = 0; i < g->n; i++) {
		struct srv_call *p = g->arr[i];
		g->arr[i] = NULL;
		group_answer(p, g);
	}
	g->narr = 0;
}

static void
group_withdraw(struct srv_call *c)
{
	struct srv_group *g = c->owner;

	g->arr[c->grank] = NULL;
	g->narr--;
	c->owner = NULL;
	if (g->narr == 0 && !g->complete)
		srv_group_free(c->job, g);
}

static void
group_expire(struct srv_call *c, cohort__time now)
{
	struct srv_group *g = c->owner;
	int32_t *miss = calloc(g->n + 1, sizeof(int32_t));
	size_t nm = 0, off = 0;
	char what[SRV_MAX_NAME + 32], buf[1024];

	for (uint32_t i = 0; miss != NULL && i < g->n; i++)
		if (g->arr[i] == NULL)
			miss[nm++] = g->ranks[i];
	snprintf(what, sizeof(what), "creation of group '%s'", g->name);
	srv_fmt_never_arrived(
	    buf, sizeof(buf), &off, what, now - c->start, miss, nm);
	srv_call_timed_out(c, now, buf, miss, nm);
}

static void
group_describe(const struct srv_call *c, char *buf, size_t len)
{
	const struct srv_group *g = c->owner;

	snprintf(buf, len, "creation of group '%s'", g->name);
}

static void
group_what(const struct srv_call *c, char *buf, size_t len, uint64_t *seq,
    const char **group)
{
	group_describe(c, buf, len);
	*seq = 0;
	*group = "";
}

void
srv_end_calls(struct srv_call **calls, uint32_t n, const struct srv_end *e)
{
	for (uint32_t k = 0; k < n; k++) {
		struct srv_call *c = calls[k];
		if (c == NULL)
			continue;
		calls[k] = NULL;
		c->owner = NULL;
		if (e->left >= 0)
			srv_group_answer_left(c, e->left, e->what);
		else if (e->st == COHORT_EPEERLOST)
			srv_call_peerlost(c);
		else if (e->st == COHORT_EMEMBERSHIP)
			srv_call_membership(c);
		else
			srv_call_fail(c, e->st, "%s", e->why);
	}
}

void
srv_group_end(
    struct srv_job *job, struct srv_group *g, const struct srv_end *e)
{
	srv_end_calls(g->arr, g->n, e);
	srv_group_free(job, g);
}

/* g's members through old2new, in their old order, over a new world;
 * false (g unchanged) when out of memory. */
static bool
group_remap(struct srv_group *g, const int32_t *old2new, uint32_t old_world,
    uint32_t new_world, bool world)
{
	int32_t *ranks = malloc(sizeof(int32_t) * (new_world ? new_world : 1));
	int32_t *of = malloc(sizeof(int32_t) * (new_world ? new_world : 1));
	uint32_t n = 0;

	if (ranks == NULL || of == NULL) {
		free(ranks);
		free(of);
		return (false);
	}
	if (world) {
		for (uint32_t r = 0; r < new_world; r++)
			ranks[n++] = (int32_t)r;
	} else {
		for (uint32_t i = 0; i < g->n; i++) {
			int32_t o = g->ranks[i];
			if (o >= 0 && (uint32_t)o < old_world
			    && old2new[o] >= 0)
				ranks[n++] = old2new[o];
		}
	}
	for (uint32_t r = 0; r < new_world; r++)
		of[r] = -1;
	for (uint32_t i = 0; i < n; i++)
		of[ranks[i]] = (int32_t)i;
	free(g->ranks);
	free(g->grank_of);
	g->ranks = ranks;
	g->grank_of = of;
	g->n = n;
	/* a group's arrivals array is sized by its members */
	free(g->arr);
	g->arr = calloc(n ? n : 1, sizeof(*g->arr));
	g->narr = 0;
	return (g->arr != NULL);
}

cohort_status
srv_group_carry(struct srv_job *job, const int32_t *old2new,
    uint32_t old_world, uint32_t new_world)
{
	struct srv_hnode *n, *next;
	cohort_status rv = COHORT_OK;
	size_t i;

	for (n = srv_map_next(&job->groups, &i, NULL); n != NULL; n = next) {
		struct srv_group *g = SRV_CONTAINER(n, struct srv_group, hn);
		bool world = g->name[0] == '\0';
		next = srv_map_next(&job->groups, &i, n);
		COHORT__ASSERT(g->complete && g->narr == 0);
		if (!world
		    && strncmp(g->name, SRV_GROUP_STATE_PREFIX,
		           strlen(SRV_GROUP_STATE_PREFIX))
		        == 0) {
			srv_group_free(job, g);
			continue;
		}
		if (!group_remap(g, old2new, old_world, new_world, world)) {
			rv = COHORT_ENOMEM;
			srv_group_free(job, g);
			continue;
		}
		if (g->n == 0)
			srv_group_free(job, g);
	}
	if (srv_group_find(job, "") == NULL && rv == COHORT_OK)
		rv = srv_group_world(job);
	return (rv);
}

cohort_status
srv_group_restore(
    struct srv_job *job, const char *name, const int32_t *ranks, uint32_t n)
{
	struct srv_group *g;

	if (job->members == NULL || n == 0 || n > job->world)
		return (COHORT_EPROTO);
	if ((g = srv_group_find(job, name)) != NULL)
		srv_group_free(job, g);
	for (uint32_t i = 0; i < n; i++)
		if (ranks[i] < 0 || (uint32_t)ranks[i] >= job->world)
			return (COHORT_EPROTO);
	if ((g = group_new(job, name, ranks, n)) == NULL)
		return (COHORT_ENOMEM);
	g->complete = true;
	return (COHORT_OK);
}
