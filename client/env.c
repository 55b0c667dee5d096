/*
 * env.c - where a worker's rank, world size, coordinator and job come from.
 *
 * Rank sources in order (docs/launchers.md); the first *complete* one
 * (rank and world size both set) wins and is logged at info:
 *
 *   cohort           COHORT_RANK, COHORT_WORLD_SIZE (+ COHORT_LOCAL_RANK,
 *                    COHORT_LOCAL_WORLD_SIZE, COHORT_NODE_RANK)
 *   torchrun         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *                    GROUP_RANK
 *   openmpi          OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   pmi              PMI_RANK, PMI_SIZE (MPICH, Intel MPI: Hydra; any
 *                    PMI-1/2 launcher), local rank MPI_LOCALRANKID or
 *                    PMI_LOCAL_RANK, local size MPI_LOCALNRANKS or
 *                    PMI_LOCAL_SIZE
 *   slurm            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID;
 *                    not in an interactive allocation (SLURM_JOB_NAME bash
 *                    or interactive, as Lightning's SLURMEnvironment)
 *   k8s-indexed-job  JOB_COMPLETION_INDEX with COHORT_WORLD_SIZE
 *   kubeflow         PET_NODE_RANK, PET_NNODES when PET_NPROC_PER_NODE is 1
 *                    (or unset, torchrun's default): a worker Kubeflow's
 *                    Trainer meant for torchrun, started directly, one per
 *                    node
 *
 * The coordinator is COHORT_COORDINATOR, else tcp://MASTER_ADDR:
 * MASTER_PORT, else for slurm tcp://FIRST-HOST:PORT (the first host of
 * SLURM_JOB_NODELIST, the port as Lightning derives MASTER_PORT: 15000 +
 * the last four digits of SLURM_JOB_ID; MASTER_ADDR and MASTER_PORT win
 * over either), else for kubeflow tcp://PET_MASTER_ADDR:PET_MASTER_PORT.
 *
 * The job is COHORT_JOB, else the launcher's id of this launch (env_job
 * below), so that two launches on one cohortd never share a job by
 * accident; "default" only when no launcher gives one (MPICH's Hydra). The
 * token is COHORT_TOKEN, else the contents of COHORT_TOKEN_FILE. The
 * restart count is COHORT_RESTART_COUNT, else TORCHELASTIC_RESTART_COUNT.
 *
 * With no complete source, the world size still comes from
 * COHORT_WORLD_SIZE if set (cohortd then assigns ranks). Variables of a
 * source are validated only when that source is looked at; a malformed one
 * is COHORT_EINVAL. KUBERNETES_* is never read: running on Kubernetes is
 * not a mode.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "cohort_impl.h"
#include "netaddr.h"
#include "token.h"

struct env_source {
	const char *name;
	const char *rank;
	const char *world;
	const char *local_rank[2]; /* the first one set */
	const char *local_world[2];
	const char *node_rank;
	/* NULL, or false (with a note why) when the launcher's variables
	 * are there but do not describe this process. */
	bool (*usable)(cohort_env *out);
	/* One process per node: local rank 0 of 1, node rank = rank. */
	bool one_per_node;
};

static bool env_slurm_usable(cohort_env *out);
static bool env_kubeflow_usable(cohort_env *out);

static const struct env_source env_sources[] = {
	{ "cohort", "COHORT_RANK", "COHORT_WORLD_SIZE",
	    { "COHORT_LOCAL_RANK" }, { "COHORT_LOCAL_WORLD_SIZE" },
	    "COHORT_NODE_RANK", NULL, false },
	{ "torchrun", "RANK", "WORLD_SIZE", { "LOCAL_RANK" },
	    { "LOCAL_WORLD_SIZE" }, "GROUP_RANK", NULL, false },
	{ "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	    { "OMPI_COMM_WORLD_LOCAL_RANK" }, { "OMPI_COMM_WORLD_LOCAL_SIZE" },
	    NULL, NULL, false },
	{ "pmi", "PMI_RANK", "PMI_SIZE",
	    { "MPI_LOCALRANKID", "PMI_LOCAL_RANK" },
	    { "MPI_LOCALNRANKS", "PMI_LOCAL_SIZE" }, NULL, NULL, false },
	{ "slurm", "SLURM_PROCID", "SLURM_NTASKS", { "SLURM_LOCALID" },
	    { NULL }, "SLURM_NODEID", env_slurm_usable, false },
	{ "k8s-indexed-job", "JOB_COMPLETION_INDEX", "COHORT_WORLD_SIZE",
	    { NULL }, { NULL }, NULL, NULL, false },
	{ "kubeflow", "PET_NODE_RANK", "PET_NNODES", { NULL }, { NULL }, NULL,
	    env_kubeflow_usable, true },
};

#define ENV_NSOURCES (sizeof(env_sources) / sizeof(env_sources[0]))
#define ENV_INT_MAX (1 << 24) /* no job has more ranks than this */

/* Reads an integer variable in [min, max]. Returns COHORT_OK with
 * *present = false when unset (or empty), EINVAL when malformed. */
