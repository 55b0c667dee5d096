/*
 * test_group.c - client/group.c and client/failure.c: a group's sticky
 * failure as data (the first wins, nothing is merged), the one text it is
 * composed into, cohortd's Failure turned into a record, and
 * cohort_group_last_error's buffer per thread.
 *
 * The groups here are real groups of group.c with no client above them
 * (group.c needs none: its context has no coordinator call to abort);
 * the client-level paths are in test_client.c against a real cohortd.
 */
#include <pthread.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"
#include "failure.h"
#include "group.h"
#include "unit_suite.h"

Suite *suite_group(void);

#define GT_SET(dst, src) cohort__strlcpy((dst), (src), sizeof(dst))

struct gt {
	struct cohort__obs obs;
	struct cohort_group *g;
};

static struct gt *
gt_new(const char *id, int32_t rank, int32_t size, const int32_t *ranks)
{
	struct gt *t = calloc(1, sizeof(*t));
	struct cohort__group_ctx ctx;

	ck_assert_ptr_nonnull(t);
	ck_assert_cohort_ok(cohort__obs_init(&t->obs));
	memset(&ctx, 0, sizeof(ctx));
	ctx.obs = &t->obs;
	ck_assert_cohort_ok(
	    cohort__group_alloc(&ctx, id, rank, size, ranks, 1, &t->g));
	return (t);
}

static void
gt_free(struct gt *t)
{
	cohort__group_free(t->g);
	cohort__obs_fini(&t->obs);
	free(t);
}

/* cohortd's verdict: rank 2 (node7:99) died in allreduce #5. */
static void
gt_verdict(cohort_failure *f)
{
	cohort__failure_clear(f);
	f->status = COHORT_EPEERLOST;
	f->kind = COHORT_FAILURE_PROCESS;
	f->rank = 2;
	f->pid = 99;
	GT_SET(f->host, "node7");
	GT_SET(f->operation, "allreduce");
	f->seq = 5;
	f->op_state = COHORT_FAILURE_OP_DURING;
	GT_SET(f->text, "connection lost");
}

/* t's group failed by gt_verdict's failure of `rank`, `age_ms` old at
 * cohortd; the record as cohort_group_failure gives it into *f. */
static void
gt_failed(struct gt *t, int32_t rank, uint64_t age_ms, cohort_failure *f)
{
	cohort_failure v;

	gt_verdict(&v);
	v.rank = rank;
	v.age_ms = age_ms;
	cohort__group_fail(t->g, &v);
	f->size = sizeof(*f);
	ck_assert_cohort_ok(cohort_group_failure(t->g, f));
}

START_TEST(test_healthy_group_has_no_failure)
{
	struct gt *t = gt_new("", 0, 3, NULL);
	cohort_failure f = COHORT_FAILURE_INIT;

	ck_assert_cohort_ok(cohort_group_failure(t->g, &f));
	ck_assert_int_eq(f.status, COHORT_OK);
	ck_assert_int_eq(f.kind, COHORT_FAILURE_NONE);
	ck_assert_int_eq(f.rank, -1);
	ck_assert_int_eq(f.group_rank, -1);
	ck_assert_str_eq(f.text, "");
	ck_assert_str_eq(cohort_group_last_error(t->g), "");
	ck_assert_cohort_ok(cohort__group_check(t->g));
	gt_free(t);
}
END_TEST

