/*
 * tls.c - TLS configurations for nng's tls+tcp:// transport (tls.h).
 * nng 1.5.2 with mbed TLS 2.28 (Debian's libnng1): certificates and keys
 * are handed over as PEM text, the CA as a file.
 */
#include <errno.h>
#include <fcntl.h>
#include <netdb.h>
#include <poll.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include <mbedtls/x509_crt.h>

#include "tls.h"

/* The largest PEM file read (a chain of a few certificates). */
#define TLS_PEM_MAX (1u << 20)

bool
cohort__tls_url(const char *url)
{
	return (url != NULL && strncmp(url, "tls+", 4) == 0);
}

static cohort_status
tls_read_pem(const char *what, const char *path, char **out)
{
	FILE *f;
	char *buf;
	size_t n;

	if ((f = fopen(path, "rb")) == NULL)
		return (cohort__err(COHORT_EINVAL, "%s %s: cannot read: %s",
		    what, path, strerror(errno)));
	if ((buf = malloc(TLS_PEM_MAX + 1)) == NULL) {
		fclose(f);
		return (cohort__err(COHORT_ENOMEM, "out of memory"));
	}
	n = fread(buf, 1, TLS_PEM_MAX + 1, f);
	fclose(f);
	if (n == 0 || n > TLS_PEM_MAX) {
		free(buf);
		return (cohort__err(COHORT_EINVAL, "%s %s: %s", what, path,
		    n == 0 ? "empty" : "larger than 1 MiB"));
	}
	buf[n] = '\0';
	*out = buf;
	return (COHORT_OK);
}

cohort_status
cohort__tls_config(nng_tls_config **out, bool server, const char *cert,
    const char *key, const char *ca, const char *server_name, bool verify)
{
	nng_tls_config *tc = NULL;
	char *cpem = NULL, *kpem = NULL;
	cohort_status st = COHORT_OK;
	int rv;

	if ((cert == NULL) != (key == NULL))
		return (cohort__err(COHORT_EINVAL,
		    "TLS: a certificate needs its key and a key its "
		    "certificate (%s given alone)",
		    cert != NULL ? cert : key));
	if (server && cert == NULL)
		return (cohort__err(COHORT_EINVAL,
		    "a tls+tcp:// listener needs --tls-cert and --tls-key"));
	if (verify && ca == NULL)
		return (cohort__err(COHORT_EINVAL,
		    server ? "--tls-verify-clients needs --tls-ca (the CA "
		             "that signs client certificates)"
		           : "tls+tcp:// needs COHORT_TLS_CA: the CA (PEM) "
		             "that signed cohortd's certificate"));
	if ((rv = nng_tls_config_alloc(
	         &tc, server ? NNG_TLS_MODE_SERVER : NNG_TLS_MODE_CLIENT))
	    != 0)
		return (cohort__err(cohort__from_nng(rv),
		    "TLS is not available in this nng (%s)",
		    nng_strerror(rv)));
	if (cert != NULL) {
		if ((st = tls_read_pem("TLS certificate", cert, &cpem))
		        != COHORT_OK
		    || (st = tls_read_pem("TLS key", key, &kpem)) != COHORT_OK)
			goto out;
		if ((rv = nng_tls_config_own_cert(tc, cpem, kpem, NULL))
		    != 0) {
			st = cohort__err(COHORT_EINVAL,
			    "TLS certificate %s with key %s: %s (not PEM, or "
			    "a key that does not match?)",
			    cert, key, nng_strerror(rv));
			goto out;
		}
	}
	if (ca != NULL && (rv = nng_tls_config_ca_file(tc, ca)) != 0) {
		st = cohort__err(
		    COHORT_EINVAL, "TLS CA %s: %s", ca, nng_strerror(rv));
		goto out;
	}
	if (server_name != NULL && server_name[0] != '\0'
	    && (rv = nng_tls_config_server_name(tc, server_name)) != 0) {
		st = cohort__err(COHORT_EINVAL, "TLS server name '%s': %s",
		    server_name, nng_strerror(rv));
		goto out;
	}
	if ((rv = nng_tls_config_auth_mode(tc,
	         verify ? NNG_TLS_AUTH_MODE_REQUIRED
	                : (ca != NULL ? NNG_TLS_AUTH_MODE_OPTIONAL
	                              : NNG_TLS_AUTH_MODE_NONE)))
	    != 0) {
		st = cohort__err(
		    COHORT_EINVAL, "TLS auth mode: %s", nng_strerror(rv));
		goto out;
	}
out:
	free(cpem);
	free(kpem);
	if (st != COHORT_OK) {
		nng_tls_config_free(tc);
		return (st);
	}
	*out = tc;
	return (COHORT_OK);
}

