/*
 * dispatch.c - the request table and the steps of dispatch.h.
 */
#include <inttypes.h>
#include <stdlib.h>
#include <string.h>

#include "token.h"
#include "core/call.h"
#include "core/clients.h"
#include "core/pipes.h"
#include "core/util.h"
#include "journal/journal.h"
#include "observe/ranks.h"
#include "observe/status.h"
#include "state/coll.h"
#include "state/elastic.h"
#include "state/groups.h"
#include "state/kv.h"
#include "state/lifecycle.h"
#include "state/member.h"
#include "state/rdzv.h"
#include "dispatch.h"
#include "events.h"

/* A request's handler and what is checked before it runs. */
struct dispatch_row {
	void (*handle)(
	    struct srv_call *c, const Cohort__Request *req, cohort__time now);
	unsigned flags;
};

/* May carry a payload. */
#define DISPATCH_PAYLOAD 0x01u
/* Changes state: its reply is journalled with the change (a retry after
 * a restart is answered from the cache), and it is refused while the
 * journal cannot be written. */
#define DISPATCH_MUTATING 0x02u
/* From a running member of a job that has not failed; answered here
 * otherwise. */
#define DISPATCH_MEMBER 0x04u
/* Creates its job if there is none (a join). */
#define DISPATCH_CREATES 0x08u
/* Of any generation (a join or leave starts or ends one). */
#define DISPATCH_ANY_GEN 0x10u
/* Its own authentication: no job, no client (StatusQuery). */
#define DISPATCH_NO_JOB 0x20u
/* In an elastic job, served whatever its generation (heartbeats, KV, a
 * member's own failure report: README 8.3). */
#define DISPATCH_ELASTIC_GEN 0x40u

