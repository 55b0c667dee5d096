#!/usr/bin/env python3
"""cohort's all-reduce as a fraction of this machine's physical limits (issue 24 item 5).

    .venv/bin/python bench/limits.py [BINDIR] [--reps 5] [--size 64M] [--json PATH]

Measures, interleaved over --reps rounds (medians):

- ``memcpy``: one thread copying a --size buffer into another (numpy's
  copyto, a plain memcpy), in GB/s of bytes copied. A two-rank
  shared-memory all-reduce moves each byte through memory about as often
  as one copy does (each rank reads its peer's half and writes its own),
  so its bus bandwidth is compared with this.
- ``tcp stream``: one loopback TCP connection between two processes
  carrying 1 GiB in --size writes (4 MiB socket buffers), in GB/s: what
  one stream of the wire gives, the limit of a TCP-only all-reduce whose
  every byte crosses one connection each way.
- ``cohort``: ``cohort bench -n 2 --op allreduce`` at --size, f32 sum,
  with shared memory (the default on one host) and TCP only
  (``COHORT_TCP_SHM=0``), bus bandwidth as nccl-tests defines it
  (2(n-1)/n x bytes / time).

Prints a table: each cohort figure and its fraction of the matching
limit. Figures on a 2-core VM: the two ranks share the cores with the
kernel's TCP work, so the TCP fraction is the whole path's, not the
wire's.
"""

from __future__ import annotations

import argparse
import json
import multiprocessing as mp
import os
import socket
import statistics
import subprocess
import sys
import time

import numpy as np

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def parse_size(s: str) -> int:
    mult = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    return int(float(s[:-1]) * mult[s[-1].upper()]) if s[-1].upper() in mult else int(s)


def memcpy_gbs(size: int) -> float:
    """Best of 10 copies of size bytes, GB/s of bytes copied."""
    a = np.ones(size, dtype=np.uint8)
    b = np.zeros(size, dtype=np.uint8)
    np.copyto(b, a)
    best = float("inf")
    for _ in range(10):
        t0 = time.perf_counter()
        np.copyto(b, a)
        best = min(best, time.perf_counter() - t0)
    return size / best / 1e9


def _sink(port: int, total: int, ready) -> None:
    with socket.create_server(("127.0.0.1", port)) as srv:
        srv.settimeout(60)
        ready.set()
        conn, _ = srv.accept()
        conn.settimeout(60)
        conn.setsockopt(socket.SOL_SOCKET, socket.SO_RCVBUF, 4 << 20)
        buf = bytearray(4 << 20)
        view = memoryview(buf)
        got = 0
        while got < total:
            n = conn.recv_into(view)
            if n == 0:
                break
            got += n
        conn.sendall(b"k")
        conn.close()


def tcp_stream_gbs(chunk: int, total: int = 1 << 30) -> float:
    """One loopback stream of total bytes in chunk-sized writes, GB/s."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    ready = mp.Event()
    p = mp.Process(target=_sink, args=(port, total, ready))
    p.start()
    ready.wait(10)
    data = memoryview(bytearray(chunk))
    with socket.create_connection(("127.0.0.1", port), timeout=60) as c:
        c.setsockopt(socket.SOL_SOCKET, socket.SO_SNDBUF, 4 << 20)
        t0 = time.perf_counter()
        sent = 0
        while sent < total:
            c.sendall(data)
            sent += chunk
        c.recv(1)
        t = time.perf_counter() - t0
    p.join(10)
    return sent / t / 1e9


def cohort_busbw(bindir: str, size: int, tcp_only: bool) -> float:
    env = dict(os.environ, COHORT_LOG_LEVEL="error")
    if tcp_only:
        env["COHORT_TCP_SHM"] = "0"
    out = subprocess.run([os.path.join(bindir, "cohort"), "bench", "-n", "2", "--sizes", f"{size}:{size}",
                          "--iters", "10", "--warmup", "2", "--json"], env=env, capture_output=True, text=True,
                         timeout=300, check=True).stdout
    rows = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    return rows[-1]["busbw"]


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("bindir", nargs="?", default=os.path.join(ROOT, "build", "bin"))
    ap.add_argument("--reps", type=int, default=5)
    ap.add_argument("--size", default="64M")
    ap.add_argument("--json")
    args = ap.parse_args()
    size = parse_size(args.size)
    got: dict[str, list[float]] = {k: [] for k in ("memcpy", "tcp", "shm_busbw", "tcp_busbw")}
    for rep in range(args.reps):
        got["memcpy"].append(memcpy_gbs(size))
        got["shm_busbw"].append(cohort_busbw(args.bindir, size, tcp_only=False))
        got["tcp"].append(tcp_stream_gbs(min(size, 4 << 20)))
        got["tcp_busbw"].append(cohort_busbw(args.bindir, size, tcp_only=True))
        print(f"round {rep + 1}/{args.reps}: " + ", ".join(f"{k} {v[-1]:.2f}" for k, v in got.items()),
              file=sys.stderr, flush=True)
    med = {k: statistics.median(v) for k, v in got.items()}
    print(f"\n(2 ranks, all-reduce f32 sum of {args.size}; medians of {args.reps} interleaved rounds; GB/s)\n")
    print("| path | cohort bus bandwidth | physical limit | limit measured | fraction |")
    print("| --- | ---: | ---: | --- | ---: |")
    print(f"| shared memory | {med['shm_busbw']:.2f} | {med['memcpy']:.2f} | one-thread memcpy | "
          f"{med['shm_busbw'] / med['memcpy']:.2f} |")
    print(f"| TCP only | {med['tcp_busbw']:.2f} | {med['tcp']:.2f} | one loopback TCP stream | "
          f"{med['tcp_busbw'] / med['tcp']:.2f} |")
    if args.json:
        with open(args.json, "w") as f:
            json.dump({"size": size, "medians": med, "all": got}, f, indent=1)
    return 0


if __name__ == "__main__":
    sys.exit(main())
