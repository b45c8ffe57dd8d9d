#include "cairn/options.h"

#include <unistd.h>

#include <cctype>
#include <cerrno>
#include <cstdio>
#include <cstdlib>
#include <limits>
#include <optional>
#include <string>
#include <string_view>
#include <type_traits>
#include <utility>
#include <variant>

namespace cairn {
namespace {

Status ParseInt(const char* var, const char* text, int64_t lo, int64_t hi, int64_t* out) {
  errno = 0;
  char* end = nullptr;
  long long v = std::strtoll(text, &end, 10);
  if (errno != 0 || end == text || *end != '\0')
    return Status::InvalidArgument(std::string(var) + "='" + text + "' is not an integer");
  if (v < lo || v > hi)
    return Status::InvalidArgument(std::string(var) + "=" + text + " is outside [" +
                                   std::to_string(lo) + ", " + std::to_string(hi) + "]");
  *out = v;
  return Status::OK();
}

// Accepts a byte count with an optional K/M/G suffix (powers of 1024).
Status ParseBytes(const char* var, const char* text, uint64_t* out) {
  errno = 0;
  char* end = nullptr;
  unsigned long long v = std::strtoull(text, &end, 10);
  if (errno != 0 || end == text || text[0] == '-')
    return Status::InvalidArgument(std::string(var) + "='" + text + "' is not a byte count");
  uint64_t mult = 1;
  std::string suffix(end);
  if (suffix == "K" || suffix == "KiB")
    mult = 1ull << 10;
  else if (suffix == "M" || suffix == "MiB")
    mult = 1ull << 20;
  else if (suffix == "G" || suffix == "GiB")
    mult = 1ull << 30;
  else if (!suffix.empty())
    return Status::InvalidArgument(std::string(var) + "='" + text +
                                   "': unknown suffix (use K, M or G)");
  if (v > std::numeric_limits<uint64_t>::max() / mult)
    return Status::InvalidArgument(std::string(var) + "='" + text + "' is too large");
  *out = v * mult;
  return Status::OK();
}

}  // namespace

std::string DefaultHostRoot() {
  return "/dev/shm/cairn-" + std::to_string(::geteuid());
}

Result<uint64_t> ParseByteCount(const std::string& text, const std::string& what) {
  uint64_t v = 0;
  CAIRN_RETURN_IF_ERROR(ParseBytes(what.c_str(), text.c_str(), &v));
  return v;
}

namespace {

template <typename T>
using Member = T Options::*;

std::string ShowBytes(uint64_t v) {
  if (v != 0 && v % (1ull << 30) == 0) return std::to_string(v >> 30) + "G";
  if (v != 0 && v % (1ull << 20) == 0) return std::to_string(v >> 20) + "M";
  if (v != 0 && v % (1ull << 10) == 0) return std::to_string(v >> 10) + "K";
  return std::to_string(v);
}

std::string ShowSeconds(double v) {
  char buf[32];
  std::snprintf(buf, sizeof buf, "%g", v);  // 120, 0.5
  return buf;
}

// `s` with a default that is derived from other settings (printed instead of its value).
Setting Derived(Setting s, const char* derived_default) {
  s.derived_default = derived_default;
  return s;
}

// Gives `s` its typed get(), and a set() that writes the value as the variable would spell it
// (`text`: nullopt for the wrong kind of value) and parses that, so that a value set from
// Python is checked exactly as the variable is.
template <typename Get, typename Text>
Setting Typed(Setting s, const char* field, const char* kind, Get get, Text text) {
  s.field = field;
  s.get = get;
  s.set = [parse = s.parse, kind, text](const char* name, const SettingValue& v, Options& o) {
    const std::optional<std::string> t = text(v);
    if (!t) return Status::InvalidArgument(std::string(name) + " takes " + kind);
    return parse(name, t->c_str(), o);
  };
  return s;
}

template <typename T>
std::optional<std::string> IntegerText(const SettingValue& v) {
  if (const auto* i = std::get_if<int64_t>(&v)) return std::to_string(*i);
  if constexpr (std::is_unsigned_v<T>)
    if (const auto* u = std::get_if<uint64_t>(&v)) return std::to_string(*u);
  return std::nullopt;
}

// A member and its name: the table names every field once.
#define CAIRN_FIELD(name) &Options::name, #name

Setting Text(const char* var, const char* fallback, Member<std::string> m, const char* field,
             const char* meaning) {
  Setting s{var, fallback, meaning, [m](const Options& o) { return o.*m; },
            [m](const char*, const char* t, Options& o) {
              o.*m = t;
              return Status::OK();
            }};
  return Typed(
      std::move(s), field, "a string", [m](const Options& o) { return SettingValue(o.*m); },
      [](const SettingValue& v) -> std::optional<std::string> {
        if (const auto* t = std::get_if<std::string>(&v)) return *t;
        return std::nullopt;
      });
}

Setting Int(const char* var, const char* fallback, Member<int> m, const char* field, int64_t lo,
            int64_t hi, const char* meaning) {
  Setting s{var, fallback, meaning, [m](const Options& o) { return std::to_string(o.*m); },
            [m, lo, hi](const char* v, const char* t, Options& o) {
              int64_t x = 0;
              CAIRN_RETURN_IF_ERROR(ParseInt(v, t, lo, hi, &x));
              o.*m = static_cast<int>(x);
              return Status::OK();
            }};
  return Typed(
      std::move(s), field, "an integer",
      [m](const Options& o) { return SettingValue(int64_t{o.*m}); }, IntegerText<int64_t>);
}

Setting Bytes(const char* var, Member<uint64_t> m, const char* field, const char* meaning) {
  Setting s{var, nullptr, meaning, [m](const Options& o) { return ShowBytes(o.*m); },
            [m](const char* v, const char* t, Options& o) { return ParseBytes(v, t, &(o.*m)); }};
  return Typed(
      std::move(s), field, "a byte count", [m](const Options& o) { return SettingValue(o.*m); },
      IntegerText<uint64_t>);
}

// A number in (0, hi]: `what` names it in the error ("a number of seconds", "a fraction")
// and in Typed's.
Setting Number(const char* var, Member<double> m, const char* field, const char* meaning,
               const char* what, double hi, const char* range) {
  Setting s{var, nullptr, meaning, [m](const Options& o) { return ShowSeconds(o.*m); },
            [m, what, hi, range](const char* v, const char* t, Options& o) {
              char* end = nullptr;
              errno = 0;
              const double d = std::strtod(t, &end);
              if (errno != 0 || end == t || *end != '\0' || !(d > 0) || d > hi)
                return Status::InvalidArgument(std::string(v) + "='" + t + "' is not " + what +
                                               " in " + range);
              o.*m = d;
              return Status::OK();
            }};
  return Typed(
      std::move(s), field, what, [m](const Options& o) { return SettingValue(o.*m); },
      [](const SettingValue& v) -> std::optional<std::string> {
        if (const auto* d = std::get_if<double>(&v)) {
          char buf[32];
          std::snprintf(buf, sizeof buf, "%.17g", *d);  // the same double when parsed
          return buf;
        }
        return IntegerText<int64_t>(v);
      });
}

Setting Seconds(const char* var, Member<double> m, const char* field, const char* meaning) {
  return Number(var, m, field, meaning, "a number of seconds", 86400, "(0, 86400]");
}

Setting Fraction(const char* var, Member<double> m, const char* field, const char* meaning) {
  return Number(var, m, field, meaning, "a fraction", 1, "(0, 1]");
}

// A member that takes one of a few words. Typed, a bool member is a bool (its word found by
// value) and an enum member is its word.
template <typename T>
Setting Choice(const char* var, Member<T> m, const char* field,
               std::vector<std::pair<const char*, T>> words, const char* meaning) {
  auto word_of = [words](T value) {
    for (const auto& [w, v] : words)
      if (v == value) return std::string(w);
    return std::string("?");
  };
  Setting s{var, nullptr, meaning, [m, word_of](const Options& o) { return word_of(o.*m); },
            [m, words](const char* v, const char* t, Options& o) {
              std::string list;  // "a, b or c"
              for (size_t i = 0; i < words.size(); ++i) {
                if (std::string_view(t) == words[i].first) {
                  o.*m = words[i].second;
                  return Status::OK();
                }
                if (i > 0) list += i + 1 == words.size() ? " or " : ", ";
                list += words[i].first;
              }
              return Status::InvalidArgument(std::string(v) + "='" + t + "': use " + list);
            }};
  if constexpr (std::is_same_v<T, bool>) {
    return Typed(
        std::move(s), field, "True or False", [m](const Options& o) { return SettingValue(o.*m); },
        [word_of](const SettingValue& v) -> std::optional<std::string> {
          if (const auto* b = std::get_if<bool>(&v)) return word_of(*b);
          return std::nullopt;
        });
  } else {
    return Typed(
        std::move(s), field, "a word",
        [word_of, m](const Options& o) { return SettingValue(word_of(o.*m)); },
        [](const SettingValue& v) -> std::optional<std::string> {
          if (const auto* t = std::get_if<std::string>(&v)) return *t;
          return std::nullopt;
        });
  }
}

constexpr int64_t kMaxRanks = 1 << 24;

// The words of CAIRN_PERSIST_PRIORITY and CAIRN_REPLICATE_PRIORITY.
std::vector<std::pair<const char*, BackgroundPriority>> BackgroundPriorityWords() {
  return {{"idle", BackgroundPriority::kIdle},
          {"low", BackgroundPriority::kLow},
          {"normal", BackgroundPriority::kNormal}};
}

std::vector<Setting> MakeSettings() {
  return {
      // torchrun sets RANK etc., Open MPI's mpirun OMPI_COMM_WORLD_*, Slurm's srun SLURM_*.
      Int("CAIRN_RANK", "RANK, OMPI_COMM_WORLD_RANK, SLURM_PROCID", CAIRN_FIELD(rank), 0, kMaxRanks,
          "global rank of this process"),
      Int("CAIRN_WORLD_SIZE", "WORLD_SIZE, OMPI_COMM_WORLD_SIZE, SLURM_NTASKS",
          CAIRN_FIELD(world_size), 1, kMaxRanks, "number of ranks in the job"),
      Int("CAIRN_LOCAL_RANK", "LOCAL_RANK, OMPI_COMM_WORLD_LOCAL_RANK, SLURM_LOCALID",
          CAIRN_FIELD(local_rank), 0, kMaxRanks, "rank within this node"),
      Int("CAIRN_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE, OMPI_COMM_WORLD_LOCAL_SIZE",
          CAIRN_FIELD(local_world_size), 1, kMaxRanks, "ranks on this node"),
      Derived(Int("CAIRN_NODE", "GROUP_RANK, SLURM_NODEID", CAIRN_FIELD(node), 0, kMaxRanks,
                  "node id: selects <host_root>/<job>/node-<n>"),
              "RANK / LOCAL_WORLD_SIZE"),
      Derived(Text("CAIRN_JOB_ID", "TORCHELASTIC_RUN_ID", CAIRN_FIELD(job_id),
                   "job name; separates the files of concurrent jobs"),
              "TORCHELASTIC_RUN_ID, else 'default'"),
      Derived(Text("CAIRN_HOST_ROOT", nullptr, CAIRN_FIELD(host_root),
                   "host-tier root (tmpfs survives the process; a DAX filesystem gives "
                   "persistent memory); must be this user's own: a directory another user "
                   "made or can write is refused"),
              "/dev/shm/cairn-<uid>, one per user"),
      Int("CAIRN_SLOTS", nullptr, CAIRN_FIELD(slots), 2, 64,
          "host slots per rank (ring), each as large as a version: the newest version, one a "
          "drain or replica push may hold, and one to capture into (with 2, saves are "
          "skipped while a drain runs); at least 2"),
      Bytes("CAIRN_SLOT_BYTES", CAIRN_FIELD(slot_bytes),
            "pre-size and pre-fault every slot at open (K/M/G suffix); 0 sizes a slot at its "
            "first save, in the background"),
      Bytes("CAIRN_HOST_MEMORY", CAIRN_FIELD(host_memory),
            "host memory cairn may use per node, all its ranks' slots, replicas and parity "
            "together (K/M/G suffix; needs CAIRN_SLOT_BYTES): at open each rank takes the "
            "most slots, up to CAIRN_SLOTS, that fit, says in one line what that keeps and "
            "covers, or refuses naming what the fewest slots need (2, 3 with parity); 0 leaves "
            "CAIRN_SLOTS as set"),
      Bytes("CAIRN_CHUNK_BYTES", CAIRN_FIELD(chunk_bytes),
            "capture and checksum chunk size (64K..1G)"),
      Int("CAIRN_COPY_THREADS", nullptr, CAIRN_FIELD(copy_threads), 1, 256,
          "threads of the host copy engine (the CUDA engine checksums on at least 8)"),
      Choice<CopyEngineKind>("CAIRN_COPY_ENGINE", CAIRN_FIELD(copy_engine),
                             {{"auto", CopyEngineKind::kAuto},
                              {"host", CopyEngineKind::kHost},
                              {"cuda", CopyEngineKind::kCuda}},
                             "auto | host | cuda (auto: cuda when a device is usable)"),
      Choice<FullPolicy>("CAIRN_FULL_POLICY", CAIRN_FIELD(full_policy),
                         {{"skip", FullPolicy::kSkip},
                          {"wait", FullPolicy::kWait},
                          {"block", FullPolicy::kBlock},
                          {"raise", FullPolicy::kRaise}},
                         "when no slot is free at save(): skip (count it, warn, never stall), "
                         "wait (up to CAIRN_FULL_WAIT_S, then skip), block, or raise (save() "
                         "fails naming what holds the slots)"),
      Seconds("CAIRN_FULL_WAIT_S", CAIRN_FIELD(full_wait_s),
              "with CAIRN_FULL_POLICY=wait: the longest save() waits for a free slot"),
      Choice<LogLevel>("CAIRN_LOG_LEVEL", CAIRN_FIELD(log_level),
                       {{"error", LogLevel::kError},
                        {"warning", LogLevel::kWarning},
                        {"info", LogLevel::kInfo},
                        {"debug", LogLevel::kDebug},
                        {"0", LogLevel::kError},
                        {"1", LogLevel::kWarning},
                        {"2", LogLevel::kInfo},
                        {"3", LogLevel::kDebug}},
                       "what cairn writes to stderr: error | warning | info | debug (or 0..3)"),
      Text("CAIRN_TRACE", nullptr, CAIRN_FIELD(trace_path),
           "write Chrome trace events (save, fence, copy, replicate, persist, restore) to this "
           "file at exit; with several ranks <file>.rank-<r>.json (merge: cairn trace-merge)"),
      Text("CAIRN_PFS_ROOT", nullptr, CAIRN_FIELD(pfs_root),
           "root on the filesystem every node shares"),
      Derived(Text("CAIRN_RENDEZVOUS_DIR", nullptr, CAIRN_FIELD(rendezvous_dir),
                   "where ranks publish their UCX addresses and find the job token (shared by "
                   "all nodes)"),
              "<CAIRN_PFS_ROOT>/<job>/rendezvous"),
      Seconds("CAIRN_CONNECT_TIMEOUT_S", CAIRN_FIELD(connect_timeout_s),
              "how long start-up waits for every rank to appear"),
      Choice<BootstrapKind>(
          "CAIRN_BOOTSTRAP", CAIRN_FIELD(bootstrap),
          {{"auto", BootstrapKind::kAuto},
           {"pmix", BootstrapKind::kPmix},
           {"files", BootstrapKind::kFiles}},
          "how ranks find each other at start-up: pmix (the launcher's key-value store: "
          "mpirun, srun --mpi=pmix; no file per rank), files (address files in the "
          "rendezvous directory), auto (pmix when the launcher provides it and its job is "
          "cairn's, of the same size; else files: torchrun under srun uses files)"),
      Int("CAIRN_CONNECT_ALL_MAX", nullptr, CAIRN_FIELD(connect_all_max), 0, kMaxRanks,
          "jobs of at most this many ranks connect every pair at start-up (a missing rank "
          "fails the start at once); a larger job connects to a rank when it first talks "
          "to it, so a rank holds endpoints to, and reads the address files of, only its "
          "collective neighbours, replica partners and restore peers"),
      Choice<bool>("CAIRN_UCX_WAIT", CAIRN_FIELD(ucx_wait_events),
                   {{"event", true}, {"poll", false}},
                   "how cairn's threads wait for the network when it has nothing for them: "
                   "event (sleep on UCX's event fd until a message or a send can go on) or "
                   "poll (look every 20 us, cairn's way before; costs CPU where a wake is "
                   "dear, as under a hypervisor)"),
      Seconds("CAIRN_OP_TIMEOUT_S", CAIRN_FIELD(op_timeout_s),
              "how long a collective waits for a silent peer"),
      Int("CAIRN_REPLICAS", nullptr, CAIRN_FIELD(replicas), 0, 16,
          "copies of every version held in other nodes' memory (0: none)"),
      Seconds("CAIRN_REPLICATE_TIMEOUT_S", CAIRN_FIELD(replicate_timeout_s),
              "a replica holder that does not answer this long counts as down (training never "
              "waits); a link seen down and up again during a push is redialed at once, "
              "without waiting this long"),
      Fraction("CAIRN_REPLICATE_SHARE", CAIRN_FIELD(replicate_share),
               "the most of the wall clock replica pushes may take, in (0, 1]: from the measured "
               "push and step, one step in every 2^k is replicated so that pushes stay within "
               "it (the steps of a block's start, alike on every rank; logged when k changes; "
               "Stats: replicate_every, replication_behind_steps); a lost node then comes back "
               "from memory at most that many steps back; 1: push every version the link keeps "
               "up with (xor and rs push the steps the agreement names, unpaced)"),
      Choice<BackgroundPriority>(
          "CAIRN_REPLICATE_PRIORITY", CAIRN_FIELD(replicate_priority), BackgroundPriorityWords(),
          "CPU priority of the replication threads (pushing versions, receiving and checking "
          "replicas and parity): normal, low (nice 10: training first where no core is "
          "spare; replicas then lag and skip more steps) or idle"),
      Choice<bool>("CAIRN_PLACEMENT", CAIRN_FIELD(group_placement),
                   {{"ring", false}, {"group", true}},
                   "ring (node n -> nodes n+1..n+R) or group (Gemini: groups of R+1 nodes hold "
                   "each other)"),
      Choice<RedundancyKind>(
          "CAIRN_REDUNDANCY", CAIRN_FIELD(redundancy),
          {{"replica", RedundancyKind::kReplica},
           {"xor", RedundancyKind::kXor},
           {"rs", RedundancyKind::kRs}},
          "what protects a version against a lost node: replica (CAIRN_REPLICAS full copies, "
          "placed by CAIRN_PLACEMENT), xor (parity over sets of CAIRN_ERASURE_K nodes, each "
          "holding 1/(k-1) of its state per version; any one node of a set may be lost) or rs "
          "(Reed-Solomon: m/(k-m) per node; any CAIRN_ERASURE_M nodes of a set)"),
      Int("CAIRN_ERASURE_K", nullptr, CAIRN_FIELD(erasure_k), 2, 64,
          "xor and rs: nodes per erasure-coded set, parity included (the job's node count must "
          "be a multiple)"),
      Int("CAIRN_ERASURE_M", nullptr, CAIRN_FIELD(erasure_m), 1, 63,
          "rs: parity pieces per stripe, the nodes of a set that may be lost (less than "
          "CAIRN_ERASURE_K; xor is m = 1)"),
      Int("CAIRN_PERSIST_EVERY", nullptr, CAIRN_FIELD(persist_every), 0, 1 << 30,
          "persist every k-th saved version to <CAIRN_PFS_ROOT>/<job> (0: only on flush()); in "
          "a job of several ranks, the newest version the job keeps at that save (the agreed "
          "one, or the one being made redundant, if newer than the last drained: usually 1-2 "
          "steps older), whose slot a drain then shares, else the k-th itself"),
      Int("CAIRN_KEEP_ON_PFS", nullptr, CAIRN_FIELD(keep_on_pfs), 1, 1 << 20,
          "committed steps kept on the PFS; older ones are deleted"),
      Int("CAIRN_PERSIST_THREADS", nullptr, CAIRN_FIELD(persist_threads), 1, 64,
          "writer threads per rank for the PFS (each hashes a chunk, then writes it); also the "
          "PFS reader threads of a restore"),
      Choice<bool>("CAIRN_PERSIST_DIRECT", CAIRN_FIELD(persist_direct), {{"0", false}, {"1", true}},
                   "1: write PFS files with O_DIRECT (falls back if refused)"),
      Choice<BackgroundPriority>(
          "CAIRN_PERSIST_PRIORITY", CAIRN_FIELD(persist_priority), BackgroundPriorityWords(),
          "CPU priority of the PFS drain threads: low (nice 10), idle (SCHED_IDLE: only CPU "
          "nothing else wants; drains may crawl on a busy host) or normal"),
      Bytes("CAIRN_PERSIST_RATE", CAIRN_FIELD(persist_rate),
            "cap on each rank's PFS write rate in bytes/s (K/M/G suffix; 0: unlimited)"),
      Int("CAIRN_CUT_TEMPLATE_MIN_LAYOUTS", nullptr, CAIRN_FIELD(cut_template_min_layouts), 0,
          1 << 30,
          "a drain plans from layout templates with cuts (multi-dimensional sharding: FSDP2 "
          "over tensor parallelism) when its job has at least this many distinct layouts; below, "
          "the general planner takes milliseconds and a resharding restore reads less (a "
          "template writes a part several ranks hold whole)"),
      Choice<RestoreHugePages>(
          "CAIRN_RESTORE_HUGE_PAGES", CAIRN_FIELD(restore_huge_pages),
          {{"auto", RestoreHugePages::kAuto},
           {"0", RestoreHugePages::kOff},
           {"1", RestoreHugePages::kOn}},
          "1: a restore asks the kernel for huge pages (MADV_HUGEPAGE) for host targets never "
          "touched (a fresh optimizer state), faulted in 2 MiB at a time; auto: 1 unless this "
          "virtual machine reports its free memory to the hypervisor (virtio-balloon free page "
          "reporting), where a huge page is often backed again 4 KiB at a time"),
  };
}

#undef CAIRN_FIELD

}  // namespace

std::string Setting::DefaultText() const {
  return derived_default ? derived_default : show(Options{});
}

const std::vector<Setting>& Settings() {
  static const std::vector<Setting> kSettings = MakeSettings();
  return kSettings;
}

Result<Options> Options::FromEnvironment(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) -> const char* {
    if (!name) return nullptr;
    const char* v = getenv ? getenv(name) : std::getenv(name);
    return (v && *v) ? v : nullptr;
  };
  Options o;
  bool node_given = false;
  for (const Setting& s : Settings()) {
    std::string var = s.variable;
    const char* text = get(var.c_str());
    for (std::string_view rest = s.fallback ? s.fallback : ""; !text && !rest.empty();) {
      const size_t comma = rest.find(", ");
      var = std::string(rest.substr(0, comma));
      rest = comma == std::string_view::npos ? "" : rest.substr(comma + 2);
      text = get(var.c_str());
    }
    if (!text) continue;
    CAIRN_RETURN_IF_ERROR(s.parse(var.c_str(), text, o));
    if (std::string_view(s.variable) == "CAIRN_NODE") node_given = true;
  }
  if (!node_given) o.node = o.rank / o.local_world_size;
  CAIRN_RETURN_IF_ERROR(o.Validate());
  return o;
}

