"""torch's own distributed test suite (``DistributedTest._DistTestBase``) against cohort.

``torch/testing/_internal/distributed/distributed_test.py`` ships in the torch
wheel: it is the suite torch runs against gloo, nccl and ucc
(``test/distributed/test_distributed_spawn.py``). Here it runs with
``BACKEND=cohort``: each case spawns ``WORLD_SIZE`` (2) processes that call
``init_process_group("cohort")`` through a ``file://`` store (rank 0 starts
a private cohortd, :mod:`cohort.bootstrap`) and run the case.

cohort declares itself a backend with the features the suite's skip
conditions ask about (``ddp``, ``subgroup``, ``plugin``) and counts as gloo
where a case asks for gloo, so the cases torch runs for gloo on CPU run for
cohort too; the ones written for another backend (MPI's all-to-all on CPU,
NCCL's CUDA cases), the multi-GPU ones and those guarded by
``BACKEND == "gloo"`` skip themselves as they do for any other backend.

By default (``make test``, CI) a set of cases that covers every collective,
point to point, groups, object collectives and DDP on CPU runs
(:data:`CI_CASES`, about a minute); ``COHORT_TORCH_SUITE=all`` runs the whole
suite (10-15 minutes on 2 cores; ``COHORT_TORCH_SUITE_WORLD=3`` for three
ranks; docs/pytorch.md has the counts).

Cases that cannot pass for any backend written in Python, because of how
torch 2.15 hands a Python backend's work back to its caller, are skipped
with the reason (:data:`TORCH_LIMITS`).
"""

from __future__ import annotations

import importlib
import importlib.util
import os
import pathlib
import sys
import tempfile
import types
import unittest
from typing import Any

# What distributed_test.py reads from the environment: BACKEND and WORLD_SIZE
# when it is imported (its skip decorators), WORLD_SIZE and TEMP_DIR while a
# case runs, in this process and in the ranks it spawns (which import this
# module again). Set for the import and for this class's cases only, so that
# the rest of the pytest session does not see them.
_SUITE_ENV = {
    "BACKEND": "cohort",
    "WORLD_SIZE": os.environ.get("COHORT_TORCH_SUITE_WORLD", "2"),
    "TEMP_DIR": os.environ.get("TEMP_DIR") or tempfile.mkdtemp(prefix="cohort-dist-suite-"),
    "COHORT_LOG_LEVEL": os.environ.get("COHORT_LOG_LEVEL", "error"),
}


def _set_env() -> dict:
    saved = {k: os.environ.get(k) for k in _SUITE_ENV}
    os.environ.update(_SUITE_ENV)
    return saved


def _restore_env(saved: dict) -> None:
    for k, v in saved.items():
        if v is None:
            os.environ.pop(k, None)
        else:
            os.environ[k] = v


_saved_env = _set_env()

from conftest import PYDIR  # noqa: E402

sys.path.insert(0, str(PYDIR))

import cohort.torch  # noqa: E402,F401  registers the backend
from torch.testing._internal.common_distributed import DistTestCases  # noqa: E402

for feature in ("ddp", "subgroup", "plugin"):
    DistTestCases.backend_feature[feature].add("cohort")


def _import_suite() -> Any:
    """distributed_test.py, with cohort counted where a case asks for gloo
    (``require_backend_is_available({"gloo", ...})``: object collectives,
    ``all_reduce_coalesced``, DDP's checks and control flow,
    ``monitored_barrier``): what those cases need is what cohort has on CPU;
    the few that check gloo's own words are skipped (:data:`GLOO_TEXTS`).
    Cases guarded by ``BACKEND == "gloo"`` (gloo's timeouts, sparse
    all-reduce) still skip. Imported unchanged if the text to patch is not
    found."""
    name = "torch.testing._internal.distributed.distributed_test"
    spec = importlib.util.find_spec(name)
    old = "    if BACKEND not in backends:\n"
    src = pathlib.Path(spec.origin).read_text() if spec is not None and spec.origin else ""
    if src.count(old) != 1:
        return importlib.import_module(name)
    src = src.replace(old, '    if BACKEND not in backends and not (BACKEND == "cohort" and "gloo" in backends):\n')
    mod = types.ModuleType(name)
    mod.__file__ = spec.origin
    sys.modules[name] = mod
    exec(compile(src, spec.origin, "exec"), mod.__dict__)
    return mod


_suite = _import_suite()
DistributedTest, TestDistBackend = _suite.DistributedTest, _suite.TestDistBackend

