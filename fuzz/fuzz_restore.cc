// libFuzzer target: what ranks send each other during a restore (recovery/restore.cc): a
// rank's inventory (first byte even) or its shard tables (odd; the second byte is the saved
// job's world size). Must decode or fail cleanly: no crash, no huge allocation.
#include <cstdint>
#include <string_view>

#include "recovery/restore.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view b(reinterpret_cast<const char*>(data) + 2, size - 2);
  (void)cairn::DecodeRestoreMessageForFuzzing(data[0] & 1, b, data[1]);
  return 0;
}
