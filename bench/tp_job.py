"""What the PyTorch benchmarks share (bench/torch_compare.py, torch_resume.py,
torch_goodput.py): a consistent copy of a state dict, as DCP stages GPU state, and one rank
of the 2-way tensor-parallel job (TPLM of tests/python/tiny_lm.py, gloo, AdamW)."""

import torch


def staged_copy(v):
    """A copy of a (nested) state dict that training no longer changes; a DTensor stays a
    DTensor of its layout, its local part cloned."""
    if isinstance(v, dict):
        return {k: staged_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [staged_copy(x) for x in v]
    if hasattr(v, "to_local"):  # DTensor
        from torch.distributed.tensor import DTensor

        return DTensor.from_local(v.to_local().clone(), v.device_mesh, v.placements,
                                  run_check=False, shape=v.shape, stride=v.stride())
    if torch.is_tensor(v):
        return v.detach().clone()
    return v


def tp_rank(a, rank, world):
    """This process's rank of the job: the process group (gloo, file rendezvous `a.init`),
    TPLM of `a`'s sizes split over a `world`-way CPU mesh, and AdamW. PyTorch 2.x."""
    import torch.distributed as dist
    from torch.distributed.device_mesh import init_device_mesh

    from tiny_lm import TPLM, parallelize_tp

    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method="file://" + a.init, rank=rank, world_size=world)
    model = parallelize_tp(TPLM(vocab=a.vocab, dim=a.dim, layers=a.layers, seq=a.seq),
                           init_device_mesh("cpu", (world,)))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-3)
