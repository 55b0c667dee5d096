/*
 * backend.h - the data-plane backend boundary of libcohort.
 *
 * A backend moves tensor data for one process group: `tcp` (host memory,
 * peer to peer), `service` (through cohortd), `nccl` (device memory). The
 * group layer (client/collectives.c) validates arguments, orders the work
 * (one operation at a time per group, in issue order), enforces deadlines
 * and the sticky-error rule, and calls a backend through this versioned
 * table of operations. A backend file's only non-static symbol is its ops
 * table (like nng's transports and NCCL's net plugins).
 *
 * A backend sees only this header and the floor (common/, proto/, the
 * public header), never the client's internals: what it needs of its group
 * comes in the descriptor, including a channel to the coordinator
 * (tools/check-calls.py checks the includes).
 *
 * Versioning: `version` is COHORT__BACKEND_VERSION of the header the
 * backend was compiled against. Fields are only ever appended; a group
 * refuses a backend with a version it does not know.
 *   1  the first
 *   2  cohort__group_desc.chan: the group's coordinator channel
 *   3  point-to-point (struct cohort__p2p, the p2p_* operations),
 *      COHORT__OP_ALLTOALLV (cohort__op's sdispls, rcounts, rdispls),
 *      cohort__store's add and del; ops.shrink (optional): an elastic
 *      reform without a new rendezvous
 * The group layer still takes a version-2 table: its groups get no
 * alltoallv (COHORT_ENOTSUP), send their point-to-point traffic
 * through the service backend's (host memory only) and are set up anew
 * at every elastic reform.
 */
#ifndef COHORT_BACKEND_H
#define COHORT_BACKEND_H

#include <stdatomic.h>
#include <stdbool.h>
#include <stdio.h>

#include "cohort/cohort.h"
#include "cohort_common.h"
#include "half.h" /* f16/bf16 <-> f32 */
#include "knobs.h"
#include "wire.h" /* struct cohort__iov */

#define COHORT__BACKEND_VERSION 3
/* The oldest version the group layer still loads. */
#define COHORT__BACKEND_VERSION_MIN 2

/* A rendezvous store: the job's KV at cohortd in real use, an in-memory
 * table in the backend's unit tests (gloo's Store). */
struct cohort__store {
	void *ctx;
	cohort_status (*set)(void *ctx, const char *key, const void *val,
	    size_t len, cohort__time deadline);
	/* Waits until key exists; *val is malloc'd (free()). */
	cohort_status (*get)(void *ctx, const char *key, void **val,
	    size_t *len, cohort__time deadline);
	/* v3 (NULL in a store that lacks them): adds delta to the decimal
	 * integer at key (absent: 0), *out the new value; deletes key
	 * (absent: COHORT_OK). Neither waits for another rank. */
	cohort_status (*add)(void *ctx, const char *key, int64_t delta,
	    int64_t *out, cohort__time deadline);
	cohort_status (*del)(
	    void *ctx, const char *key, cohort__time deadline);
	/* Optional (NULL: one get per key): waits until all n keys exist
	 * and reads them in one round trip; vals[i] malloc'd (free()),
	 * lens[i] its length; on an error none is kept. */
	cohort_status (*mget)(void *ctx, const char *const *keys, size_t n,
	    void **vals, size_t *lens, cohort__time deadline);
};

/* What every member of one channel gather must agree on; cohortd fails a
 * gather whose members differ in any of it with COHORT_EMISMATCH, naming
 * what each called. */
struct cohort__chan_shape {
	uint32_t kind; /* enum cohort__op_kind of the operation */
	uint32_t op; /* cohort_redop, 0 where none */
	uint32_t dtype; /* cohort_dtype */
	int32_t root; /* group rank, 0 where none */
	uint64_t count; /* elements */
};

