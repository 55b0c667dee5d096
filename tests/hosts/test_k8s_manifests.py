"""The Kubernetes manifests, executed: deploy/k8s rendered with kustomize and
run as real processes on simulated hosts, so that a broken manifest fails a
test and not a cluster.

Each overlay is rendered the way a user deploys it (tools/check-k8s.py
copies deploy/k8s, writes a token with gen-token.sh, runs kustomize).
Then every pod is played by a process on a host of its own (a network
namespace, tests/hosts/hostnet.py), started from its container's command,
args and environment exactly as the kubelet would resolve them:

- env ``value`` with ``$(VAR)`` expansion; ``fieldRef`` from the pod
  (``status.podIP`` is the host's address, ``metadata.labels[...]`` and
  ``metadata.annotations[...]`` are what the Job controller puts on a pod
  of an Indexed Job, absent ones are empty); ``secretKeyRef`` from the
  rendered Secret; ``JOB_COMPLETION_INDEX`` as the Job controller sets it;
- Secret volumes become files (mode from ``defaultMode``, group from
  ``fsGroup``), the PVC and emptyDirs become directories the pod's user
  can write;
- paths of the image (/opt/cohort/...) map to build/bin and to the data
  set, as deploy/docker/Dockerfile lays them out (checked against it);
- the pod's user is ``runAsUser``/``runAsGroup`` (+ ``fsGroup``), with
  no_new_privs (``allowPrivilegeEscalation: false``) and an empty
  capability bounding set (``drop: [ALL]``), through setpriv;
- Service DNS names (``cohortd``, ``cohortd.default.svc``, ...) resolve,
  through each host's /etc/hosts, to the host of the pod they select,
  once that pod is ready (a headless Service lists ready pods only);
- the kubelet's probes are HTTP GETs against the pod's address, and
  Prometheus scrapes what the annotations point at.

Not emulated: readOnlyRootFilesystem (the processes run from the build
tree), resource limits, the image itself (tools/check-k8s.py lints it).
"""

from __future__ import annotations

import base64
import copy
import importlib.util
import json
import os
import re
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Iterator

import pytest

HERE = Path(__file__).resolve().parent
sys.path.insert(0, str(HERE))
from hostnet import Cluster  # noqa: E402

ROOT = HERE.parents[1]
BIN = Path(os.environ.get("COHORT_BIN", ROOT / "build" / "bin")).resolve()
NAMESPACE = "default"
RUN_TIMEOUT = 120  # one training run of the shipped Job, generously
# kubectl exec cohortd-0 -- ...: every job, with the admin secret of the pod
STATUS = ["/opt/cohort/bin/cohort", "status", "--coordinator", "tcp://127.0.0.1:29400"]

Doc = dict[str, Any]


