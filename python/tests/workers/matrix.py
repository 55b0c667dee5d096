"""One rank of the backend matrix: every collective x dtype x mode, checked here.

Each rank builds its inputs from (case, rank) deterministically, so it can
compute every rank's inputs, and so the expected output, by itself. Prints
one JSON line per case: {"case": ..., "ok": bool, "why": str}.
"""

import itertools
import json
import os
import sys
import traceback
import zlib

import torch
import torch.distributed as dist

import cohort.torch  # noqa: F401

rank = int(os.environ["RANK"])
world = int(os.environ["WORLD_SIZE"])
torch.set_num_threads(1)
dist.init_process_group("cohort")

DTYPES = {
    "f32": torch.float32,
    "f64": torch.float64,
    "f16": torch.float16,
    "bf16": torch.bfloat16,
    "i32": torch.int32,
    "i64": torch.int64,
    "u8": torch.uint8,
}
OPS = {
    "sum": dist.ReduceOp.SUM,
    "avg": dist.ReduceOp.AVG,
    "min": dist.ReduceOp.MIN,
    "max": dist.ReduceOp.MAX,
    "prod": dist.ReduceOp.PRODUCT,
}
N = 37  # odd: not a multiple of the world size, vector widths or pages


def inp(case: str, r: int, dt: torch.dtype, n: int = N) -> torch.Tensor:
    """Small integers (exact in every dtype, products within range)."""
    g = torch.Generator().manual_seed(zlib.crc32(f"{case}/{r}".encode()))
    v = torch.randint(1, 4, (n,), generator=g)
    return v.to(dt)


def ref_reduce(case: str, dt: torch.dtype, op: str, n: int = N) -> torch.Tensor:
    xs = torch.stack([inp(case, r, torch.float64, n) for r in range(world)])
    if op == "sum":
        out = xs.sum(0)
    elif op == "avg":
        out = xs.sum(0) / world
        if not dt.is_floating_point:
            out = torch.trunc(out)
    elif op == "min":
        out = xs.min(0).values
    elif op == "max":
        out = xs.max(0).values
    else:
        out = xs.prod(0)
    if dt == torch.uint8:
        out = out.remainder(256)
    return out


def close(got: torch.Tensor, want: torch.Tensor, dt: torch.dtype) -> bool:
    tol = {torch.float16: 1e-2, torch.bfloat16: 2e-2}.get(dt, 1e-6)
    return torch.allclose(got.double(), want.double(), rtol=tol, atol=tol)


def report(case: str, ok: bool, why: str = "") -> None:
    print(json.dumps({"case": case, "ok": bool(ok), "why": why, "rank": rank}), flush=True)


def run(case: str, fn) -> None:
    try:
        ok, why = fn()
    except Exception:
        ok, why = False, traceback.format_exc()
    report(case, ok, why)


def finish(work, async_op: bool) -> None:
    if async_op:
        work.wait()


def t_future():
    """An asynchronous all-reduce's future, as DDP's reducer uses it: its
    value is the reduced tensor (in a group of one it is complete when
    returned, elsewhere the completer completes it)."""
    case = "all_reduce/future"
    x = inp(case, rank, torch.float32)
    work = dist.all_reduce(x, async_op=True)
    got = work.get_future().wait()
    want = ref_reduce(case, torch.float32, "sum")
    ok = close(got[0], want, torch.float32) and close(x, want, torch.float32)
    return ok, f"got {got[0].tolist()[:6]} want {want.tolist()[:6]}"


run("all_reduce/future", t_future)

for (dn, dt), (on, op) in itertools.product(DTYPES.items(), OPS.items()):
    for async_op in (False, True):
        case = f"all_reduce/{dn}/{on}/{'async' if async_op else 'sync'}"

        def t_allreduce(case=case, dt=dt, on=on, op=op, async_op=async_op):
            x = inp(case, rank, dt)
            finish(dist.all_reduce(x, op=op, async_op=async_op), async_op)
            want = ref_reduce(case, dt, on)
            return close(x, want, dt), f"got {x.tolist()[:6]} want {want.tolist()[:6]}"

        run(case, t_allreduce)

    case = f"reduce/{dn}/{on}"

    def t_reduce(case=case, dt=dt, on=on, op=op):
        root = world - 1
        x = inp(case, rank, dt)
        dist.reduce(x, dst=root, op=op)
        if rank != root:
            return True, ""
        want = ref_reduce(case, dt, on)
        return close(x, want, dt), f"got {x.tolist()[:6]} want {want.tolist()[:6]}"

    run(case, t_reduce)

    case = f"reduce_scatter_tensor/{dn}/{on}"

    def t_rs(case=case, dt=dt, on=on, op=op):
        k = 5
        x = inp(case, rank, dt, k * world)
        out = torch.empty(k, dtype=dt)
        dist.reduce_scatter_tensor(out, x, op=op)
        want = ref_reduce(case, dt, on, k * world)[rank * k : (rank + 1) * k]
        return close(out, want, dt), f"got {out.tolist()} want {want.tolist()}"

    run(case, t_rs)

