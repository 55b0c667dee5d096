#!/usr/bin/env python3
"""check-calls.py - no circles inside a folder, backends behind backend.h.

The layering of docs/architecture.md says which *parts* may use which;
this checks the finer grain that keeps a part easy to change:

1. Inside one folder, the files call one way. A module is a file stem
   (``job.c`` and ``job.h`` are module ``job``); module A depends on module
   B of the same folder when A names a non-static function or variable
   that B defines, or includes B's header. The graph must have no cycle:
   a cycle means none of its files can be understood, tested or replaced
   without the others (nng's core, Redis' blocked.c/timeout.c read this
   way). Every cycle is printed with the symbols that make it.
2. A data-plane backend (``client/backend/<name>/``) sees only the backend
   boundary: it may include ``backend/*.h``, its own folder's headers and
   the floor (common/, proto/, the public header), never a header of the
   client's internals (``client/*.h``) - what nng's transport.h asks of
   its transports.

Source-level, so it needs no build: the project's style puts every
function definition's name at column 0 (clang-format
AlwaysBreakAfterReturnType: TopLevelDefinitions), with ``static`` on the
line above when it is file-local.

    tools/check-calls.py            check (exit 1 on a violation)
    tools/check-calls.py --graph    also print every folder's edges
"""

from __future__ import annotations

import os
import re
import subprocess
import sys
from collections import defaultdict
from pathlib import Path

ROOT = Path(__file__).resolve().parent.parent
# The parts whose folders are checked (tests, bench and fuzz may do as
# they like).
PARTS = ("common", "proto", "client", "server", "cuda", "strategies",
         "tools/cohort", "examples/lib", "include")

COMMENT = re.compile(r"/\*.*?\*/|//[^\n]*", re.S)
STRING = re.compile(r'"(?:\\.|[^"\\\n])*"|\'(?:\\.|[^\'\\\n])*\'')
FUNC_DEF = re.compile(r"^([A-Za-z_]\w*)\s*\(", re.M)
# Top-level variables with external linkage: "const struct x name = {",
# "int name;", "struct x name[N] = ..." (no parenthesis before the name).
VAR_DEF = re.compile(
    r"^(?!static\b|extern\b|typedef\b|#|return\b)(?:const\s+)?"
    r"(?:(?:struct|enum|union)\s+\w+|\w+)(?:\s+\w+)*?[\s*]+([A-Za-z_]\w*)"
    r"\s*(?:\[[^\]]*\]\s*)*(?:=|;)",
    re.M)
INCLUDE = re.compile(r'^#\s*include\s+"([^"]+)"', re.M)
IDENT = re.compile(r"\b[A-Za-z_]\w*\b")


def tracked() -> list[str]:
    try:
        out = subprocess.run(
            ["git", "ls-files", "*.c", "*.h", "*.cu"], cwd=ROOT,
            capture_output=True, text=True, check=True).stdout
        return [f for f in out.split() if (ROOT / f).exists()]
    except (OSError, subprocess.CalledProcessError):
        return [str(p.relative_to(ROOT)) for p in ROOT.rglob("*")
                if p.suffix in (".c", ".h", ".cu")]


def strip(text: str, strings: bool = True) -> str:
    """Comments (and, unless strings is False, string literals) blanked,
    line numbers kept."""
    text = COMMENT.sub(lambda m: "\n" * m.group(0).count("\n"), text)
    if not strings:
        return text
    return "\n".join(
        ln if ln.lstrip().startswith("#") else STRING.sub('""', ln)
        for ln in text.split("\n"))


def definitions(text: str) -> set[str]:
    """Names a .c file defines with external linkage."""
    names = set()
    lines = text.split("\n")
    for m in FUNC_DEF.finditer(text):
        line = text.count("\n", 0, m.start())
        prev = ""
        for k in range(line - 1, max(line - 4, -1), -1):
            if lines[k].strip():
                prev = lines[k]
                break
        # a definition: a return type on the line above, a body below
        if not prev or prev.rstrip().endswith((";", "}", ")")) \
                or prev.startswith("#"):
            continue
        if re.search(r"\bstatic\b", prev):
            continue
        rest = text[m.end():m.end() + 4000]
        depth, i = 1, 0
        while i < len(rest) and depth:
            depth += {"(": 1, ")": -1}.get(rest[i], 0)
            i += 1
        tail = rest[i:].lstrip()
        if tail.startswith("{") or tail.startswith("__attribute__"):
            names.add(m.group(1))
    for m in VAR_DEF.finditer(text):
        names.add(m.group(1))
    return names


