// Layout templates and the save plans made from them (layout/layout_template.h,
// layout/templated_plan.h): recognition is exact, the exchange sends each template once,
// the templated plan writes every unique box once from a rank that holds it and agrees
// with the general planner on what the job holds, and every case it does not handle falls
// back to the general planner.
#include <gtest/gtest.h>

#include <algorithm>
#include <map>
#include <random>
#include <set>
#include <tuple>

#include "core/checksum.h"
#include "layout/layout_template.h"
#include "layout/templated_plan.h"
#include "persist/step_index.h"
#include "tests/plan_check.h"

namespace cairn {
namespace {

using testing::ExpectCoveredOnce;
using testing::Fsdp2OverTpJob;
using K = SplitRule::Kind;
using R = SplitRule::Round;

std::vector<TensorMeta> Model() {
  return testing::SmallModel();
}

LayoutTemplate Uniform(const std::vector<TensorMeta>& tensors, SplitRule rule, uint32_t parts) {
  return testing::UniformTemplate(tensors, rule, parts);
}

// What the persister's two gathers bring every rank when rank r holds layouts[r].
struct Gathered {
  std::vector<std::string> messages, templates;
  std::vector<uint64_t> hashes;
  int senders = 0;  // ranks that sent a template
};
Gathered Exchange(const std::vector<RankLayout>& layouts, bool templates = true) {
  const int world = static_cast<int>(layouts.size());
  Gathered g;
  std::vector<std::optional<RecognizedLayout>> rec(layouts.size());
  for (int r = 0; r < world; ++r) {
    const RankLayout& l = layouts[static_cast<size_t>(r)];
    const std::string encoded = EncodeRankLayout(l);
    LayoutMessage m;
    if (templates) rec[static_cast<size_t>(r)] = RecognizeLayout(l, r, world);
    if (const auto& x = rec[static_cast<size_t>(r)]) {
      m.templated = true;
      m.template_hash = TemplateHash(EncodeTemplate(x->layout_template));
      m.index = x->index;
      g.hashes.push_back(TemplatedLayoutHash(m.template_hash, m.index));
    } else {
      g.hashes.push_back(LayoutHash(encoded));
      bool first = true;
      for (int q = 0; q < r; ++q)
        first = first && g.hashes[static_cast<size_t>(q)] != g.hashes.back();
      if (first) m.layout = encoded;
    }
    g.messages.push_back(EncodeLayoutMessage(m));
  }
  const std::vector<LayoutMessage> decoded = *DecodeLayoutMessages(g.messages);
  if (AnyTemplated(decoded))
    for (int r = 0; r < world; ++r) {
      const bool send = SendsTemplate(decoded, r);
      g.senders += send;
      g.templates.push_back(send ? EncodeTemplate(rec[static_cast<size_t>(r)]->layout_template)
                                 : std::string());
    }
  return g;
}

// (tensor name, box) of every unique box a plan covers, sorted.
std::vector<std::pair<std::string, std::string>> UniqueBoxes(const SavePlan& p) {
  std::vector<std::pair<std::string, std::string>> out;
  for (const PlanShard& s : p.shards) out.push_back({p.tensors[s.tensor].name, s.box.ToString()});
  std::sort(out.begin(), out.end());
  return out;
}

// The templated plan against the general one made from the same layouts.
void ExpectSameJobAsGeneralPlan(PersistPlan& plan, const std::vector<RankLayout>& layouts) {
  const SavePlan& full = plan.Full();
  ExpectCoveredOnce(full);
  for (size_t i = 1; i < full.pieces.size(); ++i)
    ASSERT_LE(full.pieces[i - 1].writer, full.pieces[i].writer) << "pieces not grouped by writer";
  std::vector<std::string> encoded;
  for (const RankLayout& l : layouts) encoded.push_back(EncodeRankLayout(l));
  auto general = MakeSavePlan(encoded);
  ASSERT_TRUE(general.ok()) << general.status().ToString();
  EXPECT_EQ(UniqueBoxes(full), UniqueBoxes(*general));
  EXPECT_EQ(full.unique_bytes, general->unique_bytes);
  uint64_t written = 0;
  for (size_t r = 0; r < layouts.size(); ++r) {
    const std::vector<WritePiece> mine = plan.PiecesOf(static_cast<int>(r));
    const std::vector<WritePiece> expanded = WritePiecesOf(full, static_cast<int>(r));
    ASSERT_EQ(mine.size(), expanded.size()) << "rank " << r;
    uint64_t bytes = 0;
    for (size_t k = 0; k < mine.size(); ++k) {
      EXPECT_EQ(mine[k].slot_shard, expanded[k].slot_shard) << "rank " << r;
      EXPECT_EQ(mine[k].box, expanded[k].box) << "rank " << r;
      // The piece is the whole of the rank's shard at that slot position.
      ASSERT_LT(mine[k].slot_shard, layouts[r].shards.size());
      EXPECT_EQ(mine[k].box, layouts[r].shards[mine[k].slot_shard].box) << "rank " << r;
      EXPECT_EQ(mine[k].nbytes, expanded[k].nbytes);
      bytes += mine[k].nbytes;
    }
    EXPECT_EQ(bytes, full.writer_bytes[r]) << "rank " << r;
    written += bytes;
  }
  EXPECT_EQ(written, full.unique_bytes);
}

TEST(LayoutTemplate, EveryRuleIsRecognisedExactly) {
  const std::vector<TensorMeta> model = Model();
  const std::vector<SplitRule> rules = {{K::kFlat, R::kCeil, 0},   {K::kFlat, R::kFloor, 0},
                                        {K::kChunk, R::kCeil, 0},  {K::kChunk, R::kFloor, 0},
                                        {K::kChunk, R::kCeil, 1},  {K::kChunk, R::kFloor, 1},
                                        {K::kChunk, R::kTrunc, 0}, {K::kChunk, R::kTrunc, 1}};
  int checked = 0;
  for (int world : {1, 2, 3, 4, 6, 7, 12}) {
    // n = world (FSDP), and n a divisor with index rank % n (TP inside DP).
    for (int n : {world, world / 2}) {
      if (n < 1 || world % n != 0) continue;
      for (const SplitRule& rule : rules) {
        // Chunk rules only on tensors that have the dimension: the others stay whole.
        LayoutTemplate t = Uniform(model, rule, static_cast<uint32_t>(n));
        for (size_t k = 0; k < model.size(); ++k)
          if (rule.kind == K::kChunk && rule.dim >= model[k].global_shape.size()) t.rules[k] = {};
        for (int r = 0; r < world; ++r) {
          const RankLayout l = ExpandTemplate(t, static_cast<uint32_t>(r % n));
          auto got = RecognizeLayout(l, r, world);
          ASSERT_TRUE(got.has_value())
              << rule.ToString() << " rank " << r << " of " << world << " parts " << n;
          EXPECT_EQ(EncodeRankLayout(ExpandTemplate(got->layout_template, got->index)),
                    EncodeRankLayout(l))
              << rule.ToString() << " rank " << r << " of " << world << " parts " << n;
          ++checked;
        }
      }
    }
  }
  EXPECT_GT(checked, 300);
}

TEST(LayoutTemplate, PartsCoverEachTensorOnceAndCountTheirElements) {
  for (const TensorMeta& m : Model())
    for (SplitRule rule : {SplitRule{K::kFlat, R::kCeil, 0}, SplitRule{K::kFlat, R::kFloor, 0},
                           SplitRule{K::kChunk, R::kCeil, 0}})
      for (uint32_t n : {1u, 2u, 3u, 7u, 40u}) {
        if (m.global_shape.empty() && rule.kind == K::kChunk) continue;
        uint64_t total = 0;
        std::vector<Box> all;
        for (uint32_t i = 0; i < n; ++i) {
          uint64_t here = 0;
          for (const Box& b : PartBoxes(m.global_shape, rule, i, n)) {
            ASSERT_TRUE(CheckBoxInShape(b, m.global_shape).ok()) << b.ToString();
            for (const Box& o : all) EXPECT_FALSE(Intersect(o, b).has_value()) << m.name;
            all.push_back(b);
            here += static_cast<uint64_t>(b.numel());
          }
          EXPECT_EQ(PartElements(m.global_shape, rule, i, n), here) << m.name << " " << i;
          total += here;
        }
        EXPECT_EQ(total, static_cast<uint64_t>(NumElements(m.global_shape)))
            << m.name << " " << rule.ToString() << " / " << n;
      }
}

// Truncated chunks: every part floor(D / n) rows, disjoint, in order; the last D mod n rows
// in no part, and no part meets a box of them.
TEST(LayoutTemplate, TruncatedChunksLeaveTheRemainderToNoPart) {
  for (const TensorMeta& m : Model()) {
    if (m.global_shape.empty()) continue;
    for (uint8_t dim = 0; dim < std::min<size_t>(2, m.global_shape.size()); ++dim)
      for (uint32_t n : {1u, 2u, 3u, 7u, 40u}) {
        const SplitRule rule{K::kChunk, R::kTrunc, dim};
        SCOPED_TRACE(m.name + " " + rule.ToString() + " / " + std::to_string(n));
        const int64_t extent = m.global_shape[dim], per = extent / n;
        const uint64_t rest = static_cast<uint64_t>(NumElements(m.global_shape) / extent);
        uint64_t total = 0;
        for (uint32_t i = 0; i < n; ++i) {
          const std::vector<Box> boxes = PartBoxes(m.global_shape, rule, i, n);
          EXPECT_EQ(PartElements(m.global_shape, rule, i, n), static_cast<uint64_t>(per) * rest);
          if (per == 0) {
            EXPECT_TRUE(boxes.empty());
            continue;
          }
          ASSERT_EQ(boxes.size(), 1u);
          EXPECT_EQ(boxes[0].offsets[dim], per * i);
          EXPECT_EQ(boxes[0].lengths[dim], per);
          EXPECT_EQ(PartsMeeting(m.global_shape, rule, n, boxes[0]), std::vector<uint32_t>{i});
          total += static_cast<uint64_t>(boxes[0].numel());
        }
        EXPECT_EQ(total, static_cast<uint64_t>(per) * n * rest);
        if (per * n < extent) {
          Box tail = Box::Whole(m.global_shape);
          tail.offsets[dim] = per * n;
          tail.lengths[dim] = extent - per * n;
          EXPECT_TRUE(PartsMeeting(m.global_shape, rule, n, tail).empty());
        }
        // Every part meets the whole tensor, when it has rows.
        EXPECT_EQ(PartsMeeting(m.global_shape, rule, n, Box::Whole(m.global_shape)).size(),
                  per > 0 ? n : 0u);
      }
  }
  // The MANIFEST's template keeps the rule; only chunks truncate.
  LayoutTemplate t = Uniform(Model(), {K::kChunk, R::kTrunc, 0}, 4);
  auto back = DecodeTemplate(EncodeTemplate(t));
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, t);
  t.rules[0] = {K::kFlat, R::kTrunc, 0};
  EXPECT_FALSE(DecodeTemplate(EncodeTemplate(t)).ok());
}

TEST(LayoutTemplate, OtherLayoutsAreNotTemplates) {
  const std::vector<TensorMeta> model = Model();
  const LayoutTemplate t = Uniform(model, {K::kFlat, R::kCeil, 0}, 4);
  RankLayout l = ExpandTemplate(t, 1);
  ASSERT_TRUE(RecognizeLayout(l, 1, 4).has_value());
  // Held as part 1 by a rank the job numbers 2: no (n, index) explains it.
  EXPECT_FALSE(RecognizeLayout(l, 2, 4).has_value());
  // A box one element too long.
  RankLayout longer = l;
  longer.shards[0].box.lengths.back() += 1;
  EXPECT_FALSE(RecognizeLayout(longer, 1, 4).has_value());
  // The slot holds a tensor's boxes out of order.
  RankLayout swapped = l;
  std::swap(swapped.shards[0], swapped.shards.back());
  EXPECT_FALSE(RecognizeLayout(swapped, 1, 4).has_value());
  // Random boxes.
  std::mt19937_64 rng(7);
  int rejected = 0;
  for (int trial = 0; trial < 200; ++trial) {
    RankLayout x;
    x.tensors.push_back({"m", DType::kF32, {40, 30}});
    Box b = Box::Whole({40, 30});
    b.offsets[0] = static_cast<int64_t>(rng() % 39);
    b.lengths[0] = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(40 - b.offsets[0]));
    b.offsets[1] = static_cast<int64_t>(rng() % 29) + 1;
    b.lengths[1] = 1 + static_cast<int64_t>(rng() % static_cast<uint64_t>(30 - b.offsets[1]));
    x.shards.push_back({0, b});
    auto got = RecognizeLayout(x, 1, 8);
    if (!got) {
      ++rejected;
      continue;
    }
    // Whatever is recognised must expand to exactly this layout.
    EXPECT_EQ(EncodeRankLayout(ExpandTemplate(got->layout_template, got->index)),
              EncodeRankLayout(x));
  }
  EXPECT_GT(rejected, 150);
}

