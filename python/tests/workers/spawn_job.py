"""torch.multiprocessing.spawn starts the ranks; each joins the "cohort" group."""

import os
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

import cohort.torch  # noqa: F401
from torchrun_job import exercise


def run(rank: int, world: int, port: str) -> None:
    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
    torch.set_num_threads(1)
    dist.init_process_group("cohort", rank=rank, world_size=world)
    exercise()


if __name__ == "__main__":
    world = int(sys.argv[1])
    mp.spawn(run, args=(world, sys.argv[2]), nprocs=world)
