"""The Python mirror of cohort.h (cohort/_abi.py, cohort/_lib.py) against the header itself.

An edit of include/cohort/cohort.h that the package does not follow
(a status appended, an enum renumbered, a structure field added, a
prototype changed) fails here instead of corrupting memory at run time:

- ``COHORT_STATUS_MAP``, ``cohort_dtype``, ``cohort_redop``, the duration
  sentinels and the version, parsed from the header, equal the mirror;
- the fields of ``cohort_env`` and ``cohort_options``, parsed from the
  header, equal the ctypes structures in name, order and type, and a C
  program compiled against the header prints the same offsets and sizes
  ctypes computes;
- every C function the bindings declare exists in the header with the
  same number of arguments, each of the matching ctypes type, and the
  same result type.
"""

from __future__ import annotations

import ctypes
import re
import shutil
import subprocess
import sys

import pytest

from conftest import PYDIR, REPO

HEADER = REPO / "include" / "cohort" / "cohort.h"

sys.path.insert(0, str(PYDIR))
from cohort import _abi, _lib  # noqa: E402


@pytest.fixture(scope="module")
def header() -> str:
    text = HEADER.read_text()
    return re.sub(r"/\*.*?\*/", " ", text, flags=re.S)  # comments out


def test_status_map(header):
    body = header[header.index("#define COHORT_STATUS_MAP(XX)"):]
    body = body[: body.index("typedef enum")]
    entries = [(n, int(c)) for n, c in re.findall(r"XX\((\w+),\s*(\d+),", body)]
    assert len(entries) > 20, entries
    assert entries == [(s.name, int(s)) for s in _abi.Status], "cohort.Status differs from COHORT_STATUS_MAP"


def _enum(header: str, name: str) -> list[tuple[str, int]]:
    m = re.search(r"typedef enum \{([^}]*)\}\s*" + name + ";", header)
    assert m, f"enum {name} not found in cohort.h"
    vals = re.findall(r"COHORT_(\w+)\s*=\s*(\d+)", m.group(1))
    return [(n, int(v)) for n, v in vals]


def test_dtype_and_redop_enums(header):
    assert _enum(header, "cohort_dtype") == [(d.name, int(d)) for d in _abi.Dtype]
    assert _enum(header, "cohort_redop") == [(o.name, int(o)) for o in _abi.RedOp]


def test_constants(header):
    assert re.search(r"#define COHORT_WAIT_FOREVER \(\(cohort_duration\)(-?\d+)\)", header).group(1) == str(
        _abi.WAIT_FOREVER)
    assert re.search(r"#define COHORT_WAIT_DEFAULT \(\(cohort_duration\)(-?\d+)\)", header).group(1) == str(
        _abi.WAIT_DEFAULT)
    version = ".".join(
        re.search(rf"#define COHORT_VERSION_{part} (\d+)", header).group(1) for part in ("MAJOR", "MINOR", "PATCH"))
    assert version == _abi.ABI_VERSION
    assert re.search(r"#define COHORT_ANY_SOURCE \(\(int32_t\)(-?\d+)\)", header).group(1) == str(_abi.ANY_SOURCE)


# C scalar types -> the ctypes type the mirror must use
SCALARS = {
    "int32_t": ctypes.c_int32,
    "int64_t": ctypes.c_int64,
    "uint64_t": ctypes.c_uint64,
    "uint32_t": ctypes.c_uint32,
    "size_t": ctypes.c_size_t,
    "bool": ctypes.c_bool,
    "cohort_duration": ctypes.c_int32,
    "cohort_status": ctypes.c_int,
    "cohort_dtype": ctypes.c_int,
    "cohort_redop": ctypes.c_int,
    "cohort_state_role": ctypes.c_int,
}
HANDLES = {"cohort_client", "cohort_group", "cohort_work", "void"}


def _struct_fields(header: str, name: str) -> list[tuple[str, str, int]]:
    m = re.search(r"typedef struct " + name + r" \{(.*?)\}\s*" + name + ";", header, flags=re.S)
    assert m, f"struct {name} not found in cohort.h"
    out = []
    for decl in m.group(1).split(";"):
        decl = " ".join(decl.split())
        if not decl:
            continue
        f = re.fullmatch(r"(const )?([\w ]+?)\s*(\*?)\s*(\w+)(?:\[(\d+)\])?", decl)
        assert f, f"cannot parse field {decl!r} of {name}"
        ctype = f.group(2) + (" *" if f.group(3) else "")
        out.append((f.group(4), ctype, int(f.group(5) or 0)))
    return out