Status Options::Validate() const {
  auto bad = [](const std::string& m) { return Status::InvalidArgument(m); };
  if (job_id.empty() || job_id.size() > 128) return bad("job id must be 1..128 characters");
  for (char c : job_id)
    if (!(std::isalnum(static_cast<unsigned char>(c)) || c == '-' || c == '_' || c == '.'))
      return bad("job id '" + job_id + "' may only contain letters, digits, '-', '_' and '.'");
  if (job_id == "." || job_id == "..") return bad("job id '" + job_id + "' is not a name");
  if (host_root.empty()) return bad("host root is empty");
  if (world_size < 1) return bad("world size must be at least 1");
  if (rank < 0 || rank >= world_size)
    return bad("rank " + std::to_string(rank) + " is not within world size " +
               std::to_string(world_size));
  if (local_world_size < 1) return bad("local world size must be at least 1");
  if (local_rank < 0 || local_rank >= local_world_size)
    return bad("local rank " + std::to_string(local_rank) + " is not within local world size " +
               std::to_string(local_world_size));
  if (node < 0) return bad("node id must not be negative");
  if (slots < 2 || slots > 64)
    return bad("slots=" + std::to_string(slots) +
               ": need at least 2 so that the newest complete version survives the next "
               "capture (at most 64)");
  if (copy_threads < 1 || copy_threads > 256) return bad("copy threads must be 1..256");
  if (chunk_bytes < (64u << 10) || chunk_bytes > (1ull << 30))
    return bad("chunk bytes must be between 64 KiB and 1 GiB");
  if (pfs_root.empty()) return bad("PFS root is empty");
  if (!(connect_timeout_s > 0) || !(op_timeout_s > 0)) return bad("timeouts must be positive");
  if (persist_every < 0) return bad("persist_every must not be negative");
  if (keep_on_pfs < 1) return bad("keep_on_pfs must be at least 1");
  if (persist_threads < 1 || persist_threads > 64) return bad("persist threads must be 1..64");
  if (redundancy == RedundancyKind::kRs && (erasure_m < 1 || erasure_m >= erasure_k))
    return bad("CAIRN_REDUNDANCY=rs needs 1 <= CAIRN_ERASURE_M < CAIRN_ERASURE_K; got k=" +
               std::to_string(erasure_k) + " m=" + std::to_string(erasure_m));
  if (redundancy != RedundancyKind::kReplica && (erasure_k < 2 || erasure_k > 64))
    return bad("CAIRN_ERASURE_K must be 2..64");
  return Status::OK();
}

std::string Options::RendezvousDir() const {
  if (!rendezvous_dir.empty()) return rendezvous_dir;
  return pfs_root + "/" + job_id + "/rendezvous";
}

}  // namespace cairn
