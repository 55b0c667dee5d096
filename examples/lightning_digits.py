#!/usr/bin/env python3
"""Data-parallel training with PyTorch Lightning on cohort.

Trains a small MLP on scikit-learn's digits (1797 8x8 images, fetched by
``tools/fetch-digits.sh`` into ``build/data/digits.csv``) with Lightning's
DDP. The one change from a plain Lightning script is the strategy::

    Trainer(strategy="cohort_ddp", ...)                    # after `import cohort.lightning`
    Trainer(strategy=DDPStrategy(process_group_backend="cohort"), ...)

Run it any of these ways (``make demo-lightning`` does the first):

    python examples/lightning_digits.py --devices 2        # Lightning launches the ranks
    torchrun --nproc-per-node 2 examples/lightning_digits.py --devices 2
    cohort run -n 2 -- python examples/lightning_digits.py --devices 2

A fault drill: ``--fail-rank 1 --fail-step 30`` raises in rank 1's
``training_step`` at step 30 (``--fail-mode kill``: SIGKILLs it); every
other rank stops within milliseconds with an error naming rank 1 and
quoting its traceback (or saying the connection was lost).

At the end every rank prints its final test accuracy and a checksum of its
parameters: equal checksums show that the gradients were synchronised.
"""

from __future__ import annotations

import argparse
import os
import pathlib
import signal
import sys
import time

HERE = pathlib.Path(__file__).resolve().parent
sys.path.insert(0, str(HERE.parent / "python"))  # run from a checkout

import torch  # noqa: E402
import torch.nn.functional as F  # noqa: E402
from torch import nn  # noqa: E402
from torch.utils.data import DataLoader, TensorDataset  # noqa: E402

import pytorch_lightning as pl  # noqa: E402
from pytorch_lightning.strategies import DDPStrategy  # noqa: E402

import cohort.lightning  # noqa: E402,F401  (registers "cohort" and "cohort_ddp")


def load_digits(path: pathlib.Path) -> tuple[torch.Tensor, torch.Tensor]:
    rows = [list(map(float, line.split(","))) for line in path.read_text().splitlines() if line]
    data = torch.tensor(rows)
    return data[:, :64] / 16.0, data[:, 64].long()


class Digits(pl.LightningModule):
    def __init__(self, hidden: int, lr: float, fail_rank: int, fail_step: int, fail_mode: str) -> None:
        super().__init__()
        self.save_hyperparameters()
        self.net = nn.Sequential(nn.Linear(64, hidden), nn.ReLU(), nn.Linear(hidden, 10))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.net(x)

    def training_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> torch.Tensor:
        if self.global_rank == self.hparams.fail_rank and self.global_step == self.hparams.fail_step:
            if self.hparams.fail_mode == "kill":
                os.kill(os.getpid(), signal.SIGKILL)
            raise RuntimeError(f"fault drill: rank {self.global_rank} fails at step {self.global_step}")
        x, y = batch
        loss = F.cross_entropy(self(x), y)
        self.log("train_loss", loss, sync_dist=True, prog_bar=True)
        return loss

    def validation_step(self, batch: tuple[torch.Tensor, torch.Tensor], batch_idx: int) -> None:
        x, y = batch
        acc = (self(x).argmax(1) == y).float().mean()
        self.log("val_acc", acc, sync_dist=True, prog_bar=True)

    def configure_optimizers(self) -> torch.optim.Optimizer:
        return torch.optim.SGD(self.parameters(), lr=self.hparams.lr, momentum=0.9)


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--devices", type=int, default=2, help="ranks per node (default 2)")
    ap.add_argument("--num-nodes", type=int, default=1)
    ap.add_argument("--epochs", type=int, default=8)
    ap.add_argument("--batch-size", type=int, default=32, help="per rank")
    ap.add_argument("--hidden", type=int, default=128)
    ap.add_argument("--lr", type=float, default=0.05)
    ap.add_argument("--strategy", default="cohort_ddp",
                    help="cohort_ddp (default), ddp-cohort (DDPStrategy(process_group_backend='cohort')), "
                         "or ddp-gloo to compare")
    ap.add_argument("--data", default=str(HERE.parent / "build" / "data" / "digits.csv"))
    ap.add_argument("--fail-rank", type=int, default=-1, help="fault drill: this rank raises ...")
    ap.add_argument("--fail-step", type=int, default=-1, help="... at this global step")
    ap.add_argument("--fail-mode", choices=("raise", "kill"), default="raise",
                    help="raise an exception (default) or die by SIGKILL")
    args = ap.parse_args()

    torch.set_num_threads(1)  # one core per rank on small machines
    pl.seed_everything(7, workers=True)
    x, y = load_digits(pathlib.Path(args.data))
    n_test = 297
    train = TensorDataset(x[n_test:], y[n_test:])
    test = TensorDataset(x[:n_test], y[:n_test])

    if args.strategy == "ddp-cohort":
        strategy = DDPStrategy(process_group_backend="cohort")
    elif args.strategy == "ddp-gloo":
        strategy = DDPStrategy(process_group_backend="gloo")
    else:
        strategy = args.strategy
    trainer = pl.Trainer(
        accelerator="cpu",
        devices=args.devices,
        num_nodes=args.num_nodes,
        strategy=strategy,
        max_epochs=args.epochs,
        logger=False,
        enable_checkpointing=False,
        enable_progress_bar=False,
        enable_model_summary=False,
    )
    model = Digits(args.hidden, args.lr, args.fail_rank, args.fail_step, args.fail_mode)
    t0 = time.time()
    trainer.fit(
        model,
        DataLoader(train, batch_size=args.batch_size, shuffle=True),
        DataLoader(test, batch_size=256),
    )
    elapsed = time.time() - t0
    with torch.no_grad():
        acc = (model(test.tensors[0]).argmax(1) == test.tensors[1]).float().mean().item()
        checksum = sum(p.double().sum().item() for p in model.parameters())
    backend = torch.distributed.get_backend() if torch.distributed.is_initialized() else "none"
    print(
        f"rank {trainer.global_rank}/{trainer.world_size} backend={backend} "
        f"test_acc={acc:.4f} checksum={checksum:.9f} fit_s={elapsed:.2f}",
        flush=True,
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
