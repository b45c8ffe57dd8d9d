// Version states (docs/architecture.md, "The life of a version") and what versions() lists.
// The numeric values are stored in slot headers: never renumber, only append.
#pragma once

#include <cstddef>
#include <cstdint>

namespace cairn {

enum class VersionState : uint32_t {
  kCapturing = 1,            // slot being filled; never restorable
  kCaptured = 2,             // all bytes in the host slot, checksums recorded
  kReplicated = 3,           // also held in a partner node's memory
  kPersisted = 4,            // also committed on the parallel filesystem
  kReplicatedPersisted = 5,  // both of the above
};

inline const char* VersionStateName(VersionState s) {
  switch (s) {
    case VersionState::kCapturing:
      return "CAPTURING";
    case VersionState::kCaptured:
      return "CAPTURED";
    case VersionState::kReplicated:
      return "REPLICATED";
    case VersionState::kPersisted:
      return "PERSISTED";
    case VersionState::kReplicatedPersisted:
      return "REPLICATED+PERSISTED";
  }
  return "INVALID";
}

// True for the states from which a version can be restored.
inline bool IsRestorable(VersionState s) {
  return s == VersionState::kCaptured || s == VersionState::kReplicated ||
         s == VersionState::kPersisted || s == VersionState::kReplicatedPersisted;
}

inline bool IsReplicated(VersionState s) {
  return s == VersionState::kReplicated || s == VersionState::kReplicatedPersisted;
}
inline bool IsPersisted(VersionState s) {
  return s == VersionState::kPersisted || s == VersionState::kReplicatedPersisted;
}

// The state of a restorable version after a stage adds `reached` (REPLICATED or
// PERSISTED) to `now`: the stages succeed independently and neither hides the other.
inline VersionState WithStage(VersionState now, VersionState reached) {
  const bool rep = IsReplicated(now) || IsReplicated(reached);
  const bool per = IsPersisted(now) || IsPersisted(reached);
  if (rep && per) return VersionState::kReplicatedPersisted;
  if (rep) return VersionState::kReplicated;
  if (per) return VersionState::kPersisted;
  return now;
}

// One version in a rank's host tier, as Checkpointer::versions() lists it.
struct VersionInfo {
  int64_t step = 0;
  VersionState state = VersionState::kCapturing;
  int slot = -1;
  uint64_t data_bytes = 0;
  int64_t created_wall_ns = 0;
  size_t shards = 0;
  size_t blobs = 0;
  uint32_t rank = 0;        // the rank that saved it
  uint32_t world_size = 1;  // of the job that saved it
};

}  // namespace cairn