def _load_checker() -> Any:
    spec = importlib.util.spec_from_file_location("check_k8s", ROOT / "tools" / "check-k8s.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    return mod


ck = _load_checker()


# --- the image ---------------------------------------------------------------


def image_files() -> dict[str, Path]:
    """The files of the image the manifests use, by their path in the
    image, mapped to this checkout's build. Read from the Dockerfile so
    that a path the image does not have fails the test."""
    text = (ROOT / "deploy" / "docker" / "Dockerfile").read_text()
    m = re.search(r"make install\b[^\n]*PREFIX=(\S+)", text)
    assert m, "Dockerfile: no 'make install PREFIX=...'"
    prefix = m.group(1)
    files = {f"{prefix}/bin/cohortd": BIN / "cohortd", f"{prefix}/bin/cohort": BIN / "cohort"}
    for m in re.finditer(r"install -m 755 build/bin/(\S+) (\S+)", text):
        files[m.group(2).rstrip("/") + "/" + m.group(1)] = BIN / m.group(1)
    m = re.search(r"fetch-digits\.sh (/\S+\.csv)", text)
    assert m, "Dockerfile: the data set is not fetched into the image"
    files[m.group(1)] = digits_csv()
    for local in files.values():
        if not local.exists():
            pytest.fail(f"{local} is missing: run 'make all' first")
    return files


def digits_csv() -> Path:
    p = ROOT / "build" / "data" / "digits.csv"
    if not p.exists():
        r = subprocess.run([str(ROOT / "tools" / "fetch-digits.sh"), str(p)], capture_output=True, text=True)
        if r.returncode != 0:
            pytest.fail(f"tools/fetch-digits.sh failed:\n{r.stderr}")
    return p


# --- rendering ---------------------------------------------------------------


@dataclass
class Rendering:
    docs: list[Doc]
    token: str

    def one(self, kind: str, name: str | None = None) -> Doc:
        hits = [d for d in self.docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
        assert len(hits) == 1, f"{len(hits)} {kind} {name or ''} in the rendering"
        return hits[0]


def render(tmp: Path, overlay: str, patches: list[Doc] | None = None) -> Rendering:
    """kustomize build of overlays/<overlay> from a fresh copy of deploy/k8s
    with a generated token; ``patches`` (JSON patches for the worker Job)
    are added to that overlay's kustomization first, the way a user
    customises it."""
    try:
        ck.kustomize_cmd()
    except ck.CheckError as e:
        pytest.skip(str(e))
    tree = ck.stage(tmp)
    kdir = tree / "overlays" / overlay
    if patches:
        k = kdir / "kustomization.yaml"
        kust = ck.yaml.safe_load(k.read_text())
        kust.setdefault("patches", []).append(
            {"target": {"kind": "Job", "name": "cohort-train"}, "patch": json.dumps(patches)}
        )
        k.write_text(ck.yaml.safe_dump(kust))
    return Rendering(ck.render(kdir), (tree / ck.TOKEN_FILE).read_text())


# --- pods as processes -------------------------------------------------------


@dataclass
class Pod:
    """One pod of the rendering, to be run on a host."""

    name: str
    template: Doc
    host: Any
    labels: dict[str, str]
    annotations: dict[str, str] = field(default_factory=dict)
    index: int | None = None  # completion index of an Indexed Job's pod
    hostname: str = ""
    subdomain: str = ""


class Runner:
    """Turns pods of a rendering into processes on hosts."""

    def __init__(self, rendering: Rendering, cluster: Any, tmp: Path) -> None:
        self.r = rendering
        self.cluster = cluster
        self.tmp = tmp
        # the pods' users must reach their volumes and the image
        tmp.mkdir(parents=True, exist_ok=True)
        for d in (tmp, tmp.parent):
            os.chmod(d, 0o755)
        self.image = self._image_tree(tmp / "image")

    # DNS: every Service name, and pod hostname.subdomain, on every host
    # (a headless Service's name resolves only once its pods are ready:
    # publish a pod's names when it is)
    def publish_dns(self, pods: list[Pod]) -> None:
        entries: list[tuple[str, str]] = []
        for svc in (d for d in self.r.docs if d["kind"] == "Service"):
            name = svc["metadata"]["name"]
            sel = svc["spec"].get("selector", {})
            backends = [p for p in pods if ck.selects(sel, p.labels)]
            for p in backends:
                # a headless Service answers with its pods' addresses
                for n in _dns_names(name):
                    entries.append((n, p.host.addr))
                if p.subdomain == name and p.hostname:
                    for n in _dns_names(f"{p.hostname}.{name}"):
                        entries.append((n, p.host.addr))
        for h in self.cluster.hosts:
            for n, a in entries:
                h.add_hosts_entry(n, a)

    def argv_env(self, pod: Pod, exec_argv: list[str] | None = None) -> tuple[list[str], dict[str, str]]:
        """The pod's process: its user, command and environment. With
        exec_argv: that command in the pod instead (kubectl exec)."""
        spec = pod.template["spec"]
        assert len(spec["containers"]) == 1, f"{pod.name}: one container per pod expected"
        c = spec["containers"][0]
        voldir = self.tmp / pod.name
        mounts = self._volumes(pod, c, voldir)
        env: dict[str, str] = {}
        if pod.index is not None:
            env["JOB_COMPLETION_INDEX"] = str(pod.index)
        for e in c.get("env", []):
            if "value" in e:
                env[e["name"]] = ck.expand(str(e["value"]), env)
            else:
                env[e["name"]] = self._value_from(pod, e["name"], e["valueFrom"])
        assert c.get("command"), f"{pod.name}: the manifest must set command (the image's CMD is cohortd)"
        argv = [ck.expand(str(a), env) for a in exec_argv or c["command"] + c.get("args", [])]
        paths = dict(mounts)
        paths.update(self.image)
        argv = [_remap(a, paths) for a in argv]
        env = {k: _remap(v, paths) for k, v in env.items()}
        exe = argv[0]
        assert exe.startswith("/") and Path(exe).exists(), f"{pod.name}: {c['command'][0]} is not in the image"
        return self._as_user(spec, c) + argv, env

    def exec(self, pod: Pod, argv: list[str], timeout: float = 30) -> str:
        """kubectl exec: argv in the pod's container (its user, volumes
        and environment); its output, which must be a success."""
        full, env = self.argv_env(pod, argv)
        r = pod.host.run(full, env=env, timeout=timeout)
        assert r.returncode == 0, f"kubectl exec {pod.name} -- {' '.join(argv)}: rc={r.returncode}\n{r.stdout}"
        return r.stdout

    def spawn(self, pod: Pod, extra_env: dict[str, str] | None = None) -> Any:
        argv, env = self.argv_env(pod)
        env.update(extra_env or {})
        p = pod.host.spawn(argv, env=env)
        p.pod = pod
        return p

    @staticmethod
    def _image_tree(root: Path) -> dict[str, str]:
        """The image's files under root: the programs as links to this
        build, the data set as a copy; {path in the image: local path}."""
        out = {}
        for path, local in image_files().items():
            dst = root / path.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.access(local, os.X_OK):
                dst.symlink_to(local)
            else:
                shutil.copyfile(local, dst)
                os.chmod(dst, 0o644)
            out[path] = str(dst)
        for d in [root, *root.rglob("*")]:
            if d.is_dir() and not d.is_symlink():
                os.chmod(d, 0o755)
        return out

    def _value_from(self, pod: Pod, name: str, vf: Doc) -> str:
        if "fieldRef" in vf:
            fp = vf["fieldRef"]["fieldPath"]
            m = re.fullmatch(r"metadata\.(labels|annotations)\['([^']+)'\]", fp)
            if m:
                src = pod.labels if m.group(1) == "labels" else pod.annotations
                return src.get(m.group(2), "")
            fields = {
                "metadata.name": pod.name,
                "metadata.namespace": NAMESPACE,
                "status.podIP": pod.host.addr,
                "status.podIPs": pod.host.addr,
                "status.hostIP": pod.host.addr,
                "spec.nodeName": pod.host.name,
                "spec.serviceAccountName": "default",
            }
            assert fp in fields, f"{pod.name}: env {name}: fieldRef {fp} not emulated"
            return fields[fp]
        if "secretKeyRef" in vf:
            ref = vf["secretKeyRef"]
            return ck.secret_value(self.r.docs, ref["name"], ref["key"])
        raise AssertionError(f"{pod.name}: env {name}: valueFrom {sorted(vf)} not emulated")

    def _volumes(self, pod: Pod, c: Doc, voldir: Path) -> dict[str, str]:
        """Creates the container's volumes; {mountPath: local dir}."""
        spec = pod.template["spec"]
        psc = spec.get("securityContext", {})
        fs_group = psc.get("fsGroup")
        uid = c.get("securityContext", {}).get("runAsUser", psc.get("runAsUser", 0))
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {v["metadata"]["name"] for v in pod.template.get("_claims", [])}
        out: dict[str, str] = {}
        for m in c.get("volumeMounts", []):
            d = voldir / m["name"]
            d.mkdir(parents=True, exist_ok=True)
            v = vols.get(m["name"])
            if v is not None and "secret" in v:
                sec = v["secret"]
                mode = sec.get("defaultMode", 0o644)
                secret = next(
                    x for x in self.r.docs if x["kind"] == "Secret" and x["metadata"]["name"] == sec["secretName"]
                )
                for key in secret.get("data", {}):
                    f = d / key
                    f.write_text(ck.secret_value(self.r.docs, sec["secretName"], key))
                    os.chown(f, 0, fs_group if fs_group is not None else 0)
                    os.chmod(f, mode)
                os.chmod(d, 0o755)
            elif (v is not None and "emptyDir" in v) or m["name"] in claims:
                # a fresh volume the pod's user can write (fsGroup: the
                # group owns it, setgid, as the kubelet does)
                if fs_group is not None:
                    os.chown(d, 0, fs_group)
                    os.chmod(d, 0o2775)
                else:
                    os.chown(d, uid, 0)
                    os.chmod(d, 0o755)
            else:
                raise AssertionError(f"{pod.name}: volume {m['name']} not emulated")
            out[m["mountPath"]] = str(d)
        os.chmod(voldir, 0o755)
        return out

    @staticmethod
    def _as_user(spec: Doc, c: Doc) -> list[str]:
        psc = spec.get("securityContext", {})
        csc = c.get("securityContext", {})
        uid = csc.get("runAsUser", psc.get("runAsUser"))
        gid = csc.get("runAsGroup", psc.get("runAsGroup", uid))
        nonroot = csc.get("runAsNonRoot", psc.get("runAsNonRoot"))
        if nonroot:
            assert uid not in (None, 0), "runAsNonRoot needs a numeric non-zero runAsUser (the image's USER is 65532)"
        if uid is None:
            return []
        argv = ["setpriv", "--reuid", str(uid), "--regid", str(gid)]
        fs = psc.get("fsGroup")
        argv += ["--groups", str(fs)] if fs is not None else ["--clear-groups"]
        if csc.get("allowPrivilegeEscalation") is False:
            argv.append("--no-new-privs")
        if csc.get("capabilities", {}).get("drop") == ["ALL"]:
            argv += ["--bounding-set", "-all", "--inh-caps", "-all"]
        return argv + ["--"]


def _dns_names(name: str) -> list[str]:
    return [name, f"{name}.{NAMESPACE}", f"{name}.{NAMESPACE}.svc", f"{name}.{NAMESPACE}.svc.cluster.local"]


def _remap(s: str, paths: dict[str, str]) -> str:
    """Replaces image and mount paths inside s (also after '@', '=', ':')."""
    alt = "|".join(re.escape(p) for p in sorted(paths, key=len, reverse=True))
    return re.sub(r"(?:^|(?<=[@=:]))(" + alt + r")(?=/|$)", lambda m: paths[m.group(1)], s)


def coordinator_pod(r: Rendering, host: Any) -> Pod:
    sts = r.one("StatefulSet")
    tpl = copy.deepcopy(sts["spec"]["template"])
    tpl["_claims"] = sts["spec"].get("volumeClaimTemplates", [])
    name = f"{sts['metadata']['name']}-0"
    labels = dict(tpl["metadata"].get("labels", {}))
    labels["statefulset.kubernetes.io/pod-name"] = name
    labels["apps.kubernetes.io/pod-index"] = "0"
    return Pod(name, tpl, host, labels, dict(tpl["metadata"].get("annotations", {})), hostname=name,
               subdomain=sts["spec"]["serviceName"])  # fmt: skip


def job_pods(job: Doc, hosts: list[Any], failures: int = 0) -> list[Pod]:
    """The pods the Job controller creates for an Indexed Job: one per
    index, with its labels and annotations (``failures``: the index's
    retry, batch.kubernetes.io/job-index-failure-count)."""
    spec = job["spec"]
    n = spec["completions"]
    assert spec.get("completionMode") == "Indexed"
    assert spec["parallelism"] >= n, "all ranks must run at once"
    assert len(hosts) == n
    name = job["metadata"]["name"]
    tpl = job["spec"]["template"]
    pods = []
    for i, h in enumerate(hosts):
        labels = dict(tpl["metadata"].get("labels", {}))
        labels.update({
            "batch.kubernetes.io/job-name": name, "job-name": name,
            "batch.kubernetes.io/controller-uid": f"uid-{name}", "controller-uid": f"uid-{name}",
            "batch.kubernetes.io/job-completion-index": str(i),
        })  # fmt: skip
        ann = dict(tpl["metadata"].get("annotations", {}))
        ann["batch.kubernetes.io/job-completion-index"] = str(i)
        if spec.get("backoffLimitPerIndex") is not None:
            ann["batch.kubernetes.io/job-index-failure-count"] = str(failures)
        pods.append(Pod(f"{name}-{i}-x{failures}k8s", tpl, h, labels, ann, index=i,
                        hostname=f"{name}-{i}", subdomain=tpl["spec"].get("subdomain", "")))  # fmt: skip
    return pods


# --- probes --------------------------------------------------------------------

_PROBE = r"""
import json, sys, time, urllib.request, urllib.error
urls, deadline = json.loads(sys.argv[1]), time.monotonic() + float(sys.argv[2])
out = {}
for u in urls:
    while True:
        try:
            with urllib.request.urlopen(u, timeout=2) as r:
                out[u] = [r.status, r.read(65536).decode(errors="replace")]
                break
        except urllib.error.HTTPError as e:
            out[u] = [e.code, ""]
        except OSError as e:
            out[u] = [0, str(e)]
        if time.monotonic() > deadline:
            break
        time.sleep(0.1)
print(json.dumps(out))
"""


def probe(host: Any, urls: list[str], timeout: float) -> dict[str, list[Any]]:
    """GETs each URL from host until it answers 200 (or timeout)."""
    r = host.run([sys.executable, "-c", _PROBE, json.dumps(urls), str(timeout)], timeout=timeout * len(urls) + 15)
    lines = [ln for ln in r.stdout.splitlines() if ln.startswith("{")]
    assert lines, f"probe failed:\n{r.stdout}"
    return json.loads(lines[-1])


def kubelet_probes(pod: Pod, timeout: float = 30) -> dict[str, list[Any]]:
    """The pod's startup, readiness and liveness probes and its
    Prometheus scrape, as the kubelet and Prometheus would do them."""
    c = pod.template["spec"]["containers"][0]
    ports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    urls = {}
    for kind in ("startupProbe", "readinessProbe", "livenessProbe"):
        hg = c.get(kind, {}).get("httpGet")
        assert hg, f"{pod.name}: no {kind}"
        port = ports.get(hg["port"], hg["port"])
        urls[kind] = f"http://{pod.host.addr}:{port}{hg['path']}"
    ann = pod.annotations
    if ann.get("prometheus.io/scrape") == "true":
        path = ann.get("prometheus.io/path", "/metrics")
        urls["prometheus"] = f"http://{pod.host.addr}:{ann['prometheus.io/port']}{path}"
    got = probe(pod.host, list(urls.values()), timeout)
    return {k: got[u] for k, u in urls.items()}


# --- running ---------------------------------------------------------------------


def wait_all(procs: list[Any], timeout: float) -> None:
    end = time.monotonic() + timeout
    for p in procs:
        try:
            p.wait(timeout=max(0.1, end - time.monotonic()))
        except subprocess.TimeoutExpired:
            pass


def logs(procs: list[Any]) -> str:
    out = []
    for p in procs:
        out.append(f"--- {p.pod.name} on {p.pod.host.name} rc={p.poll()}")
        out.append(_read(p)[-4000:])
    return "\n".join(out)


def _read(p: Any) -> str:
    try:
        return Path(p.log_path).read_text(errors="replace")
    except FileNotFoundError:
        return ""


def final_lines(p: Any) -> dict[str, Any]:
    """train_digits' final lines (rank 0): accuracy and checksums."""
    text = _read(p)
    m = re.search(r"^final: test accuracy ([0-9.]+) .*?, (\d+) ranks?,", text, re.M)
    cs = re.search(r"^parameter checksums:(.*)$", text, re.M)
    eq = re.search(r"^all equal: (\w+)$", text, re.M)
    assert m and cs and eq, f"no final lines from {p.pod.name}:\n{text[-3000:]}"
    sums = dict(kv.split(":") for kv in cs.group(1).split())
    return {"accuracy": float(m.group(1)), "ranks": int(m.group(2)), "checksums": sums, "equal": eq.group(1)}


def run_job(runner: Runner, job: Doc, hosts: list[Any], failures: int = 0,
            extra_env: dict[str, str] | None = None) -> list[Any]:  # fmt: skip
    return [runner.spawn(p, extra_env) for p in job_pods(job, hosts, failures)]


def sigterm(p: Any, grace: float) -> int:
    """What the kubelet does to a pod: SIGTERM, then SIGKILL after grace."""
    os.killpg(p.pid, signal.SIGTERM)
    try:
        return p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
        raise AssertionError(f"{p.pod.name} ignored SIGTERM for {grace} s")


@pytest.fixture
def tmp() -> Iterator[Path]:
    d = Path(tempfile.mkdtemp(prefix="k8s-pods-"))
    yield d
    shutil.rmtree(d, ignore_errors=True)


def _start(r: Rendering, cl: Any, tmp: Path, worker_hosts: list[Any]) -> tuple[Runner, Pod]:
    runner = Runner(r, cl, tmp / "pods")
    coord = coordinator_pod(r, cl.hosts[0])
    pods = [coord]
    for job, hosts in zip((d for d in r.docs if d["kind"] == "Job"), [worker_hosts]):
        pods += job_pods(job, hosts)
    runner.publish_dns(pods)
    return runner, coord


# --- tests -----------------------------------------------------------------------


def test_image_has_what_the_manifests_use(tmp: Path) -> None:
    """Every image path in the rendered manifests exists in the image the
    Dockerfile builds (the data set included), and maps to this build."""
    files = image_files()
    for overlay in ("cpu", "gpu"):
        r = render(tmp / overlay, overlay)
        for d in r.docs:
            if d["kind"] not in ("StatefulSet", "Job"):
                continue
            for c in d["spec"]["template"]["spec"]["containers"]:
                words = c.get("command", []) + c.get("args", [])
                for w in words:
                    for path in re.findall(r"(/opt/\S+)", str(w)):
                        assert path in files, f"{overlay}: {d['kind']} uses {path}, which the image does not have"


def test_cpu_overlay_trains(tmp: Path) -> None:
    """overlays/cpu as shipped: cohortd up with its probes and metrics, the
    workers started before it (kubectl apply gives no order), every rank
    trains to the end with identical parameters, `cohort status` shows the
    job, and cohortd stops cleanly on SIGTERM with its journal written."""
    r = render(tmp, "cpu")
    job = r.one("Job")
    n = job["spec"]["completions"]
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner = Runner(r, cl, tmp / "pods")
        coord = coordinator_pod(r, cl.hosts[0])
        runner.publish_dns(job_pods(job, cl.hosts[1:]))
        workers = run_job(runner, job, cl.hosts[1:])
        # "cohortd" does not resolve yet: the workers must keep trying
        time.sleep(1)
        assert all(p.poll() is None for p in workers), logs(workers)
        cohortd = runner.spawn(coord)
        got = kubelet_probes(coord)
        for kind, (status, body) in got.items():
            assert status == 200, f"{kind}: HTTP {status} {body}\n{logs([cohortd])}"
        runner.publish_dns([coord])  # ready: the endpoints controller publishes it
        assert "cohort_" in got["prometheus"][1], "no cohort_ metrics at the scrape target"
        wait_all(workers, RUN_TIMEOUT)
        everyone = workers + [cohortd]
        assert all(p.returncode == 0 for p in workers), logs(everyone)
        f = final_lines(workers[0])
        assert f["ranks"] == n and len(f["checksums"]) == n, logs(everyone)
        assert f["equal"] == "yes" and len(set(f["checksums"].values())) == 1, logs(everyone)
        assert f["accuracy"] > 0.9, f
        # kubectl exec cohortd-0 -- cohort status: every job (the pod's
        # admin secret); the preset job stays, finished
        status = runner.exec(coord, STATUS)
        assert re.search(rf"job {job['metadata']['name']} .*state finished", status), status
        assert cohortd.poll() is None, logs([cohortd])
        grace = coord.template["spec"].get("terminationGracePeriodSeconds", 30)
        assert sigterm(cohortd, grace) == 0, logs([cohortd])
        journal = Path(runner.tmp) / coord.name / "journal"
        assert any(journal.iterdir()), "cohortd wrote no journal into its volume"
        owners = {p.stat().st_uid for p in journal.rglob("*")}
        want = coord.template["spec"]["securityContext"]["runAsUser"]
        assert owners == {want}, f"journal files owned by {owners}, not the pod's user {want}"


def test_world_size_follows_completions_and_jobs_stay_apart(tmp: Path) -> None:
    """completions changed in one place (a patch in the overlay) resizes
    the whole job. A second Job on the same cohortd (another name, as a
    user creates one) is another cohort job: with the first Job's token
    cohortd (--require-token) refuses to create it; with the token minted
    for its name (kubectl exec cohortd-0 -- cohort token NAME, into a
    Secret of its own) both train at once, each with its own world."""
    r = render(tmp, "cpu", [{"op": "replace", "path": "/spec/completions", "value": 2}])
    job = r.one("Job")
    assert job["spec"]["completions"] == 2 and job["spec"]["parallelism"] == 2
    env = {e["name"]: e.get("value") for e in job["spec"]["template"]["spec"]["containers"][0]["env"]}
    assert env["COHORT_WORLD_SIZE"] == "2"
    job_b = copy.deepcopy(job)
    job_b["metadata"]["name"] = "cohort-train-b"
    with Cluster(n_hosts=5, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:3])
        cohortd = runner.spawn(coord)
        assert kubelet_probes(coord)["readinessProbe"][0] == 200, logs([cohortd])
        refused = run_job(runner, job_b, cl.hosts[3:5])
        wait_all(refused, 30)
        for p in refused:
            assert p.returncode not in (None, 0) and "cohort token" in _read(p), logs(refused)
        token = runner.exec(coord, ["/opt/cohort/bin/cohort", "token", "cohort-train-b"]).strip()
        assert re.fullmatch(r"[0-9a-f]{64}", token), token
        r.docs.append({
            "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
            "metadata": {"name": "cohort-train-b-token"},
            "data": {"token": base64.b64encode(token.encode()).decode()},
        })  # fmt: skip
        for e in job_b["spec"]["template"]["spec"]["containers"][0]["env"]:
            if e["name"] == "COHORT_TOKEN":
                e["valueFrom"]["secretKeyRef"]["name"] = "cohort-train-b-token"
        a = run_job(runner, job, cl.hosts[1:3])
        b = run_job(runner, job_b, cl.hosts[3:5])
        wait_all(a + b, RUN_TIMEOUT)
        assert all(p.returncode == 0 for p in a + b), logs(a + b + [cohortd])
        for procs in (a, b):
            f = final_lines(procs[0])
            assert f["ranks"] == 2 and f["equal"] == "yes", logs(a + b)
        # Had the two Jobs shared a cohort job, its world of 2 would have
        # met 4 ranks. The preset job (cohortd --job) outlives its run;
        # cohort-train-b, created by its first rank, left with its last.
        status = runner.exec(coord, STATUS)
        assert "job cohort-train " in status and "cohort-train-b" not in status, status


def test_fault_drill_restarts_the_group(tmp: Path) -> None:
    """The drill of docs/kubernetes.md: a fault schedule in the Job's
    environment kills rank 2 mid-training; every other rank stops within
    seconds naming rank 2 (no hang); the Job controller, as the manifest
    tells it (backoffLimitPerIndex), retries every index once with
    job-index-failure-count 1, which reaches libcohort as
    COHORT_RESTART_COUNT, so the rule (run=0) does not fire again and the
    group trains to the end."""
    r = render(tmp, "cpu", [{
        "op": "add", "path": "/spec/template/spec/containers/0/env/-",
        "value": {"name": "COHORT_FAULTS", "value": "rank=2,at=op:100,action=kill"},
    }])  # fmt: skip
    job = r.one("Job")
    n = job["spec"]["completions"]
    assert n >= 3
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:])
        cohortd = runner.spawn(coord)
        t0 = time.monotonic()
        first = run_job(runner, job, cl.hosts[1:])
        wait_all(first, 60)
        took = time.monotonic() - t0
        assert all(p.returncode is not None for p in first), "a rank hangs after the fault\n" + logs(first)
        assert first[2].returncode == -signal.SIGKILL, logs(first)
        for i, p in enumerate(first):
            if i != 2:
                assert p.returncode != 0, logs(first)
                assert "rank 2" in _read(p), logs(first)
        assert took < 30, f"the group took {took:.1f} s to stop"
        status = runner.exec(coord, STATUS)
        assert re.search(r"state failed", status) and "failed: rank 2" in status, status
        retries = job["spec"].get("backoffLimitPerIndex")
        assert retries and retries >= 1, "the Job does not retry a failed index"
        second = run_job(runner, job, cl.hosts[1:], failures=1)
        wait_all(second, RUN_TIMEOUT)
        assert all(p.returncode == 0 for p in second), logs(second + [cohortd])
        f = final_lines(second[0])
        assert f["ranks"] == n and f["equal"] == "yes"


def test_gpu_overlay_selects_nccl(tmp: Path) -> None:
    """overlays/gpu: the workers rendezvous through cohortd and then use
    the nccl backend. Here (no GPU, or with the CPU-only demo trainer) every
    rank must stop at once with an error naming the nccl backend, not
    hang and not fall back to tcp."""
    r = render(tmp, "gpu")
    job = r.one("Job")
    c = job["spec"]["template"]["spec"]["containers"][0]
    assert "nvidia.com/gpu" in c["resources"]["limits"]
    n = job["spec"]["completions"]
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:])
        cohortd = runner.spawn(coord)
        workers = run_job(runner, job, cl.hosts[1:])
        wait_all(workers, 60)
        assert all(p.returncode not in (None, 0) for p in workers), logs(workers + [cohortd])
        for p in workers:
            assert "nccl" in _read(p), logs(workers)
