"""One rank of an elastic Lightning job (test_elastic_lightning.py).

    elastic_lightning.py [--epochs E] [--batch B] [--pace MS]

A small classifier on a synthetic, deterministic data set (elastic_ddp.py's)
trained by ``Trainer.fit`` with ``CohortElasticStrategy``. Prints JSON lines:

- ``{"event": "start", "rank", "world", "generation", "pid", "step", "epoch", "at_ms"}`` at the first
  training batch of this process (``step`` > 0: admitted into a running job, with the state);
- ``{"event": "change", "generation", "rank", "world", "prev_world", "lost", "joined", "received", "at_ms"}``;
- ``{"event": "commit", "step", "world", "epoch", "at_ms"}`` per training batch (rank 0 only);
- ``{"event": "done", "rank", "world", "pid", "generation", "steps", "epoch", "checksum", "equal",
  "accuracy", "sampler"}`` at the end.
"""

import argparse
import hashlib
import os
import sys
import time

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn

from cohort.lightning import CohortElasticStrategy
from elastic_common import data, emit, now_ms

p = argparse.ArgumentParser()
p.add_argument("--epochs", type=int, default=3)
p.add_argument("--batch", type=int, default=16, help="per rank")
p.add_argument("--samples", type=int, default=1536)
p.add_argument("--pace", type=float, default=0.0, help="ms per step at least")
p.add_argument("--hidden", type=int, default=64)
args = p.parse_args()

torch.set_num_threads(1)


train, test = data(args.samples, 1), data(512, 2)


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        torch.manual_seed(0)
        self.net = nn.Sequential(nn.Linear(20, args.hidden), nn.ReLU(), nn.Linear(args.hidden, 5))
        self.loss_fn = nn.CrossEntropyLoss()
        self.t = time.monotonic()

    def training_step(self, batch, batch_idx):
        if args.pace > 0:
            left = args.pace / 1000.0 - (time.monotonic() - self.t)
            if left > 0:
                time.sleep(left)
        self.t = time.monotonic()
        x, y = batch
        return self.loss_fn(self.net(x), y)

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.05, momentum=0.9)

    def train_dataloader(self):
        return torch.utils.data.DataLoader(train, batch_size=args.batch, shuffle=True)


class Report(pl.Callback):
    def __init__(self):
        self.started = False
        self.seen = 0

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        m = trainer.strategy.manager
        if not self.started:
            self.started = True
            self.seen = len(m.changes)
            emit(event="start", rank=m.rank, world=m.world_size, generation=m.generation, pid=os.getpid(),
                 step=trainer.global_step, epoch=trainer.current_epoch, at_ms=now_ms())

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        m = trainer.strategy.manager
        for c in m.changes[self.seen:]:
            emit(event="change", generation=c.generation, rank=c.rank, world=c.world_size, prev_rank=c.prev_rank,
                 prev_world=c.prev_world_size, lost=c.lost, joined=c.joined, received=c.received_state,
                 at_ms=now_ms())
        self.seen = len(m.changes)
        if m.rank == 0:
            emit(event="commit", step=trainer.global_step, world=m.world_size, epoch=trainer.current_epoch,
                 at_ms=now_ms())


model = Net()
strategy = CohortElasticStrategy()
trainer = pl.Trainer(strategy=strategy, accelerator="cpu", devices=1, max_epochs=args.epochs, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     limit_val_batches=0, callbacks=[Report()])
trainer.fit(model)

m = strategy.manager
h = hashlib.sha256()
for t in model.state_dict().values():
    h.update(t.detach().contiguous().numpy().tobytes())
mine = h.hexdigest()[:16]
sums = [None] * dist.get_world_size()
dist.all_gather_object(sums, mine)
with torch.no_grad():
    x, y = test.tensors
    acc = float((model.net(x).argmax(1) == y).float().mean())
emit(event="done", rank=dist.get_rank(), world=dist.get_world_size(), pid=os.getpid(), generation=m.generation,
     steps=trainer.global_step, epoch=trainer.current_epoch, checksum=mine, equal=len(set(sums)) == 1,
     accuracy=round(acc, 4), sampler=type(trainer.train_dataloader.sampler).__name__)
m.close()
sys.exit(0)
