/*
 * unit_suite.c - table-built test cases for the unit suites.
 */
#include "unit_suite.h"

TCase *
unit_tcase(
    Suite *s, const char *name, int timeout_s, const TTest *const *tests)
{
	TCase *tc = tcase_create(name);

	if (timeout_s > 0)
		tcase_set_timeout(tc, timeout_s);
	for (; tests != NULL && *tests != NULL; tests++)
		tcase_add_test(tc, *tests);
	suite_add_tcase(s, tc);
	return (tc);
}

TCase *
unit_tcase_loops(Suite *s, const char *name, int timeout_s,
    const TTest *const *tests, const struct unit_loop *loops)
{
	TCase *tc = unit_tcase(s, name, timeout_s, tests);

	for (; loops != NULL && loops->test != NULL; loops++)
		tcase_add_loop_test(tc, loops->test, 0, loops->n);
	return (tc);
}

Suite *
unit_suite_loops(const char *name, const char *tcase, int timeout_s,
    const TTest *const *tests, const struct unit_loop *loops)
{
	Suite *s = suite_create(name);

	(void)unit_tcase_loops(s, tcase, timeout_s, tests, loops);
	return (s);
}

Suite *
unit_suite_cases(const char *name, const struct unit_case *cases)
{
	Suite *s = suite_create(name);

	for (; cases->name != NULL; cases++) {
		TCase *tc = unit_tcase_loops(s, cases->name, cases->timeout_s,
		    cases->tests, cases->loops);

		if (cases->setup != NULL || cases->teardown != NULL)
			tcase_add_checked_fixture(
			    tc, cases->setup, cases->teardown);
	}
	return (s);
}
