/*
 * rdzv.c - rendezvous and generations (proto/README.md section 3).
 *
 * Joins park in rdzv_by_rank (explicit ranks) or rdzv_auto (rank -1)
 * until world_size of them are there; then the generation increases,
 * ranks -1 get the lowest free ranks in arrival order, the old
 * generation's operations end (ESTALE), the world group is made, the
 * generation is journalled, and every join is answered.
 *
 * An elastic job's (Join.min_world > 0, README 8.1) completes with
 * world_size joins too, or with at least min_world of them once none came
 * for --rdzv-last-call (the sweep); its ranks are dense, in the order of
 * the ranks asked for, then of arrival. A Join of a running elastic job
 * is a joiner's (elastic.c). O(world) per completion, and O(1) bytes per
 * reply for a client that reads no member list (Join.no_member_list, as
 * libcohort's): the list would make a rendezvous O(world^2) to encode,
 * send and decode (4,096 members: 16 M strings).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "journal/log.h"
#include "coll.h"
#include "elastic.h"
#include "groups.h"
#include "rdzv.h"

static void
rdzv_reset(struct srv_job *job)
{
	free(job->rdzv_by_rank);
	job->rdzv_by_rank = NULL;
	job->rdzv_world = 0;
	job->rdzv_min = 0;
	job->rdzv_n = 0;
	srv_list_init(&job->rdzv_auto);
}

/* The joins of the rendezvous in rank order (n of them, malloc'd; the
 * rendezvous keeps none). Not elastic (all world ranks there): explicit
 * ranks keep theirs, rank -1 joins take the free ones in arrival order.
 * Elastic: dense, in the order of the ranks asked for, then arrival. */
static struct srv_call **
rdzv_order(struct srv_job *job, uint32_t *n)
{
	uint32_t w = job->rdzv_world, k = 0;
	struct srv_call **calls = job->rdzv_by_rank, **order;

	*n = job->rdzv_n;
	if ((order = calloc(*n ? *n : 1, sizeof(*order))) == NULL)
		return (NULL);
	for (uint32_t r = 0; r < w; r++) {
		struct srv_call *c = calls[r];
		if (c == NULL && job->rdzv_min > 0)
			continue;
		if (c == NULL) {
			COHORT__ASSERT(!srv_list_empty(&job->rdzv_auto));
			c = SRV_CONTAINER(
			    job->rdzv_auto.next, struct srv_call, olink);
			srv_list_remove(&c->olink);
		}
		calls[r] = NULL;
		order[k++] = c;
	}
	while (!srv_list_empty(&job->rdzv_auto)) {
		struct srv_call *c = SRV_CONTAINER(
		    job->rdzv_auto.next, struct srv_call, olink);
		srv_list_remove(&c->olink);
		order[k++] = c;
	}
	COHORT__ASSERT(k == *n);
	return (order);
}

