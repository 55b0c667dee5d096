/*
 * test_bench_join.c - `cohort bench --op join` end to end (the built
 * binary, its embedded coordinator, real join processes): N clients in P
 * processes join, pass a barrier, and the three joins that also time the
 * first all-reduce after it all go through (issue 24: that all-reduce
 * sets up the data plane - listeners, a KV multi-get of the partners'
 * addresses, the recursive-doubling connections - while every process's
 * one heartbeat thread keeps its clients alive). Small enough for a
 * test: 96 clients (above the 64 of the full mesh, so the lazy partner
 * connections are what runs) in 4 processes.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

Suite *suite_integration_bench_join(void);

START_TEST(test_join_then_first_allreduce_goes_through)
{
	char out[] = "/tmp/cohort-bench-join-XXXXXX";
	char *argv[]
	    = { (char *)th_bin("cohort"), "bench", "-n", "96", "--op", "join",
		      "--procs", "4", "--iters", "2", "--warmup", "1", NULL };
	int fd = mkstemp(out), status;
	char *o;
	pid_t p;

	ck_assert_int_ge(fd, 0);
	close(fd);
	p = th_spawn(argv, NULL, out);
	ck_assert_msg(th_wait(p, 120000, &status), "bench still running");
	o = th_read_file(out);
	ck_assert_msg(th_exit_code(status) == 0, "exit %d: %s",
	    th_exit_code(status), o != NULL ? o : "");
	/* every all-reduce join went through, none lost a member */
	ck_assert_has(o, "median of the 3 of 3 more joins that went through");
	ck_assert_msg(strstr(o, "no heartbeat") == NULL, "%s", o);
	ck_assert_msg(strstr(o, "-1.0") == NULL, "%s", o);
	free(o);
	unlink(out);
}
END_TEST

Suite *
suite_integration_bench_join(void)
{
	return (th_suite("integration_bench_join", "bench_join", 180, NULL,
	    NULL, test_join_then_first_allreduce_goes_through, NULL));
}
