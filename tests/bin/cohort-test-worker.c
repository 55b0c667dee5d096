/*
 * cohort-test-worker - a real worker process for the integration and fault
 * suites. It joins the job described by its environment (COHORT_*), runs
 * one scenario, prints "RESULT key=value ..." lines on stdout and exits 0 if
 * the scenario's own checks held, 1 otherwise (2 for usage errors).
 *
 *   cohort-test-worker SCENARIO [ARG]
 *
 * Scenarios are listed in worker_scenarios[] below; each is what a test in
 * tests/integration or tests/fault expects a rank to do.
 */
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <time.h>
#include <unistd.h>

#include <arpa/inet.h>
#include <netinet/in.h>
#include <sys/socket.h>

#include "cohort/cohort.h"
#include "client.h" /* cohort__kv_get: the stranger of scen_flood reads a
                      reserved key */
#include "group.h" /* g->id: the stranger of scen_flood finds the address */
#include "th_worker.h"

static void
worker_result(const char *what, cohort_status st, const char *detail)
{
	printf("RESULT %s status=%s detail=%s\n", what, cohort_status_name(st),
	    detail != NULL ? detail : "");
	fflush(stdout);
}

#define WORKER_CHECK(what, expr)                                              \
	do {                                                                  \
		cohort_status st_ = (expr);                                   \
		if (st_ != COHORT_OK) {                                       \
			worker_result(what, st_, cohort_last_error());        \
			return (1);                                           \
		}                                                             \
	} while (0)

/* Fails the check what (its call returned COHORT_OK but not what was
 * expected) unless cond: "RESULT what status=COHORT_OK detail=why", 1. */
#define WORKER_EXPECT(what, cond, why)                                        \
	do {                                                                  \
		if (!(cond)) {                                                \
			worker_result(what, COHORT_OK, why);                  \
			return (1);                                           \
		}                                                             \
	} while (0)

static int
scen_open_close(cohort_client *c, const char *arg)
{
	printf("RESULT open rank=%d world=%d generation=%" PRIu64 "\n",
	    cohort_client_rank(c), cohort_client_world_size(c),
	    cohort_client_generation(c));
	return (0);
}

/* Rank 0 waits (bounded by ARG ms) for the data plane of the world group
 * while the others issue no collective for 3 s: with the set-up started
 * at join on every rank (COHORT_EAGER_CONNECT=1) it completes; with it
 * off, the others publish nothing and rank 0 times out. */
static int
scen_early_setup(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	long limit = tw_arg(arg, 2000);
	int64_t t0 = tw_now_ms();
	cohort_status st = COHORT_OK;
	void *v = NULL;
	size_t n = 0;

	if (cohort_client_rank(c) == 0)
		st = cohort_group_connect(g, (cohort_duration)limit);
	else
		sleep(3);
	printf("RESULT setup rank=%d status=%s ms=%" PRId64 "\n",
	    cohort_client_rank(c), cohort_status_name(st), tw_now_ms() - t0);
	fflush(stdout);
	/* The set-up must leave a group that works: one all-reduce, if rank
	 * 0's wait succeeded (it tells the others through the KV store). */
	if (cohort_client_rank(c) == 0)
		WORKER_CHECK("kv_set",
		    cohort_kv_set(c, "setup",
		        st == COHORT_OK ? "ok" : "failed", 3, 30000));
	WORKER_CHECK("kv_get", cohort_kv_get(c, "setup", &v, &n, 30000));
	if (n == 3 && memcmp(v, "ok", 3) == 0) {
		int32_t x = 1;

		WORKER_CHECK("allreduce",
		    cohort_allreduce(
		        g, &x, &x, 1, COHORT_I32, COHORT_SUM, NULL, 30000));
		printf("RESULT sum=%d\n", (int)x);
	}
	cohort_free(v);
	return (0);
}

static int
scen_barrier(cohort_client *c, const char *arg)
{
	long n = tw_arg(arg, 1000);
	cohort_group *g = cohort_client_world(c);
	int64_t t0 = tw_now_ms();

	for (long i = 0; i < n; i++)
		WORKER_CHECK("barrier", cohort_barrier(g, "loop", 30000));
	printf(
	    "RESULT barrier count=%ld ms=%" PRId64 "\n", n, tw_now_ms() - t0);
	return (0);
}

