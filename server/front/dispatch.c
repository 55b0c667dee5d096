/*
 * dispatch.c - one request in, at most one reply out
 * (proto/README.md section 2).
 *
 *  0. A request that arrives over a connection whose close event was
 *     already seen is dropped (the client re-sends it).
 *  1. Unpack the framing and envelope: any malformation is COHORT_EPROTO.
 *  2. proto_version must be ours (EPROTO); a body this cohortd does not
 *     know is COHORT_ENOTSUP.
 *  3. StatusQuery goes to status.c (its own authentication rules).
 *  4. The job's token is checked before anything else: a wrong token or
 *     an unknown job (except for Join, which creates it) is COHORT_EAUTH
 *     with no data, and a text that only repeats the job name the client
 *     sent (the same for both, so it tells nothing about other jobs).
 *     With --require-token a Join creates a job only with the token
 *     minted from the admin secret for that name (docs/security.md).
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
 *  7. A request of an older generation is COHORT_ESTALE (Join and Leave
 *     excepted).
 *  8. The handler answers or parks the call. The unpacked request is freed
 *     here; handlers copy what a parked call needs.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "srv_impl.h"
#include "token.h"

/* Payload bytes that go into a request's hash (its length always does):
 * enough to tell two requests apart, cheap for 64 MiB values. */
#define DISPATCH_HASH_HEAD 4096

/* srv_call.rhash: the body kind, the packed body (the oneof member) and
 * the payload's length and head. Never 0. */
static uint32_t
dispatch_hash(const Cohort__Request *req, const uint8_t *pl, size_t plen)
{
	const ProtobufCFieldDescriptor *fd;
	uint32_t h = srv_crc32c(&req->body_case, sizeof(req->body_case));
	uint64_t n = plen;

	fd = protobuf_c_message_descriptor_get_field(
	    &cohort__request__descriptor, (unsigned)req->body_case);
	if (fd != NULL && fd->type == PROTOBUF_C_TYPE_MESSAGE) {
		const ProtobufCMessage *b
		    = *(const ProtobufCMessage *const *)((const char *)req
		        + fd->offset);
		size_t sz
		    = b != NULL ? protobuf_c_message_get_packed_size(b) : 0;
		uint8_t stackbuf[512], *buf = stackbuf;
		if (sz > sizeof(stackbuf) && (buf = malloc(sz)) == NULL)
			sz = 0;
		if (sz > 0) {
			protobuf_c_message_pack(b, buf);
			h ^= srv_crc32c(buf, sz) * 0x9e3779b1u;
		}
		if (buf != stackbuf)
			free(buf);
	}
	h ^= srv_crc32c(&n, sizeof(n)) * 0x85ebca6bu;
	if (plen > 0)
		h ^= srv_crc32c(
		    pl, plen < DISPATCH_HASH_HEAD ? plen : DISPATCH_HASH_HEAD);
	return (h != 0 ? h : 1);
}

static struct srv_client *
dispatch_client(struct srv_call *c, uint64_t id, cohort__time now)
{
	struct srv_job *job = c->job;
	struct srv_hnode *n = srv_map_get(&job->clients, &id, sizeof(id));
	struct srv_client *cl;

	if (n != NULL)
		return (SRV_CONTAINER(n, struct srv_client, hn));
	if (job->clients.n >= SRV_MAX_CLIENTS) {
		srv_call_fail(c, COHORT_ETOOBIG,
		    "job '%s' has %u clients already", job->name,
		    SRV_MAX_CLIENTS);
		return (NULL);
	}
	if ((cl = srv_client_get(job, id, now)) == NULL)
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
	return (cl);
}

static bool
dispatch_payload_allowed(int body)
{
	switch (body) {
	case COHORT__REQUEST__BODY_COLLECTIVE:
	case COHORT__REQUEST__BODY_KV_SET:
	case COHORT__REQUEST__BODY_KV_COMPARE_SET:
	case COHORT__REQUEST__BODY_KV_APPEND:
	case COHORT__REQUEST__BODY_KV_MULTI_SET:
		return (true);
	default:
		return (false);
	}
}

