/*
 * elastic.c - elastic membership on the client's side (docs/elastic.md,
 * proto/README.md section 8): moving a client and every group it holds
 * to the job's current generation (cohort_client_reform), the step
 * boundary (the commit and admission point), and the state transfer from
 * a member that holds the state to the ones admitted without it.
 *
 * A reform, in order:
 *  1. Reform round trip: this process's rank in the current generation,
 *     the world size, the hosts, and prev_ranks (new rank -> rank in the
 *     generation the client was in).
 *  2. Every group is failed (EMEMBERSHIP, if it was not already), which
 *     aborts what its backend still has in flight, then its data plane is
 *     torn down (cohort__coll_teardown: progress thread stopped, tcp mesh,
 *     shared memory, hierarchy closed, NCCL communicator aborted).
 *  3. Under the client's lock: its rank, world, generation and hosts
 *     change, its sticky error is cleared, and every group is reset to its
 *     new membership (the world: 0..n-1; a subgroup: its surviving members
 *     in their old order, through the inverse of prev_ranks), with its
 *     sticky error cleared and op numbering from 1.
 *  4. The coordinator engine carries the new rank and generation; the
 *     Watch, parked while the client was in the old generation, is issued
 *     again; every group starts setting up its new data plane at once
 *     (cohort__coll_setup_early; its key prefix names the generation, so
 *     nothing of the old one's rendezvous is read).
 *
 * Costs: a reform is one round trip to cohortd, O(groups x n) local work
 * and the new data plane's set-up; a boundary is one round trip; a state
 * transfer one GroupCreate and ceil(bytes / 64 MiB) + 1 broadcasts on the
 * sender's and receivers' subgroup (a joiner also reads one KV record).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "client.h"
#include "collectives.h"

/* The largest broadcast of a state transfer: a large state moves in
 * chunks, each bounded in time and memory by the backend as one. */
#define ELASTIC_CHUNK ((size_t)64 << 20)
/* How often a joiner waiting for its transfer's roles looks at the
 * client's error (a change while it waits). */
#define ELASTIC_SLICE_MS 500
/* The roles of a transfer, published by its sender for the members
 * admitted at that boundary (they learn of it from their Join, which
 * names no roles): COHORT__KV_RESERVED "state/<generation>". */
#define ELASTIC_KEY COHORT__KV_RESERVED "state/%" PRIu64

void
cohort_client_elastic_range(
    const cohort_client *c, int32_t *min_world, int32_t *max_world)
{
	if (min_world != NULL)
		*min_world = c != NULL ? c->min_world : 0;
	if (max_world != NULL)
		*max_world = c != NULL && c->min_world > 0 ? c->max_world : 0;
}

/* ------------------------------------------------------------------------ */
/* Reform                                                                   */
/* ------------------------------------------------------------------------ */

static void
elastic_xfer_clear(struct cohort_client *c)
{
	free(c->xfer.receivers);
	memset(&c->xfer, 0, sizeof(c->xfer));
	c->xfer.sender = -1;
}

/* The client's failure becomes st (EPEERLOST: this process is no longer a
 * member, or the job fell below its minimum), with the reply's record. */
static void
elastic_fail(
    struct cohort_client *c, cohort_status st, const Cohort__Reply *rep)
{
	cohort_failure f;

	cohort__failure_from_reply(&f, st, rep);
	if (f.text[0] == '\0')
		cohort__strlcpy(f.text, cohort_last_error(), sizeof(f.text));
	cohort__client_fail(c, &f);
}

/* The members of subgroup g in the new generation: its members that
 * survived (old2new, by old job rank, of prev_world entries), in their
 * old order. *n and *me (this process's index; -1 if it is not one). */
static int32_t *
elastic_members(const struct cohort_group *g, const int32_t *old2new,
    int32_t prev_world, int32_t self, int32_t *n, int32_t *me)
{
	int32_t *m = malloc((size_t)g->size * sizeof(int32_t));

	*n = 0;
	*me = -1;
	if (m == NULL)
		return (NULL);
	for (int32_t i = 0; i < g->size; i++) {
		int32_t old = g->global_ranks[i];
		int32_t nr = old >= 0 && old < prev_world ? old2new[old] : -1;

		if (nr < 0)
			continue;
		if (nr == self)
			*me = *n;
		m[(*n)++] = nr;
	}
	return (m);
}

