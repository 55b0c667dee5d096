/*
 * token.h - job tokens: read from files (never from a command line, which
 * /proc/PID/cmdline shows to every user of the host) and minted from
 * cohortd's admin secret, directly or through a tenant's key
 * (docs/security.md).
 *
 * Three kinds of secret, each minted from the one above it with
 * HMAC-SHA-256, written as 64 lowercase hex digits:
 *
 *   admin secret   cohortd's (--admin-token-file); the operator's
 *   tenant key     HMAC(key = admin secret, message = "cohort-tenant" NUL
 *                  TENANT): handed to tenant TENANT once
 *   job token      HMAC(key = admin secret, message = JOB) for any job,
 *                  or HMAC(key = tenant key, message = JOB) for a job
 *                  TENANT/NAME of that tenant
 *
 * cohortd --require-token verifies the chain at the join that creates a
 * job, so a tenant mints its own jobs' tokens (`cohort token
 * --tenant-key-file KEY TENANT/NAME`) without the admin secret, and its
 * key is worth nothing for another tenant's names or for a name of no
 * tenant. Each computes with any HMAC tool:
 *
 *   printf %s JOB | openssl dgst -sha256 -hmac "$(cat admin.secret)"
 *   printf 'cohort-tenant\0%s' TENANT | openssl dgst -sha256 -hmac "$(cat
 * admin.secret)" printf %s TENANT/NAME | openssl dgst -sha256 -hmac "$(cat
 * tenant.key)"
 *
 * A job name holds no NUL byte, so no tenant key is ever some job's
 * token, and a tenant name holds no '/', so TENANT/NAME has one tenant.
 */
#ifndef COHORT_COMMON_TOKEN_H
#define COHORT_COMMON_TOKEN_H

#include <stdbool.h>
#include <stddef.h>

#include "cohort/cohort.h"

/* Largest token or secret (the wire limit of a token, a name). */
#define COHORT__TOKEN_MAX 255
/* Hex length of a minted token or tenant key. */
#define COHORT__MINTED_LEN 64
/* Longest tenant name: an RFC 1123 label, like a Kubernetes namespace. */
#define COHORT__TENANT_MAX 63

/* Reads a secret from path into out (len bytes): the whole file less
 * trailing whitespace (the newline of `echo`). COHORT_OK, or COHORT_EINVAL
 * naming what (what, e.g. "--admin-token-file") and path when the file
 * cannot be read, is empty, holds a NUL byte or does not fit. */
cohort_status cohort__secret_read(
    const char *what, const char *path, char *out, size_t len);

/* The job token minted from secret (the admin secret, or a tenant key for
 * the tenant's own jobs) for job: COHORT__MINTED_LEN hex digits and a NUL
 * into out (at least COHORT__MINTED_LEN + 1 bytes). */
void cohort__token_mint(const char *secret, const char *job, char *out);

/* Whether name is a tenant name: 1 to COHORT__TENANT_MAX characters of
 * a-z, 0-9 and '-', starting and ending with a letter or a digit. */
bool cohort__tenant_name_ok(const char *name);

/* The tenant that owns job, into out (len bytes, at least
 * COHORT__TENANT_MAX + 1): the part of job before its first '/' when it
 * is a tenant name and a name follows the '/'. False (out = "") for a
 * job of no tenant. */
bool cohort__job_tenant(const char *job, char *out, size_t len);

/* The key of tenant minted from admin: COHORT__MINTED_LEN hex digits and
 * a NUL into out. The caller checks cohort__tenant_name_ok first. */
void cohort__tenant_key_mint(const char *admin, const char *tenant, char *out);

/* Whether token is one cohortd accepts to create job: minted from admin
 * for job, or, for a job TENANT/NAME, minted for job from TENANT's key
 * (itself minted from admin). Compared in time independent of the
 * contents; false without an admin secret. */
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
