// The Checkpointer end to end on one rank: bit-exact restore, the lazy-capture contract,
// corruption detection with fallback, the skip/block policy, bad input and I/O faults.
#include <gtest/gtest.h>

#include <fcntl.h>
#include <grp.h>
#include <sys/mman.h>
#include <sys/stat.h>
#include <sys/wait.h>
#include <unistd.h>

#include <atomic>
#include <condition_variable>
#include <cstring>
#include <filesystem>
#include <functional>
#include <future>
#include <mutex>

#include "api/open_with.h"
#include "cairn/checkpointer.h"
#include "cairn/pfs_step.h"
#include "cairn/prepare.h"
#include "core/host_pages.h"
#include "persist/manifest.h"
#include "testing/controlled_filesystems.h"
#include "testing/fault_injection_filesystem.h"
#include "tests/test_util.h"
#include "tiers/host_tier.h"

namespace cairn {
namespace {

using testing::CheckPattern;
using testing::FillPattern;

// A small model: tensors of several dtypes and ranks, one held as a flat range.
struct State {
  std::vector<uint16_t> bf16 = std::vector<uint16_t>(64 * 48);
  std::vector<float> f32 = std::vector<float>(3 * 5 * 7 * 11);
  std::vector<int64_t> scalar = std::vector<int64_t>(1);
  std::vector<uint8_t> fp8 = std::vector<uint8_t>(1000);
  std::vector<double> flat = std::vector<double>(37);  // elements [13, 50) of a {5, 2, 6} tensor
  std::vector<uint8_t> big = std::vector<uint8_t>(9 << 20);  // several 4 MiB chunks

  void Fill(uint64_t seed) {
    FillPattern(bf16.data(), bf16.size() * 2, seed + 1);
    FillPattern(f32.data(), f32.size() * 4, seed + 2);
    FillPattern(scalar.data(), 8, seed + 3);
    FillPattern(fp8.data(), fp8.size(), seed + 4);
    FillPattern(flat.data(), flat.size() * 8, seed + 5);
    FillPattern(big.data(), big.size(), seed + 6);
  }
  bool Holds(uint64_t seed) const {
    return CheckPattern(bf16.data(), bf16.size() * 2, seed + 1) &&
           CheckPattern(f32.data(), f32.size() * 4, seed + 2) &&
           CheckPattern(scalar.data(), 8, seed + 3) &&
           CheckPattern(fp8.data(), fp8.size(), seed + 4) &&
           CheckPattern(flat.data(), flat.size() * 8, seed + 5) &&
           CheckPattern(big.data(), big.size(), seed + 6);
  }
  std::vector<ShardSpec> Shards() {
    std::vector<ShardSpec> s;
    // Rows 16..64 of a 128 x 48 bf16 matrix (a tensor-parallel piece).
    ShardSpec a;
    a.meta = {"layers.0.attn.qkv.weight", DType::kBF16, {128, 48}};
    a.box = Box{{64, 0}, {64, 48}};
    a.data = bf16.data();
    s.push_back(a);
    s.push_back(ShardSpec::Whole({"layers.0.mlp.bias", DType::kF32, {3, 5, 7, 11}}, f32.data()));
    s.push_back(ShardSpec::Whole({"step", DType::kI64, {}}, scalar.data()));
    s.push_back(ShardSpec::Whole({"emb.fp8", DType::kF8E4M3, {10, 100}}, fp8.data()));
    auto f =
        ShardSpec::FromFlatRange({"optimizer.flat", DType::kF64, {5, 2, 6}}, 13, 50, flat.data());
    EXPECT_TRUE(f.ok());
    for (auto& x : *f) s.push_back(x);
    s.push_back(
        ShardSpec::Whole({"big", DType::kU8, {static_cast<int64_t>(big.size())}}, big.data()));
    return s;
  }
};

class CheckpointerTest : public ::testing::Test {
 protected:
  CheckpointerTest() : root_("ckpt") { opts_ = testing::TestOptions(root_, "ckpt"); }
  std::unique_ptr<Checkpointer> Open() {
    auto c = OpenCheckpointer(opts_, fs_);
    EXPECT_TRUE(c.ok()) << c.status().ToString();
    return c.ok() ? std::move(*c) : nullptr;
  }
  testing::TempDir root_;
  Options opts_;
  FileSystems fs_;  // the host tier's filesystem, where a test replaces it
};

TEST_F(CheckpointerTest, RestoresBitExactWithBlobs) {
  State s;
  auto c = Open();
  for (int64_t step = 1; step <= 5; ++step) {
    ASSERT_TRUE(c->fence().ok());
    s.Fill(step * 100);
    auto out = c->save(step, s.Shards(), {{"rng", "state-" + std::to_string(step)}});
    ASSERT_TRUE(out.ok()) << out.status().ToString();
    ASSERT_EQ(*out, SaveOutcome::kQueued);
  }
  ASSERT_TRUE(c->wait_captured().ok());
  State r;
  auto rep = c->restore(r.Shards());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->step, 5);
  EXPECT_TRUE(r.Holds(500));
  EXPECT_EQ(rep->blobs.at("rng"), "state-5");
  // The previous version is still there too.
  State r4;
  RestoreOptions o;
  o.step = 4;
  ASSERT_TRUE(c->restore(r4.Shards(), o).ok());
  EXPECT_TRUE(r4.Holds(400));
  Stats st = c->stats();
  EXPECT_EQ(st.save.saves, 5u);
  EXPECT_EQ(st.capture.captured, 5u);
  EXPECT_EQ(st.save.skipped, 0u);
  EXPECT_GT(st.capture.bytes_copied, 5u * (9u << 20));
  EXPECT_GT(st.capture.copy_gbps, 0.0);
  EXPECT_EQ(st.capture.newest_captured_step, 5);
  // A new process (here: a new Checkpointer on the same directory) finds it.
  c.reset();
  auto c2 = Open();
  State r2;
  auto rep2 = c2->restore(r2.Shards());
  ASSERT_TRUE(rep2.ok()) << rep2.status().ToString();
  EXPECT_EQ(rep2->step, 5);
  EXPECT_TRUE(r2.Holds(500));
}

TEST_F(CheckpointerTest, MutationsAfterFenceDoNotReachTheCapturedVersion) {
  State s;
  auto c = Open();
  s.Fill(7);
  ASSERT_TRUE(c->save(1, s.Shards()).ok());
  ASSERT_TRUE(c->fence().ok());
  s.Fill(8);  // the optimizer step, right after fence() returned
  std::memset(s.big.data(), 0xee, s.big.size());
  ASSERT_TRUE(c->wait_captured().ok());
  State r;
  auto rep = c->restore(r.Shards());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_TRUE(r.Holds(7));
}

TEST_F(CheckpointerTest, EveryFenceOfHostShardsReturnsOnlyOnceTheyAreCopied) {
  // Host shards have no stream to order: fence(), fence(stream) and fence_host() all wait
  // for the copy, so the training may write them at once.
  State s;
  auto c = Open();
  for (int64_t step = 1; step <= 6; ++step) {
    s.Fill(step);
    ASSERT_EQ(*c->save(step, s.Shards(), {}, nullptr), SaveOutcome::kQueued);
    Status f = step % 3 == 0 ? c->fence() : step % 3 == 1 ? c->fence(nullptr) : c->fence_host();
    ASSERT_TRUE(f.ok()) << f.ToString();
    EXPECT_EQ(c->copies_done(), static_cast<uint64_t>(step));
    s.Fill(1000 + step);  // what the optimizer writes: never in the version
  }
  ASSERT_TRUE(c->wait_captured().ok());
  State r;
  auto rep = c->restore(r.Shards());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->step, 6);
  EXPECT_TRUE(r.Holds(6));
}

