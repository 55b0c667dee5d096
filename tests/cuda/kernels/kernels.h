/*
 * kernels.h - CUDA kernels (bucket pack/unpack, scale, casts, reduce2),
 * their host launchers and their CPU references, kept beside their tests
 * (tests/cuda/test_kernels.c, tests/bin/cuda_bench.c): libcohort does not
 * call them. They form libcohort_cuda.a (Makefile).
 *
 * Three families of functions share one shape:
 *
 *   cohort__cuda_<kernel>(args..., void *stream)  fusion.cu (nvcc only)
 *   cohort__ref_<kernel>(args...)                 ref.c (always built)
 *   cohort__gpu_<verb>(...)                       gpu.c (always built)
 *
 * The launchers are C-callable, take a cudaStream_t as `void *stream` (NULL
 * is the legacy default stream) so that this header needs no
 * cuda_runtime.h, and only enqueue work: they return before the stream ran
 * it, and every buffer they are given is borrowed until the stream reaches
 * that point. Argument errors give COHORT_EINVAL (or COHORT_ENOTSUP for a
 * valid but unsupported type combination) before anything is enqueued,
 * with the same rules as the reference, which validates through the same
 * cohort__kernel_check_* functions. A failed launch gives COHORT_ECUDA;
 * cohort__cuda_last_error() (and cohort_last_error()) then hold the CUDA
 * error's name and text. Without nvcc the launchers do not exist:
 * callers test COHORT_HAVE_CUDA, or cohort__gpu_available() at run time.
 *
 * Numerics (the references define them, the kernels match them):
 *  - f16/bf16 arithmetic is done in f32 and rounded once to the storage
 *    type, round to nearest even; so kernels and references agree bit for
 *    bit on every non-NaN value, subnormals included. NaN stays NaN (its
 *    payload may differ).
 *  - Integer sum and product wrap modulo 2^bits (no undefined behaviour).
 *  - min/max propagate NaN: if either operand is NaN the result is NaN.
 *    min(-0, +0) is the first operand (dst).
 *
 * References: llm.c dev/cuda (kernel + CPU reference + validate_result),
 * NCCL src/device/reduce_kernel.h (the per-type reduction functors),
 * PyTorch torch/csrc/distributed/c10d/reducer.cpp (gradient buckets).
 */
#ifndef COHORT_CUDA_KERNELS_H
#define COHORT_CUDA_KERNELS_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"
#include "half.h"

#ifdef __CUDACC__
#define COHORT__HD __host__ __device__
#else
#define COHORT__HD
#endif

