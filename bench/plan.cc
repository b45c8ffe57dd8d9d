// bench/plan: the SavePlanner and MANIFEST building for a simulated large job (no I/O).
//
// A Megatron-like layout: TP x PP x DP ranks (default 8 x 10 x 125 = 10,000), each holding
// 1,000 shards: 20 transformer layers of its pipeline stage (weights split over TP rows or
// columns, biases and norms replicated over TP), each with fp32 master weights and two
// Adam moments, plus 40 small replicated buffers. Data-parallel replicas hold identical
// lists, as in Megatron without the distributed optimizer.
//
// What is timed is what the persister does on a rank (every rank computes the same plan):
//   plan_s         MakeSavePlan from the gathered layouts: each distinct layout once (the
//                  lowest rank of each sends it), the others known by their hash
//   cached_plan_s  a later round with the layout unchanged: encode and hash this rank's
//                  layout, compare all ranks' hashes with the cached plan's
//   manifest_s     rank 0: BuildManifest from every rank's location table + EncodeManifest
// Last line: one JSON object.
#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <string>
#include <vector>

#include "core/checksum.h"
#include "core/clock.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/save_planner.h"

using namespace cairn;

namespace {

struct Args {
  int tp = 8, pp = 10, dp = 125;
  int layers_per_stage = 20;
  int64_t hidden = 8192;
  int repeats = 3;
};

// The layout of rank (tp, pp).
RankLayout StageLayout(const Args& a, int tp, int pp) {
  RankLayout l;
  auto add = [&](const std::string& name, DType dt, Shape shape, int split_dim) {
    Box b = Box::Whole(shape);
    if (split_dim >= 0) {
      const int64_t part = shape[static_cast<size_t>(split_dim)] / a.tp;
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
  for (int i = 0; i < a.layers_per_stage; ++i) {
    const std::string layer = "layers." + std::to_string(pp * a.layers_per_stage + i) + ".";
    for (const P& p : params) {
      add("model." + layer + p.name, DType::kBF16, p.shape, p.split);
      add("optim.master." + layer + p.name, DType::kF32, p.shape, p.split);
      add("optim.exp_avg." + layer + p.name, DType::kF32, p.shape, p.split);
      add("optim.exp_avg_sq." + layer + p.name, DType::kF32, p.shape, p.split);
    }
  }
  for (int i = 0; l.shards.size() < 1000; ++i)
    add("buffers.stage" + std::to_string(pp) + "." + std::to_string(i), DType::kF32, {1024}, -1);
  return l;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&] { return i + 1 < argc ? std::atoi(argv[++i]) : 0; };
    if (k == "--tp")
      a.tp = next();
    else if (k == "--pp")
      a.pp = next();
    else if (k == "--dp")
      a.dp = next();
    else if (k == "--layers-per-stage")
      a.layers_per_stage = next();
    else if (k == "--repeats")
      a.repeats = next();
    else {
      std::printf(
          "usage: plan [--tp 8] [--pp 10] [--dp 125] [--layers-per-stage 20] [--repeats 3]\n"
          "Times the save planner and MANIFEST building for a simulated TP x PP x DP job\n"
          "(each rank: 48 tensors per layer + buffers = 1000 shards). Prints one JSON line.\n");
      return k == "--help" || k == "-h" ? 0 : 2;
    }
  }
  if (a.tp < 1 || a.pp < 1 || a.dp < 1 || a.layers_per_stage < 1 || a.layers_per_stage > 20 ||
      a.repeats < 1) {
    std::fprintf(stderr, "plan: bad arguments\n");
    return 2;
  }
  const int world = a.tp * a.pp * a.dp;
  // rank = (dp * pp_size + pp) * tp_size + tp, as Megatron orders them.
  std::vector<std::string> distinct(static_cast<size_t>(a.tp * a.pp));
  std::vector<uint64_t> distinct_hash(distinct.size());
  size_t shards = 0;
  for (int pp = 0; pp < a.pp; ++pp)
    for (int tp = 0; tp < a.tp; ++tp) {
      RankLayout l = StageLayout(a, tp, pp);
      shards = l.shards.size();
      const size_t k = static_cast<size_t>(pp * a.tp + tp);
      distinct[k] = EncodeRankLayout(l);
      distinct_hash[k] = LayoutHash(distinct[k]);
    }
  // What a rank holds after the layout allgather: bytes from the lowest rank of each
  // distinct layout, hashes from everyone.
  std::vector<std::string> gathered(static_cast<size_t>(world));
  std::vector<uint64_t> hashes(static_cast<size_t>(world));
  for (int r = 0; r < world; ++r) {
    const size_t k = static_cast<size_t>(r % (a.tp * a.pp));
    hashes[static_cast<size_t>(r)] = distinct_hash[k];
    if (r < a.tp * a.pp) gathered[static_cast<size_t>(r)] = distinct[k];
  }

  std::vector<double> plan_t, cached_t, manifest_t;
  SavePlan plan;
  uint64_t manifest_bytes = 0;
  for (int rep = 0; rep < a.repeats; ++rep) {
    int64_t t0 = NowNanos();
    auto p = MakeSavePlan(gathered, hashes);
    plan_t.push_back(NanosToSeconds(NowNanos() - t0));
    if (!p.ok()) {
      std::fprintf(stderr, "plan: %s\n", p.status().ToString().c_str());
      return 1;
    }
    plan = std::move(*p);

    // A later round: this rank re-derives its hash and compares everyone's.
    t0 = NowNanos();
    RankLayout mine = StageLayout(a, 0, 0);
    const uint64_t h = LayoutHash(EncodeRankLayout(mine));
    const bool same = h == hashes[0] && plan.layout_hashes == hashes;
    cached_t.push_back(NanosToSeconds(NowNanos() - t0));
    if (!same) {
      std::fprintf(stderr, "plan: cache check failed\n");
      return 1;
    }

    // Location tables as the writers would report them.
    const uint64_t chunk = 4ull << 20;  // CAIRN_CHUNK_BYTES default
    std::vector<LocationTable> tables(static_cast<size_t>(world));
    std::vector<uint64_t> off(static_cast<size_t>(world), 0);
    for (const PlannedPiece& pc : plan.pieces) {
      LocationTable::Piece loc;
      loc.offset = off[static_cast<size_t>(pc.writer)];
      off[static_cast<size_t>(pc.writer)] += (pc.nbytes + kPfsAlign - 1) / kPfsAlign * kPfsAlign;
      loc.chunk_checksums.assign((pc.nbytes + chunk - 1) / chunk, 0x1234567890abcdefull);
      tables[static_cast<size_t>(pc.writer)].pieces.push_back(std::move(loc));
    }
    for (int r = 0; r < world; ++r)
      tables[static_cast<size_t>(r)].blobs.push_back(
          {"rng", off[static_cast<size_t>(r)], 5000, 42});
    t0 = NowNanos();
    auto m = BuildManifest(plan, tables, "bench", 1000, chunk);
    if (!m.ok()) {
      std::fprintf(stderr, "plan: %s\n", m.status().ToString().c_str());
      return 1;
    }
    manifest_bytes = EncodeManifest(*m).size();
    manifest_t.push_back(NanosToSeconds(NowNanos() - t0));
  }
  std::sort(plan_t.begin(), plan_t.end());
  std::sort(cached_t.begin(), cached_t.end());
  std::sort(manifest_t.begin(), manifest_t.end());
  auto med = [](const std::vector<double>& v) { return v[v.size() / 2]; };
  std::fprintf(stderr,
               "plan: %d ranks x %zu shards, %zu distinct layouts, %zu unique boxes, %zu pieces\n",
               world, shards, plan.lists.size(), plan.shards.size(), plan.pieces.size());
  std::printf(
      "{\"bench\":\"plan\",\"ranks\":%d,\"shards\":%zu,\"entries\":%zu,\"distinct_layouts\":%zu,"
      "\"unique_boxes\":%zu,\"pieces\":%zu,\"unique_tb\":%.3f,\"plan_s\":%.4f,"
      "\"cached_plan_s\":%.6f,\"manifest_s\":%.4f,\"manifest_bytes\":%llu,"
      "\"max_writer_share\":%.4f}\n",
      world, shards, static_cast<size_t>(world) * shards, plan.lists.size(), plan.shards.size(),
      plan.pieces.size(), static_cast<double>(plan.unique_bytes) / 1e12, med(plan_t), med(cached_t),
      med(manifest_t), static_cast<unsigned long long>(manifest_bytes), plan.max_writer_share());
  return 0;
}
