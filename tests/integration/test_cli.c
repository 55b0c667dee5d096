/*
 * test_cli.c - the command lines of cohortd and of every `cohort`
 * subcommand: one error style (common/cli.h). An unknown option or a
 * missing value names the option and shows the usage, and the exit
 * status is 2; --help prints the command's usage and exits 0; a bad
 * value names the option and the value.
 *
 * One table, one loop test per row: each row runs the built binary and
 * checks its exit status and the texts its output must hold.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"

#define CLI_MAX_ARGS 12
#define CLI_MAX_WANT 3

struct cli_case {
	const char *bin; /* "cohortd" or "cohort" */
	const char *args[CLI_MAX_ARGS]; /* NULL-terminated */
	int rc;
	const char *want[CLI_MAX_WANT]; /* texts of the output */
	const char * not ; /* a text the output must not hold (or NULL) */
};

static const struct cli_case cli_cases[] = {
	/* unknown options */
	{ "cohortd", { "--bogus" }, 2,
	    { "cohortd: unknown option '--bogus'", "usage: cohortd" }, NULL },
	{ "cohort", { "run", "--bogus", "-n", "2", "true" }, 2,
	    { "cohort run: unknown option '--bogus'", "usage: cohort run" },
	    "needs a value" },
	{ "cohort", { "run", "-x", "true" }, 2,
	    { "cohort run: unknown option '-x'", "usage: cohort run" }, NULL },
	{ "cohort", { "status", "--bogus" }, 2,
	    { "cohort status: unknown option '--bogus'",
	        "usage: cohort status" },
	    NULL },
	{ "cohort", { "top", "--bogus" }, 2,
	    { "cohort status: unknown option '--bogus'",
	        "usage: cohort status" },
	    NULL },
	{ "cohort", { "fault", "--bogus", "rank=1,at=op:1,action=stop" }, 2,
	    { "cohort fault: unknown option '--bogus'",
	        "usage: cohort fault" },
	    NULL },
	{ "cohort", { "token", "--bogus", "job" }, 2,
	    { "cohort token: unknown option '--bogus'",
	        "usage: cohort token" },
	    NULL },
	{ "cohort", { "env", "--bogus" }, 2,
	    { "cohort env: unknown option '--bogus'", "usage: cohort env" },
	    NULL },
	{ "cohort", { "bench", "--bogus" }, 2,
	    { "cohort bench: unknown option '--bogus'",
	        "usage: cohort bench" },
	    NULL },
	/* missing values */
	{ "cohortd", { "--listen" }, 2,
	    { "cohortd: option '--listen' needs a value", "usage: cohortd" },
	    NULL },
	{ "cohort", { "run", "-n" }, 2,
	    { "cohort run: option '-n' needs a value", "usage: cohort run" },
	    NULL },
	{ "cohort", { "run", "-n", "2", "--job" }, 2,
	    { "cohort run: option '--job' needs a value",
	        "usage: cohort run" },
	    NULL },
	{ "cohort", { "status", "--coordinator" }, 2,
	    { "cohort status: option '--coordinator' needs a value",
	        "usage: cohort status" },
	    NULL },
	{ "cohort", { "fault", "rank=1,at=op:1,action=stop", "--job" }, 2,
	    { "cohort fault: option '--job' needs a value",
	        "usage: cohort fault" },
	    NULL },
	{ "cohort", { "token", "--admin-token-file" }, 2,
	    { "cohort token: option '--admin-token-file' needs a value",
	        "usage: cohort token" },
	    NULL },
	{ "cohort", { "bench", "--op" }, 2,
	    { "cohort bench: option '--op' needs a value",
	        "usage: cohort bench" },
	    NULL },
	/* a flag given a value, an operand where none is taken */
	{ "cohortd", { "--recover=yes" }, 2,
	    { "cohortd: option '--recover' takes no value" }, NULL },
	{ "cohortd", { "stray" }, 2,
	    { "cohortd: unexpected argument 'stray'", "usage: cohortd" },
	    NULL },
	{ "cohort", { "status", "stray" }, 2,
	    { "cohort status: unexpected argument 'stray'" }, NULL },
	/* bad values name the option and the value, without the usage */
	{ "cohort", { "run", "-n", "0", "true" }, 2,
	    { "cohort run: bad value for --nproc-per-node: '0' (1 to 1024)" },
	    "usage:" },
	{ "cohort", { "run", "-n", "2", "--grace", "soon", "true" }, 2,
	    { "cohort run: bad value for --grace: 'soon'" }, NULL },
	{ "cohort", { "bench", "--dtype", "f128" }, 2,
	    { "cohort bench: bad value for --dtype: 'f128'" }, NULL },
	{ "cohort", { "status", "--watch", "5" }, 2,
	    { "cohort status: bad value for --watch: '5'" }, NULL },
	{ "cohortd", { "--max-keys", "0" }, 2,
	    { "cohortd: bad value for --max-keys: '0' (1 or more)" }, NULL },
	{ "cohortd", { "--stall-threshold", "99999999999" }, 2,
	    { "cohortd: bad value for --stall-threshold: '99999999999' (1 "
	      "to 4294967295)" },
	    NULL },
	{ "cohortd", { "--job-expiry", "soon" }, 2,
	    { "cohortd: bad value for --job-expiry: 'soon' (MS|never)" },
	    NULL },
	{ "cohort", { "bench", "-n", "0" }, 2,
	    { "cohort bench: bad value for -n: '0' (1 to 16384)" }, NULL },
	/* what options still require */
	{ "cohort", { "run", "-n", "2" }, 2,
	    { "cohort run: no program given", "usage: cohort run" }, NULL },
	{ "cohort", { "run", "true" }, 2, { "cohort run: -n N is required" },
	    NULL },
	{ "cohortd", { "--recover" }, 2,
	    { "cohortd: --recover needs --state-dir" }, NULL },
	/* --help: the command's own usage, exit 0 */
	{ "cohortd", { "--help" }, 0, { "usage: cohortd", "--state-dir" },
	    NULL },
	{ "cohortd", { "-h" }, 0, { "usage: cohortd" }, NULL },
	{ "cohortd", { "--version" }, 0, { "cohortd " }, NULL },
	{ "cohort", { "--help" }, 0, { "usage: cohort COMMAND" }, NULL },
	{ "cohort", { "run", "--help" }, 0,
	    { "usage: cohort run", "--max-restarts" }, NULL },
	{ "cohort", { "run", "-h" }, 0, { "usage: cohort run" }, NULL },
	{ "cohort", { "status", "--help" }, 0,
	    { "usage: cohort status", "--watch" }, NULL },
	{ "cohort", { "top", "--help" }, 0, { "usage: cohort status" }, NULL },
	{ "cohort", { "fault", "--help" }, 0,
	    { "usage: cohort fault", "SCHEDULE" }, NULL },
	{ "cohort", { "token", "--help" }, 0,
	    { "usage: cohort token", "--admin-token-file" }, NULL },
	{ "cohort", { "env", "--help" }, 0,
	    { "usage: cohort env", "--markdown" }, NULL },
	{ "cohort", { "bench", "--help" }, 0,
	    { "usage: cohort bench", "--sizes" }, NULL },
	/* a --sizes list, each size with its own counts, in one process */
	{ "cohort",
	    { "bench", "-n", "2", "--backend", "tcp", "--sizes", "4K,64K",
	        "--iters", "3,2", "--warmup", "1,0", "--json" },
	    0, { "\"size\":4096", "\"size\":65536,", "\"iters\":2," },
	    "wrong\":1" },
	{ "cohort", { "bench", "--sizes", "4K,64K", "--iters", "3,2,1" }, 2,
	    { "one per size of a --sizes list (2 sizes)" }, NULL },
	{ "cohort", { "bench", "--sizes", "4K,,64K" }, 2, { "--sizes" },
	    NULL },
	/* the program's own options are its own (options end there) */
	{ "cohort", { "run", "-n", "1", "sh", "-c", "echo ran $0", "--bogus" },
	    0, { "ran --bogus" }, "unknown option" },
	{ "cohort", { "run", "-n", "1", "--", "sh", "-c", "echo ok" }, 0,
	    { "ok" }, NULL },
};

