"""PyTorch Lightning glue for cohort.

Importing this module registers the ``"cohort"`` torch.distributed backend
(see :mod:`cohort.torch`) and the Lightning strategy name ``"cohort_ddp"``::

    import cohort.lightning
    trainer = Trainer(strategy="cohort_ddp", accelerator="cpu", devices=2)

which is ``DDPStrategy(process_group_backend="cohort")`` plus two things:
an exception raised in one rank (in ``training_step``, a callback, a data
loader) is reported to the coordinator with its traceback as soon as
Lightning sees it (``on_exception``), so every other rank raises an error
naming that rank and quoting the traceback, and ``cohort run`` prints it as
the job's root cause; and under ``cohort run`` the ranks come from
:class:`CohortEnvironment`, so ``cohort run`` is the launcher and Lightning
does not spawn processes of its own.

``DDPStrategy(process_group_backend="cohort")`` works too, unchanged; its
ranks report an uncaught exception when it leaves the process.

:class:`CohortElasticStrategy` (``strategy="cohort_elastic"``) is the
elastic one: ``Trainer.fit`` goes on through the loss of ranks and takes
returning ranks back, on :mod:`cohort.elastic` (docs/elastic.md, "Lightning").
"""

from __future__ import annotations

import logging
import os
import signal
import threading
from typing import Any, Iterator, Optional

try:
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import ClusterEnvironment
    from pytorch_lightning.loops.optimization.automatic import Closure, ClosureResult
    from pytorch_lightning.plugins.precision import Precision
    from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry
    from pytorch_lightning.trainer.states import RunningStage
    from pytorch_lightning.utilities.exceptions import SIGTERMException
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("cohort.lightning needs pytorch-lightning (pip install pytorch-lightning)") from e

import torch
from torch.nn.parallel import DistributedDataParallel
from torch.utils.data import DataLoader, DistributedSampler, Sampler

from . import torch as _cohort_torch
from .torch import BACKEND_NAME, report_exception

__all__ = [
    "CohortEnvironment",
    "CohortDDPStrategy",
    "CohortElasticStrategy",
    "ElasticStepSampler",
    "ELASTIC_STRATEGY_NAME",
    "STRATEGY_NAME",
]

log = logging.getLogger("cohort.lightning")

#: The name to pass as ``Trainer(strategy=...)``.
STRATEGY_NAME = "cohort_ddp"
#: The elastic strategy's name (:class:`CohortElasticStrategy`).
ELASTIC_STRATEGY_NAME = "cohort_elastic"


def _int_env(*names: str, default: int) -> int:
    for n in names:
        v = os.environ.get(n)
        if v not in (None, ""):
            return int(v)
    return default


class CohortEnvironment(ClusterEnvironment):
    """The cluster environment of a job started by ``cohort run``.

    ``cohort run -n N [--nnodes M --node-rank K] -- python train.py``
    starts every rank itself and tells each its place through ``COHORT_*``
    variables; torch's store is cohortd's TCPStore listener
    (``MASTER_ADDR``/``MASTER_PORT``, every rank a client). Lightning then
    neither spawns processes nor hosts a store.
    """

    def __init__(self) -> None:
        super().__init__()
        self._global_rank = _int_env("COHORT_RANK", "RANK", default=0)
        self._world_size = _int_env("COHORT_WORLD_SIZE", "WORLD_SIZE", default=1)

    @property
    def creates_processes_externally(self) -> bool:
        return True

    @property
    def main_address(self) -> str:
        return os.environ.get("MASTER_ADDR", "127.0.0.1")

    @property
    def main_port(self) -> int:
        return _int_env("MASTER_PORT", default=29500)

    @staticmethod
    def detect() -> bool:
        """True in a process started by ``cohort run``."""
        return all(os.environ.get(v) for v in ("COHORT_COORDINATOR", "COHORT_RANK", "COHORT_WORLD_SIZE"))

    def world_size(self) -> int:
        return self._world_size

    def set_world_size(self, size: int) -> None:
        # The launcher decided; Lightning's count must agree (validate_settings).
        pass

    def global_rank(self) -> int:
        return self._global_rank

    def set_global_rank(self, rank: int) -> None:
        pass

    def local_rank(self) -> int:
        return _int_env("COHORT_LOCAL_RANK", "LOCAL_RANK", default=0)

    def node_rank(self) -> int:
        return _int_env("COHORT_NODE_RANK", "GROUP_RANK", default=0)

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        local = _int_env("COHORT_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", default=num_devices)
        if num_devices != local:
            raise ValueError(
                f"cohort run started {local} processes on this node but the Trainer has devices={num_devices}; "
                f"use the same number (cohort run -n {num_devices} ..., or devices={local})"
            )
        if num_devices * num_nodes != self._world_size:
            raise ValueError(
                f"cohort run's world size is {self._world_size} but the Trainer asks for "
                f"devices={num_devices} x num_nodes={num_nodes}"
            )


