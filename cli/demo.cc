#include "cli/demo.h"

#include <fcntl.h>
#include <signal.h>
#include <sys/wait.h>
#include <unistd.h>

#include <chrono>
#include <cmath>
#include <cstdio>
#include <cstdlib>
#include <cstring>
#include <random>
#include <string>
#include <thread>
#include <vector>

#include "api/checkpointer.h"
#include "core/checksum.h"
#include "core/clock.h"

namespace cairn::cli {
namespace {

// ---------------------------------------------------------------------------------------
// A synthetic GPT-like model trained with Adam on deterministic pseudo-gradients. Every
// run with the same configuration computes the same bytes, so a restored state can be
// checked bit for bit against a replay.

uint64_t Mix(uint64_t x) {
  x += 0x9e3779b97f4a7c15ull;
  x = (x ^ (x >> 30)) * 0xbf58476d1ce4e5b9ull;
  x = (x ^ (x >> 27)) * 0x94d049bb133111ebull;
  return x ^ (x >> 31);
}

struct Param {
  std::string name;
  Shape shape;
  std::vector<float> w, m, v, g;
};

class SyntheticModel {
 public:
  SyntheticModel(int layers, int dim, int vocab) {
    Add("embedding.weight", {vocab, dim});
    for (int l = 0; l < layers; ++l) {
      const std::string p = "layers." + std::to_string(l) + ".";
      Add(p + "attn.qkv.weight", {3 * dim, dim});
      Add(p + "attn.out.weight", {dim, dim});
      Add(p + "mlp.fc1.weight", {4 * dim, dim});
      Add(p + "mlp.fc2.weight", {dim, 4 * dim});
    }
    for (size_t t = 0; t < params_.size(); ++t)
      for (size_t i = 0; i < params_[t].w.size(); ++i)
        params_[t].w[i] = static_cast<float>((Mix(t << 40 ^ i) >> 40) * 0x1p-24 - 0.5) * 0.04f;
  }

  // "forward and backward": gradients from the parameters (reads them only).
  void ComputeGradients(int64_t step) {
    for (size_t t = 0; t < params_.size(); ++t) {
      Param& p = params_[t];
      const uint64_t key = static_cast<uint64_t>(step) << 44 ^ t << 36;
      for (size_t i = 0; i < p.w.size(); ++i)
        p.g[i] = static_cast<float>((Mix(key ^ i) >> 40) * 0x1p-24 - 0.5) * 0.02f + 1e-3f * p.w[i];
    }
  }
  // The optimizer step: mutates parameters and moments.
  void AdamStep() {
    for (Param& p : params_)
      for (size_t i = 0; i < p.w.size(); ++i) {
        p.m[i] = 0.9f * p.m[i] + 0.1f * p.g[i];
        p.v[i] = 0.999f * p.v[i] + 0.001f * p.g[i] * p.g[i];
        p.w[i] -= 1e-3f * p.m[i] / (std::sqrt(p.v[i]) + 1e-8f);
      }
    rng_ = Mix(rng_);
  }
  void Train(int64_t step) {
    ComputeGradients(step);
    AdamStep();
  }

  std::vector<ShardSpec> Shards() {
    std::vector<ShardSpec> out;
    for (Param& p : params_) {
      out.push_back(ShardSpec::Whole({p.name, DType::kF32, p.shape}, p.w.data()));
      out.push_back(
          ShardSpec::Whole({"optimizer." + p.name + ".exp_avg", DType::kF32, p.shape}, p.m.data()));
      out.push_back(ShardSpec::Whole({"optimizer." + p.name + ".exp_avg_sq", DType::kF32, p.shape},
                                     p.v.data()));
    }
    return out;
  }
  Blobs MakeBlobs(int64_t step) const {
    Blobs b;
    b["rng_state"] = std::string(reinterpret_cast<const char*>(&rng_), sizeof(rng_));
    b["trainer"] = "step=" + std::to_string(step) + " samples_seen=" + std::to_string(step * 512);
    return b;
  }
  bool LoadBlobs(const Blobs& b) {
    auto it = b.find("rng_state");
    if (it == b.end() || it->second.size() != sizeof(rng_)) return false;
    std::memcpy(&rng_, it->second.data(), sizeof(rng_));
    return true;
  }
  uint64_t Digest() const {
    ChecksumStream h;
    for (const Param& p : params_) {
      h.Update(p.w.data(), p.w.size() * 4);
      h.Update(p.m.data(), p.m.size() * 4);
      h.Update(p.v.data(), p.v.size() * 4);
    }
    h.Update(&rng_, sizeof(rng_));
    return h.Digest();
  }
  uint64_t state_bytes() const {
    uint64_t n = 0;
    for (const Param& p : params_) n += p.w.size() * 12;
    return n;
  }
  size_t num_tensors() const { return params_.size() * 3; }

