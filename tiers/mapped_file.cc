#include "tiers/mapped_file.h"

#include <fcntl.h>
#include <libpmem2.h>
#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>

#include "core/host_pages.h"
#include "core/trusted_path.h"

namespace cairn {
namespace {

Status Pmem2Error(const std::string& what, const std::string& path) {
  return Status::IOError(what + " " + path + ": " + pmem2_errormsg());
}

}  // namespace

Result<std::unique_ptr<MappedFile>> MappedFile::Open(FileSystem* fs, const std::string& path) {
  CAIRN_ASSIGN_OR_RETURN(File file, OpenOwnFile(fs, path, O_RDWR | O_CREAT, 0600));
  std::unique_ptr<MappedFile> f(new MappedFile(path, std::move(file)));
  CAIRN_ASSIGN_OR_RETURN(uint64_t size, f->file_.Size());
  if (size > 0) CAIRN_RETURN_IF_ERROR(f->Map(size));
  return f;
}

MappedFile::~MappedFile() {
  Unmap();
}

Status MappedFile::Map(uint64_t size) {
  pmem2_config* cfg = nullptr;
  pmem2_source* src = nullptr;
  if (pmem2_config_new(&cfg) != 0) return Pmem2Error("pmem2_config_new for", path_);
  Status st;
  if (pmem2_config_set_required_store_granularity(cfg, PMEM2_GRANULARITY_PAGE) != 0 ||
      pmem2_config_set_length(cfg, size) != 0) {
    st = Pmem2Error("pmem2 config for", path_);
  } else if (pmem2_source_from_fd(&src, file_.fd()) != 0) {
    st = Pmem2Error("pmem2_source_from_fd", path_);
  } else if (pmem2_map_new(&map_, cfg, src) != 0) {
    map_ = nullptr;
    st = Pmem2Error("pmem2_map_new", path_);
  } else {
    data_ = static_cast<std::byte*>(pmem2_map_get_address(map_));
    size_ = size;
  }
  if (src) pmem2_source_delete(&src);
  pmem2_config_delete(&cfg);
  return st;
}

void MappedFile::Unmap() {
  if (map_) pmem2_map_delete(&map_);
  map_ = nullptr;
  data_ = nullptr;
  size_ = 0;
}

Status MappedFile::Resize(uint64_t size) {
  if (size <= size_) return Status::OK();
  CAIRN_RETURN_IF_ERROR(file_.Truncate(size).WithContext(path_));
  CAIRN_RETURN_IF_ERROR(file_.Allocate(size).WithContext(path_));
  Unmap();
  return Map(size);
}

Status MappedFile::Prefault() {
  if (!data_) return Status::OK();
  PopulatePages(data_, 0, size_, true);
  return Status::OK();
}

void MappedFile::PopulateRead(uint64_t offset, uint64_t n) const {
  if (!data_ || offset >= size_) return;
  PopulatePages(data_, offset, offset + std::min(n, size_ - offset), false);
}

void MappedFile::Persist(uint64_t offset, uint64_t n) const {
  if (!map_ || n == 0) return;
  pmem2_persist_fn persist = pmem2_get_persist_fn(map_);
  persist(data_ + offset, n);
}

}  // namespace cairn
