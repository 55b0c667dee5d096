/*
 * tcp_fixture.h - what the tcp backend's suites share (test_tcp.c,
 * test_tcp_xfer.c, test_tcp_algos.c, test_tcp_shm.c, test_tcp_handshake.c,
 * one per source file of client/backend/tcp/): N threads play the ranks of
 * a group (gloo transport tests), rendezvousing through an in-memory store;
 * two ranks in different processes rendezvous through a directory
 * (fs_store.h).
 *
 * Every data-path test runs in the modes of tt_mode: the same-host
 * shared-memory allreduce (the default; threads of one process qualify),
 * pure TCP (COHORT_TCP_SHM=0) and a mix (shared memory only from 64 KiB,
 * so small and large allreduces interleave on the two paths, and there
 * every all-reduce reads the others' buffers by cross-memory attach; the
 * shared-memory mode stages every size).
 *
 * Inputs are generated from (seed, rank, index) by every thread, so each
 * rank computes the reference of its own output independently, in double
 * (integers: exact wrapping arithmetic). Float inputs are small multiples of
 * 1/4 (sums) or powers of two (products), so results are exact in every
 * float dtype and compared bit for bit, except MEAN (one rounding).
 */
#ifndef COHORT_TCP_FIXTURE_H
#define COHORT_TCP_FIXTURE_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stdint.h>
#include <stdlib.h>
#include <sys/types.h>

#include "backend/backend.h"
#include "backend/host/host_impl.h"
#include "check_cohort.h"
#include "dtype_elem.h"
#include "fs_store.h"
#include "th_worker.h"

#define TT_MAX_RANKS 8
#define TT_ERRLEN 512

/* Collective checks that failed in a group's threads (printed on stderr
 * as they happen). */
#define tt_assert_no_failures(g)                                              \
	do {                                                                  \
		int f_ = atomic_load(&(g)->failures);                         \
		ck_assert_msg(f_ == 0,                                        \
		    "%d collective checks failed in "                         \
		    "group %s (see stderr)",                                  \
		    f_, (g)->group_id);                                       \
	} while (0)

/* tt_run_group(n, id, body) on a group of its own, which must see no
 * failed check. */
#define tt_run_ok(n, id, body)                                                \
	do {                                                                  \
		static struct tt_group g_;                                    \
		tt_run_group((n), (id), (body), &g_);                         \
		tt_assert_no_failures(&g_);                                   \
	} while (0)

/* In-memory store (gloo HashStore). */
struct tt_kv {
	struct tt_kv *next;
	char *key;
	void *val;
	size_t len;
};

struct tt_store {
	pthread_mutex_t mu;
	pthread_cond_t cv;
	struct tt_kv *head;
};

void tt_store_init(struct tt_store *s);
void tt_store_fini(struct tt_store *s);
cohort_status tt_store_set(void *ctx, const char *key, const void *val,
    size_t len, cohort__time deadline);
cohort_status tt_store_get(void *ctx, const char *key, void **val, size_t *len,
    cohort__time deadline);
/* The value of key (a "host:port" address) as a string in out. */
bool tt_store_addr(struct tt_store *s, const char *key, char *out, size_t len);

/* A group of rank threads. */
struct tt_group;
typedef void (*tt_body)(struct tt_group *g, int rank, void *state);

struct tt_group {
	int n;
	char group_id[64];
	uint64_t gen;
	struct tt_store *store;
	/* What the ranks rendezvous through: store, unless a test wraps it. */
	struct cohort__store st;
	int init_ms; /* each rank's init deadline */
	int32_t granks[TT_MAX_RANKS];
	uint8_t secret[16];
	atomic_int abort_flag[TT_MAX_RANKS];
	void *state[TT_MAX_RANKS];
	cohort_status init_rv[TT_MAX_RANKS];
	char init_err[TT_MAX_RANKS][TT_ERRLEN];
	tt_body body;
	pthread_t th[TT_MAX_RANKS];
	pthread_barrier_t done;
	/* Scenario data. */
	uint64_t seed;
	int iters;
	atomic_int in_run;
	atomic_int failures;
	uint64_t hash[TT_MAX_RANKS];
	cohort_status run_rv[TT_MAX_RANKS];
	char run_err[TT_MAX_RANKS][TT_ERRLEN];
	int64_t run_ms[TT_MAX_RANKS];
	/* Ranks whose state got the shared-memory segment. */
	atomic_int shm_ranks;
	atomic_int cma_ranks; /* of those, reading others' buffers */
};

enum tt_mode { TT_SHM, TT_PURE, TT_MIXED, TT_NMODES };

