#include <cuda_runtime.h>

#include "tests/gpu_kernels.h"

namespace cairn::testing {
namespace {

__global__ void SlowFill(uint32_t* p, size_t n, uint32_t value, long long spin_ns) {
  if (spin_ns > 0) {
    unsigned long long start;
    asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(start));
    for (;;) {
      unsigned long long now;
      asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(now));
      if (now - start >= static_cast<unsigned long long>(spin_ns)) break;
    }
  }
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    p[i] = value;
}

__global__ void CountOther(const uint32_t* p, size_t n, uint32_t value, unsigned long long* bad) {
  unsigned long long mine = 0;
  const size_t stride = static_cast<size_t>(gridDim.x) * blockDim.x;
  for (size_t i = static_cast<size_t>(blockIdx.x) * blockDim.x + threadIdx.x; i < n; i += stride)
    mine += p[i] != value;
  if (mine) atomicAdd(bad, mine);
}

// Few enough blocks to be resident at once, so that every block spins concurrently.
unsigned Blocks(size_t n) {
  size_t b = (n + 255) / 256;
  if (b > 256) b = 256;
  return static_cast<unsigned>(b ? b : 1);
}

}  // namespace

int LaunchSlowFill(uint32_t* p, size_t n, uint32_t value, int64_t spin_ns, void* stream) {
  (void)cudaGetLastError();  // report this launch's error, not an older one
  SlowFill<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(p, n, value, spin_ns);
  return static_cast<int>(cudaGetLastError());
}

int LaunchCountOther(const uint32_t* p, size_t n, uint32_t value, unsigned long long* bad,
                     void* stream) {
  (void)cudaGetLastError();
  CountOther<<<Blocks(n), 256, 0, static_cast<cudaStream_t>(stream)>>>(p, n, value, bad);
  return static_cast<int>(cudaGetLastError());
}

}  // namespace cairn::testing
