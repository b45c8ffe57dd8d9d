// What every copy engine shares: the default Capture() (copy, then checksum what the
// engine did not checksum while copying) and the grouping of strided rows.
#include "snapshot/copy_engine.h"

#include <string>
#include <vector>

namespace cairn {

std::vector<CopyRows> GroupRows(std::span<const CopyChunk> chunks) {
  constexpr size_t kMaxPitch = size_t{1} << 31;
  std::vector<CopyRows> out;
  for (const CopyChunk& c : chunks) {
    const auto* src = static_cast<const std::byte*>(c.src);
    auto* dst = static_cast<std::byte*>(c.dst);
    if (!out.empty()) {
      CopyRows& r = out.back();
      if (r.width == c.bytes) {
        const std::byte* last_src = r.src + (r.rows - 1) * r.spitch;
        std::byte* last_dst = r.dst + (r.rows - 1) * r.dpitch;
        if (src > last_src && dst > last_dst) {
          const auto sp = static_cast<size_t>(src - last_src);
          const auto dp = static_cast<size_t>(dst - last_dst);
          const bool fits = sp >= r.width && dp >= r.width && sp < kMaxPitch && dp < kMaxPitch;
          if (fits && r.rows == 1) {
            r.spitch = sp;
            r.dpitch = dp;
            ++r.rows;
            continue;
          }
          if (fits && sp == r.spitch && dp == r.dpitch) {
            ++r.rows;
            continue;
          }
        }
      }
    }
    out.push_back({src, dst, c.bytes, 1, c.bytes, c.bytes});
  }
  return out;
}

Status CopyEngine::Capture(const StreamMark* after, int device, std::span<const CopyChunk> chunks,
                           uint64_t* checksums,
                           const std::function<void(std::shared_ptr<StreamMark>)>& queued) {
  (void)after, (void)device;
  for (const CopyChunk& c : chunks)
    if (c.device)
      return Status::InvalidArgument("the '" + std::string(name()) +
                                     "' copy engine cannot copy from device memory");
  CAIRN_RETURN_IF_ERROR(Copy(chunks, checksums_while_copying() ? checksums : nullptr));
  // The bytes are in the slot: a fence may return (checksums are not its business).
  queued(nullptr);
  if (!checksums_while_copying()) {
    std::vector<HostRange> ranges;
    ranges.reserve(chunks.size());
    for (const CopyChunk& c : chunks) ranges.push_back({c.dst, c.bytes});
    ChecksumHost(ranges, checksums);
  }
  return Status::OK();
}

}  // namespace cairn
