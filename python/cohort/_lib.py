"""Loading libcohort and declaring the part of its public C API Python uses.

The binding is plain :mod:`ctypes` over ``cohort/cohort.h``: there is nothing
to compile, the same package works with every Python version and any
``libcohort.so`` of the same ABI, and ctypes releases the GIL around every
foreign call, so a rank blocked in a collective never stalls other Python
threads (DDP's completion callbacks, Lightning's logging).

The library is found, in order, at:

1. ``$COHORT_LIBRARY`` (a path to ``libcohort.so``; if set, only there);
2. the copy bundled into the package by ``pip install ./python``;
3. the build tree this package sits in (``<repo>/build/lib``);
4. an installed prefix (``$COHORT_PREFIX/lib``, ``/usr/local/lib``,
   ``/usr/lib``, or wherever the dynamic loader finds ``libcohort.so.0``).
"""

from __future__ import annotations

import ctypes
import ctypes.util
import os
import pathlib
import threading
from typing import Optional

from ._abi import Boundary, Env, Options, ReformInfo

__all__ = ["lib", "library_path", "find_binary", "Env", "Options", "PROTOTYPES"]

_PKG_DIR = pathlib.Path(__file__).resolve().parent
_REPO_BUILD = _PKG_DIR.parent.parent / "build"


def _candidates() -> list[pathlib.Path]:
    out: list[pathlib.Path] = []
    env = os.environ.get("COHORT_LIBRARY")
    if env:
        return [pathlib.Path(env)]  # asked for that one: no fallback
    out.append(_PKG_DIR / "_bundled" / "libcohort.so")
    out.append(_REPO_BUILD / "lib" / "libcohort.so")
    prefix = os.environ.get("COHORT_PREFIX")
    if prefix:
        out.append(pathlib.Path(prefix) / "lib" / "libcohort.so")
    out += [pathlib.Path("/usr/local/lib/libcohort.so"), pathlib.Path("/usr/lib/libcohort.so")]
    return out


def find_binary(name: str) -> Optional[str]:
    """Path of a cohort program (``cohortd``, ``cohort``), or None.

    Looked up beside the library that was loaded, in the package's bundled
    copy, the build tree, ``$COHORT_PREFIX/bin`` and ``$PATH``;
    ``$COHORT_COHORTD`` overrides the lookup of ``cohortd``.
    """
    import shutil

    if name == "cohortd" and os.environ.get("COHORT_COHORTD"):
        return os.environ["COHORT_COHORTD"]
    dirs = []
    if library_path:
        libdir = pathlib.Path(library_path).resolve().parent
        dirs += [libdir, libdir.parent / "bin"]
    dirs += [_PKG_DIR / "_bundled", _REPO_BUILD / "bin"]
    if os.environ.get("COHORT_PREFIX"):
        dirs.append(pathlib.Path(os.environ["COHORT_PREFIX"]) / "bin")
    for d in dirs:
        p = d / name
        if p.is_file() and os.access(p, os.X_OK):
            return str(p)
    return shutil.which(name)


def _load() -> tuple[ctypes.CDLL, str]:
    tried = []
    for p in _candidates():
        if p.is_file():
            try:
                return ctypes.CDLL(str(p)), str(p)
            except OSError as e:  # wrong architecture, missing dependency
                tried.append(f"{p}: {e}")
        else:
            tried.append(f"{p}: not found")
    name = None if os.environ.get("COHORT_LIBRARY") else ctypes.util.find_library("cohort")
    if name:
        try:
            return ctypes.CDLL(name), name
        except OSError as e:
            tried.append(f"{name}: {e}")
    raise ImportError(
        "cannot load libcohort.so; build it with `make` in the cohort "
        "repository, install it with `make install`, or set COHORT_LIBRARY. "
        "Tried: " + "; ".join(tried)
    )


# --- the C API Python calls ---------------------------------------------
# Argument and result types follow cohort.h; tests/test_abi.py checks every
# entry against the header's prototype (name, argument count, pointer or
# value in each position).

_vp = ctypes.c_void_p
_st = ctypes.c_int  # cohort_status
_dur = ctypes.c_int32
_sz = ctypes.c_size_t
_i32 = ctypes.c_int32

