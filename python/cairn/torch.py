"""cairn.torch: checkpoint a PyTorch training loop every iteration.

    ckpt = cairn.torch.Checkpointer(model, optimizer)    # settings: CAIRN_* and RANK, ...
    start = ckpt.restore() or 0                          # the newest version, if any
    for step in range(start + 1, steps + 1):
        loss = model(batch(step)).backward(); optimizer.step()   # fence() runs first
        ckpt.save(step)

save() queues the model's and the optimizer's tensors (their state_dict() entries,
zero-copy) and returns at once; cairn copies them into host memory while the next forward
and backward run (they only read them). A hook on the optimizer calls fence() before
every optimizer.step(), so the copy is complete before anything is overwritten. Anything
else that writes parameters or optimizer state in place between save() and the next
optimizer.step() must call fence() first. Model buffers (which forward passes may update)
are copied when save() is called.

CUDA tensors: save() passes the current CUDA stream, and the version holds exactly what
that stream had written when save() was called (optimizer kernels still queued included);
the host does not wait. fence() makes the current stream wait on the GPU for the copy and
returns at once, so the optimizer's kernels queued after it run only once the copy has read
the tensors. Code that writes the saved tensors from the CPU, or from another stream that
no fence ordered, calls fence_host() first.

Besides the tensors, each version holds the RNG states (torch, CUDA when present, numpy,
Python's random), the optimizer's param_groups and non-tensor state, and a user dict
(`extra`: data-loader position, scheduler state, ...). They are stored as data, never as
code: dicts, lists, tuples, sets, strings, bytes, numbers, None and tensors, written with
pickle's opcodes and read back by an unpickler that refuses every other type (as
torch.load(weights_only=True) does), so a restore never runs code a checkpoint carries.
An `extra` holding other objects needs allow_pickle=True, on save and on restore; so do
versions saved by cairn before this format (their blobs are plain pickles), and the error
says so. Use it only for checkpoints that nobody else could have written.

Sharded state: FlatRange (a 1-D tensor holding a flat range of a larger tensor, as ZeRO
and FSDP keep them) and objects with the ShardedTensor interface (local_shards() with
shard_offsets / shard_sizes) are saved with their global offsets, so a restore can
reshard them into another layout. Pass them in `tensors`, or let them come from
state_dict().
"""

import collections
import concurrent.futures
import fnmatch
import functools
import importlib
import io
import operator
import pickle
import random
import threading
import types
import weakref

import torch

from . import _cairn

try:
    import numpy as _np
except ImportError:  # numpy's RNG state is then not saved
    _np = None

_DTYPES = {
    torch.float64: "float64",
    torch.float32: "float32",
    torch.float16: "float16",
    torch.bfloat16: "bfloat16",
    torch.int64: "int64",
    torch.int32: "int32",
    torch.int16: "int16",
    torch.int8: "int8",
    torch.uint8: "uint8",
    torch.bool: "bool",
}
for _name, _cairn_name in (("float8_e4m3fn", "float8_e4m3fn"), ("float8_e5m2", "float8_e5m2")):
    if hasattr(torch, _name):
        _DTYPES[getattr(torch, _name)] = _cairn_name

_STATE_BLOB = "torch.state"  # the state dict's non-tensor entries (param_groups, ...)
_USER_BLOB = "user"
_NO_OPTIM_STATE_BLOB = "torch.optim.stateless"  # saved before the optimizer's first step
# The optimizer state's tensors, per parameter name: [(key, kind, dtype)], kind "param" (a
# tensor shaped and laid out as its parameter) or "scalar" / "scalar_cpu" (0-d, on the
# parameter's device or on the CPU). A restore into an optimizer without state creates
# those tensors from it instead of running a zero step (below).
_OPTIM_LAYOUT_BLOB = "torch.optim.layout"


def _error(message, code="InvalidArgument"):
    """A cairn.Error, as the C++ core raises them (`code` names the kind)."""
    e = _cairn.Error(message)
    e.code = code
    return e


# -- blobs as data --------------------------------------------------------------------
# A blob starts with the format it is in: _DATA_MAGIC (pickle's opcodes for plain data, read
# by _DataUnpickler, which calls nothing but the constructors below) or _PICKLE_MAGIC (any
# object, written and read only with allow_pickle=True). A blob with neither was saved
# before these formats, as a plain pickle.
_DATA_MAGIC = b"cairn-data-1\n"
_PICKLE_MAGIC = b"cairn-pickle-1\n"
_DTYPE_BY_NAME = {name: dtype for dtype, name in _DTYPES.items()}


def _tensor_from_bytes(dtype_name, shape, data):
    """A CPU tensor from what _DataPickler wrote for one (the only tensor constructor the
    unpickler calls)."""
    dtype = _DTYPE_BY_NAME.get(dtype_name)
    if dtype is None or not isinstance(data, bytes) or not isinstance(shape, tuple):
        raise pickle.UnpicklingError(f"not a tensor cairn saved: dtype {dtype_name!r}")
    n = functools.reduce(operator.mul, shape, 1)
    if n * torch.empty((), dtype=dtype).element_size() != len(data):
        raise pickle.UnpicklingError(f"a tensor of shape {shape} does not have {len(data)} bytes")
    if n == 0:
        return torch.empty(shape, dtype=dtype)
    return torch.frombuffer(bytearray(data), dtype=torch.uint8).view(dtype).reshape(shape)


def _dtype_from_name(name):
    dtype = _DTYPE_BY_NAME.get(name)
    if dtype is None:
        raise pickle.UnpicklingError(f"not a dtype cairn saves: {name!r}")
    return dtype


class _Refused(TypeError):
    pass


class _DataPickler(pickle.Pickler):
    """Pickles plain data only; tensors as (dtype, shape, bytes); anything else is _Refused."""

    _PLAIN = (complex, bytearray, collections.OrderedDict)

    def reducer_override(self, obj):
        if isinstance(obj, torch.Tensor):
            t = obj.detach().cpu().contiguous()
            if t.dtype not in _DTYPES:
                raise _Refused(f"a tensor of dtype {t.dtype}")
            raw = t.reshape(-1).view(torch.uint8).numpy().tobytes() if t.numel() else b""
            return _tensor_from_bytes, (_DTYPES[t.dtype], tuple(t.shape), raw)
        if isinstance(obj, torch.dtype) and obj in _DTYPES:
            return _dtype_from_name, (_DTYPES[obj],)
        if type(obj) in self._PLAIN or any(obj is f for f in _DataUnpickler._ALLOWED.values()):
            return NotImplemented  # a plain type, or a constructor the unpickler allows
        raise _Refused(f"a {type(obj).__module__}.{type(obj).__qualname__}")


class _DataUnpickler(pickle.Unpickler):
    """Loads what _DataPickler wrote and refuses every other global: nothing a blob names is
    called but these constructors."""

    _ALLOWED = {
        ("builtins", "complex"): complex,
        ("builtins", "bytearray"): bytearray,
        ("collections", "OrderedDict"): collections.OrderedDict,
        (__name__, "_tensor_from_bytes"): _tensor_from_bytes,
        (__name__, "_dtype_from_name"): _dtype_from_name,
    }

    def find_class(self, module, name):
        f = self._ALLOWED.get((module, name))
        if f is None:
            raise pickle.UnpicklingError(f"it names {module}.{name}, which cairn does not call")
        return f

    def persistent_load(self, pid):
        raise pickle.UnpicklingError("it refers to a persistent object")


def _encode(obj, what, allow_pickle=False):
    """A blob holding `obj` (see above); `what` names it in errors."""
    out = io.BytesIO()
    out.write(_DATA_MAGIC)
    try:
        _DataPickler(out, protocol=5).dump(obj)
    except _Refused as e:
        if not allow_pickle:
            raise _error(f"cairn.torch: {what} holds {e}, which a restore would not load: keep "
                         "it to dicts, lists, tuples, sets, str, bytes, numbers, None and "
                         "tensors, or pass allow_pickle=True (then restoring it runs whatever "
                         "code it names: use it only for checkpoints nobody else can write)",
                         "InvalidArgument") from None
        return _PICKLE_MAGIC + pickle.dumps(obj, protocol=5)
    return out.getvalue()


