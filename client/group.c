/*
 * group.c - process groups: sticky first failure, abort flag, accessors.
 *
 * A failure reaches a group from three sides: cohortd (an EPEERLOST reply,
 * a heartbeat or Watch event, fanned out by client.c), the data plane (a
 * backend error that leaves the connections unusable) and the user
 * (cohort_group_abort). All go through cohort__group_fail, which keeps the
 * first as a record (failure.h) and wakes whatever is blocked on the
 * group.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "fault.h"
#include "group.h"

cohort_status
cohort__group_alloc(const struct cohort__group_ctx *ctx, const char *id,
    int32_t rank, int32_t size, const int32_t *global_ranks,
    uint64_t generation, struct cohort_group **out)
{
	struct cohort_group *g;

	if (size < 1 || rank < 0 || rank >= size)
		return (cohort__err(COHORT_EINVAL,
		    "group rank %d out of range for size %d", rank, size));
	if (strlen(id) >= COHORT__GROUP_ID_MAX)
		return (cohort__err(COHORT_EINVAL,
		    "group name longer than %d bytes",
		    COHORT__GROUP_ID_MAX - 1));
	if ((g = calloc(1, sizeof(*g))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	if ((g->global_ranks = calloc((size_t)size, sizeof(int32_t))) == NULL)
		goto out_free_group;
	for (int32_t i = 0; i < size; i++)
		g->global_ranks[i]
		    = global_ranks != NULL ? global_ranks[i] : i;
	if (pthread_mutex_init(&g->mtx, NULL) != 0)
		goto out_free_ranks;
	if (pthread_mutex_init(&g->ctl_lock, NULL) != 0)
		goto out_destroy_mtx;
	if (pthread_mutex_init(&g->op_lock, NULL) != 0)
		goto out_destroy_ctl;
	g->client = ctx->client;
	g->coord = ctx->coord;
	g->obs = ctx->obs;
	g->fault = ctx->fault;
	cohort__strlcpy(g->id, id, sizeof(g->id));
	g->rank = rank;
	g->size = size;
	g->generation = generation;
	g->track = id[0] == '\0' ? COHORT__TRACK_WORLD
	                         : atomic_fetch_add(&ctx->obs->next_track, 2);
	atomic_init(&g->abort_flag, 0);
	atomic_init(&g->error, COHORT_OK);
	cohort__failure_clear(&g->failure);
	*out = g;
	return (COHORT_OK);

out_destroy_ctl:
	pthread_mutex_destroy(&g->ctl_lock);
out_destroy_mtx:
	pthread_mutex_destroy(&g->mtx);
out_free_ranks:
	free(g->global_ranks);
out_free_group:
	free(g);
	return (cohort__err(COHORT_ENOMEM, "out of memory"));
}

void
cohort__group_free(struct cohort_group *g)
{
	if (g == NULL)
		return;
	if (g->dp_fini != NULL)
		g->dp_fini(g);
	else if (g->backend != NULL && g->backend_state != NULL)
		g->backend->fini(g->backend_state);
	g->backend_state = NULL;
	pthread_mutex_destroy(&g->op_lock);
	pthread_mutex_destroy(&g->ctl_lock);
	pthread_mutex_destroy(&g->mtx);
	free(g->global_ranks);
	free(g);
}

cohort_status
cohort__group_reset(struct cohort_group *g, int32_t rank, int32_t size,
    const int32_t *global_ranks, uint64_t generation)
{
	int32_t *gr;

	if (size < 1 || rank < 0 || rank >= size)
		return (cohort__err(COHORT_EINVAL,
		    "group rank %d out of range for size %d", rank, size));
	if ((gr = calloc((size_t)size, sizeof(int32_t))) == NULL)
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	for (int32_t i = 0; i < size; i++)
		gr[i] = global_ranks != NULL ? global_ranks[i] : i;
	pthread_mutex_lock(&g->mtx);
	free(g->global_ranks);
	g->global_ranks = gr;
	g->rank = rank;
	g->size = size;
	g->generation = generation;
	g->ctl_seq = 0;
	g->data_seq = 0;
	g->ctl_call = NULL;
	g->op_kind = NULL;
	g->op_seq = 0;
	g->op_in = false;
	cohort__failure_clear(&g->failure);
	g->failed_at = 0;
	atomic_store(&g->error, COHORT_OK);
	atomic_store_explicit(&g->abort_flag, 0, memory_order_release);
	pthread_mutex_unlock(&g->mtx);
	return (COHORT_OK);
}

/* The group rank of job rank r, -1 if r is not a member. */
static int32_t
group_rank_of(const struct cohort_group *g, int32_t r)
{
	for (int32_t i = 0; r >= 0 && i < g->size; i++)
		if (g->global_ranks[i] == r)
			return (i);
	return (-1);
}

