// libFuzzer target: the records ranks send each other (a rank's layout for the save
// planner, a writer's location table for the commit) and the rendezvous address file. The
// first byte picks the parser; whatever decodes must round-trip.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "persist/commit.h"
#include "persist/save_planner.h"
#include "transport/rendezvous.h"
#include "transport/ucx_comm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view b(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 3) {
    case 0: {
      auto l = cairn::DecodeRankLayout(b);
      if (l.ok() && !cairn::DecodeRankLayout(cairn::EncodeRankLayout(*l)).ok()) std::abort();
      break;
    }
    case 1: {
      auto t = cairn::DecodeLocationTable(b);
      if (t.ok() && !cairn::DecodeLocationTable(cairn::EncodeLocationTable(*t)).ok()) std::abort();
      break;
    }
    default: {
      std::string address, nonce;
      const int rank = b.size() > 8 ? static_cast<uint8_t>(b[8]) : 0;
      if (cairn::ParseAddressFile(b, rank, 4, &address, &nonce).ok() &&
          (nonce.size() != 16 || address.size() + 36 != b.size()))
        std::abort();
      break;
    }
  }
  return 0;
}
