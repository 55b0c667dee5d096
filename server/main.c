/*
 * main.c - cohortd: argument parsing, signals, and the embedded server.
 * The only file of the coordinator that may exit().
 *
 * SIGTERM and SIGINT are blocked in every thread (nng's threads inherit
 * the mask) and taken synchronously here with sigtimedwait, so a signal
 * never interrupts a callback; cohort__srv_stop then answers parked
 * requests with COHORT_ECLOSED and closes the listeners.
 */
#include <errno.h>
#ifdef __GLIBC__
#include <malloc.h>
#endif
#include <signal.h>
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cli.h"
#include "cohort_common.h"
#include "knobs.h"
#include "server.h"
#include "token.h"

#define MAIN_MAX_LIST 64
/* SIGTERM to exit with --http: /readyz says 503 this long first, a little
 * more than a readiness probe period (docs/kubernetes.md). */
#define MAIN_DEFAULT_DRAIN_MS 3000

static void
main_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohortd [options]\n"
	    "\n"
	    "The cohort coordinator: rendezvous, barriers, key-value store\n"
	    "and failure detection for data-parallel training jobs.\n"
	    "\n"
	    "  --listen URL           listen on URL (tcp://, ipc://; "
	    "repeatable)\n"
	    "                         default %s\n"
	    "  --job NAME:@FILE       create job NAME in advance, its token "
	    "read from\n"
	    "                         FILE (repeatable; NAME: for no token; "
	    "NAME:TOKEN\n"
	    "                         works but shows the token in ps: "
	    "deprecated)\n"
	    "  --admin-token-file FILE\n"
	    "                         the admin secret (default: "
	    "$COHORT_ADMIN_TOKEN_FILE):\n"
	    "                         required by status queries for all "
	    "jobs; job\n"
	    "                         tokens are minted from it (cohort "
	    "token JOB)\n"
	    "  --require-token        a join creates a job only with its "
	    "minted token\n"
	    "                         (jobs of --job keep their own); see "
	    "docs/security.md\n"
	    "  --open-status          without an admin secret, anyone may "
	    "list all jobs\n"
	    "                         (a private coordinator; default: "
	    "refused)\n"
	    "  --metrics-per-job      /metrics adds series labelled with "
	    "job names\n"
	    "  --tls-cert FILE        certificate chain (PEM) of the "
	    "tls+tcp:// "
	    "listeners\n"
	    "  --tls-key FILE         its private key (PEM)\n"
	    "  --tls-ca FILE          CA (PEM) that signs client "
	    "certificates\n"
	    "  --tls-verify-clients   refuse clients without a certificate "
	    "signed by\n"
	    "                         --tls-ca (docs/security.md)\n"
	    "  --max-value-bytes N    largest KV value / object (default "
	    "%u)\n"
	    "  --max-job-bytes N      keys + values per job (default %llu)\n"
	    "  --max-keys N           keys per job (default %u)\n"
	    "  --max-members N        world size of one job (default %u)\n"
	    "  --max-total-bytes N    keys + values of all jobs (default "
	    "%llu)\n"
	    "  --max-total-keys N     keys of all jobs (default %u)\n"
	    "  --max-total-members N  world sizes of all jobs (default %u)\n"
	    "  --max-jobs N           jobs held at once (default %u)\n"
	    "  --job-expiry MS|never  remove a job with no running member "
	    "and no\n"
	    "                         connected client after MS (default "
	    "%u)\n"
	    "  --http ADDR:PORT       serve /metrics, /healthz, /readyz\n"
	    "  --torch-store [JOB@]ADDR:PORT\n"
	    "                         speak torch's TCPStore protocol for job "
	    "JOB\n"
	    "                         (default torch-PORT; repeatable, one "
	    "job each)\n"
	    "  --torch-store-timeout MS\n"
	    "                         close a TCPStore connection whose "
	    "request stays\n"
	    "                         incomplete this long (default 30000)\n"
	    "  --state-dir DIR        journal jobs, members, keys and "
	    "replies in DIR;\n"
	    "                         a restart with it loses nothing\n"
	    "  --recover              with --state-dir: if the journal is "
	    "damaged, keep\n"
	    "                         every whole record, move the damaged "
	    "file aside\n"
	    "                         (NAME.damaged-TIME) and start (without "
	    "it cohortd\n"
	    "                         refuses to start on damage)\n"
	    "  --fsync MODE           batch (default: every 100 ms), "
	    "always, none\n"
	    "  --stall-threshold MS   log and show collectives waiting "
	    "longer (default %u)\n"
	    "  --first-request-timeout MS\n"
	    "                         close a connection that has not "
	    "completed a\n"
	    "                         request this long after connecting "
	    "(default %u)\n"
	    "  --idle-timeout MS      close a connection with no running "
	    "member and no\n"
	    "                         waiting request that sent nothing "
	    "complete this\n"
	    "                         long (default %u)\n"
	    "  --metrics-max-ranks N  (job, rank) pairs with per-rank series "
	    "on /metrics\n"
	    "                         (default 512; the least recently "
	    "updated is\n"
	    "                         evicted beyond it; 0: none)\n"
	    "  --log-level LEVEL      error, warn, info (default), debug, "
	    "trace\n"
	    "  --restore-grace MS     after a restart from --state-dir, how "
	    "long members\n"
	    "                         have to reconnect (default %u)\n"
	    "  --rdzv-last-call MS    an elastic job's first rendezvous "
	    "completes with\n"
	    "                         at least its minimum once no join came "
	    "this long\n"
	    "                         (default %u; torchrun's "
	    "last_call_timeout)\n"
	    "  --drain MS             on SIGTERM, answer /readyz 503 and "
	    "keep serving\n"
	    "                         this long before exiting (default "
	    "%u with\n"
	    "                         --http, else 0; a second signal ends "
	    "it at once)\n"
	    "  --ready-fd FD          once listening, write the first bound "
	    "URL and a\n"
	    "                         newline to FD and close it (for "
	    "launchers)\n"
	    "  --exit-when-idle MS    exit after MS without any client "
	    "connection\n"
	    "                         (a private coordinator that never "
	    "outlives its job)\n"
	    "  --help, --version\n",
	    COHORT__SRV_DEFAULT_URL, (unsigned)COHORT__DEFAULT_MAX_VALUE,
	    (unsigned long long)COHORT__SRV_DEFAULT_MAX_JOB_BYTES,
	    (unsigned)COHORT__SRV_DEFAULT_MAX_KEYS,
	    (unsigned)COHORT__SRV_DEFAULT_MAX_MEMBERS,
	    (unsigned long long)COHORT__SRV_DEFAULT_MAX_TOTAL_BYTES,
	    (unsigned)COHORT__SRV_DEFAULT_MAX_TOTAL_KEYS,
	    (unsigned)COHORT__SRV_DEFAULT_MAX_TOTAL_MEMBERS,
	    (unsigned)COHORT__SRV_DEFAULT_MAX_JOBS,
	    (unsigned)COHORT__SRV_DEFAULT_JOB_EXPIRY_MS,
	    (unsigned)COHORT__SRV_DEFAULT_STALL_MS,
	    (unsigned)COHORT__SRV_DEFAULT_FIRST_REQUEST_MS,
	    (unsigned)COHORT__SRV_DEFAULT_IDLE_MS,
	    (unsigned)COHORT__SRV_DEFAULT_RESTORE_GRACE_MS,
	    (unsigned)COHORT__SRV_DEFAULT_RDZV_LAST_CALL_MS,
	    (unsigned)MAIN_DEFAULT_DRAIN_MS);
}

