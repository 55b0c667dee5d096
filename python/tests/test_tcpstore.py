"""torch's own TCPStore client against cohortd's TCPStore listener.

cohortd --torch-store serves torch's store protocol on top of its KV: the
real torch.distributed.TCPStore (is_master=False) must see every store
operation behave as against torch's own server, an unmodified gloo job must
rendezvous through it (explicit store, env://, torchrun's c10d rendezvous),
two listeners must keep two jobs apart, and keys must survive a coordinator
restart (the journal).
"""

import datetime
import os
import pathlib
import signal
import subprocess
import sys
import time
from typing import Optional

import pytest
import torch.distributed as dist

from conftest import (PYTHON, WORKERS, base_env, describe, exited_ok, finish, restart_cohortd, start,
                      start_cohortd)

T = datetime.timedelta(seconds=10)


def terminate(p: subprocess.Popen) -> None:
    """Ends a cohortd we started: SIGTERM (it drains and stops), SIGKILL
    after 10 s."""
    if p.poll() is None:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


class Cohortd:
    """A cohortd with TCPStore listeners, bounded and killed by PID.

    ``ports`` are its two TCPStore listeners (jobs "jobA", "jobB"), ``url``
    its coordinator URL. Its log goes to the file COHORTD_TEST_LOG names
    (appended), if any.
    """

    def __init__(self, *extra: str, state_dir: Optional[pathlib.Path] = None):
        self.args = ["--torch-store", "jobA@127.0.0.1:{port}", "--torch-store", "jobB@127.0.0.1:{port}",
                     "--log-level", "warn", *extra]
        if state_dir:
            self.args += ["--state-dir", str(state_dir)]
        name = os.environ.get("COHORTD_TEST_LOG")
        self.log = open(name, "a+") if name else None
        self.p, self.url, self.ports = start_cohortd(*self.args, log=self.log)

    def restart(self) -> None:
        """cohortd again on the same coordinator and TCPStore ports (it was
        stopped): its clients reconnect to the address they had, which is
        what a restart test tests, so a port taken meanwhile fails it
        instead of moving it (restart_cohortd)."""
        self.p = restart_cohortd(self.url, *self.args, ports=self.ports, log=self.log)

    def kill9(self):
        self.p.send_signal(signal.SIGKILL)
        self.p.wait(10)

    def stop(self) -> None:
        terminate(self.p)
        if self.log is not None:
            self.log.close()


@pytest.fixture
def cohortd(built):
    c = Cohortd()
    yield c
    c.stop()


def client(port, timeout=T):
    return dist.TCPStore("127.0.0.1", port, is_master=False, timeout=timeout)


def test_every_store_operation(cohortd):
    s = client(cohortd.ports[0])
    s.set("k", "v")
    assert s.get("k") == b"v"
    assert s.add("c", 5) == 5 and s.add("c", -2) == 3 and s.get("c") == b"3"
    # compare_set, the four cases of torch's server
    assert s.compare_set("n", "", "x") == b"x"            # missing, expected empty: set
    assert s.compare_set("m", "exp", "y") == b"exp"       # missing, expected given: unchanged
    assert not s.check(["m"])
    assert s.compare_set("n", "x", "z") == b"z"           # present, equal: swapped
    assert s.compare_set("n", "q", "w") == b"z"           # present, different: current
    assert s.check(["k", "n"]) and not s.check(["k", "absent"])
    s.append("a", "1")
    s.append("a", "23")
    assert s.get("a") == b"123"
    assert s.multi_get(["k", "a"]) == [b"v", b"123"]
    s.multi_set(["m1", "m2"], ["x1", "x2"])
    assert s.multi_get(["m1", "m2"]) == [b"x1", b"x2"]
    assert s.delete_key("m1") and not s.delete_key("m1")
    assert s.num_keys() == 5
    assert sorted(s.list_keys()) == ["a", "c", "k", "m2", "n"]  # the client strips the "/"
    big = os.urandom(3 << 20)
    s.set("big", big)
    assert s.get("big") == big


def test_wait_released_by_another_client_and_timeout(cohortd):
    a, b = client(cohortd.ports[0]), client(cohortd.ports[0])
    import threading

    got = []
    t = threading.Thread(target=lambda: got.append(a.get("later")))  # get = WAIT then GET
    t.start()
    time.sleep(0.3)
    assert not got
    b.set("later", "here")
    t.join(10)
    assert got == [b"here"]
    # A wait that times out sends CANCEL_WAIT; the connection stays usable.
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="wait timeout"):
        a.wait(["never"], datetime.timedelta(milliseconds=300))
    assert time.monotonic() - t0 < 5
    a.set("after", "1")
    assert a.get("after") == b"1"
    a.wait(["after"], datetime.timedelta(seconds=1))