const char *
cohort__tls_hint(int nng_err)
{
	switch (nng_err) {
	case NNG_EPEERAUTH:
		return (
		    "cohortd's certificate is not signed by COHORT_TLS_CA, "
		    "is out of its validity, or does not carry the name "
		    "COHORT_TLS_SERVER_NAME (or the URL's host)");
	case NNG_ECRYPTO:
		return ("the TLS handshake failed: a certificate signed by "
		        "another CA, a name that does not match, or cohortd "
		        "requires a client certificate (COHORT_TLS_CERT, "
		        "COHORT_TLS_KEY)");
	case NNG_ECLOSED:
	case NNG_ECONNRESET:
	case NNG_ECONNSHUT:
		return (
		    "cohortd closed the connection during the TLS "
		    "handshake: it requires a client certificate signed by "
		    "its --tls-ca (COHORT_TLS_CERT, COHORT_TLS_KEY), or "
		    "does not speak TLS on this port");
	default:
		return ("check COHORT_TLS_CA, COHORT_TLS_CERT, COHORT_TLS_KEY "
		        "and COHORT_TLS_SERVER_NAME");
	}
}

/* "tls+tcp://HOST:PORT" (tls+tcp4://, tls+tcp6://, [V6]) into host and
 * port. */
static bool
tls_url_split(
    const char *url, char *host, size_t hlen, char *port, size_t plen)
{
	const char *p = strstr(url, "://"), *colon;
	size_t n;

	if (p == NULL)
		return (false);
	p += 3;
	if ((colon = strrchr(p, ':')) == NULL || colon[1] == '\0')
		return (false);
	n = (size_t)(colon - p);
	if (*p == '[' && n > 2 && p[n - 1] == ']') {
		p++;
		n -= 2;
	}
	if (n >= hlen || strlen(colon + 1) >= plen)
		return (false);
	memcpy(host, p, n);
	host[n] = '\0';
	snprintf(port, plen, "%s", colon + 1);
	return (true);
}

/* Whether url's port answers a plain TCP connection with nng's SP header
 * (0x00 'S' 'P' 0x00) at once: a tcp:// listener, not TLS. */
static bool
tls_port_is_plain(const char *url)
{
	char host[256], port[16];
	struct addrinfo hints, *res = NULL;
	unsigned char b[8];
	bool plain = false;
	int fd;

	if (!tls_url_split(url, host, sizeof(host), port, sizeof(port)))
		return (false);
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_STREAM;
	if (getaddrinfo(host, port, &hints, &res) != 0)
		return (false);
	fd = socket(
	    res->ai_family, SOCK_STREAM | SOCK_CLOEXEC | SOCK_NONBLOCK, 0);
	if (fd >= 0
	    && (connect(fd, res->ai_addr, res->ai_addrlen) == 0
	        || errno == EINPROGRESS)) {
		struct pollfd p = { fd, POLLOUT, 0 };
		size_t got = 0;
		if (poll(&p, 1, 700) == 1
		    && !(p.revents & (POLLERR | POLLHUP))) {
			/* a TLS server says nothing before the ClientHello */
			for (int i = 0; i < 4 && got < 4; i++) {
				ssize_t r;
				p.events = POLLIN;
				if (poll(&p, 1, 150) != 1)
					break;
				if ((r = recv(fd, b + got, sizeof(b) - got, 0))
				    <= 0)
					break;
				got += (size_t)r;
			}
			plain = got >= 4 && b[0] == 0 && b[1] == 'S'
			    && b[2] == 'P' && b[3] == 0;
		}
	}
	if (fd >= 0)
		close(fd);
	freeaddrinfo(res);
	return (plain);
}

/* Whether the certificate in cert (its first) is out of its validity:
 * the reason in buf. */
static bool
tls_cert_invalid_now(const char *cert, char *buf, size_t len)
{
	mbedtls_x509_crt crt;
	bool bad = false;

	mbedtls_x509_crt_init(&crt);
	if (mbedtls_x509_crt_parse_file(&crt, cert) == 0) {
		const mbedtls_x509_time *t = NULL;
		const char *what = NULL;
		if (mbedtls_x509_time_is_past(&crt.valid_to)) {
			t = &crt.valid_to;
			what = "expired on";
		} else if (mbedtls_x509_time_is_future(&crt.valid_from)) {
			t = &crt.valid_from;
			what = "is not valid before";
		}
		if (t != NULL) {
			snprintf(buf, len,
			    "this client's certificate %s (COHORT_TLS_CERT) "
			    "%s %04d-%02d-%02d %02d:%02d:%02d UTC: cohortd "
			    "refuses it; renew it (the CA and cohortd are not "
			    "at fault)",
			    cert, what, t->year, t->mon, t->day, t->hour,
			    t->min, t->sec);
			bad = true;
		}
	}
	mbedtls_x509_crt_free(&crt);
	return (bad);
}

const char *
cohort__tls_explain(
    int nng_err, const char *url, const char *cert, char *buf, size_t len)
{
	char host[256], port[16];

	if (tls_port_is_plain(url)
	    && tls_url_split(url, host, sizeof(host), port, sizeof(port))) {
		snprintf(buf, len,
		    "the coordinator's port %s speaks plain tcp://, not TLS: "
		    "dial tcp://%s:%s, or the port of cohortd's tls+tcp:// "
		    "listener",
		    port, host, port);
		return (buf);
	}
	if (cert != NULL && cert[0] != '\0'
	    && tls_cert_invalid_now(cert, buf, len))
		return (buf);
	snprintf(buf, len, "%s", cohort__tls_hint(nng_err));
	return (buf);
}
