/*
 * dp.c - single-process data parallelism over K CPU replicas (see dp.h).
 *
 * K - 1 persistent worker threads plus the caller: a task is published
 * with a generation number, every thread runs its share, the caller waits
 * until all finished. Gradient reduction and the parameter broadcast are
 * split over the threads by parameter ranges.
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "dp.h"
#include "strat.h"

#define DP_MAX 256

enum { DP_TASK_FB = 1, DP_TASK_REDUCE, DP_TASK_BCAST, DP_TASK_ZERO };

struct cohort_dp {
	cohort_dp_replica *rep;
	int k;
	size_t n;
	pthread_t *threads;
	int nthreads;
	pthread_mutex_t mtx;
	pthread_cond_t go, done;
	uint64_t gen;
	int running;
	bool stop;
	/* The current task. */
	int task;
	size_t batch;
	cohort_dp_fn fn;
	void *arg;
	int *rc;
	char err[256];
};

struct dp_worker {
	cohort_dp *dp;
	int k;
};

static void
dp_range(size_t n, int parts, int i, size_t *b, size_t *e)
{
	size_t chunk = (n + (size_t)parts - 1) / (size_t)parts;

	*b = chunk * (size_t)i;
	*e = *b + chunk;
	if (*b > n)
		*b = n;
	if (*e > n)
		*e = n;
}

static void
dp_run_share(cohort_dp *dp, int k)
{
	size_t b, e;

	switch (dp->task) {
	case DP_TASK_FB:
		dp_range(dp->batch, dp->k, k, &b, &e);
		if (b < e)
			dp->rc[k] = dp->fn(dp->rep[k].model, k, b, e,
			    1.0f / (float)dp->batch, dp->arg);
		break;
	case DP_TASK_REDUCE:
		/* Root += others, over this thread's parameter range; summed
		 * in replica order, so the result does not depend on the
		 * number of threads. */
		dp_range(dp->n, dp->k, k, &b, &e);
		for (int r = 1; r < dp->k; r++) {
			float *g0 = dp->rep[0].grads, *g = dp->rep[r].grads;

			for (size_t i = b; i < e; i++) {
				g0[i] += g[i];
				g[i] = 0.0f;
			}
		}
		break;
	case DP_TASK_BCAST:
		dp_range(dp->n, dp->k, k, &b, &e);
		for (int r = 1; r < dp->k && b < e; r++)
			memcpy(dp->rep[r].params + b, dp->rep[0].params + b,
			    (e - b) * sizeof(float));
		break;
	case DP_TASK_ZERO:
		if (dp->n > 0)
			memset(dp->rep[k].grads, 0, dp->n * sizeof(float));
		break;
	}
}

static void *
dp_thread(void *arg)
{
	struct dp_worker *w = arg;
	cohort_dp *dp = w->dp;
	uint64_t seen = 0;

	pthread_mutex_lock(&dp->mtx);
	for (;;) {
		while (!dp->stop && dp->gen == seen)
			pthread_cond_wait(&dp->go, &dp->mtx);
		if (dp->stop)
			break;
		seen = dp->gen;
		pthread_mutex_unlock(&dp->mtx);
		dp_run_share(dp, w->k);
		pthread_mutex_lock(&dp->mtx);
		if (--dp->running == 0)
			pthread_cond_signal(&dp->done);
	}
	pthread_mutex_unlock(&dp->mtx);
	free(w);
	return (NULL);
}

/* Runs the current task on every replica's thread (share 0 here). */
static void
dp_run(cohort_dp *dp, int task)
{
	dp->task = task;
	pthread_mutex_lock(&dp->mtx);
	dp->running = dp->nthreads;
	dp->gen++;
	pthread_cond_broadcast(&dp->go);
	pthread_mutex_unlock(&dp->mtx);
	dp_run_share(dp, 0);
	pthread_mutex_lock(&dp->mtx);
	while (dp->running > 0)
		pthread_cond_wait(&dp->done, &dp->mtx);
	pthread_mutex_unlock(&dp->mtx);
}

cohort_status
cohort_dp_new(
    const cohort_dp_replica *replicas, int k, size_t n_params, cohort_dp **out)
{
	cohort_dp *dp;

	if (replicas == NULL || k < 1 || k > DP_MAX || out == NULL)
		return (COHORT_EINVAL);
	for (int r = 0; r < k; r++)
		if (n_params > 0
		    && (replicas[r].params == NULL
		        || replicas[r].grads == NULL))
			return (COHORT_EINVAL);
	if ((dp = calloc(1, sizeof(*dp))) == NULL)
		return (COHORT_ENOMEM);
	dp->k = k;
	dp->n = n_params;
	dp->rep = malloc((size_t)k * sizeof(*dp->rep));
	dp->rc = calloc((size_t)k, sizeof(int));
	dp->threads = calloc((size_t)k, sizeof(pthread_t));
	if (dp->rep == NULL || dp->rc == NULL || dp->threads == NULL) {
		COHORT__STRAT_FREE_ALL(dp->rep, dp->rc, dp->threads, dp);
		return (COHORT_ENOMEM);
	}
	memcpy(dp->rep, replicas, (size_t)k * sizeof(*dp->rep));
	cohort__strat_sync_init(&dp->mtx, &dp->go, &dp->done);
	for (int r = 1; r < k; r++) {
		struct dp_worker *w = malloc(sizeof(*w));

		if (w == NULL)
			break;
		w->dp = dp;
		w->k = r;
		if (pthread_create(&dp->threads[r - 1], NULL, dp_thread, w)
		    != 0) {
			free(w);
			break;
		}
		dp->nthreads++;
	}
	if (dp->nthreads != k - 1) {
		cohort_dp_free(dp);
		return (COHORT_ESYSTEM);
	}
	cohort_dp_broadcast_params(dp);
	cohort_dp_zero_grad(dp);
	*out = dp;
	return (COHORT_OK);
}

