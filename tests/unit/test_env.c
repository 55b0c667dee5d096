/*
 * test_env.c - environment resolution (every source, precedence, malformed
 * values, KUBERNETES_* ignored), its report, and client option checks.
 * Each test runs in its own forked child, so setenv/unsetenv stay there.
 */
#include <stddef.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_impl.h"
#include "tmpdir.h"

Suite *suite_env(void);

static const char *const env_vars[] = { "COHORT_COORDINATOR", "COHORT_JOB",
	"COHORT_TOKEN", "COHORT_RANK", "COHORT_WORLD_SIZE",
	"COHORT_LOCAL_RANK", "COHORT_LOCAL_WORLD_SIZE", "COHORT_NODE_RANK",
	"COHORT_RESTART_COUNT", "RANK", "WORLD_SIZE", "LOCAL_RANK",
	"LOCAL_WORLD_SIZE", "GROUP_RANK", "MASTER_ADDR", "MASTER_PORT",
	"TORCHELASTIC_RUN_ID", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	"OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE",
	"SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", "SLURM_NODEID",
	"JOB_COMPLETION_INDEX", "KUBERNETES_SERVICE_HOST",
	"KUBERNETES_SERVICE_PORT", "KUBERNETES_PORT", "COHORT_TOKEN_FILE",
	"TORCHELASTIC_RESTART_COUNT", "TORCHELASTIC_MAX_RESTARTS",
	"TORCHELASTIC_USE_AGENT_STORE", "OMPI_MCA_ess_base_jobid",
	"OMPI_COMM_WORLD_NODE_RANK", "PMIX_NAMESPACE", "PMIX_ID", "PMIX_RANK",
	"PMI_RANK", "PMI_SIZE", "PMI_FD", "MPI_LOCALRANKID", "MPI_LOCALNRANKS",
	"PMI_LOCAL_RANK", "PMI_LOCAL_SIZE", "HYDI_CONTROL_FD", "SLURM_JOB_ID",
	"SLURM_JOBID", "SLURM_STEP_ID", "SLURM_STEPID", "SLURM_JOB_NAME",
	"SLURM_JOB_NODELIST", "SLURM_NODELIST", "SLURM_NNODES",
	"SLURM_NTASKS_PER_NODE", "PET_NNODES", "PET_NPROC_PER_NODE",
	"PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT",
	"COHORT_MIN_WORLD", "COHORT_MAX_WORLD", NULL };

static void
env_setup(void)
{
	for (const char *const *v = env_vars; *v != NULL; v++)
		unsetenv(*v);
}

static cohort_env
env_resolve_ok(void)
{
	cohort_env e;

	ck_assert_cohort_ok(cohort_env_resolve(&e));
	return (e);
}

/* ------------------------------------------------------------------------ */
/* Resolution cases: a script of steps run in order, each case its own      */
/* test. A step is "+NAME=value" (setenv), "-NAME" (unsetenv), "ok" (the     */
/* environment resolves), "einval" (it is refused), "error~text" (the last  */
/* error names text), "field=value" or "field~text" (a field of the result  */
/* equals value or contains text; integer fields compare as numbers).      */
/* ------------------------------------------------------------------------ */

struct env_field {
	const char *name;
	size_t off;
	bool is_int; /* int32_t, else a string */
};

/* clang-format off */
#define ENV_STR(f) { #f, offsetof(cohort_env, f), false }
#define ENV_INT(f) { #f, offsetof(cohort_env, f), true }
/* clang-format on */

static const struct env_field env_fields[] = { ENV_STR(source),
	ENV_STR(coordinator), ENV_STR(coordinator_from), ENV_STR(job),
	ENV_STR(job_from), ENV_STR(token), ENV_STR(token_from), ENV_INT(rank),
	ENV_STR(rank_from), ENV_INT(world_size), ENV_STR(world_size_from),
	ENV_INT(local_rank), ENV_STR(local_rank_from),
	ENV_INT(local_world_size), ENV_INT(node_rank), ENV_INT(restart_count),
	ENV_STR(restart_count_from), ENV_STR(notes) };

struct env_case {
	const char *name;
	const char *const *pre; /* steps run first (NULL: none) */
	const char *const *steps; /* NULL-terminated */
};

/* `srun -n 8` in a batch job: the variables a task gets. */
static const char *const env_slurm_task[] = { "+SLURM_PROCID=5",
	"+SLURM_NTASKS=8", "+SLURM_LOCALID=1", "+SLURM_NODEID=1",
	"+SLURM_NNODES=2", "+SLURM_NTASKS_PER_NODE=4", "+SLURM_JOB_ID=123456",
	"+SLURM_JOBID=123456", "+SLURM_STEP_ID=0", "+SLURM_STEPID=0",
	"+SLURM_JOB_NAME=train.sh", "+SLURM_JOB_NODELIST=gpu[017-018]",
	"+SLURM_NODELIST=gpu[017-018]", NULL };

