/*
 * test_chaos_tenancy.c - a job's state ends with the job (issue 22
 * finding 8): tenant A's job fails with a text and expires; tenant B's
 * new job of the same name (another token) sees nothing of A's in
 * /status.json (before: A's failure text). The admin's view of all jobs
 * still lists A's failure, under A's job.
 */
#include "chaos.h"

Suite *suite_chaos_tenancy(void);

/* GET path with a bearer token from port: the whole response (malloc'd).
 */
static char *
ct_get(int port, const char *path, const char *token)
{
	char req[512], *buf = calloc(1, 1 << 16);
	size_t got = 0;
	int fd = chaos_connect_from(NULL, port);

	ck_assert_int_ge(fd, 0);
	snprintf(req, sizeof(req),
	    "GET %s HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer %s\r\n"
	    "Connection: close\r\n\r\n",
	    path, token);
	ck_assert(chaos_send_all(fd, req, strlen(req), 3000));
	for (;;) {
		struct pollfd pf = { fd, POLLIN, 0 };
		ssize_t k;
		if (poll(&pf, 1, 3000) != 1)
			break;
		if ((k = recv(fd, buf + got, (1 << 16) - 1 - got, 0)) <= 0)
			break;
		got += (size_t)k;
	}
	close(fd);
	return (buf);
}

static int
ct_http_port(const struct th_coord *c)
{
	for (int i = 0; i < 200; i++) {
		char *log = th_read_file(c->log), *p;
		int port = -1;
		if (log != NULL && (p = strstr(log, "http on http://")) != NULL
		    && (p = strchr(p + strlen("http on http://"), ':'))
		        != NULL)
			port = (int)strtol(p + 1, NULL, 10);
		free(log);
		if (port > 0)
			return (port);
		usleep(10 * 1000);
	}
	ck_abort_msg("no http port in the log");
	return (-1);
}

static bool
ct_expired(void *arg)
{
	const struct th_coord *c = arg;

	return (th_file_has(c->log, "job 'shared' expired"));
}

START_TEST(test_failure_text_ends_with_its_job)
{
	static const char *const args[] = { "--job-expiry", "1000", "--http",
		"127.0.0.1:0", "--open-status", NULL };
	struct th_coord c;
	struct th_workers a, b;
	char flag[300], *o;
	const char *env[] = { NULL };
	int hport;

	th_coord_start(&c, args);
	hport = ct_http_port(&c);
	/* Tenant A: rank 1 fails with a text; the job expires. */
	th_workers_run(
	    &a, &c, "shared", "token-a", 2, "report", "", env, 60000);
	o = ct_get(hport, "/status.json?job=shared", "token-a");
	ck_assert_has(o, "loss is NaN");
	free(o);
	ck_assert_msg(th_wait_until(ct_expired, &c, 100, 100),
	    "job 'shared' did not expire");
	/* Tenant B: the same name, another token. */
	snprintf(flag, sizeof(flag), "%s/b-done", th_tmpdir());
	th_workers_start(
	    &b, &c, "shared", "token-b", 1, "hold_until", flag, env);
	th_workers_await_ready(&b, 300, 50);
	o = ct_get(hport, "/status.json?job=shared", "token-b");
	printf("CHAOS tenancy: tenant B's /status.json after tenant A's job "
	       "of the same name failed and expired: %s\n",
	    strstr(o, "loss is NaN") != NULL ? "shows A's failure text"
	                                     : "nothing of A's");
	ck_assert_msg(strstr(o, "\"jobs\":[") != NULL
	        && strstr(o, "loss is NaN") == NULL,
	    "tenant B sees: %s", o);
	free(o);
	/* The operator still sees A's failure (all jobs). */
	o = ct_get(hport, "/status.json", "");
	ck_assert_has(o, "loss is NaN");
	free(o);
	{
		FILE *f = fopen(flag, "w");
		ck_assert_ptr_nonnull(f);
		fclose(f);
	}
	th_workers_wait(&b, 60000);
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

Suite *
suite_chaos_tenancy(void)
{
	return (th_suite("chaos_tenancy", "expiry", 120, NULL, NULL,
	    test_failure_text_ends_with_its_job, NULL));
}
