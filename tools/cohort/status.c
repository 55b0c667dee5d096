/*
 * status.c - `cohort status`: asks cohortd (StatusQuery) for its jobs and
 * prints, per job, its members (state, last seen, what each is doing:
 * "in allreduce #812 on group '' for 63.2s", from their heartbeats) and
 * the collectives still waiting, with the ranks that have not arrived;
 * stalled ones (waiting past cohortd's --stall-threshold, data-plane ones
 * inferred from heartbeats) are marked STALLED with cohortd's detail.
 *
 *   cohort status [--coordinator URL] [--job J] [--token-file FILE]
 *                 [--timeout MS] [--watch MS [--count N]]
 *   cohort top    (= cohort status --watch 1000)
 *
 * Per rank it also shows what the rank reported on its heartbeats
 * (RankMetrics, docs/observability.md): collectives and the time inside
 * them, bytes, the time spent waiting for peers (blocked on a late rank: high
 * on the ranks that wait for a straggler, low on the straggler) and its share
 * of the rank's time since it joined, and, with --watch, rates over the last
 * interval (waiting: seconds per second). Per job, its rhythm (time per
 * operation) and when an operation is called stalled. --watch redraws the
 * screen every MS until SIGINT or N redraws.
 *
 * The coordinator defaults to the resolved environment (COHORT_COORDINATOR,
 * MASTER_ADDR/MASTER_PORT); job and token to COHORT_JOB / COHORT_TOKEN
 * (or COHORT_TOKEN_FILE). Without a job, all jobs are listed (cohortd
 * allows that with its admin secret, here from COHORT_ADMIN_TOKEN_FILE,
 * or when it has none).
 */
#include <inttypes.h>
#include <signal.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cohort_impl.h"
#include "conn.h"

int cohort__cmd_status(int argc, char **argv);
int cohort__cmd_top(int argc, char **argv);

struct status_cfg {
	struct cohort__cli_conn conn;
	int watch_ms; /* 0: once */
	int count; /* --watch: redraws, 0 = until SIGINT */
};

/* Previous totals of a rank, for rates in --watch. */
#define STATUS_PREV 4096
struct status_prev {
	char job[128];
	int32_t rank;
	uint64_t colls, bytes, wait_ns;
	int64_t at_ms;
};
static struct status_prev status_prev[STATUS_PREV];
static size_t status_nprev;
static volatile sig_atomic_t status_stop;

static void
status_on_signal(int sig)
{
	(void)sig;
	status_stop = 1;
}

static void
status_usage(FILE *f)
{
	fprintf(f,
	    "usage: cohort status [--coordinator URL] [--job J]\n"
	    "                     [--token-file FILE] [--timeout MS]\n"
	    "                     [--watch MS [--count N]]\n"
	    "       cohort top    (status --watch 1000)\n\n"
	    "--watch redraws every MS milliseconds (a live view, with\n"
	    "per-rank rates) until interrupted or N redraws.\n"
	    "Shows cohortd's jobs: members (state, last seen, current\n"
	    "operation) and pending collectives with the ranks missing.\n"
	    "Defaults come from COHORT_COORDINATOR (or MASTER_ADDR/PORT),\n"
	    "COHORT_JOB and COHORT_TOKEN (or COHORT_TOKEN_FILE); all jobs\n"
	    "need cohortd's admin secret (COHORT_ADMIN_TOKEN_FILE).\n");
}

static void
status_ranks(const char *label, const int32_t *r, size_t n)
{
	printf("%s ", label);
	if (n == 0)
		printf("-");
	for (size_t i = 0; i < n; i++)
		printf("%s%d", i > 0 ? "," : "", r[i]);
}

/* "in allreduce #12 on group 'g' for 3.2s", "after barrier #5", "-". */
static void
status_doing(const Cohort__MemberStatus *m, char *buf, size_t len)
{
	size_t off = 0;

	buf[0] = '\0';
	if (m->last_op[0] == '\0') {
		cohort__appendf(buf, len, &off, "-");
		return;
	}
	cohort__appendf(
	    buf, len, &off, "%s %s", m->in_op ? "in" : "after", m->last_op);
	if (m->last_op_seq > 0)
		cohort__appendf(buf, len, &off, " #%" PRIu64, m->last_op_seq);
	if (m->last_group[0] != '\0')
		cohort__appendf(
		    buf, len, &off, " on group '%s'", m->last_group);
	if (m->in_op)
		cohort__appendf(buf, len, &off, " for %.1fs",
		    (double)m->in_op_ms / 1000.0);
}

