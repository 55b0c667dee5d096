/*
 * cohort_common.h - the floor every part of cohort stands on: libcohort,
 * cohortd, the CUDA kernels' references and the tools.
 *
 * Time and deadlines, the thread-local error detail behind
 * cohort_last_error(), bounded string helpers, logging, invariants, the
 * timeout and limit constants (one place, docs/timeouts.md), and the
 * conversion of nng's errors. Nothing here knows about jobs, groups or
 * collectives. Names with the cohort__ prefix are internal: not exported
 * from libcohort.so.
 */
#ifndef COHORT_COMMON_H
#define COHORT_COMMON_H

#include <stdarg.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort/cohort.h"

/* ------------------------------------------------------------------------ */
/* Time. All deadlines are absolute CLOCK_MONOTONIC milliseconds.            */
/* ------------------------------------------------------------------------ */

typedef int64_t cohort__time;
#define COHORT__TIME_NEVER INT64_MAX

cohort__time cohort__now_ms(void);
uint64_t cohort__now_ns(void);
uint64_t cohort__wall_ms(void); /* CLOCK_REALTIME, for logs */
/* *ts = CLOCK_REALTIME now + ms (>= 0): an absolute time for
 * pthread_mutex_timedlock and conds on the default clock. */
struct timespec;
void cohort__realtime_after(struct timespec *ts, cohort_duration ms);

/* Converts a caller's timeout into an absolute deadline. COHORT_WAIT_DEFAULT
 * takes dflt (which must not itself be DEFAULT); COHORT_WAIT_FOREVER and any
 * other negative value give COHORT__TIME_NEVER. */
cohort__time cohort__deadline(cohort_duration timeout, cohort_duration dflt);
/* Milliseconds left until deadline, clamped to [0, INT32_MAX];
 * COHORT_WAIT_FOREVER for COHORT__TIME_NEVER. */
cohort_duration cohort__remaining(cohort__time deadline);
bool cohort__expired(cohort__time deadline);

/* One pause between two polls of a busy-wait (x86 PAUSE: the sibling
 * hyperthread runs, the loop leaves the pipeline gently). */
static inline void
cohort__cpu_relax(void)
{
#if defined(__x86_64__) || defined(__i386__)
	__builtin_ia32_pause();
#endif
}

/* ------------------------------------------------------------------------ */
/* Error detail (thread-local), for cohort_last_error()                     */
/* ------------------------------------------------------------------------ */

/* Formats the detail of the error about to be returned on this thread and
 * returns st, so that `return (cohort__err(COHORT_EINVAL, "bad rank %d",
 * r));` works. */
cohort_status cohort__err(cohort_status st, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));
void cohort__err_clear(void);

/* Safe bounded formatting helpers (sprintf/strcpy/strcat are banned). */
size_t cohort__strlcpy(char *dst, const char *src, size_t size);
/* Appends formatted text at *off within buf[size], advancing *off; never
 * overflows, always NUL-terminates. */
