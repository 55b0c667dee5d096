/*
 * map.h - an intrusive chained hash map keyed by bytes. The node lives in
 * the object (SRV_CONTAINER finds the object), the key in memory the
 * object owns. Jobs, clients, keys, groups, collectives and connections
 * all live in one.
 */
#ifndef COHORT_SRV_MAP_H
#define COHORT_SRV_MAP_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

struct srv_hnode {
	struct srv_hnode *next;
	uint64_t hash;
	const void *key;
	size_t klen;
};

struct srv_map {
	struct srv_hnode **b;
	size_t nb;
	size_t n; /* nodes */
};

void srv_map_init(struct srv_map *m);
/* Frees the table only; the nodes belong to their owners. */
void srv_map_fini(struct srv_map *m);
/* The node with the key, or NULL. */
struct srv_hnode *srv_map_get(
    const struct srv_map *m, const void *key, size_t klen);
/* Inserts n under key (whose memory must outlive n's membership).
 * COHORT_ENOMEM (n not inserted) is the only error. */
cohort_status srv_map_put(
    struct srv_map *m, struct srv_hnode *n, const void *key, size_t klen);
/* Removes n (which must be in m). */
void srv_map_del(struct srv_map *m, struct srv_hnode *n);
/* Iteration: n = srv_map_next(m, &i, NULL) first, then with the previous
 * node, until NULL. Fetch the next node before deleting the current one;
 * inserting while iterating may skip or repeat nodes. */
struct srv_hnode *srv_map_next(
    const struct srv_map *m, size_t *i, struct srv_hnode *cur);

#endif /* COHORT_SRV_MAP_H */
