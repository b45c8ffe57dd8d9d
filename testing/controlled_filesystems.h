// Filesystems a test controls, for the seam of api/open_with.h: one whose renames wait at
// a gate (a capture held inside its slot's Prepare), one whose writes wait until released
// (a persist stuck on a slow PFS), one that reports little free space (a small tmpfs or a
// quota). Thread-safety: the gates may be opened from any thread.
#pragma once

#include <atomic>
#include <condition_variable>
#include <cstdint>
#include <mutex>
#include <string>

#include "core/filesystem.h"

namespace cairn::testing {

// Threads that call Pass() wait while the gate is closed.
class Gate {
 public:
  explicit Gate(bool open) : open_(open) {}
  void Close() {
    std::lock_guard lk(mu_);
    open_ = false;
  }
  void Open() {
    std::lock_guard lk(mu_);
    open_ = true;
    cv_.notify_all();
  }
  void Pass() {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return open_; });
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool open_;
};

// A FileSystem whose renames wait at a gate: holds a capture inside Prepare.
class GateFileSystem final : public ForwardingFileSystem {
 public:
  explicit GateFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}
  void Close_() { gate_.Close(); }
  void Open_() { gate_.Open(); }
  Status Rename(const std::string& a, const std::string& b) override {
    gate_.Pass();
    return base_->Rename(a, b);
  }

 private:
  Gate gate_{true};
};

// A filesystem reporting `free` bytes available (what a small tmpfs or quota shows).
class ShortFileSystem final : public ForwardingFileSystem {
 public:
  ShortFileSystem(FileSystem* base, uint64_t free) : ForwardingFileSystem(base), free_(free) {}
  Result<uint64_t> FreeBytes(const std::string&) override { return free_; }

 private:
  uint64_t free_;
};

// A filesystem whose writes wait until released: a persist stuck on a slow PFS.
class StuckFileSystem final : public ForwardingFileSystem {
 public:
  explicit StuckFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}
  void Release() { gate_.Open(); }
  bool entered() const { return entered_.load(); }
  Status WriteAt(int fd, const void* b, size_t n, uint64_t o) override {
    entered_ = true;
    gate_.Pass();
    return base_->WriteAt(fd, b, n, o);
  }

 private:
  Gate gate_{false};
  std::atomic<bool> entered_{false};
};

}  // namespace cairn::testing
