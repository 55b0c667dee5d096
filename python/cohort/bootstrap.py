"""How a process finds its coordinator and joins its job.

Two ways, decided by the environment:

- a coordinator is named (``COHORT_COORDINATOR``, with ``COHORT_JOB`` and
  ``COHORT_TOKEN``, as ``cohort run`` and the Kubernetes manifests set
  them): every rank joins it;
- none is named (Lightning's launcher, torchrun, ``mp.spawn``): rank 0
  starts a private ``cohortd`` (:class:`Coordinator`) and publishes its
  address, a fresh job name and a random token in torch's store; the other
  ranks read them from there (:func:`coordinator_from_store`).

:func:`join` does either and opens the :class:`~cohort.Client` of a torch
default group, with torch's timeout as the operation timeout (the failure
detector tightened to fit a short one, :func:`cohort.client.fit_timeouts`).
The membership of this process's default group is :func:`world_client`.
"""

from __future__ import annotations

import contextlib
import datetime
import os
import secrets
import select
import socket
import subprocess
import threading
import time
import weakref
from typing import Any, Iterator, Optional

from . import _lib
from ._abi import Status
from .client import Client, _knob
from .failures import CohortError

__all__ = [
    "Coordinator",
    "STORE_KEY",
    "coordinator_from_store",
    "join",
    "world_client",
    "local_host_for",
    "new_token",
    "adopting",
    "elastic_range_from_env",
]

#: Prefix of the store keys under which rank 0 publishes a coordinator it
#: started (``STORE_KEY/<default group>/...``, :func:`coordinator_from_store`).
STORE_KEY = "cohort/coordinator"

#: Data-plane backends for device memory only. Named in COHORT_BACKEND,
#: they are what a torch group uses for its CUDA tensors; its CPU tensors
#: still go over a host-memory backend (tcp).
DEVICE_BACKENDS = ("nccl", "tcp-staged")

#: The least time the rendezvous at the coordinator waits for late ranks
#: when torch's timeout is shorter (a short timeout is for collectives;
#: ranks of one job start seconds apart). ``COHORT_JOIN_TIMEOUT_MS`` sets it.
MIN_JOIN_S = 60.0


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
        log: Any = open(log_path, "ab") if log_path else subprocess.DEVNULL
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
        #: The URL ranks connect to.
        self.url = f"tcp://{advertise or local_host_for(None)}:{port}"
        #: The coordinator's process id.
        self.pid = self._proc.pid

    def alive(self) -> bool:
        """True while the coordinator process runs."""
        return self._proc.poll() is None

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


def local_host_for(peer: Optional[tuple[str, int]]) -> str:
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


# ---------------------------------------------------------------------------
# Joining through torch's store
# ---------------------------------------------------------------------------

_state_lock = threading.Lock()
_coordinator: Optional[Coordinator] = None
_world_client: Optional[Client] = None
_clients: "weakref.WeakSet[Client]" = weakref.WeakSet()


def _store_peer() -> Optional[tuple[str, int]]:
    addr, port = os.environ.get("MASTER_ADDR"), os.environ.get("MASTER_PORT")
    if addr and port and port.isdigit():
        return (addr, int(port))
    return None


