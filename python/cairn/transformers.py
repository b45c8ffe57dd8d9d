"""cairn.transformers: Hugging Face's Trainer checkpointed every step by cairn, resumed
through its own resume_from_checkpoint, and cairn's versions exported to the Hugging Face
layout (sharded safetensors with model.safetensors.index.json).

    import cairn.transformers

    trainer = cairn.transformers.Trainer(model=model, args=args, train_dataset=ds)  # (1)
    trainer.train(resume_from_checkpoint=True)                                      # (2)

`cairn.transformers.Trainer` is transformers.Trainer with a CairnCallback added: after
every optimizer step (`on_step_end`) the callback saves a version of the model, the
optimizer, the LR scheduler, the gradient scaler, the Trainer's state (what
trainer_state.json holds) and this rank's RNG states, to cairn (queued: the tensors are
copied while the next forward and backward run); before the next optimizer step
(`on_pre_optimizer_step`) it fences, so the optimizer never writes a tensor before its copy.
`save_every` (default 1) saves every n-th step instead.

`train(resume_from_checkpoint=True)` resumes from the newest version every rank can
restore from any tier (this node's memory, a replica or parity on another node, the PFS),
through the Trainer's own resume path: the model, optimizer, scheduler, scaler and RNG
come from cairn, and the Trainer skips the batches already trained as it does for its own
checkpoints, so the run continues as if never stopped. When cairn holds no version, True
falls back to the Trainer's last checkpoint in output_dir (and its error when there is
none); `resume_from_checkpoint="cairn"` starts from scratch instead. A path resumes from
that Trainer checkpoint, as transformers does.

A subclass of transformers.Trainer of your own gets the same with the mixin:
`class MyTrainer(cairn.transformers.ResumeMixin, MyBaseTrainer)`; CairnCallback alone
saves and fences, without resume.

`save_pretrained(out_dir, config)` (collective) writes a version's model in the Hugging
Face layout, loadable by `AutoModelForCausalLM.from_pretrained(out_dir)`: every tensor
whole (a DTensor's or an FSDP shard's global tensor), from whichever tier holds it.

Settings: the CAIRN_* variables (docs/settings.md) and RANK / WORLD_SIZE, as every cairn
module; the process's checkpointer is cairn.dcp.checkpointer()'s, shared with cairn.dcp.
"""

import dataclasses
import json
import os
import shutil
import tempfile

import torch
import transformers
from transformers.trainer_callback import ExportableState

import cairn.dcp
from cairn.torch import _error, rng_state, set_rng_state

TRAINER_STATE_NAME = "trainer_state.json"
_RESUME_DIR_PREFIX = "cairn-resume-"


def _inner_optimizer(opt):
    """The torch optimizer under Accelerate's AcceleratedOptimizer (its step() checks
    Accelerate's gradient state, which cairn's first-state creation must not touch)."""
    return getattr(opt, "optimizer", opt)


class CairnCallback(transformers.TrainerCallback):
    """Saves a version to cairn at the end of every `save_every`-th optimizer step and
    fences before every optimizer step. `checkpointer`: a cairn.torch.StateCheckpointer
    (default: cairn.dcp.checkpointer(**settings), the process's). The version holds "model",
    "optim", "sched", "scaler" (when the Trainer has one), "trainer_state" and "rng"."""

    def __init__(self, checkpointer=None, save_every=1, **settings):
        if int(save_every) < 1:
            raise ValueError(f"cairn.transformers: save_every must be >= 1, not {save_every}")
        self.save_every = int(save_every)
        self._ck = checkpointer
        self._settings = settings
        self.trainer = None  # set by ResumeMixin: the scaler and the callbacks' states
        self.last_save = None  # the newest save's cairn.torch.SaveHandle

    @property
    def checkpointer(self):
        if self._ck is None:
            self._ck = cairn.dcp.checkpointer(**self._settings)
        return self._ck

    def state_dict_of(self, state, model, optimizer, lr_scheduler):
        """What one version holds (the Trainer's objects: cairn takes their state)."""
        sd = {"model": model, "trainer_state": self._trainer_state(state), "rng": rng_state()}
        if optimizer is not None:
            sd["optim"] = _inner_optimizer(optimizer)
        if lr_scheduler is not None:
            sd["sched"] = lr_scheduler
        scaler = getattr(getattr(self.trainer, "accelerator", None), "scaler", None)
        if scaler is not None:
            sd["scaler"] = scaler
        return sd

    def _trainer_state(self, state):
        """trainer_state.json's content as the Trainer writes it at a checkpoint (its
        Exportable callbacks' states brought up to date), as a JSON string."""
        trainer = self.trainer
        if trainer is not None:
            for cb in trainer.callback_handler.callbacks + [trainer.control]:
                if isinstance(cb, ExportableState):
                    name = cb.__class__.__name__
                    if isinstance(state.stateful_callbacks.get(name), list):
                        state.stateful_callbacks[name] = [cb.state()]
                    else:
                        state.stateful_callbacks[name] = cb.state()
        return json.dumps(dataclasses.asdict(state), sort_keys=True)

    def on_pre_optimizer_step(self, args, state, control, **kwargs):
        if self.last_save is not None:
            self.checkpointer.fence()

    def on_step_end(self, args, state, control, model=None, optimizer=None,
                    lr_scheduler=None, **kwargs):
        if state.global_step % self.save_every:
            return
        model = model if self.trainer is None else self.trainer.model
        self.last_save = self.checkpointer.save(
            state.global_step, self.state_dict_of(state, model, optimizer, lr_scheduler))

    def on_train_end(self, args, state, control, **kwargs):
        if self._ck is not None and not self._ck.closed:
            self._ck.wait_captured()  # the last version is whole before train() returns


