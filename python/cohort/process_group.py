"""The cohort backend of a torch.distributed process group.

torch builds a :class:`torch.distributed.ProcessGroup` for
``init_process_group("cohort")`` or ``new_group(backend="cohort")`` as it
does for gloo and NCCL: the group gets its name and description, and a
:class:`CohortBackend` registered for its devices (``cpu`` and ``cuda``).
Every torch API that asks a group for its name, backend or device then
works (DeviceMesh, DTensor, FSDP2, functional collectives, DCP,
``monitored_barrier``, ``split_group``, ``device_id``), and torch's own
hooks (flight recorder, NaN checks, ``TORCH_DISTRIBUTED_DEBUG=DETAIL``)
see every collective.

One :class:`CohortBackend` per torch group holds up to two libcohort
groups over the same ranks: one for host memory (the job's world group,
or a subgroup; tcp and shared memory) and, created at the first CUDA
collective (every member reaches it at the same point), one for device
memory (NCCL). A synchronous collective runs in the caller's thread with
the GIL released; an asynchronous one on libcohort's progress thread,
returned as a :class:`~cohort.work.CohortWork`.

Point-to-point (``send``, ``recv``, ``recv_anysource``, hence torch's
send/recv/isend/irecv, ``batch_isend_irecv`` and
``torch.distributed.pipelining``) posts ``cohort_isend``/``cohort_irecv``
at once and returns a work: transfers are not ordered with the group's
collectives or with each other (libcohort carries them on connections of
their own), so several may be pending, as a batch posts them. Their works
complete in any order, through a completer of their own.
"""

from __future__ import annotations

import ctypes
import datetime
import threading
import time
import weakref
from typing import Any, Callable, Optional

import torch
import torch.distributed as dist
from torch._C._distributed_c10d import Backend as _C10dBackend

from . import _anysource, bootstrap
from ._abi import ANY_SOURCE, Dtype, RedOp, Status
from ._lib import lib
from ._tensors import (
    contig,
    dtype_of,
    move_dtype_of,
    finisher,
    flat,
    int_mean,
    opts_ms,
    redop_of,
    stream_of,
    timeout_ms,
    unflat_into,
)
from .client import Client, Group, _knob, last_error
from .failures import CohortBackendError, missing_ranks_of
from .work import CohortWork, Completer, DoneWork, JoinedWork

__all__ = ["BACKEND_NAME", "CohortBackend", "live_backends", "group_name"]

#: The name to pass to ``init_process_group`` / ``process_group_backend``.
BACKEND_NAME = "cohort"

_I64, _U8 = int(Dtype.I64), int(Dtype.U8)
_MAX, _MEAN = int(RedOp.MAX), int(RedOp.MEAN)

# Backends torch holds only from C++: a Python subclass must stay
# referenced from Python too, or its overrides vanish with the Python
# object. Dropped at shutdown.
_live: dict[int, "CohortBackend"] = {}
_live_lock = threading.Lock()


def live_backends() -> list["CohortBackend"]:
    """Every cohort backend of this process not shut down yet."""
    with _live_lock:
        return list(_live.values())


def group_name(client: Client, base: str) -> str:
    """The libcohort name of a torch group's cohort group.

    In an elastic job the generation is part of it: cohortd carries a
    group over to the next generation with its surviving members, so the
    torch groups re-created after a change (docs/elastic.md) must not meet
    the carried ones under their old names.
    """
    return f"{base}@g{client.generation}" if client.is_elastic else base


