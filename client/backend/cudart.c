/*
 * cudart.c - dlopen() of the CUDA runtime (cudart.h), and the loading
 * helpers the NCCL loader (nccl/nccl_loader.c) shares.
 *
 * Each library is loaded once per process under a mutex, its entry points
 * resolved by name into a table that lives as long as the process. A
 * failure is remembered with its reason, so that every group reports the
 * same clear COHORT_ENOTSUP without retrying the load. When the runtime
 * loads but finds no usable device, it is unloaded again: a process
 * without a GPU keeps nothing mapped.
 *
 * References: NCCL src/misc/cudawrap.cc (driver entry points by name) and
 * PyTorch's lazy NVRTC/cuDNN loading.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "backend/cudart.h"

static pthread_mutex_t loader_mtx = PTHREAD_MUTEX_INITIALIZER;

static enum cohort__dl_state cudart_state;
static void *cudart_lib;
static struct cohort__dl_cudart cudart_api;
static char cudart_why[512];

/* Opens the first library of names[] (or $env alone when set). On
 * failure, why gets every name tried with dlerror()'s text of the last. */
void *
cohort__dl_open(enum cohort__knob env, const char *const *names, char *path,
    size_t pathlen, char *why, size_t whylen)
{
	const char *override = cohort__knob_str(env);
	const char *last = "";
	size_t off = 0;
	void *h;

	why[0] = '\0';
	if (override != NULL && override[0] != '\0') {
		if ((h = dlopen(override, RTLD_NOW | RTLD_LOCAL)) != NULL) {
			cohort__strlcpy(path, override, pathlen);
			return (h);
		}
		last = dlerror();
		snprintf(why, whylen, "cannot load %s (from %s): %s", override,
		    cohort__knob_info(env)->name, last != NULL ? last : "?");
		return (NULL);
	}
	cohort__appendf(why, whylen, &off, "cannot load ");
	for (size_t i = 0; names[i] != NULL; i++) {
		if ((h = dlopen(names[i], RTLD_NOW | RTLD_LOCAL)) != NULL) {
			cohort__strlcpy(path, names[i], pathlen);
			why[0] = '\0';
			return (h);
		}
		last = dlerror();
		cohort__appendf(
		    why, whylen, &off, "%s%s", i > 0 ? ", " : "", names[i]);
	}
	cohort__appendf(why, whylen, &off, " (%s; set %s to its path)",
	    last != NULL ? last : "?", cohort__knob_info(env)->name);
	return (NULL);
}

/* Resolves one symbol into *slot; false (and why) if absent. */
bool
cohort__dl_sym(void *lib, const char *lib_name, const char *sym, void *slot,
    bool required, char *why, size_t whylen)
{
	void *f;

	(void)dlerror();
	f = dlsym(lib, sym);
	if (f == NULL && required) {
		snprintf(why, whylen, "%s has no %s", lib_name, sym);
		return (false);
	}
	/* POSIX: a function pointer round-trips through void *. */
	memcpy(slot, &f, sizeof(f));
	return (true);
}

bool
cohort__dl_syms(void *lib, const char *lib_name,
    const struct cohort__dl_entry *e, size_t n, void *table, char *why,
    size_t whylen)
{
	for (size_t i = 0; i < n; i++)
		if (!cohort__dl_sym(lib, lib_name, e[i].name,
		        (char *)table + e[i].off, e[i].required, why, whylen))
			return (false);
	return (true);
}

const char *
cohort__dl_cuda_errtext(
    const struct cohort__dl_cudart *cu, int code, char *buf, size_t len)
{
	const char *name = NULL;
	const char *text = NULL;

	if (cu != NULL && cu->GetErrorName != NULL)
		name = cu->GetErrorName(code);
	if (cu != NULL && cu->GetErrorString != NULL)
		text = cu->GetErrorString(code);
	snprintf(buf, len, "%s: %s", name != NULL ? name : "cudaError",
	    text != NULL ? text : "unknown CUDA error");
	if (name == NULL)
		snprintf(buf, len, "cudaError %d", code);
	return (buf);
}

/* Every entry point is required but the optional ones (CUDART_OPT). */
#define CUDART_SYM(field, sym)                                                \
	COHORT__DL_ENTRY(struct cohort__dl_cudart, field, sym, true)
#define CUDART_OPT(field, sym)                                                \
	COHORT__DL_ENTRY(struct cohort__dl_cudart, field, sym, false)

