// HostTier: one rank's ring of host-memory slots that outlive the process.
//
// Each slot is a data file "slot-<k>" mapped with libpmem2 and a header "slot-<k>.hdr"
// under <host_root>/<job>/node-<n>/rank-<r>/ (default host root /dev/shm/cairn-<uid>, a tmpfs
// that survives the process; on a DAX filesystem the same code gives persistent memory).
//
// Life of a version in a slot:
//   Reserve (training thread, memory only) -> Prepare (writes a CAPTURING header over the
//   old one, so the old version is gone on disk before any of its bytes change; sizes and
//   pre-faults the slot) -> bytes copied in -> MarkCopied -> Commit (persists the data, then
//   writes the CAPTURED header atomically) or Abort.
// A process killed at any point leaves either the old complete header, a CAPTURING header
// or the new complete header; only complete ones are listed after a restart.
//
// Reuse rules: a slot is never reused while it is being captured, while it is pinned by a
// reader, or while it holds the newest restorable version (so an older complete version
// always survives a capture that dies). In a job of several ranks the job's agreement on
// the versions every rank holds (Keep, snapshot/step_agreement.h) replaces the last rule:
// the slots of the kept steps are never reused instead, and the newest version, not yet
// known to be held by every rank, may be.
// Thread-safety: all methods may be called from any thread; one process at a time may
// open a rank's directory (an flock on ".lock" enforces it).
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <memory>
#include <optional>
#include <string>
#include <string_view>
#include <utility>
#include <vector>

#include "cairn/options.h"
#include "cairn/status.h"
#include "core/filesystem.h"
#include "core/log.h"
#include "core/mutex.h"
#include "tiers/mapped_file.h"
#include "tiers/slot_header.h"

namespace cairn {

struct HostTierConfig {
  std::string dir;  // the rank's directory (see RankDir)
  // The top of the private tree `dir` lies in (the host root): every directory from there
  // down must be this user's (core/trusted_path.h). Empty: `dir` itself.
  std::string trust_top;
  int slots = 2;            // ring size, at least 2
  uint64_t slot_bytes = 0;  // if > 0: size and pre-fault every slot at Open
  // Called after a slot is mapped for capture and before it is unmapped (the CUDA engine
  // registers the memory with cudaHostRegister here). Optional.
  std::function<Status(void*, size_t)> on_map;
  std::function<void(void*, size_t)> on_unmap;
};

// A version as listed from a tier.
class HostTier {
 public:
  // "<host_root>/<job>/node-<node>/rank-<rank>"
  static std::string RankDir(const std::string& host_root, const std::string& job, int node,
                             int rank);

  // Creates the directory (mode 0700) if needed, takes the rank's lock, removes temporary
  // files of dead processes and loads every slot header. Versions whose header is
  // CAPTURING, unreadable or whose data file is too short are not listed (and are logged).
  // FailedPrecondition if another live process holds the directory, or if a directory from
  // trust_top down is not this user's alone (naming it, its owner and mode), before
  // anything is written. A slot file or header that is not this user's own regular file
  // (another user's, a link) is refused with a warning and removed: its version is not
  // listed, and a restore takes the next older version or tier.
  static Result<std::unique_ptr<HostTier>> Open(HostTierConfig config, FileSystem* fs,
                                                const Logger* log);
  ~HostTier();
  HostTier(const HostTier&) = delete;
  HostTier& operator=(const HostTier&) = delete;

  // Lists the headers in `dir` without opening the tier (no lock, nothing changed): every
  // slot header that parses, restorable or not, newest step first. Unreadable headers are
  // described in *problems when it is given.
  static Result<std::vector<VersionInfo>> Scan(FileSystem* fs, const std::string& dir,
                                               std::vector<std::string>* problems);

  // The blob `name` of the newest restorable version listed in `dir`, read without opening
  // the tier (no lock, nothing changed) and its checksum verified (Corruption naming the
  // file otherwise): nullopt when no version is restorable or the newest has no such blob.
  static Result<std::optional<std::pair<int64_t, std::string>>> NewestBlob(FileSystem* fs,
                                                                           const std::string& dir,
                                                                           std::string_view name);

