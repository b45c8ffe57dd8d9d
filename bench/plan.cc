// bench/plan: the SavePlanner and MANIFEST building for a simulated large job (no I/O).
//
// A Megatron-like layout: TP x PP x DP ranks (default 8 x 10 x 125 = 10,000), each holding
// 1,000 shards: 20 transformer layers of its pipeline stage (weights split over TP rows or
// columns, biases and norms replicated over TP), each with fp32 master weights and two
// Adam moments, plus 40 small replicated buffers. Data-parallel replicas hold identical
// lists, as in Megatron without the distributed optimizer.
// Or, with --fully-sharded N: FSDP / ZeRO-3 on N ranks: the whole model (20 layers and the
// buffers: 1,000 tensors), each tensor's row-major elements cut into N flat ranges, rank r
// holding range r (1 to 3 boxes per tensor): every layout distinct, no box held twice;
// restored onto the same N ranks (load_plan_same_layout_s) and onto --load-ranks.
// Or, with --mode, the layouts of FSDP2 jobs (DTensor Shard(0): each part a chunk of
// dimension 0, ceil-sized), restored onto the same job and onto --load-fsdp (default 4/5):
//   pp-fsdp     --pp stages x --fsdp ranks; a rank holds its stage's 1,000 tensors only
//   pp-fsdp-tp  the same x --tp tensor-parallel ranks (innermost), FSDP2 over the TP
//               parts: row-parallel weights cut in two dimensions, column-parallel ones a
//               chunk of a chunk of dimension 0, TP-replicated ones held by --tp ranks each
//   hsdp        --dp replicas x --fsdp ranks of the whole 1,000-tensor model
// "plan_path" says which planner planned and why.
//
// What is timed is what the persister does on a rank (every rank computes the same plan):
//   plan_s         MakeSavePlan from the gathered layouts: each distinct layout once (the
//                  lowest rank of each sends it), the others known by their hash
//   cached_plan_s  a later round with the layout unchanged: encode and hash this rank's
//                  layout, compare all ranks' hashes with the cached plan's
//   manifest_s     rank 0: BuildManifest from every rank's location table + EncodeManifest
//   agree_s        a restore's discovery and agreement as each rank runs them after the
//                  inventory allgather: decode every rank's inventory (its own 3 newest
//                  versions and the 3 of its ring partner on the previous node, 8 ranks per
//                  node; rank 0 also lists 2 PFS steps), then choose the step; with
//                  inventory_bytes, what that allgather brings each rank
//   restore_metadata_bytes   what one rank of the loading job receives before it can plan
//                  a restore from the PFS today: every rank's inventory, the step's whole
//                  MANIFEST (broadcast from rank 0) and each distinct target layout
//   catalog_s      what every restoring rank does with that MANIFEST once rank 0 has
//                  broadcast it: decode it and build the load planner's catalog of pieces
//   load_plan_s    restoring that step onto --load-tp x --load-pp x --load-dp ranks (default
//                  4 x 20 x 100 = 8,000) of another layout: decode the distinct target
//                  layouts, MakeLoadPlan over the PFS pieces (box intersection through the
//                  per-tensor index, runs, readers) and rank 0's part of it (ForRank)
// Last line: one JSON object.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <map>
#include <optional>
#include <set>
#include <string>
#include <tuple>
#include <unordered_map>
#include <vector>

#include "bench/bench_util.h"
#include "bench/plan_util.h"
#include "cli/args.h"
#include "core/arith.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "layout/load_planner.h"
#include "layout/memory_plan.h"
#include "layout/save_planner.h"
#include "layout/templated_plan.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/step_index.h"
#include "recovery/restore_agree.h"
#include "recovery/restore_wire.h"

using namespace cairn;

