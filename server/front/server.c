/*
 * server.c - cohortd as a library (server.h): a coordinator, its nng
 * front end, and the TCPStore and HTTP listeners, started and stopped
 * together.
 */
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#include "server.h"
#include "core/util.h"
#include "journal/journal.h"
#include "observe/ranks.h"
#include "state/lifecycle.h"
#include "events.h"
#include "door.h"
#include "http.h"
#include "net.h"
#include "nng_rep.h"
#include "sp.h"
#include "torchstore.h"

struct cohort__srv {
	struct srv_nng *nng;
	/* cohortd's own listeners: tcp://, --torch-store, --http */
	struct srv_net *net;
	struct srv_sp **sps;
	size_t nsps;
	char **urls; /* every --listen as bound, in order */
	size_t nurls;
	struct srv_http *http;
	char *http_url;
	struct srv_tstore **tstores; /* --torch-store listeners */
	size_t ntstores;
	struct srv_door *door; /* who may use them */
};

void
cohort__srv_config_init(struct cohort__srv_config *cfg)
{
	memset(cfg, 0, sizeof(*cfg));
	cfg->max_value_bytes = COHORT__DEFAULT_MAX_VALUE;
	cfg->max_job_bytes = COHORT__SRV_DEFAULT_MAX_JOB_BYTES;
	cfg->max_keys = COHORT__SRV_DEFAULT_MAX_KEYS;
	cfg->max_total_bytes = COHORT__SRV_DEFAULT_MAX_TOTAL_BYTES;
	cfg->max_total_keys = COHORT__SRV_DEFAULT_MAX_TOTAL_KEYS;
	cfg->max_jobs = COHORT__SRV_DEFAULT_MAX_JOBS;
	cfg->max_members = COHORT__SRV_DEFAULT_MAX_MEMBERS;
	cfg->max_total_members = COHORT__SRV_DEFAULT_MAX_TOTAL_MEMBERS;
	cfg->job_expiry_ms = COHORT__SRV_DEFAULT_JOB_EXPIRY_MS;
	cfg->max_parked = COHORT__SRV_DEFAULT_MAX_PARKED;
	cfg->max_parked_bytes = COHORT__SRV_DEFAULT_MAX_PARKED_BYTES;
	cfg->pool_size = COHORT__SRV_DEFAULT_POOL;
	cfg->metrics_max_ranks = COHORT__SRV_DEFAULT_METRICS_RANKS;
	cfg->stall_factor = COHORT__SRV_DEFAULT_STALL_FACTOR;
	cfg->stall_floor_ms = COHORT__SRV_DEFAULT_STALL_FLOOR_MS;
}

const char *
cohort__srv_url(const struct cohort__srv *s, size_t i)
{
	return (i < s->nurls ? s->urls[i] : NULL);
}

const char *
cohort__srv_http_url(const struct cohort__srv *s)
{
	return (s->http_url);
}

const char *
cohort__srv_torch_store_addr(const struct cohort__srv *s, size_t i)
{
	return (i < s->ntstores ? srv_tstore_addr(s->tstores[i]) : NULL);
}

/* --torch-store "[JOB@]ADDR:PORT": the job's token comes from a --job
 * entry of the same name (a TCPStore client presents none). */
