#include "core/filesystem.h"

#include <dirent.h>
#include <fcntl.h>
#include <sys/stat.h>
#include <sys/statvfs.h>
#include <unistd.h>

#include <cerrno>
#include <chrono>
#include <cstring>
#include <thread>

#include "core/kill_point.h"

namespace cairn {
namespace {

FileInfo InfoOf(const struct stat& st) {
  return FileInfo{static_cast<uint32_t>(st.st_uid), static_cast<uint32_t>(st.st_mode),
                  static_cast<uint64_t>(st.st_size)};
}

class PosixFileSystem final : public FileSystem {
 public:
  Result<int> Open(const std::string& path, int flags, mode_t mode) override {
    int fd = ::open(path.c_str(), flags | O_CLOEXEC, mode);
    if (fd < 0) return Status::FromErrno(errno, "open " + path);
    return fd;
  }
  Status Close(int fd) override {
    if (::close(fd) != 0) return Status::FromErrno(errno, "close");
    return Status::OK();
  }
  Status WriteAt(int fd, const void* buf, size_t n, uint64_t offset) override {
    const char* p = static_cast<const char*>(buf);
    while (n > 0) {
      ssize_t w = ::pwrite(fd, p, n, static_cast<off_t>(offset));
      if (w < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "write");
      }
      p += w;
      n -= static_cast<size_t>(w);
      offset += static_cast<uint64_t>(w);
    }
    return Status::OK();
  }
  Status ReadAt(int fd, void* buf, size_t n, uint64_t offset) override {
    char* p = static_cast<char*>(buf);
    while (n > 0) {
      ssize_t r = ::pread(fd, p, n, static_cast<off_t>(offset));
      if (r < 0) {
        if (errno == EINTR) continue;
        return Status::FromErrno(errno, "read");
      }
      if (r == 0) return Status::Corruption("file ends early (truncated)");
      p += r;
      n -= static_cast<size_t>(r);
      offset += static_cast<uint64_t>(r);
    }
    return Status::OK();
  }
  Status Sync(int fd) override {
    if (::fsync(fd) != 0) return Status::FromErrno(errno, "fsync");
    return Status::OK();
  }
  Status Truncate(int fd, uint64_t size) override {
    if (::ftruncate(fd, static_cast<off_t>(size)) != 0)
      return Status::FromErrno(errno, "ftruncate");
    return Status::OK();
  }
  Status Allocate(int fd, uint64_t size) override {
    int rc = ::posix_fallocate(fd, 0, static_cast<off_t>(size));
    if (rc != 0) return Status::FromErrno(rc, "fallocate " + std::to_string(size) + " bytes");
    return Status::OK();
  }
  Result<uint64_t> FileSize(int fd) override {
    struct stat st;
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat");
    return static_cast<uint64_t>(st.st_size);
  }
  Status Rename(const std::string& from, const std::string& to) override {
    if (::rename(from.c_str(), to.c_str()) != 0)
      return Status::FromErrno(errno, "rename " + from + " -> " + to);
    return Status::OK();
  }
  Status Link(const std::string& from, const std::string& to) override {
    if (::link(from.c_str(), to.c_str()) != 0) return Status::FromErrno(errno, "link " + to);
    return Status::OK();
  }
  Result<FileInfo> Stat(const std::string& path) override {
    struct stat st;
    if (::stat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "stat " + path);
    return InfoOf(st);
  }
  Result<FileInfo> LinkStat(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) return Status::FromErrno(errno, "lstat " + path);
    return InfoOf(st);
  }
  Result<FileInfo> FileStat(int fd) override {
    struct stat st;
    if (::fstat(fd, &st) != 0) return Status::FromErrno(errno, "fstat");
    return InfoOf(st);
  }
  Result<uint64_t> FreeBytes(const std::string& path) override {
    struct statvfs st;
    if (::statvfs(path.c_str(), &st) != 0) return Status::FromErrno(errno, "statvfs " + path);
    return static_cast<uint64_t>(st.f_bavail) * static_cast<uint64_t>(st.f_frsize);
  }
  Status Unlink(const std::string& path) override {
    if (::unlink(path.c_str()) != 0) return Status::FromErrno(errno, "unlink " + path);
    return Status::OK();
  }
  Status MakeDirs(const std::string& path, mode_t mode) override {
    if (path.empty()) return Status::InvalidArgument("empty directory path");
    struct stat st;
    if (::stat(path.c_str(), &st) == 0) {
      if (S_ISDIR(st.st_mode)) return Status::OK();
      return Status::IOError("mkdir " + path + ": exists and is not a directory");
    }
    std::string parent = DirName(path);
    for (int attempt = 0;; ++attempt) {
      if (parent != path && parent != "." && parent != "/")
        CAIRN_RETURN_IF_ERROR(MakeDirs(parent, mode));
      // ENOENT with the parent there, or EEXIST for a directory a stat cannot find yet: on a
      // GlusterFS distributed volume, a directory that another client is making at the same
      // moment is not yet on every server (two ranks making the job directory or its
      // rendezvous directory through their own mounts; about 1 start in 3). Tried again
      // for about a second, until the directory is there to be used.
      if (::mkdir(path.c_str(), mode) == 0) return Status::OK();
      int err = errno;
      if (err == EEXIST) {  // (a link there, even a dangling one, is the caller's to judge)
        if (::lstat(path.c_str(), &st) == 0) return Status::OK();
        err = errno;
      }
      if (err != ENOENT || attempt >= 6) return Status::FromErrno(err, "mkdir " + path);
      std::this_thread::sleep_for(std::chrono::milliseconds(10 << attempt));
    }
  }
  Status SyncDir(const std::string& path) override {
    int fd = ::open(path.c_str(), O_RDONLY | O_DIRECTORY | O_CLOEXEC);
    if (fd < 0) return Status::FromErrno(errno, "open directory " + path);
    int rc = ::fsync(fd);
    int err = errno;
    ::close(fd);
    if (rc != 0) return Status::FromErrno(err, "fsync directory " + path);
    return Status::OK();
  }
  Result<std::vector<std::string>> ListDir(const std::string& path) override {
    DIR* d = ::opendir(path.c_str());
    if (!d) return Status::FromErrno(errno, "list " + path);
    std::vector<std::string> names;
    while (struct dirent* e = ::readdir(d)) {
      if (std::strcmp(e->d_name, ".") == 0 || std::strcmp(e->d_name, "..") == 0) continue;
      names.emplace_back(e->d_name);
    }
    ::closedir(d);
    return names;
  }
  bool Exists(const std::string& path) override {
    struct stat st;
    return ::lstat(path.c_str(), &st) == 0;
  }
  Status RemoveAll(const std::string& path) override {
    struct stat st;
    if (::lstat(path.c_str(), &st) != 0) {
      if (errno == ENOENT) return Status::OK();
      return Status::FromErrno(errno, "stat " + path);
    }
    if (S_ISDIR(st.st_mode)) {
      CAIRN_ASSIGN_OR_RETURN(auto names, ListDir(path));
      for (const auto& n : names) CAIRN_RETURN_IF_ERROR(RemoveAll(JoinPath(path, n)));
      if (::rmdir(path.c_str()) != 0 && errno != ENOENT)
        return Status::FromErrno(errno, "rmdir " + path);
      return Status::OK();
    }
    if (::unlink(path.c_str()) != 0 && errno != ENOENT)
      return Status::FromErrno(errno, "unlink " + path);
    return Status::OK();
  }
};

}  // namespace

