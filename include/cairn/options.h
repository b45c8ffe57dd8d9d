// Options: every setting of a Checkpointer, with its default, read from the environment in
// this one place.
//
// torchrun / Slurm style variables give the rank layout (RANK, WORLD_SIZE, LOCAL_RANK,
// LOCAL_WORLD_SIZE, GROUP_RANK); CAIRN_* variables override them and set everything else.
// Settings() is the one table of them: the parser, `cairn --help`, `cairn settings` and
// docs/settings.md (checked by a test) all come from it.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <variant>
#include <vector>

#include "cairn/status.h"

namespace cairn {

// What save() does when every host slot is still needed (capturing, or holding the newest
// complete version): skip this version (count it and warn, never stall), wait up to
// CAIRN_FULL_WAIT_S for one and then skip, block until one frees, or fail the save (an
// Unavailable error naming what holds the slots; the version is counted as skipped).
enum class FullPolicy { kSkip, kBlock, kWait, kRaise };

// Whether a restore asks for huge pages for host targets never touched (CAIRN_RESTORE_HUGE_PAGES).
enum class RestoreHugePages {
  kAuto,  // yes, unless this machine reports its free memory to a hypervisor
  kOff,
  kOn,
};

// CPU priority of a background stage's threads: the PFS drain's, replication's.
enum class BackgroundPriority {
  kIdle,    // SCHED_IDLE: only CPU time nothing else wants (can starve on a busy host)
  kLow,     // nice +10
  kNormal,  // as the training threads
};

// Which engine copies tensors into host slots.
enum class CopyEngineKind { kAuto, kHost, kCuda };

// Which messages cairn writes to stderr: errors only, and warnings, info, debug.
enum class LogLevel { kError = 0, kWarning = 1, kInfo = 2, kDebug = 3 };

// How the ranks of a job find each other's UCX addresses at start-up.
enum class BootstrapKind {
  kAuto,   // PMIx when the launcher provides it (PMIX_NAMESPACE is set), else files
  kPmix,   // the launcher's PMIx key-value store (mpirun, srun --mpi=pmix)
  kFiles,  // address files in the rendezvous directory
};

// What protects a version against the loss of its node (docs/settings.md, "Redundancy").
enum class RedundancyKind {
  kReplica,  // CAIRN_REPLICAS full copies on other nodes (CAIRN_PLACEMENT ring or group)
  kXor,      // XOR parity over sets of CAIRN_ERASURE_K nodes: any 1 of them may be lost
  kRs,       // Reed-Solomon over sets of CAIRN_ERASURE_K nodes: any CAIRN_ERASURE_M
};

// The default host root: /dev/shm/cairn-<effective uid>, one per user, so two users of a
// node never share one (and neither can create the other's first unnoticed: the host
// tier refuses a root that is not its user's own).
std::string DefaultHostRoot();

struct Options {
  std::string job_id = "default";
  std::string host_root = DefaultHostRoot();
  int rank = 0;
  int world_size = 1;
  int local_rank = 0;
  int local_world_size = 1;
  int node = 0;                       // node id: the host-tier tree this rank writes
  int slots = 3;                      // host-tier ring size per rank (>= 2; CAIRN_SLOTS)
  int copy_threads = 1;               // host copy engine threads
  uint64_t chunk_bytes = 4ull << 20;  // capture / checksum granularity
  uint64_t slot_bytes = 0;            // pre-size slots at open (0: on first save)
  uint64_t host_memory = 0;  // host bytes cairn may map per node; slots follow (0: CAIRN_SLOTS)
  FullPolicy full_policy = FullPolicy::kSkip;
  double full_wait_s = 5;  // CAIRN_FULL_POLICY=wait: the longest a save() waits for a slot
  CopyEngineKind copy_engine = CopyEngineKind::kAuto;
  LogLevel log_level = LogLevel::kWarning;  // CAIRN_LOG_LEVEL (error/warning/info/debug or 0..3)
  std::string trace_path;                   // CAIRN_TRACE: Chrome trace-event file ("": off)
  std::string pfs_root = "cairn-pfs";       // filesystem every node shares (rendezvous, PFS tier)
  std::string rendezvous_dir;               // "": <pfs_root>/<job>/rendezvous
  double connect_timeout_s = 120;           // start-up: how long to wait for every rank
  int connect_all_max = 64;                 // jobs up to this size connect every pair at start
  bool ucx_wait_events = true;  // idle waits sleep on UCX's event fd (false: poll, CAIRN_UCX_WAIT)
  BootstrapKind bootstrap = BootstrapKind::kAuto;  // how ranks find each other
  double op_timeout_s = 300;                       // a collective waiting on a silent peer
  int replicas = 1;                                // copies of each version in other nodes' memory
  double replicate_timeout_s = 30;  // a replica holder silent this long counts as down
  double replicate_share = 0.05;    // the most of the wall clock replica pushes may take (1: all)
  bool group_placement = false;     // Gemini's group placement instead of the ring
  RedundancyKind redundancy = RedundancyKind::kReplica;  // replicas, or parity (xor, rs)
  int erasure_k = 4;                                     // xor/rs: nodes per set, parity included
  int erasure_m = 2;        // rs: parity pieces per stripe (the nodes of a set that may be lost)
  int persist_every = 10;   // persist every k-th saved version (0: only flush())
  int keep_on_pfs = 3;      // committed steps kept on the PFS
  int persist_threads = 4;  // writer threads per rank
  bool persist_direct = false;        // O_DIRECT writes
  uint64_t persist_rate = 0;          // bytes/s cap per rank (0: unlimited)
  int cut_template_min_layouts = 64;  // distinct layouts from which templates with cuts plan
  BackgroundPriority persist_priority = BackgroundPriority::kLow;       // of the drain threads
  BackgroundPriority replicate_priority = BackgroundPriority::kNormal;  // of replication's
  RestoreHugePages restore_huge_pages = RestoreHugePages::kAuto;        // for fresh host targets

