"""One rank of the point-to-point comparison (test_p2p.py, test_pipelining.py): cohort against gloo.

    p2p.py BACKEND SCENARIO OUTDIR

Runs torch's point-to-point APIs on the given backend ("cohort" or
"gloo"), deterministically (the same seeds on every backend), and saves
what each produced to OUTDIR/rank<r>.pt for the test to compare across
backends. Prints one JSON line per feature: {"feature", "ok", "why",
"rank", ...}, and {"done": true} at the end.

Scenarios:

- ``p2p``: blocking send/recv around a ring in several dtypes and shapes
  (empty too), isend/irecv both ways at once with tags that pass each
  other, a receive from any rank (recv(src=None)), batch_isend_irecv (a
  ring in both directions, the order of a batch not mattering),
  send_object_list/recv_object_list, all_to_all_single with uneven splits
  (blocking and asynchronous); and two that gloo refuses, checked against
  the known values only: a non-contiguous tensor, all_to_all with a list
  of tensors of different sizes;
- ``gpipe`` / ``1f1b``: torch.distributed.pipelining on CPU, one stage per
  rank of an MLP, two optimizer steps of 4 microbatches with the GPipe or
  the 1F1B schedule: the last stage's losses, every stage's gradients and
  parameters;
- ``peer_dies`` (cohort only): rank 1 is SIGKILLed while the others wait
  in a recv from it; they report the error they got and how long after.
"""

from __future__ import annotations

import json
import os
import time

import torch
import torch.distributed as dist
from torch import nn

import cohort.torch  # noqa: F401
from compared import backend, outdir, rank, run, saved, scenario, world


def msg(frm: int, to: int, n: int, shape=(3, 5), dtype=torch.float32) -> torch.Tensor:
    """Message n from rank frm to rank to: a function of the three."""
    g = torch.Generator().manual_seed(10000 * n + 100 * frm + to)
    t = torch.randn(shape, generator=g) * 100
    if dtype.is_floating_point:
        return t.to(dtype)
    if dtype == torch.bool:
        return t > 0
    return t.to(torch.int64).to(dtype)


RIGHT, LEFT = (rank + 1) % world, (rank - 1) % world

# ---------------------------------------------------------------------------
# p2p
# ---------------------------------------------------------------------------


def f_send_recv():
    """Blocking send/recv around the ring: even ranks send first."""
    out = {}
    cases = [("f32", (3, 5), torch.float32), ("f64", (7,), torch.float64), ("i64", (2, 2, 2), torch.int64),
             ("bf16", (9,), torch.bfloat16), ("u8", (1000,), torch.uint8), ("bool", (13,), torch.bool),
             ("empty", (0, 4), torch.float32), ("big", (1 << 20,), torch.float32)]
    for n, (name, shape, dtype) in enumerate(cases):
        got = torch.empty(shape, dtype=dtype)
        if rank % 2 == 0:
            dist.send(msg(rank, RIGHT, n, shape, dtype), dst=RIGHT)
            dist.recv(got, src=LEFT)
        else:
            dist.recv(got, src=LEFT)
            dist.send(msg(rank, RIGHT, n, shape, dtype), dst=RIGHT)
        assert torch.equal(got, msg(LEFT, rank, n, shape, dtype)), name
        out[name] = got
    saved["send_recv"] = out


def f_noncontig():
    """A non-contiguous tensor sent and received (gloo refuses: "input tensor has to be contiguous")."""
    src = msg(rank, RIGHT, 50, (6, 4)).t()
    got = torch.empty(6, 4).t()
    reqs = [dist.isend(src, dst=RIGHT), dist.irecv(got, src=LEFT)]
    for r in reqs:
        r.wait()
    assert torch.equal(got, msg(LEFT, rank, 50, (6, 4)).t())
    saved["noncontig"] = got.clone()


