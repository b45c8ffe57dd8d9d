#include "core/options.h"

#include <cctype>
#include <cerrno>
#include <cstdlib>
#include <limits>
#include <string_view>
#include <utility>

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

// One of a fixed set of words: `*out` gets the value paired with `text`; InvalidArgument
// naming the variable and listing the words otherwise.
template <typename T>
Status ParseChoice(const char* var, const char* text,
                   std::initializer_list<std::pair<const char*, T>> choices, T* out) {
  std::string words;  // "a, b or c"
  size_t i = 0;
  for (const auto& [word, value] : choices) {
    if (std::string_view(text) == word) {
      *out = value;
      return Status::OK();
    }
    if (i > 0) words += i + 1 == choices.size() ? " or " : ", ";
    words += word;
    ++i;
  }
  return Status::InvalidArgument(std::string(var) + "='" + text + "': use " + words);
}

}  // namespace

Result<uint64_t> ParseByteCount(const std::string& text, const std::string& what) {
  uint64_t v = 0;
  CAIRN_RETURN_IF_ERROR(ParseBytes(what.c_str(), text.c_str(), &v));
  return v;
}

const std::vector<EnvSetting>& EnvSettings() {
  static const std::vector<EnvSetting> kSettings = {
      {"RANK", "0", "global rank of this process (torchrun / Slurm)"},
      {"WORLD_SIZE", "1", "number of ranks in the job"},
      {"LOCAL_RANK", "0", "rank within this node"},
      {"LOCAL_WORLD_SIZE", "1", "ranks on this node"},
      {"GROUP_RANK", "RANK / LOCAL_WORLD_SIZE", "node id, as torchrun sets it"},
      {"CAIRN_RANK / CAIRN_WORLD_SIZE / CAIRN_LOCAL_RANK / CAIRN_LOCAL_WORLD_SIZE", "-",
       "override the variables above"},
      {"CAIRN_NODE", "GROUP_RANK", "node id: selects <host_root>/<job>/node-<n>"},
      {"CAIRN_JOB_ID", "TORCHELASTIC_RUN_ID, else 'default'",
       "job name; separates the files of concurrent jobs"},
      {"CAIRN_HOST_ROOT", "/dev/shm/cairn",
       "host-tier root (tmpfs survives the process; a DAX filesystem gives persistent memory)"},
      {"CAIRN_SLOTS", "2", "host slots per rank (ring); at least 2"},
      {"CAIRN_SLOT_BYTES", "0",
       "pre-size and pre-fault every slot at open (K/M/G suffix); "
       "0 sizes a slot at its first save, in the background"},
      {"CAIRN_CHUNK_BYTES", "4M", "capture and checksum chunk size (64K..1G)"},
      {"CAIRN_COPY_THREADS", "1",
       "threads of the host copy engine (the CUDA engine checksums on at least 4)"},
      {"CAIRN_COPY_ENGINE", "auto", "auto | host | cuda (auto: cuda when a device is usable)"},
      {"CAIRN_FULL_POLICY", "skip",
       "when no slot is free at save(): skip (count it, never stall) or block"},
      {"CAIRN_LOG_LEVEL", "1", "0 errors, 1 warnings, 2 info, 3 debug"},
      {"CAIRN_TRACE", "",
       "write Chrome trace events (save, fence, copy, replicate, persist, restore) to this "
       "file at exit; with several ranks <file>.rank-<r>.json (merge: cairn trace-merge)"},
      {"CAIRN_PFS_ROOT", "cairn-pfs", "root on the filesystem every node shares"},
      {"CAIRN_RENDEZVOUS_DIR", "<CAIRN_PFS_ROOT>/<job>/rendezvous",
       "where ranks publish their UCX addresses and find the job token (shared by all nodes)"},
      {"CAIRN_CONNECT_TIMEOUT_S", "120", "how long start-up waits for every rank to appear"},
      {"CAIRN_OP_TIMEOUT_S", "300", "how long a collective waits for a silent peer"},
      {"CAIRN_REPLICAS", "1", "copies of every version held in other nodes' memory (0: none)"},
      {"CAIRN_REPLICATE_TIMEOUT_S", "30",
       "a replica holder that does not answer this long counts as down (training never waits)"},
      {"CAIRN_PLACEMENT", "ring",
       "ring (node n -> nodes n+1..n+R) or group (Gemini: groups of R+1 nodes hold each other)"},
      {"CAIRN_PERSIST_EVERY", "10",
       "persist every k-th saved version to <CAIRN_PFS_ROOT>/<job> (0: only on flush())"},
      {"CAIRN_KEEP_ON_PFS", "3", "committed steps kept on the PFS; older ones are deleted"},
      {"CAIRN_PERSIST_THREADS", "4",
       "writer threads per rank for the PFS (each hashes a chunk, then writes it); also "
       "the PFS reader threads of a restore"},
      {"CAIRN_PERSIST_DIRECT", "0", "1: write PFS files with O_DIRECT (falls back if refused)"},
      {"CAIRN_PERSIST_PRIORITY", "low",
       "CPU priority of the PFS drain threads: low (nice 10), idle (SCHED_IDLE: only CPU "
       "nothing else wants; drains may crawl on a busy host) or normal"},
      {"CAIRN_PERSIST_RATE", "0",
       "cap on each rank's PFS write rate in bytes/s (K/M/G suffix; 0: unlimited)"},
  };
  return kSettings;
}

