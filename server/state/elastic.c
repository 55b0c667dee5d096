/*
 * elastic.c - elastic membership (proto/README.md section 8): joiners,
 * shrink and grow (the reshape), the step boundary's commit, Reform, the
 * answers to processes of an older generation, and the journal's replay
 * of all of it. elastic.h has the model and the costs.
 */
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "journal/log.h"
#include "coll.h"
#include "elastic.h"
#include "groups.h"

/* ------------------------------------------------------------------------ */
/* What is kept per job: the history of changes, removed members          */
/* ------------------------------------------------------------------------ */

static struct srv_elastic *
el_get(struct srv_job *job)
{
	if (job->el == NULL)
		job->el = calloc(1, sizeof(*job->el));
	return (job->el);
}

static void
el_removed_free(struct srv_el_removed *r)
{
	free(r->text);
	free(r->detail);
	srv_failure_free(&r->failure);
	memset(r, 0, sizeof(*r));
}

void
srv_elastic_clear(struct srv_job *job)
{
	struct srv_elastic *el = job->el;

	job->min_world = 0;
	job->max_world = 0;
	srv_job_clear_change(job);
	if (el == NULL)
		return;
	for (unsigned i = 0; i < SRV_EL_HISTORY; i++)
		free(el->hist[i].prev);
	for (unsigned i = 0; i < SRV_EL_REMOVED; i++)
		el_removed_free(&el->rem[i]);
	free(el->memo);
	free(el);
	job->el = NULL;
}

/* Keeps the step to gen (takes prev; on ENOMEM prev is freed and the step
 * forgotten: a Reform from before it cannot be mapped). */
static void
el_step_push(struct srv_job *job, uint64_t gen, uint64_t prev_gen, uint32_t n,
    int32_t *prev)
{
	struct srv_elastic *el = el_get(job);
	struct srv_el_step *s;

	if (el == NULL) {
		free(prev);
		return;
	}
	if (el->nhist == SRV_EL_HISTORY) {
		s = &el->hist[el->hhead];
		free(s->prev);
		el->hhead = (el->hhead + 1) % SRV_EL_HISTORY;
		el->nhist--;
	}
	s = &el->hist[(el->hhead + el->nhist) % SRV_EL_HISTORY];
	s->gen = gen;
	s->prev_gen = prev_gen;
	s->n = n;
	s->prev = prev;
	el->nhist++;
}

const struct srv_el_step *
srv_elastic_step(const struct srv_job *job, unsigned i)
{
	const struct srv_elastic *el = job->el;

	if (el == NULL || i >= el->nhist)
		return (NULL);
	return (&el->hist[(el->hhead + i) % SRV_EL_HISTORY]);
}

static const struct srv_el_step *
el_step_find(const struct srv_job *job, uint64_t gen)
{
	const struct srv_el_step *s;

	for (unsigned i = 0; (s = srv_elastic_step(job, i)) != NULL; i++)
		if (s->gen == gen)
			return (s);
	return (NULL);
}

/* The slot of the next removal record (the oldest is forgotten). */
static struct srv_el_removed *
el_removed_new(struct srv_job *job)
{
	struct srv_elastic *el = el_get(job);
	struct srv_el_removed *r;

	if (el == NULL)
		return (NULL);
	if (el->nrem == SRV_EL_REMOVED) {
		el_removed_free(&el->rem[el->rhead]);
		el->rhead = (el->rhead + 1) % SRV_EL_REMOVED;
		el->nrem--;
	}
	r = &el->rem[(el->rhead + el->nrem) % SRV_EL_REMOVED];
	el->nrem++;
	srv_job_failure_init(&r->failure);
	return (r);
}

const struct srv_el_removed *
srv_elastic_removal(const struct srv_job *job, unsigned i)
{
	const struct srv_elastic *el = job->el;

	if (el == NULL || i >= el->nrem)
		return (NULL);
	return (&el->rem[(el->rhead + i) % SRV_EL_REMOVED]);
}

static const struct srv_el_removed *
el_removed_find(const struct srv_job *job, uint64_t client_id)
{
	const struct srv_el_removed *r;

	/* newest first: a client is removed once, but be exact */
	for (unsigned i = job->el != NULL ? job->el->nrem : 0; i-- > 0;)
		if ((r = srv_elastic_removal(job, i))->client_id == client_id)
			return (r);
	return (NULL);
}

/* Remembers that old member m (its client cl) was removed by the change
 * to gen, with its failure as far as it is known. */
