// What every copy engine shares: the default Capture() (copy, then checksum what the
// engine did not checksum while copying), the grouping of strided rows and of contiguous
// chunks.
#include "snapshot/copy_engine.h"

#include <string>
#include <vector>

#include "core/pool.h"

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

std::vector<CopyGroup> GroupCopies(std::span<const CopyChunk> chunks, std::span<const size_t> order,
                                   size_t max_bytes, std::vector<uint32_t>* group_of) {
  std::vector<CopyGroup> groups;
  group_of->resize(order.size());
  for (size_t k = 0; k < order.size(); ++k) {
    const CopyChunk& c = chunks[order[k]];
    const auto* src = static_cast<const std::byte*>(c.src);
    auto* dst = static_cast<std::byte*>(c.dst);
    const bool joins = k > 0 && c.continues && order[k] == order[k - 1] + 1 &&
                       groups.back().src + groups.back().bytes == src &&
                       groups.back().dst + groups.back().bytes == dst &&
                       groups.back().bytes + c.bytes <= max_bytes;
    if (!joins) groups.push_back({src, dst, 0});
    groups.back().bytes += c.bytes;
    (*group_of)[k] = static_cast<uint32_t>(groups.size() - 1);
  }
  return groups;
}

Status ChecksumAsTheyLand(Pool& pool, std::span<const uint32_t> group_of,
                          std::span<const size_t> group_bytes, size_t window_bytes,
                          const LandingSteps& steps) {
  const size_t groups = group_bytes.size();
  size_t queued = 0;     // groups queued
  size_t in_flight = 0;  // bytes queued and not yet landed
  // Queues groups while the window has room (at least one group).
  auto fill = [&]() -> Status {
    while (queued < groups && (in_flight == 0 || window_bytes == 0 ||
                               in_flight + group_bytes[queued] <= window_bytes)) {
      CAIRN_RETURN_IF_ERROR(steps.enqueue(queued));
      in_flight += group_bytes[queued];
      if (++queued == groups) CAIRN_RETURN_IF_ERROR(steps.all_queued());
    }
    return Status::OK();
  };
  if (groups == 0) return steps.all_queued();
  TaskGroup sums(&pool);  // its destructor waits for the checksums queued
  CAIRN_RETURN_IF_ERROR(fill());
  size_t k = 0;
  for (size_t g = 0; g < groups; ++g) {
    CAIRN_RETURN_IF_ERROR(steps.wait(g));
    in_flight -= group_bytes[g];
    // The next window only once the last one has landed whole: the device's copy queue
    // runs empty between windows, and only then does a transfer the training queued get
    // its turn.
    if (in_flight == 0) CAIRN_RETURN_IF_ERROR(fill());
    for (; k < group_of.size() && group_of[k] == g; ++k)
      sums.Run([&steps, k] { steps.checksum(k); });
  }
  return Status::OK();
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