/* A rank's reported metrics: totals, its time waiting for peers and that
 * time's share of the rank's time since it joined, and (--watch) rates
 * since the previous redraw. */
static void
status_print_rates(const char *job, const Cohort__MemberStatus *m)
{
	struct status_prev *p = NULL;
	int64_t now = (int64_t)cohort__now_ms();

	printf("        %" PRIu64 " collectives (%.2f s), %.1f MB; "
	       "waiting for peers %.2f s",
	    m->collectives, (double)m->collective_ns / 1e9,
	    (double)m->collective_bytes / 1e6, (double)m->wait_ns / 1e9);
	/* Of the rank's own time: a straggler's few milliseconds of waiting
	 * are most of its short collectives, but little of its time. */
	if (m->elapsed_ns > 0)
		printf(", %.0f%% of its %.1f s",
		    100.0 * (double)m->wait_ns / (double)m->elapsed_ns,
		    (double)m->elapsed_ns / 1e9);
	for (size_t i = 0; i < status_nprev; i++)
		if (status_prev[i].rank == m->rank
		    && strcmp(status_prev[i].job, job) == 0)
			p = &status_prev[i];
	if (p != NULL && now > p->at_ms && m->collectives >= p->colls) {
		double s = (double)(now - p->at_ms) / 1000.0;
		printf("; now %.1f/s, %.2f MB/s, waiting %.2f s/s",
		    (double)(m->collectives - p->colls) / s,
		    (double)(m->collective_bytes - p->bytes) / 1e6 / s,
		    m->wait_ns >= p->wait_ns
		        ? (double)(m->wait_ns - p->wait_ns) / 1e9 / s
		        : 0.0);
	}
	printf("\n");
	if (p == NULL && status_nprev < STATUS_PREV) {
		p = &status_prev[status_nprev++];
		cohort__strlcpy(p->job, job, sizeof(p->job));
		p->rank = m->rank;
	}
	if (p != NULL) {
		p->colls = m->collectives;
		p->bytes = m->collective_bytes;
		p->wait_ns = m->wait_ns;
		p->at_ms = now;
	}
}

static void
status_print_job(const Cohort__JobStatus *js)
{
	char doing[512];

	printf("job %s  generation %" PRIu64 "  world %u  state %s  "
	       "kv %" PRIu64 " keys / %" PRIu64 " bytes\n",
	    js->job, js->generation, js->world_size, js->state, js->kv_keys,
	    js->kv_bytes);
	if (js->max_world > 0)
		printf(
		    "  elastic: %u..%u ranks, %u joiner%s waiting for a step "
		    "boundary\n",
		    js->min_world, js->max_world, js->joiners_waiting,
		    js->joiners_waiting == 1 ? "" : "s");
	if (js->failed_rank >= 0)
		printf("  failed: rank %d: %s\n", js->failed_rank,
		    js->failed_text[0] != '\0' ? js->failed_text : "-");
	if (js->op_interval_us > 0)
		printf("  rhythm %.1f ms per operation; an operation waiting "
		       "over %.1f s is STALLED\n",
		    (double)js->op_interval_us / 1000.0,
		    (double)js->stall_after_ms / 1000.0);
	if (js->n_members > 0)
		printf("  %-5s %-20s %-8s %-9s %-10s %s\n", "rank", "host",
		    "pid", "state", "last seen", "doing");
	for (size_t i = 0; i < js->n_members; i++) {
		const Cohort__MemberStatus *m = js->members[i];
		status_doing(m, doing, sizeof(doing));
		printf("  %-5d %-20s %-8u %-9s %8.1fs  %s", m->rank, m->host,
		    m->pid, m->state, (double)m->last_seen_ms_ago / 1000.0,
		    doing);
		if (m->failure[0] != '\0')
			printf("  failure: %s", m->failure);
		printf("\n");
		if (m->collectives > 0)
			status_print_rates(js->job, m);
	}
	for (size_t i = 0; i < js->n_pending; i++) {
		const Cohort__PendingOp *p = js->pending[i];
		printf("  %s: group '%s' #%" PRIu64 " %s",
		    p->stalled ? "STALLED" : "pending", p->group, p->op_seq,
		    p->kind);
		if (p->name[0] != '\0')
			printf(" '%s'", p->name);
		printf("%s  waiting %.1fs  ",
		    p->data_plane ? " (data plane)" : "",
		    (double)p->waiting_ms / 1000.0);
		status_ranks("arrived", p->arrived, p->n_arrived);
		printf("  ");
		status_ranks("missing", p->missing, p->n_missing);
		printf("\n");
		if (p->detail[0] != '\0')
			printf("    %s\n", p->detail);
	}
}

