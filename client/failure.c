/*
 * failure.c - failure records (failure.h) and their one text.
 */
#include <inttypes.h>
#include <stdarg.h>
#include <stdio.h>
#include <string.h>

#include "failure.h"

/* By cohort_failure_kind (append only, as the enum). */
static const char *const failure_kind_names[]
    = { "none", "process", "heartbeat", "reported", "left", "restore", "peer",
	      "generation", "coordinator", "data_plane", "timeout", "aborted",
	      "injected", "unavailable" };

const char *
cohort_failure_kind_name(cohort_failure_kind kind)
{
	if ((unsigned)kind
	    >= sizeof(failure_kind_names) / sizeof(failure_kind_names[0]))
		return ("unknown");
	return (failure_kind_names[kind]);
}

void
cohort__failure_clear(cohort_failure *f)
{
	memset(f, 0, sizeof(*f));
	f->size = sizeof(*f);
	f->rank = -1;
	f->group_rank = -1;
}

void
cohort__failure_vlocal(cohort_failure *f, cohort_status st,
    cohort_failure_kind kind, const char *fmt, va_list ap)
{
	cohort__failure_clear(f);
	f->status = st;
	f->kind = kind;
	f->unix_ms = (int64_t)cohort__wall_ms();
	vsnprintf(f->text, sizeof(f->text), fmt, ap);
}

void
cohort__failure_local(cohort_failure *f, cohort_status st,
    cohort_failure_kind kind, const char *fmt, ...)
{
	va_list ap;

	va_start(ap, fmt);
	cohort__failure_vlocal(f, st, kind, fmt, ap);
	va_end(ap);
}

bool
cohort__failure_is_verdict(cohort_failure_kind kind)
{
	return (kind >= COHORT_FAILURE_PROCESS && kind <= COHORT_FAILURE_PEER);
}

/* The wire's FailureKind: the same numbers (cohort.h says so); 0
 * (unknown) and anything newer, a peer. */
static cohort_failure_kind
failure_kind_of(Cohort__FailureKind k)
{
	return (k >= COHORT__FAILURE_KIND__FAILURE_PROCESS
	            && k <= COHORT__FAILURE_KIND__FAILURE_RESTORE
	        ? (cohort_failure_kind)k
	        : COHORT_FAILURE_PEER);
}

static const char *
failure_str(const char *s)
{
	return (s != NULL ? s : "");
}

void
cohort__failure_from_reply(
    cohort_failure *f, cohort_status st, const Cohort__Reply *rep)
{
	const Cohort__Failure *w = rep != NULL ? rep->failure : NULL;

	cohort__failure_clear(f);
	f->status = st;
	if (st == COHORT_ESTALE || (st == COHORT_EMEMBERSHIP && w == NULL)) {
		/* not a member's failure: the job moved on (an elastic job
		 * that admitted members, or a request of an older
		 * generation) */
		f->kind = COHORT_FAILURE_GENERATION;
		cohort__strlcpy(f->text,
		    rep != NULL && rep->error != NULL && rep->error[0] != '\0'
		        ? rep->error
		        : cohort_strerror(st),
		    sizeof(f->text));
		f->unix_ms = (int64_t)cohort__wall_ms();
		return;
	}
	if (w != NULL) {
		f->kind = failure_kind_of(w->kind);
		f->rank = w->rank;
		f->pid = w->pid;
		cohort__strlcpy(
		    f->host, failure_str(w->host), sizeof(f->host));
		cohort__strlcpy(f->operation, failure_str(w->operation),
		    sizeof(f->operation));
		cohort__strlcpy(
		    f->group, failure_str(w->group), sizeof(f->group));
		f->seq = w->seq;
		/* the same numbers as the wire's FailureOpState */
		f->op_state = w->op_state
		        == COHORT__FAILURE_OP_STATE__FAILURE_OP_DURING
		    ? COHORT_FAILURE_OP_DURING
		    : w->op_state == COHORT__FAILURE_OP_STATE__FAILURE_OP_AFTER
		    ? COHORT_FAILURE_OP_AFTER
		    : COHORT_FAILURE_OP_UNKNOWN;
		f->op_age_ms = w->op_age_ms;
		f->age_ms = w->age_ms;
		f->unix_ms = (int64_t)w->unix_ms;
		cohort__strlcpy(
		    f->text, failure_str(w->text), sizeof(f->text));
		if (f->kind == COHORT_FAILURE_PEER && f->text[0] == '\0')
			cohort__strlcpy(
			    f->text, failure_str(rep->error), sizeof(f->text));
		return;
	}
	/* An older cohortd: its error is the whole text. */
	f->kind = COHORT_FAILURE_PEER;
	f->rank = rep != NULL ? rep->failed_rank : -1;
	f->unix_ms = (int64_t)cohort__wall_ms();
	if (rep != NULL && rep->error != NULL && rep->error[0] != '\0')
		cohort__strlcpy(f->text, rep->error, sizeof(f->text));
	else if (rep != NULL && rep->failed_text != NULL
	    && rep->failed_text[0] != '\0')
		snprintf(f->text, sizeof(f->text), "rank %d failed: %s",
		    f->rank, rep->failed_text);
	else
		cohort__strlcpy(f->text, cohort_strerror(st), sizeof(f->text));
}