/* Root 0 broadcasts ARG bytes of a rank-independent pattern; everyone
 * checks every byte. */
static int
scen_bcast(cohort_client *c, const char *arg)
{
	size_t len = (size_t)tw_arg(arg, 32 << 20);
	cohort_group *g = cohort_client_world(c);
	unsigned char *buf = NULL, *out = NULL;
	size_t out_len = 0;
	int bad = 0;

	if (cohort_client_rank(c) == 0) {
		buf = malloc(len);
		if (buf == NULL)
			return (1);
		for (size_t i = 0; i < len; i++)
			buf[i] = (unsigned char)(i * 31 + 7);
	}
	WORKER_CHECK("bcast",
	    cohort_broadcast_obj(
	        g, 0, buf, len, (void **)&out, &out_len, 60000));
	if (cohort_client_rank(c) != 0) {
		if (out_len != len)
			bad = 1;
		for (size_t i = 0; !bad && i < len; i++)
			if (out[i] != (unsigned char)(i * 31 + 7))
				bad = 1;
	}
	printf("RESULT bcast len=%zu ok=%d\n", out_len, !bad);
	free(buf);
	cohort_free(out);
	return (bad);
}

/* Rank 0 sets a key of ARG bytes; after a barrier every other rank reads
 * it back and checks every byte (values up to cohortd's limit). */
static int
scen_kvbig(cohort_client *c, const char *arg)
{
	size_t len = (size_t)tw_arg(arg, 1 << 20);
	cohort_group *g = cohort_client_world(c);
	unsigned char *buf = NULL;
	void *out = NULL;
	size_t out_len = 0;
	int bad = 0;

	if (cohort_client_rank(c) == 0) {
		if ((buf = malloc(len)) == NULL)
			return (1);
		for (size_t i = 0; i < len; i++)
			buf[i] = (unsigned char)(i * 13 + 1);
		WORKER_CHECK(
		    "kv_set", cohort_kv_set(c, "big", buf, len, 60000));
		free(buf);
	}
	WORKER_CHECK("barrier", cohort_barrier(g, "kvbig", 60000));
	if (cohort_client_rank(c) != 0) {
		const unsigned char *o;

		WORKER_CHECK(
		    "kv_get", cohort_kv_get(c, "big", &out, &out_len, 60000));
		o = out;
		bad = out_len != len;
		for (size_t i = 0; !bad && i < len; i++)
			if (o[i] != (unsigned char)(i * 13 + 1))
				bad = 1;
		cohort_free(out);
	}
	printf("RESULT kvbig len=%zu ok=%d\n", len, !bad);
	return (bad);
}

/* Ranks disagree on a data-plane collective (ARG: count, root, op,
 * dtype, order; agcount, rscount, a2acount: the count of an allgather, a
 * reduce_scatter, an alltoall): rank 0 and the others call different ones.
 * Prints the status and detail of the first call; then, for the root case, a
 * matching allreduce (the group stays usable). */
