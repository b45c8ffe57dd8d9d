// Restore: every rank of the job gets the newest version the whole job can restore, from
// the nearest tier that has it, in the layout it has now.
//
// A collective (every rank calls Restore with its own targets):
//   1. discovery: each rank lists what it holds in memory (its own host tier and the
//      replicas it keeps for other ranks); rank 0 lists the committed steps on the PFS;
//      an allgather gives everyone the whole inventory;
//   2. agreement: the newest step (or the one asked for) for which every rank that saved
//      it is held in the memory of some live rank ("memory version"), else the newest
//      committed PFS step; memory wins for the same step;
//   3. planning: the target layouts (and, for a memory version, the shard tables of the
//      held copies) are gathered and every rank computes the same LoadPlan;
//   4. transfer: a rank copies what it holds itself, receives what others hold over the
//      transport, and for a PFS version reads its share of the runs once, verifies every
//      chunk, and passes the bytes to the other ranks that need them;
//   5. outcome: the ranks' statuses are gathered; a checksum failure anywhere makes every
//      rank drop that (step, tier) with a warning and go back to 2 for the next older one.
// Structural errors (a tensor missing, dtype or shape differing, a target not covered)
// are found in 3, before any target byte is written. A checksum failure is found while
// copying (verifying first would read everything twice): the older version chosen next
// rewrites every target byte, and when none is left the error says the targets are
// partly written.
// Thread-safety: one Restore at a time per rank; it uses the group and transport alone.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <optional>
#include <span>
#include <string>
#include <vector>

#include "cairn/group.h"
#include "cairn/restore.h"
#include "cairn/status.h"
#include "cairn/tensor.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "snapshot/copy_engine.h"
#include "tiers/slot_header.h"

namespace cairn {

// A version pinned in memory (a host slot or a replica): readable until destroyed.
class PinnedVersion {
 public:
  virtual ~PinnedVersion() = default;
  virtual const SlotHeader& header() const = 0;
  virtual const std::byte* data() const = 0;
  virtual const std::string& path() const = 0;  // the data file, for messages
};

struct HeldVersion {
  int source = -1;  // the rank that saved it
  int64_t step = -1;
  uint32_t world_size = 1;  // of the job that saved it
  // No tensor bytes, only blobs: a replica of a rank whose boxes ranks on other nodes hold
  // (data parallel; Replicator::SetCovered). Its boxes come from those ranks' versions.
  bool blobs_only = false;
};

// What one rank holds in memory: its own versions and the replicas it keeps.
class MemorySource {
 public:
  virtual ~MemorySource() = default;
  virtual std::vector<HeldVersion> List() = 0;
  virtual Result<std::unique_ptr<PinnedVersion>> Pin(const HeldVersion& v) = 0;
  virtual std::string Describe() const = 0;  // "host tier <dir>" for messages
};

// Point-to-point bytes between the ranks of the job for one restore.
class RestoreTransport {
 public:
  virtual ~RestoreTransport() = default;
  // Starts sending; `buf` must stay valid until WaitSend(*ticket) or Finish. `ticket`
  // (optional) receives a handle for WaitSend.
  virtual Status Send(int peer, uint32_t seq, const void* buf, size_t n,
                      uint64_t* ticket = nullptr) = 0;
  // Waits until the send `ticket` completed (its buffer may be reused).
  virtual Status WaitSend(uint64_t ticket, double timeout_s) = 0;
  // Posts a receive of exactly the message `peer` sends with `seq`. `ticket` (optional)
  // receives a handle for WaitRecv.
  virtual Status PostRecv(int peer, uint32_t seq, void* buf, size_t n,
                          uint64_t* ticket = nullptr) = 0;
  // Waits until the receive `ticket` completed and its sender proved itself (its buffer
  // holds the message); after an error, Finish gives up the rest and returns it.
  virtual Status WaitRecv(uint64_t ticket, double timeout_s) = 0;
  // Lets started transfers advance while the caller waits for something else.
  virtual void Progress() {}
  // Completes every send and receive started, each within `timeout_s` of the one before;
  // after the first error the rest are given up at once. The first error.
  virtual Status Finish(double timeout_s) = 0;
};

struct RestoreEnv {
  int rank = 0;
  Group* group = nullptr;
  RestoreTransport* transport = nullptr;  // may be null for a job of one rank
  MemorySource* memory = nullptr;
  FileSystem* pfs_fs = nullptr;  // null or pfs_job_dir empty: no PFS
  std::string pfs_job_dir;
  CopyEngine* engine = nullptr;
  const Logger* log = nullptr;
  std::string who;  // "cairn rank 3", prefixed to messages
  double timeout_s = 60;
  int read_threads = 4;      // PFS readers per rank
  bool host_targets = true;  // targets are host memory: reads and receives may land in them
  // Plan memory restores of fully sharded jobs from layout templates (layout/memory_plan.h)
  // when every layout is one; off: always the general catalog (tests, benchmarks).
  bool templates = true;
};

// The decoders of what ranks send each other during a restore, for the fuzz targets: `kind`
// 0 is a rank's inventory (held versions, PFS steps), 1 a rank's shard tables (of a job of
// `saved_world` ranks), 2 the (status, payload) frame every restore message travels in,
// holding an inventory, 3 a rank's layout references (memory restores planned from
// templates), 4 a list of encoded templates, 5 the saved tensors a rank's targets name (of
// `saved_world` saved tensors). OK when the bytes decode, the status a frame carries,
// Corruption / InvalidArgument otherwise.
Status DecodeRestoreMessageForFuzzing(int kind, std::string_view bytes, uint32_t saved_world);

Result<RestoreReport> Restore(const RestoreEnv& env, std::span<const ShardSpec> targets,
                              const RestoreOptions& options);

// Copies `region` (inside both boxes) from the row-major bytes of `src_box` to those of
// `dst_box`, appending one chunk per contiguous block. `src` points at byte `src_lo` of the
// source box's bytes (a window of them).
void AppendRegionCopies(const std::byte* src, uint64_t src_lo, const Box& src_box, std::byte* dst,
                        const Box& dst_box, const Box& region, size_t elem,
                        std::vector<CopyChunk>* out);

}  // namespace cairn
