// The job's agreement on the versions every rank holds (snapshot/step_agreement.h): the
// round's arithmetic, its checks of what ranks send, and, on two real host tiers whose
// ranks are threads, that a step every rank holds survives rank-local skips.
#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <condition_variable>
#include <cstring>
#include <mutex>
#include <set>
#include <thread>

#include "core/mutex.h"
#include "snapshot/step_agreement.h"
#include "testing/in_process_job.h"
#include "tests/test_util.h"
#include "tiers/host_tier.h"

namespace cairn {
namespace {

// Polls `done` every millisecond for at most 30 s (the agreement's rounds run on its own
// thread); the caller asserts the state it waited for.
template <typename Pred>
void WaitFor(Pred done) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(30);
  while (!done() && std::chrono::steady_clock::now() < until)
    std::this_thread::sleep_for(std::chrono::milliseconds(1));
}

AgreeOffer Offer(uint64_t first, std::vector<int64_t> steps, std::vector<bool> held) {
  AgreeOffer o;
  o.first = first;
  o.settled = first + steps.size() - 1;
  o.steps = std::move(steps);
  o.held = std::move(held);
  return o;
}

TEST(AgreeTest, ConsumesTheSavesEveryRankSettledAndAgreesOnTheNewestHeldByAll) {
  // Rank 0 settled saves 1..3, rank 1 only 1..2: the round consumes 2 on both.
  auto out =
      Agree({Offer(1, {10, 11, 12}, {true, true, true}), Offer(1, {10, 11}, {true, false})}, 0);
  ASSERT_TRUE(out.ok()) << out.status().ToString();
  EXPECT_EQ(out->consumed, 2u);
  EXPECT_EQ(out->agreed, 10);  // 11 was skipped (or lost) on rank 1
  EXPECT_EQ(out->dropped, std::vector<int64_t>{11});
  // Nothing held by all: no agreed step from this round.
  out = Agree({Offer(3, {12}, {false}), Offer(3, {12}, {true})}, 2);
  ASSERT_TRUE(out.ok());
  EXPECT_EQ(out->agreed, -1);
  EXPECT_EQ(out->consumed, 3u);
}

TEST(AgreeTest, RanksThatSavedDifferentStepsOrDisagreeOnTheRoundAreRefused) {
  auto out = Agree({Offer(1, {10}, {true}), Offer(1, {20}, {true})}, 0);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("save #1 was step 10 on rank 0 but step 20 on rank 1"),
            std::string::npos)
      << out.status().ToString();
  out = Agree({Offer(1, {10}, {true}), Offer(2, {11}, {true})}, 0);
  ASSERT_FALSE(out.ok());
  EXPECT_NE(out.status().message().find("rank 1 offered saves from #2"), std::string::npos);
}

TEST(AgreeTest, OffersRoundTripAndDamagedOnesAreErrorsNamingTheSender) {
  const AgreeOffer o = Offer(4, {7, 8, 9}, {true, false, true});
  auto back = DecodeAgreeOffer(EncodeAgreeOffer(o), "rank 3");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->first, 4u);
  EXPECT_EQ(back->settled, 6u);
  EXPECT_EQ(back->steps, o.steps);
  EXPECT_EQ(back->held, o.held);
  std::string bad = EncodeAgreeOffer(o);
  bad[bad.size() - 1] ^= 0x5a;
  auto refused = DecodeAgreeOffer(bad, "rank 3");
  EXPECT_FALSE(refused.ok());
  // Flags that do not match the steps: refused by meaning, not only by checksum.
  AgreeOffer odd = o;
  odd.held.pop_back();
  refused = DecodeAgreeOffer(EncodeAgreeOffer(odd), "rank 3");
  ASSERT_FALSE(refused.ok());
  EXPECT_NE(refused.status().message().find("rank 3"), std::string::npos);
}

