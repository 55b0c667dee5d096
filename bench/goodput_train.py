"""One rank of the training program of bench/goodput, in every mode.

    goodput_train.py --mode elastic|checkpoint [--batch B] [--pace MS]
                     [--hidden H] [--samples N] [--checkpoint-every N]
                     [--checkpoint PATH] [--backend cohort|gloo]

The same model, data, per-rank batch, step and pace in both modes:

- ``elastic``: one rank of an elastic cohort job (``cohort run --nnodes
  MIN:MAX``), trained with DDP through ``cohort.elastic.run``: a lost rank
  leaves the survivors training in their processes, a restarted one is
  admitted at a step boundary and receives the state from a peer.
- ``checkpoint``: one rank of a fixed job under ``torchrun --max-restarts``
  (torchrun's env:// rendezvous, the given backend): plain DDP, rank 0
  writes a checkpoint (model, optimizer, step, data position) every N
  steps; a started process resumes from the checkpoint if there is one.
  After a failure torchrun restarts every process, which reload it.

``--pace MS`` makes each step take at least MS milliseconds (the harness's
stand-in for a GPU step's compute: a sleep, so that four ranks on a small
machine do not just measure the CPU contention).

Prints JSON lines on stdout (rank 0 of the current generation only):
``{"event": "commit", "step": S, "samples": N, "world": W, "t": UNIX}``
for every committed step (``samples``: the global batch of that step),
and ``{"event": "start", ...}`` once per process. With ``GOODPUT_PIDS``
set, each process writes an empty file named by its pid there (the
harness picks its victims from them).
"""

import argparse
import datetime
import json
import os
import sys
import time

import torch
import torch.distributed as dist
from torch import nn

p = argparse.ArgumentParser()
p.add_argument("--mode", choices=("elastic", "checkpoint"), required=True)
p.add_argument("--batch", type=int, default=32, help="samples per rank per step")
p.add_argument("--pace", type=float, default=100.0, help="ms per step at least")
p.add_argument("--hidden", type=int, default=256)
p.add_argument("--features", type=int, default=64)
p.add_argument("--samples", type=int, default=61440, help="training set size (one epoch)")
p.add_argument("--checkpoint-every", type=int, default=100)
p.add_argument("--checkpoint", default="", help="checkpoint file (mode checkpoint)")
p.add_argument("--backend", default="cohort", help="torch backend (mode checkpoint)")
args = p.parse_args()

torch.set_num_threads(1)
T_START = time.time()

if os.environ.get("GOODPUT_PIDS"):
    with open(os.path.join(os.environ["GOODPUT_PIDS"], str(os.getpid())), "w"):
        pass


def emit(**kw):
    print(json.dumps(kw), flush=True)


def dataset():
    g = torch.Generator().manual_seed(1)
    x = torch.randn(args.samples, args.features, generator=g)
    w = torch.randn(args.features, 10, generator=torch.Generator().manual_seed(7))
    y = (x @ w + 0.3 * torch.randn(args.samples, 10, generator=g)).argmax(1)
    return torch.utils.data.TensorDataset(x, y)


train = dataset()
torch.manual_seed(0)
model = nn.Sequential(nn.Linear(args.features, args.hidden), nn.ReLU(), nn.Linear(args.hidden, args.hidden),
                      nn.ReLU(), nn.Linear(args.hidden, 10))
opt = torch.optim.SGD(model.parameters(), lr=0.02, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()

t_step = [time.monotonic()]


def pace():
    if args.pace > 0:
        left = args.pace / 1000.0 - (time.monotonic() - t_step[0])
        if left > 0:
            time.sleep(left)
    t_step[0] = time.monotonic()


def step_fn(ddp, batch):
    x, y = batch
    return loss_fn(ddp(x), y)


def committed(step, n_local):
    # every rank trained n_local samples (the last batch of an epoch may be short on some: counted at rank 0's)
    if dist.get_rank() == 0:
        emit(event="commit", step=step, samples=n_local * dist.get_world_size(), world=dist.get_world_size(),
             t=time.time())
    pace()


def started(step):
    emit(event="start", rank=dist.get_rank(), world=dist.get_world_size(), pid=os.getpid(), step=step,
         startup_s=round(time.time() - T_START, 3), t=time.time())


def run_elastic():
    import cohort.elastic as elastic

    first = []
    last_n = [args.batch]

    def train_step(ddp, batch):
        if not first:
            first.append(1)
            started(-1)
        last_n[0] = len(batch[0])
        return step_fn(ddp, batch)

    elastic.run(train_step, model=model, optimizer=opt, dataset=train, batch_size=args.batch, epochs=1 << 30,
                seed=3, on_commit=lambda step, loss: committed(step, last_n[0]))


def run_checkpoint():
    from torch.nn.parallel import DistributedDataParallel as DDP
    from torch.utils.data import DistributedSampler

    if args.backend == "cohort":
        import cohort.torch  # noqa: F401 - registers the backend
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    # torchrun's store outlives a restart of the workers (the agent serves
    # it), and the keys of the previous attempt are still in it: without a
    # prefix per attempt the restarted ranks read the dead ranks' addresses
    # (gloo's full mesh, cohort's coordinator) and time out on them. What
    # torch itself used to do for env:// under torchelastic.
    base = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world,
                         is_master=rank == 0 and os.environ.get("TORCHELASTIC_USE_AGENT_STORE") != "True",
                         timeout=datetime.timedelta(seconds=300))
    if os.environ.get("GOODPUT_ATTEMPT") == "count":
        # One agent per node: only the failed node's agent counts a
        # restart (the others restart for the membership change), so
        # TORCHELASTIC_RESTART_COUNT differs between ranks. Every worker of
        # an attempt counts itself in once: the attempt is the count's
        # quotient (the schedule kills no worker before it started).
        attempt = str((base.add("/goodput/started", 1) - 1) // world)
    else:
        attempt = os.environ.get("TORCHELASTIC_RESTART_COUNT", "0")
    store = dist.PrefixStore(f"/goodput/attempt_{attempt}", base)
    dist.init_process_group(args.backend, store=store, rank=rank, world_size=world)
    step, epoch, position = 0, 0, 0
    if args.checkpoint and os.path.exists(args.checkpoint):
        s = torch.load(args.checkpoint, weights_only=True)
        model.load_state_dict(s["model"])
        opt.load_state_dict(s["opt"])
        step, epoch, position = int(s["step"]), int(s["epoch"]), int(s["position"])
    ddp = DDP(model)
    started(step)
    while True:
        sampler = DistributedSampler(train, num_replicas=world, rank=rank, shuffle=True, seed=3)
        sampler.set_epoch(epoch)
        order = list(sampler)
        per_rank_pos = position // world
        loader = torch.utils.data.DataLoader(torch.utils.data.Subset(train, order[per_rank_pos:]),
                                             batch_size=args.batch, shuffle=False)
        for batch in loader:
            loss = step_fn(ddp, batch)
            loss.backward()
            opt.step()
            opt.zero_grad(set_to_none=True)
            step += 1
            position += len(batch[0]) * world
            committed(step, len(batch[0]))
            if args.checkpoint and rank == 0 and step % args.checkpoint_every == 0:
                tmp = args.checkpoint + ".tmp"
                torch.save({"model": model.state_dict(), "opt": opt.state_dict(), "step": step, "epoch": epoch,
                            "position": position}, tmp)
                os.replace(tmp, args.checkpoint)
        epoch, position = epoch + 1, 0


if args.mode == "elastic":
    run_elastic()
else:
    run_checkpoint()
sys.exit(0)
