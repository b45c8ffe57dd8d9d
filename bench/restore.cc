// bench/restore: restore time from each tier beside its physical reference, in one run.
//
// Two ranks (processes, one per "node", UCX between them) each hold --bytes of state: 8
// fp32 tensors [2R, 1024] split by rows (rank r holds rows [rR, (r+1)R)). They save one
// version, replicate it to each other and flush it to the PFS (--dir, a real disk). Then,
// each measured --rounds times, alternated with its reference (ref, cairn, ref, cairn...):
//   local    both ranks restore from their own host tier      vs  memcpy of the same bytes
//                                                                 (one thread, as cairn's
//                                                                 default CAIRN_COPY_THREADS)
//   peer     node 1's host tier deleted: rank 1 restores from  vs  rank 0 sending the same
//            rank 0's replica over UCX (rank 0 only serves)       bytes with UCX tagged
//                                                                 sends (64 MiB, all in
//                                                                 flight) into rank 1's
//                                                                 memory
//   pfs      every host tier deleted: both ranks restore from  vs  both ranks reading the
//            the PFS, same layout                                 step's data files with
//                                                                 4 MiB sequential preads
//   reshard  the same from the PFS into two other layouts, beside the same-layout restore:
//            transposed (columns split instead of rows: every rank needs half of every
//            saved piece, strided, so half of what each rank reads goes to the other) and
//            row blocks (4 blocks, rank r takes r and r + 2, as after a change of the
//            tensor-parallel degree: half of each rank's bytes are in the other's file)
// The PFS rounds each run in fresh processes (a job restores once, at start), and the raw
// read, the same-layout and the resharded restore take turns at going first (this virtual
// disk slows down after a few GB read in a row).
// With --scale 2,4,8 it measures instead how the recovery of one lost node grows with the
// job: for each node count N (one rank per node, --bytes each, one replica in a ring), the
// job saves a version and replicates it, node 1's host tier is deleted, and a new job of N
// ranks restores, each round in turn: the reference (the partner sending the same bytes to
// rank 1 with UCX tagged sends while the other ranks wait), the lost node alone (rank 1
// restores from its partner's replica, the others only serve: restore() with no targets),
// and the whole job restarting (the others restore from their own host tiers at the same
// time; on this machine they share its cores with the lost node). Only the partner sends,
// so the lost node alone should take about as long at 8 nodes as at 2.
// Before every PFS read (cairn's and raw) the step's files are evicted from the page cache
// (posix_fadvise DONTNEED), so both read the disk. Times are medians; for two ranks the
// slower rank's time counts.
//
//   restore [--bytes 1G] [--rounds 4] [--dir /var/tmp] [--tls <UCX_TLS>]
//   restore --scale 2,4,8 [--bytes 256M] [--rounds 4]
//
// Last line: one JSON object with local_vs_memcpy, peer_vs_raw, pfs_vs_raw_read (reference
// time over cairn's), reshard_over_same_layout (the transposed reshard's time over the
// same layout's), reshard_row_blocks_over_same_layout, and pfs_bytes_read_over_needed
// (bytes the job read from the PFS for a resharded restore over the saved bytes its
// targets overlap; the larger of the two). With --scale: per node count the raw transfer,
// the lost node alone, the whole job's restore (the lost rank's and the slowest rank's), and
// lost_node_alone_largest_over_smallest (the lost node alone at the largest node count over
// the smallest's).
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <sstream>
#include <string>
#include <vector>

#include "api/channels.h"
#include "bench/bench_util.h"
#include "cairn/checkpointer.h"
#include "cli/args.h"
#include "cli/launcher.h"
#include "core/bytes.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "persist/manifest.h"
#include "redundancy/placement.h"
#include "transport/ucx_comm.h"

using namespace cairn;
using cairn::bench::Buffer;
using cairn::bench::Median;

