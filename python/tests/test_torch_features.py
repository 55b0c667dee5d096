"""torch treats a cohort process group as its own: feature by feature, against gloo.

Each scenario of workers/features.py runs as a real multi-process job on
the "cohort" backend and on gloo, with the same seeds; every rank saves
what it produced (losses, parameters, tensors). The tests compare the two
backends (equal up to float rounding of a different summation order),
check the values themselves where they are known, and check what cohort
does beyond gloo (every waiting rank names the rank missing from a
monitored barrier; a subgroup of a group with a bound device).

The features (issue 21): the group's name, description and device
backends; FSDP2 training steps; functional collectives (also the ops by
group name that compiled code calls); DeviceMesh 1-D and 2-D (4 ranks)
with DTensor distribute/redistribute/full_tensor; DCP save and load of an
FSDP2 model; DDP with the PowerSGD comm hook (callbacks that wait on
further all-reduces); split_group; init_process_group(device_id=cpu:0);
monitored_barrier with a missing rank; a 1 s timeout.
"""

from __future__ import annotations

import pytest
import torch

from conftest import compared_jobs, compared_outputs

WORLDS = [2, 3]


@pytest.fixture(scope="session")
def job(tmp_path_factory, built):
    """job(backend, scenario, world) -> (records by rank, saved tensors by rank), run once per session."""
    return compared_jobs(tmp_path_factory, "features.py")


def feature(job, backend: str, scenario: str, world: int, name: str, must_pass: bool = True):
    return compared_outputs(job, backend, scenario, world, name, must_pass)


def close(a, b, tol: float = 1e-5) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(close(a[k], b[k], tol) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(close(x, y, tol) for x, y in zip(a, b))
    return a.shape == b.shape and a.dtype == b.dtype and torch.allclose(a, b, rtol=tol, atol=tol)


# Gradients summed in float16 or bfloat16 (DDP's compression hooks) round
# differently when the ranks' terms are added in another order.
TOL = {"fp16": 1e-4, "bf16": 1e-3}


def same_as_gloo(job, scenario: str, world: int, name: str):
    """The feature's saved outputs on cohort, rank by rank, equal to gloo's."""
    _, ours = feature(job, "cohort", scenario, world, name)
    _, theirs = feature(job, "gloo", scenario, world, name)
    for r, (a, b) in enumerate(zip(ours, theirs)):
        if name == "ddp_hooks":
            for k in a:
                assert close(a[k], b[k], TOL.get(k, 1e-5)), f"{name} {k}, {world} ranks, rank {r}"
        else:
            assert close(a, b), f"{name}, {world} ranks, rank {r}: cohort {a}\ngloo {b}"
    return ours


@pytest.mark.parametrize("world", WORLDS)
def test_group_name_description_and_device_backends(job, world):
    rs, _ = feature(job, "cohort", "train", world, "identity")
    gloo, _ = feature(job, "gloo", "train", world, "identity")
    for r, g in zip(rs, gloo):
        assert r["backend"] == "cohort" and r["backend_name"] == "cohort", r
        assert r["group_name"] == g["group_name"] and r["group_desc"] == g["group_desc"] == "default_pg", (r, g)
        assert r["devices"] == ["cpu", "cuda"], r


@pytest.mark.parametrize("world", WORLDS)
def test_fsdp2_training_steps(job, world):
    ours = same_as_gloo(job, "train", world, "fsdp2")
    for s in ours[1:]:  # the full parameters are the same on every rank
        assert close(s["params"], ours[0]["params"], 0), "ranks disagree on the FSDP2 parameters"
    torch.manual_seed(1234)
    init = torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.Tanh(), torch.nn.Linear(32, 32), torch.nn.Tanh(),
                               torch.nn.Linear(32, 4))
    moved = max((a - b).abs().max().item() for a, b in zip(ours[0]["params"], init.parameters()))
    assert moved > 1e-3, f"training barely moved the parameters ({moved})"


