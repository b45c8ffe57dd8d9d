// bench/replicate: cairn's replication throughput against raw UCX between the same two
// processes, over tcp and over shared memory.
//
// For each transport the driver starts two ranks on two "nodes" (cairn launch style, with
// UCX_TLS set) of this same program. In each rank pair, for each version size:
//   raw     the better of two loops moving the bytes from rank 0 to pre-faulted memory of
//           rank 1: 64 MiB tagged messages all in flight at once, answered by a one-byte
//           acknowledgement once all arrived; and 64 MiB puts into registered memory
//           followed by a flush (remote completion).
//   perftest  UCX's own ucx_perftest -t tag_bw, 64 MiB messages, as many as the size
//           needs (at least 2): its server run by rank 1, its client by rank 0, with the
//           ranks' UCX_* settings, on the same links (--no-perftest leaves it out); and
//           again over tcp with -e, its endpoints made with peer error handling as
//           cairn's are there (so that a dead peer is reported, not waited for): UCX then
//           moves these 64 MiB messages at 0.5-0.7 of the rate between two processes of
//           this machine (8 MiB ones two in flight, replication's pattern, at the same rate)
//           (perftest_err_gbps; over sm,self UCX has no such mode and cairn's endpoints go without
//           it, as the plain arm does); and over tcp with -e once more, one message the size
//           of the version, twice (perftest_err_whole_gbps): its buffers are then as large
//           as the version's bytes, where the 64 MiB ones are reused and stay in this
//           machine's cache (a 480 MiB L3 here; a version is captured with streaming stores
//           and leaves from memory, and lands in a slot not touched since its last use).
//   cairn   rank 0 saves a version of that size; the time from the OFFER to the holder's
//           acknowledgement (bytes verified, persisted, replica published) is taken from
//           cairn's stats.
// They alternate (raw, perftest, cairn, raw, ...): one warm-up round (the first use of each
// of the holder's replica slots and of the sender's own slots faults in its pages: a job's
// steady state reuses them), then the median of 5 rounds of each. Every arm is measured
// on memory in use, as a job's is: ucx_perftest warms its own buffers up; the raw loop runs
// twice a round and the second counts; cairn saves slots + 1 versions back to back a round,
// each waiting for its replica as a job saving every iteration at the replication rate
// would, and the last counts (its slot, and the holder's, were last used `slots` saves
// before, in this round). A round lasts 10-20 s with the reference arms, so the first
// save of a round lands in slots left idle for `slots` rounds, far longer than a job
// saving every iteration leaves them: on machines whose memory left idle for tens of
// seconds is slow to touch again (2.5x on the AMD PVM guests: bench/idle_pages), that
// first push is reported apart (replicate_cold_gbps), not as the rate.
// ack_latency_ms is the holder's part: from the last byte sent to its acknowledgement.
// With CAIRN_TRACE set, rank 0's trace holds a span per round of each reference arm ("bench
// raw tag", "bench raw put", "bench ucx_perftest[ -e[ whole]]", a ucx_perftest one from its
// client's start to its exit) beside cairn's own ("replicate push"), on the monotonic clock
// that `perf record -k CLOCK_MONOTONIC` stamps its samples with: a profile can be cut by arm.
// With --netns the two ranks run in two network namespaces of a cluster on this machine
// (scripts/netns_cluster.sh: a veth link each to a bridge), over tcp only; with --link-rate
// (tc tbf, e.g. 4gbit) each node's link is limited to that rate both ways, as a node's
// network link is on a cluster, and every arm (raw, ucx_perftest, cairn) then waits on the
// links rather than on this machine's two cores, which otherwise carry both nodes' TCP and
// veth paths and both ranks.
//
//   replicate [--sizes 256M,1G] [--transports tcp,shm] [--netns [--link-rate RATE]]
//             [--no-perftest]
//
// Prints a table and one JSON line per transport; the last line holds them all,
// `replicate_vs_raw`, the lowest replicate/raw ratio over the transports at the largest
// size (and `replicate_vs_raw_all_sizes`, the lowest over every size), and
// `replicate_vs_perftest`, the lowest replicate/ucx_perftest ratio at the largest size, and
// `replicate_vs_perftest_err` the same against ucx_perftest -e.
#include <fcntl.h>
#include <signal.h>
#include <spawn.h>
#include <sys/mman.h>
#include <sys/wait.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <memory>
#include <sstream>
#include <string>
#include <vector>

