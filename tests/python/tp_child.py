"""One rank of the tensor-parallel training tests (PyTorch 2.x, gloo on CPU), started by
test_torch.py with RANK / WORLD_SIZE and cairn's settings in the environment.

    tp_child.py train --mesh DPxTP --init FILE --steps N --out FILE [--no-cairn]
                      [--step-sleep S] [--final DCP_DIR]
        trains TPNet (Colwise/Rowwise linear layers on the tp dimension, gradients averaged
        over dp) with AdamW, saving every step with cairn.torch after restoring the newest
        version, and appends "<step> <loss as float.hex()>" per step to --out (rank 0).
        --final: at the end, flushes the newest version to cairn's PFS tier and saves the
        same state with torch.distributed.checkpoint (DCP) into DCP_DIR.
    tp_child.py load --mesh DPxTP --init FILE --dcp DCP_DIR --job-dir PFS_JOB_DIR
        on another mesh and world size, fills three fresh models and optimizers: with
        cairn.torch's restore (from the PFS), with dcp.load through cairn.dcp.StorageReader
        and with dcp.load of DCP's own save; checks that every parameter, every optimizer
        tensor and the hyperparameters agree bit for bit, and that one more training step
        gives the same loss from each.
"""

import argparse
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import cairn.dcp
import cairn.torch

DIM, HIDDEN, BATCH = 16, 48, 8  # HIDDEN splits evenly over 2, 3 and 4


class TPNet(torch.nn.Module):
    def __init__(self):
        super().__init__()
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, DIM)
        self.up2 = torch.nn.Linear(DIM, HIDDEN)
        self.down2 = torch.nn.Linear(HIDDEN, DIM)

    def forward(self, x):
        x = x + self.down(torch.relu(self.up(x)))
        return x + self.down2(torch.relu(self.up2(x)))


PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel(),
        "up2": ColwiseParallel(), "down2": RowwiseParallel()}


def build(mesh, seed):
    torch.manual_seed(seed)
    model = parallelize_module(TPNet(), mesh["tp"], PLAN)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-2, weight_decay=0.1)
    return model, opt


def train_step(model, opt, mesh, step):
    """One step on the batch of (step, dp rank); returns the loss averaged over dp."""
    dp_rank, dp = mesh["dp"].get_local_rank(), mesh["dp"].size()
    g = torch.Generator().manual_seed(1000 * step + dp_rank)
    x = torch.randn(BATCH, DIM, generator=g)
    y = torch.sin(x.flip(1)) + 0.1 * torch.randn(BATCH, DIM, generator=g)
    loss = torch.nn.functional.mse_loss(model(x), y)
    opt.zero_grad()
    loss.backward()
    avg = loss.detach().clone()
    if dp > 1:
        group = mesh["dp"].get_group()
        for p in model.parameters():
            grad = p.grad.to_local() if hasattr(p.grad, "to_local") else p.grad
            dist.all_reduce(grad, group=group)
            grad.div_(dp)
        dist.all_reduce(avg, group=group)
        avg.div_(dp)
    opt.step()
    return avg.item()


def full_state(model, opt):
    """{flattened name: full value} of the model's and optimizer's state (DCP's names)."""
    msd, osd = get_state_dict(model, opt)
    out = {}
    for k, v in msd.items():
        out["model." + k] = v.full_tensor() if hasattr(v, "full_tensor") else v
    for fqn, st in osd["state"].items():
        for k, v in st.items():
            out[f"optim.state.{fqn}.{k}"] = v.full_tensor() if hasattr(v, "full_tensor") else v
    out["optim.param_groups"] = osd["param_groups"]
    return out