/* One gather through the coordinator channel. */
struct cohort__chan_gather {
	/* In. */
	struct cohort__chan_shape shape;
	const struct cohort__iov *parts; /* this member's contribution, */
	size_t nparts; /* which may be empty */
	/* Out, after COHORT_OK, valid until release(): every member's
	 * contribution in group-rank order, back to back in data, lens[q]
	 * bytes from group rank q (nlens == group size; the backend checks
	 * them against what it expects). */
	const uint8_t *data;
	size_t len;
	const int64_t *lens;
	size_t nlens;
	/* How long this member waited at the coordinator for the others
	 * (0: the last to arrive, or not said). */
	uint64_t wait_ns;
	void *priv; /* the channel's */
};

/* The group's channel to the coordinator (cohortd), for a backend whose
 * data travels through it (`service`) or that needs the members to agree
 * on a few bytes. The group layer implements it over cohortd's
 * COLL_SERVICE gather (proto/README.md section 5.3); a failed peer or a
 * moved generation seen in its replies reaches the client from there, so
 * the backend only returns the status. */
struct cohort__coord_chan {
	void *ctx;
	/* Every member calls it with the same shape, in the same order
	 * (gathers are numbered by the channel); each gets all
	 * contributions. Blocks until all arrived, deadline, or abort.
	 * Returns COHORT_OK (release the result); COHORT_EPEERLOST /
	 * COHORT_ESTALE (the job failed), COHORT_EMISMATCH,
	 * COHORT_ETIMEDOUT, COHORT_EABORTED, COHORT_ENOCOORD, with err
	 * naming the cause. Not concurrent with itself on one group. */
	cohort_status (*gather)(void *ctx, struct cohort__chan_gather *g,
	    char *err, size_t errlen, cohort__time deadline);
	/* Frees a successful gather's result. */
	void (*release)(void *ctx, struct cohort__chan_gather *g);
	/* Makes a gather blocked in another thread return COHORT_EABORTED
	 * promptly, and every later one at once. Any thread, never blocks,
	 * idempotent. */
	void (*abort)(void *ctx);
};

/* What a backend learns about its group at init. Everything pointed to
 * stays valid until fini. */
struct cohort__group_desc {
	const char *job; /* job name */
	uint64_t generation; /* job generation; part of connection auth */
	const char *group_id; /* unique within the job and generation */
	int rank; /* this process's rank in the group */
	int size; /* group size, >= 1 */
	const int32_t *global_ranks; /* group rank -> job rank (for errors) */
	/* Shared secret of the job (derived from its token); a peer must
	 * prove knowledge of it, the job, the generation and the group to
	 * connect. May be empty (len 0) for token-less jobs. */
	const uint8_t *secret;
	size_t secret_len;
	/* IP address to listen on and advertise; NULL = pick the address of
	 * the interface that reaches the coordinator, else 127.0.0.1. */
	const char *bind_addr;
	struct cohort__store store;
	/* Set non-zero (release) by the group when the operation must stop:
	 * abort, a peer declared dead by cohortd. Backends poll it (acquire)
	 * in every wait, in addition to receiving abort(). */
	atomic_int *abort_flag;
	/* v2: the channel to the coordinator; gather NULL when the group
	 * has none (a backend unit test without cohortd). */
	struct cohort__coord_chan chan;
};

enum cohort__op_kind {
	COHORT__OP_ALLREDUCE = 1,
	COHORT__OP_REDUCE,
	COHORT__OP_BROADCAST,
	COHORT__OP_ALLGATHER,
	COHORT__OP_ALLGATHERV,
	COHORT__OP_REDUCE_SCATTER,
	COHORT__OP_ALLTOALL,
	COHORT__OP_GATHER,
	COHORT__OP_SCATTER,
	COHORT__OP_BARRIER,
	/* v3 */
	COHORT__OP_ALLTOALLV, /* run(): cohort__op's counts and displs */
	COHORT__OP_SEND, /* point-to-point (struct cohort__p2p), never */
	COHORT__OP_RECV, /* run()'s */
};