TEST(LayoutTemplate, EncodingRoundTripsAndEveryCorruptionIsAnError) {
  LayoutTemplate t = Uniform(Model(), {K::kChunk, R::kFloor, 0}, 6);
  t.rules[1] = {K::kFlat, R::kCeil, 0};
  const std::string bytes = EncodeTemplate(t);
  auto back = DecodeTemplate(bytes);
  ASSERT_TRUE(back.ok()) << back.status().ToString();
  EXPECT_EQ(*back, t);
  for (size_t n = 0; n < bytes.size(); ++n) {
    auto cut = DecodeTemplate(bytes.substr(0, n));
    EXPECT_FALSE(cut.ok()) << "truncated to " << n;
    if (!cut.ok()) {
      EXPECT_EQ(cut.status().code(), StatusCode::kCorruption);
    }
  }
  std::string extra = bytes + "x";
  EXPECT_FALSE(DecodeTemplate(extra).ok());
  // A chunk rule past the tensor's dimensions.
  LayoutTemplate bad = t;
  bad.rules[3] = {K::kChunk, R::kCeil, 1};  // "bias" is 1-d
  auto st = DecodeTemplate(EncodeTemplate(bad));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("'bias' has a bad split rule"), std::string::npos)
      << st.status().ToString();
  LayoutTemplate twice = t;
  twice.tensors[1].name = twice.tensors[0].name;
  st = DecodeTemplate(EncodeTemplate(twice));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("listed twice"), std::string::npos);
  EXPECT_FALSE(DecodeLayoutMessage("").ok());
  EXPECT_FALSE(DecodeLayoutMessage("T123").ok());
}