static const struct env_case env_cases[] = {
	{ "empty_environment", NULL,
	    (const char *const[]) { "ok", "source=none", "rank=-1",
	        "world_size=0", "local_rank=-1", "local_world_size=0",
	        "node_rank=-1", "restart_count=0", "coordinator=",
	        "job=default", "job_from=default", "token=", NULL } },
	{ "cohort_source", NULL,
	    (const char *const[]) { "+COHORT_COORDINATOR=tcp://10.1.2.3:29400",
	        "+COHORT_JOB=train-7", "+COHORT_TOKEN=s3cret",
	        "+COHORT_RANK=2", "+COHORT_WORLD_SIZE=4",
	        "+COHORT_LOCAL_RANK=0", "+COHORT_LOCAL_WORLD_SIZE=2",
	        "+COHORT_NODE_RANK=1", "+COHORT_RESTART_COUNT=3", "ok",
	        "source=cohort", "coordinator=tcp://10.1.2.3:29400",
	        "coordinator_from=COHORT_COORDINATOR", "job=train-7",
	        "job_from=COHORT_JOB", "token=s3cret", "rank=2",
	        "rank_from=COHORT_RANK", "world_size=4",
	        "world_size_from=COHORT_WORLD_SIZE", "local_rank=0",
	        "local_rank_from=COHORT_LOCAL_RANK", "local_world_size=2",
	        "node_rank=1", "restart_count=3", NULL } },
	{ "torchrun_source", NULL,
	    (const char *const[]) { "+RANK=5", "+WORLD_SIZE=8",
	        "+LOCAL_RANK=1", "+LOCAL_WORLD_SIZE=4", "+GROUP_RANK=1",
	        "+MASTER_ADDR=10.0.0.1", "+MASTER_PORT=29500",
	        "+TORCHELASTIC_RUN_ID=elastic-42", "ok", "source=torchrun",
	        "rank=5", "rank_from=RANK", "world_size=8",
	        "world_size_from=WORLD_SIZE", "local_rank=1",
	        "local_rank_from=LOCAL_RANK", "local_world_size=4",
	        "node_rank=1", "coordinator=tcp://10.0.0.1:29500",
	        "coordinator_from=MASTER_ADDR:MASTER_PORT", "job=elastic-42",
	        "job_from=TORCHELASTIC_RUN_ID", NULL } },
	{ "torchrun_default_job", NULL,
	    (const char *const[]) { "+RANK=0", "+WORLD_SIZE=1",
	        "+MASTER_ADDR=localhost", "+MASTER_PORT=1234", "ok",
	        "job=default", "job_from=default",
	        "coordinator=tcp://localhost:1234", NULL } },
	{ "master_addr_ipv6", NULL,
	    (const char *const[]) { "+RANK=0", "+WORLD_SIZE=1",
	        "+MASTER_ADDR=fd00::1", "+MASTER_PORT=29500", "ok",
	        "coordinator=tcp://[fd00::1]:29500", NULL } },
	{ "cohort_coordinator_always_wins", NULL,
	    (const char *const[]) { "+RANK=0", "+WORLD_SIZE=2",
	        "+MASTER_ADDR=10.0.0.1", "+MASTER_PORT=29500",
	        "+COHORT_COORDINATOR=ipc:///tmp/cohortd.sock", "ok",
	        "source=torchrun", "coordinator=ipc:///tmp/cohortd.sock",
	        "coordinator_from=COHORT_COORDINATOR", NULL } },
	{ "cohort_beats_torchrun", NULL,
	    (const char *const[]) { "+COHORT_RANK=1", "+COHORT_WORLD_SIZE=2",
	        "+RANK=7", "+WORLD_SIZE=16", "ok", "source=cohort", "rank=1",
	        "world_size=2", NULL } },
	{ "incomplete_source_is_skipped", NULL,
	    (const char *const[]) {
	        /* COHORT_RANK without COHORT_WORLD_SIZE: not complete */
	        "+COHORT_RANK=1", "+RANK=3", "+WORLD_SIZE=4", "ok",
	        "source=torchrun", "rank=3", NULL } },
	{ "torchrun_beats_openmpi_and_slurm", NULL,
	    (const char *const[]) { "+RANK=1", "+WORLD_SIZE=2",
	        "+OMPI_COMM_WORLD_RANK=3", "+OMPI_COMM_WORLD_SIZE=4",
	        "+SLURM_PROCID=5", "+SLURM_NTASKS=6", "ok", "source=torchrun",
	        "rank=1", NULL } },
	{ "openmpi_source", NULL,
	    (const char *const[]) { "+OMPI_COMM_WORLD_RANK=3",
	        "+OMPI_COMM_WORLD_SIZE=4", "+OMPI_COMM_WORLD_LOCAL_RANK=1",
	        "+OMPI_COMM_WORLD_LOCAL_SIZE=2", "+SLURM_PROCID=0",
	        "+SLURM_NTASKS=9", "ok", "source=openmpi", "rank=3",
	        "rank_from=OMPI_COMM_WORLD_RANK", "world_size=4",
	        "local_rank=1", "local_world_size=2", NULL } },
	{ "slurm_source", NULL,
	    (const char *const[]) { "+SLURM_PROCID=6", "+SLURM_NTASKS=8",
	        "+SLURM_LOCALID=2", "+SLURM_NODEID=1", "ok", "source=slurm",
	        "rank=6", "rank_from=SLURM_PROCID", "world_size=8",
	        "world_size_from=SLURM_NTASKS", "local_rank=2", "node_rank=1",
	        NULL } },
	/* torchrun's restart counter (its agent sets it for every worker) when
	 * cohort's own is unset; cohort's wins. */
	{ "torchelastic_restart_count", NULL,
	    (const char *const[]) { "+RANK=0", "+WORLD_SIZE=2",
	        "+TORCHELASTIC_RESTART_COUNT=3",
	        "+TORCHELASTIC_MAX_RESTARTS=5", "ok", "restart_count=3",
	        "restart_count_from=TORCHELASTIC_RESTART_COUNT",
	        "+COHORT_RESTART_COUNT=1", "ok", "restart_count=1",
	        "restart_count_from=COHORT_RESTART_COUNT",
	        "-COHORT_RESTART_COUNT", "+TORCHELASTIC_RESTART_COUNT=-1",
	        "einval", "error~TORCHELASTIC_RESTART_COUNT", NULL } },
	/* torchrun's static rendezvous has run id "none" (no id): the address
	 * of its store names the launch instead. */
	{ "torchrun_run_id_none", NULL,
	    (const char *const[]) { "+RANK=1", "+WORLD_SIZE=2",
	        "+MASTER_ADDR=10.0.0.1", "+MASTER_PORT=29500",
	        "+TORCHELASTIC_RUN_ID=none", "ok",
	        "job=torchrun-10.0.0.1:29500",
	        "job_from=MASTER_ADDR:MASTER_PORT", NULL } },
	/* What Open MPI 4.1 sets for `mpirun -n 2` (seen on mpirun 4.1.4): the
	 * ranks, and the job id twice (ess and PMIx). */
	{ "openmpi_job_id", NULL,
	    (const char *const[]) { "+OMPI_COMM_WORLD_RANK=1",
	        "+OMPI_COMM_WORLD_SIZE=2", "+OMPI_COMM_WORLD_LOCAL_RANK=1",
	        "+OMPI_COMM_WORLD_LOCAL_SIZE=2",
	        "+OMPI_COMM_WORLD_NODE_RANK=1",
	        "+OMPI_MCA_ess_base_jobid=1829961729",
	        "+PMIX_NAMESPACE=1829961729", "+PMIX_ID=1829961729.1",
	        "+PMIX_RANK=1", "ok", "source=openmpi", "job=ompi-1829961729",
	        "job_from=OMPI_MCA_ess_base_jobid", "notes=",
	        /* Open MPI 5 (PRRTE) has only the PMIx namespace. */
	        "-OMPI_MCA_ess_base_jobid",
	        "+PMIX_NAMESPACE=prterun-node1-4242@1",
	        "+PMIX_ID=prterun-node1-4242@1.1", "ok",
	        "job=pmix-prterun-node1-4242@1", "job_from=PMIX_NAMESPACE",
	        "-PMIX_NAMESPACE", "ok", "job=pmix-prterun-node1-4242@1",
	        "job_from=PMIX_ID", NULL } },
	/* What MPICH 4's Hydra sets for `mpiexec -n 2` (seen on mpiexec.hydra
	 * 4.0.2); Intel MPI's Hydra sets the same. No job id: the job is
	 * "default", with a note saying so. */
	{ "pmi_source", NULL,
	    (const char *const[]) { "+PMI_RANK=1", "+PMI_SIZE=2", "+PMI_FD=8",
	        "+MPI_LOCALRANKID=1", "+MPI_LOCALNRANKS=2",
	        "+HYDI_CONTROL_FD=7", "ok", "source=pmi", "rank=1",
	        "rank_from=PMI_RANK", "world_size=2",
	        "world_size_from=PMI_SIZE", "local_rank=1",
	        "local_rank_from=MPI_LOCALRANKID", "local_world_size=2",
	        "job=default", "notes~COHORT_JOB",
	        /* Other PMI launchers name the local rank PMI_LOCAL_RANK. */
	        "-MPI_LOCALRANKID", "-MPI_LOCALNRANKS", "+PMI_LOCAL_RANK=0",
	        "+PMI_LOCAL_SIZE=1", "ok", "local_rank=0",
	        "local_rank_from=PMI_LOCAL_RANK", "local_world_size=1",
	        /* Open MPI's variables come first. */
	        "+OMPI_COMM_WORLD_RANK=0", "+OMPI_COMM_WORLD_SIZE=2", "ok",
	        "source=openmpi", "-OMPI_COMM_WORLD_RANK",
	        "-OMPI_COMM_WORLD_SIZE", "+PMI_LOCAL_RANK=1", "einval",
	        "error~PMI_LOCAL_RANK", NULL } },
	{ "slurm_job_and_coordinator", env_slurm_task,
	    (const char *const[]) { "ok", "source=slurm", "rank=5",
	        "job=slurm-123456.0", "job_from=SLURM_JOB_ID.SLURM_STEP_ID",
	        /* Lightning's port: 15000 + the last four digits of the job id
	         */
	        "coordinator=tcp://gpu017:18456",
	        "coordinator_from=SLURM_JOB_NODELIST",
	        /* MASTER_PORT wins over the derived port, MASTER_ADDR over the
	         * list; both: torchrun's rule */
	        "+MASTER_PORT=29555", "ok", "coordinator=tcp://gpu017:29555",
	        "+MASTER_ADDR=10.1.0.17", "ok",
	        "coordinator=tcp://10.1.0.17:29555",
	        "coordinator_from=MASTER_ADDR:MASTER_PORT", "-MASTER_PORT",
	        "ok", "coordinator=tcp://10.1.0.17:18456",
	        "coordinator_from=MASTER_ADDR:SLURM_JOB_ID", "-MASTER_ADDR",
	        /* COHORT_COORDINATOR wins over all */
	        "+COHORT_COORDINATOR=tcp://cohortd:29400", "ok",
	        "coordinator=tcp://cohortd:29400", "-COHORT_COORDINATOR",
	        /* the batch script itself: no step */
	        "-SLURM_STEP_ID", "-SLURM_STEPID", "ok", "job=slurm-123456",
	        "job_from=SLURM_JOB_ID",
	        /* a list that cannot be read: no coordinator, a note, no error
	         */
	        "+SLURM_JOB_NODELIST=gpu[017", "ok",
	        "coordinator=", "notes~unclosed",
	        /* a short job id: 15000 + the id */
	        "+SLURM_JOB_NODELIST=n1", "+SLURM_JOB_ID=77", "ok",
	        "coordinator=tcp://n1:15077", NULL } },
	/* salloc's shell (SLURM_JOB_NAME=bash or interactive) is an
	 * allocation, not a job's tasks: its variables are neither a rank nor
	 * a job id (Lightning's SLURMEnvironment draws the same line). */
	{ "slurm_interactive_skipped", env_slurm_task,
	    (const char *const[]) { "+SLURM_JOB_NAME=bash", "ok",
	        "source=none", "rank=-1", "job=default", "coordinator=",
	        "notes~SLURM_JOB_NAME=bash", "+SLURM_JOB_NAME=interactive",
	        /* another launcher started inside the allocation is used */
	        "+RANK=0", "+WORLD_SIZE=2", "+MASTER_ADDR=127.0.0.1",
	        "+MASTER_PORT=29500", "+TORCHELASTIC_RUN_ID=none", "ok",
	        "source=torchrun", "job=torchrun-127.0.0.1:29500",
	        /* a real job name that merely contains "bash" is a job */
	        "-RANK", "-WORLD_SIZE", "+SLURM_JOB_NAME=bash-train", "ok",
	        "source=slurm", NULL } },
	/* Kubeflow's Trainer (v2 TrainJob; PyTorchJob alike) gives torchrun's
	 * arguments as PET_* variables. Started directly with one process per
	 * node, a worker is node PET_NODE_RANK of PET_NNODES. */
	{ "kubeflow_pet", NULL,
	    (const char *const[]) { "+PET_NNODES=4", "+PET_NPROC_PER_NODE=1",
	        "+PET_NODE_RANK=2", "+PET_MASTER_ADDR=mnist-node-0-0.mnist",
	        "+PET_MASTER_PORT=29400", "+JOB_COMPLETION_INDEX=2", "ok",
	        "source=kubeflow", "rank=2", "rank_from=PET_NODE_RANK",
	        "world_size=4", "world_size_from=PET_NNODES", "local_rank=0",
	        "local_world_size=1", "node_rank=2",
	        "coordinator=tcp://mnist-node-0-0.mnist:29400",
	        "coordinator_from=PET_MASTER_ADDR:PET_MASTER_PORT",
	        "job=kubeflow-mnist-node-0-0.mnist:29400",
	        "job_from=PET_MASTER_ADDR",
	        /* the manifests' COHORT_JOB (downward API) wins */
	        "+COHORT_JOB=mnist-5f0c", "ok", "job=mnist-5f0c",
	        /* torchrun inside the pod: its variables win */
	        "+RANK=9", "+WORLD_SIZE=16", "ok", "source=torchrun", "-RANK",
	        "-WORLD_SIZE",
	        /* several processes per node: torchrun's (or cohort run's) job
	         */
	        "+PET_NPROC_PER_NODE=auto", "ok", "source=none",
	        "notes~PET_NPROC_PER_NODE=auto",
	        /* torchrun's default is one per node */
	        "-PET_NPROC_PER_NODE", "ok", "source=kubeflow",
	        "+PET_NNODES=two", "einval", NULL } },
	{ "k8s_indexed_job", NULL,
	    (const char *const[]) { "+JOB_COMPLETION_INDEX=3",
	        "+COHORT_WORLD_SIZE=8",
	        "+COHORT_COORDINATOR=tcp://cohortd.ns.svc:29400", "ok",
	        "source=k8s-indexed-job", "rank=3",
	        "rank_from=JOB_COMPLETION_INDEX", "world_size=8",
	        "world_size_from=COHORT_WORLD_SIZE", NULL } },
	{ "k8s_index_needs_world_size", NULL,
	    (const char *const[]) { "+JOB_COMPLETION_INDEX=3", "ok",
	        "source=none", "rank=-1", NULL } },
	{ "kubernetes_vars_ignored", NULL,
	    (const char *const[]) { "+KUBERNETES_SERVICE_HOST=10.96.0.1",
	        "+KUBERNETES_SERVICE_PORT=443",
	        "+KUBERNETES_PORT=tcp://10.96.0.1:443", "ok", "source=none",
	        "coordinator=", "rank=-1", "world_size=0",
	        /* malformed KUBERNETES_* values are not even looked at */
	        "+KUBERNETES_SERVICE_PORT=not-a-port", "+COHORT_RANK=0",
	        "+COHORT_WORLD_SIZE=1", "ok", "source=cohort", NULL } },
	{ "world_size_alone", NULL,
	    (const char *const[]) { "+COHORT_WORLD_SIZE=4", "ok",
	        "source=none", "rank=-1", "world_size=4",
	        "world_size_from=COHORT_WORLD_SIZE", NULL } },
	{ "malformed_rank", NULL,
	    (const char *const[]) { "+RANK=abc", "+WORLD_SIZE=4", "einval",
	        "source=invalid", "error~RANK", "error~abc", NULL } },
	{ "rank_not_below_world", NULL,
	    (const char *const[]) { "+COHORT_RANK=4", "+COHORT_WORLD_SIZE=4",
	        "einval", "source=invalid", NULL } },
	{ "later_source_not_validated", NULL,
	    (const char *const[]) { /* the winner comes first; a broken later
	                               source is never read */
	        "+COHORT_RANK=0", "+COHORT_WORLD_SIZE=2", "+RANK=abc",
	        "+SLURM_NTASKS=2(x3)", "ok", "source=cohort", NULL } },
	{ "bad_master_port", NULL,
	    (const char *const[]) { "+MASTER_ADDR=10.0.0.1",
	        "+MASTER_PORT=99999", "einval", "error~MASTER_PORT",
	        "+MASTER_PORT=http", "einval",
	        /* MASTER_ADDR alone is not a coordinator */
	        "-MASTER_PORT", "ok", "coordinator=", NULL } },
	/* The order of the job's identity: one launch, one name. */
	{ "job_identity_order", NULL,
	    (const char *const[]) { "+SLURM_JOB_ID=42", "+SLURM_STEP_ID=3",
	        "+PMIX_NAMESPACE=slurm.pmix.42.3", "+TORCHELASTIC_RUN_ID=abc",
	        "+COHORT_JOB=mine", "ok", "job=mine", "-COHORT_JOB", "ok",
	        "job=abc", "-TORCHELASTIC_RUN_ID", "ok",
	        "job=pmix-slurm.pmix.42.3", "-PMIX_NAMESPACE", "ok",
	        "job=slurm-42.3", NULL } },
	{ "bad_coordinator_url", NULL,
	    (const char *const[]) { "+COHORT_COORDINATOR=10.0.0.1:29400",
	        "einval", "error~COHORT_COORDINATOR", NULL } },
};

