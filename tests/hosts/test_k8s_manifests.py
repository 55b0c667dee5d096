"""The Kubernetes manifests, executed: deploy/k8s rendered with kustomize and
run as real processes on simulated hosts, so that a broken manifest fails a
test and not a cluster.

Each overlay is rendered the way a user deploys it (tools/check-k8s.py
copies deploy/k8s, writes a token with gen-token.sh, runs kustomize).
Then every pod is played by a process on a host of its own (a network
namespace, tests/hosts/hostnet.py), started from its container's command,
args and environment exactly as the kubelet would resolve them:

- env ``value`` with ``$(VAR)`` expansion; ``fieldRef`` from the pod
  (``status.podIP`` is the host's address, ``metadata.namespace`` the
  pod's namespace, ``metadata.labels[...]`` and ``metadata.annotations[...]``
  are what the Job (or JobSet) controller puts on a pod of an Indexed
  Job, absent ones are empty); ``secretKeyRef`` from the rendered Secret;
  ``JOB_COMPLETION_INDEX`` as the Job controller sets it;
- init containers run to completion, in order, before the container;
- Secret volumes become files (mode from ``defaultMode``, group from
  ``fsGroup``), the PVC and emptyDirs become directories the pod's user
  can write;
- the termination message: the file at ``terminationMessagePath``
  (``/dev/termination-log``, a file the container's user may write), else,
  with ``FallbackToLogsOnError`` and a failed container, the last 80 lines
  (at most 2048 bytes) of its log, as the kubelet reads them;
- paths of the image (/opt/cohort/...) map to build/bin, the data set,
  the example trainer and the venv's Python, as deploy/docker/Dockerfile
  lays them out (checked against it);
- the pod's user is ``runAsUser``/``runAsGroup`` (+ ``fsGroup``), with
  no_new_privs (``allowPrivilegeEscalation: false``) and an empty
  capability bounding set (``drop: [ALL]``), through setpriv;
- Service DNS names (``cohortd``, ``cohortd.NAMESPACE.svc``, ...) resolve,
  through each host's /etc/hosts, to the host of the pod they select,
  once that pod is ready (a headless Service lists ready pods only);
- NetworkPolicies are enforced with nftables in each pod's host (the
  rules tools/check-k8s.py evaluates, turned into accept rules for the
  peers' addresses and ports, everything else dropped), as a network
  plugin that enforces them would;
- the Job controller's decisions: after a round of pods, each failed pod
  goes through the Job's ``podFailurePolicy`` (Ignore, Count, FailIndex,
  FailJob; rules in order, exit codes of the named container, pod
  conditions such as ``DisruptionTarget`` of an evicted pod), per-index
  failure counts against ``backoffLimitPerIndex``, ``maxFailedIndexes``;
  the next round's pods carry ``batch.kubernetes.io/job-index-failure-count``
  and ``...-ignored-failure-count`` as the controller writes them;
- an eviction (drain, preemption) is what the API server and kubelet do:
  the ``DisruptionTarget`` condition, SIGTERM, SIGKILL after the grace
  period;
- the kubelet's probes are HTTP GETs against the pod's address, and
  Prometheus scrapes what the annotations point at; Kueue's admission is
  the ``suspend`` flag turned off.

Not emulated: readOnlyRootFilesystem (the processes run from the build
tree), resource limits, scheduling (affinity, priority), the image itself
(tools/check-k8s.py lints it; the torch image's Python is this venv's,
made reachable for the pod's user in the process's own mount namespace).
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
    sys.modules.setdefault("check_k8s", mod)
    spec.loader.exec_module(mod)
    return mod


ck = _load_checker()


# --- the image ---------------------------------------------------------------


def image_files() -> dict[str, Path]:
    """The files of the images the manifests use, by their path in the
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
    # the torch target: its venv is this venv (the same torch and
    # Lightning), the example trainer this checkout's
    m = re.search(r"python3 -m venv (\S+)", text)
    assert m, "Dockerfile: the torch target makes no venv"
    files[m.group(1)] = Path(sys.prefix)
    for m in re.finditer(r"^COPY (examples/\S+) (\S+)/$", text, re.M):
        files[m.group(2) + "/" + Path(m.group(1)).name] = ROOT / m.group(1)
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
    namespace: str = NAMESPACE

    def one(self, kind: str, name: str | None = None) -> Doc:
        hits = [d for d in self.docs if d["kind"] == kind and (name is None or d["metadata"]["name"] == name)]
        assert len(hits) == 1, f"{len(hits)} {kind} {name or ''} in the rendering"
        return hits[0]

    def policies(self) -> list[Doc]:
        """Its NetworkPolicies, placed in its namespace."""
        out = []
        for d in self.docs:
            if d["kind"] == "NetworkPolicy":
                d = copy.deepcopy(d)
                d["metadata"]["namespace"] = self.namespace
                out.append(d)
        return out


