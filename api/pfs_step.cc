// PfsStep: the MANIFEST of a committed step and the PFS reader behind the public API.
#include "cairn/pfs_step.h"

#include <utility>

#include "core/filesystem.h"
#include "persist/manifest.h"
#include "persist/pfs_reader.h"

namespace cairn {

struct PfsStep::Impl {
  std::string dir;
  pb::Manifest manifest;
  std::vector<Tensor> tensors;
};

PfsStep::PfsStep(std::unique_ptr<Impl> impl) : impl_(std::move(impl)) {}
PfsStep::PfsStep(PfsStep&&) noexcept = default;
PfsStep& PfsStep::operator=(PfsStep&&) noexcept = default;
PfsStep::~PfsStep() = default;

Result<PfsStep> PfsStep::Open(const std::string& job_dir, int64_t step) {
  FileSystem* fs = DefaultFileSystem();
  if (step < 0) {
    CAIRN_ASSIGN_OR_RETURN(step, ReadLatest(fs, job_dir));
  }
  auto impl = std::make_unique<Impl>();
  impl->dir = JoinPath(job_dir, StepDirName(step));
  auto manifest = ReadManifest(fs, impl->dir);
  if (!manifest.ok()) {
    if (manifest.status().code() == StatusCode::kNotFound)
      return Status::NotFound("step " + std::to_string(step) + " of " + job_dir +
                              " is not committed (" + manifest.status().message() + ")");
    return manifest.status();
  }
  impl->manifest = std::move(*manifest);
  const pb::Manifest& m = impl->manifest;
  impl->tensors.resize(m.tensors_size());
  for (int t = 0; t < m.tensors_size(); ++t) {
    const pb::Tensor& x = m.tensors(t);
    impl->tensors[t].meta = {x.name(), static_cast<DType>(x.dtype()),
                             Shape(x.shape().begin(), x.shape().end())};
  }
  for (const pb::SavedBox& b : m.boxes()) {
    if (b.tensor() >= impl->tensors.size())
      return Status::Corruption(JoinPath(impl->dir, "MANIFEST") + ": a box names tensor " +
                                std::to_string(b.tensor()) + " of " +
                                std::to_string(impl->tensors.size()));
    impl->tensors[b.tensor()].boxes.push_back(
        Box{std::vector<int64_t>(b.offsets().begin(), b.offsets().end()),
            std::vector<int64_t>(b.lengths().begin(), b.lengths().end())});
  }
  return PfsStep(std::move(impl));
}

Result<std::vector<int64_t>> PfsStep::Steps(const std::string& job_dir) {
  CAIRN_ASSIGN_OR_RETURN(std::vector<int64_t> steps,
                         ListCommittedSteps(DefaultFileSystem(), job_dir));
  if (steps.empty()) return Status::NotFound(job_dir + " holds no committed step");
  return steps;
}

int64_t PfsStep::step() const {
  return impl_->manifest.step();
}
int PfsStep::world_size() const {
  return static_cast<int>(impl_->manifest.world_size());
}
const std::string& PfsStep::directory() const {
  return impl_->dir;
}
const std::vector<PfsStep::Tensor>& PfsStep::tensors() const {
  return impl_->tensors;
}

Status PfsStep::read(std::span<const ShardSpec> targets) const {
  for (const ShardSpec& s : targets)
    if (s.memory != MemoryKind::kHost)
      return Status::InvalidArgument("PfsStep::read: target '" + s.meta.name +
                                     "' is not in host memory");
  return ReadShards(DefaultFileSystem(), impl_->dir, impl_->manifest, targets);
}

Result<std::map<std::string, std::string>> PfsStep::blobs(int rank) const {
  if (rank < 0 || rank >= world_size())
    return Status::InvalidArgument("rank " + std::to_string(rank) + " is outside the world of " +
                                   std::to_string(world_size()) + " that saved step " +
                                   std::to_string(step()));
  std::map<std::string, std::string> out;
  CAIRN_RETURN_IF_ERROR(
      ReadRankBlobs(DefaultFileSystem(), impl_->dir, impl_->manifest, rank, &out));
  return out;
}

}  // namespace cairn