def f_isend_irecv():
    """Both directions at once, several messages in flight, tags that pass each other."""
    outs = {}
    reqs, got = [], {}
    for tag in (3, 1, 2):
        for d, peer in (("r", RIGHT), ("l", LEFT)):
            t = torch.empty(64, 64)
            got[(tag, d)] = t
            reqs.append(dist.irecv(t, src=peer, tag=tag))
    # Sends in another tag order than the receives were posted in.
    for tag in (2, 3, 1):
        reqs.append(dist.isend(msg(rank, RIGHT, 100 + tag, (64, 64)), dst=RIGHT, tag=tag))
        reqs.append(dist.isend(msg(rank, LEFT, 200 + tag, (64, 64)), dst=LEFT, tag=tag))
    for r in reqs:
        r.wait()
    for tag in (1, 2, 3):
        if world > 2:
            assert torch.equal(got[(tag, "l")], msg(LEFT, rank, 100 + tag, (64, 64))), tag
            assert torch.equal(got[(tag, "r")], msg(RIGHT, rank, 200 + tag, (64, 64))), tag
        outs[tag] = torch.stack([got[(tag, "l")], got[(tag, "r")]])
    saved["isend_irecv"] = outs


def f_any_source():
    """Rank 0 receives from whichever rank sends (recv(src=None), irecv's source)."""
    out = {}
    if rank == 0:
        seen = {}
        for _ in range(world - 1):
            t = torch.empty(10)
            src = dist.recv(t, tag=7)
            seen[src] = t
        assert sorted(seen) == list(range(1, world)), sorted(seen)
        for s, t in seen.items():
            assert torch.equal(t, msg(s, 0, 300, (10,))), s
        out["by_source"] = [seen[s] for s in sorted(seen)]
    else:
        dist.send(msg(rank, 0, 300, (10,)), dst=0, tag=7)
    saved["any_source"] = out


def f_batch():
    """batch_isend_irecv: a ring in both directions, the receives listed first."""
    outs = []
    for k in range(3):
        a, b = torch.empty(1000), torch.empty(1000)
        ops = [dist.P2POp(dist.irecv, a, LEFT), dist.P2POp(dist.irecv, b, RIGHT, tag=1),
               dist.P2POp(dist.isend, msg(rank, RIGHT, 400 + k, (1000,)), RIGHT),
               dist.P2POp(dist.isend, msg(rank, LEFT, 500 + k, (1000,)), LEFT, tag=1)]
        if k == 1:
            ops.reverse()
        for w in dist.batch_isend_irecv(ops):
            w.wait()
        assert torch.equal(a, msg(LEFT, rank, 400 + k, (1000,))), k
        assert torch.equal(b, msg(RIGHT, rank, 500 + k, (1000,))), k
        outs.append(torch.stack([a, b]))
    saved["batch"] = outs


def f_objects():
    """send_object_list / recv_object_list around the ring."""
    objs = [None, None]
    if rank % 2 == 0:
        dist.send_object_list([{"from": rank, "x": list(range(rank + 3))}, "hi" * rank], dst=RIGHT)
        dist.recv_object_list(objs, src=LEFT)
    else:
        dist.recv_object_list(objs, src=LEFT)
        dist.send_object_list([{"from": rank, "x": list(range(rank + 3))}, "hi" * rank], dst=RIGHT)
    assert objs == [{"from": LEFT, "x": list(range(LEFT + 3))}, "hi" * LEFT], objs
    saved["objects"] = objs


def splits(r: int, j: int, step: int) -> int:
    """Rows rank r sends rank j: uneven, some zero."""
    return (r * 7 + j * 3 + step) % 5


def f_all_to_all_uneven():
    """all_to_all_single with uneven split sizes, blocking and asynchronous."""
    out = {}
    for step in range(3):
        ins = [splits(rank, j, step) for j in range(world)]
        outs = [splits(i, rank, step) for i in range(world)]
        src = torch.cat([msg(rank, j, 600 + step, (ins[j], 3)) for j in range(world)])
        want = torch.cat([msg(i, rank, 600 + step, (outs[i], 3)) for i in range(world)])
        dst = torch.empty(sum(outs), 3)
        dist.all_to_all_single(dst, src, output_split_sizes=outs, input_split_sizes=ins)
        assert torch.equal(dst, want), step
        out[f"single{step}"] = dst
        dst2 = torch.empty(sum(outs), 3)
        dist.all_to_all_single(dst2, src, output_split_sizes=outs, input_split_sizes=ins, async_op=True).wait()
        assert torch.equal(dst2, want), step
        out[f"async{step}"] = dst2
    saved["all_to_all_uneven"] = out


