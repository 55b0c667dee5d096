"""cohort across real (simulated) hosts: network namespaces on a bridge.

cohortd runs on host h0, workers on the others through ``cohort run
--nnodes``; each host has its own address and its own /dev/shm. Nothing
sets COHORT_DATA_ADDR: the workers find their address themselves.
"""

from __future__ import annotations

import json
import os
import re
import signal
import time

import pytest

from conftest import bin_path, coord_url, dump, liveness, run_nodes_of, start_cohortd

# Liveness settings of these tests: a dead or cut-off host must be named
# within dead-after + 1 s.
HB_MS = 500
DEAD_MS = 3000
LIVENESS = liveness(HB_MS, DEAD_MS)


def run_nodes(hosts, coord, program, nproc=1, job="job", env=None, extra=()):
    """``cohort run`` on each host, one node each; returns the processes."""
    return run_nodes_of(hosts, coord, program, nproc, job, {**LIVENESS, **(env or {})}, extra)


def wait_all(procs, timeout):
    end = time.monotonic() + timeout
    for p in procs:
        left = max(0.1, end - time.monotonic())
        try:
            p.wait(timeout=left)
        except Exception:
            raise AssertionError(
                f"still running after {timeout} s:\n{dump(procs)}"
            ) from None


def test_every_collective_across_hosts_with_no_address_set(cluster):
    """2 hosts x 2 ranks: every collective, dtype and op (the matrix
    scenario), with addresses found from the route to the coordinator."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    start_cohortd(h0)
    procs = run_nodes(
        [h1, h2], h0, [bin_path("cohort-coll-worker"), "matrix"], nproc=2,
        env={"COHORT_LOG_LEVEL": "info"},
    )  # fmt: skip
    wait_all(procs, 120)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out
    assert out.count("failed=0") == 4, out
    # each rank advertised its own host's address, found by itself
    for h in (h1, h2):
        assert (
            f"data plane address {h.addr} (from route to the coordinator)"
            in out
        ), out


def test_shared_memory_only_between_ranks_of_one_host(cluster):
    """Two ranks on one host use shared memory; the same job spread over
    two hosts (separate /dev/shm) must not, and still sums right."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    start_cohortd(h0)
    env = {"COHORT_LOG_LEVEL": "debug", "COHORT_FW_BYTES": str(1 << 20)}
    prog = [bin_path("cohort-fault-worker"), "20"]
    one = run_nodes([h1], h0, prog, nproc=2, job="one", env=env)
    wait_all(one, 60)
    out_one = dump(one)
    assert one[0].returncode == 0 and "sum_ok=1" in out_one, out_one
    assert re.search(r"connected \(listened on [0-9.:]+, shared memory\)",
                     out_one), out_one  # fmt: skip
    two = run_nodes([h1, h2], h0, prog, nproc=2, job="two", env=env)
    wait_all(two, 60)
    out_two = dump(two)
    assert all(p.returncode == 0 for p in two), out_two
    assert out_two.count("sum_ok=1") == 4, out_two
    # the job's own group is pure TCP; only the hierarchical all-reduce's
    # groups of one host's ranks ("hier.hostN.world") share memory
    assert not re.search(r"group world: .*shared memory\)", out_two), out_two
    for hid in (0, 1):
        assert len(re.findall(
            rf"group hier\.host{hid}\.world: rank \d of 2 connected \(listened on "
            r"[0-9.:]+, shared memory\)", out_two)) == 2, out_two  # fmt: skip
    # nothing left behind in either host's /dev/shm
    for h in (h1, h2):
        assert list(h.shm.iterdir()) == [], list(h.shm.iterdir())


