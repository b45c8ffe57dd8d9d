// The CUDA copy engine. Without a usable device the engine must refuse with a clear
// Unavailable error and `auto` must fall back to the host engine; with one, device
// tensors must round-trip through pinned host slots bit-exactly.
#include <gtest/gtest.h>

#include <vector>

#include "api/checkpointer.h"
#include "snapshot/copy_engine.h"
#include "tests/test_util.h"

#ifdef CAIRN_HAVE_CUDA
#include <cuda_runtime_api.h>
#endif

namespace cairn {
namespace {

TEST(CudaEngine, AutoFallsBackToHostWithoutADevice) {
  if (CudaDeviceAvailable()) GTEST_SKIP() << "a CUDA device is present";
  auto cuda = MakeCudaCopyEngine(1);
  ASSERT_FALSE(cuda.ok());
  EXPECT_EQ(cuda.status().code(), StatusCode::kUnavailable);
  EXPECT_NE(cuda.status().message().find("CUDA"), std::string::npos);
  auto any = MakeCopyEngine(CopyEngineKind::kAuto, 1);
  ASSERT_TRUE(any.ok());
  EXPECT_EQ((*any)->name(), "host");
  // Asking for CUDA explicitly fails at Open with the reason.
  testing::TempDir root("cudaopen");
  Options o = testing::TestOptions(root, "cudaopen");
  o.copy_engine = CopyEngineKind::kCuda;
  auto c = Checkpointer::Open(o);
  ASSERT_FALSE(c.ok());
  EXPECT_EQ(c.status().code(), StatusCode::kUnavailable);
}

TEST(CudaEngine, DeviceTensorsRoundTrip) {
#ifndef CAIRN_HAVE_CUDA
  GTEST_SKIP() << "built without CUDA";
#else
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no usable CUDA device";
  const size_t n = (24 << 20) + 123;
  void* dev = nullptr;
  void* back = nullptr;
  ASSERT_EQ(cudaMalloc(&dev, n), cudaSuccess);
  ASSERT_EQ(cudaMalloc(&back, n), cudaSuccess);
  std::vector<uint8_t> host(n), out(n);
  testing::FillPattern(host.data(), n, 42);
  ASSERT_EQ(cudaMemcpy(dev, host.data(), n, cudaMemcpyHostToDevice), cudaSuccess);
  testing::TempDir root("cuda");
  Options o = testing::TestOptions(root, "cuda");
  o.copy_engine = CopyEngineKind::kCuda;
  {
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    EXPECT_EQ((*c)->stats().copy_engine, "cuda");
    TensorMeta meta{"w", DType::kU8, {static_cast<int64_t>(n)}};
    std::vector<ShardSpec> s = {ShardSpec::Whole(meta, dev, MemoryKind::kDevice)};
    ASSERT_TRUE((*c)->save(1, s).ok());
    ASSERT_TRUE((*c)->fence().ok());
    ASSERT_EQ(cudaMemset(dev, 0, n), cudaSuccess);  // mutate after the fence
    ASSERT_TRUE((*c)->wait_captured().ok());
    std::vector<ShardSpec> t = {ShardSpec::Whole(meta, back, MemoryKind::kDevice)};
    auto r = (*c)->restore(t);
    ASSERT_TRUE(r.ok()) << r.status().ToString();
  }
  ASSERT_EQ(cudaMemcpy(out.data(), back, n, cudaMemcpyDeviceToHost), cudaSuccess);
  EXPECT_TRUE(testing::CheckPattern(out.data(), n, 42));
  cudaFree(dev);
  cudaFree(back);
#endif
}

}  // namespace
}  // namespace cairn
