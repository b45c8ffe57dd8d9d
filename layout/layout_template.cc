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
  if (round == SplitRule::Round::kTrunc) {
    const __int128 per = e / n;
    return {static_cast<int64_t>(per * i), static_cast<int64_t>(per * (i + 1))};
  }
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
  // Truncated chunks last: where n divides the extent they are ceil chunks, and index 0's
  // part is also a floor chunk (SettleRules picks the rule every rank fits).
  for (size_t d = 0; d < ndim && d < 256; ++d)
    out.push_back({K::kChunk, R::kTrunc, static_cast<uint8_t>(d)});
  return out;
}

// The parts [first, end) of `parts` of `extent` whose ranges meet [lo, hi) (ranges are
// ordered and do not overlap: the first part ending after lo, the last beginning before hi).
std::pair<uint32_t, uint32_t> PartsMeetingRange(int64_t extent, SplitRule::Round round,
                                                uint32_t parts, int64_t lo, int64_t hi) {
  uint32_t a = 0, b = parts;
  while (a < b) {
    const uint32_t m = a + (b - a) / 2;
    if (PartRange(extent, round, m, parts).second <= lo)
      a = m + 1;
    else
      b = m;
  }
  const uint32_t first = a;
  a = first, b = parts;
  while (a < b) {
    const uint32_t m = a + (b - a) / 2;
    if (PartRange(extent, round, m, parts).first < hi)
      a = m + 1;
    else
      b = m;
  }
  return {first, a};
}

// Applies cut `c` for `digit` to `box` (cut along c.dim); false when the chunk is empty.
bool ApplyCut(const SplitRule::Cut& c, uint32_t digit, Box* box) {
  auto [b, e] = PartRange(box->lengths[c.dim], c.round, digit, c.count);
  box->offsets[c.dim] += b;
  box->lengths[c.dim] = e - b;
  return e > b;
}

uint32_t Digit(const SplitRule::Cut& c, uint32_t index) {
  return (index / c.stride) % c.count;
}

// Whether `cuts` give index i exactly `box` (a tensor of `shape` whose box is cut along
// the dimensions in `cut` only): computed on the cut dimensions' extents, no boxes made.
bool CutsFit(const std::vector<SplitRule::Cut>& cuts, const Shape& shape, const Box& box,
             const std::vector<uint8_t>& cut, uint32_t i) {
  int64_t off[2] = {0, 0}, len[2] = {0, 0};
  for (size_t k = 0; k < cut.size(); ++k) len[k] = shape[cut[k]];
  for (const SplitRule::Cut& c : cuts) {
    const size_t k = c.dim == cut[0] ? 0 : (cut.size() > 1 && c.dim == cut[1] ? 1 : 2);
    if (k == 2) return false;  // a dimension the box spans whole
    auto [b, e] = PartRange(len[k], c.round, Digit(c, i), c.count);
    if (e <= b) return false;
    off[k] += b;
    len[k] = e - b;
  }
  for (size_t k = 0; k < cut.size(); ++k)
    if (off[k] != box.offsets[cut[k]] || len[k] != box.lengths[cut[k]]) return false;
  return true;
}

