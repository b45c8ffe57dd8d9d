// Box: an N-d index region of a tensor's global index space, and the normalisation of a
// flat row-major range [begin, end) into boxes.
//
// Every shard cairn handles is a Box in the global space of its tensor (docs/cpp.md,
// the first list). Irregular pieces (ZeRO/FSDP flat partitions) are normalised at the API edge
// into at most 2*ndim-1 boxes that, taken in order, cover the flat range contiguously.
#pragma once

#include <cstdint>
#include <optional>
#include <string>
#include <vector>

#include "cairn/status.h"

namespace cairn {

using Shape = std::vector<int64_t>;

// Number of elements of a shape (1 for a scalar shape {}); 0 if any extent is 0.
int64_t NumElements(const Shape& shape);
std::string ShapeToString(const Shape& shape);
// NumElements, or nullopt if an extent is negative or the product overflows int64.
std::optional<int64_t> CheckedNumElements(const Shape& shape);

struct Box {
  std::vector<int64_t> offsets;
  std::vector<int64_t> lengths;

  size_t ndim() const { return offsets.size(); }
  int64_t numel() const { return NumElements(lengths); }
  bool empty() const { return numel() == 0; }
  bool operator==(const Box&) const = default;
  // "[0:4, 8:16]"
  std::string ToString() const;

  // The whole of a tensor of the given shape.
  static Box Whole(const Shape& shape);
};

// OK when `box` has the tensor's rank, non-negative offsets and lengths, and lies inside
// `shape`; InvalidArgument saying which dimension is out of range otherwise.
Status CheckBoxInShape(const Box& box, const Shape& shape);

// The intersection of two boxes of the same rank; nullopt when they do not overlap (or
// the ranks differ). A scalar box ({} / {}) intersects another scalar box as itself.
std::optional<Box> Intersect(const Box& a, const Box& b);

// Splits the flat row-major element range [begin, end) of a tensor of `shape` into at
// most 2*ndim-1 boxes (1 for a scalar). The boxes are disjoint, cover exactly the range,
// and are listed in flat order: the row-major elements of box 0, then of box 1, ... are
// elements begin, begin+1, ..., end-1. An empty range gives no boxes.
// InvalidArgument if the range is not within [0, NumElements(shape)].
Result<std::vector<Box>> FlatRangeToBoxes(const Shape& shape, int64_t begin, int64_t end);

}  // namespace cairn
