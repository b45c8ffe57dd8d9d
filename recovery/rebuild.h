// Rebuild: before a restore, the versions of ranks whose node was lost are decoded from the
// parity their erasure-coded set holds (CAIRN_REDUNDANCY=xor|rs; redundancy/erasure.h), so
// the restore that follows finds them in memory like replicas.
//
// A collective (every rank calls it with the same job):
//   1. inventory: each rank allgathers the steps of its own versions and a summary of the
//      parity records it keeps (ParityStore);
//   2. plan (every rank computes the same one, PlanRebuild): going from the newest step
//      down, the first step that every rank holds needs no rebuild (stop); the first step
//      for which every rank that lacks it ("lost") can be decoded is rebuilt: for each of a
//      lost rank's d data pieces, d pieces of its stripe held by live ranks (the other
//      members' own versions first, then parity rows);
//   3. gather: each stripe a lost rank has a piece in is decoded by one live rank among the
//      d that hold its pieces (the one with the fewest stripes to decode so far), and the
//      others send it their pieces or parity; one parity holder sends the lost rank's slot
//      header to the lost rank's rebuilder, the rank of the same number in this job;
//   4. decode and forward, overlapping 3 chunk by chunk (kRebuildChunkBytes): each decoder
//      decodes its lost piece and sends it, its own length, to the rebuilder, which receives
//      it in place in the slot it publishes: the rebuilder's link carries the lost bytes
//      once (as a replica restore's does), where receiving every piece would carry them d
//      times, and the decoding is spread over the survivors; a decoder holds a few chunks
//      of each share at a time (kRebuildRing), not whole shares, so the memory a rebuild
//      takes on a survivor does not grow with the state;
//   5. the rebuilder checks the version against its slot header's checksums and publishes it
//      in its replica store (ReplicaStore::TierFor(lost rank)).
// A version that does not verify is not published (the restore then goes to an older step
// or the PFS) and the report says why. Ranks of a job whose size differs from the saving
// job's rebuild nothing (the saving job's sets no longer exist): the PFS serves them.
// Thread-safety: one call at a time per rank.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <vector>

#include "cairn/group.h"
#include "cairn/status.h"
#include "core/log.h"
#include "recovery/restore.h"
#include "redundancy/parity_store.h"
#include "redundancy/replica_store.h"
#include "tiers/host_tier.h"

namespace cairn {

// What one rank offers a rebuild (decoded from the allgather).
struct RebuildHoldings {
  std::vector<int64_t> own_steps;
  struct Record {
    ErasureScheme scheme;
    ParityKey key;
    uint32_t world_size = 0;
    uint64_t parity_bytes = 0;
    std::vector<int> sources;
    std::vector<uint64_t> data_bytes;
    std::vector<uint64_t> header_bytes;
  };
  std::vector<Record> records;
};
std::string EncodeRebuildHoldings(const RebuildHoldings& h);
Result<RebuildHoldings> DecodeRebuildHoldings(std::string_view bytes, const std::string& from);

// A rebuild's transfers travel in messages of at most this many bytes: a decoder decodes
// and forwards a stripe chunk by chunk as its shares arrive, so the rebuilder's link carries
// the first decoded bytes while the survivors still gather the rest.
inline constexpr uint64_t kRebuildChunkBytes = uint64_t{256} << 10;
// How many chunks ahead of its own decoding a rank sends its shares to the other decoders.
inline constexpr uint64_t kRebuildSendAhead = 2;
// A decoder receives each share into a ring of this many chunks (the one it decodes and
// those its senders may have sent ahead), and decodes into one as long.
inline constexpr uint64_t kRebuildRing = kRebuildSendAhead + 1;
// The messages a transfer of `bytes` is cut into (one for an empty one).
inline uint64_t RebuildChunks(uint64_t bytes) {
  return bytes == 0 ? 1 : (bytes - 1) / kRebuildChunkBytes + 1;
}
// The bytes of chunk `c` of a transfer of `bytes` (0 past its end).
inline uint64_t RebuildChunkLen(uint64_t bytes, uint64_t c) {
  const uint64_t at = c * kRebuildChunkBytes;
  return std::min(kRebuildChunkBytes, bytes - std::min(bytes, at));
}

// One transfer of a rebuild: `bytes` bytes from `sender` to `receiver`, chunk c of them
// (RebuildChunks) under seq + c. A share whose sender is its receiver (the decoder's own)
// is read in place, not sent.
struct RebuildTransfer {
  enum class Kind { kData, kParity, kHeader, kDecoded };
  Kind kind = Kind::kData;
  int sender = -1;
  int receiver = -1;  // kData, kParity: the stripe's decoder; kHeader, kDecoded: the rebuilder
  uint32_t seq = 0;
  uint64_t bytes = 0;
  // kData: the sender's own version's data piece `piece` (PieceOf(data_bytes, d, piece));
  // kParity / kHeader: the sender's record `key` (kHeader: the header of its piece `piece`);
  // kDecoded: the lost rank's piece `piece`, at `offset` of its `data_bytes`.
  int piece = 0;
  ParityKey key;
  uint64_t data_bytes = 0;
  uint64_t offset = 0;  // kData, kDecoded: where the piece starts in the version
};

// The rebuild of one lost rank: for each of its d data pieces, the rank that decodes it,
// where in its stripe each of the d shares it gathers goes (index among the stripe's d + m)
// and how long the stripe is.
struct RebuildTarget {
  int source = -1;  // the lost rank (and its rebuilder)
  ErasureScheme scheme;
  uint64_t data_bytes = 0;
  struct Stripe {
    int j = 0;               // the lost rank's piece
    uint64_t len = 0;        // the stripe's length (its parity's)
    int decoder = -1;        // the live rank that gathers the shares and decodes piece j
    std::vector<int> index;  // per share: its index in the stripe (0..d+m-1)
    std::vector<uint32_t> seq;
    uint32_t decoded_seq = 0;  // the decoded piece's message to the rebuilder (0: empty piece)
  };
  std::vector<Stripe> stripes;
  uint32_t header_seq = 0;
  uint64_t header_bytes = 0;
};

struct RebuildPlan {
  int64_t step = -1;  // -1: nothing to rebuild
  std::vector<int> lost;
  std::vector<int> not_rebuildable;  // at the newest step: lost ranks no set can decode
  std::vector<RebuildTarget> targets;
  std::vector<RebuildTransfer> transfers;
};

// The same plan on every rank from every rank's holdings (indexed by rank).
RebuildPlan PlanRebuild(const std::vector<RebuildHoldings>& all);

struct RebuildEnv {
  int rank = 0;
  int world_size = 1;
  Group* group = nullptr;
  RestoreTransport* transport = nullptr;
  HostTier* own = nullptr;
  ParityStore* parity = nullptr;
  ReplicaStore* store = nullptr;
  const Logger* log = nullptr;
  std::string who;
  double timeout_s = 60;
};

struct RebuildReport {
  int64_t step = -1;
  std::vector<int> lost;          // ranks that lacked the step
  std::vector<int> rebuilt_here;  // the ones this rank rebuilt and published
  std::string error;              // why this rank's rebuild failed, if it did
  double seconds = 0;
};

// The collective above. An error only when the collective itself failed (a peer died);
// a version that could not be rebuilt is in the report.
Result<RebuildReport> RebuildLost(const RebuildEnv& env);

}  // namespace cairn
