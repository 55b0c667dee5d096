"""Shared helpers of the Python suite: real processes, real torch, bounded.

Every rank is a process of its own (``python worker.py`` with torchrun's
variables, or started by a real launcher). Every process a test starts is
bounded by a timeout and killed by PID if it overruns, and the suite checks
at the end that none of them is left.
"""

from __future__ import annotations

import json
import os
import pathlib
import signal
import socket
import subprocess
import sys
import tempfile
import time
import urllib.request
from dataclasses import dataclass, field
from typing import IO, Callable, Optional, Sequence

import pytest

HERE = pathlib.Path(__file__).resolve().parent
PYDIR = HERE.parent
REPO = PYDIR.parent
WORKERS = HERE / "workers"
BIN = pathlib.Path(os.environ.get("COHORT_BIN", REPO / "build" / "bin")).resolve()
PYTHON = sys.executable
# The Lightning example a user runs (test_lightning, test_failures).
LIGHTNING_EXAMPLE = REPO / "examples" / "lightning_digits.py"

_started: list[subprocess.Popen] = []


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def base_env(**extra: str) -> dict[str, str]:
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join([str(PYDIR), env.get("PYTHONPATH", "")]).rstrip(os.pathsep)
    env.setdefault("OMP_NUM_THREADS", "1")
    env.setdefault("COHORT_LOG_LEVEL", "warn")
    env["COHORT_COHORTD"] = str(BIN / "cohortd")
    for k in ("RANK", "WORLD_SIZE", "LOCAL_RANK", "MASTER_ADDR", "MASTER_PORT", "COHORT_COORDINATOR",
              "COHORT_RANK", "COHORT_WORLD_SIZE", "COHORT_JOB", "COHORT_TOKEN"):
        env.pop(k, None)
    env.update({k: str(v) for k, v in extra.items()})
    return env


@dataclass
class Proc:
    """A finished process: its exit status, output, and JSON lines printed."""

    rank: int
    returncode: int
    out: str
    elapsed: float
    records: list = field(default_factory=list)

    @property
    def text(self) -> str:
        return self.out


def _parse(out: str) -> list:
    recs = []
    for line in out.splitlines():
        line = line.strip()
        if line.startswith("{") and line.endswith("}"):
            try:
                r = json.loads(line)
            except ValueError:
                continue
            if isinstance(r, dict) and "level" not in r:  # not a cohort log line
                recs.append(r)
    return recs


def start(argv: Sequence[str], env: dict[str, str]) -> subprocess.Popen:
    p = subprocess.Popen(
        list(argv), env=env, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
        start_new_session=True,
    )
    _started.append(p)
    return p


def _spawn_cohortd(listen: str, argv: Sequence[str], env: Optional[dict[str, str]], timeout: float,
                   log: Optional[IO[str]]) -> tuple[subprocess.Popen, str, str]:
    """One cohortd at ``listen``: (its process, its ready line, its output when it did not start).

    The ready line is the URL cohortd bound (``--ready-fd``), empty when it
    did not write one within ``timeout``; then the process is killed and its
    output (what it appended to ``log``, a temporary file when none is given) is returned.
    """
    if str(PYDIR) not in sys.path:
        sys.path.insert(0, str(PYDIR))
    from cohort.bootstrap import _read_line as read_ready_line  # the line of cohortd's --ready-fd

    scheme = listen.split("://", 1)[0] + "://"
    if log is None:
        # a file, never a pipe: a pipe nobody reads blocks cohortd once 64 KiB of log fill it
        log = tempfile.TemporaryFile("w+")
    begin = os.fstat(log.fileno()).st_size
    r, w = os.pipe()
    try:
        p = subprocess.Popen([str(BIN / "cohortd"), "--listen", listen, "--ready-fd", str(w), *argv],
                             env=env or base_env(), stdout=log,
                             stderr=subprocess.STDOUT, text=True, start_new_session=True, pass_fds=(w,))
    finally:
        os.close(w)
    _started.append(p)
    try:
        url = read_ready_line(r, timeout)
    finally:
        os.close(r)
    if url.startswith(scheme):
        return p, url, ""
    kill_tree(p)
    p.wait()
    end = os.fstat(log.fileno()).st_size
    out = os.pread(log.fileno(), max(0, end - begin), begin).decode(errors="replace")
    # What a cohortd that is not the caller's wrote is not left in its log.
    os.ftruncate(log.fileno(), begin)
    os.lseek(log.fileno(), begin, os.SEEK_SET)
    return p, "", out


