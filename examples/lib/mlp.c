/*
 * mlp.c - forward, backward and SGD of the examples' two-layer perceptron.
 *
 * Plain loops written so the innermost one walks contiguous memory; the
 * model is small (64-128-10: 9610 parameters) and this is fast enough for
 * the examples, where communication is what is being measured.
 */
#include <errno.h>
#include <math.h>
#include <stdlib.h>
#include <string.h>

#include "freeall.h"
#include "mlp.h"
#include "splitmix.h"

#define MLP_EVAL_CHUNK 256

/* Uniform in [-bound, bound), from 24 random bits: exact in float. */
static float
mlp_rand_uniform(uint64_t *state, float bound)
{
	float u = (float)(splitmix64_next(state) >> 40) * (1.0f / 16777216.0f);

	return ((2.0f * u - 1.0f) * bound);
}

static void
mlp_fill_uniform(float *p, size_t n, float bound, uint64_t *state)
{
	for (size_t i = 0; i < n; i++)
		p[i] = mlp_rand_uniform(state, bound);
}

void
mlp_reset(struct mlp *m, uint64_t seed)
{
	uint64_t state = seed ^ 0x636f686f72746d6cULL; /* "cohortml" */

	/* He (Kaiming) uniform for the ReLU layer, LeCun uniform for the
	 * output layer; zero biases. */
	mlp_fill_uniform(m->param[0].data, m->param[0].count,
	    sqrtf(6.0f / (float)m->n_in), &state);
	memset(m->param[1].data, 0, m->param[1].count * sizeof(float));
	mlp_fill_uniform(m->param[2].data, m->param[2].count,
	    sqrtf(3.0f / (float)m->n_hidden), &state);
	memset(m->param[3].data, 0, m->param[3].count * sizeof(float));
	mlp_zero_grad(m);
	if (m->velocity != NULL)
		memset(m->velocity, 0, m->n_params * sizeof(float));
}

int
mlp_init(struct mlp *m, int n_in, int n_hidden, int n_out, uint64_t seed)
{
	static const char *const names[MLP_NPARAMS]
	    = { "fc1.weight", "fc1.bias", "fc2.weight", "fc2.bias" };
	size_t counts[MLP_NPARAMS];
	size_t off = 0;

	memset(m, 0, sizeof(*m));
	if (n_in <= 0 || n_hidden <= 0 || n_out <= 0) {
		errno = EINVAL;
		return (-1);
	}
	m->n_in = n_in;
	m->n_hidden = n_hidden;
	m->n_out = n_out;
	counts[0] = (size_t)n_hidden * (size_t)n_in;
	counts[1] = (size_t)n_hidden;
	counts[2] = (size_t)n_out * (size_t)n_hidden;
	counts[3] = (size_t)n_out;
	for (int i = 0; i < MLP_NPARAMS; i++)
		m->n_params += counts[i];

	m->params = calloc(m->n_params, sizeof(float));
	m->grads = calloc(m->n_params, sizeof(float));
	if (m->params == NULL || m->grads == NULL) {
		mlp_fini(m);
		errno = ENOMEM;
		return (-1);
	}
	for (int i = 0; i < MLP_NPARAMS; i++) {
		m->param[i].name = names[i];
		m->param[i].offset = off;
		m->param[i].count = counts[i];
		m->param[i].data = m->params + off;
		m->param[i].grad = m->grads + off;
		off += counts[i];
	}
	mlp_reset(m, seed);
	return (0);
}

void
mlp_fini(struct mlp *m)
{
	if (m == NULL)
		return;
	EX_FREE_ALL(m->params, m->grads, m->velocity, m->hidden, m->probs,
	    m->dhid, m->dout);
	memset(m, 0, sizeof(*m));
}

void
mlp_set_grad_ready(struct mlp *m, mlp_grad_ready_fn fn, void *ctx)
{
	m->on_grad_ready = fn;
	m->grad_ready_ctx = ctx;
}