/* Steps 2 to 4 of a reform to the generation jr describes. */
static cohort_status
elastic_apply(struct cohort_client *c, const Cohort__JoinReply *jr,
    cohort_reform_info *info)
{
	const int32_t n = (int32_t)jr->world_size, prev_world = c->world_size;
	const uint64_t prev_gen = c->generation;
	int32_t *old2new = NULL, prev_rank, lost = 0, joined = 0;
	struct cohort_group **gs = NULL, *g;
	int32_t **members = NULL, *nmembers = NULL, *mes = NULL;
	int *excl = NULL, nexcl;
	char **hosts = NULL;
	size_t ng = 0, k;
	uint64_t seen;
	cohort_status st = COHORT_OK;
	uint64_t t0 = cohort__now_ns();

	if ((old2new = malloc(
	         (size_t)(prev_world > 0 ? prev_world : 1) * sizeof(int32_t)))
	        == NULL
	    || (hosts = calloc((size_t)n, sizeof(char *))) == NULL) {
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out;
	}
	for (int32_t i = 0; i < prev_world; i++)
		old2new[i] = -1;
	for (int32_t r = 0; r < n; r++) {
		int32_t p = jr->prev_ranks[r];

		if (p >= 0 && p < prev_world)
			old2new[p] = r;
		else
			joined++;
		if ((hosts[r]
		        = strdup((size_t)r < jr->n_hosts ? jr->hosts[r] : ""))
		    == NULL) {
			st = cohort__err(COHORT_ENOMEM, "out of memory");
			goto out;
		}
	}
	lost = prev_world - (n - joined);
	prev_rank = jr->prev_ranks[jr->rank];
	if (prev_rank != c->rank) {
		st = cohort__err(COHORT_EPROTO,
		    "reform: cohortd says rank %d of generation %" PRIu64
		    " was rank %d, this process was rank %d",
		    jr->rank, jr->generation, prev_rank, c->rank);
		goto out;
	}

	/* The groups, and their memberships in the new generation. */
	pthread_mutex_lock(&c->mtx);
	for (g = c->groups; g != NULL; g = g->next)
		ng++;
	gs = calloc(ng > 0 ? ng : 1, sizeof(*gs));
	members = calloc(ng > 0 ? ng : 1, sizeof(*members));
	nmembers = calloc(ng > 0 ? ng : 1, sizeof(*nmembers));
	mes = calloc(ng > 0 ? ng : 1, sizeof(*mes));
	if (gs == NULL || members == NULL || nmembers == NULL || mes == NULL) {
		pthread_mutex_unlock(&c->mtx);
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out;
	}
	for (k = 0, g = c->groups; g != NULL; g = g->next, k++) {
		gs[k] = g;
		if (g == c->world)
			continue;
		members[k] = elastic_members(
		    g, old2new, prev_world, jr->rank, &nmembers[k], &mes[k]);
		if (members[k] == NULL || mes[k] < 0) {
			pthread_mutex_unlock(&c->mtx);
			st = members[k] == NULL
			    ? cohort__err(COHORT_ENOMEM, "out of memory")
			    : cohort__err(COHORT_EPROTO,
			        "reform: this process is not a member of "
			        "group '%s' in generation %" PRIu64,
			        g->id, jr->generation);
			goto out;
		}
	}
	pthread_mutex_unlock(&c->mtx);

	/* Nothing of the old generation's data plane is reused: stop what
	 * is in flight, then tear it down. */
	for (k = 0; k < ng; k++)
		if (cohort_group_error(gs[k]) == COHORT_OK)
			(void)cohort__group_fail_local(gs[k],
			    COHORT_EMEMBERSHIP, COHORT_FAILURE_GENERATION,
			    "job '%s' moved from generation %" PRIu64
			    " to %" PRIu64,
			    c->job, prev_gen, jr->generation);
	/* The group ranks each group lost, for a backend that shrinks
	 * (only when nobody joined: a communicator does not grow). */
	if ((excl = malloc(
	         (size_t)(prev_world > 0 ? prev_world : 1) * sizeof(int)))
	    == NULL) {
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out;
	}
	for (k = 0; k < ng; k++) {
		g = gs[k];
		nexcl = 0;
		for (int32_t i = 0; joined == 0 && i < g->size; i++) {
			int32_t old = g->global_ranks[i];

			if (old < 0 || old >= prev_world || old2new[old] < 0)
				excl[nexcl++] = i;
		}
		cohort__coll_teardown(g, excl, nexcl);
	}

	pthread_mutex_lock(&c->mtx);
	for (int32_t i = 0; c->hosts != NULL && i < prev_world; i++)
		free(c->hosts[i]);
	free(c->hosts);
	c->hosts = hosts;
	hosts = NULL;
	c->rank = jr->rank;
	c->world_size = n;
	c->generation = jr->generation;
	if (jr->n_local_ranks == jr->world_size && c->local_rank < 0)
		c->local_rank = jr->local_ranks[c->rank];
	atomic_store(&c->error, COHORT_OK);
	cohort__failure_clear(&c->failure);
	elastic_xfer_clear(c);
	for (k = 0; k < ng; k++) {
		cohort_status gst = gs[k] == c->world
		    ? cohort__group_reset(
		        gs[k], c->rank, n, NULL, c->generation)
		    : cohort__group_reset(
		        gs[k], mes[k], nmembers[k], members[k], c->generation);

		if (gst != COHORT_OK && st == COHORT_OK)
			st = gst;
	}
	seen = c->seen_generation;
	pthread_mutex_unlock(&c->mtx);
	cohort__coord_set_member(c->coord, c->rank, c->generation);
	cohort__log_ctx_process(c->job, c->rank);
	if (st != COHORT_OK) {
		/* Out of memory resetting a group: it cannot be used in the
		 * new generation; say so on it and the client. */
		cohort__client_fail_local(
		    c, st, COHORT_FAILURE_UNAVAILABLE, cohort_last_error());
		goto out;
	}
	/* A change that cohortd announced while this one was applied. */
	if (seen > c->generation)
		(void)cohort__client_generation_moved(c, seen);
	cohort__client_watch_restart(c);
	for (k = 0; k < ng; k++)
		cohort__coll_setup_early(gs[k]);

	info->generation = c->generation;
	info->prev_generation = prev_gen;
	info->rank = c->rank;
	info->world_size = n;
	info->prev_rank = prev_rank;
	info->prev_world_size = prev_world;
	info->lost = lost;
	info->joined = joined;
	{
		char text[160];
		uint64_t ns = cohort__now_ns() - t0;

		snprintf(text, sizeof(text),
		    "generation %" PRIu64 " -> %" PRIu64
		    ": rank %d of %d (was %d of %d), lost %d, joined %d",
		    prev_gen, c->generation, c->rank, n, prev_rank, prev_world,
		    lost, joined);
		cohort__info("reformed job '%s' in %.1f ms: %s", c->job,
		    (double)ns / 1e6, text);
		cohort__obs_event(&c->obs, COHORT__TRACK_EVENTS, "reform",
		    "generation", t0, cohort__now_ns(), text);
	}
out:
	if (hosts != NULL) {
		for (int32_t r = 0; r < n; r++)
			free(hosts[r]);
		free(hosts);
	}
	for (k = 0; members != NULL && k < ng; k++)
		free(members[k]);
	free(members);
	free(nmembers);
	free(mes);
	free(gs);
	free(excl);
	free(old2new);
	return (st);
}

