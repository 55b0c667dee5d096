"""cohort's own API, without torch: a membership in a job and its groups.

:class:`Client` is a membership in a job at a coordinator (``cohortd``),
:class:`Group` a process group with its control-plane operations (barriers,
object broadcast, boolean decisions). Every failure is a
:class:`~cohort.CohortError` carrying the library's status and its detail
text. ``cohort.torch`` builds the torch.distributed backend on these.
"""

from __future__ import annotations

import ctypes
import threading
from typing import Optional, Sequence

from . import _lib
from ._abi import WAIT_DEFAULT, WAIT_FOREVER, Status
from .failures import CohortError, as_status

__all__ = ["Client", "Group", "last_error", "duration_ms", "fit_timeouts"]

lib = _lib.lib

_MAX_MS = 2**31 - 1


def last_error() -> str:
    """``cohort_last_error()``: detail of this thread's last failed call."""
    s = lib.cohort_last_error()
    return s.decode(errors="replace") if s else ""


def duration_ms(seconds: Optional[float]) -> int:
    """A timeout in seconds as a ``cohort_duration`` (None: the default; negative: forever)."""
    if seconds is None:
        return WAIT_DEFAULT
    if seconds < 0:
        return WAIT_FOREVER
    return max(0, min(int(seconds * 1000), _MAX_MS))


def _knob(name: str) -> Optional[str]:
    v = lib.cohort_env_knob(name.encode())
    return v.decode() if v else None


