/*
 * token.c - job tokens from files, and minted from an admin secret
 * (token.h).
 */
#include <errno.h>
#include <stdio.h>
#include <string.h>

#include "cohort_common.h"
#include "knobs.h"
#include "sha256.h"
#include "token.h"

cohort_status
cohort__secret_read(const char *what, const char *path, char *out, size_t len)
{
	FILE *f;
	size_t n;
	int c;

	if (path == NULL || path[0] == '\0')
		return (cohort__err(COHORT_EINVAL, "%s: no file given", what));
	if ((f = fopen(path, "rb")) == NULL)
		return (cohort__err(COHORT_EINVAL, "%s %s: cannot read: %s",
		    what, path, strerror(errno)));
	n = fread(out, 1, len > 0 ? len - 1 : 0, f);
	/* Anything left beyond trailing whitespace does not fit. */
	while ((c = fgetc(f)) == ' ' || c == '\t' || c == '\n' || c == '\r')
		;
	fclose(f);
	if (c != EOF)
		return (
		    cohort__err(COHORT_EINVAL, "%s %s: longer than %zu bytes",
		        what, path, len > 0 ? len - 1 : 0));
	while (n > 0
	    && (out[n - 1] == '\n' || out[n - 1] == '\r' || out[n - 1] == ' '
	        || out[n - 1] == '\t'))
		n--;
	out[n] = '\0';
	if (memchr(out, '\0', n) != NULL)
		return (cohort__err(
		    COHORT_EINVAL, "%s %s: holds a NUL byte", what, path));
	if (n == 0)
		return (
		    cohort__err(COHORT_EINVAL, "%s %s: empty", what, path));
	return (COHORT_OK);
}

void
cohort__token_mint(const char *admin, const char *job, char *out)
{
	static const char hex[] = "0123456789abcdef";
	struct cohort__hmac h;
	uint8_t mac[32];

	cohort__hmac_init(&h, (const uint8_t *)admin, strlen(admin));
	cohort__hmac_update(&h, job, strlen(job));
	cohort__hmac_final(&h, mac);
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hex[mac[i] >> 4];
		out[2 * i + 1] = hex[mac[i] & 15];
	}
	out[COHORT__MINTED_LEN] = '\0';
}

bool
cohort__token_is_minted(const char *admin, const char *job, const char *token)
{
	char want[COHORT__MINTED_LEN + 1];
	unsigned d = 0;

	if (admin == NULL || admin[0] == '\0'
	    || strlen(token) != COHORT__MINTED_LEN)
		return (false);
	cohort__token_mint(admin, job, want);
	for (size_t i = 0; i < COHORT__MINTED_LEN; i++)
		d |= (unsigned char)want[i] ^ (unsigned char)token[i];
	return (d == 0);
}

cohort_status
cohort__token_for_tool(const char *prog, const char *file, const char *cli,
    bool admin, char *buf, size_t len, const char **out)
{
	const char *what = "--token-file";
	cohort_status st;

	*out = "";
	if (file == NULL && cli != NULL) {
		fprintf(stderr,
		    "%s: warning: --token shows the token to every user of "
		    "this host (ps); use --token-file FILE or COHORT_TOKEN\n",
		    prog);
		*out = cli;
		return (COHORT_OK);
	}
	if (file == NULL && cohort__knob_str(COHORT__KNOB_TOKEN) != NULL) {
		*out = cohort__knob_str(COHORT__KNOB_TOKEN);
		return (COHORT_OK);
	}
	if (file == NULL
	    && (file = cohort__knob_str(COHORT__KNOB_TOKEN_FILE)) != NULL)
		what = "COHORT_TOKEN_FILE";
	if (file == NULL && admin
	    && (file = cohort__knob_str(COHORT__KNOB_ADMIN_TOKEN_FILE))
	        != NULL)
		what = "COHORT_ADMIN_TOKEN_FILE";
	if (file == NULL)
		return (COHORT_OK);
	if ((st = cohort__secret_read(what, file, buf, len)) != COHORT_OK)
		return (st);
	*out = buf;
	return (COHORT_OK);
}
