"""One rank of the torch-feature comparison (test_torch_features.py): cohort against gloo.

    features.py BACKEND SCENARIO OUTDIR

Runs the torch features a process group has to support to be treated as
torch's own, each on the given backend, deterministically (the same seeds
on every backend), and saves what each produced (losses, parameters,
tensors) to OUTDIR/rank<r>.pt for the test to compare across backends.
Prints one JSON line per feature: {"feature", "ok", "why", "rank", ...}.

Scenarios (each a job of its own):

- ``train``: group identity, FSDP2 training steps, functional collectives,
  a 1-D DeviceMesh with DTensor, DCP save/load of an FSDP2 model, DDP with
  the PowerSGD comm hook, ``split_group``; and what already worked before
  the group was torch's own, kept working: FSDP1, ZeroRedundancyOptimizer,
  DDP's fp16/bf16/allreduce comm hooks, Join with uneven inputs;
- ``mesh2d``: a 2-D DeviceMesh (4 ranks) with DTensor distribute,
  redistribute and full_tensor;
- ``device_id``: ``init_process_group(device_id=cpu:0)``, then collectives
  and a subgroup;
- ``monitored``: ``monitored_barrier`` with rank 1 missing (1 s);
- ``timeout``: ``init_process_group(timeout=1 s)``: collectives work, and a
  rank 3 s late makes the others raise after about 1 s.
"""

from __future__ import annotations

import datetime
import json
import os
import time
from typing import Optional

import torch
import torch.distributed as dist
from torch import nn

import cohort.torch  # noqa: F401
from compared import backend, outdir, rank, run, saved, scenario, world


def mlp() -> nn.Module:
    torch.manual_seed(1234)
    return nn.Sequential(nn.Linear(16, 32), nn.Tanh(), nn.Linear(32, 32), nn.Tanh(), nn.Linear(32, 4))


def batch(step: int, r: int) -> tuple[torch.Tensor, torch.Tensor]:
    g = torch.Generator().manual_seed(1000 * step + r)
    return torch.randn(8, 16, generator=g), torch.randint(0, 4, (8,), generator=g)


# ---------------------------------------------------------------------------
# train
# ---------------------------------------------------------------------------


def f_identity():
    pg = dist.group.WORLD
    be = pg._get_backend(torch.device("cpu"))
    assert pg.group_name, "no group name"
    assert torch.device("cpu") in pg._device_types, pg._device_types
    return {"group_name": pg.group_name, "group_desc": pg.group_desc, "backend": dist.get_backend(),
            "devices": sorted(d.type for d in pg._device_types), "backend_name": be.name()}


def f_fsdp2():
    from torch.distributed.fsdp import fully_shard

    model = mlp()
    for layer in model:
        if isinstance(layer, nn.Linear):
            fully_shard(layer)
    fully_shard(model)
    losses = _train(model)
    full = [p.full_tensor().detach().clone() for p in model.parameters()]
    saved["fsdp2"] = {"losses": torch.stack(losses), "params": full}
    return {"losses": [float(v) for v in losses]}


def f_funcol():
    import torch.distributed._functional_collectives as funcol

    g = dist.group.WORLD
    x = torch.arange(6 * world, dtype=torch.float32) + 100 * rank
    out = {
        "all_reduce": funcol.all_reduce(x, "sum", g),
        "all_reduce_max": funcol.all_reduce(x, "max", g),
        "all_gather": funcol.all_gather_tensor(x, 0, g),
        "reduce_scatter": funcol.reduce_scatter_tensor(x, "sum", 0, g),
        "all_to_all": funcol.all_to_all_single(x, None, None, g),
        "broadcast": funcol.broadcast(x, 0, g),
    }
    out = {k: (v.wait() if hasattr(v, "wait") else v).clone() for k, v in out.items()}
    # The ops torch's compiled code calls, by group name.
    name = dist.group.WORLD.group_name
    t = torch.ones(4) * (rank + 1)
    r = torch.ops._c10d_functional.all_reduce(t, "sum", name)
    out["op_all_reduce"] = torch.ops._c10d_functional.wait_tensor(r).clone()
    saved["funcol"] = out
    return {}


