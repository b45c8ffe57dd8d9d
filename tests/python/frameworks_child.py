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
        plugins.append(cairn.lightning.CheckpointIO())
        ck = saver.checkpointer
    trainer = L.Trainer(
        accelerator="cpu", devices=1, num_nodes=2, max_steps=a.steps,
        strategy=DDPStrategy(process_group_backend="gloo", timeout=timedelta(seconds=60)),
        callbacks=callbacks, plugins=plugins, logger=False, enable_checkpointing=False,
        enable_progress_bar=False, enable_model_summary=False)
    path = {"cairn": None if a.no_cairn else cairn.lightning.ckpt_path(),
            "none": None}[a.resume]
    trainer.fit(Module(), train_dataloaders=StatefulDataLoader(data, batch_size=2),
                ckpt_path=path)
    if path is not None:
        print(f"resumed {plugins[0].last_report.step} from {plugins[0].last_report.tier}",
              flush=True)
    if not a.no_cairn:
        cairn.dcp.close()


def main():
    p = argparse.ArgumentParser()
    p.add_argument("framework", choices=["hf", "lightning"])
    p.add_argument("--steps", type=int, default=20)
    p.add_argument("--out", required=True)
    p.add_argument("--workdir", default=None)
    p.add_argument("--resume", default="none")
    p.add_argument("--no-cairn", action="store_true")
    p.add_argument("--step-sleep", type=float, default=0.0)
    p.add_argument("--export", default=None)
    p.add_argument("--export-at", type=int, default=0)
    a = p.parse_args()
    a.workdir = a.workdir or os.path.dirname(os.path.abspath(a.out))
    {"hf": hf, "lightning": lightning}[a.framework](a)


if __name__ == "__main__":
    sys.exit(main())