static const struct cohort__dl_entry cudart_syms[] = {
	CUDART_SYM(GetDeviceCount, cudaGetDeviceCount),
	CUDART_SYM(GetDevice, cudaGetDevice),
	CUDART_SYM(SetDevice, cudaSetDevice),
	CUDART_SYM(DriverGetVersion, cudaDriverGetVersion),
	CUDART_SYM(RuntimeGetVersion, cudaRuntimeGetVersion),
	CUDART_SYM(GetErrorName, cudaGetErrorName),
	CUDART_SYM(GetErrorString, cudaGetErrorString),
	CUDART_SYM(GetLastError, cudaGetLastError),
	CUDART_SYM(PointerGetAttributes, cudaPointerGetAttributes),
	CUDART_SYM(StreamCreateWithFlags, cudaStreamCreateWithFlags),
	CUDART_SYM(StreamDestroy, cudaStreamDestroy),
	CUDART_SYM(StreamQuery, cudaStreamQuery),
	CUDART_SYM(StreamSynchronize, cudaStreamSynchronize),
	CUDART_SYM(EventCreateWithFlags, cudaEventCreateWithFlags),
	CUDART_SYM(EventRecord, cudaEventRecord),
	CUDART_SYM(EventQuery, cudaEventQuery),
	CUDART_SYM(EventDestroy, cudaEventDestroy),
	CUDART_SYM(Malloc, cudaMalloc),
	CUDART_SYM(Free, cudaFree),
	CUDART_SYM(MallocHost, cudaMallocHost),
	CUDART_SYM(FreeHost, cudaFreeHost),
	CUDART_SYM(Memcpy, cudaMemcpy),
	CUDART_SYM(MemcpyAsync, cudaMemcpyAsync),
	CUDART_SYM(Memset, cudaMemset),
	CUDART_SYM(DeviceSynchronize, cudaDeviceSynchronize),
	CUDART_SYM(LaunchHostFunc, cudaLaunchHostFunc),
	CUDART_OPT(DeviceGetAttribute, cudaDeviceGetAttribute),
	CUDART_OPT(MemGetInfo, cudaMemGetInfo),
	/* CUDA 12 and 13 export the current struct under the _v2 name */
	CUDART_OPT(GetDeviceProperties, cudaGetDeviceProperties_v2),
};

/* Why cudaGetDeviceCount failed, in the words a user acts on. */
static const char *
cudart_reason(int code)
{
	switch (code) {
	case COHORT__CUDA_ERR_INSUFFICIENT_DRIVER:
	case COHORT__CUDA_ERR_STUB_LIBRARY:
		return ("no CUDA driver");
	case COHORT__CUDA_ERR_NO_DEVICE:
		return ("no CUDA device");
	default:
		return ("CUDA unusable");
	}
}

/* Resolves and probes one loaded runtime: true and *api when it finds a
 * device; else why. */
static bool
cudart_probe(void *lib, const char *path, struct cohort__dl_cudart *api,
    char *why, size_t whylen)
{
	char text[200];
	int e;
	int n = 0;

	memset(api, 0, sizeof(*api));
	if (!cohort__dl_syms(lib, path, cudart_syms,
	        sizeof(cudart_syms) / sizeof(cudart_syms[0]), api, why,
	        whylen))
		return (false);
	if (api->GetDeviceProperties == NULL) /* CUDA 11 */
		(void)cohort__dl_sym(lib, path, "cudaGetDeviceProperties",
		    &api->GetDeviceProperties, false, why, whylen);
	if ((e = api->GetDeviceCount(&n)) != COHORT__CUDA_SUCCESS) {
		snprintf(why, whylen, "%s (%s)", cudart_reason(e),
		    cohort__dl_cuda_errtext(api, e, text, sizeof(text)));
		return (false);
	}
	if (n <= 0) {
		snprintf(why, whylen,
		    "no CUDA device (cudaGetDeviceCount found 0)");
		return (false);
	}
	api->device_count = n;
	(void)api->RuntimeGetVersion(&api->runtime_version);
	(void)api->DriverGetVersion(&api->driver_version);
	return (true);
}

/* Tries $COHORT_CUDART_LIB alone, else each soname in turn: a newer
 * runtime the driver is too old for falls back to an older one. The
 * reason kept is the first loaded runtime's, else dlopen's. A runtime
 * that loads but finds no device is unloaded again. */
