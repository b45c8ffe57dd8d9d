// The host copy engine: streaming copies at every alignment, checksums equal to XXH3 of
// the bytes, and the worker pool runs every iteration exactly once.
#include <gtest/gtest.h>

#include <atomic>
#include <cstring>
#include <vector>

#include "core/checksum.h"
#include "snapshot/copy_engine.h"
#include "snapshot/worker_pool.h"
#include "tests/test_util.h"

namespace cairn {
namespace {

TEST(StreamingCopy, EveryAlignmentAndLength) {
  std::vector<unsigned char> src(3 << 16), dst(3 << 16);
  testing::FillPattern(src.data(), src.size(), 9);
  for (size_t so : {0, 1, 7, 16, 63}) {
    for (size_t d = 0; d < 64; d += 5) {
      for (size_t n : {0, 1, 63, 64, 4095, 4096, 4097, 65536 + 77, 131072}) {
        std::memset(dst.data(), 0, dst.size());
        StreamingCopy(dst.data() + d, src.data() + so, n);
        ASSERT_EQ(std::memcmp(dst.data() + d, src.data() + so, n), 0) << so << " " << d << " " << n;
        for (size_t i = 0; i < d; ++i) ASSERT_EQ(dst[i], 0) << "wrote before the destination";
        ASSERT_EQ(dst[d + n], 0) << "wrote past the end";
      }
    }
  }
}

TEST(HostCopyEngine, ChecksumsMatchTheCopiedBytes) {
  for (int threads : {1, 3}) {
    auto e = MakeHostCopyEngine(threads);
    std::vector<unsigned char> src(5 << 20), dst(5 << 20);
    testing::FillPattern(src.data(), src.size(), threads);
    std::vector<CopyChunk> chunks;
    for (size_t off = 0; off < src.size(); off += 700000)
      chunks.push_back(
          {src.data() + off, dst.data() + off, std::min<size_t>(700000, src.size() - off)});
    std::vector<uint64_t> sums(chunks.size());
    ASSERT_TRUE(e->Copy(chunks, sums.data()).ok());
    ASSERT_EQ(src, dst);
    std::vector<HostRange> ranges;
    for (size_t i = 0; i < chunks.size(); ++i) {
      EXPECT_EQ(sums[i], Checksum(chunks[i].src, chunks[i].bytes));
      ranges.push_back({chunks[i].dst, chunks[i].bytes});
    }
    std::vector<uint64_t> again(ranges.size());
    e->ChecksumHost(ranges, again.data());
    EXPECT_EQ(again, sums);
  }
}

TEST(WorkerPool, RunsEveryIterationOnce) {
  for (int threads : {1, 2, 4}) {
    WorkerPool pool(threads);
    for (int round = 0; round < 300; ++round) {
      const size_t n = static_cast<size_t>(round % 37);
      std::vector<std::atomic<int>> hits(n);
      pool.ParallelFor(n, [&](size_t i) { hits[i].fetch_add(1); });
      for (size_t i = 0; i < n; ++i) ASSERT_EQ(hits[i].load(), 1) << threads << " " << round;
    }
  }
}

}  // namespace
}  // namespace cairn
