// The GPU suite (ctest label "gpu"; every test skips without a usable CUDA device).
//
// (1) Ordering: a version holds exactly what the training stream had written when save()
//     was called, although the kernel writing it is still running when save() returns;
//     a kernel queued after fence() never leaks into it; an unordered copy of the same
//     moment captures stale bytes (the race the ordering prevents).
// (2) Bit-exact round trips into device memory: from the own host tier (same layout and
//     resharded), from the PFS into another layout, from a partner's replica over UCX
//     (real processes), and a restore ordered after a kernel still writing the target.
#include <gtest/gtest.h>
#include <signal.h>

#include <chrono>
#include <cstring>
#include <random>
#include <thread>
#include <vector>

#include "cairn/checkpointer.h"
#include "snapshot/copy_engine.h"
#include "tests/recovery_process_util.h"
#include "tests/test_util.h"

#ifdef CAIRN_GPU_TESTS
#include <cuda_runtime_api.h>

#include "tests/gpu_kernels.h"
#endif

namespace cairn {
namespace {

using testing::TempDir;

#ifndef CAIRN_GPU_TESTS
#define CAIRN_REQUIRE_GPU() \
  GTEST_SKIP() << "built without CUDA (or without nvcc for the test kernels)"
#else
#define CAIRN_REQUIRE_GPU() \
  if (!CudaDeviceAvailable()) GTEST_SKIP() << "no usable CUDA device"

#define CUDA_OK(call) ASSERT_EQ((call), cudaSuccess) << #call

// Device memory for a test, freed at the end.
struct DeviceBuffer {
  explicit DeviceBuffer(size_t n) : bytes(n) {
    EXPECT_EQ(cudaMalloc(&p, std::max<size_t>(n, 1)), cudaSuccess);
  }
  ~DeviceBuffer() { cudaFree(p); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  uint32_t* u32() const { return static_cast<uint32_t*>(p); }
  void* p = nullptr;
  size_t bytes;
};

struct Stream {
  Stream() { EXPECT_EQ(cudaStreamCreateWithFlags(&s, cudaStreamNonBlocking), cudaSuccess); }
  ~Stream() {
    cudaStreamSynchronize(s);
    cudaStreamDestroy(s);
  }
  cudaStream_t s = nullptr;
};

Options GpuOptions(const TempDir& root, const std::string& tag) {
  Options o = testing::TestOptions(root, tag);
  o.copy_engine = CopyEngineKind::kCuda;
  o.full_policy = FullPolicy::kBlock;  // every version is captured: each one is checked
  o.persist_every = 0;
  return o;
}

// Whether work is still running on `s` (clears the cudaErrorNotReady a query records as
// the thread's last error, which a later launch check would otherwise report).
bool StillRunning(cudaStream_t s) {
  const cudaError_t e = cudaStreamQuery(s);
  (void)cudaGetLastError();
  return e == cudaErrorNotReady;
}

// Whether every host slot mapping of `c` so far was pinned for device copies. A slot the
// driver refuses to pin is still copied into, through its staging, but such a copy blocks
// the capture thread: the ordering and speed the suite checks would then fail for a reason
// they could not name. Prints the counts (ctest -V keeps them).
::testing::AssertionResult SlotsPinned(const Checkpointer& c) {
  const CaptureStats s = c.stats().capture;
  std::printf("host slot mappings pinned %llu, refused %llu (copy engine %s)\n",
              static_cast<unsigned long long>(s.slots_pinned),
              static_cast<unsigned long long>(s.slots_not_pinned), s.copy_engine.c_str());
  if (s.slots_pinned > 0 && s.slots_not_pinned == 0) return ::testing::AssertionSuccess();
  return ::testing::AssertionFailure()
         << s.slots_not_pinned << " host slot mapping(s) could not be pinned (" << s.slots_pinned
         << " were): cudaHostRegister refused the host root's memory "
         << "(see the warning in the log; CAIRN_HOST_ROOT on a tmpfs such as /dev/shm)";
}

// How many of the n words at host `p` differ from `value`.
size_t CountOther(const std::vector<uint32_t>& v, uint32_t value) {
  size_t bad = 0;
  for (uint32_t x : v) bad += x != value;
  return bad;
}
#endif

TEST(GpuCapture, VersionHoldsWhatTheStreamHadWrittenAtSaveAndNothingQueuedAfterFence) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  TempDir root("gpuorder");
  Options o = GpuOptions(root, "gpuorder");
  o.chunk_bytes = 1 << 20;
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Stream train;
  // Sizes from a part of one chunk to many chunks, odd tails; the writing kernel waits
  // from 0 to 30 ms before it writes, so it is still running when save() returns.
  const std::vector<size_t> words = {(1 << 18) + 3, (5 << 20) / 4 + 17, (48 << 20) / 4 + 5};
  const std::vector<int64_t> spins = {0, 200'000, 2'000'000, 30'000'000};
  std::mt19937 rng(20261123);
  DeviceBuffer dev(words.back() * 4);
  int trials = 0, running_at_save = 0, running_after_fence = 0;
  int64_t step = 0;
  for (int round = 0; round < 4; ++round) {
    for (size_t n : words) {
      for (int64_t spin : spins) {
        const uint32_t value = static_cast<uint32_t>(rng()) | 1u;
        ++step;
        TensorMeta meta{"w", DType::kI32, {static_cast<int64_t>(n)}};
        std::vector<ShardSpec> s = {ShardSpec::Whole(meta, dev.p, MemoryKind::kDevice)};
        // The training stream's last write before save(): every element becomes `value`.
        ASSERT_EQ(testing::LaunchSlowFill(dev.u32(), n, value, spin, train.s), 0);
        auto out = (*c)->save(step, s, {}, train.s);
        ASSERT_TRUE(out.ok()) << out.status().ToString();
        ASSERT_EQ(*out, SaveOutcome::kQueued);
        running_at_save += StillRunning(train.s);
        ASSERT_TRUE((*c)->fence().ok());
        running_after_fence += StillRunning(train.s);
        // Queued after the fence (the optimizer step): must never reach the version.
        ASSERT_EQ(testing::LaunchSlowFill(dev.u32(), n, value + 1, 0, train.s), 0);
        ASSERT_TRUE((*c)->wait_captured().ok());
        std::vector<uint32_t> got(n, 0);
        std::vector<ShardSpec> t = {ShardSpec::Whole(meta, got.data())};
        RestoreOptions ro;
        ro.step = step;
        auto r = (*c)->restore(t, ro);
        ASSERT_TRUE(r.ok()) << r.status().ToString();
        ASSERT_EQ(CountOther(got, value), 0u)
            << "step " << step << ": " << n << " words, spin " << spin << " ns";
        if (trials == 0) {
          ASSERT_TRUE(SlotsPinned(**c));
        }
        ++trials;
        CUDA_OK(cudaStreamSynchronize(train.s));
      }
    }
  }
  // The test means something only if the writer was still running when save() and
  // fence() returned (neither waited for the GPU on the host).
  EXPECT_GT(running_at_save, trials / 4);
  EXPECT_GT(running_after_fence, trials / 4);
  std::printf("trials %d, writer still running at save %d, after fence %d\n", trials,
              running_at_save, running_after_fence);
#endif
}

TEST(GpuCapture, AnUnorderedCopyCapturesStaleBytesWhereTheOrderedOneDoesNot) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  auto e = MakeCudaCopyEngine(2);
  ASSERT_TRUE(e.ok()) << e.status().ToString();
  CopyEngine& engine = **e;
  const size_t n = (16 << 20) / 4;
  DeviceBuffer dev(n * 4);
  std::vector<uint32_t> host(n + 1024);  // registered as a slot would be
  ASSERT_TRUE(engine.RegisterHost(host.data(), host.size() * 4).ok());
  int device = 0;
  CUDA_OK(cudaGetDevice(&device));
  Stream train;
  std::vector<CopyChunk> chunks;
  const size_t chunk = (1 << 20) / 4;
  for (size_t off = 0; off < n; off += chunk)
    chunks.push_back({dev.u32() + off, host.data() + off, std::min(chunk, n - off) * 4, true});
  std::vector<uint64_t> sums(chunks.size());
  int stale_unordered = 0, stale_ordered = 0;
  for (int trial = 0; trial < 5; ++trial) {
    for (bool ordered : {false, true}) {
      CUDA_OK(cudaMemset(dev.p, 0, n * 4));
      CUDA_OK(cudaDeviceSynchronize());
      const uint32_t value = 0x1000u + static_cast<uint32_t>(trial);
      ASSERT_EQ(testing::LaunchSlowFill(dev.u32(), n, value, 20'000'000, train.s), 0);
      std::shared_ptr<StreamMark> after;
      if (ordered) {
        auto m = engine.MarkStream(device, train.s);
        ASSERT_TRUE(m.ok()) << m.status().ToString();
        after = *m;
      }
      ASSERT_TRUE(engine.Capture(after.get(), device, chunks, sums.data(), [](auto) {}).ok());
      const size_t bad = CountOther(std::vector<uint32_t>(host.begin(), host.begin() + n), value);
      (ordered ? stale_ordered : stale_unordered) += bad > 0;
      CUDA_OK(cudaStreamSynchronize(train.s));
    }
  }
  engine.UnregisterHost(host.data(), host.size() * 4);
  EXPECT_EQ(stale_ordered, 0);
  // Without the producer's mark the copy races the kernel: the check above catches it.
  EXPECT_GT(stale_unordered, 0);
#endif
}

TEST(GpuCapture, FenceHostReturnsOnlyOnceEveryByteIsInHostMemory) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  TempDir root("gpufh");
  auto c = Checkpointer::Open(GpuOptions(root, "gpufh"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  Stream train;
  const size_t n = (32 << 20) / 4;
  DeviceBuffer dev(n * 4);
  TensorMeta meta{"w", DType::kI32, {static_cast<int64_t>(n)}};
  std::vector<ShardSpec> s = {ShardSpec::Whole(meta, dev.p, MemoryKind::kDevice)};
  for (int64_t step = 1; step <= 3; ++step) {
    ASSERT_EQ(testing::LaunchSlowFill(dev.u32(), n, 7, 10'000'000, train.s), 0);
    ASSERT_TRUE((*c)->save(step, s, {}, train.s).ok());
    ASSERT_TRUE((*c)->fence_host().ok());
    EXPECT_EQ((*c)->copies_done(), static_cast<uint64_t>(step));
    EXPECT_FALSE(StillRunning(train.s)) << "the copy ran before the writer ended";
  }
  EXPECT_TRUE(SlotsPinned(**c));
#endif
}

TEST(GpuSave, AHostPointerGivenAsDeviceMemoryIsAnErrorNamingTheTensor) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  TempDir root("gpubad");
  auto c = Checkpointer::Open(GpuOptions(root, "gpubad"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  std::vector<uint8_t> host(4096);
  TensorMeta meta{"layers.0.mlp.weight", DType::kU8, {4096}};
  std::vector<ShardSpec> s = {ShardSpec::Whole(meta, host.data(), MemoryKind::kDevice)};
  auto out = (*c)->save(1, s);
  ASSERT_FALSE(out.ok());
  EXPECT_EQ(out.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(out.status().message().find("layers.0.mlp.weight"), std::string::npos)
      << out.status().ToString();
  EXPECT_TRUE((*c)->versions().empty());
#endif
}

TEST(GpuRoundTrip, DeviceToHostTierToDeviceSameLayoutAndResharded) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  TempDir root("gpurt");
  Options o = GpuOptions(root, "gpurt");
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  // A bf16 matrix of 1000 x 777 (odd row bytes), an f32 vector over several chunks, a byte
  // tensor of odd length; plus a host tensor in the same version.
  const TensorMeta m{"layers.1.attn.qkv.weight", DType::kBF16, {1000, 777}};
  const TensorMeta v{"layers.1.norm.exp_avg", DType::kF32, {(9 << 20) / 4 + 3}};
  const TensorMeta b{"layers.1.bytes", DType::kU8, {12345}};
  const TensorMeta h{"host.counter", DType::kI64, {3}};
  const size_t mb = 1000 * 777 * 2, vb = ((9 << 20) / 4 + 3) * 4, bb = 12345;
  std::vector<uint8_t> hm(mb), hv(vb), hb(bb);
  std::vector<int64_t> hh = {1, 2, 3};
  testing::FillPattern(hm.data(), mb, 1);
  testing::FillPattern(hv.data(), vb, 2);
  testing::FillPattern(hb.data(), bb, 3);
  DeviceBuffer dm(mb), dv(vb), db(bb);
  CUDA_OK(cudaMemcpy(dm.p, hm.data(), mb, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(dv.p, hv.data(), vb, cudaMemcpyHostToDevice));
  CUDA_OK(cudaMemcpy(db.p, hb.data(), bb, cudaMemcpyHostToDevice));
  std::vector<ShardSpec> s = {ShardSpec::Whole(m, dm.p, MemoryKind::kDevice),
                              ShardSpec::Whole(v, dv.p, MemoryKind::kDevice),
                              ShardSpec::Whole(b, db.p, MemoryKind::kDevice),
                              ShardSpec::Whole(h, hh.data())};
  ASSERT_TRUE((*c)->save(1, s, {{"rng", "r1"}}).ok());
  ASSERT_TRUE((*c)->fence().ok());
  ASSERT_TRUE((*c)->wait_captured().ok());
  EXPECT_TRUE(SlotsPinned(**c));

  // Same layout, into fresh device memory.
  DeviceBuffer tm(mb), tv(vb), tb(bb);
  std::vector<int64_t> th(3, 0);
  std::vector<ShardSpec> t = {ShardSpec::Whole(m, tm.p, MemoryKind::kDevice),
                              ShardSpec::Whole(v, tv.p, MemoryKind::kDevice),
                              ShardSpec::Whole(b, tb.p, MemoryKind::kDevice),
                              ShardSpec::Whole(h, th.data())};
  auto r = (*c)->restore(t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->blobs["rng"], "r1");
  std::vector<uint8_t> back(std::max(mb, vb));
  CUDA_OK(cudaMemcpy(back.data(), tm.p, mb, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), hm.data(), mb), 0);
  CUDA_OK(cudaMemcpy(back.data(), tv.p, vb, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), hv.data(), vb), 0);
  CUDA_OK(cudaMemcpy(back.data(), tb.p, bb, cudaMemcpyDeviceToHost));
  EXPECT_EQ(std::memcmp(back.data(), hb.data(), bb), 0);
  EXPECT_EQ(th, hh);

  // Resharded: the matrix split along its columns (a strided copy per row) into two device
  // pieces; the vector as a flat range from its middle.
  DeviceBuffer left(1000 * 300 * 2), right(1000 * 477 * 2);
  ShardSpec l{m, Box{{0, 0}, {1000, 300}}, left.p, MemoryKind::kDevice};
  ShardSpec rr{m, Box{{0, 300}, {1000, 477}}, right.p, MemoryKind::kDevice};
  DeviceBuffer part(1000 * 4);
  auto flat = ShardSpec::FromFlatRange(v, 500000, 501000, part.p, MemoryKind::kDevice);
  ASSERT_TRUE(flat.ok());
  std::vector<ShardSpec> t2 = {l, rr};
  for (auto& f : *flat) t2.push_back(f);
  RestoreOptions ro;
  ro.partial = true;
  auto r2 = (*c)->restore(t2, ro);
  ASSERT_TRUE(r2.ok()) << r2.status().ToString();
  EXPECT_TRUE(r2->resharded);
  std::vector<uint8_t> lh(1000 * 300 * 2), rh(1000 * 477 * 2), ph(4000);
  CUDA_OK(cudaMemcpy(lh.data(), left.p, lh.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(rh.data(), right.p, rh.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(ph.data(), part.p, ph.size(), cudaMemcpyDeviceToHost));
  for (int row = 0; row < 1000; ++row) {
    ASSERT_EQ(std::memcmp(lh.data() + row * 600, hm.data() + row * 1554, 600), 0) << row;
    ASSERT_EQ(std::memcmp(rh.data() + row * 954, hm.data() + row * 1554 + 600, 954), 0) << row;
  }
  EXPECT_EQ(std::memcmp(ph.data(), hv.data() + 500000 * 4, 4000), 0);
#endif
}

TEST(GpuRoundTrip, RestoreIsOrderedAfterTheStreamStillWritingTheTarget) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  TempDir root("gpurs");
  auto c = Checkpointer::Open(GpuOptions(root, "gpurs"));
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  const size_t n = (8 << 20) / 4;
  DeviceBuffer dev(n * 4);
  Stream train;
  TensorMeta meta{"w", DType::kI32, {static_cast<int64_t>(n)}};
  std::vector<ShardSpec> s = {ShardSpec::Whole(meta, dev.p, MemoryKind::kDevice)};
  ASSERT_EQ(testing::LaunchSlowFill(dev.u32(), n, 42, 0, train.s), 0);
  ASSERT_TRUE((*c)->save(1, s, {}, train.s).ok());
  ASSERT_TRUE((*c)->fence_host().ok());
  ASSERT_TRUE((*c)->wait_captured().ok());
  // A kernel still overwriting the target when restore() is called (a zero-initialisation
  // queued just before): the restored values must win.
  ASSERT_EQ(testing::LaunchSlowFill(dev.u32(), n, 0, 20'000'000, train.s), 0);
  RestoreOptions ro;
  ro.stream = train.s;
  auto r = (*c)->restore(s, ro);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  unsigned long long* bad = nullptr;
  CUDA_OK(cudaMalloc(reinterpret_cast<void**>(&bad), sizeof(*bad)));
  CUDA_OK(cudaMemset(bad, 0, sizeof(*bad)));
  ASSERT_EQ(testing::LaunchCountOther(dev.u32(), n, 42, bad, train.s), 0);
  unsigned long long host_bad = 1;
  CUDA_OK(cudaMemcpyAsync(&host_bad, bad, sizeof(host_bad), cudaMemcpyDeviceToHost, train.s));
  CUDA_OK(cudaStreamSynchronize(train.s));
  cudaFree(bad);
  EXPECT_EQ(host_bad, 0u);
#endif
}

TEST(GpuRoundTrip, FromThePfsIntoDeviceMemoryInAnotherLayout) {
  CAIRN_REQUIRE_GPU();
#ifdef CAIRN_GPU_TESTS
  TempDir root("gpupfs");
  Options o = GpuOptions(root, "gpupfs");
  const TensorMeta m{"embed.weight", DType::kBF16, {4096, 1024}};
  const size_t mb = 4096 * 1024 * 2;
  std::vector<uint8_t> hm(mb);
  testing::FillPattern(hm.data(), mb, 11);
  {
    DeviceBuffer dm(mb);
    CUDA_OK(cudaMemcpy(dm.p, hm.data(), mb, cudaMemcpyHostToDevice));
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    ASSERT_TRUE((*c)->save(5, {{ShardSpec::Whole(m, dm.p, MemoryKind::kDevice)}}).ok());
    ASSERT_TRUE((*c)->fence().ok());
    auto f = (*c)->flush();
    ASSERT_TRUE(f.ok()) << f.status().ToString();
    ASSERT_EQ(*f, 5);
  }
  // The host tier is gone (another host root): only the PFS has step 5.
  TempDir other("gpupfs2");
  o.host_root = other.path();
  auto c = Checkpointer::Open(o);
  ASSERT_TRUE(c.ok()) << c.status().ToString();
  DeviceBuffer a(4096 * 100 * 2), b(4096 * 924 * 2);
  std::vector<ShardSpec> t = {{m, Box{{0, 0}, {4096, 100}}, a.p, MemoryKind::kDevice},
                              {m, Box{{0, 100}, {4096, 924}}, b.p, MemoryKind::kDevice}};
  auto r = (*c)->restore(t);
  ASSERT_TRUE(r.ok()) << r.status().ToString();
  EXPECT_EQ(r->step, 5);
  EXPECT_EQ(r->tier, "pfs");
  EXPECT_TRUE(r->resharded);
  std::vector<uint8_t> ah(4096 * 200), bh(4096 * 1848);
  CUDA_OK(cudaMemcpy(ah.data(), a.p, ah.size(), cudaMemcpyDeviceToHost));
  CUDA_OK(cudaMemcpy(bh.data(), b.p, bh.size(), cudaMemcpyDeviceToHost));
  for (int row = 0; row < 4096; ++row) {
    ASSERT_EQ(std::memcmp(ah.data() + row * 200, hm.data() + row * 2048, 200), 0) << row;
    ASSERT_EQ(std::memcmp(bh.data() + row * 1848, hm.data() + row * 2048 + 200, 1848), 0) << row;
  }
#endif
}

// Real processes sharing the GPU: recovery_child with CAIRN_TEST_DEVICE=1.
const std::vector<std::pair<std::string, std::string>> kOnDevice = {
    {"CAIRN_TEST_DEVICE", "1"}, {"CAIRN_COPY_ENGINE", "cuda"}, {"CAIRN_PERSIST_EVERY", "0"}};

// The directory the training ranks log into.
std::string TrainDir(const TempDir& root) {
  const std::string train = root.path() + "/train";
  EXPECT_TRUE(DefaultFileSystem()->MakeDirs(train, 0700).ok());
  return train;
}

TEST(GpuProcesses, ALostNodeComesBackIntoDeviceMemoryFromItsPartnersReplica) {
  CAIRN_REQUIRE_GPU();
  using namespace testing::recovery;
  TempDir root("gpunode");
  const std::string job = testing::UniqueJobId("gpunode");
  const std::string train = TrainDir(root);
  auto l = LocalLauncher::Start(
      Spec(root, job, 2, 1, {"matrix", "dp", kRows, "1000000", "3"}, train, kOnDevice));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  const auto deadline = std::chrono::steady_clock::now() + std::chrono::seconds(180);
  int64_t complete = -1;
  while ((complete = NewestCompleteOnEveryRankOf(train, 2)) < 9) {
    ASSERT_LT(std::chrono::steady_clock::now(), deadline) << Logs(train, 2);
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
  }
  for (int r : {1, 0}) ASSERT_TRUE((*l)->Signal(r, SIGKILL).ok());
  for (int r : {1, 0}) (*l)->WaitRank(r);
  l->reset();
  complete = NewestCompleteOnEveryRankOf(train, 2);
  ASSERT_TRUE(DefaultFileSystem()->RemoveAll(root.path() + "/host/" + job + "/node-1").ok());
  auto got = RunRestore(root, job, 2, 1, "dp", complete, "restart", kOnDevice);
  ASSERT_EQ(got.size(), 2u);
  EXPECT_EQ(got[0].step, got[1].step);
  EXPECT_GE(got[1].step, complete);
  EXPECT_EQ(got[0].tier, "host");
  EXPECT_EQ(got[1].tier, "peer");
  EXPECT_EQ(got[1].pfs, 0u);
}

TEST(GpuProcesses, ThePfsReshardsIntoDeviceMemoryOnAnotherWorldSize) {
  CAIRN_REQUIRE_GPU();
  using namespace testing::recovery;
  TempDir root("gpupfsp");
  const std::string job = testing::UniqueJobId("gpupfsp");
  const std::string train = TrainDir(root);
  auto l = LocalLauncher::Start(
      Spec(root, job, 2, 2, {"train", "tp2", kRows, "1", "4"}, train, kOnDevice));
  ASSERT_TRUE(l.ok()) << l.status().ToString();
  ASSERT_TRUE((*l)->WaitAll(240)) << Logs(train, 4);
  l->reset();
  ASSERT_TRUE(DefaultFileSystem()->RemoveAll(root.path() + "/host").ok());
  auto got = RunRestore(root, job, 3, 1, "col2", 4, "col2", kOnDevice);
  ASSERT_EQ(got.size(), 3u);
  for (const auto& x : got) {
    EXPECT_EQ(x.step, 4);
    EXPECT_EQ(x.tier, "pfs");
    EXPECT_EQ(x.resharded, 1);
  }
}

}  // namespace
}  // namespace cairn