# torch's C++ holder of a Python backend's work (c10d's PyWork) forwards
# wait() and get_future() to Python, nothing else: is_completed() is its own
# flag, which only C++ backends set, and _source_rank() raises. The same
# for every Python backend; cohort's recv(src=None) goes around it
# (cohort/_anysource.py), irecv's _source_rank() cannot.
_WORK_FLAG = ("torch 2.15 keeps is_completed() of a Python backend's work in C++, where only C++ backends "
              "set it: it stays False after wait() (c10d's PyWork forwards wait and get_future only)")
_SOURCE = ("torch 2.15's holder of a Python backend's work does not forward _source_rank(), which irecv's "
           "case calls (recv(src=None) works: cohort/_anysource.py)")
TORCH_LIMITS = {
    "test_isend": _WORK_FLAG,
    "test_isend_autograd_profiler": _WORK_FLAG,
    "test_isend_torch_profiler": _WORK_FLAG,
    "test_irecv": _WORK_FLAG,
    "test_send_recv_any_source": _SOURCE,
    "test_send_recv_any_source_autograd_profiler": _SOURCE,
    "test_send_recv_any_source_torch_profiler": _SOURCE,
    "test_ddp_logging_data_cpu": ("DDP logs a backend registered with Backend.register_backend as 'custom' "
                                  "(torch's ProcessGroup names it by its backend type), the case expects 'cohort'"),
}

# Cases for gloo alone that check gloo's own words where cohort's design
# differs: gloo's monitored barrier is rank 0 collecting the others by send
# and receive, and its texts say so ("Rank 0 timed out in monitoredBarrier",
# "... received errors while waiting for send/recv from rank 0"); cohort's is
# the coordinator's, which tells every rank that reached it which ranks did
# not ("[Rank 2]: Rank 1 failed to pass monitoredBarrier in 2000 ms (...)").
_GLOO_TEXT = "checks gloo's rank-0-collects texts; cohort's monitored barrier is the coordinator's and names the missing ranks"
GLOO_TEXTS = {
    "test_monitored_barrier_gloo": _GLOO_TEXT,
    "test_monitored_barrier_gloo_rank_0_timeout": _GLOO_TEXT,
}

#: What CI runs: every collective (with and without a full-group argument),
#: groups, barriers, point to point, complex tensors, and DDP on CPU.
CI_CASES = (
    "test_all_reduce_sum", "test_all_reduce_sum_async", "test_all_reduce_sum_complex",
    "test_all_reduce_coalesced_sum", "test_broadcast", "test_all_gather_coalesced_complex", "test_gather",
    "test_scatter_checks", "test_scatter_object_list", "test_send_recv_with_tag",
    "test_all_gather_object_subgroup",  # also under TORCH_DISTRIBUTED_DEBUG=DETAIL
    "test_DistributedDataParallelCPU", "test_static_graph_api_cpu",
)


_restore_env(_saved_env)


class TestCohortWithSpawn(TestDistBackend, DistributedTest._DistTestBase):
    @classmethod
    def setUpClass(cls) -> None:
        cls._saved_env = _set_env()
        # TestDistBackend sets MASTER_ADDR (and the cases MASTER_PORT)
        cls._saved_env.update({k: os.environ.get(k) for k in ("MASTER_ADDR", "MASTER_PORT")})
        super().setUpClass()

    @classmethod
    def tearDownClass(cls) -> None:
        super().tearDownClass()
        _restore_env(cls._saved_env)

    def setUp(self) -> None:
        super().setUp()
        self._spawn_processes()


for _name, _why in {**TORCH_LIMITS, **GLOO_TEXTS}.items():
    setattr(TestCohortWithSpawn, _name, unittest.skip(_why)(getattr(TestCohortWithSpawn, _name)))

if os.environ.get("COHORT_TORCH_SUITE") != "all":
    # Not collected (unittest and pytest collect callables only); but
    # TestDistBackend.setUp reads test_ddp_has_finalized's __wrapped__.
    for _name in dir(TestCohortWithSpawn):
        if _name.startswith("test_") and _name not in CI_CASES and _name != "test_ddp_has_finalized":
            setattr(TestCohortWithSpawn, _name, None)
    TestCohortWithSpawn.test_ddp_has_finalized = unittest.skip("COHORT_TORCH_SUITE=all runs it")(
        TestCohortWithSpawn.test_ddp_has_finalized)


if __name__ == "__main__":
    from torch.testing._internal.common_utils import run_tests

    run_tests()
