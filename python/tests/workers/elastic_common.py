"""What the elastic workers (elastic_ddp.py, elastic_lightning.py) share:
their options, event lines, data set, model, pace and end checks."""

import argparse
import hashlib
import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn


def now_ms() -> int:
    return int(time.time() * 1000)


def emit(**kw) -> None:
    """One event line (JSON) the tests read."""
    print(json.dumps(kw), flush=True)


def data(n: int, seed: int) -> torch.utils.data.TensorDataset:
    """n samples of a fixed 5-class problem (the same weights for every seed)."""
    g = torch.Generator().manual_seed(seed)
    x = torch.randn(n, 20, generator=g)
    w = torch.randn(20, 5, generator=torch.Generator().manual_seed(7))
    y = (x @ w + 0.3 * torch.randn(n, 5, generator=g)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


def parser() -> argparse.ArgumentParser:
    """The options both workers take."""
    p = argparse.ArgumentParser()
    p.add_argument("--epochs", type=int, default=3)
    p.add_argument("--batch", type=int, default=16, help="per rank")
    p.add_argument("--samples", type=int, default=1536)
    p.add_argument("--pace", type=float, default=0.0, help="ms per step at least")
    p.add_argument("--hidden", type=int, default=64)
    return p


def net(hidden: int) -> nn.Sequential:
    """The classifier, initialised alike on every rank."""
    torch.manual_seed(0)
    return nn.Sequential(nn.Linear(20, hidden), nn.ReLU(), nn.Linear(hidden, 5))


class Pace:
    """Makes each step last at least ``ms`` milliseconds (0: no pacing)."""

    def __init__(self, ms: float):
        self.ms = ms
        self.t = time.monotonic()

    def __call__(self) -> None:
        if self.ms > 0:
            left = self.ms / 1000.0 - (time.monotonic() - self.t)
            if left > 0:
                time.sleep(left)
        self.t = time.monotonic()


def emit_change(c) -> None:
    """The event line of a membership change ``c`` (cohort.elastic's)."""
    emit(event="change", generation=c.generation, rank=c.rank, world=c.world_size, prev_rank=c.prev_rank,
         prev_world=c.prev_world_size, lost=c.lost, joined=c.joined, received=c.received_state, at_ms=now_ms())


def checked_end(model: nn.Module, net_: nn.Module, test: torch.utils.data.TensorDataset) -> dict:
    """What every worker's ``done`` line says of its model (collective: every rank calls it): the
    parameters' checksum, whether every rank has the same, and ``net_``'s accuracy on ``test``."""
    h = hashlib.sha256()
    for t in model.state_dict().values():
        h.update(t.detach().contiguous().numpy().tobytes())
    mine = h.hexdigest()[:16]
    sums = [None] * dist.get_world_size()
    dist.all_gather_object(sums, mine)
    with torch.no_grad():
        x, y = test.tensors
        acc = float((net_(x).argmax(1) == y).float().mean())
    return {"checksum": mine, "equal": len(set(sums)) == 1, "accuracy": round(acc, 4)}


def hold(path: str, rank: int, step: int) -> None:
    """Says so (a ``hold`` event line) and waits until ``path`` exists, at most 300 s: the test's way of
    having a process admitted at exactly this step boundary."""
    emit(event="hold", rank=rank, step=step, at_ms=now_ms())
    end = time.monotonic() + 300
    while not os.path.exists(path) and time.monotonic() < end:
        time.sleep(0.05)
