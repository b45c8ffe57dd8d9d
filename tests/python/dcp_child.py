"""One rank of the DCP tests (test_torch.py's DCPTraining; PyTorch >= 2.9, gloo on CPU), with
RANK / WORLD_SIZE and cairn's settings in the environment. The state is what a pipeline
trainer checkpoints: two model parts (tensor parallel over the mesh's tp dimension, as
DTensors), each with its optimizer (AdamW, SGD with momentum), an LR scheduler, a data
loader whose state differs per rank, the RNG state and the loop's own counters.

    dcp_child.py train --mesh DPxTP --init FILE --steps N --out FILE [--no-cairn]
                       [--dump DIR --dump-at S] [--flush] [--step-sleep S]
        resumes with dcp.load through cairn.dcp.StorageReader (when the job holds a
        version), then trains, saving every step with dcp.async_save through
        cairn.dcp.StorageWriter as writer and stager; appends "<step> <loss as float.hex()>
        <newest replicated step>" per step to --out with "-<rank>" added, prints "restored
        <step> from <tier>". --dump: at step --dump-at, writes what the version holds, in
        full, to DIR/rank-<r>.pt. --flush: at the end, persists the newest version to the
        PFS (collective).
    dcp_child.py check --mesh DPxTP --init FILE --dump DIR --step S [--model-only]
        fills a fresh state (other values) with dcp.load through cairn's reader, and checks
        that every entry equals DIR/rank-<r>.pt (this rank's, or rank 0's for a rank the
        saved job did not have): "equal <n> entries from <tier>".
    dcp_child.py buffer --init FILE [--no-copy-now]
        saves 5 steps of a model whose 8 MiB buffer is overwritten right after every
        dcp.async_save (before staging completes), then checks that each version held in
        memory has the buffer's value at its save: "buffer held at save in <n> versions".
"""

import argparse
import faulthandler
import os
import sys
import time

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint._nested_dict import flatten_state_dict
from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
from torch.distributed.checkpoint.stateful import Stateful
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import cairn.dcp

DIM, HIDDEN, BATCH = 16, 48, 8


class Stage(torch.nn.Module):
    def __init__(self, dim_out):
        super().__init__()
        self.up = torch.nn.Linear(DIM, HIDDEN)
        self.down = torch.nn.Linear(HIDDEN, dim_out)

    def forward(self, x):
        return self.down(torch.relu(self.up(x)))


PLAN = {"up": ColwiseParallel(), "down": RowwiseParallel()}


class Part(Stateful):
    """A model part and its optimizer, as get_state_dict names them."""

    def __init__(self, model, opt):
        self.model, self.opt = model, opt

    def state_dict(self):
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def load_state_dict(self, sd):
        set_state_dict(self.model, self.opt, model_state_dict=sd["model"],
                       optim_state_dict=sd["optim"])


class ModelOnly(Stateful):
    """A part's model without its optimizer (a model-only load)."""

    def __init__(self, model):
        self.model = model

    def state_dict(self):
        return {"model": get_state_dict(self.model, [])[0]}

    def load_state_dict(self, sd):
        set_state_dict(self.model, [], model_state_dict=sd["model"], optim_state_dict={})


class Loader(Stateful):
    """A data loader's position: differs per rank (its seed and what it saw)."""

    def __init__(self, rank):
        self.rank, self.pos, self.seen = rank, 0, []

    def batch(self, step, dp_rank):
        self.pos += 1
        self.seen = (self.seen + [f"{self.rank}:{step}"])[-3:]
        g = torch.Generator().manual_seed(1000 * step + dp_rank)
        x = torch.randn(BATCH, DIM, generator=g)
        return x, torch.sin(x.flip(1))

    def state_dict(self):
        return {"rank": self.rank, "pos": self.pos, "seen": list(self.seen),
                "seed": 7000 + self.rank}

    def load_state_dict(self, sd):
        self.pos, self.seen = sd["pos"], list(sd["seen"])


class Rng(Stateful):
    def state_dict(self):
        return {"torch": torch.get_rng_state()}

    def load_state_dict(self, sd):
        torch.set_rng_state(sd["torch"])