/* " (#12) on group 'g'" after an operation. */
static void
failure_op_where(const cohort_failure *f, bool hash_in_parens, char *buf,
    size_t len, size_t *off)
{
	if (f->seq > 0)
		cohort__appendf(buf, len, off,
		    hash_in_parens ? " (#%" PRIu64 ")" : " #%" PRIu64, f->seq);
	if (f->group[0] != '\0')
		cohort__appendf(buf, len, off, " on group '%s'", f->group);
}

/* "rank 3 (node7:99)" */
static void
failure_who(const cohort_failure *f, char *buf, size_t len, size_t *off)
{
	cohort__appendf(buf, len, off, "rank %d", f->rank);
	if (f->host[0] != '\0' && f->pid != 0)
		cohort__appendf(buf, len, off, " (%s:%u)", f->host, f->pid);
	else if (f->host[0] != '\0')
		cohort__appendf(buf, len, off, " (%s)", f->host);
}

size_t
cohort__failure_text(
    const cohort_failure *f, bool with_age, char *buf, size_t len)
{
	char tmp[COHORT__FAILURE_TEXT_MAX];
	size_t off = 0, first;
	const char *nl;
	bool peer = f->rank >= 0
	    && (f->kind == COHORT_FAILURE_PROCESS
	        || f->kind == COHORT_FAILURE_HEARTBEAT
	        || f->kind == COHORT_FAILURE_REPORTED
	        || f->kind == COHORT_FAILURE_RESTORE);

	tmp[0] = '\0';
	if (f->status == COHORT_OK) {
		if (len > 0)
			buf[0] = '\0';
		return (0);
	}
	nl = strchr(f->text, '\n');
	first = nl != NULL ? (size_t)(nl - f->text) : strlen(f->text);
	if (peer) {
		failure_who(f, tmp, sizeof(tmp), &off);
		cohort__appendf(tmp, sizeof(tmp), &off, " failed");
		if (f->operation[0] != '\0' && f->op_age_ms > 0) {
			cohort__appendf(tmp, sizeof(tmp), &off,
			    " (its last heartbeat, %.1f s before: %s %s",
			    (double)f->op_age_ms / 1000.0,
			    f->op_state == COHORT_FAILURE_OP_AFTER ? "after"
			                                           : "in",
			    f->operation);
			failure_op_where(f, false, tmp, sizeof(tmp), &off);
			cohort__appendf(tmp, sizeof(tmp), &off, ")");
		} else if (f->operation[0] != '\0') {
			cohort__appendf(tmp, sizeof(tmp), &off, " %s %s",
			    f->op_state == COHORT_FAILURE_OP_AFTER ? "after"
			                                           : "during",
			    f->operation);
			failure_op_where(f, true, tmp, sizeof(tmp), &off);
		}
		cohort__appendf(
		    tmp, sizeof(tmp), &off, ": %.*s", (int)first, f->text);
	} else if (f->kind == COHORT_FAILURE_LEFT && f->rank >= 0) {
		failure_who(f, tmp, sizeof(tmp), &off);
		cohort__appendf(tmp, sizeof(tmp), &off, " left the job");
		if (f->operation[0] != '\0') {
			cohort__appendf(
			    tmp, sizeof(tmp), &off, "; %s", f->operation);
			failure_op_where(f, true, tmp, sizeof(tmp), &off);
			cohort__appendf(
			    tmp, sizeof(tmp), &off, " cannot complete");
		}
		nl = NULL; /* its text ("left the job") says no more */
	} else {
		cohort__appendf(
		    tmp, sizeof(tmp), &off, "%.*s", (int)first, f->text);
	}
	if (with_age)
		cohort__appendf(tmp, sizeof(tmp), &off, " (%.1f s ago)",
		    (double)f->age_ms / 1000.0);
	if (nl != NULL)
		cohort__appendf(tmp, sizeof(tmp), &off, "%s", nl);
	return ((size_t)snprintf(buf, len, "%s", tmp));
}

size_t
cohort_failure_format(const cohort_failure *f, char *buf, size_t len)
{
	if (f == NULL) {
		if (len > 0)
			buf[0] = '\0';
		return (0);
	}
	return (cohort__failure_text(f, true, buf, len));
}

void
cohort__failure_copy_out(cohort_failure *dst, const cohort_failure *src)
{
	size_t n = dst->size < sizeof(*src) ? dst->size : sizeof(*src);

	memcpy((char *)dst + sizeof(dst->size),
	    (const char *)src + sizeof(src->size), n - sizeof(dst->size));
}