TEST_F(CheckpointerTest, CorruptByteNamesTheTensorAndLatestFallsBack) {
  State s;
  auto c = Open();
  s.Fill(1);
  ASSERT_TRUE(c->save(1, s.Shards()).ok());
  ASSERT_TRUE(c->fence().ok());
  s.Fill(2);
  ASSERT_TRUE(c->save(2, s.Shards()).ok());
  ASSERT_TRUE(c->wait_captured().ok());
  // Step 2 lives in the slot listed first; damage one byte inside the f32 tensor.
  auto v = c->versions();
  ASSERT_EQ(v.front().step, 2);
  const std::string data = c->host_dir() + "/slot-" + std::to_string(v.front().slot);
  // Shards are laid out in order, 64-byte aligned: bf16 (6144 bytes) then the f32 tensor.
  testing::CorruptByte(data, 6144 + 100);

  State r;
  RestoreOptions two;
  two.step = 2;
  auto bad = c->restore(r.Shards(), two);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  const std::string m = bad.status().message();
  EXPECT_NE(m.find("layers.0.mlp.bias"), std::string::npos) << m;
  EXPECT_NE(m.find(data), std::string::npos) << m;
  EXPECT_NE(m.find("step 2"), std::string::npos) << m;
  // Found while copying: the error says the targets may hold part of the bad version.
  EXPECT_NE(m.find("partly written"), std::string::npos) << m;

  auto latest = c->restore(r.Shards());
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(latest->step, 1);
  ASSERT_EQ(latest->skipped.size(), 1u);
  EXPECT_NE(latest->skipped[0].find("layers.0.mlp.bias"), std::string::npos);
  EXPECT_TRUE(r.Holds(1));
}

TEST_F(CheckpointerTest, BadInputGivesClearErrors) {
  State s;
  s.Fill(1);
  auto c = Open();
  auto shards = s.Shards();
  ASSERT_TRUE(c->save(5, shards).ok());
  EXPECT_EQ(c->save(5, shards).status().code(), StatusCode::kInvalidArgument);  // not increasing

  auto bad = shards;
  bad[0].box.offsets[0] = 100;  // leaves the 128-row tensor
  auto r = c->save(6, bad);
  ASSERT_FALSE(r.ok());
  EXPECT_NE(r.status().message().find("layers.0.attn.qkv.weight"), std::string::npos);
  bad = shards;
  bad[1].data = nullptr;
  EXPECT_NE(c->save(7, bad).status().message().find("null"), std::string::npos);
  bad = shards;
  bad.push_back(shards[1]);
  EXPECT_NE(c->save(8, bad).status().message().find("twice"), std::string::npos);
  bad = shards;
  bad[1].meta.name = std::string("x\0y", 3);
  EXPECT_FALSE(c->save(9, bad).ok());
  bad = shards;
  bad[2].memory = MemoryKind::kDevice;
  EXPECT_NE(c->save(10, bad).status().message().find("device"), std::string::npos);
  ASSERT_TRUE(c->wait_captured().ok());

  // Restore into something other than what was saved.
  State t;
  auto targets = t.Shards();
  targets[1].meta.dtype = DType::kI32;
  auto e = c->restore(targets);
  ASSERT_FALSE(e.ok());
  EXPECT_NE(e.status().message().find("float32"), std::string::npos) << e.status().message();
  targets = t.Shards();
  targets[1].meta.global_shape = {3, 5, 77, 1};
  targets[1].box = Box::Whole(targets[1].meta.global_shape);
  EXPECT_NE(c->restore(targets).status().message().find("shape"), std::string::npos);
  targets = t.Shards();
  targets[0].box = Box{{0, 0}, {64, 48}};
  e = c->restore(targets);
  EXPECT_EQ(e.status().code(), StatusCode::kInvalidArgument);
  EXPECT_NE(e.status().message().find("[64:128, 0:48]"), std::string::npos) << e.status().message();
  targets = t.Shards();
  targets[0].meta.name = "not.saved";
  EXPECT_EQ(c->restore(targets).status().code(), StatusCode::kNotFound);
  RestoreOptions o;
  o.step = 99;
  e = c->restore(t.Shards(), o);
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_NE(e.status().message().find("5"), std::string::npos);
  // None of this damaged what was saved.
  ASSERT_TRUE(c->restore(t.Shards()).ok());
  EXPECT_TRUE(t.Holds(1));
}

