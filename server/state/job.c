/*
 * job.c - jobs, rendezvous, generations, liveness and failure fan-out
 * (proto/README.md sections 3 and 4).
 *
 * Rendezvous: joins park in rdzv_by_rank (explicit ranks) or rdzv_auto
 * (rank -1) until world_size of them are there; then the generation
 * increases, ranks -1 get the lowest free ranks in arrival order, and
 * every join is answered. A failure (closed pipe, heartbeat silence,
 * ReportFailure) marks the job failed at its generation and answers every
 * parked collective, group creation and watch with COHORT_EPEERLOST.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "srv_impl.h"

const char *
srv_member_state_name(enum srv_member_state st)
{
	static const char *const names[] = {
		[SRV_MEMBER_RUNNING] = "running",
		[SRV_MEMBER_FAILED] = "failed",
		[SRV_MEMBER_LEFT] = "left",
	};

	return ((unsigned)st < sizeof(names) / sizeof(names[0]) ? names[st]
	                                                        : "left");
}

const char *
srv_job_state_name(const struct srv_job *job)
{
	if (job->rdzv_world != 0 || job->state == SRV_JOB_NEW)
		return ("rendezvous");
	if (job->state == SRV_JOB_FAILED)
		return ("failed");
	/* Every member left cleanly: the job is over (until a new
	 * rendezvous), not running. */
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++)
		if (job->members[r].state != SRV_MEMBER_LEFT)
			return ("running");
	return (job->members != NULL ? "finished" : "running");
}

struct srv_job *
srv_job_new(struct srv_core *core, const char *name, const char *token)
{
	struct srv_job *job = calloc(1, sizeof(*job));

	if (job == NULL)
		return (NULL);
	job->core = core;
	job->name = srv_strdup(name);
	job->token = srv_strdup(token);
	job->job_id = srv_random(core);
	job->failed_rank = -1;
	srv_list_init(&job->rdzv_auto);
	srv_list_init(&job->watchers);
	srv_map_init(&job->clients);
	srv_map_init(&job->groups);
	srv_map_init(&job->colls);
	srv_kv_init(&job->kv);
	job->kv.tot_bytes = &core->kv_bytes;
	job->kv.tot_keys = &core->kv_keys;
	if (job->name == NULL || job->token == NULL
	    || srv_map_put(&core->jobs, &job->hn, job->name, strlen(job->name))
	        != COHORT_OK) {
		free(job->name);
		free(job->token);
		free(job);
		return (NULL);
	}
	cohort__debug("job '%s' created", name);
	return (job);
}

static void
job_clear_members(struct srv_job *job)
{
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		struct srv_member *m = &job->members[r];
		if (m->client != NULL)
			m->client->member = NULL;
		free(m->failure);
	}
	free(job->members);
	job->members = NULL;
}

static void
job_clear_failure(struct srv_job *job)
{
	free(job->failed_text);
	free(job->failed_detail);
	job->failed_text = NULL;
	job->failed_detail = NULL;
	job->failed_rank = -1;
}

void
srv_job_free(struct srv_job *job, const char *why)
{
	struct srv_core *core = job->core;

	/* Freeing a client answers all of its parked calls, whatever they
	 * wait for; every parked call has a client. */
	for (size_t i = 0; i < job->clients.nb; i++)
		while (job->clients.b[i] != NULL)
			srv_client_free(SRV_CONTAINER(job->clients.b[i],
			                    struct srv_client, hn),
			    why);
	srv_coll_reset(job, COHORT_ECLOSED, why, true);
	job_clear_members(job);
	job_clear_failure(job);
	free(job->rdzv_by_rank);
	srv_kv_fini(&job->kv);
	srv_map_fini(&job->clients);
	srv_map_fini(&job->groups);
	srv_map_fini(&job->colls);
	srv_map_del(&core->jobs, &job->hn);
	cohort__debug("job '%s' removed", job->name);
	free(job->name);
	free(job->token);
	free(job);
}