def test_queues(cohortd):
    s = client(cohortd.ports[0])
    s.queue_push("q", "one")
    s.queue_push("q", b"two")
    assert s.queue_len("q") == 2
    assert s.queue_pop("q") == b"one" and s.queue_pop("q") == b"two"
    assert s.queue_len("q") == 0
    with pytest.raises(dist.QueueEmptyError):
        s.queue_pop("q", block=False)
    # a blocking pop waits for the push of another client
    import threading

    o, got = client(cohortd.ports[0]), []
    t = threading.Thread(target=lambda: got.append(o.queue_pop("q2")))
    t.start()
    time.sleep(0.3)
    s.queue_push("q2", "late")
    t.join(10)
    assert got == [b"late"]


def test_two_listeners_two_jobs(cohortd):
    a, b = client(cohortd.ports[0]), client(cohortd.ports[1])
    a.set("secret", "A")
    b.set("other", "B")
    assert not b.check(["secret"]) and not a.check(["other"])
    assert "secret" not in b.list_keys() and b.num_keys() == 1


def test_keys_survive_a_coordinator_restart(tmp_path, built):
    c = Cohortd(state_dir=tmp_path / "state")
    try:
        s = client(c.ports[0])
        s.set("kept", "yes")
        assert s.add("n", 41) == 41
        time.sleep(0.3)  # past the batched fsync (100 ms)
        c.kill9()
        c.restart()
        s2 = client(c.ports[0])
        assert s2.get("kept") == b"yes"
        assert s2.add("n", 1) == 42
    finally:
        c.stop()


def gloo_job(argv_of_rank, world, env_of_rank=lambda r: {}):
    procs = []
    for r in range(world):
        e = base_env(RANK=r, WORLD_SIZE=world, LOCAL_RANK=r, **env_of_rank(r))
        procs.append(start([PYTHON, str(WORKERS / "store_gloo.py"), *argv_of_rank(r)], e))
    return finish(procs, 120)


def check_all_reduced(procs, world):
    recs = [r for p in procs for r in p.records if "ok" in r]
    assert sorted(r["rank"] for r in recs) == list(range(world)), describe(procs)
    assert all(r["ok"] and r["world"] == world for r in recs), recs


def test_init_process_group_with_an_explicit_store(cohortd):
    procs = gloo_job(lambda r: ["explicit", "127.0.0.1", str(cohortd.ports[0])], 2)
    assert all(exited_ok(p) for p in procs), describe(procs)
    check_all_reduced(procs, 2)


def test_env_init_with_agent_store(cohortd):
    """env:// with MASTER_ADDR/PORT at the listener and
    TORCHELASTIC_USE_AGENT_STORE=True: the process group's store is
    cohortd's (its keys are there)."""
    env = {"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(cohortd.ports[0]), "TORCHELASTIC_USE_AGENT_STORE": "True"}
    procs = gloo_job(lambda r: ["env"], 2, lambda r: env)
    assert all(exited_ok(p) for p in procs), describe(procs)
    check_all_reduced(procs, 2)
    keys = client(cohortd.ports[0]).list_keys()
    assert any(k.startswith("default_pg/") for k in keys), keys


def test_torchrun_c10d_rendezvous(cohortd):
    """torchrun's c10d rendezvous runs in cohortd's store, but the ranks'
    process group does not: rank 0's agent hands them a TCPStore server of
    its own (docs/pytorch.md says so)."""
    argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--rdzv-backend", "c10d", "--rdzv-endpoint", f"127.0.0.1:{cohortd.ports[1]}",
            "--rdzv-conf", "is_host=false", "--rdzv-id", "job-1", str(WORKERS / "store_gloo.py"), "torchrun"]
    [p] = finish([start(argv, base_env())], 180)
    assert exited_ok(p) or "terminate called without an active exception" in p.out, p.out[-4000:]
    check_all_reduced([p], 2)
    s = client(cohortd.ports[1])
    keys = s.list_keys()
    assert "torch.rendezvous.job-1" in keys, keys
    assert not any(k.startswith("default_pg/") for k in keys), keys
    assert int(s.get("torch.rendezvous.job-1.0/MASTER_PORT")) != cohortd.ports[1]


