"""torch tensors as libcohort buffers: element types, reduce ops, timeouts, layout.

The small conversions every collective of :mod:`cohort.process_group`
makes before it calls into the library: the ``cohort_dtype`` of a tensor,
the ``cohort_redop`` of a :class:`torch.distributed.ReduceOp`, a torch
timeout in milliseconds, the CUDA stream of a device tensor, and the
contiguous buffers (with what to copy back afterwards) of tensors that are
not contiguous or come as lists.
"""

from __future__ import annotations

import datetime
from typing import Any, Callable, Optional, Sequence

import torch
from torch.distributed import ReduceOp

from ._abi import WAIT_DEFAULT, Dtype, RedOp

__all__ = ["dtype_of", "move_dtype_of", "redop_of", "int_mean", "timeout_ms", "stream_of", "contig", "flat", "unflat_into",
           "finisher", "SUPPORTED_DTYPES"]

_DTYPES: dict[torch.dtype, int] = {
    torch.float32: Dtype.F32,
    torch.float64: Dtype.F64,
    torch.float16: Dtype.F16,
    torch.bfloat16: Dtype.BF16,
    torch.int32: Dtype.I32,
    torch.int64: Dtype.I64,
    torch.uint8: Dtype.U8,
    torch.bool: Dtype.U8,  # as u8: SUM/MAX are "or", PRODUCT/MIN "and"
}
#: The torch dtypes the backend accepts.
SUPPORTED_DTYPES = tuple(_DTYPES)
_FLOATS = (torch.float32, torch.float64, torch.float16, torch.bfloat16)

_OPS = {
    ReduceOp.SUM: RedOp.SUM,
    ReduceOp.PRODUCT: RedOp.PROD,
    ReduceOp.MIN: RedOp.MIN,
    ReduceOp.MAX: RedOp.MAX,
    ReduceOp.AVG: RedOp.MEAN,
}

_MAX_MS = 2**31 - 1
_ZERO = datetime.timedelta(0)


def dtype_of(t: torch.Tensor, op: str) -> int:
    """The ``cohort_dtype`` of ``t``; TypeError naming the supported ones."""
    try:
        return int(_DTYPES[t.dtype])
    except KeyError:
        raise TypeError(
            f"cohort {op}: dtype {t.dtype} is not supported (supported: float32, float64, "
            f"float16, bfloat16, int32, int64, uint8, bool)"
        ) from None


def move_dtype_of(t: torch.Tensor) -> tuple[int, int]:
    """For a collective that only moves bytes (broadcast, gathers, scatter,
    all-to-all, send and receive): ``(cohort_dtype, k)``, where ``k`` is how
    many library elements one element of ``t`` is. A dtype the library has
    is moved as itself (k = 1); any other (int8, int16, uint16, complex,
    the float8 types, ...) as its bytes (``COHORT_U8``, k = its size), as
    gloo moves every dtype it has no reduction for."""
    code = _DTYPES.get(t.dtype)
    if code is not None:
        return int(code), 1
    return int(Dtype.U8), t.element_size()


def redop_of(reduce_op: Any, t: torch.Tensor, op: str) -> int:
    """The ``cohort_redop`` of a torch reduce op for ``t``; ValueError if unsupported."""
    kind = getattr(reduce_op, "op", reduce_op)
    try:
        code = _OPS[kind]
    except KeyError:
        raise ValueError(
            f"cohort {op}: reduce op {kind} is not supported (supported: SUM, AVG, PRODUCT, MIN, MAX)"
        ) from None
    if t.dtype == torch.bool:
        if code == RedOp.MEAN:
            raise ValueError(f"cohort {op}: AVG is not defined for bool tensors")
        return int(RedOp.MAX if code in (RedOp.SUM, RedOp.MAX) else RedOp.MIN)
    return int(code)


def int_mean(code: int, t: torch.Tensor, size: int) -> tuple[int, Optional[Callable[[torch.Tensor], None]]]:
    """AVG on an integer tensor: SUM, then division truncated toward zero (as NCCL)."""
    if code == RedOp.MEAN and t.dtype not in _FLOATS:
        return int(RedOp.SUM), lambda buf: buf.copy_(torch.div(buf, size, rounding_mode="trunc"))
    return code, None


def timeout_ms(td: Optional[datetime.timedelta]) -> int:
    """A torch timeout (timedelta; None, zero or negative: the group's) in ms."""
    if td is None:
        return WAIT_DEFAULT
    ms = int(td.total_seconds() * 1000)
    return WAIT_DEFAULT if ms <= 0 else min(ms, _MAX_MS)


def opts_ms(opts: Any, default_ms: int) -> int:
    """The timeout of one call's options: its own if set, else ``default_ms``."""
    td = opts.timeout
    if td.days < 0 or td == _ZERO:  # torch's "unset" is -1 ms
        return default_ms
    return timeout_ms(td)


def stream_of(t: torch.Tensor) -> Optional[int]:
    """The current CUDA stream of a device tensor (None for host memory)."""
    if t.is_cuda:
        return torch.cuda.current_stream(t.device).cuda_stream
    return None


def contig(t: torch.Tensor) -> torch.Tensor:
    """``t`` itself when contiguous, else a contiguous copy."""
    return t if t.is_contiguous() else t.contiguous()


def flat(tensors: Sequence[torch.Tensor], like: torch.Tensor) -> torch.Tensor:
    """One contiguous buffer holding ``tensors`` back to back (a copy)."""
    if not tensors:
        return like.new_empty(0)
    return torch.cat([t.reshape(-1) for t in tensors])


def unflat_into(buf: torch.Tensor, outs: Sequence[torch.Tensor]) -> None:
    """Copies consecutive pieces of ``buf`` into ``outs``."""
    off = 0
    for o in outs:
        n = o.numel()
        o.copy_(buf[off : off + n].view_as(o))
        off += n


def finisher(
    buf: Optional[torch.Tensor],
    target: Optional[torch.Tensor] = None,
    post: Optional[Callable[[torch.Tensor], Any]] = None,
    then: Optional[Callable[[], Any]] = None,
) -> Optional[Callable[[], None]]:
    """What runs once a collective has filled ``buf``.

    ``post`` on it (an integer mean's division), the copy into ``target``
    where ``buf`` is a contiguous stand-in for it, then ``then``. None when
    nothing has to run.
    """
    copy = buf is not None and target is not None and buf is not target
    if post is None and not copy:
        return then

    def finish() -> None:
        if post is not None:
            post(buf)
        if copy:
            target.copy_(buf)
        if then is not None:
            then()

    return finish
