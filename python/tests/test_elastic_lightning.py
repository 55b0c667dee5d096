"""Elastic Lightning on one host: Trainer.fit through a kill and a return (CohortElasticStrategy).

cohortd on loopback; each "node" is a ``cohort run --nnodes 2:3
--node-rank R -n 1`` of ``workers/elastic_lightning.py``. One rank is
SIGKILLed mid-training: the others go on in their processes (same PIDs),
a new process for the lost node is admitted into the running fit, receives
the Lightning state from a healthy rank, and every rank ends with the same
parameters, the same global step and the elastic sampler.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import BIN, PYTHON, WORKERS, base_env, kill_tree, start_cohortd
from test_elastic import back_at_the_last_step, dump, finished_alike, shrink_then_return, started_once, wait_until
from test_elastic_torchrun import Agent

WORKER = WORKERS / "elastic_lightning.py"


@pytest.fixture
def cohortd(built):
    # a generous last call: a node slow to start on a loaded machine still makes the first generation
    p, url, _ = start_cohortd("--log-level", "warn", "--rdzv-last-call", "30000")
    yield url
    kill_tree(p)
    p.wait()


def LNode(url: str, job: str, rank: int, rng: str, args: list[str], env: dict) -> Agent:
    """One ``cohort run`` node of the elastic Lightning worker."""
    return Agent([str(BIN / "cohort"), "run", "--nnodes", rng, "--node-rank", str(rank), "-n", "1", "--coordinator",
                  url, "--job", job, "--", PYTHON, str(WORKER), *args], env)


def _env() -> dict:
    return base_env(COHORT_LOG_FORMAT="text", COHORT_HEARTBEAT_MS="250", COHORT_DEAD_AFTER_MS="2000",
                    PYTHONWARNINGS="ignore")


def test_lightning_fit_survives_a_kill_in_place_and_takes_the_rank_back(cohortd):
    args = ["--epochs", "12", "--pace", "60"]
    env = _env()
    nodes = [LNode(cohortd, "lel", r, "2:3", args, env) for r in range(3)]
    try:
        wait_until(lambda: len(nodes[0].ev("commit")) >= 15, 180, nodes, "15 steps committed")
        pids = started_once(nodes, 3)
        os.kill(pids[2], signal.SIGKILL)
        back = shrink_then_return(nodes, lambda: LNode(cohortd, "lel", 2, "2:3", args, env))
        wait_until(lambda: len(back.ev("start")) == 1, 60, nodes, "the returning rank trains")
        assert back.ev("start")[0]["step"] > 0, back.ev("start")  # it resumed from the state it received
        for i in (0, 1, 3):
            assert nodes[i].wait(300) == 0, dump(nodes)
        assert nodes[2].wait(30) != 0
        done = finished_alike([nodes[i] for i in (0, 1, 3)], 3)
        assert {d["steps"] for d in done} == {done[0]["steps"]}, done
        assert {d["epoch"] for d in done} == {12}, done
        assert {d["sampler"] for d in done} == {"ElasticStepSampler"}, done
        for d, pid in zip(done[:2], pids[:2]):
            assert d["pid"] == pid, (d, pids)  # the survivors kept their processes
        assert done[2]["pid"] != pids[2]
        print(f"lightning: steps {done[0]['steps']}, accuracy {done[0]['accuracy']}")
    finally:
        for n in nodes:
            kill_tree(n.p)


def test_lightning_sigterm_makes_the_rank_leave_and_the_others_go_on(cohortd):
    """A preempted rank (SIGTERM) leaves at its next step; no collective in the signal handler, no stop of the job."""
    args = ["--epochs", "4", "--pace", "60"]
    env = _env()
    nodes = [LNode(cohortd, "lterm", r, "2:3", args, env) for r in range(3)]
    try:
        wait_until(lambda: all(n.ev("start") for n in nodes) and len(nodes[0].ev("commit")) >= 10
                   and nodes[0].ev("commit")[-1]["world"] == 3, 180, nodes, "10 steps committed on 3 ranks")
        pids = [n.ev("start")[0]["pid"] for n in nodes]
        os.kill(pids[2], signal.SIGTERM)
        wait_until(lambda: all(any(c["lost"] == 1 for c in n.ev("change")) for n in nodes[:2]), 30, nodes,
                   "the others moved on")
        nodes[2].wait(60)  # Lightning's SIGTERMException is a SystemExit: the rank exits 0
        assert "leaves the job at its next step" in nodes[2].text, nodes[2].text[-3000:]
        assert not nodes[2].ev("done"), nodes[2].text[-3000:]
        for n in nodes[:2]:
            assert n.wait(300) == 0, dump(nodes)
        done = [n.ev("done")[0] for n in nodes[:2]]
        assert {d["world"] for d in done} == {2}, done
        assert len({d["checksum"] for d in done}) == 1 and all(d["equal"] for d in done), done
        assert [d["pid"] for d in done] == pids[:2]
        assert {d["epoch"] for d in done} == {4}, done
    finally:
        for n in nodes:
            kill_tree(n.p)


@pytest.mark.parametrize("epochs", [1, 2], ids=["the-fits-last-step", "an-epochs-last-step"])
def test_lightning_rank_admitted_at_an_epochs_last_step_goes_on_with_the_others(built, tmp_path, epochs):
    """A returning process admitted at the last step boundary of an epoch goes where the others go.

    At the fit's last step it receives a finished fit's state: it runs no step and ends (its end-of-fit
    collectives, the worker's checks) with the others. At the last step of an earlier epoch it starts the
    next epoch with them, not one more batch of the finished one (a collective the others do not make).
    The survivors hold epoch 0's last step (``--hold-last-until``) until cohortd's /metrics says the
    returner waits to join, so the admission falls on that boundary every time."""
    d, url, (http,) = start_cohortd("--http", "127.0.0.1:{port}", "--log-level", "warn", "--rdzv-last-call", "30000")
    release = tmp_path / "release"
    args = ["--epochs", str(epochs), "--samples", "480", "--pace", "20", "--hold-last-until", str(release),
            "--hold-epoch", "0"]
    env = _env()
    nodes = [LNode(url, "llast", r, "2:3", args, env) for r in range(3)]
    try:
        pids = back_at_the_last_step(nodes, lambda: LNode(url, "llast", 2, "2:3", args, env), http, release)
        if epochs == 1:
            assert not nodes[3].ev("start"), dump(nodes)  # admitted after the last step: it trained none
        else:
            assert [e["epoch"] for e in nodes[3].ev("start")] == [1], dump(nodes)  # the next epoch's first step
        assert any(c["joined"] == 1 for c in nodes[0].ev("change")), dump(nodes)
        done = finished_alike([nodes[i] for i in (0, 1, 3)], 3)
        assert {x["steps"] for x in done} == {done[0]["steps"]}, done
        assert {x["epoch"] for x in done} == {epochs}, done
        assert done[2]["pid"] != pids[2]
    finally:
        for n in nodes:
            kill_tree(n.p)
        kill_tree(d)
        d.wait()



def test_step_sampler_deals_every_sample_once_through_a_discard_and_a_shrink(built):
    """ElasticStepSampler alone (workers/elastic_sampler_check.py): 3 ranks, a discarded step, the rest on 2."""
    r = subprocess.run([PYTHON, str(WORKERS / "elastic_sampler_check.py")], env=base_env(), capture_output=True,
                       text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    assert "ok" in r.stdout, r.stdout
