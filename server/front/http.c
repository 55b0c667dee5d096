/*
 * http.c - cohortd's HTTP front end (nng's HTTP server): /metrics in the
 * Prometheus text format, /healthz (the process serves) and /readyz (the
 * coordinator accepts requests: 503 once it drains before exiting), the
 * live status page / and its /status.json (docs/observability.md).
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include <nng/nng.h>
#include <nng/supplemental/http/http.h>

#include "core/util.h"
#include "observe/metrics.h"
#include "observe/page.h"
#include "observe/status.h"
#include "events.h"
#include "http.h"
#include "nng_rep.h"

struct srv_http {
	nng_http_server *server;
	struct srv_nng *nng;
};

/* What a handler asks of the coordinator, answered under the mutex. */
struct http_ask {
	const char *job;
	const char *token;
	char *text; /* malloc'd; NULL: out of memory, or stopping */
	int code;
	char why[512];
	bool ready;
};

static void
http_metrics_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct http_ask *a = arg;

	a->text = srv_metrics_text(core, now);
}

static void
http_status_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct http_ask *a = arg;

	a->text = srv_status_json(core, a->job, a->token, now, &a->code);
}

static void
http_ready_locked(void *arg, struct srv_core *core, cohort__time now)
{
	struct http_ask *a = arg;

	(void)now;
	a->ready = srv_core_ready(core, a->why, sizeof(a->why));
}

static void
http_reply(nng_aio *aio, uint16_t status, const char *type, const char *body)
{
	nng_http_res *res;
	int rv;

	if ((rv = nng_http_res_alloc(&res)) != 0) {
		nng_aio_finish(aio, rv);
		return;
	}
	if ((rv = nng_http_res_set_status(res, status)) != 0
	    || (rv = nng_http_res_set_header(res, "Content-Type", type)) != 0
	    || (rv = nng_http_res_copy_data(res, body, strlen(body))) != 0) {
		nng_http_res_free(res);
		nng_aio_finish(aio, rv);
		return;
	}
	nng_aio_set_output(aio, 0, res);
	nng_aio_finish(aio, 0);
}

static void
http_metrics(nng_aio *aio)
{
	nng_http_handler *h = nng_aio_get_input(aio, 1);
	struct srv_http *sh = nng_http_handler_get_data(h);
	struct http_ask a = { NULL, NULL, NULL, 0, "", false };

	srv_with_core(sh->nng, http_metrics_locked, &a);
	if (a.text == NULL) {
		http_reply(aio, 500, "text/plain", "out of memory\n");
		return;
	}
	http_reply(aio, 200, "text/plain; version=0.0.4", a.text);
	free(a.text);
}

/* The status page: static, no data (that is /status.json's). */
static void
http_page(nng_aio *aio)
{
	http_reply(aio, 200, "text/html; charset=utf-8", srv_status_page);
}

/* Decodes %XX and + of a query value [s, e) into out. */
static void
http_unescape(const char *s, const char *e, char *out, size_t len)
{
	size_t o = 0;

	for (; s < e && o + 1 < len; s++) {
		unsigned v;
		if (*s == '%' && e - s >= 3 && sscanf(s + 1, "%2x", &v) == 1) {
			out[o++] = (char)v;
			s += 2;
		} else {
			out[o++] = *s == '+' ? ' ' : *s;
		}
	}
	out[o] = '\0';
}

/* /status.json[?job=J], with `Authorization: Bearer TOKEN`: what a
 * StatusQuery with that job and token would see (401 otherwise). */
static void
http_status_json(nng_aio *aio)
{
	nng_http_req *req = nng_aio_get_input(aio, 0);
	nng_http_handler *h = nng_aio_get_input(aio, 1);
	struct srv_http *sh = nng_http_handler_get_data(h);
	const char *uri = nng_http_req_get_uri(req);
	const char *auth = nng_http_req_get_header(req, "Authorization");
	const char *q = uri != NULL ? strchr(uri, '?') : NULL;
	char job[SRV_MAX_NAME + 1] = "", token[512] = "";
	struct http_ask a = { job, token, NULL, 500, "", false };

	for (const char *p = q; p != NULL && *p != '\0';) {
		const char *e = strchr(p + 1, '&');
		if (e == NULL)
			e = p + strlen(p);
		if (strncmp(p + 1, "job=", 4) == 0)
			http_unescape(p + 5, e, job, sizeof(job));
		p = *e != '\0' ? e : NULL;
	}
	if (auth != NULL && strncmp(auth, "Bearer ", 7) == 0)
		cohort__strlcpy(token, auth + 7, sizeof(token));
	srv_with_core(sh->nng, http_status_locked, &a);
	if (a.text == NULL) {
		http_reply(aio, 500, "text/plain", "out of memory\n");
		return;
	}
	http_reply(aio, (uint16_t)a.code, "application/json", a.text);
	free(a.text);
}