class ResumeMixin:
    """transformers.Trainer's resume_from_checkpoint served by cairn (see the module's text).
    Keyword arguments: `cairn_callback` (a CairnCallback; default CairnCallback()), or
    `cairn_settings` (a dict for the default one: save_every=, checkpointer=, or any
    cairn.Options field)."""

    def __init__(self, *args, cairn_callback=None, cairn_settings=None, **kwargs):
        super().__init__(*args, **kwargs)
        if cairn_callback is None:
            cairn_callback = CairnCallback(**(cairn_settings or {}))
        elif cairn_settings:
            raise ValueError("cairn.transformers: give cairn_callback or cairn_settings, not both")
        cairn_callback.trainer = self
        self.cairn = cairn_callback
        self.add_callback(cairn_callback)
        self._cairn_dir = None
        self._cairn_step = None
        self.cairn_report = None  # the model's cairn.RestoreReport when train() resumed

    @property
    def cairn_step(self):
        """The step the last train() resumed from cairn (None: it did not)."""
        return self._cairn_step

    def train(self, resume_from_checkpoint=None, *args, **kwargs):
        cairn_only = resume_from_checkpoint == "cairn"
        if resume_from_checkpoint is True or cairn_only:
            step, head = self.cairn.checkpointer.load_new(keys=["trainer_state"])
            if step is None:
                resume_from_checkpoint = None if cairn_only else True
            else:
                # The Trainer reads trainer_state.json from the checkpoint's directory
                # itself (the step, the batches to skip); cairn serves the rest.
                self._cairn_dir = tempfile.mkdtemp(prefix=_RESUME_DIR_PREFIX)
                self._cairn_step = step
                with open(os.path.join(self._cairn_dir, TRAINER_STATE_NAME), "w") as f:
                    f.write(head["trainer_state"])
                resume_from_checkpoint = self._cairn_dir
        try:
            return super().train(resume_from_checkpoint, *args, **kwargs)
        finally:
            if self._cairn_dir is not None:
                shutil.rmtree(self._cairn_dir, ignore_errors=True)
                self._cairn_dir = None

    def _from_cairn(self, checkpoint):
        return checkpoint is not None and self._cairn_dir is not None and (
            os.path.abspath(checkpoint) == os.path.abspath(self._cairn_dir))

    def _load_from_checkpoint(self, resume_from_checkpoint, model=None):
        if not self._from_cairn(resume_from_checkpoint):
            return super()._load_from_checkpoint(resume_from_checkpoint, model)
        self.cairn_report = self.cairn.checkpointer.load(
            {"model": model if model is not None else self.model}, step=self._cairn_step)
        return None

    def _load_optimizer_and_scheduler(self, checkpoint):
        if not self._from_cairn(checkpoint):
            return super()._load_optimizer_and_scheduler(checkpoint)
        state = {}
        if self.optimizer is not None:
            state["optim"] = _inner_optimizer(self.optimizer)
        if self.lr_scheduler is not None:
            state["sched"] = self.lr_scheduler
        if state:
            self.cairn.checkpointer.load(state, step=self._cairn_step)
        return None

    def _load_scaler(self, checkpoint):
        if not self._from_cairn(checkpoint):
            return super()._load_scaler(checkpoint)
        scaler = getattr(self.accelerator, "scaler", None)
        if scaler is not None:
            self.cairn.checkpointer.load({"scaler": scaler}, step=self._cairn_step)
        return None

    def _load_rng_state(self, checkpoint):
        if not self._from_cairn(checkpoint):
            return super()._load_rng_state(checkpoint)
        _, state = self.cairn.checkpointer.load_new(step=self._cairn_step, keys=["rng"])
        set_rng_state(state["rng"])
        return None


