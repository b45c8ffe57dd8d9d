// The commit side of a persist: location tables, MANIFEST building, the atomic commit of
// MANIFEST and LATEST, and garbage collection of the job's PFS directory.
// Thread-safety: plain functions; only one process (rank 0) commits a job at a time.
#pragma once

#include <cstdint>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "layout/save_planner.h"
#include "persist/manifest.h"

namespace cairn {

// Where one rank put the pieces it was planned to write (in SavePlan::PiecesOf order) and
// its blobs, in its data file.
struct LocationTable {
  struct Piece {
    uint64_t offset = 0;
    std::vector<uint64_t> chunk_checksums;
  };
  struct Blob {
    std::string name;
    uint64_t offset = 0;
    uint64_t length = 0;
    uint64_t checksum = 0;
  };
  Status status;  // not OK: this rank failed to write (the message says why)
  // A templated plan's writer puts its pieces in its index file (persist/step_index.h)
  // and reports only the file's digest here.
  bool indexed = false;
  uint32_t index_pieces = 0;
  uint64_t index_bytes = 0, index_checksum = 0;
  std::vector<Piece> pieces;  // when not indexed
  std::vector<Blob> blobs;
};

std::string EncodeLocationTable(const LocationTable& t);
Result<LocationTable> DecodeLocationTable(std::string_view bytes);

// The fields every MANIFEST starts with (format `version`, what was saved, the tensors);
// InvalidArgument when there is not one location table per rank.
Result<pb::Manifest> ManifestHead(uint32_t version, const std::vector<TensorMeta>& tensors,
                                  size_t tables, int world, const std::string& job, int64_t step,
                                  uint64_t chunk_bytes);

// The MANIFEST of `step` from the plan and every rank's table (indexed by rank; all OK).
// InvalidArgument when a table does not match the plan.
Result<pb::Manifest> BuildManifest(const SavePlan& plan, const std::vector<LocationTable>& tables,
                                   const std::string& job, int64_t step, uint64_t chunk_bytes);

// Publishes <job_dir>/<step dir>/MANIFEST, then <job_dir>/LATEST, each atomically (temporary
// name, fsync, rename, directory fsync). A failure fails the step: if LATEST was already
// renamed when a later call failed, the previous LATEST is put back. Only if that fails
// too does LATEST keep naming the new step (whose data and MANIFEST are complete and
// verified); then *left_published is set and the step's files must be kept.
Status CommitStep(FileSystem* fs, const std::string& job_dir, int64_t step,
                  const pb::Manifest& manifest, bool* left_published);

// Removes, under `job_dir`: step directories without MANIFEST (except `in_flight`, -1 for
// none), committed steps older than the `keep` newest (never the one LATEST names), and
// temporary files of interrupted commits. Failures are logged, not returned.
void CollectPfsGarbage(FileSystem* fs, const std::string& job_dir, int keep, int64_t in_flight,
                       const Logger* log);

}  // namespace cairn
