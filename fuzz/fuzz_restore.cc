// libFuzzer target: what ranks send each other during a restore (recovery/restore.cc) and a
// persist round (persist/persister.cc) and the step agreement (snapshot/step_agreement.cc).
// The first byte picks the message (mod 11):
//   0  a rank's restore inventory            1  its catalog part with shard tables (the
//   2  a status-framed restore message          second byte is the saved job's world size)
//   3  a persist round's offer               4  rank 0's outcome of a persist round
//   5  a memory restore's layout references  6  its list of templates
//   7  a step agreement offer (decoded, then agreed on as every rank's offer)
//   8  a parity record's meta file (redundancy/parity_store.h; written by this user, but
//      read back after crashes)
//   9  a rank's rebuild inventory (recovery/rebuild.h; decoded, then planned as the
//      holdings of two ranks)
//   10 the saved tensors a restoring rank's targets name (the second byte: how many were saved)
// Must decode or fail cleanly: no crash, no huge allocation.
#include <cstdint>
#include <string_view>

#include "persist/persister.h"
#include "recovery/rebuild.h"
#include "recovery/restore.h"
#include "redundancy/parity_store.h"
#include "snapshot/step_agreement.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size < 2) return 0;
  const std::string_view b(reinterpret_cast<const char*>(data) + 2, size - 2);
  const int kind = data[0] % 11;
  if (kind == 10) {
    (void)cairn::DecodeRestoreMessageForFuzzing(5, b, data[1]);
  } else if (kind == 8) {
    (void)cairn::DecodeParityRecord(b, "a parity record");
  } else if (kind == 9) {
    auto h = cairn::DecodeRebuildHoldings(b, "rank 1");
    if (h.ok()) {
      cairn::RebuildHoldings other = *h;
      other.own_steps.clear();  // rank 1 lost everything of its own
      (void)cairn::PlanRebuild({*h, other});
    }
  } else if (kind == 7) {
    auto offer = cairn::DecodeAgreeOffer(b, "rank 1");
    if (offer.ok()) (void)cairn::Agree({*offer, *offer}, offer->first - 1);
  } else if (kind <= 2)
    (void)cairn::DecodeRestoreMessageForFuzzing(kind, b, data[1]);
  else if (kind <= 4)
    (void)cairn::DecodePersistMessageForFuzzing(kind - 3, b);
  else
    (void)cairn::DecodeRestoreMessageForFuzzing(kind - 2, b, data[1]);
  return 0;
}
