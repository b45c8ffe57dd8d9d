// libFuzzer target: a slot or replica header (tiers/FORMAT.md) from untrusted bytes. The
// first byte picks the mode: odd, the rest is a header without its trailing checksum, which
// the target appends (so the fuzzer reaches the field checks behind the checksum); even,
// the rest is decoded as it is. A header that decodes must re-encode to an equal header and
// keep every chunk inside the data it describes.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/checksum.h"
#include "tiers/slot_header.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    const uint64_t sum = cairn::Checksum(bytes.data(), bytes.size());
    bytes.append(reinterpret_cast<const char*>(&sum), sizeof sum);
  }
  auto h = cairn::DecodeSlotHeader(bytes);
  if (!h.ok()) return 0;
  auto again = cairn::DecodeSlotHeader(cairn::EncodeSlotHeader(*h));
  if (!again.ok() || !(*again == *h)) std::abort();
  for (const cairn::SlotShard& s : h->shards)
    for (uint32_t i = 0; i < s.num_chunks; ++i) {
      auto [b, e] = h->ChunkRange(s, i);
      if (b > e || e > h->data_bytes || b < s.offset || e > s.offset + s.nbytes) std::abort();
    }
  return 0;
}
