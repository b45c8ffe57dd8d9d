// A committed step of a job's PFS tier, read without a running job: what it holds (the
// tensors, the boxes they were saved as, the blobs) and its bytes, read into targets of
// any layout. What `cairn export` and cairn.dcp's StorageReader (torch.distributed.
// checkpoint.load from a cairn step) are built on.
//
//   auto step = cairn::PfsStep::Open("/lustre/ckpt/run7");   // the step LATEST names
//   for (const auto& t : step->tensors()) ...                 // name, dtype, shape, boxes
//   CAIRN_RETURN_IF_ERROR(step->read(targets));               // any boxes of any tensors
//
// Thread-safety: const methods may be called from several threads at once.
#pragma once

#include <cstdint>
#include <map>
#include <memory>
#include <span>
#include <string>
#include <vector>

#include "cairn/box.h"
#include "cairn/status.h"
#include "cairn/tensor.h"

namespace cairn {

class PfsStep {
 public:
  struct Tensor {
    TensorMeta meta;
    // The boxes its bytes were written as: disjoint, together the whole tensor.
    std::vector<Box> boxes;
  };

  // The committed step `step` of the job directory `job_dir` (<CAIRN_PFS_ROOT>/<job id>);
  // step < 0: the one LATEST names. NotFound when there is none (or not that one),
  // Corruption naming the file when its MANIFEST does not parse.
  static Result<PfsStep> Open(const std::string& job_dir, int64_t step = -1);
  // The committed steps of `job_dir`, oldest first (NotFound when it has none).
  static Result<std::vector<int64_t>> Steps(const std::string& job_dir);

  PfsStep(PfsStep&&) noexcept;
  PfsStep& operator=(PfsStep&&) noexcept;
  ~PfsStep();

  int64_t step() const;
  int world_size() const;  // of the job that saved it
  const std::string& directory() const;
  const std::vector<Tensor>& tensors() const;

  // Fills `targets` (host memory; any boxes of saved tensors), verifying every chunk read.
  // NotFound (a tensor not saved), InvalidArgument (dtype or shape differ), Corruption
  // naming the file (checksum mismatch, truncated file).
  Status read(std::span<const ShardSpec> targets) const;
  // The blobs `rank` saved with the step, verified.
  Result<std::map<std::string, std::string>> blobs(int rank) const;

 private:
  struct Impl;
  explicit PfsStep(std::unique_ptr<Impl> impl);
  std::unique_ptr<Impl> impl_;
};

}  // namespace cairn
