"""The Python mirror of ``cohort/cohort.h``: constants, enums and structures.

Everything the bindings need from the C header, written out once: the
status codes of ``COHORT_STATUS_MAP``, the element types and reduction
operators, the duration sentinels, and the layouts of the two structures
Python fills (``cohort_env``, ``cohort_options``). Nothing here loads the
library, so the mirror can be imported (and checked) without one.

``python/tests/test_abi.py`` holds this file to the header: it parses
``COHORT_STATUS_MAP``, the enums and the structure definitions of
``include/cohort/cohort.h`` and compiles a C program that prints
every field's offset and each structure's size, so an edit of the header
that is not mirrored here fails the suite instead of corrupting memory.
"""

from __future__ import annotations

import ctypes
import enum

__all__ = [
    "ABI_VERSION",
    "ANY_SOURCE",
    "WAIT_DEFAULT",
    "WAIT_FOREVER",
    "Status",
    "Dtype",
    "RedOp",
    "Env",
    "Options",
    "EXIT_PEER_LOST",
    "StateRole",
    "ReformInfo",
    "Boundary",
]

#: ``COHORT_VERSION_STRING`` of the header this mirror was written from.
ABI_VERSION = "0.1.0"

#: ``COHORT_EXIT_PEER_LOST``: the exit status of a process that stops because
#: another rank of its job was lost (``EPEERLOST``), told apart from a failure
#: of its own (1, or 128 + signal). ``cohort run``, Kubernetes'
#: podFailurePolicy (deploy/k8s) and the Python package agree on it.
EXIT_PEER_LOST = 250

#: ``COHORT_WAIT_FOREVER``: block without a deadline.
WAIT_FOREVER = -1
#: ``COHORT_WAIT_DEFAULT``: the client's (or group's) configured timeout.
WAIT_DEFAULT = -2
#: ``COHORT_ANY_SOURCE``: a receive's peer, any rank of the group.
ANY_SOURCE = -1


class Status(enum.IntEnum):
    """``cohort_status`` (``COHORT_STATUS_MAP``): 0 is success.

    Codes are part of the wire protocol: the header appends, never
    renumbers, and so does this mirror.
    """

    OK = 0
    EINVAL = 1
    ENOMEM = 2
    ETIMEDOUT = 3
    ECLOSED = 4
    EABORTED = 5
    EPEERLOST = 6
    ESTALE = 7
    ESTATE = 8
    EPROTO = 9
    ENOTSUP = 10
    ETRANSPORT = 11
    ECUDA = 12
    ENCCL = 13
    ESYSTEM = 14
    EAUTH = 15
    EEXIST = 16
    ENOENT = 17
    ETOOBIG = 18
    EMISMATCH = 19
    ENOCOORD = 20
    EINJECTED = 21
    EJOURNAL = 22
    EMEMBERSHIP = 23


class Dtype(enum.IntEnum):
    """``cohort_dtype``: element types of tensors (``COHORT_F32`` ...)."""

    F32 = 0
    F64 = 1
    F16 = 2
    BF16 = 3
    I32 = 4
    I64 = 5
    U8 = 6


class RedOp(enum.IntEnum):
    """``cohort_redop``: reduction operators (``COHORT_SUM`` ...).

    ``MEAN`` is SUM followed by division by the group size, defined for the
    floating-point types only.
    """

    SUM = 0
    PROD = 1
    MIN = 2
    MAX = 3
    MEAN = 4


class Env(ctypes.Structure):
    """``cohort_env``: the resolved launcher environment (``cohort env``)."""

    _fields_ = [
        ("coordinator", ctypes.c_char * 256),
        ("job", ctypes.c_char * 128),
        ("token", ctypes.c_char * 128),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("local_world_size", ctypes.c_int32),
        ("node_rank", ctypes.c_int32),
        ("restart_count", ctypes.c_int32),
        ("source", ctypes.c_char * 32),
        ("coordinator_from", ctypes.c_char * 48),
        ("job_from", ctypes.c_char * 48),
        ("rank_from", ctypes.c_char * 48),
        ("world_size_from", ctypes.c_char * 48),
        ("local_rank_from", ctypes.c_char * 48),
        ("data_addr", ctypes.c_char * 64),
        ("data_addr_from", ctypes.c_char * 48),
        ("token_from", ctypes.c_char * 48),
        ("restart_count_from", ctypes.c_char * 48),
        ("notes", ctypes.c_char * 256),
    ]


class Options(ctypes.Structure):
    """``cohort_options``: what ``cohort_client_open`` needs.

    The strings point into memory the caller keeps alive (an :class:`Env`
    or Python ``bytes`` held beside it) until the open call returned.
    """

    _fields_ = [
        ("coordinator", ctypes.c_char_p),
        ("job", ctypes.c_char_p),
        ("token", ctypes.c_char_p),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("local_rank", ctypes.c_int32),
        ("op_timeout", ctypes.c_int32),
        ("join_timeout", ctypes.c_int32),
        ("heartbeat_interval", ctypes.c_int32),
        ("dead_after", ctypes.c_int32),
        ("backend", ctypes.c_char_p),
        ("data_addr", ctypes.c_char_p),
        ("reconnect_window", ctypes.c_int32),
        ("min_world", ctypes.c_int32),
    ]


class StateRole(enum.IntEnum):
    """``cohort_state_role``: what a rank does in the state transfer a step
    boundary asked for (docs/elastic.md)."""

    NONE = 0  #: no state moves to or from this rank
    SEND = 1  #: this rank sends the state
    RECV = 2  #: this rank holds none and receives it


class ReformInfo(ctypes.Structure):
    """``cohort_reform_info``: how a move to another generation went."""

    _fields_ = [
        ("generation", ctypes.c_uint64),
        ("prev_generation", ctypes.c_uint64),
        ("rank", ctypes.c_int32),
        ("world_size", ctypes.c_int32),
        ("prev_rank", ctypes.c_int32),
        ("prev_world_size", ctypes.c_int32),
        ("lost", ctypes.c_int32),
        ("joined", ctypes.c_int32),
    ]


class Boundary(ctypes.Structure):
    """``cohort_boundary``: the answer of a step boundary."""

    _fields_ = [
        ("changed", ctypes.c_bool),
        ("reform", ReformInfo),
        ("role", ctypes.c_int),
        ("sender", ctypes.c_int32),
        ("receivers", ctypes.c_int32),
    ]


#: The structures the bindings pass to the library, by their C name.
STRUCTS: dict[str, type[ctypes.Structure]] = {
    "cohort_env": Env,
    "cohort_options": Options,
    "cohort_reform_info": ReformInfo,
    "cohort_boundary": Boundary,
}
