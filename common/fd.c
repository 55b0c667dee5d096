/*
 * fd.c - file descriptors (cohort_common.h).
 */
#include <unistd.h>

#include "cohort_common.h"

void
cohort__close_all(const int *fds, size_t n)
{
	for (size_t i = 0; i < n; i++)
		if (fds[i] >= 0)
			close(fds[i]);
}
