/*
 * test_client.c - client/client.c and client/open.c against a real
 * cohortd core embedded in the test (tests/harness/cl_fixture.h): open
 * and its refusals, a peer's failure reaching every group as cohortd's
 * record (reported, process ended, in which operation), the reserved KV
 * space.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cl_fixture.h"
#include "client.h"
#include "unit_suite.h"

Suite *suite_client(void);

START_TEST(test_open_gives_ranks_and_world)
{
	struct clx x;

	clx_start(&x, "open");
	clx_join(&x, 3);
	for (int r = 0; r < 3; r++) {
		cohort_group *w = cohort_client_world(x.c[r]);

		ck_assert_int_eq(cohort_client_rank(x.c[r]), r);
		ck_assert_int_eq(cohort_client_world_size(x.c[r]), 3);
		ck_assert_uint_ge(cohort_client_generation(x.c[r]), 1);
		ck_assert(cohort_client_is_global_zero(x.c[r]) == (r == 0));
		ck_assert_int_eq(cohort_group_rank(w), r);
		ck_assert_int_eq(cohort_group_size(w), 3);
		ck_assert_int_eq(cohort_group_global_rank(w, 2), 2);
		ck_assert_int_eq(cohort_group_global_rank(w, 3), -1);
		ck_assert(cohort_group_is_healthy(w));
		ck_assert_cohort_ok(cohort_client_error(x.c[r]));
	}
	clx_stop(&x);
}
END_TEST

static void
ct_refused(cohort_options *o, const char *want)
{
	cohort_client *c = NULL;

	ck_assert_cohort_err(cohort_client_open(o, &c, 1000), COHORT_EINVAL);
	ck_assert_ptr_null(c);
	ck_assert_msg(strstr(cohort_last_error(), want) != NULL,
	    "'%s' does not say '%s'", cohort_last_error(), want);
}

/* Refused before anything connects: no coordinator needed. */
START_TEST(test_open_refuses_bad_options)
{
	cohort_options o;

	th_member_options(&o, "tcp://127.0.0.1:1", "j", 0, 0);
	ct_refused(&o, "world size 0");
	th_member_options(&o, "tcp://127.0.0.1:1", "j", 5, 3);
	ct_refused(&o, "rank 5 out of range");
	th_member_options(&o, NULL, "j", 0, 1);
	ct_refused(&o, "no coordinator URL");
	th_member_options(&o, "127.0.0.1:1", "j", 0, 1);
	ct_refused(&o, "not a URL");
	th_member_options(&o, "tcp://127.0.0.1:1", "j", 0, 1);
	o.heartbeat_interval = 500;
	o.dead_after = 500;
	ct_refused(&o, "heartbeat interval");
	th_member_options(&o, "tcp://127.0.0.1:1", "j", 0, 1);
	o.backend = "carrier-pigeon";
	ct_refused(&o, "unknown backend 'carrier-pigeon'");
	ck_assert_cohort_err(cohort_client_open(NULL, NULL, 0), COHORT_EINVAL);
}
END_TEST

START_TEST(test_open_without_coordinator_fails_in_time)
{
	cohort_options o;
	cohort_client *c = NULL;
	int64_t t0;
	int port = th_free_port();
	char url[64];

	snprintf(url, sizeof(url), "tcp://127.0.0.1:%d", port);
	th_member_options(&o, url, "j", 0, 1);
	t0 = th_now_ms();
	ck_assert_cohort_err(cohort_client_open(&o, &c, 500), COHORT_ENOCOORD);
	ck_assert_int_lt(th_now_ms() - t0, 3000);
	ck_assert_ptr_null(c);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), url + 6));
}
END_TEST

static cohort_status
ct_open_short(struct clx *x, int rank, void *arg)
{
	cohort_options o;

	(void)arg;
	clx_options(x, rank, 3, &o);
	o.join_timeout = 1000;
	o.op_timeout = 1000;
	o.dead_after = 500;
	o.reconnect_window = 500;
	return (cohort_client_open(&o, &x->c[rank], COHORT_WAIT_DEFAULT));
}

