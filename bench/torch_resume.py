"""bench/torch_resume.py: how fast a PyTorch job is training again after a failure, cairn
against torch.distributed.checkpoint's dcp.load, on the same model, state and step.

    PYTHONPATH=build/python:tests/python python3 bench/torch_resume.py \\
        [--dim 256] [--layers 2] [--vocab 32768] [--seq 16] [--steps 6] [--after 3]
        [--rounds 3] [--threads 2] [--dir /var/tmp] [--timeout 600]

PyTorch 2.x (DCP, DTensor; Debian 13's torch 2.6: scripts/debian13.sh). The job: TPLM
(tests/python/tiny_lm.py) split 2-way tensor parallel over two processes, each its own
node (gloo for training, UCX over tcp for cairn), AdamW.

1. reference: the job trains --steps + --after steps without checkpoints; its losses.
2. saved: the job trains --steps steps with cairn.torch saving every step (replicated to
   the other node), persists the last (`flush()`, to --dir), and saves the same step with
   `dcp.save` (to --dir); each rank records a hash of every tensor of its model and
   optimizer state; then both processes are killed (SIGKILL).
3. arms, rotated in --rounds rounds, each a fresh launch that restores and trains --after
   steps (nothing saved):
     cairn_memory      both nodes' host memory as the kill left it
     cairn_peer        node 1's host memory wiped: its rank comes back from node 0's replica
     cairn_pfs         both nodes wiped: from the PFS, same layout
     dcp_load          dcp.load + set_state_dict, same layout
     cairn_dcp_memory  dcp.load + set_state_dict through cairn.dcp.StorageReader(): both
                       nodes' host memory (the same user code as dcp_load, another reader)
     cairn_dcp_pfs     the same with both nodes wiped: from cairn's PFS step
     cairn_pfs_reshard one process (world size 1, the whole model) from cairn's PFS step
     dcp_load_reshard  the same from DCP's save
   Both arms that read files read them cold: posix_fadvise(DONTNEED) on every file of
   both checkpoints before each arm. The host memory set aside for an arm (a wiped node)
   is put back after it.

Per arm (medians over rounds): restore_s (the restore call alone, model and optimizer
built, imports, process group and cairn's Checkpointer made; the slowest rank's: cairn's
`restore()`, DCP's get_state_dict + dcp.load + set_state_dict), load_s (the DCP arms: the
dcp.load call alone, the reader's part; get_state_dict makes a fresh optimizer's state
with a zero step, the same for every reader), open_s (cairn: making the
Checkpointer, which joins the job over UCX, as init_process_group does for DCP, and
meanwhile makes and faults in the fresh optimizer state the restore fills), resume_s
(from the launch of the processes to the end of the first training step after the restore,
the slowest rank), read_bytes (what the ranks read from storage during the restore,
/proc/self/io). Every resumed run is checked: the losses of the --after steps equal the
reference's bit for bit (same layout), and every restored tensor hashes as saved (the
reshard arms: the whole tensor against the saved job's gathered one); a mismatch fails the
run. Last line: one JSON object with the arms and cairn_memory_vs_dcp_load,
cairn_pfs_vs_dcp_load and cairn_pfs_reshard_vs_dcp_load_reshard (dcp's restore_s over
cairn's), and cairn_dcp_memory_vs_dcp_load and cairn_dcp_pfs_vs_dcp_load (dcp.load with
FileSystemReader against dcp.load with cairn's reader: load_s, and restore_s as
..._restore).
"""

import argparse
import hashlib
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

try:
    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict

    HAVE_DCP = True
except ImportError:  # torch 1.x
    HAVE_DCP = False

ARMS = ["cairn_memory", "cairn_peer", "cairn_pfs", "dcp_load", "cairn_dcp_memory",
        "cairn_dcp_pfs", "cairn_pfs_reshard", "dcp_load_reshard"]


def read_bytes():
    with open("/proc/self/io") as f:
        for line in f:
            if line.startswith("read_bytes:"):
                return int(line.split()[1])
    return 0