def render(tmp: Path, overlay: str, patches: list[Doc] | None = None, kind: str = "Job",
           namespace: str = NAMESPACE, components: list[str] | None = None) -> Rendering:  # fmt: skip
    """kustomize build of overlays/<overlay> from a fresh copy of deploy/k8s
    with a generated token; ``patches`` (JSON patches for the worker
    ``kind``, Job or JobSet) and ``components`` are added to that
    overlay's kustomization first, the way a user customises it."""
    try:
        ck.kustomize_cmd()
    except ck.CheckError as e:
        pytest.skip(str(e))
    tree = ck.stage(tmp)
    kdir = tree / "overlays" / overlay
    k = kdir / "kustomization.yaml"
    kust = ck.yaml.safe_load(k.read_text())
    if patches:
        kust.setdefault("patches", []).append({"target": {"kind": kind, "name": "cohort-train"}, "patch": json.dumps(patches)})
    if components:
        kust.setdefault("components", []).extend(f"../../components/{c}" for c in components)
    k.write_text(ck.yaml.safe_dump(kust))
    return Rendering(ck.render(kdir), (tree / ck.TOKEN_FILE).read_text(), namespace)


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
    namespace: str = NAMESPACE
    conditions: dict[str, str] = field(default_factory=dict)  # type -> status

    @property
    def container(self) -> Doc:
        return self.template["spec"]["containers"][0]


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
            backends = [p for p in pods if ck.selects(sel, p.labels) and p.namespace == self.r.namespace]
            for p in backends:
                # a headless Service answers with its pods' addresses
                for n in _dns_names(name, self.r.namespace):
                    entries.append((n, p.host.addr))
                if p.subdomain == name and p.hostname:
                    for n in _dns_names(f"{p.hostname}.{name}", self.r.namespace):
                        entries.append((n, p.host.addr))
        for h in self.cluster.hosts:
            for n, a in entries:
                h.add_hosts_entry(n, a)

    def argv_env(self, pod: Pod, exec_argv: list[str] | None = None,
                 c: Doc | None = None) -> tuple[list[str], dict[str, str], str | None]:  # fmt: skip
        """The process of container c (default: the pod's container): its
        user, command, environment and working directory. With exec_argv:
        that command in the container instead (kubectl exec)."""
        spec = pod.template["spec"]
        assert len(spec["containers"]) == 1, f"{pod.name}: one container per pod expected"
        c = c or spec["containers"][0]
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
        if exec_argv is None:
            # the kubelet's termination-message file, writable by the
            # container's user
            tm = self.termination_file(pod, c)
            tm.parent.mkdir(parents=True, exist_ok=True)
            tm.touch()
            os.chown(tm, *self._uid_gid(spec, c))
            os.chmod(tm, 0o660)
            paths[c.get("terminationMessagePath", "/dev/termination-log")] = str(tm)
        argv = [_remap(a, paths) for a in argv]
        env = {k: _remap(v, paths) for k, v in env.items()}
        exe = argv[0]
        assert exe.startswith("/") and Path(exe).exists(), f"{pod.name}: {c['command'][0]} is not in the image"
        cwd = _remap(c["workingDir"], paths) if "workingDir" in c else None
        full = self._as_user(spec, c) + argv
        if any(a.endswith("/venv/bin/python") for a in argv):
            full = self._python_reachable(full)
        return full, env, cwd

    def _python_reachable(self, argv: list[str]) -> list[str]:
        """The torch image has its own Python; here the venv's interpreter
        lives under a directory the pod's user may not enter (pyenv under
        /root). In the process's own mount namespace (ip netns exec gives
        it one), as root before it becomes the pod's user, that directory
        is covered with an empty one holding just the interpreter's tree."""
        real = Path(os.path.realpath(sys.executable))
        blocked = next((d for d in reversed(real.parents) if not d.stat().st_mode & 0o001), None)
        if blocked is None:
            return argv
        child = real.relative_to(blocked).parts[0]
        stage = self.tmp / "python-stage"
        stage.mkdir(exist_ok=True)
        script = (
            'src=$1 stage=$2 blocked=$3 child=$4; shift 4; mount --bind "$src" "$stage" '
            '&& mount -t tmpfs -o mode=755 tmpfs "$blocked" && mkdir "$blocked/$child" '
            '&& mount --bind "$stage" "$blocked/$child" && exec "$@"'
        )
        return ["sh", "-c", script, "sh", str(blocked / child), str(stage), str(blocked), child, *argv]

    def termination_file(self, pod: Pod, c: Doc) -> Path:
        return self.tmp / pod.name / f"termination-{c['name']}"

    def exec(self, pod: Pod, argv: list[str], timeout: float = 30) -> str:
        """kubectl exec: argv in the pod's container (its user, volumes
        and environment); its output, which must be a success."""
        full, env, _ = self.argv_env(pod, argv)
        r = pod.host.run(full, env=env, timeout=timeout)
        assert r.returncode == 0, f"kubectl exec {pod.name} -- {' '.join(argv)}: rc={r.returncode}\n{r.stdout}"
        return r.stdout

    def spawn(self, pod: Pod, extra_env: dict[str, str] | None = None) -> Any:
        """The kubelet: each init container to completion (a failed one
        fails the pod: a finished process with its status), then the
        container."""
        for ic in pod.template["spec"].get("initContainers", []):
            argv, env, cwd = self.argv_env(pod, c=ic)
            r = pod.host.run(argv, env=env, cwd=cwd, timeout=60)
            if r.returncode != 0:
                p = pod.host.spawn(["sh", "-c", f'cat "$0"; exit {r.returncode}', str(self._log_copy(pod, ic, r.stdout))])
                p.pod = pod
                return p
        argv, env, cwd = self.argv_env(pod)
        env.update(extra_env or {})
        p = pod.host.spawn(argv, env=env, cwd=cwd)
        p.pod = pod
        return p

    def _log_copy(self, pod: Pod, c: Doc, text: str) -> Path:
        f = self.tmp / pod.name / f"init-{c['name']}.log"
        f.write_text(text)
        os.chmod(f, 0o644)
        return f

    def termination_message(self, p: Any) -> str:
        """What the kubelet puts in the container's status: the
        termination-message file, else with FallbackToLogsOnError and a
        failure the last 80 lines, at most 2048 bytes, of the log."""
        c = p.pod.container
        f = self.termination_file(p.pod, c)
        text = f.read_text(errors="replace") if f.exists() else ""
        if text.strip():
            return text[:4096]
        if c.get("terminationMessagePolicy") == "FallbackToLogsOnError" and p.returncode != 0:
            return "\n".join(_read(p).splitlines()[-80:])[-2048:]
        return ""

    @staticmethod
    def _image_tree(root: Path) -> dict[str, str]:
        """The image's files under root: the programs as links to this
        build, the data set as a copy; {path in the image: local path}."""
        out = {}
        for path, local in image_files().items():
            dst = root / path.lstrip("/")
            dst.parent.mkdir(parents=True, exist_ok=True)
            if os.access(local, os.X_OK) or local.suffix == ".py":
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
                "metadata.namespace": pod.namespace,
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
        """Creates the container's volumes (once per pod: its containers
        share them); {mountPath: local dir}."""
        spec = pod.template["spec"]
        psc = spec.get("securityContext", {})
        fs_group = psc.get("fsGroup")
        uid, _ = self._uid_gid(spec, c)
        vols = {v["name"]: v for v in spec.get("volumes", [])}
        claims = {v["metadata"]["name"] for v in pod.template.get("_claims", [])}
        out: dict[str, str] = {}
        for m in c.get("volumeMounts", []):
            d = voldir / m["name"]
            out[m["mountPath"]] = str(d)
            if d.exists():
                continue
            d.mkdir(parents=True)
            v = vols.get(m["name"])
            if v is not None and "secret" in v:
                sec = v["secret"]
                mode = sec.get("defaultMode", 0o644)
                secret = next(
                    (x for x in self.r.docs if x["kind"] == "Secret" and x["metadata"]["name"] == sec["secretName"]),
                    None,
                )
                assert secret is not None, f"{pod.name}: Secret {sec['secretName']} does not exist (the pod would not start)"
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
        os.chmod(voldir, 0o755)
        return out

    @staticmethod
    def _uid_gid(spec: Doc, c: Doc) -> tuple[int, int]:
        psc = spec.get("securityContext", {})
        csc = c.get("securityContext", {})
        uid = csc.get("runAsUser", psc.get("runAsUser", 0))
        return uid, csc.get("runAsGroup", psc.get("runAsGroup", uid))

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


