/*
 * fusion.cu - the CUDA kernels and their launchers (kernels.h). They live
 * beside their tests: libcohort does not call them (the nccl backend
 * reduces in NCCL; docs/gpu.md); the GPU tests and cuda_bench do.
 *
 *  - copy_batch: pack/unpack of a gradient bucket. One launch copies up to
 *    COHORT__COPY_BATCH tensors; the table is a __grid_constant__ kernel
 *    parameter. The work is cut into 8 KiB chunks, one per thread block;
 *    each block finds its tensor with a binary search over the chunk
 *    prefix (the same inline code the host tests run) and copies with
 *    16-byte accesses when source and destination agree modulo 16, two
 *    loads in flight per thread. Equal-size chunks keep the blocks
 *    balanced however uneven the tensors are.
 *  - scale, cast, reduce2: grid-stride element-wise loops; f16/bf16
 *    arithmetic is done in f32 and rounded once, as in ref.c.
 *
 * The launchers validate with the reference's rules, enqueue, and convert a
 * launch error once through cohort__cuda_fail.
 *
 * References: llm.c dev/cuda (kernel + reference + validate_result),
 * NCCL src/device/reduce_kernel.h, PyTorch c10d reducer.cpp (buckets),
 * CUDA C++ Programming Guide, "__grid_constant__".
 */
#include <cuda_bf16.h>
#include <cuda_fp16.h>
#include <cuda_runtime.h>

#include <stdio.h>

#include "kernels.h"

namespace
{

const unsigned THREADS = COHORT__COPY_THREADS;
/* Cap of the element-wise grids; a grid-stride loop covers the rest. */
const unsigned MAX_BLOCKS = 8192;

cohort_status
launch_check(const char *where)
{
	cudaError_t e = cudaGetLastError();

	if (e == cudaSuccess)
		return (COHORT_OK);
	return (cohort__cuda_fail(
	    where, (int)e, cudaGetErrorName(e), cudaGetErrorString(e)));
}

unsigned
grid_for(size_t count)
{
	size_t blocks = (count + THREADS - 1) / THREADS;

	return ((unsigned)(blocks < MAX_BLOCKS ? blocks : MAX_BLOCKS));
}

/* ---------------------------------------------------------------------- */
/* Batched copy                                                           */
/* ---------------------------------------------------------------------- */

/* Copies nvec aligned V-sized units, two in flight per thread. The source
 * is read-only for the kernel's lifetime (items must not overlap). */
template <typename V>
__device__ __forceinline__ void
copy_body(char *dst, const char *src, uint64_t nvec)
{
	const V *s = reinterpret_cast<const V *>(src);
	V *d = reinterpret_cast<V *>(dst);
	uint64_t k = threadIdx.x;

	for (; k + blockDim.x < nvec; k += 2 * (uint64_t)blockDim.x) {
		V v0 = __ldg(s + k);
		V v1 = __ldg(s + k + blockDim.x);
		__stcg(d + k, v0);
		__stcg(d + k + blockDim.x, v1);
	}
	for (; k < nvec; k += blockDim.x)
		__stcg(d + k, __ldg(s + k));
}

__global__ void
__launch_bounds__(COHORT__COPY_THREADS)
    copy_batch_kernel(const __grid_constant__ struct cohort__copy_batch b)
{
	for (uint64_t c = blockIdx.x; c < b.nchunks; c += gridDim.x) {
		uint32_t i = cohort__copy_find(&b, c);
		const struct cohort__copy_desc *dsc = &b.d[i];
		uint64_t off;
		uint64_t len;
		uint32_t w;
		uint64_t head;
		uint64_t nvec;

		cohort__copy_range(&b, i, c, &off, &len);
		const char *src
		    = reinterpret_cast<const char *>(dsc->src + off);
		char *dst = reinterpret_cast<char *>(dsc->dst + off);
		cohort__copy_split(
		    dsc->src + off, dsc->dst + off, len, &w, &head, &nvec);
		uint64_t body = nvec * w;
		uint64_t tail = len - head - body;

		if (threadIdx.x < head)
			dst[threadIdx.x] = src[threadIdx.x];
		if (w == 16)
			copy_body<uint4>(dst + head, src + head, nvec);
		else if (w == 4)
			copy_body<uint32_t>(dst + head, src + head, nvec);
		else
			copy_body<uint8_t>(dst + head, src + head, nvec);
		if (threadIdx.x < tail)
			dst[head + body + threadIdx.x]
			    = src[head + body + threadIdx.x];
	}
}

/* pack: the items into the bucket; else back out of it. */
cohort_status
copy_items(const void *bucket, const struct cohort__pack_item *items, size_t n,
    bool pack, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	cohort_status rv = cohort__kernel_check_pack(bucket, items, n);
	struct cohort__copy_batch b;
	size_t done = 0;

	while (rv == COHORT_OK && done < n) {
		done += cohort__copy_plan(
		    &b, items + done, n - done, (uintptr_t)bucket, pack);
		if (b.n == 0)
			continue;
		/* At most 2^31 - 1 blocks; the kernel loops past that. */
		unsigned grid
		    = (unsigned)(b.nchunks < 0x7fffffffu ? b.nchunks
		                                         : 0x7fffffffu);
		copy_batch_kernel<<<grid, THREADS, 0, st>>>(b);
		rv = launch_check(pack ? "pack kernel" : "unpack kernel");
	}
	return (rv);
}

/* ---------------------------------------------------------------------- */
/* Element types: storage type S, computed in type C                      */
/* ---------------------------------------------------------------------- */

/* Stored as computed. */
template <typename T> struct plain_t {
	typedef T S;
	typedef T C;
	static __device__ __forceinline__ C load(S x) { return (x); }
	static __device__ __forceinline__ S store(C x) { return (x); }
};

typedef plain_t<float> f32_t;
typedef plain_t<double> f64_t;

struct f16_t {
	typedef uint16_t S;
	typedef float C;
	static __device__ __forceinline__ C load(S x)
	{
		return (__half2float(__ushort_as_half(x)));
	}
	static __device__ __forceinline__ S store(C x)
	{
		return (__half_as_ushort(__float2half_rn(x)));
	}
};

struct bf16_t {
	typedef uint16_t S;
	typedef float C;
	static __device__ __forceinline__ C load(S x)
	{
		return (__bfloat162float(__ushort_as_bfloat16(x)));
	}
	static __device__ __forceinline__ S store(C x)
	{
		return (__bfloat16_as_ushort(__float2bfloat16_rn(x)));
	}
};

/* Integers: W is the unsigned type sum and product wrap in. */
template <typename T, typename W> struct int_t : plain_t<T> {
	typedef W Wrap;
};

/* ---------------------------------------------------------------------- */
/* scale                                                                  */
/* ---------------------------------------------------------------------- */

template <typename T, typename A>
__global__ void
scale_kernel(typename T::S *x, size_t count, A alpha)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < count; i += stride)
		x[i] = T::store(T::load(x[i]) * alpha);
}

