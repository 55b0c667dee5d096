/*
 * run_all.c - the test runner: one SRunner over every suite of the tree.
 *
 * Suites are collected at build time (tools/gen_suites.sh) from every
 * `Suite *suite_<name>(void)` in tests/. COHORT_TEST_SUITE=a,b narrows the
 * run to those suites; Check's own CK_RUN_SUITE / CK_RUN_CASE work too.
 * Exit status: 0 only if at least one test ran and none failed (a suite
 * that silently runs zero tests must not pass).
 */
#include <check.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"

struct cohort_test_suite {
	const char *name;
	Suite *(*fn)(void);
};
extern const struct cohort_test_suite cohort_test_suites[];

static int
run_all_selected(const char *name)
{
	const char *sel = getenv("COHORT_TEST_SUITE");
	size_t n = strlen(name);

	if (sel == NULL || *sel == '\0')
		return (1);
	for (const char *p = sel; *p != '\0';) {
		const char *e = strchr(p, ',');
		size_t len = e ? (size_t)(e - p) : strlen(p);
		if (len == n && strncmp(p, name, n) == 0)
			return (1);
		p += len + (e ? 1 : 0);
	}
	return (0);
}

int
main(void)
{
	SRunner *sr = NULL;
	int nsuites = 0, ran, failed;

	for (const struct cohort_test_suite *s = cohort_test_suites;
	     s->name != NULL; s++) {
		if (!run_all_selected(s->name))
			continue;
		if (sr == NULL)
			sr = srunner_create(s->fn());
		else
			srunner_add_suite(sr, s->fn());
		nsuites++;
	}
	if (sr == NULL) {
		fprintf(stderr, "cohort-tests: no suite selected\n");
		return (2);
	}
	/* CK_FORK=no (e.g. under valgrind) is honoured by Check itself. */
	th_set_runner();
	srunner_run_all(sr, CK_NORMAL);
	th_tmpfs_cleanup();
	ran = srunner_ntests_run(sr);
	failed = srunner_ntests_failed(sr);
	srunner_free(sr);
	printf("cohort-tests: %d suites, %d tests, %d failed\n", nsuites, ran,
	    failed);
	printf("%d passed, %d failed\n", ran - failed, failed);
	if (ran == 0) {
		fprintf(stderr, "cohort-tests: zero tests ran\n");
		return (2);
	}
	return (failed == 0 ? 0 : 1);
}
