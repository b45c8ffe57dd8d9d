"""cairn.torch on a real PyTorch training run (Debian's python3-torch, CPU).

Each test trains TinyLM (tiny_lm.py) in child processes (torch_train.py), kills one with
SIGKILL at a random step, restarts and checks that the loss at every later step equals an
uninterrupted run's bit for bit."""

import atexit
import copy
import os
import random
import shutil
import signal
import subprocess
import sys
import tempfile
import time
import unittest

# Every process that imports torch.distributed's nn package leaves a directory in TMPDIR
# (PyTorch's _remote_module_non_scriptable.py). This test's processes, children included,
# make theirs in one directory, removed when the test ends.
_TMP = tempfile.mkdtemp(prefix="cairn-test-pytmp-")
os.environ["TMPDIR"] = _TMP
tempfile.tempdir = _TMP
atexit.register(shutil.rmtree, _TMP, True)

import torch  # noqa: E402

HERE = os.path.dirname(os.path.abspath(__file__))
STEPS = 300


def read_losses(path):
    """{step: (loss hex, newest replicated step)} of a --out file (a later line wins):
    torch_train.py writes "<step> <hex> <replicated>", tp_child.py "<step> <hex>" (None)."""
    out = {}
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                parts = line.split()
                if len(parts) == 3 or (len(parts) == 2 and line.endswith("\n")):
                    out[int(parts[0])] = (parts[1], int(parts[2]) if len(parts) == 3 else None)
    return out


def read_step_losses(path):
    """{step: loss hex} of a --out file."""
    return {s: h for s, (h, _) in read_losses(path).items()}


class Job:
    """A temporary job: host tier, PFS, rendezvous; removed at the end."""

    def __init__(self, tag):
        self.root = tempfile.mkdtemp(prefix=f"cairn-test-py{tag}-", dir="/dev/shm")
        self.id = f"py{tag}-{os.getpid()}-{random.randrange(1 << 30)}"
        self.launches = 0

    def env(self, rank=0, world=1, extra=None):
        e = dict(os.environ)
        e.update(
            {
                "CAIRN_JOB_ID": self.id,
                "CAIRN_HOST_ROOT": os.path.join(self.root, "host"),
                "CAIRN_PFS_ROOT": os.path.join(self.root, "pfs"),
                "CAIRN_PERSIST_EVERY": "50",
                "CAIRN_SLOTS": "4",
                "CAIRN_CONNECT_TIMEOUT_S": "60",
                "CAIRN_OP_TIMEOUT_S": "60",
                "CAIRN_REPLICATE_TIMEOUT_S": "10",
                "RANK": str(rank),
                "WORLD_SIZE": str(world),
                "LOCAL_RANK": "0",
                "LOCAL_WORLD_SIZE": "1",
                "GROUP_RANK": str(rank),
                "CAIRN_NODE": str(rank),
                "UCX_TLS": "tcp",
            }
        )
        e.update(extra or {})
        return e

    def start(self, out, rank=0, world=1, args=(), log=None):
        cmd = [sys.executable, os.path.join(HERE, "torch_train.py"), "--steps", str(STEPS),
               "--out", out, *args]
        return subprocess.Popen(cmd, env=self.env(rank, world), stdout=log or subprocess.PIPE,
                                stderr=subprocess.STDOUT, text=True)

    def close(self):
        shutil.rmtree(self.root, ignore_errors=True)


def finish_ranks(test, procs, what):
    """The ranks' outputs once every one has exited; fails `test` naming each rank that
    exited non-zero, with its output."""
    outs = [p.communicate(timeout=300)[0] for p in procs]
    failed = [f"rank {r} (exit {p.returncode}):\n{text}"
              for r, (p, text) in enumerate(zip(procs, outs)) if p.returncode != 0]
    test.assertFalse(failed, f"{what}:\n" + "\n".join(failed))
    return outs


def kill_once_replicated(procs, out, kill_at, jitter_s):
    """Waits until every rank has logged `kill_at` steps to its --out file (<out>-<rank>)
    with step 2 or later replicated (or a rank exited), sleeps up to `jitter_s`, SIGKILLs
    every rank; returns (the last step every rank logged, the ranks' outputs)."""

    def far_enough():
        logs = [read_losses(f"{out}-{r}") for r in range(len(procs))]
        return all(len(l) >= kill_at and l[max(l)][1] >= 2 for l in logs) or any(
            p.poll() is not None for p in procs)

    wait_for(far_enough, 300, f"step {kill_at} with replicas")
    time.sleep(random.random() * jitter_s)
    for p in procs:
        p.send_signal(signal.SIGKILL)
    outs = [p.communicate()[0] for p in procs]
    return min(max(read_step_losses(f"{out}-{r}")) for r in range(len(procs))), outs


def wait_for(pred, timeout, what):
    deadline = time.time() + timeout
    while not pred():
        if time.time() > deadline:
            raise AssertionError(f"timed out waiting for {what}")
        time.sleep(0.05)


class TorchTraining(unittest.TestCase):
    def setUp(self):
        self.job = Job(self.id().split(".")[-1][:12])
        self.addCleanup(self.job.close)

    def run_to_end(self, procs):
        outs = []
        for p in procs:
            text, _ = p.communicate(timeout=600)
            outs.append(text)
            self.assertEqual(p.returncode, 0, text)
        return outs

    def test_killed_run_resumes_with_the_same_loss_at_every_later_step(self):
        self.killed_run_resumes_bit_exact([])

    def killed_run_resumes_bit_exact(self, args):
        ref = os.path.join(self.job.root, "ref.txt")
        self.run_to_end([self.job.start(ref, args=["--no-cairn", *args])])
        want = read_losses(ref)
        self.assertEqual(len(want), STEPS)

        out = os.path.join(self.job.root, "run.txt")
        kill_at = random.randrange(40, STEPS - 40)
        p = self.job.start(out, args=args)
        wait_for(lambda: len(read_losses(out)) >= kill_at or p.poll() is not None, 300,
                 f"step {kill_at}")
        time.sleep(random.random() * 0.02)  # somewhere inside an iteration
        p.send_signal(signal.SIGKILL)
        p.communicate()
        logged = max(read_losses(out))
        self.assertLess(logged, STEPS, "the run ended before it was killed")

        text = self.run_to_end([self.job.start(out, args=args)])[0]
        restored = [l.split() for l in text.splitlines() if l.startswith("restored ")]
        self.assertEqual(len(restored), 1, text)
        step, tier, extra = int(restored[0][1]), restored[0][3], int(restored[0][5])
        self.assertEqual(tier, "host")
        self.assertEqual(extra, step, "the user dict saved with the version")
        # save(t) is queued after step t's optimizer step; step t+1's fence completes its
        # copy, so at most the last one or two logged steps can be lost.
        self.assertGreaterEqual(step, logged - 2)
        got = read_losses(out)
        self.assertEqual(len(got), STEPS)
        for s in range(1, STEPS + 1):
            self.assertEqual(got[s][0], want[s][0], f"loss at step {s} (restored {step})")
        if "cuda" in args:  # torch_train.py's last line: how the host slots were pinned
            pins = [l.split() for l in text.splitlines() if l.startswith("slots pinned ")]
            self.assertEqual(len(pins), 1, text)
            pinned, refused, engine = int(pins[0][2]), int(pins[0][4]), pins[0][6]
            self.assertEqual(engine, "cuda", text)
            self.assertGreater(pinned, 0, text)
            self.assertEqual(refused, 0, f"host slots the driver refused to pin:\n{text}")

    @unittest.skipUnless(
        torch.cuda.is_available() and int(torch.__version__.split(".")[0]) >= 2,
        "needs a CUDA device and PyTorch 2.x",
    )
    def test_gpu_bf16_run_killed_and_resumed_has_the_same_loss_at_every_later_step(self):
        # TinyLM in bf16 on the GPU, AdamW, deterministic kernels: cairn captures the CUDA
        # tensors ordered with the training stream and restores them into device memory.
        self.killed_run_resumes_bit_exact(["--device", "cuda", "--dtype", "bfloat16"])

    def test_two_ranks_one_killed_and_wiped_comes_back_from_its_peer(self):
        # Half the single-rank test's steps: three launches of two ranks each (the reference,
        # the run killed, the resumed run) took 120 s of CI at 300.
        steps = 150

        def ddp(tag, out_tag, args=()):
            init = os.path.join(self.job.root, f"ddp-{tag}")  # a fresh one per launch
            outs = [os.path.join(self.job.root, f"{out_tag}-{r}.txt") for r in range(2)]
            return outs, [
                self.job.start(outs[r], r, 2,
                               ["--ddp-init", init, "--steps", str(steps), *args])
                for r in range(2)
            ]

        ref_outs, procs = ddp("ref", "ref", ["--no-cairn"])
        self.run_to_end(procs)
        want = [read_losses(o) for o in ref_outs]
        self.assertNotEqual(want[0][1][0], want[1][1][0], "the ranks see different data")

        outs, procs = ddp("run", "run")
        kill_at = random.randrange(40, steps - 60)

        def replicated():
            return all(
                len(read_losses(o)) >= kill_at and read_losses(o)[max(read_losses(o))][1] >= 10
                for o in outs
            ) or any(p.poll() is not None for p in procs)

        wait_for(replicated, 300, f"step {kill_at} with replicas")
        time.sleep(random.random() * 0.02)
        procs[1].send_signal(signal.SIGKILL)  # node 1 dies ...
        procs[1].communicate()
        procs[0].send_signal(signal.SIGKILL)  # ... and the job restarts
        procs[0].communicate()
        shutil.rmtree(os.path.join(self.job.root, "host", self.job.id, "node-1"))

        _, procs = ddp("resume", "run")  # appends to the same loss files
        texts = self.run_to_end(procs)
        reports = []
        for t in texts:
            lines = [l.split() for l in t.splitlines() if l.startswith("restored ")]
            self.assertEqual(len(lines), 1, t)
            reports.append((int(lines[0][1]), lines[0][3]))
        self.assertEqual(reports[0][0], reports[1][0])
        self.assertEqual(reports[0][1], "host")
        self.assertEqual(reports[1][1], "peer", "node 1 came back from node 0's memory")
        for r in range(2):
            got = read_losses(outs[r])
            self.assertEqual(len(got), steps)
            for s in range(1, steps + 1):
                self.assertEqual(got[s][0], want[r][s][0], f"rank {r} loss at step {s}")


