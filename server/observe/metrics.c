/*
 * metrics.c - the /metrics text (Prometheus text format): the core's
 * counters, the journal's, the jobs' totals (and, with --metrics-per-job,
 * series labelled with job names), then the build info and per-rank
 * series (ranks.c).
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "journal/log.h"
#include "state/job.h"
#include "state/kv.h"
#include "state/stall.h"
#include "metrics.h"
#include "ranks.h"

/* A Prometheus label value: backslash, quote and newline escaped. */
static void
metrics_label(char *out, size_t len, const char *s)
{
	size_t o = 0;

	for (; *s != '\0' && o + 3 < len; s++) {
		if (*s == '\\' || *s == '"') {
			out[o++] = '\\';
			out[o++] = *s;
		} else if (*s == '\n') {
			out[o++] = '\\';
			out[o++] = 'n';
		} else {
			out[o++] = *s;
		}
	}
	out[o] = '\0';
}

/* --metrics-per-job: series labelled with job names (which tell who runs
 * what on a shared coordinator, so they are off by default). */
static void
metrics_jobs(struct srv_core *core, char *buf, size_t cap, size_t *off)
{
	static const char *const names[] = { "job_members_running",
		"job_kv_keys", "job_kv_bytes", "job_failed" };
	static const char *const help[] = { "Running members of the job.",
		"Keys of the job.", "Bytes of keys and values of the job.",
		"1 if the job's generation failed." };

	for (int k = 0; k < 4; k++) {
		struct srv_hnode *n;
		size_t i;
		cohort__appendf(buf, cap, off,
		    "# HELP cohort_%s %s\n# TYPE cohort_%s gauge\n", names[k],
		    help[k], names[k]);
		for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
		     n = srv_map_next(&core->jobs, &i, n)) {
			struct srv_job *job
			    = SRV_CONTAINER(n, struct srv_job, hn);
			char lab[2 * SRV_MAX_NAME + 8];
			uint64_t v = 0;
			metrics_label(lab, sizeof(lab), job->name);
			if (k == 0) {
				for (uint32_t r = 0;
				     job->members != NULL && r < job->world;
				     r++)
					v += job->members[r].state
					    == SRV_MEMBER_RUNNING;
			} else if (k == 1) {
				v = srv_kv_count(job->kv);
			} else if (k == 2) {
				v = srv_kv_bytes(job->kv);
			} else {
				v = job->state == SRV_JOB_FAILED;
			}
			cohort__appendf(buf, cap, off,
			    "cohort_%s{job=\"%s\"} %" PRIu64 "\n", names[k],
			    lab, v);
		}
	}
}

/* One metric of /metrics: its HELP and TYPE lines and its value. */
struct metrics_row {
	const char *type;
	const char *name; /* after "cohort_" */
	const char *help;
	bool ms; /* v is milliseconds, shown as seconds */
	uint64_t v;
};

static void
metrics_put(
    char *buf, size_t cap, size_t *off, const struct metrics_row *m, size_t n)
{
	for (size_t i = 0; i < n; i++) {
		cohort__appendf(buf, cap, off,
		    "# HELP cohort_%s %s\n# TYPE cohort_%s %s\ncohort_%s ",
		    m[i].name, m[i].help, m[i].name, m[i].type, m[i].name);
		if (m[i].ms)
			cohort__appendf(
			    buf, cap, off, "%.3f\n", (double)m[i].v / 1000.0);
		else
			cohort__appendf(
			    buf, cap, off, "%" PRIu64 "\n", m[i].v);
	}
}

