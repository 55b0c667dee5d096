"""Simulated hosts for multi-host tests: network namespaces on a bridge.

A :class:`Cluster` builds ``n_hosts`` Linux network namespaces, each one a
"host" with its own ``eth0`` address on a private /24, its own loopback,
its own ``/dev/shm`` (so ranks on two hosts can never meet through shared
memory and the TCP path is what is measured) and its own ``/etc/hosts``.
The bridge that joins them lives in a further namespace of its own, so
nothing is added to the machine's own network: the only trace outside the
namespaces is a temporary directory, and both go away on exit.

Faults, without netem (this kernel has none):

- ``host.link_down()`` / ``link_up()``: the host's cable is pulled (its
  processes live on, cut off);
- ``cluster.partition(a, b)`` / ``cluster.isolate(a)`` / ``heal()``:
  nftables drop rules inside the hosts' namespaces;
- ``cluster.kill_host(h)``: every process started on it is SIGKILLed and
  its link goes down, a machine that vanished;
- ``delayproxy.py`` (a subprocess the test runs on a host) adds latency
  to one TCP service.

Every process a test starts through :meth:`Host.spawn` is tracked and
SIGKILLed (its whole process group) on exit, by PID; nothing else is ever
signalled. Needs root, ``ip`` (iproute2) and ``nft`` (nftables); without
them :func:`require` skips the test with the reason.
"""

from __future__ import annotations

import atexit
import itertools
import os
import shlex
import shutil
import signal
import subprocess
import tempfile
import time
from pathlib import Path
from typing import IO, Iterable, Mapping, Sequence

_counter = itertools.count()
_live: list["Cluster"] = []

# A minimal environment for processes on a host: the caller adds what the
# program needs. PATH and the sanitizer/library variables pass through so
# that ASan builds and COHORT_LIBRARY work.
_PASS_ENV = (
    "PATH",
    "HOME",
    "LANG",
    "LC_ALL",
    "TMPDIR",
    "ASAN_OPTIONS",
    "UBSAN_OPTIONS",
    "LSAN_OPTIONS",
    "LD_LIBRARY_PATH",
    "COHORT_LIBRARY",
    "PYTHONPATH",
)


def missing() -> str | None:
    """Why multi-host tests cannot run here, or None if they can."""
    if os.geteuid() != 0:
        return "needs root (network namespaces)"
    for tool in ("ip", "nft", "mount", "unshare", "hostname"):
        if shutil.which(tool) is None:
            return f"needs '{tool}' (apt-get install iproute2 nftables)"
    return None


def require() -> None:
    """pytest.skip with a clear line when the machine cannot host them."""
    why = missing()
    if why is not None:
        import pytest

        pytest.skip(f"multi-host tests skipped: {why}")


def _sh(*argv: str, check: bool = True, quiet: bool = False) -> str:
    r = subprocess.run(list(argv), capture_output=True, text=True)
    if check and r.returncode != 0:
        raise RuntimeError(
            f"{shlex.join(argv)} failed ({r.returncode}): "
            f"{r.stderr.strip() or r.stdout.strip()}"
        )
    return r.stdout


class Proc(subprocess.Popen):
    """A process on a host: its output goes to ``log_path``."""

    log_path: Path
    host: "Host"

    def output(self) -> str:
        """Everything it wrote so far (stdout and stderr together)."""
        try:
            return self.log_path.read_text(errors="replace")
        except FileNotFoundError:
            return ""

    def wait_for(self, text: str, timeout: float) -> bool:
        """Waits until ``text`` appears in its output; False on timeout."""
        end = time.monotonic() + timeout
        while time.monotonic() < end:
            if text in self.output():
                return True
            if self.poll() is not None:
                return text in self.output()
            time.sleep(0.05)
        return False


