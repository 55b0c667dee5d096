/*
 * test_tls.c - the control plane over nng's tls+tcp:// transport (issue
 * 12, finding 7): certificates made in the test with the openssl command
 * (tools/deps.sh installs it); a real cohortd and real workers.
 *
 * mbed TLS 2.28 (Debian's nng) matches DNS names only, not IP addresses:
 * the server certificate names "localhost" and the workers, dialing
 * 127.0.0.1, set COHORT_TLS_SERVER_NAME=localhost.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>
#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "check_cohort.h"

static char tls_dir[256];

static void
tls_sh(const char *cmd)
{
	char line[2048];

	snprintf(line, sizeof(line), "cd '%s' && (%s) >>openssl.log 2>&1",
	    tls_dir, cmd);
	ck_assert_msg(system(line) == 0, "failed: %s (see %s/openssl.log)",
	    cmd, tls_dir);
}

/* ca.pem (and ca2.pem, another CA), srv.pem/srv.key for localhost,
 * cli.pem/cli.key, all signed by ca.pem. */
static void
tls_make_certs(void)
{
	snprintf(tls_dir, sizeof(tls_dir), "%s", th_tmpdir());
	tls_sh("printf 'subjectAltName=DNS:localhost\\n' >san.ext");
	for (int i = 1; i <= 2; i++) {
		char cmd[512];

		snprintf(cmd, sizeof(cmd),
		    "openssl req -x509 -newkey ec -pkeyopt "
		    "ec_paramgen_curve:P-256 -nodes -days 2 -subj "
		    "/CN=cohort-test-ca-%d -keyout ca%s.key -out ca%s.pem",
		    i, i == 1 ? "" : "2", i == 1 ? "" : "2");
		tls_sh(cmd);
	}
	tls_sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
	       "-nodes -subj /CN=localhost -keyout srv.key -out srv.csr");
	tls_sh("openssl x509 -req -in srv.csr -CA ca.pem -CAkey ca.key "
	       "-CAcreateserial -days 2 -extfile san.ext -out srv.pem");
	tls_sh("openssl req -newkey ec -pkeyopt ec_paramgen_curve:P-256 "
	       "-nodes -subj /CN=worker -keyout cli.key -out cli.csr");
	tls_sh("openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key "
	       "-CAcreateserial -days 2 -out cli.pem");
}

struct tls_env {
	char url[96], coord[128], ca[300], cert[300], key[300];
	const char *env[8];
};

/* The workers' environment in e: cohortd at url (e->url may be it), the
 * CA ca_file of tls_dir (NULL: none), the client certificate when
 * client_cert. */
static void
tls_env_fill(
    struct tls_env *e, const char *url, const char *ca_file, bool client_cert)
{
	int n = 0;

	if (url != e->url)
		snprintf(e->url, sizeof(e->url), "%s", url);
	snprintf(e->coord, sizeof(e->coord), "COHORT_COORDINATOR=%s", e->url);
	e->env[n++] = e->coord;
	e->env[n++] = "COHORT_TLS_SERVER_NAME=localhost";
	if (ca_file != NULL) {
		snprintf(e->ca, sizeof(e->ca), "COHORT_TLS_CA=%s/%s", tls_dir,
		    ca_file);
		e->env[n++] = e->ca;
	}
	if (client_cert) {
		snprintf(e->cert, sizeof(e->cert),
		    "COHORT_TLS_CERT=%s/cli.pem", tls_dir);
		snprintf(e->key, sizeof(e->key), "COHORT_TLS_KEY=%s/cli.key",
		    tls_dir);
		e->env[n++] = e->cert;
		e->env[n++] = e->key;
	}
	e->env[n] = NULL;
}

/* Starts cohortd with a tls+tcp:// listener (and its plain one, which
 * the harness probes); fills e with the workers' environment. */
