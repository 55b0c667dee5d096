/*
 * test_observe.c - per-rank metrics end to end in the C suite (the
 * format checks, the timeline and the status page in a browser are in
 * python/tests/test_observe.py): a real cohortd with --http (under
 * valgrind with COHORT_TEST_VALGRIND=1: no leak of the new state), two
 * real workers that issue a known number of collectives, then /metrics
 * must count exactly those per rank, and /status.json must answer only
 * with the job's token.
 */
#include <arpa/inet.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "check_cohort.h"

static int http_port;

static void
setup(void)
{
	static char addr[64], tokfile[300];
	static char jobspec[400];
	const char *args[8];
	FILE *f;

	http_port = th_free_port();
	snprintf(addr, sizeof(addr), "127.0.0.1:%d", http_port);
	snprintf(tokfile, sizeof(tokfile), "%s/obs-token", th_tmpdir());
	ck_assert_ptr_nonnull(f = fopen(tokfile, "w"));
	fputs("obs-secret", f);
	fclose(f);
	snprintf(jobspec, sizeof(jobspec), "secured:@%s", tokfile);
	args[0] = "--http";
	args[1] = addr;
	args[2] = "--job";
	args[3] = jobspec;
	args[4] = "--metrics-per-job";
	args[5] = NULL;
	th_coord_start(&th_fx_coord, args);
}

/* GET path with an optional Authorization header; the whole response
 * (headers and body, malloc'd) or NULL. */
static char *
obs_http_get(const char *path, const char *auth)
{
	char req[512], *buf = NULL;
	size_t len = 0, cap = 0;
	int fd;
	ssize_t n;

	if ((fd = th_tcp_connect(http_port)) < 0)
		return (NULL);
	snprintf(req, sizeof(req),
	    "GET %s HTTP/1.1\r\nHost: 127.0.0.1\r\n%s%s%sConnection: "
	    "close\r\n\r\n",
	    path, auth ? "Authorization: Bearer " : "", auth ? auth : "",
	    auth ? "\r\n" : "");
	if (write(fd, req, strlen(req)) != (ssize_t)strlen(req)) {
		close(fd);
		return (NULL);
	}
	for (;;) {
		if (cap - len < 4096) {
			char *nb = realloc(buf, cap + 65536);
			if (nb == NULL)
				break;
			buf = nb;
			cap += 65536;
		}
		if ((n = read(fd, buf + len, cap - len - 1)) <= 0)
			break;
		len += (size_t)n;
	}
	close(fd);
	if (buf != NULL)
		buf[len] = '\0';
	return (buf);
}

/* The value of the sample line `name{labels} VALUE`, or -1. */
static long
obs_sample(const char *text, const char *series)
{
	const char *p = text;
	size_t sl = strlen(series);

	while ((p = strstr(p, series)) != NULL) {
		if ((p == text || p[-1] == '\n') && p[sl] == ' ')
			return (strtol(p + sl + 1, NULL, 10));
		p += sl;
	}
	return (-1);
}

START_TEST(test_metrics_count_each_rank)
{
	struct th_workers w;
	char *text;
	static const char *const ops[][2] = { { "allreduce", "7" },
		{ "broadcast", "4" }, { "allgather", "1" }, { "barrier", "2" },
		{ "decide", "1" } };

	th_workers_start(
	    &w, &th_fx_coord, "obs-c", NULL, 2, "observe", "7", NULL);
	ck_assert_int_eq(th_workers_wait(&w, 90000), 2);
	for (int r = 0; r < 2; r++) {
		char want[128];

		snprintf(want, sizeof(want),
		    "RESULT observe rank=%d allreduce=7 broadcast=4", r);
		ck_assert_msg(th_worker_output_has(&w, r, want), "rank %d", r);
	}
	text = obs_http_get("/metrics", NULL);
	ck_assert_ptr_nonnull(text);
	ck_assert_ptr_nonnull(strstr(text, "200 OK"));
	ck_assert_ptr_nonnull(strstr(text, "\ncohort_build_info{version=\""));
	for (int r = 0; r < 2; r++) {
		for (size_t k = 0; k < sizeof(ops) / sizeof(ops[0]); k++) {
			char series[160];

			snprintf(series, sizeof(series),
			    "cohort_rank_collectives_total{job=\"obs-c\","
			    "rank=\"%d\",op=\"%s\"}",
			    r, ops[k][0]);
			ck_assert_msg(obs_sample(text, series)
			        == strtol(ops[k][1], NULL, 10),
			    "%s: %ld, want %s", series,
			    obs_sample(text, series), ops[k][1]);
		}
	}
	free(text);
}
END_TEST

START_TEST(test_status_json_needs_the_token)
{
	struct th_workers w;
	char *text;

	th_workers_start(&w, &th_fx_coord, "secured", "obs-secret", 2,
	    "observe", "3", NULL);
	ck_assert_int_eq(th_workers_wait(&w, 90000), 2);
	text = obs_http_get("/status.json?job=secured", NULL);
	ck_assert_ptr_nonnull(text);
	ck_assert_msg(strstr(text, " 401 ") != NULL, "%.400s", text);
	ck_assert_ptr_null(strstr(text, "\"members\""));
	free(text);
	text = obs_http_get("/status.json?job=secured", "wrong");
	ck_assert_ptr_nonnull(strstr(text, " 401 "));
	free(text);
	text = obs_http_get("/status.json?job=secured", "obs-secret");
	ck_assert_ptr_nonnull(text);
	ck_assert_msg(strstr(text, " 200 ") != NULL, "%.400s", text);
	ck_assert_ptr_nonnull(strstr(text, "\"job\":\"secured\""));
	ck_assert_ptr_nonnull(strstr(text, "\"state\":\"finished\""));
	ck_assert_ptr_nonnull(strstr(text, "\"collectives\":9"));
	free(text);
	text = obs_http_get("/", NULL);
	ck_assert_ptr_nonnull(strstr(text, "text/html"));
	ck_assert_ptr_nonnull(strstr(text, "status.json"));
	free(text);
}
END_TEST

Suite *suite_integration_observe(void);

Suite *
suite_integration_observe(void)
{
	return (th_suite("integration_observe", "metrics", 180, setup,
	    th_fx_teardown, test_metrics_count_each_rank,
	    test_status_json_needs_the_token, NULL));
}