void cohort__appendf(char *buf, size_t size, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
/* Parses a whole decimal integer; false on junk, overflow or empty. */
bool cohort__parse_i64(const char *s, int64_t *out);

/* close() on each descriptor of fds[0..n) that is open (>= 0), for a
 * destructor's descriptors: COHORT__CLOSE_ALL(x->fd, x->efd). */
void cohort__close_all(const int *fds, size_t n);
#define COHORT__CLOSE_ALL(...)                                                \
	cohort__close_all((const int[]) { __VA_ARGS__ },                      \
	    sizeof((const int[]) { __VA_ARGS__ }) / sizeof(int))
/* free() on each of ptrs[0..n) (NULL ones are fine), in order:
 * COHORT__FREE_ALL(x->a, x->b, x). */
void cohort__free_all(void *const ptrs[], size_t n);
#define COHORT__FREE_ALL(...)                                                 \
	cohort__free_all((void *const[]) { __VA_ARGS__ },                     \
	    sizeof((void *const[]) { __VA_ARGS__ }) / sizeof(void *))

/* ------------------------------------------------------------------------ */
/* Logging: stderr, text on a terminal, JSON lines otherwise.               */
/* COHORT_LOG_LEVEL=error|warn|info|debug|trace (default warn in libcohort, */
/* info in cohortd: see cohort__log_set_default_level),                     */
/* COHORT_LOG_FORMAT=text|json.                                             */
/* ------------------------------------------------------------------------ */

enum cohort__log_level {
	COHORT__LOG_ERROR = 0,
	COHORT__LOG_WARN = 1,
	COHORT__LOG_INFO = 2,
	COHORT__LOG_DEBUG = 3,
	COHORT__LOG_TRACE = 4,
};

/* Sets the level used when COHORT_LOG_LEVEL is unset (call early). */
void cohort__log_set_default_level(int level);
/* Component name printed with every line ("cohortd", "rank 3"). Per
 * process; libcohort sets "rank N" after joining if unset. */
void cohort__log_set_component(const char *name);

/* Structured context of JSON log lines (docs/observability.md): `job`,
 * `rank`, `op` and `seq` fields. The process-wide part (a worker's job and
 * rank, set when it joins) is copied; the calling thread's part (an
 * operation in progress) overrides it: push makes ctx (which, with its
 * strings, must outlive the matching pop) the thread's and returns the
 * previous one for pop. NULL / -1 / 0: field absent. */
struct cohort__log_ctx {
	const char *job;
	int32_t rank;
	const char *op;
	uint64_t seq;
};
void cohort__log_ctx_process(const char *job, int32_t rank);
const struct cohort__log_ctx *cohort__log_ctx_push(
    const struct cohort__log_ctx *ctx);
void cohort__log_ctx_pop(const struct cohort__log_ctx *saved);
bool cohort__log_enabled(int level);
void cohort__log(int level, const char *file, int line, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

#define COHORT__LOG(lvl, ...)                                                 \
	do {                                                                  \
		if (cohort__log_enabled(lvl))                                 \
			cohort__log(lvl, __FILE__, __LINE__, __VA_ARGS__);    \
	} while (0)
#define cohort__error(...) COHORT__LOG(COHORT__LOG_ERROR, __VA_ARGS__)
#define cohort__warn(...) COHORT__LOG(COHORT__LOG_WARN, __VA_ARGS__)
#define cohort__info(...) COHORT__LOG(COHORT__LOG_INFO, __VA_ARGS__)
#define cohort__debug(...) COHORT__LOG(COHORT__LOG_DEBUG, __VA_ARGS__)
#define cohort__trace(...) COHORT__LOG(COHORT__LOG_TRACE, __VA_ARGS__)

/* Internal invariants; compiled out with -DNDEBUG. Caller mistakes get
 * COHORT_EINVAL, never an assertion. */
#ifdef NDEBUG
#define COHORT__ASSERT(x) ((void)0)
#else
#define COHORT__ASSERT(x)                                                     \
	((x) ? (void)0 : cohort__assert_fail(#x, __FILE__, __LINE__))
#endif
void cohort__assert_fail(const char *expr, const char *file, int line)
    __attribute__((noreturn));

/* ------------------------------------------------------------------------ */
/* Timeouts and limits: one place, one comment each (docs/timeouts.md).     */
/* COHORT_TIMEOUT_SCALE (float, default 1) multiplies the liveness ones.    */
/* ------------------------------------------------------------------------ */

/* Default for every blocking call: 30 min, Lightning's DDP default. */
#define COHORT__DEFAULT_OP_TIMEOUT_MS 1800000
/* Heartbeat period of a client. */
#define COHORT__DEFAULT_HEARTBEAT_MS 1000
/* Silence after which cohortd declares a member dead. A broken connection
 * is noticed at once, independently of this. */
#define COHORT__DEFAULT_DEAD_AFTER_MS 5000
/* A rescheduled coordinator pod with a re-attached volume is back in tens
 * of seconds: calls wait this long for it (COHORT_RECONNECT_MS). */
#define COHORT__DEFAULT_RECONNECT_MS 60000
/* Extra time a client waits beyond a parked request's own timeout before
 * deciding the coordinator is gone (covers the reply's flight). */
#define COHORT__REPLY_GRACE_MS 2000
/* Bound of cohort_client_close telling cohortd it leaves. */
#define COHORT__CLOSE_TIMEOUT_MS 2000
/* Largest KV value / broadcast object cohortd accepts by default. */
#define COHORT__DEFAULT_MAX_VALUE (64u << 20)
/* Longest error detail kept (a failed rank's report can be a traceback:
 * its first line and its last frames must both fit). */
#define COHORT__DETAIL_MAX 4096
/* Largest nng message either side accepts (value + envelope). */
#define COHORT__MAX_MESSAGE ((64u << 20) + (1u << 20))
/* What cohortd accepts beyond --max-value-bytes in one message (the
 * envelope): its receive limit is max_value + this, announced at join. */
#define COHORT__ENVELOPE_ALLOWANCE (1u << 20)
/* The largest message a client accepts from cohortd: nng's largest
 * receive limit (4 GiB - 1), so that any --max-value-bytes cohortd
 * accepts comes through (the client checks what it sends against the
 * limits cohortd announces at join). */
#define COHORT__CLIENT_RECV_MAX ((size_t)0xffffffffu)
/* Largest key length. */
#define COHORT__MAX_KEY 1024
/* Largest vector for cohort_reduce_scalars. */
#define COHORT__MAX_SCALARS 4096

/* COHORT_TIMEOUT_SCALE applied to a duration (milliseconds). */
cohort_duration cohort__scaled(cohort_duration ms);

/* nng error -> cohort status, once, at the boundary. */
cohort_status cohort__from_nng(int nng_rv);

/* A random non-zero 64-bit value (getrandom, else a mix of what is at
 * hand): client ids, tokens. */
uint64_t cohort__random_u64(void);

#endif /* COHORT_COMMON_H */
