"""A real Lightning Trainer.fit on CPU with devices=2 on the "cohort" backend.

The example script examples/lightning_digits.py is what a user runs; every
rank prints its final accuracy and a checksum of its parameters, which
must agree across ranks (gradients were synchronised through cohort).
"""

import re

import pytest

from conftest import BIN, LIGHTNING_EXAMPLE as EXAMPLE, PYTHON, WORKERS, exited_ok, free_port, run_one

LINE = re.compile(r"rank (\d+)/(\d+) backend=(\S+) test_acc=([\d.]+) checksum=([-\d.]+)")


def results(out):
    return [m.groups() for m in LINE.finditer(out)]


def check_trained(out, world=2, backend="cohort"):
    res = results(out)
    assert sorted(int(r[0]) for r in res) == list(range(world)), out[-4000:]
    assert all(r[2] == backend for r in res), res
    assert len({r[4] for r in res}) == 1, f"ranks' parameters differ: {res}"
    assert all(float(r[3]) > 0.8 for r in res), f"did not learn: {res}"


@pytest.mark.parametrize("strategy", ["ddp-cohort", "cohort_ddp"])
def test_lightning_launcher(strategy, digits):
    """Lightning starts the second rank itself (its subprocess launcher)."""
    p = run_one([PYTHON, str(EXAMPLE), "--devices", "2", "--epochs", "4", "--strategy", strategy])
    assert p.returncode == 0, p.out[-4000:]
    check_trained(p.out)


def test_lightning_torchrun(digits):
    """torchrun starts both ranks; Lightning sees a TorchElastic environment."""
    torchrun = [PYTHON, "-m", "torch.distributed.run", "--nproc-per-node", "2",
                "--master-port", str(free_port()), str(EXAMPLE), "--devices", "2", "--epochs", "4"]
    p = run_one(torchrun)
    assert p.returncode == 0, p.out[-4000:]
    check_trained(p.out)


def test_lightning_under_cohort_run(digits):
    """cohort run is the launcher; cohort_ddp takes its ranks from
    CohortEnvironment and Lightning spawns nothing."""
    argv = [str(BIN / "cohort"), "run", "-n", "2", "--", PYTHON, str(EXAMPLE), "--devices", "2", "--epochs", "4"]
    p = run_one(argv)
    assert p.returncode == 0, p.out[-4000:]
    check_trained(p.out)


def test_lightning_matches_gloo(digits):
    """The same script over gloo ends with the same parameters."""
    runs = {}
    for strategy in ("ddp-cohort", "ddp-gloo"):
        p = run_one([PYTHON, str(EXAMPLE), "--devices", "2", "--epochs", "2", "--strategy", strategy])
        assert (p.returncode == 0 if strategy == "ddp-cohort" else exited_ok(p)), p.out[-4000:]
        runs[strategy] = {float(r[4]) for r in results(p.out)}
    [ours], [gloo] = runs["ddp-cohort"], runs["ddp-gloo"]
    assert abs(ours - gloo) < 1e-3, runs


@pytest.mark.parametrize("strategy", ["cohort_ddp"])
def test_strategy_collectives(strategy, built):
    """barrier, broadcast, reduce_boolean_decision, reduce, all_gather and
    sync_dist logging all go through the cohort process group."""
    p = run_one([PYTHON, str(WORKERS / "lightning_strategy.py"), strategy])
    assert p.returncode == 0, p.out[-4000:]
    recs = sorted((r for r in p.records if "rank" in r), key=lambda r: r["rank"])
    assert [r["rank"] for r in recs] == [0, 1], p.out[-4000:]
    for r in recs:
        assert r["backend"] == "cohort" and r["strategy"] == "CohortDDPStrategy", r
        assert r["bcast"] == {"from": 1, "payload": [0, 1, 2, 3, 4]}, r
        assert r["all"] is False and r["any"] is True, r
        assert r["sum"] == 3.0 and r["gathered"] == [0, 1], r
        assert abs(r["logged"] - 0.5) < 1e-6, r  # mean of ranks 0 and 1
