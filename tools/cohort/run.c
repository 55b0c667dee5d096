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
 * Children are started by the launcher core of cohort_spawn
 * (strategies/launch.h: fork + exec with only async-signal-safe calls in
 * between, so the nng state of this process, the embedded coordinator, is
 * never used in a child), tied to this process with PR_SET_PDEATHSIG
 * (SIGKILL): a launcher that is killed leaves no worker behind.
 */
#include <errno.h>
#include <inttypes.h>
#include <signal.h>
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
#include "launch.h"
#include "runview.h"
#include "server.h"
#include "timeline.h"
#include "token.h"

#define RUN_MARKS 64

#define RUN_MAX_LOCAL 1024

/* The job rank of this node's worker i (local rank i). */
#define RUN_RANK(cfg, i) ((cfg)->node_rank * (cfg)->nproc + (i))

/* What ended an attempt, as every node reports it. */
enum run_cause {
	RUN_CAUSE_RANK, /* a rank failed (cohortd's first, else ours) */
	RUN_CAUSE_COORDINATOR, /* cohortd is unreachable */
	RUN_CAUSE_RENDEZVOUS, /* the attempt's rendezvous never completed */
};

struct run_failure {
	bool have;
	enum run_cause cause;
	int rank; /* the root cause's rank, -1 for a rendezvous */
	int exit_code; /* 128+sig for a signal */
	int signal;
	int64_t at_ms; /* when the launcher noticed it */
	char how[512]; /* how the root-cause rank ended, on whichever node */
	int first_local; /* index of our first failed worker */
	char text[COHORT__DETAIL_MAX]; /* the rank's reported error text */
	char last_op[192];
	uint64_t last_op_seq;
	/* cohortd's record of the failure (proto Failure): its kind
	 * ("process", "heartbeat", "reported"; "" when cohortd had none) and
	 * where the rank ran */
	char failure_kind[32];
	char host[256];
	uint32_t pid;
	/* cohortd did not answer cohort run either: the likely root cause
	 * (workers lose it past their reconnect window and stop). */
	char coord_unreachable[512];
	/* RUN_CAUSE_RENDEZVOUS: "timed out after 30.0 s: 2 of 4 ranks
	 * joined; missing ranks 2, 3" */
	char rdzv[512];
	char missing[256];
	/* an elastic job: cohortd holds it failed (it fell below its
	 * minimum), and the worker failures this node lived through */
	bool below_min;
	int survived, restarts;
};

/* What the launcher keeps across its attempts. */
struct run_state {
	const char *url, *job;
	struct cohort__run_link *link; /* to cohortd, for views and records */
	char host[64];
	/* The job's generation when the previous attempt ended: an attempt
	 * whose view shows no later one never formed its own. */
	uint64_t base_gen;
	/* This attempt: has its generation formed; the last view that
	 * showed its rendezvous; when it started; the next poll. */
	bool formed;
	struct cohort__run_view rdzv;
	int64_t rdzv_at, started, next_poll;
	bool publish; /* exit records still go through */
};

struct run_cfg {
	int nproc;
	int nnodes; /* the maximum of an elastic job */
	int min_nodes; /* --nnodes MIN:MAX: MIN; 0: not elastic */
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
	/* --bind (or COHORT_BIND): none or cores (launch.h) */
	const char *bind;
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
	    "  --nnodes MIN:MAX        an elastic job (docs/elastic.md): it\n"
	    "                          lives with MIN to MAX nodes; a lost\n"
	    "                          worker does not stop the others,\n"
	    "                          which go on in the same processes;\n"
	    "                          with --max-restarts a dead worker is\n"
	    "                          started again and rejoins\n"
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
	    "                          (elastic: each dead worker of this\n"
	    "                          node, K in all)\n"
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
	    "unchanged\n"
	    "  --bind none|cores       CPU binding of this node's workers\n"
	    "                          (default: COHORT_BIND, none): cores\n"
	    "                          splits this launcher's CPUs among\n"
	    "                          them, each its own slice (shared\n"
	    "                          round-robin when they outnumber the\n"
	    "                          CPUs)\n");
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

