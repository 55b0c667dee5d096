/*
 * cohort.h - the public API of libcohort.
 *
 * libcohort is linked by every worker of a data-parallel training job. A
 * worker opens a *client* (its membership in a job at the coordinator,
 * cohortd), which gives it a rank, the world size and the *world group*.
 * Groups carry the collectives: control-plane ones (barrier, object
 * broadcast, scalar reduce, boolean decision) always go through cohortd;
 * data-plane ones (allreduce & co.) go peer to peer over TCP for host
 * memory, through NCCL for device memory, or through cohortd ("service").
 *
 * Conventions (docs/architecture.md has the design around them):
 *  - Every function returning cohort_status returns COHORT_OK (0) on success.
 *    Output parameters are written only on success.
 *  - Every blocking call takes a cohort_duration timeout in milliseconds;
 *    COHORT_WAIT_DEFAULT means the client's configured operation timeout
 *    (1800 s unless changed, like Lightning), COHORT_WAIT_FOREVER disables
 *    the limit.
 *  - Errors on a group are sticky: after a peer is lost (COHORT_EPEERLOST)
 *    or the generation moved (COHORT_ESTALE), every later call on that group
 *    returns the same status, and cohort_group_last_error() the same detail
 *    (which rank, which operation, since when). COHORT_ETIMEDOUT from a
 *    control-plane call does not poison the group; the call may be retried.
 *  - Handles are opaque. No global state: several clients may live in one
 *    process (each is an independent membership).
 *  - Thread-safety: a cohort_client may be used from several threads at
 *    once. A cohort_group runs one collective at a time; calls on one group
 *    from several threads are serialised in call order. Different groups
 *    may be used concurrently. cohort_group_abort() may be called from any
 *    thread, including while another thread is blocked on the group.
 */
