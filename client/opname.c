/*
 * opname.c - names of data-plane operations, for error texts (backend.h).
 */
#include "backend/backend.h"
#include "cohort_impl.h"

const char *
cohort__op_name(enum cohort__op_kind kind)
{
	switch (kind) {
	case COHORT__OP_ALLREDUCE:
		return ("allreduce");
	case COHORT__OP_REDUCE:
		return ("reduce");
	case COHORT__OP_BROADCAST:
		return ("broadcast");
	case COHORT__OP_ALLGATHER:
		return ("allgather");
	case COHORT__OP_ALLGATHERV:
		return ("allgatherv");
	case COHORT__OP_REDUCE_SCATTER:
		return ("reduce_scatter");
	case COHORT__OP_ALLTOALL:
		return ("alltoall");
	case COHORT__OP_GATHER:
		return ("gather");
	case COHORT__OP_SCATTER:
		return ("scatter");
	case COHORT__OP_BARRIER:
		return ("barrier");
	}
	return ("collective");
}
