"""The FSDP2 test's processes (test_torch.FSDP2Training), started with RANK / WORLD_SIZE and
cairn's settings in the environment.

    fsdp2_child.py train --init FILE --steps N --out FILE [--device cuda] [--no-fsdp]
                         [--no-cairn] [--step-sleep S] [--final REF]
        one process: TPLM (tiny_lm.py) wrapped in FSDP2's fully_shard on a 1-rank device
        mesh (every block, then the root: parameters and AdamW's moments are DTensors
        Shard(0) over one rank), deterministic kernels, a cairn.torch save every step after
        restoring the newest version; appends "<step> <loss as float.hex()>" per step to
        --out. --final: at the end, flushes the newest version to cairn's PFS tier and
        writes every parameter and optimizer tensor in full, on the CPU, to REF
        (torch.save of plain tensors). --no-fsdp: the same model unwrapped (the flow on a
        PyTorch whose FSDP2 needs a GPU).
    fsdp2_child.py load --init FILE --ref REF
        on the CPU: one process fills a plain TPLM and AdamW; WORLD_SIZE > 1 processes a
        tensor-parallel one (gloo, parallelize_tp); restored by cairn.torch from the PFS,
        every tensor and the hyperparameters must equal REF bit for bit.
"""

import argparse
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.device_mesh import init_device_mesh

import cairn.torch
from tiny_lm import TPLM, batch, loss_of, parallelize_tp

LR = 3e-3


def fully_shard_fn():
    try:
        from torch.distributed.fsdp import fully_shard  # PyTorch >= 2.6
    except ImportError:
        from torch.distributed._composable.fsdp import fully_shard
    return fully_shard


def full_state(model, opt):
    """{DCP's flattened name: full value on the CPU} of the model's and optimizer's state."""

    def full(v):
        if hasattr(v, "full_tensor"):
            v = v.full_tensor()
        return v.detach().cpu().clone() if torch.is_tensor(v) else v

    msd, osd = get_state_dict(model, opt)
    out = {"model." + k: full(v) for k, v in msd.items()}
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            out[f"optim.state.{fqn}.{k}"] = full(v)
    for i, g in enumerate(osd["param_groups"]):
        for k, v in g.items():
            out[f"optim.param_groups.{i}.{k}"] = v
    return out


def train(a):
    dev = torch.device(a.device)
    if dev.type == "cuda":
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
        torch.cuda.set_device(0)
    torch.manual_seed(0)
    model = TPLM().to(dev)
    if not a.no_fsdp:
        backend = "nccl" if dev.type == "cuda" else "gloo"
        dist.init_process_group(backend, init_method="file://" + a.init, rank=0, world_size=1)
        mesh = init_device_mesh(dev.type, (1,))
        fully_shard = fully_shard_fn()
        for block in (*model.ups, *model.downs):
            fully_shard(block, mesh=mesh)
        fully_shard(model, mesh=mesh)
        kind = type(model.ups[0].weight).__name__
        assert kind == "DTensor", f"fully_shard left the parameters as {kind}"
    opt = torch.optim.AdamW(model.parameters(), lr=LR, weight_decay=0.01)
    ck = None if a.no_cairn else cairn.torch.Checkpointer(model, opt)
    start = (ck.restore() or 0) if ck else 0
    if ck is not None and start:
        print(f"restored {start} from {ck.last_report.tier}", flush=True)
    with open(a.out, "a") as out:
        for step in range(start + 1, a.steps + 1):
            x, y = (t.to(dev) for t in batch(step))
            loss = loss_of(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()  # cairn's hook fences first
            if ck is not None:
                assert ck.save(step), f"step {step} was skipped"
            out.write(f"{step} {loss.item().hex()}\n")
            out.flush()
            time.sleep(a.step_sleep)
    if a.final:
        ck.fence_host()
        flushed = ck.flush()
        assert flushed == a.steps, f"flushed {flushed}, not {a.steps}"
        torch.save(full_state(model, opt), a.final)
        st = ck.stats()
        print(f"flushed step {flushed}; engine {st.copy_engine} slots pinned {st.slots_pinned} "
              f"refused {st.slots_not_pinned}", flush=True)
    if ck is not None:
        ck.close()
    if dist.is_initialized():
        dist.destroy_process_group()
    return 0


def load(a):
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    torch.manual_seed(1)  # other initial values than the saved ones
    model = TPLM()
    if world > 1:
        dist.init_process_group("gloo", init_method="file://" + a.init, rank=rank,
                                world_size=world)
        model = parallelize_tp(model, init_device_mesh("cpu", (world,)))
    opt = torch.optim.AdamW(model.parameters(), lr=1.0, weight_decay=0.5)  # restored too
    ck = cairn.torch.Checkpointer(model, opt)
    got = ck.restore()
    tier = ck.last_report.tier
    ck.close()
    want = torch.load(a.ref, weights_only=True)
    have = full_state(model, opt)
    bad = sorted(set(have) ^ set(want))
    for k, v in want.items():
        if k in have:
            same = torch.equal(have[k], v) if torch.is_tensor(v) else have[k] == v
            if not same or (torch.is_tensor(v) and have[k].dtype != v.dtype):
                bad.append(k)
    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()
    if bad:
        print(f"rank {rank}: restored step {got} from {tier}; mismatches: {bad}", flush=True)
        return 1
    print(f"rank {rank}: restored step {got} from {tier}; equal to the saved state in all "
          f"{len(want)} entries", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "load"])
    p.add_argument("--init", required=True, help="file rendezvous of torch.distributed")
    p.add_argument("--steps", type=int, default=60)
    p.add_argument("--out")
    p.add_argument("--device", default="cuda")
    p.add_argument("--no-fsdp", action="store_true")
    p.add_argument("--no-cairn", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--final", help="train: where to write the full state of the last step")
    p.add_argument("--ref", help="load: the full state to compare with")
    a = p.parse_args()
    faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where it waits
    torch.set_num_threads(1)
    return train(a) if a.mode == "train" else load(a)


if __name__ == "__main__":
    sys.exit(main())