#include "api/channels.h"
#include "bench/bench_netns.h"
#include "bench/bench_util.h"
#include "cairn/checkpointer.h"
#include "cli/args.h"
#include "cli/launcher.h"
#include "core/arith.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "core/trace.h"
#include "transport/ucx_comm.h"

using namespace cairn;
using cairn::bench::Median;
using cairn::bench::SplitList;

namespace {

// The raw reference arms use the replicator's channels (never at the same time as it).
const JobChannels kChannels;

constexpr uint64_t kChunk = 64ull << 20;

// ucx_perftest, UCX's own benchmark, as the reference the issue names: rank 1 runs its
// server, rank 0 its client (tag_bw: the client sends), with this process's UCX_*
// settings, on the same links. Messages of kChunk bytes, `iters` of them.
std::string PerftestPort() {
  const char* p = std::getenv("CAIRN_BENCH_PERFTEST_PORT");
  return p ? p : "13337";
}

// Starts the server (rank 1); its pid, or -1. Spawned, not forked: a fork write-protects
// every private page of this process for copy-on-write, and the raw arm's next receive into
// `memory` then took a fault per page (on a paravirtualised guest, 1 GiB at 0.10-0.15 GB/s
// against 1.2-2.0 without the fork, 2026-11-30).
pid_t StartPerftestServer(bool errors) {
  const std::string port = PerftestPort();
  std::vector<char*> argv = {const_cast<char*>("ucx_perftest"), const_cast<char*>("-p"),
                             const_cast<char*>(port.c_str())};
  if (errors) argv.push_back(const_cast<char*>("-e"));
  argv.push_back(nullptr);
  posix_spawn_file_actions_t fa;
  ::posix_spawn_file_actions_init(&fa);
  ::posix_spawn_file_actions_addopen(&fa, 1, "/dev/null", O_WRONLY, 0);
  pid_t pid = -1;
  const int rc = ::posix_spawnp(&pid, "ucx_perftest", &fa, nullptr, argv.data(), environ);
  ::posix_spawn_file_actions_destroy(&fa);
  return rc == 0 ? pid : -1;
}

// Runs the client (rank 0) against `host` (`errors`: -e, peer error handling); the overall
// bandwidth in GB/s (10^9 bytes), or -1 (its output on stderr).
double RunPerftestClient(const std::string& host, uint64_t iters, bool errors,
                         uint64_t message = kChunk) {
  const std::string cmd = "ucx_perftest " + host + " -p " + PerftestPort() + " -t tag_bw -s " +
                          std::to_string(message) + " -n " + std::to_string(iters) +
                          (errors ? " -e" : "") + " 2>&1";
  for (int attempt = 0; attempt < 20; ++attempt) {  // the server may not listen yet
    // popen spawns (glibc 2.29 and later: posix_spawn, no copy-on-write of this process).
    FILE* p = ::popen(cmd.c_str(), "r");
    if (!p) return -1;
    std::string out;
    char b[4096];
    size_t n;
    while ((n = std::fread(b, 1, sizeof b, p)) > 0) out.append(b, n);
    const int rc = ::pclose(p);
    const size_t at = out.find("Final:");
    double it = 0, o50 = 0, oavg = 0, oall = 0, bw_avg = 0, bw_all = 0;
    if (rc == 0 && at != std::string::npos &&
        std::sscanf(out.c_str() + at, "Final: %lf %lf %lf %lf %lf %lf", &it, &o50, &oavg, &oall,
                    &bw_avg, &bw_all) == 6)
      return bw_all * 1048576.0 / 1e9;  // ucx_perftest's MB is 2^20 bytes
    if (attempt == 19) std::fprintf(stderr, "bench: ucx_perftest failed:\n%s\n", out.c_str());
    ::usleep(100'000);
  }
  return -1;
}

// One rank of the pair. Prints "RESULT size raw_gbps replicate_gbps ack_ms ..." on rank 0.
// `perftest_errors`: also the ucx_perftest -e arm (tcp: cairn's endpoints have peer error
// handling there; over sm,self UCX offers none, cairn's endpoints go without, and so does
// the plain arm).
int Child(const std::vector<uint64_t>& sizes, const std::string& perftest_host,
          bool perftest_errors) {
  auto o = Options::FromEnvironment();
  if (!o.ok()) return 1;
  Logger log("bench rank " + std::to_string(o->rank), LogLevel::kWarning);
  const uint64_t max_size = *std::max_element(sizes.begin(), sizes.end());
  cairn::bench::Buffer memory(max_size);
  std::byte* buf = memory.p;

  // Raw UCX on its own connection (a separate job id, so nothing is shared with cairn's),
  // and cairn: rank 0 saves, rank 1 holds its replicas. The two are measured alternately
  // (raw, cairn, raw, cairn, ...) so that the machine's noise hits both alike.
  Options ro = *o;
  ro.job_id = o->job_id + "-raw";
  auto comm = UcxComm::Connect(ro, &log);
  if (!comm.ok()) {
    std::fprintf(stderr, "bench: %s\n", comm.status().ToString().c_str());
    return 1;
  }
  o->copy_engine = CopyEngineKind::kHost;
  o->full_policy = FullPolicy::kBlock;
  o->slot_bytes = max_size + (4 << 20);
  o->replicate_timeout_s = 120;
  auto ck = Checkpointer::Open(*o);
  if (!ck.ok()) {
    std::fprintf(stderr, "bench: %s\n", ck.status().ToString().c_str());
    return 1;
  }
  Checkpointer& c = **ck;
  uint32_t seq = 0;
  auto raw_once = [&](uint64_t size) -> double {
    ++seq;
    const uint32_t chunks = static_cast<uint32_t>(CeilDiv(size, kChunk));
    if (o->rank == 1) {
      std::vector<UcxComm::PendingRecv> rs;
      for (uint32_t k = 0; k < chunks; ++k)
        rs.push_back((*comm)->StartRecv(0, MakeTag(kChannels.replication.data, 0, seq << 16 | k),
                                        buf + k * kChunk, std::min(kChunk, size - k * kChunk),
                                        UcxComm::Auth::kContent));
      if (!(*comm)->Send(0, MakeTag(kChannels.replication.ready, 1, seq), "r", 1).ok()) return -1;
      for (auto& r : rs)
        if (!(*comm)->FinishRecv(r, 120).ok()) return -1;
      if (!(*comm)->Send(0, MakeTag(kChannels.replication.ack, 1, seq), "a", 1).ok()) return -1;
      return 0;
    }
    if (!(*comm)->Recv(1, MakeTag(kChannels.replication.ready, 1, seq), 120).ok()) return -1;
    const int64_t t0 = NowNanos();
    std::vector<UcxComm::PendingSend> ss;
    for (uint32_t k = 0; k < chunks; ++k)
      ss.push_back((*comm)->StartSend(1, MakeTag(kChannels.replication.data, 0, seq << 16 | k),
                                      buf + k * kChunk, std::min(kChunk, size - k * kChunk),
                                      UcxComm::Auth::kContent));
    for (auto& x : ss)
      if (!(*comm)->FinishSend(x, 120).ok()) return -1;
    if (!(*comm)->Recv(1, MakeTag(kChannels.replication.ack, 1, seq), 120).ok()) return -1;
    const int64_t t1 = NowNanos();
    Trace::Record("bench raw tag", "bench", t0, t1);
    return NanosToSeconds(t1 - t0);
  };
  // put + flush into rank 1's registered buffer.
  std::unique_ptr<UcxComm::MemRegion> region;
  std::unique_ptr<UcxComm::RemoteKey> rkey;
  uint64_t remote_addr = 0;
  const uint64_t kKeyTag = MakeTag(kChannels.replication.offer, 1, 0xfffffff0u);
  if (o->rank == 1) {
    auto r = (*comm)->Register(buf, max_size);
    if (!r.ok()) return 1;
    region = std::move(*r);
    std::string msg(8, '\0');
    const uint64_t a = region->address();
    std::memcpy(msg.data(), &a, 8);
    msg += region->packed_rkey();
    if (!(*comm)->Send(0, kKeyTag, msg.data(), msg.size()).ok()) return 1;
  } else {
    auto msg = (*comm)->Recv(1, kKeyTag, 120);
    if (!msg.ok() || msg->size() < 8) return 1;
    std::memcpy(&remote_addr, msg->data(), 8);
    auto k = (*comm)->UnpackRemoteKey(1, msg->substr(8));
    if (!k.ok()) {
      std::fprintf(stderr, "bench: %s\n", k.status().ToString().c_str());
      return 1;
    }
    rkey = std::move(*k);
  }
  // ucx_perftest over the same bytes (rounded up to whole 64 MiB messages), or (`whole`)
  // twice one message of all of them.
  auto perftest_once = [&](uint64_t size, bool errors, bool whole = false) -> double {
    if (perftest_host.empty()) return 0;
    ++seq;
    const uint64_t iters = whole ? 2 : std::max<uint64_t>(2, CeilDiv(size, kChunk));
    if (o->rank == 1) {
      const pid_t server = StartPerftestServer(errors);
      if (server < 0) return -1;
      if (!(*comm)->Send(0, MakeTag(kChannels.replication.ready, 1, seq), "r", 1).ok()) return -1;
      const bool done = (*comm)->Recv(0, MakeTag(kChannels.replication.ack, 0, seq), 300).ok();
      int status = 0;
      if (!done) ::kill(server, SIGKILL);
      ::waitpid(server, &status, 0);
      return done ? 0 : -1;
    }
    if (!(*comm)->Recv(1, MakeTag(kChannels.replication.ready, 1, seq), 120).ok()) return -1;
    const int64_t t0 = NowNanos();
    const double gbps = RunPerftestClient(perftest_host, iters, errors, whole ? size : kChunk);
    Trace::Record(whole    ? "bench ucx_perftest -e whole"
                  : errors ? "bench ucx_perftest -e"
                           : "bench ucx_perftest",
                  "bench", t0, NowNanos());
    if (!(*comm)->Send(1, MakeTag(kChannels.replication.ack, 0, seq), "d", 1).ok()) return -1;
    return gbps;
  };
  auto put_once = [&](uint64_t size) -> double {
    ++seq;
    const uint32_t chunks = static_cast<uint32_t>(CeilDiv(size, kChunk));
    if (o->rank == 1) {
      // Stay in progress (puts into user memory are emulated over active messages here).
      if (!(*comm)->Send(0, MakeTag(kChannels.replication.ready, 1, seq), "r", 1).ok()) return -1;
      if (!(*comm)->Recv(0, MakeTag(kChannels.replication.ack, 0, seq), 120).ok()) return -1;
      return 0;
    }
    if (!(*comm)->Recv(1, MakeTag(kChannels.replication.ready, 1, seq), 120).ok()) return -1;
    const int64_t t0 = NowNanos();
    std::vector<UcxComm::PendingSend> ps;
    for (uint32_t k = 0; k < chunks; ++k)
      ps.push_back((*comm)->StartPut(1, buf + k * kChunk, std::min(kChunk, size - k * kChunk),
                                     remote_addr + k * kChunk, *rkey));
    for (auto& x : ps)
      if (!(*comm)->FinishSend(x, 120).ok()) return -1;
    if (!(*comm)->Flush(1, 120).ok()) return -1;
    const int64_t t1 = NowNanos();
    Trace::Record("bench raw put", "bench", t0, t1);
    if (!(*comm)->Send(1, MakeTag(kChannels.replication.ack, 0, seq), "d", 1).ok()) return -1;
    return NanosToSeconds(t1 - t0);
  };
  int64_t step = 0;
  std::string report;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t size = sizes[i];
    std::vector<double> raw_s, put_s, push_ms, cold_push_ms, ack_ms, perftest_gbps,
        perftest_err_gbps, perftest_whole_gbps;
    std::vector<ShardSpec> shards = {
        ShardSpec::Whole({"state", DType::kU8, {static_cast<int64_t>(size)}}, buf)};
    // Rank 1 saves the same steps, as every rank of a job must (the step agreement waits
    // for them: without them each of rank 0's pushes waited out its coverage wait), with a
    // 4 KiB state of its own, so that its pushes take nothing measurable from rank 0's.
    std::vector<ShardSpec> tiny = {ShardSpec::Whole({"tiny", DType::kU8, {4096}}, buf)};
    const int warmups = 1;
    const int saves = o->slots + 1;  // a round's cairn saves; the last one counts
    for (int rep = 0; rep < warmups + 5; ++rep) {
      if (raw_once(size) < 0) return 1;  // the raw loop's warm-up
      const double r = raw_once(size);
      const double pt = put_once(size);
      const double pf = perftest_once(size, false);
      const double pfe = perftest_errors ? perftest_once(size, true) : 0;
      const double pfw = perftest_errors ? perftest_once(size, true, true) : 0;
      if (r < 0 || pt < 0 || pf < 0 || pfe < 0 || pfw < 0) return 1;
      if (o->rank == 1) {
        for (int k = 0; k < saves; ++k)
          if (!c.save(++step, tiny).ok() || !c.wait_captured().ok()) return 1;
        if (Group* g = c.group(); !g->Barrier().ok()) return 1;  // rank 0's cairn pushes
        continue;
      }
      double cold_ms = 0;
      for (int k = 0; k < saves; ++k) {
        if (!c.save(++step, shards).ok() || !c.wait_captured().ok()) return 1;
        Status w = c.wait_replicated(300);
        if (!w.ok()) {
          std::fprintf(stderr, "bench: %s\n", w.ToString().c_str());
          return 1;
        }
        if (k == 0) cold_ms = c.stats().replication.push_ms;
      }
      if (Group* g = c.group(); !g->Barrier().ok()) return 1;
      if (rep >= warmups) {  // every slot of both ranks has been used once
        const Stats st = c.stats();
        cold_push_ms.push_back(cold_ms);
        raw_s.push_back(r);
        put_s.push_back(pt);
        perftest_gbps.push_back(pf);
        perftest_err_gbps.push_back(pfe);
        perftest_whole_gbps.push_back(pfw);
        push_ms.push_back(st.replication.push_ms);
        ack_ms.push_back(st.replication.ack_ms);
      }
    }
    if (o->rank == 0) {
      char line[256];
      const double tag_gbps = static_cast<double>(size) / Median(raw_s) / 1e9;
      const double put_gbps = static_cast<double>(size) / Median(put_s) / 1e9;
      std::snprintf(line, sizeof line, "RESULT %llu %.4f %.4f %.3f %.4f %.4f %.4f %.4f %.4f %.4f\n",
                    static_cast<unsigned long long>(size), std::max(tag_gbps, put_gbps),
                    static_cast<double>(size) / (Median(push_ms) / 1e3) / 1e9, Median(ack_ms),
                    tag_gbps, put_gbps, Median(perftest_gbps), Median(perftest_err_gbps),
                    Median(perftest_whole_gbps),
                    static_cast<double>(size) / (Median(cold_push_ms) / 1e3) / 1e9);
      report += line;
    }
  }
  if (Group* g = c.group()) (void)g->Barrier();
  std::fputs(report.c_str(), stdout);
  std::fflush(stdout);
  return 0;
}

}  // namespace

