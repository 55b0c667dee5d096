"""Failures: the exceptions that name the failed rank, and what they are made of.

Every failed libcohort call becomes a :class:`CohortError` carrying the
library's :class:`~cohort.Status` and its detail text. In a torch process
group the same failure is a :class:`CohortBackendError`, which is also a
:class:`torch.distributed.DistBackendError`, so code written for gloo's and
NCCL's errors handles it.

When a peer is lost the detail names it: ``rank 1 (node7:41213) failed
during allreduce (#812): RuntimeError: ... (0.4 s ago)`` followed by the
failed rank's innermost traceback frames. :func:`failure_record` turns that
into a :class:`FailureRecord` (rank, host, pid, operation, sequence number,
age, text). It reads the text today; when libcohort exports the record as
fields (``cohort_group_failure``), that one function changes and nothing
else does.

``CohortBackendError`` needs torch; it is created on first use, so that
``import cohort`` (the control-plane API) works without torch installed.
"""

from __future__ import annotations

import dataclasses
import re
import traceback
from typing import TYPE_CHECKING, Any, Optional

from ._abi import Status

__all__ = [
    "CohortError",
    "CohortBackendError",
    "FailureRecord",
    "failure_record",
    "failed_rank_of",
    "missing_ranks_of",
    "format_exception_report",
    "peer_lost",
    "membership_changed",
]


def as_status(st: int) -> "Status | int":
    """``st`` as a :class:`Status`, or the bare integer for a code this
    package does not know (a newer library)."""
    try:
        return Status(st)
    except ValueError:
        return st


def _status_name(st: int) -> str:
    try:
        return "COHORT_" + Status(st).name
    except ValueError:
        return f"COHORT_status_{int(st)}"


class CohortError(RuntimeError):
    """A libcohort call failed.

    Attributes:
        status: the :class:`~cohort.Status` the library returned.
        detail: the library's detail text (which rank, which operation, why).
        op: the operation that failed, as the caller named it.
        failed_rank: for ``EPEERLOST``, the rank the detail names, else None.
        failure: for ``EPEERLOST``, the parsed :class:`FailureRecord`
            (None when the detail names no rank).
        missing_ranks: for ``ETIMEDOUT`` of a barrier, the ranks that
            never arrived (empty when the detail names none).
    """

    def __init__(self, status: int, detail: str, op: str = "") -> None:
        self.status = as_status(status)
        self.detail = detail
        self.op = op
        self.failure = failure_record(detail) if self.status == Status.EPEERLOST else None
        self.failed_rank = self.failure.rank if self.failure is not None else None
        self.missing_ranks = missing_ranks_of(detail) if self.status == Status.ETIMEDOUT else []
        where = f"cohort {op}: " if op else "cohort: "
        super().__init__(f"{where}{_status_name(status)}: {detail or _strerror(status)}")

    def __reduce__(self) -> tuple:
        # Picklable (multiprocessing, torch.multiprocessing.spawn's error
        # queue): rebuilt from the same three arguments.
        return (type(self), (int(self.status), self.detail, self.op))


def _strerror(st: int) -> str:
    from . import _lib  # the library is loaded by then: a status came from it

    return _lib.lib.cohort_strerror(int(st)).decode()


# ---------------------------------------------------------------------------
# The failure record
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class FailureRecord:
    """What the coordinator knows about a failed rank.

    Attributes:
        kind: ``"reported"`` (the rank told the coordinator why, e.g. an
            exception), ``"connection"`` (its connection closed: killed,
            crashed), ``"silent"`` (missed heartbeats), ``"left"`` (it left
            the job in the middle of a collective), or ``"unknown"``.
        rank: the failed rank (job rank).
        host, pid: where it ran ("" and 0 when not known).
        operation: the collective it was in or last did ("" if unknown).
        seq: that collective's sequence number (-1 if unknown).
        age_s: seconds between the failure and the call that reported it
            (-1.0 if unknown).
        text: the failed rank's own error text (its first line).
        trace: the quoted traceback frames that follow, if any.
    """

    kind: str
    rank: int
    host: str = ""
    pid: int = 0
    operation: str = ""
    seq: int = -1
    age_s: float = -1.0
    text: str = ""
    trace: str = ""


# "rank 1 (node7:41213) failed during allreduce (#812): <text> (0.4 s ago)"
_HEAD_RE = re.compile(r"\brank (?P<rank>\d+) \((?P<host>[^():\s]*):(?P<pid>\d+)\) (?P<verb>failed|left)\b(?P<rest>.*)")
_OP_RE = re.compile(r"(?:during|after|in) (?P<op>[A-Za-z_][\w:-]*)(?: '[^']*')? \(?#(?P<seq>\d+)\)?")
_AGE_RE = re.compile(r"\((?P<age>\d+(?:\.\d+)?) s ago\)\s*$")
_RANK_RE = re.compile(r"\brank (\d+)\b")


