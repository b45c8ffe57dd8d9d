// MANIFEST format 2: a step saved from layout templates (layout/templated_plan.h), whose
// metadata no single process needs to hold whole.
//
// The MANIFEST keeps what every reader needs and nothing per box: the tensors, the
// templates, each rank's (template, index), each rank's blobs, and for each writer the
// length, XXH3 and piece count of its index file. Each writer writes its index file,
// data/<rank>.idx, beside its data file: the file offset and chunk checksums of each piece
// it wrote, in the order TemplatedPlan::PiecesOf gives (its slot order); the boxes are not
// stored, they follow from the templates. So
//   - saving: rank 0 gathers 40-odd bytes per rank (not every piece's location) and writes
//     a MANIFEST of ~20 bytes per rank plus the templates;
//   - restoring: a rank rebuilds the plan from the MANIFEST (O(ranks + template tensors)),
//     finds the parts its targets overlap by arithmetic, and reads the index files of only
//     those parts' writers (PartialManifest);
//   - tools that want every box (cairn ls/verify, PfsStep, ReadShards) read all index
//     files once (ExpandManifest) and get a format-1-shaped MANIFEST.
// Index file bytes: "CIX1", u32 pieces, per piece u64 offset, u32 chunks, u64 checksums.
// Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/box.h"
#include "cairn/status.h"
#include "core/filesystem.h"
#include "layout/templated_plan.h"
#include "persist/commit.h"
#include "persist/manifest.h"

namespace cairn {

inline constexpr uint32_t kTemplatedManifestVersion = 2;

// "data/<rank>.idx", relative to the step directory.
std::string IndexFileName(int rank);

std::string EncodeWriterIndex(const std::vector<LocationTable::Piece>& pieces);
// Corruption saying what is wrong.
Result<std::vector<LocationTable::Piece>> DecodeWriterIndex(std::string_view bytes);

// Rank 0: the format-2 MANIFEST of `step` from the plan and every rank's table (which
// carries its index file's digest and its blobs, not its pieces).
Result<pb::Manifest> BuildTemplatedManifest(const TemplatedPlan& plan,
                                            const std::vector<LocationTable>& tables,
                                            const std::string& job, int64_t step,
                                            uint64_t chunk_bytes);

// The plan a format-2 MANIFEST was saved with (Corruption when its templates do not make
// one).
Result<TemplatedPlan> PlanOfManifest(const pb::Manifest& m);

// Reads writer `rank`'s index file (its bytes, unchecked).
using IndexReader = std::function<Result<std::string>(int rank)>;
IndexReader FileIndexReader(FileSystem* fs, const std::string& step_dir);

// A format-1-shaped MANIFEST holding only the pieces that some target (tensor name, box)
// meets, the files they lie in, and the blobs of `blob_rank` (-1: none); its shards are
// the saved parts those pieces are. Reads the index files of those pieces' writers, each
// checked against the MANIFEST's length, XXH3 and piece count (Corruption naming the
// file). Targets naming no saved tensor, or of another shape, are left for the reader to
// refuse. *index_bytes (optional) is set to the index bytes read.
Result<pb::Manifest> PartialManifest(const pb::Manifest& m,
                                     const std::vector<std::pair<std::string, Box>>& targets,
                                     int blob_rank, const IndexReader& read_index,
                                     uint64_t* index_bytes = nullptr);
// Same, with the plan PlanOfManifest(m) made.
Result<pb::Manifest> PartialManifest(const pb::Manifest& m, const TemplatedPlan& plan,
                                     const std::vector<std::pair<std::string, Box>>& targets,
                                     int blob_rank, const IndexReader& read_index,
                                     uint64_t* index_bytes = nullptr);

// Every piece: the whole step as a format-1-shaped MANIFEST (reads every index file).
Result<pb::Manifest> ExpandManifest(const pb::Manifest& m, const IndexReader& read_index);

}  // namespace cairn