namespace {

struct Args {
  int tp = 8, pp = 10, dp = 125;
  int layers_per_stage = 20;
  int64_t hidden = 8192;
  int repeats = 3;
  int load_tp = 4, load_pp = 20, load_dp = 100;
  int fully_sharded = 0;  // > 0: that many ranks, each a flat 1/n of every tensor
  int load_ranks = 0;     // fully sharded: the loading job's ranks (0: 4/5 of them)
  // --mode: megatron (TP x PP x DP as above, or --fully-sharded), pp-fsdp, pp-fsdp-tp, hsdp.
  std::string mode = "megatron";
  int fsdp = 0, load_fsdp = 0;  // the FSDP2 degree of the new modes (0 at load: 4/5 of it)
  bool no_templates = false;
  bool save_only = false;
};

constexpr int kBuffersPerStage = 40;

// The layout of rank (tp, pp) of a tp_size-way tensor-parallel job with `layers` layers
// per stage; it also holds the buffers of saved stage `buffers_of` (none if < 0).
RankLayout StageLayout(const Args& a, int tp_size, int layers, int tp, int pp, int buffers_of) {
  RankLayout l;
  auto add = [&](const std::string& name, DType dt, Shape shape, int split_dim) {
    Box b = Box::Whole(shape);
    if (split_dim >= 0) {
      const int64_t part = shape[static_cast<size_t>(split_dim)] / tp_size;
      b.offsets[static_cast<size_t>(split_dim)] = part * tp;
      b.lengths[static_cast<size_t>(split_dim)] = part;
    }
    l.shards.push_back({static_cast<uint32_t>(l.tensors.size()), b});
    l.tensors.push_back({name, dt, std::move(shape)});
  };
  const int64_t h = a.hidden;
  struct P {
    const char* name;
    Shape shape;
    int split;
  };
  const std::vector<P> params = {{"attn.qkv.weight", {3 * h, h}, 0},
                                 {"attn.qkv.bias", {3 * h}, 0},
                                 {"attn.proj.weight", {h, h}, 1},
                                 {"attn.proj.bias", {h}, -1},
                                 {"mlp.fc1.weight", {4 * h, h}, 0},
                                 {"mlp.fc1.bias", {4 * h}, 0},
                                 {"mlp.fc2.weight", {h, 4 * h}, 1},
                                 {"mlp.fc2.bias", {h}, -1},
                                 {"ln1.weight", {h}, -1},
                                 {"ln1.bias", {h}, -1},
                                 {"ln2.weight", {h}, -1},
                                 {"ln2.bias", {h}, -1}};
  for (int i = 0; i < layers; ++i) {
    const std::string layer = "layers." + std::to_string(pp * layers + i) + ".";
    for (const P& p : params) {
      add("model." + layer + p.name, DType::kBF16, p.shape, p.split);
      add("optim.master." + layer + p.name, DType::kF32, p.shape, p.split);
      add("optim.exp_avg." + layer + p.name, DType::kF32, p.shape, p.split);
      add("optim.exp_avg_sq." + layer + p.name, DType::kF32, p.shape, p.split);
    }
  }
  for (int i = 0; buffers_of >= 0 && i < kBuffersPerStage; ++i)
    add("buffers.stage" + std::to_string(buffers_of) + "." + std::to_string(i), DType::kF32, {1024},
        -1);
  return l;
}

// Rank `r` of an n-rank fully sharded job (FSDP / ZeRO-3): the whole model (`layers`
// layers and the buffers), each tensor's row-major elements cut into n contiguous flat
// ranges (ceil division, the last ones shorter or empty), rank r holding range r as boxes;
// a tensor whose range is empty is not in the layout (a host slot holds no empty shard).
RankLayout FlatLayout(const Args& a, int layers, int n, int r) {
  LayoutTemplate t;
  t.tensors = StageLayout(a, 1, layers, 0, 0, 0).tensors;
  t.rules.assign(t.tensors.size(), {SplitRule::Kind::kFlat, SplitRule::Round::kCeil, 0});
  t.parts = static_cast<uint32_t>(n);
  return ExpandTemplate(t, static_cast<uint32_t>(r));
}

// Rank (stage, i, j) of a job with pipeline stages, FSDP2 over `fsdp` ranks and tensor
// parallelism over `tp`: stage `stage`'s tensors (20 layers and its buffers), each cut by
// tensor parallelism as StageLayout cuts it (rows or columns; biases and norms replicated),
// then the TP part's dimension 0 chunked over the FSDP ranks as FSDP2 does (DTensor
// Shard(0): ceil-sized chunks, the last ones shorter or empty). With TP rows that is a
// chunk of a chunk of dimension 0 (a strided shard); with TP columns a box cut in two
// dimensions. A tensor whose part is empty is not in the layout.
RankLayout ShardedStageLayout(const Args& a, int stage, int fsdp, int i, int tp, int j) {
  const RankLayout cut = StageLayout(a, tp, a.layers_per_stage, j, stage, stage);
  RankLayout l;
  for (const RankLayout::Entry& e : cut.shards) {
    Box b = e.box;
    const int64_t rows = b.lengths[0], chunk = (rows + fsdp - 1) / fsdp;
    const int64_t lo = chunk * i;
    if (lo >= rows) continue;
    b.offsets[0] += lo;
    b.lengths[0] = std::min(chunk, rows - lo);
    l.shards.push_back({static_cast<uint32_t>(l.tensors.size()), std::move(b)});
    l.tensors.push_back(cut.tensors[e.tensor]);
  }
  return l;
}

// What the persister's layout gathers bring a rank (layout/templated_plan.h).
struct Gathered {
  std::vector<std::string> messages, templates;
  std::vector<uint64_t> hashes;
  uint64_t bytes = 0;  // received by each rank, both gathers
};

// Rank r's message and hash, as the persister makes them from its layout; *tmpl is its
// template's encoding when it has one.
void Describe(const RankLayout& l, int r, int world, bool templates, std::string* message,
              uint64_t* hash, std::string* tmpl) {
  LayoutMessage m;
  const std::string encoded = EncodeRankLayout(l);
  auto rec = templates ? RecognizeLayout(l, r, world) : std::nullopt;
  tmpl->clear();
  if (rec) {
    *tmpl = EncodeTemplate(rec->layout_template);
    m.templated = true;
    m.template_hash = TemplateHash(*tmpl);
    m.index = rec->index;
    *hash = TemplatedLayoutHash(m.template_hash, m.index);
  } else {
    m.layout = encoded;
    *hash = LayoutHash(encoded);
  }
  *message = EncodeLayoutMessage(m);
}

// Format 2 as the writers of a templated plan would leave it: each writer's pieces laid
// end to end in its data file, their index file, and the digest it reports to rank 0.
struct SimulatedIndex {
  std::vector<std::string> files;      // per writer
  std::vector<LocationTable> digests;  // per writer
  uint64_t total_bytes = 0, pieces = 0, bytes = 0;
};
void SimulateIndexFiles(const TemplatedPlan& plan, uint64_t chunk, SimulatedIndex* out) {
  const int world = plan.world_size();
  out->files.resize(static_cast<size_t>(world));
  out->digests.resize(static_cast<size_t>(world));
  for (int w = 0; w < world; ++w) {
    std::vector<LocationTable::Piece> locs;
    uint64_t at = 0;
    for (const WritePiece& p : plan.PiecesOf(w)) {
      locs.push_back({at, std::vector<uint64_t>(CeilDiv(p.nbytes, chunk), 0x1234567890abcdefull)});
      at += RoundUp(p.nbytes, kPfsAlign);
      out->bytes += p.nbytes;
    }
    std::string& f = out->files[static_cast<size_t>(w)];
    f = EncodeWriterIndex(locs);
    LocationTable& d = out->digests[static_cast<size_t>(w)];
    d.indexed = true;
    d.index_pieces = static_cast<uint32_t>(locs.size());
    d.index_bytes = f.size();
    d.index_checksum = Checksum(f.data(), f.size());
    d.blobs.push_back({"rng", at, 5000, 42});
    out->total_bytes += f.size();
    out->pieces += locs.size();
  }
}

// A memory restore of the fully sharded step (host tiers and peers), planned by each rank
// alone (layout/memory_plan.h): source s's version is held by rank s and by its ring
// partner on the next node, s + 8; onto n ranks of another layout, by ranks s mod n and
// (s + 8) mod n. `lost`: node 1 (ranks 8..15) lost its memory and restarted empty.
struct MemoryRestore {
  uint64_t gather_bytes = 0;  // what the two gathers and the final check bring each rank
  double catalog_s = 0;       // decode every rank's references and the templates, build plans
  double plan_s = 0;          // the slowest sampled rank: PlanMemoryAlone + its RankLoad
  uint64_t general_layout_bytes = 0;  // the general path's layout gather alone, per rank
};

constexpr int kMemoryPerNode = 8;

// Who holds each of `world` sources' versions when `n` ranks restore: source s is held by
// ranks s mod n and (s + 8) mod n (its ring partner on the next node); with `lost`, node 1
// (ranks 8..15) lost its memory and restarted empty.
Result<std::vector<std::vector<int>>> MemoryHolders(int world, int n, bool lost) {
  auto gone = [&](int r) { return lost && r >= kMemoryPerNode && r < 2 * kMemoryPerNode; };
  std::vector<std::vector<int>> holders(static_cast<size_t>(world));
  for (int s = 0; s < world; ++s) {
    auto& h = holders[static_cast<size_t>(s)];
    for (int x : {s % n, (s + kMemoryPerNode) % n})
      if (!gone(x)) h.push_back(x);
    std::sort(h.begin(), h.end());
    h.erase(std::unique(h.begin(), h.end()), h.end());
    if (h.empty()) return Status::Internal("source " + std::to_string(s) + " held nowhere");
  }
  return holders;
}

// The sampled ranks plan alone (out->plan_s: the slowest median): with a lost node, a lost
// rank, its partner and one untouched; otherwise the first, middle and last. A lost rank
// must receive everything, and with `only_partner` (no part held by several sources: its
// version's bytes are nowhere else) all from its partner.
Status TimeMemoryPlans(const Args& a, const TemplatedMemoryStep& step, int n, bool lost,
                       bool only_partner, MemoryRestore* out) {
  using namespace cairn::restore_internal;
  const int k = kMemoryPerNode;
  const std::vector<int> sample =
      lost ? std::vector<int>{k % n, (2 * k) % n, 0} : std::vector<int>{0, n / 2, n - 1};
  for (int r : sample) {
    std::vector<double> t;
    RankLoad load;
    for (int rep = 0; rep < a.repeats; ++rep) {
      const int64_t t0 = NowNanos();
      CAIRN_ASSIGN_OR_RETURN(MemoryPlanAlone mp, PlanMemoryAlone(step, r));
      load = ForRank(mp.plan, mp.cat, r);
      t.push_back(NanosToSeconds(NowNanos() - t0));
    }
    std::sort(t.begin(), t.end());
    out->plan_s = std::max(out->plan_s, t[t.size() / 2]);
    if (load.gets.empty()) return Status::Internal("rank " + std::to_string(r) + " gets nothing");
    if (lost && r >= k && r < 2 * k)
      for (const RankLoad::Get& g : load.gets)
        if (g.how != RankLoad::How::kRecv || (only_partner && g.from != (r + k) % n))
          return Status::Internal("lost rank " + std::to_string(r) + " not fed by its partner");
  }
  return Status::OK();
}

Status MemoryRestores(const Args& a, int world, int n, bool lost, MemoryRestore* out) {
  using namespace cairn::restore_internal;
  TemplatedMemoryStep step;
  step.step = 1000;
  step.chunk_bytes = 4ull << 20;
  CAIRN_ASSIGN_OR_RETURN(step.holders, MemoryHolders(world, n, lost));
  // Gather 1 (each rank's references) and gather 2 (each template once), as sent.
  auto tmpl = [&](int world_of) -> Result<std::string> {
    auto rec = RecognizeLayout(FlatLayout(a, a.layers_per_stage, world_of, 0), 0, world_of);
    if (!rec) return Status::Internal("the flat layout is no template");
    return EncodeTemplate(rec->layout_template);
  };
  CAIRN_ASSIGN_OR_RETURN(const std::string saved_t, tmpl(world));
  CAIRN_ASSIGN_OR_RETURN(const std::string target_t, tmpl(n));
  std::vector<std::string> refs(static_cast<size_t>(n));
  {
    std::vector<LayoutRefs> r(static_cast<size_t>(n));
    for (int x = 0; x < n; ++x)
      r[static_cast<size_t>(x)].target = {true, TemplateHash(target_t), static_cast<uint32_t>(x)};
    for (int s = 0; s < world; ++s)
      r[static_cast<size_t>(step.holders[static_cast<size_t>(s)].front())].saved.push_back(
          {s, {true, TemplateHash(saved_t), static_cast<uint32_t>(s)}, step.chunk_bytes, 40});
    for (int x = 0; x < n; ++x) {
      refs[static_cast<size_t>(x)] = EncodeLayoutRefs(r[static_cast<size_t>(x)]);
      out->gather_bytes += refs[static_cast<size_t>(x)].size() + 5;  // + the status frame
    }
  }
  const std::string lists =
      EncodeTemplateList(saved_t == target_t ? std::vector<std::string>{saved_t}
                                             : std::vector<std::string>{saved_t, target_t});
  out->gather_bytes += lists.size() + static_cast<uint64_t>(n) * 9;  // others send none
  // The check that every saved tensor is some rank's target: the targets' templates list
  // them, so the last gather carries each rank's status alone (its frame).
  out->gather_bytes += static_cast<uint64_t>(n) * 5;
  out->general_layout_bytes =
      static_cast<uint64_t>(n) * EncodeRankLayout(FlatLayout(a, a.layers_per_stage, n, 0)).size();
  // Every rank: decode the references and templates, build the two plans.
  std::vector<double> cat_t;
  for (int rep = 0; rep < a.repeats; ++rep) {
    const int64_t t0 = NowNanos();
    std::vector<uint32_t> src_index(static_cast<size_t>(world)), tgt_index(static_cast<size_t>(n));
    for (int x = 0; x < n; ++x) {
      CAIRN_ASSIGN_OR_RETURN(LayoutRefs r, DecodeLayoutRefs(refs[static_cast<size_t>(x)]));
      tgt_index[static_cast<size_t>(x)] = r.target.index;
      for (const SavedRef& sr : r.saved)
        src_index[static_cast<size_t>(sr.source)] = sr.layout.index;
    }
    CAIRN_ASSIGN_OR_RETURN(auto encoded, DecodeTemplateList(lists));
    std::vector<LayoutTemplate> templates;
    for (const std::string& e : encoded) {
      CAIRN_ASSIGN_OR_RETURN(LayoutTemplate t, DecodeTemplate(e));
      templates.push_back(std::move(t));
    }
    auto plan = [&](uint32_t t, std::vector<uint32_t> index) -> Result<TemplatedPlan> {
      std::vector<uint64_t> hashes(index.size());
      const uint64_t h = TemplateHash(encoded[t]);
      for (size_t r = 0; r < index.size(); ++r) hashes[r] = TemplatedLayoutHash(h, index[r]);
      std::string why;
      std::vector<uint32_t> which(index.size(), 0);
      auto p = MakeTemplatedPlan({templates[t]}, std::move(which), std::move(index),
                                 std::move(hashes), nullptr, &why);
      if (!p) return Status::Internal(why);
      return std::move(*p);
    };
    CAIRN_ASSIGN_OR_RETURN(step.saved, plan(0, src_index));
    CAIRN_ASSIGN_OR_RETURN(step.targets, plan(templates.size() > 1 ? 1 : 0, tgt_index));
    cat_t.push_back(NanosToSeconds(NowNanos() - t0));
  }
  std::sort(cat_t.begin(), cat_t.end());
  out->catalog_s = cat_t[cat_t.size() / 2];
  return TimeMemoryPlans(a, step, n, lost, true, out);
}

using cairn::bench::Round;

double Median(std::vector<double> v) {
  std::sort(v.begin(), v.end());
  return v[v.size() / 2];
}

// What main's phases share: the arguments, and what each phase leaves for the next.
struct Run {
  Args a;
  bool fsdp = false;  // --fully-sharded
  int world = 0, load_world = 0;
  int distinct = 0, load_distinct = 0;  // rank r holds distinct layout r % distinct
  size_t templates = 0;                 // distinct templates of a templated plan
  size_t entries = 0;                   // (rank, shard) pairs of the whole job
  std::vector<std::string> layouts;     // encoded distinct layouts, for the general restore
  Gathered gathered;
  std::optional<PersistPlan> persist_plan;
  std::string manifest;  // the last one, encoded
  uint64_t manifest_bytes = 0;
  SimulatedIndex index;  // format 2
  std::vector<double> agree_t;
  uint64_t inventory_bytes = 0;
  nlohmann::ordered_json j;  // the result line

