/*
 * record.c - the journal's records: CRC32C, encoding, decoding.
 */
#include <pthread.h>
#include <stdarg.h>
#include <stdlib.h>
#include <string.h>

#include "record.h"

/* ------------------------------------------------------------------------ */
/* CRC32C (Castagnoli), slice-by-8                                          */
/* ------------------------------------------------------------------------ */

static uint32_t crc_tab[8][256];
static pthread_once_t crc_once = PTHREAD_ONCE_INIT;

static void
crc_init(void)
{
	for (uint32_t i = 0; i < 256; i++) {
		uint32_t c = i;
		for (int k = 0; k < 8; k++)
			c = (c >> 1) ^ (0x82f63b78u & (0u - (c & 1u)));
		crc_tab[0][i] = c;
	}
	for (uint32_t i = 0; i < 256; i++)
		for (int t = 1; t < 8; t++)
			crc_tab[t][i] = (crc_tab[t - 1][i] >> 8)
			    ^ crc_tab[0][crc_tab[t - 1][i] & 0xff];
}

uint32_t
srv_crc32c(const void *p, size_t n)
{
	const uint8_t *b = p;
	uint32_t c = 0xffffffffu;

	pthread_once(&crc_once, crc_init);
	while (n >= 8) {
		uint32_t lo = c ^ srv_ld32(b), hi = srv_ld32(b + 4);
		c = crc_tab[7][lo & 0xff] ^ crc_tab[6][(lo >> 8) & 0xff]
		    ^ crc_tab[5][(lo >> 16) & 0xff] ^ crc_tab[4][lo >> 24]
		    ^ crc_tab[3][hi & 0xff] ^ crc_tab[2][(hi >> 8) & 0xff]
		    ^ crc_tab[1][(hi >> 16) & 0xff] ^ crc_tab[0][hi >> 24];
		b += 8;
		n -= 8;
	}
	while (n-- > 0)
		c = (c >> 8) ^ crc_tab[0][(c ^ *b++) & 0xff];
	return (~c);
}

/* ------------------------------------------------------------------------ */
/* Encoding                                                                 */
/* ------------------------------------------------------------------------ */

static uint8_t *
jb_room(struct srv_jbuf *b, size_t n)
{
	if (b->oom)
		return (NULL);
	if (b->len + n > b->cap) {
		size_t cap = b->cap ? b->cap : 4096;
		uint8_t *p;
		while (cap < b->len + n)
			cap *= 2;
		if ((p = realloc(b->p, cap)) == NULL) {
			b->oom = true;
			return (NULL);
		}
		b->p = p;
		b->cap = cap;
	}
	b->len += n;
	return (b->p + b->len - n);
}

static void
jb_u8(struct srv_jbuf *b, uint8_t v)
{
	uint8_t *p = jb_room(b, 1);

	if (p != NULL)
		*p = v;
}

static void
jb_u32(struct srv_jbuf *b, uint32_t v)
{
	uint8_t *p = jb_room(b, 4);

	if (p != NULL)
		srv_st32(p, v);
}

static void
jb_u64(struct srv_jbuf *b, uint64_t v)
{
	uint8_t *p = jb_room(b, 8);

	if (p != NULL) {
		srv_st32(p, (uint32_t)v);
		srv_st32(p + 4, (uint32_t)(v >> 32));
	}
}

static void
jb_bytes(struct srv_jbuf *b, const void *d, size_t n)
{
	uint8_t *p;

	jb_u32(b, (uint32_t)n);
	if ((p = jb_room(b, n)) != NULL && n > 0)
		memcpy(p, d, n);
}

/* n, then n ranks (a group's members, a generation's previous ranks). */
static void
jb_ranks(struct srv_jbuf *b, uint32_t n, const int32_t *ranks)
{
	jb_u32(b, n);
	for (uint32_t i = 0; i < n; i++)
		jb_u32(b, (uint32_t)ranks[i]);
}

