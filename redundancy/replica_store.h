// ReplicaStore: the versions this rank holds for ranks of other nodes.
//
// One host tier per source rank under <host_root>/<job>/node-<n>/replica/rank-<src>/, with
// the same files, headers and publishing protocol as a rank's own tier (tiers/FORMAT.md), so
// a replica survives the death of the process that received it and is read back the same
// way. A replica is published only after all of its bytes arrived and every chunk matched
// the checksum the source recorded (Verify).
// Thread-safety: TierFor may be called from any thread; the tiers are thread-safe.
#pragma once

#include <map>
#include <memory>
#include <string>

#include "core/filesystem.h"
#include "core/log.h"
#include "core/mutex.h"
#include "tiers/host_tier.h"

namespace cairn {

class ReplicaStore {
 public:
  // `node_dir` is <host_root>/<job>/node-<n>; `host_root` the top of its private tree
  // (HostTierConfig::trust_top; empty: each source's directory itself).
  ReplicaStore(std::string node_dir, FileSystem* fs, const Logger* log, int slots = 2,
               std::string host_root = "")
      : node_dir_(std::move(node_dir)),
        host_root_(std::move(host_root)),
        fs_(fs),
        log_(log),
        slots_(slots) {}

  static std::string SourceDir(const std::string& node_dir, int source_rank);
  // The tier holding `source_rank`'s replicas, opened (and locked) on first use.
  Result<HostTier*> TierFor(int source_rank);

  // OK when every shard chunk and blob in `data` matches the checksums of `h`; Corruption
  // naming the first tensor that does not otherwise.
  static Status Verify(const SlotHeader& h, const std::byte* data) {
    return VerifyArrived(h, data, 0, h.data_bytes);
  }
  // The same for the checksum chunks that end in (from, to]: the ones the bytes [from, to)
  // complete, for verifying a version while the rest of it still arrives. The blobs are
  // checked with the range that ends at data_bytes.
  static Status VerifyArrived(const SlotHeader& h, const std::byte* data, uint64_t from,
                              uint64_t to);

 private:
  std::string node_dir_;
  std::string host_root_;
  FileSystem* fs_;
  const Logger* log_;
  int slots_;
  Mutex mu_;
  std::map<int, std::unique_ptr<HostTier>> tiers_ CAIRN_GUARDED_BY(mu_);
};

}  // namespace cairn
