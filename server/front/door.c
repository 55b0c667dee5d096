/*
 * door.c - who may use a TCPStore listener (door.h).
 */
#include <arpa/inet.h>
#include <errno.h>
#include <fcntl.h>
#include <inttypes.h>
#include <linux/inet_diag.h>
#include <linux/netlink.h>
#include <linux/sock_diag.h>
#include <netinet/in.h>
#include <stdio.h>
#include <stdlib.h>
#include <string.h>
#include <sys/socket.h>
#include <sys/time.h>
#include <unistd.h>

#include "core/clients.h"
#include "core/pipes.h"
#include "state/job.h"
#include "door.h"
#include "net.h"

struct door_net {
	uint8_t addr[16];
	size_t alen; /* 4 or 16 */
	unsigned bits;
};

struct srv_door {
	struct door_net *nets;
	size_t n;
};

cohort_status
srv_door_new(const char *const *allow, size_t nallow, struct srv_door **out)
{
	struct srv_door *d = calloc(1, sizeof(*d));

	if (d == NULL
	    || (nallow > 0
	        && (d->nets = calloc(nallow, sizeof(*d->nets))) == NULL)) {
		free(d);
		return (COHORT_ENOMEM);
	}
	for (size_t i = 0; i < nallow; i++) {
		char buf[128], *slash;
		struct door_net *x = &d->nets[d->n];
		unsigned long bits;
		char *end;

		cohort__strlcpy(buf, allow[i], sizeof(buf));
		if ((slash = strchr(buf, '/')) != NULL)
			*slash = '\0';
		if (inet_pton(AF_INET, buf, x->addr) == 1)
			x->alen = 4;
		else if (inet_pton(AF_INET6, buf, x->addr) == 1)
			x->alen = 16;
		bits = x->alen * 8;
		if (slash != NULL) {
			errno = 0;
			bits = strtoul(slash + 1, &end, 10);
			if (errno != 0 || *end != '\0' || end == slash + 1)
				bits = 999;
		}
		if (x->alen == 0 || bits > x->alen * 8) {
			srv_door_free(d);
			return (cohort__err(COHORT_EINVAL,
			    "--torch-store-allow '%s': expected an address or "
			    "ADDR/BITS (10.0.0.0/8, fd00::/8)",
			    allow[i]));
		}
		x->bits = (unsigned)bits;
		d->n++;
	}
	*out = d;
	return (COHORT_OK);
}

void
srv_door_free(struct srv_door *d)
{
	if (d == NULL)
		return;
	free(d->nets);
	free(d);
}

bool
srv_door_allowed(const struct srv_door *d, const struct sockaddr_storage *sa)
{
	uint8_t a[16];
	size_t alen = srv_net_addr(sa, a, NULL);

	for (size_t i = 0; d != NULL && i < d->n; i++) {
		const struct door_net *x = &d->nets[i];
		unsigned full = x->bits / 8, rest = x->bits % 8;
		if (x->alen != alen || memcmp(a, x->addr, full) != 0)
			continue;
		if (rest == 0
		    || ((a[full] ^ x->addr[full])
		           & (uint8_t)(0xff << (8 - rest)))
		        == 0)
			return (true);
	}
	return (false);
}

bool
srv_door_job_host(
    struct srv_core *core, const char *job, const struct sockaddr_storage *sa)
{
	struct srv_job *j = srv_job_find(core, job);
	struct srv_hnode *n;
	uint8_t a[16];
	size_t alen = srv_net_addr(sa, a, NULL), i;

	if (j == NULL || alen == 0)
		return (false);
	for (n = srv_map_next(&j->clients.map, &i, NULL); n != NULL;
	     n = srv_map_next(&j->clients.map, &i, n)) {
		const struct srv_client *cl
		    = SRV_CONTAINER(n, struct srv_client, hn);
		const struct srv_pipe *p;
		if (cl->pipe == 0
		    || (p = srv_pipe_find(core, cl->pipe)) == NULL)
			continue;
		if (p->alen == alen && memcmp(p->addr, a, alen) == 0)
			return (true);
	}
	return (false);
}

/* ------------------------------------------------------------------------ */
/* The owner of a local peer's socket                                       */
/* ------------------------------------------------------------------------ */

/* Asks the kernel (sock_diag) for the socket whose local end is peer and
 * remote end is local: its owner. */