static void
el_remember(struct srv_job *job, const struct srv_member *m,
    uint64_t client_id, uint64_t gen, const Cohort__Failure *f,
    const char *detail, cohort__time now)
{
	struct srv_el_removed *r = el_removed_new(job);

	if (r == NULL)
		return;
	r->client_id = client_id;
	r->gen = gen;
	r->rank = m->rank;
	cohort__strlcpy(r->host, m->host, sizeof(r->host));
	r->pid = m->pid;
	r->text = srv_strdup(m->failure != NULL ? m->failure : "");
	r->detail = srv_strdup(detail != NULL ? detail : "");
	if (f != NULL)
		srv_failure_fill(&r->failure, m, f->kind, f->operation, f->seq,
		    f->group, f->op_state, f->op_age_ms, r->text, now);
	else
		srv_failure_fill(&r->failure, m,
		    COHORT__FAILURE_KIND__FAILURE_UNKNOWN, "", 0, "",
		    COHORT__FAILURE_OP_STATE__FAILURE_OP_UNKNOWN, 0, r->text,
		    now);
	r->at = now;
}

/* ------------------------------------------------------------------------ */
/* The reshape                                                              */
/* ------------------------------------------------------------------------ */

/* Journals the generation gen of tab (before anything is answered). */
static void
el_journal(struct srv_job *job, uint64_t gen, uint64_t prev_gen,
    const struct srv_member *tab, uint32_t n)
{
	struct srv_jrn_member *recs = srv_member_recs(tab, n);
	struct srv_jrn_egen rs
	    = { gen, prev_gen, job->min_world, job->max_world, n, recs };

	srv_jrn_reshape(job->core->jrn, &job->jr, &rs);
	free(recs);
}

/* Answers every parked watch of the old generation EMEMBERSHIP. */
static void
el_tell_watchers(struct srv_job *job)
{
	while (!srv_list_empty(&job->watchers)) {
		struct srv_call *c = SRV_CONTAINER(
		    job->watchers.next, struct srv_call, olink);
		srv_list_remove(&c->olink);
		srv_call_withdraw(c, 0);
		srv_call_membership(c);
	}
}

/* Moves the job to tab (n members, generation job->generation, set by
 * the caller): the old members old2new does not map lose their clients
 * (the failed ones are remembered as removed by the change), the kept
 * ones follow their clients, groups are carried over and the step is
 * kept (takes prev). */
static void
el_install(struct srv_job *job, struct srv_member *tab, uint32_t n,
    const int32_t *old2new, int32_t *prev, uint64_t prev_gen, cohort__time now)
{
	struct srv_member *old = job->members;
	uint32_t old_world = job->world;
	const Cohort__Failure *f
	    = job->change.rank >= 0 ? &job->change.failure : NULL;

	for (uint32_t r = 0; old != NULL && r < old_world; r++) {
		struct srv_member *m = &old[r];
		if (old2new[r] >= 0)
			continue;
		if (m->state == SRV_MEMBER_FAILED && m->client != NULL)
			el_remember(job, m, m->client->id, job->generation,
			    m->rank == job->change.rank ? f : NULL,
			    m->rank == job->change.rank ? job->change.detail
			                                : m->failure,
			    now);
		if (m->client != NULL && m->client->member == m)
			m->client->member = NULL;
		free(m->failure);
	}
	for (uint32_t r = 0; r < n; r++)
		if (tab[r].client != NULL)
			tab[r].client->member = &tab[r];
	free(old);
	job->members = tab;
	job->world = n;
	job->state = SRV_JOB_RUNNING;
	if (srv_group_carry(job, old2new, old_world, n) != COHORT_OK)
		cohort__warn("job '%s': out of memory carrying its groups "
		             "over to generation %" PRIu64,
		    job->name, job->generation);
	el_step_push(job, job->generation, prev_gen, n, prev);
	free(job->el != NULL ? job->el->memo : NULL);
	if (job->el != NULL)
		job->el->memo = NULL;
}

/* The change's record: what happened (detail) and, for a loss, the lost
 * member's failure. */
static void
el_change(struct srv_job *job, const struct srv_member *m,
    const struct srv_el_loss *loss, const char *detail, cohort__time now)
{
	struct srv_change *ch = &job->change;

	srv_job_clear_change(job);
	ch->generation = job->generation;
	ch->detail = srv_strdup(detail);
	ch->at = now;
	if (m == NULL)
		return;
	ch->rank = m->rank;
	ch->text = srv_strdup(loss->text);
	srv_failure_fill(&ch->failure, m, loss->kind, loss->what, loss->seq,
	    loss->group, loss->state, loss->op_age, loss->text, now);
}

/* Counts the running members and those of them holding the state. */
static void
el_count(const struct srv_job *job, uint32_t *running, uint32_t *holders)
{
	*running = *holders = 0;
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		const struct srv_member *m = &job->members[r];
		if (m->state != SRV_MEMBER_RUNNING)
			continue;
		(*running)++;
		if (m->has_state)
			(*holders)++;
	}
}

