/*
 * status.c - status names and texts (one X-macro table in cohort.h), the
 * thread-local detail of the last error, small string helpers, nng's
 * errors as statuses, and random ids.
 */
#include <errno.h>
#include <inttypes.h>
#include <limits.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/random.h>
#include <time.h>
#include <unistd.h>

#include <nng/nng.h>

#include "cohort_common.h"

const char *
cohort_strerror(cohort_status st)
{
	switch (st) {
#define COHORT__XX(name, code, msg)                                           \
	case COHORT_##name:                                                   \
		return (msg);
		COHORT_STATUS_MAP(COHORT__XX)
#undef COHORT__XX
	}
	return ("unknown cohort status");
}

const char *
cohort_status_name(cohort_status st)
{
	switch (st) {
#define COHORT__XX(name, code, msg)                                           \
	case COHORT_##name:                                                   \
		return ("COHORT_" #name);
		COHORT_STATUS_MAP(COHORT__XX)
#undef COHORT__XX
	}
	return ("COHORT_UNKNOWN");
}

static const struct {
	const char *name;
	size_t size;
} status_dtypes[COHORT_DTYPE_COUNT] = {
	[COHORT_F32] = { "f32", 4 },
	[COHORT_F64] = { "f64", 8 },
	[COHORT_F16] = { "f16", 2 },
	[COHORT_BF16] = { "bf16", 2 },
	[COHORT_I32] = { "i32", 4 },
	[COHORT_I64] = { "i64", 8 },
	[COHORT_U8] = { "u8", 1 },
};

size_t
cohort_dtype_size(cohort_dtype dt)
{
	if ((unsigned)dt >= COHORT_DTYPE_COUNT)
		return (0);
	return (status_dtypes[dt].size);
}

const char *
cohort_dtype_name(cohort_dtype dt)
{
	if ((unsigned)dt >= COHORT_DTYPE_COUNT)
		return ("invalid");
	return (status_dtypes[dt].name);
}

const char *
cohort_redop_name(cohort_redop op)
{
	static const char *const names[COHORT_REDOP_COUNT] = {
		[COHORT_SUM] = "sum",
		[COHORT_PROD] = "prod",
		[COHORT_MIN] = "min",
		[COHORT_MAX] = "max",
		[COHORT_MEAN] = "mean",
	};
	if ((unsigned)op >= COHORT_REDOP_COUNT)
		return ("invalid");
	return (names[op]);
}

/* Detail of the last error on this thread (ncclGetLastError). */
static _Thread_local char status_last_error[COHORT__DETAIL_MAX];

cohort_status
cohort__err(cohort_status st, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(status_last_error, sizeof(status_last_error), fmt, ap);
	va_end(ap);
	return (st);
}

void
cohort__err_clear(void)
{
	status_last_error[0] = '\0';
}

const char *
cohort_last_error(void)
{
	return (status_last_error);
}

void
cohort_free(void *p)
{
	free(p);
}

size_t
cohort__strlcpy(char *dst, const char *src, size_t size)
{
	size_t n = strlen(src);

	if (size > 0) {
		size_t c = n < size - 1 ? n : size - 1;
		memcpy(dst, src, c);
		dst[c] = '\0';
	}
	return (n);
}

void
cohort__appendf(char *buf, size_t size, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	if (*off >= size)
		return;
	va_start(ap, fmt);
	n = vsnprintf(buf + *off, size - *off, fmt, ap);
	va_end(ap);
	if (n < 0)
		return;
	*off += (size_t)n;
	if (*off >= size)
		*off = size - 1;
}

bool
cohort__parse_i64(const char *s, int64_t *out)
{
	char *end;
	long long v;

	if (s == NULL || *s == '\0')
		return (false);
	errno = 0;
	v = strtoll(s, &end, 10);
	if (errno != 0 || *end != '\0' || end == s)
		return (false);
	*out = (int64_t)v;
	return (true);
}

cohort_status
cohort__from_nng(int rv)
{
	switch (rv) {
	case 0:
		return (COHORT_OK);
	case NNG_ETIMEDOUT:
		return (COHORT_ETIMEDOUT);
	case NNG_ENOMEM:
		return (COHORT_ENOMEM);
	case NNG_ECLOSED:
	case NNG_ECANCELED:
		return (COHORT_ECLOSED);
	case NNG_EINVAL:
	case NNG_EADDRINVAL:
		return (COHORT_EINVAL);
	case NNG_ECONNREFUSED:
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
	case NNG_EUNREACHABLE:
	case NNG_ENOTSUP:
		return (rv == NNG_ENOTSUP ? COHORT_ENOTSUP : COHORT_ENOCOORD);
	case NNG_EMSGSIZE:
		return (COHORT_ETOOBIG);
	case NNG_EPROTO:
		return (COHORT_EPROTO);
	default:
		return (COHORT_ETRANSPORT);
	}
}

void
cohort__assert_fail(const char *expr, const char *file, int line)
{
	fprintf(stderr, "cohort: assertion failed: %s at %s:%d\n", expr, file,
	    line);
	abort();
}

uint64_t
cohort__random_u64(void)
{
	uint64_t v = 0;
	uint64_t z;

	if (getrandom(&v, sizeof(v), GRND_NONBLOCK) != (ssize_t)sizeof(v)) {
		/* splitmix64 of what is at hand (the clock read here, not
		 * through clock.c, which stands above this file) */
		struct timespec ts;

		clock_gettime(CLOCK_MONOTONIC, &ts);
		z = ((uint64_t)ts.tv_sec * 1000000000u + (uint64_t)ts.tv_nsec)
		    ^ ((uint64_t)getpid() << 32) ^ (uint64_t)(uintptr_t)&v;
		z += 0x9e3779b97f4a7c15ull;
		z = (z ^ (z >> 30)) * 0xbf58476d1ce4e5b9ull;
		z = (z ^ (z >> 27)) * 0x94d049bb133111ebull;
		v = z ^ (z >> 31);
	}
	return (v != 0 ? v : 1);
}
