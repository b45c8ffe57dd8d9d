// layout/restore_plan.h: which planner a restore step goes to and why, and the checks on
// what ranks report in the template gathers (a rank reporting a version it is not the
// first holder of, a layout that is no template, different chunk sizes, a missing
// template). The routes end to end: recovery_process_test, multi_loss_test, recovery_test.
#include "layout/restore_plan.h"

#include <gtest/gtest.h>

#include "tests/plan_check.h"

namespace cairn {
namespace {

TEST(ChooseRestorePlan, EachStepGoesToItsPlannerAndSaysWhy) {
  RestoreFacts f;
  f.from_pfs = true;
  f.indexed_manifest = true;
  EXPECT_EQ(ChooseRestorePlan(f).route, RestoreRoute::kPfsIndex);
  EXPECT_EQ(ChooseRestorePlan(f).Path(),
            "templated: the step was saved from layout templates (MANIFEST format 2)");
  f.templates_on = false;  // the PFS index does not depend on templates at restore
  EXPECT_EQ(ChooseRestorePlan(f).route, RestoreRoute::kPfsIndex);
  f.indexed_manifest = false;
  EXPECT_EQ(ChooseRestorePlan(f).route, RestoreRoute::kJobWide);
  EXPECT_EQ(ChooseRestorePlan(f).Path(), "general: the step was saved with the general plan");

  RestoreFacts m;                                                         // memory
  EXPECT_EQ(ChooseRestorePlan(m).route, RestoreRoute::kMemoryTemplates);  // to try
  m.every_layout_templated = true;
  EXPECT_EQ(ChooseRestorePlan(m).Path(),
            "templated: every target and saved layout is a layout template");
  m.every_layout_templated = false;
  EXPECT_EQ(ChooseRestorePlan(m).route, RestoreRoute::kJobWide);
  EXPECT_EQ(ChooseRestorePlan(m).Path(),
            "general: some target or saved layout is no layout template");
  m.templates_on = false;
  m.every_layout_templated.reset();
  EXPECT_EQ(ChooseRestorePlan(m).route, RestoreRoute::kJobWide);
  EXPECT_EQ(ChooseRestorePlan(m).Path(), "general: layout templates are off");
}

// Two ranks, each holding its own version of a two-rank step, one template.
struct Refs {
  std::vector<std::vector<int>> holders{{0}, {1}};
  std::vector<LayoutRefs> refs;
  std::map<uint64_t, LayoutTemplate> templates;
  Refs() {
    LayoutTemplate t = testing::UniformTemplate(testing::SmallModel(), {SplitRule::Kind::kFlat}, 2);
    const uint64_t h = TemplateHash(EncodeTemplate(t));
    templates.emplace(h, t);
    for (uint32_t r = 0; r < 2; ++r)
      refs.push_back({{true, h, r}, {SavedRef{static_cast<int32_t>(r), {true, h, r}, 4096, 10}}});
  }
};

TEST(IndexSavedRefs, AVersionReportedByARankThatIsNotItsFirstHolderIsCorruption) {
  Refs x;
  bool templated = false;
  auto of = IndexSavedRefs(x.refs, 7, x.holders, "rank 0", &templated);
  ASSERT_TRUE(of.ok()) << of.status().ToString();
  EXPECT_TRUE(templated);
  EXPECT_EQ((*of)[1]->source, 1);

  x.refs[0].saved.push_back(x.refs[1].saved[0]);  // rank 0 reports rank 1's version too
  of = IndexSavedRefs(x.refs, 7, x.holders, "rank 0", &templated);
  ASSERT_FALSE(of.ok());
  EXPECT_EQ(of.status().code(), StatusCode::kCorruption);
  EXPECT_NE(of.status().message().find("rank 0 reported the layout of rank 1's version of step 7"),
            std::string::npos)
      << of.status().ToString();

  Refs y;
  y.refs[1].saved[0].source = -1;  // a garbled source number
  EXPECT_FALSE(IndexSavedRefs(y.refs, 7, y.holders, "rank 0", &templated).ok());
}

TEST(IndexSavedRefs, ALayoutThatIsNoTemplateOrAnUnreportedVersionSendsTheStepJobWide) {
  Refs x;
  x.refs[1].target.templated = false;
  bool templated = true;
  ASSERT_TRUE(IndexSavedRefs(x.refs, 7, x.holders, "r", &templated).ok());
  EXPECT_FALSE(templated);

  Refs y;
  y.refs[1].saved.clear();  // nobody reported source 1
  templated = true;
  ASSERT_TRUE(IndexSavedRefs(y.refs, 7, y.holders, "r", &templated).ok());
  EXPECT_FALSE(templated);
}

TEST(MemoryStepFromRefs, PlansTheStepOrSaysWhyNot) {
  Refs x;
  bool templated = false;
  auto of = IndexSavedRefs(x.refs, 7, x.holders, "r", &templated);
  ASSERT_TRUE(of.ok());
  auto step = MemoryStepFromRefs(7, x.holders, x.refs, *of, x.templates);
  ASSERT_TRUE(step.ok()) << step.status().ToString();
  ASSERT_TRUE(step->has_value());
  EXPECT_EQ((*step)->chunk_bytes, 4096u);
  EXPECT_EQ((*step)->holders, x.holders);

  // A template nobody sent: job-wide.
  auto none = MemoryStepFromRefs(7, x.holders, x.refs, *of, {});
  ASSERT_TRUE(none.ok());
  EXPECT_FALSE(none->has_value());

  // Sources saved with different chunk sizes: an error, not a plan.
  x.refs[1].saved[0].chunk_bytes = 8192;
  of = IndexSavedRefs(x.refs, 7, x.holders, "r", &templated);
  ASSERT_TRUE(of.ok());
  auto mixed = MemoryStepFromRefs(7, x.holders, x.refs, *of, x.templates);
  ASSERT_FALSE(mixed.ok());
  EXPECT_EQ(mixed.status().code(), StatusCode::kInvalidArgument);
}

}  // namespace
}  // namespace cairn
