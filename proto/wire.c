/*
 * wire.c - framing of control-plane messages (proto/README.md).
 *
 *   [u32 big-endian L][L bytes packed Request/Reply][payload_len bytes]
 *
 * The payload is appended straight into the nng message, so bulk bytes are
 * copied exactly once on the way out and never by protobuf.
 */
#include <stddef.h>
#include <string.h>

#include <nng/nng.h>

#include "wire.h"

/* max_frame 0: the payload alone against COHORT__MAX_MESSAGE (the
 * historical check); else the whole frame against max_frame. */
static cohort_status
wire_pack(const ProtobufCMessage *env, uint64_t *payload_len_field,
    const struct cohort__iov *parts, size_t nparts, size_t max_frame,
    nng_msg **out)
{
	size_t plen = 0;
	size_t elen;
	uint8_t *p;
	nng_msg *m;
	int rv;

	for (size_t i = 0; i < nparts; i++)
		plen += parts[i].len;
	if (max_frame == 0 && plen > COHORT__MAX_MESSAGE)
		return (cohort__err(COHORT_ETOOBIG,
		    "payload of %zu bytes exceeds the message limit of %u",
		    plen, (unsigned)COHORT__MAX_MESSAGE));
	*payload_len_field = plen;
	elen = protobuf_c_message_get_packed_size(env);
	if (elen > UINT32_MAX)
		return (COHORT_ETOOBIG);
	if (max_frame != 0
	    && (plen > max_frame || 4 + elen > max_frame - plen))
		return (cohort__err(COHORT_ETOOBIG,
		    "message of %zu bytes (payload %zu + header %zu) exceeds "
		    "the receiver's limit of %zu bytes",
		    4 + elen + plen, plen, 4 + elen, max_frame));
	if ((rv = nng_msg_alloc(&m, 4 + elen + plen)) != 0)
		return (cohort__err(cohort__from_nng(rv), "nng_msg_alloc: %s",
		    nng_strerror(rv)));
	p = nng_msg_body(m);
	p[0] = (uint8_t)(elen >> 24);
	p[1] = (uint8_t)(elen >> 16);
	p[2] = (uint8_t)(elen >> 8);
	p[3] = (uint8_t)elen;
	protobuf_c_message_pack(env, p + 4);
	p += 4 + elen;
	for (size_t i = 0; i < nparts; i++) {
		if (parts[i].len > 0)
			memcpy(p, parts[i].base, parts[i].len);
		p += parts[i].len;
	}
	*out = m;
	return (COHORT_OK);
}

cohort_status
cohort__wire_pack_request(Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, nng_msg **out)
{
	return (
	    wire_pack(&req->base, &req->payload_len, parts, nparts, 0, out));
}

cohort_status
cohort__wire_pack_request_max(Cohort__Request *req,
    const struct cohort__iov *parts, size_t nparts, size_t max_frame,
    nng_msg **out)
{
	return (wire_pack(
	    &req->base, &req->payload_len, parts, nparts, max_frame, out));
}

cohort_status
cohort__wire_pack_reply_max(Cohort__Reply *rep,
    const struct cohort__iov *parts, size_t nparts, size_t max_frame,
    nng_msg **out)
{
	return (wire_pack(
	    &rep->base, &rep->payload_len, parts, nparts, max_frame, out));
}

cohort_status
cohort__wire_pack_reply(Cohort__Reply *rep, const struct cohort__iov *parts,
    size_t nparts, nng_msg **out)
{
	return (
	    wire_pack(&rep->base, &rep->payload_len, parts, nparts, 0, out));
}

/* Splits msg into envelope bytes and payload; EPROTO on any malformation. */
static cohort_status
wire_split(nng_msg *msg, const uint8_t **env, size_t *elen)
{
	const uint8_t *p = nng_msg_body(msg);
	size_t len = nng_msg_len(msg);
	uint32_t l;

	if (len < 4)
		return (cohort__err(COHORT_EPROTO,
		    "message of %zu bytes is shorter than its frame header",
		    len));
	l = ((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16)
	    | ((uint32_t)p[2] << 8) | p[3];
	if (l > len - 4)
		return (cohort__err(COHORT_EPROTO,
		    "envelope length %u exceeds message length %zu", l, len));
	*env = p + 4;
	*elen = l;
	return (COHORT_OK);
}

/* Unpacks msg as a message of type desc (what: its name in errors) whose
 * payload_len field lies at len_off, and finds its payload. */
static cohort_status
wire_unpack(nng_msg *msg, const ProtobufCMessageDescriptor *desc,
    const char *what, size_t len_off, ProtobufCMessage **out,
    const uint8_t **payload, size_t *plen)
{
	const uint8_t *env = NULL;
	size_t elen = 0, rest;
	ProtobufCMessage *m;
	uint64_t declared;
	cohort_status rv;

	if ((rv = wire_split(msg, &env, &elen)) != COHORT_OK)
		return (rv);
	if ((m = protobuf_c_message_unpack(desc, NULL, elen, env)) == NULL)
		return (cohort__err(COHORT_EPROTO,
		    "%s envelope is not a valid protobuf message", what));
	rest = nng_msg_len(msg) - 4 - elen;
	memcpy(&declared, (const uint8_t *)m + len_off, sizeof(declared));
	if (declared != rest) {
		cohort__err(COHORT_EPROTO,
		    "payload_len %llu does not match the %zu trailing bytes",
		    (unsigned long long)declared, rest);
		protobuf_c_message_free_unpacked(m, NULL);
		return (COHORT_EPROTO);
	}
	*out = m;
	*payload = env + elen;
	*plen = rest;
	return (COHORT_OK);
}

cohort_status
cohort__wire_unpack_request(nng_msg *msg, Cohort__Request **reqp,
    const uint8_t **payload, size_t *plen)
{
	ProtobufCMessage *m;
	cohort_status rv;

	rv = wire_unpack(msg, &cohort__request__descriptor, "request",
	    offsetof(Cohort__Request, payload_len), &m, payload, plen);
	if (rv == COHORT_OK)
		*reqp = (Cohort__Request *)m;
	return (rv);
}

cohort_status
cohort__wire_unpack_reply(
    nng_msg *msg, Cohort__Reply **repp, const uint8_t **payload, size_t *plen)
{
	ProtobufCMessage *m;
	cohort_status rv;

	rv = wire_unpack(msg, &cohort__reply__descriptor, "reply",
	    offsetof(Cohort__Reply, payload_len), &m, payload, plen);
	if (rv == COHORT_OK)
		*repp = (Cohort__Reply *)m;
	return (rv);
}
