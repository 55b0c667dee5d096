"""Point-to-point on the cohort backend, against gloo: send/recv, isend/irecv, batch_isend_irecv.

Each scenario of workers/p2p.py runs as a real multi-process job on the
"cohort" backend and on gloo, with the same seeds, on 2 and 3 ranks;
every rank saves what it received. The tests compare the two backends
(equal, bit for bit: nothing is computed, only moved), check the values
against what the sender made, and check what cohort does beyond gloo
(non-contiguous tensors, all_to_all with lists of different sizes).

What runs: blocking send/recv around a ring in float32, float64, int64,
bfloat16, uint8, bool, an empty and a 4 MiB tensor; isend/irecv in both
directions at once with tags posted in another order than received; a
receive from any rank (``recv(src=None)`` returns the sender);
``batch_isend_irecv`` rings in both directions (and the same batch in
reverse order); ``send_object_list``/``recv_object_list``; uneven
``all_to_all_single`` (cohort_alltoallv, no padding), blocking and
asynchronous.
"""

from __future__ import annotations

import pytest
import torch

from conftest import WORKERS, compared_jobs, compared_outputs, describe, run_ranks

WORLDS = [2, 3]


@pytest.fixture(scope="session")
def p2p_job(tmp_path_factory, built):
    """p2p_job(backend, scenario, world) -> (records by rank, saved by rank), run once per session."""
    return compared_jobs(tmp_path_factory, "p2p.py", "p2p-")


def outputs(p2p_job, backend: str, world: int, name: str, must_pass: bool = True):
    return compared_outputs(p2p_job, backend, "p2p", world, name, must_pass)


def equal(a, b) -> bool:
    if isinstance(a, dict):
        return a.keys() == b.keys() and all(equal(a[k], b[k]) for k in a)
    if isinstance(a, (list, tuple)):
        return len(a) == len(b) and all(equal(x, y) for x, y in zip(a, b))
    if isinstance(a, torch.Tensor):
        return a.shape == b.shape and a.dtype == b.dtype and torch.equal(a, b)
    return a == b


def same_as_gloo(p2p_job, world: int, name: str):
    _, ours = outputs(p2p_job, "cohort", world, name)
    _, theirs = outputs(p2p_job, "gloo", world, name)
    for r, (a, b) in enumerate(zip(ours, theirs)):
        assert equal(a, b), f"{name}, {world} ranks, rank {r}: cohort {a}\ngloo {b}"
    return ours


@pytest.mark.parametrize("world", WORLDS)
def test_send_recv_ring_in_every_dtype(p2p_job, world):
    ours = same_as_gloo(p2p_job, world, "send_recv")
    for o in ours:
        assert o["empty"].shape == (0, 4) and o["big"].numel() == 1 << 20
        assert o["bool"].dtype == torch.bool and o["bf16"].dtype == torch.bfloat16


@pytest.mark.parametrize("world", WORLDS)
def test_isend_irecv_both_ways_with_tags(p2p_job, world):
    ours = same_as_gloo(p2p_job, world, "isend_irecv")
    assert all(sorted(o) == [1, 2, 3] for o in ours)


@pytest.mark.parametrize("world", WORLDS)
def test_recv_from_any_source_returns_the_sender(p2p_job, world):
    ours = same_as_gloo(p2p_job, world, "any_source")
    assert len(ours[0]["by_source"]) == world - 1


@pytest.mark.parametrize("world", WORLDS)
def test_batch_isend_irecv(p2p_job, world):
    ours = same_as_gloo(p2p_job, world, "batch")
    assert len(ours[0]) == 3 and ours[0][0].shape == (2, 1000)


@pytest.mark.parametrize("world", WORLDS)
def test_send_and_recv_object_list(p2p_job, world):
    ours = same_as_gloo(p2p_job, world, "objects")
    for r, o in enumerate(ours):
        left = (r - 1) % world
        assert o == [{"from": left, "x": list(range(left + 3))}, "hi" * left]


@pytest.mark.parametrize("world", WORLDS)
def test_all_to_all_single_uneven_splits(p2p_job, world):
    ours = same_as_gloo(p2p_job, world, "all_to_all_uneven")
    assert any(o["single0"].shape[0] != ours[0]["single0"].shape[0] for o in ours) or world == 2


@pytest.mark.parametrize("world", WORLDS)
def test_beyond_gloo_non_contiguous_and_uneven_all_to_all_lists(p2p_job, world):
    """What gloo refuses, cohort does (checked against the senders' values in the worker)."""
    outputs(p2p_job, "cohort", world, "noncontig")
    outputs(p2p_job, "cohort", world, "all_to_all_list_uneven")
    theirs, _ = outputs(p2p_job, "gloo", world, "noncontig", must_pass=False)
    assert not theirs[0]["ok"] and "contiguous" in theirs[0]["why"], theirs[0]["why"][:300]
    theirs, _ = outputs(p2p_job, "gloo", world, "all_to_all_list_uneven", must_pass=False)
    assert not theirs[0]["ok"] and "invalid tensor size" in theirs[0]["why"], theirs[0]["why"][:300]


def test_a_peer_killed_during_recv_is_named(built, tmp_path):
    """SIGKILL rank 1 while ranks 0 and 2 wait in dist.recv from it: both raise
    CohortBackendError (EPEERLOST) naming rank 1 within seconds, and the error is sticky."""
    procs = run_ranks(WORKERS / "p2p.py", 3, ["cohort", "peer_dies", str(tmp_path)], timeout=120)
    assert procs[1].returncode == -9, describe(procs)
    for p in (procs[0], procs[2]):
        assert p.returncode == 0, describe(procs)
        [rec] = [r for r in p.records if r.get("feature") == "peer_dies"]
        assert rec["ok"], rec["why"]
        assert rec["raised"] == "CohortBackendError" and rec["status"] == 6, rec  # COHORT_EPEERLOST
        assert "rank 1" in rec["text"], rec["text"]
        assert rec["after_s"] < 10, rec
        assert "rank 1" in rec["sticky"], rec["sticky"]
