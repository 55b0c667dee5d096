"""The backend under every launcher a PyTorch user has.

Lightning's own launcher and torchrun are in test_lightning.py (with a
Trainer); here the plain torch forms: torch.multiprocessing.spawn and
torchrun with a script calling init_process_group("cohort").
"""

from conftest import BIN, PYTHON, WORKERS, base_env, finish, free_port, start


def oks(p, world):
    recs = [r for r in p.records if "ok" in r]
    assert sorted(r["rank"] for r in recs) == list(range(world)), p.out[-3000:]
    assert all(r["ok"] and r["backend"] == "cohort" for r in recs), recs


def test_mp_spawn(built):
    [p] = finish([start([PYTHON, str(WORKERS / "spawn_job.py"), "3", str(free_port())], base_env())], 180)
    assert p.returncode == 0, p.out[-3000:]
    oks(p, 3)


def test_torchrun(built):
    argv = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--master-port", str(free_port()),
            str(WORKERS / "torchrun_job.py")]
    [p] = finish([start(argv, base_env())], 180)
    assert p.returncode == 0, p.out[-3000:]
    oks(p, 2)


def test_torchrun_restart_finds_the_new_attempts_coordinator(built):
    """torchrun restarts every worker after a failure and keeps its store:
    the second attempt's ranks join the cohortd its new rank 0 started,
    not the dead one the first attempt published under the same name."""
    argv = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2", "--max-restarts", "1",
            "--monitor-interval", "0.1", "--master-port", str(free_port()), str(WORKERS / "torchrun_job.py")]
    [p] = finish([start(argv, base_env(FAIL_FIRST_ATTEMPT="1"))], 180)
    assert p.returncode == 0, p.out[-3000:]
    oks(p, 2)


def test_torchrun_agent_per_node_restart(built, tmp_path):
    """A torchrun per node (two agents, c10d rendezvous): rank 1's worker
    dies, and its agent counts a restart while rank 0's agent only follows
    the new rendezvous round. The next attempt's ranks disagree on
    TORCHELASTIC_RESTART_COUNT and still find one coordinator: the one
    their new rank 0 started, not the dead attempt's."""
    port = free_port()
    env = base_env(FAIL_FIRST_AGENT=str(tmp_path / "failed"))
    ps = [start([PYTHON, "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "1",
                 "--max-restarts", "1", "--monitor-interval", "0.1", "--rdzv-backend", "c10d", "--rdzv-endpoint",
                 f"127.0.0.1:{port}", "--rdzv-conf", f"is_host={1 if n == 0 else 0}", "--rdzv-id", "agents",
                 str(WORKERS / "torchrun_job.py")], env) for n in range(2)]
    done = finish(ps, 180)
    for p in done:
        assert p.returncode == 0, p.out[-3000:]
    recs = [r for p in done for r in p.records if "ok" in r]
    assert sorted(r["rank"] for r in recs) == [0, 1], [p.out[-2000:] for p in done]
    assert all(r["ok"] and r["backend"] == "cohort" for r in recs), recs


def test_cohort_run(built):
    """cohort run starts the ranks: the backend joins cohort run's own job
    (COHORT_COORDINATOR), torch's store is its TCPStore listener."""
    argv = [str(BIN / "cohort"), "run", "-n", "3", "--", PYTHON, str(WORKERS / "torchrun_job.py")]
    [p] = finish([start(argv, base_env())], 180)
    assert p.returncode == 0, p.out[-3000:]
    oks(p, 3)


def test_unmodified_gloo_job_under_cohort_run(built):
    """init_process_group("gloo") with env:// works under cohort run: the
    store is the coordinator's TCPStore listener, no rank binds a port."""
    argv = [str(BIN / "cohort"), "run", "-n", "2", "--", PYTHON, str(WORKERS / "store_gloo.py"), "env"]
    [p] = finish([start(argv, base_env())], 180)
    # cohort run exits 1 if gloo aborted a rank at teardown (see exited_ok)
    assert p.returncode == 0 or "terminate called without an active exception" in p.out, p.out[-3000:]
    recs = [r for r in p.records if "ok" in r]
    assert sorted(r["rank"] for r in recs) == [0, 1] and all(r["ok"] for r in recs), p.out[-3000:]
