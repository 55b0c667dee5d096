/*
 * run.c - `cohort run`: the launcher (torchrun-like, start method "popen").
 *
 *   cohort run -n N [--max-restarts K] [--coordinator URL] [--job NAME]
 *              [--token-file FILE] [--nnodes M --node-rank R]
 *              [--report FILE] [--grace MS] -- PROGRAM ARGS...
 *
 * It starts an embedded coordinator unless one is given, spawns N local
 * workers with the environment libcohort reads (cohort's and torchrun's
 * variables; the token only there, never on a command line), forwards
 * SIGINT/SIGTERM, and supervises them.
 *
 * Under Kubeflow's Trainer, torchrun's arguments are in the environment
 * (PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK, PET_MASTER_ADDR,
 * PET_MASTER_PORT) and are the defaults of --nnodes, -n, --node-rank and
 * --coordinator; node 0 then serves the coordinator at PET_MASTER_PORT,
 * as torchrun's node 0 serves its store there. A job of several nodes is
 * named --job, else COHORT_JOB, else by its launcher (cohort__env_job:
 * SLURM's job and step, Kubeflow's master address...), the same on every
 * node; with none of these it is refused (run-<pid> differs per node).
 *
 * Supervision:
 *
 *  1. All workers exit 0: the job is done, exit 0.
 *  2. A worker fails (non-zero exit or a signal): the others learn it from
 *     cohortd at once (their pending calls return COHORT_EPEERLOST naming
 *     the rank and its text) and stop by themselves; workers still running
 *     after the grace period are sent SIGTERM, then SIGKILL.
 *  3. With restarts left, the whole group is started again as a new
 *     generation, with COHORT_RESTART_COUNT incremented so the program can
 *     resume from its checkpoint. Otherwise the launcher prints a failure
 *     report (root-cause rank, exit status, its error text, the operation
 *     it was in, time from failure to the last worker stopping), writes it
 *     as JSON with --report, and exits with the root cause's exit code.
 *
 * Children are started with posix_spawn (fork+exec): nng state of this
 * process (the embedded coordinator) is never used in a child.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
#include <spawn.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <time.h>
#include <unistd.h>

#include "conn.h"
#include "cohort_impl.h"
#include "coord.h"
#include "server.h"
#include "timeline.h"
#include "token.h"

#define RUN_MARKS 64

/* (ops, issue 23) The exit status of a launcher whose job failed because
 * of a rank on another node: "a peer was lost", as train_digits exits
 * when cohortd reports COHORT_EPEERLOST; deploy/k8s's podFailurePolicy
 * does not count it against this node's retries (docs/kubernetes.md,
 * "Exit codes"). */
#define RUN_EXIT_PEER_LOST 250

extern char **environ;

#define RUN_MAX_LOCAL 1024

struct run_worker {
	pid_t pid;
	int rank;
	int local_rank;
	int status; /* raw wait status */
	bool running;
	int64_t end_ms; /* when it was reaped */
	int sent_sig; /* the last signal cohort run itself sent (0: none) */
	bool sent_stop; /* it was SIGTERM/SIGKILL after the grace period */
};

struct run_failure {
	bool have;
	int rank;
	int exit_code; /* 128+sig for a signal */
	int signal;
	int64_t at_ms; /* when the launcher noticed it */
	char text[COHORT__DETAIL_MAX]; /* the rank's reported error text */
	char last_op[128];
	uint64_t last_op_seq;
	char coordinator_view[64]; /* member state at cohortd */
	/* cohortd did not answer cohort run either: the likely root cause
	 * (workers lose it past their reconnect window and stop). */
	char coord_unreachable[COHORT__DETAIL_MAX];
};

struct run_cfg {
	int nproc;
	int nnodes;
	int node_rank;
	int max_restarts;
	int grace_ms;
	const char *coordinator;
	/* the coordinator came from the launcher (PET_MASTER_ADDR); node 0
	 * serves it */
	bool coordinator_from_launcher;
	char coordinator_buf[300];
	const char *job;
	const char *token;
	const char *token_file, *token_cli; /* --token-file, --token */
	char token_buf[COHORT__TOKEN_MAX + 1];
	const char *report;
	/* --timeline PATH (or COHORT_TIMELINE): the merged trace, and the
	 * workers' COHORT_TIMELINE=PATH.parts/... (timeline.c) */
	const char *timeline;
	char timeline_env[1200];
	/* HOST:PORT of torch's store for the workers (a cohortd TCPStore
	 * listener): the embedded coordinator's own, or --torch-store. */
	const char *torch_store;
	char **argv;
};