TEST(AgreeTest, ALayoutIsCoveredOnlyWhenARankOnAnotherNodeOfferedTheSameOne) {
  // 4 ranks on 2 nodes (0, 0, 1, 1): ranks 0 and 2, 1 and 3 are data-parallel peers; rank 1
  // changed its layout, so rank 3's is not covered and neither is rank 1's new one.
  std::vector<AgreeOffer> offers(4);
  const std::vector<uint64_t> hashes = {11, 99, 11, 22};
  for (size_t r = 0; r < 4; ++r) offers[r].layout_hash = hashes[r];
  const std::vector<int> node_of = {0, 0, 1, 1};
  EXPECT_TRUE(CoveredElsewhere(offers, node_of, 0, 11));
  EXPECT_TRUE(CoveredElsewhere(offers, node_of, 2, 11));
  EXPECT_FALSE(CoveredElsewhere(offers, node_of, 1, 99));
  EXPECT_FALSE(CoveredElsewhere(offers, node_of, 3, 22));
  // A peer on the same node does not count: the node's loss takes both.
  EXPECT_FALSE(CoveredElsewhere(offers, {0, 0, 0, 0}, 0, 11));
  // No version yet (hash 0) is never covered, even when others have none either.
  for (auto& o : offers) o.layout_hash = 0;
  EXPECT_FALSE(CoveredElsewhere(offers, node_of, 0, 0));
  // The hash travels in the offer.
  AgreeOffer o = Offer(1, {5}, {true});
  o.layout_hash = 0x1234567890abcdefull;
  auto back = DecodeAgreeOffer(EncodeAgreeOffer(o), "rank 1");
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(back->layout_hash, o.layout_hash);
}

// Two ranks as threads, each with a host tier of its own, agreeing over an in-process
// group; captures are made by hand so that the test decides which rank skips what.
class TwoRanks : public ::testing::Test {
 protected:
  TwoRanks() : root_("agree"), log_("test", LogLevel::kError), job_(2) {
    const std::string id = testing::UniqueJobId("agree");
    for (int r = 0; r < 2; ++r) {
      HostTierConfig c;
      c.dir = HostTier::RankDir(root_.path(), id, r, r);
      c.slots = 2;
      auto t = HostTier::Open(c, DefaultFileSystem(), &log_);
      EXPECT_TRUE(t.ok()) << t.status().ToString();
      tiers_[r] = std::move(*t);
      groups_[r] = std::make_unique<testing::ThreadGroup>(&job_, r);
    }
  }
  void Start() {
    for (int r = 0; r < 2; ++r)
      agree_[r] = std::make_unique<StepAgreement>(
          groups_[r].get(), tiers_[r].get(), &log_, [](uint64_t) {}, nullptr, 10.0, 30.0);
  }
  // Captures `step` on rank `r` (as the capture thread would); false when no slot was free.
  bool Capture(int r, int64_t step) {
    HostTier& t = *tiers_[r];
    auto slot = t.Reserve(step, FullPolicy::kSkip);
    if (!slot.ok()) return false;
    SlotHeader h;
    h.step = step;
    h.chunk_bytes = 4096;
    h.data_bytes = 100;
    h.shards.push_back({"w", DType::kU8, {100}, Box{{0}, {100}}, 0, 100, 0, 1});
    h.chunk_checksums = {0};
    auto base = t.Prepare(*slot, step, h.data_bytes, h);
    EXPECT_TRUE(base.ok());
    std::memset(*base, static_cast<int>(step), 100);
    t.MarkCopied(*slot);
    EXPECT_TRUE(t.Commit(*slot, h).ok());
    return true;
  }
  // One training step: rank r captures `step` unless told to skip it, then both record the
  // save; waits until the job agreed on it (as a round does within an iteration).
  void Step(int64_t step, bool skip_on_rank1) {
    for (int r = 0; r < 2; ++r) {
      const bool captured = !(r == 1 && skip_on_rank1);
      if (captured) {
        ASSERT_TRUE(Capture(r, step)) << "rank " << r;
      }
      Record(r, step, captured);
    }
    AwaitAgreed();
  }
  // Rank r records its save of `step` (captured there or skipped).
  void Record(int r, int64_t step, bool captured) {
    seq_[r] += captured ? 1 : 0;
    agree_[r]->OnSave(seq_[r], step);
  }
  // Waits until both ranks consumed the save every rank just recorded.
  void AwaitAgreed() {
    ++saves_;
    for (int r = 0; r < 2; ++r) {
      WaitFor([&] { return agree_[r]->stats().agreed_saves >= saves_; });
      ASSERT_EQ(agree_[r]->stats().agreed_saves, saves_);
    }
  }
  // Rank r's tier again, with `slots` slots (a new job id: empty).
  void Reopen(int r, int slots) {
    tiers_[r].reset();
    HostTierConfig c;
    c.dir = HostTier::RankDir(root_.path(), testing::UniqueJobId("agree-reopen"), r, r);
    c.slots = slots;
    auto t = HostTier::Open(c, DefaultFileSystem(), &log_);
    ASSERT_TRUE(t.ok()) << t.status().ToString();
    tiers_[r] = std::move(*t);
  }
  std::vector<int64_t> Steps(int r) {
    std::vector<int64_t> s;
    for (const auto& v : tiers_[r]->Versions()) s.push_back(v.step);
    return s;
  }

