"""A rank that raises or is SIGKILLed mid-training: every survivor raises, naming it.

Plain torch (each rank a process, torchrun's variables) and Lightning (its
own launcher). Survivors must raise within a few seconds (the measured
figure is in bench/torch_failures.py, not asserted here beyond a bound
that only a hang would break), the error must name the failed rank and,
for an exception, quote the failed rank's own text; the next collective
must raise CohortBackendError, a torch.distributed.DistBackendError; and
no process may be left behind.
"""

import re

import pytest

from conftest import BIN, LIGHTNING_EXAMPLE as EXAMPLE, PYTHON, WORKERS, describe, run_one, run_ranks

# Far above the detection time (milliseconds); only a hang exceeds it.
HANG_BOUND_S = 30


@pytest.mark.parametrize(
    "world,victim,mode",
    [(2, 1, "raise"), (2, 1, "kill"), (3, 2, "raise"), (3, 2, "kill"),
     # rank 0 started the private coordinator: it must outlive rank 0
     (3, 0, "raise"), (3, 0, "kill")],
)
def test_torch_rank_failure(world, victim, mode, tmp_path, built):
    stamp = tmp_path / "failed_at"
    procs = run_ranks(WORKERS / "fail_worker.py", world, [mode, str(victim), "20", str(stamp)], timeout=120)
    survivors = [p for p in procs if p.rank != victim]
    for p in survivors:
        recs = [r for r in p.records if "pending" in r]
        assert recs, describe(procs)
        rec = recs[0]
        pend, nxt = rec["pending"], rec["next"]
        assert f"rank {victim} (" in pend["msg"], pend
        assert 0 <= rec["detect_s"] < HANG_BOUND_S, rec
        if mode == "raise":
            assert "injected failure in training step 20" in pend["msg"], pend
            # the summary is quoted once, followed by the frame that raised
            first = next(l for l in pend["msg"].splitlines() if "COHORT_EPEERLOST" in l)
            assert first.count("injected failure") == 1, first
            assert "fail_worker.py" in pend["msg"], pend["msg"]
        else:
            assert "connection lost" in pend["msg"] or "closed the connection" in pend["msg"], pend
        assert nxt is not None, "the next collective after a failure did not raise"
        assert "DistBackendError" in nxt["mro"] and nxt["type"] == "CohortBackendError", nxt
        assert f"rank {victim} (" in nxt["msg"], nxt
        # the same as fields (cohort.failures.FailureRecord)
        rec = nxt["failure"]
        assert rec["rank"] == victim and rec["host"] and rec["pid"] > 0, rec
        if mode == "raise":
            assert rec["kind"] == "reported" and "injected failure in training step 20" in rec["text"], rec
            assert "fail_worker.py" in rec["trace"], rec
        else:
            assert rec["kind"] == "connection", rec
    v = procs[victim]
    if mode == "kill":
        assert v.returncode == -9 or v.returncode == 137, v.returncode
    else:
        assert v.returncode != 0 and "ValueError: injected failure" in v.out


@pytest.mark.parametrize("mode", ["raise", "kill"])
def test_lightning_rank_failure(mode, digits):
    """Rank 1 fails in training_step under Lightning's launcher; rank 0 names it."""
    argv = [PYTHON, str(EXAMPLE), "--devices", "2", "--epochs", "6", "--fail-rank", "1", "--fail-step", "30",
            "--fail-mode", mode]
    p = run_one(argv)
    assert p.returncode != 0, p.out[-3000:]
    assert "[test harness: killed" not in p.out, p.out[-3000:]
    rank0 = "\n".join(l for l in p.out.splitlines() if l.startswith("[rank0]"))
    assert re.search(r"CohortBackendError: cohort \w+: COHORT_EPEERLOST: rank 1 \(", rank0), p.out[-5000:]
    if mode == "raise":
        assert "RuntimeError: fault drill: rank 1 fails at step 30" in rank0, rank0[-3000:]
        assert "lightning_digits.py" in rank0  # rank 1's own frame, quoted on rank 0


def test_cohort_run_reports_the_root_cause(digits):
    """Under cohort run, a rank raising in training_step is the job's root
    cause in the launcher's report, with its traceback."""
    argv = [str(BIN / "cohort"), "run", "-n", "2", "--", PYTHON, str(EXAMPLE), "--devices", "2", "--epochs", "6",
            "--fail-rank", "1", "--fail-step", "30"]
    p = run_one(argv)
    assert p.returncode != 0
    report = p.out[p.out.index("cohort run: job"):] if "cohort run: job" in p.out else p.out[-4000:]
    assert "root cause : rank 1 exited with status 1" in report, report
    assert "error text : RuntimeError: fault drill: rank 1 fails at step 30" in report, report
    assert "lightning_digits.py" in report and "in training_step" in report, report
