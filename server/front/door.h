/*
 * door.h - who may use a TCPStore listener (door.c; docs/security.md,
 * "torch's store"). torch's TCPStore protocol has no credential of any
 * kind, so the listener lets in a connection by where it comes from:
 *
 *  - from this host (loopback, or any of its addresses: the peer's address
 *    is the one it dialled): only a process of cohortd's own user, or
 *    root, found by asking the kernel who owns the peer's socket
 *    (sock_diag, as ss(8) -e does; /proc/net/tcp if that is not allowed);
 *  - from another host: only an address of --torch-store-allow (CIDR,
 *    repeatable), or one from which a client of the job is connected to
 *    cohortd with the job's token right now (a worker or a `cohort run`
 *    launcher of that host).
 *
 * Anyone else is refused at its first query (VALIDATE), before it reads
 * or changes anything: its connection closes, and cohortd logs who it
 * was and why.
 */
#ifndef COHORT_SRV_DOOR_H
#define COHORT_SRV_DOOR_H

#include <stdbool.h>
#include <stddef.h>
#include <stdint.h>
#include <sys/socket.h>

#include "cohort_common.h"

struct srv_core;
struct srv_door;

/* A door with the CIDRs of --torch-store-allow ("10.0.0.0/8",
 * "fd00::/8", an address alone: /32 or /128). COHORT_EINVAL naming a bad
 * one. */
cohort_status srv_door_new(
    const char *const *allow, size_t nallow, struct srv_door **out);
void srv_door_free(struct srv_door *d);

/* Whether the peer sa of the accepted socket fd is on this host: it
 * came from the address it reached (a process here that dialled one of
 * this host's addresses). Loopback peers are, too. */
bool srv_door_same_host(int fd, const struct sockaddr_storage *sa);
/* A peer on this host (the accepted socket fd, its peer sa): true if its
 * socket belongs to cohortd's user or root; how says which uid (or why
 * it could not be told). */
bool srv_door_local(
    int fd, const struct sockaddr_storage *sa, char *how, size_t len);
/* A peer on another host: in --torch-store-allow? */
bool srv_door_allowed(
    const struct srv_door *d, const struct sockaddr_storage *sa);
/* A peer on another host: is a client of job connected from its address
 * with the job's token (under the server mutex)? */
bool srv_door_job_host(
    struct srv_core *core, const char *job, const struct sockaddr_storage *sa);

/* For tests: the owner of the peer of an accepted loopback socket;
 * false if it cannot be found. */
bool srv_door_peer_uid(
    int fd, const struct sockaddr_storage *sa, uint32_t *uid);

#endif /* COHORT_SRV_DOOR_H */
