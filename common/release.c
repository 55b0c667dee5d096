/*
 * release.c - what a destructor lets go of, as one list (cohort_common.h):
 * descriptors (cohort__close_all) and buffers (cohort__free_all).
 */
#include <stdlib.h>
#include <unistd.h>

#include "cohort_common.h"

void
cohort__close_all(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}

void
cohort__free_all(void *const ptrs[], size_t n)
{
	for (size_t i = 0; i < n; i++)
		free(ptrs[i]);
}