static volatile sig_atomic_t run_signal;

static void
run_on_signal(int sig)
{
	run_signal = sig;
}

static int64_t
run_now_ms(void)
{
	return (cohort__now_ms());
}

static void
run_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort run -n N [options] -- PROGRAM [ARGS...]\n"
	    "\n"
	    "Starts N local workers of one job and supervises them.\n"
	    "\n"
	    "  -n, --nproc-per-node N  workers on this node (required)\n"
	    "  --nnodes M              nodes in the job (default 1)\n"
	    "  --node-rank R           this node's index (default 0);\n"
	    "                          ranks are R*N .. R*N+N-1\n"
	    "  --coordinator URL       use this cohortd (default: start an\n"
	    "                          embedded one on a free loopback port)\n"
	    "  --job NAME              job name (default: COHORT_JOB; with\n"
	    "                          --nnodes > 1 the launcher's job id\n"
	    "                          (SLURM, Kubeflow...), else required;\n"
	    "                          one node: run-<pid>)\n"
	    "  --token-file FILE       job token (default: COHORT_TOKEN,\n"
	    "                          COHORT_TOKEN_FILE, none); workers get "
	    "it in\n"
	    "                          their environment only\n"
	    "  (Kubeflow's PET_NNODES, PET_NPROC_PER_NODE, PET_NODE_RANK,\n"
	    "   PET_MASTER_ADDR:PET_MASTER_PORT are the defaults of "
	    "--nnodes,\n"
	    "   -n, --node-rank and --coordinator; node 0 serves it)\n"
	    "  --max-restarts K        restart the whole group up to K times\n"
	    "  --grace MS              after a failure, how long the others\n"
	    "                          may take to stop before SIGTERM\n"
	    "                          (default 5000)\n"
	    "  --report FILE           write the failure report as JSON\n"
	    "  --timeline PATH         write every rank's operations as one\n"
	    "                          Chrome trace / Perfetto JSON file\n"
	    "                          (default: COHORT_TIMELINE; see\n"
	    "                          docs/observability.md)\n"
	    "  --torch-store HOST:PORT torch's store for the workers (a\n"
	    "                          cohortd --torch-store listener of "
	    "this\n"
	    "                          job); the embedded coordinator serves\n"
	    "                          one itself. Workers get MASTER_ADDR,\n"
	    "                          MASTER_PORT and\n"
	    "                          TORCHELASTIC_USE_AGENT_STORE=True, so\n"
	    "                          init_process_group() works "
	    "unchanged\n");
}

/* Kubeflow's torchrun arguments (PET_*) as defaults; -1 when unset. */
static int
run_pet_int(const char *name, int lo, int hi, int *out)
{
	const char *v = cohort__env_raw(name);

	if (v == NULL)
		return (0);
	if (!cohort__cli_int(v, lo, hi, out)) {
		fprintf(stderr,
		    "cohort run: %s='%s' is not a number in [%d, %d]%s\n",
		    name, v, lo, hi,
		    strcmp(name, "PET_NPROC_PER_NODE") == 0 ? " (give -n N)"
		                                            : "");
		return (-1);
	}
	return (1);
}

static int
run_pet_defaults(struct run_cfg *cfg)
{
	const char *addr = cohort__env_raw("PET_MASTER_ADDR");
	int port = 0, got;

	if (cohort__env_raw("PET_NNODES") == NULL)
		return (0);
	if (run_pet_int("PET_NNODES", 1, 65536, &cfg->nnodes) < 0
	    || run_pet_int("PET_NODE_RANK", 0, 65535, &cfg->node_rank) < 0)
		return (-1);
	/* "auto", "gpu", "cpu": the operator sizes it; -n must say */
	if (cohort__env_raw("PET_NPROC_PER_NODE") != NULL
	    && cohort__cli_int(cohort__env_raw("PET_NPROC_PER_NODE"), 1,
	        RUN_MAX_LOCAL, &cfg->nproc))
		cohort__debug("-n %d from PET_NPROC_PER_NODE", cfg->nproc);
	if (addr != NULL
	    && (got = run_pet_int("PET_MASTER_PORT", 1, 65535, &port)) != 0) {
		if (got < 0)
			return (-1);
		snprintf(cfg->coordinator_buf, sizeof(cfg->coordinator_buf),
		    strchr(addr, ':') != NULL ? "tcp://[%s]:%d"
		                              : "tcp://%s:%d",
		    addr, port);
		cfg->coordinator = cfg->coordinator_buf;
		cfg->coordinator_from_launcher = true;
	}
	return (0);
}