/* "N", or torchrun's "MIN:MAX" (an elastic job; MIN = MAX is N), into
 * cfg: nnodes the maximum, min_nodes the minimum (0: not elastic). */
static bool
run_parse_nnodes(const char *s, struct run_cfg *cfg)
{
	const char *colon = strchr(s, ':');
	char lo[16];
	int a, b;

	if (colon == NULL) {
		if (!cohort__cli_int(s, 1, 65536, &a))
			return (false);
		cfg->nnodes = a;
		cfg->min_nodes = 0;
		return (true);
	}
	if ((size_t)(colon - s) >= sizeof(lo))
		return (false);
	memcpy(lo, s, (size_t)(colon - s));
	lo[colon - s] = '\0';
	if (!cohort__cli_int(lo, 1, 65536, &a)
	    || !cohort__cli_int(colon + 1, 1, 65536, &b) || a > b)
		return (false);
	cfg->nnodes = b;
	cfg->min_nodes = a < b ? a : 0;
	return (true);
}

static int
run_pet_defaults(struct run_cfg *cfg)
{
	const char *addr = cohort__env_raw("PET_MASTER_ADDR");
	const char *nn = cohort__env_raw("PET_NNODES");
	int port = 0, got;

	if (nn == NULL)
		return (0);
	if (!run_parse_nnodes(nn, cfg)) {
		fprintf(stderr,
		    "cohort run: PET_NNODES='%s' is not N or MIN:MAX (1 to "
		    "65536)\n",
		    nn);
		return (-1);
	}
	if (run_pet_int("PET_NODE_RANK", 0, 65535, &cfg->node_rank) < 0)
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

enum { RUN_COORDINATOR = COHORT__CLI_LONG, RUN_TORCH_STORE, RUN_NNODES };

#define RUN_INT(name, key, lo, hi, field)                                     \
	COHORT__CLI_NUM(                                                      \
	    name, key, COHORT__CLI_INT, lo, hi, struct run_cfg, field)
#define RUN_STR(name, field)                                                  \
	COHORT__CLI_SET(name, 0, COHORT__CLI_STR, struct run_cfg, field)

static const struct cohort__cli_opt run_opts[] = {
	RUN_INT("nproc-per-node", 'n', 1, RUN_MAX_LOCAL, nproc),
	COHORT__CLI_DO("nnodes", RUN_NNODES, COHORT__CLI_ACT_ARG),
	RUN_INT("node-rank", 0, 0, 65535, node_rank),
	RUN_INT("max-restarts", 0, 0, 1000000, max_restarts),
	RUN_INT("grace", 0, 0, 3600000, grace_ms),
	COHORT__CLI_DO("coordinator", RUN_COORDINATOR, COHORT__CLI_ACT_ARG),
	RUN_STR("job", job),
	RUN_STR("token-file", token_file),
	RUN_STR("token", token_cli),
	RUN_STR("report", report),
	RUN_STR("timeline", timeline),
	RUN_STR("bind", bind),
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

	cpu_set_t cpus;
	char why[256];
	int e;

	*cfg = (struct run_cfg) { .nproc = 0,
		.nnodes = 1,
		.grace_ms = 5000,
		.bind = cohort__knob_str(COHORT__KNOB_BIND) };
	if (run_pet_defaults(cfg) != 0)
		return (2);
	while ((opt = cohort__cli_next(&run_cli, cfg, argc, argv)) != -1) {
		if (opt == RUN_TORCH_STORE && strrchr(optarg, ':') == NULL)
			opt = cohort__cli_bad(
			    &run_cli, opt, optarg, "(HOST:PORT)");
		if (opt == RUN_NNODES && !run_parse_nnodes(optarg, cfg))
			opt = cohort__cli_bad(&run_cli, opt, optarg,
			    "(N or MIN:MAX, 1 to 65536)");
		if (opt == RUN_NNODES) {
			/* parsed */
		} else if (opt == RUN_COORDINATOR) {
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
		fprintf(stderr,
		    "cohort run: --node-rank %d >= --nnodes %d%s\n",
		    cfg->node_rank, cfg->nnodes,
		    cfg->min_nodes > 0 ? " (the maximum)" : "");
		return (2);
	}
	if (cfg->nnodes > 1 && cfg->coordinator == NULL) {
		fprintf(stderr,
		    "cohort run: --nnodes > 1 needs --coordinator "
		    "(every node must dial the same cohortd; under Kubeflow "
		    "PET_MASTER_ADDR and PET_MASTER_PORT give it)\n");
		return (2);
	}
	e = cohort__launch_cpus(
	    cfg->bind, 0, cfg->nproc, &cpus, why, sizeof(why));
	if (e != 0 && e != ENOENT) {
		fprintf(stderr, "cohort run: --bind: %s\n", why);
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

/* Starts the worker of rank (local_rank) into *p; 0, or -1 said. */
static int
run_spawn(const struct run_cfg *cfg, const char *url, const char *job,
    int rank, int local_rank, int restart, struct cohort__proc *p)
{
	enum { NVARS = 27 };
	const char *vars[NVARS];
	char buf[4096], store[3][320], err[512], range[2][40];
	struct cohort__proc_spec spec;
	cpu_set_t cpus;
	cohort_env e;
	char **envp;
	size_t k;
	int nv, rv;

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
	if ((nv = cohort_env_vars(&e, buf, sizeof(buf), vars, NVARS - 6)) < 0)
		return (-1);
	k = (size_t)nv;
	if (cfg->min_nodes > 0) {
		/* elastic: the world asked for is the maximum */
		snprintf(range[0], sizeof(range[0]), "COHORT_MIN_WORLD=%d",
		    cfg->min_nodes * cfg->nproc);
		snprintf(range[1], sizeof(range[1]), "COHORT_MAX_WORLD=%d",
		    cfg->nnodes * cfg->nproc);
		vars[k++] = range[0];
		vars[k++] = range[1];
	}
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
	if ((envp = cohort__launch_env(vars, k)) == NULL) {
		fprintf(stderr, "cohort run: out of memory\n");
		return (-1);
	}
	cohort__proc_spec_init(&spec);
	spec.path = cfg->argv[0];
	spec.argv = cfg->argv;
	spec.envp = envp;
	spec.death_sig = SIGKILL;
	/* checked by run_parse: a slot of cores, or none */
	if (cohort__launch_cpus(
	        cfg->bind, local_rank, cfg->nproc, &cpus, err, sizeof(err))
	    == 0)
		spec.cpus = &cpus;
	rv = cohort__proc_start(p, &spec, err, sizeof(err));
	free(envp);
	if (rv != 0) {
		fprintf(stderr, "cohort run: %s\n", err);
		return (-1);
	}
	return (0);
}

/* A worker's end in a report: "killed by signal 15" is told apart when
 * the signal was cohort run's own (the worker had not stopped by itself
 * within the grace period after the failure). */
static const char *
run_describe_worker(const struct cohort__proc *p, const struct run_cfg *cfg,
    char *buf, size_t len)
{
	if (p->stopped && WIFSIGNALED(p->status)
	    && WTERMSIG(p->status) == p->sent_sig)
		snprintf(buf, len,
		    "stopped by cohort run (%s): still running %.1f s after "
		    "the first failure (--grace)",
		    p->sent_sig == SIGKILL ? "SIGKILL" : "SIGTERM",
		    (double)cfg->grace_ms / 1000.0);
	else
		cohort__launch_describe(p->status, buf, len);
	return (buf);
}

/* While the attempt's rendezvous has not completed, a view a second:
 * the one that shows it pending says who is missing if it never does. */
static void
run_poll(struct run_state *rs, int64_t now)
{
	struct cohort__run_view v;

	if (rs->formed || rs->link == NULL || now < rs->next_poll)
		return;
	cohort__run_view_get(rs->link, 500, &v);
	if (v.have && v.generation > rs->base_gen)
		rs->formed = true;
	else if (v.have && v.rdzv) {
		rs->rdzv = v;
		rs->rdzv_at = now;
	}
	rs->next_poll = cohort__now_ms() + 1000;
}

/* Several nodes: worker i of ours ended with a failure; the other nodes'
 * launchers read how (cohort__run_exit_fetch) for their reports. */
static void
run_publish_exit(const struct run_cfg *cfg, struct run_state *rs, int restart,
    int i, const struct cohort__proc *p)
{
	struct cohort__run_exit e;
	cohort_status st;

	if (cfg->nnodes < 2 || rs->link == NULL || !rs->publish)
		return;
	memset(&e, 0, sizeof(e));
	e.rank = RUN_RANK(cfg, i);
	e.exit_code = cohort__launch_code(p->status);
	e.signal = WIFSIGNALED(p->status) ? WTERMSIG(p->status) : 0;
	e.stop_sig = p->stopped ? p->sent_sig : 0;
	e.node = cfg->node_rank;
	cohort__strlcpy(e.host, rs->host, sizeof(e.host));
	st = cohort__run_exit_publish(rs->link, restart, &e, 1000);
	if (st != COHORT_OK) {
		cohort__debug("exit record of rank %d: %s: %s", e.rank,
		    cohort_status_name(st), cohort_last_error());
		/* unreachable: the rest would wait their timeout too */
		rs->publish = st != COHORT_ENOCOORD;
	}
}

/* How worker i of ours ended, as every node says it. */
static void
run_local_how(const struct run_cfg *cfg, const struct run_state *rs,
    const struct cohort__proc *p, int i, struct run_failure *f)
{
	char desc[200];

	run_describe_worker(&p[i], cfg, desc, sizeof(desc));
	if (cfg->nnodes > 1)
		snprintf(f->how, sizeof(f->how), "%s, on node %d (%s)", desc,
		    cfg->node_rank, rs->host);
	else
		cohort__strlcpy(f->how, desc, sizeof(f->how));
	f->exit_code = cohort__launch_code(p[i].status);
	f->signal = WIFSIGNALED(p[i].status) ? WTERMSIG(p[i].status) : 0;
}

/* The root cause of a failed attempt: cohortd's view of the job (its
 * first failed rank, that rank's text and operation), how that rank
 * ended (our worker, or the record its node's launcher published), or a
 * rendezvous that never completed, or cohortd itself. */
static void
run_find_cause(const struct run_cfg *cfg, struct run_state *rs, int restart,
    const struct cohort__proc *p, struct run_failure *f)
{
	struct cohort__run_view v;
	int64_t join_ms
	    = cohort__knob_int_or(COHORT__KNOB_JOIN_TIMEOUT_MS, 1800000);
	double secs;
	bool stale;
	int r;

	f->rank = RUN_RANK(cfg, f->first_local);
	run_local_how(cfg, rs, p, f->first_local, f);
	if (rs->link == NULL)
		return;
	cohort__run_view_get(rs->link, 2000, &v);
	if (v.unreachable[0] != '\0') {
		f->cause = RUN_CAUSE_COORDINATOR;
		cohort__strlcpy(f->coord_unreachable, v.unreachable,
		    sizeof(f->coord_unreachable));
		return;
	}
	/* No generation later than the previous attempt's: this attempt
	 * never formed one, and the failure cohortd holds is the old one. */
	/* an elastic job that cohortd holds failed fell below its minimum
	 * (a loss above it only moves the job to its next generation) */
	f->below_min
	    = cfg->min_nodes > 0 && v.have && strcmp(v.state, "failed") == 0;
	stale = !v.have || v.generation <= rs->base_gen;
	if (v.have && v.generation > rs->base_gen)
		rs->base_gen = v.generation;
	secs = (double)(f->at_ms - rs->started) / 1000.0;
	if (stale
	    && (rs->rdzv.rdzv || (join_ms > 0 && secs * 1000 >= join_ms))) {
		f->cause = RUN_CAUSE_RENDEZVOUS;
		f->rank = -1;
		if (rs->rdzv.rdzv) {
			secs = (double)rs->rdzv.rdzv_waiting_ms / 1000.0
			    + (double)(f->at_ms - rs->rdzv_at) / 1000.0;
			cohort__strlcpy(f->missing, rs->rdzv.rdzv_missing,
			    sizeof(f->missing));
			snprintf(f->rdzv, sizeof(f->rdzv),
			    "%s after %.1f s: %d of %d ranks joined; missing "
			    "rank%s %s",
			    join_ms > 0 && secs * 1000 >= (double)join_ms * 0.9
			        ? "timed out"
			        : "did not complete",
			    secs, rs->rdzv.rdzv_joined, rs->rdzv.rdzv_world,
			    strchr(f->missing, ',') != NULL ? "s" : "",
			    f->missing);
		} else {
			snprintf(f->rdzv, sizeof(f->rdzv),
			    "did not complete after %.1f s: no rank joined",
			    secs);
		}
		return;
	}
	if (stale || v.failed_rank < 0)
		return; /* cohortd knows nothing of it: our first failure */
	r = v.failed_rank;
	f->rank = r;
	cohort__strlcpy(f->text, v.failed_text, sizeof(f->text));
	cohort__strlcpy(f->last_op, v.last_op, sizeof(f->last_op));
	f->last_op_seq = v.last_op_seq;
	cohort__strlcpy(
	    f->failure_kind, v.failure_kind, sizeof(f->failure_kind));
	cohort__strlcpy(f->host, v.host, sizeof(f->host));
	f->pid = v.pid;
	if (r >= RUN_RANK(cfg, 0) && r < RUN_RANK(cfg, cfg->nproc)) {
		run_local_how(cfg, rs, p, r - RUN_RANK(cfg, 0), f);
	} else {
		/* another node's: its launcher publishes how it ended (it
		 * may first have to stop it: --grace, then 3 s) */
		struct cohort__run_exit e;
		char desc[256];
		int node = r / cfg->nproc;
		cohort_status st = cohort__run_exit_fetch(
		    rs->link, restart, r, cfg->grace_ms + 8000, &e);

		if (st == COHORT_OK) {
			cohort__strlcpy(f->how,
			    cohort__run_exit_describe(&e, desc, sizeof(desc)),
			    sizeof(f->how));
			f->exit_code = e.exit_code;
			f->signal = e.signal;
		} else {
			snprintf(f->how, sizeof(f->how),
			    "ended, on node %d (%s:%u), how is unknown: its "
			    "launcher did not say within %.1f s (%s)",
			    node, v.host[0] ? v.host : "?", v.pid,
			    (double)(cfg->grace_ms + 8000) / 1000.0,
			    cohort_status_name(st));
		}
	}
}

static void
run_report(const struct run_cfg *cfg, const char *job,
    const struct run_failure *f, const struct cohort__proc *p, int nw,
    int64_t last_stop_ms, int restarts)
{
	static const char *const kinds[]
	    = { "rank", "coordinator", "rendezvous" };
	char desc[200], first[256];

	snprintf(first, sizeof(first), "rank %d %s",
	    RUN_RANK(cfg, f->first_local),
	    run_describe_worker(&p[f->first_local], cfg, desc, sizeof(desc)));
	fprintf(stderr, "\ncohort run: job '%s' failed%s\n", job,
	    restarts < cfg->max_restarts ? " (this attempt)" : "");
	if (f->cause == RUN_CAUSE_COORDINATOR)
		fprintf(stderr,
		    "  root cause : the coordinator at %s is unreachable: "
		    "cohort run cannot reach it either (%s); workers stop "
		    "when it stays away past their reconnect window "
		    "(COHORT_RECONNECT_MS)\n"
		    "  first exit : %s\n",
		    cfg->coordinator != NULL ? cfg->coordinator : "(embedded)",
		    f->coord_unreachable, first);
	else if (f->cause == RUN_CAUSE_RENDEZVOUS)
		fprintf(stderr,
		    "  root cause : the rendezvous of job '%s' (attempt %d) "
		    "%s\n"
		    "  first exit : %s\n",
		    job, restarts, f->rdzv, first);
	else
		fprintf(
		    stderr, "  root cause : rank %d %s\n", f->rank, f->how);
	fprintf(stderr,
	    "  error text : %s\n"
	    "  operation  : %s%s",
	    f->text[0] ? f->text : "(none reported)",
	    f->last_op[0] ? f->last_op : "(unknown)",
	    f->last_op[0] ? "" : "\n");
	if (f->last_op[0])
		fprintf(stderr, " (#%" PRIu64 ")\n", f->last_op_seq);
	if (f->failure_kind[0] != '\0')
		fprintf(stderr, "  failure    : %s, on %s:%u\n",
		    f->failure_kind, f->host[0] ? f->host : "?", f->pid);
	if (cfg->min_nodes > 0) {
		if (f->below_min)
			fprintf(stderr,
			    "  elastic    : the job fell below its minimum of "
			    "%d ranks (--nnodes %d:%d) and stopped\n",
			    cfg->min_nodes * cfg->nproc, cfg->min_nodes,
			    cfg->nnodes);
		else
			fprintf(stderr,
			    "  elastic    : the job went on without this "
			    "node's worker (--nnodes %d:%d); %d worker "
			    "failure%s here, %d restart%s\n",
			    cfg->min_nodes, cfg->nnodes, f->survived,
			    f->survived == 1 ? "" : "s", f->restarts,
			    f->restarts == 1 ? "" : "s");
	}
	fprintf(stderr,
	    "  stopped in : %.3f s (failure to last worker stopping)\n"
	    "  restarts   : %d of %d used\n",
	    (double)(last_stop_ms - f->at_ms) / 1000.0,
	    cfg->min_nodes > 0 ? f->restarts : restarts, cfg->max_restarts);
	for (int i = 0; i < nw; i++)
		fprintf(stderr, "  rank %-5d : %s\n", RUN_RANK(cfg, i),
		    run_describe_worker(&p[i], cfg, desc, sizeof(desc)));

	if (cfg->report != NULL) {
		FILE *out = fopen(cfg->report, "w");
		if (out == NULL) {
			fprintf(stderr, "cohort run: cannot write %s: %s\n",
			    cfg->report, strerror(errno));
			return;
		}
		fprintf(out, "{\"job\":");
		cohort__json_str(out, job);
		fprintf(out, ",\"node_rank\":%d,\"nnodes\":%d", cfg->node_rank,
		    cfg->nnodes);
		if (f->coord_unreachable[0] != '\0') {
			fprintf(out, ",\"coordinator_unreachable\":");
			cohort__json_str(out, f->coord_unreachable);
		}
		fprintf(out,
		    ",\"root_cause\":{\"rank\":%d,\"exit_code\":%d,"
		    "\"signal\":%d,\"how\":",
		    f->rank, f->cause == RUN_CAUSE_RANK ? f->exit_code : 0,
		    f->cause == RUN_CAUSE_RANK ? f->signal : 0);
		cohort__json_str(
		    out, f->cause == RUN_CAUSE_RANK ? f->how : "");
		fprintf(out, ",\"error_text\":");
		cohort__json_str(out, f->text);
		fprintf(out, ",\"operation\":");
		cohort__json_str(out, f->last_op);
		if (f->cause == RUN_CAUSE_RENDEZVOUS) {
			fprintf(out, ",\"rendezvous\":");
			cohort__json_str(out, f->rdzv);
			fprintf(out, ",\"missing_ranks\":[%s]", f->missing);
		}
		fprintf(out, ",\"failure\":");
		cohort__json_str(out, f->failure_kind);
		fprintf(out, ",\"host\":");
		cohort__json_str(out, f->host);
		fprintf(out,
		    ",\"pid\":%u,\"operation_seq\":%" PRIu64
		    ",\"kind\":\"%s\"}",
		    f->pid, f->last_op_seq, kinds[f->cause]);
		if (cfg->min_nodes > 0)
			fprintf(out,
			    ",\"elastic\":{\"min_nodes\":%d,\"max_nodes\":%d,"
			    "\"below_minimum\":%s,\"worker_failures\":%d}",
			    cfg->min_nodes, cfg->nnodes,
			    f->below_min ? "true" : "false", f->survived);
		fprintf(out,
		    ",\"stop_seconds\":%.3f,\"restarts\":%d,"
		    "\"max_restarts\":%d,\"workers\":[",
		    (double)(last_stop_ms - f->at_ms) / 1000.0,
		    cfg->min_nodes > 0 ? f->restarts : restarts,
		    cfg->max_restarts);
		for (int i = 0; i < nw; i++) {
			int st = p[i].status;
			fprintf(out,
			    "%s{\"rank\":%d,\"exit_code\":%d,"
			    "\"signal\":%d}",
			    i ? "," : "", RUN_RANK(cfg, i),
			    WIFEXITED(st) ? WEXITSTATUS(st) : -1,
			    WIFSIGNALED(st) ? WTERMSIG(st) : 0);
		}
		fprintf(out, "]}\n");
		fclose(out);
	}
}

/* An elastic job's worker k of ours ended: a failure does not stop the
 * others (they go on in a new generation); with restarts left (*used of
 * --max-restarts on this node) it is started again and rejoins the
 * running job as a new member. A worker that stopped because the job
 * fell below its minimum (COHORT_EXIT_PEER_LOST) is not restarted. The
 * first worker that stays down is this node's failure (*f). */
static void
run_elastic_reaped(const struct run_cfg *cfg, struct run_state *rs,
    struct cohort__proc *p, int *wr, int *used, int k, int64_t now,
    struct run_failure *f)
{
	int code = cohort__launch_code(p[k].status), rank = RUN_RANK(cfg, k);
	bool peer = code == COHORT_EXIT_PEER_LOST;
	char desc[200];

	if (!cohort__proc_failed(&p[k]))
		return;
	run_publish_exit(cfg, rs, wr[k], k, &p[k]);
	run_describe_worker(&p[k], cfg, desc, sizeof(desc));
	if (!peer)
		f->survived++;
	if (!peer && run_signal == 0 && *used < cfg->max_restarts) {
		(*used)++;
		wr[k]++;
		f->restarts = *used;
		fprintf(stderr,
		    "cohort run: rank %d %s; restarting it (%d of %d): it "
		    "rejoins the running job\n",
		    rank, desc, *used, cfg->max_restarts);
		if (run_spawn(cfg, rs->url, rs->job, rank, k, wr[k], &p[k])
		    == 0)
			return;
	}
	fprintf(stderr, "cohort run: rank %d %s; %s\n", rank, desc,
	    peer ? "it stopped with the job"
	         : "the job goes on without it (elastic)");
	if (!f->have) {
		f->have = true;
		f->first_local = k;
		f->at_ms = now;
	}
}

/* Runs one generation of the group. Returns 0 when every worker exited 0,
 * else fills *f with the root cause. An elastic job has one generation
 * here (run_elastic_reaped restarts its workers one by one). */
static int
run_generation(const struct run_cfg *cfg, struct run_state *rs, int restart,
    struct run_failure *f, int *exit_code)
{
	struct cohort__proc *p;
	struct cohort__launch l;
	int nw = cfg->nproc, k, used = 0;
	int64_t last_stop = 0;
	int forwarded = 0;
	int rc = 0, *wr;

	if ((p = calloc((size_t)nw, sizeof(*p))) == NULL)
		return (-1);
	if ((wr = calloc((size_t)nw, sizeof(*wr))) == NULL) {
		free(p);
		return (-1);
	}
	memset(f, 0, sizeof(*f));
	/* after a failure: --grace, then SIGTERM, then 3 s, then SIGKILL */
	cohort__launch_init(&l, p, nw, cfg->grace_ms, 3000);
	l.independent = cfg->min_nodes > 0;
	rs->formed = false;
	rs->publish = true;
	memset(&rs->rdzv, 0, sizeof(rs->rdzv));
	rs->started = run_now_ms();
	rs->next_poll = rs->started + 250;
	for (int i = 0; i < nw; i++) {
		if (run_spawn(cfg, rs->url, rs->job, RUN_RANK(cfg, i), i,
		        restart, &p[i])
		    != 0) {
			cohort__launch_kill_all(&l);
			free(p);
			free(wr);
			*exit_code = 127;
			return (-1);
		}
	}
	cohort__info("started %d workers of job '%s' (restart %d)", nw,
	    rs->job, restart);

	while (cohort__launch_alive(&l) > 0) {
		int64_t now = run_now_ms();

		while ((k = cohort__launch_reap(&l, now)) >= 0) {
			last_stop = now;
			if (cfg->min_nodes > 0) {
				run_elastic_reaped(
				    cfg, rs, p, wr, &used, k, now, f);
				continue;
			}
			if (l.first_failed == k && !f->have) {
				/* our first failure */
				f->have = true;
				f->first_local = k;
				f->at_ms = now;
			}
			if (cohort__launch_code(p[k].status) != 0)
				run_publish_exit(cfg, rs, restart, k, &p[k]);
		}
		if (run_signal != 0 && forwarded != run_signal) {
			forwarded = run_signal;
			fprintf(stderr,
			    "cohort run: forwarding signal %d to "
			    "%d workers\n",
			    forwarded, cohort__launch_alive(&l));
			cohort__launch_signal(&l, forwarded);
			cohort__launch_stop_after(&l, now, cfg->grace_ms);
		}
		cohort__launch_tick(&l, now);
		run_poll(rs, now);
		usleep(2000);
	}
	if (f->have) {
		bool local = false;

		rc = 1;
		run_find_cause(cfg, rs, restart, p, f);
		*exit_code = f->exit_code != 0 ? f->exit_code : 1;
		/* cohortd names a rank of another node as the root cause:
		 * this node only lost a peer, whatever its own workers exited
		 * with (a Python trainer: 1; stopped after --grace: 143).
		 * deploy/k8s's podFailurePolicy does not count that against
		 * this node's retries (docs/kubernetes.md, "Exit codes"). */
		local = f->rank >= RUN_RANK(cfg, 0)
		    && f->rank < RUN_RANK(cfg, cfg->nproc);
		if (f->cause == RUN_CAUSE_RANK && !local)
			*exit_code = COHORT_EXIT_PEER_LOST;
		run_report(cfg, rs->job, f, p, nw, last_stop, restart);
	} else if (run_signal != 0) {
		rc = 1;
		*exit_code = 128 + run_signal;
	} else if (f->survived > 0) {
		fprintf(stderr,
		    "cohort run: job '%s' done on node %d; elastic: it lived "
		    "through %d worker failure%s here, %d restart%s\n",
		    rs->job, cfg->node_rank, f->survived,
		    f->survived == 1 ? "" : "s", f->restarts,
		    f->restarts == 1 ? "" : "s");
	}
	if (rc == 0 && run_signal == 0 && rs->link != NULL) {
		struct cohort__run_view v;
		cohort__run_view_get(rs->link, 1000, &v);
		if (v.have && v.generation > rs->base_gen)
			rs->base_gen = v.generation;
	}
	free(p);
	free(wr);
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
	struct run_state rs;
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
	memset(&rs, 0, sizeof(rs));
	rs.url = url;
	rs.job = job;
	rs.link = cohort__run_link_open(url, job, cfg.token);
	if (gethostname(rs.host, sizeof(rs.host) - 1) != 0)
		cohort__strlcpy(rs.host, "?", sizeof(rs.host));
	for (int restart = 0;; restart++) {
		rc = run_generation(&cfg, &rs, restart, &f, &exit_code);
		if (rc != 0 && f.have && nmarks < RUN_MARKS) {
			struct cohort__timeline_mark *m = &marks[nmarks++];
			m->name = "failure";
			m->ts_us = cohort__timeline_now_us();
			if (f.cause == RUN_CAUSE_RANK)
				snprintf(m->detail, sizeof(m->detail),
				    "rank %d %.200s: %.280s", f.rank, f.how,
				    f.text);
			else
				snprintf(m->detail, sizeof(m->detail),
				    "%.500s",
				    f.cause == RUN_CAUSE_RENDEZVOUS
				        ? f.rdzv
				        : f.coord_unreachable);
		}
		if (rc == 0 || run_signal != 0 || rc < 0 || cfg.min_nodes > 0)
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
	if (cfg.timeline != NULL) {
		struct cohort__timeline_job tj = { .path = cfg.timeline,
			.world = cfg.nproc * cfg.nnodes,
			.nnodes = cfg.nnodes,
			.node_rank = cfg.node_rank,
			.url = url,
			.job = job,
			.token = cfg.token,
			.wait_ms = cfg.grace_ms + 60000 };
		(void)cohort__timeline_finish(&tj, marks, nmarks);
	}
	cohort__run_link_close(rs.link);
	if (srv != NULL && cfg.coordinator_from_launcher)
		run_drain(srv);
	cohort__srv_stop(srv);
	return (rc == 0 ? 0 : exit_code);
}
