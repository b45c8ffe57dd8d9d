"""bench/gpu_capture.py: cairn's device-to-host capture on one GPU against the link's own
speed, and a training-like loop checkpointing every iteration, in one run.

    PYTHONPATH=build/python python3 bench/gpu_capture.py [--bytes 8G] [--tensors 16]
        [--chunk 4M] [--rounds 3] [--iters 5] [--host-root /dev/shm/cairn-bench]
        [--dir /var/tmp] [--no-dcp]

State: --tensors bf16 tensors of --bytes in all, on the current CUDA device.
References, same bytes, same chunking (--chunk, cairn's CAIRN_CHUNK_BYTES): one
cudaMemcpyAsync per chunk into pinned host memory on a side stream (raw_d2h_gbps), and
into pageable memory (pageable_d2h_gbps). cairn: save() on the training stream until the
version is CAPTURED (every byte landed, checksummed and published; capture_gbps).
The loop: "forward/backward" (bf16 matmuls on the training stream, calibrated to about
1.5x the copy time; they do not touch the state), then the "optimizer step" (an in-place
update of every state tensor), then the checkpoint, and a host synchronisation per
iteration (as loss.item() does). Arms, alternated in rounds: no checkpoint, a blocking
copy to pinned memory, torch.distributed.checkpoint.async_save (PyTorch >= 2, one
process, gloo; waits for the previous save before the next, as its docs ask), and cairn
(fence() before the optimizer step, save() after it). stall: host time the loop spends in
checkpoint calls. The last line is one JSON object; without a CUDA device it says so.
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


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def chunked_copy(dst, src, chunk, stream):
    """One cudaMemcpyAsync per chunk (flat uint8 views), on `stream`."""
    with torch.cuda.stream(stream):
        for off in range(0, src.numel(), chunk):
            dst[off : off + chunk].copy_(src[off : off + chunk], non_blocking=True)


def timed(fn):
    torch.cuda.synchronize()
    t0 = time.perf_counter()
    fn()
    torch.cuda.synchronize()
    return time.perf_counter() - t0


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    p.add_argument("--bytes", default="8G")
    p.add_argument("--tensors", type=int, default=16)
    p.add_argument("--chunk", default="4M")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--iters", type=int, default=5)
    p.add_argument("--host-root", default=os.environ.get("CAIRN_HOST_ROOT", "/dev/shm/cairn-bench"))
    p.add_argument("--dir", default="/var/tmp", help="where DCP and cairn's PFS write")
    p.add_argument("--no-dcp", action="store_true")
    a = p.parse_args()

    if not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_capture", "skipped": "no CUDA device"}))
        return 0
    import cairn.torch  # after the device check: the message above needs no build

    dev = torch.device("cuda", torch.cuda.current_device())
    total, chunk = parse_bytes(a.bytes), parse_bytes(a.chunk)
    per = (total // a.tensors) // 2 * 2
    state = [torch.randn(per // 2, device=dev).to(torch.bfloat16) for _ in range(a.tensors)]
    nbytes = sum(t.numel() * t.element_size() for t in state)
    flat = [t.view(torch.uint8) for t in state]
    side = torch.cuda.Stream()

    # References: the link's speed for the same bytes and chunks.
    pinned = [torch.empty(f.numel(), dtype=torch.uint8, pin_memory=True) for f in flat]
    pageable = [torch.empty(f.numel(), dtype=torch.uint8) for f in flat]
    for h in pageable:
        h.fill_(0)  # first touch outside the timing

    def raw(dsts):
        side.wait_stream(torch.cuda.current_stream())  # after what wrote the state
        for d, s in zip(dsts, flat):
            chunked_copy(d, s, chunk, side)

    raw(pinned)  # warm up
    work = tempfile.mkdtemp(prefix="gpu_capture.", dir=a.dir)
    host_root = os.path.join(a.host_root, os.path.basename(work))
    model = torch.nn.Module()
    model.state = torch.nn.ParameterList(torch.nn.Parameter(t, requires_grad=False) for t in state)
    ck = cairn.torch.Checkpointer(
        model,
        job_id="gpu-capture-" + str(os.getpid()),
        host_root=host_root,
        pfs_root=os.path.join(work, "pfs"),
        chunk_bytes=chunk,
        copy_threads=max(4, min(8, (os.cpu_count() or 4) // 2)),
        persist_every=0,
        slots=2,
        full_policy="block",
        slot_bytes=nbytes + (64 << 20),
    )
    step = [0]

    def capture():
        step[0] += 1
        ck.save(step[0])
        ck.wait_captured()

    capture()  # maps and registers the slots
    capture()
    raw_s, page_s, cap_s = [], [], []
    for _ in range(a.rounds):
        raw_s.append(timed(lambda: raw(pinned)))
        cap_s.append(timed(capture))
        page_s.append(timed(lambda: raw(pageable)))
    raw_gbps = nbytes / statistics.median(raw_s) / 1e9
    cap_gbps = nbytes / statistics.median(cap_s) / 1e9
    page_gbps = nbytes / statistics.median(page_s) / 1e9
    pageable.clear()  # its memory back before the loop

    # Compute calibrated to ~1.5x the copy time, on the training stream.
    n = 8192
    x = torch.randn(n, n, device=dev, dtype=torch.bfloat16)
    y = torch.randn(n, n, device=dev, dtype=torch.bfloat16)

    def compute(k):
        for _ in range(k):
            torch.mm(x, y)

    one = statistics.median(timed(lambda: compute(4)) / 4 for _ in range(3))
    k = max(1, round(1.5 * statistics.median(raw_s) / one))

    def optimizer():
        for t in state:
            t.add_(1e-3)

    dcp = None
    if not a.no_dcp and int(torch.__version__.split(".")[0]) >= 2:
        try:
            import torch.distributed as dist
            import torch.distributed.checkpoint as dcp_mod

            os.environ.setdefault("USE_LIBUV", "0")
            if not dist.is_initialized():
                dist.init_process_group(
                    "gloo", init_method="file://" + os.path.join(work, "pg"), rank=0, world_size=1
                )
            dcp = dcp_mod
        except Exception as e:  # noqa: BLE001 - reported, the other arms still run
            print(f"gpu_capture: no DCP arm: {e}", file=sys.stderr)

    arms = ["none", "blocking", "cairn"] + (["dcp_async"] if dcp else [])
    iter_ms = {arm: [] for arm in arms}
    stall_ms = {arm: [] for arm in arms}
    pending = [None]

    def iteration(arm):
        t0 = time.perf_counter()
        stall = 0.0
        compute(k)  # forward and backward: the state is only read
        if arm == "cairn":
            s = time.perf_counter()
            ck.fence()
            stall += time.perf_counter() - s
        optimizer()
        s = time.perf_counter()
        if arm == "blocking":
            raw(pinned)
            side.synchronize()
        elif arm == "cairn":
            step[0] += 1
            ck.save(step[0])
        elif arm == "dcp_async":
            if pending[0] is not None:
                pending[0].result()
            res = dcp.async_save(
                {f"t{i}": t for i, t in enumerate(state)},
                checkpoint_id=os.path.join(work, "dcp"),
            )
            pending[0] = getattr(res, "upload_completion", res)
        stall += time.perf_counter() - s
        torch.cuda.synchronize()  # loss.item()
        return (time.perf_counter() - t0) * 1e3, stall * 1e3

    for r in range(a.rounds):
        order = arms[r % len(arms) :] + arms[: r % len(arms)]
        for arm in order:
            iteration(arm)  # warm-up of this arm in this round
            for _ in range(a.iters):
                it, st = iteration(arm)
                iter_ms[arm].append(it)
                stall_ms[arm].append(st)
            if arm == "dcp_async" and pending[0] is not None:
                pending[0].result()
                pending[0] = None
            if arm == "cairn":
                ck.fence_host()
    stats = ck.stats()
    ck.close()
    shutil.rmtree(work, ignore_errors=True)
    shutil.rmtree(host_root, ignore_errors=True)

    med = {arm: statistics.median(v) for arm, v in iter_ms.items()}
    stall = {arm: statistics.median(v) for arm, v in stall_ms.items()}
    out = {
        "bench": "gpu_capture",
        "device": torch.cuda.get_device_name(dev),
        "torch": torch.__version__,
        "state_bytes": nbytes,
        "chunk_bytes": chunk,
        "raw_d2h_gbps": round(raw_gbps, 3),
        "pageable_d2h_gbps": round(page_gbps, 3),
        "capture_gbps": round(cap_gbps, 3),
        "capture_vs_raw_d2h": round(cap_gbps / raw_gbps, 3),
        "compute_matmuls": k,
        "iter_ms_no_ckpt": round(med["none"], 3),
        "iter_ms_blocking": round(med["blocking"], 3),
        "iter_ms_cairn": round(med["cairn"], 3),
        "iter_overhead": round(med["cairn"] / med["none"] - 1, 4),
        "stall_ms_cairn": round(stall["cairn"], 4),
        "stall_ms_blocking": round(stall["blocking"], 3),
        "cairn_captured": stats.captured,
        "cairn_skipped": stats.skipped,
    }
    if dcp:
        out["iter_ms_dcp_async"] = round(med["dcp_async"], 3)
        out["stall_ms_dcp_async"] = round(stall["dcp_async"], 3)
        out["cairn_vs_dcp_async"] = round(stall["dcp_async"] / max(stall["cairn"], 1e-6), 1)
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
