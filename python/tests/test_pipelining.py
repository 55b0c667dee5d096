"""torch.distributed.pipelining on the cohort backend, against gloo (CPU).

One pipeline stage per rank (2 and 3 stages) of an MLP, two optimizer
steps of 4 microbatches, with the GPipe and the 1F1B schedules
(workers/p2p.py, scenarios ``gpipe`` and ``1f1b``). The stages send
activations forward and gradients backward with batch_isend_irecv and
wait on the works; the last stage computes the losses. The losses, every
stage's gradients and parameters are equal to gloo's, bit for bit (the
arithmetic is each rank's own; only the transfers differ), and training
moved the parameters.
"""

from __future__ import annotations

import pytest
import torch

from test_p2p import equal, p2p_job  # noqa: F401  (the session fixture)

SCHEDULES = ["gpipe", "1f1b"]
WORLDS = [2, 3]


def run(p2p_job, backend, schedule, world):  # noqa: F811
    recs, saved = p2p_job(backend, schedule, world)
    bad = [f"rank {r}: {rec[schedule]['why'][-2500:]}" for r, rec in enumerate(recs) if not rec[schedule]["ok"]]
    assert not bad, f"{schedule} on {backend}, {world} ranks:\n" + "\n".join(bad)
    return recs, [s[schedule] for s in saved]


@pytest.mark.parametrize("world", WORLDS)
@pytest.mark.parametrize("schedule", SCHEDULES)
def test_pipeline_losses_and_gradients_equal_gloo(p2p_job, schedule, world):  # noqa: F811
    recs, ours = run(p2p_job, "cohort", schedule, world)
    _, theirs = run(p2p_job, "gloo", schedule, world)
    for r, (a, b) in enumerate(zip(ours, theirs)):
        for k in ("losses", "grads", "params"):
            assert equal(a[k], b[k]), f"{schedule}, {world} stages, rank {r}: {k} differ from gloo's"
    last = recs[-1][schedule]["losses"]
    assert len(last) == 2 and all(len(step) == 4 for step in last), last
    assert all(v > 0 for step in last for v in step), last
    for r, a in enumerate(ours):
        assert all(g.abs().sum() > 0 for step in a["grads"] for g in step), f"rank {r}: a zero gradient"


def test_gpipe_and_1f1b_agree(p2p_job):  # noqa: F811
    """The two schedules compute the same losses (only the order of the microbatches' passes differs)."""
    _, g = run(p2p_job, "cohort", "gpipe", 3)
    _, f = run(p2p_job, "cohort", "1f1b", 3)
    for a, b in zip(g[-1]["losses"], f[-1]["losses"]):
        assert all(torch.allclose(x, y) for x, y in zip(a, b))