/* Secrets never come from the command line (/proc/PID/cmdline is
 * readable by every user of the host): a file, named by an option or by
 * COHORT_ADMIN_TOKEN_FILE. The old forms still work, with a warning. */
static int
main_secret(const char *opt, const char *path, char **out)
{
	char buf[COHORT__TOKEN_MAX + 1];

	if (cohort__secret_read(opt, path, buf, sizeof(buf)) != COHORT_OK) {
		fprintf(stderr, "cohortd: %s\n", cohort_last_error());
		return (-1);
	}
	free(*out);
	*out = strdup(buf);
	memset(buf, 0, sizeof(buf));
	return (*out != NULL ? 0 : -1);
}

/* --job NAME:@FILE becomes NAME:TOKEN for the server (in memory only). */
static int
main_job(const char *spec, char **out)
{
	const char *colon = strchr(spec, ':');
	char buf[COHORT__TOKEN_MAX + 1];
	size_t nl, n;

	*out = NULL;
	if (colon == NULL || colon[1] != '@') {
		if (colon != NULL && colon[1] != '\0')
			cohort__warn("--job %.*s:TOKEN shows the token to "
			             "every user of this host (ps); use --job "
			             "%.*s:@FILE",
			    (int)(colon - spec), spec, (int)(colon - spec),
			    spec);
		return (0);
	}
	if (cohort__secret_read("--job", colon + 2, buf, sizeof(buf))
	    != COHORT_OK) {
		fprintf(stderr, "cohortd: %s\n", cohort_last_error());
		return (-1);
	}
	nl = (size_t)(colon - spec);
	n = nl + 1 + strlen(buf) + 1;
	if ((*out = malloc(n)) != NULL)
		snprintf(*out, n, "%.*s:%s", (int)nl, spec, buf);
	memset(buf, 0, sizeof(buf));
	return (*out != NULL ? 0 : -1);
}

