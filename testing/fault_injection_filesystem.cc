#include "testing/fault_injection_filesystem.h"

namespace cairn {

void FaultInjectionFileSystem::FailNth(uint64_t nth, int err, bool persistent, uint32_t ops) {
  ops_ = 0;
  calls_ = 0;
  failures_ = 0;
  nth_ = nth;
  err_ = err;
  persistent_ = persistent;
  ops_ = ops;
}

void FaultInjectionFileSystem::Disarm() {
  ops_ = 0;
  calls_ = 0;
}

Status FaultInjectionFileSystem::Check(FsOp op, const std::string& what) {
  if ((ops_.load() & op) == 0) return Status::OK();
  uint64_t n = ++calls_;
  uint64_t nth = nth_.load();
  if (nth == 0) return Status::OK();
  if (n == nth || (persistent_.load() && n > nth)) {
    ++failures_;
    return Status::FromErrno(err_.load(), "injected fault in " + what);
  }
  return Status::OK();
}

Result<int> FaultInjectionFileSystem::Open(const std::string& path, int flags, mode_t mode) {
  CAIRN_RETURN_IF_ERROR(Check(kFsOpen, "open " + path));
  return base_->Open(path, flags, mode);
}
Status FaultInjectionFileSystem::WriteAt(int fd, const void* buf, size_t n, uint64_t offset) {
  CAIRN_RETURN_IF_ERROR(Check(kFsWrite, "write"));
  return base_->WriteAt(fd, buf, n, offset);
}
Status FaultInjectionFileSystem::ReadAt(int fd, void* buf, size_t n, uint64_t offset) {
  CAIRN_RETURN_IF_ERROR(Check(kFsRead, "read"));
  return base_->ReadAt(fd, buf, n, offset);
}
Status FaultInjectionFileSystem::Sync(int fd) {
  CAIRN_RETURN_IF_ERROR(Check(kFsSync, "fsync"));
  return base_->Sync(fd);
}
Status FaultInjectionFileSystem::Truncate(int fd, uint64_t size) {
  CAIRN_RETURN_IF_ERROR(Check(kFsTruncate, "ftruncate"));
  return base_->Truncate(fd, size);
}
Status FaultInjectionFileSystem::Allocate(int fd, uint64_t size) {
  CAIRN_RETURN_IF_ERROR(Check(kFsAllocate, "fallocate"));
  return base_->Allocate(fd, size);
}
Status FaultInjectionFileSystem::Link(const std::string& from, const std::string& to) {
  CAIRN_RETURN_IF_ERROR(Check(kFsRename, "link " + to));
  return base_->Link(from, to);
}

Status FaultInjectionFileSystem::Rename(const std::string& from, const std::string& to) {
  CAIRN_RETURN_IF_ERROR(Check(kFsRename, "rename " + from));
  return base_->Rename(from, to);
}
Status FaultInjectionFileSystem::Unlink(const std::string& path) {
  CAIRN_RETURN_IF_ERROR(Check(kFsUnlink, "unlink " + path));
  return base_->Unlink(path);
}
Status FaultInjectionFileSystem::MakeDirs(const std::string& path, mode_t mode) {
  CAIRN_RETURN_IF_ERROR(Check(kFsMkdir, "mkdir " + path));
  return base_->MakeDirs(path, mode);
}
Status FaultInjectionFileSystem::SyncDir(const std::string& path) {
  CAIRN_RETURN_IF_ERROR(Check(kFsSyncDir, "fsync directory " + path));
  return base_->SyncDir(path);
}
Result<std::vector<std::string>> FaultInjectionFileSystem::ListDir(const std::string& path) {
  CAIRN_RETURN_IF_ERROR(Check(kFsList, "list " + path));
  return base_->ListDir(path);
}

}  // namespace cairn