bool
srv_elastic_survivable(const struct srv_job *job, char *buf, size_t len)
{
	uint32_t n, holders;

	el_count(job, &n, &holders);
	if (n < job->min_world) {
		snprintf(buf, len,
		    "%u rank%s remain%s, below the minimum of %u", n,
		    n == 1 ? "" : "s", n == 1 ? "s" : "", job->min_world);
		return (false);
	}
	if (holders == 0) {
		snprintf(buf, len,
		    "none of the %u remaining ranks holds the job's state "
		    "(they were admitted and have not received it)",
		    n);
		return (false);
	}
	return (true);
}

bool
srv_elastic_shrink(struct srv_job *job, struct srv_member *m,
    const struct srv_el_loss *loss, cohort__time now)
{
	uint32_t old_world = job->world, n, holders, k = 0;
	struct srv_member *tab;
	int32_t *old2new, *prev;
	uint64_t prev_gen = job->generation;
	char detail[1800];

	el_count(job, &n, &holders);
	tab = calloc(n ? n : 1, sizeof(*tab));
	old2new = malloc(sizeof(int32_t) * (old_world ? old_world : 1));
	prev = malloc(sizeof(int32_t) * (n ? n : 1));
	if (tab == NULL || old2new == NULL || prev == NULL) {
		free(tab);
		free(old2new);
		free(prev);
		return (false);
	}
	for (uint32_t r = 0; r < old_world; r++) {
		const struct srv_member *o = &job->members[r];
		old2new[r] = -1;
		if (o->state != SRV_MEMBER_RUNNING)
			continue;
		tab[k] = *o;
		tab[k].rank = (int32_t)k;
		tab[k].prev_rank = (int32_t)r;
		tab[k].failure = NULL;
		prev[k] = (int32_t)r;
		old2new[r] = (int32_t)k++;
	}
	/* 1. journalled before anything is answered (the event's replies
	 * leave once its records are written) */
	el_journal(job, prev_gen + 1, prev_gen, tab, n);
	/* 2. the next generation; 4. what waited in the old one hears it */
	job->generation = prev_gen + 1;
	snprintf(detail, sizeof(detail),
	    "%s; job '%s' goes on without it at generation %" PRIu64
	    " with %u rank%s (range %u..%u)",
	    loss->detail, job->name, job->generation, n, n == 1 ? "" : "s",
	    job->min_world, job->max_world);
	el_change(job, m, loss, detail, now);
	srv_coll_reset(job, COHORT_EMEMBERSHIP, detail, false);
	el_tell_watchers(job);
	/* 2-3. the survivors, renumbered densely in their old order, and
	 * the subgroups carried over */
	el_install(job, tab, n, old2new, prev, prev_gen, now);
	free(old2new);
	job->core->m.shrinks++;
	cohort__info("job '%s': generation %" PRIu64 " with %u of %u..%u "
	             "ranks, without rank %d (%s:%u)",
	    job->name, job->generation, n, job->min_world, job->max_world,
	    m->rank, m->host, m->pid);
	return (true);
}

/* ------------------------------------------------------------------------ */
/* Joiners                                                                  */
/* ------------------------------------------------------------------------ */

static void
el_withdraw_join(struct srv_call *c)
{
	srv_list_remove(&c->olink);
	c->job->njoiners--;
}

static void
el_expire_join(struct srv_call *c, cohort__time now)
{
	struct srv_job *job = c->job;
	char secs[32], buf[768];

	srv_fmt_secs(secs, sizeof(secs), now - c->start);
	if (job->state != SRV_JOB_RUNNING || job->world < job->max_world)
		snprintf(buf, sizeof(buf),
		    "joining the running job '%s' timed out after %s: it has "
		    "%u of at most %u ranks, and no step boundary admitted "
		    "this worker (%s:%u) meanwhile (its members call "
		    "cohort_step_boundary once per step)",
		    job->name, secs, job->world, job->max_world,
		    c->host != NULL ? c->host : "", c->pid);
	else
		snprintf(buf, sizeof(buf),
		    "joining the running job '%s' timed out after %s: it "
		    "has its maximum of %u ranks; this worker (%s:%u) would "
		    "have been admitted at the first step boundary after a "
		    "member was lost",
		    job->name, secs, job->max_world,
		    c->host != NULL ? c->host : "", c->pid);
	srv_call_timed_out(c, now, buf, NULL, 0);
}

/* A joiner waits in job->joiners. */
static const struct srv_park_ops el_park_join
    = { SRV_PARK_JOIN, el_withdraw_join, el_expire_join, NULL, NULL };

