"""Lightning's strategy collectives over cohort: barrier, broadcast,
reduce_boolean_decision, reduce, all_gather, and sync_dist logging.

Run with Lightning's own launcher (devices=2); each rank prints one JSON
line with what it observed.
"""

import json
import os
import sys

import torch
from torch import nn
from torch.utils.data import DataLoader, TensorDataset

import pytorch_lightning as pl

import cohort.lightning  # noqa: F401


class M(pl.LightningModule):
    def __init__(self):
        super().__init__()
        self.lin = nn.Linear(4, 1)

    def training_step(self, batch, i):
        loss = self.lin(batch[0]).pow(2).mean()
        # each rank logs its own rank; sync_dist averages through cohort
        self.log("r", float(self.global_rank), sync_dist=True, on_step=False, on_epoch=True)
        return loss

    def configure_optimizers(self):
        return torch.optim.SGD(self.parameters(), lr=0.01)


class Probe(pl.Callback):
    def on_train_end(self, trainer, pl_module):
        s, r = trainer.strategy, trainer.global_rank
        s.barrier("probe")
        got = s.broadcast({"from": r, "payload": list(range(5))}, src=1)
        all_ = s.reduce_boolean_decision(r == 0, all=True)
        any_ = s.reduce_boolean_decision(r == 0, all=False)
        total = s.reduce(torch.tensor(float(r + 1)), reduce_op="sum")
        gathered = s.all_gather(torch.tensor([r]))
        logged = trainer.callback_metrics["r"].item()
        out = {"rank": r, "backend": torch.distributed.get_backend(), "bcast": got, "all": all_, "any": any_,
               "sum": total.item(), "gathered": gathered.flatten().tolist(), "logged": logged,
               "strategy": type(s).__name__}
        os.write(1, (json.dumps(out) + "\n").encode())


torch.set_num_threads(1)
pl.seed_everything(1)
data = DataLoader(TensorDataset(torch.randn(64, 4)), batch_size=8)
trainer = pl.Trainer(accelerator="cpu", devices=2, strategy=sys.argv[1], max_epochs=1, logger=False,
                     enable_checkpointing=False, enable_progress_bar=False, enable_model_summary=False,
                     callbacks=[Probe()])
trainer.fit(M(), data)
