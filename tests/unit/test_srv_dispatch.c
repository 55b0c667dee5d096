/*
 * test_srv_dispatch.c - malformed input through cohortd's dispatch entry
 * point: short frames, length lies, garbage protobufs, unknown bodies,
 * wrong versions and tokens. Every one gets a clear status; none crashes.
 */
#include <string.h>

#include <nng/nng.h>
#include <nng/protocol/reqrep0/req.h>

#include "server.h"

#include "srv_fixture.h"
#include "unit_suite.h"

Suite *suite_srv_dispatch(void);

static uintptr_t
disp_bytes(struct fx *f, const void *p, size_t len)
{
	nng_msg *m;

	ck_assert_int_eq(nng_msg_alloc(&m, len), 0);
	if (len > 0)
		memcpy(nng_msg_body(m), p, len);
	return (fx_raw(f, m, 7));
}

START_TEST(test_bad_framing)
{
	uint8_t lie[8] = { 0, 0, 0, 200, 1, 2, 3, 4 };
	uint8_t junk[12]
	    = { 0, 0, 0, 8, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff, 0xff };
	Cohort__Reply *r;

	fx_want(f, disp_bytes(f, "", 0), COHORT_EPROTO);
	fx_want(f, disp_bytes(f, "ab", 2), COHORT_EPROTO);
	r = fx_want(f, disp_bytes(f, lie, sizeof(lie)), COHORT_EPROTO);
	ck_assert_ptr_nonnull(strstr(r->error, "envelope length"));
	fx_want(f, disp_bytes(f, junk, sizeof(junk)), COHORT_EPROTO);
}
END_TEST

START_TEST(test_random_garbage)
{
	uint64_t x = 88172645463325252ull;
	uint8_t buf[256];

	/* xorshift: reproducible bytes, some with a plausible header */
	for (int i = 0; i < 3000; i++) {
		size_t len = (size_t)(i % 200);
		for (size_t k = 0; k < len; k++) {
			x ^= x << 13;
			x ^= x >> 7;
			x ^= x << 17;
			buf[k] = (uint8_t)x;
		}
		if (len >= 4 && (i & 1)) {
			buf[0] = buf[1] = 0;
			buf[2] = 0;
			buf[3] = (uint8_t)(len - 4 - (i % 3));
		}
		size_t before = f->n + f->ndrop;
		disp_bytes(f, buf, len);
		ck_assert_uint_eq(f->n + f->ndrop, before + 1);
		/* keep the capture buffer small */
		if (f->n > 0) {
			cohort__reply__free_unpacked(f->r[f->n - 1].rep, NULL);
			nng_msg_free(f->r[f->n - 1].msg);
			f->n--;
		}
	}
}
END_TEST

START_TEST(test_payload_len_mismatch)
{
	struct srq_cli c;
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;
	nng_msg *m;

	srq_cli_init(&c, "j", 1, 1);
	rq.proto_version = COHORT_PROTO_VERSION;
	rq.job = "j";
	rq.token = "tok";
	rq.seq = 1;
	rq.body_case = COHORT__REQUEST__BODY_HEARTBEAT;
	hb.last_op = "";
	rq.heartbeat = &hb;
	ck_assert_cohort_ok(cohort__wire_pack_request(&rq, NULL, 0, &m));
	ck_assert_int_eq(nng_msg_append(m, "zz", 2), 0);
	fx_want(f, fx_raw(f, m, 1), COHORT_EPROTO);
	/* a payload where none belongs */
	fx_form(f, &c, 1, "j");
	rq.seq = 0;
	fx_want(f, fx_send(f, &c, &rq, "zz", 2), COHORT_EPROTO);
}
END_TEST

