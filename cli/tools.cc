// `cairn ls` and `cairn verify`: what a job's checkpoint directories hold, and whether every
// byte of it still matches its checksums.
//
// PATH is either a PFS job directory (<CAIRN_PFS_ROOT>/<job>: step-*/MANIFEST, LATEST) or
// a host-tier job directory (<CAIRN_HOST_ROOT>/<job>: node-*/rank-*/ and
// node-*/replica/rank-*/). Nothing is modified and no lock is taken.
#include <fcntl.h>
#include <unistd.h>

#include <algorithm>
#include <cstdio>
#include <cstdlib>
#include <ctime>
#include <iterator>
#include <map>
#include <optional>
#include <regex>
#include <set>
#include <string>
#include <vector>

#include <nlohmann/json.hpp>

#include "cli/args.h"
#include "cli/demo.h"
#include "core/checksum.h"
#include "core/clock.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "persist/commit.h"
#include "persist/manifest.h"
#include "persist/pfs_reader.h"
#include "tiers/host_tier.h"
#include "tiers/slot_header.h"

namespace cairn::cli {
namespace {

struct StepEntry {
  int64_t step;
  std::string dir;
  bool committed;  // has a MANIFEST
};

// Step directories of a PFS job directory, oldest first.
std::vector<StepEntry> PfsSteps(FileSystem* fs, const std::string& job_dir) {
  std::vector<StepEntry> out;
  auto names = fs->ListDir(job_dir);
  if (!names.ok()) return out;
  for (const std::string& n : *names) {
    auto step = ParseStepDirName(n);
    if (!step) continue;
    const std::string dir = JoinPath(job_dir, n);
    out.push_back({*step, dir, fs->Exists(JoinPath(dir, "MANIFEST"))});
  }
  std::sort(out.begin(), out.end(),
            [](const StepEntry& a, const StepEntry& b) { return a.step < b.step; });
  return out;
}

// The name of `dir`, a directory TierDirs listed, relative to `job_dir` ("node-0/rank-1"),
// whether or not `job_dir` was given with a trailing slash (it was cut one character short:
// "ode-0/rank-1", and the host tree's summary matched no rank).
std::string RelativeName(const std::string& dir, const std::string& job_dir) {
  std::string rel = dir.substr(std::min(dir.size(), job_dir.size()));
  while (!rel.empty() && rel.front() == '/') rel.erase(0, 1);
  return rel;
}

// Host-tier directories under a host job directory: rank dirs and replica dirs.
std::vector<std::string> TierDirs(FileSystem* fs, const std::string& job_dir) {
  std::vector<std::string> out;
  auto nodes = fs->ListDir(job_dir);
  if (!nodes.ok()) return out;
  std::sort(nodes->begin(), nodes->end());
  for (const std::string& n : *nodes) {
    if (n.rfind("node-", 0) != 0) continue;
    const std::string node = JoinPath(job_dir, n);
    for (const std::string& sub : {std::string(), std::string("replica")}) {
      const std::string base = sub.empty() ? node : JoinPath(node, sub);
      auto ranks = fs->ListDir(base);
      if (!ranks.ok()) continue;
      std::sort(ranks->begin(), ranks->end());
      for (const std::string& r : *ranks)
        if (r.rfind("rank-", 0) == 0) out.push_back(JoinPath(base, r));
    }
  }
  return out;
}

std::string Age(int64_t created_wall_ns) {
  // A version made within the last second, or stamped by a node whose clock runs ahead,
  // is "0 s" old, never negative.
  const double s = std::max(0.0, NanosToSeconds(WallNanos() - created_wall_ns));
  char buf[32];
  if (s < 120)
    std::snprintf(buf, sizeof buf, "%.0f s", s);
  else if (s < 7200)
    std::snprintf(buf, sizeof buf, "%.0f min", s / 60);
  else
    std::snprintf(buf, sizeof buf, "%.1f h", s / 3600);
  return buf;
}

std::string Size(uint64_t n) {
  char buf[32];
  if (n >= (1ull << 30))
    std::snprintf(buf, sizeof buf, "%.2f GiB", static_cast<double>(n) / (1ull << 30));
  else if (n >= (1ull << 20))
    std::snprintf(buf, sizeof buf, "%.1f MiB", static_cast<double>(n) / (1ull << 20));
  else
    std::snprintf(buf, sizeof buf, "%llu B", static_cast<unsigned long long>(n));
  return buf;
}

bool IsPfsJobDir(FileSystem* fs, const std::string& path) {
  return fs->Exists(JoinPath(path, "LATEST")) || !PfsSteps(fs, path).empty();
}

// Checks every chunk and blob of the version in slot `slot` of tier directory `dir`.
// Corruption naming the tensor and file, or an error naming the file.
Status VerifySlot(FileSystem* fs, const std::string& dir, int slot, uint64_t* bytes) {
  const std::string hdr_path = JoinPath(dir, "slot-" + std::to_string(slot) + ".hdr");
  const std::string data_path = JoinPath(dir, "slot-" + std::to_string(slot));
  CAIRN_ASSIGN_OR_RETURN(std::string raw, ReadWholeFile(fs, hdr_path, kMaxSlotHeaderBytes));
  auto h = DecodeSlotHeader(raw);
  if (!h.ok()) return h.status().WithContext(hdr_path);
  CAIRN_ASSIGN_OR_RETURN(File data, fs->OpenFile(data_path, O_RDONLY | O_CLOEXEC, 0));
  std::vector<std::byte> buf;
  Status st;
  for (const SlotShard& s : h->shards) {
    for (uint32_t c = 0; c < s.num_chunks && st.ok(); ++c) {
      auto [b, e] = h->ChunkRange(s, c);
      buf.resize(e - b);
      st = data.ReadAt(buf.data(), e - b, b).WithContext(data_path);
      if (st.ok() && Checksum(buf.data(), e - b) != h->chunk_checksums[s.first_chunk + c])
        st = Status::Corruption("checksum mismatch in tensor '" + s.name + "' box " +
                                s.box.ToString() + ", bytes [" + std::to_string(b) + ", " +
                                std::to_string(e) + ") of " + data_path);
      *bytes += e - b;
    }
  }
  for (const SlotBlob& b : h->blobs) {
    if (!st.ok()) break;
    buf.resize(b.nbytes);
    st = data.ReadAt(buf.data(), b.nbytes, b.offset).WithContext(data_path);
    if (st.ok() && Checksum(buf.data(), b.nbytes) != b.checksum)
      st = Status::Corruption("checksum mismatch in blob '" + b.name + "' of " + data_path);
  }
  return st;
}

void Progress(const std::string& what, uint64_t done, uint64_t total) {
  if (!::isatty(STDERR_FILENO) || total == 0) return;
  const int width = 30;
  const int filled =
      static_cast<int>(static_cast<double>(done) / static_cast<double>(total) * width);
  std::fprintf(stderr, "\r  %s [%s%s] %3d%%", what.c_str(), std::string(filled, '#').c_str(),
               std::string(width - filled, ' ').c_str(),
               static_cast<int>(100.0 * static_cast<double>(done) / static_cast<double>(total)));
  if (done == total) std::fprintf(stderr, "\r%*s\r", width + 60, "");
}

// The restorable steps (CAPTURED or later) of every rank's own tier and of every replica,
// from a host-tier job directory's subdirectories.
struct HostTreeSteps {
  int world = 0;                                             // of the job that saved them
  std::map<int, int> node_of;                                // rank -> its node
  std::map<int, std::set<int64_t>> own;                      // rank -> steps on its node
  std::map<int, std::map<int, std::set<int64_t>>> replicas;  // rank -> holder node -> steps
};

HostTreeSteps ScanHostTree(FileSystem* fs, const std::string& job_dir,
                           const std::vector<std::string>& dirs) {
  HostTreeSteps t;
  const std::regex own_re(R"(node-(\d+)/rank-(\d+))"), rep_re(R"(node-(\d+)/replica/rank-(\d+))");
  for (const std::string& d : dirs) {
    const std::string rel = RelativeName(d, job_dir);
    std::smatch m;
    const bool is_own = std::regex_match(rel, m, own_re);
    if (!is_own && !std::regex_match(rel, m, rep_re)) continue;
    const int node = std::stoi(m[1].str()), rank = std::stoi(m[2].str());
    std::vector<std::string> problems;
    auto v = HostTier::Scan(fs, d, &problems);
    std::set<int64_t> steps;
    if (v.ok())
      for (const VersionInfo& x : *v) {
        t.world = std::max(t.world, static_cast<int>(x.world_size));
        if (x.state != VersionState::kCapturing)
          steps.insert(x.step);  // a torn one restores nothing
      }
    if (is_own) {
      t.node_of[rank] = node;
      t.own[rank] = std::move(steps);
    } else {
      t.replicas[rank][node] = std::move(steps);
    }
  }
  return t;
}

// The newest step of `steps`, or "none".
std::string Newest(const std::set<int64_t>& steps) {
  return steps.empty() ? "none" : std::to_string(*steps.rbegin());
}

// What survives the loss of one node, from memory: per rank its newest step and the newest
// one another node holds a replica of, then per node the newest step every rank could
// restore were that node lost (one that its ranks' replicas on other nodes and every other
// rank's own tier all hold). Needs every node's tree (a host root the nodes share, as on
// one machine); with only some, it says what this tree holds.
void PrintReplication(FileSystem* fs, const std::string& job_dir,
                      const std::vector<std::string>& dirs) {
  const HostTreeSteps t = ScanHostTree(fs, job_dir, dirs);
  std::set<int> nodes;
  for (const auto& [r, n] : t.node_of) nodes.insert(n);
  for (const auto& [r, by_node] : t.replicas)
    for (const auto& [n, steps] : by_node) nodes.insert(n);
  if (nodes.size() < 2 && t.replicas.empty()) return;  // one node: nothing is replicated
  const bool whole = t.world > 0 && static_cast<int>(t.node_of.size()) == t.world;
  if (!whole) {
    std::printf(
        "replication (this tree holds %zu of %d ranks' own tiers; `cairn ls` on a host "
        "root every node shares tells what losing a node leaves):\n",
        t.node_of.size(), t.world);
    for (const auto& [rank, by_node] : t.replicas)
      for (const auto& [node, steps] : by_node)
        std::printf("  node-%d holds replicas of rank %d up to step %s\n", node, rank,
                    Newest(steps).c_str());
    return;
  }
  std::printf("replication (what losing one node leaves in memory):\n");
  for (const auto& [rank, node] : t.node_of) {
    std::set<int64_t> elsewhere;
    auto r = t.replicas.find(rank);
    if (r != t.replicas.end())
      for (const auto& [n, steps] : r->second)
        if (n != node) elsewhere.insert(steps.begin(), steps.end());
    const std::set<int64_t>& mine = t.own.at(rank);
    std::string behind;
    if (!mine.empty() && (elsewhere.empty() || *mine.rbegin() > *elsewhere.rbegin()))
      behind = "  <- steps after " + Newest(elsewhere) + " live on node-" + std::to_string(node) +
               " only" +
               (elsewhere.empty() ? std::string()
                                  : " (" + std::to_string(*mine.rbegin() - *elsewhere.rbegin()) +
                                        " steps behind; CAIRN_REPLICATE_SHARE paces replication)");
    std::printf("  rank %d (node-%d): newest step %s, newest held by another node: %s%s\n", rank,
                node, Newest(mine).c_str(), Newest(elsewhere).c_str(), behind.c_str());
  }
  for (int lost : nodes) {
    std::optional<std::set<int64_t>> common;  // steps every rank can get with `lost` gone
    for (const auto& [rank, node] : t.node_of) {
      std::set<int64_t> avail;
      if (node != lost) {
        avail = t.own.at(rank);
      } else if (auto r = t.replicas.find(rank); r != t.replicas.end()) {
        for (const auto& [n, steps] : r->second)
          if (n != lost) avail.insert(steps.begin(), steps.end());
      }
      if (common) {
        std::set<int64_t> both;
        std::set_intersection(common->begin(), common->end(), avail.begin(), avail.end(),
                              std::inserter(both, both.begin()));
        avail = std::move(both);
      }
      common = std::move(avail);
    }
    if (common && !common->empty())
      std::printf("  losing node-%d: every rank can restore step %lld from memory\n", lost,
                  static_cast<long long>(*common->rbegin()));
    else
      std::printf("  losing node-%d: no step every rank holds in memory (restore from the PFS)\n",
                  lost);
  }
}

}  // namespace

int LsMain(int argc, char** argv) {
  CLI::App app(
      "Lists the versions under PATH: a PFS job directory (<CAIRN_PFS_ROOT>/<job>: committed "
      "steps with their size, world size, age, and which one LATEST names) or a host-tier job "
      "directory (<CAIRN_HOST_ROOT>/<job>: every rank's and replica's versions with state, "
      "size and age).",
      "cairn ls");
  std::string path;
  app.add_option("PATH", path, "job directory")->required();
  if (auto rc = Parse(app, argc, argv)) return *rc;
  FileSystem* fs = DefaultFileSystem();
  if (!fs->Exists(path)) {
    std::fprintf(stderr, "cairn ls: %s does not exist\n", path.c_str());
    return 1;
  }
  if (IsPfsJobDir(fs, path)) {
    auto latest = ReadLatest(fs, path);
    std::printf("PFS job %s%s\n", path.c_str(),
                latest.ok() ? (", LATEST = step " + std::to_string(*latest)).c_str() : "");
    std::printf("  %-8s %-12s %6s %6s %-10s %s\n", "step", "size", "ranks", "files", "age",
                "state");
    for (const StepEntry& e : PfsSteps(fs, path)) {
      if (!e.committed) {
        std::printf("  %-8lld %-12s %6s %6s %-10s %s\n", static_cast<long long>(e.step), "-", "-",
                    "-", "-", "incomplete (no MANIFEST; garbage)");
        continue;
      }
      auto m = ReadManifest(fs, e.dir);
      if (!m.ok()) {
        std::printf("  %-8lld unreadable: %s\n", static_cast<long long>(e.step),
                    m.status().ToString().c_str());
        continue;
      }
      uint64_t bytes = 0;
      for (const auto& b : m->boxes()) bytes += b.length();
      const bool is_latest = latest.ok() && *latest == e.step;
      std::printf("  %-8lld %-12s %6u %6d %-10s %s\n", static_cast<long long>(e.step),
                  Size(bytes).c_str(), m->world_size(), m->files_size(),
                  Age(m->created_wall_ns()).c_str(), is_latest ? "committed, LATEST" : "committed");
    }
    return 0;
  }
  const auto dirs = TierDirs(fs, path);
  if (dirs.empty()) {
    std::fprintf(stderr,
                 "cairn ls: %s is neither a PFS job directory nor a host-tier job directory\n",
                 path.c_str());
    return 1;
  }
  std::printf("host-tier job %s\n", path.c_str());
  for (const std::string& d : dirs) {
    std::vector<std::string> problems;
    auto v = HostTier::Scan(fs, d, &problems);
    std::printf("  %s\n", RelativeName(d, path).c_str());
    if (!v.ok()) {
      std::printf("    unreadable: %s\n", v.status().ToString().c_str());
      continue;
    }
    for (const VersionInfo& x : *v)
      std::printf("    step %-8lld %-22s %-12s slot %d, %zu shards, age %s\n",
                  static_cast<long long>(x.step), VersionStateName(x.state),
                  Size(x.data_bytes).c_str(), x.slot, x.shards, Age(x.created_wall_ns).c_str());
    for (const std::string& p : problems) std::printf("    (%s)\n", p.c_str());
    if (v->empty() && problems.empty()) std::printf("    (empty)\n");
  }
  PrintReplication(fs, path, dirs);
  return 0;
}

int VerifyMain(int argc, char** argv) {
  CLI::App app(
      "Re-reads every byte of the versions under PATH (a PFS job directory or a host-tier job "
      "directory) and checks every checksum: the MANIFEST's framing and checksum, every chunk "
      "of every saved box and blob on the PFS; every chunk and blob of every version in the "
      "host tiers and replicas. Names any corrupt tensor and file. Exit code 0: all verified; "
      "1: something is corrupt or unreadable; 2: usage.",
      "cairn verify");
  std::string path;
  int64_t step = -1;
  app.add_option("PATH", path, "job directory")->required();
  app.add_option("--step", step, "only this step (default: every one)")->check(WholeNumber());
  if (auto rc = Parse(app, argc, argv)) return *rc;
  FileSystem* fs = DefaultFileSystem();
  int bad = 0, good = 0;
  if (IsPfsJobDir(fs, path)) {
    for (const StepEntry& e : PfsSteps(fs, path)) {
      if (step >= 0 && e.step != step) continue;
      if (!e.committed) {
        if (step >= 0) {
          std::printf("step %lld: INCOMPLETE (no MANIFEST in %s)\n", static_cast<long long>(e.step),
                      e.dir.c_str());
          ++bad;
        }
        continue;
      }
      const std::string what = "step " + std::to_string(e.step);
      auto m = ReadManifest(fs, e.dir);
      Status st =
          m.ok() ? VerifyStep(fs, e.dir, *m, [&](uint64_t d, uint64_t t) { Progress(what, d, t); })
                 : m.status();
      if (st.ok()) {
        uint64_t bytes = 0;
        for (const auto& b : m->boxes()) bytes += b.length();
        std::printf("%s: OK (%s in %d boxes, %d files)\n", what.c_str(), Size(bytes).c_str(),
                    m->boxes_size(), m->files_size());
        ++good;
      } else {
        std::printf("%s: CORRUPT: %s\n", what.c_str(), st.ToString().c_str());
        ++bad;
      }
    }
  } else {
    for (const std::string& d : TierDirs(fs, path)) {
      std::vector<std::string> problems;
      auto v = HostTier::Scan(fs, d, &problems);
      if (!v.ok()) {
        std::printf("%s: UNREADABLE: %s\n", d.c_str(), v.status().ToString().c_str());
        ++bad;
        continue;
      }
      for (const VersionInfo& x : *v) {
        if (step >= 0 && x.step != step) continue;
        uint64_t bytes = 0;
        Status st = VerifySlot(fs, d, x.slot, &bytes);
        if (st.ok()) {
          std::printf("%s step %lld: OK (%s)\n", d.c_str(), static_cast<long long>(x.step),
                      Size(bytes).c_str());
          ++good;
        } else {
          std::printf("%s step %lld: CORRUPT: %s\n", d.c_str(), static_cast<long long>(x.step),
                      st.ToString().c_str());
          ++bad;
        }
      }
    }
  }
  if (good + bad == 0) {
    std::printf("nothing to verify under %s%s\n", path.c_str(),
                step >= 0 ? (" for step " + std::to_string(step)).c_str() : "");
    return 1;
  }
  std::printf("%d version(s) verified, %d corrupt or unreadable\n", good, bad);
  return bad == 0 ? 0 : 1;
}

namespace {

// safetensors dtype names.
const char* SafetensorsDType(DType d) {
  switch (d) {
    case DType::kF64:
      return "F64";
    case DType::kF32:
      return "F32";
    case DType::kF16:
      return "F16";
    case DType::kBF16:
      return "BF16";
    case DType::kF8E4M3:
      return "F8_E4M3";
    case DType::kF8E5M2:
      return "F8_E5M2";
    case DType::kI64:
      return "I64";
    case DType::kI32:
      return "I32";
    case DType::kI16:
      return "I16";
    case DType::kI8:
      return "I8";
    case DType::kU8:
      return "U8";
    case DType::kBool:
      return "BOOL";
  }
  return "U8";
}

// The committed step `step` (or LATEST when < 0) of a PFS job directory.
Result<std::pair<std::string, pb::Manifest>> OpenStep(FileSystem* fs, const std::string& job_dir,
                                                      int64_t step) {
  if (step < 0) {
    CAIRN_ASSIGN_OR_RETURN(step, ReadLatest(fs, job_dir));
  }
  const std::string dir = JoinPath(job_dir, StepDirName(step));
  CAIRN_ASSIGN_OR_RETURN(pb::Manifest m, ReadManifest(fs, dir));
  return std::make_pair(dir, std::move(m));
}

// The safetensors header of tensors `chosen` of `m`: in name order, laid end to end
// (ordered_json keeps that order), padded to 8 bytes; *data_bytes: the bytes after it.
Result<std::string> SafetensorsHeader(const pb::Manifest& m, const std::vector<int>& chosen,
                                      uint64_t* data_bytes) {
  nlohmann::ordered_json h;
  h["__metadata__"] = {{"format", "pt"}, {"cairn_step", std::to_string(m.step())}};
  uint64_t offset = 0;
  for (int t : chosen) {
    const pb::Tensor& x = m.tensors(t);
    const Shape shape(x.shape().begin(), x.shape().end());
    const uint64_t n =
        static_cast<uint64_t>(NumElements(shape)) * DTypeSize(static_cast<DType>(x.dtype()));
    h[x.name()] = {{"dtype", SafetensorsDType(static_cast<DType>(x.dtype()))},
                   {"shape", shape},
                   {"data_offsets", {offset, offset + n}}};
    offset += n;
  }
  std::string header;
  try {
    header = h.dump();
  } catch (const nlohmann::json::type_error& e) {  // names that are not UTF-8
    return Status::InvalidArgument(std::string("safetensors needs UTF-8 tensor names: ") +
                                   e.what());
  }
  while (header.size() % 8) header += ' ';
  *data_bytes = offset;
  return header;
}

// Writes `out` whole or not at all: header length, header, each chosen tensor read (and
// verified) from step directory `dir`, into a temporary file synced and renamed.
Status WriteSafetensors(FileSystem* fs, const std::string& dir, const pb::Manifest& m,
                        const std::vector<int>& chosen, const std::string& header,
                        uint64_t data_bytes, const std::string& out) {
  const std::string tmp = out + ".tmp." + std::to_string(::getpid());
  CAIRN_ASSIGN_OR_RETURN(File f, fs->OpenFile(tmp, O_WRONLY | O_CREAT | O_TRUNC | O_CLOEXEC, 0644));
  uint8_t len[8];
  for (int i = 0; i < 8; ++i) len[i] = static_cast<uint8_t>(header.size() >> (8 * i));
  Status st = f.WriteAt(len, 8, 0);
  if (st.ok()) st = f.WriteAt(header.data(), header.size(), 8);
  uint64_t at = 8 + header.size();
  for (int t : chosen) {
    if (!st.ok()) break;
    const pb::Tensor& x = m.tensors(t);
    TensorMeta meta{x.name(), static_cast<DType>(x.dtype()),
                    Shape(x.shape().begin(), x.shape().end())};
    std::vector<std::byte> buf(static_cast<size_t>(NumElements(meta.global_shape)) *
                               DTypeSize(meta.dtype));
    ShardSpec whole = ShardSpec::Whole(meta, buf.data());
    st = ReadShards(fs, dir, m, std::span<const ShardSpec>(&whole, 1));
    if (st.ok()) st = f.WriteAt(buf.data(), buf.size(), at);
    at += buf.size();
    Progress("export", at, 8 + header.size() + data_bytes);
  }
  if (st.ok()) st = f.Sync();
  if (Status cl = f.Close(); st.ok()) st = cl;
  if (st.ok()) st = fs->Rename(tmp, out);
  if (!st.ok()) (void)fs->Unlink(tmp);
  return st;
}

}  // namespace

int ExportMain(int argc, char** argv) {
  CLI::App app(
      "Writes the whole (unsharded) tensors of a committed PFS step (default: the one LATEST "
      "names) of the job directory PATH to OUT in the safetensors format: an 8-byte "
      "little-endian header length, a JSON header with each tensor's dtype, shape and "
      "data_offsets, then the data. Every byte read is verified.",
      "cairn export");
  std::string path, out, format = "safetensors", pattern = ".*";
  int64_t step = -1;
  app.add_option("PATH", path, "PFS job directory")->required();
  app.add_option("OUT", out, "the file to write")->required();
  app.add_option("--step", step, "the step (default: LATEST)")->check(WholeNumber());
  app.add_option("--format", format, "output format")
      ->check(CLI::IsMember({"safetensors"}))
      ->capture_default_str();
  app.add_option("--tensors", pattern,
                 "keep the tensors whose full name matches REGEX (ECMAScript syntax)")
      ->capture_default_str();
  if (auto rc = Parse(app, argc, argv)) return *rc;
  std::regex re;
  try {
    re = std::regex(pattern);
  } catch (const std::regex_error& e) {
    std::fprintf(stderr, "cairn export: bad --tensors pattern '%s': %s\n", pattern.c_str(),
                 e.what());
    return 2;
  }
  FileSystem* fs = DefaultFileSystem();
  auto opened = OpenStep(fs, path, step);
  if (!opened.ok()) {
    std::fprintf(stderr, "cairn export: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  const std::string& dir = opened->first;
  const pb::Manifest& m = opened->second;  // not a structured binding: clang 14 cannot capture one
  std::vector<int> chosen;
  for (int t = 0; t < m.tensors_size(); ++t)
    if (std::regex_match(m.tensors(t).name(), re)) chosen.push_back(t);
  std::sort(chosen.begin(), chosen.end(),
            [&](int a, int b) { return m.tensors(a).name() < m.tensors(b).name(); });
  if (chosen.empty()) {
    std::fprintf(stderr, "cairn export: no tensor of step %lld matches '%s'\n",
                 static_cast<long long>(m.step()), pattern.c_str());
    return 1;
  }
  uint64_t data_bytes = 0;
  auto header = SafetensorsHeader(m, chosen, &data_bytes);
  Status st = header.ok() ? WriteSafetensors(fs, dir, m, chosen, *header, data_bytes, out)
                          : header.status();
  if (!st.ok()) {
    std::fprintf(stderr, "cairn export: %s\n", st.ToString().c_str());
    return 1;
  }
  std::printf("exported %zu tensor(s), %s, of step %lld to %s\n", chosen.size(),
              Size(data_bytes).c_str(), static_cast<long long>(m.step()), out.c_str());
  return 0;
}

namespace {

std::string Hex(uint64_t v) {
  char buf[24];
  std::snprintf(buf, sizeof buf, "%016llx", static_cast<unsigned long long>(v));
  return buf;
}

// "n chunks: a b c ... z" (all with `all`, else the first 2 and the last).
template <typename Get>
std::string Checksums(size_t n, Get get, bool all) {
  std::string s = std::to_string(n) + " chunk checksum(s):";
  for (size_t i = 0; i < n; ++i) {
    if (!all && n > 3 && i == 2) {
      s += " ...";
      i = n - 1;
    }
    s += " " + Hex(get(i));
  }
  return s;
}

// cairn inspect of a PFS step: its tensors (bytes and boxes per tensor).
void PrintTensors(const pb::Manifest& m) {
  std::vector<uint64_t> tensor_bytes(static_cast<size_t>(m.tensors_size()), 0);
  std::vector<int> tensor_boxes(static_cast<size_t>(m.tensors_size()), 0);
  for (const auto& b : m.boxes()) {
    tensor_bytes[b.tensor()] += b.length();
    ++tensor_boxes[b.tensor()];
  }
  std::printf("tensors (%d):\n", m.tensors_size());
  for (int t = 0; t < m.tensors_size(); ++t) {
    const auto& x = m.tensors(t);
    std::printf("  %-40s %-14s %-20s %s in %d box(es)\n", x.name().c_str(),
                DTypeName(static_cast<DType>(x.dtype())).data(),
                ShapeToString(Shape(x.shape().begin(), x.shape().end())).c_str(),
                Size(tensor_bytes[static_cast<size_t>(t)]).c_str(),
                tensor_boxes[static_cast<size_t>(t)]);
  }
}

// The distinct shard lists and the ranks that held each.
void PrintHeldLists(const pb::Manifest& m) {
  std::printf("shards held (distinct lists):\n");
  for (int l = 0; l < m.lists_size(); ++l) {
    std::string ranks;
    int count = 0;
    for (int r = 0; r < m.rank_list_size(); ++r)
      if (m.rank_list(r) == static_cast<uint32_t>(l)) {
        if (count < 8) ranks += (count ? "," : "") + std::to_string(r);
        ++count;
      }
    if (count > 8) ranks += ",... (" + std::to_string(count) + " ranks)";
    std::printf("  ranks %s:\n", ranks.c_str());
    for (uint32_t si : m.lists(l).shards()) {
      const auto& sh = m.shards(static_cast<int>(si));
      Box b{{sh.offsets().begin(), sh.offsets().end()}, {sh.lengths().begin(), sh.lengths().end()}};
      std::printf("    %s %s\n", m.tensors(static_cast<int>(sh.tensor())).name().c_str(),
                  b.ToString().c_str());
    }
  }
}

// The saved boxes and blobs, each with its file, place and checksums.
void PrintBoxes(const pb::Manifest& m, bool all) {
  std::printf("saved boxes:\n");
  for (const auto& b : m.boxes()) {
    Box box{{b.offsets().begin(), b.offsets().end()}, {b.lengths().begin(), b.lengths().end()}};
    std::printf("  %s %s  %s @%llu +%llu (writer %u)  %s\n",
                m.tensors(static_cast<int>(b.tensor())).name().c_str(), box.ToString().c_str(),
                m.files(static_cast<int>(b.file())).c_str(),
                static_cast<unsigned long long>(b.offset()),
                static_cast<unsigned long long>(b.length()), b.writer(),
                Checksums(
                    static_cast<size_t>(b.chunk_checksums_size()),
                    [&](size_t i) { return b.chunk_checksums(static_cast<int>(i)); }, all)
                    .c_str());
  }
  for (const auto& b : m.blobs())
    std::printf("  blob '%s' of rank %u  %s @%llu +%llu  %s\n", b.name().c_str(), b.rank(),
                m.files(static_cast<int>(b.file())).c_str(),
                static_cast<unsigned long long>(b.offset()),
                static_cast<unsigned long long>(b.length()), Hex(b.checksum()).c_str());
}

// cairn inspect of a PFS job directory.
int InspectPfs(FileSystem* fs, const std::string& path, int64_t step, bool all) {
  auto opened = OpenStep(fs, path, step);
  if (!opened.ok()) {
    std::fprintf(stderr, "cairn inspect: %s\n", opened.status().ToString().c_str());
    return 1;
  }
  const auto& [dir, m] = *opened;
  std::printf("step %lld of job '%s' in %s\n", static_cast<long long>(m.step()), m.job().c_str(),
              dir.c_str());
  std::printf("  saved by %u rank(s), %s ago, chunk %s\n", m.world_size(),
              Age(m.created_wall_ns()).c_str(), Size(m.chunk_bytes()).c_str());
  std::vector<uint64_t> file_bytes(static_cast<size_t>(m.files_size()), 0);
  for (const auto& b : m.boxes()) file_bytes[b.file()] += b.length();
  PrintTensors(m);
  PrintHeldLists(m);
  std::printf("files:\n");
  for (int f = 0; f < m.files_size(); ++f)
    std::printf("  %s  %s\n", JoinPath(dir, m.files(f)).c_str(),
                Size(file_bytes[static_cast<size_t>(f)]).c_str());
  PrintBoxes(m, all);
  return 0;
}

// cairn inspect of a host-tier job directory: every copy of the step.
int InspectHostTier(FileSystem* fs, const std::string& path, int64_t step, bool all) {
  const auto dirs = TierDirs(fs, path);
  if (dirs.empty()) {
    std::fprintf(stderr, "cairn inspect: %s is neither a PFS nor a host-tier job directory\n",
                 path.c_str());
    return 1;
  }
  if (step < 0)
    for (const std::string& d : dirs) {
      auto v = HostTier::Scan(fs, d, nullptr);
      if (v.ok())
        for (const VersionInfo& x : *v)
          if (IsRestorable(x.state)) step = std::max(step, x.step);
    }
  int shown = 0;
  for (const std::string& d : dirs) {
    auto v = HostTier::Scan(fs, d, nullptr);
    if (!v.ok()) continue;
    for (const VersionInfo& x : *v) {
      if (x.step != step) continue;
      const std::string hdr = JoinPath(d, "slot-" + std::to_string(x.slot) + ".hdr");
      auto raw = ReadWholeFile(fs, hdr, kMaxSlotHeaderBytes);
      auto h = raw.ok() ? DecodeSlotHeader(*raw) : Result<SlotHeader>(raw.status());
      if (!h.ok()) {
        std::printf("%s: unreadable: %s\n", hdr.c_str(), h.status().ToString().c_str());
        continue;
      }
      ++shown;
      std::printf("step %lld in %s (slot %d): %s, saved by rank %u of %u, %s, %s ago\n",
                  static_cast<long long>(h->step), d.c_str(), x.slot, VersionStateName(h->state),
                  h->rank, h->world_size, Size(h->data_bytes).c_str(),
                  Age(h->created_wall_ns).c_str());
      for (const SlotShard& s : h->shards)
        std::printf(
            "  %-40s %-14s %-20s %s @%llu +%llu  %s\n", s.name.c_str(), DTypeName(s.dtype).data(),
            ShapeToString(s.global_shape).c_str(), s.box.ToString().c_str(),
            static_cast<unsigned long long>(s.offset), static_cast<unsigned long long>(s.nbytes),
            Checksums(
                s.num_chunks, [&](size_t i) { return h->chunk_checksums[s.first_chunk + i]; }, all)
                .c_str());
      for (const SlotBlob& b : h->blobs)
        std::printf("  blob '%s' @%llu +%llu  %s\n", b.name.c_str(),
                    static_cast<unsigned long long>(b.offset),
                    static_cast<unsigned long long>(b.nbytes), Hex(b.checksum).c_str());
    }
  }
  if (shown == 0) {
    std::fprintf(stderr, "cairn inspect: no version of step %lld under %s\n",
                 static_cast<long long>(step), path.c_str());
    return 1;
  }
  return 0;
}

}  // namespace

int InspectMain(int argc, char** argv) {
  CLI::App app(
      "Shows what a version holds: for a PFS job directory, the step's (default: LATEST) "
      "tensors with dtype and shape, the shards each rank held, the files, and every saved box "
      "with its file, offset, length, writer and chunk checksums; for a host-tier job "
      "directory, every copy of step N (default: the newest) in the ranks' tiers and replicas "
      "with its shard table, blobs and checksums.",
      "cairn inspect");
  std::string path;
  int64_t step = -1;
  bool all = false;
  app.add_option("PATH", path, "job directory")->required();
  app.add_option("--step", step, "the step")->check(WholeNumber());
  app.add_flag("--all-checksums", all,
               "print every checksum (default: the first two and the last)");
  if (auto rc = Parse(app, argc, argv)) return *rc;
  FileSystem* fs = DefaultFileSystem();
  return IsPfsJobDir(fs, path) ? InspectPfs(fs, path, step, all)
                               : InspectHostTier(fs, path, step, all);
}

int GcMain(int argc, char** argv) {
  CLI::App app(
      "Deletes from the PFS job directory PATH every committed step but the N newest (never the "
      "one LATEST names), step directories without a MANIFEST and temporary files of "
      "interrupted commits. Run it only while no job writes to PATH: a step being drained has "
      "no MANIFEST yet and would be deleted. (A running job collects its own garbage after "
      "every commit, keeping CAIRN_KEEP_ON_PFS steps.)",
      "cairn gc");
  std::string path;
  int keep = 0;
  app.add_option("PATH", path, "PFS job directory")->required();
  app.add_option("--keep", keep, "committed steps to keep")->required()->check(WholeNumber(true));
  if (auto rc = Parse(app, argc, argv)) return *rc;
  FileSystem* fs = DefaultFileSystem();
  if (!IsPfsJobDir(fs, path)) {
    std::fprintf(stderr, "cairn gc: %s is not a PFS job directory (no LATEST, no step-*)\n",
                 path.c_str());
    return 1;
  }
  const size_t before = PfsSteps(fs, path).size();
  Logger log("cairn gc", LogLevel::kWarning);
  CollectPfsGarbage(fs, path, keep, -1, &log);
  const auto after = PfsSteps(fs, path);
  std::printf("removed %zu step director%s; kept:", before - after.size(),
              before - after.size() == 1 ? "y" : "ies");
  for (const StepEntry& e : after) std::printf(" %lld", static_cast<long long>(e.step));
  std::printf("\n");
  return 0;
}

}  // namespace cairn::cli