 private:
  void Add(std::string name, Shape shape) {
    Param p;
    p.name = std::move(name);
    p.shape = std::move(shape);
    const size_t n = static_cast<size_t>(NumElements(p.shape));
    p.w.assign(n, 0.f);
    p.m.assign(n, 0.f);
    p.v.assign(n, 0.f);
    p.g.assign(n, 0.f);
    params_.push_back(std::move(p));
  }
  std::vector<Param> params_;
  uint64_t rng_ = 0x5eed;
};

constexpr int kDim = 256;
constexpr int kVocab = 4096;

struct DemoArgs {
  int64_t steps = 60;
  int64_t kill_at = -1;  // -1: random in the middle third
  int layers = 4;
  std::string host_root = "/dev/shm/cairn";
  std::string job;
  bool keep = false;
  bool resume = false;  // worker only
  uint64_t seed = 0;
};

bool ParseArgs(int argc, char** argv, DemoArgs* a, bool* help) {
  for (int i = 1; i < argc; ++i) {
    std::string k = argv[i];
    auto next = [&](const char* what) -> const char* {
      if (i + 1 >= argc) {
        std::fprintf(stderr, "cairn demo: %s needs a value\n", what);
        return nullptr;
      }
      return argv[++i];
    };
    const char* v = nullptr;
    if (k == "--help" || k == "-h") {
      *help = true;
    } else if (k == "--keep") {
      a->keep = true;
    } else if (k == "--resume") {
      a->resume = true;
    } else if (k == "--steps" || k == "--kill-at" || k == "--layers" || k == "--seed") {
      if (!(v = next(k.c_str()))) return false;
      char* end = nullptr;
      long long n = std::strtoll(v, &end, 10);
      if (*end || n < 0) {
        std::fprintf(stderr, "cairn demo: %s '%s' is not a non-negative integer\n", k.c_str(), v);
        return false;
      }
      if (k == "--steps") a->steps = n;
      if (k == "--kill-at") a->kill_at = n;
      if (k == "--layers") a->layers = static_cast<int>(n);
      if (k == "--seed") a->seed = static_cast<uint64_t>(n);
    } else if (k == "--host-root") {
      if (!(v = next("--host-root"))) return false;
      a->host_root = v;
    } else if (k == "--job") {
      if (!(v = next("--job"))) return false;
      a->job = v;
    } else {
      std::fprintf(stderr, "cairn demo: unknown option '%s' (try --help)\n", k.c_str());
      return false;
    }
  }
  if (a->steps < 4) {
    std::fprintf(stderr, "cairn demo: --steps must be at least 4\n");
    return false;
  }
  if (a->layers < 1 || a->layers > 64) {
    std::fprintf(stderr, "cairn demo: --layers must be 1..64\n");
    return false;
  }
  return true;
}

Options WorkerOptions(const DemoArgs& a) {
  Options o;
  o.job_id = a.job;
  o.host_root = a.host_root;
  // The demo's PFS copy lives beside its host tier and is removed with it.
  o.pfs_root = JoinPath(JoinPath(a.host_root, a.job), "pfs");
  o.slots = 3;  // every 10th version drains to the PFS from a pinned slot meanwhile
  o.log_level = 1;
  return o;
}

// Prints one line to the parent and flushes it.
void Report(const char* fmt, auto... args) {
  std::printf(fmt, args...);
  std::printf("\n");
  std::fflush(stdout);
}

}  // namespace

int DemoWorkerMain(int argc, char** argv) {
  DemoArgs a;
  bool help = false;
  if (!ParseArgs(argc, argv, &a, &help) || a.job.empty()) return 2;
  auto ckpt = Checkpointer::Open(WorkerOptions(a));
  if (!ckpt.ok()) {
    std::fprintf(stderr, "demo worker: %s\n", ckpt.status().ToString().c_str());
    return 1;
  }
  Checkpointer& c = **ckpt;
  SyntheticModel model(a.layers, kDim, kVocab);
  std::vector<ShardSpec> shards = model.Shards();
  int64_t start = 0;
  if (a.resume) {
    auto r = c.restore(shards);
    if (!r.ok()) {
      std::fprintf(stderr, "demo worker: restore failed: %s\n", r.status().ToString().c_str());
      return 1;
    }
    const bool blobs_ok = model.LoadBlobs(r->blobs);
    // Replay the same training without checkpoints and compare every byte.
    SyntheticModel replay(a.layers, kDim, kVocab);
    for (int64_t t = 1; t <= r->step; ++t) replay.Train(t);
    const bool exact = blobs_ok && replay.Digest() == model.Digest();
    Report("restored %lld %.3f %d %zu", static_cast<long long>(r->step), r->seconds * 1e3,
           exact ? 1 : 0, r->skipped.size());
    if (!exact) return 3;
    start = r->step;
  } else {
    if (!c.save(0, shards, model.MakeBlobs(0)).ok()) return 1;
  }
  for (int64_t t = start + 1; t <= a.steps; ++t) {
    model.ComputeGradients(t);  // forward + backward: read the parameters only
    const int64_t f0 = NowNanos();
    Status fs = c.fence();  // the optimizer is about to write
    const double fence_ms = NanosToSeconds(NowNanos() - f0) * 1e3;
    if (!fs.ok()) std::fprintf(stderr, "demo worker: %s\n", fs.ToString().c_str());
    model.AdamStep();
    const int64_t s0 = NowNanos();
    auto out = c.save(t, shards, model.MakeBlobs(t));
    const double save_ms = NanosToSeconds(NowNanos() - s0) * 1e3;
    if (!out.ok()) {
      std::fprintf(stderr, "demo worker: %s\n", out.status().ToString().c_str());
      return 1;
    }
    Report("step %lld %.3f %d", static_cast<long long>(t), save_ms + fence_ms,
           *out == SaveOutcome::kQueued ? 1 : 0);
  }
  Status ws = c.wait_captured();
  Stats s = c.stats();
  Report("final %llu %llu %llu %.3f %.3f %llu %.2f",
         static_cast<unsigned long long>(model.Digest()),
         static_cast<unsigned long long>(s.captured), static_cast<unsigned long long>(s.skipped),
         (s.fence_wait_total_s + s.save_call_total_s) * 1e3, s.fence_wait_max_s * 1e3,
         static_cast<unsigned long long>(s.bytes_copied), s.copy_gbps);
  return ws.ok() ? 0 : 1;
}

namespace {

struct Worker {
  pid_t pid = -1;
  FILE* out = nullptr;
};

Worker Spawn(const DemoArgs& a, bool resume) {
  int fds[2];
  if (::pipe(fds) != 0) return {};
  pid_t pid = ::fork();
  if (pid == 0) {
    ::dup2(fds[1], STDOUT_FILENO);
    ::close(fds[0]);
    ::close(fds[1]);
    std::vector<std::string> args = {"cairn",       "demo-worker",
                                     "--job",       a.job,
                                     "--host-root", a.host_root,
                                     "--steps",     std::to_string(a.steps),
                                     "--layers",    std::to_string(a.layers)};
    if (resume) args.push_back("--resume");
    std::vector<char*> argv;
    for (auto& s : args) argv.push_back(s.data());
    argv.push_back(nullptr);
    ::execv("/proc/self/exe", argv.data());
    std::_Exit(127);
  }
  ::close(fds[1]);
  return {pid, ::fdopen(fds[0], "r")};
}

int WaitExit(pid_t pid) {
  int status = 0;
  while (::waitpid(pid, &status, 0) < 0 && errno == EINTR) {
  }
  if (WIFEXITED(status)) return WEXITSTATUS(status);
  return 128 + WTERMSIG(status);
}

const char* Check(bool ok) {
  return ok ? "ok" : "FAILED";
}

}  // namespace

int DemoMain(int argc, char** argv) {
  DemoArgs a;
  bool help = false;
  if (!ParseArgs(argc, argv, &a, &help)) return 2;
  if (help) {
    std::printf(
        "usage: cairn demo [--steps N] [--kill-at N] [--layers L] [--host-root DIR] [--job ID]\n"
        "                  [--seed S] [--keep]\n\n"
        "Trains a synthetic GPT-like model (embedding + L layers of attention and MLP weights,\n"
        "with Adam moments) on one rank, checkpointing every iteration into host memory. At\n"
        "step --kill-at (default: a random step in the middle third of --steps, default 60) the\n"
        "training process is killed with SIGKILL; a new process restores the newest complete\n"
        "version, checks it bit for bit against a replay of the training, finishes the run, and\n"
        "checks that its final state equals an uninterrupted run's. Exit code 0 when every\n"
        "check passes. --keep leaves the host-tier files under --host-root/--job.\n");
    return 0;
  }
  std::mt19937_64 rng(a.seed ? a.seed : static_cast<uint64_t>(WallNanos()));
  if (a.job.empty()) a.job = "demo-" + std::to_string(::getpid());
  if (a.kill_at < 0)
    a.kill_at = a.steps / 3 + static_cast<int64_t>(rng() % static_cast<uint64_t>(a.steps / 3));
  a.kill_at = std::clamp<int64_t>(a.kill_at, 1, a.steps - 1);
  const std::string job_dir = a.host_root + "/" + a.job;
  {
    SyntheticModel probe(a.layers, kDim, kVocab);
    std::printf(
        "cairn demo: one rank trains a synthetic GPT-like model (%d layers, %zu tensors, "
        "%.1f MB of weights and Adam moments)\n"
        "            and checkpoints it every iteration into host memory under %s\n\n",
        a.layers, probe.num_tensors(), probe.state_bytes() / 1e6, job_dir.c_str());
  }
  std::fflush(stdout);

  // 1. Train until the kill step, then SIGKILL the process at a random moment.
  Worker w = Spawn(a, false);
  if (w.pid < 0) {
    std::fprintf(stderr, "cairn demo: cannot start the training process\n");
    return 1;
  }
  std::printf("[1/3] training process %d started; it will be killed at step %lld\n", w.pid,
              static_cast<long long>(a.kill_at));
  char line[512];
  int64_t last_step = -1;
  double stall_sum = 0;
  int stall_n = 0;
  bool killed = false;
  while (std::fgets(line, sizeof line, w.out)) {
    long long t = 0;
    double stall = 0;
    int queued = 0;
    if (std::sscanf(line, "step %lld %lf %d", &t, &stall, &queued) == 3) {
      last_step = t;
      stall_sum += stall;
      ++stall_n;
      if (t % 10 == 0)
        std::printf("      step %3lld  checkpoint stall %.3f ms\n", t, stall), std::fflush(stdout);
      if (t >= a.kill_at) {
        // Somewhere inside the next iteration: maybe mid-copy, maybe mid-commit.
        std::this_thread::sleep_for(std::chrono::microseconds(rng() % 40000));
        ::kill(w.pid, SIGKILL);
        killed = true;
        break;
      }
    }
  }
  std::fclose(w.out);
  const int first_exit = WaitExit(w.pid);
  if (!killed) {
    std::fprintf(stderr, "cairn demo: the training process ended early (exit %d)\n", first_exit);
    return 1;
  }
  std::printf("[2/3] killed the training process with SIGKILL after it reported step %lld\n",
              static_cast<long long>(last_step));
  std::vector<std::string> problems;
  auto held =
      HostTier::Scan(DefaultFileSystem(), HostTier::RankDir(a.host_root, a.job, 0, 0), &problems);
  if (held.ok()) {
    std::printf("      what the dead process left in host memory:\n");
    for (const VersionInfo& v : *held)
      std::printf(
          "        step %3lld  %-10s %s\n", static_cast<long long>(v.step),
          VersionStateName(v.state),
          IsRestorable(v.state) ? "complete, restorable" : "torn by the kill: never restored");
  }
  std::fflush(stdout);

  // 2. Restart: restore the newest complete version and finish the run.
  w = Spawn(a, true);
  std::printf("[3/3] restarted the training process (%d)\n", w.pid);
  long long restored = -1;
  double restore_ms = 0;
  int exact = 0;
  size_t skipped_versions = 0;
  unsigned long long final_digest = 0, captured = 0, skipped = 0, bytes = 0;
  double stall_total = 0, fence_max = 0, gbps = 0;
  bool got_final = false;
  while (std::fgets(line, sizeof line, w.out)) {
    long long t = 0;
    double stall = 0;
    int queued = 0;
    if (std::sscanf(line, "restored %lld %lf %d %zu", &restored, &restore_ms, &exact,
                    &skipped_versions) == 4) {
      std::printf(
          "      restored step %lld from host memory in %.1f ms; bit-exact with a replay "
          "of steps 1..%lld: %s\n",
          restored, restore_ms, restored, exact ? "yes" : "NO");
    } else if (std::sscanf(line, "step %lld %lf %d", &t, &stall, &queued) == 3) {
      stall_sum += stall;
      ++stall_n;
    } else if (std::sscanf(line, "final %llu %llu %llu %lf %lf %llu %lf", &final_digest, &captured,
                           &skipped, &stall_total, &fence_max, &bytes, &gbps) == 7) {
      got_final = true;
    }
    std::fflush(stdout);
  }
  std::fclose(w.out);
  const int second_exit = WaitExit(w.pid);

  // 3. The same run without interruption, for comparison.
  SyntheticModel reference(a.layers, kDim, kVocab);
  for (int64_t t = 1; t <= a.steps; ++t) reference.Train(t);
  const bool same_final = got_final && reference.Digest() == final_digest;
  // save(t) returned only after step t-1 was CAPTURED (a save waits for the commit of the
  // version before it), so the restore may never go further back than that.
  const bool restored_recent = restored >= last_step - 1;
  std::printf("      finished step %lld; final state equals an uninterrupted run's: %s\n\n",
              static_cast<long long>(a.steps), same_final ? "yes" : "NO");

  std::printf("summary\n");
  std::printf("  %-46s %s\n", "restart exit code",
              second_exit == 0 ? "0" : std::to_string(second_exit).c_str());
  std::printf("  %-46s %lld (killed after saving step %lld) %s\n", "restored step", restored,
              static_cast<long long>(last_step), Check(restored_recent));
  std::printf("  %-46s %s\n", "restored state bit-exact", Check(exact == 1));
  std::printf("  %-46s %s\n", "final state equals uninterrupted run", Check(same_final));
  std::printf("  %-46s %.3f ms (max fence wait %.3f ms)\n", "mean checkpoint stall per iteration",
              stall_n ? stall_sum / stall_n : 0.0, fence_max);
  std::printf("  %-46s %llu versions, %.1f MB, %.2f GB/s (%llu skipped)\n",
              "captured after the restart", captured, bytes / 1e6, gbps, skipped);
  std::printf("  %-46s %.1f ms\n", "recovery time (restore from host memory)", restore_ms);

  if (!a.keep) {
    Status st = DefaultFileSystem()->RemoveAll(job_dir);
    if (!st.ok()) std::fprintf(stderr, "cairn demo: cleanup: %s\n", st.ToString().c_str());
  } else {
    std::printf("\nkept the host tier at %s\n", job_dir.c_str());
  }
  const bool pass = second_exit == 0 && exact == 1 && same_final && restored_recent;
  std::printf("\n%s\n", pass ? "demo passed" : "demo FAILED");
  return pass ? 0 : 1;
}

}  // namespace cairn::cli