def test_hierarchical_allreduce_two_hosts_by_two(cluster):
    """2 hosts x 2 ranks: the all-reduce goes shared memory within a host
    and TCP between hosts (hier.c), sums right at a size that leaves a
    remainder, and COHORT_TCP_HIER=0 keeps it flat."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    start_cohortd(h0)
    prog = [bin_path("cohort-fault-worker"), "20"]
    # 262147 floats: 2 slices of 131073 and one element left over
    env = {"COHORT_LOG_LEVEL": "debug", "COHORT_FW_BYTES": str(4 * 262147)}
    procs = run_nodes([h1, h2], h0, prog, nproc=2, job="hier", env=env)
    wait_all(procs, 60)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out
    assert out.count("sum_ok=1") == 4, out
    for host, place in ((0, 0), (0, 1), (1, 0), (1, 1)):
        assert (f"hierarchical all-reduce, 2 hosts x 2 ranks (host {host}, "
                f"place {place})") in out, out  # fmt: skip
    env["COHORT_TCP_HIER"] = "0"
    flat = run_nodes([h1, h2], h0, prog, nproc=2, job="flat", env=env)
    wait_all(flat, 60)
    out = dump(flat)
    assert out.count("sum_ok=1") == 4, out
    assert "hierarchical" not in out, out


def test_hierarchical_rank_killed_mid_allreduce_is_named_everywhere(cluster):
    """SIGKILL one rank of a 2 x 2 job in the middle of 64 MiB
    hierarchical all-reduces: every survivor, including the ones that were
    in a stage without it, names it within a second, not after the
    coordinator's dead-after."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    start_cohortd(h0)
    env = {"COHORT_FW_BYTES": str(64 << 20), "COHORT_FW_PIDDIR": str(h2.dir)}
    procs = run_nodes([h1, h2], h0, [bin_path("cohort-fault-worker"),
                                     "100000"], nproc=2, job="hk", env=env)
    assert procs[0].wait_for("STEP 3", 60), dump(procs)
    pidfile = h2.dir / "rank3.pid"
    assert pidfile.exists(), dump(procs)
    t_fault = time.time() * 1000
    os.kill(int(pidfile.read_text()), signal.SIGKILL)
    wait_all(procs, 30)
    out = dump(procs)
    found = {}
    for p in procs:
        for m in re.finditer(r"RESULT \S+ step=\d+ status=(\S+) "
                             r"at_ms=(\d+) detail=(.*)", p.output()):
            if "rank 3" in m.group(3):
                found.setdefault(p.host.name, []).append(
                    (int(m.group(2)) - t_fault, m.group(1), m.group(3)))
    # all three survivors (two on h1, one on h2) report it
    assert sum(len(v) for v in found.values()) == 3, out
    for name, hits in found.items():
        for took, st, detail in hits:
            assert st == "COHORT_EPEERLOST", detail
            assert took < 1000, f"{name}: {took:.0f} ms: {detail}"
            print(f"{name} named rank 3 after {took:.0f} ms: {detail[:110]}")


def test_unreachable_peer_address_is_named_within_seconds(cluster):
    """A rank that advertises an address its peers cannot reach (here
    loopback) is named, with the address, in seconds, not at the
    operation timeout."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    start_cohortd(h0)
    prog = [bin_path("cohort-fault-worker"), "5"]
    env = {"COHORT_FW_BYTES": "4096", "COHORT_CONNECT_TIMEOUT_MS": "2000"}
    # rank 1 (on h2) is told to advertise 127.0.0.1: rank 0 connects to it
    t0 = time.monotonic()
    procs = [
        h1.spawn([bin_path("cohort"), "run", "--nnodes", "2", "--node-rank",
                  "0", "-n", "1", "--coordinator", coord_url(h0), "--job",
                  "lo", "--", *prog], env={**LIVENESS, **env}),
        h2.spawn([bin_path("cohort"), "run", "--nnodes", "2", "--node-rank",
                  "1", "-n", "1", "--coordinator", coord_url(h0), "--job",
                  "lo", "--", *prog],
                 env={**LIVENESS, **env, "COHORT_DATA_ADDR": "127.0.0.1"}),
    ]  # fmt: skip
    wait_all(procs, 60)
    took = time.monotonic() - t0
    out = dump(procs)
    assert all(p.returncode != 0 for p in procs), out
    assert re.search(
        r"cannot connect to rank 1 at 127\.0\.0\.1:\d+: Connection refused "
        r"\(tried for 2\.\d s\); rank 1 advertises a loopback address "
        r"while this rank is at " + re.escape(h1.addr), out), out
    assert took < 15, f"took {took:.1f} s:\n{out}"


def _detections(procs, victim_rank):
    """at_ms of every survivor's RESULT line naming the victim rank."""
    found = {}
    for p in procs:
        for m in re.finditer(r"RESULT \S+ step=\d+ status=(\S+) "
                             r"at_ms=(\d+) detail=(.*)", p.output()):
            st, at, detail = m.group(1), int(m.group(2)), m.group(3)
            if f"rank {victim_rank}" in detail:
                found[p.host.name] = (at, st, detail)
    return found


