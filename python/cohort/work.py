"""Works and futures: what torch gets back from every cohort collective.

A collective issued synchronously has finished when it returns: its work
is a :class:`DoneWork`. One issued asynchronously (``async_op=True``, DDP's
bucket all-reduces, FSDP's gathers) runs on libcohort's progress thread and
is a :class:`CohortWork` holding the library's ``cohort_work``:

- ``wait()`` blocks in libcohort with the GIL released;
- ``get_future()`` hands the work to its group's :class:`Completer`, whose
  threads wait for it and complete the future.

Future callbacks may wait on other collectives. PowerSGD's comm hook does:
the callback of one all-reduce issues the next and waits for it. A single
completion thread would deadlock there, running the callback that waits
for a work only that same thread can complete. The completer therefore
works as a leader/followers pool: one thread (the leader) waits for the
next work in issue order; before it runs the work's callbacks it makes
sure another thread can lead, starting one if every thread is busy in a
callback. Callbacks start in issue order; one that blocks holds up
nothing but itself.
"""

from __future__ import annotations

import collections
import ctypes
import datetime
import threading
from typing import TYPE_CHECKING, Any, Callable, Optional

import torch
import torch.distributed as dist

from ._abi import WAIT_DEFAULT, Status
from ._lib import lib
from ._tensors import timeout_ms
from .client import last_error
from .failures import CohortBackendError

if TYPE_CHECKING:  # pragma: no cover
    from .process_group import CohortBackend

__all__ = ["CohortWork", "DoneWork", "JoinedWork", "Completer"]

_NO_TIMEOUT = datetime.timedelta(0)


class Completer:
    """Completes the futures of a group's asynchronous works, in issue order.

    A pool of daemon threads, started on demand. The leader takes the next
    work, waits for it in libcohort (the GIL released), then runs its
    completion: copies into non-contiguous outputs and sets the future,
    which runs the future's callbacks. Before running it, the leader makes
    sure another thread is free to lead, so that a callback that waits on
    a later collective does not wait on its own thread. At most
    ``max_threads`` threads: that many nested waits.

    Completions run one at a time, in issue order (the baton), so that
    callbacks issue their own collectives in the same order on every rank.
    A callback gives the baton up when it asks for the future of a
    collective it issued (it is about to wait for it), or when it ends.
    One that blocks on something else for longer than
    ``BATON_PATIENCE_S`` has the next completion run beside it rather than
    wait for ever.
    """

    BATON_PATIENCE_S = 2.0

    def __init__(self, name: str, max_threads: int = 32) -> None:
        self._name = name
        self._max = max_threads
        self._q: collections.deque[Optional[CohortWork]] = collections.deque()
        self._cv = threading.Condition()
        self._lead = threading.Lock()  # held by the thread taking and waiting for the next work
        self._threads: list[threading.Thread] = []
        self._busy = 0  # threads running a completion
        self._alive = 0  # threads started and not ended
        self._baton: Optional[threading.Thread] = None  # the thread running a completion in turn
        self._stopping = False
        self._taken = 0  # works taken off the queue and not completed yet

    @property
    def threads(self) -> int:
        """Threads started so far (1 + the deepest nesting of waiting callbacks)."""
        return len(self._threads)

    def submit(self, w: "CohortWork") -> None:
        """Queues ``w``; its future completes once libcohort finished it."""
        with self._cv:
            if self._baton is threading.current_thread():
                # A callback issued a collective and will wait for it: the
                # next completion may run (its own is among them).
                self._baton = None
                self._cv.notify_all()
            if self._alive == 0:  # the first work, or one freed after stop()
                self._start_thread()
            self._q.append(w)
            self._cv.notify()

    def _start_thread(self) -> None:
        # with self._cv held
        t = threading.Thread(target=self._run, name=f"cohort-{self._name}-{len(self._threads)}", daemon=True)
        self._threads.append(t)
        self._alive += 1
        t.start()

    def _next(self) -> Optional["CohortWork"]:
        with self._cv:
            while not self._q and not self._stopping:
                self._cv.wait()
            if not self._q:
                return None
            self._taken += 1
            return self._q.popleft()

    def _run(self) -> None:
        try:
            self._serve()
        finally:
            with self._cv:
                self._alive -= 1

    def _serve(self) -> None:
        me = threading.current_thread()
        while True:
            with self._lead:
                w = self._next()
                if w is None:
                    return
                w._wait_done()
                with self._cv:
                    if self._baton is not None:
                        self._cv.wait_for(lambda: self._baton is None, self.BATON_PATIENCE_S)
                    self._baton = me
                    self._busy += 1
                    if self._busy >= self._alive and self._alive < self._max:
                        self._start_thread()
            try:
                w._complete()
            finally:
                with self._cv:
                    self._taken -= 1
                    self._busy -= 1
                    if self._baton is me:
                        self._baton = None
                    self._cv.notify_all()

    def idle(self, timeout: float) -> bool:
        """Waits until no work is queued or being completed; True if so within ``timeout``."""
        with self._cv:
            return self._cv.wait_for(lambda: not self._q and self._taken == 0, timeout)

    def stop(self, timeout: float = 30.0) -> None:
        """Lets the queued works finish, then ends the threads (bounded by ``timeout``)."""
        with self._cv:
            self._stopping = True
            threads = list(self._threads)
            self._cv.notify_all()
        for t in threads:
            if t is not threading.current_thread():
                t.join(timeout)


