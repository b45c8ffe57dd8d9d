"""cairn.deepspeed: DeepSpeed's checkpoints kept by cairn, through DeepSpeed's own calls.

    engine, optimizer, _, scheduler = deepspeed.initialize(model=..., config=...)
    engine = cairn.deepspeed.attach(engine)          # settings: CAIRN_* and RANK, ...
    engine.load_checkpoint(ckpt_dir)                 # the newest version cairn holds
    for batch in data:
        loss = engine(batch); engine.backward(loss)
        engine.step()                                # commits (cairn's fence) first
        engine.save_checkpoint(ckpt_dir)             # every step: queued, returns at once

attach() gives the engine cairn's CheckpointEngine, a decoupled one (as DataStates-LLM's and
Nebula's are): every file DeepSpeed's save_checkpoint() writes through its checkpoint
engine (the model states, each rank's ZeRO partition of the optimizer, stages 0 to 3, the
client state) goes into one cairn version of step `engine.global_steps`, its tensors read
in place while the next forward and backward run. DeepSpeed commits a decoupled save inside
engine.step(), right before the optimizer updates anything: that commit is cairn's fence.
The version also holds the RNG states (torch, numpy, Python's random), so a resumed run
draws what the uninterrupted one drew.

engine.load_checkpoint(load_dir) (tag None, or "global_step<N>") loads the newest version
every rank can restore (or step N) from any tier: this node's memory, a replica or parity
on another node, the PFS. DeepSpeed's own load runs (its file names, its ZeRO partitions,
its module / optimizer / scheduler loads, client_state returned), served from cairn instead
of files. When cairn holds no version (or not the tag asked for), the load is DeepSpeed's
own, from the files in load_dir.

Every rank keeps the model states it needs to resume (DeepSpeed writes them from data
parallel rank 0 only), so that each rank's version is enough for that rank. save_checkpoint
writes no checkpoint files and no `latest` file (rank 0 still copies DeepSpeed's
zero_to_fp32.py into ckpt_dir, as DeepSpeed does); to keep DeepSpeed's files too, call
engine.save_checkpoint_to_files(ckpt_dir) (DeepSpeed's own engine), for example at the end.
Saves of a file outside save_checkpoint (save_16bit_model) write it as DeepSpeed does.
DeepSpeed's state holds a few objects besides data (its loss scaler, ZeRO's stage enum, the
fragment addresses, torch.Size); they are stored as data and rebuilt on load from a fixed
list of DeepSpeed's classes: a restore never runs code a checkpoint names. Anything else in
client_state must be plain data (cairn.torch's rules).
"""

import atexit
import dataclasses
import enum
import functools
import importlib
import os
import re
import shutil
import tempfile
import weakref

import torch
from deepspeed.runtime.checkpoint_engine.checkpoint_engine import (
    CheckpointCommitInfo, CheckpointEngine as _CheckpointEngine)
from deepspeed.runtime.checkpoint_engine.torch_checkpoint_engine import TorchCheckpointEngine
from deepspeed.utils import logger

from . import _cairn
from .torch import StateCheckpointer, _error, rng_state, set_rng_state

ENGINE_NAME = "CairnCheckpointEngine"
_TYPE = "__cairn_deepspeed__"  # marks an object stored as data (below)
_FILES, _META, _RNG = "files", "deepspeed", "rng"

# The objects in DeepSpeed's checkpoints that are not plain data, rebuilt on load: the
# classes by (module, name); nothing else is ever looked up.
_OBJECTS = {
    "LossScaler": ("deepspeed.runtime.fp16.loss_scaler", "LossScaler"),
    "DynamicLossScaler": ("deepspeed.runtime.fp16.loss_scaler", "DynamicLossScaler"),
    "fragment_address": ("deepspeed.utils.tensor_fragment", "fragment_address"),
}
_ENUMS = {
    "ZeroStageEnum": ("deepspeed.runtime.zero.config", "ZeroStageEnum"),
}


_PLAIN = (str, bytes, int, float, bool, complex, type(None), set, frozenset)


