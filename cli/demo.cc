// `cairn demo`: 2 nodes x 2 ranks train a sharded synthetic GPT-like model with a checkpoint
// every iteration, replication to the other node and periodic persistence; node 1 is
// killed and its memory wiped; the job restarts and node 1 comes back from node 0's memory;
// training finishes; a new job of 3 ranks with another layout restores the last PFS version.
// Every rank checks every value it restored against a replay (cli/demo_model.h).
#include "cli/demo.h"
#include "cli/args.h"

#include <fcntl.h>
#include <signal.h>
#include <unistd.h>

#include <algorithm>
#include <chrono>
#include <cstdarg>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <map>
#include <memory>
#include <optional>
#include <random>
#include <set>
#include <sstream>
#include <string>
#include <thread>
#include <variant>
#include <vector>

#include "cairn/checkpointer.h"
#include "cli/demo_model.h"
#include "cli/launcher.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "persist/manifest.h"
#include "tiers/host_tier.h"
#include "redundancy/replica_store.h"
#include "tiers/slot_header.h"

namespace cairn::cli {
namespace {

// ---------------------------------------------------------------------------------------
// Arguments (the parent's; the worker takes the model ones too).

struct DemoArgs {
  int64_t steps = 40;
  int64_t kill_at = -1;  // -1: random in the middle of the run
  int layers = 4;
  int64_t dim = 256;
  int64_t vocab = 8192;
  int persist_every = 10;
  std::string host_root = DefaultHostRoot();
  std::string pfs_root;  // "": $TMPDIR (or /var/tmp)/cairn-demo
  std::string job;
  std::string corrupt;  // "", "flip" or "resealed" (testing the demo's own checks)
  std::string mode;     // worker: train, resume or check
  bool keep = false;
  uint64_t seed = 0;
};

// The demo's options on `app` (the worker takes the same ones, and --mode).
void AddDemoOptions(CLI::App& app, DemoArgs* a) {
  app.add_option("--steps", a->steps, "iterations to train")
      ->check(CLI::Range(12, 1 << 30))
      ->capture_default_str();
  app.add_option("--kill-at", a->kill_at, "step at which node 1 is killed (default: random)")
      ->check(WholeNumber());
  app.add_option("--layers", a->layers, "transformer layers")
      ->check(CLI::Range(1, 64))
      ->capture_default_str();
  app.add_option("--dim", a->dim, "model width")->check(CLI::Range(8, 8192))->capture_default_str();
  app.add_option("--vocab", a->vocab, "vocabulary size")
      ->check(CLI::Range(8, 1 << 20))
      ->capture_default_str();
  app.add_option("--persist-every", a->persist_every, "persist every K-th version to the PFS")
      ->check(CLI::Range(1, 1000000))
      ->capture_default_str();
  app.add_option("--host-root", a->host_root, "host-tier root")->capture_default_str();
  app.add_option("--pfs-root", a->pfs_root, "PFS root (default: $TMPDIR or /var/tmp, /cairn-demo)");
  app.add_option("--job", a->job, "job id (default: demo-<pid>)");
  app.add_option("--seed", a->seed, "random seed (default: from the clock)");
  app.add_flag("--keep", a->keep, "keep the host tiers and the PFS directory at the end");
  app.add_option("--corrupt-replica", a->corrupt,
                 "damage node 0's replica of rank 2 before the restart: flip (a bit) or resealed "
                 "(checksums rewritten too)")
      ->check(CLI::IsMember({"flip", "resealed"}));
}

// Prints one line to this rank's log and flushes it.
__attribute__((format(printf, 1, 2))) void Say(const char* fmt, ...) {
  va_list ap;
  va_start(ap, fmt);
  std::vprintf(fmt, ap);
  va_end(ap);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

// ---------------------------------------------------------------------------------------
// The worker: one rank of the training job (or of the 3-rank job that only restores).
//   --mode train    step 0 is the initial model; trains and saves steps 1, 2, ... until
//                   killed
//   --mode resume   restores, checks every value, trains to --steps (at least 3 steps),
//                   flushes the last step
//   --mode check    restores into the "zero3" layout and checks every value
// Lines it prints (parsed by the parent):
//   step <t> iter_ms <x> stall_ms <x> copied <B> replicated <B> repl_step <s> persisted <B>
//        pers_step <s>
//   restored <step> tier <t> ms <x> bytes <B> received <B> pfs <B> needed <B> resharded <0|1>
//   skipped <why>                         (a newer version restore passed over)
//   check ok | check FAILED <what>        (this rank's values against a replay)
//   job-check <ranks that failed, or "none">
//   flushed <step>

namespace {

// What one demo worker holds while it runs.
struct DemoWorker {
  Checkpointer& c;
  ShardedModel& model;
  std::vector<ShardSpec> shards;
  Group* group;
  int rank;

  Blobs BlobsOf(int64_t t) const {
    return Blobs{{"trainer", "step=" + std::to_string(t) + " rank=" + std::to_string(rank) +
                                 " tokens_seen=" + std::to_string(t * 4096 * 1024)}};
  }
};

// Restores, checks this rank's values and the blob, and learns whether every rank restored
// exact values: the restored step, or the process's exit code (1: failed, 3: wrong values).
std::variant<int64_t, int> RestoreAndCheck(DemoWorker& w) {
  auto r = w.c.restore(w.shards);
  if (!r.ok()) {
    std::fprintf(stderr, "demo worker: restore failed: %s\n", r.status().ToString().c_str());
    return 1;
  }
  Say("restored %lld tier %s ms %.3f bytes %llu received %llu pfs %llu needed %llu resharded %d",
      static_cast<long long>(r->step), r->tier.c_str(), r->seconds * 1e3,
      static_cast<unsigned long long>(r->bytes), static_cast<unsigned long long>(r->bytes_received),
      static_cast<unsigned long long>(r->job_pfs_bytes_read),
      static_cast<unsigned long long>(r->job_unique_bytes_needed), r->resharded ? 1 : 0);
  for (const std::string& s : r->skipped) Say("skipped %s", s.c_str());
  // The saving rank of the same number wrote the blob: its step must be the restored one.
  const std::string want_blob = "step=" + std::to_string(r->step) + " rank=";
  std::string bad = r->blobs["trainer"].rfind(want_blob, 0) == 0
                        ? w.model.Check(r->step)
                        : "blob 'trainer' is '" + r->blobs["trainer"] + "'";
  if (bad.empty())
    Say("check ok");
  else
    Say("check FAILED %s", bad.c_str());
  // Every rank learns whether every other one restored exact values.
  auto all = w.group->AllGather(bad.empty() ? "ok" : "bad");
  std::string failed;
  if (!all.ok()) {
    failed = "unknown (" + all.status().ToString() + ")";
  } else {
    for (size_t q = 0; q < all->size(); ++q)
      if ((*all)[q] != "ok") failed += (failed.empty() ? "" : ",") + std::to_string(q);
  }
  Say("job-check %s", failed.empty() ? "none" : failed.c_str());
  if (!failed.empty()) return 3;
  return r->step;
}

// Steps first..last: backward, fence, optimizer, save; a line of figures per step.
Status Train(DemoWorker& w, int64_t first, int64_t last) {
  for (int64_t t = first; t <= last; ++t) {
    const int64_t i0 = NowNanos();
    const double loss = w.model.Backward(t);  // forward + backward: read the parameters only
    const int64_t f0 = NowNanos();
    Status fs = w.c.fence();  // the optimizer is about to write
    const int64_t f1 = NowNanos();
    if (!fs.ok()) std::fprintf(stderr, "demo worker: %s\n", fs.ToString().c_str());
    w.model.OptimizerStep();
    CAIRN_RETURN_IF_ERROR(w.model.GatherParameters(w.group));
    const int64_t s0 = NowNanos();
    auto out = w.c.save(t, w.shards, w.BlobsOf(t));
    const int64_t s1 = NowNanos();
    if (!out.ok()) return out.status();
    const Stats s = w.c.stats();
    Say("step %lld loss %.6g iter_ms %.3f stall_ms %.4f fence_ms %.4f copied %llu replicated %llu "
        "repl_step %lld "
        "persisted %llu pers_step %lld",
        static_cast<long long>(t), loss, NanosToSeconds(s1 - i0) * 1e3,
        NanosToSeconds((f1 - f0) + (s1 - s0)) * 1e3, NanosToSeconds(f1 - f0) * 1e3,
        static_cast<unsigned long long>(s.capture.bytes_copied),
        static_cast<unsigned long long>(s.replication.bytes),
        static_cast<long long>(s.replication.newest_replicated_step),
        static_cast<unsigned long long>(s.persist.bytes),
        static_cast<long long>(s.persist.newest_persisted_step));
  }
  return Status::OK();
}

}  // namespace

int DemoWorkerMain(int argc, char** argv) {
  DemoArgs a;
  CLI::App app("One rank of the jobs `cairn demo` starts (internal).", "cairn demo-worker");
  AddDemoOptions(app, &a);
  app.add_option("--mode", a.mode, "what this run does")
      ->required()
      ->check(CLI::IsMember({"train", "resume", "check"}));
  if (auto rc = Parse(app, argc, argv)) return *rc;
  auto o = Options::FromEnvironment();
  if (!o.ok()) {
    std::fprintf(stderr, "demo worker: %s\n", o.status().ToString().c_str());
    return 1;
  }
  auto ck = Checkpointer::Open(*o);
  if (!ck.ok()) {
    std::fprintf(stderr, "demo worker: %s\n", ck.status().ToString().c_str());
    return 1;
  }
  SoloGroup single_rank;  // a job of one rank has no group of its own
  const bool check_only = a.mode == "check";
  ShardedModel model(GptTensors(a.layers, a.dim, a.vocab), check_only ? "zero3" : "megatron",
                     o->rank, o->world_size, check_only ? 1 : o->local_world_size);
  Checkpointer& c = **ck;
  DemoWorker w{c, model, model.Shards(), c.group() ? static_cast<Group*>(c.group()) : &single_rank,
               o->rank};

  int64_t start = 0;
  if (a.mode == "train") {
    auto out = c.save(0, w.shards, w.BlobsOf(0));
    if (!out.ok()) {
      std::fprintf(stderr, "demo worker: %s\n", out.status().ToString().c_str());
      return 1;
    }
  } else {
    auto restored = RestoreAndCheck(w);
    if (const int* rc = std::get_if<int>(&restored)) return *rc;
    if (check_only) return 0;
    start = std::get<int64_t>(restored);
  }
  // "train" runs until the demo kills it (it only stops by itself far past --steps); a
  // resumed run trains at least 3 more steps, so there is a new version to flush.
  const int64_t last = a.mode == "train" ? 100 * a.steps : std::max(a.steps, start + 3);
  if (Status st = Train(w, start + 1, last); !st.ok()) {
    std::fprintf(stderr, "demo worker: %s\n", st.ToString().c_str());
    return 1;
  }
  if (a.mode == "resume") {
    auto f = c.flush();
    if (!f.ok()) {
      std::fprintf(stderr, "demo worker: flush: %s\n", f.status().ToString().c_str());
      return 1;
    }
    const Stats s = c.stats();
    Say("flushed %lld copied %llu replicated %llu persisted %llu", static_cast<long long>(*f),
        static_cast<unsigned long long>(s.capture.bytes_copied),
        static_cast<unsigned long long>(s.replication.bytes),
        static_cast<unsigned long long>(s.persist.bytes));
  }
  Status ws = c.wait_captured();
  return ws.ok() ? 0 : 1;
}

namespace {

// ---------------------------------------------------------------------------------------
// The parent: what it reads back from the ranks' logs.

using Fields = std::map<std::string, std::string>;

// "kind N k1 v1 k2 v2 ..." -> {kind: N, k1: v1, k2: v2, ...}.
Fields ParseFields(const std::string& line) {
  Fields f;
  std::istringstream in(line);
  std::string k, v;
  while (in >> k >> v) f[k] = v;
  return f;
}
double Num(const Fields& f, const char* key, double def = 0) {
  auto it = f.find(key);
  return it == f.end() ? def : std::strtod(it->second.c_str(), nullptr);
}

struct RankLog {
  Fields last_step, restored, flushed;
  std::vector<double> stall_ms, iter_ms;
  std::vector<std::string> skipped;
  std::string check;               // "ok", "FAILED ..." or "" (not reached)
  std::string job_check;           // "none" or the failing ranks
  std::vector<std::string> other;  // warnings and errors
};

RankLog ReadRankLog(const std::string& path) {
  RankLog r;
  auto text = ReadWholeFile(DefaultFileSystem(), path, 64 << 20);
  if (!text.ok()) return r;
  std::istringstream in(*text);
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("step ", 0) == 0) {
      r.last_step = ParseFields(line);
      r.stall_ms.push_back(Num(r.last_step, "stall_ms"));
      r.iter_ms.push_back(Num(r.last_step, "iter_ms"));
    } else if (line.rfind("restored ", 0) == 0) {
      r.restored = ParseFields(line);
    } else if (line.rfind("skipped ", 0) == 0) {
      r.skipped.push_back(line.substr(8));
    } else if (line.rfind("check ", 0) == 0) {
      r.check = line.substr(6);
    } else if (line.rfind("job-check ", 0) == 0) {
      r.job_check = line.substr(10);
    } else if (line.rfind("flushed ", 0) == 0) {
      r.flushed = ParseFields(line);
    } else if (!line.empty()) {
      r.other.push_back(line);
    }
  }
  return r;
}

struct Job {
  std::unique_ptr<LocalLauncher> launcher;
  std::string logs;
  int world = 0;
  std::vector<RankLog> Read() const {
    std::vector<RankLog> out;
    for (int r = 0; r < world; ++r)
      out.push_back(ReadRankLog(logs + "/rank-" + std::to_string(r) + ".log"));
    return out;
  }
};

struct Dirs {
  std::string exe, host_job, pfs_job, logs;
};

Result<Job> Launch(const DemoArgs& a, const Dirs& d, int nodes, int per_node,
                   const std::string& mode) {
  Job job;
  job.world = nodes * per_node;
  job.logs = d.logs + "/" + mode;
  CAIRN_RETURN_IF_ERROR(DefaultFileSystem()->MakeDirs(job.logs, 0700));
  LaunchSpec spec;
  spec.nodes = nodes;
  spec.ranks_per_node = per_node;
  spec.argv = {d.exe,     "demo-worker",           "--mode",   mode,
               "--steps", std::to_string(a.steps), "--layers", std::to_string(a.layers),
               "--dim",   std::to_string(a.dim),   "--vocab",  std::to_string(a.vocab)};
  spec.output_dir = job.logs;
  spec.env = {{"CAIRN_JOB_ID", a.job},
              {"CAIRN_HOST_ROOT", a.host_root},
              {"CAIRN_PFS_ROOT", a.pfs_root},
              {"CAIRN_REPLICAS", "1"},
              // The newest version, one being replicated, one draining, one being captured:
              // with fewer, ranks skip versions (each on its own), and the newest step every
              // rank holds can be far back.
              {"CAIRN_SLOTS", "4"},
              {"CAIRN_PERSIST_EVERY", std::to_string(a.persist_every)},
              {"CAIRN_CONNECT_TIMEOUT_S", "60"},
              {"CAIRN_OP_TIMEOUT_S", "60"},
              {"CAIRN_REPLICATE_TIMEOUT_S", "10"}};
  // One trace per phase (a rank writes its trace when it ends: a killed one writes none).
  if (const char* t = std::getenv("CAIRN_TRACE"); t && *t)
    spec.env.push_back({"CAIRN_TRACE", std::string(t) + "." + mode});
  auto l = LocalLauncher::Start(spec);
  if (!l.ok()) return l.status();
  job.launcher = std::move(*l);
  return job;
}

// Prints the last lines of the ranks' logs that are not progress (warnings, errors), but
// not UCX's own complaints about peers that already exited.
void PrintProblems(const std::vector<RankLog>& logs) {
  for (size_t r = 0; r < logs.size(); ++r) {
    std::vector<std::string> lines;
    size_t ucx = 0;
    for (const std::string& l : logs[r].other)
      (l.find(" UCX ") == std::string::npos ? lines.push_back(l) : (void)++ucx);
    for (size_t i = lines.size() > 6 ? lines.size() - 6 : 0; i < lines.size(); ++i)
      std::printf("      rank %zu: %s\n", r, lines[i].c_str());
    if (ucx) std::printf("      rank %zu: (%zu lines of UCX errors in its log)\n", r, ucx);
  }
}

int64_t MinOf(const std::vector<RankLog>& logs, const char* key) {
  int64_t m = INT64_MAX;
  for (const RankLog& r : logs)
    m = std::min<int64_t>(m, static_cast<int64_t>(Num(r.last_step, key, -1)));
  return logs.empty() ? -1 : m;
}

// The restorable steps in a host-tier directory (a rank's own or a replica directory).
std::set<int64_t> Restorable(const std::string& dir) {
  std::set<int64_t> out;
  auto v = HostTier::Scan(DefaultFileSystem(), dir, nullptr);
  if (v.ok())
    for (const VersionInfo& x : *v)
      if (IsRestorable(x.state)) out.insert(x.step);
  return out;
}

std::string StepOrNone(int64_t step) {
  return step < 0 ? "nothing yet" : "step " + std::to_string(step);
}

std::string StepList(const std::set<int64_t>& s) {
  std::string out;
  for (int64_t x : s) out += (out.empty() ? "" : " ") + std::to_string(x);
  return out.empty() ? "none" : out;
}

// Damages the replica of `step` that node 0 holds for `source`: flips one bit of a moment;
// with `reseal` also rewrites the chunk checksum and the header so that cairn cannot tell.
Status CorruptReplica(const std::string& source_dir, int64_t step, bool reseal, std::string* what) {
  FileSystem* fs = DefaultFileSystem();
  CAIRN_ASSIGN_OR_RETURN(std::vector<std::string> names, fs->ListDir(source_dir));
  for (const std::string& name : names) {
    if (name.size() < 4 || name.substr(name.size() - 4) != ".hdr") continue;
    const std::string hdr_path = JoinPath(source_dir, name);
    const std::string data_path = hdr_path.substr(0, hdr_path.size() - 4);
    CAIRN_ASSIGN_OR_RETURN(std::string bytes, ReadWholeFile(fs, hdr_path, kMaxSlotHeaderBytes));
    auto h = DecodeSlotHeader(bytes);
    if (!h.ok() || h->step != step) continue;
    // A moment shard: only this rank saved it (its weights are also held by its
    // data-parallel peer, whose copy a restore may read instead).
    auto it = std::find_if(h->shards.begin(), h->shards.end(), [](const SlotShard& x) {
      return x.name.rfind("optimizer.", 0) == 0 && x.nbytes >= 4;
    });
    if (it == h->shards.end()) continue;
    const SlotShard& s = *it;
    const uint64_t at = s.offset + s.nbytes / 2 / 4 * 4;  // the low byte of a float
    const int fd = ::open(data_path.c_str(), O_RDWR);
    if (fd < 0) return Status::FromErrno(errno, "open " + data_path);
    std::byte b{};
    bool ok = ::pread(fd, &b, 1, static_cast<off_t>(at)) == 1;
    b ^= std::byte{1};
    ok = ok && ::pwrite(fd, &b, 1, static_cast<off_t>(at)) == 1;
    if (ok && reseal) {
      const uint32_t i = static_cast<uint32_t>((at - s.offset) / h->chunk_bytes);
      const auto [begin, end] = h->ChunkRange(s, i);
      std::string chunk(end - begin, '\0');
      ok = ::pread(fd, chunk.data(), chunk.size(), static_cast<off_t>(begin)) ==
           static_cast<ssize_t>(chunk.size());
      h->chunk_checksums[s.first_chunk + i] = Checksum(chunk.data(), chunk.size());
    }
    ::close(fd);
    if (!ok) return Status::IOError("cannot rewrite " + data_path);
    if (reseal) CAIRN_RETURN_IF_ERROR(WriteFileAtomic(fs, hdr_path, EncodeSlotHeader(*h)));
    *what = s.name + " in " + data_path;
    return Status::OK();
  }
  return Status::NotFound("no replica of step " + std::to_string(step) + " in " + source_dir);
}

double Median(std::vector<double> v) {
  if (v.empty()) return 0;
  std::nth_element(v.begin(), v.begin() + static_cast<ptrdiff_t>(v.size() / 2), v.end());
  return v[v.size() / 2];
}

double Mean(const std::vector<double>& v) {
  double s = 0;
  for (double x : v) s += x;
  return v.empty() ? 0 : s / static_cast<double>(v.size());
}

std::string Mb(double bytes) {
  char b[32];
  std::snprintf(b, sizeof b, "%.1f MB", bytes / 1e6);
  return b;
}

struct Check {
  std::string what;
  bool ok;
  std::string detail;
};

// One run of the demo, phase by phase (the steps its --help describes). A phase returns
// false when the demo cannot go on, with the exit code in rc_.
class DemoRun {
 public:
  explicit DemoRun(DemoArgs a) : a_(std::move(a)) {}
  int Run() {
    if (!Prepare() || !TrainUntilTheKill() || !Survey() || !Resume()) return rc_;
    if (finished_ && !Reshard()) return rc_;
    return Summarize();
  }