def full(t):
    return t.full_tensor() if hasattr(t, "full_tensor") else t


def state_hashes(model, opt):
    """sha256 of every tensor of the model's and the optimizer's state, whole (a DTensor
    gathered), by name."""
    out = {}
    for k, v in model.state_dict().items():
        data = full(v).detach().contiguous().numpy().tobytes()
        out["model." + k] = hashlib.sha256(data).hexdigest()
    names = {id(p): n for n, p in model.named_parameters()}
    for p, st in opt.state.items():
        for k, v in st.items():
            if torch.is_tensor(v):
                out[f"optim.{names[id(p)]}.{k}"] = hashlib.sha256(
                    full(v).detach().contiguous().reshape(-1).numpy().tobytes()).hexdigest()
    return out


def worker(a):
    import cairn.torch
    from tiny_lm import batch, loss_of
    from tp_job import tp_rank

    rank, world = int(os.environ["RANK"]), int(os.environ["WORLD_SIZE"])
    model, opt = tp_rank(a, rank, world)
    out = {"rank": rank}
    losses = {}

    def train(step):
        x, y = batch(step, 0, a.batch, a.seq, a.vocab)  # the same batch on every TP rank
        loss = loss_of(model, x, y)
        opt.zero_grad()
        loss.backward()
        opt.step()
        losses[step] = loss.item().hex()

    if a.mode == "reference":
        for step in range(1, a.steps + a.after + 1):
            train(step)
    elif a.mode == "save":
        ck = cairn.torch.Checkpointer(model, opt)
        for step in range(1, a.steps + 1):
            train(step)
            if step == a.steps:
                ck.wait_for_slot(120)
            ck.save(step)
        ck.fence()
        ck.wait_replicated(120)
        out["flushed"] = ck.flush()
        sd_model, sd_optim = get_state_dict(model, opt)
        dcp.save({"model": sd_model, "optim": sd_optim}, checkpoint_id=a.dcp_dir)
        out["hashes"] = state_hashes(model, opt)
        ck.fence()
        out["saved_step"] = a.steps
        print(json.dumps(out), flush=True)
        # The parent kills this process now: nothing is closed.
        time.sleep(3600)
    else:  # an arm
        # Model and optimizer built, imports and the process group done: the restore alone.
        if a.mode == "cairn":
            t0 = time.perf_counter()
            ck = cairn.torch.Checkpointer(model, opt)  # joins the job: its process group
            out["open_s"] = time.perf_counter() - t0
        elif a.mode == "cairn_dcp":
            import cairn.dcp

            t0 = time.perf_counter()
            ck = cairn.torch.StateCheckpointer()  # joins the job
            out["open_s"] = time.perf_counter() - t0
        dist.barrier()
        r0, t0 = read_bytes(), time.perf_counter()
        if a.mode == "cairn" and a.profile and rank == 0:
            import cProfile
            import pstats

            prof = cProfile.Profile()
            step = prof.runcall(ck.restore)
            out["tier"] = ck.last_report.tier
            pstats.Stats(prof, stream=sys.stderr).sort_stats("cumulative").print_stats(25)
        elif a.mode == "cairn":
            step = ck.restore()
            out["tier"] = ck.last_report.tier
        else:
            sd_model, sd_optim = get_state_dict(model, opt)
            state = {"model": sd_model, "optim": sd_optim}
            t1 = time.perf_counter()
            if a.mode == "cairn_dcp":
                reader = cairn.dcp.StorageReader(checkpointer=ck)
                dcp.load(state, storage_reader=reader)
                rep = reader.report()
                out["tier"], step = rep["tier"], rep["step"]
                out["reader"] = {k: rep[k] for k in ("metadata_s", "read_data_s", "restore_s")}
            else:
                dcp.load(state, checkpoint_id=a.dcp_dir)
                step = a.steps
            out["load_s"] = time.perf_counter() - t1
            set_state_dict(model, opt, model_state_dict=state["model"],
                           optim_state_dict=state["optim"])
        out["restore_s"] = time.perf_counter() - t0
        out["read_bytes"] = read_bytes() - r0
        out["step"] = step
        out["hashes"] = state_hashes(model, opt)
        train(step + 1)
        out["first_step_wall"] = time.time()
        for s in range(step + 2, step + a.after + 1):
            train(s)
        if a.mode.startswith("cairn"):
            ck.close()
    out["losses"] = losses
    if a.mode != "save":
        print(json.dumps(out), flush=True)
    dist.destroy_process_group()
    return 0


