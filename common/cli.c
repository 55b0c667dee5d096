/*
 * cli.c - reading a program's options (cli.h).
 */
#include <getopt.h>
#include <stdio.h>
#include <string.h>

#include "cohort_common.h"
#include "cli.h"

#define CLI_MAX_OPTS 64
/* getopt_long's val of row i with a long name */
#define CLI_ROW 0x10000

/* The option as the messages name it: "--name", else "-k". */
static const char *
cli_optname(const struct cohort__cli_opt *o, char *buf, size_t len)
{
	if (o->name != NULL)
		snprintf(buf, len, "--%s", o->name);
	else
		snprintf(buf, len, "-%c", o->key);
	return (buf);
}

static bool
cli_has_arg(const struct cohort__cli_opt *o)
{
	return (o->kind != COHORT__CLI_ACT && o->kind != COHORT__CLI_FLAG);
}

/* What went wrong with the option getopt_long just refused ('?' or ':'):
 * a long one is the argument it stepped over, a short one optopt. */
static int
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
	return ('?');
}

static int
cli_bad(const struct cohort__cli *cli, const struct cohort__cli_opt *o,
    const char *val, const char *hint)
{
	char name[128];

	fprintf(stderr, "%s: bad value for %s: '%s'%s%s\n", cli->name,
	    cli_optname(o, name, sizeof(name)), val, hint != NULL ? " " : "",
	    hint != NULL ? hint : "");
	return ('?');
}

/* Stores the value of a field option: 0, or '?' after saying why. */
static int
cli_store(const struct cohort__cli *cli, const struct cohort__cli_opt *o,
    void *cfg, const char *val)
{
	void *p = (char *)cfg + o->off;
	char range[64];
	int64_t v = 0;

	switch (o->kind) {
	case COHORT__CLI_FLAG:
		*(bool *)p = true;
		return (0);
	case COHORT__CLI_STR:
		*(const char **)p = val;
		return (0);
	default:
		break;
	}
	if (!cohort__parse_i64(val, &v) || v < o->lo || v > o->hi) {
		if (o->hi == INT64_MAX)
			snprintf(range, sizeof(range), "(%lld or more)",
			    (long long)o->lo);
		else
			snprintf(range, sizeof(range), "(%lld to %lld)",
			    (long long)o->lo, (long long)o->hi);
		return (cli_bad(cli, o, val, range));
	}
	if (o->kind == COHORT__CLI_INT)
		*(int *)p = (int)v;
	else if (o->kind == COHORT__CLI_U32)
		*(uint32_t *)p = (uint32_t)v;
	else
		*(uint64_t *)p = (uint64_t)v;
	return (0);
}

int
cohort__cli_next(
    const struct cohort__cli *cli, void *cfg, int argc, char **argv)
{
	/* the argv being parsed; another one (or the end) starts over */
	static char **cur;
	struct option lo[CLI_MAX_OPTS + 2];
	char so[3 * CLI_MAX_OPTS + 8];
	size_t nl = 0, ns = 0;
	const struct cohort__cli_opt *o;
	int opt;

	if (argv != cur) {
		cur = argv;
		optind = 0; /* glibc: reinitialise */
	}
	opterr = 0;
	/* the ordering, then ':' so that a missing value returns ':' */
	if (cli->order != 0)
		so[ns++] = cli->order;
	so[ns++] = ':';
	so[ns++] = 'h';
	lo[nl++] = (struct option) { "help", no_argument, NULL, 'h' };
	for (o = cli->opts; o->name != NULL || o->key != 0; o++) {
		int i = (int)(o - cli->opts);
		COHORT__ASSERT(i < CLI_MAX_OPTS);
		if (o->key > 0 && o->key < COHORT__CLI_LONG) {
			so[ns++] = (char)o->key;
			if (cli_has_arg(o))
				so[ns++] = ':';
		}
		if (o->name != NULL)
			lo[nl++] = (struct option) { o->name,
				cli_has_arg(o) ? required_argument
				               : no_argument,
				NULL, CLI_ROW + i };
	}
	so[ns] = '\0';
	lo[nl] = (struct option) { NULL, 0, NULL, 0 };

	while ((opt = getopt_long(argc, argv, so, lo, NULL)) != -1) {
		if (opt == '?' || opt == ':') {
			cur = NULL;
			return (cli_complain(cli, opt, argv));
		}
		if (opt == 'h') {
			cur = NULL;
			cli->usage(stdout);
			return ('h');
		}
		if (opt == 1) /* an operand, in '-' order */
			return (1);
		if (opt >= CLI_ROW)
			o = &cli->opts[opt - CLI_ROW];
		else
			for (o = cli->opts; o->key != opt; o++)
				;
		if (o->kind == COHORT__CLI_ACT
		    || o->kind == COHORT__CLI_ACT_ARG)
			return (o->key);
		if (cli_store(cli, o, cfg, optarg) != 0) {
			cur = NULL;
			return ('?');
		}
	}
	cur = NULL;
	return (-1);
}

int
cohort__cli_bad(
    const struct cohort__cli *cli, int key, const char *val, const char *hint)
{
	const struct cohort__cli_opt *o = cli->opts;

	while (o->key != key && (o->name != NULL || o->key != 0))
		o++;
	COHORT__ASSERT(o->key == key);
	return (cli_bad(cli, o, val, hint));
}

int
cohort__cli_no_operands(const struct cohort__cli *cli, int argc, char **argv)
{
	if (optind >= argc)
		return (-1);
	fprintf(
	    stderr, "%s: unexpected argument '%s'\n", cli->name, argv[optind]);
	cli->usage(stderr);
	return ('?');
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
