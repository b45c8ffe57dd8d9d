// Checksums: XXH3-64 over byte ranges, the one hash cairn records for every chunk.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cairn {

uint64_t Checksum(const void* data, size_t n);

// Incremental form; Digest() after Update(a), Update(b) equals Checksum(a ++ b).
class ChecksumStream {
 public:
  ChecksumStream();
  ~ChecksumStream();
  ChecksumStream(const ChecksumStream&) = delete;
  ChecksumStream& operator=(const ChecksumStream&) = delete;
  void Reset();
  void Update(const void* data, size_t n);
  uint64_t Digest() const;

 private:
  void* state_;  // XXH3_state_t*
};

}  // namespace cairn
