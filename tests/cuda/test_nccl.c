/*
 * test_nccl.c - the nccl and tcp-staged backends, and their run-time
 * loader (client/backend/nccl, client/backend/staged).
 *
 * suite_nccl:
 *  - always: the dtype/op tables, version decoding, the ncclConfig_t
 *    initializer, our NCCL/CUDA declarations against the real headers
 *    (when installed at build time), the unique-id exchange through a
 *    fake store, and the loader's COHORT_ENOTSUP paths (a missing
 *    libcudart or libnccl; on a machine without a driver, the natural
 *    one);
 *  - with a GPU (else one "SKIP nccl backend: no GPU (<reason>)" line per
 *    test): every collective at world size 1 on device buffers against
 *    the CPU expectation, init past its deadline and init with a missing
 *    peer (ETIMEDOUT, bounded), abort() from another thread while run()
 *    polls, a run deadline, argument errors, and tcp-staged with 1 rank
 *    in-process and 2 and 3 ranks as processes sharing the GPU.
 * suite_nccl_bench (tools/gpu-check-nccl.sh): all-reduce time through
 * nccl (1 rank), tcp-staged (2 and 4 ranks on one GPU) and plain tcp on
 * host memory, as "| path | ranks | bytes | us | GB/s |" table rows.
 *
 * CUDA is initialised only in the forked test process (CK_FORK), and the
 * multi-rank tests fork their ranks before any rank touches CUDA.
 */
#include <check.h>
#include <dirent.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/nccl/nccl_impl.h"
#include "check_cohort.h"
#include "th_elem.h"

#if defined(COHORT_HAVE_NCCL) && defined(__has_include)
#if __has_include(<nccl.h>) && __has_include(<cuda_runtime_api.h>)
#include <cuda_runtime_api.h>
#include <nccl.h>
#define NT_REAL_HEADERS 1
#endif
#endif

/* Until backend.h declares them. */
extern const struct cohort__backend_ops cohort__staged_backend;

#define NT_ERRLEN 512

/* ------------------------------------------------------------------------ */
/* Fake rendezvous stores                                                   */
/* ------------------------------------------------------------------------ */

/* In memory, one process. */
#define NT_KEYS 16
struct nt_store {
	pthread_mutex_t mtx;
	int n;
	char key[NT_KEYS][128];
	void *val[NT_KEYS];
	size_t len[NT_KEYS];
	int sets;
};

static cohort_status
nt_store_set(void *ctx, const char *key, const void *val, size_t len,
    cohort__time deadline)
{
	struct nt_store *st = ctx;
	int i;

	pthread_mutex_lock(&st->mtx);
	st->sets++;
	for (i = 0; i < st->n; i++)
		if (strcmp(st->key[i], key) == 0)
			break;
	if (i == st->n) {
		ck_assert_int_lt(st->n, NT_KEYS);
		snprintf(st->key[i], sizeof(st->key[i]), "%s", key);
		st->n++;
	}
	free(st->val[i]);
	st->val[i] = malloc(len > 0 ? len : 1);
	memcpy(st->val[i], val, len);
	st->len[i] = len;
	pthread_mutex_unlock(&st->mtx);
	return (COHORT_OK);
}

static cohort_status
nt_store_get(
    void *ctx, const char *key, void **val, size_t *len, cohort__time deadline)
{
	struct nt_store *st = ctx;

	for (;;) {
		pthread_mutex_lock(&st->mtx);
		for (int i = 0; i < st->n; i++) {
			if (strcmp(st->key[i], key) == 0) {
				*val = malloc(st->len[i] > 0 ? st->len[i] : 1);
				memcpy(*val, st->val[i], st->len[i]);
				*len = st->len[i];
				pthread_mutex_unlock(&st->mtx);
				return (COHORT_OK);
			}
		}
		pthread_mutex_unlock(&st->mtx);
		if (cohort__expired(deadline))
			return (COHORT_ETIMEDOUT);
		usleep(1000);
	}
}

static void
nt_store_init(struct nt_store *st)
{
	memset(st, 0, sizeof(*st));
	pthread_mutex_init(&st->mtx, NULL);
}

static void
nt_store_fini(struct nt_store *st)
{
	for (int i = 0; i < st->n; i++)
		free(st->val[i]);
	pthread_mutex_destroy(&st->mtx);
}

/* In a directory, for ranks in several processes: one file per key,
 * written with rename() so readers never see half a value. */
static cohort_status
nt_fstore_set(void *ctx, const char *key, const void *val, size_t len,
    cohort__time deadline)
{
	char path[512], tmp[600];
	FILE *f;
	size_t off = 0;

	cohort__appendf(path, sizeof(path), &off, "%s/", (const char *)ctx);
	for (const char *k = key; *k != '\0'; k++)
		cohort__appendf(
		    path, sizeof(path), &off, "%c", *k == '/' ? '_' : *k);
	snprintf(tmp, sizeof(tmp), "%s.%d.tmp", path, (int)getpid());
	if ((f = fopen(tmp, "wb")) == NULL)
		return (COHORT_ESYSTEM);
	if (len > 0 && fwrite(val, 1, len, f) != len) {
		fclose(f);
		return (COHORT_ESYSTEM);
	}
	if (fclose(f) != 0 || rename(tmp, path) != 0)
		return (COHORT_ESYSTEM);
	return (COHORT_OK);
}

static cohort_status
nt_fstore_get(
    void *ctx, const char *key, void **val, size_t *len, cohort__time deadline)
{
	char path[512];
	size_t off = 0;
	FILE *f;

	cohort__appendf(path, sizeof(path), &off, "%s/", (const char *)ctx);
	for (const char *k = key; *k != '\0'; k++)
		cohort__appendf(
		    path, sizeof(path), &off, "%c", *k == '/' ? '_' : *k);
	while ((f = fopen(path, "rb")) == NULL) {
		if (cohort__expired(deadline))
			return (COHORT_ETIMEDOUT);
		usleep(2000);
	}
	*val = malloc(4096);
	*len = fread(*val, 1, 4096, f);
	fclose(f);
	return (COHORT_OK);
}

static void
nt_desc(struct cohort__group_desc *d, int rank, int size, const char *gid,
    atomic_int *abort_flag)
{
	static const int32_t ranks[8] = { 0, 1, 2, 3, 4, 5, 6, 7 };

	memset(d, 0, sizeof(*d));
	d->job = "test";
	d->generation = 7;
	d->group_id = gid;
	d->rank = rank;
	d->size = size;
	d->global_ranks = ranks;
	d->bind_addr = "127.0.0.1";
	d->abort_flag = abort_flag;
}

/* ------------------------------------------------------------------------ */
/* GPU gate                                                                 */
/* ------------------------------------------------------------------------ */

static const struct cohort__dl_cudart *nt_cu;
static const struct cohort__dl_nccl *nt_nc;

/* Loads what a GPU test needs; false after printing the one SKIP line. */
static bool
nt_gpu(bool need_nccl)
{
	char why[NT_ERRLEN];

	if (cohort__dl_cudart_get(&nt_cu, why, sizeof(why)) != COHORT_OK) {
		printf("SKIP nccl backend: no GPU (%s)\n", why);
		fflush(stdout);
		return (false);
	}
	if (need_nccl
	    && cohort__dl_nccl_get(&nt_nc, why, sizeof(why)) != COHORT_OK) {
		printf("SKIP nccl backend: no NCCL (%s)\n", why);
		fflush(stdout);
		return (false);
	}
	return (true);
}

static void *
nt_dev(size_t bytes)
{
	void *p = NULL;

	ck_assert_int_eq(nt_cu->Malloc(&p, bytes > 0 ? bytes : 1), 0);
	return (p);
}

static void
nt_h2d(void *d, const void *h, size_t n)
{
	/* A copy from pageable memory may return before its DMA ends, and
	 * the legacy stream does not order a non-blocking one: done before
	 * a collective on any stream reads it. */
	ck_assert_int_eq(
	    nt_cu->Memcpy(d, h, n, COHORT__CUDA_MEMCPY_DEFAULT), 0);
	ck_assert_int_eq(nt_cu->DeviceSynchronize(), 0);
}

