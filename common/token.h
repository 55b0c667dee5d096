/*
 * token.h - job tokens: read from files (never from a command line, which
 * /proc/PID/cmdline shows to every user of the host) and minted from
 * cohortd's admin secret (docs/security.md).
 *
 * A minted job token is HMAC-SHA-256(key = the admin secret, message = the
 * job name) in lowercase hex (64 characters): an operator hands each job
 * its token without restarting cohortd, and computes it with `cohort token
 * JOB` or with any HMAC tool (`printf %s JOB | openssl dgst -sha256 -hmac
 * "$(cat admin.secret)"`).
 */
#ifndef COHORT_COMMON_TOKEN_H
#define COHORT_COMMON_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "cohort/cohort.h"

/* Largest token or secret (the wire limit of a token, a name). */
#define COHORT__TOKEN_MAX 255
/* Hex length of a minted token. */
#define COHORT__MINTED_LEN 64

/* Reads a secret from path into out (len bytes): the whole file less
 * trailing whitespace (the newline of `echo`). COHORT_OK, or COHORT_EINVAL
 * naming what (what, e.g. "--admin-token-file") and path when the file
 * cannot be read, is empty, holds a NUL byte or does not fit. */
cohort_status cohort__secret_read(
    const char *what, const char *path, char *out, size_t len);

/* The job token minted from admin for job: COHORT__MINTED_LEN hex digits
 * and a NUL into out (at least COHORT__MINTED_LEN + 1 bytes). */
void cohort__token_mint(const char *admin, const char *job, char *out);

/* Whether token is the one minted from admin for job (compared in time
 * independent of the contents). */
bool cohort__token_is_minted(
    const char *admin, const char *job, const char *token);

/* The token a command-line tool (cohort run, status, fault) sends, into
 * buf (len bytes) and *out: the contents of file (its --token-file), else
 * cli (its --token, which ps shows: a warning on stderr names prog), else
 * COHORT_TOKEN, else the contents of COHORT_TOKEN_FILE, else, when admin
 * (a query of all jobs), the contents of COHORT_ADMIN_TOKEN_FILE, else "".
 * COHORT_EINVAL (detail in cohort_last_error) when a file cannot be
 * read. */
cohort_status cohort__token_for_tool(const char *prog, const char *file,
    const char *cli, bool admin, char *buf, size_t len, const char **out);

#endif /* COHORT_COMMON_TOKEN_H */
