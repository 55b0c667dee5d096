/*
 * strat.c - the pieces the threaded strategies share (see strat.h).
 */
#include <stdlib.h>

#include "strat.h"

void
cohort__strat_sync_init(
    pthread_mutex_t *mtx, pthread_cond_t *a, pthread_cond_t *b)
{
	pthread_mutex_init(mtx, NULL);
	pthread_cond_init(a, NULL);
	pthread_cond_init(b, NULL);
}

void
cohort__strat_sync_fini(
    pthread_mutex_t *mtx, pthread_cond_t *a, pthread_cond_t *b)
{
	pthread_mutex_destroy(mtx);
	pthread_cond_destroy(a);
	pthread_cond_destroy(b);
}

void
cohort__strat_stop(pthread_mutex_t *mtx, pthread_cond_t *cv, bool *stop)
{
	pthread_mutex_lock(mtx);
	*stop = true;
	pthread_cond_broadcast(cv);
	pthread_mutex_unlock(mtx);
}

void
cohort__strat_free_all(void *const ptrs[], size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ptrs[i]);
}
