#!/usr/bin/env python3
"""cohort against gloo as a PyTorch user sees them: DDP step time and all-reduce from Python.

    .venv/bin/python bench/torch_compare.py [--ranks 2,4] [--reps 3] [--json out.json]
    sudo .venv/bin/python bench/torch_compare.py --hosts 2 [--reps 5]   # DDP and FSDP2 across 2 hosts

Runs, interleaved (cohort, gloo, cohort, gloo, ...) so that both see the
same machine state, one multi-process job per configuration:

- ``ddp``: DistributedDataParallel training steps (forward, backward with
  the bucketed all-reduces DDP overlaps with it, SGD step) on two models:
  ``large`` (an MLP with ~4.2 M parameters, 16.8 MB of gradients, batch 8
  per rank: communication dominates) and ``small`` (a 64-128-10 MLP, 9.6 k
  parameters: latency and per-call overhead dominate). Median step time.
- ``allreduce``: ``dist.all_reduce`` of float32 tensors from Python
  (synchronous), median time per call by size.
- ``fsdp2``: FSDP2 (``fully_shard`` on each layer and the model) training
  steps on the ``large`` model: parameters all-gathered before each
  layer's forward and backward, gradients reduce-scattered. Median step.
- ``overhead``: the same at world size 1, where no byte moves: what the
  Python binding and torch's dispatch cost per call.

``--device cuda`` (on a GPU machine) puts the tensors and models on
``cuda:(local rank mod devices)`` and compares cohort with torch's own
``nccl`` backend instead of gloo (each call and step followed by
``torch.cuda.synchronize()``): NCCL through cohort against NCCL through
torch's ProcessGroupNCCL. With one GPU use ``--ranks 1`` (NCCL refuses two
ranks on one device).

``--hosts N`` runs the ranks on N simulated hosts instead, one rank each
(network namespaces on a bridge, tests/hosts/hostnet.py: each with its own
address and /dev/shm, so cohort's ranks meet over TCP, as gloo's do); it
needs root, iproute2 and nftables, and measures ``ddp`` and ``fsdp2``. A
veth pair and a bridge are memory-to-memory in one kernel: this measures
what each backend's TCP path costs when the wire is not the limit.

Every rank uses one intra-op thread (``torch.set_num_threads(1)``), as
torchrun and Lightning's launcher set ``OMP_NUM_THREADS=1`` by default;
with 2 ranks on this 2-core machine more threads only oversubscribe.
Prints a table of medians and cohort/gloo ratios (>1 = cohort faster).
"""

from __future__ import annotations

import argparse
import json
import os
import pathlib
import socket
import statistics
import subprocess
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
REPO = HERE.parent

MODELS = {
    # name: (layer widths, batch per rank)
    "large": ([1024, 2048, 1024, 10], 8),
    "small": ([64, 128, 10], 32),
}
SIZES = [4 << 10, 64 << 10, 1 << 20, 16 << 20]


# ---------------------------------------------------------------------------
# One rank (run with torchrun's variables by the driver below)
# ---------------------------------------------------------------------------