void
srv_job_maybe_remove(struct srv_job *job)
{
	if (job->preset || job->rdzv_world != 0
	    || (job->restored && job->members == NULL))
		return;
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++)
		if (job->members[r].state != SRV_MEMBER_LEFT)
			return;
	if (job->members != NULL)
		cohort__info(
		    "job '%s' finished: every member left", job->name);
	srv_jrn_job_del(job);
	srv_job_free(job, "the job finished");
}

uint64_t
srv_core_members_total(struct srv_core *core)
{
	struct srv_hnode *n;
	uint64_t t = 0;
	size_t i;

	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		uint32_t w = job->members != NULL ? job->world : 0;
		t += job->rdzv_world > w ? job->rdzv_world : w;
	}
	return (t);
}

bool
srv_job_maybe_expire(struct srv_job *job, cohort__time now)
{
	struct srv_core *core = job->core;
	struct srv_hnode *n;
	size_t i;
	char secs[32];

	if (job->last_active == 0)
		job->last_active = now;
	if (core->job_expiry_ms == 0 || job->preset || job->rdzv_world != 0
	    || now - job->last_active < core->job_expiry_ms)
		return (false);
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++)
		if (job->members[r].state == SRV_MEMBER_RUNNING)
			return (false);
	for (n = srv_map_next(&job->clients, &i, NULL); n != NULL;
	     n = srv_map_next(&job->clients, &i, n)) {
		struct srv_client *cl
		    = SRV_CONTAINER(n, struct srv_client, hn);
		if (cl->pipe != 0 || !srv_list_empty(&cl->parked))
			return (false);
	}
	srv_fmt_secs(secs, sizeof(secs), now - job->last_active);
	cohort__info("job '%s' expired: %s, no member running and no client "
	             "connected for %s (--job-expiry); its %" PRIu64
	             " keys (%" PRIu64 " bytes) are removed",
	    job->name, srv_job_state_name(job), secs, srv_kv_count(&job->kv),
	    job->kv.bytes);
	core->m.jobs_expired++;
	srv_jrn_job_del(job);
	srv_job_free(job, "the job expired");
	return (true);
}

/* ------------------------------------------------------------------------ */
/* Rendezvous                                                               */
/* ------------------------------------------------------------------------ */

static bool
job_has_live(const struct srv_job *job)
{
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++)
		if (job->members[r].state == SRV_MEMBER_RUNNING)
			return (true);
	return (false);
}

static void
rdzv_reset(struct srv_job *job)
{
	free(job->rdzv_by_rank);
	job->rdzv_by_rank = NULL;
	job->rdzv_world = 0;
	job->rdzv_n = 0;
	srv_list_init(&job->rdzv_auto);
}