/* Step 6's refusal: the seq was used for another request. The reply is
 * not cached (it would replace the first request's). */
static void
dispatch_seq_reused(struct srv_call *c)
{
	struct srv_client *cl = c->client;

	c->client = NULL;
	srv_call_fail(c, COHORT_EINVAL,
	    "seq %" PRIu64 " of client %016" PRIx64 " in job '%s' was used "
	    "for another request: sequence numbers must not be reused",
	    c->seq, cl->id, cl->job->name);
}

/* Steps 6: true if the request was answered from the client's memory. */
static bool
dispatch_retry(struct srv_call *c)
{
	struct srv_client *cl = c->client;
	struct srv_core *core = c->core;
	struct srv_link *l;

	for (unsigned i = 0; i < SRV_CACHE; i++) {
		nng_msg *dup;
		if (cl->cache[i].msg == NULL || cl->cache[i].seq != c->seq)
			continue;
		if (cl->cache[i].rhash != 0
		    && cl->cache[i].rhash != c->rhash) {
			dispatch_seq_reused(c);
			return (true);
		}
		if (nng_msg_dup(&dup, cl->cache[i].msg) != 0)
			return (false);
		core->sink(core->sink_arg, c->tp, dup);
		srv_call_free(c);
		return (true);
	}
	for (l = cl->parked.next; l != &cl->parked; l = l->next) {
		struct srv_call *p = SRV_CONTAINER(l, struct srv_call, clink);
		void *tp;
		if (p->seq != c->seq)
			continue;
		if (p->rhash != c->rhash) {
			dispatch_seq_reused(c);
			return (true);
		}
		tp = p->tp;
		p->tp = c->tp;
		c->tp = tp;
		srv_call_drop(c);
		return (true);
	}
	return (false);
}

static void
dispatch_body(struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	const struct srv_member *m;

	switch (req->body_case) {
	case COHORT__REQUEST__BODY_JOIN:
		srv_job_join(c, req->join, now);
		break;
	case COHORT__REQUEST__BODY_LEAVE:
		if (req->leave->metrics != NULL && c->client->member != NULL)
			srv_obs_note(c->job->core, c->job->name,
			    c->client->member->rank, req->leave->metrics, now);
		srv_job_leave(c, now);
		break;
	case COHORT__REQUEST__BODY_HEARTBEAT:
		srv_job_heartbeat(c, req->heartbeat, now);
		break;
	case COHORT__REQUEST__BODY_WATCH:
		srv_job_watch(c, now);
		break;
	case COHORT__REQUEST__BODY_REPORT_FAILURE:
		srv_job_report(c, req->report_failure, now);
		break;
	case COHORT__REQUEST__BODY_COLLECTIVE:
	case COHORT__REQUEST__BODY_GROUP_CREATE:
		/* both come from a running member (else answered here) */
		if ((m = srv_job_collective_member(c)) == NULL)
			break;
		if (req->body_case == COHORT__REQUEST__BODY_COLLECTIVE)
			srv_coll_handle(c, m, req->collective, now);
		else
			srv_group_handle(c, m, req->group_create, now);
		break;
	case COHORT__REQUEST__BODY_KV_SET:
	case COHORT__REQUEST__BODY_KV_GET:
	case COHORT__REQUEST__BODY_KV_ADD:
	case COHORT__REQUEST__BODY_KV_COMPARE_SET:
	case COHORT__REQUEST__BODY_KV_DELETE:
	case COHORT__REQUEST__BODY_KV_NUM_KEYS:
	case COHORT__REQUEST__BODY_KV_WAIT:
	case COHORT__REQUEST__BODY_KV_CHECK:
	case COHORT__REQUEST__BODY_KV_APPEND:
	case COHORT__REQUEST__BODY_KV_MULTI_GET:
	case COHORT__REQUEST__BODY_KV_MULTI_SET:
		srv_kv_handle(c, req, now);
		break;
	default:
		srv_call_fail(c, COHORT_ENOTSUP,
		    "request body %d is not supported by this cohortd",
		    (int)req->body_case);
		break;
	}
}