static void
tls_start_at(struct th_coord *c, struct tls_env *e, bool verify_clients,
    const char *ca_file, bool client_cert, int port)
{
	static char cert[300], key[300], ca[300], admin[300];
	const char *args[14];
	int n = 0;

	if (port == 0)
		port = th_free_port();
	if (tls_dir[0] == '\0')
		tls_make_certs();
	snprintf(e->url, sizeof(e->url), "tls+tcp://127.0.0.1:%d", port);
	snprintf(cert, sizeof(cert), "%s/srv.pem", tls_dir);
	snprintf(key, sizeof(key), "%s/srv.key", tls_dir);
	snprintf(ca, sizeof(ca), "%s/ca.pem", tls_dir);
	args[n++] = "--listen";
	args[n++] = e->url;
	args[n++] = "--tls-cert";
	args[n++] = cert;
	args[n++] = "--tls-key";
	args[n++] = key;
	tls_sh("printf 'tls-admin-secret\\n' >admin.secret");
	snprintf(admin, sizeof(admin), "%s/admin.secret", tls_dir);
	args[n++] = "--admin-token-file";
	args[n++] = admin;
	if (verify_clients) {
		args[n++] = "--tls-ca";
		args[n++] = ca;
		args[n++] = "--tls-verify-clients";
	}
	args[n] = NULL;
	th_coord_start(c, args);
	/* the harness waited for the plain listener; the TLS one follows */
	for (int k = 0; k < 200 && !th_port_open(port); k++)
		usleep(10000);
	tls_env_fill(e, e->url, ca_file, client_cert);
}

static void
tls_expect(struct th_workers *w, const char *want, int64_t within_ms)
{
	int64_t t0 = th_now_ms(), took;

	th_workers_wait(w, 120000);
	took = th_now_ms() - t0;
	th_workers_expect(w, w->n, want);
	fprintf(stderr, "tls: '%s' on every rank after %lld ms\n", want,
	    (long long)took);
	ck_assert_int_lt(took, within_ms);
}

static void
tls_start(struct th_coord *c, struct tls_env *e, bool verify_clients,
    const char *ca_file, bool client_cert)
{
	tls_dir[0] = '\0';
	tls_start_at(c, e, verify_clients, ca_file, client_cert, 0);
}

/* Runs `cohort status` (all jobs, with the admin secret) with the CA file
 * ca; its exit code and output must be want_rc and contain want. */
static void
tls_status(
    const struct tls_env *e, const char *ca, int want_rc, const char *want)
{
	char cafile[300], out[300], admin[300];
	char *argv[] = { (char *)th_bin("cohort"), "status", NULL };
	char *env[] = { (char *)e->coord, "COHORT_TLS_SERVER_NAME=localhost",
		cafile, admin, NULL };
	char *o;
	int st = -1;
	pid_t pid;

	snprintf(cafile, sizeof(cafile), "COHORT_TLS_CA=%s/%s", tls_dir, ca);
	snprintf(admin, sizeof(admin),
	    "COHORT_ADMIN_TOKEN_FILE=%s/admin.secret", tls_dir);
	snprintf(out, sizeof(out), "%s/status-%s.out", tls_dir, ca);
	pid = th_spawn(argv, env, out);
	ck_assert(th_wait(pid, 30000, &st));
	o = th_read_file(out);
	fprintf(stderr, "tls: cohort status with %s: exit %d: %s", ca,
	    th_exit_code(st), o != NULL ? o : "");
	ck_assert_msg(th_exit_code(st) == want_rc && o != NULL
	        && strstr(o, want) != NULL,
	    "cohort status (CA %s) exited %d:\n%s", ca, th_exit_code(st),
	    o != NULL ? o : "");
	free(o);
}

