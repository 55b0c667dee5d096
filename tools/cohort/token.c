/*
 * token.c - `cohort token`: job tokens and tenant keys, minted from
 * cohortd's admin secret or from a tenant's key (common/token.h,
 * docs/security.md).
 *
 *   cohort token [--admin-token-file FILE] JOB...
 *   cohort token --tenant [--admin-token-file FILE] TENANT...
 *   cohort token --tenant-key-file FILE TENANT/NAME...
 *
 * Prints one token (or key) per line, in the order of the operands, on
 * stdout or into --output FILE (mode 0600, replaced whole: an init
 * container writes a job's token for its worker that way). The
 * secret comes from a file, never from the command line: the admin
 * secret from --admin-token-file, else COHORT_ADMIN_TOKEN_FILE; a
 * tenant's key from --tenant-key-file. A cohortd started with
 * --require-token and the same admin secret accepts a join of JOB with
 * its token, which creates the job; the operator (or the tenant, for its
 * own jobs) hands it to the job's workers as COHORT_TOKEN or
 * COHORT_TOKEN_FILE (a Kubernetes Secret, a file readable by the job's
 * user only).
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>
#include <unistd.h>

#include "cli.h"
#include "cohort_impl.h"
#include "token.h"

static void
token_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort token [--admin-token-file FILE] JOB...\n"
	    "       cohort token --tenant [--admin-token-file FILE] "
	    "TENANT...\n"
	    "       cohort token --tenant-key-file FILE TENANT/NAME...\n"
	    "\n"
	    "Prints, one per line, the token of each JOB minted from "
	    "cohortd's\n"
	    "admin secret (HMAC-SHA-256 of the job name, hex); with "
	    "--tenant, the\n"
	    "key of each TENANT (its jobs are TENANT/NAME); with "
	    "--tenant-key-file,\n"
	    "the token of each of that tenant's jobs, minted from its key. "
	    "cohortd\n"
	    "--require-token with the same admin secret creates a job for a "
	    "join\n"
	    "that carries its token.\n"
	    "\n"
	    "  --admin-token-file FILE  the admin secret (default:\n"
	    "                           $COHORT_ADMIN_TOKEN_FILE)\n"
	    "  --tenant                 the operands are tenants: print "
	    "their keys\n"
	    "  --tenant-key-file FILE   a tenant's key: mint its own jobs' "
	    "tokens\n"
	    "                           (no admin secret needed)\n"
	    "  --output FILE            write them into FILE (mode 0600) "
	    "instead of\n"
	    "                           stdout\n");
}

struct token_cfg {
	const char *file; /* the admin secret */
	const char *tenant_key_file;
	const char *output;
	bool tenant;
};

static const struct cohort__cli_opt token_opts[] = {
	COHORT__CLI_SET(
	    "admin-token-file", 0, COHORT__CLI_STR, struct token_cfg, file),
	COHORT__CLI_SET("tenant-key-file", 0, COHORT__CLI_STR,
	    struct token_cfg, tenant_key_file),
	COHORT__CLI_SET(
	    "tenant", 0, COHORT__CLI_FLAG, struct token_cfg, tenant),
	COHORT__CLI_SET(
	    "output", 0, COHORT__CLI_STR, struct token_cfg, output),
	COHORT__CLI_END,
};

static const struct cohort__cli token_cli
    = { "cohort token", '+', token_opts, token_usage };

/* Whether every operand is what the mode mints for; says which is not. */
static bool
token_operands_ok(const struct token_cfg *cfg, int argc, char **argv, int i)
{
	char tenant[COHORT__TENANT_MAX + 1];

	for (int j = i; j < argc; j++) {
		size_t n = strlen(argv[j]);
		if (n == 0 || n > COHORT__TOKEN_MAX) {
			fprintf(stderr,
			    "cohort token: a job name is 1..%d bytes\n",
			    COHORT__TOKEN_MAX);
			return (false);
		}
		if (cfg->tenant && !cohort__tenant_name_ok(argv[j])) {
			fprintf(stderr,
			    "cohort token: '%s' is not a tenant name (1..%d "
			    "of a-z, 0-9 and '-', starting and ending with a "
			    "letter or digit)\n",
			    argv[j], COHORT__TENANT_MAX);
			return (false);
		}
		if (cfg->tenant_key_file != NULL
		    && !cohort__job_tenant(argv[j], tenant, sizeof(tenant))) {
			fprintf(stderr,
			    "cohort token: '%s' is no tenant's job: a tenant "
			    "key mints tokens for TENANT/NAME only\n",
			    argv[j]);
			return (false);
		}
	}
	if (i >= argc) {
		fprintf(stderr, "cohort token: no %s given\n",
		    cfg->tenant ? "tenant" : "job");
		token_usage(stderr);
		return (false);
	}
	return (true);
}

