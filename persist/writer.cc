#include "persist/writer.h"

#include <fcntl.h>

#include <algorithm>
#include <atomic>
#include <cerrno>
#include <cstdlib>
#include <cstring>

#include "core/arith.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/kill_point.h"
#include "core/mutex.h"
#include "persist/manifest.h"

namespace cairn {
namespace {

struct FreeDeleter {
  void operator()(void* p) const { std::free(p); }
};

// One unit of work: chunk `chunk` of item `item`.
struct Unit {
  uint32_t item;
  uint32_t chunk;
};

}  // namespace

void RateLimiter::Acquire(uint64_t bytes) {
  if (rate_ == 0 || bytes == 0) return;
  int64_t wait_until;
  {
    MutexLock lk(mu_);
    const int64_t now = NowNanos();
    const int64_t start = std::max(now, next_ns_);
    next_ns_ =
        start + static_cast<int64_t>(static_cast<double>(bytes) * 1e9 / static_cast<double>(rate_));
    wait_until = start;
  }
  const int64_t now = NowNanos();
  if (wait_until > now) std::this_thread::sleep_for(std::chrono::nanoseconds(wait_until - now));
}

uint64_t LayOutItems(std::span<WriteItem> items, uint64_t align) {
  uint64_t off = 0;
  for (WriteItem& it : items) {
    it.file_offset = off;
    off = RoundUp(off + it.nbytes, align);
  }
  return off;
}

namespace {

// The units of `items` (a chunk each), their checksum slots in *report, and whether every
// item starts on a kPfsAlign boundary with a chunk size of such blocks.
std::vector<Unit> CutIntoUnits(std::span<const WriteItem> items, uint64_t chunk,
                               WriteReport* report, bool* aligned) {
  std::vector<Unit> units;
  report->chunk_checksums.resize(items.size());
  *aligned = chunk % kPfsAlign == 0;
  for (size_t i = 0; i < items.size(); ++i) {
    const uint64_t n = CeilDiv(items[i].nbytes, chunk);
    report->chunk_checksums[i].assign(n, 0);
    for (uint64_t c = 0; c < n; ++c)
      units.push_back({static_cast<uint32_t>(i), static_cast<uint32_t>(c)});
    report->bytes += items[i].nbytes;
    *aligned = *aligned && items[i].file_offset % kPfsAlign == 0;
  }
  return units;
}

// Creates `path` for writing, with O_DIRECT where *direct asks and the filesystem takes it
// (*direct says which); a direct file is sized first: direct writes inside the file's
// size may run in parallel (ext4 serialises writes that extend a file).
Result<File> CreateDataFile(FileSystem* fs, const std::string& path,
                            std::span<const WriteItem> items, bool* direct, const Logger* log) {
  Result<File> file = Status::Internal("not opened");
  if (*direct) {
    file =
        fs->OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC | O_DIRECT | O_NOFOLLOW | O_CLOEXEC, 0600);
    if (!file.ok() && file.status().error_number() == EINVAL) {
      if (log) log->Info(path + ": O_DIRECT refused by the filesystem; writing buffered");
      *direct = false;
    }
  }
  if (!*direct)
    file = fs->OpenFile(path, O_WRONLY | O_CREAT | O_TRUNC | O_NOFOLLOW | O_CLOEXEC, 0600);
  if (!file.ok() || !*direct) return file;
  uint64_t end = 0;
  for (const WriteItem& it : items)
    end = std::max(end, it.file_offset + RoundUp(it.nbytes, kPfsAlign));
  Status st = file->Truncate(end);
  if (!st.ok()) {
    (void)file->Close();
    (void)fs->Unlink(path);
    return st.WithContext(path);
  }
  return file;
}

// Checksums and writes every unit on the writer pool (direct: unaligned sources through
// an aligned buffer, one per thread at a time); the first error.
Status WriteUnits(File& f, const std::string& path, std::span<const WriteItem> items,
                  const std::vector<Unit>& units, uint64_t chunk, bool direct,
                  const WriterOptions& options, RateLimiter* limiter, WriteReport* report) {
  std::atomic<bool> failed{false};
  Mutex mu;
  Status first;                                           // under mu
  std::vector<std::unique_ptr<void, FreeDeleter>> spare;  // bounce buffers, under mu
  auto fail = [&](Status st) {
    MutexLock lk(mu);
    if (first.ok()) first = std::move(st);
    failed = true;
  };
  auto write_unit = [&](size_t u) {
    if (failed.load()) return;
    const WriteItem& it = items[units[u].item];
    const uint64_t b = static_cast<uint64_t>(units[u].chunk) * chunk;
    const uint64_t n = std::min(chunk, it.nbytes - b);
    const std::byte* src = it.src + b;
    uint64_t write_n = n;
    const bool aligned_src =
        reinterpret_cast<uintptr_t>(src) % kPfsAlign == 0 && n % kPfsAlign == 0;
    std::unique_ptr<void, FreeDeleter> bounce;
    if (direct && !aligned_src) {  // through an aligned buffer
      {
        MutexLock lk(mu);
        if (!spare.empty()) {
          bounce = std::move(spare.back());
          spare.pop_back();
        }
      }
      void* p = nullptr;
      if (!bounce && posix_memalign(&p, kPfsAlign, chunk) != 0)
        return fail(Status::Internal(path + ": cannot allocate a write buffer"));
      if (!bounce) bounce.reset(p);
      std::memcpy(bounce.get(), src, n);
      write_n = RoundUp(n, kPfsAlign);
      if (write_n > n) std::memset(static_cast<std::byte*>(bounce.get()) + n, 0, write_n - n);
      src = static_cast<const std::byte*>(bounce.get());
    }
    report->chunk_checksums[units[u].item][units[u].chunk] = Checksum(src, n);
    if (options.yield) options.yield();
    if (limiter) limiter->Acquire(write_n);
    Status st = f.WriteAt(src, write_n, it.file_offset + b);
    if (bounce) {
      MutexLock lk(mu);
      spare.push_back(std::move(bounce));
    }
    if (!st.ok()) return fail(std::move(st));
    CAIRN_KILL_POINT("persist.piece_written");
  };
  if (options.pool != nullptr) {
    options.pool->ParallelFor(units.size(), write_unit);
  } else {
    Pool pool("cairn-write", std::clamp(options.threads, 1, 64) - 1);
    pool.ParallelFor(units.size(), write_unit);
  }
  MutexLock lk(mu);
  return first;
}

}  // namespace

