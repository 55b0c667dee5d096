/*
 * nccl_impl.h - NCCL, loaded at run time (the CUDA runtime it needs:
 * backend/cudart.h).
 *
 * libcohort never links libcudart or libnccl: NCCL is too large to ship
 * with cohort, and a machine's own NCCL (PyTorch's wheel, a system
 * package) may be any version. The GPU backends (nccl, tcp-staged) and
 * the pointer probe dlopen() the libraries on first use and resolve each
 * entry point by name, so libcohort loads, and reports COHORT_ENOTSUP, on
 * machines without a driver, a GPU or NCCL.
 *
 * The types below are declared here, not taken from cuda_runtime.h or
 * nccl.h, so that the build needs neither. Each is copied from the CUDA
 * 13.0 / NCCL 2.28.9 headers and is part of their stable C ABI: handles
 * are pointers, enums are int, ncclUniqueId is 128 bytes passed by value,
 * ncclConfig_t is versioned by its own size/magic/version fields (NCCL
 * copies min(size, its sizeof) bytes and ignores fields newer than the
 * version we declare). tests/cuda/test_nccl.c checks every declaration
 * against the real headers when they are installed.
 *
 * Library search, first hit wins (all RTLD_NOW | RTLD_LOCAL):
 *   cudart: $COHORT_CUDART_LIB, else libcudart.so.13, .so.12, .so
 *   nccl:   $COHORT_NCCL_LIB, else libnccl.so.2, libnccl.so
 * Each library is loaded once per process and stays loaded.
 */
#ifndef COHORT_NCCL_IMPL_H
#define COHORT_NCCL_IMPL_H

#include <stdbool.h>
#include <stddef.h>

#include "backend/backend.h"
#include "backend/cudart.h"

/* ------------------------------------------------------------------------ */
/* NCCL (nccl.h 2.28.9)                                                     */
/* ------------------------------------------------------------------------ */

#define COHORT__NCCL_UID_BYTES 128 /* NCCL_UNIQUE_ID_BYTES */
typedef struct {
	char internal[COHORT__NCCL_UID_BYTES];
} cohort__nccl_uid; /* ncclUniqueId */

typedef struct cohort__nccl_comm *cohort__nccl_comm_t; /* ncclComm_t */

/* ncclResult_t */
#define COHORT__NCCL_SUCCESS 0
#define COHORT__NCCL_UNHANDLED_CUDA_ERROR 1
#define COHORT__NCCL_SYSTEM_ERROR 2
#define COHORT__NCCL_INTERNAL_ERROR 3
#define COHORT__NCCL_INVALID_ARGUMENT 4
#define COHORT__NCCL_INVALID_USAGE 5
#define COHORT__NCCL_REMOTE_ERROR 6
#define COHORT__NCCL_IN_PROGRESS 7

/* ncclRedOp_t (note: ncclMax is 2 and ncclMin 3, unlike cohort_redop) */
#define COHORT__NCCL_SUM 0
#define COHORT__NCCL_PROD 1
#define COHORT__NCCL_MAX 2
#define COHORT__NCCL_MIN 3
#define COHORT__NCCL_AVG 4 /* NCCL >= 2.10 */

/* ncclDataType_t */
#define COHORT__NCCL_INT8 0
#define COHORT__NCCL_UINT8 1
#define COHORT__NCCL_INT32 2
#define COHORT__NCCL_UINT32 3
#define COHORT__NCCL_INT64 4
#define COHORT__NCCL_UINT64 5
#define COHORT__NCCL_FLOAT16 6
#define COHORT__NCCL_FLOAT32 7
#define COHORT__NCCL_FLOAT64 8
#define COHORT__NCCL_BFLOAT16 9 /* NCCL >= 2.10 */

/* NCCL_VERSION(X, Y, Z) of the header our declarations come from. */
#define COHORT__NCCL_HEADER_VERSION 22809
/* The oldest NCCL we drive: ncclCommInitRankConfig, non-blocking
 * communicators, ncclCommFinalize (2.14), ncclAvg and bf16 (2.10). */
#define COHORT__NCCL_MIN_VERSION 21400

#define COHORT__NCCL_CONFIG_MAGIC 0xcafebeefu
#define COHORT__NCCL_CONFIG_UNDEF_INT (-2147483647 - 1) /* INT_MIN */