START_TEST(test_join_timeout_names_the_missing_rank)
{
	struct clx x;
	cohort_status st[2];

	clx_start(&x, "late");
	clx_run(&x, 2, ct_open_short, NULL, 10000, st);
	ck_assert_int_eq(st[0], COHORT_ETIMEDOUT);
	ck_assert_int_eq(st[1], COHORT_ETIMEDOUT);
	ck_assert_ptr_null(x.c[0]);
	/* the text (this thread's: ask again alone) */
	ck_assert_cohort_err(ct_open_short(&x, 0, NULL), COHORT_ETIMEDOUT);
	ck_assert_msg(strstr(cohort_last_error(), "2") != NULL, "%s",
	    cohort_last_error());
	clx_stop(&x);
}
END_TEST

struct ct_failed {
	struct clx *x;
	int rank;
};

static bool
ct_world_failed(void *arg)
{
	struct ct_failed *f = arg;

	return (cohort_group_error(cohort_client_world(f->x->c[f->rank]))
	    != COHORT_OK);
}

/* Waits (bounded) until rank's world group failed; its record. */
static void
ct_wait_failed(struct clx *x, int rank, cohort_failure *f)
{
	struct ct_failed a = { x, rank };

	ck_assert_msg(th_wait_until(ct_world_failed, &a, 100, 50),
	    "rank %d never heard of the failure", rank);
	f->size = sizeof(*f);
	ck_assert_cohort_ok(
	    cohort_group_failure(cohort_client_world(x->c[rank]), f));
}

START_TEST(test_reported_failure_reaches_every_group_as_data)
{
	struct clx x;
	cohort_failure f;
	char host[256], head[400];
	const char *text = "ValueError: boom\n  at line 3";

	clx_start(&x, "rep");
	clx_join(&x, 3);
	ck_assert_cohort_ok(cohort_report_failure(x.c[1], text, 5000));
	gethostname(host, sizeof(host));
	snprintf(head, sizeof(head), "rank 1 (%s:%d) failed: ValueError: boom",
	    host, (int)getpid());
	for (int r = 0; r < 3; r += 2) {
		ct_wait_failed(&x, r, &f);
		ck_assert_int_eq(f.status, COHORT_EPEERLOST);
		ck_assert_int_eq(f.kind, COHORT_FAILURE_REPORTED);
		ck_assert_int_eq(f.rank, 1);
		ck_assert_int_eq(f.group_rank, 1);
		ck_assert_str_eq(f.host, host);
		ck_assert_uint_eq(f.pid, (uint32_t)getpid());
		ck_assert_str_eq(f.text, text);
		ck_assert(f.unix_ms > 0);
		ck_assert_msg(strncmp(cohort_group_last_error(
		                          cohort_client_world(x.c[r])),
		                  head, strlen(head))
		        == 0,
		    "%s",
		    cohort_group_last_error(cohort_client_world(x.c[r])));
		ck_assert_ptr_nonnull(strstr(
		    cohort_group_last_error(cohort_client_world(x.c[r])),
		    " s ago)\n  at line 3"));
		ck_assert_cohort_err(
		    cohort_client_error(x.c[r]), COHORT_EPEERLOST);
		/* sticky: every later call says the same */
		ck_assert_cohort_err(
		    cohort_barrier(cohort_client_world(x.c[r]), "after", 1000),
		    COHORT_EPEERLOST);
		ck_assert_ptr_nonnull(strstr(cohort_last_error(), head));
	}
	/* too long a text is refused, not cut */
	{
		size_t n = 64 * 1024 + 2;
		char *big = malloc(n);

		ck_assert_ptr_nonnull(big);
		memset(big, 'x', n - 1);
		big[n - 1] = '\0';
		ck_assert_cohort_err(
		    cohort_report_failure(x.c[0], big, 1000), COHORT_EINVAL);
		free(big);
	}
	ck_assert_cohort_err(
	    cohort_report_failure(NULL, "x", 1000), COHORT_EINVAL);
	clx_stop(&x);
}
END_TEST