def _has_dtensor():
    """PyTorch 2.x with DTensor, device meshes and tensor parallelism (not Debian 12's 1.13)."""
    try:
        import torch.distributed.device_mesh  # noqa: F401
        import torch.distributed.tensor.parallel  # noqa: F401
    except ImportError:
        return False
    return torch.distributed.is_available()


class QuickStart(unittest.TestCase):
    """The README's quick-start as a new user runs it (quickstart_child.py): TinyLM with
    0.22 GB of weights and AdamW state, every setting at its default but where the files
    go, a save every step, and a PFS slower than an iteration (100 MB/s for this rank: a
    drain holds its slot for about four iterations). No version is skipped (with 2 slots, the
    old default, 4 of 24 were), and a run stopped abruptly after the save of step 14 comes
    back from step 13 or 14."""

    def test_defaults_skip_no_version_and_a_stopped_run_resumes_from_its_last_steps(self):
        job = Job("quick")
        self.addCleanup(job.close)
        env = {k: v for k, v in os.environ.items() if not k.startswith("CAIRN_")}
        env.update({"CAIRN_JOB_ID": job.id, "CAIRN_HOST_ROOT": os.path.join(job.root, "host"),
                    "CAIRN_PFS_ROOT": os.path.join(job.root, "pfs"), "CAIRN_PERSIST_RATE": "100M"})
        child = [sys.executable, os.path.join(HERE, "quickstart_child.py"), "--steps", "24"]

        def run(*args):
            p = subprocess.run(child + list(args), env=env, stdout=subprocess.PIPE,
                               stderr=subprocess.STDOUT, text=True, timeout=600)
            self.assertEqual(p.returncode, 0, p.stdout)
            return p.stdout

        first = run("--stop-at", "14")
        self.assertIn("skipped 0 of 14", first)
        second = run()
        restored = [int(l.split()[1]) for l in second.splitlines() if l.startswith("restored ")]
        self.assertEqual(len(restored), 1, second)
        self.assertIn(restored[0], (13, 14), second)
        self.assertIn(f"skipped 0 of {24 - restored[0]}", second)


def _has_dcp_flatten():
    try:
        import torch.distributed.checkpoint._nested_dict  # noqa: F401
    except ImportError:
        return False
    return True


@unittest.skipUnless(_has_dtensor(), "needs PyTorch 2.x with DTensor (scripts/debian13.sh)")
class DTensorState(unittest.TestCase):
    """DTensors of every placement on a 2-D (dp, tp) mesh and a tensor-parallel MLP, saved
    by 4 processes and restored from the PFS into other meshes and world sizes
    (dtensor_child.py), bit-exact."""

    def setUp(self):
        self.job = Job("dtensor")
        self.addCleanup(self.job.close)

    def launch(self, mode, mesh, host):
        dp, tp = (int(x) for x in mesh.split("x"))
        world = dp * tp
        init = os.path.join(self.job.root, f"init-{mode}-{mesh}")
        child = os.path.join(HERE, "dtensor_child.py")
        extra = {"USE_LIBUV": "0", "CAIRN_HOST_ROOT": os.path.join(self.job.root, host),
                 "CAIRN_PERSIST_EVERY": "0", "OMP_NUM_THREADS": "1"}
        procs = [
            subprocess.Popen([sys.executable, child, mode, "--mesh", mesh, "--init", init],
                             env=self.job.env(r, world, extra), stdout=subprocess.PIPE,
                             stderr=subprocess.STDOUT, text=True)
            for r in range(world)
        ]
        outs = []
        for p in procs:
            outs.append(p.communicate(timeout=300)[0])
        failed = [f"rank {r} (exit {p.returncode}):\n{text}"
                  for r, (p, text) in enumerate(zip(procs, outs)) if p.returncode != 0]
        self.assertFalse(failed, f"{mode} on {mesh}:\n" + "\n".join(failed))
        return outs

    def test_a_2x2_mesh_restores_bit_exact_onto_3_and_2_processes_and_another_shape(self):
        self.launch("save", "2x2", "host-save")
        for mesh in ("3x1", "1x2", "1x4"):
            outs = self.launch("load", mesh, f"host-{mesh}")  # an empty host tier: the PFS
            for text in outs:
                self.assertIn("restored step 1 from pfs", text)


@unittest.skipUnless(_has_dtensor(), "needs PyTorch 2.x with DTensor (scripts/debian13.sh)")
class TPTraining(unittest.TestCase):
    """A tensor-parallel model (2-way TP x 2-way DP, 4 processes) trained with AdamW and a
    checkpoint every step (tp_child.py): SIGKILLed and resumed, its losses equal an
    uninterrupted run's bit for bit; then restored onto 3 and 2 processes from the PFS by
    cairn.torch, and by DCP through cairn.dcp.StorageReader, equal to DCP's own save/load."""

    STEPS = 40

    def setUp(self):
        self.job = Job("tp")
        self.addCleanup(self.job.close)
        self.launches = 0

    def start(self, mode, mesh, args, host="host"):
        dp, tp = (int(x) for x in mesh.split("x"))
        self.launches += 1
        init = os.path.join(self.job.root, f"init-{self.launches}")
        child = os.path.join(HERE, "tp_child.py")
        extra = {"USE_LIBUV": "0", "CAIRN_HOST_ROOT": os.path.join(self.job.root, host),
                 "CAIRN_PERSIST_EVERY": "0", "OMP_NUM_THREADS": "1"}
        return [subprocess.Popen([sys.executable, child, mode, "--mesh", mesh, "--init", init,
                                  *args], env=self.job.env(r, dp * tp, extra),
                                 stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True)
                for r in range(dp * tp)]

    def finish(self, procs, what):
        return finish_ranks(self, procs, what)

    def test_killed_and_resumed_bit_exact_then_restored_onto_3_and_2_processes(self):
        root = self.job.root
        ref = os.path.join(root, "ref.txt")
        self.finish(self.start("train", "2x2", ["--steps", str(self.STEPS), "--out", ref,
                                                "--no-cairn"]), "reference run")
        want = read_step_losses(ref)
        self.assertEqual(len(want), self.STEPS)

        out = os.path.join(root, "run.txt")
        kill_at = random.randrange(8, self.STEPS - 8)
        procs = self.start("train", "2x2", ["--steps", str(self.STEPS), "--out", out,
                                            "--step-sleep", "0.1"])
        wait_for(lambda: len(read_step_losses(out)) >= kill_at or any(p.poll() is not None
                                                                 for p in procs),
                 300, f"step {kill_at}")
        for p in procs:
            p.send_signal(signal.SIGKILL)
        for p in procs:
            p.communicate()
        logged = max(read_step_losses(out))
        self.assertLess(logged, self.STEPS, "the run ended before it was killed")

        final = os.path.join(root, "dcp")
        outs = self.finish(self.start("train", "2x2", ["--steps", str(self.STEPS), "--out", out,
                                                       "--final", final]), "resumed run")
        restored = [l.split() for l in outs[0].splitlines() if l.startswith("restored ")]
        self.assertEqual(len(restored), 1, outs[0])
        step, tier = int(restored[0][1]), restored[0][3]
        self.assertEqual(tier, "host")
        self.assertGreaterEqual(step, logged - 2)
        got = read_step_losses(out)
        for s in range(1, self.STEPS + 1):
            self.assertEqual(got[s], want[s], f"loss at step {s} (restored {step})")

        job_dir = os.path.join(root, "pfs", self.job.id)
        for mesh in ("1x3", "1x2", "2x1"):
            outs = self.finish(self.start("load", mesh, ["--dcp", final, "--job-dir", job_dir],
                                          host=f"host-{mesh}"), f"load on {mesh}")
            for text in outs:
                self.assertIn(f"restored step {self.STEPS} from pfs; cairn.torch, cairn.dcp "
                              "and DCP agree", text)


