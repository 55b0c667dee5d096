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
#include "coord.h"
#include "token.h"
#include "fault.h"

int cohort__cmd_fault(int argc, char **argv);

struct fault_cfg {
	const char *coordinator;
	const char *job;
	const char *token;
	const char *spec;
	int timeout_ms;
	const char *token_file;
	char token_buf[COHORT__TOKEN_MAX + 1];
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

static int
fault_parse_args(int argc, char **argv, struct fault_cfg *cfg)
{
	int64_t v;

	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *val = i + 1 < argc ? argv[i + 1] : NULL;

		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			fault_usage(stdout);
			return (1);
		}
		if (strncmp(a, "--", 2) != 0) {
			if (cfg->spec != NULL) {
				fprintf(stderr,
				    "cohort fault: one schedule "
				    "only (quote it)\n");
				return (2);
			}
			cfg->spec = a;
			continue;
		}
		if (val == NULL) {
			fprintf(stderr,
			    "cohort fault: '%s' needs a value or is unknown\n",
			    a);
			return (2);
		}
		if (strcmp(a, "--coordinator") == 0)
			cfg->coordinator = val;
		else if (strcmp(a, "--job") == 0)
			cfg->job = val;
		else if (strcmp(a, "--token") == 0)
			cfg->token = val;
		else if (strcmp(a, "--token-file") == 0)
			cfg->token_file = val;
		else if (strcmp(a, "--timeout") == 0) {
			if (!cohort__parse_i64(val, &v) || v < 1
			    || v > 3600000) {
				fprintf(stderr,
				    "cohort fault: bad --timeout '%s'\n", val);
				return (2);
			}
			cfg->timeout_ms = (int)v;
		} else {
			fprintf(
			    stderr, "cohort fault: unknown option '%s'\n", a);
			return (2);
		}
		i++;
	}
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

	q.job = (char *)cfg->job;
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	if (!fault_call(co, &call, &req, NULL, cohort__now_ms(), "status"))
		goto out_fini;
	if (call.rep->body_case == COHORT__REPLY__BODY_STATUS_QUERY
	    && call.rep->status_query != NULL)
		for (size_t i = 0; i < call.rep->status_query->n_jobs; i++)
			if (strcmp(
			        call.rep->status_query->jobs[i]->job, cfg->job)
			    == 0)
				js = call.rep->status_query->jobs[i];
	if (js == NULL || js->generation == 0) {
		fprintf(stderr,
		    "cohort fault: job '%s' is not running at %s\n", cfg->job,
		    cfg->coordinator);
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
	    n, cfg->job, gen, world, cfg->spec);
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
	struct fault_cfg cfg = { NULL, NULL, NULL, NULL, 5000, NULL, "" };
	struct cohort__fault_plan *plan;
	struct cohort__coord *co;
	cohort__time deadline;
	cohort_env env;
	cohort_status st;
	int rc;

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
	if (cfg.coordinator == NULL || cfg.job == NULL) {
		if (cohort_env_resolve(&env) != COHORT_OK) {
			fprintf(
			    stderr, "cohort fault: %s\n", cohort_last_error());
			return (1);
		}
		if (cfg.coordinator == NULL && env.coordinator[0] != '\0')
			cfg.coordinator = env.coordinator;
		if (cfg.job == NULL && getenv("COHORT_JOB") != NULL)
			cfg.job = env.job;
	}
	if (cohort__token_for_tool("cohort fault", cfg.token_file, cfg.token,
	        false, cfg.token_buf, sizeof(cfg.token_buf), &cfg.token)
	    != COHORT_OK) {
		fprintf(stderr, "cohort fault: %s\n", cohort_last_error());
		return (2);
	}
	if (cfg.coordinator == NULL || cfg.job == NULL) {
		fprintf(stderr,
		    "cohort fault: need --coordinator URL and "
		    "--job J (or COHORT_COORDINATOR, COHORT_JOB)\n");
		return (2);
	}
	deadline = cohort__now_ms() + cfg.timeout_ms;
	if ((st = cohort__coord_open(cfg.coordinator, cfg.job, cfg.token,
	         cohort__random_u64(), &co))
	    != COHORT_OK) {
		fprintf(stderr, "cohort fault: %s\n", cohort_last_error());
		return (1);
	}
	if ((st = cohort__coord_wait_connected(co, deadline)) != COHORT_OK) {
		fprintf(stderr, "cohort fault: %s\n", cohort_last_error());
		cohort__coord_close(co);
		return (1);
	}
	rc = fault_send(co, &cfg, deadline);
	cohort__coord_close(co);
	return (rc);
}
