"""Elastic PyTorch on one host: in-process recovery of DDP (cohort.elastic).

cohortd runs on loopback; each "node" is a ``cohort run --nnodes MIN:MAX
--node-rank R -n 1`` of ``workers/elastic_ddp.py`` (a DDP classifier on a
synthetic data set). A worker is SIGKILLed mid-training: the survivors
must go on in the same processes (same PIDs), a node that comes back must
be admitted and receive the state, and every member must end with the
same parameters. The multi-host versions (namespace hosts, a pulled
cable, torchrun, Lightning) are in tests/hosts/test_elastic_torch.py.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import threading
import time
from typing import Any, Callable

import pytest

from conftest import BIN, PYTHON, WORKERS, base_env, joiners_waiting, kill_tree, start, start_cohortd

WORKER = WORKERS / "elastic_ddp.py"


def events(p_log: list[str], kind: str) -> list[dict]:
    out = []
    for line in p_log:
        line = line.strip()
        if line.startswith("{") and f'"event": "{kind}"' in line:
            out.append(json.loads(line))
    return out


class Collected:
    """A process started with ``start``, its output collected by a thread."""

    def __init__(self, argv: list[str], env: dict) -> None:
        self.p = start(argv, env)
        self.lines: list[str] = []
        self._t = threading.Thread(target=self._read, daemon=True)
        self._t.start()

    def _read(self) -> None:
        for line in self.p.stdout:
            self.lines.append(line)

    def ev(self, kind: str) -> list[dict]:
        return events(list(self.lines), kind)

    @property
    def text(self) -> str:
        return "".join(self.lines)

    def wait(self, timeout: float) -> int:
        try:
            rc = self.p.wait(timeout)
        except subprocess.TimeoutExpired:
            kill_tree(self.p)
            rc = self.p.wait()
        self._t.join(5)
        return rc


class Node(Collected):
    """One ``cohort run`` of the elastic worker; its output collected by a thread."""

    def __init__(self, url: str, job: str, rank: int, rng: str, worker_args: list[str], env: dict):
        super().__init__([str(BIN / "cohort"), "run", "--nnodes", rng, "--node-rank", str(rank), "-n", "1",
                          "--coordinator", url, "--job", job, "--", PYTHON, str(WORKER), *worker_args], env)


def dump(nodes) -> str:
    return "\n".join(f"--- node {i} rc={n.p.poll()}\n{n.text[-4000:]}" for i, n in enumerate(nodes))


def wait_until(cond, timeout: float, nodes, what: str) -> None:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if cond():
            return
        time.sleep(0.05)
    raise AssertionError(f"{what}: not after {timeout} s\n{dump(nodes)}")


def started_once(procs: list, world: int) -> list[int]:
    """Each of ``procs`` started its worker once, in a ``world``-rank generation: their PIDs."""
    starts = [p.ev("start") for p in procs]
    assert all(len(s) == 1 for s in starts), dump(procs)
    assert {s[0]["world"] for s in starts} == {world}, starts
    return [s[0]["pid"] for s in starts]


def survivors_moved_on(survivors: list, procs: list, world: int) -> None:
    """Each of ``survivors`` goes on after one rank was lost: a change from ``world`` + 1 ranks to ``world``."""
    wait_until(lambda: all(any(c["lost"] == 1 for c in x.ev("change")) for x in survivors), 30, procs,
               "the survivors moved on")
    for x in survivors:
        c = [c for c in x.ev("change") if c["lost"] == 1][0]
        assert c["world"] == world and c["prev_world"] == world + 1, c


def shrink_then_return(nodes: list, make: Callable[[], Any]) -> Any:
    """The last of ``nodes`` was SIGKILLed: the others move on without it and commit
    5 steps in that generation, then ``make()``'s new node is admitted back;
    returns it (appended to ``nodes``)."""
    n = len(nodes) - 1
    survivors_moved_on(nodes[:n], nodes, n)
    before = len(nodes[0].ev("commit"))
    wait_until(lambda: len(nodes[0].ev("commit")) >= before + 5, 60, nodes, f"steps in the {n}-rank generation")
    assert {c["world"] for c in nodes[0].ev("commit")[before:]} == {n}
    back = make()
    nodes.append(back)
    wait_until(lambda: any(c["joined"] == 1 for c in nodes[0].ev("change")), 120, nodes, "the rank came back")
    return back


def back_at_the_last_step(nodes: list, make: Callable[[], Any], http: int, release: Any) -> list[int]:
    """Three ``nodes`` whose workers hold at their last step (``--hold-last-until release``): once 3
    steps committed the last one is SIGKILLed; when the two survivors hold, ``make()``'s new node is
    started (appended to ``nodes``) and, once cohortd's /metrics (port ``http``) shows it waiting to
    join, ``release`` is created. Waits until the survivors and the new node exited 0; returns the
    first three's PIDs."""
    wait_until(lambda: len(nodes[0].ev("commit")) >= 3, 180, nodes, "3 steps committed")
    pids = started_once(nodes, 3)
    os.kill(pids[2], signal.SIGKILL)
    survivors_moved_on(nodes[:2], nodes, 2)
    wait_until(lambda: all(n.ev("hold") for n in nodes[:2]), 120, nodes, "the survivors' last step")
    nodes.append(make())
    wait_until(lambda: joiners_waiting(http) >= 1, 120, nodes, "the returner waits to join")
    release.touch()
    for i in (0, 1, 3):
        assert nodes[i].wait(180) == 0, dump(nodes)
    return pids


