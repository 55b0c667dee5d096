/*
 * test_env.c - environment resolution (every source, precedence, malformed
 * values, KUBERNETES_* ignored), its report, and client option checks.
 * Each test runs in its own forked child, so setenv/unsetenv stay there.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"
#include "unit_suite.h"
#include "cohort_impl.h"

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
	"PET_NODE_RANK", "PET_MASTER_ADDR", "PET_MASTER_PORT", NULL };

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

START_TEST(test_empty_environment)
{
	cohort_env e = env_resolve_ok();

	ck_assert_str_eq(e.source, "none");
	ck_assert_int_eq(e.rank, -1);
	ck_assert_int_eq(e.world_size, 0);
	ck_assert_int_eq(e.local_rank, -1);
	ck_assert_int_eq(e.local_world_size, 0);
	ck_assert_int_eq(e.node_rank, -1);
	ck_assert_int_eq(e.restart_count, 0);
	ck_assert_str_eq(e.coordinator, "");
	ck_assert_str_eq(e.job, "default");
	ck_assert_str_eq(e.job_from, "default");
	ck_assert_str_eq(e.token, "");
}
END_TEST

START_TEST(test_cohort_source)
{
	cohort_env e;

	setenv("COHORT_COORDINATOR", "tcp://10.1.2.3:29400", 1);
	setenv("COHORT_JOB", "train-7", 1);
	setenv("COHORT_TOKEN", "s3cret", 1);
	setenv("COHORT_RANK", "2", 1);
	setenv("COHORT_WORLD_SIZE", "4", 1);
	setenv("COHORT_LOCAL_RANK", "0", 1);
	setenv("COHORT_LOCAL_WORLD_SIZE", "2", 1);
	setenv("COHORT_NODE_RANK", "1", 1);
	setenv("COHORT_RESTART_COUNT", "3", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "cohort");
	ck_assert_str_eq(e.coordinator, "tcp://10.1.2.3:29400");
	ck_assert_str_eq(e.coordinator_from, "COHORT_COORDINATOR");
	ck_assert_str_eq(e.job, "train-7");
	ck_assert_str_eq(e.job_from, "COHORT_JOB");
	ck_assert_str_eq(e.token, "s3cret");
	ck_assert_int_eq(e.rank, 2);
	ck_assert_str_eq(e.rank_from, "COHORT_RANK");
	ck_assert_int_eq(e.world_size, 4);
	ck_assert_str_eq(e.world_size_from, "COHORT_WORLD_SIZE");
	ck_assert_int_eq(e.local_rank, 0);
	ck_assert_str_eq(e.local_rank_from, "COHORT_LOCAL_RANK");
	ck_assert_int_eq(e.local_world_size, 2);
	ck_assert_int_eq(e.node_rank, 1);
	ck_assert_int_eq(e.restart_count, 3);
}
END_TEST

START_TEST(test_torchrun_source)
{
	cohort_env e;

	setenv("RANK", "5", 1);
	setenv("WORLD_SIZE", "8", 1);
	setenv("LOCAL_RANK", "1", 1);
	setenv("LOCAL_WORLD_SIZE", "4", 1);
	setenv("GROUP_RANK", "1", 1);
	setenv("MASTER_ADDR", "10.0.0.1", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("TORCHELASTIC_RUN_ID", "elastic-42", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "torchrun");
	ck_assert_int_eq(e.rank, 5);
	ck_assert_str_eq(e.rank_from, "RANK");
	ck_assert_int_eq(e.world_size, 8);
	ck_assert_str_eq(e.world_size_from, "WORLD_SIZE");
	ck_assert_int_eq(e.local_rank, 1);
	ck_assert_str_eq(e.local_rank_from, "LOCAL_RANK");
	ck_assert_int_eq(e.local_world_size, 4);
	ck_assert_int_eq(e.node_rank, 1);
	ck_assert_str_eq(e.coordinator, "tcp://10.0.0.1:29500");
	ck_assert_str_eq(e.coordinator_from, "MASTER_ADDR:MASTER_PORT");
	ck_assert_str_eq(e.job, "elastic-42");
	ck_assert_str_eq(e.job_from, "TORCHELASTIC_RUN_ID");
}
END_TEST

START_TEST(test_torchrun_default_job)
{
	cohort_env e;

	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "1", 1);
	setenv("MASTER_ADDR", "localhost", 1);
	setenv("MASTER_PORT", "1234", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "default");
	ck_assert_str_eq(e.job_from, "default");
	ck_assert_str_eq(e.coordinator, "tcp://localhost:1234");
}
END_TEST

START_TEST(test_master_addr_ipv6)
{
	cohort_env e;

	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "1", 1);
	setenv("MASTER_ADDR", "fd00::1", 1);
	setenv("MASTER_PORT", "29500", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "tcp://[fd00::1]:29500");
}
END_TEST

START_TEST(test_cohort_coordinator_always_wins)
{
	cohort_env e;

	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "10.0.0.1", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("COHORT_COORDINATOR", "ipc:///tmp/cohortd.sock", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "torchrun");
	ck_assert_str_eq(e.coordinator, "ipc:///tmp/cohortd.sock");
	ck_assert_str_eq(e.coordinator_from, "COHORT_COORDINATOR");
}
END_TEST

START_TEST(test_cohort_beats_torchrun)
{
	cohort_env e;

	setenv("COHORT_RANK", "1", 1);
	setenv("COHORT_WORLD_SIZE", "2", 1);
	setenv("RANK", "7", 1);
	setenv("WORLD_SIZE", "16", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "cohort");
	ck_assert_int_eq(e.rank, 1);
	ck_assert_int_eq(e.world_size, 2);
}
END_TEST

START_TEST(test_incomplete_source_is_skipped)
{
	cohort_env e;

	/* COHORT_RANK without COHORT_WORLD_SIZE: not complete */
	setenv("COHORT_RANK", "1", 1);
	setenv("RANK", "3", 1);
	setenv("WORLD_SIZE", "4", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "torchrun");
	ck_assert_int_eq(e.rank, 3);
}
END_TEST