@functools.lru_cache(maxsize=None)
def _class(name):
    module, attr = _OBJECTS.get(name) or _ENUMS[name]
    return getattr(importlib.import_module(module), attr)


def _kind_of(v):
    for table in (_OBJECTS, _ENUMS):
        for name in table:
            if type(v) is _class(name):
                return table, name
    return None, None


def _to_data(v, path):
    """`v` with DeepSpeed's objects replaced by tagged dicts and every tensor by a tensor
    holding its storage (a ZeRO-3 parameter's .data may be swapped before the fence)."""
    if torch.is_tensor(v):
        return v.detach()
    if isinstance(v, dict):
        return {k: _to_data(x, f"{path}.{k}") for k, x in v.items()}
    if isinstance(v, torch.Size):
        return {_TYPE: "Size", "value": [int(x) for x in v]}
    if isinstance(v, list):
        return [_to_data(x, f"{path}.{i}") for i, x in enumerate(v)]
    if type(v) is tuple:
        return tuple(_to_data(x, f"{path}.{i}") for i, x in enumerate(v))
    if type(v) in _PLAIN or isinstance(v, torch.dtype):  # cairn.torch stores dtypes by name
        return v
    table, name = _kind_of(v)
    if table is _ENUMS:
        return {_TYPE: name, "value": v.value}
    if table is _OBJECTS:
        fields = (dataclasses.asdict(v) if dataclasses.is_dataclass(v) else dict(vars(v)))
        return {_TYPE: name, "value": _to_data(fields, path)}
    if isinstance(v, enum.Enum) or not isinstance(v, _PLAIN):
        raise _error(f"cairn.deepspeed: {path} is a {type(v).__module__}."
                     f"{type(v).__qualname__}, which cairn does not store (plain data, "
                     "tensors and DeepSpeed's loss scalers, stage enum and fragment addresses "
                     "only)")
    return v


def _from_data(v):
    """_to_data's inverse: DeepSpeed's objects rebuilt (their fields set, no __init__ run)
    from the fixed list of classes."""
    if isinstance(v, dict):
        kind = v.get(_TYPE)
        if kind is None:
            return {k: _from_data(x) for k, x in v.items()}
        if kind == "Size":
            return torch.Size(v["value"])
        if kind in _ENUMS:
            return _class(kind)(v["value"])
        if kind in _OBJECTS:
            cls = _class(kind)
            obj = cls.__new__(cls)
            obj.__dict__.update(_from_data(v["value"]))
            return obj
        raise _error(f"cairn.deepspeed: the checkpoint names an object of kind {kind!r}, "
                     "which cairn does not rebuild", "DataLoss")
    if isinstance(v, list):
        return [_from_data(x) for x in v]
    if type(v) is tuple:
        return tuple(_from_data(x) for x in v)
    return v


def _key_of(rel):
    """The cairn key of a file's path under the tag's directory ("mp_rank_00_model_states.pt"
    -> "mp_rank_00_model_states_pt"): flattened names join keys with '.'."""
    return re.sub(r"[^A-Za-z0-9_]", "_", rel)


