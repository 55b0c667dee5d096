/*
 * test_jobs.c - jobs that never mix, end to end: a real cohortd and real
 * worker processes started with the variables a launcher sets (and no
 * COHORT_JOB), mismatched joins refused with the error naming both sides,
 * and job creation under cohortd --require-token.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "check_cohort.h"
#include "token.h"

/* One worker of a launch: env entries (NULL-terminated) plus the
 * coordinator, output to out. */
static pid_t
jobs_spawn(const char *const *env, const char *scenario, const char *arg,
    char *out, size_t outlen, const char *tag)
{
	static char coord_env[32][128];
	static int next;
	char *e[24], *argv[4];
	int k = 0;

	snprintf(coord_env[next % 32], sizeof(coord_env[0]),
	    "COHORT_COORDINATOR=%s", th_fx_coord.url);
	e[k++] = coord_env[next++ % 32];
	for (int i = 0; env[i] != NULL && k < 23; i++)
		e[k++] = (char *)env[i];
	e[k] = NULL;
	argv[0] = (char *)th_bin("cohort-test-worker");
	argv[1] = (char *)scenario;
	argv[2] = (char *)arg;
	argv[3] = NULL;
	snprintf(out, outlen, "%s/%s.out", th_tmpdir(), tag);
	return (th_spawn(argv, e, out));
}

static char *
jobs_out(const char *path)
{
	char *s = th_read_file(path);

	return (s != NULL ? s : strdup("(no output)"));
}

/* Fails unless the output file at path has text (the message quotes the
 * output). */
#define jobs_expect(path, text)                                               \
	ck_assert_msg(th_file_has((path), (text)), "no \"%s\" in: %s",        \
	    (text), jobs_out(path))

static int
jobs_wait(pid_t pid, int ms)
{
	int st;

	if (!th_wait(pid, ms, &st)) {
		th_kill(pid);
		ck_abort_msg("worker %d hung past %d ms", (int)pid, ms);
	}
	return (th_exit_code(st));
}

/* The issue: an Open MPI job and a SLURM job on one cohortd, neither
 * naming its job, both got job 'default'; rank 1 of one and rank 0 of
 * the other completed an all-reduce together. Now each launch is its own
 * job (ompi-ID, slurm-ID.STEP) and computes its own sum. */
