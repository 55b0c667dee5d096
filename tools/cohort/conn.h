/*
 * conn.h - how the `cohort` subcommands reach a coordinator (conn.c):
 * the connection options of those that talk to a running cohortd
 * (status, top, fault), and the coordinator that run and bench embed.
 */
#ifndef COHORT_TOOLS_CONN_H
#define COHORT_TOOLS_CONN_H

#include <stdbool.h>

#include "cli.h"
#include "cohort_impl.h"
#include "coord.h"
#include "server.h"
#include "token.h"

/* --coordinator URL, --job J, --token-file FILE (--token T, deprecated),
 * --timeout MS: how status, top and fault reach a running job. */
struct cohort__cli_conn {
	const char *coordinator;
	const char *job;
	const char *token;
	const char *token_file;
	int timeout_ms; /* 5000 unless given */
	char token_buf[COHORT__TOKEN_MAX + 1];
	cohort_env env; /* the defaults, when one was not given */
	cohort__time deadline; /* cohort__cli_conn_open's + timeout_ms */
};

/* The rows of those options (common/cli.h) in the table of settings of
 * type `type` holding a struct cohort__cli_conn `m`. */
/* clang-format off */
#define COHORT__CLI_CONN_ROWS(type, m) \
	COHORT__CLI_SET("coordinator", 0, COHORT__CLI_STR, type, m.coordinator), \
	COHORT__CLI_SET("job", 0, COHORT__CLI_STR, type, m.job), \
	COHORT__CLI_SET("token", 0, COHORT__CLI_STR, type, m.token), \
	COHORT__CLI_SET("token-file", 0, COHORT__CLI_STR, type, m.token_file), \
	COHORT__CLI_NUM("timeout", 0, COHORT__CLI_INT, 1, 3600000, type, \
	    m.timeout_ms)
/* clang-format on */

/* Sets the defaults (a timeout of 5000 ms). */
void cohort__cli_conn_init(struct cohort__cli_conn *cc);
/* Fills what was not given from the environment (COHORT_COORDINATOR or
 * MASTER_ADDR/PORT, COHORT_JOB, COHORT_TOKEN or COHORT_TOKEN_FILE; the
 * admin secret instead when admin_ok and no job), then connects to the
 * coordinator (for the job, if any) by cc->deadline, the timeout from
 * now. need_job: a job is required. Returns 0 with *co open, or the exit
 * status (1, 2) after telling why on stderr. */
int cohort__cli_conn_open(const struct cohort__cli *cli,
    struct cohort__cli_conn *cc, bool need_job, bool admin_ok,
    struct cohort__coord **co);

/* Starts a coordinator in this process listening on listen, with job
 * created in advance with its token (job NULL: none) and a TCPStore
 * listener store ("JOB@ADDR:PORT", NULL: none). NULL after "PROG: WHAT:
 * why" on stderr. */
struct cohort__srv *cohort__cli_serve(const char *prog, const char *what,
    const char *listen, const char *job, const char *token, const char *store);

#endif /* COHORT_TOOLS_CONN_H */