#define ENV_NCASES (sizeof(env_cases) / sizeof(env_cases[0]))

/* Checks "field=value" or "field~text" against e. */
static void
env_check(const char *name, const cohort_env *e, const char *step)
{
	size_t n = strcspn(step, "=~");
	const char *want = step + n + 1;

	ck_assert_msg(step[n] != '\0', "%s: bad step '%s'", name, step);
	for (size_t k = 0; k < sizeof(env_fields) / sizeof(env_fields[0]);
	     k++) {
		const struct env_field *fd = &env_fields[k];
		const char *p = (const char *)e + fd->off;

		if (strlen(fd->name) != n || strncmp(fd->name, step, n) != 0)
			continue;
		if (fd->is_int)
			ck_assert_msg(*(const int32_t *)(const void *)p
			        == (int32_t)strtol(want, NULL, 10),
			    "%s: %s is %d", name, step,
			    *(const int32_t *)(const void *)p);
		else if (step[n] == '=')
			ck_assert_msg(strcmp(p, want) == 0, "%s: %s is '%s'",
			    name, step, p);
		else
			ck_assert_msg(strstr(p, want) != NULL,
			    "%s: %s: not in '%s'", name, step, p);
		return;
	}
	ck_abort_msg("%s: no field in '%s'", name, step);
}