  testing::TempDir root_;
  Logger log_;
  testing::InProcessJob job_;
  std::unique_ptr<HostTier> tiers_[2];
  std::unique_ptr<testing::ThreadGroup> groups_[2];
  std::unique_ptr<StepAgreement> agree_[2];
  uint64_t seq_[2] = {0, 0};
  uint64_t saves_ = 0;
};

TEST_F(TwoRanks, AStepEveryRankHoldsSurvivesSkipsOnOneRank) {
  Start();
  Step(1, false);
  EXPECT_EQ(agree_[0]->stats().agreed_step, 1);
  // Rank 1 skips 2 and 3 (its slots busy, say). Rank 0 has 2 slots: on its own rule (keep
  // the newest) it would now hold 2 and 3, and no step would be held by both ranks.
  Step(2, true);
  Step(3, true);
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{3, 1}));
  EXPECT_EQ(Steps(1), (std::vector<int64_t>{1}));
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agree_[r]->stats().agreed_step, 1);
    EXPECT_EQ(agree_[r]->stats().not_held_by_all, 2u);
  }
  // Both capture again: the agreed step moves on, and the old one may go.
  Step(4, false);
  Step(5, false);
  EXPECT_EQ(agree_[0]->stats().agreed_step, 5);
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{5, 4}));
  EXPECT_EQ(Steps(1), (std::vector<int64_t>{5, 4}));
}

TEST_F(TwoRanks, NamedPushesTheRoundsNameTheSameStepsAndAgreeOnceEveryRankPushedIt) {
  // Parity's named pushes: each round names the newest step every rank holds, every rank
  // pushes it (here: marks it REPLICATED at once, unless rank 1 is told to fail), and the
  // job agrees on it once every rank's push was acknowledged.
  Mutex mu;
  std::vector<int64_t> named[2];
  std::set<int64_t> fail_on_rank1;
  for (int r = 0; r < 2; ++r) {
    AgreementProtection p;
    p.wait_tried = [](int64_t) {};
    p.target = [this, r, &mu, &named, &fail_on_rank1](int64_t step) {
      MutexLock lk(mu);
      named[r].push_back(step);
      if (!(r == 1 && fail_on_rank1.count(step))) {
        EXPECT_TRUE(tiers_[r]->SetState(step, VersionState::kReplicated).ok());
      }
    };
    agree_[r] = std::make_unique<StepAgreement>(
        groups_[r].get(), tiers_[r].get(), &log_, [](uint64_t) {}, nullptr, 10.0, 30.0, p);
  }
  Step(1, false);
  EXPECT_EQ(agree_[0]->stats().agreed_step, 1);
  {
    MutexLock lk(mu);
    fail_on_rank1.insert(2);
  }
  Step(2, false);  // named, but rank 1's push fails: not agreed
  Step(3, true);   // rank 1 lacks 3: nothing named
  for (int r = 0; r < 2; ++r) EXPECT_EQ(agree_[r]->stats().agreed_step, 1) << r;
  Step(4, false);
  Step(5, false);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(agree_[r]->stats().agreed_step, 5) << r;
  MutexLock lk(mu);
  EXPECT_EQ(named[0], (std::vector<int64_t>{1, 2, 4, 5}));
  EXPECT_EQ(named[1], named[0]);
}

