"""The package's own pieces, each in a fresh Python process against a real coordinator.

- cohort.failures: the failure record parsed from the coordinator's texts
  (every form it writes), the missing ranks of a barrier timeout, errors
  that pickle;
- timeouts: a short operation timeout fits the failure detector to it; an
  explicit COHORT_DEAD_AFTER_MS that cannot fit is an error saying how to
  set both, at once;
- futures: a callback that waits on a further collective (what PowerSGD
  does) completes, on a real one-rank cohort group;
- every public name of the package is importable where it was.
"""

from __future__ import annotations

import subprocess
import sys

from conftest import base_env, describe, run_ranks


def run_py(code: str, env: dict | None = None, timeout: float = 120) -> subprocess.CompletedProcess:
    return subprocess.run([sys.executable, "-c", code], env=base_env(**(env or {})), capture_output=True, text=True,
                          timeout=timeout)


def test_failure_record_of_every_form(built):
    code = r'''
import pickle
from cohort.failures import failure_record, missing_ranks_of, CohortError
from cohort import Status

r = failure_record("rank 1 (node7:41213) failed during allreduce (#812): RuntimeError: a: b (0.4 s ago)\nTraceback (innermost frames):\n  File \"x.py\"")
assert (r.kind, r.rank, r.host, r.pid, r.operation, r.seq, r.age_s) == ("reported", 1, "node7", 41213, "allreduce", 812, 0.4), r
assert r.text == "RuntimeError: a: b" and r.trace.startswith("Traceback"), r

r = failure_record("rank 0 (vm:11453) failed (its last heartbeat, 0.2 s before: in barrier #3): connection lost (1.5 s ago)")
assert (r.kind, r.rank, r.operation, r.seq, r.age_s, r.text) == ("connection", 0, "barrier", 3, 1.5, "connection lost"), r

r = failure_record("rank 2 (h:7) failed after broadcast (#5): missed 5 heartbeats, last seen 6.0 s ago (0.0 s ago)")
assert (r.kind, r.rank, r.operation, r.seq) == ("silent", 2, "broadcast", 5), r

r = failure_record("rank 3 (h:9) left job 'j'; allreduce cannot complete (0.1 s ago)")
assert (r.kind, r.rank, r.host, r.pid) == ("left", 3, "h", 9), r

r = failure_record("allreduce #4: peer rank 5 closed its connection")
assert (r.kind, r.rank) == ("unknown", 5), r
assert failure_record("") is None and failure_record("no rank here") is None

assert missing_ranks_of("barrier 'x' (#1) timed out after 1.0 s; ranks 0, 1 never arrived (rank 0 last seen 0.0 s ago)") == [0, 1]
assert missing_ranks_of("barrier (#4) on group 'g' timed out; ranks never arrived: 2, 3") == [2, 3]
assert missing_ranks_of("barrier timed out after 1.0 s; rank 4 never arrived") == [4]
assert missing_ranks_of("barrier 'y' (#2) timed out after 3.0 s; rank 0 arrived but timed out and left before the others came") == [0]
assert missing_ranks_of("barrier timed out after 1.0 s; rank 2 never arrived (rank 2 in allreduce #3); rank 0 arrived but timed out first") == [2]
assert missing_ranks_of("timed out") == []

e = CohortError(Status.EPEERLOST, "rank 1 (h:2) failed during allreduce (#3): boom (0.1 s ago)", "allreduce")
assert e.failed_rank == 1 and e.failure.operation == "allreduce", e.failure
assert str(e) == "cohort allreduce: COHORT_EPEERLOST: rank 1 (h:2) failed during allreduce (#3): boom (0.1 s ago)", str(e)
e2 = pickle.loads(pickle.dumps(e))
assert type(e2) is CohortError and e2.failure == e.failure and str(e2) == str(e)

import cohort.torch as ct, torch.distributed as dist
b = ct.CohortBackendError(Status.ETIMEDOUT, "barrier timed out after 1.0 s; rank 1 never arrived", "barrier")
assert isinstance(b, dist.DistBackendError) and isinstance(b, CohortError) and b.missing_ranks == [1]
b2 = pickle.loads(pickle.dumps(b))
assert type(b2) is ct.CohortBackendError and str(b2) == str(b)
assert repr(type(b)) == "<class 'cohort.torch.CohortBackendError'>"
print("ok")
'''
    r = run_py(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_short_timeout_fits_the_failure_detector(built):
    code = r'''
import cohort
co = cohort.Coordinator(idle_exit=2)
with cohort.Client(co.url, job="j", token="t", rank=0, world_size=1, op_timeout=1.0) as c:
    assert (c.op_timeout_ms, c.dead_after_ms, c.heartbeat_ms) == (1000, 500, 125), (c.op_timeout_ms, c.dead_after_ms, c.heartbeat_ms)
    c.world.barrier("b", timeout=5)
with cohort.Client(co.url, job="k", token="t", rank=0, world_size=1, op_timeout=60) as c:
    assert (c.dead_after_ms, c.heartbeat_ms) == (5000, 1000), (c.dead_after_ms, c.heartbeat_ms)
co.stop()
print("ok")
'''
    r = run_py(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_explicit_dead_after_that_cannot_fit_says_how(built):
    """COHORT_DEAD_AFTER_MS set by the user is never changed: a timeout
    shorter than it is refused at once, saying how to set both."""
    code = r'''
import datetime, os, torch, torch.distributed as dist
import cohort.torch
os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT=os.environ["PORT"])
try:
    dist.init_process_group("cohort", rank=0, world_size=1, timeout=datetime.timedelta(seconds=2))
except Exception as e:
    print(type(e).__name__, "|", e)
'''
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        port = s.getsockname()[1]
    r = run_py(code, env={"COHORT_DEAD_AFTER_MS": "5000", "PORT": str(port)})
    assert r.returncode == 0, r.stderr
    kind, _, msg = r.stdout.partition(" | ")
    assert kind == "CohortError" and "COHORT_EINVAL" in msg, r.stdout + r.stderr
    assert "(2000 ms) must be longer than the failure detector's dead-after (5000 ms, COHORT_DEAD_AFTER_MS)" in msg
    assert "unset COHORT_DEAD_AFTER_MS" in msg and "set COHORT_DEAD_AFTER_MS below 2000" in msg, msg


NESTED = r'''
import json, os, time, torch, torch.distributed as dist
import cohort.torch
from cohort.torch import backend_of
dist.init_process_group("cohort")
rank = dist.get_rank()
def nested(depth):
    def cb(fut):
        t = fut.value()[0]
        if depth == 0:
            return t
        if rank == 1:
            time.sleep(1.0)  # rank 0's next all-reduce waits for this one: its callback is attached first
        w = dist.all_reduce(t, async_op=True)
        return w.get_future().then(nested(depth - 1)).wait()
    return cb
x = torch.ones(8)
out = dist.all_reduce(x, async_op=True).get_future().then(nested(3)).wait()
print(json.dumps({"rank": rank, "value": out.tolist(), "threads": backend_of()._completer.threads}), flush=True)
dist.destroy_process_group()
'''


def test_callback_waiting_on_a_further_collective(built, tmp_path):
    """A future callback that issues an all-reduce and waits for it (as
    PowerSGD's do), nested three deep, on 2 ranks. Rank 1 issues each
    all-reduce 1 s late, so rank 0's callbacks run on its completion
    threads, each waiting for a collective only another thread can
    complete: one completion thread would deadlock here."""
    script = tmp_path / "nested.py"
    script.write_text(NESTED)
    procs = run_ranks(script, 2, timeout=120)
    assert all(p.returncode == 0 for p in procs), describe(procs)
    for p in procs:
        [rec] = [r for r in p.records if "value" in r]
        assert rec["value"] == [16.0] * 8, rec  # 1 -> 2 -> 4 -> 8 -> 16 over four all-reduces
    [r0] = [r for r in procs[0].records if "value" in r]
    assert r0["threads"] >= 4, f"rank 0 used {r0['threads']} completion threads for three nested waits"


def test_public_names_stay_importable(built):
    code = r'''
from cohort import (Client, CohortError, Coordinator, Group, Status, WAIT_DEFAULT, WAIT_FOREVER, failed_rank_of,
                    find_binary, last_error, library_path, FailureRecord, Dtype, RedOp)
from cohort._core import (Client, Group, Coordinator, CohortError, Status, duration_ms, failed_rank_of, last_error,
                          new_token, WAIT_DEFAULT, WAIT_FOREVER, lib)
from cohort._lib import lib, library_path, find_binary, Env, Options
from cohort.torch import (BACKEND_NAME, CohortBackendError, CohortProcessGroup, CohortWork, report_exception,
                          current_client, CohortBackend, backend_of)
from cohort.lightning import CohortEnvironment, CohortDDPStrategy, STRATEGY_NAME
from cohort.process_group import CohortBackend as B
from cohort.work import CohortWork as W, Completer
from cohort.bootstrap import join, world_client
from cohort.failures import failure_record
assert CohortProcessGroup is B and CohortWork is W and BACKEND_NAME == "cohort"
print("ok")
'''
    r = run_py(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_store_handover_names_the_ranks_without_hello(built):
    """Rank 0's side of the coordinator hand-over through torch's store: a
    stale hello (the one its predecessor answered) is not taken, a fresh one
    is answered under its nonce, and the timeout names exactly the ranks
    that did not say hello."""
    code = r'''
import datetime
import torch.distributed as dist
from cohort import bootstrap
from cohort.failures import CohortError

store, key = dist.HashStore(), "k"
store.set(f"{key}/acked", "old1\nold2\nold3")
store.set(f"{key}/hello/1", "old1")  # the previous attempt's, answered then
store.set(f"{key}/hello/2", "new2")
store.set(f"{key}/hello/3", "old3")
try:
    bootstrap._answer_hellos(store, key, 4, "url\njob\ntoken", datetime.timedelta(seconds=0.3))
    raise SystemExit("no timeout")
except CohortError as e:
    assert "ranks 1, 3 did not say hello" in str(e), e
store.set(f"{key}/hello/1", "new1")
store.set(f"{key}/hello/3", "new3")
bootstrap._answer_hellos(store, key, 4, "url\njob\ntoken", datetime.timedelta(seconds=5))
assert store.get(f"{key}/ack/new2") == b"url\njob\ntoken"
assert store.get(f"{key}/acked") == b"new1\nnew2\nnew3"
print("ok")
'''
    p = run_py(code)
    assert p.returncode == 0 and p.stdout.strip() == "ok", p.stdout + p.stderr