def start_cohortd(*args: str, env: Optional[dict[str, str]] = None, timeout: float = 20.0,
                  listen: str = "tcp://127.0.0.1:0", log: Optional[IO[str]] = None
                  ) -> tuple[subprocess.Popen, str, list[int]]:
    """A cohortd on a loopback port the kernel chose, once it listens: (its process, its URL, ports).

    ``--listen tcp://127.0.0.1:0 --ready-fd``: cohortd writes its URL when it
    is bound. A port chosen here (``free_port``) can be taken by another
    process before cohortd binds it, and a sleep is no proof that it is up.
    ``args`` are cohortd's further options; each ``{port}`` in them becomes a
    free port of its own (for ``--http``, ``--torch-store``: listeners the
    ready line does not name), and when one of those was taken in between
    (cohortd exits "Address already in use") cohortd is started again with
    new ones, at most three times. ``ports`` are those put in, in order.

    ``listen`` is another URL with port 0 (``tls+tcp://127.0.0.1:0``);
    the URL returned has its scheme. cohortd's standard output and error go
    to a pipe, or to ``log`` (a regular file opened for reading and writing) for a
    test that reads them or a cohortd that logs much; the output of an
    attempt that is started again is cut from ``log``. Every listener
    (``--http``, ``--torch-store``) is bound before the ready line is
    written (server/front/server.c).
    """
    for attempt in range(3):
        ports: list[int] = []

        def fill(a: str) -> str:
            while "{port}" in a:
                ports.append(free_port())
                a = a.replace("{port}", str(ports[-1]), 1)
            return a

        argv = [fill(a) for a in args]
        p, url, out = _spawn_cohortd(listen, argv, env, timeout, log)
        if url:
            return p, url, ports
        if "Address already in use" not in out or not ports or attempt == 2:
            raise AssertionError(f"cohortd did not start within {timeout:g} s: {out[-2000:]}")
    raise AssertionError("unreachable")


def restart_cohortd(url: str, *args: str, ports: Sequence[int], env: Optional[dict[str, str]] = None,
                    timeout: float = 20.0, log: Optional[IO[str]] = None) -> subprocess.Popen:
    """cohortd again on the addresses of an earlier ``start_cohortd``: its process, once it listens.

    ``url`` and ``ports`` are what ``start_cohortd`` returned, ``args`` the
    same options (``{port}`` becomes ``ports``, in order). For a test of a
    coordinator restart whose clients reconnect to the address they had:
    the same ports are the scenario, so a port taken in between fails the
    start (no retry, unlike ``start_cohortd``).
    """
    wanted = sum(a.count("{port}") for a in args)
    assert wanted == len(ports), f"{len(ports)} ports for the {wanted} {{port}} in {args}"
    left = list(ports)

    def fill(a: str) -> str:
        while "{port}" in a:
            a = a.replace("{port}", str(left.pop(0)), 1)
        return a

    p, got, out = _spawn_cohortd(url, [fill(a) for a in args], env, timeout, log)
    if got != url:
        kill_tree(p)
        raise AssertionError(f"cohortd did not start again at {url} within {timeout:g} s: {got} {out[-2000:]}")
    return p


def joiners_waiting(http_port: int) -> int:
    """Processes waiting to join an elastic job, by the /metrics of the cohortd on ``http_port`` (0 when it
    does not answer)."""
    try:
        with urllib.request.urlopen(f"http://127.0.0.1:{http_port}/metrics", timeout=5) as r:
            text = r.read().decode()
    except OSError:
        return 0
    return sum(int(float(line.split()[-1])) for line in text.splitlines()
               if line.startswith("cohort_elastic_joiners_waiting"))


