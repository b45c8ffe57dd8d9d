// Layout templates: a rank's layout as a rule per tensor plus the rank's index, so that a
// fully sharded job (FSDP, ZeRO-3, DTensor Shard) need not send every rank's boxes.
//
// A template lists tensors, each with a split rule, and the number of parts n; rank i of
// it holds, of each tensor,
//   whole             the whole tensor (replicated: every rank of the template holds it);
//   flat  (ceil)      the flat row-major range i of n, of ceil(L / n) elements each (the
//                     last ones shorter or empty): FSDP's padded flat parameter, ZeRO;
//   flat  (floor)     elements [L*i/n, L*(i+1)/n);
//   chunk (ceil, d)   the chunk i of n along dimension d, ceil(D / n) long (torch.chunk,
//                     DTensor Shard(d));
//   chunk (floor, d)  [D*i/n, D*(i+1)/n) along d;
// as the boxes FlatRangeToBoxes gives for a flat range, one box for a chunk; a tensor whose
// part is empty is not in the rank's layout at all (a host slot holds no empty shards).
// Expanding a template for index i gives exactly the RankLayout the rank holds, slot order
// included; recognition only accepts a layout when that is so.
// Thread-safety: plain functions and values.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <string_view>
#include <vector>

#include "cairn/status.h"
#include "layout/save_planner.h"

namespace cairn {

struct SplitRule {
  enum class Kind : uint8_t { kWhole = 0, kFlat = 1, kChunk = 2 };
  enum class Round : uint8_t { kCeil = 0, kFloor = 1 };
  Kind kind = Kind::kWhole;
  Round round = Round::kCeil;
  uint8_t dim = 0;  // kChunk: the dimension cut

  bool operator==(const SplitRule&) const = default;
  bool split() const { return kind != Kind::kWhole; }
  std::string ToString() const;  // "whole", "flat/ceil", "chunk/floor dim 1"
};

struct LayoutTemplate {
  std::vector<TensorMeta> tensors;
  std::vector<SplitRule> rules;  // one per tensor
  uint32_t parts = 1;            // n; 1 when no rule splits

  bool operator==(const LayoutTemplate&) const = default;
};

// The boxes of part `index` of `parts` of a tensor of `shape` under `rule`, in slot order
// (none when the part is empty).
std::vector<Box> PartBoxes(const Shape& shape, const SplitRule& rule, uint32_t index,
                           uint32_t parts);

// The number of elements of that part (the whole tensor's for kWhole), without making boxes.
uint64_t PartElements(const Shape& shape, const SplitRule& rule, uint32_t index, uint32_t parts);

// The parts [first, last] of `parts` under `rule` whose elements may meet `box` (a box of
// a tensor of `shape`): by flat range or along the chunked dimension, found by binary
// search. nullopt when none can. For kWhole: {0, 0}.
std::optional<std::pair<uint32_t, uint32_t>> PartsOverlapping(const Shape& shape,
                                                              const SplitRule& rule, uint32_t parts,
                                                              const Box& box);

// The layout part `index` of the template holds.
RankLayout ExpandTemplate(const LayoutTemplate& t, uint32_t index);

struct RecognizedLayout {
  LayoutTemplate layout_template;
  uint32_t index = 0;  // 0 when no rule splits
};

// The template of `layout`, the layout of `rank` in a job of `world` ranks, or nullopt
// when it is none. Tries n = world with index = rank first (FSDP), then each divisor d of
// world, largest first, with index rank % d (tensor parallel inside data parallel, HSDP)
// and rank / (world / d); per tensor the rules whole, flat (ceil, floor), chunk (ceil,
// floor; dimension 0 first). The first n and index every tensor agrees on wins.
std::optional<RecognizedLayout> RecognizeLayout(const RankLayout& layout, int rank, int world);

std::string EncodeTemplate(const LayoutTemplate& t);
// Corruption saying what is wrong (names, dtypes, shapes, rules checked).
Result<LayoutTemplate> DecodeTemplate(std::string_view bytes);
uint64_t TemplateHash(std::string_view encoded);

}  // namespace cairn
