// PowerLossFileSystem: a FileSystem wrapper for tests that can lose what was not synced, as
// a power cut would (in the manner of LevelDB's fault-injection test environment).
//
// It remembers, per file, the size at its last fsync, and the directory operations
// (created files, renames) not yet made durable by an fsync of their directory. After
// CrashAfter(n) the n-th later mutating call and all calls after it fail (the machine
// stopped). DropUnsyncedData() then undoes what a power cut may undo: files written since
// their last fsync are cut back to their synced size; renames whose target directory was
// not synced are undone in reverse order (an overwritten target gets its old bytes back);
// files created in a directory that was not synced since disappear. Simplifications: data
// overwritten inside the synced size is kept; unlinks and new directories count as durable.
// Thread-safety: one mutex around the bookkeeping.
#pragma once

#include <fcntl.h>

#include <map>
#include <mutex>
#include <optional>
#include <string>
#include <vector>

#include "core/filesystem.h"

namespace cairn::testing {

class PowerLossFileSystem final : public ForwardingFileSystem {
 public:
  explicit PowerLossFileSystem(FileSystem* base) : ForwardingFileSystem(base) {}

  // The n-th (>= 1) mutating call from now on, and every call after it, fails with EIO.
  void CrashAfter(uint64_t n) {
    std::lock_guard lk(mu_);
    countdown_ = n;
  }
  bool crashed() const {
    std::lock_guard lk(mu_);
    return crashed_;
  }
  uint64_t mutating_calls() const {
    std::lock_guard lk(mu_);
    return calls_;
  }

  // Undoes what was not durable, then forgets the crash (the machine is back).
  void DropUnsyncedData() {
    std::lock_guard lk(mu_);
    for (auto it = renames_.rbegin(); it != renames_.rend(); ++it) {
      (void)base_->Rename(it->to, it->from);
      if (it->old_target) WriteBack(it->to, *it->old_target);
    }
    renames_.clear();
    for (const std::string& p : created_)
      if (base_->Exists(p)) (void)base_->Unlink(p);
    created_.clear();
    for (const auto& [path, synced] : synced_size_) {
      auto fd = base_->Open(path, O_WRONLY, 0600);
      if (!fd.ok()) continue;
      (void)base_->Truncate(*fd, synced);
      (void)base_->Close(*fd);
    }
    synced_size_.clear();
    fd_path_.clear();
    crashed_ = false;
    countdown_ = 0;
  }

  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    std::lock_guard lk(mu_);
    const bool mutating = (flags & (O_WRONLY | O_RDWR | O_CREAT)) != 0;
    if (mutating) CAIRN_RETURN_IF_ERROR(Tick("open " + path));
    const bool existed = base_->Exists(path);
    auto fd = base_->Open(path, flags, mode);
    if (!fd.ok()) return fd;
    fd_path_[*fd] = path;
    if (!existed && (flags & O_CREAT)) {
      created_.push_back(path);
      synced_size_[path] = 0;
    } else if (mutating && !synced_size_.count(path)) {
      auto size = base_->FileSize(*fd);
      synced_size_[path] = size.ok() ? *size : 0;
    }
    return fd;
  }
  Status Close(int fd) override {
    std::lock_guard lk(mu_);
    fd_path_.erase(fd);
    return base_->Close(fd);  // closing never fails the test's "machine"
  }
  Status WriteAt(int fd, const void* buf, size_t n, uint64_t off) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("write"));
    return base_->WriteAt(fd, buf, n, off);
  }
  Status Truncate(int fd, uint64_t size) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("truncate"));
    return base_->Truncate(fd, size);
  }
  Status Allocate(int fd, uint64_t size) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("allocate"));
    return base_->Allocate(fd, size);
  }
  Status Sync(int fd) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("fsync"));
    CAIRN_RETURN_IF_ERROR(base_->Sync(fd));
    auto it = fd_path_.find(fd);
    if (it != fd_path_.end()) {
      auto size = base_->FileSize(fd);
      if (size.ok()) synced_size_[it->second] = *size;
    }
    return Status::OK();
  }
  Status Rename(const std::string& from, const std::string& to) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("rename " + from));
    std::optional<std::string> old;
    if (base_->Exists(to)) {
      auto bytes = ReadWholeFile(base_, to, 1ull << 30);
      if (bytes.ok()) old = *bytes;
    }
    CAIRN_RETURN_IF_ERROR(base_->Rename(from, to));
    renames_.push_back({from, to, std::move(old)});
    // The file's own sync state moves with it.
    if (auto it = synced_size_.find(from); it != synced_size_.end()) {
      synced_size_[to] = it->second;
      synced_size_.erase(it);
    }
    // created_ keeps the old name: undoing the rename (first) brings the file back there.
    return Status::OK();
  }
  Status Unlink(const std::string& path) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("unlink " + path));
    synced_size_.erase(path);
    return base_->Unlink(path);
  }
  Status MakeDirs(const std::string& path, mode_t mode) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("mkdir " + path));
    return base_->MakeDirs(path, mode);
  }
  Status SyncDir(const std::string& dir) override {
    std::lock_guard lk(mu_);
    CAIRN_RETURN_IF_ERROR(Tick("fsync dir " + dir));
    CAIRN_RETURN_IF_ERROR(base_->SyncDir(dir));
    // Entries in `dir` are durable now.
    std::vector<Renamed> keep;
    for (Renamed& r : renames_)
      if (DirName(r.to) != dir) keep.push_back(std::move(r));
    renames_ = std::move(keep);
    std::vector<std::string> still;
    for (const std::string& p : created_)
      if (DirName(p) != dir) still.push_back(p);
    created_ = std::move(still);
    return Status::OK();
  }

 private:
  struct Renamed {
    std::string from, to;
    std::optional<std::string> old_target;
  };

  Status Tick(const std::string& what) {
    ++calls_;
    if (crashed_) return Status::FromErrno(EIO, "power lost before " + what);
    if (countdown_ > 0 && --countdown_ == 0) {
      crashed_ = true;
      return Status::FromErrno(EIO, "power lost at " + what);
    }
    return Status::OK();
  }
  void WriteBack(const std::string& path, const std::string& bytes) {
    auto fd = base_->Open(path, O_WRONLY | O_CREAT | O_TRUNC, 0600);
    if (!fd.ok()) return;
    (void)base_->WriteAt(*fd, bytes.data(), bytes.size(), 0);
    (void)base_->Close(*fd);
  }

  mutable std::mutex mu_;
  uint64_t countdown_ = 0, calls_ = 0;
  bool crashed_ = false;
  std::map<int, std::string> fd_path_;
  std::map<std::string, uint64_t> synced_size_;  // of files opened for writing
  std::vector<std::string> created_;
  std::vector<Renamed> renames_;
};

}  // namespace cairn::testing
