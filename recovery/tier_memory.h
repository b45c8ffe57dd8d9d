// TierMemory: the MemorySource of a restore on one rank: its own host tier and the
// replica tiers it keeps for other ranks.
// Thread-safety: one restore at a time.
#pragma once

#include <memory>
#include <string>
#include <vector>

#include "core/log.h"
#include "recovery/restore.h"
#include "tiers/host_tier.h"
#include "redundancy/replica_store.h"

namespace cairn {

class TierMemory final : public MemorySource {
 public:
  // `store` may be null (no replicas kept); `sources` are the ranks whose replicas it holds.
  TierMemory(HostTier* own, ReplicaStore* store, std::vector<int> sources, const Logger* log)
      : own_(own), store_(store), sources_(std::move(sources)), log_(log) {}
  std::vector<HeldVersion> List() override;
  Result<std::unique_ptr<PinnedVersion>> Pin(const HeldVersion& v) override;
  std::string Describe() const override { return "host tier " + own_->dir(); }

 private:
  HostTier* own_;
  ReplicaStore* store_;
  std::vector<int> sources_;
  const Logger* log_;
};

}  // namespace cairn
