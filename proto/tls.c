/*
 * tls.c - TLS configurations for nng's tls+tcp:// transport (tls.h).
 * nng 1.5.2 with mbed TLS 2.28 (Debian's libnng1): certificates and keys
 * are handed over as PEM text, the CA as a file.
 */
#include <errno.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

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
		    "or does not carry the name COHORT_TLS_SERVER_NAME (or "
		    "the URL's host)");
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