static void
jb_str(struct srv_jbuf *b, const char *s)
{
	jb_bytes(b, s, s != NULL ? strlen(s) : 0);
}

/* Starts a record; returns its offset for rec_end. */
size_t
srv_rec_begin(struct srv_jbuf *b, enum jrn_type t)
{
	size_t off = b->len;

	(void)jb_room(b, JRN_RHDR);
	jb_u8(b, (uint8_t)t);
	return (off);
}

void
srv_rec_finish(struct srv_jbuf *b, size_t off, bool crc)
{
	size_t n;

	if (b->oom)
		return;
	n = b->len - off - JRN_RHDR;
	srv_st32(b->p + off, (uint32_t)n);
	srv_st32(
	    b->p + off + 4, crc ? srv_crc32c(b->p + off + JRN_RHDR, n) : 0);
}

void
srv_rec_end(struct srv_jbuf *b, size_t off)
{
	srv_rec_finish(b, off, !b->nocrc);
}

/* A whole record of type t, its fields as fmt says, one letter each:
 * 's' a string (const char *, NULL: empty), 'w' a uint32_t, 'q' a
 * uint64_t, 'b' bytes (const void *, size_t). */
void
srv_rec_put(struct srv_jbuf *b, enum jrn_type t, const char *fmt, ...)
{
	size_t off = srv_rec_begin(b, t);
	const void *p;
	va_list ap;

	va_start(ap, fmt);
	for (; *fmt != '\0'; fmt++) {
		switch (*fmt) {
		case 's':
			jb_str(b, va_arg(ap, const char *));
			break;
		case 'w':
			jb_u32(b, va_arg(ap, uint32_t));
			break;
		case 'q':
			jb_u64(b, va_arg(ap, uint64_t));
			break;
		default: /* 'b' */
			p = va_arg(ap, const void *);
			jb_bytes(b, p, va_arg(ap, size_t));
			break;
		}
	}
	va_end(ap);
	srv_rec_end(b, off);
}

void
srv_rec_job(struct srv_jbuf *b, const struct srv_jrn_job *jj)
{
	srv_rec_put(b, JRN_JOB, "ssq", jj->name, jj->token, jj->id);
}

void
srv_rec_gen(struct srv_jbuf *b, const char *job, uint64_t gen, uint32_t world,
    const struct srv_jrn_member *m)
{
	size_t off = srv_rec_begin(b, JRN_GEN);

	jb_str(b, job);
	jb_u64(b, gen);
	jb_u32(b, world);
	for (uint32_t r = 0; r < world; r++) {
		jb_u64(b, m[r].client_id);
		jb_str(b, m[r].host);
		jb_u32(b, m[r].pid);
		jb_u32(b, (uint32_t)m[r].local_rank);
		jb_u32(b, m[r].hb_ms);
		jb_u32(b, m[r].dead_ms);
	}
	srv_rec_end(b, off);
}

void
srv_rec_fail(struct srv_jbuf *b, const char *job, int32_t rank,
    const char *text, const char *detail)
{
	srv_rec_put(b, JRN_FAIL, "swss", job, (uint32_t)rank, text, detail);
}

void
srv_rec_rank(
    struct srv_jbuf *b, enum jrn_type t, const char *job, int32_t rank)
{
	srv_rec_put(b, t, "sw", job, (uint32_t)rank);
}

void
srv_rec_group(struct srv_jbuf *b, const char *job, const char *group,
    uint32_t n, const int32_t *ranks)
{
	size_t off = srv_rec_begin(b, JRN_GROUP);

	jb_str(b, job);
	jb_str(b, group);
	jb_ranks(b, n, ranks);
	srv_rec_end(b, off);
}

void
srv_rec_reply(struct srv_jbuf *b, const char *job, uint64_t client_id,
    uint64_t seq, nng_msg *reply)
{
	srv_rec_put(b, JRN_REPLY, "sqqb", job, client_id, seq,
	    (const void *)nng_msg_body(reply), nng_msg_len(reply));
}

