#include "redundancy/replica_store.h"

#include "core/checksum.h"
#include "core/mutex.h"

namespace cairn {

std::string ReplicaStore::SourceDir(const std::string& node_dir, int source_rank) {
  return JoinPath(JoinPath(node_dir, "replica"), "rank-" + std::to_string(source_rank));
}

Result<HostTier*> ReplicaStore::TierFor(int source_rank) {
  MutexLock lk(mu_);
  auto it = tiers_.find(source_rank);
  if (it != tiers_.end()) return it->second.get();
  HostTierConfig c;
  c.dir = SourceDir(node_dir_, source_rank);
  c.trust_top = host_root_;
  c.slots = slots_;
  CAIRN_ASSIGN_OR_RETURN(auto tier, HostTier::Open(std::move(c), fs_, log_));
  HostTier* t = tier.get();
  tiers_.emplace(source_rank, std::move(tier));
  return t;
}

Status ReplicaStore::VerifyArrived(const SlotHeader& h, const std::byte* data, uint64_t from,
                                   uint64_t to) {
  for (const SlotShard& s : h.shards)
    for (uint32_t c = 0; c < s.num_chunks; ++c) {
      auto [b, e] = h.ChunkRange(s, c);
      if (e <= from || e > to) continue;
      if (Checksum(data + b, e - b) != h.chunk_checksums[s.first_chunk + c])
        return Status::Corruption("replica of step " + std::to_string(h.step) + ": tensor '" +
                                  s.name + "' bytes [" + std::to_string(b) + ", " +
                                  std::to_string(e) + ") do not match their checksum");
    }
  if (to != h.data_bytes) return Status::OK();
  for (const SlotBlob& b : h.blobs)
    if (Checksum(data + b.offset, b.nbytes) != b.checksum)
      return Status::Corruption("replica of step " + std::to_string(h.step) + ": blob '" + b.name +
                                "' does not match its checksum");
  return Status::OK();
}

}  // namespace cairn
