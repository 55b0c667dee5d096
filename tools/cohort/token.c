/*
 * token.c - `cohort token`: a job's token, minted from cohortd's admin
 * secret (common/token.h, docs/security.md).
 *
 *   cohort token [--admin-token-file FILE] JOB...
 *
 * Prints one token per line, in the order of the jobs. The secret comes
 * from a file (--admin-token-file, else COHORT_ADMIN_TOKEN_FILE), never
 * from the command line. A cohortd started with --require-token and the
 * same secret accepts a join of JOB with this token, which creates the
 * job; the operator hands it to the job's workers as COHORT_TOKEN or
 * COHORT_TOKEN_FILE (a Kubernetes Secret, a file readable by the job's
 * user only).
 */
#include <stdio.h>
#include <string.h>

#include "cli.h"
#include "cohort_impl.h"
#include "token.h"

static void
token_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort token [--admin-token-file FILE] JOB...\n"
	    "\n"
	    "Prints the token of each JOB, minted from cohortd's admin "
	    "secret\n"
	    "(HMAC-SHA-256 of the job name, hex). cohortd --require-token "
	    "with\n"
	    "the same secret creates JOB for a join that carries it.\n"
	    "\n"
	    "  --admin-token-file FILE  the admin secret (default:\n"
	    "                           $COHORT_ADMIN_TOKEN_FILE)\n");
}

struct token_cfg {
	const char *file; /* the admin secret */
};

static const struct cohort__cli_opt token_opts[] = {
	COHORT__CLI_SET(
	    "admin-token-file", 0, COHORT__CLI_STR, struct token_cfg, file),
	COHORT__CLI_END,
};

static const struct cohort__cli token_cli
    = { "cohort token", '+', token_opts, token_usage };

int
cohort__cmd_token(int argc, char **argv)
{
	struct token_cfg cfg
	    = { cohort__knob_str(COHORT__KNOB_ADMIN_TOKEN_FILE) };
	const char *file;
	char admin[COHORT__TOKEN_MAX + 1], tok[COHORT__MINTED_LEN + 1];
	int i, opt, njobs = 0;

	if ((opt = cohort__cli_next(&token_cli, &cfg, argc, argv)) != -1)
		return (opt == 'h' ? 0 : 2);
	file = cfg.file;
	i = optind;
	if (file == NULL) {
		fprintf(stderr,
		    "cohort token: no admin secret (--admin-token-file FILE "
		    "or COHORT_ADMIN_TOKEN_FILE)\n");
		return (2);
	}
	if (cohort__secret_read(
	        "--admin-token-file", file, admin, sizeof(admin))
	    != COHORT_OK) {
		fprintf(stderr, "cohort token: %s\n", cohort_last_error());
		return (1);
	}
	for (int j = i; j < argc; j++) {
		size_t n = strlen(argv[j]);
		if (n == 0 || n > COHORT__TOKEN_MAX) {
			fprintf(stderr,
			    "cohort token: a job name is 1..%d bytes\n",
			    COHORT__TOKEN_MAX);
			memset(admin, 0, sizeof(admin));
			return (2);
		}
		cohort__token_mint(admin, argv[j], tok);
		printf("%s\n", tok);
		njobs++;
	}
	memset(admin, 0, sizeof(admin));
	if (njobs == 0) {
		fprintf(stderr, "cohort token: no job given\n");
		token_usage(stderr);
		return (2);
	}
	return (0);
}
