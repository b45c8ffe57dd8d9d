// The host copy engine: streaming copies at every alignment, checksums equal to XXH3 of
// the bytes; the grouping of chunks into device copies, and the capture pipeline marking
// which chunks may be grouped.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <cstring>
#include <thread>
#include <vector>

#include "core/checksum.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "core/pool.h"
#include "snapshot/capture_pipeline.h"
#include "snapshot/copy_engine.h"
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

TEST(GroupCopies, OnlyChunksThatContinueATensorJoinAndEveryChunkLandsOnce) {
  std::vector<std::byte> src(1 << 16), dst(1 << 16);
  std::byte* s = src.data();
  std::byte* d = dst.data();
  std::vector<CopyChunk> c = {
      // Tensor A in 4 chunks of 100: groups of at most 250 bytes hold two of them.
      {s, d, 100, true, false},
      {s + 100, d + 100, 100, true, true},
      {s + 200, d + 200, 100, true, true},
      {s + 300, d + 300, 100, true, true},
      // Tensor B right after A in both address spaces: adjacent, but another allocation.
      {s + 400, d + 400, 50, true, false},
      // Chunks marked as continuing whose bytes do not follow on never join; nor does one
      // whose predecessor in `order` is not the chunk before it.
      {s + 1000, d + 460, 50, true, true},
      {s + 1050, d + 2000, 50, true, true},
      // A host chunk between device chunks (left out of `order` below).
      {s + 3000, d + 3000, 10, false, false},
      {s + 1100, d + 2050, 50, true, true},
  };
  const std::vector<size_t> order = {0, 1, 2, 3, 4, 5, 6, 8};
  std::vector<uint32_t> group_of;
  const auto groups = GroupCopies(c, order, 250, &group_of);
  ASSERT_EQ(group_of.size(), order.size());
  // Replayed, the groups cover exactly the chunks, in order, each once.
  size_t k = 0;
  for (uint32_t g = 0; g < groups.size(); ++g) {
    size_t off = 0;
    for (; k < order.size() && group_of[k] == g; ++k) {
      EXPECT_EQ(groups[g].src + off, c[order[k]].src) << k;
      EXPECT_EQ(groups[g].dst + off, c[order[k]].dst) << k;
      off += c[order[k]].bytes;
    }
    EXPECT_EQ(off, groups[g].bytes) << g;
    EXPECT_LE(groups[g].bytes, 250u) << g;
  }
  EXPECT_EQ(k, order.size());
  EXPECT_EQ(group_of, (std::vector<uint32_t>{0, 0, 1, 1, 2, 3, 4, 5}));
}

// The CUDA engine's landing, with sleeps for copies: every chunk is checksummed exactly
// once and never before its group has landed, checksums run while later groups are still
// in flight (the last group lands only once some chunk was checksummed: a landing that
// checksummed only after every copy would time out here), and after a failed wait no
// chunk of that group or a later one is checksummed (earlier ones may or may not be).
TEST(ChecksumAsTheyLand, EachChunkOnceAfterItsGroupLandsWhileLaterGroupsAreInFlight) {
  Pool pool("test", 4);
  const std::vector<uint32_t> group_of = {0, 0, 0, 1, 2, 2, 3, 3, 3, 3, 4, 5, 5, 6, 7, 7};
  const size_t groups = 8;
  const std::vector<size_t> group_bytes(groups, 10);
  for (const size_t fail_at : {groups, size_t{3}}) {
    std::vector<std::atomic<bool>> landed(groups);
    std::vector<std::atomic<int>> done(group_of.size());
    std::atomic<int> checksummed{0};
    bool overlapped = false;
    LandingSteps steps;
    steps.enqueue = [](size_t) { return Status::OK(); };
    steps.all_queued = [] { return Status::OK(); };
    steps.wait = [&](size_t g) -> Status {
      std::this_thread::sleep_for(std::chrono::milliseconds(2));
      if (g == fail_at) return Status::IOError("group " + std::to_string(g) + " failed");
      if (g == groups - 1) {
        const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(20);
        while (checksummed.load() == 0 && std::chrono::steady_clock::now() < deadline)
          std::this_thread::sleep_for(std::chrono::milliseconds(1));
        overlapped = checksummed.load() > 0;
      }
      landed[g] = true;
      return Status::OK();
    };
    steps.checksum = [&](size_t k) {
      EXPECT_TRUE(landed[group_of[k]].load()) << "chunk " << k << " before its group";
      ++done[k];
      ++checksummed;
    };
    Status st = ChecksumAsTheyLand(pool, group_of, group_bytes, 0, steps);
    for (size_t k = 0; k < group_of.size(); ++k) {
      if (fail_at == groups || group_of[k] >= fail_at)
        EXPECT_EQ(done[k].load(), fail_at == groups ? 1 : 0) << "chunk " << k;
      else
        EXPECT_LE(done[k].load(), 1) << "chunk " << k;
    }
    if (fail_at == groups) {
      EXPECT_TRUE(st.ok()) << st.ToString();
      EXPECT_TRUE(overlapped) << "no checksum ran while a copy was in flight";
    } else {
      EXPECT_EQ(st.code(), StatusCode::kIOError);
      EXPECT_NE(st.message().find("group 3"), std::string::npos) << st.ToString();
    }
  }
}