class CheckpointEngine(_CheckpointEngine):
    """DeepSpeed's CheckpointEngine with cairn as the store, decoupled (the module's text).
    `checkpointer`: a cairn.torch.StateCheckpointer (default: one made from the CAIRN_*
    variables with `settings`, copy_now= ... or any cairn.Options field)."""

    def __init__(self, config_params=None, *, checkpointer=None, **settings):
        super().__init__(config_params)
        self.name = ENGINE_NAME
        self.cairn = checkpointer if checkpointer is not None else StateCheckpointer(**settings)
        self.last_save = None  # the newest save's cairn.torch.SaveHandle
        self.last_report = None  # the cairn.RestoreReport of the last load from cairn
        self._files = TorchCheckpointEngine(config_params)  # loads when cairn holds nothing
        self._building = None  # the CheckpointCommitInfo of the save being assembled
        self._pending = {}  # its files: path under the tag's directory -> state dict
        self._uncommitted = None  # the CheckpointCommitInfo of the queued, unfenced save
        self._serving = None  # during a load from cairn: path -> state dict
        self._saving = False  # inside attach()'s save_checkpoint

    # -- DeepSpeed's calls ------------------------------------------------------------------

    def create(self, info: CheckpointCommitInfo):
        if self._saving:  # save_checkpoint's (save_16bit_model creates one too)
            self._building, self._pending = info, {}

    def makedirs(self, path, exist_ok=False):
        if self._building is not None and self._in_tag(path):
            return  # the tag's directory: nothing is written there
        os.makedirs(path, exist_ok=exist_ok)

    def save(self, state_dict, path: str):
        if not self._saving or self._building is None:  # save_16bit_model: DeepSpeed's file
            return self._files.save(state_dict, path)
        if not self._in_tag(path):
            raise _error(f"cairn.deepspeed: {path} is not under the checkpoint's directory "
                         f"{os.path.join(self._building.save_dir, self._building.tag)}")
        rel = os.path.relpath(path, os.path.join(self._building.save_dir, self._building.tag))
        self._pending[rel] = _to_data(state_dict, rel)

    def load(self, path: str, map_location=None):
        if self._serving is None:
            return self._files.load(path, map_location=map_location)
        try:
            return self._serving[os.path.abspath(path)]
        except KeyError:
            raise _error(f"cairn.deepspeed: DeepSpeed asks for {path}, which step "
                         f"{self.last_report.step} does not hold (it holds "
                         f"{sorted(map(os.path.basename, self._serving))})", "NotFound") from None

    def commit(self, info: CheckpointCommitInfo):
        if self._uncommitted is not None:
            self.cairn.fence()  # before the optimizer writes what the version reads
            self._uncommitted = None
        return True

    def is_decoupled(self):
        return True

    def get_commit_info(self):
        return self._uncommitted

    def preserves_storage_sharing(self):
        return False  # DeepSpeed then hands over the live tensors, not clones

    def cleanup(self):
        if not self.cairn.closed:
            self.commit(None)
            self.cairn.wait_captured()

    def close(self):
        """Waits for captures in flight and closes the checkpointer."""
        if not self.cairn.closed:
            self.cairn.close()

    # -- what attach() adds around DeepSpeed's save and load ---------------------------------

    def queue(self, step, info):
        """Queues the files save_checkpoint handed over as version `step`."""
        files, self._pending, self._building = self._pending, {}, None
        if not files:
            return None
        last = self.cairn.last_step
        if last is not None and step <= last:
            logger.warning(f"cairn: step {step} is saved already (step {last}); this "
                           "save_checkpoint is not kept")
            return None
        state = {
            _FILES: {_key_of(rel): sd for rel, sd in files.items()},
            _META: {"tag": info.tag, "files": {_key_of(rel): rel for rel in files}},
            _RNG: rng_state(),
        }
        self.last_save = self.cairn.save(step, state)
        # save_latest False: DeepSpeed then writes no `latest` naming files that do not exist.
        self._uncommitted = CheckpointCommitInfo(tag=info.tag, save_dir=info.save_dir,
                                                 save_latest=False)
        return self.last_save

    def serve(self, step):
        """Collective: loads version `step` (None: the newest) into memory for DeepSpeed's
        load; returns (tag, a directory laid out as DeepSpeed's files, holding empty files
        for DeepSpeed to find) or None when cairn holds no such version."""
        try:
            got, state = self.cairn.load_new(step)
        except _cairn.Error as e:
            if e.code == "NotFound":
                return None
            raise
        if state is None:
            return None
        self.last_report = self.cairn.last_report
        meta = state[_META]
        where = tempfile.mkdtemp(prefix="cairn-deepspeed-")
        serving = {}
        for key, rel in meta["files"].items():
            path = os.path.abspath(os.path.join(where, meta["tag"], rel))
            os.makedirs(os.path.dirname(path), exist_ok=True)
            open(path, "wb").close()
            serving[path] = _from_data(state[_FILES][key])
        self._serving = serving
        return meta["tag"], where, state[_RNG]

    def served(self, where):
        self._serving = None
        shutil.rmtree(where, ignore_errors=True)

    def _in_tag(self, path):
        base = os.path.abspath(os.path.join(self._building.save_dir, self._building.tag))
        path = os.path.abspath(path)
        return path == base or path.startswith(base + os.sep)