START_TEST(test_torchrun_beats_openmpi_and_slurm)
{
	cohort_env e;

	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("SLURM_PROCID", "5", 1);
	setenv("SLURM_NTASKS", "6", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "torchrun");
	ck_assert_int_eq(e.rank, 1);
}
END_TEST

START_TEST(test_openmpi_source)
{
	cohort_env e;

	setenv("OMPI_COMM_WORLD_RANK", "3", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "4", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	setenv("SLURM_PROCID", "0", 1);
	setenv("SLURM_NTASKS", "9", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "openmpi");
	ck_assert_int_eq(e.rank, 3);
	ck_assert_str_eq(e.rank_from, "OMPI_COMM_WORLD_RANK");
	ck_assert_int_eq(e.world_size, 4);
	ck_assert_int_eq(e.local_rank, 1);
	ck_assert_int_eq(e.local_world_size, 2);
}
END_TEST

START_TEST(test_slurm_source)
{
	cohort_env e;

	setenv("SLURM_PROCID", "6", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_LOCALID", "2", 1);
	setenv("SLURM_NODEID", "1", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "slurm");
	ck_assert_int_eq(e.rank, 6);
	ck_assert_str_eq(e.rank_from, "SLURM_PROCID");
	ck_assert_int_eq(e.world_size, 8);
	ck_assert_str_eq(e.world_size_from, "SLURM_NTASKS");
	ck_assert_int_eq(e.local_rank, 2);
	ck_assert_int_eq(e.node_rank, 1);
}
END_TEST

/* torchrun's restart counter (its agent sets it for every worker) when
 * cohort's own is unset; cohort's wins. */
START_TEST(test_torchelastic_restart_count)
{
	cohort_env e;

	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("TORCHELASTIC_RESTART_COUNT", "3", 1);
	setenv("TORCHELASTIC_MAX_RESTARTS", "5", 1);
	e = env_resolve_ok();
	ck_assert_int_eq(e.restart_count, 3);
	ck_assert_str_eq(e.restart_count_from, "TORCHELASTIC_RESTART_COUNT");
	setenv("COHORT_RESTART_COUNT", "1", 1);
	e = env_resolve_ok();
	ck_assert_int_eq(e.restart_count, 1);
	ck_assert_str_eq(e.restart_count_from, "COHORT_RESTART_COUNT");
	unsetenv("COHORT_RESTART_COUNT");
	setenv("TORCHELASTIC_RESTART_COUNT", "-1", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(
	    strstr(cohort_last_error(), "TORCHELASTIC_RESTART_COUNT"));
}
END_TEST

/* torchrun's static rendezvous has run id "none" (no id): the address of
 * its store names the launch instead. */
START_TEST(test_torchrun_run_id_none)
{
	cohort_env e;

	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "10.0.0.1", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("TORCHELASTIC_RUN_ID", "none", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "torchrun-10.0.0.1:29500");
	ck_assert_str_eq(e.job_from, "MASTER_ADDR:MASTER_PORT");
}
END_TEST

/* What Open MPI 4.1 sets for `mpirun -n 2` (seen on mpirun 4.1.4): the
 * ranks, and the job id twice (ess and PMIx). */
START_TEST(test_openmpi_job_id)
{
	cohort_env e;

	setenv("OMPI_COMM_WORLD_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_RANK", "1", 1);
	setenv("OMPI_COMM_WORLD_LOCAL_SIZE", "2", 1);
	setenv("OMPI_COMM_WORLD_NODE_RANK", "1", 1);
	setenv("OMPI_MCA_ess_base_jobid", "1829961729", 1);
	setenv("PMIX_NAMESPACE", "1829961729", 1);
	setenv("PMIX_ID", "1829961729.1", 1);
	setenv("PMIX_RANK", "1", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "openmpi");
	ck_assert_str_eq(e.job, "ompi-1829961729");
	ck_assert_str_eq(e.job_from, "OMPI_MCA_ess_base_jobid");
	ck_assert_str_eq(e.notes, "");
	/* Open MPI 5 (PRRTE) has only the PMIx namespace. */
	unsetenv("OMPI_MCA_ess_base_jobid");
	setenv("PMIX_NAMESPACE", "prterun-node1-4242@1", 1);
	setenv("PMIX_ID", "prterun-node1-4242@1.1", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "pmix-prterun-node1-4242@1");
	ck_assert_str_eq(e.job_from, "PMIX_NAMESPACE");
	unsetenv("PMIX_NAMESPACE");
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "pmix-prterun-node1-4242@1");
	ck_assert_str_eq(e.job_from, "PMIX_ID");
}
END_TEST

/* What MPICH 4's Hydra sets for `mpiexec -n 2` (seen on mpiexec.hydra
 * 4.0.2); Intel MPI's Hydra sets the same. No job id: the job is
 * "default", with a note saying so. */
START_TEST(test_pmi_source)
{
	cohort_env e;

	setenv("PMI_RANK", "1", 1);
	setenv("PMI_SIZE", "2", 1);
	setenv("PMI_FD", "8", 1);
	setenv("MPI_LOCALRANKID", "1", 1);
	setenv("MPI_LOCALNRANKS", "2", 1);
	setenv("HYDI_CONTROL_FD", "7", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "pmi");
	ck_assert_int_eq(e.rank, 1);
	ck_assert_str_eq(e.rank_from, "PMI_RANK");
	ck_assert_int_eq(e.world_size, 2);
	ck_assert_str_eq(e.world_size_from, "PMI_SIZE");
	ck_assert_int_eq(e.local_rank, 1);
	ck_assert_str_eq(e.local_rank_from, "MPI_LOCALRANKID");
	ck_assert_int_eq(e.local_world_size, 2);
	ck_assert_str_eq(e.job, "default");
	ck_assert_ptr_nonnull(strstr(e.notes, "COHORT_JOB"));
	/* Other PMI launchers name the local rank PMI_LOCAL_RANK. */
	unsetenv("MPI_LOCALRANKID");
	unsetenv("MPI_LOCALNRANKS");
	setenv("PMI_LOCAL_RANK", "0", 1);
	setenv("PMI_LOCAL_SIZE", "1", 1);
	e = env_resolve_ok();
	ck_assert_int_eq(e.local_rank, 0);
	ck_assert_str_eq(e.local_rank_from, "PMI_LOCAL_RANK");
	ck_assert_int_eq(e.local_world_size, 1);
	/* Open MPI's variables come first. */
	setenv("OMPI_COMM_WORLD_RANK", "0", 1);
	setenv("OMPI_COMM_WORLD_SIZE", "2", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "openmpi");
	unsetenv("OMPI_COMM_WORLD_RANK");
	unsetenv("OMPI_COMM_WORLD_SIZE");
	setenv("PMI_LOCAL_RANK", "1", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "PMI_LOCAL_RANK"));
}
END_TEST

/* `srun -n 8` in a batch job: the variables a task gets. */
static void
env_slurm_task(void)
{
	setenv("SLURM_PROCID", "5", 1);
	setenv("SLURM_NTASKS", "8", 1);
	setenv("SLURM_LOCALID", "1", 1);
	setenv("SLURM_NODEID", "1", 1);
	setenv("SLURM_NNODES", "2", 1);
	setenv("SLURM_NTASKS_PER_NODE", "4", 1);
	setenv("SLURM_JOB_ID", "123456", 1);
	setenv("SLURM_JOBID", "123456", 1);
	setenv("SLURM_STEP_ID", "0", 1);
	setenv("SLURM_STEPID", "0", 1);
	setenv("SLURM_JOB_NAME", "train.sh", 1);
	setenv("SLURM_JOB_NODELIST", "gpu[017-018]", 1);
	setenv("SLURM_NODELIST", "gpu[017-018]", 1);
}

START_TEST(test_slurm_job_and_coordinator)
{
	cohort_env e;

	env_slurm_task();
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "slurm");
	ck_assert_int_eq(e.rank, 5);
	ck_assert_str_eq(e.job, "slurm-123456.0");
	ck_assert_str_eq(e.job_from, "SLURM_JOB_ID.SLURM_STEP_ID");
	/* Lightning's port: 15000 + the last four digits of the job id */
	ck_assert_str_eq(e.coordinator, "tcp://gpu017:18456");
	ck_assert_str_eq(e.coordinator_from, "SLURM_JOB_NODELIST");
	/* MASTER_PORT wins over the derived port, MASTER_ADDR over the
	 * list; both: torchrun's rule */
	setenv("MASTER_PORT", "29555", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "tcp://gpu017:29555");
	setenv("MASTER_ADDR", "10.1.0.17", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "tcp://10.1.0.17:29555");
	ck_assert_str_eq(e.coordinator_from, "MASTER_ADDR:MASTER_PORT");
	unsetenv("MASTER_PORT");
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "tcp://10.1.0.17:18456");
	ck_assert_str_eq(e.coordinator_from, "MASTER_ADDR:SLURM_JOB_ID");
	unsetenv("MASTER_ADDR");
	/* COHORT_COORDINATOR wins over all */
	setenv("COHORT_COORDINATOR", "tcp://cohortd:29400", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "tcp://cohortd:29400");
	unsetenv("COHORT_COORDINATOR");
	/* the batch script itself: no step */
	unsetenv("SLURM_STEP_ID");
	unsetenv("SLURM_STEPID");
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "slurm-123456");
	ck_assert_str_eq(e.job_from, "SLURM_JOB_ID");
	/* a list that cannot be read: no coordinator, a note, no error */
	setenv("SLURM_JOB_NODELIST", "gpu[017", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "");
	ck_assert_ptr_nonnull(strstr(e.notes, "unclosed"));
	/* a short job id: 15000 + the id */
	setenv("SLURM_JOB_NODELIST", "n1", 1);
	setenv("SLURM_JOB_ID", "77", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "tcp://n1:15077");
}
END_TEST