TEST(TemplatedPlan, FullyShardedJobsWriteEveryBoxOnceFromTheRankHoldingIt) {
  const std::vector<TensorMeta> model = Model();
  for (SplitRule rule : {SplitRule{K::kFlat, R::kCeil, 0}, SplitRule{K::kFlat, R::kFloor, 0},
                         SplitRule{K::kChunk, R::kCeil, 0}})
    for (int world : {1, 2, 3, 5, 8, 16, 40})
      // FSDP (n = world), and HSDP: 2 replicas of world / 2 shards (small parts: replicas
      // take turns writing them).
      for (int n : {world, world / 2}) {
        if (n < 1 || world % n != 0 || (n != world && n == 1)) continue;
        SCOPED_TRACE(rule.ToString() + ", " + std::to_string(world) + " ranks, " +
                     std::to_string(n) + " parts");
        const LayoutTemplate t = Uniform(model, rule, static_cast<uint32_t>(n));
        std::vector<RankLayout> layouts;
        for (int r = 0; r < world; ++r)
          layouts.push_back(ExpandTemplate(t, static_cast<uint32_t>(r % n)));
        Gathered g = Exchange(layouts);
        // Ranks whose part of every split tensor is empty hold only the scalar: another
        // template. Each distinct template is sent once.
        std::set<std::string> distinct(g.templates.begin(), g.templates.end());
        distinct.erase("");
        EXPECT_EQ(g.senders, static_cast<int>(distinct.size()));
        auto plan = PlanPersist(g.messages, g.templates, g.hashes);
        ASSERT_TRUE(plan.ok()) << plan.status().ToString();
        ASSERT_TRUE(plan->templated.has_value()) << plan->why_general;
        EXPECT_EQ(plan->layout_hashes, g.hashes);
        ExpectSameJobAsGeneralPlan(*plan, layouts);
        if (n != world) {
          // Both replicas write.
          const SavePlan& full = plan->Full();
          EXPECT_GT(full.writer_bytes[0], 0u);
          EXPECT_GT(full.writer_bytes[static_cast<size_t>(n)], 0u);
        }
      }
}

