/*
 * th_op.h - a backend operation (client/backend/backend.h) as the backend
 * tests hand it to ops->run: the host backend's unit tests (tests/unit)
 * and the NCCL backend's (tests/cuda). Static inline: the latter run in
 * forked ranks that share no harness state.
 */
#ifndef COHORT_TH_OP_H
#define COHORT_TH_OP_H

#include <stdint.h>

#include "backend/backend.h"

/* op is an ALLTOALLV, number seq of its group, of dtype elements: to
 * each rank q counts[q] from send at sdispls[q], from q rcounts[q] into
 * recv at rdispls[q]. */
static inline void
th_op_alltoallv(struct cohort__op *op, const void *send, void *recv,
    cohort_dtype dtype, const size_t *counts, const size_t *sdispls,
    const size_t *rcounts, const size_t *rdispls, uint64_t seq)
{
	*op = (struct cohort__op) { .kind = COHORT__OP_ALLTOALLV,
		.send = send,
		.recv = recv,
		.dtype = dtype,
		.counts = counts,
		.sdispls = sdispls,
		.rcounts = rcounts,
		.rdispls = rdispls,
		.seq = seq };
}

#endif /* COHORT_TH_OP_H */