class Host:
    """One simulated machine: a network namespace with its own address."""

    def __init__(self, cluster: "Cluster", index: int) -> None:
        self.cluster = cluster
        self.index = index
        self.name = f"h{index}"
        self.ns = f"{cluster.tag}-{self.name}"
        self.addr = f"{cluster.prefix}.{index + 1}"
        self.dir = cluster.dir / self.name
        self.shm = self.dir / "shm"
        self.hosts_file = self.dir / "hosts"
        self.procs: list[Proc] = []
        self._entries: list[str] = []

    # --- processes ------------------------------------------------------

    def _wrap(self, argv: Sequence[str]) -> list[str]:
        # ip netns exec gives each command a mount namespace of its own;
        # the host's /dev/shm and /etc/hosts are bind-mounted into it so
        # every process of this host sees the same ones.
        # A UTS namespace gives it the host's name as its hostname.
        script = (
            'hostname "$3" && mount --bind "$1" /dev/shm '
            '&& mount --bind "$2" /etc/hosts && shift 3 && exec "$@"'
        )
        return [
            "ip", "netns", "exec", self.ns, "unshare", "--uts", "sh", "-c",
            script, "sh", str(self.shm), str(self.hosts_file), self.name,
            *argv,
        ]  # fmt: skip

    def _env(self, env: Mapping[str, str] | None) -> dict[str, str]:
        out = {k: os.environ[k] for k in _PASS_ENV if k in os.environ}
        out["HOSTNAME"] = self.name
        if env:
            out.update(env)
        return out

    def spawn(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        cwd: str | os.PathLike[str] | None = None,
        name: str | None = None,
        stdin: int | IO[bytes] | None = subprocess.DEVNULL,
    ) -> Proc:
        """Starts argv on this host; output to a log file (``p.log_path``).

        The environment is a minimal one (PATH, HOME...) plus ``env``:
        nothing of the test runner's COHORT_* leaks in.
        """
        n = next(_counter)
        label = name or Path(argv[0]).name
        log = self.dir / f"{n:03d}-{label}.log"
        with open(log, "wb") as f:
            p = Proc(
                self._wrap([str(a) for a in argv]),
                env=self._env(env),
                cwd=cwd,
                stdin=stdin,
                stdout=f,
                stderr=subprocess.STDOUT,
                start_new_session=True,
            )
        p.log_path = log
        p.host = self
        self.procs.append(p)
        return p

    def run(
        self,
        argv: Sequence[str],
        env: Mapping[str, str] | None = None,
        timeout: float = 60,
        cwd: str | os.PathLike[str] | None = None,
    ) -> subprocess.CompletedProcess[str]:
        """Runs argv on this host to completion (killed after timeout)."""
        p = self.spawn(argv, env=env, cwd=cwd)
        try:
            p.wait(timeout=timeout)
        except subprocess.TimeoutExpired:
            _kill(p)
            raise
        return subprocess.CompletedProcess(
            p.args, p.returncode, p.output(), ""
        )

    def ip(self, *args: str, check: bool = True) -> str:
        """Runs ``ip`` inside this host's namespace."""
        return _sh("ip", "-n", self.ns, *args, check=check)

    def kill_all(self, sig: int = signal.SIGKILL) -> None:
        """Signals every process this host started (by PID, whole group)."""
        for p in self.procs:
            if p.poll() is None:
                _kill(p, sig)

    # --- network --------------------------------------------------------

    def add_hosts_entry(self, name: str, addr: str) -> None:
        """Makes ``name`` resolve to ``addr`` on this host (/etc/hosts)."""
        self._entries.append(f"{addr}\t{name}")
        self._write_hosts()

    def _write_hosts(self) -> None:
        lines = ["127.0.0.1\tlocalhost", f"{self.addr}\t{self.name}"]
        for h in self.cluster.hosts:
            if h is not self:
                lines.append(f"{h.addr}\t{h.name}")
        self.hosts_file.write_text("\n".join(lines + self._entries) + "\n")

    def link_down(self) -> None:
        """Pulls the cable: eth0 goes down; the processes live on."""
        self.ip("link", "set", "eth0", "down")

    def link_up(self) -> None:
        """Plugs it back."""
        self.ip("link", "set", "eth0", "up")

    def _nft(self, rules: str) -> None:
        subprocess.run(
            ["ip", "netns", "exec", self.ns, "nft", "-f", "-"],
            input=rules,
            text=True,
            check=True,
            capture_output=True,
        )