// The first kCuts rule, in the order recognition prefers, that gives index i of a template
// of n parts exactly `box`, its one box of a tensor of `shape` (RecognizeLayout); rules
// in `recent` (those earlier tensors took) are tried first.
std::optional<SplitRule> FitCuts(const Shape& shape, const Box& box, uint32_t n, uint32_t i,
                                 const std::vector<SplitRule>& recent) {
  std::vector<uint8_t> cut;  // the dimensions the box does not span whole
  for (size_t d = 0; d < shape.size() && d < 256; ++d)
    if (box.offsets[d] != 0 || box.lengths[d] != shape[d]) cut.push_back(static_cast<uint8_t>(d));
  if (cut.empty() || cut.size() > 2) return std::nullopt;
  for (const SplitRule& r : recent)
    if (CutsFit(r.cuts, shape, box, cut, i)) return r;
  std::vector<uint32_t> divisors;  // of n, ascending
  for (uint32_t d = 1; static_cast<uint64_t>(d) * d <= n; ++d)
    if (n % d == 0) {
      divisors.push_back(d);
      if (d != n / d) divisors.push_back(n / d);
    }
  std::sort(divisors.begin(), divisors.end());
  std::vector<SplitRule::Cut> cuts;
  auto rule = [&] {
    SplitRule r;
    r.kind = SplitRule::Kind::kCuts;
    r.cuts = cuts;
    return r;
  };
  using Round = SplitRule::Round;
  for (Round round : {Round::kCeil, Round::kFloor}) {
    if (cut.size() == 1) {
      // One cut by one digit: its upper places first (FSDP2's digit, replicated over the
      // tensor-parallel ranks below it), then every other place. (Stride 1, count n: the
      // plain chunk rule, tried before.)
      for (auto it = divisors.rbegin(); it != divisors.rend(); ++it)
        for (uint32_t count : divisors) {
          const uint64_t stride = *it;
          if (count < 2 || stride * count > n || n % (stride * count) != 0 ||
              (stride == 1 && count == n))
            continue;
          cuts = {{cut[0], round, static_cast<uint32_t>(stride), count}};
          if (CutsFit(cuts, shape, box, cut, i)) return rule();
        }
    }
    // Two cuts: the lower digit a first, then the next digit b above it; a dimension
    // other than 0 takes the lower digit first (tensor parallelism inside FSDP2, which
    // chunks dimension 0), and a single dimension is cut twice (a chunk of a chunk).
    std::vector<std::pair<uint8_t, uint8_t>> dims;
    if (cut.size() == 2)
      dims = {{cut[1], cut[0]}, {cut[0], cut[1]}};
    else
      dims = {{cut[0], cut[0]}};
    for (auto [x, y] : dims)
      for (uint32_t a : divisors)
        for (uint32_t b : divisors) {
          if (a < 2 || b < 2 || static_cast<uint64_t>(a) * b > n || n % (a * b) != 0) continue;
          cuts = {{x, round, 1, a}, {y, round, a, b}};
          if (CutsFit(cuts, shape, box, cut, i)) return rule();
          if (x != y) continue;
          cuts = {{x, round, b, a}, {y, round, 1, b}};
          if (CutsFit(cuts, shape, box, cut, i)) return rule();
        }
  }
  return std::nullopt;
}

// The parts [first, last] of `parts` under a one-cut `rule` whose elements may meet `box`
// (a box of a tensor of `shape`): by flat range or along the chunked dimension, found by
// binary search. nullopt when none can. For kWhole: {0, 0}.
std::optional<std::pair<uint32_t, uint32_t>> PartsOverlapping(const Shape& shape,
                                                              const SplitRule& rule, uint32_t parts,
                                                              const Box& box) {
  if (box.empty() || box.ndim() != shape.size()) return std::nullopt;
  int64_t extent = 0, lo = 0, hi = 0;  // the box's hull [lo, hi) in the index space cut
  switch (rule.kind) {
    case SplitRule::Kind::kWhole:
      return std::pair<uint32_t, uint32_t>{0, 0};
    case SplitRule::Kind::kCuts:
      return std::nullopt;
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
  auto [first, end] = PartsMeetingRange(extent, rule.round, parts, lo, hi);
  if (end == first) return std::nullopt;
  return std::pair<uint32_t, uint32_t>{first, end - 1};
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
    case Kind::kCuts: {
      std::string out = "cuts [";
      for (size_t c = 0; c < cuts.size(); ++c)
        out += (c ? ", " : "") + std::string(cuts[c].round == Round::kCeil ? "" : "floor ") +
               "dim " + std::to_string(cuts[c].dim) + " by i/" + std::to_string(cuts[c].stride) +
               "%" + std::to_string(cuts[c].count);
      return out + "]";
    }
    case Kind::kWhole:
      return "whole";
    case Kind::kFlat:
      return round == Round::kCeil ? "flat/ceil" : "flat/floor";
    case Kind::kChunk:
      return std::string(round == Round::kCeil    ? "chunk/ceil"
                         : round == Round::kFloor ? "chunk/floor"
                                                  : "chunk/trunc") +
             " dim " + std::to_string(dim);
  }
  return "?";
}

