/*
 * freeall.h - free() over a list of buffers, for the examples'
 * destructors (mlp_fini, the trainer's cleanup in train_digits.c):
 * EX_FREE_ALL(m->a, m->b, m->c).
 */
#ifndef COHORT_EXAMPLES_FREEALL_H
#define COHORT_EXAMPLES_FREEALL_H

#include <stddef.h>
#include <stdlib.h>

static inline void
ex_free_all(void *const p[], size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(p[i]);
}

#define EX_FREE_ALL(...)                                                      \
	ex_free_all((void *const[]) { __VA_ARGS__ },                          \
	    sizeof((void *const[]) { __VA_ARGS__ }) / sizeof(void *))

#endif /* COHORT_EXAMPLES_FREEALL_H */