START_TEST(test_failure_api_checks_its_arguments)
{
	struct gt *t = gt_new("", 0, 3, NULL);
	cohort_failure f = COHORT_FAILURE_INIT;
	/* a caller compiled against a later, larger struct */
	struct {
		cohort_failure f;
		char later[64];
	} big;

	ck_assert_cohort_err(cohort_group_failure(NULL, &f), COHORT_EINVAL);
	ck_assert_cohort_err(cohort_group_failure(t->g, NULL), COHORT_EINVAL);
	f.size = sizeof(f) - 1;
	ck_assert_cohort_err(cohort_group_failure(t->g, &f), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "sizeof"));
	cohort_group_abort(t->g);
	memset(&big, 0x5a, sizeof(big));
	big.f.size = sizeof(big);
	ck_assert_cohort_ok(cohort_group_failure(t->g, &big.f));
	ck_assert_int_eq(big.f.status, COHORT_EABORTED);
	ck_assert_int_eq(big.f.size, sizeof(big));
	for (size_t i = 0; i < sizeof(big.later); i++)
		ck_assert_int_eq((unsigned char)big.later[i], 0x5a);
	ck_assert_str_eq(cohort_group_last_error(NULL), "");
	gt_free(t);
}
END_TEST

START_TEST(test_first_failure_wins_unmerged)
{
	struct gt *t = gt_new("", 0, 3, NULL);
	cohort_failure v, f = COHORT_FAILURE_INIT;
	char first[1024];

	gt_verdict(&v);
	ck_assert_int_eq(cohort__group_fail(t->g, &v), COHORT_EPEERLOST);
	ck_assert_int_eq(
	    atomic_load(&t->g->abort_flag), 1); /* waits are woken */
	cohort__strlcpy(first, cohort_last_error(), sizeof(first));
	ck_assert_cohort_err(cohort__group_check(t->g), COHORT_EPEERLOST);
	ck_assert_str_eq(cohort_last_error(),
	    "rank 2 (node7:99) failed during allreduce (#5): connection lost");
	/* what this process saw afterwards: kept beside, not merged */
	ck_assert_int_eq(
	    cohort__group_fail_local(t->g, COHORT_ETIMEDOUT,
	        COHORT_FAILURE_TIMEOUT, "allreduce #6: rank 1 timed out"),
	    COHORT_EPEERLOST);
	/* a second verdict changes nothing */
	v.rank = 1;
	cohort__group_fail(t->g, &v);
	ck_assert_cohort_ok(cohort_group_failure(t->g, &f));
	ck_assert_int_eq(f.status, COHORT_EPEERLOST);
	ck_assert_int_eq(f.kind, COHORT_FAILURE_PROCESS);
	ck_assert_int_eq(f.rank, 2);
	ck_assert_int_eq(f.group_rank, 2);
	ck_assert_str_eq(f.text, "connection lost");
	ck_assert_str_eq(f.observed, "allreduce #6: rank 1 timed out");
	ck_assert_cohort_err(cohort__group_check(t->g), COHORT_EPEERLOST);
	ck_assert_str_eq(cohort_last_error(),
	    "rank 2 (node7:99) failed during allreduce (#5): connection lost");
	ck_assert_int_eq(cohort_group_error(t->g), COHORT_EPEERLOST);
	ck_assert(!cohort_group_is_healthy(t->g));
	gt_free(t);
}
END_TEST

START_TEST(test_group_rank_of_the_failed_rank)
{
	const int32_t ranks[] = { 3, 5, 7 };
	struct gt *t = gt_new("sub", 1, 3, ranks);
	struct gt *u = gt_new("sub2", 1, 3, ranks);
	cohort_failure f;

	gt_failed(t, 7, 0, &f);
	ck_assert_int_eq(f.rank, 7);
	ck_assert_int_eq(f.group_rank, 2);
	gt_failed(u, 4, 0, &f); /* not a member of u */
	ck_assert_int_eq(f.group_rank, -1);
	gt_free(t);
	gt_free(u);
}
END_TEST