TEST_F(CheckpointerTest, RestoreWithNothingSavedIsNotFound) {
  auto c = Open();
  State r;
  auto e = c->restore(r.Shards());
  ASSERT_FALSE(e.ok());
  EXPECT_EQ(e.status().code(), StatusCode::kNotFound);
  EXPECT_NE(e.status().message().find(c->host_dir()), std::string::npos);
}

TEST_F(CheckpointerTest, SkipPolicyCountsAndNeverStalls) {
  testing::GateFileSystem gate(DefaultFileSystem());
  fs_.host = &gate;
  opts_.slots = 2;  // the smallest ring: one slot besides the newest
  auto c = Open();
  State s;
  s.Fill(1);
  ASSERT_TRUE(c->save(1, s.Shards()).ok());
  ASSERT_TRUE(c->wait_captured().ok());
  gate.Close_();  // step 2's capture now hangs before it starts copying
  ASSERT_EQ(*c->save(2, s.Shards()), SaveOutcome::kQueued);
  // Slot of step 1 holds the newest version, the other is busy: step 3 is skipped at once.
  auto out = c->save(3, s.Shards());
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, SaveOutcome::kSkipped);
  EXPECT_EQ(c->stats().save.skipped, 1u);
  gate.Open_();
  ASSERT_TRUE(c->fence().ok());
  ASSERT_TRUE(c->wait_captured().ok());
  EXPECT_EQ(c->versions().front().step, 2);
}

TEST_F(CheckpointerTest, BlockPolicyWaitsForAFreeSlot) {
  testing::GateFileSystem gate(DefaultFileSystem());
  fs_.host = &gate;
  opts_.slots = 2;  // the smallest ring: one slot besides the newest
  opts_.full_policy = FullPolicy::kBlock;
  auto c = Open();
  State s;
  s.Fill(1);
  ASSERT_TRUE(c->save(1, s.Shards()).ok());
  ASSERT_TRUE(c->wait_captured().ok());
  gate.Close_();
  ASSERT_EQ(*c->save(2, s.Shards()), SaveOutcome::kQueued);
  auto third = std::async(std::launch::async, [&] { return c->save(3, s.Shards()); });
  EXPECT_EQ(third.wait_for(std::chrono::milliseconds(200)), std::future_status::timeout);
  gate.Open_();
  ASSERT_EQ(third.wait_for(std::chrono::seconds(30)), std::future_status::ready);
  auto out = third.get();
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(*out, SaveOutcome::kQueued);
  ASSERT_TRUE(c->wait_captured().ok());
  EXPECT_EQ(c->versions().front().step, 3);
  EXPECT_EQ(c->stats().save.skipped, 0u);
}

// CAIRN_FULL_POLICY=wait waits at most CAIRN_FULL_WAIT_S for a slot, then skips; raise
// fails the save with an error naming what holds the slots. Both count the version as
// skipped, and a later save works.
TEST_F(CheckpointerTest, WaitPolicyWaitsItsBoundAndRaisePolicyFailsTheSave) {
  for (const FullPolicy policy : {FullPolicy::kWait, FullPolicy::kRaise}) {
    SCOPED_TRACE(policy == FullPolicy::kWait ? "wait" : "raise");
    testing::GateFileSystem gate(DefaultFileSystem());
    fs_.host = &gate;
    opts_.slots = 2;
    opts_.full_policy = policy;
    opts_.full_wait_s = 0.3;
    opts_.job_id = "policy" + std::to_string(static_cast<int>(policy));
    auto c = Open();
    State s;
    s.Fill(1);
    ASSERT_TRUE(c->save(1, s.Shards()).ok());
    ASSERT_TRUE(c->wait_captured().ok());
    gate.Close_();  // step 2's capture hangs: no slot for step 3
    ASSERT_EQ(*c->save(2, s.Shards()), SaveOutcome::kQueued);
    const auto t0 = std::chrono::steady_clock::now();
    auto out = c->save(3, s.Shards());
    const double waited =
        std::chrono::duration<double>(std::chrono::steady_clock::now() - t0).count();
    if (policy == FullPolicy::kWait) {
      ASSERT_TRUE(out.ok()) << out.status().ToString();
      EXPECT_EQ(*out, SaveOutcome::kSkipped);
      EXPECT_GE(waited, 0.29);
    } else {
      ASSERT_FALSE(out.ok());
      EXPECT_EQ(out.status().code(), StatusCode::kUnavailable);
      EXPECT_NE(out.status().message().find("CAIRN_FULL_POLICY=raise"), std::string::npos)
          << out.status().ToString();
      EXPECT_NE(out.status().message().find("step 3"), std::string::npos);
      EXPECT_LT(waited, 0.29);
    }
    EXPECT_EQ(c->stats().save.skipped, 1u);
    gate.Open_();
    ASSERT_TRUE(c->fence().ok());
    ASSERT_TRUE(c->wait_captured().ok());
    ASSERT_EQ(*c->save(4, s.Shards()), SaveOutcome::kQueued);
    ASSERT_TRUE(c->wait_captured().ok());
    EXPECT_EQ(c->versions().front().step, 4);
  }
}