static void
cudart_load_locked(void)
{
	static const char *const names[]
	    = { "libcudart.so.13", "libcudart.so.12", "libcudart.so", NULL };
	const char *override = cohort__knob_str(COHORT__KNOB_CUDART_LIB);
	struct cohort__dl_cudart api;
	char why[sizeof(cudart_why)];
	char path[256];
	bool have_reason = false;

	for (size_t i = 0; names[i] != NULL; i++) {
		const char *one[2] = { names[i], NULL };
		void *lib;

		lib = cohort__dl_open(COHORT__KNOB_CUDART_LIB, one, path,
		    sizeof(path), why, sizeof(why));
		if (lib == NULL) {
			if (!have_reason)
				cohort__strlcpy(
				    cudart_why, why, sizeof(cudart_why));
			if (override != NULL && override[0] != '\0')
				break;
			continue;
		}
		if (cudart_probe(lib, path, &api, why, sizeof(why))) {
			cudart_lib = lib;
			cudart_api = api;
			cudart_state = COHORT__DL_OK;
			cohort__debug("cuda runtime %s: %d device(s), runtime "
			              "%d, driver %d",
			    path, api.device_count, api.runtime_version,
			    api.driver_version);
			return;
		}
		(void)dlclose(lib);
		if (!have_reason) {
			cohort__strlcpy(cudart_why, why, sizeof(cudart_why));
			have_reason = true;
		}
		if (override != NULL && override[0] != '\0')
			break;
	}
	if (!have_reason && (override == NULL || override[0] == '\0'))
		snprintf(cudart_why, sizeof(cudart_why),
		    "cannot load "
		    "libcudart.so.13, libcudart.so.12 or libcudart.so (set "
		    "COHORT_CUDART_LIB to its path)");
	cudart_state = COHORT__DL_FAILED;
	cohort__debug("cuda runtime unavailable: %s", cudart_why);
}

cohort_status
cohort__dl_cuda_event(
    const struct cohort__dl_cudart *cu, void **ev, char *err, size_t errlen)
{
	char text[200];
	int e;

	if ((e = cu->EventCreateWithFlags(
	         ev, COHORT__CUDA_EVENT_DISABLE_TIMING))
	    == COHORT__CUDA_SUCCESS)
		return (COHORT_OK);
	*ev = NULL;
	snprintf(err, errlen, "cudaEventCreateWithFlags: %s",
	    cohort__dl_cuda_errtext(cu, e, text, sizeof(text)));
	return (COHORT_ECUDA);
}

int
cohort__dl_cuda_grow(int (*alloc)(void **, size_t), int (*release)(void *),
    void **p, size_t *len, size_t want)
{
	void *q = NULL;
	int e;

	if (*p != NULL) {
		(void)release(*p);
		*p = NULL;
		*len = 0;
	}
	if ((e = alloc(&q, want)) != COHORT__CUDA_SUCCESS)
		return (e);
	*p = q;
	*len = want;
	return (COHORT__CUDA_SUCCESS);
}

cohort_status
cohort__dl_once(enum cohort__dl_state *state, void (*load)(void),
    const char *why, char *err, size_t errlen)
{
	cohort_status rv = COHORT_OK;

	pthread_mutex_lock(&loader_mtx);
	if (*state == COHORT__DL_NEW)
		load();
	if (*state != COHORT__DL_OK) {
		if (err != NULL && errlen > 0)
			cohort__strlcpy(err, why, errlen);
		rv = COHORT_ENOTSUP;
	}
	pthread_mutex_unlock(&loader_mtx);
	return (rv);
}

cohort_status
cohort__dl_cudart_get(
    const struct cohort__dl_cudart **out, char *err, size_t errlen)
{
	cohort_status rv;

	rv = cohort__dl_once(
	    &cudart_state, cudart_load_locked, cudart_why, err, errlen);
	if (rv == COHORT_OK)
		*out = &cudart_api; /* fixed once loaded */
	return (rv);
}

/* Without the driver library mapped, no memory of this process can be
 * device memory: answer without loading anything. */
static bool
loader_driver_mapped(void)
{
	void *h = dlopen("libcuda.so.1", RTLD_NOW | RTLD_NOLOAD);

	if (h == NULL)
		return (false);
	(void)dlclose(h);
	return (true);
}

bool
cohort__is_device_ptr(const void *p)
{
	const struct cohort__dl_cudart *cu;
	struct cohort__cuda_ptr_attr a;
	bool loaded;

	if (p == NULL)
		return (false);
	pthread_mutex_lock(&loader_mtx);
	loaded = cudart_state == COHORT__DL_OK;
	pthread_mutex_unlock(&loader_mtx);
	if (!loaded && !loader_driver_mapped())
		return (false);
	if (cohort__dl_cudart_get(&cu, NULL, 0) != COHORT_OK)
		return (false);
	memset(&a, 0, sizeof(a));
	if (cu->PointerGetAttributes(&a, p) != COHORT__CUDA_SUCCESS) {
		(void)cu->GetLastError(); /* CUDA < 11 set it for host p */
		return (false);
	}
	return (a.type == COHORT__CUDA_MEM_DEVICE
	    || a.type == COHORT__CUDA_MEM_MANAGED);
}

void
cohort__dl_lock(void)
{
	pthread_mutex_lock(&loader_mtx);
}

void
cohort__dl_unlock(void)
{
	pthread_mutex_unlock(&loader_mtx);
}