static void
rdzv_complete(struct srv_job *job, cohort__time now)
{
	uint32_t w, max = job->rdzv_world, min = job->rdzv_min;
	struct srv_call **calls = rdzv_order(job, &w);
	struct srv_member *mem = calloc(w ? w : 1, sizeof(*mem));
	char **hosts = calloc(w ? w : 1, sizeof(char *));
	int32_t *lr = calloc(w ? w : 1, sizeof(int32_t));

	if (calls == NULL || mem == NULL || hosts == NULL || lr == NULL) {
		free(mem);
		free(hosts);
		free(lr);
		for (uint32_t r = 0; calls != NULL && r < w; r++)
			srv_call_fail(
			    calls[r], COHORT_ENOMEM, "out of memory");
		for (uint32_t r = 0; calls == NULL && r < max; r++) {
			struct srv_call *c = job->rdzv_by_rank[r];
			if (c == NULL)
				continue;
			job->rdzv_by_rank[r] = NULL;
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		}
		while (!srv_list_empty(&job->rdzv_auto)) {
			struct srv_call *c = SRV_CONTAINER(
			    job->rdzv_auto.next, struct srv_call, olink);
			srv_list_remove(&c->olink);
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		}
		free(calls);
		rdzv_reset(job);
		return;
	}
	srv_job_clear_members(job);
	srv_job_clear_failure(job);
	job->members = mem;
	job->world = w;
	job->generation++;
	job->state = SRV_JOB_RUNNING;
	job->core->m.rendezvous++;
	/* Old generation's ops are over; a watch sees the move. */
	srv_coll_reset(
	    job, COHORT_ESTALE, "the job moved to a new generation", true);
	while (!srv_list_empty(&job->watchers)) {
		struct srv_call *c = SRV_CONTAINER(
		    job->watchers.next, struct srv_call, olink);
		srv_list_remove(&c->olink);
		srv_call_fail(c, COHORT_ESTALE,
		    "job '%s' moved to generation %" PRIu64, job->name,
		    job->generation);
	}
	(void)srv_group_world(job);
	for (uint32_t r = 0; r < w; r++) {
		struct srv_member *m = &mem[r];
		struct srv_call *c = calls[r];
		srv_member_admit(m, (int32_t)r, c, true, now);
		if (c->client->member != NULL)
			c->client->member->client = NULL;
		c->client->member = m;
		hosts[r] = m->host;
		lr[r] = m->local_rank;
	}
	rdzv_reset(job);
	if (min > 0) {
		/* journalled as the elastic job's first generation */
		srv_elastic_formed(job, min, max);
	} else {
		struct srv_jrn_member *recs = srv_job_member_recs(job);
		srv_elastic_clear(job);
		srv_jrn_gen(job->core->jrn, &job->jr, job->generation,
		    job->world, recs);
		free(recs);
	}
	if (min > 0)
		cohort__info("job '%s': generation %" PRIu64 " formed with %u "
		             "ranks (range %u..%u)",
		    job->name, job->generation, w, min, max);
	else
		cohort__info("job '%s': generation %" PRIu64 " formed with "
		             "%u ranks",
		    job->name, job->generation, w);
	for (uint32_t r = 0; r < w; r++) {
		Cohort__Reply rep;
		Cohort__JoinReply jr;
		struct srv_call *c = calls[r];
		srv_reply_init(&rep, c, COHORT_OK);
		cohort__join_reply__init(&jr);
		jr.rank = (int32_t)r;
		jr.world_size = w;
		jr.generation = job->generation;
		/* O(world) bytes per reply unless the client asked for
		 * none (Join.no_member_list): O(1) per member then */
		if (!c->no_list) {
			jr.n_hosts = w;
			jr.hosts = hosts;
			jr.n_local_ranks = w;
			jr.local_ranks = lr;
		}
		jr.job_id = job->job_id;
		jr.max_value_bytes = c->core->lim.max_value;
		jr.max_message_bytes
		    = c->core->lim.max_value + COHORT__ENVELOPE_ALLOWANCE;
		jr.min_world = job->min_world;
		jr.max_world = job->max_world;
		rep.body_case = COHORT__REPLY__BODY_JOIN;
		rep.join = &jr;
		srv_call_answer(c, &rep, NULL, 0);
	}
	free(calls);
	free(hosts);
	free(lr);
}

static void
job_withdraw_join(struct srv_call *c)
{
	struct srv_job *job = c->job;

	if (c->rank >= 0)
		job->rdzv_by_rank[c->rank] = NULL;
	else
		srv_list_remove(&c->olink);
	if (--job->rdzv_n == 0)
		rdzv_reset(job);
}

static void
job_expire_join(struct srv_call *c, cohort__time now)
{
	struct srv_job *job = c->job;
	uint32_t w = job->rdzv_world, nauto = 0, joined = job->rdzv_n;
	int32_t *miss = calloc(w + 1, sizeof(int32_t));
	size_t nm = 0;
	struct srv_link *l;
	char rb[512], secs[32], range[64], buf[1024];

	for (l = job->rdzv_auto.next; l != &job->rdzv_auto; l = l->next)
		nauto++;
	/* The lowest free ranks go to the rank -1 joins. */
	for (uint32_t r = 0; miss != NULL && r < w; r++) {
		if (job->rdzv_by_rank[r] != NULL)
			continue;
		if (nauto > 0) {
			nauto--;
			continue;
		}
		miss[nm++] = (int32_t)r;
	}
	srv_fmt_ranks(rb, sizeof(rb), miss, nm);
	srv_fmt_secs(secs, sizeof(secs), now - c->start);
	if (job->rdzv_min > 0)
		snprintf(range, sizeof(range), "%u..%u (at least %u needed)",
		    job->rdzv_min, w, job->rdzv_min);
	else
		snprintf(range, sizeof(range), "%u", w);
	snprintf(buf, sizeof(buf),
	    "rendezvous of job '%s' timed out after %s: %u of %s ranks "
	    "joined; missing rank%s %s",
	    job->name, secs, joined, range, nm == 1 ? "" : "s", rb);
	srv_call_timed_out(c, now, buf, miss, nm);
}

/* A join waits in the rendezvous. */
static const struct srv_park_ops job_park_join
    = { SRV_PARK_JOIN, job_withdraw_join, job_expire_join, NULL, NULL };