/* Step 4's refusal. A join learns what it needs to fix its launch (the
 * job's name is its own); nothing says whether the job exists unless a
 * join could have created it anyway (no --require-token). */
static void
dispatch_auth_fail(struct srv_call *c, const Cohort__Request *req)
{
	struct srv_core *core = c->core;

	if (req->body_case != COHORT__REQUEST__BODY_JOIN)
		srv_call_fail(c, COHORT_EAUTH,
		    "wrong token for job '%s', or no such job", req->job);
	else if (core->require_token)
		srv_call_fail(c, COHORT_EAUTH,
		    "wrong token for job '%s' (this cohortd requires a job "
		    "token: one given with its --job, or minted by `cohort "
		    "token %s` from its admin secret)",
		    req->job, req->job);
	else
		srv_call_fail(c, COHORT_EAUTH,
		    "wrong token for job '%s': it exists with another token "
		    "(another launch with the same job name? COHORT_JOB, "
		    "COHORT_TOKEN)",
		    req->job);
}

static void
dispatch_request(struct srv_call *c, const Cohort__Request *req, uint32_t pipe,
    cohort__time now)
{
	struct srv_core *core = c->core;
	struct srv_job *job;
	struct srv_hnode *n;
	size_t jlen = strlen(req->job);

	if (req->proto_version != COHORT_PROTO_VERSION) {
		srv_call_fail(c, COHORT_EPROTO,
		    "protocol version %u is not supported; cohortd %s speaks "
		    "version %d",
		    req->proto_version, COHORT_VERSION_STRING,
		    COHORT_PROTO_VERSION);
		return;
	}
	if (req->body_case == COHORT__REQUEST__BODY__NOT_SET) {
		srv_call_fail(c, COHORT_ENOTSUP,
		    "the request has no body this cohortd %s knows (a newer "
		    "client?)",
		    COHORT_VERSION_STRING);
		return;
	}
	if (c->plen > 0 && !dispatch_payload_allowed(req->body_case)) {
		srv_call_fail(c, COHORT_EPROTO,
		    "this request carries no payload, got %zu bytes", c->plen);
		return;
	}
	if (req->timeout_ms == UINT32_MAX)
		c->deadline = COHORT__TIME_NEVER;
	else
		c->deadline = now + (cohort__time)req->timeout_ms;
	if (req->body_case == COHORT__REQUEST__BODY_STATUS_QUERY) {
		srv_status_handle(c, req, now);
		return;
	}
	if (jlen == 0 || jlen > SRV_MAX_NAME) {
		srv_call_fail(c, COHORT_EINVAL,
		    "job name must be 1..%d bytes, got %zu", SRV_MAX_NAME,
		    jlen);
		return;
	}
	if ((n = srv_map_get(&core->jobs, req->job, jlen)) != NULL) {
		job = SRV_CONTAINER(n, struct srv_job, hn);
		if (!srv_token_eq(job->token, req->token)) {
			dispatch_auth_fail(c, req);
			return;
		}
	} else if (req->body_case != COHORT__REQUEST__BODY_JOIN) {
		dispatch_auth_fail(c, req);
		return;
	} else if (strlen(req->token) > SRV_MAX_NAME) {
		srv_call_fail(c, COHORT_EINVAL, "token longer than %d bytes",
		    SRV_MAX_NAME);
		return;
	} else if (core->require_token
	    && !cohort__token_is_minted(
	        core->admin_token, req->job, req->token)) {
		dispatch_auth_fail(c, req);
		return;
	} else if (core->lim.max_jobs != 0
	    && core->jobs.n >= core->lim.max_jobs) {
		core->m.limit_refusals++;
		srv_call_fail(c, COHORT_ETOOBIG,
		    "cohortd holds %zu jobs, --max-jobs %" PRIu64 ": job '%s' "
		    "is not created (abandoned jobs count until --job-expiry)",
		    core->jobs.n, core->lim.max_jobs, req->job);
		return;
	} else if ((job = srv_job_new(core, req->job, req->token)) == NULL) {
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
		return;
	}
	c->job = job;
	job->last_active = now;
	if (req->seq == 0) {
		srv_call_fail(c, COHORT_EPROTO, "seq must start at 1");
		goto out_maybe_remove;
	}
	if ((c->client = dispatch_client(c, req->client_id, now)) == NULL)
		goto out_maybe_remove;
	if (c->client->pipe != 0 && pipe != 0 && c->client->pipe != pipe
	    && !srv_core_pipe_is_closed(core, c->client->pipe)) {
		/* Another connection speaking for a client whose own one is
		 * alive: not a retry (a client re-sends only after its
		 * connection broke), so it gets nothing of the client's. */
		uint64_t id = c->client->id;
		c->client = NULL;
		srv_call_fail(c, COHORT_EEXIST,
		    "client %016" PRIx64 " of job '%s' is connected over "
		    "another connection: one client id, one connection",
		    id, job->name);
		goto out_maybe_remove;
	}
	srv_client_set_pipe(c->client, pipe);
	c->client->last_seen = now;
	if (c->client->member != NULL)
		c->client->member->last_seen = now;
	if (dispatch_retry(c))
		return;
	if (srv_body_mutating(req->body_case)
	    && !srv_jrn_writable(core, now)) {
		/* Refused before it is applied: nothing changes that the
		 * journal could not record. */
		srv_call_fail(c, COHORT_EJOURNAL,
		    "not applied: %s; cohortd accepts changes again once it "
		    "can journal them (retried every second)",
		    srv_jrn_problem(core));
		goto out_maybe_remove;
	}
	if (req->generation != 0 && req->generation != job->generation
	    && req->body_case != COHORT__REQUEST__BODY_JOIN
	    && req->body_case != COHORT__REQUEST__BODY_LEAVE) {
		srv_call_fail(c, COHORT_ESTALE,
		    "request for generation %" PRIu64 " of job '%s', which is "
		    "at generation %" PRIu64,
		    req->generation, job->name, job->generation);
		return;
	}
	{
		/* the job as a field of the JSON log lines of this request
		 * (a copy: the request may end the job) */
		char jname[SRV_MAX_NAME + 1];
		struct cohort__log_ctx lc = { jname, -1, NULL, 0 };
		const struct cohort__log_ctx *saved;

		cohort__strlcpy(jname, job->name, sizeof(jname));
		saved = cohort__log_ctx_push(&lc);

		dispatch_body(c, req, now);
		cohort__log_ctx_pop(saved);
	}

out_maybe_remove:
	srv_job_maybe_remove(job);
}