def finish(procs: Sequence[subprocess.Popen], timeout: float,
           abort_if: Optional[Callable[[Proc], bool]] = None) -> list[Proc]:
    """Waits for every process (bounded); kills the stragglers by PID.

    ``abort_if(proc)``, true for a finished process, kills the ones not
    finished yet at once (their job cannot go on).
    """
    t0 = time.monotonic()
    out = []
    abort = False
    for i, p in enumerate(procs):
        left = max(0.1, timeout - (time.monotonic() - t0))
        if abort:
            kill_tree(p)
        try:
            text, _ = p.communicate(timeout=left)
        except subprocess.TimeoutExpired:
            kill_tree(p)
            try:
                text, _ = p.communicate(timeout=30)
            except subprocess.TimeoutExpired:  # a process we did not see still holds the pipe
                p.stdout.close()
                p.wait()
                text = "[test harness: the output pipe stayed open after the kill]"
            text += f"\n[test harness: killed after {timeout:.0f} s]"
        out.append(Proc(i, p.returncode, text, time.monotonic() - t0, _parse(text)))
        if abort_if is not None and not abort and abort_if(out[-1]):
            abort = True
    return out


def run_one(argv: Sequence[str], timeout: float = 240, env: Optional[dict[str, str]] = None) -> Proc:
    """Runs one process (a launcher, say, with its ranks) to the end, bounded."""
    [p] = finish([start(argv, env if env is not None else base_env())], timeout)
    return p


def _descendants(pid: int) -> list[int]:
    """The processes below ``pid`` now (children first found by /proc's parent links)."""
    parent: dict[int, list[int]] = {}
    for d in os.listdir("/proc"):
        if not d.isdigit():
            continue
        try:
            with open(f"/proc/{d}/stat") as f:
                ppid = int(f.read().rsplit(")", 1)[1].split()[1])
        except (OSError, IndexError, ValueError):
            continue
        parent.setdefault(ppid, []).append(int(d))
    out, todo = [], [pid]
    while todo:
        for c in parent.get(todo.pop(), []):
            out.append(c)
            todo.append(c)
    return out


def kill_tree(p: subprocess.Popen) -> None:
    """Kills a process we started, its session, and every process below it.

    Launchers such as torchrun start their workers in sessions of their
    own: those are found through /proc before anything is killed (once
    their parent is gone they belong to init) and killed by PID.
    """
    below = _descendants(p.pid)
    try:
        os.killpg(p.pid, signal.SIGKILL)
    except ProcessLookupError:
        pass
    try:
        p.kill()
    except ProcessLookupError:
        pass
    for pid in below:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass


def run_ranks(script: str | pathlib.Path, world: int, args: Sequence[str] = (), timeout: float = 120,
              env: Optional[dict[str, str]] = None) -> list[Proc]:
    """Runs ``world`` ranks of a worker script with torchrun's variables.

    Rank 0 binds MASTER_PORT for torch's store. The port is free when
    chosen, but another program on the machine may take it before rank 0
    binds it: a job whose rank 0 failed with EADDRINUSE is run again on
    another port (at most twice), and nothing else is retried.
    """
    for attempt in range(3):
        port = free_port()
        procs = []
        for r in range(world):
            e = base_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, LOCAL_WORLD_SIZE=world,
                         MASTER_ADDR="127.0.0.1", MASTER_PORT=port)
            if env:
                e.update(env)
            procs.append(start([PYTHON, str(script), *args], e))
        done = finish(procs, timeout, abort_if=_lost_port if attempt < 2 else None)
        if not _lost_port(done[0]) or attempt == 2:
            return done
    return done


def _lost_port(p: Proc) -> bool:
    """Rank 0 could not bind torch's store port (someone took it)."""
    return p.rank == 0 and p.returncode != 0 and "EADDRINUSE" in p.out


def exited_ok(p: Proc) -> bool:
    """Exit 0, or gloo's own teardown abort after the work was done.

    torch 2.15's gloo backend occasionally aborts a rank while it exits
    ("terminate called without an active exception", SIGABRT) after every
    collective completed; seen in about one gloo job in 20 here, never
    with cohort. A gloo run that did its work and died so is not a
    failure of what the test checks; its results are still asserted.
    """
    if p.returncode == 0:
        return True
    return p.returncode in (-6, 134) and "terminate called without an active exception" in p.out


