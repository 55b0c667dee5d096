"""DistributedDataParallel over "cohort" trains exactly what gloo and one process do.

A model trained with DDP on N ranks (each with its slice of every global
batch) must end with the same parameters as over gloo and as one process
trained on the whole N-times batch: DDP averages the ranks' gradients,
which for equal slices is the gradient of the whole batch.
"""

import pytest
import torch

from conftest import PYTHON, WORKERS, base_env, describe, exited_ok, finish, run_ranks, start


def train(backend, world, path):
    procs = run_ranks(WORKERS / "ddp_train.py", world, [backend, str(path)], timeout=180)
    ok = (lambda p: p.returncode == 0) if backend == "cohort" else exited_ok
    assert all(ok(p) for p in procs), describe(procs)
    sums = {r["checksum"] for p in procs for r in p.records}
    assert len(sums) == 1, f"ranks disagree after DDP over {backend}: {sums}"
    return torch.load(path)


def train_single(world, path):
    [p] = finish([start([PYTHON, str(WORKERS / "ddp_train.py"), "none", str(path), "--single", str(world)],
                        base_env())], 120)
    assert p.returncode == 0, describe([p])
    return torch.load(path)


@pytest.mark.parametrize("world", [2, 3, 4])
def test_ddp_matches_gloo_and_one_process(world, tmp_path, built):
    ours = train("cohort", world, tmp_path / "cohort.pt")
    gloo = train("gloo", world, tmp_path / "gloo.pt")
    alone = train_single(world, tmp_path / "single.pt")
    for a, b, c in zip(ours, gloo, alone):
        assert torch.allclose(a, b, atol=1e-5, rtol=1e-5), f"cohort vs gloo: max diff {(a - b).abs().max()}"
        assert torch.allclose(a, c, atol=1e-5, rtol=1e-5), f"cohort vs one process: max diff {(a - c).abs().max()}"
    # Training moved the parameters (the comparison is not vacuous).
    torch.manual_seed(1234)
    init = torch.nn.Sequential(torch.nn.Linear(32, 64), torch.nn.Tanh(), torch.nn.Linear(64, 64), torch.nn.Tanh(),
                               torch.nn.Linear(64, 5))
    moved = max((a - b).abs().max().item() for a, b in zip(ours, init.parameters()))
    assert moved > 1e-3, f"training barely moved the parameters ({moved})"
    diff = max(max((a - b).abs().max().item(), (a - c).abs().max().item()) for a, b, c in zip(ours, gloo, alone))
    print(f"world {world}: max |cohort - gloo|, |cohort - one process| = {diff:.3g}; moved {moved:.3g}")