TEST(TemplatedPlan, EveryCaseItDoesNotHandleFallsBackToTheGeneralPlanner) {
  const std::vector<TensorMeta> model = Model();
  struct Case {
    const char* what;
    std::vector<RankLayout> layouts;
    const char* why;
  };
  std::vector<Case> cases;
  {
    // Tensor parallel 2 x data parallel 2: replicas hold the same 8 MiB half.
    const LayoutTemplate t = Uniform({{"w", DType::kF32, {4096, 1024}}, {"b", DType::kF32, {1024}}},
                                     {K::kChunk, R::kCeil, 0}, 2);
    Case c{"replicas", {}, "hold the same part 0 of tensor 'w', 8388608 bytes"};
    for (int r = 0; r < 4; ++r)
      c.layouts.push_back(ExpandTemplate(t, static_cast<uint32_t>(r % 2)));
    cases.push_back(c);
  }
  {
    // Rank 0 holds a flat range, rank 1 a row chunk of "w": two rules for one tensor.
    LayoutTemplate a = Uniform(model, {K::kFlat, R::kCeil, 0}, 2);
    LayoutTemplate b = a;
    b.rules[0] = {K::kChunk, R::kCeil, 1};
    cases.push_back({"rules disagree", {ExpandTemplate(a, 0), ExpandTemplate(b, 1)}, "embed"});
  }
  {
    // Rank 2 holds an irregular box: no template.
    const LayoutTemplate t = Uniform(model, {K::kFlat, R::kCeil, 0}, 3);
    Case c{"explicit",
           {ExpandTemplate(t, 0), ExpandTemplate(t, 1), ExpandTemplate(t, 2)},
           "not templates"};
    c.layouts[2].shards[0].box.lengths.back() -= 1;
    cases.push_back(c);
  }
  {
    // A large tensor held whole by every rank beside a sharded one.
    std::vector<TensorMeta> m = {{"big", DType::kF32, {1024, 1024}},
                                 {"sharded", DType::kF32, {64, 1024}}};
    LayoutTemplate t = Uniform(m, {K::kChunk, R::kCeil, 0}, 4);
    t.rules[0] = {};
    Case c{"large replicated tensor", {}, "'big' is held whole by several ranks"};
    for (int r = 0; r < 4; ++r) c.layouts.push_back(ExpandTemplate(t, static_cast<uint32_t>(r)));
    cases.push_back(c);
  }
  for (Case& c : cases) {
    SCOPED_TRACE(c.what);
    Gathered g = Exchange(c.layouts);
    auto plan = PlanPersist(g.messages, g.templates, g.hashes);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    EXPECT_FALSE(plan->templated.has_value());
    ASSERT_TRUE(plan->full.has_value());
    EXPECT_NE(plan->why_general.find(c.why), std::string::npos) << plan->why_general;
    ExpectCoveredOnce(*plan->full);
    // The templated layouts were expanded for the general planner: same unique boxes as
    // planning the explicit layouts.
    std::vector<std::string> encoded;
    for (const RankLayout& l : c.layouts) encoded.push_back(EncodeRankLayout(l));
    auto general = MakeSavePlan(encoded);
    ASSERT_TRUE(general.ok());
    EXPECT_EQ(UniqueBoxes(*plan->full), UniqueBoxes(*general));
    for (size_t r = 0; r < c.layouts.size(); ++r)
      for (const WritePiece& p : plan->PiecesOf(static_cast<int>(r))) {
        ASSERT_LT(p.slot_shard, c.layouts[r].shards.size());
        EXPECT_TRUE(Intersect(p.box, c.layouts[r].shards[p.slot_shard].box).has_value());
      }
  }
  // With templates off nothing is recognised.
  const LayoutTemplate t = Uniform(model, {K::kFlat, R::kCeil, 0}, 3);
  std::vector<RankLayout> fsdp;
  for (uint32_t r = 0; r < 3; ++r) fsdp.push_back(ExpandTemplate(t, r));
  Gathered g = Exchange(fsdp, /*templates=*/false);
  EXPECT_TRUE(g.templates.empty());
  auto plan = PlanPersist(g.messages, g.templates, g.hashes);
  ASSERT_TRUE(plan.ok());
  EXPECT_FALSE(plan->templated.has_value());
  EXPECT_TRUE(plan->why_general.empty());
}

TEST(TemplatedPlan, BadGathersAreErrorsNamingTheRank) {
  const LayoutTemplate t = Uniform(Model(), {K::kFlat, R::kCeil, 0}, 3);
  std::vector<RankLayout> layouts;
  for (uint32_t r = 0; r < 3; ++r) layouts.push_back(ExpandTemplate(t, r));
  const Gathered good = Exchange(layouts);
  ASSERT_TRUE(PlanPersist(good.messages, good.templates, good.hashes).ok());
  auto expect_error = [&](const Gathered& g, const std::string& says) {
    auto plan = PlanPersist(g.messages, g.templates, g.hashes);
    ASSERT_FALSE(plan.ok()) << says;
    EXPECT_NE(plan.status().message().find(says), std::string::npos) << plan.status().ToString();
  };
  Gathered g = good;
  g.templates[0].clear();  // the sender of the template sent nothing
  expect_error(g, "rank 0 sent no template");
  g = good;
  g.templates[0][g.templates[0].size() - 1] ^= 1;
  expect_error(g, "rank 0's template does not match its hash");
  g = good;
  g.templates.pop_back();
  expect_error(g, "templates gathered from 2 of 3 ranks");
  g = good;
  LayoutMessage m = *DecodeLayoutMessage(g.messages[2]);
  m.index = 3;
  g.messages[2] = EncodeLayoutMessage(m);
  expect_error(g, "rank 2 is part 3 of a template of 3");
  g = good;
  g.messages[1] = "Z";
  expect_error(g, "rank 1");
}

// A fully sharded step as the persister commits it in format 2: each writer's index
// (pieces laid end to end, one checksum per 64 KiB chunk) and the MANIFEST.
struct SavedStep {
  TemplatedPlan plan;
  pb::Manifest manifest;                   // format 2, as written
  std::map<int, std::string> index_files;  // data/<rank>.idx
  std::vector<LocationTable> tables;       // what format 1 would have carried
};
// Templates with cuts planned at any size (small jobs plan them the general way).
PlannerConfig AlwaysTemplates() {
  PlannerConfig c;
  c.cut_template_min_layouts = 0;
  return c;
}

