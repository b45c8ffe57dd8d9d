// Agreement (recovery/restore.cc, step 2): from every rank's inventory, the newest step
// (or the one asked for) that the whole job can restore: from memory when every rank that
// saved it is held by some live rank, else from the PFS; memory wins for the same step.
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <set>
#include <string>
#include <utility>
#include <vector>

#include "recovery/restore_wire.h"

namespace cairn::restore_internal {

struct Choice {
  int64_t step = -1;
  bool from_pfs = false;
};

// Whether every rank that saved `step` is held in some rank's memory.
bool MemoryComplete(const std::vector<Inventory>& inv, int64_t step);
// The newest (step, tier) not in `excluded` that every rank can restore, `want` only if set.
std::optional<Choice> Choose(const std::vector<Inventory>& inv, std::optional<int64_t> want,
                             const std::set<std::pair<int64_t, bool>>& excluded);
// "in memory: step 7 (3 of 4 ranks) ...; on the PFS: 5", for messages.
std::string DescribeInventory(const std::vector<Inventory>& inv);

}  // namespace cairn::restore_internal
