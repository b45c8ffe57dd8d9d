// CopyEngine: moves tensor bytes between the training's memory and host slots.
//
// Capture calls Copy() from cairn's capture thread (never the training thread) with the
// chunks of one version; restore calls it to fill the targets. An engine that can checksum
// while it copies (the host engine) fills `checksums`; others leave that to the caller.
// Thread-safety: one Copy() at a time per engine.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <span>
#include <string_view>

#include "core/options.h"
#include "core/status.h"

namespace cairn {

struct CopyChunk {
  const void* src = nullptr;
  void* dst = nullptr;
  size_t bytes = 0;
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
  // it (cudaHostRegister); the host engine does nothing.
  virtual Status RegisterHost(void* p, size_t n) {
    (void)p, (void)n;
    return Status::OK();
  }
  virtual void UnregisterHost(void* p, size_t n) { (void)p, (void)n; }
};

// Copies `n` bytes with non-temporal stores (the destination is not pulled into cache);
// falls back to memcpy for small or unaligned tails. Safe for any alignment.
void StreamingCopy(void* dst, const void* src, size_t n);

// The host engine: `threads` workers (the calling thread plus threads-1 helpers),
// non-temporal copies in sub-blocks of 256 KiB, each checksummed while still in cache.
std::unique_ptr<CopyEngine> MakeHostCopyEngine(int threads);

// True when the CUDA engine is compiled in and a CUDA device is usable.
bool CudaDeviceAvailable();
// The CUDA engine (copy stream, events, pinned slots). Unavailable when built without CUDA
// or when no device is usable (the message says which).
Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads);

// Picks the engine for `kind`: kAuto gives CUDA when a device is usable, else host.
Result<std::unique_ptr<CopyEngine>> MakeCopyEngine(CopyEngineKind kind, int threads);

}  // namespace cairn
