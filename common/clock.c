/*
 * clock.c - monotonic time, deadlines and the timeout scale knob.
 */
#include <limits.h>
#include <stdlib.h>
#include <time.h>

#include "cohort_common.h"
#include "knobs.h"

cohort__time
cohort__now_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((cohort__time)ts.tv_sec * 1000 + ts.tv_nsec / 1000000);
}

uint64_t
cohort__now_ns(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_MONOTONIC, &ts);
	return ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec);
}

uint64_t
cohort__wall_ms(void)
{
	struct timespec ts;

	clock_gettime(CLOCK_REALTIME, &ts);
	return ((uint64_t)ts.tv_sec * 1000 + (uint64_t)ts.tv_nsec / 1000000);
}

void
cohort__realtime_after(struct timespec *ts, cohort_duration ms)
{
	clock_gettime(CLOCK_REALTIME, ts);
	ts->tv_sec += ms / 1000;
	ts->tv_nsec += (long)(ms % 1000) * 1000000L;
	if (ts->tv_nsec >= 1000000000L) {
		ts->tv_sec++;
		ts->tv_nsec -= 1000000000L;
	}
}

cohort__time
cohort__deadline(cohort_duration timeout, cohort_duration dflt)
{
	if (timeout == COHORT_WAIT_DEFAULT)
		timeout = dflt;
	if (timeout < 0)
		return (COHORT__TIME_NEVER);
	return (cohort__now_ms() + timeout);
}

cohort_duration
cohort__remaining(cohort__time deadline)
{
	cohort__time left;

	if (deadline == COHORT__TIME_NEVER)
		return (COHORT_WAIT_FOREVER);
	left = deadline - cohort__now_ms();
	if (left < 0)
		return (0);
	if (left > INT32_MAX)
		return (INT32_MAX);
	return ((cohort_duration)left);
}

bool
cohort__expired(cohort__time deadline)
{
	return (
	    deadline != COHORT__TIME_NEVER && cohort__now_ms() >= deadline);
}

cohort_duration
cohort__scaled(cohort_duration ms)
{
	static double scale = -1;
	double v;

	if (scale < 0)
		scale = cohort__knob_float_or(COHORT__KNOB_TIMEOUT_SCALE, 1.0);
	if (ms < 0)
		return (ms);
	v = (double)ms * scale;
	return (v > INT32_MAX ? INT32_MAX : (cohort_duration)v);
}