uint32_t PartRep(const SplitRule& rule, uint32_t index) {
  if (rule.kind == SplitRule::Kind::kWhole) return 0;
  if (rule.kind != SplitRule::Kind::kCuts) return index;
  uint32_t rep = 0;
  for (const SplitRule::Cut& c : rule.cuts) rep += Digit(c, index) * c.stride;
  return rep;
}

std::vector<uint32_t> SharingOffsets(const SplitRule& rule, uint32_t parts, uint32_t limit) {
  if (rule.kind != SplitRule::Kind::kCuts) return {0};
  std::vector<uint32_t> out;
  for (uint32_t f = 0; f < std::min(parts, limit); ++f) {
    bool free = true;
    for (const SplitRule::Cut& c : rule.cuts) free = free && Digit(c, f) == 0;
    if (free) out.push_back(f);
  }
  return out;
}

Status CheckCuts(const SplitRule& rule, size_t ndim, uint32_t parts) {
  if (rule.kind != SplitRule::Kind::kCuts || rule.cuts.empty() || rule.cuts.size() > 4 ||
      rule.dim != 0 || rule.round != SplitRule::Round::kCeil)
    return Status::InvalidArgument("not 1 to 4 cuts");
  std::vector<SplitRule::Cut> by_stride = rule.cuts;
  std::sort(by_stride.begin(), by_stride.end(),
            [](const auto& a, const auto& b) { return a.stride < b.stride; });
  uint64_t below = 1;  // the places the cuts before use end here
  for (const SplitRule::Cut& c : by_stride) {
    if (c.dim >= ndim || c.count < 1 || c.stride < 1 ||
        static_cast<uint8_t>(c.round) > static_cast<uint8_t>(SplitRule::Round::kFloor))
      return Status::InvalidArgument("a cut's dimension, round, stride or count");
    if (c.stride % below != 0) return Status::InvalidArgument("cuts whose digits overlap");
    below = static_cast<uint64_t>(c.stride) * c.count;
    if (below > parts) return Status::InvalidArgument("a cut beyond the part count");
  }
  if (parts % below != 0) return Status::InvalidArgument("cuts that do not divide the parts");
  return Status::OK();
}

