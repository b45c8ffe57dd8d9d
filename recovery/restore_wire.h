// The messages ranks exchange during a restore (recovery/restore.cc), as the one codec
// writes them (wire/messages.proto): every rank's inventory (what it holds in memory, and
// the PFS steps rank 0 sees), the status frame every allgather travels in, the catalog
// part (target layout and shard tables of memory versions), template references and
// blobs. Every decoder checks every field of bytes that came from a peer: a garbled
// message is an error, never a crash or a huge allocation.
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <string>
#include <string_view>
#include <unordered_map>
#include <utility>
#include <vector>

#include "cairn/group.h"
#include "cairn/status.h"
#include "layout/load_planner.h"
#include "layout/restore_plan.h"
#include "recovery/restore.h"
#include "tiers/slot_header.h"
#include "wire/codec.h"

namespace cairn::restore_internal {

inline constexpr uint64_t kMsgBytes = 64ull << 20;  // largest single transfer message
inline constexpr uint32_t kBlobSeq = 0xffffffffu;

// Tag sequence of message `k` of a piece's span (pieces < 2^24, messages < 256).
inline uint32_t Seq(uint32_t piece, uint64_t k) {
  return (piece << 8) | static_cast<uint32_t>(k);
}

struct Inventory {
  uint64_t layout_hash = 0;  // of this rank's target layout
  std::vector<HeldVersion> held;
  std::vector<int64_t> pfs_steps;  // rank 0 only
};

std::string EncodeInventory(const Inventory& inv);
Result<Inventory> DecodeInventory(std::string_view b);

// One rank's (status, payload) message: the payload when the status is OK, that status
// otherwise, Corruption naming `rank` when the bytes are not such a message.
Result<std::string> DecodeChecked(std::string_view bytes, int rank);
// Allgather of (status, payload): the payloads when every rank is OK, the first failing
// rank's status otherwise (the same on every rank).
Result<std::vector<std::string>> GatherChecked(Group* g, const Status& mine,
                                               std::string_view payload);

// The blobs of a pinned version, or those a rank restored; DecodeBlobs adds them to *out
// (Corruption when garbled).
std::string EncodeBlobs(const SlotHeader& h, const std::byte* data);
std::string EncodeBlobs(const Blobs& blobs);
Status DecodeBlobs(std::string_view bytes, Blobs* out);

// A rank's part of the catalog gather: its target layout (empty when a lower rank sends
// the same) and the shard tables of every version it pinned (none for a PFS restore).
std::string EncodeCatalogPart(std::string_view layout,
                              const std::vector<std::unique_ptr<PinnedVersion>>* pinned);
Result<wire::CatalogPart> DecodeCatalogPart(std::string_view bytes, int rank);

// A memory restore's first gather when layouts may be templates (LayoutRefs,
// layout/restore_plan.h).
std::string EncodeLayoutRefs(const LayoutRefs& refs);
Result<LayoutRefs> DecodeLayoutRefs(std::string_view b);

// The saved tensors a rank's targets name (`ascending` indices below `count`), for the
// check that every saved tensor is some rank's target: as runs of consecutive indices (a
// pipeline stage's tensors: a few bytes where a bitmap of 10,000 saved tensors is 1.25 KB,
// and every rank receives every rank's), as a bitmap where that is shorter.
std::string EncodeTargeted(const std::vector<uint32_t>& ascending, uint32_t count);
// The runs [begin, end) rank `rank`'s message names, ascending; Corruption naming the rank
// when an index reaches `count` or the bytes are no such message.
Result<std::vector<std::pair<uint32_t, uint32_t>>> DecodeTargeted(std::string_view bytes,
                                                                  uint32_t count, int rank);

// The second gather: the encoded templates this rank is the first to name.
std::string EncodeTemplateList(const std::vector<std::string>& encoded);
Result<std::vector<std::string>> DecodeTemplateList(std::string_view b);

struct MemoryCatalog {
  LoadCatalog cat;
  std::vector<std::vector<std::pair<int, uint64_t>>> blob_providers;  // per source: (rank, size)
};

// Adds rank `holder`'s shard tables to the catalog (their names moved out of `tables`). The bytes
// come from a peer: every field is checked (source below `saved_world`, names, dtypes, boxes inside
// their shapes, byte counts) before it is used, so a garbled table is an error, never a crash or a
// huge allocation.
Status AddTables(int holder, wire::ShardTables& tables, uint32_t saved_world, MemoryCatalog* mc,
                 std::unordered_map<std::string, uint32_t>* tensor_ids,
                 std::map<std::pair<uint32_t, std::vector<int64_t>>, uint32_t>* piece_ids);

}  // namespace cairn::restore_internal
