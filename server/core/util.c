/*
 * util.c - copies, a constant-time token comparison, texts of durations
 * and rank lists.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "util.h"

char *
srv_strdup(const char *s)
{
	size_t n = strlen(s) + 1;
	char *d = malloc(n);

	if (d != NULL)
		memcpy(d, s, n);
	return (d);
}

bool
srv_token_eq(const char *a, const char *b)
{
	size_t la = strlen(a), lb = strlen(b);
	unsigned d = la != lb;

	/* Time independent of where the first difference is. */
	for (size_t i = 0; i < la; i++)
		d |= (unsigned char)a[i] ^ (unsigned char)(i < lb ? b[i] : 0);
	return (d == 0);
}

void
srv_fmt_secs(char *buf, size_t len, cohort__time ms)
{
	snprintf(buf, len, "%.1f s", (double)ms / 1000.0);
}

void
srv_fmt_ranks(char *buf, size_t len, const int32_t *r, size_t n)
{
	size_t off = 0;

	buf[0] = '\0';
	if (r == NULL)
		return;
	for (size_t i = 0; i < n; i++) {
		if (i == 32 && n > 40) {
			cohort__appendf(
			    buf, len, &off, " and %zu more", n - i);
			break;
		}
		cohort__appendf(buf, len, &off, "%s%d", i ? ", " : "", r[i]);
	}
}

void
srv_fmt_absent(char *buf, size_t len, size_t *off, const char *what,
    cohort__time waited, const int32_t *miss, size_t nm, const char *how)
{
	char rb[512], secs[32];

	srv_fmt_ranks(rb, sizeof(rb), miss, nm);
	srv_fmt_secs(secs, sizeof(secs), waited);
	cohort__appendf(buf, len, off, "%s timed out after %s; rank%s %s %s",
	    what, secs, nm == 1 ? "" : "s", rb, how);
}

void
srv_fmt_never_arrived(char *buf, size_t len, size_t *off, const char *what,
    cohort__time waited, const int32_t *miss, size_t nm)
{
	srv_fmt_absent(buf, len, off, what, waited, miss, nm, "never arrived");
}