static void
rdzv_complete(struct srv_job *job, cohort__time now)
{
	uint32_t w = job->rdzv_world;
	struct srv_call **calls = job->rdzv_by_rank;
	struct srv_member *mem = calloc(w, sizeof(*mem));
	char **hosts = calloc(w, sizeof(char *));
	int32_t *lr = calloc(w, sizeof(int32_t));

	if (mem == NULL || hosts == NULL || lr == NULL) {
		free(mem);
		free(hosts);
		free(lr);
		for (uint32_t r = 0; r < w; r++) {
			if (calls[r] == NULL)
				continue;
			struct srv_call *c = calls[r];
			calls[r] = NULL;
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		}
		while (!srv_list_empty(&job->rdzv_auto)) {
			struct srv_call *c = SRV_CONTAINER(
			    job->rdzv_auto.next, struct srv_call, olink);
			srv_list_remove(&c->olink);
			srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		}
		rdzv_reset(job);
		return;
	}
	for (uint32_t r = 0; r < w; r++) {
		if (calls[r] != NULL)
			continue;
		COHORT__ASSERT(!srv_list_empty(&job->rdzv_auto));
		calls[r] = SRV_CONTAINER(
		    job->rdzv_auto.next, struct srv_call, olink);
		srv_list_remove(&calls[r]->olink);
	}
	job_clear_members(job);
	job_clear_failure(job);
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
		m->rank = (int32_t)r;
		m->state = SRV_MEMBER_RUNNING;
		cohort__strlcpy(
		    m->host, c->host ? c->host : "", sizeof(m->host));
		m->pid = c->pid;
		m->local_rank = c->local_rank;
		m->hb_ms = c->hb_ms ? c->hb_ms : COHORT__DEFAULT_HEARTBEAT_MS;
		m->dead_ms
		    = c->dead_ms ? c->dead_ms : COHORT__DEFAULT_DEAD_AFTER_MS;
		m->last_seen = now;
		m->client = c->client;
		if (c->client->member != NULL)
			c->client->member->client = NULL;
		c->client->member = m;
		hosts[r] = m->host;
		lr[r] = m->local_rank;
	}
	job->rdzv_by_rank = NULL;
	rdzv_reset(job);
	srv_jrn_gen(job);
	cohort__info("job '%s': generation %" PRIu64 " formed with %u ranks",
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
		jr.n_hosts = w;
		jr.hosts = hosts;
		jr.n_local_ranks = w;
		jr.local_ranks = lr;
		jr.job_id = job->job_id;
		jr.max_value_bytes = c->core->lim.max_value;
		jr.max_message_bytes
		    = c->core->lim.max_value + COHORT__ENVELOPE_ALLOWANCE;
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
	char rb[512], secs[32], buf[1024];

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
	snprintf(buf, sizeof(buf),
	    "rendezvous of job '%s' timed out after %s: %u of %u ranks "
	    "joined; missing rank%s %s",
	    job->name, secs, joined, w, nm == 1 ? "" : "s", rb);
	srv_call_timed_out(c, now, buf, miss, nm);
}

/* A join waits in the rendezvous. */
static const struct srv_park_ops job_park_join
    = { SRV_PARK_JOIN, job_withdraw_join, job_expire_join };

void
srv_job_join(struct srv_call *c, const Cohort__Join *j, cohort__time now)
{
	struct srv_job *job = c->job;
	uint32_t w = j->world_size;
	struct srv_call *holder;

	if (w == 0 || w > SRV_MAX_WORLD) {
		srv_call_fail(c, COHORT_EINVAL,
		    "world_size %u is out of range 1..%d", w, SRV_MAX_WORLD);
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
	if (job->rdzv_world == 0) {
		if (job->state == SRV_JOB_RUNNING && job_has_live(job)) {
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
				    j->host, j->pid, w);
				return;
			}
			if (j->rank >= 0 && (uint32_t)j->rank < job->world
			    && job->members[j->rank].state
			        == SRV_MEMBER_RUNNING) {
				struct srv_member *m = &job->members[j->rank];
				srv_call_fail(c, COHORT_EEXIST,
				    "rank %d of job '%s' is held by %s:%u "
				    "(generation %" PRIu64 "); this worker "
				    "(%s:%u) asks for it too",
				    j->rank, job->name, m->host, m->pid,
				    job->generation, j->host, j->pid);
				return;
			}
			srv_call_fail(c, COHORT_ESTATE,
			    "job '%s' is running generation %" PRIu64
			    " with %u ranks; this worker (%s:%u) is not one "
			    "of its members: a new generation starts once "
			    "generation %" PRIu64 " failed or every member "
			    "left",
			    job->name, job->generation, job->world, j->host,
			    j->pid, job->generation);
			return;
		}
		if (job->core->lim.max_total_members != 0) {
			/* this job's last generation makes room for its next
			 */
			uint64_t tot = srv_core_members_total(job->core)
			    - (job->members != NULL ? job->world : 0);
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
		job->rdzv_n = 0;
		job->rdzv_start = now;
		job->restored = false;
	} else if (w != job->rdzv_world) {
		srv_call_fail(c, COHORT_EINVAL,
		    "job '%s' has world size %u (rendezvous of generation "
		    "%" PRIu64 ", %u of %u joined); this worker (%s:%u) says "
		    "%u: another launch with the same job name? (COHORT_JOB)",
		    job->name, job->rdzv_world, job->generation + 1,
		    job->rdzv_n, job->rdzv_world, j->host, j->pid, w);
		return;
	}
	if (j->rank >= 0 && (holder = job->rdzv_by_rank[j->rank]) != NULL) {
		srv_call_fail(c, COHORT_EEXIST,
		    "rank %d of job '%s' is already requested by %s:%u",
		    j->rank, job->name, holder->host ? holder->host : "?",
		    holder->pid);
		return;
	}
	if ((c->host = srv_strdup(j->host)) == NULL) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	c->rank = j->rank;
	c->world = w;
	c->pid = j->pid;
	c->local_rank = j->local_rank;
	c->hb_ms = j->heartbeat_ms;
	c->dead_ms = j->dead_after_ms;
	if (j->rank >= 0)
		job->rdzv_by_rank[j->rank] = c;
	else
		srv_list_append(&job->rdzv_auto, &c->olink);
	job->rdzv_n++;
	srv_call_park(c, &job_park_join);
	if (job->rdzv_n == job->rdzv_world)
		rdzv_complete(job, now);
}