def _dns_names(name: str, ns: str = NAMESPACE) -> list[str]:
    return [name, f"{name}.{ns}", f"{name}.{ns}.svc", f"{name}.{ns}.svc.cluster.local"]


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
               subdomain=sts["spec"]["serviceName"], namespace=r.namespace)  # fmt: skip


def worker_job(r: Rendering) -> Doc:
    """The worker Job of a rendering: the Job, or the one a JobSet's
    controller makes of its replicatedJob (named JOBSET-RJOB-0, with the
    JobSet's labels), as a Job the emulated Job controller runs."""
    jobs = [d for d in r.docs if d["kind"] == "Job"]
    if jobs:
        assert len(jobs) == 1
        return jobs[0]
    js = r.one("JobSet")
    assert not js["spec"].get("suspend"), "a suspended JobSet makes no Jobs (Kueue has not admitted it)"
    rj = js["spec"]["replicatedJobs"][0]
    name = f"{js['metadata']['name']}-{rj['name']}-0"
    spec = copy.deepcopy(rj["template"]["spec"])
    jl = {"jobset.sigs.k8s.io/jobset-name": js["metadata"]["name"],
          "jobset.sigs.k8s.io/replicatedjob-name": rj["name"], "jobset.sigs.k8s.io/job-index": "0",
          "jobset.sigs.k8s.io/restart-attempt": "0"}  # fmt: skip
    spec["template"]["metadata"].setdefault("labels", {}).update(jl)
    spec["template"]["spec"].setdefault("subdomain", js["metadata"]["name"])
    return {"apiVersion": "batch/v1", "kind": "Job", "metadata": {"name": name, "labels": jl}, "spec": spec}