def _decode(blob, what, step, allow_pickle=False):
    """The object in `blob`, read without running code unless allow_pickle."""
    blob = bytes(blob)
    if blob.startswith(_DATA_MAGIC):
        try:
            return _DataUnpickler(io.BytesIO(memoryview(blob)[len(_DATA_MAGIC):])).load()
        except (pickle.UnpicklingError, EOFError, ValueError, TypeError, IndexError) as e:
            raise _error(f"cairn.torch: the {what} of step {step} is not data cairn wrote ({e}); "
                         "not restored", "DataLoss") from None
    if allow_pickle:
        body = blob[len(_PICKLE_MAGIC):] if blob.startswith(_PICKLE_MAGIC) else blob
        return pickle.loads(body)
    why = ("was saved with allow_pickle=True (it holds objects only pickle can rebuild)"
           if blob.startswith(_PICKLE_MAGIC) else
           "was saved by an older cairn, as a plain pickle")
    raise _error(f"cairn.torch: the {what} of step {step} {why}; restoring it would run code "
                 "the checkpoint names. If nobody else could have written this checkpoint, "
                 "restore with allow_pickle=True (cairn.torch.Checkpointer(..., "
                 "allow_pickle=True), cairn.dcp.StorageReader(..., allow_pickle=True))",
                 "FailedPrecondition")


class FlatRange:
    """A 1-D contiguous tensor holding elements [begin, begin + numel) of the row-major
    flattening of a tensor of `global_shape` (a ZeRO / FSDP flat partition)."""

    def __init__(self, tensor, global_shape, begin):
        if tensor.dim() != 1:
            raise _error("FlatRange needs a 1-D tensor")
        self.tensor = tensor
        self.global_shape = [int(x) for x in global_shape]
        self.begin = int(begin)


def _dtype_name(name, t):
    try:
        return _DTYPES[t.dtype]
    except KeyError:
        raise _error(f"{name}: cairn cannot save dtype {t.dtype}") from None


def _tensor_shards(name, t, global_shape=None, offsets=None):
    if not t.is_contiguous():
        raise _error(f"{name}: the tensor is not contiguous (cairn reads it in place)")
    shape = [int(x) for x in (t.shape if global_shape is None else global_shape)]
    lengths = None if offsets is None else [int(x) for x in t.shape]
    return [
        _cairn.Shard(
            name,
            _dtype_name(name, t),
            shape,
            t.data_ptr(),
            None if offsets is None else [int(x) for x in offsets],
            lengths,
            t.is_cuda,
            t,
        )
    ]


@functools.lru_cache(maxsize=None)
def _dtensor_class():
    """torch.distributed.tensor.DTensor (torch >= 2.4; torch.distributed._tensor before),
    or None where this torch has none (looked up once)."""
    for mod in ("torch.distributed.tensor", "torch.distributed._tensor"):
        try:
            cls = getattr(importlib.import_module(mod), "DTensor", None)
        except Exception:  # no torch.distributed in this build, or an old torch
            cls = None
        if cls is not None:
            return cls
    return None


def _dtensor_shards(name, value, copies):
    """A DTensor's local part as a box of its global tensor (Shard on any mesh dim and
    tensor dim, Replicate: every rank holds the same box, which cairn writes once). A local
    part that is a strided view (uneven or nested splits leave some) goes through a
    contiguous copy: taken now for a save; for a restore, (copy, view) is added to
    `copies`, to be copied back after the restore."""
    for p in value.placements:
        if p.is_partial():
            raise _error(f"{name}: a DTensor with a Partial placement holds no value yet "
                         "(reduce it first)")
    local = value.to_local()
    if local.numel() == 0:
        return []  # an uneven split left this rank nothing
    (chunk,) = value.__create_chunk_list__()
    if not local.is_contiguous():
        view, local = local, local.contiguous()
        if copies is not None:
            copies.append((local, view))
    return _tensor_shards(name, local, list(value.shape), list(chunk.offsets))


def _shards_of(name, value, copies=None):
    """The cairn shards of one state entry: a tensor, a FlatRange, a ShardedTensor, or a
    list of them (parts of one tensor held by this rank)."""
    if isinstance(value, (list, tuple)):
        return [s for part in value for s in _shards_of(name, part, copies)]
    dtensor = _dtensor_class() if torch.is_tensor(value) else None
    if dtensor is not None and isinstance(value, dtensor):
        return _dtensor_shards(name, value, copies)
    if isinstance(value, FlatRange):
        t = value.tensor
        if not t.is_contiguous():
            raise _error(f"{name}: the flat range is not contiguous")
        begin = value.begin
        return _cairn.Shard.flat_range(
            name, _dtype_name(name, t), value.global_shape, begin, begin + t.numel(),
            t.data_ptr(), t.is_cuda, t,
        )
    if callable(getattr(value, "local_shards", None)) and callable(getattr(value, "size", None)):
        out = []
        for s in value.local_shards():
            md = s.metadata
            out += _tensor_shards(name, s.tensor, list(value.size()), md.shard_offsets)
        return out
    if torch.is_tensor(value):
        return _tensor_shards(name, value)
    raise _error(f"{name}: cannot checkpoint a {type(value).__name__}")


def _flatten(state):
    """The state dict flattened as torch.distributed.checkpoint (DCP) flattens it (its
    traverse_state_dict, torch >= 2.4): dicts walked, keys joined with '.'; a list walked by
    index when it holds a tensor or a dict (or such a list), else one entry
    ("optim.param_groups.0.lr", but "optim.param_groups.0.params" is one entry); a tuple
    is one entry. cairn saves each tensor under its flattened name, so that DCP's planner
    finds it under the same name (cairn.dcp). Faster than DCP's own, which save() would
    pay every iteration; the tests check that the two agree."""
    out = {}
    for k, v in state.items():
        _walk(str(k), v, out)
    return out


def _walk(path, v, out):
    if isinstance(v, dict):
        for k, x in v.items():
            _walk(f"{path}.{k}", x, out)
    elif isinstance(v, list) and not _terminal_list(v):
        for i, x in enumerate(v):
            _walk(f"{path}.{i}", x, out)
    else:
        out[path] = v


def _terminal_list(v):
    for e in v:
        if isinstance(e, dict) or torch.is_tensor(e):
            return False
        if isinstance(e, list) and not _terminal_list(e):
            return False
    return True


def _address(t):
    """What a tensor's shards depend on besides its identity (where its bytes are and
    their shape), or None when its shards cannot be reused (a strided DTensor part is
    copied at every save; ShardedTensor and other subclasses are walked every time)."""
    kind = type(t)
    if kind is torch.nn.Parameter or kind is torch.Tensor:
        return (t.data_ptr(), t.shape) if t.is_contiguous() else None
    dtensor = _dtensor_class()
    if dtensor is not None and isinstance(t, dtensor):
        local = t._local_tensor
        if not local.is_contiguous():
            return None
        # The spec (mesh, placements, global shape) by identity: a DTensor's spec is not
        # changed in place, and the caches holding this address hold the DTensor, so the
        # spec lives. An equal spec in a new object only misses the cache.
        return (local.data_ptr(), local.shape, id(t._spec))
    return None


def _memory_key(t):
    return (t.data_ptr(), t.shape, t.dtype, t.is_contiguous())


class _SavePlan:
    """What one save's walk of the state found, kept to let the next saves skip the walk
    while nothing changed (Checkpointer._unchanged_state): the model's state_dict names
    and objects, each optimizer state entry's keys and objects, the memory every reused
    shard points at, and those shards converted once (a cairn ShardList). Buffers are
    cloned and converted at every save. `usable` turns False for a state the check does
    not cover (extra `tensors`, non-tensor model or optimizer state, flat ranges,
    ShardedTensors, strided DTensor parts), which is walked at every save."""

    _PLAIN = (torch.Tensor, torch.nn.Parameter)

    def __init__(self):
        self.usable = True
        self.buffers = []  # (name, buffer)
        self.fixed = []  # the shards of everything else
        self.memory = []  # the tensors those shards point into
        self.memory_keys = []
        self.dtensors = []  # (DTensor, its local tensor)

    def add_tensor(self, name, v, address, shards):
        if address is None:
            self.usable = False  # copied at every save
            return
        self.fixed += shards
        if type(v) in self._PLAIN:
            self.memory.append(v)
        else:  # a DTensor (_address is None for anything else)
            self.memory.append(v._local_tensor)
            self.dtensors.append((v, v._local_tensor))
        self.memory_keys.append(_memory_key(self.memory[-1]))

    def finish(self, ck, state, plain):
        """This plan, or None where the state is not one it covers."""
        if not self.usable or "tensors" in state:
            return None
        model = state["model"]
        if any(k.startswith("model.") for k in plain):
            return None  # a non-tensor model entry (extra state): walked every time
        self.model_keys = list(model)
        self.model_values = list(model.values())
        self.optim = None
        if ck.optimizer is not None:
            if any(not k.startswith("optim.param_groups.") for k in plain if k.startswith("optim.")):
                return None  # non-tensor optimizer state
            self.optim = [(p, list(st), list(st.values())) for p, st in ck.optimizer.state.items()]
        self.shards = _cairn.ShardList(self.fixed)
        del self.fixed
        return self


