// Reading a committed step back from the parallel filesystem.
//
// ReadShards fills target shards of any layout by box intersection: every saved box that
// overlaps a target is read once, all its chunk checksums are verified, and the
// overlapping elements are copied into each target it meets. VerifyStep reads and checks
// every byte of a step (what `cairn verify` and the crash tests use).
// Thread-safety: plain functions.
#pragma once

#include <functional>
#include <map>
#include <span>
#include <string>

#include "cairn/status.h"
#include "cairn/tensor.h"
#include "core/filesystem.h"
#include "persist/manifest.h"

namespace cairn {

// Corruption naming the data file, tensor and byte range of the first mismatch; IOError
// naming the file when it cannot be read.
// `progress` (optional) is called after each saved box with (bytes checked, bytes in all).
Status VerifyStep(FileSystem* fs, const std::string& step_dir, const pb::Manifest& manifest,
                  const std::function<void(uint64_t, uint64_t)>& progress = {});

// Fills `targets` from the step. Errors: NotFound (tensor not saved), InvalidArgument
// (dtype or shape differ), Corruption (part of a target was never saved, or a checksum
// mismatch naming the file). On error some targets may already be written.
// `blobs` (optional) receives the blobs saved by `blob_rank`.
Status ReadShards(FileSystem* fs, const std::string& step_dir, const pb::Manifest& manifest,
                  std::span<const ShardSpec> targets, int blob_rank = -1,
                  std::map<std::string, std::string>* blobs = nullptr);

// Checks the chunk of saved box `b` that starts at byte `lo` of the box (a multiple of the
// chunk size; `data` holds its bytes): OK, or Corruption naming the tensor, box, byte range
// and `path` (the data file).
Status CheckSavedChunk(const pb::Manifest& manifest, const pb::SavedBox& b, uint64_t lo,
                       const std::byte* data, const std::string& path);

// The blobs `rank` saved with the step, verified.
Status ReadRankBlobs(FileSystem* fs, const std::string& step_dir, const pb::Manifest& manifest,
                     int rank, std::map<std::string, std::string>* out);

}  // namespace cairn
