#!/usr/bin/env python3
"""How fast a PyTorch job on cohort learns that a rank failed, against gloo.

    .venv/bin/python bench/torch_failures.py [--trials 10] [--ranks 3] [--backends cohort,gloo]

Each trial starts a DDP job (one process per rank, torchrun's variables)
that trains a small MLP; at a step drawn from the trial's seed, one rank
(also drawn) either raises an exception or SIGKILLs itself, after writing
the wall-clock time to a file. Every survivor records when its pending
step raised and what the message said. Reported per backend and failure
kind: the median and maximum time from the failure to the last survivor's
exception, and whether the message named the failed rank. A job that
does not end is cut 60 s after the collective timeout (60 s here).
"""

from __future__ import annotations

import argparse
import json
import os
import random
import signal
import socket
import statistics
import subprocess
import sys
import tempfile
import time
import pathlib

REPO = pathlib.Path(__file__).resolve().parent.parent


def worker(backend: str, mode: str, victim: int, fail_step: int, stamp: str) -> None:
    import datetime

    import torch
    import torch.distributed as dist

    # the job (model, data, failure injection) is python/tests' fail_worker
    sys.path[:0] = [str(REPO / "python"), str(REPO / "python" / "tests" / "workers")]
    from fail_worker import ddp_job

    torch.set_num_threads(1)
    dist.init_process_group(backend, timeout=datetime.timedelta(seconds=60))
    rank = dist.get_rank()
    # the victim's text names no rank: "named" is the backend's own doing
    step = ddp_job(mode, victim, fail_step, stamp, "injected failure at step {i}")
    try:
        for i in range(1_000_000):
            step(i)
    except ValueError:
        raise
    except Exception as e:
        at = time.time()
        msg = str(e)
        print("RESULT " + json.dumps({"rank": rank, "at": at, "named": f"rank {victim}" in msg,
                                      "msg": msg.splitlines()[0][:300]}), flush=True)
        os._exit(3)


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def trial(backend: str, mode: str, world: int, rng: random.Random, cap_s: float) -> dict:
    victim = rng.randrange(world)
    step = rng.randint(20, 60)
    port = free_port()
    with tempfile.TemporaryDirectory() as d:
        stamp = os.path.join(d, "failed_at")
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r), MASTER_ADDR="127.0.0.1",
                       MASTER_PORT=str(port), OMP_NUM_THREADS="1", COHORT_LOG_LEVEL="error")
            procs.append(subprocess.Popen(
                [sys.executable, __file__, "--worker", backend, mode, str(victim), str(step), stamp],
                env=env, stdout=subprocess.PIPE, stderr=subprocess.DEVNULL, text=True, start_new_session=True))
        results, timed_out = [], False
        t0 = time.monotonic()
        for r, p in enumerate(procs):
            try:
                out, _ = p.communicate(timeout=max(1.0, cap_s + 60 - (time.monotonic() - t0)))
            except subprocess.TimeoutExpired:
                timed_out = True
                os.killpg(p.pid, signal.SIGKILL)
                out, _ = p.communicate()
            for line in out.splitlines():
                if line.startswith("RESULT "):
                    results.append(json.loads(line[7:]))
        failed_at = float(open(stamp).read()) if os.path.exists(stamp) else None
    survivors = world - 1
    lat = [r["at"] - failed_at for r in results] if failed_at else []
    return {"victim": victim, "step": step, "survivors_raised": len(results), "survivors": survivors,
            "last_s": max(lat) if len(results) == survivors and lat else None,
            "named": all(r["named"] for r in results) and len(results) == survivors,
            "timed_out": timed_out, "msg": results[0]["msg"] if results else ""}


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--trials", type=int, default=10)
    ap.add_argument("--ranks", type=int, default=3)
    ap.add_argument("--backends", default="cohort,gloo")
    ap.add_argument("--modes", default="kill,raise")
    ap.add_argument("--seed", type=int, default=7)
    ap.add_argument("--json")
    args = ap.parse_args()
    rows = []
    print("| backend | failure | trials | every survivor raised | named the rank | median | max |")
    print("|---|---|---|---|---|---|---|")
    for mode in args.modes.split(","):
        for backend in args.backends.split(","):
            rng = random.Random(args.seed)
            ts = [trial(backend, mode, args.ranks, rng, 60) for _ in range(args.trials)]
            ok = [t for t in ts if t["last_s"] is not None]
            lat = [t["last_s"] for t in ok]
            med = f"{statistics.median(lat) * 1e3:.0f} ms" if lat else "-"
            mx = f"{max(lat) * 1e3:.0f} ms" if lat else "-"
            print(f"| {backend} | {mode} | {len(ts)} | {len(ok)}/{len(ts)} | "
                  f"{sum(t['named'] for t in ts)}/{len(ts)} | {med} | {mx} |", flush=True)
            for t in ts:
                print(f"  {backend} {mode}: victim {t['victim']} step {t['step']}: "
                      f"{t['survivors_raised']}/{t['survivors']} raised"
                      + (f" after {t['last_s'] * 1e3:.0f} ms" if t["last_s"] is not None else "")
                      + (" (cut at the timeout)" if t["timed_out"] else "") + f": {t['msg'][:120]}",
                      file=sys.stderr)
            rows.append({"backend": backend, "mode": mode, "trials": ts})
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))
    return 0


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], int(sys.argv[4]), int(sys.argv[5]), sys.argv[6])
    else:
        sys.exit(main())
