// Built instead of cuda_copy_engine.cc when CMake finds no CUDA toolkit.
#include "snapshot/copy_engine.h"

namespace cairn {

bool CudaDeviceAvailable() {
  return false;
}

Result<std::unique_ptr<CopyEngine>> MakeCudaCopyEngine(int threads, size_t window_bytes) {
  (void)threads, (void)window_bytes;
  return Status::Unavailable(
      "this build of cairn has no CUDA copy engine (CUDA toolkit not found at configure time)");
}

}  // namespace cairn