extern const char *const tt_mode_name[TT_NMODES];

/* Selects the data path for the groups a test creates (read at init). */
void tt_set_mode(int mode);

/* Checks that every rank of g took the path mode asks for. */
#define tt_assert_mode(g, mode)                                               \
	do {                                                                  \
		int want_ = (mode) == TT_PURE ? 0 : (g)->n;                   \
		ck_assert_msg(atomic_load(&(g)->shm_ranks) == want_,          \
		    "%s: %d of %d ranks use shared memory",                   \
		    tt_mode_name[(mode)], atomic_load(&(g)->shm_ranks),       \
		    (g)->n);                                                  \
		unsetenv("COHORT_TCP_SHM");                                   \
		ck_assert_msg(atomic_load(&(g)->cma_ranks)                    \
		        == ((mode) == TT_MIXED ? (g)->n : 0),                 \
		    "%s: %d of %d ranks read others' buffers",                \
		    tt_mode_name[(mode)], atomic_load(&(g)->cma_ranks),       \
		    (g)->n);                                                  \
		unsetenv("COHORT_TCP_SHM");                                   \
		unsetenv("COHORT_TCP_SHM_MIN");                               \
		unsetenv("COHORT_TCP_SHM_CMA_MIN");                           \
	} while (0)

/* Rank r's group descriptor. */
void tt_desc(struct tt_group *g, int r, struct cohort__group_desc *d);
/* n ranks in store s, each running body after its init. */
void tt_group_setup(struct tt_group *g, struct tt_store *s, int n,
    const char *id, tt_body body);
/* Starts rank r's thread (slot: 0 or 1, one per group running at once);
 * the caller has initialised g->done for the ranks it starts. */
void tt_rank_start(struct tt_group *g, int slot, int r);
/* Starts every rank. */
void tt_group_start(struct tt_group *g, int slot);
/* Joins every rank; fails the test if an init failed. */
void tt_group_join(struct tt_group *g);
/* setup + start + join with a store of its own. */
void tt_run_group(int n, const char *id, tt_body body, struct tt_group *g);
/* The same with g->iters set to iters (the body's to read). */
void tt_run_group_iters(
    int n, const char *id, tt_body body, int iters, struct tt_group *g);

/* Inputs. */
/* One collective on one rank. */
struct tt_spec {
	enum cohort__op_kind kind;
	cohort_dtype dt;
	cohort_redop op;
	bool inplace;
	size_t count;
	int root;
	uint64_t seed;
};

/* An in-place f32 sum allreduce of count elements at buf. */
static inline struct cohort__op
tt_sum_op(float *buf, size_t count, uint64_t seq)
{
	struct cohort__op op = { .kind = COHORT__OP_ALLREDUCE,
		.send = buf,
		.recv = buf,
		.dtype = COHORT_F32,
		.op = COHORT_SUM,
		.count = count,
		.seq = seq };

	return (op);
}

/* Runs spec on rank r and checks its output (failures counted in g). */
void tt_one(struct tt_group *g, int r, void *state, const struct tt_spec *sp,
    uint64_t seq);
/* One 100003-element f32 sum allreduce. */
void tt_body_one_allreduce(struct tt_group *g, int r, void *state);
/* th_wait_until condition: g->iters ranks are in their run. */
bool tt_in_run_ge(void *arg);

/* Two ranks in two processes (global ranks grank0, grank0 + 1) that
 * rendezvous through a directory: rank 1 is a forked child. */
struct tt_fork {
	struct fs_store fs;
	int32_t granks[2];
	pid_t pid;
	void *state; /* this process's rank */
	char err[TT_ERRLEN];
};

/* Forks rank 1, which exits with rank1(f) (f->state is its own); the
 * parent is rank 0 and returns at once. */
void tt_fork_start(
    struct tt_fork *f, int32_t grank0, int (*rank1)(struct tt_fork *f));
/* Initialises rank r's backend in this process (10 s deadline). */
cohort_status tt_fork_init(struct tt_fork *f, int r);
/* Runs op as operation seq of this process's rank (10 s deadline). */
cohort_status tt_fork_run(
    struct tt_fork *f, struct cohort__op *op, uint64_t seq);
/* Rank 0's init; on failure kills rank 1 and fails the test. */
void tt_fork_init0(struct tt_fork *f);
/* Waits for rank 1, finalises rank 0 and removes the directory; returns
 * rank 1's wait status. */
int tt_fork_end(struct tt_fork *f);

#endif /* COHORT_TCP_FIXTURE_H */