class CohortDDPStrategy(DDPStrategy):
    """``DDPStrategy`` on the cohort backend, reporting failures to the coordinator.

    Accepts every ``DDPStrategy`` argument; ``process_group_backend``
    defaults to ``"cohort"``. Under ``cohort run`` it takes its ranks from
    :class:`CohortEnvironment` unless another environment is given.
    """

    strategy_name = STRATEGY_NAME

    def __init__(self, *args: Any, cluster_environment: Optional[ClusterEnvironment] = None, **kwargs: Any) -> None:
        kwargs.setdefault("process_group_backend", BACKEND_NAME)
        if cluster_environment is None and CohortEnvironment.detect():
            cluster_environment = CohortEnvironment()
        super().__init__(*args, cluster_environment=cluster_environment, **kwargs)

    def on_exception(self, exception: BaseException) -> None:
        super().on_exception(exception)
        if isinstance(exception, (KeyboardInterrupt, _cohort_torch.CohortBackendError)):
            return  # an interrupt, or another rank's failure reaching us
        if "CohortBackendError:" in str(exception):
            return  # the same, raised by DDP's backward as a RuntimeError
        report_exception(exception)


# ---------------------------------------------------------------------------
# Elastic: Trainer.fit through the loss and the return of ranks
# ---------------------------------------------------------------------------