#ifdef __cplusplus
extern "C" {
#endif

/* ------------------------------------------------------------------------ */
/* Bucket pack / unpack                                                     */
/* ------------------------------------------------------------------------ */

/* One tensor of a bucket. ptr is the tensor's memory (device memory for the
 * cohort__cuda_ functions, host memory for the references); bytes is its
 * element count times cohort_dtype_size(); offset is where it lives in the
 * bucket. Items may come in any order and leave gaps, which pack never
 * writes; they must not overlap each other or the bucket. Items with bytes
 * == 0 are ignored (their ptr may be NULL). */
struct cohort__pack_item {
	void *ptr;
	size_t offset;
	size_t bytes;
};

/* Lays items[0..n) out back to back in that order, each offset rounded up
 * to align (a power of two; 16 or more lets the kernels use 16-byte
 * accesses on 16-byte aligned tensors). Writes every items[i].offset and
 * returns the bucket size needed, rounded up to align; 0 for bad arguments
 * or overflow. */
size_t cohort__pack_layout(
    struct cohort__pack_item *items, size_t n, size_t align);

/* pack copies every item into the bucket at its offset; unpack copies each
 * item's bucket range back into the item. One kernel launch copies up to
 * COHORT__COPY_BATCH items (so 1 launch for a typical bucket).
 * COHORT_EINVAL: bucket NULL, items NULL with n > 0, or an item with bytes
 * > 0 and a NULL ptr or an offset + bytes that overflows. */
cohort_status cohort__ref_pack(
    void *bucket, const struct cohort__pack_item *items, size_t n);
cohort_status cohort__ref_unpack(
    const void *bucket, const struct cohort__pack_item *items, size_t n);
cohort_status cohort__cuda_pack(void *bucket,
    const struct cohort__pack_item *items, size_t n, void *stream);
cohort_status cohort__cuda_unpack(const void *bucket,
    const struct cohort__pack_item *items, size_t n, void *stream);

/* ------------------------------------------------------------------------ */
/* The batched copy behind pack/unpack. It is declared here, with its index */
/* arithmetic as inline functions, so that the host tests run the very code */
/* the kernel runs (cohort__copy_emulate).                                  */
/* ------------------------------------------------------------------------ */

/* A copy is cut into chunks of COHORT__COPY_CHUNK bytes; one thread block
 * copies one chunk (8 KiB = 256 threads x 2 x 16 bytes). The table travels
 * as a kernel parameter (under the 4 KiB parameter limit), so a launch
 * needs no device allocation and no host-to-device copy. */
#define COHORT__COPY_CHUNK ((uint64_t)8192)
#define COHORT__COPY_BATCH 120
#define COHORT__COPY_THREADS 256

struct cohort__copy_desc {
	uint64_t src; /* address */
	uint64_t dst; /* address */
	uint64_t bytes; /* > 0 */
	uint64_t chunk0; /* index of this copy's first chunk in the batch */
};

struct cohort__copy_batch {
	uint32_t n; /* descriptors used, 1..COHORT__COPY_BATCH */
	uint32_t pad;
	uint64_t nchunks; /* chunks of all descriptors together */
	struct cohort__copy_desc d[COHORT__COPY_BATCH];
};

/* Fills *b from the first items of items[0..n) (pack: tensor to bucket,
 * else bucket to tensor), skipping empty ones, until the batch is full.
 * Returns how many items it consumed (n when all fit); b->n is 0 when
 * those were all empty. Arguments must have been validated. */
size_t cohort__copy_plan(struct cohort__copy_batch *b,
    const struct cohort__pack_item *items, size_t n, uintptr_t bucket,
    bool pack);

/* Runs batch b on the host exactly as the kernel partitions it: chunk by
 * chunk, through cohort__copy_find and cohort__copy_split. */
void cohort__copy_emulate(const struct cohort__copy_batch *b);

/* The descriptor that owns chunk c (c < b->nchunks): the last i with
 * d[i].chunk0 <= c. chunk0 strictly increases, every copy being non-empty.
 */
static inline COHORT__HD uint32_t
cohort__copy_find(const struct cohort__copy_batch *b, uint64_t c)
{
	uint32_t lo = 0;
	uint32_t hi = b->n - 1;

	while (lo < hi) {
		uint32_t mid = lo + (hi - lo + 1) / 2;
		if (b->d[mid].chunk0 <= c)
			lo = mid;
		else
			hi = mid - 1;
	}
	return (lo);
}

/* The byte range [*off, *off + *len) of descriptor i that chunk c covers. */
static inline COHORT__HD void
cohort__copy_range(const struct cohort__copy_batch *b, uint32_t i, uint64_t c,
    uint64_t *off, uint64_t *len)
{
	uint64_t o = (c - b->d[i].chunk0) * COHORT__COPY_CHUNK;
	uint64_t left = b->d[i].bytes - o;

	*off = o;
	*len = left < COHORT__COPY_CHUNK ? left : COHORT__COPY_CHUNK;
}

/* Splits a copy of len bytes from src to dst into a head copied byte by
 * byte, *nvec accesses of *width bytes each (16 when src and dst agree
 * modulo 16, else 4 when they agree modulo 4, else 1) that are aligned on
 * both sides, and a byte-wise tail of len - head - nvec * width bytes. */
static inline COHORT__HD void
cohort__copy_split(uint64_t src, uint64_t dst, uint64_t len, uint32_t *width,
    uint64_t *head, uint64_t *nvec)
{
	uint64_t diff = src ^ dst;
	uint32_t w = (diff & 15) == 0 ? 16 : ((diff & 3) == 0 ? 4 : 1);
	uint64_t h = (w - (src & (w - 1))) & (w - 1);

	if (h > len)
		h = len;
	*width = w;
	*head = h;
	*nvec = (len - h) / w;
}

/* ------------------------------------------------------------------------ */
/* scale: x[i] *= alpha                                                     */
/* ------------------------------------------------------------------------ */

/* For F32, F64, F16 and BF16 (averaging: alpha = 1.0 / group size). F64
 * multiplies by alpha, the others by (float) alpha in f32, f16/bf16 then
 * rounding back. COHORT_EINVAL: x NULL with count > 0, or another dtype. */
cohort_status cohort__ref_scale(
    void *x, size_t count, cohort_dtype dt, double alpha);
cohort_status cohort__cuda_scale(
    void *x, size_t count, cohort_dtype dt, double alpha, void *stream);

/* ------------------------------------------------------------------------ */
/* Casts for compressed communication                                       */
/* ------------------------------------------------------------------------ */

/* Scalar conversions, round to nearest even, overflow to infinity, NaN to
 * a quiet NaN of the same sign. f16 and bf16 travel as their bit patterns.
 * Defined once, inline, in common/half.h (the CPU reductions and these
 * references share them); tests/cuda checks them. */

/* dst[i] = (ddt) src[i] for the pairs F32->F16, F16->F32, F32->BF16 and
 * BF16->F32. COHORT_EINVAL: a NULL buffer with count > 0 or an invalid
 * dtype; COHORT_ENOTSUP: any other pair of valid dtypes. src and dst must
 * not overlap. */
cohort_status cohort__ref_cast(void *dst, cohort_dtype ddt, const void *src,
    cohort_dtype sdt, size_t count);
cohort_status cohort__cuda_cast(void *dst, cohort_dtype ddt, const void *src,
    cohort_dtype sdt, size_t count, void *stream);

/* ------------------------------------------------------------------------ */
/* reduce2: dst[i] = dst[i] op src[i]                                       */
/* ------------------------------------------------------------------------ */

/* Every dtype with SUM, PROD, MIN and MAX (see the numerics above).
 * COHORT_EINVAL: a NULL buffer with count > 0, an invalid dtype, or an op
 * other than those four (MEAN is SUM followed by cohort__*_scale). */
cohort_status cohort__ref_reduce2(void *dst, const void *src, size_t count,
    cohort_dtype dt, cohort_redop op);
cohort_status cohort__cuda_reduce2(void *dst, const void *src, size_t count,
    cohort_dtype dt, cohort_redop op, void *stream);

/* Compares n elements of dt, got against want, like llm.c's
 * validate_result: element i matches when both are NaN, or
 * |got - want| <= eps * |want| + the smallest normal of dt (eps 0 asks
 * for equality; integers are compared exactly). Prints the first `report`
 * mismatches to stderr as "what[i]: got G, want W". Returns the number of
 * mismatches; *max_rel (if not NULL) gets the largest
 * |got - want| / max(|want|, smallest normal) over finite pairs. */
size_t cohort__ref_compare(const char *what, cohort_dtype dt, const void *got,
    const void *want, size_t n, double eps, size_t report, double *max_rel);

/* Argument rules shared by the references and the launchers; each returns
 * COHORT_OK or the status the call must return (with the detail set). */
cohort_status cohort__kernel_check_pack(
    const void *bucket, const struct cohort__pack_item *items, size_t n);
cohort_status cohort__kernel_check_scale(
    const void *x, size_t count, cohort_dtype dt);
cohort_status cohort__kernel_check_cast(const void *dst, cohort_dtype ddt,
    const void *src, cohort_dtype sdt, size_t count);
cohort_status cohort__kernel_check_reduce2(const void *dst, const void *src,
    size_t count, cohort_dtype dt, cohort_redop op);

/* ------------------------------------------------------------------------ */
/* GPU runtime helpers (gpu.c): plain C over libcohort's run-time CUDA     */
/* bridge (client/backend/cudart.h); COHORT_ENOTSUP without a usable GPU.   */
/* ------------------------------------------------------------------------ */

/* true when this process can use a CUDA device: the build has CUDA, a
 * driver is loaded and at least one device is visible. The answer is
 * computed once per process. It initialises the CUDA driver, so call it in
 * the process that will use the GPU, never before a fork() whose child
 * uses CUDA. */
bool cohort__gpu_available(void);
/* Why cohort__gpu_available() is false ("built without CUDA", "no CUDA
 * device", "cudaErrorInsufficientDriver: ..."); "" when it is true. */
const char *cohort__gpu_unavailable_reason(void);
/* Writes "NAME, N SMs, M MiB, driver X, runtime Y" into buf. */
cohort_status cohort__gpu_describe(char *buf, size_t len);

/* Device memory; *p written only on success. gpu_free is NULL-safe. */
cohort_status cohort__gpu_alloc(void **p, size_t bytes);
void cohort__gpu_free(void *p);
/* Synchronous copies between host and device memory. */
cohort_status cohort__gpu_memcpy_h2d(void *dst, const void *src, size_t bytes);
cohort_status cohort__gpu_memcpy_d2h(void *dst, const void *src, size_t bytes);
/* Enqueues a device-to-device copy on stream (the benchmark's baseline). */
cohort_status cohort__gpu_memcpy_d2d(
    void *dst, const void *src, size_t bytes, void *stream);
cohort_status cohort__gpu_memset(void *dst, int byte, size_t bytes);
/* Waits for all work on the current device; reports asynchronous kernel
 * faults as COHORT_ECUDA. */
cohort_status cohort__gpu_sync(void);

/* Text of the last CUDA error seen on this thread ("" if none): where,
 * the cudaError_t name and its description. */
const char *cohort__cuda_last_error(void);
/* Records a CUDA error (code is a cudaError_t) for cohort__cuda_last_error
 * and cohort_last_error, and returns COHORT_ECUDA. The one conversion of
 * cudaError_t to cohort_status; used by fusion.cu and gpu.c. */
cohort_status cohort__cuda_fail(
    const char *where, int code, const char *name, const char *text);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_CUDA_KERNELS_H */
