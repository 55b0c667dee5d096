/*
 * hier.c - the tcp backend's hierarchical all-reduce, for a group with
 * several ranks on each of several hosts (a Kubernetes job of multi-CPU
 * pods, a cluster job with ranks-per-node > 1).
 *
 * A flat TCP ring sends 2 (n-1)/n of the tensor per rank over the network
 * although half (or more) of the ranks could meet in shared memory. Here
 * the group is seen as H hosts of L ranks each, and every rank has two
 * child states of this same backend:
 *   local  the L ranks of its host, over shared memory (shm.c)
 *   cross  the H ranks with its place on every host, over TCP
 * An all-reduce of count elements, with c = count / L, runs as:
 *   1. local reduce_scatter: place i of a host holds the host's sum of
 *      slice i (c elements) in place in its output
 *   2. cross all-reduce of slice i: the L places of a host each carry
 *      1/L of the tensor between hosts, all at once
 *   3. local all-gather of the slices
 * (the count % L elements left over, and tensors smaller than
 * COHORT_TCP_HIER_SPLIT, take a local all-reduce then a cross all-reduce
 * of the whole). Per rank, the network carries 2 (H-1)/H * count/L bytes
 * instead of 2 (n-1)/n * count; as in NCCL's and Open MPI's (han)
 * hierarchical collectives. Every slice is reduced in one place, so all
 * ranks get bit-identical results; MEAN sums and divides once at the end.
 *
 * Hosts are found at init, after the flat mesh is up: every rank sends
 * every other (over that mesh) a 96-byte message, "CHR1", whether it may
 * go hierarchical (COHORT_TCP_HIER and COHORT_TCP_SHM), rank 0's size
 * thresholds being adopted by all, and its host key: the kernel's boot id
 * and the device and inode of /dev/shm, so that two network namespaces
 * with their own /dev/shm are two hosts and two that share one are one
 * (they can share memory). All ranks compute the same layout from the same
 * messages; anything but H >= 2 hosts of the same L >= 2 ranks stays flat.
 *
 * Agreement and failures: the parent agrees on every operation over the
 * flat mesh first (algos.c), so the stages skip theirs (a child's
 * `agreed`). A rank that dies is named by the stage that has it as a peer;
 * every other rank, waiting in a stage without it, watches the parent's
 * connections too (xfer.c, shm.c: the child's `watch`), so it is named
 * everywhere even when the coordinator cannot tell (cut off). A rank that
 * finished the job's last all-reduce may exit while its peers still copy
 * their results: a watched connection that hangs up counts only if the
 * rank still waits COHORT__TCP_WATCH_GRACE_MS (500 ms) later.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "tcp_impl.h"

#define HIER_MAGIC "CHR1"
#define HIER_KEY 64
#define HIER_MSG 96

struct cohort__tcp_hier {
	struct cohort__tcp *local; /* the ranks of this host */
	struct cohort__tcp *cross; /* this place on every host */
	int place, nplaces; /* this rank's place on its host, L */
	size_t min; /* all-reduces of at least min bytes go this way */
	size_t split; /* from split bytes: slices (1/L each) between hosts */
};

/* Which ranks can share memory with this one: the same kernel (boot id)
 * and the same /dev/shm. */
static void
hier_host_key(char key[HIER_KEY])
{
	char boot[64] = "";
	struct stat st;
	FILE *f;

	if ((f = fopen("/proc/sys/kernel/random/boot_id", "r")) != NULL) {
		if (fgets(boot, sizeof(boot), f) == NULL)
			boot[0] = '\0';
		fclose(f);
	}
	boot[strcspn(boot, "\n")] = '\0';
	memset(&st, 0, sizeof(st));
	(void)stat("/dev/shm", &st);
	memset(key, 0, HIER_KEY);
	snprintf(key, HIER_KEY, "%.36s:%" PRIx64 ":%" PRIx64, boot,
	    (uint64_t)st.st_dev, (uint64_t)st.st_ino);
}

/* host[p] = the host index of rank p (in order of first appearance);
 * returns H, or 0 when the layout is not H >= 2 hosts of L >= 2 ranks. */
static int
hier_layout(const uint8_t *all, int n, int *host, int *nplaces)
{
	int nhosts = 0, *count;

	if ((count = calloc((size_t)n, sizeof(int))) == NULL)
		return (0);
	for (int p = 0; p < n; p++) {
		const uint8_t *kp = all + (size_t)p * HIER_MSG + 32;

		host[p] = -1;
		for (int q = 0; q < p; q++)
			if (memcmp(
			        kp, all + (size_t)q * HIER_MSG + 32, HIER_KEY)
			    == 0) {
				host[p] = host[q];
				break;
			}
		if (host[p] < 0)
			host[p] = nhosts++;
		count[host[p]]++;
	}
	*nplaces = count[0];
	for (int h = 1; h < nhosts; h++)
		if (count[h] != *nplaces)
			nhosts = 0;
	free(count);
	if (nhosts < 2 || *nplaces < 2)
		return (0);
	return (nhosts);
}

