"""torchrun's rendezvous on cohortd: ``torchrun --rdzv-backend cohort``.

Registered through torch's entry points for out-of-tree handlers
(``torchrun.handlers``), so an installed cohort package needs nothing
else::

    cohortd --listen tcp://0.0.0.0:29400 --torch-store JOB@0.0.0.0:29500
    torchrun --nnodes 3:4 --nproc-per-node 8 --rdzv-backend cohort \\
        --rdzv-endpoint HOST:29500 --rdzv-id JOB train.py

The agents (one torchrun per node) rendezvous in cohortd's key-value store
through its TCPStore listener (``--rdzv-endpoint``; journalled by cohortd),
and the workers form an *elastic* cohort job named after ``--rdzv-id`` at
the coordinator (``--rdzv-conf coordinator=tcp://HOST:PORT``; by default
the endpoint's host at cohortd's port 29400), with torchrun's range:
``--nnodes MIN:MAX`` becomes the job's MIN..MAX nodes.

What differs from torchrun's own handlers (c10d, etcd) is what happens
after the first round, where torchelastic restarts every worker of every
node:

- a lost node (its agent and workers gone, or only its workers) does not
  restart anyone: the surviving workers go on in their processes, in the
  job's next generation (``cohort.elastic``);
- a node that comes (back) while the job runs is admitted into the
  running round: its agent starts its workers at once, and they are
  admitted into the job at its next step boundary and receive the state
  from a healthy worker; ``num_nodes_waiting()`` stays 0, so no agent
  restarts its workers for it;
- a worker that fails on a node that lives is restarted alone by its
  agent (``--max-restarts``) and joins the running job the same way.

The training script must be written for it (``cohort.elastic.Manager``,
``cohort.elastic.run``, or Lightning's ``CohortElasticStrategy``).

Configuration (``--rdzv-conf key=value,...``):

- ``coordinator``: cohortd's URL for the workers (default
  ``tcp://<endpoint host>:29400``);
- ``token``: the job's token (default ``$COHORT_TOKEN``);
- ``last_call_timeout``: seconds the first round waits for more nodes
  once MIN arrived (default 5, as torch's);
- ``join_timeout``: seconds a node waits to be admitted (default 600);
- ``node_dead_after``: seconds of keep-alive silence after which an
  agent's slot is freed for a newcomer (default 5).

Workers get ``COHORT_COORDINATOR``, ``COHORT_JOB``, ``COHORT_MIN_NODES``,
``COHORT_MAX_NODES`` (multiplied by ``LOCAL_WORLD_SIZE`` in the worker)
and ``MASTER_ADDR``/``MASTER_PORT`` at the endpoint with
``TORCHELASTIC_USE_AGENT_STORE=True`` (their torch store is cohortd's).
Nodes must run the same number of workers (``TORCH_ELASTIC_WORKER_IDENTICAL``
is set: ranks are ``node slot x nproc + local rank``).
"""

from __future__ import annotations

import datetime
import json
import logging
import os
import socket
import threading
import time
import uuid
from typing import Any, Callable, Optional

import torch.distributed as dist
from torch.distributed.elastic.rendezvous import (
    RendezvousClosedError,
    RendezvousHandler,
    RendezvousInfo,
    RendezvousParameters,
    RendezvousStoreInfo,
    RendezvousTimeoutError,
)
from torch.distributed.elastic.rendezvous.utils import parse_rendezvous_endpoint

__all__ = ["CohortRendezvousHandler", "create_handler", "handler_factory"]

log = logging.getLogger("cohort.torchrun")

#: cohortd's default control port (``--listen tcp://0.0.0.0:29400``).
DEFAULT_COORD_PORT = 29400
#: The TCPStore port when the endpoint names none.
DEFAULT_STORE_PORT = 29500

_TERMINAL = "torchelastic/agent/terminal_state"  # torch's exit barrier prefix
_STATE = "state"


def _now() -> float:
    return time.monotonic()


class _RoundStore(dist.Store):
    """The store the agents of the round get (``RendezvousInfo.store``).

    Everything goes to the round's keys in cohortd. One thing differs: the
    agents' exit barrier (``torchelastic/agent/terminal_state``) counts
    the nodes that are still in the job, not the ones the round began
    with, since a node lost during the run does not restart the others
    (and so never arrives there).
    """

    def __init__(self, inner: dist.Store, live: Callable[[], int]) -> None:
        super().__init__()
        self._inner = inner
        self._live = live

    def set(self, key: str, value: Any) -> None:
        self._inner.set(key, value)

    def get(self, key: str) -> bytes:
        return self._inner.get(key)

    def add(self, key: str, value: int) -> int:
        return self._inner.add(key, value)

    def compare_set(self, key: str, expected: Any, desired: Any) -> bytes:
        return self._inner.compare_set(key, expected, desired)

    def check(self, keys: list[str]) -> bool:
        return self._inner.check(keys)

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - torch's trampoline name
        return self._inner.delete_key(key)

    def getNumKeys(self) -> int:  # noqa: N802
        return self._inner.num_keys()

    def multi_get(self, keys: list[str]) -> list[bytes]:
        return self._inner.multi_get(keys)

    def multi_set(self, keys: list[str], values: list[Any]) -> None:
        self._inner.multi_set(keys, values)

    def append(self, key: str, value: Any) -> None:
        self._inner.append(key, value)

    def wait(self, keys: list[str], timeout: Optional[datetime.timedelta] = None) -> None:
        t = timeout if timeout is not None else self.timeout
        barrier = [k for k in keys if k.startswith(_TERMINAL) and k.endswith("/last_member")]
        if not barrier:
            self._inner.wait(keys, t)
            return
        last = barrier[0]
        count = last[: -len("/last_member")] + "/num_members"
        end = _now() + (t.total_seconds() if t.total_seconds() > 0 else 1e9)
        while True:
            if self._inner.check([last]):
                return
            arrived = self._inner.add(count, 0)
            if arrived >= self._live():
                self._inner.set(last, "<val_ignored>")
                return
            if _now() >= end:
                raise dist.DistStoreError(f"cohort rendezvous: {arrived} of {self._live()} nodes reached the exit "
                                          f"barrier in time")
            time.sleep(0.2)