// wait_save(n) follows the n-th queued save alone: copied, then captured, or its own
// capture error, which fence() still reports too.
TEST_F(CheckpointerTest, WaitSaveFollowsOneSaveAndReturnsItsOwnError) {
  FaultInjectionFileSystem fs(DefaultFileSystem());
  testing::GateFileSystem gate(&fs);
  fs_.host = &gate;
  auto c = Open();
  State small;
  small.big.resize(1000);
  small.Fill(1);
  ASSERT_TRUE(c->save(1, small.Shards()).ok());
  auto got = c->wait_save(1, true, 30);
  ASSERT_TRUE(got.ok() && *got);
  gate.Close_();
  small.Fill(2);
  ASSERT_EQ(*c->save(2, small.Shards()), SaveOutcome::kQueued);
  got = c->wait_save(2, true, 0.2);
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  EXPECT_FALSE(*got);  // still hanging at the gate
  gate.Open_();
  got = c->wait_save(2, false, 30);
  EXPECT_TRUE(got.ok() && *got);
  got = c->wait_save(2, true, 30);
  EXPECT_TRUE(got.ok() && *got);
  State s;  // larger: the slot must grow, and that fails
  s.Fill(3);
  fs.FailNth(1, ENOSPC, true, kFsAllocate);
  ASSERT_TRUE(c->save(3, s.Shards()).ok());
  got = c->wait_save(3, true, 30);
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kNoSpace) << got.status().ToString();
  EXPECT_NE(got.status().message().find("step 3"), std::string::npos) << got.status().ToString();
  got = c->wait_save(2, true, 0);  // an older save keeps its own outcome
  EXPECT_TRUE(got.ok() && *got);
  EXPECT_EQ(c->fence().code(), StatusCode::kNoSpace);
  fs.Disarm();
  EXPECT_EQ(c->wait_captured().code(), StatusCode::kNoSpace);
}

// A host root too small for every slot is refused with a clear error: at open when the
// slots are sized there (CAIRN_SLOT_BYTES), else by the first save() of that size, which
// then queues nothing; a root large enough works with the same settings.
TEST_F(CheckpointerTest, AHostRootTooSmallForItsSlotsIsRefusedUpFront) {
  State s;
  s.Fill(1);
  const uint64_t version = 10u << 20;  // State is a little over 9 MiB: 3 slots need ~30
  testing::ShortFileSystem small(DefaultFileSystem(), 2 * version);
  fs_.host = &small;
  opts_.slots = 3;
  {
    auto c = Open();
    auto out = c->save(1, s.Shards());
    ASSERT_FALSE(out.ok());
    const Status& st = out.status();
    EXPECT_EQ(st.code(), StatusCode::kNoSpace) << st.ToString();
    EXPECT_NE(st.message().find(opts_.host_root), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("CAIRN_SLOTS (3)"), std::string::npos) << st.ToString();
    EXPECT_NE(st.message().find("step 1"), std::string::npos) << st.ToString();
    ASSERT_TRUE(c->wait_captured().ok());
    EXPECT_TRUE(c->versions().empty());
  }
  opts_.slot_bytes = version;
  auto refused = OpenCheckpointer(opts_, fs_);
  ASSERT_FALSE(refused.ok());
  EXPECT_EQ(refused.status().code(), StatusCode::kNoSpace) << refused.status().ToString();
  EXPECT_NE(refused.status().message().find(opts_.host_root), std::string::npos);

  testing::ShortFileSystem roomy(DefaultFileSystem(), 4 * version);
  fs_.host = &roomy;
  opts_.slot_bytes = 0;
  auto c = Open();
  ASSERT_TRUE(c->save(2, s.Shards()).ok());
  ASSERT_TRUE(c->wait_captured().ok());
  EXPECT_EQ(c->versions().front().step, 2);
}

// Out of host-tier space (and other I/O errors) while a slot grows: the version fails with
// a clear error, the older one stays restorable, and the next save succeeds.
TEST_F(CheckpointerTest, FailedCaptureKeepsOlderVersion) {
  FaultInjectionFileSystem fs(DefaultFileSystem());
  fs_.host = &fs;
  auto c = Open();
  State small;
  small.big.resize(1000);
  small.Fill(1);
  ASSERT_TRUE(c->save(1, small.Shards()).ok());
  ASSERT_TRUE(c->wait_captured().ok());
  State s;  // larger: the slot must grow
  s.Fill(2);
  fs.FailNth(1, ENOSPC, true, kFsAllocate);
  ASSERT_TRUE(c->save(2, s.Shards()).ok());
  Status f = c->fence();
  ASSERT_EQ(f.code(), StatusCode::kNoSpace) << f.ToString();
  EXPECT_NE(f.message().find("step 2"), std::string::npos) << f.message();
  EXPECT_EQ(c->wait_captured().code(), StatusCode::kNoSpace);
  fs.Disarm();
  EXPECT_EQ(c->stats().capture.failed, 1u);
  State r;
  r.big.resize(1000);
  auto rep = c->restore(r.Shards());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->step, 1);
  EXPECT_TRUE(r.Holds(1));
  s.Fill(3);
  ASSERT_TRUE(c->save(3, s.Shards()).ok());
  ASSERT_TRUE(c->wait_captured().ok());
  State r3;
  ASSERT_TRUE(c->restore(r3.Shards()).ok());
  EXPECT_TRUE(r3.Holds(3));
}

TEST_F(CheckpointerTest, SlotBytesPresizesAndSmallChunksWork) {
  opts_.slot_bytes = 16 << 20;
  opts_.chunk_bytes = 64 << 10;
  opts_.copy_threads = 2;
  opts_.slots = 3;
  auto c = Open();
  State s;
  for (int64_t step = 10; step < 16; ++step) {
    ASSERT_TRUE(c->fence().ok());
    s.Fill(step);
    ASSERT_TRUE(c->save(step, s.Shards()).ok());
  }
  ASSERT_TRUE(c->wait_captured().ok());
  EXPECT_EQ(c->versions().size(), 3u);
  State r;
  ASSERT_TRUE(c->restore(r.Shards()).ok());
  EXPECT_TRUE(r.Holds(15));
}

