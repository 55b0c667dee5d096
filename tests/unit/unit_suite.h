/*
 * unit_suite.h - a unit suite's test cases built from tables: each test
 * file lists its tests (a NULL-terminated array of the TTest pointers
 * START_TEST defines), its loop tests and its test cases instead of
 * repeating the Check calls that create, fill and attach every test case.
 * One test case: UNIT_SUITE or UNIT_FIXTURE_SUITE, or unit_suite_loops;
 * several: unit_suite_cases.
 */
#ifndef COHORT_UNIT_SUITE_H
#define COHORT_UNIT_SUITE_H

#include <check.h>

/* Adds test case `name` to s with every test of `tests` (NULL-terminated;
 * NULL: none) and returns it, for fixtures or loop tests. timeout_s 0 keeps
 * Check's default timeout. */
TCase *unit_tcase(
    Suite *s, const char *name, int timeout_s, const TTest *const *tests);

/* A loop test: run n times, _i = 0 .. n - 1. */
struct unit_loop {
	const TTest *test;
	int n;
};

/* unit_tcase, then every loop test of loops ({ NULL, 0 } ends it; NULL:
 * none). */
TCase *unit_tcase_loops(Suite *s, const char *name, int timeout_s,
    const TTest *const *tests, const struct unit_loop *loops);

/* A suite named `name` of one test case `tcase` (see unit_tcase_loops). */
Suite *unit_suite_loops(const char *name, const char *tcase, int timeout_s,
    const TTest *const *tests, const struct unit_loop *loops);

/* A test case of a suite built by unit_suite_cases: its tests (may be
 * NULL), loop tests (may be NULL) and checked fixture (NULLs: none). */
struct unit_case {
	const char *name;
	int timeout_s;
	const TTest *const *tests;
	const struct unit_loop *loops;
	SFun setup, teardown;
};

/* A suite named `name` of the test cases of cases ({ NULL } ends it). */
Suite *unit_suite_cases(const char *name, const struct unit_case *cases);

/* Defines Suite *suite_<name>(void) (declare it above, where
 * tools/gen_suites.sh finds it): one test case `tcase` of the tests
 * listed, timeout_s as in unit_tcase, with the checked fixture setup /
 * teardown (NULL: none). */
#define UNIT_FIXTURE_SUITE(name, tcase, timeout_s, setup, teardown, ...)      \
	Suite *suite_##name(void)                                             \
	{                                                                     \
		const TTest *tests_[] = { __VA_ARGS__, NULL };                \
		const struct unit_case cases_[] = {                           \
			{ tcase, timeout_s, tests_, NULL, setup, teardown },  \
			{ NULL, 0, NULL, NULL, NULL, NULL },                  \
		};                                                            \
                                                                              \
		return (unit_suite_cases(#name, cases_));                     \
	}

/* UNIT_FIXTURE_SUITE without a fixture. */
#define UNIT_SUITE(name, tcase, timeout_s, ...)                               \
	UNIT_FIXTURE_SUITE(name, tcase, timeout_s, NULL, NULL, __VA_ARGS__)

#endif /* COHORT_UNIT_SUITE_H */
