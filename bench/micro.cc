// In-process micro-benchmarks under Google Benchmark: the checksum, the host engine's
// capture copy (streaming stores + checksums) beside memcpy, flat-range normalisation, the
// save and load planners, and the MANIFEST and slot-header codecs.
//   build/bench/micro --benchmark_format=json      (or --benchmark_out=FILE)
// The multi-process benchmarks (capture, replicate, persist, restore, compare) stay plain
// programs: they time whole jobs.
#include <benchmark/benchmark.h>

#include <cstring>
#include <random>
#include <string>
#include <vector>

#include "bench/bench_util.h"
#include "bench/plan_util.h"
#include "cairn/box.h"
#include "core/checksum.h"
#include "layout/load_planner.h"
#include "layout/save_planner.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "snapshot/copy_engine.h"
#include "tiers/slot_header.h"

namespace cairn {
namespace {

constexpr uint64_t kChunk = 4ull << 20;

void BM_Checksum(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  bench::Buffer buf(n);
  for (auto _ : state) benchmark::DoNotOptimize(Checksum(buf.p, n));
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Checksum)->Arg(256 << 10)->Arg(4 << 20)->Arg(64 << 20);

// The physical reference of the capture copy.
void BM_Memcpy(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  bench::Buffer src(n), dst(n);
  for (auto _ : state) {
    std::memcpy(dst.p, src.p, n);
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_Memcpy)->Arg(64 << 20)->UseRealTime();

// The host engine's capture: chunked streaming copy with every chunk's checksum.
void BM_HostCapture(benchmark::State& state) {
  const size_t n = static_cast<size_t>(state.range(0));
  bench::Buffer src(n), dst(n);
  auto engine = MakeCopyEngine(CopyEngineKind::kHost, 1);
  if (!engine.ok()) {
    state.SkipWithError(engine.status().ToString().c_str());
    return;
  }
  std::vector<CopyChunk> chunks;
  for (size_t off = 0; off < n; off += kChunk)
    chunks.push_back({src.p + off, dst.p + off, std::min<size_t>(kChunk, n - off), false});
  std::vector<uint64_t> sums(chunks.size());
  for (auto _ : state) {
    Status st = (*engine)->Capture(nullptr, -1, chunks, sums.data(), [](auto) {});
    if (!st.ok()) state.SkipWithError(st.ToString().c_str());
    benchmark::ClobberMemory();
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations()) * static_cast<int64_t>(n));
}
BENCHMARK(BM_HostCapture)->Arg(64 << 20)->UseRealTime();

void BM_FlatRangeToBoxes(benchmark::State& state) {
  const Shape shape = {64, 512, 1024};
  const int64_t numel = NumElements(shape);
  std::mt19937_64 rng(7);
  std::vector<std::pair<int64_t, int64_t>> ranges;
  for (int i = 0; i < 1024; ++i) {
    int64_t a = static_cast<int64_t>(rng() % static_cast<uint64_t>(numel));
    int64_t b = static_cast<int64_t>(rng() % static_cast<uint64_t>(numel));
    ranges.emplace_back(std::min(a, b), std::max(a, b) + 1);
  }
  size_t i = 0;
  for (auto _ : state) {
    auto [b, e] = ranges[i++ % ranges.size()];
    auto boxes = FlatRangeToBoxes(shape, b, e);
    benchmark::DoNotOptimize(boxes);
  }
}
BENCHMARK(BM_FlatRangeToBoxes);

// A tp x dp job: `tensors` tensors of 4096 x 4096 bf16, each split by rows over tp.
struct Job {
  int tp, dp, tensors;
  std::vector<std::string> layouts;  // per rank
  RankLayout Layout(int rank) const {
    RankLayout l;
    const int t = rank % tp;
    for (int k = 0; k < tensors; ++k) {
      l.tensors.push_back({"layers." + std::to_string(k) + ".w", DType::kBF16, {4096, 4096}});
      l.shards.push_back({static_cast<uint32_t>(k), Box{{4096 / tp * t, 0}, {4096 / tp, 4096}}});
    }
    return l;
  }
  Job(int tp_, int dp_, int tensors_) : tp(tp_), dp(dp_), tensors(tensors_) {
    for (int r = 0; r < tp * dp; ++r) layouts.push_back(EncodeRankLayout(Layout(r)));
  }
};

void BM_SavePlan(benchmark::State& state) {
  const Job job(8, static_cast<int>(state.range(0)), 100);
  for (auto _ : state) {
    auto plan = MakeSavePlan(job.layouts);
    if (!plan.ok()) state.SkipWithError(plan.status().ToString().c_str());
    benchmark::DoNotOptimize(plan);
  }
  state.counters["ranks"] = static_cast<double>(job.layouts.size());
}
BENCHMARK(BM_SavePlan)->Arg(4)->Arg(64)->Unit(benchmark::kMillisecond);

// The plan of a tp=8 job and the MANIFEST its writers' tables make.
struct Saved {
  SavePlan plan;
  pb::Manifest manifest;
  Saved() : plan(*MakeSavePlan(Job(8, 4, 100).layouts)) {
    manifest =
        *BuildManifest(plan, bench::SimulatedLocationTables(plan, kChunk), "bench", 1000, kChunk);
  }
};

void BM_LoadPlan(benchmark::State& state) {
  const Saved saved;
  LoadCatalog cat;
  cat.step = 1000;
  cat.chunk_bytes = kChunk;
  cat.from_pfs = true;
  cat.where = "simulated";
  cat.tensors = saved.plan.tensors;
  for (size_t i = 0; i < saved.plan.pieces.size(); ++i) {
    const PlannedPiece& pc = saved.plan.pieces[i];
    cat.pieces.push_back({saved.plan.shards[pc.shard].tensor,
                          pc.box,
                          pc.nbytes,
                          {},
                          static_cast<int32_t>(i),
                          pc.writer});
  }
  const int load_tp = static_cast<int>(state.range(0));  // another tensor-parallel degree
  const Job target(load_tp, 2, 100);
  LoadTargets lt;
  for (int t = 0; t < load_tp; ++t) lt.classes.push_back(target.Layout(t));
  for (int r = 0; r < load_tp * 2; ++r)
    lt.class_of_rank.push_back(static_cast<uint32_t>(r % load_tp));
  for (auto _ : state) {
    auto p = MakeLoadPlan(cat, lt);
    if (!p.ok()) state.SkipWithError(p.status().ToString().c_str());
    benchmark::DoNotOptimize(p);
  }
}
BENCHMARK(BM_LoadPlan)->Arg(8)->Arg(4)->Unit(benchmark::kMillisecond);

void BM_ManifestEncode(benchmark::State& state) {
  const Saved saved;
  size_t bytes = 0;
  for (auto _ : state) {
    std::string enc = EncodeManifest(saved.manifest);
    bytes = enc.size();
    benchmark::DoNotOptimize(enc);
  }
  state.counters["manifest_bytes"] = static_cast<double>(bytes);
}
BENCHMARK(BM_ManifestEncode);

void BM_ManifestDecode(benchmark::State& state) {
  const Saved saved;
  const std::string enc = EncodeManifest(saved.manifest);
  for (auto _ : state) {
    auto m = DecodeManifest(enc);
    if (!m.ok()) state.SkipWithError(m.status().ToString().c_str());
    benchmark::DoNotOptimize(m);
  }
  state.SetBytesProcessed(static_cast<int64_t>(state.iterations() * enc.size()));
}
BENCHMARK(BM_ManifestDecode);

// A slot header of `shards` shards of 1 MiB each.
SlotHeader MakeHeader(int shards) {
  SlotHeader h;
  h.step = 42;
  h.chunk_bytes = kChunk;
  uint64_t off = 0;
  for (int i = 0; i < shards; ++i) {
    SlotShard s;
    s.name = "layers." + std::to_string(i) + ".mlp.fc1.weight";
    s.dtype = DType::kBF16;
    s.global_shape = {1024, 512};
    s.box = Box{{0, 0}, {1024, 512}};
    s.offset = off;
    s.nbytes = 1 << 20;
    s.first_chunk = static_cast<uint32_t>(i);
    s.num_chunks = 1;
    off += s.nbytes;
    h.shards.push_back(std::move(s));
  }
  h.data_bytes = off;
  h.chunk_checksums.assign(static_cast<size_t>(shards), 0xabcdef);
  return h;
}

void BM_SlotHeaderEncode(benchmark::State& state) {
  const SlotHeader h = MakeHeader(static_cast<int>(state.range(0)));
  for (auto _ : state) benchmark::DoNotOptimize(EncodeSlotHeader(h));
}
BENCHMARK(BM_SlotHeaderEncode)->Arg(1000);

void BM_SlotHeaderDecode(benchmark::State& state) {
  const std::string enc = EncodeSlotHeader(MakeHeader(static_cast<int>(state.range(0))));
  for (auto _ : state) {
    auto h = DecodeSlotHeader(enc);
    if (!h.ok()) state.SkipWithError(h.status().ToString().c_str());
    benchmark::DoNotOptimize(h);
  }
}
BENCHMARK(BM_SlotHeaderDecode)->Arg(1000);

}  // namespace
}  // namespace cairn

BENCHMARK_MAIN();