static int
scen_mismatch(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	bool r0 = cohort_client_rank(c) == 0;
	double buf[256] = { 0 }, out[256];
	cohort_status st;

	if (arg == NULL)
		return (2);
	if (strcmp(arg, "count") == 0)
		st = cohort_allreduce(g, buf, buf, r0 ? 64 : 256, COHORT_F64,
		    COHORT_SUM, NULL, 30000);
	else if (strcmp(arg, "root") == 0)
		st = cohort_broadcast(
		    g, buf, 64, COHORT_F64, r0 ? 0 : 1, NULL, 30000);
	else if (strcmp(arg, "op") == 0)
		st = cohort_allreduce(g, buf, buf, 64, COHORT_F64,
		    r0 ? COHORT_SUM : COHORT_MAX, NULL, 30000);
	else if (strcmp(arg, "dtype") == 0)
		st = cohort_allreduce(g, buf, buf, 64,
		    r0 ? COHORT_F64 : COHORT_F32, COHORT_SUM, NULL, 30000);
	else if (strcmp(arg, "agcount") == 0) /* 2 ranks: buf holds both */
		st = cohort_allgather(
		    g, buf, buf, r0 ? 64 : 128, COHORT_F64, NULL, 30000);
	else if (strcmp(arg, "rscount") == 0)
		st = cohort_reduce_scatter(g, buf, buf, r0 ? 64 : 128,
		    COHORT_F64, COHORT_SUM, NULL, 30000);
	else if (strcmp(arg, "a2acount") == 0)
		st = cohort_alltoall(
		    g, buf, out, r0 ? 64 : 128, COHORT_F64, NULL, 30000);
	else if (r0)
		st = cohort_allreduce(
		    g, buf, buf, 64, COHORT_F64, COHORT_SUM, NULL, 30000);
	else
		st = cohort_broadcast(g, buf, 64, COHORT_F64, 0, NULL, 30000);
	worker_result("mismatch", st, cohort_last_error());
	if (strcmp(arg, "root") == 0)
		WORKER_CHECK("after",
		    cohort_allreduce(
		        g, buf, buf, 64, COHORT_F64, COHORT_SUM, NULL, 30000));
	printf("RESULT done\n");
	return (0);
}

/*
 * A stranger floods a rank's data-plane listener while the mesh forms
 * (issue 12, finding 4). World of 3: ranks 0 and 1 form a tcp subgroup;
 * rank 2, not in it, plays the stranger: it reads rank 1's data-plane
 * address from the job's KV (a stranger would scan for it; this one has
 * the token only to find it fast) and opens 64 silent connections to it
 * before rank 0 connects. Ranks 0 and 1 then run an allreduce. ARG: the
 * number of silent connections (64).
 */
static int
scen_flood(cohort_client *c, const char *arg)
{
	long nconn = tw_arg(arg, 64);
	int rank = cohort_client_rank(c);
	uint64_t gen = cohort_client_generation(c);
	int32_t pair[2] = { 0, 1 };
	cohort_group *g = NULL;
	double v[1024];
	int ok = 1;

	if (rank == 2) {
		void *val = NULL;
		size_t len = 0;
		char gid[128], key[512], hp[128], *colon;
		int fds[256], n = 0;
		struct sockaddr_in sin;

		WORKER_CHECK("kv_get gid",
		    cohort_kv_get(c, "flood/gid", &val, &len, 60000));
		snprintf(gid, sizeof(gid), "%.*s", (int)len, (char *)val);
		cohort_free(val);
		snprintf(key, sizeof(key),
		    COHORT__KV_RESERVED
		    "dp/%" PRIu64 "/sub.%s/tcp/sub.%s/%" PRIu64 "/addr/1",
		    gen, gid, gid, gen);
		/* a reserved key: the public call refuses it */
		WORKER_CHECK(
		    "kv_get addr", cohort__kv_get(c, key, &val, &len, 60000));
		snprintf(hp, sizeof(hp), "%.*s", (int)len, (char *)val);
		cohort_free(val);
		if ((colon = strrchr(hp, ':')) == NULL)
			return (1);
		*colon = '\0';
		memset(&sin, 0, sizeof(sin));
		sin.sin_family = AF_INET;
		sin.sin_port = htons((uint16_t)tw_arg(colon + 1, 0));
		inet_pton(AF_INET, hp, &sin.sin_addr);
		for (; n < nconn && n < 256; n++) {
			fds[n] = socket(AF_INET, SOCK_STREAM, 0);
			if (connect(
			        fds[n], (struct sockaddr *)&sin, sizeof(sin))
			    != 0) {
				close(fds[n]);
				break;
			}
		}
		printf("RESULT flood connections=%d to %s:%s\n", n, hp,
		    colon + 1);
		fflush(stdout);
		WORKER_CHECK(
		    "kv_set", cohort_kv_set(c, "flood/on", "1", 1, 10000));
		WORKER_CHECK("barrier",
		    cohort_barrier(
		        cohort_client_world(c), "flood-end", 120000));
		for (int i = 0; i < n; i++)
			close(fds[i]);
		return (0);
	}
	WORKER_CHECK("group_new",
	    cohort_group_new(c, "pair", pair, 2, "tcp", &g, 60000));
	if (rank == 1)
		WORKER_CHECK("kv_set",
		    cohort_kv_set(
		        c, "flood/gid", g->id, strlen(g->id), 10000));
	else {
		void *val = NULL;
		size_t len = 0;

		WORKER_CHECK(
		    "kv_get", cohort_kv_get(c, "flood/on", &val, &len, 60000));
		cohort_free(val);
	}
	for (int i = 0; i < 1024; i++)
		v[i] = rank + 1;
	{
		int64_t t0 = tw_now_ms();

		WORKER_CHECK("allreduce",
		    cohort_allreduce(
		        g, v, v, 1024, COHORT_F64, COHORT_SUM, NULL, 60000));
		for (int i = 0; i < 1024; i++)
			ok &= v[i] == 3.0;
		printf("RESULT flood allreduce ok=%d ms=%" PRId64 "\n", ok,
		    tw_now_ms() - t0);
	}
	WORKER_CHECK("barrier",
	    cohort_barrier(cohort_client_world(c), "flood-end", 120000));
	return (!ok);
}

