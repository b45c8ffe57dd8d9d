// The CUDA copy engine: device -> pinned host slot copies on a dedicated stream per device,
// ordered after the stream that produced the tensors (see copy_engine.h).
//
// A capture: the copy stream waits for the producer's mark (recorded by save()), then one
// cudaMemcpyAsync per group of chunks of one tensor, each followed by an event, then the
// version's end mark. The capture thread waits for the group events in order, and the
// chunks are checksummed on host threads while later ones are in flight, in one of two
// ways (CAIRN_CUDA_LANDING, until a GPU run settles it: docs/gpu.md):
//   batch (default)  one chunk per group; after each wait, every chunk landed by then is
//                    checksummed, and only then does the next wait begin. On an H200 this
//                    reached half the link (26.8 of 53.8 GB/s, 8 threads that checksum
//                    58-75 GB/s alone; bench/gpu_parts).
//   stream           groups up to kGroupBytes; each group's chunks are queued on the
//                    checksum pool as soon as it has landed, its threads busy while later
//                    bytes arrive.
// Slots are registered (pinned) once, when the host tier maps or grows them, never per save.
//
// Compiled only when CMake finds the CUDA toolkit; without a usable device every entry
// point reports Unavailable and cairn uses the host engine.
#include <cuda_runtime_api.h>

