/*
 * cohort-strategy-worker - trains the examples' MLP on a synthetic data set
 * with one of the strategies, for the suites in tests/unit/test_{ddp,hvd,
 * dp}.c.
 *
 *   cohort-strategy-worker MODE OUT [key=value ...]
 *
 * MODE local  one process, plain SGD on the global batch, no cohort call
 *             (the reference)
 *      ddp    one rank of a job (COHORT_* environment), cohort_ddp
 *      hvd    one rank of a job, cohort_hvd's gradient synchronisation
 *      dp     one process, cohort_dp with `replicas` CPU replicas
 *      fail   like ddp, but rank fail_rank reports a failure at step
 *             fail_step through cohort_ddp_on_exception and exits 3; the
 *             others print the error they got and exit 4
 *
 * OUT is where rank 0 writes its final parameters (raw float32), "-" for
 * none. Keys: steps (10), batch (per-rank micro-batch B, 16), world (for
 * local/dp: the number of ranks simulated, so the global batch is
 * world * B), accum (micro-batches per step, 1), hook (none|fp16|bf16),
 * cap / first_cap (bucket caps in bytes, 4096 / 1024), view (1), overlap
 * (1), avg_period / avg_warmup (0), lr (0.1), momentum (0), seed (7),
 * hidden (128), replicas (dp; default world), bpps (hvd
 * backward_passes_per_step; default accum), fail_rank, fail_step.
 *
 * Data: sample i of the synthetic set is a deterministic function of i
 * (inputs uniform in [0, 1), label = argmax of a fixed random linear
 * teacher), so every process builds the same set. Micro-batch b covers
 * samples [b*G, (b+1)*G) with G = world * B; rank r takes [b*G + r*B,
 * b*G + (r+1)*B).
 *
 * Prints "RESULT rank=R world=N checksum=HEX" and exits 0 on success.
 */
#include <errno.h>
#include <inttypes.h>
#include <pthread.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <unistd.h>

#include "cohort/cohort.h"
#include "ddp.h"
#include "dp.h"
#include "hvd.h"
#include "mlp.h"
#include "mlp_strategies.h"
#include "th_worker.h"

#define SW_IN 64
#define SW_OUT 10

struct sw_opts {
	const char *mode, *out, *hook;
	long steps, batch, world, accum, cap, first_cap, view, overlap;
	long avg_period, avg_warmup, seed, hidden, replicas, bpps;
	long fail_rank, fail_step;
	double lr, momentum;
};

static float
sw_unit(uint64_t h)
{
	return ((float)(h >> 40) * (1.0f / 16777216.0f));
}

/* Sample i: x[SW_IN], label. */
static void
sw_sample(size_t i, float *x, uint8_t *y)
{
	float best = -1e30f;
	int arg = 0;

	for (int k = 0; k < SW_IN; k++)
		x[k] = sw_unit(
		    tw_mix(0xda7a5e7ull ^ ((uint64_t)i << 8) ^ (uint64_t)k));
	for (int o = 0; o < SW_OUT; o++) {
		float a = 0.0f;

		for (int k = 0; k < SW_IN; k++)
			a += (sw_unit(tw_mix(0x7eac4e5ull ^ ((uint64_t)o << 16)
			          ^ (uint64_t)k))
			         - 0.5f)
			    * x[k];
		if (a > best) {
			best = a;
			arg = o;
		}
	}
	*y = (uint8_t)arg;
}

static void
sw_batch(size_t first, size_t n, float *x, uint8_t *y)
{
	for (size_t s = 0; s < n; s++)
		sw_sample(first + s, x + s * SW_IN, y + s);
}

static long
sw_long(const char *v, const char *key)
{
	char *end;
	long x;

	errno = 0;
	x = strtol(v, &end, 10);
	if (errno != 0 || end == v || *end != '\0') {
		fprintf(stderr, "bad value for %s: %s\n", key, v);
		exit(2);
	}
	return (x);
}

