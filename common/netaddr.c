/*
 * netaddr.c - which of this host's addresses peers can reach.
 *
 * A worker's data plane listens on, and advertises, one address. Without
 * configuration that is the address of the interface on the route to the
 * coordinator: the one address every other worker of the job is known to
 * reach this host from, since they all reach the coordinator (a pod's IP
 * on Kubernetes, the cluster network on a shared machine). Found the way
 * torch.distributed does: a UDP socket "connected" to the coordinator
 * sends nothing, but the kernel picks the route and its source address.
 */
#include <arpa/inet.h>
#include <errno.h>
#include <ifaddrs.h>
#include <net/if.h>
#include <netdb.h>
#include <netinet/in.h>
#include <stdio.h>
#include <string.h>
#include <sys/socket.h>
#include <unistd.h>

#include "cohort_common.h"
#include "netaddr.h"

/* "tcp://host:port" (tls+tcp://, tcp4://, tcp6:// too) into host, port. */
static bool
netaddr_split(
    const char *url, char *host, size_t hlen, char *port, size_t plen)
{
	const char *p = strstr(url, "://"), *colon, *end;

	if (p == NULL || strncmp(url, "ipc", 3) == 0
	    || strncmp(url, "inproc", 6) == 0)
		return (false);
	p += 3;
	if (*p == '[') { /* [v6]:port */
		end = strchr(p, ']');
		if (end == NULL || end[1] != ':')
			return (false);
		snprintf(host, hlen, "%.*s", (int)(end - p - 1), p + 1);
		snprintf(port, plen, "%s", end + 2);
		return (true);
	}
	if ((colon = strrchr(p, ':')) == NULL)
		return (false);
	snprintf(host, hlen, "%.*s", (int)(colon - p), p);
	snprintf(port, plen, "%s", colon + 1);
	return (host[0] != '\0');
}

cohort_status
cohort__route_addr(const char *url, char *out, size_t len)
{
	char host[256], port[32];
	struct addrinfo hints, *res = NULL;
	struct sockaddr_storage ss;
	socklen_t sl = sizeof(ss);
	int fd, rv;

	if (!netaddr_split(url, host, sizeof(host), port, sizeof(port))) {
		/* ipc://: peers are on this host */
		cohort__strlcpy(out, "127.0.0.1", len);
		return (COHORT_OK);
	}
	memset(&hints, 0, sizeof(hints));
	hints.ai_socktype = SOCK_DGRAM;
	if ((rv = getaddrinfo(host, port, &hints, &res)) != 0)
		return (cohort__err(COHORT_ENOCOORD,
		    "cannot resolve the coordinator's host '%s': %s", host,
		    gai_strerror(rv)));
	fd = socket(res->ai_family, SOCK_DGRAM | SOCK_CLOEXEC, 0);
	if (fd < 0 || connect(fd, res->ai_addr, res->ai_addrlen) != 0
	    || getsockname(fd, (struct sockaddr *)&ss, &sl) != 0) {
		rv = errno;
		if (fd >= 0)
			close(fd);
		freeaddrinfo(res);
		return (cohort__err(COHORT_ENOCOORD,
		    "no route to the coordinator's host '%s': %s", host,
		    strerror(rv)));
	}
	close(fd);
	freeaddrinfo(res);
	if (getnameinfo((struct sockaddr *)&ss, sl, out, (socklen_t)len, NULL,
	        0, NI_NUMERICHOST)
	    != 0)
		return (cohort__err(COHORT_ESYSTEM, "getnameinfo failed"));
	return (COHORT_OK);
}

cohort_status
cohort__iface_addr(const char *iface, char *out, size_t len)
{
	struct ifaddrs *ifa, *i;
	cohort_status st = COHORT_EINVAL;

	if (getifaddrs(&ifa) != 0)
		return (cohort__err(
		    COHORT_ESYSTEM, "getifaddrs: %s", strerror(errno)));
	/* IPv4 first, then IPv6 (not link-local) */
	for (int pass = 0; pass < 2 && st != COHORT_OK; pass++) {
		for (i = ifa; i != NULL; i = i->ifa_next) {
			int fam = pass == 0 ? AF_INET : AF_INET6;
			if (i->ifa_addr == NULL
			    || i->ifa_addr->sa_family != fam
			    || strcmp(i->ifa_name, iface) != 0)
				continue;
			if (fam == AF_INET6
			    && IN6_IS_ADDR_LINKLOCAL(
			        &((struct sockaddr_in6 *)i->ifa_addr)
			             ->sin6_addr))
				continue;
			if (getnameinfo(i->ifa_addr,
			        fam == AF_INET ? sizeof(struct sockaddr_in)
			                       : sizeof(struct sockaddr_in6),
			        out, (socklen_t)len, NULL, 0, NI_NUMERICHOST)
			    == 0) {
				st = COHORT_OK;
				break;
			}
		}
	}
	freeifaddrs(ifa);
	if (st != COHORT_OK)
		return (cohort__err(st,
		    "COHORT_DATA_IFACE=%s: no such interface with an address",
		    iface));
	return (COHORT_OK);
}
