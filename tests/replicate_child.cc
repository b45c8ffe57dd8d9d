// A rank of the replication tests, started by LocalLauncher.
//
//   replicate_child STEPS STATE_BYTES SLEEP_MS
//       Saves STEPS versions (continuing after the newest one a previous incarnation left)
//       of a state whose bytes are a function of (step, rank), one every SLEEP_MS, and
//       prints per step "step T stall_ms S replicated R failed F newest N wall W
//       unreplicated_s U" (N: the newest replicated step, W: the wall clock in seconds, U:
//       Stats' replication.unreplicated_s; more fields follow, the last "persisted P": the
//       newest step committed to the PFS), then waits for the newest
//       version to be replicated and prints "final ...". Exit 0 when that last replication
//       succeeded.
//       With CAIRN_TEST_LOCKSTEP=DIR (a directory all ranks see), a rank does not start
//       step T before every other rank has saved step T-1, as training's collectives keep
//       ranks in step (through files, not the network: a cut link must not couple them).
//       Free-running ranks drift apart: under a sanitizer, one rank slower by a few
//       percent fell a whole ring of slots behind the other in 240 steps.
//   replicate_child restore STATE_BYTES
//       Restores the newest version every rank can restore, checks every byte, prints
//       "restored T tier X received B"; exit 0 when exact.
#include <chrono>
#include <cstdio>
#include <cstdlib>
#include <filesystem>
#include <fstream>
#include <iterator>
#include <sstream>
#include <string>
#include <thread>
#include <vector>

#include "cairn/checkpointer.h"
#include "core/clock.h"
#include "tests/child_util.h"
#include "tests/crash_state.h"

using namespace cairn;

// Every rank saves tensors of its own (rank-named): a restore must not take one rank's
// bytes for another's, as it may for a tensor two ranks hold the same box of.
std::string Prefix(int rank) {
  return "r" + std::to_string(rank) + ".";
}

int Restore(size_t bytes) {
  Options opts;
  auto ck = testing::OpenFromEnvironmentOrExit("replicate_child", &opts);
  testing::CrashState s(bytes);
  auto r = ck->restore(s.Shards(Prefix(opts.rank)));
  if (!r.ok()) {
    std::fprintf(stderr, "replicate_child: %s\n", r.status().ToString().c_str());
    return 1;
  }
  if (!s.Holds(r->step * 64 + opts.rank)) {
    std::fprintf(stderr,
                 "replicate_child: restored step %lld (tier %s) differs from what was saved\n",
                 static_cast<long long>(r->step), r->tier.c_str());
    return 1;
  }
  std::printf("restored %lld tier %s received %llu\n", static_cast<long long>(r->step),
              r->tier.c_str(), static_cast<unsigned long long>(r->bytes_received));
  return 0;
}

// CAIRN_TEST_LOCKSTEP: this rank has saved `step`.
void Saved(const std::string& dir, int rank, int64_t step) {
  const std::string path = dir + "/lockstep-" + std::to_string(rank);
  if (FILE* f = std::fopen((path + ".tmp").c_str(), "w")) {
    std::fprintf(f, "%lld\n", static_cast<long long>(step));
    std::fclose(f);
    std::rename((path + ".tmp").c_str(), path.c_str());
  }
}

// CAIRN_TEST_LOCKSTEP: waits (at most 60 s, then goes on and says so) until every other
// rank has saved `step` or a later one.
void WaitForOthers(const std::string& dir, int rank, int world, int64_t step) {
  const auto until = std::chrono::steady_clock::now() + std::chrono::seconds(60);
  for (int r = 0; r < world; ++r) {
    if (r == rank) continue;
    for (;;) {
      long long got = -1;
      if (FILE* f = std::fopen((dir + "/lockstep-" + std::to_string(r)).c_str(), "r")) {
        if (std::fscanf(f, "%lld", &got) != 1) got = -1;
        std::fclose(f);
      }
      if (got >= step) break;
      if (std::chrono::steady_clock::now() > until) {
        std::fprintf(stderr, "replicate_child: rank %d has not saved step %lld in 60 s\n", r,
                     static_cast<long long>(step));
        return;
      }
      std::this_thread::sleep_for(std::chrono::milliseconds(1));
    }
  }
}

