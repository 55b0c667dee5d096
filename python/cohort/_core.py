"""Former home of the torch-free layer; kept so that old imports still work.

The pieces now live by role: :mod:`cohort.client` (Client, Group),
:mod:`cohort.bootstrap` (Coordinator, joining through torch's store),
:mod:`cohort.failures` (CohortError and the failure record),
:mod:`cohort._abi` (Status and the other mirrors of ``cohort.h``).
"""

from __future__ import annotations

from ._abi import WAIT_DEFAULT, WAIT_FOREVER, Status
from ._lib import lib
from .bootstrap import Coordinator, _read_line, local_host_for, new_token
from .client import Client, Group, duration_ms, last_error
from .failures import CohortError, as_status, failed_rank_of

_as_status = as_status
_local_host_for = local_host_for

__all__ = [
    "WAIT_DEFAULT",
    "WAIT_FOREVER",
    "Client",
    "CohortError",
    "Coordinator",
    "Group",
    "Status",
    "duration_ms",
    "failed_rank_of",
    "last_error",
    "lib",
    "new_token",
    "_read_line",
]
