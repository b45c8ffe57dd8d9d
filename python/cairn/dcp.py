"""cairn.dcp: cairn as torch.distributed.checkpoint (DCP)'s storage and stager.

A loop that saves with dcp.async_save and loads with dcp.load changes two lines:

    import torch.distributed.checkpoint as dcp
    import cairn.dcp

    writer, reader = cairn.dcp.StorageWriter(), cairn.dcp.StorageReader()   # (1)
    dcp.load(state, storage_reader=reader)       # the newest version the job can get  (2)
    for step in range(start + 1, steps + 1):
        ...forward, backward...
        if saving is not None:
            saving.staging_completion.result()   # what cairn's fence means
        optimizer.step()
        saving = dcp.async_save(state, checkpoint_id=f"step-{step}", storage_writer=writer,
                                async_stager=writer)                                   # (2)

`async_save` goes through cairn: the writer, as DCP's AsyncStager, queues a lazy copy of
every tensor into this rank's host memory (cairn's capture) and returns at once;
`staging_completion` completes once every byte is copied, which is when the tensors may
change again. The upload that follows runs DCP's own planning (its dedup of replicated
tensors included), but writes nothing: `upload_completion` completes once every rank's
version is captured. Replication to other nodes' memory and the drain to the PFS
(CAIRN_PERSIST_EVERY) follow in the background; `writer.last_save` is the newest save's
cairn.torch.SaveHandle (futures for captured, replicated, persisted). `dcp.save` with the
writer returns once the version is captured. Training never reads tensors through DCP
after staging: the upload looks only at their shapes.

`checkpoint_id` maps to cairn's step: its last run of digits ("step-100", "checkpoint-100",
"epoch=3-step=1500" are steps 100, 100 and 1500); without digits (or without an id) the
step after the last one saved or loaded. Steps must increase, so an id that repeats one
already saved, or names a step not after the last, is an error naming it, raised before
anything is captured.

`dcp.load(state, storage_reader=cairn.dcp.StorageReader())` fills `state` from the newest
version every rank can get (or the step of its checkpoint_id): this rank's memory, a
replica or parity on other nodes, or the PFS, into any layout and world size (DCP's
planner asks for the boxes each rank needs; cairn reads them, verifying every chunk). Each
rank gets its own non-tensor entries back (a rank the saved job did not have gets rank
0's). `reader.report()` says what was restored and from where.

`cairn.dcp.StorageReader(path)` reads a committed step of a job's PFS directory
(<CAIRN_PFS_ROOT>/<job id>) without a running job: any torch >= 2.9 job loads it, at any
world size.

Writers and readers share the process's cairn (checkpointer(): a
cairn.torch.StateCheckpointer made on first use from CAIRN_* and RANK / WORLD_SIZE; every
rank makes it at the same point). DCP's PROCESS async checkpointer is refused: cairn's
capture lives in this process (use the THREAD one, DCP's default). Needs torch >= 2.9.
"""

import atexit
import collections
import concurrent.futures
import io
import os
import re
import sys
import time

import torch
from torch.distributed.checkpoint import StorageReader as _StorageReader
from torch.distributed.checkpoint import StorageWriter as _StorageWriter
from torch.distributed.checkpoint.metadata import (
    BytesStorageMetadata,
    ChunkStorageMetadata,
    Metadata,
    TensorProperties,
    TensorStorageMetadata,
)
from torch.distributed.checkpoint.planner import LoadItemType, WriteItemType
from torch.distributed.checkpoint.staging import AsyncStager as _AsyncStager
from torch.distributed.checkpoint.storage import WriteResult
from torch.futures import Future

from . import _cairn
from .torch import (
    _DTYPES,
    _STATE_BLOB,
    _TENSORS_BLOB,
    StateCheckpointer,
    _decode,
    _error,
    _stream_of,
    _tensor_shards,
)

_TORCH_DTYPES = {name: dt for dt, name in _DTYPES.items()}
_JOB = None  # the process's StateCheckpointer (checkpointer())