START_TEST(test_two_launchers_never_mix)
{
	static const char *const mpi[2][10] = {
		{ "OMPI_COMM_WORLD_RANK=0", "OMPI_COMM_WORLD_SIZE=2",
		    "OMPI_COMM_WORLD_LOCAL_RANK=0",
		    "OMPI_COMM_WORLD_LOCAL_SIZE=2",
		    "OMPI_MCA_ess_base_jobid=1829961729",
		    "PMIX_NAMESPACE=1829961729", "PMIX_ID=1829961729.0",
		    "PMIX_RANK=0", "COHORT_TEST_VALUE=100", NULL },
		{ "OMPI_COMM_WORLD_RANK=1", "OMPI_COMM_WORLD_SIZE=2",
		    "OMPI_COMM_WORLD_LOCAL_RANK=1",
		    "OMPI_COMM_WORLD_LOCAL_SIZE=2",
		    "OMPI_MCA_ess_base_jobid=1829961729",
		    "PMIX_NAMESPACE=1829961729", "PMIX_ID=1829961729.1",
		    "PMIX_RANK=1", "COHORT_TEST_VALUE=100", NULL },
	};
	static const char *const slurm[2][11] = {
		{ "SLURM_PROCID=0", "SLURM_NTASKS=2", "SLURM_LOCALID=0",
		    "SLURM_NODEID=0", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0",
		    "SLURM_JOB_NAME=train.sh", "SLURM_JOB_NODELIST=localhost",
		    "SLURM_NTASKS_PER_NODE=2", "COHORT_TEST_VALUE=1000",
		    NULL },
		{ "SLURM_PROCID=1", "SLURM_NTASKS=2", "SLURM_LOCALID=1",
		    "SLURM_NODEID=0", "SLURM_JOB_ID=4242", "SLURM_STEP_ID=0",
		    "SLURM_JOB_NAME=train.sh", "SLURM_JOB_NODELIST=localhost",
		    "SLURM_NTASKS_PER_NODE=2", "COHORT_TEST_VALUE=1000",
		    NULL },
	};
	char out[4][256];
	pid_t pid[4];

	/* interleaved, so that a mixing cohortd would pair them */
	pid[0] = jobs_spawn(
	    mpi[1], "allreduce_env", NULL, out[0], sizeof(out[0]), "mpi-1");
	pid[1] = jobs_spawn(slurm[0], "allreduce_env", NULL, out[1],
	    sizeof(out[1]), "slurm-0");
	usleep(200 * 1000);
	pid[2] = jobs_spawn(
	    mpi[0], "allreduce_env", NULL, out[2], sizeof(out[2]), "mpi-0");
	pid[3] = jobs_spawn(slurm[1], "allreduce_env", NULL, out[3],
	    sizeof(out[3]), "slurm-1");
	for (int i = 0; i < 4; i++)
		ck_assert_msg(jobs_wait(pid[i], 60000) == 0, "%s: %s", out[i],
		    jobs_out(out[i]));
	/* 2 x 100 + 0 + 1 and 2 x 1000 + 0 + 1 */
	for (int i = 0; i < 4; i += 2) {
		jobs_expect(out[i], "job=ompi-1829961729 source=openmpi");
		jobs_expect(out[i], "world=2 sum=201 ok=1");
	}
	for (int i = 1; i < 4; i += 2) {
		jobs_expect(out[i], "job=slurm-4242.0 source=slurm");
		jobs_expect(out[i], "world=2 sum=2001 ok=1");
	}
}
END_TEST

/* A worker of another launch under the same name (world size 3 against a
 * running job of 2) is refused, and its error names both sides; a wrong
 * token is refused naming the job. The running job is untouched. */
START_TEST(test_mismatched_join_refused)
{
	static const char *const r0[]
	    = { "COHORT_JOB=shared", "COHORT_TOKEN=t", "COHORT_RANK=0",
		      "COHORT_WORLD_SIZE=2", NULL };
	static const char *const r1[]
	    = { "COHORT_JOB=shared", "COHORT_TOKEN=t", "COHORT_RANK=1",
		      "COHORT_WORLD_SIZE=2", NULL };
	static const char *const bad_world[]
	    = { "COHORT_JOB=shared", "COHORT_TOKEN=t", "COHORT_RANK=2",
		      "COHORT_WORLD_SIZE=3", NULL };
	static const char *const bad_token[]
	    = { "COHORT_JOB=shared", "COHORT_TOKEN=other", "COHORT_RANK=0",
		      "COHORT_WORLD_SIZE=2", NULL };
	char out[4][256], release[256];
	pid_t p0, p1, x;
	int64_t t0;
	FILE *f;

	snprintf(release, sizeof(release), "%s/release", th_tmpdir());
	p0 = jobs_spawn(
	    r0, "hold_until", release, out[0], sizeof(out[0]), "r0");
	p1 = jobs_spawn(
	    r1, "hold_until", release, out[1], sizeof(out[1]), "r1");
	t0 = th_now_ms();
	while (!(th_file_has(out[0], "READY") && th_file_has(out[1], "READY"))
	    && th_now_ms() - t0 < 30000)
		usleep(20 * 1000);
	jobs_expect(out[0], "READY");
	x = jobs_spawn(bad_world, "open", NULL, out[2], sizeof(out[2]), "x");
	ck_assert_int_eq(jobs_wait(x, 30000), 1);
	jobs_expect(out[2], "status=COHORT_EINVAL");
	jobs_expect(out[2],
	    "job 'shared' has world size 2 (since generation 1); this worker");
	jobs_expect(out[2], "says 3");
	x = jobs_spawn(bad_token, "open", NULL, out[3], sizeof(out[3]), "y");
	ck_assert_int_eq(jobs_wait(x, 30000), 1);
	jobs_expect(out[3], "status=COHORT_EAUTH");
	jobs_expect(out[3], "wrong token for job 'shared'");
	ck_assert_msg(
	    !th_file_has(out[3], "COHORT_TOKEN=t"), "%s", jobs_out(out[3]));
	/* the job itself is untouched and finishes */
	f = fopen(release, "w");
	ck_assert_ptr_nonnull(f);
	fclose(f);
	ck_assert_msg(jobs_wait(p0, 90000) == 0, "%s", jobs_out(out[0]));
	ck_assert_msg(jobs_wait(p1, 90000) == 0, "%s", jobs_out(out[1]));
	ck_assert(th_file_has(out[0], "RESULT hold_until ok=1"));
}
END_TEST

