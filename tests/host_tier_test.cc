// The host tier: ring rules, reopen after a crash, and faults while publishing headers.
#include <gtest/gtest.h>

#include <unistd.h>

#include <sys/stat.h>

#include <atomic>
#include <cstdio>
#include <cstring>
#include <filesystem>
#include <future>
#include <thread>

#include "core/checksum.h"
#include "testing/fault_injection_filesystem.h"
#include "tests/test_util.h"
#include "tiers/host_tier.h"

namespace cairn {
namespace {

class HostTierTest : public ::testing::Test {
 protected:
  HostTierTest() : root_("tier"), log_("test", LogLevel::kError) {
    dir_ = HostTier::RankDir(root_.path(), testing::UniqueJobId("tier"), 0, 0);
  }
  std::unique_ptr<HostTier> OpenTier(FileSystem* fs = DefaultFileSystem(), int slots = 2) {
    HostTierConfig c;
    c.dir = dir_;
    c.slots = slots;
    auto t = HostTier::Open(c, fs, &log_);
    EXPECT_TRUE(t.ok()) << t.status().ToString();
    return t.ok() ? std::move(*t) : nullptr;
  }
  // Captures a version of `step` holding one 1000-byte shard filled with `fill`.
  Status Capture(HostTier& t, int64_t step, char fill, int* slot_out = nullptr) {
    auto slot = t.Reserve(step, FullPolicy::kSkip);
    if (!slot.ok()) return slot.status();
    if (slot_out) *slot_out = *slot;
    SlotHeader h;
    h.step = step;
    h.chunk_bytes = 4096;
    h.data_bytes = 1000;
    h.shards.push_back({"w", DType::kU8, {1000}, Box{{0}, {1000}}, 0, 1000, 0, 1});
    h.chunk_checksums = {0};
    auto base = t.Prepare(*slot, step, h.data_bytes, h);
    if (!base.ok()) {
      t.Abort(*slot);
      return base.status();
    }
    std::memset(*base, fill, 1000);
    t.MarkCopied(*slot);
    Status st = t.Commit(*slot, h);
    if (!st.ok()) t.Abort(*slot);
    return st;
  }
  std::vector<int64_t> Steps(const HostTier& t) {
    std::vector<int64_t> s;
    for (const auto& v : t.Versions()) s.push_back(v.step);
    return s;
  }