def checkpointer(**settings):
    """The process's cairn.torch.StateCheckpointer that cairn.dcp's writers and readers
    share, made on first use (collective: every rank makes it at the same point) from the
    CAIRN_* variables and RANK / WORLD_SIZE, with `settings` (copy_now=, allow_pickle=, or
    any cairn.Options field) applied. Settings given once it is open must agree with it.
    Closed at exit, or by close()."""
    global _JOB
    if _JOB is None or _JOB.closed:
        _JOB = StateCheckpointer(**settings)
        return _JOB
    for k, v in settings.items():
        have = getattr(_JOB, k, None) if k in ("allow_pickle", "copy_below") else (
            getattr(_JOB.options, k, None))
        if k == "copy_now" or have != v:
            raise _error(f"cairn.dcp: the job's checkpointer is open already, without {k}={v!r}:"
                         " give settings to the first writer or reader made, or pass "
                         "checkpointer=")
    return _JOB


def newest_step():
    """Collective: the newest step every rank of the job can restore from any tier (the one
    a dcp.load through StorageReader() loads), or None when there is none anywhere."""
    head = checkpointer()._head(None)
    return None if head is None else head.step


def close():
    """Closes the process's checkpointer (waits for captures in flight)."""
    global _JOB
    if _JOB is not None and not _JOB.closed:
        _JOB.close()
    _JOB = None


atexit.register(close)


def _step_of(checkpoint_id):
    """The step a checkpoint_id names: the last run of digits of its last path component;
    None without an id or digits."""
    if checkpoint_id is None:
        return None
    got = re.findall(r"\d+", os.path.basename(os.fspath(checkpoint_id).rstrip("/")))
    return int(got[-1]) if got else None


def _async_save_call():
    """(found, checkpoint_id, async_checkpointer_type) of the dcp.async_save this stage()
    is called from (DCP passes the id to the stager only after staging)."""
    f = sys._getframe(2)
    for _ in range(16):
        if f is None:
            break
        if f.f_code.co_name == "async_save" and f.f_globals.get("__name__", "").startswith(
                "torch.distributed.checkpoint"):
            return True, f.f_locals.get("checkpoint_id"), f.f_locals.get(
                "async_checkpointer_type")
        f = f.f_back
    return False, None, None


def _structure_copy(v):
    """The dicts and lists of a state dict copied, their leaves shared: what DCP's upload
    plans with, unchanged by a training loop that edits its own dicts meanwhile."""
    if isinstance(v, dict):
        return {k: _structure_copy(x) for k, x in v.items()}
    if isinstance(v, list):
        return [_structure_copy(x) for x in v]
    return v


_PROCESS_REFUSED = ("cairn.dcp.StorageWriter cannot run in DCP's PROCESS async checkpointer: "
                    "cairn's capture and host tier live in the training process. Use "
                    "async_checkpointer_type=AsyncCheckpointerType.THREAD (DCP's default): "
                    "its upload only plans, cairn copies in the background")


