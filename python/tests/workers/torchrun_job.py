"""A plain torch script for any launcher that sets torchrun's variables.

exercise() is also what spawn_job.py's ranks run once they have joined.
"""

import json
import os

import torch
import torch.distributed as dist

import cohort.torch  # noqa: F401


def exercise() -> None:
    """An all-reduce and an all-gather in the joined group; one JSON line says whether both were right."""
    rank, world = dist.get_rank(), dist.get_world_size()
    t = torch.full((1000,), float(rank + 1))
    dist.all_reduce(t)
    objs = [None] * world
    dist.all_gather_object(objs, rank)
    ok = bool(torch.all(t == world * (world + 1) / 2)) and objs == list(range(world))
    # one write: ranks share the launcher's pipe
    os.write(1, (json.dumps({"rank": rank, "ok": ok, "backend": dist.get_backend()}) + "\n").encode())
    dist.destroy_process_group()


if __name__ == "__main__":
    torch.set_num_threads(1)
    dist.init_process_group("cohort")
    if os.environ.get("FAIL_FIRST_ATTEMPT") and os.environ.get("TORCHELASTIC_RESTART_COUNT") == "0":
        # torchrun's first attempt dies after its rank 0 published its
        # cohortd in the agent's store: the next attempt must not use it.
        dist.barrier()
        if dist.get_rank() == 1:
            os._exit(1)
        dist.barrier()  # fails: rank 1 is gone
    marker = os.environ.get("FAIL_FIRST_AGENT")
    if marker and not os.path.exists(f"{marker}.rank{dist.get_rank()}"):
        # A torchrun per node: rank 1's worker dies, rank 0's idles until
        # its agent stops it for the new rendezvous round. Only rank 1's
        # agent counts a restart, so TORCHELASTIC_RESTART_COUNT differs
        # between the ranks of the next attempt.
        open(f"{marker}.rank{dist.get_rank()}", "w").close()
        if dist.get_rank() == 1:
            os._exit(1)
        import time

        time.sleep(120)
        os._exit(2)
    exercise()
