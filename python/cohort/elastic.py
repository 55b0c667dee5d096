"""Elastic training in process: survive the loss of ranks, admit new ones.

An elastic cohort job (``cohort run --nnodes MIN:MAX``, ``torchrun
--rdzv-backend cohort --nnodes MIN:MAX``, or ``COHORT_MIN_WORLD`` /
``COHORT_MAX_WORLD`` in the environment) lives while at least MIN ranks
remain. When ranks are lost, the survivors move to the job's next
*generation* in the processes they run in, ranks renumbered densely in
their old order; a process that comes (back) is admitted at a *step
boundary* and gets the model and optimizer state from a healthy rank over
the data plane. The model and the guarantees are in ``docs/elastic.md``.

This module is that model for PyTorch:

- :class:`Manager`, in the spirit of torchft's: ``start_step()`` at the
  top of a step, ``should_commit()`` (the step boundary, the commit point)
  before applying the update, ``state_dict``/``load_state_dict`` callbacks
  for the state a new rank receives. After a change the default process
  group is re-created in process for the new rank and world size (torch's
  groups have a fixed rank and size), and ``on_change`` is called to
  rebuild what depends on it (DDP, samplers).
- :class:`ElasticDistributedSampler`: a ``DistributedSampler`` that keeps
  its place in the epoch and re-shards what is left of it for a new world.
- :func:`run`: a whole DDP training loop on both (``hvd.elastic.run``'s
  place): a lost rank, a returning one and the state transfer handled.

A step that was in flight during a change is discarded on every rank
alike (``should_commit()`` returns False everywhere) and repeated in the
new generation with the same data, re-sharded.
"""

from __future__ import annotations

import contextlib
import dataclasses
import datetime
import io
import logging
import math
import time
from typing import Any, Callable, Iterator, Optional, Sequence, Union

import torch
import torch.distributed as dist
from torch.utils.data import DataLoader, Dataset, DistributedSampler

from . import bootstrap
from . import torch as _cohort_torch  # noqa: F401 - registers the "cohort" backend
from ._abi import EXIT_PEER_LOST, StateRole, Status
from .client import Client, Reform, StepBoundary
from .failures import CohortError, membership_changed
from .process_group import CohortBackend, live_backends
from .store import CohortStore

__all__ = [
    "Change",
    "release_ddp",
    "ElasticDistributedSampler",
    "Manager",
    "RunResult",
    "EXIT_PEER_LOST",
    "JobFinished",
    "init_process_group",
    "membership_changed",
    "run",
]

log = logging.getLogger("cohort.elastic")

Timeout = Union[float, datetime.timedelta, None]


def _secs(t: Timeout) -> Optional[float]:
    if isinstance(t, datetime.timedelta):
        return t.total_seconds()
    return t


# ---------------------------------------------------------------------------
# What a change did
# ---------------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Change:
    """A move of this process to another generation of the job.

    Several moves between two calls of ``on_change`` (a second loss while
    the first was being handled) are folded into one: ``prev_*`` are from
    before the first, the rest from after the last; ``lost`` and ``joined``
    add up.

    Attributes:
        generation, rank, world_size: where this process is now.
        prev_generation, prev_rank, prev_world_size: where it was
            (``prev_rank`` -1: this process was admitted by the change).
        lost: ranks lost; joined: ranks admitted.
        received_state: this process received the state at this change
            (it is new in the job).
    """

    generation: int
    rank: int
    world_size: int
    prev_generation: int
    prev_rank: int
    prev_world_size: int
    lost: int = 0
    joined: int = 0
    received_state: bool = False

    def then(self, r: Reform) -> "Change":
        """This change followed by ``r``."""
        return dataclasses.replace(self, generation=r.generation, rank=r.rank, world_size=r.world_size,
                                   lost=self.lost + r.lost, joined=self.joined + r.joined)

    @classmethod
    def of(cls, r: Reform) -> "Change":
        return cls(r.generation, r.rank, r.world_size, r.prev_generation, r.prev_rank, r.prev_world_size,
                   r.lost, r.joined)


# ---------------------------------------------------------------------------
# The default process group of an elastic job
# ---------------------------------------------------------------------------


