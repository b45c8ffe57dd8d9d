// Replicator: pushes every CAPTURED version to the ranks that hold this rank's replicas
// (Placement), and receives the versions of the ranks whose replicas this rank holds.
//
// Protocol per version and holder, on tagged UCX messages (ReplicatorChannels):
//   sender  -> OFFER  the version's slot header (shard table and chunk checksums)
//   holder  -> READY  after reserving a replica slot, invalidating its old content on disk
//                     and posting a receive for every chunk directly into the slot
//                     (or a refusal saying why)
//   sender  -> DATA   the version's bytes in chunks of 64 MiB, straight from the host slot
//   holder  -> ACK    after every byte arrived, every chunk matched its checksum, the data
//                     was persisted and the replica header published; only then does the
//                     sender record the version as REPLICATED. A local send completion
//                     alone never counts.
// When pushes keep up, every version is sent. When they fall behind, versions that became
// old while a push ran are not sent, and the next one is chosen by step number, not by
// when this rank's push happened to finish (ChooseReplicationStep): every rank of the job
// then tends to replicate the same steps, so the replicas of a lost node's ranks still
// share a step the job can restore. A holder that is dead, slow or restarting never blocks
// training: the push fails after the timeout (at once on transports that report peer
// failures), the version stays CAPTURED, the failure is counted and logged once, and
// pushes to that holder resume when it greets the job again after a restart (or after a
// short back-off).
// Pacing (replicas, `share` < 1; CAIRN_REPLICATE_SHARE): pushes may take at most that share
// of the wall clock. From the measured time of a push and of a step, the sender replicates
// one step in `every` (a power of two): it pushes when the newest captured step enters a
// new block of `every` steps, so ranks that measure alike push the same steps. With named
// pushes (ExpectTargets: the step agreement names every rank's targets from the largest
// pace any rank offers, so the ranks push the same steps) the sender pushes the targets.
// Waiting for replication (WaitReplicated, WaitTried) lifts the pacing while it waits:
// the newest step is pushed.
// Thread-safety: Notify/WaitReplicated/stats from any thread; two internal threads.
#pragma once

#include <atomic>
#include <cstdint>
#include <functional>
#include <map>
#include <memory>
#include <optional>
#include <thread>
#include <vector>

#include "core/log.h"
#include "core/mutex.h"
#include "core/pool.h"
#include "redundancy/erasure.h"
#include "redundancy/host_memory.h"
#include "redundancy/parity_store.h"
#include "redundancy/placement.h"
#include "redundancy/replica_store.h"
#include "tiers/host_tier.h"
#include "transport/ucx_comm.h"

