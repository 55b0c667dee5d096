"""DDP training where one rank fails; the others report what they saw.

    fail_worker.py MODE VICTIM STEP STAMP

MODE raise: the victim raises ValueError in its step (uncaught, so the
process dies reporting it); kill: it SIGKILLs itself. Before failing, the
victim writes time.time() to STAMP. A survivor prints one JSON line:
{"rank", "pending": {type, mro, msg}, "next": {...}, "detect_s"}: the
exception its pending step raised, the one the next collective raised,
and how long after the victim's failure it saw the first.

ddp_job() is also the job of bench/torch_failures.py.
"""

import dataclasses
import json
import os
import signal
import sys
import time

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cohort.torch  # noqa: F401


def ddp_job(mode, victim, fail_step, stamp, text="injected failure in training step {i} of rank {rank}"):
    """A small MLP under DDP in the joined group: returns step(i), one training step, except on the
    victim at fail_step, where it writes time.time() to stamp and SIGKILLs itself (mode "kill") or
    raises ValueError(text) (formatted with i and rank)."""
    rank = dist.get_rank()
    torch.manual_seed(0)
    model = DDP(nn.Sequential(nn.Linear(256, 256), nn.ReLU(), nn.Linear(256, 10)))
    opt = torch.optim.SGD(model.parameters(), lr=0.01)
    x, y = torch.randn(16, 256), torch.randint(0, 10, (16,))

    def step(i):
        if rank == victim and i == fail_step:
            with open(stamp, "w") as f:
                f.write(repr(time.time()))
            if mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise ValueError(text.format(i=i, rank=rank))
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()

    return step


def describe(e):
    rec = getattr(e, "failure", None)  # cohort's FailureRecord of the failed rank
    return {"type": type(e).__name__, "mro": [c.__name__ for c in type(e).__mro__], "msg": str(e)[:3000],
            "failure": dataclasses.asdict(rec) if rec is not None else None}


def main():
    mode, victim, fail_step, stamp = sys.argv[1], int(sys.argv[2]), int(sys.argv[3]), sys.argv[4]
    torch.set_num_threads(1)
    dist.init_process_group("cohort")
    rank = dist.get_rank()
    step = ddp_job(mode, victim, fail_step, stamp)
    report = {"rank": rank}
    try:
        for i in range(100000):
            step(i)
    except Exception as e:  # the victim's ValueError is not caught here: see below
        if rank == victim:
            raise
        report["detect_at"] = time.time()
        report["pending"] = describe(e)
    try:
        dist.all_reduce(torch.ones(4))
        report["next"] = None
    except Exception as e:
        report["next"] = describe(e)
    for _ in range(100):
        if os.path.exists(stamp) and os.path.getsize(stamp):
            break
        time.sleep(0.05)
    with open(stamp) as f:
        report["detect_s"] = report.get("detect_at", 0) - float(f.read())
    print(json.dumps(report), flush=True)


if __name__ == "__main__":
    main()