@pytest.mark.parametrize("fault", ["link_down", "partition", "kill"])
def test_lost_host_is_named_by_every_survivor(cluster, fault):
    """A host whose link goes down, one partitioned from every other host
    by nftables, and one whose processes die: every survivor names its
    rank within dead-after + 1 s."""
    cl = cluster(5)
    h0, *workers = cl.hosts
    start_cohortd(h0)
    env = {"COHORT_FW_BYTES": "65536"}
    procs = run_nodes(
        workers, h0, [bin_path("cohort-fault-worker"), "100000", "10"],
        env=env,
    )  # fmt: skip
    assert procs[0].wait_for("STEP 50", 60), dump(procs)
    victim = workers[-1]  # node 3: rank 3
    t_fault = time.time() * 1000
    if fault == "link_down":
        victim.link_down()
    elif fault == "partition":
        cl.isolate(victim)
    else:
        victim.kill_all()
    survivors = [p for p in procs if p.host is not victim]
    wait_all(survivors, 30)
    out = dump(procs)
    found = _detections(survivors, 3)
    assert set(found) == {p.host.name for p in survivors}, out
    for name, (at, st, detail) in found.items():
        took = at - t_fault
        assert took <= DEAD_MS + 1000, f"{name}: {took:.0f} ms: {detail}"
        print(f"{fault}: {name} named rank 3 after {took:.0f} ms "
              f"({st}): {detail[:120]}")  # fmt: skip


def test_coordinator_restart_within_the_window(cluster):
    """cohortd's host loses cohortd for 8 s (beyond the old 5 s window)
    and it comes back from its journal: the job goes on, the data plane
    never stopped, and every rank ends with the same checksum."""
    cl = cluster(4)
    h0, *workers = cl.hosts
    state = h0.dir / "state"
    d = start_cohortd(h0, "--state-dir", str(state))
    procs = run_nodes(
        workers, h0, [bin_path("cohort-fault-worker"), "1500", "10"],
        env={"COHORT_FW_BYTES": "16384", "COHORT_LOG_LEVEL": "info"},
    )  # fmt: skip
    assert procs[0].wait_for("STEP 100", 60), dump(procs)
    d.kill()
    d.wait()
    h0.link_down()  # the host itself goes, as a rescheduled pod does
    steps_before = procs[0].output().count("STEP ")
    time.sleep(8)
    steps_during = procs[0].output().count("STEP ") - steps_before
    h0.link_up()
    start_cohortd(h0, "--state-dir", str(state))
    wait_all(procs, 120)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out
    sums = re.findall(r"DONE .* sum_ok=1 checksum=(\S+)", out)
    assert len(sums) == 3 and len(set(sums)) == 1, out
    assert "reconnected to the coordinator" in out, out
    # the data plane ran on while the coordinator was away
    assert steps_during > 50, f"{steps_during} steps in the outage\n{out}"


