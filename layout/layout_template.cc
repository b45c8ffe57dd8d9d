#include "layout/layout_template.h"

#include <algorithm>
#include <unordered_map>
#include <unordered_set>

#include "core/checksum.h"
#include "layout/layout_wire.h"

namespace cairn {
namespace {

Status Bad(const std::string& what) {
  return Status::Corruption("bad layout template: " + what);
}

// [begin, end) of part `index` of `parts` of `extent` elements.
std::pair<int64_t, int64_t> PartRange(int64_t extent, SplitRule::Round round, uint32_t index,
                                      uint32_t parts) {
  const __int128 e = extent, i = index, n = parts;
  if (round == SplitRule::Round::kFloor)
    return {static_cast<int64_t>(e * i / n), static_cast<int64_t>(e * (i + 1) / n)};
  const __int128 per = (e + n - 1) / n;
  const __int128 b = std::min(e, per * i);
  return {static_cast<int64_t>(b), static_cast<int64_t>(std::min(e, b + per))};
}

// The rules recognition tries for a tensor of `ndim` dimensions, in order.
std::vector<SplitRule> Candidates(size_t ndim) {
  using K = SplitRule::Kind;
  using R = SplitRule::Round;
  std::vector<SplitRule> out = {
      {K::kWhole, R::kCeil, 0}, {K::kFlat, R::kCeil, 0}, {K::kFlat, R::kFloor, 0}};
  for (size_t d = 0; d < ndim && d < 256; ++d) {
    out.push_back({K::kChunk, R::kCeil, static_cast<uint8_t>(d)});
    out.push_back({K::kChunk, R::kFloor, static_cast<uint8_t>(d)});
  }
  return out;
}

bool SameBoxes(const std::vector<Box>& a, const RankLayout& l, size_t begin, size_t end) {
  if (a.size() != end - begin) return false;
  for (size_t k = 0; k < a.size(); ++k)
    if (!(a[k] == l.shards[begin + k].box)) return false;
  return true;
}

}  // namespace

std::string SplitRule::ToString() const {
  switch (kind) {
    case Kind::kWhole:
      return "whole";
    case Kind::kFlat:
      return round == Round::kCeil ? "flat/ceil" : "flat/floor";
    case Kind::kChunk:
      return std::string(round == Round::kCeil ? "chunk/ceil" : "chunk/floor") + " dim " +
             std::to_string(dim);
  }
  return "?";
}

std::vector<Box> PartBoxes(const Shape& shape, const SplitRule& rule, uint32_t index,
                           uint32_t parts) {
  switch (rule.kind) {
    case SplitRule::Kind::kWhole:
      return {Box::Whole(shape)};
    case SplitRule::Kind::kFlat: {
      auto [b, e] = PartRange(NumElements(shape), rule.round, index, parts);
      if (b == e) return {};
      auto boxes = FlatRangeToBoxes(shape, b, e);
      return boxes.ok() ? std::move(*boxes) : std::vector<Box>{};
    }
    case SplitRule::Kind::kChunk: {
      if (rule.dim >= shape.size()) return {};
      auto [b, e] = PartRange(shape[rule.dim], rule.round, index, parts);
      Box box = Box::Whole(shape);
      box.offsets[rule.dim] = b;
      box.lengths[rule.dim] = e - b;
      if (box.empty()) return {};
      return {std::move(box)};
    }
  }
  return {};
}

uint64_t PartElements(const Shape& shape, const SplitRule& rule, uint32_t index, uint32_t parts) {
  const int64_t total = NumElements(shape);
  switch (rule.kind) {
    case SplitRule::Kind::kWhole:
      return static_cast<uint64_t>(total);
    case SplitRule::Kind::kFlat: {
      auto [b, e] = PartRange(total, rule.round, index, parts);
      return static_cast<uint64_t>(e - b);
    }
    case SplitRule::Kind::kChunk: {
      if (rule.dim >= shape.size() || shape[rule.dim] == 0) return 0;
      auto [b, e] = PartRange(shape[rule.dim], rule.round, index, parts);
      return static_cast<uint64_t>(e - b) * static_cast<uint64_t>(total / shape[rule.dim]);
    }
  }
  return 0;
}

std::optional<std::pair<uint32_t, uint32_t>> PartsOverlapping(const Shape& shape,
                                                              const SplitRule& rule, uint32_t parts,
                                                              const Box& box) {
  if (box.empty() || box.ndim() != shape.size()) return std::nullopt;
  int64_t extent = 0, lo = 0, hi = 0;  // the box's hull [lo, hi) in the index space cut
  switch (rule.kind) {
    case SplitRule::Kind::kWhole:
      return std::pair<uint32_t, uint32_t>{0, 0};
    case SplitRule::Kind::kFlat: {
      extent = NumElements(shape);
      int64_t stride = 1;
      for (size_t d = shape.size(); d-- > 0;) {
        lo += box.offsets[d] * stride;
        hi += (box.offsets[d] + box.lengths[d] - 1) * stride;
        stride *= shape[d];
      }
      hi += 1;
      break;
    }
    case SplitRule::Kind::kChunk:
      if (rule.dim >= shape.size()) return std::nullopt;
      extent = shape[rule.dim];
      lo = box.offsets[rule.dim];
      hi = lo + box.lengths[rule.dim];
      break;
  }
  // Part ranges are ordered and do not overlap: the first part ending after lo, the last
  // beginning before hi.
  uint32_t a = 0, b = parts;
  while (a < b) {
    const uint32_t m = a + (b - a) / 2;
    if (PartRange(extent, rule.round, m, parts).second <= lo)
      a = m + 1;
    else
      b = m;
  }
  const uint32_t first = a;
  a = first, b = parts;
  while (a < b) {
    const uint32_t m = a + (b - a) / 2;
    if (PartRange(extent, rule.round, m, parts).first < hi)
      a = m + 1;
    else
      b = m;
  }
  if (a == first) return std::nullopt;
  return std::pair<uint32_t, uint32_t>{first, a - 1};
}

RankLayout ExpandTemplate(const LayoutTemplate& t, uint32_t index) {
  RankLayout out;
  for (size_t k = 0; k < t.tensors.size(); ++k) {
    std::vector<Box> boxes = PartBoxes(t.tensors[k].global_shape, t.rules[k], index, t.parts);
    if (boxes.empty()) continue;
    const auto id = static_cast<uint32_t>(out.tensors.size());
    out.tensors.push_back(t.tensors[k]);
    for (Box& b : boxes) out.shards.push_back({id, std::move(b)});
  }
  return out;
}

std::optional<RecognizedLayout> RecognizeLayout(const RankLayout& layout, int rank, int world) {
  if (world < 1 || rank < 0 || rank >= world) return std::nullopt;
  // Each tensor's shards must be consecutive, in the order of the tensors.
  const size_t nt = layout.tensors.size();
  std::vector<size_t> first(nt + 1, layout.shards.size());
  size_t expect = 0;
  for (size_t k = 0; k < layout.shards.size(); ++k) {
    const uint32_t t = layout.shards[k].tensor;
    if (t == expect) {
      first[expect++] = k;
    } else if (expect == 0 || t != expect - 1) {
      return std::nullopt;
    }
  }
  if (expect != nt) return std::nullopt;  // a tensor without shards
  // The (n, index) candidates.
  std::vector<std::pair<uint32_t, uint32_t>> tries = {
      {static_cast<uint32_t>(world), static_cast<uint32_t>(rank)}};
  std::vector<int> divisors;
  for (int d = 1; static_cast<int64_t>(d) * d <= world; ++d)
    if (world % d == 0) {
      divisors.push_back(d);
      if (d != world / d) divisors.push_back(world / d);
    }
  std::sort(divisors.rbegin(), divisors.rend());
  for (int d : divisors) {
    if (d == world || d == 1) continue;
    const auto a = static_cast<uint32_t>(rank % d), b = static_cast<uint32_t>(rank / (world / d));
    tries.push_back({static_cast<uint32_t>(d), a});
    if (b != a) tries.push_back({static_cast<uint32_t>(d), b});
  }
  std::vector<std::vector<SplitRule>> candidates(nt);
  for (size_t t = 0; t < nt; ++t) candidates[t] = Candidates(layout.tensors[t].global_shape.size());
  for (auto [n, i] : tries) {
    RecognizedLayout out;
    out.layout_template.tensors = layout.tensors;
    out.layout_template.rules.resize(nt);
    bool all = true, any_split = false;
    for (size_t t = 0; t < nt && all; ++t) {
      bool found = false;
      for (const SplitRule& rule : candidates[t]) {
        if (SameBoxes(PartBoxes(layout.tensors[t].global_shape, rule, i, n), layout, first[t],
                      first[t + 1])) {
          out.layout_template.rules[t] = rule;
          any_split = any_split || rule.split();
          found = true;
          break;
        }
      }
      all = found;
    }
    if (!all) continue;
    if (any_split) {
      out.layout_template.parts = n;
      out.index = i;
    }
    return out;
  }
  return std::nullopt;
}

std::string EncodeTemplate(const LayoutTemplate& t) {
  wire::LayoutTemplate w;
  w.set_parts(t.parts);
  for (size_t k = 0; k < t.tensors.size(); ++k) {
    AddTensor(t.tensors[k], w.mutable_tensors());
    w.add_rule_kind(static_cast<uint32_t>(t.rules[k].kind));
    w.add_rule_round(static_cast<uint32_t>(t.rules[k].round));
    w.add_rule_dim(t.rules[k].dim);
  }
  return wire::Encode(w);
}

Result<LayoutTemplate> DecodeTemplate(std::string_view bytes) {
  CAIRN_ASSIGN_OR_RETURN(auto w, wire::Decode<wire::LayoutTemplate>(bytes, "layout template"));
  LayoutTemplate t;
  t.parts = w.parts();
  if (t.parts == 0) return Bad("part count");
  CAIRN_RETURN_IF_ERROR(TensorsFromWire(w.mutable_tensors(), &t.tensors, "layout template"));
  const size_t nt = t.tensors.size();
  if (static_cast<size_t>(w.rule_kind_size()) != nt ||
      static_cast<size_t>(w.rule_round_size()) != nt ||
      static_cast<size_t>(w.rule_dim_size()) != nt)
    return Bad("not one split rule per tensor");
  t.rules.resize(nt);
  std::unordered_set<std::string_view> names;
  for (size_t k = 0; k < nt; ++k) {
    const TensorMeta& m = t.tensors[k];
    const int i = static_cast<int>(k);
    const uint32_t kind = w.rule_kind(i), round = w.rule_round(i), dim = w.rule_dim(i);
    if (kind > 2 || round > 1 || (kind == 2 && dim >= m.global_shape.size()) ||
        (kind != 2 && dim != 0))
      return Bad("tensor '" + m.name + "' has a bad split rule");
    t.rules[k] = {static_cast<SplitRule::Kind>(kind), static_cast<SplitRule::Round>(round),
                  static_cast<uint8_t>(dim)};
  }
  for (const TensorMeta& m : t.tensors)
    if (!names.insert(m.name).second) return Bad("tensor '" + m.name + "' listed twice");
  return t;
}

uint64_t TemplateHash(std::string_view encoded) {
  return Checksum(encoded.data(), encoded.size());
}

}  // namespace cairn
