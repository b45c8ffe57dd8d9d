// libFuzzer target: what ranks send each other during a restore (recovery/restore.cc) and a
// persist round (persist/persister.cc). The first byte picks the message (mod 7):
//   0  a rank's restore inventory            1  its catalog part with shard tables (the
//   2  a status-framed restore message          second byte is the saved job's world size)
//   3  a persist round's offer               4  rank 0's outcome of a persist round
//   5  a memory restore's layout references  6  its list of templates
// Must decode or fail cleanly: no crash, no huge allocation.
#include <cstdint>
#include <string_view>

#include "persist/persister.h"
#include "recovery/restore.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view b(reinterpret_cast<const char*>(data) + 2, size - 2);
  const int kind = data[0] % 7;
  if (kind <= 2)
    (void)cairn::DecodeRestoreMessageForFuzzing(kind, b, data[1]);
  else if (kind <= 4)
    (void)cairn::DecodePersistMessageForFuzzing(kind - 3, b);
  else
    (void)cairn::DecodeRestoreMessageForFuzzing(kind - 2, b, data[1]);
  return 0;
}
