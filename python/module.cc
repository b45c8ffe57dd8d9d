// The `cairn._cairn` extension module: Checkpointer, Options, Stats, RestoreReport and
// Shard over the C++ core (pybind11). Tensor memory is never copied here: a Shard carries
// the address of its bytes (a torch tensor's data_ptr(), or any buffer-protocol object)
// and the object that owns them, which the Checkpointer keeps alive until the fence that
// ends cairn's reads. Every call that waits or copies releases the GIL.
#include <pybind11/pybind11.h>
#include <pybind11/stl.h>

#include <deque>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <utility>
#include <variant>
#include <vector>

#include "cairn/checkpointer.h"
#include "cairn/pfs_step.h"
#include "cairn/prepare.h"

namespace py = pybind11;

namespace cairn {
namespace {

// Raised for every error cairn returns; `code` names the kind ("InvalidArgument",
// "NotFound", "Corruption", "Unavailable", ...).
PyObject* g_error = nullptr;

[[noreturn]] void Throw(const Status& st) {
  py::object err = py::reinterpret_borrow<py::object>(g_error);
  py::object e = err(st.ToString());
  e.attr("code") = std::string(StatusCodeName(st.code()));
  PyErr_SetObject(g_error, e.ptr());
  throw py::error_already_set();
}

template <typename T>
T Unwrap(Result<T> r) {
  if (!r.ok()) Throw(r.status());
  return std::move(*r);
}

// Runs `fn` with the GIL released (every call that waits or copies goes through here).
template <typename Fn>
auto WithoutGil(Fn&& fn) {
  py::gil_scoped_release nogil;
  return fn();
}

// A shard as Python sees it: what to save or fill, and who owns the bytes.
struct PyShard {
  ShardSpec spec;
  py::object owner;  // kept alive while cairn may read or write the bytes
};

DType DTypeOrThrow(const std::string& name) {
  auto d = ParseDType(name);
  if (!d) Throw(Status::InvalidArgument("unknown dtype '" + name + "'"));
  return *d;
}

PyShard MakeShard(std::string name, const std::string& dtype, Shape shape, uintptr_t data_ptr,
                  std::optional<std::vector<int64_t>> offsets,
                  std::optional<std::vector<int64_t>> lengths, bool device, py::object owner) {
  PyShard s;
  s.spec.meta = {std::move(name), DTypeOrThrow(dtype), std::move(shape)};
  s.spec.box = Box::Whole(s.spec.meta.global_shape);
  if (offsets) s.spec.box.offsets = *offsets;
  if (lengths) s.spec.box.lengths = *lengths;
  s.spec.data = reinterpret_cast<void*>(data_ptr);
  s.spec.memory = device ? MemoryKind::kDevice : MemoryKind::kHost;
  s.owner = std::move(owner);
  return s;
}

// The address and size of a writable C-contiguous buffer; InvalidArgument naming the
// tensor otherwise.
std::pair<uintptr_t, uint64_t> WritableBytes(const std::string& name, const py::buffer& buf) {
  py::buffer_info info;
  try {
    info = buf.request(/*writable=*/true);
  } catch (const std::exception& e) {  // read-only, or not a buffer
    Throw(Status::InvalidArgument("buffer of '" + name + "': " + e.what()));
  }
  int64_t expect = info.itemsize;
  for (py::ssize_t i = info.ndim; i-- > 0;) {
    if (info.strides[static_cast<size_t>(i)] != expect)
      Throw(Status::InvalidArgument("buffer of '" + name + "' is not C-contiguous"));
    expect *= info.shape[static_cast<size_t>(i)];
  }
  return {reinterpret_cast<uintptr_t>(info.ptr), static_cast<uint64_t>(expect)};
}

std::vector<PyShard> FlatRangeShards(TensorMeta meta, int64_t begin, int64_t end,
                                     uintptr_t data_ptr, bool device, const py::object& owner) {
  std::vector<PyShard> out;
  for (ShardSpec& spec :
       Unwrap(ShardSpec::FromFlatRange(meta, begin, end, reinterpret_cast<void*>(data_ptr),
                                       device ? MemoryKind::kDevice : MemoryKind::kHost)))
    out.push_back({std::move(spec), owner});
  return out;
}

std::vector<ShardSpec> Specs(const std::vector<PyShard>& shards) {
  std::vector<ShardSpec> out;
  out.reserve(shards.size());
  for (const PyShard& s : shards) out.push_back(s.spec);
  return out;
}

// Shards converted once: a training loop that saves the same tensors at the same
// addresses every iteration hands the same list to every save, which then converts
// nothing per shard (cairn.torch keeps one while its state is unchanged).
struct PyShardList {
  std::vector<ShardSpec> specs;
  std::vector<py::object> owners;  // each shard's, kept alive with the list
};

void Append(PyShardList& l, const std::vector<PyShard>& shards) {
  l.specs.reserve(l.specs.size() + shards.size());
  l.owners.reserve(l.owners.size() + shards.size());
  for (const PyShard& s : shards) {
    l.specs.push_back(s.spec);
    l.owners.push_back(s.owner);
  }
}

PyShardList MakeShardList(const std::vector<PyShard>& shards) {
  PyShardList l;
  Append(l, shards);
  return l;
}

Blobs ToBlobs(const py::dict& d) {
  Blobs b;
  for (auto [k, v] : d) {
    if (!py::isinstance<py::str>(k)) Throw(Status::InvalidArgument("blob names must be str"));
    if (!py::isinstance<py::bytes>(v) && !py::isinstance<py::str>(v))
      Throw(Status::InvalidArgument("blob '" + k.cast<std::string>() + "' must be bytes or str"));
    b[k.cast<std::string>()] = v.cast<std::string>();
  }
  return b;
}

py::dict FromBlobs(const Blobs& b) {
  py::dict d;
  for (const auto& [k, v] : b) d[py::str(k)] = py::bytes(v);
  return d;
}

// The Python Checkpointer: the C++ one plus the owners of the shards being captured.
class PyCheckpointer {
 public:
  explicit PyCheckpointer(Options o) {
    c_ = Unwrap(WithoutGil([&] { return Checkpointer::Open(std::move(o)); }));
  }

