"""torchrun --rdzv-backend cohort on one host: elastic DDP through a kill and a restart.

The cohort package is installed for real (``pip install --target``, not
editable, no network) into a directory the agents import from, so torch's
registry finds the handler through the ``torchrun.handlers`` entry point
of ``python/pyproject.toml`` exactly as in a user's environment. One
cohortd serves both the agents' rendezvous (its TCPStore listener,
``--torch-store JOB@...``) and the workers' elastic job.

Three torchrun agents (``--nnodes 2:3 --nproc-per-node 1``) run
``workers/elastic_ddp.py`` (cohort.elastic.run). The worker of one node is
SIGKILLed mid-training: the other two go on in their processes (same
PIDs, a change with one rank lost), that node's agent restarts its worker
(``--max-restarts``) without any other agent restarting anything, the new
worker is admitted into the running job and receives the state, and all
three end with the same parameters.
"""

from __future__ import annotations

import os
import signal
import subprocess

import pytest

from conftest import BIN, PYDIR, PYTHON, WORKERS, base_env, kill_tree, start_cohortd
from test_elastic import Collected, dump, finished_alike, started_once, survivors_moved_on, wait_until

WORKER = WORKERS / "elastic_ddp.py"


@pytest.fixture(scope="module")
def installed(tmp_path_factory):
    """The cohort package installed (not editable) into a directory of its own."""
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run([PYTHON, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation", "--no-index",
                        "--disable-pip-version-check", "--target", str(target), str(PYDIR)],
                       capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def _env(site) -> dict:
    env = base_env(COHORT_LOG_FORMAT="text", COHORT_HEARTBEAT_MS="250", COHORT_DEAD_AFTER_MS="2000",
                   COHORT_LIBRARY=str((BIN.parent / "lib" / "libcohort.so").resolve()))
    env["PYTHONPATH"] = str(site)  # the installed copy, not the source tree
    return env


def test_the_installed_entry_point_is_what_torch_finds(installed):
    code = ("from torch.distributed.elastic.rendezvous import registry as r, rendezvous_handler_registry as h\n"
            "import cohort, cohort.torchrun\n"
            "r._register_out_of_tree_handlers()\n"
            "print(cohort.__file__)\n"
            "print(h._registry['cohort'] is cohort.torchrun.create_handler)\n")
    r = subprocess.run([PYTHON, "-c", code], env=_env(installed), capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stdout + r.stderr
    path, found = r.stdout.split()
    assert path.startswith(str(installed)), path
    assert found == "True", r.stdout + r.stderr


class Agent(Collected):
    """One torchrun agent (a "node"), its output (and its workers') collected by a thread."""


def test_torchrun_ddp_survives_a_worker_kill_in_place_and_takes_it_back(installed):
    job = "trun"
    env = _env(installed)
    # Generous last calls (agents' and cohortd's): on a loaded machine a slow
    # node must still make the first round; with all three there it closes at once.
    d, url, (sport,) = start_cohortd("--torch-store", job + "@127.0.0.1:{port}", "--log-level", "warn",
                                     "--rdzv-last-call", "30000", env=env)
    argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "2:3", "--nproc-per-node", "1", "--rdzv-backend",
            "cohort", "--rdzv-endpoint", f"127.0.0.1:{sport}", "--rdzv-id", job, "--rdzv-conf",
            f"coordinator={url},last_call_timeout=30", "--max-restarts", "2", "--monitor-interval", "0.2",
            str(WORKER), "--epochs", "20", "--pace", "60"]
    agents = [Agent(argv, env) for _ in range(3)]
    try:
        wait_until(lambda: sum(len(a.ev("commit")) for a in agents) >= 20, 180, agents, "20 steps committed")
        pids = started_once(agents, 3)
        victim = 2
        os.kill(pids[victim], signal.SIGKILL)
        survivors = [a for i, a in enumerate(agents) if i != victim]
        survivors_moved_on(survivors, agents, 2)
        # The agent restarts the killed worker alone; it is admitted into the
        # running job and receives the state.
        wait_until(lambda: len(agents[victim].ev("start")) == 2, 120, agents, "the worker was restarted")
        wait_until(lambda: all(any(c["joined"] == 1 for c in a.ev("change")) for a in survivors), 120, agents,
                   "the restarted worker was admitted")
        for a in agents:
            assert a.wait(300) == 0, dump(agents)
        done = finished_alike(agents, 3)
        assert len({x["steps"] for x in done}) == 1, done
        for i, a in enumerate(agents):
            if i != victim:
                assert done[i]["pid"] == pids[i], (done, pids)  # survivors kept their processes
                assert len(a.ev("start")) == 1, a.text[-3000:]  # and were never restarted
        assert done[victim]["pid"] != pids[victim]
        restarted = agents[victim].ev("start")[1]
        assert restarted["world"] == 3, restarted
        print(f"torchrun: steps {done[0]['steps']}, accuracy {done[0]['accuracy']}, discarded "
              f"{[x['discarded'] for x in done]}")
    finally:
        for a in agents:
            kill_tree(a.p)
            # torchrun's workers are not in their agent's process group: end them by PID too
            for e in a.ev("start"):
                try:
                    os.kill(int(e["pid"]), signal.SIGKILL)
                except ProcessLookupError:
                    pass
        kill_tree(d)
        d.wait()