def sccs(nodes: list[str], edges: dict[str, set[str]]) -> list[list[str]]:
    """Tarjan's strongly connected components of more than one node."""
    index: dict[str, int] = {}
    low: dict[str, int] = {}
    stack: list[str] = []
    on: set[str] = set()
    out: list[list[str]] = []
    counter = [0]

    def visit(v: str) -> None:
        index[v] = low[v] = counter[0]
        counter[0] += 1
        stack.append(v)
        on.add(v)
        for w in sorted(edges.get(v, ())):
            if w not in index:
                visit(w)
                low[v] = min(low[v], low[w])
            elif w in on:
                low[v] = min(low[v], index[w])
        if low[v] == index[v]:
            comp = []
            while True:
                w = stack.pop()
                on.discard(w)
                comp.append(w)
                if w == v:
                    break
            if len(comp) > 1:
                out.append(sorted(comp))

    sys.setrecursionlimit(10000)
    for v in nodes:
        if v not in index:
            visit(v)
    return out


def cycle_in(comp: list[str], edges: dict[str, set[str]]) -> list[str]:
    """One cycle through comp[0], by breadth-first search."""
    start = comp[0]
    members = set(comp)
    prev: dict[str, str] = {}
    frontier = [start]
    while frontier:
        nxt = []
        for v in frontier:
            for w in sorted(edges.get(v, ())):
                if w not in members:
                    continue
                if w == start:
                    path = [v]
                    while path[-1] != start:
                        path.append(prev[path[-1]])
                    return list(reversed(path)) + [start]
                if w not in prev:
                    prev[w] = v
                    nxt.append(w)
        frontier = nxt
    return comp


def check_folder(folder: str, files: list[str], graph: bool) -> list[str]:
    texts = {f: strip((ROOT / f).read_text(errors="replace")) for f in files}
    module = {f: Path(f).name.rsplit(".", 1)[0].removesuffix(".cu")
              for f in files}
    defs: dict[str, str] = {}
    for f in files:
        if f.endswith((".c", ".cu")):
            for name in definitions(texts[f]):
                defs.setdefault(name, module[f])
    headers = {Path(f).name: module[f] for f in files if f.endswith(".h")}
    edges: dict[str, set[str]] = defaultdict(set)
    why: dict[tuple[str, str], set[str]] = defaultdict(set)
    for f in files:
        a = module[f]
        for m in INCLUDE.finditer(texts[f]):
            inc = m.group(1)
            name = Path(inc).name
            # a header of this folder, named bare or by a path ending in
            # this folder ("backend/tcp/x.h" from client/backend/tcp)
            if name in headers and (inc == name
                                    or folder.endswith(str(Path(inc).parent))):
                b = headers[name]
                if b != a:
                    edges[a].add(b)
                    why[(a, b)].add(f"#include \"{name}\"")
        if not f.endswith((".c", ".cu")):
            continue
        for ident in set(IDENT.findall(texts[f])):
            b = defs.get(ident)
            if b is not None and b != a:
                edges[a].add(b)
                why[(a, b)].add(ident + "()")
    problems = []
    nodes = sorted(set(module.values()))
    if graph:
        for a in nodes:
            for b in sorted(edges.get(a, ())):
                print(f"{folder}: {a} -> {b}")
    for comp in sccs(nodes, edges):
        cyc = cycle_in(comp, edges)
        steps = []
        for a, b in zip(cyc, cyc[1:]):
            names = sorted(why[(a, b)])
            shown = ", ".join(names[:3]) + (", ..." if len(names) > 3 else "")
            steps.append(f"{a} -> {b} ({shown})")
        problems.append(
            f"{folder}/: a circle of {len(comp)} files "
            f"({', '.join(comp)}): " + "; ".join(steps))
    return problems


def check_backends(files: list[str]) -> list[str]:
    internal = {Path(f).name for f in files
                if str(Path(f).parent) == "client" and f.endswith(".h")}
    problems = []
    for f in files:
        p = Path(f)
        if len(p.parts) < 4 or p.parts[:2] != ("client", "backend"):
            continue
        text = strip((ROOT / f).read_text(errors="replace"))
        for m in INCLUDE.finditer(text):
            inc = m.group(1)
            if "/" not in inc and inc in internal \
                    and not (p.parent / inc).exists():
                line = text.count("\n", 0, m.start()) + 1
                problems.append(
                    f"{f}:{line}: a backend includes \"{inc}\", a header "
                    "of the client's internals (backends see only "
                    "backend/backend.h and the floor)")
    return problems


def main() -> int:
    graph = "--graph" in sys.argv[1:]
    files = tracked()
    by_folder: dict[str, list[str]] = defaultdict(list)
    for f in files:
        folder = str(Path(f).parent)
        if any(folder == p or folder.startswith(p + "/") for p in PARTS):
            by_folder[folder].append(f)
    problems = []
    for folder in sorted(by_folder):
        problems += check_folder(folder, sorted(by_folder[folder]), graph)
    problems += check_backends(files)
    for p in problems:
        print(p)
    if problems:
        print(f"check-calls: {len(problems)} problems "
              "(docs/architecture.md: files call one way)", file=sys.stderr)
        return 1
    print(f"check-calls: ok ({len(by_folder)} folders, "
          f"{sum(len(v) for v in by_folder.values())} files)")
    return 0


if __name__ == "__main__":
    sys.exit(main())
