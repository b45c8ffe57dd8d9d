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
//   chunk (trunc, d)  [(D/n)*i, (D/n)*(i+1)) along d: every part floor(D / n) long and the
//                     last D mod n held by no part (a split that drops the remainder, as
//                     `D // n` slicing does where n does not divide D; the bytes no rank
//                     holds are not saved, and a restore needing them says so);
//   cuts              chunks of chunks, each by a digit of i (multi-dimensional sharding:
//                     FSDP2 over tensor parallelism): cut c takes the chunk
//                     (i / stride_c) % count_c (ceil or floor) along dim_c of what the cuts
//                     before it left. The digits are disjoint places of i in mixed radix;
//                     the places no cut uses hold the same part (a tensor replicated over
//                     them: a TP-replicated norm under FSDP2 over TP), so such a part has
//                     several indices, and PartRep names it by its smallest;
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
  enum class Kind : uint8_t { kWhole = 0, kFlat = 1, kChunk = 2, kCuts = 3 };
  enum class Round : uint8_t { kCeil = 0, kFloor = 1, kTrunc = 2 };  // kTrunc: kChunk only
  struct Cut {
    uint8_t dim = 0;
    Round round = Round::kCeil;
    uint32_t stride = 1, count = 1;  // the digit: (index / stride) % count
    bool operator==(const Cut&) const = default;
  };
  Kind kind = Kind::kWhole;
  Round round = Round::kCeil;
  uint8_t dim = 0;             // kChunk: the dimension cut
  std::vector<Cut> cuts = {};  // kCuts: in the order they apply

  bool operator==(const SplitRule&) const = default;
  bool split() const { return kind != Kind::kWhole; }
  // "whole", "flat/ceil", "chunk/floor dim 1", "cuts [dim 1 by i%8, dim 0 by i/8%125]"
  std::string ToString() const;
};

// The smallest index whose part of a tensor under `rule` is index's (index itself unless
// the rule's cuts leave some of its digits unused; 0 for kWhole).
uint32_t PartRep(const SplitRule& rule, uint32_t index);

// The offsets f with every digit a cut of `rule` uses zero, f < min(parts, limit),
// ascending: the indices holding the part of rep are rep + f (just {0} unless kCuts).
// O(min(parts, limit)): a plan passes its number of indices, so a template read from a
// damaged MANIFEST that claims 2^32 parts costs no more than its ranks.
std::vector<uint32_t> SharingOffsets(const SplitRule& rule, uint32_t parts,
                                     uint32_t limit = UINT32_MAX);

// InvalidArgument unless `rule` is a valid kCuts rule for a tensor of `ndim` dimensions
// and `parts` indices: 1 to 4 cuts, dimensions in range, strides and counts >= 1, the
// digits disjoint places of a mixed radix of `parts`.
Status CheckCuts(const SplitRule& rule, size_t ndim, uint32_t parts);

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

// The parts whose elements may meet `box`, each named by its PartRep, ascending, those
// below `limit` only (a plan passes its number of indices: no rank holds a part past
// them): every rule, kCuts included (per cut, the digits whose chunk meets the box).
std::vector<uint32_t> PartsMeeting(const Shape& shape, const SplitRule& rule, uint32_t parts,
                                   const Box& box, uint32_t limit = UINT32_MAX);

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
// floor; dimension 0 first; then trunc). The first n and index every tensor agrees on wins. Only
// when no (n, index) fits that way are the same tries made again with kCuts rules too: one cut by a
// digit of the index (its upper places first), or two (the lower digit first, on a dimension other
// than 0 first: tensor parallelism inside FSDP2). One rank's boxes may fit several such rules
// (index 0 fits every digit): the save plan settles each tensor on the rule every rank's boxes fit
// (MakeTemplatedPlan). One rank's boxes may also fit two part counts (the last, shorter part of
// ceil chunks of n is often a floor chunk of some larger divisor): with `parts` non-zero only that
// n is tried (MakeTemplatedPlan describes such a rank again with the part count the other ranks
// holding its tensors use).
std::optional<RecognizedLayout> RecognizeLayout(const RankLayout& layout, int rank, int world,
                                                uint32_t parts = 0);

std::string EncodeTemplate(const LayoutTemplate& t);
// Corruption saying what is wrong (names, dtypes, shapes, rules checked).
Result<LayoutTemplate> DecodeTemplate(std::string_view bytes);
uint64_t TemplateHash(std::string_view encoded);

}  // namespace cairn
