"""bench/gpu_capture.py: cairn's device-to-host capture on one GPU against the link's own
speed, and a training-like loop checkpointing every iteration against DCP, in one run.

    PYTHONPATH=build/python python3 bench/gpu_capture.py [--bytes 8G] [--tensors 16]
        [--chunk 4M] [--rounds 3] [--iters 5] [--max-seconds 420]
        [--host-root /dev/shm/cairn-bench] [--dir /var/tmp] [--no-dcp]

State: --tensors bf16 tensors of --bytes in all, on the current CUDA device.
References, same bytes, same chunking (--chunk, cairn's CAIRN_CHUNK_BYTES): one
cudaMemcpyAsync per chunk into pinned host memory on a side stream (raw_d2h_gbps), and
into pageable memory (pageable_d2h_gbps). cairn: save() until the version is CAPTURED
(every byte landed, checksummed and published; capture_gbps).

The loop, as a training loop runs it: "forward/backward" (bf16 matmuls on the training
stream, calibrated to about 1.5x the copy time; they only read the state), the "optimizer
step" (an in-place update of every state tensor), the checkpoint, then loss.item(), which
waits for the training stream only (never for a checkpoint's own streams: a
device-wide synchronize would charge cairn's background copy to the iteration). Arms,
alternated in rounds:
  none              no checkpoint
  blocking          a chunked copy to pinned memory, waited for
  cairn             fence() before the optimizer step (the stream-ordered fence: the host
                    does not wait), save() after it; cairn's default slots (3) and full
                    policy (skip)
  dcp_async         torch.distributed.checkpoint.async_save as its docs show it (stages
                    synchronously into pageable memory); waits for the previous upload
                    before the next save
  dcp_async_pinned  async_save with DefaultStager(StagingOptions(True, True, True, True)):
                    pinned, shared memory, staged in the background with non-blocking
                    copies; waits for staging_completion before the optimizer step and for
                    upload_completion before the next save (what a careful DCP user runs)
stall: host time the loop spends in checkpoint calls and waits. next_iter_slowdown: how
much longer the training's own kernels (forward, backward, optimizer: GPU time between
events on the training stream) take in the arm than without checkpoints, from the previous
save's background copies, staging and writes (every iteration follows a save; DCP users
measure 8% there). item_wait_ms: how long the iteration's loss.item() waits once the
training stream is done, with and without cairn (its 4-byte copy waits behind whatever is
queued on the device's copy engine in that direction: 155 ms behind 8 GiB queued at once).

The run fails (exit 1, the JSON line still printed, "ok": false with the reasons) if
cairn skipped any version (a low stall bought by skipped saves does not count) or if the
driver refused to pin a host slot. --max-seconds bounds the whole run: rounds stop once
another would not fit (the JSON says how many ran). The last line is one JSON object;
without a CUDA device it says so. --cpu rehearses the same flow with CPU tensors and the
CUDA calls stood in for (CI runs it; its figures mean nothing), with the DCP arms this
PyTorch has.
"""

import argparse
import contextlib
import json
import os
import shutil
import statistics
import sys
import tempfile
import time
import traceback

import torch


def parse_bytes(text):
    units = {"K": 1 << 10, "M": 1 << 20, "G": 1 << 30}
    text = text.strip().upper().removesuffix("IB").removesuffix("B")
    if text and text[-1] in units:
        return int(float(text[:-1]) * units[text[-1]])
    return int(text)


def chunked_copy(gpu, dst, src, chunk, stream):
    """One cudaMemcpyAsync per chunk (flat uint8 views), on `stream`."""
    with gpu.on(stream):
        for off in range(0, src.numel(), chunk):
            dst[off : off + chunk].copy_(src[off : off + chunk], non_blocking=True)


class Cuda:
    """The CUDA calls the bench makes."""

    pin = True
    matmul = (8192, torch.bfloat16)  # forward/backward's matrix size and dtype

    def __init__(self):
        self.device = torch.device("cuda", torch.cuda.current_device())

    def name(self):
        return torch.cuda.get_device_name(self.device)

    def stream(self):
        return torch.cuda.Stream()

    def on(self, stream):
        return torch.cuda.stream(stream)

    def current(self):
        return torch.cuda.current_stream()

    def synchronize(self):
        torch.cuda.synchronize()

    def timer(self):
        """Marks on the training stream around its own work: (start, stop, ms after stop)."""
        a, b = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        return a.record, b.record, lambda: a.elapsed_time(b)


