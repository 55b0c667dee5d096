/*
 * test_elastic.c - elastic jobs end to end on one machine: a real cohortd,
 * one `cohort run --nnodes MIN:MAX --node-rank R -n 1` per "node" (all on
 * loopback), and the demo trainer (examples/train_digits) in its elastic
 * loop (docs/elastic.md):
 *
 *  - a fault-free elastic run ends with the parameters of a plain one;
 *  - a worker killed mid-training (a fault schedule: action=kill) is lost,
 *    the survivors go on in the same processes, its launcher restarts it
 *    (--max-restarts), it is admitted at a step boundary, receives the
 *    state from a survivor, and all end with equal parameters;
 *  - two workers lost at once leave fewer than the minimum: every process
 *    stops, none hangs, and the launchers' reports say the job fell below
 *    its minimum.
 *
 * The multi-host variants (namespace hosts, a host's link pulled, cohortd
 * restarted during a change) are tests/hosts/test_elastic.py.
 */
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"

#define EL_NODES_MAX 4

/* One job of nodes, each a `cohort run` of one worker. */
struct el_job {
	struct th_coord coord;
	int n;
	pid_t pid[EL_NODES_MAX];
	char out[EL_NODES_MAX][300];
};

/* Starts node r of job `job` (--nnodes range) training with args (NULL
 * terminated); extra: environment of this node (may be NULL). */
static void
el_node(struct el_job *j, int r, const char *job, const char *range,
    const char *const *run_extra, const char *const *args,
    const char *const *extra)
{
	char rank[16];
	char *argv[48], *env[16];
	int n = 0, e = 0;

	snprintf(rank, sizeof(rank), "%d", r);
	argv[n++] = (char *)th_bin("cohort");
	argv[n++] = "run";
	argv[n++] = "--nnodes";
	argv[n++] = (char *)range;
	argv[n++] = "--node-rank";
	argv[n++] = rank;
	argv[n++] = "-n";
	argv[n++] = "1";
	argv[n++] = "--coordinator";
	argv[n++] = j->coord.url;
	argv[n++] = "--job";
	argv[n++] = (char *)job;
	for (int i = 0; run_extra != NULL && run_extra[i] != NULL; i++)
		argv[n++] = (char *)run_extra[i];
	argv[n++] = "--";
	argv[n++] = (char *)th_bin("train_digits");
	for (int i = 0; args[i] != NULL && n < 46; i++)
		argv[n++] = (char *)args[i];
	argv[n] = NULL;
	env[e++] = "COHORT_HEARTBEAT_MS=200";
	env[e++] = "COHORT_DEAD_AFTER_MS=1500";
	env[e++] = "COHORT_DATA_ADDR=127.0.0.1";
	env[e++] = "COHORT_LOG_FORMAT=text";
	for (int i = 0; extra != NULL && extra[i] != NULL && e < 15; i++)
		env[e++] = (char *)extra[i];
	env[e] = NULL;
	snprintf(j->out[r], sizeof(j->out[r]), "%s/%s-node%d.out", th_tmpdir(),
	    job, r);
	j->pid[r] = th_spawn(argv, env, j->out[r]);
}

/* Waits for every node (bounded); their exit codes into rc. */
static void
el_wait(struct el_job *j, int timeout_ms, int *rc)
{
	int64_t end = th_now_ms() + timeout_ms;

	for (int r = 0; r < j->n; r++) {
		int st;
		int64_t left = end - th_now_ms();

		if (!th_wait(j->pid[r], left > 0 ? (int)left : 1, &st)) {
			for (int k = 0; k < j->n; k++)
				th_kill(j->pid[k]);
			ck_abort_msg("node %d still running after %d ms", r,
			    timeout_ms);
		}
		rc[r] = th_exit_code(st);
	}
}

static char *
el_out(const struct el_job *j, int r)
{
	char *o = th_read_file(j->out[r]);

	ck_assert_ptr_nonnull(o);
	return (o);
}

/* The checksum in "parameter checksums: 0:XXXX" of output o. */
static unsigned long long
el_checksum(const char *o)
{
	const char *p = strstr(o, "parameter checksums: 0:");
	unsigned long long x = 0;

	ck_assert_msg(p != NULL, "no checksums in:\n%s", o);
	ck_assert_int_eq(sscanf(p, "parameter checksums: 0:%llx", &x), 1);
	return (x);
}