def test_coordinator_gone_past_the_window_is_the_root_cause(cluster):
    """cohortd vanishes for good: past the reconnect window every rank
    stops, and cohort run's report names the coordinator."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    d = start_cohortd(h0)
    procs = run_nodes(
        [h1, h2], h0, [bin_path("cohort-fault-worker"), "100000", "10"],
        env={"COHORT_FW_BYTES": "4096", "COHORT_RECONNECT_MS": "4000"},
        extra=("--report", "{dir}/report.json"),
    )  # fmt: skip
    assert procs[0].wait_for("STEP 20", 60), dump(procs)
    t0 = time.monotonic()
    d.kill()
    wait_all(procs, 30)
    took = time.monotonic() - t0
    out = dump(procs)
    assert all(p.returncode != 0 for p in procs), out
    assert 4 <= took < 12, f"{took:.1f} s\n{out}"
    for p in procs:
        o = p.output()
        assert "could not reconnect within 4.0 s" in o, o
        assert (f"root cause : the coordinator at {coord_url(h0)} is "
                "unreachable") in o, o  # fmt: skip
        report = (p.host.dir / "report.json").read_text()
        assert '"kind":"coordinator"}' in report, report


def test_worker_says_what_is_wrong_with_its_coordinator(cluster):
    """A wrong coordinator address: a warning with the address and the
    error every few seconds; a port where something else answers (here
    a torch-style store, not a cohortd): an error within seconds; a port
    that accepts and stays silent (a cohortd busy with thousands of
    connections looks the same): a warning, and the wait goes on."""
    cl = cluster(2)
    h0, h1 = cl.hosts
    env = {**LIVENESS, "COHORT_WORLD_SIZE": "1", "COHORT_RANK": "0"}
    # nothing listens
    p = h1.spawn([bin_path("cohort-fault-worker"), "1"],
                 env={**env, "COHORT_COORDINATOR": coord_url(h0)})  # fmt: skip
    assert p.wait_for("yet: Connection refused (4 s so far", 10), p.output()
    p.kill()
    # accepts and never answers: busy or foreign, the worker cannot tell
    srv = h0.spawn(["python3", "-c",
                    "import socket,time\n"
                    "s=socket.socket();s.bind(('0.0.0.0',29400));s.listen()\n"
                    "c=[]\n"
                    "while True: c.append(s.accept()[0])"])  # fmt: skip
    time.sleep(0.5)
    p = h1.spawn([bin_path("cohort-fault-worker"), "1"],
                 env={**env, "COHORT_COORDINATOR": coord_url(h0)})  # fmt: skip
    assert p.wait_for("has not answered yet: it accepts connections but "
                      "said nothing", 10), p.output()  # fmt: skip
    assert p.poll() is None, p.output()
    p.kill()
    srv.kill()
    # something that is not cohortd: a TCP server that closes on a query
    # it does not know, as torch's TCPStore does
    srv = h0.spawn(["python3", "-c",
                    "import socket,time\n"
                    "s=socket.socket();s.setsockopt(socket.SOL_SOCKET,"
                    "socket.SO_REUSEADDR,1)\n"
                    "s.bind(('0.0.0.0',29400));s.listen()\n"
                    "while True:\n"
                    " c=s.accept()[0];c.recv(8);c.close()"])  # fmt: skip
    time.sleep(0.5)
    t0 = time.monotonic()
    r = h1.run([bin_path("cohort-fault-worker"), "1"],
               env={**env, "COHORT_COORDINATOR": coord_url(h0)},
               timeout=30)  # fmt: skip
    took = time.monotonic() - t0
    assert r.returncode != 0, r.stdout
    assert "accepts connections but is not a cohortd" in r.stdout, r.stdout
    assert took < 5, f"{took:.1f} s"
    srv.kill()


def _http_get(host, url):
    """(status, body) of a GET from inside host's namespace."""
    r = host.run(["python3", "-c",
                  "import sys,urllib.request,urllib.error\n"
                  "try:\n"
                  f"  r=urllib.request.urlopen('{url}',timeout=2)\n"
                  "  print(r.status, r.read().decode().strip())\n"
                  "except urllib.error.HTTPError as e:\n"
                  "  print(e.code, e.read().decode().strip())\n"
                  "except Exception as e:\n"
                  "  print(0, e)\n"], timeout=10)  # fmt: skip
    code, _, body = r.stdout.strip().partition(" ")
    return int(code or 0), body