static void
env_step(const char *name, cohort_env *e, const char *step)
{
	char var[64];
	cohort_status rv;

	if (step[0] == '+') {
		size_t n = strcspn(step + 1, "=");

		snprintf(var, sizeof(var), "%.*s", (int)n, step + 1);
		setenv(var, step + 1 + n + 1, 1);
	} else if (step[0] == '-') {
		unsetenv(step + 1);
	} else if (strcmp(step, "ok") == 0) {
		rv = cohort_env_resolve(e);
		ck_assert_msg(rv == COHORT_OK, "%s: step %s: %s: %s", name,
		    step, cohort_status_name(rv), cohort_last_error());
	} else if (strcmp(step, "einval") == 0) {
		rv = cohort_env_resolve(e);
		ck_assert_msg(rv == COHORT_EINVAL, "%s: resolved with %s",
		    name, cohort_status_name(rv));
	} else if (strncmp(step, "error~", 6) == 0) {
		ck_assert_msg(strstr(cohort_last_error(), step + 6) != NULL,
		    "%s: %s: not in '%s'", name, step, cohort_last_error());
	} else {
		env_check(name, e, step);
	}
}

/* Runs steps (NULL-terminated) in order. */
static void
env_steps(const char *name, cohort_env *e, const char *const *steps)
{
	for (; *steps != NULL; steps++)
		env_step(name, e, *steps);
}