  bool new_mode() const { return a.mode != "megatron"; }
  // The saving job's distinct layout k: megatron, rank (tp, pp) = (k % tp, k / tp); fully
  // sharded, rank k's flat ranges; the FSDP2 modes, (stage, i, j) with j innermost.
  RankLayout LayoutOf(int k) const {
    if (new_mode())
      return ShardedStageLayout(a, k / (a.tp * a.fsdp), a.fsdp, (k / a.tp) % a.fsdp, a.tp,
                                k % a.tp);
    return fsdp ? FlatLayout(a, a.layers_per_stage, a.tp, k)
                : StageLayout(a, a.tp, a.layers_per_stage, k % a.tp, k / a.tp, k / a.tp);
  }
  // The loading job's distinct layout k.
  RankLayout LoadLayoutOf(int k) const {
    if (new_mode())
      return ShardedStageLayout(a, k / (a.tp * a.load_fsdp), a.load_fsdp, (k / a.tp) % a.load_fsdp,
                                a.tp, k % a.tp);
    const int layers = a.pp * a.layers_per_stage / a.load_pp;
    if (fsdp) return FlatLayout(a, layers, a.load_tp, k);
    const int stages_per_saved = a.load_pp / a.pp, tp = k % a.load_tp, pp = k / a.load_tp;
    return StageLayout(a, a.load_tp, layers, tp, pp,
                       pp % stages_per_saved == 0 ? pp / stages_per_saved : -1);
  }
};

// The command line into *a (fully sharded: the job and the loading job made flat); an exit
// code when the program should stop.
std::optional<int> ParseArgs(int argc, char** argv, Args& a) {
  CLI::App app(
      "Times the save planner and MANIFEST building for a simulated TP x PP x DP job (each "
      "rank: 48 tensors per layer + 40 buffers = 1000 shards), and the load planner restoring "
      "it onto a LOAD-TP x LOAD-PP x LOAD-DP job (LOAD-PP must divide the PP x "
      "layers-per-stage layers; its even stages take the buffers). Prints one JSON line.",
      "bench_plan");
  for (auto [name, field, what] :
       {std::tuple{"--tp", &a.tp, "tensor-parallel ranks of the saving job"},
        {"--pp", &a.pp, "pipeline stages of the saving job"},
        {"--dp", &a.dp, "data-parallel ranks of the saving job"},
        {"--layers-per-stage", &a.layers_per_stage, "layers per stage (1..20)"},
        {"--repeats", &a.repeats, "timed repetitions (the median is reported)"},
        {"--load-tp", &a.load_tp, "tensor-parallel ranks of the loading job"},
        {"--load-pp", &a.load_pp, "pipeline stages of the loading job"},
        {"--load-dp", &a.load_dp, "data-parallel ranks of the loading job"}})
    app.add_option(name, *field, what)->check(CLI::Range(1, 1 << 20))->capture_default_str();
  app.add_option("--fully-sharded", a.fully_sharded,
                 "instead: N ranks, each holding a flat 1/N of every tensor of the whole model "
                 "(FSDP, ZeRO-3; every layout distinct), restored onto the same N ranks and "
                 "onto --load-ranks")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--load-ranks", a.load_ranks,
                 "with --fully-sharded: ranks of the loading job (default 4/5 of N)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_option("--mode", a.mode,
                 "megatron (TP x PP x DP, or --fully-sharded); pp-fsdp (--pp stages x --fsdp "
                 "FSDP2 ranks, each stage's 1,000 tensors chunked along dimension 0); "
                 "pp-fsdp-tp (the same x --tp tensor-parallel ranks, TP innermost: 2-D "
                 "DTensor sharding); hsdp (--dp replicas x --fsdp FSDP2 ranks of the whole "
                 "1,000-tensor model). The new modes restore onto the same job and onto "
                 "--load-fsdp (default 4/5 of --fsdp)")
      ->check(CLI::IsMember({"megatron", "pp-fsdp", "pp-fsdp-tp", "hsdp"}))
      ->capture_default_str();
  app.add_option("--fsdp", a.fsdp, "FSDP2 ranks (the new modes)")->check(CLI::Range(1, 1 << 20));
  app.add_option("--load-fsdp", a.load_fsdp, "FSDP2 ranks of the loading job (the new modes)")
      ->check(CLI::Range(1, 1 << 20));
  app.add_flag("--no-templates", a.no_templates,
               "plan every layout with the general planner (as before layout templates)");
  app.add_flag("--save-only", a.save_only,
               "time the save side only (plan, cached plan, MANIFEST), not the restore");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return rc;
  if (a.mode != "megatron") {
    if (a.fsdp < 1 || a.fully_sharded > 0) {
      std::fprintf(stderr, "plan: --mode %s needs --fsdp (and no --fully-sharded)\n",
                   a.mode.c_str());
      return 2;
    }
    if (a.mode != "pp-fsdp-tp") a.tp = 1;
    if (a.mode == "hsdp") a.pp = 1;
    if (a.mode != "hsdp") a.dp = 1;
    if (a.load_fsdp == 0) a.load_fsdp = std::max(1, a.fsdp * 4 / 5);
    a.load_tp = a.tp, a.load_pp = a.pp, a.load_dp = a.dp;
  }
  if (a.fully_sharded > 0) {
    a.tp = a.fully_sharded, a.pp = 1, a.dp = 1;
    a.load_pp = 1, a.load_dp = 1;
    a.load_tp = a.load_ranks > 0 ? a.load_ranks : std::max(1, a.fully_sharded * 4 / 5);
  }
  if (a.tp < 1 || a.pp < 1 || a.dp < 1 || a.layers_per_stage < 1 || a.layers_per_stage > 20 ||
      a.repeats < 1 || a.load_tp < 1 || a.load_pp < 1 || a.load_dp < 1 ||
      (a.pp * a.layers_per_stage) % a.load_pp != 0 || a.load_pp % a.pp != 0) {
    std::fprintf(stderr, "plan: bad arguments\n");
    return 2;
  }
  return std::nullopt;
}

