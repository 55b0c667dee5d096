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

/* Name of an operation kind ("allreduce"), for error texts. */

#endif /* COHORT_COLLECTIVES_H */
