// MappedFile: a file of a host tier mapped shared into memory with libpmem2.
//
// On tmpfs and ordinary filesystems libpmem2 maps with page granularity and Persist()
// is msync; on a DAX filesystem the same code gives persistent memory with cache-line
// flushes. The mapping is RAII: the destructor unmaps and closes the descriptor.
// Thread-safety: the mapping may be read and written from any thread; Remap/destruction
// must not race with users of the old address.
#pragma once

#include <cstddef>
#include <cstdint>
#include <memory>
#include <string>

#include "cairn/status.h"
#include "core/filesystem.h"

struct pmem2_map;

namespace cairn {

class MappedFile {
 public:
  // Opens (creating with mode 0600 if missing) `path` read-write and maps its current size
  // (nothing is mapped while it is empty). Only this user's own regular file, never through
  // a link (OpenOwnFile: FailedPrecondition naming its owner and mode otherwise).
  static Result<std::unique_ptr<MappedFile>> Open(FileSystem* fs, const std::string& path);
  ~MappedFile();
  MappedFile(const MappedFile&) = delete;
  MappedFile& operator=(const MappedFile&) = delete;

  // Grows the file to at least `size` bytes with its storage allocated (ENOSPC is reported
  // here, not as SIGBUS later) and maps it again. Addresses from before are invalid after.
  Status Resize(uint64_t size);
  // Faults in every page of the mapping for writing, so the first capture into it is not
  // slowed by page allocation.
  Status Prefault();
  // Maps the pages of [offset, offset + n) into this process for reading (the file keeps
  // them; this only fills the page tables), so a later reader of a mapping made by a new
  // process is not slowed by a page fault per 4 KiB (105 MB: 8.5 ms of faults, here).
  void PopulateRead(uint64_t offset, uint64_t n) const;
  // Makes [offset, offset+n) durable (msync on page-granular mappings).
  void Persist(uint64_t offset, uint64_t n) const;

  std::byte* data() const { return data_; }
  uint64_t size() const { return size_; }
  const std::string& path() const { return path_; }

 private:
  MappedFile(std::string path, File file) : path_(std::move(path)), file_(std::move(file)) {}
  Status Map(uint64_t size);
  void Unmap();

  std::string path_;
  File file_;
  pmem2_map* map_ = nullptr;
  std::byte* data_ = nullptr;
  uint64_t size_ = 0;
};

}  // namespace cairn