static cohort_status
env_int(
    const char *name, int64_t min, int64_t max, int32_t *out, bool *present)
{
	const char *s;
	int64_t v;

	*present = false;
	if ((s = cohort__env_raw(name)) == NULL)
		return (COHORT_OK);
	if (s[0] == ' ' || s[0] == '\t' || !cohort__parse_i64(s, &v))
		return (cohort__err(
		    COHORT_EINVAL, "%s='%s' is not an integer", name, s));
	if (v < min || v > max)
		return (cohort__err(COHORT_EINVAL,
		    "%s=%s is out of range [%lld, %lld]", name, s,
		    (long long)min, (long long)max));
	*out = (int32_t)v;
	*present = true;
	return (COHORT_OK);
}

/* The first of two alternative integer variables that is set; *which
 * names it. */
static cohort_status
env_int2(const char *const names[2], int64_t min, int64_t max, int32_t *out,
    bool *present, const char **which)
{
	cohort_status st;

	*present = false;
	for (int i = 0; i < 2 && names[i] != NULL && !*present; i++) {
		if ((st = env_int(names[i], min, max, out, present))
		    != COHORT_OK)
			return (st);
		*which = names[i];
	}
	return (COHORT_OK);
}

static const char *
env_str(const char *name)
{
	return (cohort__env_raw(name));
}

/* Copies a string variable's value, EINVAL if it does not fit. */
static cohort_status
env_copy(char *dst, size_t size, const char *name, const char *val)
{
	if (strlen(val) >= size)
		return (cohort__err(COHORT_EINVAL,
		    "%s is longer than %zu bytes", name, size - 1));
	cohort__strlcpy(dst, val, size);
	return (COHORT_OK);
}

/* Adds a sentence to out->notes (and the debug log). */
static void env_note(cohort_env *out, const char *fmt, ...)
    __attribute__((format(printf, 2, 3)));

static void
env_note(cohort_env *out, const char *fmt, ...)
{
	char line[256];
	size_t off = strlen(out->notes);
	va_list ap;

	va_start(ap, fmt);
	vsnprintf(line, sizeof(line), fmt, ap);
	va_end(ap);
	cohort__debug("environment: %s", line);
	cohort__appendf(out->notes, sizeof(out->notes), &off, "%s%s",
	    off > 0 ? "; " : "", line);
}

/* An interactive SLURM allocation (salloc's shell) is not a job's tasks:
 * its SLURM_* variables describe the allocation, and programs started in
 * it by hand (or by another launcher) are not its ranks. Lightning's
 * SLURMEnvironment draws the same line. */
static bool
env_slurm_interactive(void)
{
	const char *name = env_str("SLURM_JOB_NAME");

	return (name != NULL
	    && (strcmp(name, "bash") == 0
	        || strcmp(name, "interactive") == 0));
}

static bool
env_slurm_usable(cohort_env *out)
{
	if (!env_slurm_interactive())
		return (true);
	if (env_str("SLURM_PROCID") != NULL || env_str("SLURM_NTASKS") != NULL)
		env_note(out,
		    "SLURM_JOB_NAME=%s: an interactive allocation, its "
		    "SLURM_* variables are not this process's rank",
		    env_str("SLURM_JOB_NAME"));
	return (false);
}

/* Kubeflow's Trainer sets torchrun's arguments as PET_* variables for
 * torchrun to read. Started without torchrun, a worker is one of
 * PET_NNODES only when there is one process per node. */
static bool
env_kubeflow_usable(cohort_env *out)
{
	const char *nproc = env_str("PET_NPROC_PER_NODE");

	if (nproc == NULL || strcmp(nproc, "1") == 0)
		return (true);
	if (env_str("PET_NNODES") != NULL)
		env_note(out,
		    "PET_NPROC_PER_NODE=%s: Kubeflow means torchrun (or "
		    "cohort run) to start the workers of each node; not "
		    "used as this process's rank",
		    nproc);
	return (false);
}

/* Looks at one source: COHORT_OK and *complete when it has rank and
 * world size; fills *out's rank fields then. */