def f_mesh1d():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (world,))
    torch.manual_seed(7)
    big = torch.randn(4 * world, 3)
    d = distribute_tensor(big, mesh, [Shard(0)])
    local = d.to_local().clone()
    rep = d.redistribute(mesh, [Replicate()]).to_local().clone()
    s = (d * 2 + 1).sum().full_tensor()
    saved["mesh1d"] = {"local": local, "replicated": rep, "sum": s.clone(), "full": d.full_tensor().clone()}
    assert torch.equal(d.full_tensor(), big)
    return {"mesh_groups": [mesh.get_group().group_name]}


def f_dcp():
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_model_state_dict, set_model_state_dict
    from torch.distributed.fsdp import fully_shard

    def build():
        m = mlp()
        fully_shard(m)
        return m

    model = build()
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    for step in range(2):
        x, y = batch(step, rank)
        opt.zero_grad()
        nn.functional.cross_entropy(model(x), y).backward()
        opt.step()
    ckpt = os.path.join(outdir, "dcp")
    if rank == 0:
        os.makedirs(ckpt, exist_ok=True)
    dist.barrier()
    dcp.save({"model": get_model_state_dict(model)}, checkpoint_id=ckpt)
    before = [p.full_tensor().detach().clone() for p in model.parameters()]
    fresh = build()
    state = {"model": get_model_state_dict(fresh)}
    dcp.load(state, checkpoint_id=ckpt)
    set_model_state_dict(fresh, state["model"])
    after = [p.full_tensor().detach().clone() for p in fresh.parameters()]
    same = all(torch.equal(a, b) for a, b in zip(before, after))
    assert same, "the loaded model differs from the saved one"
    saved["dcp"] = {"params": after}
    return {"files": sorted(os.listdir(ckpt)) if rank == 0 else []}


def f_powersgd():
    from torch.distributed.algorithms.ddp_comm_hooks import powerSGD_hook as powersgd
    from torch.nn.parallel import DistributedDataParallel as DDP

    # One bucket: PowerSGD's callbacks each wait on further all-reduces.
    # With several buckets they would issue them while backward() still
    # issues the next buckets' all-reduces, in an order that differs from
    # rank to rank (gloo hangs then; cohort raises EMISMATCH).
    model = DDP(mlp())
    state = powersgd.PowerSGDState(process_group=None, matrix_approximation_rank=1, start_powerSGD_iter=2,
                                   min_compression_rate=0.5, use_error_feedback=True, warm_start=True,
                                   random_seed=0)
    model.register_comm_hook(state, powersgd.powerSGD_hook)
    losses = _train(model, steps=6)
    saved["powersgd"] = {"losses": torch.stack(losses),
                         "params": [p.detach().clone() for p in model.module.parameters()]}
    return {"losses": [float(v) for v in losses]}


def _train(model, steps: int = 4, opt=None, r: Optional[int] = None) -> list:
    opt = opt or torch.optim.SGD(model.parameters(), lr=0.1)
    losses = []
    for step in range(steps):
        x, y = batch(step, rank if r is None else r)
        opt.zero_grad()
        loss = nn.functional.cross_entropy(model(x), y)
        loss.backward()
        opt.step()
        losses.append(loss.detach())
    return losses


def f_fsdp1():
    from torch.distributed.fsdp import FullyShardedDataParallel as FSDP

    model = FSDP(mlp(), use_orig_params=True, device_id=torch.device("cpu"))
    losses = _train(model)
    with FSDP.summon_full_params(model):
        params = [p.detach().clone() for p in model.parameters()]
    saved["fsdp1"] = {"losses": torch.stack(losses), "params": params}
    return {}


def f_zero():
    from torch.distributed.optim import ZeroRedundancyOptimizer
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp())
    opt = ZeroRedundancyOptimizer(model.parameters(), optimizer_class=torch.optim.Adam, lr=0.01)
    losses = _train(model, opt=opt)
    saved["zero"] = {"losses": torch.stack(losses), "params": [p.detach().clone() for p in model.parameters()]}
    return {}


