// libFuzzer target: the records ranks send each other (a rank's layout for the save
// planner, its layout message and template, a writer's location table for the commit), a
// writer's index file and the rendezvous address file. The first byte picks the parser;
// whatever decodes must round-trip (decode(encode(x)) == x; a template must also expand for
// each of its parts). The wire messages' checksum is off in the fuzz build (scripts/fuzz.sh).
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "layout/layout_template.h"
#include "layout/save_planner.h"
#include "layout/templated_plan.h"
#include "persist/commit.h"
#include "persist/step_index.h"
#include "transport/rendezvous.h"
#include "transport/ucx_comm.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  const std::string_view b(reinterpret_cast<const char*>(data) + 1, size - 1);
  switch (data[0] % 6) {
    case 3: {
      auto t = cairn::DecodeTemplate(b);
      if (!t.ok()) break;
      auto back = cairn::DecodeTemplate(cairn::EncodeTemplate(*t));
      if (!back.ok() || !(*back == *t)) std::abort();
      for (uint32_t i = 0; i < t->parts && i < 4; ++i) (void)cairn::ExpandTemplate(*t, i);
      break;
    }
    case 4: {
      auto x = cairn::DecodeWriterIndex(b);
      if (x.ok() && cairn::EncodeWriterIndex(*x) != b) std::abort();
      break;
    }
    case 5: {
      auto m = cairn::DecodeLayoutMessage(b);
      if (!m.ok()) break;
      auto back = cairn::DecodeLayoutMessage(cairn::EncodeLayoutMessage(*m));
      if (!back.ok() || back->templated != m->templated || back->layout != m->layout ||
          back->template_hash != m->template_hash || back->index != m->index)
        std::abort();
      break;
    }
    case 0: {
      auto l = cairn::DecodeRankLayout(b);
      if (!l.ok()) break;
      const std::string e = cairn::EncodeRankLayout(*l);
      auto back = cairn::DecodeRankLayout(e);
      if (!back.ok() || cairn::EncodeRankLayout(*back) != e) std::abort();
      break;
    }
    case 1: {
      auto t = cairn::DecodeLocationTable(b);
      if (!t.ok()) break;
      const std::string e = cairn::EncodeLocationTable(*t);
      auto back = cairn::DecodeLocationTable(e);
      if (!back.ok() || cairn::EncodeLocationTable(*back) != e) std::abort();
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
