"""Observability (docs/observability.md): per-rank metrics on cohortd's
/metrics, the merged timeline of ``cohort run --timeline``, structured log
fields. Real cohortd, real launcher, real worker processes (the C test
workers and the C DDP strategy); nothing mocked.

The Prometheus exposition format is checked by a strict checker written
here (``check_exposition``), and by ``promtool check metrics`` as well
where promtool is installed: Debian's ``prometheus`` package that carries
it is a 19 MB download (96 MB installed, plus its web assets), too heavy to
add to CI for one check.
"""

from __future__ import annotations

import json
import math
import os
import re
import shutil
import subprocess
import tempfile
import time
import urllib.request
from collections import Counter, defaultdict

import pytest

from conftest import BIN, base_env, start_cohortd

COHORT = str(BIN / "cohort")
WORKER = str(BIN / "cohort-test-worker")
STRATEGY = str(BIN / "cohort-strategy-worker")


# ---------------------------------------------------------------------------
# helpers
# ---------------------------------------------------------------------------


class Coordinator:
    """cohortd on loopback ports with --http, once it listens; stopped by PID.

    start_cohortd: the coordinator's port is the kernel's choice, the HTTP
    port is chosen at start and cohortd started again if it was taken. Its
    output is in ``log``.
    """

    def __init__(self, tmp_path, *args: str, private: bool = True):
        self.log = tempfile.NamedTemporaryFile("w+", dir=tmp_path, prefix="cohortd-", suffix=".log", delete=False)
        try:
            # Job names on /metrics and every job's status without an
            # admin secret: a private coordinator's settings.
            self.proc, self.url, [self.hport] = start_cohortd(
                "--http", "127.0.0.1:{port}", *(["--metrics-per-job", "--open-status"] if private else []), *args,
                log=self.log)
        except BaseException:
            self.log.close()
            raise
        self.http = f"http://127.0.0.1:{self.hport}"

    def get(self, path: str, headers: dict | None = None) -> tuple[int, str]:
        req = urllib.request.Request(self.http + path, headers=headers or {})
        try:
            with urllib.request.urlopen(req, timeout=5) as r:
                return r.status, r.read().decode()
        except urllib.error.HTTPError as e:
            return e.code, e.read().decode()

    def stop(self) -> None:
        if self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(timeout=10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.log.close()


@pytest.fixture
def coord(tmp_path):
    c = Coordinator(tmp_path)
    yield c
    c.stop()


def run(args, timeout=120, **env) -> subprocess.CompletedProcess:
    return subprocess.run(args, capture_output=True, text=True, timeout=timeout, env=base_env(**env))


def results(out: str, tag: str) -> list[dict]:
    """Parses `RESULT <tag> k=v ...` lines."""
    recs = []
    for line in out.splitlines():
        parts = line.split()
        if len(parts) >= 2 and parts[0] == "RESULT" and parts[1] == tag:
            recs.append(dict(p.split("=", 1) for p in parts[2:] if "=" in p))
    return recs


# ---------------------------------------------------------------------------
# a strict Prometheus text-format (0.0.4) checker
# ---------------------------------------------------------------------------

NAME = r"[a-zA-Z_:][a-zA-Z0-9_:]*"
LABEL = r"[a-zA-Z_][a-zA-Z0-9_]*"
LVALUE = r'"(?:[^"\\\n]|\\[\\"n])*"'
SAMPLE = re.compile(
    rf"^({NAME})(\{{(?:{LABEL}={LVALUE}(?:,{LABEL}={LVALUE})*,?)?\}})? (\S+)( -?\d+)?$")
LABEL_RE = re.compile(rf"({LABEL})=({LVALUE})")


def parse_value(v: str) -> float:
    if v in ("+Inf", "Inf"):
        return math.inf
    if v == "-Inf":
        return -math.inf
    if v == "NaN":
        return math.nan
    if not re.fullmatch(r"[-+]?(\d+\.?\d*|\.\d+)([eE][-+]?\d+)?", v):
        raise AssertionError(f"bad sample value {v!r}")
    return float(v)


def check_exposition(text: str) -> dict:
    """Checks text strictly; returns {family: {"type", "samples": [(name, labels, value)]}}."""
    assert text.endswith("\n"), "exposition must end with a newline"
    fams: dict[str, dict] = {}
    seen_series = set()
    order: list[str] = []
    cur = None

    def family_of(name: str) -> str:
        for suf in ("_bucket", "_sum", "_count"):
            base = name[: -len(suf)]
            if name.endswith(suf) and base in fams and fams[base]["type"] in ("histogram", "summary"):
                return base
        return name

    for n, line in enumerate(text.splitlines(), 1):
        assert line == line.strip() or line.startswith("#"), f"line {n}: stray whitespace: {line!r}"
        if not line:
            raise AssertionError(f"line {n}: empty line")
        if line.startswith("#"):
            m = re.fullmatch(rf"# (HELP|TYPE) ({NAME}) (.*)", line)
            assert m, f"line {n}: bad comment {line!r}"
            kind, name, rest = m.groups()
            f = fams.setdefault(name, {"type": None, "help": None, "samples": []})
            if kind == "TYPE":
                assert f["type"] is None, f"line {n}: second TYPE for {name}"
                assert not f["samples"], f"line {n}: TYPE after samples of {name}"
                assert rest in ("counter", "gauge", "histogram", "summary", "untyped"), line
                f["type"] = rest
            else:
                assert f["help"] is None, f"line {n}: second HELP for {name}"
                f["help"] = rest
            if name not in order:
                order.append(name)
            cur = name
            continue
        m = SAMPLE.match(line)
        assert m, f"line {n}: bad sample line {line!r}"
        name, lbl, value, _ts = m.groups()
        labels = tuple(LABEL_RE.findall(lbl or ""))
        lnames = [k for k, _ in labels]
        assert len(set(lnames)) == len(lnames), f"line {n}: duplicate label"
        fam = family_of(name)
        assert fam in fams and fams[fam]["type"], f"line {n}: sample of {name} without TYPE"
        assert fam == cur, f"line {n}: samples of {fam} are not contiguous (after {cur})"
        key = (name, labels)
        assert key not in seen_series, f"line {n}: duplicate series {line!r}"
        seen_series.add(key)
        fams[fam]["samples"].append((name, dict((k, v[1:-1]) for k, v in labels), parse_value(value)))
    for name, f in fams.items():
        assert f["type"], f"{name}: HELP without TYPE"
        if f["type"] == "counter":
            assert name.endswith("_total"), f"counter {name} should end in _total"
            for s in f["samples"]:
                assert s[2] >= 0, f"negative counter {s}"
        if f["type"] == "histogram":
            check_histogram(name, f["samples"])
    return fams


def check_histogram(name: str, samples) -> None:
    series = defaultdict(lambda: {"buckets": [], "sum": None, "count": None})
    for sname, labels, v in samples:
        base = tuple(sorted((k, x) for k, x in labels.items() if k != "le"))
        if sname == name + "_bucket":
            assert "le" in labels, f"{sname} without le"
            series[base]["buckets"].append((parse_value(labels["le"]), v))
        elif sname == name + "_sum":
            series[base]["sum"] = v
        elif sname == name + "_count":
            series[base]["count"] = v
        else:
            raise AssertionError(f"{sname} in histogram {name}")
    for base, s in series.items():
        b = s["buckets"]
        assert b and b[-1][0] == math.inf, f"{name}{base}: no +Inf bucket"
        assert all(b[i][0] < b[i + 1][0] for i in range(len(b) - 1)), f"{name}{base}: le not increasing"
        assert all(b[i][1] <= b[i + 1][1] for i in range(len(b) - 1)), f"{name}{base}: buckets not cumulative"
        assert s["count"] is not None and s["sum"] is not None, f"{name}{base}: no _sum/_count"
        assert s["count"] == b[-1][1], f"{name}{base}: _count != +Inf bucket"


def promtool(text: str) -> None:
    tool = shutil.which("promtool")
    if tool is None:
        return
    r = subprocess.run([tool, "check", "metrics"], input=text, capture_output=True, text=True, timeout=30)
    assert r.returncode == 0, r.stdout + r.stderr


def rank_counts(fams: dict, job: str) -> dict[int, Counter]:
    out: dict[int, Counter] = defaultdict(Counter)
    for name, labels, v in fams["cohort_rank_collectives_total"]["samples"]:
        if labels.get("job") == job:
            out[int(labels["rank"])][labels["op"]] = int(v)
    return out


# ---------------------------------------------------------------------------
# tests
# ---------------------------------------------------------------------------


def test_metrics_hide_job_names_by_default(tmp_path):
    """Without --metrics-per-job, /metrics names no job (it is often
    scraped without credentials): the per-rank series carry a digest of
    the job's name instead, and still count each rank's collectives."""
    import hashlib

    coordinator = Coordinator(tmp_path, private=False)
    try:
        job = "secret-project-x"
        r = run([COHORT, "run", "-n", "2", "--coordinator", coordinator.url, "--job", job, "--",
                 WORKER, "observe", "3"])
        assert r.returncode == 0, r.stdout + r.stderr
        status, text = coordinator.get("/metrics")
    finally:
        coordinator.stop()
    assert status == 200
    assert job not in text, text
    digest = "#" + hashlib.sha256(job.encode()).hexdigest()[:16]
    counts = rank_counts(check_exposition(text), digest)
    assert sorted(counts) == [0, 1] and counts[0]["allreduce"] == 3, text


def test_metrics_count_every_rank_collective(coord):
    """After a real 2-rank run, every rank's series count exactly the
    collectives that rank issued, data plane (peer to peer) included."""
    job = "obs-counts"
    r = run([COHORT, "run", "-n", "2", "--coordinator", coord.url, "--job", job, "--",
             WORKER, "observe", "9"])
    assert r.returncode == 0, r.stdout + r.stderr
    issued = {int(x["rank"]): x for x in results(r.stdout, "observe")}
    assert sorted(issued) == [0, 1], r.stdout
    status, text = coord.get("/metrics")
    assert status == 200
    fams = check_exposition(text)
    promtool(text)
    counts = rank_counts(fams, job)
    assert sorted(counts) == [0, 1], text
    for rank, want in issued.items():
        got = counts[rank]
        for op in ("allreduce", "broadcast", "allgather", "barrier", "decide"):
            assert got[op] == int(want[op]), f"rank {rank} {op}: /metrics says {got[op]}, issued {want[op]}"
    # bytes: 9 all-reduces of 4 KiB each
    byt = {(l["rank"], l["op"]): v for _, l, v in fams["cohort_rank_collective_bytes_total"]["samples"]
           if l["job"] == job}
    assert byt[("0", "allreduce")] == 9 * 4096
    # the histograms count every collective of the rank
    hist = {l["rank"]: v for n, l, v in fams["cohort_rank_collective_duration_seconds"]["samples"]
            if n.endswith("_count") and l["job"] == job}
    assert hist["0"] == sum(counts[0].values()) and hist["1"] == sum(counts[1].values())
    info = fams["cohort_build_info"]["samples"]
    assert len(info) == 1 and info[0][2] == 1 and info[0][1]["version"]


def test_metrics_cardinality_bounded(tmp_path):
    """--metrics-max-ranks bounds the (job, rank) pairs; the rest are
    evicted and counted."""
    c = Coordinator(tmp_path, "--metrics-max-ranks", "2")
    try:
        for job in ("bound-a", "bound-b"):
            r = run([COHORT, "run", "-n", "2", "--coordinator", c.url, "--job", job, "--",
                     WORKER, "observe", "3"])
            assert r.returncode == 0, r.stdout + r.stderr
        fams = check_exposition(c.get("/metrics")[1])
        pairs = {(l["job"], l["rank"]) for _, l, _ in fams["cohort_rank_collectives_total"]["samples"]}
        assert pairs == {("bound-b", "0"), ("bound-b", "1")}, pairs
        assert fams["cohort_rank_metrics_evicted_total"]["samples"][0][2] == 2
        assert fams["cohort_rank_metrics_ranks"]["samples"][0][2] == 2
    finally:
        c.stop()
    c = Coordinator(tmp_path, "--metrics-max-ranks", "0")
    try:
        r = run([COHORT, "run", "-n", "2", "--coordinator", c.url, "--job", "none", "--",
                 WORKER, "observe", "2"])
        assert r.returncode == 0, r.stdout + r.stderr
        fams = check_exposition(c.get("/metrics")[1])
        assert "cohort_rank_collectives_total" not in fams
    finally:
        c.stop()


def test_metrics_after_c_ddp_run(coord, tmp_path):
    """The C DDP strategy: /metrics counts one all-reduce per bucket and
    step (DDP's own count), one broadcast per parameter, the final
    all-gather."""
    job = "obs-ddp"
    r = run([COHORT, "run", "-n", "2", "--coordinator", coord.url, "--job", job, "--",
             STRATEGY, "ddp", str(tmp_path / "params.bin"), "steps=7"])
    assert r.returncode == 0, r.stdout + r.stderr
    res = [dict(p.split("=", 1) for p in line.split()[1:] if "=" in p)
           for line in r.stdout.splitlines() if line.startswith("RESULT ")]
    assert len(res) == 2, r.stdout
    counts = rank_counts(check_exposition(coord.get("/metrics")[1]), job)
    for x in res:
        rank = int(x["rank"])
        started = int(x["overlapped"].split("/")[1])
        assert started == 7 * int(x["buckets"]) and started > 0
        assert counts[rank]["allreduce"] == started, (rank, counts[rank], x)
        assert counts[rank]["broadcast"] == 4  # MLP_NPARAMS, examples/lib/mlp.h
        assert counts[rank]["allgather"] == 1


def load_trace(path) -> list[dict]:
    with open(path) as f:
        doc = json.load(f)
    assert isinstance(doc, dict) and isinstance(doc.get("traceEvents"), list)
    return doc["traceEvents"]


def check_trace_format(events: list[dict]) -> None:
    """What Perfetto's and Chrome's JSON importers need: every event has
    name, ph, pid, tid; X has ts and dur >= 0; i has ts (and scope); M
    names a process or thread; on every track (pid, tid) events come in
    time order."""
    last = {}
    for e in events:
        for k in ("name", "ph", "pid", "tid"):
            assert k in e, f"event without {k}: {e}"
        assert isinstance(e["pid"], int) and isinstance(e["tid"], int)
        assert e["ph"] in ("X", "i", "M"), e
        if e["ph"] == "M":
            assert e["name"] in ("process_name", "thread_name", "process_sort_index"), e
            assert "name" in e["args"] or "sort_index" in e["args"]
            continue
        assert isinstance(e["ts"], (int, float)) and e["ts"] > 0
        if e["ph"] == "X":
            assert isinstance(e["dur"], (int, float)) and e["dur"] >= 0, e
        else:
            assert e.get("s", "t") in ("g", "p", "t"), e
        track = (e["pid"], e["tid"])
        assert e["ts"] >= last.get(track, 0), f"track {track} goes back in time at {e}"
        last[track] = e["ts"]


def test_timeline_four_ranks_with_a_straggler(tmp_path):
    """`cohort run --timeline` on 4 ranks: one valid merged trace with
    every rank's collectives; rank 2, delayed 1.5 s before one all-reduce
    (COHORT_FAULTS), shows as a long wait for peers on the others."""
    path = tmp_path / "trace.json"
    n = 30
    r = run([COHORT, "run", "-n", "4", "--timeline", str(path), "--", WORKER, "observe", str(n)],
            COHORT_FAULTS="rank=2,at=op:12,action=delay:1500ms")
    assert r.returncode == 0, r.stdout + r.stderr
    assert not (tmp_path / "trace.json.parts").exists()
    events = load_trace(path)
    check_trace_format(events)
    names = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert all(names[p].startswith(f"rank {p} ") for p in range(4)), names
    colls = [e for e in events if e["ph"] == "X" and e.get("cat") in ("collective", "control")]
    per_rank = defaultdict(Counter)
    for e in colls:
        per_rank[e["pid"]][e["name"]] += 1
        a = e["args"]
        for k in ("seq", "bytes", "backend", "wait_us", "transfer_us", "status"):
            assert k in a, f"{k} missing in {e}"
        if e["name"] == "allreduce":
            assert a["bytes"] == 4096 and a["backend"] == "host" and a["algorithm"], e
    for rank in range(4):
        assert per_rank[rank] == Counter(allreduce=n, broadcast=n // 2 + 1, allgather=1, barrier=2,
                                         decide=1), (rank, per_rank[rank])
    # the straggler: one all-reduce where ranks 0, 1, 3 waited >= 1 s for
    # peers, while rank 2 itself did not wait
    ar = defaultdict(dict)
    for e in colls:
        if e["name"] == "allreduce":
            ar[e["args"]["seq"]][e["pid"]] = e
    stalled = [s for s, by in ar.items() if all(by[p]["args"]["wait_us"] >= 1e6 for p in (0, 1, 3))]
    assert len(stalled) == 1, {s: {p: by[p]["args"]["wait_us"] for p in by} for s, by in ar.items()}
    mine = ar[stalled[0]][2]
    assert mine["args"]["wait_us"] < 0.5e6 and mine["dur"] < 0.5e6, mine
    waits = [e for e in events if e.get("cat") == "wait" and e["pid"] == 0 and e["dur"] >= 1e6]
    assert waits, "no 'wait for peers' slice on rank 0"


def test_timeline_ring_is_bounded(tmp_path):
    """COHORT_TIMELINE_EVENTS bounds the memory: the oldest events are
    dropped and counted."""
    path = tmp_path / "ring.json"
    r = run([COHORT, "run", "-n", "2", "--timeline", str(path), "--", WORKER, "observe", "100"],
            COHORT_TIMELINE_EVENTS="32")
    assert r.returncode == 0, r.stdout + r.stderr
    events = load_trace(path)
    check_trace_format(events)
    for rank in (0, 1):
        mine = [e for e in events if e["pid"] == rank and e["ph"] != "M" and e.get("cat") != "wait"]
        assert 0 < len(mine) <= 32, len(mine)


def test_json_logs_have_job_rank_op_seq_fields(tmp_path):
    """JSON log lines carry job, rank, op and seq as fields: a rank that
    times out in an all-reduce logs them."""
    coordinator = Coordinator(tmp_path)
    try:
        r = run([COHORT, "run", "-n", "2", "--coordinator", coordinator.url, "--job", "logjob", "--",
                 WORKER, "observe", "3"], COHORT_LOG_FORMAT="json", COHORT_LOG_LEVEL="debug")
        assert r.returncode == 0, r.stdout + r.stderr
        bad = run([COHORT, "run", "-n", "2", "--coordinator", coordinator.url, "--job", "logfail", "--",
                   WORKER, "observe", "9"], COHORT_FAULTS="rank=1,at=op:4,action=exit")
        assert bad.returncode != 0
    finally:
        coordinator.stop()
    # cohortd's line about the failure names the job, the rank and its op
    coordinator.log.close()
    srv = [json.loads(x) for x in open(coordinator.log.name) if x.startswith("{")]
    fail = [x for x in srv if x.get("job") == "logfail" and "failed" in x["msg"] and "rank" in x]
    assert fail and fail[0]["rank"] == 1 and fail[0].get("op") == "allreduce", srv
    lines = [json.loads(x) for x in r.stderr.splitlines() if x.startswith("{")]
    assert lines, r.stderr
    joined = [x for x in lines if "joined job" in x.get("msg", "")]
    assert joined and all(x["job"] == "logjob" and x["rank"] in (0, 1) for x in joined), joined
    # Lines logged inside an operation carry it: here the data plane's
    # set-up, which runs in the background right after join.
    in_op = [x for x in lines if "op" in x]
    assert in_op, "no log line inside an operation"
    for x in in_op:
        assert x["job"] == "logjob" and isinstance(x["rank"], int)
        assert isinstance(x.get("seq", 1), int)


# ---------------------------------------------------------------------------
# the status page in a real headless browser
# ---------------------------------------------------------------------------

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
DOCS = BIN.parent.parent / "docs"


def chromium(args: list[str], tmp_path, timeout=90) -> str:
    """Runs headless chromium (a throwaway profile) and returns stdout."""
    profile = tmp_path / f"chromium-{time.monotonic_ns()}"
    r = subprocess.run(
        [CHROMIUM, "--headless=new", "--no-sandbox", "--disable-gpu", "--disable-dev-shm-usage",
         "--no-first-run", "--disable-extensions", "--mute-audio", f"--user-data-dir={profile}",
         "--virtual-time-budget=4000", *args],
        capture_output=True, text=True, timeout=timeout)
    assert r.returncode == 0, r.stderr[-3000:]
    shutil.rmtree(profile, ignore_errors=True)
    return r.stdout


def page_text(dom: str) -> str:
    return re.sub(r"\s+", " ", re.sub(r"<[^>]+>", " ", dom))


def wait_for(cond, timeout=30.0, what="condition"):
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        v = cond()
        if v:
            return v
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


@pytest.mark.skipif(CHROMIUM is None, reason="chromium is not installed (tools/deps.sh installs it)")
def test_status_page_in_headless_chromium(tmp_path):
    """cohortd's / during a running job, a stalled job and a failed job,
    loaded in headless chromium: what the page shows, and that it shows
    nothing without the job's token (or the admin secret)."""
    (tmp_path / "admin").write_text("admin-secret")
    for j in ("run", "stall", "fail"):
        (tmp_path / j).write_text(f"tok-{j}")
    c = Coordinator(tmp_path, "--admin-token-file", str(tmp_path / "admin"), "--stall-threshold", "1500",
                    *[x for j in ("run", "stall", "fail") for x in ("--job", f"pg-{j}:@{tmp_path / j}")])
    procs = []
    try:
        def launch(job, scenario, arg, **env):
            out = open(tmp_path / f"{job}.out", "w")
            p = subprocess.Popen([COHORT, "run", "-n", "2", "--coordinator", c.url, "--job", f"pg-{job}",
                                  "--token-file", str(tmp_path / job), "--", WORKER, scenario, arg],
                                 stdout=out, stderr=subprocess.STDOUT, env=base_env(**env))
            procs.append(p)
            return p

        release = tmp_path / "release"
        launch("run", "hold_until", str(release))
        launch("stall", "observe", "50", COHORT_FAULTS="rank=1,at=op:5,action=delay:60s")
        failed = launch("fail", "observe", "50", COHORT_FAULTS="rank=1,at=op:5,action=exit")
        failed.wait(timeout=60)

        def status(job):
            code, body = c.get(f"/status.json?job=pg-{job}", {"Authorization": f"Bearer tok-{job}"})
            return json.loads(body)["jobs"][0] if code == 200 else None

        wait_for(lambda: status("run")["state"] == "running", what="job pg-run running")
        wait_for(lambda: any(m["in_op"] and m["in_op_ms"] >= 2000 for m in status("stall")["members"]),
                 what="a rank of pg-stall waiting 2 s")
        wait_for(lambda: status("fail")["state"] == "failed", what="pg-fail failed")

        # one job, with its own token
        text = page_text(chromium(["--dump-dom", f"{c.http}/#job=pg-run&token=tok-run"], tmp_path))
        assert "pg-run running" in text, text
        assert "pg-stall" not in text and "pg-fail" not in text
        assert re.search(r"\b0 \S+:\d+ running\b", text) and re.search(r"\b1 \S+:\d+ running\b", text), text

        # the stalled job: who is late, in which collective, for how long
        text = page_text(chromium(["--dump-dom", f"{c.http}/#job=pg-stall&token=tok-stall"], tmp_path))
        m = re.search(r"rank 1 is late: rank 0 waiting in (\w+) #(\d+) for ([\d.]+) s", text)
        assert m, text
        assert m.group(1) == "allreduce" and float(m.group(3)) >= 2.0, text
        assert "pg-stall stalled" in text, text

        # the failed job: state, the failed rank and its text
        text = page_text(chromium(["--dump-dom", f"{c.http}/#job=pg-fail&token=tok-fail"], tmp_path))
        assert "pg-fail failed" in text, text
        assert "rank 1 failed: injected fault: exit at op 5" in text, text
        assert re.search(r"Recent failures .*job pg-fail rank 1: injected fault", text), text

        # no token, a wrong token: nothing about any job
        for frag in ("", "#job=pg-run&token=wrong", "#token=tok-run"):
            text = page_text(chromium(["--dump-dom", f"{c.http}/{frag}"], tmp_path))
            assert "not authorised" in text and "pg-" not in text, (frag, text)

        # the admin secret: every job; a screenshot for docs/
        shot = tmp_path / "status-page.png"
        text = page_text(chromium(["--dump-dom", f"{c.http}/#token=admin-secret"], tmp_path))
        assert all(f"pg-{j}" in text for j in ("run", "stall", "fail")), text
        chromium([f"--screenshot={shot}", "--window-size=1280,900", "--hide-scrollbars",
                  f"{c.http}/#token=admin-secret"], tmp_path)
        assert shot.stat().st_size > 10000
        with open(shot, "rb") as f:
            assert f.read(8) == b"\x89PNG\r\n\x1a\n"
        if os.environ.get("COHORT_UPDATE_SCREENSHOT") == "1":
            shutil.copy(shot, DOCS / "status-page.png")
    finally:
        release.touch()
        for p in procs:
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                p.terminate()  # cohort run stops its workers
                try:
                    p.wait(timeout=30)
                except subprocess.TimeoutExpired:
                    p.kill()
                    p.wait()
        c.stop()


def test_cohort_status_finished_failed_and_top(tmp_path):
    """`cohort status` after a job that finished and one that failed (jobs
    cohortd keeps: created with --job): states, the failure text, no
    member "in" an operation, and each rank's reported collectives;
    `--watch MS --count N` redraws N times."""
    c = Coordinator(tmp_path, "--job", "st-done:", "--job", "st-fail:")
    try:
        r = run([COHORT, "run", "-n", "2", "--coordinator", c.url, "--job", "st-done", "--",
                 WORKER, "observe", "5"])
        assert r.returncode == 0, r.stdout + r.stderr
        r = run([COHORT, "run", "-n", "2", "--coordinator", c.url, "--job", "st-fail", "--",
                 WORKER, "observe", "9"], COHORT_FAULTS="rank=1,at=op:3,action=exit")
        assert r.returncode != 0
        s = run([COHORT, "status", "--coordinator", c.url])
        assert s.returncode == 0, s.stderr
        out = s.stdout
        done = out[out.index("job st-done"):out.index("job st-fail")] if out.index("job st-done") < out.index(
            "job st-fail") else out[out.index("job st-done"):]
        assert "state finished" in done, out
        assert " in " not in done.replace("job st-done", ""), out
        assert done.count("left") == 2 and done.count("12 collectives") == 2, out
        fail = out[out.index("job st-fail"):]
        fail = fail[: fail.index("job st-done")] if "job st-done" in fail else fail
        assert "state failed" in fail and "failed: rank 1: injected fault: exit at op 3" in fail, out
        w = run([COHORT, "status", "--coordinator", c.url, "--watch", "200", "--count", "3"])
        assert w.returncode == 0 and w.stdout.count("cohortd at ") == 3, w.stdout + w.stderr
        t = subprocess.Popen([COHORT, "top", "--coordinator", c.url], stdout=subprocess.PIPE, text=True,
                             env=base_env())
        time.sleep(1.5)
        t.terminate()
        out_top, _ = t.communicate(timeout=10)
        assert t.returncode == 0 and out_top.count("cohortd at ") >= 1 and "job st-done" in out_top
    finally:
        c.stop()
