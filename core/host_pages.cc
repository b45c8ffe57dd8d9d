#include "core/host_pages.h"

#include <sys/mman.h>
#include <unistd.h>

#include <algorithm>
#include <filesystem>
#include <fstream>
#include <string>

namespace cairn {

#ifndef MADV_POPULATE_READ
#define MADV_POPULATE_READ 22
#endif
#ifndef MADV_POPULATE_WRITE
#define MADV_POPULATE_WRITE 23
#endif

namespace {
constexpr uintptr_t kHugePage = uintptr_t{2} << 20;
}  // namespace

uint64_t AdviseHugePagesIfFresh(void* data, uint64_t n) {
  const auto lo_addr = reinterpret_cast<uintptr_t>(data);
  const uintptr_t lo = (lo_addr + kHugePage - 1) & ~(kHugePage - 1);
  const uintptr_t hi = (lo_addr + n) & ~(kHugePage - 1);
  if (data == nullptr || hi <= lo) return 0;
  // mincore fails (ENOMEM) on a range that is not mapped at all: then nothing is advised.
  unsigned char resident = 0;
  if (::mincore(reinterpret_cast<void*>(lo), 4096, &resident) != 0 || (resident & 1)) return 0;
  if (::madvise(reinterpret_cast<void*>(lo), hi - lo, MADV_HUGEPAGE) != 0) return 0;
  return hi - lo;
}

bool FreePagesReportedToHypervisor() {
  constexpr size_t kReportingBit = 5;  // VIRTIO_BALLOON_F_REPORTING
  std::error_code ec;
  const std::filesystem::path drv = "/sys/bus/virtio/drivers/virtio_balloon";
  for (const auto& e : std::filesystem::directory_iterator(drv, ec)) {
    std::ifstream f(e.path() / "features");
    std::string bits;
    if (f && std::getline(f, bits) && bits.size() > kReportingBit && bits[kReportingBit] == '1')
      return true;
  }
  return false;
}

bool RestoreWantsHugePages(RestoreHugePages setting) {
  static const bool reported = FreePagesReportedToHypervisor();
  return setting == RestoreHugePages::kOn || (setting == RestoreHugePages::kAuto && !reported);
}

void PopulatePages(std::byte* data, uint64_t lo, uint64_t hi, bool write) {
  if (data == nullptr || hi <= lo) return;
  const auto page = static_cast<uint64_t>(::sysconf(_SC_PAGESIZE));
  const uint64_t begin = reinterpret_cast<uintptr_t>(data) + lo;
  const uint64_t end = reinterpret_cast<uintptr_t>(data) + hi;
  const uint64_t first = begin / page * page;
  if (::madvise(reinterpret_cast<void*>(first), end - first,
                write ? MADV_POPULATE_WRITE : MADV_POPULATE_READ) == 0)
    return;
  // One byte of each page, inside the range (the first page's may begin before it).
  for (uint64_t a = first; a < end; a += page) {
    volatile std::byte* p = reinterpret_cast<std::byte*>(std::max(a, begin));
    if (write)
      *p = *p;
    else
      (void)*p;
  }
}

}  // namespace cairn
