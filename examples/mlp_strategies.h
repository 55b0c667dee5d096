/*
 * mlp_strategies.h - the example MLP (examples/lib/mlp.h) wired to the
 * strategies: its tensors as cohort_ddp parameters, and its gradient-ready
 * callback (mlp_set_grad_ready) forwarded to DDP or Horovod. Shared by
 * train_digits and the strategy tests' worker
 * (tests/bin/cohort-strategy-worker.c). Header-only.
 */
#ifndef COHORT_MLP_STRATEGIES_H
#define COHORT_MLP_STRATEGIES_H

#include "ddp.h"
#include "hvd.h"
#include "mlp.h"

/* p[0..MLP_NPARAMS): views of m's tensors (no copies). */
static inline void
mlp_ddp_params(struct mlp *m, cohort_ddp_param *p)
{
	for (int i = 0; i < MLP_NPARAMS; i++) {
		p[i].name = m->param[i].name;
		p[i].data = m->param[i].data;
		p[i].grad = m->param[i].grad;
		p[i].count = m->param[i].count;
	}
}

/* mlp_backward's readiness callbacks, ctx the cohort_ddp or cohort_hvd:
 * the strategy may start reducing the gradient while the rest of
 * backward runs. */
static inline void
mlp_ddp_grad_ready(void *ctx, int i)
{
	cohort_ddp_grad_ready(ctx, i);
}

static inline void
mlp_hvd_grad_ready(void *ctx, int i)
{
	cohort_hvd_grad_ready(ctx, i);
}

#endif /* COHORT_MLP_STRATEGIES_H */
