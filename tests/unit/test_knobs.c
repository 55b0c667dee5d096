/*
 * test_knobs.c - the environment table (common/knobs.h): parsing, ranges,
 * lenient tuning values, the public lookup, and docs/environment.md being
 * what `cohort env --markdown` prints (so it cannot go stale).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_common.h"
#include "knobs.h"

START_TEST(test_int_ranges_and_errors)
{
	int64_t v = 0;
	bool set = true;

	unsetenv("COHORT_TIMEOUT_MS");
	ck_assert_cohort_ok(
	    cohort__knob_int(COHORT__KNOB_TIMEOUT_MS, &v, &set));
	ck_assert(!set);
	setenv("COHORT_TIMEOUT_MS", "1500", 1);
	ck_assert_cohort_ok(
	    cohort__knob_int(COHORT__KNOB_TIMEOUT_MS, &v, &set));
	ck_assert(set && v == 1500);
	setenv("COHORT_TIMEOUT_MS", "15s", 1);
	ck_assert_cohort_err(
	    cohort__knob_int(COHORT__KNOB_TIMEOUT_MS, &v, &set),
	    COHORT_EINVAL);
	ck_assert(
	    strstr(cohort_last_error(), "COHORT_TIMEOUT_MS='15s'") != NULL);
	setenv("COHORT_HEARTBEAT_MS", "0", 1); /* below min 1 */
	ck_assert_cohort_err(
	    cohort__knob_int(COHORT__KNOB_HEARTBEAT_MS, &v, &set),
	    COHORT_EINVAL);
	ck_assert(strstr(cohort_last_error(), "out of range") != NULL);
	setenv("COHORT_TCP_SHM", "2", 1); /* a bool */
	ck_assert_cohort_err(
	    cohort__knob_int(COHORT__KNOB_TCP_SHM, &v, &set), COHORT_EINVAL);
	unsetenv("COHORT_TIMEOUT_MS");
	unsetenv("COHORT_HEARTBEAT_MS");
	unsetenv("COHORT_TCP_SHM");
}
END_TEST

START_TEST(test_tuning_values_fall_back)
{
	setenv("COHORT_TCP_RING", "12", 1); /* below min 4096 */
	ck_assert_int_eq(cohort__knob_int_or(COHORT__KNOB_TCP_RING, 777), 777);
	setenv("COHORT_TCP_RING", "65536", 1);
	ck_assert_int_eq(
	    cohort__knob_int_or(COHORT__KNOB_TCP_RING, 777), 65536);
	setenv("COHORT_TIMEOUT_SCALE", "2.5", 1);
	ck_assert(cohort__knob_float_or(COHORT__KNOB_TIMEOUT_SCALE, 1) == 2.5);
	setenv("COHORT_TIMEOUT_SCALE", "0", 1); /* must be > 0 */
	ck_assert(cohort__knob_float_or(COHORT__KNOB_TIMEOUT_SCALE, 1) == 1);
	setenv("COHORT_TIMEOUT_SCALE", "fast", 1);
	ck_assert(cohort__knob_float_or(COHORT__KNOB_TIMEOUT_SCALE, 1) == 1);
	unsetenv("COHORT_TCP_RING");
	unsetenv("COHORT_TIMEOUT_SCALE");
}
END_TEST

START_TEST(test_table_and_public_lookup)
{
	for (int k = 0; k < COHORT__KNOB_COUNT; k++) {
		const struct cohort__knob_info *in
		    = cohort__knob_info((enum cohort__knob)k);
		ck_assert(strncmp(in->name, "COHORT_", 7) == 0);
		ck_assert(in->doc[0] != '\0' && in->group[0] != '\0');
		for (int j = 0; j < k; j++)
			ck_assert_str_ne(in->name,
			    cohort__knob_info((enum cohort__knob)j)->name);
	}
	setenv("COHORT_COHORTD", "/opt/x/cohortd", 1);
	ck_assert_str_eq(cohort_env_knob("COHORT_COHORTD"), "/opt/x/cohortd");
	setenv("COHORT_NOT_A_KNOB", "x", 1);
	ck_assert_ptr_null(cohort_env_knob("COHORT_NOT_A_KNOB"));
	setenv("COHORT_COHORTD", "", 1);
	ck_assert_ptr_null(cohort_env_knob("COHORT_COHORTD"));
}
END_TEST

START_TEST(test_environment_doc_is_generated)
{
	char cmd[512], *want, *got;
	char out[256];

	snprintf(out, sizeof(out), "%s/environment.md", th_tmpdir());
	snprintf(
	    cmd, sizeof(cmd), "%s env --markdown > %s", th_bin("cohort"), out);
	ck_assert_int_eq(system(cmd), 0);
	got = th_read_file(out);
	want = th_read_file("docs/environment.md");
	ck_assert_msg(want != NULL,
	    "docs/environment.md missing (run from "
	    "the repository root)");
	ck_assert_msg(got != NULL && strcmp(got, want) == 0,
	    "docs/environment.md differs from `cohort env --markdown`: "
	    "regenerate it");
	free(got);
	free(want);
}
END_TEST

Suite *suite_knobs(void);

UNIT_SUITE(knobs, "knobs", 0, test_int_ranges_and_errors,
    test_tuning_values_fall_back, test_table_and_public_lookup,
    test_environment_doc_is_generated)