class StorageWriter(_StorageWriter, _AsyncStager):
    """A DCP StorageWriter, and AsyncStager, over the job's cairn (see the module's text).

    `checkpointer`: a cairn.torch.StateCheckpointer (default: checkpointer(**settings)).
    The newest save's SaveHandle is `last_save`."""

    _synchronize_after_execute = False  # async_save returns the staging future instead

    def __init__(self, checkpointer=None, **settings):
        super().__init__()
        self._given = checkpointer
        self._settings = settings
        self.checkpoint_id = None
        self.last_save = None
        self._staged = collections.deque()  # (step, checkpoint id, SaveHandle, names)
        self._ids = {}  # checkpoint id -> step, of the saves through this writer

    @property
    def checkpointer(self):
        if self._given is None:
            self._given = checkpointer(**self._settings)
        return self._given

    # -- AsyncStager -------------------------------------------------------------------

    def stage(self, state_dict, checkpoint_id=None):
        """Queues the capture of `state_dict` (dcp.async_save calls this): returns a future
        that completes with the state dict once every byte is in host memory. Outside
        async_save, `checkpoint_id` names the step (see the module's text)."""
        found, cid, kind = _async_save_call()
        if getattr(kind, "name", None) == "PROCESS":
            raise _error(_PROCESS_REFUSED, "FailedPrecondition")
        if checkpoint_id is not None or not found:
            cid = checkpoint_id if checkpoint_id is not None else self.checkpoint_id
        ck = self.checkpointer
        step = self._claim(cid, ck)
        handle = ck.save(step, state_dict)
        self.last_save = handle
        names = ck._layout_blobs[0]
        self._staged.append((step, cid, handle, names))
        # What the upload plans with: the state's containers copied (the loop may edit its
        # own), nested as given: DCP looks at each top-level entry with a slow isinstance
        # (its Stateful protocol), 40 us apiece, so the flattened state would cost 14 ms.
        staged = _structure_copy(state_dict)
        if not handle.queued:  # nothing to copy: write_data says it was skipped
            done = concurrent.futures.Future()
            done.set_result(staged)
            return done
        return ck._waits.copied(handle._seq, staged)

    def synchronize_staging(self):
        self.checkpointer.fence_host()

    def close(self):
        """Nothing to free: the host tier is the job's (checkpointer(), close())."""

    def fence_before(self, optimizer):
        """Makes `optimizer`.step() wait, first, until the saved tensors are copied."""
        self.checkpointer.fence_before(optimizer)

    # -- StorageWriter -----------------------------------------------------------------

    def reset(self, checkpoint_id=None):
        self.checkpoint_id = checkpoint_id

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def set_up_storage_writer(self, is_coordinator, *args, **kwargs):
        self.is_coordinator = is_coordinator

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def write_data(self, plan, planner):
        """Waits until this rank's version is captured (capturing it first for dcp.save) and
        returns where DCP's items are: in cairn's step. Raises the capture's error, or
        says the version was skipped (no free host slot)."""
        ck = self.checkpointer
        if self._staged:
            step, cid, handle, names = self._staged.popleft()
            asked = _step_of(self.checkpoint_id)
            if asked is not None and self.checkpoint_id != cid and asked != step:
                raise _error(f"cairn.dcp: checkpoint_id {os.fspath(self.checkpoint_id)!r} "
                             f"names step {asked}, but the stager captured step {step} for "
                             f"{cid!r}: stage through dcp.async_save, or pass checkpoint_id "
                             "to stage()")
        else:  # dcp.save: capture the planner's (flattened) state dict now
            if not hasattr(planner, "state_dict"):
                raise _error("cairn.dcp.StorageWriter needs a SavePlanner that keeps its state "
                             "dict (DefaultSavePlanner or a subclass)")
            step = self._claim(self.checkpoint_id, ck)
            handle = ck.save(step, planner.state_dict)
            self.last_save = handle
            names = ck._layout_blobs[0]
            ck.fence_host()
        if not handle.queued:
            raise _error(f"cairn.dcp: step {step} was not saved: {handle.skipped_because}",
                         "Unavailable")
        tensors = {n for n, _, _ in names[0]} if names else set()
        plain = set(names[1]) if names else set()
        for item in plan.items:
            fqn = item.index.fqn
            known = plain if item.type == WriteItemType.BYTE_IO else tensors
            if fqn not in known:
                raise _error(f"cairn.dcp: DCP planned '{fqn}', which cairn did not capture in "
                             f"step {step} (a planner that renames or adds entries?)")
        while not ck._ck.wait_save(handle._seq, True, 1.0):
            pass
        results = [WriteResult(index=item.index, size_in_bytes=_item_bytes(item),
                               storage_data={"cairn_step": step}) for item in plan.items]
        fut = Future()
        fut.set_result(results)
        return fut

    def finish(self, metadata, results):
        """Coordinator: every rank's results name the same step (the version is restorable
        once each rank captured it, which write_data waited for)."""
        steps = sorted({r.storage_data["cairn_step"] for rank in results for r in rank})
        if len(steps) > 1:
            raise _error(f"cairn.dcp: the ranks saved different steps {steps} for one "
                         "checkpoint: every rank must save the same checkpoint_ids")

    def storage_meta(self):
        return None

    def __getstate__(self):
        raise _error(_PROCESS_REFUSED, "FailedPrecondition")

    # -- internals ---------------------------------------------------------------------

    def _claim(self, checkpoint_id, ck):
        """The step of a new checkpoint (see the module's text); raises, naming the id,
        for one that repeats or does not come after the last step."""
        cid = None if checkpoint_id is None else os.fspath(checkpoint_id)
        if cid is not None and cid in self._ids:
            raise _error(f"cairn.dcp: checkpoint_id {cid!r} was saved already (as step "
                         f"{self._ids[cid]}); nothing was saved again")
        step = _step_of(cid)
        last = ck.last_step
        if step is None:
            step = 1 if last is None else last + 1
        elif last is not None and step <= last:
            raise _error(f"cairn.dcp: checkpoint_id {cid!r} names step {step}, which does not "
                         f"come after step {last} (the last saved or loaded); cairn's steps "
                         "increase: name each checkpoint by its training step")
        if cid is not None:
            self._ids[cid] = step
        return step