/* Opens path's replacement (a temporary file of mode 0600 beside it) into
 * *f and its name into tmp; NULL f on error (said). */
static void
token_output_open(const char *path, char *tmp, size_t len, FILE **f)
{
	int fd;

	*f = NULL;
	if ((size_t)snprintf(tmp, len, "%s.XXXXXX", path) >= len) {
		fprintf(stderr, "cohort token: --output %s: name too long\n",
		    path);
		return;
	}
	if ((fd = mkstemp(tmp)) < 0 || fchmod(fd, 0600) != 0
	    || (*f = fdopen(fd, "w")) == NULL) {
		fprintf(stderr, "cohort token: --output %s: %s\n", path,
		    strerror(errno));
		if (fd >= 0) {
			close(fd);
			unlink(tmp);
		}
	}
}

/* Closes f and moves it over path; 0, or 1 (said, tmp removed). */
static int
token_output_close(FILE *f, const char *tmp, const char *path)
{
	bool ok = fflush(f) == 0 && fsync(fileno(f)) == 0;

	if (fclose(f) != 0)
		ok = false;
	if (ok && rename(tmp, path) == 0)
		return (0);
	fprintf(
	    stderr, "cohort token: --output %s: %s\n", path, strerror(errno));
	unlink(tmp);
	return (1);
}

int
cohort__cmd_token(int argc, char **argv)
{
	struct token_cfg cfg
	    = { cohort__knob_str(COHORT__KNOB_ADMIN_TOKEN_FILE), NULL, NULL,
		      false };
	const char *file, *what;
	char secret[COHORT__TOKEN_MAX + 1], tok[COHORT__MINTED_LEN + 1];
	char tmp[4096];
	FILE *out = stdout;
	int opt, rc;

	if ((opt = cohort__cli_next(&token_cli, &cfg, argc, argv)) != -1)
		return (opt == 'h' ? 0 : 2);
	if (cfg.tenant && cfg.tenant_key_file != NULL) {
		fprintf(stderr,
		    "cohort token: --tenant mints tenant keys from the admin "
		    "secret, --tenant-key-file job tokens from a tenant key: "
		    "one or the other\n");
		return (2);
	}
	file = cfg.tenant_key_file != NULL ? cfg.tenant_key_file : cfg.file;
	what = cfg.tenant_key_file != NULL ? "--tenant-key-file"
	                                   : "--admin-token-file";
	if (file == NULL) {
		fprintf(stderr,
		    "cohort token: no admin secret (--admin-token-file FILE "
		    "or COHORT_ADMIN_TOKEN_FILE; a tenant: "
		    "--tenant-key-file FILE)\n");
		return (2);
	}
	if (!token_operands_ok(&cfg, argc, argv, optind))
		return (2);
	if (cohort__secret_read(what, file, secret, sizeof(secret))
	    != COHORT_OK) {
		fprintf(stderr, "cohort token: %s\n", cohort_last_error());
		return (1);
	}
	if (cfg.output != NULL) {
		token_output_open(cfg.output, tmp, sizeof(tmp), &out);
		if (out == NULL) {
			memset(secret, 0, sizeof(secret));
			return (1);
		}
	}
	for (int j = optind; j < argc; j++) {
		if (cfg.tenant)
			cohort__tenant_key_mint(secret, argv[j], tok);
		else
			cohort__token_mint(secret, argv[j], tok);
		fprintf(out, "%s\n", tok);
	}
	memset(secret, 0, sizeof(secret));
	memset(tok, 0, sizeof(tok));
	if (cfg.output != NULL)
		rc = token_output_close(out, tmp, cfg.output);
	else
		rc = fflush(stdout) == 0 ? 0 : 1;
	return (rc);
}
