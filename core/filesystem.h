// FileSystem: the seam through which cairn touches files.
//
// All file access of the tiers and (later) the PFS writers goes through this interface, so
// tests can wrap it (FaultInjectionFileSystem) to fail the Nth call or run out of space.
// Paths are absolute or relative to the working directory. Code opens files with
// OpenFile(), which hands out a File that closes itself; the descriptor calls below are
// the primitives a wrapper overrides (descriptors are POSIX fds so that a tier can map
// them with libpmem2).
// Thread-safety: implementations must be safe to call from several threads at once.
#pragma once

#include <sys/types.h>

#include <cstdint>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/status.h"

namespace cairn {

// What Stat() reports of a path.
struct FileInfo {
  uint32_t uid = 0;   // owner
  uint32_t mode = 0;  // permission bits and type (st_mode)
  uint64_t size = 0;
};

class File;

class FileSystem {
 public:
  virtual ~FileSystem() = default;

  // Opens `path` with open(2) flags and mode (through Open below). The File closes the
  // descriptor when it goes.
  Result<File> OpenFile(const std::string& path, int flags, mode_t mode);

  // Opens `path` with open(2) flags and mode; on success returns the descriptor.
  virtual Result<int> Open(const std::string& path, int flags, mode_t mode) = 0;
  virtual Status Close(int fd) = 0;
  // Writes all `n` bytes at `offset` (retrying short writes).
  virtual Status WriteAt(int fd, const void* buf, size_t n, uint64_t offset) = 0;
  // Reads exactly `n` bytes at `offset`; Corruption if the file ends first.
  virtual Status ReadAt(int fd, void* buf, size_t n, uint64_t offset) = 0;
  virtual Status Sync(int fd) = 0;
  virtual Status Truncate(int fd, uint64_t size) = 0;
  // Reserves backing store for [0, size) (fallocate), so that a later store through a
  // mapping cannot fail with SIGBUS for lack of space: ENOSPC is reported here instead.
  virtual Status Allocate(int fd, uint64_t size) = 0;
  virtual Result<uint64_t> FileSize(int fd) = 0;
  virtual Status Rename(const std::string& from, const std::string& to) = 0;
  // Hard link: fails with EEXIST (Status::error_number()) when `to` exists.
  virtual Status Link(const std::string& from, const std::string& to) = 0;
  // NotFound when `path` does not exist. Follows symbolic links.
  virtual Result<FileInfo> Stat(const std::string& path) = 0;
  // As Stat, but a symbolic link is reported as itself (lstat).
  virtual Result<FileInfo> LinkStat(const std::string& path) = 0;
  // What the open descriptor `fd` is (fstat): the file actually opened, whatever its path
  // names by now.
  virtual Result<FileInfo> FileStat(int fd) = 0;
  // Bytes an unprivileged writer can still allocate on the filesystem holding `path`.
  virtual Result<uint64_t> FreeBytes(const std::string& path) = 0;
  virtual Status Unlink(const std::string& path) = 0;
  // Creates `path` and its missing parents with `mode`; OK if it exists as a directory.
  virtual Status MakeDirs(const std::string& path, mode_t mode) = 0;
  // fsyncs a directory, making renames and creations in it durable.
  virtual Status SyncDir(const std::string& path) = 0;
  // Names in a directory, without "." and "..".
  virtual Result<std::vector<std::string>> ListDir(const std::string& path) = 0;
  virtual bool Exists(const std::string& path) = 0;
  // Removes a file or a directory tree; OK if it does not exist.
  virtual Status RemoveAll(const std::string& path) = 0;
};

// An open file of a FileSystem: closes its descriptor when destroyed (ignoring the
// result; call Close() where a close error matters, as after writes). Move-only.
// Thread-safety: positional reads and writes may run from several threads at once.
class File {
 public:
  File() = default;
  File(FileSystem* fs, int fd, std::string path) : fs_(fs), fd_(fd), path_(std::move(path)) {}
  File(File&& o) noexcept { *this = std::move(o); }
  File& operator=(File&& o) noexcept;
  File(const File&) = delete;
  File& operator=(const File&) = delete;
  ~File() { (void)Close(); }

  bool is_open() const { return fd_ >= 0; }
  int fd() const { return fd_; }
  const std::string& path() const { return path_; }

