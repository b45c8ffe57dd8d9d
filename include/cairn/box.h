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

// Calls fn(src_offset, dst_offset, bytes) for each contiguous block of `region` (inside
// both boxes) in the row-major bytes of `src_box` and of `dst_box`, in row-major order;
// `elem` bytes per element. Trailing dimensions that the region spans whole in both boxes
// merge into one block.
template <typename Fn>
void ForEachRegionBlock(const Box& src_box, const Box& dst_box, const Box& region, size_t elem,
                        Fn&& fn);

// Copies the elements of `region` (inside both boxes) from `src`, the row-major bytes of
// `src_box`, to `dst`, the row-major bytes of `dst_box`; `elem` bytes per element, one
// memcpy per contiguous block.
void CopyBoxRegion(const void* src, const Box& src_box, void* dst, const Box& dst_box,
                   const Box& region, size_t elem);

// Byte offset of the element at `region`'s origin in the row-major bytes of `box`.
uint64_t BoxByteOffset(const Box& box, const Box& region, size_t elem);

template <typename Fn>
void ForEachRegionBlock(const Box& src_box, const Box& dst_box, const Box& region, size_t elem,
                        Fn&& fn) {
  const size_t nd = region.ndim();
  if (region.empty()) return;
  const uint64_t s0 = BoxByteOffset(src_box, region, elem);
  const uint64_t d0 = BoxByteOffset(dst_box, region, elem);
  if (nd == 0) {
    fn(s0, d0, static_cast<uint64_t>(elem));
    return;
  }
  // Dimensions k+1.. are whole in the region and both boxes: one block per index of 0..k-1.
  size_t k = nd - 1;
  while (k > 0 && region.lengths[k] == src_box.lengths[k] &&
         region.lengths[k] == dst_box.lengths[k])
    --k;
  uint64_t block = elem;
  for (size_t d = k; d < nd; ++d) block *= static_cast<uint64_t>(region.lengths[d]);
  std::vector<uint64_t> ss(nd), ds(nd);
  ss[nd - 1] = ds[nd - 1] = elem;
  for (size_t d = nd - 1; d-- > 0;) {
    ss[d] = ss[d + 1] * static_cast<uint64_t>(src_box.lengths[d + 1]);
    ds[d] = ds[d + 1] * static_cast<uint64_t>(dst_box.lengths[d + 1]);
  }
  std::vector<int64_t> idx(k, 0);
  for (;;) {
    uint64_t so = s0, dof = d0;
    for (size_t d = 0; d < k; ++d) {
      so += static_cast<uint64_t>(idx[d]) * ss[d];
      dof += static_cast<uint64_t>(idx[d]) * ds[d];
    }
    fn(so, dof, block);
    size_t d = k;
    while (d > 0) {
      --d;
      if (++idx[d] < region.lengths[d]) break;
      idx[d] = 0;
      if (d == 0) return;
    }
    if (k == 0) return;
  }
}

}  // namespace cairn
