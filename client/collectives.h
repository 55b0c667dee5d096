/*
 * collectives.h - internals of the data-plane layer (client/collectives.c)
 * that a backend may need beyond backend.h.
 *
 * The service backend talks to cohortd through its group's client, which
 * the backend boundary does not carry; it finds the group from the
 * descriptor the group layer built for it.
 */
#ifndef COHORT_COLLECTIVES_H
#define COHORT_COLLECTIVES_H

#include "backend/backend.h"

struct cohort_group;

/* The group a descriptor was built for by the group layer, or NULL when
 * the descriptor comes from somewhere else (a backend unit test). */
struct cohort_group *cohort__desc_group(const struct cohort__group_desc *d);

/* Starts setting up g's data plane (the tcp mesh and shared memory) on
 * its progress thread, when its backend is known before any operation
 * (COHORT_EAGER_CONNECT, coll_known_backend): every member calls it right
 * after the group is created, so the first collective pays no set-up.
 * A failure becomes the group's sticky error, as at a first operation. */
void cohort__coll_setup_early(struct cohort_group *g);

/* Before a member leaves: waits up to ms for the set-up started by
 * cohort__coll_setup_early, so that its peers' set-up completes too (they
 * are connecting to it); past ms the group is aborted. */
void cohort__coll_setup_settle(struct cohort_group *g, cohort_duration ms);

/* Name of an operation kind ("allreduce"), for error texts. */

#endif /* COHORT_COLLECTIVES_H */