TEST_F(TwoRanks, AStepTheJobDoesNotHoldIsReusedFirst) {
  // Three slots on rank 0: after 1 and 2 (both ranks) and 3 (rank 1 skips), rank 0's next
  // capture takes the slot of 3, which no job restores from memory, not that of the older
  // 1, which every rank holds.
  tiers_[0].reset();
  HostTierConfig c;
  c.dir = HostTier::RankDir(root_.path(), testing::UniqueJobId("agree3"), 0, 0);
  c.slots = 3;
  auto t = HostTier::Open(c, DefaultFileSystem(), &log_);
  ASSERT_TRUE(t.ok());
  tiers_[0] = std::move(*t);
  Start();
  Step(1, false);
  Step(2, false);
  Step(3, true);
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{3, 2, 1}));
  Step(4, false);
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{4, 2, 1}));
}

// A group whose collectives fail, as with a dead rank.
class DeadGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Barrier() override { return Status::Unavailable("rank 1 died"); }
  Result<std::vector<std::string>> AllGather(std::string_view) override {
    return Status::Unavailable("rank 1 died");
  }
  Result<std::string> Broadcast(int, std::string_view) override {
    return Status::Unavailable("rank 1 died");
  }
};

TEST_F(TwoRanks, AFailedRoundEndsTheAgreementAndTheTierKeepsItsNewestAgain) {
  DeadGroup dead;
  StepAgreement a(
      &dead, tiers_[0].get(), &log_, [](uint64_t) {}, nullptr, 1.0, 30.0);
  ASSERT_TRUE(Capture(0, 1));
  a.OnSave(1, 1);
  WaitFor([&] { return a.stats().ended; });
  ASSERT_TRUE(a.stats().ended);
  EXPECT_NE(a.stats().error.find("rank 1 died"), std::string::npos);
  // The newest-version rule again: with 2 slots, 1 stays while 2 is captured, then 2
  // while 3 is.
  ASSERT_TRUE(Capture(0, 2));
  ASSERT_TRUE(Capture(0, 3));
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{3, 2}));
}

// A step a wait_replicated() succeeded for (OnReplicated) outlives a failed round: the
// guarantee is a restore no older than the newest step every rank saw replicated, and the
// ranks that go on saving after a peer died must not reuse its slot. (Before: the tier went
// back to keeping its newest version, and step 1 went with the capture of 4.)
TEST_F(TwoRanks, AStepSeenReplicatedIsKeptAfterAFailedRoundEndsTheAgreement) {
  Reopen(0, 3);
  DeadGroup dead;
  StepAgreement a(
      &dead, tiers_[0].get(), &log_, [](uint64_t) {}, nullptr, 1.0, 30.0);
  ASSERT_TRUE(Capture(0, 1));
  a.OnReplicated(1);
  a.OnSave(1, 1);
  WaitFor([&] { return a.stats().ended; });
  ASSERT_TRUE(a.stats().ended);
  ASSERT_TRUE(Capture(0, 2));
  ASSERT_TRUE(Capture(0, 3));
  ASSERT_TRUE(Capture(0, 4));
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{4, 3, 1}));
  // A newer promise lets the older one go.
  a.OnReplicated(4);
  ASSERT_TRUE(Capture(0, 5));
  ASSERT_TRUE(Capture(0, 6));
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{6, 5, 4}));
}

// A group of two whose first allgather answers as if the other rank offered what this one
// did, and whose later ones fail, as when that rank dies after one round.
class OneRoundGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Barrier() override { return Status::Unavailable("rank 1 died"); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    if (rounds_++ > 0) return Status::Unavailable("rank 1 died");
    return std::vector<std::string>{std::string(mine), std::string(mine)};
  }
  Result<std::string> Broadcast(int, std::string_view) override {
    return Status::Unavailable("rank 1 died");
  }

 private:
  std::atomic<int> rounds_{0};
};

