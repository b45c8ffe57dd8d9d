"""bench/torch_compare.py: a PyTorch training loop checkpointing every iteration through
torch.distributed.checkpoint's dcp.async_save (the asynchronous checkpointer PyTorch users
pick), with DCP's own staging against cairn as DCP's writer and stager, and cairn.torch's
own Checkpointer, on the same model and loop in one run; one process (TinyLM), then two
processes with a tensor-parallel model (TPLM split over a 2-way mesh, gloo).

    PYTHONPATH=build/python:tests/python python3 bench/torch_compare.py \\
        [--procs 1,2] [--dim 256] [--layers 2] [--vocab 32768] [--seq 16] [--batch 1]
        [--rounds 6] [--iters 4] [--threads 2] [--dir /var/tmp] [--timeout 0]

Arms, rotated in rounds (round 0 warms up and is not counted), --iters iterations each:
  none              no checkpoint
  cairn_dcp         dcp.async_save(get_state_dict(model, optimizer)) with
                    cairn.dcp.StorageWriter as writer and stager (the two lines a DCP loop
                    changes); staging_completion waited for before the next optimizer step
  dcp_async         dcp.async_save of the same with DCP's default staging (a copy of every
                    tensor taken in async_save) and its FileSystemWriter into --dir
  dcp_async_pinned  the same with DefaultStager(StagingOptions(True, True, True, True))
                    (pinned and shared memory, staging on a thread, non-blocking copies),
                    staging_completion waited for before the next optimizer step; without a
                    GPU DCP refuses non-blocking copies, and the arm runs with (True, True,
                    True, False) (the JSON's pinned_options says which)
  cairn             cairn.torch.Checkpointer: save() after every step, fence() by the
                    optimizer hook
Every async arm waits for its previous upload before its next save (DCP's rule: one in
flight), and for the last one before the next arm; every cairn arm drains every 10th
version to --dir in the background.

Stall: the time the loop spends checkpointing (the DCP calls and waits; cairn's save() and
the fence's wait). iter_ms: the whole iteration. An iteration's figure is the slowest
rank's. Physical references in the same run: memcpy of the state and a raw write + fsync
of it. Last line: one JSON object; per configuration ("1proc", "2proc_tp") per arm
stall_ms and iter_ms (medians), iter_overhead_<arm> (iteration time over no checkpoint's,
- 1) and <arm>_vs_<dcp arm> (the stall ratio); at the top level the worst of the
configurations: the smallest cairn_dcp_vs_dcp_async_pinned and cairn_dcp_vs_dcp_async,
the largest iter_overhead_cairn_dcp, and the smallest DCP overheads. PyTorch >= 2.9.

--timeout S: a configuration that has not finished after S seconds is a hang: every
process's Python threads (faulthandler) and, where gdb is installed, its native threads are
printed to stderr before the processes are killed and the run fails.
"""

import argparse
import faulthandler
import json
import os
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

import torch.distributed.checkpoint as dcp
from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions
from torch.distributed.checkpoint.state_dict import get_state_dict

import cairn.dcp
import cairn.torch
from tiny_lm import TinyLM, TPLM, batch, loss_of, parallelize_tp

ARMS = ["none", "cairn_dcp", "dcp_async", "dcp_async_pinned", "cairn"]
DCP_ARMS = ("cairn_dcp", "dcp_async", "dcp_async_pinned")


def pinned_options():
    """DCP's background staging with every option on, or, without a device (where DCP
    refuses non-blocking copies), all but that one; and which it is."""
    if torch.accelerator.is_available():
        return StagingOptions(True, True, True, True), [True, True, True, True]
    return StagingOptions(True, True, True, False), [True, True, True, False]


def local(t):
    return t.to_local() if hasattr(t, "to_local") else t


def state_tensors(model, opt):
    ts = [local(v) for v in model.state_dict().values()]
    for st in opt.state.values():
        ts += [local(v) for v in st.values() if torch.is_tensor(v)]
    return ts


def raw_write(path, tensors):
    t0 = time.perf_counter()
    with open(path, "wb") as f:
        for t in tensors:
            f.write(t.contiguous().reshape(-1).view(torch.uint8).numpy().tobytes())
        f.flush()
        os.fsync(f.fileno())
    dt = time.perf_counter() - t0
    os.unlink(path)
    return dt