#define CLI_NCASES ((int)(sizeof(cli_cases) / sizeof(cli_cases[0])))

START_TEST(test_cli_case)
{
	const struct cli_case *tc = &cli_cases[_i];
	char *argv[CLI_MAX_ARGS + 2], out[512], line[512];
	size_t off = 0;
	int n = 0, st;
	char *o;
	pid_t p;

	argv[n++] = (char *)th_bin(tc->bin);
	line[0] = '\0';
	off += (size_t)snprintf(line, sizeof(line), "%s", tc->bin);
	for (int i = 0; i < CLI_MAX_ARGS && tc->args[i] != NULL; i++) {
		argv[n++] = (char *)tc->args[i];
		if (off < sizeof(line))
			off += (size_t)snprintf(line + off, sizeof(line) - off,
			    " %s", tc->args[i]);
	}
	argv[n] = NULL;
	snprintf(out, sizeof(out), "%s/cli-%d.out", th_tmpdir(), _i);
	p = th_spawn(argv, NULL, out);
	if (!th_wait(p, 30000, &st)) {
		th_kill(p);
		ck_abort_msg("%s: hung", line);
	}
	o = th_read_file(out);
	ck_assert_ptr_nonnull(o);
	ck_assert_msg(th_exit_code(st) == tc->rc, "%s: exit %d, want %d: %s",
	    line, th_exit_code(st), tc->rc, o);
	for (int i = 0; i < CLI_MAX_WANT && tc->want[i] != NULL; i++)
		ck_assert_msg(strstr(o, tc->want[i]) != NULL,
		    "%s: no '%s' in: %s", line, tc->want[i], o);
	if (tc->not != NULL)
		ck_assert_msg(strstr(o, tc->not ) == NULL, "%s: '%s' in: %s",
		    line, tc->not, o);
	free(o);
}
END_TEST

Suite *
suite_cli(void)
{
	Suite *s = suite_create("cli");
	TCase *tc = tcase_create("cli");

	tcase_set_timeout(tc, 60);
	tcase_add_loop_test(tc, test_cli_case, 0, CLI_NCASES);
	suite_add_tcase(s, tc);
	return (s);
}