  // Reads the settings from `getenv` (the process environment by default). Unset
  // variables keep the defaults above. InvalidArgument naming the variable when a value
  // does not parse or is out of range.
  static Result<Options> FromEnvironment(
      const std::function<const char*(const char*)>& getenv = nullptr);

  // OK when the values are usable; InvalidArgument naming the setting otherwise.
  Status Validate() const;
  // The rendezvous directory in effect.
  std::string RendezvousDir() const;
};

// Parses a byte count with an optional K, M or G suffix (KiB, MiB, GiB also accepted);
// InvalidArgument naming `what` otherwise.
Result<uint64_t> ParseByteCount(const std::string& text, const std::string& what);

// A setting's value as its Options member holds it: a yes/no, a count, a byte count,
// seconds, or a name, path or enum word.
using SettingValue = std::variant<bool, int64_t, uint64_t, double, std::string>;

// One setting: the variable that sets it (and the launcher's variable read when it is
// unset), what it means, its value in an Options as the variable would spell it, and the
// parser that sets it from that text.
struct Setting {
  const char* variable;  // "CAIRN_SLOTS"
  // Variables read when `variable` is unset, in order, separated by ", " ("RANK,
  // OMPI_COMM_WORLD_RANK, ..." for CAIRN_RANK); nullptr when none.
  const char* fallback;
  const char* meaning;
  std::function<std::string(const Options&)> show;
  std::function<Status(const char* variable, const char* text, Options& o)> parse;
  // Printed instead of show(Options{}) when the default is derived from other settings.
  const char* derived_default = nullptr;
  // The Options member it sets ("slots", "trace_path"): the attribute name of Python's
  // cairn.Options, which is bound from this table.
  const char* field = nullptr;
  // The member's value, typed as the member holds it (an enum as its word), and setting it
  // from a value of that same alternative, checked as the variable is (the same range and
  // words); an error names `name`.
  std::function<SettingValue(const Options&)> get = nullptr;
  std::function<Status(const char* name, const SettingValue& value, Options& o)> set = nullptr;

  // The default as --help prints it.
  std::string DefaultText() const;
};
const std::vector<Setting>& Settings();

}  // namespace cairn
