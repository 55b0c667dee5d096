"""torch.multiprocessing.spawn starts the ranks; each joins the "cohort" group."""

import json
import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cohort.torch  # noqa: F401


def run(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("cohort", rank=rank, world_size=world)
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    objs = [None] * world
    dist.all_gather_object(objs, rank)
    ok = bool(torch.all(t == world * (world + 1) / 2)) and objs == list(range(world))
    # one write: ranks share the launcher's pipe
    os.write(1, (json.dumps({"rank": rank, "ok": ok, "backend": dist.get_backend()}) + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    world = int(sys.argv[1])
    mp.spawn(run, args=(world, sys.argv[2]), nprocs=world)