// " name:nice" for each thread of this process whose name starts with `a` or `b`.
std::string BackgroundThreadNices(const std::string& a, const std::string& b) {
  std::string out;
  std::error_code ec;
  for (const auto& t : std::filesystem::directory_iterator("/proc/self/task", ec)) {
    std::ifstream comm(t.path() / "comm"), stat(t.path() / "stat");
    std::string name, line;
    if (!std::getline(comm, name) || !std::getline(stat, line)) continue;
    if (name.rfind(a, 0) != 0 && name.rfind(b, 0) != 0) continue;
    // The fields after "pid (comm) ": state (field 3) ... nice (field 19).
    std::istringstream rest(line.substr(line.rfind(')') + 2));
    const std::vector<std::string> fields{std::istream_iterator<std::string>(rest), {}};
    if (fields.size() > 16) out += " " + name + ":" + fields[16];
  }
  return out;
}

int main(int argc, char** argv) {
  if (argc == 3 && std::string(argv[1]) == "restore")
    return Restore(std::strtoull(argv[2], nullptr, 10));
  if (argc != 4) return 2;
  const int64_t steps = std::atoll(argv[1]);
  const size_t bytes = std::strtoull(argv[2], nullptr, 10);
  const int sleep_ms = std::atoi(argv[3]);
  Options opts;
  auto ck = testing::OpenFromEnvironmentOrExit("replicate_child", &opts);
  Checkpointer& c = *ck;
  testing::CrashState s(bytes);
  auto v = c.versions();
  const int64_t start = v.empty() ? 1 : v.front().step + 1;
  const char* lockstep = std::getenv("CAIRN_TEST_LOCKSTEP");
  for (int64_t t = start; t < start + steps; ++t) {
    if (lockstep && t > start) WaitForOthers(lockstep, opts.rank, opts.world_size, t - 1);
    const int64_t f0 = NowNanos();
    Status fs = c.fence();
    const int64_t f1 = NowNanos();
    if (!fs.ok()) std::fprintf(stderr, "replicate_child: %s\n", fs.ToString().c_str());
    s.Fill(t * 64 + opts.rank);
    const int64_t s0 = NowNanos();
    auto out = c.save(t, s.Shards(Prefix(opts.rank)));
    const int64_t s1 = NowNanos();
    if (!out.ok()) {
      std::fprintf(stderr, "replicate_child: %s\n", out.status().ToString().c_str());
      return 1;
    }
    if (lockstep) Saved(lockstep, opts.rank, t);
    Stats st = c.stats();
    std::printf(
        "step %lld stall_ms %.3f replicated %llu failed %llu newest %lld wall %.3f unreplicated_s "
        "%.3f skipped %llu agreed %lld passed_over %llu persisted %lld\n",
        static_cast<long long>(t), NanosToSeconds((f1 - f0) + (s1 - s0)) * 1e3,
        static_cast<unsigned long long>(st.replication.replicated),
        static_cast<unsigned long long>(st.replication.failed),
        static_cast<long long>(st.replication.newest_replicated_step), NanosToSeconds(WallNanos()),
        st.replication.unreplicated_s, static_cast<unsigned long long>(st.save.skipped),
        static_cast<long long>(st.save.agreed_step),
        static_cast<unsigned long long>(st.replication.passed_over),
        static_cast<long long>(st.persist.newest_persisted_step));
    std::fflush(stdout);
    std::this_thread::sleep_for(std::chrono::milliseconds(sleep_ms));
  }
  Status w = c.wait_replicated(60);
  Stats st = c.stats();
  std::printf("final replicated %llu failed %llu newest %lld received %llu status %s\n",
              static_cast<unsigned long long>(st.replication.replicated),
              static_cast<unsigned long long>(st.replication.failed),
              static_cast<long long>(st.replication.newest_replicated_step),
              static_cast<unsigned long long>(st.replication.received), w.ToString().c_str());
  // The nice value of each of replication's threads (CAIRN_REPLICATE_PRIORITY).
  std::printf("threads%s\n", BackgroundThreadNices("cairn-repl", "cairn-verify").c_str());
  std::fflush(stdout);
  // Stay until every rank is done, so nobody's last push meets a closed endpoint.
  if (Group* g = c.group()) (void)g->Barrier();
  return w.ok() ? 0 : 4;
}
