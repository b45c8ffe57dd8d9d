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

// Replays runs the way a strided device copy would, to compare with the chunks.
std::vector<std::pair<const std::byte*, std::byte*>> RowsOf(const std::vector<CopyRows>& runs) {
  std::vector<std::pair<const std::byte*, std::byte*>> out;
  for (const CopyRows& r : runs)
    for (size_t i = 0; i < r.rows; ++i) out.push_back({r.src + i * r.spitch, r.dst + i * r.dpitch});
  return out;
}

TEST(GroupRows, EveryChunkLandsOnceAndStridedRowsBecomeOneRun) {
  std::vector<std::byte> src(1 << 16), dst(1 << 16);
  std::vector<CopyChunk> c;
  // 10 rows of 48 bytes: source rows 100 apart, destination rows 64 apart (a column split).
  for (int i = 0; i < 10; ++i)
    c.push_back({src.data() + 7 + i * 100, dst.data() + i * 64, 48, true});
  // A contiguous chunk, then rows whose stride changes half-way, then rows of another width.
  c.push_back({src.data() + 2000, dst.data() + 2000, 500, true});
  for (int i = 0; i < 4; ++i)
    c.push_back({src.data() + 3000 + i * 40, dst.data() + 3000 + i * 40, 32, true});
  for (int i = 0; i < 3; ++i)
    c.push_back({src.data() + 4000 + i * 80, dst.data() + 4000 + i * 32, 32, true});
  c.push_back({src.data() + 5000, dst.data() + 5000, 16, true});
  // Overlapping or backwards steps never join a run.
  c.push_back({src.data() + 5010, dst.data() + 5100, 16, true});
  c.push_back({src.data() + 4990, dst.data() + 5200, 16, true});
  const auto runs = GroupRows(c);
  const auto rows = RowsOf(runs);
  ASSERT_EQ(rows.size(), c.size());
  size_t k = 0;
  for (const CopyRows& r : runs) {
    for (size_t i = 0; i < r.rows; ++i, ++k) {
      EXPECT_EQ(rows[k].first, c[k].src) << k;
      EXPECT_EQ(rows[k].second, c[k].dst) << k;
      EXPECT_EQ(r.width, c[k].bytes) << k;
    }
    if (r.rows > 1) {
      EXPECT_GE(r.spitch, r.width);
      EXPECT_GE(r.dpitch, r.width);
    }
  }
  ASSERT_GE(runs.size(), 4u);
  EXPECT_EQ(runs[0].rows, 10u);  // the column split: one strided copy
  EXPECT_EQ(runs[0].spitch, 100u);
  EXPECT_EQ(runs[0].dpitch, 64u);
  EXPECT_EQ(runs[1].rows, 1u);  // the contiguous chunk
  EXPECT_EQ(runs[2].rows, 4u);
  EXPECT_LE(runs.size(), 9u);
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