  // `shards`: a list of Shard, or a ShardList (converted once, pinned as one object).
  std::string Save(int64_t step, const py::object& shards, const py::dict& blobs,
                   uintptr_t stream) {
    Checkpointer& c = Get();
    std::vector<py::object> owners;
    std::vector<ShardSpec> converted;
    std::span<const ShardSpec> specs;
    if (py::isinstance<PyShardList>(shards)) {
      specs = shards.cast<const PyShardList&>().specs;
      owners.push_back(shards);
    } else {
      std::vector<PyShard> list;
      try {
        list = shards.cast<std::vector<PyShard>>();
      } catch (const py::cast_error&) {
        Throw(
            Status::InvalidArgument("save: shards must be a list of cairn.Shard or a "
                                    "cairn.ShardList, not " +
                                    std::string(py::str(py::type::of(shards).attr("__name__")))));
      }
      PyShardList l = MakeShardList(list);
      converted = std::move(l.specs);
      specs = converted;
      owners = std::move(l.owners);
    }
    const Blobs b = ToBlobs(blobs);
    const auto cuda_stream = reinterpret_cast<CudaStream>(stream);
    const SaveOutcome out = Unwrap(WithoutGil([&] { return c.save(step, specs, b, cuda_stream); }));
    if (out == SaveOutcome::kQueued) {
      ++queued_;
      pinned_.emplace_back(queued_, std::move(owners));
    }
    return out == SaveOutcome::kQueued ? "queued" : "skipped";
  }

  // stream None: the stream given to each save(); an int (a cudaStream_t): that stream;
  // host=True: block until every byte is copied.
  void Fence(std::optional<uintptr_t> stream, bool host) {
    Checkpointer& c = Get();
    const Status st = WithoutGil([&] {
      if (host) return c.fence_host();
      if (stream) return c.fence(reinterpret_cast<CudaStream>(*stream));
      return c.fence();
    });
    Release();
    if (!st.ok()) Throw(st);
  }

  void WaitCaptured() {
    Checkpointer& c = Get();
    const Status st = WithoutGil([&] { return c.wait_captured(); });
    pinned_.clear();
    if (!st.ok()) Throw(st);
  }

  // No step: the newest captured version, an error when not replicated in time. A step:
  // true once it (or a newer one) is replicated, false when the time ran out first.
  py::object WaitReplicated(double timeout_s, std::optional<int64_t> step) {
    Checkpointer& c = Get();
    if (step)
      return py::bool_(Unwrap(WithoutGil([&] { return c.wait_replicated(*step, timeout_s); })));
    const Status st = WithoutGil([&] { return c.wait_replicated(timeout_s); });
    if (!st.ok()) Throw(st);
    return py::none();
  }

