"""One rank of the framework adapters' tests (test_frameworks.py), with RANK / WORLD_SIZE,
MASTER_ADDR / MASTER_PORT and cairn's settings in the environment; gloo on CPU.

    frameworks_child.py hf --steps N --out FILE [--resume true|cairn|none] [--no-cairn]
                           [--step-sleep S] [--export DIR --export-at S]
        trains a small Llama (transformers' own LlamaForCausalLM, from a config made here,
        attention dropout on) with cairn.transformers.Trainer on 2 processes (DDP), saving
        every step; train(resume_from_checkpoint=...) resumes. Appends
        "<step> <loss as float.hex()> <newest replicated step>" per step to --out with
        "-<rank>" added; prints "resumed <step>" when cairn served the resume. --export:
        after step --export-at, cairn.transformers.save_pretrained of that step to DIR and
        the model's logits on a fixed batch to DIR/logits.pt (rank 0).
    frameworks_child.py lightning --steps N --out FILE [--resume cairn|none] [--no-cairn]
                           [--step-sleep S]
        the same with a Lightning Trainer (DDP over gloo, a small transformer LightningModule,
        a stateful data loader), cairn.lightning's callback and checkpoint IO, resumed through
        fit(ckpt_path="cairn").
    frameworks_child.py torchtitan --assets DIR --steps N --out FILE [--no-cairn]
                           [--exclude KEY ...] [--interval K] [--step-sleep S]
                           [--titan-async disabled|async|async_with_pinned_mem]
                           [--timing FILE] [--save-blocks B]
        torchtitan's trainer (its llama3 debug model, FSDP2 over gloo; DIR from
        titan-assets) with cairn.torchtitan's manager saving every K steps, or with
        torchtitan's own DCP manager (--titan-async), resuming from the newest checkpoint;
        --timing appends per step (JSON, FILE-<rank>) the seconds spent in the checkpointer's
        save, maybe_wait_for_staging and load since the last step; --save-blocks B saves
        only in every other block of B steps (steps B to 2B-1, 3B to 4B-1, ...: one job's
        iterations with and without saves, for bench/torchtitan_compare.py).
    frameworks_child.py titan-assets --out DIR
        the tokenizer and data set the torchtitan runs read.
    frameworks_child.py deepspeed --zero STAGE --steps N --out FILE [--resume cairn|none]
                           [--no-cairn] [--step-sleep S]
        the same with a DeepSpeed engine (ZeRO stage STAGE, Adam and WarmupLR from its config,
        a small transformer with dropout, DS_ACCELERATOR=cpu) given cairn's checkpoint engine
        by cairn.deepspeed.attach, saved every step, resumed through
        engine.load_checkpoint().
"""

import argparse
import faulthandler
import os
import sys
import time

import torch

faulthandler.enable()


def _log(out, rank, step, loss, ck):
    rep = -1 if ck is None else ck.stats().newest_replicated_step
    with open(f"{out}-{rank}", "a") as f:
        f.write(f"{step} {float(loss).hex()} {rep}\n")


def _tiny_llama_config(transformers):
    return transformers.LlamaConfig(
        vocab_size=128, hidden_size=32, intermediate_size=64, num_hidden_layers=2,
        num_attention_heads=4, num_key_value_heads=2, max_position_embeddings=64,
        attention_dropout=0.1, tie_word_embeddings=False)


def _tokens(n, seed=0):
    g = torch.Generator().manual_seed(seed)
    return [torch.randint(0, 128, (16,), generator=g) for _ in range(n)]