def describe(procs: Sequence[Proc]) -> str:
    return "\n".join(f"--- rank {p.rank} (exit {p.returncode}) ---\n{p.out[-3000:]}" for p in procs)


def compared_jobs(tmp_path_factory, worker: str, prefix: str = ""):
    """A function (backend, scenario, world) -> (records by rank, saved by rank) that runs
    workers/<worker> once per (backend, scenario, world) in the session.

    The worker is one of the cohort-against-gloo comparisons (features.py,
    p2p.py): it prints one JSON record per feature and {"done": true}, and
    saves what it produced to OUTDIR/rank<r>.pt. Every rank must exit 0
    (gloo: or its known teardown abort, see exited_ok) after reporting done.
    """
    cache: dict = {}

    def run(backend: str, scenario: str, world: int):
        import torch  # only the jobs that save tensors need it

        key = (backend, scenario, world)
        if key not in cache:
            out = tmp_path_factory.mktemp(f"{prefix}{backend}-{scenario}-{world}")
            procs = run_ranks(WORKERS / worker, world, [backend, scenario, str(out)], timeout=240)
            ok = (lambda p: p.returncode == 0) if backend == "cohort" else exited_ok
            assert all(ok(p) and any(r.get("done") for r in p.records) for p in procs), describe(procs)
            recs = [{r["feature"]: r for r in p.records if "feature" in r} for p in procs]
            saved = [torch.load(pathlib.Path(out) / f"rank{p.rank}.pt") for p in procs]
            cache[key] = (recs, saved)
        return cache[key]

    return run


def compared_outputs(job, backend: str, scenario: str, world: int, name: str, must_pass: bool = True):
    """Feature name's records and saved outputs by rank, of job(backend, scenario, world);
    with must_pass, fails the test naming every rank on which the feature failed."""
    recs, saved = job(backend, scenario, world)
    rs = [r[name] for r in recs]
    if must_pass:
        bad = [f"rank {r['rank']}: {r['why'][-2500:]}" for r in rs if not r["ok"]]
        assert not bad, f"{name} on {backend}, {world} ranks:\n" + "\n".join(bad)
    return rs, [s.get(name) for s in saved]


@pytest.fixture(scope="session", autouse=True)
def _nothing_left_behind():
    yield
    alive = [p.pid for p in _started if p.poll() is None]
    for p in _started:
        if p.poll() is None:
            kill_tree(p)
    assert not alive, f"processes left running after the tests: {alive}"


@pytest.fixture(scope="session")
def built() -> pathlib.Path:
    """The build tree: cohortd, cohort and libcohort must exist."""
    for f in (BIN / "cohortd", BIN / "cohort", BIN.parent / "lib" / "libcohort.so"):
        assert f.exists(), f"{f} is missing: run `make` first"
    return BIN


@pytest.fixture(scope="session")
def digits(built) -> pathlib.Path:
    """The digits data set of the examples, fetched once."""
    path = REPO / "build" / "data" / "digits.csv"
    subprocess.run([str(REPO / "tools" / "fetch-digits.sh"), str(path)], check=True, timeout=300)
    return path


def private_coordinators() -> list[int]:
    """PIDs of private coordinators (started by a rank 0 with --exit-when-idle)."""
    pids = []
    for d in pathlib.Path("/proc").iterdir():
        if not d.name.isdigit():
            continue
        try:
            argv = (d / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if argv and argv[0].endswith(b"cohortd") and b"--exit-when-idle" in argv:
            pids.append(int(d.name))
    return pids


@pytest.fixture(scope="session", autouse=True)
def _private_coordinators_exit():
    before = set(private_coordinators())
    yield
    deadline = time.monotonic() + 30
    while time.monotonic() < deadline:
        left = set(private_coordinators()) - before
        if not left:
            return
        time.sleep(0.5)
    for pid in left:
        os.kill(pid, signal.SIGKILL)
    pytest.fail(f"private coordinators still running 30 s after the tests: {sorted(left)}")
