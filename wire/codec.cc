#include "wire/codec.h"

#include <cstring>

#include "core/checksum.h"

namespace cairn::wire {
namespace {
constexpr size_t kFrameBytes = sizeof(uint64_t);
}  // namespace

namespace internal {

uint64_t TypeSeed(const google::protobuf::MessageLite& m) {
  const std::string type = m.GetTypeName();
  return Checksum(type.data(), type.size());
}

std::string Encode(const google::protobuf::MessageLite& m, uint64_t seed) {
  std::string out(kFrameBytes, '\0');
  m.AppendToString(&out);
  const uint64_t sum = Checksum(out.data() + kFrameBytes, out.size() - kFrameBytes) ^ seed;
  std::memcpy(out.data(), &sum, kFrameBytes);
  return out;
}

Status Decode(std::string_view bytes, google::protobuf::MessageLite* m, uint64_t seed,
              std::string_view what) {
  const auto bad = [&](const std::string& why) {
    return Status::Corruption("bad " + std::string(what) + ": " + why);
  };
  if (bytes.size() < kFrameBytes)
    return bad(std::to_string(bytes.size()) + " bytes, fewer than a message's checksum");
  const std::string_view body = bytes.substr(kFrameBytes);
#ifndef FUZZING_BUILD_MODE_UNSAFE_FOR_PRODUCTION  // (scripts/fuzz.sh: mutations reach the parser)
  uint64_t sum = 0;
  std::memcpy(&sum, bytes.data(), kFrameBytes);
  if (sum != (Checksum(body.data(), body.size()) ^ seed))
    return bad("checksum mismatch (" + std::to_string(bytes.size()) +
               " bytes: cut short, damaged, or another kind of message)");
#else
  (void)seed;
#endif
  if (body.size() > static_cast<size_t>(INT32_MAX) ||
      !m->ParseFromArray(body.data(), static_cast<int>(body.size())))
    return bad("not a " + m->GetTypeName() + " message");
  return Status::OK();
}

}  // namespace internal

void ToWire(const cairn::Status& st, wire::StatusMessage* out) {
  out->set_code(static_cast<uint32_t>(st.code()));
  out->set_message(st.message());
}

cairn::Status FromWire(const wire::StatusMessage& st) {
  if (st.code() == 0) return cairn::Status::OK();
  const bool known = st.code() <= static_cast<uint32_t>(StatusCode::kInternal);
  return cairn::Status(known ? static_cast<StatusCode>(st.code()) : StatusCode::kInternal,
                       st.message());
}

}  // namespace cairn::wire