static int
main_level(const char *s)
{
	static const char *const names[]
	    = { "error", "warn", "info", "debug", "trace" };

	for (int i = 0; i < 5; i++)
		if (strcmp(s, names[i]) == 0)
			return (i);
	return (-1);
}

/* What the command line sets: the server's configuration and the rest. */
struct main_args {
	struct cohort__srv_config cfg;
	const char *listen[MAIN_MAX_LIST], *jobs[MAIN_MAX_LIST];
	const char *tstores[MAIN_MAX_LIST];
	char *job_specs[MAIN_MAX_LIST];
	char *admin;
	const char *admin_file;
	int ready_fd;
	uint64_t idle_exit_ms;
	/* UINT64_MAX: the default, MAIN_DEFAULT_DRAIN_MS with --http (a
	 * readiness probe to drain for), else none */
	uint64_t drain_ms;
};

enum {
	MAIN_LISTEN = COHORT__CLI_LONG,
	MAIN_JOB,
	MAIN_ADMIN_TOKEN,
	MAIN_JOB_EXPIRY,
	MAIN_TORCH_STORE,
	MAIN_TORCH_STORE_TIMEOUT,
	MAIN_LOG_LEVEL,
	MAIN_VERSION,
};

#define MAIN_SET(name, kind, field)                                           \
	COHORT__CLI_SET(name, 0, kind, struct main_args, field)
#define MAIN_NUM(name, kind, lo, hi, field)                                   \
	COHORT__CLI_NUM(name, 0, kind, lo, hi, struct main_args, field)
#define MAIN_DO(name, key) COHORT__CLI_DO(name, key, COHORT__CLI_ACT_ARG)