def _is_saved_tensor(v):
    return torch.is_tensor(v) or isinstance(v, FlatRange) or (
        callable(getattr(v, "local_shards", None)) and callable(getattr(v, "size", None)))


def _init_optimizer_state(optimizer):
    """Creates an optimizer's state where it has none yet, as DCP's set_state_dict does: one
    step with zero gradients and the learning rate at 0 (the parameters stay as they are),
    so that the restore fills tensors of the right shapes and placements (a DTensor
    parameter's moments are DTensors of its layout)."""
    if optimizer.state:
        return
    params = [p for g in optimizer.param_groups for p in g["params"]]
    if any(p.grad is not None for p in params):
        return
    for p in params:
        if p.requires_grad:
            p.grad = torch.zeros_like(p)
    lrs = [g["lr"] for g in optimizer.param_groups if "lr" in g]
    for g in optimizer.param_groups:
        if "lr" in g:
            g["lr"] = torch.tensor(0.0) if torch.is_tensor(g["lr"]) else 0.0
    optimizer.step()
    for g in optimizer.param_groups:
        if "lr" in g:
            g["lr"] = lrs.pop(0)
    optimizer.zero_grad(set_to_none=True)


def _optimizer_layout(optimizer, fqn):
    """The _OPTIM_LAYOUT_BLOB entry of an optimizer's state, or None when some tensor of it
    is neither shaped as its parameter nor a scalar (then a restore makes the state with a
    zero step)."""
    layout = {}
    for p, st in optimizer.state.items():
        entries = []
        for key, v in st.items():
            if not torch.is_tensor(v):
                continue  # saved with the plain entries
            dtype = _DTYPES.get(v.dtype)
            if dtype is None:
                return None
            if v.shape == p.shape and v.device == p.device and (
                    getattr(v, "placements", None) == getattr(p, "placements", None)) and (
                    getattr(v, "device_mesh", None) is getattr(p, "device_mesh", None)):
                kind = "param"
            elif v.dim() == 0 and type(v) in _SavePlan._PLAIN:
                kind = "scalar" if v.device == p.device else (
                    "scalar_cpu" if v.device.type == "cpu" else None)
                if kind is None:
                    return None
            else:
                return None
            entries.append((key, kind, dtype))
        layout[fqn[id(p)]] = entries
    return layout


def _empty_like(p, dtype):
    """An uninitialised tensor of p's shape, placement and device. For a DTensor, its local
    part is made and wrapped (DTensor.from_local): torch.empty_like on a DTensor runs the
    sharding propagation, about 0.2 ms a tensor, most of the making of an AdamW state."""
    cls = _dtensor_class()
    if cls is not None and isinstance(p, cls):
        local = torch.empty_like(p._local_tensor, dtype=dtype)
        return cls.from_local(local, p.device_mesh, p.placements, run_check=False,
                              shape=p.shape, stride=p.stride())
    return torch.empty_like(p, dtype=dtype)


def _optimizer_state_tensors(layout, by_name):
    """An optimizer's state tensors made from a saved layout ({parameter: {key: tensor}},
    uninitialised: the restore fills every byte), which costs an allocation where a zero
    step costs the optimizer's whole update (130 ms of a 0.2 GB AdamW state here, more than
    the restore itself). None when the layout names a parameter the optimizer lacks."""
    if any(name not in by_name for name in layout):
        return None
    state = {}
    with torch.no_grad():
        for name, entries in layout.items():
            p = by_name[name]
            st = state[p] = {}
            for key, kind, dtype in entries:
                dt = _dtype_from_name(dtype)
                if kind == "param":
                    st[key] = _empty_like(p, dt)
                else:
                    st[key] = torch.zeros((), dtype=dt,
                                          device="cpu" if kind == "scalar_cpu" else p.device)
    return state


def _host_parts(state):
    """cairn.Shards over the host memory of the state tensors' local parts (what a
    cairn.Prefault faults in)."""
    cls = _dtensor_class()
    out = []
    for st in state.values():
        for key, t in st.items():
            local = t._local_tensor if cls is not None and isinstance(t, cls) else t
            if local.device.type == "cpu" and local.numel() > 1 and local.is_contiguous():
                out += _tensor_shards(key, local)
    return out


# -- saves that say what happened --------------------------------------------------------


def rng_state():
    """This process's RNG states (Python's, NumPy's, torch's CPU and, once CUDA is in use,
    every device's) as plain data, for a state dict: bytes, not tensors, since cairn names
    tensors job-wide and every rank has its own. set_rng_state() puts them back."""
    state = {"python": random.getstate(),
             "cpu": torch.random.get_rng_state().numpy().tobytes()}
    try:
        import numpy as np
    except ImportError:
        np = None
    if np is not None:
        name, keys, pos, has_gauss, cached = np.random.get_state()
        state["numpy"] = [name, keys.tobytes(), int(pos), int(has_gauss), float(cached)]
    if torch.cuda.is_available() and torch.cuda.is_initialized():
        state["cuda"] = [s.numpy().tobytes() for s in torch.cuda.get_rng_state_all()]
    return state


def set_rng_state(state):
    """Puts back the RNG states rng_state() took (those of devices this process lacks are
    left out)."""

    def tensor(b):
        return torch.frombuffer(bytearray(b), dtype=torch.uint8)

    v = state["python"]
    random.setstate((v[0], tuple(v[1]), v[2]))
    torch.random.set_rng_state(tensor(state["cpu"]))
    if "numpy" in state:
        import numpy as np

        name, keys, pos, has_gauss, cached = state["numpy"]
        np.random.set_state((name, np.frombuffer(keys, dtype=np.uint32).copy(), pos,
                             has_gauss, cached))
    if "cuda" in state and torch.cuda.is_available():
        for i, s in enumerate(state["cuda"][:torch.cuda.device_count()]):
            torch.cuda.set_rng_state(tensor(s), i)


class SaveHandle:
    """What one save() did with its version: `step`; `queued` (also the handle's truth value:
    False when the version was skipped for want of a free host slot, CAIRN_FULL_POLICY,
    and `skipped_because` says why); and futures (concurrent.futures.Future, made when first
    asked for) for the version's states, each raising the version's error (a cairn.Error):

      captured    every byte in this rank's host memory and its checksums committed: the
                  version is restorable (result: the step);
      replicated  this step, or a newer one of this rank, held in another node's memory
                  (a replica or its parity set); raises when the push failed or the job does
                  not replicate (one node, CAIRN_REPLICAS=0);
      persisted   this step or a newer one committed to the PFS (result: the step LATEST
                  named then); raises when a drain round fails after this save. With
                  CAIRN_PERSIST_EVERY=0 only flush() drains.

    A skipped version's futures raise at once. close() settles what is still pending."""

    def __init__(self, owner, step, seq, skipped_because=None):
        self.step = int(step)
        self.queued = skipped_because is None
        self.skipped_because = skipped_because
        self._owner = owner
        self._seq = seq
        self._futures = {}
        self._persist_failed = None

    def __bool__(self):
        return self.queued

    def __repr__(self):
        what = "queued" if self.queued else f"skipped: {self.skipped_because}"
        return f"<cairn.torch.SaveHandle step {self.step} {what}>"

    def _future(self, kind):
        got = self._futures.get(kind)
        if got is None:
            got = self._futures[kind] = concurrent.futures.Future()
            if not self.queued:
                got.set_exception(_error(f"step {self.step} was not saved: "
                                         f"{self.skipped_because}", "Unavailable"))
            else:
                self._owner._waits.watch(kind, self, got)
        return got

    @property
    def captured(self):
        return self._future("captured")

    @property
    def replicated(self):
        return self._future("replicated")

    @property
    def persisted(self):
        return self._future("persisted")

    def result(self, timeout=None):
        """Waits until the version is captured; returns its step (raises its error)."""
        return self.captured.result(timeout)