namespace cairn {

class LinkWatch;  // replicator.cc

// Erasure-coded redundancy in place of replicas (redundancy/erasure.h): the set this rank
// belongs to is its placement group (Placement with k - 1 "replicas", group strategy, a
// whole number of sets), and each push sends a holder only the data pieces of the stripes
// whose parity it keeps; the holder adds them into its ParityStore as they arrive (no
// copy of the version is kept). A holder acknowledges once the pieces were added; the
// parity of a stripe is complete when every data member's pieces were.
struct ErasureRole {
  ErasureScheme scheme;
  ParityStore* store = nullptr;
};

// The step to push next, given the newest step whose pushes were tried (`attempted`, -1
// before the first), the newest step captured (`pending` > attempted) and the steps this
// rank holds: with a gap of 1, `pending`; with a larger gap, the newest held step in
// (attempted, pending] that is a multiple of the largest power of two not above the gap
// (so ranks that lag by similar amounts pick the same steps: multiples of 4 are also
// multiples of 2), or `pending` when none is held.
int64_t ChooseReplicationStep(int64_t attempted, int64_t pending, const std::vector<int64_t>& held);

// The header of a blobs-only replica of `h`: no shards or chunk checksums, its blobs moved
// to start at 0 (their bytes are h's from *from on, h.data_bytes - *from of them).
SlotHeader BlobsOnlyHeader(const SlotHeader& h, uint64_t* from);

struct ReplicatorStats {
  uint64_t replicated = 0;  // versions acknowledged by every holder
  uint64_t failed = 0;      // pushes that failed (holder dead, slow, refused)
  uint64_t bytes = 0;       // bytes acknowledged
  double seconds = 0;       // time spent in acknowledged pushes
  double last_push_ms = 0;  // offer to acknowledgement of the last acknowledged push
  double last_ack_ms = 0;   // last DATA sent to its acknowledgement
  int64_t newest_replicated = -1;
  uint64_t blobs_only = 0;  // of `replicated`: versions whose replicas carried only the blobs
  // Captured versions never pushed: a newer one was pushed instead (replication behind: a
  // slow link or holder, a failure) or the agreement passed them over.
  uint64_t passed_over = 0;
  uint64_t received = 0;  // replicas this rank accepted and published for others
  // Host memory this rank's holder side touched outside the host tier: the windows parity
  // chunks land in before they are added (2 x kParityChunkBytes at most) and the buffer
  // given-up transfers are drained into (only after a failure).
  uint64_t staging_bytes = 0;
  uint64_t refused = 0;  // offers or transfers this rank turned down
  // Pacing: one step in `every` is pushed (1: every one), and the newest step captured is
  // `behind_steps` after newest_replicated (a lost node would take this rank that far back).
  int64_t every = 1;
  int64_t behind_steps = 0;
  double push_s = 0;  // the measured push (moving average)
  double step_s = 0;  // the measured step (moving average)
  // While pushes fail: seconds since the first failure after the last success, steps
  // captured after newest_replicated, and the last failure (see cairn::ReplicationStats).
  double unreplicated_s = 0;
  int64_t unreplicated_steps = 0;
  std::string last_error;
};

// The message channels of the protocol above (handed out by the composition root).
struct ReplicatorChannels {
  Channel offer;  // sender -> holder
  Channel ready;  // holder -> sender
  Channel data;   // sender -> holder
  Channel ack;    // holder -> sender
};

class Replicator {
 public:
  // With `erasure`, pushes go to the other members of this rank's set as parity pieces
  // (`store` is then unused and may be null). Its threads (sender, service, verifier) run
  // at `priority` (CAIRN_REPLICATE_PRIORITY). `share`: pacing, above (replicas only; 1: off).
  Replicator(UcxComm* comm, ReplicatorChannels channels, Placement placement, HostTier* local,
             ReplicaStore* store, const Logger* log, double timeout_s,
             std::optional<ErasureRole> erasure = std::nullopt,
             ThreadPriority priority = ThreadPriority::kNormal, double share = 1.0);
  ~Replicator();  // stops both threads (a push in flight ends at its timeout at the latest)
  Replicator(const Replicator&) = delete;
  Replicator& operator=(const Replicator&) = delete;

  // `step` reached CAPTURED in the local tier.
  void Notify(int64_t step);
  // Waits until a version of `step` or newer is REPLICATED, or every push of it has been
  // tried; OK when replicated, Unavailable with the last failure otherwise.
  Status WaitReplicated(int64_t step, double timeout_s);
  // Waits up to `timeout_s` until every push of `step` or of a newer step was tried
  // (acknowledged or failed); whether they were. `urgent` (a user's wait): lifts the
  // pacing while it waits; the step agreement's waits for its targets are not.
  bool WaitTried(int64_t step, double timeout_s, bool urgent = true);
  // Pacing: one step in how many the pushes can afford (StepAgreement's pace_every).
  int64_t PaceEvery() const;
  // Whether pushes are paced (replicas with a share below 1).
  bool Paced() const { return share_ < 1; }
  // The step the job agreed on (StepAgreement): sent with every parity offer, so the
  // holders keep that step's parity while newer ones come (erasure).
  void SetKeepStep(int64_t step) { keep_step_.store(step); }
  // Named pushes (StepAgreement's `target`, parity): from ExpectTargets on, this rank pushes
  // only the steps the agreement names (SetTarget), the same on every member of its set,
  // instead of choosing its own (ChooseReplicationStep); EndTargets (the agreement ended)
  // goes back to choosing.
  void ExpectTargets();
  void SetTarget(int64_t step);
  // The agreement consumed the saves up to `step` (named pushes): a step up to it that was
  // not named will never be pushed, so WaitReplicated and WaitTried stop waiting for it.
  void SetPassed(int64_t step);
  void EndTargets();
  // Data-parallel coverage (replicas, not parity): a version whose layout (`layout_hash` of
  // its header) some rank on another node also holds needs no copy of its tensors for a
  // one-node loss: the memory restore takes each box from any holder. Its replicas then
  // carry only its blobs (BlobsOnlyHeader). Until the first SetCovered or EndCoverage, a
  // push waits for the answer (at most the timeout); after it, a layout not told is pushed
  // whole.
  void ExpectCoverage(std::function<uint64_t(const SlotHeader&)> layout_hash);
  // Whether the versions of layout `hash` are held whole on another node (StepAgreement).
  void SetCovered(uint64_t hash, bool covered);
  // No answer will come any more (the agreement ended): versions are pushed whole.
  void EndCoverage();
  ReplicatorStats stats() const;