/* salloc's shell (SLURM_JOB_NAME=bash or interactive) is an allocation,
 * not a job's tasks: its variables are neither a rank nor a job id
 * (Lightning's SLURMEnvironment draws the same line). */
START_TEST(test_slurm_interactive_skipped)
{
	cohort_env e;

	env_slurm_task();
	setenv("SLURM_JOB_NAME", "bash", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "none");
	ck_assert_int_eq(e.rank, -1);
	ck_assert_str_eq(e.job, "default");
	ck_assert_str_eq(e.coordinator, "");
	ck_assert_ptr_nonnull(strstr(e.notes, "SLURM_JOB_NAME=bash"));
	setenv("SLURM_JOB_NAME", "interactive", 1);
	/* another launcher started inside the allocation is used */
	setenv("RANK", "0", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("TORCHELASTIC_RUN_ID", "none", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "torchrun");
	ck_assert_str_eq(e.job, "torchrun-127.0.0.1:29500");
	/* a real job name that merely contains "bash" is a job */
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	setenv("SLURM_JOB_NAME", "bash-train", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "slurm");
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

/* Kubeflow's Trainer (v2 TrainJob; PyTorchJob alike) gives torchrun's
 * arguments as PET_* variables. Started directly with one process per
 * node, a worker is node PET_NODE_RANK of PET_NNODES. */
START_TEST(test_kubeflow_pet)
{
	cohort_env e;

	setenv("PET_NNODES", "4", 1);
	setenv("PET_NPROC_PER_NODE", "1", 1);
	setenv("PET_NODE_RANK", "2", 1);
	setenv("PET_MASTER_ADDR", "mnist-node-0-0.mnist", 1);
	setenv("PET_MASTER_PORT", "29400", 1);
	setenv("JOB_COMPLETION_INDEX", "2", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "kubeflow");
	ck_assert_int_eq(e.rank, 2);
	ck_assert_str_eq(e.rank_from, "PET_NODE_RANK");
	ck_assert_int_eq(e.world_size, 4);
	ck_assert_str_eq(e.world_size_from, "PET_NNODES");
	ck_assert_int_eq(e.local_rank, 0);
	ck_assert_int_eq(e.local_world_size, 1);
	ck_assert_int_eq(e.node_rank, 2);
	ck_assert_str_eq(e.coordinator, "tcp://mnist-node-0-0.mnist:29400");
	ck_assert_str_eq(
	    e.coordinator_from, "PET_MASTER_ADDR:PET_MASTER_PORT");
	ck_assert_str_eq(e.job, "kubeflow-mnist-node-0-0.mnist:29400");
	ck_assert_str_eq(e.job_from, "PET_MASTER_ADDR");
	/* the manifests' COHORT_JOB (downward API) wins */
	setenv("COHORT_JOB", "mnist-5f0c", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "mnist-5f0c");
	/* torchrun inside the pod: its variables win */
	setenv("RANK", "9", 1);
	setenv("WORLD_SIZE", "16", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "torchrun");
	unsetenv("RANK");
	unsetenv("WORLD_SIZE");
	/* several processes per node: torchrun's (or cohort run's) job */
	setenv("PET_NPROC_PER_NODE", "auto", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "none");
	ck_assert_ptr_nonnull(strstr(e.notes, "PET_NPROC_PER_NODE=auto"));
	/* torchrun's default is one per node */
	unsetenv("PET_NPROC_PER_NODE");
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "kubeflow");
	setenv("PET_NNODES", "two", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
}
END_TEST

/* The order of the job's identity: one launch, one name. */
START_TEST(test_job_identity_order)
{
	cohort_env e;

	setenv("SLURM_JOB_ID", "42", 1);
	setenv("SLURM_STEP_ID", "3", 1);
	setenv("PMIX_NAMESPACE", "slurm.pmix.42.3", 1);
	setenv("TORCHELASTIC_RUN_ID", "abc", 1);
	setenv("COHORT_JOB", "mine", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "mine");
	unsetenv("COHORT_JOB");
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "abc");
	unsetenv("TORCHELASTIC_RUN_ID");
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "pmix-slurm.pmix.42.3");
	unsetenv("PMIX_NAMESPACE");
	e = env_resolve_ok();
	ck_assert_str_eq(e.job, "slurm-42.3");
	/* a name that does not fit is an error, never a cut name */
	{
		char big[200];
		memset(big, '7', sizeof(big) - 1);
		big[sizeof(big) - 1] = '\0';
		setenv("SLURM_JOB_ID", big, 1);
		ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
		ck_assert_ptr_nonnull(
		    strstr(cohort_last_error(), "SLURM_JOB_ID"));
	}
}
END_TEST

