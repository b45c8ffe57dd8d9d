"""cairn's framework adapters against the frameworks themselves, from PyPI at the versions
python/requirements.txt pins (frameworks_child.py runs one rank): each trains on 2
processes over gloo, every rank its own node, is SIGKILLed at a random step, and resumes
through the framework's own resume path; every later loss equals an uninterrupted run's,
bit for bit."""

import os
import random
import shutil
import socket
import subprocess
import sys
import unittest

from test_torch import HERE, Job, finish_ranks, kill_once_replicated, read_step_losses

import torch  # noqa: E402  (test_torch set TMPDIR first)

import cairn  # noqa: E402
import cairn.torch  # noqa: E402


def _importable(name):
    try:
        __import__(name)
    except ImportError:
        return False
    return True


def _free_port():
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


class _FrameworkRun(unittest.TestCase):
    """A 2-process job of one framework (FRAMEWORK: frameworks_child.py's first word)."""

    FRAMEWORK = None
    STEPS = 16
    ARGS = ()

    def setUp(self):
        self.job = Job(self.FRAMEWORK)
        self.addCleanup(self.job.close)

    def start(self, args, world=2, host="host", steps=None, workdir="work"):
        port = str(_free_port())
        extra = {"USE_LIBUV": "0", "TORCHELASTIC_RUN_ID": self.job.id, "CAIRN_HOST_ROOT": os.path.join(self.job.root, host),
                 "CAIRN_PERSIST_EVERY": "0", "OMP_NUM_THREADS": "1",
                 "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": port,
                 "TRANSFORMERS_OFFLINE": "1", "HF_HUB_OFFLINE": "1", "HF_DATASETS_OFFLINE": "1",
                 "HF_HOME": os.path.join(self.job.root, "hf-home")}
        cmd = [sys.executable, os.path.join(HERE, "frameworks_child.py"), self.FRAMEWORK,
               "--steps", str(steps or self.STEPS),
               "--workdir", os.path.join(self.job.root, workdir),
               *self.ARGS, *args]
        return [subprocess.Popen(cmd, env=self.job.env(r, world, extra), stdout=subprocess.PIPE,
                                 stderr=subprocess.STDOUT, text=True) for r in range(world)]

    def finish(self, procs, what):
        return finish_ranks(self, procs, what)

    def reference(self):
        ref = os.path.join(self.job.root, "ref")
        self.finish(self.start(["--out", ref, "--no-cairn"]), "reference run")
        want = [read_step_losses(f"{ref}-{r}") for r in range(2)]
        self.assertEqual(sorted(want[0]), list(range(1, self.STEPS + 1)))
        return want

    def killed_run(self, out):
        """Trains from scratch until a random step whose version is replicated, then
        SIGKILLs both ranks; returns the last step logged."""
        kill_at = random.randrange(5, self.STEPS - 4)
        procs = self.start(["--out", out, "--step-sleep", "0.2"])
        logged, outs = kill_once_replicated(procs, out, kill_at, 0.1)
        self.assertLess(logged, self.STEPS, "the run ended before it was killed:\n" +
                        "\n".join(outs))
        return logged

    def resumed_run(self, out, want, tiers, resume):
        before = []
        for r in range(2):
            with open(f"{out}-{r}") as f:
                before.append(len(f.readlines()))
        outs = self.finish(self.start(["--out", out, "--resume", resume]), "resumed run")
        resumed = []
        for text in outs:
            lines = [l.split() for l in text.splitlines() if l.startswith("resumed ")]
            self.assertEqual(len(lines), 1, text)
            resumed.append((int(lines[0][1]), lines[0][3]))
        self.assertEqual(resumed[0][0], resumed[1][0], resumed)
        for r in range(2):  # the resumed run trained from the resumed step on, not again
            with open(f"{out}-{r}") as f:
                steps = [int(l.split()[0]) for l in f.readlines()[before[r]:]]
            self.assertEqual(steps, list(range(resumed[r][0] + 1, self.STEPS + 1)),
                             f"rank {r}: the steps the resumed run trained")
        self.assertEqual([t for _, t in resumed], tiers, resumed)
        for r in range(2):
            got = read_step_losses(f"{out}-{r}")
            for s in range(1, self.STEPS + 1):
                self.assertEqual(got[s], want[r][s], f"rank {r}: loss at step {s} (resumed "
                                                     f"{resumed[r][0]})")
        return resumed[0][0]

    def check_killed_and_resumed(self, resume):
        want = self.reference()
        out = os.path.join(self.job.root, "run")
        logged = self.killed_run(out)
        step = self.resumed_run(out, want, ["host", "host"], resume)
        self.assertGreaterEqual(step, logged - 2)

    def check_wiped_node_from_partner(self, resume):
        want = self.reference()
        out = os.path.join(self.job.root, "run")
        self.killed_run(out)
        shutil.rmtree(os.path.join(self.job.root, "host", self.job.id, "node-1"))
        self.resumed_run(out, want, ["host", "peer"], resume)