enum { RUN_COORDINATOR = COHORT__CLI_LONG, RUN_TORCH_STORE };

#define RUN_INT(name, key, lo, hi, field)                                     \
	COHORT__CLI_NUM(                                                      \
	    name, key, COHORT__CLI_INT, lo, hi, struct run_cfg, field)
#define RUN_STR(name, field)                                                  \
	COHORT__CLI_SET(name, 0, COHORT__CLI_STR, struct run_cfg, field)

static const struct cohort__cli_opt run_opts[] = {
	RUN_INT("nproc-per-node", 'n', 1, RUN_MAX_LOCAL, nproc),
	RUN_INT("nnodes", 0, 1, 65536, nnodes),
	RUN_INT("node-rank", 0, 0, 65535, node_rank),
	RUN_INT("max-restarts", 0, 0, 1000000, max_restarts),
	RUN_INT("grace", 0, 0, 3600000, grace_ms),
	COHORT__CLI_DO("coordinator", RUN_COORDINATOR, COHORT__CLI_ACT_ARG),
	RUN_STR("job", job),
	RUN_STR("token-file", token_file),
	RUN_STR("token", token_cli),
	RUN_STR("report", report),
	RUN_STR("timeline", timeline),
	COHORT__CLI_DO("torch-store", RUN_TORCH_STORE, COHORT__CLI_ACT_ARG),
	COHORT__CLI_END,
};

/* '+': the options end at the program */
static const struct cohort__cli run_cli
    = { "cohort run", '+', run_opts, run_usage };

/* 0, 1 after --help, 2 for a usage error (said). */
static int
run_parse(int argc, char **argv, struct run_cfg *cfg)
{
	int opt;

	*cfg = (struct run_cfg) { .nproc = 0, .nnodes = 1, .grace_ms = 5000 };
	if (run_pet_defaults(cfg) != 0)
		return (2);
	while ((opt = cohort__cli_next(&run_cli, cfg, argc, argv)) != -1) {
		if (opt == RUN_TORCH_STORE && strrchr(optarg, ':') == NULL)
			opt = cohort__cli_bad(
			    &run_cli, opt, optarg, "(HOST:PORT)");
		if (opt == RUN_COORDINATOR) {
			cfg->coordinator = optarg;
			cfg->coordinator_from_launcher = false;
		} else if (opt == RUN_TORCH_STORE) {
			cfg->torch_store = optarg;
		} else {
			return (opt == 'h' ? 1 : 2);
		}
	}
	if (cfg->nproc == 0) {
		fprintf(stderr, "cohort run: -n N is required\n");
		return (2);
	}
	if (cohort__token_for_tool("cohort run", cfg->token_file,
	        cfg->token_cli, false, cfg->token_buf, sizeof(cfg->token_buf),
	        &cfg->token)
	    != COHORT_OK) {
		fprintf(stderr, "cohort run: %s\n", cohort_last_error());
		return (2);
	}
	if (cfg->node_rank >= cfg->nnodes) {
		fprintf(stderr, "cohort run: --node-rank %d >= --nnodes %d\n",
		    cfg->node_rank, cfg->nnodes);
		return (2);
	}
	if (cfg->nnodes > 1 && cfg->coordinator == NULL) {
		fprintf(stderr,
		    "cohort run: --nnodes > 1 needs --coordinator "
		    "(every node must dial the same cohortd; under Kubeflow "
		    "PET_MASTER_ADDR and PET_MASTER_PORT give it)\n");
		return (2);
	}
	if (optind >= argc) {
		fprintf(stderr, "cohort run: no program given\n");
		run_usage(stderr);
		return (2);
	}
	cfg->argv = &argv[optind];
	return (0);
}

