/*
 * mpi_allreduce: Open MPI peer for `bench/compare` (issue 3).
 *
 * Times MPI_Allreduce(MPI_IN_PLACE, float32, MPI_SUM) per size and prints,
 * on rank 0, one JSON object per size in the schema of `cohort bench --json`:
 *   {"impl":"mpi","algo":"tcp","ranks":2,"size":1048576,"count":262144,
 *    "dtype":"f32","op":"sum","time_us":..,"first_us":..,"algbw":..,
 *    "busbw":..,"iters":..,"warmup":..}
 * time_us = slowest rank's loop time / iters after warmup; first_us = the
 * slowest rank's first call at that size (for the first size this includes
 * Open MPI's lazy connection setup); algbw = size / time in GB/s (1e9 B/s);
 * busbw = algbw * 2(n-1)/n. The "algo" field is the --label given (the
 * transport the caller selected with --mca btl ..., e.g. tcp, shm).
 *
 * Usage: mpirun -n N [--mca ...] mpi_allreduce [--sizes S1,S2,..]
 *          [--iters I1,I2,..] [--warmup W1,..] [--label NAME]
 * Sizes in bytes (K/M/G suffixes allowed); --iters/--warmup take one value
 * for all sizes or one per size.
 */
#include <mpi.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>

#define MAX_SIZES 64

static size_t
parse_size(const char* s)
{
	char* end = NULL;
	double v = strtod(s, &end);
	if (end == s) {
		fprintf(stderr, "mpi_allreduce: bad size '%s'\n", s);
		exit(2);
	}
	switch (*end) {
	case 'k':
	case 'K':
		v *= 1024;
		break;
	case 'm':
	case 'M':
		v *= 1024 * 1024;
		break;
	case 'g':
	case 'G':
		v *= 1024.0 * 1024 * 1024;
		break;
	default:
		break;
	}
	return (size_t)v;
}

/* Splits a comma list into out[]; returns the count. */
static int
parse_list(const char* arg, long* out, int is_size)
{
	char buf[1024];
	int n = 0;
	snprintf(buf, sizeof buf, "%s", arg);
	char* save = NULL;
	for (char* t = strtok_r(buf, ",", &save); t && n < MAX_SIZES;
	     t = strtok_r(NULL, ",", &save))
		out[n++] = is_size ? (long)parse_size(t) : atol(t);
	return n;
}

static long
per_size(const long* v, int nv, int i, long dflt)
{
	if (nv == 0)
		return dflt;
	if (nv == 1)
		return v[0];
	return i < nv ? v[i] : v[nv - 1];
}

static void
usage(void)
{
	fprintf(stderr,
	    "usage: mpi_allreduce [--sizes S,..] [--iters I,..] "
	    "[--warmup W,..] [--target-ms T] [--label NAME]\n");
	exit(2);
}