def fit_timeouts(opts: _lib.Options, what: str = "the operation timeout") -> None:
    """Makes the failure detector fit a short operation timeout.

    libcohort requires heartbeat interval < dead-after < operation timeout,
    so that a rank that goes silent is reported as a failure (naming it)
    before a collective waiting for it times out. torch accepts any
    timeout; when one is not longer than dead-after (5 s by default), the
    detector is tightened to fit it: dead-after half the timeout, the
    heartbeat a quarter of that. Settings the user made explicitly
    (``COHORT_DEAD_AFTER_MS``, ``COHORT_HEARTBEAT_MS``) are never changed:
    if they do not fit, a :class:`~cohort.CohortError` (``EINVAL``) says at
    once how to set both.
    """
    op = opts.op_timeout
    if op < 0 or op > opts.dead_after:
        return
    set_dead, set_hb = _knob("COHORT_DEAD_AFTER_MS"), _knob("COHORT_HEARTBEAT_MS")
    dead = max(2, op // 2)
    hb = max(1, dead // 4)
    if set_dead is not None or op <= dead:
        raise CohortError(
            Status.EINVAL,
            f"{what} ({op} ms) must be longer than the failure detector's dead-after "
            f"({opts.dead_after} ms{', COHORT_DEAD_AFTER_MS' if set_dead is not None else ''}), or a rank that "
            f"dies would look like a timeout. Either unset COHORT_DEAD_AFTER_MS (cohort then fits it to "
            f"half the timeout: {dead} ms, heartbeat {hb} ms), or set COHORT_DEAD_AFTER_MS below {op} and "
            f"COHORT_HEARTBEAT_MS below that, or give a longer timeout",
            "options",
        )
    opts.dead_after = dead
    if set_hb is None:
        opts.heartbeat_interval = min(opts.heartbeat_interval, hb)
    elif opts.heartbeat_interval >= dead:
        raise CohortError(
            Status.EINVAL,
            f"{what} ({op} ms) needs a failure detector faster than COHORT_HEARTBEAT_MS="
            f"{opts.heartbeat_interval}: unset COHORT_HEARTBEAT_MS (cohort then uses {hb} ms and dead-after "
            f"{dead} ms), or set it below {dead} ms",
            "options",
        )


# ---------------------------------------------------------------------------
# Groups
# ---------------------------------------------------------------------------


class Group:
    """A process group of a :class:`Client` (``cohort_group``).

    The client's world group is :attr:`Client.world`; subgroups come from
    :meth:`Client.new_group`. Control-plane operations (barrier, object
    broadcast, decisions) go through the coordinator; tensor collectives
    are in ``cohort.torch``.
    """

    def __init__(self, client: "Client", handle: int, owned: bool) -> None:
        self._client = client
        self.handle = handle
        self._owned = owned

    @property
    def client(self) -> "Client":
        """The membership this group belongs to."""
        return self._client

    @property
    def rank(self) -> int:
        """This process's rank in the group."""
        return int(lib.cohort_group_rank(self.handle))

    @property
    def size(self) -> int:
        """Number of members."""
        return int(lib.cohort_group_size(self.handle))

    def global_rank(self, r: int) -> int:
        """The job rank of group rank ``r`` (-1 if out of range)."""
        return int(lib.cohort_group_global_rank(self.handle, r))

    @property
    def ranks(self) -> list[int]:
        """The job ranks of the members, in group-rank order."""
        return [self.global_rank(r) for r in range(self.size)]

    @property
    def backend(self) -> str:
        """The data-plane backend in use ("tcp", "nccl", ...; "" before the first collective)."""
        return lib.cohort_group_backend(self.handle).decode()

    def error(self) -> "Status | int":
        """The group's sticky error, ``Status.OK`` while healthy."""
        return as_status(lib.cohort_group_error(self.handle))

    def last_error(self) -> str:
        """Detail of the sticky error ("" while healthy)."""
        s = lib.cohort_group_last_error(self.handle)
        return s.decode(errors="replace") if s else ""

    def raise_for(self, st: int, op: str) -> None:
        """Raises the :class:`~cohort.CohortError` for status ``st`` of ``op``, if any."""
        if st != 0:
            detail = self.last_error() or last_error()
            raise CohortError(st, detail, op)

    def abort(self) -> None:
        """Wakes every call blocked on the group with ``EABORTED``; never blocks."""
        if self.handle:
            lib.cohort_group_abort(self.handle)

    def connect(self, timeout: Optional[float] = None) -> None:
        """Sets up the group's data plane now (``cohort_group_connect``).

        Optional: the first collective does it otherwise. Blocks until the
        connections are up or ``timeout`` (seconds; None: the client's
        operation timeout).
        """
        self.raise_for(lib.cohort_group_connect(self.handle, duration_ms(timeout)), "connect")

    def barrier(self, name: str = "", timeout: Optional[float] = None) -> None:
        """Returns when every member entered the barrier ``name``.

        Raises :class:`~cohort.CohortError`: ``ETIMEDOUT`` naming the ranks
        that never arrived (the group stays usable), ``EPEERLOST`` naming a
        failed member.
        """
        st = lib.cohort_barrier(self.handle, name.encode(), duration_ms(timeout))
        self.raise_for(st, "barrier")

    def broadcast_bytes(self, data: Optional[bytes], root: int, timeout: Optional[float] = None) -> bytes:
        """Sends ``data`` from group rank ``root`` to every member; returns it everywhere."""
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        if self.rank == root:
            buf = data or b""
            st = lib.cohort_broadcast_obj(self.handle, root, buf, len(buf), None, None, duration_ms(timeout))
            self.raise_for(st, "broadcast_obj")
            return bytes(buf)
        st = lib.cohort_broadcast_obj(
            self.handle, root, None, 0, ctypes.byref(out), ctypes.byref(n), duration_ms(timeout)
        )
        self.raise_for(st, "broadcast_obj")
        try:
            return ctypes.string_at(out.value, n.value) if n.value else b""
        finally:
            lib.cohort_free(out)

    def decide(self, decision: bool, all: bool = True, timeout: Optional[float] = None) -> bool:
        """``reduce_boolean_decision``: all() (or any()) of every member's decision."""
        res = ctypes.c_bool()
        st = lib.cohort_decide(self.handle, bool(decision), bool(all), ctypes.byref(res), duration_ms(timeout))
        self.raise_for(st, "decide")
        return bool(res.value)

    def destroy(self) -> None:
        """Frees a subgroup (waits for its in-flight work); the world group is the client's."""
        if self.handle and self._owned:
            lib.cohort_group_destroy(self.handle)
        self.handle = 0


# ---------------------------------------------------------------------------
# The membership
# ---------------------------------------------------------------------------


class Client:
    """A membership in a job at a coordinator (``cohort_client``).

    Opening blocks until every one of ``world_size`` members joined or the
    join timeout passed. Settings not given here come from the environment
    that ``cohort env`` shows (``COHORT_*``, then torchrun's, Open MPI's,
    MPICH's, SLURM's, Kubeflow's variables; the job from the launcher's id
    unless ``COHORT_JOB`` is set: docs/launchers.md); timeouts and
    heartbeats from ``COHORT_TIMEOUT_MS``, ``COHORT_HEARTBEAT_MS``,
    ``COHORT_DEAD_AFTER_MS``... An ``op_timeout`` not longer than the
    failure detector's dead-after tightens the detector to fit it (see
    :func:`fit_timeouts`).
    """

    def __init__(
        self,
        coordinator: Optional[str] = None,
        *,
        job: Optional[str] = None,
        token: Optional[str] = None,
        rank: Optional[int] = None,
        world_size: Optional[int] = None,
        op_timeout: Optional[float] = None,
        join_timeout: Optional[float] = None,
        backend: Optional[str] = None,
        data_addr: Optional[str] = None,
    ) -> None:
        env = _lib.Env()
        st = lib.cohort_env_resolve(ctypes.byref(env))
        if st != 0:
            raise CohortError(st, last_error(), "env")
        if coordinator is not None:
            env.coordinator = coordinator.encode()
        if job is not None:
            env.job = job.encode()
        if token is not None:
            env.token = token.encode()
        if rank is not None:
            env.rank = rank
        if world_size is not None:
            env.world_size = world_size
        opts = _lib.Options()
        st = lib.cohort_options_from_env(ctypes.byref(opts), ctypes.byref(env))
        if st != 0:
            raise CohortError(st, last_error(), "options")
        # Explicit arguments win over the environment's knobs.
        if op_timeout is not None:
            opts.op_timeout = duration_ms(op_timeout)
            fit_timeouts(opts)
        if join_timeout is not None:
            opts.join_timeout = duration_ms(join_timeout)
        keep = []  # the strings must outlive the open call
        if backend is not None:
            keep.append(backend.encode())
            opts.backend = keep[-1]
        if data_addr is not None:
            keep.append(data_addr.encode())
            opts.data_addr = keep[-1]
        self._env = env  # opts points into it
        handle = ctypes.c_void_p()
        st = lib.cohort_client_open(ctypes.byref(opts), ctypes.byref(handle), WAIT_DEFAULT)
        if st != 0:
            raise CohortError(st, last_error(), "join")
        self.handle: int = handle.value
        self.coordinator = env.coordinator.decode()
        self.job = env.job.decode()
        #: The resolved timeouts (ms): what the membership runs with.
        self.op_timeout_ms = int(opts.op_timeout)
        self.dead_after_ms = int(opts.dead_after)
        self.heartbeat_ms = int(opts.heartbeat_interval)
        self._world = Group(self, lib.cohort_client_world(self.handle), owned=False)
        self._lock = threading.Lock()

    @property
    def rank(self) -> int:
        """This process's rank in the job."""
        return int(lib.cohort_client_rank(self.handle))

    @property
    def world_size(self) -> int:
        """Number of ranks in the job."""
        return int(lib.cohort_client_world_size(self.handle))

    @property
    def world(self) -> Group:
        """The group of every rank of the job (owned by the client)."""
        return self._world

    def new_group(self, name: str, ranks: Sequence[int], timeout: Optional[float] = None,
                  backend: Optional[str] = None) -> Group:
        """A subgroup of job ranks ``ranks`` (every listed rank calls it alike, no other rank does).

        ``backend``: the data-plane backend of the group (None: the
        client's). Blocks until every listed rank created it.
        """
        arr = (ctypes.c_int32 * len(ranks))(*ranks)
        out = ctypes.c_void_p()
        st = lib.cohort_group_new(
            self.handle, name.encode(), arr, len(ranks), backend.encode() if backend else None,
            ctypes.byref(out), duration_ms(timeout)
        )
        if st != 0:
            raise CohortError(st, last_error(), "new_group")
        return Group(self, out.value, owned=True)

    def report_failure(self, text: str, timeout: float = 5.0) -> bool:
        """Tells the coordinator this rank failed, with ``text`` (e.g. a traceback).

        Every other member's pending and later calls then fail naming this
        rank and the text. Returns False if the coordinator could not be told.
        """
        if not self.handle:
            return False
        st = lib.cohort_report_failure(self.handle, text.encode(errors="replace"), duration_ms(timeout))
        return st == 0

    def close(self) -> None:
        """Leaves the job cleanly (others do not see a failure); idempotent."""
        with self._lock:
            h, self.handle = self.handle, 0
        if h:
            lib.cohort_client_close(h)

    def __enter__(self) -> "Client":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()
