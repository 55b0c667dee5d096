/*
 * test_heartbeat.c - client/heartbeat.c (one heartbeat thread per process
 * for all its clients) and the KV multi-get of the data plane's
 * rendezvous, against real cohortd cores embedded in the test
 * (tests/harness/cl_fixture.h: heartbeat 100 ms, dead-after 1 s).
 */
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include "cl_fixture.h"
#include "client.h"
#include "launch.h"
#include "unit_suite.h"

Suite *suite_heartbeat(void);

/* Threads of this process named `name`. */
static int
hb_threads_named(const char *name)
{
	int n = cohort__threads_named(name, false);

	ck_assert_int_ge(n, 0); /* /proc/self/task readable */
	return (n);
}

static void
hb_sleep_ms(int ms)
{
	struct timespec ts = { ms / 1000, (long)(ms % 1000) * 1000000L };

	nanosleep(&ts, NULL);
}

/* Eight clients of one process: one heartbeat thread beats for all of
 * them, and they stay alive well past dead-after. */
START_TEST(test_one_thread_beats_for_every_client)
{
	struct clx x;

	clx_start(&x, "hb-one");
	clx_join(&x, 8);
	ck_assert_int_eq(hb_threads_named("cohort:hb"), 1);
	hb_sleep_ms(3 * 1000); /* three times dead-after */
	for (int r = 0; r < 8; r++)
		ck_assert_cohort_ok(cohort_client_error(x.c[r]));
	ck_assert_cohort_ok(cohort_kv_set(x.c[7], "alive", "y", 1, 2000));
	ck_assert_int_eq(hb_threads_named("cohort:hb"), 1);
	clx_stop(&x);
}
END_TEST

/* A client thread that holds its client's lock (here on purpose; on a
 * starved machine, a thread preempted inside a short critical section)
 * must not silence the other clients of the process: the heartbeat
 * thread skips the busy client and beats for the others. Two jobs at two
 * cohortds, so that the held one's fate does not reach the other. */
START_TEST(test_held_lock_does_not_silence_the_process)
{
	struct clx a, b;

	clx_start(&a, "hb-held");
	clx_start(&b, "hb-free");
	clx_join(&a, 1);
	clx_join(&b, 1);
	pthread_mutex_lock(&a.c[0]->mtx);
	hb_sleep_ms(2500); /* two and a half times dead-after */
	pthread_mutex_unlock(&a.c[0]->mtx);
	/* b beat all along: cohortd never declared it dead */
	ck_assert_cohort_ok(cohort_client_error(b.c[0]));
	ck_assert_cohort_ok(cohort_kv_set(b.c[0], "still", "here", 4, 2000));
	clx_stop(&a);
	clx_stop(&b);
}
END_TEST

struct hb_late_set {
	cohort_client *c;
	int after_ms;
};

static void *
hb_late_set_main(void *arg)
{
	struct hb_late_set *s = arg;

	hb_sleep_ms(s->after_ms);
	(void)cohort__kv_set(s->c, "__cohort/t/b", "2", 1, 2000);
	return (NULL);
}

/* cohort__kv_multi_get: every value in the order asked, waiting for the
 * ones not there yet; a key that never comes is ETIMEDOUT naming it. */
START_TEST(test_multi_get_waits_for_every_key)
{
	const char *keys[]
	    = { "__cohort/t/a", "__cohort/t/b", "__cohort/t/c" };
	const char *missing[] = { "__cohort/t/a", "__cohort/t/never" };
	struct hb_late_set late;
	pthread_t th;
	void *vals[3];
	size_t lens[3];
	struct clx x;

	clx_start(&x, "hb-mget");
	clx_join(&x, 1);
	ck_assert_cohort_ok(cohort__kv_set(x.c[0], keys[0], "1", 1, 2000));
	ck_assert_cohort_ok(cohort__kv_set(x.c[0], keys[2], "333", 3, 2000));
	late.c = x.c[0];
	late.after_ms = 300;
	ck_assert_int_eq(
	    pthread_create(&th, NULL, hb_late_set_main, &late), 0);
	ck_assert_cohort_ok(
	    cohort__kv_multi_get(x.c[0], keys, 3, vals, lens, 5000));
	pthread_join(th, NULL);
	ck_assert_uint_eq(lens[0], 1);
	ck_assert_uint_eq(lens[1], 1);
	ck_assert_uint_eq(lens[2], 3);
	ck_assert_mem_eq(vals[0], "1", 1);
	ck_assert_mem_eq(vals[1], "2", 1);
	ck_assert_mem_eq(vals[2], "333", 3);
	for (int i = 0; i < 3; i++)
		free(vals[i]);
	ck_assert_cohort_err(
	    cohort__kv_multi_get(x.c[0], missing, 2, vals, lens, 300),
	    COHORT_ETIMEDOUT);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "never"));
	ck_assert_ptr_null(vals[0]);
	ck_assert_ptr_null(vals[1]);
	clx_stop(&x);
}
END_TEST

UNIT_SUITE(heartbeat, "heartbeat", 60, test_one_thread_beats_for_every_client,
    test_held_lock_does_not_silence_the_process,
    test_multi_get_waits_for_every_key)