def finished_alike(procs: list, world: int) -> list[dict]:
    """Each of ``procs`` ended with one ``done`` event: ranks 0..``world``-1 of a
    ``world``-rank generation, with equal parameters. Returns the events."""
    done = [p.ev("done") for p in procs]
    assert all(len(d) == 1 for d in done), dump(procs)
    done = [d[0] for d in done]
    assert {d["world"] for d in done} == {world}, done
    assert len({d["checksum"] for d in done}) == 1, done
    assert all(d["equal"] for d in done), done
    assert sorted(d["rank"] for d in done) == list(range(world)), done
    return done


@pytest.fixture
def cohortd(built):
    p, url, _ = start_cohortd("--log-level", "warn")
    yield url
    kill_tree(p)
    p.wait()


def _env() -> dict:
    return base_env(COHORT_LOG_FORMAT="text", COHORT_HEARTBEAT_MS="250", COHORT_DEAD_AFTER_MS="2000")


@pytest.mark.parametrize("mode", ["run", "manager"])
def test_ddp_survives_a_kill_in_place_and_takes_the_rank_back(cohortd, mode):
    args = ["--epochs", "12", "--pace", "60", "--mode", mode]
    env = _env()
    nodes = [Node(cohortd, "el", r, "3:4", args, env) for r in range(4)]
    try:
        wait_until(lambda: len(nodes[0].ev("commit")) >= 20, 120, nodes, "20 steps committed")
        pids = [n.ev("start")[0]["pid"] for n in nodes]
        t_kill = time.time() * 1000
        os.kill(pids[3], signal.SIGKILL)
        shrink_then_return(nodes, lambda: Node(cohortd, "el", 3, "3:4", args, env))
        took = [[c for c in n.ev("change") if c["lost"] == 1][0]["at_ms"] - t_kill for n in nodes[:3]]
        print(f"kill -> survivors going on: {', '.join(f'{t:.0f} ms' for t in took)}")
        for i in (0, 1, 2, 4):
            assert nodes[i].wait(240) == 0, dump(nodes)
        assert nodes[3].wait(30) != 0
        done = finished_alike([nodes[i] for i in (0, 1, 2, 4)], 4)
        for d, pid in zip(done[:3], pids[:3]):
            assert d["pid"] == pid, (d, pids)  # the survivors kept their processes
        assert done[3]["pid"] != pids[3]
        steps = {d["steps"] for d in done}
        assert len(steps) == 1, done
        print(f"{mode}: steps {steps.pop()}, accuracy {done[0]['accuracy']}, discarded "
              f"{[d['discarded'] for d in done]}")
    finally:
        for n in nodes:
            kill_tree(n.p)


def test_a_rank_back_after_the_last_step_is_not_admitted_and_exits_cleanly(built, tmp_path):
    """A returning process that waits to join when the job's last step has committed (the plain
    Manager loop) is not admitted (there is no step left to admit it at): the others finish, cohortd
    answers its join "the job finished", and it exits 0 (cohort.elastic.JobFinished), so its node is
    done, not failed (torchelastic's graceful exit of a node the last rendezvous left out). The
    survivors hold after their last commit until cohortd's /metrics shows it waiting."""
    d, url, (http,) = start_cohortd("--http", "127.0.0.1:{port}", "--log-level", "warn")
    release = tmp_path / "release"
    args = ["--epochs", "1", "--samples", "480", "--pace", "20", "--mode", "manager", "--hold-last-until",
            str(release)]
    env = _env()
    nodes = [Node(url, "elast", r, "2:3", args, env) for r in range(3)]
    try:
        back_at_the_last_step(nodes, lambda: Node(url, "elast", 2, "2:3", args, env), http, release)
        finished_alike(nodes[:2], 2)
        assert not nodes[3].ev("start") and not nodes[3].ev("done"), dump(nodes)
        assert "the job finished before this process was admitted: nothing to do" in nodes[3].text, dump(nodes)
    finally:
        for n in nodes:
            kill_tree(n.p)
        kill_tree(d)
        d.wait()