// The windows: groups are queued in order, each once, never more than window_bytes queued
// and not landed (a group larger than the window goes alone), and a window is queued only
// once every group of the last one has landed (the device's copy queue must run empty for a
// transfer of the training to get its turn); every group is queued before it is waited
// for; all_queued runs once, right after the last group is queued, while groups are
// still in flight (the fence gets the end mark before the last bytes land); with window 0
// everything is queued before the first wait. A failed enqueue stops the landing with its
// error: nothing after it is queued and all_queued never runs. Without groups all_queued
// runs at once.
TEST(ChecksumAsTheyLand, QueuesAWindowOnlyWhenTheLastHasLandedAndSaysWhenAllAreQueued) {
  Pool pool("test", 2);
  const std::vector<size_t> group_bytes = {16, 16, 16, 40, 16, 8, 8, 16, 16, 16};
  std::vector<uint32_t> group_of;
  for (uint32_t g = 0; g < group_bytes.size(); ++g) group_of.insert(group_of.end(), 2, g);
  for (const size_t window : {size_t{0}, size_t{16}, size_t{32}, size_t{48}, size_t{1000}}) {
    for (const size_t fail_enqueue : {group_bytes.size(), size_t{6}}) {
      SCOPED_TRACE("window " + std::to_string(window) + ", failing enqueue " +
                   std::to_string(fail_enqueue));
      std::vector<size_t> order;  // groups in the order queued
      bool waited_since_enqueue = false;
      size_t in_flight = 0, max_in_flight = 0, waited = 0, all_queued = 0;
      size_t queued_before_first_wait = 0, landed_at_all_queued = 0;
      std::atomic<int> checksums{0};
      LandingSteps steps;
      steps.enqueue = [&](size_t g) -> Status {
        if (g == fail_enqueue) return Status::IOError("enqueue " + std::to_string(g));
        EXPECT_EQ(g, order.size());
        // A window starts only on an empty queue; within one, groups follow each other.
        if (waited_since_enqueue) {
          EXPECT_EQ(in_flight, 0u) << "group " << g << " queued while others were in flight";
        }
        waited_since_enqueue = false;
        order.push_back(g);
        in_flight += group_bytes[g];
        // More than the window only when this group is the only one in flight.
        if (window != 0 && in_flight > window) {
          EXPECT_EQ(in_flight, group_bytes[g]) << g;
        }
        max_in_flight = std::max(max_in_flight, in_flight);
        return Status::OK();
      };
      steps.all_queued = [&] {
        ++all_queued;
        EXPECT_EQ(order.size(), group_bytes.size());
        landed_at_all_queued = waited;
        return Status::OK();
      };
      steps.wait = [&](size_t g) -> Status {
        if (waited == 0) queued_before_first_wait = order.size();
        EXPECT_EQ(g, waited);
        EXPECT_LT(g, order.size()) << "waited for a group never queued";
        in_flight -= group_bytes[g];
        waited_since_enqueue = true;
        ++waited;
        return Status::OK();
      };
      steps.checksum = [&](size_t) { ++checksums; };
      const Status st = ChecksumAsTheyLand(pool, group_of, group_bytes, window, steps);
      if (fail_enqueue < group_bytes.size()) {
        EXPECT_EQ(st.code(), StatusCode::kIOError) << st.ToString();
        EXPECT_NE(st.message().find("enqueue 6"), std::string::npos) << st.ToString();
        EXPECT_EQ(order.size(), fail_enqueue);
        EXPECT_EQ(all_queued, 0u);
        EXPECT_LE(waited, fail_enqueue);
        continue;
      }
      ASSERT_TRUE(st.ok()) << st.ToString();
      EXPECT_EQ(order.size(), group_bytes.size());
      EXPECT_EQ(waited, group_bytes.size());
      EXPECT_EQ(checksums.load(), static_cast<int>(group_of.size()));
      EXPECT_EQ(all_queued, 1u);
      if (window == 0 || window >= 1000) {
        EXPECT_EQ(queued_before_first_wait, group_bytes.size());
        EXPECT_EQ(landed_at_all_queued, 0u);
      } else {
        EXPECT_LE(max_in_flight, std::max<size_t>(window, 40));
        EXPECT_LT(queued_before_first_wait, group_bytes.size());
        EXPECT_GT(landed_at_all_queued, 0u);
        // The last group is queued as soon as the window has room for it, not at the end.
        EXPECT_LT(landed_at_all_queued, group_bytes.size());
      }
    }
  }
  // Nothing to land.
  size_t all_queued = 0;
  LandingSteps none;
  none.enqueue = [](size_t) -> Status { return Status::Internal("nothing to queue"); };
  none.all_queued = [&] {
    ++all_queued;
    return Status::OK();
  };
  none.wait = [](size_t) -> Status { return Status::Internal("nothing to wait for"); };
  none.checksum = [](size_t) { FAIL(); };
  EXPECT_TRUE(ChecksumAsTheyLand(pool, {}, {}, 16, none).ok());
  EXPECT_EQ(all_queued, 1u);
}