@unittest.skipUnless(_importable("transformers"), "transformers is not installed")
class HFTrainer(_FrameworkRun):
    """Hugging Face's Trainer (DDP on CPU) with cairn.transformers.Trainer, resumed through
    train(resume_from_checkpoint=True); and a version exported to the Hugging Face layout,
    loaded by AutoModelForCausalLM.from_pretrained with the saved model's logits."""

    FRAMEWORK = "hf"

    def test_killed_and_resumed_from_own_memory_bit_exact(self):
        self.check_killed_and_resumed("true")

    def test_a_wiped_node_resumes_from_its_partner_bit_exact(self):
        self.check_wiped_node_from_partner("true")

    def test_a_version_exported_loads_with_from_pretrained(self):
        import transformers

        export = os.path.join(self.job.root, "export")
        at = self.STEPS // 2
        outs = self.finish(self.start(["--out", os.path.join(self.job.root, "run"),
                                       "--export", export, "--export-at", str(at)]), "run")
        self.assertIn(f"exported step {at}", outs[0])
        files = sorted(os.listdir(export))
        shards = [f for f in files if f.endswith(".safetensors")]
        self.assertGreater(len(shards), 1, files)
        self.assertIn("model.safetensors.index.json", files)
        model = transformers.AutoModelForCausalLM.from_pretrained(export)
        model.eval()
        saved = torch.load(os.path.join(export, "logits.pt"), weights_only=True)
        with torch.no_grad():
            logits = model(input_ids=saved["input_ids"]).logits
        self.assertTrue(torch.equal(logits, saved["logits"]),
                        f"largest difference {(logits - saved['logits']).abs().max()}")


@unittest.skipUnless(_importable("lightning") and _importable("torchdata"),
                     "lightning or torchdata is not installed")
class LightningDDP(_FrameworkRun):
    """A Lightning Trainer (DDP over gloo, Lightning's demo Transformer with dropout, a
    stateful data loader) with cairn.lightning's callback and checkpoint IO, resumed
    through fit(ckpt_path="cairn")."""

    FRAMEWORK = "lightning"

    def test_killed_and_resumed_from_own_memory_bit_exact(self):
        self.check_killed_and_resumed("cairn")

    def test_a_wiped_node_resumes_from_its_partner_bit_exact(self):
        self.check_wiped_node_from_partner("cairn")


@unittest.skipUnless(_importable("lightning") and _importable("torchdata"),
                     "lightning or torchdata is not installed")
class LightningModelParallel(LightningDDP):
    """The same with Lightning's ModelParallelStrategy (FSDP2 over the 2 processes through
    configure_model): cairn.lightning.ModelParallelStrategy's load_checkpoint serves
    fit(ckpt_path="cairn"), the sharded module and optimizer filled in place."""

    ARGS = ("--model-parallel",)


@unittest.skipUnless(_importable("torchtitan") and _importable("tokenizers"),
                     "torchtitan is not installed")
class Torchtitan(_FrameworkRun):
    """torchtitan's own trainer (its llama3 debug model, FSDP2 over 2 processes, gloo, on the
    CPU) with cairn.torchtitan's checkpoint manager chosen by its config, resumed through
    its own checkpointer.load(); and a resume that leaves the data loader out
    (exclude_from_loading)."""

    FRAMEWORK = "torchtitan"

    def setUp(self):
        super().setUp()
        assets = os.path.join(self.job.root, "assets")
        subprocess.run([sys.executable, os.path.join(HERE, "frameworks_child.py"),
                        "titan-assets", "--out", assets], check=True)
        self.ARGS = ("--assets", assets)

    def test_killed_and_resumed_from_own_memory_bit_exact(self):
        self.check_killed_and_resumed("cairn")

    def test_a_wiped_node_resumes_from_its_partner_bit_exact(self):
        self.check_wiped_node_from_partner("cairn")

    def test_exclude_from_loading_resumes_as_torchtitans_own_manager_does(self):
        """A run stops at half its steps; the next resumes with the data loader excluded
        (it starts the data over): with cairn's manager and with torchtitan's own DCP
        manager, every later loss is the same."""
        half, got = self.STEPS // 2, {}
        for name, flags in (("cairn", []),
                            ("titan", ["--titan-async", "disabled", "--interval", "100"])):
            out = os.path.join(self.job.root, name)
            self.finish(self.start(["--out", out, *flags], steps=half, workdir=name),
                        f"{name}: first half")
            outs = self.finish(self.start(["--out", out, "--exclude", "dataloader", *flags],
                                          workdir=name), f"{name}: resumed")
            if name == "cairn":
                for text in outs:
                    self.assertIn(f"resumed {half} from host", text)
            got[name] = [read_step_losses(f"{out}-{r}") for r in range(2)]
        for r in range(2):
            self.assertEqual(sorted(got["cairn"][r]), list(range(1, self.STEPS + 1)))
            for s in range(half + 1, self.STEPS + 1):
                self.assertEqual(got["cairn"][r][s], got["titan"][r][s],
                                 f"rank {r}: loss at step {s}")


