// Kernels the GPU tests and benchmarks queue on a training-like stream, behind plain C++
// declarations (the tests that call them are compiled by the host compiler).
#pragma once

#include <cstddef>
#include <cstdint>

namespace cairn::testing {

// Queues on `stream` a kernel that first waits `spin_ns` nanoseconds (every block, on the
// device clock), then writes `value` into every element of p[0, n). Returns the launch's
// cudaError_t as an int (0: queued).
int LaunchSlowFill(uint32_t* p, size_t n, uint32_t value, int64_t spin_ns, void* stream);

// Queues a kernel that counts the elements of p[0, n) different from `value` into *bad
// (device memory, zeroed first by the caller). Returns the launch's cudaError_t.
int LaunchCountOther(const uint32_t* p, size_t n, uint32_t value, unsigned long long* bad,
                     void* stream);

}  // namespace cairn::testing
