/*
 * handshake.c - the tcp mesh handshake's messages, proofs and pending
 * table (handshake.h); no I/O here.
 */
#include <string.h>

#include "handshake.h"
#include "sha256.h"

static void
hs_put32(uint8_t *p, uint32_t v)
{
	p[0] = (uint8_t)(v >> 24);
	p[1] = (uint8_t)(v >> 16);
	p[2] = (uint8_t)(v >> 8);
	p[3] = (uint8_t)v;
}

static uint32_t
hs_get32(const uint8_t *p)
{
	return ((uint32_t)p[0] << 24 | (uint32_t)p[1] << 16
	    | (uint32_t)p[2] << 8 | (uint32_t)p[3]);
}

static bool
hs_mac_equal(const uint8_t *a, const uint8_t *b)
{
	uint8_t d = 0;

	for (int i = 0; i < 32; i++)
		d |= (uint8_t)(a[i] ^ b[i]);
	return (d == 0);
}

void
cohort__tcp_hs_ident(const char *job, const char *group_id,
    uint64_t generation, uint8_t out[32])
{
	struct cohort__sha256 c;
	uint8_t zero = 0;
	uint8_t gen[8];

	for (int i = 0; i < 8; i++)
		gen[i] = (uint8_t)(generation >> (56 - 8 * i));
	cohort__sha256_init(&c);
	cohort__sha256_update(&c, "cohort-tcp-v1", 13);
	cohort__sha256_update(&c, &zero, 1);
	cohort__sha256_update(&c, job, strlen(job));
	cohort__sha256_update(&c, &zero, 1);
	cohort__sha256_update(&c, group_id, strlen(group_id));
	cohort__sha256_update(&c, &zero, 1);
	cohort__sha256_update(&c, gen, 8);
	cohort__sha256_final(&c, out);
}

void
cohort__tcp_hs_mac(const struct cohort__tcp_hs_keys *k, char role,
    const uint8_t na[16], const uint8_t nc[16], uint32_t rank_c,
    uint32_t rank_a, uint8_t out[32])
{
	struct cohort__hmac h;
	uint8_t r[8];

	hs_put32(r, rank_c);
	hs_put32(r + 4, rank_a);
	cohort__hmac_init(&h, k->secret, k->secret_len);
	cohort__hmac_update(&h, &role, 1);
	cohort__hmac_update(&h, k->ident, 32);
	cohort__hmac_update(&h, na, 16);
	cohort__hmac_update(&h, nc, 16);
	cohort__hmac_update(&h, r, 8);
	cohort__hmac_final(&h, out);
}

const char *
cohort__tcp_hs_reason_text(uint32_t reason)
{
	switch (reason) {
	case COHORT__TCP_HS_OK:
		return ("accepted");
	case COHORT__TCP_HS_BUSY:
		return ("too many pending connections at the listener (a "
		        "flood of other connections?)");
	case COHORT__TCP_HS_TIMEOUT:
		return ("no hello within the handshake time "
		        "(COHORT_TCP_HS_TIMEOUT_MS)");
	case COHORT__TCP_HS_NOT_HELLO:
		return ("not a cohort tcp hello");
	case COHORT__TCP_HS_OTHER_GROUP:
		return ("another job, group or generation (a stale process?)");
	case COHORT__TCP_HS_BAD_RANKS:
		return ("ranks that do not connect this way");
	case COHORT__TCP_HS_BAD_PROOF:
		return ("wrong proof of the job secret (another token or "
		        "secret?)");
	case COHORT__TCP_HS_DUPLICATE:
		return ("that rank is already connected");
	default:
		return ("unknown reason");
	}
}

void
cohort__tcp_hs_put_shello(
    uint8_t out[COHORT__TCP_SHELLO_LEN], uint32_t rank_a, const uint8_t na[16])
{
	memcpy(out, "CHS1", 4);
	hs_put32(out + 4, COHORT__TCP_HS_VERSION);
	hs_put32(out + 8, rank_a);
	memcpy(out + 12, na, 16);
}

void
cohort__tcp_hs_put_chello(uint8_t out[COHORT__TCP_CHELLO_LEN],
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16],
    const uint8_t nc[16], uint32_t rank_c, uint32_t rank_a)
{
	memcpy(out, "CHC1", 4);
	memcpy(out + 4, k->ident, 32);
	hs_put32(out + 36, rank_c);
	hs_put32(out + 40, rank_a);
	memcpy(out + 44, nc, 16);
	cohort__tcp_hs_mac(k, 'C', na, nc, rank_c, rank_a, out + 60);
}

void
cohort__tcp_hs_put_accept(uint8_t out[COHORT__TCP_ACCEPT_LEN],
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16],
    const uint8_t nc[16], uint32_t rank_c, uint32_t rank_a)
{
	memcpy(out, "CHA1", 4);
	cohort__tcp_hs_mac(k, 'A', na, nc, rank_c, rank_a, out + 4);
}

