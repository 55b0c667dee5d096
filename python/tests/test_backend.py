"""The "cohort" backend against values computed in the test, world sizes 1-4.

Every collective torch.distributed offers x every dtype cohort supports x
every reduce op, synchronous and asynchronous, in separate processes that
rendezvous through torch's own store (the embedded-coordinator path: no
cohortd is given, rank 0 starts one).
"""

import collections

import pytest

from conftest import WORKERS, describe, run_ranks

# Cases each rank must report (the worker prints one JSON line per case).
MIN_CASES = 200


@pytest.mark.parametrize("world", [1, 2, 3, 4])
def test_matrix(world, built):
    procs = run_ranks(WORKERS / "matrix.py", world, timeout=240)
    assert all(p.returncode == 0 for p in procs), describe(procs)
    for p in procs:
        assert any(r.get("done") for r in p.records), describe([p])
        cases = [r for r in p.records if "case" in r]
        assert len(cases) >= MIN_CASES, f"rank {p.rank} ran only {len(cases)} cases"
        failed = [f"{r['case']}: {r['why'][:300]}" for r in cases if not r["ok"]]
        assert not failed, f"rank {p.rank} of {world}:\n" + "\n".join(failed)
    kinds = collections.Counter(r["case"].split("/")[0] for r in procs[0].records if "case" in r)
    for k in ("all_reduce", "reduce", "broadcast", "all_gather", "all_gather_into_tensor", "reduce_scatter",
              "reduce_scatter_tensor", "all_to_all_single", "all_to_all_uneven", "gather", "scatter", "objects",
              "barrier", "new_group", "all_reduce_coalesced"):
        assert kinds[k] > 0, f"no {k} case ran"