_TAG_STEP = re.compile(r"global_step(\d+)")


def attach(engine, *, checkpointer=None, **settings):
    """Gives a DeepSpeedEngine (after deepspeed.initialize) cairn's CheckpointEngine and
    returns it: save_checkpoint / load_checkpoint then go through cairn (the module's text);
    save_checkpoint_to_files is DeepSpeed's own save. `checkpointer`, `settings`: as
    CheckpointEngine's (the model's buffers are copied when a save is queued: forward passes
    may update them before the fence)."""
    if isinstance(getattr(engine, "checkpoint_engine", None), CheckpointEngine):
        return engine
    if checkpointer is None:
        settings.setdefault("copy_now", [engine.module])
    ce = CheckpointEngine(getattr(engine, "_config", None), checkpointer=checkpointer,
                          **settings)
    own_engine, writes_model_states = engine.checkpoint_engine, engine.save_non_zero_checkpoint
    engine.checkpoint_engine = ce
    engine.save_non_zero_checkpoint = True  # every rank keeps the model states it needs
    save, load = engine.save_checkpoint, engine.load_checkpoint

    @functools.wraps(save)
    def save_checkpoint(save_dir, tag=None, client_state={}, save_latest=True,
                        exclude_frozen_parameters=False):
        tag = f"global_step{engine.global_steps}" if tag is None else str(tag)
        ce._saving = True
        try:
            save(save_dir, tag=tag, client_state=client_state, save_latest=save_latest,
                 exclude_frozen_parameters=exclude_frozen_parameters)
        except BaseException:
            ce._building, ce._pending = None, {}
            raise
        finally:
            ce._saving = False
        ce.queue(engine.global_steps, CheckpointCommitInfo(tag, save_dir, save_latest))
        return True

    @functools.wraps(load)
    def load_checkpoint(load_dir, tag=None, **kw):
        step = None
        if tag is not None:
            m = _TAG_STEP.fullmatch(str(tag))
            if m is None:
                return load(load_dir, tag=tag, **kw)  # not a tag cairn saved
            step = int(m[1])
        if engine.zero_optimization_partition_weights() and not kw.get(
                "load_optimizer_states", True):
            raise _error("cairn.deepspeed: under ZeRO-3, DeepSpeed loads the model without the "
                         "optimizer's states (load_optimizer_states=False) by reading every "
                         "rank's files itself (zero_to_fp32), which cairn cannot serve: load "
                         "with the optimizer's states, or from DeepSpeed's files "
                         "(save_checkpoint_to_files)", "FailedPrecondition")
        got = ce.serve(step)
        if got is None:
            logger.info(f"cairn: no version{'' if step is None else f' of step {step}'}; "
                        f"DeepSpeed's own load from {load_dir}")
            return load(load_dir, tag=tag, **kw)
        saved_tag, where, rng = got
        try:
            path, client_state = load(where, tag=saved_tag, **kw)
        finally:
            ce.served(where)
        set_rng_state(rng)
        if path is not None:
            path = os.path.join(load_dir, os.path.relpath(path, where))
        logger.info(f"cairn: loaded step {ce.last_report.step} ({saved_tag}) from "
                    f"{ce.last_report.tier}")
        return path, client_state

    def save_checkpoint_to_files(save_dir, tag=None, **kw):
        engine.checkpoint_engine = own_engine
        engine.save_non_zero_checkpoint = writes_model_states
        try:
            return save(save_dir, tag=tag, **kw)
        finally:
            engine.checkpoint_engine = ce
            engine.save_non_zero_checkpoint = True

    engine.save_checkpoint = save_checkpoint
    engine.load_checkpoint = load_checkpoint
    engine.save_checkpoint_to_files = save_checkpoint_to_files
    me = weakref.ref(ce)
    atexit.register(lambda: me() is not None and me().close())
    return engine


__all__ = ["CheckpointEngine", "attach"]
