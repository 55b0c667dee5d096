/*
 * cli.h - the options of cohort's programs (cohortd and every `cohort`
 * subcommand): one table per program, read with getopt_long, and one
 * error style. An unknown option or a missing value is told as "NAME:
 * unknown option '--x'" or "NAME: option '--x' needs a value", followed
 * by the usage, and a bad value as "NAME: bad value for --x: 'v' (1 to
 * 9)"; the exit status is then 2. -h and --help print the usage on stdout
 * (exit 0).
 *
 * A row of the table either sets a field of the program's settings
 * (FLAG, STR, INT, U32, U64: checked, stored, never seen by the program)
 * or is acted on by the program (ACT, ACT_ARG: returned by
 * cohort__cli_next with the value in optarg):
 *
 *	while ((opt = cohort__cli_next(&cli, &cfg, argc, argv)) != -1)
 *		switch (opt) {
 *		case 'h': return (0);      (usage printed)
 *		case '?': return (2);      (what is wrong printed)
 *		case RUN_TORCH_STORE: ...
 *		}
 *	operands: argv[optind .. argc)
 */
#ifndef COHORT_COMMON_CLI_H
#define COHORT_COMMON_CLI_H

#include <getopt.h> /* optarg, optind */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdio.h>

/* Keys of ACT options without a short form start here. */
#define COHORT__CLI_LONG 256

enum cohort__cli_kind {
	COHORT__CLI_ACT, /* returned to the program, no value */
	COHORT__CLI_ACT_ARG, /* returned to the program with its value */
	COHORT__CLI_FLAG, /* bool field = true */
	COHORT__CLI_STR, /* const char * field = the value */
	COHORT__CLI_INT, /* int field, value in [lo, hi] */
	COHORT__CLI_U32, /* uint32_t field, value in [lo, hi] */
	COHORT__CLI_U64, /* uint64_t field, value in [lo, hi] */
};

struct cohort__cli_opt {
	const char *name; /* --NAME; NULL: a short option only */
	/* -KEY (a letter), 0 for none; an ACT option without a letter has
	 * a key from COHORT__CLI_LONG up: it is what cohort__cli_next
	 * returns for it */
	int key;
	enum cohort__cli_kind kind;
	int64_t lo, hi; /* INT, U32, U64 */
	size_t off; /* the field's offset in the settings (not ACT) */
};

/* Rows. */
#define COHORT__CLI_DO(name, key, kind)                                       \
	{                                                                     \
		(name), (key), (kind), 0, 0, 0                                \
	}
#define COHORT__CLI_SET(name, key, kind, type, field)                         \
	{                                                                     \
		(name), (key), (kind), 0, 0, offsetof(type, field)            \
	}
#define COHORT__CLI_NUM(name, key, kind, lo, hi, type, field)                 \
	{                                                                     \
		(name), (key), (kind), (lo), (hi), offsetof(type, field)      \
	}
#define COHORT__CLI_END                                                       \
	{                                                                     \
		NULL, 0, COHORT__CLI_ACT, 0, 0, 0                             \
	}

struct cohort__cli {
	const char *name; /* "cohort run": the prefix of every message */
	/* '+': the options end at the first operand (a program and its
	 * arguments follow); '-': operands are returned as option 1 where
	 * they stand; 0: operands may stand anywhere */
	char order;
	const struct cohort__cli_opt *opts; /* ends with COHORT__CLI_END */
	void (*usage)(FILE *f);
};

/* The next option of argv (argv[0] is the program's or subcommand's
 * name; a new argv starts over) that the program acts on: its key, its
 * value in optarg; the options that set a field of cfg are stored on the
 * way. 'h' after printing the usage on stdout (-h, --help); '?' after
 * telling what is wrong on stderr; -1 after the last option (optind then
 * indexes the first operand). At most 63 rows. */
int cohort__cli_next(
    const struct cohort__cli *cli, void *cfg, int argc, char **argv);
/* A bad value of the option with key: "NAME: bad value for --OPT: 'VAL'
 * HINT" on stderr (hint may be NULL); returns '?'. */
int cohort__cli_bad(
    const struct cohort__cli *cli, int key, const char *val, const char *hint);
/* Operands where a program takes none: "NAME: unexpected argument 'X'"
 * and the usage on stderr, '?'; -1 when argv[optind..) is empty. */
int cohort__cli_no_operands(
    const struct cohort__cli *cli, int argc, char **argv);
/* s as an integer in [lo, hi]. */
bool cohort__cli_int(const char *s, int lo, int hi, int *out);

#endif /* COHORT_COMMON_CLI_H */