// CAIRN_HOST_MEMORY: the ring is as long as the budget allows, and a budget too small for
// 2 slots, or one given without the version size, is refused at open, naming the setting.
TEST_F(CheckpointerTest, HostMemoryDecidesTheSlotsOrIsRefusedNamingWhatItNeeds) {
  opts_.slot_bytes = 16 << 20;
  opts_.slots = 4;
  opts_.host_memory = 40 << 20;  // 2 slots of 16 MiB fit, 3 do not
  {
    auto c = Open();
    ASSERT_NE(c, nullptr);
    State s;
    for (int64_t step = 1; step <= 5; ++step) {
      ASSERT_TRUE(c->fence().ok());
      s.Fill(step);
      ASSERT_TRUE(c->save(step, s.Shards()).ok());
    }
    ASSERT_TRUE(c->wait_captured().ok());
    EXPECT_EQ(c->versions().size(), 2u);  // not CAIRN_SLOTS' 4
    State r;
    ASSERT_TRUE(c->restore(r.Shards()).ok());
    EXPECT_TRUE(r.Holds(5));
  }
  opts_.host_memory = 20 << 20;
  auto small = OpenCheckpointer(opts_, fs_);
  ASSERT_FALSE(small.ok());
  EXPECT_NE(small.status().message().find("CAIRN_HOST_MEMORY"), std::string::npos)
      << small.status().ToString();
  EXPECT_NE(small.status().message().find("32.04 MiB that 2 slots need"), std::string::npos)
      << small.status().ToString();
  opts_.slot_bytes = 0;
  opts_.host_memory = 1ull << 30;
  auto unsized = OpenCheckpointer(opts_, fs_);
  ASSERT_FALSE(unsized.ok());
  EXPECT_NE(unsized.status().message().find("CAIRN_SLOT_BYTES"), std::string::npos)
      << unsized.status().ToString();
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

TEST_F(CheckpointerTest, HostTierLostRestoresFromThePfsPastACorruptStepNamingTheFile) {
  opts_.persist_every = 0;  // only flush() persists
  State s;
  {
    auto c = Open();
    for (int64_t step = 1; step <= 2; ++step) {
      s.Fill(step * 100);
      ASSERT_TRUE(c->save(step, s.Shards(), {{"rng", "r" + std::to_string(step)}}).ok());
      auto f = c->flush();
      ASSERT_TRUE(f.ok()) << f.status().ToString();
      ASSERT_EQ(*f, step);
    }
  }
  // The node's memory is gone; step 2's copy of "big" on the PFS has a flipped byte.
  FileSystem* fs = DefaultFileSystem();
  ASSERT_TRUE(fs->RemoveAll(JoinPath(opts_.host_root, opts_.job_id)).ok());
  const std::string job_dir = PfsJobDir(opts_.pfs_root, opts_.job_id);
  const std::string step2 = JoinPath(job_dir, StepDirName(2));
  auto m = ReadManifest(fs, step2);
  ASSERT_TRUE(m.ok()) << m.status().ToString();
  std::string data_file;
  for (const auto& b : m->boxes())
    if (m->tensors(static_cast<int>(b.tensor())).name() == "big") {
      data_file = JoinPath(step2, m->files(static_cast<int>(b.file())));
      testing::CorruptByte(data_file, b.offset() + 12345);
      break;
    }
  ASSERT_FALSE(data_file.empty());

  auto c = Open();
  State r;
  RestoreOptions two;
  two.step = 2;
  auto bad = c->restore(r.Shards(), two);
  ASSERT_FALSE(bad.ok());
  EXPECT_EQ(bad.status().code(), StatusCode::kCorruption);
  const std::string msg = bad.status().message();
  EXPECT_NE(msg.find(data_file), std::string::npos) << msg;
  EXPECT_NE(msg.find("'big'"), std::string::npos) << msg;
  EXPECT_NE(msg.find("step 2"), std::string::npos) << msg;
  EXPECT_NE(msg.find("rank 0"), std::string::npos) << msg;

  auto rep = c->restore(r.Shards());
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->step, 1);
  EXPECT_EQ(rep->tier, "pfs");
  ASSERT_EQ(rep->skipped.size(), 1u);
  EXPECT_NE(rep->skipped[0].find(data_file), std::string::npos);
  EXPECT_TRUE(r.Holds(100));
  EXPECT_EQ(rep->blobs.at("rng"), "r1");

  // An unreadable data file: the error names it.
  const std::string step1 = JoinPath(job_dir, StepDirName(1));
  ASSERT_TRUE(fs->Unlink(JoinPath(step1, DataFileName(0))).ok());
  RestoreOptions one;
  one.step = 1;
  auto gone = c->restore(r.Shards(), one);
  ASSERT_FALSE(gone.ok());
  EXPECT_NE(gone.status().message().find(JoinPath(step1, DataFileName(0))), std::string::npos)
      << gone.status().message();
}