START_TEST(test_token_file)
{
	cohort_env e;
	char path[] = "/tmp/cohort-test-token-XXXXXX";
	int fd = mkstemp(path);
	FILE *f;

	ck_assert_int_ge(fd, 0);
	f = fdopen(fd, "w");
	fputs("s3cret-from-file\n", f);
	fclose(f);
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

START_TEST(test_k8s_indexed_job)
{
	cohort_env e;

	setenv("JOB_COMPLETION_INDEX", "3", 1);
	setenv("COHORT_WORLD_SIZE", "8", 1);
	setenv("COHORT_COORDINATOR", "tcp://cohortd.ns.svc:29400", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "k8s-indexed-job");
	ck_assert_int_eq(e.rank, 3);
	ck_assert_str_eq(e.rank_from, "JOB_COMPLETION_INDEX");
	ck_assert_int_eq(e.world_size, 8);
	ck_assert_str_eq(e.world_size_from, "COHORT_WORLD_SIZE");
}
END_TEST

START_TEST(test_k8s_index_needs_world_size)
{
	cohort_env e;

	setenv("JOB_COMPLETION_INDEX", "3", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "none");
	ck_assert_int_eq(e.rank, -1);
}
END_TEST

START_TEST(test_kubernetes_vars_ignored)
{
	cohort_env e;

	setenv("KUBERNETES_SERVICE_HOST", "10.96.0.1", 1);
	setenv("KUBERNETES_SERVICE_PORT", "443", 1);
	setenv("KUBERNETES_PORT", "tcp://10.96.0.1:443", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "none");
	ck_assert_str_eq(e.coordinator, "");
	ck_assert_int_eq(e.rank, -1);
	ck_assert_int_eq(e.world_size, 0);
	/* malformed KUBERNETES_* values are not even looked at */
	setenv("KUBERNETES_SERVICE_PORT", "not-a-port", 1);
	setenv("COHORT_RANK", "0", 1);
	setenv("COHORT_WORLD_SIZE", "1", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "cohort");
}
END_TEST

START_TEST(test_world_size_alone)
{
	cohort_env e;

	setenv("COHORT_WORLD_SIZE", "4", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "none");
	ck_assert_int_eq(e.rank, -1);
	ck_assert_int_eq(e.world_size, 4);
	ck_assert_str_eq(e.world_size_from, "COHORT_WORLD_SIZE");
}
END_TEST

START_TEST(test_malformed_rank)
{
	cohort_env e;

	setenv("RANK", "abc", 1);
	setenv("WORLD_SIZE", "4", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_str_eq(e.source, "invalid");
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "RANK"));
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "abc"));
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

