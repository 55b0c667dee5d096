/*
 * log.c - leveled logging on stderr.
 *
 * Text with a timestamp on a terminal, JSON lines otherwise (collectors on
 * Kubernetes parse them), switchable with COHORT_LOG_FORMAT=text|json. The
 * level comes from COHORT_LOG_LEVEL (error, warn, info, debug, trace). Each
 * line is formatted into one buffer and written with one write(2), so lines
 * of concurrent threads and processes do not interleave.
 */
#include <pthread.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>
#include <time.h>
#include <unistd.h>

#include "cohort_common.h"
#include "knobs.h"

static atomic_int log_level = -1;
static int log_default = COHORT__LOG_WARN;
static int log_json = -1;
static char log_component[64];

/* Structured context (cohort_common.h). */
static pthread_mutex_t log_ctx_mtx = PTHREAD_MUTEX_INITIALIZER;
static char log_ctx_job[256];
static int32_t log_ctx_rank = -1;
static const struct cohort__log_ctx log_tnone = { NULL, -1, NULL, 0 };
static _Thread_local const struct cohort__log_ctx *log_tctx;

static const char *const log_names[]
    = { "error", "warn", "info", "debug", "trace" };

static int
log_parse_level(const char *s, int dflt)
{
	for (int i = 0; i < 5; i++)
		if (s != NULL && strcasecmp(s, log_names[i]) == 0)
			return (i);
	if (s != NULL && strcasecmp(s, "warning") == 0)
		return (COHORT__LOG_WARN);
	if (s != NULL && s[0] != '\0') {
		/* Not silently ignored: say which names exist, once. */
		static atomic_bool warned;
		if (!atomic_exchange(&warned, true))
			fprintf(stderr,
			    "cohort: COHORT_LOG_LEVEL=%s is not a level "
			    "(error, "
			    "warn, info, debug, trace); using %s\n",
			    s, log_names[dflt]);
	}
	return (dflt);
}

void
cohort__log_set_default_level(int level)
{
	log_default = level;
	atomic_store(&log_level, -1);
}

void
cohort__log_set_component(const char *name)
{
	cohort__strlcpy(log_component, name, sizeof(log_component));
}

void
cohort__log_ctx_process(const char *job, int32_t rank)
{
	pthread_mutex_lock(&log_ctx_mtx);
	cohort__strlcpy(
	    log_ctx_job, job != NULL ? job : "", sizeof(log_ctx_job));
	log_ctx_rank = rank;
	pthread_mutex_unlock(&log_ctx_mtx);
}

const struct cohort__log_ctx *
cohort__log_ctx_push(const struct cohort__log_ctx *ctx)
{
	const struct cohort__log_ctx *saved = log_tctx;

	log_tctx = ctx;
	return (saved);
}

void
cohort__log_ctx_pop(const struct cohort__log_ctx *saved)
{
	log_tctx = saved;
}

/* Appends the context fields ("job":"x","rank":3,...) after a comma. */
static void log_json_escape(
    char *buf, size_t size, size_t *off, const char *s);

static void
log_json_ctx(char *out, size_t size, size_t *off)
{
	const struct cohort__log_ctx *t
	    = log_tctx != NULL ? log_tctx : &log_tnone;
	int32_t rank = t->rank;

	pthread_mutex_lock(&log_ctx_mtx);
	if (t->job != NULL || log_ctx_job[0] != '\0') {
		cohort__appendf(out, size, off, ",\"job\":\"");
		log_json_escape(
		    out, size, off, t->job != NULL ? t->job : log_ctx_job);
		cohort__appendf(out, size, off, "\"");
	}
	if (rank < 0 && t->job == NULL)
		rank = log_ctx_rank;
	pthread_mutex_unlock(&log_ctx_mtx);
	if (rank >= 0)
		cohort__appendf(out, size, off, ",\"rank\":%d", (int)rank);
	if (t->op != NULL) {
		cohort__appendf(out, size, off, ",\"op\":\"");
		log_json_escape(out, size, off, t->op);
		cohort__appendf(out, size, off, "\"");
		if (t->seq != 0)
			cohort__appendf(out, size, off, ",\"seq\":%llu",
			    (unsigned long long)t->seq);
	}
}

