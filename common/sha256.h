/*
 * sha256.h - SHA-256 and HMAC-SHA-256 over mbed TLS (already a dependency
 * of nng): the job secret derived from its token, and the tcp backend's
 * mutual handshake. Every init is followed by its final, which releases
 * what init took.
 */
#ifndef COHORT_COMMON_SHA256_H
#define COHORT_COMMON_SHA256_H

#include <stddef.h>
#include <stdint.h>

#include <mbedtls/md.h>
#include <mbedtls/sha256.h>

struct cohort__sha256 {
	mbedtls_sha256_context ctx;
};
void cohort__sha256_init(struct cohort__sha256 *c);
void cohort__sha256_update(
    struct cohort__sha256 *c, const void *data, size_t len);
void cohort__sha256_final(struct cohort__sha256 *c, uint8_t out[32]);

struct cohort__hmac {
	mbedtls_md_context_t ctx;
	int ok; /* 0: setup failed, final writes zeros (never matches) */
};
void cohort__hmac_init(
    struct cohort__hmac *h, const uint8_t *key, size_t keylen);
void cohort__hmac_update(struct cohort__hmac *h, const void *data, size_t len);
void cohort__hmac_final(struct cohort__hmac *h, uint8_t out[32]);

#endif /* COHORT_COMMON_SHA256_H */
