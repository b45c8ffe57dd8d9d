// Test helpers on a host tier (tiers/host_tier.h), for the gtest suites that fill one as
// the capture thread would.
#pragma once

#include <gtest/gtest.h>

#include <cstddef>
#include <cstdint>
#include <cstring>
#include <vector>

#include "core/checksum.h"
#include "tiers/host_tier.h"

namespace cairn::testing {

// Captures a version of `step` into `tier` (one 64 KiB shard filled with the step number,
// its chunk checksum right, so a replica of it verifies); false when no slot is free.
inline bool CaptureInto(HostTier& tier, int64_t step) {
  auto slot = tier.Reserve(step, FullPolicy::kSkip);
  if (!slot.ok()) return false;
  std::vector<std::byte> bytes(64 << 10, static_cast<std::byte>(step));
  SlotHeader h;
  h.step = step;
  h.chunk_bytes = bytes.size();
  h.data_bytes = bytes.size();
  const int64_t n = static_cast<int64_t>(bytes.size());
  h.shards.push_back({"w", DType::kU8, {n}, Box{{0}, {n}}, 0, bytes.size(), 0, 1});
  h.chunk_checksums = {Checksum(bytes.data(), bytes.size())};
  auto base = tier.Prepare(*slot, step, h.data_bytes, h);
  EXPECT_TRUE(base.ok()) << base.status().ToString();
  if (!base.ok()) return false;
  std::memcpy(*base, bytes.data(), bytes.size());
  tier.MarkCopied(*slot);
  EXPECT_TRUE(tier.Commit(*slot, h).ok());
  return true;
}

}  // namespace cairn::testing