static const struct cohort__cli_opt status_opts[] = {
	COHORT__CLI_CONN_ROWS(struct status_cfg, conn),
	COHORT__CLI_NUM("watch", 0, COHORT__CLI_INT, 100, 3600000,
	    struct status_cfg, watch_ms),
	COHORT__CLI_NUM("count", 0, COHORT__CLI_INT, 1, INT32_MAX,
	    struct status_cfg, count),
	COHORT__CLI_END,
};

static const struct cohort__cli status_cli
    = { "cohort status", '+', status_opts, status_usage };

int
cohort__cmd_status(int argc, char **argv)
{
	struct status_cfg cfg = { .watch_ms = 0 };
	long shown = 0;
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__StatusQuery q = COHORT__STATUS_QUERY__INIT;
	struct cohort__coord *co;
	struct cohort__coord_call call;
	const Cohort__StatusReply *sr;
	cohort_status st;
	int rc;

	cohort__cli_conn_init(&cfg.conn);
	if ((rc = cohort__cli_next(&status_cli, &cfg, argc, argv)) != -1
	    || (rc = cohort__cli_no_operands(&status_cli, argc, argv)) != -1)
		return (rc == 'h' ? 0 : 2);
	if ((rc = cohort__cli_conn_open(
	         &status_cli, &cfg.conn, false, true, &co))
	    != 0)
		return (rc);
	q.job = (char *)(cfg.conn.job != NULL ? cfg.conn.job : "");
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	if (cfg.watch_ms > 0) {
		struct sigaction sa;

		memset(&sa, 0, sizeof(sa));
		sa.sa_handler = status_on_signal;
		sigaction(SIGINT, &sa, NULL);
		sigaction(SIGTERM, &sa, NULL);
	}
again:
	cohort__coord_call_init(&call, &req, cohort__now_ms());
	st = cohort__coord_call(co, &call);
	if (st != COHORT_OK) {
		fprintf(stderr, "cohort status: %s: %s\n",
		    cohort_status_name(st), cohort_last_error());
		rc = 1;
		goto out;
	}
	if (call.rep->body_case != COHORT__REPLY__BODY_STATUS_QUERY
	    || (sr = call.rep->status_query) == NULL) {
		fprintf(stderr, "cohort status: reply without status\n");
		rc = 1;
		goto out;
	}
	if (cfg.watch_ms > 0 && isatty(1))
		printf("\033[H\033[2J"); /* home, clear */
	printf("cohortd at %s: up %.1fs, %" PRIu64 " clients, %zu job%s\n",
	    cfg.conn.coordinator, (double)sr->uptime_ms / 1000.0, sr->clients,
	    sr->n_jobs, sr->n_jobs == 1 ? "" : "s");
	for (size_t i = 0; i < sr->n_jobs; i++)
		status_print_job(sr->jobs[i]);
	rc = 0;
	if (cfg.watch_ms > 0 && ++shown != cfg.count && !status_stop) {
		printf("(every %.1fs; ^C to stop)\n",
		    (double)cfg.watch_ms / 1000.0);
		fflush(stdout);
		cohort__coord_call_fini(&call);
		for (int t = 0; t < cfg.watch_ms && !status_stop; t += 50)
			usleep(50 * 1000);
		if (!status_stop)
			goto again;
		cohort__coord_close(co);
		return (0);
	}
out:
	cohort__coord_call_fini(&call);
	cohort__coord_close(co);
	return (rc);
}

/* `cohort top`: the live view. */
int
cohort__cmd_top(int argc, char **argv)
{
	char *args[64];
	char watch[] = "--watch", ms[] = "1000";
	int n = 0;

	args[n++] = argv[0];
	args[n++] = watch;
	args[n++] = ms;
	for (int i = 1; i < argc && n < 63; i++)
		args[n++] = argv[i];
	args[n] = NULL;
	return (cohort__cmd_status(n, args));
}
