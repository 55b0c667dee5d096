"""Fixtures of the multi-host suite: built programs and simulated hosts."""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path
from typing import Callable, Iterator

import pytest

sys.path.insert(0, str(Path(__file__).resolve().parent))

from hostnet import Cluster, Proc, missing  # noqa: E402

ROOT = Path(__file__).resolve().parents[2]
BIN = Path(os.environ.get("COHORT_BIN", ROOT / "build" / "bin")).resolve()
COORD_PORT = 29400


def bin_path(name: str) -> str:
    """A program of the build (build/bin, or COHORT_BIN)."""
    p = BIN / name
    if not p.exists():
        pytest.fail(f"{p} is missing: run 'make all' first")
    return str(p)


@pytest.fixture
def cluster() -> Iterator[Callable[..., Cluster]]:
    """A factory of clusters, closed (processes killed, namespaces
    removed) when the test ends, whatever happened."""
    why = missing()
    if why is not None:
        pytest.skip(f"multi-host tests skipped: {why}")
    made: list[Cluster] = []

    def make(n_hosts: int, name: str = "t") -> Cluster:
        c = Cluster(n_hosts, name).__enter__()
        made.append(c)
        return c

    yield make
    for c in made:
        c.close()


def start_cohortd(host, *args: str, env: dict | None = None) -> Proc:
    """cohortd on host, listening on its address; waits until it is."""
    p = host.spawn(
        [bin_path("cohortd"), "--listen", f"tcp://0.0.0.0:{COORD_PORT}",
         "--log-level", "info", *args],
        env={"COHORT_LOG_FORMAT": "text", **(env or {})},
        name="cohortd",
    )  # fmt: skip
    if not p.wait_for("listening on", 10):
        raise AssertionError(f"cohortd did not start:\n{p.output()}")
    return p


def coord_url(host) -> str:
    return f"tcp://{host.addr}:{COORD_PORT}"


def liveness(hb_ms: int, dead_ms: int) -> dict:
    """The environment of ranks that beat every hb_ms and are declared dead
    after dead_ms of silence, logging text (which the tests read)."""
    return {
        "COHORT_HEARTBEAT_MS": str(hb_ms),
        "COHORT_DEAD_AFTER_MS": str(dead_ms),
        "COHORT_LOG_FORMAT": "text",
    }


def run_nodes_of(hosts, coord, program, nproc, job, env, extra=()):
    """``cohort run`` of program on each host, one node each, nproc ranks a
    node, with env; "{dir}" in an extra argument is the host's directory.
    Returns the launchers."""
    procs = []
    for i, h in enumerate(hosts):
        argv = [
            bin_path("cohort"), "run", "--nnodes", str(len(hosts)),
            "--node-rank", str(i), "-n", str(nproc),
            "--coordinator", coord_url(coord), "--job", job,
            *(a.format(dir=h.dir) for a in extra),
            "--", *program,
        ]  # fmt: skip
        procs.append(h.spawn(argv, env=env))
    return procs


def dump(procs) -> str:
    """Every process's output, for assertion messages."""
    out = []
    for p in procs:
        out.append(f"--- {p.host.name} {p.log_path.name} rc={p.poll()}")
        out.append(p.output()[-3000:])
    return "\n".join(out)


def wait_until(cond, timeout, procs, what):
    """Polls cond every 50 ms until it holds; fails with what and every
    process's output if it still does not after timeout seconds (checked
    once more at the end: what came true in the last sleep counts)."""
    end = time.monotonic() + timeout
    while not cond():
        if time.monotonic() >= end:
            raise AssertionError(
                f"{what}: not after {timeout} s\n{dump(procs)}")
        time.sleep(0.05)