def test_sigterm_drains_then_a_restart_loses_nothing(cluster):
    """SIGTERM, as Kubernetes sends before it moves the pod: /readyz turns
    503 at once while requests are still served, cohortd exits after the
    drain, and its successor on the same journal carries the job through
    (barriers through the coordinator, none lost or repeated)."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    state = h0.dir / "state"
    http = f"http://{h0.addr}:29401"
    args = ("--state-dir", str(state), "--http", "0.0.0.0:29401",
            "--drain", "2000")  # fmt: skip
    d = start_cohortd(h0, *args)
    assert _http_get(h1, f"{http}/readyz") == (200, "ok")
    procs = run_nodes(
        [h1, h2], h0, [bin_path("cohort-fault-worker"), "400", "10"],
        env={"COHORT_FW_BYTES": "0", "COHORT_LOG_LEVEL": "info"},
    )  # fmt: skip
    assert procs[0].wait_for("STEP 30", 60), dump(procs)
    t0 = time.monotonic()
    d.terminate()
    assert d.wait_for("draining for 2000 ms", 5), d.output()
    assert _http_get(h1, f"{http}/readyz") == (503, "draining")
    # still serving while it drains: barriers go on
    n = procs[0].output().count("STEP ")
    time.sleep(0.5)
    assert procs[0].output().count("STEP ") > n, dump(procs + [d])
    d.wait(timeout=10)
    took = time.monotonic() - t0
    assert d.returncode == 0 and 2.0 <= took < 5, (took, d.output())
    start_cohortd(h0, *args)
    wait_all(procs, 120)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out
    assert out.count("DONE steps=400") == 2, out


def test_two_launchers_on_one_coordinator_never_mix(cluster):
    """An Open MPI job and a SLURM job, each of two ranks on two hosts,
    interleaved, neither naming its job: each is its own job at the one
    cohortd (named from the launcher's job id) and sums its own values.
    The SLURM ranks find cohortd from SLURM_JOB_NODELIST alone."""
    cl = cluster(5)
    h0, *hs = cl.hosts
    slurm_port = 15000 + 4242  # Lightning's MASTER_PORT rule for job 4242
    d = start_cohortd(h0, "--listen", f"tcp://0.0.0.0:{slurm_port}")
    common = {**LIVENESS, "COHORT_FW_BYTES": "4096", "COHORT_LOG_LEVEL":
              "info"}  # fmt: skip
    mpi = {"OMPI_COMM_WORLD_SIZE": "2", "OMPI_COMM_WORLD_LOCAL_RANK": "0",
           "OMPI_COMM_WORLD_LOCAL_SIZE": "1",
           "OMPI_MCA_ess_base_jobid": "1829961729",
           "PMIX_NAMESPACE": "1829961729",
           "COHORT_COORDINATOR": coord_url(h0)}  # fmt: skip
    slurm = {"SLURM_NTASKS": "2", "SLURM_LOCALID": "0",
             "SLURM_JOB_ID": "4242", "SLURM_STEP_ID": "0",
             "SLURM_JOB_NAME": "train.sh",
             "SLURM_JOB_NODELIST": f"{h0.name},{hs[0].name}",
             "SLURM_NTASKS_PER_NODE": "1"}  # fmt: skip
    prog = [bin_path("cohort-fault-worker"), "200", "5"]
    procs = [
        hs[0].spawn(prog, env={**common, **mpi, "OMPI_COMM_WORLD_RANK": "0",
                               "PMIX_RANK": "0"}),
        hs[1].spawn(prog, env={**common, **slurm, "SLURM_PROCID": "0",
                               "SLURM_NODEID": "1"}),
        hs[2].spawn(prog, env={**common, **mpi, "OMPI_COMM_WORLD_RANK": "1",
                               "PMIX_RANK": "1"}),
        hs[3].spawn(prog, env={**common, **slurm, "SLURM_PROCID": "1",
                               "SLURM_NODEID": "2"}),
    ]  # fmt: skip
    wait_all(procs, 60)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out
    assert out.count("sum_ok=1") == 4, out
    for p in procs[0::2]:
        assert "job 'ompi-1829961729' (from OMPI_MCA_ess_base_jobid)" in \
            p.output(), p.output()  # fmt: skip
    for p in procs[1::2]:
        o = p.output()
        assert "job 'slurm-4242.0'" in o, o
        assert (f"coordinator 'tcp://{h0.name}:{slurm_port}' (from "
                "SLURM_JOB_NODELIST)") in o, o  # fmt: skip
    log = d.output()
    assert "job 'ompi-1829961729'" in log and "job 'slurm-4242.0'" in log


# --- the launcher across hosts: reports, timeline, documented commands -----

ROOT = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def _sh_block(doc, heading):
    """The lines of the first ```sh block under ``heading`` of doc."""
    text = open(os.path.join(ROOT, doc)).read()
    at = text.index(heading)
    start = text.index("```sh\n", at) + len("```sh\n")
    return text[start:text.index("```", start)].splitlines()


def _commands(lines):
    """Command lines (comments and blank lines dropped)."""
    return [ln for ln in lines if ln.strip() and not ln.lstrip().startswith("#")]


def _train_script(host, steps=30, step_ms=10):
    """./train in host's folder: the test worker (sums checked)."""
    path = host.dir / "train"
    path.write_text(f"#!/bin/sh\nexec {bin_path('cohort-fault-worker')} {steps} {step_ms}\n")
    path.chmod(0o755)


def _as_written(host, lines, env=None, var_lib=False):
    """The lines run as they are written, in one shell on host, in its
    folder, with the build's programs on PATH ("cohort", "cohortd").
    var_lib: /var/lib is a tmpfs of this shell's own mount namespace (a
    recipe that writes /var/lib/cohortd leaves nothing on this machine)."""
    script = "\n".join(lines)
    if var_lib:
        script = "mount -t tmpfs cohort-test /var/lib || exit 99\n" + script
    path = os.path.dirname(bin_path("cohort")) + ":" + os.environ.get("PATH", "")
    return host.spawn(["sh", "-ec", script], env={**LIVENESS, "PATH": path, **(env or {})},
                      cwd=host.dir, name="as-written")


def _head(cl):
    """Every host resolves "head" to h0, the documents' cohortd host."""
    for h in cl.hosts:
        h.add_hosts_entry("head", cl.hosts[0].addr)


def _node_of(line):
    return int(re.search(r"--node-rank (\d+)", line).group(1))


def _documented_job(cluster, coord, nodes, status, per_node):
    """A shared cohortd ("head", h0) and two machines (h1, h2) running the
    documented lines as written, `cohort status` while the job runs; the
    job must end well on both machines with every sum right. Returns the
    two machines and the status command's output."""
    assert coord and len(nodes) == 2 and len(status) == 1, (coord, nodes, status)
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    _head(cl)
    d = _as_written(h0, coord, var_lib=True)
    for h in (h1, h2):
        _train_script(h, steps=300, step_ms=20)
    procs = [_as_written(h, [ln]) for h, ln in zip((h1, h2), nodes)]
    assert procs[0].wait_for("STEP 5", 90), dump(procs + [d])
    st = _as_written(h2, status)
    st.wait(timeout=30)
    assert st.returncode == 0, st.output()
    wait_all(procs, 180)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out + dump([d])
    assert out.count("sum_ok=1") == 2 * per_node and "sum_ok=0" not in out, out
    assert d.poll() is None, d.output()  # cohortd serves on
    return h1, h2, st.output()


def test_readme_multi_node_lines_run_as_written(cluster):
    """The README's lines for a shared cohortd and two machines (8 workers
    each), and `cohort status`, exactly as written: one job of 16."""
    lines = [ln for ln in _commands(_sh_block("README.md", "## Running jobs"))
             if "tcp://head:29400" in ln or "cohortd --listen" in ln]
    _, _, status = _documented_job(
        cluster, [ln for ln in lines if "cohortd --listen" in ln],
        sorted((ln for ln in lines if "--nnodes" in ln), key=_node_of),
        [ln for ln in lines if ln.startswith("cohort status")], 8)
    assert "J" in status and "16" in status, status  # both machines' world


def test_the_recipe_of_docs_multihost(cluster):
    """docs/multihost.md's recipe as written: cohortd with its journal on
    "head", two machines of two workers, `cohort status` while it runs;
    node 0's trace.json is the whole job's."""
    lines = _commands(_sh_block("docs/multihost.md", "## A job on several machines"))
    h1, h2, status = _documented_job(
        cluster, [ln for ln in lines if not ln.startswith("cohort ")],
        sorted((ln for ln in lines if "--nnodes" in ln), key=_node_of),
        [ln for ln in lines if ln.startswith("cohort status")], 2)
    assert "digits-1" in status, status
    trace = json.loads((h1.dir / "trace.json").read_text())
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"]
             if e["name"] == "process_name"}
    assert sorted(names) == [0, 1, 2, 3, 4, 5], names
    assert names[4] == "cohort run (launcher, node 0)", names
    assert names[5] == "cohort run (launcher, node 1)", names
    assert trace["otherData"]["nodes"] == 2, trace["otherData"]
    assert trace["otherData"]["missing_nodes"] == [], trace["otherData"]
    assert not (h2.dir / "trace.json").exists()
    assert not (h1.dir / "report.json").exists()  # nothing failed