namespace {

// The raw reference arms use the replicator's channels (never at the same time as it).
const JobChannels kChannels;

constexpr int kTensors = 8;
constexpr int64_t kCols = 1024;
constexpr uint64_t kMsg = 64ull << 20;

struct Args {
  uint64_t bytes = 1ull << 30;
  int rounds = 4;
  std::string dir = "/var/tmp";
  std::string tls;
  std::vector<int> scale;  // node counts for the lost-node scaling run
  std::string mode;        // child only
  int round = 0;           // child only: which PFS round this process runs
};

void Die(const char* what, const Status& st) {
  std::fprintf(stderr, "restore: %s: %s\n", what, st.ToString().c_str());
  std::exit(1);
}

uint32_t Value(int t, int64_t row, int64_t col) {
  uint64_t x = (static_cast<uint64_t>(t) << 48) ^ (static_cast<uint64_t>(row) << 16) ^
               static_cast<uint64_t>(col);
  x = (x ^ (x >> 31)) * 0x7fb5d329728ea185ull;
  return static_cast<uint32_t>(x ^ (x >> 27));
}

// A layout's buffers: "rows" (rank r of `world`: rows [rR, (r+1)R), all columns) or, for
// two ranks, "cols" (all rows, columns [r*512, (r+1)*512)) or "rows4" (below).
struct State {
  State(uint64_t bytes, const std::string& layout, int rank, int world = 2) {
    rows = static_cast<int64_t>(bytes / kTensors / (kCols * 4));
    for (int t = 0; t < kTensors; ++t) {
      ShardSpec s;
      s.meta = {"layers." + std::to_string(t) + ".w", DType::kF32, {world * rows, kCols}};
      std::vector<Box> boxes;
      if (layout == "rows") {
        boxes.push_back(Box{{rank * rows, 0}, {rows, kCols}});
      } else if (layout == "cols") {
        boxes.push_back(Box{{0, rank * kCols / 2}, {2 * rows, kCols / 2}});
      } else {  // "rows4": quarter row blocks r and r + 2
        boxes.push_back(Box{{rank * rows / 2, 0}, {rows / 2, kCols}});
        boxes.push_back(Box{{(rank + 2) * rows / 2, 0}, {rows - rows / 2, kCols}});
      }
      for (const Box& b : boxes) {
        s.box = b;
        bufs.push_back(std::make_unique<Buffer>(s.nbytes()));
        s.data = bufs.back()->p;
        shards.push_back(s);
      }
    }
  }
  // Writes (or checks) every element's value.
  bool Visit(bool check) {
    for (const ShardSpec& sh : shards) {
      const int t = std::stoi(sh.meta.name.substr(7));  // "layers.<t>.w"
      const Box& b = sh.box;
      auto* p = static_cast<uint32_t*>(sh.data);
      for (int64_t r = 0; r < b.lengths[0]; ++r)
        for (int64_t c = 0; c < b.lengths[1]; ++c) {
          const uint32_t v = Value(t, b.offsets[0] + r, b.offsets[1] + c);
          uint32_t& e = p[r * b.lengths[1] + c];
          if (!check)
            e = v;
          else if (e != v)
            return false;
        }
    }
    return true;
  }
  uint64_t Bytes() const {
    uint64_t n = 0;
    for (const auto& s : shards) n += s.nbytes();
    return n;
  }
  int64_t rows = 0;
  std::vector<std::unique_ptr<Buffer>> bufs;
  std::vector<ShardSpec> shards;
};

// Evicts the committed step's data files from the page cache.
void Evict(const std::string& step_dir) {
  auto m = ReadManifest(DefaultFileSystem(), step_dir);
  if (!m.ok()) Die("manifest", m.status());
  for (const std::string& f : m->files()) {
    const int fd = ::open(JoinPath(step_dir, f).c_str(), O_RDONLY | O_CLOEXEC);
    if (fd < 0) continue;
    ::posix_fadvise(fd, 0, 0, POSIX_FADV_DONTNEED);
    ::close(fd);
  }
}

// Reads this rank's data file of the step with 4 MiB preads; seconds.
double RawRead(const std::string& path, Buffer& into) {
  const int fd = ::open(path.c_str(), O_RDONLY | O_CLOEXEC);
  if (fd < 0) Die("raw read", Status::FromErrno(errno, path));
  const int64_t t0 = NowNanos();
  uint64_t off = 0;
  for (;;) {
    const ssize_t n =
        ::pread(fd, into.p + (off % into.size),
                std::min<uint64_t>(4 << 20, into.size - off % into.size), static_cast<off_t>(off));
    if (n <= 0) break;
    off += static_cast<uint64_t>(n);
  }
  const double s = NanosToSeconds(NowNanos() - t0);
  ::close(fd);
  return s;
}

// Seconds for rank `from` to send `bytes` to rank `to` with UCX tagged sends (kMsg each,
// all in flight) into `into`'s buffers, timed at `to` from its "ready" message; round `seq`
// keeps the tags of rounds apart. Other ranks return 0 at once.
double RawSend(UcxComm& comm, int me, int from, int to, State& into, const Buffer& src,
               uint64_t bytes, uint32_t seq) {
  if (me == to) {
    std::vector<UcxComm::PendingRecv> rs;
    std::vector<std::pair<std::byte*, uint64_t>> dst;
    for (auto& b : into.bufs)
      for (uint64_t x = 0; x < b->size; x += kMsg)
        dst.push_back({b->p + x, std::min(kMsg, b->size - x)});
    for (uint32_t k = 0; k < dst.size(); ++k)
      rs.push_back(comm.StartRecv(from, MakeTag(kChannels.replication.data, 0, seq << 16 | k),
                                  dst[k].first, dst[k].second));
    const int64_t t0 = NowNanos();
    if (!comm.Send(from, MakeTag(kChannels.replication.ready, 1, seq), "r", 1).ok())
      Die("raw", Status::Internal("ready"));
    for (auto& x : rs)
      if (!comm.FinishRecv(x, 300).ok()) Die("raw", Status::Internal("recv"));
    return NanosToSeconds(NowNanos() - t0);
  }
  if (me == from) {
    if (!comm.Recv(to, MakeTag(kChannels.replication.ready, 1, seq), 300).ok())
      Die("raw", Status::Internal("ready"));
    std::vector<UcxComm::PendingSend> ss;
    const uint64_t per = bytes / kTensors;
    uint32_t k = 0;
    for (int t = 0; t < kTensors; ++t)
      for (uint64_t x = 0; x < per; x += kMsg, ++k)
        ss.push_back(comm.StartSend(to, MakeTag(kChannels.replication.data, 0, seq << 16 | k),
                                    src.p + t * per + x, std::min(kMsg, per - x)));
    for (auto& x : ss)
      if (!comm.FinishSend(x, 300).ok()) Die("raw", Status::Internal("send"));
  }
  return 0;
}

int Child(const Args& a) {
  auto o = Options::FromEnvironment();
  if (!o.ok()) Die("options", o.status());
  o->copy_engine = CopyEngineKind::kHost;
  auto ck = Checkpointer::Open(*o);
  if (!ck.ok()) Die("open", ck.status());
  Checkpointer& c = **ck;
  Group* g = c.group();
  auto barrier = [&] {
    Status b = g->Barrier();
    if (!b.ok()) Die("barrier", b);
  };
  // Every rank's time of a step they all run.
  auto times = [&](double mine) {
    ByteWriter w;
    w.Put<double>(mine);
    auto all = g->AllGather(w.out());
    if (!all.ok()) Die("allgather", all.status());
    std::vector<double> out;
    for (const std::string& s : *all) {
      double x = 0;
      ByteReader r(s);
      r.Get(&x);
      out.push_back(x);
    }
    return out;
  };
  // The slowest rank's.
  auto slowest = [&](double mine) {
    const std::vector<double> all = times(mine);
    return *std::max_element(all.begin(), all.end());
  };
  const std::string step_dir = JoinPath(PfsJobDir(o->pfs_root, o->job_id), StepDirName(1));
  auto restore = [&](std::span<const ShardSpec> shards, bool partial, RestoreReport* out) {
    RestoreOptions ro;
    ro.partial = partial;
    auto r = c.restore(shards, ro);
    if (!r.ok()) Die("restore", r.status());
    if (out) *out = *r;
  };

  if (a.mode == "save" || a.mode == "save-memory") {
    State s(a.bytes, "rows", o->rank, o->world_size);
    s.Visit(false);
    auto out = c.save(1, s.shards);
    if (!out.ok() || *out != SaveOutcome::kQueued) Die("save", out.status());
    Status st = c.wait_captured();
    if (!st.ok()) Die("capture", st);
    st = c.wait_replicated(300);
    if (!st.ok()) Die("replicate", st);
    if (a.mode == "save-memory") return 0;
    auto f = c.flush();
    if (!f.ok()) Die("flush", f.status());
    return 0;
  }
  if (a.mode == "local") {
    State s(a.bytes, "rows", o->rank);
    Buffer src(s.Bytes());
    for (int r = 0; r < a.rounds; ++r) {
      barrier();
      double mc = 0;
      uint64_t off = 0;
      for (auto& b : s.bufs) {
        mc += cairn::bench::TimedMemcpy(b->p, src.p + off, b->size, 1);
        off += b->size;
      }
      mc = slowest(mc);
      barrier();
      RestoreReport rep;
      const int64_t t0 = NowNanos();
      restore(s.shards, false, &rep);
      const double sec = slowest(NanosToSeconds(NowNanos() - t0));
      if (r == 0 && (!s.Visit(true) || rep.tier != "host"))
        Die("local", Status::Corruption("bytes differ"));
      if (o->rank == 0) std::printf("LOCAL %.6f %.6f\n", mc, sec);
      std::fflush(stdout);
    }
    return 0;
  }
  if (a.mode == "peer") {
    // Raw UCX on its own connection (a separate job id).
    Options ro = *o;
    ro.job_id = o->job_id + "-raw";
    Logger log("bench rank " + std::to_string(o->rank), LogLevel::kWarning);
    auto comm = UcxComm::Connect(ro, &log);
    if (!comm.ok()) Die("raw connect", comm.status());
    State s(a.bytes, "rows", o->rank);
    Buffer src(o->rank == 0 ? a.bytes : 4096);
    for (int r = 0; r < a.rounds; ++r) {
      // Raw: rank 0 -> rank 1, into the memory rank 1 restores into.
      barrier();
      const double raw =
          RawSend(**comm, o->rank, 0, 1, s, src, a.bytes, static_cast<uint32_t>(r + 1));
      barrier();
      // cairn: rank 1 restores from rank 0's replica; rank 0 only serves.
      RestoreReport rep;
      const int64_t t0 = NowNanos();
      restore(o->rank == 1 ? std::span<const ShardSpec>(s.shards) : std::span<const ShardSpec>(),
              true, &rep);
      const double sec = NanosToSeconds(NowNanos() - t0);
      if (o->rank == 1 && r == 0 &&
          (!s.Visit(true) || rep.tier != "peer" || rep.job_pfs_bytes_read != 0))
        Die("peer", Status::Corruption("bytes differ or not from the peer: " + rep.tier));
      if (o->rank == 1) std::printf("PEER %.6f %.6f\n", raw, sec);
      std::fflush(stdout);
    }
    return 0;
  }
  if (a.mode == "scale") {
    // Node 1 was lost; its replica lives with its ring partner.
    auto pl = Placement::Make(o->world_size, 1, 1, PlacementStrategy::kRing);
    if (!pl.ok()) Die("placement", pl.status());
    const int partner = pl->holders_of(1)[0];
    Options ro = *o;
    ro.job_id = o->job_id + "-raw";
    Logger log("bench rank " + std::to_string(o->rank), LogLevel::kWarning);
    auto comm = UcxComm::Connect(ro, &log);
    if (!comm.ok()) Die("raw connect", comm.status());
    State s(a.bytes, "rows", o->rank, o->world_size);
    Buffer src(o->rank == partner ? a.bytes : 4096);
    for (int r = 0; r < a.rounds; ++r) {
      barrier();
      const double raw =
          RawSend(**comm, o->rank, partner, 1, s, src, a.bytes, static_cast<uint32_t>(r + 1));
      barrier();
      // cairn, lost node alone: rank 1 restores from its partner; the others only serve.
      RestoreReport rep;
      int64_t t0 = NowNanos();
      restore(o->rank == 1 ? std::span<const ShardSpec>(s.shards) : std::span<const ShardSpec>(),
              true, &rep);
      const std::vector<double> alone = times(NanosToSeconds(NowNanos() - t0));
      if (r == 0 && o->rank == 1 &&
          (!s.Visit(true) || rep.tier != "peer" || rep.job_pfs_bytes_read != 0))
        Die("scale", Status::Corruption("bytes differ or not from the peer: " + rep.tier));
      barrier();
      // cairn, the whole job restarts: rank 1 from its partner, the others from home.
      t0 = NowNanos();
      restore(s.shards, false, &rep);
      const std::vector<double> all = times(NanosToSeconds(NowNanos() - t0));
      if (r == 0 && (!s.Visit(true) || rep.tier != (o->rank == 1 ? "peer" : "host") ||
                     rep.job_pfs_bytes_read != 0))
        Die("scale", Status::Corruption("bytes differ or not from memory: " + rep.tier));
      if (o->rank == 1)
        std::printf("SCALE %.6f %.6f %.6f %.6f\n", raw, alone[1], all[1],
                    *std::max_element(all.begin(), all.end()));
      std::fflush(stdout);
    }
    return 0;
  }
  if (a.mode == "pfs") {
    State same(a.bytes, "rows", o->rank), cols(a.bytes, "cols", o->rank),
        rows4(a.bytes, "rows4", o->rank);
    auto m = ReadManifest(DefaultFileSystem(), step_dir);
    if (!m.ok()) Die("manifest", m.status());
    uint64_t file_bytes = 0;
    const std::string mine = JoinPath(step_dir, DataFileName(o->rank));
    {
      const int fd = ::open(mine.c_str(), O_RDONLY | O_CLOEXEC);
      if (fd >= 0) {
        file_bytes = static_cast<uint64_t>(::lseek(fd, 0, SEEK_END));
        ::close(fd);
      }
    }
    Buffer raw_buf(std::max<uint64_t>(file_bytes, 4096));
    // One round per process (the parent launches --rounds of them): a job restores once
    // at start, into memory it has not used before.
    for (int r = 0; r < 1; ++r) {
      auto timed = [&](auto fn) {
        if (o->rank == 0) Evict(step_dir);
        barrier();
        const int64_t t0 = NowNanos();
        fn();
        return slowest(NanosToSeconds(NowNanos() - t0));
      };
      // The virtual disk here slows down after a few GB in a row (burst credit), so the
      // four take turns at going first: round r starts with the (r mod 4)-th.
      RestoreReport a_rep, b_rep, c_rep;
      double raw = 0, s_same = 0, s_cols = 0, s_rows4 = 0;
      for (int i = 0; i < 4; ++i) {
        switch ((a.round + i) % 4) {
          case 0:
            raw = timed([&] { RawRead(mine, raw_buf); });
            break;
          case 1:
            s_same = timed([&] { restore(same.shards, false, &a_rep); });
            break;
          case 2:
            s_cols = timed([&] { restore(cols.shards, false, &b_rep); });
            break;
          default:
            s_rows4 = timed([&] { restore(rows4.shards, false, &c_rep); });
        }
      }
      if (r == 0 && (!same.Visit(true) || !cols.Visit(true) || !rows4.Visit(true) ||
                     a_rep.tier != "pfs" || !b_rep.resharded || !c_rep.resharded))
        Die("pfs", Status::Corruption("bytes differ"));
      if (o->rank == 0)
        std::printf("PFS %.6f %.6f %.6f %llu %llu %.6f %llu %llu\n", raw, s_same, s_cols,
                    static_cast<unsigned long long>(b_rep.job_pfs_bytes_read),
                    static_cast<unsigned long long>(b_rep.job_unique_bytes_needed), s_rows4,
                    static_cast<unsigned long long>(c_rep.job_pfs_bytes_read),
                    static_cast<unsigned long long>(c_rep.job_unique_bytes_needed));
      std::fflush(stdout);
    }
    return 0;
  }
  return 2;
}

// Lines of rank `r`'s log starting with `tag`.
std::vector<std::string> Lines(const std::string& root, int r, const std::string& tag) {
  std::ifstream f(root + "/rank-" + std::to_string(r) + ".log");
  std::vector<std::string> out;
  for (std::string line; std::getline(f, line);)
    if (line.rfind(tag, 0) == 0) out.push_back(line.substr(tag.size()));
  return out;
}

// The --scale run: for each node count, save and replicate, lose node 1, then rounds of
// raw transfer and whole-job restore; prints a line per count and the JSON line.
template <typename Run, typename Cleanup>
int Scale(const Args& a, const std::string& root, const std::string& job, Run& run,
          Cleanup& cleanup) {
  nlohmann::ordered_json rows = nlohmann::ordered_json::array();
  std::vector<double> alone_by_count;
  for (int nodes : a.scale) {
    (void)DefaultFileSystem()->RemoveAll(root + "/host");
    run("save-memory", 0, nodes);
    (void)DefaultFileSystem()->RemoveAll(root + "/host/" + job + "/node-1");
    run("scale", 0, nodes);
    std::vector<double> raw, alone, lost, whole;
    for (const std::string& l : Lines(root, 1, "SCALE ")) {
      double w = 0, x = 0, y = 0, z = 0;
      std::sscanf(l.c_str(), "%lf %lf %lf %lf", &w, &x, &y, &z);
      raw.push_back(w);
      alone.push_back(x);
      lost.push_back(y);
      whole.push_back(z);
    }
    if (lost.empty()) {
      std::fprintf(stderr, "restore: no results at %d nodes\n", nodes);
      cleanup();
      return 1;
    }
    const double gb = static_cast<double>(a.bytes) / 1e9;
    const double ru = Median(raw), al = Median(alone), lo = Median(lost), wh = Median(whole);
    std::printf(
        "%d nodes: raw UCX %.3f s (%.2f GB/s)  lost node alone %.3f s (%.2f GB/s)  whole job "
        "restarting: lost node %.3f s, slowest rank %.3f s\n",
        nodes, ru, gb / ru, al, gb / al, lo, wh);
    std::fflush(stdout);
    alone_by_count.push_back(al);
    using cairn::bench::Round;
    rows.push_back({{"nodes", nodes},
                    {"raw_s", Round(ru, 4)},
                    {"lost_node_alone_s", Round(al, 4)},
                    {"lost_node_alone_vs_raw", Round(ru / al, 3)},
                    {"job_lost_node_s", Round(lo, 4)},
                    {"job_slowest_s", Round(wh, 4)}});
  }
  cleanup();
  const nlohmann::ordered_json j = {
      {"bench", "restore_scale"},
      {"bytes_per_rank", a.bytes},
      {"rounds", a.rounds},
      {"counts", rows},
      {"lost_node_alone_largest_over_smallest",
       cairn::bench::Round(alone_by_count.back() / alone_by_count.front(), 3)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  Args a;
  bool child = false;
  CLI::App app(
      "Restore time from the local host tier, a peer's replica over UCX and the PFS (--dir) "
      "for two ranks holding --bytes each, each beside its raw reference (memcpy, UCX tagged "
      "sends, sequential reads), and a resharded PFS restore beside a same-layout one. Prints "
      "one JSON line last.",
      "bench_restore");
  cairn::cli::AddByteCount(app, "--bytes", &a.bytes, "state per rank (default 1G)");
  app.add_option("--rounds", a.rounds, "rounds (medians reported)")
      ->check(CLI::Range(1, 1000))
      ->capture_default_str();
  app.add_option("--dir", a.dir, "the PFS directory")->capture_default_str();
  app.add_option("--tls", a.tls, "UCX_TLS for the ranks (default: UCX's choice)");
  app.add_option("--scale", a.scale,
                 "instead: one lost node's recovery at each of these node counts (one rank "
                 "per node, --bytes each; e.g. 2,4,8 with --bytes 256M)")
      ->delimiter(',')
      ->check(CLI::Range(2, 64));
  app.add_option("--child", a.mode, "internal: a rank, in this mode")->group("");
  app.add_option("--round", a.round, "internal: the child's PFS round")->group("");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  child = !a.mode.empty();
  if (a.bytes < (kTensors * kCols * 4 * 2) || a.rounds < 1) {
    std::fprintf(stderr, "restore: --bytes too small or --rounds < 1\n");
    return 2;
  }
  a.bytes = a.bytes / (kTensors * kCols * 4) * (kTensors * kCols * 4);
  if (child) return Child(a);

  char host_t[] = "/dev/shm/cairn-bench-restore-XXXXXX";
  std::string pfs_t = a.dir + "/cairn-bench-restore-XXXXXX";
  if (!::mkdtemp(host_t) || !::mkdtemp(pfs_t.data())) {
    std::perror("mkdtemp");
    return 1;
  }
  const std::string root = host_t, pfs = pfs_t;
  const std::string job = "bench-restore-" + std::to_string(::getpid());
  auto cleanup = [&] {
    (void)DefaultFileSystem()->RemoveAll(root);
    (void)DefaultFileSystem()->RemoveAll(pfs);
  };
  auto run = [&](const std::string& mode, int round, int nodes = 2) {
    LaunchSpec spec;
    spec.nodes = nodes;
    spec.argv = {"/proc/self/exe",
                 "--child",
                 mode,
                 "--bytes",
                 std::to_string(a.bytes),
                 "--rounds",
                 std::to_string(a.rounds),
                 "--round",
                 std::to_string(round)};
    spec.output_dir = root;
    spec.env = {{"CAIRN_JOB_ID", job},
                {"CAIRN_HOST_ROOT", root + "/host"},
                {"CAIRN_PFS_ROOT", pfs},
                {"CAIRN_PERSIST_EVERY", "0"},
                {"CAIRN_REPLICAS", "1"},
                {"CAIRN_SLOTS", "2"},
                {"CAIRN_REPLICATE_TIMEOUT_S", "300"},
                {"CAIRN_OP_TIMEOUT_S", "600"}};
    if (!a.tls.empty()) spec.env.push_back({"UCX_TLS", a.tls});
    auto l = LocalLauncher::Start(spec);
    if (!l.ok() || !(*l)->WaitAll(1800)) {
      for (int r = 0; r < nodes; ++r) {
        std::ifstream f(root + "/rank-" + std::to_string(r) + ".log");
        std::stringstream ss;
        ss << f.rdbuf();
        std::fprintf(stderr, "restore: %s failed; rank %d:\n%s\n", mode.c_str(), r,
                     ss.str().c_str());
      }
      cleanup();
      std::exit(1);
    }
  };
  std::sort(a.scale.begin(), a.scale.end());
  if (!a.scale.empty()) return Scale(a, root, job, run, cleanup);
  run("save", 0);
  run("local", 0);
  (void)DefaultFileSystem()->RemoveAll(root + "/host/" + job + "/node-1");
  run("peer", 0);
  (void)DefaultFileSystem()->RemoveAll(root + "/host");
  for (int r = 0; r < a.rounds; ++r) run("pfs", r);

  std::vector<double> memcpy_s, local_s, raw_ucx_s, peer_s, raw_read_s, same_s, reshard_s;
  double read_over_needed = 0;
  for (const std::string& l : Lines(root, 0, "LOCAL ")) {
    double x = 0, y = 0;
    std::sscanf(l.c_str(), "%lf %lf", &x, &y);
    memcpy_s.push_back(x);
    local_s.push_back(y);
  }
  for (const std::string& l : Lines(root, 1, "PEER ")) {
    double x = 0, y = 0;
    std::sscanf(l.c_str(), "%lf %lf", &x, &y);
    raw_ucx_s.push_back(x);
    peer_s.push_back(y);
  }
  std::vector<double> rows4_s;
  double rows4_read_over_needed = 0;
  for (const std::string& l : Lines(root, 0, "PFS ")) {
    double x = 0, y = 0, z = 0, w = 0;
    unsigned long long read = 0, needed = 0, read4 = 0, needed4 = 0;
    std::sscanf(l.c_str(), "%lf %lf %lf %llu %llu %lf %llu %llu", &x, &y, &z, &read, &needed, &w,
                &read4, &needed4);
    raw_read_s.push_back(x);
    same_s.push_back(y);
    reshard_s.push_back(z);
    rows4_s.push_back(w);
    std::printf(
        "pfs round %zu: raw read %.3f s, same layout %.3f s, resharded: transposed "
        "%.3f s, row blocks %.3f s\n",
        raw_read_s.size() - 1, x, y, z, w);
    read_over_needed = needed ? static_cast<double>(read) / static_cast<double>(needed) : 0;
    rows4_read_over_needed =
        needed4 ? static_cast<double>(read4) / static_cast<double>(needed4) : 0;
  }
  cleanup();
  if (local_s.empty() || peer_s.empty() || same_s.empty()) {
    std::fprintf(stderr, "restore: missing results\n");
    return 1;
  }
  const double gb = static_cast<double>(a.bytes) / 1e9;
  const double mc = Median(memcpy_s), lo = Median(local_s), ru = Median(raw_ucx_s),
               pe = Median(peer_s), rr = Median(raw_read_s), sa = Median(same_s),
               re = Median(reshard_s), r4 = Median(rows4_s);
  std::printf("per rank %.2f GB, 2 ranks, medians of %d rounds\n", gb, a.rounds);
  std::printf("local : memcpy %.3f s (%.2f GB/s)  cairn %.3f s (%.2f GB/s)\n", mc, gb / mc, lo,
              gb / lo);
  std::printf("peer  : raw UCX %.3f s (%.2f GB/s)  cairn %.3f s (%.2f GB/s)\n", ru, gb / ru, pe,
              gb / pe);
  std::printf(
      "pfs   : raw read %.3f s (%.2f GB/s per rank)  cairn same layout %.3f s  "
      "resharded: transposed %.3f s, row blocks %.3f s\n",
      rr, gb / rr, sa, re, r4);
  using cairn::bench::Round;
  const nlohmann::ordered_json j = {
      {"bench", "restore"},
      {"bytes_per_rank", a.bytes},
      {"ranks", 2},
      {"rounds", a.rounds},
      {"local", {{"memcpy_gbps", Round(gb / mc, 3)}, {"restore_gbps", Round(gb / lo, 3)}}},
      {"peer", {{"raw_gbps", Round(gb / ru, 3)}, {"restore_gbps", Round(gb / pe, 3)}}},
      {"pfs",
       {{"raw_read_gbps", Round(gb / rr, 3)},
        {"same_layout_gbps", Round(gb / sa, 3)},
        {"resharded_gbps", Round(gb / re, 3)}}},
      {"local_vs_memcpy", Round(mc / lo, 3)},
      {"peer_vs_raw", Round(ru / pe, 3)},
      {"pfs_vs_raw_read", Round(rr / sa, 3)},
      {"reshard_over_same_layout", Round(re / sa, 3)},
      {"reshard_row_blocks_over_same_layout", Round(r4 / sa, 3)},
      {"pfs_bytes_read_over_needed", Round(std::max(read_over_needed, rows4_read_over_needed), 3)}};
  std::printf("%s\n", j.dump().c_str());
  return 0;
}
