/*
 * env.c - where a worker's rank, world size and coordinator come from.
 *
 * Sources in order (DESIGN.md section 3); the first *complete* one (rank
 * and world size both set) wins and is logged at info:
 *
 *   cohort           COHORT_RANK, COHORT_WORLD_SIZE (+ COHORT_LOCAL_RANK,
 *                    COHORT_LOCAL_WORLD_SIZE, COHORT_NODE_RANK)
 *   torchrun         RANK, WORLD_SIZE, LOCAL_RANK, LOCAL_WORLD_SIZE,
 *                    GROUP_RANK
 *   openmpi          OMPI_COMM_WORLD_RANK, _SIZE, _LOCAL_RANK, _LOCAL_SIZE
 *   slurm            SLURM_PROCID, SLURM_NTASKS, SLURM_LOCALID, SLURM_NODEID
 *   k8s-indexed-job  JOB_COMPLETION_INDEX with COHORT_WORLD_SIZE
 *
 * The coordinator is COHORT_COORDINATOR if set, else tcp://MASTER_ADDR:
 * MASTER_PORT; the job COHORT_JOB, else TORCHELASTIC_RUN_ID, else
 * "default"; the token COHORT_TOKEN. With no complete source, the world
 * size still comes from COHORT_WORLD_SIZE if set (cohortd then assigns
 * ranks). Variables of a source are validated only when that source is
 * looked at; a malformed one is COHORT_EINVAL. KUBERNETES_* is never read:
 * running on Kubernetes is not a mode.
 */
#include <stdarg.h>
#include <stdio.h>
#include <stddef.h>
#include <stdlib.h>
#include <string.h>

#include <arpa/inet.h>

#include "cohort_impl.h"
#include "netaddr.h"

struct env_source {
	const char *name;
	const char *rank;
	const char *world;
	const char *local_rank;
	const char *local_world;
	const char *node_rank;
};

static const struct env_source env_sources[] = {
	{ "cohort", "COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_LOCAL_RANK",
	    "COHORT_LOCAL_WORLD_SIZE", "COHORT_NODE_RANK" },
	{ "torchrun", "RANK", "WORLD_SIZE", "LOCAL_RANK", "LOCAL_WORLD_SIZE",
	    "GROUP_RANK" },
	{ "openmpi", "OMPI_COMM_WORLD_RANK", "OMPI_COMM_WORLD_SIZE",
	    "OMPI_COMM_WORLD_LOCAL_RANK", "OMPI_COMM_WORLD_LOCAL_SIZE", NULL },
	{ "slurm", "SLURM_PROCID", "SLURM_NTASKS", "SLURM_LOCALID", NULL,
	    "SLURM_NODEID" },
	{ "k8s-indexed-job", "JOB_COMPLETION_INDEX", "COHORT_WORLD_SIZE", NULL,
	    NULL, NULL },
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

/* Looks at one source: COHORT_OK and *complete when it has rank and
 * world size; fills *out's rank fields then. */
static cohort_status
env_try_source(const struct env_source *src, cohort_env *out, bool *complete)
{
	int32_t rank = -1, world = 0, lrank = -1, lworld = 0, node = -1;
	bool has_rank, has_world, has_lrank, has_lworld, has_node;
	cohort_status st;

	*complete = false;
	/* COHORT_RANK=-1 explicitly asks cohortd to assign the rank. */
	if ((st = env_int(src->rank, strcmp(src->name, "cohort") == 0 ? -1 : 0,
	         ENV_INT_MAX - 1, &rank, &has_rank))
	        != COHORT_OK
	    || (st = env_int(src->world, 1, ENV_INT_MAX, &world, &has_world))
	        != COHORT_OK
	    || (st = env_int(
	            src->local_rank, 0, ENV_INT_MAX - 1, &lrank, &has_lrank))
	        != COHORT_OK
	    || (st = env_int(
	            src->local_world, 1, ENV_INT_MAX, &lworld, &has_lworld))
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
		    src->local_rank, lrank, src->local_world, lworld));
	cohort__strlcpy(out->source, src->name, sizeof(out->source));
	out->rank = rank;
	out->world_size = world;
	cohort__strlcpy(out->rank_from, src->rank, sizeof(out->rank_from));
	cohort__strlcpy(
	    out->world_size_from, src->world, sizeof(out->world_size_from));
	if (has_lrank) {
		out->local_rank = lrank;
		cohort__strlcpy(out->local_rank_from, src->local_rank,
		    sizeof(out->local_rank_from));
	}
	if (has_lworld)
		out->local_world_size = lworld;
	if (has_node)
		out->node_rank = node;
	*complete = true;
	return (COHORT_OK);
}