def _item_bytes(item):
    if item.tensor_data is None:
        return 0
    n = 1
    for x in item.tensor_data.chunk.sizes:
        n *= int(x)
    return n * torch.empty((), dtype=item.tensor_data.properties.dtype).element_size()


class StorageReader(_StorageReader):
    """A DCP StorageReader over every tier of the job's cairn, or, given `path`, over a
    committed step of a job's PFS directory without a job (see the module's text).

    `step`: the step to load (default: the checkpoint_id's, else the newest);
    `allow_pickle`: read non-tensor entries saved with allow_pickle=True or by an older
    cairn (see cairn.torch); `checkpointer`: a cairn.torch.StateCheckpointer (default:
    checkpointer(**settings)). What a dcp.load restored: report()."""

    def __init__(self, path=None, step=None, allow_pickle=False, checkpointer=None, **settings):
        super().__init__()
        self.allow_pickle = bool(allow_pickle)
        self.path = None if path is None else os.fspath(path)
        self.step = step
        self.checkpoint_id = None
        self._given = checkpointer
        self._settings = settings
        self._pfs = None
        self._plain_cache = None
        self._job = None  # (step, {name: (dtype, shape)}, plain entries) of the job's version
        self._report = None
        self._times = {}  # seconds in read_metadata, read_data and its restore, last load

    @property
    def checkpointer(self):
        if self._given is None:
            self._given = checkpointer(**self._settings)
        return self._given

    # -- the StorageReader interface -------------------------------------------------

    def reset(self, checkpoint_id=None):
        self._pfs = None
        self._job = None
        if checkpoint_id is None:
            return
        cid = os.fspath(checkpoint_id)
        if os.path.isdir(cid) and self._is_pfs_job_dir(cid):
            self.path = cid
        else:
            self.checkpoint_id = cid

    @classmethod
    def validate_checkpoint_id(cls, checkpoint_id):
        return isinstance(checkpoint_id, (str, os.PathLike))

    def read_metadata(self):  # no rank-local form: one collective, whatever it finds
        t0 = time.perf_counter()
        try:
            if self.path is not None:
                return self._pfs_metadata()
            return self._job_metadata()
        finally:
            self._times = {"metadata_s": time.perf_counter() - t0}

    def set_up_storage_reader(self, metadata, is_coordinator, *args, **kwargs):
        pass

    def prepare_local_plan(self, plan):
        return plan

    def prepare_global_plan(self, plans):
        return plans

    def read_data(self, plan, planner):
        t0 = time.perf_counter()
        if self.path is not None:
            step = self._open()
            dtypes = {name: (dtype, shape) for name, dtype, shape, _ in step.tensors()}
            read, plain = step.read, self._plain()
        else:
            _, dtypes, plain = self._job
            read = None
        targets, later = [], []
        for item in plan.items:
            name = item.storage_index.fqn
            if item.type == LoadItemType.BYTE_IO:
                buf = io.BytesIO()
                torch.save(plain[name], buf)  # plain data: DCP's torch.load runs no code
                buf.seek(0)
                planner.load_bytes(item, buf)
                continue
            dtype, shape = dtypes[name]
            lengths = [int(x) for x in item.lengths]
            offsets = [int(c) + int(o) for c, o in
                       zip(item.storage_index.offset, item.storage_offsets)]
            dest = planner.resolve_tensor(item).detach()
            # Straight into the target where it is the box, contiguous and of the dtype.
            direct = (dest.is_contiguous() and dest.dtype == _TORCH_DTYPES[dtype]
                      and list(dest.shape) == lengths
                      and (dest.device.type == "cpu" or (read is None and dest.is_cuda)))
            buf = dest if direct else torch.empty(lengths, dtype=_TORCH_DTYPES[dtype])
            targets += _tensor_shards(name, buf, shape, offsets)
            later.append((item, dest, None if direct else buf))
        t1 = time.perf_counter()
        if read is not None:
            if targets:
                read(targets)  # every saved box read once, its chunks verified
        else:  # collective: every rank's read_data restores its part
            ck = self.checkpointer
            self._report = ck._ck.restore(targets, step=self._job[0], partial=True,
                                          stream=_stream_of(targets))
            ck.last_report, ck.last_step = self._report, self._report.step
        t2 = time.perf_counter()
        for item, dest, buf in later:
            if buf is not None:
                dest.copy_(buf.view(dest.shape))
            planner.commit_tensor(item, dest)
        self._times.update(read_data_s=time.perf_counter() - t0, restore_s=t2 - t1)
        fut = Future()
        fut.set_result(None)
        return fut

    def report(self):
        """What the last dcp.load restored: {"step", "tier" (host, peer or pfs), "bytes",
        "seconds", "bytes_local", "bytes_received", "pfs_bytes_read", "resharded",
        "rebuilt_step", "skipped"} from the job's tiers, or {"step", "tier": "pfs",
        "directory"} from a PFS directory, with the seconds this reader spent in DCP's
        calls ("metadata_s", "read_data_s", and "restore_s" of it reading); None before a
        load."""
        if self.path is not None and self._pfs is not None:
            return {"step": self._pfs.step, "tier": "pfs", "directory": self._pfs.directory,
                    **self._times}
        r = self._report
        if r is None:
            return None
        return {"step": r.step, "tier": r.tier, "bytes": r.bytes, "seconds": r.seconds,
                "bytes_local": r.bytes_local, "bytes_received": r.bytes_received,
                "pfs_bytes_read": r.pfs_bytes_read, "resharded": r.resharded,
                "rebuilt_step": r.rebuilt_step, "skipped": list(r.skipped), **self._times}

    # -- the job's tiers ---------------------------------------------------------------

    def _job_metadata(self):
        """Collective (DCP calls it on every rank): agrees on the version, then describes
        each tensor as one chunk of its global shape, so that DCP's planner asks for any
        box of it, and each non-tensor entry this rank saved."""
        ck = self.checkpointer
        step = self.step if self.step is not None else _step_of(self.checkpoint_id)
        if step is None and self.checkpoint_id is not None:
            raise _error(f"cairn.dcp: checkpoint_id {self.checkpoint_id!r} names no step "
                         "(cairn's steps are the last run of digits of an id)")
        head = ck._head(step)
        if head is None:
            raise _error(f"cairn.dcp: job '{ck.options.job_id}' holds no version in any tier "
                         "(host memory, other nodes, the PFS): nothing to load", "NotFound")
        saved = ck._saved_of(head)
        # Every rank's list of tensors: a rank of a resharded job may need one it never held.
        dtypes = {}
        for blob in ck._ck.allgather(bytes(head.blobs.get(_TENSORS_BLOB, b""))):
            if blob:
                for name, (dtype, shape) in _decode(blob, "list of tensors", head.step).items():
                    dtypes.setdefault(name, (dtype, list(shape)))
        if not dtypes and saved.tensors is None:
            raise _error(f"cairn.dcp: step {head.step} has no list of its tensors (saved "
                         "before cairn recorded one): read its PFS copy with "
                         "StorageReader(<pfs_root>/<job id>)")
        md = {}
        for name, (dtype, shape) in dtypes.items():
            md[name] = TensorStorageMetadata(
                properties=TensorProperties(dtype=_TORCH_DTYPES[dtype]),
                size=torch.Size(shape),
                chunks=[ChunkStorageMetadata(offsets=torch.Size([0] * len(shape)),
                                             sizes=torch.Size(shape))])
        for name in saved.plain:
            md.setdefault(name, BytesStorageMetadata())
        self._job = (head.step, dtypes, saved.plain)
        return Metadata(state_dict_metadata=md)

    # -- a PFS directory ---------------------------------------------------------------

    @staticmethod
    def _is_pfs_job_dir(path):
        try:
            return bool(_cairn.PfsStep.steps(path))
        except Exception:
            return False

    def _pfs_metadata(self):
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

    def _open(self):
        if self._pfs is None:
            self._pfs = _cairn.PfsStep.open(self.path, self.step)
            self._plain_cache = None
        return self._pfs

    def _plain(self):
        """The state dict's non-tensor entries as this rank saved them (a rank the saved job
        did not have: rank 0's)."""
        if self._plain_cache is None:
            step = self._open()
            rank = 0
            if torch.distributed.is_available() and torch.distributed.is_initialized():
                rank = torch.distributed.get_rank()
            blobs = step.blobs(rank if rank < step.world_size else 0)
            self._plain_cache = (_decode(blobs[_STATE_BLOB], "state dict's non-tensor entries",
                                         step.step, self.allow_pickle)
                                 if _STATE_BLOB in blobs else {})
        return self._plain_cache
