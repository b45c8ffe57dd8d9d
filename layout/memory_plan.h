// A memory restore planned by each rank alone, from layout templates (the host-tier and
// peer counterpart of MANIFEST format 2's per-rank PFS restore, persist/step_index.h).
//
// When the layouts a memory step was saved with and the layouts it is restored into are
// all templates (layout/layout_template.h), the restore need not gather every rank's
// target boxes and every holder's shard table, nor plan the whole job on every rank.
// Instead ranks exchange, per rank, a template reference for its targets and for each
// saved version it is the lowest holder of (a few dozen bytes), and each distinct template
// once. From those, the saved plan (which source rank holds which part of each tensor),
// the target plan (which rank wants which part) and who holds each source's version, a
// rank finds by arithmetic
//   - the saved pieces its targets meet, and which rank it gets each from (itself when it
//     holds it, else one of the holders, spread as LoadPlan::HolderFor spreads them);
//   - for each piece it holds, the ranks whose targets meet it and that get it from it;
// and plans only those with the usual load planner: its own targets as class 0 (checked:
// an uncovered box or a mismatched tensor is an error), the layouts of the ranks it sends
// to as unchecked classes (so its spans are exactly the spans those ranks plan for the
// same pieces), everyone else an empty class. The catalog's pieces are sorted by (tensor,
// box) on every rank, so the pieces two ranks exchange come in the same order on both
// sides and RankLoad's per-pair message numbers agree.
// Cost per rank: O(ranks + its own boxes + the boxes of the pieces it sends or receives),
// plus O(ranks) per replicated (whole) tensor it holds.
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <vector>

#include "cairn/status.h"
#include "layout/load_planner.h"
#include "layout/templated_plan.h"

namespace cairn {

struct TemplatedMemoryStep {
  int64_t step = -1;
  uint64_t chunk_bytes = 0;
  TemplatedPlan saved;                    // one rank per source rank of the step
  TemplatedPlan targets;                  // one rank per restoring rank
  std::vector<std::vector<int>> holders;  // per source: ranks holding its version, ascending
};

struct MemoryPlanAlone {
  LoadCatalog cat;  // the pieces this rank needs or sends, sorted by (tensor, box)
  LoadTargets lt;   // class 0: this rank's targets
  LoadPlan plan;
};

// This rank's plan. Errors as MakeLoadPlan's for this rank's own targets.
Result<MemoryPlanAlone> PlanMemoryAlone(const TemplatedMemoryStep& step, int rank);

}  // namespace cairn
