/*
 * cl_fixture.c - the embedded coordinator and threaded ranks of the
 * client unit tests (cl_fixture.h).
 */
#include <errno.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>

#include "cl_fixture.h"
#include "client.h"
#include "server.h"

void
clx_start(struct clx *x, const char *job)
{
	static const char *const listen[] = { "tcp://127.0.0.1:0" };
	struct cohort__srv_config cfg;
	char spec[96];
	const char *jobs[1] = { spec };

	memset(x, 0, sizeof(*x));
	snprintf(x->job, sizeof(x->job), "%s", job);
	snprintf(spec, sizeof(spec), "%s:tok", job);
	cohort__srv_config_init(&cfg);
	cfg.listen = listen;
	cfg.nlisten = 1;
	cfg.jobs = jobs;
	cfg.njobs = 1;
	ck_assert_cohort_ok(cohort__srv_start(&cfg, &x->srv));
	x->url = cohort__srv_url(x->srv, 0);
	ck_assert_ptr_nonnull(x->url);
	x->heartbeat_ms = 100;
	x->dead_after_ms = 1000;
	x->op_timeout_ms = 20000;
	x->backend = "service";
}

void
clx_close(struct clx *x, int rank)
{
	cohort_client_close(x->c[rank]);
	x->c[rank] = NULL;
}

void
clx_stop(struct clx *x)
{
	for (int r = 0; r < CLX_MAX; r++)
		if (x->c[r] != NULL)
			clx_close(x, r);
	cohort__srv_stop(x->srv);
	x->srv = NULL;
}

void
clx_options(const struct clx *x, int rank, int n, cohort_options *o)
{
	th_member_options(o, x->url, x->job, rank, n);
	o->heartbeat_interval = x->heartbeat_ms;
	o->dead_after = o->reconnect_window = x->dead_after_ms;
	o->op_timeout = o->join_timeout = x->op_timeout_ms;
	o->backend = x->backend;
	o->data_addr = "127.0.0.1";
}

struct clx_pending {
	struct clx *x;
	int asker;
	int who;
};

bool
clx_job_status(struct clx *x, int asker,
    bool (*fn)(const Cohort__JobStatus *js, void *arg), void *arg)
{
	Cohort__Request req = COHORT__REQUEST__INIT;
	Cohort__StatusQuery q = COHORT__STATUS_QUERY__INIT;
	struct cohort__coord_call call;
	bool ok = false;

	q.job = x->job;
	req.body_case = COHORT__REQUEST__BODY_STATUS_QUERY;
	req.status_query = &q;
	if (cohort__coord_request(x->c[asker]->coord, &call, &req, NULL, 0,
	        cohort__now_ms() + 1000)
	        == COHORT_OK
	    && call.rep->body_case == COHORT__REPLY__BODY_STATUS_QUERY
	    && call.rep->status_query->n_jobs == 1)
		ok = fn(call.rep->status_query->jobs[0], arg);
	cohort__coord_call_fini(&call);
	return (ok);
}

/* Rank `who` is among the arrivals of a pending collective. */
static bool
clx_parked_in(const Cohort__JobStatus *js, void *arg)
{
	const struct clx_pending *p = arg;
	bool in = false;

	for (size_t i = 0; i < js->n_pending; i++)
		for (size_t k = 0; k < js->pending[i]->n_arrived; k++)
			if (js->pending[i]->arrived[k] == p->who
			    && !js->pending[i]->data_plane)
				in = true;
	return (in);
}

/* cohortd lists rank `who` among the arrivals of a pending collective. */
static bool
clx_parked(void *arg)
{
	struct clx_pending *p = arg;

	return (clx_job_status(p->x, p->asker, clx_parked_in, p));
}

void
clx_wait_parked(struct clx *x, int asker, int who)
{
	struct clx_pending p = { x, asker, who };

	ck_assert_msg(th_wait_until(clx_parked, &p, 250, 20),
	    "rank %d never arrived in a collective at cohortd", who);
}

/* ------------------------------------------------------------------------ */
/* Ranks in threads                                                         */
/* ------------------------------------------------------------------------ */

struct clx_bg {
	struct clx *x;
	int rank;
	clx_fn fn;
	void *arg;
	pthread_t tid;
	cohort_status st;
	int64_t t0, t1;
};

static void *
clx_bg_main(void *arg)
{
	struct clx_bg *bg = arg;

	bg->st = bg->fn(bg->x, bg->rank, bg->arg);
	bg->t1 = th_now_ms();
	return (NULL);
}

struct clx_bg *
clx_bg_start(struct clx *x, int rank, clx_fn fn, void *arg)
{
	struct clx_bg *bg = calloc(1, sizeof(*bg));

	ck_assert_ptr_nonnull(bg);
	bg->x = x;
	bg->rank = rank;
	bg->fn = fn;
	bg->arg = arg;
	bg->t0 = th_now_ms();
	ck_assert_int_eq(pthread_create(&bg->tid, NULL, clx_bg_main, bg), 0);
	return (bg);
}

cohort_status
clx_bg_join(struct clx_bg *bg, int timeout_ms, int64_t *ms)
{
	struct timespec ts;
	cohort_status st;
	int rv;

	clock_gettime(CLOCK_REALTIME, &ts);
	ts.tv_sec += timeout_ms / 1000;
	ts.tv_nsec += (long)(timeout_ms % 1000) * 1000000L;
	if (ts.tv_nsec >= 1000000000L) {
		ts.tv_sec++;
		ts.tv_nsec -= 1000000000L;
	}
	rv = pthread_timedjoin_np(bg->tid, NULL, &ts);
	ck_assert_msg(rv == 0, "rank %d still running after %d ms (%s)",
	    bg->rank, timeout_ms, strerror(rv));
	st = bg->st;
	if (ms != NULL)
		*ms = bg->t1 - bg->t0;
	free(bg);
	return (st);
}

void
clx_run(struct clx *x, int n, clx_fn fn, void *arg, int timeout_ms,
    cohort_status *st)
{
	struct clx_bg *bg[CLX_MAX];
	int64_t end = th_now_ms() + timeout_ms;

	ck_assert_int_le(n, CLX_MAX);
	for (int r = 0; r < n; r++)
		bg[r] = clx_bg_start(x, r, fn, arg);
	for (int r = 0; r < n; r++) {
		int64_t left = end - th_now_ms();

		st[r] = clx_bg_join(bg[r], left > 0 ? (int)left : 1, NULL);
	}
}

static cohort_status
clx_open_one(struct clx *x, int rank, void *arg)
{
	cohort_options o;

	clx_options(x, rank, *(int *)arg, &o);
	return (cohort_client_open(&o, &x->c[rank], COHORT_WAIT_DEFAULT));
}

void
clx_join(struct clx *x, int n)
{
	cohort_status st[CLX_MAX];

	ck_assert_int_le(n, CLX_MAX);
	clx_run(x, n, clx_open_one, &n, 20000, st);
	for (int r = 0; r < n; r++)
		ck_assert_msg(st[r] == COHORT_OK, "rank %d: open: %s", r,
		    cohort_status_name(st[r]));
	x->n = n;
}
