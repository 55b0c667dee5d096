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
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

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

int
main(int argc, char **argv)
{
	const char *listen[MAIN_MAX_LIST], *jobs[MAIN_MAX_LIST];
	const char *tstores[MAIN_MAX_LIST];
	char *job_specs[MAIN_MAX_LIST] = { NULL }, *admin = NULL;
	const char *admin_file = NULL;
	struct cohort__srv_config cfg;
	struct cohort__srv *srv;
	sigset_t set;
	cohort_status rv;
	int sig = 0, ready_fd = -1;
	uint64_t idle_exit_ms = 0;
	/* UINT64_MAX: the default, MAIN_DEFAULT_DRAIN_MS with --http (a
	 * readiness probe to drain for), else none */
	uint64_t drain_ms = UINT64_MAX;

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
	for (int i = 1; i < argc; i++) {
		const char *a = argv[i];
		const char *v = i + 1 < argc ? argv[i + 1] : NULL;
		if (strcmp(a, "--help") == 0 || strcmp(a, "-h") == 0) {
			main_usage(stdout);
			return (0);
		}
		if (strcmp(a, "--version") == 0) {
			printf("cohortd %s (protocol %d)\n",
			    COHORT_VERSION_STRING, COHORT_PROTO_VERSION);
			return (0);
		}
		if (strcmp(a, "--tls-verify-clients") == 0) {
			cfg.tls_verify_clients = true;
			continue;
		}
		if (strcmp(a, "--require-token") == 0) {
			cfg.require_token = true;
			continue;
		}
		if (strcmp(a, "--recover") == 0) {
			cfg.state_recover = true;
			continue;
		}
		if (strcmp(a, "--open-status") == 0) {
			cfg.open_status = true;
			continue;
		}
		if (strcmp(a, "--metrics-per-job") == 0) {
			cfg.metrics_per_job = true;
			continue;
		}
		if (v == NULL) {
			fprintf(stderr,
			    "cohortd: unknown option or missing "
			    "value: %s\n",
			    a);
			main_usage(stderr);
			return (2);
		}
		i++;
		if (strcmp(a, "--listen") == 0
		    && cfg.nlisten < MAIN_MAX_LIST) {
			listen[cfg.nlisten++] = v;
		} else if (strcmp(a, "--job") == 0
		    && cfg.njobs < MAIN_MAX_LIST) {
			if (main_job(v, &job_specs[cfg.njobs]) != 0)
				return (2);
			jobs[cfg.njobs] = job_specs[cfg.njobs] != NULL
			    ? job_specs[cfg.njobs]
			    : v;
			cfg.njobs++;
		} else if (strcmp(a, "--admin-token-file") == 0) {
			admin_file = v;
		} else if (strcmp(a, "--admin-token") == 0) {
			cohort__warn("--admin-token shows the secret to every "
			             "user of this host (ps); use "
			             "--admin-token-file");
			free(admin);
			if ((admin = strdup(v)) == NULL)
				return (1);
		} else if (strcmp(a, "--tls-cert") == 0) {
			cfg.tls_cert = v;
		} else if (strcmp(a, "--tls-key") == 0) {
			cfg.tls_key = v;
		} else if (strcmp(a, "--tls-ca") == 0) {
			cfg.tls_ca = v;
		} else if (strcmp(a, "--max-value-bytes") == 0) {
			if (main_u64(a, v, &cfg.max_value_bytes) != 0)
				return (2);
		} else if (strcmp(a, "--max-job-bytes") == 0) {
			if (main_u64(a, v, &cfg.max_job_bytes) != 0)
				return (2);
		} else if (strcmp(a, "--max-keys") == 0) {
			if (main_u64(a, v, &cfg.max_keys) != 0)
				return (2);
		} else if (strcmp(a, "--max-total-bytes") == 0) {
			if (main_u64(a, v, &cfg.max_total_bytes) != 0)
				return (2);
		} else if (strcmp(a, "--max-total-keys") == 0) {
			if (main_u64(a, v, &cfg.max_total_keys) != 0)
				return (2);
		} else if (strcmp(a, "--max-jobs") == 0) {
			if (main_u64(a, v, &cfg.max_jobs) != 0)
				return (2);
		} else if (strcmp(a, "--max-members") == 0) {
			if (main_u64(a, v, &cfg.max_members) != 0)
				return (2);
		} else if (strcmp(a, "--max-total-members") == 0) {
			if (main_u64(a, v, &cfg.max_total_members) != 0)
				return (2);
		} else if (strcmp(a, "--job-expiry") == 0) {
			if (strcmp(v, "never") == 0)
				cfg.job_expiry_ms = 0;
			else if (main_u64(a, v, &cfg.job_expiry_ms) != 0)
				return (2);
		} else if (strcmp(a, "--http") == 0) {
			cfg.http = v;
		} else if (strcmp(a, "--torch-store") == 0
		    && cfg.ntorch_stores < MAIN_MAX_LIST) {
			tstores[cfg.ntorch_stores++] = v;
		} else if (strcmp(a, "--torch-store-timeout") == 0) {
			uint64_t ms;
			if (main_u64(a, v, &ms) != 0)
				return (2);
			cfg.torch_store_partial_ms
			    = ms > UINT32_MAX ? UINT32_MAX : (uint32_t)ms;
		} else if (strcmp(a, "--state-dir") == 0) {
			cfg.state_dir = v;
		} else if (strcmp(a, "--fsync") == 0) {
			cfg.fsync = v;
		} else if (strcmp(a, "--stall-threshold") == 0) {
			uint64_t ms;
			if (main_u64(a, v, &ms) != 0)
				return (2);
			if (ms > UINT32_MAX) {
				fprintf(stderr, "cohortd: %s: at most %u ms\n",
				    a, UINT32_MAX);
				return (2);
			}
			cfg.stall_threshold_ms = (uint32_t)ms;
		} else if (strcmp(a, "--first-request-timeout") == 0
		    || strcmp(a, "--idle-timeout") == 0) {
			uint64_t ms;
			if (main_u64(a, v, &ms) != 0)
				return (2);
			if (ms > UINT32_MAX) {
				fprintf(stderr, "cohortd: %s: at most %u ms\n",
				    a, UINT32_MAX);
				return (2);
			}
			if (a[2] == 'f')
				cfg.first_request_ms = (uint32_t)ms;
			else
				cfg.idle_ms = (uint32_t)ms;
		} else if (strcmp(a, "--metrics-max-ranks") == 0) {
			uint64_t n = 0;
			if (strcmp(v, "0") != 0 && main_u64(a, v, &n) != 0)
				return (2);
			if (n > 1000000) {
				fprintf(stderr,
				    "cohortd: %s: at most 1000000\n", a);
				return (2);
			}
			cfg.metrics_max_ranks = (uint32_t)n;
		} else if (strcmp(a, "--drain") == 0) {
			if (main_u64(a, v, &drain_ms) != 0)
				return (2);
		} else if (strcmp(a, "--restore-grace") == 0) {
			uint64_t ms;
			if (main_u64(a, v, &ms) != 0)
				return (2);
			if (ms == 0 || ms > UINT32_MAX) {
				fprintf(stderr, "cohortd: %s: 1 to %u ms\n", a,
				    UINT32_MAX);
				return (2);
			}
			cfg.restore_grace_ms = (uint32_t)ms;
		} else if (strcmp(a, "--ready-fd") == 0) {
			uint64_t fd;
			if (main_u64(a, v, &fd) != 0 || fd > INT32_MAX)
				return (2);
			ready_fd = (int)fd;
		} else if (strcmp(a, "--exit-when-idle") == 0) {
			if (main_u64(a, v, &idle_exit_ms) != 0)
				return (2);
		} else if (strcmp(a, "--log-level") == 0) {
			int l = main_level(v);
			if (l < 0) {
				fprintf(stderr,
				    "cohortd: bad log level '%s'\n", v);
				return (2);
			}
			if (cohort__knob_str(COHORT__KNOB_LOG_LEVEL) == NULL)
				cohort__log_set_default_level(l);
		} else {
			fprintf(stderr, "cohortd: unknown option %s\n", a);
			main_usage(stderr);
			return (2);
		}
	}

	if (cfg.state_recover && cfg.state_dir == NULL) {
		fprintf(stderr, "cohortd: --recover needs --state-dir\n");
		return (2);
	}
	if (drain_ms == UINT64_MAX)
		drain_ms = cfg.http != NULL ? MAIN_DEFAULT_DRAIN_MS : 0;
	if (admin_file == NULL && admin == NULL)
		admin_file = cohort__knob_str(COHORT__KNOB_ADMIN_TOKEN_FILE);
	if (admin_file != NULL
	    && main_secret("--admin-token-file", admin_file, &admin) != 0)
		return (2);
	cfg.admin_token = admin;
	if (cfg.require_token && admin == NULL)
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
	if (ready_fd >= 0) {
		/* The bound URL (port 0 resolved) for whoever started us. */
		char line[512];
		int n = snprintf(line, sizeof(line), "%s\n",
		    cohort__srv_url(srv, 0) != NULL ? cohort__srv_url(srv, 0)
		                                    : "");
		if (n > 0 && write(ready_fd, line, (size_t)n) != n)
			cohort__warn(
			    "--ready-fd %d: %s", ready_fd, strerror(errno));
		close(ready_fd);
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
		if (sig <= 0 && idle_exit_ms > 0
		    && cohort__srv_idle_ms(srv) >= idle_exit_ms) {
			cohort__info("no client for %llu ms, exiting",
			    (unsigned long long)idle_exit_ms);
			break;
		}
	}
	if (sig > 0 && drain_ms > 0) {
		cohort__time end = cohort__now_ms() + (cohort__time)drain_ms;

		/* the preStop drain: out of service first, then the stop
		 * (journalled state, final replies) */
		cohort__srv_drain(srv);
		cohort__info("%s received: draining for %llu ms (/readyz "
		             "answers 503; a second signal stops at once)",
		    sig == SIGINT ? "SIGINT" : "SIGTERM",
		    (unsigned long long)drain_ms);
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
	free(admin);
	return (0);
}
