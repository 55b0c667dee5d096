/*
 * cli.h - the options of cohort's programs (cohortd and every `cohort`
 * subcommand) read with getopt_long, with one error style: an unknown
 * option or a missing value is told as "NAME: unknown option '--x'" or
 * "NAME: option '--x' needs a value", followed by the usage, and the exit
 * status is 2.
 *
 * A program describes its options with a `struct cohort__cli` and reads
 * them with cohort__cli_next:
 *
 *	while ((opt = cohort__cli_next(&cli, argc, argv)) != -1)
 *		switch (opt) {
 *		case 'h': usage(stdout); return (0);
 *		case '?': return (2);      (message and usage printed)
 *		...
 *		}
 *	operands: argv[optind .. argc)
 */
#ifndef COHORT_COMMON_CLI_H
#define COHORT_COMMON_CLI_H

#include <getopt.h>
#include <stdbool.h>
#include <stddef.h>
#include <stdio.h>

/* Values of long options without a short form start here. */
#define COHORT__CLI_LONG 256

struct cohort__cli {
	const char *name; /* "cohort run": the prefix of every message */
	/* getopt's short options; '+' first: options stop at the first
	 * operand (a program and its arguments follow). Always with "h". */
	const char *shortopts;
	const struct option *longopts; /* ends with a zeroed entry */
	void (*usage)(FILE *f);
};

/* The next option of argv (argv[0] is the program's or subcommand's
 * name; a new argv starts over), as getopt_long gives it: its val, its
 * value in optarg; -1 after the last option, optind then indexes the
 * first operand. An unknown option or one without its value is told as
 * "NAME: unknown option '--x'" or "NAME: option '--x' needs a value",
 * followed by the usage, on stderr; '?' is returned (exit status 2). */
int cohort__cli_next(const struct cohort__cli *cli, int argc, char **argv);
/* A bad value of option opt (a value of cohort__cli_next): "NAME: bad
 * value for --OPT: 'VAL' HINT" on stderr (hint may be NULL); returns 2. */
int cohort__cli_bad(
    const struct cohort__cli *cli, int opt, const char *val, const char *hint);
/* Operands where a command takes none: "NAME: unexpected argument 'X'"
 * and the usage on stderr, returns 2; 0 when argv[optind..) is empty. */
int cohort__cli_no_operands(
    const struct cohort__cli *cli, int argc, char **argv);
/* s as an integer in [lo, hi]. */
bool cohort__cli_int(const char *s, int lo, int hi, int *out);

/* An option whose value is an int in [lo, hi], stored at offset off of
 * a command's settings (offsetof). */
struct cohort__cli_intopt {
	int opt;
	int lo, hi;
	size_t off;
};
/* If opt is one of the n options of t, stores val into cfg: 1, or 2 for
 * a bad value (said); 0 when opt is none of them. */
int cohort__cli_intopt(const struct cohort__cli *cli,
    const struct cohort__cli_intopt *t, size_t n, void *cfg, int opt,
    const char *val);

#endif /* COHORT_COMMON_CLI_H */