class CohortBackend(_C10dBackend):
    """The cohort backend of one torch process group.

    Created by torch through the registered creator (``init_process_group
    ("cohort")``, ``new_group(backend="cohort")``, ``split_group``); not
    meant to be constructed by hand. The group's public face is torch's
    :class:`~torch.distributed.ProcessGroup`;
    ``group._get_backend(torch.device("cpu"))`` returns this object.
    """

    def __init__(
        self,
        client: Client,
        group: Group,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        owns_client: bool,
        name: str,
        ranks: list[int],
    ) -> None:
        try:
            super().__init__(rank, size)
        except TypeError as e:  # e.g. torch 2.11: "No constructor defined!"
            raise RuntimeError(
                f"the cohort backend needs a torch whose c10d Backend can be subclassed from Python "
                f"(torch {torch.__version__} cannot: {e}); cohort is built and tested with torch 2.15"
            ) from e
        self._client = client
        self._group = group
        self._cuda_group: Optional[Group] = None
        self._rank = rank
        self._size = size
        self._ranks = list(ranks)  # job rank of each group rank
        self._name = name
        self._timeout_s = timeout.total_seconds() if timeout else 1800.0
        self._timeout_ms = timeout_ms(timeout) if timeout else timeout_ms(datetime.timedelta(minutes=30))
        self._owns_client = owns_client
        self._completer = Completer(name)
        self._p2p_completer = Completer(f"{name}:p2p")
        self._closed = False
        # Elastic (cohort.elastic): set while the group must not be used
        # (the job moved on, or a state transfer comes first): the text of
        # the error every collective raises meanwhile, with its status.
        self._refusal: Optional[tuple[int, str]] = None
        self._inflight: "weakref.WeakSet[CohortWork]" = weakref.WeakSet()
        self._lock = threading.Lock()
        self._seq = 0  # collectives issued (_get_sequence_number_for_group)
        self._options = _C10dBackend.Options(BACKEND_NAME, datetime.timedelta(seconds=self._timeout_s))
        with _live_lock:
            _live[id(self)] = self
        _anysource.install()  # recv(src=None) learns its sender

    # -- identity -----------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def _get_sequence_number_for_group(self) -> int:
        """How many collectives this backend has issued.

        torch's ProcessGroupWrapper (what ``TORCH_DISTRIBUTED_DEBUG=DETAIL``
        puts around every group) compares it across ranks with each
        collective's type and shapes to report desynchronised ranks; without
        it every collective of such a group raised "does not yet support
        sequence numbers". Point to point is not counted, as in gloo.
        """
        return self._seq

    def _set_sequence_number_for_group(self) -> None:
        """torch calls this when the group is made; the count starts at 0 there (as gloo's)."""

    @property
    def options(self) -> _C10dBackend.Options:
        """The backend's options (name and timeout), as torch reads them."""
        return self._options

    @property
    def supports_splitting(self) -> bool:
        return True

    @property
    def supports_coalescing(self) -> bool:
        # batch_isend_irecv then posts each transfer itself: they are not
        # ordered, so a batch cannot deadlock. (Without this property,
        # torch's getattr recurses through the C++ default.)
        return False

    def __repr__(self) -> str:
        return (f"CohortBackend(group={self._name!r}, rank={self._rank}, size={self._size}, "
                f"job={self._client.job!r})")

    @property
    def client(self) -> Client:
        """The cohort membership behind this group."""
        return self._client

    @property
    def group(self) -> Group:
        """The libcohort group of host-memory collectives."""
        return self._group

    @property
    def ranks(self) -> list[int]:
        """The job rank of each group rank."""
        return list(self._ranks)

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        """The group's timeout from now on (collectives that give none)."""
        self._timeout_s = timeout.total_seconds()
        self._timeout_ms = timeout_ms(timeout)
        self._options = _C10dBackend.Options(BACKEND_NAME, timeout)

    # -- the libcohort groups -------------------------------------------------

    def _cuda(self) -> Group:
        """The group of device-memory collectives, created at the first one.

        Every member issues the same collectives in the same order, so all
        of them get here at the same collective.
        """
        g = self._cuda_group
        if g is None:
            with self._lock:
                g = self._cuda_group
                if g is None:
                    want = _knob("COHORT_BACKEND")
                    backend = want if want in bootstrap.DEVICE_BACKENDS else "auto"
                    g = self._client.new_group(group_name(self._client, f"torch:{self._name}:cuda"), self._ranks,
                                               self._timeout_s, backend=backend)
                    self._cuda_group = g
        return g

    def _grp(self, t: torch.Tensor) -> Group:
        return self._cuda() if t.is_cuda else self._group

    # -- plumbing -----------------------------------------------------------

    def _check(self, st: int, op: str, g: Optional[Group] = None) -> None:
        if st != 0:
            g = g or self._group
            detail = g.last_error() or last_error()
            raise CohortBackendError(st, detail, op)

    def _ms(self, opts: Any) -> int:
        """The call's timeout: its own if set, else the group's."""
        return opts_ms(opts, self._timeout_ms)

    def _start(
        self,
        op: str,
        opts: Any,
        result: Any,
        g: Group,
        sync_call: Callable[[int], int],
        async_call: Optional[Callable[[Any], int]] = None,
        finish: Optional[Callable[[], None]] = None,
        keep: Any = None,
        local: bool = False,
    ) -> dist._Work:
        """Runs one libcohort collective, blocking or asynchronously.

        ``async_op=False`` (``opts.asyncOp``) runs it in this thread: no
        hand-off, the GIL released while it runs. So does a ``local`` one
        (host memory in a group of one: nothing to wait for, and its
        future is complete when returned instead of after a hop through
        the progress thread and the completer). Otherwise the i-form
        starts it on the group's progress thread and the work is returned.
        """
        if self._closed or self._refusal is not None:
            self._refuse(op)
        self._seq += 1
        if async_call is None or not opts.asyncOp or local:
            st = sync_call(self._ms(opts))
            if st:
                self._check(st, op, g)
            if finish is not None:
                finish()
            return DoneWork(result)
        h = ctypes.c_void_p()
        self._check(async_call(ctypes.byref(h)), op, g)
        return CohortWork(self, op, result, handle=h.value, finish=finish, keep=keep, group=g)

    def _refuse(self, op: str) -> None:
        if self._refusal is not None:
            st, why = self._refusal
            raise CohortBackendError(st, why, op)
        raise CohortBackendError(Status.ECLOSED, "the process group was shut down", op)

    # -- elastic membership (cohort.elastic) ------------------------------------

    def refuse(self, status: int, why: str) -> None:
        """Makes every later collective of the group raise ``status`` with ``why``.

        cohort.elastic marks a group so while it must not be used: its job
        moved to another generation (``EMEMBERSHIP``), or members admitted
        at the last step boundary wait for the state (``ESTATE``).
        """
        self._refusal = (int(status), why)

    def accept(self) -> None:
        """Lifts :meth:`refuse`."""
        self._refusal = None

    def quiesce(self, timeout: float = 30.0) -> bool:
        """Waits until no asynchronous collective of the group is in libcohort.

        After a membership change every pending work ends at once with the
        change's error; ``cohort_client_reform`` requires that none is still
        in flight. True when none is (bounded by ``timeout`` seconds).
        """
        end = time.monotonic() + timeout
        for w in list(self._inflight):
            left = end - time.monotonic()
            if left <= 0:
                return False
            try:
                w.wait(datetime.timedelta(seconds=left))
            except Exception:
                pass  # its error is the change's; only its end matters here
        return self._completer.idle(max(0.0, end - time.monotonic()))

    def detach(self) -> None:
        """Keeps the membership open when the group is shut down.

        ``destroy_process_group`` then releases the group alone: the
        membership lives on in another torch group of the same job (the
        default group re-created for the job's next generation).
        """
        self._owns_client = False

    def _join(self, op: str, works: list[dist._Work], result: Any) -> dist._Work:
        """One work standing for several started in order: done when the last is."""
        if all(isinstance(w, DoneWork) or w._done.is_set() for w in works):
            for w in works:
                exc = w.exception()
                if exc is not None:
                    raise exc
            return DoneWork(result)
        return JoinedWork(self, op, result, works)

    # -- collectives --------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        dt, op = dtype_of(t, "allreduce"), redop_of(opts.reduceOp, t, "allreduce")
        if not opts.asyncOp and not t.is_cuda and (op != _MEAN or t.is_floating_point()) and t.is_contiguous():
            # The common small call (a loss, a metric, a flag), kept short:
            # its cost is the per-call overhead every such call pays.
            if self._closed or self._refusal is not None:
                self._refuse("allreduce")
            p = t.data_ptr()
            st = lib.cohort_allreduce(self._group.handle, p, p, t.numel(), dt, op, None, self._ms(opts))
            if st:
                self._check(st, "allreduce")
            return DoneWork(tensors)
        op, post = int_mean(op, t, self._size)
        buf = contig(t)
        return self._allreduce_buf("allreduce", opts, tensors, buf, dt, op, finisher(buf, t, post))

    def _allreduce_buf(self, name: str, opts: Any, result: Any, buf: torch.Tensor, dt: int, op: int,
                       finish: Optional[Callable[[], None]]) -> dist._Work:
        """All-reduces the contiguous ``buf`` in place."""
        grp = self._grp(buf)
        g, p, n, s = grp.handle, buf.data_ptr(), buf.numel(), stream_of(buf)
        return self._start(
            name, opts, result, grp,
            lambda ms: lib.cohort_allreduce(g, p, p, n, dt, op, s, ms),
            lambda out: lib.cohort_iallreduce(g, p, p, n, dt, op, s, out),
            finish, buf, local=self._size == 1 and not buf.is_cuda,
        )

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not tensors:
            return DoneWork(tensors)
        dtypes = {t.dtype for t in tensors}
        devices = {t.device for t in tensors}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError("cohort allreduce_coalesced: tensors must share one dtype and device")
        t0 = tensors[0]
        dt, op = dtype_of(t0, "allreduce_coalesced"), redop_of(opts.reduceOp, t0, "allreduce_coalesced")
        op, post = int_mean(op, t0, self._size)
        buf = flat(tensors, t0)
        finish = finisher(buf, post=post, then=lambda: unflat_into(buf, tensors))
        return self._allreduce_buf("allreduce_coalesced", opts, tensors, buf, dt, op, finish)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.BroadcastOptions()
        t = tensors[opts.rootTensor]
        root = opts.rootRank
        dt, k = move_dtype_of(t)
        buf = contig(t)
        grp = self._grp(buf)
        g, p, n, s = grp.handle, buf.data_ptr(), buf.numel() * k, stream_of(buf)
        return self._start(
            "broadcast", opts, tensors, grp,
            lambda ms: lib.cohort_broadcast(g, p, n, dt, root, s, ms),
            lambda out: lib.cohort_ibroadcast(g, p, n, dt, root, s, out),
            finisher(buf, t), buf,
        )

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.ReduceOptions()
        t = tensors[opts.rootTensor]
        root = opts.rootRank
        dt, op = dtype_of(t, "reduce"), redop_of(opts.reduceOp, t, "reduce")
        op, post = int_mean(op, t, self._size)
        buf = contig(t)
        finish = finisher(buf, t, post) if self._rank == root else None
        grp = self._grp(buf)
        g, p, n, s = grp.handle, buf.data_ptr(), buf.numel(), stream_of(buf)
        return self._start(
            "reduce", opts, tensors, grp, lambda ms: lib.cohort_reduce(g, p, p, n, dt, op, root, s, ms), None, finish
        )

    def _blocks(self, op: str, src: torch.Tensor, out: torch.Tensor, n: int, whole: str) -> tuple[Any, Any, tuple]:
        """For a collective of ``n``-element blocks from the contiguous ``src`` into
        ``out``, where ``whole`` ("input" or "output") holds the group's size blocks:
        ``out`` made contiguous, its group, and (handle, src and dst pointers, stream)."""
        t = out if whole == "output" else src
        if t.numel() != n * self._size:
            raise ValueError(f"cohort {op}: {whole} has {t.numel()} elements, expected {n} x {self._size}")
        dst = contig(out)
        grp = self._grp(dst)
        return dst, grp, (grp.handle, src.data_ptr(), dst.data_ptr(), stream_of(dst))

    def _gather_into(self, op: str, out: torch.Tensor, inp: torch.Tensor, opts: Any, result: Any,
                     finish: Optional[Callable[[], None]] = None) -> dist._Work:
        """All-gather of equal blocks from ``inp`` into the contiguous ``out``."""
        dt, k = move_dtype_of(inp)
        src = contig(inp)
        dst, grp, (g, sp, dp, s) = self._blocks(op, src, out, src.numel(), "output")
        n = src.numel() * k
        return self._start(
            op, opts, result, grp,
            lambda ms: lib.cohort_allgather(g, sp, dp, n, dt, s, ms),
            lambda o: lib.cohort_iallgather(g, sp, dp, n, dt, s, o),
            finisher(dst, out, then=finish), (src, dst),
        )

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        if len(input_tensors) != 1:
            raise ValueError("cohort allgather: exactly one input tensor per rank is supported")
        inp, outs = input_tensors[0], output_tensors[0]
        if len(outs) != self._size:
            raise ValueError(f"cohort allgather: {len(outs)} output tensors for a group of {self._size}")
        if any(o.numel() != inp.numel() for o in outs):
            return self._allgather_uneven(outs, inp, opts, output_tensors)
        tmp = inp.new_empty((self._size * inp.numel(),))
        return self._gather_into("allgather", tmp, inp, opts, output_tensors, lambda: unflat_into(tmp, outs))

    def _allgather_uneven(self, outs: list[torch.Tensor], inp: torch.Tensor, opts: Any,
                          result: Any) -> dist._Work:
        dt, k = move_dtype_of(inp)
        src = contig(inp)
        counts = (ctypes.c_size_t * self._size)(*[o.numel() * k for o in outs])
        tmp = inp.new_empty((sum(o.numel() for o in outs),))
        grp = self._grp(tmp)
        g, sp, dp, s = grp.handle, src.data_ptr(), tmp.data_ptr(), stream_of(tmp)
        return self._start(
            "allgather", opts, result, grp,
            lambda ms: lib.cohort_allgatherv(g, sp, dp, counts, dt, s, ms),
            None, lambda: unflat_into(tmp, outs),
        )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._gather_into("all_gather_into_tensor", output, input, opts, [output])

    _allgather_base = all_gather_single

    def _each(self, op: str, call: Callable[[Any, Any, Any], dist._Work], outputs: list[Any], inputs: list[Any],
              opts: Any) -> dist._Work:
        """``call(output, input, opts)`` on each pair, joined into one work (the outputs its result)."""
        return self._join(op, [call(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> dist._Work:
        """``output_lists[r][j]`` receives rank ``r``'s ``inputs[j]`` (c10d's and gloo's layout:
        one list per rank, each as long as ``inputs``)."""
        opts = opts if opts is not None else dist.AllgatherOptions()
        if len(output_lists) != self._size or any(len(outs) != len(inputs) for outs in output_lists):
            raise ValueError(f"cohort allgather_coalesced: the outputs must be {self._size} lists (one per rank) "
                             f"of {len(inputs)} tensors (one per input)")
        per_input = [[output_lists[r][j] for r in range(self._size)] for j in range(len(inputs))]
        return self._join("allgather_coalesced",
                          [self.allgather([outs], [inp], opts) for outs, inp in zip(per_input, inputs)],
                          output_lists)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._each("all_gather_into_tensor_coalesced", self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _scatter_reduce(self, op: str, out: torch.Tensor, flat_in: torch.Tensor, opts: Any, result: Any,
                        finish: Optional[Callable[[], None]] = None) -> dist._Work:
        dt, rop = dtype_of(out, op), redop_of(opts.reduceOp, out, op)
        rop, post = int_mean(rop, out, self._size)
        n = out.numel()
        src = contig(flat_in)
        dst, grp, (g, sp, dp, s) = self._blocks(op, src, out, n, "input")
        return self._start(
            op, opts, result, grp,
            lambda ms: lib.cohort_reduce_scatter(g, sp, dp, n, dt, rop, s, ms),
            lambda o: lib.cohort_ireduce_scatter(g, sp, dp, n, dt, rop, s, o),
            finisher(dst, out, post, finish), (src, dst),
        )

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if len(output_tensors) != 1:
            raise ValueError("cohort reduce_scatter: exactly one output tensor per rank is supported")
        out, ins = output_tensors[0], input_tensors[0]
        if len(ins) != self._size or any(i.numel() != out.numel() for i in ins):
            raise ValueError("cohort reduce_scatter: needs one input per rank, each the size of the output")
        return self._scatter_reduce("reduce_scatter", out, flat(ins, out), opts, output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._scatter_reduce("reduce_scatter_tensor", output, input, opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._each("reduce_scatter_tensor_coalesced", self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        inp = input_tensors[0]
        dt, k = move_dtype_of(inp)
        src = contig(inp)
        n = src.numel()
        outs = output_tensors[0] if self._rank == root else []
        if self._rank == root and (len(outs) != self._size or any(o.numel() != n for o in outs)):
            raise ValueError(f"cohort gather: root needs {self._size} outputs of {n} elements")
        tmp = inp.new_empty((n * self._size,)) if self._rank == root else None
        n *= k
        grp = self._grp(src)
        g, sp, s = grp.handle, src.data_ptr(), stream_of(src)
        dp = tmp.data_ptr() if tmp is not None else None
        finish = (lambda: unflat_into(tmp, outs)) if tmp is not None else None
        return self._start(
            "gather", opts, output_tensors, grp, lambda ms: lib.cohort_gather(g, sp, dp, n, dt, root, s, ms), None,
            finish,
        )

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> dist._Work:
        # torch 2.15 does not forward gather_into_tensor to Python backends
        # (nor does gloo have it); kept for a torch that does.
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        dt, k = move_dtype_of(input)
        src = contig(input)
        n = src.numel() * k
        dst = contig(output) if self._rank == root else None
        grp = self._grp(src)
        g, sp, s = grp.handle, src.data_ptr(), stream_of(src)
        dp = dst.data_ptr() if dst is not None else None
        return self._start(
            "gather_into_tensor", opts, [output], grp,
            lambda ms: lib.cohort_gather(g, sp, dp, n, dt, root, s, ms), None, finisher(dst, output),
        )

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        out = output_tensors[0]
        dt, k = move_dtype_of(out)
        n = out.numel()
        buf = None
        if self._rank == root:
            ins = input_tensors[0]
            if len(ins) != self._size or any(i.numel() != n for i in ins):
                raise ValueError(f"cohort scatter: root needs {self._size} inputs of {n} elements")
            buf = flat(ins, out)
        dst = contig(out)
        grp = self._grp(dst)
        g, dp, s = grp.handle, dst.data_ptr(), stream_of(dst)
        sp = buf.data_ptr() if buf is not None else None
        n *= k
        return self._start(
            "scatter", opts, output_tensors, grp, lambda ms: lib.cohort_scatter(g, sp, dp, n, dt, root, s, ms), None,
            finisher(dst, out),
        )

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"cohort all_to_all: needs {self._size} input and output tensors")
        like = input_tensors[0]
        send = flat(input_tensors, like)
        recv = like.new_empty((sum(o.numel() for o in output_tensors),))
        in_splits = [t.numel() for t in input_tensors]
        out_splits = [t.numel() for t in output_tensors]
        return self._alltoall_flat("all_to_all", recv, send, out_splits, in_splits, opts, output_tensors,
                                   lambda: unflat_into(recv, output_tensors))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.AllToAllOptions()
        rows_in = input.shape[0] if input.dim() > 0 else 1
        rows_out = output.shape[0] if output.dim() > 0 else 1
        row_in = input.numel() // max(rows_in, 1)
        row_out = output.numel() // max(rows_out, 1)
        if not input_split_sizes:
            if rows_in % self._size:
                raise ValueError("cohort all_to_all_single: input's first dimension is not divisible by the group size")
            input_split_sizes = [rows_in // self._size] * self._size
        if not output_split_sizes:
            if rows_out % self._size:
                raise ValueError("cohort all_to_all_single: output's first dimension is not divisible by the group size")
            output_split_sizes = [rows_out // self._size] * self._size
        in_splits = [int(k) * row_in for k in input_split_sizes]
        out_splits = [int(k) * row_out for k in output_split_sizes]
        src = contig(input)
        dst = contig(output)
        return self._alltoall_flat("all_to_all_single", dst, src, out_splits, in_splits, opts, [output],
                                   finisher(dst, output))

    alltoall_base = all_to_all_single

    def _alltoall_flat(self, op: str, recv: torch.Tensor, send: torch.Tensor, out_splits: list[int],
                       in_splits: list[int], opts: Any, result: Any,
                       finish: Optional[Callable[[], None]]) -> dist._Work:
        """All-to-all of flat buffers split in element counts.

        Equal splits go to ``cohort_alltoall``, unequal ones to
        ``cohort_alltoallv`` (blocks at their offsets, no padding); both
        blocking or on the progress thread (``async_op``). Ranks whose
        splits disagree get COHORT_EMISMATCH naming both.
        """
        dt, k = move_dtype_of(send)
        n = self._size
        if len(in_splits) != n or len(out_splits) != n:
            raise ValueError(f"cohort {op}: split sizes must have {n} entries")
        if sum(in_splits) != send.numel() or sum(out_splits) != recv.numel():
            raise ValueError(f"cohort {op}: split sizes do not add up to the tensors' sizes")
        if any(c < 0 for c in in_splits + out_splits):
            raise ValueError(f"cohort {op}: split sizes must not be negative")
        in_splits, out_splits = [c * k for c in in_splits], [c * k for c in out_splits]
        grp = self._grp(send)
        g, s = grp.handle, stream_of(send)
        sp, dp = send.data_ptr(), recv.data_ptr()
        if len(set(in_splits)) == 1 and len(set(out_splits)) == 1 and in_splits[0] == out_splits[0]:
            cnt = in_splits[0]
            return self._start(op, opts, result, grp, lambda ms: lib.cohort_alltoall(g, sp, dp, cnt, dt, s, ms),
                               None, finish)
        arr = ctypes.c_size_t * n
        sc, rc = arr(*in_splits), arr(*out_splits)
        sd, rd = arr(), arr()
        for j in range(1, n):
            sd[j] = sd[j - 1] + in_splits[j - 1]
            rd[j] = rd[j - 1] + out_splits[j - 1]
        return self._start(
            op, opts, result, grp,
            lambda ms: lib.cohort_alltoallv(g, sp, sc, sd, dp, rc, rd, dt, s, ms),
            lambda out: lib.cohort_ialltoallv(g, sp, sc, sd, dp, rc, rd, dt, s, out),
            finish, (send, recv),
        )

    # -- barriers -------------------------------------------------------------

    def barrier(self, opts: Any = None) -> dist._Work:
        opts = opts if opts is not None else dist.BarrierOptions()
        # The data-plane queue before the coordinator's barrier: a barrier
        # after an async collective means "after it", as with gloo.
        if self._closed or self._refusal is not None:
            self._refuse("barrier")
        self._seq += 1
        one = torch.zeros(1, dtype=torch.uint8)
        ms = self._ms(opts)
        g = self._group.handle
        self._check(lib.cohort_allreduce(g, one.data_ptr(), one.data_ptr(), 1, _U8, _MAX, None, ms), "barrier")
        self._check(lib.cohort_barrier(g, b"", ms), "barrier")
        return DoneWork(None)

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        """A barrier that names the ranks that did not reach it in time.

        Every rank that reached it raises, after the timeout, a
        :class:`~cohort.torch.CohortBackendError` (``ETIMEDOUT``) whose text
        says, as gloo's does, ``Rank 1 failed to pass monitoredBarrier in
        1000 ms`` (``Ranks 1, 2 ...`` for several; cohort knows all of them,
        so ``wait_all_ranks`` makes no difference), with the group ranks in
        ``missing_ranks``. A rank that died instead is named as failed
        (``EPEERLOST``). The group stays usable after a timeout.
        """
        opts = opts if opts is not None else dist.BarrierOptions()
        # torch passes the caller's timeout (its default when none was
        # given); zero means no wait, as in gloo, not "the group's".
        ms = 0 if opts.timeout == datetime.timedelta(0) else self._ms(opts)
        st = lib.cohort_barrier(self._group.handle, b"monitored_barrier", ms)
        if st == Status.ETIMEDOUT:
            detail = self._group.last_error() or last_error()
            job_missing = missing_ranks_of(detail)
            missing = [self._ranks.index(r) for r in job_missing if r in self._ranks]
            who = (f"Rank {missing[0]}" if len(missing) == 1 else
                   "Ranks " + ", ".join(map(str, missing)) if missing else "Some ranks")
            err = CohortBackendError(
                st, f"[Rank {self._rank}]: {who} failed to pass monitoredBarrier in {ms} ms ({detail})",
                "monitored_barrier")
            err.missing_ranks = missing
            raise err
        self._check(st, "monitored_barrier")

    # -- point to point --------------------------------------------------------

    def _p2p(self, op: str, tensors: list[torch.Tensor], peer: int, tag: int, send: bool) -> dist._Work:
        """Posts one transfer (``cohort_isend``/``cohort_irecv``) and returns its work.

        A non-contiguous tensor goes through a contiguous copy (gloo
        refuses those). ``tag`` is taken modulo 2**32.
        """
        if self._closed:
            raise CohortBackendError(Status.ECLOSED, "the process group was shut down", op)
        if len(tensors) != 1:
            raise ValueError(f"cohort {op}: exactly one tensor per call is supported")
        t = tensors[0]
        dt, k = move_dtype_of(t)
        buf = contig(t)
        grp = self._grp(buf)
        g, p, n, s = grp.handle, buf.data_ptr(), buf.numel() * k, stream_of(buf)
        h = ctypes.c_void_p()
        tag &= 0xFFFFFFFF
        if send:
            st = lib.cohort_isend(g, p, n, dt, peer, tag, s, ctypes.byref(h))
            work_cls, finish = CohortWork, None
        else:
            st = lib.cohort_irecv(g, p, n, dt, peer, tag, s, ctypes.byref(h))
            work_cls, finish = _RecvWork, finisher(buf, t)
        self._check(st, op, grp)
        return work_cls(self, op, tensors, handle=h.value, finish=finish, keep=buf, group=grp,
                        completer=self._p2p_completer)

    def send(self, tensors: list[torch.Tensor], dstRank: int, tag: int = 0) -> dist._Work:
        """Sends ``tensors[0]`` to group rank ``dstRank`` (torch's send and isend)."""
        return self._p2p("send", tensors, int(dstRank), int(tag), True)

    def recv(self, tensors: list[torch.Tensor], srcRank: int, tag: int = 0) -> dist._Work:
        """Receives into ``tensors[0]`` from group rank ``srcRank`` (torch's recv and irecv)."""
        return self._p2p("recv", tensors, int(srcRank), int(tag), False)

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> dist._Work:
        """Receives from whichever rank sends with ``tag`` first (``recv(src=None)``)."""
        return self._p2p("recv_anysource", tensors, ANY_SOURCE, int(tag), False)

    # -- splitting and devices -------------------------------------------------

    def split(self, store: Any, ranks: list[int], opts: Any) -> Optional["CohortBackend"]:
        """The backend of a group of ``ranks`` (ranks of this group), for ``split_group``.

        torch calls it on every rank of this group, with the split the rank
        is in, or the first split for a rank in none. Such a rank should
        get None back, but torch 2.15 crashes (SIGSEGV in its
        ``PyBackend::split``) on a None from a backend written in Python,
        so it gets a ``ValueError`` saying how to avoid it instead.
        """
        ranks = [int(r) for r in ranks]
        if self._rank not in ranks:
            raise ValueError(
                f"cohort split_group: rank {self._rank} is in none of the splits; torch 2.15 cannot leave a rank "
                f"out of a split of a group whose backend is written in Python (it crashes on the 'not a member' "
                f"answer), so give every rank of the parent group a split (a group of its own, [{self._rank}], "
                f"will do), or use new_group(ranks) for a group that leaves ranks out")
        job_ranks = [self._ranks[r] for r in ranks]
        timeout = opts._timeout if opts is not None and opts._timeout else datetime.timedelta(
            seconds=self._timeout_s)
        name = (opts.group_name if opts is not None else "") or f"{self._name}:split"
        group = self._client.new_group(group_name(self._client, f"torch:{name}"), job_ranks, timeout.total_seconds())
        return CohortBackend(self._client, group, ranks.index(self._rank), len(ranks), timeout, False, name,
                             job_ranks)

    def perform_nocolor_split(self, device: torch.device) -> None:
        """A rank outside a subgroup being split off: nothing to do (cohort subgroups form among members)."""

    def eager_connect_single_device(self, device: Optional[torch.device]) -> None:
        """``init_process_group(device_id=...)``: sets up the data plane for ``device`` now."""
        if device is not None and device.type == "cuda":
            self._cuda().connect(self._timeout_s)
        else:
            self._group.connect(self._timeout_s)

    # -- lifecycle ----------------------------------------------------------

    def abort(self) -> None:
        """Wakes every pending collective of this group with an error; never blocks."""
        self._group.abort()
        if self._cuda_group is not None:
            self._cuda_group.abort()

    def shutdown(self) -> None:
        """Releases the group (and, for the world group, leaves the job cleanly)."""
        if self._closed:
            return
        self._closed = True
        self._completer.stop()
        self._p2p_completer.stop()
        if self._cuda_group is not None:
            self._cuda_group.destroy()
        if self._owns_client:
            bootstrap.forget(self._client)
            self._client.close()
        elif self._group is not self._client.world:
            self._group.destroy()
        with _live_lock:
            _live.pop(id(self), None)


class _RecvWork(CohortWork):
    """A receive's work: also says which group rank the message came from."""

    _source = -1

    def _wait_handle(self, ms: int) -> bool:
        # The source is read before the base class frees the handle.
        h = self._handle
        if h is not None:
            if self._wait_native(h, ms) is None:
                return False
            src = ctypes.c_int32(-1)
            if lib.cohort_work_source(h, ctypes.byref(src)) == 0:
                self._source = src.value
            ms = 0
        return super()._wait_handle(ms)

    def _source_rank(self) -> int:
        """The group rank the message came from (after ``wait``)."""
        return self._source

    source_rank = _source_rank
