#include "tiers/host_tier.h"

#include <fcntl.h>
#include <sys/file.h>
#include <unistd.h>

#include <algorithm>
#include <cerrno>
#include <chrono>
#include <cstdio>

#include "core/arith.h"
#include "core/checksum.h"
#include "core/kill_point.h"
#include "core/mutex.h"
#include "core/trusted_path.h"

namespace cairn {
namespace {

constexpr uint64_t kSlotGranule = 2ull << 20;  // large slots grow in 2 MiB steps
constexpr uint64_t kPageBytes = 4096;

// The size of a slot that holds `bytes`: whole granules of the power of two nearest above
// bytes / 64, between a page and 2 MiB (so a slot wastes at most 1/64 of its version, 2 MiB
// pages fit the large ones, and a blobs-only replica takes a page, not 2 MiB: with 2 MiB
// granules a 4 MiB state and its blob took 6 MiB). EnsureRoom checks the room for this
// size, and EnsureMapped grows a slot to it: the two must agree.
uint64_t SlotSizeFor(uint64_t bytes) {
  uint64_t granule = kPageBytes;
  while (granule < kSlotGranule && granule < bytes / 64) granule *= 2;
  return std::max<uint64_t>(RoundUp(bytes, granule), kPageBytes);
}

std::string SlotName(int k) {
  return "slot-" + std::to_string(k);
}

// Parses "slot-<k>" or "slot-<k>.hdr"; -1 for other names.
int SlotIndexOf(const std::string& name) {
  if (name.rfind("slot-", 0) != 0) return -1;
  std::string rest = name.substr(5);
  if (rest.size() > 4 && rest.compare(rest.size() - 4, 4, ".hdr") == 0)
    rest.resize(rest.size() - 4);
  if (rest.empty() || rest.size() > 4) return -1;
  for (char c : rest)
    if (c < '0' || c > '9') return -1;
  return std::stoi(rest);
}

VersionInfo InfoOf(const SlotHeader& h, int slot) {
  VersionInfo v;
  v.step = h.step;
  v.state = h.state;
  v.slot = slot;
  v.data_bytes = h.data_bytes;
  v.created_wall_ns = h.created_wall_ns;
  v.shards = h.shards.size();
  v.blobs = h.blobs.size();
  v.rank = h.rank;
  v.world_size = h.world_size;
  return v;
}

}  // namespace

std::string HostTier::RankDir(const std::string& host_root, const std::string& job, int node,
                              int rank) {
  return JoinPath(JoinPath(JoinPath(host_root, job), "node-" + std::to_string(node)),
                  "rank-" + std::to_string(rank));
}

Result<std::unique_ptr<HostTier>> HostTier::Open(HostTierConfig config, FileSystem* fs,
                                                 const Logger* log) {
  if (config.slots < 2) return Status::InvalidArgument("a host tier needs at least 2 slots");
  const std::string top = config.trust_top.empty() ? config.dir : config.trust_top;
  CAIRN_RETURN_IF_ERROR(
      MakeTrustedDirs(fs, top, config.dir, TreeKind::kPrivate,
                      "the host tier keeps its versions only where no other user can change "
                      "them: set CAIRN_HOST_ROOT to a directory of your own (the default is "
                      "/dev/shm/cairn-<uid>, one per user)")
          .WithContext("host tier"));
  const std::string lock_path = JoinPath(config.dir, ".lock");
  auto opened = OpenOwnFile(fs, lock_path, O_RDWR | O_CREAT, 0600);
  if (!opened.ok() && opened.status().code() == StatusCode::kFailedPrecondition) {
    log->Warning("removing " + lock_path + ": " + opened.status().message());
    CAIRN_RETURN_IF_ERROR(fs->Unlink(lock_path));
    opened = OpenOwnFile(fs, lock_path, O_RDWR | O_CREAT | O_EXCL, 0600);
  }
  if (!opened.ok()) return opened.status();
  File lock = std::move(*opened);
  if (::flock(lock.fd(), LOCK_EX | LOCK_NB) != 0) {
    const int err = errno;
    if (err == EWOULDBLOCK)
      return Status::FailedPrecondition(
          "host tier " + config.dir +
          " is in use by another live process of this job and rank; stop it or give this "
          "process another CAIRN_JOB_ID / RANK");
    return Status::FromErrno(err, "flock " + lock_path);
  }
  std::unique_ptr<HostTier> tier(new HostTier(std::move(config), fs, log, std::move(lock)));
  CAIRN_RETURN_IF_ERROR(tier->Load());
  return tier;
}

HostTier::~HostTier() {
  for (Slot& s : slots_) Unregister(s);
  slots_.clear();
  (void)lock_.Close();  // releases the flock
}

Status HostTier::Load() {
  CAIRN_ASSIGN_OR_RETURN(auto names, fs_->ListDir(config_.dir));
  int count = config_.slots;
  for (const std::string& n : names) {
    if (n.find(".tmp.") != std::string::npos) {
      // A temporary header of a process that died before its rename: never published.
      (void)fs_->Unlink(JoinPath(config_.dir, n));
      continue;
    }
    int k = SlotIndexOf(n);
    if (k >= 0) count = std::max(count, k + 1);
  }
  slots_.resize(static_cast<size_t>(count));
  for (int k = 0; k < count; ++k) {
    Slot& s = slots_[static_cast<size_t>(k)];
    s.index = k;
    s.data_path = JoinPath(config_.dir, SlotName(k));
    s.header_path = s.data_path + ".hdr";
    if (fs_->Exists(s.header_path)) {
      auto bytes = ReadOwnFile(fs_, s.header_path, kMaxSlotHeaderBytes);
      Result<SlotHeader> h =
          bytes.ok() ? DecodeSlotHeader(*bytes) : Result<SlotHeader>(bytes.status());
      if (!h.ok() && h.status().code() == StatusCode::kFailedPrecondition) {
        RemoveForeign(s, h.status());
      } else if (!h.ok()) {
        log_->Warning("ignoring " + s.header_path + ": " + h.status().message());
      } else if (!IsRestorable(h->state)) {
        log_->Info(s.header_path + ": step " + std::to_string(h->step) +
                   " was never completely captured (the process stopped mid-capture); the "
                   "slot will be reused");
      } else {
        auto f = MappedFile::Open(fs_, s.data_path);
        if (!f.ok() && f.status().code() == StatusCode::kFailedPrecondition) {
          RemoveForeign(s, f.status());
        } else if (!f.ok()) {
          log_->Warning("ignoring step " + std::to_string(h->step) + ": " + f.status().ToString());
        } else if ((*f)->size() < h->data_bytes) {
          log_->Warning("ignoring step " + std::to_string(h->step) + ": " + s.data_path +
                        " holds " + std::to_string((*f)->size()) + " bytes but the header needs " +
                        std::to_string(h->data_bytes) + " (truncated)");
          allocated_ += (*f)->size();
          s.file = std::move(*f);
        } else {
          allocated_ += (*f)->size();
          s.file = std::move(*f);
          s.header = std::move(*h);
          s.use = Use::kCaptured;
        }
      }
    }
  }
  // A data file without a (trusted) header may still be another user's: refuse it now
  // rather than map it for the next capture.
  for (Slot& s : slots_) {
    if (s.file || !fs_->Exists(s.data_path)) continue;
    auto f = OpenOwnFile(fs_, s.data_path, O_RDONLY, 0);
    if (!f.ok() && f.status().code() == StatusCode::kFailedPrecondition)
      RemoveForeign(s, f.status());
  }
  if (config_.slot_bytes > 0) {
    CAIRN_RETURN_IF_ERROR(EnsureRoom(config_.slot_bytes));
    for (Slot& s : slots_) CAIRN_RETURN_IF_ERROR(EnsureMapped(s, config_.slot_bytes));
  }
  return Status::OK();
}

void HostTier::RemoveForeign(Slot& s, const Status& why) {
  log_->Warning("refusing slot " + std::to_string(s.index) + " of " + config_.dir + ": " +
                why.message() + " (removed; its version is not restored)");
  (void)fs_->Unlink(s.header_path);
  (void)fs_->Unlink(s.data_path);
  s.file.reset();
  s.header.reset();
  s.use = Use::kEmpty;
}

namespace {

std::string Mib(uint64_t bytes) {
  return std::to_string((bytes + (1 << 20) - 1) >> 20) + " MiB";
}

}  // namespace

Status HostTier::EnsureRoom(uint64_t bytes) {
  if (bytes <= room_checked_.load()) return Status::OK();
  const uint64_t want = SlotSizeFor(bytes);
  const uint64_t total = want * slots_.size();
  const uint64_t have = allocated_.load();
  const uint64_t more = total > have ? total - have : 0;
  CAIRN_ASSIGN_OR_RETURN(uint64_t free, fs_->FreeBytes(config_.dir));
  if (more > free)
    return Status::NoSpace(
        "host tier " + config_.dir + ": " + std::to_string(slots_.size()) + " slots of " +
        Mib(want) + " (a version of " + std::to_string(bytes) + " bytes) need " + Mib(more) +
        " more, but only " + Mib(free) + " is free there; free space, lower CAIRN_SLOTS (" +
        std::to_string(slots_.size()) + ") or set CAIRN_HOST_ROOT to a larger filesystem");
  uint64_t seen = room_checked_.load();
  while (bytes > seen && !room_checked_.compare_exchange_weak(seen, bytes)) {
  }
  return Status::OK();
}

namespace {

// Calls fn(header path, slot, its decoded header or why not) for each slot header in `dir`
// (this user's own files only; nothing opened for writing, no lock).
template <typename Fn>
Status ForEachSlotHeader(FileSystem* fs, const std::string& dir, Fn&& fn) {
  CAIRN_ASSIGN_OR_RETURN(auto names, fs->ListDir(dir));
  for (const std::string& n : names) {
    const int k = SlotIndexOf(n);
    if (k < 0 || n.size() < 4 || n.compare(n.size() - 4, 4, ".hdr") != 0) continue;
    const std::string path = JoinPath(dir, n);
    auto bytes = ReadOwnFile(fs, path, kMaxSlotHeaderBytes);
    fn(path, k, bytes.ok() ? DecodeSlotHeader(*bytes) : Result<SlotHeader>(bytes.status()));
  }
  return Status::OK();
}

}  // namespace

Result<std::vector<VersionInfo>> HostTier::Scan(FileSystem* fs, const std::string& dir,
                                                std::vector<std::string>* problems) {
  std::vector<VersionInfo> out;
  CAIRN_RETURN_IF_ERROR(
      ForEachSlotHeader(fs, dir, [&](const std::string& path, int k, Result<SlotHeader> h) {
        if (!h.ok()) {
          if (problems) problems->push_back(path + ": " + h.status().message());
          return;
        }
        out.push_back(InfoOf(*h, k));
      }));
  std::sort(out.begin(), out.end(),
            [](const VersionInfo& a, const VersionInfo& b) { return a.step > b.step; });
  return out;
}

Result<std::optional<std::pair<int64_t, std::string>>> HostTier::NewestBlob(FileSystem* fs,
                                                                            const std::string& dir,
                                                                            std::string_view name) {
  using Out = std::optional<std::pair<int64_t, std::string>>;
  if (!fs->Exists(dir)) return Out();
  std::optional<SlotHeader> newest;
  std::string newest_path;
  CAIRN_RETURN_IF_ERROR(
      ForEachSlotHeader(fs, dir, [&](const std::string& path, int, Result<SlotHeader> h) {
        // (as Open does: an unreadable header's version is not listed)
        if (!h.ok() || !IsRestorable(h->state)) return;
        if (!newest || h->step > newest->step ||
            (h->step == newest->step && h->created_wall_ns > newest->created_wall_ns)) {
          newest = std::move(*h);
          newest_path = path.substr(0, path.size() - 4);
        }
      }));
  if (!newest) return Out();
  auto b = std::find_if(newest->blobs.begin(), newest->blobs.end(),
                        [&](const SlotBlob& x) { return x.name == name; });
  if (b == newest->blobs.end()) return Out();
  CAIRN_ASSIGN_OR_RETURN(File f, OpenOwnFile(fs, newest_path, O_RDONLY, 0));
  std::string out(b->nbytes, '\0');
  CAIRN_RETURN_IF_ERROR(f.ReadAt(out.data(), out.size(), b->offset).WithContext(newest_path));
  if (Checksum(out.data(), out.size()) != b->checksum)
    return Status::Corruption("checksum mismatch in blob '" + b->name + "' of step " +
                              std::to_string(newest->step) + " in " + newest_path);
  return Out(std::pair{newest->step, std::move(out)});
}

int HostTier::NewestLocked() const {
  int best = -1;
  for (const Slot& s : slots_) {
    if (s.use != Use::kCaptured) continue;
    if (best < 0) {
      best = s.index;
      continue;
    }
    const SlotHeader& b = *slots_[static_cast<size_t>(best)].header;
    if (s.header->step > b.step ||
        (s.header->step == b.step && s.header->created_wall_ns > b.created_wall_ns))
      best = s.index;
  }
  return best;
}

std::string HostTier::StepsHeldLocked() const {
  std::vector<int64_t> steps;
  for (const Slot& s : slots_)
    if (s.use == Use::kCaptured) steps.push_back(s.header->step);
  std::sort(steps.rbegin(), steps.rend());
  if (steps.empty()) return "none";
  std::string out;
  for (int64_t v : steps) out += (out.empty() ? "" : ", ") + std::to_string(v);
  return out;
}

bool HostTier::HoldsOneOf(const Slot& s, const std::vector<int64_t>& steps) {
  return s.use == Use::kCaptured &&
         std::find(steps.begin(), steps.end(), s.header->step) != steps.end();
}

bool HostTier::KeptLocked(const Slot& s) const {
  return HoldsOneOf(s, keep_);
}

bool HostTier::ProtectedLocked(const Slot& s, int newest, bool keeping) const {
  return keeping ? KeptLocked(s) : s.index == newest;
}

std::vector<int64_t> HostTier::Keep(const std::vector<int64_t>& keep,
                                    const std::vector<int64_t>& drop) {
  MutexLock lk(mu_);
  keep_ = keep;
  for (Slot& s : slots_)
    if (HoldsOneOf(s, drop)) s.dropped = true;
  cv_.NotifyAll();  // a slot may have become free for a blocked Reserve
  return KeptStepsLocked();
}

std::vector<int64_t> HostTier::Kept() const {
  MutexLock lk(mu_);
  return KeptStepsLocked();
}

HostTier::Room HostTier::RoomIfKept(const std::vector<int64_t>& keep) const {
  MutexLock lk(mu_);
  Room room;
  for (const Slot& s : slots_) {
    if (HoldsOneOf(s, keep)) continue;
    if (s.pins > 0)
      ++room.pinned_unkept;
    else
      ++room.free;
  }
  return room;
}

std::vector<int64_t> HostTier::KeptStepsLocked() const {
  std::vector<int64_t> held;
  for (const Slot& s : slots_)
    if (KeptLocked(s)) held.push_back(s.header->step);
  std::sort(held.begin(), held.end());
  held.erase(std::unique(held.begin(), held.end()), held.end());
  return held;
}

bool HostTier::KeepingLocked() const {
  for (const Slot& s : slots_)
    if (KeptLocked(s)) return true;
  return false;
}

int HostTier::PickLocked() const {
  const int newest = NewestLocked();
  const bool keeping = KeepingLocked();
  int pick = -1;
  // Empty slots first, then the versions the job does not hold, then the oldest.
  auto better = [&](const Slot& a, const Slot& b) CAIRN_REQUIRES(mu_) {
    if (a.dropped != b.dropped) return a.dropped;
    return a.header->step < b.header->step;
  };
  for (const Slot& s : slots_) {
    if (s.pins > 0 || ProtectedLocked(s, newest, keeping)) continue;
    if (s.use == Use::kEmpty) return s.index;
    if (s.use == Use::kCaptured && (pick < 0 || better(s, slots_[static_cast<size_t>(pick)])))
      pick = s.index;
  }
  return pick;
}

std::string HostTier::WhyFullLocked(const std::string& what) const {
  const bool keeping = KeepingLocked();
  const int newest = NewestLocked();
  // Each slot's use, so that a log says which stage held the slots (a drain, a push, the
  // version the job keeps).
  std::string each;
  for (const Slot& s : slots_) {
    each += each.empty() ? ": " : "; ";
    if (s.use == Use::kCaptured)
      each += "step " + std::to_string(s.header->step);
    else
      each += s.use == Use::kEmpty ? "empty" : "capturing";
    if (s.pins > 0) each += " pinned";
    if (ProtectedLocked(s, newest, keeping)) each += keeping ? " kept" : " newest";
  }
  return what + " (all " + std::to_string(slots_.size()) + " slots are capturing, pinned or hold " +
         (keeping ? "a version the job keeps" : "the newest version") + each + ")";
}

Result<int> HostTier::Reserve(int64_t step, FullPolicy policy, double wait_s) {
  MutexLock lk(mu_);
  const auto deadline = std::chrono::steady_clock::now() +
                        std::chrono::duration_cast<std::chrono::steady_clock::duration>(
                            std::chrono::duration<double>(std::max(0.0, wait_s)));
  for (;;) {
    const int pick = PickLocked();
    if (pick >= 0) {
      slots_[static_cast<size_t>(pick)].use = Use::kReserved;
      slots_[static_cast<size_t>(pick)].dropped = false;
      return pick;
    }
    bool committing = false;
    for (const Slot& s : slots_) committing = committing || s.use == Use::kCommitting;
    const bool now_or_never = policy == FullPolicy::kSkip || policy == FullPolicy::kRaise;
    if (now_or_never && !committing)
      return Status::Unavailable(
          WhyFullLocked("no host slot is free for step " + std::to_string(step)));
    if (policy == FullPolicy::kWait && !committing) {
      // A slot freed, or one started committing (which frees soon: waited for below).
      const bool woke = cv_.WaitUntil(lk, deadline, [&]() CAIRN_REQUIRES(mu_) {
        if (PickLocked() >= 0) return true;
        for (const Slot& s : slots_)
          if (s.use == Use::kCommitting) return true;
        return false;
      });
      if (woke) continue;
      char waited[32];
      std::snprintf(waited, sizeof waited, "%.1f", wait_s);
      return Status::Unavailable(WhyFullLocked("no host slot became free for step " +
                                               std::to_string(step) + " in " + waited + " s"));
    }
    cv_.Wait(lk);
  }
}

Status HostTier::WaitFree(double timeout_s) {
  MutexLock lk(mu_);
  const bool free = cv_.WaitFor(lk, std::chrono::duration<double>(std::max(0.0, timeout_s)),
                                [&]() CAIRN_REQUIRES(mu_) { return PickLocked() >= 0; });
  if (free) return Status::OK();
  char waited[32];
  std::snprintf(waited, sizeof waited, "%.1f", timeout_s);
  return Status::Unavailable(
      WhyFullLocked(std::string("no host slot became free in ") + waited + " s"));
}

Status HostTier::EnsureMapped(Slot& s, uint64_t bytes) {
  if (!s.file) {
    CAIRN_ASSIGN_OR_RETURN(s.file, MappedFile::Open(fs_, s.data_path));
    allocated_ += s.file->size();
  }
  const uint64_t want = SlotSizeFor(bytes);
  if (s.file->size() < bytes || s.file->size() == 0) {
    Unregister(s);
    const uint64_t old = s.file->size();
    CAIRN_RETURN_IF_ERROR(s.file->Resize(want));
    allocated_ += s.file->size() - old;
    s.prefaulted = false;
  }
  if (!s.prefaulted) {
    CAIRN_RETURN_IF_ERROR(s.file->Prefault());
    s.prefaulted = true;
  }
  if (config_.on_map && s.registered == nullptr) {
    CAIRN_RETURN_IF_ERROR(config_.on_map(s.file->data(), s.file->size()));
    s.registered = s.file->data();
    s.registered_bytes = s.file->size();
  }
  return Status::OK();
}

void HostTier::Unregister(Slot& s) {
  if (s.registered && config_.on_unmap) config_.on_unmap(s.registered, s.registered_bytes);
  s.registered = nullptr;
  s.registered_bytes = 0;
}

Result<std::byte*> HostTier::Prepare(int slot, int64_t step, uint64_t bytes,
                                     const SlotHeader& base) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  {
    MutexLock lk(mu_);
    if (s.use != Use::kReserved) return Status::Internal("Prepare of a slot not reserved");
  }
  SlotHeader h = base;
  h.state = VersionState::kCapturing;
  h.step = step;
  h.shards.clear();
  h.blobs.clear();
  h.chunk_checksums.clear();
  h.data_bytes = 0;
  Status st = WriteFileAtomic(fs_, s.header_path, EncodeSlotHeader(h));
  {
    MutexLock lk(mu_);
    // Whether or not the write got as far as its rename, the old version of this slot is
    // no longer ours to serve: the caller aborts and the slot reads as empty. (If the old
    // header survived on disk, its version is still whole and a restart lists it again.)
    s.header.reset();
    s.use = Use::kCapturing;
    if (!st.ok()) return st.WithContext("invalidating " + s.header_path);
  }
  CAIRN_KILL_POINT("tier.invalidated");
  CAIRN_RETURN_IF_ERROR(EnsureMapped(s, bytes).WithContext("sizing " + s.data_path));
  return s.file->data();
}