  testing::TempDir root_;
  Logger log_;
  std::string dir_;
};

TEST_F(HostTierTest, ReopenListsOnlyCapturedVersions) {
  {
    auto t = OpenTier();
    ASSERT_TRUE(Capture(*t, 1, 'a').ok());
    ASSERT_TRUE(Capture(*t, 2, 'b').ok());
    EXPECT_EQ(Steps(*t), (std::vector<int64_t>{2, 1}));
    // Step 3 dies mid-copy: reserved and prepared, never committed.
    auto slot = t->Reserve(3, FullPolicy::kSkip);
    ASSERT_TRUE(slot.ok());
    SlotHeader h;
    h.step = 3;
    h.chunk_bytes = 4096;
    auto base = t->Prepare(*slot, 3, 1000, h);
    ASSERT_TRUE(base.ok());
    std::memset(*base, 'c', 500);
    EXPECT_EQ(Steps(*t), (std::vector<int64_t>{2}));  // step 1's slot was reused
  }
  auto t = OpenTier();
  EXPECT_EQ(Steps(*t), (std::vector<int64_t>{2}));
  auto view = t->Pin(2);
  ASSERT_TRUE(view.ok());
  EXPECT_EQ(static_cast<char>((*view)->data()[999]), 'b');
  std::vector<std::string> problems;
  auto scan = HostTier::Scan(DefaultFileSystem(), dir_, &problems);
  ASSERT_TRUE(scan.ok());
  ASSERT_EQ(scan->size(), 2u);
  EXPECT_EQ((*scan)[0].step, 3);
  EXPECT_EQ((*scan)[0].state, VersionState::kCapturing);
  EXPECT_EQ((*scan)[1].state, VersionState::kCaptured);
  EXPECT_TRUE(problems.empty());
}

// A restart's open maps the newest version in before the restore reads it (Checkpointer
// does it while the ranks connect): its pages are then in this process's page tables.
TEST_F(HostTierTest, WarmNewestMapsTheNewestVersionInAndStopsWhenAsked) {
  constexpr uint64_t kBytes = 8 << 20;
  {
    auto t = OpenTier();
    for (int64_t step : {1, 2}) {
      auto slot = t->Reserve(step, FullPolicy::kSkip);
      ASSERT_TRUE(slot.ok());
      SlotHeader h;
      h.step = step;
      h.chunk_bytes = kBytes;
      h.data_bytes = kBytes;
      h.shards.push_back(
          {"w", DType::kU8, {int64_t{kBytes}}, Box{{0}, {int64_t{kBytes}}}, 0, kBytes, 0, 1});
      h.chunk_checksums = {0};
      auto base = t->Prepare(*slot, step, kBytes, h);
      ASSERT_TRUE(base.ok()) << base.status().ToString();
      std::memset(*base, static_cast<int>(step), kBytes);
      t->MarkCopied(*slot);
      ASSERT_TRUE(t->Commit(*slot, h).ok());
    }
  }
  auto t = OpenTier();  // a new process's mappings: nothing mapped in yet
  auto newest = t->Pin(2);
  auto older = t->Pin(1);
  ASSERT_TRUE(newest.ok() && older.ok());
  const std::byte* data = (*newest)->data();
  EXPECT_LT(testing::SmapsKb(data, "Rss:"), 1024);
  std::atomic<bool> stop{true};
  EXPECT_EQ(t->WarmNewest(stop), 0u);  // stopped before it began
  stop = false;
  EXPECT_EQ(t->WarmNewest(stop), kBytes);
  EXPECT_GE(testing::SmapsKb(data, "Rss:"), int64_t{kBytes >> 10});
  EXPECT_LT(testing::SmapsKb((*older)->data(), "Rss:"), 1024);  // only the newest
  EXPECT_EQ(static_cast<int>(data[kBytes - 1]), 2);
}

TEST_F(HostTierTest, NewestBlobIsReadWithoutTheLockAndItsChecksumChecked) {
  auto newest = [&](std::string_view name) {
    return HostTier::NewestBlob(DefaultFileSystem(), dir_, name);
  };
  auto none = newest("layout");  // no directory yet
  ASSERT_TRUE(none.ok()) << none.status().ToString();
  EXPECT_FALSE(none->has_value());
  auto t = OpenTier();
  // Versions holding 1000 bytes of a shard, then a blob "layout" of `text`.
  auto capture = [&](int64_t step, const std::string& text) {
    auto slot = t->Reserve(step, FullPolicy::kSkip);
    ASSERT_TRUE(slot.ok());
    SlotHeader h;
    h.step = step;
    h.chunk_bytes = 4096;
    h.data_bytes = 1000 + text.size();
    h.shards.push_back({"w", DType::kU8, {1000}, Box{{0}, {1000}}, 0, 1000, 0, 1});
    h.chunk_checksums = {0};
    h.blobs.push_back({"layout", 1000, text.size(), Checksum(text.data(), text.size())});
    auto base = t->Prepare(*slot, step, h.data_bytes, h);
    ASSERT_TRUE(base.ok()) << base.status().ToString();
    std::memcpy(*base + 1000, text.data(), text.size());
    t->MarkCopied(*slot);
    ASSERT_TRUE(t->Commit(*slot, h).ok());
  };
  capture(1, "one");
  capture(2, "two");
  // Read while this tier holds the directory's lock, as a new process reads before its open.
  auto got = newest("layout");
  ASSERT_TRUE(got.ok()) << got.status().ToString();
  ASSERT_TRUE(got->has_value());
  EXPECT_EQ((*got)->first, 2);
  EXPECT_EQ((*got)->second, "two");
  got = newest("other");
  ASSERT_TRUE(got.ok());
  EXPECT_FALSE(got->has_value());
  // A version being captured is not restorable: still step 2's.
  auto slot = t->Reserve(3, FullPolicy::kSkip);
  ASSERT_TRUE(slot.ok());
  SlotHeader h3;
  h3.step = 3;
  ASSERT_TRUE(t->Prepare(*slot, 3, 1000, h3).ok());
  got = newest("layout");
  ASSERT_TRUE(got.ok() && got->has_value());
  EXPECT_EQ((*got)->first, 2);
  // Step 2's blob changed under its checksum: Corruption naming the file.
  std::string path;
  for (const auto& e : std::filesystem::directory_iterator(dir_)) {
    const std::string p = e.path().string();
    if (p.size() > 4 && p.compare(p.size() - 4, 4, ".hdr") != 0 &&
        std::filesystem::file_size(p) >= 1003 && path.empty()) {
      std::string buf(3, '\0');
      FILE* f = std::fopen(p.c_str(), "rb");
      ASSERT_NE(f, nullptr);
      std::fseek(f, 1000, SEEK_SET);
      ASSERT_EQ(std::fread(buf.data(), 1, 3, f), 3u);
      std::fclose(f);
      if (buf == "two") path = p;
    }
  }
  ASSERT_FALSE(path.empty());
  FILE* f = std::fopen(path.c_str(), "r+b");
  ASSERT_NE(f, nullptr);
  std::fseek(f, 1001, SEEK_SET);
  std::fputc('W', f);
  std::fclose(f);
  got = newest("layout");
  ASSERT_FALSE(got.ok());
  EXPECT_EQ(got.status().code(), StatusCode::kCorruption);
  EXPECT_NE(got.status().message().find(path), std::string::npos) << got.status().ToString();
  t->Abort(*slot);
}

TEST_F(HostTierTest, ReplicatedAndPersistedAreRecordedTogether) {
  {
    auto t = OpenTier();
    ASSERT_TRUE(Capture(*t, 1, 'a').ok());
    // The replicator and the persister record their stages from two threads at once.
    for (int round = 0; round < 20; ++round) {
      ASSERT_TRUE(Capture(*t, 2 + round, 'b').ok());
      const int64_t step = 2 + round;
      std::thread a([&] { EXPECT_TRUE(t->SetState(step, VersionState::kReplicated).ok()); });
      std::thread b([&] { EXPECT_TRUE(t->SetState(step, VersionState::kPersisted).ok()); });
      a.join();
      b.join();
      EXPECT_EQ(t->Versions().front().state, VersionState::kReplicatedPersisted) << step;
    }
    ASSERT_TRUE(t->SetState(20, VersionState::kReplicated).ok());  // already both: stays
    EXPECT_EQ(t->Versions()[1].state, VersionState::kReplicatedPersisted);
  }
  auto t = OpenTier();
  EXPECT_EQ(t->Versions().front().state, VersionState::kReplicatedPersisted);
  EXPECT_TRUE(IsRestorable(VersionState::kReplicatedPersisted));
  EXPECT_STREQ(VersionStateName(VersionState::kReplicatedPersisted), "REPLICATED+PERSISTED");
}

TEST_F(HostTierTest, NewestVersionIsNeverReserved) {
  auto t = OpenTier();
  for (int64_t step = 1; step <= 6; ++step) {
    int slot = -1;
    ASSERT_TRUE(Capture(*t, step, static_cast<char>('a' + step), &slot).ok());
    auto v = t->Versions();
    ASSERT_EQ(v.front().step, step);
    if (step > 1) {
      ASSERT_EQ(v[1].step, step - 1);  // the previous one survives each capture
    }
  }
}

TEST_F(HostTierTest, SkipWhenFullAndBlockUntilFree) {
  auto t = OpenTier();
  ASSERT_TRUE(Capture(*t, 1, 'a').ok());
  auto s2 = t->Reserve(2, FullPolicy::kSkip);  // the only non-newest slot
  ASSERT_TRUE(s2.ok());
  auto s3 = t->Reserve(3, FullPolicy::kSkip);
  ASSERT_FALSE(s3.ok());
  EXPECT_EQ(s3.status().code(), StatusCode::kUnavailable);
  auto blocked = std::async(std::launch::async, [&] { return t->Reserve(3, FullPolicy::kBlock); });
  EXPECT_EQ(blocked.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  t->Abort(*s2);  // frees slot 2's reservation
  ASSERT_EQ(blocked.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(blocked.get().ok());
}

// What a run's last save waits on (Checkpointer::wait_for_slot): every slot kept by the
// step agreement until a round lets one go; WaitFree reserves nothing.
TEST_F(HostTierTest, WaitFreeReturnsOnceTheAgreementLetsAKeptSlotGo) {
  auto t = OpenTier();
  ASSERT_TRUE(Capture(*t, 1, 'a').ok());
  ASSERT_TRUE(Capture(*t, 2, 'b').ok());
  t->Keep({1, 2}, {});
  const Status full = t->WaitFree(0.05);
  ASSERT_FALSE(full.ok());
  EXPECT_EQ(full.code(), StatusCode::kUnavailable);
  EXPECT_NE(full.message().find("a version the job keeps"), std::string::npos) << full.message();
  EXPECT_FALSE(t->Reserve(3, FullPolicy::kSkip).ok());
  auto waiting = std::async(std::launch::async, [&] { return t->WaitFree(30); });
  EXPECT_EQ(waiting.wait_for(std::chrono::milliseconds(100)), std::future_status::timeout);
  t->Keep({2}, {});  // the round ended: step 2 agreed, step 1 no longer kept
  ASSERT_EQ(waiting.wait_for(std::chrono::seconds(10)), std::future_status::ready);
  EXPECT_TRUE(waiting.get().ok());
  EXPECT_TRUE(t->WaitFree(0).ok());  // nothing was reserved by the wait
  auto s3 = t->Reserve(3, FullPolicy::kSkip);
  ASSERT_TRUE(s3.ok()) << s3.status().ToString();
  t->Abort(*s3);
}

TEST_F(HostTierTest, SecondOpenIsRefused) {
  auto t = OpenTier();
  HostTierConfig c;
  c.dir = dir_;
  auto again = HostTier::Open(c, DefaultFileSystem(), &log_);
  ASSERT_FALSE(again.ok());
  EXPECT_EQ(again.status().code(), StatusCode::kFailedPrecondition);
  EXPECT_NE(again.status().message().find(dir_), std::string::npos);
}

TEST_F(HostTierTest, TruncatedDataFileIsNotListed) {
  {
    auto t = OpenTier();
    ASSERT_TRUE(Capture(*t, 1, 'a').ok());
    ASSERT_TRUE(Capture(*t, 2, 'b').ok());
  }
  const std::string p = dir_ + "/slot-0";  // holds step 1
  ASSERT_EQ(::truncate(p.c_str(), 10), 0);
  auto t = OpenTier();
  EXPECT_EQ(t->Versions().size(), 1u);
}

// Fail every mutating filesystem call of a capture, once and persistently, with EIO and
// ENOSPC: the previous version must stay restorable and intact every time.
TEST_F(HostTierTest, FaultsDuringCaptureKeepThePreviousVersion) {
  FaultInjectionFileSystem fs(DefaultFileSystem());
  auto t = OpenTier(&fs);
  ASSERT_TRUE(Capture(*t, 1, 'a' + 1).ok());
  int64_t step = 2;
  for (int err : {EIO, ENOSPC}) {
    for (bool persistent : {false, true}) {
      for (uint64_t n = 1;; ++n) {
        ASSERT_LT(n, 40u);
        const int64_t newest_before = t->Versions().front().step;
        const char fill_before = static_cast<char>('a' + newest_before % 20);
        fs.FailNth(n, err, persistent);
        Status st = Capture(*t, step, static_cast<char>('a' + step % 20));
        fs.Disarm();
        auto v = t->Versions();
        ASSERT_FALSE(v.empty()) << "lost every version at fault " << n;
        if (st.ok()) {
          ASSERT_EQ(v.front().step, step);
          ++step;
          break;
        }
        // The newest complete version from before is still there, bytes intact.
        ASSERT_EQ(v.front().step, newest_before);
        auto view = t->Pin(newest_before);
        ASSERT_TRUE(view.ok());
        ASSERT_EQ(static_cast<char>((*view)->data()[0]), fill_before);
        ++step;
      }
    }
  }
  // And the state on disk agrees after a restart.
  const int64_t newest = t->Versions().front().step;
  t.reset();
  auto t2 = OpenTier();
  ASSERT_EQ(t2->Versions().front().step, newest);
}

// Another user is played by chown to an unused uid (root only).
constexpr uid_t kOtherUid = 61234;

TEST_F(HostTierTest, ARootAnotherUserMadeIsRefusedNamingItBeforeAnythingIsWritten) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: another user is played by chown";
  const std::string host = root_.path() + "/shared";
  ASSERT_EQ(::mkdir(host.c_str(), 0700), 0);
  ASSERT_EQ(::chmod(host.c_str(), 0777), 0);
  ASSERT_EQ(::chown(host.c_str(), kOtherUid, kOtherUid), 0);
  HostTierConfig c;
  c.dir = HostTier::RankDir(host, "secjob", 0, 0);
  c.trust_top = host;
  auto t = HostTier::Open(c, DefaultFileSystem(), &log_);
  ASSERT_FALSE(t.ok()) << "opened a host root another user made, that anyone can write";
  EXPECT_EQ(t.status().code(), StatusCode::kFailedPrecondition);
  for (const std::string& want :
       std::vector<std::string>{host + " (uid 61234", "mode 0777", "CAIRN_HOST_ROOT"})
    EXPECT_NE(t.status().message().find(want), std::string::npos) << t.status().ToString();
  EXPECT_FALSE(DefaultFileSystem()->Exists(host + "/secjob"));
}

TEST_F(HostTierTest, AVersionAnotherUserPlantedOrLinkedInIsRefusedAndRemoved) {
  if (::geteuid() != 0) GTEST_SKIP() << "needs root: another user is played by chown";
  {
    auto t = OpenTier(DefaultFileSystem(), 3);
    ASSERT_TRUE(Capture(*t, 1, 'a').ok());
    ASSERT_TRUE(Capture(*t, 2, 'b').ok());
  }
  // A whole, valid version of step 9 made in a tier of its own (the other user's).
  const std::string other = HostTier::RankDir(root_.path(), "other", 0, 0);
  int slot = -1;
  {
    HostTierConfig c;
    c.dir = other;
    c.slots = 2;
    auto t = HostTier::Open(c, DefaultFileSystem(), &log_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    ASSERT_TRUE(Capture(**t, 9, 'z', &slot).ok());
  }
  const std::string from = other + "/slot-" + std::to_string(slot);
  namespace fs = std::filesystem;
  // Planted: copies owned by the other user, readable and writable by all (slot 5); and
  // links to its files (slot 6).
  for (const char* ext : {"", ".hdr"}) {
    const std::string to = dir_ + "/slot-5" + ext;
    fs::copy_file(from + ext, to);
    ASSERT_EQ(::chown(to.c_str(), kOtherUid, kOtherUid), 0);
    ASSERT_EQ(::chmod(to.c_str(), 0666), 0);
    ASSERT_EQ(::symlink((from + ext).c_str(), (dir_ + "/slot-6" + ext).c_str()), 0);
  }
  auto t = OpenTier(DefaultFileSystem(), 3);
  ASSERT_NE(t, nullptr);
  EXPECT_EQ(Steps(*t), (std::vector<int64_t>{2, 1}));
  EXPECT_FALSE(t->Pin(9).ok());
  for (const char* name : {"slot-5", "slot-5.hdr", "slot-6", "slot-6.hdr"})
    EXPECT_FALSE(DefaultFileSystem()->Exists(dir_ + "/" + name)) << name << " was kept";
  EXPECT_TRUE(DefaultFileSystem()->Exists(from + ".hdr")) << "removed what a link pointed to";
  // The tier still works: the ring goes on with this user's own files.
  ASSERT_TRUE(Capture(*t, 3, 'c').ok());
  EXPECT_EQ(Steps(*t).front(), 3);
}

}  // namespace
}  // namespace cairn
