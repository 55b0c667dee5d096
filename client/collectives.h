/*
 * collectives.h - what the client's top (open.c) uses of the data-plane
 * layer (client/collectives.c) beyond the public API: the set-up of a
 * group's data plane ahead of its first operation. Backends see none of
 * it (backend.h is their whole boundary).
 */
#ifndef COHORT_COLLECTIVES_H
#define COHORT_COLLECTIVES_H

#include "cohort_impl.h"

struct cohort_group;

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

/* Elastic (cohort_client_reform): tears g's data plane down - drains its
 * queue (the group is failed first, so queued work fails at once), stops
 * the progress thread, finis the backend (the tcp mesh and shared memory
 * closed, the NCCL communicator aborted) - and leaves a fresh, unset-up
 * one with the same backend choice, which the group's next operation (or
 * cohort__coll_setup_early) sets up for its new membership. When members
 * were only lost (exclude: their old group ranks, nexclude > 0) and the
 * backend can shrink (backend.h v3: NCCL's ncclCommShrink), its state is
 * kept for that set-up to shrink instead. No operation may be in flight
 * on g or waited for (cohort_work handles freed). */
void cohort__coll_teardown(
    struct cohort_group *g, const int *exclude, int nexclude);

#endif /* COHORT_COLLECTIVES_H */