/* ------------------------------------------------------------------------ */
/* Membership calls                                                         */
/* ------------------------------------------------------------------------ */

void
srv_job_leave(struct srv_call *c, cohort__time now)
{
	struct srv_job *job = c->job;
	struct srv_member *m = c->client->member;
	struct srv_link *l, *next;

	/* A join still parked for this client is withdrawn. */
	for (l = c->client->parked.next; l != &c->client->parked; l = next) {
		struct srv_call *p = SRV_CONTAINER(l, struct srv_call, clink);
		next = l->next;
		if (p->park != SRV_PARK_JOIN)
			continue;
		srv_call_withdraw(p, now);
		srv_call_fail(p, COHORT_ECLOSED,
		    "the client left before the rendezvous completed");
	}
	if (m != NULL && m->state == SRV_MEMBER_RUNNING) {
		m->state = SRV_MEMBER_LEFT;
		m->in_op = false; /* gone: in no operation any more */
		srv_jrn_leave(job, m);
		cohort__info("job '%s': rank %d (%s:%u) left", job->name,
		    m->rank, m->host, m->pid);
		srv_coll_rank_left(job, m->rank);
	}
	if (c->client->pipe != 0
	    && job->core->nclose_pipes < SRV_CLOSE_PIPES) {
		struct srv_pipe_close *pc
		    = &job->core->close_pipes[job->core->nclose_pipes++];
		pc->pipe = c->client->pipe;
		pc->at = now + 50;
	}
	srv_call_fail(c, COHORT_OK, "%s", "");
}

/* Notes what a member reports doing (a heartbeat, or a failure report). */
static void
job_note_doing(
    struct srv_member *m, const Cohort__Heartbeat *hb, cohort__time now)
{
	bool same = m->in_op && hb->in_op && m->last_op_seq == hb->last_op_seq
	    && strcmp(m->last_group, hb->last_group) == 0;

	cohort__strlcpy(m->last_op, hb->last_op, sizeof(m->last_op));
	cohort__strlcpy(m->last_group, hb->last_group, sizeof(m->last_group));
	m->last_op_seq = hb->last_op_seq;
	/* Keep the first estimate of the entry time of one op, so that
	 * heartbeat delays do not move it. */
	if (!same) {
		cohort__time in = (cohort__time)hb->in_op_ms;
		m->op_since = in < now ? now - in : 0;
	}
	m->in_op = hb->in_op;
	m->op_at = now;
}