// Every rank's layout described as the persister's first gather carries it (template
// references, or explicit layouts from the lowest rank of each), each template once.
void GatherLayouts(Run& run) {
  const Args& a = run.a;
  const int world = run.world;
  // rank = (dp * pp_size + pp) * tp_size + tp, as Megatron orders them (the FSDP2 modes:
  // ((dp * pp_size + pp) * fsdp + i) * tp + j): rank r holds distinct layout
  // r % run.distinct, which rank r % run.distinct describes for all of them (a rank's
  // template index is the same for its data-parallel replicas).
  const size_t ndistinct = static_cast<size_t>(run.distinct);
  run.layouts.resize(a.save_only ? 0 : ndistinct);
  std::vector<std::string> message(ndistinct);
  std::vector<uint64_t> tmpl_hash(ndistinct, 0);  // 0: not a template
  std::map<uint64_t, std::string> tmpl_bytes;     // each distinct template once
  std::vector<uint64_t> distinct_hash(ndistinct);
  for (size_t k = 0; k < ndistinct; ++k) {
    RankLayout l = run.LayoutOf(static_cast<int>(k));
    run.entries += l.shards.size() * static_cast<size_t>(world) / ndistinct;
    std::string tmpl;
    Describe(l, static_cast<int>(k), world, !a.no_templates, &message[k], &distinct_hash[k], &tmpl);
    if (!tmpl.empty()) {
      tmpl_hash[k] = TemplateHash(tmpl);
      tmpl_bytes.emplace(tmpl_hash[k], std::move(tmpl));
    }
    // Kept for the general restore path (a templated one never needs them).
    if (!a.save_only && tmpl_hash[k] == 0) run.layouts[k] = EncodeRankLayout(l);
  }
  // What a rank holds after the layout gathers: template references from everyone (or
  // explicit layouts from the lowest rank of each), each template once.
  Gathered& gathered = run.gathered;
  gathered.messages.resize(static_cast<size_t>(world));
  gathered.hashes.resize(static_cast<size_t>(world));
  bool any_templated = false;
  for (int r = 0; r < world; ++r) {
    const size_t k = static_cast<size_t>(r) % ndistinct;
    gathered.hashes[static_cast<size_t>(r)] = distinct_hash[k];
    const bool templated = tmpl_hash[k] != 0;
    any_templated = any_templated || templated;
    gathered.messages[static_cast<size_t>(r)] = templated || r < static_cast<int>(ndistinct)
                                                    ? message[k]
                                                    : EncodeLayoutMessage(LayoutMessage{});
  }
  if (any_templated) {
    gathered.templates.resize(static_cast<size_t>(world));
    std::set<uint64_t> sent;
    for (int r = 0; r < world; ++r) {
      const size_t k = static_cast<size_t>(r) % ndistinct;
      if (tmpl_hash[k] != 0 && sent.insert(tmpl_hash[k]).second)
        gathered.templates[static_cast<size_t>(r)] = tmpl_bytes.at(tmpl_hash[k]);
    }
  }
  for (const std::string& m : gathered.messages) gathered.bytes += m.size();
  for (const std::string& t : gathered.templates) gathered.bytes += t.size();
  message.clear();
  tmpl_bytes.clear();
}

