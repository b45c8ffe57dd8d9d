// What the planner benchmarks (bench/plan.cc, bench/micro.cc) share: the location tables
// the writers of a save plan would report, without writing anything.
#pragma once

#include <cstdint>
#include <vector>

#include "core/arith.h"
#include "layout/save_planner.h"
#include "persist/commit.h"

namespace cairn::bench {

// Each writer's pieces laid end to end (aligned as the writers align them), with dummy
// chunk checksums; with `blob_bytes` > 0, one blob per rank after its pieces.
inline std::vector<LocationTable> SimulatedLocationTables(const SavePlan& plan, uint64_t chunk,
                                                          uint64_t blob_bytes = 0) {
  std::vector<LocationTable> tables(static_cast<size_t>(plan.world_size()));
  std::vector<uint64_t> off(tables.size(), 0);
  for (const PlannedPiece& pc : plan.pieces) {
    LocationTable::Piece loc;
    loc.offset = off[static_cast<size_t>(pc.writer)];
    off[static_cast<size_t>(pc.writer)] += RoundUp(pc.nbytes, kPfsAlign);
    loc.chunk_checksums.assign(CeilDiv(pc.nbytes, chunk), 0x1234567890abcdefull);
    tables[static_cast<size_t>(pc.writer)].pieces.push_back(std::move(loc));
  }
  if (blob_bytes > 0)
    for (size_t r = 0; r < tables.size(); ++r)
      tables[r].blobs.push_back({"rng", off[r], blob_bytes, 42});
  return tables;
}

}  // namespace cairn::bench