cohort_status
cohort__group_fail(struct cohort_group *g, const cohort_failure *f)
{
	char text[COHORT__FAILURE_TEXT_MAX];
	cohort_status cur;
	void *state;

	COHORT__ASSERT(f->status != COHORT_OK);
	pthread_mutex_lock(&g->mtx);
	cur = (cohort_status)atomic_load(&g->error);
	/* Elastic: EMEMBERSHIP lasts until a reform; the job failing for
	 * good meanwhile (below its minimum) is what every call says. */
	if (cur == COHORT_EMEMBERSHIP && f->status == COHORT_EPEERLOST
	    && cohort__failure_is_verdict(f->kind)) {
		atomic_store(&g->error, COHORT_OK);
		cur = COHORT_OK;
	}
	if (cur == COHORT_OK) {
		g->failure = *f;
		g->failure.size = sizeof(g->failure);
		g->failure.group_rank = group_rank_of(g, f->rank);
		g->failure.age_ms = 0;
		g->failed_at = cohort__now_ms() - (cohort__time)f->age_ms;
		atomic_store(&g->error, (int)f->status);
		cur = f->status;
		cohort__failure_text(f, false, text, sizeof(text));
		cohort__info("group '%s' failed: %s (%s): %s", g->id,
		    cohort_status_name(cur), cohort_failure_kind_name(f->kind),
		    text);
		cohort__obs_event(g->obs, COHORT__TRACK_EVENTS, "failure",
		    cohort_status_name(cur), cohort__now_ns(), 0, text);
	} else if (f->status == COHORT_EMEMBERSHIP && cur != COHORT_EMEMBERSHIP
	    && (g->failure.kind == COHORT_FAILURE_DATA_PLANE
	        || g->failure.kind == COHORT_FAILURE_TIMEOUT
	        || g->failure.kind == COHORT_FAILURE_ABORTED)) {
		/* Elastic: what the data plane saw of a change (a peer's
		 * closed connection, an abort) gives way to cohortd's
		 * verdict on it, so that every survivor returns
		 * EMEMBERSHIP; what was seen stays as `observed`. */
		cohort__failure_text(&g->failure, false, text, sizeof(text));
		g->failure = *f;
		g->failure.size = sizeof(g->failure);
		g->failure.group_rank = group_rank_of(g, f->rank);
		g->failure.age_ms = 0;
		cohort__strlcpy(
		    g->failure.observed, text, sizeof(g->failure.observed));
		g->failed_at = cohort__now_ms() - (cohort__time)f->age_ms;
		atomic_store(&g->error, (int)f->status);
		cur = f->status;
	} else if (!cohort__failure_is_verdict(f->kind)
	    && g->failure.observed[0] == '\0'
	    && cohort__failure_is_verdict(g->failure.kind)) {
		/* What this process saw of a failure cohortd named: kept
		 * beside the cause, never merged into its text. */
		cohort__failure_text(f, false, g->failure.observed,
		    sizeof(g->failure.observed));
	}
	atomic_store_explicit(&g->abort_flag, 1, memory_order_release);
	/* A control-plane call in flight when the membership changes is
	 * answered by cohortd itself (EMEMBERSHIP, or the boundary's commit
	 * every member gets alike): aborting it here could make one member
	 * miss a commit the others applied. */
	if (g->ctl_call != NULL && f->status != COHORT_EMEMBERSHIP)
		cohort__coord_call_abort(g->coord, g->ctl_call, cur);
	state = g->backend_state;
	if (state != NULL && g->backend != NULL && g->backend->abort != NULL)
		g->backend->abort(state);
	pthread_mutex_unlock(&g->mtx);
	return (cur);
}

cohort_status
cohort__group_fail_local(struct cohort_group *g, cohort_status st,
    cohort_failure_kind kind, const char *fmt, ...)
{
	cohort_failure f;
	va_list ap;

	va_start(ap, fmt);
	cohort__failure_vlocal(&f, st, kind, fmt, ap);
	va_end(ap);
	return (cohort__group_fail(g, &f));
}

/* A copy of g's failure with its age as of now. */
static void
group_failure_now(const struct cohort_group *g, cohort_failure *f)
{
	struct cohort_group *m = (struct cohort_group *)g;
	cohort__time now = cohort__now_ms();

	pthread_mutex_lock(&m->mtx);
	*f = m->failure;
	f->age_ms = now > m->failed_at ? (uint64_t)(now - m->failed_at) : 0;
	pthread_mutex_unlock(&m->mtx);
}