  // The n-th queued save: its bytes copied (settled false) or it CAPTURED / failed; false
  // when the time ran out first.
  bool WaitSave(uint64_t n, bool settled, double timeout_s) {
    Checkpointer& c = Get();
    return Unwrap(WithoutGil([&] { return c.wait_save(n, settled, timeout_s); }));
  }

  // Every rank's `mine`, by rank (the job's group; one rank: [mine]).
  std::vector<py::bytes> AllGather(const std::string& mine) {
    Checkpointer& c = Get();
    std::vector<std::string> got;
    if (!c.group()) {
      got.push_back(mine);
    } else {
      got = Unwrap(WithoutGil([&] { return c.group()->AllGather(mine); }));
    }
    std::vector<py::bytes> out;
    out.reserve(got.size());
    for (const std::string& g : got) out.emplace_back(g);
    return out;
  }
  uint64_t queued() const { return queued_; }

  void WaitForSlot(double timeout_s) {
    Checkpointer& c = Get();
    const Status st = WithoutGil([&] { return c.wait_for_slot(timeout_s); });
    if (!st.ok()) Throw(st);
  }

  int64_t Flush() {
    Checkpointer& c = Get();
    auto r = WithoutGil([&] { return c.flush(); });
    pinned_.clear();  // flush waits for every capture
    return Unwrap(std::move(r));
  }

  RestoreReport Restore(const std::vector<PyShard>& targets, std::optional<int64_t> step,
                        bool partial, uintptr_t stream) {
    Checkpointer& c = Get();
    const std::vector<ShardSpec> specs = Specs(targets);
    RestoreOptions ro;
    ro.step = step;
    ro.partial = partial;
    ro.stream = reinterpret_cast<CudaStream>(stream);
    return Unwrap(WithoutGil([&] { return c.restore(specs, ro); }));
  }

  void Barrier() {
    Checkpointer& c = Get();
    if (!c.group()) return;
    const Status st = WithoutGil([&] { return c.group()->Barrier(); });
    if (!st.ok()) Throw(st);
  }

  Stats GetStats() { return Get().stats(); }
  std::vector<VersionInfo> Versions() { return Get().versions(); }
  const Options& GetOptions() { return Get().options(); }
  std::string HostDir() { return Get().host_dir(); }

  // Waits for captures in flight, then stops (the host tier's files stay).
  void Close() {
    std::unique_ptr<Checkpointer> c = std::move(c_);
    WithoutGil([&] { c.reset(); });
    pinned_.clear();
  }
  bool closed() const { return !c_; }

