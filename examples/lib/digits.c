/*
 * digits.c - loading, splitting and sharding the digits data set.
 */
#include <ctype.h>
#include <errno.h>
#include <math.h>
#include <stdarg.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "digits.h"
#include "splitmix.h"

#define DIGITS_FIELDS (DIGITS_FEATURES + 1)
#define DIGITS_MAX_FILE (64u << 20)

static void
digits_err(char *err, size_t errlen, const char *fmt, ...)
{
	va_list ap;

	if (err == NULL || errlen == 0)
		return;
	va_start(ap, fmt);
	vsnprintf(err, errlen, fmt, ap);
	va_end(ap);
}

/* Parses one numeric field [p, end): optional blanks around a strtod
 * number. Returns 0 and *v, or -1. */
static int
digits_field(const char *p, const char *end, double *v)
{
	char buf[64];
	size_t len;
	char *stop;

	while (p < end && isspace((unsigned char)*p))
		p++;
	while (end > p && isspace((unsigned char)end[-1]))
		end--;
	len = (size_t)(end - p);
	if (len == 0 || len >= sizeof(buf))
		return (-1);
	memcpy(buf, p, len);
	buf[len] = '\0';
	errno = 0;
	*v = strtod(buf, &stop);
	if (errno != 0 || *stop != '\0' || !isfinite(*v))
		return (-1);
	return (0);
}

/* Shows at most 20 characters of a bad field. */
static void
digits_excerpt(const char *p, const char *end, char *buf, size_t len)
{
	size_t n = (size_t)(end - p);

	if (n > 20)
		n = 20;
	if (n >= len)
		n = len - 1;
	memcpy(buf, p, n);
	buf[n] = '\0';
}

/* Parses one line [p, end) into x (normalised) and *y. */
static int
digits_line(const char *p, const char *end, size_t lineno, float *x,
    uint8_t *y, char *err, size_t errlen)
{
	int field = 0;

	while (p <= end) {
		const char *comma = memchr(p, ',', (size_t)(end - p));
		const char *fend = comma != NULL ? comma : end;
		char ex[24];
		double v;

		if (field >= DIGITS_FIELDS) {
			digits_err(err, errlen,
			    "line %zu: more than %d fields (expected %d "
			    "pixels and a label)",
			    lineno, DIGITS_FIELDS, DIGITS_FEATURES);
			return (-1);
		}
		if (digits_field(p, fend, &v) != 0) {
			digits_excerpt(p, fend, ex, sizeof(ex));
			digits_err(err, errlen,
			    "line %zu, field %d: not a number: '%s'", lineno,
			    field + 1, ex);
			return (-1);
		}
		if (field < DIGITS_FEATURES) {
			if (v < 0.0 || v > DIGITS_MAX_PIXEL) {
				digits_err(err, errlen,
				    "line %zu, field %d: pixel %g out of "
				    "range 0..%g",
				    lineno, field + 1, v, DIGITS_MAX_PIXEL);
				return (-1);
			}
			x[field] = (float)(v / DIGITS_MAX_PIXEL);
		} else {
			if (v != floor(v) || v < 0 || v >= DIGITS_CLASSES) {
				digits_err(err, errlen,
				    "line %zu, field %d: label %g is not an "
				    "integer in 0..%d",
				    lineno, field + 1, v, DIGITS_CLASSES - 1);
				return (-1);
			}
			*y = (uint8_t)v;
		}
		field++;
		if (comma == NULL)
			break;
		p = comma + 1;
	}
	if (field != DIGITS_FIELDS) {
		digits_err(err, errlen,
		    "line %zu: expected %d fields (%d pixels and a label), "
		    "got %d",
		    lineno, DIGITS_FIELDS, DIGITS_FEATURES, field);
		return (-1);
	}
	return (0);
}

static int
digits_blank(const char *p, const char *end)
{
	while (p < end && isspace((unsigned char)*p))
		p++;
	return (p == end || *p == '#');
}

int
digits_parse(
    const char *text, size_t len, struct digits *out, char *err, size_t errlen)
{
	const char *p = text, *end = text + len;
	size_t lines = 0, n = 0, lineno = 0;
	struct digits d;

	/* Upper bound of the sample count: the number of lines. */
	for (size_t i = 0; i < len; i++)
		if (text[i] == '\n')
			lines++;
	lines++;

	d.n = 0;
	d.x = malloc(lines * DIGITS_FEATURES * sizeof(float));
	d.y = malloc(lines);
	if (d.x == NULL || d.y == NULL) {
		digits_free(&d);
		digits_err(err, errlen, "out of memory (%zu lines)", lines);
		return (-1);
	}
	while (p < end) {
		const char *nl = memchr(p, '\n', (size_t)(end - p));
		const char *le = nl != NULL ? nl : end;

		lineno++;
		if (le > p && le[-1] == '\r')
			le--;
		if (!digits_blank(p, le)) {
			if (digits_line(p, le, lineno,
			        d.x + n * DIGITS_FEATURES, d.y + n, err,
			        errlen)
			    != 0) {
				digits_free(&d);
				return (-1);
			}
			n++;
		}
		if (nl == NULL)
			break;
		p = nl + 1;
	}
	if (n == 0) {
		digits_free(&d);
		digits_err(err, errlen, "no samples (empty input)");
		return (-1);
	}
	d.n = n;
	*out = d;
	return (0);
}