def _default_backend() -> Optional[CohortBackend]:
    if not dist.is_initialized():
        return None
    pg = dist.group.WORLD
    try:
        be = pg._get_backend(torch.device("cpu"))
    except Exception:
        return None
    return be if isinstance(be, CohortBackend) else None


#: What cohortd answers a join still waiting when the last member of its job leaves
#: (server/state/lifecycle.c).
_JOB_FINISHED = "the job finished"


class JobFinished(SystemExit):
    """The elastic job finished while this process waited to be admitted: there is nothing left to do.

    A process that comes back (a restarted node, a rescheduled pod) after the
    job's last step is not admitted: there is no step left to admit it at,
    and the members leave. cohortd then answers its join "the job finished".
    Like torchelastic's graceful exit of a node the final rendezvous did not
    include, this is a :class:`SystemExit` with status 0: uncaught, the
    process ends cleanly and ``cohort run`` counts its node as done rather
    than failed (a pod restarted late does not fail a finished job). Catch
    it to do something else. ``detail`` is cohortd's text.
    """

    def __init__(self, detail: str) -> None:
        super().__init__(0)
        self.detail = detail

    def __str__(self) -> str:
        return f"cohort elastic: {self.detail} before this process was admitted: nothing to do"


def _open_client(timeout: Timeout, join_timeout: Timeout, min_world: Optional[int],
                 max_world: Optional[int]) -> Client:
    import os

    if not os.environ.get("COHORT_COORDINATOR"):
        raise CohortError(
            Status.EINVAL,
            "an elastic job needs a coordinator that outlives every rank: start the ranks with `cohort run "
            "--nnodes MIN:MAX`, torchrun --rdzv-backend cohort, or set COHORT_COORDINATOR (and COHORT_JOB, "
            "COHORT_MIN_WORLD, COHORT_MAX_WORLD) for another launcher", "init_process_group")
    lo, hi = bootstrap.elastic_range_from_env()
    if min_world is not None:
        lo = min_world
    if max_world is not None:
        hi = max_world
    try:
        return Client(op_timeout=_secs(timeout), join_timeout=_secs(join_timeout), min_world=lo, max_world=hi)
    except CohortError as e:
        # ECLOSED also answers a join for other reasons (the coordinator
        # stopped without a journal, the join withdrawn): only the job's end
        # is nothing to do.
        if e.status == Status.ECLOSED and _JOB_FINISHED in e.detail:
            done = JobFinished(e.detail)
            log.warning("%s", done)
            raise done from e
        raise


def _torch_init(client: Client, timeout: datetime.timedelta) -> None:
    """The default process group over ``client``, at its rank and world size."""
    store = dist.PrefixStore(f"cohort/elastic/g{client.generation}/", CohortStore(client, timeout=timeout))
    with bootstrap.adopting(client):
        dist.init_process_group("cohort", rank=client.rank, world_size=client.world_size, store=store,
                                timeout=timeout)


def init_process_group(timeout: Timeout = None, join_timeout: Timeout = None, min_world: Optional[int] = None,
                       max_world: Optional[int] = None) -> Client:
    """Joins the elastic job of this process and creates torch's default group on it.

    cohortd gives the ranks of an elastic job (dense, in the order the
    launcher's ranks ask for; a process admitted into a running job gets the
    next free one), so the membership is opened first and torch is told its
    rank and size. Returns the :class:`~cohort.Client`. ``timeout`` is the
    operation timeout (seconds or a timedelta; None: ``COHORT_TIMEOUT_MS``),
    ``min_world``/``max_world`` override the environment's range. A process
    admitted into a running job returns once the job admitted it (at the
    running members' next step boundary); it holds no state yet: use a
    :class:`Manager`, which receives it. Raises :class:`JobFinished` (a
    ``SystemExit(0)``) when the job finished while it waited.
    """
    be = _default_backend()
    if be is not None:
        return be.client
    client = _open_client(timeout, join_timeout, min_world, max_world)
    try:
        _torch_init(client, datetime.timedelta(milliseconds=client.op_timeout_ms))
    except BaseException:
        bootstrap.forget(client)
        client.close()
        raise
    return client