void
srv_elastic_join(struct srv_call *c, cohort__time now)
{
	struct srv_job *job = c->job;
	const struct srv_member *m = c->client->member;

	(void)now;
	if (c->min_world != job->min_world || c->world != job->max_world) {
		srv_call_fail(c, COHORT_EINVAL,
		    "job '%s' is elastic with %u..%u ranks (generation "
		    "%" PRIu64 ", %u running); this worker (%s:%u) says "
		    "%u..%u: another launch with the same job name? "
		    "(COHORT_JOB)",
		    job->name, job->min_world, job->max_world, job->generation,
		    job->world, c->host, c->pid, c->min_world, c->world);
		return;
	}
	if (m != NULL && m->state == SRV_MEMBER_RUNNING) {
		srv_call_fail(c, COHORT_ESTATE,
		    "this client is rank %d of job '%s' already", m->rank,
		    job->name);
		return;
	}
	srv_list_append(&job->joiners, &c->olink);
	job->njoiners++;
	srv_call_park(c, &el_park_join);
	cohort__info("job '%s': %s:%u waits to join (%u of %u..%u ranks "
	             "running; admitted at the next step boundary%s)",
	    job->name, c->host, c->pid, job->world, job->min_world,
	    job->max_world,
	    job->world < job->max_world ? "" : " after a member is lost");
}

struct srv_call **
srv_elastic_take_joiners(struct srv_job *job, size_t *n)
{
	struct srv_call **calls;
	size_t k = 0;

	*n = 0;
	if (job->njoiners == 0
	    || (calls = calloc(job->njoiners, sizeof(*calls))) == NULL)
		return (NULL);
	while (!srv_list_empty(&job->joiners)) {
		struct srv_call *c
		    = SRV_CONTAINER(job->joiners.next, struct srv_call, olink);
		srv_call_withdraw(c, 0);
		calls[k++] = c;
	}
	*n = k;
	return (calls);
}

/* The joiners in the order they are admitted: the ranks they asked for,
 * then arrival (grank: the index in the list, which is in arrival
 * order). */
static int
el_joiner_cmp(const void *a, const void *b)
{
	const struct srv_call *x = *(struct srv_call *const *)a;
	const struct srv_call *y = *(struct srv_call *const *)b;
	int64_t kx = x->rank >= 0 ? x->rank : INT32_MAX;
	int64_t ky = y->rank >= 0 ? y->rank : INT32_MAX;

	if (kx != ky)
		return (kx < ky ? -1 : 1);
	return ((x->grank > y->grank) - (x->grank < y->grank));
}

/* Answers an admitted joiner: its Join, with the old ranks of the
 * members (prev_ranks) and joined_running. */
static void
el_answer_joiner(struct srv_call *c, struct srv_job *job, int32_t rank,
    const int32_t *prev, uint64_t prev_gen)
{
	Cohort__Reply rep;
	Cohort__JoinReply jr;

	if (!srv_join_reply_fill(&jr, job, rank)) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	jr.n_prev_ranks = job->world;
	jr.prev_ranks = (int32_t *)prev;
	jr.prev_generation = prev_gen;
	jr.joined_running = true;
	srv_reply_init(&rep, c, COHORT_OK);
	rep.body_case = COHORT__REPLY__BODY_JOIN;
	rep.join = &jr;
	srv_call_answer(c, &rep, NULL, 0);
	srv_join_reply_free(&jr);
}

/* Admits joiners at a step boundary that every member passed (README
 * 8.6.1). Returns how many (0: none, or out of memory). */
