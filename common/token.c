/*
 * token.c - job tokens from files, and minted from an admin secret,
 * directly or through a tenant's key (token.h).
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

/* HMAC-SHA-256 of (msg, len) keyed with key, in lowercase hex. */
static void
token_hmac_hex(const char *key, const void *msg, size_t len, char *out)
{
	static const char hex[] = "0123456789abcdef";
	struct cohort__hmac h;
	uint8_t mac[32];

	cohort__hmac_init(&h, (const uint8_t *)key, strlen(key));
	cohort__hmac_update(&h, msg, len);
	cohort__hmac_final(&h, mac);
	for (int i = 0; i < 32; i++) {
		out[2 * i] = hex[mac[i] >> 4];
		out[2 * i + 1] = hex[mac[i] & 15];
	}
	out[COHORT__MINTED_LEN] = '\0';
}

void
cohort__token_mint(const char *secret, const char *job, char *out)
{
	token_hmac_hex(secret, job, strlen(job), out);
}

bool
cohort__tenant_name_ok(const char *name)
{
	size_t n = strlen(name);

	if (n == 0 || n > COHORT__TENANT_MAX || name[0] == '-'
	    || name[n - 1] == '-')
		return (false);
	for (size_t i = 0; i < n; i++)
		if (!((name[i] >= 'a' && name[i] <= 'z')
		        || (name[i] >= '0' && name[i] <= '9')
		        || name[i] == '-'))
			return (false);
	return (true);
}

bool
cohort__job_tenant(const char *job, char *out, size_t len)
{
	const char *slash = strchr(job, '/');
	size_t n;

	if (len > 0)
		out[0] = '\0';
	if (slash == NULL || slash[1] == '\0')
		return (false);
	n = (size_t)(slash - job);
	if (n == 0 || n > COHORT__TENANT_MAX || n >= len)
		return (false);
	memcpy(out, job, n);
	out[n] = '\0';
	if (!cohort__tenant_name_ok(out)) {
		out[0] = '\0';
		return (false);
	}
	return (true);
}

/* The message a tenant key is the HMAC of: a NUL follows the label, and
 * no job name holds one, so a tenant key is never a job's token. */
#define TOKEN_TENANT_LABEL "cohort-tenant"

void
cohort__tenant_key_mint(const char *admin, const char *tenant, char *out)
{
	char msg[sizeof(TOKEN_TENANT_LABEL) + COHORT__TENANT_MAX];
	size_t n = strlen(tenant);

	if (n > COHORT__TENANT_MAX)
		n = COHORT__TENANT_MAX;
	memcpy(msg, TOKEN_TENANT_LABEL, sizeof(TOKEN_TENANT_LABEL));
	memcpy(msg + sizeof(TOKEN_TENANT_LABEL), tenant, n);
	token_hmac_hex(admin, msg, sizeof(TOKEN_TENANT_LABEL) + n, out);
}

/* 0 when a and b (COHORT__MINTED_LEN bytes each) are equal; in time
 * independent of where they differ. */
static unsigned
token_diff(const char *a, const char *b)
{
	unsigned d = 0;

	for (size_t i = 0; i < COHORT__MINTED_LEN; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)b[i];
	return (d);
}

bool
cohort__token_is_minted(const char *admin, const char *job, const char *token)
{
	char want[COHORT__MINTED_LEN + 1], key[COHORT__MINTED_LEN + 1];
	char tenant[COHORT__TENANT_MAX + 1];
	bool ok;

	if (admin == NULL || admin[0] == '\0'
	    || strlen(token) != COHORT__MINTED_LEN)
		return (false);
	cohort__token_mint(admin, job, want);
	ok = token_diff(want, token) == 0;
	if (cohort__job_tenant(job, tenant, sizeof(tenant))) {
		cohort__tenant_key_mint(admin, tenant, key);
		cohort__token_mint(key, job, want);
		ok |= token_diff(want, token) == 0;
		memset(key, 0, sizeof(key));
	}
	return (ok);
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