static const struct cohort__cli_opt main_opts[] = {
	MAIN_DO("listen", MAIN_LISTEN),
	MAIN_DO("job", MAIN_JOB),
	MAIN_SET("admin-token-file", COHORT__CLI_STR, admin_file),
	MAIN_DO("admin-token", MAIN_ADMIN_TOKEN),
	MAIN_SET("require-token", COHORT__CLI_FLAG, cfg.require_token),
	MAIN_SET("open-status", COHORT__CLI_FLAG, cfg.open_status),
	MAIN_SET("metrics-per-job", COHORT__CLI_FLAG, cfg.metrics_per_job),
	MAIN_SET("tls-cert", COHORT__CLI_STR, cfg.tls_cert),
	MAIN_SET("tls-key", COHORT__CLI_STR, cfg.tls_key),
	MAIN_SET("tls-ca", COHORT__CLI_STR, cfg.tls_ca),
	MAIN_SET(
	    "tls-verify-clients", COHORT__CLI_FLAG, cfg.tls_verify_clients),
	MAIN_NUM("max-value-bytes", COHORT__CLI_U64, 1, INT64_MAX,
	    cfg.max_value_bytes),
	MAIN_NUM(
	    "max-job-bytes", COHORT__CLI_U64, 1, INT64_MAX, cfg.max_job_bytes),
	MAIN_NUM("max-keys", COHORT__CLI_U64, 1, INT64_MAX, cfg.max_keys),
	MAIN_NUM(
	    "max-members", COHORT__CLI_U64, 1, INT64_MAX, cfg.max_members),
	MAIN_NUM("max-total-bytes", COHORT__CLI_U64, 1, INT64_MAX,
	    cfg.max_total_bytes),
	MAIN_NUM("max-total-keys", COHORT__CLI_U64, 1, INT64_MAX,
	    cfg.max_total_keys),
	MAIN_NUM("max-total-members", COHORT__CLI_U64, 1, INT64_MAX,
	    cfg.max_total_members),
	MAIN_NUM("max-jobs", COHORT__CLI_U64, 1, INT64_MAX, cfg.max_jobs),
	MAIN_DO("job-expiry", MAIN_JOB_EXPIRY),
	MAIN_SET("http", COHORT__CLI_STR, cfg.http),
	MAIN_DO("torch-store", MAIN_TORCH_STORE),
	MAIN_DO("torch-store-timeout", MAIN_TORCH_STORE_TIMEOUT),
	MAIN_SET("state-dir", COHORT__CLI_STR, cfg.state_dir),
	MAIN_SET("recover", COHORT__CLI_FLAG, cfg.state_recover),
	MAIN_SET("fsync", COHORT__CLI_STR, cfg.fsync),
	MAIN_NUM("stall-threshold", COHORT__CLI_U32, 1, UINT32_MAX,
	    cfg.stall_threshold_ms),
	MAIN_NUM("first-request-timeout", COHORT__CLI_U32, 1, UINT32_MAX,
	    cfg.first_request_ms),
	MAIN_NUM("idle-timeout", COHORT__CLI_U32, 1, UINT32_MAX, cfg.idle_ms),
	MAIN_NUM("metrics-max-ranks", COHORT__CLI_U32, 0, 1000000,
	    cfg.metrics_max_ranks),
	MAIN_DO("log-level", MAIN_LOG_LEVEL),
	MAIN_NUM("restore-grace", COHORT__CLI_U32, 1, UINT32_MAX,
	    cfg.restore_grace_ms),
	MAIN_NUM("rdzv-last-call", COHORT__CLI_U32, 1, UINT32_MAX,
	    cfg.rdzv_last_call_ms),
	MAIN_NUM("drain", COHORT__CLI_U64, 1, INT64_MAX, drain_ms),
	MAIN_NUM("ready-fd", COHORT__CLI_INT, 1, INT32_MAX, ready_fd),
	MAIN_NUM(
	    "exit-when-idle", COHORT__CLI_U64, 1, INT64_MAX, idle_exit_ms),
	COHORT__CLI_DO("version", MAIN_VERSION, COHORT__CLI_ACT),
	COHORT__CLI_END,
};

static const struct cohort__cli main_cli
    = { "cohortd", 0, main_opts, main_usage };

/* A list option (--listen, --job, --torch-store): at most MAIN_MAX_LIST. */
static int
main_list(int key, const char **list, size_t *n, const char *v)
{
	if (*n >= MAIN_MAX_LIST)
		return (cohort__cli_bad(&main_cli, key, v, "(one too many)"));
	list[(*n)++] = v;
	return (0);
}