def test_one_merged_timeline_for_a_three_node_job(cluster):
    """3 nodes x 2 ranks with --timeline: one file, on node 0, with every
    rank's track and one launcher row per node, none colliding."""
    cl = cluster(4)
    h0, *ws = cl.hosts
    start_cohortd(h0)
    procs = run_nodes(ws, h0, [bin_path("cohort-fault-worker"), "30", "5"], nproc=2,
                      job="tl3", extra=("--timeline", "{dir}/trace.json"))
    wait_all(procs, 120)
    out = dump(procs)
    assert all(p.returncode == 0 for p in procs), out
    trace = json.loads((ws[0].dir / "trace.json").read_text())
    ev = trace["traceEvents"]
    names = {e["pid"]: e["args"]["name"] for e in ev if e["name"] == "process_name"}
    assert sorted(names) == list(range(9)), names
    for r in range(6):
        assert names[r].startswith(f"rank {r} ("), names
        assert any(e["pid"] == r and e["ph"] == "X" for e in ev), f"rank {r}: no slices"
    for n in range(3):
        assert names[6 + n] == f"cohort run (launcher, node {n})", names
    assert trace["otherData"]["world_size"] == 6, trace["otherData"]
    assert trace["otherData"]["nodes"] == 3 and trace["otherData"]["missing_nodes"] == []
    for h in ws[1:]:
        assert not (h.dir / "trace.json").exists(), h.name
    assert "node 1's" in procs[1].output() and "node 2's" in procs[2].output(), out


