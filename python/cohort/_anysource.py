"""``recv(src=None)`` on a cohort group.

torch hands a Python backend's works back to its caller wrapped in a C++
holder that forwards ``wait`` and ``get_future`` only, so
``work._source_rank()``, which ``torch.distributed.recv`` calls to learn
who sent a message received from any rank, raises "sourceRank() may only
be called on work objects that correspond to a recv or recv-from-any call"
for every Python backend, cohort's included (gloo and NCCL are C++).

:func:`install` wraps torch's ``recv`` so that, for a group whose backend
for the tensor's device is cohort's and no source is given, it calls the
backend's ``recv_anysource`` directly and reads the sender from cohort's
own work (``cohort_work_source``). Every other call, and every other
group, goes to torch's function unchanged. Installed when the first
cohort backend is made. ``irecv`` is left alone (``P2POp`` checks its
identity): ``irecv(src=None).wait()`` works, its ``_source_rank()`` raises
as with any Python backend; ``recv(src=None)`` is the way to learn the
sender.
"""

from __future__ import annotations

import functools
from typing import Any, Optional

import torch
import torch.distributed as dist
from torch.distributed import distributed_c10d as c10d

__all__ = ["install"]

_installed = False


def _cohort_backend(group: Optional[dist.ProcessGroup], tensor: torch.Tensor) -> Any:
    """The group's cohort backend for ``tensor``'s device, or None."""
    from .process_group import CohortBackend

    try:
        pg = c10d._group_or_default_group(group)
        b = pg._get_backend(tensor.device)
    except (RuntimeError, ValueError, AttributeError):
        return None
    return b if isinstance(b, CohortBackend) else None


def _any(tensor: torch.Tensor, group: Optional[dist.ProcessGroup], tag: int) -> Any:
    """(the backend's work of a receive from any rank, the group), or None when not cohort's."""
    if c10d.has_torch_function((tensor,)):
        return None
    backend = _cohort_backend(group, tensor)
    if backend is None:
        return None
    c10d._check_single_tensor(tensor, "tensor")
    if c10d._rank_not_in_group(group):
        return None
    return backend.recv_anysource([tensor], tag), c10d._group_or_default_group(group)


def install() -> None:
    """Wraps ``torch.distributed.recv`` (idempotent)."""
    global _installed
    if _installed:
        return
    _installed = True
    torch_recv = c10d.recv

    @functools.wraps(torch_recv)
    def recv(tensor: torch.Tensor, src: Optional[int] = None, group: Optional[dist.ProcessGroup] = None,
             tag: int = 0, group_src: Optional[int] = None) -> int:
        if src is None and group_src is None:
            got = _any(tensor, group, tag)
            if got is not None:
                work, pg = got
                work.wait()
                return c10d.get_global_rank(pg, work._source_rank())
        return torch_recv(tensor, src=src, group=group, tag=tag, group_src=group_src)

    c10d.recv = recv
    dist.recv = recv
