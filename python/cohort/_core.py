"""A thin, typed Python layer over libcohort's public C API.

Nothing here knows about torch: :class:`Client` is a membership in a job at
a coordinator (``cohortd``), :class:`Group` a process group with its
control-plane operations, and every failure becomes a :class:`CohortError`
carrying the library's status and its detail text. ``cohort.torch`` builds
the torch.distributed backend on top of these.
"""

from __future__ import annotations

import ctypes
import enum
import os
import re
import secrets
import socket
import subprocess
import threading
import time
from typing import Optional, Sequence

from . import _lib

lib = _lib.lib

#: ``COHORT_WAIT_DEFAULT``: the client's configured operation timeout.
WAIT_DEFAULT = -2
#: ``COHORT_WAIT_FOREVER``.
WAIT_FOREVER = -1


class Status(enum.IntEnum):
    """``cohort_status``, the library's result codes (0 is success)."""

    OK = 0
    EINVAL = 1
    ENOMEM = 2
    ETIMEDOUT = 3
    ECLOSED = 4
    EABORTED = 5
    EPEERLOST = 6
    ESTALE = 7
    ESTATE = 8
    EPROTO = 9
    ENOTSUP = 10
    ETRANSPORT = 11
    ECUDA = 12
    ENCCL = 13
    ESYSTEM = 14
    EAUTH = 15
    EEXIST = 16
    ENOENT = 17
    ETOOBIG = 18
    EMISMATCH = 19
    ENOCOORD = 20
    EINJECTED = 21
    EJOURNAL = 22


class CohortError(RuntimeError):
    """A libcohort call failed.

    Attributes:
        status: the :class:`Status` the library returned.
        detail: the library's detail text (which rank, which operation, why).
        op: the operation that failed, as the caller named it.
        failed_rank: for ``EPEERLOST``, the rank the detail names, else None.
    """

    def __init__(self, status: int, detail: str, op: str = "") -> None:
        self.status = _as_status(status)
        self.detail = detail
        self.op = op
        self.failed_rank = failed_rank_of(detail) if self.status == Status.EPEERLOST else None
        name = lib.cohort_status_name(int(status)).decode()
        where = f"cohort {op}: " if op else "cohort: "
        text = detail or lib.cohort_strerror(int(status)).decode()
        super().__init__(f"{where}{name}: {text}")


def _as_status(st: int) -> "Status | int":
    try:
        return Status(st)
    except ValueError:
        return st


_RANK_RE = re.compile(r"\brank (\d+)\b")


def failed_rank_of(detail: str) -> Optional[int]:
    """The rank a failure detail names first ("rank 3 (host:pid) failed ...")."""
    m = _RANK_RE.search(detail or "")
    return int(m.group(1)) if m else None


def last_error() -> str:
    """``cohort_last_error()``: detail of this thread's last failed call."""
    s = lib.cohort_last_error()
    return s.decode(errors="replace") if s else ""


def duration_ms(seconds: Optional[float]) -> int:
    """A timeout in seconds as a ``cohort_duration`` (None = the default)."""
    if seconds is None:
        return WAIT_DEFAULT
    if seconds < 0:
        return WAIT_FOREVER
    return max(0, min(int(seconds * 1000), 2**31 - 1))


# ---------------------------------------------------------------------------
# Client and groups
# ---------------------------------------------------------------------------


class Group:
    """A process group of a :class:`Client` (``cohort_group``)."""

    def __init__(self, client: "Client", handle: int, owned: bool) -> None:
        self._client = client
        self.handle = handle
        self._owned = owned

    @property
    def rank(self) -> int:
        return int(lib.cohort_group_rank(self.handle))

    @property
    def size(self) -> int:
        return int(lib.cohort_group_size(self.handle))

    @property
    def backend(self) -> str:
        """The data-plane backend in use ("tcp", "nccl", ...; "" before the first collective)."""
        return lib.cohort_group_backend(self.handle).decode()

    def error(self) -> Status:
        """The group's sticky error, ``Status.OK`` while healthy."""
        return _as_status(lib.cohort_group_error(self.handle))

    def last_error(self) -> str:
        s = lib.cohort_group_last_error(self.handle)
        return s.decode(errors="replace") if s else ""

    def raise_for(self, st: int, op: str) -> None:
        """Raises the :class:`CohortError` for status ``st`` of ``op``, if any."""
        if st != 0:
            detail = self.last_error() or last_error()
            raise CohortError(st, detail, op)

    def abort(self) -> None:
        """Wakes every call blocked on the group with ``EABORTED``; never blocks."""
        if self.handle:
            lib.cohort_group_abort(self.handle)

    def barrier(self, name: str = "", timeout: Optional[float] = None) -> None:
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
        if self.handle and self._owned:
            lib.cohort_group_destroy(self.handle)
        self.handle = 0