class Trainer(ResumeMixin, transformers.Trainer):
    """transformers.Trainer, checkpointed every step by cairn and resumed from it (the
    module's text)."""


def _shard_groups(names, sizes, max_shard_size):
    groups, size = [[]], 0
    for name in names:
        if groups[-1] and size + sizes[name] > max_shard_size:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += sizes[name]
    return groups


def _parse_size(v):
    if isinstance(v, int):
        return v
    units = {"KB": 10**3, "MB": 10**6, "GB": 10**9, "KIB": 2**10, "MIB": 2**20, "GIB": 2**30}
    s = str(v).strip().upper()
    for u in sorted(units, key=len, reverse=True):
        if s.endswith(u):
            return int(float(s[:-len(u)]) * units[u])
    return int(s)


def save_pretrained(out_dir, config, *, step=None, checkpointer=None, key="model",
                    max_shard_size="5GB", tied=None):
    """Collective: writes version `step` (default: the newest every rank can restore) of the
    model saved under `key` to `out_dir` in the Hugging Face layout, on rank 0: shards
    model-0000i-of-0000n.safetensors with model.safetensors.index.json (or one
    model.safetensors when the model fits one shard), and `config`'s config.json (a
    transformers.PretrainedConfig, or a model whose .config is used). Every tensor is
    whole: a DTensor's, a tensor-parallel or FSDP shard's global tensor. `tied`: names left
    out because the model ties them to another (default: lm_head.weight when the config
    ties word embeddings). The index is written last, so an export cut short has none.
    Returns (step, [the files written]) on rank 0, (step, []) elsewhere; raises when no
    version exists."""
    from safetensors.torch import save_file

    config = getattr(config, "config", config)
    ck = checkpointer if checkpointer is not None else cairn.dcp.checkpointer()
    got, state = ck.load_new(step=step, keys=[key])
    if got is None:
        raise _error("cairn.transformers: the job holds no version to export")
    if key not in state:
        raise _error(f"cairn.transformers: step {got} holds no '{key}' entry")
    model = state[key]
    tensors = {k: v for k, v in model.items() if torch.is_tensor(v)}
    if not tensors:
        raise _error(f"cairn.transformers: step {got}'s '{key}' holds no tensors")
    if tied is None:
        tied = ["lm_head.weight"] if getattr(config, "tie_word_embeddings", False) else []
    for name in tied:
        tensors.pop(name, None)
    if ck.options.rank != 0:
        return got, []
    os.makedirs(out_dir, exist_ok=True)
    names = list(tensors)
    sizes = {n: tensors[n].numel() * tensors[n].element_size() for n in names}
    groups = _shard_groups(names, sizes, _parse_size(max_shard_size))
    written = []
    if len(groups) == 1:
        files = ["model.safetensors"]
    else:
        files = [f"model-{i + 1:05d}-of-{len(groups):05d}.safetensors" for i in range(len(groups))]
    for fname, group in zip(files, groups):
        path = os.path.join(out_dir, fname)
        save_file({n: tensors[n].contiguous() for n in group}, path, metadata={"format": "pt"})
        written.append(path)
    config.save_pretrained(out_dir)
    written.append(os.path.join(out_dir, "config.json"))
    if len(groups) > 1:
        index = {"metadata": {"total_size": sum(sizes.values()),
                              "total_parameters": sum(t.numel() for t in tensors.values())},
                 "weight_map": {n: f for f, g in zip(files, groups) for n in g}}
        path = os.path.join(out_dir, "model.safetensors.index.json")
        tmp = path + ".tmp"
        with open(tmp, "w") as f:
            json.dump(index, f, indent=2, sort_keys=True)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
        written.append(path)
    return got, written
