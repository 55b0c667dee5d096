/*
 * http.c - cohortd's HTTP front end: /metrics in the Prometheus text
 * format, /healthz (the process serves) and /readyz (the coordinator
 * accepts requests: 503 once it drains before exiting), the live status
 * page / and its /status.json (docs/observability.md).
 *
 * A small HTTP/1.1 server (GET and HEAD, keep-alive) on cohortd's own
 * connection layer (net.h), so that its connections are under the same
 * bounds as every other: a request (line and headers, at most 8 KiB) must
 * arrive within --first-request-timeout of the connection or of the last
 * answer, else the connection closes; HTTP connections never count as
 * authenticated, so they are the first closed to make room. (nng's HTTP
 * server, used before, kept an idle connection for ever.)
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <strings.h>

#include "core/util.h"
#include "observe/metrics.h"
#include "observe/page.h"
#include "observe/status.h"
#include "events.h"
#include "http.h"
#include "net.h"
#include "nng_rep.h"

/* A request's line and headers. */
#define HTTP_MAX_REQUEST 8192

struct srv_http {
	struct srv_nng *nng;
	struct srv_net *net;
	cohort__time first_ms;
};

struct http_conn {
	struct srv_nconn nc;
	struct srv_http *h;
	size_t inlen;
	bool close_after; /* Connection: close, HTTP/1.0 */
	char in[HTTP_MAX_REQUEST + 1];
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

/* text (malloc'd) with the connection layer's series appended (net.h);
 * NULL when out of memory (text freed). */
static char *
http_net_metrics(struct srv_http *sh, char *text)
{
	struct srv_net_stats st;
	size_t tl = strlen(text), cap = tl + 2048;
	char *out = realloc(text, cap);
	int n;

	if (out == NULL) {
		free(text);
		return (NULL);
	}
	srv_net_stats(sh->net, &st);
	n = snprintf(out + tl, cap - tl,
	    "# HELP cohort_net_connections Connections of cohortd's own "
	    "listeners (tcp://, TCPStore, HTTP).\n"
	    "# TYPE cohort_net_connections gauge\n"
	    "cohort_net_connections %" PRIu64 "\n"
	    "# HELP cohort_net_max_connections --max-conns in force.\n"
	    "# TYPE cohort_net_max_connections gauge\n"
	    "cohort_net_max_connections %" PRIu64 "\n"
	    "# HELP cohort_net_pending_bytes Bytes of requests still "
	    "arriving.\n"
	    "# TYPE cohort_net_pending_bytes gauge\n"
	    "cohort_net_pending_bytes %" PRIu64 "\n"
	    "# HELP cohort_net_evicted_total Connections that had not "
	    "authenticated, closed to make room.\n"
	    "# TYPE cohort_net_evicted_total counter\n"
	    "cohort_net_evicted_total %" PRIu64 "\n"
	    "# HELP cohort_net_refused_total Connections refused at once "
	    "(no room).\n"
	    "# TYPE cohort_net_refused_total counter\n"
	    "cohort_net_refused_total %" PRIu64 "\n"
	    "# HELP cohort_net_accept_emfile_total accept() out of "
	    "descriptors.\n"
	    "# TYPE cohort_net_accept_emfile_total counter\n"
	    "cohort_net_accept_emfile_total %" PRIu64 "\n"
	    "# HELP cohort_net_pending_refusals_total Frames refused by "
	    "--max-pending-bytes.\n"
	    "# TYPE cohort_net_pending_refusals_total counter\n"
	    "cohort_net_pending_refusals_total %" PRIu64 "\n",
	    st.conns, st.max_conns, st.pending_bytes, st.evicted, st.refused,
	    st.emfile, st.limit_refusals);
	if (n < 0 || (size_t)n >= cap - tl)
		out[tl] = '\0';
	return (out);
}

/* Decodes the job of a query string ("?job=J&...") into job. */
static void
http_query_job(const char *q, char *job, size_t len)
{
	for (const char *p = q; p != NULL && *p != '\0';) {
		const char *e = strchr(p + 1, '&');
		if (e == NULL)
			e = p + strlen(p);
		if (strncmp(p + 1, "job=", 4) == 0)
			http_unescape(p + 5, e, job, len);
		p = *e != '\0' ? e : NULL;
	}
}

static const char *
http_reason(int code)
{
	switch (code) {
	case 200:
		return ("OK");
	case 400:
		return ("Bad Request");
	case 401:
		return ("Unauthorized");
	case 404:
		return ("Not Found");
	case 405:
		return ("Method Not Allowed");
	case 431:
		return ("Request Header Fields Too Large");
	case 500:
		return ("Internal Server Error");
	case 503:
		return ("Service Unavailable");
	default:
		return ("Unknown");
	}
}

/* Queues a response (head: no body, as HEAD asks). */
static void
http_respond(struct http_conn *c, int code, const char *type, const char *body,
    bool head)
{
	char hdr[512];
	size_t blen = strlen(body);
	int n;

	n = snprintf(hdr, sizeof(hdr),
	    "HTTP/1.1 %d %s\r\nContent-Type: %s\r\nContent-Length: %zu\r\n"
	    "%s%s\r\n",
	    code, http_reason(code), type, blen,
	    code == 405 ? "Allow: GET, HEAD\r\n" : "",
	    c->close_after ? "Connection: close\r\n" : "");
	if (srv_nconn_put(&c->nc, hdr, (size_t)n) && !head)
		(void)srv_nconn_put(&c->nc, body, blen);
}

/* The header named name (case-insensitive) among hdrs (each line ends in
 * "\r\n"), copied into out; false if absent. */
static bool
http_header(const char *hdrs, const char *name, char *out, size_t len)
{
	size_t nl = strlen(name);

	for (const char *l = hdrs; l != NULL && *l != '\0';) {
		const char *e = strstr(l, "\r\n");
		if (e == NULL || e == l)
			break;
		if ((size_t)(e - l) > nl && strncasecmp(l, name, nl) == 0
		    && l[nl] == ':') {
			const char *v = l + nl + 1;
			size_t vl;
			while (*v == ' ' || *v == '\t')
				v++;
			vl = (size_t)(e - v);
			if (vl >= len)
				vl = len - 1;
			memcpy(out, v, vl);
			out[vl] = '\0';
			return (true);
		}
		l = e + 2;
	}
	return (false);
}

/* Answers one request: line "METHOD URI VERSION", then its headers. */
static void
http_serve(struct http_conn *c, char *line, const char *hdrs)
{
	struct srv_http *sh = c->h;
	char *method = line, *uri, *ver, *q;
	char conn[64], auth[600], job[SRV_MAX_NAME + 1] = "", token[512] = "";
	struct http_ask a = { job, token, NULL, 500, "stopping", false };
	bool head;

	if ((uri = strchr(method, ' ')) == NULL
	    || (ver = strchr(uri + 1, ' ')) == NULL
	    || strncmp(ver + 1, "HTTP/1.", 7) != 0) {
		c->close_after = true;
		http_respond(c, 400, "text/plain", "bad request\n", false);
		return;
	}
	*uri++ = '\0';
	*ver++ = '\0';
	if (strcmp(ver, "HTTP/1.0") == 0)
		c->close_after = true;
	if (http_header(hdrs, "Connection", conn, sizeof(conn))) {
		if (strcasecmp(conn, "close") == 0)
			c->close_after = true;
		else if (strcasecmp(conn, "keep-alive") == 0)
			c->close_after = false;
	}
	head = strcmp(method, "HEAD") == 0;
	if (!head && strcmp(method, "GET") != 0) {
		http_respond(
		    c, 405, "text/plain", "method not allowed\n", false);
		return;
	}
	if ((q = strchr(uri, '?')) != NULL)
		*q = '\0';
	if (strcmp(uri, "/metrics") == 0) {
		srv_with_core(sh->nng, http_metrics_locked, &a);
		if (a.text != NULL)
			a.text = http_net_metrics(sh, a.text);
		if (a.text == NULL)
			http_respond(
			    c, 500, "text/plain", "out of memory\n", head);
		else
			http_respond(
			    c, 200, "text/plain; version=0.0.4", a.text, head);
	} else if (strcmp(uri, "/healthz") == 0) {
		http_respond(c, 200, "text/plain", "ok\n", head);
	} else if (strcmp(uri, "/readyz") == 0) {
		char body[520];
		srv_with_core(sh->nng, http_ready_locked, &a);
		snprintf(body, sizeof(body), "%s\n", a.ready ? "ok" : a.why);
		http_respond(c, a.ready ? 200 : 503, "text/plain", body, head);
	} else if (strcmp(uri, "/") == 0) {
		http_respond(
		    c, 200, "text/html; charset=utf-8", srv_status_page, head);
	} else if (strcmp(uri, "/status.json") == 0) {
		/* /status.json[?job=J], with `Authorization: Bearer TOKEN`:
		 * what a StatusQuery with that job and token would see (401
		 * otherwise). */
		if (q != NULL) {
			*q = '?';
			http_query_job(q, job, sizeof(job));
		}
		if (http_header(hdrs, "Authorization", auth, sizeof(auth))
		    && strncmp(auth, "Bearer ", 7) == 0)
			cohort__strlcpy(token, auth + 7, sizeof(token));
		srv_with_core(sh->nng, http_status_locked, &a);
		if (a.text == NULL)
			http_respond(
			    c, 500, "text/plain", "out of memory\n", head);
		else
			http_respond(
			    c, a.code, "application/json", a.text, head);
		memset(token, 0, sizeof(token));
		memset(auth, 0, sizeof(auth));
	} else {
		http_respond(c, 404, "text/plain", "not found\n", head);
	}
	free(a.text);
}

/* After an answer: close (Connection: close) once it is written, else
 * wait for the next request for at most --first-request-timeout. */
static void
http_after(struct http_conn *c, cohort__time now)
{
	srv_nconn_flush(&c->nc);
	if (c->nc.dead)
		return;
	if (c->close_after) {
		srv_nconn_pause(&c->nc, true);
		if (!srv_nconn_busy_out(&c->nc))
			srv_nconn_close(&c->nc, NULL);
		return;
	}
	srv_nconn_deadline(&c->nc, now + c->h->first_ms, false,
	    "idle past --first-request-timeout");
}

static void
http_readable(struct srv_nconn *nc, cohort__time now)
{
	struct http_conn *c = (struct http_conn *)nc;

	while (!nc->dead && !c->close_after) {
		char *end;
		ssize_t r;
		if (c->inlen < HTTP_MAX_REQUEST) {
			r = srv_nconn_recv(
			    nc, c->in + c->inlen, HTTP_MAX_REQUEST - c->inlen);
			if (r < 0) {
				if (!nc->dead)
					srv_nconn_close(
					    nc, "closed by the client");
				return;
			}
			c->inlen += (size_t)r;
		}
		c->in[c->inlen] = '\0';
		if ((end = strstr(c->in, "\r\n\r\n")) == NULL) {
			if (c->inlen >= HTTP_MAX_REQUEST) {
				c->close_after = true;
				http_respond(c, 431, "text/plain",
				    "request header over 8 KiB\n", false);
				http_after(c, now);
			}
			return;
		}
		{
			char *line = c->in, *hdrs = strstr(c->in, "\r\n");
			size_t used = (size_t)(end + 4 - c->in);
			*hdrs = '\0';
			end[2] = '\0'; /* the headers end with their CRLF */
			http_serve(c, line, hdrs + 2);
			memmove(c->in, c->in + used, c->inlen - used);
			c->inlen -= used;
		}
		http_after(c, now);
	}
}

static void
http_drained(struct srv_nconn *nc, cohort__time now)
{
	struct http_conn *c = (struct http_conn *)nc;

	(void)now;
	if (c->close_after)
		srv_nconn_close(nc, NULL);
}

static bool
http_opened(struct srv_nconn *nc, cohort__time now)
{
	struct http_conn *c = (struct http_conn *)nc;

	c->h = nc->arg;
	nc->max_out = 64u << 20;
	srv_nconn_deadline(nc, now + c->h->first_ms, false,
	    "no request within --first-request-timeout");
	return (true);
}

static void
http_delivered(struct srv_nconn *c, struct srv_npost *p, cohort__time now)
{
	(void)c;
	(void)p;
	(void)now;
}

static const struct srv_proto http_proto = {
	.name = "http",
	.conn_size = sizeof(struct http_conn),
	.opened = http_opened,
	.readable = http_readable,
	.delivered = http_delivered,
	.drained = http_drained,
};

static void
http_cfg_locked(void *arg, struct srv_core *core, cohort__time now)
{
	(void)now;
	((struct srv_http *)arg)->first_ms = core->first_request_ms;
}

cohort_status
srv_http_start(struct srv_net *net, struct srv_nng *n, const char *addr,
    struct srv_http **out, char **url)
{
	struct srv_http *sh = calloc(1, sizeof(*sh));
	struct srv_nlistener *l;
	char buf[300];
	cohort_status rv;

	if (sh == NULL)
		return (COHORT_ENOMEM);
	sh->nng = n;
	sh->net = net;
	srv_with_core(n, http_cfg_locked, sh);
	if ((rv = srv_net_listen(net, addr, &http_proto, sh, "--http", &l))
	    != COHORT_OK) {
		free(sh);
		return (rv);
	}
	/* The host as given, the port as bound. */
	snprintf(buf, sizeof(buf), "http://%.*s:%s",
	    (int)(strrchr(addr, ':') - addr), addr,
	    strrchr(srv_nlistener_addr(l), ':') + 1);
	if ((*url = srv_strdup(buf)) == NULL) {
		free(sh);
		return (COHORT_ENOMEM);
	}
	*out = sh;
	return (COHORT_OK);
}

void
srv_http_free(struct srv_http *sh)
{
	free(sh);
}