std::vector<Box> PartBoxes(const Shape& shape, const SplitRule& rule, uint32_t index,
                           uint32_t parts) {
  switch (rule.kind) {
    case SplitRule::Kind::kCuts: {
      Box box = Box::Whole(shape);
      for (const SplitRule::Cut& c : rule.cuts)
        if (c.dim >= shape.size() || !ApplyCut(c, Digit(c, index), &box)) return {};
      if (box.empty()) return {};
      return {std::move(box)};
    }
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
    case SplitRule::Kind::kCuts: {
      // The extents of the dimensions cut, cut by cut (no boxes made: a plan asks this per
      // rank and tensor).
      uint8_t dims[4];
      int64_t len[4];
      size_t nd = 0;
      for (const SplitRule::Cut& c : rule.cuts) {
        if (c.dim >= shape.size()) return 0;
        size_t k = 0;
        while (k < nd && dims[k] != c.dim) ++k;
        if (k == nd) {
          if (nd == 4) return 0;
          dims[nd] = c.dim;
          len[nd++] = shape[c.dim];
        }
        auto [b, e] = PartRange(len[k], c.round, Digit(c, index), c.count);
        len[k] = e - b;
        if (len[k] <= 0) return 0;
      }
      uint64_t out = 1;
      for (size_t d = 0; d < shape.size(); ++d) {
        size_t k = 0;
        while (k < nd && dims[k] != d) ++k;
        out *= static_cast<uint64_t>(k < nd ? len[k] : shape[d]);
      }
      return out;
    }
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

std::vector<uint32_t> PartsMeeting(const Shape& shape, const SplitRule& rule, uint32_t parts,
                                   const Box& box, uint32_t limit) {
  std::vector<uint32_t> out;
  if (rule.kind != SplitRule::Kind::kCuts) {
    if (auto r = PartsOverlapping(shape, rule, parts, box))
      for (uint64_t i = r->first; i <= r->second && i < limit; ++i)
        out.push_back(static_cast<uint32_t>(i));
    return out;
  }
  if (box.empty() || box.ndim() != shape.size()) return out;
  // Depth-first over the cuts: at each, the digits whose chunk of what is left meets the box.
  auto walk = [&](auto&& self, size_t c, const Box& left, uint32_t rep) -> void {
    if (c == rule.cuts.size()) {
      out.push_back(rep);
      return;
    }
    const SplitRule::Cut& cut = rule.cuts[c];
    if (cut.dim >= shape.size()) return;
    const int64_t base = left.offsets[cut.dim];
    const int64_t lo = std::max<int64_t>(box.offsets[cut.dim], base) - base;
    const int64_t hi = std::min<int64_t>(box.offsets[cut.dim] + box.lengths[cut.dim],
                                         base + left.lengths[cut.dim]) -
                       base;
    if (lo >= hi) return;
    auto [first, end] = PartsMeetingRange(left.lengths[cut.dim], cut.round, cut.count, lo, hi);
    for (uint32_t d = first; d < end; ++d) {
      const uint64_t at = rep + static_cast<uint64_t>(d) * cut.stride;
      if (at >= limit) break;  // (later digits only add)
      Box next = left;
      if (ApplyCut(cut, d, &next)) self(self, c + 1, next, static_cast<uint32_t>(at));
    }
  };
  walk(walk, 0, Box::Whole(shape), 0);
  std::sort(out.begin(), out.end());
  return out;
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

std::optional<RecognizedLayout> RecognizeLayout(const RankLayout& layout, int rank, int world,
                                                uint32_t parts) {
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
  if (parts != 0) std::erase_if(tries, [&](const auto& t) { return t.first != parts; });
  std::vector<std::vector<SplitRule>> candidates(nt);
  for (size_t t = 0; t < nt; ++t) candidates[t] = Candidates(layout.tensors[t].global_shape.size());
  auto attempt = [&](uint32_t n, uint32_t i, bool cuts) -> std::optional<RecognizedLayout> {
    RecognizedLayout out;
    out.layout_template.rules.resize(nt);
    std::vector<SplitRule> recent;  // the cut rules earlier tensors took, tried first
    bool any_split = false;
    for (size_t t = 0; t < nt; ++t) {
      const Shape& shape = layout.tensors[t].global_shape;
      bool found = false;
      for (const SplitRule& rule : candidates[t]) {
        if (SameBoxes(PartBoxes(shape, rule, i, n), layout, first[t], first[t + 1])) {
          out.layout_template.rules[t] = rule;
          found = true;
          break;
        }
      }
      if (!found && cuts && first[t + 1] == first[t] + 1) {
        if (auto rule = FitCuts(shape, layout.shards[first[t]].box, n, i, recent)) {
          if (std::find(recent.begin(), recent.end(), *rule) == recent.end())
            recent.push_back(*rule);
          out.layout_template.rules[t] = std::move(*rule);
          found = true;
        }
      }
      if (!found) return std::nullopt;
      any_split = any_split || out.layout_template.rules[t].split();
    }
    if (any_split) {
      out.layout_template.parts = n;
      out.index = i;
    }
    out.layout_template.tensors = layout.tensors;
    return out;
  };
  for (auto [n, i] : tries)
    if (auto out = attempt(n, i, false)) return out;
  // With cuts, the fewest parts first: at n = world a cut rule can also describe a
  // pipeline stage's layout, its stage a digit no cut uses, so that every part would be
  // "shared" with the other stages' indices (which do not hold it) and each plan would
  // walk them; the smallest n that fits keeps the stage out of the index.
  std::stable_sort(tries.begin(), tries.end(),
                   [](const auto& a, const auto& b) { return a.first < b.first; });
  for (auto [n, i] : tries)
    if (auto out = attempt(n, i, true)) return out;
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
  // Cuts only when some rule has them: the encoding of every other template is unchanged.
  if (std::any_of(t.rules.begin(), t.rules.end(),
                  [](const SplitRule& r) { return !r.cuts.empty(); }))
    for (const SplitRule& r : t.rules) {
      w.add_rule_cuts(static_cast<uint32_t>(r.cuts.size()));
      for (const SplitRule::Cut& c : r.cuts) {
        w.add_cut_dim(c.dim);
        w.add_cut_round(static_cast<uint32_t>(c.round));
        w.add_cut_stride(c.stride);
        w.add_cut_count(c.count);
      }
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
  const bool with_cuts = w.rule_cuts_size() > 0;
  if (with_cuts && static_cast<size_t>(w.rule_cuts_size()) != nt)
    return Bad("not one cut count per tensor");
  const int ncuts = w.cut_dim_size();
  if (w.cut_round_size() != ncuts || w.cut_stride_size() != ncuts || w.cut_count_size() != ncuts)
    return Bad("cut fields of different lengths");
  int next_cut = 0;
  std::unordered_set<std::string_view> names;
  for (size_t k = 0; k < nt; ++k) {
    const TensorMeta& m = t.tensors[k];
    const int i = static_cast<int>(k);
    const uint32_t kind = w.rule_kind(i), round = w.rule_round(i), dim = w.rule_dim(i);
    const uint32_t cuts = with_cuts ? w.rule_cuts(i) : 0;
    if (kind > 3 || round > 2 || (round == 2 && kind != 2) ||
        (kind == 2 && dim >= m.global_shape.size()) || (kind != 2 && dim != 0) ||
        (kind == 3) != (cuts > 0) || cuts > 4 || static_cast<int64_t>(cuts) > ncuts - next_cut)
      return Bad("tensor '" + m.name + "' has a bad split rule");
    t.rules[k] = {static_cast<SplitRule::Kind>(kind),
                  static_cast<SplitRule::Round>(round),
                  static_cast<uint8_t>(dim),
                  {}};
    for (uint32_t c = 0; c < cuts; ++c, ++next_cut) {
      if (w.cut_dim(next_cut) > 255 || w.cut_round(next_cut) > 1)
        return Bad("tensor '" + m.name + "' has a bad cut");
      t.rules[k].cuts.push_back({static_cast<uint8_t>(w.cut_dim(next_cut)),
                                 static_cast<SplitRule::Round>(w.cut_round(next_cut)),
                                 w.cut_stride(next_cut), w.cut_count(next_cut)});
    }
    if (kind == 3) {
      Status st = CheckCuts(t.rules[k], m.global_shape.size(), t.parts);
      if (!st.ok()) return Bad("tensor '" + m.name + "' has bad cuts: " + st.message());
    }
  }
  if (next_cut != ncuts) return Bad("cuts no tensor's rule has");
  for (const TensorMeta& m : t.tensors)
    if (!names.insert(m.name).second) return Bad("tensor '" + m.name + "' listed twice");
  return t;
}

uint64_t TemplateHash(std::string_view encoded) {
  return Checksum(encoded.data(), encoded.size());
}

}  // namespace cairn
