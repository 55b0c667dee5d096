/*
 * hier.c - the host backend's hierarchical all-reduce, for a group with
 * several ranks on each of several hosts (a Kubernetes job of multi-CPU
 * pods, a cluster job with ranks-per-node > 1).
 *
 * A flat TCP ring sends 2 (n-1)/n of the tensor per rank over the network
 * although half (or more) of the ranks could meet in shared memory. Here
 * the group is seen as H hosts of L ranks each, and every rank has two
 * child groups of this same backend, set up and run through its ops table
 * (as staged.c composes it):
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
 * every other (over that mesh) a 96-byte message, "CHR1" (only groups
 * connected in full at init, of at most COHORT_TCP_MESH_MAX ranks), whether it
 * may go hierarchical (COHORT_TCP_HIER and COHORT_TCP_SHM), rank 0's size
 * thresholds being adopted by all, and its host key: the kernel's boot id
 * and the device and inode of /dev/shm, so that two network namespaces
 * with their own /dev/shm are two hosts and two that share one are one
 * (they can share memory). All ranks compute the same layout from the same
 * messages; anything but H >= 2 hosts of the same L >= 2 ranks stays flat.
 *
 * Agreement and failures: the parent agrees on every operation over the
 * flat mesh first (agree.c), so the stages skip theirs (a child's
 * `agreed`), and name the parent's operation in their errors. A rank that dies
 * is named by the stage that has it as a peer; every other rank, waiting in a
 * stage without it, watches the parent's connections too (mesh.c: the child
 * mesh's `watch`), so it is named everywhere even when the coordinator cannot
 * tell (cut off). A rank that finished the job's last all-reduce may exit
 * while its peers still copy their results: a watched connection that hangs up
 * counts only if the rank still waits HOST_WATCH_GRACE_MS (500 ms) later.
 */
#include <errno.h>
#include <inttypes.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/stat.h>

#include "host_impl.h"

#define HIER_MAGIC "CHR1"
#define HIER_KEY 64
#define HIER_MSG 96

