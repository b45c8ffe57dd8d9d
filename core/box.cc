#include "cairn/box.h"
#include "core/arith.h"
#include "core/box_copy.h"

#include <algorithm>
#include <cstring>

namespace cairn {

int64_t NumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) n *= d;
  return n;
}

std::optional<int64_t> CheckedNumElements(const Shape& shape) {
  int64_t n = 1;
  for (int64_t d : shape) {
    if (d < 0 || __builtin_mul_overflow(n, d, &n)) return std::nullopt;
  }
  return n;
}

std::string ShapeToString(const Shape& shape) {
  std::string s = "[";
  for (size_t i = 0; i < shape.size(); ++i) {
    if (i) s += ", ";
    s += std::to_string(shape[i]);
  }
  return s + "]";
}

std::string Box::ToString() const {
  // Also describes malformed boxes (from hostile input): no overflow, no missing length.
  std::string s = "[";
  for (size_t i = 0; i < std::max(offsets.size(), lengths.size()); ++i) {
    if (i) s += ", ";
    const bool has_off = i < offsets.size(), has_len = i < lengths.size();
    int64_t end = 0;
    s += has_off ? std::to_string(offsets[i]) : "?";
    s += ":";
    if (has_off && has_len && !__builtin_add_overflow(offsets[i], lengths[i], &end))
      s += std::to_string(end);
    else if (has_len)
      s.append("+").append(std::to_string(lengths[i]));  // not "+" + ...: GCC 12 -O3 -Wrestrict
    else
      s += "?";
  }
  return s + "]";
}

Box Box::Whole(const Shape& shape) {
  return Box{std::vector<int64_t>(shape.size(), 0), shape};
}

Status CheckBoxInShape(const Box& box, const Shape& shape) {
  if (box.offsets.size() != box.lengths.size())
    return Status::InvalidArgument("box has " + std::to_string(box.offsets.size()) +
                                   " offsets but " + std::to_string(box.lengths.size()) +
                                   " lengths");
  if (box.ndim() != shape.size())
    return Status::InvalidArgument("box " + box.ToString() + " has rank " +
                                   std::to_string(box.ndim()) + " but the tensor has rank " +
                                   std::to_string(shape.size()));
  for (size_t d = 0; d < shape.size(); ++d) {
    if (shape[d] < 0)
      return Status::InvalidArgument("negative extent in shape " + ShapeToString(shape));
    if (box.offsets[d] < 0 || box.lengths[d] < 0 || box.offsets[d] > shape[d] ||
        box.lengths[d] > shape[d] - box.offsets[d])
      return Status::InvalidArgument("box " + box.ToString() + " lies outside shape " +
                                     ShapeToString(shape) + " in dimension " + std::to_string(d));
  }
  return Status::OK();
}

std::optional<Box> Intersect(const Box& a, const Box& b) {
  if (a.ndim() != b.ndim()) return std::nullopt;
  Box r;
  r.offsets.resize(a.ndim());
  r.lengths.resize(a.ndim());
  for (size_t d = 0; d < a.ndim(); ++d) {
    int64_t lo = std::max(a.offsets[d], b.offsets[d]);
    int64_t hi = std::min(a.offsets[d] + a.lengths[d], b.offsets[d] + b.lengths[d]);
    if (hi <= lo) return std::nullopt;
    r.offsets[d] = lo;
    r.lengths[d] = hi - lo;
  }
  return r;
}

Result<std::vector<Box>> FlatRangeToBoxes(const Shape& shape, int64_t begin, int64_t end) {
  for (int64_t d : shape)
    if (d < 0) return Status::InvalidArgument("negative extent in shape " + ShapeToString(shape));
  const int64_t total = NumElements(shape);
  if (begin < 0 || end < begin || end > total)
    return Status::InvalidArgument("flat range [" + std::to_string(begin) + ", " +
                                   std::to_string(end) + ") is not within the " +
                                   std::to_string(total) + " elements of shape " +
                                   ShapeToString(shape));
  std::vector<Box> out;
  if (begin == end) return out;
  const size_t n = shape.size();
  if (n == 0) {
    out.push_back(Box{});
    return out;
  }
  // stride[d]: elements in one step of dimension d.
  std::vector<int64_t> stride(n, 1);
  for (size_t d = n - 1; d > 0; --d) stride[d - 1] = stride[d] * shape[d];

  // A piece [cur, cur + count*stride[d]) that starts at a multiple of stride[d] and stays
  // inside one step of dimension d-1: fixed indices in dims < d, a range in dim d, whole
  // extents in dims > d.
  auto piece = [&](int64_t cur, size_t d, int64_t count) {
    Box b;
    b.offsets.assign(n, 0);
    b.lengths.assign(n, 1);
    int64_t rem = cur;
    for (size_t k = 0; k < n; ++k) {
      b.offsets[k] = rem / stride[k];
      rem %= stride[k];
    }
    b.lengths[d] = count;
    for (size_t k = d + 1; k < n; ++k) {
      b.offsets[k] = 0;
      b.lengths[k] = shape[k];
    }
    out.push_back(std::move(b));
  };

  int64_t cur = begin;
  // Ascending: align cur to ever larger strides, emitting the partial head pieces.
  for (size_t d = n - 1; d >= 1; --d) {
    const int64_t s = stride[d - 1];
    const int64_t boundary = RoundUp(cur, s);
    if (boundary >= end) break;  // the rest lies inside one step of dim d-1
    if (cur < boundary) {
      piece(cur, d, (boundary - cur) / stride[d]);
      cur = boundary;
    }
  }
  // Descending: whole steps of ever smaller dimensions.
  for (size_t d = 0; d < n && cur < end; ++d) {
    const int64_t count = (end - cur) / stride[d];
    if (count > 0) {
      piece(cur, d, count);
      cur += count * stride[d];
    }
  }
  return out;
}

uint64_t BoxByteOffset(const Box& box, const Box& region, size_t elem) {
  uint64_t off = 0;
  for (size_t d = 0; d < box.ndim(); ++d)
    off = off * static_cast<uint64_t>(box.lengths[d]) +
          static_cast<uint64_t>(region.offsets[d] - box.offsets[d]);
  return off * elem;
}

void CopyBoxRegion(const void* src, const Box& src_box, void* dst, const Box& dst_box,
                   const Box& region, size_t elem) {
  const auto* s = static_cast<const std::byte*>(src);
  auto* d = static_cast<std::byte*>(dst);
  ForEachRegionBlock(src_box, dst_box, region, elem, [&](uint64_t so, uint64_t dof, uint64_t n) {
    std::memcpy(d + dof, s + so, n);
  });
}

}  // namespace cairn
