// The CUDA copy engine without a device: it must refuse with a clear Unavailable error and
// `auto` must fall back to the host engine. With a device, tests/gpu_test.cc (label gpu).
#include <gtest/gtest.h>

#include "cairn/checkpointer.h"
#include "snapshot/copy_engine.h"
#include "tests/test_util.h"

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

}  // namespace
}  // namespace cairn