struct host_hier {
	const struct cohort__backend_ops *ops; /* the children's */
	struct cohort__host *local; /* the ranks of this host */
	struct cohort__host *cross; /* this place on every host */
	int size; /* the parent group's (MEAN divides by it) */
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

/* The child group named kind (its id "hier.KIND.GROUP": group ids are
 * "world" and "sub.NAME", so no other group has it) over members[0..m)
 * of the parent (group ranks), set up through ops; job_ranks: room for
 * m. The child keeps nothing of sub after its init. */
static cohort_status
hier_child(struct cohort__host *h, const struct cohort__backend_ops *ops,
    const struct cohort__group_desc *desc, const char *kind,
    const int *members, int m, int32_t *job_ranks, struct cohort__host **out,
    char *err, size_t errlen, cohort__time deadline)
{
	struct cohort__group_desc sub = *desc;
	char id[320], why[384];
	void *state = NULL;
	cohort_status rv;

	snprintf(id, sizeof(id), "hier.%s.%s", kind, desc->group_id);
	sub.group_id = id;
	sub.size = m;
	sub.rank = -1;
	for (int i = 0; i < m; i++) {
		job_ranks[i] = h->mesh.links[members[i]].job_rank;
		if (members[i] == h->mesh.rank)
			sub.rank = i;
	}
	sub.global_ranks = job_ranks;
	if ((rv = ops->init(&sub, &state, why, sizeof(why), deadline))
	    != COHORT_OK) {
		snprintf(err, errlen, "hierarchical set-up (%s): %s", id, why);
		return (rv);
	}
	*out = state;
	/* The parent agrees on every operation; a child waiting in a stage
	 * also watches the parent's connections. */
	(*out)->agreed = true;
	return (host_mesh_watch(&(*out)->mesh, &h->mesh, err, errlen));
}

cohort_status
host_hier_setup(struct cohort__host *h, const struct cohort__backend_ops *ops,
    const struct cohort__group_desc *desc, struct host_hier **out, char *err,
    size_t errlen, cohort__time deadline)
{
	struct host_op c = { .name = "hierarchy set-up", .esize = 1 };
	uint8_t mine[HIER_MSG], *all = NULL;
	int *host = NULL, *members = NULL;
	int32_t *job_ranks = NULL;
	struct host_hier *hh = NULL;
	int n = h->mesh.size, r = h->mesh.rank;
	char kind[32];
	int nhosts, nplaces = 0, m;
	bool enable;
	cohort_status rv;

	*out = NULL;
	/* One host (the flat group has shared memory), or too small. */
	if (n < 4 || h->shm != NULL)
		return (COHORT_OK);
	enable = host_knob(COHORT__KNOB_TCP_HIER, 1) != 0
	    && host_knob(COHORT__KNOB_TCP_SHM, 1) != 0;
	memset(mine, 0, sizeof(mine));
	memcpy(mine, HIER_MAGIC, 4);
	mine[4] = enable ? 1 : 0;
	host_put_be(mine + 8, host_knob(COHORT__KNOB_TCP_HIER_MIN, 0), 8);
	host_put_be(
	    mine + 16, host_knob(COHORT__KNOB_TCP_HIER_SPLIT, 65536), 8);
	hier_host_key((char *)mine + 32);
	if ((all = calloc((size_t)n, HIER_MSG)) == NULL
	    || (host = calloc((size_t)n, sizeof(int))) == NULL
	    || (members = calloc((size_t)n, sizeof(int))) == NULL
	    || (job_ranks = calloc((size_t)n, sizeof(int32_t))) == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = COHORT_ENOMEM;
		goto out;
	}
	memcpy(all + (size_t)r * HIER_MSG, mine, HIER_MSG);
	if ((rv = host_exchange_all(
	         &h->xfer, &c, all, HIER_MSG, err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	for (int p = 0; p < n; p++) {
		const uint8_t *msg = all + (size_t)p * HIER_MSG;

		if (memcmp(msg, HIER_MAGIC, 4) != 0 || msg[4] != 1)
			enable = false;
	}
	if (!enable || (nhosts = hier_layout(all, n, host, &nplaces)) == 0)
		goto out; /* flat */

	if ((hh = calloc(1, sizeof(*hh))) == NULL) {
		snprintf(err, errlen, "out of memory");
		rv = COHORT_ENOMEM;
		goto out;
	}
	hh->ops = ops;
	hh->size = n;
	hh->nplaces = nplaces;
	hh->min = (size_t)host_get_be(all + 8, 8);
	hh->split = (size_t)host_get_be(all + 16, 8);
	/* Local: the ranks of this host, in rank order; this rank's place
	 * is its index there. */
	m = 0;
	for (int p = 0; p < n; p++)
		if (host[p] == host[r]) {
			if (p == r)
				hh->place = m;
			members[m++] = p;
		}
	snprintf(kind, sizeof(kind), "host%d", host[r]);
	if ((rv = hier_child(h, ops, desc, kind, members, m, job_ranks,
	         &hh->local, err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	/* Cross: the rank at this place on every host, in host order. */
	for (int k = 0; k < nhosts; k++) {
		int seen = 0;

		for (int p = 0; p < n; p++)
			if (host[p] == k && seen++ == hh->place) {
				members[k] = p;
				break;
			}
	}
	snprintf(kind, sizeof(kind), "place%d", hh->place);
	if ((rv = hier_child(h, ops, desc, kind, members, nhosts, job_ranks,
	         &hh->cross, err, errlen, deadline))
	    != COHORT_OK)
		goto out;
	cohort__debug("tcp group %s: hierarchical all-reduce, %d hosts x %d "
	              "ranks (host %d, place %d)%s",
	    desc->group_id, nhosts, nplaces, host[r], hh->place,
	    hh->local->shm != NULL ? "" : "; no shared memory on this host");
	*out = hh;
	hh = NULL;
out:
	host_hier_free(hh);
	free(all);
	free(host);
	free(members);
	free(job_ranks);
	return (rv);
}

bool
host_hier_usable(
    const struct host_hier *hh, const struct cohort__op *op, size_t bytes)
{
	return (hh != NULL && op->kind == COHORT__OP_ALLREDUCE && bytes > 0
	    && bytes >= hh->min);
}

/* Runs one stage on child ch: kind over count elements of the parent's
 * operation (whose name and number its errors carry). */
static cohort_status
hier_stage(const struct host_hier *hh, struct cohort__host *ch,
    const struct cohort__op *op, enum cohort__op_kind kind, const void *send,
    void *recv, size_t count, char *err, size_t errlen, cohort__time deadline)
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
	ch->as_kind = op->kind;
	return (hh->ops->run(ch, &sub, err, errlen, deadline));
}

cohort_status
host_hier_allreduce(struct host_hier *hh, const struct cohort__op *op,
    const struct host_op *c, size_t es, char *err, size_t errlen,
    cohort__time deadline)
{
	size_t L = (size_t)hh->nplaces;
	size_t cnt = op->count / L, main = cnt * L;
	const uint8_t *src = op->send != NULL ? op->send : op->recv;
	uint8_t *dst = op->recv;
	uint8_t *slice = dst + (size_t)hh->place * cnt * es;
	cohort_status rv = COHORT_OK;

	if (op->count * es < hh->split)
		main = cnt = 0;
	if (cnt > 0) {
		if ((rv = hier_stage(hh, hh->local, op,
		         COHORT__OP_REDUCE_SCATTER, src, slice, cnt, err,
		         errlen, deadline))
		        != COHORT_OK
		    || (rv = hier_stage(hh, hh->cross, op,
		            COHORT__OP_ALLREDUCE, slice, slice, cnt, err,
		            errlen, deadline))
		        != COHORT_OK)
			return (rv);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(
			    slice, cnt, op->dtype, (double)hh->size);
		if ((rv = hier_stage(hh, hh->local, op, COHORT__OP_ALLGATHER,
		         slice, dst, cnt, err, errlen, deadline))
		    != COHORT_OK)
			return (rv);
	}
	if (main < op->count) {
		size_t rest = op->count - main;

		if ((rv = hier_stage(hh, hh->local, op, COHORT__OP_ALLREDUCE,
		         src + main * es, dst + main * es, rest, err, errlen,
		         deadline))
		        != COHORT_OK
		    || (rv = hier_stage(hh, hh->cross, op,
		            COHORT__OP_ALLREDUCE, dst + main * es,
		            dst + main * es, rest, err, errlen, deadline))
		        != COHORT_OK)
			return (rv);
		if (op->op == COHORT_MEAN)
			cohort__scale_div(dst + main * es, rest, op->dtype,
			    (double)hh->size);
	}
	host_op_algo(c, "hier");
	return (rv);
}

void
host_hier_abort(struct host_hier *hh)
{
	struct cohort__host *child[2] = { NULL, NULL };

	if (hh != NULL) {
		child[0] = hh->local;
		child[1] = hh->cross;
	}
	for (int i = 0; i < 2; i++)
		if (child[i] != NULL)
			hh->ops->abort(child[i]);
}

void
host_hier_free(struct host_hier *hh)
{
	if (hh == NULL)
		return;
	/* An abort first is harmless (backend.h), and frees the same way. */
	if (hh->local != NULL)
		hh->ops->fini(hh->local);
	if (hh->cross != NULL)
		hh->ops->fini(hh->cross);
	free(hh);
}