class _Waits:
    """The threads behind SaveHandle's futures and the DCP stager's staging futures: one
    waits, in order, for the bytes of queued saves to be copied (the staging futures, which
    a training loop waits on), another polls every 20 ms, while a future is pending, for
    the captured, replicated and persisted states. Both call only what the core allows from
    any thread, with bounded waits, and stop before the core closes."""

    _POLL_S = 0.02

    def __init__(self, core):
        self._core = core
        self._cv = threading.Condition()
        self._copies = collections.deque()  # (seq, future, value)
        self._watched = []  # (kind, handle, future)
        self._threads = []
        self._closing = False

    def copied(self, seq, value):
        """A future that gets `value` once every byte of save `seq` is in host memory."""
        fut = concurrent.futures.Future()
        with self._cv:
            self._copies.append((seq, fut, value))
            self._start("cairn-copies", self._copy_loop)
            self._cv.notify_all()
        return fut

    def watch(self, kind, handle, fut):
        if kind == "persisted":
            handle._persist_failed = self._core.stats().persist_failed
        with self._cv:
            self._watched.append((kind, handle, fut))
            self._start("cairn-states", self._poll_loop)
            self._cv.notify_all()

    def _start(self, name, loop):
        if self._closing or any(t.name == name for t in self._threads):
            return
        t = threading.Thread(target=loop, name=name, daemon=True)
        self._threads.append(t)
        t.start()

    def _copy_loop(self):
        while True:
            with self._cv:
                while not self._copies and not self._closing:
                    self._cv.wait()
                if self._closing:
                    return  # close() settles what is left
                seq, fut, value = self._copies[0]
            try:
                done = self._core.wait_save(seq, False, 0.25)
            except Exception as e:  # its capture failed
                done, error = True, e
            else:
                error = None
            if done:
                with self._cv:
                    self._copies.popleft()
                if error is None:
                    fut.set_result(value)
                else:
                    fut.set_exception(error)

    def _check(self, kind, handle, fut, stats, wait):
        """Settles `fut` when its state is known (wait: seconds the core may wait)."""
        try:
            if kind == "captured":
                if self._core.wait_save(handle._seq, True, wait):
                    fut.set_result(handle.step)
            elif kind == "replicated":
                if self._core.wait_replicated(wait, handle.step):
                    fut.set_result(handle.step)
            elif stats.newest_persisted_step >= handle.step:
                fut.set_result(stats.newest_persisted_step)
            elif stats.persist_failed > handle._persist_failed:
                fut.set_exception(_error(f"step {handle.step} not persisted: a drain round "
                                         f"failed after it: {stats.last_persist_error}",
                                         "Unavailable"))
        except Exception as e:
            fut.set_exception(e)
        return fut.done()

    def _poll_loop(self):
        while True:
            with self._cv:
                while not self._watched and not self._closing:
                    self._cv.wait()
                if self._closing:
                    return
                watched = list(self._watched)
            stats = self._core.stats() if any(k == "persisted" for k, _, _ in watched) else None
            settled = [w for w in watched if self._check(*w, stats, 0)]
            with self._cv:
                for w in settled:
                    self._watched.remove(w)
                self._cv.wait(self._POLL_S)

    def close(self, timeout_s=60.0):
        """Stops the threads, then settles every pending future from the calling thread:
        copies and captures are waited for (close waits for them anyway), a state not
        reached yet is an error saying the checkpointer closed first."""
        with self._cv:
            self._closing = True
            self._cv.notify_all()
        for t in self._threads:
            t.join()
        self._threads = []
        for seq, fut, value in self._copies:
            try:
                if self._core.wait_save(seq, False, timeout_s):
                    fut.set_result(value)
                else:
                    fut.set_exception(_error(f"save {seq} not copied in {timeout_s} s",
                                             "Unavailable"))
            except Exception as e:
                fut.set_exception(e)
        self._copies.clear()
        stats = self._core.stats()
        for kind, handle, fut in self._watched:
            wait = timeout_s if kind == "captured" else 0
            if not self._check(kind, handle, fut, stats, wait):
                fut.set_exception(_error(f"step {handle.step}: the checkpointer closed before "
                                         f"it was {kind}", "FailedPrecondition"))
        self._watched.clear()


# -- any state dict ---------------------------------------------------------------------

_TENSORS_BLOB = "torch.tensors"  # {flattened name: (dtype, global shape)} of the version
_PATHS_BLOB = "torch.paths"  # {flattened name: its path of keys in the nested state dict}


# Values that are entries themselves, never containers, tensors or Stateful: checked by
# their exact type first (a save walks hundreds of them: an optimizer's settings per
# parameter, as torchtitan flattens them).
_PLAIN_LEAVES = frozenset({int, float, bool, str, bytes, type(None)})


def _is_stateful(v):
    """An object DCP treats as Stateful (state_dict() and load_state_dict()), not a tensor."""
    return (not torch.is_tensor(v) and callable(getattr(v, "state_dict", None))
            and callable(getattr(v, "load_state_dict", None)))


def _walk_state(state, resolve):
    """A DCP-style state dict walked as DCP flattens it (_flatten): returns ({flattened name:
    value}, {name: path of keys}, {name: (container, key)} where the value lives, [(Stateful,
    its state dict)] innermost first). Stateful objects, at any depth, are replaced by their
    state_dict(): resolve(name, obj) returns that dict (it may prepare obj first)."""
    flat, paths, refs, statefuls = {}, {}, {}, []
    tensor, leaves = torch.Tensor, _PLAIN_LEAVES

    def walk(path, name, v, container, key):
        if type(v) in leaves or isinstance(v, tensor):  # most entries: checked first
            flat[name], paths[name], refs[name] = v, path, (container, key)
        elif type(v) is not dict and _is_stateful(v):
            obj, v = v, resolve(name, v)
            if isinstance(v, dict):
                for k, x in v.items():
                    walk(path + (k,), f"{name}.{k}", x, v, k)
            else:
                flat[name], paths[name], refs[name] = v, path, (None, None)
            statefuls.append((obj, v))
        elif isinstance(v, dict):
            for k, x in v.items():
                walk(path + (k,), f"{name}.{k}", x, v, k)
        elif isinstance(v, list) and not _terminal_list(v):
            for i, x in enumerate(v):  # (i,): an index into a list, not a key
                walk(path + ((i,),), f"{name}.{i}", x, v, i)
        else:
            flat[name], paths[name], refs[name] = v, path, (container, key)

    if not isinstance(state, dict):
        raise _error(f"a state dict must be a dict, not a {type(state).__name__}")
    for k, v in state.items():
        walk((k,), str(k), v, state, k)
    return flat, paths, refs, statefuls


def _is_entry_tensor(v):
    if type(v) in _PLAIN_LEAVES:
        return False
    return _is_saved_tensor(v) or (isinstance(v, tuple) and v
                                   and all(_is_saved_tensor(x) for x in v))


def _global_meta(v):
    """(dtype name, global shape) of a tensor entry (DTensor: its global tensor)."""
    if isinstance(v, tuple):
        v = v[0]
    if isinstance(v, FlatRange):
        return _DTYPES.get(v.tensor.dtype), tuple(v.global_shape)
    if callable(getattr(v, "local_shards", None)) and not torch.is_tensor(v):
        return _DTYPES.get(v.local_shards()[0].tensor.dtype), tuple(int(x) for x in v.size())
    return _DTYPES.get(v.dtype), tuple(int(x) for x in v.shape)


def _unflatten(flat, paths):
    """The nested state dict of `flat` along `paths` (_walk_state's: a key, or (i,) for an
    index into a list); a name without a path is a top-level key."""
    out = {}
    for name, v in flat.items():
        path = paths.get(name, (name,))
        d = out
        for k in path[:-1]:
            d = d.setdefault(k, {})
        d[path[-1]] = v
    return _lists(out)


def _lists(d):
    """The dicts _unflatten made for lists (keyed by (i,)) as lists again."""
    if not isinstance(d, dict):
        return d
    d = {k: _lists(v) for k, v in d.items()}
    if d and all(isinstance(k, tuple) and len(k) == 1 for k in d):
        return [d[k] for k in sorted(d)]
    return d


def _list_names(names, limit=12):
    names = sorted(names)
    more = f" and {len(names) - limit} more" if len(names) > limit else ""
    return ", ".join(f"'{n}'" for n in names[:limit]) + more