static uint32_t
el_grow(struct srv_job *job, cohort__time now)
{
	uint32_t old_world = job->world, room = job->max_world - old_world;
	uint32_t k = job->njoiners < room ? job->njoiners : room, n, i = 0;
	struct srv_call **all = calloc(job->njoiners, sizeof(*all));
	struct srv_member *tab;
	int32_t *old2new, *prev, *keep;
	uint64_t prev_gen = job->generation;
	struct srv_link *l;
	char detail[900], who[400];
	size_t off = 0;

	n = old_world + k;
	tab = calloc(n, sizeof(*tab));
	old2new = malloc(sizeof(int32_t) * (old_world ? old_world : 1));
	prev = malloc(sizeof(int32_t) * n);
	keep = malloc(sizeof(int32_t) * n);
	if (all == NULL || tab == NULL || old2new == NULL || prev == NULL
	    || keep == NULL) {
		free(all);
		free(tab);
		free(old2new);
		free(prev);
		free(keep);
		return (0);
	}
	for (l = job->joiners.next; l != &job->joiners; l = l->next) {
		all[i] = SRV_CONTAINER(l, struct srv_call, olink);
		all[i]->grank = (int32_t)i;
		i++;
	}
	qsort(all, job->njoiners, sizeof(*all), el_joiner_cmp);
	for (uint32_t r = 0; r < old_world; r++) {
		tab[r] = job->members[r];
		tab[r].prev_rank = (int32_t)r;
		prev[r] = (int32_t)r;
		old2new[r] = (int32_t)r;
	}
	who[0] = '\0';
	for (uint32_t j = 0; j < k; j++) {
		struct srv_call *c = all[j];
		struct srv_member *m = &tab[old_world + j];
		srv_member_admit(m, (int32_t)(old_world + j), c, false, now);
		prev[old_world + j] = -1;
		cohort__appendf(who, sizeof(who), &off, "%s%s:%u",
		    j == 0 ? "" : ", ", m->host, m->pid);
	}
	el_journal(job, prev_gen + 1, prev_gen, tab, n);
	job->generation = prev_gen + 1;
	snprintf(detail, sizeof(detail),
	    "job '%s' admitted %u member%s (%s) at the step boundary: "
	    "generation %" PRIu64 " has %u ranks (range %u..%u)",
	    job->name, k, k == 1 ? "" : "s", who, job->generation, n,
	    job->min_world, job->max_world);
	el_change(job, NULL, NULL, detail, now);
	srv_coll_reset(job, COHORT_EMEMBERSHIP, detail, false);
	el_tell_watchers(job);
	memcpy(keep, prev, sizeof(int32_t) * n);
	for (uint32_t j = 0; j < k; j++) {
		struct srv_call *c = all[j];
		if (c->client->member != NULL)
			c->client->member->client = NULL;
		srv_call_withdraw(c, now);
	}
	el_install(job, tab, n, old2new, prev, prev_gen, now);
	for (uint32_t j = 0; j < k; j++)
		el_answer_joiner(
		    all[j], job, (int32_t)(old_world + j), keep, prev_gen);
	job->core->m.grows++;
	cohort__info("%s", detail);
	free(all);
	free(old2new);
	free(keep);
	return (k);
}

/* ------------------------------------------------------------------------ */
/* The step boundary                                                        */
/* ------------------------------------------------------------------------ */

/* Every member arrived (calls by rank, n of them): note who holds the
 * state, admit joiners, name the transfer's roles, and give every arrival
 * the same answer (README 8.6). */
static void
el_commit(
    struct srv_job *job, struct srv_call **calls, uint32_t n, cohort__time now)
{
	Cohort__CollectiveReply cr;
	int32_t *recv = NULL;
	bool flipped = false;
	uint32_t admitted = 0;

	cohort__collective_reply__init(&cr);
	cr.state_sender = -1;
	if (srv_job_elastic(job)) {
		for (uint32_t i = 0; i < n; i++) {
			struct srv_member *m = &job->members[calls[i]->rank];
			if (m->has_state != calls[i]->has_state) {
				m->has_state = calls[i]->has_state;
				flipped = true;
			}
		}
		if (job->njoiners > 0 && job->world < job->max_world)
			admitted = el_grow(job, now);
		if (admitted == 0 && flipped) {
			bool *has = malloc(sizeof(bool) * job->world);
			for (uint32_t r = 0; has != NULL && r < job->world;
			     r++)
				has[r] = job->members[r].has_state;
			srv_jrn_hold(job->core->jrn, &job->jr, job->generation,
			    job->world, has);
			free(has);
		}
		recv = malloc(sizeof(int32_t) * job->world);
		for (uint32_t r = 0; recv != NULL && r < job->world; r++) {
			if (!job->members[r].has_state)
				recv[cr.n_state_receivers++] = (int32_t)r;
			else if (cr.state_sender < 0)
				cr.state_sender = (int32_t)r;
		}
		/* nobody to send to, or nobody who could */
		if (cr.n_state_receivers == 0 || cr.state_sender < 0) {
			cr.state_sender = -1;
			cr.n_state_receivers = 0;
		}
		cr.state_receivers = recv;
	}
	cr.changed = admitted > 0;
	cr.generation = job->generation;
	for (uint32_t i = 0; i < n; i++) {
		Cohort__Reply rep;
		srv_reply_init(&rep, calls[i], COHORT_OK);
		rep.body_case = COHORT__REPLY__BODY_COLLECTIVE;
		rep.collective = &cr;
		srv_call_answer(calls[i], &rep, NULL, 0);
	}
	free(recv);
}

void
srv_elastic_boundary(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	struct srv_job *job = c->job;
	struct srv_coll_done done;

	if (!srv_coll_boundary(c, req, now, &done))
		return;
	el_commit(job, done.calls, done.n, now);
	free(done.calls);
}

/* ------------------------------------------------------------------------ */
/* Reform and older generations                                             */
/* ------------------------------------------------------------------------ */