  // Chooses a slot for a new version of `step` (no I/O). With kBlock waits until a slot is
  // free; with kWait at most `wait_s`; with kSkip and kRaise returns Unavailable when none
  // is. Each waits for a version whose bytes are already copied and only needs its commit.
  Result<int> Reserve(int64_t step, FullPolicy policy, double wait_s = 0);
  // Waits at most `timeout_s` until Reserve would find a slot without waiting (a drain or
  // push unpins one, an agreement round lets its offered steps go); Unavailable saying what
  // holds the slots otherwise. Reserves nothing: the training thread, the only caller of
  // Reserve, saves next.
  Status WaitFree(double timeout_s);
  // Invalidates the reserved slot's old version on disk, then sizes the slot for `bytes`
  // and pre-faults it. On success returns the slot's data address (valid until the next
  // Prepare of the same slot). On failure the caller must Abort; the slot's old version is
  // no longer served by this process either way (never the newest: see Reserve).
  Result<std::byte*> Prepare(int slot, int64_t step, uint64_t bytes, const SlotHeader& base);
  // The slot's bytes are all copied; only Commit remains.
  void MarkCopied(int slot);
  // Persists the data, then publishes `header` (state CAPTURED) atomically.
  Status Commit(int slot, SlotHeader header);
  // Gives the slot up after a failed Prepare, copy or Commit.
  void Abort(int slot);

  // Keeps the versions of `keep` (the newest step every rank holds and the steps offered
  // for the job's agreement) from reuse, in place of the newest version while at least one
  // of them is held; the slots of `drop` (steps some rank does not hold: no job restores
  // them from memory) are reused before any other. Returns the steps of `keep` held now,
  // decided together with keeping them (a step reported held cannot be reused after the
  // check). An empty `keep` restores the newest-version rule.
  std::vector<int64_t> Keep(const std::vector<int64_t>& keep, const std::vector<int64_t>& drop);
  // The steps of the last Keep() held now (none while the newest-version rule applies).
  std::vector<int64_t> Kept() const;
  // What keeping the versions of `keep` would leave a capture: `free`, the slots neither
  // pinned nor holding one of `keep` (a slot being captured into counts: it is free again
  // once its version is newer); `pinned_unkept`, the slots pinned (a drain, a push) whose
  // version is not in `keep`. The step agreement holds back a step it would keep when
  // keeping it leaves no free slot because a drain pins another.
  struct Room {
    int free = 0;
    int pinned_unkept = 0;
  };
  Room RoomIfKept(const std::vector<int64_t>& keep) const;

  // Records that the restorable version of `step` reached a stage (REPLICATED or
  // PERSISTED; both together read REPLICATED+PERSISTED) by republishing its header
  // atomically. NotFound if the tier no longer holds it.
  Status SetState(int64_t step, VersionState state);

  // Checks that every slot can grow to hold a version of `bytes` (the slot files are
  // allocated as they grow, so a short filesystem would otherwise fail a capture later):
  // NoSpace saying how much is needed and free, and what to change, when the filesystem
  // under the tier cannot take it. Cheap once a size has been checked.
  Status EnsureRoom(uint64_t bytes);

  // Restorable versions, newest step first.
  std::vector<VersionInfo> Versions() const;

  // A restorable version held against reuse until destroyed.
  class View {
   public:
    ~View();
    const SlotHeader& header() const { return header_; }
    const std::byte* data() const { return data_; }
    const std::string& data_path() const { return data_path_; }

