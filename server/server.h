/*
 * server.h - cohortd as a library: start a coordinator in this process.
 *
 * cohortd (server/main.c), the launcher (`cohort run`) and the tests embed
 * the coordinator through these calls. There is no global state: several
 * servers may run in one process, each with its own socket, jobs and keys.
 */
#ifndef COHORT_SERVER_H
#define COHORT_SERVER_H

#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

#define COHORT__SRV_DEFAULT_URL "tcp://0.0.0.0:29400"
#define COHORT__SRV_DEFAULT_MAX_JOB_BYTES (1ull << 30)
#define COHORT__SRV_DEFAULT_MAX_KEYS 1000000u
#define COHORT__SRV_DEFAULT_POOL 16u
#define COHORT__SRV_DEFAULT_MAX_TOTAL_BYTES (4ull << 30)
#define COHORT__SRV_DEFAULT_MAX_TOTAL_KEYS 10000000u
#define COHORT__SRV_DEFAULT_MAX_JOBS 10000u
#define COHORT__SRV_DEFAULT_MAX_MEMBERS 65536u
#define COHORT__SRV_DEFAULT_MAX_TOTAL_MEMBERS 262144u
/* A job with no running member and no connected client is removed after
 * this long (failed or abandoned: joined, connection dropped, no Leave). */
#define COHORT__SRV_DEFAULT_JOB_EXPIRY_MS 600000u

struct cohort__srv_config {
	/* nng URLs to listen on (tcp://, ipc://, tls+tcp://). Port 0 binds a
	 * free port: see cohort__srv_url. None = COHORT__SRV_DEFAULT_URL. */
	const char *const *listen;
	size_t nlisten;
	/* Jobs created in advance, "NAME:TOKEN" each. */
	const char *const *jobs;
	size_t njobs;
	uint64_t max_value_bytes; /* largest KV value / object */
	uint64_t max_job_bytes; /* keys + values of one job */
	uint64_t max_keys; /* keys of one job */
	uint64_t max_total_bytes; /* keys + values of all jobs */
	uint64_t max_total_keys; /* keys of all jobs */
	uint64_t max_jobs; /* jobs held at once */
	uint64_t max_members; /* world size of one job */
	uint64_t max_total_members; /* world sizes of all jobs */
	/* A job with no running member and no connected client is removed
	 * (with its keys and journal records) after this long; 0 = never. */
	uint64_t job_expiry_ms;
	/* The admin secret: if set, a StatusQuery without a job must carry
	 * it, and job tokens are minted from it (docs/security.md). */
	const char *admin_token;
	/* A join creates a job only with a token cohortd accepts (the one
	 * minted from admin_token for the job); jobs given in `jobs` (or
	 * restored from the journal) are joined with their own token. */
	bool require_token;
	/* Without an admin secret, a StatusQuery for all jobs is refused
	 * unless this is set (a private coordinator: `cohort run`). */
	bool open_status;
	/* /metrics adds series labelled with job names. */
	bool metrics_per_job;
	/* TLS of the tls+tcp:// listeners (PEM files): this cohortd's
	 * certificate chain and key (required by a tls+tcp:// listener), the
	 * CA that signs client certificates, and whether a client must
	 * present one (verify_clients, needs tls_ca). */
	const char *tls_cert;
	const char *tls_key;
	const char *tls_ca;
	bool tls_verify_clients;
	/* "ADDR:PORT" of the HTTP endpoint (/metrics, /healthz, /readyz);
	 * NULL = none. */
	const char *http;
	uint32_t pool_size; /* receiving nng contexts, 0 = default */
	/* Journal directory (--state-dir): state survives a restart; NULL =
	 * none. */
	const char *state_dir;
	/* "batch" (default: fdatasync every 100 ms), "always" (before each
	 * reply), "none". */
	const char *fsync;
	/* Damage in the journal: keep every whole record and move the
	 * damaged file aside instead of refusing to start (--recover). */
	bool state_recover;
	/* Log size that triggers a snapshot at the earliest; 0 = 64 MiB. */
	uint64_t compact_min_bytes;
	/* A collective waiting longer is logged and shown as stalled;
	 * 0 = COHORT__SRV_DEFAULT_STALL_MS. */
	uint32_t stall_threshold_ms;
	/* After a restart from the journal, how long members have to
	 * reconnect before they are declared dead (at least their own
	 * dead-after); 0 = COHORT__SRV_DEFAULT_RESTORE_GRACE_MS. A client
	 * re-dials within a second, but one whose SYN met the coordinator's
	 * host while it was down waits for the kernel's retransmission
	 * (1 s, then 3 s). */
	uint32_t restore_grace_ms;
	/* An elastic job's first rendezvous completes with at least its
	 * minimum of members once no join came for this long (torchrun's
	 * last_call_timeout); 0 = COHORT__SRV_DEFAULT_RDZV_LAST_CALL_MS. */
	uint32_t rdzv_last_call_ms;
	/* TCPStore listeners, "[JOB@]ADDR:PORT" each (docs/pytorch.md):
	 * torch's own TCPStore clients use the job's KV. JOB defaults to
	 * "torch-PORT"; its token, if any, comes from a --job entry. */
	const char *const *torch_stores;
	size_t ntorch_stores;
	/* A TCPStore request left incomplete this long closes its
	 * connection; 0 = 30 s. */
	uint32_t torch_store_partial_ms;
	/* A connection that has not completed a request this long after it
	 * was established is closed; 0 = COHORT__SRV_DEFAULT_FIRST_REQUEST_MS.
	 */
	uint32_t first_request_ms;
	/* A connection without a running member or a parked request that
	 * sent no complete request this long is closed; 0 =
	 * COHORT__SRV_DEFAULT_IDLE_MS. */
	uint32_t idle_ms;
	/* (job, rank) pairs whose per-rank metrics /metrics shows; the
	 * least recently updated is evicted beyond it; 0 = none
	 * (docs/observability.md). Default COHORT__SRV_DEFAULT_METRICS_RANKS.
	 */
	uint32_t metrics_max_ranks;
};

