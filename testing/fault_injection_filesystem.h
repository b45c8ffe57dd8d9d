// FaultInjectionFileSystem: a FileSystem wrapper that fails chosen calls, for tests.
//
// Counts the calls of the kinds selected by a mask; the Nth such call (1-based) fails with
// the given errno, and with `persistent` every later one fails too. Calls of other kinds
// and calls before the Nth go to the wrapped filesystem unchanged. Used in the manner of
// SQLite's I/O-error tests: fail the 1st, 2nd, ... call and check nothing was lost.
// Thread-safety: safe from several threads (the counter is atomic).
#pragma once

#include <atomic>
#include <cstdint>

#include "core/filesystem.h"

namespace cairn {

enum FsOp : uint32_t {
  kFsOpen = 1u << 0,
  kFsWrite = 1u << 1,
  kFsRead = 1u << 2,
  kFsSync = 1u << 3,
  kFsTruncate = 1u << 4,
  kFsAllocate = 1u << 5,
  kFsRename = 1u << 6,
  kFsUnlink = 1u << 7,
  kFsMkdir = 1u << 8,
  kFsSyncDir = 1u << 9,
  kFsList = 1u << 10,
  kFsMutating = kFsOpen | kFsWrite | kFsSync | kFsTruncate | kFsAllocate | kFsRename | kFsUnlink |
                kFsMkdir | kFsSyncDir,
  kFsAll = 0x7ff,
};

class FaultInjectionFileSystem final : public ForwardingFileSystem {
 public:
  explicit FaultInjectionFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}

  // Arms the fault: the `nth` (>= 1) call whose kind is in `ops` fails with `err`.
  // Resets the call counter.
  void FailNth(uint64_t nth, int err, bool persistent, uint32_t ops = kFsMutating);
  void Disarm();
  // Calls of the selected kinds seen since the last FailNth/Disarm.
  uint64_t calls() const { return calls_.load(); }
  // Calls that were failed.
  uint64_t failures() const { return failures_.load(); }

  Result<int> Open(const std::string& path, int flags, mode_t mode) override;
  Status WriteAt(int fd, const void* buf, size_t n, uint64_t offset) override;
  Status ReadAt(int fd, void* buf, size_t n, uint64_t offset) override;
  Status Sync(int fd) override;
  Status Truncate(int fd, uint64_t size) override;
  Status Allocate(int fd, uint64_t size) override;
  Status Rename(const std::string& from, const std::string& to) override;
  Status Link(const std::string& from, const std::string& to) override;  // counts as a rename
  Status Unlink(const std::string& path) override;
  Status MakeDirs(const std::string& path, mode_t mode) override;
  Status SyncDir(const std::string& path) override;
  Result<std::vector<std::string>> ListDir(const std::string& path) override;

 private:
  // Non-OK when this call of kind `op` is to fail.
  Status Check(FsOp op, const std::string& what);

  std::atomic<uint64_t> nth_{0};
  std::atomic<int> err_{0};
  std::atomic<bool> persistent_{false};
  std::atomic<uint32_t> ops_{0};
  std::atomic<uint64_t> calls_{0};
  std::atomic<uint64_t> failures_{0};
};

// Counts the descriptors opened and closed through it (a leak shows as open() > 0), and
// can fail every close with `close_errno` (the descriptor is still closed underneath).
class CountingFileSystem final : public ForwardingFileSystem {
 public:
  explicit CountingFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}
  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    auto fd = base_->Open(path, flags, mode);
    if (fd.ok()) opened_.fetch_add(1);
    return fd;
  }
  Status Close(int fd) override {
    closed_.fetch_add(1);
    Status st = base_->Close(fd);
    if (st.ok() && close_errno_ != 0) return Status::FromErrno(close_errno_, "close");
    return st;
  }
  int64_t open() const { return opened_.load() - closed_.load(); }
  int64_t closed() const { return closed_.load(); }
  void FailCloses(int err) { close_errno_ = err; }

 private:
  std::atomic<int64_t> opened_{0};
  std::atomic<int64_t> closed_{0};
  std::atomic<int> close_errno_{0};
};

}  // namespace cairn