// The ranks agreed on a step newer than the one every rank saw replicated, and then a round
// failed: the agreed step stays kept beside the promised one, also once a newer step is
// promised. The holders of replicas and parity keep the agreed step's and may have dropped
// the promised step's, so the promised step alone can leave nothing to rebuild a lost node
// from (the ASan crash matrix: bound 15, restored 12 from the PFS); and a newer promise is
// one rank's, while the agreed step is every rank's (bound 9: one survivor promised 12 and
// let the agreed 9 go). Before: steps {5, 4, 3, 1}, the agreed 2 reused.
TEST_F(TwoRanks, AnAgreedStepNewerThanThePromisedOneIsKeptAfterAFailedRound) {
  Reopen(0, 4);
  OneRoundGroup group;
  StepAgreement a(
      &group, tiers_[0].get(), &log_, [](uint64_t) {}, nullptr, 1.0, 30.0);
  ASSERT_TRUE(Capture(0, 1));
  a.OnReplicated(1);
  ASSERT_TRUE(Capture(0, 2));
  a.OnSave(1, 2);
  WaitFor([&] { return a.stats().agreed_step >= 2; });
  ASSERT_EQ(a.stats().agreed_step, 2);
  ASSERT_TRUE(Capture(0, 3));
  a.OnSave(2, 3);
  WaitFor([&] { return a.stats().ended; });
  ASSERT_TRUE(a.stats().ended);
  ASSERT_TRUE(Capture(0, 4));
  ASSERT_TRUE(Capture(0, 5));
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{5, 4, 2, 1}));
  // A newer promise lets the older promise go, not the agreed step.
  a.OnReplicated(5);
  ASSERT_TRUE(Capture(0, 6));
  ASSERT_TRUE(Capture(0, 7));
  ASSERT_TRUE(Capture(0, 8));
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{8, 7, 5, 2}));
}

// A group whose allgather waits until the test lets it fail, as a round whose message was
// lost in a link cut waits for the operation timeout.
class StuckGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Barrier() override { return Status::Unavailable("stuck"); }
  Result<std::vector<std::string>> AllGather(std::string_view) override {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return released_; });
    return Status::Unavailable("rank 1 never answered");
  }
  Result<std::string> Broadcast(int, std::string_view) override {
    return Status::Unavailable("stuck");
  }
  void Release() {
    std::lock_guard lk(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool released_ = false;
};

TEST_F(TwoRanks, ARoundStuckLongerThanTheHoldTimeStopsKeepingWhatItOffered) {
  StuckGroup stuck;
  StepAgreement a(
      &stuck, tiers_[0].get(), &log_, [](uint64_t) {}, nullptr, 1.0, 0.2);
  struct ReleaseFirst {  // before `a` joins its thread, also when an assertion returns early
    StuckGroup* g;
    ~ReleaseFirst() { g->Release(); }
  } release{&stuck};
  ASSERT_TRUE(Capture(0, 1));
  ASSERT_TRUE(Capture(0, 2));
  a.OnSave(1, 1);
  a.OnSave(2, 2);
  // The round offers step 1 (and 2, when both saves were recorded before it started) and
  // waits: what it offered is kept while it waits.
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  // The next save finds the round stuck past 0.2 s and lets its steps go: captures go on.
  a.OnSave(2, 3);
  EXPECT_EQ(a.stats().released, 1u);
  ASSERT_TRUE(Capture(0, 4));
  ASSERT_TRUE(Capture(0, 5));
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{5, 4}));  // step 1 no longer kept
}

// While the rounds lag (here: stuck, and their offers released), the step a
// wait_replicated() succeeded for stays: the crash matrix under ASan once restored nothing
// because every rank had seen step 9 replicated while the agreed step was 5, and one rank
// had reused 9's slot for 11 (4 slots: 4 pinned by the persister, 5 agreed, 7 offered).
TEST_F(TwoRanks, AStepSeenReplicatedIsKeptWhileTheAgreedStepLags) {
  Reopen(0, 3);
  StuckGroup stuck;
  StepAgreement a(
      &stuck, tiers_[0].get(), &log_, [](uint64_t) {}, nullptr, 1.0, 0.2);
  struct ReleaseFirst {
    StuckGroup* g;
    ~ReleaseFirst() { g->Release(); }
  } release{&stuck};
  ASSERT_TRUE(Capture(0, 1));
  a.OnSave(1, 1);
  ASSERT_TRUE(Capture(0, 2));
  a.OnReplicated(2);
  a.OnSave(2, 2);
  std::this_thread::sleep_for(std::chrono::milliseconds(300));
  a.OnSave(2, 3);  // releases the stuck round's offer
  EXPECT_EQ(a.stats().released, 1u);
  EXPECT_EQ(a.stats().agreed_step, -1);
  for (int64_t st = 4; st <= 7; ++st) ASSERT_TRUE(Capture(0, st)) << st;
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{7, 6, 2}));
}

