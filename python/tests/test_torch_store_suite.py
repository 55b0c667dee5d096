"""torch's client-side TCPStore cases, against cohortd and torch's own server.

The cases of torch's test/distributed/test_store.py that exercise a TCPStore
client against a server (StoreTestBase, TCPStoreTest and their libuv
variant, the multi-threaded wait, the interrupted wait, the store timeouts,
the agent store), written again here with torch 2.15's store operations
(list_keys, barrier) and the cases of issue 21 (a set followed at once by a
close, a queue push waking another client's blocking pop, an add on a
non-integer, a barrier of count <= 0, a value over the server's size
limit). Every case runs four times: against `cohortd --torch-store` and
against torch's own server (is_master=True), each with torch's libuv and
legacy implementations (use_libuv=True/False), so any difference between
cohortd and torch shows as a failing case.

A torch server is made without a world size, so that neither server holds
torch's "init/" key of waitForWorkers and key counts compare as they are.
"""

from __future__ import annotations

import datetime
import signal
import socket
import struct
import tempfile
import threading
import time
from concurrent.futures import ThreadPoolExecutor

import pytest
import torch.distributed as dist

from conftest import start_cohortd
from test_tcpstore import terminate

T = datetime.timedelta(seconds=10)
MAGIC = 0x3C85F7CE


class Server:
    """A TCPStore server: cohortd's listener or torch's own, with the
    implementation (libuv or legacy) the clients of the case use."""

    def __init__(self, kind: str, libuv: bool, *cohortd_args: str):
        self.kind, self.libuv = kind, libuv
        self.host = "127.0.0.1"
        self.proc = self.master = None
        if kind == "torch":
            self.master = dist.TCPStore(self.host, 0, is_master=True, wait_for_workers=False,
                                        timeout=T, use_libuv=libuv)
            self.port = self.master.port
            return
        # Its TCPStore listener on a port chosen at start, cohortd on one the
        # kernel chose; started again if the listener's port was taken.
        self.log = tempfile.NamedTemporaryFile("w+", prefix="cohortd-", suffix=".log")
        try:
            self.proc, _, [self.port] = start_cohortd("--torch-store", f"{self.host}:{{port}}", "--log-level", "warn",
                                                      *cohortd_args, log=self.log)
        except BaseException:
            self.log.close()
            raise

    def client(self, timeout: datetime.timedelta = T, **kw) -> dist.TCPStore:
        return dist.TCPStore(self.host, self.port, is_master=False, timeout=timeout,
                             use_libuv=self.libuv, **kw)

    def alive(self) -> bool:
        """The server still serves a new client."""
        c = self.client()
        c.set("__alive", "1")
        return c.get("__alive") == b"1"

    def said(self) -> str:
        """What cohortd logged (empty for torch's server)."""
        if self.proc is None:
            return ""
        self.log.seek(0)
        return self.log.read()

    def stop(self):
        if self.proc is not None:
            terminate(self.proc)
            self.log.close()
        self.master = None


SERVERS = [("cohortd", True), ("cohortd", False), ("torch", True), ("torch", False)]


@pytest.fixture(params=SERVERS, ids=[f"{k}-{'libuv' if u else 'legacy'}" for k, u in SERVERS])
def server(request, built):
    s = Server(*request.param)
    yield s
    s.stop()


@pytest.fixture
def store(server):
    s = server.client()
    s.set_timeout(datetime.timedelta(seconds=300))
    return s


def with_queues(s):
    """s, or a skip where the client has no queues (torch's legacy client
    raises NotImplementedError, as torch's own test expects)."""
    try:
        s.queue_push("test_queue_support", "1")
    except NotImplementedError:
        pytest.skip("this client implementation has no queues")
    return s


def joined(threads, timeout=30.0):
    """Joins every thread (bounded); True if all finished."""
    end = time.monotonic() + timeout
    for t in threads:
        t.join(max(0.0, end - time.monotonic()))
    return not any(t.is_alive() for t in threads)


# ---------------------------------------------------------------------------
# StoreTestBase
# ---------------------------------------------------------------------------


def test_set_get_check(store):
    for k, v in (("key", 1), ("key", 2), ("key", 3)):
        store.add(k, v)
    store.set("key0", "value0")
    store.add("key3", 1)
    store.set("key1", "value1")
    store.add("key3", 2)
    store.set("key2", "value2")
    for d in (3, 4, 5, 6):
        store.add("key3", d)
    assert store.num_keys() == 5
    assert store.get("key") == b"6"
    assert [store.get(k) for k in ("key0", "key1", "key2")] == [b"value0", b"value1", b"value2"]
    assert store.get("key3") == b"21"
    assert store.check(["key3"]) and not store.check(["Randomkey3"])
    store.set("-key3", "7")
    assert store.get("-key3") == b"7"
    store.delete_key("-key3")
    assert store.num_keys() == 5