START_TEST(test_env_case)
{
	const struct env_case *c = &env_cases[_i];
	cohort_env e;

	memset(&e, 0, sizeof(e));
	if (c->pre != NULL)
		env_steps(c->name, &e, c->pre);
	env_steps(c->name, &e, c->steps);
}
END_TEST

START_TEST(test_slurm_first_host)
{
	static const char *const good[][2] = {
		{ "node[001-004,007],gpu-a1", "node001" },
		{ "gpu-a1", "gpu-a1" },
		{ "host0,host1,host3", "host0" },
		{ "host0 host1", "host0" },
		{ "node[5]", "node5" },
		{ "node[7,3-4]", "node7" },
		{ "rack[1-2]-node[01-04]", "rack1-node01" },
		{ "a[1-2],b[3-4]", "a1" },
		{ "n[0010-0020]x", "n0010x" },
		{ "10.0.0.5,10.0.0.6", "10.0.0.5" },
	};
	static const char *const bad[] = { "", " ", "node[", "node[]",
		"node[x-3]", "node[1-2", "node]1", ",n1", "node[1-a]" };
	char out[64], tiny[4];

	for (size_t i = 0; i < sizeof(good) / sizeof(good[0]); i++) {
		ck_assert_msg(
		    cohort__slurm_first_host(good[i][0], out, sizeof(out))
		        == COHORT_OK,
		    "'%s': %s", good[i][0], cohort_last_error());
		ck_assert_str_eq(out, good[i][1]);
	}
	for (size_t i = 0; i < sizeof(bad) / sizeof(bad[0]); i++)
		ck_assert_msg(
		    cohort__slurm_first_host(bad[i], out, sizeof(out))
		        == COHORT_EINVAL,
		    "'%s' accepted as '%s'", bad[i], out);
	ck_assert_cohort_err(
	    cohort__slurm_first_host("node[001-2]", tiny, sizeof(tiny)),
	    COHORT_EINVAL);
	ck_assert_cohort_ok(
	    cohort__slurm_first_host("abc,defgh", tiny, sizeof(tiny)));
	ck_assert_str_eq(tiny, "abc");
	ck_assert_int_eq(cohort__slurm_port("123456"), 18456);
	ck_assert_int_eq(cohort__slurm_port("1230012"), 15012);
	ck_assert_int_eq(cohort__slurm_port("9"), 15009);
	ck_assert_int_eq(cohort__slurm_port(NULL), 12910);
	ck_assert_int_eq(cohort__slurm_port("12x"), -1);
}
END_TEST