void
srv_job_heartbeat(
    struct srv_call *c, const Cohort__Heartbeat *hb, cohort__time now)
{
	struct srv_job *job = c->job;
	struct srv_member *m = c->client->member;
	Cohort__Reply rep;
	Cohort__HeartbeatReply hr;

	if (m != NULL) {
		job_note_doing(m, hb, now);
		if (hb->metrics != NULL)
			srv_obs_note(
			    job->core, job->name, m->rank, hb->metrics, now);
	}
	srv_reply_init(&rep, c, COHORT_OK);
	cohort__heartbeat_reply__init(&hr);
	hr.healthy = job->state != SRV_JOB_FAILED;
	hr.server_time_ms = (uint64_t)now;
	if (!hr.healthy)
		srv_reply_failure(&rep, job);
	rep.body_case = COHORT__REPLY__BODY_HEARTBEAT;
	rep.heartbeat = &hr;
	srv_call_answer(c, &rep, NULL, 0);
}

static void
job_withdraw_watch(struct srv_call *c)
{
	srv_list_remove(&c->olink);
}

static void
job_expire_watch(struct srv_call *c, cohort__time now)
{
	Cohort__Reply rep;

	srv_call_withdraw(c, now);
	srv_reply_init(&rep, c, COHORT_OK);
	srv_call_answer(c, &rep, NULL, 0);
}

/* A watch waits in job->watchers. */
static const struct srv_park_ops job_park_watch
    = { SRV_PARK_WATCH, job_withdraw_watch, job_expire_watch };

void
srv_job_watch(struct srv_call *c, cohort__time now)
{
	struct srv_job *job = c->job;

	(void)now;
	if (job->state == SRV_JOB_FAILED) {
		srv_call_peerlost(c);
		return;
	}
	srv_list_append(&job->watchers, &c->olink);
	srv_call_park(c, &job_park_watch);
}

void
srv_job_report(
    struct srv_call *c, const Cohort__ReportFailure *rf, cohort__time now)
{
	struct srv_member *m = c->client->member;

	if (m == NULL) {
		srv_call_fail(c, COHORT_ESTATE,
		    "only a member of job '%s' can report a failure",
		    c->job->name);
		return;
	}
	if (rf->doing != NULL && rf->doing->last_op != NULL
	    && rf->doing->last_op[0] != '\0')
		job_note_doing(m, rf->doing, now);
	srv_job_fail_member(c->job, m,
	    rf->text[0] != '\0' ? rf->text : "failure reported without text",
	    now);
	srv_call_fail(c, COHORT_OK, "%s", "");
}

struct srv_member *
srv_job_collective_member(struct srv_call *c)
{
	struct srv_job *job = c->job;
	struct srv_member *m = c->client->member;

	if (m == NULL) {
		srv_call_fail(c, COHORT_ESTATE,
		    "this client is not a member of job '%s' (join first)",
		    job->name);
		return (NULL);
	}
	if (job->state == SRV_JOB_FAILED) {
		srv_call_peerlost(c);
		return (NULL);
	}
	if (m->state == SRV_MEMBER_LEFT) {
		srv_call_fail(c, COHORT_ESTATE,
		    "rank %d already left job '%s'", m->rank, job->name);
		return (NULL);
	}
	return (m);
}

/* ------------------------------------------------------------------------ */
/* Failure                                                                  */
/* ------------------------------------------------------------------------ */