// PfsStep reads committed steps without a job: what they hold, any boxes of them, their
// blobs; a missing step is NotFound and a damaged byte an error naming the file.
TEST_F(CheckpointerTest, APfsStepIsReadWithoutAJob) {
  opts_.persist_every = 0;
  State s;
  {
    auto c = Open();
    for (int64_t step = 3; step <= 4; ++step) {
      s.Fill(step * 7);
      ASSERT_TRUE(c->save(step, s.Shards(), {{"rng", "r" + std::to_string(step)}}).ok());
      auto f = c->flush();
      ASSERT_TRUE(f.ok()) << f.status().ToString();
    }
  }
  const std::string job_dir = PfsJobDir(opts_.pfs_root, opts_.job_id);
  auto steps = PfsStep::Steps(job_dir);
  ASSERT_TRUE(steps.ok()) << steps.status().ToString();
  EXPECT_EQ(*steps, (std::vector<int64_t>{3, 4}));
  auto latest = PfsStep::Open(job_dir);
  ASSERT_TRUE(latest.ok()) << latest.status().ToString();
  EXPECT_EQ(latest->step(), 4);
  EXPECT_EQ(latest->world_size(), 1);
  const PfsStep::Tensor* qkv = nullptr;
  for (const auto& t : latest->tensors())
    if (t.meta.name == "layers.0.attn.qkv.weight") qkv = &t;
  ASSERT_NE(qkv, nullptr);
  EXPECT_EQ(qkv->meta.global_shape, (Shape{128, 48}));
  int64_t saved = 0;
  for (const Box& b : qkv->boxes) saved += b.numel();
  EXPECT_EQ(saved, 64 * 48);  // only rows 64..128 were saved

  // Step 3, whole tensors and a box inside another: the bytes saved.
  auto three = PfsStep::Open(job_dir, 3);
  ASSERT_TRUE(three.ok()) << three.status().ToString();
  State r;
  ASSERT_TRUE(three->read(r.Shards()).ok());
  EXPECT_TRUE(r.Holds(21));
  std::vector<uint16_t> rows(4 * 48);
  ShardSpec part;
  part.meta = qkv->meta;
  part.box = Box{{70, 0}, {4, 48}};
  part.data = rows.data();
  ASSERT_TRUE(three->read({&part, 1}).ok());
  EXPECT_EQ(std::memcmp(rows.data(), r.bf16.data() + 6 * 48, rows.size() * 2), 0);
  auto blobs = three->blobs(0);
  ASSERT_TRUE(blobs.ok()) << blobs.status().ToString();
  EXPECT_EQ(blobs->at("rng"), "r3");
  EXPECT_EQ(three->blobs(1).status().code(), StatusCode::kInvalidArgument);

  // Rows never saved, a step never committed, a damaged byte.
  part.box = Box{{0, 0}, {4, 48}};
  EXPECT_EQ(three->read({&part, 1}).code(), StatusCode::kCorruption);
  auto missing = PfsStep::Open(job_dir, 5);
  ASSERT_FALSE(missing.ok());
  EXPECT_EQ(missing.status().code(), StatusCode::kNotFound);
  EXPECT_NE(missing.status().message().find("step 5"), std::string::npos);
  auto manifest = ReadManifest(DefaultFileSystem(), three->directory());
  ASSERT_TRUE(manifest.ok()) << manifest.status().ToString();
  std::string data_file;
  for (const auto& b : manifest->boxes())
    if (b.tensor() == 0) {
      data_file = JoinPath(three->directory(), DataFileName(b.file()));
      testing::CorruptByte(data_file, b.offset() + 5);
      break;
    }
  const Status bad = three->read(r.Shards());
  EXPECT_EQ(bad.code(), StatusCode::kCorruption);
  EXPECT_NE(bad.message().find(data_file), std::string::npos) << bad.message();
}

// `n` bytes of anonymous memory never touched.
uint8_t* FreshMapping(size_t n) {
  void* m = ::mmap(nullptr, n, PROT_READ | PROT_WRITE, MAP_PRIVATE | MAP_ANONYMOUS, -1, 0);
  EXPECT_NE(m, MAP_FAILED);
  return static_cast<uint8_t*>(m);
}

std::string VmFlagsOf(const void* p) {
  return testing::SmapsLine(p, "VmFlags:");
}

// A restore into memory never touched (an optimizer state just allocated) asks for huge
// pages, so it is faulted in 2 MiB at a time (docs/performance.md: 34 ms -> 9 ms for 70 MB);
// memory in use keeps its pages; CAIRN_RESTORE_HUGE_PAGES=0 turns it off, and auto does
// it unless the machine reports its free memory to a hypervisor.
TEST_F(CheckpointerTest, FreshHostTargetsAreAskedForHugePagesAndUsedOnesAreLeftAlone) {
  constexpr size_t kBytes = 12 << 20;  // a whole 2 MiB-aligned interior wherever it lies
  std::vector<uint8_t> saved(kBytes);
  FillPattern(saved.data(), kBytes, 7);
  auto shard = [](void* data) {
    return std::vector<ShardSpec>{
        ShardSpec::Whole({"w", DType::kU8, {static_cast<int64_t>(kBytes)}}, data)};
  };
  auto fresh_map = [] { return FreshMapping(kBytes); };
  uint8_t* fresh = fresh_map();
  uint8_t* used = fresh_map();
  uint8_t* fresh_off = fresh_map();
  uint8_t* fresh_auto = fresh_map();
  std::memset(used, 0xab, kBytes);
  opts_.restore_huge_pages = RestoreHugePages::kOn;
  {
    auto c = Open();
    ASSERT_TRUE(c->save(1, shard(saved.data()), {}).ok());
    ASSERT_TRUE(c->wait_captured().ok());
    for (uint8_t* t : {fresh, used}) {
      auto rep = c->restore(shard(t));
      ASSERT_TRUE(rep.ok()) << rep.status().ToString();
      EXPECT_TRUE(CheckPattern(t, kBytes, 7));
    }
  }
  const uint8_t* middle = fresh + kBytes / 2;
  EXPECT_NE(VmFlagsOf(middle).find(" hg "), std::string::npos) << VmFlagsOf(middle);
  EXPECT_EQ(VmFlagsOf(used + kBytes / 2).find(" hg "), std::string::npos)
      << VmFlagsOf(used + kBytes / 2);
  for (auto [setting, target] : {std::pair{RestoreHugePages::kOff, fresh_off},
                                 std::pair{RestoreHugePages::kAuto, fresh_auto}}) {
    opts_.restore_huge_pages = setting;
    auto c = Open();
    auto rep = c->restore(shard(target));
    ASSERT_TRUE(rep.ok()) << rep.status().ToString();
    EXPECT_TRUE(CheckPattern(target, kBytes, 7));
  }
  EXPECT_EQ(VmFlagsOf(fresh_off + kBytes / 2).find(" hg "), std::string::npos);
  EXPECT_EQ(VmFlagsOf(fresh_auto + kBytes / 2).find(" hg ") != std::string::npos,
            !FreePagesReportedToHypervisor())
      << VmFlagsOf(fresh_auto + kBytes / 2);
  for (uint8_t* m : {fresh, used, fresh_off, fresh_auto}) ::munmap(m, kBytes);
}

// A restarted process prepares its restore while it connects (include/cairn/prepare.h): it
// reads a blob of the newest version its host memory holds, without opening the tier, and
// faults in fresh targets on a thread; the restore then fills them. Bytes already in a
// target stay, and device targets are not touched.
// Bytes of [p, p + n) (page-aligned) resident in memory.
uint64_t ResidentBytes(const void* p, size_t n) {
  const size_t page = static_cast<size_t>(::sysconf(_SC_PAGESIZE));
  std::vector<unsigned char> in((n + page - 1) / page);
  if (::mincore(const_cast<void*>(p), n, in.data()) != 0) return 0;
  uint64_t out = 0;
  for (unsigned char c : in) out += (c & 1) ? page : 0;
  return out;
}

