/*
 * tls.h - TLS configurations for nng's tls+tcp:// transport, shared by
 * cohortd's listeners and the client's dialer (docs/security.md).
 */
#ifndef COHORT_PROTO_TLS_H
#define COHORT_PROTO_TLS_H

#include <stdbool.h>

#include <nng/nng.h>
#include <nng/supplemental/tls/tls.h>

#include "cohort_common.h"

/* Whether url uses the TLS transport (tls+tcp://, tls+tcp4/6://). */
bool cohort__tls_url(const char *url);

/*
 * Builds a TLS configuration. server: cohortd's side, else a client's.
 * cert and key: PEM files of this side's certificate chain and private
 * key (both or neither; a server needs them). ca: PEM file of the CA that
 * signs the other side's certificate; verify: the other side must present
 * a certificate signed by it (a client always verifies cohortd, so ca is
 * required there). server_name: the name cohortd's certificate must carry
 * (client side). On failure ETLS-like statuses name the file and what nng
 * or mbed TLS said, and *out is untouched.
 */
cohort_status cohort__tls_config(nng_tls_config **out, bool server,
    const char *cert, const char *key, const char *ca, const char *server_name,
    bool verify);

/* Explains an nng error of a TLS connection attempt (ECRYPTO, EPEERAUTH,
 * ECLOSED during the handshake): what to check. */
const char *cohort__tls_hint(int nng_err);

/* The same, after looking: whether url's port speaks plain tcp:// (an
 * SP header comes unasked; a TLS server waits for the ClientHello), and
 * whether this side's certificate (cert, a PEM file; NULL: none) is out
 * of its validity; else cohort__tls_hint. Written into buf; returns buf.
 * Blocks up to about a second (a connect and a short read). */
const char *cohort__tls_explain(
    int nng_err, const char *url, const char *cert, char *buf, size_t len);

#endif /* COHORT_PROTO_TLS_H */
