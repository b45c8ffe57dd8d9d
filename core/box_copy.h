// Copying the bytes of a box region between the row-major buffers of two boxes: the
// kernels the restore, the PFS reader and the demo use (not part of the public API).
#pragma once

#include <cstddef>
#include <cstdint>
#include <vector>

#include "cairn/box.h"

namespace cairn {

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