def test_torchrun_static_rendezvous_cannot_use_the_listener(cohortd):
    """torchrun --master-port at the listener: rank 0's agent binds the
    port itself and fails (docs/pytorch.md)."""
    argv = [PYTHON, "-m", "torch.distributed.run", "--nnodes", "1", "--nproc-per-node", "2",
            "--master-addr", "127.0.0.1", "--master-port", str(cohortd.ports[0]),
            str(WORKERS / "store_gloo.py"), "torchrun"]
    [p] = finish([start(argv, base_env())], 120)
    assert p.returncode != 0 and "EADDRINUSE" in p.out, p.out[-4000:]


def test_bad_input_closes_only_that_connection(built):
    import socket
    import struct

    c = Cohortd("--torch-store-timeout", "500")
    try:
        good = client(c.ports[0])
        good.set("ok", "1")

        def conn():
            return socket.create_connection(("127.0.0.1", c.ports[0]), timeout=5)

        def closed(sk, wait=3.0):
            sk.settimeout(wait)
            try:
                return sk.recv(1) == b""
            except (ConnectionResetError, BrokenPipeError):
                return True
            except socket.timeout:
                return False

        valid = b"\x00" + struct.pack("<I", 0x3C85F7CE)
        cases = {
            "garbage": b"GET / HTTP/1.1\r\n\r\n",
            "wrong magic": b"\x00" + struct.pack("<I", 0xDEADBEEF),
            "unknown query": valid + b"\x63",
            "huge key": valid + b"\x01" + struct.pack("<Q", 1 << 40),
            "huge value": valid + b"\x01" + struct.pack("<Q", 1) + b"k" + struct.pack("<Q", 1 << 40),
            "too many keys": valid + b"\x05" + struct.pack("<Q", 1 << 30),
        }
        for name, data in cases.items():
            sk = conn()
            sk.sendall(data)
            assert closed(sk), f"{name}: connection not closed"
            sk.close()
        # a partial request is closed after --torch-store-timeout, an idle
        # validated connection is not
        partial, idle = conn(), conn()
        partial.sendall(valid + b"\x01" + struct.pack("<Q", 10) + b"abc")
        idle.sendall(valid)
        assert closed(partial, 3.0), "partial request not closed"
        assert not closed(idle, 1.0), "an idle connection was closed"
        # the well-behaved client never noticed
        assert good.get("ok") == b"1"
        good.set("still", "fine")
        assert good.get("still") == b"fine"
    finally:
        c.stop()


def test_store_barrier(cohortd):
    """torch 2.15's TCPStore.barrier(key, world_size): the last arrival
    releases the others; a barrier that times out is cancelled and the
    connection goes on."""
    import threading

    clients = [client(cohortd.ports[0]) for _ in range(3)]
    done = []

    def enter(s, i):
        s.barrier("b1", 3, datetime.timedelta(seconds=10))
        done.append(i)

    ts = [threading.Thread(target=enter, args=(clients[i], i)) for i in range(2)]
    [t.start() for t in ts]
    time.sleep(0.3)
    assert not done  # two of three: still waiting
    enter(clients[2], 2)
    [t.join(10) for t in ts]
    assert sorted(done) == [0, 1, 2]
    with pytest.raises(dist.DistStoreError, match="barrier timeout"):
        clients[0].barrier("b2", 2, datetime.timedelta(milliseconds=300))
    clients[0].set("after", "ok")
    assert clients[0].get("after") == b"ok"



@pytest.mark.skipif(os.geteuid() != 0, reason="needs root to act as another user")
def test_a_stranger_of_this_host_gets_nothing(cohortd):
    """issue 22: torch's own TCPStore client (unmodified), as another user
    of the host, gets nothing from the listener: refused at its first
    query, nothing read, nothing changed; the job's own client (the same
    user as cohortd) goes on. The stranger's socket is made with the
    effective uid 65534 (the kernel records its owner then)."""
    own = client(cohortd.ports[0])
    own.set("owned", "mine")
    got = []
    os.setegid(65534)
    os.seteuid(65534)
    try:
        try:
            s = client(cohortd.ports[0], datetime.timedelta(seconds=5))
            got.append(s.list_keys())
            got.append(s.get("owned"))
            s.set("owned", "stolen")
            got.append("set")
        except (dist.DistNetworkError, dist.DistStoreError, RuntimeError) as e:
            refused = e
        else:
            refused = None
    finally:
        os.seteuid(0)
        os.setegid(0)
    assert refused is not None and not got, got
    assert own.get("owned") == b"mine"
    assert own.num_keys() == 1