void
srv_core_dispatch(struct srv_core *core, nng_msg *msg, uint32_t pipe, void *tp,
    cohort__time now)
{
	Cohort__Request *req = NULL;
	struct srv_call *c;
	cohort_status rv;

	core->m.requests++;
	srv_core_event_begin(core);
	if (srv_core_pipe_is_closed(core, pipe)) {
		/* Received before its connection's close event but handled
		 * after it: nobody can hear the reply, and handling it would
		 * bind the client to a dead connection (a join would make a
		 * member only heartbeat silence could catch). The client
		 * re-sends it (same seq) over its next connection. */
		core->m.dropped_closed++;
		nng_msg_free(msg);
		core->sink(core->sink_arg, tp, NULL);
		goto out;
	}
	srv_core_pipe_request(core, pipe, now);
	if ((c = srv_call_new(core, tp, now)) == NULL) {
		nng_msg_free(msg);
		core->sink(core->sink_arg, tp, NULL);
		goto out;
	}
	c->msg = msg;
	rv = cohort__wire_unpack_request(msg, &req, &c->payload, &c->plen);
	if (rv != COHORT_OK) {
		srv_call_fail(c, COHORT_EPROTO, "%s", cohort_last_error());
		goto out;
	}
	c->seq = req->seq;
	c->body = (int)req->body_case;
	c->rhash = dispatch_hash(req, c->payload, c->plen);
	dispatch_request(c, req, pipe, now);
	cohort__request__free_unpacked(req, NULL);
	srv_core_expire_due(core, now);
out:
	srv_core_event_end(core, now);
}
