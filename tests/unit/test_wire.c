/*
 * test_wire.c - framing of control-plane messages: round trips with a
 * payload, truncated frames, length lies, garbage.
 */
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_impl.h"

Suite *suite_wire(void);

/* Builds a Request with a KvSet body and a two-part payload. */
static nng_msg *
wire_sample_request(void)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvSet kv = COHORT__KV_SET__INIT;
	struct cohort__iov parts[2] = { { "hello ", 6 }, { "world", 5 } };
	nng_msg *m;

	req.proto_version = COHORT_PROTO_VERSION;
	req.job = "job-a";
	req.token = "tok";
	req.client_id = 0x1122334455667788ull;
	req.seq = 42;
	req.generation = 3;
	req.rank = -1;
	req.timeout_ms = 0xffffffffu;
	kv.key = "some/key";
	req.body_case = COHORT__REQUEST__BODY_KV_SET;
	req.kv_set = &kv;
	ck_assert_cohort_ok(cohort__wire_pack_request(&req, parts, 2, &m));
	ck_assert_uint_eq(req.payload_len, 11);
	return (m);
}

static uint32_t
wire_env_len(nng_msg *m)
{
	const uint8_t *p = nng_msg_body(m);

	return (((uint32_t)p[0] << 24) | ((uint32_t)p[1] << 16)
	    | ((uint32_t)p[2] << 8) | p[3]);
}

START_TEST(test_request_round_trip)
{
	nng_msg *m = wire_sample_request();
	Cohort__Request *req;
	const uint8_t *payload;
	size_t plen;

	ck_assert_cohort_ok(
	    cohort__wire_unpack_request(m, &req, &payload, &plen));
	ck_assert_uint_eq(req->proto_version, COHORT_PROTO_VERSION);
	ck_assert_str_eq(req->job, "job-a");
	ck_assert_str_eq(req->token, "tok");
	ck_assert(req->client_id == 0x1122334455667788ull);
	ck_assert_uint_eq(req->seq, 42);
	ck_assert_uint_eq(req->generation, 3);
	ck_assert_int_eq(req->rank, -1);
	ck_assert_uint_eq(req->timeout_ms, 0xffffffffu);
	ck_assert_int_eq(req->body_case, COHORT__REQUEST__BODY_KV_SET);
	ck_assert_str_eq(req->kv_set->key, "some/key");
	ck_assert_uint_eq(plen, 11);
	ck_assert(memcmp(payload, "hello world", 11) == 0);
	/* the payload points into the message */
	ck_assert(payload >= (const uint8_t *)nng_msg_body(m)
	    && payload + plen
	        <= (const uint8_t *)nng_msg_body(m) + nng_msg_len(m));
	cohort__request__free_unpacked(req, NULL);
	nng_msg_free(m);
}
END_TEST

START_TEST(test_reply_round_trip)
{
	Cohort__Reply rep = COHORT__REPLY__INIT;
	Cohort__CollectiveReply cr = COHORT__COLLECTIVE_REPLY__INIT;
	int32_t missing[3] = { 1, 5, 7 };
	double f64s[2] = { 1.5, -2.25 };
	struct cohort__iov part = { "\0\1\2\3", 4 };
	Cohort__Reply *out;
	const uint8_t *payload;
	size_t plen;
	nng_msg *m;

	rep.seq = 9;
	rep.status = COHORT_ETIMEDOUT;
	rep.error = "barrier 'x' (#5) timed out";
	rep.missing_ranks = missing;
	rep.n_missing_ranks = 3;
	rep.failed_rank = -1;
	cr.f64s = f64s;
	cr.n_f64s = 2;
	cr.decision = true;
	rep.body_case = COHORT__REPLY__BODY_COLLECTIVE;
	rep.collective = &cr;
	ck_assert_cohort_ok(cohort__wire_pack_reply(&rep, &part, 1, &m));
	ck_assert_cohort_ok(
	    cohort__wire_unpack_reply(m, &out, &payload, &plen));
	ck_assert_uint_eq(out->seq, 9);
	ck_assert_int_eq(out->status, COHORT_ETIMEDOUT);
	ck_assert_str_eq(out->error, "barrier 'x' (#5) timed out");
	ck_assert_uint_eq(out->n_missing_ranks, 3);
	ck_assert_int_eq(out->missing_ranks[2], 7);
	ck_assert_int_eq(out->failed_rank, -1);
	ck_assert_int_eq(out->body_case, COHORT__REPLY__BODY_COLLECTIVE);
	ck_assert(out->collective->decision);
	ck_assert_uint_eq(out->collective->n_f64s, 2);
	ck_assert(out->collective->f64s[1] == -2.25);
	ck_assert_uint_eq(plen, 4);
	ck_assert(memcmp(payload, "\0\1\2\3", 4) == 0);
	cohort__reply__free_unpacked(out, NULL);
	nng_msg_free(m);
}
END_TEST

