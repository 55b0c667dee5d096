#!/usr/bin/env python3
"""Where a DDP step's time goes: forward, backward, each gradient bucket's all-reduce, optimizer.

    .venv/bin/python bench/ddp_timeline.py [--ranks 1,2] [--backends cohort,gloo] [--iters 30] [--reps 3]

Runs DistributedDataParallel steps on bench/torch_compare.py's ``large``
model (an MLP with ~4.2 M parameters, batch 8 per rank, one intra-op
thread per rank) with a communication hook that does what DDP's default
does (divide the bucket by the world size, all-reduce it) and stamps, for
every bucket, when backward handed it over and when its all-reduce
finished. Per step (medians over the steps, then over --reps interleaved
jobs), in milliseconds from the step's start:

- ``fwd``: forward and loss;
- ``bwd``: ``backward()`` returned (DDP has waited for every bucket and
  copied the averaged gradients back);
- ``first``/``last``: the first and the last bucket handed to the hook;
- ``done``: the last bucket's all-reduce finished;
- ``exposed``: ``bwd - last``, the part of the step after backward's
  compute during which the step waits for communication and copies;
- ``comm``: the sum of the buckets' all-reduce times (launch to finish);
- ``step``: the whole step with the optimizer.

A world-size-1 row is the same step with no byte moved: the difference
between the rows is what the second rank costs.
"""

from __future__ import annotations

import argparse
import json
import os
import statistics
import sys
import time

HERE = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(HERE)
sys.path.insert(0, HERE)
from torch_compare import MODELS, run_local_ranks  # noqa: E402

KEYS = ("fwd", "first", "last", "done", "bwd", "exposed", "comm", "step", "buckets")


def worker(backend: str, iters: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    sys.path.insert(0, os.path.join(ROOT, "python"))
    import cohort.torch  # noqa: F401

    torch.set_num_threads(1)
    dist.init_process_group(backend)
    world = dist.get_world_size()
    widths, batch = MODELS["large"]
    layers = []
    for a, b in zip(widths, widths[1:]):
        layers += [nn.Linear(a, b), nn.ReLU()]
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(*layers[:-1]))
    marks: list[tuple[float, float]] = []

    def hook(_state, bucket):
        t = time.perf_counter()
        fut = dist.all_reduce(bucket.buffer().div_(world), async_op=True).get_future()

        def done(f):
            marks.append((t, time.perf_counter()))
            return f.value()[0]

        return fut.then(done)

    model.register_comm_hook(None, hook)
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(batch, widths[0]), torch.randint(0, widths[-1], (batch,))
    rows = []
    for i in range(iters + 5):
        marks.clear()
        t0 = time.perf_counter()
        opt.zero_grad(set_to_none=False)
        loss = nn.functional.cross_entropy(model(x), y)
        t1 = time.perf_counter()
        loss.backward()
        t2 = time.perf_counter()
        opt.step()
        t3 = time.perf_counter()
        if i < 5 or not marks:
            continue
        ms = lambda t: (t - t0) * 1e3  # noqa: E731
        rows.append({"fwd": ms(t1), "first": ms(min(m[0] for m in marks)), "last": ms(max(m[0] for m in marks)),
                     "done": ms(max(m[1] for m in marks)), "bwd": ms(t2),
                     "exposed": (t2 - max(m[0] for m in marks)) * 1e3,
                     "comm": sum(m[1] - m[0] for m in marks) * 1e3, "step": ms(t3), "buckets": len(marks)})
    if dist.get_rank() == 0:
        print("RESULT " + json.dumps({k: statistics.median(r[k] for r in rows) for k in KEYS}), flush=True)
    dist.destroy_process_group()


def run_job(backend: str, world: int, iters: int) -> dict:
    res, _ = run_local_ranks([__file__, "--worker", backend, str(iters)], world)
    if res is None:
        raise SystemExit(f"{backend} world {world}: no result")
    return res


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="1,2")
    ap.add_argument("--backends", default="cohort,gloo")
    ap.add_argument("--iters", type=int, default=30)
    ap.add_argument("--reps", type=int, default=3)
    args = ap.parse_args()
    got: dict[tuple[str, int], list[dict]] = {}
    for rep in range(args.reps):
        for w in (int(x) for x in args.ranks.split(",")):
            for b in args.backends.split(","):
                got.setdefault((b, w), []).append(run_job(b, w, args.iters))
                print(f"rep {rep + 1}/{args.reps} {b} n={w}: step {got[(b, w)][-1]['step']:.2f} ms",
                      file=sys.stderr, flush=True)
    print(f"\n(ms from the step's start; medians over steps, then over {args.reps} interleaved jobs)\n")
    print("| backend | n | " + " | ".join(KEYS) + " |")
    print("|---|---|" + "---|" * len(KEYS))
    for (b, w), rs in got.items():
        med = {k: statistics.median(r[k] for r in rs) for k in KEYS}
        print(f"| {b} | {w} | " + " | ".join(f"{med[k]:.2f}" if k != "buckets" else f"{med[k]:.0f}" for k in KEYS)
              + " |")
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], int(sys.argv[3]))
    else:
        sys.exit(main())
