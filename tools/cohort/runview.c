/*
 * runview.c - the launcher's view of its job at cohortd, and the exit
 * records its nodes share (runview.h).
 *
 * An exit record is a line of text in the job's key-value store, written
 * by the launcher that reaped the worker:
 *
 *     cohort.run/exit/ATTEMPT/RANK = "EXIT_CODE SIGNAL STOP_SIG NODE HOST"
 *
 * The store outlives the failure (a job with a failed member stays at
 * cohortd until --job-expiry), so a launcher that reads it a few seconds
 * later still finds it.
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort_impl.h"
#include "coord.h"
#include "runview.h"

struct cohort__run_link {
	struct cohort__coord *co;
	char job[256];
};

struct cohort__run_link *
cohort__run_link_open(const char *url, const char *job, const char *token)
{
	struct cohort__run_link *l = calloc(1, sizeof(*l));

	if (l == NULL)
		return (NULL);
	cohort__strlcpy(l->job, job, sizeof(l->job));
	if (cohort__coord_open(url, job, token, cohort__random_u64(), &l->co)
	    != COHORT_OK) {
		fprintf(stderr, "cohort run: %s\n", cohort_last_error());
		free(l);
		return (NULL);
	}
	return (l);
}

void
cohort__run_link_close(struct cohort__run_link *l)
{
	if (l == NULL)
		return;
	cohort__coord_close(l->co);
	free(l);
}

/* "2, 5, 7" of the ranks of op that have not arrived. */
static void
view_missing(const Cohort__PendingOp *op, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	for (size_t i = 0; i < op->n_missing; i++)
		cohort__appendf(
		    buf, len, &off, "%s%d", i ? ", " : "", op->missing[i]);
}

static void
view_job(const Cohort__JobStatus *js, struct cohort__run_view *v)
{
	v->have = true;
	v->generation = js->generation;
	cohort__strlcpy(v->state, js->state, sizeof(v->state));
	v->world = (int)js->world_size;
	v->min_world = (int)js->min_world;
	v->max_world = (int)js->max_world;
	v->joiners_waiting = (int)js->joiners_waiting;
	v->failed_rank = js->failed_rank;
	cohort__strlcpy(v->failed_text,
	    js->failed_text != NULL ? js->failed_text : "",
	    sizeof(v->failed_text));
	for (size_t m = 0; m < js->n_members; m++) {
		const Cohort__MemberStatus *ms = js->members[m];

		if (ms->rank != v->failed_rank || v->failed_rank < 0)
			continue;
		cohort__strlcpy(v->host, ms->host, sizeof(v->host));
		v->pid = ms->pid;
		cohort__strlcpy(v->last_op, ms->last_op, sizeof(v->last_op));
		v->last_op_seq = ms->last_op_seq;
		cohort__strlcpy(
		    v->member_state, ms->state, sizeof(v->member_state));
		if (v->failed_text[0] == '\0' && ms->failure != NULL)
			cohort__strlcpy(v->failed_text, ms->failure,
			    sizeof(v->failed_text));
	}
	if (js->failure != NULL && v->failed_rank >= 0) {
		/* the record names the operation the rank failed in, not
		 * the one of its last heartbeat */
		const Cohort__Failure *fr = js->failure;

		cohort__strlcpy(v->failure_kind,
		    cohort_failure_kind_name(fr->kind != 0
		            ? (cohort_failure_kind)fr->kind
		            : COHORT_FAILURE_PEER),
		    sizeof(v->failure_kind));
		if (fr->host != NULL && fr->host[0] != '\0') {
			cohort__strlcpy(v->host, fr->host, sizeof(v->host));
			v->pid = fr->pid;
		}
		if (fr->operation != NULL && fr->operation[0] != '\0') {
			cohort__strlcpy(
			    v->last_op, fr->operation, sizeof(v->last_op));
			v->last_op_seq = fr->seq;
		}
	}
	for (size_t p = 0; p < js->n_pending; p++) {
		const Cohort__PendingOp *op = js->pending[p];

		if (strcmp(op->kind, "join") != 0)
			continue;
		v->rdzv = true;
		v->rdzv_waiting_ms = op->waiting_ms;
		v->rdzv_world = (int)(op->n_arrived + op->n_missing);
		v->rdzv_joined = (int)op->n_arrived;
		view_missing(op, v->rdzv_missing, sizeof(v->rdzv_missing));
	}
}