 private:
  // Chooses the kill step and the directories, and prints what the demo will do.
  bool Prepare();
  // 1. Trains until every rank has the kill step replicated, kills both nodes, wipes node 1.
  bool TrainUntilTheKill();
  // 2. Prints what node 0's memory and the PFS hold; finds the step to expect.
  bool Survey();
  // 3. Restarts the job: restore, check, train to the end, flush.
  bool Resume();
  bool Reshard();
  // Prints the figures and the checks; cleans up when they all passed.
  int Summarize();
  void ShowProgress(const std::vector<RankLog>& logs, int64_t* next);
  bool FailEarly(const std::string& why, const Job* job) {
    std::printf("\n%s\n", why.c_str());
    if (job) PrintProblems(job->Read());
    std::printf("\nkept for inspection: %s %s %s\n\ndemo FAILED\n", d_.host_job.c_str(),
                d_.pfs_job.c_str(), d_.logs.c_str());
    rc_ = 1;
    return false;
  }

  DemoArgs a_;
  Dirs d_;
  std::mt19937_64 rng_;
  FileSystem* fs_ = DefaultFileSystem();
  int rc_ = 0;
  int64_t deadline_ = 0;  // for the training job (the restarted one gets 300 s more)
  std::vector<Check> checks_;
  std::vector<RankLog> before_, after_, reshard_;  // rank logs of the three jobs
  int64_t last_seen_ = 0;                          // the step the killed job had reached
  int64_t expected_ = 0;                           // the newest step node 0 holds for every rank
  int64_t final_step_ = 0;  // the last step the restarted job trains and flushes
  bool finished_ = false;   // the restarted job flushed final_step_
};

void DemoRun::ShowProgress(const std::vector<RankLog>& logs, int64_t* next) {
  const int64_t step = MinOf(logs, "step");
  if (step < *next) return;
  std::vector<double> stall, iter;
  int64_t pers = -1;
  for (const RankLog& r : logs) {
    stall.insert(stall.end(), r.stall_ms.begin(), r.stall_ms.end());
    iter.insert(iter.end(), r.iter_ms.begin(), r.iter_ms.end());
    pers = std::max<int64_t>(pers, static_cast<int64_t>(Num(r.last_step, "pers_step", -1)));
  }
  std::printf(
      "      step %3lld   stall %.3f ms/iteration (median; iteration %.0f ms)   replicated: %s   "
      "PFS: %s\n",
      static_cast<long long>(step), Median(stall), Mean(iter),
      StepOrNone(MinOf(logs, "repl_step")).c_str(), StepOrNone(pers).c_str());
  std::fflush(stdout);
  *next = (step / 5 + 1) * 5;
}

bool DemoRun::Prepare() {
  rng_.seed(a_.seed ? a_.seed : static_cast<uint64_t>(WallNanos()));
  if (a_.job.empty()) a_.job = "demo-" + std::to_string(::getpid());
  if (a_.pfs_root.empty()) {
    const char* tmp = std::getenv("TMPDIR");
    a_.pfs_root = std::string(tmp && *tmp ? tmp : "/var/tmp") + "/cairn-demo";
  }
  const int64_t lo = std::max<int64_t>(a_.persist_every + 1, a_.steps / 3);
  const int64_t hi = std::max<int64_t>(lo, a_.steps * 2 / 3);
  if (a_.kill_at < 0)
    a_.kill_at = lo + static_cast<int64_t>(rng_() % static_cast<uint64_t>(hi - lo + 1));
  if (a_.kill_at < 2 || a_.kill_at > a_.steps - 4) {
    std::fprintf(stderr, "cairn demo: --kill-at must be in 2..steps-4\n");
    rc_ = 2;
    return false;
  }
  {
    char buf[4096];
    const ssize_t n = ::readlink("/proc/self/exe", buf, sizeof buf - 1);
    if (n <= 0) {
      std::fprintf(stderr, "cairn demo: cannot find its own executable\n");
      rc_ = 1;
      return false;
    }
    d_.exe.assign(buf, static_cast<size_t>(n));
  }
  d_.host_job = JoinPath(a_.host_root, a_.job);
  d_.pfs_job = PfsJobDir(a_.pfs_root, a_.job);
  d_.logs = d_.pfs_job + ".logs";
  if (fs_->Exists(d_.host_job) || fs_->Exists(d_.pfs_job)) {
    std::fprintf(stderr, "cairn demo: %s or %s already exists: choose another --job\n",
                 d_.host_job.c_str(), d_.pfs_job.c_str());
    rc_ = 2;
    return false;
  }
  const ShardedModel probe(GptTensors(a_.layers, a_.dim, a_.vocab), "megatron", 0, 4, 2);
  std::printf(
      "cairn demo: 2 nodes x 2 ranks train a synthetic GPT-like model (%d layers, width %lld,\n"
      "            %zu tensors, %s of weights and Adam moments, %s per rank: 2-way tensor\n"
      "            parallel x 2-way data parallel, moments sharded over data parallel)\n"
      "            host tiers: %s   PFS: %s\n\n",
      a_.layers, static_cast<long long>(a_.dim), probe.num_tensors() * 3,
      Mb(static_cast<double>(probe.model_bytes())).c_str(),
      Mb(static_cast<double>(probe.bytes())).c_str(), d_.host_job.c_str(), d_.pfs_job.c_str());
  std::fflush(stdout);
  return true;
}

bool DemoRun::TrainUntilTheKill() {
  // 1. Train until every rank has its step kill_at replicated.
  std::printf(
      "[1/4] training: a checkpoint every iteration, replicated to the other node, 1 version in "
      "%d persisted;\n      node 1 dies once step %lld is replicated\n",
      a_.persist_every, static_cast<long long>(a_.kill_at));
  std::fflush(stdout);
  auto train = Launch(a_, d_, 2, 2, "train");
  if (!train.ok()) return FailEarly("cannot start the job: " + train.status().ToString(), nullptr);
  deadline_ = NowNanos() + static_cast<int64_t>(600e9);
  int64_t next = 5;
  std::vector<RankLog> logs;
  for (;;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    logs = train->Read();
    ShowProgress(logs, &next);
    if (MinOf(logs, "repl_step") >= a_.kill_at) break;
    if (train->launcher->Running() < 4)
      return FailEarly("a rank of the training job ended before the kill", &*train);
    if (NowNanos() > deadline_) return FailEarly("the training job made no progress", &*train);
  }
  // Somewhere inside an iteration: maybe mid-copy, mid-replication or mid-drain.
  std::this_thread::sleep_for(std::chrono::microseconds(rng_() % 30000));
  for (int r : {2, 3}) (void)train->launcher->Signal(r, SIGKILL);
  for (int r : {2, 3}) train->launcher->WaitRank(r);
  for (int r : {0, 1}) (void)train->launcher->Signal(r, SIGKILL);
  for (int r : {0, 1}) train->launcher->WaitRank(r);
  before_ = train->Read();
  last_seen_ = MinOf(before_, "step");
  const std::string node1 = JoinPath(d_.host_job, "node-1");
  Status wiped = fs_->RemoveAll(node1);
  if (!wiped.ok()) return FailEarly("cannot wipe " + node1 + ": " + wiped.ToString(), nullptr);
  std::printf(
      "      node 1 (ranks 2, 3) killed with SIGKILL after step %lld, then node 0 (the job "
      "restarts);\n      node 1's host memory wiped (%s)\n\n",
      static_cast<long long>(last_seen_), node1.c_str());
  return true;
}

bool DemoRun::Survey() {
  // 2. What node 0's memory and the PFS hold.
  std::printf("[2/4] what survived\n");
  const std::string node0 = JoinPath(d_.host_job, "node-0");
  std::set<int64_t> everywhere;
  for (int r = 0; r < 4; ++r) {
    const std::string dir =
        r < 2 ? HostTier::RankDir(a_.host_root, a_.job, 0, r) : ReplicaStore::SourceDir(node0, r);
    const std::set<int64_t> held = Restorable(dir);
    std::printf("      node 0, %-26s steps %s\n",
                (r < 2 ? "rank " + std::to_string(r) + " (own memory)"
                       : "replica of rank " + std::to_string(r) + " (node 1)")
                    .c_str(),
                StepList(held).c_str());
    if (r == 0) {
      everywhere = held;
    } else {
      std::set<int64_t> both;
      for (int64_t x : held)
        if (everywhere.count(x)) both.insert(x);
      everywhere = both;
    }
  }
  auto committed = ReadLatest(fs_, d_.pfs_job);
  std::printf("      PFS, committed                  step %s\n",
              committed.ok() ? std::to_string(*committed).c_str() : "none");
  if (everywhere.empty())
    return FailEarly(
        "node 0's memory holds no step for every rank (replication lagged, or the ranks skipped "
        "different versions for want of a free slot)",
        nullptr);
  expected_ = *everywhere.rbegin();
  std::printf("      newest step node 0 holds for every rank: %lld\n",
              static_cast<long long>(expected_));
  if (!a_.corrupt.empty()) {
    std::string what;
    Status st = CorruptReplica(ReplicaStore::SourceDir(node0, 2), expected_,
                               a_.corrupt == "resealed", &what);
    if (!st.ok()) return FailEarly("--corrupt-replica: " + st.ToString(), nullptr);
    std::printf("      --corrupt-replica %s: flipped a bit of %s%s\n", a_.corrupt.c_str(),
                what.c_str(), a_.corrupt == "resealed" ? " and rewrote its checksums" : "");
  }
  std::printf("\n");
  return true;
}

bool DemoRun::Resume() {
  // The resumed job trains at least 3 steps (a kill late in the run still shows training go
  // on), so its last step is:
  final_step_ = std::max(a_.steps, expected_ + 3);
  // 3. The job restarts: restore, check, train to the end, flush.
  std::printf(
      "[3/4] restart on 2 nodes x 2 ranks: restore, check every value, train to step %lld\n",
      static_cast<long long>(final_step_));
  std::fflush(stdout);
  auto resume = Launch(a_, d_, 2, 2, "resume");
  if (!resume.ok())
    return FailEarly("cannot restart the job: " + resume.status().ToString(), nullptr);
  std::vector<bool> shown(4, false);
  int64_t next = (expected_ / 5 + 1) * 5;
  std::vector<RankLog> logs;
  for (bool running = true; running;) {
    std::this_thread::sleep_for(std::chrono::milliseconds(50));
    running = resume->launcher->Running() > 0;
    logs = resume->Read();
    for (size_t r = 0; r < 4; ++r) {
      const RankLog& x = logs[r];
      if (shown[r] || x.check.empty()) continue;
      shown[r] = true;
      const std::string tier = x.restored.count("tier") ? x.restored.at("tier") : "?";
      std::printf(
          "      rank %zu restored step %lld from %s in %.1f ms (%s%s); every value: %s\n", r,
          static_cast<long long>(Num(x.restored, "restored", -1)),
          tier == "host"   ? "its own memory"
          : tier == "peer" ? "node 0's memory"
                           : tier.c_str(),
          Num(x.restored, "ms"), Mb(Num(x.restored, "bytes")).c_str(),
          tier == "peer" ? (", " + Mb(Num(x.restored, "received")) + " over UCX").c_str() : "",
          x.check.c_str());
      for (const std::string& s : x.skipped) std::printf("        passed over: %s\n", s.c_str());
    }
    ShowProgress(logs, &next);
    if (NowNanos() > deadline_ + static_cast<int64_t>(300e9)) {
      resume->launcher.reset();
      return FailEarly("the restarted job did not finish", &*resume);
    }
  }
  after_ = resume->Read();
  bool same_step = true, tiers_ok = true, values_ok = true;
  finished_ = true;
  std::string steps_seen, tiers_seen;
  uint64_t pfs_read = 0;
  for (int r = 0; r < 4; ++r) {
    const RankLog& x = after_[static_cast<size_t>(r)];
    const int64_t got = static_cast<int64_t>(Num(x.restored, "restored", -1));
    const std::string tier = x.restored.count("tier") ? x.restored.at("tier") : "none";
    same_step = same_step && got == expected_;
    tiers_ok = tiers_ok && tier == (r < 2 ? "host" : "peer");
    pfs_read = std::max<uint64_t>(pfs_read, static_cast<uint64_t>(Num(x.restored, "pfs")));
    values_ok = values_ok && x.check == "ok" && x.job_check == "none";
    finished_ = finished_ && resume->launcher->ranks()[static_cast<size_t>(r)].exit_code == 0 &&
                static_cast<int64_t>(Num(x.flushed, "flushed", -1)) == final_step_;
    steps_seen += (r ? " " : "") + (got < 0 ? std::string("-") : std::to_string(got));
    tiers_seen += (r ? " " : "") + tier;
  }
  checks_.push_back({"every rank restored node 0's newest step (" + std::to_string(expected_) + ")",
                     same_step, "restored: " + steps_seen});
  checks_.push_back({"node 1 came back from node 0's memory, 0 bytes from the PFS",
                     tiers_ok && pfs_read == 0,
                     "tiers: " + tiers_seen + ", PFS bytes read " + std::to_string(pfs_read)});
  checks_.push_back({"every restored value equals a replay of the training", values_ok, ""});
  checks_.push_back(
      {"training resumed and step " + std::to_string(final_step_) + " was flushed", finished_, ""});
  if (!values_ok || !finished_) PrintProblems(after_);
  if (finished_)
    std::printf("      step %lld committed to the PFS\n", static_cast<long long>(final_step_));
  std::printf("\n");
  return true;
}

bool DemoRun::Reshard() {
  std::printf(
      "[4/4] every host tier dropped; a new job of 3 ranks (parameters split 3 ways along dim "
      "0,\n      ZeRO-3 flat optimizer shards) restores the last PFS version\n");
  std::fflush(stdout);
  Status st = fs_->RemoveAll(d_.host_job);
  if (!st.ok()) return FailEarly("cannot drop the host tiers: " + st.ToString(), nullptr);
  auto check = Launch(a_, d_, 1, 3, "check");
  if (!check.ok())
    return FailEarly("cannot start the 3-rank job: " + check.status().ToString(), nullptr);
  const bool all_ok = check->launcher->WaitAll(600);
  reshard_ = check->Read();
  bool ok = all_ok;
  for (size_t r = 0; r < 3; ++r) {
    const RankLog& x = reshard_[r];
    const std::string tier = x.restored.count("tier") ? x.restored.at("tier") : "none";
    std::printf(
        "      rank %zu restored step %lld from %s in %.1f ms (%s, resharded); every value: "
        "%s\n",
        r, static_cast<long long>(Num(x.restored, "restored", -1)), tier.c_str(),
        Num(x.restored, "ms"), Mb(Num(x.restored, "bytes")).c_str(),
        x.check.empty() ? "not checked" : x.check.c_str());
    ok = ok && tier == "pfs" && x.check == "ok" && x.job_check == "none" &&
         static_cast<int64_t>(Num(x.restored, "restored", -1)) == final_step_ &&
         Num(x.restored, "resharded") == 1;
  }
  if (!ok) PrintProblems(reshard_);
  const double read = Num(reshard_[0].restored, "pfs"),
               needed = Num(reshard_[0].restored, "needed");
  checks_.push_back({"3 ranks, new layout: step " + std::to_string(final_step_) +
                         " from the PFS, every value equals a replay",
                     ok, ""});
  checks_.push_back({"each needed PFS byte read once", needed > 0 && read <= needed * 1.05,
                     Mb(read) + " read for " + Mb(needed) + " needed"});
  std::printf("\n");
  return true;
}

int DemoRun::Summarize() {
  std::vector<double> stall, iter;
  double copied = 0, replicated = 0, persisted = 0;
  for (const auto* phase : {&before_, &after_})
    for (const RankLog& r : *phase) {
      stall.insert(stall.end(), r.stall_ms.begin(), r.stall_ms.end());
      iter.insert(iter.end(), r.iter_ms.begin(), r.iter_ms.end());
      const Fields& f = r.flushed.empty() ? r.last_step : r.flushed;
      copied += Num(f, "copied");
      replicated += Num(f, "replicated");
      persisted += Num(f, "persisted");
    }
  const double stall_max = stall.empty() ? 0 : *std::max_element(stall.begin(), stall.end());
  std::printf("summary\n");
  std::printf("  %-28s 4 ranks, %lld steps before the kill, %lld after the restart\n", "training",
              static_cast<long long>(last_seen_), static_cast<long long>(final_step_ - expected_));
  std::printf(
      "  %-28s %.3f ms per iteration (median), %.3f ms mean, %.1f ms max; an iteration took "
      "%.0f ms\n",
      "checkpoint stall", Median(stall), Mean(stall), stall_max, Mean(iter));
  std::printf("  %-28s %s\n", "copied into host memory", Mb(copied).c_str());
  std::printf("  %-28s %s\n", "replicated to the other node", Mb(replicated).c_str());
  std::printf("  %-28s %s\n", "persisted to the PFS", Mb(persisted).c_str());
  auto tier_line = [&](const char* label, const std::vector<RankLog>& ls, std::vector<int> ranks,
                       const char* how) {
    double ms = 0, bytes = 0;
    for (int r : ranks) {
      if (static_cast<size_t>(r) >= ls.size()) return;
      ms = std::max(ms, Num(ls[static_cast<size_t>(r)].restored, "ms"));
      bytes += Num(ls[static_cast<size_t>(r)].restored, "bytes");
    }
    std::printf("  %-28s %-22s %8.1f ms  %s %s\n", label[0] == 'h' ? "recovery time by tier" : "",
                label, ms, Mb(bytes).c_str(), how);
  };
  tier_line("host (ranks 0, 1)", after_, {0, 1}, "from their own memory");
  tier_line("peer (ranks 2, 3)", after_, {2, 3}, "from node 0's replicas over UCX");
  tier_line("pfs (3 new ranks)", reshard_, {0, 1, 2}, "resharded from the PFS");
  std::printf("  checks\n");
  bool pass = true;
  for (const Check& c : checks_) {
    std::printf("    %-72s %s\n", c.what.c_str(), c.ok ? "ok" : "FAILED");
    if (!c.ok && !c.detail.empty()) std::printf("      %s\n", c.detail.c_str());
    pass = pass && c.ok;
  }
  pass = pass && checks_.size() == 6;
  if (pass && !a_.keep) {
    for (const std::string& p : {d_.host_job, d_.pfs_job, d_.logs}) {
      Status st = fs_->RemoveAll(p);
      if (!st.ok()) std::fprintf(stderr, "cairn demo: cleanup: %s\n", st.ToString().c_str());
    }
    ::rmdir(a_.pfs_root.c_str());  // only when empty
    ::rmdir(a_.host_root.c_str());
  } else {
    std::printf("\nkept: %s %s %s\n", d_.host_job.c_str(), d_.pfs_job.c_str(), d_.logs.c_str());
  }
  std::printf("\n%s\n", pass ? "demo passed" : "demo FAILED");
  return pass ? 0 : 1;
}

}  // namespace

int DemoMain(int argc, char** argv) {
  DemoArgs a;
  CLI::App app(
      "Runs a whole failure and recovery on this machine, with real processes and UCX:\n"
      "  1. 2 nodes x 2 ranks train a synthetic GPT-like model (embedding, L layers of\n"
      "     attention and MLP weights and norms, Adam moments; 2-way tensor parallel inside\n"
      "     a node, 2-way data parallel across nodes, optimizer moments sharded over the\n"
      "     data-parallel ranks) with a checkpoint every iteration into host memory,\n"
      "     replicated to the other node, every K-th (default 10) persisted to the PFS.\n"
      "  2. At step --kill-at (default: random in the middle of --steps, default 40) node 1's\n"
      "     ranks are killed with SIGKILL mid-iteration, then node 0's (the job restarts),\n"
      "     and node 1's host memory (--host-root/--job/node-1) is wiped.\n"
      "  3. The 4 ranks restart: node 0 restores from its own memory, node 1 from the\n"
      "     replicas node 0 holds, over UCX (no PFS byte read); every rank checks every\n"
      "     value against a replay of the training; training goes on to --steps and the\n"
      "     last step is flushed to the PFS.\n"
      "  4. Every host tier is dropped and a new job of 3 ranks, with parameters split in 3\n"
      "     along dim 0 and ZeRO-3 flat optimizer shards, restores the last PFS version and\n"
      "     checks every value.\n"
      "It prints progress and a summary: stall per iteration, bytes copied / replicated /\n"
      "persisted, recovery time by tier. Exit code 0 when every check passes, 1 otherwise.\n"
      "The host tiers go under --host-root (default /dev/shm/cairn-<uid>), the PFS under\n"
      "--pfs-root (default $TMPDIR or /var/tmp, /cairn-demo); both are removed at the end\n"
      "unless --keep or a check failed. --corrupt-replica damages node 0's replica of rank\n"
      "2 before the restart, to show the checks are real: 'flip' flips a bit (cairn's\n"
      "checksums catch it and fall back to an older version: the demo must fail its\n"
      "newest-version check), 'resealed' also rewrites the checksums so cairn cannot\n"
      "tell (the demo's replay check must fail).\n",
      "cairn demo");
  AddDemoOptions(app, &a);
  if (auto rc = Parse(app, argc, argv)) return *rc;
  if (a.persist_every > a.steps / 2) {
    std::fprintf(stderr, "cairn demo: needs --persist-every <= --steps / 2\n");
    return 2;
  }
  return DemoRun(std::move(a)).Run();
}

}  // namespace cairn::cli
