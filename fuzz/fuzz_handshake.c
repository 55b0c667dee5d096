/*
 * fuzz_handshake.c - libFuzzer target for the tcp mesh handshake
 * (client/backend/host/handshake.c): the connector's parsers of the
 * greeting and of the answer to its hello (whole and byte by byte, as
 * partial reads deliver them), the acceptor's check of a hello, and the
 * pending table's admission policy under a stream of arrivals.
 *
 * Input: byte 0 picks the mode (mod 4), the rest is the message or, for
 * the pending table, a list of 3-byte events (source, time step, action).
 * Properties checked (abort() = a finding):
 *   - a parser never reads past len and agrees with itself whether the
 *     bytes come at once or one by one;
 *   - a hello the acceptor accepts is byte for byte the hello the
 *     encoder makes for that rank and nonce (no forgery without the
 *     secret), and an accepted answer carries the right MAC;
 *   - admission returns a slot in range, never leaves a source more than
 *     its share, and evicts only when it must.
 *
 * Build and run before `make fuzz` (fuzz/seed_handshake.c writes seeds
 * made by the project's own encoder):
 *   clang -g -O1 -fsanitize=fuzzer,address,undefined -std=c11 -D_GNU_SOURCE \
 *     -Iinclude -iquote common -iquote client fuzz/fuzz_handshake.c \
 *     client/backend/host/handshake.c common/sha256.c -lmbedcrypto \
 *     -o build/fuzz_handshake
 *   clang -g -O1 -std=c11 -D_GNU_SOURCE -Iinclude -iquote common \
 *     -iquote client fuzz/seed_handshake.c \
 *     client/backend/host/handshake.c common/sha256.c -lmbedcrypto \
 *     -o build/seed_handshake
 *   mkdir -p build/corpus/handshake && build/seed_handshake \
 *     build/corpus/handshake
 *   build/fuzz_handshake -max_total_time=600 build/corpus/handshake
 */
#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <stdlib.h>
#include <string.h>

#include "backend/host/handshake.h"

#include "fuzz_handshake_keys.h"

static void
check(bool ok)
{
	if (!ok)
		abort();
}

/* Parses buf at once and byte by byte (growing len the way partial
 * reads do); both must agree. */
static void
fuzz_shello(const uint8_t *buf, size_t len)
{
	uint8_t na[16], na2[16];
	uint32_t reason = 0, reason2 = 0;
	size_t need = 0, have = 0;
	int all, part = 0;
	uint8_t *copy = malloc(len + 1);

	memcpy(copy, buf, len);
	all = cohort__tcp_hs_parse_shello(
	    copy, len, FZ_RANK_A, na, &need, &reason);
	check(all >= -2 && all <= 1);
	/* feed exactly what the parser asks for, as tcp_hs_connect does */
	need = 4;
	while (have < len) {
		have = need < len ? need : len;
		part = cohort__tcp_hs_parse_shello(
		    copy, have, FZ_RANK_A, na2, &need, &reason2);
		if (part != 0)
			break;
		check(need > have && need <= COHORT__TCP_SHELLO_LEN);
	}
	if (part == 1) {
		check(all == 1);
		check(memcmp(na, na2, 16) == 0);
	}
	if (part < 0)
		check(all == part && reason == reason2);
	free(copy);
}

static void
fuzz_answer(const uint8_t *buf, size_t len)
{
	struct cohort__tcp_hs_keys k;
	uint8_t ac[COHORT__TCP_ACCEPT_LEN];
	uint32_t reason = 0;
	size_t need = 0;
	uint8_t *copy = malloc(len + 1);
	int p;

	fz_keys(&k);
	memcpy(copy, buf, len);
	p = cohort__tcp_hs_parse_answer(
	    copy, len, &k, fz_na, fz_nc, FZ_RANK_C, FZ_RANK_A, &need, &reason);
	check(p >= -2 && p <= 1);
	if (p == 1) {
		cohort__tcp_hs_put_accept(
		    ac, &k, fz_na, fz_nc, FZ_RANK_C, FZ_RANK_A);
		check(memcmp(copy, ac, sizeof(ac)) == 0);
	}
	if (p == -1)
		check(reason >= 1 && reason <= COHORT__TCP_HS_REASON_MAX);
	free(copy);
}

