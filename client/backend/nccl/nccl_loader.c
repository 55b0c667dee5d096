/*
 * nccl_loader.c - dlopen() of NCCL (nccl_impl.h), after the CUDA runtime
 * (backend/cudart.c), with the same helpers and lock.
 *
 * Loaded once per process, its entry points resolved by name into a
 * table that lives as long as the process; a failure is remembered with
 * its reason. Reference: NCCL src/misc/cudawrap.cc.
 */
#include <dlfcn.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "nccl_impl.h"

static enum cohort__dl_state nccl_state;
static void *nccl_lib;
static struct cohort__dl_nccl nccl_api;
static char nccl_why[512];

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

#define NCCL_SYM(field, sym, req)                                             \
	COHORT__DL_ENTRY(struct cohort__dl_nccl, field, sym, req)

static const struct cohort__dl_entry nccl_syms[] = {
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
	nccl_lib = cohort__dl_open(COHORT__KNOB_NCCL_LIB, names, path,
	    sizeof(path), nccl_why, sizeof(nccl_why));
	if (nccl_lib == NULL)
		goto failed;
	/* The version first: a too-old NCCL lacks later symbols, and
	 * "too old" is the clearer message. */
	if (!cohort__dl_sym(nccl_lib, path, "ncclGetVersion", &api.GetVersion,
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
	if (!cohort__dl_syms(nccl_lib, path, nccl_syms,
	        sizeof(nccl_syms) / sizeof(nccl_syms[0]), &api, nccl_why,
	        sizeof(nccl_why)))
		goto failed_close;
	nccl_api = api;
	nccl_state = COHORT__DL_OK;
	cohort__debug("nccl %s from %s (revoke %s, shrink %s, split %s)",
	    api.version_text, path, api.CommRevoke != NULL ? "yes" : "no",
	    api.CommShrink != NULL ? "yes" : "no",
	    api.CommSplit != NULL ? "yes" : "no");
	return;

failed_close:
	(void)dlclose(nccl_lib);
	nccl_lib = NULL;
failed:
	nccl_state = COHORT__DL_FAILED;
	cohort__debug("nccl unavailable: %s", nccl_why);
}

cohort_status
cohort__dl_nccl_get(
    const struct cohort__dl_nccl **out, char *err, size_t errlen)
{
	const struct cohort__dl_cudart *cu;
	cohort_status rv;

	if ((rv = cohort__dl_cudart_get(&cu, err, errlen)) != COHORT_OK
	    || (rv = cohort__dl_once(
	            &nccl_state, nccl_load_locked, nccl_why, err, errlen))
	        != COHORT_OK)
		return (rv);
	*out = &nccl_api; /* fixed once loaded */
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Mappings                                                                 */
/* ------------------------------------------------------------------------ */

/* NCCL's code for each dtype (every one has one). */
static const int nccl_dtypes[COHORT_DTYPE_COUNT] = {
	[COHORT_F32] = COHORT__NCCL_FLOAT32,
	[COHORT_F64] = COHORT__NCCL_FLOAT64,
	[COHORT_F16] = COHORT__NCCL_FLOAT16,
	[COHORT_BF16] = COHORT__NCCL_BFLOAT16,
	[COHORT_I32] = COHORT__NCCL_INT32,
	[COHORT_I64] = COHORT__NCCL_INT64,
	[COHORT_U8] = COHORT__NCCL_UINT8,
};

int
cohort__nccl_dtype(cohort_dtype dt)
{
	if ((int)dt < 0 || dt >= COHORT_DTYPE_COUNT)
		return (-1);
	return (nccl_dtypes[dt]);
}

/* NCCL's code for each reduction; MEAN (ncclAvg) needs NCCL 2.10. */
static const int nccl_redops[COHORT_REDOP_COUNT] = {
	[COHORT_SUM] = COHORT__NCCL_SUM,
	[COHORT_PROD] = COHORT__NCCL_PROD,
	[COHORT_MIN] = COHORT__NCCL_MIN,
	[COHORT_MAX] = COHORT__NCCL_MAX,
	[COHORT_MEAN] = COHORT__NCCL_AVG,
};

int
cohort__nccl_redop(cohort_redop op, int nccl_version)
{
	if ((int)op < 0 || op >= COHORT_REDOP_COUNT
	    || (op == COHORT_MEAN && nccl_version < 21000))
		return (-1);
	return (nccl_redops[op]);
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