/* Even ranks vote true, odd false: all() is false unless world is 1, any()
 * is true. Then everyone votes true: all() is true. */
static int
scen_decide(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	bool mine = cohort_client_rank(c) % 2 == 0;
	bool all = true, any = false, all2 = false;
	int world = cohort_client_world_size(c);

	WORKER_CHECK("decide", cohort_decide(g, mine, true, &all, 30000));
	WORKER_CHECK("decide", cohort_decide(g, mine, false, &any, 30000));
	WORKER_CHECK("decide", cohort_decide(g, true, true, &all2, 30000));
	printf("RESULT decide all=%d any=%d all_true=%d\n", all, any, all2);
	return (!(all == (world == 1) && any && all2));
}

static int
scen_reduce(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int64_t r = cohort_client_rank(c);
	int64_t w = cohort_client_world_size(c);
	int64_t iv[2] = { r, r + 1 };
	double dv[2] = { (double)r * 0.5, -(double)r };
	int ok;

	WORKER_CHECK("reduce",
	    cohort_reduce_scalars(g, COHORT_I64, COHORT_SUM, iv, 2, 30000));
	WORKER_CHECK("reduce",
	    cohort_reduce_scalars(g, COHORT_F64, COHORT_MAX, dv, 2, 30000));
	ok = iv[0] == w * (w - 1) / 2 && iv[1] == w * (w + 1) / 2
	    && dv[0] == (double)(w - 1) * 0.5 && dv[1] == 0.0;
	printf(
	    "RESULT reduce sum=%" PRId64 " max=%g ok=%d\n", iv[0], dv[0], ok);
	return (!ok);
}

/* Rank 1 sets a key after rank 0 already waits for it. */
static int
scen_kvwait(cohort_client *c, const char *arg)
{
	const char *keys[] = { "released" };
	void *v = NULL;
	size_t len = 0;
	int ok = 1;

	if (cohort_client_rank(c) == 0) {
		int64_t t0 = tw_now_ms();
		WORKER_CHECK(
		    "kv_set", cohort_kv_set(c, "waiting", "1", 1, 10000));
		WORKER_CHECK("kv_wait", cohort_kv_wait(c, keys, 1, 30000));
		WORKER_CHECK(
		    "kv_get", cohort_kv_get(c, "released", &v, &len, 10000));
		ok = len == 5 && memcmp(v, "hello", 5) == 0;
		printf("RESULT kvwait waited_ms=%" PRId64 " ok=%d\n",
		    tw_now_ms() - t0, ok);
		cohort_free(v);
	} else if (cohort_client_rank(c) == 1) {
		/* get blocks until rank 0 announced it is waiting */
		WORKER_CHECK(
		    "kv_get", cohort_kv_get(c, "waiting", &v, &len, 30000));
		cohort_free(v);
		usleep(200 * 1000);
		WORKER_CHECK(
		    "kv_set", cohort_kv_set(c, "released", "hello", 5, 10000));
	}
	WORKER_CHECK(
	    "barrier", cohort_barrier(cohort_client_world(c), "end", 30000));
	return (!ok);
}

