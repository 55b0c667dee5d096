/*
 * core.h - the coordinator's context (struct srv_core): its limits and
 * settings, counters, and the tables every layer of cohortd hangs its
 * objects on. One per coordinator, no global state.
 *
 * The layers, bottom up (docs/coordinator.md, Structure):
 *
 *   core/      this context, calls and their deadlines, replies and the
 *              reply cache, clients and connections (no job knowledge)
 *   journal/   log.c and record.c write records below the state;
 *              replay.c and snapshot.c rebuild and dump it from above
 *   state/     jobs, members, rendezvous, collectives, groups, the KV
 *   observe/   StatusQuery, /metrics, /status.json, per-rank metrics
 *   front/     the entry points (dispatch, events) and the front ends
 *              that call them (nng, TCPStore, HTTP)
 *
 * Everything here is used under the one server mutex, with `now` from
 * the caller; nothing blocks.
 */
#ifndef COHORT_SRV_CORE_H
#define COHORT_SRV_CORE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort_common.h"
#include "wire.h"
#include "list.h"
#include "map.h"

/* Largest job name, token, host, group name, last_op. */
#define SRV_MAX_NAME 255
/* Largest world. */
#define SRV_MAX_WORLD 65536
/* Clients remembered per job. */
#define SRV_MAX_CLIENTS (1u << 20)
/* Connections of clients that left, closed by cohortd shortly after the
 * Leave reply went out (see srv_pipes_take_to_close). */
#define SRV_CLOSE_PIPES 256

/* Limits; the ones after max_keys are 0 for "none" (cohortd sets its
 * defaults in cohort__srv_config_init). */
struct srv_limits {
	uint64_t max_value;
	uint64_t max_job_bytes;
	uint64_t max_keys;
	uint64_t max_total_bytes; /* keys + values of all jobs */
	uint64_t max_total_keys; /* keys of all jobs */
	uint64_t max_jobs; /* jobs held (abandoned ones until they expire) */
	uint64_t max_members; /* world size of one job */
	uint64_t max_total_members; /* world sizes of all jobs */
};

/* A transport handle (`tp`) that is a structure starts with this: a
 * front end whose replies do not go through the sink's own queue names
 * the function that takes them (TCPStore's requests), so that the one
 * sink serves every front end. NULL: the sink's owner handles it. */
struct srv_tp {
	void (*deliver)(struct srv_tp *tp, nng_msg *reply);
};

/* The sink takes ownership of reply; reply == NULL means "no reply: the
 * transport handle is free again" (request dropped or taken over). */
typedef void (*srv_sink_fn)(void *arg, void *tp, nng_msg *reply);

struct srv_metrics {
	uint64_t requests;
	uint64_t replies_error;
	uint64_t failures;
	uint64_t timeouts;
	uint64_t rendezvous;
	uint64_t collectives;
	uint64_t stalls; /* stall warnings logged */
	uint64_t dropped_closed; /* requests of closed connections */
	uint64_t loop_stalls; /* event-loop stalls (srv_core_loop_lag) */
	uint64_t conns_opened; /* connections (srv_pipe_opened) */
	uint64_t conns_closed_first; /* no first request in time */
	uint64_t conns_closed_idle; /* idle past --idle-timeout */
	uint64_t jobs_expired; /* --job-expiry */
	uint64_t limit_refusals; /* requests refused by a global limit */
	uint64_t shrinks; /* elastic: generations made by a member lost */
	uint64_t grows; /* elastic: generations made by admitting joiners */
	cohort__time loop_lag_ms; /* lag of the last sweep */
	cohort__time loop_lag_max_ms; /* largest lag seen */
};

/* A connection to close at `at` (after a Leave). */
struct srv_pipe_close {
	uint32_t pipe;
	cohort__time at;
};

/* A reply held until its event's records are written (call.c). */
struct srv_pend {
	void *tp;
	nng_msg *msg;
	uint64_t seq;
	bool ok; /* status COHORT_OK: rewritten if the write fails */
};