/* One collective, arguments already validated by the group layer with the
 * meaning of the corresponding public function in cohort.h. For MEAN the
 * backend receives op == COHORT_MEAN and must divide by the group size
 * after summing (float dtypes only; the group layer rejects the others).
 * Broadcast is in place on `recv` (root sends from it). */
struct cohort__op {
	enum cohort__op_kind kind;
	const void *send;
	void *recv;
	size_t count; /* elements (per rank block where relevant) */
	const size_t *counts; /* ALLGATHERV: per-rank counts */
	cohort_dtype dtype;
	cohort_redop op;
	int root; /* group rank */
	void *stream; /* cudaStream_t for nccl, NULL otherwise */
	uint64_t seq; /* per-group operation number, from 1 */
	/* Out, for metrics and the timeline (client/observe.h); NULL: none.
	 * A backend may name the algorithm it chose (a static string) and add
	 * the nanoseconds it spent with nothing to send or receive, waiting
	 * for a peer to arrive; the group layer zeroes both before run(). */
	struct cohort__op_stats *stats;
	/* v3, ALLTOALLV: element counts and offsets per group rank q: send
	 * holds counts[q] elements for q at sdispls[q], recv gets rcounts[q]
	 * from q at rdispls[q] (count is 0). The group layer checked that
	 * the blocks of recv do not overlap each other or send; that rank
	 * q's counts[r] equals rank r's rcounts[q] is the backend's to
	 * check, before any data moves: ranks that disagree get
	 * COHORT_EMISMATCH naming both sides. */
	const size_t *sdispls;
	const size_t *rcounts;
	const size_t *rdispls;
};

struct cohort__op_stats {
	const char *algo; /* "ring", "shm", ...; NULL: not said */
	uint64_t wait_ns; /* idle, waiting for peers */
};

/* One point-to-point transfer (v3): a send to, or a receive from, one
 * group rank, matched to its counterpart by (sender, receiver, tag) in
 * the order each side posted them (MPI's and gloo's rule: the n-th send
 * from a to b with tag t meets b's n-th receive from a with tag t). The
 * group layer fills the inputs, validated with the meaning of cohort_send
 * and cohort_recv in cohort.h, and owns the struct; the backend links it
 * through `next` and `priv` while it holds it. */
#define COHORT__P2P_ANY (-1) /* a receive's peer: any rank */

struct cohort__p2p {
	/* In. */
	enum cohort__op_kind kind; /* COHORT__OP_SEND or COHORT__OP_RECV */
	int peer; /* group rank, never this rank; RECV: or COHORT__P2P_ANY */
	uint32_t tag;
	void *buf; /* SEND: read only; NULL when bytes is 0 */
	size_t count; /* elements */
	cohort_dtype dtype;
	size_t bytes; /* count * the size of dtype */
	void *stream; /* cudaStream_t for nccl, NULL otherwise */
	uint64_t seq; /* the group's point-to-point number, for texts */
	cohort__time deadline;
	/* Out, set before done() is called. */
	cohort_status st;
	int source; /* RECV: the group rank it came from */
	char err[512];
	/* Called once per posted transfer when it completed or failed, from
	 * any thread (possibly before p2p_post returned), with none of the
	 * backend's locks held; after it returns the backend no longer
	 * touches the struct or the buffer. */
	void (*done)(struct cohort__p2p *p);
	void *ctx; /* the group layer's */
	/* The backend's, while it holds the struct. */
	struct cohort__p2p *next;
	void *priv;
};

/* "allreduce", "reduce_scatter", ...; for error texts (client/opname.c). */
const char *cohort__op_name(enum cohort__op_kind kind);

struct cohort__backend_ops {
	uint32_t version; /* COHORT__BACKEND_VERSION */
	const char *name;

	/* Sets up the group's connections before deadline. Collective: every
	 * member calls it. Returns COHORT_OK and *state; on error, err gets a
	 * detail (which peer, what failed) and nothing is left behind. */
	cohort_status (*init)(const struct cohort__group_desc *desc,
	    void **state, char *err, size_t errlen, cohort__time deadline);

