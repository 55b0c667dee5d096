/*
 * heartbeat.c - one heartbeat timer per process for all its clients.
 *
 * Every open client is on one list, owned by one thread of ours (started
 * with the first client of the process, living as long as the process):
 * it wakes when the earliest client is due, runs the due clients' ticks
 * (the client's tick, open.c: end the asynchronous calls past their
 * deadline, start the Heartbeat, look for a fault schedule) and sleeps
 * again. Rounds are at least HB_ROUND_MS apart, so a process wakes at
 * most 1000 / HB_ROUND_MS times a second however many clients it holds.
 *
 * The thread never waits for a lock another thread may hold: on a
 * machine with thousands of runnable threads (the join bench's simulated
 * hosts) a holder preempted inside even a short critical section may not
 * run again for seconds, and this thread beats for every client of the
 * process. So a tick only try-locks (a busy client is tried again the
 * next round), and opening and closing clients do not share a lock with
 * it: they post the client on a lock-free inbox and wake the thread
 * through an eventfd; the thread adds or removes it between rounds, and
 * a closing client waits (for it, not the other way round) until it is
 * off the list.
 *
 * Why not an nng sleep aio per client, as before: nng 1.5 keeps every
 * aio with a deadline on a list that its expiry thread walks whole each
 * time the earliest entry comes due. With many clients per process (156
 * in the bench) that was a walk per client per second over a list as
 * long as the clients: at 10,000 idle clients in 64 processes the expiry
 * threads took about 40 % of two cores (issue 24). Here the cost per
 * process is a wake-up per round and a pass over its own clients.
 */
#include <errno.h>
#include <poll.h>
#include <pthread.h>
#include <signal.h>
#include <stdatomic.h>
#include <stdint.h>
#include <string.h>
#include <sys/eventfd.h>
#include <time.h>
#include <unistd.h>

#include "client.h"

/* Shortest time between two rounds (due clients wait for the next). */
#define HB_ROUND_MS 50
/* Longest sleep when no client is due sooner. */
#define HB_IDLE_MS 1000
/* A warning when the thread runs this much later than it meant to. */
#define HB_LATE_MS 2000
#define HB_LATE_EVERY_MS 10000

enum { HB_ADD = 1, HB_REMOVE = 2 };

/* Starting the thread (register only; the thread never takes it). */
static pthread_mutex_t hb_start_mtx = PTHREAD_MUTEX_INITIALIZER;
static pid_t hb_pid; /* the process whose thread runs (0: none) */
static int hb_efd = -1; /* wakes the thread */
/* Clients to add or remove, pushed by any thread, taken by the thread. */
static _Atomic(struct cohort_client *) hb_inbox;
/* The thread's own: the clients on the list. */
static struct cohort_client *hb_head;

static void
hb_wake(void)
{
	uint64_t one = 1;

	while (write(hb_efd, &one, sizeof(one)) < 0 && errno == EINTR)
		;
}

static void
hb_push(struct cohort_client *c, int op)
{
	struct cohort_client *top = atomic_load(&hb_inbox);

	atomic_store(&c->hb_op, op);
	do
		c->hb_inbox_next = top;
	while (!atomic_compare_exchange_weak(&hb_inbox, &top, c));
	hb_wake();
}

/* Takes the inbox and applies it to the list (the thread only). */
static void
hb_apply_inbox(cohort__time now)
{
	struct cohort_client *c = atomic_exchange(&hb_inbox, NULL), *next;

	for (; c != NULL; c = next) {
		next = c->hb_inbox_next;
		if (atomic_load(&c->hb_op) == HB_ADD) {
			c->hb_prev = NULL;
			c->hb_next = hb_head;
			if (hb_head != NULL)
				hb_head->hb_prev = c;
			hb_head = c;
			if (c->hb_due < now)
				c->hb_due = now;
			atomic_store(&c->hb_op, 0);
			continue;
		}
		/* HB_REMOVE: on the list (unregister waits until its ADD
		 * was applied before it posts this) */
		if (c->hb_prev != NULL)
			c->hb_prev->hb_next = c->hb_next;
		else
			hb_head = c->hb_next;
		if (c->hb_next != NULL)
			c->hb_next->hb_prev = c->hb_prev;
		c->hb_next = c->hb_prev = NULL;
		/* last touch of c: its closer may free it now */
		atomic_store(&c->hb_op, 0);
	}
}