def job_pods(job: Doc, hosts: list[Any], failures: int | list[int] = 0, ignored: int | list[int] = 0,
             namespace: str = NAMESPACE) -> list[Pod]:  # fmt: skip
    """The pods the Job controller creates for an Indexed Job: one per
    index, with its labels and annotations (``failures``, ``ignored``: the
    index's counted and ignored failures so far,
    batch.kubernetes.io/job-index-failure-count and
    ...-ignored-failure-count; one number for all, or one per index)."""
    spec = job["spec"]
    n = spec["completions"]
    assert spec.get("completionMode") == "Indexed"
    assert spec["parallelism"] >= n, "all ranks must run at once"
    assert not spec.get("suspend"), "a suspended Job starts no pod (Kueue has not admitted it)"
    assert len(hosts) == n
    fails = failures if isinstance(failures, list) else [failures] * n
    igns = ignored if isinstance(ignored, list) else [ignored] * n
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
            ann["batch.kubernetes.io/job-index-failure-count"] = str(fails[i])
            ann["batch.kubernetes.io/job-index-ignored-failure-count"] = str(igns[i])
        attempt = fails[i] + igns[i]
        pods.append(Pod(f"{name}-{i}-x{attempt}k8s", tpl, h, labels, ann, index=i,
                        hostname=f"{name}-{i}", subdomain=tpl["spec"].get("subdomain", ""),
                        namespace=namespace))  # fmt: skip
    return pods


# --- the Job controller --------------------------------------------------------


def exit_code(p: Any) -> int:
    """The container's exit code as the runtime reports it (128 + signal
    for a process a signal ended)."""
    rc = p.returncode
    assert rc is not None, f"{p.pod.name} still runs"
    return 128 - rc if rc < 0 else rc


def pod_failure_action(job: Doc, p: Any) -> str:
    """The Job controller's verdict on a failed pod: the action of the
    first podFailurePolicy rule it matches (Ignore, FailIndex, FailJob,
    Count), else Count. An onExitCodes rule looks at the containers it
    names (all, without containerName) that did not succeed; an
    onPodConditions rule at the pod's conditions."""
    code = exit_code(p)
    assert code != 0
    cname = p.pod.container["name"]
    for rule in job["spec"].get("podFailurePolicy", {}).get("rules", []):
        req = rule.get("onExitCodes")
        if req is not None:
            if req.get("containerName") not in (None, cname):
                continue
            inside = code in req["values"]
            if inside == (req["operator"] == "In"):
                return rule["action"]
            continue
        for cond in rule.get("onPodConditions", []):
            if p.pod.conditions.get(cond["type"]) == cond.get("status", "True"):
                return rule["action"]
    return "Count"


@dataclass
class JobController:
    """The Job controller's bookkeeping for an Indexed Job with
    backoffLimitPerIndex: per index, failures counted and ignored, and
    whether the Job has failed."""

    job: Doc
    failures: list[int] = field(default_factory=list)
    ignored: list[int] = field(default_factory=list)
    failed: str = ""  # why the Job failed ("" while it has not)

    def __post_init__(self) -> None:
        n = self.job["spec"]["completions"]
        self.failures = [0] * n
        self.ignored = [0] * n

    def settle(self, procs: list[Any]) -> dict[int, str]:
        """One round of pods ended: each failed pod's action; the counts
        and the Job's state updated. {index: action} of the failed ones."""
        spec = self.job["spec"]
        acts = {}
        for p in procs:
            i = p.pod.index
            if exit_code(p) == 0:
                continue
            a = pod_failure_action(self.job, p)
            acts[i] = a
            if a == "Ignore":
                self.ignored[i] += 1
            elif a == "FailJob":
                self.failed = f"FailJob (index {i})"
            else:  # Count, FailIndex
                self.failures[i] += 1
                if a == "FailIndex":
                    self.failures[i] = spec.get("backoffLimitPerIndex", 0) + 1
        over = [i for i, f in enumerate(self.failures) if f > spec.get("backoffLimitPerIndex", 0)]
        if over and len(over) > spec.get("maxFailedIndexes", len(self.failures)):
            self.failed = self.failed or f"MaxFailedIndexesExceeded (index {over})"
        return acts

    def pods(self, hosts: list[Any], namespace: str = NAMESPACE) -> list[Pod]:
        """The next round: a replacement for every index, with its counts."""
        assert not self.failed, f"the Job failed: {self.failed}"
        return job_pods(self.job, hosts, list(self.failures), list(self.ignored), namespace)


def evict(p: Any, grace: float) -> int:
    """An API-initiated eviction (kubectl drain, the autoscaler, a
    preemption): the pod gets DisruptionTarget=True, then the kubelet's
    SIGTERM and, after the grace period, SIGKILL. Its exit code."""
    p.pod.conditions["DisruptionTarget"] = "True"
    try:
        os.killpg(p.pid, signal.SIGTERM)
    except ProcessLookupError:
        pass
    try:
        p.wait(timeout=grace)
    except subprocess.TimeoutExpired:
        os.killpg(p.pid, signal.SIGKILL)
        p.wait(timeout=10)
    return exit_code(p)


# --- NetworkPolicy, enforced ---------------------------------------------------


def _nft_ports(ranges: list[tuple[str, int, int]] | None) -> list[str]:
    """nft match expressions for port ranges (None: any port)."""
    if ranges is None:
        return [""]
    out = []
    for proto, lo, hi in ranges:
        out.append(f"{proto.lower()} dport {lo}-{hi} " if lo != hi else f"{proto.lower()} dport {lo} ")
    return out