static cohort_status
ct_barrier_b(struct clx *x, int rank, void *arg)
{
	(void)arg;
	return (cohort_barrier(cohort_client_world(x->c[rank]), "b", 10000));
}

/* A member whose connection closes is a process that ended; cohortd says
 * which operation it was in. */
START_TEST(test_lost_connection_names_the_operation)
{
	struct clx x;
	struct clx_bg *bg;
	cohort_failure f;

	clx_start(&x, "lost");
	clx_join(&x, 3);
	bg = clx_bg_start(&x, 2, ct_barrier_b, NULL);
	clx_wait_parked(&x, 0, 2);
	cohort__coord_drop(x.c[2]->coord, "dropped by the test");
	ck_assert_int_ne(clx_bg_join(bg, 5000, NULL), COHORT_OK);
	for (int r = 0; r < 2; r++) {
		ct_wait_failed(&x, r, &f);
		ck_assert_int_eq(f.kind, COHORT_FAILURE_PROCESS);
		ck_assert_int_eq(f.rank, 2);
		ck_assert_str_eq(f.text, "connection lost");
		ck_assert_str_eq(f.operation, "barrier 'b'");
		ck_assert_uint_eq(f.seq, 1);
		ck_assert_str_eq(f.group, "");
		ck_assert_int_eq(f.op_state, COHORT_FAILURE_OP_DURING);
		ck_assert_ptr_nonnull(strstr(
		    cohort_group_last_error(cohort_client_world(x.c[r])),
		    "failed during barrier 'b' (#1): connection lost"));
	}
	clx_stop(&x);
}
END_TEST

START_TEST(test_reserved_keys_are_not_the_programs)
{
	struct clx x;
	cohort_client *c;
	const char *keys[] = { "ok", "__cohort/dp/x" };
	void *v = NULL;
	size_t len = 0;
	int64_t n;
	bool b;

	clx_start(&x, "kv");
	clx_join(&x, 1);
	c = x.c[0];
	ck_assert_cohort_err(
	    cohort_kv_set(c, "__cohort/dp/x", "v", 1, 1000), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "reserved"));
	ck_assert_cohort_err(
	    cohort_kv_get(c, "__cohort/faults/1", &v, &len, 1000),
	    COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_kv_add(c, "__cohort/faults/count", 1, &n, 1000),
	    COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_kv_delete(c, "__cohort/x", &b, 1000), COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_kv_append(c, "__cohort/x", "v", 1, 1000), COHORT_EINVAL);
	ck_assert_cohort_err(cohort_kv_compare_set(c, "__cohort/x", NULL, 0,
	                         "v", 1, &b, NULL, NULL, 1000),
	    COHORT_EINVAL);
	ck_assert_cohort_err(cohort_kv_wait(c, keys, 2, 1000), COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_kv_check(c, keys, 2, &b, 1000), COHORT_EINVAL);
	/* libcohort's own calls use it; a near miss is the program's */
	ck_assert_cohort_ok(cohort__kv_set(c, "__cohort/dp/x", "v", 1, 1000));
	ck_assert_cohort_ok(
	    cohort__kv_get(c, "__cohort/dp/x", &v, &len, 1000));
	ck_assert_uint_eq(len, 1);
	cohort_free(v);
	ck_assert_cohort_ok(cohort_kv_set(c, "__cohort", "v", 1, 1000));
	ck_assert_cohort_ok(cohort_kv_set(c, "_cohort/x", "v", 1, 1000));
	clx_stop(&x);
}
END_TEST

UNIT_SUITE(client, "client", 60, test_open_gives_ranks_and_world,
    test_open_refuses_bad_options, test_open_without_coordinator_fails_in_time,
    test_join_timeout_names_the_missing_rank,
    test_reported_failure_reaches_every_group_as_data,
    test_lost_connection_names_the_operation,
    test_reserved_keys_are_not_the_programs)
