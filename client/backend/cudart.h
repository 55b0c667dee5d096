/*
 * cudart.h - the CUDA runtime, loaded at run time: the project's one
 * bridge to it, for the GPU backends (nccl, tcp-staged), the group layer's
 * pointer probe, and the GPU tests' helpers (tests/cuda/kernels/gpu.c).
 *
 * libcohort never links libcudart (or libnccl, nccl/nccl_impl.h): it
 * dlopen()s it on first use and resolves every entry point by name, so
 * libcohort loads, and reports COHORT_ENOTSUP, on machines without a
 * driver or a GPU. The types are declared here, not taken from
 * cuda_runtime.h, so that the build needs no CUDA headers; each is
 * copied from CUDA 13.0 and part of its stable C ABI. tests/cuda checks
 * them against the real headers where installed.
 *
 * Library search, first hit wins (RTLD_NOW | RTLD_LOCAL):
 *   $COHORT_CUDART_LIB, else libcudart.so.13, .so.12, .so
 */
#ifndef COHORT_BACKEND_CUDART_H
#define COHORT_BACKEND_CUDART_H

#include <stdbool.h>
#include <stddef.h>

#include "cohort/cohort.h"
#include "cohort_common.h"
#include "knobs.h"

/* ------------------------------------------------------------------------ */
/* CUDA runtime (cuda_runtime_api.h / driver_types.h, CUDA 13.0)            */
/* ------------------------------------------------------------------------ */

#define COHORT__CUDA_SUCCESS 0 /* cudaSuccess */
#define COHORT__CUDA_ERR_INVALID_VALUE 1 /* cudaErrorInvalidValue */
#define COHORT__CUDA_ERR_STUB_LIBRARY 34 /* cudaErrorStubLibrary */
#define COHORT__CUDA_ERR_INSUFFICIENT_DRIVER 35 /* ...InsufficientDriver */
#define COHORT__CUDA_ERR_NO_DEVICE 100 /* cudaErrorNoDevice */
#define COHORT__CUDA_ERR_NOT_READY 600 /* cudaErrorNotReady */

#define COHORT__CUDA_MEMCPY_H2D 1 /* cudaMemcpyHostToDevice */
#define COHORT__CUDA_MEMCPY_D2H 2 /* cudaMemcpyDeviceToHost */
#define COHORT__CUDA_MEMCPY_D2D 3 /* cudaMemcpyDeviceToDevice */
#define COHORT__CUDA_MEMCPY_DEFAULT 4 /* cudaMemcpyDefault (UVA) */
#define COHORT__CUDA_EVENT_DISABLE_TIMING 2 /* cudaEventDisableTiming */
#define COHORT__CUDA_STREAM_NON_BLOCKING 1 /* cudaStreamNonBlocking */

/* enum cudaMemoryType */
#define COHORT__CUDA_MEM_UNREGISTERED 0
#define COHORT__CUDA_MEM_HOST 1
#define COHORT__CUDA_MEM_DEVICE 2
#define COHORT__CUDA_MEM_MANAGED 3

/* struct cudaPointerAttributes (CUDA 11+; 13.0 appended reserved[8],
 * which older runtimes simply do not write). */
struct cohort__cuda_ptr_attr {
	int type; /* enum cudaMemoryType */
	int device;
	void *device_pointer;
	void *host_pointer;
	long reserved[8];
};

/* Entry points; every int result is a cudaError_t. Streams and events
 * are cudaStream_t / cudaEvent_t (opaque pointers). */
struct cohort__dl_cudart {
	int runtime_version; /* cudaRuntimeGetVersion, e.g. 13000 */
	int driver_version; /* cudaDriverGetVersion */
	int device_count;

	int (*GetDeviceCount)(int *);
	int (*GetDevice)(int *);
	int (*SetDevice)(int);
	int (*DriverGetVersion)(int *);
	int (*RuntimeGetVersion)(int *);
	const char *(*GetErrorName)(int);
	const char *(*GetErrorString)(int);
	int (*GetLastError)(void);
	int (*PointerGetAttributes)(
	    struct cohort__cuda_ptr_attr *, const void *);
	int (*StreamCreateWithFlags)(void **, unsigned int);
	int (*StreamDestroy)(void *);
	int (*StreamQuery)(void *);
	int (*StreamSynchronize)(void *);
	int (*EventCreateWithFlags)(void **, unsigned int);
	int (*EventRecord)(void *, void *);
	int (*EventQuery)(void *);
	int (*EventDestroy)(void *);
	int (*Malloc)(void **, size_t);
	int (*Free)(void *);
	int (*MallocHost)(void **, size_t);
	int (*FreeHost)(void *);
	int (*Memcpy)(void *, const void *, size_t, int);
	int (*MemcpyAsync)(void *, const void *, size_t, int, void *);
	int (*Memset)(void *, int, size_t);
	int (*DeviceSynchronize)(void);
	int (*LaunchHostFunc)(void *, void (*)(void *), void *);
	/* Optional (NULL when the runtime lacks them): a device's
	 * attribute (enum cudaDeviceAttr, e.g.
	 * COHORT__CUDA_ATTR_SM_COUNT), its free and total memory, and its
	 * properties (struct cudaDeviceProp, of which only the name, its
	 * first member, is read here: the rest changes between versions). */
	int (*DeviceGetAttribute)(int *, int, int);
	int (*MemGetInfo)(size_t *, size_t *);
	int (*GetDeviceProperties)(void *, int);
};

