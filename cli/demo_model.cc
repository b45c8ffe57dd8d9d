#include "cli/demo_model.h"
#include "core/box_copy.h"

#include <algorithm>
#include <cmath>
#include <cstring>
#include <utility>

namespace cairn::cli {
namespace {

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

float Uniform(uint64_t bits) {  // in [-0.5, 0.5)
  return static_cast<float>(static_cast<double>(bits >> 40) * 0x1p-24 - 0.5);
}

float InitialWeight(size_t tensor, uint64_t gi) {
  return Uniform(Mix(uint64_t{tensor} << 40 ^ gi)) * 0.04f;
}

// The key of step `step`'s gradients of tensor `tensor`.
uint64_t StepKey(int64_t step, size_t tensor) {
  return Mix(static_cast<uint64_t>(step) * 0x2545f4914f6cdd1dull + tensor);
}

// Training and replay use these two functions only, so they compute the same floats.
float Gradient(uint64_t key, uint64_t gi, float w) {
  return Uniform(Mix(key ^ gi)) * 0.02f + 1e-3f * w;
}
void Adam(float g, float& w, float& m, float& v) {
  m = 0.9f * m + 0.1f * g;
  v = 0.999f * v + 0.001f * g * g;
  w -= 1e-3f * m / (std::sqrt(v) + 1e-8f);
}

struct Element {
  float w, m, v;
};
Element Replay(size_t tensor, uint64_t gi, const std::vector<uint64_t>& keys) {
  Element e{InitialWeight(tensor, gi), 0.f, 0.f};
  for (uint64_t key : keys) Adam(Gradient(key, gi, e.w), e.w, e.m, e.v);
  return e;
}

// `b` with dimension `d` cut into `parts` near-equal parts, part `part`.
Box Split(Box b, size_t d, int64_t parts, int64_t part) {
  const int64_t len = b.lengths[d];
  b.offsets[d] += len * part / parts;
  b.lengths[d] = len * (part + 1) / parts - len * part / parts;
  return b;
}

bool SameBits(float a, float b) {
  return std::memcmp(&a, &b, sizeof a) == 0;
}

ShardSpec F32Shard(std::string name, const Shape& shape, const Box& box, float* data) {
  ShardSpec s;
  s.meta = {std::move(name), DType::kF32, shape};
  s.box = box;
  s.data = data;
  return s;
}

std::string Differs(const std::string& what, const Box& box, uint64_t gi, float got, float want) {
  char buf[160];
  std::snprintf(buf, sizeof buf, " box %s: element %llu is %.9g, a replay gives %.9g",
                box.ToString().c_str(), static_cast<unsigned long long>(gi), got, want);
  return what + buf;
}

}  // namespace

std::vector<DemoTensor> GptTensors(int layers, int64_t dim, int64_t vocab) {
  std::vector<DemoTensor> t;
  t.push_back({"embedding.weight", {vocab, dim}, 0});
  for (int l = 0; l < layers; ++l) {
    const std::string p = "layers." + std::to_string(l) + ".";
    t.push_back({p + "ln1.weight", {dim}, -1});
    t.push_back({p + "attn.qkv.weight", {3 * dim, dim}, 0});
    t.push_back({p + "attn.out.weight", {dim, dim}, 1});
    t.push_back({p + "ln2.weight", {dim}, -1});
    t.push_back({p + "mlp.fc1.weight", {4 * dim, dim}, 0});
    t.push_back({p + "mlp.fc2.weight", {dim, 4 * dim}, 1});
  }
  t.push_back({"ln_f.weight", {dim}, -1});
  return t;
}

ShardedModel::ShardedModel(std::vector<DemoTensor> tensors, std::string layout, int rank, int world,
                           int tp)
    : tensors_(std::move(tensors)),
      layout_(std::move(layout)),
      rank_(rank),
      world_(world),
      tp_(tp < 1 ? 1 : tp) {
  auto boxes = BoxesOf(rank_);
  for (size_t i = 0; i < tensors_.size(); ++i) {
    Held h;
    h.param = boxes[i].first;
    h.w.resize(static_cast<size_t>(h.param.numel()));
    // Step 0: the initial weights, zero moments.
    const Box whole = Box::Whole(tensors_[i].shape);
    ForEachRegionBlock(whole, h.param, h.param, 1, [&](uint64_t gi, uint64_t pi, uint64_t n) {
      for (uint64_t k = 0; k < n; ++k) h.w[pi + k] = InitialWeight(i, gi + k);
    });
    for (const Box& b : boxes[i].second) {
      const size_t n = static_cast<size_t>(b.numel());
      h.moments.push_back(
          {b, std::vector<float>(n, 0.f), std::vector<float>(n, 0.f), std::vector<float>(n, 0.f)});
    }
    held_.push_back(std::move(h));
  }
}

std::vector<std::pair<Box, std::vector<Box>>> ShardedModel::BoxesOf(int rank) const {
  std::vector<std::pair<Box, std::vector<Box>>> out;
  for (const DemoTensor& t : tensors_) {
    const Box whole = Box::Whole(t.shape);
    if (layout_ == "megatron") {
      const int64_t dp = world_ / tp_;
      Box param =
          t.tp_dim >= 0 ? Split(whole, static_cast<size_t>(t.tp_dim), tp_, rank % tp_) : whole;
      Box moments = Split(param, 0, dp, rank / tp_);
      out.push_back({param, {moments}});
    } else {  // zero3
      Box param = Split(whole, 0, world_, rank);
      const int64_t n = whole.numel();
      std::vector<Box> moments;
      auto flat = FlatRangeToBoxes(t.shape, n * rank / world_, n * (rank + 1) / world_);
      if (flat.ok())
        for (Box& b : *flat)
          if (!b.empty()) moments.push_back(std::move(b));
      out.push_back({param, std::move(moments)});
    }
  }
  return out;
}

double ShardedModel::Backward(int64_t step, int tokens) {
  step_ = step;
  const size_t nt = static_cast<size_t>(tokens);
  double loss = 0;
  std::vector<float> x, y(nt), back;
  for (size_t i = 0; i < held_.size(); ++i) {
    const Held& h = held_[i];
    // Activations x[j][b] of this step, then y = W x and W^T y, token-innermost.
    const size_t rows = h.param.ndim() == 2 ? static_cast<size_t>(h.param.lengths[0]) : 1;
    const size_t cols = h.w.size() / std::max<size_t>(rows, 1);
    x.resize(cols * nt);
    back.assign(cols * nt, 0.f);
    const uint64_t key = StepKey(step, i) ^ 0x51ed27;
    for (size_t k = 0; k < x.size(); ++k) x[k] = Uniform(Mix(key ^ k));
    for (size_t r = 0; r < rows; ++r) {
      const float* row = h.w.data() + r * cols;
      std::fill(y.begin(), y.end(), 0.f);
      for (size_t j = 0; j < cols; ++j)
        for (size_t b = 0; b < nt; ++b) y[b] += row[j] * x[j * nt + b];
      for (size_t j = 0; j < cols; ++j)
        for (size_t b = 0; b < nt; ++b) back[j * nt + b] += row[j] * y[b];
    }
    for (size_t k = 0; k < back.size(); k += 97) loss += back[k] * back[k];
  }
  for (size_t i = 0; i < held_.size(); ++i) {
    Held& h = held_[i];
    const uint64_t key = StepKey(step, i);
    const Box whole = Box::Whole(tensors_[i].shape);
    for (Moments& mo : h.moments) {
      uint64_t k = 0;
      ForEachRegionBlock(whole, h.param, mo.box, 1, [&](uint64_t gi, uint64_t pi, uint64_t n) {
        for (uint64_t e = 0; e < n; ++e, ++k) mo.g[k] = Gradient(key, gi + e, h.w[pi + e]);
      });
    }
  }
  return loss;
}

void ShardedModel::OptimizerStep() {
  for (size_t i = 0; i < held_.size(); ++i) {
    Held& h = held_[i];
    const Box whole = Box::Whole(tensors_[i].shape);
    for (Moments& mo : h.moments) {
      uint64_t k = 0;
      ForEachRegionBlock(whole, h.param, mo.box, 1, [&](uint64_t, uint64_t pi, uint64_t n) {
        for (uint64_t e = 0; e < n; ++e, ++k) Adam(mo.g[k], h.w[pi + e], mo.m[k], mo.v[k]);
      });
    }
  }
}

Status ShardedModel::GatherParameters(Group* group) {
  if (layout_ != "megatron" || world_ / tp_ < 2) return Status::OK();
  // This rank's updated elements, moment box by moment box, row-major.
  std::string mine;
  for (const Held& h : held_)
    for (const Moments& mo : h.moments) {
      const size_t base = mine.size();
      mine.resize(base + mo.m.size() * sizeof(float));
      CopyBoxRegion(h.w.data(), h.param, mine.data() + base, mo.box, mo.box, sizeof(float));
    }
  auto all = group->AllGather(mine);
  if (!all.ok()) return all.status().WithContext("exchanging updated parameters");
  for (int q = 0; q < world_; ++q) {
    if (q == rank_ || q % tp_ != rank_ % tp_) continue;  // not a data-parallel peer
    const std::string& theirs = (*all)[static_cast<size_t>(q)];
    auto boxes = BoxesOf(q);
    size_t at = 0;
    for (size_t i = 0; i < held_.size(); ++i)
      for (const Box& b : boxes[i].second) {
        const size_t n = static_cast<size_t>(b.numel()) * sizeof(float);
        if (at + n > theirs.size())
          return Status::Internal("rank " + std::to_string(q) + " sent too few parameters");
        CopyBoxRegion(theirs.data() + at, b, held_[i].w.data(), held_[i].param, b, sizeof(float));
        at += n;
      }
  }
  return Status::OK();
}

std::vector<ShardSpec> ShardedModel::Shards() {
  std::vector<ShardSpec> out;
  for (size_t i = 0; i < held_.size(); ++i) {
    const DemoTensor& t = tensors_[i];
    Held& h = held_[i];
    out.push_back(F32Shard(t.name, t.shape, h.param, h.w.data()));
    for (Moments& mo : h.moments) {
      out.push_back(F32Shard("optimizer." + t.name + ".exp_avg", t.shape, mo.box, mo.m.data()));
      out.push_back(F32Shard("optimizer." + t.name + ".exp_avg_sq", t.shape, mo.box, mo.v.data()));
    }
  }
  return out;
}

std::string ShardedModel::Check(int64_t step) const {
  for (size_t i = 0; i < held_.size(); ++i) {
    const Held& h = held_[i];
    const std::string& name = tensors_[i].name;
    std::vector<uint64_t> keys;
    for (int64_t t = 1; t <= step; ++t) keys.push_back(StepKey(t, i));
    const Box whole = Box::Whole(tensors_[i].shape);
    std::string bad;
    ForEachRegionBlock(whole, h.param, h.param, 1, [&](uint64_t gi, uint64_t pi, uint64_t n) {
      for (uint64_t e = 0; e < n && bad.empty(); ++e) {
        const float want = Replay(i, gi + e, keys).w;
        if (!SameBits(h.w[pi + e], want)) bad = Differs(name, h.param, gi + e, h.w[pi + e], want);
      }
    });
    for (const Moments& mo : h.moments)
      ForEachRegionBlock(whole, mo.box, mo.box, 1, [&](uint64_t gi, uint64_t k, uint64_t n) {
        for (uint64_t e = 0; e < n && bad.empty(); ++e) {
          const Element want = Replay(i, gi + e, keys);
          if (!SameBits(mo.m[k + e], want.m))
            bad = Differs("optimizer." + name + ".exp_avg", mo.box, gi + e, mo.m[k + e], want.m);
          else if (!SameBits(mo.v[k + e], want.v))
            bad = Differs("optimizer." + name + ".exp_avg_sq", mo.box, gi + e, mo.v[k + e], want.v);
        }
      });
    if (!bad.empty()) return bad;
  }
  return "";
}

uint64_t ShardedModel::bytes() const {
  uint64_t n = 0;
  for (const Held& h : held_) {
    n += h.w.size() * sizeof(float);
    for (const Moments& mo : h.moments) n += 2 * mo.m.size() * sizeof(float);
  }
  return n;
}

uint64_t ShardedModel::model_bytes() const {
  uint64_t n = 0;
  for (const DemoTensor& t : tensors_) n += 3 * static_cast<uint64_t>(NumElements(t.shape)) * 4;
  return n;
}

}  // namespace cairn::cli
