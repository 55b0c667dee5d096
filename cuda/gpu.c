/*
 * gpu.c - GPU detection and the few CUDA runtime helpers that tests and
 * benchmarks written in plain C need (kernels.h).
 *
 * Built everywhere with the C compiler. With COHORT_HAVE_CUDA it calls the
 * runtime through the cohort__cudart_* shim in fusion.cu (compiled by nvcc
 * and linked with cudart_static whenever COHORT_HAVE_CUDA is defined), so
 * this file needs no cuda_runtime.h; without it, every helper reports
 * COHORT_ENOTSUP and cohort__gpu_available() is false.
 *
 * "No GPU" covers every way cudaGetDeviceCount can fail on a machine
 * without a usable device: no driver (cudaErrorInsufficientDriver with
 * the static runtime), cudaErrorNoDevice, a driver too old, or zero
 * devices. This is the one place a cudaError_t becomes a cohort_status
 * (cohort__cuda_fail), keeping its text for cohort__cuda_last_error().
 */
#include <pthread.h>
#include <stdio.h>

#include "cohort_common.h"
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

#ifdef COHORT_HAVE_CUDA

static pthread_once_t gpu_once = PTHREAD_ONCE_INIT;
static bool gpu_ok;
static char gpu_reason[256];

static void
gpu_probe(void)
{
	int n = 0;
	int e = cohort__cudart_device_count(&n);

	if (e != 0) {
		snprintf(gpu_reason, sizeof(gpu_reason), "%s: %s",
		    cohort__cudart_error_name(e),
		    cohort__cudart_error_string(e));
		return;
	}
	if (n <= 0) {
		cohort__strlcpy(
		    gpu_reason, "no CUDA device", sizeof(gpu_reason));
		return;
	}
	gpu_ok = true;
}

bool
cohort__gpu_available(void)
{
	(void)pthread_once(&gpu_once, gpu_probe);
	return (gpu_ok);
}

const char *
cohort__gpu_unavailable_reason(void)
{
	(void)pthread_once(&gpu_once, gpu_probe);
	return (gpu_reason);
}

static cohort_status
gpu_check(const char *where, int e)
{
	if (e == 0)
		return (COHORT_OK);
	return (cohort__cuda_fail(where, e, cohort__cudart_error_name(e),
	    cohort__cudart_error_string(e)));
}

static cohort_status
gpu_require(const char *where)
{
	if (cohort__gpu_available())
		return (COHORT_OK);
	return (
	    cohort__err(COHORT_ENOTSUP, "%s: no GPU (%s)", where, gpu_reason));
}

cohort_status
cohort__gpu_describe(char *buf, size_t len)
{
	char name[128];
	int sms = 0;
	size_t mem = 0;
	int drv = 0;
	int rt = 0;
	cohort_status rv;

	if (buf == NULL || len == 0)
		return (cohort__err(COHORT_EINVAL, "gpu_describe: no buffer"));
	if ((rv = gpu_require("gpu_describe")) != COHORT_OK)
		return (rv);
	rv = gpu_check("cudaGetDeviceProperties",
	    cohort__cudart_describe(
	        name, sizeof(name), &sms, &mem, &drv, &rt));
	if (rv != COHORT_OK)
		return (rv);
	snprintf(buf, len, "%s, %d SMs, %zu MiB, driver %d.%d, runtime %d.%d",
	    name, sms, mem >> 20, drv / 1000, (drv % 1000) / 10, rt / 1000,
	    (rt % 1000) / 10);
	return (COHORT_OK);
}

cohort_status
cohort__gpu_alloc(void **p, size_t bytes)
{
	void *q = NULL;
	cohort_status rv;

	if (p == NULL)
		return (cohort__err(COHORT_EINVAL, "gpu_alloc: NULL p"));
	if ((rv = gpu_require("gpu_alloc")) != COHORT_OK)
		return (rv);
	rv = gpu_check("cudaMalloc", cohort__cudart_malloc(&q, bytes));
	if (rv == COHORT_OK)
		*p = q;
	return (rv);
}

void
cohort__gpu_free(void *p)
{
	if (p != NULL)
		(void)gpu_check("cudaFree", cohort__cudart_free(p));
}

cohort_status
cohort__gpu_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
	return (gpu_check("cudaMemcpy(h2d)",
	    cohort__cudart_memcpy(dst, src, bytes, COHORT__CUDART_H2D)));
}

cohort_status
cohort__gpu_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
	return (gpu_check("cudaMemcpy(d2h)",
	    cohort__cudart_memcpy(dst, src, bytes, COHORT__CUDART_D2H)));
}

cohort_status
cohort__gpu_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
	return (gpu_check("cudaMemcpyAsync(d2d)",
	    cohort__cudart_memcpy_async(dst, src, bytes, stream)));
}

cohort_status
cohort__gpu_memset(void *dst, int byte, size_t bytes)
{
	return (
	    gpu_check("cudaMemset", cohort__cudart_memset(dst, byte, bytes)));
}

cohort_status
cohort__gpu_sync(void)
{
	return (gpu_check("cudaDeviceSynchronize", cohort__cudart_sync()));
}

#else /* !COHORT_HAVE_CUDA */

static cohort_status
gpu_nocuda(const char *where)
{
	return (cohort__err(COHORT_ENOTSUP, "%s: built without CUDA", where));
}

bool
cohort__gpu_available(void)
{
	return (false);
}

const char *
cohort__gpu_unavailable_reason(void)
{
	return ("built without CUDA");
}

cohort_status
cohort__gpu_describe(char *buf, size_t len)
{
	return (gpu_nocuda("gpu_describe"));
}

cohort_status
cohort__gpu_alloc(void **p, size_t bytes)
{
	return (gpu_nocuda("gpu_alloc"));
}

void
cohort__gpu_free(void *p)
{
}

cohort_status
cohort__gpu_memcpy_h2d(void *dst, const void *src, size_t bytes)
{
	return (gpu_nocuda("gpu_memcpy_h2d"));
}

cohort_status
cohort__gpu_memcpy_d2h(void *dst, const void *src, size_t bytes)
{
	return (gpu_nocuda("gpu_memcpy_d2h"));
}

cohort_status
cohort__gpu_memcpy_d2d(void *dst, const void *src, size_t bytes, void *stream)
{
	return (gpu_nocuda("gpu_memcpy_d2d"));
}

cohort_status
cohort__gpu_memset(void *dst, int byte, size_t bytes)
{
	return (gpu_nocuda("gpu_memset"));
}

cohort_status
cohort__gpu_sync(void)
{
	return (gpu_nocuda("gpu_sync"));
}

#endif /* COHORT_HAVE_CUDA */
