/*
 * test_timeouts.c - the timeout hierarchy (docs/timeouts.md): heartbeat <
 * dead-after < operation timeout <= rendezvous timeout, from options and
 * from the environment.
 */
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_impl.h"

START_TEST(test_defaults_are_ordered)
{
	cohort_options o;
	char why[256];

	cohort_options_init(&o);
	ck_assert_cohort_ok(cohort__timeouts_check(&o, why, sizeof(why)));
	ck_assert_int_eq(o.op_timeout, 1800000);
}
END_TEST

START_TEST(test_op_timeout_below_dead_after_refused)
{
	cohort_options o;
	char why[256];

	cohort_options_init(&o);
	o.op_timeout = 2000;
	ck_assert_cohort_err(
	    cohort__timeouts_check(&o, why, sizeof(why)), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "dead-after"));
}
END_TEST

START_TEST(test_heartbeat_not_below_dead_after_refused)
{
	cohort_options o;
	char why[256];

	cohort_options_init(&o);
	o.heartbeat_interval = 6000;
	ck_assert_cohort_err(
	    cohort__timeouts_check(&o, why, sizeof(why)), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(why, "heartbeat"));
}
END_TEST

START_TEST(test_rendezvous_shorter_than_operation_refused)
{
	cohort_options o;
	char why[256];

	cohort_options_init(&o);
	o.join_timeout = 60000;
	ck_assert_cohort_err(
	    cohort__timeouts_check(&o, why, sizeof(why)), COHORT_EINVAL);
	o.join_timeout = COHORT_WAIT_FOREVER;
	ck_assert_cohort_ok(cohort__timeouts_check(&o, why, sizeof(why)));
	o.op_timeout = COHORT_WAIT_FOREVER;
	ck_assert_cohort_ok(cohort__timeouts_check(&o, why, sizeof(why)));
}
END_TEST

START_TEST(test_environment_knobs)
{
	cohort_options o;

	cohort_options_init(&o);
	setenv("COHORT_TIMEOUT_MS", "60000", 1);
	setenv("COHORT_HEARTBEAT_MS", "500", 1);
	setenv("COHORT_DEAD_AFTER_MS", "3000", 1);
	setenv("COHORT_BACKEND", "service", 1);
	ck_assert_cohort_ok(cohort__options_env_timeouts(&o));
	ck_assert_int_eq(o.op_timeout, 60000);
	ck_assert_int_eq(o.heartbeat_interval, 500);
	ck_assert_int_eq(o.dead_after, 3000);
	ck_assert_str_eq(o.backend, "service");
	setenv("COHORT_DEAD_AFTER_MS", "5s", 1);
	ck_assert_cohort_err(cohort__options_env_timeouts(&o), COHORT_EINVAL);
	ck_assert_ptr_nonnull(
	    strstr(cohort_last_error(), "COHORT_DEAD_AFTER_MS"));
}
END_TEST

Suite *suite_timeouts(void);

UNIT_SUITE(timeouts, "order", 0, test_defaults_are_ordered,
    test_op_timeout_below_dead_after_refused,
    test_heartbeat_not_below_dead_after_refused,
    test_rendezvous_shorter_than_operation_refused, test_environment_knobs)