def test_compare_set(store):
    # absent, a non-empty expected value: unchanged, the expected value back
    assert store.compare_set("cs_key0", "wrong_old_value", "new_value0") == b"wrong_old_value"
    store.set("cs_key0", "value0")
    assert store.get("cs_key0") == b"value0"
    # present, different: the current value back
    assert store.compare_set("cs_key0", "wrong_old_value", "new_value0") == b"value0"
    assert store.get("cs_key0") == b"value0"
    # present, equal: swapped
    assert store.compare_set("cs_key0", "value0", "new_value0") == b"new_value0"
    assert store.get("cs_key0") == b"new_value0"
    # absent, expected empty: set
    assert store.compare_set("cs_key1", "", "new_value1") == b"new_value1"
    assert store.get("cs_key1") == b"new_value1"


def test_simple_wait(store):
    with pytest.raises(RuntimeError, match="[t -i]imeout"):
        store.wait(["bad_key"], datetime.timedelta(seconds=0.25))
    store.add("good_key", 1)
    store.wait(["good_key"])


def test_append(store):
    assert store.has_extended_api()
    store.set("foo", "po")
    store.append("foo", "tato")
    store.append("bar", "po")
    store.append("bar", "tato")
    assert store.get("foo") == b"potato" and store.get("bar") == b"potato"


def test_queues(store):
    store = with_queues(store)
    assert not store.check(["foo"]) and store.queue_len("foo") == 0
    store.queue_push("foo", "1")
    store.queue_push("foo", "2")
    assert store.check(["foo"]) and store.queue_len("foo") == 2
    store.wait(["foo"])
    assert store.queue_pop("foo") == b"1" and store.queue_pop("foo") == b"2"
    assert not store.check(["foo"]) and store.queue_len("foo") == 0


def test_queues_nonblocking(store):
    store = with_queues(store)
    with pytest.raises(dist.QueueEmptyError, match="empty"):
        store.queue_pop("foo", block=False)
    store.queue_push("foo", "a")
    assert store.queue_pop("foo", block=False) == b"a"


def bidirectional(store) -> None:
    """Two clones talk through two queues, each popping what the other
    pushes (torch's test_queues_bidirectional)."""

    def worker_a():
        s = store.clone()
        s.queue_push("a", "a1")
        assert s.queue_pop("b") == b"b1"

    def worker_b():
        s = store.clone()
        assert s.queue_pop("a") == b"a1"
        s.queue_push("b", "b1")

    with ThreadPoolExecutor(max_workers=2) as pool:
        for f in [pool.submit(worker_a), pool.submit(worker_b)]:
            f.result(timeout=30)


def test_queues_bidirectional(store):
    store = with_queues(store)
    store.set_timeout(datetime.timedelta(seconds=20))
    bidirectional(store)


def test_queues_timeout(store):
    store = with_queues(store)
    store.set_timeout(datetime.timedelta(seconds=0.01))
    with pytest.raises(dist.DistStoreError, match="timeout"):
        store.queue_pop("non_existant")


def test_multi_set(store):
    store.multi_set(["foo", "bar"], ["po", "tato"])
    assert store.get("foo") == b"po" and store.get("bar") == b"tato"


def test_multi_get(store):
    store.set("foo", "po")
    store.set("bar", "tato")
    assert store.multi_get(["foo", "bar"]) == [b"po", b"tato"]


def test_clone(store):
    other = store.clone()
    assert isinstance(other, dist.Store)
    store.set("foo", "bar")
    assert other.get("foo") == b"bar"


# ---------------------------------------------------------------------------
# TCPStoreTest (and LibUvTCPStoreTest)
# ---------------------------------------------------------------------------


def test_numkeys_delkeys(store):
    assert store.num_keys() == 0  # no world size: no init key
    store.add("key", 1)
    store.add("key", 2)
    store.add("key", 3)
    store.set("key0", "value0")
    store.add("key3", 1)
    store.set("key1", "value1")
    assert store.num_keys() == 4
    store.delete_key("key")
    assert store.num_keys() == 3
    store.set_timeout(datetime.timedelta(seconds=2))
    with pytest.raises(RuntimeError):
        store.get("key")
    store.delete_key("key0")
    store.delete_key("key3")
    assert store.num_keys() == 1
    store.set("key4", "value2")
    assert store.num_keys() == 2
    assert store.get("key1") == b"value1" and store.get("key4") == b"value2"