class StateCheckpointer:
    """cairn for any DCP-style state dict: nested dicts and lists of tensors, DTensors (any
    placement), FlatRanges, ShardedTensors and plain data, and Stateful objects (a model, an
    optimizer, an LR scheduler, a GradScaler, a data loader: anything with state_dict() and
    load_state_dict()) at any depth, their state taken with state_dict() and given back
    with load_state_dict(). Entries are named as torch.distributed.checkpoint flattens
    them ("model.layers.0.weight", "optim.state.layers.0.weight.exp_avg").

        ck = cairn.torch.StateCheckpointer()
        state = {"model": model, "optim": optimizer, "sched": scheduler, "loader": loader,
                 "progress": {"step": step}}
        ck.load(state)                      # collective: the newest version, in place
        for step in ...:
            ...; optimizer.step()            # fences first (a hook on every optimizer met)
            ck.save(step, state)             # queued; copied while the next forward runs

    Tensors are read in place, lazily, until the fence (fence(), or the hook cairn puts on
    every torch.optim.Optimizer it meets in a state dict): a tensor that may change before
    the fence is copied when save() is called instead: the buffers of every nn.Module met
    (BatchNorm's statistics, counters a forward pass updates), every tensor of at most
    `copy_below` bytes (default 64 KiB: step counters and scalars), and what `copy_now`
    names (nn.Modules: their buffers; tensors; names, with fnmatch patterns). Non-tensor
    entries are saved per rank, as data (allow_pickle: see the module's text), and each
    rank gets its own back; a rank the saved job did not have gets rank 0's.

    `options`: a cairn.Options (default: cairn.Options.from_environment()); keyword
    `settings` override its fields (job_id="run7", full_policy="wait", ...)."""

    def __init__(self, options=None, *, allow_pickle=False, copy_now=(), copy_below=64 << 10,
                 **settings):
        opts = options if options is not None else _cairn.Options.from_environment()
        for k, v in settings.items():
            if not hasattr(opts, k):
                raise _error(f"cairn.Options has no setting '{k}'")
            setattr(opts, k, v)
        self.allow_pickle = bool(allow_pickle)
        self.copy_below = int(copy_below)
        self._copy_modules, self._copy_tensors, self._copy_names = [], set(), []
        for c in (copy_now if isinstance(copy_now, (list, tuple, set)) else [copy_now]):
            if isinstance(c, torch.nn.Module):
                self._copy_modules.append(c)
            elif torch.is_tensor(c):
                self._copy_tensors.add((c.data_ptr(), tuple(c.shape)))
            elif isinstance(c, str):
                self._copy_names.append(c)
            else:
                raise _error(f"copy_now: a {type(c).__name__} is neither an nn.Module, a "
                             "tensor nor a name")
        self.last_report = None  # the cairn.RestoreReport of the last load
        self.last_step = None  # the step of the last save or load
        self._rank = opts.rank
        # name -> (value, _address(value), (dtype, global shape), its staging copy or None,
        # its shards) of the last save; the ShardList of that save, its tensors' names, and
        # its sequence number (whose copies must be done before a staging copy is reused).
        self._state_cache = {}
        self._state_list = None
        self._last_names = None
        self._last_seq = None
        self._layout_blobs = (None, None)  # (key, {blob: bytes}) of the last save's layout
        self._lazy_on_gpu = False  # whether the last save's shards are on a GPU
        self._hooked = weakref.WeakSet()  # optimizers whose step() fences first
        self._hooks = []
        self._lock = threading.RLock()  # save / fence / restore / close
        self._open_core(opts)

    def _open_core(self, opts):
        self._opts = opts
        self._ck = _cairn.Checkpointer(opts)
        self._waits = _Waits(self._ck)

    # -- the training loop -----------------------------------------------------------------

    def save(self, step, state_dict):
        """Queues version `step` (steps must increase) of `state_dict`; returns a SaveHandle
        (falsy when skipped). Raises, saving nothing, for an entry that cannot be saved (a
        tensor that is not contiguous, a dtype cairn has no name for, a non-tensor entry that
        is not plain data unless allow_pickle), and under CAIRN_FULL_POLICY=raise when no
        slot is free."""
        with self._lock:
            shards, blobs, stream = self._capture_of(state_dict)
            return self._queue(step, shards, blobs, stream)

    def _queue(self, step, shards, blobs, stream):
        outcome = self._ck.save(int(step), shards, blobs, stream=stream)
        self.last_step = int(step)
        if outcome == "queued":
            self._last_seq = self._ck.queued
            return SaveHandle(self, step, self._ck.queued)
        return SaveHandle(self, step, None, "no free host slot (CAIRN_FULL_POLICY="
                          f"{self._opts.full_policy}; stats().skipped counts them)")

    def fence(self):
        """Orders what writes the saved tensors next after their copy: host tensors are
        copied when it returns; for CUDA tensors the current stream waits on the GPU."""
        with self._lock:
            self._ck.fence(stream=self._current_stream())

    def fence_host(self):
        """Blocks until every byte of the saved versions is in host memory."""
        with self._lock:
            self._ck.fence(host=True)

    def fence_before(self, optimizer):
        """Makes `optimizer`.step() call fence() first (save() does this for every optimizer
        it meets in a state dict)."""
        if optimizer in self._hooked:
            return
        me = weakref.ref(self)

        def fence(*_args, **_kwargs):
            c = me()
            if c is not None and not c.closed:
                c.fence()

        self._hooks.append(optimizer.register_step_pre_hook(fence))
        self._hooked.add(optimizer)

    # -- loads ----------------------------------------------------------------------------

    def load(self, state_dict, step=None, *, allow_partial_load=False):
        """Collective: fills `state_dict` in place from the newest version every rank can
        restore (or `step`), from this rank's memory, another node's (a replica, or rebuilt
        from parity) or the PFS, resharded when the layout or world size changed. Tensors
        are filled in place, non-tensor entries replaced, Stateful objects given their state
        with load_state_dict(); an optimizer without state gets it made first. The saved
        version may hold more than `state_dict` asks for (a model-only load); an entry it
        lacks is an error listing every one (allow_partial_load=True: they are left as
        they are). Returns the cairn.RestoreReport (also self.last_report; its step is
        self.last_step), or None when no version exists anywhere. Everything is checked
        before anything is changed."""
        with self._lock:
            head = self._head(step)
            if head is None:
                return None
            saved = self._saved_of(head)
            created = []  # optimizers whose state was made here

            def resolve(name, obj):
                if isinstance(obj, torch.optim.Optimizer) and not obj.state and any(
                        n.startswith(f"{name}.state.") for n in saved.tensors or ()):
                    _init_optimizer_state(obj)
                    created.append(obj)
                return obj.state_dict()

            try:
                report = self._load_into(state_dict, head, saved, resolve, allow_partial_load)
            except BaseException:
                for opt in created:
                    opt.state.clear()  # as it was
                raise
            return report

    def _load_into(self, state_dict, head, saved, resolve, allow_partial_load):
        flat, _, refs, statefuls = _walk_state(state_dict, resolve)
        missing, wrong, targets, copies, puts = [], [], [], [], []
        for name, v in flat.items():
            if _is_entry_tensor(v):
                if saved.tensors is not None:
                    got = saved.tensors.get(name)
                    if got is None:
                        missing.append(name)
                        continue
                    want = _global_meta(v)
                    if (want[0], tuple(want[1])) != (got[0], tuple(got[1])):
                        wrong.append(f"'{name}' was saved as {got[0]} {list(got[1])}, the "
                                     f"target is {want[0]} {list(want[1])}")
                        continue
                targets += _shards_of(name, v, copies)
            elif name in saved.plain:
                puts.append((name, saved.plain[name]))
            else:
                missing.append(name)
        where = f"step {head.step}"
        if wrong:
            raise _error(f"cairn.torch: the state dict does not match {where}: "
                         + "; ".join(wrong))
        if missing and not allow_partial_load:
            raise _error(f"cairn.torch: {where} holds no entry for {_list_names(missing)} "
                         f"({len(missing)} of the state dict's {len(flat)}); it holds "
                         f"{_list_names(set(saved.tensors or ()) | set(saved.plain))}. "
                         "Load with allow_partial_load=True to leave those as they are")
        report = self._ck.restore(targets, step=head.step, partial=True,
                                  stream=_stream_of(targets))
        with torch.no_grad():
            for tmp, view in copies:
                view.copy_(tmp)
        for name, value in puts:
            container, key = refs[name]
            if container is not None:
                container[key] = value
        for obj, sd in statefuls:  # innermost first
            obj.load_state_dict(sd)
        self.last_report = report
        self.last_step = report.step
        return report

    def load_new(self, step=None, keys=None):
        """Collective: (step, a new nested state dict) of the newest version every rank can
        restore (or `step`) as this rank saved it: every tensor whole, on the CPU (a DTensor
        or a flat range as its global tensor), and this rank's non-tensor entries. `keys`:
        only the entries under these top-level keys (or flattened names). (None, None) when
        no version exists anywhere."""
        with self._lock:
            head = self._head(step)
            if head is None:
                return None, None
            saved = self._saved_of(head)
            if saved.tensors is None:
                raise _error(f"cairn.torch: step {head.step} has no list of its tensors (it "
                             "was saved before cairn recorded one): load it into a state dict")
            wanted = None if keys is None else ([keys] if isinstance(keys, str) else list(keys))

            def asked(name):
                return wanted is None or any(name == k or name.startswith(f"{k}.")
                                             for k in map(str, wanted))

            flat, targets = {}, []
            for name, (dtype, shape) in saved.tensors.items():
                if asked(name):
                    t = flat[name] = torch.empty(tuple(shape), dtype=_dtype_from_name(dtype))
                    targets += _tensor_shards(name, t)
            flat.update({k: v for k, v in saved.plain.items() if asked(k)})
            report = self._ck.restore(targets, step=head.step, partial=True)
            self.last_report = report
            self.last_step = report.step
            return report.step, _unflatten(flat, saved.paths)

    # -- the rest of the API --------------------------------------------------------------

    def flush(self):
        """Collective: persists the newest version every rank holds; returns its step."""
        with self._lock:
            return self._ck.flush()

    def wait_captured(self):
        """Waits until every queued version is captured (or failed: raises the first error
        since the last call)."""
        self._ck.wait_captured()

    def wait_replicated(self, timeout_s=60.0):
        """Waits until the newest captured version is held by its replica holders (or its
        parity is complete); raises when that does not happen in timeout_s."""
        self._ck.wait_replicated(timeout_s)

    def wait_for_slot(self, timeout_s=60.0):
        """Waits until the next save() finds a free host slot: call it before a save that
        must not be skipped, such as a run's last (raises when none frees in timeout_s)."""
        self._ck.wait_for_slot(timeout_s)

    def barrier(self):
        self._ck.barrier()

    def stats(self):
        return self._ck.stats()

    def versions(self):
        return self._ck.versions()

    @property
    def options(self):
        return self._opts

    @property
    def closed(self):
        return self._ck.closed

    def close(self):
        """Waits for captures in flight, settles every SaveHandle's futures, and stops (the
        host tier's files stay)."""
        with self._lock:
            for h in self._hooks:
                h.remove()
            self._hooks = []
            if not self._ck.closed:
                self._waits.close()
                self._ck.close()

    def __enter__(self):
        return self

    def __exit__(self, *exc):
        self.close()

    # -- internals ------------------------------------------------------------------------

    def _head(self, step):
        """The agreed version's blobs (restore of no targets), or None when there is none."""
        try:
            return self._ck.restore([], step=step, partial=True)
        except _cairn.Error as e:
            if e.code == "NotFound" and step is None:
                return None
            raise

    def _saved_of(self, head):
        """What a version says of itself: its tensors, paths and this rank's plain entries."""
        blobs = head.blobs

        def read(name, what, allow_pickle=False):
            return (_decode(blobs[name], what, head.step, allow_pickle) if name in blobs
                    else None)

        plain = read(_STATE_BLOB, "state dict's non-tensor entries", self.allow_pickle) or {}
        return types.SimpleNamespace(
            step=head.step, plain=plain, tensors=read(_TENSORS_BLOB, "list of tensors"),
            paths=read(_PATHS_BLOB, "state dict's layout") or {})

    def _eager(self, name, local):
        """Whether this tensor (a DTensor's local part) is copied when save() is called."""
        if local.numel() * local.element_size() <= self.copy_below:
            return True
        addr = (local.data_ptr(), tuple(local.shape))
        if addr in self._buffers_now or addr in self._copy_tensors:
            return True
        return any(fnmatch.fnmatchcase(name, p) for p in self._copy_names)

    def _capture_of(self, state_dict):
        """(shards, blobs, stream) of one save: lazy shards of the tensors read in place,
        and shards of copies of the eager ones (taken now, into staging tensors kept for
        the next save); the blobs: the plain entries, the tensor list and the layout; the
        current CUDA stream when a tensor is on a GPU (0 otherwise). While the state holds
        the last save's tensors at their addresses, the last save's shards (a ShardList)
        and layout blobs are reused, and the eager copies are one foreach copy."""
        self._buffers_now = {(b.data_ptr(), tuple(b.shape))
                             for m in self._copy_modules for b in m.buffers()}

        def resolve(name, obj):
            if isinstance(obj, torch.nn.Module):
                for b in obj.buffers():
                    self._buffers_now.add((b.data_ptr(), tuple(b.shape)))
            elif isinstance(obj, torch.optim.Optimizer):
                self.fence_before(obj)
            return obj.state_dict()

        flat, paths, _, _ = _walk_state(state_dict, resolve)
        dtensor = _dtensor_class()
        cache, kept = self._state_cache, {}
        # The staging tensors of the last save may be reused once its bytes are copied.
        last_seq = self._last_seq
        reuse_staging = last_seq is None or self._ck.wait_save(last_seq, False, 0)
        names, plain, layout, shards = [], {}, [], []
        srcs, dsts = [], []  # eager copies into kept staging tensors
        same = True  # every entry as in the last save
        tensors = _SavePlan._PLAIN
        for name, v in flat.items():
            kind = type(v)
            if kind not in tensors and not _is_entry_tensor(v):  # scalars checked first
                plain[name] = v
                continue
            names.append(name)
            plain_tensor = kind in tensors or (dtensor is not None and isinstance(v, dtensor))
            # A tensor at the last save's address, of its dtype, is the same memory (the
            # last save's shards keep that storage alive): get_state_dict gives new views of
            # the same parameters at every call.
            addr = _address(v) if plain_tensor else None
            if addr is not None:
                addr = addr + (v.dtype,)
            hit = cache.get(name)
            if addr is not None and hit is not None and hit[1] == addr and (
                    hit[3] is None or reuse_staging):
                _, _, meta, staging, got = hit
                if staging is not None:
                    srcs.append(_local_of(v))
                    dsts.append(_local_of(staging))
                kept[name] = hit
            else:
                same = False
                meta = _global_meta(v)
                staging = None
                if plain_tensor and self._eager(name, _local_of(v)):
                    staging = _detached_copy(v)
                    got = _shards_of(name, staging)
                else:
                    got = _shards_of(name, v)
                if addr is not None:
                    kept[name] = (v, addr, meta, staging, got)
            layout.append((name,) + meta)
            shards += got
        if srcs:
            with torch.no_grad():
                torch._foreach_copy_(dsts, srcs)
        self._state_cache = kept
        same = same and names == self._last_names
        if same and self._state_list is not None:
            shard_list = self._state_list
        else:
            shard_list = _cairn.ShardList(shards)
            self._state_list = shard_list if len(kept) == len(names) else None
            self._last_names = names
            self._lazy_on_gpu = _stream_of(shards) != 0
        stream = torch.cuda.current_stream().cuda_stream if self._lazy_on_gpu else 0
        try:
            encoded = _encode(plain, "the state dict's non-tensor entries", self.allow_pickle)
        except _cairn.Error:
            for name, v in plain.items():  # the error names the entry
                _encode(v, f"entry '{name}'", self.allow_pickle)
            raise
        blobs = {_STATE_BLOB: encoded}
        layout_key = (tuple(layout), tuple(plain))
        if self._layout_blobs[0] != layout_key:
            self._layout_blobs = (layout_key, {
                _TENSORS_BLOB: _encode({n: (d, list(s)) for n, d, s in layout}, "tensor list"),
                _PATHS_BLOB: _encode(paths, "the state dict's layout", self.allow_pickle),
            })
        blobs.update(self._layout_blobs[1])
        return shard_list, blobs, stream

    @staticmethod
    def _current_stream():
        """The current CUDA stream where CUDA is in use, else 0 (the default one is named
        too: a save made on another stream must still order the stream that fences)."""
        if torch.cuda.is_available() and torch.cuda.is_initialized():
            return torch.cuda.current_stream().cuda_stream
        return 0