void
srv_job_fail_member(struct srv_job *job, struct srv_member *m,
    const char *text, cohort__time now)
{
	char op[800], detail[1400];
	const char *nl;
	int tl;

	if (m->state != SRV_MEMBER_RUNNING)
		return;
	m->state = SRV_MEMBER_FAILED;
	free(m->failure);
	m->failure = srv_strdup(text);
	job->core->m.failures++;
	srv_obs_failure(job->core, job->name, m->rank, text, now);
	op[0] = '\0';
	if (m->client != NULL) {
		struct srv_link *l;
		for (l = m->client->parked.next; l != &m->client->parked;
		     l = l->next) {
			struct srv_call *p
			    = SRV_CONTAINER(l, struct srv_call, clink);
			if (p->park == SRV_PARK_COLL
			    || p->park == SRV_PARK_GROUP) {
				srv_coll_describe(p, op, sizeof(op));
				break;
			}
		}
	}
	if (op[0] == '\0' && m->last_op[0] != '\0') {
		/* Known now (reported with the failure), or only from the
		 * last heartbeat: then say how old it is, never that the
		 * rank failed "during" an operation it may have finished. */
		if (m->op_at == now)
			snprintf(op, sizeof(op), "%s %s (#%" PRIu64 ")",
			    m->in_op ? "during" : "after", m->last_op,
			    m->last_op_seq);
		else
			snprintf(op, sizeof(op),
			    "(its last heartbeat, %.1f s before: %s %s "
			    "#%" PRIu64 ")",
			    (double)(now - m->op_at) / 1000.0,
			    m->in_op ? "in" : "after", m->last_op,
			    m->last_op_seq);
	} else if (op[0] != '\0') {
		char parked[sizeof(op)];
		cohort__strlcpy(parked, op, sizeof(parked));
		snprintf(op, sizeof(op), "during %.780s", parked);
	}
	nl = strchr(text, '\n');
	tl = nl != NULL ? (int)(nl - text) : (int)strlen(text);
	if (tl > 300)
		tl = 300;
	snprintf(detail, sizeof(detail), "rank %d (%s:%u) failed%s%s: %.*s",
	    m->rank, m->host, m->pid, op[0] ? " " : "", op, tl, text);
	{
		/* job, rank, op and seq as fields of a JSON log line */
		struct cohort__log_ctx lc = { job->name, m->rank,
			m->last_op[0] != '\0' ? m->last_op : NULL,
			m->last_op_seq };
		const struct cohort__log_ctx *saved
		    = cohort__log_ctx_push(&lc);

		cohort__warn("job '%s' generation %" PRIu64 ": %s", job->name,
		    job->generation, detail);
		cohort__log_ctx_pop(saved);
	}
	srv_jrn_fail(job, m, detail);
	if (job->state != SRV_JOB_RUNNING)
		return;
	job->state = SRV_JOB_FAILED;
	job_clear_failure(job);
	job->failed_rank = m->rank;
	job->failed_text = srv_strdup(text);
	job->failed_detail = srv_strdup(detail);
	srv_coll_reset(job, COHORT_EPEERLOST, detail, false);
	while (!srv_list_empty(&job->watchers)) {
		struct srv_call *c = SRV_CONTAINER(
		    job->watchers.next, struct srv_call, olink);
		srv_list_remove(&c->olink);
		srv_call_peerlost(c);
	}
}

void
srv_job_sweep(struct srv_job *job, cohort__time now)
{
	for (uint32_t r = 0; job->members != NULL && r < job->world; r++) {
		struct srv_member *m = &job->members[r];
		char text[64];
		if (m->state != SRV_MEMBER_RUNNING
		    || now - m->last_seen <= (cohort__time)m->dead_ms
		    || now < m->grace_until)
			continue;
		if (m->restored_at != 0 && m->last_seen == m->restored_at)
			snprintf(text, sizeof(text),
			    "did not reconnect within %.1f s of cohortd's "
			    "restart",
			    (double)(now - m->restored_at) / 1000.0);
		else
			snprintf(text, sizeof(text), "no heartbeat for %.1f s",
			    (double)(now - m->last_seen) / 1000.0);
		srv_job_fail_member(job, m, text, now);
	}
}

/* ------------------------------------------------------------------------ */
/* Journal replay and hang attribution                                      */
/* ------------------------------------------------------------------------ */