int
digits_load(const char *path, struct digits *out, char *err, size_t errlen)
{
	FILE *f;
	char *text;
	size_t cap = 1 << 16, len = 0;
	char msg[256];
	int rv;

	if ((f = fopen(path, "rb")) == NULL) {
		digits_err(err, errlen, "%s: %s", path, strerror(errno));
		return (-1);
	}
	if ((text = malloc(cap)) == NULL) {
		fclose(f);
		digits_err(err, errlen, "%s: out of memory", path);
		return (-1);
	}
	for (;;) {
		size_t got;

		if (len == cap) {
			char *t;

			if (cap >= DIGITS_MAX_FILE) {
				digits_err(err, errlen,
				    "%s: larger than %u bytes", path,
				    DIGITS_MAX_FILE);
				goto out_fail;
			}
			if ((t = realloc(text, cap * 2)) == NULL) {
				digits_err(
				    err, errlen, "%s: out of memory", path);
				goto out_fail;
			}
			text = t;
			cap *= 2;
		}
		got = fread(text + len, 1, cap - len, f);
		len += got;
		if (got == 0)
			break;
	}
	if (ferror(f)) {
		digits_err(err, errlen, "%s: read error", path);
		goto out_fail;
	}
	fclose(f);
	rv = digits_parse(text, len, out, msg, sizeof(msg));
	free(text);
	if (rv != 0)
		digits_err(err, errlen, "%s: %s", path, msg);
	return (rv);

out_fail:
	free(text);
	fclose(f);
	return (-1);
}

void
digits_free(struct digits *d)
{
	if (d == NULL)
		return;
	free(d->x);
	free(d->y);
	d->x = NULL;
	d->y = NULL;
	d->n = 0;
}

/* Uniform in [0, bound) without modulo bias worth caring about here
 * (bound < 2^32, 64 random bits). */
static size_t
digits_below(uint64_t *state, size_t bound)
{
	return ((size_t)(splitmix64_next(state) % (uint64_t)bound));
}

void
digits_shuffle(struct digits *d, uint64_t seed)
{
	uint64_t state = seed ^ 0x6469676974730000ULL; /* "digits" */

	for (size_t i = d->n; i > 1; i--) {
		size_t j = digits_below(&state, i);
		float tmp[DIGITS_FEATURES];
		uint8_t ty;

		if (j == i - 1)
			continue;
		memcpy(tmp, d->x + (i - 1) * DIGITS_FEATURES, sizeof(tmp));
		memcpy(d->x + (i - 1) * DIGITS_FEATURES,
		    d->x + j * DIGITS_FEATURES, sizeof(tmp));
		memcpy(d->x + j * DIGITS_FEATURES, tmp, sizeof(tmp));
		ty = d->y[i - 1];
		d->y[i - 1] = d->y[j];
		d->y[j] = ty;
	}
}

static int
digits_copy(
    const struct digits *src, size_t first, size_t n, struct digits *dst)
{
	dst->n = n;
	dst->x = malloc((n ? n : 1) * DIGITS_FEATURES * sizeof(float));
	dst->y = malloc(n ? n : 1);
	if (dst->x == NULL || dst->y == NULL) {
		digits_free(dst);
		return (-1);
	}
	memcpy(dst->x, src->x + first * DIGITS_FEATURES,
	    n * DIGITS_FEATURES * sizeof(float));
	memcpy(dst->y, src->y + first, n);
	return (0);
}

int
digits_split(const struct digits *all, size_t n_test, struct digits *train,
    struct digits *test)
{
	size_t n_train;

	if (n_test >= all->n) {
		errno = EINVAL;
		return (-1);
	}
	n_train = all->n - n_test;
	if (digits_copy(all, 0, n_train, train) != 0) {
		errno = ENOMEM;
		return (-1);
	}
	if (digits_copy(all, n_train, n_test, test) != 0) {
		digits_free(train);
		errno = ENOMEM;
		return (-1);
	}
	return (0);
}

void
digits_epoch_order(size_t *perm, size_t n, uint64_t seed, uint64_t epoch)
{
	uint64_t state = seed ^ (0x65706f6368000000ULL + epoch); /* "epoch" */

	for (size_t i = 0; i < n; i++)
		perm[i] = i;
	for (size_t i = n; i > 1; i--) {
		size_t j = digits_below(&state, i);
		size_t t = perm[i - 1];

		perm[i - 1] = perm[j];
		perm[j] = t;
	}
}

size_t
digits_num_batches(size_t n, size_t global_batch, int drop_last)
{
	if (global_batch == 0)
		return (0);
	return (drop_last ? n / global_batch
	                  : (n + global_batch - 1) / global_batch);
}

size_t
digits_shard(const size_t *perm, size_t start, size_t len, int rank, int world,
    size_t *idx)
{
	size_t k = 0;

	if (world <= 0 || rank < 0 || rank >= world)
		return (0);
	for (size_t i = (size_t)rank; i < len; i += (size_t)world)
		idx[k++] = perm != NULL ? perm[start + i] : start + i;
	return (k);
}

void
digits_gather(
    const struct digits *d, const size_t *idx, size_t n, float *x, uint8_t *y)
{
	for (size_t i = 0; i < n; i++) {
		memcpy(x + i * DIGITS_FEATURES,
		    d->x + idx[i] * DIGITS_FEATURES,
		    DIGITS_FEATURES * sizeof(float));
		y[i] = d->y[idx[i]];
	}
}
