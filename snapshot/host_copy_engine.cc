#include <emmintrin.h>

#include <cstdint>
#include <cstring>

#include "core/checksum.h"
#include "core/kill_point.h"
#include "core/pool.h"
#include "snapshot/copy_engine.h"

namespace cairn {
namespace {

// Checksums are taken over sub-blocks this size right after they are copied, while the
// source bytes are still in L2, so checksumming costs no extra trip to memory.
constexpr size_t kSubBlock = 256 << 10;

class HostCopyEngine final : public CopyEngine {
 public:
  explicit HostCopyEngine(int threads) : pool_("cairn-copy", threads - 1, ThreadPriority::kBatch) {}

  std::string_view name() const override { return "host"; }
  bool checksums_while_copying() const override { return true; }

  Status Copy(std::span<const CopyChunk> chunks, uint64_t* checksums) override {
    auto one = [&](size_t i) {
      const CopyChunk& c = chunks[i];
      if (!checksums) {
        StreamingCopy(c.dst, c.src, c.bytes);
      } else {
        ChecksumStream h;
        auto* d = static_cast<std::byte*>(c.dst);
        auto* s = static_cast<const std::byte*>(c.src);
        for (size_t off = 0; off < c.bytes; off += kSubBlock) {
          const size_t n = std::min(kSubBlock, c.bytes - off);
          StreamingCopy(d + off, s + off, n);
          // Hash the bytes just read (cache-hot). They equal what was stored unless the
          // training mutated them before fence() returned, which the restore-time checksum
          // check then reports instead of restoring torn state.
          h.Update(s + off, n);
        }
        checksums[i] = h.Digest();
      }
      CAIRN_KILL_POINT("capture.copy_chunk");
    };
    pool_.ParallelFor(chunks.size(), one);
    return Status::OK();
  }

  void ChecksumHost(std::span<const HostRange> ranges, uint64_t* out) override {
    pool_.ParallelFor(ranges.size(),
                      [&](size_t i) { out[i] = Checksum(ranges[i].data, ranges[i].bytes); });
  }

 private:
  Pool pool_;  // the calling thread copies too
};

}  // namespace

void StreamingCopy(void* dst, const void* src, size_t n) {
  auto* d = static_cast<char*>(dst);
  auto* s = static_cast<const char*>(src);
  if (n < 4096) {
    std::memcpy(d, s, n);
    return;
  }
  const size_t head = (64 - (reinterpret_cast<uintptr_t>(d) & 63)) & 63;
  std::memcpy(d, s, head);
  d += head;
  s += head;
  n -= head;
  const size_t body = n & ~size_t{63};
  for (size_t i = 0; i < body; i += 64) {
    __m128i a = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i));
    __m128i b = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 16));
    __m128i c = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 32));
    __m128i e = _mm_loadu_si128(reinterpret_cast<const __m128i*>(s + i + 48));
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i), a);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 16), b);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 32), c);
    _mm_stream_si128(reinterpret_cast<__m128i*>(d + i + 48), e);
  }
  _mm_sfence();
  std::memcpy(d + body, s + body, n - body);
}

std::unique_ptr<CopyEngine> MakeHostCopyEngine(int threads) {
  return std::make_unique<HostCopyEngine>(threads < 1 ? 1 : threads);
}

Result<std::unique_ptr<CopyEngine>> MakeCopyEngine(CopyEngineKind kind, int threads) {
  if (kind == CopyEngineKind::kHost) return MakeHostCopyEngine(threads);
  if (kind == CopyEngineKind::kCuda) return MakeCudaCopyEngine(threads);
  if (CudaDeviceAvailable()) {
    auto e = MakeCudaCopyEngine(threads);
    // A bad setting is the user's to fix, not a reason to fall back to the host engine.
    if (e.ok() || e.status().code() == StatusCode::kInvalidArgument) return e;
  }
  return MakeHostCopyEngine(threads);
}

}  // namespace cairn