// With 4 slots a step every rank saw replicated stays kept after the ranks agreed on newer
// ones (an agreed step is one every rank captured, not one that was replicated), until a
// newer promise replaces it: the flat crash matrix under ASan lost the promised step on both
// survivors once the agreement passed it (tests/RELIABILITY.md, trial 21).
TEST_F(TwoRanks, WithFourSlotsAPromisedStepIsKeptPastTheAgreementUntilANewerPromise) {
  for (int r = 0; r < 2; ++r) Reopen(r, 4);
  Start();
  Step(1, false);
  Step(2, false);
  for (int r = 0; r < 2; ++r) agree_[r]->OnReplicated(2);
  for (int64_t st = 3; st <= 8; ++st) Step(st, false);
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agree_[r]->stats().agreed_step, 8) << "rank " << r;
    const std::vector<int64_t> held = Steps(r);
    EXPECT_NE(std::find(held.begin(), held.end(), 2), held.end()) << "rank " << r;
  }
  // A newer promise lets 2 go.
  for (int r = 0; r < 2; ++r) agree_[r]->OnReplicated(8);
  for (int64_t st = 9; st <= 12; ++st) Step(st, false);
  for (int r = 0; r < 2; ++r) {
    const std::vector<int64_t> held = Steps(r);
    EXPECT_EQ(std::find(held.begin(), held.end(), 2), held.end()) << "rank " << r;
    EXPECT_NE(std::find(held.begin(), held.end(), 8), held.end()) << "rank " << r;
  }
}

// A two-rank group whose other rank answers the first round with this rank's own offer (it
// holds the same steps), and then never answers again until the test lets the round fail.
class AnswersOnceGroup final : public Group {
 public:
  int rank() const override { return 0; }
  int size() const override { return 2; }
  Status Barrier() override { return Status::Unavailable("stuck"); }
  Result<std::vector<std::string>> AllGather(std::string_view mine) override {
    std::unique_lock lk(mu_);
    cv_.wait(lk, [&] { return go_ || released_; });
    if (!answered_ && !released_) {
      answered_ = true;
      return std::vector<std::string>{std::string(mine), std::string(mine)};
    }
    cv_.wait(lk, [&] { return released_; });
    return Status::Unavailable("rank 1 never answered");
  }
  Result<std::string> Broadcast(int, std::string_view) override {
    return Status::Unavailable("stuck");
  }
  void Go() {
    std::lock_guard lk(mu_);
    go_ = true;
    cv_.notify_all();
  }
  void Release() {
    std::lock_guard lk(mu_);
    released_ = true;
    cv_.notify_all();
  }

 private:
  std::mutex mu_;
  std::condition_variable cv_;
  bool go_ = false, answered_ = false, released_ = false;
};

// A round that waits (a dead rank, a lost message) with several saves in its window keeps
// only as many of them as leave a slot to capture into: 3 slots, the agreed step 1 and a
// window of 2 and 3 offer 3 alone, so step 4 is captured into the slot of 2. Keeping the
// whole window held all 3 slots, and every save was skipped until the hold ended.
TEST_F(TwoRanks, ARoundThatWaitsWithSeveralSavesKeepsASlotFreeToCaptureInto) {
  tiers_[0].reset();
  HostTierConfig c;
  c.dir = HostTier::RankDir(root_.path(), testing::UniqueJobId("agree3"), 0, 0);
  c.slots = 3;
  auto t = HostTier::Open(c, DefaultFileSystem(), &log_);
  ASSERT_TRUE(t.ok());
  tiers_[0] = std::move(*t);
  AnswersOnceGroup group;
  StepAgreement a(
      &group, tiers_[0].get(), &log_, [](uint64_t) {}, nullptr, 1.0, 30.0);
  struct ReleaseFirst {  // before `a` joins its thread, also when an assertion returns early
    AnswersOnceGroup* g;
    ~ReleaseFirst() { g->Release(); }
  } release{&group};
  ASSERT_TRUE(Capture(0, 1));
  a.OnSave(1, 1);
  // Round 1 (step 1) waits for the other rank while steps 2 and 3 are saved.
  std::this_thread::sleep_for(std::chrono::milliseconds(50));
  ASSERT_TRUE(Capture(0, 2));
  ASSERT_TRUE(Capture(0, 3));
  a.OnSave(2, 2);
  a.OnSave(3, 3);
  group.Go();  // round 1 agrees on step 1; round 2 (steps 2 and 3) waits from now on
  WaitFor([&] { return a.stats().agreed_step >= 1; });
  ASSERT_EQ(a.stats().agreed_step, 1);
  std::this_thread::sleep_for(std::chrono::milliseconds(100));  // round 2 has begun
  EXPECT_TRUE(Capture(0, 4)) << "every slot is kept by the waiting round";
  EXPECT_EQ(Steps(0), (std::vector<int64_t>{4, 3, 1}));
}