/* Every KV operation, on a job-private key space. */
static int
scen_kvops(cohort_client *c, const char *arg)
{
	int64_t v64 = 0, n = 0;
	bool swapped = false, deleted = false, present = true;
	void *cur = NULL;
	size_t len = 0;
	char key[64];
	const char *absent[] = { "never-set" };
	int r = cohort_client_rank(c);

	snprintf(key, sizeof(key), "own/%d", r);
	WORKER_CHECK("set", cohort_kv_set(c, key, "a", 1, 10000));
	WORKER_CHECK("append", cohort_kv_append(c, key, "bc", 2, 10000));
	WORKER_CHECK("get", cohort_kv_get(c, key, &cur, &len, 10000));
	WORKER_EXPECT("append", len == 3 && memcmp(cur, "abc", 3) == 0,
	    "value is not abc");
	cohort_free(cur);
	cur = NULL;
	WORKER_CHECK("cas",
	    cohort_kv_compare_set(
	        c, key, "abc", 3, "xyz", 3, &swapped, &cur, &len, 10000));
	WORKER_EXPECT("cas", swapped && len == 3 && memcmp(cur, "xyz", 3) == 0,
	    "swap did not happen");
	cohort_free(cur);
	cur = NULL;
	WORKER_CHECK("cas",
	    cohort_kv_compare_set(
	        c, key, "nope", 4, "q", 1, &swapped, NULL, NULL, 10000));
	WORKER_EXPECT("cas", !swapped, "swapped with wrong expected");
	WORKER_CHECK("add", cohort_kv_add(c, "counter", 1, &v64, 10000));
	WORKER_CHECK(
	    "barrier", cohort_barrier(cohort_client_world(c), "added", 30000));
	WORKER_CHECK("add", cohort_kv_add(c, "counter", 0, &v64, 10000));
	WORKER_EXPECT("add", v64 == cohort_client_world_size(c),
	    "counter != world size");
	WORKER_CHECK("check", cohort_kv_check(c, absent, 1, &present, 10000));
	WORKER_EXPECT("check", !present, "absent key reported present");
	WORKER_CHECK("num_keys", cohort_kv_num_keys(c, &n, 10000));
	/* own/0..w-1 and counter, at least */
	WORKER_EXPECT(
	    "num_keys", n >= cohort_client_world_size(c) + 1, "too few keys");
	WORKER_CHECK("barrier",
	    cohort_barrier(cohort_client_world(c), "counted", 30000));
	WORKER_CHECK("delete", cohort_kv_delete(c, key, &deleted, 10000));
	WORKER_EXPECT("delete", deleted, "not deleted");
	WORKER_CHECK("delete", cohort_kv_delete(c, key, &deleted, 10000));
	WORKER_EXPECT("delete", !deleted, "deleted twice");
	printf("RESULT kvops ok=1\n");
	return (0);
}

/* Sets, then waits with a short timeout for a key only another job has. */
static int
scen_kvisolate(cohort_client *c, const char *arg)
{
	const char *keys[] = { "secret" };
	void *v = NULL;
	size_t len = 0;
	cohort_status st;

	if (arg != NULL && strcmp(arg, "writer") == 0) {
		WORKER_CHECK(
		    "set", cohort_kv_set(c, "secret", "jobA", 4, 10000));
		printf("RESULT kvisolate wrote=1\n");
		return (0);
	}
	st = cohort_kv_get(c, "secret", &v, &len, 1500);
	worker_result("kvisolate_get", st, cohort_last_error());
	cohort_free(v);
	if (st != COHORT_ETIMEDOUT)
		return (1);
	st = cohort_kv_wait(c, keys, 1, 500);
	worker_result("kvisolate_wait", st, cohort_last_error());
	return (st != COHORT_ETIMEDOUT);
}

/* For bench/soak.py: ARG "KEYS:BYTES:MODE". Sets KEYS values of BYTES
 * bytes each under its rank, enters barrier "stored", then with MODE
 * "leave" closes cleanly, with "abandon" exits without a Leave (its
 * connection drops: the job fails and is abandoned). */
