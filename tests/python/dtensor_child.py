"""One rank of the DTensor tests (PyTorch 2.x, gloo on CPU), started by test_torch.py with
RANK / WORLD_SIZE and cairn's settings in the environment.

    dtensor_child.py save --mesh DPxTP --init FILE   builds the state below on a 2-D mesh
        (dp, tp), saves it as step 1 and flushes it to the PFS
    dtensor_child.py load --mesh DPxTP --init FILE   builds the same state with zeros on
        its own mesh (another world size or shape), restores, and checks every value

The state: a tensor-parallel MLP (ColwiseParallel / RowwiseParallel on the tp dimension)
and DTensors of every placement pattern on the 2-D mesh, uneven splits included. Exits 0
when every restored DTensor's full value equals what was saved, bit for bit."""

import argparse
import os
import sys

import torch
import torch.distributed as dist

try:
    from torch.distributed.tensor import Replicate, Shard, distribute_tensor
except ImportError:  # torch < 2.4
    from torch.distributed._tensor import Replicate, Shard, distribute_tensor
from torch.distributed.device_mesh import init_device_mesh
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    RowwiseParallel,
    parallelize_module,
)

import cairn.torch

# name -> (global shape, placements on the (dp, tp) mesh)
TENSORS = {
    "rows_cols": ((12, 10), lambda: [Shard(0), Shard(1)]),
    "uneven_rows": ((9, 7), lambda: [Replicate(), Shard(0)]),  # 9 rows over tp
    "cols_over_dp": ((6, 11), lambda: [Shard(1), Replicate()]),
    "replicated": ((5, 5), lambda: [Replicate(), Replicate()]),
    "one_dim_twice": ((4, 24), lambda: [Shard(1), Shard(1)]),
    "vector": ((13,), lambda: [Shard(0), Replicate()]),
}


def value(name, shape):
    g = torch.Generator().manual_seed(sum(map(ord, name)))
    return torch.randn(shape, generator=g)


def mlp():
    return torch.nn.Sequential(torch.nn.Linear(16, 32), torch.nn.ReLU(), torch.nn.Linear(32, 16))


def main():
    p = argparse.ArgumentParser()
    p.add_argument("mode", choices=["save", "load"])
    p.add_argument("--mesh", required=True, help="DPxTP, e.g. 2x2")
    p.add_argument("--init", required=True, help="file rendezvous of torch.distributed")
    a = p.parse_args()
    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    dp, tp = (int(x) for x in a.mesh.split("x"))
    assert dp * tp == world, f"mesh {a.mesh} needs {dp * tp} processes, not {world}"
    dist.init_process_group("gloo", init_method="file://" + a.init, rank=rank, world_size=world)
    mesh = init_device_mesh("cpu", (dp, tp), mesh_dim_names=("dp", "tp"))

    torch.manual_seed(0)
    reference = mlp()
    model = mlp()
    if a.mode == "load":
        for q in model.parameters():
            torch.nn.init.zeros_(q)
    else:
        model.load_state_dict(reference.state_dict())
    parallelize_module(model, mesh["tp"], {"0": ColwiseParallel(), "2": RowwiseParallel()})
    tensors = {}
    for name, (shape, placements) in TENSORS.items():
        full = value(name, shape) if a.mode == "save" else torch.zeros(shape)
        tensors[name] = distribute_tensor(full, mesh, placements())

    ck = cairn.torch.Checkpointer(model, None, tensors=tensors)
    if a.mode == "save":
        assert ck.save(1), "step 1 was skipped"
        ck.fence_host()
        flushed = ck.flush()
        assert flushed == 1, f"flushed {flushed}"
        print(f"rank {rank}: saved and flushed step 1", flush=True)
    else:
        got = ck.restore()
        assert got == 1, f"restored {got}"
        bad = []
        for name, (shape, _) in TENSORS.items():
            if not torch.equal(tensors[name].full_tensor(), value(name, shape)):
                bad.append(name)
        want = reference.state_dict()
        for k, v in model.state_dict().items():
            full = v.full_tensor() if hasattr(v, "full_tensor") else v
            if not torch.equal(full, want[k]):
                bad.append("model." + k)
        if bad:
            print(f"rank {rank}: wrong values in {bad}", flush=True)
            return 1
        r = ck.last_report
        print(f"rank {rank}: restored step {got} from {r.tier}, resharded {r.resharded}", flush=True)
    ck.close()
    dist.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