/* ---------------------------------------------------------------------- */
/* cast                                                                   */
/* ---------------------------------------------------------------------- */

template <typename From, typename To>
__global__ void
cast_kernel(typename To::S *dst, const typename From::S *src, size_t count)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < count; i += stride)
		dst[i] = To::store(From::load(src[i]));
}

/* ---------------------------------------------------------------------- */
/* reduce2                                                                */
/* ---------------------------------------------------------------------- */

/* NaN-propagating min (Max: max), first operand on ties (ref.c
 * ref_pick). */
template <bool Max, typename C>
__device__ __forceinline__ C
op_pick(C a, C b)
{
	if (isnan(a))
		return (a);
	if (isnan(b))
		return (b);
	return ((Max ? b > a : b < a) ? b : a);
}

template <typename T> struct float_ops {
	typedef typename T::C C;
	static __device__ __forceinline__ C sum(C a, C b) { return (a + b); }
	static __device__ __forceinline__ C prod(C a, C b) { return (a * b); }
	static __device__ __forceinline__ C min(C a, C b)
	{
		return (op_pick<false>(a, b));
	}
	static __device__ __forceinline__ C max(C a, C b)
	{
		return (op_pick<true>(a, b));
	}
};

template <typename T> struct int_ops {
	typedef typename T::C C;
	typedef typename T::Wrap W;
	static __device__ __forceinline__ C sum(C a, C b)
	{
		return ((C)(W)((W)a + (W)b));
	}
	static __device__ __forceinline__ C prod(C a, C b)
	{
		return ((C)(W)((W)a * (W)b));
	}
	static __device__ __forceinline__ C min(C a, C b)
	{
		return (b < a ? b : a);
	}
	static __device__ __forceinline__ C max(C a, C b)
	{
		return (b > a ? b : a);
	}
};

template <typename T, typename Ops, int OP>
__global__ void
reduce2_kernel(typename T::S *dst, const typename T::S *src, size_t count)
{
	size_t stride = (size_t)gridDim.x * blockDim.x;

	for (size_t i = (size_t)blockIdx.x * blockDim.x + threadIdx.x;
	     i < count; i += stride) {
		typename T::C a = T::load(dst[i]);
		typename T::C b = T::load(src[i]);
		typename T::C r;
		if (OP == COHORT_SUM)
			r = Ops::sum(a, b);
		else if (OP == COHORT_PROD)
			r = Ops::prod(a, b);
		else if (OP == COHORT_MIN)
			r = Ops::min(a, b);
		else
			r = Ops::max(a, b);
		dst[i] = T::store(r);
	}
}