FileSystem* DefaultFileSystem() {
  static PosixFileSystem fs;
  return &fs;
}

std::string JoinPath(const std::string& a, const std::string& b) {
  if (a.empty()) return b;
  if (a.back() == '/') return a + b;
  return a + "/" + b;
}

std::string DirName(const std::string& path) {
  size_t pos = path.find_last_of('/');
  if (pos == std::string::npos) return ".";
  if (pos == 0) return "/";
  return path.substr(0, pos);
}

Result<File> FileSystem::OpenFile(const std::string& path, int flags, mode_t mode) {
  CAIRN_ASSIGN_OR_RETURN(int fd, Open(path, flags, mode));
  return File(this, fd, path);
}

File& File::operator=(File&& o) noexcept {
  if (this != &o) {
    (void)Close();
    fs_ = std::exchange(o.fs_, nullptr);
    fd_ = std::exchange(o.fd_, -1);
    path_ = std::move(o.path_);
  }
  return *this;
}

Status File::Close() {
  if (fd_ < 0) return Status::OK();
  const int fd = std::exchange(fd_, -1);
  return fs_->Close(fd).WithContext(path_);
}

bool TransientFsError(const Status& st) {
  const int e = st.error_number();
  return !st.ok() && (e == ENOTCONN || e == ESTALE || e == ETIMEDOUT);
}