void
srv_rec_reshape(
    struct srv_jbuf *b, const char *job, const struct srv_jrn_egen *rs)
{
	size_t off = srv_rec_begin(b, JRN_RESHAPE);

	jb_str(b, job);
	jb_u64(b, rs->gen);
	jb_u64(b, rs->prev_gen);
	jb_u32(b, rs->min_world);
	jb_u32(b, rs->max_world);
	jb_u32(b, rs->world);
	for (uint32_t r = 0; r < rs->world; r++) {
		const struct srv_jrn_member *m = &rs->m[r];
		jb_u64(b, m->client_id);
		jb_str(b, m->host);
		jb_u32(b, m->pid);
		jb_u32(b, (uint32_t)m->local_rank);
		jb_u32(b, m->hb_ms);
		jb_u32(b, m->dead_ms);
		jb_u32(b, (uint32_t)m->prev_rank);
		jb_u8(b, m->has_state ? 1 : 0);
	}
	srv_rec_end(b, off);
}

void
srv_rec_hold(struct srv_jbuf *b, const char *job, uint64_t gen, uint32_t world,
    const bool *has_state)
{
	size_t off = srv_rec_begin(b, JRN_HOLD);

	jb_str(b, job);
	jb_u64(b, gen);
	jb_u32(b, world);
	for (uint32_t r = 0; r < world; r++)
		jb_u8(b, has_state[r] ? 1 : 0);
	srv_rec_end(b, off);
}

void
srv_rec_genmap(struct srv_jbuf *b, const char *job, uint64_t gen,
    uint64_t prev_gen, uint32_t n, const int32_t *prev)
{
	size_t off = srv_rec_begin(b, JRN_GENMAP);

	jb_str(b, job);
	jb_u64(b, gen);
	jb_u64(b, prev_gen);
	jb_ranks(b, n, prev);
	srv_rec_end(b, off);
}

/* ------------------------------------------------------------------------ */
/* Decoding                                                                 */
/* ------------------------------------------------------------------------ */

static const uint8_t *
rd_take(struct srv_jrd *r, size_t n)
{
	const uint8_t *p = r->p;

	if (r->bad || r->n < n) {
		r->bad = true;
		return (NULL);
	}
	r->p += n;
	r->n -= n;
	return (p);
}

uint8_t
srv_rd_u8(struct srv_jrd *r)
{
	const uint8_t *p = rd_take(r, 1);

	return (p != NULL ? *p : 0);
}

uint32_t
srv_rd_u32(struct srv_jrd *r)
{
	const uint8_t *p = rd_take(r, 4);

	return (p != NULL ? srv_ld32(p) : 0);
}

uint64_t
srv_rd_u64(struct srv_jrd *r)
{
	const uint8_t *p = rd_take(r, 8);

	return (p != NULL ? srv_ld64(p) : 0);
}

const uint8_t *
srv_rd_bytes(struct srv_jrd *r, size_t *n)
{
	*n = srv_rd_u32(r);
	return (rd_take(r, *n));
}

/* A string into buf (cap bytes with the NUL); no NUL inside. */
const char *
srv_rd_str(struct srv_jrd *r, char *buf, size_t cap)
{
	size_t n;
	const uint8_t *p = srv_rd_bytes(r, &n);

	if (p == NULL || n >= cap || memchr(p, '\0', n) != NULL) {
		r->bad = true;
		buf[0] = '\0';
		return (buf);
	}
	memcpy(buf, p, n);
	buf[n] = '\0';
	return (buf);
}

/* A string of any length, malloc'd (NULL: bad or ENOMEM). */
char *
srv_rd_strdup(struct srv_jrd *r)
{
	size_t n;
	const uint8_t *p = srv_rd_bytes(r, &n);
	char *s;

	if (p == NULL || memchr(p, '\0', n) != NULL
	    || (s = malloc(n + 1)) == NULL) {
		r->bad = true;
		return (NULL);
	}
	memcpy(s, p, n);
	s[n] = '\0';
	return (s);
}
