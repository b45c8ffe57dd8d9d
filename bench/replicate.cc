// bench/replicate: cairn's replication throughput against raw UCX between the same two
// processes, over tcp and over shared memory.
//
// For each transport the driver starts two ranks on two "nodes" (cairn launch style, with
// UCX_TLS set) of this same program. In each rank pair, for each version size:
//   raw     the better of two loops moving the bytes from rank 0 to pre-faulted memory of
//           rank 1: 64 MiB tagged messages all in flight at once, answered by a one-byte
//           acknowledgement once all arrived; and 64 MiB puts into registered memory
//           followed by a flush (remote completion).
//   cairn   rank 0 saves a version of that size; the time from the OFFER to the holder's
//           acknowledgement (bytes verified, persisted, replica published) is taken from
//           cairn's stats.
// The two alternate (raw, cairn, raw, cairn, ...); two warm-up rounds (they size and
// pre-fault the replica slots), then the median of 5 rounds of each.
// ack_latency_ms is the holder's part: from the last byte sent to its acknowledgement.
//
//   replicate [--sizes 256M,1G] [--transports tcp,shm]
//
// Prints a table and one JSON line per transport; the last line holds them all and
// `replicate_vs_raw`, the lowest replicate/raw ratio over the transports at the largest
// size (and `replicate_vs_raw_all_sizes`, the lowest over every size).
#include <sys/mman.h>
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
#include "core/arith.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "transport/ucx_comm.h"

using namespace cairn;
using cairn::bench::Median;
using cairn::bench::SplitList;

namespace {

// The raw reference arms use the replicator's channels (never at the same time as it).
const JobChannels kChannels;

constexpr uint64_t kChunk = 64ull << 20;

// One rank of the pair. Prints "RESULT size raw_gbps replicate_gbps ack_ms" on rank 0.
int Child(const std::vector<uint64_t>& sizes) {
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
    return NanosToSeconds(NowNanos() - t0);
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
    const double t = NanosToSeconds(NowNanos() - t0);
    if (!(*comm)->Send(1, MakeTag(kChannels.replication.ack, 0, seq), "d", 1).ok()) return -1;
    return t;
  };
  int64_t step = 0;
  std::string report;
  for (size_t i = 0; i < sizes.size(); ++i) {
    const uint64_t size = sizes[i];
    std::vector<double> raw_s, put_s, push_ms, ack_ms;
    std::vector<ShardSpec> shards = {
        ShardSpec::Whole({"state", DType::kU8, {static_cast<int64_t>(size)}}, buf)};
    for (int rep = 0; rep < 7; ++rep) {
      const double r = raw_once(size);
      const double pt = put_once(size);
      if (r < 0 || pt < 0) return 1;
      if (o->rank == 1) {
        if (Group* g = c.group(); !g->Barrier().ok()) return 1;  // rank 0's cairn push
        continue;
      }
      if (!c.save(++step, shards).ok() || !c.wait_captured().ok()) return 1;
      Status w = c.wait_replicated(300);
      if (!w.ok()) {
        std::fprintf(stderr, "bench: %s\n", w.ToString().c_str());
        return 1;
      }
      if (Group* g = c.group(); !g->Barrier().ok()) return 1;
      if (rep >= 2) {  // two warm-ups: they size and pre-fault the replica slots
        const Stats st = c.stats();
        raw_s.push_back(r);
        put_s.push_back(pt);
        push_ms.push_back(st.replication.push_ms);
        ack_ms.push_back(st.replication.ack_ms);
      }
    }
    if (o->rank == 0) {
      char line[256];
      const double tag_gbps = static_cast<double>(size) / Median(raw_s) / 1e9;
      const double put_gbps = static_cast<double>(size) / Median(put_s) / 1e9;
      std::snprintf(line, sizeof line, "RESULT %llu %.4f %.4f %.3f %.4f %.4f\n",
                    static_cast<unsigned long long>(size), std::max(tag_gbps, put_gbps),
                    static_cast<double>(size) / (Median(push_ms) / 1e3) / 1e9, Median(ack_ms),
                    tag_gbps, put_gbps);
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
  std::string sizes_arg = "256M,1G", transports_arg = "tcp,shm";
  bool child = false;
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
  app.add_flag("--child", child, "internal: one of the two ranks")->group("");
  if (auto rc = cairn::cli::Parse(app, argc, argv)) return *rc;
  const std::vector<uint64_t> sizes = cairn::bench::ParseSizes(sizes_arg);
  if (child) return Child(sizes);

  char tmpl[] = "/dev/shm/cairn-bench-replicate-XXXXXX";
  if (!::mkdtemp(tmpl)) return 1;
  const std::string root = tmpl;
  nlohmann::ordered_json json_all = {{"bench", "replicate"}};
  using cairn::bench::Round;
  double lowest = 1e9, lowest_all = 1e9;
  std::vector<std::string> lines;
  for (const std::string& t : SplitList(transports_arg)) {
    const std::string tls = t == "shm" ? "sm,self" : t;
    LaunchSpec spec;
    spec.nodes = 2;
    spec.argv = {"/proc/self/exe", "--child", "--sizes", sizes_arg};
    spec.output_dir = root;
    spec.env = {{"CAIRN_JOB_ID", "bench-" + t + "-" + std::to_string(::getpid())},
                {"CAIRN_HOST_ROOT", root + "/host"},
                {"CAIRN_PFS_ROOT", root + "/pfs"},
                {"CAIRN_PERSIST_EVERY", "0"},
                {"UCX_TLS", tls}};
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
    double raw = 0, rep = 0, ack = 0, tag = 0, put = 0;
    std::string per_size;
    while (std::getline(f, line)) {
      unsigned long long size = 0;
      if (std::sscanf(line.c_str(), "RESULT %llu %lf %lf %lf %lf %lf", &size, &raw, &rep, &ack,
                      &tag, &put) != 6)
        continue;
      std::printf(
          "%-4s %5llu MiB  raw UCX tag %5.2f / put+flush %5.2f GB/s  cairn replication "
          "%5.2f GB/s (%.2f of the best)  ack %.1f ms\n",
          t.c_str(), size >> 20, tag, put, rep, rep / raw, ack);
      lowest_all = std::min(lowest_all, rep / raw);
      lines.push_back(nlohmann::ordered_json{
          {"transport", t},
          {"bytes", size},
          {"raw_gbps", Round(raw, 3)},
          {"raw_tag_gbps", Round(tag, 3)},
          {"raw_put_gbps", Round(put, 3)},
          {"replicate_gbps", Round(rep, 3)},
          {"ack_latency_ms",
           Round(ack, 2)}}.dump());
    }
    // The largest size decides.
    lowest = std::min(lowest, rep / raw);
    json_all[t] = {{"raw_gbps", Round(raw, 3)},
                   {"replicate_gbps", Round(rep, 3)},
                   {"ack_latency_ms", Round(ack, 2)}};
  }
  (void)DefaultFileSystem()->RemoveAll(root);
  json_all["replicate_vs_raw"] = Round(lowest, 3);
  json_all["replicate_vs_raw_all_sizes"] = Round(lowest_all, 3);
  for (const auto& l : lines) std::printf("%s\n", l.c_str());
  std::printf("%s\n", json_all.dump().c_str());
  return 0;
}