class DoneWork(dist._Work):
    """A work that finished before it was returned (synchronous calls).

    Kept minimal: synchronous collectives return one per call, and its
    construction is part of the per-call cost.
    """

    __slots__ = ("_result",)

    def __init__(self, result: Any) -> None:
        super().__init__()
        self._result = result

    def wait(self, timeout: datetime.timedelta = _NO_TIMEOUT) -> bool:
        return True

    def get_future(self) -> torch.futures.Future:
        fut: torch.futures.Future = torch.futures.Future()
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


class CohortWork(dist._Work):
    """An asynchronous cohort collective (a libcohort ``cohort_work``).

    ``wait`` blocks in libcohort with the GIL released, ``get_future``
    hands the work to the group's :class:`Completer`. A failed work raises
    :class:`~cohort.torch.CohortBackendError` from ``wait`` and fails its
    future; the group's error is sticky, so every later collective raises
    it too.
    """

    def __init__(
        self,
        backend: "CohortBackend",
        op: str,
        result: Any,
        handle: Optional[int] = None,
        finish: Optional[Callable[[], None]] = None,
        keep: Any = None,
        group: Any = None,
        completer: Optional[Completer] = None,
    ) -> None:
        super().__init__()
        self._backend = backend
        # Point-to-point works complete out of issue order: they have a
        # completer of their own (None: the group's).
        self._completer = completer
        self._group = group if group is not None else (backend._group if backend is not None else None)
        self._op = op
        self._result = result
        self._handle = handle
        self._finish = finish
        self._keep = keep  # buffers libcohort reads or writes until done
        self._lock = threading.Lock()
        self._done = threading.Event()
        self._exc: Optional[BaseException] = None
        self._native_exc: Optional[BaseException] = None
        self._fut: Optional[torch.futures.Future] = None
        self._user_fut: Optional[torch.futures.Future] = None
        self._owner = False  # a thread is waiting in libcohort
        if handle is None:
            self._complete()
        elif backend is not None:
            backend._inflight.add(self)  # CohortBackend.quiesce waits for it

    # -- completion ---------------------------------------------------------

    @staticmethod
    def _wait_native(h: Any, ms: int) -> Optional[int]:
        """cohort_work_wait on handle ``h`` for up to ``ms``: the work's status,
        or None if it is still running (the handle is not freed)."""
        st = lib.cohort_work_wait(h, ms)
        if st == Status.ETIMEDOUT:
            done = ctypes.c_bool(False)
            lib.cohort_work_test(h, ctypes.byref(done))
            if not done.value:
                return None
        return st

    def _wait_handle(self, ms: int) -> bool:
        """Waits in libcohort (the caller owns the handle); frees it when done.

        False if the work did not finish within ``ms``.
        """
        h = self._handle
        st = self._wait_native(h, ms)
        if st is None:
            return False
        if st != 0:
            g = self._group
            detail = (g.last_error() if g is not None else "") or last_error()
            self._native_exc = CohortBackendError(st, detail, self._op)
        self._handle = None
        lib.cohort_work_free(h)
        return True

    def _wait_done(self) -> None:
        """Waits (without a deadline of its own) until libcohort finished the work.

        libcohort bounds every work by the group's operation timeout and
        its failure detection, so this returns.
        """
        while not self._wait_handle(WAIT_DEFAULT):
            pass

    def _complete(self) -> None:
        exc = self._native_exc
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

    # -- torch's Work interface ---------------------------------------------

    def wait(self, timeout: datetime.timedelta = _NO_TIMEOUT) -> bool:
        """Blocks until the work finished; raises its error. ``timeout`` 0: the group's."""
        ms = timeout_ms(timeout)
        with self._lock:
            native = not self._done.is_set() and not self._owner
            if native:
                self._owner = True
        if native:
            if not self._wait_handle(ms):
                with self._lock:
                    self._owner = False
                raise CohortBackendError(Status.ETIMEDOUT, f"{self._op} did not complete within {ms} ms", self._op)
            self._complete()
        elif not self._done.is_set():
            secs = None if ms < 0 else ms / 1000.0
            if ms == WAIT_DEFAULT:
                secs = self._backend._timeout_s if self._backend is not None else None
            if not self._done.wait(secs):
                raise CohortBackendError(Status.ETIMEDOUT, f"{self._op} did not complete in time", self._op)
        if self._exc is not None:
            raise self._exc
        return True

    def get_future(self) -> torch.futures.Future:
        """A future of the work's outputs, completed by the group's completer.

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
            base: torch.futures.Future = torch.futures.Future()
            self._fut = base
            self._user_fut = base.then(self._unwrap)
            done = self._done.is_set()
            hand_off = not done and not self._owner
            if hand_off:
                self._owner = True
        if done:
            self._settle(base)
        elif hand_off:
            (self._completer or self._backend._completer).submit(self)
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
        # to the completer, which frees it once the work is done.
        try:
            if self._handle is not None and not self._owner and not self._done.is_set():
                self._owner = True
                (self._completer or self._backend._completer).submit(self)
        except Exception:
            pass


class JoinedWork(CohortWork):
    """Several works issued together (the coalesced forms): done when all are."""

    def __init__(self, backend: "CohortBackend", op: str, result: Any, works: list[CohortWork]) -> None:
        self._works = works
        super().__init__(backend, op, result, handle=None)

    def wait(self, timeout: datetime.timedelta = _NO_TIMEOUT) -> bool:
        for w in self._works:
            w.wait(timeout)
        return True

    def get_future(self) -> torch.futures.Future:
        futs = [w.get_future() for w in self._works]
        result = self._result
        return torch.futures.collect_all(futs).then(lambda f: [x.wait() for x in f.wait()] and result)

    def is_completed(self) -> bool:
        return all(w.is_completed() for w in self._works)