namespace {

// Writes `bytes` to the new file `tmp` (never a link or a file already there: a stale
// temporary of an earlier process with this pid is removed first; writing through a link
// someone put there would overwrite whatever it points to), fsyncs and closes it.
Status WriteTemporary(FileSystem* fs, const std::string& tmp, std::string_view bytes) {
  const int create = O_WRONLY | O_CREAT | O_EXCL | O_NOFOLLOW;
  auto opened = fs->OpenFile(tmp, create, 0600);
  if (!opened.ok() && opened.status().error_number() == EEXIST) {
    (void)fs->Unlink(tmp);
    opened = fs->OpenFile(tmp, create, 0600);
  }
  if (!opened.ok()) return opened.status();
  File f = std::move(*opened);
  Status st = f.WriteAt(bytes.data(), bytes.size(), 0).WithContext(tmp);
  if (st.ok()) st = f.Sync().WithContext(tmp);
  Status cst = f.Close();
  return st.ok() ? cst : st;
}

}  // namespace

Status WriteFileAtomic(FileSystem* fs, const std::string& path, std::string_view bytes) {
  // rename(2) over a file never fails with EEXIST on POSIX, but it does on a GlusterFS
  // distributed volume after a storage server died in the middle of an earlier rename
  // between the same names (a stale DHT link file: found with a server frozen during
  // drains, after which every commit's LATEST rename failed). The names hash elsewhere
  // with another temporary name: the bytes go again under a few others.
  constexpr int kNames = 4;
  Status st;
  for (int k = 0; k < kNames; ++k) {
    const std::string tmp = path + ".tmp." + std::to_string(::getpid()) +
                            (k == 0 ? std::string() : "." + std::to_string(k));
    st = WriteTemporary(fs, tmp, bytes);
    if (st.ok()) CAIRN_KILL_POINT("atomic.tmp_synced");
    if (st.ok()) st = fs->Rename(tmp, path);
    if (!st.ok()) (void)fs->Unlink(tmp);  // best effort: never leave a temporary behind
    if (st.ok() || st.error_number() != EEXIST) break;
  }
  if (!st.ok()) return st;
  CAIRN_KILL_POINT("atomic.renamed");
  return fs->SyncDir(DirName(path));
}

Result<std::string> ReadWholeFile(FileSystem* fs, const std::string& path, uint64_t max_bytes) {
  CAIRN_ASSIGN_OR_RETURN(File f, fs->OpenFile(path, O_RDONLY, 0));
  return ReadAll(f, max_bytes);
}

Result<std::string> ReadAll(File& f, uint64_t max_bytes) {
  const std::string& path = f.path();
  auto size = f.Size();
  if (!size.ok()) return size.status().WithContext(path);
  if (*size > max_bytes)
    return Status::Corruption(path + ": file of " + std::to_string(*size) +
                              " bytes is larger than the limit of " + std::to_string(max_bytes));
  std::string out(*size, '\0');
  CAIRN_RETURN_IF_ERROR(f.ReadAt(out.data(), out.size(), 0).WithContext(path));
  return out;
}

}  // namespace cairn
