// bench/memory: what each redundancy scheme costs in host memory and gives back after a
// failure, in one run (issue 34's measure).
//
// For each scheme a job of one-rank nodes (processes, UCX between them) trains --steps steps
// of --iteration-ms each, with --bytes of state per rank (tensors, a tenth changed every step, and
// a blob), saving every step (CAIRN_SLOTS=--slots) and draining every --persist-every-th version to
// the PFS (--dir). Meanwhile the parent samples, every 5 ms, the bytes allocated to every file
// under the job's host directory on all nodes (slots, replicas, parity), and each rank reports
// the memory its holder side staged outside it (Stats::replication.staging_bytes: the windows
// parity chunks land in); the peak of the first plus the most the second summed to in a run
// (counted as if every window were full at the peak), over the sum of the ranks' state bytes,
// is `host_bytes_per_state_byte`. At a random step in the last
// fifth of the run every rank is SIGKILLed (a job failure at a random moment), node 0's host
// memory is wiped (its node lost), and a new job restores; --kills such runs per scheme.
// `steps_lost` (one per run; `steps_lost_max`) is the newest step every rank reported saved
// minus the step restored, `iteration_overhead` the training thread's mean time in save()
// over --iteration-ms, `lost_node_restore_s` rank 0's restore call (the median over the
// runs; for xor and rs the rebuild from parity included), `from_memory` whether no rank read
// the PFS in any run.
//   replica  4 nodes, CAIRN_REPLICAS=1 (ring)
//   xor      4 nodes, CAIRN_REDUNDANCY=xor, k=4 (any 1 lost)
//   rs       6 nodes, CAIRN_REDUNDANCY=rs, k=6, m=2 (any 2 lost)
//   data_parallel  4 nodes, the default redundancy (no CAIRN_ setting), every rank holding
//            the whole state (the same boxes and bytes: data-parallel replicas) and a blob of
//            its own (its rank and step, checked at the restore)
// The encoding computation alone is measured in this process on the same bytes: cairn's
// parity path (each holder adding the d data pieces into its parity row as they arrive: the
// first received into the parity itself, which then holds the parity over that piece's
// coefficient, the others added times their coefficient over it, chunk by chunk as the
// chunks land (kParityChunkBytes); the piece that comes first rotates over
// the rounds) against ISA-L's ec_encode_data computing the same parity row from the d
// pieces at once (each of the m rows, as each holder computes one), alternated (each first
// in turn), --rounds times; `encode_vs_isal` is cairn's rate over ISA-L's (1.0: as fast).
//
//   memory [--schemes replica,xor,rs] [--bytes 16M] [--steps 200] [--iteration-ms 25]
//          [--slots 4] [--persist-every 10] [--dir /var/tmp] [--rounds 5] [--seed S]
//          [--host-memory-x X] [--netns [--link-rate RATE]]
// With --netns every node runs in a network namespace of its own (a cluster on this machine,
// scripts/netns_cluster.sh: a veth link each to a bridge, UCX over tcp on it), and with
// --link-rate (tc tbf, e.g. 1gbit) every node's link is limited to that rate both ways, as a
// node's network link is on a cluster: a restore's transfers then wait on the links, not on
// this machine's two cores.
// With --host-memory-x, every node gets CAIRN_HOST_MEMORY = X times its state (and
// CAIRN_SLOT_BYTES = --bytes): a scheme reports the slots cairn derived and whether its
// fullest node stayed within the budget (peak_node_bytes, within_host_memory), or that
// cairn refused the budget.
//
// Every rank also saves a blob of its own (its rank and the step), checked at the restore.
// Last line: one JSON object with an object per scheme holding host_bytes_per_state_byte
// (the peak over the runs, and at that peak, per byte of state: own_slots, replicas,
// parity; and staging), skipped (saves skipped, summed over the ranks and runs; each rank that
// skipped prints its skipped steps and its log's warning, which names what held each slot), kills,
// steps_lost, steps_lost_max, lost_node_restore_s, from_memory, save_ms_mean, iteration_overhead,
// rebuilt_step (xor, rs: the last run's), encode_gbps, isal_gbps and encode_vs_isal (xor, rs); and
// lost_node_restore_xor_over_replica.
#include <fcntl.h>
#include <ftw.h>
#include <isa-l/erasure_code.h>
#include <signal.h>
#include <sys/stat.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <map>
#include <random>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "bench/bench_netns.h"
#include "bench/bench_util.h"
#include "cairn/checkpointer.h"
#include "cli/args.h"
#include "cli/launcher.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "redundancy/erasure.h"
#include "redundancy/host_memory.h"

