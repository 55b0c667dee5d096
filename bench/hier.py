#!/usr/bin/env python3
"""Hierarchical vs flat all-reduce: 2 simulated hosts x 2 ranks each.

Builds hosts as network namespaces (tests/hosts/hostnet.py: each with its
own address and /dev/shm) and runs ``cohort bench`` as a 4-rank job, two
ranks per host, alternately with the hierarchical all-reduce (the default:
shared memory within a host, TCP between hosts; client/backend/host/hier.c)
and with it off (COHORT_TCP_HIER=0: a flat TCP ring or recursive doubling
over all 4 ranks), in one interleaved run. Reports per size the median over
repetitions of rank 0's median time and bus bandwidth, and hier/flat.

    sudo .venv/bin/python bench/hier.py [--sizes 4K:64M] [--iters 20]
                                        [--reps 3] [--json PATH]
"""

from __future__ import annotations

import argparse
import json
import statistics
import sys

from hosts import bench, start_cohortd  # bench/hosts.py

from hostnet import Cluster, missing  # noqa: E402  (path set by hosts)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--sizes", default="4K:64M")
    ap.add_argument("--iters", type=int, default=20)
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--json", help="write the results here too")
    args = ap.parse_args()
    why = missing()
    if why:
        print(f"bench/hier.py: cannot run: {why}", file=sys.stderr)
        return 2
    modes = {"flat": {"COHORT_TCP_HIER": "0"}, "hier": {"COHORT_TCP_HIER": "1"}}
    got: dict[str, dict[int, list[tuple[float, float]]]] = {m: {} for m in modes}
    with Cluster(3, "bq") as cl:
        h0, h1, h2 = cl.hosts
        start_cohortd(h0)
        for rep in range(args.reps):
            order = list(modes) if rep % 2 == 0 else list(reversed(modes))
            for m in order:
                env = {"COHORT_LOG_LEVEL": "error", **modes[m]}
                rows = bench([h1, h2], h0, 2, args.sizes, args.iters, env,
                             f"{m}{rep}")  # fmt: skip
                for size, tb in rows.items():
                    got[m].setdefault(size, []).append(tb)
    print("# all-reduce f32 sum, 4 ranks = 2 hosts x 2 ranks (namespaces, "
          "veth); median over repetitions of rank 0's median time (us) "
          "and bus bandwidth (GB/s)")  # fmt: skip
    print(f"{'size':>10}  {'flat tcp':>24}  {'hierarchical':>24}  "
          f"{'hier/flat':>9}")
    out = []
    for size in sorted(got["flat"]):
        row = {"size": size}
        for m in modes:
            ts = got[m].get(size, [])
            row[m] = {"time_us": statistics.median(t for t, _ in ts),
                      "busbw": statistics.median(b for _, b in ts)}
        row["ratio"] = row["flat"]["time_us"] / row["hier"]["time_us"]
        out.append(row)
        print(f"{size:>10}  {row['flat']['time_us']:>11.1f} us "
              f"{row['flat']['busbw']:>6.2f} GB/s  "
              f"{row['hier']['time_us']:>11.1f} us "
              f"{row['hier']['busbw']:>6.2f} GB/s  {row['ratio']:>8.2f}x")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"reps": args.reps, "iters": args.iters,
                       "results": out}, f, indent=1)  # fmt: skip
    return 0


if __name__ == "__main__":
    sys.exit(main())