static void
sw_parse(int argc, char **argv, struct sw_opts *o)
{
	if (argc < 3) {
		fprintf(
		    stderr, "usage: %s MODE OUT [key=value ...]\n", argv[0]);
		exit(2);
	}
	/* the defaults; the others 0 */
	*o = (struct sw_opts) { .mode = argv[1],
		.out = argv[2],
		.hook = "none",
		.steps = 10,
		.batch = 16,
		.world = 1,
		.accum = 1,
		.cap = 4096,
		.first_cap = 1024,
		.view = 1,
		.overlap = 1,
		.seed = 7,
		.hidden = 128,
		.fail_rank = -1,
		.lr = 0.1 };
	for (int i = 3; i < argc; i++) {
		char key[32];
		const char *eq = strchr(argv[i], '=');
		size_t kl;

		if (eq == NULL
		    || (kl = (size_t)(eq - argv[i])) >= sizeof(key)) {
			fprintf(stderr, "bad argument %s\n", argv[i]);
			exit(2);
		}
		memcpy(key, argv[i], kl);
		key[kl] = '\0';
		eq++;
/* clang-format off */
#define SW_L(name)                                                            \
	if (strcmp(key, #name) == 0) {                                        \
		o->name = sw_long(eq, key);                                   \
		continue;                                                     \
	}
		SW_L(steps) SW_L(batch) SW_L(world) SW_L(accum) SW_L(cap)
		SW_L(first_cap) SW_L(view) SW_L(overlap) SW_L(avg_period)
		SW_L(avg_warmup) SW_L(seed) SW_L(hidden) SW_L(replicas)
		SW_L(bpps) SW_L(fail_rank) SW_L(fail_step)
#undef SW_L
		    /* clang-format on */
		    if (strcmp(key, "hook") == 0)
		{
			o->hook = eq;
			continue;
		}
		if (strcmp(key, "lr") == 0) {
			o->lr = strtod(eq, NULL);
			continue;
		}
		if (strcmp(key, "momentum") == 0) {
			o->momentum = strtod(eq, NULL);
			continue;
		}
		fprintf(stderr, "unknown key %s\n", key);
		exit(2);
	}
	if (o->replicas <= 0)
		o->replicas = o->world;
	if (o->bpps <= 0)
		o->bpps = o->accum;
}

static int
sw_save(const struct mlp *m, const char *path)
{
	FILE *f;
	size_t n;

	if (strcmp(path, "-") == 0)
		return (0);
	if ((f = fopen(path, "wb")) == NULL)
		return (-1);
	n = fwrite(m->params, sizeof(float), m->n_params, f);
	if (fclose(f) != 0 || n != m->n_params)
		return (-1);
	return (0);
}

static void
sw_die(const char *what, cohort_status st, const char *detail)
{
	printf("ERROR %s: %s: %s\n", what, cohort_status_name(st),
	    detail != NULL && detail[0] ? detail : cohort_last_error());
	fflush(stdout);
	exit(1);
}

/* Joins the job of the COHORT_* environment (or dies); its rank and world
 * size in *rank and *world. */
static cohort_client *
sw_join(int *rank, int *world)
{
	cohort_client *c;
	cohort_status st;

	if ((st = cohort_client_open_env(&c, 60000)) != COHORT_OK)
		sw_die("cohort_client_open_env", st, NULL);
	*rank = cohort_client_rank(c);
	*world = cohort_client_world_size(c);
	return (c);
}

/* sw_join, then m initialised from the seed and the rank: every rank
 * differently (the strategy's broadcast must make them equal). */
static cohort_client *
sw_join_model(const struct sw_opts *o, struct mlp *m, int *rank, int *world)
{
	cohort_client *c = sw_join(rank, world);

	mlp_reset(m, (uint64_t)o->seed + (uint64_t)*rank);
	return (c);
}

/* ------------------------------------------------------------------------ */
/* local: the reference                                                     */
/* ------------------------------------------------------------------------ */

static int
sw_local(const struct sw_opts *o, struct mlp *m, float *x, uint8_t *y)
{
	const size_t G = (size_t)(o->world * o->batch);

	for (long s = 0; s < o->steps; s++) {
		for (long k = 0; k < o->accum; k++) {
			size_t b = (size_t)(s * o->accum + k);

			sw_batch(b * G, G, x, y);
			if (mlp_forward(m, x, y, G, NULL, NULL) != 0)
				return (-1);
			mlp_backward(
			    m, x, y, G, 1.0f / (float)(G * (size_t)o->accum));
		}
		if (mlp_sgd_step(m, (float)o->lr, (float)o->momentum) != 0)
			return (-1);
		mlp_zero_grad(m);
	}
	printf("RESULT rank=0 world=%ld checksum=%016" PRIx64 "\n", o->world,
	    mlp_checksum(m));
	return (sw_save(m, o->out));
}

/* ------------------------------------------------------------------------ */
/* ddp                                                                      */
/* ------------------------------------------------------------------------ */

static int
sw_ddp(const struct sw_opts *o, struct mlp *m, float *x, uint8_t *y, bool fail)
{
	cohort_client *c;
	cohort_ddp *d;
	cohort_ddp_options dopt;
	cohort_ddp_param p[MLP_NPARAMS];
	cohort_status st;
	cohort_ddp_stats stats;
	int rank, world;
	size_t G, B = (size_t)o->batch;
	uint64_t sum;
	int64_t mine, *all;
	bool equal = true;

	c = sw_join_model(o, m, &rank, &world);
	G = (size_t)world * B;

	cohort_ddp_options_init(&dopt);
	dopt.bucket_cap_bytes = (size_t)o->cap;
	dopt.first_bucket_cap_bytes = (size_t)o->first_cap;
	dopt.gradient_as_bucket_view = o->view != 0;
	dopt.overlap = o->overlap != 0;
	dopt.model_averaging_period = (int)o->avg_period;
	dopt.model_averaging_warmup = (int)o->avg_warmup;
	dopt.timeout = 60000;
	if ((dopt.hook = cohort_ddp_hook_by_name(o->hook)) == NULL) {
		fprintf(stderr, "unknown hook %s\n", o->hook);
		return (-1);
	}
	mlp_ddp_params(m, p);
	if ((st = cohort_ddp_new(c, NULL, p, MLP_NPARAMS, &dopt, &d))
	    != COHORT_OK)
		sw_die("cohort_ddp_new", st, NULL);
	mlp_set_grad_ready(m, mlp_ddp_grad_ready, d);
	cohort_ddp_get_stats(d, &stats);
	if (rank == 0)
		printf("INFO buckets=%d\n", stats.nbuckets);

	for (long s = 0; s < o->steps; s++) {
		if (fail && rank == o->fail_rank && s == o->fail_step) {
			char text[128];

			snprintf(text, sizeof(text),
			    "injected failure at step %ld", s);
			cohort_ddp_on_exception(d, text);
			printf("FAILED %s\n", text);
			fflush(stdout);
			exit(3);
		}
		for (long k = 0; k < o->accum; k++) {
			size_t b = (size_t)(s * o->accum + k);

			if (k < o->accum - 1)
				cohort_ddp_no_sync_begin(d);
			else
				cohort_ddp_no_sync_end(d);
			sw_batch(b * G + (size_t)rank * B, B, x, y);
			if (mlp_forward(m, x, y, B, NULL, NULL) != 0)
				return (-1);
			mlp_backward(
			    m, x, y, B, 1.0f / (float)(B * (size_t)o->accum));
			if (k < o->accum - 1
			    && (st = cohort_ddp_sync(d)) != COHORT_OK)
				sw_die("cohort_ddp_sync (no_sync)", st,
				    cohort_ddp_last_error(d));
		}
		if ((st = cohort_ddp_sync(d)) != COHORT_OK) {
			if (fail) {
				printf("PEERLOST %s %s\n",
				    cohort_status_name(st),
				    cohort_ddp_last_error(d));
				fflush(stdout);
				exit(4);
			}
			sw_die(
			    "cohort_ddp_sync", st, cohort_ddp_last_error(d));
		}
		if (mlp_sgd_step(m, (float)o->lr, (float)o->momentum) != 0)
			return (-1);
		mlp_zero_grad(m);
		if ((st = cohort_ddp_after_step(d)) != COHORT_OK)
			sw_die("cohort_ddp_after_step", st,
			    cohort_ddp_last_error(d));
	}
	cohort_ddp_get_stats(d, &stats);
	sum = mlp_checksum(m);
	memcpy(&mine, &sum, sizeof(mine));
	if ((all = calloc((size_t)world, sizeof(int64_t))) == NULL)
		return (-1);
	if ((st = cohort_ddp_all_gather(d, &mine, all, 1, COHORT_I64))
	    != COHORT_OK)
		sw_die("all_gather", st, cohort_ddp_last_error(d));
	for (int r = 0; r < world; r++)
		equal = equal && all[r] == all[0];
	free(all);
	printf("RESULT rank=%d world=%d checksum=%016" PRIx64
	       " equal=%d buckets=%d overlapped=%" PRIu64 "/%" PRIu64 "\n",
	    rank, world, sum, equal ? 1 : 0, stats.nbuckets,
	    stats.buckets_overlapped, stats.buckets_started);
	if (rank == 0 && sw_save(m, o->out) != 0)
		return (-1);
	mlp_set_grad_ready(m, NULL, NULL);
	cohort_ddp_free(d);
	cohort_client_close(c);
	return (equal ? 0 : -1);
}

/* ------------------------------------------------------------------------ */
/* hvd                                                                      */
/* ------------------------------------------------------------------------ */

static int
sw_hvd(const struct sw_opts *o, struct mlp *m, float *x, uint8_t *y)
{
	cohort_client *c;
	cohort_hvd *h;
	cohort_hvd_options hopt;
	cohort_hvd_stats hs;
	cohort_ddp_param p[MLP_NPARAMS];
	cohort_status st;
	int rank, world;
	size_t G, B = (size_t)o->batch;
	long steps_done = 0;

	c = sw_join_model(o, m, &rank, &world);
	G = (size_t)world * B;
	cohort_hvd_options_init(&hopt);
	hopt.backward_passes_per_step = (int)o->bpps;
	hopt.fusion_threshold_bytes = (size_t)o->cap;
	hopt.timeout = 60000;
	if ((st = cohort_hvd_new(c, &hopt, &h)) != COHORT_OK)
		sw_die("cohort_hvd_new", st, NULL);
	mlp_ddp_params(m, p);
	if ((st = cohort_hvd_register_params(h, p, MLP_NPARAMS)) != COHORT_OK
	    || (st = cohort_hvd_broadcast_parameters(h, 0)) != COHORT_OK)
		sw_die("hvd parameters", st, cohort_hvd_last_error(h));
	mlp_set_grad_ready(m, mlp_hvd_grad_ready, h);
	/* One backward pass per micro-batch; hvd decides when to step. */
	for (long b = 0; b < o->steps * o->accum; b++) {
		bool do_step;

		sw_batch((size_t)b * G + (size_t)rank * B, B, x, y);
		if (mlp_forward(m, x, y, B, NULL, NULL) != 0)
			return (-1);
		mlp_backward(m, x, y, B, 1.0f / (float)(B * (size_t)o->accum));
		if ((st = cohort_hvd_step_sync(h, &do_step)) != COHORT_OK)
			sw_die("cohort_hvd_step_sync", st,
			    cohort_hvd_last_error(h));
		if (!do_step)
			continue;
		if (mlp_sgd_step(m, (float)o->lr, (float)o->momentum) != 0)
			return (-1);
		mlp_zero_grad(m);
		steps_done++;
	}
	cohort_hvd_get_stats(h, &hs);
	printf("RESULT rank=%d world=%d checksum=%016" PRIx64
	       " steps=%ld cycles=%" PRIu64 " idle=%" PRIu64
	       " tensors=%" PRIu64 " allreduce_calls=%" PRIu64
	       " fused=%" PRIu64 "\n",
	    rank, world, mlp_checksum(m), steps_done, hs.cycles,
	    hs.idle_cycles, hs.tensors, hs.allreduce_calls, hs.fused_tensors);
	if (rank == 0 && sw_save(m, o->out) != 0)
		return (-1);
	mlp_set_grad_ready(m, NULL, NULL);
	cohort_hvd_free(h);
	cohort_client_close(c);
	return (0);
}

/* ------------------------------------------------------------------------ */
/* dp                                                                       */
/* ------------------------------------------------------------------------ */

struct sw_dp_batch {
	const float *x;
	const uint8_t *y;
};

static int
sw_dp_fb(
    void *model, int replica, size_t begin, size_t end, float scale, void *arg)
{
	struct sw_dp_batch *b = arg;
	struct mlp *m = model;
	size_t n = end - begin;

	(void)replica;
	if (mlp_forward(m, b->x + begin * SW_IN, b->y + begin, n, NULL, NULL)
	    != 0)
		return (-1);
	mlp_backward(m, b->x + begin * SW_IN, b->y + begin, n, scale);
	return (0);
}

static int
sw_dp_step(void *model, void *arg)
{
	const struct sw_opts *o = arg;

	return (mlp_sgd_step(model, (float)o->lr, (float)o->momentum));
}

static int
sw_dp(const struct sw_opts *o, struct mlp *m, float *x, uint8_t *y)
{
	const size_t G = (size_t)(o->world * o->batch);
	const int K = (int)o->replicas;
	struct mlp *reps;
	cohort_dp_replica *rd;
	cohort_dp *dp;
	cohort_status st;
	struct sw_dp_batch batch = { x, y };

	reps = calloc((size_t)K, sizeof(*reps));
	rd = calloc((size_t)K, sizeof(*rd));
	if (reps == NULL || rd == NULL)
		return (-1);
	for (int k = 0; k < K; k++) {
		if (k == 0)
			reps[0] = *m;
		else if (mlp_init(&reps[k], SW_IN, (int)o->hidden, SW_OUT,
		             (uint64_t)o->seed + 1000u + (uint64_t)k)
		    != 0)
			return (-1);
		rd[k].model = &reps[k];
		rd[k].params = reps[k].params;
		rd[k].grads = reps[k].grads;
	}
	if ((st = cohort_dp_new(rd, K, m->n_params, &dp)) != COHORT_OK)
		sw_die("cohort_dp_new", st, NULL);
	for (long s = 0; s < o->steps; s++) {
		for (long k = 0; k < o->accum; k++) {
			size_t b = (size_t)(s * o->accum + k);

			sw_batch(b * G, G, x, y);
			/* scale 1/G from dp; accumulation divides again. */
			if ((st = cohort_dp_forward_backward(
			         dp, G, sw_dp_fb, &batch))
			    != COHORT_OK)
				sw_die("forward_backward", st,
				    cohort_dp_last_error(dp));
		}
		if (o->accum > 1) {
			cohort_dp_reduce_gradients(dp);
			for (size_t i = 0; i < m->n_params; i++)
				reps[0].grads[i] /= (float)o->accum;
		}
		if ((st = cohort_dp_step(dp, sw_dp_step, (void *)o))
		    != COHORT_OK)
			sw_die("cohort_dp_step", st, cohort_dp_last_error(dp));
	}
	*m = reps[0];
	printf("RESULT rank=0 world=%ld replicas=%d checksum=%016" PRIx64 "\n",
	    o->world, K, mlp_checksum(m));
	cohort_dp_free(dp);
	for (int k = 1; k < K; k++)
		mlp_fini(&reps[k]);
	free(reps);
	free(rd);
	return (sw_save(m, o->out));
}

/* ------------------------------------------------------------------------ */
/* hvdapi: the named collectives themselves                                 */
/* ------------------------------------------------------------------------ */

#define SW_CHECK(cond, ...)                                                   \
	do {                                                                  \
		if (!(cond)) {                                                \
			printf("CHECK FAILED line %d: ", __LINE__);           \
			printf(__VA_ARGS__);                                  \
			printf("\n");                                         \
			fflush(stdout);                                       \
			exit(1);                                              \
		}                                                             \
	} while (0)

struct sw_thr {
	cohort_hvd *h;
	int t, rank, world;
};

#define SW_NT 24

/* Each of 2 threads submits SW_NT all-reduces, in an order that differs
 * between ranks, then waits for all. */
static void *
sw_hvd_thread(void *arg)
{
	struct sw_thr *a = arg;
	cohort_hvd_handle *hd[SW_NT];
	double v[SW_NT][5];

	for (int j = 0; j < SW_NT; j++) {
		int i = a->rank % 2 ? SW_NT - 1 - j : j;
		char name[64];
		cohort_status st;

		for (int e = 0; e < 5; e++)
			v[i][e] = (double)(a->rank + 1) * (i + e + 10 * a->t);
		snprintf(name, sizeof(name), "thread%d.tensor%d", a->t, i);
		st = cohort_hvd_allreduce_async(
		    a->h, name, v[i], v[i], 5, COHORT_F64, COHORT_SUM, &hd[i]);
		SW_CHECK(st == COHORT_OK, "submit %s: %s", name,
		    cohort_status_name(st));
	}
	for (int i = 0; i < SW_NT; i++) {
		cohort_status st = cohort_hvd_synchronize(hd[i], 30000);
		double ranks = (double)a->world * (a->world + 1) / 2.0;

		SW_CHECK(st == COHORT_OK, "sync: %s", cohort_status_name(st));
		for (int e = 0; e < 5; e++)
			SW_CHECK(v[i][e] == ranks * (i + e + 10 * a->t),
			    "thread %d tensor %d: %g", a->t, i, v[i][e]);
	}
	return (NULL);
}

static int
sw_hvdapi(void)
{
	cohort_client *c;
	cohort_hvd *h;
	cohort_hvd_options hopt;
	cohort_hvd_handle *hd, *hd2;
	cohort_hvd_stats hs;
	cohort_status st;
	struct sw_thr ta[2];
	pthread_t th[2];
	int rank, world;

	c = sw_join(&rank, &world);
	cohort_hvd_options_init(&hopt);
	hopt.stall_check_ms = 300;
	hopt.timeout = 30000;
	if ((st = cohort_hvd_new(c, &hopt, &h)) != COHORT_OK)
		sw_die("cohort_hvd_new", st, NULL);

	/* Two threads, different orders on different ranks. */
	for (int t = 0; t < 2; t++) {
		ta[t].h = h;
		ta[t].t = t;
		ta[t].rank = rank;
		ta[t].world = world;
		pthread_create(&th[t], NULL, sw_hvd_thread, &ta[t]);
	}
	for (int t = 0; t < 2; t++)
		pthread_join(th[t], NULL);
	cohort_hvd_get_stats(h, &hs);
	printf("THREADS ok allreduce_calls=%" PRIu64 " fused=%" PRIu64 "\n",
	    hs.allreduce_calls, hs.fused_tensors);

	/* All-gather with unequal counts: rank r gives r + 1 values r. */
	{
		int32_t mine[64];
		const int32_t *out;
		size_t n, k = 0;

		for (int i = 0; i <= rank; i++)
			mine[i] = rank;
		st = cohort_hvd_allgather_async(
		    h, "gather", mine, (size_t)rank + 1, COHORT_I32, &hd);
		SW_CHECK(st == COHORT_OK, "allgather submit");
		SW_CHECK(cohort_hvd_wait(hd, 30000) == COHORT_OK, "allgather");
		SW_CHECK(cohort_hvd_output(hd, (const void **)&out, &n)
		        == COHORT_OK,
		    "output");
		SW_CHECK(n == (size_t)world * (world + 1) / 2, "count %zu", n);
		for (int r = 0; r < world; r++)
			for (int i = 0; i <= r; i++)
				SW_CHECK(out[k++] == r, "gather[%zu]", k - 1);
		cohort_hvd_release(hd);
		printf("ALLGATHER ok\n");
	}
	/* Broadcast from the last rank. */
	{
		float b[3] = { (float)rank, (float)rank, (float)rank };

		st = cohort_hvd_broadcast_async(
		    h, "bcast", b, 3, COHORT_F32, world - 1, &hd);
		SW_CHECK(st == COHORT_OK, "bcast submit");
		SW_CHECK(cohort_hvd_synchronize(hd, 30000) == COHORT_OK, "bc");
		SW_CHECK(b[2] == (float)(world - 1), "bcast value %g",
		    (double)b[2]);
		printf("BROADCAST ok\n");
	}
	/* A duplicate in-flight name; rank 0's first "dup" waits for the
	 * others, which submit late. */
	{
		double d = 1.0;

		if (rank != 0)
			usleep(300000);
		st = cohort_hvd_allreduce_async(
		    h, "dup", &d, &d, 1, COHORT_F64, COHORT_SUM, &hd);
		SW_CHECK(st == COHORT_OK, "dup submit");
		if (rank == 0) {
			st = cohort_hvd_allreduce_async(
			    h, "dup", &d, &d, 1, COHORT_F64, COHORT_SUM, &hd2);
			SW_CHECK(st == COHORT_EEXIST, "second dup: %s",
			    cohort_status_name(st));
		}
		SW_CHECK(
		    cohort_hvd_synchronize(hd, 30000) == COHORT_OK, "dup");
		SW_CHECK(d == (double)world, "dup value");
		printf("DUPLICATE ok\n");
	}
	/* Mismatched counts fail on every rank. */
	{
		double d[2] = { 1, 1 };

		st = cohort_hvd_allreduce_async(h, "mismatch", d, d,
		    rank == 0 ? 2 : 1, COHORT_F64, COHORT_SUM, &hd);
		SW_CHECK(st == COHORT_OK, "mismatch submit");
		st = cohort_hvd_synchronize(hd, 30000);
		SW_CHECK(st == COHORT_EMISMATCH, "mismatch: %s",
		    cohort_status_name(st));
		SW_CHECK(strstr(cohort_hvd_last_error(h), "'mismatch'") != NULL
		        && strstr(cohort_hvd_last_error(h), "[2,1") != NULL,
		    "mismatch detail: '%s'", cohort_hvd_last_error(h));
		printf("MISMATCH ok\n");
	}
	/* Stall: the last rank submits "late" 1.5 s after the others. */
	{
		double d = 1.0;
		char rep[1024];

		if (rank == world - 1)
			usleep(1500000);
		st = cohort_hvd_allreduce_async(
		    h, "late", &d, &d, 1, COHORT_F64, COHORT_SUM, &hd);
		SW_CHECK(st == COHORT_OK, "late submit");
		if (rank == 0) {
			usleep(1000000);
			cohort_hvd_stall_report(h, rep, sizeof(rep));
			printf("STALL %s", rep);
		}
		SW_CHECK(
		    cohort_hvd_synchronize(hd, 30000) == COHORT_OK, "late");
	}
	cohort_hvd_get_stats(h, &hs);
	printf("RESULT rank=%d cycles=%" PRIu64 " idle=%" PRIu64
	       " tensors=%" PRIu64 "\n",
	    rank, hs.cycles, hs.idle_cycles, hs.tensors);
	cohort_hvd_free(h);
	cohort_client_close(c);
	return (0);
}

/* hvddie: the last rank leaves abruptly (no Leave) after one round; the
 * others' next submission must fail with EPEERLOST naming it, promptly,
 * not at the 60 s timeout. */
static int
sw_hvddie(void)
{
	cohort_client *c;
	cohort_hvd *h;
	cohort_hvd_options hopt;
	cohort_hvd_handle *hd;
	cohort_status st;
	double d = 1.0;
	int rank, world;
	struct timespec t0, t1;

	c = sw_join(&rank, &world);
	cohort_hvd_options_init(&hopt);
	hopt.timeout = 60000;
	if ((st = cohort_hvd_new(c, &hopt, &h)) != COHORT_OK)
		sw_die("cohort_hvd_new", st, NULL);
	st = cohort_hvd_allreduce_async(
	    h, "first", &d, &d, 1, COHORT_F64, COHORT_SUM, &hd);
	SW_CHECK(
	    st == COHORT_OK && cohort_hvd_synchronize(hd, 30000) == COHORT_OK,
	    "first round");
	if (rank == world - 1)
		_exit(0); /* no Leave: the others see the connection drop */
	clock_gettime(CLOCK_MONOTONIC, &t0);
	st = cohort_hvd_allreduce_async(
	    h, "second", &d, &d, 1, COHORT_F64, COHORT_SUM, &hd);
	if (st == COHORT_OK)
		st = cohort_hvd_synchronize(hd, 60000);
	clock_gettime(CLOCK_MONOTONIC, &t1);
	SW_CHECK(st == COHORT_EPEERLOST, "second round: %s (%s)",
	    cohort_status_name(st), cohort_hvd_last_error(h));
	SW_CHECK(strstr(cohort_hvd_last_error(h), "rank 2") != NULL,
	    "detail does not name rank 2: %s", cohort_hvd_last_error(h));
	printf("PEERLOST after %.0f ms: %s\n",
	    (double)(t1.tv_sec - t0.tv_sec) * 1e3
	        + (double)(t1.tv_nsec - t0.tv_nsec) / 1e6,
	    cohort_hvd_last_error(h));
	cohort_hvd_free(h);
	cohort_client_close(c);
	return (0);
}

int
main(int argc, char **argv)
{
	struct sw_opts o;
	struct mlp m;
	float *x;
	uint8_t *y;
	size_t cap;
	int rc = -1;

	sw_parse(argc, argv, &o);
	setvbuf(stdout, NULL, _IOLBF, 0);
	if (mlp_init(&m, SW_IN, (int)o.hidden, SW_OUT, (uint64_t)o.seed) != 0)
		return (1);
	cap = (size_t)(o.world * o.batch);
	if (cap < (size_t)o.batch)
		cap = (size_t)o.batch;
	x = calloc(cap * SW_IN, sizeof(float));
	y = calloc(cap, 1);
	if (x == NULL || y == NULL)
		return (1);
	if (strcmp(o.mode, "local") == 0)
		rc = sw_local(&o, &m, x, y);
	else if (strcmp(o.mode, "ddp") == 0)
		rc = sw_ddp(&o, &m, x, y, false);
	else if (strcmp(o.mode, "hvd") == 0)
		rc = sw_hvd(&o, &m, x, y);
	else if (strcmp(o.mode, "hvdapi") == 0)
		rc = sw_hvdapi();
	else if (strcmp(o.mode, "hvddie") == 0)
		rc = sw_hvddie();
	else if (strcmp(o.mode, "dp") == 0)
		rc = sw_dp(&o, &m, x, y);
	else if (strcmp(o.mode, "fail") == 0)
		rc = sw_ddp(&o, &m, x, y, true);
	else
		fprintf(stderr, "unknown mode %s\n", o.mode);
	free(x);
	free(y);
	mlp_fini(&m);
	return (rc == 0 ? 0 : 1);
}