@pytest.mark.parametrize("world_size", [5, None])
def test_multi_worker(server, world_size):
    """Clients with a world size (each adds to torch's init key) and
    without one share the server's keys."""
    first = server.client()
    first.set("key", "value")
    for i in range(world_size or 1):
        c = server.client(world_size=world_size)
        assert c.get("key") == b"value"
        c.set(f"new_key{i}", f"new_value{i}")
        assert c.compare_set(f"new_key{i}", f"new_value{i}", f"next_value{i}") == f"next_value{i}".encode()


def test_world_size_0_raises(server):
    with pytest.raises(ValueError, match="TCPStore world size cannot be 0"):
        server.client(world_size=0)


def test_agent_store(server, monkeypatch):
    """TORCHELASTIC_USE_AGENT_STORE: a TCPStore made as the master at
    MASTER_PORT is a client of the store already there (what a worker under
    torchrun does, and what docs/pytorch.md tells to point at cohortd)."""
    monkeypatch.setenv("TORCHELASTIC_USE_AGENT_STORE", "1")
    monkeypatch.setenv("MASTER_PORT", str(server.port))
    agent = dist.TCPStore(host_name=server.host, port=server.port, world_size=1, is_master=True,
                          timeout=T, use_libuv=server.libuv)
    assert agent.port == server.port
    agent.set("from_agent", "1")
    assert server.client().get("from_agent") == b"1"


def test_repr(server):
    assert "server=<nullptr>" in repr(server.client())


# ---------------------------------------------------------------------------
# TestMultiThreadedWait, TimeoutTest, RendezvousTCPTest's store timeouts
# ---------------------------------------------------------------------------


@pytest.mark.parametrize("prefixed", [False, True])
def test_wait_released_by_another_client(server, prefixed):
    a, b = server.client(), server.client()
    if prefixed:
        a, b = dist.PrefixStore("pre", a), dist.PrefixStore("pre", b)
    a.set_timeout(datetime.timedelta(seconds=5))
    got = []

    def waiter():
        a.wait(["key1"])
        got.append(a.get("key1"))

    t = threading.Thread(target=waiter)
    t.start()
    time.sleep(0.2)
    b.set("key1", "value1")
    assert joined([t], 10) and got == [b"value1"]


def test_interrupt_doesnt_break_wait(server):
    """A signal delivered to a thread blocked in wait() does not end the
    wait: the key set 2 s later releases it."""
    res = [None, None]
    stores = [server.client(), server.client()]

    def run(rank):
        try:
            if rank == 0:
                time.sleep(2)
                stores[0].set("foo", "bar")
            else:
                stores[1].wait(["foo"], datetime.timedelta(seconds=10))
            res[rank] = True
        except Exception as e:  # noqa: BLE001 - reported below
            res[rank] = e

    old = signal.signal(signal.SIGUSR1, lambda *a: None)
    try:
        threads = [threading.Thread(target=run, args=(i,)) for i in range(2)]
        [t.start() for t in threads]
        time.sleep(0.5)
        signal.pthread_kill(threads[1].ident, signal.SIGUSR1)
        assert joined(threads, 20)
    finally:
        signal.signal(signal.SIGUSR1, old)
    assert res == [True, True], res


def test_store_timeout_and_the_client_goes_on(server):
    s = server.client()
    s.set_timeout(datetime.timedelta(seconds=0.1))
    t0 = time.monotonic()
    with pytest.raises(dist.DistStoreError, match="wait timeout after 100ms, keys: /the_key"):
        s.get("the_key")
    assert time.monotonic() - t0 < 5
    s.set("the_key", "x")
    assert s.get("the_key") == b"x"


# ---------------------------------------------------------------------------
# torch 2.15's list_keys and barrier
# ---------------------------------------------------------------------------


def test_list_keys(store):
    store.set("a", "1")
    store.add("b", 2)
    store.append("c", "3")
    assert sorted(store.list_keys()) == ["a", "b", "c"]
    store.delete_key("b")
    assert sorted(store.list_keys()) == ["a", "c"]


def test_barrier(server):
    clients = [server.client() for _ in range(3)]
    done = []

    def enter(i):
        clients[i].barrier("b1", 3, datetime.timedelta(seconds=10))
        done.append(i)

    ts = [threading.Thread(target=enter, args=(i,)) for i in range(2)]
    [t.start() for t in ts]
    time.sleep(0.3)
    assert not done
    enter(2)
    assert joined(ts, 10) and sorted(done) == [0, 1, 2]
    with pytest.raises(dist.DistStoreError, match="barrier timeout"):
        clients[0].barrier("b2", 2, datetime.timedelta(milliseconds=300))
    clients[0].set("after", "ok")
    assert clients[0].get("after") == b"ok"


