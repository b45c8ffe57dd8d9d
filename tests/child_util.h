// What the test children (ranks started by LocalLauncher) share.
#pragma once

#include <cstdio>
#include <cstdlib>
#include <memory>

#include "cairn/checkpointer.h"

namespace cairn::testing {

// Opens this rank's Checkpointer from the CAIRN_* environment (the options used land in
// *used); prints the error prefixed with `who` and exits 1. The copy engine is the host's
// unless CAIRN_COPY_ENGINE names one (the GPU suite's children name cuda: forcing host
// there made every device shard an error, found on the first GPU run).
inline std::unique_ptr<Checkpointer> OpenFromEnvironmentOrExit(const char* who, Options* used) {
  auto o = Options::FromEnvironment();
  if (!o.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, o.status().ToString().c_str());
    std::exit(1);
  }
  if (std::getenv("CAIRN_COPY_ENGINE") == nullptr) o->copy_engine = CopyEngineKind::kHost;
  *used = *o;
  auto ck = Checkpointer::Open(*o);
  if (!ck.ok()) {
    std::fprintf(stderr, "%s: %s\n", who, ck.status().ToString().c_str());
    std::exit(1);
  }
  return std::move(*ck);
}

}  // namespace cairn::testing