/* A job name that does not fit is an error, never a cut name. */
START_TEST(test_job_name_too_long)
{
	cohort_env e;
	char big[200];

	memset(big, '7', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	setenv("SLURM_JOB_ID", big, 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "SLURM_JOB_ID"));
}
END_TEST

START_TEST(test_token_file)
{
	cohort_env e;
	char path[256];

	ck_assert(tmpfile_make(
	    path, sizeof(path), "cohort-test-token", "s3cret-from-file\n"));
	setenv("COHORT_TOKEN_FILE", path, 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.token, "s3cret-from-file");
	ck_assert_str_eq(e.token_from, "COHORT_TOKEN_FILE");
	setenv("COHORT_TOKEN", "from-env", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.token, "from-env");
	ck_assert_str_eq(e.token_from, "COHORT_TOKEN");
	unsetenv("COHORT_TOKEN");
	unlink(path);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), path));
	unsetenv("COHORT_TOKEN_FILE");
	e = env_resolve_ok();
	ck_assert_str_eq(e.token_from, "unset");
}
END_TEST

START_TEST(test_malformed_values)
{
	static const char *const cases[][2] = {
		{ "COHORT_WORLD_SIZE", "0" },
		{ "COHORT_WORLD_SIZE", "-3" },
		{ "COHORT_WORLD_SIZE", "4x" },
		{ "COHORT_WORLD_SIZE", "99999999999999999999" },
		{ "COHORT_RANK", "-2" },
		{ "COHORT_RANK", " 1" },
		{ "LOCAL_RANK", "one" },
		{ "SLURM_NTASKS", "2(x3)" },
		{ "OMPI_COMM_WORLD_SIZE", "1.5" },
		{ "COHORT_RESTART_COUNT", "-1" },
	};
	cohort_env e;

	for (size_t i = 0; i < sizeof(cases) / sizeof(cases[0]); i++) {
		env_setup();
		setenv(cases[i][0], cases[i][1], 1);
		ck_assert_msg(cohort_env_resolve(&e) == COHORT_EINVAL,
		    "%s=%s accepted", cases[i][0], cases[i][1]);
		ck_assert_str_eq(e.source, "invalid");
		ck_assert_ptr_nonnull(
		    strstr(cohort_last_error(), cases[i][0]));
	}
}
END_TEST