static void
http_ok(nng_aio *aio)
{
	http_reply(aio, 200, "text/plain", "ok\n");
}

/* Ready while serving; 503 once draining (SIGTERM) so that it is taken
 * out of service before it exits, and while its journal cannot be written
 * (a full disk: changes are refused), with the reason. */
static void
http_ready(nng_aio *aio)
{
	nng_http_handler *h = nng_aio_get_input(aio, 1);
	struct srv_http *sh = nng_http_handler_get_data(h);
	struct http_ask a = { NULL, NULL, NULL, 0, "stopping", false };
	char body[520];

	srv_with_core(sh->nng, http_ready_locked, &a);
	if (!a.ready) {
		snprintf(body, sizeof(body), "%s\n", a.why);
		http_reply(aio, 503, "text/plain", body);
	} else
		http_reply(aio, 200, "text/plain", "ok\n");
}

static int
http_handler(struct srv_http *sh, const char *path, void (*cb)(nng_aio *))
{
	nng_http_handler *h;
	int rv;

	if ((rv = nng_http_handler_alloc(&h, path, cb)) != 0)
		return (rv);
	if ((rv = nng_http_handler_set_method(h, "GET")) != 0
	    || (rv = nng_http_handler_set_data(h, sh, NULL)) != 0
	    || (rv = nng_http_server_add_handler(sh->server, h)) != 0) {
		nng_http_handler_free(h);
		return (rv);
	}
	return (0);
}

cohort_status
srv_http_start(
    struct srv_nng *n, const char *addr, struct srv_http **out, char **url)
{
	struct srv_http *sh = calloc(1, sizeof(*sh));
	char buf[300];
	nng_url *u = NULL;
	nng_sockaddr sa;
	cohort_status rv;
	int nrv;

	if (sh == NULL)
		return (COHORT_ENOMEM);
	sh->nng = n;
	snprintf(buf, sizeof(buf), "http://%s", addr);
	if ((nrv = nng_url_parse(&u, buf)) != 0
	    || (nrv = nng_http_server_hold(&sh->server, u)) != 0) {
		rv = cohort__err(
		    COHORT_EINVAL, "--http %s: %s", addr, nng_strerror(nrv));
		goto out_free;
	}
	if ((nrv = http_handler(sh, "/metrics", http_metrics)) != 0
	    || (nrv = http_handler(sh, "/healthz", http_ok)) != 0
	    || (nrv = http_handler(sh, "/readyz", http_ready)) != 0
	    || (nrv = http_handler(sh, "/", http_page)) != 0
	    || (nrv = http_handler(sh, "/status.json", http_status_json)) != 0
	    || (nrv = nng_http_server_start(sh->server)) != 0) {
		rv = cohort__err(cohort__from_nng(nrv), "--http %s: %s", addr,
		    nng_strerror(nrv));
		goto out_release;
	}
	if (nng_http_server_get_addr(sh->server, &sa) == 0
	    && sa.s_family == NNG_AF_INET) {
		unsigned port = sa.s_in.sa_port;
		port = ((port & 0xff) << 8) | ((port >> 8) & 0xff);
		snprintf(
		    buf, sizeof(buf), "http://%s:%u", u->u_hostname, port);
	}
	nng_url_free(u);
	*url = srv_strdup(buf);
	*out = sh;
	return (COHORT_OK);

out_release:
	nng_http_server_release(sh->server);
out_free:
	if (u != NULL)
		nng_url_free(u);
	free(sh);
	return (rv);
}

void
srv_http_stop(struct srv_http *sh)
{
	nng_http_server_stop(sh->server);
	nng_http_server_release(sh->server);
	free(sh);
}
