"""A torch.distributed ``Store`` on cohortd's key-value store.

:class:`CohortStore` is a :class:`torch.distributed.Store` whose keys live
in the job's key-value store at the coordinator (``cohort_kv_*``: the
semantics of torch's TCPStore, journalled by cohortd, shared by every
member of the job), reached through a member's :class:`~cohort.Client`.
Nothing binds a port and no rank hosts it, so it outlives the loss of any
rank: an elastic job re-creates its default process group on it after a
membership change (:mod:`cohort.elastic`), and torch's own users of the
default group's store (``new_group``'s store-based barrier, DeviceMesh,
object collectives' keys) keep working.

Timeouts: every blocking call waits at most the store's ``timeout``
(torch's ``set_timeout``; 5 minutes by default), a ``wait`` its own when
given, and raises :class:`torch.distributed.DistStoreError` when it passes,
as TCPStore does.
"""

from __future__ import annotations

import datetime
from typing import Optional, Sequence, Union

import torch.distributed as dist

from ._abi import Status
from .client import Client
from .failures import CohortError

__all__ = ["CohortStore"]

_Value = Union[str, bytes, bytearray, memoryview]


def _b(v: _Value) -> bytes:
    if isinstance(v, str):
        return v.encode()
    return bytes(v)


class CohortStore(dist.Store):
    """torch's ``Store`` interface over a cohort job's key-value store.

    Args:
        client: the membership whose job's keys the store uses (it must stay
            open while the store is used).
        prefix: prepended to every key (``"a/"``: the store's ``k`` is the
            job's ``a/k``), so that several stores share a job without
            meeting.
        timeout: the store's default timeout (``Store.timeout``).
    """

    def __init__(self, client: Client, prefix: str = "",
                 timeout: datetime.timedelta = datetime.timedelta(minutes=5)) -> None:
        super().__init__()
        self._client = client
        self._prefix = prefix
        self.set_timeout(timeout)

    @property
    def client(self) -> Client:
        """The membership the store reaches cohortd through."""
        return self._client

    def _k(self, key: str) -> str:
        return self._prefix + key

    def _secs(self, timeout: Optional[datetime.timedelta] = None) -> float:
        t = timeout if timeout is not None else self.timeout
        s = t.total_seconds()
        return s if s > 0 else -1.0  # torch's 0: no timeout

    @staticmethod
    def _raise(e: CohortError, what: str) -> None:
        if e.status == Status.ETIMEDOUT:
            raise dist.DistStoreError(f"cohort store: {what} timed out: {e.detail}") from e
        raise dist.DistStoreError(f"cohort store: {what} failed: {e}") from e

    # -- torch's Store interface -------------------------------------------

    def set(self, key: str, value: _Value) -> None:
        try:
            self._client.kv_set(self._k(key), _b(value), self._secs())
        except CohortError as e:
            self._raise(e, f"set {key!r}")

    def get(self, key: str) -> bytes:
        try:
            return self._client.kv_get(self._k(key), self._secs())
        except CohortError as e:
            self._raise(e, f"get {key!r}")
            raise  # unreachable

    def add(self, key: str, value: int) -> int:
        try:
            return self._client.kv_add(self._k(key), int(value), self._secs())
        except CohortError as e:
            self._raise(e, f"add {key!r}")
            raise

    def compare_set(self, key: str, expected_value: _Value, desired_value: _Value) -> bytes:
        """TCPStore's compare_set: an empty ``expected_value`` matches an absent key.

        Returns the value after the operation; for an absent key and a
        non-empty ``expected_value``, ``expected_value`` (as TCPStore does).
        """
        exp, want = _b(expected_value), _b(desired_value)
        try:
            swapped, cur = self._client.kv_compare_set(self._k(key), exp if exp else None, want, self._secs())
            if not swapped and cur is None and exp:
                return exp
            return cur if cur is not None else b""
        except CohortError as e:
            self._raise(e, f"compare_set {key!r}")
            raise

    def check(self, keys: Sequence[str]) -> bool:
        try:
            return self._client.kv_check([self._k(k) for k in keys], self._secs())
        except CohortError as e:
            self._raise(e, "check")
            raise

    def wait(self, keys: Sequence[str], timeout: Optional[datetime.timedelta] = None) -> None:
        try:
            self._client.kv_wait([self._k(k) for k in keys], self._secs(timeout))
        except CohortError as e:
            self._raise(e, f"wait for {list(keys)}")

    def deleteKey(self, key: str) -> bool:  # noqa: N802 - torch's trampoline name
        try:
            return self._client.kv_delete(self._k(key), self._secs())
        except CohortError as e:
            self._raise(e, f"delete {key!r}")
            raise

    delete_key = deleteKey

    def getNumKeys(self) -> int:  # noqa: N802 - torch's trampoline name
        """Keys of the whole job (the prefix is not a namespace for counting)."""
        try:
            return self._client.kv_num_keys(self._secs())
        except CohortError as e:
            self._raise(e, "num_keys")
            raise

    num_keys = getNumKeys

    def append(self, key: str, value: _Value) -> None:
        try:
            self._client.kv_append(self._k(key), _b(value), self._secs())
        except CohortError as e:
            self._raise(e, f"append {key!r}")

    def multi_get(self, keys: Sequence[str]) -> list[bytes]:
        return [self.get(k) for k in keys]

    def multi_set(self, keys: Sequence[str], values: Sequence[_Value]) -> None:
        for k, v in zip(keys, values):
            self.set(k, v)

    def __repr__(self) -> str:
        return f"CohortStore(job={self._client.job!r}, prefix={self._prefix!r})"
