/*
 * ddp.h - DDP-style gradient synchronisation on libcohort's public API
 * (PyTorch Lightning's DDPStrategy, torch's DistributedDataParallel).
 *
 * A model registers its parameters (value and gradient buffers, float32).
 * cohort_ddp_new broadcasts rank 0's parameters so every replica starts
 * identical, and assigns the parameters to gradient buckets in the order
 * their gradients become ready (reverse registration order by default,
 * like autograd): the first bucket holds up to first_bucket_cap_bytes
 * (1 MiB), the others up to bucket_cap_bytes (25 MiB); a parameter larger
 * than the cap gets a bucket of its own. During backward the model calls
 * cohort_ddp_grad_ready(d, i) when parameter i's gradient is final; once
 * every parameter of the next bucket is ready, its reduction starts
 * asynchronously (cohort_iallreduce through the bucket's comm hook), so
 * communication overlaps the rest of backward. cohort_ddp_sync waits for
 * every bucket (starting those that never became ready, e.g. unused
 * parameters) and leaves each gradient averaged over the group; then the
 * optimizer steps.
 *
 *   cohort_ddp_new(c, NULL, params, n, &opts, &d);   // broadcast rank 0
 *   for each step:
 *       zero grads; forward; backward (calls cohort_ddp_grad_ready);
 *       cohort_ddp_sync(d);                         // averaged grads
 *       optimizer step;
 *       cohort_ddp_after_step(d);                   // model averaging
 *
 * Gradient accumulation (block_backward_sync): between
 * cohort_ddp_no_sync_begin and cohort_ddp_no_sync_end, backward passes
 * accumulate locally and cohort_ddp_sync is a no-op; the next synced
 * backward reduces the accumulated gradient.
 *
 * Comm hooks (ddp_comm_hook) are chosen at setup: plain all-reduce
 * (default), fp16 or bf16 compression (each bucket cast to 16 bits with
 * round to nearest even, pre-divided by the group size, summed in 16 bits
 * and cast back), or a user-supplied cohort_ddp_hook.
 *
 * Post-local SGD (model_averaging_period > 0): the first
 * model_averaging_warmup optimizer steps synchronise gradients as usual;
 * after that, each rank steps on its local gradient, and
 * cohort_ddp_after_step averages the parameters every period steps
 * (period 1 is synchronous SGD).
 *
 * Threading: the calls of one cohort_ddp come from one thread at a time
 * (the training loop's); the group must not be used concurrently by other
 * threads for data-plane collectives, which would interleave with the
 * buckets' in a rank-dependent order.
 */
#ifndef COHORT_STRATEGIES_DDP_H
#define COHORT_STRATEGIES_DDP_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