/* An option main_parse acts on: 0, 1 to exit 0 (--version), '?' for a
 * bad one (said). */
static int
main_option(struct main_args *a, int opt, const char *v)
{
	struct cohort__srv_config *cfg = &a->cfg;
	int64_t n;
	int l;

	switch (opt) {
	case MAIN_VERSION:
		printf("cohortd %s (protocol %d)\n", COHORT_VERSION_STRING,
		    COHORT_PROTO_VERSION);
		return (1);
	case MAIN_LISTEN:
		return (main_list(opt, a->listen, &cfg->nlisten, v));
	case MAIN_TORCH_STORE:
		return (main_list(opt, a->tstores, &cfg->ntorch_stores, v));
	case MAIN_JOB:
		if (main_list(opt, a->jobs, &cfg->njobs, v) != 0
		    || main_job(v, &a->job_specs[cfg->njobs - 1]) != 0)
			return ('?');
		if (a->job_specs[cfg->njobs - 1] != NULL)
			a->jobs[cfg->njobs - 1] = a->job_specs[cfg->njobs - 1];
		return (0);
	case MAIN_ADMIN_TOKEN:
		cohort__warn("--admin-token shows the secret to every "
		             "user of this host (ps); use "
		             "--admin-token-file");
		free(a->admin);
		return ((a->admin = strdup(v)) != NULL ? 0 : '?');
	case MAIN_JOB_EXPIRY:
		if (strcmp(v, "never") == 0)
			n = 0;
		else if (!cohort__parse_i64(v, &n) || n <= 0)
			return (
			    cohort__cli_bad(&main_cli, opt, v, "(MS|never)"));
		cfg->job_expiry_ms = (uint64_t)n;
		return (0);
	case MAIN_TORCH_STORE_TIMEOUT:
		/* more than 49 days: never */
		if (!cohort__parse_i64(v, &n) || n <= 0)
			return (cohort__cli_bad(&main_cli, opt, v, "(MS)"));
		cfg->torch_store_partial_ms
		    = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
		return (0);
	case MAIN_LOG_LEVEL:
		if ((l = main_level(v)) < 0)
			return (cohort__cli_bad(&main_cli, opt, v,
			    "(error, warn, info, debug, trace)"));
		if (cohort__knob_str(COHORT__KNOB_LOG_LEVEL) == NULL)
			cohort__log_set_default_level(l);
		return (0);
	default: /* 'h' (usage printed), '?' (said) */
		return (opt);
	}
}

/* The command line: 0 to start, -1 to exit 0 (--help, --version), else
 * the exit status. */
static int
main_parse(int argc, char **argv, struct main_args *a)
{
	int opt, rc;

	while ((opt = cohort__cli_next(&main_cli, a, argc, argv)) != -1)
		if ((rc = main_option(a, opt, optarg)) != 0)
			return (rc == 1 || rc == 'h' ? -1 : 2);
	if (cohort__cli_no_operands(&main_cli, argc, argv) != -1)
		return (2);
	if (a->cfg.state_recover && a->cfg.state_dir == NULL) {
		fprintf(stderr, "cohortd: --recover needs --state-dir\n");
		return (2);
	}
	return (0);
}

