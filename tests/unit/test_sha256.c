/*
 * test_sha256.c - common/sha256.c against the standards' own vectors:
 * FIPS 180-4 (SHA-256 of "abc" and of the empty string) and RFC 4231
 * test case 2 (HMAC-SHA-256 with the key "Jefe"), fed in pieces.
 */
#include <stdio.h>
#include <string.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "sha256.h"

static void
hex(const uint8_t *b, char *out)
{
	for (int i = 0; i < 32; i++)
		snprintf(out + 2 * i, 3, "%02x", b[i]);
}

START_TEST(test_sha256_vectors)
{
	struct cohort__sha256 c;
	uint8_t d[32];
	char h[65];

	cohort__sha256_init(&c);
	cohort__sha256_update(&c, "a", 1);
	cohort__sha256_update(&c, "bc", 2);
	cohort__sha256_final(&c, d);
	hex(d, h);
	ck_assert_str_eq(h,
	    "ba7816bf8f01cfea414140de5dae2223"
	    "b00361a396177a9cb410ff61f20015ad");
	cohort__sha256_init(&c);
	cohort__sha256_final(&c, d);
	hex(d, h);
	ck_assert_str_eq(h,
	    "e3b0c44298fc1c149afbf4c8996fb924"
	    "27ae41e4649b934ca495991b7852b855");
}
END_TEST

START_TEST(test_hmac_rfc4231_case2)
{
	struct cohort__hmac m;
	uint8_t d[32];
	char h[65];
	const char *msg = "what do ya want for nothing?";

	cohort__hmac_init(&m, (const uint8_t *)"Jefe", 4);
	cohort__hmac_update(&m, msg, 10);
	cohort__hmac_update(&m, msg + 10, strlen(msg) - 10);
	cohort__hmac_final(&m, d);
	hex(d, h);
	ck_assert_str_eq(h,
	    "5bdcc146bf60754e6a042426089575c7"
	    "5a003f089d2739839dec58b964ec3843");
}
END_TEST

Suite *suite_sha256(void);

UNIT_SUITE(sha256, "vectors", 0, test_sha256_vectors, test_hmac_rfc4231_case2)