TEST_F(CheckpointerTest, APreparedRestoreReadsTheNewestBlobAndFaultsTargetsIn) {
  constexpr size_t kBytes = 12 << 20;
  std::vector<uint8_t> saved(kBytes);
  FillPattern(saved.data(), kBytes, 9);
  auto shard = [](void* data, MemoryKind memory = MemoryKind::kHost) {
    return ShardSpec::Whole({"w", DType::kU8, {static_cast<int64_t>(kBytes)}}, data, memory);
  };
  const std::vector<ShardSpec> source{shard(saved.data())};
  {
    auto c = Open();
    ASSERT_TRUE(c->save(1, source, {{"layout", "one"}}).ok());
    ASSERT_TRUE(c->save(2, source, {{"layout", "two"}}).ok());
    ASSERT_TRUE(c->wait_captured().ok());
    // While the tier is open (its lock held), as the next process reads before its open.
    auto held = NewestHeldBlob(opts_, "layout");
    ASSERT_TRUE(held.ok()) << held.status().ToString();
    ASSERT_TRUE(held->has_value());
    EXPECT_EQ((*held)->step, 2);
    EXPECT_EQ((*held)->bytes, "two");
  }
  auto absent = NewestHeldBlob(opts_, "other");
  ASSERT_TRUE(absent.ok() && !absent->has_value());
  Options elsewhere = opts_;
  elsewhere.job_id += "-none";
  absent = NewestHeldBlob(elsewhere, "layout");
  ASSERT_TRUE(absent.ok() && !absent->has_value());

  auto fresh_map = [] { return FreshMapping(kBytes); };
  uint8_t* fresh = fresh_map();
  uint8_t* used = fresh_map();
  FillPattern(used, kBytes, 3);
  EXPECT_EQ(ResidentBytes(fresh, kBytes), 0u);
  // A device target at an address nothing maps: touching it would crash the test.
  void* device = reinterpret_cast<void*>(uintptr_t{1} << 46);
  Prefault warm({shard(fresh), shard(used), shard(device, MemoryKind::kDevice)}, opts_);
  auto c = Open();
  EXPECT_EQ(warm.Wait(), 2 * kBytes);
  EXPECT_EQ(ResidentBytes(fresh, kBytes), kBytes);
  EXPECT_TRUE(CheckPattern(used, kBytes, 3));
  auto rep = c->restore(std::vector<ShardSpec>{shard(fresh)});
  ASSERT_TRUE(rep.ok()) << rep.status().ToString();
  EXPECT_EQ(rep->step, 2);
  EXPECT_TRUE(CheckPattern(fresh, kBytes, 9));
  EXPECT_EQ(warm.Stop(), 2 * kBytes);  // done already: nothing more
  for (uint8_t* m : {fresh, used}) ::munmap(m, kBytes);
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

// Every file cairn creates (host tier, PFS steps, LATEST, MANIFEST) is readable by its owner
// only (no group or other bits), every directory 0700, whatever the umask.
TEST(Security, FilesAre0600AndDirectories0700) {
  testing::TempDir root("modes");
  Options o = testing::TestOptions(root, "modes");
  o.persist_every = 0;
  const mode_t old_umask = ::umask(0);  // the most permissive: cairn's own modes show
  std::vector<float> w(50000, 1.0f);
  {
    auto c = Checkpointer::Open(o);
    ASSERT_TRUE(c.ok()) << c.status().ToString();
    std::vector<ShardSpec> shards = {ShardSpec::Whole({"w", DType::kF32, {50000}}, w.data())};
    ASSERT_TRUE((*c)->save(1, shards, {{"b", "x"}}).ok());
    ASSERT_TRUE((*c)->flush().ok());
  }
  ::umask(old_umask);
  int files = 0, dirs = 0;
  std::function<void(const std::string&)> walk = [&](const std::string& dir) {
    auto names = DefaultFileSystem()->ListDir(dir);
    ASSERT_TRUE(names.ok()) << dir;
    for (const std::string& n : *names) {
      const std::string p = JoinPath(dir, n);
      struct stat st {};
      ASSERT_EQ(::lstat(p.c_str(), &st), 0) << p;
      if (S_ISDIR(st.st_mode)) {
        EXPECT_EQ(st.st_mode & 0777, 0700u) << p;
        ++dirs;
        walk(p);
      } else {
        EXPECT_EQ(st.st_mode & 0077, 0u) << p << " is readable by others";
        ++files;
      }
    }
  };
  for (const std::string& top : {JoinPath(o.host_root, o.job_id), PfsJobDir(o.pfs_root, o.job_id)})
    walk(top);
  EXPECT_GE(files, 5);  // slot, header, lock, data file, MANIFEST, LATEST
  EXPECT_GE(dirs, 3);
}

}  // namespace
}  // namespace cairn

