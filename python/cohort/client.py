"""cohort's own API, without torch: a membership in a job and its groups.

:class:`Client` is a membership in a job at a coordinator (``cohortd``),
:class:`Group` a process group with its control-plane operations (barriers,
object broadcast, boolean decisions). Every failure is a
:class:`~cohort.CohortError` carrying the library's status and its detail
text. ``cohort.torch`` builds the torch.distributed backend on these.
"""

from __future__ import annotations

import ctypes
import dataclasses
import threading
from typing import Iterable, Optional, Sequence, Union

from . import _lib
from ._abi import WAIT_DEFAULT, WAIT_FOREVER, Boundary, ReformInfo, StateRole, Status
from .failures import CohortError, as_status

__all__ = ["Client", "Group", "Reform", "StepBoundary", "last_error", "duration_ms", "fit_timeouts"]

Bytes = Union[bytes, bytearray, memoryview, str]

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
# Elastic membership: what a reform and a step boundary return
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Reform:
    """How a move to another generation went (``cohort_reform_info``).

    ``generation == prev_generation`` means there was nothing to do.
    ``prev_rank`` is -1 for a process admitted by the change.
    """

    generation: int
    prev_generation: int
    rank: int
    world_size: int
    prev_rank: int
    prev_world_size: int
    lost: int
    joined: int

    @property
    def moved(self) -> bool:
        """True when the client is in another generation than before."""
        return self.generation != self.prev_generation

    @classmethod
    def _of(cls, ri: ReformInfo) -> "Reform":
        return cls(int(ri.generation), int(ri.prev_generation), int(ri.rank), int(ri.world_size),
                   int(ri.prev_rank), int(ri.prev_world_size), int(ri.lost), int(ri.joined))


@dataclasses.dataclass(frozen=True)
class StepBoundary:
    """The answer of a step boundary (``cohort_boundary``).

    Attributes:
        changed: the job moved to a new generation here (joiners were
            admitted); the client is already reformed, ``reform`` says how.
        reform: the move, when ``changed`` (else None).
        role: what this rank does in the state transfer that must follow
            before its next boundary (:class:`~cohort.StateRole`).
        sender: the rank that sends (-1 when no transfer follows).
        receivers: how many ranks receive.
    """

    changed: bool
    reform: Optional[Reform]
    role: StateRole
    sender: int
    receivers: int

    @classmethod
    def _of(cls, b: Boundary) -> "StepBoundary":
        try:
            role = StateRole(b.role)
        except ValueError:
            role = StateRole.NONE
        return cls(bool(b.changed), Reform._of(b.reform) if b.changed else None, role, int(b.sender),
                   int(b.receivers))


