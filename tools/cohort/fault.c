/*
 * fault.c - `cohort fault`: sends a fault schedule to a running job
 * (docs/fault-injection.md).
 *
 *   cohort fault [--coordinator URL] [--job J] [--token-file FILE]
 *                [--timeout MS]
 *                SCHEDULE
 *
 * The schedule has the grammar of COHORT_FAULTS (client/fault.h), e.g.
 * 'rank=1,at=op:+10,action=stop'. It is checked here, then stored in the
 * job's KV as __cohort/faults/N = "generation=G\nSCHEDULE" (N from an add
 * on __cohort/faults/count, G the job's current generation from a status
 * query). Every member looks for the next N with each heartbeat (once a
 * second by default) and applies the schedule when it finds it, relative
 * triggers ('+') counted from then; members of a later generation (after a
 * restart) ignore it.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort_impl.h"
#include "conn.h"
#include "fault.h"

int cohort__cmd_fault(int argc, char **argv);

struct fault_cfg {
	struct cohort__cli_conn conn;
	const char *spec;
};

static void
fault_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort fault [--coordinator URL] [--job J]\n"
	    "                    [--token-file FILE] [--timeout MS] "
	    "SCHEDULE\n\n"
	    "Sends a fault schedule to the running job J: every member\n"
	    "picks it up at once. SCHEDULE is like COHORT_FAULTS, e.g.\n"
	    "  'rank=1,at=op:+10,action=stop'\n"
	    "  'seed=7;rank=random,at=time:+2s,action=kill'\n"
	    "Fields: rank=N|random|all, at=op:[+]N|time:[+]T|op:random:A-B|\n"
	    "time:random:A-B, "
	    "action=exit[:CODE]|kill|stop|delay:T|drop|fail,\n"
	    "count=N (delay), run=N|any. See docs/fault-injection.md.\n"
	    "Defaults come from COHORT_COORDINATOR (or MASTER_ADDR/PORT),\n"
	    "COHORT_JOB and COHORT_TOKEN (or COHORT_TOKEN_FILE).\n");
}

static const struct cohort__cli_opt fault_opts[] = {
	COHORT__CLI_CONN_ROWS(struct fault_cfg, conn),
	COHORT__CLI_END,
};

/* '-': the schedule is taken where it stands (as option 1) */
static const struct cohort__cli fault_cli
    = { "cohort fault", '-', fault_opts, fault_usage };

static int
fault_take_spec(struct fault_cfg *cfg, const char *arg)
{
	if (cfg->spec != NULL) {
		fprintf(
		    stderr, "cohort fault: one schedule only (quote it)\n");
		return (2);
	}
	cfg->spec = arg;
	return (0);
}

/* 0 ok, 1 help printed, 2 usage error. */
static int
fault_parse_args(int argc, char **argv, struct fault_cfg *cfg)
{
	int opt;

	while ((opt = cohort__cli_next(&fault_cli, cfg, argc, argv)) != -1)
		if (opt != 1 || fault_take_spec(cfg, optarg) != 0)
			return (opt == 'h' ? 1 : 2);
	for (; optind < argc; optind++) /* after "--" */
		if (fault_take_spec(cfg, argv[optind]) != 0)
			return (2);
	if (cfg->spec == NULL) {
		fault_usage(stderr);
		return (2);
	}
	return (0);
}

/* Runs req; prints the error and returns false on failure. */
static bool
fault_call(struct cohort__coord *co, struct cohort__coord_call *call,
    Cohort__Request *req, const struct cohort__iov *iov, cohort__time dl,
    const char *what)
{
	cohort_status st;

	cohort__coord_call_init(call, req, dl);
	if (iov != NULL) {
		call->parts = iov;
		call->nparts = 1;
	}
	if ((st = cohort__coord_call(co, call)) != COHORT_OK) {
		fprintf(stderr, "cohort fault: %s: %s: %s\n", what,
		    cohort_status_name(st), cohort_last_error());
		return (false);
	}
	return (true);
}