/* The pid after `key` ("pid 123") at its first and last occurrence. */
static int
el_pid_after(const char *o, const char *key, bool last)
{
	const char *p = strstr(o, key), *q;
	int pid = -1;

	while (last && p != NULL && (q = strstr(p + 1, key)) != NULL)
		p = q;
	if (p != NULL && (p = strstr(p, "pid ")) != NULL)
		sscanf(p, "pid %d", &pid);
	return (pid);
}

static const char *const el_train[] = { "--epochs", "6", "--batch", "96",
	"--pace", "15", "--log-steps", NULL };

START_TEST(test_elastic_fault_free_matches_a_plain_run)
{
	struct el_job j;
	static const char *const plain_args[]
	    = { "--epochs", "4", "--batch", "96", "--quiet", NULL };
	char *argv[16], out[300], *o;
	unsigned long long plain, el;
	int n = 0, st, rc[EL_NODES_MAX];

	/* the plain run: one launcher, 3 local workers */
	argv[n++] = (char *)th_bin("cohort");
	argv[n++] = "run";
	argv[n++] = "-n";
	argv[n++] = "3";
	argv[n++] = "--";
	argv[n++] = (char *)th_bin("train_digits");
	for (int i = 0; plain_args[i] != NULL; i++)
		argv[n++] = (char *)plain_args[i];
	argv[n] = NULL;
	snprintf(out, sizeof(out), "%s/plain.out", th_tmpdir());
	{
		char *env[] = { "COHORT_DATA_ADDR=127.0.0.1", NULL };
		pid_t p = th_spawn(argv, env, out);

		ck_assert(th_wait(p, 120000, &st));
	}
	o = th_read_file(out);
	ck_assert_int_eq(th_exit_code(st), 0);
	plain = el_checksum(o);
	free(o);

	memset(&j, 0, sizeof(j));
	th_coord_start(&j.coord, NULL);
	j.n = 3;
	for (int r = 0; r < 3; r++)
		el_node(&j, r, "elff", "2:3", NULL, plain_args, NULL);
	el_wait(&j, 120000, rc);
	for (int r = 0; r < 3; r++) {
		o = el_out(&j, r);
		ck_assert_msg(rc[r] == 0, "node %d: %d\n%s", r, rc[r], o);
		ck_assert_has(o, "elastic 2:3");
		if (r == 0) {
			el = el_checksum(o);
			ck_assert_msg(el == plain,
			    "elastic %016llx, plain %016llx", el, plain);
			ck_assert_has(o, "all equal: yes");
		}
		free(o);
	}
	th_coord_stop(&j.coord);
}
END_TEST

START_TEST(test_elastic_killed_worker_restarts_and_rejoins)
{
	struct el_job j;
	static const char *const restart[] = { "--max-restarts", "1", NULL };
	static const char *const kill2[]
	    = { "COHORT_FAULTS=rank=2,at=op:60,action=kill", NULL };
	int rc[EL_NODES_MAX];
	char *o[3];

	memset(&j, 0, sizeof(j));
	th_coord_start(&j.coord, NULL);
	j.n = 3;
	el_node(&j, 0, "elkr", "2:3", NULL, el_train, NULL);
	el_node(&j, 1, "elkr", "2:3", NULL, el_train, NULL);
	el_node(&j, 2, "elkr", "2:3", restart, el_train, kill2);
	el_wait(&j, 180000, rc);
	for (int r = 0; r < 3; r++)
		o[r] = el_out(&j, r);
	for (int r = 0; r < 3; r++)
		ck_assert_msg(
		    rc[r] == 0, "node %d exited %d:\n%s", r, rc[r], o[r]);
	/* node 2: killed, restarted, admitted, given the state */
	ck_assert_msg(strstr(o[2], "killed by signal 9") != NULL
	        && strstr(o[2], "restarting it (1 of 1)") != NULL,
	    "%s", o[2]);
	ck_assert_has(o[2], "received the state from rank");
	/* the survivors went on in the same processes, and took it back */
	for (int r = 0; r < 2; r++) {
		int first = el_pid_after(o[r], "elastic 2:3", false);
		int done = el_pid_after(o[r], " done at generation", true);

		ck_assert_has(o[r], ", lost 1");
		ck_assert_has(o[r], ", joined 1");
		ck_assert_msg(first > 0 && first == done,
		    "node %d: pid %d at the start, %d at the end:\n%s", r,
		    first, done, o[r]);
	}
	ck_assert_has(o[0], "rank 0 of 3 done");
	ck_assert_has(o[0], "all equal: yes");
	ck_assert_has(o[0], "sent the state to 1 rank");
	for (int r = 0; r < 3; r++)
		free(o[r]);
	th_coord_stop(&j.coord);
}
END_TEST