// What every rank does after the gathers, timed: plan (plan_s), check a later round's cache
// (cached_plan_s), and on rank 0 build and encode the MANIFEST (manifest_s).
Status TimeSavePlans(Run& run) {
  const Args& a = run.a;
  const int world = run.world;
  std::vector<double> plan_t, cached_t, manifest_t;
  std::optional<PersistPlan>& persist_plan = run.persist_plan;
  uint64_t& manifest_bytes = run.manifest_bytes;
  size_t my_pieces = 0;
  std::string& manifest = run.manifest;
  SimulatedIndex& index = run.index;
  long rss_after_plan_kb = 0;
  for (int rep = 0; rep < a.repeats; ++rep) {
    // What every rank does after the gathers: plan, and find the pieces it writes.
    persist_plan.reset();
    int64_t t0 = NowNanos();
    auto p = PlanPersist(run.gathered.messages, run.gathered.templates, run.gathered.hashes);
    if (p.ok()) my_pieces = p->PiecesOf(0).size();
    plan_t.push_back(NanosToSeconds(NowNanos() - t0));
    if (!p.ok()) {
      return p.status();
    }
    persist_plan = std::move(*p);
    // (before any MANIFEST: what a rank other than 0 ever holds for planning)
    if (rep == 0) rss_after_plan_kb = cairn::bench::MaxRssKb();

    // A later round: this rank re-derives its hash (its layout's template, when it is
    // one) and compares everyone's.
    t0 = NowNanos();
    RankLayout mine = run.LayoutOf(0);
    std::string msg, mine_tmpl;
    uint64_t h = 0;
    Describe(mine, 0, world, !a.no_templates, &msg, &h, &mine_tmpl);
    const bool same =
        h == run.gathered.hashes[0] && persist_plan->layout_hashes == run.gathered.hashes;
    cached_t.push_back(NanosToSeconds(NowNanos() - t0));
    if (!same) return Status::Internal("cache check failed");

    const uint64_t chunk = 4ull << 20;  // CAIRN_CHUNK_BYTES default
    if (persist_plan->templated) {
      // Format 2: each writer writes its index file (in parallel, not timed); rank 0
      // builds the MANIFEST from every rank's digest.
      if (rep == 0) SimulateIndexFiles(*persist_plan->templated, chunk, &index);
      t0 = NowNanos();
      auto m =
          BuildTemplatedManifest(*persist_plan->templated, index.digests, "bench", 1000, chunk);
      if (!m.ok()) {
        return m.status();
      }
      manifest = EncodeManifest(*m);
      manifest_bytes = manifest.size();
      manifest_t.push_back(NanosToSeconds(NowNanos() - t0));
      continue;
    }
    // Rank 0: the MANIFEST from the plan and the location tables the writers report.
    t0 = NowNanos();
    const SavePlan& full = persist_plan->Full();
    const int64_t expand_ns = NowNanos() - t0;
    const std::vector<LocationTable> tables =
        cairn::bench::SimulatedLocationTables(full, chunk, 5000);
    t0 = NowNanos();
    auto m = BuildManifest(full, tables, "bench", 1000, chunk);
    if (!m.ok()) {
      return m.status();
    }
    manifest = EncodeManifest(*m);
    manifest_bytes = manifest.size();
    manifest_t.push_back(NanosToSeconds(NowNanos() - t0 + expand_ns));
  }
  // Counts for the report (a templated plan is expanded only here, untimed).
  size_t distinct_layouts = 0, unique_boxes = 0, pieces = 0;
  uint64_t unique_bytes = 0;
  double writer_share = 0;
  if (persist_plan->templated) {
    run.templates = persist_plan->templated->templates.size();
    distinct_layouts = persist_plan->templated->class_ranks.size();
    unique_boxes = pieces = index.pieces;
    unique_bytes = index.bytes;
    writer_share = persist_plan->templated->max_writer_share();
  } else {
    const SavePlan& plan = persist_plan->Full();
    distinct_layouts = plan.lists.size();
    unique_boxes = plan.shards.size();
    pieces = plan.pieces.size();
    unique_bytes = plan.unique_bytes;
    writer_share = plan.max_writer_share();
  }

  const long rss_after_manifest_kb = cairn::bench::MaxRssKb();
  run.j = {{"bench", "plan"},
           {"ranks", world},
           {"shards", run.entries / static_cast<size_t>(world)},
           {"entries", run.entries},
           {"templated", persist_plan->templated.has_value()},
           {"layout_gather_bytes", run.gathered.bytes},
           {"distinct_layouts", distinct_layouts},
           {"unique_boxes", unique_boxes},
           {"pieces", pieces},
           {"my_pieces", my_pieces},
           {"unique_tb", Round(static_cast<double>(unique_bytes) / 1e12, 3)},
           {"plan_s", Round(Median(plan_t), 4)},
           {"cached_plan_s", Round(Median(cached_t), 6)},
           {"plan_rss_mb", Round(static_cast<double>(rss_after_plan_kb) / 1024, 1)},
           {"manifest_s", Round(Median(manifest_t), 4)},
           {"manifest_bytes", manifest_bytes},
           {"manifest_rss_mb", Round(static_cast<double>(rss_after_manifest_kb) / 1024, 1)},
           {"max_writer_share", Round(writer_share, 4)}};
  std::fprintf(stderr,
               "plan: %d ranks x %zu shards, %zu distinct layouts, %zu unique boxes, %zu pieces, "
               "%s plan%s%s\n",
               world, run.entries / static_cast<size_t>(world), distinct_layouts, unique_boxes,
               pieces, persist_plan->templated ? "templated" : "general",
               persist_plan->why_general.empty() ? "" : ": ", persist_plan->why_general.c_str());
  if (run.fsdp) run.j["fully_sharded"] = true;
  if (run.new_mode()) run.j["mode"] = a.mode;
  run.j["plan_path"] = persist_plan->Path();
  if (persist_plan->templated) run.j["templates"] = run.templates;
  return Status::OK();
}