class ElasticStepSampler(Sampler[int]):
    """The training sampler of :class:`CohortElasticStrategy`: deals the epoch out one step at a time.

    Every step consumes the next ``batch_size x world`` positions of the
    epoch's order (the same on every rank): rank ``r`` takes positions
    ``p + r, p + r + W, ...``. The positions of a step are chosen when the
    data loader asks for the step's first index, so a step fetched after a
    change is dealt out to the new world; a committed step moves the
    epoch's place (:meth:`commit`), a discarded one is dealt out again
    (:meth:`discard`). The last step of an epoch gives every rank at least
    one sample (positions wrap within the step), so every rank runs the
    same number of steps. ``len()`` is the number of steps of the epoch as
    Lightning counts them (``offset``: the batches it counted before the
    current place, discarded ones included) times ``batch_size``.

    Its place is in :meth:`state_dict`, which a joining rank receives.
    """

    def __init__(self, n: int, batch_size: int, rank: int, world_size: int, shuffle: bool = True,
                 seed: int = 0) -> None:
        if batch_size <= 0:
            raise ValueError(f"batch_size {batch_size}: must be positive")
        self.n = int(n)
        self.batch_size = int(batch_size)
        self.rank, self.world_size = int(rank), int(world_size)
        self.shuffle, self.seed = shuffle, int(seed)
        self.epoch = 0
        self.position = 0  # positions of the epoch committed
        self.offset = 0  # Lightning's batches of the epoch before `position` (discarded ones too)
        self._issued = 0  # positions dealt out (committed or in flight)

    def order(self) -> list[int]:
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(self.n, generator=g).tolist()
        return list(range(self.n))

    def remaining_steps(self) -> int:
        per_step = self.batch_size * self.world_size
        return max(0, -(-(self.n - self.position) // per_step))

    def steps(self) -> int:
        """Lightning's batches in this epoch: those counted so far and those left at this world size."""
        return self.offset + self.remaining_steps()

    def __len__(self) -> int:
        return self.steps() * self.batch_size

    def __iter__(self) -> Iterator[int]:
        order = self.order()
        self._issued = self.position
        while self._issued < self.n:
            base, w, r, b = self._issued, self.world_size, self.rank, self.batch_size
            span = min(b * w, self.n - base)
            mine = -(-span // w)  # at least one each: every rank runs the step
            self._issued = base + span
            for j in range(min(b, mine)):
                yield order[base + (r + j * w) % span]

    def set_epoch(self, epoch: int) -> None:
        """A new epoch from its start; the current one (a joiner's restored epoch) keeps its place."""
        if int(epoch) != self.epoch:
            self.epoch = int(epoch)
            self.position = self.offset = self._issued = 0

    def commit(self, batches: int) -> None:
        """The step's positions are consumed; Lightning counted ``batches`` batches of the epoch so far."""
        self.position = self._issued
        self._rebase(batches)

    def discard(self, batches: int) -> None:
        """The step's positions go to the next step again."""
        self._issued = self.position
        self._rebase(batches)

    def _rebase(self, batches: int) -> None:
        self.offset = int(batches)

    def reshard(self, rank: int, world_size: int) -> None:
        if not 0 <= rank < world_size:
            raise ValueError(f"rank {rank} is not in a world of {world_size}")
        self.rank, self.world_size = int(rank), int(world_size)
        self._issued = self.position

    def state_dict(self) -> dict[str, int]:
        return {"epoch": self.epoch, "position": self.position, "offset": self.offset}

    def load_state_dict(self, state: dict[str, int]) -> None:
        self.epoch = int(state["epoch"])
        self.position = self._issued = int(state["position"])
        self.offset = int(state["offset"])


class _ElasticEnvironment(CohortEnvironment):
    """Ranks from the elastic membership (they change); the launcher's until it is open."""

    def __init__(self) -> None:
        super().__init__()
        self.manager: Any = None

    def world_size(self) -> int:
        return self.manager.world_size if self.manager is not None else self._world_size

    def global_rank(self) -> int:
        return self.manager.rank if self.manager is not None else self._global_rank

    def node_rank(self) -> int:
        return self.global_rank() // max(1, _int_env("COHORT_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", default=1))

    def validate_settings(self, num_devices: int, num_nodes: int) -> None:
        local = _int_env("COHORT_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE", default=num_devices)
        if num_devices != local:
            raise ValueError(f"the launcher started {local} processes on this node but the Trainer has "
                             f"devices={num_devices}; use the same number")


class _ElasticHooks(pl.Callback):
    """What the strategy needs from the loop's hooks (added by the strategy)."""

    def __init__(self, strategy: "CohortElasticStrategy") -> None:
        self._s = strategy

    def on_train_epoch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule") -> None:
        self._s._resize_epoch()

    def on_train_batch_start(self, trainer: "pl.Trainer", pl_module: "pl.LightningModule", batch: Any,
                             batch_idx: int) -> None:
        # Lightning skips on_train_epoch_start for the rest of a run that
        # restarted mid-epoch (a joiner's), so a joiner's next epoch would
        # keep the length of the epoch it was admitted in (the world was
        # different then): one more batch than the others, or one fewer.
        # O(1): the sampler's count of the epoch's steps.
        self._s._resize_epoch()


def _complete_progress(tree: Any, completed_lag: int = 0) -> None:
    """A progress record of a step in flight, as it will be once the step completed.

    ``completed_lag`` 1 leaves ``completed`` one behind: the record as
    Lightning saves it in ``on_train_batch_end`` (the batch processed, its
    completion counted after the hook)."""
    if isinstance(tree, dict):
        if "ready" in tree and "completed" in tree:
            for k in ("started", "processed", "completed"):
                if k in tree:
                    tree[k] = tree["ready"]
            tree["completed"] = tree["ready"] - completed_lag
        for v in tree.values():
            _complete_progress(v, completed_lag)


class CohortElasticStrategy(CohortDDPStrategy):
    """Elastic DDP for ``Trainer.fit``: a lost rank does not stop the others; a returning one is taken back.

    Launch every node with a range (``cohort run --nnodes MIN:MAX``,
    ``torchrun --rdzv-backend cohort --nnodes MIN:MAX``) and give each
    process ``Trainer(strategy=CohortElasticStrategy(), devices=<ranks per
    node>)``. Built on :class:`cohort.elastic.Manager`:

    - every optimizer step is a step of the elastic job: the closure
      (``training_step``, ``backward`` with DDP's all-reduce) runs guarded,
      the update is applied only when the step commits on every rank
      (``should_commit``); a step a change met is discarded on every rank
      alike and its samples dealt out again;
    - after a change (at the end of the step, before the next batch is
      fetched) DDP is rebuilt on the re-created default group, the
      training sampler (:class:`ElasticStepSampler`, replacing Lightning's
      ``DistributedSampler``) re-sharded and the epoch's length adjusted;
    - a process started while the job runs is admitted at the next step
      boundary and receives a Lightning checkpoint of a healthy rank (model,
      optimizers, schedulers, loops, callbacks, the sampler's place) from
      it over the data plane, which Lightning restores as if resuming
      (``ckpt_path``); until its first step its ``barrier``/``broadcast``/
      ``reduce`` are local (the others are training, not setting up);
    - ``SIGTERM`` (a preemption) makes the rank leave the job at its next
      step, cleanly: the others go on without it. Lightning's handler,
      which broadcasts from inside the signal handler, is replaced.

    Needs automatic optimization, ``accumulate_grad_batches=1`` and a
    precision plugin that steps the optimizer plainly (32-bit, bf16);
    collectives outside the training step (validation with
    ``sync_dist``, a checkpoint callback's barrier) are not guarded: a
    change there raises. ``trainer.global_step`` counts discarded steps
    too (the same on every rank). ``timeout``/``join_timeout``: seconds
    (None: ``COHORT_TIMEOUT_MS`` / ``COHORT_JOIN_TIMEOUT_MS``).
    """

    strategy_name = ELASTIC_STRATEGY_NAME

    def __init__(self, *args: Any, timeout: Optional[float] = None, join_timeout: Optional[float] = None,
                 **kwargs: Any) -> None:
        self._env = kwargs.pop("cluster_environment", None) or _ElasticEnvironment()
        super().__init__(*args, cluster_environment=self._env, **kwargs)
        self._op_timeout = timeout
        self._join_timeout = join_timeout
        self._manager: Any = None
        self._sampler: Optional[ElasticStepSampler] = None
        self._received: Optional[dict] = None
        self._joining = False
        self._leaving = False

    # -- the membership ---------------------------------------------------------

    @property
    def manager(self) -> Any:
        """The :class:`cohort.elastic.Manager` (None before setup)."""
        return self._manager

    def setup_distributed(self) -> None:
        from lightning_fabric.utilities.seed import reset_seed

        from . import elastic

        reset_seed()
        self._manager = elastic.Manager(self._state_dict, self._load_state_dict, on_change=self._on_change,
                                        timeout=self._op_timeout, join_timeout=self._join_timeout,
                                        weights_only=False)
        if isinstance(self._env, _ElasticEnvironment):
            self._env.manager = self._manager
        self.set_world_ranks()
        if self._received is not None:
            self._joining = True
            self._resume_from_received()

    def set_world_ranks(self) -> None:
        from lightning_fabric.utilities.rank_zero import rank_zero_only as fabric_rank_zero_only
        from pytorch_lightning.utilities.rank_zero import rank_zero_only

        rank_zero_only.rank = fabric_rank_zero_only.rank = self.global_rank  # type: ignore[attr-defined]

    @property
    def distributed_sampler_kwargs(self) -> dict[str, Any]:
        return {"num_replicas": self.world_size, "rank": self.global_rank}

    def _state_dict(self) -> dict:
        trainer = self.lightning_module.trainer
        ckpt = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        # The step in flight committed: a joiner starts after it. Its loops
        # are given the shape of a checkpoint saved in on_train_batch_end
        # (the optimizer stepped, the batch processed, its completion not yet
        # counted), the one Lightning's restore completes itself: it counts
        # the batch (and `_batches_that_stepped`) and, after the epoch's last
        # batch, ends the epoch, so a joiner admitted there starts the next
        # epoch (or ends the fit) with the others instead of re-entering the
        # finished epoch for one more batch (one more collective than theirs).
        loops = ckpt.get("loops", {}).get("fit_loop", {})
        _complete_progress(loops.get("epoch_loop.batch_progress"), completed_lag=1)
        _complete_progress(loops.get("epoch_loop.automatic_optimization.optim_progress"))
        return {"lightning": ckpt, "sampler": self._sampler.state_dict() if self._sampler is not None else None}

    def _load_state_dict(self, state: dict) -> None:
        # A joiner, in the Manager's constructor: nothing to load into yet.
        self._received = state

    def _resume_from_received(self) -> None:
        """Lightning restores the received checkpoint as it would ``ckpt_path``'s."""
        trainer = self.lightning_module.trainer
        conn = trainer._checkpoint_connector
        orig = conn._restore_modules_and_callbacks

        def restore(_path: Any = None, *args: Any, **kwargs: Any) -> None:
            del conn._restore_modules_and_callbacks  # once: a later fit restores what it is given
            orig(_RECEIVED, *args, **kwargs)

        conn._restore_modules_and_callbacks = restore
        trainer.num_sanity_val_steps = 0

    def load_checkpoint(self, checkpoint_path: Any, *args: Any, **kwargs: Any) -> dict[str, Any]:
        if checkpoint_path == _RECEIVED and self._received is not None:
            return self._received["lightning"]
        return super().load_checkpoint(checkpoint_path, *args, **kwargs)

    def _on_change(self, change: Any) -> None:
        from . import elastic

        self.set_world_ranks()
        if isinstance(self.model, DistributedDataParallel):
            elastic.release_ddp(self.model)
            self.model = self._setup_model(self.lightning_module)
        if self._sampler is not None:
            self._sampler.reshard(self.global_rank, self.world_size)
        self._resize_epoch()
        log.info("cohort elastic: generation %d, rank %d of %d (lost %d, joined %d)", change.generation,
                 change.rank, change.world_size, change.lost, change.joined)

    # -- the data -------------------------------------------------------------

    def process_dataloader(self, dataloader: object) -> object:
        from pytorch_lightning.utilities.data import _update_dataloader

        trainer = self.lightning_module.trainer
        sampler = getattr(dataloader, "sampler", None)
        if (trainer is None or not trainer.training or not isinstance(dataloader, DataLoader)
                or not isinstance(sampler, DistributedSampler)):
            return dataloader
        if dataloader.batch_size is None:
            raise ValueError("cohort_elastic needs a training DataLoader with batch_size (not a batch_sampler)")
        mine = ElasticStepSampler(len(sampler.dataset), dataloader.batch_size, self.global_rank, self.world_size,
                                  shuffle=sampler.shuffle, seed=sampler.seed)
        if self._received is not None and self._received.get("sampler") is not None:
            mine.load_state_dict(self._received["sampler"])
        self._sampler = mine
        return _update_dataloader(dataloader, mine, mode=RunningStage.TRAINING)

    def _resize_epoch(self) -> None:
        """Lightning's count of the epoch's batches, after the world size or the place changed."""
        if self._sampler is None:
            return
        trainer = self.lightning_module.trainer
        steps = self._sampler.steps()
        trainer.fit_loop.max_batches = steps
        fetcher = trainer.fit_loop._data_fetcher
        if fetcher is not None and fetcher.length is not None:
            fetcher.length = steps
        if isinstance(trainer.val_check_interval, float) and trainer.val_check_batch not in (None, float("inf")):
            trainer.val_check_batch = max(1, int(steps * trainer.val_check_interval))

    # -- the model -------------------------------------------------------------

    def setup(self, trainer: "pl.Trainer") -> None:
        if trainer.accumulate_grad_batches != 1:
            raise ValueError("cohort_elastic does not support accumulate_grad_batches > 1 yet")
        if type(self.precision_plugin).optimizer_step is not Precision.optimizer_step:
            raise ValueError(f"cohort_elastic steps the optimizer itself; {type(self.precision_plugin).__name__} "
                             f"wraps the step (use 32-true or bf16-true)")
        if not any(isinstance(c, _ElasticHooks) for c in trainer.callbacks):
            trainer.callbacks.append(_ElasticHooks(self))
        super().setup(trainer)

    def optimizer_step(self, optimizer: Any, closure: Any, model: Any = None, **kwargs: Any) -> Any:
        m = self._manager
        model = model or self.lightning_module
        self._joining = False
        self._received = None  # restored (model, loops, sampler): not kept
        if self._leaving:
            self._leave()
            raise SIGTERMException()
        m.start_step()
        ran = False
        out = None
        with m.guard():
            out = self.precision_plugin._wrap_closure(model, optimizer, closure)
            ran = True
        fetched = self.lightning_module.trainer.fit_loop.epoch_loop.batch_progress.current.ready

        def apply() -> None:
            optimizer.step(**kwargs)
            if self._sampler is not None:
                self._sampler.commit(fetched)

        if not m.should_commit(apply=apply):
            if self._sampler is not None:
                self._sampler.discard(fetched)
                self._resize_epoch()
        # A change is settled now, before the next batch is fetched: DDP
        # rebuilt, the sampler re-sharded (and a joiner given the state).
        m.start_step()
        if not ran:
            if isinstance(closure, Closure) and closure._result is None:
                closure._result = ClosureResult(closure_loss=None)
            return None
        return out

    # -- collectives of a joiner before its first step: local ------------------

    def barrier(self, *args: Any, **kwargs: Any) -> None:
        if self._joining:
            return
        super().barrier(*args, **kwargs)

    def broadcast(self, obj: Any, src: int = 0) -> Any:
        if self._joining:
            return obj
        return super().broadcast(obj, src)

    def reduce(self, tensor: Any, group: Any = None, reduce_op: Any = "mean") -> Any:
        if self._joining:
            return tensor
        return super().reduce(tensor, group=group, reduce_op=reduce_op)

    # -- leaving ---------------------------------------------------------------

    def on_train_start(self) -> None:
        super().on_train_start()
        if threading.current_thread() is threading.main_thread():
            signal.signal(signal.SIGTERM, self._on_sigterm)

    def _on_sigterm(self, signum: int, _frame: Any) -> None:
        # No collective here: leave at the next step (optimizer_step).
        log.warning("cohort elastic: SIGTERM: rank %d leaves the job at its next step", self.global_rank)
        self._leaving = True

    def _leave(self) -> None:
        """Out of the job as a lost member (a clean Leave would stop the others: proto/README.md 8)."""
        m = self._manager
        if m is None:
            return
        text = (f"rank {m.rank} was preempted (SIGTERM): it left the elastic job at a step boundary; the others "
                f"go on without it")
        if not m.client.report_failure(text, timeout=5.0):
            log.warning("cohort elastic: could not tell the coordinator that this rank leaves; it will see the "
                        "connection close")

    def on_exception(self, exception: BaseException) -> None:
        if isinstance(exception, SIGTERMException):
            return  # left on purpose (_leave): nothing more to report
        super().on_exception(exception)


_RECEIVED = "cohort-elastic://received-state"


def _register() -> None:
    if STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            STRATEGY_NAME,
            CohortDDPStrategy,
            description="DDP on the cohort backend, failures reported to the coordinator",
        )
    if ELASTIC_STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            ELASTIC_STRATEGY_NAME,
            CohortElasticStrategy,
            description="elastic DDP on cohort: survives the loss of ranks in process, admits returning ones",
        )


_register()
