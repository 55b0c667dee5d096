/*
 * fuzz_handshake_keys.h - the fixed identity the handshake fuzz target
 * and its seed generator share: a job secret, nonces and ranks.
 */
#ifndef COHORT_FUZZ_HANDSHAKE_KEYS_H
#define COHORT_FUZZ_HANDSHAKE_KEYS_H

#include "backend/host/handshake.h"

#define FZ_RANK_A 5u
#define FZ_RANK_C 2u

static const uint8_t fz_secret[16] = "0123456789abcdef";
static const uint8_t fz_na[16] = "nonce-of-accept!";
static const uint8_t fz_nc[16] = "nonce-of-connect";

static inline void
fz_keys(struct cohort__tcp_hs_keys *k)
{
	k->secret = fz_secret;
	k->secret_len = sizeof(fz_secret);
	cohort__tcp_hs_ident("fuzzjob", "g0", 3, k->ident);
}

#endif /* COHORT_FUZZ_HANDSHAKE_KEYS_H */
