/*
 * dispatch.h - one request in, at most one reply out
 * (proto/README.md section 2).
 *
 *  0. A request that arrives over a connection whose close event was
 *     already seen is dropped (the client re-sends it).
 *  1. Unpack the framing and envelope: any malformation is COHORT_EPROTO.
 *  2. proto_version must be ours (EPROTO); a body this cohortd does not
 *     know is COHORT_ENOTSUP.
 *  3. StatusQuery goes to observe/status.c (its own authentication).
 *  4. The job's token is checked before anything else: a wrong token or
 *     an unknown job (except for Join, which creates it) is COHORT_EAUTH
 *     with no data, and a text that only repeats the job name the client
 *     sent (the same for both, so it tells nothing about other jobs).
 *     With --require-token a Join creates a job only with the token
 *     minted for that name from the admin secret, or for a job
 *     TENANT/NAME from that tenant's key (common/token.h,
 *     docs/security.md).
 *  5. The client (job, client_id) is found or created. A client is bound
 *     to one connection (pipe) while that connection lives: a request
 *     with its client_id over another connection is refused (EEXIST) and
 *     changes nothing (no reply from its cache, no sign of life, no
 *     rebinding, so closing that connection cannot fail the member).
 *     Otherwise its connection and last-seen time are noted.
 *  6. A seq answered before gets the cached reply, and a seq still
 *     parked hands its slot to this request (the retry takes it over),
 *     only if the request is the same (kind, body, payload length and
 *     head: srv_call.rhash); the same seq for another request is
 *     EINVAL.
 *  7. A request of an older generation is COHORT_ESTALE (Join, Leave and
 *     Reform excepted). In an elastic job (proto/README.md 8.3) heartbeats,
 *     KV requests and failure reports are served whatever their
 *     generation, and the others get COHORT_EMEMBERSHIP from a member of
 *     the current generation, COHORT_EPEERLOST from a process a change
 *     removed (state/elastic.h).
 *  8. The handler answers or parks the call. The unpacked request is freed
 *     here; handlers copy what a parked call needs.
 *
 * Which handler serves a body, and what is checked for it, is one table
 * (dispatch.c): whether it may carry a payload, whether it is mutating
 * (its reply is journalled with its change, and it is refused while the
 * journal cannot be written), whether it must come from a running member
 * (collectives, group creation), whether it may create its job (Join) or
 * be of another generation (Join, Leave, Reform; in an elastic job also
 * heartbeats, KV and failure reports), or has its own authentication
 * (StatusQuery). A Collective of kind COLL_BOUNDARY goes to elastic.c.
 */
#ifndef COHORT_SRV_DISPATCH_H
#define COHORT_SRV_DISPATCH_H

#include "core/core.h"

/* Handles one request: takes ownership of msg; the reply (or none) goes
 * to the core's sink with tp, now or at the end of the event. pipe: the
 * connection it came over (0: none, as in the unit tests). */
void srv_core_dispatch(struct srv_core *core, nng_msg *msg, uint32_t pipe,
    void *tp, cohort__time now);

#endif /* COHORT_SRV_DISPATCH_H */
