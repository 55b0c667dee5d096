"""An unmodified gloo job whose store is cohortd's TCPStore listener.

    store_gloo.py explicit HOST PORT   init_process_group("gloo", store=TCPStore(..., is_master=False))
    store_gloo.py env                  env:// with TORCHELASTIC_USE_AGENT_STORE=True (MASTER_* set)
    store_gloo.py torchrun             started by torchrun (c10d rendezvous through the listener)
"""

import datetime
import json
import os
import sys

import torch
import torch.distributed as dist

mode = sys.argv[1]
torch.set_num_threads(1)
if mode == "explicit":
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    store = dist.TCPStore(sys.argv[2], int(sys.argv[3]), world_size=world, is_master=False,
                          timeout=datetime.timedelta(seconds=60))
    dist.init_process_group("gloo", store=store, rank=rank, world_size=world)
else:
    dist.init_process_group("gloo")
rank, world = dist.get_rank(), dist.get_world_size()
t = torch.full((100,), float(rank + 1))
dist.all_reduce(t)
ok = bool(torch.all(t == world * (world + 1) / 2))
os.write(1, (json.dumps({"rank": rank, "world": world, "ok": ok}) + "\n").encode())
dist.destroy_process_group()