/* A verified server certificate: the job runs over TLS. */
START_TEST(test_tls_job_runs)
{
	struct th_coord c;
	struct tls_env e;
	struct th_workers w;

	tls_start(&c, &e, false, "ca.pem", false);
	th_workers_start(&w, &c, "tlsjob", "t", 3, "barrier", "50", e.env);
	tls_expect(&w, "RESULT barrier count=50", 120000);
	/* the CLI goes through the same client code */
	tls_status(&e, "ca.pem", 0, "cohortd at tls+tcp://");
	tls_status(&e, "ca2.pem", 1, "TLS connection");
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

/* Workers refused at once with a text naming TLS and what to check (not
 * a join timeout). */
static const struct {
	const char *job, *ca_file, *want;
	int n;
} tls_refused[] = {
	/* cohortd's certificate is not signed by the client's CA */
	{ "tlsbad", "ca2.pem", "status=COHORT_EAUTH detail=TLS connection",
	    2 },
	/* no CA configured: a configuration error */
	{ "tlsnoca", NULL, "needs COHORT_TLS_CA", 1 },
};

START_TEST(test_tls_refused_at_once)
{
	struct th_coord c;
	struct tls_env e;
	struct th_workers w;

	tls_start(&c, &e, false, tls_refused[_i].ca_file, false);
	th_workers_start(&w, &c, tls_refused[_i].job, "t", tls_refused[_i].n,
	    "barrier", "5", e.env);
	tls_expect(&w, tls_refused[_i].want, 15000);
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

/* The workers start first (their synchronous dial finds nobody for
 * longer than its 3 s); cohortd then comes up with a certificate they
 * refuse: the probe of the background dial reports it within seconds,
 * not at the join's timeout (60 s here). */
START_TEST(test_tls_wrong_ca_of_a_late_cohortd)
{
	struct th_coord c, early;
	struct tls_env e;
	struct th_workers w;
	int port = th_free_port();
	int64_t t0;

	tls_dir[0] = '\0';
	tls_make_certs();
	memset(&early, 0, sizeof(early));
	snprintf(early.url, sizeof(early.url), "tls+tcp://127.0.0.1:%d", port);
	tls_env_fill(&e, early.url, "ca2.pem", false);
	th_workers_start(&w, &early, "tlslate", "t", 2, "barrier", "5", e.env);
	usleep(4500 * 1000);
	t0 = th_now_ms();
	tls_start_at(&c, &e, false, "ca2.pem", false, port);
	tls_expect(&w, "status=COHORT_EAUTH detail=TLS connection", 20000);
	fprintf(stderr, "tls: late cohortd refused %lld ms after it started\n",
	    (long long)(th_now_ms() - t0));
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

/* --tls-verify-clients: no client certificate is refused at once; one
 * signed by --tls-ca gets in. */
START_TEST(test_tls_client_certificate_required)
{
	struct th_coord c;
	struct tls_env e, e2;
	struct th_workers w;

	tls_start(&c, &e, true, "ca.pem", false);
	th_workers_start(&w, &c, "tlsnocert", "t", 2, "barrier", "5", e.env);
	tls_expect(&w, "status=COHORT_EAUTH detail=TLS connection", 15000);
	tls_env_fill(&e2, e.url, "ca.pem", true);
	th_workers_start(&w, &c, "tlscert", "t", 2, "barrier", "20", e2.env);
	tls_expect(&w, "RESULT barrier count=20", 120000);
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

/* What a refused TLS client is told (issue 22 finding 9): not the text
 * meant for a wrong CA when the port speaks plain tcp://, nor when its own
 * certificate has expired. */
START_TEST(test_tls_client_on_a_plain_port)
{
	struct th_coord c;
	struct th_workers w;
	struct tls_env e;
	char url[96];

	tls_dir[0] = '\0';
	tls_make_certs();
	th_coord_start(&c, NULL);
	snprintf(url, sizeof(url), "tls+tcp://127.0.0.1:%d", c.port);
	tls_env_fill(&e, url, "ca.pem", false);
	th_workers_start(&w, &c, "tlsplain", "t", 1, "barrier", "5", e.env);
	tls_expect(&w, "speaks plain tcp://, not TLS", 15000);
	ck_assert(!th_worker_output_has(&w, 0, "another CA"));
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

START_TEST(test_tls_expired_client_certificate)
{
	struct th_coord c;
	struct tls_env e;
	struct th_workers w;

	tls_start(&c, &e, true, "ca.pem", true);
	/* cli.pem again, expired yesterday */
	tls_sh("openssl x509 -req -in cli.csr -CA ca.pem -CAkey ca.key "
	       "-CAcreateserial -days -1 -out cli.pem");
	th_workers_start(&w, &c, "tlsexpired", "t", 1, "barrier", "5", e.env);
	tls_expect(&w, "expired on", 15000);
	ck_assert(!th_worker_output_has(&w, 0, "another CA"));
	ck_assert_int_eq(th_coord_stop(&c), 0);
}
END_TEST

Suite *suite_integration_tls(void); /* for tools/gen_suites.sh */

Suite *
suite_integration_tls(void)
{
	Suite *s = suite_create("integration_tls");
	TCase *tc = th_suite_case(s, "tls", 240, NULL, NULL, test_tls_job_runs,
	    test_tls_wrong_ca_of_a_late_cohortd,
	    test_tls_client_certificate_required,
	    test_tls_client_on_a_plain_port,
	    test_tls_expired_client_certificate, NULL);

	tcase_add_loop_test(tc, test_tls_refused_at_once, 0,
	    (int)(sizeof(tls_refused) / sizeof(tls_refused[0])));
	return (s);
}