class Arms:
    """The checkpointing arms of one rank."""

    def __init__(self, a, model, opt, rank, world, work, host, pg):
        self.model, self.opt, self.work, self.pg = model, opt, work, pg
        self.saving = None  # the AsyncSaveResponse (or Future) of the DCP save in flight
        state_bytes = sum(t.numel() * t.element_size() for t in state_tensors(model, opt))
        settings = dict(pfs_root=os.path.join(work, "pfs"), rank=rank, world_size=world,
                        node=0, local_rank=rank, local_world_size=world, persist_every=10,
                        slot_bytes=state_bytes + (8 << 20))
        self.ck = cairn.torch.Checkpointer(model, opt, job_id=f"torch-compare-{a.tag}",
                                           host_root=os.path.join(host, "own"), **settings)
        self.dcp_ck = cairn.torch.StateCheckpointer(job_id=f"torch-compare-dcp-{a.tag}",
                                                    host_root=os.path.join(host, "dcp"),
                                                    **settings)
        self.writer = cairn.dcp.StorageWriter(checkpointer=self.dcp_ck)
        options, self.pinned_options = pinned_options()
        self.pinned = DefaultStager(options)
        self.names = list(ARMS)
        # Where a DCP arm's stall goes, per arm: get_state_dict, the async_save call, the
        # wait for the previous upload, the wait for staging (seconds, summed).
        self.parts = {n: {"get_state_dict": 0.0, "async_save": 0.0, "upload_wait": 0.0,
                          "staging_wait": 0.0} for n in DCP_ARMS}
        self.current = None

    def dcp_state(self):
        msd, osd = get_state_dict(self.model, self.opt)
        return {"model": msd, "optim": osd}

    def checkpoint(self, arm, step):
        """Checkpoints after step `step`; returns the stall in seconds."""
        if arm == "none":
            return 0.0
        t0 = time.perf_counter()
        if arm == "cairn":
            self.ck.save(step)
            return time.perf_counter() - t0
        self.current = arm
        parts = self.parts[arm]
        self.wait()
        t1 = time.perf_counter()
        state = self.dcp_state()
        t2 = time.perf_counter()
        parts["get_state_dict"] += t2 - t1
        kw = {"cairn_dcp": dict(checkpoint_id=f"step-{step}", storage_writer=self.writer,
                                async_stager=self.writer),
              "dcp_async": dict(checkpoint_id=os.path.join(self.work, "dcp-async")),
              "dcp_async_pinned": dict(checkpoint_id=os.path.join(self.work, "dcp-pinned"),
                                       async_stager=self.pinned)}[arm]
        self.saving = dcp.async_save(state, process_group=self.pg, **kw)
        parts["async_save"] += time.perf_counter() - t2
        return time.perf_counter() - t0

    def before_step(self):
        """Waits until the save in flight no longer reads the tensors (its staging), as a
        loop must before the optimizer changes them; returns the seconds it took."""
        t0 = time.perf_counter()
        staging = getattr(self.saving, "staging_completion", None)
        if staging is not None:
            staging.result()
            self.parts[self.current]["staging_wait"] += time.perf_counter() - t0
        return time.perf_counter() - t0

    def fence_total(self):
        """cairn: the fence waits so far (the optimizer hook's, inside optimizer.step)."""
        return self.ck.stats().fence_wait_total_s

    def wait(self):
        """Waits for the upload of the DCP save in flight; returns the seconds it took."""
        t0 = time.perf_counter()
        if self.saving is not None:
            done = getattr(self.saving, "upload_completion", self.saving)
            done.result()
            self.saving = None
            self.parts[self.current]["upload_wait"] += time.perf_counter() - t0
        return time.perf_counter() - t0

    def close(self):
        self.wait()
        self.pinned.close()
        self.ck.close()
        self.dcp_ck.close()