/* prev_ranks from generation `from` to the current one (the job's world
 * entries, owned by job->el), or NULL when from is not among the last
 * SRV_EL_HISTORY changes (or out of memory). */
static const int32_t *
el_map(struct srv_job *job, uint64_t from)
{
	struct srv_elastic *el = el_get(job);
	uint32_t n = job->world;
	uint64_t at = job->generation;
	int32_t *map;

	if (el == NULL)
		return (NULL);
	if (el->memo != NULL && el->memo_gen == job->generation
	    && el->memo_from == from && el->memo_n == n)
		return (el->memo);
	if ((map = malloc(sizeof(int32_t) * (n ? n : 1))) == NULL)
		return (NULL);
	for (uint32_t i = 0; i < n; i++)
		map[i] = (int32_t)i;
	while (at != from) {
		const struct srv_el_step *s = el_step_find(job, at);
		if (s == NULL || s->prev_gen == 0 || s->prev_gen < from) {
			free(map);
			return (NULL);
		}
		for (uint32_t i = 0; i < n; i++)
			if (map[i] >= 0)
				map[i] = (uint32_t)map[i] < s->n
				    ? s->prev[map[i]]
				    : -1;
		at = s->prev_gen;
	}
	free(el->memo);
	el->memo = map;
	el->memo_from = from;
	el->memo_gen = job->generation;
	el->memo_n = n;
	return (map);
}

void
srv_elastic_reform(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	struct srv_job *job = c->job;
	const struct srv_member *m = c->client->member;
	uint64_t from
	    = req->generation != 0 ? req->generation : job->generation;
	Cohort__Reply rep;
	Cohort__JoinReply jr;
	const int32_t *prev;

	(void)now;
	if (!srv_job_elastic(job)) {
		srv_call_fail(c, COHORT_ENOTSUP,
		    "job '%s' is not elastic: it was started without a range "
		    "of members (cohort run --nnodes MIN:MAX, "
		    "COHORT_MIN_WORLD)",
		    job->name);
		return;
	}
	if (m == NULL) {
		srv_elastic_no_member(c);
		return;
	}
	if (job->state == SRV_JOB_FAILED) {
		srv_call_peerlost(c);
		return;
	}
	if (m->state != SRV_MEMBER_RUNNING) {
		srv_call_fail(c, COHORT_ESTATE,
		    "rank %d already left job '%s'", m->rank, job->name);
		return;
	}
	if (from > job->generation) {
		srv_call_fail(c, COHORT_EINVAL,
		    "generation %" PRIu64 " is ahead of job '%s' (at "
		    "generation %" PRIu64 ")",
		    from, job->name, job->generation);
		return;
	}
	if ((prev = el_map(job, from)) == NULL) {
		srv_call_fail(c, COHORT_EPEERLOST,
		    "rank %d of generation %" PRIu64 " cannot follow job '%s' "
		    "to generation %" PRIu64 ": cohortd keeps the last %d "
		    "changes; this process must join again",
		    c->req_rank, from, job->name, job->generation,
		    SRV_EL_HISTORY);
		return;
	}
	if (!srv_join_reply_fill(&jr, job, m->rank)) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	jr.n_prev_ranks = job->world;
	jr.prev_ranks = (int32_t *)prev;
	jr.prev_generation = from;
	jr.joined_running = !m->has_state;
	srv_reply_init(&rep, c, COHORT_OK);
	rep.body_case = COHORT__REPLY__BODY_JOIN;
	rep.join = &jr;
	srv_call_answer(c, &rep, NULL, 0);
	srv_join_reply_free(&jr);
}

bool
srv_elastic_removed(struct srv_call *c)
{
	struct srv_job *job = c->job;
	const struct srv_el_removed *r;
	Cohort__Reply rep;
	char buf[2400];

	if (!srv_job_elastic(job))
		return (false);
	if ((r = el_removed_find(job, c->client->id)) != NULL) {
		snprintf(buf, sizeof(buf),
		    "rank %d (%s:%u) was removed from job '%s' at generation "
		    "%" PRIu64 ": %s",
		    r->rank, r->host, r->pid, job->name, r->gen, r->detail);
		srv_reply_init(&rep, c, COHORT_EPEERLOST);
		rep.error = buf;
		rep.failed_rank = r->rank;
		rep.failed_text = r->text;
		((struct srv_el_removed *)r)->failure.age_ms
		    = r->at != 0 && c->start > r->at
		    ? (uint64_t)(c->start - r->at)
		    : 0;
		rep.failure = (Cohort__Failure *)&r->failure;
		srv_call_answer(c, &rep, NULL, 0);
		return (true);
	}
	if (c->req_gen == 0 || c->req_gen >= job->generation
	    || c->req_rank < 0)
		return (false);
	srv_call_fail(c, COHORT_EPEERLOST,
	    "rank %d of generation %" PRIu64 " is no longer a member of job "
	    "'%s' (at generation %" PRIu64 "): a change removed it; it may "
	    "join again as a new member",
	    c->req_rank, c->req_gen, job->name, job->generation);
	return (true);
}