START_TEST(test_version_body_seq)
{
	struct srq_cli c[1];
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;
	struct cohort__iov none = { NULL, 0 };
	nng_msg *m;
	Cohort__Reply *r;

	fx_form(f, c, 1, "j");
	hb.last_op = "";
	rq.body_case = COHORT__REQUEST__BODY_HEARTBEAT;
	rq.heartbeat = &hb;
	rq.job = "j";
	rq.token = "tok";
	rq.client_id = 100;
	rq.seq = 50;
	rq.proto_version = 2;
	ck_assert_cohort_ok(cohort__wire_pack_request(&rq, &none, 0, &m));
	r = fx_want(f, fx_raw(f, m, 10), COHORT_EPROTO);
	ck_assert_ptr_nonnull(strstr(r->error, "protocol version 2"));
	/* no body at all (or a body from a newer protocol) */
	rq.proto_version = COHORT_PROTO_VERSION;
	rq.body_case = COHORT__REQUEST__BODY__NOT_SET;
	ck_assert_cohort_ok(cohort__wire_pack_request(&rq, &none, 0, &m));
	fx_want(f, fx_raw(f, m, 10), COHORT_ENOTSUP);
	/* seq 0 */
	rq.body_case = COHORT__REQUEST__BODY_HEARTBEAT;
	rq.seq = 0;
	ck_assert_cohort_ok(cohort__wire_pack_request(&rq, &none, 0, &m));
	fx_want(f, fx_raw(f, m, 10), COHORT_EPROTO);
}
END_TEST

START_TEST(test_unknown_oneof_field)
{
	/* proto_version = 1 (field 1), then field 99 length-delimited
	 * (tag 99 << 3 | 2 = 794 = 0x9a 0x06), empty. */
	uint8_t env[] = { 0x08, 0x01, 0x9a, 0x06, 0x00 };
	uint8_t msg[4 + sizeof(env)] = { 0, 0, 0, sizeof(env) };

	memcpy(msg + 4, env, sizeof(env));
	fx_want(f, disp_bytes(f, msg, sizeof(msg)), COHORT_ENOTSUP);
}
END_TEST

START_TEST(test_wrong_token_no_data)
{
	struct srq_cli c[1], evil;
	Cohort__Heartbeat hb = COHORT__HEARTBEAT__INIT;
	Cohort__Reply *r;

	fx_form(f, c, 1, "j");
	fx_kv_set(f, &c[0], "k", "secret");
	srq_cli_init(&evil, "j", 100, 10); /* even the same client id */
	evil.token = "bad";
	hb.last_op = "";
	r = fx_want(f,
	    fx_simple(f, &evil, COHORT__REQUEST__BODY_HEARTBEAT, &hb, 0),
	    COHORT_EAUTH);
	ck_assert_int_eq(r->body_case, COHORT__REPLY__BODY__NOT_SET);
	ck_assert_uint_eq(r->generation, 0);
	r = fx_want(f, fx_kv_get(f, &evil, "k", false, 0), COHORT_EAUTH);
	ck_assert_uint_eq(r->payload_len, 0);
	/* the reply cache is not reachable with a wrong token either */
	evil.seq = 0;
	r = fx_want(f, fx_kv_get(f, &evil, "k", false, 0), COHORT_EAUTH);
	/* status of a job needs its token */
	fx_status(f, &evil, "j", COHORT_EAUTH);
	/* bad job names */
	evil.job = "";
	fx_want(f, fx_kv_get(f, &evil, "k", false, 0), COHORT_EINVAL);
}
END_TEST

START_TEST(test_admin_token_status)
{
	struct srv_limits lim = { 100, 1000, 10, 0, 0, 0, 0, 0, 0, 0 };
	struct srq_cli c;

	srv_core_free(f->core);
	ck_assert_cohort_ok(
	    srv_core_new(&lim, "adm", fx_sink, f, f->now, &f->core));
	srq_cli_init(&c, "", 1, 1);
	c.token = "";
	fx_status(f, &c, "", COHORT_EAUTH);
	c.token = "adm";
	fx_status(f, &c, "", COHORT_OK);
}
END_TEST

START_TEST(test_preset_job)
{
	struct srq_cli c[1], evil;

	ck_assert_cohort_ok(srv_job_add_preset(f->core, "pre", "tok"));
	ck_assert_cohort_err(
	    srv_job_add_preset(f->core, "pre", "x"), COHORT_EEXIST);
	ck_assert_cohort_err(
	    srv_job_add_preset(f->core, "", "x"), COHORT_EINVAL);
	srq_cli_init(&evil, "pre", 5, 5);
	evil.token = "other";
	fx_want(f, fx_join(f, &evil, 0, 1, 0), COHORT_EAUTH);
	fx_form(f, c, 1, "pre");
	fx_want(f, fx_leave(f, &c[0]), COHORT_OK);
	/* preset jobs stay */
	ck_assert_uint_eq(f->core->jobs.n, 1);
}
END_TEST

