"""cairn.dcp: torch.distributed.checkpoint (DCP) reads a committed cairn step.

    import torch.distributed.checkpoint as dcp
    from torch.distributed.checkpoint.state_dict import get_state_dict, set_state_dict
    import cairn.dcp

    model_sd, optim_sd = get_state_dict(model, optimizer)
    state = {"model": model_sd, "optim": optim_sd}
    dcp.load(state, storage_reader=cairn.dcp.StorageReader("/lustre/ckpt/run7"))
    set_state_dict(model, optimizer, model_state_dict=state["model"],
                   optim_state_dict=state["optim"])

The path is the job's PFS directory (<CAIRN_PFS_ROOT>/<job id>); the step is the one its
LATEST names, or `step`. Any torch 2.x job loads it, at any world size and with any
layout: DCP's own planner asks for the parts each rank needs, and the reader reads them
(verifying every chunk it reads) from the files cairn's drain wrote. cairn.torch saves
under DCP's flattened names ("model.<fqn>", "optim.state.<fqn>.exp_avg",
"optim.param_groups", ...), so the state dict of get_state_dict, or any part of it, finds
its entries. Non-tensor entries come from what rank 0 saved with the step.

Needs torch >= 2.2 (the StorageReader interface with reset()).
"""

import io
import os

import torch
from torch.distributed.checkpoint import StorageReader as _StorageReader
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType
from torch.futures import Future

from . import _cairn
from .torch import _DTYPES, _STATE_BLOB, _decode, _error

_TORCH_DTYPES = {name: dt for dt, name in _DTYPES.items()}


class StorageReader(_StorageReader):
    """A DCP StorageReader over a committed step of a cairn job's PFS tier.

    `path`: <pfs_root>/<job id> (or give it to dcp.load as checkpoint_id); `step`: a
    committed step (default: the newest, the one LATEST names). `allow_pickle`: read the
    state dict's non-tensor entries of versions saved before cairn stored them as data (or
    saved with allow_pickle=True); see cairn.torch. DCP's own items (what dcp.load reads
    through this reader) are deserialized by DCP itself, under its own rules."""

    def __init__(self, path=None, step=None, allow_pickle=False):
        super().__init__()
        self.allow_pickle = bool(allow_pickle)
        self.path = None if path is None else os.fspath(path)
        self.step = step
        self._pfs = None
        self._plain_cache = None

    # -- the StorageReader interface -------------------------------------------------

    def reset(self, checkpoint_id=None):
        if checkpoint_id is not None:
            self.path = os.fspath(checkpoint_id)
        self._pfs = None

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        try:
            _cairn.PfsStep.steps(os.fspath(checkpoint_id))
            return True
        except Exception:
            return False

    def read_metadata(self):
        step = self._open()
        md = {}
        for name, dtype, shape, boxes in step.tensors():
            if dtype not in _TORCH_DTYPES:
                raise _error(f"{step.directory}: tensor '{name}' has dtype {dtype}, which "
                             "this torch cannot hold")
            md[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_TORCH_DTYPES[dtype]),
                size=torch.Size(shape),
                chunks=[ChunkStorageMetadata(offsets=torch.Size(o), sizes=torch.Size(n))
                        for o, n in boxes],
            )
        for name in self._plain():
            md.setdefault(name, BytesStorageMetadata())
        return Metadata(state_dict_metadata=md)

    def set_up_storage_reader(self, metadata, is_coordinator):
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        step = self._open()
        dtypes = {name: (dtype, shape) for name, dtype, shape, _ in step.tensors()}
        targets, reads = [], []
        for item in plan.items:
            name = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(self._plain()[name], buf)
                buf.seek(0)
                planner.load_bytes(item, buf)
                continue
            dtype, shape = dtypes[name]
            lengths = [int(x) for x in item.lengths]
            offsets = [int(c) + int(o) for c, o in
                       zip(item.storage_index.offset, item.storage_offsets)]
            tmp = torch.empty(lengths, dtype=_TORCH_DTYPES[dtype])
            targets.append(_cairn.Shard(name, dtype, shape, tmp.data_ptr(), offsets, lengths,
                                        False, tmp))
            reads.append((item, tmp))
        if targets:
            step.read(targets)  # every saved box read once, its chunks verified
        for item, tmp in reads:
            dest = planner.resolve_tensor(item).detach()
            dest.copy_(tmp.view(dest.shape))
            planner.commit_tensor(item, dest)
        fut = Future()
        fut.set_result(None)
        return fut

    # -- internals ---------------------------------------------------------------------

    def _open(self):
        if self.path is None:
            raise _error("cairn.dcp.StorageReader: no path (give the job's PFS directory, "
                         "<pfs_root>/<job id>, or dcp.load's checkpoint_id)")
        if self._pfs is None:
            self._pfs = _cairn.PfsStep.open(self.path, self.step)
            self._plain_cache = None
        return self._pfs

    def _plain(self):
        """The state dict's non-tensor entries, as rank 0 saved them."""
        if self._plain_cache is None:
            blobs = self._open().blobs(0)
            self._plain_cache = (_decode(blobs[_STATE_BLOB], "state dict's non-tensor entries",
                                         self._pfs.step, self.allow_pickle)
                                 if _STATE_BLOB in blobs else {})
        return self._plain_cache