/* ncclConfig_t as of 2.28 (struct ncclConfig_v22800). */
struct cohort__nccl_config {
	size_t size;
	unsigned int magic;
	unsigned int version;
	int blocking;
	int cgaClusterSize;
	int minCTAs;
	int maxCTAs;
	const char *netName;
	int splitShare;
	int trafficClass;
	const char *commName;
	int collnetEnable;
	int CTAPolicy;
	int shrinkShare;
	int nvlsCTAs;
	int nChannelsPerNetPeer;
	int nvlinkCentricSched;
};

/* NCCL_CONFIG_INITIALIZER: every attribute undefined. */
void cohort__nccl_config_init(struct cohort__nccl_config *c);

/* Entry points; every int result is an ncclResult_t, every void *stream
 * a cudaStream_t. Optional ones (newer than the minimum) may be NULL. */
struct cohort__dl_nccl {
	int version; /* ncclGetVersion's code, e.g. 22809 */
	char version_text[32]; /* "2.28.9" */

	int (*GetVersion)(int *);
	int (*GetUniqueId)(cohort__nccl_uid *);
	int (*CommInitRankConfig)(cohort__nccl_comm_t *, int, cohort__nccl_uid,
	    int, struct cohort__nccl_config *);
	int (*CommGetAsyncError)(cohort__nccl_comm_t, int *);
	int (*CommFinalize)(cohort__nccl_comm_t);
	int (*CommDestroy)(cohort__nccl_comm_t);
	int (*CommAbort)(cohort__nccl_comm_t);
	int (*CommCuDevice)(cohort__nccl_comm_t, int *);
	const char *(*GetErrorString)(int);
	const char *(*GetLastError)(cohort__nccl_comm_t); /* optional */
	int (*AllReduce)(const void *, void *, size_t, int, int,
	    cohort__nccl_comm_t, void *);
	int (*Reduce)(const void *, void *, size_t, int, int, int,
	    cohort__nccl_comm_t, void *);
	int (*Broadcast)(const void *, void *, size_t, int, int,
	    cohort__nccl_comm_t, void *);
	int (*AllGather)(
	    const void *, void *, size_t, int, cohort__nccl_comm_t, void *);
	int (*ReduceScatter)(const void *, void *, size_t, int, int,
	    cohort__nccl_comm_t, void *);
	int (*Send)(
	    const void *, size_t, int, int, cohort__nccl_comm_t, void *);
	int (*Recv)(void *, size_t, int, int, cohort__nccl_comm_t, void *);
	int (*GroupStart)(void);
	int (*GroupEnd)(void);
	/* Optional, 2.27+/2.28+: resolved for callers that can use them. */
	int (*CommRevoke)(cohort__nccl_comm_t, int);
	int (*CommShrink)(cohort__nccl_comm_t, int *, int,
	    cohort__nccl_comm_t *, struct cohort__nccl_config *, int);
	int (*CommSplit)(cohort__nccl_comm_t, int, int, cohort__nccl_comm_t *,
	    struct cohort__nccl_config *);
};

/* libnccl, loaded once (after the CUDA runtime, which must be usable):
 * COHORT_OK and *out, or COHORT_ENOTSUP with why in err ("cannot load
 * libnccl.so.2 (...)", "NCCL 2.12.10 is too old: 2.14 or newer needed").
 * Thread-safe. */
cohort_status cohort__dl_nccl_get(
    const struct cohort__dl_nccl **out, char *err, size_t errlen);

/* Decodes an ncclGetVersion code (both the <= 2.8 and the later
 * encoding) into "X.Y.Z". */
void cohort__nccl_version_text(int code, char *buf, size_t len);

/* cohort_dtype -> ncclDataType_t, -1 if NCCL has no such type. */
int cohort__nccl_dtype(cohort_dtype dt);
/* cohort_redop -> ncclRedOp_t for an NCCL of the given version code, -1
 * if that NCCL cannot do it (MEAN needs ncclAvg, 2.10+). */
int cohort__nccl_redop(cohort_redop op, int nccl_version);
/* "ncclSystemError" etc. (static text). */
const char *cohort__nccl_result_name(int r);

/* The unique-id exchange of nccl init, separate for its unit tests: rank
 * 0 calls gen (ncclGetUniqueId) and publishes the id under
 * "nccl/<group_id>/<generation>/uid" in desc->store; the others wait for
 * it there. COHORT_OK and *id; else the store's status (ETIMEDOUT...),
 * EPROTO for a value of the wrong size, ENCCL if gen failed; err says
 * which. */
cohort_status cohort__nccl_exchange_id(const struct cohort__group_desc *desc,
    int (*gen)(cohort__nccl_uid *), cohort__nccl_uid *id, char *err,
    size_t errlen, cohort__time deadline);

#endif /* COHORT_NCCL_IMPL_H */