def enforce_netpol(pods: list[Pod], policies: list[Doc]) -> None:
    """Turns the NetworkPolicies into nftables rules in each pod's host:
    a pod a policy isolates accepts (ingress) or sends (egress) only what
    a rule admits, for the addresses of the pods (of these) its peers
    select; loopback and established connections pass (the kubelet's
    probes come from the node, which NetworkPolicy always admits)."""
    by_host: dict[str, tuple[Any, list[Pod]]] = {}
    for p in pods:
        by_host.setdefault(p.host.name, (p.host, []))[1].append(p)
    for host, mine in by_host.values():
        chains = {"input": [], "output": []}
        for p in mine:
            ref = ck.PodRef(p.namespace, p.labels, {q["name"]: q["containerPort"] for q in p.container.get("ports", [])},
                            p.name)  # fmt: skip
            for direction, chain, key, addr in (("Ingress", "input", "from", "saddr"), ("Egress", "output", "to", "daddr")):
                pols = ck._selecting(policies, ref, direction, p.namespace)
                if not pols:
                    continue
                rules = ["ct state established,related accept", f'{"iif" if chain == "input" else "oif"} "lo" accept']
                for np in pols:
                    for r in np["spec"].get("ingress" if direction == "Ingress" else "egress", []):
                        if not r.get(key):
                            # no peers: every address (ports of this pod,
                            # for ingress)
                            for ports in _nft_ports(ck.port_ranges(r, ref)):
                                rules.append(f"{ports}accept" if ports else "accept")
                            continue
                        for q in pods:
                            if q.host is host:
                                continue
                            qref = ck.PodRef(q.namespace, q.labels,
                                             {x["name"]: x["containerPort"] for x in q.container.get("ports", [])}, q.name)  # fmt: skip
                            peers = r.get(key)
                            if peers and not any(ck._peer_matches(x, np["metadata"]["namespace"], qref) for x in peers):
                                continue
                            dst = ref if direction == "Ingress" else qref
                            for ports in _nft_ports(ck.port_ranges(r, dst)):
                                rules.append(f"ip {addr} {q.host.addr} {ports}accept")
                rules.append("drop")
                chains[chain] = rules
        text = "table inet netpol {\n"
        for chain, rules in chains.items():
            text += f"  chain {chain} {{ type filter hook {chain} priority 10; policy accept;\n"
            text += "".join(f"    {r}\n" for r in rules) + "  }\n"
        if _has_netpol(host):
            host._nft("delete table inet netpol\n")
        host._nft(text + "}\n")


def _has_netpol(host: Any) -> bool:
    r = subprocess.run(["ip", "netns", "exec", host.ns, "nft", "list", "tables"], capture_output=True, text=True)
    return "table inet netpol" in r.stdout


_CONNECT = r"""
import socket, sys
s = socket.socket()
s.settimeout(float(sys.argv[3]))
try:
    s.connect((sys.argv[1], int(sys.argv[2])))
    print("connected")
except OSError as e:
    print(f"refused: {e}")
"""


def can_connect(host: Any, addr: str, port: int, timeout: float = 2.0) -> bool:
    """Whether a TCP connection from host to addr:port is established."""
    r = host.run([sys.executable, "-c", _CONNECT, addr, str(port), str(timeout)], timeout=timeout + 15)
    return "connected" in r.stdout


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


def run_job(runner: Runner, job: Doc, hosts: list[Any], failures: int | list[int] = 0,
            extra_env: dict[str, str] | None = None, pods: list[Pod] | None = None) -> list[Any]:  # fmt: skip
    pods = pods or job_pods(job, hosts, failures, namespace=runner.r.namespace)
    return [runner.spawn(p, extra_env) for p in pods]


def wait_for_log(p: Any, pattern: str, timeout: float) -> bool:
    end = time.monotonic() + timeout
    while time.monotonic() < end:
        if re.search(pattern, _read(p), re.M):
            return True
        if p.poll() is not None:
            return bool(re.search(pattern, _read(p), re.M))
        time.sleep(0.05)
    return False


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
    pods = [coord] + job_pods(worker_job(r), worker_hosts, namespace=r.namespace)
    runner.publish_dns(pods)
    return runner, coord


# --- tests -----------------------------------------------------------------------

ALL_OVERLAYS = ("cpu", "gpu", "pytorch", "tenant", "jobset", "kueue")


def test_image_has_what_the_manifests_use(tmp: Path) -> None:
    """Every image path in the rendered manifests (commands, arguments,
    init containers) exists in the image the Dockerfile builds (the data
    set, the torch target's Python and example trainer included), and
    maps to this build."""
    files = image_files()
    for overlay in ALL_OVERLAYS:
        r = render(tmp / overlay, overlay)
        for obj, tpl in ck.pod_templates(r.docs):
            for c in tpl["spec"].get("initContainers", []) + tpl["spec"]["containers"]:
                for w in c.get("command", []) + c.get("args", []):
                    for path in re.findall(r"(/opt/\S+)", str(w)):
                        inside = [f for f in files if path == f or path.startswith(f + "/")]
                        assert inside and (path in files or (files[inside[0]] / path[len(inside[0]) + 1 :]).exists()), (
                            f"{overlay}: {obj['kind']} uses {path}, which the image does not have"
                        )