START_TEST(test_too_long_values)
{
	char big[600];
	cohort_env e;

	memset(big, 'j', sizeof(big) - 1);
	big[sizeof(big) - 1] = '\0';
	setenv("COHORT_JOB", big, 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	unsetenv("COHORT_JOB");
	setenv("COHORT_TOKEN", big, 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	unsetenv("COHORT_TOKEN");
	memcpy(big, "tcp://", 6);
	setenv("COHORT_COORDINATOR", big, 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
}
END_TEST

START_TEST(test_format_report)
{
	cohort_env e;
	char buf[2048];
	size_t n;

	env_steps("format_report", &e,
	    (const char *const[]) { "+RANK=1", "+WORLD_SIZE=2",
	        "+MASTER_ADDR=127.0.0.1", "+MASTER_PORT=29500",
	        "+COHORT_TOKEN=do-not-print", "ok", NULL });
	n = cohort_env_format(&e, buf, sizeof(buf));
	ck_assert_uint_eq(n, strlen(buf));
	ck_assert_ptr_nonnull(strstr(buf, "source"));
	ck_assert_ptr_nonnull(strstr(buf, "torchrun"));
	/* torchrun's store is not what torch's backend dials (issue 23) */
	ck_assert_ptr_nonnull(strstr(buf,
	    "tcp://127.0.0.1:29500 (from MASTER_ADDR:MASTER_PORT: torch's "
	    "store, not a cohortd)"));
	ck_assert_ptr_nonnull(strstr(buf,
	    "torch backend    = rank 0 starts a cohortd and hands its "
	    "address to the others through that store"));
	ck_assert_ptr_nonnull(strstr(buf, "= 1 (from RANK)"));
	ck_assert_ptr_nonnull(strstr(buf, "= 2 (from WORLD_SIZE)"));
	ck_assert_ptr_null(strstr(buf, "do-not-print"));
	ck_assert_ptr_nonnull(strstr(buf, "<set>"));
}
END_TEST

START_TEST(test_format_truncates_like_snprintf)
{
	cohort_env e = env_resolve_ok();
	char full[2048], small[16];
	size_t n = cohort_env_format(&e, full, sizeof(full));

	memset(small, 'z', sizeof(small));
	ck_assert_uint_eq(cohort_env_format(&e, small, sizeof(small)), n);
	ck_assert_uint_eq(strlen(small), sizeof(small) - 1);
	ck_assert(strncmp(small, full, sizeof(small) - 1) == 0);
	ck_assert_uint_eq(cohort_env_format(&e, NULL, 0), n);
}
END_TEST

START_TEST(test_options_from_env)
{
	cohort_env e;
	cohort_options o;

	e = env_resolve_ok();
	ck_assert_cohort_err(cohort_options_from_env(&o, &e), COHORT_EINVAL);
	setenv("COHORT_COORDINATOR", "tcp://127.0.0.1:1", 1);
	e = env_resolve_ok();
	/* still no world size */
	ck_assert_cohort_err(cohort_options_from_env(&o, &e), COHORT_EINVAL);
	setenv("COHORT_WORLD_SIZE", "3", 1);
	setenv("COHORT_JOB", "j", 1);
	e = env_resolve_ok();
	ck_assert_cohort_ok(cohort_options_from_env(&o, &e));
	ck_assert_str_eq(o.coordinator, "tcp://127.0.0.1:1");
	ck_assert_str_eq(o.job, "j");
	ck_assert_int_eq(o.world_size, 3);
	ck_assert_int_eq(o.rank, -1);
	ck_assert_int_eq(o.op_timeout, 1800000);
}
END_TEST

/* The elastic range (docs/elastic.md): COHORT_MIN_WORLD makes the job
 * elastic, COHORT_MAX_WORLD is then the world size asked for. */
START_TEST(test_options_elastic_range)
{
	cohort_env e;
	cohort_options o;

	setenv("COHORT_COORDINATOR", "tcp://127.0.0.1:1", 1);
	setenv("COHORT_WORLD_SIZE", "4", 1);
	e = env_resolve_ok();
	ck_assert_cohort_ok(cohort_options_from_env(&o, &e));
	ck_assert_int_eq(o.min_world, 0);
	ck_assert_int_eq(o.world_size, 4);
	/* cohort run --nnodes 3:4 -n 2 */
	setenv("COHORT_MIN_WORLD", "6", 1);
	setenv("COHORT_MAX_WORLD", "8", 1);
	ck_assert_cohort_ok(cohort_options_from_env(&o, &e));
	ck_assert_int_eq(o.min_world, 6);
	ck_assert_int_eq(o.world_size, 8);
	/* another launcher's world size is the maximum */
	unsetenv("COHORT_MAX_WORLD");
	setenv("COHORT_MIN_WORLD", "3", 1);
	ck_assert_cohort_ok(cohort_options_from_env(&o, &e));
	ck_assert_int_eq(o.min_world, 3);
	ck_assert_int_eq(o.world_size, 4);
	/* refused: a minimum above the maximum, malformed values */
	setenv("COHORT_MIN_WORLD", "5", 1);
	ck_assert_cohort_err(cohort_options_from_env(&o, &e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(
	    strstr(cohort_last_error(), "COHORT_MIN_WORLD=5"));
	setenv("COHORT_MIN_WORLD", "two", 1);
	ck_assert_cohort_err(cohort_options_from_env(&o, &e), COHORT_EINVAL);
	setenv("COHORT_MIN_WORLD", "0", 1);
	setenv("COHORT_MAX_WORLD", "8", 1);
	ck_assert_cohort_ok(cohort_options_from_env(&o, &e));
	ck_assert_int_eq(o.min_world, 0); /* not elastic: max ignored */
	ck_assert_int_eq(o.world_size, 4);
	unsetenv("COHORT_MIN_WORLD");
	unsetenv("COHORT_MAX_WORLD");
	ck_assert_str_eq(cohort__knob_info(COHORT__KNOB_MIN_WORLD)->name,
	    "COHORT_MIN_WORLD");
}
END_TEST

START_TEST(test_options_defaults)
{
	cohort_options o;

	cohort_options_init(&o);
	ck_assert_ptr_null(o.coordinator);
	ck_assert_str_eq(o.job, "default");
	ck_assert_str_eq(o.token, "");
	ck_assert_int_eq(o.rank, -1);
	ck_assert_int_eq(o.world_size, 0);
	ck_assert_int_eq(o.local_rank, -1);
	ck_assert_int_eq(o.op_timeout, 1800000);
	ck_assert_int_eq(o.heartbeat_interval, 1000);
	ck_assert_int_eq(o.dead_after, 5000);
	ck_assert_str_eq(o.backend, "auto");
}
END_TEST

START_TEST(test_open_rejects_bad_options)
{
	cohort_options o;
	cohort_client *c = NULL;

	cohort_options_init(&o);
	o.world_size = 2;
	ck_assert_cohort_err(cohort_client_open(&o, &c, 100), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "coordinator"));
	o.coordinator = "tcp://127.0.0.1:1";
	o.world_size = 0;
	ck_assert_cohort_err(cohort_client_open(&o, &c, 100), COHORT_EINVAL);
	o.world_size = 2;
	o.rank = 2;
	ck_assert_cohort_err(cohort_client_open(&o, &c, 100), COHORT_EINVAL);
	o.rank = 0;
	o.heartbeat_interval = 5000;
	ck_assert_cohort_err(cohort_client_open(&o, &c, 100), COHORT_EINVAL);
	o.heartbeat_interval = 1000;
	o.backend = "carrier-pigeon";
	ck_assert_cohort_err(cohort_client_open(&o, &c, 100), COHORT_EINVAL);
	o.backend = NULL;
	o.job = "";
	ck_assert_cohort_err(cohort_client_open(&o, &c, 100), COHORT_EINVAL);
	ck_assert_cohort_err(cohort_client_open(NULL, &c, 100), COHORT_EINVAL);
	ck_assert_ptr_null(c);
}
END_TEST

START_TEST(test_open_no_coordinator)
{
	cohort_options o;
	cohort_client *c = NULL;
	int64_t t0 = th_now_ms();

	cohort_options_init(&o);
	o.coordinator = "tcp://127.0.0.1:1"; /* nothing listens there */
	o.world_size = 1;
	ck_assert_cohort_err(cohort_client_open(&o, &c, 300), COHORT_ENOCOORD);
	ck_assert_ptr_null(c);
	ck_assert_int_lt(th_now_ms() - t0, 3000);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "127.0.0.1"));
}
END_TEST

START_TEST(test_accessors_null_safe)
{
	cohort_client_close(NULL);
	ck_assert_int_eq(cohort_client_rank(NULL), -1);
	ck_assert_int_eq(cohort_client_world_size(NULL), 0);
	ck_assert_ptr_null(cohort_client_world(NULL));
	ck_assert(!cohort_client_is_global_zero(NULL));
	ck_assert_int_eq(cohort_group_rank(NULL), -1);
	ck_assert_int_eq(cohort_group_size(NULL), 0);
	ck_assert_int_eq(cohort_group_global_rank(NULL, 0), -1);
	ck_assert(!cohort_group_is_healthy(NULL));
	ck_assert_str_eq(cohort_group_last_error(NULL), "");
	cohort_group_abort(NULL);
	ck_assert_cohort_err(cohort_barrier(NULL, "x", 10), COHORT_EINVAL);
	ck_assert_cohort_err(
	    cohort_kv_set(NULL, "k", "v", 1, 10), COHORT_EINVAL);
}
END_TEST

/* cohort_env_vars writes what cohort_env_resolve reads back (the one
 * writer used by cohort run, cohort_spawn and cohort bench). */
START_TEST(test_env_vars_round_trip)
{
	cohort_env in, out;
	const char *vars[24];
	char buf[2048], small[40];
	int n;

	memset(&in, 0, sizeof(in));
	snprintf(
	    in.coordinator, sizeof(in.coordinator), "tcp://10.1.2.3:29400");
	snprintf(in.job, sizeof(in.job), "train-7");
	snprintf(in.token, sizeof(in.token), "s3cret");
	in.rank = 5;
	in.world_size = 8;
	in.local_rank = 1;
	in.local_world_size = 4;
	in.node_rank = 1;
	in.restart_count = 2;
	n = cohort_env_vars(&in, buf, sizeof(buf), vars, 24);
	ck_assert_int_eq(n, 15);
	ck_assert_ptr_null(vars[n]);
	for (int i = 0; i < n; i++) {
		char name[64];
		const char *eq = strchr(vars[i], '=');
		ck_assert_ptr_nonnull(eq);
		snprintf(
		    name, sizeof(name), "%.*s", (int)(eq - vars[i]), vars[i]);
		setenv(name, eq + 1, 1);
	}
	out = env_resolve_ok();
	ck_assert_str_eq(out.source, "cohort");
	ck_assert_str_eq(out.coordinator, in.coordinator);
	ck_assert_str_eq(out.job, in.job);
	ck_assert_str_eq(out.token, in.token);
	ck_assert_int_eq(out.rank, 5);
	ck_assert_int_eq(out.world_size, 8);
	ck_assert_int_eq(out.local_rank, 1);
	ck_assert_int_eq(out.node_rank, 1);
	ck_assert_int_eq(out.restart_count, 2);
	ck_assert_str_eq(getenv("RANK"), "5"); /* torchrun's too */
	ck_assert_str_eq(getenv("TORCHELASTIC_RESTART_COUNT"), "2");
	/* Too small: -1 and nothing usable. */
	ck_assert_int_eq(
	    cohort_env_vars(&in, small, sizeof(small), vars, 24), -1);
	ck_assert_ptr_null(vars[0]);
	ck_assert_int_eq(cohort_env_vars(&in, buf, sizeof(buf), vars, 3), -1);
}
END_TEST

Suite *
suite_env(void)
{
	const TTest *resolve[] = { test_slurm_first_host,
		test_job_name_too_long, test_token_file, test_malformed_values,
		test_too_long_values, test_format_report,
		test_format_truncates_like_snprintf, NULL };
	const struct unit_loop scripts[]
	    = { { test_env_case, (int)ENV_NCASES }, { NULL, 0 } };
	const TTest *options[] = { test_options_from_env,
		test_options_elastic_range, test_options_defaults,
		test_open_rejects_bad_options, test_open_no_coordinator,
		test_accessors_null_safe, test_env_vars_round_trip, NULL };
	const struct unit_case cases[] = {
		{ "resolve", 30, resolve, scripts, env_setup, NULL },
		{ "options", 30, options, NULL, env_setup, NULL },
		{ NULL, 0, NULL, NULL, NULL, NULL },
	};

	return (unit_suite_cases("env", cases));
}