static cohort_status
server_add_tstores(struct cohort__srv *s, const struct cohort__srv_config *cfg)
{
	cohort_status drv;

	if (cfg->ntorch_stores == 0)
		return (COHORT_OK);
	if ((drv = srv_door_new(
	         cfg->torch_store_allow, cfg->ntorch_store_allow, &s->door))
	    != COHORT_OK)
		return (drv);
	s->tstores = calloc(cfg->ntorch_stores, sizeof(*s->tstores));
	if (s->tstores == NULL)
		return (COHORT_ENOMEM);
	for (size_t i = 0; i < cfg->ntorch_stores; i++) {
		const char *spec = cfg->torch_stores[i];
		const char *at = strchr(spec, '@');
		const char *token = "";
		cohort_status rv;

		for (size_t j = 0; at != NULL && j < cfg->njobs; j++) {
			const char *js = cfg->jobs[j];
			const char *colon = strchr(js, ':');
			if (colon != NULL
			    && (size_t)(colon - js) == (size_t)(at - spec)
			    && memcmp(js, spec, (size_t)(at - spec)) == 0)
				token = colon + 1;
		}
		rv = srv_tstore_start(s->net, s->nng, s->door, spec, token,
		    cfg->torch_store_partial_ms, &s->tstores[i]);
		if (rv != COHORT_OK)
			return (rv);
		s->ntstores++;
	}
	return (COHORT_OK);
}

uint64_t
cohort__srv_idle_ms(struct cohort__srv *s)
{
	return (srv_nng_idle_ms(s->nng));
}

static void
server_drain(void *arg, struct srv_core *core, cohort__time now)
{
	(void)arg;
	(void)now;
	core->draining = true;
}

void
cohort__srv_drain(struct cohort__srv *s)
{
	srv_with_core(s->nng, server_drain, NULL);
}

static void
server_draining(void *arg, struct srv_core *core, cohort__time now)
{
	(void)now;
	*(bool *)arg = core->draining;
}

bool
cohort__srv_draining(struct cohort__srv *s)
{
	bool d = true; /* stopping */

	srv_with_core(s->nng, server_draining, &d);
	return (d);
}

struct server_ready {
	char *why;
	size_t len;
	bool ok;
};

static void
server_ready(void *arg, struct srv_core *core, cohort__time now)
{
	struct server_ready *r = arg;

	(void)now;
	r->ok = srv_core_ready(core, r->why, r->len);
}

bool
cohort__srv_ready(struct cohort__srv *s, char *why, size_t len)
{
	struct server_ready r = { why, len, false };

	snprintf(why, len, "stopping");
	srv_with_core(s->nng, server_ready, &r);
	return (r.ok);
}

static cohort_status
server_add_jobs(struct srv_core *core, const struct cohort__srv_config *cfg)
{
	for (size_t i = 0; i < cfg->njobs; i++) {
		const char *spec = cfg->jobs[i], *colon = strchr(spec, ':');
		char name[SRV_MAX_NAME + 1];
		size_t nl;
		cohort_status rv;
		if (colon == NULL || colon == spec
		    || (nl = (size_t)(colon - spec)) > SRV_MAX_NAME)
			return (cohort__err(COHORT_EINVAL,
			    "--job '%s': expected NAME:TOKEN", spec));
		memcpy(name, spec, nl);
		name[nl] = '\0';
		if ((rv = srv_job_add_preset(core, name, colon + 1))
		    != COHORT_OK)
			return (rv);
	}
	return (COHORT_OK);
}

/* Frees the n items of the array arr with free_fn, then arr itself, and
 * leaves it empty (NULL, 0). */
#define SERVER_FREE_ARRAY(arr, n, free_fn)                                    \
	do {                                                                  \
		for (size_t i_ = 0; i_ < (n); i_++)                           \
			free_fn((arr)[i_]);                                   \
		free(arr);                                                    \
		(arr) = NULL;                                                 \
		(n) = 0;                                                      \
	} while (0)

/* The HTTP and TCPStore listeners stop (their threads call into the
 * core), and cohortd's own connections close while the core still runs.
 */
static void
server_stop_listeners(struct cohort__srv *s)
{
	srv_net_stop(s->net);
	srv_http_free(s->http);
	s->http = NULL;
	SERVER_FREE_ARRAY(s->tstores, s->ntstores, srv_tstore_free);
	srv_door_free(s->door);
	s->door = NULL;
	SERVER_FREE_ARRAY(s->sps, s->nsps, srv_sp_free);
}