   private:
    friend class HostTier;
    View(HostTier* tier, int slot, SlotHeader h, const std::byte* d, std::string p)
        : tier_(tier), slot_(slot), header_(std::move(h)), data_(d), data_path_(std::move(p)) {}
    HostTier* tier_;
    int slot_;
    SlotHeader header_;
    const std::byte* data_;
    std::string data_path_;
  };
  // Pins the restorable version of `step`; NotFound listing the steps held otherwise.
  Result<std::unique_ptr<View>> Pin(int64_t step);
  // A copy of the header of the newest restorable version (none: nullopt), without pinning
  // it (a pin would hold its slot against a save).
  std::optional<SlotHeader> NewestHeader() const;
  // Maps in this process the pages of the newest restorable version (pinned meanwhile),
  // 64 MiB at a time until done or `stop` is set, so that a restore after a restart reads
  // memory already mapped (Checkpointer's open does it in the background while the job
  // wires up). Returns the bytes mapped in.
  uint64_t WarmNewest(const std::atomic<bool>& stop);

  const std::string& dir() const { return config_.dir; }
  int num_slots() const { return static_cast<int>(slots_.size()); }

 private:
  enum class Use { kEmpty, kReserved, kCapturing, kCommitting, kCaptured };
  struct Slot {
    int index = 0;
    std::string data_path;
    std::string header_path;
    std::unique_ptr<MappedFile> file;
    Use use = Use::kEmpty;
    std::optional<SlotHeader> header;  // the restorable version (kCaptured, kReserved)
    int pins = 0;
    bool dropped = false;  // its version is one the job does not hold (Keep)
    bool prefaulted = false;
    void* registered = nullptr;  // address passed to on_map
    size_t registered_bytes = 0;
  };

  HostTier(HostTierConfig config, FileSystem* fs, const Logger* log, File lock)
      : config_(std::move(config)), fs_(fs), log_(log), lock_(std::move(lock)) {}
  Status Load();
  Status EnsureMapped(Slot& s, uint64_t bytes);
  void Unregister(Slot& s);
  // Logs why slot `s`'s files are not this user's own, removes them and empties the slot.
  void RemoveForeign(Slot& s, const Status& why);
  // Index of the slot with the newest restorable version, -1 if none. Caller holds mu_.
  int NewestLocked() const CAIRN_REQUIRES(mu_);
  // The slot Reserve takes now: empty first, then a version the job does not keep, then the
  // oldest; never pinned, never protected. -1 when every slot is.
  int PickLocked() const CAIRN_REQUIRES(mu_);
  // Whether a step the job keeps is held: then it, not the newest, is what survives.
  bool KeepingLocked() const CAIRN_REQUIRES(mu_);
  std::string WhyFullLocked(const std::string& what) const CAIRN_REQUIRES(mu_);
  // Whether slot `s` holds a restorable version of one of `steps` (caller holds mu_).
  static bool HoldsOneOf(const Slot& s, const std::vector<int64_t>& steps);
  // Whether slot `s` holds a restorable version of a step Keep keeps.
  bool KeptLocked(const Slot& s) const CAIRN_REQUIRES(mu_);
  // The steps of keep_ held now, sorted, once each.
  std::vector<int64_t> KeptStepsLocked() const CAIRN_REQUIRES(mu_);
  // Whether a capture may not take slot `s` for its version (the reuse rules above).
  bool ProtectedLocked(const Slot& s, int newest, bool keeping) const CAIRN_REQUIRES(mu_);
  std::string StepsHeldLocked() const CAIRN_REQUIRES(mu_);

  HostTierConfig config_;
  FileSystem* fs_;
  const Logger* log_;
  File lock_;                              // flocked while this process owns the directory
  std::atomic<uint64_t> allocated_{0};     // bytes of the slot files, as sized
  std::atomic<uint64_t> room_checked_{0};  // EnsureRoom passed for versions this large
  mutable Mutex mu_;
  Mutex state_mu_;  // serialises SetState's header rewrites
  CondVar cv_;
  // Sized by Load() and fixed afterwards. A slot's use, header and pins are read and
  // written with mu_ held; its file and mapping belong to whoever moved it out of
  // kEmpty/kCaptured (the capture thread while kCapturing/kCommitting).
  std::vector<Slot> slots_;
  std::vector<int64_t> keep_ CAIRN_GUARDED_BY(mu_);  // Keep's steps
};

}  // namespace cairn