void HostTier::MarkCopied(int slot) {
  MutexLock lk(mu_);
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (s.use == Use::kCapturing) s.use = Use::kCommitting;
  cv_.NotifyAll();
}

Status HostTier::Commit(int slot, SlotHeader header) {
  Slot& s = slots_.at(static_cast<size_t>(slot));
  if (!s.file || s.file->size() < header.data_bytes)
    return Status::Internal("commit of a slot smaller than its version");
  s.file->Persist(0, header.data_bytes);
  CAIRN_KILL_POINT("tier.data_persisted");
  header.state = VersionState::kCaptured;
  CAIRN_RETURN_IF_ERROR(WriteFileAtomic(fs_, s.header_path, EncodeSlotHeader(header))
                            .WithContext("publishing step " + std::to_string(header.step)));
  CAIRN_KILL_POINT("tier.published");
  MutexLock lk(mu_);
  s.header = std::move(header);
  s.use = Use::kCaptured;
  cv_.NotifyAll();
  return Status::OK();
}

void HostTier::Abort(int slot) {
  MutexLock lk(mu_);
  Slot& s = slots_.at(static_cast<size_t>(slot));
  s.header.reset();
  s.use = Use::kEmpty;
  cv_.NotifyAll();
}

Status HostTier::SetState(int64_t step, VersionState state) {
  // One header rewrite at a time: the replicator and the persister may both record a
  // stage of the same version, and neither may lose the other's.
  MutexLock serial(state_mu_);
  MutexLock lk(mu_);
  Slot* slot = nullptr;
  for (Slot& s : slots_)
    if (s.use == Use::kCaptured && s.header->step == step) slot = &s;
  if (!slot)
    return Status::NotFound("step " + std::to_string(step) + " is no longer in " + config_.dir);
  SlotHeader h = *slot->header;
  h.state = WithStage(h.state, state);
  ++slot->pins;  // keep the slot while the header is rewritten without the lock
  lk.Unlock();
  Status st = WriteFileAtomic(fs_, slot->header_path, EncodeSlotHeader(h));
  if (st.ok()) CAIRN_KILL_POINT("tier.state_recorded");
  lk.Lock();
  --slot->pins;
  if (st.ok()) slot->header = std::move(h);
  cv_.NotifyAll();
  return st;
}