static void
nt_d2h(void *h, const void *d, size_t n)
{
	ck_assert_int_eq(
	    nt_cu->Memcpy(h, d, n, COHORT__CUDA_MEMCPY_DEFAULT), 0);
}

/* ------------------------------------------------------------------------ */
/* Always: tables, versions, config                                         */
/* ------------------------------------------------------------------------ */

START_TEST(test_dtype_map)
{
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_F32), 7);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_F64), 8);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_F16), 6);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_BF16), 9);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_I32), 2);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_I64), 4);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_U8), 1);
	ck_assert_int_eq(cohort__nccl_dtype(COHORT_DTYPE_COUNT), -1);
	ck_assert_int_eq(cohort__nccl_dtype((cohort_dtype)-1), -1);
}
END_TEST

START_TEST(test_redop_map)
{
	ck_assert_int_eq(cohort__nccl_redop(COHORT_SUM, 22809), 0);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_PROD, 22809), 1);
	/* ncclMax is 2 and ncclMin 3: the reverse of cohort_redop. */
	ck_assert_int_eq(cohort__nccl_redop(COHORT_MIN, 22809), 3);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_MAX, 22809), 2);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_MEAN, 22809), 4);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_MEAN, 21000), 4);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_MEAN, 20907), -1);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_SUM, 2708), 0);
	ck_assert_int_eq(cohort__nccl_redop(COHORT_REDOP_COUNT, 22809), -1);
	ck_assert_str_eq(cohort__nccl_result_name(2), "ncclSystemError");
	ck_assert_str_eq(cohort__nccl_result_name(7), "ncclInProgress");
	ck_assert_str_eq(cohort__nccl_result_name(99), "ncclResult?");
}
END_TEST

START_TEST(test_version_text)
{
	char b[32];

	cohort__nccl_version_text(22809, b, sizeof(b));
	ck_assert_str_eq(b, "2.28.9");
	cohort__nccl_version_text(21903, b, sizeof(b));
	ck_assert_str_eq(b, "2.19.3");
	cohort__nccl_version_text(2708, b, sizeof(b));
	ck_assert_str_eq(b, "2.7.8");
}
END_TEST

START_TEST(test_config_init)
{
	struct cohort__nccl_config c;

	cohort__nccl_config_init(&c);
	ck_assert_uint_eq(c.size, sizeof(c));
	ck_assert_uint_eq(sizeof(c), 80);
	ck_assert_uint_eq(c.magic, 0xcafebeefu);
	ck_assert_uint_eq(c.version, 22809);
	ck_assert_int_eq(c.blocking, COHORT__NCCL_CONFIG_UNDEF_INT);
	ck_assert_int_eq(c.nvlinkCentricSched, COHORT__NCCL_CONFIG_UNDEF_INT);
	ck_assert_ptr_null(c.netName);
	ck_assert_ptr_null(c.commName);
}
END_TEST

/* Our declarations against nccl.h / cuda_runtime_api.h, where the build
 * found them. */
