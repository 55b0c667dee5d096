"""The ``"cohort"`` backend for torch.distributed.

Importing this module registers the backend::

    import cohort.torch
    torch.distributed.init_process_group("cohort")          # env://, torchrun, ...
    Trainer(strategy=DDPStrategy(process_group_backend="cohort"))

Every collective goes peer to peer through libcohort (shared memory between
ranks on one host, TCP across hosts; CUDA tensors through NCCL where a GPU
is present); the coordinator ``cohortd`` runs rendezvous, barriers and
failure detection. When the environment names no coordinator
(``COHORT_COORDINATOR``, as ``cohort run`` sets it), rank 0 starts a private
one and publishes its address in torch's store, so nothing has to be set up
by hand.

When a rank dies or reports an exception, every other rank's pending and
next collective raises :class:`CohortBackendError` (a
:class:`torch.distributed.DistBackendError`) naming the failed rank, its
host and pid, the operation, and the failed rank's own error text. An
uncaught exception in a rank is reported to the coordinator on its way out
(``sys.excepthook``), so the others learn *why*, not only that it is gone.
"""

from __future__ import annotations

import atexit
import ctypes
import datetime
import os
import queue
import sys
import threading
import traceback
import weakref
from typing import Any, Callable, Optional, Sequence

import torch
import torch.distributed as dist
from torch.distributed import ReduceOp

from . import _core
from ._core import CohortError, Status, lib

__all__ = [
    "BACKEND_NAME",
    "CohortBackendError",
    "CohortProcessGroup",
    "CohortWork",
    "report_exception",
    "current_client",
]

#: The name to pass to ``init_process_group`` / ``process_group_backend``.
BACKEND_NAME = "cohort"

# Store key under which rank 0 publishes a coordinator it started.
_STORE_KEY = "cohort/coordinator"


class CohortBackendError(CohortError, dist.DistBackendError):
    """A cohort collective failed.

    A :class:`torch.distributed.DistBackendError`, so code that handles
    torch's backend errors handles this one. ``failed_rank`` is the rank that
    failed (for ``status == Status.EPEERLOST``), ``detail`` the full text:
    that rank's host and pid, the operation it was in and its own error text.
    """


# torch dtype -> cohort_dtype
_DTYPES: dict[torch.dtype, int] = {
    torch.float32: 0,
    torch.float64: 1,
    torch.float16: 2,
    torch.bfloat16: 3,
    torch.int32: 4,
    torch.int64: 5,
    torch.uint8: 6,
    torch.bool: 6,  # as u8: SUM/MAX are "or", PRODUCT/MIN "and"
}
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

# RedOpType -> cohort_redop
_SUM, _PROD, _MIN, _MAX, _MEAN = 0, 1, 2, 3, 4
_OPS = {
    ReduceOp.SUM: _SUM,
    ReduceOp.PRODUCT: _PROD,
    ReduceOp.MIN: _MIN,
    ReduceOp.MAX: _MAX,
    ReduceOp.AVG: _MEAN,
}


def _dtype(t: torch.Tensor, op: str) -> int:
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise TypeError(
            f"cohort {op}: dtype {t.dtype} is not supported (supported: float32, float64, "
            f"float16, bfloat16, int32, int64, uint8, bool)"
        ) from None


def _redop(reduce_op: Any, t: torch.Tensor, op: str) -> int:
    kind = getattr(reduce_op, "op", reduce_op)
    try:
        code = _OPS[kind]
    except KeyError:
        raise ValueError(
            f"cohort {op}: reduce op {kind} is not supported (supported: SUM, AVG, PRODUCT, MIN, MAX)"
        ) from None
    if t.dtype == torch.bool:
        if code == _MEAN:
            raise ValueError(f"cohort {op}: AVG is not defined for bool tensors")
        return _MAX if code in (_SUM, _MAX) else _MIN
    return code


def _int_mean(code: int, t: torch.Tensor, size: int) -> tuple[int, Optional[Callable[[torch.Tensor], None]]]:
    """AVG on an integer tensor: SUM, then division truncated toward zero (as NCCL)."""
    if code == _MEAN and t.dtype not in _FLOATS:
        return _SUM, lambda buf: buf.copy_(torch.div(buf, size, rounding_mode="trunc"))
    return code, None


_ZERO = datetime.timedelta(0)


def _timeout_ms(td: Optional[datetime.timedelta]) -> int:
    """A torch timeout (timedelta; zero or negative = the group's) in ms."""
    if td is None:
        return _core.WAIT_DEFAULT
    ms = int(td.total_seconds() * 1000)
    return _core.WAIT_DEFAULT if ms <= 0 else min(ms, 2**31 - 1)


def _stream(t: torch.Tensor) -> Optional[int]:
    if t.is_cuda:
        return torch.cuda.current_stream(t.device).cuda_stream
    return None