std::vector<VersionInfo> HostTier::Versions() const {
  MutexLock lk(mu_);
  std::vector<VersionInfo> out;
  for (const Slot& s : slots_)
    if (s.use == Use::kCaptured) out.push_back(InfoOf(*s.header, s.index));
  std::sort(out.begin(), out.end(), [](const VersionInfo& a, const VersionInfo& b) {
    return a.step != b.step ? a.step > b.step : a.created_wall_ns > b.created_wall_ns;
  });
  return out;
}

Result<std::unique_ptr<HostTier::View>> HostTier::Pin(int64_t step) {
  MutexLock lk(mu_);
  Slot* best = nullptr;
  for (Slot& s : slots_) {
    if (s.use != Use::kCaptured || s.header->step != step) continue;
    if (!best || s.header->created_wall_ns > best->header->created_wall_ns) best = &s;
  }
  if (!best)
    return Status::NotFound("step " + std::to_string(step) + " is not in host tier " + config_.dir +
                            " (steps held: " + StepsHeldLocked() + ")");
  ++best->pins;
  return std::unique_ptr<View>(
      new View(this, best->index, *best->header, best->file->data(), best->data_path));
}

std::optional<SlotHeader> HostTier::NewestHeader() const {
  MutexLock lk(mu_);
  const int newest = NewestLocked();
  if (newest < 0) return std::nullopt;
  return *slots_[static_cast<size_t>(newest)].header;
}

uint64_t HostTier::WarmNewest(const std::atomic<bool>& stop) {
  const MappedFile* file = nullptr;
  std::unique_ptr<View> pin;
  {
    MutexLock lk(mu_);
    const int newest = NewestLocked();
    if (newest < 0 || !slots_[static_cast<size_t>(newest)].file) return 0;
    Slot* best = &slots_[static_cast<size_t>(newest)];
    ++best->pins;
    pin.reset(new View(this, best->index, *best->header, best->file->data(), best->data_path));
    file = best->file.get();  // a pinned slot is neither reused nor remapped
  }
  constexpr uint64_t kPiece = 64ull << 20;
  const uint64_t n = pin->header().data_bytes;
  uint64_t done = 0;
  for (; done < n && !stop.load(std::memory_order_relaxed); done += kPiece)
    file->PopulateRead(done, std::min(kPiece, n - done));
  return std::min(done, n);
}

HostTier::View::~View() {
  MutexLock lk(tier_->mu_);
  --tier_->slots_[static_cast<size_t>(slot_)].pins;
  tier_->cv_.NotifyAll();
}

}  // namespace cairn
