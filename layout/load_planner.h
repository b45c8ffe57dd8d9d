// LoadPlanner: which bytes of a saved version every rank needs, and who fetches them.
//
// Input: the catalog of one saved version (its tensors and its saved pieces: boxes held in
// the memory of some ranks, or boxes of a PFS step) and the target layouts of the ranks
// restoring it (ranks with byte-identical layouts, i.e. data-parallel replicas, form one
// class and are planned once). The planner
//   1. matches every target to a saved tensor (name, dtype, global shape must agree) and
//      finds the saved pieces its box overlaps through a per-tensor index sorted by the
//      first offset (no pairwise search: O(targets x overlapping pieces x log pieces));
//   2. records, per (piece, class), the span of the piece's bytes the class needs, widened
//      to whole checksum chunks (every byte read is verified), and one fill per overlap;
//   3. for a PFS version, merges the spans of a piece into runs (neighbouring and
//      overlapping ranges become one large read) and gives each run to one reader, largest
//      first to the least loaded rank that needs it, so every byte is read once per job
//      and the readers pass the bytes to the other ranks that need them; the rank that
//      wrote the piece reads it when it needs it and is within one run of the least
//      loaded, so readers stream through whole files instead of interleaving in them;
//   4. for a memory version, a rank that holds a piece reads it locally; any other rank
//      receives its span from one of the holders (spread over them).
// Every rank computes the same plan from the same gathered inputs.
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

#include "cairn/box.h"
#include "cairn/dtype.h"
#include "cairn/status.h"
#include "layout/save_planner.h"

namespace cairn {

struct LoadPiece {
  uint32_t tensor = 0;  // index into LoadCatalog::tensors
  Box box;
  uint64_t nbytes = 0;
  std::vector<int> holders;  // sorted ranks holding the bytes in memory (memory versions)
  int32_t pfs_box = -1;      // index into the manifest's boxes (PFS versions)
  int writer = -1;           // PFS: the rank whose data file holds it
};

struct LoadCatalog {
  int64_t step = -1;
  uint64_t chunk_bytes = 0;
  bool from_pfs = false;
  std::string where;  // for messages: "host memory" or the PFS step directory
  std::vector<TensorMeta> tensors;
  std::vector<LoadPiece> pieces;
};

// Ranks grouped by identical target layout.
struct LoadTargets {
  std::vector<RankLayout> classes;
  std::vector<uint32_t> class_of_rank;  // world-size entries
  // Classes [0, checked_classes) must be restorable from the catalog: their tensors saved
  // alike and every box covered (errors otherwise), and they count in unique_bytes_needed
  // and unrestored. A rank that plans alone from part of the catalog (its own targets as
  // class 0) adds the layouts of the ranks it sends to as unchecked classes: they get the
  // spans of the pieces the catalog has, and nothing is said about the rest.
  uint32_t checked_classes = UINT32_MAX;
};

struct LoadPlan {
  // Bytes [lo, hi) of a piece (chunk aligned, hi clipped to the piece) that a class needs.
  struct Span {
    uint32_t piece = 0;
    uint32_t cls = 0;
    uint64_t lo = 0, hi = 0;
    int32_t run = -1;  // PFS: the run that reads it
  };
  // Copy `region` (inside the piece and the target) from the span's bytes into target
  // `target` (an index into the class's RankLayout::shards).
  struct Fill {
    uint32_t span = 0;
    uint32_t target = 0;
    Box region;
  };
  // PFS: bytes [lo, hi) of a piece read by `reader`.
  struct Run {
    uint32_t piece = 0;
    uint64_t lo = 0, hi = 0;
    int reader = -1;
  };
  std::vector<Span> spans;                 // sorted by (piece, class)
  std::vector<uint32_t> piece_first_span;  // spans of piece p: [first[p], first[p+1])
  std::vector<std::vector<uint32_t>> spans_of_class;
  std::vector<std::vector<Fill>> fills;  // per class
  std::vector<Run> runs;
  std::vector<std::vector<int>> members;  // ranks of each class, ascending
  uint64_t unique_bytes_needed = 0;       // saved bytes some target overlaps (byte hulls per piece)
  uint64_t pfs_bytes_to_read = 0;         // sum of the runs
  std::vector<std::string> unrestored;    // saved tensors no target asks for

  // The rank `rank` gets piece `p` of a memory version from: itself when it holds it,
  // else one of the holders (spread by rank).
  static int HolderFor(const LoadPiece& p, int rank) { return HolderFor(p.holders, rank); }
  static int HolderFor(const std::vector<int>& sorted_holders, int rank);
};

// NotFound (a target tensor was not saved), InvalidArgument (dtype or shape differ, or
// part of a target is covered by no saved piece); each message names the tensor, the box,
// the rank, the step and catalog.where.
Result<LoadPlan> MakeLoadPlan(const LoadCatalog& catalog, const LoadTargets& targets);

// One rank's part of a plan.
struct RankLoad {
  enum class How { kLocal, kPfs, kRecv };
  // Memory versions: `seq` numbers the pieces one rank sends another, in piece order (the
  // sender's puts to a rank and that rank's gets from it list the same pieces in the same
  // order, also when each planned alone from catalogs sorted alike), so message tags need
  // not be global piece numbers.
  struct Get {
    uint32_t span = 0;
    How how = How::kLocal;
    int from = -1;     // kRecv: the sender
    uint32_t seq = 0;  // kRecv of a memory version
  };
  struct Put {
    int to = -1;
    uint32_t span = 0;  // the receiver's span (bytes to send)
    uint32_t seq = 0;   // memory versions
  };
  std::vector<Get> gets;          // one per span of this rank's class
  std::vector<Put> puts;          // spans this rank sends, by (piece, receiver)
  std::vector<uint32_t> my_runs;  // PFS runs this rank reads
};
RankLoad ForRank(const LoadPlan& plan, const LoadCatalog& catalog, int rank);

// Groups ranks by the hashes of their encoded layouts (LayoutHash): ranks with the same
// hash share a class, decoded from the lowest such rank's bytes (the others may send none).
Result<LoadTargets> GroupTargets(const std::vector<std::string>& encoded_layouts,
                                 const std::vector<uint64_t>& hashes);

}  // namespace cairn