#ifndef COHORT_COHORT_H
#define COHORT_COHORT_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#ifdef __cplusplus
extern "C" {
#endif

#if defined(__GNUC__)
#define COHORT_API __attribute__((visibility("default")))
#else
#define COHORT_API
#endif

/* The release: the one place it is spelled. The Makefile reads these three
 * lines (cohort.pc, cohort-strategies.pc); tools/check-version.sh (make
 * check-style) checks every other spelling (the Python package, the
 * container image tags of deploy/, the docs) against them. */
#define COHORT_VERSION_MAJOR 0
#define COHORT_VERSION_MINOR 1
#define COHORT_VERSION_PATCH 0
/* "MAJOR.MINOR.PATCH" */
#define COHORT_VERSION_STRING                                                 \
	COHORT__VERSION_STR(                                                  \
	    COHORT_VERSION_MAJOR, COHORT_VERSION_MINOR, COHORT_VERSION_PATCH)
#define COHORT__VERSION_STR(a, b, c) COHORT__VERSION_STR2(a, b, c)
#define COHORT__VERSION_STR2(a, b, c) #a "." #b "." #c

/* The exit status of a process that stops because another rank of its job
 * was lost (it got COHORT_EPEERLOST), told apart from a failure of its own
 * (1, or 128 + signal): the demo trainer, `cohort run` on a node that does
 * not host the failed rank, and the Python package exit with it, and the
 * Kubernetes Job's podFailurePolicy (deploy/k8s) charges no retry to such
 * a pod's index (docs/kubernetes.md, "Exit codes"). Above every 128 +
 * signal status and outside systemd's 200-243. */
#define COHORT_EXIT_PEER_LOST 250

/* Wire protocol version carried in every request (proto/README.md). */
#define COHORT_PROTO_VERSION 1

/* ------------------------------------------------------------------------ */
/* Status codes                                                             */
/* ------------------------------------------------------------------------ */

/* One table -> enum, name, message. Codes are part of the wire protocol
 * (Reply.status): append, never renumber. */
#define COHORT_STATUS_MAP(XX)                                                 \
	XX(OK, 0, "success")                                                  \
	XX(EINVAL, 1, "invalid argument")                                     \
	XX(ENOMEM, 2, "out of memory")                                        \
	XX(ETIMEDOUT, 3, "timed out")                                         \
	XX(ECLOSED, 4, "handle closed")                                       \
	XX(EABORTED, 5, "group aborted")                                      \
	XX(EPEERLOST, 6, "a peer rank failed or left the group")              \
	XX(ESTALE, 7, "group generation changed; rejoin required")            \
	XX(ESTATE, 8, "operation not valid in the current state")             \
	XX(EPROTO, 9, "protocol error")                                       \
	XX(ENOTSUP, 10, "not supported by this backend or build")             \
	XX(ETRANSPORT, 11, "transport (nng) error")                           \
	XX(ECUDA, 12, "CUDA error")                                           \
	XX(ENCCL, 13, "NCCL error")                                           \
	XX(ESYSTEM, 14, "system call failed")                                 \
	XX(EAUTH, 15, "authentication failed (wrong job token)")              \
	XX(EEXIST, 16, "already exists (duplicate rank or name)")             \
	XX(ENOENT, 17, "no such key, job or group")                           \
	XX(ETOOBIG, 18, "message or value exceeds the configured limit")      \
	XX(EMISMATCH, 19, "ranks disagree on the collective they entered")    \
	XX(ENOCOORD, 20, "coordinator unreachable")                           \
	XX(EINJECTED, 21, "failure injected by a fault schedule")             \
	XX(EJOURNAL, 22,                                                      \
	    "the coordinator's journal (--state-dir) is full, failing or "    \
	    "damaged")                                                        \
	XX(EMEMBERSHIP, 23,                                                   \
	    "the job's membership changed (elastic): move to its new "        \
	    "generation with cohort_client_reform")

typedef enum {
#define COHORT__XX(name, code, msg) COHORT_##name = code,
	COHORT_STATUS_MAP(COHORT__XX)
#undef COHORT__XX
} cohort_status;

/* Static text for a status; never NULL (unknown codes get a generic text). */
COHORT_API const char *cohort_strerror(cohort_status st);
/* "COHORT_ETIMEDOUT"; never NULL. */
COHORT_API const char *cohort_status_name(cohort_status st);

/* ------------------------------------------------------------------------ */
/* Basic types                                                              */
/* ------------------------------------------------------------------------ */

typedef int32_t cohort_duration; /* milliseconds */
#define COHORT_WAIT_FOREVER ((cohort_duration)-1)
#define COHORT_WAIT_DEFAULT ((cohort_duration)-2)

/* Element types of tensors. Values are part of the wire protocol. */
typedef enum {
	COHORT_F32 = 0,
	COHORT_F64 = 1,
	COHORT_F16 = 2, /* IEEE binary16 */
	COHORT_BF16 = 3, /* bfloat16 */
	COHORT_I32 = 4,
	COHORT_I64 = 5,
	COHORT_U8 = 6,
	COHORT_DTYPE_COUNT
} cohort_dtype;

/* Reduction operators. MEAN is SUM followed by division by the group size;
 * it is defined for the floating-point types only (COHORT_EINVAL on
 * integer types). Values are part of the wire protocol. */
typedef enum {
	COHORT_SUM = 0,
	COHORT_PROD = 1,
	COHORT_MIN = 2,
	COHORT_MAX = 3,
	COHORT_MEAN = 4,
	COHORT_REDOP_COUNT
} cohort_redop;

COHORT_API size_t cohort_dtype_size(cohort_dtype dt); /* 0 if invalid */
COHORT_API const char *cohort_dtype_name(cohort_dtype dt);
COHORT_API const char *cohort_redop_name(cohort_redop op);

typedef struct cohort_client cohort_client; /* a membership in a job */
typedef struct cohort_group cohort_group; /* a process group */
typedef struct cohort_work cohort_work; /* an asynchronous operation */

/* ------------------------------------------------------------------------ */
/* Options and the environment                                              */
/* ------------------------------------------------------------------------ */

/* Where a resolved setting came from (cohort env prints these). */
typedef struct cohort_env {
	char coordinator[256]; /* nng URL, e.g. tcp://10.0.0.1:29400 */
	char job[128];
	char token[128];
	int32_t rank; /* -1 = unknown (cohortd assigns) */
	int32_t world_size; /* 0 = unknown */
	int32_t local_rank; /* -1 = unknown */
	int32_t local_world_size; /* 0 = unknown */
	int32_t node_rank; /* -1 = unknown */
	int32_t restart_count; /* see restart_count_from; 0 if unset */
	/* The winning source: "cohort", "torchrun", "openmpi", "pmi",
	 * "slurm", "k8s-indexed-job", "kubeflow", or "none". */
	char source[32];
	/* Per-field origin, e.g. "COHORT_RANK", "RANK",
	 * "OMPI_COMM_WORLD_RANK", "default". */
	char coordinator_from[48];
	char job_from[48];
	char rank_from[48];
	char world_size_from[48];
	char local_rank_from[48];
	/* The address this worker's tcp data plane listens on and
	 * advertises to its peers, and where it came from:
	 * "COHORT_DATA_ADDR", "COHORT_DATA_IFACE=eth0", "route to the
	 * coordinator" (the local address of the interface that reaches
	 * it) or "default" (127.0.0.1, no coordinator known). */
	char data_addr[64];
	char data_addr_from[48];
	/* Where the token came from: "COHORT_TOKEN", "COHORT_TOKEN_FILE"
	 * (its contents, less trailing whitespace) or "unset". */
	char token_from[48];
	/* Where restart_count came from: "COHORT_RESTART_COUNT",
	 * "TORCHELASTIC_RESTART_COUNT" or "unset". */
	char restart_count_from[48];
	/* Launcher variables present but not used, and why (one sentence
	 * each, "; "-separated), e.g. an interactive SLURM allocation; "" if
	 * none. */
	char notes[256];
} cohort_env;

/* cohort_env_resolve reads the process environment in the order of
 * docs/launchers.md (which has the tables): rank and world
 * size from the first *complete* source (both present) of cohort's own
 * COHORT_* variables, torchrun's (RANK, WORLD_SIZE, LOCAL_RANK,
 * LOCAL_WORLD_SIZE, GROUP_RANK), Open MPI's (OMPI_COMM_WORLD_*), PMI's
 * (PMI_RANK, PMI_SIZE, MPI_LOCALRANKID: MPICH, Intel MPI), SLURM's
 * (SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID; skipped in an interactive
 * allocation, SLURM_JOB_NAME bash or interactive), a Kubernetes Indexed
 * Job's (JOB_COMPLETION_INDEX with COHORT_WORLD_SIZE), Kubeflow's
 * (PET_NODE_RANK of PET_NNODES when PET_NPROC_PER_NODE is 1).
 * The coordinator is COHORT_COORDINATOR, else MASTER_ADDR:MASTER_PORT,
 * else for SLURM the first host of SLURM_JOB_NODELIST at 15000 + the last
 * four digits of SLURM_JOB_ID (Lightning's port), for Kubeflow
 * PET_MASTER_ADDR:PET_MASTER_PORT. The job is COHORT_JOB, else the
 * launcher's id of this launch (TORCHELASTIC_RUN_ID, Open MPI's or PMIx's
 * job id, SLURM's job and step, ...; job_from names it), else "default".
 * The token is COHORT_TOKEN, else the contents of COHORT_TOKEN_FILE; the
 * restart count COHORT_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT.
 * KUBERNETES_* is never consulted. Launcher variables present but not
 * used are explained in notes.
 * Returns COHORT_OK and fills *out (even if no source was complete: then
 * source is "none" and rank/world are unknown); COHORT_EINVAL if a variable
 * is present but malformed (e.g. RANK=abc) or a token file cannot be read,
 * with *out's source field left as "invalid" and the detail logged and in
 * cohort_last_error(). Reads files only for COHORT_TOKEN_FILE; never
 * blocks otherwise. */
COHORT_API cohort_status cohort_env_resolve(cohort_env *out);

/* Writes a multi-line human-readable report of *env (one "key = value
 * (from X)" line each) into buf, truncating to len. Returns the length the
 * full text needs (like snprintf). */
COHORT_API size_t cohort_env_format(
    const cohort_env *env, char *buf, size_t len);

/* The other side of cohort_env_resolve: the variables a launcher sets for
 * the worker *env describes, cohort's own and torchrun's (COHORT_
 * COORDINATOR, _JOB, _TOKEN, _RANK, _WORLD_SIZE, _LOCAL_RANK,
 * _LOCAL_WORLD_SIZE, _NODE_RANK, _RESTART_COUNT; RANK, WORLD_SIZE,
 * LOCAL_RANK, LOCAL_WORLD_SIZE, GROUP_RANK, TORCHELASTIC_RESTART_COUNT;
 * unknown fields are left out). Writes "NAME=VALUE" strings into buf, one
 * after the other, and a pointer to each into vars, NULL-terminated.
 * Returns how many it wrote, or -1 (nothing usable) if buf (len bytes) or
 * vars (nvars entries, the NULL included) is too small; 16 entries and
 * 2 KiB always suffice. cohort run, cohort_spawn and cohort bench launch
 * their workers with it. Never blocks. */
COHORT_API int cohort_env_vars(const cohort_env *env, char *buf, size_t len,
    const char **vars, size_t nvars);

/* The value of one of cohort's COHORT_* environment variables (the table
 * `cohort env` prints, docs/environment.md), or NULL when it is unset,
 * empty, or not a name of that table. Lets programs on the public API
 * (the strategies, tools) read the environment the way libcohort does.
 * Never blocks. */
COHORT_API const char *cohort_env_knob(const char *name);

typedef struct cohort_options {
	const char *coordinator; /* nng URL of cohortd (tcp://, ipc://) */
	const char *job; /* job name; default "default" */
	const char *token; /* job token; default "" */
	int32_t rank; /* requested rank, -1 = cohortd assigns */
	int32_t world_size; /* required, >= 1 */
	int32_t local_rank; /* informational, -1 = unknown */
	/* Default timeout of blocking calls made with COHORT_WAIT_DEFAULT.
	 * Default 1800000 (30 min, like Lightning's DDP). */
	cohort_duration op_timeout;
	/* How long cohort_client_open waits for all world_size members.
	 * Default: op_timeout. */
	cohort_duration join_timeout;
	/* Heartbeat period and the silence after which cohortd declares this
	 * client dead. Defaults 1000 and 5000 ms; 0 < interval < dead_after.
	 */
	cohort_duration heartbeat_interval;
	cohort_duration dead_after;
	/* Data-plane backend for the world group: "auto" (default: tcp for
	 * host memory; nccl, else tcp-staged, for device memory), "tcp"
	 * (peer to peer, shared memory between ranks of one host), "nccl"
	 * (device memory), "tcp-staged" (device memory through pinned host
	 * buffers and tcp, several ranks on one GPU) or "service" (through
	 * cohortd). */
	const char *backend;
	/* Address the tcp backend listens on for peers; NULL = the address of
	 * the interface that reaches the coordinator. */
	const char *data_addr;
	/* How long calls wait for a lost coordinator to come back (cohortd
	 * restarted from its journal, a rescheduled pod) before they fail
	 * with COHORT_ENOCOORD; data-plane collectives keep running
	 * meanwhile. COHORT_WAIT_DEFAULT (the default): COHORT_RECONNECT_MS,
	 * else 60 s (COHORT_TIMEOUT_SCALE applies), capped at op_timeout.
	 * 0: fail at once. Must not exceed op_timeout. */
	cohort_duration reconnect_window;
	/* Elastic membership (docs/elastic.md): the smallest world the job
	 * lives with; world_size is then the largest. 0 (the default): not
	 * elastic, a lost member fails the job. From COHORT_MIN_WORLD (set by
	 * `cohort run --nnodes MIN:MAX`). */
	int32_t min_world;
} cohort_options;

/* Fills *opts with defaults (rank -1, world_size 0, job "default", ...).
 * Never fails. */
COHORT_API void cohort_options_init(cohort_options *opts);

/* Fills *opts from a resolved environment. The strings in *opts point into
 * *env, which must outlive *opts. Returns COHORT_EINVAL (and leaves *opts
 * untouched) if env has no coordinator or no world size. */
COHORT_API cohort_status cohort_options_from_env(
    cohort_options *opts, const cohort_env *env);

/* ------------------------------------------------------------------------ */
/* Client (membership)                                                      */
/* ------------------------------------------------------------------------ */

/* cohort_client_open connects to cohortd and joins the job's rendezvous.
 * It blocks until all opts->world_size members joined (the rendezvous
 * completed and a new generation began), or the join timeout elapsed.
 * Returns COHORT_OK and *out; COHORT_ETIMEDOUT (detail via
 * cohort_last_error() names the ranks that did not join); COHORT_EAUTH for
 * a wrong token; COHORT_EEXIST if the requested rank is taken by a live
 * member; COHORT_EINVAL for bad options or a world size that disagrees
 * with the job's; COHORT_ENOCOORD if cohortd cannot be reached before the
 * timeout. On error nothing is left behind. timeout applies to the whole
 * open (connect + join); COHORT_WAIT_DEFAULT means opts->join_timeout. */
COHORT_API cohort_status cohort_client_open(
    const cohort_options *opts, cohort_client **out, cohort_duration timeout);

/* cohort_env_resolve + cohort_options_from_env + cohort_client_open. */
COHORT_API cohort_status cohort_client_open_env(
    cohort_client **out, cohort_duration timeout);

/* Leaves the job cleanly (others do not see it as a failure) and frees
 * everything, including groups created from it. Blocks at most a short
 * bounded time (2 s) telling cohortd; NULL-safe. */
COHORT_API void cohort_client_close(cohort_client *c);

COHORT_API int32_t cohort_client_rank(const cohort_client *c);
COHORT_API int32_t cohort_client_world_size(const cohort_client *c);
COHORT_API int32_t cohort_client_local_rank(const cohort_client *c);
COHORT_API uint64_t cohort_client_generation(const cohort_client *c);
COHORT_API bool cohort_client_is_global_zero(const cohort_client *c);
/* The world group; owned by the client, valid until cohort_client_close. */
COHORT_API cohort_group *cohort_client_world(cohort_client *c);

/* Sticky client-level error (e.g. the job failed), COHORT_OK if healthy. */
COHORT_API cohort_status cohort_client_error(const cohort_client *c);

/* ------------------------------------------------------------------------ */
/* Elastic membership (docs/elastic.md, proto/README.md section 8)          */
/* ------------------------------------------------------------------------ */

/* A job opened with opts->min_world > 0 lives through the loss of members
 * while at least min_world remain: the survivors move to a new generation
 * in their running processes, renumbered densely in their old order. A
 * call that fails because of such a change returns COHORT_EMEMBERSHIP on
 * every survivor (a broken data-plane connection waits for cohortd's
 * verdict, at most about 2 s, so the two never disagree); every later call
 * on every group of the client returns it too until cohort_client_reform.
 * New processes join a running elastic job at a step boundary
 * (cohort_step_boundary), up to world_size members. */

typedef struct cohort_reform_info {
	uint64_t generation; /* the generation moved to */
	uint64_t prev_generation; /* the one the client was in */
	int32_t rank; /* this process's rank in the new generation */
	int32_t world_size;
	int32_t prev_rank; /* in prev_generation; -1: this process joined */
	int32_t prev_world_size;
	int32_t lost; /* members of prev_generation not in the new one */
	int32_t joined; /* members of the new one not in prev_generation */
} cohort_reform_info;

/* Moves the client and every group it holds (the world, subgroups; their
 * handles stay valid) to the job's current generation: asks cohortd for
 * this process's rank in it, tears down every group's data plane (tcp
 * mesh, shared memory, hierarchy, the NCCL communicator is aborted) and
 * sets it up again for the new membership at the latest at the group's
 * next collective. A subgroup keeps its surviving members in their old
 * order; one this process can no longer share with anyone has size 1. The
 * sticky errors of the old generation are cleared. Must not run while any
 * call is in flight on any group of c (wait for or free asynchronous work
 * first). Returns COHORT_OK and *out (may be NULL); COHORT_OK with
 * out->generation == out->prev_generation when there was nothing to do;
 * COHORT_EMEMBERSHIP when the job moved again meanwhile (call again);
 * COHORT_EPEERLOST when this process is no longer a member (it was
 * declared dead; the detail says why) or the job fell below its minimum;
 * COHORT_ENOTSUP for a job that is not elastic; COHORT_ETIMEDOUT,
 * COHORT_ENOCOORD. Blocks at most timeout. */
COHORT_API cohort_status cohort_client_reform(
    cohort_client *c, cohort_reform_info *out, cohort_duration timeout);

/* The elastic range of the job (0, 0 when it is not elastic). */
COHORT_API void cohort_client_elastic_range(
    const cohort_client *c, int32_t *min_world, int32_t *max_world);

typedef enum {
	COHORT_STATE_NONE = 0, /* no state moves to or from this rank */
	COHORT_STATE_SEND = 1, /* this rank sends the state */
	COHORT_STATE_RECV = 2, /* this rank holds none and receives it */
} cohort_state_role;

typedef struct cohort_boundary {
	/* The job moved to a new generation at this boundary (joiners were
	 * admitted): c is already reformed, reform says how. */
	bool changed;
	cohort_reform_info reform;
	/* A state transfer follows (cohort_state_transfer) when not NONE. */
	cohort_state_role role;
	int32_t sender; /* rank that sends, -1 when no transfer */
	int32_t receivers; /* how many ranks receive */
} cohort_boundary;

/* The step boundary of an elastic job: every member calls it once per
 * training step, after the step's collectives and before applying the
 * step's update. It completes when every member of the generation arrived;
 * every member gets the same answer, so it is the commit point: COHORT_OK
 * means every member reached it and applies the step; COHORT_EMEMBERSHIP
 * (a member was lost first) means no member does, and every one reforms
 * and repeats the step. When processes wait to join and the job is below
 * its maximum, the boundary admits them: the old members keep their
 * ranks, the joiners take the next ones, c is reformed before return and
 * out->changed is set. Whenever a member holds no state (a joiner, until
 * it completed a transfer), out->role tells each rank whether it sends or
 * receives the state (cohort_state_transfer). A rank whose role is SEND
 * or RECV calls cohort_state_transfer before its next boundary (which
 * returns COHORT_ESTATE until it did); a rank with role NONE goes on. A
 * process admitted into a running job calls it first thing after
 * cohort_client_open: it returns at once (no round trip: the boundary
 * that admitted it gave the others the same roles) with out->role =
 * COHORT_STATE_RECV, and the members that were there transfer right after
 * that admitting boundary - not after another one. On a job that is not
 * elastic it is a barrier (out->changed false, role NONE). Returns
 * COHORT_OK, COHORT_EMEMBERSHIP, COHORT_EPEERLOST (below the minimum),
 * COHORT_ESTATE, COHORT_ETIMEDOUT, COHORT_ENOCOORD. Blocks at most
 * timeout (one round trip to cohortd when every member is there). */
COHORT_API cohort_status cohort_step_boundary(
    cohort_client *c, cohort_boundary *out, cohort_duration timeout);

/* Moves the state from the sender named by the last boundary to every
 * receiver, over the data plane (peer to peer, not through cohortd), on
 * the subgroup "cohort.state.<generation>.<boundary's op_seq>" of the
 * sender and the receivers: 8 bytes of length, then the bytes in
 * broadcasts of at most 64 MiB. The
 * sender passes send/len (recv, recv_len unused); a receiver gets a
 * malloc'd copy in *recv (cohort_free) and its length in *recv_len
 * (send, len unused); a rank with role NONE returns COHORT_OK at once.
 * A receiver holds state after COHORT_OK (its next boundary says so).
 * Returns COHORT_OK; COHORT_EMEMBERSHIP when a participant was lost (the
 * receivers still hold none: reform, then the next boundary names a
 * sender again); COHORT_ESTATE without a boundary that asked for it;
 * COHORT_ETIMEDOUT. Blocks at most timeout. */
COHORT_API cohort_status cohort_state_transfer(cohort_client *c,
    const void *send, size_t len, void **recv, size_t *recv_len,
    cohort_duration timeout);

/* The timeline (COHORT_TIMELINE, docs/observability.md). Strategies and
 * programs add their own spans to it, e.g. DDP's bucket fills and comm
 * hooks. cohort_now_ns is the clock of the timeline (monotonic);
 * cohort_timeline_enabled is false when nothing is recorded, so that a
 * caller can skip its clock reads; cohort_timeline_span records `name`
 * (copied, 39 bytes kept) from start_ns to end_ns (end_ns == 0: an
 * instant) on the strategy track, with `bytes` as an argument. Thread-safe;
 * no-op when off or c is NULL. */
COHORT_API uint64_t cohort_now_ns(void);
COHORT_API bool cohort_timeline_enabled(const cohort_client *c);
COHORT_API void cohort_timeline_span(cohort_client *c, const char *name,
    uint64_t start_ns, uint64_t end_ns, uint64_t bytes);

/* Detail text of the last error returned to the calling thread by any
 * cohort_* function (thread-local; "" if none). Valid until the next cohort
 * call on this thread. Used where no handle exists yet (client_open). */
COHORT_API const char *cohort_last_error(void);

/* Tells cohortd that this rank failed, with a text (an exception trace, an
 * assertion message). Every other member's pending and later calls fail
 * with COHORT_EPEERLOST whose detail includes this text. Call it before
 * exiting on a fatal error (like Lightning's reconciliate_processes). Blocks
 * until cohortd acknowledged or timeout. */
COHORT_API cohort_status cohort_report_failure(
    cohort_client *c, const char *text, cohort_duration timeout);

/* ------------------------------------------------------------------------ */
/* Key-value store (per job, shared by all its members)                     */
/* ------------------------------------------------------------------------ */
/* Semantics of torch's TCPStore. Keys are non-empty strings up to 1024
 * bytes; values are bytes up to the coordinator's limit (64 MiB by default,
 * COHORT_ETOOBIG beyond). Values returned to the caller are malloc'd and
 * freed with cohort_free(). A job's keys are invisible to other jobs. KV
 * calls do not depend on the group's health: they work while the job is
 * being restarted. */

COHORT_API void cohort_free(void *p);

COHORT_API cohort_status cohort_kv_set(cohort_client *c, const char *key,
    const void *value, size_t len, cohort_duration timeout);

/* Blocks until key exists (like TCPStore.get), then returns its value.
 * COHORT_ETIMEDOUT if it did not appear in time. */
COHORT_API cohort_status cohort_kv_get(cohort_client *c, const char *key,
    void **value, size_t *len, cohort_duration timeout);

/* Atomically adds delta to the decimal integer stored at key (absent = 0)
 * and returns the new value in *out (may be NULL). COHORT_EINVAL if the
 * stored value is not an integer. */
COHORT_API cohort_status cohort_kv_add(cohort_client *c, const char *key,
    int64_t delta, int64_t *out, cohort_duration timeout);

/* If key's value equals expected (expected == NULL: key absent), set it to
 * desired. *swapped (may be NULL) tells whether it did; *current (may be
 * NULL; free with cohort_free) receives the value after the operation. */
COHORT_API cohort_status cohort_kv_compare_set(cohort_client *c,
    const char *key, const void *expected, size_t expected_len,
    const void *desired, size_t desired_len, bool *swapped, void **current,
    size_t *current_len, cohort_duration timeout);

COHORT_API cohort_status cohort_kv_delete(
    cohort_client *c, const char *key, bool *deleted, cohort_duration timeout);

COHORT_API cohort_status cohort_kv_num_keys(
    cohort_client *c, int64_t *out, cohort_duration timeout);

/* Blocks until every key exists. COHORT_ETIMEDOUT names the absent keys in
 * the detail text. */
COHORT_API cohort_status cohort_kv_wait(cohort_client *c,
    const char *const *keys, size_t nkeys, cohort_duration timeout);

/* Non-blocking existence check of all keys. */
COHORT_API cohort_status cohort_kv_check(cohort_client *c,
    const char *const *keys, size_t nkeys, bool *all_present,
    cohort_duration timeout);

/* Appends bytes to key's value (creating it). */
COHORT_API cohort_status cohort_kv_append(cohort_client *c, const char *key,
    const void *value, size_t len, cohort_duration timeout);

/* ------------------------------------------------------------------------ */
/* Groups and control-plane collectives (through cohortd)                   */
/* ------------------------------------------------------------------------ */

COHORT_API int32_t cohort_group_rank(const cohort_group *g);
COHORT_API int32_t cohort_group_size(const cohort_group *g);
/* The job rank of group rank r, -1 if out of range. */
COHORT_API int32_t cohort_group_global_rank(const cohort_group *g, int32_t r);

/* Sticky first error of the group, COHORT_OK while healthy. */
COHORT_API cohort_status cohort_group_error(const cohort_group *g);
COHORT_API bool cohort_group_is_healthy(const cohort_group *g);
/* The sticky error as text, composed from cohort_group_failure's record
 * by cohort_failure_format: "rank 3 (node7:99) failed during allreduce
 * (#812): connection lost (0.4 s ago)", then the failed rank's further
 * lines (a traceback) if it reported any; "" while healthy or g is NULL.
 * Thread-safe: the text is composed into a buffer of the calling thread,
 * valid until that thread's next call of this function (on any group). */
COHORT_API const char *cohort_group_last_error(const cohort_group *g);

/* Why a group failed (cohort_failure.kind). The first five are cohortd's
 * verdict on a peer and keep the wire's numbers (proto FailureKind). */
typedef enum {
	COHORT_FAILURE_NONE = 0, /* healthy */
	COHORT_FAILURE_PROCESS = 1, /* a rank's process ended (its connection
	                               to cohortd closed: crash, kill, OOM) */
	COHORT_FAILURE_HEARTBEAT = 2, /* a rank went silent past dead-after
	                                 (host frozen, stopped, cut off) */
	COHORT_FAILURE_REPORTED = 3, /* a rank reported its own failure
	                                (cohort_report_failure) */
	COHORT_FAILURE_LEFT = 4, /* a rank left the job while an operation
	                            waited for it */
	COHORT_FAILURE_RESTORE = 5, /* a rank did not reconnect after the
	                               coordinator restarted */
	COHORT_FAILURE_PEER = 6, /* a rank failed; cohortd did not say how */
	COHORT_FAILURE_GENERATION = 7, /* the job moved to a new generation */
	COHORT_FAILURE_COORDINATOR = 8, /* this process lost the coordinator
	                                   past its reconnect window */
	COHORT_FAILURE_DATA_PLANE = 9, /* the data plane failed here (a
	                                  peer's connection, the backend) */
	COHORT_FAILURE_TIMEOUT = 10, /* a data-plane operation timed out */
	COHORT_FAILURE_ABORTED = 11, /* cohort_group_abort, or closed early */
	COHORT_FAILURE_INJECTED = 12, /* a fault schedule (action=drop) */
	COHORT_FAILURE_UNAVAILABLE = 13, /* the group's backend cannot run */
} cohort_failure_kind;

/* Where the failed rank was (cohort_failure.op_state). */
typedef enum {
	COHORT_FAILURE_OP_UNKNOWN = 0, /* no operation known */
	COHORT_FAILURE_OP_DURING = 1, /* inside `operation` */
	COHORT_FAILURE_OP_AFTER = 2, /* `operation` was the last it left */
} cohort_failure_op_state;

/* A group's sticky failure as data (NCCL's ncclCommGetAsyncError with the
 * details). Fixed-size fields, strings NUL-terminated and cut to fit.
 * Versioned by size: set `size` to sizeof(cohort_failure) before the call
 * (COHORT_FAILURE_INIT); fields are only ever appended, and the library
 * writes none beyond `size`. */
typedef struct cohort_failure {
	size_t size; /* in: sizeof(cohort_failure) of the caller */
	cohort_status status; /* the group's sticky status; COHORT_OK: healthy
	                         and every other field is zero/empty */
	cohort_failure_kind kind;
	int32_t rank; /* job rank that failed; -1: none or not known */
	int32_t group_rank; /* its rank in this group; -1: none, not known or
	                       not a member */
	uint32_t pid; /* its process id; 0: not known */
	char host[256]; /* its host; "": not known */
	char operation[192]; /* the operation it failed in or after:
	                        "allreduce", "barrier 'epoch-3'"; "": not known
	                      */
	char group[256]; /* that operation's group name; "": the world */
	uint64_t seq; /* that operation's number in its group; 0: not known */
	cohort_failure_op_state op_state;
	/* The operation is from the rank's last heartbeat, sent this long
	 * before it failed; 0: known at the failure itself. */
	uint64_t op_age_ms;
	uint64_t age_ms; /* how long ago it happened, as of this call */
	int64_t unix_ms; /* when, in ms since 1970 (the coordinator's clock for
	                    a peer's failure); 0: not known */
	char text[4096]; /* the failed rank's own words ("connection lost", "no
	                    heartbeat for 5.0 s", a reported traceback), or
	                    for a failure seen here, what was seen */
	char observed[1024]; /* what this process saw itself when that differs
	                        from the cause ("allreduce #12: rank 3 closed
	                        the connection"); "" if nothing */
} cohort_failure;

/* A designated initialiser (C99, C++20); elsewhere set .size by hand. */
#define COHORT_FAILURE_INIT                                                   \
	{                                                                     \
		.size = sizeof(cohort_failure)                                \
	}

/* Copies g's sticky failure into *f: the first failure recorded on the
 * group (cohortd's verdict on a peer, or what this process saw), never
 * merged with later ones. Returns COHORT_OK (f->status COHORT_OK while
 * healthy); COHORT_EINVAL if g or f is NULL or f->size is smaller than
 * the first version of the struct. Never blocks; any thread. */
COHORT_API cohort_status cohort_group_failure(
    const cohort_group *g, cohort_failure *f);

/* The one human text of a failure, as cohort_group_last_error shows it,
 * into buf (len bytes, always NUL-terminated when len > 0). Returns the
 * length the whole text needs, like snprintf. */
COHORT_API size_t cohort_failure_format(
    const cohort_failure *f, char *buf, size_t len);

/* "process", "heartbeat", "reported", ...; never NULL. */
COHORT_API const char *cohort_failure_kind_name(cohort_failure_kind kind);

/* Marks the group aborted and wakes every call blocked on it, which
 * returns COHORT_EABORTED (unless it already failed otherwise). Never
 * blocks; any thread; idempotent. */
COHORT_API void cohort_group_abort(cohort_group *g);

/* cohort_barrier returns when every member of g entered the barrier named
 * name (may be NULL or "": unnamed), or fails: COHORT_ETIMEDOUT (detail
 * names the ranks that never arrived; g stays usable), COHORT_EPEERLOST (a
 * member failed: detail names it and its error text), COHORT_EMISMATCH (the
 * members' n-th collective differs in kind or name), COHORT_EABORTED. */
COHORT_API cohort_status cohort_barrier(
    cohort_group *g, const char *name, cohort_duration timeout);

/* Broadcasts bytes of any size (up to the coordinator's limit) from group
 * rank root to all members. On root, data/len are the object and *out /
 * *out_len may be NULL (if not, root receives a copy too). On the others,
 * data is ignored and *out receives a malloc'd copy (free with
 * cohort_free). */
COHORT_API cohort_status cohort_broadcast_obj(cohort_group *g, int32_t root,
    const void *data, size_t len, void **out, size_t *out_len,
    cohort_duration timeout);

/* Element-wise reduction of a small vector of int64 (COHORT_I64) or double
 * (COHORT_F64) values, in place, result on every member. count <= 4096.
 * op: SUM, PROD, MIN, MAX, MEAN (MEAN only for F64). */
COHORT_API cohort_status cohort_reduce_scalars(cohort_group *g,
    cohort_dtype dtype, cohort_redop op, void *values, size_t count,
    cohort_duration timeout);

/* reduce_boolean_decision: *out = all (if all is true) or any of the
 * members' decisions, the same on every member. */
COHORT_API cohort_status cohort_decide(cohort_group *g, bool decision,
    bool all, bool *out, cohort_duration timeout);

/* ------------------------------------------------------------------------ */
/* Data-plane collectives (tcp peer to peer, nccl, or service)              */
/* ------------------------------------------------------------------------ */
/* Buffers are borrowed for the duration of a blocking call, or until the
 * work completes for the asynchronous forms. send == recv (where both
 * exist) means in place. count == 0 is valid and completes without
 * traffic. Counts are in elements of dtype. `stream` is a cudaStream_t for
 * the nccl backend and must be NULL otherwise. All members of the group
 * must issue the same sequence of collectives with matching arguments.
 * The tcp (and tcp-staged) and service backends check that: members that
 * disagree on the operation, count, dtype, op or root (or issue them in
 * another order) all get COHORT_EMISMATCH, whose detail names two of them
 * and their values ("ranks disagree: rank 0 count 64, rank 1 count 256").
 * A disagreement found before any data moved leaves the group usable; one
 * found in the same-host shared-memory allreduce of tcp makes every later
 * call on the group fail with the same detail. nccl does not check.
 * A failed peer makes pending and later calls return COHORT_EPEERLOST
 * naming it; COHORT_ETIMEDOUT on a data-plane call leaves the group's
 * connections in an unknown state, so it *does* poison the group. */

/* Creates a subgroup of the job from a list of distinct job ranks (group
 * rank i = ranks[i]), like torch's new_group. Every listed rank must call
 * it with the same name and list; other ranks must not. backend: NULL =
 * the client's default. Blocks until all listed ranks created it. The
 * group is freed by cohort_group_destroy or cohort_client_close. */
COHORT_API cohort_status cohort_group_new(cohort_client *c, const char *name,
    const int32_t *ranks, size_t nranks, const char *backend,
    cohort_group **out, cohort_duration timeout);

/* Frees a subgroup (NULL-safe; ignores the world group, which the client
 * owns). Waits for its in-flight work to finish or fail. */
COHORT_API void cohort_group_destroy(cohort_group *g);

/* Sets up the group's data plane now (the tcp mesh between its members
 * and, on one host, the shared-memory segment) and returns when it is
 * ready, so that the first collective pays no connection set-up. It
 * runs (or waits for) the set-up every member does at the latest at its
 * first collective, so other members need not call it. Optional: a
 * host-memory group starts the same
 * set-up in the background as soon as it is created (COHORT_EAGER_CONNECT
 * =1, the default, where the backend is known then: a configured tcp or
 * service backend, or "auto" on a machine without NVIDIA devices), and
 * otherwise its first collective does it. Returns at once when already
 * set up; COHORT_ETIMEDOUT after timeout; a set-up failure is the group's
 * sticky error (naming the peer that cannot be reached). */
COHORT_API cohort_status cohort_group_connect(
    cohort_group *g, cohort_duration timeout);

/* Name of the data-plane backend the group uses ("tcp", "nccl",
 * "tcp-staged", "service"). */
COHORT_API const char *cohort_group_backend(const cohort_group *g);

COHORT_API cohort_status cohort_allreduce(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, cohort_redop op,
    void *stream, cohort_duration timeout);

/* Result only on root (recv ignored elsewhere, may be NULL). */
COHORT_API cohort_status cohort_reduce(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, cohort_redop op,
    int32_t root, void *stream, cohort_duration timeout);

/* In place: root's buf is sent, everyone else's is overwritten. */
COHORT_API cohort_status cohort_broadcast(cohort_group *g, void *buf,
    size_t count, cohort_dtype dtype, int32_t root, void *stream,
    cohort_duration timeout);

/* recv holds size * count elements, rank r's at offset r * count. */
COHORT_API cohort_status cohort_allgather(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, void *stream,
    cohort_duration timeout);

/* Unequal counts: rank r contributes counts[r] elements, placed at offset
 * sum(counts[0..r)) of recv. counts has group-size entries, equal on all
 * members; send holds counts[my rank] elements. */
COHORT_API cohort_status cohort_allgatherv(cohort_group *g, const void *send,
    void *recv, const size_t *counts, cohort_dtype dtype, void *stream,
    cohort_duration timeout);

/* send holds size * count elements; rank r receives the reduction of
 * block r (count elements) in recv. */
COHORT_API cohort_status cohort_reduce_scatter(cohort_group *g,
    const void *send, void *recv, size_t count, cohort_dtype dtype,
    cohort_redop op, void *stream, cohort_duration timeout);

/* send and recv hold size * count elements; block j of send goes to rank
 * j, block i of recv came from rank i. Not in place. */
COHORT_API cohort_status cohort_alltoall(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, void *stream,
    cohort_duration timeout);

/* recv (root only) holds size * count elements. */
COHORT_API cohort_status cohort_gather(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, int32_t root, void *stream,
    cohort_duration timeout);

/* send (root only) holds size * count elements; rank r gets block r. */
COHORT_API cohort_status cohort_scatter(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, int32_t root, void *stream,
    cohort_duration timeout);

/* Asynchronous forms: start the operation and return a handle at once.
 * Operations on one group complete in issue order. The buffers must stay
 * valid and untouched until the work completes. Every started work must be
 * released with cohort_work_free (after completion, or it waits). */
COHORT_API cohort_status cohort_iallreduce(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, cohort_redop op,
    void *stream, cohort_work **out);
COHORT_API cohort_status cohort_ibroadcast(cohort_group *g, void *buf,
    size_t count, cohort_dtype dtype, int32_t root, void *stream,
    cohort_work **out);
COHORT_API cohort_status cohort_iallgather(cohort_group *g, const void *send,
    void *recv, size_t count, cohort_dtype dtype, void *stream,
    cohort_work **out);
COHORT_API cohort_status cohort_ireduce_scatter(cohort_group *g,
    const void *send, void *recv, size_t count, cohort_dtype dtype,
    cohort_redop op, void *stream, cohort_work **out);

/* Waits for the work: COHORT_OK, its error, or COHORT_ETIMEDOUT if it did
 * not complete within timeout (the work goes on; wait again or free). */
COHORT_API cohort_status cohort_work_wait(
    cohort_work *w, cohort_duration timeout);
/* Non-blocking: *done = completed (successfully or not); returns the
 * work's status if done, COHORT_OK otherwise. */
COHORT_API cohort_status cohort_work_test(cohort_work *w, bool *done);
/* Waits for completion (bounded by the group's failure detection) and
 * frees. NULL-safe. */
COHORT_API void cohort_work_free(cohort_work *w);

#ifdef __cplusplus
}
#endif

#endif /* COHORT_COHORT_H */