START_TEST(test_abi_headers)
{
#ifdef NT_REAL_HEADERS
	ncclConfig_t real = NCCL_CONFIG_INITIALIZER;
	struct cohort__nccl_config ours;

#define NT_OFF(f)                                                             \
	ck_assert_uint_eq(offsetof(ncclConfig_t, f),                          \
	    offsetof(struct cohort__nccl_config, f))
	ck_assert_uint_eq(sizeof(ncclUniqueId), sizeof(cohort__nccl_uid));
	ck_assert_uint_eq(sizeof(ncclComm_t), sizeof(cohort__nccl_comm_t));
	ck_assert_uint_eq(sizeof(ncclResult_t), sizeof(int));
	ck_assert_uint_eq(sizeof(ncclDataType_t), sizeof(int));
	ck_assert_uint_eq(sizeof(ncclRedOp_t), sizeof(int));
	ck_assert_uint_eq(sizeof(cudaStream_t), sizeof(void *));
	ck_assert_uint_eq(sizeof(cudaError_t), sizeof(int));
	ck_assert_int_eq(NCCL_VERSION_CODE, COHORT__NCCL_HEADER_VERSION);
	ck_assert_uint_eq(
	    sizeof(ncclConfig_t), sizeof(struct cohort__nccl_config));
	NT_OFF(size);
	NT_OFF(magic);
	NT_OFF(version);
	NT_OFF(blocking);
	NT_OFF(cgaClusterSize);
	NT_OFF(minCTAs);
	NT_OFF(maxCTAs);
	NT_OFF(netName);
	NT_OFF(splitShare);
	NT_OFF(trafficClass);
	NT_OFF(commName);
	NT_OFF(collnetEnable);
	NT_OFF(CTAPolicy);
	NT_OFF(shrinkShare);
	NT_OFF(nvlsCTAs);
	NT_OFF(nChannelsPerNetPeer);
	NT_OFF(nvlinkCentricSched);
#undef NT_OFF
	/* The initializer, byte for byte. */
	cohort__nccl_config_init(&ours);
	ck_assert_int_eq(memcmp(&real, &ours, sizeof(ours)), 0);

	ck_assert_int_eq(ncclSuccess, COHORT__NCCL_SUCCESS);
	ck_assert_int_eq(
	    ncclUnhandledCudaError, COHORT__NCCL_UNHANDLED_CUDA_ERROR);
	ck_assert_int_eq(ncclSystemError, COHORT__NCCL_SYSTEM_ERROR);
	ck_assert_int_eq(ncclInternalError, COHORT__NCCL_INTERNAL_ERROR);
	ck_assert_int_eq(ncclInvalidArgument, COHORT__NCCL_INVALID_ARGUMENT);
	ck_assert_int_eq(ncclInvalidUsage, COHORT__NCCL_INVALID_USAGE);
	ck_assert_int_eq(ncclRemoteError, COHORT__NCCL_REMOTE_ERROR);
	ck_assert_int_eq(ncclInProgress, COHORT__NCCL_IN_PROGRESS);
	ck_assert_int_eq(ncclSum, COHORT__NCCL_SUM);
	ck_assert_int_eq(ncclProd, COHORT__NCCL_PROD);
	ck_assert_int_eq(ncclMax, COHORT__NCCL_MAX);
	ck_assert_int_eq(ncclMin, COHORT__NCCL_MIN);
	ck_assert_int_eq(ncclAvg, COHORT__NCCL_AVG);
	ck_assert_int_eq(ncclInt8, COHORT__NCCL_INT8);
	ck_assert_int_eq(ncclUint8, COHORT__NCCL_UINT8);
	ck_assert_int_eq(ncclInt32, COHORT__NCCL_INT32);
	ck_assert_int_eq(ncclUint32, COHORT__NCCL_UINT32);
	ck_assert_int_eq(ncclInt64, COHORT__NCCL_INT64);
	ck_assert_int_eq(ncclUint64, COHORT__NCCL_UINT64);
	ck_assert_int_eq(ncclFloat16, COHORT__NCCL_FLOAT16);
	ck_assert_int_eq(ncclFloat32, COHORT__NCCL_FLOAT32);
	ck_assert_int_eq(ncclFloat64, COHORT__NCCL_FLOAT64);
	ck_assert_int_eq(ncclBfloat16, COHORT__NCCL_BFLOAT16);

	ck_assert_int_eq(cudaSuccess, COHORT__CUDA_SUCCESS);
	ck_assert_int_eq(
	    cudaErrorInvalidValue, COHORT__CUDA_ERR_INVALID_VALUE);
	ck_assert_int_eq(cudaErrorStubLibrary, COHORT__CUDA_ERR_STUB_LIBRARY);
	ck_assert_int_eq(
	    cudaErrorInsufficientDriver, COHORT__CUDA_ERR_INSUFFICIENT_DRIVER);
	ck_assert_int_eq(cudaErrorNoDevice, COHORT__CUDA_ERR_NO_DEVICE);
	ck_assert_int_eq(cudaErrorNotReady, COHORT__CUDA_ERR_NOT_READY);
	ck_assert_int_eq(cudaMemcpyDefault, COHORT__CUDA_MEMCPY_DEFAULT);
	ck_assert_int_eq(cudaMemcpyHostToDevice, COHORT__CUDA_MEMCPY_H2D);
	ck_assert_int_eq(cudaMemcpyDeviceToHost, COHORT__CUDA_MEMCPY_D2H);
	ck_assert_int_eq(cudaMemcpyDeviceToDevice, COHORT__CUDA_MEMCPY_D2D);
	ck_assert_int_eq(
	    cudaDevAttrMultiProcessorCount, COHORT__CUDA_ATTR_SM_COUNT);
	ck_assert_uint_eq(offsetof(struct cudaDeviceProp, name), 0);
	ck_assert_uint_le(
	    sizeof(struct cudaDeviceProp), COHORT__CUDA_PROP_BYTES);
	ck_assert_int_eq(
	    cudaEventDisableTiming, COHORT__CUDA_EVENT_DISABLE_TIMING);
	ck_assert_int_eq(
	    cudaStreamNonBlocking, COHORT__CUDA_STREAM_NON_BLOCKING);
	ck_assert_int_eq(
	    cudaMemoryTypeUnregistered, COHORT__CUDA_MEM_UNREGISTERED);
	ck_assert_int_eq(cudaMemoryTypeHost, COHORT__CUDA_MEM_HOST);
	ck_assert_int_eq(cudaMemoryTypeDevice, COHORT__CUDA_MEM_DEVICE);
	ck_assert_int_eq(cudaMemoryTypeManaged, COHORT__CUDA_MEM_MANAGED);
	ck_assert_uint_le(sizeof(struct cudaPointerAttributes),
	    sizeof(struct cohort__cuda_ptr_attr));
	ck_assert_uint_eq(offsetof(struct cudaPointerAttributes, type),
	    offsetof(struct cohort__cuda_ptr_attr, type));
	ck_assert_uint_eq(offsetof(struct cudaPointerAttributes, device),
	    offsetof(struct cohort__cuda_ptr_attr, device));
	ck_assert_uint_eq(
	    offsetof(struct cudaPointerAttributes, devicePointer),
	    offsetof(struct cohort__cuda_ptr_attr, device_pointer));
	ck_assert_uint_eq(offsetof(struct cudaPointerAttributes, hostPointer),
	    offsetof(struct cohort__cuda_ptr_attr, host_pointer));
#endif
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Always: unique-id exchange                                               */
/* ------------------------------------------------------------------------ */

static int
nt_gen_ok(cohort__nccl_uid *u)
{
	for (int i = 0; i < COHORT__NCCL_UID_BYTES; i++)
		u->internal[i] = (char)(i * 7 + 1);
	return (COHORT__NCCL_SUCCESS);
}

static int
nt_gen_fail(cohort__nccl_uid *u)
{
	return (COHORT__NCCL_SYSTEM_ERROR);
}

START_TEST(test_exchange_id)
{
	struct nt_store st;
	struct cohort__group_desc d0, d1;
	cohort__nccl_uid a, b, want;
	char err[NT_ERRLEN] = "";
	cohort__time dl = cohort__now_ms() + 2000;

	nt_store_init(&st);
	nt_desc(&d0, 0, 2, "g1", NULL);
	nt_desc(&d1, 1, 2, "g1", NULL);
	d0.store = d1.store = (struct cohort__store) {
		.ctx = &st, .set = nt_store_set, .get = nt_store_get
	};
	ck_assert_cohort_ok(cohort__nccl_exchange_id(
	    &d0, nt_gen_ok, &a, err, sizeof(err), dl));
	ck_assert_int_eq(st.n, 1);
	ck_assert_str_eq(st.key[0], "nccl/g1/7/uid");
	ck_assert_uint_eq(st.len[0], COHORT__NCCL_UID_BYTES);
	/* rank 1 never generates: a failing generator is not called. */
	ck_assert_cohort_ok(cohort__nccl_exchange_id(
	    &d1, nt_gen_fail, &b, err, sizeof(err), dl));
	nt_gen_ok(&want);
	ck_assert_int_eq(memcmp(&a, &want, sizeof(a)), 0);
	ck_assert_int_eq(memcmp(&b, &want, sizeof(b)), 0);
	ck_assert_int_eq(st.sets, 1);
	/* Another generation is another key. */
	d1.generation = 8;
	ck_assert_cohort_err(cohort__nccl_exchange_id(&d1, nt_gen_ok, &b, err,
	                         sizeof(err), cohort__now_ms() + 30),
	    COHORT_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(err, "nccl/g1/8/uid"));
	nt_store_fini(&st);
}
END_TEST

START_TEST(test_exchange_id_errors)
{
	struct nt_store st;
	struct cohort__group_desc d0, d1;
	cohort__nccl_uid u;
	char err[NT_ERRLEN] = "";

	nt_store_init(&st);
	nt_desc(&d0, 0, 2, "g2", NULL);
	nt_desc(&d1, 1, 2, "g2", NULL);
	d0.store = d1.store = (struct cohort__store) {
		.ctx = &st, .set = nt_store_set, .get = nt_store_get
	};
	ck_assert_cohort_err(cohort__nccl_exchange_id(&d0, nt_gen_fail, &u,
	                         err, sizeof(err), cohort__now_ms() + 1000),
	    COHORT_ENCCL);
	ck_assert_ptr_nonnull(strstr(err, "ncclSystemError"));
	ck_assert_int_eq(st.n, 0);
	ck_assert_cohort_ok(nt_store_set(&st, "nccl/g2/7/uid", "short", 5, 0));
	ck_assert_cohort_err(cohort__nccl_exchange_id(&d1, nt_gen_ok, &u, err,
	                         sizeof(err), cohort__now_ms() + 1000),
	    COHORT_EPROTO);
	ck_assert_ptr_nonnull(strstr(err, "5 bytes"));
	nt_store_fini(&st);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Always: the loader's ENOTSUP paths                                       */
/* ------------------------------------------------------------------------ */

static cohort_status
nt_init(const struct cohort__backend_ops *ops, int rank, int size,
    const char *gid, struct nt_store *st, atomic_int *flag, void **state,
    char *err, cohort__time deadline)
{
	struct cohort__group_desc d;

	nt_desc(&d, rank, size, gid, flag);
	d.store = (struct cohort__store) {
		.ctx = st, .set = nt_store_set, .get = nt_store_get
	};
	return (ops->init(&d, state, err, NT_ERRLEN, deadline));
}

/* Initialising backend ops at world size 1 fails with COHORT_ENOTSUP,
 * leaving no state; its text is in err (NT_ERRLEN). */
static void
nt_expect_unavailable(
    const struct cohort__backend_ops *ops, struct nt_store *st, char *err)
{
	void *state = NULL;

	ck_assert_cohort_err(nt_init(ops, 0, 1, "w", st, NULL, &state, err,
	                         cohort__now_ms() + 1000),
	    COHORT_ENOTSUP);
	ck_assert_ptr_null(state);
}

START_TEST(test_loader_missing_cudart)
{
	struct nt_store st;
	char err[NT_ERRLEN] = "";
	const char *want;
	int x = 0;

	setenv("COHORT_CUDART_LIB", "/nonexistent/libcudart.so.13", 1);
	nt_store_init(&st);
	nt_expect_unavailable(&cohort__nccl_backend, &st, err);
	want = "nccl backend unavailable: cannot load "
	       "/nonexistent/libcudart.so.13";
	ck_assert_msg(strncmp(err, want, strlen(want)) == 0, "err: %s", err);
	ck_assert_ptr_nonnull(strstr(err, "COHORT_CUDART_LIB"));
	nt_expect_unavailable(&cohort__staged_backend, &st, err);
	ck_assert_msg(
	    strncmp(err, "tcp-staged backend unavailable: ", 32) == 0,
	    "err: %s", err);
	ck_assert_int_eq(st.sets, 0);
	ck_assert(!cohort__is_device_ptr(&x));
	nt_store_fini(&st);
}
END_TEST

START_TEST(test_loader_missing_nccl)
{
	const struct cohort__dl_cudart *cu;
	struct nt_store st;
	char err[NT_ERRLEN] = "";
	bool gpu = cohort__dl_cudart_get(&cu, NULL, 0) == COHORT_OK;

	setenv("COHORT_NCCL_LIB", "/nonexistent/libnccl.so.2", 1);
	nt_store_init(&st);
	nt_expect_unavailable(&cohort__nccl_backend, &st, err);
	ck_assert_msg(strncmp(err, "nccl backend unavailable: ", 26) == 0,
	    "err: %s", err);
	if (gpu) /* else the missing driver is reported first */
		ck_assert_msg(strstr(err, "/nonexistent/libnccl.so.2") != NULL,
		    "err: %s", err);
	ck_assert_int_eq(st.sets, 0);
	nt_store_fini(&st);
}
END_TEST

/* Where there is no GPU, both backends say why; where there is one, they
 * initialise (world size 1). */
/* Elastic (backend.h v3): the nccl backend shrinks the survivors'
 * communicator with ncclCommShrink when every survivor's is intact;
 * without a state, a channel or exclusions it says ENOTSUP, leaving the
 * caller to re-create one. The shrink itself needs NCCL 2.27+ and one GPU
 * per rank (three: one lost, two left): "SKIP nccl shrink" below. */
START_TEST(test_shrink_refusals)
{
	struct cohort__group_desc d;
	void *out = NULL;
	char err[NT_ERRLEN] = "";
	int ex[1] = { 2 };

	ck_assert_uint_eq(cohort__nccl_backend.version, 3);
	ck_assert_ptr_nonnull(cohort__nccl_backend.shrink);
	memset(&d, 0, sizeof(d));
	d.size = 2;
	ck_assert_int_eq(cohort__nccl_backend.shrink(NULL, &d, ex, 1, &out,
	                     err, sizeof(err), cohort__now_ms() + 1000),
	    COHORT_ENOTSUP);
	ck_assert_ptr_null(out);
	ck_assert_ptr_nonnull(strstr(err, "ncclCommShrink"));
	/* the host-memory backends re-create (no shrink op) */
	ck_assert_ptr_null(cohort__host_backend.shrink);
	ck_assert_ptr_null(cohort__service_backend.shrink);
	printf("SKIP nccl shrink: ncclCommShrink across ranks needs NCCL "
	       "2.27+ and three GPUs; only its refusals are tested here\n");
}
END_TEST

START_TEST(test_loader_natural)
{
	const struct cohort__dl_cudart *cu;
	struct nt_store st;
	void *state = NULL;
	char why[NT_ERRLEN] = "";
	char err[NT_ERRLEN] = "";
	char want[2 * NT_ERRLEN];
	cohort_status gpu = cohort__dl_cudart_get(&cu, why, sizeof(why));
	int x = 0;

	nt_store_init(&st);
	ck_assert(!cohort__is_device_ptr(&x));
	ck_assert(!cohort__is_device_ptr(NULL));
	if (gpu != COHORT_OK) {
		ck_assert_int_eq(gpu, COHORT_ENOTSUP);
		ck_assert_msg(strncmp(why, "no CUDA", 7) == 0
		        || strncmp(why, "cannot load", 11) == 0
		        || strncmp(why, "CUDA unusable", 13) == 0,
		    "why: %s", why);
		nt_expect_unavailable(&cohort__nccl_backend, &st, err);
		snprintf(
		    want, sizeof(want), "nccl backend unavailable: %s", why);
		ck_assert_str_eq(err, want);
		nt_expect_unavailable(&cohort__staged_backend, &st, err);
		snprintf(want, sizeof(want),
		    "tcp-staged backend unavailable: %s", why);
		ck_assert_str_eq(err, want);
		ck_assert_ptr_null(state);
		/* The answer is remembered, not retried. */
		ck_assert_cohort_err(
		    cohort__dl_cudart_get(&cu, err, sizeof(err)),
		    COHORT_ENOTSUP);
		ck_assert_str_eq(err, why);
	} else {
		ck_assert_cohort_ok(nt_init(&cohort__staged_backend, 0, 1, "w",
		    &st, NULL, &state, err, cohort__now_ms() + 10000));
		cohort__staged_backend.fini(state);
	}
	ck_assert_int_eq(st.sets, 0);
	nt_store_fini(&st);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* GPU: world size 1                                                        */
/* ------------------------------------------------------------------------ */

struct nt_comm {
	struct nt_store st;
	atomic_int flag;
	void *state;
	const struct cohort__backend_ops *ops;
	uint64_t seq;
};

static void
nt_comm_open(struct nt_comm *c, const struct cohort__backend_ops *ops)
{
	char err[NT_ERRLEN] = "";
	cohort_status rv;

	nt_store_init(&c->st);
	atomic_init(&c->flag, 0);
	c->ops = ops;
	c->seq = 0;
	c->state = NULL;
	rv = nt_init(ops, 0, 1, "w1", &c->st, &c->flag, &c->state, err,
	    cohort__now_ms() + 60000);
	ck_assert_msg(rv == COHORT_OK, "%s init: %s: %s", ops->name,
	    cohort_status_name(rv), err);
}

static void
nt_comm_close(struct nt_comm *c)
{
	c->ops->fini(c->state);
	nt_store_fini(&c->st);
}

static cohort_status
nt_run(struct nt_comm *c, struct cohort__op *op, char *err, int ms)
{
	op->seq = ++c->seq;
	return (
	    c->ops->run(c->state, op, err, NT_ERRLEN, cohort__now_ms() + ms));
}

/* Fills n elements of dt with small exact values (integers in every
 * type, so sums and means are exact at world size 1). */
static void
nt_fill(void *h, cohort_dtype dt, size_t n, int seed)
{
	for (size_t i = 0; i < n; i++) {
		int v = (int)((i * 7 + (size_t)seed * 13) % 61) - 20;

		cohort__elem_store(h, i, dt, v,
		    (uint64_t)(int64_t)(dt == COHORT_U8 ? v + 20 : v));
	}
}

/* One collective at world size 1 on device buffers: the result must be
 * the input, moved where the collective puts it. */
static void
nt_check_one(struct nt_comm *c, enum cohort__op_kind kind, cohort_dtype dt,
    cohort_redop rop, size_t n, bool inplace, void *stream)
{
	size_t es = cohort_dtype_size(dt);
	size_t bytes = n * es;
	uint8_t *in = malloc(bytes);
	uint8_t *out = malloc(bytes);
	uint8_t *dsend = nt_dev(bytes);
	uint8_t *drecv = inplace ? dsend : nt_dev(bytes);
	size_t counts[1] = { n };
	struct cohort__op op;
	char err[NT_ERRLEN] = "";
	cohort_status rv;

	nt_fill(in, dt, n, (int)kind);
	nt_h2d(dsend, in, bytes);
	if (!inplace) {
		/* cudaMemset is asynchronous on the legacy stream: finished
		 * before the collective on a non-blocking stream writes. */
		ck_assert_int_eq(nt_cu->Memset(drecv, 0xa5, bytes), 0);
		ck_assert_int_eq(nt_cu->DeviceSynchronize(), 0);
	}
	memset(&op, 0, sizeof(op));
	op.kind = kind;
	op.send = dsend;
	op.recv = drecv;
	op.count = n;
	op.counts = counts;
	op.dtype = dt;
	op.op = rop;
	op.root = 0;
	op.stream = stream;
	if (kind == COHORT__OP_BROADCAST)
		op.recv = dsend;
	rv = nt_run(c, &op, err, 30000);
	ck_assert_msg(rv == COHORT_OK, "%s kind %d %s %s n=%zu%s: %s: %s",
	    c->ops->name, (int)kind, cohort_dtype_name(dt),
	    cohort_redop_name(rop), n, inplace ? " in place" : "",
	    cohort_status_name(rv), err);
	nt_d2h(out, kind == COHORT__OP_BROADCAST ? dsend : drecv, bytes);
	ck_assert_msg(memcmp(in, out, bytes) == 0,
	    "%s kind %d %s %s n=%zu%s: wrong result", c->ops->name, (int)kind,
	    cohort_dtype_name(dt), cohort_redop_name(rop), n,
	    inplace ? " in place" : "");
	nt_cu->Free(dsend);
	if (!inplace)
		nt_cu->Free(drecv);
	free(in);
	free(out);
}

static void
nt_check_all(const struct cohort__backend_ops *ops)
{
	static const enum cohort__op_kind kinds[] = { COHORT__OP_ALLREDUCE,
		COHORT__OP_REDUCE, COHORT__OP_BROADCAST, COHORT__OP_ALLGATHER,
		COHORT__OP_ALLGATHERV, COHORT__OP_REDUCE_SCATTER,
		COHORT__OP_ALLTOALL, COHORT__OP_GATHER, COHORT__OP_SCATTER };
	struct nt_comm c;
	struct cohort__op op;
	char err[NT_ERRLEN] = "";
	void *stream = NULL;
	size_t sizes[] = { 1, 1000, 1 << 20 };

	nt_comm_open(&c, ops);
	ck_assert_int_eq(nt_cu->StreamCreateWithFlags(
	                     &stream, COHORT__CUDA_STREAM_NON_BLOCKING),
	    0);
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
		for (int dt = 0; dt < COHORT_DTYPE_COUNT; dt++)
			for (size_t z = 0; z < 3; z++)
				nt_check_one(&c, kinds[k], (cohort_dtype)dt,
				    COHORT_SUM, sizes[z], false,
				    z == 1 ? NULL : stream);
	for (int rop = 0; rop < COHORT_REDOP_COUNT; rop++) {
		nt_check_one(&c, COHORT__OP_ALLREDUCE, COHORT_F32,
		    (cohort_redop)rop, 4096, false, stream);
		nt_check_one(&c, COHORT__OP_ALLREDUCE, COHORT_BF16,
		    (cohort_redop)rop, 4096, true, stream);
		nt_check_one(&c, COHORT__OP_REDUCE_SCATTER, COHORT_F16,
		    (cohort_redop)rop, 4096, true, stream);
	}
	for (size_t k = 0; k < sizeof(kinds) / sizeof(kinds[0]); k++)
		if (kinds[k] != COHORT__OP_ALLTOALL)
			nt_check_one(&c, kinds[k], COHORT_F32, COHORT_SUM, 777,
			    true, stream);
	memset(&op, 0, sizeof(op));
	op.kind = COHORT__OP_BARRIER;
	op.stream = stream;
	ck_assert_cohort_ok(nt_run(&c, &op, err, 30000));
	/* count 0 completes without traffic. */
	memset(&op, 0, sizeof(op));
	op.kind = COHORT__OP_ALLREDUCE;
	op.dtype = COHORT_F32;
	op.stream = stream;
	ck_assert_cohort_ok(nt_run(&c, &op, err, 30000));
	ck_assert_int_eq(nt_cu->StreamDestroy(stream), 0);
	nt_comm_close(&c);
}

START_TEST(test_nccl_collectives_w1)
{
	if (!nt_gpu(true))
		return;
	nt_check_all(&cohort__nccl_backend);
}
END_TEST

START_TEST(test_staged_collectives_w1)
{
	if (!nt_gpu(false))
		return;
	nt_check_all(&cohort__staged_backend);
}
END_TEST

START_TEST(test_device_ptr_probe)
{
	void *d;
	void *h = NULL;
	int x = 0;

	if (!nt_gpu(false))
		return;
	d = nt_dev(256);
	ck_assert(cohort__is_device_ptr(d));
	ck_assert(cohort__is_device_ptr((char *)d + 100));
	ck_assert(!cohort__is_device_ptr(&x));
	ck_assert_int_eq(nt_cu->MallocHost(&h, 256), 0);
	ck_assert(!cohort__is_device_ptr(h));
	nt_cu->FreeHost(h);
	nt_cu->Free(d);
}
END_TEST

START_TEST(test_nccl_init_expired)
{
	struct nt_store st;
	void *state = NULL;
	char err[NT_ERRLEN] = "";
	int64_t t0;

	if (!nt_gpu(true))
		return;
	nt_store_init(&st);
	t0 = th_now_ms();
	ck_assert_cohort_err(nt_init(&cohort__nccl_backend, 0, 1, "late", &st,
	                         NULL, &state, err, cohort__now_ms() - 1),
	    COHORT_ETIMEDOUT);
	ck_assert_int_lt(th_now_ms() - t0, 2000);
	ck_assert_ptr_null(state);
	ck_assert_ptr_nonnull(strstr(err, "deadline"));
	nt_store_fini(&st);
}
END_TEST

/* Rank 0 of 2 with no rank 1: the non-blocking init polls until the
 * deadline, then ncclCommAbort. */
START_TEST(test_nccl_init_missing_peer)
{
	struct nt_store st;
	void *state = NULL;
	char err[NT_ERRLEN] = "";
	int64_t t0, el;

	if (!nt_gpu(true))
		return;
	nt_store_init(&st);
	t0 = th_now_ms();
	ck_assert_cohort_err(
	    nt_init(&cohort__nccl_backend, 0, 2, "lonely", &st, NULL, &state,
	        err, cohort__now_ms() + 1500),
	    COHORT_ETIMEDOUT);
	el = th_now_ms() - t0;
	ck_assert_int_ge(el, 1400);
	ck_assert_msg(el < 15000, "init took %" PRId64 " ms", el);
	ck_assert_ptr_nonnull(strstr(err, "deadline"));
	ck_assert_int_eq(st.sets, 1); /* rank 0 published its id */
	printf("nccl init with a missing peer: ETIMEDOUT after %" PRId64
	       " ms (deadline 1500 ms)\n",
	    el);
	nt_store_fini(&st);
}
END_TEST

static void
nt_host_sleep(void *arg)
{
	usleep((useconds_t)(intptr_t)arg * 1000);
}

struct nt_aborter {
	struct nt_comm *c;
	int after_ms;
	bool use_flag;
	int64_t at;
};

static void *
nt_abort_thread(void *arg)
{
	struct nt_aborter *a = arg;

	usleep((useconds_t)a->after_ms * 1000);
	a->at = th_now_ms();
	if (a->use_flag)
		atomic_store_explicit(&a->c->flag, 1, memory_order_release);
	else
		a->c->ops->abort(a->c->state);
	return (NULL);
}

/* The stream is held by a 1.5 s host function, so run() polls; abort()
 * from another thread after 200 ms must end it with EABORTED. */
static void
nt_abort_while_polling(const struct cohort__backend_ops *ops, bool use_flag)
{
	struct nt_comm c;
	struct nt_aborter a;
	struct cohort__op op;
	pthread_t th;
	void *stream = NULL;
	float *d;
	char err[NT_ERRLEN] = "";
	int64_t t0, done;

	nt_comm_open(&c, ops);
	d = nt_dev(1 << 20);
	ck_assert_int_eq(nt_cu->StreamCreateWithFlags(
	                     &stream, COHORT__CUDA_STREAM_NON_BLOCKING),
	    0);
	ck_assert_int_eq(nt_cu->LaunchHostFunc(
	                     stream, nt_host_sleep, (void *)(intptr_t)1500),
	    0);
	memset(&op, 0, sizeof(op));
	op.kind = COHORT__OP_ALLREDUCE;
	op.send = op.recv = d;
	op.count = (1 << 20) / sizeof(float);
	op.dtype = COHORT_F32;
	op.op = COHORT_SUM;
	op.stream = stream;
	a = (struct nt_aborter) { &c, 200, use_flag, 0 };
	t0 = th_now_ms();
	ck_assert_int_eq(pthread_create(&th, NULL, nt_abort_thread, &a), 0);
	ck_assert_cohort_err(nt_run(&c, &op, err, 60000), COHORT_EABORTED);
	done = th_now_ms();
	pthread_join(th, NULL);
	ck_assert_ptr_nonnull(strstr(err, "abort"));
	printf("%s: abort() after %" PRId64 " ms -> EABORTED %" PRId64
	       " ms later (stream held 1500 ms)\n",
	    ops->name, a.at - t0, done - a.at);
	ck_assert_msg(done - t0 < 1500 + 2000,
	    "run returned after %" PRId64 " ms", done - t0);
	/* Sticky (nccl) or still aborted (staged). */
	ck_assert_cohort_err(nt_run(&c, &op, err, 1000), COHORT_EABORTED);
	ck_assert_int_eq(nt_cu->StreamSynchronize(stream), 0);
	ck_assert_int_eq(nt_cu->StreamDestroy(stream), 0);
	nt_cu->Free(d);
	nt_comm_close(&c);
}

START_TEST(test_nccl_abort_thread)
{
	if (!nt_gpu(true))
		return;
	nt_abort_while_polling(&cohort__nccl_backend, false);
}
END_TEST

START_TEST(test_nccl_abort_flag)
{
	if (!nt_gpu(true))
		return;
	nt_abort_while_polling(&cohort__nccl_backend, true);
}
END_TEST

START_TEST(test_staged_abort_thread)
{
	if (!nt_gpu(false))
		return;
	nt_abort_while_polling(&cohort__staged_backend, false);
}
END_TEST

/* A run whose stream is held past its deadline: ETIMEDOUT, then sticky. */
START_TEST(test_nccl_run_deadline)
{
	struct nt_comm c;
	struct cohort__op op;
	void *stream = NULL;
	float *d;
	char err[NT_ERRLEN] = "";
	int64_t t0;

	if (!nt_gpu(true))
		return;
	nt_comm_open(&c, &cohort__nccl_backend);
	d = nt_dev(4096);
	ck_assert_int_eq(nt_cu->StreamCreateWithFlags(
	                     &stream, COHORT__CUDA_STREAM_NON_BLOCKING),
	    0);
	ck_assert_int_eq(nt_cu->LaunchHostFunc(
	                     stream, nt_host_sleep, (void *)(intptr_t)1000),
	    0);
	memset(&op, 0, sizeof(op));
	op.kind = COHORT__OP_ALLREDUCE;
	op.send = op.recv = d;
	op.count = 1024;
	op.dtype = COHORT_F32;
	op.stream = stream;
	t0 = th_now_ms();
	ck_assert_cohort_err(nt_run(&c, &op, err, 200), COHORT_ETIMEDOUT);
	ck_assert_int_lt(th_now_ms() - t0, 1000 + 2000);
	ck_assert_ptr_nonnull(strstr(err, "deadline"));
	ck_assert_cohort_err(nt_run(&c, &op, err, 1000), COHORT_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(err, "failed earlier"));
	ck_assert_int_eq(nt_cu->StreamSynchronize(stream), 0);
	ck_assert_int_eq(nt_cu->StreamDestroy(stream), 0);
	nt_cu->Free(d);
	nt_comm_close(&c);
}
END_TEST

START_TEST(test_nccl_bad_args)
{
	struct nt_comm c;
	struct cohort__op op;
	float host[64];
	float *d;
	char err[NT_ERRLEN] = "";

	if (!nt_gpu(true))
		return;
	nt_comm_open(&c, &cohort__nccl_backend);
	d = nt_dev(sizeof(host));
	memset(&op, 0, sizeof(op));
	op.kind = COHORT__OP_ALLREDUCE;
	op.send = host;
	op.recv = d;
	op.count = 64;
	op.dtype = COHORT_F32;
	ck_assert_cohort_err(nt_run(&c, &op, err, 5000), COHORT_EINVAL);
	ck_assert_msg(strstr(err, "host memory") != NULL, "err: %s", err);
	op.send = d;
	op.recv = NULL;
	ck_assert_cohort_err(nt_run(&c, &op, err, 5000), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "NULL"));
	op.recv = d;
	op.dtype = (cohort_dtype)99;
	ck_assert_cohort_err(nt_run(&c, &op, err, 5000), COHORT_EINVAL);
	op.dtype = COHORT_F32;
	op.op = (cohort_redop)42;
	ck_assert_cohort_err(nt_run(&c, &op, err, 5000), COHORT_EINVAL);
	op.op = COHORT_SUM;
	op.kind = COHORT__OP_BROADCAST;
	op.root = 3;
	ck_assert_cohort_err(nt_run(&c, &op, err, 5000), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(err, "root"));
	/* The communicator is still usable. */
	op.kind = COHORT__OP_ALLREDUCE;
	op.root = 0;
	ck_assert_cohort_ok(nt_run(&c, &op, err, 30000));
	nt_cu->Free(d);
	nt_comm_close(&c);
}
END_TEST

/* ------------------------------------------------------------------------ */
/* GPU: tcp-staged, several processes on one GPU                            */
/* ------------------------------------------------------------------------ */

#define NT_RANK_SKIP 77

static bool nt_skip_printed;

struct nt_ranks {
	char dir[64];
	int n;
};

/* Removes the file store's directory (flat: files only). */
static void
nt_rmdir(const char *dir)
{
	DIR *d = opendir(dir);
	struct dirent *e;
	char path[512];

	if (d == NULL)
		return;
	while ((e = readdir(d)) != NULL) {
		if (e->d_name[0] == '.')
			continue;
		snprintf(path, sizeof(path), "%s/%s", dir, e->d_name);
		(void)unlink(path);
	}
	closedir(d);
	(void)rmdir(dir);
}

/* Work of one rank in its own process; returns its exit code. */
typedef int (*nt_rank_fn)(const struct nt_ranks *r, int rank, void *arg);

/* Forks n ranks (none touches CUDA before the fork), waits for all;
 * returns true if every rank passed, false after printing the SKIP line
 * when they found no GPU. */
static bool
nt_run_ranks(int n, nt_rank_fn fn, void *arg, int timeout_ms)
{
	struct nt_ranks r;
	pid_t pids[8];
	int skips = 0;

	ck_assert_int_le(n, 8);
	snprintf(r.dir, sizeof(r.dir), "/tmp/cohort-nt-XXXXXX");
	ck_assert_ptr_nonnull(mkdtemp(r.dir));
	r.n = n;
	fflush(stdout);
	fflush(stderr);
	for (int i = 0; i < n; i++) {
		pids[i] = fork();
		ck_assert_int_ge(pids[i], 0);
		if (pids[i] == 0)
			_exit(fn(&r, i, arg));
	}
	for (int i = 0; i < n; i++) {
		int status = 0;

		if (!th_wait(pids[i], timeout_ms, &status)) {
			for (int j = 0; j < n; j++)
				th_kill(pids[j]);
			ck_abort_msg(
			    "rank %d did not finish in %d ms", i, timeout_ms);
		}
		if (th_exit_code(status) == NT_RANK_SKIP)
			skips++;
		else
			ck_assert_msg(th_exit_code(status) == 0,
			    "rank %d of %d failed (exit %d)", i, n,
			    th_exit_code(status));
	}
	nt_rmdir(r.dir);
	if (skips > 0) {
		const struct cohort__dl_cudart *cu;
		char why[NT_ERRLEN] = "";

		ck_assert_int_eq(skips, n);
		if (!nt_skip_printed) { /* one line per test case */
			/* The ranks are gone: asking here is safe now. */
			(void)cohort__dl_cudart_get(&cu, why, sizeof(why));
			printf("SKIP nccl backend: no GPU (%s)\n", why);
			fflush(stdout);
			nt_skip_printed = true;
		}
		return (false);
	}
	return (true);
}

static cohort_status
nt_rank_init(const struct cohort__backend_ops *ops, const struct nt_ranks *r,
    int rank, const char *gid, atomic_int *flag, void **state, char *err)
{
	struct cohort__group_desc d;

	nt_desc(&d, rank, r->n, gid, flag);
	d.store = (struct cohort__store) { .ctx = (void *)r->dir,
		.set = nt_fstore_set,
		.get = nt_fstore_get };
	return (
	    ops->init(&d, state, err, NT_ERRLEN, cohort__now_ms() + 30000));
}

/* Rank r contributes x[i] = r + 1 + i % 5 (f32); the all-reduce sum and
 * mean are exact. Then an allgatherv with counts r + 1. */
static int
nt_staged_rank(const struct nt_ranks *r, int rank, void *arg)
{
	const struct cohort__dl_cudart *cu;
	atomic_int flag;
	void *state = NULL;
	char err[NT_ERRLEN] = "";
	size_t n = 300000;
	float *h = malloc(n * sizeof(float));
	float *d = NULL;
	struct cohort__op op;
	size_t counts[8];
	size_t total = 0;
	int bad = 0;

	if (cohort__dl_cudart_get(&cu, NULL, 0) != COHORT_OK)
		return (NT_RANK_SKIP);
	atomic_init(&flag, 0);
	if (nt_rank_init(
	        &cohort__staged_backend, r, rank, "staged", &flag, &state, err)
	    != COHORT_OK) {
		fprintf(stderr, "rank %d: init: %s\n", rank, err);
		return (1);
	}
	for (size_t i = 0; i < n; i++)
		h[i] = (float)(rank + 1) + (float)(i % 5);
	if (cu->Malloc((void **)&d, n * sizeof(float)) != 0
	    || cu->Memcpy(d, h, n * sizeof(float), 4) != 0)
		return (2);
	for (int mean = 0; mean < 2; mean++) {
		memset(&op, 0, sizeof(op));
		op.kind = COHORT__OP_ALLREDUCE;
		op.send = op.recv = d;
		op.count = n;
		op.dtype = COHORT_F32;
		op.op = mean ? COHORT_MEAN : COHORT_SUM;
		op.seq = (uint64_t)mean + 1;
		if (cohort__staged_backend.run(
		        state, &op, err, sizeof(err), cohort__now_ms() + 30000)
		    != COHORT_OK) {
			fprintf(stderr, "rank %d: allreduce: %s\n", rank, err);
			return (3);
		}
	}
	/* sum: S_i = n(n+1)/2 + n(i%5); mean of identical sums = S_i. */
	cu->Memcpy(h, d, n * sizeof(float), 4);
	for (size_t i = 0; i < n && bad < 5; i++) {
		float want = (float)(r->n * (r->n + 1) / 2)
		    + (float)r->n * (float)(i % 5);

		if (h[i] != want) {
			fprintf(stderr, "rank %d: x[%zu] = %g, want %g\n",
			    rank, i, (double)h[i], (double)want);
			bad++;
		}
	}
	for (int p = 0; p < r->n; p++) {
		counts[p] = (size_t)p + 1;
		total += counts[p];
	}
	{
		float *gv = NULL;
		float in[8], out[64];

		for (int k = 0; k < rank + 1; k++)
			in[k] = (float)(rank * 10 + k);
		cu->Malloc((void **)&gv, total * sizeof(float));
		cu->Memcpy(gv, in, (size_t)(rank + 1) * sizeof(float), 4);
		memset(&op, 0, sizeof(op));
		op.kind = COHORT__OP_ALLGATHERV;
		op.send = gv; /* input at recv[0]: the in-place form */
		op.recv = gv;
		op.counts = counts;
		op.dtype = COHORT_F32;
		op.seq = 3;
		if (cohort__staged_backend.run(
		        state, &op, err, sizeof(err), cohort__now_ms() + 30000)
		    != COHORT_OK) {
			fprintf(
			    stderr, "rank %d: allgatherv: %s\n", rank, err);
			return (4);
		}
		cu->Memcpy(out, gv, total * sizeof(float), 4);
		for (int p = 0, o = 0; p < r->n; p++)
			for (int k = 0; k < p + 1; k++, o++)
				if (out[o] != (float)(p * 10 + k))
					bad++;
		cu->Free(gv);
	}
	cohort__staged_backend.fini(state);
	cu->Free(d);
	free(h);
	return (bad == 0 ? 0 : 5);
}

START_TEST(test_staged_multi)
{
	int n = _i; /* 2, 3 */

	if (!nt_run_ranks(n, nt_staged_rank, NULL, 60000))
		return;
}
END_TEST

/* ------------------------------------------------------------------------ */
/* Benchmark (suite nccl_bench)                                             */
/* ------------------------------------------------------------------------ */

static const size_t nt_bench_bytes[] = { 4096, 1 << 20, 64 << 20 };
#define NT_BENCH_SIZES (sizeof(nt_bench_bytes) / sizeof(nt_bench_bytes[0]))

/* op: an in-place f32 sum all-reduce of buf's bytes. */
static void
nt_bench_op(struct cohort__op *op, void *buf, size_t bytes)
{
	memset(op, 0, sizeof(*op));
	op->kind = COHORT__OP_ALLREDUCE;
	op->send = op->recv = buf;
	op->count = bytes / sizeof(float);
	op->dtype = COHORT_F32;
	op->op = COHORT_SUM;
}

static int
nt_bench_iters(size_t bytes)
{
	return (bytes >= (32u << 20) ? 10 : 50);
}

/* Times all-reduce (f32 sum) through ops on device (gpu) or host memory;
 * rank 0 prints the rows. */
static int
nt_bench_rank_ops(const struct cohort__backend_ops *ops, const char *path,
    bool gpu, const struct nt_ranks *r, int rank, void *state)
{
	const struct cohort__dl_cudart *cu = NULL;
	char err[NT_ERRLEN] = "";
	uint64_t seq = 0;

	if (gpu && cohort__dl_cudart_get(&cu, NULL, 0) != COHORT_OK)
		return (NT_RANK_SKIP);
	for (size_t z = 0; z < NT_BENCH_SIZES; z++) {
		size_t bytes = nt_bench_bytes[z];
		int iters = nt_bench_iters(bytes);
		void *buf = NULL;
		struct cohort__op op;
		uint64_t t0 = 0;

		if (gpu) {
			if (cu->Malloc(&buf, bytes) != 0
			    || cu->Memset(buf, 0, bytes) != 0)
				return (2);
		} else if ((buf = calloc(1, bytes)) == NULL) {
			return (2);
		}
		nt_bench_op(&op, buf, bytes);
		for (int it = -3; it < iters; it++) {
			if (it == 0)
				t0 = cohort__now_ns();
			op.seq = ++seq;
			if (ops->run(state, &op, err, sizeof(err),
			        cohort__now_ms() + 60000)
			    != COHORT_OK) {
				fprintf(stderr, "rank %d: %s: %s\n", rank,
				    path, err);
				return (3);
			}
		}
		if (rank == 0) {
			double us
			    = (double)(cohort__now_ns() - t0) / 1e3 / iters;

			printf("| %-10s | %5d | %10zu | %10.1f | %8.2f |\n",
			    path, r->n, bytes, us, (double)bytes / us / 1e3);
			fflush(stdout);
		}
		if (gpu)
			cu->Free(buf);
		else
			free(buf);
	}
	return (0);
}

static int
nt_bench_rank(const struct nt_ranks *r, int rank, void *arg)
{
	const char *path = arg;
	const struct cohort__backend_ops *ops;
	atomic_int flag;
	void *state = NULL;
	char err[NT_ERRLEN] = "";
	bool gpu = strcmp(path, "tcp") != 0;
	int rc;

	if (strcmp(path, "nccl") == 0)
		ops = &cohort__nccl_backend;
	else if (strcmp(path, "tcp-staged") == 0)
		ops = &cohort__staged_backend;
	else
		ops = &cohort__tcp_backend;
	if (gpu) {
		const struct cohort__dl_cudart *cu;

		if (cohort__dl_cudart_get(&cu, NULL, 0) != COHORT_OK)
			return (NT_RANK_SKIP);
	}
	atomic_init(&flag, 0);
	if (nt_rank_init(ops, r, rank, path, &flag, &state, err)
	    != COHORT_OK) {
		fprintf(stderr, "rank %d: %s init: %s\n", rank, path, err);
		return (1);
	}
	rc = nt_bench_rank_ops(ops, path, gpu, r, rank, state);
	ops->fini(state);
	return (rc);
}

/* NCCL through the backend against NCCL called directly, at world size 1
 * on one device buffer (in place, f32 sum), each call waited for (the
 * backend's run() returns when the work is done: the raw loop
 * synchronizes the stream after every call to match). The two
 * alternate in rounds so that both see the same clocks; rank 0 prints
 * the median of the rounds' per-call times and their ratio, and the raw
 * loop with one synchronize per round (what nccl-tests reports). */
#define NT_RAW_ROUNDS 7

static int
nt_cmp_double(const void *a, const void *b)
{
	double x = *(const double *)a, y = *(const double *)b;

	return ((x > y) - (x < y));
}

static double
nt_median(double *v, int n)
{
	qsort(v, (size_t)n, sizeof(*v), nt_cmp_double);
	return (v[n / 2]);
}

static int
nt_raw_rank(const struct nt_ranks *r, int rank, void *arg)
{
	static const size_t sizes[]
	    = { 4096, 65536, 1 << 20, 16 << 20, 64 << 20, 256 << 20 };
	const struct cohort__backend_ops *ops = &cohort__nccl_backend;
	const struct cohort__dl_cudart *cu;
	const struct cohort__dl_nccl *nc;
	cohort__nccl_comm_t comm = NULL;
	cohort__nccl_uid uid;
	atomic_int flag;
	void *state = NULL;
	char err[NT_ERRLEN] = "";
	uint64_t seq = 0;

	(void)arg;
	if (cohort__dl_cudart_get(&cu, NULL, 0) != COHORT_OK)
		return (NT_RANK_SKIP);
	atomic_init(&flag, 0);
	if (nt_rank_init(ops, r, rank, "raw", &flag, &state, err)
	    != COHORT_OK) {
		fprintf(stderr, "nccl init: %s\n", err);
		return (1);
	}
	if (cohort__dl_nccl_get(&nc, err, sizeof(err)) != COHORT_OK
	    || nc->GetUniqueId(&uid) != COHORT__NCCL_SUCCESS
	    || nc->CommInitRankConfig(&comm, 1, uid, 0, NULL)
	        != COHORT__NCCL_SUCCESS) {
		fprintf(stderr, "raw NCCL init failed: %s\n", err);
		return (1);
	}
	printf("| %10s | %10s | %10s | %8s | %12s |\n", "bytes", "raw us/op",
	    "cohort us", "ratio", "raw batched");
	printf("|------------|------------|------------|----------|"
	       "--------------|\n");
	for (size_t z = 0; z < sizeof(sizes) / sizeof(sizes[0]); z++) {
		size_t bytes = sizes[z];
		int iters = bytes >= (64u << 20) ? 10 : 100;
		double raw[NT_RAW_ROUNDS], coh[NT_RAW_ROUNDS],
		    batched[NT_RAW_ROUNDS];
		struct cohort__op op;
		void *buf = NULL;

		if (cu->Malloc(&buf, bytes) != 0
		    || cu->Memset(buf, 0, bytes) != 0)
			return (2);
		nt_bench_op(&op, buf, bytes);
		for (int round = -1; round < NT_RAW_ROUNDS; round++) {
			uint64_t t0 = cohort__now_ns();

			for (int i = 0; i < iters; i++) {
				if (nc->AllReduce(buf, buf, op.count,
				        cohort__nccl_dtype(COHORT_F32),
				        COHORT__NCCL_SUM, comm, NULL)
				        != COHORT__NCCL_SUCCESS
				    || cu->StreamSynchronize(NULL) != 0)
					return (3);
			}
			uint64_t t1 = cohort__now_ns();
			for (int i = 0; i < iters; i++) {
				op.seq = ++seq;
				if (ops->run(state, &op, err, sizeof(err),
				        cohort__now_ms() + 60000)
				    != COHORT_OK) {
					fprintf(stderr, "nccl: %s\n", err);
					return (3);
				}
			}
			uint64_t t2 = cohort__now_ns();
			for (int i = 0; i < iters; i++) {
				if (nc->AllReduce(buf, buf, op.count,
				        cohort__nccl_dtype(COHORT_F32),
				        COHORT__NCCL_SUM, comm, NULL)
				    != COHORT__NCCL_SUCCESS)
					return (3);
			}
			if (cu->StreamSynchronize(NULL) != 0)
				return (3);
			uint64_t t3 = cohort__now_ns();
			if (round < 0) /* warm-up */
				continue;
			raw[round] = (double)(t1 - t0) / 1e3 / iters;
			coh[round] = (double)(t2 - t1) / 1e3 / iters;
			batched[round] = (double)(t3 - t2) / 1e3 / iters;
		}
		double mr = nt_median(raw, NT_RAW_ROUNDS);
		double mc = nt_median(coh, NT_RAW_ROUNDS);

		printf("| %10zu | %10.2f | %10.2f | %8.3f | %12.2f |\n", bytes,
		    mr, mc, mc / mr, nt_median(batched, NT_RAW_ROUNDS));
		fflush(stdout);
		cu->Free(buf);
	}
	(void)nc->CommDestroy(comm);
	ops->fini(state);
	return (0);
}

START_TEST(test_bench_nccl_vs_raw)
{
	printf("NCCL through cohort against raw NCCL (world size 1, in "
	       "place, f32 sum; medians of %d alternating rounds)\n",
	    NT_RAW_ROUNDS);
	(void)nt_run_ranks(1, nt_raw_rank, NULL, 240000);
}
END_TEST

START_TEST(test_bench_allreduce)
{
	static const struct {
		const char *path;
		int n;
	} runs[] = { { "nccl", 1 }, { "tcp-staged", 1 }, { "tcp-staged", 2 },
		{ "tcp-staged", 4 }, { "tcp", 2 }, { "tcp", 4 } };

	printf("| %-10s | %5s | %10s | %10s | %8s |\n", "path", "ranks",
	    "bytes", "us/op", "GB/s");
	printf("|------------|-------|------------|------------|"
	       "----------|\n");
	/* The host-memory tcp rows run everywhere; GPU rows skip. */
	for (size_t i = 0; i < sizeof(runs) / sizeof(runs[0]); i++)
		(void)nt_run_ranks(
		    runs[i].n, nt_bench_rank, (void *)runs[i].path, 240000);
}
END_TEST

Suite *
suite_nccl(void)
{
	Suite *s = suite_create("nccl");
	TCase *g;

	th_suite_case(s, "always", 30, NULL, NULL, test_dtype_map,
	    test_redop_map, test_version_text, test_config_init,
	    test_abi_headers, test_exchange_id, test_exchange_id_errors,
	    test_loader_missing_cudart, test_loader_missing_nccl,
	    test_loader_natural, test_shrink_refusals, NULL);
	g = th_suite_case(s, "gpu", 120, NULL, NULL, test_nccl_collectives_w1,
	    test_staged_collectives_w1, test_device_ptr_probe,
	    test_nccl_init_expired, test_nccl_init_missing_peer,
	    test_nccl_abort_thread, test_nccl_abort_flag,
	    test_staged_abort_thread, test_nccl_run_deadline,
	    test_nccl_bad_args, NULL);
	tcase_add_loop_test(g, test_staged_multi, 2, 4);
	return (s);
}

Suite *
suite_nccl_bench(void)
{
	return (th_suite("nccl_bench", "allreduce", 500, NULL, NULL,
	    test_bench_allreduce, test_bench_nccl_vs_raw, NULL));
}