static int
mlp_reserve(struct mlp *m, size_t n)
{
	float *h, *p, *dh, *dout;

	if (n <= m->cap)
		return (0);
	h = malloc(n * (size_t)m->n_hidden * sizeof(float));
	p = malloc(n * (size_t)m->n_out * sizeof(float));
	dh = malloc(n * (size_t)m->n_hidden * sizeof(float));
	dout = malloc(n * (size_t)m->n_out * sizeof(float));
	if (h == NULL || p == NULL || dh == NULL || dout == NULL) {
		free(h);
		free(p);
		free(dh);
		free(dout);
		errno = ENOMEM;
		return (-1);
	}
	free(m->hidden);
	free(m->probs);
	free(m->dhid);
	free(m->dout);
	m->hidden = h;
	m->probs = p;
	m->dhid = dh;
	m->dout = dout;
	m->cap = n;
	return (0);
}

int
mlp_forward(struct mlp *m, const float *x, const uint8_t *labels, size_t n,
    double *loss_sum, size_t *correct)
{
	const int ni = m->n_in, nh = m->n_hidden, no = m->n_out;
	const float *w1 = m->param[0].data, *b1 = m->param[1].data;
	const float *w2 = m->param[2].data, *b2 = m->param[3].data;
	double loss = 0.0;
	size_t right = 0;

	if (mlp_reserve(m, n) != 0)
		return (-1);
	m->n_fwd = n;
	for (size_t s = 0; s < n; s++) {
		const float *xs = x + s * (size_t)ni;
		float *hs = m->hidden + s * (size_t)nh;
		float *ps = m->probs + s * (size_t)no;
		float max;
		double sum = 0.0;
		int best = 0;

		for (int j = 0; j < nh; j++) {
			const float *w = w1 + (size_t)j * (size_t)ni;
			float a = b1[j];

			for (int k = 0; k < ni; k++)
				a += w[k] * xs[k];
			hs[j] = a > 0.0f ? a : 0.0f;
		}
		for (int o = 0; o < no; o++) {
			const float *w = w2 + (size_t)o * (size_t)nh;
			float a = b2[o];

			for (int j = 0; j < nh; j++)
				a += w[j] * hs[j];
			ps[o] = a;
		}
		/* Numerically stable softmax; loss = logsumexp - logit[y]. */
		max = ps[0];
		for (int o = 1; o < no; o++) {
			if (ps[o] > max) {
				max = ps[o];
				best = o;
			}
		}
		for (int o = 0; o < no; o++)
			sum += exp((double)(ps[o] - max));
		if (labels != NULL && labels[s] < no) {
			int y = labels[s];

			loss += log(sum) - (double)(ps[y] - max);
			if (best == y)
				right++;
		}
		for (int o = 0; o < no; o++)
			ps[o] = (float)(exp((double)(ps[o] - max)) / sum);
	}
	if (loss_sum != NULL)
		*loss_sum += loss;
	if (correct != NULL)
		*correct += right;
	return (0);
}

static void
mlp_ready(struct mlp *m, int i)
{
	if (m->on_grad_ready != NULL)
		m->on_grad_ready(m->grad_ready_ctx, i);
}

/* A layer's bias gradient: gb[o] += d[s][o] over the n samples of d
 * (rows of no). */
static void
mlp_grad_bias(float *gb, const float *d, size_t n, int no)
{
	for (size_t s = 0; s < n; s++) {
		const float *ds = d + s * (size_t)no;

		for (int o = 0; o < no; o++)
			gb[o] += ds[o];
	}
}

/* A layer's weight gradient: gw[o][k] += d[s][o] * in[s][k] over the n
 * samples (d: rows of no, in: rows of ni); zero rows of d are skipped. */
static void
mlp_grad_weight(
    float *gw, const float *d, const float *in, size_t n, int no, int ni)
{
	for (size_t s = 0; s < n; s++) {
		const float *ds = d + s * (size_t)no;
		const float *xs = in + s * (size_t)ni;

		for (int o = 0; o < no; o++) {
			float *g = gw + (size_t)o * (size_t)ni;
			float v = ds[o];

			if (v == 0.0f)
				continue;
			for (int k = 0; k < ni; k++)
				g[k] += v * xs[k];
		}
	}
}