@pytest.mark.parametrize("count", [0, -1])
def test_barrier_of_count_below_one_returns_at_once(server, count):
    """torch's server counts the arrival and answers at once: the count is
    already reached."""
    s = server.client()
    t0 = time.monotonic()
    s.barrier(f"b{count}", count, datetime.timedelta(seconds=5))
    assert time.monotonic() - t0 < 2
    assert s.get(f"b{count}") == b"1"
    s.set("after", "ok")
    assert s.get("after") == b"ok"


# ---------------------------------------------------------------------------
# Issue 21: what a client sends is never lost, wake-ups reach every
# waiter, bad input ends only the sender's connection
# ---------------------------------------------------------------------------


def raw_client(server) -> socket.socket:
    sk = socket.create_connection((server.host, server.port), timeout=10)
    sk.sendall(b"\x00" + struct.pack("<I", MAGIC))
    return sk


def put_str(b: bytes) -> bytes:
    return struct.pack("<Q", len(b)) + b


def test_set_then_close_keeps_every_set(server):
    """A client that sets and closes at once (torch's set sends no reply)
    loses nothing: 50 of 50, each in its own connection, several sets
    each, the last one cut off from its predecessors by nothing."""
    for i in range(50):
        sk = raw_client(server)
        sk.sendall(b"".join(b"\x01" + put_str(f"/sc{i}_{j}".encode()) + put_str(b"v%d" % j)
                            for j in range(3)))
        sk.close()
    c = server.client(timeout=datetime.timedelta(seconds=10))
    assert c.multi_get([f"sc{i}_{j}" for i in range(50) for j in range(3)]) == \
        [b"v%d" % j for i in range(50) for j in range(3)]


def test_set_then_close_with_torch_client(server):
    for i in range(50):
        c = server.client()
        c.set(f"tc{i}", str(i))
        del c
    c = server.client()
    assert c.multi_get([f"tc{i}" for i in range(50)]) == [str(i).encode() for i in range(50)]


def test_queues_bidirectional_20_rounds(store):
    store = with_queues(store)
    store.set_timeout(datetime.timedelta(seconds=20))
    for _ in range(20):
        bidirectional(store)


def test_queue_push_wakes_every_blocked_pop(server):
    """Three clients blocked in queue_pop on one queue; three pushes from a
    fourth: every one gets an item, each item goes to one client."""
    pops = [with_queues(server.client()) for _ in range(3)]
    got, lock = [], threading.Lock()

    def pop(s):
        v = s.queue_pop("q3")
        with lock:
            got.append(v)

    ts = [threading.Thread(target=pop, args=(s,)) for s in pops]
    [t.start() for t in ts]
    time.sleep(0.3)
    pusher = server.client()
    for i in range(3):
        pusher.queue_push("q3", f"i{i}")
    assert joined(ts, 20) and sorted(got) == [b"i0", b"i1", b"i2"]
    assert pusher.queue_len("q3") == 0


def test_set_wakes_every_waiter(server):
    waiters = [server.client() for _ in range(4)]
    got = []
    ts = [threading.Thread(target=lambda s=s: got.append(s.get("w"))) for s in waiters]
    [t.start() for t in ts]
    time.sleep(0.3)
    server.client().set("w", "now")
    assert joined(ts, 10) and got == [b"now"] * 4


def test_add_on_a_non_integer_ends_only_that_connection(server):
    """Both of torch's servers answer an ADD on a value that is not a
    decimal integer by closing the connection (and log why); so does
    cohortd, which names the key. Every other client goes on."""
    other = server.client()
    other.set("counter", "1")
    s = server.client()
    s.set("x", "abc")
    with pytest.raises(dist.DistNetworkError):
        s.add("x", 1)
    assert other.add("counter", 1) == 2 and server.alive()
    if server.kind == "cohortd":
        assert "'/x' is not a decimal integer" in server.said()


def test_value_over_the_size_limit(built):
    """torch's legacy server stores any value; its libuv server refuses
    one over 8 MiB by closing the connection (and logging why). cohortd
    refuses one over --max-value-bytes the same way, logs the sizes, and
    every other client goes on."""
    for libuv in (True, False):
        srv = Server("cohortd", libuv, "--max-value-bytes", str(1 << 20))
        try:
            other = srv.client()
            s = srv.client()
            s.set("small", b"x" * (1 << 20))
            with pytest.raises(dist.DistError):
                s.set("big", b"x" * ((1 << 20) + 1))
                s.get("small")  # the refusal shows at the latest here
            assert other.get("small") == b"x" * (1 << 20) and srv.alive()
            assert not other.check(["big"])
            said = srv.said()
            assert "1048577" in said and "--max-value-bytes" in said, said
        finally:
            srv.stop()