 private:
  Checkpointer& Get() {
    if (!c_) Throw(Status::FailedPrecondition("the Checkpointer is closed"));
    return *c_;
  }
  // Lets go of the owners of the versions whose bytes are all copied (a stream-ordered
  // fence returns before the device copies end: their tensors must stay alive until then).
  void Release() {
    const uint64_t done = Get().copies_done();
    while (!pinned_.empty() && pinned_.front().first <= done) pinned_.pop_front();
  }
  std::unique_ptr<Checkpointer> c_;
  uint64_t queued_ = 0;  // saves queued through this object (the C++ side's count too)
  std::deque<std::pair<uint64_t, std::vector<py::object>>> pinned_;
};

// Options' attributes are bound from the settings table (cairn/options.h): every setting is an
// attribute named after its field, typed as the field is (an enum as the variable's word),
// and checked on assignment exactly as the variable is.
py::object SettingGet(const Setting& s, const Options& o) {
  return std::visit([](const auto& v) { return py::cast(v); }, s.get(o));
}
void SettingSet(const Setting& s, Options& o, const py::handle& value) {
  const std::string name = std::string("cairn.Options.") + s.field;
  SettingValue v;
  try {
    switch (s.get(Options{}).index()) {  // the alternative the field holds
      case 0:
        v = value.cast<bool>();
        break;
      case 1:
        v = value.cast<int64_t>();
        break;
      case 2:
        v = value.cast<uint64_t>();
        break;
      case 3:
        v = value.cast<double>();
        break;
      default:
        v = value.cast<std::string>();
        break;
    }
  } catch (const py::cast_error&) {
    throw py::type_error(name + " cannot be set to a " +
                         py::str(py::type::of(value).attr("__name__")).cast<std::string>() + " (" +
                         s.variable + ": " + s.meaning + ")");
  }
  Status st = s.set(name.c_str(), v, o);
  if (!st.ok()) Throw(st);
}

// Options: an attribute per setting, from the settings table.
void BindOptions(py::module_& m) {
  py::class_<Options> options(m, "Options",
                              "Every setting of a Checkpointer, an attribute per CAIRN_* variable "
                              "(settings() lists them; from_environment() reads the variables).");
  options.def(py::init<>())
      .def_static(
          "from_environment", [] { return Unwrap(Options::FromEnvironment()); },
          "Options from the CAIRN_* variables and RANK, WORLD_SIZE, LOCAL_RANK, ...")
      .def("validate", [](const Options& o) {
        Status st = o.Validate();
        if (!st.ok()) Throw(st);
      });
  for (const Setting& s : Settings()) {
    options.def_property(
        s.field, [&s](const Options& o) { return SettingGet(s, o); },
        [&s](Options& o, const py::handle& v) { SettingSet(s, o, v); },
        (std::string(s.variable) + ": " + s.meaning).c_str());
  }
  m.def(
      "settings",
      [] {
        py::list out;
        for (const Setting& s : Settings())
          out.append(py::make_tuple(s.field, s.variable, s.DefaultText(), s.meaning));
        return out;
      },
      "Every setting: (attribute of Options, environment variable, default, meaning).");
}

// Shard: a tensor (or a box of one) given to save() or restore().
void BindShard(py::module_& m) {
  py::class_<PyShard>(m, "Shard",
                      "One tensor's bytes to save or fill: the tensor's name, dtype name "
                      "('float32', 'bfloat16', 'int64', ...) and global shape, the box this "
                      "memory holds (offsets and lengths; default: the whole tensor), the "
                      "address of its row-major contiguous bytes, and the object that owns "
                      "them (kept alive while cairn uses the memory).")
      .def(py::init(&MakeShard), py::arg("name"), py::arg("dtype"), py::arg("shape"),
           py::arg("data_ptr"), py::arg("offsets") = std::nullopt,
           py::arg("lengths") = std::nullopt, py::arg("device") = false,
           py::arg("owner") = py::none())
      .def_static(
          "from_buffer",
          [](std::string name, const std::string& dtype, Shape shape, py::buffer buf,
             std::optional<std::vector<int64_t>> offsets,
             std::optional<std::vector<int64_t>> lengths) {
            const auto [ptr, bytes] = WritableBytes(name, buf);
            PyShard s = MakeShard(std::move(name), dtype, std::move(shape), ptr, std::move(offsets),
                                  std::move(lengths), false, buf);
            if (s.spec.nbytes() != bytes)
              Throw(Status::InvalidArgument("buffer of '" + s.spec.meta.name + "' holds " +
                                            std::to_string(bytes) + " bytes, its box needs " +
                                            std::to_string(s.spec.nbytes())));
            return s;
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("buffer"),
          py::arg("offsets") = std::nullopt, py::arg("lengths") = std::nullopt,
          "A shard over a writable C-contiguous buffer (numpy array, bytearray, ...).")
      .def_static(
          "flat_range",
          [](std::string name, const std::string& dtype, Shape shape, int64_t begin, int64_t end,
             uintptr_t data_ptr, bool device, py::object owner) {
            return FlatRangeShards(
                TensorMeta{std::move(name), DTypeOrThrow(dtype), std::move(shape)}, begin, end,
                data_ptr, device, std::move(owner));
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("begin"), py::arg("end"),
          py::arg("data_ptr"), py::arg("device") = false, py::arg("owner") = py::none(),
          "The shards (at most 2*ndim-1 boxes) of the flat row-major element range [begin, "
          "end) of a tensor of `shape`, held contiguously at `data_ptr` (a ZeRO / FSDP flat "
          "partition); C++ ShardSpec::FromFlatRange.")
      .def_static(
          "from_flat_range",
          [](std::string name, const std::string& dtype, Shape shape, int64_t begin,
             py::buffer buf) {
            const auto [ptr, bytes] = WritableBytes(name, buf);
            TensorMeta meta{std::move(name), DTypeOrThrow(dtype), std::move(shape)};
            const size_t elem = DTypeSize(meta.dtype);
            if (bytes % elem != 0)
              Throw(Status::InvalidArgument("buffer of '" + meta.name + "' holds " +
                                            std::to_string(bytes) +
                                            " bytes, not a whole number "
                                            "of " +
                                            std::string(DTypeName(meta.dtype))));
            const int64_t end = begin + static_cast<int64_t>(bytes / elem);
            return FlatRangeShards(std::move(meta), begin, end, ptr, false, buf);
          },
          py::arg("name"), py::arg("dtype"), py::arg("shape"), py::arg("begin"), py::arg("buffer"),
          "flat_range() over a writable C-contiguous buffer holding elements [begin, begin + "
          "its element count).")
      .def_property_readonly("name", [](const PyShard& s) { return s.spec.meta.name; })
      .def_property_readonly(
          "dtype", [](const PyShard& s) { return std::string(DTypeName(s.spec.meta.dtype)); })
      .def_property_readonly("shape", [](const PyShard& s) { return s.spec.meta.global_shape; })
      .def_property_readonly("offsets", [](const PyShard& s) { return s.spec.box.offsets; })
      .def_property_readonly("lengths", [](const PyShard& s) { return s.spec.box.lengths; })
      .def_property_readonly("nbytes", [](const PyShard& s) { return s.spec.nbytes(); })
      .def_property_readonly(
          "device", [](const PyShard& s) { return s.spec.memory == MemoryKind::kDevice; },
          "Whether the bytes are in device (CUDA) memory.")
      .def("__repr__", [](const PyShard& s) {
        return "<cairn.Shard " + s.spec.meta.name + " " +
               std::string(DTypeName(s.spec.meta.dtype)) + " " + s.spec.box.ToString() + ">";
      });
}

// Stats, RestoreReport, VersionInfo: what cairn reports.
void BindReports(py::module_& m) {
  py::class_<Stats>(m, "Stats",
                    "Counters of a Checkpointer (include/cairn/stats.h; flat names here).")
      .def_property_readonly("saves", [](const Stats& s) { return s.save.saves; })
      .def_property_readonly("skipped", [](const Stats& s) { return s.save.skipped; })
      .def_property_readonly("agreed_step", [](const Stats& s) { return s.save.agreed_step; })
      .def_property_readonly("not_held_by_all",
                             [](const Stats& s) { return s.save.not_held_by_all; })
      .def_property_readonly("captured", [](const Stats& s) { return s.capture.captured; })
      .def_property_readonly("failed", [](const Stats& s) { return s.capture.failed; })
      .def_property_readonly("fences", [](const Stats& s) { return s.save.fences; })
      .def_property_readonly("fence_wait_total_s",
                             [](const Stats& s) { return s.save.fence_wait_total_s; })
      .def_property_readonly("fence_wait_max_s",
                             [](const Stats& s) { return s.save.fence_wait_max_s; })
      .def_property_readonly("save_call_total_s",
                             [](const Stats& s) { return s.save.save_call_total_s; })
      .def_property_readonly("save_call_max_s",
                             [](const Stats& s) { return s.save.save_call_max_s; })
      .def_property_readonly("bytes_copied", [](const Stats& s) { return s.capture.bytes_copied; })
      .def_property_readonly("copy_seconds", [](const Stats& s) { return s.capture.copy_seconds; })
      .def_property_readonly("copy_gbps", [](const Stats& s) { return s.capture.copy_gbps; })
      .def_property_readonly("newest_captured_step",
                             [](const Stats& s) { return s.capture.newest_captured_step; })
      .def_property_readonly("copy_engine", [](const Stats& s) { return s.capture.copy_engine; })
      .def_property_readonly("slots_pinned", [](const Stats& s) { return s.capture.slots_pinned; })
      .def_property_readonly("slots_not_pinned",
                             [](const Stats& s) { return s.capture.slots_not_pinned; })
      .def_property_readonly("replicated", [](const Stats& s) { return s.replication.replicated; })
      .def_property_readonly("replicated_blobs_only",
                             [](const Stats& s) { return s.replication.blobs_only; })
      .def_property_readonly("replicate_failed",
                             [](const Stats& s) { return s.replication.failed; })
      .def_property_readonly("replicas_passed_over",
                             [](const Stats& s) { return s.replication.passed_over; })
      .def_property_readonly("bytes_replicated", [](const Stats& s) { return s.replication.bytes; })
      .def_property_readonly("replicate_gbps", [](const Stats& s) { return s.replication.gbps; })
      .def_property_readonly("newest_replicated_step",
                             [](const Stats& s) { return s.replication.newest_replicated_step; })
      .def_property_readonly("replicas_received",
                             [](const Stats& s) { return s.replication.received; })
      .def_property_readonly("replication_staging_bytes",
                             [](const Stats& s) { return s.replication.staging_bytes; })
      .def_property_readonly("replicate_every", [](const Stats& s) { return s.replication.every; })
      .def_property_readonly("replication_behind_steps",
                             [](const Stats& s) { return s.replication.behind_steps; })
      .def_property_readonly("replicate_push_s",
                             [](const Stats& s) { return s.replication.push_s; })
      .def_property_readonly("replicate_step_s",
                             [](const Stats& s) { return s.replication.step_s; })
      .def_property_readonly("persisted", [](const Stats& s) { return s.persist.persisted; })
      .def_property_readonly("persist_failed", [](const Stats& s) { return s.persist.failed; })
      .def_property_readonly("bytes_persisted", [](const Stats& s) { return s.persist.bytes; })
      .def_property_readonly("persist_gbps", [](const Stats& s) { return s.persist.gbps; })
      .def_property_readonly("newest_persisted_step",
                             [](const Stats& s) { return s.persist.newest_persisted_step; })
      .def_property_readonly("last_persist_error",
                             [](const Stats& s) { return s.persist.last_error; });

  py::class_<RestoreReport>(m, "RestoreReport", "What a restore did (include/cairn/restore.h).")
      .def_readonly("step", &RestoreReport::step)
      .def_readonly("tier", &RestoreReport::tier)
      .def_readonly("bytes", &RestoreReport::bytes)
      .def_readonly("seconds", &RestoreReport::seconds)
      .def_property_readonly("blobs", [](const RestoreReport& r) { return FromBlobs(r.blobs); })
      .def_readonly("blobs_rank", &RestoreReport::blobs_rank)
      .def_readonly("skipped", &RestoreReport::skipped)
      .def_readonly("resharded", &RestoreReport::resharded)
      .def_readonly("bytes_local", &RestoreReport::bytes_local)
      .def_readonly("bytes_received", &RestoreReport::bytes_received)
      .def_readonly("pfs_bytes_read", &RestoreReport::pfs_bytes_read)
      .def_readonly("job_pfs_bytes_read", &RestoreReport::job_pfs_bytes_read)
      .def_readonly("job_unique_bytes_needed", &RestoreReport::job_unique_bytes_needed)
      .def_readonly("plan", &RestoreReport::plan)
      .def_readonly("rebuilt_step", &RestoreReport::rebuilt_step);

  py::class_<VersionInfo>(m, "VersionInfo")
      .def_readonly("step", &VersionInfo::step)
      .def_property_readonly("state",
                             [](const VersionInfo& v) { return VersionStateName(v.state); })
      .def_readonly("data_bytes", &VersionInfo::data_bytes)
      .def_readonly("created_wall_ns", &VersionInfo::created_wall_ns)
      .def_readonly("rank", &VersionInfo::rank)
      .def_readonly("world_size", &VersionInfo::world_size);

  m.def(
      "flat_range_boxes",
      [](const Shape& shape, int64_t begin, int64_t end) {
        std::vector<std::pair<std::vector<int64_t>, std::vector<int64_t>>> out;
        for (Box& b : Unwrap(FlatRangeToBoxes(shape, begin, end)))
          out.emplace_back(std::move(b.offsets), std::move(b.lengths));
        return out;
      },
      py::arg("shape"), py::arg("begin"), py::arg("end"),
      "The boxes (offsets, lengths) that the flat row-major range [begin, end) of a tensor of "
      "`shape` covers, in flat order.");
}

// PfsStep: one committed step on the PFS, read tensor by tensor.
void BindPfsStep(py::module_& m) {
  py::class_<PfsStep>(m, "PfsStep",
                      "A committed step of a job's PFS tier, read without a running job "
                      "(C++ cairn::PfsStep): PfsStep.open(job_dir, step=None) with job_dir = "
                      "<pfs_root>/<job id>; step None: the one LATEST names.")
      .def_static(
          "open",
          [](const std::string& job_dir, std::optional<int64_t> step) {
            return Unwrap(PfsStep::Open(job_dir, step.value_or(-1)));
          },
          py::arg("job_dir"), py::arg("step") = std::nullopt)
      .def_static(
          "steps", [](const std::string& job_dir) { return Unwrap(PfsStep::Steps(job_dir)); },
          py::arg("job_dir"), "The committed steps of job_dir, oldest first.")
      .def_property_readonly("step", &PfsStep::step)
      .def_property_readonly("world_size", &PfsStep::world_size)
      .def_property_readonly("directory", &PfsStep::directory)
      .def(
          "tensors",
          [](const PfsStep& s) {
            py::list out;
            for (const PfsStep::Tensor& t : s.tensors()) {
              py::list boxes;
              for (const Box& b : t.boxes) boxes.append(py::make_tuple(b.offsets, b.lengths));
              out.append(py::make_tuple(t.meta.name, std::string(DTypeName(t.meta.dtype)),
                                        t.meta.global_shape, boxes));
            }
            return out;
          },
          "[(name, dtype name, global shape, [(offsets, lengths) of each saved box])]")
      .def(
          "read",
          [](const PfsStep& s, const std::vector<PyShard>& targets) {
            const std::vector<ShardSpec> specs = Specs(targets);
            const Status st = WithoutGil([&] { return s.read(specs); });
            if (!st.ok()) Throw(st);
          },
          py::arg("targets"),
          "Fills host targets (cairn.Shard, any boxes) from the step, verifying every chunk.")
      .def(
          "blobs",
          [](const PfsStep& s, int rank) {
            return FromBlobs(Unwrap(WithoutGil([&] { return s.blobs(rank); })));
          },
          py::arg("rank"), "The blobs `rank` saved with the step ({name: bytes}).");
}

// A Prefault and the owners of the memory it faults in: the owners outlive the thread.
struct PyPrefault {
  std::vector<PyShard> targets;  // declared first: destroyed after the Prefault stops
  std::unique_ptr<Prefault> prefault;
};

// Preparing a restart's restore while the job connects (include/cairn/prepare.h).
void BindPrepare(py::module_& m) {
  m.def(
      "newest_held_blob",
      [](const Options& options, const std::string& name) -> py::object {
        auto got = Unwrap(WithoutGil([&] { return NewestHeldBlob(options, name); }));
        if (!got) return py::none();
        return py::make_tuple(got->step, py::bytes(got->bytes));
      },
      py::arg("options"), py::arg("name"),
      "(step, bytes) of blob `name` of the newest restorable version in this rank's own host "
      "tier, read without opening it (no lock, nothing sent); None when there is none. The "
      "restore decides its step on its own: check that what this prepared matches.");
  py::class_<PyPrefault>(m, "Prefault",
                         "Faults in the host memory of `targets` (cairn.Shard) on a thread of "
                         "its own, as a restore into them would, so that the kernel's page "
                         "faults happen while the job connects (C++ cairn::Prefault). Keeps "
                         "the targets' owners alive until it is done.")
      .def(py::init([](std::vector<PyShard> targets, const Options& options) {
             auto p = std::make_unique<PyPrefault>();
             p->prefault = std::make_unique<Prefault>(Specs(targets), options);
             p->targets = std::move(targets);
             return p;
           }),
           py::arg("targets"), py::arg("options"))
      .def(
          "stop", [](PyPrefault& p) { return WithoutGil([&] { return p.prefault->Stop(); }); },
          "Stops at the next MiB and waits for the thread (what is left, a restore faults in "
          "itself); returns the bytes faulted in.");
}

// ShardList and Checkpointer.
void BindCheckpointer(py::module_& m) {
  py::class_<PyShardList>(m, "ShardList",
                          "Shards converted once, for saves of the same tensors at the same "
                          "addresses: save() then converts nothing per shard. Keeps every "
                          "shard's owner alive while it lives.")
      .def(py::init(&MakeShardList), py::arg("shards"))
      .def("__len__", [](const PyShardList& l) { return l.specs.size(); })
      .def(
          "__add__",
          [](const PyShardList& l, const std::vector<PyShard>& more) {
            PyShardList out = l;
            Append(out, more);
            return out;
          },
          py::arg("more"), "This list followed by the Shards in `more` (a new ShardList).");

  py::class_<PyCheckpointer>(m, "Checkpointer",
                             "This rank's checkpointer (C++ cairn::Checkpointer). For PyTorch "
                             "use cairn.torch.Checkpointer, which builds the shards.")
      .def(py::init<Options>(), py::arg("options"))
      .def("save", &PyCheckpointer::Save, py::arg("step"), py::arg("shards"),
           py::arg("blobs") = py::dict(), py::arg("stream") = 0,
           "Queues a version of `shards` (a list of Shard, or a ShardList): returns 'queued' "
           "or 'skipped' (no free slot). Device shards "
           "are copied after the work queued so far on `stream` (a cudaStream_t as an int, "
           "e.g. torch.cuda.current_stream().cuda_stream; 0: the default stream). The "
           "shards' memory is read until the point the next fence() orders writers after.")
      .def("fence", &PyCheckpointer::Fence, py::arg("stream") = std::nullopt,
           py::arg("host") = false,
           "Orders the writers of the saved tensors after their copy. Host shards: waits "
           "until they are copied. Device shards: makes the save's stream (or `stream`) wait "
           "on the GPU for the copy and returns at once. host=True: blocks until every byte "
           "is copied.")
      .def("wait_captured", &PyCheckpointer::WaitCaptured)
      .def("wait_replicated", &PyCheckpointer::WaitReplicated, py::arg("timeout_s") = 60.0,
           py::arg("step") = std::nullopt,
           "Waits until the newest captured version is held by its replica holders; raises "
           "when that does not happen in timeout_s. With `step` (any thread): True once that "
           "step or a newer one is, False when timeout_s passed first; raises when its push "
           "failed or the job does not replicate; it asks the job to keep nothing.")
      .def("wait_save", &PyCheckpointer::WaitSave, py::arg("n"), py::arg("settled") = true,
           py::arg("timeout_s") = 60.0,
           "Waits for the n-th queued save of this process (queued counts them): every byte "
           "in host memory (settled=False) or CAPTURED (True). True then, False when "
           "timeout_s passed first; raises its capture error. Any thread.")
      .def_property_readonly("queued", &PyCheckpointer::queued,
                             "How many saves this process queued (the n of wait_save).")
      .def("allgather", &PyCheckpointer::AllGather, py::arg("mine"),
           "Collective: every rank's bytes `mine`, by rank.")
      .def("wait_for_slot", &PyCheckpointer::WaitForSlot, py::arg("timeout_s") = 60.0,
           "Waits until the next save() finds a free host slot (drains, replica pushes and "
           "step-agreement rounds hold some for a while); call it before a save that must "
           "not be skipped, such as a run's last. Raises when none is free in timeout_s.")
      .def("flush", &PyCheckpointer::Flush,
           "Collective: persists the newest version every rank holds; returns its step.")
      .def("restore", &PyCheckpointer::Restore, py::arg("targets"), py::arg("step") = std::nullopt,
           py::arg("partial") = false, py::arg("stream") = 0,
           "Collective: fills the targets from the newest restorable version (or `step`). "
           "Copies into device targets run after the work queued on `stream` so far and "
           "have finished when it returns.")
      .def("barrier", &PyCheckpointer::Barrier, "Collective: waits for every rank.")
      .def("stats", &PyCheckpointer::GetStats)
      .def("versions", &PyCheckpointer::Versions)
      .def_property_readonly("options", &PyCheckpointer::GetOptions)
      .def_property_readonly("host_dir", &PyCheckpointer::HostDir)
      .def_property_readonly("closed", &PyCheckpointer::closed)
      .def("close", &PyCheckpointer::Close,
           "Waits for captures in flight, then stops (the host tier's files stay).")
      .def("__enter__", [](PyCheckpointer& c) -> PyCheckpointer& { return c; })
      .def("__exit__", [](PyCheckpointer& c, py::args) { c.Close(); });
}

}  // namespace
}  // namespace cairn

PYBIND11_MODULE(_cairn, m) {
  using namespace cairn;
  m.doc() = "cairn: a multi-level checkpoint cache for large-model training (C++ core)";
  static py::exception<std::runtime_error> error(m, "Error", PyExc_RuntimeError);
  g_error = error.ptr();
  BindOptions(m);
  BindShard(m);
  BindReports(m);
  BindPfsStep(m);
  BindPrepare(m);
  BindCheckpointer(m);
}