def _as_bytes(v: Bytes) -> bytes:
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


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
        min_world: Optional[int] = None,
        max_world: Optional[int] = None,
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
        # Elastic range (docs/elastic.md): explicit arguments win over
        # COHORT_MIN_WORLD / COHORT_MAX_WORLD, which the library read.
        if max_world is not None:
            opts.world_size = int(max_world)
        if min_world is not None:
            opts.min_world = int(min_world)
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

    @property
    def local_rank(self) -> int:
        """This process's rank on its host."""
        return int(lib.cohort_client_local_rank(self.handle))

    @property
    def generation(self) -> int:
        """The job generation this client is in."""
        return int(lib.cohort_client_generation(self.handle))

    @property
    def elastic_range(self) -> tuple[int, int]:
        """(min, max) members of an elastic job; (0, 0) when it is not elastic."""
        lo, hi = ctypes.c_int32(), ctypes.c_int32()
        lib.cohort_client_elastic_range(self.handle, ctypes.byref(lo), ctypes.byref(hi))
        return int(lo.value), int(hi.value)

    @property
    def is_elastic(self) -> bool:
        """True for a job opened with a range of members (``min_world > 0``)."""
        return self.elastic_range[0] > 0

    def error(self) -> "Status | int":
        """The client's sticky error (the job failed), ``Status.OK`` while healthy."""
        return as_status(lib.cohort_client_error(self.handle))

    # -- elastic membership (docs/elastic.md) ----------------------------------

    def reform(self, timeout: Optional[float] = None) -> Reform:
        """Moves the client and its groups to the job's current generation.

        ``cohort_client_reform``: no call may be in flight on any group of
        the client. Raises :class:`~cohort.CohortError`: ``EMEMBERSHIP`` when
        the job moved again meanwhile (call again), ``EPEERLOST`` when this
        process is no longer a member or the job fell below its minimum,
        ``ENOTSUP`` for a job that is not elastic.
        """
        ri = ReformInfo()
        st = lib.cohort_client_reform(self.handle, ctypes.byref(ri), duration_ms(timeout))
        if st != 0:
            raise CohortError(st, self._world.last_error() or last_error(), "reform")
        return Reform._of(ri)

    def step_boundary(self, timeout: Optional[float] = None) -> StepBoundary:
        """The step boundary: commit point and admission point (``cohort_step_boundary``).

        Returns when every member arrived (every one gets the same answer).
        Raises :class:`~cohort.CohortError` ``EMEMBERSHIP`` when a member was
        lost first: no member commits the step.
        """
        b = Boundary()
        st = lib.cohort_step_boundary(self.handle, ctypes.byref(b), duration_ms(timeout))
        if st != 0:
            raise CohortError(st, self._world.last_error() or last_error(), "step_boundary")
        return StepBoundary._of(b)

    def state_transfer(self, data: Optional[Bytes], timeout: Optional[float] = None) -> Optional[bytes]:
        """Moves the state the last boundary asked for (``cohort_state_transfer``).

        The sender passes its bytes and gets None back; a receiver passes
        None and gets the sender's bytes; a rank with role NONE gets None at
        once. Peer to peer over the data plane, not through cohortd.
        """
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        buf = _as_bytes(data) if data is not None else None
        st = lib.cohort_state_transfer(
            self.handle, buf, len(buf) if buf is not None else 0, ctypes.byref(out), ctypes.byref(n),
            duration_ms(timeout))
        if st != 0:
            raise CohortError(st, self._world.last_error() or last_error(), "state_transfer")
        if not out.value:
            return None
        try:
            return ctypes.string_at(out.value, n.value)
        finally:
            lib.cohort_free(out)

    # -- key-value store (the job's, shared by its members) -----------------

    def _kv_check(self, st: int, op: str) -> None:
        if st != 0:
            raise CohortError(st, last_error(), op)

    def kv_set(self, key: str, value: Bytes, timeout: Optional[float] = None) -> None:
        """Sets ``key`` (TCPStore's ``set``)."""
        v = _as_bytes(value)
        self._kv_check(lib.cohort_kv_set(self.handle, key.encode(), v, len(v), duration_ms(timeout)), "kv_set")

    def kv_get(self, key: str, timeout: Optional[float] = None) -> bytes:
        """The value of ``key``, waiting until it exists (``ETIMEDOUT`` if it does not appear)."""
        out = ctypes.c_void_p()
        n = ctypes.c_size_t()
        self._kv_check(lib.cohort_kv_get(self.handle, key.encode(), ctypes.byref(out), ctypes.byref(n),
                                         duration_ms(timeout)), "kv_get")
        try:
            return ctypes.string_at(out.value, n.value) if n.value else b""
        finally:
            lib.cohort_free(out)

    def kv_add(self, key: str, delta: int, timeout: Optional[float] = None) -> int:
        """Adds ``delta`` to the integer at ``key`` (absent: 0); returns the new value."""
        out = ctypes.c_int64()
        self._kv_check(lib.cohort_kv_add(self.handle, key.encode(), int(delta), ctypes.byref(out),
                                         duration_ms(timeout)), "kv_add")
        return int(out.value)

    def kv_compare_set(self, key: str, expected: Optional[Bytes], desired: Bytes,
                       timeout: Optional[float] = None) -> tuple[bool, Optional[bytes]]:
        """Sets ``key`` to ``desired`` if its value is ``expected`` (None: absent).

        Returns (swapped, the value after the operation or None if absent).
        """
        e = _as_bytes(expected) if expected is not None else None
        d = _as_bytes(desired)
        swapped = ctypes.c_bool()
        cur = ctypes.c_void_p()
        n = ctypes.c_size_t()
        st = lib.cohort_kv_compare_set(self.handle, key.encode(), e, len(e) if e is not None else 0, d, len(d),
                                       ctypes.byref(swapped), ctypes.byref(cur), ctypes.byref(n),
                                       duration_ms(timeout))
        self._kv_check(st, "kv_compare_set")
        try:
            value = ctypes.string_at(cur.value, n.value) if cur.value else None
        finally:
            lib.cohort_free(cur)
        return bool(swapped.value), value

    def kv_delete(self, key: str, timeout: Optional[float] = None) -> bool:
        """Deletes ``key``; True if it existed."""
        out = ctypes.c_bool()
        self._kv_check(lib.cohort_kv_delete(self.handle, key.encode(), ctypes.byref(out), duration_ms(timeout)),
                       "kv_delete")
        return bool(out.value)

    def kv_num_keys(self, timeout: Optional[float] = None) -> int:
        """Number of keys of the job."""
        out = ctypes.c_int64()
        self._kv_check(lib.cohort_kv_num_keys(self.handle, ctypes.byref(out), duration_ms(timeout)), "kv_num_keys")
        return int(out.value)

    @staticmethod
    def _keys(keys: Iterable[str]) -> tuple[ctypes.Array, int]:
        ks = [k.encode() for k in keys]
        return (ctypes.c_char_p * max(1, len(ks)))(*ks), len(ks)

    def kv_wait(self, keys: Iterable[str], timeout: Optional[float] = None) -> None:
        """Returns when every key exists (``ETIMEDOUT`` naming the absent ones)."""
        arr, n = self._keys(keys)
        self._kv_check(lib.cohort_kv_wait(self.handle, ctypes.cast(arr, ctypes.c_void_p), n, duration_ms(timeout)),
                       "kv_wait")

    def kv_check(self, keys: Iterable[str], timeout: Optional[float] = None) -> bool:
        """True if every key exists now (does not wait for them)."""
        arr, n = self._keys(keys)
        out = ctypes.c_bool()
        self._kv_check(lib.cohort_kv_check(self.handle, ctypes.cast(arr, ctypes.c_void_p), n, ctypes.byref(out),
                                           duration_ms(timeout)), "kv_check")
        return bool(out.value)

    def kv_append(self, key: str, value: Bytes, timeout: Optional[float] = None) -> None:
        """Appends to ``key``'s value (creating it)."""
        v = _as_bytes(value)
        self._kv_check(lib.cohort_kv_append(self.handle, key.encode(), v, len(v), duration_ms(timeout)),
                       "kv_append")

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