def release_ddp(ddp: Optional[torch.nn.Module]) -> None:
    """Detaches a DistributedDataParallel of an old generation from its module.

    DDP's reducer hooks every parameter's gradient; a DDP built again on
    the re-created group must be the only one whose hooks run in the next
    backward, so the old reducer's hooks go now rather than whenever the
    garbage collector frees it.
    """
    reducer = getattr(ddp, "reducer", None)
    if reducer is not None:
        try:
            reducer._remove_autograd_hooks()
        except Exception as e:  # an older torch: the collector will do it
            log.debug("cohort.elastic: could not remove the old DDP's hooks: %s", e)


# ---------------------------------------------------------------------------
# The manager
# ---------------------------------------------------------------------------


class Manager:
    """Runs a training loop through membership changes, in process.

    Use it with any loop whose collectives go through torch.distributed's
    default group (on the cohort backend)::

        model, opt = Net(), torch.optim.SGD(...)
        m = cohort.elastic.Manager(
            state_dict=lambda: {"model": model.state_dict(), "opt": opt.state_dict()},
            load_state_dict=lambda s: (model.load_state_dict(s["model"]), opt.load_state_dict(s["opt"])),
            on_change=lambda change: ...)        # rebuild DDP, re-shard data
        while m.current_step < steps:
            m.start_step()
            with m.guard():                      # a change here discards the step
                loss = loss_fn(model(x), y); loss.backward(); all_reduce_grads()
            if m.should_commit(apply=opt.step):  # every rank commits, or none
                pass
            opt.zero_grad()

    ``start_step()`` moves the process along when the job changed (the
    default group re-created at the new rank and size, the state sent to
    or received from a peer, ``on_change`` called); ``should_commit()`` is
    the step boundary: True on every rank (apply the update) or False on
    every rank (a rank was lost first: the step is discarded, the next
    ``start_step()`` repeats it in the new generation). A process admitted
    into the running job receives the state in the constructor, before
    anything else uses the group, so build DDP after the manager.

    Args:
        state_dict: returns what a new rank needs (model, optimizer, data
            position...); called on the sending rank only.
        load_state_dict: takes it on a receiving rank.
        on_change: called with a :class:`Change` at the first
            ``start_step()`` after the job changed, once the state moved;
            rebuild here what holds the old group (DDP) or the old rank
            and world size (samplers). It may run collectives.
        timeout: the operation timeout (seconds or timedelta; None:
            ``COHORT_TIMEOUT_MS``); every call here is bounded by it.
        min_world, max_world: the range, when not from the environment.
        weights_only: ``torch.load``'s, for the state a rank receives
            (True: tensors and plain containers only).

    The constructor opens the membership and the default process group
    (:func:`init_process_group`) unless one exists already.
    """

    def __init__(
        self,
        state_dict: Optional[Callable[[], Any]] = None,
        load_state_dict: Optional[Callable[[Any], None]] = None,
        *,
        on_change: Optional[Callable[[Change], None]] = None,
        timeout: Timeout = None,
        join_timeout: Timeout = None,
        min_world: Optional[int] = None,
        max_world: Optional[int] = None,
        weights_only: bool = True,
    ) -> None:
        self._state_dict = state_dict
        self._load_state_dict = load_state_dict
        self._on_change = on_change
        self._weights_only = weights_only
        self._client = init_process_group(timeout, join_timeout, min_world, max_world)
        if not self._client.is_elastic:
            raise CohortError(
                Status.ENOTSUP,
                f"job {self._client.job!r} is not elastic: start it with a range of members (cohort run "
                f"--nnodes MIN:MAX, torchrun --rdzv-backend cohort --nnodes MIN:MAX, or COHORT_MIN_WORLD)",
                "Manager")
        self._timeout = _secs(timeout) if timeout is not None else self._client.op_timeout_ms / 1000.0
        self._step = 0
        self._need_reform = False
        self._need_sync = True  # a boundary first: a new member learns it receives
        self._roles: Optional[StepBoundary] = None  # a transfer the last boundary asked for
        self._failed: Optional[BaseException] = None  # a change met inside the step
        self._change: Optional[Change] = None  # not told to on_change yet
        self._received = False
        self._changes: list[Change] = []
        self._sync()
        if self._change is not None and self._received:
            # A new member: what it is was decided before the user's code
            # ran; nothing to rebuild yet.
            self._changes.append(self._change)
            self._change = None

    # -- what the loop reads --------------------------------------------------

    @property
    def client(self) -> Client:
        """The cohort membership."""
        return self._client

    @property
    def rank(self) -> int:
        """This process's rank in the current generation."""
        return self._client.rank

    @property
    def world_size(self) -> int:
        """Ranks in the current generation."""
        return self._client.world_size

    @property
    def generation(self) -> int:
        """The job's generation this process is in."""
        return self._client.generation

    @property
    def elastic_range(self) -> tuple[int, int]:
        """(min, max) ranks of the job."""
        return self._client.elastic_range

    @property
    def current_step(self) -> int:
        """Steps committed since the start of the job (part of the state a new rank receives)."""
        return self._step

    @property
    def changes(self) -> list[Change]:
        """Every change this process went through, in order."""
        return list(self._changes)

    @property
    def process_group(self) -> dist.ProcessGroup:
        """torch's default group (re-created at every change: do not keep it across steps)."""
        return dist.group.WORLD

    # -- the step ------------------------------------------------------------

    def start_step(self) -> None:
        """Moves along if the job changed; call it at the top of every step.

        Re-forms after a discarded step, admits and settles the state
        (sends it, or receives it), and calls ``on_change`` once the
        process is in its new generation with the state. Bounded by the
        timeout (per call into the job); raises
        :class:`~cohort.CohortError` ``EPEERLOST`` when the job fell below
        its minimum or this process was removed from it.
        """
        self._sync()
        while self._change is not None:
            change, self._change = self._change, None
            try:
                if self._on_change is not None:
                    self._on_change(change)
                self._changes.append(change)
            except BaseException as e:
                if not membership_changed(e):
                    raise
                self._change = change  # told again with the next move folded in
                self._moved_by_failure(e)
                self._sync()

    @contextlib.contextmanager
    def guard(self) -> Iterator[None]:
        """The step's work: a membership change inside it discards the step.

        Swallows the error of a change (``EMEMBERSHIP``, raised by a
        collective or by DDP's backward) so that ``should_commit()``
        returns False; every other exception passes.
        """
        try:
            yield
        except BaseException as e:
            if not self.report_error(e):
                raise

    def report_error(self, exc: BaseException) -> bool:
        """Takes a collective's error: True (the step is discarded) if it is a membership change."""
        if membership_changed(exc):
            self._failed = exc
            return True
        return False

    def should_commit(self, apply: Optional[Callable[[], Any]] = None) -> bool:
        """The step boundary: True on every rank, or False on every rank.

        True: every rank of the generation finished the step; apply the
        update (``apply`` runs it here, before anything else). False: a rank
        was lost before every rank got here (or the step met the change):
        do not apply it; the next :meth:`start_step` repeats it in the new
        generation. When ranks were admitted at this boundary the state is
        sent to them right after ``apply`` (or at the next
        :meth:`start_step` when none is given; until then the group refuses
        collectives with ``ESTATE``: the new ranks are waiting for the
        state, not for them).
        """
        if self._failed is not None:
            exc, self._failed = self._failed, None
            self._moved_by_failure(exc)
            return False
        try:
            b = self._client.step_boundary(self._timeout)
        except CohortError as e:
            if not membership_changed(e):
                raise
            self._moved_by_failure(e)
            return False
        self._step += 1
        if apply is not None:
            apply()
        self._after_boundary(b)
        if self._roles is not None:
            if apply is not None:
                self._sync()
            else:
                be = _default_backend()
                if be is not None:
                    be.refuse(Status.ESTATE,
                              "ranks were admitted at the last step boundary and wait for the state: call "
                              "Manager.start_step() (or pass apply= to should_commit) before the next collective")
        return True

    # -- moving along ----------------------------------------------------------

    def _moved_by_failure(self, exc: BaseException) -> None:
        """A call met a change: re-form now (the group re-created), settle at the next start_step."""
        log.info("cohort.elastic: the job changed (%s)", str(exc).splitlines()[0])
        self._need_reform = True
        self._need_sync = True
        self._roles = None
        try:
            self._reform()
        except CohortError as e:
            if not membership_changed(e):
                raise

    def _reform(self) -> None:
        """cohort_client_reform after every call in flight ended, then the torch group again."""
        for be in live_backends():
            if be.client is self._client:
                be.refuse(Status.EMEMBERSHIP,
                          f"the job moved on from generation {self._client.generation}: this group is of the old "
                          f"one (cohort.elastic re-creates the default group; call Manager.start_step())")
                be.quiesce(self._timeout)
        deadline = time.monotonic() + self._timeout
        while True:
            try:
                r = self._client.reform(max(0.0, deadline - time.monotonic()))
                break
            except CohortError as e:
                if e.status != Status.EMEMBERSHIP or time.monotonic() >= deadline:
                    raise
        self._need_reform = False
        if not r.moved:
            # already in the current generation (a boundary moved it): the
            # groups as they are serve it
            for be in live_backends():
                if be.client is self._client and be._refusal is not None and be._refusal[0] == Status.EMEMBERSHIP:
                    be.accept()
            return
        self._note(r)
        self._rebuild_group()

    def _note(self, r: Reform) -> None:
        if not r.moved:
            return
        log.info("cohort.elastic: generation %d: rank %d of %d (was %d of %d), lost %d, joined %d",
                 r.generation, r.rank, r.world_size, r.prev_rank, r.prev_world_size, r.lost, r.joined)
        self._change = Change.of(r) if self._change is None else self._change.then(r)

    def _rebuild_group(self) -> None:
        """torch's default group again, at the client's (new) rank and size."""
        old = _default_backend()
        timeout = datetime.timedelta(seconds=old._timeout_s) if old is not None else datetime.timedelta(
            milliseconds=self._client.op_timeout_ms)
        for be in live_backends():
            if be.client is self._client:
                be.detach()
        if dist.is_initialized():
            dist.destroy_process_group()
        _torch_init(self._client, timeout)

    def _after_boundary(self, b: StepBoundary) -> None:
        if b.changed and b.reform is not None:
            self._note(b.reform)
            self._rebuild_group()
        self._roles = b if b.role != StateRole.NONE else None

    def _sync(self) -> None:
        """Re-form if needed, pass a boundary if needed, move the state it asks for."""
        deadline = time.monotonic() + max(self._timeout, 1.0) * 3
        while True:
            try:
                if self._need_reform:
                    self._reform()
                if self._need_sync:
                    b = self._client.step_boundary(self._timeout)
                    self._need_sync = False
                    self._after_boundary(b)
                if self._roles is not None:
                    self._transfer(self._roles)
                    self._roles = None
                be = _default_backend()
                if be is not None and be._refusal is not None and be._refusal[0] == Status.ESTATE:
                    be.accept()
                return
            except CohortError as e:
                if not membership_changed(e) or time.monotonic() >= deadline:
                    raise
                self._need_reform = True
                self._need_sync = True
                self._roles = None

    def _transfer(self, b: StepBoundary) -> None:
        be = _default_backend()
        if be is not None and be._refusal is not None and be._refusal[0] == Status.ESTATE:
            be.accept()
        if b.role == StateRole.SEND:
            buf = io.BytesIO()
            torch.save({"cohort.elastic": {"step": self._step}, "state": self._state_dict()
                        if self._state_dict is not None else None}, buf)
            self._client.state_transfer(buf.getbuffer(), self._timeout)
            log.info("cohort.elastic: sent the state (%d bytes) to %d rank(s) at step %d", buf.tell(), b.receivers,
                     self._step)
            return
        data = self._client.state_transfer(None, self._timeout)
        if data is None:
            raise CohortError(Status.EPROTO, "the state transfer gave a receiver nothing", "state_transfer")
        blob = torch.load(io.BytesIO(data), weights_only=self._weights_only)
        self._step = int(blob["cohort.elastic"]["step"])
        if self._load_state_dict is not None and blob["state"] is not None:
            self._load_state_dict(blob["state"])
        self._received = True
        if self._change is not None:
            self._change = dataclasses.replace(self._change, received_state=True)
        log.info("cohort.elastic: received the state (%d bytes) from rank %d at step %d", len(data), b.sender,
                 self._step)

    def close(self) -> None:
        """Leaves the job cleanly (destroys the default group)."""
        if dist.is_initialized():
            dist.destroy_process_group()

    def __enter__(self) -> "Manager":
        return self

    def __exit__(self, *exc: object) -> None:
        self.close()