def build(mesh, seed, rank):
    torch.manual_seed(seed)
    m0 = parallelize_module(Stage(DIM), mesh["tp"], PLAN)
    m1 = parallelize_module(Stage(DIM), mesh["tp"], PLAN)
    o0 = torch.optim.AdamW(m0.parameters(), lr=1e-2, weight_decay=0.1)
    o1 = torch.optim.SGD(m1.parameters(), lr=5e-3, momentum=0.9)
    sched = torch.optim.lr_scheduler.StepLR(o0, step_size=7, gamma=0.5)
    torch.manual_seed(0)  # the RNG the loop draws from: the same on every rank
    state = {"stage0": Part(m0, o0), "stage1": Part(m1, o1), "sched": sched,
             "loader": Loader(rank), "rng": Rng(), "progress": {"step": 0, "tokens": 0}}
    return state, (m0, m1), (o0, o1)


def train_step(state, models, opts, mesh, step):
    x, y = state["loader"].batch(step, mesh["dp"].get_local_rank())
    x = x + 0.01 * torch.randn_like(x)  # the RNG's part: restored with the state
    loss = torch.nn.functional.mse_loss(models[1](models[0](x)), y)
    for o in opts:
        o.zero_grad()
    loss.backward()
    return loss


def full(v):
    return v.full_tensor() if hasattr(v, "full_tensor") else (
        v.clone() if torch.is_tensor(v) else v)


def resolved(state):
    """{flattened name: full value} of what a save of `state` holds (collective: full_tensor)."""
    plain = {k: (v.state_dict() if isinstance(v, Stateful) else v) for k, v in state.items()}
    flat, _ = flatten_state_dict(plain)
    return {k: full(v) for k, v in flat.items()}


def train(a, mesh, rank):
    state, models, opts = build(mesh, seed=0, rank=rank)
    writer = None if a.no_cairn else cairn.dcp.StorageWriter()
    start = 0
    if writer is not None and cairn.dcp.newest_step() is not None:
        reader = cairn.dcp.StorageReader()
        dcp.load(state, storage_reader=reader)
        r = reader.report()
        start = r["step"]
        assert state["progress"]["step"] == start, state["progress"]
        print(f"restored {start} from {r['tier']}", flush=True)
    saving = None
    # The upload's collectives run on a thread of their own: a group of their own keeps
    # them apart from training's (DCP's rule for async_save, as torchtitan does).
    pg = dist.new_group(backend="gloo")
    with open(f"{a.out}-{rank}", "a") as out:
        for step in range(start + 1, a.steps + 1):
            loss = train_step(state, models, opts, mesh, step)
            if saving is not None:
                saving.staging_completion.result()  # the fence: the tensors may change now
            for o in opts:
                o.step()
            state["sched"].step()
            state["progress"] = {"step": step, "tokens": state["progress"]["tokens"] + BATCH}
            if writer is not None:
                if saving is not None:
                    saving.upload_completion.result()  # DCP's rule: one save in flight
                saving = dcp.async_save(state, checkpoint_id=f"step-{step}",
                                        storage_writer=writer, async_stager=writer,
                                        process_group=pg)
            if a.dump and step == a.dump_at:
                os.makedirs(a.dump, exist_ok=True)
                torch.save(resolved(state), os.path.join(a.dump, f"rank-{rank}.pt"))
            repl = -1
            if writer is not None:
                repl = writer.checkpointer.stats().newest_replicated_step
            out.write(f"{step} {loss.item().hex()} {repl}\n")
            out.flush()
            time.sleep(a.step_sleep)
    if saving is not None:
        saving.upload_completion.result()
    if a.flush:
        flushed = writer.checkpointer.flush()
        assert flushed == a.steps, f"flushed {flushed}, not {a.steps}"
        print(f"rank {rank}: flushed step {flushed}", flush=True)
    return 0