static void
server_free_urls(struct cohort__srv *s)
{
	SERVER_FREE_ARRAY(s->urls, s->nurls, free);
}

/* Every --listen URL: tcp:// on cohortd's own listeners (sp.c), the
 * others (ipc://, tls+tcp://) on nng; their bound URLs in order. */
static cohort_status
server_listen(struct cohort__srv *s, const struct cohort__srv_config *cfg,
    const char *const *urls, size_t nurls)
{
	const char **nngurls;
	size_t nn = 0, k = 0;
	cohort_status rv = COHORT_OK;

	s->urls = calloc(nurls, sizeof(char *));
	s->sps = calloc(nurls, sizeof(*s->sps));
	nngurls = calloc(nurls, sizeof(char *));
	if (s->urls == NULL || s->sps == NULL || nngurls == NULL) {
		free(nngurls);
		return (COHORT_ENOMEM);
	}
	for (size_t i = 0; i < nurls && rv == COHORT_OK; i++) {
		if (!srv_sp_url(urls[i])) {
			nngurls[nn++] = urls[i];
			continue;
		}
		rv = srv_sp_listen(s->net, s->nng, urls[i], &s->sps[s->nsps]);
		if (rv == COHORT_OK)
			s->nsps++;
	}
	if (rv == COHORT_OK)
		rv = srv_nng_listen(s->nng, cfg, nngurls, nn);
	free(nngurls);
	if (rv != COHORT_OK)
		return (rv);
	for (size_t i = 0, sp = 0, ng = 0; i < nurls; i++) {
		const char *u = srv_sp_url(urls[i])
		    ? srv_sp_addr(s->sps[sp++])
		    : srv_nng_url(s->nng, ng++);
		if ((s->urls[k] = srv_strdup(u != NULL ? u : urls[i])) == NULL)
			return (COHORT_ENOMEM);
		s->nurls = ++k;
	}
	return (COHORT_OK);
}

/* The coordinator's settings (cohortd's options). */
static cohort_status
server_configure(struct srv_core *core, const struct cohort__srv_config *cfg)
{
	core->require_token = cfg->require_token;
	core->open_status = cfg->open_status;
	core->job_expiry_ms = (cohort__time)cfg->job_expiry_ms;
	core->metrics_jobs = cfg->metrics_per_job;
	srv_obs_set_max(core, cfg->metrics_max_ranks);
	core->stall_ms = cfg->stall_threshold_ms
	    ? (cohort__time)cfg->stall_threshold_ms
	    : (cohort__time)COHORT__SRV_DEFAULT_STALL_MS;
	core->stall_factor = cfg->stall_factor;
	core->stall_floor_ms = (cohort__time)cfg->stall_floor_ms;
	if (cfg->first_request_ms != 0)
		core->first_request_ms = (cohort__time)cfg->first_request_ms;
	if (cfg->idle_ms != 0)
		core->idle_ms = (cohort__time)cfg->idle_ms;
	core->restore_grace_ms = cfg->restore_grace_ms
	    ? (cohort__time)cfg->restore_grace_ms
	    : (cohort__time)COHORT__SRV_DEFAULT_RESTORE_GRACE_MS;
	core->rdzv_last_call_ms = cfg->rdzv_last_call_ms
	    ? (cohort__time)cfg->rdzv_last_call_ms
	    : (cohort__time)COHORT__SRV_DEFAULT_RDZV_LAST_CALL_MS;
	if (cfg->state_dir != NULL) {
		struct srv_jrn_opts jo;
		memset(&jo, 0, sizeof(jo));
		jo.dir = cfg->state_dir;
		jo.compact_min = cfg->compact_min_bytes;
		jo.recover = cfg->state_recover;
		if (cfg->fsync == NULL || strcmp(cfg->fsync, "batch") == 0) {
			jo.fsync = SRV_FSYNC_BATCH;
		} else if (strcmp(cfg->fsync, "always") == 0) {
			jo.fsync = SRV_FSYNC_ALWAYS;
		} else if (strcmp(cfg->fsync, "none") == 0) {
			jo.fsync = SRV_FSYNC_NONE;
		} else {
			return (cohort__err(COHORT_EINVAL,
			    "--fsync '%s': expected batch, always or none",
			    cfg->fsync));
		}
		return (srv_journal_open(core, &jo, cohort__now_ms()));
	}
	return (COHORT_OK);
}