def _has_dcp_stager():
    """PyTorch >= 2.9: DCP's AsyncStager with async_save(async_stager=), what cairn.dcp needs."""
    try:
        import inspect

        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.staging import AsyncStager  # noqa: F401
    except ImportError:
        return False
    return "async_stager" in inspect.signature(dcp.async_save).parameters


@unittest.skipUnless(_has_dcp_stager(), "needs PyTorch >= 2.9 (scripts/venv.sh)")
class DCPTraining(unittest.TestCase):
    """A pipeline trainer's state (two tensor-parallel model parts with their optimizers,
    an LR scheduler, a data loader whose state differs per rank, the RNG, counters) saved
    every step with dcp.async_save through cairn.dcp's writer and stager, and loaded with
    dcp.load through its reader (dcp_child.py), on 2 processes over gloo, each rank its
    own node."""

    STEPS = 30

    def setUp(self):
        self.job = Job("dcp")
        self.addCleanup(self.job.close)
        self.launches = 0

    def start(self, mode, world, args, host="host", mesh=None):
        self.launches += 1
        init = os.path.join(self.job.root, f"init-{self.launches}")
        extra = {"USE_LIBUV": "0", "CAIRN_HOST_ROOT": os.path.join(self.job.root, host),
                 "CAIRN_PERSIST_EVERY": "0", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, os.path.join(HERE, "dcp_child.py"), mode, "--init", init,
               "--mesh", mesh or f"1x{world}", *args]
        return [subprocess.Popen(cmd, env=self.job.env(r, world, extra), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for r in range(world)]

    def finish(self, procs, what):
        return finish_ranks(self, procs, what)

    def reference(self):
        ref = os.path.join(self.job.root, "ref")
        self.finish(self.start("train", 2, ["--steps", str(self.STEPS), "--out", ref,
                                            "--no-cairn"]), "reference run")
        want = [read_step_losses(f"{ref}-{r}") for r in range(2)]
        self.assertEqual(len(want[0]), self.STEPS)
        return want

    def killed_run(self, out):
        """Trains until a random step whose version is replicated, then SIGKILLs both
        ranks; returns the last step logged."""
        kill_at = random.randrange(8, self.STEPS - 8)
        procs = self.start("train", 2, ["--steps", str(self.STEPS), "--out", out,
                                        "--step-sleep", "0.1"])
        logged, _ = kill_once_replicated(procs, out, kill_at, 0.05)
        self.assertLess(logged, self.STEPS, "the run ended before it was killed")
        return logged

    def resumed_run(self, out, want, tiers, args=()):
        outs = self.finish(self.start("train", 2, ["--steps", str(self.STEPS), "--out", out,
                                                   *args]), "resumed run")
        restored = []
        for text in outs:
            lines = [l.split() for l in text.splitlines() if l.startswith("restored ")]
            self.assertEqual(len(lines), 1, text)
            restored.append((int(lines[0][1]), lines[0][3]))
        self.assertEqual(restored[0][0], restored[1][0], restored)
        self.assertEqual([t for _, t in restored], tiers, restored)
        for r in range(2):
            got = read_step_losses(f"{out}-{r}")
            for s in range(1, self.STEPS + 1):
                self.assertEqual(got[s], want[r][s], f"rank {r}: loss at step {s} (restored "
                                                     f"{restored[r][0]})")
        return restored[0][0]

    def test_async_save_killed_and_resumed_from_own_memory_bit_exact(self):
        want = self.reference()
        out = os.path.join(self.job.root, "run")
        logged = self.killed_run(out)
        step = self.resumed_run(out, want, ["host", "host"])
        self.assertGreaterEqual(step, logged - 2)

    def test_a_wiped_node_comes_back_from_its_partner_then_onto_one_process(self):
        want = self.reference()
        out = os.path.join(self.job.root, "run")
        self.killed_run(out)
        shutil.rmtree(os.path.join(self.job.root, "host", self.job.id, "node-1"))
        dump = os.path.join(self.job.root, "dump")
        self.resumed_run(out, want, ["host", "peer"],
                         ["--dump", dump, "--dump-at", str(self.STEPS), "--flush"])
        # Tensor parallelism 2 -> 1: the last step, from the PFS, equal to what rank 0 saved.
        outs = self.finish(self.start("check", 1, ["--dump", dump, "--step", str(self.STEPS)],
                                      host="host-one"), "load onto one process")
        self.assertIn(f"equal 62 entries from pfs at step {self.STEPS}", outs[0])

    def test_every_entry_comes_back_exactly_per_rank_and_a_model_only_load(self):
        dump = os.path.join(self.job.root, "dump")
        steps = 12
        self.finish(self.start("train", 2, ["--steps", str(steps), "--out",
                                            os.path.join(self.job.root, "run"), "--dump", dump,
                                            "--dump-at", str(steps)]), "run")
        for r in range(2):  # the loaders' states differ per rank
            saved = torch.load(os.path.join(dump, f"rank-{r}.pt"), weights_only=False)
            self.assertEqual(saved["loader.rank"], r)
        outs = self.finish(self.start("check", 2, ["--dump", dump, "--step", str(steps)]),
                           "load into fresh state")
        for r, text in enumerate(outs):
            self.assertIn(f"rank {r}: equal 62 entries from host at step {steps}", text)
        outs = self.finish(self.start("check", 2, ["--dump", dump, "--step", str(steps),
                                                   "--model-only"]), "model-only load")
        for r, text in enumerate(outs):
            self.assertIn(f"rank {r}: equal 4 entries from host at step {steps}", text)

    def test_a_buffer_written_after_save_is_saved_as_it_was_at_save(self):
        outs = self.finish(self.start("buffer", 2, []), "buffer run")
        for r, text in enumerate(outs):
            self.assertRegex(text, rf"rank {r}: buffer held at save in [2-5] versions")


def _has_fsdp2_on_gpu():
    """FSDP2's fully_shard (PyTorch 2.6+; 2.4-2.5 under _composable) and a CUDA device
    (PyTorch 2.6's FSDP2 cannot run on CPU tensors)."""
    if not (_has_dtensor() and torch.cuda.is_available()):
        return False
    try:
        from torch.distributed.fsdp import fully_shard  # noqa: F401
    except ImportError:
        try:
            from torch.distributed._composable.fsdp import fully_shard  # noqa: F401
        except ImportError:
            return False
    return True


class FSDP2Training(unittest.TestCase):
    """A model wrapped in FSDP2's fully_shard on the GPU (a 1-rank mesh: its parameters and
    AdamW's moments are DTensors Shard(0)), saved by cairn.torch every step
    (fsdp2_child.py): SIGKILLed at a random step and resumed, every later loss equals an
    uninterrupted run's bit for bit; then that state restored from the PFS into a plain CPU
    model and into a 2-process tensor-parallel CPU job (gloo), equal to the saved one bit
    for bit. The same flow without fully_shard on the CPU rehearses the test where no GPU
    is (a mistake in it shows here, not on a rare GPU)."""

    STEPS = 60

    def setUp(self):
        self.job = Job("fsdp2")
        self.addCleanup(self.job.close)
        self.launches = 0

    def start(self, args, world=1, host="host"):
        self.launches += 1
        init = os.path.join(self.job.root, f"init-{self.launches}")
        extra = {"USE_LIBUV": "0", "CAIRN_HOST_ROOT": os.path.join(self.job.root, host),
                 "CAIRN_PERSIST_EVERY": "0", "OMP_NUM_THREADS": "1"}
        cmd = [sys.executable, os.path.join(HERE, "fsdp2_child.py"), *args, "--init", init]
        return [subprocess.Popen(cmd, env=self.job.env(r, world, extra), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for r in range(world)]

    def finish(self, procs, what):
        return finish_ranks(self, procs, what)

    @unittest.skipUnless(_has_fsdp2_on_gpu(), "needs a CUDA device and PyTorch 2.4+ (FSDP2)")
    def test_fully_sharded_run_killed_and_resumed_bit_exact_then_restored_on_cpu_and_tp(self):
        self.killed_resumed_then_restored(["--device", "cuda"])

    @unittest.skipUnless(_has_dtensor(), "needs PyTorch 2.x with DTensor (scripts/debian13.sh)")
    def test_the_same_flow_on_cpu_without_fully_shard(self):
        self.killed_resumed_then_restored(["--device", "cpu", "--no-fsdp"])

    def killed_resumed_then_restored(self, device):
        root, steps = self.job.root, ["--steps", str(self.STEPS)]
        ref = os.path.join(root, "ref.txt")
        self.finish(self.start(["train", *device, *steps, "--out", ref, "--no-cairn"]),
                    "reference run")
        want = read_step_losses(ref)
        self.assertEqual(len(want), self.STEPS)

        out = os.path.join(root, "run.txt")
        kill_at = random.randrange(10, self.STEPS - 10)
        procs = self.start(["train", *device, *steps, "--out", out, "--step-sleep", "0.05"])
        wait_for(lambda: len(read_step_losses(out)) >= kill_at or procs[0].poll() is not None,
                 300, f"step {kill_at}")
        time.sleep(random.random() * 0.05)  # somewhere inside an iteration
        procs[0].send_signal(signal.SIGKILL)
        procs[0].communicate()
        logged = max(read_step_losses(out))
        self.assertLess(logged, self.STEPS, "the run ended before it was killed")

        final = os.path.join(root, "final.pt")
        text = self.finish(self.start(["train", *device, *steps, "--out", out, "--final", final]),
                           "resumed run")[0]
        restored = [l.split() for l in text.splitlines() if l.startswith("restored ")]
        self.assertEqual(len(restored), 1, text)
        step, tier = int(restored[0][1]), restored[0][3]
        self.assertEqual(tier, "host")
        self.assertGreaterEqual(step, logged - 2)
        got = read_step_losses(out)
        for s in range(1, self.STEPS + 1):
            self.assertEqual(got[s], want[s], f"loss at step {s} (restored {step})")
        if "cuda" in device:
            self.assertRegex(text, r"engine cuda slots pinned [1-9]\d* refused 0\b")

        for world in (1, 2):
            outs = self.finish(self.start(["load", "--ref", final], world, host=f"host-{world}"),
                               f"restore onto {world} CPU process(es)")
            for text in outs:
                self.assertRegex(text, f"restored step {self.STEPS} from pfs; equal to the "
                                       r"saved state in all \d+ entries")


class _InProcessJob:
    """A temporary job for a test that runs cairn.torch in its own process (CAIRN_* of
    the job in the environment, no persistence)."""

    def setUp(self):
        import torch

        self.torch = torch
        self.job = Job("unit")
        self.addCleanup(self.job.close)
        saved = dict(os.environ)
        self.addCleanup(lambda: (os.environ.clear(), os.environ.update(saved)))
        os.environ.update({k: v for k, v in self.job.env().items() if k.startswith("CAIRN_")})
        os.environ["CAIRN_PERSIST_EVERY"] = "0"

    def ckpt(self, model, optimizer=None, **kw):
        import cairn.torch

        return cairn.torch.Checkpointer(model, optimizer, **kw)


class TorchUnits(_InProcessJob, unittest.TestCase):
    """The shard building and restore paths, in one process."""

    def _planted(self, blob_name, blob):
        """A model, and a version of it (step 1) whose blob `blob_name` is `blob`, as a
        process that knows cairn's blob names could write one."""
        import cairn.torch

        self._jobs = getattr(self, "_jobs", 0) + 1  # a job of its own each time
        os.environ["CAIRN_JOB_ID"] = f"{self.job.id}-{self._jobs}"
        model = self.torch.nn.Linear(2, 2)
        with self.ckpt(model) as ck:
            self.assertTrue(ck.save(1, extra={"epoch": 1}))
            shards, _ = ck._flat_state(snapshot_buffers=True)
            blobs = ck._rng_blobs()
            blobs.update({"torch.state": cairn.torch._encode({}, "plain"), blob_name: blob})
            self.assertEqual(ck._ck.save(2, shards, blobs, stream=ck._stream()), "queued")
            ck.flush()
        return model

    def test_a_blob_crafted_to_run_code_never_runs(self):
        """Restoring never runs code from a checkpoint: a version whose blobs are pickles
        naming a function (os.system, as an attacker would write them), in the old format
        or dressed as cairn's data format, is refused with an error that says why, and the
        function never runs (its marker file is not created)."""
        import pickle

        import cairn.torch

        marker = os.path.join(self.job.root, "pwned")

        class Evil:
            def __reduce__(self):
                return (os.system, (f"touch {marker}",))

        crafted = pickle.dumps(Evil())
        for name, blob, says in (
                ("user", crafted, "older cairn"),
                ("torch.state", crafted, "older cairn"),
                ("rng.python", crafted, "older cairn"),
                ("user", cairn.torch._PICKLE_MAGIC + crafted, "allow_pickle=True"),
                ("user", cairn.torch._DATA_MAGIC + crafted, "posix.system"),
                ("rng.numpy", cairn.torch._DATA_MAGIC + crafted, "posix.system")):
            with self.subTest(blob=name, format=blob[:14]):
                model = self._planted(name, blob)
                with self.ckpt(model) as ck:
                    with self.assertRaises(cairn.torch._cairn.Error) as e:
                        ck.restore(2)
                    self.assertIn(says, str(e.exception))
                    self.assertIn("step 2", str(e.exception))
                    self.assertFalse(os.path.exists(marker), "the crafted blob ran its code")
                    # The version before it restores.
                    self.assertEqual(ck.restore(1), 1)
                    self.assertEqual(ck.extra, {"epoch": 1})
        # With the opt-in, for a checkpoint its user trusts, the old format loads.
        model = self._planted("user", pickle.dumps({"loader": 7}))
        with self.assertRaises(cairn.torch._cairn.Error):
            with self.ckpt(model) as ck:
                ck.restore(2)
        with self.ckpt(model, allow_pickle=True) as ck:
            self.assertEqual(ck.restore(2), 2)
            self.assertEqual(ck.extra, {"loader": 7})

    def test_extra_is_data_unless_pickle_is_allowed(self):
        """`extra` of plain data and tensors comes back equal (no pickle needed); an object
        of a class of its own is refused at save() naming its type, and with
        allow_pickle=True it is saved and restored."""
        import fractions

        import cairn.torch

        torch = self.torch
        data = {"epoch": 3, "seen": [1, 2.5, "x", None, True, b"\x00"], "t": (1, 2),
                "set": {1, 2}, "c": 1 + 2j, "tensor": torch.arange(6, dtype=torch.bfloat16).view(2, 3),
                "empty": torch.zeros(0, 4), "dtype": torch.float16}
        model = torch.nn.Linear(2, 2)
        with self.ckpt(model) as ck:
            self.assertTrue(ck.save(1, extra=data))
            with self.assertRaises(cairn.torch._cairn.Error) as e:
                ck.save(2, extra={"frac": fractions.Fraction(1, 3)})
            self.assertIn("fractions.Fraction", str(e.exception))
            self.assertIn("allow_pickle=True", str(e.exception))
            ck.flush()
            self.assertEqual(ck.restore(), 1)
            got = ck.extra
        self.assertTrue(torch.equal(got.pop("tensor"), data.pop("tensor")))
        self.assertEqual(got.pop("empty").shape, data.pop("empty").shape)
        self.assertEqual(got, data)
        with self.ckpt(model, allow_pickle=True) as ck:
            self.assertTrue(ck.save(3, extra={"frac": fractions.Fraction(1, 3)}))
            ck.flush()
            self.assertEqual(ck.restore(3), 3)
            self.assertEqual(ck.extra, {"frac": fractions.Fraction(1, 3)})

    def test_fence_names_the_current_stream_the_default_one_included(self):
        """fence() passes the current stream to the core even when it is the default
        stream (0): the core's fence() without a stream orders the streams given at save(),
        so after a save() on a side stream an optimizer on the default stream would run
        unordered with the copy (TorchGpu checks the ordering itself on a GPU)."""
        with self.ckpt(self.torch.nn.Linear(2, 2)) as c:
            real, calls = c._ck, []

            class Spy:  # the core Checkpointer, recording what fence() is given
                closed = False

                def fence(self, **kw):
                    calls.append(kw)
                    return real.fence(**kw)

            c._stream = lambda: 0  # what a CUDA model on the default stream gives
            c._ck = Spy()
            try:
                c.fence()
            finally:
                c._ck = real
        self.assertEqual(calls, [{"stream": 0}])

    @unittest.skipUnless(_has_dcp_flatten(), "needs torch.distributed.checkpoint (PyTorch 2.4+)")
    def test_state_names_are_the_ones_dcp_flattens_to(self):
        import cairn.torch
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict

        torch = self.torch
        model = torch.nn.Sequential(torch.nn.Linear(3, 4), torch.nn.BatchNorm1d(4))
        opt = torch.optim.AdamW([{"params": model[0].parameters()},
                                 {"params": model[1].parameters(), "lr": 0.5}])
        model(torch.randn(2, 3)).sum().backward()
        opt.step()
        flat = cairn.torch.FlatRange(torch.zeros(5), [2, 4], 1)
        ck = self.ckpt(model, opt, tensors={"flat": [flat], "plain": torch.ones(2)})
        self.addCleanup(ck.close)
        state = ck.state_dict()
        state["misc"] = {"tuple": (1, torch.ones(1)), "nested": [[1, 2], [torch.zeros(1)]],
                         "empty": {}, "groups": [{"a": 1}], "scalars": [1.5, "x"]}
        self.assertEqual(list(cairn.torch._flatten(state)), list(flatten_state_dict(state)[0]))
        self.assertIn("optim.state.0.weight.exp_avg", cairn.torch._flatten(state))

    def test_saves_that_skip_the_walk_still_save_every_change(self):
        """save() skips walking the state while it holds the same tensors at the same
        addresses (cairn.torch._SavePlan): after each kind of change between two saves, a
        restore gives back exactly the state that was saved."""
        import cairn.torch

        torch = self.torch
        torch.manual_seed(0)
        model = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.BatchNorm1d(4),
                                    torch.nn.Linear(4, 2))
        opt = torch.optim.AdamW(model.parameters(), lr=0.1)

        def train():
            model(torch.randn(3, 4)).sum().backward()
            opt.step()
            opt.zero_grad()

        def flat():
            return cairn.torch._flatten(ck.state_dict())

        def grow_buffer():
            model[0].register_buffer("seen", torch.ones(3))
            model[1].running_mean.add_(1)

        # (what changes, whether the next save may skip the walk)
        changes = [
            ("nothing yet (no optimizer state)", lambda: None, True),
            ("the optimizer's state created", train, False),
            ("a training step, in place", train, True),
            ("a hyperparameter", lambda: opt.param_groups[0].update(lr=0.05), True),
            ("a parameter's storage (.data)",
             lambda: setattr(model[2].weight, "data", torch.randn(2, 4)), False),
            ("a parameter replaced",
             lambda: setattr(model[2], "bias", torch.nn.Parameter(torch.randn(2))), False),
            ("a buffer added", grow_buffer, False),
            ("another step", train, True),
        ]
        ck = self.ckpt(model, opt)
        self.addCleanup(ck.close)
        for step, (what, change, unchanged) in enumerate(changes, start=1):
            with self.subTest(change=what):
                change()
                if step > 1:
                    self.assertEqual(ck._unchanged_state() is not None, unchanged)
                self.assertTrue(ck.save(step))
                ck.fence_host()
                saved = {k: v.detach().clone() if torch.is_tensor(v) else v
                         for k, v in flat().items()}
                with torch.no_grad():  # in place: the next save may still skip the walk
                    for v in flat().values():
                        if torch.is_tensor(v):
                            v.fill_(7)
                opt.param_groups[0]["lr"] = 1.0
                self.assertEqual(ck.restore(step), step)
                back = flat()
                self.assertEqual(sorted(back), sorted(saved))
                for k, v in saved.items():
                    if torch.is_tensor(v):
                        self.assertTrue(torch.equal(back[k], v), f"{what}: {k} differs")
                    else:
                        self.assertEqual(back[k], v, f"{what}: {k} differs")
                if step == 1:  # saved before the optimizer's first step: restored as such
                    train()
                    self.assertEqual(ck.restore(step), step)
                    self.assertEqual(dict(opt.state), {})
                    self.assertTrue(torch.equal(model[0].weight, saved["model.0.weight"]))

    def test_restore_puts_back_every_rng_state(self):
        import random

        torch = self.torch
        try:
            import numpy as np
        except ImportError:
            np = None

        def draw():
            return (torch.rand(3).tolist(), random.random(),
                    None if np is None else np.random.normal(size=3).tolist())

        torch.manual_seed(1)
        random.seed(2)
        if np is not None:
            np.random.seed(3)
            np.random.normal()  # a cached Gaussian in the state too
        with self.ckpt(torch.nn.Linear(2, 2)) as c:
            self.assertTrue(c.save(1))
            c.fence()
            want = draw()
            draw()
            self.assertEqual(c.restore(1), 1)
            self.assertEqual(draw(), want)

    def test_a_fresh_optimizer_gets_its_state_without_a_step_and_bit_exact(self):
        """A restore into an optimizer that has no state yet (a restarted job) creates its
        tensors from the saved layout instead of running a zero step (which costs the
        optimizer's whole update): no step runs, and the state equals the saved one bit
        for bit. Those tensors are made, and their pages faulted in, while the
        Checkpointer opens (the restore takes them); a save drops them. An optimizer whose
        state is not shaped like its parameters gets a zero step as before. A restore that
        fails leaves the optimizer without state, as it was, not with uninitialised
        tensors."""
        torch = self.torch

        class Counting(torch.optim.AdamW):
            steps = 0

            def step(self, *a, **k):
                Counting.steps += 1
                return super().step(*a, **k)

        class Factored(torch.optim.SGD):  # a state tensor shaped unlike its parameter
            def step(self, *a, **k):
                out = super().step(*a, **k)
                for p in self.param_groups[0]["params"]:
                    self.state[p]["row"] = p.detach().sum(dim=-1).clone()
                return out

        for kind, fresh_steps in (("adamw", 0), ("factored", 1)):
            os.environ["CAIRN_JOB_ID"] = f"{self.job.id}-{kind}"
            torch.manual_seed(3)
            model = torch.nn.Linear(8, 4)
            make = ((lambda ps: Counting(ps, lr=0.1)) if kind == "adamw"
                    else (lambda ps: Factored(ps, lr=0.1, momentum=0.9)))
            opt = make(model.parameters())
            with self.ckpt(model, opt) as ck:
                for step in (1, 2):
                    model(torch.randn(3, 8)).square().sum().backward()
                    opt.step()
                    opt.zero_grad()
                    self.assertTrue(ck.save(step))
                ck.fence()
                want = {(n, k): v.clone() for n, p in model.named_parameters()
                        for k, v in opt.state[p].items() if torch.is_tensor(v)}
            torch.manual_seed(4)
            model2 = torch.nn.Linear(8, 4)
            opt2 = make(model2.parameters())
            Counting.steps = 0
            with self.ckpt(model2, opt2) as ck:
                # Made while the Checkpointer opened, from the layout the version holds.
                prepared = {(n, k): v.data_ptr() for n, p in model2.named_parameters()
                            for k, v in (ck._prepared[1][p].items() if ck._prepared else ())}
                self.assertEqual(bool(prepared), kind == "adamw", kind)
                calls = []
                real = opt2.step
                opt2.step = lambda *a, **k: (calls.append(1), real(*a, **k))[1]
                self.assertEqual(ck.restore(), 2)
                opt2.step = real
                self.assertIsNone(ck._prepared)
            self.assertEqual(len(calls), fresh_steps, kind)
            got = {(n, k): v for n, p in model2.named_parameters()
                   for k, v in opt2.state[p].items() if torch.is_tensor(v)}
            if prepared:  # the restore filled the prepared tensors
                self.assertEqual({key: got[key].data_ptr() for key in prepared}, prepared)
            self.assertEqual(set(got), set(want), kind)
            for key, v in want.items():
                self.assertTrue(torch.equal(got[key], v), f"{kind} {key}")
                self.assertEqual(got[key].dtype, v.dtype)

        # A restore that fails after the state was made (the model's weight has another
        # shape than the saved one) takes the state back.
        import cairn

        os.environ["CAIRN_JOB_ID"] = f"{self.job.id}-adamw"
        model3 = torch.nn.Linear(8, 5)
        opt3 = torch.optim.AdamW(model3.parameters())
        with self.ckpt(model3, opt3) as ck:
            with self.assertRaises(cairn.Error):
                ck.restore()
            self.assertIsNone(ck._prepared)
        self.assertEqual(len(opt3.state), 0)

        # Training without a restore: the first save drops what was prepared.
        model4 = torch.nn.Linear(8, 4)
        opt4 = torch.optim.AdamW(model4.parameters())
        with self.ckpt(model4, opt4) as ck:
            self.assertIsNotNone(ck._prepared)
            model4(torch.randn(3, 8)).square().sum().backward()
            opt4.step()
            self.assertTrue(ck.save(3))
            self.assertIsNone(ck._prepared)

    def test_no_version_restores_nothing(self):
        with self.ckpt(self.torch.nn.Linear(3, 3)) as c:
            self.assertIsNone(c.restore())

    def test_flat_ranges_and_sharded_tensors_restore_into_another_layout(self):
        import cairn.torch

        torch = self.torch
        whole = torch.arange(20, dtype=torch.float32).reshape(4, 5) * 0.5
        flat = whole.reshape(-1).clone()
        bf = torch.arange(12, dtype=torch.bfloat16).reshape(3, 4)

        class Shard:  # the ShardedTensor interface cairn.torch uses
            def __init__(self, t, offsets):
                self.tensor = t
                self.metadata = type("M", (), {"shard_offsets": offsets, "shard_sizes": list(t.shape)})

        class Sharded:
            def __init__(self, parts, size):
                self.parts, self._size = parts, size

            def local_shards(self):
                return self.parts

            def size(self):
                return torch.Size(self._size)

        sharded = Sharded([Shard(bf[:1].clone(), [0, 0]), Shard(bf[1:].clone(), [1, 0])], [3, 4])
        model = torch.nn.Linear(2, 2)
        saved = {
            # ZeRO-style: two flat ranges [0, 7) and [7, 20) of a [4, 5] tensor
            "w": [cairn.torch.FlatRange(flat[:7], [4, 5], 0),
                  cairn.torch.FlatRange(flat[7:], [4, 5], 7)],
            "b": sharded,
        }
        with self.ckpt(model, tensors=saved) as c:
            self.assertTrue(c.save(1))
            c.fence()
        w_back = torch.zeros(4, 5)
        b_back = torch.zeros(3, 4, dtype=torch.bfloat16)
        with self.ckpt(torch.nn.Linear(2, 2), tensors={"w": w_back, "b": b_back}) as c:
            self.assertEqual(c.restore(), 1)
            self.assertTrue(c.last_report.resharded)
        self.assertTrue(torch.equal(w_back, whole))
        self.assertTrue(torch.equal(b_back, bf))
        # and back into a flat range in the middle
        part = torch.zeros(9)
        with self.ckpt(torch.nn.Linear(2, 2),
                       tensors={"w": cairn.torch.FlatRange(part, [4, 5], 6), "b": b_back}) as c:
            self.assertEqual(c.restore(), 1)
        self.assertTrue(torch.equal(part, flat[6:15]))

    def test_bad_tensors_are_refused_naming_them(self):
        import cairn

        torch = self.torch
        with self.ckpt(torch.nn.Linear(2, 2), tensors={"t": torch.zeros(4, 4).t()}) as c:
            with self.assertRaisesRegex(cairn.Error, "tensors.t: the tensor is not contiguous"):
                c.save(1)
        with self.ckpt(torch.nn.Linear(2, 2), tensors={"z": torch.zeros(2, dtype=torch.complex64)}) as c:
            with self.assertRaisesRegex(cairn.Error, "tensors.z: cairn cannot save dtype") as e:
                c.save(1)
            self.assertEqual(e.exception.code, "InvalidArgument")
        with self.assertRaisesRegex(cairn.Error, "no setting 'bogus'"):
            self.ckpt(torch.nn.Linear(2, 2), bogus=1)

    def test_the_hook_fences_before_every_optimizer_step(self):
        torch = self.torch
        model = torch.nn.Linear(8, 8)
        opt = torch.optim.SGD(model.parameters(), lr=0.1, momentum=0.9)
        with self.ckpt(model, opt) as c:
            for step in range(1, 6):
                model(torch.ones(2, 8)).sum().backward()
                opt.step()
                c.save(step)
            self.assertEqual(c.stats().fences, 5)  # one before each optimizer step
            c.close()
            opt.step()  # the hook is gone with the checkpointer


class _Plain:  # a non-tensor entry that is not plain data
    def __init__(self):
        self.x = 1


def _mlp(seed):
    torch.manual_seed(seed)
    return torch.nn.Sequential(torch.nn.Linear(8, 16), torch.nn.BatchNorm1d(16),
                               torch.nn.Linear(16, 4))


def _train(models, opts, scheds=()):
    x = torch.randn(32, 8)
    loss = sum(m(x).square().mean() for m in models)
    for o in opts:
        o.zero_grad()
    loss.backward()
    for o in opts:
        o.step()
    for s in scheds:
        s.step()


def _values(state):
    """{flattened name: a copy} of a state dict whose Stateful objects give their state."""
    import cairn.torch as ct

    flat, _, _, _ = ct._walk_state(state, lambda name, obj: obj.state_dict())
    return {k: (v.detach().clone() if torch.is_tensor(v) else copy.deepcopy(v))
            for k, v in flat.items()}


def _same(test, got, want):
    test.assertEqual(set(got), set(want))
    for k, v in want.items():
        if torch.is_tensor(v):
            test.assertTrue(torch.equal(got[k], v), k)
        else:
            test.assertEqual(got[k], v, k)


class StateDictUnits(_InProcessJob, unittest.TestCase):
    """cairn.torch.StateCheckpointer on any DCP-style state dict, in one process."""

    def state(self, seed):
        models = [_mlp(seed), _mlp(seed + 1)]
        opts = [torch.optim.AdamW(models[0].parameters(), lr=1e-2),
                torch.optim.SGD(models[1].parameters(), lr=1e-2, momentum=0.9)]
        scheds = [torch.optim.lr_scheduler.StepLR(opts[0], step_size=2, gamma=0.5)]
        scaler = torch.amp.GradScaler("cpu", init_scale=2.0 ** (8 + seed))
        state = {"parts": [{"model": models[0], "optim": opts[0]},
                           {"model": models[1], "optim": opts[1]}],
                 "sched": scheds[0], "scaler": scaler,
                 "loader": {"pos": 10 * seed, "order": [seed, 2, 3], "name": f"l{seed}"},
                 "counters": {"step": torch.tensor(seed), "tokens": 1000 * seed}}
        return state, models, opts, scheds

    def test_nested_state_with_statefuls_round_trips_and_comes_back_new(self):
        import cairn.torch

        state, models, opts, scheds = self.state(1)
        _train(models, opts, scheds)
        _train(models, opts, scheds)
        want = _values(state)
        ck = cairn.torch.StateCheckpointer()
        self.addCleanup(ck.close)
        handle = ck.save(5, state)
        self.assertTrue(handle)
        self.assertEqual(handle.captured.result(30), 5)
        # The names are DCP's for the state the Statefuls give (at any depth).
        from torch.distributed.checkpoint._nested_dict import flatten_state_dict

        def resolved(v):
            if hasattr(v, "load_state_dict"):
                v = v.state_dict()
            if isinstance(v, dict):
                return {k: resolved(x) for k, x in v.items()}
            return [resolved(x) for x in v] if isinstance(v, list) else v

        flat, _ = flatten_state_dict(resolved(state))
        self.assertEqual(set(want), set(flat))
        # Everything changes, then the load puts it back; the optimizers' hooks fence.
        _train(models, opts, scheds)
        state["loader"]["pos"] = -1
        report = ck.load(state)
        self.assertEqual((report.step, report.tier), (5, "host"))
        self.assertEqual(state["loader"]["pos"], 10)
        _same(self, _values(state), want)
        # Into fresh objects, and into a new dict.
        fresh, _, fopts, _ = self.state(2)
        ck.load(fresh)
        _same(self, _values(fresh), want)
        self.assertTrue(fopts[0].state, "the fresh optimizer got its state")
        step, new = ck.load_new()
        self.assertEqual(step, 5)
        self.assertIsInstance(new["parts"], list)
        self.assertEqual(new["loader"], {"pos": 10, "order": [1, 2, 3], "name": "l1"})
        self.assertTrue(torch.equal(new["parts"][1]["model"]["0.weight"],
                                    want["parts.1.model.0.weight"]))
        _, model_only = ck.load_new(keys=["parts"])
        self.assertEqual(sorted(model_only), ["parts"])

    def test_a_model_only_load_leaves_the_rest_and_buffers_are_copied_at_save(self):
        import cairn.torch

        state, models, opts, scheds = self.state(1)
        _train(models, opts, scheds)
        ck = cairn.torch.StateCheckpointer(copy_below=0)  # only the modules' buffers copied
        self.addCleanup(ck.close)
        want = _values(state)
        ck.save(1, state)
        models[0][1].running_mean.fill_(-7)  # a forward pass before the fence
        ck.fence()
        ck.wait_captured()
        fresh, fmodels, fopts, _ = self.state(3)
        before = _values(fresh)
        ck.load({"parts": [{"model": fmodels[0]}]})
        got = _values(fresh)
        for k in before:
            if k.startswith("parts.0.model."):
                self.assertTrue(torch.equal(got[k], want[k]), k)
            else:
                same = torch.equal(got[k], before[k]) if torch.is_tensor(before[k]) else \
                    got[k] == before[k]
                self.assertTrue(same, f"{k} changed by a model-only load")

    def test_bad_input_is_refused_naming_it_and_changes_nothing(self):
        import cairn
        import cairn.torch

        state, models, opts, scheds = self.state(1)
        ck = cairn.torch.StateCheckpointer()
        self.addCleanup(ck.close)
        ck.save(1, state).result(30)
        for bad, words in (({"odd": _Plain()}, ["odd", "_Plain", "allow_pickle"]),
                           ({"w": torch.zeros(4, 6).t()}, ["w", "not contiguous"])):
            with self.assertRaises(cairn.Error) as e:
                ck.save(2, {**state, **bad})
            for w in words:
                self.assertIn(w, str(e.exception))
            self.assertEqual([v.step for v in ck.versions()], [1], "nothing was saved")
        want = _values(state)
        for extra, words in (({"new.entry": torch.zeros(3), "other": 5},
                              ["'new.entry'", "'other'", "allow_partial_load"]),
                             ({"counters": {"step": torch.zeros(2, 2), "tokens": 0}},
                              ["counters.step", "int64 []", "float32 [2, 2]"])):
            target = {**state, **extra}
            for v in models[0].parameters():
                v.data.fill_(3)
            changed = _values(state)
            with self.assertRaises(cairn.Error) as e:
                ck.load(target)
            for w in words:
                self.assertIn(w, str(e.exception))
            _same(self, _values(state), changed)  # nothing was loaded
        ck.load(state)
        _same(self, _values(state), want)
        ck.load({**state, "new.entry": torch.zeros(3)}, allow_partial_load=True)

    def test_handles_say_captured_replicated_persisted_and_skipped(self):
        import cairn
        import cairn.torch

        os.environ["CAIRN_SLOTS"] = "2"
        ck = cairn.torch.StateCheckpointer(full_policy="raise")
        self.addCleanup(ck.close)
        big = {"w": torch.ones(32 << 20)}  # 128 MiB: its copy outlasts the next save call
        h1 = ck.save(1, big)
        self.assertEqual(h1.result(60), 1)
        with self.assertRaises(cairn.Error) as e:
            h1.replicated.result(10)
        self.assertIn("does not replicate", str(e.exception))
        persisted = h1.persisted
        self.assertFalse(persisted.done())
        ck.save(2, big)
        with self.assertRaises(cairn.Error) as e:
            ck.save(3, big)  # slot 1: the newest version, slot 2: capturing
        self.assertIn("CAIRN_FULL_POLICY=raise", str(e.exception))
        ck.wait_captured()
        self.assertEqual(ck.stats().skipped, 1)
        self.assertEqual(ck.flush(), 2)
        self.assertEqual(persisted.result(30), 2)

    def test_skipped_saves_are_reported_on_their_handle(self):
        import cairn
        import cairn.torch

        os.environ["CAIRN_SLOTS"] = "2"
        ck = cairn.torch.StateCheckpointer()  # the default policy: skip
        self.addCleanup(ck.close)
        big = {"w": torch.ones(32 << 20)}
        ck.save(1, big).result(60)
        self.assertTrue(ck.save(2, big))
        h = ck.save(3, big)
        self.assertFalse(h)
        self.assertIn("no free host slot", h.skipped_because)
        with self.assertRaises(cairn.Error) as e:
            h.captured.result(1)
        self.assertIn("step 3 was not saved", str(e.exception))


@unittest.skipUnless(_has_dcp_stager(), "needs PyTorch >= 2.9 (scripts/venv.sh)")
class DCPUnits(_InProcessJob, unittest.TestCase):
    """cairn.dcp's writer, stager and reader in one process (gloo, world size 1)."""

    def setUp(self):
        super().setUp()
        import torch.distributed as dist

        init = os.path.join(self.job.root, "init")
        dist.init_process_group("gloo", init_method="file://" + init, rank=0, world_size=1)
        self.addCleanup(dist.destroy_process_group)
        import cairn.dcp

        self.addCleanup(cairn.dcp.close)

    def test_ids_map_to_steps_and_a_repeated_or_older_id_saves_nothing(self):
        import torch.distributed.checkpoint as dcp

        import cairn
        import cairn.dcp

        model = _mlp(0)
        state = {"model": model}
        w = cairn.dcp.StorageWriter()
        dcp.save(state, checkpoint_id="run/step-3", storage_writer=w)
        resp = dcp.async_save(state, checkpoint_id="run/epoch=0-step=7", storage_writer=w,
                              async_stager=w)
        resp.staging_completion.result(30)
        resp.upload_completion.result(30)
        self.assertEqual([v.step for v in w.checkpointer.versions()], [7, 3])
        for cid in ("run/epoch=0-step=7", "run/step-5"):
            with self.assertRaises(cairn.Error) as e:
                dcp.async_save(state, checkpoint_id=cid, storage_writer=w, async_stager=w)
            self.assertIn(repr(cid), str(e.exception))
        resp = dcp.async_save(state, checkpoint_id="run/latest", storage_writer=w,
                              async_stager=w)  # no digits: the next step
        resp.upload_completion.result(30)
        self.assertEqual([v.step for v in w.checkpointer.versions()], [8, 7, 3])
        # Loads by id: that step exactly.
        with torch.no_grad():
            for p in model.parameters():
                p.fill_(0)
        r = cairn.dcp.StorageReader()
        dcp.load(state, checkpoint_id="step-3", storage_reader=r)
        self.assertEqual(r.report()["step"], 3)
        self.assertFalse(all(torch.all(p == 0) for p in model.parameters()))

    def test_the_process_checkpointer_is_refused_with_what_to_use(self):
        import torch.distributed.checkpoint as dcp
        from torch.distributed.checkpoint.state_dict_saver import AsyncCheckpointerType

        import cairn
        import cairn.dcp

        w = cairn.dcp.StorageWriter()
        with self.assertRaises(cairn.Error) as e:
            dcp.async_save({"model": _mlp(0)}, checkpoint_id="step-1", storage_writer=w,
                           async_stager=w, async_checkpointer_type=AsyncCheckpointerType.PROCESS)
        self.assertIn("AsyncCheckpointerType.THREAD", str(e.exception))
        self.assertEqual(w.checkpointer.versions(), [])

    def test_a_later_save_never_reads_what_training_changed_since(self):
        """Weights of 64 MiB, read in place: the optimizer steps right after staging
        completes, while DCP's upload plans; every version holds its step's weights."""
        import torch.distributed.checkpoint as dcp

        import cairn.dcp

        torch.manual_seed(0)
        model = torch.nn.Linear(4096, 4096)
        opt = torch.optim.SGD(model.parameters(), lr=0.5)
        x = torch.randn(8, 4096)
        w = cairn.dcp.StorageWriter()
        state = {"model": model}
        wants = {}
        resp = None
        for step in range(1, 4):
            model(x).square().mean().backward()
            if resp is not None:
                resp.staging_completion.result(30)
            opt.step()  # changes every weight in place
            opt.zero_grad()
            if resp is not None:
                resp.upload_completion.result(30)
            wants[step] = model.weight.detach().clone()
            resp = dcp.async_save(state, checkpoint_id=f"step-{step}", storage_writer=w,
                                  async_stager=w)
        resp.staging_completion.result(30)
        opt.step()
        resp.upload_completion.result(30)
        for step, want in wants.items():
            _, got = w.checkpointer.load_new(step=step, keys="model")
            self.assertTrue(torch.equal(got["model"]["weight"], want), f"step {step}")


@unittest.skipUnless(torch.cuda.is_available(), "needs a CUDA device")
class TorchGpu(_InProcessJob, unittest.TestCase):
    """cairn.torch on CUDA tensors, in one process (the GPU suite, ctest -L gpu)."""

    def test_a_save_on_a_side_stream_orders_the_optimizer_on_the_default_stream(self):
        """save() on a side stream whose queued work delays the copy by about half a
        second, then the optimizer step on the default stream (its hook fences first): the
        version holds the weights before the step. With a fence that ordered the save's
        stream instead of the current one, the step overwrote them before the copy read
        them."""
        torch = self.torch
        model = torch.nn.Linear(2048, 2048, bias=False, device="cuda")
        opt = torch.optim.SGD(model.parameters(), lr=1.0)
        ck = self.ckpt(model, opt)
        self.addCleanup(ck.close)
        with torch.no_grad():
            model.weight.fill_(3.0)
        model.weight.grad = torch.ones_like(model.weight)
        torch.cuda.synchronize()
        side = torch.cuda.Stream()
        with torch.cuda.stream(side):
            torch.cuda._sleep(1 << 30)  # GPU cycles: the copy waits for them
            self.assertTrue(ck.save(1))
        opt.step()  # default stream: 3.0 - 1.0 * 1.0
        ck.fence_host()
        ck.wait_captured()
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(model.weight, torch.full_like(model.weight, 2.0)))
        with torch.no_grad():
            model.weight.zero_()
        self.assertEqual(ck.restore(1), 1)
        torch.cuda.synchronize()
        self.assertTrue(torch.equal(model.weight, torch.full_like(model.weight, 3.0)),
                        "the version holds the weights of after the optimizer step")
        st = ck.stats()
        self.assertEqual(st.copy_engine, "cuda")
        self.assertGreater(st.slots_pinned, 0)
        self.assertEqual(st.slots_not_pinned, 0, "host slots the driver refused to pin")