# ---------------------------------------------------------------------------
# Data: a sampler that keeps its place through changes
# ---------------------------------------------------------------------------


class ElasticDistributedSampler(DistributedSampler):
    """A ``DistributedSampler`` that knows how far the epoch went.

    ``DistributedSampler`` deals the epoch's order out to the ranks
    round-robin: rank ``r`` of ``W`` takes positions ``r, r+W, r+2W...``,
    so each step of a per-rank batch ``b`` consumes the next ``b*W``
    positions of the order, on all ranks together. This sampler counts them
    (:meth:`advance`, once per committed step) and deals out only what is
    left of the epoch; :meth:`reshard` gives it a new rank and world size.
    After a change the rest of the epoch is split among the new world, in
    the same order: no sample of the epoch is skipped or repeated (except
    DistributedSampler's padding at the end of an epoch).

    Its place (``epoch``, ``position``) is in :meth:`state_dict`, so a rank
    that joins receives it with the model.
    """

    def __init__(self, dataset: Dataset, num_replicas: Optional[int] = None, rank: Optional[int] = None,
                 shuffle: bool = True, seed: int = 0, drop_last: bool = False) -> None:
        super().__init__(dataset, num_replicas=num_replicas, rank=rank, shuffle=shuffle, seed=seed,
                         drop_last=drop_last)
        self.position = 0
        self._recount()

    def _n(self) -> int:
        return len(self.dataset)  # type: ignore[arg-type]

    def _recount(self) -> None:
        left = max(0, self._n() - self.position)
        w = self.num_replicas
        if self.drop_last and left % w != 0:
            self.num_samples = left // w
        else:
            self.num_samples = math.ceil(left / w)
        self.total_size = self.num_samples * w

    def reshard(self, rank: int, num_replicas: int) -> None:
        """The rest of the epoch dealt out to ``num_replicas`` ranks; this is ``rank``."""
        if not 0 <= rank < num_replicas:
            raise ValueError(f"rank {rank} is not in a world of {num_replicas}")
        self.rank = rank
        self.num_replicas = num_replicas
        self._recount()

    def set_epoch(self, epoch: int) -> None:
        """A new epoch, from its start."""
        super().set_epoch(epoch)
        self.position = 0
        self._recount()

    def advance(self, samples: int) -> None:
        """``samples`` more positions of the epoch consumed (by every rank together)."""
        self.position = min(self._n(), self.position + int(samples))
        self._recount()

    @property
    def remaining(self) -> int:
        """Positions of the epoch not consumed yet."""
        return max(0, self._n() - self.position)

    def order(self) -> list[int]:
        """The epoch's order of the whole data set (the same on every rank)."""
        if self.shuffle:
            g = torch.Generator()
            g.manual_seed(self.seed + self.epoch)
            return torch.randperm(self._n(), generator=g).tolist()
        return list(range(self._n()))

    def __iter__(self) -> Iterator[int]:
        rest = self.order()[self.position:]
        if not self.drop_last:
            pad = self.total_size - len(rest)
            if pad > 0 and rest:
                rest += (rest * math.ceil(pad / len(rest)))[:pad]
        else:
            rest = rest[: self.total_size]
        return iter(rest[self.rank: self.total_size: self.num_replicas])

    def __len__(self) -> int:
        return self.num_samples

    def state_dict(self) -> dict[str, int]:
        """Its place: the epoch and the positions of it consumed."""
        return {"epoch": int(self.epoch), "position": int(self.position)}

    def load_state_dict(self, state: dict[str, int]) -> None:
        """Takes the place :meth:`state_dict` gave (on any rank, any world size)."""
        self.epoch = int(state["epoch"])
        self.position = int(state["position"])
        self._recount()


