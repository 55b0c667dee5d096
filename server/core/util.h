/*
 * util.h - small helpers every part of cohortd uses: copies, a token
 * comparison that leaks no timing, and the texts of durations and rank
 * lists that error messages share.
 */
#ifndef COHORT_SRV_UTIL_H
#define COHORT_SRV_UTIL_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>

#include "cohort_common.h"

/* A malloc'd copy of s; NULL when out of memory. */
char *srv_strdup(const char *s);
/* Token comparison in time independent of the contents. */
bool srv_token_eq(const char *a, const char *b);
/* Text of a duration: "30.0 s". */
void srv_fmt_secs(char *buf, size_t len, cohort__time ms);
/* "2, 3" (the first 32 and a count of the rest when over 40). */
void srv_fmt_ranks(char *buf, size_t len, const int32_t *r, size_t n);
/* Appends "WHAT timed out after 30.0 s; ranks 2, 3 never arrived" (the
 * nm ranks of miss) at *off of buf. */
void srv_fmt_never_arrived(char *buf, size_t len, size_t *off,
    const char *what, cohort__time waited, const int32_t *miss, size_t nm);
/* The same with "HOW" for "never arrived" ("arrived but timed out and
 * left before the others came"). */
void srv_fmt_absent(char *buf, size_t len, size_t *off, const char *what,
    cohort__time waited, const int32_t *miss, size_t nm, const char *how);

#endif /* COHORT_SRV_UTIL_H */
