/*
 * conn.h - the connection options of the `cohort` subcommands that talk
 * to a running cohortd (status, top, fault), and their connection
 * (conn.c).
 */
#ifndef COHORT_TOOLS_CONN_H
#define COHORT_TOOLS_CONN_H

#include <stdbool.h>

#include "cli.h"
#include "cohort_impl.h"
#include "coord.h"
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

enum {
	COHORT__CLI_COORDINATOR = COHORT__CLI_LONG,
	COHORT__CLI_JOB,
	COHORT__CLI_TOKEN,
	COHORT__CLI_TOKEN_FILE,
	COHORT__CLI_TIMEOUT,
	COHORT__CLI_CONN_END /* a command's own long options start here */
};

/* The entries of struct option for those options. */
/* clang-format off */
#define COHORT__CLI_CONN_OPTIONS \
	{ "coordinator", required_argument, NULL, COHORT__CLI_COORDINATOR }, \
	{ "job", required_argument, NULL, COHORT__CLI_JOB }, \
	{ "token", required_argument, NULL, COHORT__CLI_TOKEN }, \
	{ "token-file", required_argument, NULL, COHORT__CLI_TOKEN_FILE }, \
	{ "timeout", required_argument, NULL, COHORT__CLI_TIMEOUT }
/* clang-format on */

void cohort__cli_conn_init(struct cohort__cli_conn *cc);
/* Takes option opt (a value of cohort__cli_next) with its value: 1 if it
 * is one of the connection options, 0 if not, 2 for a bad value (said). */
int cohort__cli_conn_opt(const struct cohort__cli *cli,
    struct cohort__cli_conn *cc, int opt, const char *val);
/* Fills what was not given from the environment (COHORT_COORDINATOR or
 * MASTER_ADDR/PORT, COHORT_JOB, COHORT_TOKEN or COHORT_TOKEN_FILE; the
 * admin secret instead when admin_ok and no job), then connects to the
 * coordinator (for the job, if any) by cc->deadline, the timeout from
 * now. need_job: a job is required. Returns 0 with *co open, or the exit
 * status (1, 2) after telling why on stderr. */
int cohort__cli_conn_open(const struct cohort__cli *cli,
    struct cohort__cli_conn *cc, bool need_job, bool admin_ok,
    struct cohort__coord **co);

#endif /* COHORT_TOOLS_CONN_H */
