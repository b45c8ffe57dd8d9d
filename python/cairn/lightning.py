"""cairn.lightning: a Lightning Trainer checkpointed by cairn every training step, on every
rank, and resumed through fit(ckpt_path="cairn").

    import lightning as L
    import cairn.lightning

    trainer = L.Trainer(..., callbacks=[cairn.lightning.Checkpoint()],             # (1)
                        plugins=[cairn.lightning.CheckpointIO()])
    trainer.fit(model, ckpt_path=cairn.lightning.ckpt_path())                      # (2)

`Checkpoint` (a Callback) saves, after every `save_every`-th optimizer step
(`on_train_batch_end`, where Lightning's own ModelCheckpoint saves), what Lightning's own
checkpoint holds (the LightningModule's state, the optimizers, the LR schedulers, the
loops' progress, the callbacks' and data loaders' states) plus this rank's RNG states, to
cairn on every rank: queued, the tensors copied while the next forward and backward run.
Before every optimizer step (`on_before_optimizer_step`) it fences, so the optimizer never
writes a tensor before its copy.

`ckpt_path()` (collective) is "cairn" when the job holds a version in any tier (this
node's memory, a replica or parity on another node, the PFS), else None: fit() then starts
from scratch. `fit(ckpt_path="cairn")` (or "cairn:<step>") goes through the Trainer's own
restore: CheckpointIO.load_checkpoint, which Lightning calls on every rank, returns the
newest version every rank can restore as Lightning's checkpoint dict (each rank its own
loops' and loaders' state), and the Trainer restores the module, optimizers, schedulers,
loops and callbacks from it. Any other path goes to Lightning's default checkpoint IO.

Mid-epoch resumes continue at the next batch only with a data loader that has state
(torchdata's StatefulDataLoader, for example): that is Lightning's own rule. Strategies:
DDP (and single-device) as above. ModelParallel (FSDP2 and tensor parallelism through
configure_model) calls no CheckpointIO: use cairn.lightning.ModelParallelStrategy in its
place, with the same callback; the callback then saves the sharded module and optimizers
in place (not ModelParallel's CPU copies) and the strategy's load_checkpoint serves
fit(ckpt_path="cairn"), resharding when the layout changed. FSDPStrategy (FSDP1): not yet.

Settings: the CAIRN_* variables (docs/settings.md) and RANK / WORLD_SIZE, as every cairn
module; the process's checkpointer is cairn.dcp.checkpointer()'s, shared with cairn.dcp.
"""

import contextlib
import re

import lightning.pytorch as pl
from lightning.fabric.plugins.io.torch_io import TorchCheckpointIO
from lightning.pytorch.strategies import ModelParallelStrategy as _ModelParallel

import cairn.dcp
from cairn.torch import _error, rng_state, set_rng_state

_CKPT = re.compile(r"^cairn(?::(\d+))?$")


def _cairn_step(path):
    """(True, step or None) when `path` names a cairn version ("cairn", "cairn:<step>")."""
    m = _CKPT.match(str(path)) if path is not None else None
    if m is None:
        return False, None
    return True, None if m.group(1) is None else int(m.group(1))


def ckpt_path(checkpointer=None):
    """Collective: "cairn" when the job holds a version every rank can restore, else None
    (what fit(ckpt_path=...) takes: resume when there is something to resume from)."""
    ck = checkpointer if checkpointer is not None else cairn.dcp.checkpointer()
    return None if ck._head(None) is None else "cairn"


class Checkpoint(pl.Callback):
    """Saves Lightning's checkpoint to cairn after every `save_every`-th optimizer step, on
    every rank, and fences before every optimizer step (the module's text).
    `checkpointer`: a cairn.torch.StateCheckpointer (default: the process's,
    cairn.dcp.checkpointer(**settings))."""

    def __init__(self, save_every=1, checkpointer=None, **settings):
        if int(save_every) < 1:
            raise ValueError(f"cairn.lightning: save_every must be >= 1, not {save_every}")
        self.save_every = int(save_every)
        self._ck = checkpointer
        self._settings = settings
        self.last_save = None  # the newest save's cairn.torch.SaveHandle
        self._epoch_end = True
        self._rng_at_batch = None

    @property
    def checkpointer(self):
        if self._ck is None:
            self._ck = cairn.dcp.checkpointer(**self._settings)
        return self._ck

    # The callback's own state in every checkpoint, Lightning's or cairn's: this rank's RNG
    # states (Lightning's checkpoints do not hold them; a resumed dropout needs them), and
    # whether the step ended an epoch. Resumed after an epoch's last batch, they are put
    # back at once, so that the next epoch's data loader iterator draws from them as it did;
    # resumed mid-epoch, once that iterator is made (it draws its base seed from torch's
    # RNG), at the next batch's start, as the uninterrupted run had them there.
    def state_dict(self):
        return {"rng": rng_state(), "epoch_end": self._epoch_end}

    def load_state_dict(self, state_dict):
        if "rng" not in state_dict:
            return
        if state_dict.get("epoch_end", True):
            set_rng_state(state_dict["rng"])
        else:
            self._rng_at_batch = state_dict["rng"]

    def on_train_batch_start(self, trainer, pl_module, batch, batch_idx):
        if self._rng_at_batch is not None:
            set_rng_state(self._rng_at_batch)
            self._rng_at_batch = None

    def on_before_optimizer_step(self, trainer, pl_module, optimizer):
        if self.last_save is not None:
            self.checkpointer.fence()

    def on_train_batch_end(self, trainer, pl_module, outputs, batch, batch_idx):
        step = trainer.global_step
        if step == 0 or step % self.save_every or (
                self.last_save is not None and self.last_save.step == step):
            return  # no optimizer step since the last save (gradient accumulation)
        self._epoch_end = batch_idx + 1 >= trainer.num_training_batches
        sharded = _is_model_parallel(trainer.strategy)
        with _states_left_out(trainer.strategy) if sharded else contextlib.nullcontext():
            ckpt = trainer._checkpoint_connector.dump_checkpoint(weights_only=False)
        if sharded:
            # The optimizers themselves: their state_dict() holds the sharded DTensors in
            # place (ModelParallel's own optimizer_state() gathers copies to the CPU).
            ckpt["optimizer_states"] = dict(enumerate(trainer.optimizers))
        # The module itself, not its state_dict()'s tensors: cairn then copies its buffers
        # at save (a forward pass may write them before the fence); under ModelParallel
        # its state_dict() holds the sharded DTensors.
        ckpt["state_dict"] = pl_module
        self.last_save = self.checkpointer.save(step, ckpt)

    def on_train_end(self, trainer, pl_module):
        if self._ck is not None and not self._ck.closed:
            self._ck.wait_captured()  # the last version is whole before fit() returns