static cohort_status
env_try_source(const struct env_source *src, cohort_env *out, bool *complete)
{
	int32_t rank = -1, world = 0, lrank = -1, lworld = 0, node = -1;
	bool has_rank, has_world, has_lrank, has_lworld, has_node;
	const char *lrank_name = NULL, *lworld_name = NULL;
	cohort_status st;

	*complete = false;
	if (src->usable != NULL && !src->usable(out))
		return (COHORT_OK);
	/* COHORT_RANK=-1 explicitly asks cohortd to assign the rank. */
	if ((st = env_int(src->rank, strcmp(src->name, "cohort") == 0 ? -1 : 0,
	         ENV_INT_MAX - 1, &rank, &has_rank))
	        != COHORT_OK
	    || (st = env_int(src->world, 1, ENV_INT_MAX, &world, &has_world))
	        != COHORT_OK
	    || (st = env_int2(src->local_rank, 0, ENV_INT_MAX - 1, &lrank,
	            &has_lrank, &lrank_name))
	        != COHORT_OK
	    || (st = env_int2(src->local_world, 1, ENV_INT_MAX, &lworld,
	            &has_lworld, &lworld_name))
	        != COHORT_OK
	    || (st = env_int(
	            src->node_rank, 0, ENV_INT_MAX - 1, &node, &has_node))
	        != COHORT_OK)
		return (st);
	if (!has_rank || !has_world) {
		if (has_rank || has_world)
			cohort__debug("environment: %s is incomplete (%s %s, "
			              "%s %s); skipped",
			    src->name, src->rank, has_rank ? "set" : "unset",
			    src->world, has_world ? "set" : "unset");
		return (COHORT_OK);
	}
	if (rank >= world)
		return (cohort__err(COHORT_EINVAL, "%s=%d is not below %s=%d",
		    src->rank, rank, src->world, world));
	if (has_lrank && has_lworld && lrank >= lworld)
		return (cohort__err(COHORT_EINVAL, "%s=%d is not below %s=%d",
		    lrank_name, lrank, lworld_name, lworld));
	if (src->one_per_node) {
		lrank = 0;
		lworld = 1;
		node = rank;
		has_lrank = has_lworld = has_node = true;
		lrank_name = "PET_NPROC_PER_NODE";
	}
	cohort__strlcpy(out->source, src->name, sizeof(out->source));
	out->rank = rank;
	out->world_size = world;
	cohort__strlcpy(out->rank_from, src->rank, sizeof(out->rank_from));
	cohort__strlcpy(
	    out->world_size_from, src->world, sizeof(out->world_size_from));
	if (has_lrank) {
		out->local_rank = lrank;
		cohort__strlcpy(out->local_rank_from, lrank_name,
		    sizeof(out->local_rank_from));
	}
	if (has_lworld)
		out->local_world_size = lworld;
	if (has_node)
		out->node_rank = node;
	*complete = true;
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* The coordinator                                                          */
/* ------------------------------------------------------------------------ */

/* tcp://HOST:PORT (IPv6 literals bracketed) into out->coordinator. */
static cohort_status
env_tcp_url(cohort_env *out, const char *host, int port, const char *from)
{
	char buf[sizeof(out->coordinator) + 1];
	int n;

	if (strchr(host, ':') != NULL && host[0] != '[')
		n = snprintf(buf, sizeof(buf), "tcp://[%s]:%d", host, port);
	else
		n = snprintf(buf, sizeof(buf), "tcp://%s:%d", host, port);
	if (n < 0 || (size_t)n >= sizeof(out->coordinator))
		return (cohort__err(COHORT_EINVAL, "%s is too long", from));
	cohort__strlcpy(out->coordinator, buf, sizeof(out->coordinator));
	cohort__strlcpy(
	    out->coordinator_from, from, sizeof(out->coordinator_from));
	return (COHORT_OK);
}

int
cohort__slurm_port(const char *job_id)
{
	size_t n;
	int64_t v;

	if (job_id == NULL)
		return (12910); /* Lightning's default without a job id */
	n = strlen(job_id);
	if (!cohort__parse_i64(job_id, &v) || v < 0)
		return (-1);
	if (n > 4)
		job_id += n - 4;
	if (!cohort__parse_i64(job_id, &v))
		return (-1);
	return (15000 + (int)v);
}

cohort_status
cohort__slurm_first_host(const char *list, char *out, size_t len)
{
	const char *p = list;
	size_t n = 0;

	if (list == NULL)
		return (cohort__err(COHORT_EINVAL, "no host list"));
	while (*p == ' ' || *p == '\t' || *p == '\n')
		p++;
	/* The first item ends at a comma or blank outside brackets; in each
	 * bracket "[a-b,c]" the first number stands for the range. */
	while (
	    *p != '\0' && *p != ',' && *p != ' ' && *p != '\t' && *p != '\n') {
		if (*p == ']')
			return (cohort__err(COHORT_EINVAL,
			    "host list '%s': unbalanced ']'", list));
		if (*p != '[') {
			if (n + 1 >= len)
				goto out_long;
			out[n++] = *p++;
			continue;
		}
		p++;
		if (*p < '0' || *p > '9')
			return (cohort__err(COHORT_EINVAL,
			    "host list '%s': a range must start with a "
			    "number",
			    list));
		while (*p >= '0' && *p <= '9') {
			if (n + 1 >= len)
				goto out_long;
			out[n++] = *p++;
		}
		while (*p != '\0' && *p != ']') {
			if (!((*p >= '0' && *p <= '9') || *p == '-'
			        || *p == ','))
				return (cohort__err(COHORT_EINVAL,
				    "host list '%s': '%c' in a range", list,
				    *p));
			p++;
		}
		if (*p != ']')
			return (cohort__err(COHORT_EINVAL,
			    "host list '%s': unclosed '['", list));
		p++;
	}
	if (n == 0)
		return (cohort__err(
		    COHORT_EINVAL, "host list '%s' names no host", list));
	out[n] = '\0';
	return (COHORT_OK);

out_long:
	return (cohort__err(COHORT_EINVAL,
	    "host list '%s': the first host is longer than %zu bytes", list,
	    len - 1));
}

/* The coordinator of a SLURM job's tasks without one given: on the first
 * node of the job (where its batch script runs), at the port Lightning
 * gives torch's store; MASTER_ADDR / MASTER_PORT win over either. A list
 * or job id that cannot be used leaves it unset (with a note), never an
 * error: a program may name its coordinator itself. */
static cohort_status
env_coordinator_slurm(cohort_env *out)
{
	const char *list = env_str("SLURM_JOB_NODELIST");
	const char *addr = env_str("MASTER_ADDR");
	const char *jobid = env_str("SLURM_JOB_ID");
	char host[256];
	int32_t port;
	bool has_port;
	cohort_status st;

	if (list == NULL)
		list = env_str("SLURM_NODELIST");
	if ((st = env_int("MASTER_PORT", 1, 65535, &port, &has_port))
	    != COHORT_OK)
		return (st);
	if (!has_port && (port = cohort__slurm_port(jobid)) < 0) {
		env_note(out,
		    "SLURM_JOB_ID=%s is not a number: no coordinator port "
		    "derived from it",
		    jobid);
		return (COHORT_OK);
	}
	if (addr != NULL)
		return (env_tcp_url(out, addr, port,
		    has_port ? "MASTER_ADDR:MASTER_PORT"
		             : "MASTER_ADDR:SLURM_JOB_ID"));
	if (list == NULL)
		return (COHORT_OK);
	if (cohort__slurm_first_host(list, host, sizeof(host)) != COHORT_OK) {
		env_note(out, "SLURM_JOB_NODELIST: %s", cohort_last_error());
		cohort__err_clear();
		return (COHORT_OK);
	}
	return (env_tcp_url(out, host, port, "SLURM_JOB_NODELIST"));
}

static cohort_status
env_coordinator(cohort_env *out)
{
	const char *url = env_str("COHORT_COORDINATOR");
	const char *addr = env_str("MASTER_ADDR");
	const char *port = env_str("MASTER_PORT");
	int32_t p;
	bool has_port;
	cohort_status st;

	if (url != NULL) {
		if (strstr(url, "://") == NULL)
			return (cohort__err(COHORT_EINVAL,
			    "COHORT_COORDINATOR='%s' is not a URL like "
			    "tcp://host:port",
			    url));
		if ((st = env_copy(out->coordinator, sizeof(out->coordinator),
		         "COHORT_COORDINATOR", url))
		    != COHORT_OK)
			return (st);
		cohort__strlcpy(out->coordinator_from, "COHORT_COORDINATOR",
		    sizeof(out->coordinator_from));
		return (COHORT_OK);
	}
	if (addr != NULL && port != NULL) {
		if ((st = env_int("MASTER_PORT", 1, 65535, &p, &has_port))
		    != COHORT_OK)
			return (st);
		if ((st = env_tcp_url(out, addr, p, "MASTER_ADDR:MASTER_PORT"))
		    != COHORT_OK)
			return (cohort__err(st, "MASTER_ADDR is too long"));
		return (COHORT_OK);
	}
	if (strcmp(out->source, "slurm") == 0)
		return (env_coordinator_slurm(out));
	if (strcmp(out->source, "kubeflow") == 0
	    && env_str("PET_MASTER_ADDR") != NULL) {
		if ((st = env_int("PET_MASTER_PORT", 1, 65535, &p, &has_port))
		    != COHORT_OK)
			return (st);
		if (has_port)
			return (env_tcp_url(out, env_str("PET_MASTER_ADDR"), p,
			    "PET_MASTER_ADDR:PET_MASTER_PORT"));
	}
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* The job's identity                                                       */
/* ------------------------------------------------------------------------ */

/* prefix + value (+ "." + value2) into job, EINVAL naming the variable
 * when it does not fit (a cut name could meet another job's). */
static cohort_status
env_job_set(char *job, size_t len, char *from, size_t fromlen, const char *var,
    const char *prefix, const char *val, const char *val2)
{
	int n = snprintf(job, len, "%s%s%s%s", prefix, val,
	    val2 != NULL ? "." : "", val2 != NULL ? val2 : "");

	if (n < 0 || (size_t)n >= len)
		return (cohort__err(COHORT_EINVAL,
		    "%s is too long for a job name (%zu bytes at most)", var,
		    len - 1 - strlen(prefix)));
	cohort__strlcpy(from, var, fromlen);
	return (COHORT_OK);
}

/*
 * The launch this process belongs to, from the most specific launcher
 * first: all ranks of one launch see the same value, two launches never
 * do.
 *
 *  COHORT_JOB                 as given (Kubernetes manifests pass the Job's
 *                             name or uid through the downward API)
 *  TORCHELASTIC_RUN_ID        torchrun's --rdzv-id, unless "none" (the
 *                             default of a static rendezvous: no id)
 *  OMPI_MCA_ess_base_jobid    Open MPI 4's job id: "ompi-ID"
 *  PMIX_NAMESPACE, PMIX_ID    a PMIx namespace (Open MPI 5, srun
 *                             --mpi=pmix): "pmix-NAMESPACE"
 *  SLURM_JOB_ID (+ STEP_ID)   "slurm-JOB[.STEP]", not in an interactive
 *                             allocation (runs in one would share it)
 *  MASTER_ADDR:MASTER_PORT    with TORCHELASTIC_RUN_ID=none: the address
 *                             of torch's store, "torchrun-ADDR:PORT"
 *  PET_MASTER_ADDR            Kubeflow's rank-0 pod (named after the
 *                             TrainJob): "kubeflow-ADDR:PORT"
 *  "default"                  none of these (MPICH's Hydra sets no id)
 */
cohort_status
cohort__env_job(char *job, size_t len, char *from, size_t fromlen)
{
	const char *s, *step, *addr, *port;
	char ns[256];

	if ((s = env_str("COHORT_JOB")) != NULL)
		return (env_job_set(
		    job, len, from, fromlen, "COHORT_JOB", "", s, NULL));
	s = env_str("TORCHELASTIC_RUN_ID");
	if (s != NULL && strcmp(s, "none") != 0)
		return (env_job_set(job, len, from, fromlen,
		    "TORCHELASTIC_RUN_ID", "", s, NULL));
	if ((s = env_str("OMPI_MCA_ess_base_jobid")) != NULL)
		return (env_job_set(job, len, from, fromlen,
		    "OMPI_MCA_ess_base_jobid", "ompi-", s, NULL));
	if ((s = env_str("PMIX_NAMESPACE")) != NULL)
		return (env_job_set(job, len, from, fromlen, "PMIX_NAMESPACE",
		    "pmix-", s, NULL));
	if ((s = env_str("PMIX_ID")) != NULL && strrchr(s, '.') != NULL
	    && strrchr(s, '.') != s) {
		/* "NAMESPACE.RANK" */
		snprintf(
		    ns, sizeof(ns), "%.*s", (int)(strrchr(s, '.') - s), s);
		return (env_job_set(
		    job, len, from, fromlen, "PMIX_ID", "pmix-", ns, NULL));
	}
	if ((s = env_str("SLURM_JOB_ID")) != NULL
	    && !env_slurm_interactive()) {
		if ((step = env_str("SLURM_STEP_ID")) == NULL)
			step = env_str("SLURM_STEPID");
		return (env_job_set(job, len, from, fromlen,
		    step != NULL ? "SLURM_JOB_ID.SLURM_STEP_ID"
		                 : "SLURM_JOB_ID",
		    "slurm-", s, step));
	}
	addr = env_str("MASTER_ADDR");
	port = env_str("MASTER_PORT");
	if ((s = env_str("TORCHELASTIC_RUN_ID")) != NULL && addr != NULL
	    && port != NULL) {
		snprintf(ns, sizeof(ns), "%s:%s", addr, port);
		return (env_job_set(job, len, from, fromlen,
		    "MASTER_ADDR:MASTER_PORT", "torchrun-", ns, NULL));
	}
	if ((addr = env_str("PET_MASTER_ADDR")) != NULL) {
		port = env_str("PET_MASTER_PORT");
		snprintf(ns, sizeof(ns), "%s:%s", addr, port ? port : "");
		return (env_job_set(job, len, from, fromlen, "PET_MASTER_ADDR",
		    "kubeflow-", ns, NULL));
	}
	cohort__strlcpy(job, "default", len);
	cohort__strlcpy(from, "default", fromlen);
	return (COHORT_OK);
}

/* ------------------------------------------------------------------------ */
/* Resolution                                                               */
/* ------------------------------------------------------------------------ */

cohort_status
cohort__data_addr(
    const char *coordinator, char *out, size_t len, char *from, size_t fromlen)
{
	const char *addr = cohort__knob_str(COHORT__KNOB_DATA_ADDR);
	const char *iface = cohort__knob_str(COHORT__KNOB_DATA_IFACE);
	unsigned char bin[16];
	cohort_status st;

	if (addr != NULL) {
		if (inet_pton(AF_INET, addr, bin) != 1
		    && inet_pton(AF_INET6, addr, bin) != 1)
			return (cohort__err(COHORT_EINVAL,
			    "COHORT_DATA_ADDR='%s' is not a numeric IPv4 or "
			    "IPv6 address",
			    addr));
		if (strlen(addr) >= len)
			return (cohort__err(
			    COHORT_EINVAL, "COHORT_DATA_ADDR is too long"));
		cohort__strlcpy(out, addr, len);
		cohort__strlcpy(from, "COHORT_DATA_ADDR", fromlen);
		return (COHORT_OK);
	}
	if (iface != NULL) {
		if ((st = cohort__iface_addr(iface, out, len)) != COHORT_OK)
			return (st);
		snprintf(from, fromlen, "COHORT_DATA_IFACE=%s", iface);
		return (COHORT_OK);
	}
	if (coordinator != NULL && coordinator[0] != '\0'
	    && cohort__route_addr(coordinator, out, len) == COHORT_OK) {
		cohort__strlcpy(from, "route to the coordinator", fromlen);
		return (COHORT_OK);
	}
	cohort__err_clear();
	cohort__strlcpy(out, "127.0.0.1", len);
	cohort__strlcpy(from, "default", fromlen);
	return (COHORT_OK);
}

static cohort_status
env_token(cohort_env *out)
{
	const char *s = env_str("COHORT_TOKEN");
	const char *file = cohort__knob_str(COHORT__KNOB_TOKEN_FILE);
	char buf[COHORT__TOKEN_MAX + 1];
	cohort_status st;

	if (s != NULL) {
		if ((st = env_copy(
		         out->token, sizeof(out->token), "COHORT_TOKEN", s))
		    != COHORT_OK)
			return (st);
		cohort__strlcpy(
		    out->token_from, "COHORT_TOKEN", sizeof(out->token_from));
		return (COHORT_OK);
	}
	if (file == NULL)
		return (COHORT_OK);
	if ((st = cohort__secret_read(
	         "COHORT_TOKEN_FILE", file, buf, sizeof(buf)))
	    != COHORT_OK)
		return (st);
	st = env_copy(
	    out->token, sizeof(out->token), "COHORT_TOKEN_FILE", buf);
	memset(buf, 0, sizeof(buf));
	if (st != COHORT_OK)
		return (st);
	cohort__strlcpy(
	    out->token_from, "COHORT_TOKEN_FILE", sizeof(out->token_from));
	return (COHORT_OK);
}

static cohort_status
env_resolve(cohort_env *out)
{
	bool complete = false, present;
	int32_t v;
	cohort_status st;

	for (size_t i = 0; i < ENV_NSOURCES && !complete; i++)
		if ((st = env_try_source(&env_sources[i], out, &complete))
		    != COHORT_OK)
			return (st);
	if (!complete) {
		if ((st = env_int(
		         "COHORT_WORLD_SIZE", 1, ENV_INT_MAX, &v, &present))
		    != COHORT_OK)
			return (st);
		if (present) {
			out->world_size = v;
			cohort__strlcpy(out->world_size_from,
			    "COHORT_WORLD_SIZE", sizeof(out->world_size_from));
		}
	}
	if ((st = env_coordinator(out)) != COHORT_OK)
		return (st);
	if ((st = cohort__env_job(out->job, sizeof(out->job), out->job_from,
	         sizeof(out->job_from)))
	    != COHORT_OK)
		return (st);
	if (strcmp(out->job_from, "default") == 0 && out->world_size > 1
	    && strcmp(out->source, "none") != 0)
		env_note(out,
		    "no job id from the launcher (%s): set COHORT_JOB, or "
		    "every such launch on one cohortd is job 'default'",
		    out->source);
	if ((st = env_token(out)) != COHORT_OK)
		return (st);
	if ((st = env_int("COHORT_RESTART_COUNT", 0, INT32_MAX, &v, &present))
	    != COHORT_OK)
		return (st);
	if (present) {
		cohort__strlcpy(out->restart_count_from,
		    "COHORT_RESTART_COUNT", sizeof(out->restart_count_from));
	} else {
		if ((st = env_int("TORCHELASTIC_RESTART_COUNT", 0, INT32_MAX,
		         &v, &present))
		    != COHORT_OK)
			return (st);
		if (present)
			cohort__strlcpy(out->restart_count_from,
			    "TORCHELASTIC_RESTART_COUNT",
			    sizeof(out->restart_count_from));
	}
	if (present)
		out->restart_count = v;
	return (cohort__data_addr(out->coordinator, out->data_addr,
	    sizeof(out->data_addr), out->data_addr_from,
	    sizeof(out->data_addr_from)));
}

cohort_status
cohort_env_resolve(cohort_env *out)
{
	cohort_status st;

	if (out == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL output"));
	memset(out, 0, sizeof(*out));
	out->rank = -1;
	out->local_rank = -1;
	out->node_rank = -1;
	cohort__strlcpy(out->source, "none", sizeof(out->source));
	cohort__strlcpy(out->job, "default", sizeof(out->job));
	cohort__strlcpy(out->job_from, "default", sizeof(out->job_from));
	cohort__strlcpy(
	    out->coordinator_from, "unset", sizeof(out->coordinator_from));
	cohort__strlcpy(out->rank_from, "unset", sizeof(out->rank_from));
	cohort__strlcpy(
	    out->world_size_from, "unset", sizeof(out->world_size_from));
	cohort__strlcpy(
	    out->local_rank_from, "unset", sizeof(out->local_rank_from));
	cohort__strlcpy(out->token_from, "unset", sizeof(out->token_from));
	cohort__strlcpy(
	    out->restart_count_from, "unset", sizeof(out->restart_count_from));

	if ((st = env_resolve(out)) != COHORT_OK) {
		cohort__strlcpy(out->source, "invalid", sizeof(out->source));
		cohort__warn("environment: %s", cohort_last_error());
		return (st);
	}
	cohort__info("environment: source %s: rank %d (from %s), world size "
	             "%d (from %s), coordinator '%s' (from %s), job '%s' "
	             "(from %s)%s%s",
	    out->source, out->rank, out->rank_from, out->world_size,
	    out->world_size_from, out->coordinator, out->coordinator_from,
	    out->job, out->job_from, out->notes[0] != '\0' ? "; " : "",
	    out->notes);
	return (COHORT_OK);
}

/* Appends like snprintf at *off, counting what the full text needs. */
static void env_put(char *buf, size_t len, size_t *off, const char *fmt, ...)
    __attribute__((format(printf, 4, 5)));

static void
env_put(char *buf, size_t len, size_t *off, const char *fmt, ...)
{
	va_list ap;
	int n;

	va_start(ap, fmt);
	if (*off < len)
		n = vsnprintf(buf + *off, len - *off, fmt, ap);
	else
		n = vsnprintf(NULL, 0, fmt, ap);
	va_end(ap);
	if (n > 0)
		*off += (size_t)n;
}

static void
env_put_int(char *buf, size_t len, size_t *off, const char *key, int32_t v,
    bool known, const char *from)
{
	if (known)
		env_put(buf, len, off, "%-16s = %d", key, v);
	else
		env_put(buf, len, off, "%-16s = unknown", key);
	if (from != NULL)
		env_put(buf, len, off, " (from %s)", from);
	env_put(buf, len, off, "\n");
}

size_t
cohort_env_format(const cohort_env *env, char *buf, size_t len)
{
	size_t off = 0;

	if (buf != NULL && len > 0)
		buf[0] = '\0';
	else
		len = 0;
	if (env == NULL)
		return (0);
	env_put(buf, len, &off, "%-16s = %s\n", "source", env->source);
	if (strncmp(env->coordinator_from, "MASTER_ADDR", 11) == 0) {
		/* torch's store (torchrun's, Lightning's): torch's "cohort"
		 * backend meets a cohortd of its rank 0 through it, and
		 * libcohort's own API would dial it as a cohortd. */
		env_put(buf, len, &off,
		    "%-16s = %s (from %s: torch's store, not a cohortd)\n"
		    "%-16s = rank 0 starts a cohortd and hands its address "
		    "to the others through that store (job torch-<random>, "
		    "a fresh token); a program on libcohort's own API needs "
		    "COHORT_COORDINATOR here\n",
		    "coordinator", env->coordinator, env->coordinator_from,
		    "torch backend");
	} else {
		env_put(buf, len, &off, "%-16s = %s (from %s)\n",
		    "coordinator",
		    env->coordinator[0] != '\0' ? env->coordinator : "unset",
		    env->coordinator_from);
	}
	env_put(buf, len, &off, "%-16s = %s (from %s)\n", "job", env->job,
	    env->job_from);
	env_put(buf, len, &off, "%-16s = %s", "token",
	    env->token[0] != '\0' ? "<set>" : "<none>");
	if (env->token[0] != '\0' && env->token_from[0] != '\0')
		env_put(buf, len, &off, " (from %s)", env->token_from);
	env_put(buf, len, &off, "\n");
	env_put(buf, len, &off, "%-16s = %s (from %s)\n", "data_addr",
	    env->data_addr[0] != '\0' ? env->data_addr : "unset",
	    env->data_addr_from[0] != '\0' ? env->data_addr_from : "unset");
	env_put_int(
	    buf, len, &off, "rank", env->rank, env->rank >= 0, env->rank_from);
	env_put_int(buf, len, &off, "world_size", env->world_size,
	    env->world_size > 0, env->world_size_from);
	env_put_int(buf, len, &off, "local_rank", env->local_rank,
	    env->local_rank >= 0, env->local_rank_from);
	env_put_int(buf, len, &off, "local_world_size", env->local_world_size,
	    env->local_world_size > 0, NULL);
	env_put_int(buf, len, &off, "node_rank", env->node_rank,
	    env->node_rank >= 0, NULL);
	env_put_int(buf, len, &off, "restart_count", env->restart_count, true,
	    env->restart_count_from[0] != '\0' ? env->restart_count_from
	                                       : NULL);
	if (env->notes[0] != '\0')
		env_put(buf, len, &off, "%-16s = %s\n", "notes", env->notes);
	return (off);
}

/*
 * Timeouts and the backend from the environment, for programs started by a
 * launcher: COHORT_TIMEOUT_MS (operation timeout), COHORT_JOIN_TIMEOUT_MS
 * (rendezvous), COHORT_HEARTBEAT_MS, COHORT_DEAD_AFTER_MS, COHORT_BACKEND.
 * Unset ones keep opts' values. Malformed ones are COHORT_EINVAL.
 */
cohort_status
cohort__options_env_timeouts(cohort_options *opts)
{
	static const struct {
		enum cohort__knob knob;
		size_t off;
	} knobs[] = {
		{ COHORT__KNOB_TIMEOUT_MS,
		    offsetof(cohort_options, op_timeout) },
		{ COHORT__KNOB_JOIN_TIMEOUT_MS,
		    offsetof(cohort_options, join_timeout) },
		{ COHORT__KNOB_HEARTBEAT_MS,
		    offsetof(cohort_options, heartbeat_interval) },
		{ COHORT__KNOB_DEAD_AFTER_MS,
		    offsetof(cohort_options, dead_after) },
		{ COHORT__KNOB_RECONNECT_MS,
		    offsetof(cohort_options, reconnect_window) },
	};
	const char *b = cohort__knob_str(COHORT__KNOB_BACKEND);

	for (size_t i = 0; i < sizeof(knobs) / sizeof(knobs[0]); i++) {
		int64_t v;
		bool set;
		cohort_status st = cohort__knob_int(knobs[i].knob, &v, &set);
		if (st != COHORT_OK)
			return (st);
		if (set)
			*(cohort_duration *)((char *)opts + knobs[i].off)
			    = (cohort_duration)v;
	}
	if (b != NULL)
		opts->backend = b;
	return (COHORT_OK);
}

/* The options' defaults (cohort.h), and the reconnect window they
 * resolve to. */
void
cohort_options_init(cohort_options *opts)
{
	if (opts == NULL)
		return;
	memset(opts, 0, sizeof(*opts));
	opts->coordinator = NULL;
	opts->job = "default";
	opts->token = "";
	opts->rank = -1;
	opts->world_size = 0;
	opts->local_rank = -1;
	opts->op_timeout = COHORT__DEFAULT_OP_TIMEOUT_MS;
	opts->join_timeout = COHORT_WAIT_DEFAULT;
	opts->heartbeat_interval
	    = cohort__scaled(COHORT__DEFAULT_HEARTBEAT_MS);
	opts->dead_after = cohort__scaled(COHORT__DEFAULT_DEAD_AFTER_MS);
	opts->backend = "auto";
	opts->data_addr = NULL;
	opts->reconnect_window = COHORT_WAIT_DEFAULT;
}

cohort_duration
cohort__reconnect_window(const cohort_options *opts)
{
	int64_t w;

	if (opts->reconnect_window != COHORT_WAIT_DEFAULT)
		return (opts->reconnect_window);
	w = cohort__knob_int_or(COHORT__KNOB_RECONNECT_MS, -2);
	if (w == -2)
		w = cohort__scaled(COHORT__DEFAULT_RECONNECT_MS);
	if (w < 0 || (opts->op_timeout >= 0 && w > opts->op_timeout))
		w = opts->op_timeout;
	return ((cohort_duration)w);
}

cohort_status
cohort_options_from_env(cohort_options *opts, const cohort_env *env)
{
	cohort_status st;

	if (opts == NULL || env == NULL)
		return (cohort__err(COHORT_EINVAL, "NULL argument"));
	if (env->coordinator[0] == '\0')
		return (cohort__err(COHORT_EINVAL,
		    "no coordinator in the environment (set "
		    "COHORT_COORDINATOR, or MASTER_ADDR and MASTER_PORT)"));
	if (env->world_size <= 0)
		return (cohort__err(COHORT_EINVAL,
		    "no world size in the environment (set "
		    "COHORT_WORLD_SIZE, or a launcher's variables)"));
	cohort_options_init(opts);
	opts->coordinator = env->coordinator;
	opts->job = env->job;
	opts->token = env->token;
	opts->rank = env->rank;
	opts->world_size = env->world_size;
	opts->local_rank = env->local_rank;
	if ((st = cohort__options_env_timeouts(opts)) != COHORT_OK)
		return (st);
	return (cohort__options_env_elastic(opts));
}

/*
 * The elastic range (docs/elastic.md): COHORT_MIN_WORLD > 0 makes the job
 * elastic; the world size asked for is then COHORT_MAX_WORLD when set (a
 * launcher that knows the range but not how many ranks will come, like
 * `cohort run --nnodes MIN:MAX`), else the world size already in opts.
 */
cohort_status
cohort__options_env_elastic(cohort_options *opts)
{
	int64_t min = 0, max = 0;
	bool min_set, max_set;
	cohort_status st;

	if ((st = cohort__knob_int(COHORT__KNOB_MIN_WORLD, &min, &min_set))
	        != COHORT_OK
	    || (st = cohort__knob_int(COHORT__KNOB_MAX_WORLD, &max, &max_set))
	        != COHORT_OK)
		return (st);
	if (!min_set || min == 0) {
		if (max_set && max > 0)
			cohort__warn(
			    "COHORT_MAX_WORLD=%lld without "
			    "COHORT_MIN_WORLD: the job is not elastic",
			    (long long)max);
		return (COHORT_OK);
	}
	if (max_set && max > 0)
		opts->world_size = (int32_t)max;
	if (opts->world_size < min)
		return (cohort__err(COHORT_EINVAL,
		    "COHORT_MIN_WORLD=%lld is larger than the world size %d "
		    "(COHORT_MAX_WORLD or COHORT_WORLD_SIZE)",
		    (long long)min, opts->world_size));
	opts->min_world = (int32_t)min;
	return (COHORT_OK);
}

const char *
cohort_env_knob(const char *name)
{
	for (int k = 0; name != NULL && k < COHORT__KNOB_COUNT; k++)
		if (strcmp(cohort__knob_info((enum cohort__knob)k)->name, name)
		    == 0)
			return (cohort__knob_str((enum cohort__knob)k));
	return (NULL);
}

int
cohort_env_vars(const cohort_env *env, char *buf, size_t len,
    const char **vars, size_t nvars)
{
	size_t off = 0, n = 0;
	bool full = false;

#define ENV_PUT(...)                                                          \
	do {                                                                  \
		int w_;                                                       \
		if (full || n + 1 >= nvars || off >= len) {                   \
			full = true;                                          \
			break;                                                \
		}                                                             \
		w_ = snprintf(buf + off, len - off, __VA_ARGS__);             \
		if (w_ < 0 || (size_t)w_ >= len - off) {                      \
			full = true;                                          \
			break;                                                \
		}                                                             \
		vars[n++] = buf + off;                                        \
		off += (size_t)w_ + 1;                                        \
	} while (0)

	if (env == NULL || buf == NULL || vars == NULL || nvars == 0)
		return (-1);
	ENV_PUT("COHORT_COORDINATOR=%s", env->coordinator);
	ENV_PUT("COHORT_JOB=%s", env->job);
	ENV_PUT("COHORT_TOKEN=%s", env->token);
	if (env->rank >= 0) {
		ENV_PUT("COHORT_RANK=%d", (int)env->rank);
		ENV_PUT("RANK=%d", (int)env->rank);
	}
	if (env->world_size > 0) {
		ENV_PUT("COHORT_WORLD_SIZE=%d", (int)env->world_size);
		ENV_PUT("WORLD_SIZE=%d", (int)env->world_size);
	}
	if (env->local_rank >= 0) {
		ENV_PUT("COHORT_LOCAL_RANK=%d", (int)env->local_rank);
		ENV_PUT("LOCAL_RANK=%d", (int)env->local_rank);
	}
	if (env->local_world_size > 0) {
		ENV_PUT(
		    "COHORT_LOCAL_WORLD_SIZE=%d", (int)env->local_world_size);
		ENV_PUT("LOCAL_WORLD_SIZE=%d", (int)env->local_world_size);
	}
	if (env->node_rank >= 0) {
		ENV_PUT("COHORT_NODE_RANK=%d", (int)env->node_rank);
		ENV_PUT("GROUP_RANK=%d", (int)env->node_rank);
	}
	ENV_PUT("COHORT_RESTART_COUNT=%d", (int)env->restart_count);
	ENV_PUT("TORCHELASTIC_RESTART_COUNT=%d", (int)env->restart_count);
#undef ENV_PUT
	if (full) {
		vars[0] = NULL;
		return (-1);
	}
	vars[n] = NULL;
	return ((int)n);
}
