/*
 * registry.c - the data-plane backends, one line each.
 *
 * The group layer (client/collectives.c) chooses a backend only through
 * this table: by name when one is configured (COHORT_BACKEND, a
 * subgroup's backend), else, for "auto", the first available entry that
 * takes the operation's memory (device memory or a CUDA stream: nccl,
 * then tcp-staged; host memory: host, also called tcp). Adding a backend is a
 * directory under client/backend/ and a line here.
 */
#include <string.h>

#include "backend/backend.h"

static const struct cohort__backend_entry registry[] = {
	/* name, ops, memory it takes, availability (NULL: always), auto */
	{ "nccl", &cohort__nccl_backend, COHORT__MEM_DEVICE,
	    cohort__nccl_available, true },
	{ "tcp-staged", &cohort__staged_backend, COHORT__MEM_DEVICE,
	    cohort__staged_available, true },
	{ "host", &cohort__host_backend, COHORT__MEM_HOST, NULL, true },
	/* the host backend's name before it ran over shared memory too */
	{ "tcp", &cohort__host_backend, COHORT__MEM_HOST, NULL, false },
	{ "service", &cohort__service_backend, COHORT__MEM_HOST, NULL, false },
};

#define REGISTRY_N (sizeof(registry) / sizeof(registry[0]))

const struct cohort__backend_entry *
cohort__backend_find(const char *name)
{
	for (size_t i = 0; name != NULL && i < REGISTRY_N; i++)
		if (strcmp(registry[i].name, name) == 0)
			return (&registry[i]);
	return (NULL);
}

const struct cohort__backend_entry *
cohort__backend_of(const struct cohort__backend_ops *ops)
{
	for (size_t i = 0; i < REGISTRY_N; i++)
		if (registry[i].ops == ops)
			return (&registry[i]);
	return (NULL);
}

bool
cohort__backend_usable(
    const struct cohort__backend_entry *e, char *why, size_t len)
{
	return (e->available == NULL || e->available(why, len));
}

const struct cohort__backend_entry *
cohort__backend_pick(unsigned mem, char *why, size_t len)
{
	for (size_t i = 0; i < REGISTRY_N; i++)
		if (registry[i].in_auto && (registry[i].mem & mem) != 0
		    && cohort__backend_usable(&registry[i], why, len))
			return (&registry[i]);
	return (NULL);
}

size_t
cohort__backend_names(char *buf, size_t len)
{
	size_t off = 0;

	cohort__appendf(buf, len, &off, "auto");
	for (size_t i = 0; i < REGISTRY_N; i++)
		cohort__appendf(buf, len, &off, ", %s", registry[i].name);
	return (off);
}