void
srv_rdzv_join(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const Cohort__Join *j = req->join;
	struct srv_job *job = c->job;
	uint32_t w = j->world_size;

	if (w == 0 || w > SRV_MAX_WORLD) {
		srv_call_fail(c, COHORT_EINVAL,
		    "world_size %u is out of range 1..%d", w, SRV_MAX_WORLD);
		return;
	}
	if (j->min_world > w) {
		srv_call_fail(c, COHORT_EINVAL,
		    "min_world %u is more than world_size %u (the most "
		    "members an elastic job has)",
		    j->min_world, w);
		return;
	}
	if (j->rank < -1 || (j->rank >= 0 && (uint32_t)j->rank >= w)) {
		srv_call_fail(c, COHORT_EINVAL,
		    "rank %d is out of range for world size %u (-1 = "
		    "assign)",
		    j->rank, w);
		return;
	}
	if (strlen(j->host) > SRV_MAX_NAME) {
		srv_call_fail(c, COHORT_EINVAL, "host name longer than %d",
		    SRV_MAX_NAME);
		return;
	}
	{
		/* The timeout hierarchy (docs/timeouts.md): a member must
		 * heartbeat more often than the silence that kills it. */
		uint32_t hb = j->heartbeat_ms ? j->heartbeat_ms
		                              : COHORT__DEFAULT_HEARTBEAT_MS;
		uint32_t dead = j->dead_after_ms
		    ? j->dead_after_ms
		    : COHORT__DEFAULT_DEAD_AFTER_MS;
		if (hb >= dead) {
			srv_call_fail(c, COHORT_EINVAL,
			    "heartbeat interval %u ms must be shorter than "
			    "dead-after %u ms (heartbeat < dead-after < "
			    "operation timeout < rendezvous timeout)",
			    hb, dead);
			return;
		}
	}
	if (job->core->lim.max_members != 0
	    && w > job->core->lim.max_members) {
		job->core->m.limit_refusals++;
		srv_call_fail(c, COHORT_ETOOBIG,
		    "world size %u of job '%s' is over --max-members %" PRIu64,
		    w, job->name, job->core->lim.max_members);
		return;
	}
	if ((c->host = srv_strdup(j->host)) == NULL) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	c->rank = j->rank;
	c->world = w;
	c->min_world = j->min_world;
	c->pid = j->pid;
	c->local_rank = j->local_rank;
	c->hb_ms = j->heartbeat_ms;
	c->dead_ms = j->dead_after_ms;
	c->no_list = j->no_member_list;
	srv_rdzv_enter(c, now);
}

