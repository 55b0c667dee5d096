/*
 * core.c - the coordinator's context: settings, counters, the tables the
 * layers above keep their objects in.
 */
#include <stdlib.h>
#include <string.h>

#include "core.h"
#include "util.h"

cohort_status
srv_core_init(struct srv_core *core, const struct srv_limits *lim,
    const char *admin_token, srv_sink_fn sink, void *arg, cohort__time now)
{
	core->lim = *lim;
	if (admin_token != NULL && admin_token[0] != '\0'
	    && (core->admin_token = srv_strdup(admin_token)) == NULL)
		return (COHORT_ENOMEM);
	core->sink = sink;
	core->sink_arg = arg;
	core->started = now;
	core->rnd = cohort__now_ns() ^ (uint64_t)(uintptr_t)core;
	srv_list_init(&core->clients);
	srv_map_init(&core->jobs);
	srv_map_init(&core->pipes);
	srv_map_init(&core->closed);
	return (COHORT_OK);
}

void
srv_core_fini(struct srv_core *core)
{
	srv_map_fini(&core->jobs);
	srv_map_fini(&core->pipes);
	srv_map_fini(&core->closed);
	COHORT__FREE_ALL(core->heap, core->pend, core->admin_token);
}

uint64_t
srv_random(struct srv_core *core)
{
	uint64_t z = (core->rnd += 0x9e3779b97f4a7c15ull);

	z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
	z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
	return (z ^ (z >> 31));
}