for dn, dt in DTYPES.items():
    for async_op in (False, True):
        mode = "async" if async_op else "sync"
        case = f"broadcast/{dn}/{mode}"

        def t_bcast(case=case, dt=dt, async_op=async_op):
            root = 1 % world
            x = inp(case, rank, dt)
            finish(dist.broadcast(x, src=root, async_op=async_op), async_op)
            want = inp(case, root, dt)
            return torch.equal(x, want), ""

        run(case, t_bcast)

        case = f"all_gather/{dn}/{mode}"

        def t_ag(case=case, dt=dt, async_op=async_op):
            outs = [torch.zeros(N, dtype=dt) for _ in range(world)]
            finish(dist.all_gather(outs, inp(case, rank, dt), async_op=async_op), async_op)
            return all(torch.equal(outs[r], inp(case, r, dt)) for r in range(world)), ""

        run(case, t_ag)

        case = f"all_gather_into_tensor/{dn}/{mode}"

        def t_agt(case=case, dt=dt, async_op=async_op):
            out = torch.zeros(world * N, dtype=dt)
            finish(dist.all_gather_into_tensor(out, inp(case, rank, dt), async_op=async_op), async_op)
            want = torch.cat([inp(case, r, dt) for r in range(world)])
            return torch.equal(out, want), ""

        run(case, t_agt)

        case = f"reduce_scatter/{dn}/{mode}"

        def t_rsl(case=case, dt=dt, async_op=async_op):
            ins = [inp(f"{case}/{j}", rank, dt) for j in range(world)]
            out = torch.zeros(N, dtype=dt)
            finish(dist.reduce_scatter(out, ins, async_op=async_op), async_op)
            xs = sum(inp(f"{case}/{rank}", r, torch.float64) for r in range(world))
            if dt == torch.uint8:
                xs = xs.remainder(256)
            return close(out, xs, dt), ""

        run(case, t_rsl)

    case = f"all_to_all_single/{dn}"

    def t_a2a(case=case, dt=dt):
        k = 3
        x = torch.arange(world * k, dtype=torch.int64).add(100 * rank).to(dt)
        out = torch.zeros(world * k, dtype=dt)
        dist.all_to_all_single(out, x)
        want = torch.cat([torch.arange(rank * k, rank * k + k).add(100 * r) for r in range(world)]).to(dt)
        return torch.equal(out, want), f"got {out.tolist()} want {want.tolist()}"

    if dt != torch.uint8 or world * 100 < 256:
        run(case, t_a2a)

    case = f"all_to_all_uneven/{dn}"

    def t_a2av(case=case, dt=dt):
        # rank r sends (r + j + 1) elements to rank j, valued 10*r + j.
        ins = [torch.full((rank + j + 1,), 10 * rank + j, dtype=torch.int64).to(dt) for j in range(world)]
        outs = [torch.zeros(r + rank + 1, dtype=dt) for r in range(world)]
        dist.all_to_all(outs, ins)
        ok = all(torch.equal(outs[r], torch.full((r + rank + 1,), 10 * r + rank, dtype=torch.int64).to(dt))
                 for r in range(world))
        return ok, f"got {[o.tolist() for o in outs]}"

    run(case, t_a2av)

    case = f"gather/{dn}"

    def t_gather(case=case, dt=dt):
        root = 0
        outs = [torch.zeros(N, dtype=dt) for _ in range(world)] if rank == root else None
        dist.gather(inp(case, rank, dt), outs, dst=root)
        if rank != root:
            return True, ""
        return all(torch.equal(outs[r], inp(case, r, dt)) for r in range(world)), ""

    run(case, t_gather)

    case = f"scatter/{dn}"

    def t_scatter(case=case, dt=dt):
        root = world - 1
        ins = [inp(f"{case}/{j}", root, dt) for j in range(world)] if rank == root else None
        out = torch.zeros(N, dtype=dt)
        dist.scatter(out, ins, src=root)
        return torch.equal(out, inp(f"{case}/{rank}", root, dt)), ""

    run(case, t_scatter)

# Non-contiguous tensors, uneven all_gather, objects, bool, barrier.
def t_noncontig():
    base = inp("nc", rank, torch.float32, 2 * N).view(2, N)
    x = base.t()  # not contiguous
    dist.all_reduce(x)
    want = ref_reduce("nc", torch.float32, "sum", 2 * N).view(2, N).t()
    return close(x, want, torch.float32), ""


