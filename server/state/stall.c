/*
 * stall.c - live hang attribution: a collective parked longer than
 * --stall-threshold, or a data-plane operation the heartbeats report
 * some ranks in for that long, is logged once (and counted) with the
 * ranks that have not entered it and what each of them is doing.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "coll.h"
#include "groups.h"
#include "stall.h"

/* "; rank 5 is in allreduce #812 since 63.2 s, rank 7 last seen ..." for
 * the members of g with entered[i] == 0. */
static void
stall_missing(const struct srv_job *job, const struct srv_group *g,
    const uint8_t *entered, cohort__time now, char *buf, size_t len,
    size_t *off)
{
	int32_t *miss = malloc(sizeof(int32_t) * (g->n ? g->n : 1));
	char rb[512], doing[800];
	size_t nm = 0;

	if (miss == NULL)
		return;
	for (uint32_t i = 0; i < g->n; i++)
		if (!entered[i])
			miss[nm++] = g->ranks[i];
	if (nm == 0) {
		cohort__appendf(buf, len, off,
		    ": every rank entered it (the transport is not "
		    "completing it)");
		free(miss);
		return;
	}
	srv_fmt_ranks(rb, sizeof(rb), miss, nm);
	cohort__appendf(buf, len, off, ": rank%s %s %s not entered",
	    nm == 1 ? "" : "s", rb, nm == 1 ? "has" : "have");
	for (size_t i = 0; i < nm && i < 8; i++) {
		srv_member_doing(
		    &job->members[miss[i]], now, true, doing, sizeof(doing));
		cohort__appendf(
		    buf, len, off, "%s%s", i == 0 ? "; " : ", ", doing);
	}
	if (nm > 8)
		cohort__appendf(buf, len, off, ", ...");
	free(miss);
}

void
srv_stall_text(
    const struct srv_coll *co, cohort__time now, char *buf, size_t len)
{
	char secs[32];
	size_t off;

	srv_coll_desc_text(&co->cd, buf, len);
	off = strlen(buf);
	srv_fmt_secs(secs, sizeof(secs), now - co->first);
	cohort__appendf(buf, len, &off,
	    " (#%" PRIu64 ") on group '%s' "
	    "waiting %s",
	    co->op_seq, co->g->name, secs);
	stall_missing(co->job, co->g, co->arrived, now, buf, len, &off);
}

bool
srv_stall_coll(const struct srv_coll *co, cohort__time now)
{
	return (co->mismatch == NULL && co->nparked > 0
	    && now - co->first > co->job->core->stall_ms);
}

/* A control-plane collective as the client names it in heartbeats: it
 * is numbered by its own op_seq, not comparable with data-plane ones. */
static bool
op_is_control(const char *name)
{
	return (strcmp(name, "barrier") == 0
	    || strcmp(name, "broadcast_obj") == 0
	    || strcmp(name, "reduce_scalars") == 0
	    || strcmp(name, "decide") == 0);
}

/* m reports being in (last_group, last_op_seq) on the data plane. */
static bool
member_in_data_op(const struct srv_member *m)
{
	return (m->state == SRV_MEMBER_RUNNING && m->in_op
	    && m->last_op[0] != '\0' && !op_is_control(m->last_op)
	    && srv_member_parked_op(m) == NULL);
}

void
srv_stall_data(struct srv_job *job, cohort__time now,
    void (*fn)(void *arg, const struct srv_member *m,
        const struct srv_group *g, const uint8_t *entered, const char *text),
    void *arg)
{
	cohort__time thr = job->core->stall_ms;

	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		struct srv_member *m = &job->members[r];
		struct srv_group *g;
		cohort__time first;
		uint8_t *entered;
		char buf[2400], secs[32];
		size_t off = 0;
		bool leader = true;

		if (!member_in_data_op(m) || now - m->op_since <= thr)
			continue;
		g = srv_group_find(job, m->last_group);
		if (g == NULL || !g->complete || g->grank_of[r] < 0)
			continue;
		if ((entered = calloc(g->n ? g->n : 1, 1)) == NULL)
			return;
		first = m->op_since;
		for (uint32_t i = 0; i < g->n; i++) {
			const struct srv_member *o
			    = &job->members[g->ranks[i]];
			bool same = strcmp(o->last_group, m->last_group) == 0;
			if (same && member_in_data_op(o)
			    && o->last_op_seq == m->last_op_seq) {
				entered[i] = 1;
				if (g->ranks[i] < m->rank)
					leader = false;
				if (o->op_since < first)
					first = o->op_since;
			} else if (same && !op_is_control(o->last_op)
			    && o->last_op_seq > m->last_op_seq) {
				entered[i] = 1; /* already past it */
			}
		}
		if (leader) {
			srv_fmt_secs(secs, sizeof(secs), now - first);
			cohort__appendf(buf, sizeof(buf), &off,
			    "%s #%" PRIu64 " on group '%s' waiting %s",
			    m->last_op, m->last_op_seq, g->name, secs);
			stall_missing(
			    job, g, entered, now, buf, sizeof(buf), &off);
			fn(arg, m, g, entered, buf);
		}
		free(entered);
	}
}

static void
stall_log_data(void *arg, const struct srv_member *cm,
    const struct srv_group *g, const uint8_t *entered, const char *text)
{
	struct srv_job *job = arg;
	struct srv_member *m = &job->members[cm->rank];

	(void)g;
	(void)entered;
	if (m->stall_logged == m->last_op_seq + 1)
		return;
	m->stall_logged = m->last_op_seq + 1;
	job->core->m.stalls++;
	cohort__warn("job '%s' generation %" PRIu64 ": stall: %s", job->name,
	    job->generation, text);
}

void
srv_stall_check(struct srv_job *job, cohort__time now)
{
	struct srv_hnode *n;
	size_t i;
	char buf[2400];

	if (job->state != SRV_JOB_RUNNING)
		return;
	for (n = srv_map_next(&job->colls, &i, NULL); n != NULL;
	     n = srv_map_next(&job->colls, &i, n)) {
		struct srv_coll *co = SRV_CONTAINER(n, struct srv_coll, hn);
		if (co->stall_logged || !srv_stall_coll(co, now))
			continue;
		co->stall_logged = true;
		job->core->m.stalls++;
		srv_stall_text(co, now, buf, sizeof(buf));
		cohort__warn("job '%s' generation %" PRIu64 ": stall: %s",
		    job->name, job->generation, buf);
	}
	srv_stall_data(job, now, stall_log_data, job);
}

static void
stall_count(void *arg, const struct srv_member *m, const struct srv_group *g,
    const uint8_t *entered, const char *text)
{
	(void)m;
	(void)g;
	(void)entered;
	(void)text;
	(*(uint64_t *)arg)++;
}

uint64_t
srv_stall_count(struct srv_core *core, cohort__time now)
{
	struct srv_hnode *jn, *n;
	size_t i, k;
	uint64_t cnt = 0;

	for (jn = srv_map_next(&core->jobs, &i, NULL); jn != NULL;
	     jn = srv_map_next(&core->jobs, &i, jn)) {
		struct srv_job *job = SRV_CONTAINER(jn, struct srv_job, hn);
		if (job->state != SRV_JOB_RUNNING)
			continue;
		for (n = srv_map_next(&job->colls, &k, NULL); n != NULL;
		     n = srv_map_next(&job->colls, &k, n))
			if (srv_stall_coll(
			        SRV_CONTAINER(n, struct srv_coll, hn), now))
				cnt++;
		srv_stall_data(job, now, stall_count, &cnt);
	}
	return (cnt);
}
