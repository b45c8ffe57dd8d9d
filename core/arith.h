// Integer rounding, and the size limits every format checks what it reads against.
//
// Rounding is written once here because a hand-written `(v + a - 1) / a` wraps for v near the
// type's maximum (a fuzzing find in one of its copies); CeilDiv never wraps.
#pragma once

#include <concepts>
#include <cstdint>

namespace cairn {

// ceil(v / d) for v >= 0 and d > 0, without forming v + d - 1.
template <std::integral T>
constexpr T CeilDiv(T v, T d) {
  return v / d + (v % d != 0 ? 1 : 0);
}

// The smallest multiple of a that is >= v (v >= 0, a > 0). The caller bounds v so that the
// result fits (every size cairn rounds is below kMaxFileOffset).
template <std::integral T>
constexpr T RoundUp(T v, T a) {
  return CeilDiv(v, a) * a;
}

// The largest chunk size a slot header, a MANIFEST or a peer's shard table may state
// (CAIRN_CHUNK_BYTES allows 1 GiB); larger values are damage, and would overflow chunk
// arithmetic.
inline constexpr uint64_t kMaxChunkBytes = uint64_t{1} << 40;
// The largest blob (a non-tensor entry of a version) a format may state.
inline constexpr uint64_t kMaxBlobBytes = uint64_t{1} << 40;
// The largest byte offset or length in a data file a format may state: 4 EiB, far past any
// real file, and small enough that offset + length and rounding up to a chunk cannot wrap.
inline constexpr uint64_t kMaxFileOffset = uint64_t{1} << 62;

}  // namespace cairn