@pytest.mark.parametrize("world", WORLDS)
def test_functional_collectives(job, world):
    ours = same_as_gloo(job, "train", world, "funcol")
    xs = [torch.arange(6 * world, dtype=torch.float32) + 100 * r for r in range(world)]
    total = sum(xs)
    for r, o in enumerate(ours):
        assert torch.equal(o["all_reduce"], total)
        assert torch.equal(o["all_reduce_max"], xs[-1])
        assert torch.equal(o["all_gather"], torch.cat(xs))
        assert torch.equal(o["reduce_scatter"], total[6 * r : 6 * (r + 1)])
        assert torch.equal(o["all_to_all"], torch.cat([x[6 * r : 6 * (r + 1)] for x in xs]))
        assert torch.equal(o["broadcast"], xs[0])
        assert torch.equal(o["op_all_reduce"], torch.full((4,), float(world * (world + 1) // 2)))


@pytest.mark.parametrize("world", WORLDS)
def test_device_mesh_1d_with_dtensor(job, world):
    ours = same_as_gloo(job, "train", world, "mesh1d")
    torch.manual_seed(7)
    big = torch.randn(4 * world, 3)
    for r, o in enumerate(ours):
        assert torch.equal(o["local"], big[4 * r : 4 * (r + 1)])
        assert torch.equal(o["replicated"], big) and torch.equal(o["full"], big)
        assert torch.allclose(o["sum"], (big * 2 + 1).sum())


def test_device_mesh_2d_with_dtensor(job):
    """A 2 x 2 mesh on 4 ranks: Shard/Replicate placements on both dims."""
    ours = same_as_gloo(job, "mesh2d", 4, "mesh2d")
    rs, _ = feature(job, "cohort", "mesh2d", 4, "mesh2d")
    torch.manual_seed(11)
    big = torch.randn(8, 6)
    for r, (o, rec) in enumerate(zip(ours, rs)):
        i, j = divmod(r, 2)
        assert torch.equal(o["local"], big[4 * i : 4 * (i + 1), 3 * j : 3 * (j + 1)])
        assert torch.equal(o["full"], big) and torch.allclose(o["matmul"], big)
        assert rec["dp_ranks"] == [j, j + 2] and rec["tp_ranks"] == [2 * i, 2 * i + 1], rec


@pytest.mark.parametrize("world", WORLDS)
def test_dcp_save_and_load_of_an_fsdp2_model(job, world):
    ours = same_as_gloo(job, "train", world, "dcp")
    rs, _ = feature(job, "cohort", "train", world, "dcp")
    assert ".metadata" in rs[0]["files"] and sum(f.endswith(".distcp") for f in rs[0]["files"]) == world, rs[0]
    for o in ours[1:]:
        assert close(o["params"], ours[0]["params"], 0)


@pytest.mark.parametrize("world", WORLDS)
def test_powersgd_comm_hook(job, world):
    """PowerSGD's callbacks wait on further all-reduces (a deadlock when
    every callback ran on one completion thread)."""
    ours = same_as_gloo(job, "train", world, "powersgd")
    for o in ours[1:]:
        assert close(o["params"], ours[0]["params"], 1e-6), "ranks disagree after PowerSGD"


@pytest.mark.parametrize("world", WORLDS)
def test_split_group(job, world):
    same_as_gloo(job, "train", world, "split")
    rs, _ = feature(job, "cohort", "train", world, "split")
    gl, _ = feature(job, "gloo", "train", world, "split")
    for r, g in zip(rs, gl):
        mine = list(range(r["rank"] % 2, world, 2))
        assert r["split_ranks"] == mine and r["split_size"] == len(mine), r
        assert r["split_name"] == g["split_name"], (r, g)


@pytest.mark.parametrize("world", WORLDS)
def test_split_group_leaving_a_rank_out(job, world):
    """A rank in no split: gloo answers NON_GROUP_MEMBER; with cohort torch
    2.15 would crash (SIGSEGV in its PyBackend::split on a Python
    backend's None), so that rank gets a ValueError saying how to avoid
    it, and the members' group works as gloo's does."""
    rs, _ = feature(job, "cohort", "train", world, "split_leaves_out")
    gl, _ = feature(job, "gloo", "train", world, "split_leaves_out")
    want = [float(world * (world - 1) // 2)] * 3
    for r, g in zip(rs, gl):
        if r["rank"] == world - 1:
            assert g["member"] is False, g
            assert r["member"] is None and "is in none of the splits" in r["error"], r
            assert f"a group of its own, [{world - 1}]" in r["error"], r
        else:
            assert r["member"] and g["member"] and r["sum"] == g["sum"] == want, (r, g)


@pytest.mark.parametrize("world", WORLDS)
def test_device_id(job, world):
    """init_process_group(device_id=cpu:0) binds the group and connects it
    eagerly; a later new_group works (torch asks the bound backend to
    split: gloo in torch 2.15 cannot, cohort can)."""
    ours = same_as_gloo(job, "device_id", world, "device_id")
    for o in ours:
        assert torch.equal(o["sum"], torch.full((3,), float(world * (world - 1) // 2)))
    _, sub = feature(job, "cohort", "device_id", world, "device_id_subgroup")
    members = [0, world - 1]
    for r, o in enumerate(sub):
        want = float(sum(m + 1 for m in members)) if r in members else float(r + 1)
        assert torch.equal(o["sub"], torch.full((2,), want)), (r, o)
    gloo, _ = feature(job, "gloo", "device_id", world, "device_id_subgroup", must_pass=False)
    print(f"gloo, new_group after device_id, {world} ranks: "
          + ("works" if all(g["ok"] for g in gloo) else "fails: " + gloo[-1]["why"].splitlines()[0][:200]))


@pytest.mark.parametrize("world", WORLDS)
def test_monitored_barrier_names_the_missing_rank(job, world):
    """Rank 1 never enters; every rank that waited raises after the 1 s
    timeout naming it (gloo names it on rank 0 only)."""
    rs, _ = feature(job, "cohort", "monitored", world, "monitored")
    gl, _ = feature(job, "gloo", "monitored", world, "monitored")
    for r in rs:
        if r["rank"] == 1:
            continue
        assert r["raised"] == "CohortBackendError" and "DistBackendError" in r["mro"], r
        # Rank 1 alone, also on a rank whose deadline comes a little after
        # another's (cohortd tells a rank that came and timed out first
        # apart from one that never came).
        assert r["missing"] == [1] and "Rank 1 failed to pass monitoredBarrier in 1000 ms" in r["msg"], r
        assert 0.9 <= r["after_s"] < 10, r
        # timeout=0 does not wait (it was the group's 30 minutes before)
        assert r["zero_raised"] == "CohortBackendError" and r["zero_after_s"] < 0.9, r
    assert "Ranks 1 failed to pass monitoredBarrier" in gl[0]["msg"], gl[0]


@pytest.mark.parametrize("world", WORLDS)
def test_one_second_timeout(job, world):
    """timeout=1 s is accepted (it is shorter than the failure detector's
    default dead-after, which cohort fits to it); a collective works; one
    that a rank is 3 s late for raises on the others after about 1 s,
    naming that rank, as gloo raises after its 1 s."""
    late = world - 1
    for backend in ("cohort", "gloo"):
        rs, _ = feature(job, backend, "timeout", world, "timeout")
        for r in rs:
            assert r["raised"], r
            if r["rank"] != late:
                assert 0.9 <= r["after_s"] < 2.9, (backend, r)
                if backend == "cohort":
                    assert "DistBackendError" in r["mro"] and "COHORT_ETIMEDOUT" in r["msg"], r
                    assert f"rank {late} never entered" in r["msg"], r["msg"]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("name", ["fsdp1", "zero", "ddp_hooks", "join"])
def test_what_worked_before_still_does(job, world, name):
    """FSDP1, ZeroRedundancyOptimizer, DDP's compression and allreduce comm
    hooks (several buckets), Join with uneven inputs: as gloo."""
    ours = same_as_gloo(job, "train", world, name)

    def params(o):  # the (full) parameters, which every rank must hold alike
        return {k: v["params"] for k, v in o.items()} if name == "ddp_hooks" else o["params"]

    for o in ours[1:]:
        assert close(params(o), params(ours[0]), 1e-6), f"ranks disagree after {name}"
