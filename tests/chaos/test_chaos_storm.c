/*
 * test_chaos_storm.c - the coordinator kill storm (issue 22 finding 7):
 * `cohort run -n 4` trains the examples' MLP with cohort_ddp
 * (cohort-strategy-worker ddp: a synthetic, deterministic data set, so no
 * download) against a cohortd with --state-dir that is killed with
 * SIGKILL every second and started again at once, for the length of the
 * storm. Every worker must finish (none crashes: before, 2 of 13 runs had
 * a worker segfault in the watch's reply path) with the same final
 * parameters as a run without a storm.
 *
 * CI: one run with a 6 s storm. `make chaos` (COHORT_CHAOS=full): 20 runs
 * of a 60 s storm (about 25 minutes); COHORT_CHAOS_RUNS and
 * COHORT_CHAOS_STORM_S set other sizes. The training is sized to outlast
 * the storm (calibrated by a short run first).
 */
#include <sys/stat.h>

#include "chaos.h"

Suite *suite_chaos_storm(void);

struct storm {
	char dir[300];
	char url[64];
	int port;
	pid_t coord;
	int restarts;
	char clog[300];
};

static void
st_coord_start(struct storm *s)
{
	char *argv[12];
	int n = 0;

	argv[n++] = (char *)th_bin("cohortd");
	argv[n++] = "--listen";
	argv[n++] = s->url;
	argv[n++] = "--state-dir";
	argv[n++] = s->dir;
	argv[n++] = "--job";
	argv[n++] = "storm:";
	argv[n++] = "--log-level";
	argv[n++] = "warn";
	argv[n] = NULL;
	s->coord = th_spawn(argv, NULL, s->clog);
	for (int i = 0; i < 500 && !th_port_open(s->port); i++) {
		int st;
		if (th_wait(s->coord, 0, &st)) {
			/* the port of the killed one still held: again */
			usleep(20 * 1000);
			s->coord = th_spawn(argv, NULL, s->clog);
			continue;
		}
		usleep(2000);
	}
}

/* cohort run -n 4 -- cohort-strategy-worker ddp - steps=STEPS; its pid. */
static pid_t
st_run(struct storm *s, int epochs, const char *out)
{
	char ep[32], *argv[16];
	int n = 0;

	snprintf(ep, sizeof(ep), "steps=%d", epochs);
	argv[n++] = (char *)th_bin("cohort");
	argv[n++] = "run";
	argv[n++] = "-n";
	argv[n++] = "4";
	argv[n++] = "--coordinator";
	argv[n++] = s->url;
	argv[n++] = "--job";
	argv[n++] = "storm";
	argv[n++] = "--";
	argv[n++] = (char *)th_bin("cohort-strategy-worker");
	argv[n++] = "ddp";
	argv[n++] = "-";
	argv[n++] = ep;
	argv[n] = NULL;
	return (th_spawn(argv, NULL, out));
}

/* The four ranks' "RESULT rank=R world=4 checksum=X" lines of out: the
 * checksum if all four printed the same; false otherwise. */
static bool
st_checksum(const char *out, char *sum, size_t len)
{
	char *o = th_read_file(out), *p;
	int n = 0;
	bool ok = o != NULL;

	sum[0] = '\0';
	for (p = o; ok && p != NULL && (p = strstr(p, "RESULT rank=")) != NULL;
	     p++) {
		char *c = strstr(p, "checksum=");
		if (c == NULL)
			break;
		c += strlen("checksum=");
		if (sum[0] == '\0')
			snprintf(sum, len, "%.16s", c);
		else if (strncmp(sum, c, 16) != 0)
			ok = false;
		n++;
	}
	free(o);
	return (ok && n == 4);
}

/* Whether out says a worker died of a signal. */
static bool
st_crashed(const char *out)
{
	return (th_file_has(out, "signal") || th_file_has(out, "SIGSEGV")
	    || th_file_has(out, "core dumped"));
}

static void
st_init(struct storm *s, const char *tag)
{
	memset(s, 0, sizeof(*s));
	snprintf(s->dir, sizeof(s->dir), "%s/state-%s", th_tmpdir(), tag);
	s->port = th_free_port();
	snprintf(s->url, sizeof(s->url), "tcp://127.0.0.1:%d", s->port);
	snprintf(
	    s->clog, sizeof(s->clog), "%s/cohortd-%s.log", th_tmpdir(), tag);
}

/* A run without a storm: its duration (ms) and checksum. */
static int64_t
st_reference(int epochs, char *sum, size_t len)
{
	struct storm s;
	char out[300];
	int64_t t0;
	pid_t run;
	int st;

	st_init(&s, "ref");
	snprintf(out, sizeof(out), "%s/run-ref.out", th_tmpdir());
	st_coord_start(&s);
	t0 = th_now_ms();
	run = st_run(&s, epochs, out);
	ck_assert_msg(th_wait(run, 600000, &st), "reference run hangs");
	ck_assert_msg(th_exit_code(st) == 0 && st_checksum(out, sum, len),
	    "reference run: exit %d: %s", th_exit_code(st), th_read_file(out));
	t0 = th_now_ms() - t0;
	th_kill(s.coord);
	return (t0);
}