def f_ddp_hooks():
    from torch.distributed.algorithms.ddp_comm_hooks import default_hooks
    from torch.nn.parallel import DistributedDataParallel as DDP

    out = {}
    for name, hook in (("fp16", default_hooks.fp16_compress_hook), ("bf16", default_hooks.bf16_compress_hook),
                       ("allreduce", default_hooks.allreduce_hook)):
        model = DDP(mlp(), bucket_cap_mb=0.001)  # several buckets in flight
        model.register_comm_hook(None, hook)
        losses = _train(model)
        out[name] = {"losses": torch.stack(losses), "params": [p.detach().clone() for p in model.parameters()]}
    saved["ddp_hooks"] = out
    return {}


def f_join():
    from torch.distributed.algorithms.join import Join
    from torch.nn.parallel import DistributedDataParallel as DDP

    model = DDP(mlp())
    opt = torch.optim.SGD(model.parameters(), lr=0.1)
    n = 3 + rank  # uneven inputs: rank r has 3 + r batches
    with Join([model]):
        for step in range(n):
            x, y = batch(step, rank)
            opt.zero_grad()
            nn.functional.cross_entropy(model(x), y).backward()
            opt.step()
    saved["join"] = {"params": [p.detach().clone() for p in model.parameters()]}
    return {}


def f_split():
    evens, odds = list(range(0, world, 2)), list(range(1, world, 2))
    splits = [evens, odds] if odds else [evens]
    sub = dist.split_group(split_ranks=splits)
    mine = evens if rank % 2 == 0 else odds
    assert sub is not None and sub != dist.GroupMember.NON_GROUP_MEMBER, "not a member of my split"
    x = torch.full((5,), float(rank + 1))
    dist.all_reduce(x, group=sub)
    want = float(sum(r + 1 for r in mine))
    assert torch.equal(x, torch.full((5,), want)), x
    saved["split"] = {"sum": x.clone()}
    return {"split_name": sub.group_name, "split_ranks": dist.get_process_group_ranks(sub),
            "split_size": sub.size()}


def f_split_leaves_out():
    # The last rank is in no split. gloo: it gets NON_GROUP_MEMBER. cohort:
    # a ValueError saying why (torch 2.15 crashes on a Python backend's
    # "not a member" answer); the members' group works either way.
    members = list(range(world - 1))
    try:
        sub = dist.split_group(split_ranks=[members])
    except ValueError as e:
        return {"member": None, "error": str(e)}
    out = {"member": sub is not None and sub != dist.GroupMember.NON_GROUP_MEMBER}
    if out["member"]:
        x = torch.ones(3) * (rank + 1)
        dist.all_reduce(x, group=sub)
        out["sum"] = x.tolist()
    return out


# ---------------------------------------------------------------------------
# the other scenarios
# ---------------------------------------------------------------------------