/* A reform to the job's current generation, before deadline. */
static cohort_status
elastic_reform(
    struct cohort_client *c, cohort_reform_info *info, cohort__time deadline)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__Reform body = COHORT__REFORM__INIT;
	struct cohort__coord_call call;
	const Cohort__JoinReply *jr;
	cohort_status st;

	memset(info, 0, sizeof(*info));
	req.body_case = COHORT__REQUEST__BODY_REFORM;
	req.reform = &body;
	st = cohort__coord_request(c->coord, &call, &req, NULL, 0, deadline);
	if (st == COHORT_EPEERLOST) {
		char detail[COHORT__DETAIL_MAX];

		cohort__strlcpy(detail, cohort_last_error(), sizeof(detail));
		elastic_fail(c, st, call.rep);
		cohort__coord_call_fini(&call);
		return (cohort__err(st, "%s", detail));
	}
	if (st != COHORT_OK)
		goto out;
	jr = call.rep->body_case == COHORT__REPLY__BODY_JOIN ? call.rep->join
	                                                     : NULL;
	if (jr == NULL || jr->world_size < 1 || jr->rank < 0
	    || jr->rank >= (int32_t)jr->world_size
	    || jr->world_size > (uint32_t)c->max_world
	    || jr->n_prev_ranks != jr->world_size
	    || jr->generation < c->generation) {
		st = cohort__err(COHORT_EPROTO,
		    "malformed reform reply from the coordinator");
		goto out;
	}
	if (jr->prev_generation != 0 && jr->prev_generation != c->generation) {
		st = cohort__err(COHORT_EPROTO,
		    "reform: cohortd's rank mapping is from generation "
		    "%" PRIu64 ", this process is in %" PRIu64,
		    jr->prev_generation, c->generation);
		goto out;
	}
	if (jr->generation == c->generation
	    && atomic_load(&c->error) == COHORT_OK) {
		/* nothing to do */
		info->generation = info->prev_generation = c->generation;
		info->rank = info->prev_rank = c->rank;
		info->world_size = info->prev_world_size = c->world_size;
		goto out;
	}
	st = elastic_apply(c, jr, info);