START_TEST(test_kill_storm_under_training)
{
	/* COHORT_CHAOS_RUNS / COHORT_CHAOS_STORM_S: another size */
	int runs = getenv("COHORT_CHAOS_RUNS") != NULL
	    ? (int)strtol(getenv("COHORT_CHAOS_RUNS"), NULL, 10)
	    : (int)chaos_n(1, 20);
	int storm_s = getenv("COHORT_CHAOS_STORM_S") != NULL
	    ? (int)strtol(getenv("COHORT_CHAOS_STORM_S"), NULL, 10)
	    : (int)chaos_n(6, 60);
	int epochs = 1000, crashed = 0, failed = 0, same = 0, kills = 0;
	int64_t storm_ms_min = 0;
	char ref[32];
	int64_t d;

	/* The training outlasts the storm by a few seconds: the step count
	 * is scaled from a measured run until one lasts long enough (a
	 * short run's start-up makes one scaling overshoot the step time). */
	d = st_reference(epochs, ref, sizeof(ref));
	for (int i = 0; i < 4 && d < (storm_s + 4) * 1000; i++) {
		epochs = (int)((double)epochs * (storm_s + 6) * 1000.0
		    / (double)(d > 50 ? d : 50));
		if (epochs < 1000)
			epochs = 1000;
		d = st_reference(epochs, ref, sizeof(ref));
	}
	printf("CHAOS storm: reference run of %d steps: %lld ms, checksum "
	       "%s\n",
	    epochs, (long long)d, ref);
	for (int r = 0; r < runs; r++) {
		struct storm s;
		char tag[16], out[300], sum[32] = "";
		int st, k = 0;
		pid_t run;
		int64_t end, t0;

		snprintf(tag, sizeof(tag), "run%d", r);
		st_init(&s, tag);
		snprintf(out, sizeof(out), "%s/run-%d.out", th_tmpdir(), r);
		st_coord_start(&s);
		run = st_run(&s, epochs, out);
		t0 = th_now_ms();
		end = t0 + storm_s * 1000;
		while (th_now_ms() < end) {
			usleep(1000 * 1000);
			if (th_wait(run, 0, &st)) {
				run = -1;
				break;
			}
			kill(s.coord, SIGKILL);
			(void)th_wait(s.coord, 5000, NULL);
			k++;
			st_coord_start(&s);
		}
		kills += k;
		t0 = th_now_ms() - t0; /* how long the storm really lasted */
		storm_ms_min = r == 0 || t0 < storm_ms_min ? t0 : storm_ms_min;
		if (run > 0 && !th_wait(run, 300000, &st)) {
			th_kill(run);
			st = -1;
		}
		th_kill(s.coord);
		if (st_crashed(out))
			crashed++;
		if (st == -1 || th_exit_code(st) != 0
		    || !st_checksum(out, sum, sizeof(sum))) {
			failed++;
			printf("CHAOS storm: run %d: exit %d\n%s\n", r,
			    st == -1 ? -1 : th_exit_code(st),
			    th_read_file(out));
		} else if (strcmp(sum, ref) == 0) {
			same++;
		}
		printf("CHAOS storm: run %d: cohortd killed %d times in %.1f "
		       "s, exit %d, checksum %s (%s)\n",
		    r, k, (double)t0 / 1000.0,
		    st == -1 ? -1 : th_exit_code(st), sum,
		    strcmp(sum, ref) == 0 ? "as without the storm"
		                          : "DIFFERENT");
	}
	printf("CHAOS storm: %d runs of cohort run -n 4 (DDP training, %d "
	       "steps) with cohortd killed every second for %d s (the "
	       "shortest storm lasted %.1f s; %d kills in all): %d runs with "
	       "a crashed worker, %d failed, %d of %d with the parameters of "
	       "the run without a storm\n",
	    runs, epochs, storm_s, (double)storm_ms_min / 1000.0, kills,
	    crashed, failed, same, runs);
	ck_assert_int_eq(crashed, 0);
	ck_assert_int_eq(failed, 0);
	ck_assert_int_eq(same, runs);
	/* At the size every storm lasts its whole time (the
	 * training outlasted it); the small CI run only prints it. */
	if (chaos_full())
		ck_assert_int_ge(storm_ms_min, (int64_t)(storm_s - 1) * 1000);
}
END_TEST

Suite *
suite_chaos_storm(void)
{
	Suite *s = suite_create("chaos_storm");

	th_suite_case(s, "storm",
	    chaos_full() || getenv("COHORT_CHAOS_RUNS") != NULL ? 7200 : 300,
	    NULL, NULL, test_kill_storm_under_training, NULL);
	return (s);
}