START_TEST(test_abort_is_sticky_and_says_so)
{
	struct gt *t = gt_new("g", 0, 2, NULL);
	cohort_failure f = COHORT_FAILURE_INIT;

	cohort_group_abort(t->g);
	cohort_group_abort(t->g);
	cohort_group_abort(NULL);
	ck_assert_cohort_err(cohort__group_check(t->g), COHORT_EABORTED);
	ck_assert_str_eq(
	    cohort_last_error(), "group 'g' aborted by cohort_group_abort");
	ck_assert_cohort_ok(cohort_group_failure(t->g, &f));
	ck_assert_int_eq(f.kind, COHORT_FAILURE_ABORTED);
	ck_assert_int_eq(f.rank, -1);
	ck_assert(f.unix_ms > 0);
	gt_free(t);
}
END_TEST

/* The age a verdict already had at cohortd counts, and grows. */
START_TEST(test_age_counts_from_the_failure)
{
	struct gt *t = gt_new("", 0, 3, NULL);
	cohort_failure f;

	gt_failed(t, 2, 1500, &f);
	ck_assert_uint_ge(f.age_ms, 1500);
	ck_assert_uint_lt(f.age_ms, 10000);
	ck_assert_ptr_nonnull(
	    strstr(cohort_group_last_error(t->g), "connection lost (1."));
	gt_free(t);
}
END_TEST

/* The one composition, case by case. */
START_TEST(test_text_of_each_kind)
{
	cohort_failure f;
	char buf[2048];

	gt_verdict(&f);
	cohort__failure_text(&f, false, buf, sizeof(buf));
	ck_assert_str_eq(buf,
	    "rank 2 (node7:99) failed during allreduce (#5): "
	    "connection lost");
	f.op_state = COHORT_FAILURE_OP_AFTER;
	GT_SET(f.group, "grads");
	cohort__failure_text(&f, false, buf, sizeof(buf));
	ck_assert_str_eq(buf,
	    "rank 2 (node7:99) failed after allreduce (#5) on group "
	    "'grads': connection lost");
	/* only the last heartbeat knew the operation: how old that is */
	f.op_state = COHORT_FAILURE_OP_DURING;
	f.group[0] = '\0';
	f.op_age_ms = 2500;
	f.seq = 99;
	cohort__failure_text(&f, false, buf, sizeof(buf));
	ck_assert_str_eq(buf,
	    "rank 2 (node7:99) failed (its last heartbeat, 2.5 s before: in "
	    "allreduce #99): connection lost");
	/* a reported traceback: the age ends the first line */
	gt_verdict(&f);
	f.kind = COHORT_FAILURE_REPORTED;
	f.operation[0] = '\0';
	f.age_ms = 1200;
	GT_SET(f.text, "ValueError: boom\n  at line 3");
	ck_assert_uint_eq(cohort_failure_format(&f, buf, sizeof(buf)),
	    strlen("rank 2 (node7:99) failed: ValueError: boom (1.2 s ago)\n"
	           "  at line 3"));
	ck_assert_str_eq(buf,
	    "rank 2 (node7:99) failed: ValueError: boom (1.2 s ago)\n"
	    "  at line 3");
	/* truncated like snprintf */
	ck_assert_uint_gt(cohort_failure_format(&f, buf, 10), 9);
	ck_assert_str_eq(buf, "rank 2 (n");
	/* a member that left while an operation waited for it */
	gt_verdict(&f);
	f.kind = COHORT_FAILURE_LEFT;
	GT_SET(f.operation, "barrier 'epoch-3'");
	f.seq = 0;
	GT_SET(f.text, "left the job");
	cohort__failure_text(&f, false, buf, sizeof(buf));
	ck_assert_str_eq(buf,
	    "rank 2 (node7:99) left the job; barrier 'epoch-3' cannot "
	    "complete");
	/* seen here: the text as it was seen */
	cohort__failure_local(&f, COHORT_ETIMEDOUT, COHORT_FAILURE_TIMEOUT,
	    "timed out during allreduce #2 waiting for rank %d", 2);
	cohort__failure_text(&f, false, buf, sizeof(buf));
	ck_assert_str_eq(
	    buf, "timed out during allreduce #2 waiting for rank 2");
	/* healthy: nothing */
	cohort__failure_clear(&f);
	ck_assert_uint_eq(cohort_failure_format(&f, buf, sizeof(buf)), 0);
	ck_assert_str_eq(buf, "");
	ck_assert_uint_eq(cohort_failure_format(NULL, buf, sizeof(buf)), 0);
}
END_TEST

