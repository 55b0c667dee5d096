/*
 * test_clock.c - deadlines, the timeout scale and string helpers.
 */
#include <limits.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_impl.h"

START_TEST(test_deadline_default_and_forever)
{
	cohort__time now = cohort__now_ms();
	cohort__time d = cohort__deadline(COHORT_WAIT_DEFAULT, 5000);

	ck_assert_int_ge(d, now + 5000);
	ck_assert_int_le(d, now + 6000);
	ck_assert(
	    cohort__deadline(COHORT_WAIT_FOREVER, 10) == COHORT__TIME_NEVER);
	ck_assert_int_eq(
	    cohort__remaining(COHORT__TIME_NEVER), COHORT_WAIT_FOREVER);
	ck_assert(!cohort__expired(COHORT__TIME_NEVER));
	ck_assert(cohort__expired(now - 1));
	ck_assert_int_eq(cohort__remaining(now - 100), 0);
}
END_TEST

START_TEST(test_timeout_scale)
{
	setenv("COHORT_TIMEOUT_SCALE", "2.5", 1);
	ck_assert_int_eq(cohort__scaled(1000), 2500);
	ck_assert_int_eq(cohort__scaled(-1), -1);
}
END_TEST

START_TEST(test_timeout_scale_junk_ignored)
{
	setenv("COHORT_TIMEOUT_SCALE", "fast", 1);
	ck_assert_int_eq(cohort__scaled(1000), 1000);
}
END_TEST

START_TEST(test_strlcpy_appendf)
{
	char buf[8];
	size_t off = 0;

	ck_assert_uint_eq(cohort__strlcpy(buf, "abcdefghij", sizeof(buf)), 10);
	ck_assert_str_eq(buf, "abcdefg");
	cohort__appendf(buf, sizeof(buf), &off, "%d", 12345);
	cohort__appendf(buf, sizeof(buf), &off, "%s", "6789");
	ck_assert_str_eq(buf, "1234567");
	ck_assert_uint_eq(off, 7);
}
END_TEST

START_TEST(test_parse_i64)
{
	int64_t v;

	ck_assert(cohort__parse_i64("-42", &v) && v == -42);
	ck_assert(!cohort__parse_i64("", &v));
	ck_assert(!cohort__parse_i64("12x", &v));
	ck_assert(!cohort__parse_i64("99999999999999999999", &v));
}
END_TEST

START_TEST(test_last_error_is_thread_local_text)
{
	cohort_status st = cohort__err(COHORT_EINVAL, "rank %d bad", 7);

	ck_assert_int_eq(st, COHORT_EINVAL);
	ck_assert_str_eq(cohort_last_error(), "rank 7 bad");
	cohort__err_clear();
	ck_assert_str_eq(cohort_last_error(), "");
}
END_TEST

Suite *suite_clock(void);

UNIT_SUITE(clock, "core", 0, test_deadline_default_and_forever,
    test_timeout_scale, test_timeout_scale_junk_ignored, test_strlcpy_appendf,
    test_parse_i64, test_last_error_is_thread_local_text)