static bool
door_uid_diag(int family, const uint8_t *peer, uint16_t pport,
    const uint8_t *local, uint16_t lport, size_t alen, uint32_t *uid)
{
	struct {
		struct nlmsghdr nlh;
		struct inet_diag_req_v2 r;
	} req;
	struct sockaddr_nl nl;
	struct timeval tv = { 1, 0 };
	union {
		struct nlmsghdr h;
		uint8_t b[8192];
	} buf;
	ssize_t n;
	bool ok = false;
	int fd
	    = socket(AF_NETLINK, SOCK_DGRAM | SOCK_CLOEXEC, NETLINK_SOCK_DIAG);

	if (fd < 0)
		return (false);
	(void)setsockopt(fd, SOL_SOCKET, SO_RCVTIMEO, &tv, sizeof(tv));
	memset(&req, 0, sizeof(req));
	req.nlh.nlmsg_len = sizeof(req);
	req.nlh.nlmsg_type = SOCK_DIAG_BY_FAMILY;
	req.nlh.nlmsg_flags = NLM_F_REQUEST;
	req.r.sdiag_family = (uint8_t)family;
	req.r.sdiag_protocol = IPPROTO_TCP;
	req.r.idiag_states = ~0u;
	req.r.id.idiag_sport = htons(pport);
	req.r.id.idiag_dport = htons(lport);
	memcpy(req.r.id.idiag_src, peer, alen);
	memcpy(req.r.id.idiag_dst, local, alen);
	req.r.id.idiag_cookie[0] = INET_DIAG_NOCOOKIE;
	req.r.id.idiag_cookie[1] = INET_DIAG_NOCOOKIE;
	memset(&nl, 0, sizeof(nl));
	nl.nl_family = AF_NETLINK;
	if (sendto(
	        fd, &req, sizeof(req), 0, (struct sockaddr *)&nl, sizeof(nl))
	    != (ssize_t)sizeof(req)) {
		close(fd);
		return (false);
	}
	n = recv(fd, buf.b, sizeof(buf.b), 0);
	if (n > 0) {
		struct nlmsghdr *h = &buf.h;
		size_t left = (size_t)n;
		for (; NLMSG_OK(h, left); h = NLMSG_NEXT(h, left)) {
			const struct inet_diag_msg *m;
			if (h->nlmsg_type != SOCK_DIAG_BY_FAMILY)
				break;
			m = NLMSG_DATA(h);
			*uid = m->idiag_uid;
			ok = true;
			break;
		}
	}
	close(fd);
	return (ok);
}

/* An address (alen bytes) and port as /proc/net/tcp{,6} print them: each
 * 32-bit word of the address in host order, in hex, then ":PORT". */
static void
door_proc_addr(
    char *buf, size_t len, const uint8_t *addr, size_t alen, uint16_t port)
{
	size_t o = 0;

	for (size_t w = 0; w < alen; w += 4) {
		uint32_t x;
		memcpy(&x, addr + w, 4);
		o += (size_t)snprintf(buf + o, len - o, "%08X", x);
	}
	snprintf(buf + o, len - o, ":%04X", port);
}

/* The same from /proc/net/tcp{,6} (where netlink is not allowed): the
 * line whose local address is peer and remote address is local. */
static bool
door_uid_proc(bool v6, const uint8_t *peer, uint16_t pport,
    const uint8_t *local, uint16_t lport, uint32_t *uid)
{
	FILE *f = fopen(v6 ? "/proc/net/tcp6" : "/proc/net/tcp", "re");
	char line[512], want_l[64], want_r[64];
	size_t alen = v6 ? 16 : 4;
	bool ok = false;

	if (f == NULL)
		return (false);
	door_proc_addr(want_l, sizeof(want_l), peer, alen, pport);
	door_proc_addr(want_r, sizeof(want_r), local, alen, lport);
	while (!ok && fgets(line, sizeof(line), f) != NULL) {
		char l[64], r[64];
		unsigned st, u;
		if (sscanf(line, " %*u: %63s %63s %x %*s %*s %*s %u", l, r,
		        &st, &u)
		        == 4
		    && strcmp(l, want_l) == 0 && strcmp(r, want_r) == 0) {
			*uid = u;
			ok = true;
		}
	}
	fclose(f);
	return (ok);
}

bool
srv_door_peer_uid(int fd, const struct sockaddr_storage *sa, uint32_t *uid)
{
	struct sockaddr_storage ls;
	socklen_t ll = sizeof(ls);
	uint8_t p[16], l[16];
	uint16_t pport = 0, lport = 0;
	size_t pl, lal;

	if (getsockname(fd, (struct sockaddr *)&ls, &ll) != 0)
		return (false);
	pl = srv_net_addr(sa, p, &pport);
	lal = srv_net_addr(&ls, l, &lport);
	if (pl == 0 || pl != lal)
		return (false);
	return (door_uid_diag(
	            pl == 4 ? AF_INET : AF_INET6, p, pport, l, lport, pl, uid)
	    || door_uid_proc(pl == 16, p, pport, l, lport, uid));
}

bool
srv_door_same_host(int fd, const struct sockaddr_storage *sa)
{
	struct sockaddr_storage ls;
	socklen_t ll = sizeof(ls);
	uint8_t p[16], l[16];
	size_t pl, lal;

	if (getsockname(fd, (struct sockaddr *)&ls, &ll) != 0)
		return (false);
	pl = srv_net_addr(sa, p, NULL);
	lal = srv_net_addr(&ls, l, NULL);
	return (pl != 0 && pl == lal && memcmp(p, l, pl) == 0);
}

bool
srv_door_local(
    int fd, const struct sockaddr_storage *sa, char *how, size_t len)
{
	uint32_t uid, me = (uint32_t)geteuid();

	if (!srv_door_peer_uid(fd, sa, &uid)) {
		snprintf(how, len,
		    "a local connection whose owner cannot be told (neither "
		    "sock_diag nor /proc/net/tcp names it)");
		return (false);
	}
	if (uid == me || uid == 0) {
		snprintf(how, len, "local, uid %" PRIu32, uid);
		return (true);
	}
	snprintf(how, len,
	    "a local process of uid %" PRIu32 ", not cohortd's user (uid "
	    "%" PRIu32 ") nor root",
	    uid, me);
	return (false);
}