START_TEST(test_rank_not_below_world)
{
	cohort_env e;

	setenv("COHORT_RANK", "4", 1);
	setenv("COHORT_WORLD_SIZE", "4", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_str_eq(e.source, "invalid");
}
END_TEST

START_TEST(test_later_source_not_validated)
{
	cohort_env e;

	/* the winner comes first; a broken later source is never read */
	setenv("COHORT_RANK", "0", 1);
	setenv("COHORT_WORLD_SIZE", "2", 1);
	setenv("RANK", "abc", 1);
	setenv("SLURM_NTASKS", "2(x3)", 1);
	e = env_resolve_ok();
	ck_assert_str_eq(e.source, "cohort");
}
END_TEST

START_TEST(test_bad_master_port)
{
	cohort_env e;

	setenv("MASTER_ADDR", "10.0.0.1", 1);
	setenv("MASTER_PORT", "99999", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(strstr(cohort_last_error(), "MASTER_PORT"));
	setenv("MASTER_PORT", "http", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	/* MASTER_ADDR alone is not a coordinator */
	unsetenv("MASTER_PORT");
	e = env_resolve_ok();
	ck_assert_str_eq(e.coordinator, "");
}
END_TEST

START_TEST(test_bad_coordinator_url)
{
	cohort_env e;

	setenv("COHORT_COORDINATOR", "10.0.0.1:29400", 1);
	ck_assert_cohort_err(cohort_env_resolve(&e), COHORT_EINVAL);
	ck_assert_ptr_nonnull(
	    strstr(cohort_last_error(), "COHORT_COORDINATOR"));
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

	setenv("RANK", "1", 1);
	setenv("WORLD_SIZE", "2", 1);
	setenv("MASTER_ADDR", "127.0.0.1", 1);
	setenv("MASTER_PORT", "29500", 1);
	setenv("COHORT_TOKEN", "do-not-print", 1);
	e = env_resolve_ok();
	n = cohort_env_format(&e, buf, sizeof(buf));
	ck_assert_uint_eq(n, strlen(buf));
	ck_assert_ptr_nonnull(strstr(buf, "source"));
	ck_assert_ptr_nonnull(strstr(buf, "torchrun"));
	ck_assert_ptr_nonnull(strstr(
	    buf, "tcp://127.0.0.1:29500 (from MASTER_ADDR:MASTER_PORT)"));
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
	const TTest *resolve_tests[] = { test_empty_environment,
		test_cohort_source, test_torchrun_source,
		test_torchrun_default_job, test_master_addr_ipv6,
		test_cohort_coordinator_always_wins,
		test_cohort_beats_torchrun, test_incomplete_source_is_skipped,
		test_torchrun_beats_openmpi_and_slurm, test_openmpi_source,
		test_slurm_source, test_torchelastic_restart_count,
		test_torchrun_run_id_none, test_openmpi_job_id,
		test_pmi_source, test_slurm_job_and_coordinator,
		test_slurm_interactive_skipped, test_slurm_first_host,
		test_kubeflow_pet, test_job_identity_order, test_token_file,
		test_k8s_indexed_job, test_k8s_index_needs_world_size,
		test_kubernetes_vars_ignored, test_world_size_alone,
		test_malformed_rank, test_malformed_values,
		test_rank_not_below_world, test_later_source_not_validated,
		test_bad_master_port, test_bad_coordinator_url,
		test_too_long_values, test_format_report,
		test_format_truncates_like_snprintf, NULL };
	const TTest *options_tests[] = { test_options_from_env,
		test_options_defaults, test_open_rejects_bad_options,
		test_open_no_coordinator, test_accessors_null_safe,
		test_env_vars_round_trip, NULL };
	Suite *s = suite_create("env");

	tcase_add_checked_fixture(
	    unit_tcase(s, "resolve", 30, resolve_tests), env_setup, NULL);
	tcase_add_checked_fixture(
	    unit_tcase(s, "options", 30, options_tests), env_setup, NULL);
	return (s);
}