Result<WriteReport> WriteDataFile(FileSystem* fs, const std::string& path,
                                  std::span<const WriteItem> items, const WriterOptions& options,
                                  RateLimiter* limiter, const Logger* log) {
  const uint64_t chunk = std::max<uint64_t>(options.chunk_bytes, 1);
  WriteReport report;
  bool aligned = false;
  const std::vector<Unit> units = CutIntoUnits(items, chunk, &report, &aligned);
  bool direct = options.direct && aligned;
  if (options.direct && !aligned && log)
    log->Warning(path + ": chunk size or offsets not 4 KiB aligned; writing without O_DIRECT");
  CAIRN_ASSIGN_OR_RETURN(File f, CreateDataFile(fs, path, items, &direct, log));
  report.direct = direct;
  Status st = WriteUnits(f, path, items, units, chunk, direct, options, limiter, &report);
  if (st.ok()) st = f.Sync();
  if (st.ok()) CAIRN_KILL_POINT("persist.file_synced");
  if (!st.ok()) {
    (void)f.Close();
    (void)fs->Unlink(path);
    return st.WithContext(path);  // "<file>: write: No space left on device"
  }
  st = f.Close();  // the error names the file
  if (!st.ok()) {
    (void)fs->Unlink(path);
    return st;
  }
  return report;
}

}  // namespace cairn
