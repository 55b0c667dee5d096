"""Trains one model with DistributedDataParallel (or alone on the N-times batch).

    ddp_train.py BACKEND OUT.pt [--steps K] [--single WORLD]

With a backend, each rank takes its slice of every global batch; rank 0
saves the final parameters to OUT.pt. With --single WORLD no process group
is made and the model trains on the whole global batch in one process.
Every rank prints {"rank": r, "checksum": ...}.
"""

import argparse
import json
import os

import torch
import torch.distributed as dist
from torch import nn
from torch.nn.parallel import DistributedDataParallel as DDP

import cohort.torch  # noqa: F401

ap = argparse.ArgumentParser()
ap.add_argument("backend")
ap.add_argument("out")
ap.add_argument("--steps", type=int, default=12)
ap.add_argument("--single", type=int, default=0)
ap.add_argument("--bucket-cap-mb", type=float, default=0.05)  # several buckets
args = ap.parse_args()
torch.set_num_threads(1)

B = 8  # per rank
if args.single:
    rank, world = 0, args.single
else:
    dist.init_process_group(args.backend)
    rank, world = dist.get_rank(), dist.get_world_size()

torch.manual_seed(1234)
model = nn.Sequential(nn.Linear(32, 64), nn.Tanh(), nn.Linear(64, 64), nn.Tanh(), nn.Linear(64, 5))
net = model if args.single else DDP(model, bucket_cap_mb=args.bucket_cap_mb)
opt = torch.optim.SGD(net.parameters(), lr=0.1)
g = torch.Generator().manual_seed(99)
for step in range(args.steps):
    x = torch.randn(world * B, 32, generator=g)
    y = torch.randint(0, 5, (world * B,), generator=g)
    if not args.single:
        x, y = x[rank * B : (rank + 1) * B], y[rank * B : (rank + 1) * B]
    opt.zero_grad()
    nn.functional.cross_entropy(net(x), y).backward()
    opt.step()

params = [p.detach().clone() for p in model.parameters()]
if rank == 0:
    torch.save(params, args.out)
print(json.dumps({"rank": rank, "checksum": float(sum(p.double().sum() for p in params))}), flush=True)
if not args.single:
    dist.destroy_process_group()
