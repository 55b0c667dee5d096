/*
 * handshake.h - the tcp mesh handshake as pure functions over bytes (its
 * messages, proofs and refusals) and the acceptor's table of pending
 * connections (who gets a slot, who is evicted). mesh.c does the I/O;
 * fuzz/fuzz_handshake.c drives these with arbitrary input.
 *
 * Messages (all integers big-endian):
 *   acceptor -> connector  "CHS1" version rank_a nonce_a[16]         (28 B)
 *   connector -> acceptor  "CHC1" ident[32] rank_c rank_a nonce_c[16]
 *                          mac_c[32]                                 (92 B)
 *   acceptor -> connector  "CHA1" mac_a[32]                          (36 B)
 *   acceptor -> connector  "CHR1" reason                              (8 B)
 * A refusal (CHR1) replaces the greeting's successor or the accept, and
 * the acceptor closes right after it; its reason tells the connector what
 * happened (busy: try again; another job; a wrong secret) and reveals
 * nothing a stranger could not learn by trying.
 */
#ifndef COHORT_TCP_HANDSHAKE_H
#define COHORT_TCP_HANDSHAKE_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort_common.h"

#define COHORT__TCP_HS_VERSION 1u
#define COHORT__TCP_SHELLO_LEN 28
#define COHORT__TCP_CHELLO_LEN 92
#define COHORT__TCP_ACCEPT_LEN 36
#define COHORT__TCP_REFUSAL_LEN 8

/* Why an acceptor refused a connection (CHR1's reason). */
enum cohort__tcp_hs_reason {
	COHORT__TCP_HS_OK = 0,
	COHORT__TCP_HS_BUSY = 1, /* evicted: too many pending connections */
	COHORT__TCP_HS_TIMEOUT = 2, /* no hello within the handshake time */
	COHORT__TCP_HS_NOT_HELLO = 3, /* not a cohort tcp hello */
	COHORT__TCP_HS_OTHER_GROUP = 4, /* other job, group or generation */
	COHORT__TCP_HS_BAD_RANKS = 5, /* ranks that cannot connect here */
	COHORT__TCP_HS_BAD_PROOF = 6, /* wrong proof of the job secret */
	COHORT__TCP_HS_DUPLICATE = 7, /* that rank is already connected */
	COHORT__TCP_HS_REASON_MAX = 7,
};

/* What one side needs to prove itself and check the other. */
struct cohort__tcp_hs_keys {
	const uint8_t *secret;
	size_t secret_len;
	uint8_t ident[32]; /* cohort__tcp_hs_ident() */
};

/* ident = SHA-256("cohort-tcp-v1" 0 job 0 group_id 0 generation(be64)). */
void cohort__tcp_hs_ident(const char *job, const char *group_id,
    uint64_t generation, uint8_t out[32]);

/* mac = HMAC(secret, role, ident, nonce_a, nonce_c, rank_c, rank_a). */
void cohort__tcp_hs_mac(const struct cohort__tcp_hs_keys *k, char role,
    const uint8_t na[16], const uint8_t nc[16], uint32_t rank_c,
    uint32_t rank_a, uint8_t out[32]);

const char *cohort__tcp_hs_reason_text(uint32_t reason);

/* Encoders. */
void cohort__tcp_hs_put_shello(uint8_t out[COHORT__TCP_SHELLO_LEN],
    uint32_t rank_a, const uint8_t na[16]);
void cohort__tcp_hs_put_chello(uint8_t out[COHORT__TCP_CHELLO_LEN],
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16],
    const uint8_t nc[16], uint32_t rank_c, uint32_t rank_a);
void cohort__tcp_hs_put_accept(uint8_t out[COHORT__TCP_ACCEPT_LEN],
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16],
    const uint8_t nc[16], uint32_t rank_c, uint32_t rank_a);
void cohort__tcp_hs_put_refusal(
    uint8_t out[COHORT__TCP_REFUSAL_LEN], uint32_t reason);

/*
 * Parsers of what the connector receives: the first len bytes of a
 * greeting (expected rank_a) or of the answer to its hello. Each returns
 * 0 when more bytes are needed (*need says how many in all), 1 when the
 * message is complete and good, -1 when it is a refusal (*reason set) and
 * -2 when it is malformed (*reason = COHORT__TCP_HS_NOT_HELLO).
 */
int cohort__tcp_hs_parse_shello(const uint8_t *buf, size_t len,
    uint32_t rank_a, uint8_t na[16], size_t *need, uint32_t *reason);
int cohort__tcp_hs_parse_answer(const uint8_t *buf, size_t len,
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16],
    const uint8_t nc[16], uint32_t rank_c, uint32_t rank_a, size_t *need,
    uint32_t *reason);

/*
 * The acceptor's check of a complete hello (COHORT__TCP_CHELLO_LEN bytes)
 * sent to rank_a after a greeting with nonce na: COHORT__TCP_HS_OK with
 * *rank_c set to the connecting rank (below rank_a), or the reason to
 * refuse. Whether that rank is already connected is the caller's check.
 */
uint32_t cohort__tcp_hs_check_chello(const uint8_t *buf, size_t len,
    const struct cohort__tcp_hs_keys *k, const uint8_t na[16], uint32_t rank_a,
    uint32_t *rank_c);

/*
 * The acceptor's pending connections. A slot is held from accept until
 * the hello is checked or the handshake time runs out. Admission never
 * refuses the newcomer: when its source (IP address, port ignored)
 * already holds per_src slots, that source's oldest slot is evicted; when
 * the table is full, the oldest slot of the source holding the most is.
 * So strangers, silent or not, can hold at most per_src slots each and
 * delay nobody; a real peer that is evicted all the same (a flood from
 * its own address) is told BUSY and connects again.
 */
struct cohort__tcp_pend {
	int fd; /* -1: free */
	uint8_t src[16]; /* IPv4 in the first 4 bytes, or IPv6 */
	cohort__time since; /* accepted at */
	cohort__time deadline; /* hello due by */
	uint8_t nonce[16];
	uint8_t buf[COHORT__TCP_CHELLO_LEN];
	size_t have;
};

/* Chooses the slot a newcomer from src takes in pend[0..max): returns its
 * index; *evict is true when that slot is occupied and must be refused
 * (BUSY) and closed first. */
int cohort__tcp_pend_admit(const struct cohort__tcp_pend *pend, int max,
    const uint8_t src[16], int per_src, bool *evict);

#endif /* COHORT_TCP_HANDSHAKE_H */