	/* Runs one operation to completion or failure, in the calling thread.
	 * Never called concurrently on one state. On failure err names the
	 * peer (by job rank) and the operation, e.g. "rank 3 closed the
	 * connection during allreduce #12 (chunk 7 of 64)". A failure that
	 * leaves the connections unusable must return EPEERLOST, ETIMEDOUT
	 * or EABORTED (the group layer makes those sticky). */
	cohort_status (*run)(void *state, const struct cohort__op *op,
	    char *err, size_t errlen, cohort__time deadline);

	/* Makes a run() blocked in another thread return promptly with
	 * COHORT_EABORTED (e.g. shutdown() its sockets). Any thread, never
	 * blocks, idempotent, may be called before or after run. */
	void (*abort)(void *state);

	/* Frees the state. Must be safe after abort. Not concurrent with
	 * run. */
	void (*fini)(void *state);

	/* v3: point-to-point, optional (NULL: the group layer carries this
	 * backend's groups' transfers through the service backend's, for
	 * host memory). It runs beside run(), never ordered with the
	 * collectives: a transfer may be posted while a collective runs in
	 * another thread, and several transfers are in flight at once.
	 *
	 * p2p_open makes the point-to-point state of one group. Unlike
	 * init it is not collective: each member opens it at its own first
	 * transfer and waits for nobody (connections to a peer are made
	 * when a transfer first needs them). state is init's, or NULL when
	 * init has not run; a backend that needs it (p2p_needs_state: nccl,
	 * whose transfers travel on the group's communicator) gets it,
	 * because the group layer sets the group up first then. On error err
	 * says why and nothing is left behind. */
	cohort_status (*p2p_open)(const struct cohort__group_desc *desc,
	    void *state, void **p2p, char *err, size_t errlen,
	    cohort__time deadline);
	/* Posts n transfers together (a batch: nccl puts them in one NCCL
	 * group). Never waits for a peer. COHORT_OK: the backend took all n
	 * and calls each one's done() once. Otherwise it took none: err
	 * says why (COHORT_EINVAL: an argument this backend cannot take,
	 * e.g. host memory on nccl; the sticky status of a state that
	 * broke). Thread-safe: any threads may post at once. A transfer
	 * that fails in a way that leaves the connections unusable
	 * (EPEERLOST, ETIMEDOUT, EABORTED) breaks the state: every later
	 * post gets the same status. */
	cohort_status (*p2p_post)(void *p2p, struct cohort__p2p *const *reqs,
	    size_t n, char *err, size_t errlen);
	/* Fails every transfer held with COHORT_EABORTED promptly, and every
	 * later post. Any thread, never blocks, idempotent. */
	void (*p2p_abort)(void *p2p);
	/* Fails what is still held (COHORT_EABORTED, done() called) and
	 * frees the state. Before the backend's fini, never concurrent with
	 * p2p_post. */
	void (*p2p_close)(void *p2p);
	bool p2p_needs_state;
	/* v3, optional (NULL: not supported). Elastic membership
	 * (cohort_client_reform): moves `state`, of the group's previous
	 * generation, to desc's membership - the old one less the group
	 * ranks exclude[0..nexclude) that were lost, the survivors in their
	 * old order - without a new rendezvous (NCCL: ncclCommShrink).
	 * Collective among the survivors; abort() may have been called on
	 * `state` (the change failed the group), no run() is in flight.
	 * Returns COHORT_OK and *out (`state` consumed); COHORT_ENOTSUP when
	 * the survivors cannot shrink (not every one's state is intact, the
	 * library lacks it): `state` is untouched and the caller finis it
	 * and inits anew, which every survivor then does; any other status:
	 * `state` is consumed and err says why. */
	cohort_status (*shrink)(void *state,
	    const struct cohort__group_desc *desc, const int *exclude,
	    int nexclude, void **out, char *err, size_t errlen,
	    cohort__time deadline);
};

