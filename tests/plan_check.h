// Checks of a save plan and layouts shared by the planner tests.
#pragma once

#include <gtest/gtest.h>

#include <algorithm>
#include <set>
#include <string>
#include <vector>

#include "layout/layout_template.h"
#include "layout/save_planner.h"

namespace cairn::testing {

// Every unique shard is covered exactly once by the plan's pieces, each written by a rank
// that holds it, and the pieces of a shard are consecutive slabs.
inline void ExpectCoveredOnce(const SavePlan& plan) {
  std::vector<std::vector<const PlannedPiece*>> of(plan.shards.size());
  for (const PlannedPiece& p : plan.pieces) {
    of[p.shard].push_back(&p);
    const auto& list = plan.lists[plan.rank_list[static_cast<size_t>(p.writer)]];
    EXPECT_NE(std::find(list.begin(), list.end(), p.shard), list.end())
        << "piece written by rank " << p.writer << " which does not hold it";
  }
  for (size_t s = 0; s < plan.shards.size(); ++s) {
    auto& v = of[s];
    std::sort(v.begin(), v.end(), [](auto* a, auto* b) { return a->src_offset < b->src_offset; });
    uint64_t at = 0;
    int64_t numel = 0;
    for (const PlannedPiece* p : v) {
      EXPECT_EQ(p->src_offset, at) << "shard " << s;
      at += p->nbytes;
      numel += p->box.numel();
      auto in = Intersect(p->box, plan.shards[s].box);
      ASSERT_TRUE(in.has_value());
      EXPECT_EQ(*in, p->box);
    }
    EXPECT_EQ(at, plan.shards[s].nbytes) << "shard " << s;
    EXPECT_EQ(numel, plan.shards[s].box.numel());
  }
}

// A small model for the template tests: matrices, a 3-d tensor, a vector shorter than
// most worlds, a scalar.
inline std::vector<TensorMeta> SmallModel() {
  return {{"embed", DType::kF32, {37, 5}},
          {"w", DType::kBF16, {12, 16}},
          {"cube", DType::kF32, {3, 4, 5}},
          {"bias", DType::kF32, {5}},
          {"step", DType::kI64, {}}};
}

// Every tensor split by `rule` into `parts` (scalars and the tensors named in `whole` whole).
inline LayoutTemplate UniformTemplate(const std::vector<TensorMeta>& tensors, SplitRule rule,
                                      uint32_t parts, const std::set<std::string>& whole = {}) {
  LayoutTemplate t;
  t.tensors = tensors;
  t.parts = parts;
  for (const TensorMeta& m : tensors)
    t.rules.push_back(m.global_shape.empty() || whole.count(m.name) ? SplitRule{} : rule);
  return t;
}

// FSDP2 over tensor parallelism (issue 37): rank (i, j) of `fsdp` x `tp` (j innermost)
// holds, of each tensor, the TP chunk j (ceil) along tp_dim (or the whole tensor: -1), and
// of that the FSDP2 chunk i (ceil) along dimension 0; an empty part is not listed. Scalars
// are whole.
struct TpTensor {
  TensorMeta meta;
  int tp_dim;
};
inline std::vector<TpTensor> TpModel() {
  return {{{"qkv", DType::kF32, {13, 6}}, 0},     // column-parallel: a chunk of a chunk
          {{"proj", DType::kBF16, {6, 9}}, 1},    // row-parallel: two dimensions cut
          {{"norm", DType::kF32, {5}}, -1},       // replicated over TP: tp holders a part
          {{"bias", DType::kF32, {2}}, 0},        // empty FSDP parts
          {{"cube", DType::kF32, {4, 3, 5}}, 2},  // an empty part at the last FSDP index
          {{"step", DType::kI64, {}}, -1}};
}
inline RankLayout Fsdp2OverTp(const std::vector<TpTensor>& model, int fsdp, int tp, int i, int j) {
  RankLayout l;
  auto chunk = [](Box* b, size_t d, int n, int k) {
    const int64_t len = b->lengths[d], per = (len + n - 1) / n;
    const int64_t lo = std::min(len, per * k), hi = std::min(len, lo + per);
    b->offsets[d] += lo;
    b->lengths[d] = hi - lo;
  };
  for (const TpTensor& t : model) {
    Box b = Box::Whole(t.meta.global_shape);
    if (!t.meta.global_shape.empty()) {
      if (t.tp_dim >= 0) chunk(&b, static_cast<size_t>(t.tp_dim), tp, j);
      chunk(&b, 0, fsdp, i);
      if (b.empty()) continue;
    }
    l.shards.push_back({static_cast<uint32_t>(l.tensors.size()), std::move(b)});
    l.tensors.push_back(t.meta);
  }
  return l;
}
// The job's layouts: `replicas` x fsdp x tp ranks (HSDP when replicas > 1).
// With `stages` > 1, pipeline stages outermost: stage k holds its own tensors ("s<k>.").
inline std::vector<RankLayout> Fsdp2OverTpJob(int fsdp, int tp, int replicas = 1, int stages = 1) {
  std::vector<RankLayout> out;
  const int per_stage = replicas * fsdp * tp;
  for (int r = 0; r < stages * per_stage; ++r) {
    std::vector<TpTensor> model = TpModel();
    if (stages > 1)
      for (TpTensor& t : model)
        t.meta.name = "s" + std::to_string(r / per_stage) + "." + t.meta.name;
    const int k = r % per_stage;
    out.push_back(Fsdp2OverTp(model, fsdp, tp, (k / tp) % fsdp, k % tp));
  }
  return out;
}

}  // namespace cairn::testing
