"""bench/torch_goodput.py: training time lost to failures, cairn saving every step against
torch.distributed.checkpoint's dcp.async_save every K steps, on the same job, each arm run
with failures injected at random moments and restarted after each.

    PYTHONPATH=build/python:tests/python python3 bench/torch_goodput.py \\
        [--seconds 120] [--mtbf 30] [--k 10,100] [--cairn-k 1] [--dim 256] [--layers 2]
        [--vocab 32768]
        [--seq 16] [--threads 2] [--dir /var/tmp] [--seed 1]

PyTorch 2.x. The job of bench/torch_resume.py (TPLM, 2-way tensor parallel over two
processes, each its own node). Arms, one after the other, each for --seconds of wall time:
  none          no checkpoint and no failure, --baseline-seconds right before each other
                arm: the iteration time T0 that arm is measured against (a shared
                machine changes between arms)
  cairn         cairn.torch save() every step, every 10th version drained to --dir; on
                every other failure node 1's host memory is wiped too (it comes back from
                node 0's replica); cairn_K (--cairn-k): the same, a save every K steps.
                Settings such as CAIRN_REPLICATE_PRIORITY pass from the environment
  dcp_async_K   dcp.async_save every K steps (one in flight at a time, the previous one
                waited for first, as DCP's documentation does), staging a copy of the
                state first (as for GPU state: torch_compare.py's StagedWriter); a restart
                loads the newest complete checkpoint (one whose .metadata exists)
Failures come at exponentially distributed times (mean --mtbf seconds of wall time, the
same draws for every arm): both processes are killed (SIGKILL) and the job is restarted.

Per arm: steps kept at the end (a last restart restores them), goodput (steps kept x T0
over the wall time), per failure the steps recomputed (the newest step trained before the
kill minus the step restored after it) and the recovery time (from the restart to its
first training step), and the overhead while no failure happened (median iteration over
T0 - 1), and the goodput a first-order model (Young/Daly) gives with these figures at a
failure every --model-mtbf seconds (30 minutes). Every restored run is checked: each
step's loss, wherever it was trained, equals the first time it was trained, bit for bit.
Last line: one JSON object with the arms and that model's figures (goodput_model).
"""

import argparse
import glob
import json
import os
import random
import shutil
import signal
import statistics
import subprocess
import sys
import tempfile
import time

import torch
import torch.distributed as dist

try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    HAVE_DCP = hasattr(dcp, "async_save")
except ImportError:  # torch 1.x
    HAVE_DCP = False


def newest_complete(root):
    """The newest DCP checkpoint under root whose metadata was written, as (step, path)."""
    best = None
    for path in glob.glob(os.path.join(root, "step-*")):
        if os.path.exists(os.path.join(path, ".metadata")):
            step = int(path.rsplit("-", 1)[1])
            if best is None or step > best[0]:
                best = (step, path)
    return best