def hf(a):
    import transformers

    import cairn.dcp
    import cairn.transformers

    rank = int(os.environ["RANK"])
    transformers.set_seed(42)
    model = transformers.LlamaForCausalLM(_tiny_llama_config(transformers))
    data = [{"input_ids": t} for t in _tokens(8 * a.steps)]

    def collate(feats):
        ids = torch.stack([f["input_ids"] for f in feats])
        return {"input_ids": ids, "labels": ids.clone()}

    args = transformers.TrainingArguments(
        output_dir=a.workdir, max_steps=a.steps, per_device_train_batch_size=2,
        learning_rate=3e-3, lr_scheduler_type="linear", warmup_steps=3, logging_steps=1,
        save_strategy="no", use_cpu=True, ddp_backend="gloo", report_to="none", seed=42,
        dataloader_num_workers=0, disable_tqdm=True)
    base = transformers.Trainer if a.no_cairn else cairn.transformers.Trainer

    class Recording(base):
        def training_step(self, model, inputs, *rest, **kw):
            loss = super().training_step(model, inputs, *rest, **kw)
            ck = None if a.no_cairn else self.cairn.checkpointer
            _log(a.out, rank, self.state.global_step + 1, loss.item(), ck)
            if a.step_sleep:
                time.sleep(a.step_sleep)
            return loss

    class Export(transformers.TrainerCallback):
        def on_step_end(self, args, state, control, model=None, **kw):
            if state.global_step != a.export_at:
                return
            trainer.cairn.checkpointer.wait_captured()
            step, files = cairn.transformers.save_pretrained(
                a.export, model, step=a.export_at, max_shard_size="40KB")
            if rank == 0:
                with torch.no_grad():
                    batch = torch.stack(_tokens(2, seed=7))
                    was = model.training
                    model.eval()
                    logits = model(input_ids=batch).logits
                    model.train(was)
                torch.save({"input_ids": batch, "logits": logits}, os.path.join(a.export,
                                                                                "logits.pt"))
                print(f"exported step {step}: {len(files)} files", flush=True)

    trainer = Recording(model=model, args=args, train_dataset=data, data_collator=collate)
    if a.export:
        trainer.add_callback(Export())  # after cairn's: the step is saved when it runs
    resume = {"true": True, "cairn": "cairn", "none": None}[a.resume]
    trainer.train(resume_from_checkpoint=resume)
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()  # a DDP process left to exit with it may abort
    if not a.no_cairn:
        if trainer.cairn_step is not None:
            print(f"resumed {trainer.cairn_step} from "
                  f"{trainer.cairn_report.tier}", flush=True)
        cairn.dcp.close()


def lightning(a):
    from datetime import timedelta

    import lightning as L
    from lightning.pytorch.demos import Transformer
    from lightning.pytorch.strategies import DDPStrategy
    from torchdata.stateful_dataloader import StatefulDataLoader

    import cairn.dcp
    import cairn.lightning

    rank = int(os.environ["RANK"])

    class Module(L.LightningModule):
        def __init__(self):
            super().__init__()
            self.model = Transformer(vocab_size=64, ninp=32, nhead=2, nhid=64, nlayers=1,
                                     dropout=0.1)

        def training_step(self, batch, batch_idx):
            inputs, target = batch
            out = self.model(inputs, target)
            return torch.nn.functional.nll_loss(out, target.view(-1))

        def configure_model(self):
            if not a.model_parallel:
                return
            from torch.distributed.fsdp import fully_shard

            mesh = self.device_mesh["data_parallel"]
            for layer in [*self.model.transformer.encoder.layers,
                          *self.model.transformer.decoder.layers]:
                fully_shard(layer, mesh=mesh)
            fully_shard(self.model, mesh=mesh)
            for m in self.model.modules():  # gloo has no PREMUL_SUM / AVG reduce-scatter
                if hasattr(m, "set_force_sum_reduction_for_comms"):
                    m.set_force_sum_reduction_for_comms(True)

        def configure_optimizers(self):
            opt = torch.optim.AdamW(self.parameters(), lr=3e-3)
            sched = torch.optim.lr_scheduler.LambdaLR(opt, lambda s: min(1.0, (s + 1) / 4))
            return {"optimizer": opt, "lr_scheduler": {"scheduler": sched, "interval": "step"}}

    ck = None

    class Recording(L.Callback):
        def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
            _log(a.out, rank, trainer.global_step, outputs["loss"].item(), ck)
            if a.step_sleep:
                time.sleep(a.step_sleep)

    L.seed_everything(42)
    g = torch.Generator().manual_seed(0)
    # One epoch longer than the run: every resume is mid-epoch (Lightning's own resume after
    # an epoch's last batch replays another order with a stateful loader: docs/frameworks.md).
    tokens = torch.randint(0, 64, (4 * (a.steps + 2), 9), generator=g)
    data = torch.utils.data.TensorDataset(tokens[:, :-1], tokens[:, 1:])
    callbacks, plugins = [Recording()], []
    if not a.no_cairn:
        saver = cairn.lightning.Checkpoint()
        callbacks.insert(0, saver)
        if not a.model_parallel:  # ModelParallel calls no CheckpointIO: its strategy loads
            plugins.append(cairn.lightning.CheckpointIO())
        ck = saver.checkpointer
    if a.model_parallel:  # FSDP2 over the 2 processes through configure_model
        kind = (L.pytorch.strategies.ModelParallelStrategy if a.no_cairn
                else cairn.lightning.ModelParallelStrategy)
        strategy = kind(data_parallel_size=2, tensor_parallel_size=1,
                        process_group_backend="gloo", timeout=timedelta(seconds=60))
    else:
        strategy = DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60))
    trainer = L.Trainer(
        accelerator="cpu", devices=1, num_nodes=2, max_steps=a.steps, strategy=strategy,
        callbacks=callbacks, plugins=plugins, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False)
    path = {"cairn": None if a.no_cairn else cairn.lightning.ckpt_path(),
            "none": None}[a.resume]
    trainer.fit(Module(), train_dataloaders=StatefulDataLoader(data, batch_size=2),
                ckpt_path=path)
    if path is not None:
        r = (strategy if a.model_parallel else plugins[0]).last_report
        print(f"resumed {r.step} from {r.tier}", flush=True)
    if not a.no_cairn:
        cairn.dcp.close()