def f_mesh2d():
    from torch.distributed.device_mesh import init_device_mesh
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor

    mesh = init_device_mesh("cpu", (2, world // 2), mesh_dim_names=("dp", "tp"))
    torch.manual_seed(11)
    big = torch.randn(8, 6)
    d = distribute_tensor(big, mesh, [Shard(0), Shard(1)])
    local = d.to_local().clone()
    r1 = d.redistribute(mesh, [Replicate(), Shard(1)])
    r2 = d.redistribute(mesh, [Shard(1), Replicate()])
    full = d.full_tensor()
    assert torch.equal(full, big), "full_tensor differs from the distributed tensor"
    y = (d @ distribute_tensor(torch.eye(6), mesh, [Replicate(), Replicate()])).full_tensor()
    saved["mesh2d"] = {"local": local, "r1": r1.to_local().clone(), "r2": r2.to_local().clone(),
                       "full": full.clone(), "matmul": y.clone(),
                       "dp_sum": torch.tensor([float(dist.get_rank(mesh.get_group("dp")))])}
    return {"dp": mesh.get_group("dp").group_name, "tp": mesh.get_group("tp").group_name,
            "dp_ranks": dist.get_process_group_ranks(mesh.get_group("dp")),
            "tp_ranks": dist.get_process_group_ranks(mesh.get_group("tp"))}


def f_device_id():
    pg = dist.group.WORLD
    assert pg.bound_device_id == torch.device("cpu", 0), pg.bound_device_id
    x = torch.full((3,), float(rank))
    dist.all_reduce(x)
    dist.barrier()
    saved["device_id"] = {"sum": x.clone()}
    return {"bound": str(pg.bound_device_id)}


def f_device_id_subgroup():
    # With a bound device, torch asks the default group's backend to split
    # (members) or to do a no-colour split (the others): gloo in torch
    # 2.15 has no perform_nocolor_split, so this part fails there.
    members = [0, world - 1]
    sub = dist.new_group(members)
    y = torch.full((2,), float(rank + 1))
    if rank in members:
        dist.all_reduce(y, group=sub)
    dist.barrier()
    saved["device_id_subgroup"] = {"sub": y.clone()}
    return {}


def f_monitored():
    if rank == 1:
        time.sleep(4.0)  # never enters; stays alive while the others wait
        return {"skipped": True}
    zero: dict = {}
    if backend == "cohort":
        # timeout 0: no wait (as gloo), not the group's 30 minutes
        t0 = time.monotonic()
        try:
            dist.monitored_barrier(timeout=datetime.timedelta(0))
            zero = {"zero_raised": None}
        except Exception as e:
            zero = {"zero_raised": type(e).__name__, "zero_after_s": time.monotonic() - t0}
    t0 = time.monotonic()
    try:
        dist.monitored_barrier(timeout=datetime.timedelta(seconds=1), wait_all_ranks=True)
    except Exception as e:
        return {"raised": type(e).__name__, "msg": str(e)[:2000], "after_s": time.monotonic() - t0,
                "mro": [c.__name__ for c in type(e).__mro__], "missing": getattr(e, "missing_ranks", None), **zero}
    return {"raised": None, "after_s": time.monotonic() - t0, **zero}


def f_timeout():
    x = torch.ones(4)
    dist.all_reduce(x)
    assert torch.equal(x, torch.full((4,), float(world))), x
    late = world - 1
    if rank == late:
        time.sleep(3.0)
    t0 = time.monotonic()
    try:
        dist.all_reduce(torch.ones(4))
    except Exception as e:
        return {"raised": type(e).__name__, "msg": str(e)[:1500], "after_s": time.monotonic() - t0,
                "mro": [c.__name__ for c in type(e).__mro__], "late": rank == late}
    return {"raised": None, "after_s": time.monotonic() - t0, "late": rank == late}


def main() -> None:
    init: dict = {}
    if scenario == "device_id":
        init["device_id"] = torch.device("cpu", 0)
    if scenario == "timeout":
        # The store waits long (ranks start seconds apart on a loaded
        # machine); the group's collectives get 1 s.
        host, port = os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"])
        store = dist.TCPStore(host, port, world, rank == 0, timeout=datetime.timedelta(seconds=120))
        init.update(store=store, rank=rank, world_size=world, timeout=datetime.timedelta(seconds=1))
    dist.init_process_group(backend, **init)
    t_start = time.monotonic()
    features = {
        "train": [("identity", f_identity), ("fsdp2", f_fsdp2), ("funcol", f_funcol), ("mesh1d", f_mesh1d),
                  ("dcp", f_dcp), ("powersgd", f_powersgd), ("split", f_split), ("fsdp1", f_fsdp1),
                  ("zero", f_zero), ("ddp_hooks", f_ddp_hooks), ("join", f_join),
                  ("split_leaves_out", f_split_leaves_out)],
        "mesh2d": [("identity", f_identity), ("mesh2d", f_mesh2d)],
        "device_id": [("device_id", f_device_id), ("device_id_subgroup", f_device_id_subgroup)],
        "monitored": [("monitored", f_monitored)],
        "timeout": [("timeout", f_timeout)],
    }[scenario]
    for name, fn in features:
        run(name, fn)
    torch.save(saved, os.path.join(outdir, f"rank{rank}.pt"))
    if scenario in ("monitored", "timeout"):
        # The group is of no further use (a rank missed a collective):
        # leave without a final collective, once every rank had its
        # outcome (the late rank's 3-4 s), so that none sees another's
        # exit instead.
        time.sleep(max(0.0, t_start + 5.0 - time.monotonic()))
        print(json.dumps({"done": True, "rank": rank}), flush=True)
        os._exit(0)
    dist.destroy_process_group()
    print(json.dumps({"done": True, "rank": rank}), flush=True)


main()
