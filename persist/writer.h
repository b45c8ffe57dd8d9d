// Writing a rank's data file on the parallel filesystem.
//
// Items (the bytes of planned boxes and blobs) are written at their file offsets in
// chunk-sized sequential writes by a bounded number of threads, each chunk checksummed
// (XXH3) from the bytes actually handed to the kernel; then the file is fsynced. With
// `direct` the file is opened O_DIRECT; chunks whose memory and length are 4 KiB aligned
// are written straight from the source, others through an aligned buffer (a filesystem
// that refuses O_DIRECT, such as tmpfs, falls back to buffered writes). The source must
// not change while it is written (the persister writes from pinned host slots). A RateLimiter caps
// the bytes per second so draining does not starve training of bandwidth.
// Thread-safety: WriteDataFile may run concurrently for different files; one RateLimiter
// may be shared by all writers of a process.
#pragma once

#include <cstddef>
#include <cstdint>
#include <functional>
#include <span>
#include <string>
#include <vector>

#include "cairn/status.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "core/mutex.h"
#include "core/pool.h"

namespace cairn {

// Caps throughput at `bytes_per_s` (0: unlimited) over all callers.
class RateLimiter {
 public:
  explicit RateLimiter(uint64_t bytes_per_s) : rate_(bytes_per_s) {}
  // Sleeps as long as needed so that `bytes` more stay within the rate.
  void Acquire(uint64_t bytes);
  uint64_t rate() const { return rate_; }

 private:
  uint64_t rate_;
  Mutex mu_;
  int64_t next_ns_ CAIRN_GUARDED_BY(mu_) = 0;  // when the budget is next free (monotonic clock)
};

struct WriteItem {
  const std::byte* src = nullptr;
  uint64_t nbytes = 0;
  uint64_t file_offset = 0;  // a multiple of kPfsAlign when direct I/O is wanted
};

struct WriterOptions {
  // Threads that checksum and write, the calling thread among them: those of `pool` and
  // the caller when a pool is given (the persister's, at the drain's priority), else a pool
  // of threads - 1 started for the one file.
  int threads = 1;
  Pool* pool = nullptr;
  bool direct = false;
  uint64_t chunk_bytes = 4ull << 20;  // write and checksum unit
  // Called before each chunk; may block for a while to let more urgent work run (the
  // Checkpointer holds drains back while a capture is copying). Optional.
  std::function<void()> yield;
};

struct WriteReport {
  // Per item, the XXH3 of each chunk_bytes-sized chunk (the last may be shorter).
  std::vector<std::vector<uint64_t>> chunk_checksums;
  uint64_t bytes = 0;
  bool direct = false;  // whether O_DIRECT was used
};

// Creates `path` (0600, replacing any old file), writes every item, fsyncs and closes it.
// On failure the file is removed (best effort) and the error names the file and the call.
Result<WriteReport> WriteDataFile(FileSystem* fs, const std::string& path,
                                  std::span<const WriteItem> items, const WriterOptions& options,
                                  RateLimiter* limiter, const Logger* log);

// The size a data file needs for `items` laid end to end from offset 0, each aligned.
uint64_t LayOutItems(std::span<WriteItem> items, uint64_t align);

}  // namespace cairn