@pytest.mark.parametrize("cname", sorted(_abi.STRUCTS))
def test_struct_fields(header, cname):
    fields = _struct_fields(header, cname)
    mirror = _abi.STRUCTS[cname]._fields_
    assert [f[0] for f in fields] == [m[0] for m in mirror], f"{cname}: field names or order differ"
    for (name, ctype, n), (_, ptype) in zip(fields, mirror):
        if n:
            assert ctype == "char" and ptype._type_ is ctypes.c_char and ptype._length_ == n, (cname, name)
        elif ctype == "char *":
            assert ptype is ctypes.c_char_p, (cname, name)
        elif ctype in _abi.STRUCTS:  # a structure inside a structure
            assert ptype is _abi.STRUCTS[ctype], (cname, name, ctype, ptype)
        else:
            assert ptype is SCALARS[ctype], (cname, name, ctype, ptype)


@pytest.mark.skipif(shutil.which("cc") is None and shutil.which("gcc") is None, reason="needs a C compiler")
def test_struct_layouts_compiled(tmp_path):
    """offsetof and sizeof from the C compiler equal ctypes' layout."""
    lines = ["#include <stddef.h>", "#include <stdio.h>", '#include "cohort/cohort.h"', "int main(void) {"]
    for cname, st in sorted(_abi.STRUCTS.items()):
        lines.append(f'printf("{cname} size %zu\\n", sizeof({cname}));')
        for fname, _ in st._fields_:
            lines.append(f'printf("{cname} {fname} %zu\\n", offsetof({cname}, {fname}));')
    lines += ["return 0; }"]
    src = tmp_path / "layout.c"
    src.write_text("\n".join(lines) + "\n")
    cc = shutil.which("cc") or shutil.which("gcc")
    exe = tmp_path / "layout"
    r = subprocess.run([cc, "-std=c11", "-I", str(HEADER.parent.parent), str(src), "-o", str(exe)],
                       capture_output=True, text=True, timeout=120)
    assert r.returncode == 0, r.stderr
    got = {}
    for line in subprocess.run([str(exe)], capture_output=True, text=True, timeout=30, check=True).stdout.split("\n"):
        if line:
            c, f, v = line.split()
            got[(c, f)] = int(v)
    for cname, st in _abi.STRUCTS.items():
        assert got[(cname, "size")] == ctypes.sizeof(st), cname
        for fname, _ in st._fields_:
            assert got[(cname, fname)] == getattr(st, fname).offset, (cname, fname)


def _prototypes(header: str) -> dict[str, tuple[str, list[str]]]:
    protos = {}
    for m in re.finditer(r"COHORT_API\s+([^;(]*?)\b(cohort_\w+)\s*\(([^)]*)\)\s*;", header, flags=re.S):
        ret = " ".join(m.group(1).split())
        args = [" ".join(a.split()) for a in m.group(3).split(",")]
        protos[m.group(2)] = (ret, [] if args == ["void"] else args)
    return protos


def _expected(ctype: str, arg: bool):
    """The ctypes type a C type (an argument, or a result) must be declared as."""
    t = re.sub(r"\b(const)\b", "", ctype)
    if arg:  # drop the parameter's name
        t = re.sub(r"\b\w+$", "", t.strip()) if not t.strip().endswith("*") else t
    stars = t.count("*")
    base = t.replace("*", " ").split()
    base = " ".join(base)
    if stars == 0:
        return None if base == "void" else SCALARS[base]
    if stars == 2 or base in HANDLES:
        return (ctypes.POINTER(ctypes.c_void_p), ctypes.c_void_p) if stars == 2 else ctypes.c_void_p
    if base == "char":
        return ctypes.c_char_p
    if base in _abi.STRUCTS:
        return ctypes.POINTER(_abi.STRUCTS[base])
    return ctypes.POINTER(SCALARS[base])


def test_bound_functions_match_the_header(header):
    protos = _prototypes(header)
    assert len(protos) > 60, "prototype parser found too few functions"
    for name, (res, args) in _lib.PROTOTYPES.items():
        assert name in protos, f"{name} is not declared in cohort.h"
        cres, cargs = protos[name]
        assert len(args) == len(cargs), f"{name}: {len(args)} arguments bound, the header has {len(cargs)}"
        want = _expected(cres, False)
        assert res is want, f"{name}: result bound as {res}, header says {cres!r}"
        for i, (a, c) in enumerate(zip(args, cargs)):
            want = _expected(c, True)
            ok = a in want if isinstance(want, tuple) else a is want
            assert ok, f"{name}: argument {i} ({c!r}) bound as {a}, expected {want}"


def test_the_loaded_library_agrees(built):
    """The library itself names every status and dtype as the mirror does."""
    lib = _lib.lib
    for s in _abi.Status:
        assert lib.cohort_status_name(int(s)).decode() == f"COHORT_{s.name}"
    lib.cohort_dtype_name.restype = ctypes.c_char_p
    lib.cohort_dtype_size.restype = ctypes.c_size_t
    sizes = {"F32": 4, "F64": 8, "F16": 2, "BF16": 2, "I32": 4, "I64": 8, "U8": 1}
    for d in _abi.Dtype:
        assert lib.cohort_dtype_size(int(d)) == sizes[d.name], d