START_TEST(test_empty_payload_and_empty_envelope)
{
	Cohort__Reply rep = COHORT__REPLY__INIT;
	Cohort__Reply *out;
	const uint8_t *payload;
	size_t plen;
	nng_msg *m;

	/* all defaults: packs to zero bytes of envelope */
	ck_assert_cohort_ok(cohort__wire_pack_reply(&rep, NULL, 0, &m));
	ck_assert_uint_eq(nng_msg_len(m), 4 + wire_env_len(m));
	ck_assert_cohort_ok(
	    cohort__wire_unpack_reply(m, &out, &payload, &plen));
	ck_assert_uint_eq(plen, 0);
	ck_assert_int_eq(out->status, 0);
	cohort__reply__free_unpacked(out, NULL);
	nng_msg_free(m);
}
END_TEST

/* m is refused as a request (EPROTO). */
static void
wire_refused(nng_msg *m)
{
	Cohort__Request *req;
	const uint8_t *payload;
	size_t plen;

	ck_assert_cohort_err(
	    cohort__wire_unpack_request(m, &req, &payload, &plen),
	    COHORT_EPROTO);
}

/* A message of the n bytes at p is refused as a request. */
static void
wire_refused_bytes(const void *p, size_t n)
{
	nng_msg *m;

	ck_assert_int_eq(nng_msg_alloc(&m, n), 0);
	memcpy(nng_msg_body(m), p, n);
	wire_refused(m);
	nng_msg_free(m);
}

START_TEST(test_short_message)
{
	static const uint8_t zeros[4];

	for (size_t n = 0; n < sizeof(zeros); n++)
		wire_refused_bytes(zeros, n);
}
END_TEST

START_TEST(test_truncated_frames)
{
	nng_msg *full = wire_sample_request();

	/* every strict prefix is refused: the envelope length or the
	 * payload length no longer matches */
	for (size_t n = 0; n < nng_msg_len(full); n++)
		wire_refused_bytes(nng_msg_body(full), n);
	nng_msg_free(full);
}
END_TEST

START_TEST(test_envelope_length_lie)
{
	nng_msg *m = wire_sample_request();
	uint8_t *p = nng_msg_body(m);

	/* L larger than the message */
	p[0] = 0x7f;
	wire_refused(m);
	p[0] = 0xff;
	p[1] = p[2] = p[3] = 0xff;
	wire_refused(m);
	nng_msg_free(m);
}
END_TEST

START_TEST(test_payload_length_lie)
{
	nng_msg *m = wire_sample_request();

	/* one trailing byte more than payload_len says */
	ck_assert_int_eq(nng_msg_append(m, "!", 1), 0);
	wire_refused(m);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "payload_len"));
	/* two fewer */
	ck_assert_int_eq(nng_msg_chop(m, 3), 0);
	wire_refused(m);
	nng_msg_free(m);
}
END_TEST

START_TEST(test_garbage_envelope)
{
	static const uint8_t bad[] = { 0, 0, 0, 4, 0xff, 0xff, 0xff, 0xff };
	Cohort__Reply *rep;
	const uint8_t *payload;
	size_t plen;
	nng_msg *m;

	ck_assert_int_eq(nng_msg_alloc(&m, sizeof(bad)), 0);
	memcpy(nng_msg_body(m), bad, sizeof(bad));
	ck_assert_cohort_err(
	    cohort__wire_unpack_reply(m, &rep, &payload, &plen),
	    COHORT_EPROTO);
	nng_msg_free(m);
}
END_TEST

START_TEST(test_random_garbage_never_crashes)
{
	Cohort__Request *req;
	const uint8_t *payload;
	size_t plen;
	unsigned seed = 12345;
	nng_msg *m;
	int refused = 0;

	for (int i = 0; i < 2000; i++) {
		size_t n = (size_t)(rand_r(&seed) % 64);
		uint8_t *p;

		ck_assert_int_eq(nng_msg_alloc(&m, n), 0);
		p = nng_msg_body(m);
		for (size_t j = 0; j < n; j++)
			p[j] = (uint8_t)rand_r(&seed);
		/* a plausible envelope length half the time */
		if (n >= 4 && (i & 1)) {
			p[0] = p[1] = p[2] = 0;
			p[3] = (uint8_t)(n - 4);
		}
		if (cohort__wire_unpack_request(m, &req, &payload, &plen)
		    == COHORT_OK) {
			ck_assert_uint_eq(plen, req->payload_len);
			cohort__request__free_unpacked(req, NULL);
		} else
			refused++;
		nng_msg_free(m);
	}
	ck_assert_int_gt(refused, 1000);
}
END_TEST

START_TEST(test_pack_too_big)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	struct cohort__iov part = { NULL, (size_t)COHORT__MAX_MESSAGE + 1 };
	nng_msg *m = NULL;

	ck_assert_cohort_err(
	    cohort__wire_pack_request(&req, &part, 1, &m), COHORT_ETOOBIG);
	ck_assert_ptr_null(m);
}
END_TEST

UNIT_SUITE(wire, "wire", 30, test_request_round_trip, test_reply_round_trip,
    test_empty_payload_and_empty_envelope, test_short_message,
    test_truncated_frames, test_envelope_length_lie, test_payload_length_lie,
    test_garbage_envelope, test_random_garbage_never_crashes,
    test_pack_too_big)
