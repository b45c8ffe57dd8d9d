// The restore transport over the job's UCX endpoints (tagged messages on `channel`,
// received straight into their destination).
// Thread-safety: one restore at a time.
#pragma once

#include <memory>

#include "recovery/restore.h"
#include "transport/ucx_comm.h"

namespace cairn {

std::unique_ptr<RestoreTransport> MakeUcxRestoreTransport(UcxComm* comm, Channel channel);

}  // namespace cairn