static void dispatch_leave(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
static void dispatch_heartbeat(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
static void dispatch_collective(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);

static const struct dispatch_row dispatch_rows[] = {
	[COHORT__REQUEST__BODY_JOIN] = { srv_rdzv_join,
	    DISPATCH_MUTATING | DISPATCH_CREATES | DISPATCH_ANY_GEN },
	[COHORT__REQUEST__BODY_LEAVE]
	= { dispatch_leave, DISPATCH_MUTATING | DISPATCH_ANY_GEN },
	[COHORT__REQUEST__BODY_HEARTBEAT]
	= { dispatch_heartbeat, DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_WATCH] = { srv_member_watch, 0 },
	[COHORT__REQUEST__BODY_REPORT_FAILURE]
	= { srv_member_report, DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	/* answered from the current generation, like a join: nothing
	 * changes, and a retry after a restart gets the same answer */
	[COHORT__REQUEST__BODY_REFORM]
	= { srv_elastic_reform, DISPATCH_ANY_GEN },
	[COHORT__REQUEST__BODY_COLLECTIVE] = { dispatch_collective,
	    DISPATCH_PAYLOAD | DISPATCH_MUTATING | DISPATCH_MEMBER },
	[COHORT__REQUEST__BODY_GROUP_CREATE]
	= { srv_group_create, DISPATCH_MUTATING | DISPATCH_MEMBER },
	[COHORT__REQUEST__BODY_KV_SET] = { srv_kv_set,
	    DISPATCH_PAYLOAD | DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_GET] = { srv_kv_get, DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_ADD]
	= { srv_kv_add, DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_COMPARE_SET] = { srv_kv_compare_set,
	    DISPATCH_PAYLOAD | DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_DELETE]
	= { srv_kv_delete, DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_NUM_KEYS]
	= { srv_kv_num_keys, DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_WAIT]
	= { srv_kv_wait, DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_CHECK]
	= { srv_kv_check, DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_APPEND] = { srv_kv_append,
	    DISPATCH_PAYLOAD | DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_MULTI_GET]
	= { srv_kv_multi_get, DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_KV_MULTI_SET] = { srv_kv_multi_set,
	    DISPATCH_PAYLOAD | DISPATCH_MUTATING | DISPATCH_ELASTIC_GEN },
	[COHORT__REQUEST__BODY_STATUS_QUERY]
	= { srv_status_handle, DISPATCH_NO_JOB },
};

/* The row of a body, NULL for one this cohortd does not know. */
static const struct dispatch_row *
dispatch_row(int body)
{
	if (body <= 0
	    || (size_t)body >= sizeof(dispatch_rows) / sizeof(dispatch_rows[0])
	    || dispatch_rows[body].handle == NULL)
		return (NULL);
	return (&dispatch_rows[body]);
}

/* A member's metrics ride on its Leave and heartbeats. */
static void
dispatch_metrics(
    struct srv_call *c, const Cohort__RankMetrics *m, cohort__time now)
{
	if (m != NULL && c->client->member != NULL)
		srv_obs_note(
		    c->core, c->job->name, c->client->member->rank, m, now);
}

static void
dispatch_leave(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	dispatch_metrics(c, req->leave->metrics, now);
	srv_member_leave(c, req, now);
}

static void
dispatch_heartbeat(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	dispatch_metrics(c, req->heartbeat->metrics, now);
	srv_member_heartbeat(c, req, now);
}

/* A step boundary is the commit and admission point of an elastic job
 * (elastic.c); every other kind is gathered by coll.c. */
static void
dispatch_collective(
    struct srv_call *c, const Cohort__Request *req, cohort__time now)
{
	if (req->collective->kind == COHORT__COLLECTIVE_KIND__COLL_BOUNDARY)
		srv_elastic_boundary(c, req, now);
	else
		srv_coll_handle(c, req, now);
}

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
	struct srv_client *cl = srv_client_find(&job->clients, id);

	if (cl != NULL)
		return (cl);
	if (job->clients.map.n >= SRV_MAX_CLIENTS) {
		srv_call_fail(c, COHORT_ETOOBIG,
		    "job '%s' has %u clients already", job->name,
		    SRV_MAX_CLIENTS);
		return (NULL);
	}
	if ((cl = srv_client_get(c->core, &job->clients, id, now)) == NULL)
		srv_call_fail(c, COHORT_ENOMEM, "out of memory");
	return (cl);
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
	    c->seq, cl->id, c->job->name);
}

/* Steps 6: true if the request was answered from the client's memory. */
static bool
dispatch_retry(struct srv_call *c)
{
	struct srv_client *cl = c->client;
	struct srv_core *core = c->core;
	struct srv_link *l;

	struct srv_cached *e = srv_client_cache_find(cl, c->seq);

	if (e != NULL) {
		nng_msg *dup;
		if (e->rhash != 0 && e->rhash != c->rhash) {
			dispatch_seq_reused(c);
			return (true);
		}
		if (nng_msg_dup(&dup, e->msg) != 0)
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

/* Step 4's refusal. A join learns what it needs to fix its launch (the
 * job's name is its own); nothing says whether the job exists unless a
 * join could have created it anyway (no --require-token). */
static void
dispatch_auth_fail(struct srv_call *c, const Cohort__Request *req)
{
	struct srv_core *core = c->core;
	char tenant[COHORT__TENANT_MAX + 1];

	if (req->body_case != COHORT__REQUEST__BODY_JOIN)
		srv_call_fail(c, COHORT_EAUTH,
		    "wrong token for job '%s', or no such job", req->job);
	else if (core->require_token
	    && cohort__job_tenant(req->job, tenant, sizeof(tenant)))
		srv_call_fail(c, COHORT_EAUTH,
		    "wrong token for job '%s' (this cohortd requires a job "
		    "token: for a job of tenant '%s', the one minted from "
		    "that tenant's key, `cohort token --tenant-key-file KEY "
		    "%s`; a key of another tenant is refused)",
		    req->job, tenant, req->job);
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
	const struct dispatch_row *row = dispatch_row(req->body_case);
	struct srv_core *core = c->core;
	struct srv_job *job;
	size_t jlen = strlen(req->job);

	if (req->proto_version != COHORT_PROTO_VERSION) {
		srv_call_fail(c, COHORT_EPROTO,
		    "protocol version %u is not supported; cohortd %s speaks "
		    "version %d",
		    req->proto_version, COHORT_VERSION_STRING,
		    COHORT_PROTO_VERSION);
		return;
	}
	if (row == NULL) {
		srv_call_fail(c, COHORT_ENOTSUP,
		    "the request has no body this cohortd %s knows (a newer "
		    "client?)",
		    COHORT_VERSION_STRING);
		return;
	}
	if (c->plen > 0 && !(row->flags & DISPATCH_PAYLOAD)) {
		srv_call_fail(c, COHORT_EPROTO,
		    "this request carries no payload, got %zu bytes", c->plen);
		return;
	}
	if (req->timeout_ms == UINT32_MAX)
		c->deadline = COHORT__TIME_NEVER;
	else
		c->deadline = now + (cohort__time)req->timeout_ms;
	if (row->flags & DISPATCH_NO_JOB) {
		row->handle(c, req, now);
		return;
	}
	if (jlen == 0 || jlen > SRV_MAX_NAME) {
		srv_call_fail(c, COHORT_EINVAL,
		    "job name must be 1..%d bytes, got %zu", SRV_MAX_NAME,
		    jlen);
		return;
	}
	if ((job = srv_job_find(core, req->job)) != NULL) {
		if (!srv_token_eq(job->token, req->token)) {
			dispatch_auth_fail(c, req);
			return;
		}
	} else if (!(row->flags & DISPATCH_CREATES)) {
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
	c->generation = &job->generation;
	job->last_active = now;
	if (req->seq == 0) {
		srv_call_fail(c, COHORT_EPROTO, "seq must start at 1");
		goto out_maybe_remove;
	}
	if ((c->client = dispatch_client(c, req->client_id, now)) == NULL)
		goto out_maybe_remove;
	if (c->client->pipe != 0 && pipe != 0 && c->client->pipe != pipe
	    && !srv_pipe_is_closed(core, c->client->pipe)) {
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
	if (c->mutating && !srv_journal_writable(core, now)) {
		/* Refused before it is applied: nothing changes that the
		 * journal could not record. */
		srv_call_fail(c, COHORT_EJOURNAL,
		    "not applied: %s; cohortd accepts changes again once it "
		    "can journal them (retried every second)",
		    srv_jrn_problem(core->jrn));
		goto out_maybe_remove;
	}
	if (req->generation != 0 && req->generation != job->generation
	    && !(row->flags & DISPATCH_ANY_GEN)) {
		if (!srv_job_elastic(job)) {
			srv_call_fail(c, COHORT_ESTALE,
			    "request for generation %" PRIu64 " of job '%s', "
			    "which is at generation %" PRIu64,
			    req->generation, job->name, job->generation);
			return;
		}
		if (!(row->flags & DISPATCH_ELASTIC_GEN)) {
			/* EMEMBERSHIP for a member, EPEERLOST for a process
			 * a change removed */
			srv_elastic_stale(c);
			return;
		}
	}
	{
		/* the job as a field of the JSON log lines of this request
		 * (a copy: the request may end the job) */
		char jname[SRV_MAX_NAME + 1];
		struct cohort__log_ctx lc = { jname, -1, NULL, 0 };
		const struct cohort__log_ctx *saved;

		cohort__strlcpy(jname, job->name, sizeof(jname));
		saved = cohort__log_ctx_push(&lc);

		/* collectives and group creations come from a running
		 * member (else answered here) */
		if (!(row->flags & DISPATCH_MEMBER)
		    || srv_member_running(c) != NULL)
			row->handle(c, req, now);
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
	if (srv_pipe_is_closed(core, pipe)) {
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
	srv_pipe_request(core, pipe, now);
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
	c->req_gen = req->generation;
	c->req_rank = req->rank;
	c->body = (int)req->body_case;
	c->mutating = dispatch_row(c->body) != NULL
	    && (dispatch_row(c->body)->flags & DISPATCH_MUTATING);
	c->rhash = dispatch_hash(req, c->payload, c->plen);
	dispatch_request(c, req, pipe, now);
	cohort__request__free_unpacked(req, NULL);
	srv_core_expire_due(core, now);
out:
	srv_core_event_end(core, now);
	srv_journal_tick(core, now);
}