/* cohortd --require-token --admin-token-file F: a join without a token
 * cohortd accepts creates no job; the token `cohort token JOB` prints
 * does. The secret is on no command line. */
static char admin_path[256];

static void
setup_require_token(void)
{
	static char arg[300], preset[320];
	static const char *args[7];
	char path[300];
	FILE *f;

	snprintf(
	    admin_path, sizeof(admin_path), "%s/admin.secret", th_tmpdir());
	f = fopen(admin_path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("adm1n-secret-for-tests\n", f);
	fclose(f);
	snprintf(path, sizeof(path), "%s/preset.token", th_tmpdir());
	f = fopen(path, "w");
	ck_assert_ptr_nonnull(f);
	fputs("preset-s3cret\n", f);
	fclose(f);
	snprintf(arg, sizeof(arg), "%s", admin_path);
	snprintf(preset, sizeof(preset), "preset:@%s", path);
	args[0] = "--require-token";
	args[1] = "--admin-token-file";
	args[2] = arg;
	args[3] = "--job";
	args[4] = preset;
	args[5] = NULL;
	th_coord_start(&th_fx_coord, args);
}

/* --job NAME:@FILE: the preset job's token comes from the file, and no
 * secret is on cohortd's command line (ps shows it to every user). */
START_TEST(test_preset_job_token_from_file)
{
	static const char *const right[]
	    = { "COHORT_JOB=preset", "COHORT_TOKEN=preset-s3cret",
		      "COHORT_RANK=0", "COHORT_WORLD_SIZE=1", NULL };
	char out[256], path[64], *cmdline;
	FILE *f;
	size_t n;

	snprintf(path, sizeof(path), "/proc/%d/cmdline", (int)th_fx_coord.pid);
	f = fopen(path, "rb");
	ck_assert_ptr_nonnull(f);
	cmdline = calloc(1, 8192);
	n = fread(cmdline, 1, 8191, f);
	fclose(f);
	for (size_t i = 0; i < n; i++)
		if (cmdline[i] == '\0')
			cmdline[i] = ' ';
	ck_assert_ptr_nonnull(strstr(cmdline, "--require-token"));
	ck_assert_ptr_null(strstr(cmdline, "s3cret"));
	ck_assert_ptr_null(strstr(cmdline, "adm1n-secret"));
	free(cmdline);
	ck_assert_int_eq(
	    jobs_wait(jobs_spawn(right, "open", NULL, out, sizeof(out), "pre"),
	        30000),
	    0);
	jobs_expect(out, "rank=0 world=1");
}
END_TEST

START_TEST(test_require_token_creates_only_with_minted)
{
	static char tokfile[300], e_file[320];
	char out[4][256], *argv[5], *tok;
	const char *with_file[6], *none[5], *made_up[6];
	pid_t pid[2], p;
	int st;

	/* the operator mints the job's token (cohort token) into a file */
	snprintf(tokfile, sizeof(tokfile), "%s/train-7.token", th_tmpdir());
	argv[0] = (char *)th_bin("cohort");
	argv[1] = "token";
	argv[2] = "--admin-token-file";
	argv[3] = admin_path;
	argv[4] = NULL;
	{
		char *a2[6]
		    = { argv[0], argv[1], argv[2], argv[3], "train-7", NULL };
		p = th_spawn(a2, NULL, tokfile);
	}
	ck_assert(th_wait(p, 10000, &st));
	ck_assert_int_eq(th_exit_code(st), 0);
	tok = th_read_file(tokfile);
	ck_assert_ptr_nonnull(tok);
	ck_assert_uint_eq(strlen(tok), COHORT__MINTED_LEN + 1);
	{
		char want[COHORT__MINTED_LEN + 1];
		cohort__token_mint("adm1n-secret-for-tests", "train-7", want);
		ck_assert(strncmp(tok, want, COHORT__MINTED_LEN) == 0);
	}
	free(tok);

	/* no token: refused, naming the job and what to do */
	none[0] = "COHORT_JOB=train-7";
	none[1] = "COHORT_RANK=0";
	none[2] = "COHORT_WORLD_SIZE=1";
	none[3] = NULL;
	p = jobs_spawn(none, "open", NULL, out[0], sizeof(out[0]), "none");
	ck_assert_int_eq(jobs_wait(p, 30000), 1);
	jobs_expect(out[0], "status=COHORT_EAUTH");
	jobs_expect(out[0], "wrong token for job 'train-7'");
	jobs_expect(out[0], "cohort token train-7");
	/* a made-up token: the same */
	made_up[0] = "COHORT_JOB=train-7";
	made_up[1] = "COHORT_TOKEN=guess";
	made_up[2] = "COHORT_RANK=0";
	made_up[3] = "COHORT_WORLD_SIZE=1";
	made_up[4] = NULL;
	p = jobs_spawn(made_up, "open", NULL, out[1], sizeof(out[1]), "guess");
	ck_assert_int_eq(jobs_wait(p, 30000), 1);
	ck_assert(th_file_has(out[1], "status=COHORT_EAUTH"));
	/* the minted token, from a file: the job is created and runs */
	snprintf(e_file, sizeof(e_file), "COHORT_TOKEN_FILE=%s", tokfile);
	with_file[0] = "COHORT_JOB=train-7";
	with_file[1] = e_file;
	with_file[2] = "COHORT_WORLD_SIZE=2";
	with_file[3] = "COHORT_TEST_VALUE=5";
	with_file[4] = "COHORT_RANK=0";
	with_file[5] = NULL;
	pid[0] = jobs_spawn(
	    with_file, "allreduce_env", NULL, out[2], sizeof(out[2]), "m0");
	with_file[4] = "COHORT_RANK=1";
	pid[1] = jobs_spawn(
	    with_file, "allreduce_env", NULL, out[3], sizeof(out[3]), "m1");
	for (int i = 0; i < 2; i++) {
		ck_assert_msg(
		    jobs_wait(pid[i], 60000) == 0, "%s", jobs_out(out[2 + i]));
		ck_assert_msg(
		    th_file_has(out[2 + i], "job=train-7 source=cohort"), "%s",
		    jobs_out(out[2 + i]));
		ck_assert(th_file_has(out[2 + i], "sum=11 ok=1"));
	}
}
END_TEST

/* `cohort run ARGS -- PROGRAM...` with extra environment; output to
 * out. */
static pid_t
jobs_run(const char *const *args, char *const *env, char *out, size_t len,
    const char *tag)
{
	char *argv[32];
	int n = 0;

	argv[n++] = (char *)th_bin("cohort");
	argv[n++] = "run";
	for (int i = 0; args[i] != NULL && n < 31; i++)
		argv[n++] = (char *)args[i];
	argv[n] = NULL;
	snprintf(out, len, "%s/%s.out", th_tmpdir(), tag);
	return (th_spawn(argv, env, out));
}

/* Kubeflow's Trainer runs the same command in every node's pod with
 * torchrun's arguments as PET_*: cohort run takes them as --nnodes, -n,
 * --node-rank and --coordinator; node 0 serves the coordinator at
 * PET_MASTER_PORT; the job's name (the same on both nodes) comes from
 * PET_MASTER_ADDR. Node 1 starts first and waits for node 0. */
START_TEST(test_run_kubeflow_two_nodes)
{
	static char e_port[64], e_node[2][32], want[128];
	const char *args[]
	    = { "--", th_bin("cohort-test-worker"), "allreduce_env", NULL };
	char *env[2][8];
	char out[2][256];
	pid_t p[2];
	int port = th_free_port();

	snprintf(e_port, sizeof(e_port), "PET_MASTER_PORT=%d", port);
	for (int node = 0; node < 2; node++) {
		snprintf(e_node[node], sizeof(e_node[node]),
		    "PET_NODE_RANK=%d", node);
		env[node][0] = "PET_NNODES=2";
		env[node][1] = "PET_NPROC_PER_NODE=2";
		env[node][2] = e_node[node];
		env[node][3] = "PET_MASTER_ADDR=127.0.0.1";
		env[node][4] = e_port;
		env[node][5] = "COHORT_TEST_VALUE=10";
		env[node][6] = "COHORT_TOKEN=kf-token";
		env[node][7] = NULL;
	}
	p[1] = jobs_run(args, env[1], out[1], sizeof(out[1]), "kf-node1");
	usleep(500 * 1000);
	p[0] = jobs_run(args, env[0], out[0], sizeof(out[0]), "kf-node0");
	snprintf(want, sizeof(want), "job=kubeflow-127.0.0.1:%d source=cohort",
	    port);
	for (int node = 0; node < 2; node++) {
		ck_assert_msg(jobs_wait(p[node], 90000) == 0, "node %d: %s",
		    node, jobs_out(out[node]));
		ck_assert_msg(th_file_has(out[node], want), "node %d: %s",
		    node, jobs_out(out[node]));
		/* 4 x 10 + 0 + 1 + 2 + 3 */
		ck_assert_msg(th_file_has(out[node], "world=4 sum=46 ok=1"),
		    "node %d: %s", node, jobs_out(out[node]));
	}
	ck_assert(th_file_has(out[0], "rank=0 world=4"));
	ck_assert(th_file_has(out[1], "rank=3 world=4"));
}
END_TEST

/* run-<pid> differs per node: several nodes need one name, from --job or
 * the launcher, and are refused without. */
START_TEST(test_run_multinode_job_name)
{
	const char *args[] = { "--nnodes", "2", "--node-rank", "1", "-n", "1",
		"--coordinator", "tcp://127.0.0.1:1", "--", "/bin/sh", "-c",
		"echo job=$COHORT_JOB", NULL };
	char *slurm[] = { "SLURM_JOB_ID=777", "SLURM_STEP_ID=3",
		"SLURM_JOB_NAME=train.sh", NULL };
	char out[2][256];

	ck_assert_int_eq(
	    jobs_wait(
	        jobs_run(args, NULL, out[0], sizeof(out[0]), "nojob"), 30000),
	    2);
	jobs_expect(out[0], "pass --job NAME");
	ck_assert_int_eq(
	    jobs_wait(
	        jobs_run(args, slurm, out[1], sizeof(out[1]), "slurm"), 30000),
	    0);
	jobs_expect(out[1], "job=slurm-777.3");
}
END_TEST

Suite *suite_integration_jobs(void);

Suite *
suite_integration_jobs(void)
{
	Suite *s = suite_create("integration_jobs");

	th_suite_case(s, "launchers", 180, th_fx_setup, th_fx_teardown,
	    test_two_launchers_never_mix, test_mismatched_join_refused, NULL);
	th_suite_case(s, "require_token", 180, setup_require_token,
	    th_fx_teardown, test_require_token_creates_only_with_minted,
	    test_preset_job_token_from_file, NULL);
	th_suite_case(s, "cohort_run", 180, NULL, NULL,
	    test_run_kubeflow_two_nodes, test_run_multinode_job_name, NULL);
	return (s);
}
