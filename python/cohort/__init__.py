"""cohort: a communication runtime for data-parallel training.

The Python package gives PyTorch and Lightning users cohort's collectives,
coordinator and failure reports with a one-argument change:

- ``import cohort.torch`` registers the torch.distributed backend
  ``"cohort"``: ``init_process_group("cohort")``, or
  ``DDPStrategy(process_group_backend="cohort")`` in Lightning;
- ``cohort.lightning`` adds a ``ClusterEnvironment`` for jobs started by
  ``cohort run`` and the strategy name ``"cohort_ddp"``.

Without torch, :class:`Client` and :class:`Group` expose the coordinator's
control plane (barriers, object broadcast, decisions) directly.

The modules, by role:

- :mod:`cohort.client`: :class:`Client` and :class:`Group`;
- :mod:`cohort.bootstrap`: finding or starting the coordinator
  (:class:`Coordinator`) and joining a job through torch's store;
- :mod:`cohort.failures`: :class:`CohortError`, ``CohortBackendError`` and
  the :class:`FailureRecord` of a failed rank;
- :mod:`cohort.torch`: the torch.distributed backend (its process group in
  :mod:`cohort.process_group`, works and futures in :mod:`cohort.work`);
- :mod:`cohort.lightning`: Lightning glue;
- ``cohort._abi`` / ``cohort._lib``: the mirror of ``cohort.h`` and the
  ctypes bindings.
"""

from ._abi import WAIT_DEFAULT, WAIT_FOREVER, Dtype, RedOp, Status
from ._lib import find_binary, library_path
from .bootstrap import Coordinator
from .client import Client, Group, last_error
from .failures import CohortError, FailureRecord, failed_rank_of, failure_record

__version__ = "0.1.0"

__all__ = [
    "Client",
    "CohortError",
    "Coordinator",
    "Dtype",
    "FailureRecord",
    "Group",
    "RedOp",
    "Status",
    "WAIT_DEFAULT",
    "WAIT_FOREVER",
    "failed_rank_of",
    "failure_record",
    "find_binary",
    "last_error",
    "library_path",
    "__version__",
]