def worker(a):
    faulthandler.register(signal.SIGUSR1, all_threads=True)  # run_config's hang report
    rank, world = int(os.environ.get("RANK", 0)), int(os.environ.get("WORLD_SIZE", 1))
    torch.set_num_threads(a.threads)
    torch.manual_seed(0)
    dist.init_process_group("gloo", init_method="file://" + a.init, rank=rank, world_size=world)
    pg = dist.new_group(backend="gloo")  # checkpoint collectives beside training's
    if world > 1:
        from torch.distributed.device_mesh import init_device_mesh

        model = parallelize_tp(TPLM(vocab=a.vocab, dim=a.dim, layers=a.layers, seq=a.seq),
                               init_device_mesh("cpu", (world,)))
    else:
        model = TinyLM(vocab=a.vocab, dim=a.dim, layers=a.layers, heads=8, seq=a.seq,
                       dropout=0.0)
    opt = torch.optim.AdamW(model.parameters(), lr=1e-4)
    work = tempfile.mkdtemp(prefix="cairn-bench-torch-", dir=a.dir) if rank == 0 else None
    if world > 1:
        box = [work]
        dist.broadcast_object_list(box, src=0)
        work = box[0]
    host = tempfile.mkdtemp(prefix=f"cairn-bench-torch-{rank}-", dir="/dev/shm")
    step = 0

    def train(before_step=lambda: 0.0):
        """One step; returns what before_step() waited (the fence of a DCP arm)."""
        nonlocal step
        step += 1
        x, y = batch(step, 0, a.batch, a.seq, a.vocab)
        loss = loss_of(model, x, y)
        opt.zero_grad()
        loss.backward()
        waited = before_step()
        opt.step()
        return waited

    try:
        train()  # the optimizer's state exists from here on
        tensors = state_tensors(model, opt)
        state_bytes = sum(t.numel() * t.element_size() for t in tensors)
        dst = [torch.empty_like(t) for t in tensors]
        memcpy_s = []
        for _ in range(3):
            t0 = time.perf_counter()
            for d, t in zip(dst, tensors):
                d.copy_(t)
            memcpy_s.append(time.perf_counter() - t0)
        del dst
        raw_s = [raw_write(os.path.join(host, "raw.bin"), tensors)]
        arms = Arms(a, model, opt, rank, world, work, host, pg)
        names = arms.names
        stall = {n: [] for n in names}
        fence_ms = []  # cairn: the part of its stall that was the fence's wait
        iters = {n: [] for n in names}
        for r in range(a.rounds + 1):
            if r == 1:  # round 0 warms up
                for p in arms.parts.values():
                    for k in p:
                        p[k] = 0.0
            order = names[r % len(names):] + names[: r % len(names)]
            for arm in order:
                for i in range(a.iters):
                    f0 = arms.fence_total()
                    t0 = time.perf_counter()
                    # cairn: the hook fences the previous save in optimizer.step; a DCP arm
                    # waits for its staging before it.
                    s = train(arms.before_step)
                    s += arms.checkpoint(arm, step)
                    if i == a.iters - 1 and arm in DCP_ARMS:
                        s += arms.before_step() + arms.wait()  # before the next arm
                    total = time.perf_counter() - t0
                    if arm == "cairn":
                        w = arms.fence_total() - f0
                        s += w
                        if r:
                            fence_ms.append(w * 1e3)
                    if r:
                        stall[arm].append(s * 1e3)
                        iters[arm].append(total * 1e3)
            raw_s.append(raw_write(os.path.join(host, "raw.bin"), tensors))
        arms.ck.fence()
        st, st_dcp = arms.ck.stats(), arms.dcp_ck.stats()
        arms.close()
        if world > 1:  # an iteration takes as long as its slowest rank
            everyone = [None] * world
            dist.all_gather_object(everyone, (stall, iters, state_bytes), group=pg)
            stall = {n: [max(e[0][n][i] for e in everyone) for i in range(len(stall[n]))]
                     for n in names}
            iters = {n: [max(e[1][n][i] for e in everyone) for i in range(len(iters[n]))]
                     for n in names}
            state_bytes = sum(e[2] for e in everyone)
    finally:
        if world > 1:
            dist.barrier()
        if rank == 0:
            shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(host, ignore_errors=True)
    dist.destroy_process_group()
    if rank != 0:
        return 0
    med = statistics.median
    gb = state_bytes / 1e9
    out = {
        "procs": world,
        "model": "TPLM, 2-way tensor parallel" if world > 1 else "TinyLM",
        "params": sum(p.numel() for p in model.parameters()),  # a DTensor's is global
        "state_bytes": state_bytes,
        "iters": a.rounds * a.iters,
        "memcpy_gbps": round(gb / world / med(memcpy_s), 3),
        "raw_write_fsync_gbps": round(gb / world / med(raw_s), 3),
    }
    for n in names:
        out[f"stall_ms_{n}"] = round(med(stall[n]), 4)
        out[f"iter_ms_{n}"] = round(med(iters[n]), 2)
    base = out["iter_ms_none"]
    for n in names[1:]:
        out[f"iter_overhead_{n}"] = round(out[f"iter_ms_{n}"] / base - 1, 4)
    for c in ("cairn_dcp", "cairn"):
        for d in ("dcp_async", "dcp_async_pinned"):
            out[f"{c}_vs_{d}"] = round(med(stall[d]) / max(med(stall[c]), 1e-6), 1)
    saves = a.rounds * a.iters
    out["stall_parts_ms"] = {n: {k: round(v * 1e3 / saves, 3) for k, v in p.items()}
                             for n, p in arms.parts.items()}  # rank 0's, per save
    out["pinned_options"] = arms.pinned_options
    out["fence_ms_cairn"] = round(med(fence_ms), 4)  # rank 0's
    out["cairn_skipped"], out["cairn_captured"] = st.skipped, st.captured
    out["cairn_dcp_skipped"], out["cairn_dcp_captured"] = st_dcp.skipped, st_dcp.captured
    print(json.dumps(out), flush=True)
    return 0


