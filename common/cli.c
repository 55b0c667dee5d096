/*
 * cli.c - reading a program's options (cli.h).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cohort_common.h"
#include "cli.h"

/* What went wrong with the option getopt_long just refused ('?' or ':'):
 * a long one is the argument it stepped over, a short one optopt. */
static void
cli_complain(const struct cohort__cli *cli, int opt, char **argv)
{
	const char *arg = argv[optind - 1];
	const char *why = opt == ':' ? "needs a value" : NULL;
	char name[128];

	if (arg[0] == '-' && arg[1] == '-') {
		size_t n = strcspn(arg, "=");
		snprintf(name, sizeof(name), "%.*s", (int)n, arg);
		if (opt == '?' && optopt != 0 && arg[n] == '=')
			why = "takes no value";
	} else {
		snprintf(name, sizeof(name), "-%c", optopt);
	}
	if (why != NULL)
		fprintf(stderr, "%s: option '%s' %s\n", cli->name, name, why);
	else
		fprintf(stderr, "%s: unknown option '%s'\n", cli->name, name);
	cli->usage(stderr);
}

int
cohort__cli_next(const struct cohort__cli *cli, int argc, char **argv)
{
	/* the argv being parsed; another one (or the end) starts over */
	static char **cur;
	char shortopts[64];
	const char *s = cli->shortopts;
	int opt;

	if (argv != cur) {
		cur = argv;
		optind = 0; /* glibc: reinitialise */
	}
	opterr = 0;
	/* ':' after the ordering flag: a missing value returns ':' */
	if (s[0] == '+' || s[0] == '-')
		snprintf(shortopts, sizeof(shortopts), "%c:%s", s[0], s + 1);
	else
		snprintf(shortopts, sizeof(shortopts), ":%s", s);
	opt = getopt_long(argc, argv, shortopts, cli->longopts, NULL);
	if (opt == -1 || opt == '?' || opt == ':')
		cur = NULL;
	if (opt != '?' && opt != ':')
		return (opt);
	cli_complain(cli, opt, argv);
	return ('?');
}

int
cohort__cli_bad(
    const struct cohort__cli *cli, int opt, const char *val, const char *hint)
{
	const struct option *o = cli->longopts;

	/* a short option by its letter, a long one by its name */
	while (o->name != NULL && (opt < COHORT__CLI_LONG || o->val != opt))
		o++;
	if (o->name != NULL)
		fprintf(stderr, "%s: bad value for --%s", cli->name, o->name);
	else
		fprintf(stderr, "%s: bad value for -%c", cli->name, opt);
	fprintf(stderr, ": '%s'%s%s\n", val, hint != NULL ? " " : "",
	    hint != NULL ? hint : "");
	return (2);
}

int
cohort__cli_no_operands(const struct cohort__cli *cli, int argc, char **argv)
{
	if (optind >= argc)
		return (0);
	fprintf(
	    stderr, "%s: unexpected argument '%s'\n", cli->name, argv[optind]);
	cli->usage(stderr);
	return (2);
}

bool
cohort__cli_int(const char *s, int lo, int hi, int *out)
{
	int64_t v;

	if (s == NULL || !cohort__parse_i64(s, &v) || v < lo || v > hi)
		return (false);
	*out = (int)v;
	return (true);
}

int
cohort__cli_intopt(const struct cohort__cli *cli,
    const struct cohort__cli_intopt *t, size_t n, void *cfg, int opt,
    const char *val)
{
	for (size_t k = 0; k < n; k++) {
		if (t[k].opt != opt)
			continue;
		if (!cohort__cli_int(val, t[k].lo, t[k].hi,
		        (int *)((char *)cfg + t[k].off)))
			return (cohort__cli_bad(cli, opt, val, NULL));
		return (1);
	}
	return (0);
}
