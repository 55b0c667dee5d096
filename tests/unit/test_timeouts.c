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

/* Options out of order are refused, the reason naming what they
 * contradict (0: the default). */
static const struct {
	const char *name;
	cohort_duration op_timeout, heartbeat_interval;
	const char *why;
} to_refused[] = {
	{ "op timeout below dead-after", 2000, 0, "dead-after" },
	{ "heartbeat not below dead-after", 0, 6000, "heartbeat" },
};

START_TEST(test_order_refused)
{
	cohort_options o;
	char why[256];

	cohort_options_init(&o);
	if (to_refused[_i].op_timeout != 0)
		o.op_timeout = to_refused[_i].op_timeout;
	if (to_refused[_i].heartbeat_interval != 0)
		o.heartbeat_interval = to_refused[_i].heartbeat_interval;
	ck_assert_cohort_err(
	    cohort__timeouts_check(&o, why, sizeof(why)), COHORT_EINVAL);
	ck_assert_msg(strstr(why, to_refused[_i].why) != NULL, "%s: %s",
	    to_refused[_i].name, why);
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

Suite *
suite_timeouts(void)
{
	const TTest *tests[] = { test_defaults_are_ordered,
		test_rendezvous_shorter_than_operation_refused,
		test_environment_knobs, NULL };
	const struct unit_loop loops[]
	    = { { test_order_refused,
		    (int)(sizeof(to_refused) / sizeof(to_refused[0])) },
		      { NULL, 0 } };

	return (unit_suite_loops("timeouts", "order", 0, tests, loops));
}