/* A member failure, remembered for the status page (state/job.c). */
struct srv_failure {
	char job[SRV_MAX_NAME + 1];
	int32_t rank;
	cohort__time at;
	char text[512];
};
#define SRV_FAILURES 32

struct srv_call;
struct srv_jrn;
struct srv_obs;

struct srv_core {
	/* Settings (cohortd's options). */
	struct srv_limits lim;
	char *admin_token;
	/* --require-token: a join creates a job only with the token minted
	 * from admin_token for it (docs/security.md). */
	bool require_token;
	/* --open-status: a StatusQuery for all jobs needs no admin secret
	 * when none is configured (a private coordinator). */
	bool open_status;
	/* --metrics-per-job: /metrics has series labelled with job names. */
	bool metrics_jobs;
	cohort__time stall_ms; /* --stall-threshold */
	cohort__time first_request_ms; /* --first-request-timeout */
	/* --job-expiry: a job with no running member and no connected
	 * client is removed after this long (0: never). */
	cohort__time job_expiry_ms;
	cohort__time idle_ms; /* --idle-timeout */
	cohort__time restore_grace_ms; /* --restore-grace */
	/* --rdzv-last-call: an elastic job's first rendezvous completes
	 * with at least its minimum once no join came for this long. */
	cohort__time rdzv_last_call_ms;
	bool draining; /* SIGTERM: /readyz answers 503, then the stop */
	srv_sink_fn sink;
	void *sink_arg;
	cohort__time started;
	uint64_t rnd;
	struct srv_metrics m;

	/* call.c: parked calls' deadlines (a binary heap), and the event
	 * bracket. Inside an event (a request, a sweep, a closed
	 * connection) with a journal, replies wait in pend until the
	 * event's records are written: a change that could not be
	 * journalled is not acknowledged (srv_core_event_end). */
	struct srv_call **heap;
	size_t heap_n;
	size_t heap_cap;
	size_t nparked;
	bool in_event;
	uint64_t ev; /* events begun */
	struct srv_pend *pend;
	size_t npend;
	size_t pend_cap;
	/* Shutting down with a journal: parked calls are dropped, not
	 * answered, so that clients re-send them to the next cohortd. */
	bool quiet;

	/* clients.c: every client of every job (srv_client.alink). */
	struct srv_link clients;
	uint64_t nclients;

	/* pipes.c: connections by id (srv_pipe), the ones whose close
	 * event was seen (id -> time, so that a request processed after
	 * the event does not re-register its connection), and the ones to
	 * close after a Leave. */
	struct srv_map pipes;
	struct srv_map closed;
	struct srv_pipe_close close_pipes[SRV_CLOSE_PIPES];
	unsigned nclose_pipes;

	/* state/: jobs by name (srv_job), their keys and values in total,
	 * the last SRV_FAILURES member failures of every job (a ring, kept
	 * after their job is gone), the next stall check. */
	struct srv_map jobs;
	uint64_t kv_bytes;
	uint64_t kv_keys;
	struct srv_failure failures[SRV_FAILURES];
	unsigned nfailures;
	unsigned failures_head;
	cohort__time stall_next;

	struct srv_jrn *jrn; /* journal/log.c; NULL: no --state-dir */
	struct srv_obs *obs; /* observe/ranks.c, made on first use */
};

/* Sets up core (zeroed by the caller) with its own parts: limits, admin
 * secret (NULL: none), sink, empty tables; the timeouts stay 0 for the
 * caller to set (srv_core_new).
 * COHORT_ENOMEM only. */
cohort_status srv_core_init(struct srv_core *core,
    const struct srv_limits *lim, const char *admin_token, srv_sink_fn sink,
    void *arg, cohort__time now);
/* Frees what srv_core_init made (the tables must be empty: their objects
 * belong to the layers above). */
void srv_core_fini(struct srv_core *core);
/* A 64-bit random number (splitmix64 seeded at init): job ids. */
uint64_t srv_random(struct srv_core *core);

#endif /* COHORT_SRV_CORE_H */