# ---------------------------------------------------------------------------
# A DDP loop, whole
# ---------------------------------------------------------------------------


@dataclasses.dataclass
class RunResult:
    """What :func:`run` did on this process."""

    steps: int  # steps committed by the job since its start
    epochs: int
    rank: int
    world_size: int
    generation: int
    changes: list[Change]
    samples: int  # samples of committed steps this process trained on
    discarded: int  # steps this process began that were not committed


def run(
    train_step: Callable[[torch.nn.Module, Any], torch.Tensor],
    *,
    model: torch.nn.Module,
    optimizer: torch.optim.Optimizer,
    dataset: Dataset,
    batch_size: int,
    epochs: int,
    shuffle: bool = True,
    seed: int = 0,
    drop_last: bool = False,
    collate_fn: Optional[Callable[[list], Any]] = None,
    ddp_kwargs: Optional[dict[str, Any]] = None,
    state: Optional[dict[str, Any]] = None,
    on_change: Optional[Callable[[Change], None]] = None,
    on_commit: Optional[Callable[[int, torch.Tensor], None]] = None,
    timeout: Timeout = None,
) -> RunResult:
    """Trains ``model`` with DDP over an elastic job, through membership changes.

    ``train_step(ddp_model, batch)`` returns the loss of this rank's batch
    (``batch_size`` samples per rank, from an
    :class:`ElasticDistributedSampler`); :func:`run` calls ``backward``,
    commits the step at the step boundary and applies ``optimizer.step()``
    on every rank or on none. When ranks are lost the survivors go on in
    their processes: DDP is rebuilt on the re-created default group, the
    rest of the epoch re-sharded, the discarded step repeated. A process
    that starts while the job runs is admitted at the next step and
    receives the model, the optimizer, the sampler's place and every
    ``state`` object (anything with ``state_dict``/``load_state_dict``: an
    LR scheduler, a GradScaler) from a healthy rank.

    ``on_commit(step, loss)`` is called after each committed step (no
    collectives in it: ranks may be waiting for the state). Returns a
    :class:`RunResult`. Raises :class:`~cohort.CohortError` ``EPEERLOST``
    when the job fell below its minimum (uncaught, the process exits with
    :data:`EXIT_PEER_LOST`).
    """
    from torch.nn.parallel import DistributedDataParallel as DDP

    extra = dict(state or {})
    sampler = ElasticDistributedSampler(dataset, num_replicas=1, rank=0, shuffle=shuffle, seed=seed,
                                        drop_last=drop_last)
    progress = {"epoch": 0, "samples": 0}

    def state_dict() -> dict[str, Any]:
        return {"model": model.state_dict(), "optimizer": optimizer.state_dict(), "sampler": sampler.state_dict(),
                "epoch": progress["epoch"], "extra": {k: v.state_dict() for k, v in extra.items()}}

    def load_state_dict(s: dict[str, Any]) -> None:
        model.load_state_dict(s["model"])
        optimizer.load_state_dict(s["optimizer"])
        sampler.load_state_dict(s["sampler"])
        progress["epoch"] = int(s["epoch"])
        for k, v in extra.items():
            v.load_state_dict(s["extra"][k])

    holder: dict[str, Any] = {}

    def rebuild(change: Optional[Change]) -> None:
        release_ddp(holder.pop("ddp", None))
        holder["ddp"] = DDP(model, **(ddp_kwargs or {}))
        sampler.reshard(dist.get_rank(), dist.get_world_size())
        holder["it"] = None
        if change is not None and on_change is not None:
            on_change(change)

    m = Manager(state_dict, load_state_dict, on_change=rebuild, timeout=timeout)
    rebuild(None)
    discarded = 0
    loss = torch.zeros(())
    while progress["epoch"] < epochs:
        m.start_step()
        if sampler.epoch != progress["epoch"]:
            sampler.set_epoch(progress["epoch"])
            holder["it"] = None
        if holder.get("it") is None:
            loader = DataLoader(dataset, batch_size=batch_size, sampler=sampler, collate_fn=collate_fn,
                                drop_last=False)
            holder["it"] = iter(loader)
        try:
            batch = next(holder["it"])
        except StopIteration:
            batch = None
        if batch is None:
            # the epoch is done on every rank alike (the same position)
            progress["epoch"] += 1
            holder["it"] = None
            continue
        take = min(batch_size * m.world_size, sampler.remaining)
        with m.guard():
            loss = train_step(holder["ddp"], batch)
            loss.backward()
        n_local = len(batch[0]) if isinstance(batch, (list, tuple)) else batch_size

        def apply() -> None:
            optimizer.step()
            sampler.advance(take)

        if m.should_commit(apply=apply):
            progress["samples"] += n_local
            if on_commit is not None:
                on_commit(m.current_step, loss.detach())
        else:
            discarded += 1
        optimizer.zero_grad(set_to_none=True)
    return RunResult(steps=m.current_step, epochs=progress["epoch"], rank=m.rank, world_size=m.world_size,
                     generation=m.generation, changes=m.changes, samples=progress["samples"], discarded=discarded)