def test_cpu_overlay_trains(tmp: Path) -> None:
    """overlays/cpu as shipped, its NetworkPolicies enforced: cohortd up
    with its probes and metrics, the workers started before it (kubectl
    apply gives no order), every rank trains to the end with identical
    parameters, a stranger pod reaches cohortd's metrics port but not its
    control port, `cohort status` shows the job, and cohortd stops cleanly
    on SIGTERM with its journal written."""
    r = render(tmp, "cpu")
    job = r.one("Job")
    n = job["spec"]["completions"]
    with Cluster(n_hosts=2 + n, name="k8s") as cl:
        runner = Runner(r, cl, tmp / "pods")
        coord = coordinator_pod(r, cl.hosts[0])
        pods = job_pods(job, cl.hosts[1 : 1 + n])
        stranger = cl.hosts[1 + n]  # a pod of the namespace without cohort's labels
        runner.publish_dns(pods)
        enforce_netpol([coord, *pods], r.policies())
        workers = [runner.spawn(p) for p in pods]
        # "cohortd" does not resolve yet: the workers must keep trying
        time.sleep(1)
        assert all(p.poll() is None for p in workers), logs(workers)
        cohortd = runner.spawn(coord)
        got = kubelet_probes(coord)
        for kind, (status, body) in got.items():
            assert status == 200, f"{kind}: HTTP {status} {body}\n{logs([cohortd])}"
        runner.publish_dns([coord])  # ready: the endpoints controller publishes it
        assert "cohort_" in got["prometheus"][1], "no cohort_ metrics at the scrape target"
        assert not can_connect(stranger, coord.host.addr, ck.CONTROL_PORT), "a stranger reached cohortd's control port"
        assert can_connect(stranger, coord.host.addr, ck.HTTP_PORT), "the metrics port is closed to Prometheus"
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
    seconds naming rank 2 (no hang) and exits 250, "a peer was lost",
    with the error as its termination message. The Job controller, as the
    manifest tells it (podFailurePolicy, backoffLimitPerIndex), charges
    the failure to index 2 alone and starts every index again; index 2's
    pod carries job-index-failure-count 1, which reaches libcohort as
    COHORT_RESTART_COUNT, so the rule (run=0) does not fire again, and the
    group trains to the end."""
    r = render(tmp, "cpu", [{
        "op": "add", "path": "/spec/template/spec/containers/0/env/-",
        "value": {"name": "COHORT_FAULTS", "value": "rank=2,at=op:100,action=kill"},
    }])  # fmt: skip
    job = r.one("Job")
    n = job["spec"]["completions"]
    assert n >= 3
    jc = JobController(job)
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:])
        cohortd = runner.spawn(coord)
        t0 = time.monotonic()
        first = run_job(runner, job, cl.hosts[1:], pods=jc.pods(cl.hosts[1:]))
        wait_all(first, 60)
        took = time.monotonic() - t0
        assert all(p.returncode is not None for p in first), "a rank hangs after the fault\n" + logs(first)
        assert first[2].returncode == -signal.SIGKILL, logs(first)
        for i, p in enumerate(first):
            if i != 2:
                assert exit_code(p) == ck.EXIT_PEER_LOST, logs(first)
                msg = runner.termination_message(p)
                assert "rank 2" in msg and "COHORT_EPEERLOST" in msg, f"termination message of rank {i}: {msg!r}"
        assert took < 30, f"the group took {took:.1f} s to stop"
        status = runner.exec(coord, STATUS)
        assert re.search(r"state failed", status) and "failed: rank 2" in status, status
        acts = jc.settle(first)
        assert acts == {i: ("Count" if i == 2 else "Ignore") for i in range(n)}, acts
        assert jc.failures == [1 if i == 2 else 0 for i in range(n)] and not jc.failed, jc
        second = run_job(runner, job, cl.hosts[1:], pods=jc.pods(cl.hosts[1:]))
        wait_all(second, RUN_TIMEOUT)
        assert all(p.returncode == 0 for p in second), logs(second + [cohortd])
        f = final_lines(second[0])
        assert f["ranks"] == n and f["equal"] == "yes"


def test_evictions_use_no_retry(tmp: Path) -> None:
    """A node drain (or a preemption, an autoscaler scale-down) evicts one
    worker mid-training, twice in a row: each time the evicted pod ends
    with DisruptionTarget and the others exit 250 within seconds, so the
    podFailurePolicy ignores every failure: no index uses its retry, the
    Job survives the second disruption, and the third round trains to the
    end. The same exits judged by the policy without the exit-250 rule (the
    manifest before issue 23) fail the Job at the second disruption."""
    r = render(tmp, "cpu", [{"op": "replace", "path": "/spec/template/spec/containers/0/args/3", "value": "200"}])
    job = r.one("Job")
    n = job["spec"]["completions"]
    old = copy.deepcopy(job)
    old["spec"]["podFailurePolicy"]["rules"] = [
        x for x in old["spec"]["podFailurePolicy"]["rules"] if "onExitCodes" not in x
    ]  # fmt: skip
    jc, jc_old = JobController(job), JobController(old)
    grace = job["spec"]["template"]["spec"].get("terminationGracePeriodSeconds", 30)
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:])
        cohortd = runner.spawn(coord)
        for round_, victim in enumerate((1, n - 1)):
            procs = run_job(runner, job, cl.hosts[1:], pods=jc.pods(cl.hosts[1:]))
            assert wait_for_log(procs[0], r"^epoch +3/", 60), logs(procs + [cohortd])
            t0 = time.monotonic()
            evict(procs[victim], grace)
            wait_all(procs, 30)
            took = time.monotonic() - t0
            assert all(p.returncode is not None for p in procs), "a rank hangs after the eviction\n" + logs(procs)
            assert took < 15, f"round {round_}: the others took {took:.1f} s to stop"
            for i, p in enumerate(procs):
                if i != victim:
                    assert exit_code(p) == ck.EXIT_PEER_LOST, logs(procs)
                    assert f"rank {victim}" in runner.termination_message(p), runner.termination_message(p)
            acts = jc.settle(procs)
            assert set(acts.values()) == {"Ignore"} and len(acts) == n, acts
            assert jc.failures == [0] * n and not jc.failed, (jc.failures, jc.failed)
            jc_old.settle(procs)
        assert jc_old.failed.startswith("MaxFailedIndexesExceeded"), jc_old.failures
        assert jc.ignored == [2] * n
        last = run_job(runner, job, cl.hosts[1:], pods=jc.pods(cl.hosts[1:]))
        for p in last:
            assert p.pod.annotations["batch.kubernetes.io/job-index-failure-count"] == "0"
            assert p.pod.annotations["batch.kubernetes.io/job-index-ignored-failure-count"] == "2"
        wait_all(last, RUN_TIMEOUT)
        assert all(p.returncode == 0 for p in last), logs(last + [cohortd])
        f = final_lines(last[0])
        assert f["ranks"] == n and f["equal"] == "yes"


def test_tenants_self_service(tmp: Path) -> None:
    """A platform cohortd (overlays/cpu in namespace "cohort") and two
    tenants (overlays/tenant in namespaces team-a and team-b), NetworkPolicies
    enforced. The platform team mints each tenant's key once (kubectl
    exec cohortd-0 -- cohort token --tenant) into a Secret of the tenant's
    namespace; from then on each tenant's Jobs mint their own job tokens
    (init container) and train, without the admin secret or an exec. A
    Job of team-b that names team-a's job (team-a/cohort-train) with
    team-b's key is refused, naming the tenant whose key is needed, and
    team-a's run is not disturbed."""
    plat = render(tmp / "platform", "cpu", namespace=ck.PLATFORM_NS)
    two = [{"op": "replace", "path": "/spec/completions", "value": 2}]
    ten = {t: render(tmp / t, "tenant", two, namespace=t) for t in ("team-a", "team-b")}
    attack = copy.deepcopy(ten["team-b"])
    ajob = attack.one("Job")
    for c in ajob["spec"]["template"]["spec"]["initContainers"] + ajob["spec"]["template"]["spec"]["containers"]:
        for e in c["env"]:
            if e["name"] == "COHORT_JOB":
                e["value"] = "team-a/$(JOB_NAME)"
    with Cluster(n_hosts=7, name="k8s") as cl:
        prun = Runner(plat, cl, tmp / "pods-platform")
        coord = coordinator_pod(plat, cl.hosts[0])
        runners = {t: Runner(ten[t], cl, tmp / f"pods-{t}") for t in ten}
        arun = Runner(attack, cl, tmp / "pods-attack")
        pods = {
            "team-a": job_pods(ten["team-a"].one("Job"), cl.hosts[1:3], namespace="team-a"),
            "team-b": job_pods(ten["team-b"].one("Job"), cl.hosts[3:5], namespace="team-b"),
            "attack": job_pods(ajob, cl.hosts[5:7], namespace="team-b"),
        }
        everyone = [coord, *[p for ps in pods.values() for p in ps]]
        enforce_netpol(everyone, plat.policies() + ten["team-a"].policies() + ten["team-b"].policies())
        cohortd = prun.spawn(coord)
        assert kubelet_probes(coord)["readinessProbe"][0] == 200, logs([cohortd])
        prun.publish_dns([coord])
        # once per tenant, the platform team
        keys = prun.exec(coord, ["/opt/cohort/bin/cohort", "token", "--tenant", "team-a", "team-b"]).split()
        assert len(keys) == 2 and all(re.fullmatch(r"[0-9a-f]{64}", k) for k in keys), keys
        for rend, key in ((ten["team-a"], keys[0]), (ten["team-b"], keys[1]), (attack, keys[1])):
            rend.docs.append({
                "apiVersion": "v1", "kind": "Secret", "type": "Opaque",
                "metadata": {"name": "cohort-tenant-key", "namespace": rend.namespace},
                "data": {"key": base64.b64encode(key.encode()).decode()},
            })  # fmt: skip
        a = [runners["team-a"].spawn(p) for p in pods["team-a"]]
        assert wait_for_log(a[0], r"^epoch +1/", 60), logs(a + [cohortd])
        bad = [arun.spawn(p) for p in pods["attack"]]
        b = [runners["team-b"].spawn(p) for p in pods["team-b"]]
        wait_all(bad, 30)
        for p in bad:
            assert p.returncode not in (None, 0, ck.EXIT_PEER_LOST), logs(bad)
            text = _read(p)
            assert "wrong token for job 'team-a/cohort-train'" in text and "tenant 'team-a'" in text, logs(bad)
        wait_all(a + b, RUN_TIMEOUT)
        assert all(p.returncode == 0 for p in a + b), logs(a + b + [cohortd])
        for procs in (a, b):
            f = final_lines(procs[0])
            assert f["ranks"] == 2 and f["equal"] == "yes", logs(procs)
        # the key never reached a worker: only the init container mounts it
        for p in a:
            tok = Path(runners["team-a"].tmp) / p.pod.name / "job-token" / "token"
            assert oct(tok.stat().st_mode & 0o777) == "0o600", oct(tok.stat().st_mode)