void
cohort_dp_free(cohort_dp *dp)
{
	if (dp == NULL)
		return;
	cohort__strat_stop(&dp->mtx, &dp->go, &dp->stop);
	for (int t = 0; t < dp->nthreads; t++)
		pthread_join(dp->threads[t], NULL);
	cohort__strat_sync_fini(&dp->mtx, &dp->go, &dp->done);
	COHORT__STRAT_FREE_ALL(dp->threads, dp->rep, dp->rc, dp);
}

int
cohort_dp_num_replicas(const cohort_dp *dp)
{
	return (dp != NULL ? dp->k : 0);
}

void *
cohort_dp_root_model(const cohort_dp *dp)
{
	return (dp != NULL ? dp->rep[0].model : NULL);
}

void
cohort_dp_batch_to_device(
    const cohort_dp *dp, size_t n, int k, size_t *begin, size_t *end)
{
	dp_range(n, dp->k, k, begin, end);
}

cohort_status
cohort_dp_forward_backward(cohort_dp *dp, size_t n, cohort_dp_fn fn, void *arg)
{
	if (dp == NULL || fn == NULL)
		return (COHORT_EINVAL);
	if (n == 0)
		return (COHORT_OK);
	dp->batch = n;
	dp->fn = fn;
	dp->arg = arg;
	memset(dp->rc, 0, (size_t)dp->k * sizeof(int));
	dp_run(dp, DP_TASK_FB);
	for (int r = 0; r < dp->k; r++) {
		if (dp->rc[r] != 0) {
			snprintf(dp->err, sizeof(dp->err),
			    "dp: replica %d: forward/backward returned %d", r,
			    dp->rc[r]);
			return (COHORT_EABORTED);
		}
	}
	return (COHORT_OK);
}

void
cohort_dp_reduce_gradients(cohort_dp *dp)
{
	if (dp != NULL && dp->k > 1)
		dp_run(dp, DP_TASK_REDUCE);
}

void
cohort_dp_broadcast_params(cohort_dp *dp)
{
	if (dp != NULL && dp->k > 1)
		dp_run(dp, DP_TASK_BCAST);
}

void
cohort_dp_zero_grad(cohort_dp *dp)
{
	if (dp != NULL)
		dp_run(dp, DP_TASK_ZERO);
}

cohort_status
cohort_dp_step(
    cohort_dp *dp, int (*step)(void *root_model, void *arg), void *arg)
{
	int rc;

	if (dp == NULL || step == NULL)
		return (COHORT_EINVAL);
	cohort_dp_reduce_gradients(dp);
	if ((rc = step(dp->rep[0].model, arg)) != 0) {
		snprintf(dp->err, sizeof(dp->err),
		    "dp: optimizer step returned %d", rc);
		return (COHORT_EABORTED);
	}
	cohort_dp_broadcast_params(dp);
	cohort_dp_zero_grad(dp);
	return (COHORT_OK);
}

cohort_status
cohort_dp_state_get(const cohort_dp *dp, float *out, size_t n)
{
	if (dp == NULL || out == NULL || n != dp->n)
		return (COHORT_EINVAL);
	memcpy(out, dp->rep[0].params, n * sizeof(float));
	return (COHORT_OK);
}

cohort_status
cohort_dp_state_load(cohort_dp *dp, const float *in, size_t n)
{
	if (dp == NULL || in == NULL || n != dp->n)
		return (COHORT_EINVAL);
	memcpy(dp->rep[0].params, in, n * sizeof(float));
	cohort_dp_broadcast_params(dp);
	return (COHORT_OK);
}

cohort_status
cohort_dp_all_reduce(
    const cohort_dp *dp, double *v, size_t count, cohort_redop op)
{
	if (dp == NULL || (v == NULL && count > 0) || op >= COHORT_REDOP_COUNT)
		return (COHORT_EINVAL);
	for (size_t i = 0; i < count; i++) {
		double a = v[i];

		for (int r = 1; r < dp->k; r++) {
			double b = v[(size_t)r * count + i];

			switch (op) {
			case COHORT_SUM:
			case COHORT_MEAN:
				a += b;
				break;
			case COHORT_PROD:
				a *= b;
				break;
			case COHORT_MIN:
				a = b < a ? b : a;
				break;
			case COHORT_MAX:
				a = b > a ? b : a;
				break;
			default:
				break;
			}
		}
		v[i] = op == COHORT_MEAN ? a / dp->k : a;
	}
	return (COHORT_OK);
}

const char *
cohort_dp_last_error(const cohort_dp *dp)
{
	return (dp != NULL ? dp->err : "");
}