void
srv_elastic_no_member(struct srv_call *c)
{
	if (!srv_elastic_removed(c))
		srv_call_fail(c, COHORT_ESTATE,
		    "this client is not a member of job '%s' (join first)",
		    c->job->name);
}

void
srv_elastic_stale(struct srv_call *c)
{
	struct srv_job *job = c->job;
	const struct srv_member *m = c->client->member;

	if (m != NULL && m->state == SRV_MEMBER_RUNNING) {
		if (job->state == SRV_JOB_FAILED)
			srv_call_peerlost(c);
		else
			srv_call_membership(c);
		return;
	}
	if (m == NULL && srv_elastic_removed(c))
		return;
	srv_call_fail(c, COHORT_ESTALE,
	    "request for generation %" PRIu64 " of job '%s', which is at "
	    "generation %" PRIu64,
	    c->req_gen, job->name, job->generation);
}

/* ------------------------------------------------------------------------ */
/* A generation formed by a rendezvous                                      */
/* ------------------------------------------------------------------------ */

void
srv_elastic_formed(struct srv_job *job, uint32_t min, uint32_t max)
{
	int32_t *prev;

	srv_elastic_clear(job);
	if (min == 0)
		return;
	job->min_world = min;
	job->max_world = max;
	prev = malloc(sizeof(int32_t) * (job->world ? job->world : 1));
	for (uint32_t r = 0; r < job->world; r++) {
		job->members[r].has_state = true;
		job->members[r].prev_rank = -1;
		if (prev != NULL)
			prev[r] = -1;
	}
	el_journal(job, job->generation, 0, job->members, job->world);
	if (prev != NULL)
		el_step_push(job, job->generation, 0, job->world, prev);
}

/* ------------------------------------------------------------------------ */
/* Journal replay                                                           */
/* ------------------------------------------------------------------------ */

cohort_status
srv_elastic_restore(
    struct srv_job *job, const struct srv_jrn_egen *rs, cohort__time now)
{
	uint32_t n = rs->world, old_world = job->world;
	bool carry = job->members != NULL && srv_job_elastic(job)
	    && rs->prev_gen != 0 && rs->prev_gen == job->generation;
	struct srv_member *tab;
	int32_t *old2new = NULL, *prev;
	cohort_status rv = COHORT_OK;