#: name: (restype, argtypes) of every C function the package calls.
PROTOTYPES: dict[str, tuple] = {
    "cohort_strerror": (ctypes.c_char_p, [_st]),
    "cohort_status_name": (ctypes.c_char_p, [_st]),
    "cohort_last_error": (ctypes.c_char_p, []),
    "cohort_env_resolve": (_st, [ctypes.POINTER(Env)]),
    "cohort_env_format": (_sz, [ctypes.POINTER(Env), ctypes.c_char_p, _sz]),
    "cohort_options_init": (None, [ctypes.POINTER(Options)]),
    "cohort_options_from_env": (_st, [ctypes.POINTER(Options), ctypes.POINTER(Env)]),
    "cohort_client_open": (_st, [ctypes.POINTER(Options), ctypes.POINTER(_vp), _dur]),
    "cohort_client_close": (None, [_vp]),
    "cohort_client_rank": (_i32, [_vp]),
    "cohort_client_world_size": (_i32, [_vp]),
    "cohort_client_world": (_vp, [_vp]),
    "cohort_client_local_rank": (_i32, [_vp]),
    "cohort_client_generation": (ctypes.c_uint64, [_vp]),
    "cohort_client_reform": (_st, [_vp, ctypes.POINTER(ReformInfo), _dur]),
    "cohort_client_elastic_range": (None, [_vp, ctypes.POINTER(_i32), ctypes.POINTER(_i32)]),
    "cohort_step_boundary": (_st, [_vp, ctypes.POINTER(Boundary), _dur]),
    "cohort_state_transfer": (
        _st,
        [_vp, _vp, _sz, ctypes.POINTER(_vp), ctypes.POINTER(_sz), _dur],
    ),
    "cohort_kv_set": (_st, [_vp, ctypes.c_char_p, _vp, _sz, _dur]),
    "cohort_kv_get": (_st, [_vp, ctypes.c_char_p, ctypes.POINTER(_vp), ctypes.POINTER(_sz), _dur]),
    "cohort_kv_add": (_st, [_vp, ctypes.c_char_p, ctypes.c_int64, ctypes.POINTER(ctypes.c_int64), _dur]),
    "cohort_kv_compare_set": (
        _st,
        [_vp, ctypes.c_char_p, _vp, _sz, _vp, _sz, ctypes.POINTER(ctypes.c_bool), ctypes.POINTER(_vp),
         ctypes.POINTER(_sz), _dur],
    ),
    "cohort_kv_delete": (_st, [_vp, ctypes.c_char_p, ctypes.POINTER(ctypes.c_bool), _dur]),
    "cohort_kv_num_keys": (_st, [_vp, ctypes.POINTER(ctypes.c_int64), _dur]),
    "cohort_kv_wait": (_st, [_vp, _vp, _sz, _dur]),  # keys: a char *[] cast to void *
    "cohort_kv_check": (_st, [_vp, _vp, _sz, ctypes.POINTER(ctypes.c_bool), _dur]),
    "cohort_kv_append": (_st, [_vp, ctypes.c_char_p, _vp, _sz, _dur]),
    "cohort_client_error": (_st, [_vp]),
    "cohort_report_failure": (_st, [_vp, ctypes.c_char_p, _dur]),
    "cohort_free": (None, [_vp]),
    "cohort_env_knob": (ctypes.c_char_p, [ctypes.c_char_p]),
    "cohort_group_rank": (_i32, [_vp]),
    "cohort_group_size": (_i32, [_vp]),
    "cohort_group_global_rank": (_i32, [_vp, _i32]),
    "cohort_group_error": (_st, [_vp]),
    "cohort_group_last_error": (ctypes.c_char_p, [_vp]),
    "cohort_group_abort": (None, [_vp]),
    "cohort_group_new": (
        _st,
        [_vp, ctypes.c_char_p, ctypes.POINTER(_i32), _sz, ctypes.c_char_p, ctypes.POINTER(_vp), _dur],
    ),
    "cohort_group_destroy": (None, [_vp]),
    "cohort_group_connect": (_st, [_vp, _dur]),
    "cohort_group_backend": (ctypes.c_char_p, [_vp]),
    "cohort_barrier": (_st, [_vp, ctypes.c_char_p, _dur]),
    "cohort_broadcast_obj": (
        _st,
        [_vp, _i32, _vp, _sz, ctypes.POINTER(_vp), ctypes.POINTER(_sz), _dur],
    ),
    "cohort_decide": (_st, [_vp, ctypes.c_bool, ctypes.c_bool, ctypes.POINTER(ctypes.c_bool), _dur]),
    "cohort_allreduce": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, ctypes.c_int, _vp, _dur]),
    "cohort_reduce": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, ctypes.c_int, _i32, _vp, _dur]),
    "cohort_broadcast": (_st, [_vp, _vp, _sz, ctypes.c_int, _i32, _vp, _dur]),
    "cohort_allgather": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, _vp, _dur]),
    "cohort_allgatherv": (_st, [_vp, _vp, _vp, ctypes.POINTER(_sz), ctypes.c_int, _vp, _dur]),
    "cohort_reduce_scatter": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, ctypes.c_int, _vp, _dur]),
    "cohort_alltoall": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, _vp, _dur]),
    "cohort_gather": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, _i32, _vp, _dur]),
    "cohort_scatter": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, _i32, _vp, _dur]),
    "cohort_iallreduce": (
        _st,
        [_vp, _vp, _vp, _sz, ctypes.c_int, ctypes.c_int, _vp, ctypes.POINTER(_vp)],
    ),
    "cohort_ibroadcast": (_st, [_vp, _vp, _sz, ctypes.c_int, _i32, _vp, ctypes.POINTER(_vp)]),
    "cohort_iallgather": (_st, [_vp, _vp, _vp, _sz, ctypes.c_int, _vp, ctypes.POINTER(_vp)]),
    "cohort_ireduce_scatter": (
        _st,
        [_vp, _vp, _vp, _sz, ctypes.c_int, ctypes.c_int, _vp, ctypes.POINTER(_vp)],
    ),
    "cohort_alltoallv": (
        _st,
        [_vp, _vp, ctypes.POINTER(_sz), ctypes.POINTER(_sz), _vp, ctypes.POINTER(_sz), ctypes.POINTER(_sz),
         ctypes.c_int, _vp, _dur],
    ),
    "cohort_ialltoallv": (
        _st,
        [_vp, _vp, ctypes.POINTER(_sz), ctypes.POINTER(_sz), _vp, ctypes.POINTER(_sz), ctypes.POINTER(_sz),
         ctypes.c_int, _vp, ctypes.POINTER(_vp)],
    ),
    "cohort_send": (_st, [_vp, _vp, _sz, ctypes.c_int, _i32, ctypes.c_uint32, _vp, _dur]),
    "cohort_recv": (_st, [_vp, _vp, _sz, ctypes.c_int, _i32, ctypes.c_uint32, _vp, _dur]),
    "cohort_isend": (_st, [_vp, _vp, _sz, ctypes.c_int, _i32, ctypes.c_uint32, _vp, ctypes.POINTER(_vp)]),
    "cohort_irecv": (_st, [_vp, _vp, _sz, ctypes.c_int, _i32, ctypes.c_uint32, _vp, ctypes.POINTER(_vp)]),
    "cohort_work_source": (_st, [_vp, ctypes.POINTER(_i32)]),
    "cohort_work_wait": (_st, [_vp, _dur]),
    "cohort_work_test": (_st, [_vp, ctypes.POINTER(ctypes.c_bool)]),
    "cohort_work_free": (None, [_vp]),
}

_lock = threading.Lock()
library_path: Optional[str] = None


def _declare(dll: ctypes.CDLL) -> ctypes.CDLL:
    for name, (res, args) in PROTOTYPES.items():
        fn = getattr(dll, name)
        fn.restype = res
        fn.argtypes = args
    return dll


def _open() -> ctypes.CDLL:
    global library_path
    with _lock:
        dll, path = _load()
        library_path = path
        return _declare(dll)


lib = _open()