SavedStep Save(const std::vector<RankLayout>& layouts) {
  Gathered g = Exchange(layouts);
  auto plan = PlanPersist(g.messages, g.templates, g.hashes, AlwaysTemplates());
  EXPECT_TRUE(plan.ok() && plan->templated.has_value());
  SavedStep s;
  s.plan = *plan->templated;
  std::vector<LocationTable> digests(layouts.size());
  s.tables.resize(layouts.size());
  const uint64_t chunk = 64 << 10;
  for (size_t r = 0; r < layouts.size(); ++r) {
    uint64_t at = 0;
    for (const WritePiece& p : s.plan.PiecesOf(static_cast<int>(r))) {
      LocationTable::Piece loc{at, {}};
      for (uint64_t c = 0; c * chunk < p.nbytes; ++c) loc.chunk_checksums.push_back(at * 31 + c);
      at += (p.nbytes + 4095) / 4096 * 4096;
      s.tables[r].pieces.push_back(loc);
    }
    s.tables[r].blobs.push_back({"who", at, 8, 42 + r});
    const std::string idx = EncodeWriterIndex(s.tables[r].pieces);
    s.index_files[static_cast<int>(r)] = idx;
    digests[r] = {Status::OK(),
                  true,
                  static_cast<uint32_t>(s.tables[r].pieces.size()),
                  idx.size(),
                  Checksum(idx.data(), idx.size()),
                  {},
                  s.tables[r].blobs};
  }
  auto m = BuildTemplatedManifest(s.plan, digests, "job", 7, chunk);
  EXPECT_TRUE(m.ok()) << m.status().ToString();
  auto back = DecodeManifest(EncodeManifest(*m));
  EXPECT_TRUE(back.ok()) << back.status().ToString();
  s.manifest = *back;
  return s;
}

// Every target element is in exactly one saved box of a partial manifest, and every box
// listed meets some target.
void ExpectCoversTargetsOnce(const pb::Manifest& part,
                             const std::vector<std::pair<std::string, Box>>& want) {
  auto saved_of = [](const pb::SavedBox& b) {
    return Box{{b.offsets().begin(), b.offsets().end()}, {b.lengths().begin(), b.lengths().end()}};
  };
  for (const auto& [name, box] : want) {
    int64_t covered = 0;
    for (const pb::SavedBox& b : part.boxes()) {
      if (part.tensors(static_cast<int>(b.tensor())).name() != name) continue;
      if (auto in = Intersect(saved_of(b), box)) covered += in->numel();
    }
    EXPECT_EQ(covered, box.numel()) << name << " " << box.ToString();
  }
  for (const pb::SavedBox& b : part.boxes()) {
    bool meets = false;
    for (const auto& [name, box] : want)
      meets = meets || (part.tensors(static_cast<int>(b.tensor())).name() == name &&
                        Intersect(saved_of(b), box).has_value());
    EXPECT_TRUE(meets) << saved_of(b).ToString();
  }
}

TEST(StepIndex, ExpandingTheManifestGivesTheFormatOneManifest) {
  const LayoutTemplate t = Uniform(Model(), {K::kFlat, R::kCeil, 0}, 8);
  std::vector<RankLayout> layouts;
  for (uint32_t r = 0; r < 8; ++r) layouts.push_back(ExpandTemplate(t, r));
  SavedStep s = Save(layouts);
  EXPECT_EQ(s.manifest.format_version(), kTemplatedManifestVersion);
  EXPECT_EQ(s.manifest.boxes_size(), 0);
  int reads = 0;
  auto full = ExpandManifest(s.manifest, [&](int w) -> Result<std::string> {
    ++reads;
    return s.index_files.at(w);
  });
  ASSERT_TRUE(full.ok()) << full.status().ToString();
  EXPECT_EQ(reads, 8);
  auto v1 = BuildManifest(s.plan.Expand(), s.tables, "job", 7, 64 << 10);
  ASSERT_TRUE(v1.ok());
  EXPECT_EQ(full->SerializeAsString(), v1->SerializeAsString());
}

TEST(StepIndex, ARankReadsOnlyTheIndexFilesOfThePartsItsTargetsMeet) {
  const std::vector<TensorMeta> model = Model();
  const int world = 16;
  const LayoutTemplate t = Uniform(model, {K::kFlat, R::kCeil, 0}, world);
  std::vector<RankLayout> layouts;
  for (int r = 0; r < world; ++r) layouts.push_back(ExpandTemplate(t, static_cast<uint32_t>(r)));
  SavedStep s = Save(layouts);
  // Restored onto 16 (the same parts), 5 (flat ranges across several saved ones) and 2
  // ranks with the rows of each matrix split in 2 (chunks of dim 0).
  for (auto [n, rule] : {std::pair{16u, SplitRule{K::kFlat, R::kCeil, 0}},
                         std::pair{5u, SplitRule{K::kFlat, R::kFloor, 0}},
                         std::pair{2u, SplitRule{K::kChunk, R::kCeil, 0}}})
    for (uint32_t r = 0; r < n; ++r) {
      SCOPED_TRACE(rule.ToString() + " " + std::to_string(r) + " of " + std::to_string(n));
      const RankLayout target = ExpandTemplate(Uniform(model, rule, n), r);
      std::vector<std::pair<std::string, Box>> want;
      for (const auto& e : target.shards) want.push_back({target.tensors[e.tensor].name, e.box});
      std::set<int> read;
      uint64_t index_bytes = 0;
      auto part = PartialManifest(
          s.manifest, want, static_cast<int>(r),
          [&](int w) -> Result<std::string> {
            read.insert(w);
            return s.index_files.at(w);
          },
          &index_bytes);
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      ExpectCoversTargetsOnce(*part, want);
      for (const pb::SavedBox& b : part->boxes())
        EXPECT_EQ(part->files(static_cast<int>(b.file())),
                  DataFileName(static_cast<int>(b.writer())));
      // Its own blobs, in its data file.
      ASSERT_EQ(part->blobs_size(), 1);
      EXPECT_EQ(part->files(static_cast<int>(part->blobs(0).file())),
                DataFileName(static_cast<int>(r)));
      uint64_t expect_bytes = 0;
      for (int w : read) expect_bytes += s.index_files.at(w).size();
      EXPECT_EQ(index_bytes, expect_bytes);
      if (n == 16) {
        // Its own parts; the scalar's writer, rank 0.
        EXPECT_EQ(read, (std::set<int>{0, static_cast<int>(r)}));
      } else if (n == 5) {
        EXPECT_LE(read.size(), 6u);  // 16 / 5 parts and the boundaries, and rank 0
      } else {
        // A row half is a contiguous half of each tensor's flat order: about half the
        // writers, and those of the small tensors.
        EXPECT_LT(read.size(), 16u);
      }
    }
}

