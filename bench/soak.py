#!/usr/bin/env python3
"""Soak: does cohortd give memory back after a churn of large jobs?

Starts a real cohortd and runs JOBS jobs through it, CONCURRENCY at a
time. Each job is RANKS real worker processes (build/bin/cohort-test-worker
scenario `soak`) that each store KEYS values of BYTES bytes, meet in a
barrier, then either leave cleanly (even jobs) or exit without a Leave
(odd jobs: the job is *abandoned*: its members' connections drop, it
fails and stays until cohortd's --job-expiry removes it). cohortd's RSS
(VmRSS of /proc/PID/status) is sampled every 50 ms.

Reported: RSS at start, the baseline (after one small warm-up job), the
peak during the churn, and after the churn once /metrics says no job is
left (abandoned ones expired). With --check the exit status is 1 when
"after" is more than 10 % above the baseline.

cohortd keeps the per-rank metrics of up to --metrics-max-ranks (512)
(job, rank) pairs after their jobs end, by design (/metrics and the status
page show them; about 7 KiB each, so up to 3.5 MiB). That cache is not
memory a churn fails to give back, but against a 3.5 MiB baseline it is
up to 1.3 x after 100 jobs (issue 22): the soak turns it off
(--metrics-max-ranks 0) unless --keep-rank-metrics, which reports it
and checks "after" against the baseline plus 8 KiB per (job, rank) seen.

    python3 bench/soak.py                       # 100 jobs, 2 ranks, 2 x 16 MiB each
    python3 bench/soak.py --jobs 20 --bytes 1048576 --check

Bounded: every worker and the whole run have timeouts (--timeout, 600 s).
"""
import argparse
import json
import os
import re
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
import urllib.request

ROOT = os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def free_port():
    s = socket.socket()
    s.bind(("127.0.0.1", 0))
    port = s.getsockname()[1]
    s.close()
    return port


def rss_kib(pid):
    with open(f"/proc/{pid}/status") as f:
        for line in f:
            if line.startswith("VmRSS:"):
                return int(line.split()[1])
    return 0


def metric(http, name):
    with urllib.request.urlopen(f"http://{http}/metrics", timeout=5) as r:
        text = r.read().decode()
    m = re.search(rf"^{name} (\S+)$", text, re.M)
    return float(m.group(1)) if m else None


def run_job(args, url, name, mode, keys, nbytes, logdir):
    procs = []
    for r in range(args.ranks):
        env = dict(os.environ)
        env.update({
            "COHORT_COORDINATOR": url,
            "COHORT_JOB": name,
            "COHORT_TOKEN": "soak",
            "COHORT_RANK": str(r),
            "COHORT_WORLD_SIZE": str(args.ranks),
            "COHORT_LOG_LEVEL": "warn",
        })
        out = open(os.path.join(logdir, f"{name}-{r}.out"), "w")
        procs.append((subprocess.Popen(
            [args.worker, "soak", f"{keys}:{nbytes}:{mode}"],
            env=env, stdout=out, stderr=subprocess.STDOUT), out))
    ok = True
    for p, out in procs:
        try:
            ok &= p.wait(timeout=120) == 0
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()
            ok = False
        out.close()
    return ok


