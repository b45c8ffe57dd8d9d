"""cairn.torchtitan: torchtitan's checkpoint manager, with cairn as the store, chosen by
torchtitan's own config.

    # in a config function of yours (torchtitan's --module/--config):
    import cairn.torchtitan
    config.checkpoint = cairn.torchtitan.CheckpointManager.Config()      # every step

    # or, with any of torchtitan's configs, from the command line:
    --override.imports cairn.torchtitan.checkpoint         # ='{"interval": 10}' for every 10th

The manager saves the same states as torchtitan's DCP manager (the model parts, flattened
as torchtitan flattens them, the optimizers, the LR schedulers, the data loader and the
trainer's counters) to cairn every `interval` steps (default 1): queued, the tensors copied
while the next forward and backward run. `maybe_wait_for_staging()`, which the trainer calls
right before `optimizers.step()`, is cairn's fence. `load()` resumes from the newest version
every rank can restore from any tier (this node's memory, a replica or parity on another
node, the PFS), into the current layout (resharded where the parallelism changed),
honouring `exclude_from_loading`, and with `load_step` for a given step. When cairn holds
no version, the load is torchtitan's own: `initial_load_path` (the model-only first load,
`initial_load_model_only`, from a DCP or Hugging Face checkpoint) or a DCP checkpoint in
`checkpoint.folder`. A step 0 (a seed checkpoint) loads the model only, as torchtitan does.
The last step is saved to cairn too; with `last_save_model_only` or `last_save_in_hf` it is
also written to `checkpoint.folder` as torchtitan writes it (the export users keep).

`async_mode` is ignored (cairn's saves are asynchronous by design). Settings: the CAIRN_*
variables (docs/settings.md) and RANK / WORLD_SIZE; the process's checkpointer is
cairn.dcp.checkpointer()'s, shared with cairn.dcp.
"""

import time
from dataclasses import dataclass

from torchtitan.components.checkpointer.base import MODEL
from torchtitan.components.checkpointer.dcp import CheckpointManager as _DCPManager
from torchtitan.config import derive, override
from torchtitan.tools.logging import logger

import cairn.dcp


class CheckpointManager(_DCPManager):
    """torchtitan's DCP checkpoint manager with cairn as the store (the module's text)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_DCPManager.Config):
        enable: bool = True
        """Whether to checkpoint (cairn's manager is chosen to checkpoint: on)"""

        interval: int = 1
        """Save every `interval` steps (cairn: every step)"""

    def __init__(self, config, **kwargs):
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        self.cairn = cairn.dcp.checkpointer()
        self.last_save = None  # the newest save's cairn.torch.SaveHandle
        self.last_report = None  # the cairn.RestoreReport of the last load from cairn

    def _save(self, curr_step, last_step=False):
        if not self._should_save(curr_step, last_step):
            return False
        begin = time.monotonic()
        self.last_save = self.cairn.save(curr_step, self._flattened_model_states_sd())
        if last_step:
            self.cairn.wait_captured()
            if self.last_save_model_only or self.last_save_in_hf:
                self._save_last_step(curr_step)  # torchtitan's export, into its folder
            logger.info(f"cairn: saved the last step, {curr_step}, in "
                        f"{time.monotonic() - begin:.2f} s")
        return True

    def _maybe_wait_for_staging(self):
        if self.last_save is not None:
            self.cairn.fence()

    def _wait_for_saving(self):
        self.save_future = None  # cairn's saves settle in the background

    def _load(self, step=-1):
        head = self.cairn._head(None if step == -1 else step)
        if head is None:
            if step != -1:
                logger.info(f"cairn: no version of step {step}; torchtitan's own load")
            return super()._load(step)
        begin = time.monotonic()
        model_only = head.step == 0
        states = self._states_to_load(model_only)
        self.last_report = self.cairn.load(states, step=head.step)
        if MODEL in self.states:
            model = {k: v for k, v in states.items() if k not in self.states}
            self.states[MODEL].load_state_dict(model)
        logger.info(f"cairn: loaded step {head.step} from {self.last_report.tier} in "
                    f"{time.monotonic() - begin:.2f} s"
                    + (" (the model only)" if model_only else ""))
        return True

    def _close(self):
        super()._close()
        if getattr(self, "cairn", None) is not None and not self.cairn.closed:
            self.cairn.wait_captured()


@override(target=_DCPManager.Config, exact=True,
          description="cairn as the checkpoint store (cairn.torchtitan)")
def checkpoint(cfg, interval: int = 1):
    """--override.imports cairn.torchtitan.checkpoint: torchtitan's DCP manager replaced by
    cairn's, saving every `interval` steps, its other settings kept."""
    return derive(cfg, CheckpointManager.Config, enable=True, interval=interval)


__all__ = ["CheckpointManager", "checkpoint"]