def coordinator_from_store(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> tuple[str, str, str]:
    """(coordinator URL, job, token) for a job without one in its environment.

    Rank 0 starts a private ``cohortd`` (once per process) and hands its
    address, a fresh job name and a token to each other rank through
    torch's ``store``; the others wait for them there, up to ``timeout``
    but at least :data:`MIN_JOIN_S`.

    The store may hold an earlier attempt's keys (torchrun's agent store
    outlives a restart of the workers), and no variable names an attempt
    alike on every rank (``TORCHELASTIC_RESTART_COUNT`` counts a node's own
    failures: with a torchrun per node, only the failed node's agent counts
    one). So every other rank says hello under a nonce of its own process
    (``<key>/hello/<rank>``), and rank 0 answers under that nonce
    (``<key>/ack/<nonce>``), which no earlier attempt can have written;
    rank 0 skips a hello its predecessor already answered (``<key>/acked``).
    Cost: one set and one wait per rank, and ``size - 1`` answers at rank 0.
    """
    global _coordinator
    key = _next_store_key()
    wait = max(timeout, datetime.timedelta(seconds=MIN_JOIN_S))
    if rank == 0:
        with _state_lock:
            if _coordinator is None or not _coordinator.alive():
                _coordinator = Coordinator(advertise=local_host_for(_store_peer()))
            url = _coordinator.url
        job, token = f"torch-{new_token()[:12]}", new_token()
        _answer_hellos(store, key, size, f"{url}\n{job}\n{token}", wait)
        return url, job, token
    # Rank 0 may start late (a short torch timeout is for collectives):
    # wait as long as the rendezvous would.
    nonce = new_token()[:16]
    store.set(f"{key}/hello/{rank}", nonce)
    ack = f"{key}/ack/{nonce}"
    try:
        store.wait([ack], wait)
    except Exception as e:
        raise CohortError(Status.ETIMEDOUT, f"rank 0 did not hand out its coordinator through torch's store "
                          f"within {wait.total_seconds():g} s (rank {rank} said hello at {key}/hello/{rank}): {e}",
                          "join") from e
    url, job, token = store.get(ack).decode().split("\n")
    try:
        store.delete_key(ack)
    except Exception:  # a store without deletion keeps it: one key per rank and attempt
        pass
    return url, job, token


def _answer_hellos(store: Any, key: str, size: int, value: str, wait: datetime.timedelta) -> None:
    """Rank 0's side of :func:`coordinator_from_store`: answers each rank's hello of this attempt."""
    before: list[str] = []
    if store.check([f"{key}/acked"]):
        before = store.get(f"{key}/acked").decode().split("\n")

    def stale(r: int) -> Optional[str]:
        return before[r - 1] if r - 1 < len(before) else None

    def fresh(r: int) -> bool:  # only on the error path: which ranks are missing
        h = f"{key}/hello/{r}"
        return bool(store.check([h])) and store.get(h).decode() != stale(r)

    deadline = time.monotonic() + wait.total_seconds()
    answered = []
    for r in range(1, size):
        hello, old = f"{key}/hello/{r}", stale(r)
        pause, err = 0.001, None
        while True:
            left = deadline - time.monotonic()
            try:
                store.wait([hello], datetime.timedelta(seconds=max(0.001, left)))
                nonce = store.get(hello).decode()
            except Exception as e:
                nonce, err = None, e  # the hello is late: the deadline below decides
            if nonce is not None and nonce != old:
                break
            if time.monotonic() >= deadline:
                missing = [r] + [q for q in range(r + 1, size) if not fresh(q)]
                raise CohortError(Status.ETIMEDOUT, f"ranks {', '.join(map(str, missing[:8]))}"
                                  f"{' ...' if len(missing) > 8 else ''} did not say hello in torch's store within "
                                  f"{wait.total_seconds():g} s ({hello})"
                                  + (f": {err}" if nonce is None else ""), "join")
            time.sleep(pause)  # the previous attempt's hello: this rank's own is still to come
            pause = min(0.05, pause * 2)
        store.set(f"{key}/ack/{nonce}", value)
        answered.append(nonce)
    store.set(f"{key}/acked", "\n".join(answered))


_published = 0  # default groups this process has joined through the store


def _next_store_key() -> str:
    """The store key of the next default group's coordinator.

    One per default group of this process (a group destroyed and
    initialised again must not read the previous one's job). Every rank
    of an attempt counts its default groups alike, since torch creates
    them collectively; attempts are told apart by the hello of
    :func:`coordinator_from_store`.
    """
    global _published
    with _state_lock:
        _published += 1
        n = _published
    return f"{STORE_KEY}/{n}"


def elastic_range_from_env() -> tuple[Optional[int], Optional[int]]:
    """(min, max) ranks of an elastic job that only Python can compute, or (None, None).

    ``COHORT_MIN_WORLD``/``COHORT_MAX_WORLD`` (``cohort run --nnodes``)
    libcohort reads itself. torchrun's workers under ``--rdzv-backend
    cohort`` get the range in nodes (``COHORT_MIN_NODES``,
    ``COHORT_MAX_NODES``, set by :mod:`cohort.torchrun`), which are
    multiplied here by the ranks per node (``LOCAL_WORLD_SIZE``).
    """
    if _knob("COHORT_MIN_WORLD") is not None:
        return None, None
    lo, hi = os.environ.get("COHORT_MIN_NODES"), os.environ.get("COHORT_MAX_NODES")
    if not lo:
        return None, None
    per = int(os.environ.get("LOCAL_WORLD_SIZE") or 1)
    lo_n = int(lo)
    hi_n = int(hi) if hi else lo_n
    if lo_n <= 0 or hi_n < lo_n:
        raise CohortError(Status.EINVAL, f"COHORT_MIN_NODES={lo} COHORT_MAX_NODES={hi}: not a range of nodes",
                          "options")
    return lo_n * per, hi_n * per


_adopt: Optional[Client] = None


@contextlib.contextmanager
def adopting(client: Client) -> Iterator[None]:
    """Within it, a default cohort group torch creates is ``client``'s world.

    :mod:`cohort.elastic` opens the membership first (an elastic job gives
    the ranks: a process learns its own when admitted) and then calls
    ``init_process_group`` with that rank and size; the backend then uses
    the open client instead of joining again.
    """
    global _adopt
    with _state_lock:
        _adopt = client
    try:
        yield
    finally:
        with _state_lock:
            _adopt = None


def take_adopted() -> Optional[Client]:
    """The client :func:`adopting` offers (once), made :func:`world_client`."""
    global _adopt, _world_client
    with _state_lock:
        c, _adopt = _adopt, None
        if c is not None:
            _world_client = c
            _clients.add(c)
        return c


def join(store: Any, rank: int, size: int, timeout: datetime.timedelta) -> Client:
    """Opens the membership behind a torch default group of ``size`` ranks.

    ``timeout`` (torch's, any length) is the operation timeout of every
    collective. The rendezvous at the coordinator waits at least
    :data:`MIN_JOIN_S` for late ranks (``COHORT_JOIN_TIMEOUT_MS``
    overrides). The client becomes :func:`world_client`.
    """
    secs = timeout.total_seconds()
    join_s = None if _knob("COHORT_JOIN_TIMEOUT_MS") is not None else max(secs, MIN_JOIN_S)
    # The world group carries the CPU tensors: a device-memory backend
    # asked for in COHORT_BACKEND is for the CUDA ones.
    host_backend = "auto" if _knob("COHORT_BACKEND") in DEVICE_BACKENDS else None
    lo, hi = elastic_range_from_env()
    if os.environ.get("COHORT_COORDINATOR"):
        client = Client(rank=rank, world_size=size, op_timeout=secs, join_timeout=join_s, backend=host_backend,
                        min_world=lo, max_world=hi)
    else:
        url, job, token = coordinator_from_store(store, rank, size, timeout)
        client = Client(url, job=job, token=token, rank=rank, world_size=size, op_timeout=secs,
                        join_timeout=join_s, backend=host_backend, min_world=lo, max_world=hi)
    global _world_client
    with _state_lock:
        _world_client = client
        _clients.add(client)
    return client


def world_client() -> Optional[Client]:
    """The membership of this process's default group, if any."""
    return _world_client


def forget(client: Client) -> None:
    """Drops ``client`` as the default group's membership (it is closing)."""
    global _world_client
    with _state_lock:
        if _world_client is client:
            _world_client = None


def close_all() -> None:
    """Leaves every job this process joined (at exit)."""
    for c in list(_clients):
        try:
            c.close()
        except Exception:
            pass