def _lightning_lines(procs: list[Any]) -> list[re.Match[str]]:
    out = [re.search(r"^rank (\d+)/(\d+) backend=cohort test_acc=([0-9.]+) checksum=(\S+)", _read(p), re.M)
           for p in procs]  # fmt: skip
    assert all(out), logs(procs)
    return out  # type: ignore[return-value]


def test_pytorch_overlay_trains_and_survives_a_lost_rank(tmp: Path) -> None:
    """overlays/pytorch: a Lightning trainer under `cohort run`, one pod
    per node with Kubeflow's PET_* variables, on the shared cohortd (real
    torch and Lightning from the venv). The rank of pod 1 is killed during
    training (a fault sent with kubectl exec ... cohort fault): pod 0's
    launcher exits 250 (cohortd names a rank of another pod as the root
    cause) with its failure report as the termination message, pod 1 ends
    with the rank's SIGKILL; the Job controller charges index 1 alone, and
    the next round trains to the end with equal parameters on both
    nodes."""
    r = render(tmp, "pytorch", [{"op": "replace", "path": "/spec/template/spec/containers/0/args/9", "value": "12"}])
    job = r.one("Job")
    n = job["spec"]["completions"]
    jc = JobController(job)
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:])
        enforce_netpol([coord, *job_pods(job, cl.hosts[1:])], r.policies())
        cohortd = runner.spawn(coord)
        first = run_job(runner, job, cl.hosts[1:], pods=jc.pods(cl.hosts[1:]))
        # Lightning's process group is up (rank 0 says so): training
        assert wait_for_log(first[0], r"All distributed processes registered", 180), logs(first + [cohortd])
        runner.exec(first[0].pod, ["/opt/cohort/bin/cohort", "fault", "rank=1,at=op:+5,action=kill"])
        wait_all(first, 60)
        assert all(p.returncode is not None for p in first), "a pod hangs after the lost rank\n" + logs(first)
        assert exit_code(first[1]) == 128 + signal.SIGKILL, logs(first + [cohortd])
        assert exit_code(first[0]) == ck.EXIT_PEER_LOST, logs(first + [cohortd])
        report = json.loads(runner.termination_message(first[0]))
        assert report["root_cause"]["rank"] == 1 and report["job"] == job["metadata"]["name"], report
        assert jc.settle(first) == {0: "Ignore", 1: "Count"} and jc.failures == [0, 1], jc.failures
        second = run_job(runner, job, cl.hosts[1:], pods=jc.pods(cl.hosts[1:]))
        wait_all(second, 300)
        assert all(p.returncode == 0 for p in second), logs(second + [cohortd])
        lines = _lightning_lines(second)
        assert {m.group(1) for m in lines} == {"0", "1"} and {m.group(2) for m in lines} == {str(n)}
        assert len({m.group(4) for m in lines}) == 1, "parameters differ between the nodes"
        assert float(lines[0].group(3)) > 0.8