void
srv_rdzv_enter(struct srv_call *c, cohort__time now)
{
	struct srv_job *job = c->job;
	uint32_t w = c->world;
	struct srv_call *holder;

	if (job->rdzv_world == 0) {
		if (job->state == SRV_JOB_RUNNING && srv_job_has_live(job)) {
			if (srv_job_elastic(job)) {
				/* a joiner, admitted at a step boundary */
				srv_elastic_join(c, now);
				return;
			}
			/* Another launch under the same name (or a worker
			 * of this one that came back): say what the job is
			 * and what this worker says, both sides. */
			if (w != job->world) {
				srv_call_fail(c, COHORT_EINVAL,
				    "job '%s' has world size %u (since "
				    "generation %" PRIu64 "); this worker "
				    "(%s:%u) says %u: another launch with "
				    "the same job name? (COHORT_JOB)",
				    job->name, job->world, job->generation,
				    c->host, c->pid, w);
				return;
			}
			if (c->rank >= 0 && (uint32_t)c->rank < job->world
			    && job->members[c->rank].state
			        == SRV_MEMBER_RUNNING) {
				struct srv_member *m = &job->members[c->rank];
				srv_call_fail(c, COHORT_EEXIST,
				    "rank %d of job '%s' is held by %s:%u "
				    "(generation %" PRIu64 "); this worker "
				    "(%s:%u) asks for it too",
				    c->rank, job->name, m->host, m->pid,
				    job->generation, c->host, c->pid);
				return;
			}
			srv_call_fail(c, COHORT_ESTATE,
			    "job '%s' is running generation %" PRIu64
			    " with %u ranks; this worker (%s:%u) is not one "
			    "of its members: a new generation starts once "
			    "generation %" PRIu64 " failed or every member "
			    "left",
			    job->name, job->generation, job->world, c->host,
			    c->pid, job->generation);
			return;
		}
		if (job->core->lim.max_total_members != 0) {
			/* this job's last generation makes room for its next
			 */
			uint64_t tot = srv_core_members_total(job->core);
			if (job->members != NULL)
				tot -= job->max_world > job->world
				    ? job->max_world
				    : job->world;
			if (tot + w > job->core->lim.max_total_members) {
				job->core->m.limit_refusals++;
				srv_call_fail(c, COHORT_ETOOBIG,
				    "cohortd would hold %" PRIu64 " members "
				    "over all jobs with job '%s' (world %u), "
				    "over --max-total-members %" PRIu64,
				    tot + w, job->name, w,
				    job->core->lim.max_total_members);
				return;
			}
		}
		if ((job->rdzv_by_rank = calloc(w, sizeof(*job->rdzv_by_rank)))
		    == NULL) {
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
			return;
		}
		job->rdzv_world = w;
		job->rdzv_min = c->min_world;
		job->rdzv_n = 0;
		job->rdzv_start = now;
		job->restored = false;
	} else if (w != job->rdzv_world || c->min_world != job->rdzv_min) {
		char a[64], b[64];
		if (job->rdzv_min > 0)
			snprintf(a, sizeof(a), "%u..%u ranks", job->rdzv_min,
			    job->rdzv_world);
		else
			snprintf(
			    a, sizeof(a), "world size %u", job->rdzv_world);
		if (c->min_world > 0)
			snprintf(b, sizeof(b), "%u..%u", c->min_world, w);
		else
			snprintf(b, sizeof(b), "%u", w);
		srv_call_fail(c, COHORT_EINVAL,
		    "job '%s' has %s (rendezvous of generation %" PRIu64
		    ", %u of %u joined); this worker (%s:%u) says %s: "
		    "another launch with the same job name? (COHORT_JOB)",
		    job->name, a, job->generation + 1, job->rdzv_n,
		    job->rdzv_world, c->host, c->pid, b);
		return;
	}
	if (c->rank >= 0 && (holder = job->rdzv_by_rank[c->rank]) != NULL) {
		srv_call_fail(c, COHORT_EEXIST,
		    "rank %d of job '%s' is already requested by %s:%u",
		    c->rank, job->name, holder->host ? holder->host : "?",
		    holder->pid);
		return;
	}
	if (c->rank >= 0)
		job->rdzv_by_rank[c->rank] = c;
	else
		srv_list_append(&job->rdzv_auto, &c->olink);
	job->rdzv_n++;
	job->rdzv_last = now;
	srv_call_park(c, &job_park_join);
	if (job->rdzv_n == job->rdzv_world)
		rdzv_complete(job, now);
}

void
srv_rdzv_sweep(struct srv_job *job, cohort__time now)
{
	char secs[32];

	if (job->rdzv_world == 0 || job->rdzv_min == 0
	    || job->rdzv_n < job->rdzv_min
	    || now - job->rdzv_last < job->core->rdzv_last_call_ms)
		return;
	srv_fmt_secs(secs, sizeof(secs), now - job->rdzv_last);
	cohort__info("job '%s': rendezvous completes with %u of %u..%u "
	             "ranks: no join for %s (--rdzv-last-call)",
	    job->name, job->rdzv_n, job->rdzv_min, job->rdzv_world, secs);
	rdzv_complete(job, now);
}

/* ------------------------------------------------------------------------ */
/* Journal replay                                                           */
/* ------------------------------------------------------------------------ */

cohort_status
srv_rdzv_restore_gen(struct srv_job *job, uint64_t gen, uint32_t world,
    const struct srv_jrn_member *recs, cohort__time now)
{
	struct srv_member *mem = calloc(world, sizeof(*mem));

	if (mem == NULL)
		return (COHORT_ENOMEM);
	srv_job_clear_members(job);
	srv_job_clear_failure(job);
	srv_elastic_clear(job);
	srv_coll_reset(job, COHORT_ESTALE, "restored", true);
	job->members = mem;
	job->world = world;
	job->generation = gen;
	job->state = SRV_JOB_RUNNING;
	for (uint32_t r = 0; r < world; r++) {
		struct srv_member *m = &mem[r];
		struct srv_client *cl;
		m->rank = (int32_t)r;
		m->state = SRV_MEMBER_RUNNING;
		cohort__strlcpy(m->host, recs[r].host, sizeof(m->host));
		m->pid = recs[r].pid;
		m->local_rank = recs[r].local_rank;
		m->hb_ms = recs[r].hb_ms;
		m->dead_ms = recs[r].dead_ms;
		m->last_seen = now;
		m->restored_at = now;
		m->grace_until = now + job->core->restore_grace_ms;
		cl = srv_client_get(
		    job->core, &job->clients, recs[r].client_id, now);
		if (cl == NULL)
			return (COHORT_ENOMEM);
		if (cl->member != NULL)
			cl->member->client = NULL;
		cl->member = m;
		m->client = cl;
	}
	return (srv_group_world(job));
}