static int
fault_send(struct cohort__coord *co, const struct fault_cfg *cfg,
    cohort__time deadline)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__StatusQuery q = COHORT__STATUS_QUERY__INIT;
	Cohort__KvAdd add = COHORT__KV_ADD__INIT;
	Cohort__KvSet set = COHORT__KV_SET__INIT;
	struct cohort__coord_call call;
	struct cohort__fault_plan *plan = NULL;
	const Cohort__JobStatus *js = NULL;
	struct cohort__iov iov;
	uint64_t gen;
	uint32_t world;
	int64_t n;
	char key[64], *val = NULL;
	size_t vlen;
	int rc = 1;

	q.job = (char *)cfg->conn.job;
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	if (!fault_call(co, &call, &req, NULL, cohort__now_ms(), "status"))
		goto out_fini;
	if (call.rep->body_case == COHORT__REPLY__BODY_STATUS_QUERY
	    && call.rep->status_query != NULL)
		for (size_t i = 0; i < call.rep->status_query->n_jobs; i++)
			if (strcmp(call.rep->status_query->jobs[i]->job,
			        cfg->conn.job)
			    == 0)
				js = call.rep->status_query->jobs[i];
	if (js == NULL || js->generation == 0) {
		fprintf(stderr,
		    "cohort fault: job '%s' is not running at %s\n",
		    cfg->conn.job, cfg->conn.coordinator);
		goto out_fini;
	}
	gen = js->generation;
	world = js->world_size;
	cohort__coord_call_fini(&call);

	/* The ranks must exist (random ones are drawn by the members). */
	if ((plan = malloc(sizeof(*plan))) == NULL)
		goto out;
	(void)cohort__fault_parse(cfg->spec, plan);
	if (cohort__fault_resolve(plan, 1, (int32_t)world) != COHORT_OK) {
		fprintf(stderr, "cohort fault: %s\n", cohort_last_error());
		goto out;
	}

	add.key = COHORT__FAULT_KEY_COUNT;
	add.delta = 1;
	cohort__request__init(&req);
	req.body_case = COHORT__REQUEST__BODY_KV_ADD;
	req.kv_add = &add;
	if (!fault_call(co, &call, &req, NULL, deadline, "kv add"))
		goto out_fini;
	if (call.rep->body_case != COHORT__REPLY__BODY_KV_ADD
	    || call.rep->kv_add == NULL) {
		fprintf(stderr, "cohort fault: malformed add reply\n");
		goto out_fini;
	}
	n = call.rep->kv_add->value;
	cohort__coord_call_fini(&call);

	vlen = strlen(cfg->spec) + 48;
	if ((val = malloc(vlen)) == NULL)
		goto out;
	vlen = (size_t)snprintf(
	    val, vlen, "generation=%" PRIu64 "\n%s", gen, cfg->spec);
	snprintf(key, sizeof(key), COHORT__FAULT_KEY_PREFIX "%" PRId64, n);
	set.key = key;
	iov.base = val;
	iov.len = vlen;
	cohort__request__init(&req);
	req.body_case = COHORT__REQUEST__BODY_KV_SET;
	req.kv_set = &set;
	if (!fault_call(co, &call, &req, &iov, deadline, "kv set"))
		goto out_fini;
	printf("cohort fault: schedule #%" PRId64 " sent to job '%s' "
	       "(generation %" PRIu64 ", %u ranks): %s\n",
	    n, cfg->conn.job, gen, world, cfg->spec);
	rc = 0;
out_fini:
	cohort__coord_call_fini(&call);
out:
	free(plan);
	free(val);
	return (rc);
}

int
cohort__cmd_fault(int argc, char **argv)
{
	struct fault_cfg cfg = { .spec = NULL };
	struct cohort__fault_plan *plan;
	struct cohort__coord *co;
	cohort_status st;
	int rc;

	cohort__cli_conn_init(&cfg.conn);
	if ((rc = fault_parse_args(argc, argv, &cfg)) != 0)
		return (rc == 1 ? 0 : rc);
	if ((plan = malloc(sizeof(*plan))) == NULL)
		return (1);
	st = cohort__fault_parse(cfg.spec, plan);
	rc = st != COHORT_OK || plan->n == 0;
	free(plan);
	if (rc) {
		fprintf(stderr, "cohort fault: %s\n",
		    st != COHORT_OK ? cohort_last_error()
		                    : "the schedule has no rule");
		return (2);
	}
	if ((rc = cohort__cli_conn_open(
	         &fault_cli, &cfg.conn, true, false, &co))
	    != 0)
		return (rc);
	rc = fault_send(co, &cfg, cfg.conn.deadline);
	cohort__coord_close(co);
	return (rc);
}
