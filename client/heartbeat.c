/*
 * heartbeat.c - one heartbeat timer per process for all its clients.
 *
 * Every open client is on one list; one thread of ours (started with the
 * first client of the process, living as long as the process) wakes when
 * the earliest client is due, runs the due clients' ticks
 * (cohort__client_hb_tick: end the asynchronous calls past their
 * deadline, start the Heartbeat, look for a fault schedule) and sleeps
 * again. Rounds are at least HB_ROUND_MS apart, so a process wakes at
 * most 1000 / HB_ROUND_MS times a second however many clients it holds.
 *
 * Why not an nng sleep aio per client, as before: nng 1.5 keeps every
 * aio with a deadline on a list that its expiry thread walks whole each
 * time the earliest entry comes due. With many clients per process (the
 * join bench's simulated hosts, 156 clients each) that was a walk per
 * client per second over a list as long as the clients: at 10,000 idle
 * clients in 64 processes the expiry threads took about 40 % of two
 * cores, starved everything else, and whole processes' heartbeats came
 * too late (issue 24). Here the cost per process is one wake-up per due
 * round and one pass over its own clients: O(clients) a second, no
 * matter what else runs on nng's threads.
 */
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <string.h>
#include <unistd.h>

#include "client.h"

/* Shortest time between two rounds (due clients wait for the next). */
#define HB_ROUND_MS 50
/* Longest sleep when no client is due sooner. */
#define HB_IDLE_MS 1000

static pthread_mutex_t hb_mtx = PTHREAD_MUTEX_INITIALIZER;
static pthread_cond_t hb_cv;
static pthread_once_t hb_once = PTHREAD_ONCE_INIT;
static struct cohort_client *hb_head; /* under hb_mtx */
static pid_t hb_pid; /* the process whose thread runs (0: none) */

static void
hb_init_once(void)
{
	(void)cohort__cond_init(&hb_cv);
}

/* Says (at most every HB_LATE_EVERY_MS) when the thread woke more than
 * HB_LATE_MS after it meant to: the process is starved of CPU, and
 * cohortd may declare its ranks dead for that alone. */
#define HB_LATE_MS 2000
#define HB_LATE_EVERY_MS 10000

static void
hb_check_late(cohort__time meant)
{
	static cohort__time said;
	cohort__time now = cohort__now_ms();

	if (now - meant > HB_LATE_MS && now - said > HB_LATE_EVERY_MS) {
		said = now;
		cohort__warn("the heartbeat thread of process %d ran %.1f s "
		             "late: the process is starved of CPU (its ranks "
		             "may be declared dead for it)",
		    (int)getpid(), (double)(now - meant) / 1000.0);
	}
}

static void *
hb_main(void *arg)
{
	sigset_t all;

	(void)arg;
	/* signals go to the program's threads, not this one */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	pthread_mutex_lock(&hb_mtx);
	for (;;) {
		cohort__time now = cohort__now_ms();
		cohort__time next = now + HB_IDLE_MS;
		struct cohort_client *c;

		for (c = hb_head; c != NULL; c = c->hb_next) {
			if (c->hb_due <= now) {
				if (!cohort__client_hb_tick(c)) {
					/* a lock was busy: next round */
					if (now + HB_ROUND_MS < next)
						next = now + HB_ROUND_MS;
					continue;
				}
				c->hb_due += c->heartbeat_ms;
				/* fallen behind (a stopped process): from
				 * now, not a burst of the missed ones */
				if (c->hb_due <= now)
					c->hb_due = now + c->heartbeat_ms;
			}
			if (c->hb_due < next)
				next = c->hb_due;
		}
		if (next < now + HB_ROUND_MS)
			next = now + HB_ROUND_MS;
		(void)cohort__cond_wait_until(&hb_cv, &hb_mtx, next);
		hb_check_late(next);
	}
	return (NULL);
}

/* Starts the thread if this process has none; under hb_mtx. */
static cohort_status
hb_start_locked(void)
{
	cohort_status st = COHORT_OK;

	if (hb_pid != getpid()) {
		/* the first client, or the first in a forked child (whose
		 * parent's thread did not come along): a thread of its own */
		pthread_attr_t attr;
		pthread_t tid;
		int rv;

		hb_head = NULL;
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, 256 * 1024);
		rv = pthread_create(&tid, &attr, hb_main, NULL);
		pthread_attr_destroy(&attr);
		if (rv != 0) {
			st = cohort__err(COHORT_ESYSTEM,
			    "cannot start the heartbeat thread: %s",
			    strerror(rv));
			goto out;
		}
		(void)pthread_setname_np(tid, "cohort:hb");
		hb_pid = getpid();
	}
out:
	return (st);
}

cohort_status
cohort__hb_start(void)
{
	cohort_status st;

	pthread_once(&hb_once, hb_init_once);
	pthread_mutex_lock(&hb_mtx);
	st = hb_start_locked();
	pthread_mutex_unlock(&hb_mtx);
	return (st);
}

cohort_status
cohort__hb_register(struct cohort_client *c, cohort_duration first_ms)
{
	cohort_status st;

	pthread_once(&hb_once, hb_init_once);
	pthread_mutex_lock(&hb_mtx);
	if ((st = hb_start_locked()) != COHORT_OK)
		goto out;
	c->hb_due = cohort__now_ms() + first_ms;
	c->hb_prev = NULL;
	c->hb_next = hb_head;
	if (hb_head != NULL)
		hb_head->hb_prev = c;
	hb_head = c;
	c->hb_on = true;
	pthread_cond_signal(&hb_cv);
out:
	pthread_mutex_unlock(&hb_mtx);
	return (st);
}

void
cohort__hb_unregister(struct cohort_client *c)
{
	/* hb_mtx is held through a whole round: once we hold it, no tick
	 * of c runs, and none will */
	pthread_mutex_lock(&hb_mtx);
	if (c->hb_on) {
		if (c->hb_prev != NULL)
			c->hb_prev->hb_next = c->hb_next;
		else
			hb_head = c->hb_next;
		if (c->hb_next != NULL)
			c->hb_next->hb_prev = c->hb_prev;
		c->hb_next = c->hb_prev = NULL;
		c->hb_on = false;
	}
	pthread_mutex_unlock(&hb_mtx);
}
