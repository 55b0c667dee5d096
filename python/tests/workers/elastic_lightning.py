"""One rank of an elastic Lightning job (test_elastic_lightning.py).

    elastic_lightning.py [--epochs E] [--batch B] [--pace MS] [--hold-last-until FILE [--hold-epoch E]]

A small classifier on a synthetic, deterministic data set (elastic_ddp.py's)
trained by ``Trainer.fit`` with ``CohortElasticStrategy``. Prints JSON lines:

- ``{"event": "start", "rank", "world", "generation", "pid", "step", "epoch", "at_ms"}`` at the first
  training batch of this process (``step`` > 0: admitted into a running job, with the state);
- ``{"event": "change", "generation", "rank", "world", "prev_world", "lost", "joined", "received", "at_ms"}``;
- ``{"event": "commit", "step", "world", "epoch", "at_ms"}`` per training batch (rank 0 only);
- ``{"event": "hold", "rank", "step", "at_ms"}`` when the last training step of epoch E (default: the last
  epoch) starts holding (``--hold-last-until FILE``: that step waits until FILE exists, at most 300 s, so
  that a test can have a process admitted exactly at an epoch's last step boundary);
- ``{"event": "done", "rank", "world", "pid", "generation", "steps", "epoch", "checksum", "equal",
  "accuracy", "sampler"}`` at the end.
"""

import os
import sys

import pytorch_lightning as pl
import torch
import torch.distributed as dist
from torch import nn

from cohort.lightning import CohortElasticStrategy
from elastic_common import Pace, checked_end, data, emit, emit_change, hold, net, now_ms, parser

p = parser()
p.add_argument("--hold-last-until", default="", help="an epoch's last step waits until this file exists")
p.add_argument("--hold-epoch", type=int, default=-1, help="the epoch of --hold-last-until (-1: the last)")
args = p.parse_args()

torch.set_num_threads(1)


train, test = data(args.samples, 1), data(512, 2)


class Net(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.net = net(args.hidden)
        self.loss_fn = nn.CrossEntropyLoss()
        self.pace = Pace(args.pace)

    def training_step(self, batch, batch_idx):
        self.pace()
        t = self.trainer
        hold_epoch = args.hold_epoch if args.hold_epoch >= 0 else t.max_epochs - 1
        if args.hold_last_until and t.is_last_batch and t.current_epoch == hold_epoch:
            hold(args.hold_last_until, t.strategy.manager.rank, t.global_step)
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
            emit_change(c)
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
end = checked_end(model, model.net, test)
emit(event="done", rank=dist.get_rank(), world=dist.get_world_size(), pid=os.getpid(), generation=m.generation,
     steps=trainer.global_step, epoch=trainer.current_epoch, checksum=end["checksum"], equal=end["equal"],
     accuracy=end["accuracy"], sampler=type(trainer.train_dataloader.sampler).__name__)
m.close()
sys.exit(0)