def _contig(t: torch.Tensor) -> torch.Tensor:
    return t if t.is_contiguous() else t.contiguous()


def _flat(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """One contiguous buffer holding ``tensors`` back to back (a copy)."""
    if not tensors:
        return like.new_empty(0)
    return torch.cat([t.reshape(-1) for t in tensors])


def _unflat_into(flat: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    off = 0
    for o in outs:
        n = o.numel()
        o.copy_(flat[off : off + n].view_as(o))
        off += n


def _finisher(
    buf: Optional[torch.Tensor],
    target: Optional[torch.Tensor] = None,
    post: Optional[Callable[[torch.Tensor], Any]] = None,
    then: Optional[Callable[[], Any]] = None,
) -> Optional[Callable[[], None]]:
    """What runs once a collective has filled ``buf``: ``post`` on it (an
    integer mean's division), the copy into ``target`` where ``buf`` is a
    contiguous stand-in for it, then ``then``. None when nothing has to."""
    copy = buf is not None and target is not None and buf is not target
    if post is None and not copy:
        return then

    def finish() -> None:
        if post is not None:
            post(buf)
        if copy:
            target.copy_(buf)
        if then is not None:
            then()

    return finish


# ---------------------------------------------------------------------------
# Work objects
# ---------------------------------------------------------------------------


class _Completer:
    """Completes the futures of a group's asynchronous work, in issue order.

    One daemon thread per process group waits (GIL released, in libcohort)
    for each work whose future was asked for (DDP asks for every bucket),
    then runs its completion: copies back into non-contiguous outputs and
    sets the future, which runs DDP's callbacks. Works of one group finish
    in issue order, so one FIFO never waits behind a later work.
    """

    def __init__(self, name: str) -> None:
        self._q: "queue.SimpleQueue[Optional[CohortWork]]" = queue.SimpleQueue()
        self._thread: Optional[threading.Thread] = None
        self._name = name
        self._lock = threading.Lock()

    def submit(self, w: "CohortWork") -> None:
        with self._lock:
            if self._thread is None:
                self._thread = threading.Thread(target=self._run, name=f"cohort-{self._name}", daemon=True)
                self._thread.start()
        self._q.put(w)

    def _run(self) -> None:
        while True:
            w = self._q.get()
            if w is None:
                return
            while not w._wait_native(_core.WAIT_DEFAULT):
                pass

    def stop(self) -> None:
        with self._lock:
            t, self._thread = self._thread, None
        if t is not None:
            self._q.put(None)
            t.join(timeout=30)


class CohortWork(dist._Work):
    """The handle torch gets back from every cohort collective.

    Asynchronous operations (all-reduce, broadcast, all-gather,
    reduce-scatter issued with ``async_op=True`` or by DDP) are backed by a
    libcohort ``cohort_work``; ``wait`` blocks in libcohort with the GIL
    released, ``get_future`` hands the work to the group's completion
    thread. Everything else completed before it was returned.
    """

    def __init__(
        self,
        pg: "CohortProcessGroup",
        op: str,
        result: Any,
        handle: Optional[int] = None,
        finish: Optional[Callable[[], None]] = None,
        keep: Any = None,
    ) -> None:
        super().__init__()
        self._pg = pg
        self._op = op
        self._result = result
        self._handle = handle
        self._finish = finish
        self._keep = keep  # buffers libcohort reads or writes until done
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._exc: Optional[BaseException] = None
        self._fut: Optional[torch.futures.Future] = None
        self._user_fut: Optional[torch.futures.Future] = None
        self._owner = False  # a thread is waiting in libcohort
        if handle is None:
            self._complete(None)

    # -- completion ---------------------------------------------------------

    def _complete(self, exc: Optional[BaseException]) -> None:
        if exc is None and self._finish is not None:
            try:
                self._finish()
            except BaseException as e:  # copy-back failed: report, do not lose
                exc = e
        with self._lock:
            self._exc = exc
            self._keep = None
            self._finish = None
            fut = self._fut
            self._done.set()
        if fut is not None:
            self._settle(fut)

    def _settle(self, base: torch.futures.Future) -> None:
        # Always a result on the base future; _unwrap raises on failure.
        base.set_result(self._result)

    def _unwrap(self, base: torch.futures.Future) -> Any:
        if self._exc is not None:
            raise self._exc
        return base.value()

    def _wait_native(self, timeout_ms: int) -> bool:
        """Waits in libcohort (the caller owns the handle). False on timeout."""
        h = self._handle
        st = lib.cohort_work_wait(h, timeout_ms)
        if st == Status.ETIMEDOUT:
            done = ctypes.c_bool(False)
            lib.cohort_work_test(h, ctypes.byref(done))
            if not done.value:
                return False
        exc = None
        if st != 0:
            detail = _core.last_error() or self._pg._group.last_error()
            exc = CohortBackendError(st, self._pg._group.last_error() or detail, self._op)
        self._handle = None
        lib.cohort_work_free(h)
        self._complete(exc)
        return True

    # -- torch's Work interface ---------------------------------------------

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        ms = _timeout_ms(timeout)
        with self._lock:
            native = not self._done.is_set() and not self._owner
            if native:
                self._owner = True
        if native:
            if not self._wait_native(ms):
                with self._lock:
                    self._owner = False
                raise CohortBackendError(
                    Status.ETIMEDOUT, f"{self._op} did not complete within {ms} ms", self._op
                )
        elif not self._done.is_set():
            secs = None if ms < 0 else ms / 1000.0
            if ms == _core.WAIT_DEFAULT:
                secs = self._pg._timeout_s
            if not self._done.wait(secs):
                raise CohortBackendError(Status.ETIMEDOUT, f"{self._op} did not complete in time", self._op)
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future:
        """A future of the work's outputs, completed by the group's thread.

        A failed work fails the future through a ``then`` callback, so that
        C++ consumers (DDP's reducer) see an error and raise it from
        ``backward()``; torch's ``Future.set_exception`` would instead
        store the exception object as the value, which the reducer reads as
        tensors (a crash in torch 2.15). The error reaches DDP's caller as
        a RuntimeError quoting this :class:`CohortBackendError`; every later
        collective of the group raises the CohortBackendError itself.
        """
        with self._lock:
            if self._fut is not None:
                return self._user_fut
            base = torch.futures.Future()
            self._fut = base
            self._user_fut = base.then(self._unwrap)
            done = self._done.is_set()
            hand_off = not done and not self._owner
            if hand_off:
                self._owner = True
        if done:
            self._settle(base)
        elif hand_off:
            self._pg._completer.submit(self)
        return self._user_fut

    def is_completed(self) -> bool:
        if self._done.is_set():
            return True
        h = self._handle
        if h is None:
            return self._done.is_set()
        done = ctypes.c_bool(False)
        lib.cohort_work_test(h, ctypes.byref(done))
        return bool(done.value)

    def is_success(self) -> bool:
        return self._done.is_set() and self._exc is None

    def exception(self) -> Optional[BaseException]:
        return self._exc

    def result(self) -> Any:
        return self._result

    def synchronize(self) -> None:
        self.wait()

    def __del__(self) -> None:
        # A work nobody waited for still holds libcohort's handle: hand it
        # to the completion thread, which frees it once the work is done.
        try:
            if self._handle is not None and not self._owner and not self._done.is_set():
                self._owner = True
                self._pg._completer.submit(self)
        except Exception:
            pass


# ---------------------------------------------------------------------------
# The process group
# ---------------------------------------------------------------------------


class CohortProcessGroup(dist.ProcessGroup):
    """A torch.distributed process group whose collectives run on cohort.

    Created by torch through the registered backend (``init_process_group
    ("cohort")``, ``new_group(backend="cohort")``); not meant to be
    constructed by hand.
    """

    def __init__(
        self,
        client: _core.Client,
        group: _core.Group,
        rank: int,
        size: int,
        timeout: datetime.timedelta,
        owns_client: bool,
        name: str,
    ) -> None:
        super().__init__(rank, size)
        self._client = client
        self._group = group
        self._rank = rank
        self._size = size
        self._timeout_s = timeout.total_seconds() if timeout else 1800.0
        self._timeout_ms = min(int(self._timeout_s * 1000), 2**31 - 1)
        self._owns_client = owns_client
        self._completer = _Completer(name)
        self._closed = False

    # -- identity -----------------------------------------------------------

    def getBackendName(self) -> str:
        return BACKEND_NAME

    def getRank(self) -> int:
        return self._rank

    def getSize(self) -> int:
        return self._size

    def __repr__(self) -> str:
        return f"CohortProcessGroup(rank={self._rank}, size={self._size}, job={self._client.job!r})"

    @property
    def client(self) -> _core.Client:
        """The cohort membership behind this group."""
        return self._client

    def set_timeout(self, timeout: datetime.timedelta) -> None:
        self._timeout_s = timeout.total_seconds()
        self._timeout_ms = _timeout_ms(timeout)

    # -- plumbing -----------------------------------------------------------

    def _check(self, st: int, op: str) -> None:
        if st != 0:
            detail = self._group.last_error() or _core.last_error()
            raise CohortBackendError(st, detail, op)

    def _ms(self, opts: Any) -> int:
        """The call's timeout: its own if set, else the group's."""
        td = opts.timeout
        if td.days < 0 or td == _ZERO:  # torch's "unset" is -1 ms
            return self._timeout_ms
        return _timeout_ms(td)

    def _start(
        self,
        op: str,
        opts: Any,
        result: Any,
        sync_call: Callable[[int], int],
        async_call: Optional[Callable[[Any], int]] = None,
        finish: Optional[Callable[[], None]] = None,
        keep: Any = None,
    ) -> CohortWork:
        """Runs one libcohort collective, blocking or asynchronously.

        ``async_op=False`` (``opts.asyncOp``) runs it in this thread: no
        hand-off, the GIL released while it runs. Otherwise the i-form
        starts it on the group's progress thread and the work is returned.
        """
        if self._closed:
            raise CohortBackendError(Status.ECLOSED, "the process group was shut down", op)
        if async_call is None or not opts.asyncOp:
            st = sync_call(self._ms(opts))
            if st:
                self._check(st, op)
            if finish is not None:
                finish()
            return _DoneWork(result)
        h = ctypes.c_void_p()
        self._check(async_call(ctypes.byref(h)), op)
        return CohortWork(self, op, result, handle=h.value, finish=finish, keep=keep)

    # -- collectives --------------------------------------------------------

    def allreduce(self, tensors: list[torch.Tensor], opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllreduceOptions()
        if len(tensors) != 1:
            return self.allreduce_coalesced(tensors, opts)
        t = tensors[0]
        dt, op = _dtype(t, "allreduce"), _redop(opts.reduceOp, t, "allreduce")
        op, post = _int_mean(op, t, self._size)
        buf = _contig(t)
        return self._allreduce_buf("allreduce", opts, tensors, buf, dt, op, _finisher(buf, t, post))

    def _allreduce_buf(self, name: str, opts: Any, result: Any, buf: torch.Tensor, dt: int, op: int,
                       finish: Optional[Callable[[], None]]) -> CohortWork:
        """All-reduces the contiguous ``buf`` in place."""
        g, p, n, s = self._group.handle, buf.data_ptr(), buf.numel(), _stream(buf)
        return self._start(
            name,
            opts,
            result,
            lambda ms: lib.cohort_allreduce(g, p, p, n, dt, op, s, ms),
            lambda out: lib.cohort_iallreduce(g, p, p, n, dt, op, s, out),
            finish,
            buf,
        )

    def allreduce_coalesced(self, tensors: list[torch.Tensor], opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllreduceCoalescedOptions()
        if not tensors:
            return _DoneWork(tensors)
        dtypes = {t.dtype for t in tensors}
        devices = {t.device for t in tensors}
        if len(dtypes) != 1 or len(devices) != 1:
            raise ValueError("cohort allreduce_coalesced: tensors must share one dtype and device")
        t0 = tensors[0]
        dt, op = _dtype(t0, "allreduce_coalesced"), _redop(opts.reduceOp, t0, "allreduce_coalesced")
        op, post = _int_mean(op, t0, self._size)
        flat = _flat(tensors, t0)
        finish = _finisher(flat, post=post, then=lambda: _unflat_into(flat, tensors))
        return self._allreduce_buf("allreduce_coalesced", opts, tensors, flat, dt, op, finish)

    def broadcast(self, tensors: list[torch.Tensor], opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.BroadcastOptions()
        t = tensors[opts.rootTensor]
        root = opts.rootRank
        dt = _dtype(t, "broadcast")
        buf = _contig(t)
        finish = _finisher(buf, t)
        g, p, n, s = self._group.handle, buf.data_ptr(), buf.numel(), _stream(buf)
        return self._start(
            "broadcast",
            opts,
            tensors,
            lambda ms: lib.cohort_broadcast(g, p, n, dt, root, s, ms),
            lambda out: lib.cohort_ibroadcast(g, p, n, dt, root, s, out),
            finish,
            buf,
        )

    def reduce(self, tensors: list[torch.Tensor], opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.ReduceOptions()
        t = tensors[opts.rootTensor]
        root = opts.rootRank
        dt, op = _dtype(t, "reduce"), _redop(opts.reduceOp, t, "reduce")
        op, post = _int_mean(op, t, self._size)
        buf = _contig(t)
        finish = _finisher(buf, t, post) if self._rank == root else None
        g, p, n, s = self._group.handle, buf.data_ptr(), buf.numel(), _stream(buf)
        return self._start(
            "reduce", opts, tensors, lambda ms: lib.cohort_reduce(g, p, p, n, dt, op, root, s, ms), None, finish
        )

    def _gather_into(self, op: str, out: torch.Tensor, inp: torch.Tensor, opts: Any, result: Any,
                     finish: Optional[Callable[[], None]] = None) -> CohortWork:
        """All-gather of equal blocks from ``inp`` into the contiguous ``out``."""
        dt = _dtype(inp, op)
        src = _contig(inp)
        n = src.numel()
        if out.numel() != n * self._size:
            raise ValueError(f"cohort {op}: output has {out.numel()} elements, expected {n} x {self._size}")
        dst = _contig(out)
        fin = _finisher(dst, out, then=finish)
        g, sp, dp, s = self._group.handle, src.data_ptr(), dst.data_ptr(), _stream(dst)
        return self._start(
            op,
            opts,
            result,
            lambda ms: lib.cohort_allgather(g, sp, dp, n, dt, s, ms),
            lambda o: lib.cohort_iallgather(g, sp, dp, n, dt, s, o),
            fin,
            (src, dst),
        )

    def allgather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
                  opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        if len(input_tensors) != 1:
            raise ValueError("cohort allgather: exactly one input tensor per rank is supported")
        inp, outs = input_tensors[0], output_tensors[0]
        if len(outs) != self._size:
            raise ValueError(f"cohort allgather: {len(outs)} output tensors for a group of {self._size}")
        if any(o.numel() != inp.numel() for o in outs):
            return self._allgather_uneven(outs, inp, opts, output_tensors)
        tmp = inp.new_empty((self._size * inp.numel(),))
        return self._gather_into("allgather", tmp, inp, opts, output_tensors, lambda: _unflat_into(tmp, outs))

    def _allgather_uneven(self, outs: list[torch.Tensor], inp: torch.Tensor, opts: Any, result: Any) -> CohortWork:
        dt = _dtype(inp, "allgather")
        src = _contig(inp)
        counts = (ctypes.c_size_t * self._size)(*[o.numel() for o in outs])
        tmp = inp.new_empty((sum(o.numel() for o in outs),))
        g, sp, dp, s = self._group.handle, src.data_ptr(), tmp.data_ptr(), _stream(tmp)
        return self._start(
            "allgather", opts, result,
            lambda ms: lib.cohort_allgatherv(g, sp, dp, counts, dt, s, ms),
            None, lambda: _unflat_into(tmp, outs),
        )

    def all_gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._gather_into("all_gather_into_tensor", output, input, opts, [output])

    _allgather_base = all_gather_single

    def _each(self, op: str, call: Callable[[Any, Any, Any], CohortWork], outputs: list[Any], inputs: list[Any],
              opts: Any) -> CohortWork:
        """``call(output, input, opts)`` on each pair, joined into one work (the outputs its result)."""
        return self._join(op, [call(o, i, opts) for o, i in zip(outputs, inputs)], outputs)

    def allgather_coalesced(self, output_lists: list[list[torch.Tensor]], inputs: list[torch.Tensor],
                            opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._each("allgather_coalesced", lambda outs, inp, o: self.allgather([outs], [inp], o),
                          output_lists, inputs, opts)

    def all_gather_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                    opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllgatherOptions()
        return self._each("all_gather_into_tensor_coalesced", self.all_gather_single, outputs, inputs, opts)

    allgather_into_tensor_coalesced = all_gather_single_coalesced

    def _scatter_reduce(self, op: str, out: torch.Tensor, flat_in: torch.Tensor, opts: Any, result: Any,
                        finish: Optional[Callable[[], None]] = None) -> CohortWork:
        dt, rop = _dtype(out, op), _redop(opts.reduceOp, out, op)
        rop, post = _int_mean(rop, out, self._size)
        n = out.numel()
        src = _contig(flat_in)
        if src.numel() != n * self._size:
            raise ValueError(f"cohort {op}: input has {src.numel()} elements, expected {n} x {self._size}")
        dst = _contig(out)
        fin = _finisher(dst, out, post, finish)
        g, sp, dp, s = self._group.handle, src.data_ptr(), dst.data_ptr(), _stream(dst)
        return self._start(
            op,
            opts,
            result,
            lambda ms: lib.cohort_reduce_scatter(g, sp, dp, n, dt, rop, s, ms),
            lambda o: lib.cohort_ireduce_scatter(g, sp, dp, n, dt, rop, s, o),
            fin,
            (src, dst),
        )

    def reduce_scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                       opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        if len(output_tensors) != 1:
            raise ValueError("cohort reduce_scatter: exactly one output tensor per rank is supported")
        out, ins = output_tensors[0], input_tensors[0]
        if len(ins) != self._size or any(i.numel() != out.numel() for i in ins):
            raise ValueError("cohort reduce_scatter: needs one input per rank, each the size of the output")
        return self._scatter_reduce("reduce_scatter", out, _flat(ins, out), opts, output_tensors)

    def reduce_scatter_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._scatter_reduce("reduce_scatter_tensor", output, input, opts, [output])

    _reduce_scatter_base = reduce_scatter_single

    def reduce_scatter_single_coalesced(self, outputs: list[torch.Tensor], inputs: list[torch.Tensor],
                                        opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.ReduceScatterOptions()
        return self._each("reduce_scatter_tensor_coalesced", self.reduce_scatter_single, outputs, inputs, opts)

    reduce_scatter_tensor_coalesced = reduce_scatter_single_coalesced

    def gather(self, output_tensors: list[list[torch.Tensor]], input_tensors: list[torch.Tensor],
               opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        inp = input_tensors[0]
        dt = _dtype(inp, "gather")
        src = _contig(inp)
        n = src.numel()
        outs = output_tensors[0] if self._rank == root else []
        if self._rank == root and (len(outs) != self._size or any(o.numel() != n for o in outs)):
            raise ValueError(f"cohort gather: root needs {self._size} outputs of {n} elements")
        tmp = inp.new_empty((n * self._size,)) if self._rank == root else None
        g, sp, s = self._group.handle, src.data_ptr(), _stream(src)
        dp = tmp.data_ptr() if tmp is not None else None
        finish = (lambda: _unflat_into(tmp, outs)) if tmp is not None else None
        return self._start(
            "gather", opts, output_tensors, lambda ms: lib.cohort_gather(g, sp, dp, n, dt, root, s, ms), None, finish
        )

    def gather_single(self, output: torch.Tensor, input: torch.Tensor, opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.GatherOptions()
        root = opts.rootRank
        dt = _dtype(input, "gather_into_tensor")
        src = _contig(input)
        n = src.numel()
        dst = _contig(output) if self._rank == root else None
        finish = _finisher(dst, output)
        g, sp, s = self._group.handle, src.data_ptr(), _stream(src)
        dp = dst.data_ptr() if dst is not None else None
        return self._start(
            "gather_into_tensor", opts, [output],
            lambda ms: lib.cohort_gather(g, sp, dp, n, dt, root, s, ms), None, finish,
        )

    def scatter(self, output_tensors: list[torch.Tensor], input_tensors: list[list[torch.Tensor]],
                opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.ScatterOptions()
        root = opts.rootRank
        out = output_tensors[0]
        dt = _dtype(out, "scatter")
        n = out.numel()
        flat = None
        if self._rank == root:
            ins = input_tensors[0]
            if len(ins) != self._size or any(i.numel() != n for i in ins):
                raise ValueError(f"cohort scatter: root needs {self._size} inputs of {n} elements")
            flat = _flat(ins, out)
        dst = _contig(out)
        finish = _finisher(dst, out)
        g, dp, s = self._group.handle, dst.data_ptr(), _stream(dst)
        sp = flat.data_ptr() if flat is not None else None
        return self._start(
            "scatter", opts, output_tensors, lambda ms: lib.cohort_scatter(g, sp, dp, n, dt, root, s, ms), None, finish
        )

    def alltoall(self, output_tensors: list[torch.Tensor], input_tensors: list[torch.Tensor],
                 opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.AllToAllOptions()
        if len(output_tensors) != self._size or len(input_tensors) != self._size:
            raise ValueError(f"cohort all_to_all: needs {self._size} input and output tensors")
        like = input_tensors[0]
        send = _flat(input_tensors, like)
        recv = like.new_empty((sum(o.numel() for o in output_tensors),))
        in_splits = [t.numel() for t in input_tensors]
        out_splits = [t.numel() for t in output_tensors]
        return self._alltoall_flat("all_to_all", recv, send, out_splits, in_splits, opts, output_tensors,
                                   lambda: _unflat_into(recv, output_tensors))

    def all_to_all_single(self, output: torch.Tensor, input: torch.Tensor, output_split_sizes: list[int],
                          input_split_sizes: list[int], opts: Any = None) -> CohortWork:
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
        src = _contig(input)
        dst = _contig(output)
        finish = _finisher(dst, output)
        return self._alltoall_flat("all_to_all_single", dst, src, out_splits, in_splits, opts, [output], finish)

    alltoall_base = all_to_all_single

    def _alltoall_flat(self, op: str, recv: torch.Tensor, send: torch.Tensor, out_splits: list[int],
                       in_splits: list[int], opts: Any, result: Any,
                       finish: Optional[Callable[[], None]]) -> CohortWork:
        """All-to-all of flat buffers split in element counts.

        Equal splits go straight to ``cohort_alltoall``. Unequal ones are
        padded to the largest split of any rank (agreed with a MAX
        all-reduce of one integer), exchanged, and unpacked.
        """
        dt = _dtype(send, op)
        n = self._size
        if len(in_splits) != n or len(out_splits) != n:
            raise ValueError(f"cohort {op}: split sizes must have {n} entries")
        if sum(in_splits) != send.numel() or sum(out_splits) != recv.numel():
            raise ValueError(f"cohort {op}: split sizes do not add up to the tensors' sizes")
        g, s = self._group.handle, _stream(send)
        ms = self._ms(opts)
        if len(set(in_splits)) == 1 and len(set(out_splits)) == 1 and in_splits[0] == out_splits[0]:
            cnt = in_splits[0]
            sp, dp = send.data_ptr(), recv.data_ptr()
            return self._start(op, opts, result, lambda ms: lib.cohort_alltoall(g, sp, dp, cnt, dt, s, ms), None,
                               finish)
        big = torch.tensor([max(in_splits + out_splits)], dtype=torch.int64, device=send.device)
        self._check(lib.cohort_allreduce(g, big.data_ptr(), big.data_ptr(), 1, 5, _MAX, s, ms), op)
        blk = int(big.item())
        sendp = send.new_zeros((blk * n,))
        off = 0
        for j, k in enumerate(in_splits):
            sendp[j * blk : j * blk + k] = send[off : off + k]
            off += k
        recvp = recv.new_empty((blk * n,))
        self._check(lib.cohort_alltoall(g, sendp.data_ptr(), recvp.data_ptr(), blk, dt, s, ms), op)
        off = 0
        for i, k in enumerate(out_splits):
            recv[off : off + k] = recvp[i * blk : i * blk + k]
            off += k
        if finish is not None:
            finish()
        return _DoneWork(result)

    def barrier(self, opts: Any = None) -> CohortWork:
        opts = opts if opts is not None else dist.BarrierOptions()
        # The data-plane queue before the coordinator's barrier: a barrier
        # after an async collective means "after it", as with gloo.
        one = torch.zeros(1, dtype=torch.uint8)
        ms = self._ms(opts)
        self._check(lib.cohort_allreduce(self._group.handle, one.data_ptr(), one.data_ptr(), 1, 6, _MAX, None, ms),
                    "barrier")
        self._check(lib.cohort_barrier(self._group.handle, b"", ms), "barrier")
        return _DoneWork(None)

    def monitored_barrier(self, opts: Any = None, wait_all_ranks: bool = False) -> None:
        self.barrier(opts)

    def send(self, tensors: list[torch.Tensor], dst: int, tag: int = 0) -> CohortWork:
        raise NotImplementedError(
            "cohort: point-to-point send is not supported by the cohort backend (collectives only); "
            "use a gloo or nccl group for send/recv"
        )

    def recv(self, tensors: list[torch.Tensor], src: int, tag: int = 0) -> CohortWork:
        raise NotImplementedError(
            "cohort: point-to-point recv is not supported by the cohort backend (collectives only); "
            "use a gloo or nccl group for send/recv"
        )

    def recv_anysource(self, tensors: list[torch.Tensor], tag: int = 0) -> CohortWork:
        raise NotImplementedError("cohort: recv_anysource is not supported by the cohort backend")

    def _join(self, op: str, works: list[CohortWork], result: Any) -> CohortWork:
        """One work standing for several started in order: done when the last is."""
        if not works:
            return _DoneWork(result)
        last = works[-1]
        if all(w._done.is_set() for w in works):
            for w in works:
                if w._exc is not None:
                    raise w._exc
            return _DoneWork(result)
        agg = _JoinedWork(self, op, result, works)
        return agg

    # -- lifecycle ----------------------------------------------------------

    def abort(self) -> None:
        """Wakes every pending collective of this group with an error; never blocks."""
        self._group.abort()

    def shutdown(self) -> None:
        """Releases the group (and, for the world group, leaves the job cleanly)."""
        if self._closed:
            return
        self._closed = True
        self._completer.stop()
        if self._owns_client:
            _forget_client(self._client)
            self._client.close()
        else:
            self._group.destroy()

    def __del__(self) -> None:
        try:
            self.shutdown()
        except Exception:
            pass


class _DoneWork(dist._Work):
    """A work that finished before it was returned (synchronous calls).

    Kept minimal: synchronous collectives return one per call, and its
    construction is part of the per-call cost.
    """

    __slots__ = ("_result",)

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut = torch.futures.Future()
        fut.set_result(self._result)
        return fut

    def is_completed(self) -> bool:
        return True

    def is_success(self) -> bool:
        return True

    def exception(self) -> Optional[BaseException]:
        return None

    def result(self) -> Any:
        return self._result

    def synchronize(self) -> None:
        pass


class _JoinedWork(CohortWork):
    """Several works issued together (the coalesced forms)."""

    def __init__(self, pg: CohortProcessGroup, op: str, result: Any, works: list[CohortWork]) -> None:
        self._works = works
        super().__init__(pg, op, result, handle=None)

    def wait(self, timeout: datetime.timedelta = datetime.timedelta(0)) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self) -> torch.futures.Future:
        futs = [w.get_future() for w in self._works]
        result = self._result
        return torch.futures.collect_all(futs).then(lambda f: [x.wait() for x in f.wait()] and result)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)


# ---------------------------------------------------------------------------
# Creating groups, the coordinator, failure reports
# ---------------------------------------------------------------------------

_state_lock = threading.Lock()
_clients: "weakref.WeakSet[_core.Client]" = weakref.WeakSet()
_coordinator: Optional[_core.Coordinator] = None
_world_client: Optional[_core.Client] = None


def current_client() -> Optional[_core.Client]:
    """The cohort membership of this process's default group, if any."""
    return _world_client


def _forget_client(c: _core.Client) -> None:
    global _world_client
    with _state_lock:
        if _world_client is c:
            _world_client = None


def _store_peer() -> Optional[tuple[str, int]]:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port and port.isdigit():
        return (addr, int(port))
    return None


def _coordinator_for(store: Any, rank: int, timeout: datetime.timedelta) -> tuple[str, str, str]:
    """(coordinator URL, job, token) for a job without one in its environment.

    Rank 0 starts a private ``cohortd`` (once per process) and publishes
    its address, a fresh job name and a token in torch's store; the other
    ranks read them from there.
    """
    global _coordinator
    if rank == 0:
        with _state_lock:
            if _coordinator is None or _coordinator._proc.poll() is not None:
                _coordinator = _core.Coordinator(advertise=_core._local_host_for(_store_peer()))
            url = _coordinator.url
        job, token = f"torch-{_core.new_token()[:12]}", _core.new_token()
        store.set(_STORE_KEY, f"{url}\n{job}\n{token}")
        return url, job, token
    store.set_timeout(timeout)
    url, job, token = store.get(_STORE_KEY).decode().split("\n")
    return url, job, token


def _create(opts: Any, backend_options: Any = None) -> CohortProcessGroup:
    """The creator registered with torch (extended API)."""
    global _world_client
    store, rank, size = opts.store, opts.group_rank, opts.group_size
    timeout = opts.timeout if opts.timeout is not None else datetime.timedelta(minutes=30)
    global_ranks = list(opts.global_ranks_in_group or [])
    name = opts.group_id or "world"
    world = not global_ranks or (len(global_ranks) == size and _world_client is None)
    if world:
        if os.environ.get("COHORT_COORDINATOR"):
            client = _core.Client(rank=rank, world_size=size, op_timeout=timeout.total_seconds())
        else:
            url, job, token = _coordinator_for(store, rank, timeout)
            client = _core.Client(url, job=job, token=token, rank=rank, world_size=size,
                                  op_timeout=timeout.total_seconds())
        with _state_lock:
            _world_client = client
            _clients.add(client)
        _install_excepthook()
        return CohortProcessGroup(client, client.world, rank, size, timeout, True, name)
    if _world_client is None:
        raise CohortBackendError(Status.ESTATE, "a cohort subgroup needs a cohort default group first",
                                 "new_group")
    group = _world_client.new_group(f"torch:{name}", global_ranks, timeout.total_seconds())
    return CohortProcessGroup(_world_client, group, rank, size, timeout, False, name)


def report_exception(exc: BaseException, client: Optional[_core.Client] = None) -> bool:
    """Reports ``exc`` (with its traceback) as this rank's failure.

    The others' pending and next collectives then raise
    :class:`CohortBackendError` naming this rank and quoting the text. The
    first line is the exception itself, so the summary stays readable.
    Returns False if there is no cohort membership or the coordinator could
    not be told.
    """
    c = client or _world_client
    if c is None or not c.handle:
        return False
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    # The others keep about 4 KB of it: the summary, then the innermost
    # frames (where it was raised) rather than the launcher's outer ones.
    budget = 3500 - len(summary)
    if len(trace) > budget:
        trace = "Traceback (innermost frames):\n  ...\n" + trace[-budget:].split("\n", 1)[-1]
    return c.report_failure(f"{summary}\n{trace}")


_hook_installed = False


def _install_excepthook() -> None:
    """Reports an uncaught exception of this rank before Python prints it."""
    global _hook_installed
    if _hook_installed:
        return
    _hook_installed = True
    prev = sys.excepthook

    def hook(tp: type, value: BaseException, tb: Any) -> None:
        if not isinstance(value, (KeyboardInterrupt, SystemExit, CohortBackendError)):
            try:
                report_exception(value)
            except Exception:
                pass
        prev(tp, value, tb)

    sys.excepthook = hook


@atexit.register
def _close_all() -> None:
    for c in list(_clients):
        try:
            c.close()
        except Exception:
            pass


def _register() -> None:
    if BACKEND_NAME.upper() in dist.Backend._plugins:
        return
    devices = ["cpu", "cuda"]
    dist.Backend.register_backend(BACKEND_NAME, _create, extended_api=True, devices=devices)


_register()
