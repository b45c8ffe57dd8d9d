// The one codec for messages live ranks exchange (wire/messages.proto): protobuf, framed
// with an 8-byte checksum of the body seeded by the message's type name, so that a message
// cut short, garbled in transit or sent as another type is an error (Corruption naming what
// was expected) before a field is read. Protobuf bounds every allocation by the bytes it
// was given; the modules check what the fields mean (layout/, persist/, recovery/).
//
// Serialization is deterministic for one build (no maps), so hashes of encodings (layout
// and template hashes) agree between the ranks of a job.
// Thread-safety: plain functions.
#pragma once

#include <string>
#include <string_view>

#include "cairn/status.h"
#include "wire/messages.pb.h"

namespace cairn::wire {

namespace internal {
uint64_t TypeSeed(const google::protobuf::MessageLite& m);
std::string Encode(const google::protobuf::MessageLite& m, uint64_t seed);
Status Decode(std::string_view bytes, google::protobuf::MessageLite* m, uint64_t seed,
              std::string_view what);
// The checksum seed of message type M, computed once.
template <typename M>
uint64_t SeedOf() {
  static const uint64_t seed = TypeSeed(M::default_instance());
  return seed;
}
}  // namespace internal

// The checksum frame, then the message.
template <typename M>
std::string Encode(const M& m) {
  return internal::Encode(m, internal::SeedOf<M>());
}

// Fills *m from bytes Encode made for a message of type M; Corruption "bad <what>: ..."
// otherwise.
template <typename M>
Status Decode(std::string_view bytes, M* m, std::string_view what) {
  return internal::Decode(bytes, m, internal::SeedOf<M>(), what);
}

template <typename M>
Result<M> Decode(std::string_view bytes, std::string_view what) {
  M m;
  CAIRN_RETURN_IF_ERROR(Decode(bytes, &m, what));
  return m;
}

void ToWire(const cairn::Status& st, wire::StatusMessage* out);
cairn::Status FromWire(const wire::StatusMessage& st);

}  // namespace cairn::wire