@unittest.skipUnless(_importable("deepspeed"), "deepspeed is not installed")
class DeepSpeedZeRO(_FrameworkRun):
    """A DeepSpeed engine (ZeRO stages 1, 2 and 3 on the CPU, gloo; Adam and WarmupLR from
    its config; a transformer layer with dropout) given cairn's decoupled checkpoint engine by
    cairn.deepspeed.attach, saved every step, committed (fenced) inside engine.step(), and
    resumed through engine.load_checkpoint()."""

    FRAMEWORK = "deepspeed"
    STEPS = 14

    def zero(self, stage):
        self.ARGS = ("--zero", str(stage))

    def test_deepspeeds_objects_round_trip_as_data_and_others_are_refused(self):
        import cairn.deepspeed as cd
        from deepspeed.runtime.fp16.loss_scaler import DynamicLossScaler
        from deepspeed.runtime.zero.config import ZeroStageEnum
        from deepspeed.utils.tensor_fragment import fragment_address

        scaler = DynamicLossScaler(init_scale=2.0 ** 8, scale_window=100, min_scale=1,
                                   delayed_shift=2, consecutive_hysteresis=False)
        scaler.cur_iter = 7
        state = {"loss_scaler": scaler, "zero_stage": ZeroStageEnum.gradients,
                 "shapes": [{"w": torch.Size([3, 4])}],
                 "maps": {"w": fragment_address(numel=12, start=4)}, "t": torch.ones(2)}
        data = cd._to_data(state, "f.pt")
        blob = cairn.torch._encode(data, "test")  # plain data: the safe unpickler's
        back = cd._from_data(cairn.torch._decode(blob, "test", 1))
        self.assertIs(type(back["loss_scaler"]), DynamicLossScaler)
        self.assertEqual(vars(back["loss_scaler"]), vars(scaler))
        self.assertIs(back["zero_stage"], ZeroStageEnum.gradients)
        self.assertEqual(back["shapes"][0]["w"], torch.Size([3, 4]))
        self.assertIsInstance(back["shapes"][0]["w"], torch.Size)
        self.assertEqual(back["maps"]["w"], fragment_address(numel=12, start=4))
        with self.assertRaisesRegex(cairn.Error, r"f\.pt\.client\.opener is a .*Popen"):
            cd._to_data({"client": {"opener": subprocess.Popen.__new__(subprocess.Popen)}},
                        "f.pt")
        with self.assertRaisesRegex(cairn.Error, "kind 'os.system'"):
            cd._from_data({"x": {cd._TYPE: "os.system", "value": "true"}})

    def test_save_16bit_model_writes_deepspeeds_file_and_no_checkpoint_files(self):
        self.zero(1)
        export = os.path.join(self.job.root, "export")
        self.finish(self.start(["--out", os.path.join(self.job.root, "run"), "--export",
                                export], steps=3), "run")
        weights = torch.load(os.path.join(export, "pytorch_model.bin"), weights_only=True)
        self.assertIn("head.weight", weights)
        self.assertEqual(tuple(weights["head.weight"].shape), (64, 64))
        ckpt = os.path.join(self.job.root, "work", "ckpt")  # cairn's saves wrote no files
        self.assertEqual(sorted(os.listdir(ckpt)), ["zero_to_fp32.py", "zero_to_torch.py"])

    def test_zero1_killed_and_resumed_from_own_memory_bit_exact(self):
        self.zero(1)
        self.check_killed_and_resumed("cairn")

    def test_zero2_a_wiped_node_resumes_from_its_partner_bit_exact(self):
        self.zero(2)
        self.check_wiped_node_from_partner("cairn")

    def test_zero3_killed_and_resumed_from_own_memory_bit_exact(self):
        self.zero(3)
        self.check_killed_and_resumed("cairn")

    def test_zero3_a_wiped_node_resumes_from_its_partner_bit_exact(self):
        self.zero(3)
        self.check_wiped_node_from_partner("cairn")


if __name__ == "__main__":
    unittest.main()