class Cluster:
    """``n_hosts`` hosts on one bridge; a context manager that cleans up."""

    def __init__(self, n_hosts: int, name: str = "t") -> None:
        if not 1 <= n_hosts <= 32:
            raise ValueError("1..32 hosts")
        n = next(_counter)
        pid = os.getpid()
        # interface names are at most 15 bytes: keep the tag short
        self.tag = f"c{name[:3]}{pid % 100000}{n}"
        self.prefix = f"10.{200 + pid % 50}.{n % 250}"
        self.dir = Path(tempfile.mkdtemp(prefix=f"cohort-{self.tag}-"))
        self.switch = f"{self.tag}-sw"
        self.hosts = [Host(self, i) for i in range(n_hosts)]
        self._up = False

    def __enter__(self) -> "Cluster":
        require()
        _live.append(self)
        try:
            self._build()
        except BaseException:
            self.close()
            raise
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()

    def _build(self) -> None:
        self._up = True
        _sh("ip", "netns", "add", self.switch)
        sw = ["ip", "-n", self.switch]
        _sh(*sw, "link", "add", "br0", "type", "bridge")
        _sh(*sw, "link", "set", "br0", "up")
        _sh(*sw, "link", "set", "lo", "up")
        for h in self.hosts:
            h.dir.mkdir(parents=True)
            h.shm.mkdir(mode=0o1777)
            os.chmod(h.shm, 0o1777)
            _sh("ip", "netns", "add", h.ns)
            port = f"p{h.index}"
            _sh(*sw, "link", "add", port, "type", "veth", "peer", "name",
                "eth0", "netns", h.ns)  # fmt: skip
            _sh(*sw, "link", "set", port, "master", "br0", "up")
            h.ip("addr", "add", f"{h.addr}/24", "dev", "eth0")
            h.ip("link", "set", "eth0", "up")
            h.ip("link", "set", "lo", "up")
            h._nft(
                "table inet hostnet {\n"
                "  set blocked { type ipv4_addr; }\n"
                "  chain input { type filter hook input priority 0;\n"
                "    ip saddr @blocked drop; }\n"
                "  chain output { type filter hook output priority 0;\n"
                "    ip daddr @blocked drop; }\n"
                "}\n"
            )
        for h in self.hosts:
            h._write_hosts()
        # no STP on the bridge: its ports forward as soon as they are up

    # --- faults ---------------------------------------------------------

    def partition(self, a: Host, b: Host) -> None:
        """Drops every packet between a and b (both directions)."""
        a._nft(f"add element inet hostnet blocked {{ {b.addr} }}\n")
        b._nft(f"add element inet hostnet blocked {{ {a.addr} }}\n")

    def isolate(self, a: Host) -> None:
        """Partitions a from every other host."""
        for h in self.hosts:
            if h is not a:
                self.partition(a, h)

    def heal(self) -> None:
        """Removes every partition."""
        for h in self.hosts:
            h._nft("flush set inet hostnet blocked\n")

    def kill_host(self, h: Host) -> None:
        """The machine vanishes: its processes die, its link goes down."""
        h.link_down()
        h.kill_all()

    # --- cleanup --------------------------------------------------------

    def procs(self) -> Iterable[Proc]:
        for h in self.hosts:
            yield from h.procs

    def close(self) -> None:
        """Kills what the hosts started, removes namespaces and files."""
        for p in self.procs():
            if p.poll() is None:
                _kill(p)
        for p in self.procs():
            try:
                p.wait(timeout=10)
            except subprocess.TimeoutExpired:
                pass
        if self._up:
            for h in self.hosts:
                _sh("ip", "netns", "del", h.ns, check=False)
            _sh("ip", "netns", "del", self.switch, check=False)
            self._up = False
        if os.environ.get("COHORT_KEEP_HOSTS") is None:
            shutil.rmtree(self.dir, ignore_errors=True)
        if self in _live:
            _live.remove(self)


def _kill(p: subprocess.Popen, sig: int = signal.SIGKILL) -> None:
    # the process leads its own group (start_new_session): its children
    # (workers of cohort run) go with it; only PIDs this module started
    try:
        os.killpg(p.pid, sig)
    except ProcessLookupError:
        pass
    except PermissionError:
        p.send_signal(sig)


@atexit.register
def _cleanup_all() -> None:
    for c in list(_live):
        c.close()