static void
fuzz_chello(const uint8_t *buf, size_t len)
{
	struct cohort__tcp_hs_keys k;
	uint8_t ch[COHORT__TCP_CHELLO_LEN];
	uint32_t rc = 0xffffffffu, reason;
	uint8_t *copy = malloc(len + 1);

	fz_keys(&k);
	memcpy(copy, buf, len);
	reason = cohort__tcp_hs_check_chello(
	    copy, len, &k, fz_na, FZ_RANK_A, &rc);
	check(reason <= COHORT__TCP_HS_REASON_MAX);
	if (reason == COHORT__TCP_HS_OK) {
		check(rc < FZ_RANK_A);
		cohort__tcp_hs_put_chello(
		    ch, &k, fz_na, copy + 44, rc, FZ_RANK_A);
		check(memcmp(copy, ch, sizeof(ch)) == 0);
	}
	free(copy);
}

#define FZ_SLOTS 8
#define FZ_PER_SRC 3

static void
fuzz_admit(const uint8_t *buf, size_t len)
{
	struct cohort__tcp_pend pend[FZ_SLOTS];
	cohort__time now = 0;
	int next_fd = 100;

	memset(pend, 0, sizeof(pend));
	for (int i = 0; i < FZ_SLOTS; i++)
		pend[i].fd = -1;
	for (size_t off = 0; off + 3 <= len; off += 3) {
		uint8_t src[16] = { 10, 0, 0, (uint8_t)(buf[off] & 7) };
		int used = 0, own = 0, slot;
		bool evict;

		now += buf[off + 1];
		if (buf[off + 2] & 1) {
			/* a handshake ends: free one slot */
			int i = buf[off + 2] % FZ_SLOTS;

			pend[i].fd = -1;
			continue;
		}
		for (int i = 0; i < FZ_SLOTS; i++) {
			if (pend[i].fd < 0)
				continue;
			used++;
			if (memcmp(pend[i].src, src, 16) == 0)
				own++;
		}
		slot = cohort__tcp_pend_admit(
		    pend, FZ_SLOTS, src, FZ_PER_SRC, &evict);
		check(slot >= 0 && slot < FZ_SLOTS);
		check(evict == (pend[slot].fd >= 0));
		/* evict only when the source is at its share or all is
		 * full; and then the source's own slot if at its share */
		if (evict)
			check(own >= FZ_PER_SRC || used == FZ_SLOTS);
		if (own >= FZ_PER_SRC)
			check(memcmp(pend[slot].src, src, 16) == 0);
		pend[slot].fd = next_fd++;
		memcpy(pend[slot].src, src, 16);
		pend[slot].since = now;
		/* no source above its share */
		own = 0;
		for (int i = 0; i < FZ_SLOTS; i++)
			if (pend[i].fd >= 0
			    && memcmp(pend[i].src, src, 16) == 0)
				own++;
		check(own <= FZ_PER_SRC);
	}
}

int LLVMFuzzerTestOneInput(const uint8_t *data, size_t size);

int
LLVMFuzzerTestOneInput(const uint8_t *data, size_t size)
{
	if (size < 1)
		return (0);
	switch (data[0] % 4) {
	case 0:
		fuzz_shello(data + 1, size - 1);
		break;
	case 1:
		fuzz_answer(data + 1, size - 1);
		break;
	case 2:
		fuzz_chello(data + 1, size - 1);
		break;
	default:
		fuzz_admit(data + 1, size - 1);
		break;
	}
	return (0);
}