static int
scen_soak(cohort_client *c, const char *arg)
{
	long keys = 1, bytes = 1 << 20;
	char mode[16] = "leave", key[64];
	uint8_t *val;

	if (arg != NULL
	    && sscanf(arg, "%ld:%ld:%15s", &keys, &bytes, mode) < 2)
		return (2);
	if ((val = malloc((size_t)bytes)) == NULL)
		return (1);
	memset(val, cohort_client_rank(c) + 1, (size_t)bytes);
	for (long i = 0; i < keys; i++) {
		snprintf(
		    key, sizeof(key), "soak/%d/%ld", cohort_client_rank(c), i);
		WORKER_CHECK("kv_set",
		    cohort_kv_set(c, key, val, (size_t)bytes, 60000));
	}
	free(val);
	WORKER_CHECK("barrier",
	    cohort_barrier(cohort_client_world(c), "stored", 60000));
	printf("RESULT soak keys=%ld bytes=%ld mode=%s\n", keys, bytes, mode);
	fflush(stdout);
	if (strcmp(mode, "abandon") == 0)
		_exit(0);
	return (0);
}

/* Barriers in a loop for ARG milliseconds (default 20000; the ranks agree
 * when to stop with a decision each iteration): prints READY
 * after the first, then "RESULT barrier_for count=N max_ms=M" (the
 * slowest barrier). The pause tests stop cohortd or a rank meanwhile. */
static int
scen_barrier_for(cohort_client *c, const char *arg)
{
	int64_t t0 = tw_now_ms(), end = t0 + tw_arg(arg, 20000);
	cohort_group *g = cohort_client_world(c);
	int64_t max_ms = 0;
	long n = 0;

	WORKER_CHECK("barrier", cohort_barrier(g, "loop", 60000));
	printf("READY rank=%d pid=%d\n", cohort_client_rank(c), (int)getpid());
	fflush(stdout);
	for (;;) {
		int64_t b = tw_now_ms();
		bool more;
		/* every rank stops at the same iteration: the loop goes on
		 * while any rank's time is not over */
		WORKER_CHECK("decide",
		    cohort_decide(g, tw_now_ms() < end, false, &more, 60000));
		if (!more)
			break;
		WORKER_CHECK("barrier", cohort_barrier(g, "loop", 60000));
		if (tw_now_ms() - b > max_ms)
			max_ms = tw_now_ms() - b;
		n++;
		usleep(2000);
	}
	printf("RESULT barrier_for count=%ld max_ms=%" PRId64 "\n", n, max_ms);
	return (0);
}

/* Enters barrier "ready", prints READY, then waits in barrier "final"
 * (long timeout) and reports how it ended: the fault tests kill a rank in
 * between and expect EPEERLOST naming it. */
static int
scen_hold(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	cohort_status st;
	int64_t t0;

	WORKER_CHECK("ready", cohort_barrier(g, "ready", 60000));
	printf("READY rank=%d pid=%d\n", cohort_client_rank(c), (int)getpid());
	fflush(stdout);
	/* The victim (COHORT_TEST_VICTIM) stays out of barrier "final" until
	 * the test kills or stops it. */
	if (cohort_client_rank(c)
	    == (int)tw_arg(getenv("COHORT_TEST_VICTIM"), -1)) {
		for (int i = 0; i < 1200; i++)
			usleep(100 * 1000);
		return (4);
	}
	t0 = tw_now_ms();
	st = cohort_barrier(g, "final", (cohort_duration)tw_arg(arg, 120000));
	printf("RESULT hold status=%s ms=%" PRId64 " detail=%s\n",
	    cohort_status_name(st), tw_now_ms() - t0,
	    cohort_group_last_error(g));
	/* sticky: a later call returns the same error */
	if (st == COHORT_EPEERLOST) {
		cohort_status again = cohort_barrier(g, "after", 1000);
		printf("RESULT sticky status=%s detail=%s\n",
		    cohort_status_name(again), cohort_group_last_error(g));
	}
	fflush(stdout);
	return (st == COHORT_OK ? 0 : 3);
}

