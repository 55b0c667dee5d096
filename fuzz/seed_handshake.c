/*
 * seed_handshake.c - writes the seed corpus of fuzz_handshake.c into the
 * directory argv[1], every message made by the project's own encoder
 * (handshake.c): a greeting, a hello, an accept, each refusal, and a few
 * admission streams; each file is the mode byte then the message.
 */
#include <stdio.h>
#include <string.h>

#include "fuzz_handshake_keys.h"

static int
seed(const char *dir, const char *name, uint8_t mode, const uint8_t *msg,
    size_t len)
{
	char path[4096];
	FILE *f;

	snprintf(path, sizeof(path), "%s/%s", dir, name);
	if ((f = fopen(path, "wb")) == NULL) {
		perror(path);
		return (1);
	}
	fputc(mode, f);
	fwrite(msg, 1, len, f);
	return (fclose(f) != 0);
}

int
main(int argc, char **argv)
{
	struct cohort__tcp_hs_keys k;
	uint8_t sh[COHORT__TCP_SHELLO_LEN], ch[COHORT__TCP_CHELLO_LEN];
	uint8_t ac[COHORT__TCP_ACCEPT_LEN], rf[COHORT__TCP_REFUSAL_LEN];
	uint8_t ev[3 * 64];
	char name[64];
	int bad = 0;

	if (argc != 2) {
		fprintf(stderr, "usage: %s DIR\n", argv[0]);
		return (2);
	}
	fz_keys(&k);
	cohort__tcp_hs_put_shello(sh, FZ_RANK_A, fz_na);
	cohort__tcp_hs_put_chello(ch, &k, fz_na, fz_nc, FZ_RANK_C, FZ_RANK_A);
	cohort__tcp_hs_put_accept(ac, &k, fz_na, fz_nc, FZ_RANK_C, FZ_RANK_A);
	bad |= seed(argv[1], "shello", 0, sh, sizeof(sh));
	bad |= seed(argv[1], "answer-accept", 1, ac, sizeof(ac));
	bad |= seed(argv[1], "chello", 2, ch, sizeof(ch));
	for (uint32_t r = 1; r <= COHORT__TCP_HS_REASON_MAX; r++) {
		cohort__tcp_hs_put_refusal(rf, r);
		snprintf(name, sizeof(name), "refusal-%u", r);
		bad |= seed(argv[1], name, 1, rf, sizeof(rf));
		snprintf(name, sizeof(name), "shello-refusal-%u", r);
		bad |= seed(argv[1], name, 0, rf, sizeof(rf));
	}
	/* admission: a flood from source 1, then sources 2..4 */
	for (int i = 0; i < 64; i++) {
		ev[3 * i] = (uint8_t)(i < 40 ? 1 : 2 + i % 3);
		ev[3 * i + 1] = (uint8_t)(i % 5);
		ev[3 * i + 2] = (uint8_t)(i % 7 == 6 ? 2 * (i % 8) + 1 : 0);
	}
	bad |= seed(argv[1], "admit-flood", 3, ev, sizeof(ev));
	return (bad ? 1 : 0);
}
