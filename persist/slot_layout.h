// The parallel layout (layout/save_planner.h's RankLayout) of the version a host slot holds:
// what a rank offers to persist and what a memory restore gathers.
#pragma once

#include "layout/save_planner.h"
#include "tiers/slot_header.h"

namespace cairn {

// The slot's shards in slot order, tensors numbered as first seen.
RankLayout SlotLayout(const SlotHeader& h);

}  // namespace cairn