START_TEST(test_elastic_below_the_minimum_stops_every_node)
{
	struct el_job j;
	static const char *const kill1[]
	    = { "COHORT_FAULTS=rank=1,at=op:40,action=kill", NULL };
	static const char *const kill2[]
	    = { "COHORT_FAULTS=rank=2,at=op:40,action=kill", NULL };
	int rc[EL_NODES_MAX];
	int64_t t0;
	char *o;

	memset(&j, 0, sizeof(j));
	th_coord_start(&j.coord, NULL);
	j.n = 3;
	t0 = th_now_ms();
	el_node(&j, 0, "elmin", "2:3", NULL, el_train, NULL);
	el_node(&j, 1, "elmin", "2:3", NULL, el_train, kill1);
	el_node(&j, 2, "elmin", "2:3", NULL, el_train, kill2);
	el_wait(&j, 120000, rc);
	o = el_out(&j, 0);
	ck_assert_msg(rc[0] == 250, "node 0 exited %d:\n%s", rc[0], o);
	ck_assert_has(o, "fell below its minimum of 2 ranks");
	ck_assert_has(o, "minimum");
	free(o);
	/* the killed workers' nodes: their own worker's signal, or, when
	 * cohortd names the other node's rank as what ended the job, the
	 * peer's (250), as for a fixed job */
	for (int r = 1; r < 3; r++) {
		o = el_out(&j, r);
		ck_assert_msg(rc[r] == 137 || rc[r] == 250,
		    "node %d exited %d:\n%s", r, rc[r], o);
		ck_assert_has(o, "killed by signal 9");
		free(o);
	}
	printf("elastic below the minimum: every node stopped after %.1f s\n",
	    (double)(th_now_ms() - t0) / 1000.0);
	th_coord_stop(&j.coord);
}
END_TEST

/* `cohort run --nnodes` refuses a range it cannot mean, before starting
 * anything; N:N is a fixed job. */
START_TEST(test_elastic_bad_ranges_are_refused)
{
	static const char *const bad[]
	    = { "4:3", "0:2", "2:", ":3", "a:b", "1:2:3", NULL };
	char out[300], *o;

	for (int i = 0; bad[i] != NULL; i++) {
		char *argv[] = { (char *)th_bin("cohort"), "run", "--nnodes",
			(char *)bad[i], "-n", "1", "--coordinator",
			"tcp://127.0.0.1:1", "--job", "x", "--", "/bin/true",
			NULL };
		int st;

		snprintf(out, sizeof(out), "%s/bad%d.out", th_tmpdir(), i);
		ck_assert(th_wait(th_spawn(argv, NULL, out), 10000, &st));
		o = th_read_file(out);
		ck_assert_msg(th_exit_code(st) == 2, "--nnodes %s: %d\n%s",
		    bad[i], th_exit_code(st), o);
		ck_assert_has(o, "N or MIN:MAX");
		free(o);
	}
	/* --node-rank counts up to the maximum */
	{
		char *argv[] = { (char *)th_bin("cohort"), "run", "--nnodes",
			"2:3", "--node-rank", "3", "-n", "1", "--coordinator",
			"tcp://127.0.0.1:1", "--job", "x", "--", "/bin/true",
			NULL };
		int st;

		snprintf(out, sizeof(out), "%s/badrank.out", th_tmpdir());
		ck_assert(th_wait(th_spawn(argv, NULL, out), 10000, &st));
		o = th_read_file(out);
		ck_assert_int_eq(th_exit_code(st), 2);
		ck_assert_has(o, "--node-rank 3 >= --nnodes 3 (the maximum)");
		free(o);
	}
}
END_TEST

Suite *suite_integration_elastic(void);

Suite *
suite_integration_elastic(void)
{
	return (th_suite("integration_elastic", "elastic", 300, NULL, NULL,
	    test_elastic_fault_free_matches_a_plain_run,
	    test_elastic_killed_worker_restarts_and_rejoins,
	    test_elastic_below_the_minimum_stops_every_node,
	    test_elastic_bad_ranges_are_refused, NULL));
}