static cohort_status
env_coordinator(cohort_env *out)
{
	const char *url = env_str("COHORT_COORDINATOR");
	const char *addr = env_str("MASTER_ADDR");
	const char *port = env_str("MASTER_PORT");
	char buf[sizeof(out->coordinator) + 1];
	int32_t p;
	bool has_port;
	cohort_status st;
	int n;

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
	if (addr == NULL || port == NULL)
		return (COHORT_OK);
	if ((st = env_int("MASTER_PORT", 1, 65535, &p, &has_port))
	    != COHORT_OK)
		return (st);
	if (strchr(addr, ':') != NULL && addr[0] != '[')
		n = snprintf(buf, sizeof(buf), "tcp://[%s]:%d", addr, p);
	else
		n = snprintf(buf, sizeof(buf), "tcp://%s:%d", addr, p);
	if (n < 0 || (size_t)n >= sizeof(out->coordinator))
		return (cohort__err(COHORT_EINVAL, "MASTER_ADDR is too long"));
	cohort__strlcpy(out->coordinator, buf, sizeof(out->coordinator));
	cohort__strlcpy(out->coordinator_from, "MASTER_ADDR:MASTER_PORT",
	    sizeof(out->coordinator_from));
	return (COHORT_OK);
}

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
env_resolve(cohort_env *out)
{
	const char *s;
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

	if ((s = env_str("COHORT_JOB")) != NULL) {
		if ((st = env_copy(
		         out->job, sizeof(out->job), "COHORT_JOB", s))
		    != COHORT_OK)
			return (st);
		cohort__strlcpy(
		    out->job_from, "COHORT_JOB", sizeof(out->job_from));
	} else if ((s = env_str("TORCHELASTIC_RUN_ID")) != NULL) {
		if ((st = env_copy(
		         out->job, sizeof(out->job), "TORCHELASTIC_RUN_ID", s))
		    != COHORT_OK)
			return (st);
		cohort__strlcpy(out->job_from, "TORCHELASTIC_RUN_ID",
		    sizeof(out->job_from));
	}
	if ((s = env_str("COHORT_TOKEN")) != NULL
	    && (st = env_copy(
	            out->token, sizeof(out->token), "COHORT_TOKEN", s))
	        != COHORT_OK)
		return (st);
	if ((st = env_int("COHORT_RESTART_COUNT", 0, INT32_MAX, &v, &present))
	    != COHORT_OK)
		return (st);
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

	if ((st = env_resolve(out)) != COHORT_OK) {
		cohort__strlcpy(out->source, "invalid", sizeof(out->source));
		cohort__warn("environment: %s", cohort_last_error());
		return (st);
	}
	cohort__info("environment: source %s: rank %d (from %s), world size "
	             "%d (from %s), coordinator '%s' (from %s), job '%s' "
	             "(from %s)",
	    out->source, out->rank, out->rank_from, out->world_size,
	    out->world_size_from, out->coordinator, out->coordinator_from,
	    out->job, out->job_from);
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
	env_put(buf, len, &off, "%-16s = %s (from %s)\n", "coordinator",
	    env->coordinator[0] != '\0' ? env->coordinator : "unset",
	    env->coordinator_from);
	env_put(buf, len, &off, "%-16s = %s (from %s)\n", "job", env->job,
	    env->job_from);
	env_put(buf, len, &off, "%-16s = %s\n", "token",
	    env->token[0] != '\0' ? "<set>" : "<none>");
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
	env_put_int(
	    buf, len, &off, "restart_count", env->restart_count, true, NULL);
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