/* Every rank but the last enters a barrier with a short timeout; the last
 * stays away until they timed out. Nobody leaves before all of them timed
 * out: a rank that starts late on a loaded machine must still find the
 * others in the job, or its barrier fails with EPEERLOST for the rank that
 * left instead of timing out. */
static int
scen_timeout(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	int last = cohort_client_world_size(c) - 1;
	cohort_status st;

	if (cohort_client_rank(c) == last) {
		const char *k[] = { "timed-out-all" };
		/* wait until the others are done, then leave */
		WORKER_CHECK("wait", cohort_kv_wait(c, k, 1, 60000));
		return (0);
	}
	st = cohort_barrier(g, "short", (cohort_duration)tw_arg(arg, 1500));
	worker_result("timeout", st, cohort_last_error());
	/* the group stays usable after a timeout */
	printf("RESULT healthy=%d\n", cohort_group_is_healthy(g));
	{
		int64_t n = 0;
		WORKER_CHECK(
		    "add", cohort_kv_add(c, "timed-out", 1, &n, 10000));
		if (n == last)
			WORKER_CHECK("set",
			    cohort_kv_set(c, "timed-out-all", "1", 1, 10000));
	}
	{
		const char *k[] = { "timed-out-all" };
		WORKER_CHECK("wait-all", cohort_kv_wait(c, k, 1, 60000));
	}
	return (st == COHORT_ETIMEDOUT ? 0 : 1);
}

/* Reports its own failure with a text, then exits; the others wait in a
 * barrier and must get EPEERLOST carrying that text. */
static int
scen_report(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	cohort_status st;

	WORKER_CHECK("ready", cohort_barrier(g, "ready", 30000));
	if (cohort_client_rank(c) == 1) {
		/* Fail only once every other rank has seen "ready" complete:
		 * a failure racing with the barrier's own replies may, by
		 * design, fail the barrier too. */
		const char *k[] = { "report/all-ready" };
		WORKER_CHECK("wait", cohort_kv_wait(c, k, 1, 30000));
		WORKER_CHECK("report",
		    cohort_report_failure(c,
		        "Traceback: ValueError: loss is NaN at step 7",
		        10000));
		_exit(1);
	} else {
		int64_t n = 0;
		WORKER_CHECK(
		    "add", cohort_kv_add(c, "report/ready", 1, &n, 10000));
		if (n == cohort_client_world_size(c) - 1)
			WORKER_CHECK("set",
			    cohort_kv_set(
			        c, "report/all-ready", "1", 1, 10000));
	}
	st = cohort_barrier(g, "final", 60000);
	worker_result("report", st, cohort_group_last_error(g));
	return (st == COHORT_EPEERLOST ? 0 : 1);
}

/* Sums COHORT_TEST_VALUE + rank over the world on the data plane, and
 * prints the job this worker's environment resolved to: two launches on
 * one cohortd must each get their own job and their own sum. */
static int
scen_allreduce_env(cohort_client *c, const char *arg)
{
	cohort_group *g = cohort_client_world(c);
	double base = (double)tw_arg(getenv("COHORT_TEST_VALUE"), 0);
	double w = (double)cohort_client_world_size(c);
	double v[4], want = w * base + w * (w - 1) / 2;
	cohort_env env;
	int ok = 1;

	(void)arg;
	for (int i = 0; i < 4; i++)
		v[i] = base + (double)cohort_client_rank(c);
	WORKER_CHECK("allreduce",
	    cohort_allreduce(g, v, v, 4, COHORT_F64, COHORT_SUM, NULL, 30000));
	for (int i = 0; i < 4; i++)
		ok &= v[i] == want;
	WORKER_CHECK("env", cohort_env_resolve(&env));
	printf("RESULT allreduce job=%s source=%s rank=%d world=%d sum=%g "
	       "ok=%d\n",
	    env.job, env.source, cohort_client_rank(c),
	    cohort_client_world_size(c), v[0], ok);
	return (!ok);
}

/* Joins, prints READY, and stays a member until the file ARG exists
 * (at most 60 s), then leaves through a barrier: a running job for tests
 * that try to join it from elsewhere. */