def failure_record(detail: str) -> Optional[FailureRecord]:
    """The :class:`FailureRecord` a failure detail describes, or None.

    This is the one place that knows the detail's layout (``cohort_group_
    last_error``): the coordinator's ``rank R (HOST:PID) failed [during OP
    (#SEQ)]: TEXT (AGE s ago)`` followed by quoted traceback lines. A text
    in another form still yields the rank it names first (kind
    ``"unknown"``).
    """
    if not detail:
        return None
    first, _, trace = detail.partition("\n")
    m = _HEAD_RE.search(first)
    if m is None:
        r = _RANK_RE.search(first) or _RANK_RE.search(detail)
        return FailureRecord(kind="unknown", rank=int(r.group(1)), text=first) if r else None
    rest = m.group("rest")
    age = -1.0
    a = _AGE_RE.search(rest)
    if a is not None:
        age = float(a.group("age"))
        rest = rest[: a.start()].rstrip()
    # The operation sits between the verb and the first ": " outside
    # parentheses (the text follows it and may itself contain colons).
    head, text = _split_text(rest)
    op, seq = "", -1
    o = _OP_RE.search(head)
    if o is not None:
        op, seq = o.group("op"), int(o.group("seq"))
    low = text.lower()
    if m.group("verb") == "left":
        kind = "left"
    elif "connection lost" in low or "closed the connection" in low:
        kind = "connection"
    elif "heartbeat" in low or "last seen" in low:
        kind = "silent"
    else:
        kind = "reported"
    return FailureRecord(
        kind=kind,
        rank=int(m.group("rank")),
        host=m.group("host"),
        pid=int(m.group("pid")),
        operation=op,
        seq=seq,
        age_s=age,
        text=text.strip(),
        trace=trace,
    )


def _split_text(rest: str) -> tuple[str, str]:
    depth = 0
    for i, ch in enumerate(rest):
        if ch == "(":
            depth += 1
        elif ch == ")":
            depth = max(0, depth - 1)
        elif depth == 0 and rest.startswith(": ", i):
            return rest[:i], rest[i + 2 :]
    return rest, ""


def failed_rank_of(detail: str) -> Optional[int]:
    """The rank a failure detail names ("rank 3 (host:pid) failed ...")."""
    rec = failure_record(detail)
    return rec.rank if rec is not None else None


# "barrier timed out after 1.0 s; ranks 1, 2 never arrived"
# "barrier (#4) on group 'x' timed out; ranks never arrived: 1, 2"
_MISSING_RES = (
    re.compile(r"ranks? (?P<ranks>\d+(?:, \d+)*)(?: and \d+ more)? never arrived"),
    re.compile(r"ranks never arrived: (?P<ranks>\d+(?:, \d+)*)"),
    # every absent rank came, then timed out and left before the others
    re.compile(r"ranks? (?P<ranks>\d+(?:, \d+)*)(?: and \d+ more)? arrived but timed out and left"),
)


def missing_ranks_of(detail: str) -> list[int]:
    """The ranks a barrier's timeout detail says never arrived ([] if none)."""
    for rx in _MISSING_RES:
        m = rx.search(detail or "")
        if m is not None:
            return [int(x) for x in m.group("ranks").split(", ")]
    return []


def _chain(exc: Optional[BaseException]) -> list[BaseException]:
    out: list[BaseException] = []
    while exc is not None and len(out) < 16 and exc not in out:
        out.append(exc)
        exc = exc.__cause__ or exc.__context__
    return out


def _has_status(exc: Optional[BaseException], st: Status) -> bool:
    """``exc`` (or an exception it was raised from) is a cohort failure with status ``st``.

    DDP's reducer re-raises a collective's error as a ``RuntimeError``
    quoting it, so the status name in the text counts too.
    """
    name = "COHORT_" + st.name
    for e in _chain(exc):
        if isinstance(e, CohortError):
            if e.status == st:
                return True
        elif isinstance(e, RuntimeError) and name + ":" in str(e):
            return True
    return False


def peer_lost(exc: Optional[BaseException]) -> bool:
    """True when ``exc`` says another rank of the job was lost (``EPEERLOST``)."""
    return _has_status(exc, Status.EPEERLOST)


def membership_changed(exc: Optional[BaseException]) -> bool:
    """True when ``exc`` says the elastic job moved to another generation
    (``EMEMBERSHIP``): the call did not take effect, reform (docs/elastic.md)."""
    return _has_status(exc, Status.EMEMBERSHIP)


def format_exception_report(exc: BaseException, budget: int = 3500) -> str:
    """The text a rank reports to the coordinator for an exception.

    The first line is the exception itself (``ValueError: ...``), so the
    summary the other ranks print stays readable; then the traceback,
    trimmed to its innermost frames (where it was raised) to fit about
    ``budget`` characters (the coordinator keeps about 4 KB).
    """
    summary = "".join(traceback.format_exception_only(type(exc), exc)).strip()
    trace = "".join(traceback.format_exception(type(exc), exc, exc.__traceback__))
    room = budget - len(summary)
    if len(trace) > room:
        trace = "Traceback (innermost frames):\n  ...\n" + trace[-room:].split("\n", 1)[-1]
    return f"{summary}\n{trace}"


# ---------------------------------------------------------------------------
# The torch flavour, created on first use
# ---------------------------------------------------------------------------

if TYPE_CHECKING:  # pragma: no cover
    import torch.distributed

    class CohortBackendError(CohortError, torch.distributed.DistBackendError):
        ...


_backend_error: Optional[type] = None


def _make_backend_error() -> type:
    global _backend_error
    if _backend_error is None:
        import torch.distributed as dist

        class CohortBackendError(CohortError, dist.DistBackendError):
            """A cohort collective failed.

            A :class:`torch.distributed.DistBackendError`, so code that
            handles torch's backend errors handles this one. ``failed_rank``
            is the rank that failed (for ``status == Status.EPEERLOST``),
            ``detail`` the full text: that rank's host and pid, the operation
            it was in and its own error text; ``failure`` the same as
            fields.
            """

        # Printed and pickled as cohort.torch.CohortBackendError, where
        # users import it from.
        CohortBackendError.__module__ = "cohort.torch"
        CohortBackendError.__qualname__ = "CohortBackendError"
        _backend_error = CohortBackendError
    return _backend_error


def __getattr__(name: str) -> Any:
    if name == "CohortBackendError":
        return _make_backend_error()
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