TEST(LayoutTemplate, CutsDescribeFsdp2OverTensorParallelismExactly) {
  for (auto [fsdp, tp, replicas] : {std::tuple{3, 2, 1}, {2, 3, 1}, {4, 2, 1}, {3, 2, 2}}) {
    const std::vector<RankLayout> job = Fsdp2OverTpJob(fsdp, tp, replicas);
    const int world = static_cast<int>(job.size());
    for (int r = 0; r < world; ++r) {
      SCOPED_TRACE("rank " + std::to_string(r) + " of " + std::to_string(fsdp) + " x " +
                   std::to_string(tp) + " x " + std::to_string(replicas));
      auto got = RecognizeLayout(job[static_cast<size_t>(r)], r, world);
      ASSERT_TRUE(got.has_value());
      EXPECT_EQ(EncodeRankLayout(ExpandTemplate(got->layout_template, got->index)),
                EncodeRankLayout(job[static_cast<size_t>(r)]));
      auto back = DecodeTemplate(EncodeTemplate(got->layout_template));
      ASSERT_TRUE(back.ok()) << back.status().ToString();
      EXPECT_EQ(*back, got->layout_template);
    }
  }
  // A part the cuts leave some digits of: the TP-replicated norm of rank (i, j) is held by
  // the tp ranks of FSDP index i.
  SplitRule norm;
  norm.kind = K::kCuts;
  norm.cuts = {{0, R::kCeil, 2, 3}};  // dimension 0, by digit i / 2 % 3, of 6 parts
  ASSERT_TRUE(CheckCuts(norm, 1, 6).ok());
  EXPECT_EQ(SharingOffsets(norm, 6), (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(PartRep(norm, 5), 4u);
  EXPECT_EQ(PartsMeeting({5}, norm, 6, Box{{1}, {2}}), (std::vector<uint32_t>{0, 2}));
  // Digits that overlap, a cut past the parts, a dimension past the tensor's: refused.
  SplitRule bad = norm;
  bad.cuts = {{0, R::kCeil, 1, 4}, {0, R::kCeil, 2, 2}};
  EXPECT_FALSE(CheckCuts(bad, 1, 8).ok());
  bad.cuts = {{0, R::kCeil, 4, 4}};
  EXPECT_FALSE(CheckCuts(bad, 1, 8).ok());
  bad.cuts = {{1, R::kCeil, 1, 2}};
  EXPECT_FALSE(CheckCuts(bad, 1, 8).ok());
  LayoutTemplate t;
  t.tensors = {{"norm", DType::kF32, {5}}};
  t.rules = {norm};
  t.parts = 6;
  ASSERT_TRUE(DecodeTemplate(EncodeTemplate(t)).ok());
  // A template that claims 4e9 parts (a damaged MANIFEST's) costs a plan its ranks only.
  LayoutTemplate huge = t;
  huge.parts = 4000000000u;
  huge.rules[0].cuts = {{0, R::kCeil, 2, 2}};
  ASSERT_TRUE(DecodeTemplate(EncodeTemplate(huge)).ok());
  std::string why;
  auto plan = MakeTemplatedPlan({huge}, {0, 0}, {0, 1}, {1, 2}, nullptr, &why);
  ASSERT_TRUE(plan.has_value()) << why;
  EXPECT_EQ(plan->sharing[0], (std::vector<uint32_t>{0, 1}));
  EXPECT_EQ(PartsMeeting({5}, huge.rules[0], huge.parts, Box{{0}, {5}}, 2),
            (std::vector<uint32_t>{0}));
  t.rules[0].cuts[0].stride = 4;  // 4 x 3 places in 6 parts
  auto st = DecodeTemplate(EncodeTemplate(t));
  ASSERT_FALSE(st.ok());
  EXPECT_NE(st.status().message().find("'norm' has bad cuts"), std::string::npos)
      << st.status().ToString();
}

TEST(TemplatedPlan, Fsdp2OverTensorParallelismWritesEveryBoxOnceWithTemplates) {
  for (auto [fsdp, tp, replicas, stages] :
       {std::tuple{3, 2, 1, 1}, {2, 3, 1, 1}, {4, 2, 1, 1}, {3, 2, 2, 1}, {3, 2, 1, 3}}) {
    SCOPED_TRACE(std::to_string(fsdp) + " x " + std::to_string(tp) + " x " +
                 std::to_string(replicas) + ", " + std::to_string(stages) + " stages");
    const std::vector<RankLayout> layouts = Fsdp2OverTpJob(fsdp, tp, replicas, stages);
    Gathered g = Exchange(layouts);
    auto plan = PlanPersist(g.messages, g.templates, g.hashes, AlwaysTemplates());
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_TRUE(plan->templated.has_value()) << plan->why_general;
    ExpectSameJobAsGeneralPlan(*plan, layouts);
    // By default a job this small is planned the general way, and says why.
    auto general = PlanPersist(g.messages, g.templates, g.hashes);
    ASSERT_TRUE(general.ok());
    EXPECT_FALSE(general->templated.has_value());
    EXPECT_NE(general->why_general.find("from which templates with cuts are used"),
              std::string::npos)
        << general->why_general;
  }
}

// Tensor parallelism that drops the remainder (bench/plan's irregular Megatron layout: each
// of tp ranks holds D / tp rows or columns of a split tensor, no rank the last D mod tp) over
// pipeline stages; `tp` of the loading job may differ.
std::vector<RankLayout> TruncatedTpJob(int tp, int stages) {
  std::vector<RankLayout> layouts(static_cast<size_t>(tp * stages));
  for (int r = 0; r < tp * stages; ++r) {
    RankLayout& l = layouts[static_cast<size_t>(r)];
    const std::string stage = "stage" + std::to_string(r / tp) + ".";
    for (auto [name, shape, dim] :
         {std::tuple{"qkv", Shape{37, 6}, 0}, {"proj", Shape{6, 23}, 1}, {"norm", Shape{6}, -1}}) {
      Box b = Box::Whole(shape);
      if (dim >= 0) {
        const int64_t per = shape[static_cast<size_t>(dim)] / tp;
        b.offsets[static_cast<size_t>(dim)] = per * (r % tp);
        b.lengths[static_cast<size_t>(dim)] = per;
      }
      l.shards.push_back({static_cast<uint32_t>(l.tensors.size()), b});
      l.tensors.push_back({stage + name, DType::kF32, shape});
    }
  }
  return layouts;
}

// Planned from templates (rank 0's rows are also a floor chunk, the others' only truncated
// ones: the plan settles on truncation), as the general planner plans it, the rows no rank
// holds written by none.
TEST(TemplatedPlan, TensorParallelismDroppingTheRemainderIsPlannedFromTemplates) {
  for (auto [tp, stages] : {std::pair{3, 1}, {5, 2}, {7, 3}}) {
    SCOPED_TRACE(std::to_string(tp) + " x " + std::to_string(stages));
    const std::vector<RankLayout> layouts = TruncatedTpJob(tp, stages);
    Gathered g = Exchange(layouts);
    auto plan = PlanPersist(g.messages, g.templates, g.hashes);
    ASSERT_TRUE(plan.ok()) << plan.status().ToString();
    ASSERT_TRUE(plan->templated.has_value()) << plan->why_general;
    const TemplatedPlan& t = *plan->templated;
    for (size_t k = 0; k < t.tensors.size(); ++k) {
      if (!t.rules[k].split()) continue;
      EXPECT_EQ(t.rules[k].round, R::kTrunc) << t.tensors[k].name;
    }
    ExpectSameJobAsGeneralPlan(*plan, layouts);
    // qkv's 37 - 37 / tp * tp rows and proj's columns are not written.
    const uint64_t held =
        static_cast<uint64_t>(stages) * (37 / tp * tp * 6 + 6 * (23 / tp * tp) + 6) * sizeof(float);
    EXPECT_EQ(plan->Full().unique_bytes, held);
  }
}

// Two pipeline stages of 4 ranks, each tensor of a stage cut in ceil chunks of 4: the last
// rank's rows are also a floor chunk of 8 (the job's size), and recognition, trying the
// larger count first, names it part 7 of 8. The plan describes it again as part 3 of 4, as
// its stage's other ranks are (a restore onto 8,000 ranks of bench/plan --mode pp-fsdp went
// job-wide for this), and plans from templates what the general planner plans.
TEST(TemplatedPlan, ARankWhosePartAlsoFitsAnotherPartCountIsDescribedAsItsStage) {
  std::vector<RankLayout> layouts(8);
  for (int r = 0; r < 8; ++r) {
    RankLayout& l = layouts[static_cast<size_t>(r)];
    for (auto [name, rows] : {std::pair{"a", 7}, std::pair{"b", 14}}) {
      TensorMeta m{"stage" + std::to_string(r / 4) + "." + name, DType::kF32, {rows}};
      for (Box& b :
           PartBoxes(m.global_shape, {K::kChunk, R::kCeil, 0}, static_cast<uint32_t>(r % 4), 4))
        l.shards.push_back({static_cast<uint32_t>(l.tensors.size()), std::move(b)});
      l.tensors.push_back(std::move(m));
    }
  }
  auto last = RecognizeLayout(layouts[7], 7, 8);
  ASSERT_TRUE(last.has_value());
  EXPECT_EQ(last->layout_template.parts, 8u);  // the ambiguity
  auto as_stage = RecognizeLayout(layouts[7], 7, 8, 4);
  ASSERT_TRUE(as_stage.has_value());
  EXPECT_EQ(as_stage->index, 3u);
  Gathered g = Exchange(layouts);
  auto plan = PlanPersist(g.messages, g.templates, g.hashes);
  ASSERT_TRUE(plan.ok()) << plan.status().ToString();
  ASSERT_TRUE(plan->templated.has_value()) << plan->why_general;
  const TemplatedPlan& tp = *plan->templated;
  for (size_t r = 0; r < 8; ++r) {
    EXPECT_EQ(tp.templates[tp.rank_template[r]].parts, 4u) << "rank " << r;
    EXPECT_EQ(tp.rank_index[r], r % 4) << "rank " << r;
  }
  ExpectSameJobAsGeneralPlan(*plan, layouts);
}

TEST(StepIndex, Fsdp2OverTensorParallelismRestoresOntoAnotherMeshFromTheIndexFiles) {
  SavedStep s = Save(Fsdp2OverTpJob(3, 2));
  // Onto 2 x 3, 4 x 2 and 1 x 1 (one rank: everything).
  for (auto [fsdp, tp] : {std::pair{2, 3}, {4, 2}, {1, 1}}) {
    const std::vector<RankLayout> targets = Fsdp2OverTpJob(fsdp, tp);
    for (size_t r = 0; r < targets.size(); ++r) {
      SCOPED_TRACE(std::to_string(r) + " of " + std::to_string(fsdp) + " x " + std::to_string(tp));
      std::vector<std::pair<std::string, Box>> want;
      for (const auto& e : targets[r].shards)
        want.push_back({targets[r].tensors[e.tensor].name, e.box});
      auto part = PartialManifest(
          s.manifest, want, static_cast<int>(r),
          [&](int w) -> Result<std::string> { return s.index_files.at(w); }, nullptr);
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      ExpectCoversTargetsOnce(*part, want);
    }
  }
}

TEST(StepIndex, TensorParallelismDroppingTheRemainderRestoresWhatWasSaved) {
  SavedStep s = Save(TruncatedTpJob(5, 2));
  auto read = [&](const std::vector<std::pair<std::string, Box>>& want, int r) {
    return PartialManifest(
        s.manifest, want, r, [&](int w) -> Result<std::string> { return s.index_files.at(w); },
        nullptr);
  };
  // Onto its own layout, and onto 7-way TP (of qkv's 37 rows 0-34 saved, 35 wanted; of
  // proj's 23 columns 0-19 saved and 21 wanted: the targets take what was saved).
  for (int tp : {5, 7}) {
    const std::vector<RankLayout> targets = TruncatedTpJob(tp, 2);
    for (size_t r = 0; r < targets.size(); ++r) {
      SCOPED_TRACE(std::to_string(r) + " of " + std::to_string(tp));
      std::vector<std::pair<std::string, Box>> want;
      for (const auto& e : targets[r].shards) {
        Box b = e.box;
        // What the saving job holds of it: qkv's first 35 rows, proj's first 20 columns.
        const std::string& name = targets[r].tensors[e.tensor].name;
        const size_t dim = name.ends_with("qkv") ? 0 : 1;
        const int64_t end = name.ends_with("qkv") ? 35 : name.ends_with("proj") ? 20 : 6;
        if (name.ends_with("norm")) {
          want.push_back({name, b});
          continue;
        }
        b.lengths[dim] = std::min(b.offsets[dim] + b.lengths[dim], end) - b.offsets[dim];
        if (b.lengths[dim] > 0) want.push_back({name, b});
      }
      auto part = read(want, static_cast<int>(r));
      ASSERT_TRUE(part.ok()) << part.status().ToString();
      ExpectCoversTargetsOnce(*part, want);
    }
  }
  // A target of the rows no rank held finds nothing saved there.
  auto part = read({{"stage1.qkv", Box{{35, 0}, {2, 6}}}}, 0);
  ASSERT_TRUE(part.ok()) << part.status().ToString();
  EXPECT_EQ(part->boxes_size(), 0);
}

TEST(StepIndex, ABadIndexFileOrManifestIsAnErrorNamingIt) {
  const LayoutTemplate t = Uniform(Model(), {K::kChunk, R::kCeil, 0}, 4);
  std::vector<RankLayout> layouts;
  for (uint32_t r = 0; r < 4; ++r) layouts.push_back(ExpandTemplate(t, r));
  SavedStep s = Save(layouts);
  std::vector<std::pair<std::string, Box>> all;
  for (const TensorMeta& m : Model()) all.push_back({m.name, Box::Whole(m.global_shape)});
  auto expect = [&](std::map<int, std::string> files, const std::string& says) {
    auto part = PartialManifest(s.manifest, all, -1,
                                [&](int w) -> Result<std::string> { return files.at(w); });
    ASSERT_FALSE(part.ok()) << says;
    EXPECT_EQ(part.status().code(), StatusCode::kCorruption);
    EXPECT_NE(part.status().message().find(says), std::string::npos) << part.status().ToString();
    auto full =
        ExpandManifest(s.manifest, [&](int w) -> Result<std::string> { return files.at(w); });
    EXPECT_FALSE(full.ok());
  };
  auto files = s.index_files;
  files[2][10] ^= 1;
  expect(files, "data/2.idx");
  files = s.index_files;
  files[3].pop_back();
  expect(files, "data/3.idx");
  // A well-formed index whose checksums are not the ones committed (a stale or rewritten
  // file): only the MANIFEST's digest tells.
  files = s.index_files;
  auto stale = *DecodeWriterIndex(files[0]);
  stale[0].chunk_checksums[0] ^= 1;
  files[0] = EncodeWriterIndex(stale);
  expect(files, "data/0.idx: " + std::to_string(files[0].size()) +
                    " bytes that do not match the MANIFEST's length");
  // A writer that reports a piece too few (its file consistent with its own digest).
  SavedStep fewer = s;
  auto pieces = *DecodeWriterIndex(s.index_files.at(1));
  pieces.pop_back();
  fewer.index_files[1] = EncodeWriterIndex(pieces);
  fewer.manifest.set_index_bytes(1, fewer.index_files[1].size());
  fewer.manifest.set_index_checksums(
      1, Checksum(fewer.index_files[1].data(), fewer.index_files[1].size()));
  fewer.manifest.set_index_pieces(1, static_cast<uint32_t>(pieces.size()));
  auto part = PartialManifest(fewer.manifest, all, -1, [&](int w) -> Result<std::string> {
    return fewer.index_files.at(w);
  });
  ASSERT_FALSE(part.ok());
  EXPECT_NE(part.status().message().find("data/1.idx"), std::string::npos)
      << part.status().ToString();
  // MANIFEST fields out of range.
  pb::Manifest bad = s.manifest;
  bad.set_rank_index(2, 9);
  EXPECT_FALSE(ValidateManifest(bad).ok());
  bad = s.manifest;
  bad.mutable_index_bytes()->RemoveLast();
  EXPECT_FALSE(ValidateManifest(bad).ok());
  bad = s.manifest;
  bad.set_templates(0, "CLT1");
  EXPECT_FALSE(ValidateManifest(bad).ok());
  bad = s.manifest;
  bad.add_boxes();
  EXPECT_FALSE(ValidateManifest(bad).ok());
}

}  // namespace
}  // namespace cairn
