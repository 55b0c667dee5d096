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
"""

from ._core import (
    WAIT_DEFAULT,
    WAIT_FOREVER,
    Client,
    CohortError,
    Coordinator,
    Group,
    Status,
    failed_rank_of,
    last_error,
)
from ._lib import find_binary, library_path

__version__ = "0.1.0"

__all__ = [
    "Client",
    "CohortError",
    "Coordinator",
    "Group",
    "Status",
    "WAIT_DEFAULT",
    "WAIT_FOREVER",
    "failed_rank_of",
    "find_binary",
    "last_error",
    "library_path",
    "__version__",
]
