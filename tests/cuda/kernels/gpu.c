/*
 * gpu.c - GPU detection and the few CUDA runtime helpers that the kernel
 * tests and benchmark need (kernels.h), in plain C.
 *
 * Every call goes through libcohort's run-time bridge to the CUDA runtime
 * (client/backend/cudart.h: libcudart dlopen()ed once, entry points by
 * name), the same one the nccl and tcp-staged backends use: one place
 * knows how to find the runtime, tells "no driver" from "no device", and
 * keeps the text of why. So this file needs no cuda_runtime.h and works
 * in a build without nvcc (the kernels then do not exist, the helpers
 * still do). The kernels themselves are launched through the runtime nvcc
 * links into fusion.cu; both runtimes share the device's primary context,
 * so memory from one is used by the other.
 *
 * This is the one place a cudaError_t of the tests becomes a
 * cohort_status (cohort__cuda_fail), keeping its text for
 * cohort__cuda_last_error().
 */
#include <stdio.h>
#include <stdlib.h>

#include "cohort_impl.h"
#include "backend/cudart.h"
#include "kernels.h"

static _Thread_local char gpu_last_error[256];

const char *
cohort__cuda_last_error(void)
{
	return (gpu_last_error);
}

cohort_status
cohort__cuda_fail(
    const char *where, int code, const char *name, const char *text)
{
	snprintf(gpu_last_error, sizeof(gpu_last_error), "%s: %s (%d): %s",
	    where != NULL ? where : "cuda", name != NULL ? name : "?", code,
	    text != NULL ? text : "");
	cohort__debug("-> COHORT_ECUDA: %s", gpu_last_error);
	return (cohort__err(COHORT_ECUDA, "%s", gpu_last_error));
}

/* The bridge's runtime, or NULL with why in gpu_reason. */
static const struct cohort__dl_cudart *
gpu_runtime(char *why, size_t len)
{
	const struct cohort__dl_cudart *cu = NULL;

	if (cohort__dl_cudart_get(&cu, why, len) != COHORT_OK)
		return (NULL);
	return (cu);
}

bool
cohort__gpu_available(void)
{
	char why[8];

	return (gpu_runtime(why, sizeof(why)) != NULL);
}

const char *
cohort__gpu_unavailable_reason(void)
{
	static char reason[512]; /* the bridge's reason is fixed once known */

	if (gpu_runtime(reason, sizeof(reason)) != NULL)
		return ("");
	return (reason);
}

/* The runtime, or COHORT_ENOTSUP naming where and why. */
static cohort_status
gpu_require(const char *where, const struct cohort__dl_cudart **cu)
{
	char why[512];

	if ((*cu = gpu_runtime(why, sizeof(why))) != NULL)
		return (COHORT_OK);
	return (cohort__err(COHORT_ENOTSUP, "%s: no GPU (%s)", where, why));
}

static cohort_status
gpu_check(const struct cohort__dl_cudart *cu, const char *where, int e)
{
	if (e == COHORT__CUDA_SUCCESS)
		return (COHORT_OK);
	return (cohort__cuda_fail(
	    where, e, cu->GetErrorName(e), cu->GetErrorString(e)));
}

cohort_status
cohort__gpu_describe(char *buf, size_t len)
{
	const struct cohort__dl_cudart *cu;
	char name[256] = "?";
	int dev = 0, sms = 0;
	size_t mfree = 0, mtotal = 0;
	cohort_status rv;

	if (buf == NULL || len == 0)
		return (cohort__err(COHORT_EINVAL, "gpu_describe: no buffer"));
	if ((rv = gpu_require("gpu_describe", &cu)) != COHORT_OK)
		return (rv);
	if ((rv = gpu_check(cu, "cudaGetDevice", cu->GetDevice(&dev)))
	    != COHORT_OK)
		return (rv);
	if (cu->GetDeviceProperties != NULL) {
		char *prop = calloc(1, COHORT__CUDA_PROP_BYTES);

		if (prop != NULL && cu->GetDeviceProperties(prop, dev) == 0)
			snprintf(name, sizeof(name), "%.255s", prop);
		free(prop);
	}
	if (cu->DeviceGetAttribute != NULL)
		(void)cu->DeviceGetAttribute(
		    &sms, COHORT__CUDA_ATTR_SM_COUNT, dev);
	if (cu->MemGetInfo != NULL)
		(void)cu->MemGetInfo(&mfree, &mtotal);
	snprintf(buf, len,
	    "%s, %d SMs, %zu MiB, driver %d.%d, runtime %d.%d (device %d)",
	    name, sms, mtotal >> 20, cu->driver_version / 1000,
	    (cu->driver_version % 1000) / 10, cu->runtime_version / 1000,
	    (cu->runtime_version % 1000) / 10, dev);
	return (COHORT_OK);
}

cohort_status
cohort__gpu_alloc(void **p, size_t bytes)
{
	const struct cohort__dl_cudart *cu;
	void *q = NULL;
	cohort_status rv;

	if (p == NULL)
		return (cohort__err(COHORT_EINVAL, "gpu_alloc: NULL p"));
	if ((rv = gpu_require("gpu_alloc", &cu)) != COHORT_OK)
		return (rv);
	rv = gpu_check(cu, "cudaMalloc", cu->Malloc(&q, bytes));
	if (rv == COHORT_OK)
		*p = q;
	return (rv);
}

void
cohort__gpu_free(void *p)
{
	const struct cohort__dl_cudart *cu;

	if (p != NULL && gpu_require("gpu_free", &cu) == COHORT_OK)
		(void)gpu_check(cu, "cudaFree", cu->Free(p));
}

/* One cudaMemcpy of kind (enum cudaMemcpyKind). */
static cohort_status
gpu_copy(const char *where, void *dst, const void *src, size_t bytes, int kind,
    void *stream, bool async)
{
	const struct cohort__dl_cudart *cu;
	cohort_status rv;

	if ((rv = gpu_require(where, &cu)) != COHORT_OK)
		return (rv);
	return (gpu_check(cu, where,
	    async ? cu->MemcpyAsync(dst, src, bytes, kind, stream)
	          : cu->Memcpy(dst, src, bytes, kind)));
}

cohort_status
cohort__gpu_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
	return (gpu_copy("cudaMemcpy(h2d)", dst, src, bytes,
	    COHORT__CUDA_MEMCPY_H2D, NULL, false));
}

cohort_status
cohort__gpu_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
	return (gpu_copy("cudaMemcpy(d2h)", dst, src, bytes,
	    COHORT__CUDA_MEMCPY_D2H, NULL, false));
}

cohort_status
cohort__gpu_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
	return (gpu_copy("cudaMemcpyAsync(d2d)", dst, src, bytes,
	    COHORT__CUDA_MEMCPY_D2D, stream, true));
}

cohort_status
cohort__gpu_memset(void *dst, int byte, size_t bytes)
{
	const struct cohort__dl_cudart *cu;
	cohort_status rv;

	if ((rv = gpu_require("gpu_memset", &cu)) != COHORT_OK)
		return (rv);
	return (gpu_check(cu, "cudaMemset", cu->Memset(dst, byte, bytes)));
}

cohort_status
cohort__gpu_sync(void)
{
	const struct cohort__dl_cudart *cu;
	cohort_status rv;

	if ((rv = gpu_require("gpu_sync", &cu)) != COHORT_OK)
		return (rv);
	return (
	    gpu_check(cu, "cudaDeviceSynchronize", cu->DeviceSynchronize()));
}