static pid_t
run_spawn(const struct run_cfg *cfg, const char *url, const char *job,
    int rank, int local_rank, int restart)
{
	enum { NVARS = 25 };
	const char *vars[NVARS];
	char buf[4096], store[3][320];
	cohort_env e;
	char **envp;
	size_t n = 0, k;
	pid_t pid;
	int rv, nv;

	/* cohort's and torchrun's variables: the one writer beside the
	 * reader (cohort_env_vars, client/env.c). */
	memset(&e, 0, sizeof(e));
	cohort__strlcpy(e.coordinator, url, sizeof(e.coordinator));
	cohort__strlcpy(e.job, job, sizeof(e.job));
	cohort__strlcpy(e.token, cfg->token, sizeof(e.token));
	e.rank = rank;
	e.world_size = cfg->nproc * cfg->nnodes;
	e.local_rank = local_rank;
	e.local_world_size = cfg->nproc;
	e.node_rank = cfg->node_rank;
	e.restart_count = restart;
	if ((nv = cohort_env_vars(&e, buf, sizeof(buf), vars, NVARS - 4)) < 0)
		return (-1);
	k = (size_t)nv;
	if (cfg->timeline != NULL)
		vars[k++] = cfg->timeline_env;
	if (cfg->torch_store != NULL) {
		/* torch's store is cohortd's TCPStore listener: every rank a
		 * client (as under torchrun's agent store), none binds it. */
		const char *colon = strrchr(cfg->torch_store, ':');
		snprintf(store[0], sizeof(store[0]), "MASTER_ADDR=%.*s",
		    (int)(colon - cfg->torch_store), cfg->torch_store);
		snprintf(
		    store[1], sizeof(store[1]), "MASTER_PORT=%s", colon + 1);
		snprintf(store[2], sizeof(store[2]),
		    "TORCHELASTIC_USE_AGENT_STORE=True");
		for (int i = 0; i < 3; i++)
			vars[k++] = store[i];
	}
	while (environ[n] != NULL)
		n++;
	envp = calloc(n + k + 1, sizeof(char *));
	if (envp == NULL)
		return (-1);
	for (size_t i = 0; i < k; i++)
		envp[i] = (char *)vars[i];
	/* Inherited variables after ours: the first match wins, and names
	 * we set are dropped from the inherited set to avoid ambiguity. */
	for (size_t i = 0, m = k; i < n; i++) {
		bool dup = false;
		const char *eq = strchr(environ[i], '=');
		size_t nl = eq ? (size_t)(eq - environ[i]) : 0;
		for (size_t j = 0; j < k && eq != NULL; j++)
			if (strncmp(vars[j], environ[i], nl + 1) == 0)
				dup = true;
		if (!dup)
			envp[m++] = environ[i];
	}
	rv = posix_spawnp(&pid, cfg->argv[0], NULL, NULL, cfg->argv, envp);
	free(envp);
	if (rv != 0) {
		fprintf(stderr, "cohort run: cannot start %s: %s\n",
		    cfg->argv[0], strerror(rv));
		return (-1);
	}
	return (pid);
}

static const char *
run_describe(int status, char *buf, size_t len)
{
	if (WIFEXITED(status))
		snprintf(
		    buf, len, "exited with status %d", WEXITSTATUS(status));
	else if (WIFSIGNALED(status))
		snprintf(buf, len, "killed by signal %d (%s)",
		    WTERMSIG(status), strsignal(WTERMSIG(status)));
	else
		snprintf(buf, len, "stopped (status 0x%x)", status);
	return (buf);
}

/* A worker's end in a report: "killed by signal 15" is told apart when
 * the signal was cohort run's own (the worker had not stopped by itself
 * within the grace period after the failure). */
static const char *
run_describe_worker(const struct run_worker *w, const struct run_cfg *cfg,
    char *buf, size_t len)
{
	if (w->sent_stop && WIFSIGNALED(w->status)
	    && WTERMSIG(w->status) == w->sent_sig)
		snprintf(buf, len,
		    "stopped by cohort run (%s): still running %.1f s after "
		    "the first failure (--grace)",
		    w->sent_sig == SIGKILL ? "SIGKILL" : "SIGTERM",
		    (double)cfg->grace_ms / 1000.0);
	else
		run_describe(w->status, buf, len);
	return (buf);
}

/* Asks cohortd what it knows about the failed rank: its reported text,
 * its last operation. Best effort, bounded to two seconds; when cohortd
 * does not answer, f->coord_unreachable says why. */
static void
run_query_failure(const char *url, const struct run_cfg *cfg, const char *job,
    struct run_failure *f)
{
	struct cohort__coord *co = NULL;
	struct cohort__coord_call call;
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__StatusQuery q = COHORT__STATUS_QUERY__INIT;
	cohort__time deadline = cohort__now_ms() + 2000;
	cohort_status rv;

