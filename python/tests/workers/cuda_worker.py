"""One rank of the CUDA check (test_cuda.py): CUDA tensors through the cohort backend.

    cuda_worker.py

Each rank uses cuda:(local rank mod the device count). Collectives on CUDA
tensors go to the group's device-memory libcohort group (NCCL, or
tcp-staged where ranks share a GPU), object collectives and a CPU
all-reduce to its host-memory group, interleaved in one process group;
then DDP steps on the GPU. Prints one JSON line per check:
{"check", "ok", "why", "rank"}, then {"done": true}.
"""

import json
import os
import traceback

import torch
import torch.distributed as dist
from torch import nn

import cohort.torch  # noqa: F401

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", rank)) % torch.cuda.device_count())
torch.cuda.set_device(dev)
dist.init_process_group("cohort")


def check(name, fn):
    try:
        ok, why = fn()
    except Exception:
        ok, why = False, traceback.format_exc()[-3000:]
    print(json.dumps({"check": name, "ok": bool(ok), "why": why, "rank": rank}), flush=True)


def c_allreduce():
    x = torch.full((1000,), float(rank + 1), device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    want = float(world * (world + 1) // 2)
    return bool((x == want).all()), f"{x[:4].tolist()} want {want}"


def c_async_and_bf16():
    x = torch.full((333,), float(rank + 1), device=dev, dtype=torch.bfloat16)
    dist.all_reduce(x, async_op=True).wait()
    torch.cuda.synchronize()
    return bool((x.float() == float(world * (world + 1) // 2)).all()), str(x[:4].tolist())


def c_broadcast_gather_scatter():
    b = torch.arange(10, device=dev, dtype=torch.float32) + rank
    dist.broadcast(b, src=world - 1)
    g = torch.empty(world * 4, device=dev)
    dist.all_gather_into_tensor(g, torch.full((4,), float(rank), device=dev))
    rs = torch.empty(3, device=dev)
    dist.reduce_scatter_tensor(rs, torch.ones(3 * world, device=dev))
    torch.cuda.synchronize()
    ok = (torch.equal(b.cpu(), torch.arange(10.0) + world - 1)
          and torch.equal(g.cpu(), torch.arange(world).repeat_interleave(4).float())
          and torch.equal(rs.cpu(), torch.full((3,), float(world))))
    return ok, f"{b.tolist()} {g.tolist()} {rs.tolist()}"


def c_mixed_with_cpu():
    # The same group: objects and a CPU tensor (host-memory group) between
    # CUDA collectives (device-memory group).
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank})
    c = torch.ones(5)
    dist.all_reduce(c)
    x = torch.ones(7, device=dev)
    dist.all_reduce(x)
    torch.cuda.synchronize()
    ok = objs == [{"rank": r} for r in range(world)] and bool((c == world).all()) and bool((x == world).all())
    return ok, f"{objs} {c.tolist()} {x.tolist()}"


def c_ddp():
    torch.manual_seed(0)
    model = nn.parallel.DistributedDataParallel(nn.Sequential(nn.Linear(32, 64), nn.ReLU(), nn.Linear(64, 4)).to(dev),
                                                device_ids=[dev.index])
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    g = torch.Generator().manual_seed(rank)
    for _ in range(5):
        x, y = torch.randn(16, 32, generator=g).to(dev), torch.randint(0, 4, (16,), generator=g).to(dev)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    s = torch.tensor([sum(p.double().sum().item() for p in model.parameters())], device=dev, dtype=torch.float64)
    all_s = [torch.zeros_like(s) for _ in range(world)]
    dist.all_gather(all_s, s)
    torch.cuda.synchronize()
    vals = [t.item() for t in all_s]
    return len(set(vals)) == 1, f"checksums {vals}"


def c_backend_names():
    be = cohort.torch.backend_of()
    names = {"cpu": be.group.backend, "cuda": be._cuda_group.backend if be._cuda_group else ""}
    return names["cuda"] in ("nccl", "tcp-staged") and names["cpu"] in ("tcp", "service"), str(names)


for name, fn in [("allreduce", c_allreduce), ("async_bf16", c_async_and_bf16),
                 ("broadcast_gather_scatter", c_broadcast_gather_scatter), ("mixed_with_cpu", c_mixed_with_cpu),
                 ("ddp", c_ddp), ("backend_names", c_backend_names)]:
    check(name, fn)
dist.destroy_process_group()
print(json.dumps({"done": True, "rank": rank}), flush=True)