 private:
  void SenderLoop();
  // Whether the waits for `step` are over: it or a newer step was pushed or tried, the
  // rounds passed it over (named pushes), or the replicator stops.
  bool Tried(int64_t step) const CAIRN_REQUIRES(mu_);
  // Waits while every holder that failed is in its back-off (false: stopping).
  bool WaitForHolders(const std::vector<int>& holders);
  // Pushes version `step` to every holder and records it REPLICATED when all took it; the
  // last failure (the pin's, or a push's), or OK.
  Status PushToAll(int64_t step, const std::vector<int>& holders);
  // The outcome of one push to holder `h`: its state (down, back-off) and the stats.
  void RecordPush(int h, int64_t step, const Status& st, uint64_t epoch, int64_t t0,
                  uint64_t bytes);
  void ServiceLoop();
  // What a replica push sends each of its holders alike: the encoded offer (the header, and
  // the steps this rank's tier keeps) and the (offset, length) ranges of the version's data
  // (all of it, or its blobs only).
  struct ReplicaOffer {
    std::string encoded;  // a wire::ReplicaOffer
    std::vector<std::pair<uint64_t, uint64_t>> ranges;
    uint64_t bytes = 0;  // their sum
  };
  static ReplicaOffer MakeReplicaOffer(const SlotHeader& h, bool blobs_only,
                                       const std::vector<int64_t>& keep_steps);
  // Pushes the pinned version to `holder`: `replica` (built once for every holder), or,
  // when null, the parity pieces this holder keeps. Sends still in flight when it gives up
  // keep the pin (draining_).
  Status Push(int holder, const std::shared_ptr<const HostTier::View>& pinned,
              const ReplicaOffer* replica);
  // Waits (at most the timeout) until coverage was told once, when it is expected.
  void AwaitCoverage();
  // Whether `h`'s replicas may carry only its blobs (logged the first time).
  bool BlobsOnly(const SlotHeader& h);
  // Push's data: every chunk sent, waiting until each is taken, the holder fails or gives
  // the transfer up (its answer, when it came first, in *early_ack), the link comes back
  // (`came_back`) or the timeout. Sends still in flight keep `pinned` (draining_).
  // `ranges` are the (offset, length) byte ranges of the version's data to send, in order.
  // `chunk`: the bytes of one message (kParityChunkBytes for parity pieces).
  Status SendChunks(int holder, uint32_t offer, const std::shared_ptr<const HostTier::View>& pinned,
                    const std::vector<std::pair<uint64_t, uint64_t>>& ranges, uint64_t chunk,
                    LinkWatch& watch, const Status& came_back,
                    std::optional<std::string>* early_ack);
  // A staging buffer of which `*touched` bytes were touched takes `len` bytes: counts the
  // pages newly touched (ReplicatorStats::staging_bytes).
  void NoteStaging(uint64_t* touched, uint64_t len);
  // What this rank offers `holder` (erasure): the encoded ParityOffer and its data ranges.
  std::pair<std::string, std::vector<std::pair<uint64_t, uint64_t>>> ParityOfferFor(
      int holder, const SlotHeader& h) const;
  // Answers a parity offer (erasure): receives the pieces and adds them to the store.
  void HandleParityOffer(UcxComm::Incoming& in, std::optional<UcxComm::Incoming>* next);
  // The set member index of `rank` (erasure).
  int MemberIndex(int rank) const;
  // Drops the given-up sends that ended, and with the last of a version its pin.
  void ReapDraining();
  // Receives chunk `chunk` (of a version of `n` bytes) of a transfer this holder gave up
  // into scratch_, for 2 x the timeout at most (sinks_).
  void Sink(int src, uint32_t offer, uint32_t chunk, uint64_t len);
  void ReapSinks();
  // For a holder that is down and has not greeted this rank since: redials it once its host
  // answers (UcxComm::Redial), or fails at once. OK when it is not down.
  Status Reconnect(int holder);
  // Answers offer `in`; a newer offer from the same sender that makes it give this one
  // up is left in *next.
  void HandleOffer(UcxComm::Incoming& in, std::optional<UcxComm::Incoming>* next);
  // An offer's slot, reserved and prepared for its bytes.
  struct Admitted {
    SlotHeader header;
    HostTier* tier = nullptr;
    int slot = -1;
    std::byte* data = nullptr;
  };
  // Admission: this rank holds `src`'s replicas, the offer decodes, a slot is free (the
  // replicas of the steps `src` keeps are not reused: HostTier::Keep); the error is the
  // refusal sent back.
  Result<Admitted> Admit(int src, const std::string& offer);
  // Receives the offer's bytes into the slot (a window of chunks posted, answered "ready"
  // first) and verifies them as they arrive; bytes a give-up leaves in flight are sunk.
  Status Receive(int src, uint32_t offer, const Admitted& a,
                 std::optional<UcxComm::Incoming>* next);
  // The windowed receive replicas and parity pieces share: posts the first chunks
  // (post(c) starts chunk c's receive), answers "ready", then waits for each chunk in turn,
  // calls landed(c, arrived) and posts chunk c + the window. A newer offer from `src` ends
  // it (left in *next); after an error the chunks still posted are cancelled. The first
  // error, or OK; *arrived counts the chunks that arrived.
  Status ReceiveChunks(int src, uint32_t offer, uint32_t chunks,
                       const std::function<UcxComm::PendingRecv(uint32_t)>& post,
                       const std::function<void(uint32_t, bool)>& landed,
                       std::optional<UcxComm::Incoming>* next, uint32_t* arrived);
  // Sends `text` to `src` for offer `offer` on `channel`, waiting at most the timeout.
  void Reply(int src, uint32_t offer, Channel channel, const std::string& text);
  // Takes a waiting offer of rank `src`, if any, logging whether it supersedes offer
  // `current` or is older.
  std::optional<UcxComm::Incoming> TakeOffer(int src, uint32_t current);