	f->coord_unreachable[0] = '\0';
	if (cohort__coord_open(url, job, cfg->token, cohort__random_u64(), &co)
	    != COHORT_OK)
		return;
	if (cohort__coord_wait_connected(co, deadline) != COHORT_OK) {
		cohort__strlcpy(f->coord_unreachable, cohort_last_error(),
		    sizeof(f->coord_unreachable));
		goto out;
	}
	q.job = (char *)job;
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	cohort__coord_call_init(&call, &req, deadline);
	rv = cohort__coord_call(co, &call);
	if (rv == COHORT_ENOCOORD)
		cohort__strlcpy(f->coord_unreachable, cohort_last_error(),
		    sizeof(f->coord_unreachable));
	if (rv == COHORT_OK && call.rep != NULL
	    && call.rep->body_case == COHORT__REPLY__BODY_STATUS_QUERY) {
		Cohort__StatusReply *sr = call.rep->status_query;
		for (size_t j = 0; j < sr->n_jobs; j++) {
			Cohort__JobStatus *js = sr->jobs[j];
			if (strcmp(js->job, job) != 0)
				continue;
			/* cohortd knows which member failed first; the
			 * order in which the launcher reaped them does not
			 * tell (the others stop within milliseconds). */
			if (js->failed_rank >= 0) {
				f->rank = js->failed_rank;
				if (js->failed_text != NULL)
					cohort__strlcpy(f->text,
					    js->failed_text, sizeof(f->text));
			}
			for (size_t m = 0; m < js->n_members; m++) {
				Cohort__MemberStatus *ms = js->members[m];
				if (ms->rank != f->rank)
					continue;
				if (ms->failure != NULL && ms->failure[0]
				    && f->text[0] == '\0')
					cohort__strlcpy(f->text, ms->failure,
					    sizeof(f->text));
				if (ms->last_op != NULL)
					cohort__strlcpy(f->last_op,
					    ms->last_op, sizeof(f->last_op));
				f->last_op_seq = ms->last_op_seq;
				if (ms->state != NULL)
					cohort__strlcpy(f->coordinator_view,
					    ms->state,
					    sizeof(f->coordinator_view));
			}
		}
	}
	cohort__coord_call_fini(&call);
out:
	cohort__coord_close(co);
}

