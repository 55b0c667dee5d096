/*
 * test_nccl_p2p.c - the nccl backend's point-to-point and alltoallv
 * (client/backend/nccl/nccl.c, backend.h v3).
 *
 * suite_nccl_p2p:
 *  - always: the ops table offers point-to-point on the group's
 *    communicator (p2p_needs_state), and p2p_open without it says so;
 *  - with two GPUs (else one "SKIP nccl point-to-point: ..." line): two
 *    ranks in two processes, one GPU each, exchange device buffers with a
 *    batch (send and receive in one NCCL group, both ways) and run an
 *    uneven alltoallv, checked against the host values; a receive from
 *    any rank is COHORT_ENOTSUP (NCCL has none).
 * NCCL refuses two ranks of a communicator on one GPU, so one GPU is not
 * enough for any of the point-to-point paths.
 */
#include <check.h>
#include <stdatomic.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/wait.h>
#include <unistd.h>

#include "backend/backend.h"
#include "backend/nccl/nccl_impl.h"
#include "check_cohort.h"
#include "th_op.h"
#include "../unit/fs_store.h"

#define NP_ERRLEN 512

START_TEST(test_nccl_p2p_on_the_groups_communicator)
{
	const struct cohort__backend_ops *ops = &cohort__nccl_backend;
	struct cohort__group_desc d;
	char err[NP_ERRLEN] = "";
	void *p2p = NULL;

	ck_assert_uint_eq(ops->version, COHORT__BACKEND_VERSION);
	ck_assert(ops->p2p_open != NULL && ops->p2p_post != NULL
	    && ops->p2p_abort != NULL && ops->p2p_close != NULL);
	ck_assert(ops->p2p_needs_state);
	memset(&d, 0, sizeof(d));
	d.rank = 0;
	d.size = 2;
	ck_assert_cohort_err(ops->p2p_open(&d, NULL, &p2p, err, sizeof(err),
	                         cohort__now_ms() + 1000),
	    COHORT_ESTATE);
	ck_assert_msg(strstr(err, "communicator") != NULL, "%s", err);
	ck_assert_ptr_null(p2p);
}
END_TEST

struct np_done {
	atomic_int n;
};

static void
np_done(struct cohort__p2p *p)
{
	atomic_fetch_add(&((struct np_done *)p->ctx)->n, 1);
}

