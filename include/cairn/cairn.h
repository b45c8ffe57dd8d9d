// cairn's public surface in one include: Checkpointer, Options, Status/Result, ShardSpec,
// Box, DType, the restore options and report, Stats, PfsStep, and what prepares a restart's
// restore (NewestHeldBlob, Prefault). Link cairn::cairn (CMake) or
// `pkg-config --libs cairn`.
#pragma once

#include "cairn/box.h"           // IWYU pragma: export
#include "cairn/checkpointer.h"  // IWYU pragma: export
#include "cairn/dtype.h"         // IWYU pragma: export
#include "cairn/group.h"         // IWYU pragma: export
#include "cairn/options.h"       // IWYU pragma: export
#include "cairn/pfs_step.h"      // IWYU pragma: export
#include "cairn/prepare.h"       // IWYU pragma: export
#include "cairn/restore.h"       // IWYU pragma: export
#include "cairn/stats.h"         // IWYU pragma: export
#include "cairn/status.h"        // IWYU pragma: export
#include "cairn/tensor.h"        // IWYU pragma: export
#include "cairn/version.h"       // IWYU pragma: export
