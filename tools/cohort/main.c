/*
 * main.c - the `cohort` command line: subcommand dispatch.
 *
 *   cohort run -n N [...] -- PROGRAM ARGS...   launcher (run.c)
 *   cohort status [--coordinator URL] [...]    jobs, ranks, pending ops
 *   cohort fault [--coordinator URL] [...] S   send a fault schedule
 *   cohort env                                 resolved environment
 *   cohort token JOB...                        a job's token (from the
 *                                              admin secret)
 *   cohort bench [...]                         collective benchmark
 *   cohort timeline merge OUT IN...            join the nodes' traces
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

#include "cli.h"
#include "cohort_impl.h"

int cohort__cmd_run(int argc, char **argv) __attribute__((weak));
int cohort__cmd_bench(int argc, char **argv) __attribute__((weak));
int cohort__cmd_status(int argc, char **argv) __attribute__((weak));
int cohort__cmd_top(int argc, char **argv) __attribute__((weak));
int cohort__cmd_fault(int argc, char **argv) __attribute__((weak));
int cohort__cmd_token(int argc, char **argv) __attribute__((weak));
int cohort__cmd_timeline(int argc, char **argv) __attribute__((weak));

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
	{ "top", cohort__cmd_top,
	    "live view of the jobs (status --watch 1000)" },
	{ "fault", cohort__cmd_fault,
	    "send a fault schedule to a running job (fault injection)" },
	{ "env", cli_env, "show the resolved rank/world/coordinator" },
	{ "token", cohort__cmd_token,
	    "print a job's token, minted from cohortd's admin secret" },
	{ "bench", cohort__cmd_bench, "collective benchmark" },
	{ "timeline", cohort__cmd_timeline,
	    "merge the nodes' --timeline files into one trace" },
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
	(void)argc;
	(void)argv;
	cli_usage(stdout);
	return (0);
}

static int
cli_version(int argc, char **argv)
{
	(void)argc;
	(void)argv;
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
	printf(
	    "timeouts (COHORT_TIMEOUT_SCALE applied to the liveness ones):\n"
	    "  heartbeat interval %8d ms  (COHORT_HEARTBEAT_MS)\n"
	    "  dead after         %8d ms  (COHORT_DEAD_AFTER_MS)\n"
	    "  operation timeout  %8d ms  (COHORT_TIMEOUT_MS)\n"
	    "  rendezvous timeout %8d ms  (COHORT_JOIN_TIMEOUT_MS; "
	    "default = operation)\n"
	    "  reconnect window   %8d ms  (COHORT_RECONNECT_MS; at most "
	    "operation)\n"
	    "  connect to a peer  %8d ms  (COHORT_CONNECT_TIMEOUT_MS)\n"
	    "  order: %s\n",
	    o.heartbeat_interval, o.dead_after, o.op_timeout,
	    o.join_timeout == COHORT_WAIT_DEFAULT ? o.op_timeout
	                                          : o.join_timeout,
	    cohort__reconnect_window(&o),
	    (int)cohort__knob_int_or(COHORT__KNOB_CONNECT_TIMEOUT_MS, 10000),
	    st == COHORT_OK ? "heartbeat < dead-after < operation <= "
	                      "rendezvous, reconnect <= operation: ok"
	                    : why);
	return (st == COHORT_OK ? 0 : 1);
}

static const char *
cli_knob_type(enum cohort__knob_type t)
{
	static const char *const names[] = { "text", "integer", "milliseconds",
		"bytes", "0 or 1", "number" };

	return (
	    (unsigned)t < sizeof(names) / sizeof(names[0]) ? names[t] : "?");
}

/* Every COHORT_* variable: the set ones with their value, the others with
 * their default (cohort env), or the whole table as the Markdown of
 * docs/environment.md (cohort env --markdown). */
static void
cli_env_knobs(bool markdown)
{
	const char *group = "";

	if (markdown)
		printf("# Environment variables\n\n"
		       "Every `COHORT_*` variable cohort's C library, cohortd "
		       "and the CLI read,\nfrom one table "
		       "(`common/knobs.h`); `cohort env` shows their values "
		       "here.\nGenerated by `cohort env --markdown`: do not "
		       "edit by hand (a test\ncompares). A launcher's own "
		       "variables (torchrun's `RANK`, `WORLD_SIZE`,\n"
		       "`MASTER_ADDR`, Open MPI's, MPICH's `PMI_*`, SLURM's, "
		       "`JOB_COMPLETION_INDEX`,\nKubeflow's `PET_*`) are "
		       "read too: see `docs/launchers.md`.\n");
	else
		printf("\nvariables (* = set here):\n");
	for (int k = 0; k < COHORT__KNOB_COUNT; k++) {
		const struct cohort__knob_info *in
		    = cohort__knob_info((enum cohort__knob)k);
		const char *v = cohort__knob_str((enum cohort__knob)k);

		if (strcmp(group, in->group) != 0) {
			group = in->group;
			if (markdown)
				printf("\n## %c%s\n\n| variable | type | "
				       "default | meaning |\n|---|---|---|---|"
				       "\n",
				    group[0] - ('a' - 'A'), group + 1);
		}
		if (markdown)
			printf("| `%s` | %s | %s%s%s | %s |\n", in->name,
			    cli_knob_type(in->type), in->dflt[0] ? "`" : "",
			    in->dflt[0] ? in->dflt : "(none)",
			    in->dflt[0] ? "`" : "", in->doc);
		else
			printf("  %c %-26s %s\n", v != NULL ? '*' : ' ',
			    in->name,
			    v == NULL ? in->dflt
			        : strstr(in->name, "TOKEN") != NULL
			        ? "(hidden)"
			        : v);
	}
	if (markdown)
		printf("\n## Python\n\n| variable | meaning |\n|---|---|\n"
		       "| `COHORT_LIBRARY` | the libcohort.so to load (only "
		       "that one) |\n"
		       "| `COHORT_PREFIX` | an installed prefix to look in "
		       "|\n"
		       "| `COHORT_COORDINATOR_LOG` | file for the log of the "
		       "coordinator rank 0 starts |\n");
}

struct cli_env_cfg {
	bool markdown;
};

static void
cli_env_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort env [--markdown]\n\nPrints the rank, world size, "
	    "coordinator and job a worker started here would use,\nwhich "
	    "variable each came from (docs/launchers.md), launcher "
	    "variables\nseen but not used and why (notes), and every "
	    "COHORT_* variable.\n--markdown prints the variables' table "
	    "(docs/environment.md).\n");
}

static int
cli_env(int argc, char **argv)
{
	static const struct cohort__cli_opt opts[] = {
		COHORT__CLI_SET("markdown", 0, COHORT__CLI_FLAG,
		    struct cli_env_cfg, markdown),
		COHORT__CLI_END,
	};
	static const struct cohort__cli cli
	    = { "cohort env", '+', opts, cli_env_usage };
	struct cli_env_cfg cfg = { false };
	cohort_env env;
	cohort_status st;
	char buf[2048];
	int opt;

	if ((opt = cohort__cli_next(&cli, &cfg, argc, argv)) != -1
	    || (opt = cohort__cli_no_operands(&cli, argc, argv)) != -1)
		return (opt == 'h' ? 0 : 2);
	if (cfg.markdown) {
		cli_env_knobs(true);
		return (0);
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
	st = cli_env_timeouts() == 0 ? COHORT_OK : COHORT_EINVAL;
	cli_env_knobs(false);
	return (st == COHORT_OK ? 0 : 1);
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