cohort_status
cohort__group_check(const struct cohort_group *g)
{
	char text[COHORT__FAILURE_TEXT_MAX];
	cohort_failure f;
	cohort_status st;

	st = (cohort_status)atomic_load_explicit(
	    &((struct cohort_group *)g)->error, memory_order_acquire);
	if (st == COHORT_OK)
		return (COHORT_OK);
	group_failure_now(g, &f);
	cohort__failure_text(&f, false, text, sizeof(text));
	return (cohort__err(st, "%s", text));
}

/* ------------------------------------------------------------------------ */
/* Operation hooks                                                          */
/* ------------------------------------------------------------------------ */

bool
cohort__op_is_control(const char *kind)
{
	return (kind != NULL
	    && (strcmp(kind, "barrier") == 0
	        || strcmp(kind, "broadcast_obj") == 0
	        || strcmp(kind, "reduce_scalars") == 0
	        || strcmp(kind, "decide") == 0
	        || strcmp(kind, "boundary") == 0));
}

cohort_status
cohort__group_op_begin(struct cohort_group *g, const char *kind, uint64_t seq)
{
	cohort_status st;

	/* An injected failure (drop) may have failed the group: its error
	 * wins, as at any other operation. */
	if ((st = cohort__fault_point(g->fault, g->id, kind, seq))
	    != COHORT_OK)
		return (cohort_group_error(g) != COHORT_OK
		        ? cohort__group_check(g)
		        : st);
	uint64_t now = cohort__now_ns();

	pthread_mutex_lock(&g->mtx);
	g->op_kind = kind;
	g->op_seq = seq;
	g->op_start_ns = now;
	g->op_start = (cohort__time)(now / 1000000u);
	g->op_in = true;
	pthread_mutex_unlock(&g->mtx);
	return (COHORT_OK);
}

void
cohort__group_op_end(struct cohort_group *g)
{
	uint64_t now = cohort__now_ns();

	pthread_mutex_lock(&g->mtx);
	g->op_in = false;
	g->op_end_ns = now;
	g->op_end = (cohort__time)(now / 1000000u);
	pthread_mutex_unlock(&g->mtx);
}

/* ------------------------------------------------------------------------ */
/* Public accessors                                                         */
/* ------------------------------------------------------------------------ */

int32_t
cohort_group_rank(const cohort_group *g)
{
	return (g != NULL ? g->rank : -1);
}

int32_t
cohort_group_size(const cohort_group *g)
{
	return (g != NULL ? g->size : 0);
}

int32_t
cohort_group_global_rank(const cohort_group *g, int32_t r)
{
	if (g == NULL || r < 0 || r >= g->size)
		return (-1);
	return (g->global_ranks[r]);
}

cohort_status
cohort_group_error(const cohort_group *g)
{
	if (g == NULL)
		return (COHORT_EINVAL);
	return ((cohort_status)atomic_load_explicit(
	    &((struct cohort_group *)g)->error, memory_order_acquire));
}

bool
cohort_group_is_healthy(const cohort_group *g)
{
	return (g != NULL && cohort_group_error(g) == COHORT_OK);
}

cohort_status
cohort_group_failure(const cohort_group *g, cohort_failure *f)
{
	cohort_failure cur;

	if (g == NULL || f == NULL)
		return (cohort__err(COHORT_EINVAL,
		    "cohort_group_failure: group and failure are required"));
	if (f->size < COHORT__FAILURE_V1_SIZE)
		return (cohort__err(COHORT_EINVAL,
		    "cohort_group_failure: failure.size %zu is smaller than "
		    "any version of the struct (set it to "
		    "sizeof(cohort_failure))",
		    f->size));
	if (cohort_group_error(g) == COHORT_OK)
		cohort__failure_clear(&cur);
	else
		group_failure_now(g, &cur);
	cohort__failure_copy_out(f, &cur);
	return (COHORT_OK);
}

const char *
cohort_group_last_error(const cohort_group *g)
{
	/* One per thread: concurrent callers never share it. */
	static _Thread_local char text[COHORT__FAILURE_TEXT_MAX];
	cohort_failure f;

	text[0] = '\0';
	if (g == NULL || cohort_group_error(g) == COHORT_OK)
		return (text);
	group_failure_now(g, &f);
	cohort__failure_text(&f, true, text, sizeof(text));
	return (text);
}

void
cohort_group_abort(cohort_group *g)
{
	if (g == NULL)
		return;
	cohort__group_fail_local(g, COHORT_EABORTED, COHORT_FAILURE_ABORTED,
	    "group '%s' aborted by cohort_group_abort", g->id);
}