/* Says (at most every HB_LATE_EVERY_MS) when the thread woke more than
 * HB_LATE_MS after it meant to: the process is starved of CPU, and
 * cohortd may declare its ranks dead for that alone. */
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
	struct pollfd pfd = { .fd = hb_efd, .events = POLLIN };
	sigset_t all;

	(void)arg;
	/* signals go to the program's threads, not this one */
	sigfillset(&all);
	pthread_sigmask(SIG_BLOCK, &all, NULL);
	for (;;) {
		cohort__time now = cohort__now_ms();
		cohort__time next = now + HB_IDLE_MS;
		uint64_t v;

		hb_apply_inbox(now);
		for (struct cohort_client *c = hb_head; c != NULL;
		     c = c->hb_next) {
			if (c->hb_due <= now) {
				if (!c->hb_tick(c)) {
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
		now = cohort__now_ms();
		if (next > now && poll(&pfd, 1, (int)(next - now)) > 0
		    && (pfd.revents & POLLIN))
			/* an inbox post: apply it now, keep the schedule */
			(void)read(hb_efd, &v, sizeof(v));
		else
			hb_check_late(next);
	}
	return (NULL);
}

/* Starts the thread if this process has none. */
static cohort_status
hb_start(void)
{
	cohort_status st = COHORT_OK;

	pthread_mutex_lock(&hb_start_mtx);
	if (hb_pid != getpid()) {
		/* the first client, or the first in a forked child (whose
		 * parent's thread did not come along): a thread of its own */
		pthread_attr_t attr;
		pthread_t tid;
		int rv;

		if (hb_efd >= 0)
			close(hb_efd);
		hb_head = NULL;
		atomic_store(&hb_inbox, NULL);
		if ((hb_efd = eventfd(0, EFD_CLOEXEC | EFD_NONBLOCK)) < 0) {
			st = cohort__err(COHORT_ESYSTEM,
			    "cannot start the heartbeat thread: eventfd: %s",
			    strerror(errno));
			goto out;
		}
		pthread_attr_init(&attr);
		pthread_attr_setdetachstate(&attr, PTHREAD_CREATE_DETACHED);
		pthread_attr_setstacksize(&attr, 256 * 1024);
		rv = pthread_create(&tid, &attr, hb_main, NULL);
		pthread_attr_destroy(&attr);
		if (rv != 0) {
			close(hb_efd);
			hb_efd = -1;
			st = cohort__err(COHORT_ESYSTEM,
			    "cannot start the heartbeat thread: %s",
			    strerror(rv));
			goto out;
		}
		(void)pthread_setname_np(tid, "cohort:hb");
		hb_pid = getpid();
	}
out:
	pthread_mutex_unlock(&hb_start_mtx);
	return (st);
}

cohort_status
cohort__hb_start(void)
{
	return (hb_start());
}

cohort_status
cohort__hb_register(struct cohort_client *c, cohort_duration first_ms,
    bool (*tick)(struct cohort_client *c))
{
	cohort_status st;

	if ((st = hb_start()) != COHORT_OK)
		return (st);
	c->hb_due = cohort__now_ms() + first_ms;
	c->hb_tick = tick;
	c->hb_on = true;
	hb_push(c, HB_ADD);
	return (COHORT_OK);
}

void
cohort__hb_unregister(struct cohort_client *c)
{
	struct timespec ts = { 0, 200 * 1000 }; /* 0.2 ms */

	if (!c->hb_on)
		return;
	/* wait for a pending ADD to be taken first (open then close
	 * before the thread ran) */
	while (atomic_load(&c->hb_op) != 0)
		nanosleep(&ts, NULL);
	hb_push(c, HB_REMOVE);
	/* the thread drops it between rounds (a tick never waits on a
	 * lock, so that is soon); c must not be freed before */
	while (atomic_load(&c->hb_op) != 0)
		nanosleep(&ts, NULL);
	c->hb_on = false;
}
