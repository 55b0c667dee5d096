/*
 * knobs.h - every COHORT_* environment variable cohort reads, declared
 * once: name, type, default, range and a line of documentation. The
 * library reads the environment only through these functions (knobs.c
 * holds the only getenv of the C code); `cohort env` prints the table and
 * `cohort env --markdown` writes docs/environment.md from it.
 *
 * The launchers' own variables (torchrun's RANK, Open MPI's, SLURM's...)
 * are not knobs: client/env.c reads them through cohort__env_raw.
 */
#ifndef COHORT_COMMON_KNOBS_H
#define COHORT_COMMON_KNOBS_H

#include <stdbool.h>
#include <stdint.h>

#include "cohort/cohort.h"

enum cohort__knob_type {
	COHORT__KNOB_STR, /* text */
	COHORT__KNOB_INT, /* integer in [min, max] */
	COHORT__KNOB_MS, /* milliseconds in [min, max]; -1 = none */
	COHORT__KNOB_BYTES, /* a size in bytes in [min, max] */
	COHORT__KNOB_BOOL, /* 0 or 1 */
	COHORT__KNOB_FLOAT, /* a decimal number in [min, max] */
};

/* X(ID, type, default (text), min, max, group, doc) */
#define COHORT__KNOBS(X)                                                      \
	X(COORDINATOR, STR, "", 0, 0, "job",                                  \
	    "nng URL of cohortd (tcp://host:port, ipc://path)")               \
	X(JOB, STR, "default", 0, 0, "job",                                   \
	    "job name (a namespace at cohortd)")                              \
	X(TOKEN, STR, "", 0, 0, "job",                                        \
	    "job token; cohortd refuses a wrong one")                         \
	X(TOKEN_FILE, STR, "", 0, 0, "job",                                   \
	    "file holding the job token (when COHORT_TOKEN is unset)")        \
	X(RANK, INT, "-1", -1, 65535, "job",                                  \
	    "this process's rank; -1: cohortd assigns one")                   \
	X(WORLD_SIZE, INT, "0", 0, 65536, "job",                              \
	    "number of ranks in the job")                                     \
	X(MIN_WORLD, INT, "0", 0, 65536, "job",                               \
	    "elastic job: the fewest ranks it lives with (0: not elastic; "   \
	    "cohort run --nnodes MIN:MAX sets MIN x -n)")                     \
	X(MAX_WORLD, INT, "0", 0, 65536, "job",                               \
	    "elastic job: the most ranks it holds; the world size the "       \
	    "ranks ask for (0: COHORT_WORLD_SIZE)")                           \
	X(LOCAL_RANK, INT, "-1", -1, 65535, "job", "rank on this node")       \
	X(LOCAL_WORLD_SIZE, INT, "0", 0, 65536, "job", "ranks on this node")  \
	X(NODE_RANK, INT, "-1", -1, 65535, "job", "index of this node")       \
	X(RESTART_COUNT, INT, "0", 0, 1000000, "job",                         \
	    "restarts of the group so far (set by cohort run)")               \
	X(BIND, STR, "none", 0, 0, "job",                                     \
	    "CPU binding of a node's ranks by cohort run, cohort bench and "  \
	    "cohort_spawn: none, or cores (the launcher's CPUs split among "  \
	    "the node's ranks; docs/launchers.md)")                           \
	X(TLS_CA, STR, "", 0, 0, "tls",                                       \
	    "CA (PEM file) that signed cohortd's certificate; required "      \
	    "with a tls+tcp:// coordinator")                                  \
	X(TLS_CERT, STR, "", 0, 0, "tls",                                     \
	    "this client's certificate (PEM file), for a cohortd that "       \
	    "verifies clients")                                               \
	X(TLS_KEY, STR, "", 0, 0, "tls",                                      \
	    "the private key (PEM file) of COHORT_TLS_CERT")                  \
	X(TLS_SERVER_NAME, STR, "", 0, 0, "tls",                              \
	    "name cohortd's certificate must carry (default: the "            \
	    "coordinator URL's host)")                                        \
	X(ADMIN_TOKEN_FILE, STR, "", 0, 0, "cohortd",                         \
	    "file holding cohortd's admin secret (cohortd, cohort token, "    \
	    "cohort status)")                                                 \
	X(BACKEND, STR, "auto", 0, 0, "data plane",                           \
	    "data-plane backend: auto, tcp, service, nccl or tcp-staged")     \
	X(DATA_ADDR, STR, "", 0, 0, "data plane",                             \
	    "address the tcp backend listens on and advertises (default: "    \
	    "the local address of the route to the coordinator)")             \
	X(DATA_IFACE, STR, "", 0, 0, "data plane",                            \
	    "network interface whose address the tcp backend uses (when "     \
	    "COHORT_DATA_ADDR is unset)")                                     \
	X(CONNECT_TIMEOUT_MS, MS, "10000", 100, INT32_MAX, "timeouts",        \
	    "how long a rank keeps trying to connect to a peer's data plane") \
	X(TCP_HS_TIMEOUT_MS, MS, "2000", 100, INT32_MAX, "timeouts",          \
	    "how long a data-plane listener waits for a connection's "        \
	    "hello before dropping it")                                       \
	X(TIMEOUT_MS, MS, "1800000", -1, INT32_MAX, "timeouts",               \
	    "default timeout of blocking calls (30 min, like Lightning)")     \
	X(JOIN_TIMEOUT_MS, MS, "1800000", -1, INT32_MAX, "timeouts",          \
	    "how long cohort_client_open waits for every rank")               \
	X(HEARTBEAT_MS, MS, "1000", 1, INT32_MAX, "timeouts",                 \
	    "heartbeat period of a client")                                   \
	X(DEAD_AFTER_MS, MS, "5000", 1, INT32_MAX, "timeouts",                \
	    "silence after which cohortd declares a rank dead")               \
	X(RECONNECT_MS, MS, "60000", 0, INT32_MAX, "timeouts",                \
	    "how long calls wait for a lost coordinator to come back (the "   \
	    "data plane goes on); at most the operation timeout")             \
	X(TIMEOUT_SCALE, FLOAT, "1", 0, 1000, "timeouts",                     \
	    "multiplies the liveness defaults (heartbeat, dead-after)")       \
	X(LOG_LEVEL, STR, "warn", 0, 0, "logs",                               \
	    "error, warn, info, debug or trace (cohortd: info)")              \
	X(LOG_FORMAT, STR, "", 0, 0, "logs",                                  \
	    "text or json (default: text on a terminal, else json)")          \
	X(METRICS, BOOL, "1", 0, 1, "observability",                          \
	    "0: keep no per-rank metrics (none sent to cohortd's /metrics)")  \
	X(TIMELINE, STR, "", 0, 0, "observability",                           \
	    "write a Chrome trace of this rank's operations to this file "    \
	    "at close (%r: rank, %g: generation; docs/observability.md)")     \
	X(TIMELINE_EVENTS, INT, "16384", 16, 16777216, "observability",       \
	    "timeline ring size in events (240 bytes each); the oldest "      \
	    "are dropped")                                                    \
	X(FAULTS, STR, "", 0, 0, "faults",                                    \
	    "a fault schedule (docs/fault-injection.md)")                     \
	X(FAULTS_LOG, STR, "", 0, 0, "faults",                                \
	    "file the fault schedule's audit log is appended to")             \
	X(FAULTS_LISTEN, BOOL, "1", 0, 1, "faults",                           \
	    "0: do not take faults from `cohort fault` at run time")          \
	X(COHORTD, STR, "", 0, 0, "programs",                                 \
	    "the cohortd program cohort_spawn starts (default: beside the "   \
	    "running program, then PATH)")                                    \
	X(NCCL_LIB, STR, "", 0, 0, "programs",                                \
	    "libnccl to load (default: libnccl.so.2 from the loader path)")   \
	X(CUDART_LIB, STR, "", 0, 0, "programs",                              \
	    "libcudart to load (default: libcudart.so.13, .12, ...)")         \
	X(EAGER_CONNECT, BOOL, "1", 0, 1, "tcp tuning",                       \
	    "1: a host-memory group sets up its data plane (mesh, shared "    \
	    "memory) in the background right after it is created; 0: at "     \
	    "its first collective")                                           \
	X(TCP_SHM, BOOL, "1", 0, 1, "tcp tuning",                             \
	    "0: no shared memory between ranks of one host (pure TCP)")       \
	X(TCP_SHM_BLK, BYTES, "131072", 4096, 1073741824, "tcp tuning",       \
	    "shared-memory block per rank and step")                          \
	X(TCP_SHM_MIN, BYTES, "0", 0, INT64_MAX, "tcp tuning",                \
	    "smallest all-reduce that uses shared memory")                    \
	X(TCP_SHM_MAX, BYTES, "-1", -1, INT64_MAX, "tcp tuning",              \
	    "largest all-reduce that uses shared memory (-1: no limit)")      \
	X(TCP_SHM_SPINS, INT, "16", 0, 1073741824, "tcp tuning",              \
	    "busy polls before yielding (0 when ranks outnumber CPUs)")       \
	X(TCP_SHM_CMA_MIN, BYTES, "1048576", 0, INT64_MAX, "tcp tuning",      \
	    "smallest shared-memory all-reduce that reads the other ranks' "  \
	    "buffers directly (cross-memory attach; 4 MiB when ranks "        \
	    "outnumber CPUs); rank 0's value holds, 0 on any rank: never")    \
	X(TCP_HIER, BOOL, "1", 0, 1, "tcp tuning",                            \
	    "0: no hierarchical all-reduce (shared memory within a host, "    \
	    "TCP between hosts) for groups with several ranks per host")      \
	X(TCP_HIER_MIN, BYTES, "0", 0, INT64_MAX, "tcp tuning",               \
	    "smallest all-reduce that goes the hierarchical way")             \
	X(TCP_HIER_SPLIT, BYTES, "65536", 0, INT64_MAX, "tcp tuning",         \
	    "from this size, each rank of a host carries 1/L of the "         \
	    "hierarchical all-reduce between hosts (below: all carry it "     \
	    "all)")                                                           \
	X(TCP_SMALL_MAX, BYTES, "65536", 0, 1073741824, "tcp tuning",         \
	    "largest all-reduce done by recursive doubling")                  \
	X(TCP_BCAST_SMALL, BYTES, "65536", 0, 1073741824, "tcp tuning",       \
	    "largest broadcast sent directly by the root")                    \
	X(TCP_FUSED_RANKS, INT, "2", 0, 1048576, "tcp tuning",                \
	    "largest group (2, 4, 8..) whose small all-reduces send their "   \
	    "first round with the agreement")                                 \
	X(TCP_FUSED_FOLD_MAX, BYTES, "8192", 0, 1073741824, "tcp tuning",     \
	    "largest all-reduce that a group agreeing by the fold carries "   \
	    "in the fold's messages (0: none; every rank the same)")          \
	X(TCP_PAIR_MIN, BYTES, "0", 0, INT64_MAX, "tcp tuning",               \
	    "smallest all-reduce of 2 ranks done by direct exchange")         \
	X(TCP_PAIR_MAX, BYTES, "0", -1, INT64_MAX, "tcp tuning",              \
	    "largest all-reduce of 2 ranks done by direct exchange "          \
	    "(0: none, the ring; -1: all)")                                   \
	X(TCP_IO_MAX, BYTES, "262144", 4096, 1073741824, "tcp tuning",        \
	    "largest single receive (and cap of a send)")                     \
	X(TCP_SEND_MAX, BYTES, "0", 0, 1073741824, "tcp tuning",              \
	    "largest single send() (0: one packet of the kernel's, the "      \
	    "most whole segments of the connection in 64 KiB)")               \
	X(TCP_NOTSENT_LOWAT, BYTES, "32768", 0, 1073741824, "tcp tuning",     \
	    "TCP_NOTSENT_LOWAT of data-plane sockets: unsent bytes a socket " \
	    "may queue (0: the kernel's)")                                    \
	X(TCP_SPIN_US, INT, "50", 0, 100000, "tcp tuning",                    \
	    "microseconds of polling before sleeping in poll() (none while "  \
	    "a process runs more operations than it has CPUs)")               \
	X(TCP_SPIN_YIELD, BOOL, "1", 0, 1, "tcp tuning",                      \
	    "yield the CPU while polling")                                    \
	X(TCP_RING, BYTES, "262144", 4096, 1073741824, "tcp tuning",          \
	    "pipelined ring chunk")                                           \
	X(TCP_ACC, BYTES, "4194304", 4096, 1073741824, "tcp tuning",          \
	    "accumulation buffer of the ring")                                \
	X(TCP_SOCKBUF, BYTES, "0", 0, 1073741824, "tcp tuning",               \
	    "SO_SNDBUF/SO_RCVBUF of data-plane sockets (0: the kernel's)")    \
	X(TCP_AGREE_FOLD, INT, "-1", -1, 1, "tcp tuning",                     \
	    "1: a group agrees on each operation by recursive doubling "      \
	    "(log2 n rounds of one message); 0: every rank sends every "      \
	    "other its header (one round of n - 1); -1: the first when the "  \
	    "group has more ranks than this host has CPUs")                   \
	X(TCP_MESH_MAX, INT, "64", 1, 1048576, "tcp tuning",                  \
	    "largest host-backend group connected in full at set-up; larger " \
	    "ones connect each rank on first use to the O(log n) peers its "  \
	    "algorithms use")                                                 \
	X(SERVICE_CHUNK, BYTES, "1048576", 4096, 67108864, "tcp tuning",      \
	    "chunk of the service backend's replies")                         \
	X(REDUCE_ISA, STR, "", 0, 0, "tcp tuning",                            \
	    "force the reduction kernels: scalar, avx2 or avx512")