def deepspeed_run(a):
    os.environ.setdefault("DS_ACCELERATOR", "cpu")
    import deepspeed

    import cairn.deepspeed

    rank = int(os.environ["RANK"])

    class Model(torch.nn.Module):
        def __init__(self):
            super().__init__()
            # Its feed-forward weights (128 KiB) and ZeRO's partitions are above cairn's
            # copy_below: read in place until the fence.
            self.embed = torch.nn.Embedding(64, 64)
            self.block = torch.nn.TransformerEncoderLayer(64, 2, 512, dropout=0.1,
                                                          batch_first=True)
            self.norm = torch.nn.LayerNorm(64)
            self.head = torch.nn.Linear(64, 64)

        def forward(self, x, y):
            out = self.head(self.norm(self.block(self.embed(x))))
            return torch.nn.functional.cross_entropy(out.flatten(0, 1), y.flatten())

    torch.manual_seed(42)
    config = {
        "train_micro_batch_size_per_gpu": 2, "gradient_accumulation_steps": 1,
        "optimizer": {"type": "Adam", "params": {"lr": 3e-3, "torch_adam": True}},
        "scheduler": {"type": "WarmupLR", "params": {"warmup_num_steps": 4,
                                                     "warmup_max_lr": 3e-3}},
        "zero_optimization": {"stage": a.zero}, "steps_per_print": 10 ** 6,
    }
    model = Model()
    engine, _, _, _ = deepspeed.initialize(model=model, model_parameters=model.parameters(),
                                           config=config)
    ce = None
    if not a.no_cairn:
        engine = cairn.deepspeed.attach(engine)
        ce = engine.checkpoint_engine
    ckdir = os.path.join(a.workdir, "ckpt")
    start = 0
    if a.resume == "cairn":
        path, _ = engine.load_checkpoint(ckdir)
        if path is not None:
            start = engine.global_steps
    if start == 0:
        torch.manual_seed(1000 + rank)  # the run's dropout draws (a resume restores them)
    for step in range(start + 1, a.steps + 1):
        g = torch.Generator().manual_seed(step * 10 + rank)
        tokens = torch.randint(0, 64, (2, 17), generator=g)
        loss = engine(tokens[:, :-1], tokens[:, 1:])
        engine.backward(loss)
        engine.step()
        _log(a.out, rank, step, loss.item(), None if ce is None else ce.cairn)
        if ce is not None:
            engine.save_checkpoint(ckdir)
        if a.step_sleep:
            time.sleep(a.step_sleep)
    if a.export:  # DeepSpeed's own file, written past cairn's engine
        engine.save_16bit_model(a.export)
    if ce is not None:
        if start:
            print(f"resumed {ce.last_report.step} from {ce.last_report.tier}", flush=True)
        ce.cleanup()
        ce.close()
    import torch.distributed as dist

    if dist.is_initialized():
        dist.barrier()
        dist.destroy_process_group()


_TITAN_WORDS = ("checkpoint memory tensor shard replica parity drain fence optimizer gradient "
                "step layer token batch node rank store lazy copy host device").split()