static int
scen_hold_until(cohort_client *c, const char *arg)
{
	int64_t t0 = tw_now_ms();

	printf("READY rank=%d\n", cohort_client_rank(c));
	fflush(stdout);
	while (
	    arg != NULL && access(arg, F_OK) != 0 && tw_now_ms() - t0 < 60000)
		usleep(20 * 1000);
	WORKER_CHECK(
	    "barrier", cohort_barrier(cohort_client_world(c), "end", 30000));
	printf("RESULT hold_until ok=1\n");
	return (0);
}

/* Issues a known number of each kind of collective (metrics and timeline
 * tests, docs/observability.md): ARG all-reduces of 4 KiB, ARG/2 + 1
 * broadcasts, one all-gather on the data plane; two barriers and one
 * decision on the control plane. */
static int
scen_observe(cohort_client *c, const char *arg)
{
	long n = tw_arg(arg, 10), nb = n / 2 + 1;
	cohort_group *g = cohort_client_world(c);
	int world = cohort_client_world_size(c);
	float buf[1024];
	int32_t mine = cohort_client_rank(c), *all;
	bool dec;

	for (int i = 0; i < 1024; i++)
		buf[i] = (float)i;
	for (long i = 0; i < n; i++)
		WORKER_CHECK("allreduce",
		    cohort_allreduce(g, buf, buf, 1024, COHORT_F32, COHORT_SUM,
		        NULL, 30000));
	for (long i = 0; i < nb; i++)
		WORKER_CHECK("broadcast",
		    cohort_broadcast(
		        g, buf, 1024, COHORT_F32, 0, NULL, 30000));
	WORKER_CHECK("barrier", cohort_barrier(g, "observe-1", 30000));
	if ((all = calloc((size_t)world, sizeof(int32_t))) == NULL)
		return (1);
	WORKER_CHECK("allgather",
	    cohort_allgather(g, &mine, all, 1, COHORT_I32, NULL, 30000));
	free(all);
	WORKER_CHECK("decide", cohort_decide(g, true, true, &dec, 30000));
	WORKER_CHECK("barrier", cohort_barrier(g, "observe-2", 30000));
	printf("RESULT observe rank=%d allreduce=%ld broadcast=%ld "
	       "allgather=1 barrier=2 decide=1\n",
	    (int)mine, n, nb);
	return (0);
}

static const struct tw_scenario worker_scenarios[] = {
	{ "observe", scen_observe },
	{ "hold_until", scen_hold_until },
	{ "allreduce_env", scen_allreduce_env },
	{ "open", scen_open_close },
	{ "barrier", scen_barrier },
	{ "barrier_for", scen_barrier_for },
	{ "soak", scen_soak },
	{ "early_setup", scen_early_setup },
	{ "bcast", scen_bcast },
	{ "kvbig", scen_kvbig },
	{ "mismatch", scen_mismatch },
	{ "flood", scen_flood },
	{ "decide", scen_decide },
	{ "reduce", scen_reduce },
	{ "kvwait", scen_kvwait },
	{ "kvops", scen_kvops },
	{ "kvisolate", scen_kvisolate },
	{ "hold", scen_hold },
	{ "timeout", scen_timeout },
	{ "report", scen_report },
};

int
main(int argc, char **argv)
{
	const struct tw_scenario *sc;
	cohort_client *c = NULL;
	cohort_status st;
	int rc;

	if (argc < 2) {
		fprintf(stderr, "usage: %s SCENARIO [ARG]\n", argv[0]);
		return (2);
	}
	sc = tw_scenario_find(worker_scenarios,
	    sizeof(worker_scenarios) / sizeof(worker_scenarios[0]), argv[1]);
	if (sc == NULL) {
		fprintf(stderr, "unknown scenario %s\n", argv[1]);
		return (2);
	}
	st = cohort_client_open_env(&c, 60000);
	if (st != COHORT_OK) {
		worker_result("open", st, cohort_last_error());
		return (1);
	}
	rc = sc->fn(c, argc > 2 ? argv[2] : NULL);
	cohort_client_close(c);
	printf("RESULT exit=%d\n", rc);
	return (rc);
}