class CohortRendezvousHandler(RendezvousHandler):
    """torchrun's rendezvous in cohortd, with in-place admission (module docstring)."""

    def __init__(self, params: RendezvousParameters) -> None:
        host, port = parse_rendezvous_endpoint(params.endpoint, DEFAULT_STORE_PORT)
        self._host, self._port = host, port
        self._run_id = params.run_id
        self._min, self._max = int(params.min_nodes), int(params.max_nodes)
        self._last_call = float(params.get("last_call_timeout", 5))
        self._join_timeout = float(params.get("join_timeout", 600))
        self._dead_after = float(params.get("node_dead_after", 5))
        self._keepalive_s = max(0.1, min(1.0, self._dead_after / 5))
        self._me = f"{socket.gethostname()}_{os.getpid()}_{uuid.uuid4().hex[:8]}"
        coordinator = params.get("coordinator") or f"tcp://{host}:{DEFAULT_COORD_PORT}"
        timeout = datetime.timedelta(seconds=float(params.get("store_timeout", 60)))
        self._tcp = self._connect(timeout)
        self._store = dist.PrefixStore(f"torchrun/{self._run_id}/", self._tcp)
        self._slot: Optional[int] = None
        self._closed_here = False
        self._stop = threading.Event()
        self._thread: Optional[threading.Thread] = None
        self._timeout = timeout
        # What the workers need, inherited from this (the agent's) process.
        os.environ["COHORT_COORDINATOR"] = coordinator
        os.environ["COHORT_JOB"] = self._run_id
        os.environ["COHORT_MIN_NODES"] = str(self._min)
        os.environ["COHORT_MAX_NODES"] = str(self._max)
        token = params.get("token")
        if token:
            os.environ["COHORT_TOKEN"] = str(token)
        os.environ["TORCH_ELASTIC_WORKER_IDENTICAL"] = "1"

    def _connect(self, timeout: datetime.timedelta) -> dist.TCPStore:
        try:
            return dist.TCPStore(self._host, self._port, is_master=False, timeout=timeout)
        except Exception as e:
            raise RendezvousClosedError(
                f"cohort rendezvous: cannot reach the store at {self._host}:{self._port} ({e}); start cohortd "
                f"with --torch-store {self._run_id}@0.0.0.0:{self._port} and give that address as "
                f"--rdzv-endpoint") from e

    # -- the shared state -------------------------------------------------------

    def _initial(self) -> dict:
        return {"phase": "join", "slots": [], "version": 0, "min": self._min, "max": self._max}

    def _read(self, store: Optional[dist.Store] = None) -> tuple[bytes, dict]:
        s = store or self._store
        raw = s.compare_set(_STATE, "", json.dumps(self._initial()))
        return raw, json.loads(raw)

    def _update(self, fn: Callable[[dict], Optional[dict]], store: Optional[dist.Store] = None) -> dict:
        """Applies ``fn`` to the state atomically (compare-and-set); returns the state after."""
        s = store or self._store
        while True:
            raw, st = self._read(s)
            new = fn(dict(st, slots=list(st["slots"])))
            if new is None:
                return st
            new["version"] = st["version"] + 1
            want = json.dumps(new)
            if s.compare_set(_STATE, raw, want) == want.encode():
                return new

    def _live(self) -> int:
        _, st = self._read()
        return sum(1 for x in st["slots"] if x is not None)

    # -- torch's RendezvousHandler ------------------------------------------------

    def get_backend(self) -> str:
        return "cohort"

    @property
    def use_agent_store(self) -> bool:
        """The workers' torch store is cohortd's (the endpoint): no node hosts one."""
        return True

    def get_run_id(self) -> str:
        return self._run_id

    def next_rendezvous(self) -> RendezvousInfo:
        end = _now() + self._join_timeout
        seen_version, seen_at = -1, _now()
        while True:
            _, st = self._read()
            if st["phase"] == "closed":
                raise RendezvousClosedError(f"the rendezvous of {self._run_id!r} was closed")
            slots = st["slots"]
            if self._me in slots:
                if st["phase"] == "running":
                    return self._info(slots.index(self._me))
            else:
                free = [i for i, x in enumerate(slots) if x is None]
                if free or len(slots) < self._max:

                    def take(s: dict) -> Optional[dict]:
                        if self._me in s["slots"] or s["phase"] == "closed":
                            return None
                        holes = [i for i, x in enumerate(s["slots"]) if x is None]
                        if holes:
                            s["slots"][holes[0]] = self._me
                        elif len(s["slots"]) < self._max:
                            s["slots"].append(self._me)
                        else:
                            return None
                        return s

                    st = self._update(take)
                    if self._me in st["slots"] and st["phase"] == "running":
                        log.info("cohort rendezvous: node %s admitted into the running job %r as node %d",
                                 self._me, self._run_id, st["slots"].index(self._me))
                        return self._info(st["slots"].index(self._me))
                    continue
            if st["phase"] == "join" and self._me in st["slots"]:
                n = sum(1 for x in st["slots"] if x is not None)
                if st["version"] != seen_version:
                    seen_version, seen_at = st["version"], _now()
                if n >= self._max or (n >= self._min and _now() - seen_at >= self._last_call):

                    def run(s: dict) -> Optional[dict]:
                        if s["phase"] != "join" or s["version"] != seen_version:
                            return None
                        s["phase"] = "running"
                        return s

                    self._update(run)
                    continue
            if _now() >= end:
                raise RendezvousTimeoutError(
                    f"cohort rendezvous of {self._run_id!r}: not admitted after {self._join_timeout:.0f} s "
                    f"({len([x for x in slots if x])} of {self._min}..{self._max} nodes)")
            time.sleep(0.1)

    def _info(self, slot: int) -> RendezvousInfo:
        self._slot = slot
        self._start_keepalive()
        live = self._live()
        store = _RoundStore(dist.PrefixStore(f"torchrun/{self._run_id}/round/", self._tcp), self._live)
        log.info("cohort rendezvous of %r: this node is %d of %d (range %d:%d)", self._run_id, slot, live,
                 self._min, self._max)
        return RendezvousInfo(store, slot, live, RendezvousStoreInfo(self._host, self._port))

    def is_closed(self) -> bool:
        _, st = self._read()
        return st["phase"] == "closed"

    def set_closed(self) -> None:
        def close(s: dict) -> dict:
            s["phase"] = "closed"
            return s

        self._update(close)

    def num_nodes_waiting(self) -> int:
        """0: a node that comes is admitted into the running round, nobody restarts for it."""
        return 0

    def shutdown(self) -> bool:
        """Leaves the round (its slot is free for a newcomer) and stops the keep-alive."""
        self._stop.set()
        if self._thread is not None:
            self._thread.join(5)
        try:
            def leave(s: dict) -> Optional[dict]:
                if self._me not in s["slots"]:
                    return None
                s["slots"][s["slots"].index(self._me)] = None
                return s

            self._update(leave)
        except Exception as e:
            log.warning("cohort rendezvous: could not leave the round: %s", e)
            return False
        return True

    # -- keep-alive: a node whose agent went silent frees its slot ----------------

    def _start_keepalive(self) -> None:
        if self._thread is None:
            self._thread = threading.Thread(target=self._keepalive, name="cohort-rdzv-keepalive", daemon=True)
            self._thread.start()

    def _keepalive(self) -> None:
        try:
            tcp = dist.TCPStore(self._host, self._port, is_master=False, timeout=self._timeout)
        except Exception as e:
            log.warning("cohort rendezvous: keep-alive cannot reach the store: %s", e)
            return
        store = dist.PrefixStore(f"torchrun/{self._run_id}/", tcp)
        seen: dict[str, tuple[int, float]] = {}
        while not self._stop.wait(self._keepalive_s):
            try:
                store.add(f"alive/{self._me}", 1)
                _, st = self._read(store)
                for node in st["slots"]:
                    if node is None or node == self._me:
                        continue
                    n = store.add(f"alive/{node}", 0)
                    last = seen.get(node)
                    if last is None or last[0] != n:
                        seen[node] = (n, _now())
                    elif _now() - last[1] >= self._dead_after:
                        self._free(store, node)
                        seen.pop(node, None)
            except Exception as e:  # the store is gone (cohortd restarting): try again
                log.debug("cohort rendezvous keep-alive: %s", e)

    def _free(self, store: dist.Store, node: str) -> None:
        def drop(s: dict) -> Optional[dict]:
            if node not in s["slots"]:
                return None
            s["slots"][s["slots"].index(node)] = None
            return s

        self._update(drop, store)
        log.warning("cohort rendezvous of %r: node %s silent for %.0f s, its slot is free", self._run_id, node,
                    self._dead_after)


def create_handler(params: RendezvousParameters) -> CohortRendezvousHandler:
    """The creator torch's registry calls for ``--rdzv-backend cohort``."""
    return CohortRendezvousHandler(params)


def handler_factory() -> Callable[[RendezvousParameters], RendezvousHandler]:
    """The ``torchrun.handlers`` entry point: returns the creator (torch calls it once)."""
    return create_handler
