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
	    (unsigned)MAIN_DEFAULT_DRAIN_MS);
}

static int
main_u64(const char *opt, const char *s, uint64_t *out)
{
	int64_t v;

	if (!cohort__parse_i64(s, &v) || v <= 0) {
		fprintf(stderr,
		    "cohortd: %s: '%s' is not a positive integer\n", opt, s);
		return (-1);
	}
	*out = (uint64_t)v;
	return (0);
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

enum {
	MAIN_LISTEN = COHORT__CLI_LONG,
	MAIN_JOB,
	MAIN_ADMIN_TOKEN_FILE,
	MAIN_ADMIN_TOKEN,
	MAIN_JOB_EXPIRY,
	MAIN_TORCH_STORE,
	MAIN_TORCH_STORE_TIMEOUT,
	MAIN_METRICS_MAX_RANKS,
	MAIN_LOG_LEVEL,
	MAIN_DRAIN,
	MAIN_READY_FD,
	MAIN_EXIT_WHEN_IDLE,
	MAIN_VERSION,
	MAIN_FIELD, /* the options of main_fields from here */
};

/* Options that set one field of the server's configuration. */
static const struct main_field {
	const char *name;
	enum { MAIN_FLAG, MAIN_STR, MAIN_U64, MAIN_MS32 } kind;
	size_t off;
} main_fields[] = {
#define MAIN_F(name, kind, field)                                             \
	{                                                                     \
		name, kind, offsetof(struct cohort__srv_config, field)        \
	}
	MAIN_F("require-token", MAIN_FLAG, require_token),
	MAIN_F("open-status", MAIN_FLAG, open_status),
	MAIN_F("metrics-per-job", MAIN_FLAG, metrics_per_job),
	MAIN_F("tls-verify-clients", MAIN_FLAG, tls_verify_clients),
	MAIN_F("recover", MAIN_FLAG, state_recover),
	MAIN_F("tls-cert", MAIN_STR, tls_cert),
	MAIN_F("tls-key", MAIN_STR, tls_key),
	MAIN_F("tls-ca", MAIN_STR, tls_ca),
	MAIN_F("http", MAIN_STR, http),
	MAIN_F("state-dir", MAIN_STR, state_dir),
	MAIN_F("fsync", MAIN_STR, fsync),
	MAIN_F("max-value-bytes", MAIN_U64, max_value_bytes),
	MAIN_F("max-job-bytes", MAIN_U64, max_job_bytes),
	MAIN_F("max-keys", MAIN_U64, max_keys),
	MAIN_F("max-total-bytes", MAIN_U64, max_total_bytes),
	MAIN_F("max-total-keys", MAIN_U64, max_total_keys),
	MAIN_F("max-jobs", MAIN_U64, max_jobs),
	MAIN_F("max-members", MAIN_U64, max_members),
	MAIN_F("max-total-members", MAIN_U64, max_total_members),
	MAIN_F("stall-threshold", MAIN_MS32, stall_threshold_ms),
	MAIN_F("first-request-timeout", MAIN_MS32, first_request_ms),
	MAIN_F("idle-timeout", MAIN_MS32, idle_ms),
	MAIN_F("restore-grace", MAIN_MS32, restore_grace_ms),
#undef MAIN_F
};

#define MAIN_NFIELDS (sizeof(main_fields) / sizeof(main_fields[0]))

/* The others, then those of main_fields (main_parse adds them). */
#define MAIN_NOTHERS 14
static struct option main_options[MAIN_NOTHERS + MAIN_NFIELDS + 1] = {
	{ "listen", required_argument, NULL, MAIN_LISTEN },
	{ "job", required_argument, NULL, MAIN_JOB },
	{ "admin-token-file", required_argument, NULL, MAIN_ADMIN_TOKEN_FILE },
	{ "admin-token", required_argument, NULL, MAIN_ADMIN_TOKEN },
	{ "job-expiry", required_argument, NULL, MAIN_JOB_EXPIRY },
	{ "torch-store", required_argument, NULL, MAIN_TORCH_STORE },
	{ "torch-store-timeout", required_argument, NULL,
	    MAIN_TORCH_STORE_TIMEOUT },
	{ "metrics-max-ranks", required_argument, NULL,
	    MAIN_METRICS_MAX_RANKS },
	{ "log-level", required_argument, NULL, MAIN_LOG_LEVEL },
	{ "drain", required_argument, NULL, MAIN_DRAIN },
	{ "ready-fd", required_argument, NULL, MAIN_READY_FD },
	{ "exit-when-idle", required_argument, NULL, MAIN_EXIT_WHEN_IDLE },
	{ "version", no_argument, NULL, MAIN_VERSION },
	{ "help", no_argument, NULL, 'h' },
};

static const struct cohort__cli main_cli
    = { "cohortd", "h", main_options, main_usage };

/* What the command line sets besides the server's configuration. */
struct main_args {
	struct cohort__srv_config *cfg;
	const char **listen, **jobs, **tstores;
	char **job_specs;
	char *admin;
	const char *admin_file;
	int ready_fd;
	uint64_t idle_exit_ms;
	/* UINT64_MAX: the default, MAIN_DEFAULT_DRAIN_MS with --http (a
	 * readiness probe to drain for), else none */
	uint64_t drain_ms;
};

/* A value up to max (ms), at least 1: "--OPT: 1 to MAX ms" otherwise. */
static int
main_u32(const char *opt, const char *s, uint32_t *out)
{
	uint64_t v;

	if (main_u64(opt, s, &v) != 0)
		return (-1);
	if (v > UINT32_MAX) {
		fprintf(stderr, "cohortd: %s: 1 to %u ms\n", opt, UINT32_MAX);
		return (-1);
	}
	*out = (uint32_t)v;
	return (0);
}

static int
main_field(
    struct cohort__srv_config *cfg, const struct main_field *f, const char *v)
{
	char name[64];
	void *p = (char *)cfg + f->off;

	snprintf(name, sizeof(name), "--%s", f->name);
	switch (f->kind) {
	case MAIN_FLAG:
		*(bool *)p = true;
		return (0);
	case MAIN_STR:
		*(const char **)p = v;
		return (0);
	case MAIN_U64:
		return (main_u64(name, v, p));
	default:
		return (main_u32(name, v, p));
	}
}

/* A list option (--listen, --job, --torch-store): at most MAIN_MAX_LIST. */
static int
main_list(const char *opt, const char **list, size_t *n, const char *v)
{
	if (*n >= MAIN_MAX_LIST) {
		fprintf(
		    stderr, "cohortd: --%s: at most %d\n", opt, MAIN_MAX_LIST);
		return (-1);
	}
	list[(*n)++] = v;
	return (0);
}

/* One option: 0, 1 for "exit 0" (--help, --version), -1 for a bad one
 * (said). */
static int
main_option(struct main_args *a, int opt, const char *v)
{
	struct cohort__srv_config *cfg = a->cfg;
	uint64_t n;
	int l;

	if (opt >= MAIN_FIELD && opt < MAIN_FIELD + (int)MAIN_NFIELDS)
		return (main_field(cfg, &main_fields[opt - MAIN_FIELD], v));
	switch (opt) {
	case 'h':
		main_usage(stdout);
		return (1);
	case MAIN_VERSION:
		printf("cohortd %s (protocol %d)\n", COHORT_VERSION_STRING,
		    COHORT_PROTO_VERSION);
		return (1);
	case MAIN_LISTEN:
		return (main_list("listen", a->listen, &cfg->nlisten, v));
	case MAIN_TORCH_STORE:
		return (main_list(
		    "torch-store", a->tstores, &cfg->ntorch_stores, v));
	case MAIN_JOB:
		if (main_list("job", a->jobs, &cfg->njobs, v) != 0
		    || main_job(v, &a->job_specs[cfg->njobs - 1]) != 0)
			return (-1);
		if (a->job_specs[cfg->njobs - 1] != NULL)
			a->jobs[cfg->njobs - 1] = a->job_specs[cfg->njobs - 1];
		return (0);
	case MAIN_ADMIN_TOKEN_FILE:
		a->admin_file = v;
		return (0);
	case MAIN_ADMIN_TOKEN:
		cohort__warn("--admin-token shows the secret to every "
		             "user of this host (ps); use "
		             "--admin-token-file");
		free(a->admin);
		return ((a->admin = strdup(v)) != NULL ? 0 : -1);
	case MAIN_JOB_EXPIRY:
		if (strcmp(v, "never") == 0) {
			cfg->job_expiry_ms = 0;
			return (0);
		}
		return (main_u64("--job-expiry", v, &cfg->job_expiry_ms));
	case MAIN_TORCH_STORE_TIMEOUT:
		if (main_u64("--torch-store-timeout", v, &n) != 0)
			return (-1);
		cfg->torch_store_partial_ms
		    = n > UINT32_MAX ? UINT32_MAX : (uint32_t)n;
		return (0);
	case MAIN_METRICS_MAX_RANKS:
		n = 0;
		if (strcmp(v, "0") != 0
		    && main_u64("--metrics-max-ranks", v, &n) != 0)
			return (-1);
		if (n > 1000000) {
			fprintf(stderr,
			    "cohortd: --metrics-max-ranks: at most 1000000\n");
			return (-1);
		}
		cfg->metrics_max_ranks = (uint32_t)n;
		return (0);
	case MAIN_DRAIN:
		return (main_u64("--drain", v, &a->drain_ms));
	case MAIN_READY_FD:
		if (main_u64("--ready-fd", v, &n) != 0 || n > INT32_MAX)
			return (-1);
		a->ready_fd = (int)n;
		return (0);
	case MAIN_EXIT_WHEN_IDLE:
		return (main_u64("--exit-when-idle", v, &a->idle_exit_ms));
	case MAIN_LOG_LEVEL:
		if ((l = main_level(v)) < 0) {
			fprintf(stderr, "cohortd: bad log level '%s'\n", v);
			return (-1);
		}
		if (cohort__knob_str(COHORT__KNOB_LOG_LEVEL) == NULL)
			cohort__log_set_default_level(l);
		return (0);
	default: /* '?': said */
		return (-1);
	}
}

/* The command line: 0 to start, -1 to exit 0 (--help, --version), else
 * the exit status. */
static int
main_parse(int argc, char **argv, struct main_args *a)
{
	size_t n = 0;
	int opt, rc;

	while (main_options[n].name != NULL)
		n++;
	for (size_t i = 0; i < MAIN_NFIELDS; i++, n++) {
		main_options[n].name = main_fields[i].name;
		main_options[n].has_arg = main_fields[i].kind == MAIN_FLAG
		    ? no_argument
		    : required_argument;
		main_options[n].val = MAIN_FIELD + (int)i;
	}
	while ((opt = cohort__cli_next(&main_cli, argc, argv)) != -1)
		if ((rc = main_option(a, opt, optarg)) != 0)
			return (rc > 0 ? -1 : 2);
	if (cohort__cli_no_operands(&main_cli, argc, argv) != 0)
		return (2);
	if (a->cfg->state_recover && a->cfg->state_dir == NULL) {
		fprintf(stderr, "cohortd: --recover needs --state-dir\n");
		return (2);
	}
	return (0);
}

int
main(int argc, char **argv)
{
	const char *listen[MAIN_MAX_LIST], *jobs[MAIN_MAX_LIST];
	const char *tstores[MAIN_MAX_LIST];
	char *job_specs[MAIN_MAX_LIST] = { NULL };
	struct cohort__srv_config cfg;
	struct main_args a = { &cfg, listen, jobs, tstores, job_specs, NULL,
		NULL, -1, 0, UINT64_MAX };
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
	cohort__srv_config_init(&cfg);
	cfg.listen = listen;
	cfg.jobs = jobs;
	cfg.torch_stores = tstores;
	cohort__log_set_default_level(COHORT__LOG_INFO);
	cohort__log_set_component("cohortd");
	if ((rc = main_parse(argc, argv, &a)) != 0)
		return (rc < 0 ? 0 : rc);
	if (a.drain_ms == UINT64_MAX)
		a.drain_ms = cfg.http != NULL ? MAIN_DEFAULT_DRAIN_MS : 0;
	if (a.admin_file == NULL && a.admin == NULL)
		a.admin_file = cohort__knob_str(COHORT__KNOB_ADMIN_TOKEN_FILE);
	if (a.admin_file != NULL
	    && main_secret("--admin-token-file", a.admin_file, &a.admin) != 0)
		return (2);
	cfg.admin_token = a.admin;
	if (cfg.require_token && a.admin == NULL)
		cohort__warn("--require-token without an admin secret: only "
		             "jobs given with --job (or restored from "
		             "--state-dir) can be joined");

	sigemptyset(&set);
	sigaddset(&set, SIGTERM);
	sigaddset(&set, SIGINT);
	pthread_sigmask(SIG_BLOCK, &set, NULL);
	signal(SIGPIPE, SIG_IGN);

	if ((rv = cohort__srv_start(&cfg, &srv)) != COHORT_OK) {
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
	for (size_t i = 0; i < cfg.njobs; i++)
		free(job_specs[i]);
	free(a.admin);
	return (0);
}
