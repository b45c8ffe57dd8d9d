// The parallel-filesystem format: directory names, the MANIFEST file and LATEST.
//
//   <pfs_root>/<job>/step-<000123>/data/<rank>.bin   payloads, each box 4 KiB aligned
//   <pfs_root>/<job>/step-<000123>/data/<rank>.idx   format 2: where the rank's pieces lie
//   <pfs_root>/<job>/step-<000123>/MANIFEST          framed protobuf (persist/manifest.proto)
//   <pfs_root>/<job>/LATEST                          "<step>\n": the newest committed step
// persist/FORMAT.md describes the bytes. A step directory without MANIFEST does not exist
// for readers. Thread-safety: plain functions.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.h"
#include "core/filesystem.h"
#include "layout/load_planner.h"
#include "persist/manifest.pb.h"

namespace cairn {

inline constexpr uint32_t kManifestFormatVersion = 1;
// Largest MANIFEST cairn will read.
inline constexpr uint64_t kMaxManifestBytes = 4ull << 30;
// File offsets of boxes and blobs in data files are multiples of this.
inline constexpr uint64_t kPfsAlign = 4096;

// "<pfs_root>/<job>"
std::string PfsJobDir(const std::string& pfs_root, const std::string& job);
// "step-000123" (at least six digits).
std::string StepDirName(int64_t step);
// The step of a directory name made by StepDirName; nullopt for any other name.
std::optional<int64_t> ParseStepDirName(std::string_view name);
// "data/<rank>.bin", relative to the step directory.
std::string DataFileName(int rank);

// MANIFEST bytes: "CAIRNMF1", u64 length of the protobuf, the protobuf, u64 XXH3 of the
// protobuf (little-endian).
std::string EncodeManifest(const pb::Manifest& m);
// Checks the framing, the checksum and everything ValidateManifest checks. Corruption
// saying what is wrong (the caller adds the file name).
Result<pb::Manifest> DecodeManifest(std::string_view bytes);
// Fills `catalog`'s chunk size, tensors and pieces from a PFS step's MANIFEST (one piece
// per saved box; its `where` and `step` are the caller's): what the load planner restores
// from.
void CatalogFromManifest(const pb::Manifest& manifest, LoadCatalog* catalog);
// Format version, names, dtypes, boxes inside shapes, indices in range, chunk tables
// consistent with lengths, file names of the form "data/<n>.bin", layout sizes; for
// format 2 the templates and per-rank tables.
Status ValidateManifest(const pb::Manifest& m);

// Reads and decodes "<step_dir>/MANIFEST" as it is (format 1 or 2); errors name the file.
Result<pb::Manifest> ReadManifestFile(FileSystem* fs, const std::string& step_dir);
// Same, with a format-2 MANIFEST expanded to format 1's shape (every box, located: reads
// every writer's index file, persist/step_index.h).
Result<pb::Manifest> ReadManifest(FileSystem* fs, const std::string& step_dir);
// The step LATEST names; NotFound when there is none, Corruption naming the file when it
// does not parse.
Result<int64_t> ReadLatest(FileSystem* fs, const std::string& job_dir);
// The steps of `job_dir` whose directory holds a MANIFEST, oldest first (IOError naming the
// directory when it cannot be listed).
Result<std::vector<int64_t>> ListCommittedSteps(FileSystem* fs, const std::string& job_dir);

}  // namespace cairn
