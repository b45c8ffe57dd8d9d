// The CUDA copy engine: device -> pinned host slot copies on a dedicated stream per device,
// ordered after the stream that produced the tensors (see copy_engine.h).
//
// A capture: the copy stream waits for the producer's mark (recorded by save()), then one
// cudaMemcpyAsync per group of chunks of one tensor (up to kGroupBytes), each followed by
// an event, then the version's end mark. The capture thread queues the groups a window at
// a time (ChecksumAsTheyLand: window_bytes, the next window once the last has landed),
// waits for their events in order and, as each group lands, queues its chunks' checksums
// on the checksum pool, whose threads are busy while later bytes arrive. Only the capture
// thread calls CUDA.
//
// Windows, not the whole version at once: the device's copy engine serves queued copies
// in order, and a version queued whole made every device-to-host transfer of the training
// behind it wait for all of it (loss.item() waited 155 ms per 8 GiB iteration on an H200,
// and each iteration grew by the copy's time although the copy overlapped the forward and
// backward; docs/gpu.md). The cost: the end mark is recorded only when the last group is
// queued, so fence() waits on the host until then (the GPU meanwhile runs the forward and
// backward queued before it).
// Slots are registered (pinned) once, when the host tier maps or grows them, never per save.
//
// Compiled only when CMake finds the CUDA toolkit; without a usable device every entry
// point reports Unavailable and cairn uses the host engine.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <cstdint>
#include <cstdlib>
#include <map>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/kill_point.h"
#include "core/mutex.h"
#include "core/pool.h"
#include "snapshot/copy_engine.h"