out:
	cohort__coord_call_fini(&call);
	return (st);
}

cohort_status
cohort_client_reform(
    cohort_client *c, cohort_reform_info *out, cohort_duration timeout)
{
	cohort_reform_info info;
	cohort_status st;

	cohort__err_clear();
	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if (c->min_world <= 0)
		return (cohort__err(COHORT_ENOTSUP,
		    "job '%s' is not elastic (no min_world; cohort run "
		    "--nnodes MIN:MAX, COHORT_MIN_WORLD)",
		    c->job));
	st = elastic_reform(c, &info, cohort__client_deadline(c, timeout));
	if (st == COHORT_OK && out != NULL)
		*out = info;
	return (st);
}

/* ------------------------------------------------------------------------ */
/* Step boundary                                                            */
/* ------------------------------------------------------------------------ */

/* Fills out's roles from the pending transfer (known). */
static void
elastic_roles(const struct cohort_client *c, cohort_boundary *out)
{
	out->sender = c->xfer.sender;
	out->receivers = c->xfer.nreceivers;
	out->role = COHORT_STATE_NONE;
	if (c->xfer.sender == c->rank)
		out->role = COHORT_STATE_SEND;
	for (int32_t i = 0; i < c->xfer.nreceivers; i++)
		if (c->xfer.receivers[i] == c->rank)
			out->role = COHORT_STATE_RECV;
}

/* The sender publishes the roles for the members admitted with them. */
static cohort_status
elastic_publish_roles(struct cohort_client *c, cohort__time deadline)
{
	char key[96], val[4096];
	size_t off = 0;

	snprintf(key, sizeof(key), ELASTIC_KEY, c->xfer.generation);
	cohort__appendf(val, sizeof(val), &off, "%" PRIu64 " %d", c->xfer.seq,
	    c->xfer.sender);
	for (int32_t i = 0; i < c->xfer.nreceivers; i++)
		cohort__appendf(
		    val, sizeof(val), &off, " %d", c->xfer.receivers[i]);
	if (off >= sizeof(val) - 1)
		return (cohort__err(COHORT_ETOOBIG,
		    "state transfer to %d receivers: their list does not fit "
		    "one record",
		    c->xfer.nreceivers));
	return (cohort__kv_set(c, key, val, off, cohort__remaining(deadline)));
}

