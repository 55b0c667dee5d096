/*
 * mlp.h - a small multilayer perceptron for the examples and the tests.
 *
 *   x (n_in) -> Linear(n_in, n_hidden) -> ReLU -> Linear(n_hidden, n_out)
 *            -> softmax cross-entropy
 *
 * float32 throughout. Parameters live in one flat buffer (params) and their
 * gradients in another of the same layout (grads), so a whole model is one
 * tensor for a broadcast or an all-reduce. The flat buffer is also exposed
 * as a list of parameter tensors, in registration order:
 *
 *   0 "fc1.weight" [n_hidden][n_in]   1 "fc1.bias" [n_hidden]
 *   2 "fc2.weight" [n_out][n_hidden]  3 "fc2.bias" [n_out]
 *
 * Backward produces gradients in reverse registration order (3, 2, 1, 0),
 * like PyTorch's autograd, and reports each one through the optional
 * on_grad_ready callback as soon as it is final, so a DDP layer can start
 * reducing a bucket while the rest of backward runs.
 *
 * Gradients accumulate: mlp_backward adds to grads, mlp_zero_grad clears
 * them (gradient accumulation = several backwards between zero_grads).
 */
#ifndef COHORT_EXAMPLES_MLP_H
#define COHORT_EXAMPLES_MLP_H

#include <stddef.h>
#include <stdint.h>

#define MLP_NPARAMS 4

/* One parameter tensor: a view into the model's flat buffers. */
struct mlp_param {
	const char *name;
	float *data; /* params + offset */
	float *grad; /* grads + offset */
	size_t offset; /* in elements, into the flat buffers */
	size_t count; /* elements */
};

typedef void (*mlp_grad_ready_fn)(void *ctx, int param_index);

struct mlp {
	int n_in, n_hidden, n_out;
	size_t n_params; /* total elements of params (and grads) */
	float *params; /* flat: fc1.weight, fc1.bias, fc2.weight, fc2.bias */
	float *grads; /* same layout */
	float *velocity; /* momentum buffer, allocated on first use */
	struct mlp_param param[MLP_NPARAMS];

	/* Called during mlp_backward when param[i]'s gradient is final. */
	mlp_grad_ready_fn on_grad_ready;
	void *grad_ready_ctx;

	/* Activations of the last mlp_forward (for mlp_backward). */
	size_t cap; /* samples the scratch buffers hold */
	size_t n_fwd; /* samples of the last forward */
	float *hidden; /* [cap][n_hidden], after ReLU */
	float *probs; /* [cap][n_out], softmax output */
	float *dhid; /* [cap][n_hidden], backward scratch */
	float *dout; /* [cap][n_out], backward scratch */
};

/* Allocates a model and initialises its parameters from seed (same seed,
 * same sizes -> bit-identical parameters on every machine). Returns 0, or
 * -1 with errno (EINVAL for non-positive sizes, ENOMEM). */
int mlp_init(struct mlp *m, int n_in, int n_hidden, int n_out, uint64_t seed);
/* Frees everything; the struct may be reused with mlp_init. NULL-safe. */
void mlp_fini(struct mlp *m);

/* Re-initialises the parameters from seed (fan-in scaled uniform weights,
 * zero biases) and clears gradients and momentum. */
void mlp_reset(struct mlp *m, uint64_t seed);

/* Sets the gradient readiness callback (NULL disables it). */
void mlp_set_grad_ready(struct mlp *m, mlp_grad_ready_fn fn, void *ctx);

/* Forward pass over n samples x[n][n_in]; keeps the activations for
 * mlp_backward. If labels is not NULL, adds the summed cross-entropy loss
 * to *loss_sum and the number of correct argmax predictions to *correct
 * (either may be NULL). Returns 0, or -1 with errno ENOMEM. */
int mlp_forward(struct mlp *m, const float *x, const uint8_t *labels, size_t n,
    double *loss_sum, size_t *correct);

/* Backward pass for the samples of the last mlp_forward (x and labels must
 * be the same). Adds scale * d(sum_i loss_i)/d(theta) to grads: scale =
 * 1/n gives the gradient of the mean loss; 1/(n*k) that of a micro-batch of
 * k accumulation steps. Calls on_grad_ready(ctx, i) for i = 3, 2, 1, 0. */
void mlp_backward(struct mlp *m, const float *x, const uint8_t *labels,
    size_t n, float scale);

void mlp_zero_grad(struct mlp *m);

/* SGD: v = momentum * v + g; p -= lr * v (PyTorch's formulation; with
 * momentum 0, p -= lr * g). Returns 0, or -1 with errno ENOMEM when the
 * momentum buffer cannot be allocated. */
int mlp_sgd_step(struct mlp *m, float lr, float momentum);

/* Mean loss and accuracy over n samples, in chunks (no gradients).
 * Returns 0, or -1 with errno ENOMEM. */
int mlp_evaluate(struct mlp *m, const float *x, const uint8_t *labels,
    size_t n, double *loss_sum, size_t *correct);

/* FNV-1a 64 over the bytes of the parameters. */
uint64_t mlp_checksum(const struct mlp *m);
uint64_t mlp_fnv1a64(const void *data, size_t len);

#endif /* COHORT_EXAMPLES_MLP_H */
