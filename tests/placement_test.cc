// Placement: replicas always on other nodes, same local rank, the right count, and
// holders_of / held_by are inverse relations.
#include <gtest/gtest.h>

#include <algorithm>
#include <set>

#include "transport/placement.h"

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

TEST(Placement, ImpossibleLayoutsAreRefused) {
  EXPECT_FALSE(Placement::Make(2, 1, 2, PlacementStrategy::kRing).ok());
  EXPECT_FALSE(Placement::Make(0, 1, 0, PlacementStrategy::kRing).ok());
  auto single = Placement::Make(1, 4, 0, PlacementStrategy::kRing);
  ASSERT_TRUE(single.ok());
  EXPECT_TRUE(single->holders_of(0).empty());
}

}  // namespace
}  // namespace cairn