  Status WriteAt(const void* buf, size_t n, uint64_t offset) {
    return fs_->WriteAt(fd_, buf, n, offset);
  }
  Status ReadAt(void* buf, size_t n, uint64_t offset) { return fs_->ReadAt(fd_, buf, n, offset); }
  Status Sync() { return fs_->Sync(fd_); }
  Status Truncate(uint64_t size) { return fs_->Truncate(fd_, size); }
  Status Allocate(uint64_t size) { return fs_->Allocate(fd_, size); }
  Result<uint64_t> Size() { return fs_->FileSize(fd_); }
  // Closes now; OK if already closed. The error names the path.
  Status Close();

 private:
  FileSystem* fs_ = nullptr;
  int fd_ = -1;
  std::string path_;
};

// A FileSystem that passes every call to `base`: wrappers (fault injection, test gates)
// derive from it and override only the calls they change.
class ForwardingFileSystem : public FileSystem {
 public:
  explicit ForwardingFileSystem(FileSystem* base) : base_(base) {}
  Result<int> Open(const std::string& p, int flags, mode_t mode) override {
    return base_->Open(p, flags, mode);
  }
  Status Close(int fd) override { return base_->Close(fd); }
  Status WriteAt(int fd, const void* buf, size_t n, uint64_t off) override {
    return base_->WriteAt(fd, buf, n, off);
  }
  Status ReadAt(int fd, void* buf, size_t n, uint64_t off) override {
    return base_->ReadAt(fd, buf, n, off);
  }
  Status Sync(int fd) override { return base_->Sync(fd); }
  Status Truncate(int fd, uint64_t size) override { return base_->Truncate(fd, size); }
  Status Allocate(int fd, uint64_t size) override { return base_->Allocate(fd, size); }
  Result<uint64_t> FileSize(int fd) override { return base_->FileSize(fd); }
  Status Rename(const std::string& from, const std::string& to) override {
    return base_->Rename(from, to);
  }
  Status Link(const std::string& from, const std::string& to) override {
    return base_->Link(from, to);
  }
  Result<FileInfo> Stat(const std::string& p) override { return base_->Stat(p); }
  Result<FileInfo> LinkStat(const std::string& p) override { return base_->LinkStat(p); }
  Result<FileInfo> FileStat(int fd) override { return base_->FileStat(fd); }
  Result<uint64_t> FreeBytes(const std::string& p) override { return base_->FreeBytes(p); }
  Status Unlink(const std::string& p) override { return base_->Unlink(p); }
  Status MakeDirs(const std::string& p, mode_t mode) override { return base_->MakeDirs(p, mode); }
  Status SyncDir(const std::string& p) override { return base_->SyncDir(p); }
  Result<std::vector<std::string>> ListDir(const std::string& p) override {
    return base_->ListDir(p);
  }
  bool Exists(const std::string& p) override { return base_->Exists(p); }
  Status RemoveAll(const std::string& p) override { return base_->RemoveAll(p); }

 protected:
  FileSystem* base_;
};

// The POSIX filesystem. Stateless; the returned object lives for the whole process.
FileSystem* DefaultFileSystem();

// Publishes `bytes` at `path` atomically: writes "<path>.tmp.<pid>", fsyncs it, renames it
// over `path` and fsyncs the directory. On any failure the temporary file is removed and
// `path` is left as it was (old contents or absent). Files are created with mode 0600.
Status WriteFileAtomic(FileSystem* fs, const std::string& path, std::string_view bytes);

// Whether a filesystem call's error may go away by itself: a networked filesystem's client
// that lost its servers and is reconnecting (ENOTCONN: a FUSE client such as GlusterFS's
// right after its link came back), a stale handle or a timed-out call (ESTALE, ETIMEDOUT:
// NFS). Not EIO, ENOSPC or EACCES: those are answers.
bool TransientFsError(const Status& st);

// Reads a whole file (at most `max_bytes`; Corruption naming the file if it is larger).
Result<std::string> ReadWholeFile(FileSystem* fs, const std::string& path, uint64_t max_bytes);
// The same for a file already open (errors name its path).
Result<std::string> ReadAll(File& f, uint64_t max_bytes);

// "a/b" + "c" -> "a/b/c".
std::string JoinPath(const std::string& a, const std::string& b);
// The directory part of a path ("a/b/c" -> "a/b", "c" -> ".").
std::string DirName(const std::string& path);

}  // namespace cairn
