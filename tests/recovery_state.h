// The state the recovery tests train: a few tensors whose every byte at step t is a
// function of (t, tensor, global byte index), so a rank can check any box of any layout it
// restored without holding the whole model.
#pragma once

#include <algorithm>
#include <cstdint>
#include <string>
#include <utility>
#include <vector>

#include "cairn/box.h"
#include "cairn/tensor.h"

namespace cairn::testing {

class ModelState {
 public:
  // About 2.3 * rows KiB in all.
  explicit ModelState(int64_t rows) {
    metas_.push_back({"embed.weight", DType::kF32, {8 * rows, 64}});
    metas_.push_back({"layers.0.w", DType::kBF16, {4 * rows, 96}});
    metas_.push_back({"layers.1.w", DType::kF32, {96, 2 * rows}});
    metas_.push_back({"layers.0.b", DType::kF32, {300}});
    metas_.push_back({"step_count", DType::kI64, {}});
  }

  // The boxes rank `rank` of `world` holds under `layout`:
  //   dp     every tensor whole (data parallel)
  //   tpK    dim 0 split in K parts, rank r holds part r % K (K-way tensor parallel,
  //          world/K data-parallel replicas)
  //   col2   the last dimension split in 2 (matrices only), rank r holds half r % 2
  //   flat   each tensor's flat elements split evenly over the world (ZeRO-3 / FSDP)
  //   fsdp2tp  FSDP2 over 2-way tensor parallelism (an even world): the last dimension
  //          chunked by rank % 2, then dimension 0 of that chunked by rank / 2 over world / 2
  //          (DTensor [Shard(0), Shard(1)]); a vector chunked by rank / 2 only (replicated
  //          over the TP pair)
  //   tpdrop dimension 0 split over the world dropping the remainder: rank r holds rows
  //          [r * (D / world), (r + 1) * (D / world)), the last D mod world rows no rank
  //          (bench/plan's irregular Megatron layout: truncated chunks of layout templates)
  // Empty when the layout name is unknown.
  std::vector<std::pair<size_t, Box>> Layout(const std::string& layout, int rank, int world) const {
    std::vector<std::pair<size_t, Box>> out;
    for (size_t i = 0; i < metas_.size(); ++i) {
      const Shape& s = metas_[i].global_shape;
      Box whole = Box::Whole(s);
      if (layout == "dp" || s.empty()) {
        out.push_back({i, whole});
      } else if (layout == "tpdrop") {
        const int64_t per = s[0] / world;
        whole.offsets[0] = per * rank;
        whole.lengths[0] = per;
        if (!whole.empty()) out.push_back({i, whole});
      } else if (layout.rfind("tp", 0) == 0) {
        const int64_t k = std::stoll(layout.substr(2));
        const int64_t part = rank % k;
        whole.offsets[0] = s[0] * part / k;
        whole.lengths[0] = s[0] * (part + 1) / k - whole.offsets[0];
        out.push_back({i, whole});
      } else if (layout == "col2") {
        if (s.size() >= 2) {
          const size_t d = s.size() - 1;
          whole.offsets[d] = s[d] / 2 * (rank % 2);
          whole.lengths[d] = rank % 2 ? s[d] - s[d] / 2 : s[d] / 2;
        }
        out.push_back({i, whole});
      } else if (layout == "fsdp2tp") {
        auto chunk = [](int64_t n, int64_t parts, int64_t i, int64_t* off, int64_t* len) {
          const int64_t c = (n + parts - 1) / parts;  // torch.chunk: ceil, the last shorter
          *off = std::min(n, c * i);
          *len = std::min(c, n - *off);
        };
        const size_t last = s.size() - 1;
        if (s.size() >= 2) chunk(s[last], 2, rank % 2, &whole.offsets[last], &whole.lengths[last]);
        chunk(whole.lengths[0], world / 2, rank / 2, &whole.offsets[0], &whole.lengths[0]);
        if (!whole.empty()) out.push_back({i, whole});
      } else if (layout == "flat") {
        const int64_t n = NumElements(s);
        auto boxes = FlatRangeToBoxes(s, n * rank / world, n * (rank + 1) / world);
        if (boxes.ok())
          for (Box& b : *boxes)
            if (!b.empty()) out.push_back({i, b});
      } else {
        return {};
      }
    }
    return out;
  }

  // Buffers for a layout's boxes; Shards() points at them.
  struct Held {
    std::vector<std::pair<size_t, Box>> boxes;
    std::vector<std::vector<std::byte>> bytes;
  };
  Held Make(const std::vector<std::pair<size_t, Box>>& boxes) const {
    Held h;
    h.boxes = boxes;
    for (const auto& [i, b] : boxes)
      h.bytes.emplace_back(static_cast<size_t>(b.numel()) * DTypeSize(metas_[i].dtype),
                           std::byte{0x5a});
    return h;
  }
  std::vector<ShardSpec> Shards(Held& h) const {
    std::vector<ShardSpec> out;
    for (size_t k = 0; k < h.boxes.size(); ++k) {
      ShardSpec s;
      s.meta = metas_[h.boxes[k].first];
      s.box = h.boxes[k].second;
      s.data = h.bytes[k].data();
      out.push_back(s);
    }
    return out;
  }
  // Writes (check = false) or checks (true) the bytes of `step` into every box of `h`.
  // Returns "" or what differs.
  std::string Visit(Held& h, int64_t step, bool check) const {
    for (size_t k = 0; k < h.boxes.size(); ++k) {
      const auto& [i, box] = h.boxes[k];
      const size_t elem = DTypeSize(metas_[i].dtype);
      const Shape& shape = metas_[i].global_shape;
      std::byte* p = h.bytes[k].data();
      const int64_t n = box.numel();
      std::vector<int64_t> idx(box.ndim(), 0);
      for (int64_t e = 0; e < n; ++e) {
        // Global element index of idx.
        uint64_t g = 0;
        for (size_t d = 0; d < box.ndim(); ++d)
          g = g * static_cast<uint64_t>(shape[d]) + static_cast<uint64_t>(box.offsets[d] + idx[d]);
        for (size_t b = 0; b < elem; ++b) {
          const std::byte want = ByteAt(step, i, g * elem + b);
          if (!check) {
            p[static_cast<size_t>(e) * elem + b] = want;
          } else if (p[static_cast<size_t>(e) * elem + b] != want) {
            return metas_[i].name + " box " + box.ToString() + " element " + std::to_string(e) +
                   " differs from step " + std::to_string(step);
          }
        }
        for (size_t d = box.ndim(); d-- > 0;) {
          if (++idx[d] < box.lengths[d]) break;
          idx[d] = 0;
        }
      }
    }
    return "";
  }
  uint64_t Bytes(const Held& h) const {
    uint64_t n = 0;
    for (const auto& b : h.bytes) n += b.size();
    return n;
  }
  static std::string Blob(int rank, int64_t step) {
    return "rank " + std::to_string(rank) + " at step " + std::to_string(step);
  }

 private:
  static std::byte ByteAt(int64_t step, size_t tensor, uint64_t g) {
    uint64_t x = static_cast<uint64_t>(step) * 0x9e3779b97f4a7c15ull +
                 tensor * 0xbf58476d1ce4e5b9ull + (g >> 3);
    x ^= x >> 30;
    x *= 0xbf58476d1ce4e5b9ull;
    x ^= x >> 27;
    x *= 0x94d049bb133111ebull;
    x ^= x >> 31;
    return static_cast<std::byte>(x >> (8 * (g & 7)));
  }
  std::vector<TensorMeta> metas_;
};

}  // namespace cairn::testing
