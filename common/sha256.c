/*
 * sha256.c - SHA-256 and HMAC-SHA-256 through mbed TLS (sha256.h).
 */
#include <string.h>

#include "sha256.h"

void
cohort__sha256_init(struct cohort__sha256 *c)
{
	mbedtls_sha256_init(&c->ctx);
	(void)mbedtls_sha256_starts_ret(&c->ctx, 0);
}

void
cohort__sha256_update(struct cohort__sha256 *c, const void *data, size_t len)
{
	(void)mbedtls_sha256_update_ret(&c->ctx, data, len);
}

void
cohort__sha256_final(struct cohort__sha256 *c, uint8_t out[32])
{
	(void)mbedtls_sha256_finish_ret(&c->ctx, out);
	mbedtls_sha256_free(&c->ctx);
}

void
cohort__hmac_init(struct cohort__hmac *h, const uint8_t *key, size_t keylen)
{
	const mbedtls_md_info_t *md
	    = mbedtls_md_info_from_type(MBEDTLS_MD_SHA256);

	mbedtls_md_init(&h->ctx);
	h->ok = md != NULL && mbedtls_md_setup(&h->ctx, md, 1) == 0
	    && mbedtls_md_hmac_starts(&h->ctx, key, keylen) == 0;
}

void
cohort__hmac_update(struct cohort__hmac *h, const void *data, size_t len)
{
	if (h->ok)
		(void)mbedtls_md_hmac_update(&h->ctx, data, len);
}

void
cohort__hmac_final(struct cohort__hmac *h, uint8_t out[32])
{
	if (!h->ok || mbedtls_md_hmac_finish(&h->ctx, out) != 0)
		memset(out, 0, 32);
	mbedtls_md_free(&h->ctx);
}
