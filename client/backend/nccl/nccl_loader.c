/*
 * nccl_loader.c - dlopen() of the CUDA runtime and of NCCL (nccl_impl.h).
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

#include "nccl_impl.h"

enum loader_state {
	LOADER_NEW = 0,
	LOADER_OK,
	LOADER_FAILED,
};

static pthread_mutex_t loader_mtx = PTHREAD_MUTEX_INITIALIZER;

static enum loader_state cudart_state;
static void *cudart_lib;
static struct cohort__dl_cudart cudart_api;
static char cudart_why[512];

static enum loader_state nccl_state;
static void *nccl_lib;
static struct cohort__dl_nccl nccl_api;
static char nccl_why[512];

/* Opens the first library of names[] (or $env alone when set). On
 * failure, why gets every name tried with dlerror()'s text of the last. */
static void *
loader_open(enum cohort__knob env, const char *const *names, char *path,
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
static bool
loader_sym(void *lib, const char *lib_name, const char *sym, void *slot,
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

#define CUDART_SYM(field, name)                                               \
	{                                                                     \
#name, offsetof(struct cohort__dl_cudart, field)              \
	}

static const struct {
	const char *name;
	size_t off;
} cudart_syms[] = {
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
	for (size_t i = 0; i < sizeof(cudart_syms) / sizeof(cudart_syms[0]);
	     i++) {
		if (!loader_sym(lib, path, cudart_syms[i].name,
		        (char *)api + cudart_syms[i].off, true, why, whylen))
			return (false);
	}
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

		lib = loader_open(COHORT__KNOB_CUDART_LIB, one, path,
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
			cudart_state = LOADER_OK;
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
	cudart_state = LOADER_FAILED;
	cohort__debug("cuda runtime unavailable: %s", cudart_why);
}

cohort_status
cohort__dl_cudart_get(
    const struct cohort__dl_cudart **out, char *err, size_t errlen)
{
	cohort_status rv;

	pthread_mutex_lock(&loader_mtx);
	if (cudart_state == LOADER_NEW)
		cudart_load_locked();
	if (cudart_state == LOADER_OK) {
		*out = &cudart_api;
		rv = COHORT_OK;
	} else {
		if (err != NULL && errlen > 0)
			cohort__strlcpy(err, cudart_why, errlen);
		rv = COHORT_ENOTSUP;
	}
	pthread_mutex_unlock(&loader_mtx);
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
	loaded = cudart_state == LOADER_OK;
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

/* ------------------------------------------------------------------------ */
/* NCCL                                                                     */
/* ------------------------------------------------------------------------ */

void
cohort__nccl_version_text(int code, char *buf, size_t len)
{
	int major, minor, patch;

	if (code >= 10000) { /* NCCL_VERSION for 2.9 and later */
		major = code / 10000;
		minor = (code % 10000) / 100;
		patch = code % 100;
	} else {
		major = code / 1000;
		minor = (code % 1000) / 100;
		patch = code % 100;
	}
	snprintf(buf, len, "%d.%d.%d", major, minor, patch);
}

void
cohort__nccl_config_init(struct cohort__nccl_config *c)
{
	memset(c, 0, sizeof(*c));
	c->size = sizeof(*c);
	c->magic = COHORT__NCCL_CONFIG_MAGIC;
	c->version = COHORT__NCCL_HEADER_VERSION;
	c->blocking = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->cgaClusterSize = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->minCTAs = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->maxCTAs = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->netName = NULL;
	c->splitShare = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->trafficClass = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->commName = NULL;
	c->collnetEnable = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->CTAPolicy = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->shrinkShare = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->nvlsCTAs = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->nChannelsPerNetPeer = COHORT__NCCL_CONFIG_UNDEF_INT;
	c->nvlinkCentricSched = COHORT__NCCL_CONFIG_UNDEF_INT;
}

#define NCCL_SYM(field, name, req)                                            \
	{                                                                     \
#name, offsetof(struct cohort__dl_nccl, field), req           \
	}

static const struct {
	const char *name;
	size_t off;
	bool required;
} nccl_syms[] = {
	NCCL_SYM(GetVersion, ncclGetVersion, true),
	NCCL_SYM(GetUniqueId, ncclGetUniqueId, true),
	NCCL_SYM(CommInitRankConfig, ncclCommInitRankConfig, true),
	NCCL_SYM(CommGetAsyncError, ncclCommGetAsyncError, true),
	NCCL_SYM(CommFinalize, ncclCommFinalize, true),
	NCCL_SYM(CommDestroy, ncclCommDestroy, true),
	NCCL_SYM(CommAbort, ncclCommAbort, true),
	NCCL_SYM(CommCuDevice, ncclCommCuDevice, true),
	NCCL_SYM(GetErrorString, ncclGetErrorString, true),
	NCCL_SYM(GetLastError, ncclGetLastError, false),
	NCCL_SYM(AllReduce, ncclAllReduce, true),
	NCCL_SYM(Reduce, ncclReduce, true),
	NCCL_SYM(Broadcast, ncclBroadcast, true),
	NCCL_SYM(AllGather, ncclAllGather, true),
	NCCL_SYM(ReduceScatter, ncclReduceScatter, true),
	NCCL_SYM(Send, ncclSend, true),
	NCCL_SYM(Recv, ncclRecv, true),
	NCCL_SYM(GroupStart, ncclGroupStart, true),
	NCCL_SYM(GroupEnd, ncclGroupEnd, true),
	NCCL_SYM(CommRevoke, ncclCommRevoke, false),
	NCCL_SYM(CommShrink, ncclCommShrink, false),
	NCCL_SYM(CommSplit, ncclCommSplit, false),
};

static void
nccl_load_locked(void)
{
	static const char *const names[]
	    = { "libnccl.so.2", "libnccl.so", NULL };
	struct cohort__dl_nccl api;
	char path[256];
	int v = 0;
	int r;

	memset(&api, 0, sizeof(api));
	nccl_lib = loader_open(COHORT__KNOB_NCCL_LIB, names, path,
	    sizeof(path), nccl_why, sizeof(nccl_why));
	if (nccl_lib == NULL)
		goto failed;
	/* The version first: a too-old NCCL lacks later symbols, and
	 * "too old" is the clearer message. */
	if (!loader_sym(nccl_lib, path, "ncclGetVersion", &api.GetVersion,
	        true, nccl_why, sizeof(nccl_why)))
		goto failed_close;
	if ((r = api.GetVersion(&v)) != COHORT__NCCL_SUCCESS) {
		snprintf(nccl_why, sizeof(nccl_why),
		    "%s: ncclGetVersion failed (%d)", path, r);
		goto failed_close;
	}
	api.version = v;
	cohort__nccl_version_text(
	    v, api.version_text, sizeof(api.version_text));
	if (v < COHORT__NCCL_MIN_VERSION) {
		snprintf(nccl_why, sizeof(nccl_why),
		    "%s is NCCL %s, too old: 2.14 or newer needed", path,
		    api.version_text);
		goto failed_close;
	}
	for (size_t i = 0; i < sizeof(nccl_syms) / sizeof(nccl_syms[0]); i++) {
		if (!loader_sym(nccl_lib, path, nccl_syms[i].name,
		        (char *)&api + nccl_syms[i].off, nccl_syms[i].required,
		        nccl_why, sizeof(nccl_why)))
			goto failed_close;
	}
	nccl_api = api;
	nccl_state = LOADER_OK;
	cohort__debug("nccl %s from %s (revoke %s, shrink %s, split %s)",
	    api.version_text, path, api.CommRevoke != NULL ? "yes" : "no",
	    api.CommShrink != NULL ? "yes" : "no",
	    api.CommSplit != NULL ? "yes" : "no");
	return;

failed_close:
	(void)dlclose(nccl_lib);
	nccl_lib = NULL;
failed:
	nccl_state = LOADER_FAILED;
	cohort__debug("nccl unavailable: %s", nccl_why);
}

cohort_status
cohort__dl_nccl_get(
    const struct cohort__dl_nccl **out, char *err, size_t errlen)
{
	const struct cohort__dl_cudart *cu;
	cohort_status rv;

	if ((rv = cohort__dl_cudart_get(&cu, err, errlen)) != COHORT_OK)
		return (rv);
	pthread_mutex_lock(&loader_mtx);
	if (nccl_state == LOADER_NEW)
		nccl_load_locked();
	if (nccl_state == LOADER_OK) {
		*out = &nccl_api;
		rv = COHORT_OK;
	} else {
		if (err != NULL && errlen > 0)
			cohort__strlcpy(err, nccl_why, errlen);
		rv = COHORT_ENOTSUP;
	}
	pthread_mutex_unlock(&loader_mtx);
	return (rv);
}

/* ------------------------------------------------------------------------ */
/* Mappings                                                                 */
/* ------------------------------------------------------------------------ */

int
cohort__nccl_dtype(cohort_dtype dt)
{
	switch (dt) {
	case COHORT_F32:
		return (COHORT__NCCL_FLOAT32);
	case COHORT_F64:
		return (COHORT__NCCL_FLOAT64);
	case COHORT_F16:
		return (COHORT__NCCL_FLOAT16);
	case COHORT_BF16:
		return (COHORT__NCCL_BFLOAT16);
	case COHORT_I32:
		return (COHORT__NCCL_INT32);
	case COHORT_I64:
		return (COHORT__NCCL_INT64);
	case COHORT_U8:
		return (COHORT__NCCL_UINT8);
	default:
		return (-1);
	}
}

int
cohort__nccl_redop(cohort_redop op, int nccl_version)
{
	switch (op) {
	case COHORT_SUM:
		return (COHORT__NCCL_SUM);
	case COHORT_PROD:
		return (COHORT__NCCL_PROD);
	case COHORT_MIN:
		return (COHORT__NCCL_MIN);
	case COHORT_MAX:
		return (COHORT__NCCL_MAX);
	case COHORT_MEAN:
		return (nccl_version >= 21000 ? COHORT__NCCL_AVG : -1);
	default:
		return (-1);
	}
}

const char *
cohort__nccl_result_name(int r)
{
	static const char *const names[] = { "ncclSuccess",
		"ncclUnhandledCudaError", "ncclSystemError",
		"ncclInternalError", "ncclInvalidArgument", "ncclInvalidUsage",
		"ncclRemoteError", "ncclInProgress" };

	if (r >= 0 && (size_t)r < sizeof(names) / sizeof(names[0]))
		return (names[r]);
	return ("ncclResult?");
}