cohort_status
srv_job_restore_gen(struct srv_job *job, uint64_t gen, uint32_t world,
    struct srv_member *mem, const uint64_t *client_ids, cohort__time now)
{
	job_clear_members(job);
	job_clear_failure(job);
	srv_coll_reset(job, COHORT_ESTALE, "restored", true);
	job->members = mem;
	job->world = world;
	job->generation = gen;
	job->state = SRV_JOB_RUNNING;
	for (uint32_t r = 0; r < world; r++) {
		struct srv_member *m = &mem[r];
		struct srv_client *cl
		    = srv_client_get(job, client_ids[r], now);
		m->rank = (int32_t)r;
		m->last_seen = now;
		m->restored_at = now;
		m->grace_until = now + job->core->restore_grace_ms;
		if (cl == NULL)
			return (COHORT_ENOMEM);
		if (cl->member != NULL)
			cl->member->client = NULL;
		cl->member = m;
		m->client = cl;
	}
	return (srv_group_world(job));
}

void
srv_job_restore_fail(
    struct srv_job *job, int32_t rank, const char *text, const char *detail)
{
	struct srv_member *m;

	if (job->members == NULL || rank < 0 || (uint32_t)rank >= job->world)
		return;
	m = &job->members[rank];
	if (m->state != SRV_MEMBER_RUNNING)
		return;
	m->state = SRV_MEMBER_FAILED;
	free(m->failure);
	m->failure = srv_strdup(text);
	if (job->state != SRV_JOB_RUNNING)
		return;
	job->state = SRV_JOB_FAILED;
	job_clear_failure(job);
	job->failed_rank = rank;
	job->failed_text = srv_strdup(text);
	job->failed_detail = srv_strdup(detail);
}

void
srv_member_doing(const struct srv_job *job, const struct srv_member *m,
    cohort__time now, bool longform, char *buf, size_t len)
{
	char secs[32], what[700], grp[300];
	struct srv_link *l;

	(void)job;
	what[0] = grp[0] = '\0';
	if (m->state != SRV_MEMBER_RUNNING) {
		snprintf(buf, len, "rank %d %s", m->rank,
		    srv_member_state_name(m->state));
		return;
	}
	/* Parked here: cohortd knows exactly. */
	if (m->client != NULL) {
		for (l = m->client->parked.next; l != &m->client->parked;
		     l = l->next) {
			struct srv_call *p
			    = SRV_CONTAINER(l, struct srv_call, clink);
			if (p->park != SRV_PARK_COLL
			    && p->park != SRV_PARK_GROUP)
				continue;
			srv_coll_describe(p, what, sizeof(what));
			srv_fmt_secs(secs, sizeof(secs), now - p->start);
			if (longform)
				snprintf(buf, len, "rank %d is in %s since %s",
				    m->rank, what, secs);
			else
				snprintf(
				    buf, len, "rank %d in %s", m->rank, what);
			return;
		}
	}
	if (m->last_group[0] != '\0')
		snprintf(grp, sizeof(grp), " on group '%s'", m->last_group);
	if (m->in_op && m->last_op[0] != '\0') {
		srv_fmt_secs(secs, sizeof(secs), now - m->op_since);
		if (longform)
			snprintf(buf, len,
			    "rank %d is in %s #%" PRIu64 "%s "
			    "since %s",
			    m->rank, m->last_op, m->last_op_seq, grp, secs);
		else
			snprintf(buf, len, "rank %d in %s #%" PRIu64 "%s",
			    m->rank, m->last_op, m->last_op_seq, grp);
		return;
	}
	srv_fmt_secs(secs, sizeof(secs), now - m->last_seen);
	if (m->last_op[0] != '\0')
		snprintf(buf, len,
		    "rank %d last seen %s ago %s %s #%" PRIu64 "%s", m->rank,
		    secs, longform ? "doing" : "after", m->last_op,
		    m->last_op_seq, grp);
	else
		snprintf(buf, len, "rank %d last seen %s ago", m->rank, secs);
}
