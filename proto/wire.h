/*
 * wire.h - framing of control-plane messages, shared by libcohort and
 * cohortd (proto/README.md section 1). The schema is cohort.proto; its
 * generated code (cohort.pb-c.[ch]) is a build output.
 */
#ifndef COHORT_PROTO_WIRE_H
#define COHORT_PROTO_WIRE_H

#include <stddef.h>

#include <nng/nng.h>

#include "cohort.pb-c.h" /* generated under build/gen */
#include "cohort_common.h"

/* ------------------------------------------------------------------------ */
/* Wire framing (proto/README.md):                                           */
/*   [u32 big-endian L][L bytes packed envelope][payload_len bytes payload] */
/* ------------------------------------------------------------------------ */

/* Packs req (its payload_len is set here) followed by nparts payload parts
 * into a new nng message. Returns COHORT_OK and *out, or ENOMEM/ETOOBIG. */
struct cohort__iov {
	const void *base;
	size_t len;
};
cohort_status cohort__wire_pack_request(Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, nng_msg **out);
cohort_status cohort__wire_pack_reply(Cohort__Reply *rep,
    const struct cohort__iov *parts, size_t nparts, nng_msg **out);
/* The same with the limit of the whole frame (4 + envelope + payload) the
 * receiver accepts; ETOOBIG with the sizes in the error detail when it is
 * exceeded. The two above use COHORT__MAX_MESSAGE for the payload. */
cohort_status cohort__wire_pack_request_max(Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, size_t max_frame,
    nng_msg **out);
cohort_status cohort__wire_pack_reply_max(Cohort__Reply *rep,
    const struct cohort__iov *parts, size_t nparts, size_t max_frame,
    nng_msg **out);

/* Validates framing and unpacks the envelope. On success *req must be freed
 * with cohort__request__free_unpacked(*req, NULL) and *payload points into
 * msg (valid while msg lives). Returns COHORT_EPROTO for any malformed
 * input (short message, bad length, payload_len mismatch, protobuf error),
 * never crashes. */
cohort_status cohort__wire_unpack_request(nng_msg *msg, Cohort__Request **req,
    const uint8_t **payload, size_t *plen);
cohort_status cohort__wire_unpack_reply(
    nng_msg *msg, Cohort__Reply **rep, const uint8_t **payload, size_t *plen);

#endif /* COHORT_PROTO_WIRE_H */
