"""bench/torch_compare.py: a PyTorch training loop checkpointing every iteration, with
torch.save + fsync (what most training scripts do) against cairn.torch, on the same model
and state in one run.

    PYTHONPATH=build/python:tests/python /usr/bin/python3 bench/torch_compare.py \
        [--dim 256] [--layers 2] [--vocab 32768] [--seq 16] [--batch 1] [--rounds 3]
        [--iters 4] [--dir /var/tmp] [--threads 2]

Each round runs --iters iterations without checkpoints, with torch.save({model, optimizer})
+ fsync after every optimizer step, and with cairn (save() after every step, fence() by the
optimizer hook; every 10th version drained to --dir in the background), rotating which
goes first. Stall: the time the training loop spends in checkpointing (torch.save + fsync;
cairn's save() plus the fence wait). Physical references in the same run: memcpy of the
state and a raw write + fsync of it. Last line: one JSON object with iter_ms_no_ckpt,
stall_ms_torch_save, stall_ms_cairn and cairn_vs_torch_save (medians).
"""

import argparse
import json
import os
import shutil
import statistics
import sys
import tempfile
import time

import torch

import cairn.torch
from tiny_lm import TinyLM, batch, loss_of


def state_tensors(model, opt):
    ts = list(model.state_dict().values())
    for st in opt.state_dict()["state"].values():
        ts += [v for v in st.values() if torch.is_tensor(v)]
    return ts


def raw_write(path, tensors):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for t in tensors:
            f.write(t.numpy().tobytes() if t.dim() else t.reshape(1).numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.unlink(path)
    return dt


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--threads", type=int, default=2)
    p.add_argument("--dir", default="/var/tmp")
    a = p.parse_args()
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    work = tempfile.mkdtemp(prefix="cairn-bench-torch-", dir=a.dir)
    host = tempfile.mkdtemp(prefix="cairn-bench-torch-", dir="/dev/shm")
    try:
        model = TinyLM(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=8, seq=a.seq, dropout=0.0)
        opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
        step = 0

        def train():
            nonlocal step
            step += 1
            x, y = batch(step, 0, a.batch, a.seq, a.vocab)
            loss = loss_of(model, x, y)
            opt.zero_grad()
            loss.backward()
            opt.step()

        train()  # the optimizer's state exists from here on
        tensors = state_tensors(model, opt)
        state_bytes = sum(t.numel() * t.element_size() for t in tensors)

        # Physical references: memcpy of the state, raw write + fsync of it.
        dst = [torch.empty_like(t) for t in tensors]
        memcpy_s = []
        for _ in range(3):
            t0 = time.perf_counter()
            for d, t in zip(dst, tensors):
                d.copy_(t)
            memcpy_s.append(time.perf_counter() - t0)
        del dst
        raw_s = [raw_write(os.path.join(work, "raw.bin"), tensors)]

        ck = cairn.torch.Checkpointer(
            model, opt, job_id=f"torch-compare-{os.getpid()}", host_root=host,
            pfs_root=os.path.join(work, "pfs"), rank=0, world_size=1, node=0, slots=3,
            persist_every=10, slot_bytes=state_bytes + (8 << 20))
        # The hook fences inside optimizer.step(); its wait is in the stats.
        fence_total = lambda: ck.stats().fence_wait_total_s

        none_ms, torch_iter_ms, cairn_iter_ms = [], [], []
        torch_stall, cairn_stall = [], []
        arms = ["none", "torch", "cairn"]
        for r in range(a.rounds + 1):  # round 0 warms up (the first cairn save sizes slots)
            for arm in arms[r % 3:] + arms[: r % 3]:
                for _ in range(a.iters):
                    f0 = fence_total()
                    t0 = time.perf_counter()
                    train()
                    t1 = time.perf_counter()
                    if arm == "torch":
                        path = os.path.join(work, "ckpt.pt")
                        with open(path, "wb") as f:
                            torch.save({"model": model.state_dict(), "optim": opt.state_dict()}, f)
                            f.flush()
                            os.fsync(f.fileno())
                        stall = time.perf_counter() - t1
                    elif arm == "cairn":
                        ck.save(step)
                        stall = time.perf_counter() - t1 + (fence_total() - f0)
                    else:
                        stall = 0.0
                    total = (time.perf_counter() - t0) * 1e3
                    if r == 0:
                        continue
                    if arm == "none":
                        none_ms.append(total)
                    elif arm == "torch":
                        torch_iter_ms.append(total)
                        torch_stall.append(stall * 1e3)
                    else:
                        cairn_iter_ms.append(total)
                        cairn_stall.append(stall * 1e3)
            raw_s.append(raw_write(os.path.join(work, "raw.bin"), tensors))
        ck.fence()
        st = ck.stats()
        ck.close()
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(host, ignore_errors=True)

    med = statistics.median
    gb = state_bytes / 1e9
    result = {
        "bench": "torch_compare",
        "torch": torch.__version__,
        "params": sum(p.numel() for p in model.parameters()),
        "state_bytes": state_bytes,
        "iters": a.rounds * a.iters,
        "memcpy_gbps": round(gb / med(memcpy_s), 3),
        "raw_write_fsync_gbps": round(gb / med(raw_s), 3),
        "iter_ms_no_ckpt": round(med(none_ms), 2),
        "iter_ms_torch_save": round(med(torch_iter_ms), 2),
        "iter_ms_cairn": round(med(cairn_iter_ms), 2),
        "stall_ms_torch_save": round(med(torch_stall), 2),
        "stall_ms_cairn": round(med(cairn_stall), 4),
        "cairn_vs_torch_save": round(med(torch_stall) / med(cairn_stall), 1),
        "cairn_skipped": st.skipped,
        "cairn_captured": st.captured,
    }
    print(
        f"state {gb:.2f} GB ({result['params'] / 1e6:.1f} M parameters + AdamW moments); "
        f"iteration {result['iter_ms_no_ckpt']:.0f} ms without checkpoints\n"
        f"stall per iteration: torch.save + fsync {result['stall_ms_torch_save']:.1f} ms, "
        f"cairn {result['stall_ms_cairn']:.3f} ms ({result['cairn_vs_torch_save']:.0f}x less)\n"
        f"references: memcpy {result['memcpy_gbps']:.2f} GB/s, raw write + fsync "
        f"{result['raw_write_fsync_gbps']:.2f} GB/s"
    )
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