def titan_assets(a):
    """A tokenizer (a byte-level BPE trained here with the tokenizers library) and a
    c4_test-shaped dataset (data.json), generated: torchtitan's wheel ships neither."""
    import json
    import random as rnd

    from tokenizers import Tokenizer, decoders, models, pre_tokenizers, trainers

    r = rnd.Random(0)
    texts = [" ".join(r.choice(_TITAN_WORDS) for _ in range(r.randrange(40, 120)))
             for _ in range(400)]
    os.makedirs(os.path.join(a.out, "tokenizer"), exist_ok=True)
    os.makedirs(os.path.join(a.out, "data"), exist_ok=True)
    tok = Tokenizer(models.BPE())
    tok.pre_tokenizer = pre_tokenizers.ByteLevel(add_prefix_space=False)
    tok.decoder = decoders.ByteLevel()
    tok.train_from_iterator(texts, trainers.BpeTrainer(
        vocab_size=400, special_tokens=["<|begin_of_text|>", "<|end_of_text|>"],
        initial_alphabet=pre_tokenizers.ByteLevel.alphabet()))
    tok.save(os.path.join(a.out, "tokenizer", "tokenizer.json"))
    with open(os.path.join(a.out, "tokenizer", "tokenizer_config.json"), "w") as f:
        json.dump({"bos_token": "<|begin_of_text|>", "eos_token": "<|end_of_text|>",
                   "add_bos_token": True, "add_eos_token": True}, f)
    with open(os.path.join(a.out, "data", "data.json"), "w") as f:
        for t in texts:
            f.write(json.dumps({"text": t}) + "\n")


def _titan_on_cpu():
    """What torchtitan 0.3.0 needs to train on the CPU over gloo (none of it is cairn's):
    its device module (it falls back to CUDA), set before its other modules load."""
    import types

    import torchtitan.tools.utils as tu

    class CpuDevice(types.ModuleType):
        def __getattr__(self, name):
            return getattr(torch.cpu, name)

        def set_device(self, d):
            pass

        def get_device_name(self, d=None):
            return "cpu"

        def current_device(self):
            return 0

        def device_count(self):
            return 1

        def get_device_properties(self, d=None):
            return types.SimpleNamespace(total_memory=16 << 30, name="cpu")

        def reset_peak_memory_stats(self, d=None):
            pass

        def empty_cache(self):
            pass

        def memory_stats(self, d=None):
            return {}

        def synchronize(self, d=None):
            pass

    tu.device_type, tu.device_module = "cpu", CpuDevice("cpu")


def _titan_config(a, assets):
    import dataclasses

    from torchtitan.models.common.attention import FlexAttention, ScaledDotProductAttention
    from torchtitan.models.llama3.config_registry import llama3_debugmodel

    c = llama3_debugmodel()
    if a.cuda:
        _titan_config_common(c, a, assets)
        return _titan_checkpoint(c, a)
    # FlexAttention has no backward on the CPU: torchtitan's SDPA module instead.
    for _, _, parent, attr in list(c.model_spec.model.traverse(FlexAttention.Config)):
        if isinstance(parent, list):
            parent[attr] = ScaledDotProductAttention.Config()
        else:
            setattr(parent, attr, ScaledDotProductAttention.Config())
    parallelize = c.model_spec.parallelize_fn

    def gloo_parallelize(model, **kw):
        # torchtitan's gradient divide factor 1.0 makes FSDP2 reduce with PREMUL_SUM, which
        # gloo lacks; SUM is the same sum.
        from torch.distributed.fsdp import FSDPModule

        model = parallelize(model, **kw)
        for m in model.modules():
            if isinstance(m, FSDPModule):
                m.set_force_sum_reduction_for_comms(True)
        return model

    try:
        c.model_spec.parallelize_fn = gloo_parallelize
    except dataclasses.FrozenInstanceError:
        c.model_spec = dataclasses.replace(c.model_spec, parallelize_fn=gloo_parallelize)
    c.training.disable_cuda_graphs = True
    c.debug.deterministic = True
    _titan_config_common(c, a, assets)
    return _titan_checkpoint(c, a)