class CpuRehearsal(Cuda):
    """--cpu: CPU tensors, and streams that are already done."""

    pin = False
    matmul = (384, torch.float32)

    class Stream:
        def wait_stream(self, other):
            pass

        def synchronize(self):
            pass

    def __init__(self):
        self.device = torch.device("cpu")

    def name(self):
        return "cpu (rehearsal, no figures)"

    def stream(self):
        return self.Stream()

    def on(self, stream):
        return contextlib.nullcontext()

    def current(self):
        return self.Stream()

    def synchronize(self):
        pass

    def timer(self):
        t = [0.0, 0.0]
        return (lambda: t.__setitem__(0, time.perf_counter()),
                lambda: t.__setitem__(1, time.perf_counter()),
                lambda: (t[1] - t[0]) * 1e3)


def free_bytes(path):
    st = os.statvfs(path)
    return st.f_bavail * st.f_frsize


def load_dcp(rehearsal):
    """(dcp module, a pinned background stager's maker): checked at the start, so that a
    GPU run exits at once naming what this PyTorch lacks (the pinned, background-staged
    arm is the one a careful DCP user runs, and a comparison without it would flatter
    cairn). A rehearsal leaves out the arms its PyTorch cannot run."""
    why = None
    try:
        import torch.distributed as dist
        import torch.distributed.checkpoint as dcp

        if not dist.is_available() or not hasattr(dcp, "async_save"):
            raise ImportError("no torch.distributed or no dcp.async_save")
    except ImportError as e:
        if rehearsal:
            print(f"gpu_capture: no DCP arms: {e}", file=sys.stderr)
            return None, None
        sys.exit(f"gpu_capture: PyTorch {torch.__version__} has no DCP async_save ({e}); "
                 "run with --no-dcp to leave both DCP arms out")
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
        from torch.distributed.checkpoint.state_dict_saver import AsyncSaveResponse

        fields = getattr(AsyncSaveResponse, "__dataclass_fields__", {})
        missing = [f for f in ("staging_completion", "upload_completion") if f not in fields]
        if missing:
            why = f"its AsyncSaveResponse lacks {', '.join(missing)}"
    except ImportError as e:
        why = str(e)
    if why is None and rehearsal and not torch.cuda.is_available():
        # Non-blocking copies need a device (and pinning is ignored without one): the
        # rehearsal runs the arm's flow with the rest of its options.
        print("gpu_capture: dcp_async_pinned rehearsed with StagingOptions(True, True, True, "
              "False) (non-blocking copies need a device)", file=sys.stderr)
        return dcp, lambda: DefaultStager(StagingOptions(True, True, True, False))
    if why is None:
        return dcp, lambda: DefaultStager(StagingOptions(True, True, True, True))
    if rehearsal:
        print(f"gpu_capture: no dcp_async_pinned arm: {why}", file=sys.stderr)
        return dcp, None
    sys.exit(f"gpu_capture: PyTorch {torch.__version__} lacks DCP's background staging "
             f"({why}); run with --no-dcp to leave both DCP arms out")


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--bytes", default="8G", help="state size on the GPU (K/M/G)")
    p.add_argument("--tensors", type=int, default=16, help="how many tensors hold it")
    p.add_argument("--chunk", default="4M", help="copy chunk (cairn's CAIRN_CHUNK_BYTES)")
    p.add_argument("--rounds", type=int, default=3, help="rounds of every arm, alternated")
    p.add_argument("--iters", type=int, default=5, help="timed iterations per arm and round")
    p.add_argument("--max-seconds", type=float, default=420,
                   help="stop starting rounds once another would end past this")
    p.add_argument("--host-root", default=os.environ.get("CAIRN_HOST_ROOT", "/dev/shm/cairn-bench"),
                   help="cairn's host tier (a tmpfs)")
    p.add_argument("--dir", default="/var/tmp", help="where DCP writes")
    p.add_argument("--no-dcp", action="store_true", help="leave both DCP arms out")
    p.add_argument("--cpu", action="store_true",
                   help="rehearse the flow on CPU tensors (CI; its figures mean nothing)")
    a = p.parse_args()
    began = time.monotonic()

    if not a.cpu and not torch.cuda.is_available():
        print(json.dumps({"bench": "gpu_capture", "skipped": "no CUDA device"}))
        return 0
    import cairn.torch  # after the device check: the message above needs no build

    gpu = CpuRehearsal() if a.cpu else Cuda()
    dcp, make_stager = (None, None) if a.no_dcp else load_dcp(a.cpu)
    dev = gpu.device
    total, chunk = parse_bytes(a.bytes), parse_bytes(a.chunk)
    per = (total // a.tensors) // 2 * 2
    nbytes = per * a.tensors
    slot_bytes = nbytes + (64 << 20)

    # cairn's default 3 slots, and DCP's shared-memory staging, live in the host root's
    # filesystem (a tmpfs): refuse a run that would fill it halfway.
    os.makedirs(a.host_root, mode=0o700, exist_ok=True)
    need = 3 * slot_bytes + (nbytes if dcp else 0)
    if free_bytes(a.host_root) < need + (1 << 30):
        sys.exit(f"gpu_capture: {a.host_root} has {free_bytes(a.host_root) / 2**30:.1f} GiB "
                 f"free; this run needs {need / 2**30:.1f} GiB there (3 cairn slots"
                 f"{' + DCP staging' if dcp else ''}): a smaller --bytes or another --host-root")
    if dcp and free_bytes(a.dir) < nbytes * 1.2:
        sys.exit(f"gpu_capture: {a.dir} has {free_bytes(a.dir) / 2**30:.1f} GiB free; DCP "
                 f"writes {nbytes / 2**30:.1f} GiB there: another --dir, or --no-dcp")

    state = [torch.randn(per // 2, device=dev).to(torch.bfloat16) for _ in range(a.tensors)]
    flat = [t.view(torch.uint8) for t in state]
    side = gpu.stream()

    def timed(fn):
        """Seconds `fn` takes until the whole device is idle (the references and the capture
        are measured to their end; the loop below is not)."""
        gpu.synchronize()
        t0 = time.perf_counter()
        fn()
        gpu.synchronize()
        return time.perf_counter() - t0

    # References: the link's speed for the same bytes and chunks.
    pinned = [torch.empty(f.numel(), dtype=torch.uint8, pin_memory=gpu.pin) for f in flat]
    pageable = [torch.empty(f.numel(), dtype=torch.uint8) for f in flat]
    for h in pageable:
        h.fill_(0)  # first touch outside the timing

    def raw(dsts):
        side.wait_stream(gpu.current())  # after what wrote the state
        for d, s in zip(dsts, flat):
            chunked_copy(gpu, d, s, chunk, side)

    raw(pinned)  # warm up
    work = tempfile.mkdtemp(prefix="gpu_capture.", dir=a.dir)
    host_root = os.path.join(a.host_root, os.path.basename(work))
    ck = stager = None
    try:
        model = torch.nn.Module()
        model.state = torch.nn.ParameterList(
            torch.nn.Parameter(t, requires_grad=False) for t in state)
        ck = cairn.torch.Checkpointer(
            model,
            job_id="gpu-capture-" + str(os.getpid()),
            host_root=host_root,
            pfs_root=os.path.join(work, "pfs"),
            chunk_bytes=chunk,
            copy_threads=max(4, min(8, (os.cpu_count() or 4) // 2)),
            persist_every=0,
            slot_bytes=slot_bytes,  # pre-faulted at open, outside the timing
        )
        step = [0]

        def capture():
            step[0] += 1
            if not ck.save(step[0]):
                raise RuntimeError(f"save({step[0]}) was skipped with no save in flight")
            ck.wait_captured()

        capture()  # the first copies into the registered slots
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

        # Forward and backward, calibrated to ~1.5x the copy time, on the training stream.
        n, dtype = gpu.matmul
        x = torch.randn(n, n, device=dev, dtype=dtype)
        y = torch.randn(n, n, device=dev, dtype=dtype)

        def compute(k):
            out = None
            for _ in range(k):
                out = torch.mm(x, y)
            return out

        one = statistics.median(timed(lambda: compute(4)) / 4 for _ in range(3))
        k = max(1, round(1.5 * statistics.median(raw_s) / one))

        def optimizer():
            for t in state:
                t.add_(1e-3)

        arms = ["none", "blocking", "cairn"]
        if dcp:
            import torch.distributed as dist

            os.environ.setdefault("USE_LIBUV", "0")
            if not dist.is_initialized():
                dist.init_process_group(
                    "gloo", init_method="file://" + os.path.join(work, "pg"), rank=0, world_size=1
                )
            arms.append("dcp_async")
            if make_stager is not None:
                stager = make_stager()
                arms.append("dcp_async_pinned")
        named = {f"t{i}": t for i, t in enumerate(state)}
        iter_ms = {arm: [] for arm in arms}
        stall_ms = {arm: [] for arm in arms}
        # GPU time of the training's own kernels (forward, backward, optimizer) on its stream:
        # what the previous save's background copies, staging and writes cost them.
        work_ms = {arm: [] for arm in arms}
        item_ms = {arm: [] for arm in arms}  # loss.item()'s copy, the stream already done
        pending = {"dcp_async": None, "dcp_async_pinned": None}  # the last save's response
        skipped_in_loop = [0]
        failed = {}  # a DCP arm -> the error that stopped it
        # One DefaultStager reused by every save is what a careful user runs. Where that
        # fails (seen with PyTorch 2.11: the second save's staging raised KeyError <class
        # 'type'>), the arm goes on with a fresh stager per save, and the JSON says so.
        fresh_stager = [None]  # the error that made the arm switch, once it did

        def iteration(arm):
            nonlocal stager
            t0 = time.perf_counter()
            stall = 0.0
            work_start, work_stop, work_ms_of = gpu.timer()
            work_start()
            loss = compute(k)  # forward and backward: the state is only read
            s = time.perf_counter()
            if arm == "cairn":
                ck.fence()  # what cairn.torch's optimizer hook calls
            elif arm == "dcp_async_pinned" and pending[arm] is not None:
                staged = getattr(pending[arm], "staging_completion", None)
                if staged is not None:  # None: async_save staged before it returned
                    staged.result()
            stall += time.perf_counter() - s
            optimizer()
            work_stop()
            s = time.perf_counter()
            if arm == "blocking":
                raw(pinned)
                side.synchronize()
            elif arm == "cairn":
                step[0] += 1
                skipped_in_loop[0] += not ck.save(step[0])
            elif arm in pending:
                if pending[arm] is not None:  # one upload in flight at most
                    done = pending[arm]
                    getattr(done, "upload_completion", done).result()
                if arm == "dcp_async_pinned" and fresh_stager[0] is not None:
                    if hasattr(stager, "close"):
                        stager.close()
                    stager = make_stager()
                pending[arm] = dcp.async_save(
                    named, checkpoint_id=os.path.join(work, arm),
                    **({"async_stager": stager} if arm == "dcp_async_pinned" else {}))
            stall += time.perf_counter() - s
            # loss.item(), as a training loop ends an iteration: it waits for the training
            # stream, then copies 4 bytes to the host. Split in two to see the copy's own
            # wait: a device-to-host copy queued behind a checkpoint's copies on the
            # device's copy engine waits for them (docs/gpu.md, the third GPU run).
            gpu.current().synchronize()
            s = time.perf_counter()
            loss[0, 0].item()
            item = time.perf_counter() - s
            return (time.perf_counter() - t0) * 1e3, stall * 1e3, work_ms_of(), item * 1e3

        def drain(arm):
            if arm in pending and pending[arm] is not None:
                getattr(pending[arm], "upload_completion", pending[arm]).result()
                pending[arm] = None
            if arm == "cairn":
                ck.fence_host()

        rounds = 0
        round_s = 0.0
        for r in range(a.rounds):
            if r > 0 and time.monotonic() - began + round_s > a.max_seconds:
                print(f"gpu_capture: {rounds} of {a.rounds} rounds fit in --max-seconds "
                      f"{a.max_seconds:.0f}", file=sys.stderr)
                break
            t_round = time.monotonic()
            order = arms[r % len(arms) :] + arms[: r % len(arms)]
            for arm in order:
                if arm in failed:
                    continue
                try:
                    iteration(arm)  # warm-up of this arm in this round
                    for _ in range(a.iters):
                        it, st, wk, item = iteration(arm)
                        iter_ms[arm].append(it)
                        stall_ms[arm].append(st)
                        work_ms[arm].append(wk)
                        item_ms[arm].append(item)
                    drain(arm)
                except Exception as e:  # noqa: BLE001 - a DCP arm's failure is a finding
                    if arm not in pending:
                        raise
                    traceback.print_exc()
                    why = f"{type(e).__name__}: {e}"
                    pending[arm] = None
                    if arm == "dcp_async_pinned" and fresh_stager[0] is None:
                        fresh_stager[0] = why
                        print(f"gpu_capture: {arm} failed reusing its stager ({why}); going "
                              "on with a fresh stager per save", file=sys.stderr)
                    else:
                        failed[arm] = why
            rounds += 1
            round_s = time.monotonic() - t_round
        stats = ck.stats()
    finally:
        if stager is not None and hasattr(stager, "close"):
            stager.close()
        if ck is not None:
            ck.close()
        if dcp and torch.distributed.is_initialized():
            torch.distributed.destroy_process_group()
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(host_root, ignore_errors=True)
        with contextlib.suppress(OSError):  # another run's may still be there
            os.rmdir(a.host_root)

    med = {arm: statistics.median(v) for arm, v in iter_ms.items() if v}
    stall = {arm: statistics.median(v) for arm, v in stall_ms.items() if v}
    # What the previous save's background work (copies, checksums, staging, writes) costs
    # the training's own kernels: every iteration follows a save, so their GPU time
    # against the arm without checkpoints.
    work = {arm: statistics.median(v) for arm, v in work_ms.items() if v}
    slow = {arm: w / work["none"] - 1 for arm, w in work.items()}
    item = {arm: statistics.median(v) for arm, v in item_ms.items() if v}
    out = {
        "bench": "gpu_capture",
        "device": gpu.name(),
        "torch": torch.__version__,
        "state_bytes": nbytes,
        "chunk_bytes": chunk,
        "raw_d2h_gbps": round(raw_gbps, 3),
        "pageable_d2h_gbps": round(page_gbps, 3),
        "capture_gbps": round(cap_gbps, 3),
        "capture_vs_raw_d2h": round(cap_gbps / raw_gbps, 3),
        "compute_matmuls": k,
        "rounds": rounds,
        "iters": a.iters,
        "iter_ms_no_ckpt": round(med["none"], 3),
        "iter_ms_blocking": round(med["blocking"], 3),
        "iter_ms_cairn": round(med["cairn"], 3),
        "iter_overhead": round(med["cairn"] / med["none"] - 1, 4),
        "stall_ms_cairn": round(stall["cairn"], 4),
        "stall_ms_blocking": round(stall["blocking"], 3),
        "next_iter_slowdown_cairn": round(slow["cairn"], 4),
        "item_wait_ms_no_ckpt": round(item["none"], 3),
        "item_wait_ms_cairn": round(item["cairn"], 3),
        "cairn_captured": stats.captured,
        "cairn_skipped": stats.skipped,
        "slots_pinned": stats.slots_pinned,
        "slots_not_pinned": stats.slots_not_pinned,
    }
    if fresh_stager[0] is not None:
        out["dcp_async_pinned_stager"] = f"fresh per save (one reused failed: {fresh_stager[0]})"
    for arm, why in failed.items():
        out[f"{arm}_failed"] = why
    for arm in ("dcp_async", "dcp_async_pinned"):
        if arm in med:
            out[f"iter_ms_{arm}"] = round(med[arm], 3)
            out[f"stall_ms_{arm}"] = round(stall[arm], 3)
            out[f"next_iter_slowdown_{arm}"] = round(slow[arm], 4)
            out[f"cairn_vs_{arm}"] = round(stall[arm] / max(stall["cairn"], 1e-6), 1)
    problems = []
    if stats.skipped or skipped_in_loop[0]:
        problems.append(f"cairn skipped {stats.skipped} version(s): its stall does not count")
    if not a.cpu and (stats.slots_not_pinned or not stats.slots_pinned):
        problems.append(f"{stats.slots_not_pinned} host slot mapping(s) not pinned "
                        f"({stats.slots_pinned} pinned)")
    out["ok"] = not problems
    if problems:
        out["problems"] = problems
        print("gpu_capture: " + "; ".join(problems), file=sys.stderr)
    print(json.dumps(out))
    return 0 if not problems else 1


if __name__ == "__main__":
    sys.exit(main())