class CoreModule(unittest.TestCase):
    """The C++ core as `cairn`: buffers, blobs, errors."""

    def options(self, tag):
        """cairn.Options of a temporary job (removed after the test), no persistence."""
        import cairn

        job = Job(tag)
        self.addCleanup(job.close)
        o = cairn.Options()
        o.job_id, o.host_root, o.pfs_root = job.id, job.root + "/host", job.root + "/pfs"
        o.persist_every = 0
        return o

    def test_options_hold_every_setting_typed_and_checked_as_its_variable_is(self):
        import cairn

        table = cairn.settings()
        fields = [t[0] for t in table]
        self.assertEqual(len(fields), len(set(fields)))
        # The three the hand-kept list of attributes had lost.
        for field in ("copy_engine", "bootstrap", "connect_all_max"):
            self.assertIn(field, fields)
        o = cairn.Options()
        for field, variable, default, meaning in table:
            self.assertTrue(variable.startswith("CAIRN_") and meaning, variable)
            value = getattr(o, field)
            setattr(o, field, value)
            self.assertEqual(getattr(o, field), value, field)
        # Typed as the fields are (an enum as its word), as the attributes always were.
        o.slots, o.chunk_bytes, o.replicate_timeout_s = 5, 1 << 22, 0.25
        o.persist_direct, o.group_placement, o.copy_engine = True, True, "host"
        o.connect_all_max, o.bootstrap, o.job_id = 8, "files", "run7"
        self.assertEqual((o.slots, o.chunk_bytes, o.replicate_timeout_s), (5, 1 << 22, 0.25))
        self.assertIs(o.persist_direct, True)
        self.assertIs(o.group_placement, True)
        self.assertEqual((o.copy_engine, o.connect_all_max, o.bootstrap, o.job_id),
                         ("host", 8, "files", "run7"))
        # Checked as the variable is; a refused value changes nothing.
        with self.assertRaisesRegex(cairn.Error, r"cairn.Options.slots=1 is outside \[2, 64\]"):
            o.slots = 1
        with self.assertRaisesRegex(cairn.Error, "use auto, host or cuda"):
            o.copy_engine = "gpu"
        with self.assertRaisesRegex(TypeError, "cairn.Options.slots cannot be set to a str"):
            o.slots = "four"
        with self.assertRaisesRegex(cairn.Error, "not a number of seconds"):
            o.op_timeout_s = -1.0
        self.assertEqual((o.slots, o.copy_engine, o.op_timeout_s),
                         (5, "host", cairn.Options().op_timeout_s))

    def test_every_fence_variant_waits_for_host_copies_and_releases_their_owners(self):
        import gc
        import weakref

        import numpy as np

        import cairn

        o = self.options("fences")
        with cairn.Checkpointer(o) as c:
            for step, fence in enumerate(
                [lambda: c.fence(), lambda: c.fence(stream=0), lambda: c.fence(host=True)], 1
            ):
                a = np.full(1 << 20, step, dtype=np.int32)
                owner = weakref.ref(a)
                self.assertEqual(c.save(step, [cairn.Shard.from_buffer("w", "int32", [1 << 20], a)],
                                        stream=0), "queued")
                del a
                gc.collect()
                self.assertIsNotNone(owner(), "cairn let go of a buffer it still reads")
                fence()  # host shards: copied when it returns, so the buffer is let go
                gc.collect()
                self.assertIsNone(owner(), f"fence {step} kept the copied buffer alive")
                back = np.zeros(1 << 20, dtype=np.int32)
                r = c.restore([cairn.Shard.from_buffer("w", "int32", [1 << 20], back)], step=step)
                self.assertEqual(r.step, step)
                self.assertTrue((back == step).all())

    def test_a_shard_list_saves_its_shards_and_keeps_their_owners_until_the_fence(self):
        import gc
        import weakref

        import numpy as np

        import cairn

        o = self.options("shardlist")
        with cairn.Checkpointer(o) as c:
            a = np.arange(1000, dtype=np.float32)
            b = np.full(10, 3, dtype=np.int64)
            owner = weakref.ref(b)
            fixed = cairn.ShardList([cairn.Shard.from_buffer("a", "float32", [1000], a)])
            both = fixed + [cairn.Shard.from_buffer("b", "int64", [10], b)]
            self.assertEqual((len(fixed), len(both)), (1, 2))
            self.assertEqual(c.save(1, both), "queued")
            del b, both
            gc.collect()
            self.assertIsNotNone(owner(), "cairn let go of a buffer it still reads")
            c.fence()
            gc.collect()
            self.assertIsNone(owner(), "the fence kept the copied buffer alive")
            a += 1  # the same list, saved again, holds the bytes at the second save
            self.assertEqual(c.save(2, fixed), "queued")
            c.fence()
            for step, want in ((1, np.arange(1000) * 1.0), (2, np.arange(1000) + 1.0)):
                back_a, back_b = np.zeros(1000, dtype=np.float32), np.zeros(10, dtype=np.int64)
                targets = [cairn.Shard.from_buffer("a", "float32", [1000], back_a)]
                if step == 1:
                    targets.append(cairn.Shard.from_buffer("b", "int64", [10], back_b))
                self.assertEqual(c.restore(targets, step=step).step, step)
                self.assertTrue((back_a == want).all())
                self.assertTrue(step == 2 or (back_b == 3).all())
            with self.assertRaisesRegex(cairn.Error, "a list of cairn.Shard or a cairn.ShardList, not str"):
                c.save(3, "not shards")

    def test_buffers_round_trip_and_errors_name_their_kind(self):
        import numpy as np

        import cairn

        o = self.options("core")
        a = np.arange(1000, dtype=np.float32).reshape(10, 100)
        with cairn.Checkpointer(o) as c:
            self.assertEqual(c.save(1, [cairn.Shard.from_buffer("w", "float32", [10, 100], a)],
                                    {"meta": b"\x00\xffbinary"}), "queued")
            c.fence()
            back = np.zeros((5, 100), dtype=np.float32)  # rows 5..9 only
            r = c.restore([cairn.Shard.from_buffer("w", "float32", [10, 100], back,
                                                   offsets=[5, 0], lengths=[5, 100])])
            self.assertEqual((r.step, r.tier, r.blobs["meta"]), (1, "host", b"\x00\xffbinary"))
            self.assertTrue((back == a[5:]).all())
            with self.assertRaises(cairn.Error) as e:
                c.save(1, [])
            self.assertEqual(e.exception.code, "InvalidArgument")
            self.assertIn("steps must increase", str(e.exception))
            # Every error is a cairn.Error with its kind, the bad buffers' included.
            for call, text in [
                (lambda: cairn.Shard.from_buffer("t", "float32", [100, 10], a.T), "not C-contiguous"),
                (lambda: cairn.Shard.from_buffer("w", "complex64", [10, 100], a), "unknown dtype"),
                (lambda: cairn.Shard.from_buffer("w", "float32", [10, 100], bytes(4000)),
                 "buffer of 'w'"),  # read-only
                (lambda: cairn.Shard.from_buffer("w", "float32", [10, 10], a), "its box needs"),
                (lambda: c.save(2, [], {"b": 3}), "must be bytes or str"),
            ]:
                with self.assertRaisesRegex(cairn.Error, text) as e:
                    call()
                self.assertEqual(e.exception.code, "InvalidArgument", text)
        with self.assertRaisesRegex(cairn.Error, "closed") as e:
            c.fence()
        self.assertEqual(e.exception.code, "FailedPrecondition")

    def test_flat_ranges_save_and_restore_as_in_cpp(self):
        import numpy as np

        import cairn

        o = self.options("flat")
        w = np.arange(60, dtype=np.float32).reshape(3, 4, 5)
        flat = w.reshape(-1)
        with cairn.Checkpointer(o) as c:
            # Two ranks' ZeRO partitions of w, as one rank's shards: [0, 27) and [27, 60).
            parts = [flat[:27].copy(), flat[27:].copy()]
            shards = cairn.Shard.from_flat_range("w", "float32", [3, 4, 5], 0, parts[0])
            self.assertLessEqual(len(shards), 2 * 3 - 1)
            self.assertEqual(sum(s.nbytes for s in shards), 27 * 4)
            shards += cairn.Shard.flat_range("w", "float32", [3, 4, 5], 27, 60,
                                             parts[1].ctypes.data, owner=parts[1])
            self.assertEqual(c.save(1, shards), "queued")
            c.fence()
            back = np.zeros((3, 4, 5), dtype=np.float32)
            c.restore([cairn.Shard.from_buffer("w", "float32", [3, 4, 5], back)])
            self.assertTrue((back == w).all())
            mid = np.zeros(13, dtype=np.float32)  # a range no rank saved as such
            c.restore(cairn.Shard.from_flat_range("w", "float32", [3, 4, 5], 21, mid))
            self.assertTrue((mid == flat[21:34]).all())
            with self.assertRaises(cairn.Error) as e:
                cairn.Shard.flat_range("w", "float32", [3, 4, 5], 50, 61, parts[1].ctypes.data)
            self.assertEqual(e.exception.code, "InvalidArgument")

    def test_waits_and_copies_release_the_gil(self):
        import threading

        import numpy as np

        import cairn

        o = self.options("gil")
        a = np.ones(64 << 20, dtype=np.float32)  # 256 MiB
        stamps, stop = [], threading.Event()

        def tick():  # Python code: runs only while nobody holds the GIL
            while not stop.is_set():
                stamps.append(time.perf_counter())

        with cairn.Checkpointer(o) as c:
            c.save(1, [cairn.Shard.from_buffer("w", "float32", [a.size], a)])
            c.fence()
            back = np.zeros_like(a)
            targets = [cairn.Shard.from_buffer("w", "float32", [a.size], back)]
            t = threading.Thread(target=tick)
            t.start()
            time.sleep(0.02)
            t0 = time.perf_counter()
            c.restore(targets)  # verifies and copies 256 MiB
            t1 = time.perf_counter()
            stop.set()
            t.join()
        self.assertTrue((back == a).all())
        if t1 - t0 < 0.03:
            self.skipTest(f"restore() took only {(t1 - t0) * 1e3:.1f} ms: too short to tell")
        # Python's switch interval is 5 ms: the other thread may run up to 5 ms on either side
        # of the call (it asked for the GIL); in between only a released GIL lets it run.
        inside = sum(1 for x in stamps if t0 + 0.007 < x < t1 - 0.007)
        self.assertGreater(inside, 0, f"no Python ran during {(t1 - t0) * 1e3:.0f} ms of restore()")


    def test_wait_for_slot_returns_once_a_save_finds_a_slot(self):
        import numpy as np

        import cairn

        o = self.options("slotwait")
        o.slots = 2
        a = np.arange(1 << 16, dtype=np.float32)
        with cairn.Checkpointer(o) as c:
            for step in (1, 2, 3):
                c.wait_for_slot(5.0)  # the run's "last" saves: never skipped
                shards = [cairn.Shard.from_buffer("w", "float32", [a.size], a)]
                self.assertEqual(c.save(step, shards), "queued")
                c.fence()
            c.wait_captured()
            self.assertEqual([v.step for v in c.versions()], [3, 2])

if __name__ == "__main__":
    unittest.main()