def worker(a):
    import cairn.torch
    from tiny_lm import batch, loss_of
    from tp_job import staged_copy, tp_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model, opt = tp_rank(a, rank, world)
    pg = dist.new_group(backend="gloo")  # DCP's collectives beside training's
    out = open(a.out, "a")
    start, ck, future = 0, None, None
    if a.arm.startswith("cairn"):
        ck = cairn.torch.Checkpointer(model, opt)
        got = ck.restore()
        start = got or 0
        tier = ck.last_report.tier if got is not None else "none"
    elif a.arm.startswith("dcp"):
        tier = "none"
        found = newest_complete(a.dcp_root)
        if found is not None:
            sd_model, sd_optim = get_state_dict(model, opt)
            state = {"model": sd_model, "optim": sd_optim}
            dcp.load(state, checkpoint_id=found[1])
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
            start, tier = found[0], "pfs"
    else:
        tier = "none"
    out.write(f"restored {start} {tier} {a.launch}\n")
    out.flush()
    k = int(a.arm.rsplit("_", 1)[1]) if "_" in a.arm and a.arm != "cairn" else 1
    step = start
    while step < a.max_steps:
        step += 1
        t0 = time.perf_counter()
        x, y = batch(step, 0, 1, a.seq, a.vocab)
        loss = loss_of(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()  # cairn's hook fences first
        if ck is not None:
            if step % k == 0:
                ck.save(step)
        elif a.arm.startswith("dcp") and step % k == 0:
            if future is not None:
                future.result()
            sd_model, sd_optim = get_state_dict(model, opt)
            staged = staged_copy({"model": sd_model, "optim": sd_optim})
            path = os.path.join(a.dcp_root, f"step-{step}")
            future = dcp.async_save(staged, checkpoint_id=path, process_group=pg)
            if rank == 0:  # the two before the newest complete one are never read again
                for old in sorted(glob.glob(os.path.join(a.dcp_root, "step-*")),
                                  key=lambda p: int(p.rsplit("-", 1)[1]))[:-3]:
                    shutil.rmtree(old, ignore_errors=True)
        dt = time.perf_counter() - t0
        out.write(f"{step} {loss.item().hex()} {dt:.6f} {time.time():.6f}\n")
        out.flush()
    if future is not None:
        future.result()
    if ck is not None:
        ck.close()
    dist.barrier()  # no rank leaves while another still sets up its groups
    dist.destroy_process_group()
    return 0


class Job:
    def __init__(self, a, arm, root):
        self.a, self.arm = a, arm
        self.root = tempfile.mkdtemp(prefix=f"{arm}-", dir=root)
        self.shm = tempfile.mkdtemp(prefix=f"cairn-bench-goodput-{arm}-", dir="/dev/shm")
        os.makedirs(os.path.join(self.root, "dcp"))
        self.job = f"goodput-{os.getpid()}-{os.path.basename(self.root)}"
        self.launches = 0
        self.procs = []

    def outs(self, r):
        return os.path.join(self.root, f"rank-{r}.txt")

    def start(self, max_steps):
        self.launches += 1
        init = os.path.join(self.root, f"init-{self.launches}")
        args = [sys.executable, os.path.abspath(__file__), "--worker", "--arm", self.arm,
                "--init", init, "--dcp-root", os.path.join(self.root, "dcp"),
                "--threads", str(max(1, self.a.threads // 2)), "--max-steps", str(max_steps),
                "--launch", str(self.launches)]
        for k in ("dim", "layers", "vocab", "seq"):
            args += [f"--{k}", str(getattr(self.a, k))]
        self.procs = []
        for r in range(2):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE="2", LOCAL_RANK="0",
                       LOCAL_WORLD_SIZE="1", GROUP_RANK=str(r), CAIRN_NODE=str(r),
                       CAIRN_JOB_ID=self.job, CAIRN_HOST_ROOT=os.path.join(self.shm, "host"),
                       CAIRN_PFS_ROOT=os.path.join(self.root, "pfs"), CAIRN_PERSIST_EVERY="10",
                       USE_LIBUV="0", UCX_TLS=os.environ.get("UCX_TLS", "tcp"),
                       PYTHONWARNINGS=os.environ.get("PYTHONWARNINGS", "ignore"))
            self.procs.append(subprocess.Popen(args + ["--out", self.outs(r)], env=env,
                                               stdout=subprocess.DEVNULL,
                                               stderr=open(self.outs(r) + ".err", "a")))
        return time.time()

    def kill(self):
        for p in self.procs:
            if p.poll() is None:
                p.send_signal(signal.SIGKILL)
        for p in self.procs:
            p.wait()

    def wait(self, timeout):
        for r, p in enumerate(self.procs):
            try:
                p.wait(timeout=timeout)
            except subprocess.TimeoutExpired:
                self.kill()
                sys.exit(f"torch_goodput: {self.arm}: rank {r} did not finish in {timeout} s")
            if p.returncode != 0:
                with open(self.outs(r) + ".err") as f:
                    sys.exit(f"torch_goodput: {self.arm}: rank {r} failed "
                             f"(exit {p.returncode}):\n{f.read()[-3000:]}")

    def wipe_node1(self):
        shutil.rmtree(os.path.join(self.shm, "host", self.job, "node-1"), ignore_errors=True)

    def close(self):
        self.kill()
        shutil.rmtree(self.shm, ignore_errors=True)


def parse(path, count):
    """Per launch (numbered from 1): (restored step, tier, [(step, loss hex, seconds,
    wall)]), or None for a launch killed before it had restored."""
    launches = [None] * count
    cur = None
    with open(path) as f:
        for line in f:
            w = line.split()
            if w and w[0] == "restored":
                cur = launches[int(w[3]) - 1] = (int(w[1]), w[2], [])
            elif len(w) == 4 and cur is not None:
                cur[2].append((int(w[0]), w[1], float(w[2]), float(w[3])))
    return launches


def run_arm(a, arm, root, failures, seconds=None):
    """Runs one arm for `seconds` (a.seconds) with the given failure times; returns its
    figures."""
    seconds = a.seconds if seconds is None else seconds
    job = Job(a, arm, root)
    try:
        t_begin = time.time()
        starts = [job.start(10 ** 9)]
        wiped = []
        for i, at in enumerate(failures):
            left = t_begin + at - time.time()
            if left > 0:
                time.sleep(left)
            job.kill()
            wipe = arm.startswith("cairn") and i % 2 == 1
            if wipe:
                job.wipe_node1()
            wiped.append(wipe)
            starts.append(job.start(10 ** 9))
        left = t_begin + seconds - time.time()
        if left > 0:
            time.sleep(left)
        job.kill()
        wall = time.time() - t_begin
        # What the run kept: a last restart restores it and stops at once.
        if arm != "none":
            job.start(0)
            job.wait(300)
    finally:
        job.close()
    launches = [parse(job.outs(r), job.launches) for r in range(2)]
    runs = launches[0]
    kept = runs[-1][0] if arm != "none" else None
    first_loss = {}
    for r in range(2):
        for restored, _, steps in (x for x in launches[r] if x is not None):
            for s, loss, _, _ in steps:
                if first_loss.setdefault((r, s), loss) != loss:
                    sys.exit(f"torch_goodput: {arm}: rank {r}'s step {s} was trained again from a "
                             f"restored state and its loss differs ({float.fromhex(loss)} vs "
                             f"{float.fromhex(first_loss[(r, s)])})")
    per_failure = []
    reached = 0  # the newest step trained so far
    for i in range(len(failures)):
        before, after = runs[i], runs[i + 1]
        if before is not None and before[2]:
            reached = max(reached, before[2][-1][0])
        if after is None:  # killed again before it had restored: recovery went on
            per_failure.append({"steps_recomputed": None, "recovery_s": None,
                                "restored_from": None, "node_wiped": wiped[i]})
            continue
        first = after[2][0][3] if after[2] else None
        other = launches[1][i + 1]
        per_failure.append({
            "steps_recomputed": reached - after[0],
            "recovery_s": round(first - starts[i + 1], 3) if first else None,
            "restored_from": f"{after[1]}/{other[1] if other else '?'}", "node_wiped": wiped[i]})
    iters = [dt for run in runs if run is not None for _, _, dt, _ in run[2]]
    return {"wall_s": round(wall, 1), "steps_kept": kept, "failures": len(failures),
            "iter_ms_median": round(statistics.median(iters) * 1e3, 2) if iters else None,
            "steps_recomputed": [f["steps_recomputed"] for f in per_failure],
            "recovery_s": [f["recovery_s"] for f in per_failure],
            "restored_from": [f["restored_from"] for f in per_failure],  # rank 0 / rank 1
            "node_1_wiped": [f["node_wiped"] for f in per_failure]}


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--seconds", type=float, default=120, help="wall time of each arm")
    p.add_argument("--mtbf", type=float, default=30, help="mean seconds between failures")
    p.add_argument("--baseline-seconds", type=float, default=30,
                   help="the run without checkpoints before each arm (its T0)")
    p.add_argument("--k", default="10,100", help="DCP's save intervals, in steps")
    p.add_argument("--cairn-k", default="1",
                   help="cairn's save intervals, in steps (1: every step, the arm 'cairn')")
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--threads", type=int, default=2, help="torch threads in all")
    p.add_argument("--dir", default="/var/tmp", help="where the checkpoints are written")
    p.add_argument("--seed", type=int, default=1)
    p.add_argument("--model-mtbf", type=float, default=1800,
                   help="the failure interval the model's goodput is given for (s)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--arm", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--out", help=argparse.SUPPRESS)
    p.add_argument("--dcp-root", help=argparse.SUPPRESS)
    p.add_argument("--max-steps", type=int, help=argparse.SUPPRESS)
    p.add_argument("--launch", type=int, default=0, help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if not HAVE_DCP:
        print(json.dumps({"bench": "torch_goodput", "skipped": "needs PyTorch 2.x (DCP)",
                          "torch": torch.__version__}))
        return 0
    rng = random.Random(a.seed)
    failures, t = [], 0.0
    while True:
        t += rng.expovariate(1.0 / a.mtbf)
        if t > a.seconds - 5:
            break
        failures.append(round(t, 2))
    root = tempfile.mkdtemp(prefix="cairn-bench-goodput-", dir=a.dir)
    out = {"bench": "torch_goodput", "torch": torch.__version__,
           "model": "TPLM, 2-way tensor parallel", "seconds": a.seconds, "mtbf_s": a.mtbf,
           "failures_at_s": failures}
    try:
        arms = [f"cairn_{k}" if k != "1" else "cairn" for k in a.cairn_k.split(",") if k]
        for arm in arms + [f"dcp_async_{k}" for k in a.k.split(",") if k]:
            # The reference right before each arm, so that both see the machine alike.
            none = run_arm(a, "none", root, [], seconds=a.baseline_seconds)
            t0 = none["iter_ms_median"] / 1e3
            res = run_arm(a, arm, root, failures)
            res["t0_ms"] = none["iter_ms_median"]
            res["goodput"] = round(res["steps_kept"] * t0 / res["wall_s"], 4)
            res["overhead"] = round(res["iter_ms_median"] / none["iter_ms_median"] - 1, 4)
            out[arm] = res
            print(f"{arm}: {res['steps_kept']} steps kept in {res['wall_s']} s, goodput "
                  f"{res['goodput']}, recomputed {res['steps_recomputed']}, recovery "
                  f"{res['recovery_s']} s", flush=True)
    finally:
        shutil.rmtree(root, ignore_errors=True)
    # The model (Young/Daly, first order): a failure every M seconds costs its recovery R
    # plus the work redone L; checkpointing costs the overhead o on every iteration. Then
    # goodput = 1 / (1 + o) x (1 - (R + L) / M), fed with this run's medians and means.
    out["goodput_model"] = {"formula": "goodput = 1/(1+o) * (1 - (R + L)/M)",
                            "mtbf_s": a.model_mtbf}
    for arm, res in out.items():
        if not isinstance(res, dict) or "goodput" not in res:
            continue
        rec = [x for x in res["recovery_s"] if x is not None]
        redo = [x for x in res["steps_recomputed"] if x is not None]
        if not rec or not redo:
            continue
        o = max(res["overhead"], 0.0)
        r = statistics.median(rec)
        lost = statistics.mean(redo) * res["iter_ms_median"] / 1e3
        out["goodput_model"][arm] = {"o": o, "R_s": round(r, 3), "L_s": round(lost, 3),
                             "goodput": round(1 / (1 + o) * (1 - (r + lost) / a.model_mtbf), 4)}
    out["bit_exact"] = True
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
