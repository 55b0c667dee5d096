/*
 * hvd.h - Horovod-style named asynchronous collectives on libcohort's
 * public API (PyTorch Lightning's HorovodStrategy).
 *
 * Any thread submits a named all-reduce, all-gather or broadcast and gets
 * a handle; a background cycle thread per cohort_hvd negotiates which
 * names every rank has submitted, fuses the ready all-reduces of the same
 * dtype and op into one buffer up to the fusion threshold (64 MiB) and
 * reduces them with one collective, in the same order on every rank.
 * cohort_hvd_synchronize(handle) waits for one.
 *
 * Negotiation (every cycle, on a subgroup of its own so it never
 * interleaves with the caller's collectives): each rank's new submissions
 * (name, kind, dtype, op, count, root) are exchanged with an all-gather
 * of their sizes and, if any, an all-gatherv of the bytes over the data
 * plane; every rank then holds the same table of announced names, in the
 * same order, and executes the ones all ranks announced. An idle cycle
 * costs one 8-byte all-gather; the thread sleeps cycle_time_ms (2) while
 * anything is in flight, up to idle_cycle_ms (20) when idle, and wakes at
 * once on a local submission.
 *
 * Stall check: a name that some ranks submitted and others did not for
 * longer than stall_check_ms is reported (rank 0 logs it on stderr; any
 * rank can read cohort_hvd_stall_report) with the ranks that are missing.
 *
 * Gradient synchronisation (DistributedOptimizer): register the model's
 * parameters, call cohort_hvd_grad_ready from backward; every
 * backward_passes_per_step-th pass of a parameter submits its gradient's
 * all-reduce (mean over ranks), so gradient accumulation is handled here;
 * cohort_hvd_step_sync tells whether this pass completes an optimizer
 * step and, if so, waits until every gradient is averaged.
 */
#ifndef COHORT_STRATEGIES_HVD_H
#define COHORT_STRATEGIES_HVD_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "ddp.h" /* cohort_ddp_param */

#ifdef __cplusplus
extern "C" {
#endif

#define COHORT_HVD_DEFAULT_FUSION (64u * 1024u * 1024u)

typedef struct cohort_hvd cohort_hvd;
typedef struct cohort_hvd_handle cohort_hvd_handle;

typedef struct cohort_hvd_options {
	size_t fusion_threshold_bytes; /* 64 MiB; 0 = no fusion */
	int cycle_time_ms; /* 2 */
	int idle_cycle_ms; /* 20 */
	int64_t stall_check_ms; /* 60000; <= 0 = off */
	int backward_passes_per_step; /* 1 */
	/* Name of the subgroup cohort_hvd_new creates ("cohort-hvd"). */
	const char *group_name;
	/* Timeout of blocking calls (group creation, each collective). */
	cohort_duration timeout;
} cohort_hvd_options;

COHORT_API void cohort_hvd_options_init(cohort_hvd_options *o);

/* Creates the negotiation subgroup (all ranks of c's job; every rank must
 * call this) and starts the cycle thread. */
COHORT_API cohort_status cohort_hvd_new(
    cohort_client *c, const cohort_hvd_options *opts, cohort_hvd **out);

/* Stops after every rank called it (pending work is finished or failed
 * with COHORT_ECLOSED), joins the thread, frees everything. Handles not
 * yet released become invalid. NULL-safe. */
COHORT_API void cohort_hvd_free(cohort_hvd *h);

COHORT_API int32_t cohort_hvd_rank(const cohort_hvd *h);
COHORT_API int32_t cohort_hvd_size(const cohort_hvd *h);

/* Named asynchronous collectives. name: non-empty, at most 255 bytes,
 * unique among this rank's in-flight submissions (else COHORT_EEXIST).
 * Buffers must stay valid until the handle completes. */
COHORT_API cohort_status cohort_hvd_allreduce_async(cohort_hvd *h,
    const char *name, const void *send, void *recv, size_t count,
    cohort_dtype dtype, cohort_redop op, cohort_hvd_handle **out);
/* Ranks may contribute different counts; the result (every rank's block
 * in rank order) is allocated by cohort_hvd: see cohort_hvd_output. */
COHORT_API cohort_status cohort_hvd_allgather_async(cohort_hvd *h,
    const char *name, const void *send, size_t count, cohort_dtype dtype,
    cohort_hvd_handle **out);
COHORT_API cohort_status cohort_hvd_broadcast_async(cohort_hvd *h,
    const char *name, void *buf, size_t count, cohort_dtype dtype,
    int32_t root, cohort_hvd_handle **out);

/* true once the handle completed (successfully or not). */
COHORT_API bool cohort_hvd_poll(cohort_hvd_handle *hd);
/* Waits: COHORT_OK, the operation's error, or COHORT_ETIMEDOUT. */
COHORT_API cohort_status cohort_hvd_wait(
    cohort_hvd_handle *hd, cohort_duration timeout);
/* After completion: the all-gather result (owned by the handle until
 * release; element count in *count). */
COHORT_API cohort_status cohort_hvd_output(
    cohort_hvd_handle *hd, const void **data, size_t *count);
/* Frees the handle (if not done yet, it is freed on completion). */
COHORT_API void cohort_hvd_release(cohort_hvd_handle *hd);
/* wait + release. */
COHORT_API cohort_status cohort_hvd_synchronize(
    cohort_hvd_handle *hd, cohort_duration timeout);

/* Text of the current stalls ("" if none): one line per name, naming the
 * ranks that submitted it and those missing. Returns the length needed
 * (like snprintf). */
COHORT_API size_t cohort_hvd_stall_report(
    cohort_hvd *h, char *buf, size_t len);

/* Detail of the last error ("" if none). */
COHORT_API const char *cohort_hvd_last_error(cohort_hvd *h);

typedef struct cohort_hvd_stats {
	uint64_t cycles; /* negotiation cycles */
	uint64_t idle_cycles; /* cycles with nothing announced */
	uint64_t tensors; /* completed submissions */
	uint64_t allreduce_calls; /* collectives issued for all-reduces */
	uint64_t fused_tensors; /* all-reduces that shared a collective */
	uint64_t bytes;
} cohort_hvd_stats;

COHORT_API void cohort_hvd_get_stats(cohort_hvd *h, cohort_hvd_stats *s);

/* --- Gradient synchronisation ----------------------------------------- */

/* Registers the parameters (once). Names: "grad.<i>.<name>". */
COHORT_API cohort_status cohort_hvd_register_params(
    cohort_hvd *h, const cohort_ddp_param *params, size_t nparams);
/* Broadcasts the registered parameters from root (blocking). */
COHORT_API cohort_status cohort_hvd_broadcast_parameters(
    cohort_hvd *h, int32_t root);
/* From backward: parameter i's gradient is final for this pass. */
COHORT_API void cohort_hvd_grad_ready(cohort_hvd *h, int i);
/* After each backward pass: *do_step = whether this pass completes
 * backward_passes_per_step passes; if so, every gradient has been
 * averaged over the ranks when this returns (parameters that had no
 * gradient this step are submitted now). */
COHORT_API cohort_status cohort_hvd_step_sync(cohort_hvd *h, bool *do_step);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_STRATEGIES_HVD_H */
