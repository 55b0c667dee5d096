"""What the elastic workers (elastic_ddp.py, elastic_lightning.py) share:
their event lines and their data set."""

import json
import time

import torch


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
