// SavePlanner: who writes which bytes of a step to the parallel filesystem.
//
// Every rank contributes its layout (the tensors and boxes it holds, in the order of its
// host slot) as an encoded string (only the lowest rank of each distinct layout needs to
// send the bytes; the others are known by their hash); the planner
//   1. groups ranks with byte-identical layouts (data-parallel replicas) by hashing them,
//      and decodes each distinct layout once;
//   2. interns tensors across layouts (a dtype or shape disagreement is an error) and
//      deduplicates (tensor, box) pairs: each unique box becomes one entry;
//   3. cuts unique boxes larger than a share of the job's bytes into slabs along their
//      first dimension longer than 1 (each slab is contiguous in the holder's bytes and
//      still a box, so readers reshard it like any other);
//   4. assigns pieces largest first to the least loaded rank that holds them (ties to the
//      lower rank), so the busiest writer carries as few bytes as possible.
// The plan depends only on the layouts, so every rank computes the same plan; it is cached
// while the layouts do not change (compare their hashes: no collective needed).
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/box.h"
#include "cairn/status.h"
#include "cairn/tensor.h"

namespace cairn {

// A rank's layout: its tensors and, in slot order, the boxes it holds of them.
struct RankLayout {
  struct Entry {
    uint32_t tensor = 0;  // index into tensors
    Box box;
  };
  std::vector<TensorMeta> tensors;
  std::vector<Entry> shards;
};

std::string EncodeRankLayout(const RankLayout& layout);
// Corruption saying what is wrong (checked: names, dtypes, boxes inside shapes).
Result<RankLayout> DecodeRankLayout(std::string_view bytes);
// The hash the plan cache compares (XXH3 of the encoding).
uint64_t LayoutHash(std::string_view encoded);

struct PlanShard {
  uint32_t tensor = 0;  // index into SavePlan::tensors
  Box box;
  uint64_t nbytes = 0;
};

// One write: the bytes of `box` (a shard or a slab of one), taken from `writer`'s copy of
// shard `shard` at byte `src_offset` of that shard's row-major bytes.
struct PlannedPiece {
  uint32_t shard = 0;
  Box box;
  uint64_t src_offset = 0;
  uint64_t nbytes = 0;
  int writer = -1;
};

struct SavePlan {
  std::vector<TensorMeta> tensors;
  std::vector<PlanShard> shards;             // unique (tensor, box) pairs
  std::vector<std::vector<uint32_t>> lists;  // distinct layouts, as shard indices in slot order
  std::vector<uint32_t> rank_list;           // rank r's layout is lists[rank_list[r]]
  std::vector<PlannedPiece> pieces;          // grouped by writer, in the writer's slot order
  std::vector<uint64_t> writer_bytes;        // per rank
  std::vector<uint64_t> layout_hashes;       // what the plan was made from (the cache key)
  uint64_t unique_bytes = 0;

  int world_size() const { return static_cast<int>(rank_list.size()); }
  // Largest writer's bytes over the mean over all ranks (1 when perfectly even).
  double max_writer_share() const;
  // Indices into pieces written by `rank`.
  std::vector<size_t> PiecesOf(int rank) const;
};

// The largest of `writer_bytes` over their mean (1 when perfectly even, or none).
double MaxWriterShare(const std::vector<uint64_t>& writer_bytes);

struct PlannerConfig {
  // Unique boxes larger than max(unique_bytes / (world * split_factor), min_piece_bytes)
  // are cut into slabs of about that size.
  uint64_t split_factor = 16;
  uint64_t min_piece_bytes = 1ull << 20;
  // Slabs start at multiples of this many bytes of their shard where the row size allows
  // and the slabs grow by at most 2x (the checksum chunk: a writer can then compare its
  // checksums with the host slot's instead of hashing the slot again).
  uint64_t align_bytes = 4ull << 20;
  // Recognise layout templates (layout/templated_plan.h): fully sharded jobs are then
  // planned without gathering or deduplicating every rank's boxes. Off: always the
  // general plan above.
  bool templates = true;
  // Templates with cuts (multi-dimensional sharding) are used from this many distinct
  // layouts on. Below, the general planner plans in milliseconds and, cutting the boxes
  // several ranks hold into slabs, lets a restore read about what it needs (the demo's
  // TP x DP job resharded onto 3 ranks read 1.0x what it needed planned so, 1.85x from the
  // template, whose parts are written whole).
  uint32_t cut_template_min_layouts = 64;
};

// Plans from every rank's encoded layout (indexed by rank). InvalidArgument naming the
// tensor and ranks when two ranks disagree on a tensor's dtype or shape.
Result<SavePlan> MakeSavePlan(const std::vector<std::string>& layouts,
                              const PlannerConfig& config = {});
// Same, when the hashes of the layouts are already known (layout_hashes[r] ==
// LayoutHash(layouts[r])). Then layouts[r] may be empty when a lower rank has the same hash
// and carries the bytes: the persister gathers each distinct layout once, so no rank
// receives more than the distinct layouts of the job.
Result<SavePlan> MakeSavePlan(const std::vector<std::string>& layouts,
                              const std::vector<uint64_t>& layout_hashes,
                              const PlannerConfig& config = {});

}  // namespace cairn
