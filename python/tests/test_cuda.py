"""The CUDA path of the torch backend, on a GPU.

CUDA tensors in a cohort process group go to the group's device-memory
libcohort group (NCCL across GPUs; tcp-staged, through pinned host
buffers, where ranks share one GPU), interleaved with object collectives
and CPU tensors in the same torch group; DDP trains on the GPU. Skipped,
with the reason, where torch sees no GPU (this project's CI has none: run
it on a machine that has one).
"""

import pytest
import torch

from conftest import WORKERS, describe, run_ranks

pytestmark = pytest.mark.skipif(
    not torch.cuda.is_available(),
    reason="CUDA path of the torch backend not checked: torch sees no GPU on this machine "
           "(run python/tests/test_cuda.py where one is)",
)


@pytest.mark.parametrize("world", [1, 2])
def test_cuda_collectives_and_ddp(world, built):
    env = {}
    if torch.cuda.device_count() < world:
        env["COHORT_BACKEND"] = "tcp-staged"  # ranks share a GPU: NCCL cannot
    procs = run_ranks(WORKERS / "cuda_worker.py", world, timeout=300, env=env)
    assert all(p.returncode == 0 for p in procs), describe(procs)
    for p in procs:
        assert any(r.get("done") for r in p.records), describe([p])
        checks = [r for r in p.records if "check" in r]
        assert len(checks) == 6, describe([p])
        bad = [f"{r['check']}: {r['why']}" for r in checks if not r["ok"]]
        assert not bad, f"rank {p.rank}:\n" + "\n".join(bad)
