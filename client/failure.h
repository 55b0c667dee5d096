/*
 * failure.h - a group's failure as data (cohort_failure in cohort.h): how
 * a record is built from cohortd's verdict or from what this process saw,
 * and the one function that turns a record into text.
 *
 * A record is never merged with another: the first failure a group
 * records stays its cause (group.c), and its text is composed from the
 * fields only when someone asks (cohort_group_last_error, the detail of
 * cohort_last_error after a failed call, the log).
 */
#ifndef COHORT_FAILURE_H
#define COHORT_FAILURE_H

#include <stdarg.h>
#include <stdbool.h>

#include "cohort_impl.h"

/* Room for a composed text: the header (rank, host, operation), the
 * text and the age. */
#define COHORT__FAILURE_TEXT_MAX (sizeof(((cohort_failure *)0)->text) + 1024)

/* The first version of cohort_failure ends with `observed`: a caller's
 * struct must have at least this size. */
#define COHORT__FAILURE_V1_SIZE                                               \
	(offsetof(cohort_failure, observed)                                   \
	    + sizeof(((cohort_failure *)0)->observed))

/* An empty record (status OK, kind NONE, ranks -1). */
void cohort__failure_clear(cohort_failure *f);

/* A failure this process saw itself (kind: DATA_PLANE, TIMEOUT, ...),
 * its text from fmt; operation, seq and group left empty for the caller
 * to fill. unix_ms is now. */
void cohort__failure_local(cohort_failure *f, cohort_status st,
    cohort_failure_kind kind, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));
void cohort__failure_vlocal(cohort_failure *f, cohort_status st,
    cohort_failure_kind kind, const char *fmt, va_list ap)
    __attribute__((format(printf, 4, 0)));

/* cohortd's verdict from a reply with status st (EPEERLOST, ESTALE, or an
 * OK heartbeat / Watch reply that carries one: then st is EPEERLOST). The
 * reply's Failure when it has one; from an older cohortd, its rank and
 * error text (kind PEER). */
void cohort__failure_from_reply(
    cohort_failure *f, cohort_status st, const Cohort__Reply *rep);

/* True for a verdict of cohortd on a peer (PROCESS ... PEER). */
bool cohort__failure_is_verdict(cohort_failure_kind kind);

/* THE composition of a record's text (cohort_failure_format is this with
 * the age): "rank 3 (node7:99) failed during allreduce (#24): connection
 * lost", " (12.3 s ago)" after the first line when with_age, then the
 * rest of the rank's text (a traceback). Like snprintf. */
size_t cohort__failure_text(
    const cohort_failure *f, bool with_age, char *buf, size_t len);

/* Copies the fields of src a caller's struct of `size` bytes has room for
 * (the struct only ever grows at the end). */
void cohort__failure_copy_out(cohort_failure *dst, const cohort_failure *src);

#endif /* COHORT_FAILURE_H */