// A restore's discovery and agreement over `world` simulated ranks (agree_s): decode every
// rank's inventory and choose.
Status TimeAgreement(Run& run) {
  const Args& a = run.a;
  const int world = run.world;
  {
    using namespace cairn::restore_internal;
    constexpr int kPerNode = 8;
    std::vector<std::string> encoded(static_cast<size_t>(world));
    for (int r = 0; r < world; ++r) {
      Inventory inv;
      inv.layout_hash = run.gathered.hashes[static_cast<size_t>(r)];
      const int partner = (r - kPerNode + world) % world;
      for (int64_t step : {998, 999, 1000}) {
        inv.held.push_back({r, step, static_cast<uint32_t>(world)});
        if (world > kPerNode) inv.held.push_back({partner, step, static_cast<uint32_t>(world)});
      }
      if (r == 0) inv.pfs_steps = {900, 950};
      encoded[static_cast<size_t>(r)] = EncodeInventory(inv);
      run.inventory_bytes += encoded[static_cast<size_t>(r)].size();
    }
    for (int rep = 0; rep < a.repeats; ++rep) {
      const int64_t t0 = NowNanos();
      std::vector<Inventory> inv;
      inv.reserve(encoded.size());
      for (const std::string& e : encoded) {
        auto d = DecodeInventory(e);
        if (!d.ok()) return d.status();
        inv.push_back(std::move(*d));
      }
      auto choice = Choose(inv, std::nullopt, {});
      run.agree_t.push_back(NanosToSeconds(NowNanos() - t0));
      if (!choice || choice->step != 1000 || choice->from_pfs) {
        return Status::Internal("agreement chose the wrong step");
      }
    }
  }

  run.j["agree_s"] = Round(Median(run.agree_t), 4);
  run.j["inventory_bytes"] = run.inventory_bytes;
  return Status::OK();
}

// A memory restore of a step of the FSDP2 modes (pp-fsdp, pp-fsdp-tp, hsdp), planned by each
// rank alone, onto the saving job (`same`, node 1 lost) or onto the loading job: the saved
// side's templates are the save's (the same gathers), the loading job's are recognised
// from its layouts, as each restoring rank recognises its own (not timed). catalog_s:
// building the saved and the target plans from the templates, as every rank does.
Status FsdpModeMemoryRestores(const Run& run, bool same, MemoryRestore* out) {
  using namespace cairn::restore_internal;
  const Args& a = run.a;
  const TemplatedPlan& saved = *run.persist_plan->templated;
  const int world = run.world, n = same ? run.world : run.load_world;
  TemplatedMemoryStep step;
  step.step = 1000;
  step.chunk_bytes = 4ull << 20;
  CAIRN_ASSIGN_OR_RETURN(step.holders, MemoryHolders(world, n, same));
  // The target side: each rank's template and index.
  std::vector<LayoutTemplate> templates = saved.templates;
  std::vector<uint32_t> which = saved.rank_template, index = saved.rank_index;
  std::vector<uint64_t> hashes = saved.layout_hashes;
  std::vector<std::string> saved_encoded;  // each saved template once
  for (const LayoutTemplate& t : saved.templates) saved_encoded.push_back(EncodeTemplate(t));
  std::vector<std::string> encoded = saved_encoded;
  if (!same) {
    templates.clear();
    encoded.clear();
    const int nd = run.load_distinct;
    std::map<uint64_t, uint32_t> by_hash;
    std::vector<uint32_t> kt(static_cast<size_t>(nd)), ki(static_cast<size_t>(nd));
    std::vector<uint64_t> kh(static_cast<size_t>(nd));
    for (int k = 0; k < nd; ++k) {
      auto rec = RecognizeLayout(run.LoadLayoutOf(k), k, n);
      if (!rec) return Status::Internal("loading layout " + std::to_string(k) + " is no template");
      std::string enc = EncodeTemplate(rec->layout_template);
      const uint64_t h = TemplateHash(enc);
      auto [it, fresh] = by_hash.emplace(h, static_cast<uint32_t>(templates.size()));
      if (fresh) {
        templates.push_back(std::move(rec->layout_template));
        encoded.push_back(std::move(enc));
      }
      kt[static_cast<size_t>(k)] = it->second;
      ki[static_cast<size_t>(k)] = rec->index;
      kh[static_cast<size_t>(k)] = TemplatedLayoutHash(h, rec->index);
    }
    which.clear();
    index.clear();
    hashes.clear();
    for (int r = 0; r < n; ++r) {
      const size_t k = static_cast<size_t>(r % nd);
      which.push_back(kt[k]);
      index.push_back(ki[k]);
      hashes.push_back(kh[k]);
    }
  }
  // What the gathers bring each rank: every rank's references (its target; the saved
  // versions it is the first holder of), then each template once.
  std::vector<LayoutRefs> refs(static_cast<size_t>(n));
  for (int x = 0; x < n; ++x)
    refs[static_cast<size_t>(x)].target = {
        true, TemplateHash(encoded[which[static_cast<size_t>(x)]]), index[static_cast<size_t>(x)]};
  for (int s = 0; s < world; ++s)
    refs[static_cast<size_t>(step.holders[static_cast<size_t>(s)].front())].saved.push_back(
        {s,
         {true, TemplateHash(saved_encoded[saved.rank_template[static_cast<size_t>(s)]]),
          saved.rank_index[static_cast<size_t>(s)]},
         step.chunk_bytes,
         40});
  for (const LayoutRefs& r : refs) out->gather_bytes += EncodeLayoutRefs(r).size() + 5;
  std::vector<std::string> all = encoded;
  if (!same) all.insert(all.end(), saved_encoded.begin(), saved_encoded.end());
  out->gather_bytes += EncodeTemplateList(all).size() + static_cast<uint64_t>(n) * 9;
  out->gather_bytes += static_cast<uint64_t>(n) * 5;  // the statuses (as above)
  std::vector<double> cat_t;
  for (int rep = 0; rep < a.repeats; ++rep) {
    const int64_t t0 = NowNanos();
    std::string why;
    auto sp = MakeTemplatedPlan(saved.templates, saved.rank_template, saved.rank_index,
                                saved.layout_hashes, nullptr, &why);
    if (!sp) return Status::Internal("the saved plan: " + why);
    auto tp = MakeTemplatedPlan(templates, which, index, hashes, nullptr, &why);
    if (!tp) return Status::Internal("the target plan: " + why);
    cat_t.push_back(NanosToSeconds(NowNanos() - t0));
    step.saved = std::move(*sp);
    step.targets = std::move(*tp);
  }
  out->catalog_s = Median(cat_t);
  // HSDP's replicas and FSDP2 over TP's TP-replicated parts have other holders.
  return TimeMemoryPlans(a, step, n, same, a.mode == "pp-fsdp", out);
}

