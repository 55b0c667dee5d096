/*
 * strat.h - what the strategies with worker threads share: the lock and
 * two condition variables each keeps (dp: go/done, hvd: cv/done_cv), the
 * stop request that ends its threads, and its destructor's list of
 * buffers. Internal (cohort__ names, hidden in libcohort_strategies.so);
 * only POSIX threads, like the rest of strategies/.
 */
#ifndef COHORT_STRAT_H
#define COHORT_STRAT_H

#include <pthread.h>
#include <stdbool.h>
#include <stddef.h>

/* A lock and the two condition variables that go with it. */
void cohort__strat_sync_init(
    pthread_mutex_t *mtx, pthread_cond_t *a, pthread_cond_t *b);
void cohort__strat_sync_fini(
    pthread_mutex_t *mtx, pthread_cond_t *a, pthread_cond_t *b);

/* Sets *stop under mtx and wakes every waiter on cv: the request that
 * makes the strategy's threads return (the caller then joins them). */
void cohort__strat_stop(pthread_mutex_t *mtx, pthread_cond_t *cv, bool *stop);

/* free() on each of the n pointers (NULL ones are fine), in order. */
void cohort__strat_free_all(void *const ptrs[], size_t n);

/* cohort__strat_free_all over the pointers listed, counted for the
 * caller: COHORT__STRAT_FREE_ALL(d->a, d->b, d). */
#define COHORT__STRAT_FREE_ALL(...)                                           \
	cohort__strat_free_all((void *const[]) { __VA_ARGS__ },               \
	    sizeof((void *const[]) { __VA_ARGS__ }) / sizeof(void *))

#endif /* COHORT_STRAT_H */
