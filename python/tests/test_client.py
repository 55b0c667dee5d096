"""cohort's own Python API without torch: Client, Group, Coordinator."""

import subprocess
import sys

from conftest import PYDIR, base_env


def run_py(code, env=None, timeout=60):
    e = base_env(**(env or {}))
    return subprocess.run([sys.executable, "-c", code], env=e, capture_output=True, text=True, timeout=timeout)


def test_control_plane_on_a_private_coordinator(built):
    code = """
import threading, cohort
co = cohort.Coordinator(idle_exit=2)
out = {}
def rank(r):
    with cohort.Client(co.url, job="j", token="t", rank=r, world_size=3) as c:
        g = c.world
        g.barrier("start", timeout=10)
        data = g.broadcast_bytes(b"hello" if r == 1 else None, root=1, timeout=10)
        out[r] = (c.rank, c.world_size, data, g.decide(r != 2, all=True), g.decide(r == 2, all=False))
ts = [threading.Thread(target=rank, args=(r,)) for r in range(3)]
[t.start() for t in ts]; [t.join(30) for t in ts]
assert out == {r: (r, 3, b"hello", False, True) for r in range(3)}, out
co.stop()
print("ok")
"""
    r = run_py(code)
    assert r.returncode == 0 and r.stdout.strip() == "ok", r.stdout + r.stderr


def test_wrong_token_is_an_error(built):
    code = """
import threading, cohort
co = cohort.Coordinator(idle_exit=2)
c = None
def first():
    global c
    c = cohort.Client(co.url, job="j", token="right", rank=0, world_size=1)
first()
try:
    cohort.Client(co.url, job="j", token="wrong", rank=0, world_size=1, op_timeout=10, join_timeout=10)
except cohort.CohortError as e:
    print(e.status.name, e)
c.close(); co.stop()
"""
    r = run_py(code)
    assert r.returncode == 0 and r.stdout.startswith("EAUTH"), r.stdout + r.stderr


def test_clean_close_logs_no_reconnection(built):
    """Regression: a clean close logged "reconnected to the coordinator ...
    after <machine uptime> s" when nng redialled after cohortd closed the
    connection of the Leave (seen in 2 of 3 runs before the fix)."""
    code = """
import time, cohort
co = cohort.Coordinator(idle_exit=2)
for i in range(3):
    c = cohort.Client(co.url, job=f"j{i}", rank=0, world_size=1)
    c.close()
    time.sleep(0.5)
co.stop()
"""
    r = run_py(code, env={"COHORT_LOG_LEVEL": "info", "COHORT_LOG_FORMAT": "text"})
    assert r.returncode == 0, r.stderr
    assert "joined job" in r.stderr, r.stderr  # info logs are on
    assert "reconnected" not in r.stderr, r.stderr


def test_join_that_disagrees_names_both_sides(built):
    """A worker of another launch under the same job name gets a
    CohortError that says what the job is and what this worker said."""
    code = """
import cohort
co = cohort.Coordinator(idle_exit=2)
c = cohort.Client(co.url, job="x", token="t", rank=0, world_size=1)
for kw in (dict(token="t", world_size=2), dict(token="other", world_size=1)):
    try:
        cohort.Client(co.url, job="x", rank=0, op_timeout=10, join_timeout=10, **kw)
    except cohort.CohortError as e:
        print(e.status.name, "|", e.detail)
c.close(); co.stop()
"""
    r = run_py(code)
    lines = r.stdout.strip().splitlines()
    assert r.returncode == 0 and len(lines) == 2, r.stdout + r.stderr
    assert lines[0].startswith("EINVAL | job 'x' has world size 1 (since generation 1); this worker"), lines[0]
    assert "says 2" in lines[0], lines[0]
    assert lines[1].startswith("EAUTH | wrong token for job 'x'"), lines[1]
