#!/usr/bin/env python3
"""All-reduce bandwidth across simulated hosts next to the same host.

Builds hosts as network namespaces (tests/hosts/hostnet.py: each with its
own address and /dev/shm) and runs ``cohort bench`` as the ranks of one
job in three placements:

- same host, shared memory (the default between ranks of one host);
- same host, TCP over loopback (COHORT_TCP_SHM=0);
- two hosts, one rank each, TCP over a veth pair and a bridge.

A veth/bridge path is memory-to-memory inside one kernel: it shows what
cohort's TCP path costs when the wire is not the limit, not what a real
NIC gives. Needs root, iproute2 and nftables.

    sudo .venv/bin/python bench/hosts.py [--sizes 1M:64M] [--iters 20]
"""

from __future__ import annotations

import argparse
import os
import re
import sys
from pathlib import Path

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT / "tests" / "hosts"))

from hostnet import Cluster, missing  # noqa: E402

BIN = Path(os.environ.get("COHORT_BIN", ROOT / "build" / "bin")).resolve()
PORT = 29400


def bench(nodes, coord, nproc, sizes, iters, env, job):
    """Runs cohort bench through cohort run on each node; rank 0's table."""
    procs = []
    for i, h in enumerate(nodes):
        argv = [str(BIN / "cohort"), "run", "--nnodes", str(len(nodes)),
                "--node-rank", str(i), "-n", str(nproc), "--coordinator",
                f"tcp://{coord.addr}:{PORT}", "--job", job, "--",
                str(BIN / "cohort"), "bench", "--sizes", sizes, "--iters",
                str(iters), "--warmup", "5"]  # fmt: skip
        procs.append(h.spawn(argv, env=env))
    for p in procs:
        p.wait(timeout=600)
        if p.returncode != 0:
            raise SystemExit(f"{job} failed:\n{p.output()}")
    rows = {}
    for line in procs[0].output().splitlines():
        m = re.match(r"\s+(\d+)\s+\d+\s+\S+\s+\S+\s+([\d.]+)\s+[\d.]+\s+"
                     r"[\d.]+\s+[\d.]+\s+([\d.]+)\s+(\d+)", line)  # fmt: skip
        if m:
            rows[int(m.group(1))] = (float(m.group(2)), float(m.group(3)))
    return rows


def start_cohortd(host) -> None:
    """cohortd on host, listening on PORT; exits the benchmark if not."""
    d = host.spawn([str(BIN / "cohortd"), "--listen",
                    f"tcp://0.0.0.0:{PORT}"], name="cohortd")  # fmt: skip
    if not d.wait_for("listening on", 10):
        raise SystemExit(d.output())


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="64K:64M")
    ap.add_argument("--iters", type=int, default=20)
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"bench/hosts.py: cannot run: {why}", file=sys.stderr)
        return 2
    with Cluster(3, "bh") as cl:
        h0, h1, h2 = cl.hosts
        start_cohortd(h0)
        env = {"COHORT_LOG_LEVEL": "error"}
        runs = [
            ("same host, shm", bench([h1], h0, 2, args.sizes, args.iters,
                                     env, "shm")),
            ("same host, tcp", bench([h1], h0, 2, args.sizes, args.iters,
                                     {**env, "COHORT_TCP_SHM": "0"}, "lo")),
            ("two hosts, tcp", bench([h1, h2], h0, 1, args.sizes,
                                     args.iters, env, "x")),
        ]  # fmt: skip
    sizes = sorted(runs[0][1])
    print("# all-reduce f32 sum, 2 ranks; median time of the slowest rank "
          "(us) and bus bandwidth (GB/s)")  # fmt: skip
    print(f"{'size':>10}" + "".join(f"  {n:>26}" for n, _ in runs)
          + f"  {'cross/same-tcp':>14}")  # fmt: skip
    for s in sizes:
        cells = []
        for _, rows in runs:
            t, bw = rows.get(s, (float("nan"), float("nan")))
            cells.append(f"  {t:>12.1f} us {bw:>7.2f} GB/s")
        ratio = runs[2][1][s][1] / runs[1][1][s][1]
        print(f"{s:>10}" + "".join(cells) + f"  {ratio:>14.2f}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
