/*
 * opname.c - names of data-plane operations, for error texts (backend.h).
 */
#include "backend/backend.h"
#include "cohort_impl.h"

static const char *const op_names[] = {
	[COHORT__OP_ALLREDUCE] = "allreduce",
	[COHORT__OP_REDUCE] = "reduce",
	[COHORT__OP_BROADCAST] = "broadcast",
	[COHORT__OP_ALLGATHER] = "allgather",
	[COHORT__OP_ALLGATHERV] = "allgatherv",
	[COHORT__OP_REDUCE_SCATTER] = "reduce_scatter",
	[COHORT__OP_ALLTOALL] = "alltoall",
	[COHORT__OP_GATHER] = "gather",
	[COHORT__OP_SCATTER] = "scatter",
	[COHORT__OP_BARRIER] = "barrier",
};

const char *
cohort__op_name(enum cohort__op_kind kind)
{
	if ((size_t)kind >= sizeof(op_names) / sizeof(op_names[0])
	    || op_names[kind] == NULL)
		return ("collective");
	return (op_names[kind]);
}
