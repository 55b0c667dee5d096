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
"""

from __future__ import annotations

import os
from typing import Any, Optional

try:
    import pytorch_lightning as pl
    from pytorch_lightning.plugins.environments import ClusterEnvironment
    from pytorch_lightning.strategies import DDPStrategy, StrategyRegistry
except ImportError as e:  # pragma: no cover - depends on the installation
    raise ImportError("cohort.lightning needs pytorch-lightning (pip install pytorch-lightning)") from e

from . import torch as _cohort_torch
from .torch import BACKEND_NAME, report_exception

__all__ = ["CohortEnvironment", "CohortDDPStrategy", "STRATEGY_NAME"]

#: The name to pass as ``Trainer(strategy=...)``.
STRATEGY_NAME = "cohort_ddp"


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


def _register() -> None:
    if STRATEGY_NAME not in StrategyRegistry:
        StrategyRegistry.register(
            STRATEGY_NAME,
            CohortDDPStrategy,
            description="DDP on the cohort backend, failures reported to the coordinator",
        )


_register()
