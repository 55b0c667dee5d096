/*
 * cohort_impl.h - internal umbrella header of libcohort: the common floor,
 * the wire framing, and the client's own internals.
 *
 * Names with the cohort__ prefix are internal: not exported from
 * libcohort.so (built with -fvisibility=hidden; only COHORT_API symbols are
 * public), free to change.
 */
#ifndef COHORT_IMPL_H
#define COHORT_IMPL_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include <nng/nng.h>

#include "cohort/cohort.h"

#include "cohort_common.h"
#include "knobs.h"
#include "wire.h"

/* Keys of the job's KV that are libcohort's own (the data plane's
 * rendezvous, `cohort fault` schedules): the public KV calls refuse them
 * (client/kv.c). */
#define COHORT__KV_RESERVED "__cohort/"

/* ------------------------------------------------------------------------ */
/* Options from the environment (client/env.c)                              */
/* ------------------------------------------------------------------------ */

/* COHORT_TIMEOUT_MS, COHORT_JOIN_TIMEOUT_MS, COHORT_HEARTBEAT_MS,
 * COHORT_DEAD_AFTER_MS and COHORT_BACKEND into opts (client/env.c). */
cohort_status cohort__options_env_timeouts(cohort_options *opts);
/* COHORT_MIN_WORLD and COHORT_MAX_WORLD into opts (min_world, and the
 * world size = the maximum); COHORT_EINVAL when malformed or MIN exceeds
 * the world size (client/env.c). */
cohort_status cohort__options_env_elastic(cohort_options *opts);
/* The data-plane address for a worker of coordinator URL: COHORT_DATA_ADDR,
 * else COHORT_DATA_IFACE's address, else the local address of the route to
 * the coordinator, else 127.0.0.1; from says which (client/env.c).
 * COHORT_EINVAL when COHORT_DATA_IFACE names no interface with an address
 * or COHORT_DATA_ADDR is not a numeric address. */
cohort_status cohort__data_addr(const char *coordinator, char *out, size_t len,
    char *from, size_t fromlen);
/* The reconnect window opts asks for: opts->reconnect_window, else
 * COHORT_RECONNECT_MS, else the scaled default; capped at the operation
 * timeout (client/client.c). */
cohort_duration cohort__reconnect_window(const cohort_options *opts);
/* The job's identity from the environment alone (the first of COHORT_JOB,
 * TORCHELASTIC_RUN_ID, Open MPI's or PMIx's job id, SLURM's job and step
 * ids, torchrun's store address, Kubeflow's PET_MASTER_ADDR; else
 * "default"), as cohort_env_resolve sets env.job and env.job_from. `cohort
 * run` names a multi-node job with it. COHORT_EINVAL when a name does not
 * fit job (len bytes). */
cohort_status cohort__env_job(
    char *job, size_t len, char *from, size_t fromlen);
/* The first host of a SLURM host list ("node[001-004,007],gpu-a1" ->
 * "node001"; "rack[1-2]-n[01-04]" -> "rack1-n01"; "a b" -> "a").
 * COHORT_EINVAL (detail in cohort_last_error) when malformed or longer
 * than len - 1. */
cohort_status cohort__slurm_first_host(
    const char *list, char *out, size_t len);
/* The rendezvous port of SLURM job id job_id as Lightning's SLURMEnvironment
 * derives MASTER_PORT: 15000 + its last four digits; 12910 when job_id is
 * NULL; -1 when it is not a number. */
int cohort__slurm_port(const char *job_id);

/* Checks heartbeat < dead-after < operation timeout <= rendezvous timeout
 * (a negative timeout means none, and is larger than any other); writes a
 * one-line explanation into why. */
cohort_status cohort__timeouts_check(
    const cohort_options *opts, char *why, size_t len);

#endif /* COHORT_IMPL_H */