#ifdef __cplusplus
extern "C" {
#endif

#define COHORT_DDP_DEFAULT_BUCKET_CAP (25u * 1024u * 1024u)
#define COHORT_DDP_DEFAULT_FIRST_BUCKET_CAP (1024u * 1024u)

typedef struct cohort_ddp cohort_ddp;

/* One parameter tensor: data and gradient hold count float32 each. The
 * memory is the caller's and must outlive the cohort_ddp. */
typedef struct cohort_ddp_param {
	const char *name; /* for messages; may be NULL */
	float *data;
	float *grad;
	size_t count;
} cohort_ddp_param;

/* What a comm hook sees of a bucket. */
typedef struct cohort_ddp_bucket {
	int index; /* 0 = the first bucket reduced in a step */
	int nbuckets;
	bool is_last;
	cohort_group *group; /* NULL in a single-process cohort_ddp */
	int world_size;
	/* The bucket's gradients packed in one buffer (count float32). The
	 * hook reduces them in place: after finish, buffer holds the
	 * averaged gradient. */
	float *buffer;
	size_t count;
	/* count * 4 bytes for the hook's own use (e.g. a 16-bit copy). */
	void *scratch;
	/* The parameters in the bucket (indices into the registered list),
	 * in buffer order. */
	const int *params;
	size_t nparams;
} cohort_ddp_bucket;

/* A communication hook. start begins the reduction of b->buffer and
 * returns its work in *work (NULL if it completed synchronously); cohort
 * waits for and frees the work. finish (may be NULL) runs afterwards, in
 * bucket order, before cohort_ddp_sync returns: e.g. casting a compressed
 * result back into b->buffer. Both return COHORT_OK or an error that
 * cohort_ddp_sync returns. */
typedef struct cohort_ddp_hook {
	const char *name;
	cohort_status (*start)(
	    void *state, cohort_ddp_bucket *b, cohort_work **work);
	cohort_status (*finish)(void *state, cohort_ddp_bucket *b);
	void *state;
} cohort_ddp_hook;

/* The built-in hooks: "allreduce" (the default; "none" is an alias),
 * "fp16", "bf16". NULL for an unknown name. */
COHORT_API const cohort_ddp_hook *cohort_ddp_hook_by_name(const char *name);

typedef struct cohort_ddp_options {
	size_t bucket_cap_bytes; /* 25 MiB */
	size_t first_bucket_cap_bytes; /* 1 MiB */
	const cohort_ddp_hook *hook; /* NULL = all-reduce (mean) */
	/* true (default): a bucket's reduction starts as soon as it is full;
	 * false: every bucket is reduced in cohort_ddp_sync, after backward
	 * (for measuring what overlap gains). */
	bool overlap;
	/* Broadcast rank 0's parameters in cohort_ddp_new (default true). */
	bool broadcast_params;
	/* Reduce a bucket in place in the gradients when its parameters'
	 * gradients are contiguous in memory (default true); otherwise
	 * gradients are copied into a bucket buffer and back. */
	bool gradient_as_bucket_view;
	/* Post-local SGD; 0 = off (default). */
	int model_averaging_period;
	int model_averaging_warmup;
	/* Order in which gradients become ready, nparams entries (NULL =
	 * reverse registration order). Buckets follow it. */
	const int *ready_order;
	/* Timeout of blocking calls (COHORT_WAIT_DEFAULT). */
	cohort_duration timeout;
} cohort_ddp_options;

COHORT_API void cohort_ddp_options_init(cohort_ddp_options *o);

/* Creates the DDP state for the parameters on group g (NULL = the world
 * group of c). c may be NULL together with g: a single process without
 * communication (world size 1). opts NULL = defaults. With
 * broadcast_params, blocks until rank 0's parameters arrived. */
COHORT_API cohort_status cohort_ddp_new(cohort_client *c, cohort_group *g,
    const cohort_ddp_param *params, size_t nparams,
    const cohort_ddp_options *opts, cohort_ddp **out);

/* Waits for in-flight buckets, frees everything (not the parameters).
 * NULL-safe. */
COHORT_API void cohort_ddp_free(cohort_ddp *d);

/* Called during backward when parameter i's gradient is final. Cheap;
 * starts bucket reductions as they fill. Errors are kept and returned by
 * cohort_ddp_sync. */
COHORT_API void cohort_ddp_grad_ready(cohort_ddp *d, int i);

/* Waits for every bucket of this backward and writes the averaged
 * gradients back; a no-op inside no_sync and during local SGD. */
COHORT_API cohort_status cohort_ddp_sync(cohort_ddp *d);

/* After the optimizer step: counts steps, averages the parameters when
 * model averaging is due. */
COHORT_API cohort_status cohort_ddp_after_step(cohort_ddp *d);

/* block_backward_sync: accumulation steps skip communication. */
COHORT_API void cohort_ddp_no_sync_begin(cohort_ddp *d);
COHORT_API void cohort_ddp_no_sync_end(cohort_ddp *d);
COHORT_API bool cohort_ddp_in_no_sync(const cohort_ddp *d);

/* Re-broadcasts the parameters from group rank root. */
COHORT_API cohort_status cohort_ddp_broadcast_params(
    cohort_ddp *d, int32_t root);

/* Averages the parameters over the group now (what model averaging
 * does). */
COHORT_API cohort_status cohort_ddp_average_params(cohort_ddp *d);

/* --- Strategy helpers with the seeds' semantics ----------------------- */

COHORT_API int32_t cohort_ddp_rank(const cohort_ddp *d);
COHORT_API int32_t cohort_ddp_world_size(const cohort_ddp *d);
COHORT_API bool cohort_ddp_is_global_zero(const cohort_ddp *d);
COHORT_API cohort_group *cohort_ddp_group(const cohort_ddp *d);

/* reduce(tensor, op): in place, on every rank; op COHORT_MEAN (the
 * default of the seeds) or COHORT_SUM (or MIN, MAX, PROD). */
COHORT_API cohort_status cohort_ddp_reduce(cohort_ddp *d, void *buf,
    size_t count, cohort_dtype dtype, cohort_redop op);
/* all_gather: recv holds world_size * count elements. */
COHORT_API cohort_status cohort_ddp_all_gather(cohort_ddp *d, const void *send,
    void *recv, size_t count, cohort_dtype dtype);
/* broadcast(obj, src): bytes from src to all; *out malloc'd on every
 * rank (free with cohort_free). */
COHORT_API cohort_status cohort_ddp_broadcast(cohort_ddp *d, const void *obj,
    size_t len, int32_t src, void **out, size_t *out_len);
COHORT_API cohort_status cohort_ddp_barrier(cohort_ddp *d, const char *name);
/* reduce_boolean_decision(decision, all). */
COHORT_API cohort_status cohort_ddp_reduce_boolean_decision(
    cohort_ddp *d, bool decision, bool all, bool *out);
/* on_exception: tells cohortd this rank failed with text, so the others
 * learn who failed and why. Call before exiting. */
COHORT_API cohort_status cohort_ddp_on_exception(
    cohort_ddp *d, const char *text);

/* --- Elastic membership (docs/elastic.md) ----------------------------- *
 *
 * In an elastic job (cohort run --nnodes MIN:MAX) a step whose gradient
 * reduction or boundary returns COHORT_EMEMBERSHIP is discarded on every
 * member: zero the gradients, call cohort_ddp_reform, re-shard the data
 * for the new rank and world size, and repeat the step. After a step
 * boundary that admitted members (cohort_boundary.changed) the client is
 * already reformed: cohort_ddp_reform then only re-binds. When the
 * boundary names a state transfer, cohort_ddp_state_transfer moves the
 * model and the caller's extra state (optimizer, step counter, data
 * position) from the sender to the new members:
 *
 *   st = cohort_ddp_sync(d);                          // EMEMBERSHIP?
 *   st = cohort_step_boundary(c, &b, timeout);        // commit point
 *   if (st == COHORT_EMEMBERSHIP) { zero grads; cohort_ddp_reform(d,
 *       &info, timeout); re-shard; repeat the step; }
 *   optimizer step; step++;
 *   if (b.changed) cohort_ddp_reform(d, &info, timeout);
 *   if (b.role != COHORT_STATE_NONE)                  // before any boundary
 *       cohort_ddp_state_transfer(d, &extra, sizeof(extra), timeout);
 *
 * A process admitted into the running job opens its client, makes its
 * cohort_ddp (broadcast_params false), calls cohort_step_boundary (RECV,
 * at once) and cohort_ddp_state_transfer, then trains. docs/strategies.md
 * has the whole loop.
 */

/* Moves d to the job's current generation: waits for and frees the
 * reductions of the step that failed (they fail at once: the group is
 * failed), forgets the step's partial buckets and its error, calls
 * cohort_client_reform (nothing to do when a boundary already reformed
 * the client), and re-reads the rank and world size from d's group (the
 * same handle, reformed: every bucket's world_size, the MEAN's divisor).
 * out (may be NULL) as cohort_client_reform's. Returns what
 * cohort_client_reform returns (COHORT_EPEERLOST: this process is no
 * longer a member, or the job fell below its minimum); COHORT_EINVAL
 * without a client. Blocks at most timeout. */
COHORT_API cohort_status cohort_ddp_reform(
    cohort_ddp *d, cohort_reform_info *out, cohort_duration timeout);

/* The state transfer the last cohort_step_boundary asked for
 * (cohort_state_transfer), of the registered parameters followed by
 * extra_len bytes at extra (the optimizer's state, counters; the same
 * length on every rank). The sender sends its own; a receiver's
 * parameters and extra are overwritten. A rank with no role returns
 * COHORT_OK at once. Returns what cohort_state_transfer returns;
 * COHORT_EPROTO when the sender's state has another size than this
 * rank's model and extra (a different model). Blocks at most timeout. */
COHORT_API cohort_status cohort_ddp_state_transfer(
    cohort_ddp *d, void *extra, size_t extra_len, cohort_duration timeout);

/* Detail of the last error of d ("" if none). */
COHORT_API const char *cohort_ddp_last_error(const cohort_ddp *d);

/* Counters since creation (or the last reset). */
typedef struct cohort_ddp_stats {
	uint64_t steps; /* cohort_ddp_after_step calls */
	uint64_t synced; /* cohort_ddp_sync that communicated */
	uint64_t buckets_started;
	uint64_t buckets_overlapped; /* started before cohort_ddp_sync */
	uint64_t bytes; /* gradient bytes reduced (float32) */
	double wait_seconds; /* time blocked in cohort_ddp_sync */
	double averaging_seconds;
	int nbuckets;
	size_t bucket_count[64]; /* elements of the first 64 buckets */
	bool bucket_view[64]; /* reduced in place in the gradients */
} cohort_ddp_stats;

COHORT_API void cohort_ddp_get_stats(const cohort_ddp *d, cohort_ddp_stats *s);
COHORT_API void cohort_ddp_reset_stats(cohort_ddp *d);

/* 16-bit conversions used by the hooks (round to nearest even; NaN stays
 * NaN, overflow goes to infinity). */
COHORT_API uint16_t cohort_ddp_f32_to_f16(float f);
COHORT_API float cohort_ddp_f16_to_f32(uint16_t h);
COHORT_API uint16_t cohort_ddp_f32_to_bf16(float f);
COHORT_API float cohort_ddp_bf16_to_f32(uint16_t h);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_STRATEGIES_DDP_H */