def _titan_config_common(c, a, assets):
    c.training.steps = a.steps
    c.training.seq_len = 64
    c.training.local_batch_size = 2
    c.validator.enable = False
    c.debug.seed = 42  # with debug.deterministic, an uninterrupted run is the same run
    c.hf_assets_path = os.path.join(assets, "tokenizer")
    c.dataloader.dataset_path = os.path.join(assets, "data")
    c.dump_folder = a.workdir


def _titan_checkpoint(c, a):
    from torchtitan.components.checkpoint import CheckpointManager

    import cairn.torchtitan

    if a.titan_async:  # torchtitan's own DCP manager (bench/torchtitan_compare.py)
        c.checkpoint = CheckpointManager.Config(
            enable=True, async_mode=a.titan_async, interval=a.interval, keep_latest_k=2,
            last_save_model_only=False, exclude_from_loading=a.exclude)
    elif a.no_cairn:
        c.checkpoint = CheckpointManager.Config(enable=False)
    else:
        c.checkpoint = cairn.torchtitan.CheckpointManager.Config(
            last_save_model_only=False, exclude_from_loading=a.exclude, interval=a.interval)
    return c


def torchtitan(a):
    if not a.cuda:
        _titan_on_cpu()
    import torch.distributed as dist

    import cairn.dcp

    rank = int(os.environ["RANK"])
    config = _titan_config(a, a.assets)
    trainer = config.build()
    ck = None if a.no_cairn or a.titan_async else trainer.checkpointer.cairn
    log = trainer.metrics_processor.log
    spent = {"save": 0.0, "maybe_wait_for_staging": 0.0, "load": 0.0}
    if a.timing:  # the seconds the trainer spends in its checkpointer, per step
        for name in spent:
            def timed(*args, _f=getattr(trainer.checkpointer, name), _n=name, **kw):
                begin = time.perf_counter()
                try:
                    return _f(*args, **kw)
                finally:
                    spent[_n] += time.perf_counter() - begin
            setattr(trainer.checkpointer, name, timed)

    def recording_log(step, avg_loss, max_loss, grad_norm, *rest, **kw):
        if a.timing:
            import json

            with open(f"{a.timing}-{rank}", "a") as f:
                f.write(json.dumps({"step": step, "t": time.perf_counter(), **spent}) + "\n")
            for k in spent:
                spent[k] = 0.0
        _log(a.out, rank, step, avg_loss, ck)
        if a.step_sleep:
            time.sleep(a.step_sleep)
        return log(step, avg_loss, max_loss, grad_norm, *rest, **kw)

    trainer.metrics_processor.log = recording_log
    if a.save_blocks:
        def should_save(step, last_step=False, _f=trainer.checkpointer._should_save):
            return _f(step, last_step) and (last_step or (step // a.save_blocks) % 2 == 1)

        trainer.checkpointer._should_save = should_save
    try:
        trainer.train()
        if ck is not None and trainer.checkpointer.last_report is not None:
            r = trainer.checkpointer.last_report
            print(f"resumed {r.step} from {r.tier}", flush=True)
    finally:
        trainer.close()
        if not a.no_cairn:
            cairn.dcp.close()
        if dist.is_initialized():
            dist.destroy_process_group()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["hf", "lightning", "torchtitan", "titan-assets",
                                         "deepspeed"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default=None)
    p.add_argument("--resume", default="none")
    p.add_argument("--no-cairn", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--export", default=None)
    p.add_argument("--export-at", type=int, default=0)
    p.add_argument("--assets", default=None)
    p.add_argument("--exclude", nargs="*", default=[])
    p.add_argument("--zero", type=int, default=1)
    p.add_argument("--interval", type=int, default=1)
    p.add_argument("--model-parallel", action="store_true")
    p.add_argument("--cuda", action="store_true", help="torchtitan on the GPU, as it ships "
                   "(no CPU shims; one rank per GPU)")
    p.add_argument("--titan-async", default=None,
                   choices=["disabled", "async", "async_with_pinned_mem"])
    p.add_argument("--timing", default=None)
    p.add_argument("--save-blocks", type=int, default=0)
    a = p.parse_args()
    a.workdir = a.workdir or os.path.dirname(os.path.abspath(a.out))
    {"hf": hf, "lightning": lightning, "torchtitan": torchtitan,
     "titan-assets": titan_assets, "deepspeed": deepspeed_run}[a.framework](a)


if __name__ == "__main__":
    sys.exit(main())
