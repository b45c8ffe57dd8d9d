// libFuzzer target: the flat-range normalisation (a ZeRO / FSDP flat partition as boxes).
// Input: ndim (1 byte), dims (2 bytes each), begin and end (4 bytes each). The boxes must be
// inside the shape, in flat order, and cover exactly [begin, end).
#include <cstdint>
#include <cstdlib>
#include <cstring>

#include "cairn/box.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 1) return 0;
  const size_t nd = data[0] % 6;
  if (size < 1 + 2 * nd + 8) return 0;
  cairn::Shape shape;
  for (size_t d = 0; d < nd; ++d) {
    uint16_t v;
    std::memcpy(&v, data + 1 + 2 * d, 2);
    shape.push_back(v % 64);
  }
  int32_t begin, end;
  std::memcpy(&begin, data + 1 + 2 * nd, 4);
  std::memcpy(&end, data + 5 + 2 * nd, 4);
  auto boxes = cairn::FlatRangeToBoxes(shape, begin, end);
  const int64_t n = cairn::NumElements(shape);
  const bool valid = begin >= 0 && begin <= end && end <= n;
  if (boxes.ok() != valid) std::abort();
  if (!boxes.ok()) return 0;
  int64_t next = begin;
  for (const cairn::Box& b : *boxes) {
    if (b.ndim() != nd || b.empty()) std::abort();
    int64_t first = 0, last = 0;  // flat indices of the box's first and last elements
    for (size_t d = 0; d < nd; ++d) {
      if (b.offsets[d] < 0 || b.lengths[d] < 1 || b.offsets[d] + b.lengths[d] > shape[d])
        std::abort();
      first = first * shape[d] + b.offsets[d];
      last = last * shape[d] + b.offsets[d] + b.lengths[d] - 1;
    }
    // The box's elements are exactly the flat run [next, next + numel).
    if (first != next || last != first + b.numel() - 1) std::abort();
    next += b.numel();
  }
  if (next != end) std::abort();
  return 0;
}
