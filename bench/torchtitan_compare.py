"""bench/torchtitan_compare.py: torchtitan's own trainer checkpointing through cairn's
manager every step, against torchtitan's DCP manager in its async modes, in torchtitan's
own terms: the time its training loop spends in the checkpointer, the iteration, and the
resume.

    PYTHONPATH=build/python:tests/python .venv/bin/python bench/torchtitan_compare.py \\
        [--steps 40] [--rounds 2] [--warmup 5] [--dir /var/tmp] [--cuda]

The job: torchtitan's llama3 debug model, FSDP2 over 2 processes (gloo, the CPU, each
process its own node), tests/python/frameworks_child.py's torchtitan run. Arms, alternated
in every round, each a fresh job of --steps steps:
  none              torchtitan without checkpoints: the iteration the others are measured
                    against (taken in the same round)
  cairn_1           cairn.torchtitan.CheckpointManager, a save every step (its default):
                    host memory, a replica on the other node, every 10th version drained
                    to --dir
  cairn_1_blocks    cairn's manager in one job of 2 x --steps steps that saves every step
                    in every other block of 10 steps: its overhead_in_job compares the
                    iterations of its saving blocks with those of its quiet ones (past
                    their first 3 steps), so no job-to-job difference enters it
  titan_async_K     torchtitan's DCP manager, async_mode "async" (DCP's async_save in a
                    thread; each save waits for the previous one first), every K steps
                    (1 and 10), to --dir, keep_latest_k 2
  titan_pinned_K    async_mode "async_with_pinned_mem" (the mode torchtitan recommends):
                    it needs CUDA pinned memory, so on a machine without a GPU the arm
                    records the error it stops with
--cuda runs torchtitan as it ships on one GPU, one rank (no replica: cairn's arm keeps host
memory and the drain).
Per arm: the median iteration (rank 0's time between consecutive steps, the warm-up and the
last step, which saves synchronously, left out) and its overhead against none's; the stall,
the seconds the training loop spends in checkpointer.save() and maybe_wait_for_staging()
per save; cairn's replication lag (steps between the newest trained and the newest
replicated, rank 0, from its loss log); and the resume: a second job continuing the first,
its seconds in checkpointer.load() (cairn: from host memory; torchtitan: its DCP folder).
Last line: one JSON object.
"""

import argparse
import glob
import json
import os
import shutil
import socket
import statistics
import subprocess
import sys
import tempfile

BLOCK = 10  # cairn_1_blocks: steps per block, saving and quiet blocks alternated
HERE = os.path.dirname(os.path.abspath(__file__))
CHILD = os.path.join(HERE, "..", "tests", "python", "frameworks_child.py")


def free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class Run:
    """One arm's job: its directories (host tier in /dev/shm, checkpoints under --dir)."""

    def __init__(self, arm, args, n):
        self.arm, self.args = arm, args
        self.id = f"titan-{arm}-{os.getpid()}-{n}"
        self.shm = tempfile.mkdtemp(prefix=f"cairn-bench-{arm}-", dir="/dev/shm")
        self.disk = tempfile.mkdtemp(prefix=f"cairn-bench-{arm}-", dir=args.dir)

    def launch(self, steps, flags):
        port = str(free_port())
        procs = []
        for rank in range(self.args.world):
            env = dict(os.environ)
            env.update({
                "RANK": str(rank), "WORLD_SIZE": str(self.args.world), "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1", "GROUP_RANK": str(rank), "CAIRN_NODE": str(rank),
                "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port, "USE_LIBUV": "0",
                "TORCHELASTIC_RUN_ID": self.id, "OMP_NUM_THREADS": "1", "UCX_TLS": "tcp",
                "CAIRN_JOB_ID": self.id, "CAIRN_HOST_ROOT": os.path.join(self.shm, "host"),
                "CAIRN_PFS_ROOT": os.path.join(self.disk, "pfs"), "CAIRN_PERSIST_EVERY": "10",
            })
            if self.args.world == 1:
                env["CAIRN_REPLICAS"] = "0"  # no other node to hold a replica
            env.update(kv.split("=", 1) for kv in self.args.cairn_env)
            cmd = [sys.executable, CHILD, "torchtitan", "--assets", self.args.assets,
                   "--steps", str(steps), "--out", os.path.join(self.shm, "losses"),
                   "--workdir", os.path.join(self.disk, "work"),
                   "--timing", os.path.join(self.shm, f"timing{steps}"), *flags,
                   *(["--cuda"] if self.args.cuda else [])]
            procs.append(subprocess.Popen(cmd, env=env, stdout=subprocess.PIPE,
                                          stderr=subprocess.STDOUT, text=True))
        outs = [p.communicate(timeout=900)[0] for p in procs]
        failed = [(r, p.returncode) for r, p in enumerate(procs) if p.returncode]
        return outs, failed

    def timing(self, steps, rank=0):
        with open(os.path.join(self.shm, f"timing{steps}-{rank}")) as f:
            return [json.loads(line) for line in f]

    def close(self):
        shutil.rmtree(self.shm, ignore_errors=True)
        shutil.rmtree(self.disk, ignore_errors=True)


