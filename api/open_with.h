// Opening a Checkpointer on filesystems other than POSIX: the seam the tests use to make
// the host tier or the PFS fail, fill up or lose power (testing/fault_filesystem.h,
// testing/power_loss_filesystem.h). Not part of the public API: a user's checkpointer always
// works on the POSIX filesystem.
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

struct CheckpointerOpener {
  static Result<std::unique_ptr<Checkpointer>> Open(Options options, FileSystems fs);
};

// Checkpointer::Open(options) on the filesystems `fs`.
inline Result<std::unique_ptr<Checkpointer>> OpenCheckpointer(Options options, FileSystems fs) {
  return CheckpointerOpener::Open(std::move(options), fs);
}

}  // namespace cairn