#include <algorithm>
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
  CudaCopyEngine(int device, int checksum_threads, bool stream_landing)
      : copy_device_(device),
        stream_landing_(stream_landing),
        batch_max_(static_cast<size_t>(checksum_threads) * 4),
        pool_(stream_landing ? std::make_unique<Pool>("cairn-checksum", checksum_threads,
                                                      ThreadPriority::kBatch)
                             : nullptr),
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
    const std::vector<size_t>& dev = m.device_index;
    DeviceGuard guard;
    DeviceState* d = nullptr;
    std::shared_ptr<StreamMark> done;
    std::vector<uint32_t> group_of;  // dev[k]'s copy group
    if (!dev.empty()) {
      CAIRN_ASSIGN_OR_RETURN(d, State(device));
      Status st = Enqueue(d, device, after, chunks, dev, &group_of, &done);
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
    if (!d) return Status::OK();
    return stream_landing_ ? LandStreaming(d, chunks, dev, group_of, checksums)
                           : LandInBatches(d, chunks, dev, group_of, checksums);
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

  // Queues the device chunks `dev` of `chunks` on d's stream after `after`: runs of
  // contiguous chunks (source and destination) up to kGroupBytes as one copy with an
  // event after it (group_of[k]: the group of dev[k]), and the end mark after the last.
  Status Enqueue(DeviceState* d, int device, const StreamMark* after,
                 std::span<const CopyChunk> chunks, const std::vector<size_t>& dev,
                 std::vector<uint32_t>* group_of, std::shared_ptr<StreamMark>* done) {
    CAIRN_CUDA_CHECK(cudaSetDevice(device));
    if (after)
      CAIRN_CUDA_CHECK(
          cudaStreamWaitEvent(d->stream, static_cast<const CudaMark*>(after)->event(), 0));
    // The batch landing copies chunk by chunk, as measured; the streaming one in groups.
    const std::vector<CopyGroup> groups =
        GroupCopies(chunks, dev, stream_landing_ ? kGroupBytes : 0, group_of);
    while (d->group_events.size() < groups.size()) {
      cudaEvent_t e = nullptr;
      // Blocking sync: the capture thread sleeps while a group is in flight instead of
      // spinning on a core the training's own host thread may need.
      CAIRN_CUDA_CHECK(
          cudaEventCreateWithFlags(&e, cudaEventDisableTiming | cudaEventBlockingSync));
      d->group_events.push_back(e);
    }
    for (size_t g = 0; g < groups.size(); ++g) {
      CAIRN_CUDA_CHECK(cudaMemcpyAsync(groups[g].dst, groups[g].src, groups[g].bytes,
                                       cudaMemcpyDefault, d->stream));
      CAIRN_CUDA_CHECK(cudaEventRecord(d->group_events[g], d->stream));
    }
    CAIRN_ASSIGN_OR_RETURN(auto mark, NewMark(device));
    CAIRN_CUDA_CHECK(cudaEventRecord(mark->event(), d->stream));
    *done = std::move(mark);
    return Status::OK();
  }

  // Streaming landing (CAIRN_CUDA_LANDING=stream): checksums every device chunk as it
  // lands. This thread waits for the group events in order and, as each group is in, queues
  // its chunks' checksums on the pool, so the checksum threads are busy while later bytes
  // arrive. Only this thread calls CUDA: checksum threads waiting in the driver too would
  // contend with the training thread's kernel launches for the driver's locks.
  Status LandStreaming(DeviceState* d, std::span<const CopyChunk> chunks,
                       const std::vector<size_t>& dev, const std::vector<uint32_t>& group_of,
                       uint64_t* checksums) {
    Status st = ChecksumAsTheyLand(
        *pool_, group_of,
        [&](size_t g) -> Status {
          const cudaError_t e = cudaEventSynchronize(d->group_events[g]);
          if (e != cudaSuccess) return CudaFailure("cudaEventSynchronize (capture chunk)", e);
          return Status::OK();
        },
        [&](size_t k) {
          const CopyChunk& c = chunks[dev[k]];
          checksums[dev[k]] = Checksum(c.dst, c.bytes);
          CAIRN_KILL_POINT("capture.copy_chunk");
        });
    if (!st.ok()) cudaStreamSynchronize(d->stream);
    return st;
  }

  // Batch landing (the default): waits for the groups in order; checksums every chunk
  // landed by then on the host threads, and only then waits for the next.
  Status LandInBatches(DeviceState* d, std::span<const CopyChunk> chunks,
                       const std::vector<size_t>& dev, const std::vector<uint32_t>& group_of,
                       uint64_t* checksums) {
    std::vector<HostRange> ranges;
    std::vector<uint64_t> sums;
    size_t k = 0;
    while (k < dev.size()) {
      cudaError_t e = cudaEventSynchronize(d->group_events[group_of[k]]);
      if (e != cudaSuccess) {
        cudaStreamSynchronize(d->stream);
        return CudaFailure("cudaEventSynchronize (capture chunk)", e);
      }
      size_t end = k + 1;
      while (end < dev.size() && end - k < batch_max_) {
        if (group_of[end] != group_of[end - 1]) {
          const cudaError_t q = cudaEventQuery(d->group_events[group_of[end]]);
          if (q != cudaSuccess) {
            (void)cudaGetLastError();  // cudaErrorNotReady is recorded as the last error
            break;
          }
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
  const bool stream_landing_;
  const size_t batch_max_;  // chunks checksummed at once by the batch landing
  // The device chunks' checksums of the streaming landing (the batch landing checksums on
  // host_'s threads).
  const std::unique_ptr<Pool> pool_;
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

Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads) {
  int device = 0;
  Status st = OpenDevice(&device);
  if (!st.ok())
    return Status::Unavailable("the CUDA copy engine needs a usable CUDA device: " + st.message());
  // One core checksums bytes that just came from the link at about 7 GB/s (an H200's host,
  // bench/gpu_parts), a PCIe 5 link delivers 54: at least 8 threads keep CAPTURED close
  // behind the last byte.
  // The landing is a diagnostic choice until a GPU run settles it (docs/gpu.md).
  const char* landing = std::getenv("CAIRN_CUDA_LANDING");
  const std::string_view l = landing ? landing : "batch";
  if (l != "batch" && l != "stream")
    return Status::InvalidArgument("CAIRN_CUDA_LANDING must be batch or stream, not '" +
                                   std::string(l) + "'");
  return std::unique_ptr<CopyEngine>(
      new CudaCopyEngine(device, std::max(threads, kMinChecksumThreads), l == "stream"));
}

}  // namespace cairn