cohort_status
cohort__srv_start(
    const struct cohort__srv_config *cfg, struct cohort__srv **out)
{
	static const char *const dflt[] = { COHORT__SRV_DEFAULT_URL };
	const char *const *urls = cfg->nlisten ? cfg->listen : dflt;
	size_t nurls = cfg->nlisten ? cfg->nlisten : 1;
	struct srv_limits lim;
	struct srv_net_limits nl;
	struct cohort__srv *s;
	struct srv_core *core;
	cohort_status rv;

	lim.max_value = cfg->max_value_bytes;
	lim.max_job_bytes = cfg->max_job_bytes;
	lim.max_keys = cfg->max_keys;
	lim.max_total_bytes = cfg->max_total_bytes;
	lim.max_total_keys = cfg->max_total_keys;
	lim.max_jobs = cfg->max_jobs;
	lim.max_members = cfg->max_members;
	lim.max_total_members = cfg->max_total_members;
	lim.max_parked = cfg->max_parked;
	lim.max_parked_bytes = cfg->max_parked_bytes;
	if (lim.max_value == 0 || lim.max_job_bytes == 0 || lim.max_keys == 0
	    || lim.max_value > (4ull << 30))
		return (cohort__err(COHORT_EINVAL,
		    "limits must be positive and values at most 4 GiB"));
	nl.max_conns = cfg->max_conns;
	nl.max_pending_per_source = cfg->max_pending_per_source;
	nl.max_pending_bytes = cfg->max_pending_bytes;
	if ((s = calloc(1, sizeof(*s))) == NULL)
		return (COHORT_ENOMEM);
	if ((rv = srv_nng_new(&lim, cfg->admin_token,
	         cfg->pool_size ? cfg->pool_size : COHORT__SRV_DEFAULT_POOL,
	         &s->nng))
	    != COHORT_OK)
		goto out_free;
	core = srv_nng_core(s->nng);
	if ((rv = server_configure(core, cfg)) != COHORT_OK
	    || (rv = server_add_jobs(core, cfg)) != COHORT_OK
	    || (rv = srv_net_new(&nl, &s->net)) != COHORT_OK)
		goto out_free;
	srv_nng_set_net(s->nng, s->net);
	/* TCPStore listeners first: once the cohort port answers (what
	 * launchers and tests probe), everything is listening. */
	if ((rv = server_add_tstores(s, cfg)) != COHORT_OK
	    || (rv = server_listen(s, cfg, urls, nurls)) != COHORT_OK)
		goto out_stop;
	if (cfg->http != NULL
	    && (rv = srv_http_start(
	            s->net, s->nng, cfg->http, &s->http, &s->http_url))
	        != COHORT_OK)
		goto out_stop;
	if ((rv = srv_net_start(s->net)) != COHORT_OK)
		goto out_stop;
	srv_nng_start_sweep(s->nng);
	*out = s;
	return (COHORT_OK);

out_stop:
	server_stop_listeners(s);
out_free:
	srv_nng_free(s->nng);
	srv_net_free(s->net);
	server_free_urls(s);
	free(s->http_url);
	free(s);
	return (rv);
}

void
cohort__srv_stop(struct cohort__srv *s)
{
	if (s == NULL)
		return;
	/* The listeners' threads end first: they call into the core. */
	server_stop_listeners(s);
	srv_nng_stop(s->nng);
	srv_net_free(s->net);
	server_free_urls(s);
	free(s->http_url);
	free(s);
}
