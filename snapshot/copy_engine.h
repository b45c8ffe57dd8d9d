// CopyEngine: moves tensor bytes between the training's memory and host slots.
//
// Capture calls Capture() from cairn's capture thread (never the training thread) with the
// chunks of one version; restore calls Copy() to fill the targets. An engine that can
// checksum while it copies (the host engine) fills `checksums`; others leave that to the
// caller (Capture() always fills them).
//
// Device memory (the CUDA engine) is captured in the order of the stream that produced it:
// save() records a StreamMark on the training stream (MarkStream, on the training thread);
// the copy stream waits for that mark before its first chunk, so the version holds exactly
// what the stream had written when save() was called, whatever kernels are still queued
// or running. The end of a version's device copies is itself a mark, which a fence makes
// the consumer stream wait for (StreamWait) instead of blocking the host.
//
// Thread-safety: one Copy() or Capture() at a time per engine; MarkStream(), StreamWait()
// and DeviceOf() may be called from another thread (the training thread) meanwhile.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <memory>
#include <span>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/options.h"
#include "cairn/status.h"
#include "cairn/tensor.h"

namespace cairn {

struct CopyChunk {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
  bool device = false;  // src or dst is CUDA device memory
  // The previous chunk's buffers go on into this one's (one tensor cut into chunks): the
  // two may be copied as one. Never set across tensors: two allocations that happen to be
  // adjacent in the address space are still two, and one device copy over both fails.
  bool continues = false;
};

// A point in a CUDA stream's queued work (a recorded CUDA event). Made only by the CUDA
// engine; destroying it releases the event (a wait already queued on it stays valid).
class StreamMark {
 public:
  virtual ~StreamMark() = default;
  virtual int device() const = 0;
};

struct HostRange {
  const void* data = nullptr;
  size_t bytes = 0;
};

class CopyEngine {
 public:
  virtual ~CopyEngine() = default;
  virtual std::string_view name() const = 0;

  // Copies every chunk and returns when all are done. If `checksums` is not null and
  // checksums_while_copying() is true, checksums[i] receives the XXH3 of chunk i's bytes.
  virtual Status Copy(std::span<const CopyChunk> chunks, uint64_t* checksums) = 0;
  virtual bool checksums_while_copying() const = 0;

  // XXH3 of every host range, in parallel on the engine's threads.
  virtual void ChecksumHost(std::span<const HostRange> ranges, uint64_t* out) = 0;

  // Host memory the engine will copy into or out of (a slot mapping). The CUDA engine pins
  // it (cudaHostRegister); the host engine does nothing. pins_host() says whether
  // RegisterHost pins at all (its OK means "pinned" only then).
  virtual bool pins_host() const { return false; }
  virtual Status RegisterHost(void* p, size_t n) {
    (void)p, (void)n;
    return Status::OK();
  }
  virtual void UnregisterHost(void* p, size_t n) { (void)p, (void)n; }

  // Copies one version's chunks into its slot and checksums them (checksums[i] for chunk
  // i). Chunks marked `device` are copied in order on the copy stream of `device`, after
  // `after` (a mark of the producing stream; null: no ordering, which only the GPU tests
  // use to show the race it prevents); each is checksummed on the host as soon as it
  // lands. Host chunks are copied by host threads. `queued` is called once, as soon as
  // every host chunk is copied and every device copy is queued, with the mark of the end
  // of the device copies (null when there are none); from then on a consumer stream can be
  // ordered after the copy. Returns when every byte has landed and is checksummed. On
  // failure every copy already queued has finished before it returns, and `queued` may
  // not have been called.
  virtual Status Capture(const StreamMark* after, int device, std::span<const CopyChunk> chunks,
                         uint64_t* checksums,
                         const std::function<void(std::shared_ptr<StreamMark>)>& queued);