// Records the chunks of every capture, copying with the host engine.
class RecordingEngine final : public CopyEngine {
 public:
  std::string_view name() const override { return "recording"; }
  Status Copy(std::span<const CopyChunk> chunks, uint64_t* checksums) override {
    captured.assign(chunks.begin(), chunks.end());
    return host_->Copy(chunks, checksums);
  }
  bool checksums_while_copying() const override { return true; }
  void ChecksumHost(std::span<const HostRange> ranges, uint64_t* out) override {
    host_->ChecksumHost(ranges, out);
  }
  std::vector<CopyChunk> captured;

 private:
  std::unique_ptr<CopyEngine> host_ = MakeHostCopyEngine(1);
};

// The pipeline lays a version out with tensors back to back: only the chunks of one tensor
// may be copied as one (a device copy over two allocations fails with cudaErrorInvalidValue,
// seen on an H200 when two adjacent test tensors were merged).
TEST(CapturePipeline, OnlyTheChunksOfOneTensorAreMarkedAsContinuingEachOther) {
  testing::TempDir root("continues");
  HostTierConfig tc;
  tc.dir = root.path() + "/tier";
  Logger log("test", LogLevel::kWarning);
  auto tier = HostTier::Open(tc, DefaultFileSystem(), &log);
  ASSERT_TRUE(tier.ok()) << tier.status().ToString();
  RecordingEngine engine;
  CaptureConfig cc;
  cc.chunk_bytes = 4096;
  CapturePipeline pipeline(cc, &engine, tier->get(), &log, {});
  // One buffer holding three tensors back to back: 3 chunks, 1 chunk, 2 chunks (the last
  // one short), so every tensor's first byte follows on from the previous one's last.
  std::vector<float> all(3072 + 1024 + 1500);
  std::vector<ShardSpec> shards;
  int64_t at = 0;
  for (int64_t n : {3072, 1024, 1500}) {
    shards.push_back(
        ShardSpec::Whole({"t" + std::to_string(at), DType::kF32, {n}}, all.data() + at));
    at += n;
  }
  ASSERT_TRUE(pipeline.Save(1, shards, {}, nullptr).ok());
  ASSERT_TRUE(pipeline.WaitCaptured().ok());
  std::vector<bool> continues;
  for (const CopyChunk& c : engine.captured) continues.push_back(c.continues);
  EXPECT_EQ(continues, (std::vector<bool>{false, true, true, false, false, true}));
  // Grouped with no size limit, the chunks make one copy per tensor.
  std::vector<size_t> order(engine.captured.size());
  for (size_t i = 0; i < order.size(); ++i) order[i] = i;
  std::vector<uint32_t> group_of;
  EXPECT_EQ(GroupCopies(engine.captured, order, SIZE_MAX, &group_of).size(), 3u);
  pipeline.Stop();
}

}  // namespace
}  // namespace cairn