def _no_version():
    return _error("cairn.lightning: the job holds no version to resume from "
                  "(fit(ckpt_path=cairn.lightning.ckpt_path()) starts from scratch then)",
                  "NotFound")


def _check_saved_by_lightning(step, ckpt):
    if "pytorch-lightning_version" not in ckpt:
        raise _error(f"cairn.lightning: step {step} was not saved by cairn.lightning (it "
                     "holds no Lightning checkpoint)")


def _is_model_parallel(strategy):
    return isinstance(strategy, _ModelParallel)


class _states_left_out:
    """Lightning's dump_checkpoint without the strategy's model and optimizer states (which
    ModelParallel gathers to the CPU): the callback saves the module and the optimizers
    themselves."""

    def __init__(self, strategy):
        self.strategy = strategy

    def __enter__(self):
        self.strategy.lightning_module_state_dict = dict
        self.strategy.optimizer_state = lambda optimizer: {}

    def __exit__(self, *exc):
        del self.strategy.lightning_module_state_dict
        del self.strategy.optimizer_state


class ModelParallelStrategy(_ModelParallel):
    """Lightning's ModelParallelStrategy (FSDP2 and tensor parallelism through
    configure_model) whose load_checkpoint also takes "cairn" / "cairn:<step>": the sharded
    module and optimizers filled in place from that version (resharded if the layout
    changed), the rest of Lightning's checkpoint (loops, schedulers, callbacks) returned to
    the Trainer. ModelParallel never calls a CheckpointIO, so this is where cairn's load
    goes; use it with the Checkpoint callback. `checkpointer`: as Checkpoint's."""

    def __init__(self, *args, checkpointer=None, **kwargs):
        super().__init__(*args, **kwargs)
        self._ck = checkpointer
        self.last_report = None  # the cairn.RestoreReport of the last load from cairn

    def load_checkpoint(self, checkpoint_path, weights_only=None):
        is_cairn, step = _cairn_step(checkpoint_path)
        if not is_cairn:
            return super().load_checkpoint(checkpoint_path, weights_only=weights_only)
        ck = self._ck if self._ck is not None else cairn.dcp.checkpointer()
        targets = {"state_dict": self.model, "optimizer_states": dict(enumerate(self.optimizers))}
        report = ck.load(targets, step=step)
        if report is None:
            raise _no_version()
        saved = ck._saved_of(ck._head(report.step))
        rest = sorted({k.split(".", 1)[0] for k in saved.plain} - set(targets))
        got, ckpt = ck.load_new(step=report.step, keys=rest)
        _check_saved_by_lightning(got, ckpt)
        self.last_report = report
        return ckpt


class CheckpointIO(TorchCheckpointIO):
    """Lightning's checkpoint IO with "cairn" (or "cairn:<step>") as a path: load_checkpoint
    returns that cairn version as Lightning's checkpoint dict (on every rank, each its own
    non-tensor state). Other paths, and every save, are Lightning's default (torch.save)."""

    def __init__(self, checkpointer=None):
        super().__init__()
        self._ck = checkpointer
        self.last_report = None  # the cairn.RestoreReport of the last load

    def load_checkpoint(self, path, map_location=None, weights_only=None):
        is_cairn, step = _cairn_step(path)
        if not is_cairn:
            return super().load_checkpoint(path, map_location=map_location,
                                           weights_only=weights_only)
        ck = self._ck if self._ck is not None else cairn.dcp.checkpointer()
        got, ckpt = ck.load_new(step=step)
        if got is None:
            raise _no_version()
        _check_saved_by_lightning(got, ckpt)
        self.last_report = ck.last_report
        if map_location is not None:
            import torch

            ckpt = _to(ckpt, map_location, torch)
        return ckpt


def _to(obj, device, torch):
    if torch.is_tensor(obj):
        return obj.to(device)
    if isinstance(obj, dict):
        return {k: _to(v, device, torch) for k, v in obj.items()}
    if isinstance(obj, list):
        return [_to(v, device, torch) for v in obj]
    return obj