using namespace cairn;
using cairn::bench::Buffer;
using cairn::bench::Mean;
using cairn::bench::Median;
using cairn::bench::Round;

namespace {

constexpr int kTensors = 4;
// Room left in --bytes for the blob: a rank's version (its tensors, each of the first three
// a multiple of 4 KiB and so starting on a page as a large shard does, then the blob on a
// 64-byte boundary: snapshot/capture_pipeline.cc) fills its slot of --bytes but for 48
// bytes, so the slot bytes over the state bytes are cairn's overhead, not the bench's.
constexpr uint64_t kBlobRoom = 64;
constexpr uint64_t kBlobBytes = 16;  // "<rank>@<step>": at most 16 bytes

// fp32 elements of tensor t of a rank with --bytes of state (a multiple of kTensors pages).
int64_t Elements(uint64_t bytes, int t) {
  const int64_t per = static_cast<int64_t>(bytes / kTensors / 4);
  return t == kTensors - 1 ? per - static_cast<int64_t>(kBlobRoom / 4) : per;
}

// A rank's state bytes: its tensors and its blob.
uint64_t StateBytes(uint64_t bytes) {
  uint64_t n = kBlobBytes;
  for (int t = 0; t < kTensors; ++t) n += static_cast<uint64_t>(Elements(bytes, t)) * 4;
  return n;
}

struct Args {
  std::string schemes = "replica,xor,rs,data_parallel";
  uint64_t bytes = 16ull << 20;
  int steps = 200;
  int iteration_ms = 25;
  int slots = 4;
  int persist_every = 10;
  std::string dir = "/var/tmp";
  int rounds = 5;
  uint64_t seed = 0;
  double host_memory_x = 0;    // CAIRN_HOST_MEMORY as a multiple of a node's state (0: unset)
  int kills = 3;               // runs per scheme, each killed at a random step
  bool netns = false;          // every node in a network namespace of its own
  std::string link_rate;       // with netns: every node link's rate (tc tbf), "" for none
  std::string mode;            // child: train or restore
  bool data_parallel = false;  // child: every rank holds the whole state
};

void Die(const char* what, const Status& st) {
  std::fprintf(stderr, "memory: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

// A rank's state: kTensors fp32 tensors, rows split by rank; element values depend on the
// step, so a restore is checked against the step it reports.
struct State {
  // data_parallel: every rank holds the whole of each tensor.
  State(uint64_t bytes, int rank, int world, bool data_parallel) {
    for (int t = 0; t < kTensors; ++t) {
      const int64_t per = Elements(bytes, t);
      ShardSpec s;
      s.meta = {"t" + std::to_string(t), DType::kF32, {data_parallel ? per : world * per}};
      s.box = data_parallel ? Box{{0}, {per}} : Box{{rank * per}, {per}};
      bufs.push_back(std::make_unique<Buffer>(s.nbytes()));
      s.data = bufs.back()->p;
      shards.push_back(s);
    }
  }
  static uint32_t Value(int64_t step, int t, int64_t i) {
    // A tenth of the elements change every step: element i last changed at the newest step
    // s <= step with s = i (mod 10), or at 0.
    const int64_t epoch = std::max<int64_t>(0, step - (step % 10 - i % 10 + 10) % 10);
    uint64_t x = (static_cast<uint64_t>(t) << 56) ^ (static_cast<uint64_t>(i) << 8) ^
                 static_cast<uint64_t>(epoch);
    x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
    return static_cast<uint32_t>(x ^ (x >> 27));
  }
  void Fill(int64_t step, bool all) {
    for (size_t t = 0; t < shards.size(); ++t) {
      auto* p = static_cast<uint32_t*>(shards[t].data);
      const int64_t lo = shards[t].box.offsets[0], n = shards[t].box.lengths[0];
      for (int64_t i = all ? 0 : (step % 10 - lo % 10 + 10) % 10; i < n; i += all ? 1 : 10)
        p[i] = Value(step, static_cast<int>(t), lo + i);
    }
  }
  bool Check(int64_t step) const {
    for (size_t t = 0; t < shards.size(); ++t) {
      const auto* p = static_cast<const uint32_t*>(shards[t].data);
      const int64_t lo = shards[t].box.offsets[0], n = shards[t].box.lengths[0];
      for (int64_t i = 0; i < n; ++i)
        if (p[i] != Value(step, static_cast<int>(t), lo + i)) return false;
    }
    return true;
  }
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<ShardSpec> shards;
};

int Child(const Args& a) {
  auto o = Options::FromEnvironment();
  if (!o.ok()) Die("options", o.status());
  o->copy_engine = CopyEngineKind::kHost;
  auto ck = Checkpointer::Open(*o);
  if (!ck.ok()) Die("open", ck.status());
  Checkpointer& c = **ck;
  State s(a.bytes, o->rank, o->world_size, a.data_parallel);
  // A blob of this rank's own (as an RNG state would be): data-parallel replicas hold the
  // same tensors but not each other's blobs.
  auto blob = [&](int64_t step) {
    return Blobs{{"rank", std::to_string(o->rank) + "@" + std::to_string(step)}};
  };
  if (a.mode == "restore") {
    const int64_t t0 = NowNanos();
    auto r = c.restore(s.shards);
    const double secs = NanosToSeconds(NowNanos() - t0);
    if (!r.ok()) Die("restore", r.status());
    if (!s.Check(r->step)) Die("restore", Status::Corruption("restored bytes differ"));
    if (r->blobs != blob(r->step))
      Die("restore", Status::Corruption("restored blobs differ from this rank's of the step"));
    std::printf("RESTORED %lld %s %.6f %llu %lld\n", static_cast<long long>(r->step),
                r->tier.c_str(), secs, static_cast<unsigned long long>(r->job_pfs_bytes_read),
                static_cast<long long>(r->rebuilt_step));
    std::fflush(stdout);
    return 0;
  }
  s.Fill(0, true);
  for (int64_t step = 1; step <= a.steps; ++step) {
    const int64_t t0 = NowNanos();
    s.Fill(step, false);
    const int64_t s0 = NowNanos();
    auto st = c.save(step, s.shards, blob(step));
    const int64_t save_ns = NowNanos() - s0;  // what the training thread spent in cairn
    if (!st.ok()) Die("save", st.status());
    const Stats stats = c.stats();
    std::printf("SAVED %lld skipped %llu save_us %lld staging %llu\n", static_cast<long long>(step),
                static_cast<unsigned long long>(stats.save.skipped),
                static_cast<long long>(save_ns / 1000),
                static_cast<unsigned long long>(stats.replication.staging_bytes));
    std::fflush(stdout);
    const int64_t left = a.iteration_ms * 1'000'000ll - (NowNanos() - t0);
    if (left > 0) std::this_thread::sleep_for(std::chrono::nanoseconds(left));
  }
  // The parent kills the job before it gets here.
  std::this_thread::sleep_for(std::chrono::seconds(600));
  return 0;
}

// Bytes allocated to the files under a job's host directory (on tmpfs: the memory they
// hold): the ranks' own slots, the replicas held for others, parity.
struct Held {
  uint64_t own = 0, replica = 0, parity = 0;
  uint64_t total() const { return own + replica + parity; }
};
Held g_walk;
int AddFile(const char* path, const struct stat* st, int type, struct FTW*) {
  if (type != FTW_F) return 0;
  const uint64_t n = static_cast<uint64_t>(st->st_blocks) * 512;
  if (std::strstr(path, "/parity/"))
    g_walk.parity += n;
  else if (std::strstr(path, "/replica/"))
    g_walk.replica += n;
  else
    g_walk.own += n;
  return 0;
}
Held AllocatedBytes(const std::string& dir) {
  g_walk = {};
  ::nftw(dir.c_str(), AddFile, 32, FTW_PHYS);
  return g_walk;
}

std::vector<std::string> Lines(const std::string& root, int rank, const std::string& prefix) {
  std::ifstream f(root + "/rank-" + std::to_string(rank) + ".log");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (line.rfind(prefix, 0) == 0) out.push_back(line.substr(prefix.size()));
  return out;
}

struct Scheme {
  std::string name;
  int nodes;
  std::vector<std::pair<std::string, std::string>> env;
  ErasureScheme code{0, 0};
  bool data_parallel = false;
};

// The encoding of one stripe of `bytes` per member's version: cairn's per-holder path and
// ISA-L's ec_encode_data of all rows at once, alternated; medians of GB/s of data encoded.
std::pair<double, double> EncodeRates(const ErasureScheme& sc, uint64_t bytes, int rounds) {
  auto code = ErasureCode::Make(sc);
  if (!code.ok()) Die("erasure code", code.status());
  const int d = sc.data(), m = sc.m;
  const uint64_t len = PieceBytes(bytes, d);
  std::vector<std::unique_ptr<Buffer>> data, parity_a, parity_b;
  for (int j = 0; j < d; ++j) data.push_back(std::make_unique<Buffer>(len));
  for (int p = 0; p < m; ++p) {
    parity_a.push_back(std::make_unique<Buffer>(len));
    parity_b.push_back(std::make_unique<Buffer>(len));
  }
  // One parity row per holder, as cairn computes them (each on its own node), from cairn's
  // own matrix.
  std::vector<std::vector<unsigned char>> tables(static_cast<size_t>(m));
  for (int p = 0; p < m; ++p) {
    std::vector<unsigned char> row(code->ParityRow(p).begin(), code->ParityRow(p).end());
    tables[static_cast<size_t>(p)].resize(static_cast<size_t>(32 * d));
    ec_init_tables(d, 1, row.data(), tables[static_cast<size_t>(p)].data());
  }
  std::vector<unsigned char*> src, dst;
  for (auto& b : data) src.push_back(reinterpret_cast<unsigned char*>(b->p));
  for (auto& b : parity_b) dst.push_back(reinterpret_cast<unsigned char*>(b->p));
  std::vector<double> ours, theirs;
  for (int r = 0; r < rounds; ++r) {
    // Which member's piece reaches a holder first varies: round r has piece r mod d first.
    const int first = r % d;
    // The first piece is received into the parity itself (ParityStore::InPlace), as ISA-L's
    // sources are received somewhere: no computation, not timed. The row then holds the
    // parity over that piece's coefficient (its scale).
    for (int p = 0; p < m; ++p)
      std::memcpy(parity_a[static_cast<size_t>(p)]->p, data[static_cast<size_t>(first)]->p, len);
    auto cairn_arm = [&] {
      const int64_t t0 = NowNanos();
      for (int p = 0; p < m; ++p) {
        // As a holder does (ParityStore::Add): every other piece is added times its
        // coefficient over the scale, chunk by chunk as the chunks land (kParityChunkBytes).
        std::byte* row = parity_a[static_cast<size_t>(p)]->p;
        const unsigned char scale = code->Coefficient(first, p);
        for (int j = 0; j < d; ++j) {
          if (j == first) continue;
          const std::byte* piece = data[static_cast<size_t>(j)]->p;
          const unsigned char coef = ErasureCode::Divide(code->Coefficient(j, p), scale);
          for (uint64_t b = 0; b < len; b += kParityChunkBytes) {
            ErasureCode::MultiplyAdd(coef, piece + b, std::min(kParityChunkBytes, len - b),
                                     row + b);
          }
        }
      }
      ours.push_back(static_cast<double>(len * d) / NanosToSeconds(NowNanos() - t0) / 1e9);
    };
    auto isal_arm = [&] {
      const int64_t t0 = NowNanos();
      for (int p = 0; p < m; ++p)
        for (uint64_t off = 0; off < len; off += uint64_t{1} << 26) {
          const int n = static_cast<int>(std::min<uint64_t>(uint64_t{1} << 26, len - off));
          std::vector<unsigned char*> s2;
          for (auto* x : src) s2.push_back(x + off);
          unsigned char* d2 = dst[static_cast<size_t>(p)] + off;
          ec_encode_data(n, d, 1, tables[static_cast<size_t>(p)].data(), s2.data(), &d2);
        }
      theirs.push_back(static_cast<double>(len * d) / NanosToSeconds(NowNanos() - t0) / 1e9);
    };
    // Each arm goes first in every other cycle of the first pieces (so each first piece
    // sees both orders): the arm that runs second finds the pieces the other read still in
    // the caches.
    if ((r / d) % 2 == 0) {
      cairn_arm();
      isal_arm();
    } else {
      isal_arm();
      cairn_arm();
    }
  }
  // The last round's rows, times their scale (as a rebuild reads them: MapParity), are
  // ISA-L's.
  const int last_first = (rounds - 1) % d;
  Buffer scaled(len);
  for (int p = 0; p < m; ++p) {
    ErasureCode::Multiply(code->Coefficient(last_first, p), parity_a[static_cast<size_t>(p)]->p,
                          len, scaled.p);
    if (std::memcmp(scaled.p, parity_b[static_cast<size_t>(p)]->p, len) != 0)
      Die("encode", Status::Internal("cairn's parity differs from ISA-L's"));
  }
  return {Median(ours), Median(theirs)};
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  CLI::App app(
      "Host memory each redundancy scheme (replica, xor, rs; data_parallel: a job whose ranks "
      "all hold the same state, with the default replica) holds per byte of state while a "
      "job saves every step and drains every tenth, the saves it skipped, the steps lost and "
      "the lost node's restore time after a kill with one node's memory wiped, and the "
      "encoding rate against ISA-L's. Prints one JSON line last.",
      "bench_memory");
  app.add_option("--schemes", a.schemes, "replica,xor,rs,data_parallel (any of them)")
      ->capture_default_str();
  cairn::cli::AddByteCount(app, "--bytes", &a.bytes, "state per rank (default 16M)");
  app.add_option("--steps", a.steps, "steps per run")->check(CLI::Range(20, 100000));
  app.add_option("--iteration-ms", a.iteration_ms, "one training iteration")
      ->check(CLI::Range(1, 100000))
      ->capture_default_str();
  app.add_option("--slots", a.slots, "CAIRN_SLOTS")
      ->check(CLI::Range(2, 64))
      ->capture_default_str();
  app.add_option("--persist-every", a.persist_every, "CAIRN_PERSIST_EVERY")->capture_default_str();
  app.add_option("--dir", a.dir, "the PFS directory")->capture_default_str();
  app.add_option("--rounds", a.rounds, "encoding rounds")->check(CLI::Range(1, 1000));
  app.add_option("--kills", a.kills,
                 "runs per scheme, each killed at a random step of its last fifth (steps_lost_max "
                 "is over them)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--seed", a.seed, "the kill steps' random seed (default: the time)");
  app.add_option("--host-memory-x", a.host_memory_x,
                 "CAIRN_HOST_MEMORY per node as a multiple of its state (CAIRN_SLOT_BYTES = "
                 "--bytes; --slots is then the most slots): the budget each scheme must keep to")
      ->check(CLI::Range(1.0, 64.0));
  app.add_flag("--netns", a.netns,
               "every node in a network namespace of its own, on a bridge (scripts/"
               "netns_cluster.sh; needs root), UCX over tcp");
  app.add_option("--link-rate", a.link_rate,
                 "with --netns: every node's link limited to this rate both ways (tc tbf: "
                 "1gbit, 500mbit)");
  app.add_option("--child", a.mode, "internal: a rank, in this mode")->group("");
  app.add_flag("--data-parallel", a.data_parallel, "internal: the child's state")->group("");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  a.bytes = std::max<uint64_t>(a.bytes / (kTensors * 4096) * (kTensors * 4096), 1 << 16);
  if (!a.mode.empty()) return Child(a);
  if (!a.link_rate.empty() && !a.netns) {
    std::fprintf(stderr, "memory: --link-rate needs --netns\n");
    return 2;
  }
  if (a.seed == 0) a.seed = static_cast<uint64_t>(WallNanos());
  std::mt19937_64 rng(a.seed);

  std::vector<Scheme> all = {
      {"replica", 4, {{"CAIRN_REDUNDANCY", "replica"}, {"CAIRN_REPLICAS", "1"}}},
      {"xor", 4, {{"CAIRN_REDUNDANCY", "xor"}, {"CAIRN_ERASURE_K", "4"}}, {4, 1}},
      {"rs",
       6,
       {{"CAIRN_REDUNDANCY", "rs"}, {"CAIRN_ERASURE_K", "6"}, {"CAIRN_ERASURE_M", "2"}},
       {6, 2}},
      {"data_parallel", 4, {}, {0, 0}, true}};
  const std::vector<std::string> wanted = cairn::bench::SplitList(a.schemes);
  nlohmann::ordered_json out = {{"bench", "memory"}, {"bytes_per_rank", a.bytes},
                                {"steps", a.steps},  {"iteration_ms", a.iteration_ms},
                                {"slots", a.slots},  {"persist_every", a.persist_every},
                                {"seed", a.seed}};
  std::unique_ptr<cairn::testing::NetnsCluster> cluster;
  if (a.netns) {
    int nodes = 0;
    for (const Scheme& sc : all)
      if (std::find(wanted.begin(), wanted.end(), sc.name) != wanted.end())
        nodes = std::max(nodes, sc.nodes);
    int rc = 0;
    cluster = cairn::bench::UpCluster("memory", "bmem", nodes, a.link_rate, &rc);
    if (!cluster) return rc;
    out["netns"] = true;
    out["link_rate"] = a.link_rate.empty() ? "none" : a.link_rate;
  }
  const std::string self = cairn::bench::SelfPath();
  if (self.empty()) return 1;
  std::map<std::string, double> restore_s;
  for (const Scheme& sc : all) {
    if (std::find(wanted.begin(), wanted.end(), sc.name) == wanted.end()) continue;
    // Over the kills: the peaks, the skips, the steps lost, the restore times.
    Held peak;
    uint64_t peak_node = 0;  // the fullest node's
    uint64_t skipped = 0;
    uint64_t staging = 0;  // the most the ranks' staging summed to in a run
    std::vector<int64_t> lost;
    std::vector<double> restore_secs, save_us;
    bool from_memory = true, refused = false;
    int64_t last_rebuilt = -1;
    int budget_slots = a.slots;
    const uint64_t budget = static_cast<uint64_t>(a.host_memory_x * static_cast<double>(a.bytes));
    for (int kill = 0; kill < a.kills && !refused; ++kill) {
      char host_t[] = "/dev/shm/cairn-bench-memory-XXXXXX";
      std::string pfs_t = a.dir + "/cairn-bench-memory-XXXXXX";
      if (!::mkdtemp(host_t) || !::mkdtemp(pfs_t.data())) {
        std::perror("mkdtemp");
        return 1;
      }
      const std::string root = host_t, pfs = pfs_t;
      const std::string job =
          "bench-memory-" + sc.name + "-" + std::to_string(::getpid()) + "-" + std::to_string(kill);
      // With --host-memory-x: the budget per node (one rank each), and the slots cairn will
      // derive from it, as its ranks do at open.
      if (a.host_memory_x > 0) {
        auto o = Options::FromEnvironment([&](const char* v) -> const char* {
          for (const auto& [k, val] : sc.env)
            if (k == v) return val.c_str();
          return nullptr;
        });
        if (!o.ok()) Die("options", o.status());
        o->world_size = o->local_world_size * sc.nodes;
        o->slots = a.slots;
        o->slot_bytes = a.bytes;
        o->host_memory = budget;
        auto plan = cairn::PlanHostMemory(*o);
        if (!plan.ok()) {
          std::printf(
              "%s: %s\n", sc.name.c_str(),
              nlohmann::ordered_json({{"refused", plan.status().message()}}).dump().c_str());
          out[sc.name] = {{"refused", plan.status().message()}};
          (void)DefaultFileSystem()->RemoveAll(root);
          (void)DefaultFileSystem()->RemoveAll(pfs);
          refused = true;
          continue;
        }
        budget_slots = plan->slots;
        std::fprintf(stderr, "memory: %s: %s\n", sc.name.c_str(), plan->summary.c_str());
      }
      auto cleanup = [&] {
        (void)DefaultFileSystem()->RemoveAll(root);
        (void)DefaultFileSystem()->RemoveAll(pfs);
      };
      auto spec = [&](const std::string& mode, const std::string& out_dir) {
        LaunchSpec s;
        s.nodes = sc.nodes;
        s.argv = {self,
                  "--child",
                  mode,
                  "--bytes",
                  std::to_string(a.bytes),
                  "--steps",
                  std::to_string(a.steps),
                  "--iteration-ms",
                  std::to_string(a.iteration_ms)};
        if (sc.data_parallel) s.argv.push_back("--data-parallel");
        s.output_dir = out_dir;
        s.env = {{"CAIRN_JOB_ID", job},
                 {"CAIRN_HOST_ROOT", root + "/host"},
                 {"CAIRN_PFS_ROOT", pfs},
                 {"CAIRN_SLOTS", std::to_string(a.slots)},
                 {"CAIRN_PERSIST_EVERY", std::to_string(a.persist_every)},
                 {"CAIRN_CHUNK_BYTES", "1M"}};
        if (a.host_memory_x > 0) {
          s.env.push_back({"CAIRN_SLOT_BYTES", std::to_string(a.bytes)});
          s.env.push_back({"CAIRN_HOST_MEMORY", std::to_string(budget)});
        }
        s.env.insert(s.env.end(), sc.env.begin(), sc.env.end());
        if (cluster) {
          cairn::bench::PlaceInCluster(*cluster, &s);
          s.env.push_back({"UCX_TLS", "tcp"});
        }
        return s;
      };
      const std::string train_dir = root + "/train", restore_dir = root + "/restore";
      (void)DefaultFileSystem()->MakeDirs(train_dir, 0700);
      (void)DefaultFileSystem()->MakeDirs(restore_dir, 0700);
      // Train, sampling the host directory, until the kill step.
      const int kill_at =
          a.steps - a.steps / 5 + static_cast<int>(rng() % static_cast<uint64_t>(a.steps / 5));
      auto l = LocalLauncher::Start(spec("train", train_dir));
      if (!l.ok()) Die("launch", l.status());
      const std::string host_job = root + "/host/" + job;
      const int64_t deadline = NowNanos() + 600'000'000'000ll;
      for (;;) {
        const Held now = AllocatedBytes(host_job);
        if (now.total() > peak.total()) peak = now;
        if (a.host_memory_x > 0)
          for (int n = 0; n < sc.nodes; ++n)
            peak_node = std::max(peak_node,
                                 AllocatedBytes(host_job + "/node-" + std::to_string(n)).total());
        auto saved = Lines(train_dir, 0, "SAVED ");
        if (static_cast<int>(saved.size()) >= kill_at) break;
        if (NowNanos() > deadline)
          Die("train", Status::Unavailable("rank 0 did not reach its step"));
        std::this_thread::sleep_for(std::chrono::milliseconds(5));
      }
      for (int r = 0; r < sc.nodes; ++r) (void)(*l)->Signal(r, SIGKILL);
      (void)(*l)->WaitAll(60);
      l->reset();
      // The newest step every rank reported saved, and the skips.
      int64_t newest = -1;
      uint64_t run_staging = 0;
      for (int r = 0; r < sc.nodes; ++r) {
        auto saved = Lines(train_dir, r, "SAVED ");
        long long step = 0, us = 0;
        unsigned long long sk = 0, staged = 0;
        std::string skipped_steps;
        unsigned long long before = 0;
        for (const std::string& line : saved)
          if (std::sscanf(line.c_str(), "%lld skipped %llu save_us %lld staging %llu", &step, &sk,
                          &us, &staged) == 4) {
            save_us.push_back(static_cast<double>(us));
            if (sk > before) skipped_steps += " " + std::to_string(step);
            before = sk;
          }
        // Which steps a rank skipped, and why (the log warns at the first skip).
        if (sk > 0) {
          std::fprintf(stderr, "memory: %s run %d, rank %d skipped steps%s\n", sc.name.c_str(),
                       kill + 1, r, skipped_steps.c_str());
          for (const std::string& w : Lines(train_dir, r, ""))
            if (w.find(" skipped: ") != std::string::npos)
              std::fprintf(stderr, "  %s\n", w.c_str());
        }
        newest = newest < 0 ? step : std::min<int64_t>(newest, step);
        skipped += sk;
        run_staging += staged;  // (a rank's staging only grows)
      }
      staging = std::max(staging, run_staging);
      // Node 0 lost; a new job restores.
      (void)DefaultFileSystem()->RemoveAll(host_job + "/node-0");
      // (At info, the ranks' logs say what each rebuilt, printed below when one read the PFS.)
      LaunchSpec restore_spec = spec("restore", restore_dir);
      restore_spec.env.push_back({"CAIRN_LOG_LEVEL", "info"});
      auto rl = LocalLauncher::Start(restore_spec);
      if (!rl.ok() || !(*rl)->WaitAll(600)) {
        for (int r = 0; r < sc.nodes; ++r) {
          std::ifstream f(restore_dir + "/rank-" + std::to_string(r) + ".log");
          std::stringstream ss;
          ss << f.rdbuf();
          std::fprintf(stderr, "memory: %s restore failed; rank %d:\n%s\n", sc.name.c_str(), r,
                       ss.str().c_str());
        }
        cleanup();
        return 1;
      }
      long long restored = -1, rebuilt = -1;
      double secs = 0;
      bool this_from_memory = true;
      for (int r = 0; r < sc.nodes; ++r) {
        auto lines = Lines(restore_dir, r, "RESTORED ");
        if (lines.empty()) Die("restore", Status::Internal("no RESTORED line"));
        char tier[32] = {0};
        unsigned long long pfs_read = 0;
        long long step = 0, rb = -1;
        double s = 0;
        std::sscanf(lines.back().c_str(), "%lld %31s %lf %llu %lld", &step, tier, &s, &pfs_read,
                    &rb);
        if (pfs_read > 0) this_from_memory = false;
        if (r == 0) {
          restored = step;
          secs = s;
          rebuilt = rb;
        }
      }
      if (!this_from_memory) {
        // Why the lost node did not come back from memory: every rank's warnings, and what
        // the rebuild did (a step older than the PFS's newest is rebuilt, then not chosen).
        from_memory = false;
        for (int r = 0; r < sc.nodes; ++r) {
          std::ifstream f(restore_dir + "/rank-" + std::to_string(r) + ".log");
          for (std::string line; std::getline(f, line);)
            if (line.find("warning") != std::string::npos ||
                line.find("error") != std::string::npos || line.find("rebuil") != std::string::npos)
              std::fprintf(stderr, "memory: %s restore (kill %zu), rank %d: %s\n", sc.name.c_str(),
                           lost.size() + 1, r, line.c_str());
        }
      }
      lost.push_back(newest - restored);
      restore_secs.push_back(secs);
      last_rebuilt = rebuilt;
      cleanup();
    }
    if (refused) continue;
    // A rank's state: its tensors and its blob ("<rank>@<step>", at most 16 bytes).
    const double state = static_cast<double>(StateBytes(a.bytes)) * sc.nodes;
    nlohmann::ordered_json j = {
        {"nodes", sc.nodes},
        {"host_bytes_per_state_byte", Round((peak.total() + staging) / state, 3)},
        {"peak_host_bytes", peak.total() + staging},
        // at the peak, per byte of state
        {"own_slots", Round(peak.own / state, 3)},
        {"replicas", Round(peak.replica / state, 3)},
        {"parity", Round(peak.parity / state, 3)},
        {"staging", Round(staging / state, 3)},
        {"skipped", skipped},
        {"kills", lost.size()},
        {"steps_lost", lost},
        {"steps_lost_max", *std::max_element(lost.begin(), lost.end())},
        {"from_memory", from_memory},
        {"lost_node_restore_s", Round(Median(restore_secs), 4)},
        // the training thread's time in save() over the iteration
        {"save_ms_mean", Round(Mean(save_us) / 1e3, 3)},
        {"iteration_overhead", Round(Mean(save_us) / 1e3 / a.iteration_ms, 4)}};
    if (a.host_memory_x > 0) {
      j["host_memory_per_state_byte"] = a.host_memory_x;
      j["slots"] = budget_slots;
      // The budget is per node: the fullest node's peak against it.
      j["peak_node_bytes"] = peak_node;
      j["within_host_memory"] = peak_node <= budget;
    }
    if (sc.code.k > 0) {
      j["rebuilt_step"] = last_rebuilt;
      auto [ours, theirs] = EncodeRates(sc.code, a.bytes, a.rounds);
      j["encode_gbps"] = Round(ours, 3);
      j["isal_gbps"] = Round(theirs, 3);
      j["encode_vs_isal"] = Round(ours / theirs, 3);
    }
    restore_s[sc.name] = Median(restore_secs);
    std::printf("%s: %s\n", sc.name.c_str(), j.dump().c_str());
    std::fflush(stdout);
    out[sc.name] = j;
  }
  if (restore_s.count("replica") && restore_s.count("xor") && restore_s["replica"] > 0)
    out["lost_node_restore_xor_over_replica"] = Round(restore_s["xor"] / restore_s["replica"], 3);
  std::printf("%s\n", out.dump().c_str());
  return 0;
}
