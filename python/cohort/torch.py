"""The ``"cohort"`` backend for torch.distributed.

Importing this module registers the backend::

    import cohort.torch
    torch.distributed.init_process_group("cohort")          # env://, torchrun, ...
    Trainer(strategy=DDPStrategy(process_group_backend="cohort"))

(an installed package also registers it through torch's
``torch.distributed.backends`` entry point, so the import is optional there).

Every collective goes peer to peer through libcohort (shared memory between
ranks on one host, TCP across hosts; CUDA tensors through NCCL where a GPU
is present); the coordinator ``cohortd`` runs rendezvous, barriers and
failure detection. When the environment names no coordinator
(``COHORT_COORDINATOR``, as ``cohort run`` sets it), rank 0 starts a private
one and publishes its address in torch's store, so nothing has to be set up
by hand (:mod:`cohort.bootstrap`).

torch treats the group as its own, as it does gloo's: a
:class:`torch.distributed.ProcessGroup` with a name, a description and the
cohort backend (:class:`CohortBackend`) registered for ``cpu`` and
``cuda``, so DeviceMesh, DTensor, FSDP2, functional collectives, DCP,
``monitored_barrier``, ``split_group`` and ``device_id`` work.

When a rank dies or reports an exception, every other rank's pending and
next collective raises :class:`CohortBackendError` (a
:class:`torch.distributed.DistBackendError`) naming the failed rank, its
host and pid, the operation, and the failed rank's own error text. An
uncaught exception in a rank is reported to the coordinator on its way out
(``sys.excepthook``), so the others learn *why*, not only that it is gone.
"""

from __future__ import annotations

import atexit
import datetime
import os
import sys
from typing import Any, Optional

import torch.distributed as dist

from . import bootstrap
from ._abi import EXIT_PEER_LOST, Status
from .client import Client
from .failures import CohortBackendError, format_exception_report, peer_lost
from .process_group import BACKEND_NAME, CohortBackend, group_name, live_backends
from .work import CohortWork, DoneWork

__all__ = [
    "BACKEND_NAME",
    "EXIT_PEER_LOST",
    "CohortBackend",
    "CohortBackendError",
    "CohortProcessGroup",
    "CohortWork",
    "backend_of",
    "report_exception",
    "current_client",
]

#: Former name of :class:`CohortBackend`, from when the backend was itself
#: the process group; kept for code that imports it.
CohortProcessGroup = CohortBackend

# Kept importable under their former private names.
_DoneWork = DoneWork
_STORE_KEY = bootstrap.STORE_KEY


def current_client() -> Optional[Client]:
    """The cohort membership of this process's default group, if any."""
    return bootstrap.world_client()


def backend_of(group: Optional[dist.ProcessGroup] = None) -> CohortBackend:
    """The :class:`CohortBackend` of a cohort process group (default: the world).

    Raises ValueError for a group of another backend.
    """
    import torch

    pg = group if group is not None else dist.group.WORLD
    if pg is None:
        raise ValueError("cohort: no default process group (call init_process_group first)")
    be = pg._get_backend(torch.device("cpu"))
    if not isinstance(be, CohortBackend):
        raise ValueError(f"cohort: {pg} is not a cohort process group (its backend is {be.name()})")
    return be


def _create(opts: Any, backend_options: Any = None) -> CohortBackend:
    """The creator registered with torch (extended API): the backend of one group."""
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if opts.timeout is not None else datetime.timedelta(minutes=30)
    global_ranks = [int(r) for r in (opts.global_ranks_in_group or [])]
    name = opts.group_id or "0"
    world = bootstrap.world_client()
    if not global_ranks or (len(global_ranks) == size and world is None):
        # The default group, or a cohort group whose default group is of
        # another backend: a membership (a job) of its own, ranked as the
        # group is. cohort.elastic opens the membership first and offers it.
        client = bootstrap.take_adopted()
        if client is None:
            client = bootstrap.join(store, rank, size, timeout)
            adopted = False
        else:
            adopted = True
        if (client.rank, client.world_size) != (rank, size):
            why = (f"cohortd made this process rank {client.rank} of {client.world_size} in job {client.job!r}, "
                   f"but torch was told rank {rank} of {size}")
            elastic = client.is_elastic
            if not adopted:
                bootstrap.forget(client)
                client.close()
            if elastic:
                why += (": the job is elastic (a range of members, docs/elastic.md) and cohortd gives the ranks; "
                        "open it with cohort.elastic.init_process_group() (or a cohort.elastic.Manager), which "
                        "passes torch the rank and size cohortd gave")
            raise CohortBackendError(Status.EINVAL, why, "init_process_group")
        _install_excepthook()
        return CohortBackend(client, client.world, rank, size, timeout, True, name, list(range(size)))
    if world is None:
        raise CohortBackendError(Status.ESTATE, "a cohort subgroup needs a cohort default group first",
                                 "new_group")
    group = world.new_group(group_name(world, f"torch:{name}"), global_ranks, timeout.total_seconds())
    return CohortBackend(world, group, rank, size, timeout, False, name, global_ranks)


def report_exception(exc: BaseException, client: Optional[Client] = None) -> bool:
    """Reports ``exc`` (with its traceback) as this rank's failure.

    The others' pending and next collectives then raise
    :class:`CohortBackendError` naming this rank and quoting the text. The
    first line is the exception itself, so the summary stays readable.
    Returns False if there is no cohort membership or the coordinator could
    not be told.
    """
    c = client or bootstrap.world_client()
    if c is None or not c.handle:
        return False
    return c.report_failure(format_exception_report(exc))


_hook_installed = False


def _install_excepthook() -> None:
    """Reports an uncaught exception of this rank before Python prints it."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    prev = sys.excepthook

    def hook(tp: type, value: BaseException, tb: Any) -> None:
        lost = peer_lost(value)
        if not isinstance(value, (KeyboardInterrupt, SystemExit, CohortBackendError)) and not lost:
            try:
                report_exception(value)
            except Exception:
                pass
        prev(tp, value, tb)
        if lost:
            # Another rank was lost: exit with COHORT_EXIT_PEER_LOST (250),
            # which launchers and Kubernetes' podFailurePolicy tell apart
            # from this rank's own failure (cohort.h). Not here: torch's
            # own hook (init_process_group's "[rankN]:" prefix) calls this
            # one with stderr redirected to a buffer it prints afterwards,
            # so the exit waits for the interpreter's shutdown, where this
            # handler, registered last, runs first.
            atexit.register(_exit_peer_lost)

    sys.excepthook = hook


def _exit_peer_lost() -> None:
    try:
        _close_all()
        sys.stdout.flush()
        sys.stderr.flush()
    finally:
        os._exit(EXIT_PEER_LOST)


@atexit.register
def _close_all() -> None:
    for be in live_backends():
        try:
            be._completer.stop(timeout=5)
        except Exception:
            pass
    bootstrap.close_all()


def _register() -> None:
    """Registers ``"cohort"`` with torch.distributed (idempotent)."""
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=["cpu", "cuda"])


_register()
