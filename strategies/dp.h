/*
 * dp.h - one process, K devices (PyTorch Lightning's DataParallelStrategy,
 * torch.nn.DataParallel), on CPU: K model replicas driven by K threads.
 *
 * The caller owns K replicas of its model, each exposing its parameters
 * and gradients as flat float32 buffers of the same layout (n_params
 * elements). cohort_dp_new copies the root replica's (replica 0's)
 * parameters to the others (module_to_device). A training step:
 *
 *   cohort_dp_forward_backward(dp, n, fn, arg);  // K threads, batch split
 *   cohort_dp_step(dp, sgd, model0);             // reduce to root, step,
 *                                                // broadcast back
 *
 * fn(model_k, k, begin, end, scale, arg) runs forward and backward of the
 * samples [begin, end) of the batch on replica k and must ADD scale * the
 * gradient of the summed per-sample loss to its gradients: scale = 1/n,
 * so that the sum over the replicas is the gradient of the batch's mean
 * loss, as if one device had processed the whole batch. The batch is split
 * like torch's scatter: contiguous chunks of ceil(n / K) samples
 * (cohort_dp_batch_to_device tells replica k its chunk).
 *
 * No cohort client is needed. All functions are called from one thread.
 */
#ifndef COHORT_STRATEGIES_DP_H
#define COHORT_STRATEGIES_DP_H

#include <stdbool.h>
#include <stddef.h>

#include "cohort/cohort.h"

#ifdef __cplusplus
extern "C" {
#endif

typedef struct cohort_dp cohort_dp;

typedef struct cohort_dp_replica {
	void *model; /* passed to fn */
	float *params; /* n_params */
	float *grads; /* n_params */
} cohort_dp_replica;

typedef int (*cohort_dp_fn)(void *model, int replica, size_t begin, size_t end,
    float scale, void *arg);

/* k in 1..256 replicas; replica 0 is the root. Copies the root's
 * parameters to the others and zeroes every gradient. */
COHORT_API cohort_status cohort_dp_new(const cohort_dp_replica *replicas,
    int k, size_t n_params, cohort_dp **out);
COHORT_API void cohort_dp_free(cohort_dp *dp);

COHORT_API int cohort_dp_num_replicas(const cohort_dp *dp);
COHORT_API void *cohort_dp_root_model(const cohort_dp *dp);

/* batch_to_device: replica k's chunk [*begin, *end) of an n-sample
 * batch (empty when n < k and k is past the data). */
COHORT_API void cohort_dp_batch_to_device(
    const cohort_dp *dp, size_t n, int k, size_t *begin, size_t *end);

/* Runs fn on every replica with a non-empty chunk, in parallel. Returns
 * COHORT_OK, or COHORT_EABORTED if fn returned non-zero on a replica
 * (cohort_dp_last_error says which). Gradients accumulate over calls. */
COHORT_API cohort_status cohort_dp_forward_backward(
    cohort_dp *dp, size_t n, cohort_dp_fn fn, void *arg);

/* Gradients reduced to the root: root += sum of the others, which are
 * zeroed. */
COHORT_API void cohort_dp_reduce_gradients(cohort_dp *dp);
/* The root's parameters copied to every other replica. */
COHORT_API void cohort_dp_broadcast_params(cohort_dp *dp);
COHORT_API void cohort_dp_zero_grad(cohort_dp *dp);

/* reduce_gradients, step(root model, arg) (non-zero = failure:
 * COHORT_EABORTED), broadcast_params, zero_grad. */
COHORT_API cohort_status cohort_dp_step(
    cohort_dp *dp, int (*step)(void *root_model, void *arg), void *arg);

/* State get/load: the root's parameters (n must be n_params, else
 * COHORT_EINVAL, like load_state_dict(strict=True)); load sets every
 * replica. */
COHORT_API cohort_status cohort_dp_state_get(
    const cohort_dp *dp, float *out, size_t n);
COHORT_API cohort_status cohort_dp_state_load(
    cohort_dp *dp, const float *in, size_t n);

/* all_reduce of per-replica values: v holds k * count doubles (replica
 * r's at r * count); the reduction lands in v[0..count) (SUM, MEAN, MIN,
 * MAX, PROD). */
COHORT_API cohort_status cohort_dp_all_reduce(
    const cohort_dp *dp, double *v, size_t count, cohort_redop op);

COHORT_API const char *cohort_dp_last_error(const cohort_dp *dp);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_STRATEGIES_DP_H */