/* One request over a real req0 socket to an embedded server. */
static Cohort__Reply *
disp_rpc(const char *url, const char *token, const char *val)
{
	Cohort__Request rq = COHORT__REQUEST__INIT;
	Cohort__KvSet kv = COHORT__KV_SET__INIT;
	struct cohort__iov iov = { val, strlen(val) };
	const uint8_t *pl;
	size_t plen;
	Cohort__Reply *rep;
	nng_socket s;
	nng_msg *m;

	ck_assert_int_eq(nng_req0_open(&s), 0);
	ck_assert_int_eq(nng_socket_set_ms(s, NNG_OPT_RECVTIMEO, 5000), 0);
	ck_assert_int_eq(nng_dial(s, url, NULL, 0), 0);
	rq.proto_version = COHORT_PROTO_VERSION;
	rq.job = "pre";
	rq.token = (char *)token;
	rq.client_id = 9;
	rq.seq = 1;
	kv.key = "k";
	rq.body_case = COHORT__REQUEST__BODY_KV_SET;
	rq.kv_set = &kv;
	ck_assert_cohort_ok(cohort__wire_pack_request(&rq, &iov, 1, &m));
	ck_assert_int_eq(nng_sendmsg(s, m, 0), 0);
	ck_assert_int_eq(nng_recvmsg(s, &m, 0), 0);
	ck_assert_cohort_ok(cohort__wire_unpack_reply(m, &rep, &pl, &plen));
	nng_msg_free(m);
	nng_close(s);
	return (rep);
}

START_TEST(test_embedded_two_servers)
{
	const char *listen[] = { "tcp://127.0.0.1:0" };
	const char *jobs1[] = { "pre:one" }, *jobs2[] = { "pre:two" };
	struct cohort__srv_config cfg;
	struct cohort__srv *a, *b;
	Cohort__Reply *r;

	cohort__srv_config_init(&cfg);
	cfg.listen = listen;
	cfg.nlisten = 1;
	cfg.jobs = jobs1;
	cfg.njobs = 1;
	ck_assert_cohort_ok(cohort__srv_start(&cfg, &a));
	cfg.jobs = jobs2;
	ck_assert_cohort_ok(cohort__srv_start(&cfg, &b));
	ck_assert_ptr_nonnull(cohort__srv_url(a, 0));
	ck_assert_ptr_null(cohort__srv_url(a, 1));
	ck_assert_str_ne(cohort__srv_url(a, 0), cohort__srv_url(b, 0));
	ck_assert_ptr_null(strstr(cohort__srv_url(a, 0), ":0"));
	r = disp_rpc(cohort__srv_url(a, 0), "one", "v");
	ck_assert_int_eq(r->status, COHORT_OK);
	cohort__reply__free_unpacked(r, NULL);
	/* the other server has its own job of the same name */
	r = disp_rpc(cohort__srv_url(b, 0), "one", "v");
	ck_assert_int_eq(r->status, COHORT_EAUTH);
	cohort__reply__free_unpacked(r, NULL);
	cohort__srv_stop(a);
	cohort__srv_stop(b);
	/* a bad job spec or URL is refused cleanly */
	jobs1[0] = "nocolon";
	cfg.jobs = jobs1;
	ck_assert_cohort_err(cohort__srv_start(&cfg, &a), COHORT_EINVAL);
	cfg.njobs = 0;
	listen[0] = "bogus://x";
	ck_assert_int_ne(cohort__srv_start(&cfg, &a), COHORT_OK);
}
END_TEST

UNIT_FIXTURE_SUITE(srv_dispatch, "dispatch", 60, fx_setup, fx_teardown,
    test_bad_framing, test_random_garbage, test_payload_len_mismatch,
    test_version_body_seq, test_unknown_oneof_field, test_wrong_token_no_data,
    test_admin_token_status, test_preset_job, test_embedded_two_servers)
