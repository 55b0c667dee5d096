/*
 * lifecycle.c - jobs come and go: created by their first join (or
 * --job, or a TCPStore listener, or the journal), removed when every
 * member left, expired when abandoned (--job-expiry), freed at stop.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "core/util.h"
#include "journal/log.h"
#include "coll.h"
#include "elastic.h"
#include "kv.h"
#include "lifecycle.h"

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
	srv_job_failure_init(&job->failure);
	job->jr.name = job->name;
	job->jr.token = job->token;
	job->jr.id = job->job_id;
	srv_list_init(&job->rdzv_auto);
	srv_list_init(&job->watchers);
	srv_list_init(&job->joiners);
	srv_job_failure_init(&job->change.failure);
	job->change.rank = -1;
	srv_clients_init(&job->clients, job, &job->jr);
	srv_map_init(&job->groups);
	srv_map_init(&job->colls);
	job->kv = srv_kv_new(core);
	if (job->name == NULL || job->token == NULL || job->kv == NULL
	    || srv_map_put(&core->jobs, &job->hn, job->name, strlen(job->name))
	        != COHORT_OK) {
		srv_kv_free(job->kv);
		free(job->name);
		free(job->token);
		free(job);
		return (NULL);
	}
	cohort__debug("job '%s' created", name);
	return (job);
}

/* A new token (the command line's over the journal's): journalled with
 * the job's next record. */
static cohort_status
job_set_token(struct srv_job *job, const char *token)
{
	char *t;

	if (strcmp(job->token, token) == 0)
		return (COHORT_OK);
	if ((t = srv_strdup(token)) == NULL)
		return (COHORT_ENOMEM);
	free(job->token);
	job->token = t;
	job->jr.token = t;
	job->jr.written = false;
	return (COHORT_OK);
}

void
srv_job_free(struct srv_job *job, const char *why)
{
	struct srv_core *core = job->core;

	/* Freeing a client answers all of its parked calls, whatever they
	 * wait for; every parked call has a client. */
	for (size_t i = 0; i < job->clients.map.nb; i++) {
		while (job->clients.map.b[i] != NULL) {
			struct srv_client *cl = SRV_CONTAINER(
			    job->clients.map.b[i], struct srv_client, hn);
			srv_calls_fail_parked(cl, COHORT_ECLOSED, why);
			if (cl->member != NULL)
				cl->member->client = NULL;
			cl->member = NULL;
			srv_client_free(cl);
		}
	}
	srv_coll_reset(job, COHORT_ECLOSED, why, true);
	srv_job_clear_members(job);
	srv_job_clear_failure(job);
	srv_elastic_clear(job);
	free(job->rdzv_by_rank);
	srv_kv_free(job->kv);
	srv_clients_fini(&job->clients);
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
	srv_jrn_job_del(job->core->jrn, &job->jr);
	srv_job_free(job, "the job finished");
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
	for (n = srv_map_next(&job->clients.map, &i, NULL); n != NULL;
	     n = srv_map_next(&job->clients.map, &i, n)) {
		struct srv_client *cl
		    = SRV_CONTAINER(n, struct srv_client, hn);
		if (cl->pipe != 0 || !srv_list_empty(&cl->parked))
			return (false);
	}
	srv_fmt_secs(secs, sizeof(secs), now - job->last_active);
	cohort__info("job '%s' expired: %s, no member running and no client "
	             "connected for %s (--job-expiry); its %" PRIu64
	             " keys (%" PRIu64 " bytes) are removed",
	    job->name, srv_job_state_name(job), secs, srv_kv_count(job->kv),
	    srv_kv_bytes(job->kv));
	core->m.jobs_expired++;
	srv_jrn_job_del(core->jrn, &job->jr);
	srv_job_free(job, "the job expired");
	return (true);
}

cohort_status
srv_job_add_preset(struct srv_core *core, const char *name, const char *token)
{
	struct srv_job *job;

	if (name[0] == '\0' || strlen(name) > SRV_MAX_NAME
	    || strlen(token) > SRV_MAX_NAME)
		return (cohort__err(COHORT_EINVAL,
		    "job name must be 1..%d bytes and the token at most %d",
		    SRV_MAX_NAME, SRV_MAX_NAME));
	if ((job = srv_job_find(core, name)) != NULL) {
		if (job->preset)
			return (cohort__err(
			    COHORT_EEXIST, "job '%s' is given twice", name));
		/* Restored from the journal: the command line's token
		 * wins (journalled with the job's next record). */
		job->preset = true;
		return (job_set_token(job, token));
	}
	if ((job = srv_job_new(core, name, token)) == NULL)
		return (COHORT_ENOMEM);
	job->preset = true;
	return (COHORT_OK);
}

void
srv_jobs_free_all(struct srv_core *core, const char *why)
{
	struct srv_hnode *n;
	size_t i;

	while ((n = srv_map_next(&core->jobs, &i, NULL)) != NULL)
		srv_job_free(SRV_CONTAINER(n, struct srv_job, hn), why);
}

/* ------------------------------------------------------------------------ */
/* Journal replay                                                           */
/* ------------------------------------------------------------------------ */

struct srv_job *
srv_job_restore(
    struct srv_core *core, const char *name, const char *token, uint64_t id)
{
	struct srv_job *job = srv_job_find(core, name);

	if (job == NULL && (job = srv_job_new(core, name, token)) == NULL)
		return (NULL);
	if (job_set_token(job, token) != COHORT_OK)
		return (NULL);
	job->job_id = job->jr.id = id;
	job->jr.written = true;
	return (job);
}

void
srv_jobs_restored(struct srv_core *core)
{
	struct srv_hnode *n;
	size_t i;

	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		job->jr.written = true;
		job->restored = job->members == NULL;
	}
}
