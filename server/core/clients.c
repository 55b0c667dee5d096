/*
 * clients.c - clients of jobs: their table, their connection, their
 * reply cache.
 */
#include <stdlib.h>

#include "clients.h"
#include "pipes.h"

void
srv_clients_init(
    struct srv_clients *cs, struct srv_job *job, struct srv_jrn_job *jr)
{
	srv_map_init(&cs->map);
	cs->job = job;
	cs->jr = jr;
}

void
srv_clients_fini(struct srv_clients *cs)
{
	COHORT__ASSERT(cs->map.n == 0);
	srv_map_fini(&cs->map);
}

struct srv_client *
srv_client_find(const struct srv_clients *cs, uint64_t id)
{
	struct srv_hnode *n = srv_map_get(&cs->map, &id, sizeof(id));

	return (n != NULL ? SRV_CONTAINER(n, struct srv_client, hn) : NULL);
}

struct srv_client *
srv_client_get(struct srv_core *core, struct srv_clients *cs, uint64_t id,
    cohort__time now)
{
	struct srv_client *cl = srv_client_find(cs, id);

	if (cl != NULL)
		return (cl);
	if ((cl = calloc(1, sizeof(*cl))) == NULL)
		return (NULL);
	cl->id = id;
	cl->core = core;
	cl->set = cs;
	cl->job = cs->job;
	cl->last_seen = now;
	srv_list_init(&cl->plink);
	srv_list_init(&cl->parked);
	if (srv_map_put(&cs->map, &cl->hn, &cl->id, sizeof(cl->id))
	    != COHORT_OK) {
		free(cl);
		return (NULL);
	}
	srv_list_append(&core->clients, &cl->alink);
	core->nclients++;
	return (cl);
}

void
srv_client_unlink_pipe(struct srv_client *cl)
{
	struct srv_pipe *p;

	if (cl->pipe == 0)
		return;
	srv_list_remove(&cl->plink);
	p = srv_pipe_find(cl->core, cl->pipe);
	cl->pipe = 0;
	if (p != NULL)
		srv_pipe_release(cl->core, p);
}

void
srv_client_free(struct srv_client *cl)
{
	struct srv_core *core = cl->core;

	COHORT__ASSERT(srv_list_empty(&cl->parked) && cl->member == NULL);
	srv_client_unlink_pipe(cl);
	for (unsigned i = 0; i < SRV_CACHE; i++)
		if (cl->cache[i].msg != NULL)
			nng_msg_free(cl->cache[i].msg);
	srv_map_del(&cl->set->map, &cl->hn);
	srv_list_remove(&cl->alink);
	core->nclients--;
	free(cl);
}

void
srv_client_set_pipe(struct srv_client *cl, uint32_t pipe)
{
	struct srv_pipe *p;

	if (cl->pipe == pipe || pipe == 0)
		return;
	srv_client_unlink_pipe(cl);
	if ((p = srv_pipe_get(cl->core, pipe)) == NULL)
		return;
	cl->pipe = pipe;
	srv_list_append(&p->clients, &cl->plink);
}

void
srv_client_cache_put(struct srv_client *cl, uint64_t seq, uint32_t rhash,
    nng_msg *m, bool durable, bool ok)
{
	struct srv_cached *e = &cl->cache[cl->cache_next++ % SRV_CACHE];

	if (e->msg != NULL)
		nng_msg_free(e->msg);
	*e = (struct srv_cached) { seq, rhash, m, durable, ok, cl->core->ev };
}

struct srv_cached *
srv_client_cache_find(struct srv_client *cl, uint64_t seq)
{
	for (unsigned i = 0; i < SRV_CACHE; i++)
		if (cl->cache[i].msg != NULL && cl->cache[i].seq == seq)
			return (&cl->cache[i]);
	return (NULL);
}

bool
srv_client_has_durable(const struct srv_client *cl)
{
	for (unsigned i = 0; i < SRV_CACHE; i++)
		if (cl->cache[i].msg != NULL && cl->cache[i].durable)
			return (true);
	return (false);
}