int main(int argc, char** argv) {
  std::string sizes_arg = "256M,1G", transports_arg = "tcp,shm", perftest_host, link_rate;
  bool child = false, netns = false, no_perftest = false, perftest_errors = false;
  CLI::App app(
      "Replication of a captured version to another node's memory over UCX against raw UCX "
      "transfers of the same bytes between the same processes (tagged sends and puts + "
      "flush, alternated with cairn's rounds). Prints one JSON line per size and transport, "
      "then the summary line last.",
      "bench_replicate");
  app.add_option("--sizes", sizes_arg, "version sizes (K/M/G suffix, comma-separated)")
      ->capture_default_str();
  app.add_option("--transports", transports_arg, "tcp and/or shm, comma-separated")
      ->capture_default_str();
  app.add_flag("--netns", netns,
               "run the two ranks in two network namespaces of their own, on a switch "
               "(scripts/netns_cluster.sh; needs root), over tcp only");
  app.add_option("--link-rate", link_rate,
                 "with --netns: every node link's rate both ways (tc tbf, e.g. 4gbit)");
  app.add_flag("--no-perftest", no_perftest,
               "leave out the ucx_perftest arm (tag_bw between the same two places, with the "
               "same UCX_* settings, 64 MiB messages; needs ucx-utils)");
  app.add_option("--perftest-host", perftest_host, "internal: where rank 1 listens")->group("");
  app.add_flag("--child", child, "internal: one of the two ranks")->group("");
  app.add_flag("--perftest-errors", perftest_errors, "internal: the ucx_perftest -e arm too")
      ->group("");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  const std::vector<uint64_t> sizes = cairn::bench::ParseSizes(sizes_arg);
  if (child) return Child(sizes, perftest_host, perftest_errors);
  if (!link_rate.empty() && !netns) {
    std::fprintf(stderr, "replicate: --link-rate needs --netns\n");
    return 2;
  }
  if (!no_perftest && std::system("command -v ucx_perftest >/dev/null 2>&1") != 0) {
    std::fprintf(stderr,
                 "replicate: no ucx_perftest here (Debian ucx-utils); --no-perftest "
                 "leaves that arm out\n");
    return 2;
  }
  std::unique_ptr<cairn::testing::NetnsCluster> cluster;
  if (netns) {
    int rc = 0;
    cluster = cairn::bench::UpCluster("replicate", "brep", 2, link_rate, &rc);
    if (!cluster) return rc;
    transports_arg = "tcp";
  }

  char tmpl[] = "/dev/shm/cairn-bench-replicate-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  const std::string root = tmpl;
  nlohmann::ordered_json json_all = {{"bench", "replicate"}};
  if (netns) json_all["link_rate"] = link_rate.empty() ? "none" : link_rate;
  using cairn::bench::Round;
  double lowest = 1e9, lowest_all = 1e9, lowest_pf = 1e9, lowest_pfe = 1e9, lowest_pfw = 1e9;
  std::vector<std::string> lines;
  for (const std::string& t : SplitList(transports_arg)) {
    const std::string tls = t == "shm" ? "sm,self" : t;
    LaunchSpec spec;
    spec.nodes = 2;
    const std::string self = cairn::bench::SelfPath();
    if (self.empty()) return 1;
    spec.argv = {self, "--child", "--sizes", sizes_arg};
    if (!no_perftest)
      spec.argv.insert(spec.argv.end(),
                       {"--perftest-host", cluster ? cluster->address(1) : "127.0.0.1"});
    if (!no_perftest && t == "tcp") spec.argv.push_back("--perftest-errors");
    spec.output_dir = root;
    spec.env = {{"CAIRN_JOB_ID", "bench-" + t + "-" + std::to_string(::getpid())},
                {"CAIRN_HOST_ROOT", root + "/host"},
                {"CAIRN_PFS_ROOT", root + "/pfs"},
                {"CAIRN_PERSIST_EVERY", "0"},
                {"CAIRN_BENCH_PERFTEST_PORT", std::to_string(20000 + ::getpid() % 20000)},
                {"UCX_TLS", tls}};
    if (cluster) cairn::bench::PlaceInCluster(*cluster, &spec);
    (void)DefaultFileSystem()->RemoveAll(root + "/rank-0.log");
    (void)DefaultFileSystem()->RemoveAll(root + "/rank-1.log");
    auto l = LocalLauncher::Start(spec);
    if (!l.ok() || !(*l)->WaitAll(1200)) {
      std::ifstream f0(root + "/rank-0.log"), f1(root + "/rank-1.log");
      std::stringstream a, b;
      a << f0.rdbuf();
      b << f1.rdbuf();
      std::fprintf(stderr, "replicate: %s run failed\nrank 0:\n%s\nrank 1:\n%s\n", t.c_str(),
                   a.str().c_str(), b.str().c_str());
      (void)DefaultFileSystem()->RemoveAll(root);
      return 1;
    }
    std::ifstream f(root + "/rank-0.log");
    std::string line;
    double raw = 0, rep = 0, ack = 0, tag = 0, put = 0, pf = 0, pfe = 0, pfw = 0, cold = 0;
    const std::string where = cluster ? t + "_netns" : t;
    std::string per_size;
    while (std::getline(f, line)) {
      unsigned long long size = 0;
      if (std::sscanf(line.c_str(), "RESULT %llu %lf %lf %lf %lf %lf %lf %lf %lf %lf", &size, &raw,
                      &rep, &ack, &tag, &put, &pf, &pfe, &pfw, &cold) != 10)
        continue;
      std::printf(
          "%-10s %5llu MiB  raw UCX tag %5.2f / put+flush %5.2f GB/s  ucx_perftest %5.2f (-e "
          "%5.2f) GB/s  cairn replication %5.2f GB/s (%.2f of the best raw, %.2f of "
          "ucx_perftest, %.2f of ucx_perftest -e, %.2f of -e with one version-sized message "
          "(%.2f GB/s); 0: not run)  ack %.1f ms  first push of a round (slots idle a round) "
          "%.2f GB/s\n",
          where.c_str(), size >> 20, tag, put, pf, pfe, rep, rep / raw, pf > 0 ? rep / pf : 0,
          pfe > 0 ? rep / pfe : 0, pfw > 0 ? rep / pfw : 0, pfw, ack, cold);
      lowest_all = std::min(lowest_all, rep / raw);
      nlohmann::ordered_json j{{"transport", where},
                               {"bytes", size},
                               {"raw_gbps", Round(raw, 3)},
                               {"raw_tag_gbps", Round(tag, 3)},
                               {"raw_put_gbps", Round(put, 3)},
                               {"replicate_gbps", Round(rep, 3)},
                               {"replicate_cold_gbps", Round(cold, 3)},
                               {"ack_latency_ms", Round(ack, 2)}};
      if (pf > 0) {
        j["perftest_gbps"] = Round(pf, 3);
        j["replicate_vs_perftest"] = Round(rep / pf, 3);
      }
      if (pfe > 0) {
        j["perftest_err_gbps"] = Round(pfe, 3);
        j["replicate_vs_perftest_err"] = Round(rep / pfe, 3);
      }
      if (pfw > 0) {
        j["perftest_err_whole_gbps"] = Round(pfw, 3);
        j["replicate_vs_perftest_err_whole"] = Round(rep / pfw, 3);
      }
      lines.push_back(j.dump());
    }
    // The largest size decides.
    lowest = std::min(lowest, rep / raw);
    json_all[where] = {{"raw_gbps", Round(raw, 3)},
                       {"replicate_gbps", Round(rep, 3)},
                       {"replicate_cold_gbps", Round(cold, 3)},
                       {"ack_latency_ms", Round(ack, 2)}};
    if (pf > 0) {
      json_all[where]["perftest_gbps"] = Round(pf, 3);
      json_all[where]["replicate_vs_perftest"] = Round(rep / pf, 3);
      lowest_pf = std::min(lowest_pf, rep / pf);
    }
    if (pfe > 0) {
      json_all[where]["perftest_err_gbps"] = Round(pfe, 3);
      json_all[where]["replicate_vs_perftest_err"] = Round(rep / pfe, 3);
      lowest_pfe = std::min(lowest_pfe, rep / pfe);
    }
    if (pfw > 0) {
      json_all[where]["perftest_err_whole_gbps"] = Round(pfw, 3);
      json_all[where]["replicate_vs_perftest_err_whole"] = Round(rep / pfw, 3);
      lowest_pfw = std::min(lowest_pfw, rep / pfw);
    }
  }
  (void)DefaultFileSystem()->RemoveAll(root);
  json_all["replicate_vs_raw"] = Round(lowest, 3);
  json_all["replicate_vs_raw_all_sizes"] = Round(lowest_all, 3);
  if (lowest_pf < 1e9) json_all["replicate_vs_perftest"] = Round(lowest_pf, 3);
  if (lowest_pfe < 1e9) json_all["replicate_vs_perftest_err"] = Round(lowest_pfe, 3);
  if (lowest_pfw < 1e9) json_all["replicate_vs_perftest_err_whole"] = Round(lowest_pfw, 3);
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("%s\n", json_all.dump().c_str());
  return 0;
}