def evict(paths):
    """Drops every file under `paths` from the page cache (fsync'd first), so the next
    read goes to the disk."""
    for top in paths:
        for d, _, files in os.walk(top):
            for f in files:
                try:
                    fd = os.open(os.path.join(d, f), os.O_RDONLY)
                except OSError:
                    continue
                try:
                    os.fsync(fd)  # dirty pages are not dropped
                    os.posix_fadvise(fd, 0, 0, os.POSIX_FADV_DONTNEED)
                finally:
                    os.close(fd)


class Run:
    def __init__(self, a):
        self.a = a
        self.root = tempfile.mkdtemp(prefix="cairn-bench-resume-", dir=a.dir)
        self.shm = tempfile.mkdtemp(prefix="cairn-bench-resume-", dir="/dev/shm")
        self.job = f"resume-{os.getpid()}"
        self.host = os.path.join(self.shm, "host")
        self.dcp_dir = os.path.join(self.root, "dcp")
        self.pfs = os.path.join(self.root, "pfs")
        self.launches = 0
        os.makedirs(self.dcp_dir)

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)
        shutil.rmtree(self.shm, ignore_errors=True)

    def launch(self, mode, world, wait=True):
        """Starts `world` ranks in `mode`; returns (spawn time, their JSON objects)."""
        self.launches += 1
        init = os.path.join(self.root, f"init-{self.launches}")
        args = [sys.executable, os.path.abspath(__file__), "--worker", "--mode", mode,
                "--init", init, "--dcp-dir", self.dcp_dir, "--threads",
                str(max(1, self.a.threads // world))]
        for k in ("dim", "layers", "vocab", "seq", "batch", "steps", "after"):
            args += [f"--{k}", str(getattr(self.a, k))]
        if self.a.profile:
            args.append("--profile")
        t0 = time.time()
        procs = []
        for r in range(world):
            env = dict(os.environ, RANK=str(r), WORLD_SIZE=str(world), LOCAL_RANK="0",
                       LOCAL_WORLD_SIZE="1", GROUP_RANK=str(r), CAIRN_NODE=str(r),
                       CAIRN_JOB_ID=self.job, CAIRN_HOST_ROOT=self.host,
                       CAIRN_PFS_ROOT=self.pfs, CAIRN_PERSIST_EVERY="0",
                       CAIRN_CONNECT_TIMEOUT_S="60", USE_LIBUV="0",
                       UCX_TLS=os.environ.get("UCX_TLS", "tcp"),
                       PYTHONWARNINGS=os.environ.get("PYTHONWARNINGS", "ignore"))
            procs.append(subprocess.Popen(args, env=env, stdout=subprocess.PIPE, text=True))
        if not wait:
            return t0, procs
        deadline = time.monotonic() + self.a.timeout
        outs = []
        for r, p in enumerate(procs):
            try:
                text, _ = p.communicate(timeout=max(1, deadline - time.monotonic()))
            except subprocess.TimeoutExpired:
                for q in procs:
                    q.kill()
                sys.exit(f"torch_resume: {mode}: rank {r} did not finish in {self.a.timeout} s")
            if p.returncode != 0:
                for q in procs:
                    q.kill()
                sys.exit(f"torch_resume: {mode}: rank {r} failed (exit {p.returncode}):\n{text}")
            outs.append(json.loads(text.strip().splitlines()[-1]))
        return t0, outs

    def save(self):
        """The saved job, killed once every tier holds its last step."""
        _, procs = self.launch("save", 2, wait=False)
        outs = []
        for r, p in enumerate(procs):
            line = p.stdout.readline()
            if not line:
                p.wait()
                sys.exit(f"torch_resume: the saving rank {r} ended (exit {p.returncode})")
            outs.append(json.loads(line))
        for p in procs:
            p.send_signal(signal.SIGKILL)
            p.wait()
        return outs

    def node_dir(self, node):
        return os.path.join(self.host, self.job, f"node-{node}")

    def set_aside(self, nodes):
        for n in nodes:
            os.rename(self.node_dir(n), self.node_dir(n) + ".aside")

    def put_back(self, nodes):
        for n in nodes:
            shutil.rmtree(self.node_dir(n), ignore_errors=True)
            os.rename(self.node_dir(n) + ".aside", self.node_dir(n))


def main():
    p = argparse.ArgumentParser(description=__doc__.split("\n\n")[0],
                                formatter_class=argparse.RawDescriptionHelpFormatter,
                                epilog=__doc__.split("\n\n", 2)[2])
    p.add_argument("--dim", type=int, default=256)
    p.add_argument("--layers", type=int, default=2)
    p.add_argument("--vocab", type=int, default=32768)
    p.add_argument("--seq", type=int, default=16)
    p.add_argument("--batch", type=int, default=1)
    p.add_argument("--steps", type=int, default=6, help="steps trained before the kill")
    p.add_argument("--after", type=int, default=3, help="steps trained after each restore")
    p.add_argument("--rounds", type=int, default=3)
    p.add_argument("--threads", type=int, default=2, help="torch threads in all")
    p.add_argument("--dir", default="/var/tmp", help="where both checkpoints are written")
    p.add_argument("--timeout", type=float, default=600, help="seconds a launch may take")
    p.add_argument("--arms", default=",".join(ARMS), help="the arms to run (comma-separated)")
    p.add_argument("--profile", action="store_true",
                   help="print a profile of rank 0's cairn restore calls (stderr)")
    p.add_argument("--worker", action="store_true", help=argparse.SUPPRESS)
    p.add_argument("--mode", help=argparse.SUPPRESS)
    p.add_argument("--init", help=argparse.SUPPRESS)
    p.add_argument("--dcp-dir", help=argparse.SUPPRESS)
    a = p.parse_args()
    if a.worker:
        return worker(a)
    if not HAVE_DCP:
        print(json.dumps({"bench": "torch_resume", "skipped": "needs PyTorch 2.x (DCP)",
                          "torch": torch.__version__}))
        return 0
    run = Run(a)
    try:
        return measure(a, run)
    finally:
        run.close()


def measure(a, run):
    _, ref = run.launch("reference", 2)
    want = {int(k): v for k, v in ref[0]["losses"].items()}
    saved = run.save()
    step = a.steps
    if any(s["flushed"] != step for s in saved):
        sys.exit(f"torch_resume: the PFS holds step {[s['flushed'] for s in saved]}, not {step}")
    saved_hashes = saved[0]["hashes"]
    arms = [x for x in a.arms.split(",") if x]
    unknown = [x for x in arms if x not in ARMS]
    if unknown:
        sys.exit(f"torch_resume: unknown arm(s) {unknown}; the arms: {', '.join(ARMS)}")
    results = {arm: {"restore_s": [], "resume_s": [], "read_bytes": []} for arm in arms}
    for r in range(a.rounds):
        for arm in arms[r % len(arms):] + arms[: r % len(arms)]:
            aside = {"cairn_peer": [1], "cairn_pfs": [0, 1], "cairn_dcp_pfs": [0, 1],
                     "cairn_pfs_reshard": [0, 1]}.get(arm, [])
            evict([run.pfs, run.dcp_dir])
            run.set_aside(aside)
            try:
                world = 1 if arm.endswith("reshard") else 2
                mode = ("cairn_dcp" if arm.startswith("cairn_dcp") else
                        "cairn" if arm.startswith("cairn") else "dcp")
                t0, outs = run.launch(mode, world)
            finally:
                run.put_back(aside)
            for o in outs:
                if o["step"] != step:
                    sys.exit(f"torch_resume: {arm}: rank {o['rank']} restored step {o['step']}, "
                             f"not {step}")
                if o["hashes"] != saved_hashes:
                    bad = sorted(k for k in saved_hashes if o["hashes"].get(k) != saved_hashes[k])
                    sys.exit(f"torch_resume: {arm}: rank {o['rank']} restored tensors that differ "
                             f"from the saved ones: {bad[:5]}")
                if world == 2:
                    got = {int(k): v for k, v in o["losses"].items()}
                    for s, v in got.items():
                        if want[s] != v:
                            sys.exit(f"torch_resume: {arm}: step {s}'s loss {float.fromhex(v)} "
                                     f"is not the reference's {float.fromhex(want[s])}")
                want_tier = {"cairn_memory": "host", "cairn_dcp_memory": "host", "cairn_pfs": "pfs",
                             "cairn_dcp_pfs": "pfs"}.get(arm)
                if want_tier and o.get("tier") != want_tier:
                    sys.exit(f"torch_resume: {arm} restored from {o.get('tier')}")
            if arm == "cairn_peer" and outs[1].get("tier") != "peer":
                sys.exit(f"torch_resume: node 1 came back from {outs[1].get('tier')}, not peer")
            res = results[arm]
            res["restore_s"].append(max(o["restore_s"] for o in outs))
            res.setdefault("restore_s_ranks", []).append([round(o["restore_s"], 4) for o in outs])
            res["resume_s"].append(max(o["first_step_wall"] for o in outs) - t0)
            res["read_bytes"].append(sum(o["read_bytes"] for o in outs))
            for k in ("open_s", "load_s"):
                if k in outs[0]:
                    res.setdefault(k, []).append(max(o[k] for o in outs))
            if "reader" in outs[0]:  # where a dcp.load through cairn's reader goes
                res.setdefault("reader", []).append(
                    {k: round(max(o["reader"][k] for o in outs), 4) for k in outs[0]["reader"]})
    med = statistics.median
    out = {"bench": "torch_resume", "torch": torch.__version__,
           "model": "TPLM, 2-way tensor parallel",
           "steps": step, "rounds": a.rounds,
           "state_bytes_hashed": len(saved_hashes)}
    for arm, res in results.items():
        out[arm] = {"restore_s": round(med(res["restore_s"]), 4),
                    "resume_s": round(med(res["resume_s"]), 3),
                    "read_bytes": int(med(res["read_bytes"]))}
        for k in ("open_s", "load_s"):
            if k in res:
                out[arm][k] = round(med(res[k]), 4)
        out[arm]["restore_s_ranks"] = res["restore_s_ranks"]  # per round, per rank
        if "reader" in res:
            out[arm]["reader_s"] = res["reader"]  # per round, the slowest rank's
    for c, d in (("cairn_memory", "dcp_load"), ("cairn_pfs", "dcp_load"),
                 ("cairn_pfs_reshard", "dcp_load_reshard")):
        if c not in out or d not in out:
            continue
        out[f"{c}_vs_{d}"] = round(out[d]["restore_s"] / max(out[c]["restore_s"], 1e-9), 2)
    for c in ("cairn_dcp_memory", "cairn_dcp_pfs"):
        if c in out and "dcp_load" in out:
            out[f"{c}_vs_dcp_load"] = round(
                out["dcp_load"]["load_s"] / max(out[c]["load_s"], 1e-9), 2)
            out[f"{c}_vs_dcp_load_restore"] = round(
                out["dcp_load"]["restore_s"] / max(out[c]["restore_s"], 1e-9), 2)
    out["bit_exact"] = True
    for arm in arms:
        print(f"{arm}: restore {out[arm]['restore_s'] * 1e3:.1f} ms, resume "
              f"{out[arm]['resume_s']:.2f} s, read {out[arm]['read_bytes'] / 1e6:.1f} MB")
    print(json.dumps(out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