namespace cairn {
namespace {

// Runs `body` in a child process acting as `uid` (its group too, no supplementary groups),
// the way another user of the machine would; returns its exit code (what `body` returned).
int AsUser(uid_t uid, const std::function<int()>& body) {
  const pid_t pid = ::fork();
  if (pid == 0) {
    if (::setgroups(0, nullptr) != 0 || ::setresgid(uid, uid, uid) != 0 ||
        ::setresuid(uid, uid, uid) != 0)
      ::_exit(99);
    ::_exit(body());
  }
  int status = 0;
  if (pid < 0 || ::waitpid(pid, &status, 0) != pid || !WIFEXITED(status)) return -1;
  return WEXITSTATUS(status);
}

int Says(bool ok, const std::string& what) {
  if (!ok) std::fprintf(stderr, "%s\n", what.c_str());
  return ok ? 0 : 1;
}

// The scenario of two ordinary users, alice and mallory, on one node (uids no account uses,
// so nothing of the machine's user database is touched): a host root mallory made for
// everyone (0777) is refused by alice's job at open, naming its owner and mode and what to
// do, and nothing of hers is written there; then, in alice's own tree, mallory's whole
// version of the same job (step 9, her bytes and blobs) planted as her files readable and
// writable by all, and through a link, is refused, and alice's restore gives her own newest
// good step, from the PFS.
TEST(TwoUsers, AVersionAnotherUserMadeOrPlantedIsNeverRestored) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root, to act as two other users (setresuid)";
  const uid_t alice = 61000 + static_cast<uid_t>(::getpid() % 500) * 2, mallory = alice + 1;
  testing::TempDir base("twousers");
  ASSERT_EQ(::chmod(base.path().c_str(), 01777), 0);  // like /tmp: anyone may make a directory
  const std::string shared = base.path() + "/shared";
  const std::string job = testing::UniqueJobId("twousers");
  auto options = [&](const std::string& host) {
    Options o;
    o.job_id = job;
    o.host_root = base.path() + "/" + host;
    o.pfs_root = base.path() + "/pfs-" + host;
    o.log_level = LogLevel::kError;
    o.copy_engine = CopyEngineKind::kHost;
    o.persist_every = 0;  // only flush() persists
    return o;
  };
  // 1. mallory makes the root first, for everyone.
  ASSERT_EQ(AsUser(mallory,
                   [&] {
                     return Says(
                         ::mkdir(shared.c_str(), 0777) == 0 && ::chmod(shared.c_str(), 0777) == 0,
                         "mkdir " + shared);
                   }),
            0);
  // 2. alice's job with it as its root is refused at open, and writes nothing there.
  EXPECT_EQ(AsUser(alice,
                   [&] {
                     Options o = options("shared");
                     o.pfs_root = base.path() + "/pfs-alice";
                     auto c = Checkpointer::Open(o);
                     if (c.ok()) return Says(false, "opened a root another user made for all");
                     const std::string m = c.status().ToString();
                     return Says(
                         m.find(shared) != std::string::npos &&
                             m.find("uid " + std::to_string(mallory)) != std::string::npos &&
                             m.find("0777") != std::string::npos &&
                             m.find("CAIRN_HOST_ROOT") != std::string::npos,
                         "refused without saying why: " + m);
                   }),
            0);
  auto left = DefaultFileSystem()->ListDir(shared);
  ASSERT_TRUE(left.ok());
  EXPECT_TRUE(left->empty()) << "alice's job wrote into " << shared;

  // 3. alice's own job: steps 1..3, step 3 flushed to the PFS, then 4 and 5 in memory.
  auto run = [&](const std::string& host, int64_t first, int64_t last, int64_t flush_at) {
    Options o = options(host);
    auto c = Checkpointer::Open(o);
    if (!c.ok()) return Says(false, c.status().ToString());
    State s;
    for (int64_t step = first; step <= last; ++step) {
      s.Fill(static_cast<uint64_t>(step) * 100);
      Status st = (*c)->save(step, s.Shards(), {{"rng", host + std::to_string(step)}}).status();
      if (st.ok()) st = (*c)->wait_captured();
      if (!st.ok()) return Says(false, st.ToString());
      if (step == flush_at) {
        auto f = (*c)->flush();
        if (!f.ok() || *f != step) return Says(false, "flush: " + f.status().ToString());
      }
    }
    return 0;
  };
  ASSERT_EQ(AsUser(alice, [&] { return run("alice", 1, 5, 3); }), 0);
  // 4. mallory's version of the same job, step 9, in a root of her own.
  ASSERT_EQ(AsUser(mallory, [&] { return run("mallory", 9, 9, -1); }), 0);
  // 5. Planted in alice's tree (by whatever means mallory had: root plays them): her slot
  // files as mallory's, readable and writable by all, and one through a link.
  const std::string mine = HostTier::RankDir(base.path() + "/alice", job, 0, 0);
  const std::string hers = HostTier::RankDir(base.path() + "/mallory", job, 0, 0);
  auto names = DefaultFileSystem()->ListDir(hers);
  ASSERT_TRUE(names.ok());
  std::string slot;  // mallory's slot holding step 9
  for (const std::string& n : *names)
    if (n.starts_with("slot-") && !n.ends_with(".hdr") && !n.ends_with(".tmp")) slot = n;
  ASSERT_FALSE(slot.empty());
  namespace fs = std::filesystem;
  int planted = 0;
  auto my_names = DefaultFileSystem()->ListDir(mine);
  ASSERT_TRUE(my_names.ok()) << my_names.status().ToString();
  for (const std::string& n : *my_names) {
    if (!n.starts_with("slot-") || n.ends_with(".tmp")) continue;
    const std::string to = mine + "/" + n,
                      from = hers + "/" + slot + (n.ends_with(".hdr") ? ".hdr" : "");
    ASSERT_TRUE(fs::remove(to));
    if (planted++ < 2) {
      ASSERT_EQ(::symlink(from.c_str(), to.c_str()), 0);
    } else {
      fs::copy_file(from, to);
      ASSERT_EQ(::chown(to.c_str(), mallory, mallory), 0);
      ASSERT_EQ(::chmod(to.c_str(), 0666), 0);
    }
  }
  ASSERT_GE(planted, 4);  // at least two slots, each its data and header
  // 6. alice restores her own step 3 from the PFS, bit-exact, never mallory's step 9.
  EXPECT_EQ(AsUser(alice,
                   [&] {
                     auto c = Checkpointer::Open(options("alice"));
                     if (!c.ok()) return Says(false, c.status().ToString());
                     State r;
                     auto rep = (*c)->restore(r.Shards());
                     if (!rep.ok()) return Says(false, rep.status().ToString());
                     return Says(rep->step == 3 && rep->tier == "pfs" && r.Holds(300) &&
                                     rep->blobs.at("rng") == "alice3",
                                 "restored step " + std::to_string(rep->step) + " from " +
                                     rep->tier + ", blob " + rep->blobs.at("rng"));
                   }),
            0);
}

}  // namespace
}  // namespace cairn