run("all_reduce/noncontiguous", t_noncontig)


def t_uneven_ag():
    outs = [torch.zeros(r + 1) for r in range(world)]
    dist.all_gather(outs, torch.full((rank + 1,), float(rank)))
    return all(torch.equal(outs[r], torch.full((r + 1,), float(r))) for r in range(world)), ""


run("all_gather/uneven", t_uneven_ag)


def t_objects():
    objs = [None] * world
    dist.all_gather_object(objs, {"rank": rank, "s": "x" * rank})
    lst = [{"from": "root", "n": 3}] if rank == 0 else [None]
    dist.broadcast_object_list(lst, src=0)
    return objs == [{"rank": r, "s": "x" * r} for r in range(world)] and lst[0] == {"from": "root", "n": 3}, ""


run("objects", t_objects)


def t_bool():
    x = torch.tensor([rank == 0, True, False])
    dist.all_reduce(x)  # SUM on bool is "or"
    return x.tolist() == [True, True, False], str(x.tolist())


run("all_reduce/bool", t_bool)


def t_coalesced():
    xs = [inp(f"co{j}", rank, torch.float32, j + 1) for j in range(4)]
    dist.all_reduce_coalesced(xs)
    return all(close(xs[j], ref_reduce(f"co{j}", torch.float32, "sum", j + 1), torch.float32) for j in range(4)), ""


run("all_reduce_coalesced", t_coalesced)


def t_moved_dtypes():
    """Collectives that only move data take dtypes libcohort has no arithmetic
    for (moved as bytes): int8, int16, complex64."""
    bad = []
    for dt in (torch.int8, torch.int16, torch.complex64):
        def val(r: int, n: int = N) -> torch.Tensor:
            return (inp(f"mv/{dt}", r, torch.float32, n) * (r + 1)).to(dt)

        x = val(rank) if rank == 0 else torch.zeros(N, dtype=dt)
        dist.broadcast(x, 0)
        if not torch.equal(x, val(0)):
            bad.append(f"broadcast {dt}")
        outs = [torch.zeros(N, dtype=dt) for _ in range(world)]
        dist.all_gather(outs, val(rank))
        if not all(torch.equal(outs[r], val(r)) for r in range(world)):
            bad.append(f"all_gather {dt}")
        send = torch.cat([val(rank, 3) + j for j in range(world)])
        recv = torch.zeros(3 * world, dtype=dt)
        dist.all_to_all_single(recv, send)
        if not torch.equal(recv, torch.cat([val(r, 3) + rank for r in range(world)])):
            bad.append(f"all_to_all_single {dt}")
    try:
        dist.all_reduce(torch.ones(3, dtype=torch.int8))
        bad.append("all_reduce int8 did not raise")
    except TypeError as e:
        if "int8" not in str(e):
            bad.append(f"all_reduce int8: {e}")
    return not bad, "; ".join(bad)


run("moved_dtypes", t_moved_dtypes)


def t_gather_coalesced():
    """all_gather_coalesced: output_lists[r][j] is rank r's input j (c10d's layout)."""
    ins = [inp(f"agc{j}", rank, torch.float32, j + 2) for j in range(3)]
    outs = [[torch.zeros(j + 2) for j in range(3)] for _ in range(world)]
    dist.all_gather_coalesced(outs, ins)
    ok = all(torch.equal(outs[r][j], inp(f"agc{j}", r, torch.float32, j + 2)) for r in range(world) for j in range(3))
    return ok, str([[o.tolist() for o in row] for row in outs])[:300]


run("all_gather_coalesced", t_gather_coalesced)


def t_barrier():
    dist.barrier()
    return True, ""


run("barrier", t_barrier)


def t_subgroup():
    if world < 2:
        return True, ""
    members = list(range(0, world, 2))
    g = dist.new_group(members, backend="cohort")
    if rank not in members:
        return True, ""
    x = torch.full((4,), float(rank))
    dist.all_reduce(x, group=g)
    return torch.equal(x, torch.full((4,), float(sum(members)))), str(x.tolist())


run("new_group", t_subgroup)


def t_send():
    # Point-to-point around the ring (test_p2p.py has the rest).
    got = torch.zeros(3)
    works = [dist.isend(torch.full((3,), float(rank)), dst=(rank + 1) % world),
             dist.irecv(got, src=(rank - 1) % world)]
    for w in works:
        w.wait()
    return torch.equal(got, torch.full((3,), float((rank - 1) % world))), str(got.tolist())


if world > 1:
    run("send_recv", t_send)

dist.destroy_process_group()
print(json.dumps({"done": True, "rank": rank}), flush=True)