void
cohort__run_view_get(
    struct cohort__run_link *l, int timeout_ms, struct cohort__run_view *v)
{
	struct cohort__coord_call call;
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__StatusQuery q = COHORT__STATUS_QUERY__INIT;
	const Cohort__StatusReply *sr;
	cohort_status rv;

	memset(v, 0, sizeof(*v));
	v->failed_rank = -1;
	q.job = l->job;
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	rv = cohort__coord_request(
	    l->co, &call, &req, NULL, 0, cohort__now_ms() + timeout_ms);
	if (rv == COHORT_ENOCOORD)
		cohort__strlcpy(v->unreachable, cohort_last_error(),
		    sizeof(v->unreachable));
	sr = cohort__coord_reply_body(&call, COHORT__REPLY__BODY_STATUS_QUERY);
	for (size_t j = 0; rv == COHORT_OK && sr != NULL && j < sr->n_jobs;
	     j++)
		if (strcmp(sr->jobs[j]->job, l->job) == 0)
			view_job(sr->jobs[j], v);
	cohort__coord_call_fini(&call);
}

static void
exit_key(char *key, size_t len, int attempt, int rank)
{
	snprintf(key, len, "cohort.run/exit/%d/%d", attempt, rank);
}

cohort_status
cohort__run_exit_publish(struct cohort__run_link *l, int attempt,
    const struct cohort__run_exit *e, int timeout_ms)
{
	struct cohort__coord_call call;
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvSet body = COHORT__KV_SET__INIT;
	struct cohort__iov iov;
	char key[96], val[128];
	cohort_status rv;

	exit_key(key, sizeof(key), attempt, e->rank);
	snprintf(val, sizeof(val), "%d %d %d %d %s", e->exit_code, e->signal,
	    e->stop_sig, e->node, e->host[0] != '\0' ? e->host : "?");
	iov.base = val;
	iov.len = strlen(val);
	body.key = key;
	req.body_case = COHORT__REQUEST__BODY_KV_SET;
	req.kv_set = &body;
	rv = cohort__coord_request(
	    l->co, &call, &req, &iov, 1, cohort__now_ms() + timeout_ms);
	cohort__coord_call_fini(&call);
	return (rv);
}

cohort_status
cohort__run_exit_fetch(struct cohort__run_link *l, int attempt, int rank,
    int timeout_ms, struct cohort__run_exit *e)
{
	struct cohort__coord_call call;
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__KvGet body = COHORT__KV_GET__INIT;
	const Cohort__KvGetReply *gr;
	char key[96], val[128];
	cohort_status rv;

	exit_key(key, sizeof(key), attempt, rank);
	body.key = key;
	body.wait = true;
	req.body_case = COHORT__REQUEST__BODY_KV_GET;
	req.kv_get = &body;
	rv = cohort__coord_request(
	    l->co, &call, &req, NULL, 0, cohort__now_ms() + timeout_ms);
	gr = cohort__coord_reply_body(&call, COHORT__REPLY__BODY_KV_GET);
	if (rv == COHORT_OK && (gr == NULL || !gr->found))
		rv = COHORT_ETIMEDOUT;
	if (rv == COHORT_OK) {
		size_t n = call.plen < sizeof(val) - 1 ? call.plen
		                                       : sizeof(val) - 1;
		memcpy(val, call.payload, n);
		val[n] = '\0';
		memset(e, 0, sizeof(*e));
		e->rank = rank;
		if (sscanf(val, "%d %d %d %d %63s", &e->exit_code, &e->signal,
		        &e->stop_sig, &e->node, e->host)
		    != 5)
			rv = COHORT_EPROTO;
	}
	cohort__coord_call_fini(&call);
	return (rv);
}

const char *
cohort__run_exit_describe(
    const struct cohort__run_exit *e, char *buf, size_t len)
{
	char how[96];

	if (e->stop_sig != 0 && e->signal == e->stop_sig)
		snprintf(how, sizeof(how),
		    "stopped by cohort run (%s): still running after the "
		    "first failure (--grace)",
		    e->stop_sig == SIGKILL ? "SIGKILL" : "SIGTERM");
	else if (e->signal != 0)
		snprintf(how, sizeof(how), "killed by signal %d (%s)",
		    e->signal, strsignal(e->signal));
	else
		snprintf(
		    how, sizeof(how), "exited with status %d", e->exit_code);
	snprintf(buf, len, "%s, on node %d (%s)", how, e->node, e->host);
	return (buf);
}
