"""cairn.torchtitan: torchtitan's checkpoint manager, with cairn as the store, chosen by
torchtitan's own config.

    # in a config function of yours (torchtitan's --module/--config):
    import cairn.torchtitan
    config.checkpoint = cairn.torchtitan.CheckpointManager.Config()      # every step

    # or, with any of torchtitan's configs, from the command line:
    --override.imports cairn.torchtitan.checkpoint         # ='{"interval": 10}' for every 10th

The manager saves the same states as torchtitan's DCP manager (the model, the optimizers,
the LR schedulers, the data loader and the trainer's counters) to cairn every `interval`
steps (default 1): queued, the tensors copied while the next forward and backward run. The
model goes in as its parameters and persistent buffers (`save_model_as="parameters"`, the
default): as the model parts hold them, sharded DTensors with fused QKV weights fused, so a
save runs none of the model's state-dict hooks (torchtitan's attention splits each fused
QKV weight with a DTensor redistribute, a collective, per layer per save; that was most of
a save's stall). The optimizers go in by param group: each parameter's state under its
name, as torchtitan's flat form names it, and the settings once per group (torchtitan's
form repeats every setting for every parameter, most of a save's entries). A fused
weight's global view does not depend on the layout, so a load reshards it like any
DTensor; the optimizers load through torchtitan's own flat form, rebuilt.
`save_model_as="state_dict"` saves torchtitan's model state dict instead, as its DCP
manager does (for versions read by torchtitan's state-dict names through cairn.dcp).
`maybe_wait_for_staging()`, which the trainer calls right before `optimizers.step()`, is
cairn's fence. `load()` resumes from the newest version every rank
can restore from any tier (this node's memory, a replica or parity on another node, the
PFS), into the current layout (resharded where the parallelism changed), honouring
`exclude_from_loading`, and with `load_step` for a given step. When cairn holds no version,
the load is torchtitan's own: `initial_load_path` (the model-only first load,
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

from torchtitan.components.checkpointer.base import MODEL, OPTIMIZER
from torchtitan.components.optimizer.utils import _flatten_state_nested, init_optim_state
from torchtitan.components.checkpointer.dcp import CheckpointManager as _DCPManager
from torchtitan.config import derive, override
from torchtitan.tools.logging import logger

import cairn.dcp


_LAYOUT = "cairn_torchtitan"  # a version's plain entries: {"model": "parameters",
#                                 "optimizer": "by_group"}
_WRAPPERS = {"_orig_mod", "_checkpoint_wrapped_module", "_fsdp_wrapped_module"}


def _fqn(name):
    return ".".join(p for p in name.split(".") if p not in _WRAPPERS)


class _OptimizersByGroup:
    """torchtitan's optimizers (its OptimizersContainer) as a Stateful whose state dict
    holds each parameter's state under its name ({"state": {fqn: {name: tensor}}}, the
    tensors flattened to the names torchtitan's flat form gives them) and the settings once
    per param group ({"param_groups": a tuple of the groups' settings, "params" their
    fqns}), where torchtitan's form repeats every setting for every parameter (most of a
    save's entries). A load hands the container torchtitan's flat form rebuilt from it, so
    the container reshards and matches names as its own load does."""

    def __init__(self, container):
        self.container = container

    def _groups(self):
        for optim in self.container.optimizers:
            init_optim_state(optim)
            for group in optim.param_groups:
                if "param_names" not in group:
                    raise ValueError("cairn.torchtitan: an optimizer built without parameter "
                                     "names (torchtitan builds its optimizers with them)")
                yield optim, group

    def state_dict(self):
        state, groups = {}, []
        for optim, group in self._groups():
            for fqn, p in zip(group["param_names"], group["params"]):
                if p in optim.state:
                    state[fqn] = dict(optim.state[p])
            settings = {k: v for k, v in group.items() if k not in ("params", "param_names")}
            settings["params"] = tuple(group["param_names"])
            groups.append(settings)
        return {"state": state, "param_groups": tuple(groups)}

    def load_state_dict(self, sd):
        flat = {}
        for fqn, state in sd["state"].items():  # named as torchtitan's own save names them
            _flatten_state_nested(state, f"state.{fqn}", flat)
        for group in sd["param_groups"]:
            for fqn in group["params"]:
                for k, v in group.items():
                    if k != "params":
                        flat[f"param_groups.{fqn}.{k}"] = v
        self.container.load_state_dict(flat)


class CheckpointManager(_DCPManager):
    """torchtitan's DCP checkpoint manager with cairn as the store (the module's text)."""

    @dataclass(kw_only=True, slots=True)
    class Config(_DCPManager.Config):
        enable: bool = True
        """Whether to checkpoint (cairn's manager is chosen to checkpoint: on)"""

        interval: int = 1
        """Save every `interval` steps (cairn: every step)"""

        save_model_as: str = "parameters"
        """How the model goes into cairn's versions: "parameters" (the model's parameters and
        persistent buffers as the model holds them, fused QKV included: no state-dict hook
        and no collective per save) or "state_dict" (torchtitan's own model state dict, as
        its DCP manager saves it: its attention's hook splits each fused QKV weight with a
        DTensor redistribute per layer per save)"""

    def __init__(self, config, **kwargs):
        self._entries = None  # _model_entries(), walked at the first save
        super().__init__(config, **kwargs)
        if not self.enable:
            return
        if config.save_model_as not in ("parameters", "state_dict"):
            raise ValueError("cairn.torchtitan: save_model_as is 'parameters' or "
                             f"'state_dict', not {config.save_model_as!r}")
        self.save_model_as = config.save_model_as
        self.cairn = cairn.dcp.checkpointer()
        self.last_save = None  # the newest save's cairn.torch.SaveHandle
        self.last_report = None  # the cairn.RestoreReport of the last load from cairn

    def _save(self, curr_step, last_step=False):
        if not self._should_save(curr_step, last_step):
            return False
        begin = time.monotonic()
        self.last_save = self.cairn.save(curr_step, self._states_to_save())
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
        plain = self.cairn._saved_of(head).plain
        if plain.get(f"{_LAYOUT}.model") == "parameters":
            # The parameters themselves, filled in place (resharded by their global
            # DTensor view, which is the same for every layout).
            states = {} if model_only else self._states_to_load(False, flatten=False)
            if OPTIMIZER in states and plain.get(f"{_LAYOUT}.optimizer") == "by_group":
                states[OPTIMIZER] = _OptimizersByGroup(states[OPTIMIZER])
            if model_only or MODEL not in self.exclude_from_loading:
                states.update(self._model_tensors(copy_buffers=False))
            self.last_report = self.cairn.load(states, step=head.step)
        else:  # torchtitan's model state dict (save_model_as="state_dict", older versions)
            states = self._states_to_load(model_only)
            self.last_report = self.cairn.load(states, step=head.step)
            if MODEL in self.states:
                model = {k: v for k, v in states.items() if k not in self.states}
                self.states[MODEL].load_state_dict(model)
        logger.info(f"cairn: loaded step {head.step} from {self.last_report.tier} in "
                    f"{time.monotonic() - begin:.2f} s"
                    + (" (the model only)" if model_only else ""))
        return True

    def _states_to_save(self):
        if self.save_model_as == "state_dict":
            return self._flattened_model_states_sd()
        sd = {k: v for k, v in self.states.items() if k != MODEL}
        layout = {"model": "parameters"}
        if OPTIMIZER in self.states:
            self.cairn.fence_before(self.states[OPTIMIZER])  # as for any optimizer it saves
            sd[OPTIMIZER] = _OptimizersByGroup(self.states[OPTIMIZER])
            layout["optimizer"] = "by_group"
        if MODEL in self.states:
            sd.update(self._model_tensors(copy_buffers=True))
        sd[_LAYOUT] = layout
        return sd

    def _states_to_load(self, model_only, flatten=True):
        if flatten:
            return super()._states_to_load(model_only)
        for key in self.exclude_from_loading:
            if key not in self.states:
                raise ValueError(f"{key} not found in state_dict.")
        return {k: v for k, v in self.states.items()
                if k != MODEL and k not in self.exclude_from_loading}

    def _model_tensors(self, copy_buffers):
        """{name: tensor} of every model part's parameters (as the parts hold them: sharded
        DTensors, fused weights fused) and persistent buffers, named as torchtitan names
        them (wrapper segments such as torch.compile's and activation checkpointing's left
        out). A save copies the buffers (a forward pass may update them before the fence);
        a load fills them in place."""
        out = {}
        for name, mod, key, is_buffer in self._model_entries():
            t = (mod._buffers if is_buffer else mod._parameters).get(key)
            if t is None:  # the model changed since the walk: walk it again
                self._entries = None
                return self._model_tensors(copy_buffers)
            out[name] = t.detach().clone() if is_buffer and copy_buffers else t
        return out

    def _model_entries(self):
        """[(name, module, key, is_buffer)] of _model_tensors, walked once (a save looks
        each tensor up in its module, as the module holds it now: a parameter replaced in
        place is seen; one added later is not)."""
        if self._entries is None:
            entries, seen = [], set()  # seen: a shared parameter under its first name only
            for part in self.states[MODEL].model:
                for mname, mod in part.named_modules():
                    prefix = f"{mname}." if mname else ""
                    for key, p in mod._parameters.items():
                        if p is not None and id(p) not in seen:
                            seen.add(id(p))
                            entries.append((_fqn(prefix + key), mod, key, False))
                    for key, b in mod._buffers.items():
                        if b is not None and key not in mod._non_persistent_buffers_set:
                            entries.append((_fqn(prefix + key), mod, key, True))
            self._entries = entries
        return self._entries

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
