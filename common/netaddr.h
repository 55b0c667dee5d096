/*
 * netaddr.h - which of this host's addresses peers can reach (netaddr.c).
 */
#ifndef COHORT_COMMON_NETADDR_H
#define COHORT_COMMON_NETADDR_H

#include <stddef.h>

#include "cohort/cohort.h"

/* The local address of the route to the host of coordinator URL (the
 * interface that reaches it), numeric, into out; "127.0.0.1" for ipc://.
 * COHORT_ENOCOORD (detail set) if the host does not resolve or has no
 * route. Sends nothing; never blocks beyond name resolution. */
cohort_status cohort__route_addr(const char *url, char *out, size_t len);

/* The address of network interface iface (IPv4 first), numeric.
 * COHORT_EINVAL (detail set) if it has none. */
cohort_status cohort__iface_addr(const char *iface, char *out, size_t len);

#endif /* COHORT_COMMON_NETADDR_H */
