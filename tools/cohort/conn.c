/*
 * conn.c - how the subcommands reach a coordinator (conn.h).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "conn.h"

void
cohort__cli_conn_init(struct cohort__cli_conn *cc)
{
	memset(cc, 0, sizeof(*cc));
	cc->timeout_ms = 5000;
}

int
cohort__cli_conn_open(const struct cohort__cli *cli,
    struct cohort__cli_conn *cc, bool need_job, bool admin_ok,
    struct cohort__coord **co)
{
	if (cc->coordinator == NULL || cc->job == NULL) {
		if (cohort_env_resolve(&cc->env) != COHORT_OK) {
			fprintf(stderr, "%s: %s\n", cli->name,
			    cohort_last_error());
			return (1);
		}
		if (cc->coordinator == NULL && cc->env.coordinator[0] != '\0')
			cc->coordinator = cc->env.coordinator;
		if (cc->job == NULL && getenv("COHORT_JOB") != NULL)
			cc->job = cc->env.job;
	}
	if (cohort__token_for_tool(cli->name, cc->token_file, cc->token,
	        admin_ok && cc->job == NULL, cc->token_buf,
	        sizeof(cc->token_buf), &cc->token)
	    != COHORT_OK) {
		fprintf(stderr, "%s: %s\n", cli->name, cohort_last_error());
		return (2);
	}
	if (need_job && (cc->coordinator == NULL || cc->job == NULL)) {
		fprintf(stderr,
		    "%s: need --coordinator URL and --job J (or "
		    "COHORT_COORDINATOR, COHORT_JOB)\n",
		    cli->name);
		return (2);
	}
	if (cc->coordinator == NULL) {
		fprintf(stderr,
		    "%s: no coordinator; use --coordinator URL or "
		    "COHORT_COORDINATOR\n",
		    cli->name);
		return (2);
	}
	cc->deadline = cohort__now_ms() + cc->timeout_ms;
	if (cohort__coord_open(cc->coordinator, cc->job != NULL ? cc->job : "",
	        cc->token, cohort__random_u64(), co)
	    != COHORT_OK) {
		fprintf(stderr, "%s: %s\n", cli->name, cohort_last_error());
		return (1);
	}
	if (cohort__coord_wait_connected(*co, cc->deadline) != COHORT_OK) {
		fprintf(stderr, "%s: %s\n", cli->name, cohort_last_error());
		cohort__coord_close(*co);
		*co = NULL;
		return (1);
	}
	return (0);
}

struct cohort__srv *
cohort__cli_serve(const char *prog, const char *what, const char *listen,
    const char *job, const char *token, const char *store)
{
	struct cohort__srv_config sc;
	struct cohort__srv *srv = NULL;
	char jobspec[400];
	const char *listens[1] = { listen }, *jobs[1] = { jobspec };
	const char *stores[1] = { store };

	cohort__srv_config_init(&sc);
	sc.listen = listens;
	sc.nlisten = 1;
	if (job != NULL) {
		snprintf(jobspec, sizeof(jobspec), "%s:%s", job, token);
		sc.jobs = jobs;
		sc.njobs = 1;
	}
	if (store != NULL) {
		sc.torch_stores = stores;
		sc.ntorch_stores = 1;
	}
	if (cohort__srv_start(&sc, &srv) != COHORT_OK) {
		fprintf(
		    stderr, "%s: %s: %s\n", prog, what, cohort_last_error());
		srv = NULL;
	}
	memset(jobspec, 0, sizeof(jobspec));
	return (srv);
}