namespace cairn {
namespace {

// Contiguous chunks are copied together up to this many bytes, with one event: an event
// recorded after every 4 MiB chunk cost 2% of the link, and larger copies run 1-3% faster
// (bench/gpu_parts on an H200).
constexpr size_t kGroupBytes = 16 << 20;
constexpr int kMinChecksumThreads = 8;

// Also clears the calling thread's last CUDA error: cairn reports the failure as a Status,
// and a stale error left on the training thread would surface in the next framework call
// that checks cudaGetLastError() (PyTorch does after every kernel launch).
Status CudaFailure(const char* call, cudaError_t e) {
  (void)cudaGetLastError();
  return Status::IOError(std::string(call) + " failed: " + cudaGetErrorName(e) + " (" +
                         cudaGetErrorString(e) + ")");
}

// Turns a failed CUDA runtime call into a Status naming the call and the error.
#define CAIRN_CUDA_CHECK(call)                            \
  do {                                                    \
    cudaError_t _e = (call);                              \
    if (_e != cudaSuccess) return CudaFailure(#call, _e); \
  } while (0)

// Restores the calling thread's current device when it goes out of scope: the engine's
// calls on the training thread must not change the device the training uses.
class DeviceGuard {
 public:
  DeviceGuard() { ok_ = cudaGetDevice(&saved_) == cudaSuccess; }
  ~DeviceGuard() {
    if (ok_) cudaSetDevice(saved_);
  }
  DeviceGuard(const DeviceGuard&) = delete;
  DeviceGuard& operator=(const DeviceGuard&) = delete;

 private:
  int saved_ = 0;
  bool ok_ = false;
};

class CudaMark final : public StreamMark {
 public:
  CudaMark(int device, cudaEvent_t event) : device_(device), event_(event) {}
  // Destroying an event with work still pending is allowed: CUDA releases it afterwards,
  // and waits already queued on it stay valid.
  ~CudaMark() override { cudaEventDestroy(event_); }
  CudaMark(const CudaMark&) = delete;
  CudaMark& operator=(const CudaMark&) = delete;
  int device() const override { return device_; }
  cudaEvent_t event() const { return event_; }

 private:
  int device_;
  cudaEvent_t event_;
};

// A new mark's event on `device` (made current by the caller).
Result<std::shared_ptr<CudaMark>> NewMark(int device) {
  cudaEvent_t e = nullptr;
  CAIRN_CUDA_CHECK(cudaEventCreateWithFlags(&e, cudaEventDisableTiming));
  return std::make_shared<CudaMark>(device, e);
}

// A version's or a restore's chunks by memory: host chunks (copied by host threads) with
// their positions, and the positions of the device chunks, each in order.
struct ByMemory {
  std::vector<CopyChunk> host;
  std::vector<size_t> host_index;
  std::vector<size_t> device_index;
};
ByMemory SplitByMemory(std::span<const CopyChunk> chunks) {
  ByMemory m;
  for (size_t i = 0; i < chunks.size(); ++i) {
    if (chunks[i].device) {
      m.device_index.push_back(i);
    } else {
      m.host.push_back(chunks[i]);
      m.host_index.push_back(i);
    }
  }
  return m;
}

// What the engine keeps per device it has copied on.
struct DeviceState {
  cudaStream_t stream = nullptr;          // the copy stream (non-blocking)
  cudaEvent_t copy_done = nullptr;        // end of a Copy() (restore)
  std::vector<cudaEvent_t> group_events;  // one per copy group of a Capture(), reused
};

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(int device, int checksum_threads, size_t window_bytes)
      : copy_device_(device),
        window_bytes_(window_bytes),
        pool_(std::make_unique<Pool>("cairn-checksum", checksum_threads, ThreadPriority::kBatch)),
        host_(MakeHostCopyEngine(checksum_threads)) {}

  ~CudaCopyEngine() override {
    DeviceGuard guard;
    for (auto& [device, d] : states_) {
      cudaSetDevice(device);
      cudaStreamSynchronize(d->stream);
      for (cudaEvent_t e : d->group_events) cudaEventDestroy(e);
      cudaEventDestroy(d->copy_done);
      cudaStreamDestroy(d->stream);
    }
  }

  std::string_view name() const override { return "cuda"; }
  bool checksums_while_copying() const override { return false; }
  bool pins_host() const override { return true; }

  Status Copy(std::span<const CopyChunk> chunks, uint64_t* checksums) override {
    (void)checksums;  // computed by the caller from the host bytes
    const ByMemory m = SplitByMemory(chunks);
    if (!m.host.empty()) CAIRN_RETURN_IF_ERROR(host_->Copy(m.host, nullptr));
    if (m.device_index.empty()) return Status::OK();
    DeviceGuard guard;
    CAIRN_ASSIGN_OR_RETURN(DeviceState * d, State(copy_device_));
    CAIRN_CUDA_CHECK(cudaSetDevice(copy_device_));
    Status st;
    std::vector<CopyChunk> dev;
    dev.reserve(m.device_index.size());
    for (size_t i : m.device_index) dev.push_back(chunks[i]);
    // A column-split target is one strided copy, not one copy per row.
    for (const CopyRows& r : GroupRows(dev)) {
      cudaError_t e = r.rows == 1
                          ? cudaMemcpyAsync(r.dst, r.src, r.width, cudaMemcpyDefault, d->stream)
                          : cudaMemcpy2DAsync(r.dst, r.dpitch, r.src, r.spitch, r.width, r.rows,
                                              cudaMemcpyDefault, d->stream);
      if (e != cudaSuccess) {
        st = CudaFailure(r.rows == 1 ? "cudaMemcpyAsync" : "cudaMemcpy2DAsync", e);
        break;
      }
    }
    // Whatever was queued finishes before the caller may reuse or free the buffers.
    cudaError_t e = cudaEventRecord(d->copy_done, d->stream);
    if (e == cudaSuccess) e = cudaEventSynchronize(d->copy_done);
    if (e != cudaSuccess) {
      cudaStreamSynchronize(d->stream);
      if (st.ok()) st = CudaFailure("cudaEventSynchronize (restore copy)", e);
    }
    return st;
  }

  Status Capture(const StreamMark* after, int device, std::span<const CopyChunk> chunks,
                 uint64_t* checksums,
                 const std::function<void(std::shared_ptr<StreamMark>)>& queued) override {
    const ByMemory m = SplitByMemory(chunks);
    if (m.device_index.empty()) {
      std::vector<uint64_t> sums(m.host.size());
      CAIRN_RETURN_IF_ERROR(host_->Copy(m.host, sums.data()));
      for (size_t k = 0; k < m.host.size(); ++k) checksums[m.host_index[k]] = sums[k];
      queued(nullptr);
      return Status::OK();
    }
    DeviceGuard guard;
    CAIRN_ASSIGN_OR_RETURN(DeviceState * d, State(device));
    // Host shards are copied (and checksummed) by host threads while the device copies run,
    // and before the end mark is handed to fence(), which covers them too.
    // (A task of the checksum pool: no thread is started per save.)
    std::vector<uint64_t> host_sums(m.host.size());
    Status host_st;
    TaskGroup host_copy(pool_.get());
    if (!m.host.empty()) host_copy.Run([&] { host_st = host_->Copy(m.host, host_sums.data()); });
    auto join_host = [&]() -> Status {
      host_copy.Wait();
      return host_st;
    };
    Status st = Land(
        d, device, after, chunks, m.device_index, checksums,
        [&]() -> Status {
          CAIRN_RETURN_IF_ERROR(join_host());
          for (size_t k = 0; k < m.host.size(); ++k) checksums[m.host_index[k]] = host_sums[k];
          return Status::OK();
        },
        queued);
    const Status hs = join_host();
    if (!st.ok()) {
      cudaStreamSynchronize(d->stream);  // the copies queued so far, before the slot is reused
      return st;
    }
    return hs;
  }

  void ChecksumHost(std::span<const HostRange> ranges, uint64_t* out) override {
    host_->ChecksumHost(ranges, out);
  }

  Status RegisterHost(void* p, size_t n) override {
    DeviceGuard guard;
    CAIRN_CUDA_CHECK(cudaSetDevice(copy_device_));
    // Portable: pinned for every device, whichever one a version's tensors live on.
    cudaError_t e = cudaHostRegister(p, n, cudaHostRegisterPortable);
    if (e == cudaErrorHostMemoryAlreadyRegistered) {
      (void)cudaGetLastError();
      return Status::OK();
    }
    if (e != cudaSuccess) return CudaFailure("cudaHostRegister", e);
    return Status::OK();
  }
  void UnregisterHost(void* p, size_t n) override {
    (void)n;
    if (cudaHostUnregister(p) != cudaSuccess) (void)cudaGetLastError();  // was never pinned
  }

  Result<int> DeviceOf(const void* p) override {
    cudaPointerAttributes a{};
    cudaError_t e = cudaPointerGetAttributes(&a, p);
    if (e != cudaSuccess) {
      (void)cudaGetLastError();  // not sticky: clear it
      return Status::InvalidArgument("the pointer is not CUDA memory (" +
                                     std::string(cudaGetErrorName(e)) + ")");
    }
    if (a.type != cudaMemoryTypeDevice && a.type != cudaMemoryTypeManaged)
      return Status::InvalidArgument("the pointer is host memory, not CUDA device memory");
    return a.device;
  }

  Result<std::shared_ptr<StreamMark>> MarkStream(int device, CudaStream producer) override {
    DeviceGuard guard;
    CAIRN_CUDA_CHECK(cudaSetDevice(device));
    CAIRN_ASSIGN_OR_RETURN(auto mark, NewMark(device));
    cudaError_t e = cudaEventRecord(mark->event(), static_cast<cudaStream_t>(producer));
    if (e != cudaSuccess)
      return CudaFailure(
          "cudaEventRecord on the training stream (is the stream on the device "
          "of the tensors?)",
          e);
    return std::shared_ptr<StreamMark>(std::move(mark));
  }

  Status StreamWait(const StreamMark& mark, CudaStream consumer) override {
    const auto& m = static_cast<const CudaMark&>(mark);
    // A wait may name an event of another device; the legacy default stream (nullptr) is
    // the caller's current device's.
    CAIRN_CUDA_CHECK(cudaStreamWaitEvent(static_cast<cudaStream_t>(consumer), m.event(), 0));
    return Status::OK();
  }

  Status OrderAfter(int device, CudaStream stream) override {
    DeviceGuard guard;
    CAIRN_ASSIGN_OR_RETURN(DeviceState * d, State(device));
    CAIRN_CUDA_CHECK(cudaSetDevice(device));
    CAIRN_ASSIGN_OR_RETURN(auto mark, NewMark(device));
    CAIRN_CUDA_CHECK(cudaEventRecord(mark->event(), static_cast<cudaStream_t>(stream)));
    CAIRN_CUDA_CHECK(cudaStreamWaitEvent(d->stream, mark->event(), 0));
    copy_device_ = device;
    return Status::OK();
  }

 private:
  // The copy stream and events of `device`, made on first use.
  Result<DeviceState*> State(int device) {
    MutexLock lk(mu_);
    auto it = states_.find(device);
    if (it != states_.end()) return it->second.get();
    DeviceGuard guard;
    CAIRN_CUDA_CHECK(cudaSetDevice(device));
    auto d = std::make_unique<DeviceState>();
    CAIRN_CUDA_CHECK(cudaStreamCreateWithFlags(&d->stream, cudaStreamNonBlocking));
    cudaError_t e = cudaEventCreateWithFlags(&d->copy_done, cudaEventDisableTiming);
    if (e != cudaSuccess) {
      cudaStreamDestroy(d->stream);
      return CudaFailure("cudaEventCreateWithFlags", e);
    }
    DeviceState* out = d.get();
    states_.emplace(device, std::move(d));
    return out;
  }

  // Copies the device chunks `dev` of `chunks` on d's stream after `after` and checksums
  // them as they land: runs of contiguous chunks of one tensor up to kGroupBytes as one copy
  // with an event after it, at most window_bytes_ in flight (ChecksumAsTheyLand). After the
  // last group is queued: `host_done()` (the host shards copied), the end mark, queued(mark).
  Status Land(DeviceState* d, int device, const StreamMark* after,
              std::span<const CopyChunk> chunks, const std::vector<size_t>& dev,
              uint64_t* checksums, const std::function<Status()>& host_done,
              const std::function<void(std::shared_ptr<StreamMark>)>& queued) {
    CAIRN_CUDA_CHECK(cudaSetDevice(device));
    if (after)
      CAIRN_CUDA_CHECK(
          cudaStreamWaitEvent(d->stream, static_cast<const CudaMark*>(after)->event(), 0));
    std::vector<uint32_t> group_of;
    const std::vector<CopyGroup> groups = GroupCopies(chunks, dev, kGroupBytes, &group_of);
    while (d->group_events.size() < groups.size()) {
      cudaEvent_t e = nullptr;
      // Blocking sync: the capture thread sleeps while a group is in flight instead of
      // spinning on a core the training's own host thread may need.
      CAIRN_CUDA_CHECK(
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
      d->group_events.push_back(e);
    }
    std::vector<size_t> group_bytes(groups.size());
    for (size_t g = 0; g < groups.size(); ++g) group_bytes[g] = groups[g].bytes;
    LandingSteps steps;
    steps.enqueue = [&](size_t g) -> Status {
      CAIRN_CUDA_CHECK(cudaMemcpyAsync(groups[g].dst, groups[g].src, groups[g].bytes,
                                       cudaMemcpyDefault, d->stream));
      CAIRN_CUDA_CHECK(cudaEventRecord(d->group_events[g], d->stream));
      return Status::OK();
    };
    steps.all_queued = [&]() -> Status {
      CAIRN_RETURN_IF_ERROR(host_done());
      CAIRN_ASSIGN_OR_RETURN(auto mark, NewMark(device));
      CAIRN_CUDA_CHECK(cudaEventRecord(mark->event(), d->stream));
      queued(std::move(mark));
      return Status::OK();
    };
    steps.wait = [&](size_t g) -> Status {
      const cudaError_t e = cudaEventSynchronize(d->group_events[g]);
      if (e != cudaSuccess) return CudaFailure("cudaEventSynchronize (capture chunk)", e);
      return Status::OK();
    };
    steps.checksum = [&](size_t k) {
      const CopyChunk& c = chunks[dev[k]];
      checksums[dev[k]] = Checksum(c.dst, c.bytes);
      CAIRN_KILL_POINT("capture.copy_chunk");
    };
    return ChecksumAsTheyLand(*pool_, group_of, group_bytes, window_bytes_, steps);
  }

  int copy_device_;                   // Copy()'s device: the engine's, or the last OrderAfter's
  const size_t window_bytes_;         // capture bytes in flight at most (0: no limit)
  const std::unique_ptr<Pool> pool_;  // the device chunks' checksums
  std::unique_ptr<CopyEngine> host_;  // host chunks, their checksums
  Mutex mu_;                          // guards states_ (MarkStream runs on another thread)
  std::map<int, std::unique_ptr<DeviceState>> states_ CAIRN_GUARDED_BY(mu_);
};

Status OpenDevice(int* device) {
  int count = 0;
  CAIRN_CUDA_CHECK(cudaGetDeviceCount(&count));
  if (count == 0) return Status::Unavailable("no CUDA device");
  CAIRN_CUDA_CHECK(cudaGetDevice(device));
  return Status::OK();
}

}  // namespace

bool CudaDeviceAvailable() {
  int device = 0;
  return OpenDevice(&device).ok();
}

Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads, size_t window_bytes) {
  int device = 0;
  Status st = OpenDevice(&device);
  if (!st.ok())
    return Status::Unavailable("the CUDA copy engine needs a usable CUDA device: " + st.message());
  // One core checksums bytes that just came from the link at about 7 GB/s (an H200's host,
  // bench/gpu_parts), a PCIe 5 link delivers 54: at least 8 threads keep CAPTURED close
  // behind the last byte.
  // A diagnostic override of the window, for A/B runs on a GPU (docs/settings.md).
  if (const char* w = std::getenv("CAIRN_CUDA_COPY_WINDOW")) {
    CAIRN_ASSIGN_OR_RETURN(const uint64_t v, ParseByteCount(w, "CAIRN_CUDA_COPY_WINDOW"));
    window_bytes = v;
  }
  return std::unique_ptr<CopyEngine>(
      new CudaCopyEngine(device, std::max(threads, kMinChecksumThreads), window_bytes));
}

}  // namespace cairn