template <typename T, typename Ops>
cohort_status
reduce2_launch(void *dst, const void *src, size_t count, cohort_redop op,
    cudaStream_t stream)
{
	typedef typename T::S S;
	S *d = static_cast<S *>(dst);
	const S *s = static_cast<const S *>(src);
	unsigned grid = grid_for(count);

	switch (op) {
	case COHORT_SUM:
		reduce2_kernel<T, Ops, COHORT_SUM>
		    <<<grid, THREADS, 0, stream>>>(d, s, count);
		break;
	case COHORT_PROD:
		reduce2_kernel<T, Ops, COHORT_PROD>
		    <<<grid, THREADS, 0, stream>>>(d, s, count);
		break;
	case COHORT_MIN:
		reduce2_kernel<T, Ops, COHORT_MIN>
		    <<<grid, THREADS, 0, stream>>>(d, s, count);
		break;
	default:
		reduce2_kernel<T, Ops, COHORT_MAX>
		    <<<grid, THREADS, 0, stream>>>(d, s, count);
		break;
	}
	return (launch_check("reduce2 kernel"));
}

} // namespace

/* ------------------------------------------------------------------------ */
/* Launchers                                                                */
/* ------------------------------------------------------------------------ */

extern "C" cohort_status
cohort__cuda_pack(void *bucket, const struct cohort__pack_item *items,
    size_t n, void *stream)
{
	return (copy_items(bucket, items, n, true, stream));
}

extern "C" cohort_status
cohort__cuda_unpack(const void *bucket, const struct cohort__pack_item *items,
    size_t n, void *stream)
{
	return (copy_items(bucket, items, n, false, stream));
}

extern "C" cohort_status
cohort__cuda_scale(
    void *x, size_t count, cohort_dtype dt, double alpha, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	cohort_status rv = cohort__kernel_check_scale(x, count, dt);
	unsigned grid = grid_for(count);

	if (rv != COHORT_OK || count == 0)
		return (rv);
	switch (dt) {
	case COHORT_F32:
		scale_kernel<f32_t, float><<<grid, THREADS, 0, st>>>(
		    static_cast<float *>(x), count, (float)alpha);
		break;
	case COHORT_F64:
		scale_kernel<f64_t, double><<<grid, THREADS, 0, st>>>(
		    static_cast<double *>(x), count, alpha);
		break;
	case COHORT_F16:
		scale_kernel<f16_t, float><<<grid, THREADS, 0, st>>>(
		    static_cast<uint16_t *>(x), count, (float)alpha);
		break;
	default: /* COHORT_BF16 */
		scale_kernel<bf16_t, float><<<grid, THREADS, 0, st>>>(
		    static_cast<uint16_t *>(x), count, (float)alpha);
		break;
	}
	return (launch_check("scale kernel"));
}

extern "C" cohort_status
cohort__cuda_cast(void *dst, cohort_dtype ddt, const void *src,
    cohort_dtype sdt, size_t count, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	cohort_status rv
	    = cohort__kernel_check_cast(dst, ddt, src, sdt, count);
	unsigned grid = grid_for(count);
	uint16_t *h = static_cast<uint16_t *>(dst);
	float *f = static_cast<float *>(dst);
	const float *fs = static_cast<const float *>(src);
	const uint16_t *hs = static_cast<const uint16_t *>(src);

	if (rv != COHORT_OK || count == 0)
		return (rv);
	if (sdt == COHORT_F32 && ddt == COHORT_F16)
		cast_kernel<f32_t, f16_t>
		    <<<grid, THREADS, 0, st>>>(h, fs, count);
	else if (sdt == COHORT_F32)
		cast_kernel<f32_t, bf16_t>
		    <<<grid, THREADS, 0, st>>>(h, fs, count);
	else if (sdt == COHORT_F16)
		cast_kernel<f16_t, f32_t>
		    <<<grid, THREADS, 0, st>>>(f, hs, count);
	else
		cast_kernel<bf16_t, f32_t>
		    <<<grid, THREADS, 0, st>>>(f, hs, count);
	return (launch_check("cast kernel"));
}

extern "C" cohort_status
cohort__cuda_reduce2(void *dst, const void *src, size_t count, cohort_dtype dt,
    cohort_redop op, void *stream)
{
	cudaStream_t st = static_cast<cudaStream_t>(stream);
	cohort_status rv
	    = cohort__kernel_check_reduce2(dst, src, count, dt, op);

	if (rv != COHORT_OK || count == 0)
		return (rv);
	switch (dt) {
	case COHORT_F32:
		return (reduce2_launch<f32_t, float_ops<f32_t>>(
		    dst, src, count, op, st));
	case COHORT_F64:
		return (reduce2_launch<f64_t, float_ops<f64_t>>(
		    dst, src, count, op, st));
	case COHORT_F16:
		return (reduce2_launch<f16_t, float_ops<f16_t>>(
		    dst, src, count, op, st));
	case COHORT_BF16:
		return (reduce2_launch<bf16_t, float_ops<bf16_t>>(
		    dst, src, count, op, st));
	case COHORT_I32: {
		typedef int_t<int32_t, uint32_t> T;
		return (
		    reduce2_launch<T, int_ops<T>>(dst, src, count, op, st));
	}
	case COHORT_I64: {
		typedef int_t<int64_t, uint64_t> T;
		return (
		    reduce2_launch<T, int_ops<T>>(dst, src, count, op, st));
	}
	default: { /* COHORT_U8 */
		typedef int_t<uint8_t, uint32_t> T;
		return (
		    reduce2_launch<T, int_ops<T>>(dst, src, count, op, st));
	}
	}
}