Result<Options> Options::FromEnvironment(const std::function<const char*(const char*)>& getenv) {
  auto get = [&](const char* name) -> const char* {
    const char* v = getenv ? getenv(name) : std::getenv(name);
    return (v && *v) ? v : nullptr;
  };
  auto first = [&](const char* a, const char* b) -> std::pair<const char*, const char*> {
    if (const char* v = get(a)) return {a, v};
    if (const char* v = get(b)) return {b, v};
    return {nullptr, nullptr};
  };
  Options o;
  int64_t v = 0;
  const int64_t kMaxRanks = 1 << 24;
  if (auto [n, t] = first("CAIRN_RANK", "RANK"); t) {
    CAIRN_RETURN_IF_ERROR(ParseInt(n, t, 0, kMaxRanks, &v));
    o.rank = static_cast<int>(v);
  }
  if (auto [n, t] = first("CAIRN_WORLD_SIZE", "WORLD_SIZE"); t) {
    CAIRN_RETURN_IF_ERROR(ParseInt(n, t, 1, kMaxRanks, &v));
    o.world_size = static_cast<int>(v);
  }
  if (auto [n, t] = first("CAIRN_LOCAL_RANK", "LOCAL_RANK"); t) {
    CAIRN_RETURN_IF_ERROR(ParseInt(n, t, 0, kMaxRanks, &v));
    o.local_rank = static_cast<int>(v);
  }
  if (auto [n, t] = first("CAIRN_LOCAL_WORLD_SIZE", "LOCAL_WORLD_SIZE"); t) {
    CAIRN_RETURN_IF_ERROR(ParseInt(n, t, 1, kMaxRanks, &v));
    o.local_world_size = static_cast<int>(v);
  }
  o.node = o.rank / o.local_world_size;
  if (auto [n, t] = first("CAIRN_NODE", "GROUP_RANK"); t) {
    CAIRN_RETURN_IF_ERROR(ParseInt(n, t, 0, kMaxRanks, &v));
    o.node = static_cast<int>(v);
  }
  if (auto [n, t] = first("CAIRN_JOB_ID", "TORCHELASTIC_RUN_ID"); t) o.job_id = t;
  if (const char* t = get("CAIRN_HOST_ROOT")) o.host_root = t;
  if (const char* t = get("CAIRN_SLOTS")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_SLOTS", t, 2, 64, &v));
    o.slots = static_cast<int>(v);
  }
  if (const char* t = get("CAIRN_SLOT_BYTES"))
    CAIRN_RETURN_IF_ERROR(ParseBytes("CAIRN_SLOT_BYTES", t, &o.slot_bytes));
  if (const char* t = get("CAIRN_CHUNK_BYTES"))
    CAIRN_RETURN_IF_ERROR(ParseBytes("CAIRN_CHUNK_BYTES", t, &o.chunk_bytes));
  if (const char* t = get("CAIRN_COPY_THREADS")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_COPY_THREADS", t, 1, 256, &v));
    o.copy_threads = static_cast<int>(v);
  }
  if (const char* t = get("CAIRN_COPY_ENGINE"))
    CAIRN_RETURN_IF_ERROR(ParseChoice("CAIRN_COPY_ENGINE", t,
                                      {std::pair{"auto", CopyEngineKind::kAuto},
                                       {"host", CopyEngineKind::kHost},
                                       {"cuda", CopyEngineKind::kCuda}},
                                      &o.copy_engine));
  if (const char* t = get("CAIRN_FULL_POLICY"))
    CAIRN_RETURN_IF_ERROR(ParseChoice(
        "CAIRN_FULL_POLICY", t,
        {std::pair{"skip", FullPolicy::kSkip}, {"block", FullPolicy::kBlock}}, &o.full_policy));
  if (const char* t = get("CAIRN_PFS_ROOT")) o.pfs_root = t;
  if (const char* t = get("CAIRN_RENDEZVOUS_DIR")) o.rendezvous_dir = t;
  for (auto [name, dst] : {std::pair{"CAIRN_CONNECT_TIMEOUT_S", &o.connect_timeout_s},
                           std::pair{"CAIRN_OP_TIMEOUT_S", &o.op_timeout_s},
                           std::pair{"CAIRN_REPLICATE_TIMEOUT_S", &o.replicate_timeout_s}}) {
    if (const char* t = get(name)) {
      char* end = nullptr;
      double d = std::strtod(t, &end);
      if (end == t || *end != '\0' || !(d > 0) || d > 86400)
        return Status::InvalidArgument(std::string(name) + "='" + t +
                                       "' is not a number of seconds in (0, 86400]");
      *dst = d;
    }
  }
  if (const char* t = get("CAIRN_REPLICAS")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_REPLICAS", t, 0, 16, &v));
    o.replicas = static_cast<int>(v);
  }
  if (const char* t = get("CAIRN_PLACEMENT"))
    CAIRN_RETURN_IF_ERROR(ParseChoice(
        "CAIRN_PLACEMENT", t, {std::pair{"ring", false}, {"group", true}}, &o.group_placement));
  if (const char* t = get("CAIRN_PERSIST_EVERY")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_PERSIST_EVERY", t, 0, 1 << 30, &v));
    o.persist_every = static_cast<int>(v);
  }
  if (const char* t = get("CAIRN_KEEP_ON_PFS")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_KEEP_ON_PFS", t, 1, 1 << 20, &v));
    o.keep_on_pfs = static_cast<int>(v);
  }
  if (const char* t = get("CAIRN_PERSIST_THREADS")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_PERSIST_THREADS", t, 1, 64, &v));
    o.persist_threads = static_cast<int>(v);
  }
  if (const char* t = get("CAIRN_PERSIST_DIRECT")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_PERSIST_DIRECT", t, 0, 1, &v));
    o.persist_direct = v == 1;
  }
  if (const char* t = get("CAIRN_PERSIST_PRIORITY"))
    CAIRN_RETURN_IF_ERROR(ParseChoice("CAIRN_PERSIST_PRIORITY", t,
                                      {std::pair{"idle", 0}, {"low", 1}, {"normal", 2}},
                                      &o.persist_priority));
  if (const char* t = get("CAIRN_PERSIST_RATE"))
    CAIRN_RETURN_IF_ERROR(ParseBytes("CAIRN_PERSIST_RATE", t, &o.persist_rate));
  if (const char* t = get("CAIRN_TRACE")) o.trace_path = t;
  if (const char* t = get("CAIRN_LOG_LEVEL")) {
    CAIRN_RETURN_IF_ERROR(ParseInt("CAIRN_LOG_LEVEL", t, 0, 3, &v));
    o.log_level = static_cast<int>(v);
  }
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
  if (log_level < 0 || log_level > 3) return bad("log level must be 0..3");
  if (pfs_root.empty()) return bad("PFS root is empty");
  if (!(connect_timeout_s > 0) || !(op_timeout_s > 0)) return bad("timeouts must be positive");
  if (persist_every < 0) return bad("persist_every must not be negative");
  if (keep_on_pfs < 1) return bad("keep_on_pfs must be at least 1");
  if (persist_threads < 1 || persist_threads > 64) return bad("persist threads must be 1..64");
  if (persist_priority < 0 || persist_priority > 2) return bad("persist priority must be 0..2");
  return Status::OK();
}

std::string Options::RendezvousDir() const {
  if (!rendezvous_dir.empty()) return rendezvous_dir;
  return pfs_root + "/" + job_id + "/rendezvous";
}

}  // namespace cairn
