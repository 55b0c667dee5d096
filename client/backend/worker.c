/*
 * worker.c - a backend's helper thread, its lock and condition variable
 * (see worker.h).
 */
#include <stdio.h>

#include "backend/worker.h"

cohort_status
cohort__worker_start(pthread_mutex_t *mtx, pthread_cond_t *cv,
    pthread_t *thread, void *(*fn)(void *), void *arg, const char *what,
    char *err, size_t errlen)
{
	if (pthread_mutex_init(mtx, NULL) != 0) {
		snprintf(err, errlen, "pthread_mutex_init failed");
		return (COHORT_ESYSTEM);
	}
	if (pthread_cond_init(cv, NULL) != 0) {
		pthread_mutex_destroy(mtx);
		snprintf(err, errlen, "pthread_cond_init failed");
		return (COHORT_ESYSTEM);
	}
	if (pthread_create(thread, NULL, fn, arg) != 0) {
		pthread_cond_destroy(cv);
		pthread_mutex_destroy(mtx);
		snprintf(err, errlen, "cannot start the %s", what);
		return (COHORT_ESYSTEM);
	}
	return (COHORT_OK);
}

void
cohort__worker_stop(pthread_mutex_t *mtx, pthread_cond_t *cv, pthread_t thread,
    bool *closing, atomic_int *stop)
{
	pthread_mutex_lock(mtx);
	*closing = true;
	atomic_store(stop, 1);
	pthread_cond_signal(cv);
	pthread_mutex_unlock(mtx);
	pthread_join(thread, NULL);
	pthread_cond_destroy(cv);
	pthread_mutex_destroy(mtx);
}