/* Parses "seq sender r1 r2 ..." into c->xfer. */
static cohort_status
elastic_parse_roles(struct cohort_client *c, const char *v, size_t len)
{
	char buf[4096], *p, *end;
	int32_t *rs;
	int32_t n = 0;
	long long x;

	if (len >= sizeof(buf))
		return (cohort__err(
		    COHORT_EPROTO, "state transfer record too long"));
	memcpy(buf, v, len);
	buf[len] = '\0';
	if ((rs = malloc(sizeof(int32_t) * (len / 2 + 1))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	p = buf;
	c->xfer.seq = strtoull(p, &end, 10);
	if (end == p) {
		free(rs);
		return (cohort__err(
		    COHORT_EPROTO, "malformed state transfer record"));
	}
	p = end;
	x = strtoll(p, &end, 10);
	if (end == p) {
		free(rs);
		return (cohort__err(
		    COHORT_EPROTO, "malformed state transfer record"));
	}
	c->xfer.sender = (int32_t)x;
	for (p = end;; p = end) {
		x = strtoll(p, &end, 10);
		if (end == p)
			break;
		rs[n++] = (int32_t)x;
	}
	free(c->xfer.receivers);
	c->xfer.receivers = rs;
	c->xfer.nreceivers = n;
	c->xfer.known = true;
	return (COHORT_OK);
}

/* A member admitted into a running job learns its transfer's roles from
 * the record the sender publishes (its Join named none). Bounded by the
 * deadline; a change meanwhile ends the wait with the client's error. */
static cohort_status
elastic_learn_roles(struct cohort_client *c, cohort__time deadline)
{
	char key[96];
	void *val = NULL;
	size_t len = 0;
	cohort_status st;

	snprintf(key, sizeof(key), ELASTIC_KEY, c->xfer.generation);
	for (;;) {
		cohort_duration left = cohort__remaining(deadline);

		if ((st = cohort_client_error(c)) != COHORT_OK)
			return (st);
		if (left < 0 || left > ELASTIC_SLICE_MS)
			left = ELASTIC_SLICE_MS;
		st = cohort__kv_get(c, key, &val, &len, left);
		if (st == COHORT_OK)
			break;
		if (st != COHORT_ETIMEDOUT || cohort__expired(deadline))
			return (
			    st == COHORT_ETIMEDOUT ? cohort__err(st,
			        "admitted into job '%s' at generation "
			        "%" PRIu64 ": no member said who sends the "
			        "state",
			        c->job, c->xfer.generation)
			                           : st);
	}
	st = elastic_parse_roles(c, val, len);
	cohort_free(val);
	return (st);
}

cohort_status
cohort_step_boundary(
    cohort_client *c, cohort_boundary *out, cohort_duration timeout)
{
	struct cohort__boundary_reply br;
	cohort__time deadline;
	cohort_status st;

	cohort__err_clear();
	if (c == NULL || out == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client or output"));
	memset(out, 0, sizeof(*out));
	out->sender = -1;
	out->role = COHORT_STATE_NONE;
	if (c->min_world <= 0)
		return (cohort_barrier(c->world, "cohort.boundary", timeout));
	deadline = cohort__client_deadline(c, timeout);
	if (c->xfer.pending && c->xfer.admitted) {
		/* Admitted into the running job: the boundary that admitted
		 * it gave the others the roles; this one learns them without
		 * a round trip (its sender published them). */
		if ((st = cohort_client_error(c)) != COHORT_OK)
			return (st);
		if (!c->xfer.known
		    && (st = elastic_learn_roles(c, deadline)) != COHORT_OK)
			return (st);
		c->xfer.admitted = false;
		elastic_roles(c, out);
		return (COHORT_OK);
	}
	if (c->xfer.pending) {
		cohort_boundary named;

		elastic_roles(c, &named);
		if (named.role != COHORT_STATE_NONE)
			return (cohort__err(COHORT_ESTATE,
			    "the last step boundary named this rank to %s the "
			    "state: call cohort_state_transfer before the "
			    "next boundary",
			    named.role == COHORT_STATE_SEND ? "send"
			                                    : "receive"));
		elastic_xfer_clear(c); /* nothing for this rank to do */
	}
	st = cohort__control_boundary(c->world, c->has_state, timeout, &br);
	if (st != COHORT_OK)
		return (st);
	if (br.changed || br.generation > c->generation) {
		/* Members were admitted: every member got this answer, and
		 * the step is committed on all; move along before return. */
		char detail[COHORT__DETAIL_MAX];

		st = elastic_reform(c, &out->reform, deadline);
		if (st != COHORT_OK) {
			cohort__strlcpy(
			    detail, cohort_last_error(), sizeof(detail));
			free(br.receivers);
			return (cohort__err(st,
			    "step committed, but the reform to generation "
			    "%" PRIu64 " failed: %s",
			    br.generation, detail));
		}
		out->changed = true;
	}
	if (br.sender >= 0 && br.nreceivers > 0
	    && c->generation == br.generation) {
		elastic_xfer_clear(c);
		c->xfer.pending = true;
		c->xfer.known = true;
		c->xfer.generation = br.generation;
		c->xfer.seq = br.seq;
		c->xfer.sender = br.sender;
		c->xfer.receivers = br.receivers;
		c->xfer.nreceivers = br.nreceivers;
		br.receivers = NULL;
		elastic_roles(c, out);
		if (out->role == COHORT_STATE_SEND
		    && (st = elastic_publish_roles(c, deadline)) != COHORT_OK)
			return (st);
	}
	free(br.receivers);
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* State transfer                                                           */
/* ------------------------------------------------------------------------ */

/* Broadcasts len bytes at p from group rank 0 of g, in chunks. */
static cohort_status
elastic_bcast(cohort_group *g, void *p, size_t len, cohort__time deadline)
{
	cohort_status st = COHORT_OK;

	for (size_t off = 0; off < len && st == COHORT_OK;
	     off += ELASTIC_CHUNK) {
		size_t n
		    = len - off < ELASTIC_CHUNK ? len - off : ELASTIC_CHUNK;

		st = cohort_broadcast(g, (uint8_t *)p + off, n, COHORT_U8, 0,
		    NULL, cohort__remaining(deadline));
	}
	return (st);
}

cohort_status
cohort_state_transfer(cohort_client *c, const void *send, size_t len,
    void **recv, size_t *recv_len, cohort_duration timeout)
{
	cohort_boundary roles;
	cohort_group *sg = NULL;
	cohort__time deadline;
	char name[80];
	int32_t *ranks = NULL;
	uint8_t hdr[8];
	uint64_t total = 0;
	void *buf = NULL;
	cohort_status st;

	cohort__err_clear();
	if (c == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL client"));
	if (!c->xfer.pending)
		return (cohort__err(COHORT_ESTATE,
		    "no step boundary asked for a state transfer"));
	deadline = cohort__client_deadline(c, timeout);
	if (!c->xfer.known
	    && (st = elastic_learn_roles(c, deadline)) != COHORT_OK)
		return (st);
	elastic_roles(c, &roles);
	if (roles.role == COHORT_STATE_SEND && send == NULL && len > 0)
		return (
		    cohort__err(COHORT_EINVAL, "the sender's state is NULL"));
	if (roles.role == COHORT_STATE_RECV
	    && (recv == NULL || recv_len == NULL))
		return (cohort__err(
		    COHORT_EINVAL, "a receiver needs recv and recv_len"));
	if (roles.role == COHORT_STATE_NONE) {
		elastic_xfer_clear(c);
		return (COHORT_OK);
	}
	/* The sender first, then the receivers in cohortd's order. */
	if ((ranks
	        = malloc(((size_t)c->xfer.nreceivers + 1) * sizeof(int32_t)))
	    == NULL) {
		st = cohort__err(COHORT_ENOMEM, "out of memory");
		goto out;
	}
	ranks[0] = c->xfer.sender;
	memcpy(ranks + 1, c->xfer.receivers,
	    (size_t)c->xfer.nreceivers * sizeof(int32_t));
	snprintf(name, sizeof(name), "cohort.state.%" PRIu64 ".%" PRIu64,
	    c->xfer.generation, c->xfer.seq);
	st = cohort_group_new(c, name, ranks, (size_t)c->xfer.nreceivers + 1,
	    NULL, &sg, cohort__remaining(deadline));
	if (st != COHORT_OK)
		goto out;
	if (roles.role == COHORT_STATE_SEND)
		total = (uint64_t)len;
	for (int i = 0; i < 8; i++)
		hdr[i] = (uint8_t)(total >> (8 * i));
	if ((st = cohort_broadcast(sg, hdr, sizeof(hdr), COHORT_U8, 0, NULL,
	         cohort__remaining(deadline)))
	    != COHORT_OK)
		goto out;
	if (roles.role == COHORT_STATE_RECV) {
		total = 0;
		for (int i = 0; i < 8; i++)
			total |= (uint64_t)hdr[i] << (8 * i);
		if (total > SIZE_MAX
		    || (buf = malloc(total > 0 ? (size_t)total : 1)) == NULL) {
			st = cohort__err(COHORT_ENOMEM,
			    "cannot hold the state: %" PRIu64 " bytes", total);
			goto out;
		}
		st = elastic_bcast(sg, buf, (size_t)total, deadline);
	} else {
		st = elastic_bcast(sg, (void *)send, len, deadline);
	}
	if (st != COHORT_OK)
		goto out;
	if (roles.role == COHORT_STATE_RECV) {
		*recv = buf;
		*recv_len = (size_t)total;
		buf = NULL;
		c->has_state = true;
	}
	cohort__info("state transfer of generation %" PRIu64 ": %s %" PRIu64
	             " bytes %s rank %d",
	    c->xfer.generation,
	    roles.role == COHORT_STATE_SEND ? "sent" : "received", total,
	    roles.role == COHORT_STATE_SEND ? "to" : "from",
	    roles.role == COHORT_STATE_SEND ? c->xfer.receivers[0]
	                                    : c->xfer.sender);
out:
	if (sg != NULL) {
		char detail[COHORT__DETAIL_MAX];

		cohort__strlcpy(detail, cohort_last_error(), sizeof(detail));
		cohort_group_destroy(sg);
		if (st != COHORT_OK)
			cohort__err(st, "%s", detail);
	}
	free(buf);
	free(ranks);
	/* Done or failed: the next boundary asks cohortd again (the
	 * receivers that still hold no state are named again). */
	elastic_xfer_clear(c);
	return (st);
}
