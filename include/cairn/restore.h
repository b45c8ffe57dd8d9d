// What restore() takes and reports (Checkpointer::restore, docs/guarantees.md).
// Thread-safety: plain values.
#pragma once

#include <cstdint>
#include <map>
#include <optional>
#include <string>
#include <vector>

#include "cairn/tensor.h"

namespace cairn {

// Small named byte strings saved with a version (RNG state, data-loader position).
using Blobs = std::map<std::string, std::string>;

struct RestoreOptions {
  // The step to restore; unset: the newest step every rank can restore (falling back to
  // older ones when a version fails verification).
  std::optional<int64_t> step;
  // Allow saved tensors that no rank restores (e.g. loading only the model weights);
  // otherwise that is an error naming them.
  bool partial = false;
  // Device targets: the copies into them run after the work queued on this stream so far
  // (kernels still writing the targets), and have finished when restore() returns.
  CudaStream stream = nullptr;
};

struct RestoreReport {
  int64_t step = -1;
  // Where this rank's bytes came from: "host" (its own memory), "peer" (some from other
  // ranks' memory over UCX), "pfs" (the parallel filesystem, maybe via other ranks).
  std::string tier;
  uint64_t bytes = 0;  // target bytes filled
  double seconds = 0;
  // The blobs the rank of this number saved; in a job that grew, a rank whose number saved
  // nothing gets rank 0's (DCP's non-tensor state is the coordinator's alike).
  Blobs blobs;
  int blobs_rank = -1;               // whose blobs they are: this rank, or 0
  std::vector<std::string> skipped;  // newer versions passed over, and why
  bool resharded = false;            // some target differs from every saved box
  uint64_t bytes_local = 0;          // copied from this rank's own memory
  uint64_t bytes_received = 0;       // received from other ranks
  uint64_t pfs_bytes_read = 0;       // read from the PFS by this rank
  uint64_t job_pfs_bytes_read = 0;   // by the whole job
  // Saved bytes some target of the job needs (when ranks planned alone, a "templated"
  // plan: the sum of what each rank's targets need, so bytes two ranks need count twice).
  uint64_t job_unique_bytes_needed = 0;
  // How the restore was planned, and why: "templated: ..." (every rank planned its own part
  // from layout templates, as in fully sharded jobs: nobody gathered the job's target
  // layouts or saved boxes) or "general: <why>" (gathered and planned job-wide).
  std::string plan;
  // This rank's version was lost with its node and decoded, before this restore, from the
  // parity its erasure-coded set holds (CAIRN_REDUNDANCY=xor|rs), and restored from there:
  // the step, or -1.
  int64_t rebuilt_step = -1;
};

}  // namespace cairn
