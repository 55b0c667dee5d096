/*
 * test_sizes.c - size limits made one (issue 12, finding 10): a real
 * cohortd and real workers. The client learns cohortd's limits at join and
 * checks whole messages against them; a broadcast object too big fails on
 * every rank with ETOOBIG (the root announces it, cohortd tells everyone);
 * values up to the configured limit work end to end, also with a raised
 * --max-value-bytes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "check_cohort.h"

#define LIM_DEFAULT (64u << 20) /* cohortd's default --max-value-bytes */

/* Every rank's output (or rank 0's only, when nranks is 1) has want. */
static void
lim_expect(struct th_workers *w, int timeout_ms, const char *want, int nranks)
{
	th_workers_wait(w, timeout_ms);
	th_workers_expect(w, nranks, want);
}

static void
lim_run(const char *const *args, const char *scen, size_t len,
    const char *want, const char *job, int nranks)
{
	struct th_coord coord;
	struct th_workers w;
	char arg[32];

	th_coord_start(&coord, args);
	snprintf(arg, sizeof(arg), "%zu", len);
	th_workers_start(&w, &coord, job, "t", 2, scen, arg, NULL);
	lim_expect(&w, 180000, want, nranks);
	ck_assert_int_eq(th_coord_stop(&coord), 0);
}

/* Exactly --max-value-bytes: delivered intact. */
START_TEST(test_bcast_object_at_the_limit)
{
	lim_run(NULL, "bcast", LIM_DEFAULT, "ok=1", "at", 2);
}
END_TEST

/* One byte over: every rank (not only the root) gets ETOOBIG naming the
 * sizes, at once. Before: the root alone got ETOOBIG, the receiver waited
 * and got EMISMATCH. */
START_TEST(test_bcast_object_one_byte_over_fails_everywhere)
{
	lim_run(NULL, "bcast", LIM_DEFAULT + 1,
	    "status=COHORT_ETOOBIG detail=broadcast object of 67108865 bytes "
	    "from rank 0 exceeds cohortd's --max-value-bytes 67108864",
	    "over", 2);
}
END_TEST

/* The figure of the finding: 68,157,400 bytes (under the old payload-only
 * check, over cohortd's receive limit). Before: cohortd dropped the root's
 * connection and the job failed ("connection lost"). */
START_TEST(test_bcast_object_near_message_limit_fails_cleanly)
{
	lim_run(NULL, "bcast", 68157400, "status=COHORT_ETOOBIG", "near", 2);
}
END_TEST

/* A raised --max-value-bytes is learned at join: a 70 MiB KV value and a
 * 70 MiB object go through. Before: ETOOBIG "exceeds the message limit
 * of 68157440" in the client. */
START_TEST(test_raised_limit_70mib_kv_value)
{
	static const char *const args[]
	    = { "--max-value-bytes", "134217728", NULL };

	lim_run(args, "kvbig", 70u << 20, "ok=1", "kv70", 2);
}
END_TEST

START_TEST(test_raised_limit_70mib_object)
{
	static const char *const args[]
	    = { "--max-value-bytes", "134217728", NULL };

	lim_run(args, "bcast", 70u << 20, "ok=1", "obj70", 2);
}
END_TEST

/* A lowered limit is learned too: a KV value one byte over fails with
 * ETOOBIG from cohortd, one at the limit works. */
START_TEST(test_lowered_limit_kv_value)
{
	static const char *const args[]
	    = { "--max-value-bytes", "1048576", NULL };

	lim_run(args, "kvbig", 1048576, "ok=1", "kvlow", 2);
	/* the setter (rank 0) gets it; the reader sees rank 0 leave */
	lim_run(args, "kvbig", 1048577,
	    "status=COHORT_ETOOBIG detail=value of 1048577 bytes exceeds "
	    "--max-value-bytes 1048576",
	    "kvlow2", 1);
}
END_TEST

Suite *suite_integration_sizes(void); /* for tools/gen_suites.sh */

Suite *
suite_integration_sizes(void)
{
	return (th_suite("integration_sizes", "limits", 300, NULL, NULL,
	    test_bcast_object_at_the_limit,
	    test_bcast_object_one_byte_over_fails_everywhere,
	    test_bcast_object_near_message_limit_fails_cleanly,
	    test_raised_limit_70mib_kv_value, test_raised_limit_70mib_object,
	    test_lowered_limit_kv_value, NULL));
}