def why_failed(outs):
    for text in outs:
        for line in reversed(text.splitlines()):
            if "Error" in line or "error" in line:
                return line.split("]: ", 1)[-1].strip()[:300]
    return outs[0][-300:]


def measure(run, steps, interval, warmup):
    rows = run.timing(steps)
    t = {r["step"]: r["t"] for r in rows}
    window = [r for r in rows if warmup < r["step"] < steps]
    iters = [t[r["step"]] - t[r["step"] - 1] for r in window]
    # A line for step s holds what was spent since step s-1's line: the save of step s-1
    # and the fence (maybe_wait_for_staging) of step s.
    saves = sum(1 for r in window if interval and (r["step"] - 1) % interval == 0)
    stall = sum(r["save"] + r["maybe_wait_for_staging"] for r in window)
    return {"iteration_s": statistics.median(iters),
            "stall_per_save_s": stall / saves if saves else None, "saves": saves}


def measure_blocks(run, steps, block):
    """cairn_1_blocks: one job saving every step in every other block of `block` steps.
    Iteration s (the time between steps s-1 and s) is a saving one when both steps are in a
    saving block; a quiet one when both are in a quiet block, past its first 3 steps (the
    last saving block's background work, its replica and drain, may spill into them) and
    past the first block (the warm-up)."""
    rows = run.timing(steps)
    t = {r["step"]: r["t"] for r in rows}
    saving, quiet, stall, saves = [], [], 0.0, 0
    for r in rows:
        s = r["step"]
        if s - 1 not in t or s >= steps:
            continue
        b, pos = divmod(s, block)
        if b % 2 == 1 and pos >= 1:
            saving.append(t[s] - t[s - 1])
            stall += r["save"] + r["maybe_wait_for_staging"]
            saves += 1
        elif b % 2 == 0 and b >= 2 and pos >= 3:
            quiet.append(t[s] - t[s - 1])
    a, q = statistics.median(saving), statistics.median(quiet)
    return {"iteration_s": a, "quiet_iteration_s": q, "overhead_in_job": a / q - 1,
            "stall_per_save_s": stall / saves, "saves": saves}


def replication_lag(run, steps, warmup):
    """cairn: how many steps rank 0's newest replicated step trailed the step it had just
    trained (the median past the warm-up, and the most), from its loss log: what losing its
    node would redo (CAIRN_REPLICATE_SHARE paces the pushes)."""
    lags = []
    with open(os.path.join(run.shm, "losses-0")) as f:
        for line in f:
            step, _, rep = line.split()
            if warmup < int(step) <= steps and int(rep) >= 0:
                lags.append(int(step) - int(rep))
    return {"replication_lag_steps": statistics.median(lags) if lags else None,
            "replication_lag_steps_max": max(lags) if lags else None}


def state_bytes(run):
    steps = glob.glob(os.path.join(run.disk, "work", "checkpoint", "step-*"))
    if not steps:
        return None
    newest = max(steps, key=lambda p: int(p.rsplit("-", 1)[1]))
    return sum(os.path.getsize(p) for p in glob.glob(os.path.join(newest, "*")))