def main():
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--jobs", type=int, default=100)
    ap.add_argument("--concurrency", type=int, default=4)
    ap.add_argument("--ranks", type=int, default=2)
    ap.add_argument("--keys", type=int, default=2)
    ap.add_argument("--bytes", type=int, default=16 << 20)
    ap.add_argument("--expiry-ms", type=int, default=2000,
                    help="cohortd --job-expiry (default 2000)")
    ap.add_argument("--cohortd", default=os.path.join(ROOT, "build/bin/cohortd"))
    ap.add_argument("--worker", default=os.path.join(ROOT, "build/bin/cohort-test-worker"))
    ap.add_argument("--extra", default="", help="more cohortd arguments")
    ap.add_argument("--timeout", type=float, default=600)
    ap.add_argument("--check", action="store_true",
                    help="exit 1 if RSS after is over 110%% of the baseline")
    ap.add_argument("--keep-rank-metrics", action="store_true",
                    help="leave cohortd's per-rank metrics cache on (it "
                    "keeps up to --metrics-max-ranks pairs after their jobs)")
    ap.add_argument("--json", action="store_true")
    args = ap.parse_args()

    t_end = time.time() + args.timeout
    port, hport = free_port(), free_port()
    url = f"tcp://127.0.0.1:{port}"
    http = f"127.0.0.1:{hport}"
    logdir = tempfile.mkdtemp(prefix="cohort-soak-")
    clog = open(os.path.join(logdir, "cohortd.log"), "w")
    cmd = [args.cohortd, "--listen", url, "--http", http, "--job-expiry",
           str(args.expiry_ms), "--drain", "1"]
    if not args.keep_rank_metrics and "--metrics-max-ranks" not in args.extra:
        cmd += ["--metrics-max-ranks", "0"]
    cmd += args.extra.split()
    cd = subprocess.Popen(cmd, stdout=clog, stderr=subprocess.STDOUT)
    try:
        while True:
            try:
                socket.create_connection(("127.0.0.1", port), 0.2).close()
                break
            except OSError:
                if cd.poll() is not None or time.time() > t_end:
                    sys.exit(f"cohortd did not start (log {logdir}/cohortd.log)")
                time.sleep(0.05)
        time.sleep(0.5)
        rss_start = rss_kib(cd.pid)
        if not run_job(args, url, "soak-warmup", "leave", 1, 4096, logdir):
            sys.exit(f"warm-up job failed (logs in {logdir})")
        time.sleep(1.0)
        baseline = rss_kib(cd.pid)

        peak = [baseline]
        stop = threading.Event()

        def sampler():
            while not stop.is_set():
                try:
                    peak[0] = max(peak[0], rss_kib(cd.pid))
                except OSError:
                    return
                time.sleep(0.05)

        th = threading.Thread(target=sampler, daemon=True)
        th.start()
        t0 = time.time()
        failed = 0
        next_job = 0
        running = []
        while next_job < args.jobs or running:
            while next_job < args.jobs and len(running) < args.concurrency:
                mode = "abandon" if next_job % 2 else "leave"
                t = threading.Thread(target=lambda n=next_job, m=mode: results.append(
                    run_job(args, url, f"soak-{n}", m, args.keys, args.bytes, logdir)))
                running.append(t)
                t.start()
                next_job += 1
            running[0].join()
            running.pop(0)
            if time.time() > t_end:
                sys.exit("timeout")
        churn_s = time.time() - t0
        failed = results.count(False)
        # abandoned jobs expire after --job-expiry (checked every 250 ms)
        jobs_left = None
        while time.time() < t_end:
            jobs_left = metric(http, "cohort_jobs")
            if jobs_left == 0:
                break
            time.sleep(0.2)
        time.sleep(1.0)
        stop.set()
        th.join()
        after = rss_kib(cd.pid)
        expired = metric(http, "cohort_jobs_expired_total")
        res = {
            "jobs": args.jobs, "ranks": args.ranks, "keys": args.keys,
            "bytes": args.bytes, "concurrency": args.concurrency,
            "churned_mib": round(args.jobs * args.ranks * args.keys * args.bytes / 2**20),
            "churn_s": round(churn_s, 1), "failed_jobs": failed,
            "jobs_left": jobs_left, "jobs_expired": expired,
            "rss_start_mib": round(rss_start / 1024, 1),
            "rss_baseline_mib": round(baseline / 1024, 1),
            "rss_peak_mib": round(peak[0] / 1024, 1),
            "rss_after_mib": round(after / 1024, 1),
            "after_over_baseline": round(after / baseline, 3),
        }
        if args.json:
            print(json.dumps(res))
        else:
            print(f"cohortd soak: {args.jobs} jobs x {args.ranks} ranks x {args.keys} "
                  f"values of {args.bytes} bytes, {args.concurrency} at a time, "
                  f"odd jobs abandoned ({res['churned_mib']} MiB stored in {res['churn_s']} s)")
            print(f"  RSS start {res['rss_start_mib']} MiB, baseline {res['rss_baseline_mib']} MiB, "
                  f"peak {res['rss_peak_mib']} MiB, after {res['rss_after_mib']} MiB "
                  f"({res['after_over_baseline']:.3f} x baseline)")
            print(f"  jobs failed {failed}, left {jobs_left}, expired {expired:.0f}")
        if failed:
            print(f"worker logs: {logdir}", file=sys.stderr)
        # the per-rank metrics cache, when on, is bounded by design
        cache_kib = 0
        if args.keep_rank_metrics or "--metrics-max-ranks" in args.extra:
            cache_kib = 8 * min(512, args.jobs * args.ranks)
        ok = (failed == 0 and jobs_left == 0
              and after <= baseline * 1.10 + cache_kib)
        return 0 if ok or not args.check else 1
    finally:
        cd.send_signal(signal.SIGTERM)
        try:
            cd.wait(timeout=10)
        except subprocess.TimeoutExpired:
            cd.kill()
        clog.close()


results = []

if __name__ == "__main__":
    sys.exit(main())
