// Save plans from layout templates, and the layout exchange that chooses between them and
// the general SavePlanner.
//
// When every rank's layout is a template (layout/layout_template.h) and the templates
// agree on every tensor they share (same dtype, shape, rule and part count), no box needs
// deduplicating: the boxes of a split tensor's part i are held exactly by the ranks of
// index i whose template lists the tensor, and a whole tensor by every rank whose template
// lists it. The writers are then chosen arithmetically:
//   - part i of split tensor g: the ((g + i) mod h)-th of its h holders (ranks ascending);
//   - whole tensors, largest first: the least loaded holder (ties to the lower rank),
//     counting only whole tensors' bytes (split parts are even by construction);
// which is only used when every box several ranks hold is small (see MakeTemplatedPlan);
// and each rank finds its own pieces in O(its boxes) after an O(ranks + template tensors)
// set-up: no rank materialises the job's boxes. Only rank 0 expands the whole plan, for
// the MANIFEST (Expand). Pieces are never cut into slabs here.
//
// The exchange (what Persister does when its cached plan no longer matches):
//   gather 1: every rank sends EncodeLayoutMessage: its template's hash and its index, or
//             its explicit layout (only the lowest rank of each layout hash sends bytes);
//   gather 2 (when any rank is templated): the lowest rank of each template hash sends the
//             template's bytes, the others nothing;
//   PlanPersist: a TemplatedPlan when every rank is templated and the templates agree,
//             else the general SavePlan from the expanded layouts.
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.h"
#include "layout/layout_template.h"
#include "layout/save_planner.h"

namespace cairn {

// What one rank is planned to write: a box of the shard at `slot_shard` in its slot,
// starting at byte `src_offset` of that shard's row-major bytes.
struct WritePiece {
  uint32_t tensor = 0;  // index into the plan's tensors
  uint32_t slot_shard = 0;
  Box box;
  uint64_t src_offset = 0;
  uint64_t nbytes = 0;
};

// Rank `rank`'s pieces of a general plan, in the order its location table reports them.
std::vector<WritePiece> WritePiecesOf(const SavePlan& plan, int rank);

struct TemplatedPlan {
  std::vector<LayoutTemplate> templates;
  std::vector<uint32_t> rank_template;  // per rank
  std::vector<uint32_t> rank_index;     // per rank
  std::vector<uint64_t> layout_hashes;  // the cache key

  // Derived by MakeTemplatedPlan.
  std::vector<TensorMeta> tensors;                    // every tensor, first seen first
  std::vector<SplitRule> rules;                       // per tensor
  std::vector<uint32_t> parts;                        // per tensor (1 when whole)
  std::vector<std::vector<uint32_t>> global_ids;      // template -> its tensors' ids
  std::vector<std::vector<uint32_t>> in_templates;    // tensor -> templates listing it
  std::vector<std::vector<uint32_t>> class_ranks;     // class -> its ranks, ascending
  std::vector<uint32_t> class_template, class_index;  // per class
  std::vector<uint32_t> rank_class;                   // per rank
  std::vector<std::vector<uint32_t>> index_classes;   // index -> classes of that index
  std::vector<int> whole_writer;                      // per tensor; -1 when split
  std::vector<uint64_t> writer_bytes;                 // per rank
  std::vector<std::vector<uint32_t>> sharing;         // per tensor: SharingOffsets of its rule

  // Calls fn(i) for each index i holding the same part of split tensor g as `index`
  // (index alone unless g's rule has cuts that leave digits unused), ascending.
  template <typename Fn>
  void ForEachSharing(uint32_t g, uint32_t index, Fn&& fn) const {
    const uint32_t rep = PartRep(rules[g], index);
    for (uint32_t f : sharing[g])
      if (static_cast<uint64_t>(rep) + f < parts[g]) fn(rep + f);
  }