static void
run_report(const struct run_cfg *cfg, const char *job,
    const struct run_failure *f, const struct run_worker *w, int nw,
    int64_t last_stop_ms, int restarts)
{
	char desc[160];

	desc[0] = '\0';
	for (int i = 0; i < nw; i++)
		if (w[i].rank == f->rank)
			run_describe_worker(&w[i], cfg, desc, sizeof(desc));
	fprintf(stderr, "\ncohort run: job '%s' failed%s\n", job,
	    restarts < cfg->max_restarts ? " (this attempt)" : "");
	if (f->coord_unreachable[0] != '\0')
		fprintf(stderr,
		    "  root cause : the coordinator at %s is unreachable: "
		    "cohort run cannot reach it either (%s); workers stop "
		    "when it stays away past their reconnect window "
		    "(COHORT_RECONNECT_MS)\n"
		    "  first exit : rank %d %s\n",
		    cfg->coordinator != NULL ? cfg->coordinator : "(embedded)",
		    f->coord_unreachable, f->rank, desc);
	else
		fprintf(stderr, "  root cause : rank %d %s\n", f->rank, desc);
	fprintf(stderr,
	    "  error text : %s\n"
	    "  operation  : %s%s",
	    f->text[0] ? f->text : "(none reported)",
	    f->last_op[0] ? f->last_op : "(unknown)",
	    f->last_op[0] ? "" : "\n");
	if (f->last_op[0])
		fprintf(stderr, " (#%" PRIu64 ")\n", f->last_op_seq);
	fprintf(stderr,
	    "  stopped in : %.3f s (failure to last worker stopping)\n"
	    "  restarts   : %d of %d used\n",
	    (double)(last_stop_ms - f->at_ms) / 1000.0, restarts,
	    cfg->max_restarts);
	for (int i = 0; i < nw; i++)
		fprintf(stderr, "  rank %-5d : %s\n", w[i].rank,
		    run_describe_worker(&w[i], cfg, desc, sizeof(desc)));

	if (cfg->report != NULL) {
		FILE *out = fopen(cfg->report, "w");
		if (out == NULL) {
			fprintf(stderr, "cohort run: cannot write %s: %s\n",
			    cfg->report, strerror(errno));
			return;
		}
		fprintf(out, "{\"job\":");
		cohort__json_str(out, job);
		if (f->coord_unreachable[0] != '\0') {
			fprintf(out, ",\"coordinator_unreachable\":");
			cohort__json_str(out, f->coord_unreachable);
		}
		fprintf(out,
		    ",\"root_cause\":{\"rank\":%d,\"exit_code\":%d,"
		    "\"signal\":%d,\"error_text\":",
		    f->rank, f->exit_code, f->signal);
		cohort__json_str(out, f->text);
		fprintf(out, ",\"operation\":");
		cohort__json_str(out, f->last_op);
		fprintf(out, ",\"operation_seq\":%" PRIu64 ",\"kind\":\"%s\"}",
		    f->last_op_seq,
		    f->coord_unreachable[0] != '\0' ? "coordinator" : "rank");
		fprintf(out,
		    ",\"stop_seconds\":%.3f,\"restarts\":%d,"
		    "\"max_restarts\":%d,\"workers\":[",
		    (double)(last_stop_ms - f->at_ms) / 1000.0, restarts,
		    cfg->max_restarts);
		for (int i = 0; i < nw; i++) {
			int st = w[i].status;
			fprintf(out,
			    "%s{\"rank\":%d,\"exit_code\":%d,"
			    "\"signal\":%d}",
			    i ? "," : "", w[i].rank,
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1,
			    WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		}
		fprintf(out, "]}\n");
		fclose(out);
	}
}

static void
run_signal_all(struct run_worker *w, int nw, int sig)
{
	for (int i = 0; i < nw; i++)
		if (w[i].running) {
			kill(w[i].pid, sig);
			if (sig != SIGCONT)
				w[i].sent_sig = sig;
		}
}

/* After the grace period: the workers still running are stopped by us,
 * and the report says so (their "killed by signal 15" is ours). */
static void
run_stop_all(struct run_worker *w, int nw, int sig)
{
	for (int i = 0; i < nw; i++)
		if (w[i].running)
			w[i].sent_stop = true;
	run_signal_all(w, nw, sig);
}

/* Runs one generation of the group. Returns 0 when every worker exited 0,
 * else fills *f with the root cause. */
static int
run_generation(const struct run_cfg *cfg, const char *url, const char *job,
    int restart, struct run_failure *f, int *exit_code)
{
	struct run_worker *w;
	int nw = cfg->nproc, alive = 0;
	int64_t term_at = 0, kill_at = 0, last_stop = 0;
	int forwarded = 0;
	int rc = 0;

	w = calloc((size_t)nw, sizeof(*w));
	if (w == NULL)
		return (-1);
	memset(f, 0, sizeof(*f));
	for (int i = 0; i < nw; i++) {
		w[i].rank = cfg->node_rank * cfg->nproc + i;
		w[i].local_rank = i;
		w[i].pid = run_spawn(cfg, url, job, w[i].rank, i, restart);
		if (w[i].pid < 0) {
			run_signal_all(w, i, SIGKILL);
			for (int j = 0; j < i; j++)
				waitpid(w[j].pid, NULL, 0);
			free(w);
			*exit_code = 127;
			return (-1);
		}
		w[i].running = true;
		alive++;
	}
	cohort__info(
	    "started %d workers of job '%s' (restart %d)", nw, job, restart);

	while (alive > 0) {
		int status;
		pid_t pid = waitpid(-1, &status, WNOHANG);
		int64_t now = run_now_ms();

		if (pid > 0) {
			for (int i = 0; i < nw; i++) {
				if (w[i].pid != pid || !w[i].running)
					continue;
				w[i].running = false;
				w[i].status = status;
				w[i].end_ms = now;
				alive--;
				last_stop = now;
				if ((WIFEXITED(status)
				        && WEXITSTATUS(status) == 0)
				    || f->have)
					break;
				/* the first failure is the root cause */
				f->have = true;
				f->rank = w[i].rank;
				f->at_ms = now;
				f->exit_code = WIFEXITED(status)
				    ? WEXITSTATUS(status)
				    : 128 + WTERMSIG(status);
				f->signal = WIFSIGNALED(status)
				    ? WTERMSIG(status)
				    : 0;
				term_at = now + cfg->grace_ms;
				kill_at = term_at + 3000;
			}
			continue;
		}
		if (run_signal != 0 && forwarded != run_signal) {
			forwarded = run_signal;
			fprintf(stderr,
			    "cohort run: forwarding signal %d to "
			    "%d workers\n",
			    forwarded, alive);
			run_signal_all(w, nw, forwarded);
			if (term_at == 0) {
				term_at = now + cfg->grace_ms;
				kill_at = term_at + 3000;
			}
		}
		if (term_at != 0 && now >= term_at) {
			run_stop_all(w, nw, SIGTERM);
			/* a stopped worker (SIGSTOP, a fault drill) only
			 * acts on SIGTERM once continued */
			run_signal_all(w, nw, SIGCONT);
			term_at = INT64_MAX;
		}
		if (kill_at != 0 && now >= kill_at) {
			run_stop_all(w, nw, SIGKILL);
			kill_at = INT64_MAX;
		}
		usleep(2000);
	}
	if (f->have) {
		bool local = false;

		rc = 1;
		run_query_failure(url, cfg, job, f);
		for (int i = 0; i < nw; i++) {
			int st = w[i].status;
			if (w[i].rank != f->rank)
				continue;
			local = true;
			f->exit_code = WIFEXITED(st) ? WEXITSTATUS(st)
			                             : 128 + WTERMSIG(st);
			f->signal = WIFSIGNALED(st) ? WTERMSIG(st) : 0;
		}
		*exit_code = f->exit_code != 0 ? f->exit_code : 1;
		/* (ops, issue 23) cohortd names a rank of another node as the
		 * root cause: this node only lost a peer, whatever its own
		 * workers exited with (a Python trainer: 1; stopped after
		 * --grace: 143). */
		if (!local)
			*exit_code = RUN_EXIT_PEER_LOST;
		run_report(cfg, job, f, w, nw, last_stop, restart);
	} else if (run_signal != 0) {
		rc = 1;
		*exit_code = 128 + run_signal;
	}
	free(w);
	return (rc);
}

/* The job's name. One node: --job, COHORT_JOB, else run-<pid>. Several:
 * every node must say the same, so the launcher's id of the launch
 * (cohort__env_job) stands in for --job, and with none the run is
 * refused rather than split into one job per node. */
static int
run_job_name(const struct run_cfg *cfg, char *job, size_t len)
{
	char from[64];

	if (cfg->job != NULL) {
		cohort__strlcpy(job, cfg->job, len);
		return (0);
	}
	if (cohort__env_job(job, len, from, sizeof(from)) != COHORT_OK) {
		fprintf(stderr, "cohort run: %s\n", cohort_last_error());
		return (2);
	}
	if (strcmp(from, "default") != 0
	    && (cfg->nnodes > 1 || strcmp(from, "COHORT_JOB") == 0)) {
		cohort__info("job '%s' (from %s)", job, from);
		return (0);
	}
	if (cfg->nnodes > 1) {
		fprintf(stderr,
		    "cohort run: --nnodes %d: the job needs a name that is "
		    "the same on every node, and no launcher gave one "
		    "(COHORT_JOB, TORCHELASTIC_RUN_ID, SLURM_JOB_ID, Open "
		    "MPI's or Kubeflow's variables): pass --job NAME, the "
		    "same on every node\n",
		    cfg->nnodes);
		return (2);
	}
	snprintf(job, len, "run-%d", (int)getpid());
	return (0);
}

/* Listens on every interface at the port of cfg->coordinator, with the
 * job (and its token) created in advance. */
static struct cohort__srv *
run_serve(const struct run_cfg *cfg, const char *job)
{
	struct cohort__srv *srv;
	char listen[64], what[128];

	snprintf(listen, sizeof(listen), "tcp://0.0.0.0:%s",
	    strrchr(cfg->coordinator, ':') + 1);
	snprintf(what, sizeof(what),
	    "node 0 cannot serve the coordinator at %s", listen);
	srv = cohort__cli_serve(
	    "cohort run", what, listen, job, cfg->token, NULL);
	if (srv != NULL)
		cohort__info("serving the coordinator of job '%s' at %s (%s)",
		    job, cfg->coordinator, listen);
	return (srv);
}

/* Nodes other than 0 may start first: their workers would give up on a
 * coordinator that is not up yet, so wait for it (bounded) first. */
static int
run_await_coordinator(const struct run_cfg *cfg, const char *job)
{
	struct cohort__coord *co = NULL;
	cohort__time deadline = cohort__now_ms() + 600000;
	cohort_status st;

	if (cohort__coord_open(
	        cfg->coordinator, job, cfg->token, cohort__random_u64(), &co)
	    != COHORT_OK) {
		fprintf(stderr, "cohort run: %s\n", cohort_last_error());
		return (-1);
	}
	st = cohort__coord_wait_connected(co, deadline);
	cohort__coord_close(co);
	if (st != COHORT_OK) {
		fprintf(stderr,
		    "cohort run: the coordinator at %s (node 0's) did not "
		    "answer within 600 s: %s\n",
		    cfg->coordinator, cohort_last_error());
		return (-1);
	}
	return (0);
}

/* Node 0's workers are done; the other nodes' may still be leaving:
 * give their connections a bounded while to go. */
static void
run_drain(struct cohort__srv *srv)
{
	cohort__time end = cohort__now_ms() + 30000;

	while (cohort__now_ms() < end && cohort__srv_idle_ms(srv) < 500)
		usleep(20000);
}

int
cohort__cmd_run(int argc, char **argv)
{
	struct run_cfg cfg;
	struct cohort__srv *srv = NULL;
	struct run_failure f;
	char job[128];
	const char *url;
	int rc, exit_code = 0;
	struct sigaction sa;
	struct cohort__timeline_mark marks[RUN_MARKS];
	int nmarks = 0;

	if ((rc = run_parse(argc, argv, &cfg)) != 0)
		return (rc == 1 ? 0 : rc);
	cohort__log_set_component("cohort-run");
	cohort__log_set_default_level(COHORT__LOG_WARN);
	if ((rc = run_job_name(&cfg, job, sizeof(job))) != 0)
		return (rc);

	if (cfg.coordinator != NULL && cfg.coordinator_from_launcher
	    && cfg.node_rank == 0) {
		/* Kubeflow's node 0: serve the coordinator every node was
		 * told about, as torchrun's node 0 serves its store. */
		if ((srv = run_serve(&cfg, job)) == NULL)
			return (1);
		url = cfg.coordinator;
	} else if (cfg.coordinator != NULL) {
		url = cfg.coordinator;
		if (cfg.coordinator_from_launcher
		    && run_await_coordinator(&cfg, job) != 0)
			return (1);
	} else {
		/* The job exists from the start with its token, and torch's
		 * store for it is a TCPStore listener of the coordinator. */
		char store[200];
		snprintf(store, sizeof(store), "%s@127.0.0.1:0", job);
		if ((srv = cohort__cli_serve("cohort run",
		         "cannot start the embedded coordinator",
		         "tcp://127.0.0.1:0", job, cfg.token, store))
		    == NULL)
			return (1);
		url = cohort__srv_url(srv, 0);
		if (cfg.torch_store == NULL)
			cfg.torch_store = cohort__srv_torch_store_addr(srv, 0);
	}

	memset(&sa, 0, sizeof(sa));
	sa.sa_handler = run_on_signal;
	sigaction(SIGINT, &sa, NULL);
	sigaction(SIGTERM, &sa, NULL);

	if (cfg.timeline == NULL) {
		const char *t = cohort__knob_str(COHORT__KNOB_TIMELINE);
		if (t != NULL && t[0] != '\0')
			cfg.timeline = t;
	}
	if (cfg.timeline != NULL
	    && cohort__timeline_prepare(
	           cfg.timeline, cfg.timeline_env, sizeof(cfg.timeline_env))
	        != 0) {
		cohort__srv_stop(srv);
		return (1);
	}
	for (int restart = 0;; restart++) {
		rc = run_generation(&cfg, url, job, restart, &f, &exit_code);
		if (rc != 0 && f.have && nmarks < RUN_MARKS) {
			struct cohort__timeline_mark *m = &marks[nmarks++];
			m->name = "failure";
			m->ts_us = cohort__timeline_now_us();
			snprintf(m->detail, sizeof(m->detail),
			    "rank %d: %.480s", f.rank, f.text);
		}
		if (rc == 0 || run_signal != 0 || rc < 0)
			break;
		if (restart >= cfg.max_restarts)
			break;
		fprintf(stderr,
		    "cohort run: restarting the group (%d of %d)\n",
		    restart + 1, cfg.max_restarts);
		if (nmarks < RUN_MARKS) {
			struct cohort__timeline_mark *m = &marks[nmarks++];
			m->name = "restart";
			m->ts_us = cohort__timeline_now_us();
			snprintf(m->detail, sizeof(m->detail),
			    "restart %d of %d", restart + 1, cfg.max_restarts);
		}
	}
	if (cfg.timeline != NULL)
		(void)cohort__timeline_merge(
		    cfg.timeline, cfg.nproc * cfg.nnodes, marks, nmarks);
	if (srv != NULL && cfg.coordinator_from_launcher)
		run_drain(srv);
	cohort__srv_stop(srv);
	return (rc == 0 ? 0 : exit_code);
}
