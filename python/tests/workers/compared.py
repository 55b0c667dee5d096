"""What every rank of a cohort-against-gloo comparison shares (features.py, p2p.py).

    WORKER.py BACKEND SCENARIO OUTDIR

Reads the worker's arguments and torchrun's RANK/WORLD_SIZE, pins torch
to one thread (the same arithmetic on every backend), and reports each
feature as one JSON line: {"feature", "ok", "why", "rank", ...}; the
worker stores what it produced in ``saved`` and writes it to
OUTDIR/rank<r>.pt.
"""

from __future__ import annotations

import json
import os
import sys
import time
import traceback

import torch

backend, scenario, outdir = sys.argv[1], sys.argv[2], sys.argv[3]
rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
saved: dict = {}


def report(feature: str, ok: bool, why: str = "", **extra) -> None:
    print(json.dumps({"feature": feature, "ok": bool(ok), "why": why, "rank": rank, **extra}), flush=True)


def run(feature: str, fn) -> None:
    """Runs fn() and reports feature: ok with what fn returned (a dict) and the time it took,
    or failed with the exception and its traceback."""
    t0 = time.monotonic()
    try:
        extra = fn() or {}
        report(feature, True, elapsed=time.monotonic() - t0, **extra)
    except Exception as e:
        report(feature, False, f"{type(e).__name__}: {e}\n{traceback.format_exc()[-3000:]}",
               elapsed=time.monotonic() - t0)