def worker(kind: str, backend: str, arg: str, iters: int) -> None:
    import torch
    import torch.distributed as dist
    from torch import nn

    sys.path.insert(0, str(REPO / "python"))
    import cohort.torch  # noqa: F401

    torch.set_num_threads(1)
    dev = torch.device("cpu")
    if os.environ.get("TC_DEVICE") == "cuda":
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
        torch.cuda.set_device(dev)

    def sync() -> None:
        if dev.type == "cuda":
            torch.cuda.synchronize()

    dist.init_process_group(backend)
    rank = dist.get_rank()
    out: dict = {"kind": kind, "backend": backend, "arg": arg, "world": dist.get_world_size()}
    if kind in ("ddp", "fsdp2"):
        widths, batch = MODELS[arg]
        layers = []
        for a, b in zip(widths, widths[1:]):
            layers += [nn.Linear(a, b), nn.ReLU()]
        torch.manual_seed(0)
        net = nn.Sequential(*layers[:-1]).to(dev)
        if kind == "ddp":
            model = nn.parallel.DistributedDataParallel(net)
        else:
            from torch.distributed.fsdp import fully_shard

            for layer in net:
                if isinstance(layer, nn.Linear):
                    fully_shard(layer)
            model = fully_shard(net)
        opt = torch.optim.SGD(model.parameters(), lr=0.01)
        x = torch.randn(batch, widths[0], device=dev)
        y = torch.randint(0, widths[-1], (batch,), device=dev)
        times = []
        for i in range(iters + 5):
            t0 = time.perf_counter()
            opt.zero_grad(set_to_none=False)
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
            sync()
            if i >= 5:
                times.append(time.perf_counter() - t0)
        out["params"] = sum(p.numel() for p in net.parameters()) if kind == "ddp" else sum(
            p.full_tensor().numel() for p in net.parameters())
        out["median_s"] = statistics.median(times)
    else:
        n = int(arg) // 4
        t = torch.ones(n, device=dev)
        k = max(5, min(iters, int(2e8 // max(int(arg), 4096))))
        for _ in range(3):
            dist.all_reduce(t)
        sync()
        dist.barrier()
        times = []
        for _ in range(k):
            t0 = time.perf_counter()
            dist.all_reduce(t)
            sync()
            times.append(time.perf_counter() - t0)
        out["median_s"] = statistics.median(times)
    if rank == 0:
        print("RESULT " + json.dumps(out), flush=True)
    dist.destroy_process_group()


# ---------------------------------------------------------------------------
# The driver
# ---------------------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_job(kind: str, backend: str, arg: str, world: int, iters: int, cluster=None) -> dict:
    """One job; tried up to 3 times (gloo's teardown occasionally aborts a
    rank with std::terminate after its result was printed: that result is
    kept, with a note on stderr). On ``cluster``'s hosts if given."""
    for attempt in range(3):
        if cluster is not None:
            res, failed = _run_job_on_hosts(cluster, kind, backend, arg, iters)
        else:
            res, failed = _run_job_once(kind, backend, arg, world, iters)
        if res is not None:
            if failed:
                print(f"note: {kind} {backend} {arg} world {world}: a rank failed after the measurement",
                      file=sys.stderr)
            return res
        print(f"note: {kind} {backend} {arg} world {world}: attempt {attempt + 1} failed", file=sys.stderr)
    raise SystemExit(f"{kind} {backend} {arg} world {world}: no result in 3 attempts")


def _run_job_once(kind: str, backend: str, arg: str, world: int, iters: int) -> tuple:
    return run_local_ranks([__file__, "--worker", kind, backend, arg, str(iters)], world)


def run_local_ranks(argv: list, world: int) -> tuple:
    """``world`` processes of ``python argv`` on this host with torchrun's
    variables; (rank 0's ``RESULT`` JSON or None, whether a rank failed)."""
    port = free_port()
    procs = []
    for r in range(world):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK=str(r),
                   MASTER_ADDR="127.0.0.1", MASTER_PORT=str(port), OMP_NUM_THREADS="1")
        procs.append(subprocess.Popen([sys.executable, *argv], env=env, stdout=subprocess.PIPE,
                                      stderr=subprocess.STDOUT, text=True))
    outs = []
    for p in procs:
        try:
            out, _ = p.communicate(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            out, _ = p.communicate()
        outs.append((out, p.returncode))
    return _ranks_result(outs)


def _ranks_result(outs: list) -> tuple:
    """(the last ``RESULT`` JSON of the ranks' (output, exit status) pairs or
    None, whether a rank failed); a failed rank's output tail on stderr."""
    res, failed = None, False
    for out, rc in outs:
        for line in out.splitlines():
            if line.startswith("RESULT "):
                res = json.loads(line[7:])
        if rc != 0:
            failed = True
            sys.stderr.write(out[-1500:])
    return res, failed


def _run_job_on_hosts(cluster, kind: str, backend: str, arg: str, iters: int) -> tuple:
    """One rank on each host of ``cluster``; rank 0's host serves the store
    (and, for cohort, its private coordinator)."""
    hosts = cluster.hosts
    port = 29500 + int.from_bytes(os.urandom(2), "little") % 2000
    procs = []
    for r, h in enumerate(hosts):
        env = {"RANK": str(r), "WORLD_SIZE": str(len(hosts)), "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1",
               "MASTER_ADDR": hosts[0].addr, "MASTER_PORT": str(port), "OMP_NUM_THREADS": "1",
               "PYTHONPATH": str(REPO / "python"), "COHORT_LOG_LEVEL": "error",
               "COHORT_COHORTD": str(REPO / "build" / "bin" / "cohortd"), "GLOO_SOCKET_IFNAME": "eth0"}
        # the hosts' environment is a minimal one: carry the caller's COHORT_* tunables over
        env.update({k: v for k, v in os.environ.items() if k.startswith("COHORT_") and k not in env})
        procs.append(h.spawn([sys.executable, __file__, "--worker", kind, backend, arg, str(iters)], env=env,
                             name=f"{kind}-{backend}-r{r}"))
    outs = []
    for p in procs:
        try:
            p.wait(timeout=600)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
        outs.append((p.output(), p.returncode))
    return _ranks_result(outs)


def fmt_t(s: float) -> str:
    return f"{s * 1e3:.2f} ms" if s >= 1e-3 else f"{s * 1e6:.1f} us"


def fmt_size(n: int) -> str:
    return f"{n >> 20}M" if n >= 1 << 20 else f"{n >> 10}K"


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--ranks", default="2,4")
    ap.add_argument("--reps", type=int, default=3)
    ap.add_argument("--iters", type=int, default=40, help="timed steps / calls per job (all-reduce: up to 200)")
    ap.add_argument("--only", choices=("ddp", "fsdp2", "allreduce", "overhead"), action="append")
    ap.add_argument("--hosts", type=int, default=0, help="run on this many simulated hosts, one rank each")
    ap.add_argument("--sizes", help="all-reduce sizes in bytes, comma-separated (default 4K,64K,1M,16M; "
                    "with --device cuda also 64M,256M)")
    ap.add_argument("--device", choices=("cpu", "cuda"), default="cpu",
                    help="cuda: tensors on the GPU, compared with torch's nccl backend")
    ap.add_argument("--json", help="write every measurement here")
    args = ap.parse_args()
    if args.device == "cuda":
        os.environ["TC_DEVICE"] = "cuda"
        SIZES.extend([64 << 20, 256 << 20])
    if args.sizes:
        SIZES[:] = [int(x) for x in args.sizes.split(",")]
    kinds = args.only or (["ddp", "fsdp2"] if args.hosts else ["ddp", "allreduce", "overhead"])
    worlds = [args.hosts] if args.hosts else [int(w) for w in args.ranks.split(",")]
    configs = []
    for w in worlds:
        if "ddp" in kinds:
            configs += [("ddp", m, w) for m in MODELS]
        if "fsdp2" in kinds:
            configs += [("fsdp2", "large", w)]
        if "allreduce" in kinds:
            configs += [("allreduce", str(s), w) for s in SIZES]
    if "overhead" in kinds and not args.hosts:
        configs += [("overhead", str(4), 1)]
    cluster = None
    if args.hosts:
        sys.path.insert(0, str(REPO / "tests" / "hosts"))
        from hostnet import Cluster, missing

        why = missing()
        if why:
            print(f"bench/torch_compare.py --hosts: cannot run: {why}", file=sys.stderr)
            return 2
        cluster = Cluster(args.hosts, "tc").__enter__()
    try:
        results = _measure(configs, args, cluster)
    finally:
        if cluster is not None:
            cluster.close()
    _table(results, args, "hosts" if cluster is not None else "one host")
    return 0


def _peer(args: argparse.Namespace) -> str:
    """The backend cohort is compared with: gloo on the CPU, nccl on GPUs."""
    return "nccl" if args.device == "cuda" else "gloo"


def _measure(configs: list, args: argparse.Namespace, cluster) -> dict:
    results: dict = {}
    for rep in range(args.reps):
        for kind, arg, w in configs:
            for backend in ("cohort", _peer(args)):
                it = args.iters if kind in ("ddp", "fsdp2") else 200
                r = run_job("allreduce" if kind == "overhead" else kind, backend, arg, w, it, cluster)
                results.setdefault((kind, arg, w), {}).setdefault(backend, []).append(r["median_s"])
                print(f"rep {rep + 1}/{args.reps} {kind:9} {arg:>8} n={w} {backend:6} {fmt_t(r['median_s'])}",
                      file=sys.stderr, flush=True)
    return results


def _table(results: dict, args: argparse.Namespace, where: str) -> None:
    rows = []
    peer = _peer(args)
    print(f"\n({where}, {args.device}; medians of {args.reps} interleaved repetitions)")
    print(f"\n| what | n | cohort | {peer} | cohort speed-up |")
    print("|---|---|---|---|---|")
    for (kind, arg, w), by in results.items():
        c, g = statistics.median(by["cohort"]), statistics.median(by[peer])
        if kind == "ddp":
            label = f"DDP step, {arg} model"
        elif kind == "fsdp2":
            label = f"FSDP2 step, {arg} model"
        elif kind == "allreduce":
            label = f"all_reduce {fmt_size(int(arg))} f32"
        else:
            label = "all_reduce 4 B, world 1 (overhead)"
        print(f"| {label} | {w} | {fmt_t(c)} | {fmt_t(g)} | {g / c:.2f}x |")
        rows.append({"kind": kind, "arg": arg, "world": w, "cohort_s": c, f"{peer}_s": g, "speedup": g / c,
                     "cohort_all": by["cohort"], f"{peer}_all": by[peer]})
    if args.json:
        pathlib.Path(args.json).write_text(json.dumps(rows, indent=1))


if __name__ == "__main__":
    if len(sys.argv) > 1 and sys.argv[1] == "--worker":
        worker(sys.argv[2], sys.argv[3], sys.argv[4], int(sys.argv[5]))
    else:
        sys.exit(main())