  UcxComm* comm_;
  const ReplicatorChannels ch_;
  Placement placement_;
  HostTier* local_;
  ReplicaStore* store_;
  const std::optional<ErasureRole> erasure_;
  std::vector<int> members_;  // erasure: this rank's set, by member index
  const Logger* log_;
  double timeout_s_;

  mutable Mutex mu_;
  CondVar cv_;
  bool stop_ CAIRN_GUARDED_BY(mu_) = false;
  int64_t pending_ CAIRN_GUARDED_BY(mu_) = -1;    // newest step announced
  int64_t attempted_ CAIRN_GUARDED_BY(mu_) = -1;  // newest step whose pushes have all been tried
  Status last_error_ CAIRN_GUARDED_BY(mu_);
  int64_t failing_since_ns_ CAIRN_GUARDED_BY(mu_) = 0;  // 0 while the last push succeeded
  int64_t last_ok_ns_ CAIRN_GUARDED_BY(mu_) = 0;        // the last acknowledged push (or start)
  int64_t push_started_ns_ CAIRN_GUARDED_BY(mu_) = 0;   // the pushes in flight (0: none)
  int64_t warned_ns_ CAIRN_GUARDED_BY(mu_) = 0;         // the last "not replicated" warning
  // Logs, at most every kWarnEveryNs, that this rank's newest versions live on this node only.
  void WarnUnreplicated() CAIRN_REQUIRES(mu_);
  ReplicatorStats stats_ CAIRN_GUARDED_BY(mu_);
  struct HolderState {
    bool down = false;
    uint64_t epoch = 0;      // comm epoch when it went down
    int64_t retry_at = 0;    // NowNanos after which to try again anyway
    int64_t backoff_ns = 0;  // the last wait before retry_at (doubles while down)
  };
  std::map<int, HolderState> holders_ CAIRN_GUARDED_BY(mu_);
  // Pacing (share_ < 1): the measured push and step (moving averages; 0 until measured),
  // the pacing block, the last Notify, and how many threads wait for replication.
  const double share_;
  double push_s_ CAIRN_GUARDED_BY(mu_) = 0;
  double step_s_ CAIRN_GUARDED_BY(mu_) = 0;
  int64_t every_ CAIRN_GUARDED_BY(mu_) = 1;
  int64_t notified_step_ CAIRN_GUARDED_BY(mu_) = -1;
  int64_t notified_ns_ CAIRN_GUARDED_BY(mu_) = 0;
  int waiters_ CAIRN_GUARDED_BY(mu_) = 0;
  // After an acknowledged push of `seconds`: the averages and the block (logged when it
  // changes).
  void Pace(double seconds) CAIRN_REQUIRES(mu_);
  // Sender thread only: pushes given up while UCX still read their slot.
  struct Draining {
    std::shared_ptr<const HostTier::View> pinned;
    std::vector<UcxComm::PendingSend> sends;
  };
  std::vector<Draining> draining_;
  // Service thread only: where given-up transfers land (scratch_ outlives sinks_), and the
  // bytes of it counted in ReplicatorStats::staging_bytes.
  std::vector<std::byte> scratch_;
  uint64_t scratch_touched_ = 0;
  struct SinkRecv {
    UcxComm::PendingRecv recv;
    int64_t until;
  };
  std::vector<SinkRecv> sinks_;
  // Service thread only (erasure): the two buffers parity pieces land in,
  // kParityChunkBytes each (as many as the receive window), and the bytes of each that
  // chunks have touched (ReplicatorStats::staging_bytes).
  std::unique_ptr<std::byte[]> window_[2];
  uint64_t window_touched_[2] = {0, 0};
  std::atomic<uint32_t> next_offer_{1};
  std::atomic<int64_t> keep_step_{-1};
  // Named pushes (ExpectTargets).
  bool named_ CAIRN_GUARDED_BY(mu_) = false;
  int64_t target_ CAIRN_GUARDED_BY(mu_) = -1;
  int64_t passed_ CAIRN_GUARDED_BY(mu_) = -1;  // SetPassed
  // Captured steps (Notify) newer than the last push's: those below the next pushed step
  // are counted as passed over.
  std::vector<int64_t> unpushed_ CAIRN_GUARDED_BY(mu_);
  // The step the sender pushes next, and whether there is one (sender thread, under mu_).
  std::optional<int64_t> NextStep() CAIRN_REQUIRES(mu_);
  // Data-parallel coverage (ExpectCoverage).
  std::function<uint64_t(const SlotHeader&)> layout_hash_;  // set before the first Notify
  bool coverage_told_ CAIRN_GUARDED_BY(mu_) = false;
  std::map<uint64_t, bool> covered_ CAIRN_GUARDED_BY(mu_);  // the last round's answers
  bool said_blobs_only_ = false;                            // sender thread only
  // Checks incoming replicas' checksums as their chunks land (HandleOffer's ArrivalVerifier).
  const ThreadPriority priority_;
  Pool verify_pool_;
  std::thread sender_;
  std::thread service_;
};

}  // namespace cairn
