/*
 * map.c - an intrusive chained hash map keyed by bytes (FNV-1a), doubling
 * as it fills. Jobs, clients, keys, groups and collectives all live in one.
 */
#include <stdlib.h>
#include <string.h>

#include "map.h"

static uint64_t
map_hash(const void *key, size_t klen)
{
	const uint8_t *p = key;
	uint64_t h = 1469598103934665603ull;

	for (size_t i = 0; i < klen; i++) {
		h ^= p[i];
		h *= 1099511628211ull;
	}
	return (h ^ (h >> 29));
}

void
srv_map_init(struct srv_map *m)
{
	m->b = NULL;
	m->nb = 0;
	m->n = 0;
}

void
srv_map_fini(struct srv_map *m)
{
	free(m->b);
	srv_map_init(m);
}

struct srv_hnode *
srv_map_get(const struct srv_map *m, const void *key, size_t klen)
{
	uint64_t h;
	struct srv_hnode *n;

	if (m->nb == 0)
		return (NULL);
	h = map_hash(key, klen);
	for (n = m->b[h & (m->nb - 1)]; n != NULL; n = n->next)
		if (n->hash == h && n->klen == klen
		    && memcmp(n->key, key, klen) == 0)
			return (n);
	return (NULL);
}

static cohort_status
map_grow(struct srv_map *m)
{
	size_t nb = m->nb == 0 ? 16 : m->nb * 2;
	struct srv_hnode **b = calloc(nb, sizeof(*b));

	if (b == NULL)
		return (COHORT_ENOMEM);
	for (size_t i = 0; i < m->nb; i++) {
		struct srv_hnode *n = m->b[i], *next;
		for (; n != NULL; n = next) {
			next = n->next;
			n->next = b[n->hash & (nb - 1)];
			b[n->hash & (nb - 1)] = n;
		}
	}
	free(m->b);
	m->b = b;
	m->nb = nb;
	return (COHORT_OK);
}

cohort_status
srv_map_put(
    struct srv_map *m, struct srv_hnode *n, const void *key, size_t klen)
{
	size_t i;

	if (m->n + 1 > m->nb - m->nb / 4 || m->nb == 0)
		if (map_grow(m) != COHORT_OK)
			return (COHORT_ENOMEM);
	n->key = key;
	n->klen = klen;
	n->hash = map_hash(key, klen);
	i = n->hash & (m->nb - 1);
	n->next = m->b[i];
	m->b[i] = n;
	m->n++;
	return (COHORT_OK);
}

void
srv_map_del(struct srv_map *m, struct srv_hnode *n)
{
	struct srv_hnode **pp;

	if (m->nb == 0)
		return;
	for (pp = &m->b[n->hash & (m->nb - 1)]; *pp != NULL;
	     pp = &(*pp)->next) {
		if (*pp == n) {
			*pp = n->next;
			n->next = NULL;
			m->n--;
			return;
		}
	}
}

struct srv_hnode *
srv_map_next(const struct srv_map *m, size_t *i, struct srv_hnode *cur)
{
	if (cur != NULL) {
		if (cur->next != NULL)
			return (cur->next);
		(*i)++;
	} else {
		*i = 0;
	}
	for (; *i < m->nb; (*i)++)
		if (m->b[*i] != NULL)
			return (m->b[*i]);
	return (NULL);
}
