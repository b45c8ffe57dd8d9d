// Placement: replicas always on other nodes, same local rank, the right count, and
// holders_of / held_by are inverse relations; MemoryOdds equals the outcomes of every
// loss pattern, counted one by one.
#include <gtest/gtest.h>

#include <algorithm>
#include <bit>
#include <cstdint>
#include <set>
#include <string>

#include "redundancy/host_memory.h"
#include "redundancy/placement.h"

namespace cairn {
namespace {

void CheckInvariants(const Placement& p, int nodes, int rpn, int replicas, bool exact_count) {
  const int world = nodes * rpn;
  for (int r = 0; r < world; ++r) {
    std::set<int> seen;
    for (int h : p.holders_of(r)) {
      ASSERT_NE(p.node_of(h), p.node_of(r)) << "replica on its own node";
      ASSERT_EQ(h % rpn, r % rpn) << "replica on another local rank";
      ASSERT_TRUE(seen.insert(h).second) << "holder listed twice";
      const auto& back = p.held_by(h);
      ASSERT_TRUE(std::find(back.begin(), back.end(), r) != back.end());
    }
    if (exact_count)
      ASSERT_EQ(static_cast<int>(p.holders_of(r).size()), replicas);
    else
      ASSERT_GE(static_cast<int>(p.holders_of(r).size()), replicas);
  }
}

TEST(Placement, RingAndGroupInvariants) {
  for (int nodes = 1; nodes <= 9; ++nodes)
    for (int rpn : {1, 2, 4})
      for (int replicas = 0; replicas < nodes && replicas <= 3; ++replicas) {
        auto ring = Placement::Make(nodes, rpn, replicas, PlacementStrategy::kRing);
        ASSERT_TRUE(ring.ok()) << ring.status().ToString();
        CheckInvariants(*ring, nodes, rpn, replicas, true);
        auto group = Placement::Make(nodes, rpn, replicas, PlacementStrategy::kGroup);
        ASSERT_TRUE(group.ok());
        CheckInvariants(*group, nodes, rpn, replicas, false);
      }
}

TEST(Placement, RingIsTheNextNodeSameLocalRank) {
  auto p = Placement::Make(2, 2, 1, PlacementStrategy::kRing);
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->holders_of(0), std::vector<int>{2});
  EXPECT_EQ(p->holders_of(3), std::vector<int>{1});
  EXPECT_EQ(p->held_by(2), std::vector<int>{0});
  EXPECT_NE(p->Describe().find("rank 1 (node 0)  replicas on: 3 (node 1)"), std::string::npos)
      << p->Describe();
}

TEST(Placement, GroupsHoldEachOther) {
  auto p = Placement::Make(6, 1, 1, PlacementStrategy::kGroup);  // groups {0,1} {2,3} {4,5}
  ASSERT_TRUE(p.ok());
  EXPECT_EQ(p->holders_of(0), std::vector<int>{1});
  EXPECT_EQ(p->holders_of(1), std::vector<int>{0});
  EXPECT_EQ(p->holders_of(4), std::vector<int>{5});
  auto q = Placement::Make(5, 1, 1, PlacementStrategy::kGroup);  // {0,1} {2,3,4}
  ASSERT_TRUE(q.ok());
  EXPECT_EQ(q->holders_of(4), (std::vector<int>{2, 3}));
}

// The nodes in a bit set.
std::set<int> Nodes(uint32_t bits) {
  std::set<int> out;
  for (int n = 0; n < 32; ++n)
    if (bits >> n & 1u) out.insert(n);
  return out;
}

// MemoryOdds counts in closed form; KeepsEveryRank checks one pattern against the holders.
TEST(Placement, MemoryOddsCountEveryLossPatternsOutcome) {
  for (int nodes = 1; nodes <= 11; ++nodes)
    for (int rpn : {1, 2})
      for (int replicas = 0; replicas < nodes && replicas <= 3; ++replicas)
        for (auto strategy : {PlacementStrategy::kRing, PlacementStrategy::kGroup}) {
          auto p = Placement::Make(nodes, rpn, replicas, strategy);
          ASSERT_TRUE(p.ok());
          std::vector<long double> patterns(static_cast<size_t>(nodes) + 1, 0),
              survived(patterns.size(), 0);
          for (uint32_t lost = 0; lost < (1u << nodes); ++lost) {
            const auto k = static_cast<size_t>(std::popcount(lost));
            patterns[k] += 1;
            survived[k] += p->KeepsEveryRank(Nodes(lost)) ? 1 : 0;
          }
          for (int k = 0; k <= nodes; ++k) {
            const LossOdds o = p->MemoryOdds(k);
            const std::string what =
                std::string(strategy == PlacementStrategy::kRing ? "ring" : "group") + ", " +
                std::to_string(nodes) + " nodes x " + std::to_string(rpn) + ", " +
                std::to_string(replicas) + " replicas, " + std::to_string(k) + " lost";
            EXPECT_EQ(o.patterns, patterns[static_cast<size_t>(k)]) << what;
            EXPECT_EQ(o.from_memory, survived[static_cast<size_t>(k)]) << what;
          }
        }
}

TEST(Placement, MemoryOddsAtTenThousandNodes) {
  const int n = 10000;
  auto ring = Placement::Make(n, 1, 1, PlacementStrategy::kRing);
  auto group = Placement::Make(n, 1, 1, PlacementStrategy::kGroup);
  ASSERT_TRUE(ring.ok() && group.ok());
  // Two lost nodes: the ring loses a version when they are neighbours (n pairs), groups
  // of two when they are a group (n/2 pairs).
  const long double pairs = static_cast<long double>(n) * (n - 1) / 2;
  EXPECT_EQ(ring->MemoryOdds(2).patterns, pairs);
  EXPECT_EQ(ring->MemoryOdds(2).from_memory, pairs - n);
  EXPECT_EQ(group->MemoryOdds(2).from_memory, pairs - n / 2);
  EXPECT_EQ(ring->MemoryOdds(1).probability(), 1.0);
  // More losses, fewer survivals; the group placement survives more of them (Gemini).
  for (int k = 3; k <= 8; ++k) {
    EXPECT_LT(ring->MemoryOdds(k).probability(), ring->MemoryOdds(k - 1).probability());
    EXPECT_GT(group->MemoryOdds(k).probability(), ring->MemoryOdds(k).probability());
  }
}

// Erasure-coded sets: the odds equal the loss patterns counted one by one (a pattern comes
// back from memory when no set of k consecutive nodes lost more than m).
TEST(Placement, ErasureOddsEqualEveryLossPatternCounted) {
  for (ErasureScheme s : {ErasureScheme{2, 1}, ErasureScheme{4, 1}, ErasureScheme{4, 2},
                          ErasureScheme{6, 2}, ErasureScheme{3, 1}}) {
    for (int nodes = s.k; nodes <= 12; nodes += s.k) {
      for (int lost = 0; lost <= nodes; ++lost) {
        long double patterns = 0, survived = 0;
        for (uint32_t mask = 0; mask < (1u << nodes); ++mask) {
          if (std::popcount(mask) != lost) continue;
          ++patterns;
          bool ok = true;
          for (int set = 0; set < nodes / s.k; ++set)
            ok = ok && std::popcount((mask >> (set * s.k)) & ((1u << s.k) - 1)) <= s.m;
          survived += ok ? 1 : 0;
        }
        const LossOdds o = ErasureMemoryOdds(nodes, s, lost);
        EXPECT_EQ(o.patterns, patterns) << s.Describe() << " " << nodes << " lost " << lost;
        EXPECT_EQ(o.from_memory, survived) << s.Describe() << " " << nodes << " lost " << lost;
      }
    }
  }
  // Nodes that are not a whole number of sets: nothing counted as surviving.
  EXPECT_EQ(ErasureMemoryOdds(6, {4, 1}, 1).from_memory, 0);
}

// What each scheme costs per node, and the slots a budget buys (docs/settings.md's
// host-memory table): replicas cost a ring per holder, parity m / (k - m) per record kept.
TEST(HostMemory, EachSchemeCostsWhatItHoldsAndTheBudgetPicksTheSlots) {
  Options o;
  o.world_size = 8;
  o.local_world_size = 2;  // 4 nodes
  o.slot_bytes = 1ull << 30;
  o.slots = 4;
  const uint64_t gib = VersionFootprint(1ull << 30);  // a version and its header
  // 1 replica: 2 ranks x 3 slots x (own + replica).
  EXPECT_EQ(HostBytesPerNode(o, 4, 3), 12 * gib);
  o.replicas = 2;
  EXPECT_EQ(HostBytesPerNode(o, 4, 3), 18 * gib);
  o.replicas = 5;  // no more holders than other nodes
  EXPECT_EQ(HostBytesPerNode(o, 4, 2), 16 * gib);
  EXPECT_EQ(HostBytesPerNode(o, 1, 2), 4 * gib);  // one node: no redundancy
  o.replicas = 1;
  // Parity: the records, and each rank's windows its pieces' chunks land in.
  o.redundancy = RedundancyKind::kXor;  // k = 4: 3 records of 1/3 each
  EXPECT_EQ(HostBytesPerNode(o, 4, 2), 6 * gib + 2 * kParityStagingBytes);
  o.redundancy = RedundancyKind::kRs;  // 4 + 2 over 6: 3 records of 2/4
  o.erasure_k = 6;
  EXPECT_EQ(HostBytesPerNode(o, 6, 3), 9 * gib + 2 * kParityStagingBytes);

  o.redundancy = RedundancyKind::kReplica;
  o.erasure_k = 4;
  o.host_memory = 13ull << 30;  // 3 slots (12 GiB and headers) fit, 4 (16) do not
  auto p = PlanHostMemory(o);
  ASSERT_TRUE(p.ok()) << p.status().ToString();
  EXPECT_EQ(p->slots, 3);
  EXPECT_EQ(p->node_losses, 1);
  EXPECT_EQ(p->bytes_per_node, 12 * gib);
  EXPECT_NE(p->summary.find("allows 3 slots per rank"), std::string::npos) << p->summary;
  EXPECT_NE(p->summary.find("fewer slots than CAIRN_SLOTS=4"), std::string::npos) << p->summary;
  o.host_memory = 100ull << 30;  // never more than CAIRN_SLOTS
  EXPECT_EQ(PlanHostMemory(o)->slots, 4);
  o.host_memory = 7ull << 30;  // 2 slots need 8 GiB; xor (3 slots) more: no advice
  auto no = PlanHostMemory(o);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("8.01 GiB that 2 slots need"), std::string::npos)
      << no.status().ToString();
  EXPECT_EQ(no.status().message().find("CAIRN_REDUNDANCY=xor"), std::string::npos)
      << no.status().ToString();
  o.replicas = 2;  // 2 slots need 12 GiB; xor 2 x (3 + 3/3) = 8 GiB
  no = PlanHostMemory(o);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("12.01 GiB that 2 slots need"), std::string::npos)
      << no.status().ToString();
  EXPECT_NE(no.status().message().find("CAIRN_REDUNDANCY=xor CAIRN_ERASURE_K=4 needs 8.01 GiB"),
            std::string::npos)
      << no.status().ToString();
  // Parity takes 3 slots at least: the agreement keeps 2 while a round runs.
  o.redundancy = RedundancyKind::kXor;
  o.host_memory = 7ull << 30;  // 2 slots would fit (6 GiB), 3 do not
  no = PlanHostMemory(o);
  ASSERT_FALSE(no.ok());
  EXPECT_NE(no.status().message().find("8.01 GiB that 3 slots need"), std::string::npos)
      << no.status().ToString();
  o.host_memory = 9ull << 30;
  EXPECT_EQ(PlanHostMemory(o)->slots, 3);
}

TEST(Placement, ImpossibleLayoutsAreRefused) {
  EXPECT_FALSE(Placement::Make(2, 1, 2, PlacementStrategy::kRing).ok());
  EXPECT_FALSE(Placement::Make(0, 1, 0, PlacementStrategy::kRing).ok());
  auto single = Placement::Make(1, 4, 0, PlacementStrategy::kRing);
  ASSERT_TRUE(single.ok());
  EXPECT_TRUE(single->holders_of(0).empty());
}

}  // namespace
}  // namespace cairn