#define COHORT__SRV_DEFAULT_METRICS_RANKS 512u

#define COHORT__SRV_DEFAULT_STALL_MS 60000u
/* A connection's first complete request must arrive within this. */
#define COHORT__SRV_DEFAULT_FIRST_REQUEST_MS 10000u
/* A connection with no running member and no parked request, silent
 * this long, is closed. */
#define COHORT__SRV_DEFAULT_IDLE_MS 60000u
#define COHORT__SRV_DEFAULT_RESTORE_GRACE_MS 15000u
/* An elastic rendezvous with its minimum waits this long for more. */
#define COHORT__SRV_DEFAULT_RDZV_LAST_CALL_MS 5000u

struct cohort__srv;

/* Fills *cfg with the defaults (no listen URL: the default one). */
void cohort__srv_config_init(struct cohort__srv_config *cfg);

/* Starts a coordinator: listens on every URL and serves requests on nng's
 * threads until cohort__srv_stop. Returns COHORT_OK and *out, or
 * COHORT_EINVAL (bad configuration, detail in cohort_last_error()),
 * COHORT_ETRANSPORT / COHORT_EINVAL (cannot listen), COHORT_ENOMEM. Does
 * not block beyond binding its listeners. */
cohort_status cohort__srv_start(
    const struct cohort__srv_config *cfg, struct cohort__srv **out);

/* The i-th listening URL as bound (port 0 replaced by the real port), or
 * NULL past the end. Valid until cohort__srv_stop. */
const char *cohort__srv_url(const struct cohort__srv *s, size_t i);

/* The i-th TCPStore listener as bound ("ADDR:PORT"), NULL past the end. */
const char *cohort__srv_torch_store_addr(
    const struct cohort__srv *s, size_t i);

/* The HTTP endpoint as bound ("http://127.0.0.1:PORT"), NULL if none. */
const char *cohort__srv_http_url(const struct cohort__srv *s);

/* Milliseconds since the coordinator last served a client connection: 0
 * while any client is connected, else the time since the last one went
 * away (or since start). For `cohortd --exit-when-idle`. */
uint64_t cohort__srv_idle_ms(struct cohort__srv *s);

/* Answers every parked request with COHORT_ECLOSED, closes the listeners
 * and frees everything. Blocks until nng's callbacks have finished (at
 * most about a second for the final replies to leave). NULL-safe. */
void cohort__srv_stop(struct cohort__srv *s);

/* The first step of a graceful stop (SIGTERM, a pod's preStop): /readyz
 * answers 503 "draining" from now on, so that load balancers and
 * Kubernetes take the coordinator out of service, while every request
 * is still served, journalled and answered; cohort__srv_stop follows. */
void cohort__srv_drain(struct cohort__srv *s);
bool cohort__srv_draining(struct cohort__srv *s);
/* Whether /readyz is 200: not draining, and the journal (if any) can be
 * written; else false with the reason in why. */
bool cohort__srv_ready(struct cohort__srv *s, char *why, size_t len);

#endif /* COHORT_SERVER_H */