/* The child state named kind (its id "hier.KIND.GROUP": group ids are
 * "world" and "sub.NAME", so no other group has it) over members[0..m)
 * of the parent (group ranks); job_ranks: room for m. The child keeps
 * nothing of sub after its set-up. */
static cohort_status
hier_child(struct cohort__tcp *t, const struct cohort__group_desc *desc,
    const char *kind, const int *members, int m, int32_t *job_ranks,
    struct cohort__tcp **out, char *err, size_t errlen, cohort__time deadline)
{
	struct cohort__group_desc sub = *desc;
	char id[320], why[384];
	cohort_status rv;

	snprintf(id, sizeof(id), "hier.%s.%s", kind, desc->group_id);
	sub.group_id = id;
	sub.size = m;
	sub.rank = -1;
	for (int i = 0; i < m; i++) {
		job_ranks[i] = t->peers[members[i]].job_rank;
		if (members[i] == t->rank)
			sub.rank = i;
	}
	sub.global_ranks = job_ranks;
	if ((rv = cohort__tcp_open(&sub, t, out, why, sizeof(why), deadline))
	    != COHORT_OK)
		snprintf(err, errlen, "hierarchical set-up (%s): %s", id, why);
	return (rv);
}

cohort_status
cohort__tcp_hier_setup(struct cohort__tcp *t,
    const struct cohort__group_desc *desc, char *err, size_t errlen,
    cohort__time deadline)
{
	uint8_t mine[HIER_MSG], *all = NULL;
	int *host = NULL, *members = NULL;
	int32_t *job_ranks = NULL;
	struct cohort__tcp_hier *h = NULL;
	char kind[32];
	int nhosts, nplaces = 0, m;
	bool enable;
	cohort_status rv;

	/* One host (the flat group has shared memory), or too small. */
	if (t->size < 4 || t->shm != NULL)
		return (COHORT_OK);
	enable = cohort__tcp_knob(COHORT__KNOB_TCP_HIER, 1) != 0
	    && cohort__tcp_knob(COHORT__KNOB_TCP_SHM, 1) != 0;
	memset(mine, 0, sizeof(mine));
	memcpy(mine, HIER_MAGIC, 4);
	mine[4] = enable ? 1 : 0;
	cohort__tcp_put_be(
	    mine + 8, cohort__tcp_knob(COHORT__KNOB_TCP_HIER_MIN, 0), 8);
	cohort__tcp_put_be(mine + 16,
	    cohort__tcp_knob(COHORT__KNOB_TCP_HIER_SPLIT, 65536), 8);
	hier_host_key((char *)mine + 32);
	if ((all = calloc((size_t)t->size, HIER_MSG)) == NULL
	    || (host = calloc((size_t)t->size, sizeof(int))) == NULL
	    || (members = calloc((size_t)t->size, sizeof(int))) == NULL
	    || (job_ranks = calloc((size_t)t->size, sizeof(int32_t)))
	        == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = COHORT_ENOMEM;
		goto out;
	}
	t->opname = "hierarchy set-up";
	memcpy(all + (size_t)t->rank * HIER_MSG, mine, HIER_MSG);
	if ((rv = cohort__tcp_exchange_all(
	         t, all, HIER_MSG, err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	for (int p = 0; p < t->size; p++) {
		const uint8_t *msg = all + (size_t)p * HIER_MSG;

		if (memcmp(msg, HIER_MAGIC, 4) != 0 || msg[4] != 1)
			enable = false;
	}
	if (!enable
	    || (nhosts = hier_layout(all, t->size, host, &nplaces)) == 0)
		goto out; /* flat */

	if ((h = calloc(1, sizeof(*h))) == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = COHORT_ENOMEM;
		goto out;
	}
	h->nplaces = nplaces;
	h->min = (size_t)cohort__tcp_get_be(all + 8, 8);
	h->split = (size_t)cohort__tcp_get_be(all + 16, 8);
	/* Local: the ranks of this host, in rank order; this rank's place
	 * is its index there. */
	m = 0;
	for (int p = 0; p < t->size; p++)
		if (host[p] == host[t->rank]) {
			if (p == t->rank)
				h->place = m;
			members[m++] = p;
		}
	snprintf(kind, sizeof(kind), "host%d", host[t->rank]);
	if ((rv = hier_child(t, desc, kind, members, m, job_ranks, &h->local,
	         err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	/* Cross: the rank at this place on every host, in host order. */
	for (int k = 0; k < nhosts; k++) {
		int seen = 0;

		for (int p = 0; p < t->size; p++)
			if (host[p] == k && seen++ == h->place) {
				members[k] = p;
				break;
			}
	}
	snprintf(kind, sizeof(kind), "place%d", h->place);
	if ((rv = hier_child(t, desc, kind, members, nhosts, job_ranks,
	         &h->cross, err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	cohort__debug("tcp group %s: hierarchical all-reduce, %d hosts x %d "
	              "ranks (host %d, place %d)%s",
	    desc->group_id, nhosts, nplaces, host[t->rank], h->place,
	    h->local->shm != NULL ? "" : "; no shared memory on this host");
	t->hier = h;
	h = NULL;
out:
	if (h != NULL) {
		t->hier = h;
		cohort__tcp_hier_free(t);
	}
	free(all);
	free(host);
	free(members);
	free(job_ranks);
	t->opname = "init";
	return (rv);
}

bool
cohort__tcp_hier_usable(
    struct cohort__tcp *t, const struct cohort__op *op, size_t bytes)
{
	return (t->hier != NULL && op->kind == COHORT__OP_ALLREDUCE
	    && bytes > 0 && bytes >= t->hier->min);
}

/* Runs one stage on child c: kind over count elements of the parent's
 * operation (whose name and number its errors carry). */
static cohort_status
hier_stage(struct cohort__tcp *c, const struct cohort__op *op,
    enum cohort__op_kind kind, const void *send, void *recv, size_t count,
    char *err, size_t errlen, cohort__time deadline)
{
	struct cohort__op sub = *op;

	if (count == 0)
		return (COHORT_OK);
	sub.kind = kind;
	sub.send = send;
	sub.recv = recv;
	sub.count = count;
	if (sub.op == COHORT_MEAN)
		sub.op = COHORT_SUM;
	c->opname = cohort__op_name(op->kind);
	c->seq = op->seq;
	c->stats = op->stats;
	return (cohort__tcp_run_op(c, &sub, err, errlen, deadline));
}

cohort_status
cohort__tcp_hier_allreduce(struct cohort__tcp *t, const struct cohort__op *op,
    char *err, size_t errlen, cohort__time deadline)
{
	struct cohort__tcp_hier *h = t->hier;
	size_t es = t->esize, L = (size_t)h->nplaces;
	size_t c = op->count / L, main = c * L;
	const uint8_t *src = op->send != NULL ? op->send : op->recv;
	uint8_t *dst = op->recv;
	uint8_t *slice = dst + (size_t)h->place * c * es;
	cohort_status rv = COHORT_OK;

	if (op->count * es < h->split)
		main = c = 0;
	if (c > 0) {
		if ((rv = hier_stage(h->local, op, COHORT__OP_REDUCE_SCATTER,
		         src, slice, c, err, errlen, deadline))
		        != COHORT_OK
		    || (rv = hier_stage(h->cross, op, COHORT__OP_ALLREDUCE,
		            slice, slice, c, err, errlen, deadline))
		        != COHORT_OK)
			return (rv);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    slice, c, op->dtype, (double)t->size);
		if ((rv = hier_stage(h->local, op, COHORT__OP_ALLGATHER, slice,
		         dst, c, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
	}
	if (main < op->count) {
		size_t rest = op->count - main;

		if ((rv = hier_stage(h->local, op, COHORT__OP_ALLREDUCE,
		         src + main * es, dst + main * es, rest, err, errlen,
		         deadline))
		        != COHORT_OK
		    || (rv = hier_stage(h->cross, op, COHORT__OP_ALLREDUCE,
		            dst + main * es, dst + main * es, rest, err,
		            errlen, deadline))
		        != COHORT_OK)
			return (rv);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    dst + main * es, rest, op->dtype, (double)t->size);
	}
	if (op->stats != NULL)
		op->stats->algo = "hier";
	return (rv);
}

void
cohort__tcp_hier_abort(struct cohort__tcp *t)
{
	if (t->hier == NULL)
		return;
	cohort__tcp_abort_state(t->hier->local);
	cohort__tcp_abort_state(t->hier->cross);
}

void
cohort__tcp_hier_free(struct cohort__tcp *t)
{
	struct cohort__tcp_hier *h = t->hier;

	if (h == NULL)
		return;
	cohort__tcp_close(h->local);
	cohort__tcp_close(h->cross);
	free(h);
	t->hier = NULL;
}