START_TEST(test_kind_names)
{
	ck_assert_str_eq(
	    cohort_failure_kind_name(COHORT_FAILURE_NONE), "none");
	ck_assert_str_eq(
	    cohort_failure_kind_name(COHORT_FAILURE_PROCESS), "process");
	ck_assert_str_eq(
	    cohort_failure_kind_name(COHORT_FAILURE_HEARTBEAT), "heartbeat");
	ck_assert_str_eq(
	    cohort_failure_kind_name(COHORT_FAILURE_REPORTED), "reported");
	ck_assert_str_eq(cohort_failure_kind_name(COHORT_FAILURE_UNAVAILABLE),
	    "unavailable");
	ck_assert_str_eq(
	    cohort_failure_kind_name((cohort_failure_kind)999), "unknown");
	ck_assert_str_eq(
	    cohort_failure_kind_name((cohort_failure_kind)-1), "unknown");
	/* the verdicts keep the wire's numbers */
	ck_assert_int_eq(COHORT_FAILURE_PROCESS,
	    (int)COHORT__FAILURE_KIND__FAILURE_PROCESS);
	ck_assert_int_eq(COHORT_FAILURE_HEARTBEAT,
	    (int)COHORT__FAILURE_KIND__FAILURE_HEARTBEAT);
	ck_assert_int_eq(COHORT_FAILURE_REPORTED,
	    (int)COHORT__FAILURE_KIND__FAILURE_REPORTED);
	ck_assert_int_eq(
	    COHORT_FAILURE_LEFT, (int)COHORT__FAILURE_KIND__FAILURE_LEFT);
	ck_assert_int_eq(COHORT_FAILURE_RESTORE,
	    (int)COHORT__FAILURE_KIND__FAILURE_RESTORE);
}
END_TEST

/* cohortd's Failure message, an older cohortd's text, a moved
 * generation. */
START_TEST(test_record_from_a_reply)
{
	Cohort__Reply rep = COHORT__REPLY__INIT;
	Cohort__Failure w = COHORT__FAILURE__INIT;
	cohort_failure f;

	w.kind = COHORT__FAILURE_KIND__FAILURE_HEARTBEAT;
	w.rank = 3;
	w.host = "node3";
	w.pid = 4242;
	w.operation = "barrier 'b'";
	w.seq = 17;
	w.group = "g";
	w.op_state = COHORT__FAILURE_OP_STATE__FAILURE_OP_DURING;
	w.age_ms = 250;
	w.unix_ms = 1700000000000ull;
	w.text = "no heartbeat for 5.0 s";
	rep.status = COHORT_EPEERLOST;
	rep.error = "the server's own text";
	rep.failed_rank = 3;
	rep.failure = &w;
	cohort__failure_from_reply(&f, COHORT_EPEERLOST, &rep);
	ck_assert_int_eq(f.kind, COHORT_FAILURE_HEARTBEAT);
	ck_assert_int_eq(f.rank, 3);
	ck_assert_str_eq(f.host, "node3");
	ck_assert_uint_eq(f.pid, 4242);
	ck_assert_str_eq(f.operation, "barrier 'b'");
	ck_assert_uint_eq(f.seq, 17);
	ck_assert_str_eq(f.group, "g");
	ck_assert_int_eq(f.op_state, COHORT_FAILURE_OP_DURING);
	ck_assert_uint_eq(f.age_ms, 250);
	ck_assert_int_eq(f.unix_ms, 1700000000000ll);
	ck_assert_str_eq(f.text, "no heartbeat for 5.0 s");
	/* from a cohortd without the Failure message: its words */
	rep.failure = NULL;
	cohort__failure_from_reply(&f, COHORT_EPEERLOST, &rep);
	ck_assert_int_eq(f.kind, COHORT_FAILURE_PEER);
	ck_assert_int_eq(f.rank, 3);
	ck_assert_str_eq(f.text, "the server's own text");
	rep.error = "";
	rep.failed_text = "boom";
	cohort__failure_from_reply(&f, COHORT_EPEERLOST, &rep);
	ck_assert_str_eq(f.text, "rank 3 failed: boom");
	cohort__failure_from_reply(&f, COHORT_EPEERLOST, NULL);
	ck_assert_str_eq(f.text, cohort_strerror(COHORT_EPEERLOST));
	/* not a member's failure */
	rep.status = COHORT_ESTALE;
	rep.error = "job 'j' moved to generation 4";
	cohort__failure_from_reply(&f, COHORT_ESTALE, &rep);
	ck_assert_int_eq(f.kind, COHORT_FAILURE_GENERATION);
	ck_assert_int_eq(f.rank, -1);
	ck_assert_str_eq(f.text, "job 'j' moved to generation 4");
}
END_TEST