extern const struct cohort__backend_ops cohort__tcp_backend;
extern const struct cohort__backend_ops cohort__service_backend;
extern const struct cohort__backend_ops cohort__nccl_backend;
/* "tcp-staged": device buffers staged through pinned host memory over the
 * tcp backend (several ranks on one GPU, or no NCCL). */
extern const struct cohort__backend_ops cohort__staged_backend;

/* Availability of the GPU backends (probed once; a CPU-only process never
 * initialises CUDA unless device memory or these backends are asked for).
 * why gets the reason when false. */
bool cohort__nccl_available(char *why, size_t len);
bool cohort__staged_available(char *why, size_t len);

/* ------------------------------------------------------------------------ */
/* The registry (registry.c): how the group layer finds a backend.          */
/* ------------------------------------------------------------------------ */

enum {
	COHORT__MEM_HOST = 1, /* ordinary host memory */
	COHORT__MEM_DEVICE = 2 /* CUDA device memory, or a stream given */
};

struct cohort__backend_entry {
	const char *name; /* what COHORT_BACKEND and cohort_group_new name */
	const struct cohort__backend_ops *ops;
	unsigned mem; /* COHORT__MEM_* it takes */
	bool (*available)(char *why, size_t len); /* NULL: always */
	bool in_auto; /* "auto" may choose it */
};

/* The entry named name, NULL if none. */
const struct cohort__backend_entry *cohort__backend_find(const char *name);
/* The entry of ops, NULL if not registered. */
const struct cohort__backend_entry *cohort__backend_of(
    const struct cohort__backend_ops *ops);
/* e can run in this process; why gets the reason when not. */
bool cohort__backend_usable(
    const struct cohort__backend_entry *e, char *why, size_t len);
/* "auto": the first usable entry taking memory kind mem, NULL if none
 * (why: the last reason). */
const struct cohort__backend_entry *cohort__backend_pick(
    unsigned mem, char *why, size_t len);
/* "auto, nccl, tcp-staged, tcp, service" into buf (for messages). */
size_t cohort__backend_names(char *buf, size_t len);

/* True when p is device or managed memory; never initialises CUDA in a
 * process that has not (no libcuda.so.1 mapped = false). */
bool cohort__is_device_ptr(const void *p);

/* Element-wise reduction kernels shared by backends (client/reduce.c):
 * dst[i] = dst[i] op src[i] for n elements. MEAN reduces as SUM. The best
 * vectorised variant for the running CPU is picked once at first use. */
void cohort__reduce(
    void *dst, const void *src, size_t n, cohort_dtype dt, cohort_redop op);
/* Forces a kernel variant ("generic", "avx2", "avx512"; NULL = best for
 * this CPU) for tests and benchmarks; *active names the one in use. Returns
 * false if the CPU lacks the requested one. */
bool cohort__reduce_select(const char *isa, const char **active);
/* dst[i] /= divisor for float dtypes (MEAN's final step). */
void cohort__scale_div(void *dst, size_t n, cohort_dtype dt, double divisor);

/* What p2p_post answers on a state that can no longer be used: the
 * sticky status that broke it (broken, its text broken_err), or
 * COHORT_EABORTED when it was aborted; err says which. */
static inline cohort_status
cohort__p2p_unusable(
    cohort_status broken, const char *broken_err, char *err, size_t errlen)
{
	snprintf(err, errlen, "%s",
	    broken != COHORT_OK
	        ? broken_err
	        : "the group's point-to-point state was aborted");
	return (broken != COHORT_OK ? broken : COHORT_EABORTED);
}

/* "host" (host memory: TCP, same-host shared memory; client/backend/host/),
 * the backend cohort__tcp_backend named; "tcp" stays its alias. */
extern const struct cohort__backend_ops cohort__host_backend;

#endif /* COHORT_BACKEND_H */