void
cohort__tcp_hs_put_refusal(
    uint8_t out[COHORT__TCP_REFUSAL_LEN], uint32_t reason)
{
	memcpy(out, "CHR1", 4);
	hs_put32(out + 4, reason);
}

/* The common front of the two parsers: a refusal, or a message of length
 * full starting with tag. */
static int
hs_front(const uint8_t *buf, size_t len, const char *tag, size_t full,
    size_t *need, uint32_t *reason)
{
	*need = 4;
	if (len < 4)
		return (0);
	if (memcmp(buf, "CHR1", 4) == 0) {
		*need = COHORT__TCP_REFUSAL_LEN;
		if (len < COHORT__TCP_REFUSAL_LEN)
			return (0);
		*reason = hs_get32(buf + 4);
		if (*reason == COHORT__TCP_HS_OK
		    || *reason > COHORT__TCP_HS_REASON_MAX) {
			*reason = COHORT__TCP_HS_NOT_HELLO;
			return (-2);
		}
		return (-1);
	}
	if (memcmp(buf, tag, 4) != 0) {
		*reason = COHORT__TCP_HS_NOT_HELLO;
		return (-2);
	}
	*need = full;
	return (len < full ? 0 : 1);
}

int
cohort__tcp_hs_parse_shello(const uint8_t *buf, size_t len, uint32_t rank_a,
    uint8_t na[16], size_t *need, uint32_t *reason)
{
	int rv
	    = hs_front(buf, len, "CHS1", COHORT__TCP_SHELLO_LEN, need, reason);

	if (rv != 1)
		return (rv);
	if (hs_get32(buf + 4) != COHORT__TCP_HS_VERSION
	    || hs_get32(buf + 8) != rank_a) {
		*reason = COHORT__TCP_HS_NOT_HELLO;
		return (-2);
	}
	memcpy(na, buf + 12, 16);
	return (1);
}

int
cohort__tcp_hs_parse_answer(const uint8_t *buf, size_t len,
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16],
    const uint8_t nc[16], uint32_t rank_c, uint32_t rank_a, size_t *need,
    uint32_t *reason)
{
	uint8_t mac[32];
	int rv
	    = hs_front(buf, len, "CHA1", COHORT__TCP_ACCEPT_LEN, need, reason);

	if (rv != 1)
		return (rv);
	cohort__tcp_hs_mac(k, 'A', na, nc, rank_c, rank_a, mac);
	if (!hs_mac_equal(buf + 4, mac)) {
		*reason = COHORT__TCP_HS_BAD_PROOF;
		return (-2);
	}
	return (1);
}

uint32_t
cohort__tcp_hs_check_chello(const uint8_t *buf, size_t len,
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16], uint32_t rank_a,
    uint32_t *rank_c)
{
	uint8_t mac[32];
	uint32_t rc;

	if (len < COHORT__TCP_CHELLO_LEN || memcmp(buf, "CHC1", 4) != 0)
		return (COHORT__TCP_HS_NOT_HELLO);
	if (memcmp(buf + 4, k->ident, 32) != 0)
		return (COHORT__TCP_HS_OTHER_GROUP);
	rc = hs_get32(buf + 36);
	if (hs_get32(buf + 40) != rank_a || rc >= rank_a)
		return (COHORT__TCP_HS_BAD_RANKS);
	cohort__tcp_hs_mac(k, 'C', na, buf + 44, rc, rank_a, mac);
	if (!hs_mac_equal(buf + 60, mac))
		return (COHORT__TCP_HS_BAD_PROOF);
	*rank_c = rc;
	return (COHORT__TCP_HS_OK);
}

int
cohort__tcp_pend_admit(const struct cohort__tcp_pend *pend, int max,
    const uint8_t src[16], int per_src, bool *evict)
{
	int free_slot = -1, own_oldest = -1, own = 0;
	int top = -1, top_count = 0;

	*evict = false;
	for (int i = 0; i < max; i++) {
		if (pend[i].fd < 0) {
			if (free_slot < 0)
				free_slot = i;
			continue;
		}
		if (memcmp(pend[i].src, src, 16) == 0) {
			own++;
			if (own_oldest < 0
			    || pend[i].since < pend[own_oldest].since)
				own_oldest = i;
		}
	}
	if (own >= per_src && own_oldest >= 0) {
		*evict = true;
		return (own_oldest);
	}
	if (free_slot >= 0)
		return (free_slot);
	/* Full: the oldest slot of the source holding the most. */
	for (int i = 0; i < max; i++) {
		int n = 0;

		for (int j = 0; j < max; j++)
			if (memcmp(pend[j].src, pend[i].src, 16) == 0)
				n++;
		if (n > top_count
		    || (n == top_count && pend[i].since < pend[top].since)) {
			top = i;
			top_count = n;
		}
	}
	*evict = true;
	return (top);
}