int
main(int argc, char** argv)
{
	long sizes[MAX_SIZES] = { 4096, 65536, 1 << 20, 16 << 20, 64 << 20 };
	int nsizes = 5;
	long iters_v[MAX_SIZES], warm_v[MAX_SIZES];
	int niters = 0, nwarm = 0;
	const char* label = "default";
	double target_ms = 300; /* used when --iters is not given */

	MPI_Init(&argc, &argv);
	for (int i = 1; i < argc; i++) {
		if (i + 1 >= argc)
			usage();
		if (!strcmp(argv[i], "--sizes"))
			nsizes = parse_list(argv[++i], sizes, 1);
		else if (!strcmp(argv[i], "--iters"))
			niters = parse_list(argv[++i], iters_v, 0);
		else if (!strcmp(argv[i], "--warmup"))
			nwarm = parse_list(argv[++i], warm_v, 0);
		else if (!strcmp(argv[i], "--target-ms"))
			target_ms = atof(argv[++i]);
		else if (!strcmp(argv[i], "--label"))
			label = argv[++i];
		else
			usage();
	}
	if (nsizes < 1)
		usage();

	int rank = 0, n = 1;
	MPI_Comm_rank(MPI_COMM_WORLD, &rank);
	MPI_Comm_size(MPI_COMM_WORLD, &n);

	size_t max_bytes = 0;
	for (int i = 0; i < nsizes; i++)
		if ((size_t)sizes[i] > max_bytes)
			max_bytes = (size_t)sizes[i];
	size_t max_count = max_bytes / sizeof(float);
	/* Persistent buffer, allocated once, touched before any timing. */
	float* buf = malloc((max_count ? max_count : 1) * sizeof(float));
	if (!buf) {
		fprintf(stderr, "mpi_allreduce: out of memory\n");
		MPI_Abort(MPI_COMM_WORLD, 1);
	}
	for (size_t k = 0; k < max_count; k++)
		buf[k] = 0.0f;
	const float expect = (float)(n * (n + 1) / 2);
	int failures = 0;

	for (int si = 0; si < nsizes; si++) {
		size_t bytes = (size_t)sizes[si];
		int count = (int)(bytes / sizeof(float));
		/* Fixed counts when --iters is given, else calibrated so the
		 * timed loop takes about --target-ms. */
		long fixed_iters = per_size(iters_v, niters, si, 0);
		long min_warm = per_size(warm_v, nwarm, si, 2);

		for (int k = 0; k < count; k++)
			buf[k] = (float)(rank + 1);
		MPI_Barrier(MPI_COMM_WORLD);
		double t0 = MPI_Wtime();
		MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT, MPI_SUM,
		    MPI_COMM_WORLD);
		double first = MPI_Wtime() - t0;
		int ok = 1;
		size_t step = count / 64 ? (size_t)count / 64 : 1;
		for (size_t k = 0; k < (size_t)count; k += step)
			if (buf[k] != expect)
				ok = 0;
		if (count > 0 && buf[count - 1] != expect)
			ok = 0;
		/* Warmup in batches 1,1,2,4,.. (the first call counts) until
		 * --warmup calls are done and, when calibrating, a fifth of
		 * the target time has passed. Ranks agree on the slowest
		 * rank's batch time, hence on the iteration count. */
		int calibrate = fixed_iters <= 0;
		long warm = 1, batch = 1;
		double est = first, spent = 0;
		for (int k = 0;; k++) {
			int enough = warm >= min_warm
			    && (!calibrate
			        || (k > 0 && spent * 1e3 >= target_ms / 5));
			if (enough)
				break;
			double b0 = MPI_Wtime();
			for (long w = 0; w < batch; w++)
				MPI_Allreduce(MPI_IN_PLACE, buf, count,
				    MPI_FLOAT, MPI_SUM, MPI_COMM_WORLD);
			double bt = MPI_Wtime() - b0, btmax;
			MPI_Allreduce(&bt, &btmax, 1, MPI_DOUBLE, MPI_MAX,
			    MPI_COMM_WORLD);
			spent += btmax;
			est = btmax / (double)batch;
			warm += batch;
			if (k > 0)
				batch *= 2;
		}
		long iters = fixed_iters;
		if (iters <= 0) {
			double want
			    = target_ms * 1e-3 / (est > 1e-8 ? est : 1e-8);
			if (want < 3)
				want = 3;
			if (want > 1e6)
				want = 1e6;
			iters = (long)(want + 0.999);
		}
		MPI_Barrier(MPI_COMM_WORLD);
		t0 = MPI_Wtime();
		for (long it = 0; it < iters; it++)
			MPI_Allreduce(MPI_IN_PLACE, buf, count, MPI_FLOAT,
			    MPI_SUM, MPI_COMM_WORLD);
		double loop = MPI_Wtime() - t0;
		double res[3] = { loop, first, ok ? 0.0 : 1.0 }, mx[3];
		MPI_Reduce(res, mx, 3, MPI_DOUBLE, MPI_MAX, 0, MPI_COMM_WORLD);
		if (rank == 0) {
			double t = mx[0] * 1e6 / (double)iters;
			double algbw = t > 0 ? (double)bytes / (t * 1e3) : 0.0;
			double busbw = algbw * 2.0 * (n - 1) / n;
			if (mx[2] != 0.0)
				failures++;
			printf(
			    "{\"impl\":\"mpi\",\"algo\":\"%s\",\"ranks\":%d,"
			    "\"size\":%zu,\"count\":%d,\"dtype\":\"f32\","
			    "\"op\":\"sum\",\"time_us\":%.3f,"
			    "\"first_us\":%.3f,\"algbw\":%.4f,"
			    "\"busbw\":%.4f,\"iters\":%ld,\"warmup\":%ld,"
			    "\"correct\":%s}\n",
			    label, n, bytes, count, t, mx[1] * 1e6, algbw,
			    busbw, iters, warm,
			    mx[2] == 0.0 ? "true" : "false");
			fflush(stdout);
		}
	}
	free(buf);
	MPI_Finalize();
	return failures ? 1 : 0;
}