def train(a, mesh, rank):
    model, opt = build(mesh, seed=0)
    ck = None if a.no_cairn else cairn.torch.Checkpointer(model, opt)
    start = (ck.restore() or 0) if ck else 0
    if ck is not None and start:
        r = ck.last_report
        print(f"restored {start} from {r.tier}", flush=True)
    out = open(a.out, "a") if rank == 0 else None
    for step in range(start + 1, a.steps + 1):
        loss = train_step(model, opt, mesh, step)
        if ck is not None:
            assert ck.save(step), f"step {step} was skipped"
        if out:
            out.write(f"{step} {loss.hex()}\n")
            out.flush()
        time.sleep(a.step_sleep)
    if a.final:
        ck.fence_host()
        flushed = ck.flush()
        assert flushed == a.steps, f"flushed {flushed}, not {a.steps}"
        msd, osd = get_state_dict(model, opt)
        dcp.save({"model": msd, "optim": osd}, checkpoint_id=a.final)
        print(f"rank {rank}: flushed step {flushed} and saved it with DCP", flush=True)
    if ck is not None:
        ck.close()


def dcp_load(mesh, seed, reader):
    model, opt = build(mesh, seed)
    msd, osd = get_state_dict(model, opt)
    state = {"model": msd, "optim": osd}
    dcp.load(state, storage_reader=reader)
    set_state_dict(model, opt, model_state_dict=state["model"], optim_state_dict=state["optim"])
    return model, opt


def load(a, mesh, rank):
    via_cairn = build(mesh, seed=1)
    ck = cairn.torch.Checkpointer(*via_cairn)
    got = ck.restore()
    tier = ck.last_report.tier
    ck.close()
    via_reader = dcp_load(mesh, 2, cairn.dcp.StorageReader(a.job_dir))
    via_dcp = dcp_load(mesh, 3, dcp.FileSystemReader(a.dcp))
    want = full_state(*via_dcp)
    bad = []
    for label, (model, opt) in (("cairn.torch", via_cairn), ("cairn.dcp", via_reader)):
        have = full_state(model, opt)
        if set(have) != set(want):
            bad.append(f"{label}: names differ: {sorted(set(have) ^ set(want))}")
            continue
        for k, v in want.items():
            same = torch.equal(have[k], v) if torch.is_tensor(v) else have[k] == v
            if not same:
                bad.append(f"{label}: {k}")
    # One more step from each: the same loss, bit for bit.
    losses = {label: train_step(m, o, mesh, 10_000).hex() for label, (m, o) in
              (("dcp", via_dcp), ("cairn.torch", via_cairn), ("cairn.dcp", via_reader))}
    if len(set(losses.values())) != 1:
        bad.append(f"losses of the next step differ: {losses}")
    if bad:
        print(f"rank {rank}: restored step {got} from {tier}; mismatches: {bad}", flush=True)
        return 1
    print(f"rank {rank}: restored step {got} from {tier}; cairn.torch, cairn.dcp and DCP agree "
          f"on {len(want)} entries", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "load"])
    p.add_argument("--mesh", required=True, help="DPxTP, e.g. 2x2")
    p.add_argument("--init", required=True, help="file rendezvous of torch.distributed")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out")
    p.add_argument("--no-cairn", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--final", help="DCP directory to save the last step into (after a flush)")
    p.add_argument("--dcp", help="load: DCP's own save of the step")
    p.add_argument("--job-dir", help="load: <pfs_root>/<job id> of the cairn job")
    a = p.parse_args()
    faulthandler.dump_traceback_later(200, exit=True)  # a hang shows where each rank waits
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dp, tp = (int(x) for x in a.mesh.split("x"))
    assert dp * tp == world, f"mesh {a.mesh} needs {dp * tp} processes, not {world}"
    dist.init_process_group("gloo", init_method="file://" + a.init, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
    rc = train(a, mesh, rank) if a.mode == "train" else load(a, mesh, rank)
    # Tear gloo down together: a rank that destroyed its process groups while another was
    # still finishing its part of the last (sub-group) collective left that one waiting in
    # destroy_process_group forever (seen twice: rank 1 of a load, after its checks passed).
    dist.barrier()
    dist.destroy_process_group()
    return rc or 0


if __name__ == "__main__":
    sys.exit(main())