int
main(int argc, char **argv)
{
	static struct main_args a = { .ready_fd = -1, .drain_ms = UINT64_MAX };
	struct cohort__srv_config *cfg = &a.cfg;
	struct cohort__srv *srv;
	sigset_t set;
	cohort_status rv;
	int sig = 0, rc;

#ifdef __GLIBC__
	/* Values and messages of 1 MiB and more are mapped on their own and
	 * unmapped when freed: glibc's dynamic threshold would otherwise
	 * rise to 32 MiB after the first big free and keep later big
	 * values in its heaps (docs/coordinator.md, Memory). */
	(void)mallopt(M_MMAP_THRESHOLD, 1 << 20);
#endif
	cohort__srv_config_init(cfg);
	cfg->listen = a.listen;
	cfg->jobs = a.jobs;
	cfg->torch_stores = a.tstores;
	cohort__log_set_default_level(COHORT__LOG_INFO);
	cohort__log_set_component("cohortd");
	if ((rc = main_parse(argc, argv, &a)) != 0)
		return (rc < 0 ? 0 : rc);
	if (a.drain_ms == UINT64_MAX)
		a.drain_ms = cfg->http != NULL ? MAIN_DEFAULT_DRAIN_MS : 0;
	if (a.admin_file == NULL && a.admin == NULL)
		a.admin_file = cohort__knob_str(COHORT__KNOB_ADMIN_TOKEN_FILE);
	if (a.admin_file != NULL
	    && main_secret("--admin-token-file", a.admin_file, &a.admin) != 0)
		return (2);
	cfg->admin_token = a.admin;
	if (cfg->require_token && a.admin == NULL)
		cohort__warn("--require-token without an admin secret: only "
		             "jobs given with --job (or restored from "
		             "--state-dir) can be joined");

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((rv = cohort__srv_start(cfg, &srv)) != COHORT_OK) {
		cohort__error("cannot start: %s: %s", cohort_strerror(rv),
		    cohort_last_error());
		return (1);
	}
	for (size_t i = 0; cohort__srv_url(srv, i) != NULL; i++)
		cohort__info("listening on %s", cohort__srv_url(srv, i));
	if (cohort__srv_http_url(srv) != NULL)
		cohort__info("http on %s", cohort__srv_http_url(srv));
	if (a.ready_fd >= 0) {
		/* The bound URL (port 0 resolved) for whoever started us. */
		char line[512];
		int n = snprintf(line, sizeof(line), "%s\n",
		    cohort__srv_url(srv, 0) != NULL ? cohort__srv_url(srv, 0)
		                                    : "");
		if (n > 0 && write(a.ready_fd, line, (size_t)n) != n)
			cohort__warn(
			    "--ready-fd %d: %s", a.ready_fd, strerror(errno));
		close(a.ready_fd);
	}

	/* Runs until a signal; each wait is bounded so the loop stays
	 * responsive to anything added later. */
	while (sig <= 0) {
		struct timespec ts = { 1, 0 };
		sig = sigtimedwait(&set, NULL, &ts);
		if (sig < 0 && errno != EAGAIN && errno != EINTR) {
			cohort__error("sigtimedwait: %s", strerror(errno));
			break;
		}
		if (sig <= 0 && a.idle_exit_ms > 0
		    && cohort__srv_idle_ms(srv) >= a.idle_exit_ms) {
			cohort__info("no client for %llu ms, exiting",
			    (unsigned long long)a.idle_exit_ms);
			break;
		}
	}
	if (sig > 0 && a.drain_ms > 0) {
		cohort__time end = cohort__now_ms() + (cohort__time)a.drain_ms;

		/* the preStop drain: out of service first, then the stop
		 * (journalled state, final replies) */
		cohort__srv_drain(srv);
		cohort__info("%s received: draining for %llu ms (/readyz "
		             "answers 503; a second signal stops at once)",
		    sig == SIGINT ? "SIGINT" : "SIGTERM",
		    (unsigned long long)a.drain_ms);
		while (!cohort__expired(end)) {
			int ms = cohort__remaining(end);
			struct timespec ts
			    = { ms / 1000, (long)(ms % 1000) * 1000000L };
			if (sigtimedwait(&set, NULL, &ts) > 0) {
				cohort__info("second signal: stopping now");
				break;
			}
		}
	}
	if (sig > 0)
		cohort__info("%s received, shutting down",
		    sig == SIGINT ? "SIGINT" : "SIGTERM");
	cohort__srv_stop(srv);
	cohort__info("stopped");
	for (size_t i = 0; i < cfg->njobs; i++)
		free(a.job_specs[i]);
	free(a.admin);
	return (0);
}
