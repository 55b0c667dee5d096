"""One rank of an elastic DDP job (test_elastic.py, tests/hosts/test_elastic_torch.py, bench/goodput).

    elastic_ddp.py [--epochs E] [--batch B] [--pace MS] [--mode run|manager] [--hold-last-until FILE]

A small classifier on a synthetic, deterministic data set (the same on
every rank and in every run), trained with DDP through
``cohort.elastic.run`` (``--mode run``) or a hand-written loop on
``cohort.elastic.Manager`` (``--mode manager``). Prints JSON lines:

- ``{"event": "start", "rank", "world", "generation", "pid", "range", "step", "at_ms"}``
  once in the job (``step`` > 0: admitted into a running job, with the state);
- ``{"event": "change", "generation", "rank", "world", "prev_rank", "prev_world", "lost", "joined",
  "step", "at_ms"}`` at each change;
- ``{"event": "commit", "step", "at_ms"}`` per committed step (rank 0 only);
- ``{"event": "hold", "rank", "step", "at_ms"}`` (``--mode manager --hold-last-until FILE``) after the
  last step committed: the rank waits there, at most 300 s, until FILE exists, so that a test can have a
  process admitted exactly at the boundary after the job's last step;
- ``{"event": "done", "rank", "world", "pid", "generation", "steps", "checksum", "equal",
  "accuracy", "discarded"}`` at the end.
"""

import os
import sys

import torch
import torch.distributed as dist
from torch import nn

import cohort.elastic as elastic
from elastic_common import Pace, checked_end, data, emit, emit_change, hold, net, now_ms, parser

p = parser()
p.add_argument("--mode", choices=("run", "manager"), default="run")
p.add_argument("--hold-last-until", default="", help="(manager) wait after the last step until this file exists")
args = p.parse_args()

torch.set_num_threads(1)


train, test = data(args.samples, 1), data(512, 2)
model = net(args.hidden)
opt = torch.optim.SGD(model.parameters(), lr=0.05, momentum=0.9)
loss_fn = nn.CrossEntropyLoss()
pace = Pace(args.pace)


def on_commit(step, loss):
    if dist.get_rank() == 0:
        emit(event="commit", step=step, loss=round(float(loss), 5), world=dist.get_world_size(), at_ms=now_ms())
    pace()


started = []


def step_fn(ddp, batch):
    if not started:
        started.append(1)
        c = elastic.bootstrap.world_client()
        emit(event="start", rank=dist.get_rank(), world=dist.get_world_size(), generation=c.generation,
             pid=os.getpid(), range=list(c.elastic_range), at_ms=now_ms())
    x, y = batch
    return loss_fn(ddp(x), y)


def finish(res_rank, steps, discarded, generation):
    end = checked_end(model, model, test)
    emit(event="done", rank=dist.get_rank(), world=dist.get_world_size(), pid=os.getpid(), generation=generation,
         steps=steps, checksum=end["checksum"], equal=end["equal"], accuracy=end["accuracy"], discarded=discarded)


if args.mode == "run":
    res = elastic.run(step_fn, model=model, optimizer=opt, dataset=train, batch_size=args.batch,
                      epochs=args.epochs, seed=3, on_change=emit_change, on_commit=on_commit)
    finish(res.rank, res.steps, res.discarded, res.generation)
else:
    # The same training, written out on the Manager (no helper).
    from torch.nn.parallel import DistributedDataParallel as DDP

    sampler = elastic.ElasticDistributedSampler(train, num_replicas=1, rank=0, shuffle=True, seed=3)
    ep = {"epoch": 0}
    ddp = {}

    def rebuild(change=None):
        elastic.release_ddp(ddp.pop("m", None))
        ddp["m"] = DDP(model)
        sampler.reshard(dist.get_rank(), dist.get_world_size())
        ddp["it"] = None
        if change is not None:
            emit_change(change)

    m = elastic.Manager(
        state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict(), "sampler": sampler.state_dict(),
                            "epoch": ep["epoch"]},
        load_state_dict=lambda s: (model.load_state_dict(s["model"]), opt.load_state_dict(s["opt"]),
                                   sampler.load_state_dict(s["sampler"]), ep.update(epoch=s["epoch"])),
        on_change=rebuild)
    rebuild()
    discarded = 0
    while ep["epoch"] < args.epochs:
        m.start_step()
        if sampler.epoch != ep["epoch"]:
            sampler.set_epoch(ep["epoch"])
            ddp["it"] = None
        if ddp["it"] is None:
            ddp["it"] = iter(torch.utils.data.DataLoader(train, batch_size=args.batch, sampler=sampler))
        batch = next(ddp["it"], None)
        if batch is None:
            ep["epoch"] += 1
            ddp["it"] = None
            continue
        take = min(args.batch * m.world_size, sampler.remaining)
        with m.guard():
            loss = step_fn(ddp["m"], batch)
            loss.backward()
        if m.should_commit(apply=lambda: (opt.step(), sampler.advance(take))):
            on_commit(m.current_step, loss.detach())
            if args.hold_last_until and ep["epoch"] == args.epochs - 1 and sampler.remaining == 0:
                hold(args.hold_last_until, m.rank, m.current_step)
        else:
            discarded += 1
        opt.zero_grad(set_to_none=True)
    finish(m.rank, m.current_step, discarded, m.generation)
    m.close()
sys.exit(0)