def _stream_of(shards):
    """The current CUDA stream when one of `shards` is in device memory, else 0."""
    for s in shards:
        if s.device:
            return torch.cuda.current_stream().cuda_stream
    return 0


def _local_of(v):
    """A DTensor's local part; any other tensor itself."""
    cls = _dtensor_class()
    return v._local_tensor if cls is not None and isinstance(v, cls) else v


def _detached_copy(v):
    """A copy of a tensor entry taken now (a DTensor: its local part copied and wrapped)."""
    cls = _dtensor_class()
    with torch.no_grad():
        if cls is not None and isinstance(v, cls):
            local = v._local_tensor.detach().clone()
            return cls.from_local(local, v.device_mesh, v.placements, run_check=False,
                                  shape=v.shape, stride=v.stride())
        return v.detach().clone()


class Checkpointer(StateCheckpointer):
    """cairn for a model and its optimizer: a StateCheckpointer whose state is the model's
    and the optimizer's (as get_state_dict gives them), the RNG states and a user dict,
    saved with the shortest path there is (save() looks at each tensor, and walks the state
    only when it changed).

    `options`: a cairn.Options (default: cairn.Options.from_environment()); keyword
    `settings` override its fields (job_id="run7", persist_every=0, ...). `tensors`: more
    state to save by name (a tensor, FlatRange or ShardedTensor, or a list of parts of one
    tensor).
    """

    def __init__(self, model, optimizer=None, *, options=None, tensors=None, allow_pickle=False,
                 **settings):
        self.model = model
        self.optimizer = optimizer
        self.tensors = dict(tensors or {})
        self.extra = None  # the user dict of the last restore
        self._fqn = None  # id(parameter) -> name, once asked for
        self._buffers = None  # the model's buffers' flattened names
        self._shard_cache = {}  # name -> (tensor, _address(tensor), its shards) of the last save
        self._plan = None  # a _SavePlan: the last save's walk, while the state is unchanged
        self._optim_layout = None  # the encoded _OPTIM_LAYOUT_BLOB of the last walk
        self._tensors_blob = None  # the encoded _TENSORS_BLOB of the last walk
        # (layout blob, state tensors, cairn.Prefault): see _prepare_optimizer_state.
        self._prepared = None
        super().__init__(options, allow_pickle=allow_pickle, **settings)
        if optimizer is not None:
            self.fence_before(optimizer)

    def _open_core(self, opts):
        if self.optimizer is not None and not self.optimizer.state:
            self._prepared = self._prepare_optimizer_state(opts)
        try:
            super()._open_core(opts)  # joins the job: the prefault runs meanwhile
        except BaseException:
            self._drop_prepared()
            raise

    # -- the training loop -----------------------------------------------------------

    def save(self, step, extra=None):
        """Queues version `step` (steps must increase). Returns a SaveHandle: truthy when
        queued, falsy when skipped for want of a free host slot (CAIRN_SLOTS,
        CAIRN_FULL_POLICY), with futures for the version's captured, replicated and
        persisted states. `extra`: a dict of plain data saved with it (returned by
        restore() as self.extra)."""
        self._drop_prepared()  # training: no restore comes now
        got = self._unchanged_state()
        shards, plain = got if got is not None else self._flat_state(snapshot_buffers=True)
        blobs = self._rng_blobs()
        blobs[_STATE_BLOB] = _encode(plain, "the state dict's non-tensor entries",
                                     self.allow_pickle)
        if extra is not None:
            blobs[_USER_BLOB] = _encode(extra, "extra", self.allow_pickle)
        if self.optimizer is not None and not self.optimizer.state:
            blobs[_NO_OPTIM_STATE_BLOB] = b""
        elif self._optim_layout is not None:
            blobs[_OPTIM_LAYOUT_BLOB] = self._optim_layout
        if self._tensors_blob is not None:
            blobs[_TENSORS_BLOB] = self._tensors_blob
        return self._queue(step, shards, blobs, self._stream())

    def fence(self):
        """Orders what comes next after the copy of the saved versions (the optimizer hook
        calls it before every step): host tensors are copied when it returns; for CUDA
        tensors the current stream waits on the GPU and the host does not. The current
        stream is always named, the default one (0) included: a save() made on another
        stream must still order the stream the optimizer runs on."""
        self._ck.fence(stream=self._stream())

    def fence_host(self):
        """Blocks until every byte of the saved versions is in host memory."""
        self._ck.fence(host=True)

    def restore(self, step=None):
        """Collective: loads the newest version every rank can restore (or `step`) into the
        model, the optimizer (creating its state if it has none yet, or dropping it for a
        version saved before the optimizer's first step) and the RNGs (a rank the saved
        job did not have takes the optimizer's hyperparameters and the extra dict from rank
        0 and keeps its own RNGs). Returns its step, or None when no version exists anywhere. The user dict saved with it is
        in self.extra, the cairn.RestoreReport in self.last_report."""
        try:
            return self._restore(step)
        finally:
            self._drop_prepared()

    def _restore(self, step):
        try:
            head = self._ck.restore([], step=step, partial=True)
        except _cairn.Error as e:
            if e.code == "NotFound" and step is None:
                return None
            raise
        plain = (_decode(head.blobs[_STATE_BLOB], "state dict's non-tensor entries", head.step,
                         self.allow_pickle) if _STATE_BLOB in head.blobs else {})
        # Every blob is read before anything is changed: a refused one leaves all as it was.
        # A rank the saved job did not have (it grew) gets rank 0's state dict entries and
        # extra, but keeps its own RNGs: rank 0's would repeat its random numbers here.
        own = head.blobs_rank == self._rank
        rng = self._decode_rng(head.blobs, head.step) if own else {}
        extra = (_decode(head.blobs[_USER_BLOB], "extra", head.step, self.allow_pickle)
                 if _USER_BLOB in head.blobs else None)
        layout = (_decode(head.blobs[_OPTIM_LAYOUT_BLOB], "optimizer state layout", head.step)
                  if _OPTIM_LAYOUT_BLOB in head.blobs else None)
        created = False  # optimizer state made here, taken back if the restore fails
        if self.optimizer is not None and _NO_OPTIM_STATE_BLOB in head.blobs:
            self.optimizer.state.clear()  # as it was: a fresh optimizer's
        elif self.optimizer is not None and any(k.startswith("optim.") for k in plain):
            if not self.optimizer.state and layout is not None:
                state = self._take_prepared(head.blobs[_OPTIM_LAYOUT_BLOB])
                if state is None:
                    state = _optimizer_state_tensors(layout, self._params_by_name())
                if state is not None:
                    self.optimizer.state.update(state)
                    created = True
            if not created:
                _init_optimizer_state(self.optimizer)  # its tensors are restored in place
        copies = []  # (contiguous target, the strided DTensor part it belongs in)
        targets, _ = self._flat_state(snapshot_buffers=False, copies=copies)
        try:
            report = self._ck.restore(targets, step=head.step, stream=self._stream())
        except BaseException:
            if created:
                self.optimizer.state.clear()  # uninitialised memory is not left behind
            raise
        with torch.no_grad():
            for tmp, view in copies:
                view.copy_(tmp)
        self._set_plain(plain)
        self._set_rng(rng)
        self.extra = extra
        self.last_report = report
        self.last_step = report.step
        return report.step

    def close(self):
        """Waits for captures in flight, settles the SaveHandles' futures and stops (the
        host tier's files stay)."""
        self._drop_prepared()
        super().close()

    # -- internals ---------------------------------------------------------------------

    def _prepare_optimizer_state(self, opts):
        """A restarted process restores next, and a fresh optimizer's state is most of what
        its memory restore costs: the kernel zeroes each fresh 4 KiB page at its first
        touch (34 ms of a 51 ms restore of 70 MB of AdamW state, docs/performance.md).
        When this rank's host tier holds a version with the optimizer's state layout, the
        state is made now and its pages are faulted in on a thread while the Checkpointer's
        open waits for the other ranks; restore() takes it when the version it restores has
        the same layout. The first save(), a restore of another layout, or close() drops
        it. A preparation only: what it cannot read, the restore reads and reports."""
        try:
            got = _cairn.newest_held_blob(opts, _OPTIM_LAYOUT_BLOB)
            if got is None:
                return None
            step, blob = got
            layout = _decode(blob, "optimizer state layout", step)
            state = _optimizer_state_tensors(layout, self._params_by_name())
        except (_cairn.Error, ValueError, TypeError, KeyError):
            return None
        if state is None:
            return None
        return blob, state, _cairn.Prefault(_host_parts(state), opts)

    def _take_prepared(self, blob):
        """The prepared optimizer state when it was made from layout `blob` (its pages
        faulted in, as far as it got), else None; it is no longer held either way."""
        got, self._prepared = self._prepared, None
        if got is None:
            return None
        made_from, state, prefault = got
        prefault.stop()  # what it has not faulted in yet, the restore's copy does
        return state if bytes(made_from) == bytes(blob) else None

    def _drop_prepared(self):
        if self._prepared is not None:
            self._prepared[2].stop()
            self._prepared = None

    def _stream(self):
        """The current CUDA stream (as an int) of the device the model is on; 0 for a
        model on the CPU."""
        p = next(self.model.parameters(), None)
        if p is None or not p.is_cuda:
            return 0
        return torch.cuda.current_stream(p.device).cuda_stream

    def state_dict(self):
        """The state as torch.distributed.checkpoint's get_state_dict gives it, nested:
        {"model": model.state_dict(), "optim": {"state": {fqn: {...}}, "param_groups":
        [{..., "params": [fqn, ...]}]}, "tensors": the extra tensors}. cairn saves it
        flattened, under DCP's names ("model.<fqn>", "optim.state.<fqn>.exp_avg", ...)."""
        return self._state_dict(keep_vars=False)

    def _state_dict(self, keep_vars):
        """state_dict(); keep_vars=True: the parameters themselves rather than detached
        copies of them (a DTensor's detach() costs tens of microseconds, and a fresh
        object each time would defeat the shard reuse of save())."""
        state = {"model": self.model.state_dict(keep_vars=keep_vars)}
        if self.optimizer is not None:
            fqn = self._param_names()
            state["optim"] = {
                "state": {fqn[id(p)]: st for p, st in self.optimizer.state.items()},
                "param_groups": self._param_groups(),
            }
        if self.tensors:
            state["tensors"] = dict(self.tensors)
        return state

    def _param_groups(self):
        """The optimizer's param_groups as get_state_dict gives them (parameters by name)."""
        fqn = self._param_names()
        groups = []
        for g in self.optimizer.param_groups:
            d = {k: v for k, v in g.items() if k != "params"}
            d["params"] = [fqn[id(p)] for p in g["params"]]
            groups.append(d)
        return groups

    def _params_by_name(self):
        return {self._param_names()[id(p)]: p
                for g in self.optimizer.param_groups for p in g["params"]}

    def _param_names(self):
        """id(parameter) -> its fully qualified name in the model (computed once)."""
        if self._fqn is None:
            self._fqn = {id(p): n for n, p in self.model.named_parameters()}
            for g in self.optimizer.param_groups:
                for p in g["params"]:
                    if id(p) not in self._fqn:
                        raise _error("the optimizer holds a parameter that is not the model's "
                                     f"(shape {tuple(p.shape)}); cairn names its state by the "
                                     "parameter's name in the model")
        return self._fqn

    def _flat_state(self, snapshot_buffers, copies=None):
        """(cairn shards of the flattened state's tensors, {name: value} of the rest).
        For a save (snapshot_buffers), the shards of a tensor still at the same address as
        in the last save are reused (saving every iteration pays for the walk once)."""
        if self._buffers is None:
            self._buffers = {"model." + n for n, _ in self.model.named_buffers()}
        reuse = self._shard_cache if snapshot_buffers else {}
        kept = {}
        shards, plain = [], {}
        state = self._state_dict(keep_vars=True)
        plan = _SavePlan() if snapshot_buffers else None
        for k, v in _flatten(state).items():
            if snapshot_buffers and k in self._buffers and torch.is_tensor(v):
                plan.buffers.append((k, v))
                shards += _shards_of(k, v.detach().clone())  # forward passes may update them
            elif torch.is_tensor(v):
                key = _address(v)
                hit = reuse.get(k)
                if hit is not None and hit[0] is v and hit[1] == key:
                    got = hit[2]
                    kept[k] = hit
                else:
                    got = _shards_of(k, v, copies)
                    if key is not None and snapshot_buffers:
                        kept[k] = (v, key, got)
                if plan is not None:
                    plan.add_tensor(k, v, key, got)
                shards += got
            elif _is_saved_tensor(v) or (isinstance(v, (list, tuple)) and v
                                         and all(_is_saved_tensor(x) for x in v)):
                if plan is not None:
                    plan.usable = False  # walked every time
                shards += _shards_of(k, v, copies)
            else:
                plain[k] = v
        if snapshot_buffers:
            self._tensors_blob = _encode({s.name: (s.dtype, list(s.shape)) for s in shards},
                                         "tensor list")
            self._shard_cache = kept  # what is no longer in the state is dropped
            self._plan = plan.finish(self, state, plain)
            self._optim_layout = None
            if self.optimizer is not None and self.optimizer.state:
                layout = _optimizer_layout(self.optimizer, self._param_names())
                if layout is not None:
                    self._optim_layout = _encode(layout, "optimizer state layout")
        return shards, plain

    def _unchanged_state(self):
        """(shards, plain) as _flat_state(snapshot_buffers=True) gives them, without
        walking the state, when it holds the last save's tensors at their addresses (the
        same objects under the same names, same data_ptr, shape, dtype, contiguous); None
        otherwise. Saving every iteration then costs the model's state_dict() and one
        look at each tensor, not a walk of the nested state."""
        plan = self._plan
        if plan is None:
            return None
        sd = self.model.state_dict(keep_vars=True)
        if list(sd) != plan.model_keys or not all(map(operator.is_, sd.values(), plan.model_values)):
            return None
        if self.optimizer is not None:
            held = self.optimizer.state
            if len(held) != len(plan.optim):
                return None
            for (p, st), (p0, keys, values) in zip(held.items(), plan.optim):
                if p is not p0 or list(st) != keys or not all(map(operator.is_, st.values(), values)):
                    return None
        elif plan.optim is not None:
            return None
        if [_memory_key(t) for t in plan.memory] != plan.memory_keys:
            return None
        if not all(d._local_tensor is t for d, t in plan.dtensors):
            return None
        plain = {}
        if self.optimizer is not None:
            _walk("optim.param_groups", self._param_groups(), plain)
            for v in plain.values():
                if _is_saved_tensor(v) or (isinstance(v, (list, tuple)) and v
                                           and any(_is_saved_tensor(x) for x in v)):
                    return None  # a tensor hyperparameter: walked as a shard
        shards = plan.shards
        if plan.buffers:
            shards = shards + [s for k, v in plan.buffers for s in _shards_of(k, v.detach().clone())]
        return shards, plain

    def _set_plain(self, plain):
        """Puts the saved non-tensor entries back: the optimizer's hyperparameters and any
        non-tensor state (tensors were restored in place)."""
        if self.optimizer is None:
            return
        prefix = "optim.param_groups."
        saved = {}
        for k, v in plain.items():
            if k.startswith(prefix):
                i, _, key = k[len(prefix):].partition(".")
                saved.setdefault(int(i), {})[key] = v
        if saved and max(saved) + 1 != len(self.optimizer.param_groups):
            raise _error(f"the checkpoint's optimizer has {max(saved) + 1} parameter groups, "
                         f"this one {len(self.optimizer.param_groups)}")
        for i, group in saved.items():
            self.optimizer.param_groups[i].update(
                {k: v for k, v in group.items() if k != "params"})
        by_name = self._params_by_name()
        for k, v in plain.items():
            if k.startswith("optim.state."):
                name, _, key = k[len("optim.state."):].rpartition(".")
                if name in by_name:
                    self.optimizer.state[by_name[name]][key] = v

    @staticmethod
    def _rng_blobs():
        b = {
            "rng.torch": torch.get_rng_state().numpy().tobytes(),
            "rng.python": _encode(random.getstate(), "Python's RNG state"),
        }
        if _np is not None:
            # its 624-word key as bytes: pickling the array costs 5 times more
            name, key, pos, has_gauss, gauss = _np.random.get_state()
            b["rng.numpy"] = _encode((name, key.tobytes(), pos, has_gauss, gauss),
                                     "numpy's RNG state")
        if torch.cuda.is_available():
            b["rng.cuda"] = _encode([s.cpu() for s in torch.cuda.get_rng_state_all()],
                                    "the CUDA RNG states")
        return b

    def _decode_rng(self, blobs, step):
        """The RNG states in `blobs`, read (as data) and not yet set."""
        out = {}
        if "rng.torch" in blobs:
            out["torch"] = torch.frombuffer(bytearray(blobs["rng.torch"]), dtype=torch.uint8)
        for key, what in (("python", "Python's RNG state"), ("numpy", "numpy's RNG state"),
                          ("cuda", "CUDA RNG states")):
            if "rng." + key in blobs:
                out[key] = _decode(blobs["rng." + key], what, step, self.allow_pickle)
        return out

    @staticmethod
    def _set_rng(rng):
        if "torch" in rng:
            torch.set_rng_state(rng["torch"])
        if "python" in rng:
            random.setstate(rng["python"])
        if _np is not None and "numpy" in rng:
            state = rng["numpy"]
            if isinstance(state[1], bytes):
                state = (state[0], _np.frombuffer(state[1], dtype=_np.uint32), *state[2:])
            _np.random.set_state(state)
        if "cuda" in rng and torch.cuda.is_available():
            torch.cuda.set_rng_state_all(rng["cuda"])