// Restores of a templated (format 2) step: every rank decodes the MANIFEST and rebuilds
// the plan (catalog_s), then plans its own reads (load_plan_s); and memory restores planned
// by each rank alone.
Status TimeTemplatedRestores(Run& run) {
  const Args& a = run.a;
  const int world = run.world, load_world = run.load_world;
  // Format 2: every rank decodes the small MANIFEST and rebuilds the plan (catalog_s),
  // then plans its own reads: the index files of the parts its targets meet, and a
  // load plan of its own (load_plan_s, the slowest of the ranks sampled).
  std::vector<double> catalog_t;
  std::optional<pb::Manifest> m;
  std::optional<TemplatedPlan> tp;
  for (int rep = 0; rep < a.repeats; ++rep) {
    const int64_t t0 = NowNanos();
    auto d = DecodeManifest(run.manifest);
    auto p = d.ok() ? PlanOfManifest(*d) : Result<TemplatedPlan>(d.status());
    if (!p.ok()) {
      return p.status();
    }
    catalog_t.push_back(NanosToSeconds(NowNanos() - t0));
    m = std::move(*d);
    tp = std::move(*p);
  }
  const IndexReader reader = [&](int w) -> Result<std::string> {
    return run.index.files[static_cast<size_t>(w)];
  };
  struct Solo {
    double s = 0;
    uint64_t index_bytes = 0, read = 0, needed = 0;
    uint64_t targeted_bytes = 0;  // its part of the check that every tensor is targeted
  };
  std::unordered_map<std::string, uint32_t> saved_ids;
  for (int k = 0; k < m->tensors_size(); ++k)
    saved_ids.emplace(m->tensors(k).name(), static_cast<uint32_t>(k));
  // Rank r of the saving job (`same`) or of the loading job plans its restore.
  auto solo = [&](bool same_job, int r) -> Result<Solo> {
    Solo out;
    const int n = same_job ? world : load_world;
    std::vector<double> t;
    for (int rep = 0; rep < a.repeats; ++rep) {
      const int64_t t0 = NowNanos();
      const RankLayout target =
          same_job ? run.LayoutOf(r % run.distinct) : run.LoadLayoutOf(r % run.load_distinct);
      std::vector<std::pair<std::string, Box>> want;
      for (const auto& e : target.shards) want.push_back({target.tensors[e.tensor].name, e.box});
      CAIRN_ASSIGN_OR_RETURN(pb::Manifest part,
                             PartialManifest(*m, *tp, want, r, reader, &out.index_bytes));
      LoadCatalog cat;
      cat.step = 1000;
      cat.from_pfs = true;
      cat.where = "simulated";
      CatalogFromManifest(part, &cat);
      LoadTargets lt;
      lt.classes = {target, RankLayout{}};
      lt.class_of_rank.assign(static_cast<size_t>(n), 1);
      lt.class_of_rank[static_cast<size_t>(r)] = 0;
      CAIRN_ASSIGN_OR_RETURN(LoadPlan lp, MakeLoadPlan(cat, lt));
      const RankLoad mine = ForRank(lp, cat, r);
      t.push_back(NanosToSeconds(NowNanos() - t0));
      out.read = lp.pfs_bytes_to_read;
      out.needed = lp.unique_bytes_needed;
      std::vector<uint32_t> named;
      for (const TensorMeta& tm : target.tensors)
        if (auto it = saved_ids.find(tm.name); it != saved_ids.end()) named.push_back(it->second);
      std::sort(named.begin(), named.end());
      out.targeted_bytes =
          restore_internal::EncodeTargeted(named, static_cast<uint32_t>(m->tensors_size())).size();
      if (mine.gets.size() != lp.spans.size() || lp.pfs_bytes_to_read < lp.unique_bytes_needed)
        return Status::Internal("rank " + std::to_string(r) + " does not read all it needs");
    }
    out.s = Median(t);
    return out;
  };
  // The slowest of the first, middle and last ranks, onto both layouts.
  auto worst = [&](bool same_job, Solo* w) -> Status {
    const int n = same_job ? world : load_world;
    for (int r : {0, n / 2, n - 1}) {
      CAIRN_ASSIGN_OR_RETURN(Solo x, solo(same_job, r));
      w->s = std::max(w->s, x.s);
      w->index_bytes = std::max(w->index_bytes, x.index_bytes);
      w->targeted_bytes = std::max(w->targeted_bytes, x.targeted_bytes);
      if (x.needed > 0 &&
          (w->needed == 0 || static_cast<double>(x.read) / static_cast<double>(x.needed) >
                                 static_cast<double>(w->read) / static_cast<double>(w->needed)))
        w->read = x.read, w->needed = x.needed;
    }
    return Status::OK();
  };
  Solo other, same;
  Status st = worst(false, &other);
  if (st.ok()) st = worst(true, &same);
  if (!st.ok()) {
    return st;
  }
  // What a restoring rank receives or reads: every rank's inventory, the MANIFEST, the
  // index files it reads, and every rank's saved tensors its targets name (the check that
  // every saved tensor is some rank's target; each as large as the largest sampled).
  const uint64_t bits =
      static_cast<uint64_t>(load_world) * std::max(other.targeted_bytes, same.targeted_bytes);
  // Memory restores are simulated for the fully sharded job (one template, source s at
  // index s) and the FSDP2 modes (the save's templates; the loading job's recognised).
  MemoryRestore mem_same, mem_other;
  if (run.fsdp) {
    st = MemoryRestores(a, world, world, true, &mem_same);
    if (st.ok()) st = MemoryRestores(a, world, load_world, false, &mem_other);
    if (!st.ok()) return st.WithContext("memory restore");
  } else if (run.new_mode()) {
    st = FsdpModeMemoryRestores(run, true, &mem_same);
    if (st.ok()) st = FsdpModeMemoryRestores(run, false, &mem_other);
    if (!st.ok()) return st.WithContext("memory restore");
  }
  run.j["load_ranks"] = load_world;
  run.j["index_file_bytes"] = run.index.total_bytes;
  run.j["catalog_s"] = Round(Median(catalog_t), 4);
  run.j["load_plan_s"] = Round(other.s, 4);
  run.j["load_plan_same_layout_s"] = Round(same.s, 4);
  run.j["restore_metadata_bytes"] = run.inventory_bytes + run.manifest_bytes +
                                    std::max(other.index_bytes, same.index_bytes) + bits;
  run.j["load_read_over_needed"] =
      Round(static_cast<double>(other.read) / static_cast<double>(other.needed), 4);
  if (!run.fsdp && !run.new_mode()) {
    run.j["max_rss_mb"] = Round(static_cast<double>(cairn::bench::MaxRssKb()) / 1024, 1);
    return Status::OK();
  }
  run.j["memory_catalog_s"] = Round(std::max(mem_same.catalog_s, mem_other.catalog_s), 4);
  run.j["memory_plan_lost_node_s"] = Round(mem_same.plan_s, 4);
  run.j["memory_plan_other_layout_s"] = Round(mem_other.plan_s, 4);
  run.j["memory_restore_metadata_bytes"] =
      run.inventory_bytes + std::max(mem_same.gather_bytes, mem_other.gather_bytes);
  if (run.fsdp) run.j["memory_general_layout_bytes"] = mem_other.general_layout_bytes;
  run.j["max_rss_mb"] = Round(static_cast<double>(cairn::bench::MaxRssKb()) / 1024, 1);
  return Status::OK();
}