#define COHORT__CUDA_ATTR_SM_COUNT 16 /* cudaDevAttrMultiProcessorCount */
/* Bytes to give GetDeviceProperties: well over sizeof(struct
 * cudaDeviceProp) of any release (1008 in CUDA 12 and 13). */
#define COHORT__CUDA_PROP_BYTES 8192

/* The process's CUDA runtime, loaded and probed once: COHORT_OK and *out
 * when libcudart loads, has every entry point above, and
 * cudaGetDeviceCount finds at least one device. Otherwise COHORT_ENOTSUP
 * (every later call too) and err gets why, e.g. "no CUDA driver
 * (cudaErrorInsufficientDriver: CUDA driver version is insufficient for
 * CUDA runtime version)". Thread-safe; the first call initialises the
 * CUDA driver, so make it in the process that uses the GPU, not before a
 * fork() whose child does. */
cohort_status cohort__dl_cudart_get(
    const struct cohort__dl_cudart **out, char *err, size_t errlen);

/* "cudaErrorX: text" for a cudaError_t, into buf; returns buf. */
const char *cohort__dl_cuda_errtext(
    const struct cohort__dl_cudart *cu, int code, char *buf, size_t len);

/* A timing-free event (the nccl and tcp-staged backends' completion
 * mark): COHORT_OK and *ev, or COHORT_ECUDA with the error in err and *ev
 * NULL. */
cohort_status cohort__dl_cuda_event(
    const struct cohort__dl_cudart *cu, void **ev, char *err, size_t errlen);

/* Grows a buffer (*p, *len bytes; NULL, 0 at first) to want bytes: the
 * old one released with release (it waits for the device), a new one
 * from alloc (cu->Malloc, cu->MallocHost). 0 (cudaSuccess), or alloc's
 * error with *p NULL and *len 0. */
int cohort__dl_cuda_grow(int (*alloc)(void **, size_t), int (*release)(void *),
    void **p, size_t *len, size_t want);

/* True when p is device (or managed) memory of this process. Never loads
 * or initialises CUDA in a process that has not already done so (no
 * libcuda.so.1 mapped = no device memory); false without CUDA. Used for
 * the "auto" backend choice and the nccl backend's argument checks. */
bool cohort__is_device_ptr(const void *p);

/* ------------------------------------------------------------------------ */
/* Loader helpers shared by the runtime and NCCL loaders (cudart.c)         */
/* ------------------------------------------------------------------------ */

/* The one lock of every run-time library load. */
void cohort__dl_lock(void);
void cohort__dl_unlock(void);

/* Where a run-time library's one load stands. */
enum cohort__dl_state {
	COHORT__DL_NEW = 0,
	COHORT__DL_OK,
	COHORT__DL_FAILED,
};

/* Under the lock: runs load (which sets *state, and why on failure) the
 * first time, then answers COHORT_OK, or COHORT_ENOTSUP with why in err. */
cohort_status cohort__dl_once(enum cohort__dl_state *state, void (*load)(void),
    const char *why, char *err, size_t errlen);
/* Opens the first library of names[] (or the knob's path alone when set);
 * path gets the one opened. On failure, why gets every name tried with
 * dlerror()'s text of the last. */
void *cohort__dl_open(enum cohort__knob env, const char *const *names,
    char *path, size_t pathlen, char *why, size_t whylen);
/* Resolves one symbol into *slot; false (and why) if required and absent. */
bool cohort__dl_sym(void *lib, const char *lib_name, const char *sym,
    void *slot, bool required, char *why, size_t whylen);

/* One entry point of a library's table (struct cohort__dl_cudart,
 * struct cohort__dl_nccl): its symbol, where its pointer goes, and
 * whether the load fails without it (else the pointer stays NULL). */
struct cohort__dl_entry {
	const char *name;
	size_t off;
	bool required;
};
#define COHORT__DL_ENTRY(type, field, sym, req)                               \
	{                                                                     \
#sym, offsetof(type, field), req                              \
	}

/* Resolves entries e[0..n) into table; false (and why) at the first
 * required one that is absent. */
bool cohort__dl_syms(void *lib, const char *lib_name,
    const struct cohort__dl_entry *e, size_t n, void *table, char *why,
    size_t whylen);

#endif /* COHORT_BACKEND_CUDART_H */