	if (n == 0 || n > SRV_MAX_WORLD || rs->min_world == 0
	    || rs->min_world > rs->max_world || n > rs->max_world
	    || rs->gen == 0 || rs->prev_gen >= rs->gen)
		return (COHORT_EPROTO);
	tab = calloc(n, sizeof(*tab));
	prev = malloc(sizeof(int32_t) * n);
	if (carry)
		old2new
		    = malloc(sizeof(int32_t) * (old_world ? old_world : 1));
	if (tab == NULL || prev == NULL || (carry && old2new == NULL)) {
		rv = COHORT_ENOMEM;
		goto out_free;
	}
	for (uint32_t r = 0; carry && r < old_world; r++)
		old2new[r] = -1;
	for (uint32_t r = 0; r < n; r++) {
		const struct srv_jrn_member *rec = &rs->m[r];
		int32_t p = rec->prev_rank;
		struct srv_member *m = &tab[r];
		if (p < -1 || (carry && p >= (int32_t)old_world)
		    || (carry && p >= 0 && old2new[p] >= 0)) {
			rv = COHORT_EPROTO;
			goto out_free;
		}
		if (carry && p >= 0)
			old2new[p] = (int32_t)r;
		prev[r] = carry ? p : (rs->prev_gen == 0 ? -1 : p);
		m->rank = (int32_t)r;
		m->state = SRV_MEMBER_RUNNING;
		cohort__strlcpy(m->host, rec->host, sizeof(m->host));
		m->pid = rec->pid;
		m->local_rank = rec->local_rank;
		m->hb_ms = rec->hb_ms;
		m->dead_ms = rec->dead_ms;
		m->last_seen = now;
		m->restored_at = now;
		m->grace_until = now + job->core->restore_grace_ms;
		m->has_state = rec->has_state;
		m->prev_rank = p;
		if ((m->client = srv_client_get(
		         job->core, &job->clients, rec->client_id, now))
		    == NULL) {
			rv = COHORT_ENOMEM;
			goto out_free;
		}
	}
	if (carry) {
		/* The change's record: the lost member's failure as the
		 * journal keeps it (FAIL: its text, and the detail when it
		 * was the first), kind and time unknown. */
		const struct srv_member *lost = NULL;
		struct srv_el_loss loss;
		char detail[1800];
		for (uint32_t r = 0; r < old_world; r++)
			if (old2new[r] < 0
			    && job->members[r].state == SRV_MEMBER_FAILED) {
				lost = &job->members[r];
				break;
			}
		memset(&loss, 0, sizeof(loss));
		loss.kind = COHORT__FAILURE_KIND__FAILURE_UNKNOWN;
		loss.what = "";
		loss.group = "";
		loss.text = lost != NULL && lost->failure != NULL
		    ? lost->failure
		    : "";
		job->generation = rs->gen;
		if (lost != NULL && job->failed_rank == lost->rank
		    && job->failed_detail != NULL)
			snprintf(detail, sizeof(detail),
			    "%s; job '%s' goes on without it at generation "
			    "%" PRIu64 " with %u ranks (range %u..%u)",
			    job->failed_detail, job->name, rs->gen, n,
			    job->min_world, job->max_world);
		else
			snprintf(detail, sizeof(detail),
			    "the membership of job '%s' changed: generation "
			    "%" PRIu64 " has %u ranks (range %u..%u)",
			    job->name, rs->gen, n, job->min_world,
			    job->max_world);
		el_change(job, lost, &loss, detail, 0);
		srv_job_clear_failure(job);
		/* the parked ones were not journalled: nothing to answer */
		el_install(job, tab, n, old2new, prev, rs->prev_gen, 0);
		prev = NULL;
		tab = NULL;
	} else {
		srv_job_clear_members(job);
		srv_job_clear_failure(job);
		srv_coll_reset(job, COHORT_ESTALE, "restored", true);
		if (rs->prev_gen == 0) {
			srv_elastic_clear(job);
		} else {
			srv_job_clear_change(job);
		}
		for (uint32_t r = 0; r < n; r++) {
			if (tab[r].client->member != NULL)
				tab[r].client->member->client = NULL;
			tab[r].client->member = &tab[r];
		}
		job->members = tab;
		job->world = n;
		job->generation = rs->gen;
		job->state = SRV_JOB_RUNNING;
		tab = NULL;
		if ((rv = srv_group_world(job)) != COHORT_OK)
			goto out_free;
		el_step_push(job, rs->gen, rs->prev_gen, n, prev);
		prev = NULL;
	}
	job->min_world = rs->min_world;
	job->max_world = rs->max_world;

out_free:
	free(tab);
	free(prev);
	free(old2new);
	return (rv);
}

cohort_status
srv_elastic_restore_hold(
    struct srv_job *job, uint64_t gen, uint32_t world, const bool *has)
{
	if (!srv_job_elastic(job) || job->members == NULL
	    || gen != job->generation || world != job->world)
		return (COHORT_EPROTO);
	for (uint32_t r = 0; r < world; r++)
		job->members[r].has_state = has[r];
	return (COHORT_OK);
}

cohort_status
srv_elastic_restore_step(struct srv_job *job, uint64_t gen, uint64_t prev_gen,
    uint32_t n, const int32_t *prev)
{
	int32_t *p;

	if (n == 0 || n > SRV_MAX_WORLD || prev_gen >= gen)
		return (COHORT_EPROTO);
	if ((p = malloc(sizeof(int32_t) * n)) == NULL)
		return (COHORT_ENOMEM);
	memcpy(p, prev, sizeof(int32_t) * n);
	el_step_push(job, gen, prev_gen, n, p);
	return (job->el != NULL ? COHORT_OK : COHORT_ENOMEM);
}

cohort_status
srv_elastic_restore_removed(struct srv_job *job, uint64_t client_id,
    uint64_t gen, int32_t rank, const char *host, uint32_t pid,
    const char *text, const char *detail)
{
	struct srv_member m;
	struct srv_el_removed *r;

	memset(&m, 0, sizeof(m));
	m.rank = rank;
	cohort__strlcpy(m.host, host, sizeof(m.host));
	m.pid = pid;
	m.failure = (char *)text;
	if (rank < 0 || (r = el_removed_new(job)) == NULL)
		return (rank < 0 ? COHORT_EPROTO : COHORT_ENOMEM);
	r->client_id = client_id;
	r->gen = gen;
	r->rank = rank;
	cohort__strlcpy(r->host, host, sizeof(r->host));
	r->pid = pid;
	r->text = srv_strdup(text);
	r->detail = srv_strdup(detail);
	srv_failure_fill(&r->failure, &m,
	    COHORT__FAILURE_KIND__FAILURE_UNKNOWN, "", 0, "",
	    COHORT__FAILURE_OP_STATE__FAILURE_OP_UNKNOWN, 0, text, 0);
	return (COHORT_OK);
}