// Restores of a general (format 1) step onto another layout: decode the MANIFEST into the
// load planner's catalog (catalog_s), decode the distinct target layouts as the restore
// gathers them and plan (load_plan_s); fully sharded, also onto the saving layout.
Status TimeGeneralRestores(Run& run) {
  const Args& a = run.a;
  const bool fsdp = run.fsdp;
  const int world = run.world, load_world = run.load_world;
  // Restoring that step onto another layout: the catalog of its PFS pieces, and the
  // distinct target layouts as the restore gathers them (one per (tp, pp) of the new job).
  // What every restoring rank does with the MANIFEST rank 0 broadcasts: decode it and
  // turn its boxes into the load planner's catalog.
  LoadCatalog cat;
  std::vector<double> catalog_t;
  for (int rep = 0; rep < a.repeats; ++rep) {
    const int64_t t0 = NowNanos();
    auto m = DecodeManifest(run.manifest);
    if (!m.ok()) {
      return m.status();
    }
    cat = LoadCatalog{};
    cat.step = 1000;
    cat.from_pfs = true;
    cat.where = "simulated";
    CatalogFromManifest(*m, &cat);
    catalog_t.push_back(NanosToSeconds(NowNanos() - t0));
  }
  // Plans restoring onto `classes` (distinct encoded layouts; rank r is class r % size):
  // the median time, and rank 0's part.
  struct Load {
    double s = 0;
    LoadPlan plan;
    RankLoad mine;
    size_t targets = 0;
    bool ok = false;
  };
  auto plan_load = [&](const std::vector<std::string>& classes, int load_world) {
    Load out;
    std::vector<double> t;
    for (int rep = 0; rep < a.repeats; ++rep) {
      const int64_t t0 = NowNanos();
      LoadTargets lt;
      for (const std::string& enc : classes) {
        auto l = DecodeRankLayout(enc);
        if (!l.ok()) {
          std::fprintf(stderr, "plan: %s\n", l.status().ToString().c_str());
          return out;
        }
        lt.classes.push_back(std::move(*l));
      }
      // rank = (dp * pp_size + pp) * tp_size + tp
      for (int r = 0; r < load_world; ++r)
        lt.class_of_rank.push_back(static_cast<uint32_t>(r % classes.size()));
      auto p = MakeLoadPlan(cat, lt);
      if (!p.ok()) {
        std::fprintf(stderr, "plan: %s\n", p.status().ToString().c_str());
        return out;
      }
      out.plan = std::move(*p);
      out.mine = ForRank(out.plan, cat, 0);
      t.push_back(NanosToSeconds(NowNanos() - t0));
      out.targets = 0;
      for (const auto& c : lt.classes) out.targets += c.shards.size();
    }
    std::sort(t.begin(), t.end());
    out.s = t[t.size() / 2];
    const LoadPlan& lp = out.plan;
    if (lp.pfs_bytes_to_read < lp.unique_bytes_needed || !lp.unrestored.empty()) {
      std::fprintf(stderr, "plan: load plan reads %llu of %llu needed bytes, %zu tensors left\n",
                   static_cast<unsigned long long>(lp.pfs_bytes_to_read),
                   static_cast<unsigned long long>(lp.unique_bytes_needed), lp.unrestored.size());
      return out;
    }
    out.ok = true;
    return out;
  };
  std::vector<std::string> load_layouts;
  for (int k = 0; k < run.load_distinct; ++k)
    load_layouts.push_back(EncodeRankLayout(run.LoadLayoutOf(k)));
  const Load load = plan_load(load_layouts, load_world);
  if (!load.ok) return Status::Internal("the load plan failed (above)");
  // Fully sharded and the FSDP2 modes: also onto the saving job's own layout (every rank
  // reads its own bytes).
  Load same;
  const bool onto_same = fsdp || run.new_mode();
  if (onto_same) {
    // (layouts that were templates were not kept: made again)
    for (size_t k = 0; k < run.layouts.size(); ++k)
      if (run.layouts[k].empty())
        run.layouts[k] = EncodeRankLayout(run.LayoutOf(static_cast<int>(k)));
    same = plan_load(run.layouts, world);
    if (!same.ok) return Status::Internal("the load plan onto the same layout failed (above)");
  }
  const LoadPlan& lp = load.plan;
  const RankLoad& mine = load.mine;
  const size_t targets = load.targets;
  uint64_t restore_metadata_bytes = run.inventory_bytes + run.manifest_bytes;
  for (const std::string& l : load_layouts) restore_metadata_bytes += l.size();
  std::fprintf(stderr,
               "load: onto %d ranks, %zu distinct targets, %zu spans, %zu runs; rank 0 reads %zu "
               "runs, receives %zu spans, sends %zu\n",
               load_world, targets, lp.spans.size(), lp.runs.size(), mine.my_runs.size(),
               mine.gets.size() - mine.my_runs.size(), mine.puts.size());
  run.j["load_ranks"] = load_world;
  run.j["load_distinct_targets"] = targets;
  run.j["load_runs"] = lp.runs.size();
  run.j["catalog_s"] = Round(Median(catalog_t), 4);
  run.j["load_plan_s"] = Round(load.s, 4);
  run.j["restore_metadata_bytes"] = restore_metadata_bytes;
  run.j["load_read_over_needed"] = Round(
      static_cast<double>(lp.pfs_bytes_to_read) / static_cast<double>(lp.unique_bytes_needed), 4);
  if (onto_same) run.j["load_plan_same_layout_s"] = Round(same.s, 4);
  return Status::OK();
}

}  // namespace

int main(int argc, char** argv) {
  Run run;
  if (auto rc = ParseArgs(argc, argv, run.a)) return *rc;
  const Args& a = run.a;
  run.fsdp = a.fully_sharded > 0;
  const int fsdp = run.new_mode() ? a.fsdp : 1, load_fsdp = run.new_mode() ? a.load_fsdp : 1;
  run.distinct = a.tp * a.pp * fsdp;  // (fully sharded: pp is 1)
  run.load_distinct = a.load_tp * a.load_pp * load_fsdp;
  run.world = run.distinct * a.dp;
  run.load_world = run.load_distinct * a.load_dp;
  GatherLayouts(run);
  Status st = TimeSavePlans(run);
  if (st.ok() && !a.save_only) st = TimeAgreement(run);
  if (st.ok() && !a.save_only)
    st = run.persist_plan->templated ? TimeTemplatedRestores(run) : TimeGeneralRestores(run);
  if (!st.ok()) {
    std::fprintf(stderr, "plan: %s\n", st.ToString().c_str());
    return 1;
  }
  if (!a.save_only)
    run.j["max_rss_mb"] = Round(static_cast<double>(cairn::bench::MaxRssKb()) / 1024, 1);
  std::printf("%s\n", run.j.dump().c_str());
  return 0;
}