def check(a, mesh, rank):
    state, models, opts = build(mesh, seed=99, rank=rank)
    want = torch.load(os.path.join(a.dump, f"rank-{rank}.pt" if os.path.exists(
        os.path.join(a.dump, f"rank-{rank}.pt")) else "rank-0.pt"), weights_only=False)
    if a.model_only:
        state = {"stage0": ModelOnly(models[0])}
        want = {k: v for k, v in want.items() if k.startswith("stage0.model.")}
    reader = cairn.dcp.StorageReader()
    dcp.load(state, checkpoint_id=f"step-{a.step}", storage_reader=reader)
    r = reader.report()
    have = resolved(state)
    bad = []
    if set(have) != set(want):
        bad.append(f"names differ: {sorted(set(have) ^ set(want))}")
    for k, v in want.items():
        if k in have and not (torch.equal(have[k], v) if torch.is_tensor(v) else have[k] == v):
            bad.append(k)
    if a.model_only:  # the rest kept its fresh values: the second part was not loaded
        untouched = get_state_dict(models[1], [])[0]
        fresh, _, _ = build(mesh, seed=99, rank=rank)
        if not all(torch.equal(full(v), full(fresh["stage1"].model.state_dict()[k]))
                   for k, v in untouched.items()):
            bad.append("stage1 changed by a model-only load of stage0")
    if bad or r["step"] != a.step:
        print(f"rank {rank}: step {r['step']} from {r['tier']}: mismatches {bad}", flush=True)
        return 1
    print(f"rank {rank}: equal {len(want)} entries from {r['tier']} at step {r['step']}",
          flush=True)
    return 0


def buffer(a, rank):
    torch.manual_seed(rank)
    model = torch.nn.Linear(4, 4)
    model.register_buffer("big", torch.zeros(2 << 20))  # 8 MiB: read in place unless named
    writer = cairn.dcp.StorageWriter(copy_now=[] if a.no_copy_now else [model])
    state = {"model": model}
    saving = None
    for step in range(1, 6):
        model.big.fill_(step)
        if saving is not None:
            saving.upload_completion.result()
        saving = dcp.async_save(state, checkpoint_id=f"step-{step}", storage_writer=writer,
                                async_stager=writer)
        model.big.fill_(-step)  # as a forward pass would, before the fence
        saving.staging_completion.result()
    saving.upload_completion.result()
    ck = writer.checkpointer
    held = sorted(v.step for v in ck.versions())
    wrong = []
    for step in held:
        _, sd = ck.load_new(step=step, keys="model.big")
        got = sd["model"]["big"]
        if not torch.all(got == step):
            wrong.append(f"step {step} holds {got[0].item()}")
    if wrong or not held:
        print(f"rank {rank}: {wrong or 'no version held'}", flush=True)
        return 1
    print(f"rank {rank}: buffer held at save in {len(held)} versions", flush=True)
    return 0


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["train", "check", "buffer"])
    p.add_argument("--mesh", default="1x1", help="DPxTP, e.g. 1x2")
    p.add_argument("--init", required=True, help="file rendezvous of torch.distributed")
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--out")
    p.add_argument("--no-cairn", action="store_true")
    p.add_argument("--dump")
    p.add_argument("--dump-at", type=int, default=-1)
    p.add_argument("--step", type=int)
    p.add_argument("--flush", action="store_true")
    p.add_argument("--model-only", action="store_true")
    p.add_argument("--no-copy-now", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    a = p.parse_args()
    faulthandler.dump_traceback_later(240, exit=True)  # a hang shows where each rank waits
    torch.set_num_threads(1)
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dist.init_process_group("gloo", init_method="file://" + a.init, rank=rank, world_size=world)
    if a.mode == "buffer":
        rc = buffer(a, rank)
    else:
        dp, tp = (int(x) for x in a.mesh.split("x"))
        assert dp * tp == world, f"mesh {a.mesh} needs {dp * tp} processes, not {world}"
        mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))
        rc = train(a, mesh, rank) if a.mode == "train" else check(a, mesh, rank)
    cairn.dcp.close()
    dist.barrier()
    dist.destroy_process_group()
    return rc


if __name__ == "__main__":
    sys.exit(main())