def main():
    p = argparse.ArgumentParser(description=__doc__,
                                formatter_class=argparse.RawDescriptionHelpFormatter)
    p.add_argument("--steps", type=int, default=40)
    p.add_argument("--rounds", type=int, default=2)
    p.add_argument("--warmup", type=int, default=5)
    p.add_argument("--dir", default="/var/tmp", help="torchtitan's checkpoint folder and "
                   "cairn's PFS go under it")
    p.add_argument("--cuda", action="store_true", help="on the GPU, one rank (one GPU): "
                   "torchtitan as it ships, no CPU shims, no replica")
    p.add_argument("--arms", default=None, help="comma-separated arms to run (default all)")
    p.add_argument("--cairn-env", action="append", default=[], metavar="NAME=VALUE",
                   help="a cairn setting for the cairn arm (repeatable)")
    args = p.parse_args()
    args.world = 1 if args.cuda else 2

    assets = tempfile.mkdtemp(prefix="cairn-bench-titan-assets-", dir="/dev/shm")
    args.assets = assets
    subprocess.run([sys.executable, CHILD, "titan-assets", "--out", assets], check=True)
    arms = {
        "none": (["--no-cairn"], 0),
        "cairn_1": (["--interval", "1"], 1),
        "cairn_1_blocks": (["--interval", "1", "--save-blocks", str(BLOCK)], 1),
        "titan_async_1": (["--titan-async", "async", "--interval", "1"], 1),
        "titan_async_10": (["--titan-async", "async", "--interval", "10"], 10),
        "titan_pinned_1": (["--titan-async", "async_with_pinned_mem", "--interval", "1"], 1),
        "titan_pinned_10": (["--titan-async", "async_with_pinned_mem", "--interval", "10"],
                            10),
    }
    if args.arms:
        arms = {k: v for k, v in arms.items() if k in args.arms.split(",") or k == "none"}
    results = {arm: [] for arm in arms}
    refused, sizes = {}, {}
    n = 0
    try:
        for rnd in range(args.rounds):
            order = list(arms) if rnd % 2 == 0 else list(reversed(arms))
            for arm in order:
                if arm in refused:
                    continue
                flags, interval = arms[arm]
                n += 1
                run = Run(arm, args, n)
                try:
                    steps = args.steps * 2 if arm == "cairn_1_blocks" else args.steps
                    outs, failed = run.launch(steps, flags)
                    if failed:
                        refused[arm] = why_failed(outs)
                        print(f"{arm}: stopped ({failed}): {refused[arm]}", flush=True)
                        continue
                    if arm == "cairn_1_blocks":
                        r = measure_blocks(run, steps, BLOCK)
                    else:
                        r = measure(run, args.steps, interval, args.warmup)
                    if arm.startswith("cairn"):
                        r.update(replication_lag(run, steps, args.warmup))
                    if arm not in ("none", "cairn_1_blocks"):
                        sizes.setdefault(arm, state_bytes(run))
                        outs, failed = run.launch(args.steps + 2, flags)
                        if failed:
                            raise RuntimeError(f"{arm}: the resumed job failed:\n{outs[0]}")
                        r["resume_s"] = run.timing(args.steps + 2)[0]["load"]
                    results[arm].append(r)
                    print(f"round {rnd} {arm}: {json.dumps(r)}", flush=True)
                finally:
                    run.close()
    finally:
        shutil.rmtree(assets, ignore_errors=True)

    out = {"bench": "torchtitan_compare", "steps": args.steps, "rounds": args.rounds,
           "device": "cuda" if args.cuda else "cpu", "world": args.world, "arms": {}}
    base = [r["iteration_s"] for r in results["none"]]
    for arm, rs in results.items():
        if arm in refused:
            out["arms"][arm] = {"refused": refused[arm]}
            continue
        if not rs:
            continue
        a = {"iteration_s": statistics.median(r["iteration_s"] for r in rs)}
        if arm.startswith("cairn") and rs[0].get("replication_lag_steps") is not None:
            a["replication_lag_steps"] = statistics.median(r["replication_lag_steps"] for r in rs)
            a["replication_lag_steps_max"] = max(r["replication_lag_steps_max"] for r in rs)
        if arm == "cairn_1_blocks":
            for k in ("quiet_iteration_s", "overhead_in_job", "stall_per_save_s"):
                a[k] = statistics.median(r[k] for r in rs)
            a["overhead_in_job_per_round"] = [r["overhead_in_job"] for r in rs]
        elif arm != "none":
            # Each round's arm against that round's none.
            a["overhead_per_round"] = [r["iteration_s"] / b - 1 for r, b in zip(rs, base)]
            a["overhead"] = statistics.median(a["overhead_per_round"])
            a["stall_per_save_s"] = statistics.median(r["stall_per_save_s"] for r in rs)
            a["resume_s"] = statistics.median(r["resume_s"] for r in rs)
            if sizes.get(arm):
                a["checkpoint_bytes"] = sizes[arm]
        out["arms"][arm] = a
    c = out["arms"].get("cairn_1", {})
    for peer in ("titan_async_1", "titan_async_10", "titan_pinned_1"):
        s = out["arms"].get(peer, {}).get("stall_per_save_s")
        if s and c.get("stall_per_save_s"):
            out[f"stall_ratio_vs_{peer}"] = s / c["stall_per_save_s"]
    print(json.dumps(out))


if __name__ == "__main__":
    main()
