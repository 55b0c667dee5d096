/*
 * digits.h - scikit-learn's "digits" data set for the examples.
 *
 * The CSV (tools/fetch-digits.sh writes build/data/digits.csv) has one
 * sample per line: 64 pixel values 0..16 of an 8x8 image, then the label
 * 0..9; 1797 lines, no header. Pixels are normalised to [0, 1].
 *
 * Data-parallel sharding: a run's training order is a permutation of the
 * training set (the same on every rank: it depends only on the seed and
 * the epoch). Global batch b is the run of global_batch consecutive
 * entries of the permutation starting at b * global_batch; rank r of N
 * takes the entries r, r + N, r + 2N, ... of it. So N ranks with a global
 * batch G see exactly the samples one process with batch G sees, in the
 * same batches, and the mean of their mean gradients (equal shard sizes)
 * is the gradient one process computes.
 */
#ifndef COHORT_EXAMPLES_DIGITS_H
#define COHORT_EXAMPLES_DIGITS_H

#include <stddef.h>
#include <stdint.h>

#define DIGITS_FEATURES 64
#define DIGITS_CLASSES 10
#define DIGITS_MAX_PIXEL 16.0
#define DIGITS_TEST_SAMPLES 360 /* fixed held-out split of the 1797 */

struct digits {
	size_t n;
	float *x; /* [n][DIGITS_FEATURES], in [0, 1] */
	uint8_t *y; /* [n], 0..DIGITS_CLASSES-1 */
};

/* Parses CSV text (len bytes, need not be NUL-terminated). Blank lines and
 * lines starting with '#' are skipped; "\r\n" line ends are accepted.
 * Returns 0 and fills *out, or -1 with a message naming the line and field
 * in err (errlen bytes; may be NULL) and *out untouched. */
int digits_parse(const char *text, size_t len, struct digits *out, char *err,
    size_t errlen);

/* Reads and parses a file. Errors as digits_parse, prefixed with path. */
int digits_load(
    const char *path, struct digits *out, char *err, size_t errlen);

void digits_free(struct digits *d); /* NULL-safe; leaves *d empty */

/* Shuffles the samples in place (Fisher-Yates, deterministic in seed). */
void digits_shuffle(struct digits *d, uint64_t seed);

/* Copies the first n - n_test samples into *train and the last n_test into
 * *test. Returns 0, or -1 (n_test >= n, or out of memory). */
int digits_split(const struct digits *all, size_t n_test, struct digits *train,
    struct digits *test);

/* perm = a permutation of 0..n-1 that depends only on (seed, epoch). */
void digits_epoch_order(size_t *perm, size_t n, uint64_t seed, uint64_t epoch);

/* The number of global batches of an epoch of n samples (drop_last: the
 * trailing partial batch is dropped so every step has equal shards). */
size_t digits_num_batches(size_t n, size_t global_batch, int drop_last);

/* Rank `rank`'s share of the global batch perm[start .. start + len)
 * (perm NULL: the identity): the entries start + rank, start + rank +
 * world, ... Writes their sample indices to idx (room for len / world + 1)
 * and returns how many. */
size_t digits_shard(const size_t *perm, size_t start, size_t len, int rank,
    int world, size_t *idx);

/* Copies samples idx[0..n) into contiguous x[n][DIGITS_FEATURES], y[n]. */
void digits_gather(
    const struct digits *d, const size_t *idx, size_t n, float *x, uint8_t *y);

#endif /* COHORT_EXAMPLES_DIGITS_H */
