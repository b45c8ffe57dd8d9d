// libFuzzer target: a PFS MANIFEST (persist/FORMAT.md) from untrusted bytes. The first byte
// picks the mode: odd, the rest is the protobuf payload, framed here with the right magic,
// length and checksum (so the fuzzer reaches the protobuf parser and the validation); even,
// the rest is decoded as a whole file. Anything that decodes must validate, re-encode and
// decode again; a format-2 one must also give its plan or an error, and expand (its index
// files read as the input's tail) or fail cleanly.
#include <cstdint>
#include <cstdlib>
#include <string>
#include <string_view>

#include "core/checksum.h"
#include "persist/manifest.h"
#include "persist/step_index.h"

extern "C" int LLVMFuzzerTestOneInput(const uint8_t* data, size_t size) {
  if (size == 0) return 0;
  std::string bytes(reinterpret_cast<const char*>(data) + 1, size - 1);
  if (data[0] & 1) {
    const uint64_t n = bytes.size(), sum = cairn::Checksum(bytes.data(), bytes.size());
    bytes = std::string("CAIRNMF1") + std::string(reinterpret_cast<const char*>(&n), 8) + bytes +
            std::string(reinterpret_cast<const char*>(&sum), 8);
  }
  auto m = cairn::DecodeManifest(bytes);
  if (!m.ok()) return 0;
  if (!cairn::ValidateManifest(*m).ok()) std::abort();  // DecodeManifest validates
  if (!cairn::DecodeManifest(cairn::EncodeManifest(*m)).ok()) std::abort();
  if (m->format_version() == cairn::kTemplatedManifestVersion && m->world_size() <= 64) {
    const std::string tail = bytes.substr(bytes.size() / 2);
    auto full = cairn::ExpandManifest(*m, [&](int) -> cairn::Result<std::string> { return tail; });
    if (full.ok() && !cairn::ValidateManifest(*full).ok()) std::abort();
  }
  return 0;
}
