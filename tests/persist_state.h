// The state the persistence tests save: a small data-parallel model (every rank holds the
// same whole tensors) whose every byte at step t is a function of t, plus a per-rank blob,
// and the check that a step read back from the PFS is bit-exact.
#pragma once

#include <cstdint>
#include <map>
#include <string>
#include <vector>

#include "cairn/tensor.h"
#include "core/filesystem.h"
#include "persist/manifest.h"
#include "persist/pfs_reader.h"
#include "tests/test_util.h"

namespace cairn::testing {

struct PersistState {
  // About 17 * rows KiB in all (rows = 1024: 17 MiB).
  explicit PersistState(int64_t rows) {
    Add("embed.weight", DType::kF32, {8 * rows, 256});
    Add("layers.0.w", DType::kF32, {4 * rows, 256});
    Add("layers.1.w", DType::kBF16, {4 * rows, 512});
    Add("layers.2.w", DType::kF32, {2 * rows, 128});
    Add("layers.0.b", DType::kF32, {256});
    Add("final_norm", DType::kF16, {1000});
    Add("step_count", DType::kI64, {});
  }
  std::vector<TensorMeta> metas;
  std::vector<std::vector<std::byte>> data;

  void Add(std::string name, DType dt, Shape shape) {
    metas.push_back({std::move(name), dt, shape});
    data.emplace_back(static_cast<size_t>(NumElements(shape)) * DTypeSize(dt));
  }
  static uint64_t Seed(int64_t step, size_t i) { return static_cast<uint64_t>(step) * 1000 + i; }
  void Fill(int64_t step) {
    for (size_t i = 0; i < data.size(); ++i)
      FillPattern(data[i].data(), data[i].size(), Seed(step, i));
  }
  std::vector<ShardSpec> Shards() {
    std::vector<ShardSpec> s;
    for (size_t i = 0; i < metas.size(); ++i)
      s.push_back(ShardSpec::Whole(metas[i], data[i].data()));
    return s;
  }
  uint64_t bytes() const {
    uint64_t n = 0;
    for (const auto& d : data) n += d.size();
    return n;
  }
  static std::string Blob(int rank, int64_t step) {
    return "rank " + std::to_string(rank) + " at step " + std::to_string(step);
  }

  // Reads every tensor of the step in `step_dir` into fresh whole-tensor buffers and checks
  // they hold the pattern of `step`, and that rank `rank`'s blob is Blob(rank, step) (when
  // rank >= 0). Returns "" when all is well, else what is wrong.
  std::string Check(FileSystem* fs, const std::string& step_dir, int64_t step, int rank) const {
    auto m = ReadManifest(fs, step_dir);
    if (!m.ok()) return m.status().ToString();
    if (m->step() != step) return "manifest step " + std::to_string(m->step());
    std::vector<std::vector<std::byte>> got(data.size());
    std::vector<ShardSpec> targets;
    for (size_t i = 0; i < metas.size(); ++i) {
      got[i].assign(data[i].size(), std::byte{0x5a});
      targets.push_back(ShardSpec::Whole(metas[i], got[i].data()));
    }
    std::map<std::string, std::string> blobs;
    Status st = ReadShards(fs, step_dir, *m, targets, rank, &blobs);
    if (!st.ok()) return st.ToString();
    for (size_t i = 0; i < metas.size(); ++i)
      if (!CheckPattern(got[i].data(), got[i].size(), Seed(step, i)))
        return "tensor " + metas[i].name + " differs from step " + std::to_string(step);
    if (rank >= 0 && blobs["who"] != Blob(rank, step))
      return "blob differs: '" + blobs["who"] + "'";
    return "";
  }
};

}  // namespace cairn::testing
