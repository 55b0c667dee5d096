/*
 * worker.h - the one helper thread a backend's point-to-point state may
 * keep (the nccl backend's completion waiter, the service backend's
 * mailbox reader), with the lock and condition variable it waits on and
 * the two flags that end it: `stop` (atomic: abort or close, read without
 * the lock) and `closing` (set under the lock by close).
 *
 *   if ((st = cohort__worker_start(&ps->mtx, &ps->cv, &ps->thread,
 *       waiter, ps, "nccl waiter thread", err, errlen)) != COHORT_OK) {
 *           free(ps);
 *           return (st);
 *   }
 *   ...
 *   cohort__worker_stop(&ps->mtx, &ps->cv, ps->thread, &ps->closing,
 *       &ps->stop);   // joined, lock and condvar destroyed
 */
#ifndef COHORT_BACKEND_WORKER_H
#define COHORT_BACKEND_WORKER_H

#include <pthread.h>
#include <stdatomic.h>
#include <stdbool.h>
#include <stddef.h>

#include "cohort/cohort.h"

/* Initialises *mtx and *cv, then starts fn(arg) on *thread. On failure
 * it undoes what it did, writes why into err ("cannot start the <what>"
 * when the thread does not start) and returns COHORT_ESYSTEM. */
cohort_status cohort__worker_start(pthread_mutex_t *mtx, pthread_cond_t *cv,
    pthread_t *thread, void *(*fn)(void *), void *arg, const char *what,
    char *err, size_t errlen);

/* Under mtx sets *closing and *stop and signals cv, joins thread, then
 * destroys mtx and cv: the thread is gone when it returns. */
void cohort__worker_stop(pthread_mutex_t *mtx, pthread_cond_t *cv,
    pthread_t thread, bool *closing, atomic_int *stop);

#endif /* COHORT_BACKEND_WORKER_H */
