// Version states (ARCHITECTURE.md section 1). The numeric values are stored in slot
// headers: never renumber, only append.
#pragma once

#include <cstdint>

namespace cairn {

enum class VersionState : uint32_t {
  kCapturing = 1,   // slot being filled; never restorable
  kCaptured = 2,    // all bytes in the host slot, checksums recorded
  kReplicated = 3,  // also held in a partner node's memory
  kPersisted = 4,   // also committed on the parallel filesystem
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
  }
  return "INVALID";
}

// True for the states from which a version can be restored.
inline bool IsRestorable(VersionState s) {
  return s == VersionState::kCaptured || s == VersionState::kReplicated ||
         s == VersionState::kPersisted;
}

}  // namespace cairn
