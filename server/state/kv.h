/*
 * kv.h - a job's key-value store: torch's TCPStore semantics
 * (proto/README.md section 6), one store per job (job->kv).
 *
 * The handlers are the dispatch table's (front/dispatch.c): each answers
 * its call or parks it (a get/multi_get with wait, a wait), keeps the
 * limits and journals its change before it is acknowledged.
 */
#ifndef COHORT_SRV_KV_H
#define COHORT_SRV_KV_H

#include "job.h"

/* An empty store counting into the core's totals (NULL: ENOMEM). */
struct srv_kv *srv_kv_new(struct srv_core *core);
/* Frees the store (its waiters were answered with their clients). */
void srv_kv_free(struct srv_kv *kv);

void srv_kv_set(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_get(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_add(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_compare_set(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_delete(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_num_keys(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_wait(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_check(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_append(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_multi_get(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);
void srv_kv_multi_set(
    struct srv_call *c, const Cohort__Request *req, cohort__time now);

uint64_t srv_kv_count(const struct srv_kv *kv);
/* Bytes of keys and values. */
uint64_t srv_kv_bytes(const struct srv_kv *kv);
/* Whether key exists; its value (valid until the next KV change) if so. */
bool srv_kv_peek(
    struct srv_kv *kv, const char *key, const void **val, size_t *vlen);
/* Calls fn for every key (snapshot). */
void srv_kv_foreach(struct srv_kv *kv,
    void (*fn)(void *arg, const char *key, const void *val, size_t vlen),
    void *arg);

/* Journal replay: store / append / delete without limit checks. */
cohort_status srv_kv_restore(struct srv_job *job, const char *key,
    const void *val, size_t vlen, bool append);
void srv_kv_restore_del(struct srv_job *job, const char *key);

#endif /* COHORT_SRV_KV_H */