bool
cohort__log_enabled(int level)
{
	int cur = atomic_load_explicit(&log_level, memory_order_relaxed);

	if (cur < 0) {
		cur = log_parse_level(
		    cohort__knob_str(COHORT__KNOB_LOG_LEVEL), log_default);
		atomic_store(&log_level, cur);
	}
	return (level <= cur);
}

static bool
log_is_json(void)
{
	if (log_json < 0) {
		const char *f = cohort__knob_str(COHORT__KNOB_LOG_FORMAT);
		if (f != NULL && strcasecmp(f, "json") == 0)
			log_json = 1;
		else if (f != NULL && strcasecmp(f, "text") == 0)
			log_json = 0;
		else
			log_json = isatty(2) ? 0 : 1;
	}
	return (log_json == 1);
}

/* Appends s as a JSON string body (without quotes). */
static void
log_json_escape(char *buf, size_t size, size_t *off, const char *s)
{
	for (; *s != '\0' && *off + 8 < size; s++) {
		unsigned char c = (unsigned char)*s;
		if (c == '"' || c == '\\')
			cohort__appendf(buf, size, off, "\\%c", c);
		else if (c == '\n')
			cohort__appendf(buf, size, off, "\\n");
		else if (c < 0x20)
			cohort__appendf(buf, size, off, "\\u%04x", c);
		else
			buf[(*off)++] = (char)c;
	}
	buf[*off] = '\0';
}

void
cohort__log(int level, const char *file, int line, const char *fmt, ...)
{
	char msg[2048];
	char out[4096];
	size_t off = 0;
	va_list ap;
	struct timespec ts;
	struct tm tm;
	const char *base = strrchr(file, '/');
	const char *comp = log_component[0] ? log_component : "cohort";

	base = base ? base + 1 : file;
	va_start(ap, fmt);
	vsnprintf(msg, sizeof(msg), fmt, ap);
	va_end(ap);
	clock_gettime(CLOCK_REALTIME, &ts);
	gmtime_r(&ts.tv_sec, &tm);
	if (level < 0 || level > 4)
		level = COHORT__LOG_ERROR;

	if (log_is_json()) {
		cohort__appendf(out, sizeof(out), &off,
		    "{\"ts\":\"%04d-%02d-%02dT%02d:%02d:%02d.%06ldZ\","
		    "\"level\":\"%s\",\"component\":\"",
		    tm.tm_year + 1900, tm.tm_mon + 1, tm.tm_mday, tm.tm_hour,
		    tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000, log_names[level]);
		log_json_escape(out, sizeof(out), &off, comp);
		cohort__appendf(
		    out, sizeof(out), &off, "\",\"pid\":%d", (int)getpid());
		log_json_ctx(out, sizeof(out), &off);
		cohort__appendf(out, sizeof(out), &off,
		    ",\"src\":\"%s:%d\",\"msg\":\"", base, line);
		log_json_escape(out, sizeof(out), &off, msg);
		cohort__appendf(out, sizeof(out), &off, "\"}\n");
	} else {
		cohort__appendf(out, sizeof(out), &off,
		    "%02d:%02d:%02d.%03ld %-5s %s[%d] %s (%s:%d)\n",
		    tm.tm_hour, tm.tm_min, tm.tm_sec, ts.tv_nsec / 1000000,
		    log_names[level], comp, (int)getpid(), msg, base, line);
	}
	if (off >= sizeof(out) - 1)
		out[sizeof(out) - 2] = '\n';
	if (write(2, out, strlen(out)) < 0) {
		/* nothing sensible to do */
	}
}