/* One rank of the two-GPU test (its own process); its exit code. */
static int
np_rank(const char *dir, int rank)
{
	static const int32_t granks[2] = { 0, 1 };
	const struct cohort__dl_cudart *cu;
	const struct cohort__backend_ops *ops = &cohort__nccl_backend;
	struct cohort__group_desc d;
	struct fs_store fs;
	atomic_int flag;
	void *state = NULL, *p2p = NULL;
	char err[NP_ERRLEN] = "";
	size_t n = 1u << 20;
	float *h = malloc(n * sizeof(float)), *ds = NULL, *dr = NULL;
	struct cohort__p2p req[2], *reqs[2] = { &req[0], &req[1] };
	struct np_done done;
	int peer = 1 - rank;

	if (cohort__dl_cudart_get(&cu, err, sizeof(err)) != COHORT_OK
	    || cu->SetDevice(rank) != 0)
		return (10);
	snprintf(fs.dir, sizeof(fs.dir), "%s", dir);
	atomic_init(&flag, 0);
	fs_store_desc(&d, &fs, "test", "np", rank, 2, granks);
	d.abort_flag = &flag;
	if (ops->init(&d, &state, err, sizeof(err), cohort__now_ms() + 60000)
	        != COHORT_OK
	    || ops->p2p_open(
	           &d, state, &p2p, err, sizeof(err), cohort__now_ms() + 10000)
	        != COHORT_OK) {
		fprintf(stderr, "rank %d: %s\n", rank, err);
		return (11);
	}
	for (size_t i = 0; i < n; i++)
		h[i] = (float)(rank * 1000 + (int)(i % 1000));
	if (cu->Malloc((void **)&ds, n * sizeof(float)) != 0
	    || cu->Malloc((void **)&dr, n * sizeof(float)) != 0
	    || cu->Memcpy(ds, h, n * sizeof(float), 4) != 0)
		return (12);
	/* Both ways in one batch: a send and a receive per rank. */
	atomic_init(&done.n, 0);
	for (int k = 0; k < 2; k++) {
		memset(&req[k], 0, sizeof(req[k]));
		req[k].kind = k == 0 ? COHORT__OP_SEND : COHORT__OP_RECV;
		req[k].peer = peer;
		req[k].buf = k == 0 ? ds : dr;
		req[k].count = n;
		req[k].dtype = COHORT_F32;
		req[k].bytes = n * sizeof(float);
		req[k].deadline = cohort__now_ms() + 60000;
		req[k].done = np_done;
		req[k].ctx = &done;
	}
	if (ops->p2p_post(p2p, reqs, 2, err, sizeof(err)) != COHORT_OK) {
		fprintf(stderr, "rank %d: post: %s\n", rank, err);
		return (13);
	}
	while (atomic_load(&done.n) < 2)
		usleep(1000);
	if (req[0].st != COHORT_OK || req[1].st != COHORT_OK) {
		fprintf(stderr, "rank %d: %s / %s\n", rank, req[0].err,
		    req[1].err);
		return (14);
	}
	if (cu->Memcpy(h, dr, n * sizeof(float), 4) != 0)
		return (15);
	for (size_t i = 0; i < n; i++)
		if (h[i] != (float)(peer * 1000 + (int)(i % 1000)))
			return (16);
	/* alltoallv: rank q sends q + 1 + j elements to j, at the back
	 * of ds first; they land in dr in rank order. */
	{
		size_t sc[2], sd[2], rc[2], rd[2];
		struct cohort__op op;

		for (int j = 0; j < 2; j++) {
			sc[j] = (size_t)(rank + 1 + j);
			rc[j] = (size_t)(j + 1 + rank);
		}
		sd[1] = 0;
		sd[0] = sc[1];
		rd[0] = 0;
		rd[1] = rc[0];
		th_op_alltoallv(&op, ds, dr, COHORT_F32, sc, sd, rc, rd, 1);
		if (ops->run(
		        state, &op, err, sizeof(err), cohort__now_ms() + 60000)
		    != COHORT_OK) {
			fprintf(stderr, "rank %d: alltoallv: %s\n", rank, err);
			return (18);
		}
		if (cu->Memcpy(h, dr, (rc[0] + rc[1]) * sizeof(float), 4) != 0)
			return (19);
		for (int q = 0; q < 2; q++) {
			/* q's block for us sat at sd[rank] of q's ds */
			size_t qsd = rank == 1 ? 0 : (size_t)(q + 2);

			for (size_t i = 0; i < rc[q]; i++)
				if (h[rd[q] + i]
				    != (float)(q * 1000
				        + (int)((qsd + i) % 1000)))
					return (20);
		}
	}
	/* A receive from any rank: NCCL has none. */
	req[1].peer = COHORT__P2P_ANY;
	if (ops->p2p_post(p2p, &reqs[1], 1, err, sizeof(err))
	    != COHORT_ENOTSUP)
		return (17);
	ops->p2p_close(p2p);
	ops->fini(state);
	return (0);
}

START_TEST(test_nccl_p2p_two_gpus)
{
	char dir[] = "/tmp/cohort-np-XXXXXX";
	pid_t probe, pids[2];
	int st = 0, gpus;

	/* Count the GPUs in a child: CUDA must not start in this process
	 * before it forks the ranks. */
	fflush(stdout);
	if ((probe = fork()) == 0) {
		const struct cohort__dl_cudart *cu;

		_exit(cohort__dl_cudart_get(&cu, NULL, 0) == COHORT_OK
		        ? (cu->device_count > 9 ? 9 : cu->device_count)
		        : 0);
	}
	ck_assert(th_wait(probe, 60000, &st));
	gpus = th_exit_code(st);
	if (gpus < 2) {
		printf("SKIP nccl point-to-point: needs 2 GPUs, this machine "
		       "has %d (NCCL refuses two ranks on one GPU)\n",
		    gpus);
		return;
	}
	ck_assert_ptr_nonnull(mkdtemp(dir));
	for (int r = 0; r < 2; r++)
		if ((pids[r] = fork()) == 0)
			_exit(np_rank(dir, r));
	for (int r = 0; r < 2; r++) {
		ck_assert_msg(
		    th_wait(pids[r], 120000, &st), "rank %d hung", r);
		ck_assert_msg(th_exit_code(st) == 0, "rank %d exit %d", r,
		    th_exit_code(st));
	}
}
END_TEST

Suite *suite_nccl_p2p(void); /* for tools/gen_suites.sh */

Suite *
suite_nccl_p2p(void)
{
	Suite *s = suite_create("nccl_p2p");
	TCase *tc = tcase_create("nccl");

	tcase_set_timeout(tc, 300);
	tcase_add_test(tc, test_nccl_p2p_on_the_groups_communicator);
	tcase_add_test(tc, test_nccl_p2p_two_gpus);
	suite_add_tcase(s, tc);
	return (s);
}
