"""One rank of the PyTorch tests: trains TinyLM with AdamW, a cairn checkpoint every step
(unless --no-cairn), resuming from the newest version. Settings come from CAIRN_* and
RANK / WORLD_SIZE. Appends "<step> <loss as float.hex> <newest replicated step>" per step
to --out (flushed), and prints "restored <step> tier <tier> extra <step in the user dict>"
and, on a GPU, "slots pinned <n> refused <n> engine <copy engine>" at the end."""

import argparse
import os
import sys

import torch

import cairn.torch
from tiny_lm import TinyLM, batch, loss_of


def main():
    p = argparse.ArgumentParser()
    p.add_argument("--steps", type=int, required=True)
    p.add_argument("--out", required=True)
    p.add_argument("--no-cairn", action="store_true")
    p.add_argument("--ddp-init", help="file:// rendezvous of torch.distributed (gloo)")
    p.add_argument("--device", default="cpu", help="cpu, or cuda: model and batches there")
    p.add_argument("--dtype", default="float32", help="the model's dtype (bfloat16 on GPUs)")
    a = p.parse_args()
    torch.set_num_threads(1)
    if a.device != "cpu":
        # Bit-exact replays on a GPU: deterministic kernels (cuBLAS needs its workspace
        # fixed before it starts).
        os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
        torch.use_deterministic_algorithms(True, warn_only=True)
        torch.backends.cudnn.benchmark = False
    torch.manual_seed(0)
    rank = int(os.environ.get("RANK", "0"))
    world = int(os.environ.get("WORLD_SIZE", "1"))
    model = TinyLM().to(a.device, getattr(torch, a.dtype))
    if a.ddp_init:
        torch.distributed.init_process_group(
            "gloo", init_method="file://" + a.ddp_init, rank=rank, world_size=world
        )
        model = torch.nn.parallel.DistributedDataParallel(model)
    opt = torch.optim.AdamW(model.parameters(), lr=3e-3, weight_decay=0.01)
    ck = None if a.no_cairn else cairn.torch.Checkpointer(model, opt)
    start = 0
    if ck is not None:
        got = ck.restore()
        if got is not None:
            start = got
            print(f"restored {got} tier {ck.last_report.tier} extra {ck.extra['step']}", flush=True)
    with open(a.out, "a") as out:
        for step in range(start + 1, a.steps + 1):
            x, y = (t.to(a.device) for t in batch(step, rank))
            loss = loss_of(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()  # cairn's hook fences first
            repl = -1
            if ck is not None:
                ck.save(step, extra={"step": step})
                repl = ck.stats().newest_replicated_step
            out.write(f"{step} {loss.item().hex()} {repl}\n")
            out.flush()
    if ck is not None:
        if a.device != "cpu":
            st = ck.stats()
            print(f"slots pinned {st.slots_pinned} refused {st.slots_not_pinned} "
                  f"engine {st.copy_engine}", flush=True)
        ck.close()
    if a.ddp_init:
        torch.distributed.destroy_process_group()
    return 0


if __name__ == "__main__":
    sys.exit(main())