def f_all_to_all_list_uneven():
    """all_to_all with a list of tensors of different sizes (gloo refuses: "invalid tensor size")."""
    out = {}
    for step in range(3):
        ins = [splits(rank, j, step) + 1 for j in range(world)]
        outs = [splits(i, rank, step) + 1 for i in range(world)]
        tin = [msg(rank, j, 700 + step, (ins[j],)) for j in range(world)]
        tout = [torch.empty(outs[i]) for i in range(world)]
        dist.all_to_all(tout, tin)
        for i in range(world):
            assert torch.equal(tout[i], msg(i, rank, 700 + step, (outs[i],))), (step, i)
        out[f"list{step}"] = tout
    saved["all_to_all_list_uneven"] = out


# ---------------------------------------------------------------------------
# pipelining
# ---------------------------------------------------------------------------

DIM, BATCH, MICRO, STEPS = 16, 8, 4, 2


def stage_module(i: int) -> nn.Module:
    torch.manual_seed(100 + i)
    if i == world - 1:
        return nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh(), nn.Linear(DIM, 4))
    return nn.Sequential(nn.Linear(DIM, DIM), nn.Tanh())


def f_pipeline(kind: str):
    from torch.distributed.pipelining import PipelineStage, Schedule1F1B, ScheduleGPipe

    mod = stage_module(rank)
    stage = PipelineStage(mod, rank, world, torch.device("cpu"))
    sched_cls = ScheduleGPipe if kind == "gpipe" else Schedule1F1B
    loss_fn = nn.MSELoss()
    sched = sched_cls(stage, n_microbatches=MICRO, loss_fn=loss_fn)
    opt = torch.optim.SGD(mod.parameters(), lr=0.1)
    losses_all, grads = [], []
    for step in range(STEPS):
        g = torch.Generator().manual_seed(step)
        x = torch.randn(BATCH, DIM, generator=g)
        y = torch.randn(BATCH, 4, generator=g)
        opt.zero_grad()
        losses: list = []
        if rank == 0:
            sched.step(x)
        elif rank == world - 1:
            sched.step(target=y, losses=losses)
        else:
            sched.step()
        grads.append([p.grad.detach().clone() for p in mod.parameters()])
        opt.step()
        losses_all.append([loss.detach().clone() for loss in losses])
    saved[kind] = {"losses": losses_all, "grads": grads,
                   "params": [p.detach().clone() for p in mod.parameters()]}
    return {"losses": [[float(v) for v in ls] for ls in losses_all]}


def f_peer_dies():
    """Rank 1 is SIGKILLed while the others wait in a recv from it: they raise, naming it."""
    import signal

    from cohort.torch import CohortBackendError

    t = torch.zeros(4)
    if rank == 1:
        for p in range(world):
            if p != 1:
                dist.send(torch.ones(4), dst=p)
        time.sleep(0.5)  # the others are in their second recv by now
        os.kill(os.getpid(), signal.SIGKILL)
    dist.recv(t, src=1)
    t0 = time.monotonic()
    try:
        dist.recv(t, src=1)
    except CohortBackendError as e:
        return {"raised": type(e).__name__, "text": str(e), "status": int(e.status),
                "after_s": time.monotonic() - t0, "sticky": _sticky()}
    raise AssertionError("the recv from a dead rank returned")


def _sticky() -> str:
    try:
        dist.all_reduce(torch.zeros(1))
    except Exception as e:
        return f"{type(e).__name__}: {e}"
    return "no error"


SCENARIOS = {
    "p2p": [("send_recv", f_send_recv), ("isend_irecv", f_isend_irecv), ("any_source", f_any_source),
            ("batch", f_batch), ("objects", f_objects), ("all_to_all_uneven", f_all_to_all_uneven),
            ("noncontig", f_noncontig), ("all_to_all_list_uneven", f_all_to_all_list_uneven)],
    "gpipe": [("gpipe", lambda: f_pipeline("gpipe"))],
    "1f1b": [("1f1b", lambda: f_pipeline("1f1b"))],
    "peer_dies": [("peer_dies", f_peer_dies)],
}


def main() -> None:
    dist.init_process_group(backend)
    if scenario == "peer_dies":  # no barrier, no teardown: the job is broken
        run("peer_dies", f_peer_dies)
        print(json.dumps({"done": True, "rank": rank}), flush=True)
        os._exit(0)
    for name, fn in SCENARIOS[scenario]:
        run(name, fn)
        dist.barrier()
    torch.save(saved, os.path.join(outdir, f"rank{rank}.pt"))
    dist.barrier()
    dist.destroy_process_group()
    print(json.dumps({"done": True, "rank": rank}), flush=True)


if __name__ == "__main__":
    main()
