/*
 * pipes.c - connections: their clients, the timeouts' clocks, the ids
 * whose close event was seen, the closes cohortd asks for.
 */
#include <stdlib.h>

#include "pipes.h"

/* A pipe whose close event was seen. nng allocates pipe ids sequentially
 * from a random start, so an id is not reused for a long time; entries
 * are kept for PIPES_CLOSED_KEEP_MS. */
struct srv_closed {
	struct srv_hnode hn;
	uint32_t id;
	cohort__time when;
};

#define PIPES_CLOSED_KEEP_MS 60000

struct srv_pipe *
srv_pipe_find(const struct srv_core *core, uint32_t id)
{
	struct srv_hnode *n = srv_map_get(&core->pipes, &id, sizeof(id));

	return (n != NULL ? SRV_CONTAINER(n, struct srv_pipe, hn) : NULL);
}

struct srv_pipe *
srv_pipe_get(struct srv_core *core, uint32_t id)
{
	struct srv_pipe *p = srv_pipe_find(core, id);

	if (p != NULL || id == 0)
		return (p);
	if ((p = calloc(1, sizeof(*p))) == NULL)
		return (NULL);
	p->id = id;
	srv_list_init(&p->clients);
	if (srv_map_put(&core->pipes, &p->hn, &p->id, sizeof(p->id))
	    != COHORT_OK) {
		free(p);
		return (NULL);
	}
	return (p);
}

void
srv_pipe_release(struct srv_core *core, struct srv_pipe *p)
{
	if (srv_list_empty(&p->clients) && !p->conn) {
		srv_map_del(&core->pipes, &p->hn);
		free(p);
	}
}

void
srv_pipe_remove(struct srv_core *core, struct srv_pipe *p)
{
	COHORT__ASSERT(srv_list_empty(&p->clients));
	srv_map_del(&core->pipes, &p->hn);
	free(p);
}

void
srv_pipe_opened(struct srv_core *core, uint32_t id, cohort__time now)
{
	struct srv_pipe *p;

	if (srv_pipe_is_closed(core, id))
		return; /* its close event came first */
	if ((p = srv_pipe_get(core, id)) == NULL || p->conn)
		return; /* untracked: only its clients keep it */
	p->conn = true;
	p->opened = now;
	if (p->nmsg == 0)
		p->last_msg = now;
	core->m.conns_opened++;
}

void
srv_pipe_request(struct srv_core *core, uint32_t id, cohort__time now)
{
	struct srv_pipe *p = srv_pipe_get(core, id);

	if (p != NULL) {
		p->last_msg = now;
		p->nmsg++;
	}
}

void
srv_pipe_note_closed(struct srv_core *core, uint32_t id, cohort__time now)
{
	struct srv_closed *x;

	if (id == 0 || srv_map_get(&core->closed, &id, sizeof(id)) != NULL
	    || (x = calloc(1, sizeof(*x))) == NULL)
		return;
	x->id = id;
	x->when = now;
	if (srv_map_put(&core->closed, &x->hn, &x->id, sizeof(x->id))
	    != COHORT_OK)
		free(x);
}

bool
srv_pipe_is_closed(const struct srv_core *core, uint32_t id)
{
	return (
	    id != 0 && srv_map_get(&core->closed, &id, sizeof(id)) != NULL);
}

void
srv_pipes_prune_closed(struct srv_core *core, cohort__time now)
{
	struct srv_hnode *n, *next;
	size_t i;

	for (n = srv_map_next(&core->closed, &i, NULL); n != NULL; n = next) {
		struct srv_closed *x = SRV_CONTAINER(n, struct srv_closed, hn);
		next = srv_map_next(&core->closed, &i, n);
		if (now - x->when < PIPES_CLOSED_KEEP_MS)
			continue;
		srv_map_del(&core->closed, n);
		free(x);
	}
}

void
srv_pipe_close_later(struct srv_core *core, uint32_t id, cohort__time at)
{
	struct srv_pipe_close *pc;

	if (id == 0 || core->nclose_pipes >= SRV_CLOSE_PIPES)
		return;
	pc = &core->close_pipes[core->nclose_pipes++];
	pc->pipe = id;
	pc->at = at;
}

size_t
srv_pipes_take_to_close(
    struct srv_core *core, cohort__time now, uint32_t *out, size_t max)
{
	size_t n = 0;
	unsigned keep = 0;

	for (unsigned i = 0; i < core->nclose_pipes; i++) {
		struct srv_pipe_close pc = core->close_pipes[i];
		if (pc.at <= now && n < max)
			out[n++] = pc.pipe;
		else
			core->close_pipes[keep++] = pc;
	}
	core->nclose_pipes = keep;
	return (n);
}

void
srv_pipes_credit_lag(struct srv_core *core, cohort__time lag, cohort__time now)
{
	struct srv_hnode *n;
	size_t i;

	for (n = srv_map_next(&core->pipes, &i, NULL); n != NULL;
	     n = srv_map_next(&core->pipes, &i, n)) {
		struct srv_pipe *p = SRV_CONTAINER(n, struct srv_pipe, hn);
		p->opened = p->opened + lag < now ? p->opened + lag : now;
		p->last_msg
		    = p->last_msg + lag < now ? p->last_msg + lag : now;
	}
}

void
srv_pipes_fini(struct srv_core *core)
{
	struct srv_hnode *n;
	size_t i;

	while ((n = srv_map_next(&core->pipes, &i, NULL)) != NULL) {
		srv_map_del(&core->pipes, n);
		free(SRV_CONTAINER(n, struct srv_pipe, hn));
	}
	while ((n = srv_map_next(&core->closed, &i, NULL)) != NULL) {
		srv_map_del(&core->closed, n);
		free(SRV_CONTAINER(n, struct srv_closed, hn));
	}
}