def test_a_killed_rank_is_the_same_root_cause_on_every_node(cluster):
    """3 nodes x 1 rank; rank 2 (node 2, on h3) is SIGKILLed: all three
    launchers print the same root cause with the real signal, and their
    reports say exit_code 137, signal 9 (nodes 0 and 1 learn it from node
    2's launcher through cohortd). Node 2's launcher exits 137 like its
    rank; nodes 0 and 1 exit 250 (COHORT_EXIT_PEER_LOST: the job failed at
    another node's rank, which a podFailurePolicy ignores)."""
    cl = cluster(4)
    h0, *ws = cl.hosts
    start_cohortd(h0)
    env = {"COHORT_FW_BYTES": "4096", "COHORT_FW_PIDDIR": str(ws[2].dir)}
    procs = run_nodes(ws, h0, [bin_path("cohort-fault-worker"), "100000", "10"],
                      job="kill3", env=env, extra=("--report", "{dir}/report.json"))
    assert procs[0].wait_for("STEP 20", 60), dump(procs)
    os.kill(int((ws[2].dir / "rank2.pid").read_text()), signal.SIGKILL)
    wait_all(procs, 60)
    out = dump(procs)
    want = "root cause : rank 2 killed by signal 9 (Killed), on node 2 (h3)"
    for n, p in enumerate(procs):
        assert p.returncode == (137 if n == 2 else 250), out
        assert want in p.output(), p.output()
        rep = json.loads((p.host.dir / "report.json").read_text())
        rc = rep["root_cause"]
        assert (rc["rank"], rc["exit_code"], rc["signal"], rc["kind"]) == (2, 137, 9, "rank"), rep
        assert rc["error_text"], rep


def test_a_failed_rerendezvous_is_reported_as_such(cluster):
    """2 nodes with --max-restarts 1; node 1's host vanishes. Node 0 reports
    the first attempt's cause (rank 1), restarts, and its new rendezvous
    never completes: the final report says so, with the missing rank, and
    does not repeat the previous attempt's cause."""
    cl = cluster(3)
    h0, h1, h2 = cl.hosts
    start_cohortd(h0)
    env = {"COHORT_FW_BYTES": "4096", "COHORT_TIMEOUT_MS": "4000",
           "COHORT_JOIN_TIMEOUT_MS": "5000"}
    procs = run_nodes([h1, h2], h0, [bin_path("cohort-fault-worker"), "100000", "10"],
                      job="rdzv", env=env,
                      extra=("--max-restarts", "1", "--grace", "500",
                             "--report", "{dir}/report.json"))  # fmt: skip
    assert procs[0].wait_for("STEP 20", 60), dump(procs)
    cl.kill_host(h2)
    wait_all(procs[:1], 90)
    o = procs[0].output()
    assert procs[0].returncode != 0, o
    first, _, last = o.partition("restarting the group (1 of 1)")
    assert "root cause : rank 1 " in first, o
    m = re.search(r"root cause : the rendezvous of job 'rdzv' \(attempt 1\) timed out "
                  r"after ([0-9.]+) s: 1 of 2 ranks joined; missing rank 1\n", last)
    assert m and 4.5 <= float(m.group(1)) < 8, o
    assert "root cause : rank" not in last, o
    rep = json.loads((h1.dir / "report.json").read_text())
    assert rep["root_cause"]["kind"] == "rendezvous", rep
    assert rep["root_cause"]["missing_ranks"] == [1], rep
