"""Elastic PyTorch across (simulated) hosts: torchrun --rdzv-backend cohort (issue 20).

cohortd runs on host h0 with a TCPStore listener for the agents
(``--torch-store JOB@0.0.0.0:29500``, open to the cluster's addresses:
agents connect before any client of the job did). Each of h1..h4 runs one
``torchrun --nnodes 3:4 --nproc-per-node 1 --rdzv-backend cohort`` of
python/tests/workers/elastic_ddp.py (cohort.elastic.run, DDP). The cohort
package is installed for real (``pip install --target``) so torch finds
the handler through its entry point. The worker of one host is SIGKILLed
mid-training: the three others go on in their processes (same PIDs, never
restarted), that host's agent restarts its worker, which is admitted into
the running job with the state, and all four end with equal parameters.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import pytest

from conftest import BIN, ROOT, dump, start_cohortd, wait_until

STORE_PORT = 29500
WORKER = ROOT / "python" / "tests" / "workers" / "elastic_ddp.py"


@pytest.fixture(scope="module")
def site(tmp_path_factory):
    target = tmp_path_factory.mktemp("site")
    r = subprocess.run([sys.executable, "-m", "pip", "install", "-q", "--no-deps", "--no-build-isolation",
                        "--no-index", "--disable-pip-version-check", "--target", str(target),
                        str(ROOT / "python")], capture_output=True, text=True, timeout=300)
    assert r.returncode == 0, r.stdout + r.stderr
    return target


def events(p, kind):
    out = []
    for line in p.output().splitlines():
        line = line.strip()
        if line.startswith("{") and f'"event": "{kind}"' in line:
            out.append(json.loads(line))
    return out


def test_torchrun_3_4_a_worker_killed_goes_on_in_place_and_comes_back(cluster, site):
    cl = cluster(5, "et")
    h0 = cl.hosts[0]
    job = "trun"
    start_cohortd(h0, "--torch-store", f"{job}@0.0.0.0:{STORE_PORT}", "--torch-store-allow",
                  f"{cl.prefix}.0/24", "--rdzv-last-call", "30000")
    env = {
        "PYTHONPATH": str(site),
        "COHORT_LIBRARY": str(BIN.parent / "lib" / "libcohort.so"),
        "OMP_NUM_THREADS": "1",
        "COHORT_LOG_FORMAT": "text",
        "COHORT_HEARTBEAT_MS": "250",
        "COHORT_DEAD_AFTER_MS": "2000",
        "PYTHONUNBUFFERED": "1",
    }
    argv = [sys.executable, "-m", "torch.distributed.run", "--nnodes", "3:4", "--nproc-per-node", "1",
            "--rdzv-backend", "cohort", "--rdzv-endpoint", f"{h0.addr}:{STORE_PORT}", "--rdzv-id", job,
            "--rdzv-conf", f"coordinator=tcp://{h0.addr}:29400,last_call_timeout=30", "--max-restarts", "2",
            "--monitor-interval", "0.2", str(WORKER), "--epochs", "40", "--pace", "60"]
    agents = [h.spawn(argv, env=env, name=f"torchrun{i}") for i, h in enumerate(cl.hosts[1:])]
    wait_until(lambda: sum(len(events(a, "commit")) for a in agents) >= 20, 240, agents, "20 steps committed")
    starts = [events(a, "start") for a in agents]
    assert all(len(s) == 1 for s in starts), dump(agents)
    assert {s[0]["world"] for s in starts} == {4}, starts
    pids = [s[0]["pid"] for s in starts]
    victim = 3
    # the worker runs in the host's namespaces; its PID is the same from here
    os.kill(pids[victim], signal.SIGKILL)
    survivors = [a for i, a in enumerate(agents) if i != victim]
    wait_until(lambda: all(any(c["lost"] == 1 for c in events(a, "change")) for a in survivors), 30, agents,
               "the survivors moved on")
    for a in survivors:
        c = [c for c in events(a, "change") if c["lost"] == 1][0]
        assert c["world"] == 3 and c["prev_world"] == 4, c
    wait_until(lambda: len(events(agents[victim], "start")) == 2, 120, agents, "the worker was restarted")
    wait_until(lambda: all(any(c["joined"] == 1 for c in events(a, "change")) for a in survivors), 120, agents,
               "the restarted worker was admitted")
    for a in agents:
        a.wait(timeout=300)
        assert a.returncode == 0, dump(agents)
    done = [events(a, "done") for a in agents]
    assert all(len(d) == 1 for d in done), dump(agents)
    done = [d[0] for d in done]
    assert {d["world"] for d in done} == {4}, done
    assert len({d["checksum"] for d in done}) == 1 and all(d["equal"] for d in done), done
    assert sorted(d["rank"] for d in done) == [0, 1, 2, 3], done
    assert len({d["steps"] for d in done}) == 1, done
    for i, a in enumerate(agents):
        if i != victim:
            assert done[i]["pid"] == pids[i], (done, pids)
            assert len(events(a, "start")) == 1, dump(agents)
    assert done[victim]["pid"] != pids[victim]
    print(f"torchrun 3:4 on hosts: steps {done[0]['steps']}, accuracy {done[0]['accuracy']}")
