"""bench/goodput --quick: the goodput benchmark's smoke test (issue 20 item 5).

Runs the real benchmark (cohortd, cohort run --nnodes, torchrun, the
trainer bench/goodput_train.py, a real SIGKILL per faulted mode) in its
short form, and checks the shape of what it prints and writes, and that
every mode made progress: (a) also after its kill (the survivors went on
in place), (b) and (c) at all. The figures of a --quick run are no
comparison (its modes run at the same time); the full run is in
bench/README.md.
"""

from __future__ import annotations

import json
import re
import subprocess

from conftest import BIN, PYTHON, REPO, base_env

GOODPUT = REPO / "bench" / "goodput"


def test_goodput_quick_runs_every_mode_and_prints_the_table(built, tmp_path):
    out_json = tmp_path / "goodput.json"
    env = base_env()
    p = subprocess.Popen([PYTHON, str(GOODPUT), str(BIN), "--quick", "--json", str(out_json), "--keep",
                          str(tmp_path / "logs")], env=env, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
    try:
        stdout, stderr = p.communicate(timeout=150)  # its own bound: 80 s to start, 6 s, the stop
    except subprocess.TimeoutExpired:
        p.terminate()  # SIGTERM: it stops every process it started
        try:
            stdout, stderr = p.communicate(timeout=30)
        except subprocess.TimeoutExpired:
            p.kill()
            stdout, stderr = p.communicate()
        raise AssertionError(f"bench/goodput --quick ran over 150 s\n{stdout}\n{stderr}") from None
    r = subprocess.CompletedProcess(p.args, p.returncode, stdout, stderr)
    text = r.stdout + r.stderr
    assert r.returncode == 0, text
    # the table: a header, a rule, one row per mode, in order
    rows = [line for line in r.stdout.splitlines() if line.startswith("| (")]
    assert [row.split("|")[1].strip() for row in rows] == [
        "(a) cohort in place", "(b) torchrun restart", "(c) no faults"], text
    for row in rows:
        cells = [c.strip() for c in row.strip("|").split("|")]
        assert len(cells) == 8, row
        assert float(cells[1]) > 0, f"no useful samples: {row}\n{text}"
    assert re.search(r"^ratio inplace/nofault: \d+\.\d{3}$", r.stdout, re.M), text
    assert re.search(r"^ratio inplace/restart: \d+\.\d{3}$", r.stdout, re.M), text

    res = json.loads(out_json.read_text())
    assert set(res["modes"]) == {"inplace", "restart", "nofault"}
    assert res["config"]["quick"] is True
    for name, m in res["modes"].items():
        assert "note" not in m, (name, m, text)  # no launcher ended early, every mode started
        assert m["final_step"] > 0 and m["useful_samples"] > 0 and m["goodput"] > 0, (name, m)
        assert m["useful_samples"] == round(m["goodput"] * m["wall_s"]) or abs(
            m["useful_samples"] - m["goodput"] * m["wall_s"]) < 1, m
    a, b, c = res["modes"]["inplace"], res["modes"]["restart"], res["modes"]["nofault"]
    assert a["kills"] == 1 and b["kills"] == 1 and c["kills"] == 0, res
    # (a) kept training after its kill, in the processes that survived it
    assert a["final_step"] > a["steps_at_kills"][0], (a, text)
    assert a["redone"] == 0, a  # an elastic job never commits a step twice
    assert res["ratios"]["inplace/nofault"] == round(a["goodput"] / c["goodput"], 3)