def report_hang(children, procs, timeout):
    """Prints where every process of a hung configuration is, kills them, and fails."""
    alive = [(r, c) for r, c in enumerate(children) if c.poll() is None]
    for r, c in alive:
        print(f"torch_compare: rank {r} (pid {c.pid}) has not finished; its Python threads:",
              file=sys.stderr, flush=True)
        c.send_signal(signal.SIGUSR1)
        time.sleep(1)
    if shutil.which("gdb"):
        for r, c in alive:
            print(f"torch_compare: rank {r} (pid {c.pid}), native threads:", file=sys.stderr,
                  flush=True)
            subprocess.run(["gdb", "-p", str(c.pid), "-batch", "-nx", "-ex",
                            "thread apply all bt 30"], stdout=sys.stderr, stderr=subprocess.STDOUT,
                           timeout=60, check=False)
    for _, c in alive:
        c.kill()
        c.wait()
    sys.exit(f"torch_compare: the {procs}-process run did not finish within {timeout} s "
             f"(ranks {[r for r, _ in alive]} hung; where they were is printed above)")


def run_config(a, procs, tag):
    """Runs the workers of one configuration; returns rank 0's JSON object."""
    init = os.path.join(tempfile.mkdtemp(prefix="cairn-bench-torch-init-", dir=a.dir), "init")
    args = [sys.executable, os.path.abspath(__file__), "--worker", "--init", init, "--tag", tag,
            "--threads", str(max(1, a.threads // procs))]
    for k in ("dim", "layers", "vocab", "seq", "batch", "rounds", "iters", "dir"):
        args += [f"--{k}", str(getattr(a, k))]
    children = []
    for r in range(procs):
        env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(procs), USE_LIBUV="0",
                   UCX_TLS=os.environ.get("UCX_TLS", "tcp"))
        children.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True))
    deadline = time.monotonic() + a.timeout if a.timeout > 0 else None
    while any(c.poll() is None for c in children):  # one failed: the others would hang
        if any(c.poll() not in (None, 0) for c in children):
            for c in children:
                c.kill()
        if deadline is not None and time.monotonic() > deadline:
            report_hang(children, procs, a.timeout)
        time.sleep(0.2)
    outs = [c.communicate()[0] for c in children]
    shutil.rmtree(os.path.dirname(init), ignore_errors=True)
    for r, c in enumerate(children):
        if c.returncode != 0:
            sys.exit(f"torch_compare: rank {r} of the {procs}-process run failed "
                     f"(exit {c.returncode}):\n{outs[r]}")
    return json.loads(outs[0].strip().splitlines()[-1])


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--procs", default="1,2",
                   help="configurations: process counts (1: TinyLM; more: TPLM split over "
                   "them, PyTorch 2.x)")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--rounds", type=int, default=6)
    p.add_argument("--iters", type=int, default=4)
    p.add_argument("--threads", type=int, default=2, help="torch threads in all")
    p.add_argument("--dir", default="/var/tmp", help="where checkpoints are written")
    p.add_argument("--timeout", type=float, default=0,
                   help="seconds a configuration may take before it is reported as hung "
                   "(stacks printed, processes killed); 0: no limit")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--tag", default=str(os.getpid()), help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    configs = {}
    for procs in (int(x) for x in a.procs.split(",")):
        name = "1proc" if procs == 1 else f"{procs}proc_tp"
        configs[name] = run_config(a, procs, f"{os.getpid()}-{procs}")
    cs = configs.values()
    result = {"bench": "torch_compare", "torch": torch.__version__}
    for k in ("cairn_dcp_vs_dcp_async_pinned", "cairn_dcp_vs_dcp_async", "cairn_vs_dcp_async"):
        result[k] = min(c[k] for c in cs)
    for k in ("iter_overhead_cairn_dcp", "iter_overhead_cairn"):
        result[k] = max(c[k] for c in cs)
    for k in ("iter_overhead_dcp_async", "iter_overhead_dcp_async_pinned"):
        result[k] = min(c[k] for c in cs)
    result.update(configs)
    for name, c in configs.items():
        arms = [k[len("stall_ms_"):] for k in c if k.startswith("stall_ms_")]
        print(f"{name}: {c['model']}, {c['state_bytes'] / 1e9:.2f} GB of state; " + ", ".join(
            f"{n} {c[f'stall_ms_{n}']:.1f} ms stall / {c[f'iter_ms_{n}']:.0f} ms iteration"
            for n in arms))
    print(json.dumps(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
