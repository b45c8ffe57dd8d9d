// What tests reach of a Checkpointer beyond the public API: opening it on filesystems other
// than POSIX, to make the host tier or the PFS fail, fill up or lose power
// (testing/fault_injection_filesystem.h, testing/power_loss_filesystem.h,
// testing/controlled_filesystems.h), and counts of its internals (the soak's UCX requests).
// Not part of the public API: a user's checkpointer always works on the POSIX filesystem.
#pragma once

#include <memory>

#include "cairn/checkpointer.h"
#include "cairn/options.h"
#include "core/filesystem.h"

namespace cairn {

struct FileSystems {
  FileSystem* host = nullptr;  // the host tier; nullptr: the POSIX filesystem
  FileSystem* pfs = nullptr;   // the PFS tier and the rendezvous directory; nullptr: `host`
};

struct CheckpointerInternals {
  static Result<std::unique_ptr<Checkpointer>> Open(Options options, FileSystems fs);
  // UCX requests the rank started and has not yet completed and released (0 without UCX):
  // bounded by the transfers in flight, never growing with the versions saved.
  static int64_t UcxRequestsInFlight(const Checkpointer& c);
};

// Checkpointer::Open(options) on the filesystems `fs`.
inline Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(Options options, FileSystems fs) {
  return CheckpointerInternals::Open(std::move(options), fs);
}

}  // namespace cairn