enum cohort__knob {
#define COHORT__KNOB_ENUM(id, type, dflt, min, max, group, doc)               \
	COHORT__KNOB_##id,
	COHORT__KNOBS(COHORT__KNOB_ENUM)
#undef COHORT__KNOB_ENUM
	    COHORT__KNOB_COUNT
};

struct cohort__knob_info {
	const char *name; /* "COHORT_TIMEOUT_MS" */
	enum cohort__knob_type type;
	const char *dflt; /* as text */
	int64_t min, max;
	const char *group;
	const char *doc;
};

/* The table entry of k (for cohort env and the docs). */
const struct cohort__knob_info *cohort__knob_info(enum cohort__knob k);

/* The variable's text, or NULL when unset or empty. */
const char *cohort__knob_str(enum cohort__knob k);

/* A numeric knob: COHORT_OK and *set = false when unset; COHORT_EINVAL,
 * naming the variable and its range, when malformed or out of range. */
cohort_status cohort__knob_int(enum cohort__knob k, int64_t *out, bool *set);

/* A numeric knob for tuning, where a bad value must not stop the job:
 * its value, or dflt when unset; a malformed or out-of-range value is
 * logged once as a warning and dflt used. */
int64_t cohort__knob_int_or(enum cohort__knob k, int64_t dflt);

/* A floating-point knob, same rules as cohort__knob_int_or. */
double cohort__knob_float_or(enum cohort__knob k, double dflt);

/* A variable that is not cohort's (a launcher's: RANK, SLURM_PROCID...),
 * or NULL when unset or empty. The C code's only other way to the
 * environment. */
const char *cohort__env_raw(const char *name);

#endif /* COHORT_COMMON_KNOBS_H */