  int world_size() const { return static_cast<int>(rank_template.size()); }
  // The writer of part `index` of split tensor `g`; -1 when nobody holds it.
  int SplitWriter(uint32_t g, uint32_t index) const;
  // Rank `rank`'s pieces, in its slot order.
  std::vector<WritePiece> PiecesOf(int rank) const;
  // The same plan as a general SavePlan (O(the job's boxes)), for the MANIFEST.
  SavePlan Expand() const;
  double max_writer_share() const;
};

// Templates may name different rules for a tensor they share when one rank's boxes fit
// several (recognition sees one index: index 0 fits every digit); the plan then takes, per
// tensor, the first of those rules that gives every class listing the tensor the boxes
// its own template gives it (deterministic: every rank, and a reader of the MANIFEST,
// settles alike).
// nullopt, with *why set, when the templates cannot be planned this way or the general
// planner does better: they disagree on a tensor they share; or a box held by several
// ranks (a whole tensor, or a part that data-parallel replicas hold) is larger than the
// general planner's slabs: it would cut and balance it (and with replicas, layouts
// repeat, which keeps it fast). The caller then uses the general plan. With `config` null
// (a reader rebuilding the plan a MANIFEST was saved with) only the first check is made,
// and writer_bytes counts only whole tensors.
std::optional<TemplatedPlan> MakeTemplatedPlan(std::vector<LayoutTemplate> templates,
                                               std::vector<uint32_t> rank_template,
                                               std::vector<uint32_t> rank_index,
                                               std::vector<uint64_t> layout_hashes,
                                               const PlannerConfig* config, std::string* why);

// The layout hash of a templated rank (what Persister's offers carry).
uint64_t TemplatedLayoutHash(uint64_t template_hash, uint32_t index);

// A rank's part of gather 1.
struct LayoutMessage {
  bool templated = false;
  uint64_t template_hash = 0;
  uint32_t index = 0;
  std::string layout;  // explicit: EncodeRankLayout bytes, or empty (a lower rank sends them)
};
std::string EncodeLayoutMessage(const LayoutMessage& m);
Result<LayoutMessage> DecodeLayoutMessage(std::string_view bytes);

// Whichever plan a persist round uses.
struct PersistPlan {
  std::optional<TemplatedPlan> templated;
  std::optional<SavePlan> full;  // the general plan; for a templated one, Expand()'s
  std::vector<uint64_t> layout_hashes;
  std::string why_general;  // when some rank was templated but the general plan was used
  // Which planner made this plan and why: "templated: ..." or "general: ...".
  std::string Path() const;

  std::vector<WritePiece> PiecesOf(int rank) const;
  // The general form (expanded and kept on first use when templated).
  const SavePlan& Full();
  double max_writer_share() const;
};

// The messages of gather 1, each decoded once: Corruption naming the rank of a bad one.
Result<std::vector<LayoutMessage>> DecodeLayoutMessages(const std::vector<std::string>& messages);

// Plans from the gathers: messages[r] from gather 1, template_bytes[r] from gather 2 (may
// be empty when no rank is templated). hashes[r] is rank r's layout hash. The first form
// decodes the messages (DecodeLayoutMessages).
Result<PersistPlan> PlanPersist(const std::vector<std::string>& messages,
                                const std::vector<std::string>& template_bytes,
                                const std::vector<uint64_t>& hashes,
                                const PlannerConfig& config = {});
Result<PersistPlan> PlanPersist(std::vector<LayoutMessage> msgs,
                                const std::vector<std::string>& template_bytes,
                                const std::vector<uint64_t>& hashes, const PlannerConfig& config);

// After gather 1: whether `rank` sends its template in gather 2 (it is templated and no
// lower rank has the same template hash), and whether gather 2 is needed at all.
bool SendsTemplate(const std::vector<LayoutMessage>& messages, int rank);
bool AnyTemplated(const std::vector<LayoutMessage>& messages);

}  // namespace cairn