char *
srv_metrics_text(struct srv_core *core, cohort__time now)
{
	size_t cap = 8192
	    + core->jobs.n
	        * (core->metrics_jobs ? 4 * (2 * SRV_MAX_NAME + 64) : 0),
	       off = 0;
	char *buf = malloc(cap);
	uint64_t keys = 0, bytes = 0, members = 0, joiners = 0;
	struct srv_jrn_stats js;
	struct srv_hnode *n;
	size_t i;

	if (buf == NULL)
		return (NULL);
	for (n = srv_map_next(&core->jobs, &i, NULL); n != NULL;
	     n = srv_map_next(&core->jobs, &i, n)) {
		struct srv_job *job = SRV_CONTAINER(n, struct srv_job, hn);
		keys += srv_kv_count(job->kv);
		bytes += srv_kv_bytes(job->kv);
		for (uint32_t r = 0; job->members && r < job->world; r++)
			members += job->members[r].state == SRV_MEMBER_RUNNING;
		joiners += job->njoiners;
	}
	/* ms: a duration in milliseconds, shown in seconds */
	const struct metrics_row rows[] = {
		{ "gauge", "uptime_seconds", "Seconds since cohortd started.",
		    true, (uint64_t)(now - core->started) },
		{ "counter", "requests_total", "Requests received.", false,
		    core->m.requests },
		{ "counter", "errors_total", "Replies with a non-OK status.",
		    false, core->m.replies_error },
		{ "counter", "member_failures_total",
		    "Members declared failed.", false, core->m.failures },
		{ "counter", "timeouts_total",
		    "Parked requests that timed out.", false,
		    core->m.timeouts },
		{ "counter", "rendezvous_total", "Generations formed.", false,
		    core->m.rendezvous },
		{ "counter", "collectives_total", "Collectives completed.",
		    false, core->m.collectives },
		{ "counter", "elastic_shrinks_total",
		    "Generations of elastic jobs that went on without a lost "
		    "member.",
		    false, core->m.shrinks },
		{ "counter", "elastic_grows_total",
		    "Generations of elastic jobs that admitted joiners at a "
		    "step boundary.",
		    false, core->m.grows },
		{ "gauge", "elastic_joiners_waiting",
		    "Processes waiting to join a running elastic job.", false,
		    joiners },
		{ "gauge", "draining",
		    "1 while cohortd drains before it exits (/readyz says "
		    "503).",
		    false, core->draining ? 1 : 0 },
		{ "gauge", "jobs", "Jobs known.", false, core->jobs.n },
		{ "gauge", "clients", "Clients known.", false,
		    core->nclients },
		{ "gauge", "members_running", "Running members.", false,
		    members },
		{ "gauge", "parked_requests",
		    "Requests waiting for an answer.", false, core->nparked },
		{ "gauge", "kv_keys", "Keys stored.", false, keys },
		{ "gauge", "kv_bytes", "Bytes of keys and values stored.",
		    false, bytes },
		{ "gauge", "stalled_ops",
		    "Collectives waiting longer than --stall-threshold.",
		    false, srv_stall_count(core, now) },
		{ "counter", "stalls_total", "Stall warnings logged.", false,
		    core->m.stalls },
		{ "gauge", "loop_lag_seconds",
		    "How late the last 100 ms sweep ran (event-loop lag).",
		    true, (uint64_t)core->m.loop_lag_ms },
		{ "gauge", "loop_lag_max_seconds",
		    "Largest event-loop lag seen.", true,
		    (uint64_t)core->m.loop_lag_max_ms },
		{ "counter", "loop_stalls_total",
		    "Event-loop stalls of at least 1 s (members got a fresh "
		    "dead-after window).",
		    false, core->m.loop_stalls },
		{ "counter", "jobs_expired_total",
		    "Jobs removed by --job-expiry (no member running, no "
		    "client connected).",
		    false, core->m.jobs_expired },
		{ "counter", "limit_refusals_total",
		    "Requests refused by --max-jobs, --max-members, "
		    "--max-total-members, --max-total-bytes or "
		    "--max-total-keys.",
		    false, core->m.limit_refusals },
		{ "gauge", "connections", "Connections open (nng pipes).",
		    false, core->pipes.n },
		{ "counter", "connections_total", "Connections established.",
		    false, core->m.conns_opened },
		{ "counter", "connections_closed_first_request_total",
		    "Connections closed: no complete request within "
		    "--first-request-timeout.",
		    false, core->m.conns_closed_first },
		{ "counter", "connections_closed_idle_total",
		    "Connections closed: idle past --idle-timeout.", false,
		    core->m.conns_closed_idle },
		{ "counter", "closed_connection_requests_total",
		    "Requests dropped: their connection had closed.", false,
		    core->m.dropped_closed },
	};

	metrics_put(buf, cap, &off, rows, sizeof(rows) / sizeof(rows[0]));
	if (core->jrn != NULL) {
		srv_jrn_stats(core->jrn, &js);
		const struct metrics_row jrows[] = {
			{ "counter", "journal_records_total",
			    "Journal records written.", false, js.records },
			{ "counter", "journal_bytes_total",
			    "Journal bytes written.", false, js.bytes },
			{ "gauge", "journal_log_bytes",
			    "Size of the journal log.", false, js.log_bytes },
			{ "gauge", "journal_snapshot_bytes",
			    "Size of the snapshot.", false, js.snap_bytes },
			{ "counter", "journal_fsyncs_total",
			    "fdatasync calls.", false, js.fsyncs },
			{ "counter", "journal_compactions_total",
			    "Snapshots written.", false, js.compactions },
			{ "counter", "journal_errors_total",
			    "Journal write errors.", false, js.errors },
			{ "gauge", "journal_writable",
			    "0 while the journal cannot be written: changes "
			    "are refused (COHORT_EJOURNAL), /readyz says 503.",
			    false,
			    srv_jrn_problem(core->jrn) == NULL ? 1 : 0 },
		};
		metrics_put(
		    buf, cap, &off, jrows, sizeof(jrows) / sizeof(jrows[0]));
	}
	if (core->metrics_jobs)
		metrics_jobs(core, buf, cap, &off);
	{
		/* build info and the per-rank series (ranks.c) */
		char *all = srv_obs_metrics(core, buf, off, now);
		free(buf);
		return (all);
	}
}