class Client:
    """A membership in a job at a coordinator (``cohort_client``).

    Opening blocks until every one of ``world_size`` members joined or the
    join timeout passed. Settings not given here come from the environment
    that ``cohort env`` shows (``COHORT_*``, then torchrun's, Open MPI's,
    MPICH's, SLURM's, Kubeflow's variables; the job from the launcher's id
    unless ``COHORT_JOB`` is set: docs/launchers.md); timeouts and heartbeats
    from ``COHORT_TIMEOUT_MS``,
    ``COHORT_HEARTBEAT_MS``, ``COHORT_DEAD_AFTER_MS``...
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
        self._world = Group(self, lib.cohort_client_world(self.handle), owned=False)
        self._lock = threading.Lock()

    @property
    def rank(self) -> int:
        return int(lib.cohort_client_rank(self.handle))

    @property
    def world_size(self) -> int:
        return int(lib.cohort_client_world_size(self.handle))

    @property
    def world(self) -> Group:
        return self._world

    def new_group(self, name: str, ranks: Sequence[int], timeout: Optional[float] = None) -> Group:
        """A subgroup of job ranks ``ranks`` (every listed rank calls it alike)."""
        arr = (ctypes.c_int32 * len(ranks))(*ranks)
        out = ctypes.c_void_p()
        st = lib.cohort_group_new(
            self.handle, name.encode(), arr, len(ranks), None, ctypes.byref(out), duration_ms(timeout)
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


# ---------------------------------------------------------------------------
# An embedded coordinator for jobs that did not start one
# ---------------------------------------------------------------------------


class Coordinator:
    """A private ``cohortd`` started by this process for one or more jobs.

    It runs as a process of its own in a new session, so it outlives a
    rank that is killed: the coordinator is what tells the others which
    rank died. It exits by itself once no client has been connected for
    ``idle_exit`` seconds, so nothing is left behind after the job. Its
    log goes to ``$COHORT_COORDINATOR_LOG`` if set, else nowhere (every
    failure it sees reaches the ranks anyway).
    """

    def __init__(self, host: str = "0.0.0.0", advertise: Optional[str] = None, idle_exit: float = 10.0) -> None:
        exe = _lib.find_binary("cohortd")
        if exe is None:
            raise CohortError(
                Status.ENOCOORD,
                "cannot find the cohortd program to start a coordinator: build cohort (`make`), "
                "set COHORT_COHORTD, or give a coordinator in COHORT_COORDINATOR",
                "start coordinator",
            )
        r, w = os.pipe()
        # Never the rank's own stdout/stderr: whoever reads those (a
        # launcher, a test) would wait for the coordinator's idle exit.
        log_path = os.environ.get("COHORT_COORDINATOR_LOG")
        log = open(log_path, "ab") if log_path else subprocess.DEVNULL
        try:
            self._proc = subprocess.Popen(
                [
                    exe,
                    "--listen",
                    f"tcp://{host}:0",
                    "--ready-fd",
                    str(w),
                    "--exit-when-idle",
                    str(int(idle_exit * 1000)),
                    "--log-level",
                    "warn",
                ],
                pass_fds=(w,),
                stdin=subprocess.DEVNULL,
                stdout=log,
                stderr=log,
                start_new_session=True,
            )
        finally:
            os.close(w)
            if log_path:
                log.close()
        try:
            line = _read_line(r, 10.0)
        finally:
            os.close(r)
        if not line.startswith("tcp://"):
            self._proc.kill()
            self._proc.wait()
            raise CohortError(Status.ENOCOORD, f"cohortd did not start (it said {line!r})", "start coordinator")
        port = line.rsplit(":", 1)[1]
        self.url = f"tcp://{advertise or _local_host_for(None)}:{port}"
        self.pid = self._proc.pid

    def stop(self) -> None:
        """Stops the coordinator now (SIGTERM, then SIGKILL after 5 s)."""
        if self._proc.poll() is None:
            self._proc.terminate()
            try:
                self._proc.wait(5)
            except subprocess.TimeoutExpired:
                self._proc.kill()
                self._proc.wait()


def _read_line(fd: int, timeout: float) -> str:
    import select

    buf = b""
    deadline = time.monotonic() + timeout
    while not buf.endswith(b"\n"):
        left = deadline - time.monotonic()
        if left <= 0:
            break
        ready, _, _ = select.select([fd], [], [], left)
        if not ready:
            break
        chunk = os.read(fd, 512)
        if not chunk:
            break
        buf += chunk
    return buf.decode(errors="replace").strip()


def _local_host_for(peer: Optional[tuple[str, int]]) -> str:
    """The address of this host's interface that reaches ``peer``.

    With no peer (or one that cannot be routed to) it is the loopback
    address, good for jobs on one host.
    """
    if peer is None:
        return "127.0.0.1"
    try:
        with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
            s.connect(peer)  # UDP: no packet is sent, only a route chosen
            return s.getsockname()[0]
    except OSError:
        return "127.0.0.1"


def new_token() -> str:
    """A random job token."""
    return secrets.token_hex(16)