TEST_F(TwoRanks, NamedPushesWaitWhileADrainPinsAVersionTheJobNoLongerKeeps) {
  // Three slots: a drain pins the agreed step 2 (it costs no slot: the job keeps it), then
  // the ranks agree on 3, so the drain's pin holds a version the job no longer keeps. A
  // round that kept 4 beside 3 while 4 is pushed would leave no slot for the next save (on
  // a 2-vCPU machine a drain outlasted the iteration and that save was skipped): it offers
  // nothing until the drain lets go, and then the job moves on.
  for (int r = 0; r < 2; ++r) Reopen(r, 3);
  Mutex mu;
  std::vector<int64_t> named[2];
  std::vector<std::string> full;  // a save tried while a step is pushed found no slot
  for (int r = 0; r < 2; ++r) {
    AgreementProtection p;
    p.wait_tried = [](int64_t) {};
    p.target = [this, r, &mu, &named, &full](int64_t step) {
      // The training thread saves while the push runs.
      auto slot = tiers_[r]->Reserve(step + 1, FullPolicy::kSkip);
      MutexLock lk(mu);
      named[r].push_back(step);
      if (slot.ok())
        tiers_[r]->Abort(*slot);
      else
        full.push_back("rank " + std::to_string(r) + ", step " + std::to_string(step) + ": " +
                       slot.status().ToString());
      EXPECT_TRUE(tiers_[r]->SetState(step, VersionState::kReplicated).ok());
    };
    agree_[r] = std::make_unique<StepAgreement>(
        groups_[r].get(), tiers_[r].get(), &log_, [](uint64_t) {}, nullptr, 10.0, 30.0, p);
  }
  Step(1, false);
  Step(2, false);
  std::unique_ptr<HostTier::View> drain[2];
  for (int r = 0; r < 2; ++r) {
    ASSERT_EQ(agree_[r]->stats().agreed_step, 2);
    auto v = tiers_[r]->Pin(2);
    ASSERT_TRUE(v.ok()) << v.status().ToString();
    drain[r] = std::move(*v);
  }
  Step(3, false);  // slot of 1 free beside 2 (pinned) and 3: pushed and agreed
  Step(4, false);  // 2 pinned, 3 agreed, 4 captured: keeping 4 would fill every slot
  for (int r = 0; r < 2; ++r) {
    EXPECT_EQ(agree_[r]->stats().agreed_step, 3) << r;
    EXPECT_GE(agree_[r]->stats().held_back, 1u) << r;
    EXPECT_TRUE(Capture(r, 5)) << "rank " << r << ": the save after the held-back step";
    drain[r].reset();  // the drain's share is written
  }
  for (int r = 0; r < 2; ++r) Record(r, 5, true);  // step 5, captured above
  AwaitAgreed();
  Step(6, false);
  for (int r = 0; r < 2; ++r) EXPECT_EQ(agree_[r]->stats().agreed_step, 6) << r;
  MutexLock lk(mu);
  EXPECT_TRUE(full.empty()) << full.front();
  EXPECT_EQ(named[0], (std::vector<int64_t>{1, 2, 3, 5, 6}));
  EXPECT_EQ(named[1], named[0]);
}

}  // namespace
}  // namespace cairn