/* Regression: cohort_group_last_error rewrote one buffer per group after
 * unlocking, so a caller's text changed under it when another thread
 * asked for the same group's. Now each thread has its own. */
struct lt_arg {
	struct cohort_group *g;
	pthread_barrier_t *bar;
	const char *p;
	char copy[1024];
};

/* Asks, then stays alive (its buffer with it) until the test checked. */
static void *
lt_main(void *arg)
{
	struct lt_arg *a = arg;

	a->p = cohort_group_last_error(a->g);
	cohort__strlcpy(a->copy, a->p, sizeof(a->copy));
	pthread_barrier_wait(a->bar);
	pthread_barrier_wait(a->bar);
	return (NULL);
}

START_TEST(test_last_error_is_per_thread)
{
	struct gt *t = gt_new("", 0, 3, NULL);
	struct lt_arg a = { 0 }, b = { 0 };
	const char *mine;
	char before[1024];
	pthread_barrier_t bar;
	pthread_t ta, tb;
	cohort_failure v;

	gt_verdict(&v);
	cohort__group_fail(t->g, &v);
	mine = cohort_group_last_error(t->g);
	cohort__strlcpy(before, mine, sizeof(before));
	ck_assert_ptr_nonnull(strstr(before, "(0.0 s ago)"));
	/* the age the others see has moved on */
	usleep(250 * 1000);
	a.g = b.g = t->g;
	a.bar = b.bar = &bar;
	ck_assert_int_eq(pthread_barrier_init(&bar, NULL, 3), 0);
	ck_assert_int_eq(pthread_create(&ta, NULL, lt_main, &a), 0);
	ck_assert_int_eq(pthread_create(&tb, NULL, lt_main, &b), 0);
	pthread_barrier_wait(&bar);
	ck_assert_ptr_ne(a.p, mine);
	ck_assert_ptr_ne(a.p, b.p);
	ck_assert_ptr_null(strstr(a.copy, "(0.0 s ago)"));
	ck_assert_str_eq(mine, before);
	ck_assert_str_eq(a.p, a.copy);
	ck_assert_str_eq(b.p, b.copy);
	pthread_barrier_wait(&bar);
	pthread_join(ta, NULL);
	pthread_join(tb, NULL);
	pthread_barrier_destroy(&bar);
	gt_free(t);
}
END_TEST

UNIT_SUITE(group, "group", 30, test_healthy_group_has_no_failure,
    test_failure_api_checks_its_arguments, test_first_failure_wins_unmerged,
    test_group_rank_of_the_failed_rank, test_abort_is_sticky_and_says_so,
    test_age_counts_from_the_failure, test_text_of_each_kind, test_kind_names,
    test_record_from_a_reply, test_last_error_is_per_thread)
