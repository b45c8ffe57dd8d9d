// The CUDA copy engine: device -> pinned host slot copies on a dedicated stream per device,
// ordered after the stream that produced the tensors (see copy_engine.h).
//
// A capture: the copy stream waits for the producer's mark (recorded by save()), then one
// cudaMemcpyAsync per chunk, each followed by a chunk event, then the version's end mark.
// The capture thread waits for the chunk events in order and checksums each batch of
// landed chunks on host threads while later chunks are still in flight, so the version is
// CAPTURED shortly after its last byte arrives. Slots are registered (pinned) once, when
// the host tier maps or grows them, never per save.
//
// Compiled only when CMake finds the CUDA toolkit; without a usable device every entry
// point reports Unavailable and cairn uses the host engine.
#include <cuda_runtime_api.h>

#include <algorithm>
#include <map>
#include <string>
#include <vector>

#include "core/kill_point.h"
#include "core/mutex.h"
#include "snapshot/copy_engine.h"

namespace cairn {
namespace {

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
  std::vector<cudaEvent_t> chunk_events;  // one per device chunk of a Capture(), reused
};

class CudaCopyEngine final : public CopyEngine {
 public:
  CudaCopyEngine(int device, int checksum_threads)
      : copy_device_(device),
        batch_max_(static_cast<size_t>(std::max(1, checksum_threads)) * 4),
        host_(MakeHostCopyEngine(checksum_threads)) {}

  ~CudaCopyEngine() override {
    DeviceGuard guard;
    for (auto& [device, d] : states_) {
      cudaSetDevice(device);
      cudaStreamSynchronize(d->stream);
      for (cudaEvent_t e : d->chunk_events) cudaEventDestroy(e);
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
    const std::vector<size_t>& dev = m.device_index;
    DeviceGuard guard;
    DeviceState* d = nullptr;
    std::shared_ptr<StreamMark> done;
    if (!dev.empty()) {
      CAIRN_ASSIGN_OR_RETURN(d, State(device));
      Status st = Enqueue(d, device, after, chunks, dev, &done);
      if (!st.ok()) {
        cudaStreamSynchronize(d->stream);
        return st;
      }
    }
    // Host shards are copied while the device copies run (the host engine checksums them
    // as it copies).
    if (!m.host.empty()) {
      std::vector<uint64_t> sums(m.host.size());
      Status st = host_->Copy(m.host, sums.data());
      if (!st.ok()) {
        if (d) cudaStreamSynchronize(d->stream);
        return st;
      }
      for (size_t k = 0; k < m.host.size(); ++k) checksums[m.host_index[k]] = sums[k];
    }
    queued(done);
    if (d) return Land(d, chunks, dev, checksums);
    return Status::OK();
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

  // Queues the device chunks `dev` of `chunks` on d's stream after `after`, an event after
  // each, and the end mark after the last.
  Status Enqueue(DeviceState* d, int device, const StreamMark* after,
                 std::span<const CopyChunk> chunks, const std::vector<size_t>& dev,
                 std::shared_ptr<StreamMark>* done) {
    CAIRN_CUDA_CHECK(cudaSetDevice(device));
    if (after)
      CAIRN_CUDA_CHECK(
          cudaStreamWaitEvent(d->stream, static_cast<const CudaMark*>(after)->event(), 0));
    while (d->chunk_events.size() < dev.size()) {
      cudaEvent_t e = nullptr;
      // Blocking sync: the capture thread sleeps while a chunk is in flight instead of
      // spinning on a core the training's own host thread may need.
      CAIRN_CUDA_CHECK(
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
      d->chunk_events.push_back(e);
    }
    for (size_t k = 0; k < dev.size(); ++k) {
      const CopyChunk& c = chunks[dev[k]];
      CAIRN_CUDA_CHECK(cudaMemcpyAsync(c.dst, c.src, c.bytes, cudaMemcpyDefault, d->stream));
      CAIRN_CUDA_CHECK(cudaEventRecord(d->chunk_events[k], d->stream));
    }
    CAIRN_ASSIGN_OR_RETURN(auto mark, NewMark(device));
    CAIRN_CUDA_CHECK(cudaEventRecord(mark->event(), d->stream));
    *done = std::move(mark);
    return Status::OK();
  }

  // Waits for the device chunks in order; checksums each batch of landed chunks on the host
  // threads while the later ones are still in flight.
  Status Land(DeviceState* d, std::span<const CopyChunk> chunks, const std::vector<size_t>& dev,
              uint64_t* checksums) {
    std::vector<HostRange> ranges;
    std::vector<uint64_t> sums;
    size_t k = 0;
    while (k < dev.size()) {
      cudaError_t e = cudaEventSynchronize(d->chunk_events[k]);
      if (e != cudaSuccess) {
        cudaStreamSynchronize(d->stream);
        return CudaFailure("cudaEventSynchronize (capture chunk)", e);
      }
      size_t end = k + 1;
      while (end < dev.size() && end - k < batch_max_) {
        const cudaError_t q = cudaEventQuery(d->chunk_events[end]);
        if (q != cudaSuccess) {
          (void)cudaGetLastError();  // cudaErrorNotReady is recorded as the last error
          break;
        }
        ++end;
      }
      ranges.clear();
      for (size_t j = k; j < end; ++j) ranges.push_back({chunks[dev[j]].dst, chunks[dev[j]].bytes});
      sums.resize(ranges.size());
      host_->ChecksumHost(ranges, sums.data());
      for (size_t j = k; j < end; ++j) checksums[dev[j]] = sums[j - k];
      CAIRN_KILL_POINT("capture.copy_chunk");
      k = end;
    }
    return Status::OK();
  }

  int copy_device_;  // Copy()'s device: the engine's, or the last OrderAfter's
  const size_t batch_max_;
  std::unique_ptr<CopyEngine> host_;  // host chunks, checksums
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

Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads) {
  int device = 0;
  Status st = OpenDevice(&device);
  if (!st.ok())
    return Status::Unavailable("the CUDA copy engine needs a usable CUDA device: " + st.message());
  // Checksumming a chunk on one core is slower than a PCIe link delivers it: at least 4
  // threads keep CAPTURED close behind the last byte.
  return std::unique_ptr<CopyEngine>(new CudaCopyEngine(device, std::max(threads, 4)));
}

}  // namespace cairn