@pytest.mark.parametrize("overlay,components", [("kueue", None), ("jobset", ["kueue"])])
def test_queued_overlays_train(tmp: Path, overlay: str, components: list[str] | None) -> None:
    """overlays/kueue (the Job) and overlays/jobset with components/kueue
    (a JobSet): the workload is created suspended in the LocalQueue the
    rendering brings; once Kueue admits it (suspend off) the workers (for
    the JobSet, the pods its Job gets: the JobSet's labels, COHORT_JOB
    its name) train to the end on cohortd."""
    r = render(tmp, overlay, components=components)
    kind = "JobSet" if overlay == "jobset" else "Job"
    w = r.one(kind)
    q = w["metadata"]["labels"][ck.QUEUE_LABEL]
    assert w["spec"]["suspend"] is True
    assert r.one("LocalQueue", q)["spec"]["clusterQueue"] == "cohort"
    # nothing runs before Kueue admits it
    with pytest.raises(AssertionError, match="suspended"):
        job = worker_job(r)
        job_pods(job, [None] * job["spec"]["completions"])
    w["spec"]["suspend"] = False  # Kueue admits it
    job = worker_job(r)
    n = job["spec"]["completions"]
    with Cluster(n_hosts=1 + n, name="k8s") as cl:
        runner, coord = _start(r, cl, tmp, cl.hosts[1:])
        cohortd = runner.spawn(coord)
        workers = run_job(runner, job, cl.hosts[1:])
        if kind == "JobSet":
            env = workers[0].pod.labels
            assert env["jobset.sigs.k8s.io/jobset-name"] == w["metadata"]["name"]
        wait_all(workers, RUN_TIMEOUT)
        assert all(p.returncode == 0 for p in workers), logs(workers + [cohortd])
        f = final_lines(workers[0])
        assert f["ranks"] == n and f["equal"] == "yes", logs(workers)
        status = runner.exec(coord, STATUS)
        assert re.search(rf"job {w['metadata']['name']} .*state finished", status), status


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