void
mlp_backward(struct mlp *m, const float *x, const uint8_t *labels, size_t n,
    float scale)
{
	const int ni = m->n_in, nh = m->n_hidden, no = m->n_out;
	const float *w2 = m->param[2].data;
	float *gw1 = m->param[0].grad, *gb1 = m->param[1].grad;
	float *gw2 = m->param[2].grad, *gb2 = m->param[3].grad;

	if (n > m->n_fwd)
		n = m->n_fwd;

	/* dL/dlogits = scale * (softmax - onehot). */
	for (size_t s = 0; s < n; s++) {
		const float *ps = m->probs + s * (size_t)no;
		float *ds = m->dout + s * (size_t)no;

		for (int o = 0; o < no; o++)
			ds[o] = scale * ps[o];
		if (labels[s] < no)
			ds[labels[s]] -= scale;
	}

	/* fc2.bias (3), then fc2.weight (2). */
	mlp_grad_bias(gb2, m->dout, n, no);
	mlp_ready(m, 3);
	mlp_grad_weight(gw2, m->dout, m->hidden, n, no, nh);
	mlp_ready(m, 2);

	/* Through fc2 and the ReLU. */
	for (size_t s = 0; s < n; s++) {
		const float *ds = m->dout + s * (size_t)no;
		const float *hs = m->hidden + s * (size_t)nh;
		float *dh = m->dhid + s * (size_t)nh;

		for (int j = 0; j < nh; j++)
			dh[j] = 0.0f;
		for (int o = 0; o < no; o++) {
			const float *w = w2 + (size_t)o * (size_t)nh;
			float d = ds[o];

			for (int j = 0; j < nh; j++)
				dh[j] += d * w[j];
		}
		for (int j = 0; j < nh; j++) {
			if (hs[j] <= 0.0f)
				dh[j] = 0.0f;
		}
	}

	/* fc1.bias (1), then fc1.weight (0). */
	mlp_grad_bias(gb1, m->dhid, n, nh);
	mlp_ready(m, 1);
	mlp_grad_weight(gw1, m->dhid, x, n, nh, ni);
	mlp_ready(m, 0);
}

void
mlp_zero_grad(struct mlp *m)
{
	memset(m->grads, 0, m->n_params * sizeof(float));
}

int
mlp_sgd_step(struct mlp *m, float lr, float momentum)
{
	if (momentum == 0.0f) {
		for (size_t i = 0; i < m->n_params; i++)
			m->params[i] -= lr * m->grads[i];
		return (0);
	}
	if (m->velocity == NULL) {
		m->velocity = calloc(m->n_params, sizeof(float));
		if (m->velocity == NULL) {
			errno = ENOMEM;
			return (-1);
		}
	}
	for (size_t i = 0; i < m->n_params; i++) {
		m->velocity[i] = momentum * m->velocity[i] + m->grads[i];
		m->params[i] -= lr * m->velocity[i];
	}
	return (0);
}

int
mlp_evaluate(struct mlp *m, const float *x, const uint8_t *labels, size_t n,
    double *loss_sum, size_t *correct)
{
	for (size_t s = 0; s < n; s += MLP_EVAL_CHUNK) {
		size_t k = n - s < MLP_EVAL_CHUNK ? n - s : MLP_EVAL_CHUNK;

		if (mlp_forward(m, x + s * (size_t)m->n_in, labels + s, k,
		        loss_sum, correct)
		    != 0)
			return (-1);
	}
	return (0);
}

uint64_t
mlp_fnv1a64(const void *data, size_t len)
{
	const unsigned char *p = data;
	uint64_t h = 0xcbf29ce484222325ULL;

	for (size_t i = 0; i < len; i++) {
		h ^= p[i];
		h *= 0x100000001b3ULL;
	}
	return (h);
}

uint64_t
mlp_checksum(const struct mlp *m)
{
	return (mlp_fnv1a64(m->params, m->n_params * sizeof(float)));
}
