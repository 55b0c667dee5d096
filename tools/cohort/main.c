/*
 * main.c - the `cohort` command line: subcommand dispatch.
 *
 *   cohort run -n N [...] -- PROGRAM ARGS...   launcher (run.c)
 *   cohort status [--coordinator URL] [...]    jobs, ranks, pending ops
 *   cohort fault [--coordinator URL] [...] S   send a fault schedule
 *   cohort env                                 resolved environment
 *   cohort bench [...]                         collective benchmark
 *   cohort version | help
 *
 * Each subcommand is `int cohort__cmd_NAME(int argc, char **argv)` (argv[0]
 * is the subcommand's name; the return value is the exit status), in its
 * own file under tools/cohort/. The table below refers to the ones that
 * live elsewhere through weak declarations, so a build without a
 * subcommand's file still links and reports it as unavailable.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "cohort_impl.h"

int cohort__cmd_run(int argc, char **argv) __attribute__((weak));
int cohort__cmd_bench(int argc, char **argv) __attribute__((weak));
int cohort__cmd_status(int argc, char **argv) __attribute__((weak));
int cohort__cmd_fault(int argc, char **argv) __attribute__((weak));

static int cli_env(int argc, char **argv);
static int cli_version(int argc, char **argv);
static int cli_help(int argc, char **argv);

struct cli_cmd {
	const char *name;
	int (*fn)(int argc, char **argv);
	const char *summary;
};

static const struct cli_cmd cli_cmds[] = {
	{ "run", cohort__cmd_run,
	    "launch N workers (torchrun-like), supervise, restart" },
	{ "status", cohort__cmd_status,
	    "show jobs, ranks, last seen and pending collectives" },
	{ "fault", cohort__cmd_fault,
	    "send a fault schedule to a running job (fault injection)" },
	{ "env", cli_env, "show the resolved rank/world/coordinator" },
	{ "bench", cohort__cmd_bench, "collective benchmark" },
	{ "version", cli_version, "print the version" },
	{ "help", cli_help, "this text" },
};

#define CLI_NCMDS (sizeof(cli_cmds) / sizeof(cli_cmds[0]))

static void
cli_usage(FILE *f)
{
	fprintf(f, "usage: cohort COMMAND [ARGS...]\n\ncommands:\n");
	for (size_t i = 0; i < CLI_NCMDS; i++)
		fprintf(f, "  %-8s %s%s\n", cli_cmds[i].name,
		    cli_cmds[i].summary,
		    cli_cmds[i].fn == NULL ? " (not in this build)" : "");
	fprintf(f, "\n'cohort COMMAND --help' describes a command.\n");
}

static int
cli_help(int argc, char **argv)
{
	(void) argc;
	(void) argv;
	cli_usage(stdout);
	return (0);
}

static int
cli_version(int argc, char **argv)
{
	(void) argc;
	(void) argv;
	printf("cohort %s (protocol %d)\n", COHORT_VERSION_STRING,
	    COHORT_PROTO_VERSION);
	return (0);
}

/* The timeout hierarchy a worker started here would use (docs/timeouts.md),
 * validated like cohort_client_open does. */
static int
cli_env_timeouts(void)
{
	cohort_options o;
	char why[256];
	cohort_status st;

	cohort_options_init(&o);
	if ((st = cohort__options_env_timeouts(&o)) != COHORT_OK) {
		fprintf(stderr, "cohort env: %s\n", cohort_last_error());
		return (1);
	}
	st = cohort__timeouts_check(&o, why, sizeof(why));
	printf("timeouts (COHORT_TIMEOUT_SCALE applied to the liveness ones):\n"
	       "  heartbeat interval %8d ms  (COHORT_HEARTBEAT_MS)\n"
	       "  dead after         %8d ms  (COHORT_DEAD_AFTER_MS)\n"
	       "  operation timeout  %8d ms  (COHORT_TIMEOUT_MS)\n"
	       "  rendezvous timeout %8d ms  (COHORT_JOIN_TIMEOUT_MS; "
	       "default = operation)\n"
	       "  order: %s\n",
	    o.heartbeat_interval, o.dead_after, o.op_timeout,
	    o.join_timeout == COHORT_WAIT_DEFAULT ? o.op_timeout :
						    o.join_timeout,
	    st == COHORT_OK ? "heartbeat < dead-after < operation <= "
			      "rendezvous: ok" :
			      why);
	return (st == COHORT_OK ? 0 : 1);
}

static int
cli_env(int argc, char **argv)
{
	cohort_env env;
	cohort_status st;
	char buf[2048];

	for (int i = 1; i < argc; i++) {
		if (strcmp(argv[i], "--help") == 0 ||
		    strcmp(argv[i], "-h") == 0) {
			printf("usage: cohort env\n\nPrints the rank, world "
			       "size, coordinator and job a worker started "
			       "here would use,\nand which variable each came "
			       "from.\n");
			return (0);
		}
		fprintf(stderr, "cohort env: unknown argument '%s'\n",
		    argv[i]);
		return (2);
	}
	/* the error is printed below; no log line repeating it */
	cohort__log_set_default_level(COHORT__LOG_ERROR);
	st = cohort_env_resolve(&env);
	if (st != COHORT_OK) {
		fprintf(stderr, "cohort env: %s: %s\n", cohort_strerror(st),
		    cohort_last_error());
		return (1);
	}
	cohort_env_format(&env, buf, sizeof(buf));
	fputs(buf, stdout);
	return (cli_env_timeouts());
}

int
main(int argc, char **argv)
{
	const char *name;

	if (argc < 2) {
		cli_usage(stderr);
		return (2);
	}
	name = argv[1];
	if (strcmp(name, "--help") == 0 || strcmp(name, "-h") == 0)
		name = "help";
	else if (strcmp(name, "--version") == 0)
		name = "version";
	for (size_t i = 0; i < CLI_NCMDS; i++) {
		if (strcmp(name, cli_cmds[i].name) != 0)
			continue;
		if (cli_cmds[i].fn == NULL) {
			fprintf(stderr,
			    "cohort: '%s' is not available in this build\n",
			    name);
			return (2);
		}
		return (cli_cmds[i].fn(argc - 1, argv + 1));
	}
	fprintf(stderr, "cohort: unknown command '%s'\n\n", argv[1]);
	cli_usage(stderr);
	return (2);
}