  // The CUDA device holding `p`, found from the pointer (not the current device).
  // InvalidArgument when `p` is not device memory or the engine has no devices.
  virtual Result<int> DeviceOf(const void* p) {
    (void)p;
    return Status::InvalidArgument("the '" + std::string(name()) +
                                   "' copy engine cannot reach device memory");
  }
  // Records a mark on `producer` (a stream of `device`; nullptr: the legacy default stream)
  // after all the work queued on it so far. Cheap; called by save() on the training thread.
  virtual Result<std::shared_ptr<StreamMark>> MarkStream(int device, CudaStream producer) {
    (void)device, (void)producer;
    return Status::FailedPrecondition("the '" + std::string(name()) +
                                      "' copy engine has no streams");
  }
  // Makes `consumer` wait on the device for `mark`; returns at once (the host never waits).
  virtual Status StreamWait(const StreamMark& mark, CudaStream consumer) {
    (void)mark, (void)consumer;
    return Status::FailedPrecondition("the '" + std::string(name()) +
                                      "' copy engine has no streams");
  }
  // Orders the following Copy() calls of `device` after the work queued on `stream` so far
  // (a restore into device memory that the stream may still be writing). No-op without
  // devices.
  virtual Status OrderAfter(int device, CudaStream stream) {
    (void)device, (void)stream;
    return Status::OK();
  }
};

// Rows of a strided copy: `rows` blocks of `width` bytes, block i from src + i * spitch to
// dst + i * dpitch (a column-split region of a row-major tensor is such a run).
struct CopyRows {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  size_t width = 0;
  size_t rows = 0;
  size_t spitch = 0;
  size_t dpitch = 0;
};

// Groups consecutive chunks of equal size whose sources and destinations advance by
// constant positive strides of at least the chunk size (and below 2 GiB, the limit of
// strided device copies) into runs; every chunk lands in exactly one run, in order. A
// lone chunk is a run of one row. The CUDA engine turns each run into one
// cudaMemcpy2DAsync instead of one copy per row.
std::vector<CopyRows> GroupRows(std::span<const CopyChunk> chunks);

// Consecutive chunks copied as one: chunk order[k] joins the group of order[k-1] when it
// `continues` it, its source and destination follow on from that group's, and the group
// stays within `max_bytes`. (*group_of)[k] receives order[k]'s group; every chunk lands in
// exactly one group, in order.
struct CopyGroup {
  const std::byte* src = nullptr;
  std::byte* dst = nullptr;
  size_t bytes = 0;
};
std::vector<CopyGroup> GroupCopies(std::span<const CopyChunk> chunks, std::span<const size_t> order,
                                   size_t max_bytes, std::vector<uint32_t>* group_of);

// Lands a capture's copies a window at a time, checksumming chunks as they land. The
// calling thread queues groups 0, 1, ... (`steps.enqueue`, e.g. a cudaMemcpyAsync and an
// event) up to `window_bytes` (always at least one group; 0: every group at once), waits
// for them in order (`steps.wait`) and queues the next window only when every group of the
// last one has landed. As each group is in, it queues `steps.checksum(k)` on `pool` for
// every chunk k of it (group_of[k], non-decreasing; group_bytes[g] its size), so the pool's
// threads are busy while later bytes arrive. `steps.all_queued` runs once, right after the
// last group was queued (with no group: at once). Only the calling thread queues and waits.
//
// Why windows that drain: a device's copy engine serves the copies queued in one
// direction in order, and a transfer the training queues on its own stream (loss.item(),
// a metric) got its turn only when cairn's queue ran empty. On an H200 such a 4-byte copy
// waited 155 ms (the whole 8 GiB version) behind a version queued at once, and also
// behind a window of 64 MiB kept full; when the window drained before the next was queued
// it waited at most 1.2 ms (bench/gpu_parts, d2h_max_ms_*, docs/gpu.md).
// On the first failed enqueue or wait, nothing more is queued or checksummed (chunks of
// groups landed before may be) and that error is returned once every checksum queued has
// ended; the caller must still wait for the copies queued so far.
struct LandingSteps {
  std::function<Status(size_t group)> enqueue;
  std::function<Status()> all_queued;
  std::function<Status(size_t group)> wait;
  std::function<void(size_t chunk)> checksum;
};
class Pool;
Status ChecksumAsTheyLand(Pool& pool, std::span<const uint32_t> group_of,
                          std::span<const size_t> group_bytes, size_t window_bytes,
                          const LandingSteps& steps);

// Copies `n` bytes with non-temporal stores (the destination is not pulled into cache);
// falls back to memcpy for small or unaligned tails. Safe for any alignment.
void StreamingCopy(void* dst, const void* src, size_t n);

// The host engine: `threads` workers (the calling thread plus threads-1 helpers),
// non-temporal copies in sub-blocks of 256 KiB, each checksummed while still in cache.
std::unique_ptr<CopyEngine> MakeHostCopyEngine(int threads);

// True when the CUDA engine is compiled in and a CUDA device is usable.
bool CudaDeviceAvailable();
// The CUDA engine (copy stream, events, pinned slots). Unavailable when built without CUDA
// or when no device is usable (the message says which). A capture queues its copies
// `window_bytes` at a time, each window once the previous one has landed (0: the whole
// version at once; see ChecksumAsTheyLand for why).
inline constexpr size_t kCudaCopyWindowBytes = size_t{64} << 20;
Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads,
                                                       size_t window_bytes = kCudaCopyWindowBytes);

// Picks the engine for `kind`: kAuto gives CUDA when a device is usable, else host.
Result<std::unique_ptr<CopyEngine>> MakeCopyEngine(CopyEngineKind kind, int threads);

}  // namespace cairn
